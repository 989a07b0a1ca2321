//! Fixed-arena GPU virtual-address allocator with O(log n) worst-case operations.
//!
//! GPU virtual addresses are not CPU memory, so the allocator keeps its
//! bookkeeping *out of band*, in a node array the integrator provides (a
//! `[VaNode; N]` in a `static`, a slice of a carve-out, or a `Box` on a host).
//! Nothing is allocated from a heap and the capacity never changes.
//!
//! # Data structure
//!
//! Every range of the arena is a node: either a *hole* (free) or an
//! *allocation*. Holes live in one AVL tree keyed by start address, and each
//! node also stores the largest hole length in its subtree (`max_len`).
//! Allocations live in a second AVL tree keyed by start address. Both trees
//! share the node array and the link fields (a node is in exactly one tree).
//!
//! Because an AVL tree of `n` nodes has height at most `1.44 log2(n + 2)`, and
//! every operation is a constant number of root-to-leaf walks, each operation
//! is O(log n) in the *worst case* (not amortised):
//!
//! | operation | walks |
//! | --- | --- |
//! | [`VaAllocator::alloc`] bottom-up / top-down | one descent guided by `max_len` for alignment ≤ 128 B; for larger alignment at most [`EXACT_PROBES`] successor searches plus one descent |
//! | [`VaAllocator::alloc_fixed`] | one predecessor search, one carve |
//! | [`VaAllocator::free`] | one lookup, one predecessor and one exact search for the neighbour holes, then ≤ 3 removals and 1 insertion |
//! | [`VaAllocator::stats`] | O(1): counters plus the root's `max_len` |
//!
//! A carve removes the hole and inserts at most two holes and one allocation.
//! Tree operations are recursive with depth bounded by the tree height (at
//! most 46 frames for the largest possible node array).
//!
//! # Placement
//!
//! Bottom-up is address-ordered first fit (low fragmentation in the
//! literature); top-down is the mirror image, so two populations (for example
//! slabs of small objects and large buffers) grow from opposite ends and do
//! not interleave. Addresses and sizes are multiples of [`MIN_ALIGN`]; for an
//! alignment above that, the allocator checks the first [`EXACT_PROBES`] holes
//! that are large enough, in placement order, for an exact fit, and otherwise
//! takes the first hole of length `size + align - MIN_ALIGN`, which fits
//! whatever its address. Both steps are bounded, so the worst case stays
//! O(log n); the price is that with very large alignments a request can fail
//! while some far hole would have fitted exactly.

use core::fmt;

pub use crate::mem::stats::{fragmentation_ppm, VaStats};

/// Granule of the arena: every address and size is a multiple of it, and it
/// is the smallest alignment (the article's smallest hardware requirement).
pub const MIN_ALIGN: u64 = 128;

/// How many "large enough" holes are tested for an exact aligned fit before
/// falling back to a guaranteed fit. Bounds the worst case of `alloc`.
pub const EXACT_PROBES: usize = 8;

/// Upper bound on the height of any tree the allocator builds (AVL height for
/// `u32::MAX` nodes is below 46), used to bound iterative descents.
const MAX_HEIGHT: usize = 64;

const NIL: u32 = u32::MAX;

const UNUSED: u8 = 0;
const HOLE: u8 = 1;
const ALLOC: u8 = 2;
const RETIRED: u8 = 3;

/// One node of bookkeeping storage. Opaque: integrators only create arrays
/// of [`VaNode::EMPTY`] and hand them to [`VaAllocator::new`].
#[derive(Clone, Copy, Debug)]
pub struct VaNode {
    start: u64,
    len: u64,
    max_len: u64,
    left: u32,
    right: u32,
    height: u8,
    state: u8,
}

impl VaNode {
    /// An unused node, to initialise storage arrays.
    pub const EMPTY: VaNode =
        VaNode { start: 0, len: 0, max_len: 0, left: NIL, right: NIL, height: 0, state: UNUSED };
}

impl Default for VaNode {
    fn default() -> Self {
        Self::EMPTY
    }
}

/// Why a VA operation was refused. The allocator is unchanged after any error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VaError {
    /// Size 0 was requested.
    ZeroSize,
    /// The alignment is not a power of two, or a fixed address or the arena
    /// is not a multiple of [`MIN_ALIGN`].
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

/// Where a non-fixed allocation goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Placement {
    /// Lowest address that fits (address-ordered first fit).
    #[default]
    BottomUp,
    /// Highest address that fits.
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

#[inline]
const fn max3(a: u64, b: u64, c: u64) -> u64 {
    let m = if a > b { a } else { b };
    if m > c {
        m
    } else {
        c
    }
}

/// The VA allocator over `[base, base + size)` with node storage `S`.
///
/// `S` is anything that derefs to a node slice: `[VaNode; N]` (const
/// generic capacity), `&'static mut [VaNode]` (caller-provided static
/// storage) or, on a host, `Box<[VaNode]>`. An allocation takes at most two
/// nodes, so `2 * live_allocations + 1` nodes always suffice.
pub struct VaAllocator<S> {
    nodes: S,
    base: u64,
    size: u64,
    holes: u32,
    allocs: u32,
    free_list: u32,
    bump: u32,
    capacity: u32,
    nodes_used: u32,
    nodes_high_water: u32,
    hole_count: u64,
    alloc_count: u64,
    used: u64,
    high_water: u64,
}

impl<S: AsRef<[VaNode]> + AsMut<[VaNode]>> VaAllocator<S> {
    /// Manages `[base, base + size)` with the given node storage.
    ///
    /// `base` and `size` must be non-zero multiples of [`MIN_ALIGN`] (base may
    /// be 0), the range must not wrap, and the storage must hold at least one
    /// node. O(1): storage is used lazily.
    pub fn new(nodes: S, base: u64, size: u64) -> Result<Self, VaError> {
        let n = nodes.as_ref().len();
        if n == 0 || size == 0 || base % MIN_ALIGN != 0 || size % MIN_ALIGN != 0 {
            return Err(VaError::BadArena);
        }
        base.checked_add(size).ok_or(VaError::BadArena)?;
        let capacity = u32::try_from(n).unwrap_or(NIL - 1).min(NIL - 1);
        let mut a = VaAllocator {
            nodes,
            base,
            size,
            holes: NIL,
            allocs: NIL,
            free_list: NIL,
            bump: 0,
            capacity,
            nodes_used: 0,
            nodes_high_water: 0,
            hole_count: 0,
            alloc_count: 0,
            used: 0,
            high_water: 0,
        };
        let h = a.take_node().ok_or(VaError::BadArena)?;
        a.set(h, base, size, HOLE);
        a.holes = a.insert(a.holes, h);
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
    /// [`MIN_ALIGN`]. Worst case O(log n).
    pub fn alloc(&mut self, size: u64, align: u64, placement: Placement) -> Result<u64, VaError> {
        let (size, align) = normalize(size, align)?;
        if size > self.size {
            return Err(VaError::NoSpace);
        }
        let (hole, addr) = match placement {
            Placement::BottomUp => self.find_bottom_up(size, align)?,
            Placement::TopDown => self.find_top_down(size, align)?,
        };
        self.carve(hole, addr, size)?;
        Ok(addr)
    }

    /// Reserves exactly `[addr, addr + size)` (libdrm's `va_base_required`).
    /// `addr` must be a multiple of [`MIN_ALIGN`]; the size is rounded up to
    /// it. Worst case O(log n).
    pub fn alloc_fixed(&mut self, addr: u64, size: u64) -> Result<u64, VaError> {
        let (size, _) = normalize(size, MIN_ALIGN)?;
        if addr % MIN_ALIGN != 0 {
            return Err(VaError::BadAlignment);
        }
        let end = addr.checked_add(size).ok_or(VaError::Overflow)?;
        let arena_end = self.base.wrapping_add(self.size);
        if addr < self.base || end > arena_end {
            return Err(VaError::OutOfRange);
        }
        let h = self.pred_or_eq(self.holes, addr).ok_or(VaError::Overlap)?;
        let hend = self.start(h).wrapping_add(self.len(h));
        if hend < end {
            return Err(VaError::Overlap);
        }
        self.carve(h, addr, size)?;
        Ok(addr)
    }

    /// The allocation starting at `addr`, if any. O(log n).
    pub fn lookup(&self, addr: u64) -> Option<VaRange> {
        let x = self.find(self.allocs, addr)?;
        Some(VaRange { addr, size: self.len(x), retired: self.state(x) == RETIRED })
    }

    /// Marks the allocation at `addr` as retired: its owner freed it but the
    /// GPU may still use it, so it stays reserved until [`VaAllocator::free`].
    /// Returns its size. O(log n).
    pub fn retire(&mut self, addr: u64) -> Result<u64, VaError> {
        let x = self.find(self.allocs, addr).ok_or(VaError::NotAllocated)?;
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
    /// address, or a second free, is [`VaError::NotAllocated`]. O(log n).
    pub fn free(&mut self, addr: u64) -> Result<u64, VaError> {
        let (root, removed) = self.remove(self.allocs, addr);
        self.allocs = root;
        let x = removed.ok_or(VaError::NotAllocated)?;
        let size = self.len(x);
        let end = addr.wrapping_add(size);
        self.alloc_count = self.alloc_count.wrapping_sub(1);
        self.used = self.used.wrapping_sub(size);
        // One descent finds both neighbouring holes.
        let (pred, succ) = self.neighbours(self.holes, addr);
        let left = pred.filter(|&l| self.start(l).wrapping_add(self.len(l)) == addr);
        let right = succ.filter(|&r| self.start(r) == end);
        match (left, right) {
            (Some(l), Some(r)) => {
                // [L][x][R] -> L grows over both; R leaves the tree. L's key
                // is unchanged, so only max_len on its path changes.
                let rlen = self.len(r);
                let (root, _) = self.remove(self.holes, end);
                self.holes = root;
                self.release(r);
                self.hole_count = self.hole_count.wrapping_sub(1);
                let ls = self.start(l);
                self.set_len(l, self.len(l).wrapping_add(size).wrapping_add(rlen));
                self.refresh_path(ls);
                self.release(x);
            }
            (Some(l), None) => {
                let ls = self.start(l);
                self.set_len(l, self.len(l).wrapping_add(size));
                self.refresh_path(ls);
                self.release(x);
            }
            (None, Some(r)) => {
                // R's start moves down to addr: still above the previous
                // hole's end, so its place in the order is unchanged.
                let rlen = self.len(r);
                if let Some(n) = self.node_mut(r) {
                    n.start = addr;
                    n.len = rlen.wrapping_add(size);
                }
                self.refresh_path(addr);
                self.release(x);
            }
            (None, None) => {
                self.set(x, addr, size, HOLE);
                self.holes = self.insert(self.holes, x);
                self.hole_count = self.hole_count.wrapping_add(1);
            }
        }
        Ok(size)
    }

    /// Current statistics. O(1).
    pub fn stats(&self) -> VaStats {
        VaStats {
            arena: self.size,
            used: self.used,
            free: self.size.wrapping_sub(self.used),
            largest_free: self.max_len(self.holes),
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
        self.in_order(self.holes, 0, &mut |a: &Self, x| f(a.start(x), a.len(x)));
    }

    /// Calls `f(range)` for every allocation in address order. O(n); meant
    /// for leak reports and tests.
    pub fn for_each_allocation(&self, mut f: impl FnMut(VaRange)) {
        self.in_order(self.allocs, 0, &mut |a: &Self, x| {
            f(VaRange { addr: a.start(x), size: a.len(x), retired: a.state(x) == RETIRED })
        });
    }

    /// Checks every internal invariant (ordering, AVL balance, `max_len`,
    /// ranges tile the arena exactly, holes coalesced, counters). O(n); for
    /// tests and debug builds.
    pub fn validate(&self) -> Result<(), &'static str> {
        let mut v = Validator { prev_end: None, ok: Ok(()), count: 0, bytes: 0 };
        self.check_tree(self.holes, 0, &mut v, true)?;
        let holes = v.count;
        let free = v.bytes;
        let mut w = Validator { prev_end: None, ok: Ok(()), count: 0, bytes: 0 };
        self.check_tree(self.allocs, 0, &mut w, false)?;
        v.ok?;
        w.ok?;
        if holes != self.hole_count || w.count != self.alloc_count {
            return Err("node counters disagree with the trees");
        }
        if w.bytes != self.used || free.wrapping_add(w.bytes) != self.size {
            return Err("holes and allocations do not tile the arena");
        }
        if u64::from(self.nodes_used) != holes.wrapping_add(w.count) {
            return Err("nodes_used disagrees with the trees");
        }
        // Tiling + coalescing: merge the two in-order sequences.
        let mut ends_ok = Ok(());
        let mut expect = self.base;
        let mut last_was_hole = false;
        self.merged_walk(&mut |start, len, hole| {
            if start != expect {
                ends_ok = Err("ranges leave a gap or overlap");
            }
            if hole && last_was_hole {
                ends_ok = Err("two adjacent holes were not coalesced");
            }
            last_was_hole = hole;
            expect = start.wrapping_add(len);
        });
        ends_ok?;
        if expect != self.base.wrapping_add(self.size) {
            return Err("ranges do not reach the end of the arena");
        }
        Ok(())
    }

    // ----- placement -------------------------------------------------------

    fn find_bottom_up(&self, size: u64, align: u64) -> Result<(u32, u64), VaError> {
        if align > MIN_ALIGN {
            let mut after: Option<u64> = None;
            for _ in 0..EXACT_PROBES {
                let c = match after {
                    None => self.first_fit(self.holes, size),
                    Some(k) => self.next_fit(self.holes, k, size),
                };
                let Some(h) = c else {
                    return Err(VaError::NoSpace);
                };
                let s = self.start(h);
                let end = s.wrapping_add(self.len(h));
                if let Some(a) = align_up(s, align) {
                    if a.checked_add(size).is_some_and(|e| e <= end) {
                        return Ok((h, a));
                    }
                }
                after = Some(s);
            }
        }
        let need = size.checked_add(align.wrapping_sub(MIN_ALIGN)).ok_or(VaError::Overflow)?;
        let h = self.first_fit(self.holes, need).ok_or(VaError::NoSpace)?;
        let a = align_up(self.start(h), align).ok_or(VaError::NoSpace)?;
        Ok((h, a))
    }

    fn find_top_down(&self, size: u64, align: u64) -> Result<(u32, u64), VaError> {
        if align > MIN_ALIGN {
            let mut before: Option<u64> = None;
            for _ in 0..EXACT_PROBES {
                let c = match before {
                    None => self.last_fit(self.holes, size),
                    Some(k) => self.prev_fit(self.holes, k, size),
                };
                let Some(h) = c else {
                    return Err(VaError::NoSpace);
                };
                let s = self.start(h);
                let end = s.wrapping_add(self.len(h));
                let a = end.wrapping_sub(size) & !(align.wrapping_sub(1));
                if a >= s {
                    return Ok((h, a));
                }
                before = Some(s);
            }
        }
        let need = size.checked_add(align.wrapping_sub(MIN_ALIGN)).ok_or(VaError::Overflow)?;
        let h = self.last_fit(self.holes, need).ok_or(VaError::NoSpace)?;
        let s = self.start(h);
        let end = s.wrapping_add(self.len(h));
        let a = end.wrapping_sub(size) & !(align.wrapping_sub(1));
        if a < s {
            return Err(VaError::NoSpace);
        }
        Ok((h, a))
    }

    /// Splits hole `h` into [front hole] [allocation] [back hole].
    fn carve(&mut self, h: u32, addr: u64, size: u64) -> Result<(), VaError> {
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
            (true, true) => {
                // h keeps the front part in place; the back part is new.
                self.set_len(h, addr.wrapping_sub(hs));
                self.refresh_path(hs);
                let b = self.take_node().unwrap_or(NIL);
                self.set(b, end, he.wrapping_sub(end), HOLE);
                self.holes = self.insert(self.holes, b);
                self.hole_count = self.hole_count.wrapping_add(1);
                self.take_node().unwrap_or(NIL)
            }
            (true, false) => {
                self.set_len(h, addr.wrapping_sub(hs));
                self.refresh_path(hs);
                self.take_node().unwrap_or(NIL)
            }
            (false, true) => {
                // h's start moves up to `end`, still below the next hole:
                // its place in the order is unchanged.
                if let Some(x) = self.node_mut(h) {
                    x.start = end;
                    x.len = he.wrapping_sub(end);
                }
                self.refresh_path(end);
                self.take_node().unwrap_or(NIL)
            }
            (false, false) => {
                let (root, _) = self.remove(self.holes, hs);
                self.holes = root;
                self.hole_count = self.hole_count.wrapping_sub(1);
                h
            }
        };
        self.set(n, addr, size, ALLOC);
        self.allocs = self.insert(self.allocs, n);
        self.alloc_count = self.alloc_count.wrapping_add(1);
        self.used = self.used.wrapping_add(size);
        if self.used > self.high_water {
            self.high_water = self.used;
        }
        Ok(())
    }

    // ----- node storage ----------------------------------------------------

    fn available_nodes(&self) -> u32 {
        self.capacity.saturating_sub(self.nodes_used)
    }

    fn take_node(&mut self) -> Option<u32> {
        let n = if self.free_list != NIL {
            let n = self.free_list;
            self.free_list = self.left(n);
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
            *x = VaNode::EMPTY;
            x.left = next;
        }
        self.free_list = n;
        self.nodes_used = self.nodes_used.wrapping_sub(1);
    }

    fn set(&mut self, n: u32, start: u64, len: u64, state: u8) {
        if let Some(x) = self.node_mut(n) {
            x.start = start;
            x.len = len;
            x.max_len = len;
            x.left = NIL;
            x.right = NIL;
            x.height = 1;
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
    fn max_len(&self, n: u32) -> u64 {
        self.node(n).map_or(0, |x| x.max_len)
    }
    #[inline]
    fn left(&self, n: u32) -> u32 {
        self.node(n).map_or(NIL, |x| x.left)
    }
    #[inline]
    fn right(&self, n: u32) -> u32 {
        self.node(n).map_or(NIL, |x| x.right)
    }
    #[inline]
    fn height(&self, n: u32) -> u8 {
        self.node(n).map_or(0, |x| x.height)
    }
    #[inline]
    fn state(&self, n: u32) -> u8 {
        self.node(n).map_or(UNUSED, |x| x.state)
    }

    // ----- AVL tree keyed by `start`, augmented with `max_len` -------------

    fn update(&mut self, n: u32) {
        let (l, r) = (self.left(n), self.right(n));
        let h = self.height(l).max(self.height(r)).wrapping_add(1);
        let m = max3(self.len(n), self.max_len(l), self.max_len(r));
        if let Some(x) = self.node_mut(n) {
            x.height = h;
            x.max_len = m;
        }
    }

    fn set_left(&mut self, n: u32, v: u32) {
        if let Some(x) = self.node_mut(n) {
            x.left = v;
        }
    }

    fn set_right(&mut self, n: u32, v: u32) {
        if let Some(x) = self.node_mut(n) {
            x.right = v;
        }
    }

    fn rotate_right(&mut self, n: u32) -> u32 {
        let l = self.left(n);
        self.set_left(n, self.right(l));
        self.set_right(l, n);
        self.update(n);
        self.update(l);
        l
    }

    fn rotate_left(&mut self, n: u32) -> u32 {
        let r = self.right(n);
        self.set_right(n, self.left(r));
        self.set_left(r, n);
        self.update(n);
        self.update(r);
        r
    }

    fn rebalance(&mut self, n: u32) -> u32 {
        self.update(n);
        let (l, r) = (self.left(n), self.right(n));
        let (hl, hr) = (self.height(l), self.height(r));
        if hl > hr.saturating_add(1) {
            if self.height(self.left(l)) < self.height(self.right(l)) {
                let nl = self.rotate_left(l);
                self.set_left(n, nl);
            }
            return self.rotate_right(n);
        }
        if hr > hl.saturating_add(1) {
            if self.height(self.right(r)) < self.height(self.left(r)) {
                let nr = self.rotate_right(r);
                self.set_right(n, nr);
            }
            return self.rotate_left(n);
        }
        n
    }

    /// Inserts detached node `x` under `root`; returns the new root.
    fn insert(&mut self, root: u32, x: u32) -> u32 {
        if root == NIL {
            self.set_left(x, NIL);
            self.set_right(x, NIL);
            self.update(x);
            return x;
        }
        let go_left = self.start(x) < self.start(root);
        let c = if go_left { self.left(root) } else { self.right(root) };
        let before = self.summary(c);
        let nc = self.insert(c, x);
        if go_left {
            self.set_left(root, nc);
        } else {
            self.set_right(root, nc);
        }
        if nc == c && self.summary(nc) == before {
            // Nothing this node depends on changed: skip the update.
            return root;
        }
        self.rebalance(root)
    }

    /// What a parent's height and `max_len` depend on in a child.
    #[inline]
    fn summary(&self, n: u32) -> (u8, u64) {
        self.node(n).map_or((0, 0), |x| (x.height, x.max_len))
    }

    /// Detaches the minimum of `root`; returns (new root, min node).
    fn remove_min(&mut self, root: u32) -> (u32, u32) {
        let l = self.left(root);
        if l == NIL {
            return (self.right(root), root);
        }
        let (nl, m) = self.remove_min(l);
        self.set_left(root, nl);
        (self.rebalance(root), m)
    }

    /// Detaches the node whose start is `key`; returns the new root and the
    /// detached node (which keeps its index and fields), or `None` and an
    /// unchanged tree when no node has that key.
    fn remove(&mut self, root: u32, key: u64) -> (u32, Option<u32>) {
        if root == NIL {
            return (NIL, None);
        }
        let s = self.start(root);
        let found = if key != s {
            let go_left = key < s;
            let c = if go_left { self.left(root) } else { self.right(root) };
            let before = self.summary(c);
            let (nc, f) = self.remove(c, key);
            if go_left {
                self.set_left(root, nc);
            } else {
                self.set_right(root, nc);
            }
            if nc == c && self.summary(nc) == before {
                return (root, f);
            }
            f
        } else {
            let (l, r) = (self.left(root), self.right(root));
            if r == NIL {
                return (l, Some(root));
            }
            let (nr, m) = self.remove_min(r);
            self.set_left(m, l);
            self.set_right(m, nr);
            return (self.rebalance(m), Some(root));
        };
        if found.is_none() {
            return (root, None);
        }
        (self.rebalance(root), found)
    }

    /// Recomputes `max_len` on the path from the root to the hole starting
    /// at `key`, after that hole's length changed in place (heights are
    /// unchanged). Stops early once a value does not change.
    fn refresh_path(&mut self, key: u64) {
        let mut path = [NIL; MAX_HEIGHT];
        let mut depth = 0usize;
        let mut x = self.holes;
        for slot in path.iter_mut() {
            if x == NIL {
                break;
            }
            *slot = x;
            depth = depth.wrapping_add(1);
            let s = self.start(x);
            if key == s {
                break;
            }
            x = if key < s { self.left(x) } else { self.right(x) };
        }
        for i in (0..depth).rev() {
            let n = path.get(i).copied().unwrap_or(NIL);
            let old = self.max_len(n);
            let m = max3(self.len(n), self.max_len(self.left(n)), self.max_len(self.right(n)));
            if m == old && i.wrapping_add(1) < depth {
                break;
            }
            if let Some(node) = self.node_mut(n) {
                node.max_len = m;
            }
        }
    }

    /// Greatest node with start < key and least node with start > key.
    fn neighbours(&self, root: u32, key: u64) -> (Option<u32>, Option<u32>) {
        let mut x = root;
        let (mut pred, mut succ) = (None, None);
        for _ in 0..MAX_HEIGHT {
            if x == NIL {
                break;
            }
            let s = self.start(x);
            if s < key {
                pred = Some(x);
                x = self.right(x);
            } else if s > key {
                succ = Some(x);
                x = self.left(x);
            } else {
                break;
            }
        }
        (pred, succ)
    }

    fn set_len(&mut self, n: u32, len: u64) {
        if let Some(x) = self.node_mut(n) {
            x.len = len;
        }
    }

    fn find(&self, root: u32, key: u64) -> Option<u32> {
        let mut x = root;
        for _ in 0..MAX_HEIGHT {
            if x == NIL {
                return None;
            }
            let s = self.start(x);
            if key == s {
                return Some(x);
            }
            x = if key < s { self.left(x) } else { self.right(x) };
        }
        None
    }

    /// Node with the greatest start <= key.
    fn pred_or_eq(&self, root: u32, key: u64) -> Option<u32> {
        let mut x = root;
        let mut best = None;
        for _ in 0..MAX_HEIGHT {
            if x == NIL {
                break;
            }
            if self.start(x) <= key {
                best = Some(x);
                x = self.right(x);
            } else {
                x = self.left(x);
            }
        }
        best
    }

    /// Leftmost node of `root` with len >= need.
    fn first_fit(&self, root: u32, need: u64) -> Option<u32> {
        let mut x = root;
        if self.max_len(x) < need {
            return None;
        }
        for _ in 0..MAX_HEIGHT {
            if x == NIL {
                return None;
            }
            let l = self.left(x);
            if self.max_len(l) >= need {
                x = l;
            } else if self.len(x) >= need {
                return Some(x);
            } else {
                x = self.right(x);
            }
        }
        None
    }

    /// Rightmost node of `root` with len >= need.
    fn last_fit(&self, root: u32, need: u64) -> Option<u32> {
        let mut x = root;
        if self.max_len(x) < need {
            return None;
        }
        for _ in 0..MAX_HEIGHT {
            if x == NIL {
                return None;
            }
            let r = self.right(x);
            if self.max_len(r) >= need {
                x = r;
            } else if self.len(x) >= need {
                return Some(x);
            } else {
                x = self.left(x);
            }
        }
        None
    }

    /// Leftmost node with start > key and len >= need.
    fn next_fit(&self, root: u32, key: u64, need: u64) -> Option<u32> {
        if root == NIL || self.max_len(root) < need {
            return None;
        }
        if self.start(root) > key {
            if let Some(x) = self.next_fit(self.left(root), key, need) {
                return Some(x);
            }
            if self.len(root) >= need {
                return Some(root);
            }
            self.first_fit(self.right(root), need)
        } else {
            self.next_fit(self.right(root), key, need)
        }
    }

    /// Rightmost node with start < key and len >= need.
    fn prev_fit(&self, root: u32, key: u64, need: u64) -> Option<u32> {
        if root == NIL || self.max_len(root) < need {
            return None;
        }
        if self.start(root) < key {
            if let Some(x) = self.prev_fit(self.right(root), key, need) {
                return Some(x);
            }
            if self.len(root) >= need {
                return Some(root);
            }
            self.last_fit(self.left(root), need)
        } else {
            self.prev_fit(self.left(root), key, need)
        }
    }

    // ----- walks for dumps and validation ----------------------------------

    fn in_order(&self, x: u32, depth: usize, f: &mut dyn FnMut(&Self, u32)) {
        if x == NIL || depth > MAX_HEIGHT {
            return;
        }
        self.in_order(self.left(x), depth.wrapping_add(1), f);
        f(self, x);
        self.in_order(self.right(x), depth.wrapping_add(1), f);
    }

    fn merged_walk(&self, f: &mut dyn FnMut(u64, u64, bool)) {
        // Follow the tiling from the arena base, looking up the range that
        // starts at each address: O(n log n), for validation only.
        let mut addr = self.base;
        let end = self.base.wrapping_add(self.size);
        let limit = u64::from(self.nodes_used).wrapping_add(1);
        let mut steps = 0u64;
        while addr < end && steps < limit {
            steps = steps.wrapping_add(1);
            if let Some(h) = self.find(self.holes, addr) {
                let l = self.len(h);
                f(addr, l, true);
                addr = addr.wrapping_add(l);
            } else if let Some(a) = self.find(self.allocs, addr) {
                let l = self.len(a);
                f(addr, l, false);
                addr = addr.wrapping_add(l);
            } else {
                // Nothing starts here: report a gap and stop.
                f(addr.wrapping_add(1), 0, false);
                return;
            }
        }
    }

    fn check_tree(
        &self,
        x: u32,
        depth: usize,
        v: &mut Validator,
        holes: bool,
    ) -> Result<(u8, u64), &'static str> {
        if x == NIL {
            return Ok((0, 0));
        }
        if depth > MAX_HEIGHT {
            return Err("tree deeper than the AVL bound");
        }
        let (hl, ml) = self.check_tree(self.left(x), depth.wrapping_add(1), v, holes)?;
        let s = self.start(x);
        let l = self.len(x);
        let st = self.state(x);
        if holes && st != HOLE || !holes && st != ALLOC && st != RETIRED {
            return Err("node in the wrong tree");
        }
        if l == 0 || s % MIN_ALIGN != 0 || l % MIN_ALIGN != 0 {
            return Err("empty or misaligned range");
        }
        if let Some(pe) = v.prev_end {
            if s < pe {
                v.ok = Err("ranges out of order or overlapping");
            }
        }
        v.prev_end = Some(s.wrapping_add(l));
        v.count = v.count.wrapping_add(1);
        v.bytes = v.bytes.wrapping_add(l);
        let (hr, mr) = self.check_tree(self.right(x), depth.wrapping_add(1), v, holes)?;
        if hl.abs_diff(hr) > 1 {
            return Err("AVL balance violated");
        }
        let h = hl.max(hr).wrapping_add(1);
        if h != self.height(x) {
            return Err("stored height is wrong");
        }
        let m = max3(l, ml, mr);
        if m != self.max_len(x) {
            return Err("stored max_len is wrong");
        }
        Ok((h, m))
    }
}

struct Validator {
    prev_end: Option<u64>,
    ok: Result<(), &'static str>,
    count: u64,
    bytes: u64,
}

/// Validates and rounds a (size, align) request.
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
