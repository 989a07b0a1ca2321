//! Tunables, in one place, with the defaults the field suggests
//! (field figures from Mesa and the kernel drivers; etnaviv and msm hang
//! checks), their units and ranges ([`Config::validate`]), and the one
//! `key=value` text format that sets them at run time
//! ([`Config::with_text`]; [`Config::text`] prints the configuration in
//! effect in the same format). Firmware reads the text from a boot
//! argument, a flash section or the UART; on Linux `platform-linux`
//! turns `UMD_<KEY>` environment variables and a `UMD_CONFIG` file into
//! the same text.
//!
//! # The text format
//!
//! Entries `key=value`, separated by newlines, `;`, spaces or tabs; `#`
//! starts a comment that runs to the end of the line. A later entry for
//! a key overrides an earlier one. Numbers are decimal; the byte sizes
//! also take a `K` or `M` suffix (KiB, MiB). Booleans are `1/0`,
//! `true/false`, `yes/no`, `on/off`. The parse is all-or-nothing: the
//! first unknown key, malformed value or value out of range is returned
//! as a [`ParseError`] naming the key, and the base configuration stays
//! in effect.
//!
//! | key | field | unit | range (default) |
//! | --- | --- | --- | --- |
//! | `ib_chunk_bytes` | [`Config::ib_chunk_bytes`] | bytes | a multiple of 256 from 1 KiB to 16 MiB, and at most the generation's IB limit (checked at bring-up: 1 MiB on gen1) (64K) |
//! | `ring_bytes` | [`Config::ring_bytes`] | bytes | a power of two from 4 KiB to 4 MiB (64K) |
//! | `batching` | [`Config::batching`] (IB chunk sharing; defers no doorbell) | boolean | (on) |
//! | `batch_window_ns` | [`Config::batch_window_ns`] (deferred doorbells) | ns (0 = off) | at most 100 ms; only 0 without umd-core's `deferred-doorbells` feature (0) |
//! | `pool_exhaustion` | [`Config::pool_exhaustion`] | `wait` or `error` | (`wait`) |
//! | `use_irq` | [`Config::use_irq`] | boolean | (on) |
//! | `wait_step0_until_ns` .. `wait_step2_until_ns` | [`WaitStep::until_ns`] of steps 0..2 (step 3 lasts forever) | ns | each greater than the one before, step 0 may be 0, at most 1 h (2 µs, 100 µs, 1 ms) |
//! | `wait_step0_interval_ns` .. `wait_step3_interval_ns` | [`WaitStep::interval_ns`] | ns (0 = spin) | at most 1 s (0, 1 µs, 10 µs, 100 µs) |
//! | `dep_wait_ns` | [`Config::dep_wait_ns`] | ns | at most 1 h (500 ms) |
//! | `local_min_residency` | [`Config::local_min_residency`] | submissions | at most 1024 (4) |
//! | `hang_window_ns` | [`HangConfig::window_ns`] | ns | 1 ms to 1 h (500 ms) |
//! | `hang_min_progress_bytes` | [`HangConfig::min_progress_bytes`] | bytes | at most 1 MiB (16) |
//! | `hang_max_windows` | [`HangConfig::max_windows_without_fence`] | windows | 1 to 1000 (4) |
//! | `hang_unsubmitted_wait_ns` | [`HangConfig::unsubmitted_wait_ns`] | ns, or `none` (forever) | 1 ms to 1 h (`none`) |

use core::fmt;

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
    /// Size of one IB chunk in bytes (the range: the module's table; at
    /// most 1 MiB on gen1, its IB limit). The pool holds `CHUNKS` of them
    /// for the device's life, and one submission can use them all: size
    /// the two together (`docs/perf.md`, "IB sizing").
    ///
    /// 64 KiB by default, from that section's sweep of 4 KiB to 8 MiB on
    /// bare metal and in kernel mode. 4 KiB chunks CHAIN a 32 KiB
    /// submission 8 times, cost 1.35–1.42x the CPU per submission of a mix
    /// of small and such large submissions on bare metal, and 16 of them
    /// take no submission above 64 KiB. From 16 KiB up the CPU cost and
    /// the submit → fence time stay within 3 % while the memory held
    /// grows 4x a step. 64 KiB takes such a
    /// submission in one chunk (two when it continues a chunk the small
    /// submissions partly filled) and, with 16 chunks, one of up to
    /// 1 MiB, for 1 MiB held. Many small submissions share one chunk
    /// whatever its size (batching), so they can do with 16 KiB; larger
    /// chunks pay only for submissions larger than 64 KiB.
    pub ib_chunk_bytes: usize,
    /// Ring size in bytes per engine (power of two, 4 KiB ..= 4 MiB).
    pub ring_bytes: usize,
    /// Whether small submissions share an IB chunk (memory only: each
    /// submission still publishes its ring write and rings the doorbell;
    /// deferring those is [`Config::batch_window_ns`]).
    pub batching: bool,
    /// Deferred doorbells: submissions to one queue within this many ns
    /// share one write-pointer update and one doorbell (0, the default:
    /// off, every submission rings). A held submission reaches the GPU
    /// when the oldest held one is this old at the next driver call, when
    /// a wait, a status query or another queue's submission needs its
    /// fence, when [`crate::engine::MAX_HELD`] are held or the ring is
    /// full, on [`crate::engine::DeviceCore::flush`], and at shutdown
    /// (`docs/architecture.md`, "Deferred doorbells"). At most 100 ms.
    pub batch_window_ns: u64,
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
    /// The defaults: 64 KiB chunks and rings, IB chunk sharing on,
    /// deferred doorbells off (the figures in `docs/perf.md`, "Deferred
    /// doorbells"), wait for the
    /// oldest fence when the pool is empty, the wait schedule of `docs/porting.md`
    /// (spin 2 µs, 1 µs polls to 100 µs, 10 µs polls to 1 ms, then 100 µs),
    /// interrupts when available, hang after 500 ms without progress or
    /// 4 windows (2 s) without a fence.
    pub const DEFAULT: Config = Config {
        ib_chunk_bytes: 64 * 1024,
        ring_bytes: 64 * 1024,
        batching: true,
        batch_window_ns: 0,
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

/// A tunable, as the text format names it (`docs` of [`crate::config`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// `ib_chunk_bytes`.
    IbChunkBytes,
    /// `ring_bytes`.
    RingBytes,
    /// `batching`.
    Batching,
    /// `batch_window_ns`.
    BatchWindowNs,
    /// `pool_exhaustion`.
    PoolExhaustion,
    /// `use_irq`.
    UseIrq,
    /// `wait_step<N>_until_ns` (N = 0..2; step 3 lasts forever).
    WaitStepUntil(u8),
    /// `wait_step<N>_interval_ns` (N = 0..3).
    WaitStepInterval(u8),
    /// `dep_wait_ns`.
    DepWaitNs,
    /// `local_min_residency`.
    LocalMinResidency,
    /// `hang_window_ns`.
    HangWindowNs,
    /// `hang_min_progress_bytes`.
    HangMinProgressBytes,
    /// `hang_max_windows`.
    HangMaxWindows,
    /// `hang_unsubmitted_wait_ns`.
    HangUnsubmittedWaitNs,
}

impl Key {
    /// Every key, in the order [`Config::text`] prints them.
    pub const ALL: [Key; 19] = [
        Key::IbChunkBytes,
        Key::RingBytes,
        Key::Batching,
        Key::BatchWindowNs,
        Key::PoolExhaustion,
        Key::UseIrq,
        Key::WaitStepUntil(0),
        Key::WaitStepUntil(1),
        Key::WaitStepUntil(2),
        Key::WaitStepInterval(0),
        Key::WaitStepInterval(1),
        Key::WaitStepInterval(2),
        Key::WaitStepInterval(3),
        Key::DepWaitNs,
        Key::LocalMinResidency,
        Key::HangWindowNs,
        Key::HangMinProgressBytes,
        Key::HangMaxWindows,
        Key::HangUnsubmittedWaitNs,
    ];

    /// The key's name in the text format.
    pub const fn name(self) -> &'static str {
        match self {
            Key::IbChunkBytes => "ib_chunk_bytes",
            Key::RingBytes => "ring_bytes",
            Key::Batching => "batching",
            Key::BatchWindowNs => "batch_window_ns",
            Key::PoolExhaustion => "pool_exhaustion",
            Key::UseIrq => "use_irq",
            Key::WaitStepUntil(0) => "wait_step0_until_ns",
            Key::WaitStepUntil(1) => "wait_step1_until_ns",
            Key::WaitStepUntil(_) => "wait_step2_until_ns",
            Key::WaitStepInterval(0) => "wait_step0_interval_ns",
            Key::WaitStepInterval(1) => "wait_step1_interval_ns",
            Key::WaitStepInterval(2) => "wait_step2_interval_ns",
            Key::WaitStepInterval(_) => "wait_step3_interval_ns",
            Key::DepWaitNs => "dep_wait_ns",
            Key::LocalMinResidency => "local_min_residency",
            Key::HangWindowNs => "hang_window_ns",
            Key::HangMinProgressBytes => "hang_min_progress_bytes",
            Key::HangMaxWindows => "hang_max_windows",
            Key::HangUnsubmittedWaitNs => "hang_unsubmitted_wait_ns",
        }
    }

    /// The key named `name`, if there is one.
    pub fn from_name(name: &str) -> Option<Key> {
        Key::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The values the key accepts (for error messages).
    pub const fn range(self) -> &'static str {
        match self {
            Key::IbChunkBytes => "a multiple of 256 from 1 KiB to 16 MiB",
            Key::RingBytes => "a power of two from 4 KiB to 4 MiB",
            Key::Batching | Key::UseIrq => "a boolean (1/0, true/false, yes/no, on/off)",
            Key::PoolExhaustion => "`wait` or `error`",
            Key::BatchWindowNs => {
                "ns, at most 100 ms (0: off; only 0 without umd-core's feature deferred-doorbells)"
            }
            Key::WaitStepUntil(_) => {
                "ns, greater than the step before and less than the step after, at most 1 h"
            }
            Key::WaitStepInterval(_) => "ns, at most 1 s",
            Key::DepWaitNs => "ns, at most 1 h",
            Key::LocalMinResidency => "submissions, at most 1024",
            Key::HangWindowNs => "ns, from 1 ms to 1 h",
            Key::HangMinProgressBytes => "bytes, at most 1 MiB",
            Key::HangMaxWindows => "windows, from 1 to 1000",
            Key::HangUnsubmittedWaitNs => "ns from 1 ms to 1 h, or `none`",
        }
    }
}

/// One millisecond in ns.
const MS: u64 = 1_000_000;
/// One hour in ns: the longest wait any tunable may name.
const HOUR_NS: u64 = 3_600 * 1_000 * MS;

/// The longest [`Config::batch_window_ns`]: 100 ms.
pub const MAX_BATCH_WINDOW_NS: u64 = 100 * MS;

/// Whether `ns` is a batch window this build takes: at most
/// [`MAX_BATCH_WINDOW_NS`], and 0 without umd-core's `deferred-doorbells`
/// feature.
pub const fn batch_window_ok(ns: u64) -> bool {
    ns <= MAX_BATCH_WINDOW_NS && (ns == 0 || cfg!(feature = "deferred-doorbells"))
}

/// A tunable out of its range ([`Config::validate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeError {
    /// The tunable.
    pub key: Key,
}

impl fmt::Display for RangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} out of range: expected {}", self.key.name(), self.key.range())
    }
}

impl core::error::Error for RangeError {}

/// What is wrong with an entry of a configuration text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// No tunable has this name.
    UnknownKey,
    /// The entry has no `=`, or the value is not of the key's kind (a
    /// number, a boolean, a choice).
    Malformed,
    /// The value is of the right kind but outside the key's range
    /// ([`Key::range`]).
    OutOfRange(Key),
}

/// Why a configuration text was refused (the configuration is unchanged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseError<'a> {
    /// The key, as written (or the whole entry when it has no `=`).
    pub key: &'a str,
    /// Line of the entry (from 1; 0 for a range error found once every
    /// entry was applied, in a field the text did not set).
    pub line: usize,
    /// What is wrong.
    pub kind: ParseErrorKind,
}

impl fmt::Display for ParseError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line > 0 {
            write!(f, "line {}: ", self.line)?;
        }
        match self.kind {
            ParseErrorKind::UnknownKey => write!(f, "unknown key `{}`", self.key),
            ParseErrorKind::Malformed => match Key::from_name(self.key) {
                Some(k) => write!(f, "`{}`: malformed value, expected {}", self.key, k.range()),
                None => write!(f, "`{}`: not a key=value entry", self.key),
            },
            ParseErrorKind::OutOfRange(k) => {
                write!(f, "`{}` out of range: expected {}", self.key, k.range())
            }
        }
    }
}

impl core::error::Error for ParseError<'_> {}

/// A non-negative decimal number, with a `K`/`M` (KiB, MiB) suffix when
/// `sizes`.
fn number(v: &str, sizes: bool) -> Option<u64> {
    let (digits, mul) = match v.as_bytes().last() {
        Some(b'k' | b'K') if sizes => (v.get(..v.len().saturating_sub(1))?, 1u64 << 10),
        Some(b'm' | b'M') if sizes => (v.get(..v.len().saturating_sub(1))?, 1 << 20),
        _ => (v, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(mul)
}

fn boolean(v: &str) -> Option<bool> {
    const T: [&str; 4] = ["1", "true", "yes", "on"];
    const F: [&str; 4] = ["0", "false", "no", "off"];
    if T.iter().any(|t| t.eq_ignore_ascii_case(v)) {
        Some(true)
    } else if F.iter().any(|t| t.eq_ignore_ascii_case(v)) {
        Some(false)
    } else {
        None
    }
}

impl Config {
    /// Checks every tunable against its range (the table of
    /// [`crate::config`]); the first one outside it is named. Bring-up
    /// checks what depends on the chip (the generation's IB limit) itself.
    pub fn validate(&self) -> Result<(), RangeError> {
        let bad = |key| Err(RangeError { key });
        let ib = self.ib_chunk_bytes;
        if ib < 1024 || ib % 256 != 0 || ib > 16 << 20 {
            return bad(Key::IbChunkBytes);
        }
        if !self.ring_bytes.is_power_of_two() || !(4096..=4 << 20).contains(&self.ring_bytes) {
            return bad(Key::RingBytes);
        }
        let mut before: Option<u64> = None;
        for (i, s) in self.wait_steps.iter().enumerate() {
            let n = i as u8;
            let last = i.saturating_add(1) == self.wait_steps.len();
            let ordered = before.is_none_or(|b| s.until_ns > b);
            if !ordered || (last && s.until_ns != u64::MAX) || (!last && s.until_ns > HOUR_NS) {
                // The last step's end is fixed; a disorder shows on the
                // step that ends too early (or on step 2 for the last).
                return bad(Key::WaitStepUntil(n.min(2)));
            }
            if s.interval_ns > 1_000 * MS {
                return bad(Key::WaitStepInterval(n));
            }
            before = Some(s.until_ns);
        }
        if !batch_window_ok(self.batch_window_ns) {
            return bad(Key::BatchWindowNs);
        }
        if self.dep_wait_ns > HOUR_NS {
            return bad(Key::DepWaitNs);
        }
        if self.local_min_residency > 1024 {
            return bad(Key::LocalMinResidency);
        }
        let h = &self.hang;
        if !(MS..=HOUR_NS).contains(&h.window_ns) {
            return bad(Key::HangWindowNs);
        }
        if h.min_progress_bytes > 1 << 20 {
            return bad(Key::HangMinProgressBytes);
        }
        if !(1..=1000).contains(&h.max_windows_without_fence) {
            return bad(Key::HangMaxWindows);
        }
        if h.unsubmitted_wait_ns.is_some_and(|n| !(MS..=HOUR_NS).contains(&n)) {
            return bad(Key::HangUnsubmittedWaitNs);
        }
        Ok(())
    }

    /// This configuration with the entries of `text` applied (the format:
    /// [`crate::config`]), checked with [`Config::validate`]. All or
    /// nothing: on error `self` is what stays in effect.
    pub fn with_text<'a>(&self, text: &'a str) -> Result<Config, ParseError<'a>> {
        let mut c = *self;
        let mut set_on: [usize; Key::ALL.len()] = [0; Key::ALL.len()];
        for (n, line) in text.split('\n').enumerate() {
            let line_no = n.saturating_add(1);
            let body = line.split('#').next().unwrap_or("");
            for entry in body.split([';', ' ', '\t', '\r']).filter(|e| !e.is_empty()) {
                let Some((name, value)) = entry.split_once('=') else {
                    return Err(ParseError { key: entry, line: line_no, kind: ParseErrorKind::Malformed });
                };
                let err = |kind| ParseError { key: name, line: line_no, kind };
                let key = Key::from_name(name).ok_or(err(ParseErrorKind::UnknownKey))?;
                c.apply(key, value).map_err(err)?;
                if let Some(slot) = Key::ALL.iter().position(|k| *k == key).and_then(|i| set_on.get_mut(i)) {
                    *slot = line_no;
                }
            }
        }
        c.validate().map_err(|e| {
            let line = Key::ALL.iter().position(|k| *k == e.key).and_then(|i| set_on.get(i)).copied();
            ParseError { key: e.key.name(), line: line.unwrap_or(0), kind: ParseErrorKind::OutOfRange(e.key) }
        })?;
        Ok(c)
    }

    /// Sets `key` from its text `value` (its range is checked by
    /// [`Config::validate`], except where the value does not fit the field).
    fn apply(&mut self, key: Key, value: &str) -> Result<(), ParseErrorKind> {
        let bad = ParseErrorKind::Malformed;
        let range = ParseErrorKind::OutOfRange(key);
        let size = || number(value, true).ok_or(bad).and_then(|n| usize::try_from(n).map_err(|_| range));
        let ns = || number(value, false).ok_or(bad);
        match key {
            Key::IbChunkBytes => self.ib_chunk_bytes = size()?,
            Key::RingBytes => self.ring_bytes = size()?,
            Key::Batching => self.batching = boolean(value).ok_or(bad)?,
            Key::UseIrq => self.use_irq = boolean(value).ok_or(bad)?,
            Key::PoolExhaustion => {
                self.pool_exhaustion = match value {
                    "wait" => PoolExhaustion::WaitOldest,
                    "error" => PoolExhaustion::Error,
                    _ => return Err(bad),
                }
            }
            Key::WaitStepUntil(n) => {
                let v = ns()?;
                self.wait_steps.get_mut(usize::from(n)).ok_or(range)?.until_ns = v;
            }
            Key::WaitStepInterval(n) => {
                let v = ns()?;
                self.wait_steps.get_mut(usize::from(n)).ok_or(range)?.interval_ns = v;
            }
            Key::DepWaitNs => self.dep_wait_ns = ns()?,
            Key::BatchWindowNs => self.batch_window_ns = ns()?,
            Key::LocalMinResidency => {
                self.local_min_residency = u32::try_from(ns()?).map_err(|_| range)?;
            }
            Key::HangWindowNs => self.hang.window_ns = ns()?,
            Key::HangMinProgressBytes => self.hang.min_progress_bytes = number(value, true).ok_or(bad)?,
            Key::HangMaxWindows => {
                self.hang.max_windows_without_fence = u32::try_from(ns()?).map_err(|_| range)?;
            }
            Key::HangUnsubmittedWaitNs => {
                self.hang.unsubmitted_wait_ns =
                    if value.eq_ignore_ascii_case("none") { None } else { Some(ns()?) };
            }
        }
        Ok(())
    }

    /// The configuration as text, one `key=value` entry per key separated
    /// by spaces ([`Config::with_text`] reads it back to the same value).
    pub fn text(&self) -> ConfigText<'_> {
        ConfigText(self)
    }
}

/// [`Config::text`]: the configuration in the text format.
#[derive(Clone, Copy, Debug)]
pub struct ConfigText<'a>(&'a Config);

impl fmt::Display for ConfigText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.0;
        let onoff = |b: bool| if b { "on" } else { "off" };
        let step = |n: u8| {
            c.wait_steps.get(usize::from(n)).copied().unwrap_or(WaitStep { until_ns: 0, interval_ns: 0 })
        };
        for (i, k) in Key::ALL.into_iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{}=", k.name())?;
            match k {
                Key::IbChunkBytes => write!(f, "{}", c.ib_chunk_bytes),
                Key::RingBytes => write!(f, "{}", c.ring_bytes),
                Key::Batching => f.write_str(onoff(c.batching)),
                Key::UseIrq => f.write_str(onoff(c.use_irq)),
                Key::PoolExhaustion => f.write_str(match c.pool_exhaustion {
                    PoolExhaustion::WaitOldest => "wait",
                    PoolExhaustion::Error => "error",
                }),
                Key::WaitStepUntil(n) => write!(f, "{}", step(n).until_ns),
                Key::WaitStepInterval(n) => write!(f, "{}", step(n).interval_ns),
                Key::DepWaitNs => write!(f, "{}", c.dep_wait_ns),
                Key::BatchWindowNs => write!(f, "{}", c.batch_window_ns),
                Key::LocalMinResidency => write!(f, "{}", c.local_min_residency),
                Key::HangWindowNs => write!(f, "{}", c.hang.window_ns),
                Key::HangMinProgressBytes => write!(f, "{}", c.hang.min_progress_bytes),
                Key::HangMaxWindows => write!(f, "{}", c.hang.max_windows_without_fence),
                Key::HangUnsubmittedWaitNs => match c.hang.unsubmitted_wait_ns {
                    Some(n) => write!(f, "{n}"),
                    None => f.write_str("none"),
                },
            }?;
        }
        Ok(())
    }
}

/// A capacity an operation ran into, named by the parameter that sets it:
/// the errors that report a full table say which one to raise
/// ([`crate::mem::AllocError::limit`], [`crate::error::SubmitError::limit`];
/// `docs/memory.md`, "Choosing the capacities"). Their `Display` ends
/// with this one's ("raise DeviceStorage's BUFFERS parameter").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Limit {
    /// Buffer handles (live or waiting for their fence): [`crate::storage::DeviceStorage`]'s
    /// `BUFFERS`.
    Buffers,
    /// GPU VA allocator nodes (one per buffer, slab or hole of the VA
    /// arena): [`crate::storage::DeviceStorage`]'s `VA_NODES`.
    VaNodes,
    /// Slab descriptors of the small and medium size classes:
    /// [`crate::storage::DeviceStorage`]'s `SLABS`.
    Slabs,
    /// IB chunks of the device's IB pool: the `CHUNKS` parameter of
    /// [`crate::direct::Device`] (direct mode; not in the storage).
    IbChunks,
    /// Submissions with cross-queue waits pending on one queue (the
    /// dependency graph's depth): [`crate::storage::PENDING_WAITS`], a build constant, not
    /// a parameter (in kernel mode also the jobs a queue holds back,
    /// `kernel::HELD_JOBS`); the submission succeeds once earlier ones
    /// complete.
    PendingWaits,
}

impl Limit {
    /// The parameter that sets this capacity, as the source spells it
    /// (`"DeviceStorage's BUFFERS"`; `"PENDING_WAITS"` for the constant).
    pub const fn parameter(self) -> &'static str {
        match self {
            Limit::Buffers => "DeviceStorage's BUFFERS",
            Limit::VaNodes => "DeviceStorage's VA_NODES",
            Limit::Slabs => "DeviceStorage's SLABS",
            Limit::IbChunks => "Device's CHUNKS",
            Limit::PendingWaits => "PENDING_WAITS",
        }
    }
}

impl core::fmt::Display for Limit {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Limit::PendingWaits => {
                write!(f, "let earlier ones complete ({} is a build constant)", self.parameter())
            }
            _ => write!(f, "raise {} parameter", self.parameter()),
        }
    }
}
