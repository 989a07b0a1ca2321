//! Model-checked concurrency (run with `RUSTFLAGS="--cfg loom" cargo test
//! -p umd-core --test loom --release`): the per-queue timeline is advanced
//! by an interrupt handler and a polling waiter at the same time, and read
//! by submitters; loom explores every interleaving of those atomics. One
//! model races fault-interrupt acknowledgements against the hang checks
//! that consume them (`DeviceCore::fault_irqs`); the last one races IB-pool
//! commits through the queues' mailboxes against the pool's other users, and
//! one the async waits' wake-up hub against its interrupt side. Two race
//! submissions publishing their sequence numbers against a device loss
//! failing the queues' pending ranges.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use umd_core::sync::{Seqno, Timeline};

/// Two observers racing with different readings leave the newest value.
#[test]
fn concurrent_advances_keep_the_newest() {
    loom::model(|| {
        let tl = Arc::new(Timeline::new(5));
        let a = {
            let tl = tl.clone();
            thread::spawn(move || tl.advance(Seqno(7)))
        };
        let b = {
            let tl = tl.clone();
            thread::spawn(move || tl.advance(Seqno(6)))
        };
        let ra = a.join().unwrap();
        let rb = b.join().unwrap();
        assert_eq!(tl.completed(), Seqno(7));
        // Each caller sees a value at least as new as its own reading.
        assert!(Seqno(7).is_signalled_by(ra));
        assert!(Seqno(6).is_signalled_by(rb));
    });
}

/// The timeline never moves backwards, even across the 2^64 wrap, while a
/// reader watches it.
#[test]
fn readers_never_see_it_go_back_across_the_wrap() {
    loom::model(|| {
        let tl = Arc::new(Timeline::new(u64::MAX - 1));
        let w1 = {
            let tl = tl.clone();
            thread::spawn(move || {
                tl.advance(Seqno(u64::MAX));
                tl.advance(Seqno(1));
            })
        };
        let w2 = {
            let tl = tl.clone();
            thread::spawn(move || {
                tl.advance(Seqno(0));
            })
        };
        let first = tl.completed();
        let second = tl.completed();
        assert!(!first.is_after(second), "{first} then {second}");
        w1.join().unwrap();
        w2.join().unwrap();
        assert_eq!(tl.completed(), Seqno(1));
    });
}

/// Release/acquire: data written before a fence value is published is
/// visible to a reader that observes the value (what a waiter relies on
/// when an interrupt handler advances the timeline after the GPU wrote
/// results). The payload is a plain cell: loom reports any access to it
/// that the timeline's orderings do not make happen-before. (Loom's model
/// of `Relaxed` is coarser than C++'s, so weakening the timeline's orderings
/// is not always caught here; the monotonicity tests above do catch a
/// non-atomic read-modify-write.)
#[test]
fn data_before_the_fence_is_visible_after_it() {
    loom::model(|| {
        use loom::cell::UnsafeCell;
        struct Shared(UnsafeCell<u32>);
        // SAFETY: access is ordered by the timeline, which is what the
        // test checks (loom aborts on an unordered access).
        unsafe impl Sync for Shared {}
        let data = Arc::new(Shared(UnsafeCell::new(0)));
        let tl = Arc::new(Timeline::new(0));
        let irq = {
            let (data, tl) = (data.clone(), tl.clone());
            thread::spawn(move || {
                // SAFETY: the only writer, before publishing.
                data.0.with_mut(|p| unsafe { *p = 42 });
                tl.advance(Seqno(1));
            })
        };
        if Seqno(1).is_signalled_by(tl.completed()) {
            // SAFETY: the writer published before advancing the timeline.
            let v = data.0.with(|p| unsafe { *p });
            assert_eq!(v, 42);
        }
        irq.join().unwrap();
    });
}

/// Checks the harness: an unordered access must be reported.
#[test]
#[should_panic]
fn sanity_unordered_access_is_caught() {
    loom::model(|| {
        use loom::cell::UnsafeCell;
        struct Shared(UnsafeCell<u32>);
        // SAFETY: deliberately unsound, to check loom catches it.
        unsafe impl Sync for Shared {}
        let data = Arc::new(Shared(UnsafeCell::new(0)));
        let w = {
            let data = data.clone();
            // SAFETY: deliberately racy.
            thread::spawn(move || data.0.with_mut(|p| unsafe { *p = 1 }))
        };
        // SAFETY: deliberately racy.
        let _ = data.0.with(|p| unsafe { *p });
        w.join().unwrap();
    });
}

/// A reset racing with a status query: the cancelled fence is never seen
/// signalled without its failure (the reset records the failure before it
/// forces the timeline; the query reads the timeline before the history).
#[test]
fn a_reset_never_shows_a_cancelled_fence_as_signalled() {
    use umd_core::loom_probe::{ProbeQueue, Status};
    loom::model(|| {
        let q = Arc::new(ProbeQueue::new());
        let r = {
            let q = q.clone();
            thread::spawn(move || q.reset(0, 2))
        };
        let s1 = q.status(1);
        let s2 = q.status(2);
        r.join().unwrap();
        assert_ne!(s1, Status::Signalled, "fence 1 was cancelled");
        assert_ne!(s2, Status::Signalled, "fence 2 was cancelled");
        assert_eq!(q.status(1), Status::Failed);
    });
}

/// Completions observed by two paths at once are processed exactly once:
/// the claimed ranges tile what completed, without overlap.
#[test]
fn completions_are_claimed_exactly_once() {
    use umd_core::loom_probe::ProbeQueue;
    loom::model(|| {
        let q = Arc::new(ProbeQueue::new());
        let ts: Vec<_> = (0..2)
            .map(|i| {
                let q = q.clone();
                thread::spawn(move || {
                    q.complete(1 + i);
                    q.claim()
                })
            })
            .collect();
        let mut claimed: Vec<(u64, u64)> = ts.into_iter().filter_map(|t| t.join().unwrap()).collect();
        if let Some(last) = q.claim() {
            claimed.push(last);
        }
        claimed.sort();
        let mut at = 0;
        for (a, b) in claimed {
            assert_eq!(a, at, "ranges tile without gap or overlap");
            at = b;
        }
        assert_eq!(at, 2, "everything completed was claimed");
    });
}

/// Two submitters on one queue get distinct, consecutive sequence numbers,
/// and a reader never sees `emitted` go back.
#[test]
fn submitters_get_distinct_seqnos() {
    use umd_core::loom_probe::ProbeQueue;
    loom::model(|| {
        let q = Arc::new(ProbeQueue::new());
        let ts: Vec<_> = (0..2)
            .map(|_| {
                let q = q.clone();
                thread::spawn(move || q.submit())
            })
            .collect();
        let a = q.emitted();
        let b = q.emitted();
        assert!(b >= a);
        let mut got: Vec<u64> = ts.into_iter().map(|t| t.join().unwrap()).collect();
        got.sort();
        assert_eq!(got, vec![1, 2]);
        assert_eq!(q.emitted(), 2);
    });
}

/// Fault interrupts racing the service loop (`DeviceCore::service`: read
/// IRQ_STATUS and write the bits read back to clear them, note the faulting
/// queues in `DeviceCore::fault_irqs`, then check every queue whose submit lock
/// is free, taking its bit). Both engines fault while idle, the case the
/// record exists for: with no work pending only a noted interrupt makes the
/// check look at the engine. Two threads service the device while the
/// faults are raised; after one more service pass every fault was handled
/// (the engine reset) exactly once: none lost (a bit noted while another
/// queue's bit is taken survives the take), none handled twice.
#[test]
fn fault_interrupts_are_neither_lost_nor_handled_twice() {
    use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
    use loom::sync::Mutex;
    use umd_core::loom_probe::ProbeFaultIrqs;

    struct Dev {
        /// The device's IRQ_STATUS: bit `q` when engine `q` faulted.
        irq_status: AtomicU32,
        /// Engine `q` is halted on a fault (its STATUS).
        halted: [AtomicBool; 2],
        /// Each queue's submit lock.
        submit: [Mutex<()>; 2],
        faults: ProbeFaultIrqs,
        resets: [AtomicUsize; 2],
    }

    impl Dev {
        fn service(&self) {
            let bits = self.irq_status.load(Ordering::Acquire);
            self.irq_status.fetch_and(!bits, Ordering::AcqRel);
            self.faults.note(bits);
            for q in 0..2 {
                let Ok(_held) = self.submit[q].try_lock() else { continue };
                // The queue is idle: only a noted interrupt makes the check
                // read the engine's status; a halted engine is reset.
                if self.faults.take(q) && self.halted[q].load(Ordering::Acquire) {
                    self.halted[q].store(false, Ordering::Release);
                    self.resets[q].fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    // Three threads of about fifteen steps each: every interleaving with up
    // to three preemptions (a second; without the bound it takes minutes,
    // and passed too). Replacing either read-modify-write of the record by
    // a load and a store fails it.
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(|| {
        let dev = Arc::new(Dev {
            irq_status: AtomicU32::new(0),
            halted: [AtomicBool::new(false), AtomicBool::new(false)],
            submit: [Mutex::new(()), Mutex::new(())],
            faults: ProbeFaultIrqs::new(),
            resets: [AtomicUsize::new(0), AtomicUsize::new(0)],
        });
        let gpu = {
            let dev = dev.clone();
            thread::spawn(move || {
                // An engine halts before it raises its fault interrupt.
                for q in 0..2 {
                    dev.halted[q].store(true, Ordering::Release);
                    dev.irq_status.fetch_or(1 << q, Ordering::Release);
                }
            })
        };
        let other = {
            let dev = dev.clone();
            thread::spawn(move || dev.service())
        };
        dev.service();
        gpu.join().unwrap();
        other.join().unwrap();
        dev.service();
        for q in 0..2 {
            assert_eq!(dev.resets[q].load(Ordering::Relaxed), 1, "engine {q}'s fault handled once");
            assert!(!dev.halted[q].load(Ordering::Relaxed), "engine {q} left halted");
        }
    });
}

/// The IB pool's commit mailboxes (`umd_core::ibpool`): a submission
/// commits its chunk without the pool's lock, and the next holder of the
/// lock applies it. Two submitters on one queue (recording with no lock,
/// committing under the queue's submit lock) race each other, and a
/// submitter races a reader of the pool's state: no chunk stays
/// `Recording` or gets lost, and the queue ends with one open chunk.
#[test]
fn ib_pool_commits_through_the_mailbox_are_never_lost() {
    use loom::sync::Mutex;
    use umd_core::loom_probe::ProbePool;
    let check_end = |pool: &ProbePool| {
        let s = pool.stats();
        assert_eq!(s.recording, 0, "every commit applied: {s:?}");
        assert_eq!(s.open, 1, "the queue's last chunk stays open: {s:?}");
        assert_eq!(s.free + s.in_flight + s.open, 4, "no chunk lost: {s:?}");
    };
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.max_branches = 100_000;
    // Two submitters on one queue.
    builder.check(move || {
        let pool = Arc::new(ProbePool::new().expect("pool"));
        let order = Arc::new(Mutex::new(0u64));
        let other = {
            let (pool, order) = (pool.clone(), order.clone());
            thread::spawn(move || assert!(pool.submit(0, 16, &order), "a chunk was free"))
        };
        assert!(pool.submit(0, 16, &order), "a chunk was free");
        other.join().unwrap();
        check_end(&pool);
    });
    // One submitter (two submissions) and a reader of the state.
    builder.check(move || {
        let pool = Arc::new(ProbePool::new().expect("pool"));
        let order = Mutex::new(0u64);
        let reader = {
            let pool = pool.clone();
            thread::spawn(move || pool.stats().recording)
        };
        assert!(pool.submit(0, 16, &order) && pool.submit(0, 16, &order), "a chunk was free");
        assert!(reader.join().unwrap() <= 1);
        check_end(&pool);
        // Batching: the second submission continued in the first's chunk.
        assert_eq!(pool.stats().in_flight, 0);
    });
}

/// A queue's trace stage: a submitter stages (under its queue's submit
/// lock) while a holder of the trace lock moves the staged submissions
/// into the ring, without a read-modify-write on either side. Every
/// submission reaches the ring exactly once, in order, untorn.
#[test]
fn trace_stage_hands_every_submission_over_once_untorn() {
    use loom::sync::Mutex;
    use umd_core::loom_probe::ProbeTraceStage;
    loom::model(|| {
        let stage = Arc::new(ProbeTraceStage::new());
        let trace_lock = Arc::new(Mutex::new(Vec::new()));
        let reader = {
            let (stage, trace_lock) = (stage.clone(), trace_lock.clone());
            thread::spawn(move || {
                let mut seen = trace_lock.lock().unwrap();
                seen.extend(stage.drain().expect("untorn"));
            })
        };
        assert!(stage.push(1) && stage.push(2), "room in the stage");
        reader.join().unwrap();
        let mut seen = trace_lock.lock().unwrap();
        seen.extend(stage.drain().expect("untorn"));
        assert_eq!(*seen, [1, 2]);
    });
}

/// The async waits' wake-up hub (`Wakeups`) against its interrupt side:
/// `on_interrupt` only tries the hub's lock, and when a registration holds
/// it the event is left for the next registration. A waiter registered
/// before the interrupt is never forgotten: it is woken by the interrupt
/// itself or, at the latest, by the next registration, whatever the
/// interleaving with another waiter registering at the same time.
#[test]
fn async_wakeups_are_never_lost() {
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};
    use umd_core::engine::Wakeups;

    struct Flag(AtomicUsize);
    impl Wake for Flag {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let flag_waker = || {
        let f = std::sync::Arc::new(Flag(AtomicUsize::new(0)));
        (f.clone(), Waker::from(f))
    };
    loom::model(move || {
        let hub = Arc::new(Wakeups::<4>::new());
        let (first, w1) = flag_waker();
        assert!(hub.register(&w1, 1_000));
        let irq = {
            let hub = hub.clone();
            thread::spawn(move || hub.on_interrupt())
        };
        // Another waiter registers while the interrupt comes.
        let (_second, w2) = flag_waker();
        assert!(hub.register(&w2, 1_000));
        irq.join().unwrap();
        // The next registration delivers an event the interrupt left.
        let (_third, w3) = flag_waker();
        assert!(hub.register(&w3, 1_000));
        assert_eq!(first.0.load(Ordering::SeqCst), 1, "the registered waiter was not woken");
    });
}

/// Runs `body` on a model thread with a 1 MiB stack: a [`ProbeDevice`]'s
/// two queues carry their failure histories (80 ranges each), more than
/// the model's main thread has room for.
///
/// [`ProbeDevice`]: umd_core::loom_probe::ProbeDevice
fn on_a_big_stack(body: impl FnOnce() + Send + 'static) {
    loom::thread::Builder::new().stack_size(1 << 20).spawn(body).unwrap().join().unwrap();
}

/// A device loss against a submission publishing its sequence number
/// (`DeviceCore::device_lost` and the locked part of `DeviceCore::submit`): the
/// loss fails each queue's pending range under that queue's submit lock,
/// and a submitter checks the loss under it. Every sequence number a
/// submission published ends failed, whichever comes first, and a
/// submission after the loss is refused. (Failing the range without the
/// lock fails this: a submission that checked the flag before the loss
/// publishes after the range was read, and its fence stays pending.)
#[test]
fn a_loss_fails_every_fence_a_racing_submission_published() {
    use umd_core::loom_probe::{ProbeDevice, Status};
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(|| {
        on_a_big_stack(|| {
            let dev = Arc::new(ProbeDevice::new());
            let submitter = {
                let dev = dev.clone();
                thread::spawn(move || [dev.submit(0), dev.submit(0)])
            };
            dev.lose(None);
            let got = submitter.join().unwrap();
            for s in got.into_iter().flatten() {
                assert_eq!(dev.status(0, s), Status::Failed, "fence {s} published around the loss: {got:?}");
            }
            assert_eq!(dev.submit(0), None, "refused after the loss");
            assert_eq!(got.iter().flatten().max().copied().unwrap_or(0), dev.emitted(0));
        })
    });
}

/// The same with the loss met by a thread that holds a queue's submit lock
/// (a reset whose handshake finds the device gone) while submitters use
/// both queues and a waiter meets the loss too: the holder fails its own
/// queue without taking its lock again and waits for the other's, no
/// thread waits for a lock forever (a thread spinning on a lock that is
/// never released exceeds loom's branch limit: taking the held lock again
/// fails this so), and every published fence ends failed.
#[test]
fn a_loss_met_under_a_submit_lock_neither_deadlocks_nor_misses_a_fence() {
    use umd_core::loom_probe::{ProbeDevice, Status};
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(|| {
        on_a_big_stack(|| {
            let dev = Arc::new(ProbeDevice::new());
            let resetter = {
                let dev = dev.clone();
                thread::spawn(move || {
                    let s = dev.submit(0);
                    dev.lose_in_reset(0);
                    s
                })
            };
            let submitter = {
                let dev = dev.clone();
                thread::spawn(move || dev.submit(1))
            };
            dev.lose(None);
            let got = [(0, resetter.join().unwrap()), (1, submitter.join().unwrap())];
            for (q, s) in got {
                if let Some(s) = s {
                    assert_eq!(dev.status(q, s), Status::Failed, "queue {q}'s fence {s}");
                }
            }
            assert_eq!((dev.submit(0), dev.submit(1)), (None, None), "refused after the loss");
        })
    });
}

/// Dropped async waits give their slots back (`Wakeups::release`) while
/// an interrupt comes: a release takes the hub's lock, so the interrupt may
/// find the hub busy and leave its event behind, and a release delivers
/// such an event as a registration does. A waiter registered before the
/// interrupt is woken by the interrupt itself or, at the latest, by the
/// next use of the hub from the waiting side, here a second drop (no
/// registration follows); a released waiter is never woken after its
/// release (its task is gone). Fails when `release` stops delivering an
/// event that found the hub busy.
#[test]
fn async_wakeups_survive_releases_during_an_interrupt() {
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};
    use umd_core::engine::Wakeups;

    struct Flag(AtomicUsize);
    impl Wake for Flag {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let flag_waker = || {
        let f = std::sync::Arc::new(Flag(AtomicUsize::new(0)));
        (f.clone(), Waker::from(f))
    };
    loom::model(move || {
        let hub = Arc::new(Wakeups::<3>::new());
        let (live, w1) = flag_waker();
        let (dropped, w2) = flag_waker();
        let (_later, w3) = flag_waker();
        assert!(hub.register_slot(&w1, 1_000, None).is_some());
        let r2 = hub.register_slot(&w2, 1_000, None).unwrap();
        let r3 = hub.register_slot(&w3, 1_000, None).unwrap();
        let irq = {
            let hub = hub.clone();
            thread::spawn(move || hub.on_interrupt())
        };
        // A future is dropped while the interrupt comes.
        let released = hub.release(r2);
        irq.join().unwrap();
        // Either the release took the waker first, or the interrupt woke it
        // first (then there was nothing left to release).
        assert_eq!(dropped.0.load(Ordering::SeqCst), usize::from(!released), "a released waiter was woken");
        // Another future is dropped: the event is delivered by now.
        hub.release(r3);
        assert_eq!(live.0.load(Ordering::SeqCst), 1, "the live waiter was not woken");
        assert_eq!(hub.waiting(), 0);
    });
}
