//! The loss race, for both modes: four threads submit to three queues (two
//! share one) and wait for their fences and for each other's with no
//! timeout, while the platform is lost at the access a seed chose; then
//! every fence emitted is checked. A watchdog fails the run when a thread
//! does not return (a wait left pending forever, or a deadlock) instead
//! of hanging.

use std::time::{Duration, Instant};

use umd_core::engine::{Backend, DeviceCore};
use umd_core::error::{FenceStatus, SubmitError, WaitError};
use umd_core::sync::{Fence, FenceError, QueueId};

/// Threads of one run, and the submissions each makes.
pub const THREADS: usize = 4;
const ITERS: u64 = 40;
/// The waits' timeout: never reached (the fakes' time moves by the
/// driver's sleeps only); the watchdog is what ends a wait that never
/// returns.
pub const FOREVER: u64 = u64::MAX;
/// Real time one run may take before the watchdog fails the test.
pub const WATCHDOG: Duration = Duration::from_secs(30);

/// What runs of the loss race saw.
#[derive(Default, Debug)]
pub struct Figures {
    pub seeds: u64,
    /// Runs whose device was lost (the access the seed chose was reached).
    pub losses: u64,
    /// Fences emitted, and how they ended.
    pub fences: u64,
    pub signalled: u64,
    pub failed_lost: u64,
    /// Submissions refused (`DeviceLost`, or a wait on a fence that failed
    /// so).
    pub refused: u64,
    /// Waits the racing threads made.
    pub waits: u64,
}

impl Figures {
    fn add(&mut self, o: &Figures) {
        self.seeds += o.seeds;
        self.losses += o.losses;
        self.fences += o.fences;
        self.signalled += o.signalled;
        self.failed_lost += o.failed_lost;
        self.refused += o.refused;
        self.waits += o.waits;
    }
}

/// A small xorshift generator: a run's choices follow its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// What one thread saw: its fences with the answers of their waits, the
/// submissions refused, the waits made.
#[derive(Default)]
struct Seen {
    fences: Vec<(Fence, Result<(), WaitError>)>,
    refused: u64,
    waits: u64,
}

/// Joins `h`, or fails the test with `what` once `deadline` passes (the
/// thread is left running; what it borrows is never freed).
fn join_or_fail<T>(h: std::thread::JoinHandle<T>, deadline: Instant, what: &str) -> T {
    while !h.is_finished() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
    match h.join() {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// A wait's answer around a loss: signalled or failed `DeviceLost`.
fn loss_answer(r: &Result<(), WaitError>) -> bool {
    matches!(r, Ok(()) | Err(WaitError::Failed(FenceError::DeviceLost)))
}

/// One thread: submits to its queue (after the last fence of another
/// queue, one time in three) a timestamp to `addr` and waits for its
/// fence, and one time in two for the other queue's last fence, until a
/// submission is refused; then checks that the next one is refused too.
fn thread<B: Backend>(dev: &DeviceCore<'_, B, 4>, t: usize, seed: u64, addr: u64) -> Result<Seen, String> {
    let mut rng = Rng::new(seed ^ ((t as u64 + 1) << 40));
    let queue = QueueId((t % 3) as u8);
    let other = QueueId(((t + 1) % 3) as u8);
    let mut seen = Seen::default();
    for i in 0..ITERS {
        let after: Vec<Fence> = dev.last_emitted(other).into_iter().filter(|_| rng.below(3) == 0).collect();
        let lost_before = dev.is_lost();
        match dev.submit(queue, &after, |cb| cb.timestamp(addr)) {
            Ok(f) => {
                if lost_before {
                    return Err(format!("thread {t}: submission {i} began after the loss and was accepted"));
                }
                let r = dev.wait(f, FOREVER);
                seen.waits += 1;
                if !loss_answer(&r) {
                    return Err(format!("thread {t}: wait for {f:?} answered {r:?}"));
                }
                seen.fences.push((f, r));
            }
            Err(
                SubmitError::DeviceLost | SubmitError::DependencyFailed { error: FenceError::DeviceLost, .. },
            ) => {
                // Refused once, refused from then on.
                let again = dev.submit(queue, &[], |cb| cb.timestamp(addr));
                if again != Err(SubmitError::DeviceLost) {
                    return Err(format!("thread {t}: submission after a refusal answered {again:?}"));
                }
                seen.refused = 2;
                return Ok(seen);
            }
            Err(e) => return Err(format!("thread {t}: submission {i} refused with {e:?}")),
        }
        if rng.below(2) == 0 {
            if let Some(f) = dev.last_emitted(other) {
                let r = dev.wait(f, FOREVER);
                seen.waits += 1;
                if !loss_answer(&r) {
                    return Err(format!("thread {t}: wait for {f:?} of another thread answered {r:?}"));
                }
            }
        }
    }
    Ok(seen)
}

/// After the threads: every wait's answer is still the fence's, every
/// fence emitted on every queue is waited for (it returns) and ends
/// signalled or failed `DeviceLost`, and a lost device refuses a
/// submission.
fn check<B: Backend>(
    dev: &DeviceCore<'_, B, 4>,
    seen: &[(Fence, Result<(), WaitError>)],
    addr: u64,
) -> Result<Figures, String> {
    let mut fig = Figures::default();
    for (f, waited) in seen {
        let now = dev.query(*f);
        let same = match waited {
            Ok(()) => now == Ok(FenceStatus::Signalled),
            Err(WaitError::Failed(e)) => now == Ok(FenceStatus::Failed(*e)),
            _ => false,
        };
        if !same {
            return Err(format!("{f:?}: the wait answered {waited:?}, a query now {now:?}"));
        }
    }
    for q in 0..3u8 {
        let Some(last) = dev.last_emitted(QueueId(q)) else { continue };
        for s in 1..=last.id.seqno.0 {
            let mut f = last;
            f.id.seqno.0 = s;
            fig.fences += 1;
            match (dev.wait(f, FOREVER), dev.query(f)) {
                (Ok(()), Ok(FenceStatus::Signalled)) => fig.signalled += 1,
                (
                    Err(WaitError::Failed(FenceError::DeviceLost)),
                    Ok(FenceStatus::Failed(FenceError::DeviceLost)),
                ) => fig.failed_lost += 1,
                other => return Err(format!("{f:?}: wait and query answered {other:?}")),
            }
        }
    }
    if dev.is_lost() {
        fig.losses = 1;
        let r = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(addr));
        if r != Err(SubmitError::DeviceLost) {
            return Err(format!("a submission after the loss answered {r:?}"));
        }
    } else if fig.failed_lost > 0 {
        return Err(format!("{} fences failed DeviceLost on a device that is not lost", fig.failed_lost));
    }
    Ok(fig)
}

/// One run on `dev`, whose platform is set to be lost as `lost_at` says:
/// the racing threads (timestamps to `addr` and after it), then the
/// checks, on another thread too; all under the watchdog. Fails the test
/// with the seed on any violation.
pub fn run<B>(dev: &'static DeviceCore<'static, B, 4>, seed: u64, lost_at: &str, addr: u64) -> Figures
where
    B: Backend + 'static,
    DeviceCore<'static, B, 4>: Sync,
{
    let deadline = Instant::now() + WATCHDOG;
    let stuck = format!(
        "seed {seed}: a thread of the loss race (lost at {lost_at}) did not return within {WATCHDOG:?}: \
         a wait that never ends (a fence left pending) or a deadlock"
    );
    let threads: Vec<_> =
        (0..THREADS).map(|t| std::thread::spawn(move || thread(dev, t, seed, addr + 8 * t as u64))).collect();
    let mut fig = Figures { seeds: 1, ..Figures::default() };
    let mut seen = Vec::new();
    for h in threads {
        match join_or_fail(h, deadline, &stuck) {
            Ok(t) => {
                seen.extend(t.fences);
                fig.refused += t.refused;
                fig.waits += t.waits;
            }
            Err(e) => panic!("seed {seed} (lost at {lost_at}): {e}"),
        }
    }
    let checker = std::thread::spawn(move || check(dev, &seen, addr));
    match join_or_fail(checker, deadline, &stuck) {
        Ok(f) => fig.add(&f),
        Err(e) => panic!("seed {seed} (lost at {lost_at}): {e}"),
    }
    fig
}

/// Runs `one` for consecutive seeds from a fixed first one until `budget`
/// of real time has passed (at most 2000), or for the one seed
/// `UMD_LOSS_SEED` names; prints the seeds and the figures, and checks
/// that enough runs ran and most met the loss.
pub fn seeds(what: &str, budget: Duration, mut one: impl FnMut(u64) -> Figures) -> Figures {
    /// Seeds every run covers, however slow the machine.
    const MIN_SEEDS: u64 = 20;
    let (first, count, budget) = match std::env::var("UMD_LOSS_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => (seed, 1, Duration::MAX),
        None => (0x10_55, 2_000u64, budget),
    };
    println!("{what}: seeds from {first} (UMD_LOSS_SEED=<seed> runs one)");
    let start = Instant::now();
    let mut total = Figures::default();
    for seed in first..first + count {
        total.add(&one(seed));
        // The budget ends the run only after the minimum number of seeds:
        // a loaded machine runs fewer per second, never fewer in all.
        if start.elapsed() > budget && total.seeds >= MIN_SEEDS {
            break;
        }
    }
    println!("{what}: {total:?} in {:?}", start.elapsed());
    if count > 1 {
        assert!(total.seeds >= MIN_SEEDS, "too few seeds ran: {total:?}");
        assert!(total.losses * 2 >= total.seeds, "most runs must meet the loss: {total:?}");
    }
    total
}
