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
//!   alloc/free pair (docs/perf.md, talc's benchmark suite).
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
//! | operation | work |
//! | --- | --- |
//! | [`VaAllocator::alloc`] | two bitmap lookups, one hole (for alignment > 128 B: at most [`EXACT_PROBES`] + 1 holes), a split, one insertion into a region tree |
//! | [`VaAllocator::alloc_fixed`] | one region-tree search, at most one bitmap lookup and one more tree search, a split |
//! | [`VaAllocator::free`] | one region-tree removal (list index: a walk of ≤ 34 ranges), then O(1): both neighbours via links, ≤ 2 free-list moves |
//! | [`VaAllocator::alloc_handle`] | as `alloc` |
//! | [`VaAllocator::free_handle`] | an O(1) check of the handle, then as `free` without the lookup: O(1) with the list index, for a range recycling keeps or when the region tree is one node, else the tree removal (a stale handle: `free` of its address) |
//! | [`VaAllocator::lookup`], [`VaAllocator::retire`] | one region-tree search |
//! | with recycling: `alloc` of a recycled length, `free` while fewer than [`RECYCLE_LIMIT`] ranges are kept | `alloc`: O(1) (no search, split, coalescing or index insertion); `free`: the lookup (a region-tree search, no removal), then O(1); `free_handle`: O(1) |
//! | with recycling: an `alloc` that would fail, an [`VaAllocator::alloc_fixed`] whose range is not inside a hole as found and meets no allocation, [`VaAllocator::flush_recycled`] | one flush first: at most [`RECYCLE_LIMIT`] ranges coalesced, each as `free_handle` (O(1) with the list index; with region trees the removal) |
//! | [`VaAllocator::stats`] | O(1) counters, plus a walk of the largest non-empty size class for `largest_free` |
//!
//! A region tree holds only the allocations (and, with recycling, at most
//! [`RECYCLE_LIMIT`] kept ranges) that start in its region, so it
//! is a handful of nodes when allocations are spread over the arena, and at
//! worst (everything in one region) an AVL tree of all `n` allocations:
//! height ≤ 1.44 log2(n + 2). Every operation is therefore O(log n) in the
//! worst case and O(1) apart from that tree; there is no loop over holes.
//! With the list index (small regions) the region search is a walk of at
//! most 34 ranges: every operation is O(1).
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

/// Granule of the arena: every address and size is a multiple of it, and it
/// is the smallest alignment (the article's smallest hardware requirement).
pub const MIN_ALIGN: u64 = 128;
const GRANULE_SHIFT: u32 = 7;

/// How many holes are tried one by one when the constant-time searches find
/// nothing (alignment misses and holes of the request's own size class).
/// Bounds the worst case of `alloc`.
pub const EXACT_PROBES: usize = 8;

/// Regions per group: the directory bitmap has one bit per group, and each
/// group keeps a count of its non-empty regions. 64 (rather than 16) lets a
/// large node array cut the arena into 4x more, smaller regions, so region
/// trees stay a few nodes deep under many small allocations (docs/perf.md,
/// talc's suite); `prev_region` scans at most 2 x 64 slots.
const GROUP: u32 = 64;

/// Most regions the allocation index cuts the arena into (64 × 64 groups of
/// 64 regions). The real number is also at most the node capacity.
pub const MAX_REGIONS: usize = 64 * 64 * GROUP as usize;

/// Regions of at most `1 << LIST_GRANULES_LOG2` granules (4 KiB) index
/// their allocations with a list instead of a tree (see the module
/// documentation, "Data structure"): a lookup walks at most that many
/// ranges, plus `LIST_WALK`'s margin.
const LIST_GRANULES_LOG2: u32 = 5;

/// Most ranges a lookup walks in a list-indexed region: one per granule of
/// the region (every range starting in it is at least a granule), the
/// range after them where a walk stops, and one to spare.
const LIST_WALK: usize = (1 << LIST_GRANULES_LOG2) + 2;

/// Upper bound on the height of any tree the allocator builds (AVL height for
/// `u32::MAX` nodes is below 46), used to bound iterative descents.
const MAX_HEIGHT: usize = 64;

const NIL: u32 = u32::MAX;

const UNUSED: u8 = 0;
const HOLE: u8 = 1;
const ALLOC: u8 = 2;
const RETIRED: u8 = 3;
/// Freed and kept on a recycling stack (see [`VaAllocator::new_recycling`]):
/// free, but not a hole until flushed.
const CACHED: u8 = 4;

/// Recycling (see [`VaAllocator::new_recycling`]) keeps freed ranges of 1 to
/// `RECYCLE_CLASSES` granules (up to 8 KiB), one stack per exact length.
pub const RECYCLE_CLASSES: usize = 64;

/// Most freed ranges recycling keeps at a time, all lengths together (one
/// length may hold them all); a free finding the limit reached coalesces as
/// usual. Bounds a flush to `RECYCLE_LIMIT` ranges. A shared limit rather
/// than a depth per length: a stack of 8 per length left 10 % of the frees
/// and allocations of talc's suite on the general path (docs/perf.md).
pub const RECYCLE_LIMIT: u32 = 512;

/// A recycled range keeps its stack link in the high half of its `len`
/// (its length, at most `RECYCLE_CLASSES` granules, in the low half), so
/// that it keeps every other link: it stays in its region tree.
const LINK_SHIFT: u32 = 32;
/// The length part of a recycled range's `len`.
const CACHED_LEN: u64 = (1 << LINK_SHIFT) - 1;

/// The stack link in a recycled range's `len`.
#[inline(always)]
const fn stack_link(len: u64) -> u32 {
    (len >> LINK_SHIFT) as u32
}

/// log2 of the number of sub-classes per power of two.
const SL_LOG2: u32 = 4;
const SL_COUNT: usize = 1 << SL_LOG2;
const FL_COUNT: usize = 64;
const CLASSES: usize = FL_COUNT * SL_COUNT;
const GROUP_WORDS: usize = 64;

/// One node of bookkeeping storage. Opaque: integrators only create arrays
/// of [`VaNode::EMPTY`] and hand them to [`VaAllocator::new`].
#[derive(Clone, Copy, Debug)]
pub struct VaNode {
    start: u64,
    /// Length in bytes. A recycled range (`CACHED`) keeps its length in
    /// the low half and its recycling stack link in the high half.
    len: u64,
    /// Address order: previous and next range.
    prev: u32,
    next: u32,
    /// Hole: previous / next in its size class. Allocation or recycled
    /// range: left / right child in its region tree (the list index leaves
    /// them unused). Unused: `b` links the free node list.
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
    state: u8,
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
        state: UNUSED,
    };

    /// All zeros: filler for storage that [`VaAllocator::new`] is handed
    /// (a `static` of it is `.bss`, not `.data`). The allocator reads a node
    /// only after resetting it (directory slots in `new`, the others when
    /// taken), so the filler's links are never followed.
    pub const ZEROED: VaNode =
        VaNode { start: 0, len: 0, prev: 0, next: 0, a: 0, b: 0, root: 0, group: 0, bal: 0, state: UNUSED };
}

impl VaNode {
    /// An allocation (live or retired), as opposed to a hole, a recycled
    /// range or an unused node.
    #[inline(always)]
    fn is_allocation(&self) -> bool {
        self.state == ALLOC || self.state == RETIRED
    }

    /// In the allocation index (list or region tree): an allocation or a
    /// recycled range.
    #[inline(always)]
    fn is_listed(&self) -> bool {
        self.is_allocation() || self.state == CACHED
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

/// [`VaPlacement`] under its former name (the encoder has a placement too).
#[deprecated(note = "renamed to `VaPlacement`")]
pub type Placement = VaPlacement;

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
    /// through the high half of each range's `len`, see [`stack_link`]).
    recycle_heads: [u32; RECYCLE_CLASSES],
}

/// Size class of a hole of `g` granules (`g >= 1`).
#[inline]
fn class_of(g: u64) -> usize {
    let t = 63u32.wrapping_sub(g.max(1).leading_zeros());
    if t < SL_LOG2 {
        return g as usize;
    }
    let fl = t.wrapping_sub(SL_LOG2 - 1) as usize;
    let sl = (g.wrapping_shr(t.wrapping_sub(SL_LOG2)) as usize) & (SL_COUNT - 1);
    fl.wrapping_mul(SL_COUNT) | sl
}

/// Smallest class whose every hole has at least `g` granules.
#[inline]
fn class_at_least(g: u64) -> usize {
    let t = 63u32.wrapping_sub(g.max(1).leading_zeros());
    if t < SL_LOG2 {
        return g as usize;
    }
    let step = 1u64.wrapping_shl(t.wrapping_sub(SL_LOG2)).wrapping_sub(1);
    class_of(g.saturating_add(step))
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
            list_index: region_shift <= GRANULE_SHIFT + LIST_GRANULES_LOG2,
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
        a.set(h, base, size, HOLE);
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

    /// Coalesces every range kept by recycling (see
    /// [`VaAllocator::new_recycling`]) back into the holes. At most
    /// [`RECYCLE_LIMIT`] ranges, O(1) each; nothing to do for an allocator
    /// without recycling.
    ///
    /// Out of line and cold: each range goes back as an allocation through
    /// [`VaAllocator::free_handle`], the one release path (the count is
    /// held at the limit meanwhile, so the range is coalesced, not kept
    /// again).
    #[cold]
    #[inline(never)]
    pub fn flush_recycled(&mut self) {
        if self.recycled == 0 {
            return;
        }
        // Ranges still to take: bounds the walks below together.
        let mut left = self.recycled;
        self.recycled = RECYCLE_LIMIT;
        for i in 0..RECYCLE_CLASSES {
            let mut x = self.recycle_heads.get(i).copied().unwrap_or(NIL);
            if let Some(h) = self.recycle_heads.get_mut(i) {
                *h = NIL;
            }
            while left != 0 {
                let Some(v) = self.node_mut(x) else { break };
                left = left.wrapping_sub(1);
                let (next, addr, size) = (stack_link(v.len), v.start, v.len & CACHED_LEN);
                v.len = size;
                v.state = ALLOC;
                self.alloc_count = self.alloc_count.wrapping_add(1);
                self.used = self.used.wrapping_add(size);
                // Still indexed (list or region tree): the release takes it
                // out. Cannot fail: `x` is an allocation at `addr`.
                let _ = self.free_handle(VaHandle { addr, node: x });
                x = next;
            }
        }
        self.recycled = 0;
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

    /// An allocation that failed with ranges kept by recycling: flush them,
    /// then try once more.
    #[cold]
    #[inline(never)]
    fn alloc_flushed(
        &mut self,
        size: u64,
        align: u64,
        placement: VaPlacement,
    ) -> Result<(u32, u64), VaError> {
        self.flush_recycled();
        let (hole, addr) = self.find_fit(size, align, placement)?;
        let n = self.carve(hole, addr, size)?;
        Ok((n, addr))
    }

    /// Recycling: takes the top range of the stack of `size`, if any and if
    /// it meets `align`, as a new allocation. O(1): the range is still in
    /// the index (list or region tree), so nothing is inserted.
    #[inline]
    fn recycle_pop(&mut self, size: u64, align: u64) -> Option<(u32, u64)> {
        let i = (size >> GRANULE_SHIFT).wrapping_sub(1) as usize;
        let x = self.recycle_heads.get(i).copied()?;
        let v = self.node_mut(x)?;
        let addr = v.start;
        if addr & align.wrapping_sub(1) != 0 {
            return None;
        }
        let next = stack_link(v.len);
        v.len = size;
        v.state = ALLOC;
        if let Some(h) = self.recycle_heads.get_mut(i) {
            *h = next;
        }
        self.recycled = self.recycled.wrapping_sub(1);
        self.count_alloc(size);
        Some((x, addr))
    }

    /// Recycling: whether a freed allocation of `size` bytes is kept (it
    /// has a stack and fewer than [`RECYCLE_LIMIT`] ranges are kept). Then
    /// it stays in the index, so `free` and `free_handle` ask first.
    #[inline(always)]
    fn recyclable(&self, size: u64) -> bool {
        // `recycle_push`'s test: an allocation is at least one granule, so
        // this length check is its stack-index bounds check.
        RECYCLE && size >> GRANULE_SHIFT <= RECYCLE_CLASSES as u64 && self.recycled < RECYCLE_LIMIT
    }

    /// Recycling: keeps freed allocation `x` of `size` bytes (still in the
    /// index) on its stack if [`Self::recyclable`]. The stack link goes in
    /// the high half of `len`: a recycled range keeps its tree links
    /// (`a`, `b`, `bal`) and address links.
    #[inline]
    fn recycle_push(&mut self, x: u32, size: u64) -> bool {
        // `recyclable`, with the stack's bounds check as the length check.
        let i = (size >> GRANULE_SHIFT).wrapping_sub(1) as usize;
        let Some(&top) = self.recycle_heads.get(i) else {
            return false;
        };
        if !RECYCLE || self.recycled >= RECYCLE_LIMIT {
            return false;
        }
        let Some(v) = self.node_mut(x) else { return false };
        v.state = CACHED;
        v.len = size | u64::from(top) << LINK_SHIFT;
        if let Some(h) = self.recycle_heads.get_mut(i) {
            *h = x;
        }
        self.recycled = self.recycled.wrapping_add(1);
        true
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
            a.state(h) == HOLE && a.start(h) <= addr && a.start(h).wrapping_add(a.len(h)) >= end
        };
        // An allocation in the way (the range found, or the one after the
        // hole found) refuses the request whatever a flush would coalesce:
        // then the recycled ranges stay as they are.
        let meets = |a: &Self, x: u32| {
            a.node(x)
                .is_some_and(|v| v.is_allocation() && v.start < end && addr < v.start.wrapping_add(v.len))
        };
        let mut h = self.containing(addr);
        let blocked = meets(self, h) || (self.state(h) == HOLE && meets(self, self.next(h)));
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
        Some(VaRange { addr, size: self.len(x), retired: self.state(x) == RETIRED })
    }

    /// Marks the allocation at `addr` as retired: its owner freed it but the
    /// GPU may still use it, so it stays reserved until [`VaAllocator::free`].
    /// Returns its size. O(1) plus one region-tree search.
    pub fn retire(&mut self, addr: u64) -> Result<u64, VaError> {
        let x = self.find_alloc(addr).ok_or(VaError::NotAllocated)?;
        if self.state(x) == RETIRED {
            return Err(VaError::AlreadyRetired);
        }
        if let Some(n) = self.node_mut(x) {
            n.state = RETIRED;
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
        let x = if self.list_index {
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
        if !self.list_index {
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

    /// List index: takes range `x` of region `r` (an allocation or a
    /// recycled range) out of the index (the directory slot moves on if `x`
    /// was the region's first). O(1).
    #[inline(always)]
    fn list_unindex(&mut self, r: u32, x: u32) {
        if self.root(r) == x {
            // The region's next indexed range, if any: holes are coalesced
            // and recycled ranges are indexed too, so it is at most two
            // ranges on.
            let mut y = self.next(x);
            if self.state(y) == HOLE {
                y = self.next(y);
            }
            let first = if y != NIL && self.region_of(self.start(y)) == Some(r) { y } else { NIL };
            self.set_root(r, first);
        }
    }

    /// Frees allocation `x` of region `r` (at `addr`) and returns its size.
    /// Onto its recycling stack if [`Self::recyclable`], still in the index
    /// (the callers leave it there), else into a hole. Out of the index
    /// first: a region tree's callers took it out unless it is recyclable;
    /// without recycling the list index's callers took it out right after
    /// the lookup (which keeps the region's slot in registers); with
    /// recycling it is taken out here. O(1).
    #[inline(always)]
    fn release_alloc(&mut self, r: u32, x: u32, addr: u64) -> u64 {
        let size = self.len(x);
        if !(RECYCLE && self.recycle_push(x, size)) {
            if RECYCLE && self.list_index {
                self.list_unindex(r, x);
            }
            self.make_hole(x, addr, size);
        }
        self.alloc_count = self.alloc_count.wrapping_sub(1);
        self.used = self.used.wrapping_sub(size);
        size
    }

    /// Turns range `x` (`size` bytes at `addr`, out of the index and the
    /// counters) into a hole, coalescing with its neighbours. O(1).
    #[inline(always)]
    fn make_hole(&mut self, x: u32, addr: u64, size: u64) {
        let (p, n) = self.node(x).map_or((NIL, NIL), |v| (v.prev, v.next));
        let left = self.state(p) == HOLE;
        let right = self.state(n) == HOLE;
        match (left, right) {
            (true, true) => {
                // [L][x][R] -> L grows over both.
                let rlen = self.len(n);
                self.list_unlink(n);
                self.addr_unlink(n);
                self.release(n);
                self.hole_count = self.hole_count.wrapping_sub(1);
                self.addr_unlink(x);
                self.release(x);
                let ls = self.start(p);
                let llen = self.len(p).wrapping_add(size).wrapping_add(rlen);
                self.resize_hole(p, ls, llen);
            }
            (true, false) => {
                self.addr_unlink(x);
                self.release(x);
                let ls = self.start(p);
                let llen = self.len(p).wrapping_add(size);
                self.resize_hole(p, ls, llen);
            }
            (false, true) => {
                self.addr_unlink(x);
                self.release(x);
                let rlen = self.len(n).wrapping_add(size);
                self.resize_hole(n, addr, rlen);
            }
            (false, false) => {
                if let Some(v) = self.node_mut(x) {
                    v.state = HOLE;
                }
                self.list_push(x);
                self.hole_count = self.hole_count.wrapping_add(1);
            }
        }
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
            if v.state == HOLE {
                f(v.start, v.len);
            }
        });
    }

    /// Calls `f(range)` for every allocation in address order. O(n); meant
    /// for leak reports and tests.
    pub fn for_each_allocation(&self, mut f: impl FnMut(VaRange)) {
        self.walk(|v| {
            if v.is_allocation() {
                f(VaRange { addr: v.start, size: v.len, retired: v.state == RETIRED });
            }
        });
    }

    /// Checks every internal invariant (ranges tile the arena exactly, links
    /// agree, holes coalesced and on the right size-class lists, bitmaps,
    /// region trees ordered and balanced, counters). O(n); for tests and
    /// debug builds.
    pub fn validate(&self) -> Result<(), &'static str> {
        // 1. The address list tiles the arena.
        let limit = u64::from(self.capacity).wrapping_add(1);
        let (mut holes, mut allocs, mut free, mut used, mut steps) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut cached = 0u64;
        let mut expect = self.base;
        let mut prev = NIL;
        let mut last_was_hole = false;
        let mut x = self.head;
        while x != NIL {
            steps = steps.wrapping_add(1);
            if steps > limit {
                return Err("address list has a cycle");
            }
            let v = self.node(x).ok_or("link out of range")?;
            if v.prev != prev {
                return Err("prev link disagrees with the address list");
            }
            if v.start != expect {
                return Err("ranges leave a gap or overlap");
            }
            // A recycled range's `len` holds its stack link in the high half.
            let len = if v.state == CACHED { v.len & CACHED_LEN } else { v.len };
            if len == 0 || v.start % MIN_ALIGN != 0 || len % MIN_ALIGN != 0 {
                return Err("empty or misaligned range");
            }
            match v.state {
                HOLE => {
                    if last_was_hole {
                        return Err("two adjacent holes were not coalesced");
                    }
                    holes = holes.wrapping_add(1);
                    free = free.wrapping_add(v.len);
                }
                ALLOC | RETIRED => {
                    allocs = allocs.wrapping_add(1);
                    used = used.wrapping_add(v.len);
                    if self.find_alloc(v.start) != Some(x) {
                        return Err("allocation missing from its region tree");
                    }
                }
                CACHED => {
                    cached = cached.wrapping_add(1);
                    free = free.wrapping_add(len);
                }
                _ => return Err("unused node on the address list"),
            }
            last_was_hole = v.state == HOLE;
            expect = v.start.checked_add(len).ok_or("range wraps")?;
            prev = x;
            x = v.next;
        }
        if expect != self.base.wrapping_add(self.size) {
            return Err("ranges do not reach the end of the arena");
        }
        if holes != self.hole_count || allocs != self.alloc_count {
            return Err("node counters disagree with the address list");
        }
        if used != self.used || free.wrapping_add(used) != self.size {
            return Err("holes and allocations do not tile the arena");
        }
        if u64::from(self.nodes_used) != holes.wrapping_add(allocs).wrapping_add(cached) {
            return Err("nodes_used disagrees with the address list");
        }
        // 1b. Recycling stacks: every recycled range on the stack of its
        //     length, at most RECYCLE_LIMIT of them in all.
        if cached != u64::from(self.recycled) || (!RECYCLE && cached != 0) {
            return Err("recycled count disagrees with the address list");
        }
        if self.recycled > RECYCLE_LIMIT {
            return Err("more recycled ranges than RECYCLE_LIMIT");
        }
        let mut stacked = 0u64;
        for (i, &top) in self.recycle_heads.iter().enumerate() {
            let mut y = top;
            while y != NIL {
                if stacked >= cached {
                    return Err("recycling stacks hold more ranges than are recycled");
                }
                let v = self.node(y).ok_or("link out of range on a recycling stack")?;
                if v.state != CACHED || (v.len & CACHED_LEN) >> GRANULE_SHIFT != (i as u64).wrapping_add(1) {
                    return Err("wrong range on a recycling stack");
                }
                stacked = stacked.wrapping_add(1);
                y = stack_link(v.len);
            }
        }
        if stacked != cached {
            return Err("a recycled range is missing from the stacks");
        }
        // 2. Size-class lists and their bitmaps.
        let mut listed = 0u64;
        for c in 0..CLASSES {
            let h = self.heads.get(c).copied().unwrap_or(NIL);
            let (fl, sl) = (c / SL_COUNT, c % SL_COUNT);
            let sl_bit = self.sl_bits.get(fl).is_some_and(|w| w & (1u32 << sl) != 0);
            if sl_bit != (h != NIL) {
                return Err("second-level bitmap disagrees with the lists");
            }
            let fl_bit = self.fl_bits & (1u64 << fl) != 0;
            if fl_bit != self.sl_bits.get(fl).is_some_and(|&w| w != 0) {
                return Err("first-level bitmap disagrees with the lists");
            }
            let mut p = NIL;
            let mut y = h;
            while y != NIL {
                listed = listed.wrapping_add(1);
                if listed > limit {
                    return Err("size-class list has a cycle");
                }
                let v = self.node(y).ok_or("link out of range")?;
                if v.state != HOLE {
                    return Err("non-hole on a size-class list");
                }
                if class_of(v.len >> GRANULE_SHIFT) != c {
                    return Err("hole on the wrong size-class list");
                }
                if v.a != p {
                    return Err("size-class list back link is wrong");
                }
                p = y;
                y = v.b;
            }
        }
        if listed != holes {
            return Err("a hole is missing from the size-class lists");
        }
        // 3. Region trees (or list index), group counts and the group bitmap.
        let mut indexed = 0u64;
        let mut indexed_cached = 0u64;
        let mut in_group = 0u8;
        for r in 0..self.regions {
            let root = self.root(r);
            if root != NIL {
                in_group = in_group.wrapping_add(1);
            }
            if self.list_index {
                // The directory slot names the region's first indexed range:
                // an allocation or a recycled range (recycled ranges stay in
                // the list index until flushed).
                if let Some(v) = self.node(root) {
                    if !v.is_listed() {
                        return Err("directory slot is not an allocation or a recycled range");
                    }
                    if self.region_of(v.start) != Some(r) {
                        return Err("directory slot names another region's allocation");
                    }
                    // First of its region: no indexed range of the region before it.
                    if self.region_walk(r, v.prev, false).any(|(_, w)| w.is_listed()) {
                        return Err("directory slot is not the region's first allocation");
                    }
                    // Every allocation and recycled range of the region is
                    // reached by the walk.
                    for (_, w) in self.region_walk(r, root, true) {
                        if w.is_allocation() {
                            indexed = indexed.wrapping_add(1);
                        } else if w.state == CACHED {
                            indexed_cached = indexed_cached.wrapping_add(1);
                        }
                    }
                }
            } else {
                let mut prev_key = None;
                self.check_tree(root, 0, r, &mut prev_key, &mut indexed, &mut indexed_cached)?;
            }
            let g = r / GROUP;
            if r.wrapping_add(1) % GROUP == 0 || r.wrapping_add(1) == self.regions {
                if self.node(g).map(|x| x.group) != Some(in_group) {
                    return Err("group count disagrees with the region trees");
                }
                let w = self.group_bits.get((g / 64) as usize).copied().unwrap_or(0);
                if (w & (1u64 << (g % 64)) != 0) != (in_group != 0) {
                    return Err("group bitmap disagrees with the region trees");
                }
                if (self.group_top & (1u64 << (g / 64)) != 0) != (w != 0) {
                    return Err("group summary bitmap is wrong");
                }
                in_group = 0;
            }
        }
        if indexed != allocs {
            return Err("region trees hold a different number of allocations");
        }
        if indexed_cached != cached {
            return Err("a recycled range is missing from the index");
        }
        Ok(())
    }

    // ----- placement -------------------------------------------------------

    /// Address at which `[size]` aligned to `align` fits in hole `h`.
    #[inline]
    fn fit(&self, h: u32, size: u64, align: u64, placement: VaPlacement) -> Option<u64> {
        let v = self.node(h)?;
        let end = v.start.wrapping_add(v.len);
        match placement {
            VaPlacement::BottomUp => {
                let a = align_up(v.start, align)?;
                (a.checked_add(size)? <= end).then_some(a)
            }
            VaPlacement::TopDown => {
                let a = end.checked_sub(size)? & !(align.wrapping_sub(1));
                (a >= v.start).then_some(a)
            }
        }
    }

    fn find_fit(&self, size: u64, align: u64, placement: VaPlacement) -> Result<(u32, u64), VaError> {
        let g = size >> GRANULE_SHIFT;
        // 1. Good fit: first hole of the smallest class whose every hole
        //    holds `size`. Always fits at 128 B alignment.
        if let Some(c) = self.find_class(class_at_least(g)) {
            let h = self.head_of(c);
            if let Some(a) = self.fit(h, size, align, placement) {
                return Ok((h, a));
            }
        }
        // 2. Larger alignment: a hole that fits whatever its address.
        if align > MIN_ALIGN {
            let need = size.checked_add(align.wrapping_sub(MIN_ALIGN)).ok_or(VaError::Overflow)?;
            if let Some(c) = self.find_class(class_at_least(need >> GRANULE_SHIFT)) {
                let h = self.head_of(c);
                if let Some(a) = self.fit(h, size, align, placement) {
                    return Ok((h, a));
                }
            }
        }
        // 3. Bounded probing from the request's own class upwards.
        let mut c = self.find_class(class_of(g));
        let mut h = c.map_or(NIL, |c| self.head_of(c));
        for _ in 0..EXACT_PROBES {
            if h == NIL {
                break;
            }
            if let Some(a) = self.fit(h, size, align, placement) {
                return Ok((h, a));
            }
            h = self.node(h).map_or(NIL, |v| v.b);
            if h == NIL {
                c = c.and_then(|x| self.find_class(x.wrapping_add(1)));
                h = c.map_or(NIL, |c| self.head_of(c));
            }
        }
        Err(VaError::NoSpace)
    }

    /// Splits hole `h` into [front hole] [allocation] [back hole].
    fn carve(&mut self, h: u32, addr: u64, size: u64) -> Result<u32, VaError> {
        let hs = self.start(h);
        let he = hs.wrapping_add(self.len(h));
        let end = addr.wrapping_add(size);
        let front = addr > hs;
        let back = end < he;
        let new_nodes = u32::from(front).wrapping_add(u32::from(back));
        if self.available_nodes() < new_nodes {
            return Err(VaError::NodeCapacity);
        }
        let n = match (front, back) {
            (false, false) => {
                self.list_unlink(h);
                self.hole_count = self.hole_count.wrapping_sub(1);
                h
            }
            (false, true) => {
                // The allocation takes the front; h keeps the back, moving
                // its start up (it stays on its list if its class holds).
                let n = self.take_node().unwrap_or(NIL);
                self.addr_insert_before(h, n);
                self.resize_hole(h, end, he.wrapping_sub(end));
                n
            }
            (true, false) => {
                let n = self.take_node().unwrap_or(NIL);
                self.addr_insert_after(h, n);
                self.resize_hole(h, hs, addr.wrapping_sub(hs));
                n
            }
            (true, true) => {
                let n = self.take_node().unwrap_or(NIL);
                let b = self.take_node().unwrap_or(NIL);
                self.addr_insert_after(h, n);
                self.addr_insert_after(n, b);
                self.set(b, end, he.wrapping_sub(end), HOLE);
                self.list_push(b);
                self.hole_count = self.hole_count.wrapping_add(1);
                self.resize_hole(h, hs, addr.wrapping_sub(hs));
                n
            }
        };
        self.set(n, addr, size, ALLOC);
        self.index_alloc(n, addr, size);
        Ok(n)
    }

    /// Enters allocation `n` (`size` bytes at `addr`) into the index and
    /// the counters.
    #[inline(always)]
    fn index_alloc(&mut self, n: u32, addr: u64, size: u64) {
        if let Some(r) = self.region_of(addr) {
            if self.list_index {
                let first = self.root(r);
                if first == NIL || addr < self.start(first) {
                    self.set_root(r, n);
                }
            } else {
                self.tree_insert_region(r, n);
            }
        }
        self.count_alloc(size);
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

    /// The range (hole or allocation) that contains `addr`, which must be
    /// inside the arena. Exact with the recycled ranges flushed (holes
    /// coalesced, and no region of the list index holding only recycled
    /// ranges); without, still a range of the address list or `NIL`.
    fn containing(&self, addr: u64) -> u32 {
        let Some(r) = self.region_of(addr) else {
            return NIL;
        };
        let a = if self.list_index {
            self.list_pred_or_eq(r, addr).or_else(|| {
                let p = self.prev_region(r)?;
                self.list_pred_or_eq(p, u64::MAX)
            })
        } else {
            self.tree_pred_or_eq(self.root(r), addr).or_else(|| {
                let p = self.prev_region(r)?;
                self.tree_max(self.root(p))
            })
        };
        match a {
            // Holes are coalesced, so whatever follows the last allocation
            // at or before `addr` is a hole reaching past `addr`.
            Some(a) if self.start(a).wrapping_add(self.len(a)) <= addr => self.next(a),
            Some(a) => a,
            None => self.head,
        }
    }

    fn largest_hole(&self) -> u64 {
        if self.fl_bits == 0 {
            return 0;
        }
        let fl = 63u32.wrapping_sub(self.fl_bits.leading_zeros()) as usize;
        let w = self.sl_bits.get(fl).copied().unwrap_or(0);
        let sl = 31u32.wrapping_sub(w.leading_zeros()) as usize;
        let mut x = self.head_of(fl.wrapping_mul(SL_COUNT) | sl);
        let mut best = 0;
        let mut steps = 0u64;
        while x != NIL && steps <= self.hole_count {
            steps = steps.wrapping_add(1);
            let Some(v) = self.node(x) else { break };
            best = best.max(v.len);
            x = v.b;
        }
        best
    }

    // ----- segregated size-class lists -------------------------------------

    #[inline]
    fn head_of(&self, c: usize) -> u32 {
        self.heads.get(c).copied().unwrap_or(NIL)
    }

    /// First non-empty class `>= c`.
    #[inline]
    fn find_class(&self, c: usize) -> Option<usize> {
        let fl = c / SL_COUNT;
        let sl = (c % SL_COUNT) as u32;
        let w = self.sl_bits.get(fl).copied().unwrap_or(0) & u32::MAX.wrapping_shl(sl);
        if w != 0 {
            return Some(fl.wrapping_mul(SL_COUNT) | w.trailing_zeros() as usize);
        }
        let above = u64::MAX.checked_shl(fl.wrapping_add(1) as u32).unwrap_or(0);
        let f = self.fl_bits & above;
        if f == 0 {
            return None;
        }
        let fl = f.trailing_zeros() as usize;
        let w = self.sl_bits.get(fl).copied().unwrap_or(0);
        Some(fl.wrapping_mul(SL_COUNT) | w.trailing_zeros() as usize)
    }

    fn list_push(&mut self, h: u32) {
        self.list_push_in(h, class_of(self.len(h) >> GRANULE_SHIFT));
    }

    /// Pushes hole `h` on the list of class `c` (its class).
    #[inline]
    fn list_push_in(&mut self, h: u32, c: usize) {
        let old = self.head_of(c);
        if let Some(v) = self.node_mut(h) {
            v.a = NIL;
            v.b = old;
        }
        if let Some(v) = self.node_mut(old) {
            v.a = h;
        }
        if let Some(slot) = self.heads.get_mut(c) {
            *slot = h;
        }
        let fl = c / SL_COUNT;
        if let Some(w) = self.sl_bits.get_mut(fl) {
            *w |= 1u32.wrapping_shl((c % SL_COUNT) as u32);
        }
        self.fl_bits |= 1u64.wrapping_shl(fl as u32);
    }

    fn list_unlink(&mut self, h: u32) {
        self.list_unlink_in(h, class_of(self.len(h) >> GRANULE_SHIFT));
    }

    /// Takes hole `h` off the list of class `c` (its class).
    #[inline]
    fn list_unlink_in(&mut self, h: u32, c: usize) {
        let (p, n) = self.node(h).map_or((NIL, NIL), |v| (v.a, v.b));
        if let Some(v) = self.node_mut(n) {
            v.a = p;
        }
        if p != NIL {
            if let Some(v) = self.node_mut(p) {
                v.b = n;
            }
            return;
        }
        if let Some(slot) = self.heads.get_mut(c) {
            *slot = n;
        }
        if n == NIL {
            let fl = c / SL_COUNT;
            if let Some(w) = self.sl_bits.get_mut(fl) {
                *w &= !1u32.wrapping_shl((c % SL_COUNT) as u32);
                if *w == 0 {
                    self.fl_bits &= !1u64.wrapping_shl(fl as u32);
                }
            }
        }
    }

    /// Gives hole `h` a new start and length, moving it to another list if
    /// its class changes. The new range must keep its place in address order.
    #[inline]
    fn resize_hole(&mut self, h: u32, start: u64, len: u64) {
        let old = class_of(self.len(h) >> GRANULE_SHIFT);
        let new = class_of(len >> GRANULE_SHIFT);
        if old != new {
            self.list_unlink_in(h, old);
        }
        if let Some(v) = self.node_mut(h) {
            v.start = start;
            v.len = len;
        }
        if old != new {
            self.list_push_in(h, new);
        }
    }

    // ----- address-ordered list --------------------------------------------

    #[inline]
    fn next(&self, n: u32) -> u32 {
        self.node(n).map_or(NIL, |x| x.next)
    }

    /// Links detached node `x` right before `y`.
    fn addr_insert_before(&mut self, y: u32, x: u32) {
        let p = self.node(y).map_or(NIL, |v| v.prev);
        if let Some(v) = self.node_mut(x) {
            v.prev = p;
            v.next = y;
        }
        if let Some(v) = self.node_mut(y) {
            v.prev = x;
        }
        if p == NIL {
            self.head = x;
        } else if let Some(v) = self.node_mut(p) {
            v.next = x;
        }
    }

    /// Links detached node `x` right after `y`.
    fn addr_insert_after(&mut self, y: u32, x: u32) {
        let n = self.next(y);
        if let Some(v) = self.node_mut(x) {
            v.prev = y;
            v.next = n;
        }
        if let Some(v) = self.node_mut(y) {
            v.next = x;
        }
        if let Some(v) = self.node_mut(n) {
            v.prev = x;
        }
    }

    fn addr_unlink(&mut self, x: u32) {
        let (p, n) = self.node(x).map_or((NIL, NIL), |v| (v.prev, v.next));
        if let Some(v) = self.node_mut(n) {
            v.prev = p;
        }
        if p == NIL {
            self.head = n;
        } else if let Some(v) = self.node_mut(p) {
            v.next = n;
        }
    }

    fn walk(&self, mut f: impl FnMut(&VaNode)) {
        let mut x = self.head;
        for _ in 0..=self.capacity {
            let Some(v) = self.node(x) else { return };
            f(v);
            x = v.next;
        }
    }

    // ----- node storage ----------------------------------------------------

    fn available_nodes(&self) -> u32 {
        self.capacity.saturating_sub(self.nodes_used)
    }

    fn take_node(&mut self) -> Option<u32> {
        let n = if self.free_list != NIL {
            let n = self.free_list;
            self.free_list = self.node(n).map_or(NIL, |v| v.b);
            n
        } else if self.bump < self.capacity {
            let n = self.bump;
            self.bump = self.bump.wrapping_add(1);
            n
        } else {
            return None;
        };
        self.nodes_used = self.nodes_used.wrapping_add(1);
        if self.nodes_used > self.nodes_high_water {
            self.nodes_high_water = self.nodes_used;
        }
        Some(n)
    }

    fn release(&mut self, n: u32) {
        let next = self.free_list;
        if let Some(x) = self.node_mut(n) {
            // Keep the directory slot: it belongs to region `n`, not to
            // this node's role.
            *x = VaNode { root: x.root, group: x.group, b: next, ..VaNode::EMPTY };
        }
        self.free_list = n;
        self.nodes_used = self.nodes_used.wrapping_sub(1);
    }

    /// Sets a node's range and state; links are left to the caller.
    #[inline]
    fn set(&mut self, n: u32, start: u64, len: u64, state: u8) {
        if let Some(x) = self.node_mut(n) {
            x.start = start;
            x.len = len;
            x.state = state;
        }
    }

    // ----- field access (bounds-checked; indices are always valid) ---------

    #[inline]
    fn node(&self, n: u32) -> Option<&VaNode> {
        self.nodes.as_ref().get(n as usize)
    }
    #[inline]
    fn node_mut(&mut self, n: u32) -> Option<&mut VaNode> {
        self.nodes.as_mut().get_mut(n as usize)
    }
    #[inline]
    fn start(&self, n: u32) -> u64 {
        self.node(n).map_or(0, |x| x.start)
    }
    #[inline]
    fn len(&self, n: u32) -> u64 {
        self.node(n).map_or(0, |x| x.len)
    }
    #[inline]
    fn left(&self, n: u32) -> u32 {
        self.node(n).map_or(NIL, |x| x.a)
    }
    #[inline]
    fn right(&self, n: u32) -> u32 {
        self.node(n).map_or(NIL, |x| x.b)
    }
    #[inline]
    fn state(&self, n: u32) -> u8 {
        self.node(n).map_or(UNUSED, |x| x.state)
    }

    // ----- region directory ------------------------------------------------

    /// Region of an address inside the arena.
    #[inline]
    fn region_of(&self, addr: u64) -> Option<u32> {
        let off = addr.checked_sub(self.base)?;
        if off >= self.size {
            return None;
        }
        Some(off.checked_shr(self.region_shift).unwrap_or(0) as u32)
    }

    #[inline]
    fn root(&self, r: u32) -> u32 {
        self.node(r).map_or(NIL, |x| x.root)
    }

    #[inline]
    fn set_root(&mut self, r: u32, root: u32) {
        let Some(x) = self.node_mut(r) else { return };
        let was = x.root;
        x.root = root;
        if (was == NIL) == (root == NIL) {
            return;
        }
        let g = r / GROUP;
        let Some(gx) = self.node_mut(g) else { return };
        let (before, after) = if root == NIL {
            (gx.group, gx.group.wrapping_sub(1))
        } else {
            (gx.group, gx.group.wrapping_add(1))
        };
        gx.group = after;
        if (before == 0) == (after == 0) {
            return;
        }
        let w = (g / 64) as usize;
        let bit = 1u64.wrapping_shl(g % 64);
        if let Some(word) = self.group_bits.get_mut(w) {
            if after == 0 {
                *word &= !bit;
            } else {
                *word |= bit;
            }
            let top = 1u64.wrapping_shl(w as u32);
            if *word == 0 {
                self.group_top &= !top;
            } else {
                self.group_top |= top;
            }
        }
    }

    /// Greatest non-empty region below `r`: at most [`GROUP`] directory
    /// slots of `r`'s group, a bitmap search, and [`GROUP`] slots of the
    /// group found.
    fn prev_region(&self, r: u32) -> Option<u32> {
        let g = r / GROUP;
        let first = g.wrapping_mul(GROUP);
        if let Some(q) = (first..r).rev().find(|&q| self.root(q) != NIL) {
            return Some(q);
        }
        let w = g / 64;
        let below = 1u64.wrapping_shl(g % 64).wrapping_sub(1);
        let bits = self.group_bits.get(w as usize).copied().unwrap_or(0) & below;
        let pg = if bits != 0 {
            w.wrapping_mul(64) | 63u32.wrapping_sub(bits.leading_zeros())
        } else {
            let words = self.group_top & 1u64.wrapping_shl(w).wrapping_sub(1);
            if words == 0 {
                return None;
            }
            let w = 63u32.wrapping_sub(words.leading_zeros());
            let bits = self.group_bits.get(w as usize).copied().unwrap_or(0);
            w.wrapping_mul(64) | 63u32.wrapping_sub(bits.leading_zeros())
        };
        let first = pg.wrapping_mul(GROUP);
        let last = first.wrapping_add(GROUP).min(self.regions);
        (first..last).rev().find(|&q| self.root(q) != NIL)
    }

    fn find_alloc(&self, addr: u64) -> Option<u32> {
        let r = self.region_of(addr)?;
        if self.list_index {
            return self.list_find(r, addr);
        }
        let mut x = self.root(r);
        for _ in 0..MAX_HEIGHT {
            let v = self.node(x)?;
            if addr == v.start {
                // Recycled ranges stay in their trees.
                return v.is_allocation().then_some(x);
            }
            x = if addr < v.start { v.a } else { v.b };
        }
        None
    }

    /// List index: the allocation of region `r` (which holds `addr`) that
    /// starts at `addr`. Walks the address list from the region's first
    /// allocation while ranges start below `addr`: they are all in the
    /// region, so at most [`LIST_WALK`] of them.
    #[inline]
    fn list_find(&self, r: u32, addr: u64) -> Option<u32> {
        let mut x = self.root(r);
        for _ in 0..LIST_WALK {
            let v = self.node(x)?;
            if v.start >= addr {
                return (v.start == addr && v.is_allocation()).then_some(x);
            }
            x = v.next;
        }
        None
    }

    /// List index: the last allocation of region `r` starting at or before
    /// `key`. Walks the address list from the region's first allocation, at
    /// most [`LIST_WALK`] ranges (every range is at least a granule).
    fn list_pred_or_eq(&self, r: u32, key: u64) -> Option<u32> {
        self.region_walk(r, self.root(r), true)
            .take_while(|(_, v)| v.start <= key)
            .filter(|(_, v)| v.is_allocation())
            .last()
            .map(|(n, _)| n)
    }

    /// List index: the ranges of region `r` from range `from` on, in address
    /// order (`forward`) or backwards, while they start in the region; at
    /// most [`LIST_WALK`] of them (every range is at least a granule).
    fn region_walk(&self, r: u32, from: u32, forward: bool) -> RegionWalk<'_, S, RECYCLE> {
        RegionWalk { va: self, region: r, at: from, left: LIST_WALK, forward }
    }

    // ----- region trees: AVL keyed by `start` ------------------------------
    //
    // Iterative, with the descent's path on the stack, and a balance factor
    // per node (height of the right subtree minus that of the left) instead
    // of a height: retracing after an insertion or removal reads and writes
    // only nodes of the path (and, for a rotation, the path node's other
    // child), never the heights of the siblings along the path. The path
    // holds at most `MAX_HEIGHT` nodes (an AVL tree of `u32::MAX` nodes is
    // less than 46 high).

    #[inline]
    fn bal(&self, n: u32) -> i8 {
        self.node(n).map_or(0, |x| x.bal)
    }

    #[inline]
    fn set_bal(&mut self, n: u32, b: i8) {
        if let Some(x) = self.node_mut(n) {
            x.bal = b;
        }
    }

    fn set_left(&mut self, n: u32, v: u32) {
        if let Some(x) = self.node_mut(n) {
            x.a = v;
        }
    }

    fn set_right(&mut self, n: u32, v: u32) {
        if let Some(x) = self.node_mut(n) {
            x.b = v;
        }
    }

    /// Child `right` (or left) of `n` becomes `c`; `n == NIL` means the
    /// root, returned as `root` otherwise unchanged.
    #[inline]
    fn link(&mut self, root: u32, n: u32, right: bool, c: u32) -> u32 {
        if n == NIL {
            return c;
        }
        if right {
            self.set_right(n, c);
        } else {
            self.set_left(n, c);
        }
        root
    }

    /// Rebalances `n`, whose balance factor would be `b` (±2), by one
    /// single or double rotation. Returns the subtree's new top and
    /// whether the subtree is now one lower than before the rotation (not
    /// so only when the taller child was balanced, which happens only after
    /// a removal).
    fn rotate(&mut self, n: u32, b: i8) -> (u32, bool) {
        if b > 0 {
            let r = self.right(n);
            let br = self.bal(r);
            if br >= 0 {
                // Single left rotation.
                self.set_right(n, self.left(r));
                self.set_left(r, n);
                let level = br == 0;
                self.set_bal(n, if level { 1 } else { 0 });
                self.set_bal(r, if level { -1 } else { 0 });
                return (r, !level);
            }
            // Right-left double rotation.
            let rl = self.left(r);
            let brl = self.bal(rl);
            self.set_right(n, self.left(rl));
            self.set_left(r, self.right(rl));
            self.set_left(rl, n);
            self.set_right(rl, r);
            self.set_bal(n, if brl > 0 { -1 } else { 0 });
            self.set_bal(r, if brl < 0 { 1 } else { 0 });
            self.set_bal(rl, 0);
            (rl, true)
        } else {
            let l = self.left(n);
            let bl = self.bal(l);
            if bl <= 0 {
                // Single right rotation.
                self.set_left(n, self.right(l));
                self.set_right(l, n);
                let level = bl == 0;
                self.set_bal(n, if level { -1 } else { 0 });
                self.set_bal(l, if level { 1 } else { 0 });
                return (l, !level);
            }
            // Left-right double rotation.
            let lr = self.right(l);
            let blr = self.bal(lr);
            self.set_left(n, self.right(lr));
            self.set_right(l, self.left(lr));
            self.set_right(lr, n);
            self.set_left(lr, l);
            self.set_bal(n, if blr < 0 { 1 } else { 0 });
            self.set_bal(l, if blr > 0 { -1 } else { 0 });
            self.set_bal(lr, 0);
            (lr, true)
        }
    }

    /// Inserts detached allocation `x` into the tree of region `r`. Out of
    /// line: inlined, the tree code's registers and stack frame cost the
    /// list index's paths, which share its callers, ~4 % of their
    /// instructions (`tools/perf-gate.sh`, `va_recycling_*`).
    #[inline(never)]
    fn tree_insert_region(&mut self, r: u32, x: u32) {
        let root = self.tree_insert(self.root(r), x);
        self.set_root(r, root);
    }

    /// Inserts detached node `x` under `root`; returns the new root.
    #[inline(always)]
    fn tree_insert(&mut self, root: u32, x: u32) -> u32 {
        if let Some(v) = self.node_mut(x) {
            v.a = NIL;
            v.b = NIL;
            v.bal = 0;
        }
        if root == NIL {
            return x;
        }
        let key = self.start(x);
        // Path from the root: nodes, and bit i of `dirs` set when the
        // descent went right at path[i].
        let mut path = [NIL; MAX_HEIGHT];
        let mut dirs = 0u64;
        let mut d = 0usize;
        let mut n = root;
        while let (Some(v), Some(slot)) = (self.node(n), path.get_mut(d)) {
            *slot = n;
            let right = key >= v.start;
            let c = if right { v.b } else { v.a };
            dirs |= u64::from(right).wrapping_shl(d as u32);
            d = d.wrapping_add(1);
            if c == NIL {
                self.link(root, n, right, x);
                break;
            }
            n = c;
        }
        // Retrace: the subtree that grew is on side `right` of path[i].
        let mut root = root;
        while let Some(i) = d.checked_sub(1) {
            d = i;
            let n = path.get(i).copied().unwrap_or(NIL);
            let right = dirs.wrapping_shr(i as u32) & 1 != 0;
            let b = self.bal(n).wrapping_add(if right { 1 } else { -1 });
            if b == 0 {
                // The shorter side caught up: height unchanged.
                self.set_bal(n, 0);
                break;
            }
            if b == 1 || b == -1 {
                // Grew by one: go on up.
                self.set_bal(n, b);
                continue;
            }
            // ±2: a rotation restores the height before the insertion.
            let (top, _) = self.rotate(n, b);
            let (p, pr) = match i.checked_sub(1) {
                Some(j) => (path.get(j).copied().unwrap_or(NIL), dirs.wrapping_shr(j as u32) & 1 != 0),
                None => (NIL, false),
            };
            root = self.link(root, p, pr, top);
            break;
        }
        root
    }

    /// The allocation starting at `key` in the tree of region `r`, if there
    /// is one (not a recycled range), detached from the tree unless
    /// recycling will keep it ([`Self::recyclable`]: then it stays).
    /// Out of line, as `tree_insert_region`.
    #[inline(never)]
    fn tree_remove_region(&mut self, r: u32, key: u64) -> Option<u32> {
        let (root, removed) = self.tree_remove(self.root(r), key);
        if removed.is_some() {
            self.set_root(r, root);
        }
        removed
    }

    /// The allocation whose start is `key`: detached (unless recyclable),
    /// with the new root; `None` and an unchanged tree when there is none.
    #[inline(always)]
    fn tree_remove(&mut self, root: u32, key: u64) -> (u32, Option<u32>) {
        let mut path = [NIL; MAX_HEIGHT];
        let mut dirs = 0u64;
        let mut d = 0usize;
        let mut n = root;
        // Search, keeping the path to (not including) the node.
        let x = loop {
            let Some(v) = self.node(n) else { return (root, None) };
            if key == v.start {
                // Only recycling leaves other ranges (recycled ones) in
                // the trees.
                if RECYCLE && !v.is_allocation() {
                    return (root, None);
                }
                if self.recyclable(v.len) {
                    return (root, Some(n));
                }
                break n;
            }
            let Some(slot) = path.get_mut(d) else { return (root, None) };
            *slot = n;
            let right = key > v.start;
            dirs |= u64::from(right).wrapping_shl(d as u32);
            d = d.wrapping_add(1);
            n = if right { v.b } else { v.a };
        };
        let ix = d;
        let (l, r) = (self.left(x), self.right(x));
        let mut root = root;
        // The parent of `x`'s place.
        let (p, pr) = match ix.checked_sub(1) {
            Some(j) => (path.get(j).copied().unwrap_or(NIL), dirs.wrapping_shr(j as u32) & 1 != 0),
            None => (NIL, false),
        };
        if l != NIL && r != NIL {
            // Two children: the successor `m` (leftmost of the right
            // subtree) takes `x`'s place.
            if let Some(slot) = path.get_mut(d) {
                *slot = x;
            }
            dirs |= 1u64.wrapping_shl(d as u32);
            d = d.wrapping_add(1);
            let mut m = r;
            loop {
                let ml = self.left(m);
                if ml == NIL {
                    break;
                }
                let Some(slot) = path.get_mut(d) else { break };
                *slot = m;
                d = d.wrapping_add(1);
                m = ml;
            }
            // Out of its old place (its parent is `x` itself when it is
            // `x`'s right child: then `x.b` takes its right subtree).
            let mp = path.get(d.wrapping_sub(1)).copied().unwrap_or(NIL);
            let mpr = dirs.wrapping_shr(d.wrapping_sub(1) as u32) & 1 != 0;
            let mr = self.right(m);
            self.link(root, mp, mpr, mr);
            // Into `x`'s place, with `x`'s links and balance.
            let (xl, xr, xb) = self.node(x).map_or((NIL, NIL, 0), |v| (v.a, v.b, v.bal));
            if let Some(v) = self.node_mut(m) {
                v.a = xl;
                v.b = xr;
                v.bal = xb;
            }
            if let Some(slot) = path.get_mut(ix) {
                *slot = m;
            }
            root = self.link(root, p, pr, m);
        } else {
            let c = if l != NIL { l } else { r };
            root = self.link(root, p, pr, c);
        }
        // Retrace: the subtree on side `right` of path[i] got one lower.
        while let Some(i) = d.checked_sub(1) {
            d = i;
            let n = path.get(i).copied().unwrap_or(NIL);
            let right = dirs.wrapping_shr(i as u32) & 1 != 0;
            let b = self.bal(n).wrapping_sub(if right { 1 } else { -1 });
            if b == 1 || b == -1 {
                // Was level: height unchanged.
                self.set_bal(n, b);
                break;
            }
            if b == 0 {
                // The taller side shrank: one lower, go on up.
                self.set_bal(n, 0);
                continue;
            }
            let (top, lower) = self.rotate(n, b);
            let (p, pr) = match i.checked_sub(1) {
                Some(j) => (path.get(j).copied().unwrap_or(NIL), dirs.wrapping_shr(j as u32) & 1 != 0),
                None => (NIL, false),
            };
            root = self.link(root, p, pr, top);
            if !lower {
                break;
            }
        }
        (root, Some(x))
    }

    /// Node with the greatest start <= key.
    fn tree_pred_or_eq(&self, root: u32, key: u64) -> Option<u32> {
        let mut x = root;
        let mut best = None;
        for _ in 0..MAX_HEIGHT {
            let Some(v) = self.node(x) else { break };
            if v.start <= key {
                best = Some(x);
                x = v.b;
            } else {
                x = v.a;
            }
        }
        best
    }

    fn tree_max(&self, root: u32) -> Option<u32> {
        let mut x = root;
        let mut best = None;
        for _ in 0..MAX_HEIGHT {
            let Some(v) = self.node(x) else { break };
            best = Some(x);
            x = v.b;
        }
        best
    }

    fn check_tree(
        &self,
        x: u32,
        depth: usize,
        region: u32,
        prev_key: &mut Option<u64>,
        count: &mut u64,
        cached: &mut u64,
    ) -> Result<u8, &'static str> {
        if x == NIL {
            return Ok(0);
        }
        if depth >= MAX_HEIGHT {
            return Err("tree deeper than the AVL bound");
        }
        let v = self.node(x).ok_or("link out of range")?;
        let hl = self.check_tree(v.a, depth.wrapping_add(1), region, prev_key, count, cached)?;
        // Recycled ranges stay in their trees.
        if !v.is_listed() {
            return Err("hole in a region tree");
        }
        if self.region_of(v.start) != Some(region) {
            return Err("allocation in the wrong region tree");
        }
        if prev_key.is_some_and(|p| p >= v.start) {
            return Err("region tree out of order");
        }
        *prev_key = Some(v.start);
        if v.state == CACHED {
            *cached = cached.wrapping_add(1);
        } else {
            *count = count.wrapping_add(1);
        }
        let hr = self.check_tree(v.b, depth.wrapping_add(1), region, prev_key, count, cached)?;
        if hl.abs_diff(hr) > 1 {
            return Err("AVL balance violated");
        }
        if i16::from(v.bal) != i16::from(hr).wrapping_sub(i16::from(hl)) {
            return Err("stored balance factor is wrong");
        }
        Ok(hl.max(hr).wrapping_add(1))
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

#[inline]
fn align_up(v: u64, align: u64) -> Option<u64> {
    let m = align.wrapping_sub(1);
    Some(v.checked_add(m)? & !m)
}

/// Iterator of [`VaAllocator::region_walk`]: `(node, range)` pairs.
struct RegionWalk<'a, S, const RECYCLE: bool> {
    va: &'a VaAllocator<S, RECYCLE>,
    region: u32,
    at: u32,
    left: usize,
    forward: bool,
}

impl<'a, S: AsRef<[VaNode]> + AsMut<[VaNode]>, const RECYCLE: bool> Iterator for RegionWalk<'a, S, RECYCLE> {
    type Item = (u32, &'a VaNode);

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        self.left = self.left.checked_sub(1)?;
        let n = self.at;
        let v = self.va.node(n)?;
        if self.va.region_of(v.start) != Some(self.region) {
            self.left = 0;
            return None;
        }
        self.at = if self.forward { v.next } else { v.prev };
        Some((n, v))
    }
}
