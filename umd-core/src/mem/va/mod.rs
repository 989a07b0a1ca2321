//! Fixed-arena GPU virtual-address allocator: O(1) good-fit allocation and
//! O(1) coalescing, O(log n) worst case for every operation.
//!
//! GPU virtual addresses are not CPU memory, so the allocator keeps its
//! bookkeeping *out of band*, in a node array the integrator provides (a
//! `[VaNode; N]` in a `static`, a slice of a carve-out, or a `Box` on a host).
//! Nothing is allocated from a heap and the capacity never changes.
//!
//! # Data structure
//!
//! Every range of the arena is a node, either a *hole* (free) or an
//! *allocation*; together they tile the arena exactly.
//!
//! - All nodes are on a doubly-linked list in address order, so the
//!   neighbours of a range are one link away (boundary tags, kept out of band).
//! - Holes are on TLSF-style segregated free lists: 64 power-of-two classes,
//!   each cut into 16 linear sub-classes, with a bitmap of non-empty classes
//!   per level. Finding a class whose every hole is large enough is two
//!   `trailing_zeros`; inserting and removing a hole is O(1).
//! - Allocations are indexed by start address for `free(addr)`: the arena is
//!   cut into at most [`MAX_REGIONS`] equal power-of-two regions, and each
//!   region has a small AVL tree of the allocations that start in it. Its root
//!   lives in the node with the region's number, so the directory takes no
//!   extra storage. A two-level bitmap of non-empty regions answers "the last
//!   allocation before this address" for fixed-address requests.
//! - When the node storage is large enough that regions are at most 32
//!   granules (4 KiB: at least one node per 4 KiB of arena), the directory
//!   slot holds the region's *first* allocation instead of a tree root, and
//!   the address-ordered list is the index: a lookup walks at most 34
//!   ranges of its region, an insertion or removal is O(1) (the next
//!   allocation is at most two ranges on, as holes are coalesced). No tree
//!   rotations: with many small allocations this halves the cost of an
//!   alloc/free pair (docs/perf.md, talc's benchmark suite). With the
//!   `size-first` feature the list index serves every allocator, whatever
//!   its regions' size, and no tree code is linked (a lookup then walks
//!   its region's ranges: `docs/memory.md`, "Cost of each operation").
//!
//! - Optionally ([`VaAllocator::new_recycling`]), freed ranges of 1 to
//!   [`RECYCLE_CLASSES`] granules are kept on one stack per exact length
//!   (at most [`RECYCLE_LIMIT`] ranges in all) and handed to the next request of
//!   that length in O(1), without a size-class search, a split or
//!   coalescing; an allocation that would fail flushes them into the holes
//!   first. Half the instructions of an alloc/free pair of small requests
//!   (docs/perf.md, talc's suite). A recycled range stays in the index
//!   (the list, where a directory slot may name one, or its region tree;
//!   its stack link is the high half of its length field, so it keeps its
//!   tree links) until it is flushed, so such a free and alloc do not
//!   touch the index beyond the free's lookup (with region trees: the
//!   search, no removal, no insertion); lookups skip recycled ranges (a
//!   free, `lookup` or `retire` of one is [`VaError::NotAllocated`]).
//!   The driver builds its GPU VA allocator this way (direct mode with the
//!   MMU, kernel mode): a freed range of up to 8 KiB (an 8 KiB slab of
//!   128 B slots given back, a 4 or 8 KiB block of its own) is the first
//!   one the next request of its length gets (`docs/memory.md`).
//!
//! # Cost
//!
//! Every operation is O(1) apart from one region tree (O(log n) worst
//! case); with the list index every operation is O(1). There is no loop
//! over holes. The cost of each operation, with and without recycling, is
//! tabulated in `docs/memory.md` ("Cost of each operation").
//!
//! # Placement
//!
//! Requests are *good fit*: the hole comes from the smallest non-empty size
//! class whose every hole is large enough (so at most ~6 % larger than the
//! request's class). [`VaPlacement::BottomUp`] takes the low end of that hole,
//! [`VaPlacement::TopDown`] the high end, so two populations that use opposite
//! placements share holes from opposite ends. This is not address-ordered:
//! holes anywhere in the arena are used.
//!
//! For an alignment above [`MIN_ALIGN`], the good-fit hole is tried first;
//! then the smallest class that holds `size + align - MIN_ALIGN` (fits
//! whatever the address). If neither exists, up to [`EXACT_PROBES`] holes
//! from the request's own class upwards are tried one by one. The same probes
//! catch holes in the request's own class that happen to be large enough
//! (TLSF's known blind spot). So [`VaError::NoSpace`] means: no class above
//! the request's holds a usable hole, and none of the first [`EXACT_PROBES`]
//! candidates fits.

use core::fmt;

pub use crate::mem::stats::{fragmentation_ppm, VaStats};

mod avl;
mod classes;
mod fit;
mod index;
mod nodes;
mod recycle;
mod validate;

use classes::{CLASSES, FL_COUNT};
use index::{GROUP, GROUP_WORDS, LIST_GRANULES_LOG2, LIST_ONLY};

/// Granule of the arena: every address and size is a multiple of it, and it
/// is the smallest alignment, above every alignment refgpu's packets need
/// (`docs/memory.md`, "Placement, alignment, fixed addresses").
pub const MIN_ALIGN: u64 = 128;
const GRANULE_SHIFT: u32 = 7;

/// How many holes are tried one by one when the constant-time searches find
/// nothing (alignment misses and holes of the request's own size class).
/// Bounds the worst case of `alloc`.
pub const EXACT_PROBES: usize = 8;

/// Most regions the allocation index cuts the arena into (64 × 64 groups of
/// 64 regions). The real number is also at most the node capacity.
pub const MAX_REGIONS: usize = 64 * 64 * GROUP as usize;

/// Recycling (see [`VaAllocator::new_recycling`]) keeps freed ranges of 1 to
/// `RECYCLE_CLASSES` granules (up to 8 KiB), one stack per exact length.
pub const RECYCLE_CLASSES: usize = 64;

/// Most freed ranges recycling keeps at a time, all lengths together (one
/// length may hold them all); a free finding the limit reached coalesces as
/// usual. Bounds a flush to `RECYCLE_LIMIT` ranges. A shared limit rather
/// than a depth per length: a stack of 8 per length left 10 % of the frees
/// and allocations of talc's suite on the general path (docs/perf.md).
pub const RECYCLE_LIMIT: u32 = 512;

/// No node: the end of a list, an empty tree or directory slot.
const NIL: u32 = u32::MAX;

/// What a node records. Zero is [`State::Unused`], so storage of
/// [`VaNode::ZEROED`] is all zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum State {
    /// On the free node list, or never taken.
    Unused = 0,
    /// A hole: free, on the list of its size class.
    Hole = 1,
    /// A live allocation.
    Alloc = 2,
    /// An allocation its owner freed while the GPU may still use it
    /// ([`VaAllocator::retire`]); reserved until freed.
    Retired = 3,
    /// Freed and kept on a recycling stack (see
    /// [`VaAllocator::new_recycling`]): free, but not a hole until flushed.
    Cached = 4,
}

/// One node of bookkeeping storage. Opaque: integrators only create arrays
/// of [`VaNode::EMPTY`] and hand them to [`VaAllocator::new`].
#[derive(Clone, Copy, Debug)]
pub struct VaNode {
    start: u64,
    /// Length in bytes. A recycled range (`Cached`) keeps its length in
    /// the low half and its recycling stack link in the high half.
    len: u64,
    /// Address order: previous and next range.
    prev: u32,
    next: u32,
    /// Two links whose meaning depends on the node's state; read and
    /// written only through the accessors named for each role (below):
    /// a hole's size-class list links ([`VaNode::class_prev`],
    /// [`VaNode::class_next`]), an allocation's or recycled range's
    /// region-tree children ([`VaNode::left`], [`VaNode::right`]; the list
    /// index leaves them unused), an unused node's free-list link
    /// ([`VaNode::free_next`]).
    a: u32,
    b: u32,
    /// Directory slot, independent of this node's own role: root of the
    /// allocation tree of region number `index of this node`.
    root: u32,
    /// Directory slot too: number of non-empty regions in group number
    /// `index of this node` (fits the struct's padding).
    group: u8,
    /// Allocation: balance factor in its region tree (height of the right
    /// subtree minus that of the left, -1 to 1).
    bal: i8,
    state: State,
}

impl VaNode {
    /// An unused node, to initialise storage arrays.
    pub const EMPTY: VaNode = VaNode {
        start: 0,
        len: 0,
        prev: NIL,
        next: NIL,
        a: NIL,
        b: NIL,
        root: NIL,
        group: 0,
        bal: 0,
        state: State::Unused,
    };

    /// All zeros: filler for storage that [`VaAllocator::new`] is handed
    /// (a `static` of it is `.bss`, not `.data`). The allocator reads a node
    /// only after resetting it (directory slots in `new`, the others when
    /// taken), so the filler's links are never followed.
    pub const ZEROED: VaNode = VaNode {
        start: 0,
        len: 0,
        prev: 0,
        next: 0,
        a: 0,
        b: 0,
        root: 0,
        group: 0,
        bal: 0,
        state: State::Unused,
    };
}

// The node's packed layout: 40 bytes (`docs/memory.md`), the state one byte
// of the padding after the 64-bit fields and the links.
const _: () = assert!(core::mem::size_of::<VaNode>() == 40);

// The role-dependent links `a` and `b`, by role.
impl VaNode {
    /// Hole: the previous hole of its size class.
    #[inline(always)]
    fn class_prev(&self) -> u32 {
        self.a
    }

    /// Hole: the next hole of its size class.
    #[inline(always)]
    fn class_next(&self) -> u32 {
        self.b
    }

    #[inline(always)]
    fn set_class_prev(&mut self, h: u32) {
        self.a = h;
    }

    #[inline(always)]
    fn set_class_next(&mut self, h: u32) {
        self.b = h;
    }

    /// Allocation or recycled range: the left child in its region tree.
    #[inline(always)]
    fn left(&self) -> u32 {
        self.a
    }

    /// Allocation or recycled range: the right child in its region tree.
    #[inline(always)]
    fn right(&self) -> u32 {
        self.b
    }

    #[inline(always)]
    fn set_left(&mut self, n: u32) {
        self.a = n;
    }

    #[inline(always)]
    fn set_right(&mut self, n: u32) {
        self.b = n;
    }

    /// Unused: the next node of the free node list.
    #[inline(always)]
    fn free_next(&self) -> u32 {
        self.b
    }

    /// This node unused, on the free node list before `next`, with its
    /// directory slot (`root`, `group`) kept.
    #[inline(always)]
    fn released(&self, next: u32) -> VaNode {
        VaNode { root: self.root, group: self.group, b: next, ..VaNode::EMPTY }
    }
}

impl VaNode {
    /// An allocation (live or retired), as opposed to a hole, a recycled
    /// range or an unused node.
    #[inline(always)]
    fn is_allocation(&self) -> bool {
        matches!(self.state, State::Alloc | State::Retired)
    }

    /// In the allocation index (list or region tree): an allocation or a
    /// recycled range.
    #[inline(always)]
    fn is_listed(&self) -> bool {
        self.is_allocation() || self.state == State::Cached
    }
}

impl Default for VaNode {
    fn default() -> Self {
        Self::EMPTY
    }
}

/// Why a VA operation was refused. The allocator is unchanged after any
/// error, except that with recycling on an allocation may have flushed the
/// recycled ranges into the holes first ([`VaAllocator::new_recycling`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VaError {
    /// Size 0 was requested.
    ZeroSize,
    /// The alignment is not a power of two, or a fixed address is not a
    /// multiple of [`MIN_ALIGN`] (an arena that is not is
    /// [`VaError::BadArena`]).
    BadAlignment,
    /// Rounding the size or adding the alignment overflows `u64`.
    Overflow,
    /// No hole can hold the request.
    NoSpace,
    /// A fixed range is not inside the arena.
    OutOfRange,
    /// A fixed range overlaps a live (or retired) allocation.
    Overlap,
    /// The node storage is full; the integrator should give more nodes.
    NodeCapacity,
    /// No allocation starts at this address (unknown address or double free).
    NotAllocated,
    /// The allocation was already retired (freed, waiting for a fence).
    AlreadyRetired,
    /// The arena description given to [`VaAllocator::new`] is unusable.
    BadArena,
}

impl fmt::Display for VaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            VaError::ZeroSize => "zero-sized VA request",
            VaError::BadAlignment => "alignment is not a power of two or address is not 128-byte aligned",
            VaError::Overflow => "size or alignment overflows the address space",
            VaError::NoSpace => "no free VA range is large enough",
            VaError::OutOfRange => "fixed VA range is outside the arena",
            VaError::Overlap => "fixed VA range overlaps a live allocation",
            VaError::NodeCapacity => "VA allocator node storage is exhausted",
            VaError::NotAllocated => "no VA allocation starts at this address",
            VaError::AlreadyRetired => "VA allocation is already retired",
            VaError::BadArena => "invalid VA arena or node storage",
        };
        f.write_str(s)
    }
}

impl core::error::Error for VaError {}

/// Where a non-fixed allocation goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum VaPlacement {
    /// The low end of the good-fit hole (not address-ordered: see the
    /// module documentation, "Placement").
    #[default]
    BottomUp,
    /// The high end of the good-fit hole.
    TopDown,
}

/// A live allocation as seen by [`VaAllocator::lookup`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VaRange {
    /// First address.
    pub addr: u64,
    /// Length in bytes (the request rounded up to [`MIN_ALIGN`]).
    pub size: u64,
    /// Retired: freed by its owner but not yet returned (fence pending).
    pub retired: bool,
}

/// A live allocation as returned by [`VaAllocator::alloc_handle`]: its
/// address and the bookkeeping node that records it, so that
/// [`VaAllocator::free_handle`] can free it without looking the address up.
///
/// A handle is only a hint about where the record is: the allocator checks
/// it (the node must record a live or retired allocation starting at
/// [`VaHandle::addr`]) and otherwise falls back to the address lookup, so a
/// stale or forged handle behaves exactly like [`VaAllocator::free`] of its
/// address and can not free another allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VaHandle {
    addr: u64,
    node: u32,
}

impl VaHandle {
    /// First address of the allocation.
    pub const fn addr(&self) -> u64 {
        self.addr
    }
}

/// The VA allocator over `[base, base + size)` with node storage `S`.
///
/// `S` is anything that derefs to a node slice: `[VaNode; N]` (const
/// generic capacity), `&'static mut [VaNode]` (caller-provided static
/// storage) or, on a host, `Box<[VaNode]>`. An allocation takes at most two
/// nodes, so `2 * live_allocations + 1` nodes always suffice.
///
/// `RECYCLE` chooses recycling (see [`VaAllocator::new_recycling`]); it is
/// a type parameter so that the allocator without it does not test for it.
pub struct VaAllocator<S, const RECYCLE: bool = false> {
    nodes: S,
    base: u64,
    size: u64,
    /// The range starting at `base`.
    head: u32,
    free_list: u32,
    bump: u32,
    capacity: u32,
    nodes_used: u32,
    nodes_high_water: u32,
    hole_count: u64,
    alloc_count: u64,
    used: u64,
    high_water: u64,
    /// Regions are `1 << region_shift` bytes; `regions` of them.
    region_shift: u32,
    regions: u32,
    /// Regions are small enough (at most 2^LIST_GRANULES_LOG2 granules)
    /// that the directory slot holds the region's first allocation and the
    /// address list is the index; otherwise it holds an AVL tree's root.
    /// Always with `size-first` ([`index::LIST_ONLY`]); read through
    /// `list_index()`.
    list_index: bool,
    /// Bit `f`: some class of level `f` is non-empty.
    fl_bits: u64,
    /// Bit `s` of word `f`: class `f * 16 + s` is non-empty.
    sl_bits: [u32; FL_COUNT],
    /// First hole of every class.
    heads: [u32; CLASSES],
    /// Bit per group of regions: some tree of the group is non-empty; plus a
    /// summary bit per word.
    group_bits: [u64; GROUP_WORDS],
    group_top: u64,
    /// Ranges on the recycling stacks (all of them; at most
    /// [`RECYCLE_LIMIT`]).
    recycled: u32,
    /// Top of the recycling stack of ranges of `g + 1` granules (linked
    /// through the high half of each range's `len`, see [`recycle::stack_link`]).
    recycle_heads: [u32; RECYCLE_CLASSES],
}

impl<S: AsRef<[VaNode]> + AsMut<[VaNode]>> VaAllocator<S> {
    /// Manages `[base, base + size)` with the given node storage.
    ///
    /// `base` and `size` must be non-zero multiples of [`MIN_ALIGN`] (base may
    /// be 0), the range must not wrap, and the storage must hold at least one
    /// node. O(min(capacity, [`MAX_REGIONS`])): the region directory is reset;
    /// the rest of the storage is used lazily.
    pub fn new(nodes: S, base: u64, size: u64) -> Result<Self, VaError> {
        Self::build(nodes, base, size)
    }
}

impl<S: AsRef<[VaNode]> + AsMut<[VaNode]>> VaAllocator<S, true> {
    /// [`VaAllocator::new`], with recycling: a freed range of 1 to
    /// [`RECYCLE_CLASSES`] granules is not coalesced but kept on a stack of
    /// ranges of its exact length (at most [`RECYCLE_LIMIT`] ranges of all
    /// lengths together; a free finding the limit reached coalesces as
    /// usual), and an allocation
    /// of that length whose alignment the top range meets takes it in O(1):
    /// no size-class search, no split, no coalescing. The placement is not
    /// looked at for such a reuse.
    ///
    /// A recycled range counts as free in [`VaStats`] (`used`, `free`), but
    /// it is not a hole (`holes`, `largest_free`,
    /// [`VaAllocator::for_each_hole`]) until it is flushed: by an
    /// allocation that would otherwise fail (it flushes, then tries again,
    /// so it fails only when it would have failed without recycling), by
    /// [`VaAllocator::alloc_fixed`] when a recycled range may be in the way
    /// (not when the range is inside a hole, or meets an allocation) and
    /// by [`VaAllocator::flush_recycled`].
    /// A flush coalesces at most [`RECYCLE_LIMIT`] ranges,
    /// O(1) each, which bounds the extra worst case of those calls. Meant
    /// for heaps of many small allocations of recurring sizes
    /// (docs/perf.md, talc's suite).
    pub fn new_recycling(nodes: S, base: u64, size: u64) -> Result<Self, VaError> {
        Self::build(nodes, base, size)
    }
}

impl<S: AsRef<[VaNode]> + AsMut<[VaNode]>, const RECYCLE: bool> VaAllocator<S, RECYCLE> {
    /// `new` and `new_recycling`.
    fn build(nodes: S, base: u64, size: u64) -> Result<Self, VaError> {
        let n = nodes.as_ref().len();
        if n == 0 || size == 0 || base % MIN_ALIGN != 0 || size % MIN_ALIGN != 0 {
            return Err(VaError::BadArena);
        }
        base.checked_add(size).ok_or(VaError::BadArena)?;
        let capacity = u32::try_from(n).unwrap_or(NIL - 1).min(NIL - 1);
        // Regions: a power of two of bytes, at least one granule, at most
        // min(capacity, MAX_REGIONS) of them.
        let max_regions = capacity.min(MAX_REGIONS as u32).max(1);
        let log_m = 31u32.wrapping_sub(max_regions.leading_zeros());
        let ceil_log2 = 64u32.wrapping_sub(size.wrapping_sub(1).leading_zeros());
        let region_shift = ceil_log2.saturating_sub(log_m).max(GRANULE_SHIFT);
        let regions = size.wrapping_sub(1).checked_shr(region_shift).unwrap_or(0).wrapping_add(1);
        let regions = u32::try_from(regions).map_err(|_| VaError::BadArena)?;
        let mut a = VaAllocator {
            nodes,
            base,
            size,
            head: NIL,
            free_list: NIL,
            bump: 0,
            capacity,
            nodes_used: 0,
            nodes_high_water: 0,
            hole_count: 0,
            alloc_count: 0,
            used: 0,
            high_water: 0,
            region_shift,
            regions,
            list_index: LIST_ONLY || region_shift <= GRANULE_SHIFT + LIST_GRANULES_LOG2,
            fl_bits: 0,
            sl_bits: [0; FL_COUNT],
            heads: [NIL; CLASSES],
            group_bits: [0; GROUP_WORDS],
            group_top: 0,
            recycled: 0,
            recycle_heads: [NIL; RECYCLE_CLASSES],
        };
        // The storage may have served an earlier allocator: reset the
        // directory slots this one uses.
        for slot in a.nodes.as_mut().iter_mut().take(regions as usize) {
            slot.root = NIL;
            slot.group = 0;
        }
        let h = a.take_node().ok_or(VaError::BadArena)?;
        if let Some(v) = a.node_mut(h) {
            *v = VaNode { root: v.root, group: v.group, ..VaNode::EMPTY };
        }
        a.set(h, base, size, State::Hole);
        a.head = h;
        a.list_push(h);
        a.hole_count = 1;
        Ok(a)
    }

    /// First address of the arena.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Size of the arena in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Allocates `size` bytes aligned to `align` (a power of two; values
    /// below [`MIN_ALIGN`] are raised to it). The size is rounded up to
    /// [`MIN_ALIGN`]. Good fit; see the module documentation for placement.
    /// O(1) plus one region-tree insertion (O(log n) worst case).
    pub fn alloc(&mut self, size: u64, align: u64, placement: VaPlacement) -> Result<u64, VaError> {
        self.alloc_node(size, align, placement).map(|(_, addr)| addr)
    }

    /// [`VaAllocator::alloc`], returning a [`VaHandle`] (the address and
    /// the node that records it) for [`VaAllocator::free_handle`]. Same
    /// placement, cost and errors.
    pub fn alloc_handle(
        &mut self,
        size: u64,
        align: u64,
        placement: VaPlacement,
    ) -> Result<VaHandle, VaError> {
        self.alloc_node(size, align, placement).map(|(node, addr)| VaHandle { addr, node })
    }

    /// `alloc` and `alloc_handle`: the allocation's node and address.
    #[inline(always)]
    fn alloc_node(&mut self, size: u64, align: u64, placement: VaPlacement) -> Result<(u32, u64), VaError> {
        let (size, align) = normalize(size, align)?;
        if size > self.size {
            return Err(VaError::NoSpace);
        }
        if RECYCLE {
            if let Some(found) = self.recycle_pop(size, align) {
                return Ok(found);
            }
        }
        let found = self.find_fit(size, align, placement).and_then(|(hole, addr)| {
            let n = self.carve(hole, addr, size)?;
            Ok((n, addr))
        });
        if RECYCLE && found.is_err() && self.recycled != 0 {
            return self.alloc_flushed(size, align, placement);
        }
        found
    }

    /// Reserves exactly `[addr, addr + size)` (libdrm's `va_base_required`).
    /// `addr` must be a multiple of [`MIN_ALIGN`]; the size is rounded up to
    /// it. Worst case O(log n), plus one flush of the recycled ranges when
    /// the range is not inside a hole as found and meets no allocation (a
    /// recycled range may lie in the way, or split the hole it would
    /// coalesce into); a refusal for an allocation in the way changes
    /// nothing.
    pub fn alloc_fixed(&mut self, addr: u64, size: u64) -> Result<u64, VaError> {
        self.alloc_fixed_handle(addr, size).map(|h| h.addr)
    }

    /// [`VaAllocator::alloc_fixed`], returning a [`VaHandle`] for
    /// [`VaAllocator::free_handle`]. Same cost and errors.
    pub fn alloc_fixed_handle(&mut self, addr: u64, size: u64) -> Result<VaHandle, VaError> {
        let (size, _) = normalize(size, MIN_ALIGN)?;
        if addr % MIN_ALIGN != 0 {
            return Err(VaError::BadAlignment);
        }
        let end = addr.checked_add(size).ok_or(VaError::Overflow)?;
        let arena_end = self.base.wrapping_add(self.size);
        if addr < self.base || end > arena_end {
            return Err(VaError::OutOfRange);
        }
        // A hole found is free space whichever way it was found, so one
        // that holds the range is used at once; otherwise the answer needs
        // `containing` over coalesced holes: flush the recycled ranges and
        // look again.
        let holds = |a: &Self, h: u32| {
            a.state(h) == State::Hole && a.start(h) <= addr && a.start(h).wrapping_add(a.len(h)) >= end
        };
        // An allocation in the way (the range found, or the one after the
        // hole found) refuses the request whatever a flush would coalesce:
        // then the recycled ranges stay as they are.
        let meets = |a: &Self, x: u32| {
            a.node(x)
                .is_some_and(|v| v.is_allocation() && v.start < end && addr < v.start.wrapping_add(v.len))
        };
        let mut h = self.containing(addr);
        let blocked = meets(self, h) || (self.state(h) == State::Hole && meets(self, self.next(h)));
        if RECYCLE && !holds(self, h) && !blocked && self.recycled > 0 {
            self.flush_recycled();
            h = self.containing(addr);
        }
        if !holds(self, h) {
            return Err(VaError::Overlap);
        }
        let node = self.carve(h, addr, size)?;
        Ok(VaHandle { addr, node })
    }

    /// The allocation starting at `addr`, if any. O(1) plus one region-tree
    /// search.
    pub fn lookup(&self, addr: u64) -> Option<VaRange> {
        let x = self.find_alloc(addr)?;
        Some(VaRange { addr, size: self.len(x), retired: self.state(x) == State::Retired })
    }

    /// Marks the allocation at `addr` as retired: its owner freed it but the
    /// GPU may still use it, so it stays reserved until [`VaAllocator::free`].
    /// Returns its size. O(1) plus one region-tree search.
    pub fn retire(&mut self, addr: u64) -> Result<u64, VaError> {
        let x = self.find_alloc(addr).ok_or(VaError::NotAllocated)?;
        if self.state(x) == State::Retired {
            return Err(VaError::AlreadyRetired);
        }
        if let Some(n) = self.node_mut(x) {
            n.state = State::Retired;
        }
        Ok(self.len(x))
    }

    /// Frees the allocation starting at `addr` (live or retired) and
    /// coalesces it with adjacent holes. Returns its size. An unknown
    /// address, or a second free, is [`VaError::NotAllocated`]. One
    /// region-tree removal (O(log n) worst case; with the list index a walk
    /// of at most 34 ranges), the rest O(1).
    pub fn free(&mut self, addr: u64) -> Result<u64, VaError> {
        let r = self.region_of(addr).ok_or(VaError::NotAllocated)?;
        let x = if self.list_index() {
            let x = self.list_find(r, addr).ok_or(VaError::NotAllocated)?;
            if !RECYCLE {
                // Out of the list index here, next to the lookup that has
                // the region's slot at hand (see `release_alloc`).
                self.list_unindex(r, x);
            }
            x
        } else {
            // A range recycling keeps stays in its tree: then this is the
            // search alone.
            self.tree_remove_region(r, addr).ok_or(VaError::NotAllocated)?
        };
        Ok(self.release_alloc(r, x, addr))
    }

    /// Frees the allocation of a handle from [`VaAllocator::alloc_handle`]
    /// (live or retired) and coalesces it; returns its size. The result is
    /// always that of [`VaAllocator::free`]`(handle.addr())`, but when the
    /// handle's node still records the allocation (checked in O(1)) the
    /// address is not looked up: with the list index the whole free is
    /// O(1); with region trees a range recycling keeps stays in its tree
    /// and a region's only allocation is unlinked, both in O(1), otherwise
    /// by the tree removal (the same O(log n) descent as `free`, no
    /// separate search). A stale handle (its
    /// allocation freed, the node reused) falls back to the address lookup.
    pub fn free_handle(&mut self, handle: VaHandle) -> Result<u64, VaError> {
        let addr = handle.addr;
        let x = handle.node;
        let current = self.node(x).is_some_and(|v| v.start == addr && v.is_allocation());
        let Some(r) = self.region_of(addr).filter(|_| current) else {
            return self.free(addr);
        };
        if !self.list_index() {
            if self.recyclable(self.len(x)) {
                // Kept by recycling: it stays in its tree.
            } else if self.root(r) == x && self.left(x) == NIL && self.right(x) == NIL {
                // The region's only allocation (the usual case when
                // allocations are spread over the arena): no tree to search.
                self.set_root(r, NIL);
            } else {
                return self.free(addr);
            }
        } else if !RECYCLE {
            // Out of the list index here, as in `free`.
            self.list_unindex(r, x);
        }
        Ok(self.release_alloc(r, x, addr))
    }

    /// Frees allocation `x` of region `r` (at `addr`) and returns its size.
    /// Onto its recycling stack if [`Self::recyclable`], still in the index
    /// (the callers leave it there), else into a hole. Out of the index
    /// first: a region tree's callers took it out unless it is recyclable;
    /// without recycling the list index's callers took it out right after
    /// the lookup (which keeps the region's slot in registers); with
    /// recycling it is taken out here. O(1). One shared copy with
    /// `size-first`.
    #[cfg_attr(feature = "size-first", inline(never))]
    #[cfg_attr(not(feature = "size-first"), inline(always))]
    fn release_alloc(&mut self, r: u32, x: u32, addr: u64) -> u64 {
        let size = self.len(x);
        if !(RECYCLE && self.recycle_push(x, size)) {
            if RECYCLE && self.list_index() {
                self.list_unindex(r, x);
            }
            self.make_hole(x, addr, size);
        }
        self.alloc_count = self.alloc_count.wrapping_sub(1);
        self.used = self.used.wrapping_sub(size);
        size
    }

    /// Current statistics. O(1), except `largest_free`, which walks the
    /// largest non-empty size class (holes within ~6 % of each other in
    /// size; usually one).
    pub fn stats(&self) -> VaStats {
        VaStats {
            arena: self.size,
            used: self.used,
            free: self.size.wrapping_sub(self.used),
            largest_free: self.largest_hole(),
            high_water: self.high_water,
            allocations: self.alloc_count,
            holes: self.hole_count,
            nodes_used: u64::from(self.nodes_used),
            nodes_high_water: u64::from(self.nodes_high_water),
            nodes_capacity: u64::from(self.capacity),
        }
    }

    /// Calls `f(addr, len)` for every hole in address order. O(n); meant for
    /// dumps and tests.
    pub fn for_each_hole(&self, mut f: impl FnMut(u64, u64)) {
        self.walk(|v| {
            if v.state == State::Hole {
                f(v.start, v.len);
            }
        });
    }

    /// Calls `f(range)` for every allocation in address order. O(n); meant
    /// for leak reports and tests.
    pub fn for_each_allocation(&self, mut f: impl FnMut(VaRange)) {
        self.walk(|v| {
            if v.is_allocation() {
                f(VaRange { addr: v.start, size: v.len, retired: v.state == State::Retired });
            }
        });
    }

    /// Counts a new allocation of `size` bytes.
    #[inline(always)]
    fn count_alloc(&mut self, size: u64) {
        self.alloc_count = self.alloc_count.wrapping_add(1);
        self.used = self.used.wrapping_add(size);
        if self.used > self.high_water {
            self.high_water = self.used;
        }
    }
}

/// Validates and rounds a (size, align) request.
#[inline]
fn normalize(size: u64, align: u64) -> Result<(u64, u64), VaError> {
    if size == 0 {
        return Err(VaError::ZeroSize);
    }
    if !align.is_power_of_two() {
        return Err(VaError::BadAlignment);
    }
    let align = align.max(MIN_ALIGN);
    let size = size.checked_add(MIN_ALIGN - 1).ok_or(VaError::Overflow)? & !(MIN_ALIGN - 1);
    Ok((size, align))
}
