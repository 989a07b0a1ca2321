//! The model as a whole: construction, the host-side register semantics of
//! both transports (`docs/refgpu.md` 2.1–2.3), memory helpers, fault
//! injection, shutdown.
//!
//! Threads: one per engine ([`crate::engine`]), one delivering interrupt
//! vectors to the [`IrqSink`] ([`crate::irq`]), and in ivshmem mode one that
//! publishes CLOCK into the shared register page.
//!
//! Two ways to drive it:
//!
//! - **In-process** ([`Model::new`], [`Model::with_irq_sink`]):
//!   [`Model::read_reg`] / [`Model::write_reg`] are the register accesses.
//!   Writes with side effects act at once: DOORBELL latches WPTR,
//!   IRQ_STATUS is write-1-to-clear, MMU_INVALIDATE and MMU_CTRL/ROOT apply
//!   immediately, and a CTRL write with RESET returns only when the reset is
//!   complete (so CTRL reads with RESET = 0 afterwards).
//! - **ivshmem** ([`Model::new_shared`]): the register page and system
//!   memory are caller-provided mappings written by another process. The
//!   host's writes to the page take effect on [`Model::doorbell`]: vector
//!   `e < 3` re-reads RING_WPTR of engine `e`; vector 3 (the control
//!   doorbell) applies IRQ_MASK, MMU_CTRL, MMU_ROOT, ENGINE_ROOT, MMU_INVALIDATE (cleared
//!   when done) and each engine's CTRL (ENABLE; RESET is started and the
//!   engine clears CTRL.RESET when it is complete). The CLOCK pair is
//!   written as one 64-bit value every `clock_publish_interval`.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::engine::{Engine, Shared, ATTN_SHUTDOWN};
use crate::error::{Fault, ModelError};
use crate::faultinject::FaultInjection;
use crate::irq::{self, Irq, IrqSink};
use crate::mem::SysMem;
use crate::packet::Generation;
use crate::regs::{self, eng, RegPage, NUM_ENGINES};

/// Model configuration.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// Device generation.
    pub generation: Generation,
    /// Revision (ID register bits 7:0).
    pub revision: u8,
    /// First physical address of system memory.
    pub mem_base: u64,
    /// Size of system memory in bytes (multiple of 8).
    pub mem_size: u64,
    /// How long a WAIT_MEM sleeps between re-reads when no write made
    /// through the model wakes it (writes by another process are only seen
    /// by polling), while the wait is young: after that it re-reads at a
    /// tenth of the time waited so far, up to 1 ms, so a wait that never
    /// holds costs little host CPU. Default 50 µs.
    pub wait_poll_interval: Duration,
    /// ivshmem mode: how often CLOCK is written into the shared page.
    /// Default 100 µs.
    pub clock_publish_interval: Duration,
    /// Initial fault injection (none by default).
    pub fault_injection: FaultInjection,
    /// Local memory (gen2 only, `docs/refgpu.md` section 3.5): `None`
    /// gives a gen2 device 2 MiB and a gen1 device none; `Some(0)` none.
    /// A multiple of 4 KiB.
    pub local_size: Option<u64>,
    /// Time a transfer spends per KiB of system memory it reads or
    /// writes (default 64 ns).
    pub sys_ns_per_kib: u32,
    /// The same for local memory (default 8 ns).
    pub local_ns_per_kib: u32,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            generation: Generation::Gen1,
            revision: 0,
            mem_base: 0x4000_0000,
            mem_size: 64 << 20,
            wait_poll_interval: Duration::from_micros(50),
            clock_publish_interval: Duration::from_micros(100),
            fault_injection: FaultInjection::default(),
            local_size: None,
            sys_ns_per_kib: 64,
            local_ns_per_kib: 8,
        }
    }
}

impl ModelConfig {
    /// The local memory this configuration gives the device, in bytes.
    pub fn local_bytes(&self) -> u64 {
        match (self.generation, self.local_size) {
            (Generation::Gen1, _) => 0,
            (Generation::Gen2, None) => regs::LOCAL_SIZE_DEFAULT,
            (Generation::Gen2, Some(n)) => n,
        }
    }

    fn local_mem(&self) -> Result<Option<SysMem>, ModelError> {
        if self.generation == Generation::Gen1 && self.local_size.is_some_and(|n| n > 0) {
            return Err(ModelError::Config("gen1 has no local memory"));
        }
        let size = self.local_bytes();
        if size == 0 {
            return Ok(None);
        }
        if size % 4096 != 0 {
            return Err(ModelError::Config("local_size must be a multiple of 4 KiB"));
        }
        let sys_end = self.mem_base.saturating_add(self.mem_size);
        if self.mem_base < regs::LOCAL_BASE.saturating_add(size) && regs::LOCAL_BASE < sys_end {
            return Err(ModelError::Config("system memory overlaps the local memory window"));
        }
        SysMem::new_owned(regs::LOCAL_BASE, size).map(Some)
    }
}

/// A snapshot of one engine's registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineSnapshot {
    /// RING_RPTR.
    pub rptr: u32,
    /// RING_WPTR.
    pub wptr: u32,
    /// CTRL.
    pub ctrl: u32,
    /// STATUS.
    pub status: u32,
    /// CUR_ADDR.
    pub cur_addr: u64,
    /// IB_BASE.
    pub ib_base: u64,
    /// IB_SIZE.
    pub ib_size: u32,
    /// The latched fault, if FAULT_STATUS.VALID.
    pub fault: Option<Fault>,
    /// Raw FAULT_STATUS.
    pub fault_status: u32,
}

impl EngineSnapshot {
    /// STATUS.HALTED.
    pub fn halted(&self) -> bool {
        self.status & regs::STATUS_HALTED != 0
    }

    /// STATUS.WAITING.
    pub fn waiting(&self) -> bool {
        self.status & regs::STATUS_WAITING != 0
    }

    /// STATUS.BUSY.
    pub fn busy(&self) -> bool {
        self.status & regs::STATUS_BUSY != 0
    }
}

/// The refgpu functional model.
pub struct Model {
    sh: Arc<Shared>,
    engines: Mutex<Vec<JoinHandle<()>>>,
    others: Mutex<Vec<JoinHandle<()>>>,
    clock_hi: AtomicU32,
    stop_clock: Arc<AtomicBool>,
    shared_mode: bool,
}

fn is_listed(off: u32) -> bool {
    matches!(
        off,
        0x000
            | 0x004
            | 0x010
            | 0x014
            | 0x020
            | 0x024
            | 0x028
            | 0x02C
            | 0x030
            | 0x034
            | 0x058
            | 0x05C
            | 0x060
            | 0x064
    ) || engine_root_reg(off).is_some()
        || (0x100..0x100 + 0x40 * NUM_ENGINES as u32).contains(&off) && off % 4 == 0
}

/// The engine whose ENGINE_ROOT_LO/HI (section 3.4) is at `off`.
fn engine_root_reg(off: u32) -> Option<usize> {
    (0..NUM_ENGINES).find(|&e| off == regs::engine_root_lo(e) || off == regs::engine_root_hi(e))
}

impl Model {
    /// An in-process model with owned memory and no interrupt sink.
    pub fn new(cfg: ModelConfig) -> Result<Self, ModelError> {
        Self::build(cfg, Arc::new(RegPage::new_owned()), None, None, false)
    }

    /// An in-process model delivering interrupt vectors to `sink`.
    pub fn with_irq_sink(cfg: ModelConfig, sink: Arc<dyn IrqSink>) -> Result<Self, ModelError> {
        Self::build(cfg, Arc::new(RegPage::new_owned()), None, Some(sink), false)
    }

    /// A model over caller-provided mappings (ivshmem co-simulation): the
    /// register page at `regs` and system memory at `mem`
    /// (`cfg.mem_size` bytes, physical address `cfg.mem_base`). The
    /// register page is initialised (zeroed, then ID and ENGINE_COUNT).
    ///
    /// # Safety
    ///
    /// `regs` must be 8-byte aligned and valid for reads and writes of
    /// 4096 bytes, and `mem` 8-byte aligned and valid for reads and writes
    /// of `cfg.mem_size` bytes, both for the whole life of the model (until
    /// it is dropped). Other processes may access both concurrently; other
    /// threads of this process only with atomic accesses.
    pub unsafe fn new_shared(
        cfg: ModelConfig,
        regs: NonNull<u8>,
        mem: NonNull<u8>,
        sink: Option<Arc<dyn IrqSink>>,
    ) -> Result<Self, ModelError> {
        if regs.as_ptr() as usize % 8 != 0 {
            return Err(ModelError::Config("the register page must be 8-byte aligned"));
        }
        // SAFETY: forwarded from this function's contract.
        let page = unsafe { RegPage::from_raw(regs) };
        // SAFETY: forwarded from this function's contract.
        let sysmem = unsafe { SysMem::from_raw(cfg.mem_base, cfg.mem_size, mem)? };
        Self::build(cfg, Arc::new(page), Some(sysmem), sink, true)
    }

    fn build(
        cfg: ModelConfig,
        page: Arc<RegPage>,
        mem: Option<SysMem>,
        sink: Option<Arc<dyn IrqSink>>,
        shared_mode: bool,
    ) -> Result<Self, ModelError> {
        let mem = match mem {
            Some(m) => m,
            None => SysMem::new_owned(cfg.mem_base, cfg.mem_size)?,
        };
        let local = cfg.local_mem()?;
        page.clear();
        page.store(
            regs::ID,
            (regs::ID_MAGIC << 16) | (u32::from(cfg.generation.number()) << 8) | u32::from(cfg.revision),
        );
        page.store(regs::ENGINE_COUNT, NUM_ENGINES as u32);
        if let Some(l) = &local {
            page.store64(regs::LOCAL_BASE_LO, l.base());
            page.store64(regs::LOCAL_SIZE_LO, l.size());
        }
        let (irq, delivery) = Irq::new(Arc::clone(&page), sink);
        irq.set_delay(cfg.fault_injection.irq_delay);
        let mut shared = Shared::new(cfg.generation, page, mem, irq, cfg.wait_poll_interval);
        shared.local = local;
        shared.ns_per_kib = [cfg.sys_ns_per_kib, cfg.local_ns_per_kib];
        let sh = Arc::new(shared);
        let model = Self {
            sh,
            engines: Mutex::new(Vec::new()),
            others: Mutex::new(Vec::new()),
            clock_hi: AtomicU32::new(0),
            stop_clock: Arc::new(AtomicBool::new(false)),
            shared_mode,
        };
        model.set_fault_injection(cfg.fault_injection.clone());
        // From here on, `model`'s Drop joins whatever was started.
        let t = std::thread::Builder::new()
            .name("refgpu-irq".into())
            .spawn(move || irq::delivery_loop(delivery))
            .map_err(|_| ModelError::Spawn)?;
        lock(&model.others).push(t);
        for e in 0..NUM_ENGINES {
            let engine = Engine::new(Arc::clone(&model.sh), e);
            let name = ["refgpu-gfx", "refgpu-compute", "refgpu-copy"][e];
            let t = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || engine.run())
                .map_err(|_| ModelError::Spawn)?;
            lock(&model.engines).push(t);
        }
        if shared_mode {
            let sh = Arc::clone(&model.sh);
            let stop = Arc::clone(&model.stop_clock);
            let every = cfg.clock_publish_interval.max(Duration::from_micros(1));
            let t = std::thread::Builder::new()
                .name("refgpu-clock".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        sh.regs.store64(regs::CLOCK_LO, sh.clock.now_ns());
                        std::thread::sleep(every);
                    }
                })
                .map_err(|_| ModelError::Spawn)?;
            lock(&model.others).push(t);
        }
        Ok(model)
    }

    /// The device generation.
    pub fn generation(&self) -> Generation {
        self.sh.gen
    }

    /// First physical address of system memory.
    pub fn mem_base(&self) -> u64 {
        self.sh.mem.base()
    }

    /// Size of system memory.
    pub fn mem_size(&self) -> u64 {
        self.sh.mem.size()
    }

    /// Host address of system memory's first byte (physical address
    /// [`Model::mem_base`]), for platforms that hand parts of the window to a
    /// driver as DMA memory (the in-process platform of `platform-linux`).
    ///
    /// Getting the pointer is safe; using it is not. The contract for every
    /// access through it:
    ///
    /// - the pointer is valid for reads and writes of [`Model::mem_size`]
    ///   bytes while the model is alive (until it is dropped; for a model
    ///   from [`Model::new_shared`], for as long as the caller's mapping);
    /// - the engines access the window concurrently with atomic operations,
    ///   so the caller must not create references to bytes an engine may be
    ///   writing at the same time; plain (volatile) accesses to memory no
    ///   queued command touches, and atomic accesses anywhere, are fine;
    /// - writes made through the pointer do not wake an engine blocked in
    ///   WAIT_MEM at once: it sees them at its next poll
    ///   (`wait_poll_interval`), as for writes by another process.
    pub fn mem_host_ptr(&self) -> NonNull<u8> {
        self.sh.mem.host_base()
    }

    /// The device clock (ns since the model started).
    pub fn clock_ns(&self) -> u64 {
        self.sh.clock.now_ns()
    }

    // ----- registers -----

    /// A 32-bit register read at byte offset `off` (in-process semantics:
    /// reading CLOCK_LO latches CLOCK_HI; unlisted offsets read 0).
    pub fn read_reg(&self, off: u32) -> u32 {
        if !is_listed(off) {
            return 0;
        }
        match off {
            regs::CLOCK_LO => {
                let now = self.sh.clock.now_ns();
                self.clock_hi.store((now >> 32) as u32, Ordering::SeqCst);
                now as u32
            }
            regs::CLOCK_HI => self.clock_hi.load(Ordering::SeqCst),
            _ if engine_reg(off).is_some_and(|(_, r)| r == eng::DOORBELL) => 0,
            _ => self.sh.regs.load(off),
        }
    }

    /// A 32-bit register write at byte offset `off` with in-process
    /// semantics (section 2.3): side effects act before this returns.
    pub fn write_reg(&self, off: u32, v: u32) {
        let sh = &self.sh;
        match off {
            regs::IRQ_STATUS => sh.irq.clear_status(v),
            regs::IRQ_MASK => {
                sh.regs.store(off, v);
                sh.irq.apply_mask(v);
            }
            regs::MMU_CTRL | regs::MMU_ROOT_LO | regs::MMU_ROOT_HI => {
                sh.regs.store(off, v);
                sh.apply_mmu();
            }
            regs::MMU_INVALIDATE => {
                if v & 1 != 0 {
                    sh.mmu.invalidate();
                }
            }
            _ if engine_root_reg(off).is_some() => {
                sh.regs.store(off, v);
                sh.apply_engine_roots();
            }
            _ => {
                let Some((e, r)) = engine_reg(off) else {
                    return;
                };
                match r {
                    eng::RING_BASE_LO | eng::RING_BASE_HI | eng::RING_SIZE | eng::RING_WPTR => {
                        sh.regs.store(off, v)
                    }
                    eng::CTRL => {
                        let v = v & (regs::CTRL_ENABLE | regs::CTRL_RESET);
                        sh.regs.store(off, v);
                        sh.apply_enable(e, v);
                        if v & regs::CTRL_RESET != 0 {
                            // Errors only when the engine thread is gone
                            // (after shutdown); nothing more to do then.
                            let _ = self.reset_engine(e);
                        }
                    }
                    eng::DOORBELL => sh.doorbell(e),
                    _ => {}
                }
            }
        }
    }

    /// The ivshmem doorbell (section 2.3): vector `e` < 3 rings engine `e`;
    /// vector 3 applies the control registers the host wrote into the page.
    /// Other vectors are ignored.
    pub fn doorbell(&self, vector: u32) {
        let sh = &self.sh;
        if (vector as usize) < NUM_ENGINES {
            sh.doorbell(vector as usize);
        } else if vector == regs::CONTROL_VECTOR {
            sh.apply_control();
        }
    }

    /// Hands the ivshmem doorbell eventfds to the model (feature `shm`):
    /// `fds[e]` is engine `e`'s (vector `e`), `fds[3]` the control
    /// doorbell's. Each idle engine then sleeps on its own eventfd, so a
    /// host's doorbell wakes the engine thread directly (`docs/refgpu.md`
    /// section 2.3, binding decisions). The eventfds must be non-blocking.
    /// Whoever also watches the control eventfd (the server's loop) must
    /// apply it with [`Model::take_control_bell`], never by reading it.
    ///
    /// # Errors
    ///
    /// Doorbells were already attached, or an eventfd could not be made.
    #[cfg(feature = "shm")]
    pub fn attach_doorbells(&self, fds: [std::os::fd::OwnedFd; NUM_ENGINES + 1]) -> std::io::Result<()> {
        self.sh.attach_bells(fds)
    }

    /// Applies a pending control doorbell from the attached control
    /// eventfd (see [`Model::attach_doorbells`]); returns whether there
    /// was one.
    #[cfg(feature = "shm")]
    pub fn take_control_bell(&self) -> bool {
        self.sh.take_control_bell()
    }

    /// Resets engine `e` (section 4.5) and waits until the reset is done.
    /// Equivalent to writing CTRL with RESET in-process.
    pub fn reset_engine(&self, e: usize) -> Result<(), ModelError> {
        if e >= NUM_ENGINES {
            return Err(ModelError::Config("no such engine"));
        }
        self.sh.regs.fetch_or(regs::engine_base(e) + eng::CTRL, regs::CTRL_RESET);
        let my = self.sh.request_reset(e);
        let es = &self.sh.engines[e];
        loop {
            let seen = es.reset_waker.seq();
            if es.reset_done.load(Ordering::SeqCst) >= my {
                return Ok(());
            }
            if !self.engine_alive(e) {
                return Err(ModelError::EngineGone(e));
            }
            es.reset_waker.wait(seen, Duration::from_millis(10));
        }
    }

    fn engine_alive(&self, e: usize) -> bool {
        lock(&self.engines).get(e).is_some_and(|t| !t.is_finished())
    }

    /// What engine `e`'s thread and reset state look like, for a host
    /// that saw a reset not finish: whether the thread runs, how many turns
    /// its loop made, reset requests made and completed, pending attention
    /// bits, CTRL, enable and stall.
    pub fn engine_diagnosis(&self, e: usize) -> String {
        let Some(es) = self.sh.engines.get(e) else {
            return format!("engine {e}: no such engine");
        };
        format!(
            "engine {e}: thread {}, {} loop turns, resets requested {} done {}, attn {:#x}, CTRL {:#x}, enabled {}, stalled {}",
            if self.engine_alive(e) { "running" } else { "ended" },
            es.turns.load(Ordering::Relaxed),
            es.reset_req.load(Ordering::SeqCst),
            es.reset_done.load(Ordering::SeqCst),
            es.attn.load(Ordering::SeqCst),
            self.sh.ereg(e, eng::CTRL),
            es.enabled.load(Ordering::SeqCst),
            es.stalled.load(Ordering::SeqCst),
        )
    }

    /// Whether all three engine threads are running (a test aid: an engine
    /// thread only ends at shutdown, never on guest input).
    pub fn engines_alive(&self) -> bool {
        let t = lock(&self.engines);
        t.len() == NUM_ENGINES && t.iter().all(|t| !t.is_finished())
    }

    /// A snapshot of engine `e`'s registers (`None` for a bad index).
    pub fn engine_snapshot(&self, e: usize) -> Option<EngineSnapshot> {
        if e >= NUM_ENGINES {
            return None;
        }
        let r = |off: u32| self.sh.ereg(e, off);
        let r64 = |lo: u32| u64::from(r(lo)) | (u64::from(r(lo + 4)) << 32);
        // STATUS before FAULT_STATUS: the engine publishes the fault before
        // HALTED, so a snapshot showing HALTED also shows its fault.
        let status = r(eng::STATUS);
        let fault_status = r(eng::FAULT_STATUS);
        Some(EngineSnapshot {
            rptr: r(eng::RING_RPTR),
            wptr: r(eng::RING_WPTR),
            ctrl: r(eng::CTRL),
            status,
            cur_addr: r64(eng::CUR_ADDR_LO),
            ib_base: r64(eng::IB_BASE_LO),
            ib_size: r(eng::IB_SIZE),
            fault: Fault::from_regs(fault_status, r64(eng::FAULT_ADDR_LO)),
            fault_status,
        })
    }

    /// Number of times interrupt vector `v` was raised (delivered or
    /// queued for delivery).
    pub fn irq_count(&self, v: usize) -> u64 {
        self.sh.irq.count(v)
    }

    /// Whether this model runs over caller-provided mappings.
    pub fn is_shared(&self) -> bool {
        self.shared_mode
    }

    // ----- fault injection -----

    /// Replaces the fault-injection configuration (effective from each
    /// engine's next packet; FENCE counters and random streams restart).
    pub fn set_fault_injection(&self, fi: FaultInjection) {
        let sh = &self.sh;
        sh.irq.set_delay(fi.irq_delay);
        for (e, es) in sh.engines.iter().enumerate() {
            es.stalled.store(fi.stalled_engines & (1 << e) != 0, Ordering::SeqCst);
        }
        *lock(&sh.inject) = fi;
        sh.inject_version.fetch_add(1, Ordering::SeqCst);
        for es in &sh.engines {
            es.waker.wake();
        }
    }

    /// The current fault-injection configuration.
    pub fn fault_injection(&self) -> FaultInjection {
        lock(&self.sh.inject).clone()
    }

    // ----- system memory (physical addresses) -----

    fn range(&self, pa: u64, len: usize) -> Result<(), ModelError> {
        if self.sh.mem.contains(pa, len as u64) {
            Ok(())
        } else {
            Err(ModelError::OutOfRange { addr: pa, len: len as u64 })
        }
    }

    /// Reads bytes of system memory.
    pub fn read_mem(&self, pa: u64, out: &mut [u8]) -> Result<(), ModelError> {
        self.range(pa, out.len())?;
        self.sh
            .mem
            .read_bytes(pa, out)
            .map_err(|_| ModelError::OutOfRange { addr: pa, len: out.len() as u64 })
    }

    /// Writes bytes of system memory (wakes engines in WAIT_MEM).
    pub fn write_mem(&self, pa: u64, data: &[u8]) -> Result<(), ModelError> {
        self.range(pa, data.len())?;
        let r = self.sh.mem.write_bytes(pa, data);
        core::sync::atomic::fence(Ordering::Release);
        self.sh.mem_waker.wake();
        r.map_err(|_| ModelError::OutOfRange { addr: pa, len: data.len() as u64 })
    }

    /// Writes dwords (little-endian) at 4-aligned `pa`.
    pub fn write_dwords(&self, pa: u64, data: &[u32]) -> Result<(), ModelError> {
        if pa % 4 != 0 {
            return Err(ModelError::Misaligned { addr: pa });
        }
        self.range(pa, data.len() * 4)?;
        let r = self.sh.mem.write_u32s(pa, data);
        core::sync::atomic::fence(Ordering::Release);
        self.sh.mem_waker.wake();
        r.map_err(|_| ModelError::OutOfRange { addr: pa, len: data.len() as u64 * 4 })
    }

    /// Reads dwords at 4-aligned `pa`.
    pub fn read_dwords(&self, pa: u64, out: &mut [u32]) -> Result<(), ModelError> {
        if pa % 4 != 0 {
            return Err(ModelError::Misaligned { addr: pa });
        }
        self.range(pa, out.len() * 4)?;
        core::sync::atomic::fence(Ordering::Acquire);
        self.sh
            .mem
            .read_u32s(pa, out)
            .map_err(|_| ModelError::OutOfRange { addr: pa, len: out.len() as u64 * 4 })
    }

    /// Reads the dword at 4-aligned `pa` (acquire).
    pub fn read_u32(&self, pa: u64) -> Result<u32, ModelError> {
        if pa % 4 != 0 {
            return Err(ModelError::Misaligned { addr: pa });
        }
        self.sh.mem.read_u32(pa).map_err(|_| ModelError::OutOfRange { addr: pa, len: 4 })
    }

    /// Writes the dword at 4-aligned `pa`.
    pub fn write_u32(&self, pa: u64, v: u32) -> Result<(), ModelError> {
        self.write_dwords(pa, &[v])
    }

    /// Reads the 64-bit value at 8-aligned `pa` (acquire: pairs with the
    /// release of FENCE).
    pub fn read_u64(&self, pa: u64) -> Result<u64, ModelError> {
        if pa % 8 != 0 {
            return Err(ModelError::Misaligned { addr: pa });
        }
        self.sh.mem.read_u64(pa).map_err(|_| ModelError::OutOfRange { addr: pa, len: 8 })
    }

    /// Writes the 64-bit value at 8-aligned `pa` (release).
    pub fn write_u64(&self, pa: u64, v: u64) -> Result<(), ModelError> {
        if pa % 8 != 0 {
            return Err(ModelError::Misaligned { addr: pa });
        }
        let r = self.sh.mem.write_u64(pa, v, Ordering::Release);
        self.sh.mem_waker.wake();
        r.map_err(|_| ModelError::OutOfRange { addr: pa, len: 8 })
    }

    /// Walks the page tables rooted at the applied MMU_ROOT for `va`
    /// (ignoring permissions and the TLB): the physical address, or the
    /// fault kind. With the MMU disabled, returns `va`.
    pub fn translate(&self, va: u64) -> Result<u64, crate::FaultKind> {
        let r = &self.sh.regs;
        if r.load(regs::MMU_CTRL) & regs::MMU_ENABLE == 0 {
            return Ok(va);
        }
        let root = (u64::from(r.load(regs::MMU_ROOT_HI) & 0xFFFF) << 32)
            | u64::from(r.load(regs::MMU_ROOT_LO) & !0xFFF);
        crate::mmu::walk_host(&self.sh.mem, root, va)
    }

    /// Walks the page tables engine `e` translates through (its applied
    /// ENGINE_ROOT, or MMU_ROOT when that is 0; section 3.4) for `va`,
    /// ignoring permissions and the TLB. With the MMU disabled, returns
    /// `va`; a bad engine index is a TRANSLATION fault.
    pub fn translate_engine(&self, e: usize, va: u64) -> Result<u64, crate::FaultKind> {
        if e >= NUM_ENGINES {
            return Err(crate::FaultKind::Translation);
        }
        if self.sh.regs.load(regs::MMU_CTRL) & regs::MMU_ENABLE == 0 {
            return Ok(va);
        }
        crate::mmu::walk_host(&self.sh.mem, self.sh.mmu.root_for(e), va)
    }

    // ----- shutdown -----

    /// Stops every thread and waits for them. Idempotent; also done on drop.
    pub fn shutdown(&self) {
        for es in &self.sh.engines {
            es.attn.fetch_or(ATTN_SHUTDOWN, Ordering::SeqCst);
            es.waker.wake();
        }
        self.sh.mem_waker.wake();
        for t in lock(&self.engines).drain(..) {
            let _ = t.join();
        }
        self.sh.irq.close();
        self.stop_clock.store(true, Ordering::SeqCst);
        for t in lock(&self.others).drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Splits a register offset into (engine, offset within the block).
fn engine_reg(off: u32) -> Option<(usize, u32)> {
    if !(0x100..0x100 + 0x40 * NUM_ENGINES as u32).contains(&off) || off % 4 != 0 {
        return None;
    }
    Some((((off - 0x100) / 0x40) as usize, (off - 0x100) % 0x40))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
