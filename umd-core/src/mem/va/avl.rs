//! Region trees: one AVL tree per region of the allocations (and recycled
//! ranges) that start in it, keyed by start address (module documentation,
//! "Data structure").

use super::{VaAllocator, VaNode, NIL};

/// Upper bound on the height of any tree the allocator builds (AVL height for
/// `u32::MAX` nodes is below 46), used to bound iterative descents.
pub(super) const MAX_HEIGHT: usize = 64;

impl<S: AsRef<[VaNode]> + AsMut<[VaNode]>, const RECYCLE: bool> VaAllocator<S, RECYCLE> {
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
    pub(super) fn bal(&self, n: u32) -> i8 {
        self.node(n).map_or(0, |x| x.bal)
    }

    #[inline]
    pub(super) fn set_bal(&mut self, n: u32, b: i8) {
        if let Some(x) = self.node_mut(n) {
            x.bal = b;
        }
    }

    pub(super) fn set_left(&mut self, n: u32, v: u32) {
        if let Some(x) = self.node_mut(n) {
            x.set_left(v);
        }
    }

    pub(super) fn set_right(&mut self, n: u32, v: u32) {
        if let Some(x) = self.node_mut(n) {
            x.set_right(v);
        }
    }

    /// Child `right` (or left) of `n` becomes `c`; `n == NIL` means the
    /// root, returned as `root` otherwise unchanged.
    #[inline]
    pub(super) fn link(&mut self, root: u32, n: u32, right: bool, c: u32) -> u32 {
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
    pub(super) fn rotate(&mut self, n: u32, b: i8) -> (u32, bool) {
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
    pub(super) fn tree_insert_region(&mut self, r: u32, x: u32) {
        let root = self.tree_insert(self.root(r), x);
        self.set_root(r, root);
    }

    /// Inserts detached node `x` under `root`; returns the new root.
    #[inline(always)]
    pub(super) fn tree_insert(&mut self, root: u32, x: u32) -> u32 {
        if let Some(v) = self.node_mut(x) {
            v.set_left(NIL);
            v.set_right(NIL);
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
            let c = if right { v.right() } else { v.left() };
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
    pub(super) fn tree_remove_region(&mut self, r: u32, key: u64) -> Option<u32> {
        let (root, removed) = self.tree_remove(self.root(r), key);
        if removed.is_some() {
            self.set_root(r, root);
        }
        removed
    }

    /// The allocation whose start is `key`: detached (unless recyclable),
    /// with the new root; `None` and an unchanged tree when there is none.
    #[inline(always)]
    pub(super) fn tree_remove(&mut self, root: u32, key: u64) -> (u32, Option<u32>) {
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
            n = if right { v.right() } else { v.left() };
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
            let (xl, xr, xb) = self.node(x).map_or((NIL, NIL, 0), |v| (v.left(), v.right(), v.bal));
            if let Some(v) = self.node_mut(m) {
                v.set_left(xl);
                v.set_right(xr);
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
    pub(super) fn tree_pred_or_eq(&self, root: u32, key: u64) -> Option<u32> {
        let mut x = root;
        let mut best = None;
        for _ in 0..MAX_HEIGHT {
            let Some(v) = self.node(x) else { break };
            if v.start <= key {
                best = Some(x);
                x = v.right();
            } else {
                x = v.left();
            }
        }
        best
    }

    pub(super) fn tree_max(&self, root: u32) -> Option<u32> {
        let mut x = root;
        let mut best = None;
        for _ in 0..MAX_HEIGHT {
            let Some(v) = self.node(x) else { break };
            best = Some(x);
            x = v.right();
        }
        best
    }
}
