//! The control registers' side effects (`docs/refgpu.md` sections 2.1 and
//! 2.3): CTRL (enable, reset), IRQ_MASK, MMU_CTRL/ROOT, ENGINE_ROOT and
//! MMU_INVALIDATE, applied by a register write in-process or by the control
//! doorbell over ivshmem. They live on [`Shared`] so that whichever thread
//! sees the control doorbell first (the server's loop or an engine thread
//! about to take its own doorbell, [`crate::bell`]) can apply them.

use std::sync::atomic::Ordering;

use crate::engine::{Shared, ATTN_RESET};
use crate::regs::{self, eng, NUM_ENGINES};

impl Shared {
    /// The control doorbell: applies every control register the host wrote
    /// into the page, under the control lock (one application at a time).
    pub fn apply_control(&self) {
        let _g = self.control_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.apply_control_locked();
    }

    /// [`Shared::apply_control`] with the control lock held.
    pub(crate) fn apply_control_locked(&self) {
        self.irq.apply_mask(self.regs.load(regs::IRQ_MASK));
        self.apply_mmu();
        self.apply_engine_roots();
        if self.regs.load(regs::MMU_INVALIDATE) != 0 {
            self.mmu.invalidate();
            self.regs.store(regs::MMU_INVALIDATE, 0);
        }
        for e in 0..NUM_ENGINES {
            let ctrl = self.ereg(e, eng::CTRL);
            self.apply_enable(e, ctrl);
            if ctrl & regs::CTRL_RESET != 0 {
                self.request_reset(e);
            }
        }
    }

    /// Applies MMU_CTRL and MMU_ROOT.
    pub fn apply_mmu(&self) {
        let r = &self.regs;
        self.mmu.apply(r.load(regs::MMU_CTRL), r.load(regs::MMU_ROOT_LO), r.load(regs::MMU_ROOT_HI));
    }

    /// Applies every engine's ENGINE_ROOT.
    pub fn apply_engine_roots(&self) {
        let r = &self.regs;
        for e in 0..NUM_ENGINES {
            self.mmu.apply_engine_root(e, r.load(regs::engine_root_lo(e)), r.load(regs::engine_root_hi(e)));
        }
    }

    /// Applies CTRL.ENABLE of engine `e`.
    pub fn apply_enable(&self, e: usize, ctrl: u32) {
        let es = &self.engines[e];
        let en = ctrl & regs::CTRL_ENABLE != 0;
        if es.enabled.swap(en, Ordering::SeqCst) != en {
            es.waker.wake();
        }
    }

    /// Starts a reset of engine `e` and returns the request number.
    pub fn request_reset(&self, e: usize) -> u64 {
        let es = &self.engines[e];
        let my = es.reset_req.fetch_add(1, Ordering::SeqCst) + 1;
        es.attn.fetch_or(ATTN_RESET, Ordering::SeqCst);
        es.waker.wake();
        self.mem_waker.wake();
        my
    }
}
