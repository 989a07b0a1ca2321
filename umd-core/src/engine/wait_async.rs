//! Fence waits for async executors (no_std, no alloc): [`DeviceCore::wait_async`]
//! and [`DeviceCore::wait_any_async`] return futures that never block. Each
//! poll checks the fences (and services the device, as the blocking wait
//! does); when they are still pending the future registers its waker in a
//! [`Wakeups`] hub with a deadline from the configuration's adaptive
//! schedule ([`crate::config::Config::wait_interval`]: none while the
//! schedule says spin, so the future yields and is polled again at once;
//! then 1 µs, 10 µs, 100 µs steps).
//!
//! Something outside drives the hub, from an interrupt handler or a timer:
//!
//! - [`Wakeups::on_interrupt`] from the device's interrupt handler (a
//!   fence or fault interrupt): every waiter is woken and checks;
//! - [`Wakeups::on_tick`] from a timer: waiters whose deadline passed are
//!   woken; it returns the next deadline, so a one-shot timer can be
//!   programmed for exactly that (the tick then follows the adaptive
//!   schedule instead of a fixed rate). A hub made with
//!   [`Wakeups::with_timer`] also tells the timer each deadline as it is
//!   registered, so an idle timer is started when a wait begins.
//!
//! Wakes are never lost: the hub's lock is only tried from the interrupt
//! or timer side; when it is held (the interrupted code was registering),
//! the event is remembered and the next registration wakes every waiter.
//! Spurious wakes are possible and harmless (a future re-checks). A hub
//! whose `N` slots are all taken makes the future wake itself (it is then
//! polled again, as in the spin phase), so too small a hub costs CPU,
//! never a hang.
//!
//! Each future holds at most one slot (a [`Registration`]), its own even
//! when futures share a task's waker, and gives it back as soon as it
//! completes or is dropped: a dropped future leaves no waker behind, so
//! nothing wakes its task on its behalf, and its slot is free for the next
//! wait at once. Dropping a future that holds a slot takes the hub's lock
//! (as a registration does), so futures are dropped where they are polled,
//! never in the interrupt handler that drives the hub.
//!
//! The blocking [`DeviceCore::wait`] is unchanged.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};

use crate::sync::atomic::{AtomicBool, Ordering};

use crate::error::{FenceStatus, WaitError};
use crate::sync::Fence;

use super::backend::Backend;
use super::DeviceCore;
use crate::platform::Platform;

#[derive(Debug, Default)]
struct Slot {
    waker: Option<Waker>,
    deadline_ns: u64,
    /// Bumped whenever a waker is stored in the empty slot, so that a
    /// [`Registration`] of an earlier occupant never releases a later one.
    generation: u32,
}

/// A future's hold on one slot of a [`Wakeups`] hub: the slot's index and
/// its generation when the future's waker was stored there. Stale once the
/// hub woke the waiter (the slot is empty) or gave the slot to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    index: usize,
    generation: u32,
}

/// An empty slot (for the hub's `const` constructor).
const EMPTY: Slot = Slot { waker: None, deadline_ns: 0, generation: 0 };

/// The hub's lock: spin's; under `--cfg loom` one whose flag is a loom
/// atomic, so the model checker sees it (`tests/loom.rs`).
#[cfg(not(loom))]
type HubLock = spin::Mutex<()>;
#[cfg(loom)]
type HubLock = crate::sync::atomic::LoomLock;

/// The wake-up hub of async fence waits: up to `N` waiting futures, each
/// with the time it wants to be woken at the latest.
#[derive(Debug)]
pub struct Wakeups<const N: usize> {
    slots: lock_api::Mutex<HubLock, [Slot; N]>,
    missed: AtomicBool,
    notify: Option<fn(u64)>,
}

impl<const N: usize> Default for Wakeups<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Wakeups<N> {
    /// An empty hub (const: it can be a `static`).
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Wakeups { slots: lock_api::Mutex::new([EMPTY; N]), missed: AtomicBool::new(false), notify: None }
    }

    /// An empty hub (loom: its atomics are not `const`, and the lock's
    /// flag is made by a first use before the hub is shared).
    #[cfg(loom)]
    pub fn new() -> Self {
        let w =
            Wakeups { slots: lock_api::Mutex::new([EMPTY; N]), missed: AtomicBool::new(false), notify: None };
        drop(w.slots.try_lock());
        w
    }

    /// A hub that tells a one-shot timer about each registered deadline:
    /// `notify(deadline_ns)` is called (outside the hub's lock) after every
    /// registration, so the timer can fire at the earliest one and call
    /// [`Wakeups::on_tick`] then (which returns the next).
    #[cfg(not(loom))]
    pub const fn with_timer(notify: fn(u64)) -> Self {
        let mut w = Self::new();
        w.notify = Some(notify);
        w
    }

    /// Registers `waker` (or refreshes its entry) to be woken at
    /// `deadline_ns` or at the next interrupt. False when every slot is
    /// taken: the caller must wake itself. An interrupt or tick that found
    /// the hub busy is delivered here: every waiter is woken.
    ///
    /// Entries are found by waker, so nothing can take an entry back before
    /// the hub wakes it: the futures of this module use
    /// [`Wakeups::register_slot`] and [`Wakeups::release`] instead.
    pub fn register(&self, waker: &Waker, deadline_ns: u64) -> bool {
        let stored = {
            let mut slots = self.slots.lock();
            let pos = slots
                .iter()
                .position(|s| s.waker.as_ref().is_some_and(|w| w.will_wake(waker)))
                .or_else(|| slots.iter().position(|s| s.waker.is_none()));
            match pos.and_then(|i| slots.get_mut(i)) {
                Some(s) => {
                    store(s, waker, deadline_ns);
                    true
                }
                None => false,
            }
        };
        self.after_lock();
        if let (true, Some(n)) = (stored, self.notify) {
            n(deadline_ns);
        }
        stored
    }

    /// Registers `waker` to be woken at `deadline_ns` or at the next
    /// interrupt, in the slot `held` names if it still holds this caller's
    /// entry (refreshed: the deadline, and the waker if it changed), else
    /// in a free slot. Returns the slot now held, None when every slot is
    /// taken (the caller must wake itself; `held` was stale then, as the
    /// hub had woken it). An interrupt or tick that found the hub busy is
    /// delivered here: every waiter is woken.
    pub fn register_slot(
        &self,
        waker: &Waker,
        deadline_ns: u64,
        held: Option<Registration>,
    ) -> Option<Registration> {
        let got = {
            let mut slots = self.slots.lock();
            let own = held.filter(|r| {
                slots.get(r.index).is_some_and(|s| s.waker.is_some() && s.generation == r.generation)
            });
            let index = own.map(|r| r.index).or_else(|| slots.iter().position(|s| s.waker.is_none()));
            index.and_then(|index| {
                let s = slots.get_mut(index)?;
                store(s, waker, deadline_ns);
                Some(Registration { index, generation: s.generation })
            })
        };
        self.after_lock();
        if let (Some(_), Some(n)) = (got, self.notify) {
            n(deadline_ns);
        }
        got
    }

    /// Gives back the slot `r` names, if it still holds that registration's
    /// entry (its waker is dropped, never woken); true when it did. An
    /// interrupt or tick that found the hub busy is delivered here, as in
    /// a registration (the hub may have been busy with this very release).
    pub fn release(&self, r: Registration) -> bool {
        let taken = {
            let mut slots = self.slots.lock();
            slots.get_mut(r.index).filter(|s| s.generation == r.generation).and_then(|s| s.waker.take())
        };
        // Dropped outside the lock: a waker's drop may run executor code.
        let released = taken.is_some();
        drop(taken);
        self.after_lock();
        released
    }

    /// Delivers an interrupt or tick that found the hub busy: wakes every
    /// waiter. Called after each use of the lock from the waiting side.
    fn after_lock(&self) {
        // A compare-exchange rather than a swap: the same here, and loom
        // 0.7 models it correctly (its swap lets a concurrent store slip
        // between the read and the write, tokio-rs/loom#254).
        if self.missed.compare_exchange(true, false, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            self.wake_where(|_| true);
        }
    }

    /// Wakes (and unregisters) the waiters for which `due` holds; None when
    /// the lock is busy (the event is remembered), else how many.
    fn wake_where(&self, due: impl Fn(u64) -> bool) -> Option<usize> {
        let mut woken: [Option<Waker>; N] = [const { None }; N];
        let mut n: usize = 0;
        {
            let Some(mut slots) = self.slots.try_lock() else {
                self.missed.store(true, Ordering::Release);
                return None;
            };
            for (s, out) in slots.iter_mut().zip(woken.iter_mut()) {
                if s.waker.is_some() && due(s.deadline_ns) {
                    *out = s.waker.take();
                    n = n.saturating_add(1);
                }
            }
        }
        // Wake outside the lock: a waker may run executor code.
        for w in woken.into_iter().flatten() {
            w.wake();
        }
        Some(n)
    }

    /// The device raised an interrupt: wakes every waiter. Returns how
    /// many (0 if the hub was busy; they are woken at its next use).
    pub fn on_interrupt(&self) -> usize {
        self.wake_where(|_| true).unwrap_or(0)
    }

    /// A timer tick at `now_ns`: wakes the waiters whose deadline passed
    /// and returns the earliest deadline left (for a one-shot timer), or
    /// None when nobody waits. When the hub is busy, wakes nobody now and
    /// returns `now_ns` (tick again soon).
    pub fn on_tick(&self, now_ns: u64) -> Option<u64> {
        if self.wake_where(|d| d <= now_ns).is_none() {
            return Some(now_ns);
        }
        self.next_deadline()
    }

    /// The earliest registered deadline (None if the hub is empty or busy).
    pub fn next_deadline(&self) -> Option<u64> {
        let slots = self.slots.try_lock()?;
        slots.iter().filter(|s| s.waker.is_some()).map(|s| s.deadline_ns).min()
    }

    /// Waiters registered now (diagnostics; 0 if the hub is busy).
    pub fn waiting(&self) -> usize {
        self.slots.try_lock().map_or(0, |s| s.iter().filter(|s| s.waker.is_some()).count())
    }
}

/// Stores `waker` and `deadline_ns` in `s`: a new occupant of an empty
/// slot gets a new generation; the same waiter keeps its own and its waker
/// (replaced only if it would not wake the same task).
fn store(s: &mut Slot, waker: &Waker, deadline_ns: u64) {
    match &s.waker {
        Some(w) if w.will_wake(waker) => {}
        Some(_) => s.waker = Some(waker.clone()),
        None => {
            s.generation = s.generation.wrapping_add(1);
            s.waker = Some(waker.clone());
        }
    }
    s.deadline_ns = deadline_ns;
}

/// Why [`DeviceCore::wait_any_async`] ended without a signalled fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnyWaitError {
    /// No fences were given: nothing could ever complete.
    Empty,
    /// The fence at `index` cannot be waited for, or its work failed.
    Fence {
        /// Its index in the list.
        index: usize,
        /// Why.
        error: WaitError,
    },
    /// The timeout passed with every fence pending.
    Timeout,
}

impl core::fmt::Display for AnyWaitError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AnyWaitError::Empty => write!(f, "no fences to wait for"),
            AnyWaitError::Fence { index, error } => write!(f, "fence #{index}: {error}"),
            AnyWaitError::Timeout => write!(f, "timed out"),
        }
    }
}

impl core::error::Error for AnyWaitError {}

/// The fences a future waits for.
#[derive(Clone, Copy, Debug)]
enum Fences<'a> {
    One(Fence),
    Any(&'a [Fence]),
}

impl Fences<'_> {
    fn get(&self, i: usize) -> Option<Fence> {
        match self {
            Fences::One(f) => (i == 0).then_some(*f),
            Fences::Any(s) => s.get(i).copied(),
        }
    }
}

enum Step {
    Done(usize),
    Error(usize, WaitError),
    Timeout,
}

/// The shared state machine of both futures.
struct Waiter<'a, 'd, B: Backend, const CHUNKS: usize, const N: usize> {
    dev: &'a DeviceCore<'d, B, CHUNKS>,
    hub: &'a Wakeups<N>,
    fences: Fences<'a>,
    timeout_ns: u64,
    start_ns: Option<u64>,
    /// The hub slot this future's waker is in, if any (given back when
    /// the future completes or is dropped).
    held: Option<Registration>,
}

/// A dropped future gives its hub slot back at once: its waker is dropped,
/// never woken, and the slot is free for the next wait.
impl<B: Backend, const CHUNKS: usize, const N: usize> Drop for Waiter<'_, '_, B, CHUNKS, N> {
    fn drop(&mut self) {
        self.unregister();
    }
}

impl<B: Backend, const CHUNKS: usize, const N: usize> Waiter<'_, '_, B, CHUNKS, N> {
    /// Gives back the hub slot, if this future holds one.
    fn unregister(&mut self) {
        if let Some(r) = self.held.take() {
            self.hub.release(r);
        }
    }

    /// The first fence that is done or unwaitable.
    fn check(&self) -> Option<Step> {
        let mut i: usize = 0;
        while let Some(f) = self.fences.get(i) {
            match self.dev.status(f) {
                Ok(FenceStatus::Signalled) => return Some(Step::Done(i)),
                Ok(FenceStatus::Failed(e)) => return Some(Step::Error(i, WaitError::Failed(e))),
                Ok(FenceStatus::Pending) => {}
                Err(e) => return Some(Step::Error(i, e)),
            }
            i = i.saturating_add(1);
        }
        None
    }

    /// One poll; a ready result has given the hub slot back.
    fn poll_step(&mut self, cx: &mut Context<'_>) -> Poll<Step> {
        let step = self.poll_inner(cx);
        if step.is_ready() {
            self.unregister();
        }
        step
    }

    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<Step> {
        let p = self.dev.b.platform();
        let now = p.now_ns();
        let start = *self.start_ns.get_or_insert(now);
        if let Some(s) = self.check() {
            return Poll::Ready(s);
        }
        let elapsed = now.saturating_sub(start);
        if elapsed >= self.timeout_ns {
            return Poll::Ready(Step::Timeout);
        }
        // As the blocking wait: process completions, check for hangs and
        // faults (a hang found here fails the fence), then look again.
        self.dev.service();
        if let Some(s) = self.check() {
            return Poll::Ready(s);
        }
        let interval = self.dev.cfg.wait_interval(elapsed);
        let deadline = now.saturating_add(interval.min(self.timeout_ns.saturating_sub(elapsed)));
        if interval == 0 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.held = self.hub.register_slot(cx.waker(), deadline, self.held);
        if self.held.is_none() {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

/// The future of [`DeviceCore::wait_async`]: `Ok(())` when the fence
/// signalled, the same errors as [`DeviceCore::wait`] otherwise.
#[must_use = "futures do nothing unless awaited"]
pub struct FenceWait<'a, 'd, B: Backend, const CHUNKS: usize, const N: usize>(Waiter<'a, 'd, B, CHUNKS, N>);

impl<'a, 'd, B: Backend, const CHUNKS: usize, const N: usize> FenceWait<'a, 'd, B, CHUNKS, N> {
    /// Gives up after `timeout_ns` (from the first poll) with
    /// [`WaitError::Timeout`]; by default the wait has no timeout (the
    /// device's hang check still fails a stuck fence).
    pub fn timeout_ns(mut self, timeout_ns: u64) -> Self {
        self.0.timeout_ns = timeout_ns;
        self
    }
}

impl<B: Backend, const CHUNKS: usize, const N: usize> Future for FenceWait<'_, '_, B, CHUNKS, N> {
    type Output = Result<(), WaitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().0.poll_step(cx).map(|s| match s {
            Step::Done(_) => Ok(()),
            Step::Error(_, e) => Err(e),
            Step::Timeout => Err(WaitError::Timeout),
        })
    }
}

/// The future of [`DeviceCore::wait_any_async`]: the index of the first fence
/// (in list order) found signalled.
#[must_use = "futures do nothing unless awaited"]
pub struct AnyFenceWait<'a, 'd, B: Backend, const CHUNKS: usize, const N: usize>(
    Waiter<'a, 'd, B, CHUNKS, N>,
);

impl<'a, 'd, B: Backend, const CHUNKS: usize, const N: usize> AnyFenceWait<'a, 'd, B, CHUNKS, N> {
    /// Gives up after `timeout_ns` (from the first poll) with
    /// [`AnyWaitError::Timeout`].
    pub fn timeout_ns(mut self, timeout_ns: u64) -> Self {
        self.0.timeout_ns = timeout_ns;
        self
    }
}

impl<B: Backend, const CHUNKS: usize, const N: usize> Future for AnyFenceWait<'_, '_, B, CHUNKS, N> {
    type Output = Result<usize, AnyWaitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let w = &mut self.get_mut().0;
        if matches!(w.fences, Fences::Any(s) if s.is_empty()) {
            return Poll::Ready(Err(AnyWaitError::Empty));
        }
        w.poll_step(cx).map(|s| match s {
            Step::Done(i) => Ok(i),
            Step::Error(index, error) => Err(AnyWaitError::Fence { index, error }),
            Step::Timeout => Err(AnyWaitError::Timeout),
        })
    }
}

impl<'d, B: Backend, const CHUNKS: usize> DeviceCore<'d, B, CHUNKS> {
    /// A future that completes when `fence` signals (or fails), woken
    /// through `hub` (see the module docs: an interrupt handler or a timer
    /// must drive it). No timeout unless [`FenceWait::timeout_ns`] sets one.
    pub fn wait_async<'a, const N: usize>(
        &'a self,
        hub: &'a Wakeups<N>,
        fence: Fence,
    ) -> FenceWait<'a, 'd, B, CHUNKS, N> {
        FenceWait(Waiter {
            dev: self,
            hub,
            fences: Fences::One(fence),
            timeout_ns: u64::MAX,
            start_ns: None,
            held: None,
        })
    }

    /// A future that completes with the index of the first of `fences`
    /// found signalled; a failed or unwaitable fence ends it with
    /// [`AnyWaitError::Fence`], an empty list with [`AnyWaitError::Empty`].
    pub fn wait_any_async<'a, const N: usize>(
        &'a self,
        hub: &'a Wakeups<N>,
        fences: &'a [Fence],
    ) -> AnyFenceWait<'a, 'd, B, CHUNKS, N> {
        AnyFenceWait(Waiter {
            dev: self,
            hub,
            fences: Fences::Any(fences),
            timeout_ns: u64::MAX,
            start_ns: None,
            held: None,
        })
    }
}
