//! Benchmark scenarios shared by the bare-metal `bench` image and the host
//! co-simulation run of `qemu-tests`' `bare_metal` benchmark, so the two
//! sides measure exactly the same driver calls.
//!
//! - [`submit_cost`]: CPU time of `Device::submit` of one WRITE_DATA on
//!   COPY (recording, IB chunk, ring write, doorbell), no wait inside the
//!   timed region; the queue is drained every [`BATCH`] submissions,
//!   outside it.
//! - [`round_trips`]: doorbell -> fence: `submit` of one WRITE_DATA then
//!   `wait` for its fence, timed together (the wait polls or sleeps on an
//!   interrupt depending on the platform and `Config::use_irq`).
//!
//! - [`bursts`]: `burst` submissions of one WRITE_DATA on COPY, then a
//!   `wait` for the last, timed together; with the doorbells rung per
//!   submission (`DeviceStats::doorbells`): what deferred doorbells
//!   (`Config::batch_window_ns`) save.
//! - [`service_latency`]: `submit` of one WRITE_DATA, then `service` and
//!   a CPU read of the written word until it lands, with no wait and no
//!   query on the fence: submit -> GPU write latency when nothing flushes
//!   a held submission but the window's expiry (the window's cost).
//!
//! Times come from the platform clock (`now_ns`: `CNTVCT_EL0` on bare
//! metal, CLOCK_MONOTONIC on Linux). No allocation: samples go into
//! caller-provided arrays.

use umd_core::engine::{Backend, DeviceCore};
use umd_core::platform::Platform;
use umd_core::sync::QueueId;

/// Submissions between drains in [`submit_cost`].
pub const BATCH: usize = 32;
/// Failure guard for a wait.
const GUARD_NS: u64 = 30_000_000_000;

/// Summary of samples, in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// Samples.
    pub n: usize,
    /// Median.
    pub median: u64,
    /// 90th percentile.
    pub p90: u64,
    /// Mean.
    pub mean: u64,
}

/// Sorts `s` and summarises it.
pub fn figures(s: &mut [u64]) -> Figures {
    s.sort_unstable();
    let n = s.len();
    if n == 0 {
        return Figures::default();
    }
    let at = |q: usize| s.get((n * q / 100).min(n - 1)).copied().unwrap_or(0);
    let sum: u128 = s.iter().map(|&x| u128::from(x)).sum();
    Figures { n, median: at(50), p90: at(90), mean: (sum / n as u128) as u64 }
}

/// Why a benchmark stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchError {
    /// `submit` failed.
    Submit,
    /// `wait` failed.
    Wait,
    /// `alloc_buffer` failed.
    Alloc,
    /// The work's results read back wrong.
    Wrong,
}

/// Per-submit CPU cost: one sample per `submit`, `samples.len()` of them.
pub fn submit_cost<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    samples: &mut [u64],
) -> Result<Figures, BenchError> {
    let buf = dev.alloc_buffer(4096).map_err(|_| BenchError::Alloc)?;
    let va = dev.va(buf).map_err(|_| BenchError::Alloc)?;
    let q = QueueId::COPY;
    let mut last = None;
    for (i, s) in samples.iter_mut().enumerate() {
        if i % BATCH == 0 {
            if let Some(f) = last.take() {
                dev.wait(f, GUARD_NS).map_err(|_| BenchError::Wait)?;
            }
        }
        let t0 = dev.platform().now_ns();
        let f = dev
            .submit(q, &[], |cb| cb.write_data(va + 4 * (i as u64 % 1024), &[i as u32]))
            .map_err(|_| BenchError::Submit)?;
        *s = dev.platform().now_ns().saturating_sub(t0);
        last = Some(f);
    }
    if let Some(f) = last {
        dev.wait(f, GUARD_NS).map_err(|_| BenchError::Wait)?;
    }
    dev.free(buf).map_err(|_| BenchError::Alloc)?;
    Ok(figures(samples))
}

/// Doorbell -> fence round trips: `submit` + `wait`, one sample each, after
/// `warmup` untimed ones.
pub fn round_trips<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    warmup: usize,
    samples: &mut [u64],
) -> Result<Figures, BenchError> {
    let buf = dev.alloc_buffer(4096).map_err(|_| BenchError::Alloc)?;
    let va = dev.va(buf).map_err(|_| BenchError::Alloc)?;
    let q = QueueId::COPY;
    let n = samples.len();
    for i in 0..warmup + n {
        let t0 = dev.platform().now_ns();
        let f = dev.submit(q, &[], |cb| cb.write_data(va, &[i as u32])).map_err(|_| BenchError::Submit)?;
        dev.wait(f, GUARD_NS).map_err(|_| BenchError::Wait)?;
        let dt = dev.platform().now_ns().saturating_sub(t0);
        if let Some(s) = i.checked_sub(warmup).and_then(|k| samples.get_mut(k)) {
            *s = dt;
        }
    }
    dev.free(buf).map_err(|_| BenchError::Alloc)?;
    Ok(figures(samples))
}

/// What [`bursts`] measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bursts {
    /// Time from a burst's first `submit` to its last fence signalled.
    pub time: Figures,
    /// Submissions made.
    pub submissions: u64,
    /// Doorbells rung for them (`DeviceStats::doorbells`).
    pub doorbells: u64,
}

/// Bursts of `burst` submissions on COPY, each of one WRITE_DATA, then a
/// `wait` for the last: one sample per burst (after `warmup` untimed
/// bursts), and the doorbells rung per submission over the timed ones.
pub fn bursts<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    burst: usize,
    warmup: usize,
    samples: &mut [u64],
) -> Result<Bursts, BenchError> {
    let buf = dev.alloc_buffer(4096).map_err(|_| BenchError::Alloc)?;
    let va = dev.va(buf).map_err(|_| BenchError::Alloc)?;
    let q = QueueId::COPY;
    let n = samples.len();
    let (mut submissions, mut doorbells) = (0u64, 0u64);
    for i in 0..warmup + n {
        let before = dev.stats().doorbells;
        let t0 = dev.platform().now_ns();
        let mut last = None;
        for k in 0..burst {
            let word = va + 4 * (k as u64 % 1024);
            let f =
                dev.submit(q, &[], |cb| cb.write_data(word, &[i as u32])).map_err(|_| BenchError::Submit)?;
            last = Some(f);
        }
        if let Some(f) = last {
            dev.wait(f, GUARD_NS).map_err(|_| BenchError::Wait)?;
        }
        let dt = dev.platform().now_ns().saturating_sub(t0);
        if let Some(s) = i.checked_sub(warmup).and_then(|k| samples.get_mut(k)) {
            *s = dt;
            submissions = submissions.saturating_add(burst as u64);
            doorbells = doorbells.saturating_add(dev.stats().doorbells.saturating_sub(before));
        }
    }
    dev.free(buf).map_err(|_| BenchError::Alloc)?;
    Ok(Bursts { time: figures(samples), submissions, doorbells })
}

/// Submit -> GPU write, seen by the CPU: `submit` of one WRITE_DATA on
/// COPY, then [`DeviceCore::service`] and a read of the written word until
/// it holds the new value (no wait and no query on the fence, which would
/// flush a held submission at once), one sample each after `warmup`
/// untimed ones.
pub fn service_latency<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    warmup: usize,
    samples: &mut [u64],
) -> Result<Figures, BenchError> {
    let buf = dev.alloc_buffer(4096).map_err(|_| BenchError::Alloc)?;
    let va = dev.va(buf).map_err(|_| BenchError::Alloc)?;
    dev.write_words(buf, 0, &[0]).map_err(|_| BenchError::Alloc)?;
    let q = QueueId::COPY;
    let n = samples.len();
    for i in 0..warmup + n {
        let value = i as u32 + 1;
        let t0 = dev.platform().now_ns();
        let f = dev.submit(q, &[], |cb| cb.write_data(va, &[value])).map_err(|_| BenchError::Submit)?;
        loop {
            dev.service();
            if dev.read_u32(buf, 0).map_err(|_| BenchError::Alloc)? == value {
                break;
            }
            if dev.platform().now_ns().saturating_sub(t0) > GUARD_NS {
                return Err(BenchError::Wait);
            }
        }
        let dt = dev.platform().now_ns().saturating_sub(t0);
        // The fence too (its bookkeeping is not part of the sample).
        dev.wait(f, GUARD_NS).map_err(|_| BenchError::Wait)?;
        if let Some(s) = i.checked_sub(warmup).and_then(|k| samples.get_mut(k)) {
            *s = dt;
        }
    }
    dev.free(buf).map_err(|_| BenchError::Alloc)?;
    Ok(figures(samples))
}
