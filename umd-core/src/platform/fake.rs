//! A deterministic, scripted fake refgpu, for the driver's tests and
//! benchmarks (feature `fake`; never in the default or embedded builds).
//!
//! It implements [`Platform`] + [`DirectIo`] over a plain memory array and a
//! register file with the spec's semantics (CTRL.RESET handshake, W1C
//! IRQ_STATUS, MMU_INVALIDATE). Its engines execute only when the test says
//! so (or, in [`Mode::OnDoorbell`] / [`Mode::OnDelay`], when the driver rings or
//! sleeps), using the decoder to walk the ring and the IBs, so tests decide
//! exactly when fences land. Time is virtual: `delay_ns` advances the clock,
//! so hang windows pass instantly and deterministically. MMU: engines use
//! GPU addresses as device addresses until the driver enables the MMU, then
//! they walk its page tables (as the bring-up fence round trip needs); a
//! fake made with [`Fake::with_local_memory`] on gen2 has local memory
//! (spec 3.5) right after the system memory, which the CPU never touches.
//!
//! A device loss is injected by setting [`FakeState::lost`] (every register
//! access fails from then on, and the engines stop) or [`FakeState::lose_at`]
//! (the same, from the register access of that number on, doorbells
//! counted); [`FakeState::doorbell_yields`] lets other threads run right
//! after a doorbell.
//!
//! [`Fake`] is coherent; [`NonCoherent`] wraps it with a CPU data cache the
//! engines do not see, which only the driver's cache maintenance moves data
//! through.
//!
//! The fake needs `std` (its memory is a `Vec`, its state behind a
//! `Mutex`); it is a test double, not driver code, so the crate's
//! panic-freedom lints do not apply to it: a test that drives it outside
//! what it models fails with a panic.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

extern crate std;

use std::vec;
use std::vec::Vec;

use core::cell::Cell;
use core::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

use crate::cmd::Command;
use crate::decode::Decoder;
use crate::hw::regs::{self, engine as er};
use crate::hw::{ChipId, Generation};
use crate::platform::{DirectIo, DmaFlags, DmaRegion, IrqWait, Platform, PlatformError};

/// The device address of the fake's memory's first byte.
pub const MEM_BASE: u64 = 0x8000_0000;
/// The granule of `dma_alloc`.
const PAGE: usize = 4096;

/// When the fake's engines run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Engines run only when the test calls `run`.
    Manual,
    /// Engines run everything on each doorbell.
    OnDoorbell,
    /// Engines run when the driver sleeps (delay_ns / wait_irq).
    OnDelay,
}

/// A fault injected into an engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineFault {
    /// The engine runs normally.
    #[default]
    None,
    /// The engine never moves (a WAIT_MEM that never holds).
    Stuck,
    /// The engine's current address keeps moving but nothing completes
    /// (a CHAIN loop).
    Spinning,
}

#[derive(Clone, Debug, Default)]
/// One engine of the fake.
pub struct Engine {
    /// The ring's read pointer (bytes from its base).
    pub rptr: u32,
    /// The ring's write pointer, as the driver last wrote it.
    pub wptr: u32,
    /// The address of the command executing (`CUR_ADDR`).
    pub cur: u64,
    /// The fault injected into it.
    pub fault: EngineFault,
    /// Halted by a fault: (`FAULT_STATUS`, `FAULT_ADDR`).
    pub halted: Option<(u32, u64)>,
    /// Ring commands executed.
    pub executed: u64,
}

/// The fake device: memory, registers, engines, virtual time, the knobs
/// that inject failures and the counters the tests read.
pub struct FakeState {
    /// The device's memory (system memory, then local memory if any).
    mem: Vec<u64>,
    /// Which pages of system memory `dma_alloc` handed out.
    pages_used: Vec<bool>,
    /// The register file, one word per 4-byte offset.
    pub regs: Vec<u32>,
    /// The three engines.
    pub engines: [Engine; 3],
    /// When the engines run.
    pub mode: Mode,
    /// The virtual clock (ns).
    pub now: u64,
    /// `delay_ns` calls.
    pub delays: u64,
    /// Nanoseconds slept through `delay_ns` in all.
    pub delayed_ns: u64,
    /// Doorbells rung.
    pub doorbells: u64,
    /// Whether `wait_irq` waits (otherwise `IrqWait::Unsupported`).
    pub irq_capable: bool,
    /// The device is lost: every register access fails, engines stop.
    pub lost: bool,
    /// DMA regions allocated and not freed.
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
    /// Engine accesses that met no valid translation (MMU on):
    /// the fake drops such a write, reads 0 and runs no such command
    /// stream, and counts them here.
    pub translation_faults: std::sync::atomic::AtomicU64,
}

impl FakeState {
    /// A coherent fake of generation `gen` with `mem_bytes` of memory,
    /// engines running on each doorbell, the MMU bypassed.
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
            translation_faults: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A fake whose engines translate through the driver's page tables once
    /// it enables the MMU, with `local_bytes` of local memory (reported in
    /// `LOCAL_BASE` / `LOCAL_SIZE` on gen2; 0: none) right after the
    /// `mem_bytes` of system memory that `dma_alloc` hands out.
    pub fn with_local_memory(gen: Generation, mem_bytes: usize, local_bytes: usize) -> FakeState {
        let mut st = FakeState::new(gen, mem_bytes);
        // By number: a build without gen2 has no `Generation::Gen2`.
        if gen.number() == 2 && local_bytes > 0 {
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

    /// Whether engines translate now (`MMU_CTRL` on).
    fn mmu_on(&self) -> bool {
        self.reg(regs::MMU_CTRL) & 1 != 0
    }

    /// The device address of GPU address `va`, walking the page tables as
    /// the device does (spec 3.2); `None` on a translation fault.
    fn translate(&self, va: u64) -> Option<u64> {
        use crate::hw::mmu;
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

    /// The word at device address `addr` (`None` outside the memory or
    /// untranslated).
    pub fn read_u32(&self, addr: u64) -> Option<u32> {
        let o = self.offset(addr, 4)?;
        match self.word(o) {
            Some(w) => Some(w.load(std::sync::atomic::Ordering::Acquire)),
            None => Some(u32::from_le_bytes(self.bytes()[o..o + 4].try_into().unwrap())),
        }
    }

    /// Writes the word at device address `addr` (`None` outside the
    /// memory or untranslated).
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

    /// The 64-bit value at device address `addr`, as two words.
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
        crate::hw::probe(self.reg(regs::ID)).unwrap().generation
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
            // What the driver has published: up to the write pointer, or
            // to the ring's end when it wrapped (never the bytes past the
            // write pointer, where the next submission is being written).
            let avail = if eng.wptr > eng.rptr { eng.wptr - eng.rptr } else { size - eng.rptr } as usize;
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

    /// Runs every engine, a few rounds so cross-engine waits settle.
    pub fn run_all(&mut self) {
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

    /// The 64-bit fence value at `dev_fence_va` (0 if unreadable).
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
    /// Allocates whole pages of system memory, first fit, zeroed.
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

    /// Frees a region `dma_alloc` handed out.
    pub fn dma_free(&mut self, region: DmaRegion) {
        let off = (region.dev_addr() - MEM_BASE) as usize;
        let pages = region.len() / PAGE;
        self.pages_used[off / PAGE..off / PAGE + pages].iter_mut().for_each(|u| *u = false);
        self.allocs -= 1;
    }

    /// Records the cleaned range in `cleaned` (the fake is coherent).
    pub fn cache_clean(&mut self, region: &DmaRegion, offset: usize, len: usize) {
        self.cleaned.push((region.dev_addr() + offset as u64, len));
    }

    /// The virtual clock, which moves 100 ns per read.
    pub fn now_ns(&mut self) -> u64 {
        self.now += 100;
        self.now
    }

    /// Advances the clock by `ns` (and runs the engines in `Mode::OnDelay`).
    pub fn delay_ns(&mut self, ns: u64) {
        self.delays += 1;
        self.delayed_ns += ns;
        self.now += ns;
        self.tick();
    }

    /// Sleeps up to 50 µs of virtual time, then reports whether an
    /// interrupt is pending.
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
    /// Reads a register with the spec's semantics (a lost device fails).
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

    /// Writes a register with the spec's semantics (a lost device fails).
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

    /// Rings engine `_engine`'s doorbell (in `Mode::OnDoorbell`, runs the
    /// engines).
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
    /// A coherent fake (`FakeState::new`).
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

std::thread_local! {
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
pub type FakeLock = crate::platform::SpinLock;

/// The fake's raw lock: the project's spin lock, counting per thread the
/// locks held, so the fake can tell a platform call made under one of the
/// engine's locks (`FakeState::dma_calls_under_lock`).
pub struct HeldLock(crate::platform::SpinLock);

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
    const INIT: Self = HeldLock(<crate::platform::SpinLock as lock_api::RawMutex>::INIT);
    type GuardMarker = <crate::platform::SpinLock as lock_api::RawMutex>::GuardMarker;

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

/// A fake with its state reachable (`Fake`, `NonCoherent`), for tests
/// that run on both.
pub trait Scripted: DirectIo {
    /// The fake's state (engines, registers, memory, counters).
    fn state(&self) -> MutexGuard<'_, FakeState>;
}

impl Scripted for Fake {
    fn state(&self) -> MutexGuard<'_, FakeState> {
        Fake::state(self)
    }
}

/// A write-back CPU data cache over the whole of the fake's memory: the
/// driver's regions point into `cpu`, the engines use the fake's memory.
struct CpuCache {
    /// The CPU's view (the driver accesses it, atomically where it shares
    /// words with other threads).
    cpu: Vec<u64>,
    /// Each 32-bit word of `cpu` as it was when last in sync with memory.
    synced: Vec<u32>,
    /// Bytes of a cache line (a power of two, at least 4): a line is dirty
    /// when any of its words differs from `synced`, and is written back
    /// or reloaded whole, as hardware does.
    line: usize,
}

/// The 32-bit word at byte offset `o` of `v` as an atomic.
fn atomic_word(v: &[u64], o: usize) -> &std::sync::atomic::AtomicU32 {
    assert!(o % 4 == 0 && o + 4 <= v.len() * 8);
    // SAFETY: in range and 4-byte aligned (asserted); every access to the
    // words the driver may share between threads is atomic.
    unsafe { std::sync::atomic::AtomicU32::from_ptr(v.as_ptr().cast::<u8>().add(o).cast_mut().cast()) }
}

/// The fake on a non-coherent system: the CPU works on a cache of its own
/// (`CpuCache`). `cache_clean` writes back, whole, every line overlapping
/// the range in which the CPU changed a word since it was last in sync
/// with memory (with 4-byte lines, `new`: exactly the words changed; with
/// 64-byte lines, `with_lines`: also the line's other words, as the CPU
/// last saw them, over whatever the device wrote there meanwhile);
/// `cache_invalidate` reloads every line overlapping the range from
/// memory, dropping CPU writes not cleaned (a plain invalidate, the
/// strictest reading of `Platform::cache_invalidate`). Nothing moves
/// between the two otherwise, except when a test evicts the dirty lines
/// (`evict_dirty`, what a cache may do at any time): a CPU write the
/// driver does not clean never reaches the engines, a device write it
/// does not invalidate is never seen. (A separate type so the coherent
/// fake the benchmarks measure has no cache code.)
pub struct NonCoherent {
    fake: Fake,
    cache: Mutex<CpuCache>,
}

impl NonCoherent {
    /// 4-byte lines: a clean writes back exactly the words the CPU changed.
    pub fn new(gen: Generation, mem_bytes: usize) -> NonCoherent {
        NonCoherent::with_lines(gen, mem_bytes, 4)
    }

    /// Lines of `line` bytes (a power of two from 4 to 4096), written back
    /// and reloaded whole.
    pub fn with_lines(gen: Generation, mem_bytes: usize, line: usize) -> NonCoherent {
        assert!(line.is_power_of_two() && (4..=PAGE).contains(&line));
        NonCoherent {
            fake: Fake::new(gen, mem_bytes),
            cache: Mutex::new(CpuCache {
                cpu: vec![0u64; mem_bytes / 8],
                synced: vec![0u32; mem_bytes / 4],
                line,
            }),
        }
    }

    fn cache(&self) -> MutexGuard<'_, CpuCache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The byte ranges of memory of the lines behind
    /// `region[offset..offset + len]` (clipped to the region, whose pages
    /// hold whole lines).
    fn lines(
        region: &DmaRegion,
        offset: usize,
        len: usize,
        line: usize,
    ) -> impl Iterator<Item = std::ops::Range<usize>> {
        let base = (region.dev_addr() - MEM_BASE) as usize;
        let start = base + offset.min(region.len()) / line * line;
        let end = base + offset.saturating_add(len).min(region.len()).div_ceil(line) * line;
        (start..end.max(start)).step_by(line).map(move |l| l..l + line)
    }

    /// Writes back every dirty line of memory, whole, as a cache may evict
    /// one at any time. Returns how many.
    pub fn evict_dirty(&self) -> usize {
        let st = self.fake.state();
        let c = &mut *self.cache();
        let mut n = 0;
        for l in (0..c.synced.len() * 4).step_by(c.line) {
            n += usize::from(Self::write_back(&st, c, l..l + c.line));
        }
        n
    }

    /// Writes line `l` back whole if the CPU changed a word of it.
    fn write_back(st: &FakeState, c: &mut CpuCache, l: std::ops::Range<usize>) -> bool {
        use std::sync::atomic::Ordering;
        let dirty =
            l.clone().step_by(4).any(|o| atomic_word(&c.cpu, o).load(Ordering::Acquire) != c.synced[o / 4]);
        if dirty {
            for o in l.step_by(4) {
                let v = atomic_word(&c.cpu, o).load(Ordering::Acquire);
                atomic_word(&st.mem, o).store(v, Ordering::Release);
                c.synced[o / 4] = v;
            }
        }
        dirty
    }
}

impl Scripted for NonCoherent {
    fn state(&self) -> MutexGuard<'_, FakeState> {
        self.fake.state()
    }
}

// SAFETY: as for `Fake`; the CPU side of a region points into `cpu`, which
// is never reallocated, at the region's offset in the fake's memory.
unsafe impl Platform for NonCoherent {
    type RawMutex = crate::platform::SpinLock;

    fn dma_alloc(&self, len: usize, flags: DmaFlags) -> Result<DmaRegion, PlatformError> {
        let r = self.fake.dma_alloc(len, flags)?;
        let off = (r.dev_addr() - MEM_BASE) as usize;
        let mut c = self.cache();
        c.cpu[off / 8..(off + r.len()) / 8].iter_mut().for_each(|w| *w = 0);
        c.synced[off / 4..(off + r.len()) / 4].iter_mut().for_each(|w| *w = 0);
        // SAFETY: `off + len` lies inside `cpu` (as inside the fake's
        // memory, of the same size); the Vec's buffer never moves.
        let ptr = unsafe { NonNull::new_unchecked(c.cpu.as_mut_ptr().cast::<u8>().add(off)) };
        // SAFETY: valid for the region's bytes, handed out once until freed.
        Ok(unsafe { DmaRegion::new(ptr, r.dev_addr(), r.len()) })
    }
    fn dma_free(&self, region: DmaRegion) {
        self.fake.dma_free(region)
    }
    fn cache_clean(&self, region: &DmaRegion, offset: usize, len: usize) {
        let mut st = self.fake.state();
        st.cache_clean(region, offset, len);
        let c = &mut *self.cache();
        for l in Self::lines(region, offset, len, c.line) {
            Self::write_back(&st, c, l);
        }
    }
    fn cache_invalidate(&self, region: &DmaRegion, offset: usize, len: usize) {
        let st = self.fake.state();
        let c = &mut *self.cache();
        for l in Self::lines(region, offset, len, c.line) {
            for o in l.step_by(4) {
                let v = atomic_word(&st.mem, o).load(std::sync::atomic::Ordering::Acquire);
                atomic_word(&c.cpu, o).store(v, std::sync::atomic::Ordering::Release);
                c.synced[o / 4] = v;
            }
        }
    }
    fn now_ns(&self) -> u64 {
        self.fake.now_ns()
    }
    fn delay_ns(&self, ns: u64) {
        self.fake.delay_ns(ns)
    }
    fn wait_irq(&self, timeout_ns: u64) -> IrqWait {
        self.fake.wait_irq(timeout_ns)
    }
}

impl DirectIo for NonCoherent {
    fn read_reg(&self, off: u32) -> Result<u32, PlatformError> {
        self.fake.read_reg(off)
    }
    fn write_reg(&self, off: u32, v: u32) -> Result<(), PlatformError> {
        self.fake.write_reg(off, v)
    }
    fn doorbell(&self, engine: u32) -> Result<(), PlatformError> {
        self.fake.doorbell(engine)
    }
}
