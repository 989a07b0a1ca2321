//! The device MMU (`docs/refgpu.md` section 3.2): the four-level walk, the
//! permission check and a small per-engine translation cache.
//!
//! [`MmuState`] holds the *applied* MMU registers shared by all engines
//! (ENABLE, ROOT, each engine's ENGINE_ROOT of section 3.4) and generation
//! counters; MMU_INVALIDATE, and any change of MMU_CTRL or MMU_ROOT, bump the
//! global generation, a change of ENGINE_ROOT(e) only engine `e`'s. Each engine owns a
//! [`Translator`] whose cache (a direct-mapped TLB of 4 KiB entries) is
//! emptied when it sees a new generation. Only successful translations are
//! cached, so an invalid entry made valid needs no invalidation, as the spec
//! allows. Page tables are read by physical address with acquire loads.
//!
//! Every engine access (command fetch, operand read or write, fence) goes
//! through [`Translator::translate`], which returns the physical address and
//! how many bytes after it are contiguous (up to the end of the 4 KiB page,
//! the 2 MiB block, or, with the MMU off, the window), or the [`Fault`] to
//! latch: TRANSLATION, PERMISSION, BAD_PTE or BUS, with the GPU address of
//! the access.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::error::{Access, Fault, FaultKind};
use crate::mem::SysMem;
use crate::regs::NUM_ENGINES;

/// PTE bit 0.
pub const PTE_VALID: u64 = 1 << 0;
/// PTE bit 1.
pub const PTE_TABLE: u64 = 1 << 1;
/// PTE bit 2.
pub const PTE_READ: u64 = 1 << 2;
/// PTE bit 3.
pub const PTE_WRITE: u64 = 1 << 3;
/// PTE bits 5:4.
pub const PTE_CACHE_MASK: u64 = 0x3 << 4;
/// PTE bits 47:12.
pub const PTE_ADDR_MASK: u64 = 0x0000_FFFF_FFFF_F000;
/// Reserved PTE bits: 11:6 and 63:48.
pub const PTE_RESERVED: u64 = 0xFFFF_0000_0000_0FC0;

const PAGE: u64 = 4096;
const BLOCK: u64 = 2 << 20;

/// Applied MMU registers, shared by all engines.
#[derive(Default)]
pub struct MmuState {
    enabled: AtomicBool,
    root: AtomicU64,
    generation: AtomicU64,
    /// Applied ENGINE_ROOT of each engine (0: the engine uses `root`).
    engine_root: [AtomicU64; NUM_ENGINES],
    /// Bumped when an engine's root changes: discards only that engine's
    /// cached translations.
    engine_generation: [AtomicU64; NUM_ENGINES],
}

impl MmuState {
    /// Applies MMU_CTRL and MMU_ROOT (invalidating cached translations when
    /// they change).
    pub fn apply(&self, ctrl: u32, root_lo: u32, root_hi: u32) {
        let root = crate::regs::root_addr(root_lo, root_hi);
        let en = ctrl & crate::regs::MMU_ENABLE != 0;
        let old_root = self.root.swap(root, Ordering::SeqCst);
        let old_en = self.enabled.swap(en, Ordering::SeqCst);
        if old_root != root || old_en != en {
            self.invalidate();
        }
    }

    /// Applies ENGINE_ROOT_LO/HI of engine `e` (section 3.4): a change
    /// discards that engine's cached translations. Ignores a bad index.
    pub fn apply_engine_root(&self, e: usize, lo: u32, hi: u32) {
        let (Some(r), Some(g)) = (self.engine_root.get(e), self.engine_generation.get(e)) else {
            return;
        };
        let root = crate::regs::root_addr(lo, hi);
        if r.swap(root, Ordering::SeqCst) != root {
            g.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The applied root engine `e` translates through: its ENGINE_ROOT, or
    /// MMU_ROOT when that is 0.
    pub fn root_for(&self, e: usize) -> u64 {
        match self.engine_root.get(e).map(|r| r.load(Ordering::Acquire)) {
            Some(r) if r != 0 => r,
            _ => self.root.load(Ordering::Acquire),
        }
    }

    /// Discards every cached translation of every engine.
    pub fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

/// A successful translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// Physical address.
    pub pa: u64,
    /// Contiguous bytes from `pa` with the same mapping (at least 1).
    pub extent: u64,
}

#[derive(Clone, Copy, Default)]
struct TlbEntry {
    /// VA >> 12, plus 1 so that 0 means empty.
    tag: u64,
    /// Physical page address.
    pa_page: u64,
    read: bool,
    write: bool,
}

const TLB_ENTRIES: usize = 64;

/// A per-engine translator with its TLB.
pub struct Translator {
    tlb: [TlbEntry; TLB_ENTRIES],
    /// The engine whose root (section 3.4) this translator walks.
    engine: usize,
    generation: u64,
    engine_generation: u64,
}

impl Default for Translator {
    fn default() -> Self {
        Self::new()
    }
}

/// Result of a raw walk.
struct Leaf {
    /// Physical address of the page or block.
    pa_base: u64,
    /// Page or block size.
    size: u64,
    read: bool,
    write: bool,
}

fn fault(kind: FaultKind, access: Access, va: u64) -> Fault {
    Fault { kind, access, addr: va, opcode: 0 }
}

/// Walks the page tables for `va` (no permission check).
fn walk(mem: &SysMem, root: u64, va: u64, access: Access) -> Result<Leaf, Fault> {
    if va >> 48 != 0 {
        return Err(fault(FaultKind::Translation, access, va));
    }
    let mut table = root;
    for level in 0..4u32 {
        let idx = (va >> (39 - 9 * level)) & 0x1FF;
        let pte = mem.read_u64(table + 8 * idx).map_err(|_| fault(FaultKind::Bus, access, va))?;
        if pte & PTE_VALID == 0 {
            return Err(fault(FaultKind::Translation, access, va));
        }
        if pte & PTE_RESERVED != 0 {
            return Err(fault(FaultKind::BadPte, access, va));
        }
        let is_table = pte & PTE_TABLE != 0;
        let addr = pte & PTE_ADDR_MASK;
        let leaf_size = match level {
            0 | 1 => {
                if !is_table {
                    return Err(fault(FaultKind::BadPte, access, va));
                }
                None
            }
            2 => (!is_table).then_some(BLOCK),
            _ => {
                if !is_table {
                    return Err(fault(FaultKind::BadPte, access, va));
                }
                Some(PAGE)
            }
        };
        match leaf_size {
            None => table = addr,
            Some(size) => {
                if pte & PTE_CACHE_MASK == PTE_CACHE_MASK {
                    return Err(fault(FaultKind::BadPte, access, va));
                }
                if addr & (size - 1) != 0 {
                    return Err(fault(FaultKind::BadPte, access, va));
                }
                return Ok(Leaf {
                    pa_base: addr,
                    size,
                    read: pte & PTE_READ != 0,
                    write: pte & PTE_WRITE != 0,
                });
            }
        }
    }
    // Unreachable: level 3 always returns. Report a BAD_PTE rather than
    // panicking should the loop ever fall through.
    Err(fault(FaultKind::BadPte, access, va))
}

fn allowed(read: bool, write: bool, access: Access) -> bool {
    match access {
        Access::Read | Access::Fetch => read,
        Access::Write => write,
    }
}

impl Translator {
    /// An empty translator for engine 0.
    pub fn new() -> Self {
        Self::for_engine(0)
    }

    /// An empty translator for engine `e` (it walks ENGINE_ROOT(e), or
    /// MMU_ROOT when that is 0).
    pub fn for_engine(e: usize) -> Self {
        Self {
            tlb: [TlbEntry::default(); TLB_ENTRIES],
            engine: e,
            generation: u64::MAX,
            engine_generation: u64::MAX,
        }
    }

    /// Empties the TLB.
    pub fn flush(&mut self) {
        self.tlb = [TlbEntry::default(); TLB_ENTRIES];
    }

    /// Translates the GPU address `va` for `access`. Page tables are read
    /// from system memory `mem`; the result may lie there or in `local`
    /// memory (section 3.5).
    pub fn translate(
        &mut self,
        mmu: &MmuState,
        mem: &SysMem,
        local: Option<&SysMem>,
        va: u64,
        access: Access,
    ) -> Result<Translation, Fault> {
        let generation = mmu.generation.load(Ordering::Acquire);
        let engine_generation =
            mmu.engine_generation.get(self.engine).map_or(0, |g| g.load(Ordering::Acquire));
        if generation != self.generation || engine_generation != self.engine_generation {
            self.flush();
            self.generation = generation;
            self.engine_generation = engine_generation;
        }
        if !mmu.enabled.load(Ordering::Acquire) {
            let extent = window_extent(mem, local, va);
            if extent == 0 {
                return Err(fault(FaultKind::Bus, access, va));
            }
            return Ok(Translation { pa: va, extent });
        }
        let vpn = va >> 12;
        let slot = (vpn as usize) % TLB_ENTRIES;
        let e = self.tlb[slot];
        if e.tag == vpn.wrapping_add(1) && va >> 48 == 0 {
            if !allowed(e.read, e.write, access) {
                return Err(fault(FaultKind::Permission, access, va));
            }
            return self.finish(
                mem,
                local,
                e.pa_page + (va & (PAGE - 1)),
                PAGE - (va & (PAGE - 1)),
                va,
                access,
            );
        }
        let root = mmu.root_for(self.engine);
        let leaf = walk(mem, root, va, access)?;
        if !allowed(leaf.read, leaf.write, access) {
            return Err(fault(FaultKind::Permission, access, va));
        }
        let off = va & (leaf.size - 1);
        let pa = leaf.pa_base + off;
        self.tlb[slot] = TlbEntry {
            tag: vpn.wrapping_add(1),
            pa_page: pa & !(PAGE - 1),
            read: leaf.read,
            write: leaf.write,
        };
        self.finish(mem, local, pa, leaf.size - off, va, access)
    }

    fn finish(
        &self,
        mem: &SysMem,
        local: Option<&SysMem>,
        pa: u64,
        extent: u64,
        va: u64,
        access: Access,
    ) -> Result<Translation, Fault> {
        let in_window = window_extent(mem, local, pa);
        if in_window == 0 {
            return Err(fault(FaultKind::Bus, access, va));
        }
        Ok(Translation { pa, extent: extent.min(in_window) })
    }
}

/// Bytes from `pa` to the end of the window (system or local memory) it
/// lies in; 0 outside both.
fn window_extent(mem: &SysMem, local: Option<&SysMem>, pa: u64) -> u64 {
    match local.map(|l| l.extent(pa)) {
        Some(n) if n > 0 => n,
        _ => mem.extent(pa),
    }
}

/// A page-table walk usable by the host (tests, debugging): translates `va`
/// with the given root, ignoring permissions. Returns the physical address
/// or the fault kind.
pub fn walk_host(mem: &SysMem, root: u64, va: u64) -> Result<u64, FaultKind> {
    walk(mem, root, va, Access::Read).map(|l| l.pa_base + (va & (l.size - 1))).map_err(|f| f.kind)
}
