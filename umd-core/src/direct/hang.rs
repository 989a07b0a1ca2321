//! The direct-mode hang and fault check, the capture taken before a reset,
//! and the reset itself.
//!
//! A queue with pending work is checked on every service pass, an idle one
//! after its engine raised a fault interrupt (reset then, with no fence to
//! fail, rather than blamed on the next job):
//! - HALTED or a valid FAULT_STATUS: a fault; reset.
//! - Blocked on purpose: its next submission waits for an unsignalled
//!   fence of another queue. If that fence is emitted, the other queue is
//!   judged on its own; if it is not emitted yet (wait before signal), the
//!   queue is blocked, not hung, unless it has waited longer than
//!   [`crate::config::HangConfig::unsubmitted_wait_ns`].
//! - Otherwise progress-based (etnaviv, msm): no movement of the read
//!   pointer, the current packet address and the fence for one window; or
//!   addresses moving but no fence for several windows (a CHAIN loop).

#[cfg(feature = "hang-capture")]
use crate::debug::Window;
use crate::debug::{HangReason, HangReport};
use crate::engine::backend::{Failure, Gone, QueueView};
use crate::hw::regs::{self, engine as er};
#[cfg(feature = "hang-capture")]
use crate::hw::IbRef;
use crate::platform::DirectIo;
#[cfg(feature = "hang-capture")]
use crate::sync::QueueId;
use crate::sync::{FaultInfo, FenceError, Seqno};

use super::{reset_engine, Direct, DirectQueue};

/// What the hang check remembers about a queue.
#[derive(Clone, Copy, Debug, Default)]
pub struct Watch {
    armed: bool,
    rptr: u32,
    cur_addr: u64,
    completed: Seqno,
    since_ns: u64,
    fence_since_ns: u64,
    /// Since when the queue waits for a fence that is not emitted.
    blocked_since_ns: Option<u64>,
}

impl Watch {
    fn arm(rptr: u32, cur_addr: u64, completed: Seqno, now: u64) -> Watch {
        Watch {
            armed: true,
            rptr,
            cur_addr,
            completed,
            since_ns: now,
            fence_since_ns: now,
            blocked_since_ns: None,
        }
    }
}

fn reg<P: DirectIo>(p: &P, e: u32, r: u32) -> Result<u32, Gone> {
    p.read_reg(regs::engine_reg(e, r)).map_err(|_| Gone)
}

fn reg64<P: DirectIo>(p: &P, e: u32, lo: u32, hi: u32) -> Result<u64, Gone> {
    Ok(u64::from(reg(p, e, lo)?) | (u64::from(reg(p, e, hi)?) << 32))
}

/// The check (see the module docs). `Err` when the device is gone.
pub(crate) fn check<P: DirectIo>(
    d: &Direct<'_, P>,
    qs: &mut DirectQueue,
    v: &QueueView<'_>,
) -> Result<Option<Failure>, Gone> {
    let p = d.p;
    let e = v.queue as u32;
    let idle = !v.emitted.is_after(v.completed);
    if idle && !v.fault_irq {
        qs.watch.armed = false;
        return Ok(None);
    }
    let status = reg(p, e, er::STATUS)?;
    let fault_status = reg(p, e, er::FAULT_STATUS)?;
    let rptr = reg(p, e, er::RING_RPTR)?;
    let cur = reg64(p, e, er::CUR_ADDR_LO, er::CUR_ADDR_HI)?;
    let now = p.now_ns();
    let (reason, error) = if status & er::STATUS_HALTED != 0 || fault_status & er::FAULT_VALID != 0 {
        let addr = reg64(p, e, er::FAULT_ADDR_LO, er::FAULT_ADDR_HI)?;
        match FaultInfo::from_regs(fault_status | er::FAULT_VALID, addr) {
            Some(info) => (HangReason::Fault(info), FenceError::Fault(info)),
            None => (HangReason::DeviceLost, FenceError::DeviceLost),
        }
    } else if idle {
        qs.watch.armed = false;
        return Ok(None);
    } else {
        match judge(&mut qs.watch, v, rptr, cur, now) {
            Some(failed) => failed,
            None => return Ok(None),
        }
    };
    // One capture for every kind of failure.
    let report = capture(d, qs, v, reason)?;
    Ok(Some(Failure { error, report }))
}

/// The progress check of a queue with pending work and no fault: the
/// reason and error when it counts as hung (or never signalled), `None`
/// while it moves or is blocked on purpose. Updates the watch.
fn judge(
    w: &mut Watch,
    v: &QueueView<'_>,
    rptr: u32,
    cur: u64,
    now: u64,
) -> Option<(HangReason, FenceError)> {
    let hang = v.hang;
    match v.blocked_on {
        Some((_, true)) => {
            // Waiting on another queue's emitted fence: that queue is judged.
            *w = Watch::arm(rptr, cur, v.completed, now);
            return None;
        }
        Some((producer, false)) => {
            let since = match w.blocked_since_ns {
                Some(t) => t,
                None => {
                    *w = Watch { blocked_since_ns: Some(now), ..Watch::arm(rptr, cur, v.completed, now) };
                    now
                }
            };
            w.since_ns = now;
            w.fence_since_ns = now;
            return match hang.unsubmitted_wait_ns {
                Some(limit) if now.saturating_sub(since) >= limit => {
                    Some((HangReason::NeverSignalled { producer }, FenceError::NeverSignalled { producer }))
                }
                _ => None,
            };
        }
        None => w.blocked_since_ns = None,
    }
    if !w.armed || v.completed != w.completed {
        *w = Watch::arm(rptr, cur, v.completed, now);
        return None;
    }
    if rptr != w.rptr || cur.abs_diff(w.cur_addr) > hang.min_progress_bytes {
        w.rptr = rptr;
        w.cur_addr = cur;
        w.since_ns = now;
    }
    let still = now.saturating_sub(w.since_ns);
    let no_fence = now.saturating_sub(w.fence_since_ns);
    let windows = hang.max_windows_without_fence.max(1);
    let reason = if still >= hang.window_ns {
        HangReason::NoProgress { window_ns: hang.window_ns }
    } else if no_fence >= hang.window_ns.saturating_mul(u64::from(windows)) {
        HangReason::FenceStalled { windows }
    } else {
        return None;
    };
    Some((reason, FenceError::DeviceHung))
}

/// Resets the engine of queue `q` (CTRL.RESET handshake, its interrupts
/// acknowledged).
pub(crate) fn reset<P: DirectIo>(d: &Direct<'_, P>, qs: &mut DirectQueue, q: usize) -> Result<(), Gone> {
    let p = d.p;
    let e = q as u32;
    if !reset_engine(p, e, true).map_err(|_| Gone)? {
        return Err(Gone);
    }
    p.write_reg(regs::IRQ_STATUS, regs::irq_fence(e) | regs::irq_fault(e)).map_err(|_| Gone)?;
    qs.watch = Watch::default();
    Ok(())
}

/// After the failure was recorded: the ring starts empty (the reset set
/// RPTR and WPTR to 0) and the CPU writes `upto` to the queue's fence slot,
/// as amdgpu's force-completion does, so engines waiting on the cancelled
/// fences move on even if this engine never runs again (an engine still
/// stalled after its reset would never run a FENCE put in its ring). The
/// reset engine does not write the slot until it is given new work.
pub(crate) fn resume<P: DirectIo>(
    d: &Direct<'_, P>,
    qs: &mut DirectQueue,
    q: usize,
    upto: Seqno,
) -> Result<(), Gone> {
    let Some(ring) = qs.ring.as_mut() else { return Err(Gone) };
    ring.reset();
    qs.held = false;
    d.force_slot(q, upto)
}

/// Reads the engine's registers and the command memory around it.
#[cfg(feature = "hang-capture")]
fn capture<P: DirectIo>(
    d: &Direct<'_, P>,
    qs: &DirectQueue,
    v: &QueueView<'_>,
    reason: HangReason,
) -> Result<HangReport, Gone> {
    let p = d.p;
    let e = v.queue as u32;
    let rptr = reg(p, e, er::RING_RPTR)?;
    let status = reg(p, e, er::STATUS)?;
    let cur_addr = reg64(p, e, er::CUR_ADDR_LO, er::CUR_ADDR_HI)?;
    let ib_base = reg64(p, e, er::IB_BASE_LO, er::IB_BASE_HI)?;
    let ib_size = reg(p, e, er::IB_SIZE)?;
    let (ring, wptr) = match qs.ring.as_ref() {
        Some(r) => {
            let start = (rptr as usize).min(r.size());
            let used_dw = r.used(rptr as usize) / 4;
            let avail = r.size().saturating_sub(start) / 4;
            let at = r.gpu_va().wrapping_add(u64::from(rptr));
            let region = r.region();
            (
                Window::capture_with(at, used_dw.min(avail), at, |i| {
                    region.read_u32(start.saturating_add(i.saturating_mul(4)))
                }),
                r.wptr() as u32,
            )
        }
        None => (Window::EMPTY, 0),
    };
    let ib = capture_ib(d, v, IbRef::new(ib_base, ib_size), cur_addr);
    Ok(HangReport {
        queue: QueueId(v.queue as u8),
        reason,
        at_ns: p.now_ns(),
        generation: d.chip.generation,
        rptr,
        wptr,
        status,
        cur_addr,
        ib_base,
        ib_size,
        emitted: v.emitted,
        completed: v.completed,
        fault: reason.fault(),
        ring,
        ib,
        near: None,
    })
}

/// Without the `hang-capture` feature: the reason, the fault and the fence
/// counts only (no register or memory reads), as a kernel-mode report.
#[cfg(not(feature = "hang-capture"))]
fn capture<P: DirectIo>(
    d: &Direct<'_, P>,
    _qs: &DirectQueue,
    v: &QueueView<'_>,
    reason: HangReason,
) -> Result<HangReport, Gone> {
    Ok(v.uncaptured_report(d, reason))
}

/// Copies the IB around `cur` (`ib`: the engine's IB registers) if it
/// lies in the IB pool, starting a few
/// packets before it (found by walking packet lengths from the IB start),
/// with atomic (acquire) reads (other chunks of the pool may be being
/// recorded).
#[cfg(feature = "hang-capture")]
fn capture_ib<P: DirectIo>(d: &Direct<'_, P>, v: &QueueView<'_>, ib: IbRef, cur: u64) -> Window {
    let (ib_base, ib_size) = (ib.va.get(), ib.dwords);
    let (pool_va, region) = (v.ib.0.get(), v.ib.1);
    let pool_len = region.len() as u64;
    let Some(off) = ib_base.checked_sub(pool_va).filter(|o| *o < pool_len) else {
        return Window::EMPTY;
    };
    let start = off as usize;
    let len_dw = (ib_size as usize).min((pool_len as usize).saturating_sub(start) / 4);
    let word = |i: usize| region.read_u32(start.saturating_add(i.saturating_mul(4)));
    let ndw = d.enc.desc().header.ndw;
    let mut recent = [0usize; 4];
    let mut pos = 0usize;
    for _ in 0..len_dw {
        let va = ib_base.wrapping_add((pos as u64).wrapping_mul(4));
        if va >= cur || pos >= len_dw {
            break;
        }
        recent.rotate_left(1);
        if let Some(last) = recent.last_mut() {
            *last = pos;
        }
        let Some(h) = word(pos) else { break };
        pos = pos.saturating_add(ndw.get(h) as usize).saturating_add(1);
    }
    // Start up to three packets before the current one.
    let at_cur = pos < len_dw && ib_base.wrapping_add((pos as u64).wrapping_mul(4)) == cur;
    let from = if at_cur {
        recent.get(1).copied().unwrap_or(0).min(pos)
    } else {
        recent.first().copied().unwrap_or(0)
    };
    let from = from.min(len_dw);
    Window::capture_with(
        ib_base.wrapping_add((from as u64).wrapping_mul(4)),
        len_dw.saturating_sub(from),
        cur,
        |i| word(from.saturating_add(i)),
    )
}
