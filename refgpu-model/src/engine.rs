//! One engine: its shared state and the thread that runs its ring
//! (`docs/refgpu.md` section 4).
//!
//! Each engine runs on its own thread. The thread owns everything that only
//! the engine changes (RPTR, the IB position, the translator, the injection
//! state) and publishes its read-only registers (RPTR, STATUS, CUR_ADDR,
//! IB_*, FAULT_*) into the register page as it goes. What other threads
//! change lives in [`EngineShared`]: the WPTR latched by the last doorbell,
//! the applied CTRL.ENABLE, the stall knob, reset requests.
//!
//! The loop: wait until the engine may fetch (enabled, not halted, not
//! stalled, RPTR != WPTR), fetch the packet at `RING_BASE + RPTR`, execute
//! it (an INDIRECT_BUFFER runs its IB and any CHAINs before returning), then
//! advance RPTR. Long operations check for a reset or shutdown request at
//! every packet, every DMA/FILL/DISPATCH chunk, and every WAIT_MEM re-check,
//! and unwind with [`Stop::Abort`]; a fault unwinds with [`Stop::Fault`] and
//! halts the engine.
//!
//! Packet execution (the memory side of each packet) is in [`crate::exec`].

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::error::{Access, Fault};
use crate::faultinject::{EngineInjection, FaultInjection};
use crate::irq::Irq;
use crate::mem::SysMem;
use crate::mmu::{MmuState, Translation, Translator};
use crate::packet::{self, Context, Generation, Header, Packet};
use crate::regs::{self, eng, RegPage, NUM_ENGINES};
use crate::wake::Waker;

/// `EngineShared::attn` bit: a reset was requested.
pub(crate) const ATTN_RESET: u32 = 1;
/// `EngineShared::attn` bit: the model shuts down.
pub(crate) const ATTN_SHUTDOWN: u32 = 2;

/// How long an idle engine sleeps before re-checking on its own (a safety
/// net: every state change also wakes it).
const IDLE_RECHECK: Duration = Duration::from_millis(20);
/// CHAIN hops within one ring packet after which the engine throttles (a
/// CHAIN loop is a hang; it must not eat a host core).
const CHAIN_THROTTLE_AFTER: u64 = 4096;
/// A throttled engine pauses after this much work...
const CHAIN_THROTTLE_WORK: Duration = Duration::from_micros(50);
/// ...for this many times as long as it worked (at least
/// [`CHAIN_THROTTLE_SLEEP`]): a CHAIN loop uses at most a fifth of a core
/// however long a hop takes (debug builds and sanitizers make hops slow; a
/// pause every fixed number of hops let a slow build's loop use half).
const CHAIN_THROTTLE_FACTOR: u32 = 4;
/// The shortest pause of a throttled engine.
const CHAIN_THROTTLE_SLEEP: Duration = Duration::from_micros(200);
/// Bytes (or elements × 4) a DMA_COPY, FILL or DISPATCH moves between checks
/// for a reset request.
pub(crate) const CHUNK: usize = 64 * 1024;

/// State of one engine shared with the host side.
pub(crate) struct EngineShared {
    /// Wakes the engine thread (doorbell, reset, enable, injection).
    pub waker: Waker,
    /// `ATTN_*` requests.
    pub attn: AtomicU32,
    /// Reset requests made.
    pub reset_req: AtomicU64,
    /// Reset requests completed.
    pub reset_done: AtomicU64,
    /// Wakes threads waiting for a reset to complete.
    pub reset_waker: Waker,
    /// WPTR latched by the last doorbell.
    pub wptr: AtomicU32,
    /// RPTR as last published by the engine.
    pub rptr: AtomicU32,
    /// Applied CTRL.ENABLE.
    pub enabled: AtomicBool,
    /// Injected stall.
    pub stalled: AtomicBool,
    /// Orders doorbell BUSY updates against the engine going idle.
    pub status_lock: Mutex<()>,
    /// Turns of the engine thread's loop (a liveness sign for diagnostics).
    pub turns: AtomicU64,
}

impl EngineShared {
    fn new() -> Self {
        Self {
            waker: Waker::default(),
            attn: AtomicU32::new(0),
            reset_req: AtomicU64::new(0),
            reset_done: AtomicU64::new(0),
            reset_waker: Waker::default(),
            wptr: AtomicU32::new(0),
            rptr: AtomicU32::new(0),
            enabled: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            status_lock: Mutex::new(()),
            turns: AtomicU64::new(0),
        }
    }
}

/// Transfer time from which an engine sleeps it off rather than spinning
/// (shorter sleeps are not accurate).
const MEM_DEBT_SLEEP_NS: u64 = 200_000;

/// Everything the engines share.
pub(crate) struct Shared {
    pub gen: Generation,
    pub regs: Arc<RegPage>,
    pub mem: SysMem,
    /// Local memory (section 3.5), if the device has any.
    pub local: Option<SysMem>,
    /// Transfer cost per KiB: [system, local] memory.
    pub ns_per_kib: [u32; 2],
    pub mmu: MmuState,
    pub irq: Irq,
    pub clock: Clock,
    /// Woken on every memory write made through the model (WAIT_MEM).
    pub mem_waker: Waker,
    pub engines: [EngineShared; NUM_ENGINES],
    pub inject: Mutex<FaultInjection>,
    pub inject_version: AtomicU64,
    /// Longest time WAIT_MEM sleeps between re-reads.
    pub wait_poll: Duration,
    /// Serialises applications of the control registers ([`crate::control`]).
    pub control_lock: Mutex<()>,
    /// Doorbell eventfds the engine threads take themselves.
    #[cfg(feature = "shm")]
    pub bells: crate::bell::Bells,
}

impl Shared {
    pub fn new(gen: Generation, regs: Arc<RegPage>, mem: SysMem, irq: Irq, wait_poll: Duration) -> Self {
        Self {
            gen,
            regs,
            mem,
            local: None,
            ns_per_kib: [0, 0],
            mmu: MmuState::default(),
            irq,
            clock: Clock::new(),
            mem_waker: Waker::default(),
            engines: [EngineShared::new(), EngineShared::new(), EngineShared::new()],
            inject: Mutex::new(FaultInjection::default()),
            inject_version: AtomicU64::new(0),
            wait_poll,
            control_lock: Mutex::new(()),
            #[cfg(feature = "shm")]
            bells: crate::bell::Bells::default(),
        }
    }

    /// The memory physical address `pa` lies in: local memory when it is
    /// in that window, system memory otherwise (which faults outside its
    /// own window).
    pub fn phys(&self, pa: u64) -> &SysMem {
        match &self.local {
            Some(l) if pa >= l.base() && pa - l.base() < l.size() => l,
            _ => &self.mem,
        }
    }

    /// The time `bytes` bytes at `pa` cost (section 3.5), in ns.
    pub fn cost_ns(&self, pa: u64, bytes: u64) -> u64 {
        let local = self.local.as_ref().is_some_and(|l| pa >= l.base() && pa - l.base() < l.size());
        let per_kib = u64::from(self.ns_per_kib[usize::from(local)]);
        bytes.saturating_mul(per_kib) / 1024
    }

    /// Engine register `off` of engine `e`.
    pub fn ereg(&self, e: usize, off: u32) -> u32 {
        self.regs.load(regs::engine_base(e) + off)
    }

    /// The doorbell of engine `e`: latch RING_WPTR and wake the engine.
    pub fn doorbell(&self, e: usize) {
        let Some(es) = self.engines.get(e) else {
            return;
        };
        {
            let _g = es.status_lock.lock().unwrap_or_else(|p| p.into_inner());
            let w = self.ereg(e, eng::RING_WPTR);
            es.wptr.store(w, Ordering::SeqCst);
            if w != es.rptr.load(Ordering::SeqCst) {
                self.regs.fetch_or(regs::engine_base(e) + eng::STATUS, regs::STATUS_BUSY);
            }
        }
        es.waker.wake();
    }
}

/// Why execution stopped early.
#[derive(Debug)]
pub(crate) enum Stop {
    /// Halt with this fault.
    Fault(Fault),
    /// A reset or shutdown was requested.
    Abort,
}

impl From<Fault> for Stop {
    fn from(f: Fault) -> Self {
        Stop::Fault(f)
    }
}

pub(crate) type Res<T> = Result<T, Stop>;

/// The engine thread's private state.
pub(crate) struct Engine {
    pub sh: Arc<Shared>,
    pub id: usize,
    pub xlat: Translator,
    pub inj: EngineInjection,
    /// Payload of the packet being executed.
    pub buf: Vec<u32>,
    /// DMA staging buffer.
    pub tmp: Vec<u8>,
    /// Transfer time owed (section 3.5), paid in `execute()` before the
    /// next packet that is not a transfer (or once enough has built up),
    /// and before the engine goes idle.
    pub mem_debt_ns: u64,
    rptr: u32,
    status: u32,
    halted: bool,
}

impl Engine {
    pub fn new(sh: Arc<Shared>, id: usize) -> Self {
        let inj = {
            let cfg = sh.inject.lock().unwrap_or_else(|p| p.into_inner());
            EngineInjection::new(id, sh.inject_version.load(Ordering::SeqCst), &cfg)
        };
        Self {
            sh,
            id,
            xlat: Translator::for_engine(id),
            inj,
            buf: Vec::with_capacity(4096),
            tmp: vec![0; CHUNK],
            mem_debt_ns: 0,
            rptr: 0,
            status: 0,
            halted: false,
        }
    }

    fn es(&self) -> &EngineShared {
        &self.sh.engines[self.id]
    }

    fn reg_store(&self, off: u32, v: u32) {
        self.sh.regs.store(regs::engine_base(self.id) + off, v);
    }

    fn reg_store64(&self, lo_off: u32, v: u64) {
        self.reg_store(lo_off, v as u32);
        self.reg_store(lo_off + 4, (v >> 32) as u32);
    }

    fn set_status(&mut self, s: u32) {
        if s != self.status {
            self.status = s;
            self.reg_store(eng::STATUS, s);
        }
    }

    /// Whether a reset or shutdown is pending.
    pub fn aborting(&self) -> bool {
        self.es().attn.load(Ordering::Relaxed) != 0
    }

    /// `Err(Abort)` when a reset or shutdown is pending.
    pub fn check_abort(&self) -> Res<()> {
        if self.aborting() {
            Err(Stop::Abort)
        } else {
            Ok(())
        }
    }

    /// Sleeps up to `d` on the engine's waker; returns early on abort.
    fn pause(&self, d: Duration) -> Res<()> {
        let deadline = Instant::now() + d;
        loop {
            let seen = self.es().waker.seq();
            self.check_abort()?;
            let now = Instant::now();
            if now >= deadline {
                return Ok(());
            }
            self.es().waker.wait(seen, deadline - now);
        }
    }

    /// Thread body.
    pub fn run(mut self) {
        loop {
            self.es().turns.fetch_add(1, Ordering::Relaxed);
            let seen = self.es().waker.seq();
            let attn = self.es().attn.load(Ordering::SeqCst);
            if attn & ATTN_SHUTDOWN != 0 {
                return;
            }
            if attn & ATTN_RESET != 0 {
                self.reset();
                continue;
            }
            self.refresh_injection();
            if self.can_fetch() {
                match self.ring_packet() {
                    Ok(()) => {}
                    Err(Stop::Fault(f)) => self.halt(f),
                    Err(Stop::Abort) => {}
                }
            } else if !self.take_bell() {
                // The ring ran dry: the last transfers' time passes before
                // the engine reports idle.
                if self.mem_debt_ns > 0 && self.pay_debt().is_err() {
                    continue;
                }
                self.go_idle();
                self.sleep(seen);
            }
        }
    }

    /// Takes a doorbell rung on this engine's eventfd, if one is attached
    /// ([`crate::bell`]).
    fn take_bell(&self) -> bool {
        #[cfg(feature = "shm")]
        return self.sh.take_bell(self.id);
        #[cfg(not(feature = "shm"))]
        false
    }

    /// Sleeps while idle until woken, a doorbell eventfd fires, or the
    /// re-check interval passes.
    fn sleep(&self, seen: u64) {
        #[cfg(feature = "shm")]
        if let Some(bell) = self.sh.bells.engine[self.id].get() {
            use std::os::fd::AsFd;
            self.es().waker.wait_or_fd(seen, bell.as_fd(), IDLE_RECHECK);
            return;
        }
        self.es().waker.wait(seen, IDLE_RECHECK);
    }

    fn refresh_injection(&mut self) {
        let v = self.sh.inject_version.load(Ordering::SeqCst);
        if v != self.inj.version {
            let cfg = self.sh.inject.lock().unwrap_or_else(|p| p.into_inner());
            self.inj = EngineInjection::new(self.id, v, &cfg);
        }
    }

    fn can_fetch(&self) -> bool {
        let es = self.es();
        !self.halted
            && es.enabled.load(Ordering::SeqCst)
            && !es.stalled.load(Ordering::SeqCst)
            && self.rptr != es.wptr.load(Ordering::SeqCst)
    }

    fn go_idle(&mut self) {
        let sh = Arc::clone(&self.sh);
        let es = &sh.engines[self.id];
        let _g = es.status_lock.lock().unwrap_or_else(|p| p.into_inner());
        let busy = if self.rptr != es.wptr.load(Ordering::SeqCst) { regs::STATUS_BUSY } else { 0 };
        let keep = self.status & (regs::STATUS_HALTED | regs::STATUS_IN_IB);
        // Store unconditionally: a doorbell may have set BUSY in the page.
        self.status = keep | busy;
        self.reg_store(eng::STATUS, self.status);
    }

    fn set_rptr(&mut self, r: u32) {
        self.rptr = r;
        self.es().rptr.store(r, Ordering::SeqCst);
        self.reg_store(eng::RING_RPTR, r);
    }

    fn reset(&mut self) {
        let es_attn = &self.sh.engines[self.id].attn;
        es_attn.fetch_and(!ATTN_RESET, Ordering::SeqCst);
        let req = self.es().reset_req.load(Ordering::SeqCst);
        {
            let sh = Arc::clone(&self.sh);
            let es = &sh.engines[self.id];
            let _g = es.status_lock.lock().unwrap_or_else(|p| p.into_inner());
            es.wptr.store(0, Ordering::SeqCst);
            self.reg_store(eng::RING_WPTR, 0);
            self.set_rptr(0);
            for off in [
                eng::STATUS,
                eng::CUR_ADDR_LO,
                eng::CUR_ADDR_HI,
                eng::IB_BASE_LO,
                eng::IB_BASE_HI,
                eng::IB_SIZE,
                eng::FAULT_STATUS,
                eng::FAULT_ADDR_LO,
                eng::FAULT_ADDR_HI,
            ] {
                self.reg_store(off, 0);
            }
            self.status = 0;
            self.halted = false;
        }
        self.xlat.flush();
        self.sh.irq.clear_status(regs::irq_engine_bits(self.id));
        self.sh.regs.fetch_and(regs::engine_base(self.id) + eng::CTRL, !regs::CTRL_RESET);
        self.es().reset_done.store(req, Ordering::SeqCst);
        self.es().reset_waker.wake();
    }

    fn halt(&mut self, f: Fault) {
        self.reg_store64(eng::FAULT_ADDR_LO, f.addr);
        self.reg_store(eng::FAULT_STATUS, f.status_bits());
        self.halted = true;
        let busy = if self.rptr != self.es().wptr.load(Ordering::SeqCst) { regs::STATUS_BUSY } else { 0 };
        let s = (self.status & regs::STATUS_IN_IB) | regs::STATUS_HALTED | busy;
        self.set_status(s);
        self.sh.irq.set_status(regs::irq_fault_bit(self.id));
    }

    /// Fetches and executes the ring packet at RPTR, then advances RPTR.
    fn ring_packet(&mut self) -> Res<()> {
        let base = u64::from(self.sh.ereg(self.id, eng::RING_BASE_LO))
            | (u64::from(self.sh.ereg(self.id, eng::RING_BASE_HI)) << 32);
        let size = self.sh.ereg(self.id, eng::RING_SIZE);
        let wptr = self.es().wptr.load(Ordering::SeqCst);
        let rptr = self.rptr;
        let hdr = base.wrapping_add(u64::from(rptr));
        self.set_status(self.status | regs::STATUS_BUSY);
        // A WPTR that is not a multiple of 4 or not below RING_SIZE can not
        // describe packets (docs/refgpu.md 4.1): INVALID_PACKET at RPTR.
        if wptr % 4 != 0 || wptr >= size || rptr >= size {
            self.set_cur_addr(hdr);
            return Err(Fault::invalid(hdr, 0).into());
        }
        // Packets may not cross WPTR nor the end of the ring.
        let avail = if wptr > rptr { wptr - rptr } else { size - rptr };
        let (header, pkt) = self.fetch(hdr, avail / 4, false)?;
        self.execute(hdr, header, pkt)?;
        let mut next = rptr + 4 * (1 + header.ndw);
        if next >= size {
            next = 0;
        }
        self.set_rptr(next);
        Ok(())
    }

    fn set_cur_addr(&self, a: u64) {
        self.reg_store64(eng::CUR_ADDR_LO, a);
    }

    /// Waits while the engine may not fetch (stalled or disabled) and
    /// applies the injected per-packet latency.
    fn gate(&mut self) -> Res<()> {
        loop {
            let seen = self.es().waker.seq();
            self.check_abort()?;
            let es = self.es();
            if !es.stalled.load(Ordering::SeqCst) && es.enabled.load(Ordering::SeqCst) {
                break;
            }
            es.waker.wait(seen, IDLE_RECHECK);
        }
        self.refresh_injection();
        if !self.inj.latency.is_zero() {
            self.pause(self.inj.latency)?;
        }
        Ok(())
    }

    /// Takes the time the transfers so far owe: short debts are spun off (a
    /// sleep that short is not accurate), long ones slept.
    fn pay_debt(&mut self) -> Res<()> {
        let debt = std::mem::take(&mut self.mem_debt_ns);
        if debt >= MEM_DEBT_SLEEP_NS {
            self.pause(Duration::from_nanos(debt))?;
        } else if debt > 0 {
            let until = Instant::now() + Duration::from_nanos(debt);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        }
        Ok(())
    }

    /// Notes that `bytes` at `pa` were transferred (their time is owed).
    pub fn charge(&mut self, pa: u64, bytes: u64) {
        self.mem_debt_ns = self.mem_debt_ns.saturating_add(self.sh.cost_ns(pa, bytes));
    }

    /// Translates with the fault's opcode filled in.
    pub fn xl(&mut self, va: u64, access: Access, opcode: u8) -> Res<Translation> {
        self.xlat.translate(&self.sh.mmu, &self.sh.mem, self.sh.local.as_ref(), va, access).map_err(
            |mut f| {
                f.opcode = opcode;
                Stop::Fault(f)
            },
        )
    }

    /// Fetches the packet at `hdr` with at most `avail` dwords before the
    /// end of the ring/WPTR/IB, and decodes it.
    fn fetch(&mut self, hdr: u64, avail: u32, in_ib: bool) -> Res<(Header, Packet)> {
        self.gate()?;
        self.set_cur_addr(hdr);
        if hdr % 4 != 0 {
            return Err(Fault::invalid(hdr, 0).into());
        }
        let gen = self.sh.gen;
        let t = self.xl(hdr, Access::Fetch, 0)?;
        let h = self.sh.phys(t.pa).read_u32(t.pa).map_err(|_| bus(hdr, Access::Fetch, 0))?;
        let raw = packet::raw_opcode(gen, h);
        let header = packet::decode_header(gen, h).map_err(|e| Fault::invalid(hdr, e.opcode))?;
        if avail == 0 || header.ndw > avail - 1 {
            return Err(Fault::invalid(hdr, raw).into());
        }
        // Fetch the payload page by page.
        let ndw = header.ndw as usize;
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        buf.resize(ndw, 0);
        let mut i = 0usize;
        let result = loop {
            if i >= ndw {
                break Ok(());
            }
            let va = hdr.wrapping_add(4 + 4 * i as u64);
            let t = match self.xl(va, Access::Fetch, raw) {
                Ok(t) => t,
                Err(e) => break Err(e),
            };
            let n = ((t.extent / 4) as usize).min(ndw - i);
            if n == 0 {
                break Err(bus(va, Access::Fetch, raw).into());
            }
            if self.sh.phys(t.pa).read_u32s(t.pa, &mut buf[i..i + n]).is_err() {
                break Err(bus(va, Access::Fetch, raw).into());
            }
            i += n;
        };
        let ctx = Context { engine: self.id, in_ib, addr: hdr };
        let decoded =
            result.and_then(|()| packet::decode_payload(gen, ctx, header, &buf).map_err(Stop::Fault));
        self.buf = buf;
        decoded.map(|p| (header, p))
    }

    /// Executes a packet of the ring or an IB (not CHAIN, which the IB loop
    /// handles).
    fn execute(&mut self, hdr: u64, header: Header, pkt: Packet) -> Res<()> {
        let opcode = header.op.opcode(self.sh.gen);
        // Transfers take their time before anything that can make it
        // visible starts (a FENCE, TIMESTAMP, WAIT_MEM, WRITE_DATA, an IB
        // boundary): back-to-back transfers add up their debts and pay them
        // once enough has built up to sleep, rather than spinning a host
        // core for each small one.
        let transfer = matches!(
            pkt,
            Packet::DmaCopy { .. } | Packet::Fill { .. } | Packet::Dispatch { .. } | Packet::Nop
        );
        if !transfer || self.mem_debt_ns >= MEM_DEBT_SLEEP_NS {
            self.pay_debt()?;
        }
        match pkt {
            Packet::IndirectBuffer { addr, size } => self.run_ib(addr, size),
            // CHAIN is only decoded inside an IB, where `run_ib` takes it.
            Packet::Chain { .. } => Err(Fault::invalid(hdr, opcode).into()),
            other => self.exec_packet(other, opcode),
        }
    }

    fn set_ib(&mut self, base: u64, size: u32) {
        self.reg_store64(eng::IB_BASE_LO, base);
        self.reg_store(eng::IB_SIZE, size);
    }

    fn run_ib(&mut self, addr: u64, size: u32) -> Res<()> {
        let (mut base, mut size) = (addr, size);
        self.set_ib(base, size);
        self.set_status(self.status | regs::STATUS_IN_IB);
        let mut off: u32 = 0;
        let mut hops: u64 = 0;
        let mut worked_since = Instant::now();
        while off < size {
            let hdr = base + 4 * u64::from(off);
            let (header, pkt) = self.fetch(hdr, size - off, true)?;
            if let Packet::Chain { addr, size: s } = pkt {
                base = addr;
                size = s;
                off = 0;
                self.set_ib(base, size);
                hops += 1;
                if hops == CHAIN_THROTTLE_AFTER {
                    worked_since = Instant::now();
                } else if hops > CHAIN_THROTTLE_AFTER {
                    let worked = worked_since.elapsed();
                    if worked >= CHAIN_THROTTLE_WORK {
                        self.pause((worked * CHAIN_THROTTLE_FACTOR).max(CHAIN_THROTTLE_SLEEP))?;
                        worked_since = Instant::now();
                    }
                } else if hops % 64 == 0 {
                    std::thread::yield_now();
                }
                continue;
            }
            self.execute(hdr, header, pkt)?;
            off += 1 + header.ndw;
        }
        self.set_ib(0, 0);
        self.set_status(self.status & !regs::STATUS_IN_IB);
        Ok(())
    }

    /// Sets or clears STATUS.WAITING.
    pub fn set_waiting(&mut self, on: bool) {
        let s = if on { self.status | regs::STATUS_WAITING } else { self.status & !regs::STATUS_WAITING };
        self.set_status(s);
    }
}

/// A BUS fault (used when a checked translation still misses the window).
pub(crate) fn bus(va: u64, access: Access, opcode: u8) -> Fault {
    Fault { kind: crate::FaultKind::Bus, access, addr: va, opcode }
}
