//! Tunables, in one place, with the defaults the field suggests
//! (field figures from Mesa and the kernel drivers; etnaviv and msm hang
//! checks). On Linux, `platform-linux` lets environment variables override
//! them (`UMD_IB_CHUNK_BYTES`, `UMD_HANG_WINDOW_MS`, ...).

/// What to do when every IB chunk is in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolExhaustion {
    /// Wait for the oldest in-flight fence, reclaim, and go on.
    WaitOldest,
    /// Fail the recording with [`crate::error::SubmitError::PoolEmpty`].
    Error,
}

/// One step of the adaptive fence-wait schedule: until `until_ns` of
/// waiting have passed, re-check every `interval_ns` (0 = spin).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitStep {
    /// This step applies while the wait is younger than this.
    pub until_ns: u64,
    /// Pause between checks (0 = busy spin).
    pub interval_ns: u64,
}

/// Hang detection: progress-based, as etnaviv and msm do it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HangConfig {
    /// A queue with pending work whose read pointer, current packet address
    /// and completed fence all stayed put for this long is hung.
    pub window_ns: u64,
    /// Movement of the current packet address by at most this many bytes
    /// does not count as progress (a WAIT_MEM re-fetching itself).
    pub min_progress_bytes: u64,
    /// A queue whose fence has not moved for this many windows is hung even
    /// if its addresses move (a CHAIN loop), like msm's retry limit.
    pub max_windows_without_fence: u32,
    /// How long a queue may wait for a fence of another queue that has not
    /// been submitted yet (wait before signal) before it is reset with
    /// [`crate::sync::FenceError::NeverSignalled`]. `None` (the default):
    /// forever while the device lives; such a queue is blocked, never
    /// "hung" (`docs/architecture.md`, "Wait before signal").
    pub unsubmitted_wait_ns: Option<u64>,
}

/// Every tunable of the driver core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Size of one IB chunk in bytes (64–256 KiB is the sweet spot; below
    /// 4 KiB submission overhead dominates).
    pub ib_chunk_bytes: usize,
    /// Ring size in bytes per engine (power of two, 4 KiB ..= 4 MiB).
    pub ring_bytes: usize,
    /// Whether small submissions share an IB chunk.
    pub batching: bool,
    /// What recording does when no chunk is free.
    pub pool_exhaustion: PoolExhaustion,
    /// The fence-wait schedule, checked in order.
    pub wait_steps: [WaitStep; 4],
    /// Use interrupts for waits when the platform supports them.
    pub use_irq: bool,
    /// Submissions with cross-queue waits tracked per queue for deadlock
    /// detection are bounded ([`crate::engine::PENDING_WAITS`]); when a
    /// queue's table is full a submission waits for room this long, then
    /// fails with `TooManyPending`.
    pub dep_wait_ns: u64,
    /// Hang detection.
    pub hang: HangConfig,
    /// Local memory (`docs/memory.md`, "Local memory and eviction"): a
    /// buffer used by one of the last this-many submissions is not evicted
    /// to make room for another (LRU with a minimum residency); a restore
    /// that finds no other victim is deferred and the work runs from system
    /// memory instead of thrashing.
    pub local_min_residency: u32,
}

impl Config {
    /// The defaults: 64 KiB chunks and rings, batching on, wait for the
    /// oldest fence when the pool is empty, the wait schedule of `docs/porting.md`
    /// (spin 2 µs, 1 µs polls to 100 µs, 10 µs polls to 1 ms, then 100 µs),
    /// interrupts when available, hang after 500 ms without progress or
    /// 4 windows (2 s) without a fence.
    pub const DEFAULT: Config = Config {
        ib_chunk_bytes: 64 * 1024,
        ring_bytes: 64 * 1024,
        batching: true,
        pool_exhaustion: PoolExhaustion::WaitOldest,
        wait_steps: [
            WaitStep { until_ns: 2_000, interval_ns: 0 },
            WaitStep { until_ns: 100_000, interval_ns: 1_000 },
            WaitStep { until_ns: 1_000_000, interval_ns: 10_000 },
            WaitStep { until_ns: u64::MAX, interval_ns: 100_000 },
        ],
        use_irq: true,
        dep_wait_ns: 500_000_000,
        local_min_residency: 4,
        hang: HangConfig {
            window_ns: 500_000_000,
            min_progress_bytes: 16,
            max_windows_without_fence: 4,
            unsubmitted_wait_ns: None,
        },
    };

    /// The pause before the next check of a wait that started `elapsed_ns`
    /// ago (0 = spin).
    pub fn wait_interval(&self, elapsed_ns: u64) -> u64 {
        self.wait_steps
            .iter()
            .find(|s| elapsed_ns < s.until_ns)
            .map_or_else(|| self.wait_steps.last().map_or(0, |s| s.interval_ns), |s| s.interval_ns)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::DEFAULT
    }
}
