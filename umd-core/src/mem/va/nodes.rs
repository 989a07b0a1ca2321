//! Node storage (the free node list and the never-used rest), the
//! address-ordered list of ranges, and bounds-checked field access.

use super::{State, VaAllocator, VaNode, NIL};

impl<S: AsRef<[VaNode]> + AsMut<[VaNode]>, const RECYCLE: bool> VaAllocator<S, RECYCLE> {
    #[inline]
    pub(super) fn next(&self, n: u32) -> u32 {
        self.node(n).map_or(NIL, |x| x.next)
    }

    /// Links detached node `x` right before `y`.
    pub(super) fn addr_insert_before(&mut self, y: u32, x: u32) {
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
    pub(super) fn addr_insert_after(&mut self, y: u32, x: u32) {
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

    pub(super) fn addr_unlink(&mut self, x: u32) {
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

    pub(super) fn walk(&self, mut f: impl FnMut(&VaNode)) {
        let mut x = self.head;
        for _ in 0..=self.capacity {
            let Some(v) = self.node(x) else { return };
            f(v);
            x = v.next;
        }
    }

    pub(super) fn available_nodes(&self) -> u32 {
        self.capacity.saturating_sub(self.nodes_used)
    }

    pub(super) fn take_node(&mut self) -> Option<u32> {
        let n = if self.free_list != NIL {
            let n = self.free_list;
            self.free_list = self.node(n).map_or(NIL, |v| v.free_next());
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

    pub(super) fn release(&mut self, n: u32) {
        let next = self.free_list;
        if let Some(x) = self.node_mut(n) {
            // Keep the directory slot: it belongs to region `n`, not to
            // this node's role.
            *x = x.released(next);
        }
        self.free_list = n;
        self.nodes_used = self.nodes_used.wrapping_sub(1);
    }

    /// Sets a node's range and state; links are left to the caller.
    #[inline]
    pub(super) fn set(&mut self, n: u32, start: u64, len: u64, state: State) {
        if let Some(x) = self.node_mut(n) {
            x.start = start;
            x.len = len;
            x.state = state;
        }
    }

    // ----- field access (bounds-checked; indices are always valid) ---------

    #[inline]
    pub(super) fn node(&self, n: u32) -> Option<&VaNode> {
        self.nodes.as_ref().get(n as usize)
    }
    #[inline]
    pub(super) fn node_mut(&mut self, n: u32) -> Option<&mut VaNode> {
        self.nodes.as_mut().get_mut(n as usize)
    }
    #[inline]
    pub(super) fn start(&self, n: u32) -> u64 {
        self.node(n).map_or(0, |x| x.start)
    }
    #[inline]
    pub(super) fn len(&self, n: u32) -> u64 {
        self.node(n).map_or(0, |x| x.len)
    }
    #[inline]
    pub(super) fn left(&self, n: u32) -> u32 {
        self.node(n).map_or(NIL, |x| x.left())
    }
    #[inline]
    pub(super) fn right(&self, n: u32) -> u32 {
        self.node(n).map_or(NIL, |x| x.right())
    }
    #[inline]
    pub(super) fn state(&self, n: u32) -> State {
        self.node(n).map_or(State::Unused, |x| x.state)
    }
}
