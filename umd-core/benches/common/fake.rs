//! The instruction-count benchmarks' own copy of the scripted fake refgpu
//! (`umd_core::platform::fake`, the coherent `Fake` alone), compiled into
//! this benchmark's crate.
//!
//! Why a copy: `tools/perf-gate.sh` counts every instruction of a
//! benchmark, the platform's calls included, against a committed baseline.
//! The same fake compiled in the library instead (another crate, another
//! codegen unit) is inlined differently into the driver's generic code:
//! the counts moved by up to 2.6 % (4 to 32 instructions with its platform
//! calls marked `#[inline]`), and the baseline must measure the driver,
//! not where the fake is compiled. Keep this file in step with
//! `umd-core/src/platform/fake.rs` for what the benchmarks use.
//!
#![allow(dead_code, clippy::unwrap_used, clippy::indexing_slicing, missing_docs)]

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

use umd_core::cmd::Command;
use umd_core::decode::Decoder;
use umd_core::hw::regs::{self, engine as er};
use umd_core::hw::{ChipId, Generation};
use umd_core::platform::{DirectIo, DmaFlags, DmaRegion, IrqWait, Platform, PlatformError};

pub const MEM_BASE: u64 = 0x8000_0000;
const PAGE: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Engines run only when the test calls `run`.
    Manual,
    /// Engines run everything on each doorbell.
    OnDoorbell,
    /// Engines run when the driver sleeps (delay_ns / wait_irq).
    OnDelay,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineFault {
    #[default]
    None,
    /// The engine never moves (a WAIT_MEM that never holds).
    Stuck,
    /// The engine's current address keeps moving but nothing completes
    /// (a CHAIN loop).
    Spinning,
}

#[derive(Clone, Debug, Default)]
pub struct Engine {
    pub rptr: u32,
    pub wptr: u32,
    pub cur: u64,
    pub fault: EngineFault,
    pub halted: Option<(u32, u64)>,
    pub executed: u64,
}

pub struct FakeState {
    mem: Vec<u64>,
    pages_used: Vec<bool>,
    pub regs: Vec<u32>,
    pub engines: [Engine; 3],
    pub mode: Mode,
    pub now: u64,
    pub delays: u64,
    pub delayed_ns: u64,
    pub doorbells: u64,
    pub irq_capable: bool,
    pub lost: bool,
    pub allocs: usize,
    /// DMA allocations refused for want of memory.
    pub dma_refused: usize,
    /// Engines that do not fetch, reset or not (the model's stall knob:
    /// RESET still completes, the engine still does not run).
    pub stalled: [bool; 3],
    /// Device ranges the driver cleaned from the data cache.
    pub cleaned: Vec<(u64, usize)>,
    /// Reads of an engine's RING_RPTR (also those refused as lost).
    pub rptr_reads: u64,
    /// Register accesses (reads, writes and doorbells) counted for
    /// `lose_at`.
    pub reg_accesses: u64,
    /// The device is lost at this register access (`reg_accesses`
    /// reaching it): that access fails, as every later one does.
    pub lose_at: Option<u64>,
    /// A doorbell yields the calling thread once rung, outside the fake's
    /// lock (`Fake`): other threads run while the driver is between its
    /// doorbell and what follows it.
    pub doorbell_yields: bool,
    /// `dma_alloc` and `dma_free` calls made while the calling thread held
    /// one of the engine's locks (`HeldLock`).
    pub dma_calls_under_lock: u64,
    /// Engines translate GPU addresses through the driver's page tables
    /// when `MMU_CTRL` enables them (`Fake::with_local_memory`).
    pub translates: bool,
    /// Engine accesses that met no valid translation (with `translates`):
    /// the fake drops such a write, reads 0 and runs no such command
    /// stream, and counts them here.
    pub translation_faults: std::sync::atomic::AtomicU64,
}

impl FakeState {
    pub fn new(gen: Generation, mem_bytes: usize) -> FakeState {
        let mut regs = vec![0u32; 1024];
        regs[(regs::ID / 4) as usize] = ChipId { generation: gen, revision: 1 }.id_register();
        regs[(regs::ENGINE_COUNT / 4) as usize] = 3;
        FakeState {
            mem: vec![0u64; mem_bytes / 8],
            pages_used: vec![false; mem_bytes / PAGE],
            regs,
            engines: Default::default(),
            mode: Mode::OnDoorbell,
            now: 1_000,
            delays: 0,
            delayed_ns: 0,
            doorbells: 0,
            irq_capable: false,
            lost: false,
            allocs: 0,
            dma_refused: 0,
            stalled: [false; 3],
            cleaned: Vec::new(),
            rptr_reads: 0,
            reg_accesses: 0,
            lose_at: None,
            doorbell_yields: false,
            dma_calls_under_lock: 0,
            translates: false,
            translation_faults: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A fake whose engines translate through the driver's page tables once
    /// it enables the MMU, with `local_bytes` of local memory (reported in
    /// `LOCAL_BASE` / `LOCAL_SIZE` on gen2; 0: none) right after the
    /// `mem_bytes` of system memory that `dma_alloc` hands out.
    pub fn with_local_memory(gen: Generation, mem_bytes: usize, local_bytes: usize) -> FakeState {
        let mut st = FakeState::new(gen, mem_bytes);
        st.translates = true;
        if gen == Generation::Gen2 && local_bytes > 0 {
            st.mem = vec![0u64; (mem_bytes + local_bytes) / 8];
            let base = MEM_BASE + mem_bytes as u64;
            st.set_reg(regs::LOCAL_BASE_LO, base as u32);
            st.set_reg(regs::LOCAL_BASE_LO + 4, (base >> 32) as u32);
            st.set_reg(regs::LOCAL_SIZE_LO, local_bytes as u32);
            st.set_reg(regs::LOCAL_SIZE_LO + 4, (local_bytes as u64 >> 32) as u32);
        }
        st
    }

    /// Counts a register access; the device is lost from the access
    /// `lose_at` names on. Whether it is lost.
    fn access(&mut self) -> Result<(), PlatformError> {
        self.reg_accesses += 1;
        if self.lose_at.is_some_and(|n| self.reg_accesses >= n) {
            self.lost = true;
        }
        if self.lost {
            return Err(PlatformError::DeviceLost);
        }
        Ok(())
    }

    /// Raw pointer to byte `off` of the fake's memory (benchmarks signal
    /// fences from another thread through it).
    pub fn mem_ptr_at(&mut self, off: u64) -> *mut u8 {
        assert!((off as usize) < self.mem.len() * 8);
        // SAFETY: checked to lie inside `mem`.
        unsafe { self.mem.as_mut_ptr().cast::<u8>().add(off as usize) }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: u64 storage viewed as bytes; same length, no padding.
        unsafe { std::slice::from_raw_parts(self.mem.as_ptr().cast::<u8>(), self.mem.len() * 8) }
    }

    fn offset(&self, addr: u64, len: usize) -> Option<usize> {
        let addr = if self.mmu_on() {
            let r = self.translate_span(addr, len);
            if r.is_none() {
                self.translation_faults.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            r?
        } else {
            addr
        };
        self.phys_offset(addr, len)
    }

    fn phys_offset(&self, addr: u64, len: usize) -> Option<usize> {
        let off = usize::try_from(addr.checked_sub(MEM_BASE)?).ok()?;
        (off + len <= self.mem.len() * 8).then_some(off)
    }

    /// Whether engines translate now (`translates` and `MMU_CTRL` on).
    fn mmu_on(&self) -> bool {
        self.translates && self.reg(regs::MMU_CTRL) & 1 != 0
    }

    /// The device address of GPU address `va`, walking the page tables as
    /// the device does (spec 3.2); `None` on a translation fault.
    fn translate(&self, va: u64) -> Option<u64> {
        use umd_core::hw::mmu;
        if va >= mmu::VA_LIMIT {
            return None;
        }
        let mut table = u64::from(self.reg(regs::MMU_ROOT_LO)) | u64::from(self.reg(regs::MMU_ROOT_HI)) << 32;
        for level in 0..mmu::LEVELS {
            let at = table + 8 * mmu::va_index(level, va) as u64;
            let o = self.phys_offset(at, 8)?;
            let e = u64::from(self.word(o)?.load(std::sync::atomic::Ordering::Acquire))
                | u64::from(self.word(o + 4)?.load(std::sync::atomic::Ordering::Acquire)) << 32;
            if !mmu::is_valid(e) || mmu::is_bad(level, e) {
                return None;
            }
            if mmu::is_table(level, e) {
                table = mmu::entry_addr(e);
                continue;
            }
            let span = mmu::entry_span(level);
            return Some(mmu::Pte(e).addr() | (va & (span - 1)));
        }
        None
    }

    /// The device address of `[va, va + len)`, when every page of it is
    /// mapped and the pages are contiguous in device memory.
    fn translate_span(&self, va: u64, len: usize) -> Option<u64> {
        let first = self.translate(va)?;
        let end = va.checked_add(len as u64)?;
        let mut page = (va | (PAGE as u64 - 1)) + 1;
        while page < end {
            if self.translate(page)? != first + (page - va) {
                return None;
            }
            page += PAGE as u64;
        }
        Some(first)
    }

    /// The word at byte offset `o` as an atomic: the driver reads words
    /// the fake GPU writes (fence slots) from other threads, as with any
    /// device, and both sides' accesses are atomic (`DmaRegion`).
    fn word(&self, o: usize) -> Option<&std::sync::atomic::AtomicU32> {
        if o % 4 != 0 {
            return None;
        }
        // SAFETY: `o + 4` is inside `mem` (checked by `offset`) and 4-byte
        // aligned; every concurrent access to these words is atomic.
        Some(unsafe {
            std::sync::atomic::AtomicU32::from_ptr(self.mem.as_ptr().cast::<u8>().add(o).cast_mut().cast())
        })
    }

    pub fn read_u32(&self, addr: u64) -> Option<u32> {
        let o = self.offset(addr, 4)?;
        match self.word(o) {
            Some(w) => Some(w.load(std::sync::atomic::Ordering::Acquire)),
            None => Some(u32::from_le_bytes(self.bytes()[o..o + 4].try_into().unwrap())),
        }
    }

    pub fn write_u32(&mut self, addr: u64, v: u32) -> Option<()> {
        let o = self.offset(addr, 4)?;
        if let Some(w) = self.word(o) {
            w.store(v, std::sync::atomic::Ordering::Release);
            return Some(());
        }
        // SAFETY: in range per `offset`; u64 storage viewed as bytes.
        let b =
            unsafe { std::slice::from_raw_parts_mut(self.mem.as_mut_ptr().cast::<u8>(), self.mem.len() * 8) };
        b[o..o + 4].copy_from_slice(&v.to_le_bytes());
        Some(())
    }

    pub fn read_u64(&self, addr: u64) -> Option<u64> {
        Some(u64::from(self.read_u32(addr)?) | (u64::from(self.read_u32(addr + 4)?) << 32))
    }

    fn write_u64(&mut self, addr: u64, v: u64) -> Option<()> {
        self.write_u32(addr, v as u32)?;
        self.write_u32(addr + 4, (v >> 32) as u32)
    }

    fn reg(&self, off: u32) -> u32 {
        self.regs[(off / 4) as usize]
    }

    fn set_reg(&mut self, off: u32, v: u32) {
        self.regs[(off / 4) as usize] = v;
    }

    fn ering(&self, e: usize) -> (u64, u32) {
        let base = u64::from(self.reg(regs::engine_reg(e as u32, er::RING_BASE_LO)))
            | (u64::from(self.reg(regs::engine_reg(e as u32, er::RING_BASE_HI))) << 32);
        (base, self.reg(regs::engine_reg(e as u32, er::RING_SIZE)))
    }

    fn gen(&self) -> Generation {
        umd_core::hw::probe(self.reg(regs::ID)).unwrap().generation
    }

    /// Runs engine `e` until its ring is empty, it blocks or it faults. A
    /// lost device runs nothing.
    pub fn run(&mut self, e: usize) {
        if self.lost || self.engines[e].halted.is_some() || self.stalled[e] {
            return;
        }
        match self.engines[e].fault {
            EngineFault::Stuck => return,
            EngineFault::Spinning => {
                self.engines[e].cur = self.engines[e].cur.wrapping_add(64);
                return;
            }
            EngineFault::None => {}
        }
        let ctrl = self.reg(regs::engine_reg(e as u32, er::CTRL));
        if ctrl & er::CTRL_ENABLE == 0 {
            return;
        }
        let (base, size) = self.ering(e);
        for _ in 0..100_000 {
            let eng = &self.engines[e];
            if eng.rptr == eng.wptr {
                break;
            }
            let at = base + u64::from(eng.rptr);
            let avail = (size - eng.rptr) as usize;
            let Some(o) = self.offset(at, avail) else { return };
            let bytes = self.bytes()[o..o + avail].to_vec();
            let item = Decoder::new(self.gen(), &bytes, at).next().unwrap();
            let len = item.raw.len() as u32;
            let Ok(p) = item.result else {
                self.engines[e].halted = Some((0x8000_0003 | 2 << 4, at));
                return;
            };
            self.engines[e].cur = at;
            if !self.exec(e, &p.command, true) {
                return; // blocked
            }
            let eng = &mut self.engines[e];
            eng.rptr = (eng.rptr + len) % size;
            eng.executed += 1;
        }
    }

    /// Executes one command; false if the engine blocks on it.
    fn exec(&mut self, e: usize, c: &Command<'_>, in_ring: bool) -> bool {
        match *c {
            Command::IndirectBuffer { addr, size_dw } if in_ring => {
                let (mut addr, mut size) = (addr, size_dw);
                for _hop in 0..1000 {
                    let Some(o) = self.offset(addr, size as usize * 4) else { return true };
                    let bytes = self.bytes()[o..o + size as usize * 4].to_vec();
                    let mut next = None;
                    for item in Decoder::new(self.gen(), &bytes, addr) {
                        let Ok(p) = item.result else { return true };
                        self.engines[e].cur = item.va;
                        if let Command::Chain { addr, size_dw } = p.command {
                            next = Some((addr, size_dw));
                            break;
                        }
                        self.exec(e, &p.command, false);
                    }
                    match next {
                        Some((a, s)) => (addr, size) = (a, s),
                        None => return true,
                    }
                }
                true
            }
            Command::Fence { addr, value, irq } => {
                self.write_u64(addr, value);
                if irq {
                    let st = regs::IRQ_STATUS;
                    let v = self.reg(st) | regs::irq_fence(e as u32);
                    self.set_reg(st, v);
                }
                true
            }
            Command::WaitMem { addr, reference, mask, wide, .. } => {
                let v = if wide {
                    self.read_u64(addr).unwrap_or(0)
                } else {
                    u64::from(self.read_u32(addr).unwrap_or(0))
                };
                ((v & mask).wrapping_sub(reference & mask) as i64) >= 0
            }
            Command::WriteData { dst, data } => {
                for (i, d) in data.iter().enumerate() {
                    self.write_u32(dst + 4 * i as u64, d);
                }
                true
            }
            Command::Timestamp { addr } => {
                // The device clock: the fake's virtual time.
                let now = self.now;
                self.write_u64(addr, now);
                true
            }
            Command::Fill { dst, size, value } => {
                for i in 0..size / 4 {
                    self.write_u32(dst + 4 * i, value);
                }
                true
            }
            Command::Copy { src, dst, size } => {
                let Some(so) = self.offset(src, size as usize) else {
                    // Untranslated: counted in `translation_faults`.
                    assert!(self.mmu_on(), "a copy from outside the fake's memory");
                    return true;
                };
                let data = self.bytes()[so..so + size as usize].to_vec();
                // Translated once when the destination is contiguous.
                let contiguous = self.mmu_on().then(|| self.translate_span(dst, size as usize)).flatten();
                if let Some(d) =
                    contiguous.and_then(|p| self.phys_offset(p, size as usize)).filter(|d| d % 4 == 0)
                {
                    for (i, ch) in data.chunks_exact(4).enumerate() {
                        let v = u32::from_le_bytes(ch.try_into().unwrap());
                        self.word(d + 4 * i).unwrap().store(v, std::sync::atomic::Ordering::Release);
                    }
                    return true;
                }
                for (i, ch) in data.chunks(4).enumerate() {
                    let mut w = [0u8; 4];
                    w[..ch.len()].copy_from_slice(ch);
                    if ch.len() == 4 {
                        self.write_u32(dst + 4 * i as u64, u32::from_le_bytes(w));
                    }
                }
                true
            }
            _ => true,
        }
    }

    pub fn run_all(&mut self) {
        // A few rounds so cross-engine waits settle.
        for _ in 0..4 {
            for e in 0..3 {
                self.run(e);
            }
        }
    }

    /// Halts engine `e` with a fault as the spec describes.
    pub fn inject_fault(&mut self, e: usize, kind: u32, access: u32, addr: u64) {
        self.engines[e].halted = Some((0x8000_0000 | kind | (access << 4), addr));
        let v = self.reg(regs::IRQ_STATUS) | regs::irq_fault(e as u32);
        self.set_reg(regs::IRQ_STATUS, v);
    }

    pub fn fence_slot(&self, dev_fence_va: u64) -> u64 {
        self.read_u64(dev_fence_va).unwrap_or(0)
    }

    fn tick(&mut self) {
        if self.mode == Mode::OnDelay {
            self.run_all();
        }
    }
}

impl FakeState {
    pub fn dma_alloc(&mut self, len: usize) -> Result<DmaRegion, PlatformError> {
        let pages = len.div_ceil(PAGE);
        let total = self.pages_used.len();
        // First fit, skipping past the last used page of a window that
        // does not fit (one pass over the pages).
        let mut s = 0;
        let start = loop {
            if s + pages > total {
                self.dma_refused += 1;
                return Err(PlatformError::OutOfMemory { len });
            }
            match self.pages_used[s..s + pages].iter().rposition(|u| *u) {
                Some(used) => s += used + 1,
                None => break s,
            }
        };
        self.pages_used[start..start + pages].iter_mut().for_each(|u| *u = true);
        self.allocs += 1;
        let off = start * PAGE;
        // Zero it.
        self.mem[off / 8..(off + pages * PAGE) / 8].iter_mut().for_each(|w| *w = 0);
        // SAFETY: `off` is inside `mem`; the Vec's buffer never moves.
        let ptr = unsafe { NonNull::new_unchecked(self.mem.as_mut_ptr().cast::<u8>().add(off)) };
        // SAFETY: valid for `pages * PAGE` bytes, exclusively handed out.
        Ok(unsafe { DmaRegion::new(ptr, MEM_BASE + off as u64, pages * PAGE) })
    }

    /// Bytes of the fake's memory handed out.
    pub fn bytes_in_use(&self) -> usize {
        self.pages_used.iter().filter(|u| **u).count() * PAGE
    }

    pub fn dma_free(&mut self, region: DmaRegion) {
        let off = (region.dev_addr() - MEM_BASE) as usize;
        let pages = region.len() / PAGE;
        self.pages_used[off / PAGE..off / PAGE + pages].iter_mut().for_each(|u| *u = false);
        self.allocs -= 1;
    }

    pub fn cache_clean(&mut self, region: &DmaRegion, offset: usize, len: usize) {
        self.cleaned.push((region.dev_addr() + offset as u64, len));
    }

    pub fn now_ns(&mut self) -> u64 {
        self.now += 100;
        self.now
    }

    pub fn delay_ns(&mut self, ns: u64) {
        self.delays += 1;
        self.delayed_ns += ns;
        self.now += ns;
        self.tick();
    }

    pub fn wait_irq(&mut self, timeout_ns: u64) -> IrqWait {
        if !self.irq_capable {
            return IrqWait::Unsupported;
        }
        self.delay_ns(timeout_ns.min(50_000));
        if self.reg(regs::IRQ_STATUS) != 0 {
            IrqWait::Interrupt
        } else {
            IrqWait::TimedOut
        }
    }
}

impl FakeState {
    pub fn read_reg(&mut self, off: u32) -> Result<u32, PlatformError> {
        let rel = off.checked_sub(regs::ENGINE_BASE);
        if rel.is_some_and(|r| r / regs::ENGINE_STRIDE < 3 && r % regs::ENGINE_STRIDE == er::RING_RPTR) {
            self.rptr_reads += 1;
        }
        self.access()?;
        let e =
            off.checked_sub(regs::ENGINE_BASE).map(|o| (o / regs::ENGINE_STRIDE) as usize).filter(|e| *e < 3);
        let v = match (e, off.checked_sub(regs::ENGINE_BASE).map(|o| o % regs::ENGINE_STRIDE)) {
            (Some(e), Some(r)) => {
                let eng = &self.engines[e];
                match r {
                    er::RING_RPTR => eng.rptr,
                    er::STATUS => {
                        let mut s = 0;
                        if eng.rptr != eng.wptr || eng.fault != EngineFault::None {
                            s |= er::STATUS_BUSY;
                        }
                        if eng.halted.is_some() {
                            s |= er::STATUS_HALTED;
                        }
                        s
                    }
                    er::CUR_ADDR_LO => eng.cur as u32,
                    er::CUR_ADDR_HI => (eng.cur >> 32) as u32,
                    er::FAULT_STATUS => eng.halted.map_or(0, |h| h.0),
                    er::FAULT_ADDR_LO => eng.halted.map_or(0, |h| h.1 as u32),
                    er::FAULT_ADDR_HI => eng.halted.map_or(0, |h| (h.1 >> 32) as u32),
                    _ => self.reg(off),
                }
            }
            _ => self.reg(off),
        };
        Ok(v)
    }

    pub fn write_reg(&mut self, off: u32, v: u32) -> Result<(), PlatformError> {
        self.access()?;
        if off == regs::IRQ_STATUS {
            let cur = self.reg(off);
            self.set_reg(off, cur & !v);
            return Ok(());
        }
        if off == regs::MMU_INVALIDATE {
            return Ok(()); // done at once: reads 0
        }
        if let Some(rel) = off.checked_sub(regs::ENGINE_BASE) {
            let e = (rel / regs::ENGINE_STRIDE) as usize;
            let r = rel % regs::ENGINE_STRIDE;
            if e < 3 {
                match r {
                    er::CTRL => {
                        if v & er::CTRL_RESET != 0 {
                            self.engines[e] = Engine::default();
                            let st = self.reg(regs::IRQ_STATUS)
                                & !(regs::irq_fence(e as u32) | regs::irq_fault(e as u32));
                            self.set_reg(regs::IRQ_STATUS, st);
                        }
                        self.set_reg(off, v & !er::CTRL_RESET);
                        return Ok(());
                    }
                    er::RING_WPTR => {
                        self.engines[e].wptr = v;
                        self.set_reg(off, v);
                        return Ok(());
                    }
                    _ => {}
                }
            }
        }
        self.set_reg(off, v);
        Ok(())
    }

    pub fn doorbell(&mut self, _engine: u32) -> Result<(), PlatformError> {
        self.access()?;
        self.doorbells += 1;
        if self.mode == Mode::OnDoorbell {
            self.run_all();
        }
        Ok(())
    }
}

/// The fake as a platform: its state behind a mutex, so the core can call
/// it from several threads.
pub struct Fake(Mutex<FakeState>);

impl Fake {
    pub fn new(gen: Generation, mem_bytes: usize) -> Fake {
        Fake(Mutex::new(FakeState::new(gen, mem_bytes)))
    }

    /// A fake whose engines translate through the driver's page tables,
    /// with local memory on gen2 (`FakeState::with_local_memory`).
    pub fn with_local_memory(gen: Generation, mem_bytes: usize, local_bytes: usize) -> Fake {
        Fake(Mutex::new(FakeState::with_local_memory(gen, mem_bytes, local_bytes)))
    }

    /// The fake's state (engines, registers, memory, counters).
    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

thread_local! {
    /// Engine locks (`HeldLock`) the current thread holds.
    static LOCKS_HELD: Cell<u32> = const { Cell::new(0) };
}

/// How many of the engine's locks the current thread holds.
pub fn locks_held() -> u32 {
    LOCKS_HELD.with(Cell::get)
}

/// The fake's lock: `HeldLock` in debug builds (the tests); in optimised
/// builds (the instruction-count benchmarks) the project's spin lock
/// itself, so that they count the driver and not the fake's bookkeeping.
#[cfg(debug_assertions)]
pub type FakeLock = HeldLock;
/// The fake's lock (see the `debug_assertions` twin).
#[cfg(not(debug_assertions))]
pub type FakeLock = umd_core::platform::SpinLock;

/// The fake's raw lock: the project's spin lock, counting per thread the
/// locks held, so the fake can tell a platform call made under one of the
/// engine's locks (`FakeState::dma_calls_under_lock`).
pub struct HeldLock(umd_core::platform::SpinLock);

/// Whether `HeldLock` counts (off by default: the instruction-count
/// benchmarks use this fake and measure the driver, not the count).
static TRACK_LOCKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes every `HeldLock` of the process count the locks each thread
/// holds from now on (for `FakeState::dma_calls_under_lock`). Call it
/// before the device is brought up: a lock taken before counts nothing.
/// False in an optimised build, whose fake does not count (`FakeLock`):
/// the caller then says it skips its check.
pub fn track_locks() -> bool {
    TRACK_LOCKS.store(true, std::sync::atomic::Ordering::SeqCst);
    cfg!(debug_assertions)
}

#[inline]
fn held(delta: i32) {
    if TRACK_LOCKS.load(std::sync::atomic::Ordering::Relaxed) {
        LOCKS_HELD.with(|c| c.set(c.get().saturating_add_signed(delta)));
    }
}

// SAFETY: every method acquires and releases only through the inner
// `SpinLock`, which upholds the trait's contract; the count is a
// thread-local side record.
unsafe impl lock_api::RawMutex for HeldLock {
    const INIT: Self = HeldLock(<umd_core::platform::SpinLock as lock_api::RawMutex>::INIT);
    type GuardMarker = <umd_core::platform::SpinLock as lock_api::RawMutex>::GuardMarker;

    #[inline]
    fn lock(&self) {
        lock_api::RawMutex::lock(&self.0);
        held(1);
    }

    #[inline]
    fn try_lock(&self) -> bool {
        let ok = lock_api::RawMutex::try_lock(&self.0);
        if ok {
            held(1);
        }
        ok
    }

    #[inline]
    unsafe fn unlock(&self) {
        held(-1);
        // SAFETY: the caller holds the lock (the trait's contract).
        unsafe { lock_api::RawMutex::unlock(&self.0) }
    }

    #[inline]
    fn is_locked(&self) -> bool {
        lock_api::RawMutex::is_locked(&self.0)
    }
}

// SAFETY: regions point into `mem`, which is never reallocated, are 4 KiB
// aligned within it and handed out once until freed; time only grows.
unsafe impl Platform for Fake {
    type RawMutex = FakeLock;

    fn dma_alloc(&self, len: usize, _flags: DmaFlags) -> Result<DmaRegion, PlatformError> {
        let mut st = self.state();
        if locks_held() > 0 {
            st.dma_calls_under_lock += 1;
        }
        st.dma_alloc(len)
    }
    fn dma_free(&self, region: DmaRegion) {
        let mut st = self.state();
        if locks_held() > 0 {
            st.dma_calls_under_lock += 1;
        }
        st.dma_free(region)
    }
    fn cache_clean(&self, region: &DmaRegion, offset: usize, len: usize) {
        self.state().cache_clean(region, offset, len)
    }
    fn now_ns(&self) -> u64 {
        self.state().now_ns()
    }
    fn delay_ns(&self, ns: u64) {
        self.state().delay_ns(ns)
    }
    fn wait_irq(&self, timeout_ns: u64) -> IrqWait {
        self.state().wait_irq(timeout_ns)
    }
}

impl DirectIo for Fake {
    fn read_reg(&self, off: u32) -> Result<u32, PlatformError> {
        self.state().read_reg(off)
    }
    fn write_reg(&self, off: u32, v: u32) -> Result<(), PlatformError> {
        self.state().write_reg(off, v)
    }
    fn doorbell(&self, engine: u32) -> Result<(), PlatformError> {
        let (r, yields) = {
            let mut st = self.state();
            (st.doorbell(engine), st.doorbell_yields)
        };
        if yields {
            std::thread::yield_now();
        }
        r
    }
}
