//! The driver core in kernel mode on the real kernel driver: the whole
//! conformance suite on a `KernelDevice` over platform-linux's DRM
//! platform, and the core's kernel-mode features the suite does not reach
//! (sync_file export and import, context status after a reset).

use std::os::fd::AsFd;
use std::time::Instant;

use conformance::{run_all, Env, Outcome, SCENARIO_NAMES, SUITE_CHUNKS, SUITE_CONFIG};
use platform_linux::suite::StdThreads;
use platform_linux::Drm;
use umd_core::engine::{Backend, DeviceCore, Submit};
use umd_core::error::WaitError;
use umd_core::kernel::KernelDevice;
use umd_core::platform::ContextStatus;
use umd_core::storage::DeviceStorage;
use umd_core::sync::{FenceError, QueueId};

use crate::{ensure, R};

fn drm() -> Result<Drm, String> {
    Drm::open_default().map_err(|e| format!("opening the render node: {e}"))
}

/// Every conformance scenario in kernel mode; one `@@ SCENARIO` line each.
pub fn conformance_kernel_mode() -> R {
    conformance_in_kernel_mode(false)
}

/// The same with umd-core's validation mode on: no scenario's correct
/// work is refused, and `dma_overrun_caught` and `dispatch_on_wrong_queue`
/// see the refusals (the same boot: no guest boot of its own).
pub fn conformance_kernel_mode_validation() -> R {
    conformance_in_kernel_mode(true)
}

fn conformance_in_kernel_mode(validation: bool) -> R {
    let drm = drm()?;
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev = KernelDevice::<Drm, SUITE_CHUNKS>::new(&drm, &mut storage, SUITE_CONFIG)
        .map_err(|e| format!("kernel-mode device: {e}"))?;
    if validation {
        dev.set_validation(true).map_err(|e| e.to_string())?;
    }
    let label = if validation { "kernel-mode-validation" } else { "kernel-mode" };
    let env = Env { parallel: Some(&StdThreads) };
    let (mut failed, mut seen) = (Vec::new(), Vec::new());
    run_all(&dev, &env, |r| {
        println!("@@ SCENARIO {label} {r}");
        seen.push(r.name);
        match r.outcome {
            Outcome::Pass => {}
            Outcome::Skip if !r.detail.as_str().is_empty() => {}
            _ => failed.push(r.name),
        }
    });
    ensure!(seen == SCENARIO_NAMES, "scenarios reported: {seen:?}");
    ensure!(failed.is_empty(), "{label} failed: {}", failed.join(", "));
    ensure!(dev.validation() == validation, "the suite left validation {}", dev.validation());
    let report = dev.shutdown();
    ensure!(report.leaked_buffers == 0, "the suite leaked {} buffers", report.leaked_buffers);
    Ok(())
}

/// A fence exported as a sync_file is waited for by a submission that
/// imports it (the round trip another process or device would make), and
/// a hang's context is replaced and reported.
pub fn kernel_mode_sync_files_and_reset_status() -> R {
    let drm = drm()?;
    let mut storage: Box<DeviceStorage<64, 128, 32, 64>> = Box::default();
    let dev = KernelDevice::<Drm, 4>::new(&drm, &mut storage, SUITE_CONFIG).map_err(|e| e.to_string())?;
    let buf = dev.alloc_buffer(4096).map_err(|e| e.to_string())?;
    let va = dev.va(buf).map_err(|e| e.to_string())?;
    let a = dev.submit(QueueId::COPY, &[], |cb| cb.write_data(va, &[0x1234])).map_err(|e| e.to_string())?;
    let point = dev.sync_point(a).map_err(|e| e.to_string())?;
    let file = drm.export_sync_file(point).map_err(|e| format!("export: {e}"))?;
    let foreign = drm.import_sync_file(file.as_fd()).map_err(|e| format!("import: {e}"))?;
    let waits = [foreign];
    let b = dev
        .submit_with(&Submit::on(QueueId::COMPUTE).after_foreign(&waits), |cb| {
            cb.write_data(va + 4, &[0x5678])
        })
        .map_err(|e| e.to_string())?;
    dev.wait(b, 5_000_000_000).map_err(|e| e.to_string())?;
    ensure!(dev.read_u32(buf, 0) == Ok(0x1234), "the exported fence's work");
    ensure!(dev.read_u32(buf, 1) == Ok(0x5678), "the importer's work");
    drm.release_foreign(foreign);
    // A hang: the kernel times the job out and marks its context guilty;
    // the core fails the fence and replaces the context.
    let hang = dev
        .submit(QueueId::GFX, &[], |cb| {
            cb.push(&umd_core::cmd::Command::WaitMem {
                addr: va + 8,
                reference: 1,
                mask: 0xFFFF_FFFF,
                op: umd_core::cmd::CompareOp::Eq,
                wide: false,
            })
        })
        .map_err(|e| e.to_string())?;
    match dev.wait(hang, 10_000_000_000) {
        Err(WaitError::Failed(FenceError::DeviceHung)) => {}
        r => return Err(format!("the hang's fence: {r:?}")),
    }
    ensure!(dev.context_status(QueueId::GFX) == Ok(ContextStatus::Ok), "a new context after the reset");
    let after =
        dev.submit(QueueId::GFX, &[], |cb| cb.write_data(va + 12, &[9])).map_err(|e| e.to_string())?;
    dev.wait(after, 5_000_000_000).map_err(|e| e.to_string())?;
    ensure!(dev.read_u32(buf, 3) == Ok(9), "the queue after the reset");
    // The state dump names the kernel's reset and the failed fence.
    let mut state = String::new();
    let _ = dev.dump_state(&mut state, umd_core::engine::dump::DumpFormat::Text);
    ensure!(
        state.contains("reason: reset by the kernel driver")
            && state.contains("error: queue hung and was reset"),
        "the state dump after the hang:\n{state}"
    );
    dev.free(buf).map_err(|e| e.to_string())?;
    ensure!(dev.shutdown().leaked_buffers == 0, "leaks");
    // The devcoredump the hang produced belongs to this test.
    let _ = crate::fixture::clear_devcoredumps();
    Ok(())
}

/// Submissions timed by `bench_umd_submit_kernel_vs_direct`.
const N: usize = 2000;
/// Submissions between two waits.
const BATCH: usize = 100;

/// Nanoseconds spent in `N` submissions of one WRITE_DATA each on `dev`
/// (in batches of `BATCH`, waiting for each batch's last fence untimed);
/// checks the last write landed.
fn time_submits<B: Backend, const C: usize>(dev: &DeviceCore<'_, B, C>, what: &str) -> Result<f64, String> {
    let buf = dev.alloc_buffer(4096).map_err(|e| e.to_string())?;
    let va = dev.va(buf).map_err(|e| e.to_string())?;
    let mut ns = 0f64;
    for b in 0..N / BATCH {
        let t0 = Instant::now();
        let mut last = None;
        for i in 0..BATCH {
            let v = (b * BATCH + i) as u32;
            last = Some(
                dev.submit(QueueId::COPY, &[], |cb| cb.write_data(va, &[v])).map_err(|e| e.to_string())?,
            );
        }
        ns += t0.elapsed().as_nanos() as f64;
        if let Some(f) = last {
            dev.wait(f, 10_000_000_000).map_err(|e| e.to_string())?;
        }
    }
    ensure!(dev.read_u32(buf, 0) == Ok((N - 1) as u32), "{what}'s last write");
    dev.free(buf).map_err(|e| e.to_string())?;
    Ok(ns)
}

/// The CPU cost of one submission through the driver core, in kernel mode
/// (record into the IB pool, `SUBMIT` with a timeline out-sync) against
/// direct mode (record, ring write, doorbell) on the in-process model of
/// the same generation on this guest's CPU, against the raw SUBMIT it
/// issues (`time_raw_submits`) and against a null ioctl
/// (`DRM_IOCTL_VERSION`). Same work: one WRITE_DATA per submission. Also
/// counts the ioctls a kernel-mode submission makes (`Drm::ioctls`) and
/// fails unless it is one: its SUBMIT.
pub fn bench_umd_submit_kernel_vs_direct() -> R {
    use platform_linux::InProcess;
    use refgpu_model::{Generation as ModelGen, ModelConfig};
    use umd_core::direct::{Device, MmuMode};

    let drm = drm()?;
    let gen = if drm.generation() == 1 { ModelGen::Gen1 } else { ModelGen::Gen2 };
    let cfg = umd_core::config::Config { use_irq: false, ..SUITE_CONFIG };

    // Kernel mode.
    let mut ks: Box<DeviceStorage<64, 128, 32, 64>> = Box::default();
    let kdev = KernelDevice::<Drm, 16>::new(&drm, &mut ks, cfg).map_err(|e| e.to_string())?;
    let kernel_ns = time_submits(&kdev, "kernel mode")?;
    let ioctls = ioctls_per_submission(&drm, &kdev)?;
    drop(kdev);

    // Direct mode, in-process model.
    let model = InProcess::new(ModelConfig { generation: gen, mem_size: 64 << 20, ..ModelConfig::default() })
        .map_err(|e| format!("model: {e}"))?;
    let mut ds: Box<DeviceStorage<64, 128, 32, 64>> = Box::default();
    let ddev: Device<'_, InProcess, 16> =
        Device::new(&model, &mut ds, cfg, MmuMode::DEFAULT).map_err(|e| e.to_string())?;
    let direct_ns = time_submits(&ddev, "direct mode")?;
    drop(ddev);

    let raw_submit_ns = time_raw_submits()?;

    // A null ioctl (one DRM_IOCTL_VERSION without buffers).
    let raw = crate::drm::Dev::open().map_err(|e| format!("open: errno {e}"))?;
    let t0 = Instant::now();
    for _ in 0..N {
        raw.version_null().map_err(|e| format!("VERSION: errno {e}"))?;
    }
    let null_ns = t0.elapsed().as_nanos() as f64 / N as f64;
    let (k, d, r) = (kernel_ns / N as f64, direct_ns / N as f64, raw_submit_ns / N as f64);
    println!(
        "@@ BENCH umd_submit_kernel_vs_direct kernel_mode_ns={k:.0} direct_mode_ns={d:.0} raw_submit_ns={r:.0} null_ioctl_ns={null_ns:.0} kernel/direct={:.1} kernel/raw_submit={:.2} kernel/null_ioctl={:.1} raw_submit/null_ioctl={:.1} ioctls_per_submission={ioctls:.2} n={N}",
        k / d,
        k / r,
        k / null_ns,
        r / null_ns
    );
    ensure!(ioctls == 1.0, "kernel mode made {ioctls:.2} ioctls per submission, not one SUBMIT");
    Ok(())
}

/// Nanoseconds spent in `N` raw SUBMITs of what a kernel-mode submission
/// hands the kernel (an IB of one WRITE_DATA on COPY, its own point of a
/// timeline syncobj as out-sync), on a file of their own, in batches of
/// `BATCH` with a wait for each batch's last point untimed, as
/// `time_submits` does; checks the last write landed.
fn time_raw_submits() -> Result<f64, String> {
    let mut fx = crate::fixture::Fx::new()?;
    let ctx = fx.ctx(refgpu_uapi::engine::COPY)?;
    let va = crate::fixture::DATA_VA;
    let mut ns = 0f64;
    for b in 0..N / BATCH {
        // The IBs first, untimed: the kernel-mode figure's recording is
        // the core's, this one's is not the kernel's.
        let mut ibs = Vec::with_capacity(BATCH);
        for i in 0..BATCH {
            ibs.push(fx.ib(&[crate::tests::write_data(va, &[(b * BATCH + i) as u32])])?);
        }
        let (s, mut point) = (fx.sync, fx.point);
        let t0 = Instant::now();
        for (ib, dw) in ibs {
            point += 1;
            fx.dev.submit(ctx, ib, dw, s, point).map_err(|e| format!("SUBMIT: errno {e}"))?;
        }
        ns += t0.elapsed().as_nanos() as f64;
        fx.point = point;
        fx.wait(point)?;
    }
    ensure!(fx.data.map.r32(0) == (N - 1) as u32, "the raw SUBMITs' last write");
    Ok(ns)
}

/// The ioctls `dev` makes per submission on `drm` (`Drm::ioctls`), over
/// `BATCH` submissions of one WRITE_DATA with no wait among them (the
/// wait after them not counted).
fn ioctls_per_submission(drm: &Drm, dev: &KernelDevice<'_, Drm, 16>) -> Result<f64, String> {
    let buf = dev.alloc_buffer(4096).map_err(|e| e.to_string())?;
    let va = dev.va(buf).map_err(|e| e.to_string())?;
    let before = drm.ioctls();
    let mut last = None;
    for i in 0..BATCH {
        last = Some(
            dev.submit(QueueId::COPY, &[], |cb| cb.write_data(va, &[i as u32])).map_err(|e| e.to_string())?,
        );
    }
    let calls = drm.ioctls() - before;
    if let Some(f) = last {
        dev.wait(f, 10_000_000_000).map_err(|e| e.to_string())?;
    }
    dev.free(buf).map_err(|e| e.to_string())?;
    Ok(calls as f64 / BATCH as f64)
}

/// The batch window through umd-core's kernel mode
/// (`Config::batch_window_ns`, `docs/architecture.md`, "Deferred
/// doorbells"), off and on, on a device of its own each (a `Drm` each:
/// the platform's timelines live in the `Drm`): bursts of 8 submissions
/// then a wait for the last (`bm_images::bench::bursts`: the submit calls
/// made to the kernel per submission, `DeviceStats::doorbells`, and the
/// burst's time to its last fence), and submit -> GPU write seen with only
/// `service` calls (`bm_images::bench::service_latency`: the window's cost
/// to a caller that never waits). One `@@ BENCH umd_batch_window` line per
/// window. Fails when the window off makes other than one submit call per
/// submission, or the window on does not make fewer.
pub fn bench_umd_batch_window() -> R {
    use bm_images::bench::{bursts, service_latency};

    // Long enough that a burst's eight submissions (tens of µs each in
    // this guest) fit in one window.
    const WINDOW_NS: u64 = 5_000_000;
    let mut samples = vec![0u64; 32];
    let mut medians = Vec::new();
    for window_ns in [0, WINDOW_NS] {
        let drm = drm()?;
        let cfg = umd_core::config::Config { use_irq: false, batch_window_ns: window_ns, ..SUITE_CONFIG };
        let mut storage: Box<DeviceStorage> = Box::default();
        let dev = KernelDevice::<Drm, 16>::new(&drm, &mut storage, cfg).map_err(|e| e.to_string())?;
        let b =
            bursts(&dev, 8, 4, &mut samples).map_err(|e| format!("window {window_ns} ns: bursts: {e:?}"))?;
        let lat = service_latency(&dev, 4, &mut samples)
            .map_err(|e| format!("window {window_ns} ns: service latency: {e:?}"))?;
        let report = dev.shutdown();
        ensure!(report.leaked_buffers == 0, "window {window_ns} ns: leaked buffers");
        let per = b.doorbells as f64 / b.submissions as f64;
        println!(
            "@@ BENCH umd_batch_window window_ns={window_ns} submit_calls_per_submission={per:.3} burst8_median_ns={} service_latency_median_ns={} n={}",
            b.time.median, lat.median, b.time.n
        );
        if window_ns == 0 {
            ensure!(
                b.doorbells == b.submissions,
                "window off: {} submit calls for {} submissions",
                b.doorbells,
                b.submissions
            );
        } else {
            ensure!(
                b.doorbells < b.submissions,
                "window on: {} submit calls for {} submissions",
                b.doorbells,
                b.submissions
            );
        }
        medians.push((b.time.median, lat.median));
    }
    if let [(b0, l0), (b1, l1)] = medians[..] {
        println!(
            "@@ BENCH umd_batch_window_ratio burst8_on/off={:.2} service_latency_on/off={:.2}",
            b1 as f64 / b0.max(1) as f64,
            l1 as f64 / l0.max(1) as f64
        );
    }
    Ok(())
}

/// One kernel-mode row of the IB chunk-size sweep: a device of `C`
/// chunks with `cfg` on a render node opened for it, the workload, the
/// device shut down; the row and the generation's IB limit. Each device
/// has a `Drm` of its own: the platform's timeline syncobjs live in the
/// `Drm`, and a second device on the same one would find its fences'
/// points already signalled by the first's.
fn ib_sweep_row<const C: usize>(
    cfg: umd_core::config::Config,
    samples: &mut bm_images::ib_sweep::Samples,
) -> Result<(bm_images::ib_sweep::Row, usize), String> {
    use bm_images::ib_sweep;
    let drm = drm()?;
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev = KernelDevice::<Drm, C>::new(&drm, &mut storage, cfg)
        .map_err(|e| format!("device with {} B chunks: {e}", cfg.ib_chunk_bytes))?;
    let max_ib = ib_sweep::max_ib_bytes(dev.encoder());
    let row = ib_sweep::run(&dev, samples);
    let report = dev.shutdown();
    let row = row.map_err(|e| format!("{} B chunks: {e:?}", cfg.ib_chunk_bytes))?;
    ensure!(report.leaked_buffers == 0, "{} B chunks: leaked buffers", cfg.ib_chunk_bytes);
    Ok((row, max_ib))
}

/// The IB chunk-size sweep (`bm_images::ib_sweep`, `docs/perf.md`, "IB
/// sizing") in kernel mode: the workload the bare-metal sweep runs in
/// direct mode, on a kernel-mode device per chunk size within the
/// generation's IB limit (`ib_sweep::BASE_CONFIG` but the chunk size), the
/// whole sweep `ib_sweep::REPEATS` times; one `@@ BENCH ib_sweep` line
/// per chunk size (the repeats' medians) and `@@ BENCH
/// ib_sweep_cpu_ratio` (each row's CPU per submission over the 64 KiB
/// row's). Fails when the rows do not have the sweep's shape
/// (`ib_sweep::check_shape`).
pub fn bench_ib_sweep_kernel_mode() -> R {
    use bm_images::ib_sweep::{
        self, Row, Samples, BASELINE_CHUNK, CHUNKS, CHUNKS_ABOVE_1M, CHUNK_SIZES, REPEATS,
    };

    let mut samples = Box::new(Samples::new());
    let mut reps: Vec<Vec<Row>> = Vec::new();
    let mut max_ib = usize::MAX;
    for _ in 0..REPEATS {
        let mut k = 0;
        for chunk in CHUNK_SIZES {
            // The first device tells the generation's limit, before the
            // sizes it excludes.
            if chunk > max_ib {
                continue;
            }
            let cfg = umd_core::config::Config { ib_chunk_bytes: chunk, ..ib_sweep::BASE_CONFIG };
            let (row, limit) = if ib_sweep::chunks_for(chunk) == CHUNKS {
                ib_sweep_row::<CHUNKS>(cfg, &mut samples)?
            } else {
                ib_sweep_row::<CHUNKS_ABOVE_1M>(cfg, &mut samples)?
            };
            max_ib = limit;
            if reps.len() <= k {
                reps.push(Vec::new());
            }
            if let Some(r) = reps.get_mut(k) {
                r.push(row);
            }
            k += 1;
        }
    }
    let rows: Vec<Row> = reps.iter().filter_map(|r| ib_sweep::merge(r)).collect();
    ensure!(rows.len() == reps.len(), "the repeats of a chunk size differ in pool");
    let base =
        rows.iter().find(|r| r.chunk_bytes == BASELINE_CHUNK).map_or(1, |r| r.cpu_per_submit_ns.max(1));
    for r in &rows {
        println!("@@ BENCH {r}");
    }
    let ratios: Vec<String> = rows
        .iter()
        .map(|r| format!("{}={:.2}", r.chunk_bytes, r.cpu_per_submit_ns as f64 / base as f64))
        .collect();
    println!("@@ BENCH ib_sweep_cpu_ratio {}", ratios.join(" "));
    ib_sweep::check_shape(&rows, max_ib).map_err(|e| format!("the sweep's shape: {e}"))
}
