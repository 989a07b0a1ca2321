//! Deferred doorbells ([`crate::config::Config::batch_window_ns`]):
//! submissions to one queue within the window share one write-pointer
//! update and one doorbell.
//!
//! With a window, every job goes to the backend with
//! [`Job::hold`](super::backend::Job::hold) set: direct mode writes its
//! packets to the ring (cleaned to the device) but neither publishes the
//! write pointer nor rings. The queue's `published` mark is the last
//! sequence number handed to the hardware; the ones after it up to
//! `emitted` are *held*. [`Backend::flush`] hands them over, all at once,
//! when:
//! - the oldest held submission is at least a window old, checked on each
//!   driver call that touches the queue (a submission to it, a status
//!   query or wait on one of its fences; every queue on a service pass,
//!   which each wait, [`DeviceCore::service`] and a wait for an IB chunk
//!   or memory run);
//! - a status query, a wait or a submission's wait concerns a held fence
//!   (at once, before waiting: a wait never waits on work the GPU was not
//!   given);
//! - [`MAX_HELD`] submissions are held, or the ring has no room for the
//!   next (the engine can only free room once it was given the work);
//! - [`DeviceCore::flush`] or [`DeviceCore::flush_all`] is called;
//! - the device shuts down.
//!
//! With no driver call at all nothing moves: a held submission then waits
//! for the next call. A firmware loop that submits and then does other
//! work calls [`DeviceCore::flush`] when it is done submitting (or
//! [`DeviceCore::service`] / a wait now and then). The hang check judges
//! only published work (held work is not stuck: the GPU has not seen it),
//! and a reset cancels held work with the rest of the queue's pending
//! work. `docs/architecture.md`, "Deferred doorbells", has the rule.

use crate::error::SubmitError;
use crate::platform::Platform;
use crate::sync::atomic::Ordering;
use crate::sync::{QueueId, Seqno};

use super::backend::{Backend, Gone};
use super::queue::QueueCore;
use super::{DeviceCore, Raw};

/// Whether deferred doorbells are built in (umd-core's
/// `deferred-doorbells` feature, on by default). Without it a window other
/// than 0 is refused and none of this module's code is linked.
pub const BUILT: bool = cfg!(feature = "deferred-doorbells");

/// Submissions a queue holds back at most: the one that makes this many
/// is handed to the hardware with the others at once.
pub const MAX_HELD: u64 = 32;

/// A queue's state, as the engine keeps it.
type Queue<B> = QueueCore<Raw<B>, <B as Backend>::Queue>;

impl<'d, B: Backend, const CHUNKS: usize> DeviceCore<'d, B, CHUNKS> {
    /// Whether deferred doorbells are on (built in, and a window other
    /// than 0).
    #[inline(always)]
    pub(crate) fn batching(&self) -> bool {
        BUILT && self.cfg.batch_window_ns != 0
    }

    /// Submissions queue `q` holds (emitted, not handed to the hardware);
    /// 0 with the window off.
    pub(crate) fn held_count(&self, q: &Queue<B>) -> u64 {
        if !self.batching() {
            return 0;
        }
        q.emitted().distance(q.published()).max(0) as u64
    }

    /// After the held emit of `seqno` on queue `qi` (whose submit lock the
    /// caller holds, `qs`): notes when the queue began holding, and hands
    /// everything held to the hardware when the window has passed or
    /// [`MAX_HELD`] are held. A device found lost then fails every pending
    /// fence, this one too. Out of line: the submission path with the
    /// window off does not carry it.
    #[inline(never)]
    pub(crate) fn note_held(&self, qi: usize, q: &Queue<B>, qs: &mut B::Queue, seqno: Seqno) {
        let now = self.b.platform().now_ns();
        let held = seqno.distance(q.published());
        let since = if held <= 1 {
            q.held_since.store(now, Ordering::Release);
            now
        } else {
            q.held_since.load(Ordering::Acquire)
        };
        if (held >= MAX_HELD as i64 || now.saturating_sub(since) >= self.cfg.batch_window_ns)
            && self.publish_locked(qi, q, qs).is_err()
        {
            self.device_lost_holding(Some(qi));
        }
    }

    /// Hands queue `qi`'s held submissions to the hardware (the caller
    /// holds its submit lock, `qs`).
    pub(crate) fn publish_locked(&self, qi: usize, q: &Queue<B>, qs: &mut B::Queue) -> Result<(), Gone> {
        if !q.emitted().is_after(q.published()) {
            return Ok(());
        }
        self.b.flush(qs, qi)?;
        q.published.store(q.emitted().0, Ordering::Release);
        Ok(())
    }

    /// A full ring: hands queue `qi`'s held submissions to the hardware
    /// (the caller holds its submit lock, `qs`), since the engine frees
    /// room only once it was given the work that fills the ring. True when
    /// the device was found lost (every pending fence then failed).
    #[cold]
    #[inline(never)]
    pub(crate) fn publish_for_room(&self, qi: usize, q: &Queue<B>, qs: &mut B::Queue) -> bool {
        let lost = self.publish_locked(qi, q, qs).is_err();
        if lost {
            self.device_lost_holding(Some(qi));
        }
        lost
    }

    /// Hands queue `qi`'s held submissions to the hardware, waiting for its
    /// submit lock when `wait` (a submitter holds it for bounded
    /// bookkeeping only), else skipping a busy queue (its holder checks
    /// the window itself). The caller holds no submit lock.
    fn publish(&self, qi: usize, wait: bool) {
        let Some(q) = self.queues.get(qi).filter(|_| qi < self.nq) else { return };
        if self.is_lost() || !q.emitted().is_after(q.published()) {
            return;
        }
        let qs = if wait { Some(q.submit.lock()) } else { q.submit.try_lock() };
        let Some(mut qs) = qs else { return };
        if self.publish_locked(qi, q, &mut qs).is_err() {
            drop(qs);
            self.device_lost();
        }
    }

    /// Whether queue `qi` holds work whose oldest submission is a window
    /// old at `now`.
    fn expired(&self, q: &Queue<B>, now: u64) -> bool {
        q.emitted().is_after(q.published())
            && now.saturating_sub(q.held_since.load(Ordering::Acquire)) >= self.cfg.batch_window_ns
    }

    /// A driver call touches `seqno` of queue `qi` (a status query, a wait,
    /// another queue's submission waiting on it): hands the queue's held
    /// work to the hardware at once when `seqno` is among it, or when its
    /// window has passed. The caller holds no submit lock.
    #[inline]
    pub(crate) fn touch(&self, qi: usize, seqno: Seqno) {
        if !self.batching() {
            return;
        }
        let Some(q) = self.queues.get(qi) else { return };
        if seqno.is_after(q.published()) {
            self.publish(qi, true);
        } else if self.expired(q, self.b.platform().now_ns()) {
            self.publish(qi, false);
        }
    }

    /// Hands every queue's held work whose window has passed to the
    /// hardware (a service pass; queues whose submit lock is busy are
    /// skipped: their holder checks the window).
    pub(crate) fn expire_held(&self) {
        if !self.batching() {
            return;
        }
        let now = self.b.platform().now_ns();
        for qi in 0..self.nq {
            if self.queues.get(qi).is_some_and(|q| self.expired(q, now)) {
                self.publish(qi, false);
            }
        }
    }

    /// Hands `queue`'s held submissions to the hardware now, with one
    /// write-pointer update and one doorbell ([`Config::batch_window_ns`]:
    /// a firmware loop calls this when it is done submitting, since held
    /// work otherwise waits for the next driver call). Nothing to do with
    /// the window off or nothing held. Errors: `UnknownQueue`, and
    /// `DeviceLost` when the device is (or is found) lost.
    ///
    /// [`Config::batch_window_ns`]: crate::config::Config::batch_window_ns
    pub fn flush(&self, queue: QueueId) -> Result<(), SubmitError> {
        let q = self.queue(queue).ok_or(SubmitError::UnknownQueue(queue))?;
        if self.is_lost() {
            return Err(SubmitError::DeviceLost);
        }
        if self.batching() && q.emitted().is_after(q.published()) {
            self.publish(usize::from(queue.0), true);
        }
        if self.is_lost() {
            return Err(SubmitError::DeviceLost);
        }
        Ok(())
    }

    /// [`DeviceCore::flush`] on every queue. Error: `DeviceLost`.
    pub fn flush_all(&self) -> Result<(), SubmitError> {
        for qi in 0..self.nq {
            self.flush(QueueId(qi as u8))?;
        }
        Ok(())
    }

    /// At teardown (`&mut self`: no lock held anywhere): hands every held
    /// submission to the hardware before it stops.
    pub(crate) fn publish_all_mut(&mut self) {
        if !self.batching() || self.is_lost() {
            return;
        }
        for qi in 0..self.nq {
            let Some(q) = self.queues.get_mut(qi) else { continue };
            let (emitted, published) = (q.emitted(), q.published());
            if emitted.is_after(published) {
                if self.b.flush(q.submit.get_mut(), qi).is_err() {
                    return;
                }
                q.published.store(emitted.0, Ordering::Release);
            }
        }
    }
}
