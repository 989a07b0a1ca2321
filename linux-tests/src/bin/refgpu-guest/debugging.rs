//! The kernel-mode walk of `docs/debugging.md`: a DMA_COPY larger than
//! its destination buffer, through `umd-core` on the kernel driver. The
//! guide is compiled into the guest binary, and on gen2 (the generation
//! the guide quotes) every block quoting the guest run (`check=guest-*`)
//! is checked against what this run printed, read from the kernel log and
//! the devcoredump, and decoded from the capture, so the guide's
//! kernel-mode half cannot drift from the driver. On gen1 the walk runs
//! with its own checks (the fault, the refusal, the fix, a devcoredump).

use conformance::SUITE_CONFIG;
use platform_linux::Drm;
use umd_core::debug::capture::Capture;
use umd_core::engine::dump::DumpFormat;
use umd_core::error::{SubmitError, WaitError};
use umd_core::kernel::KernelDevice;
use umd_core::mem::buffer::BufferDesc;
use umd_core::storage::DeviceStorage;
use umd_core::sync::{FenceError, QueueId};
use umd_dump::capture::IoSink;
use vm_harness::guide;

use crate::{ensure, fixture, R};

/// The guide, as built into this binary.
const GUIDE: &str = include_str!("../../../../docs/debugging.md");

/// Where the walk writes its capture (the guide's `umd-dump` command names it).
const CAPTURE: &str = "/tmp/overrun.rgcs";
/// Where the walk saves the devcoredump (the guide's `umd-dump` command names it).
const DEVCOREDUMP: &str = "/tmp/refgpu.devcd";
/// The source buffer, and the size the copy should have had.
const SRC_BYTES: u64 = 64 << 10;
/// The destination buffer: smaller than the copy.
const DST_BYTES: u64 = 4 << 10;
/// A span the destination is aligned to, so that nothing is mapped after it.
const SPAN: u64 = 2 << 20;
/// A failure guard for each wait.
const GUARD_NS: u64 = 10_000_000_000;

/// The kernel log's `refgpu` records whose sequence number is above
/// `after` (each record's first line), and the last sequence number read.
fn kernel_log(after: u64) -> Result<(Vec<String>, u64), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .map_err(|e| format!("/dev/kmsg: {e}"))?;
    let recs = crate::tests::read_records(&mut f);
    let last = recs.iter().map(|(_, seq, _)| *seq).fold(after, u64::max);
    let out = recs
        .into_iter()
        .filter(|(_, seq, m)| *seq > after && m.contains("refgpu"))
        .map(|(_, _, m)| m)
        .collect();
    Ok((out, last))
}

/// Checks every guide block named `name` against `output`.
fn check_blocks(blocks: &[guide::Block], name: &str, output: &str) -> R {
    for b in guide::named(blocks, name)? {
        guide::check(b, output)?;
    }
    Ok(())
}

/// The walk: the overrun faults (`check=guest-run` quotes the lines this
/// test prints), the kernel log says so (`check=guest-dmesg`), the
/// devcoredump holds the engine's state and the IB (`check=guest-devcoredump`),
/// the guide's `umd-dump` commands decode it and the capture, both naming
/// the copy (`check=guest-umd-dump`), the state dump lists the fault and the
/// buffers (`check=guest-state`), validation refuses the same submission
/// and the fixed size passes (in `guest-run`).
pub fn dma_overrun_walk() -> R {
    let blocks = guide::blocks(GUIDE);
    fixture::clear_devcoredumps()?;
    let (_, seen) = kernel_log(0)?;
    let drm = Drm::open_default().map_err(|e| format!("opening the render node: {e}"))?;
    let file = std::fs::File::create(CAPTURE).map_err(|e| format!("{CAPTURE}: {e}"))?;
    let mut sink = IoSink::new(std::io::BufWriter::new(file));
    let mut storage: Box<DeviceStorage<64, 128, 32, 64>> = Box::default();
    let dev = KernelDevice::<Drm, 4>::new(&drm, &mut storage, SUITE_CONFIG).map_err(|e| e.to_string())?;
    dev.start_capture(Capture::to_sink(&mut sink));
    let mut run = Vec::new();
    let mut say = |line: String| {
        println!("{line}");
        run.push(line);
    };
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let src = dev.alloc(&BufferDesc::new(SRC_BYTES).tag("src")).map_err(|x| e(&x))?;
    let hole = dev.alloc(&BufferDesc::new(SPAN).align(SPAN)).map_err(|x| e(&x))?;
    dev.free(hole).map_err(|x| e(&x))?;
    let dst = dev.alloc(&BufferDesc::new(DST_BYTES).align(SPAN).tag("dst")).map_err(|x| e(&x))?;
    let (s, d) = (dev.va(src).map_err(|x| e(&x))?, dev.va(dst).map_err(|x| e(&x))?);
    dev.write(src, 0, &vec![0x5A; SRC_BYTES as usize]).map_err(|x| e(&x))?;
    say(format!("@@ OVERRUN buffers src={s:#x}+{SRC_BYTES} dst={d:#x}+{DST_BYTES}"));

    // The bug: the copy's size is the source's, not the destination's.
    let f = dev.submit(QueueId::COPY, &[], |cb| cb.copy(s, d, SRC_BYTES)).map_err(|x| e(&x))?;
    say(format!("@@ OVERRUN submitted fence {} COPY {SRC_BYTES} bytes {s:#x} -> {d:#x}", f.id));
    match dev.wait(f, GUARD_NS) {
        Err(w @ WaitError::Failed(FenceError::Fault(_))) => say(format!("@@ OVERRUN wait: Err({w})")),
        r => return Err(format!("the overrun's wait: {r:?}")),
    }
    say(format!("@@ OVERRUN query: {:?}", dev.query(f).map_err(|x| e(&x))?));
    let mut state = String::new();
    dev.dump_state(&mut state, DumpFormat::Text).map_err(|x| e(&x))?;

    dev.set_validation(true).map_err(|x| e(&x))?;
    match dev.submit(QueueId::COPY, &[], |cb| cb.copy(s, d, SRC_BYTES)) {
        Err(SubmitError::Invalid(v)) => say(format!("@@ OVERRUN validation: {v}")),
        r => return Err(format!("validation let the overrun through: {r:?}")),
    }
    let fixed = dev.submit(QueueId::COPY, &[], |cb| cb.copy(s, d, DST_BYTES)).map_err(|x| e(&x))?;
    dev.wait(fixed, GUARD_NS).map_err(|x| format!("the fixed copy: {x}"))?;
    let mut out = vec![0u8; DST_BYTES as usize];
    dev.read(dst, 0, &mut out).map_err(|x| e(&x))?;
    ensure!(out.iter().all(|b| *b == 0x5A), "the fixed copy's data");
    dev.set_validation(false).map_err(|x| e(&x))?;
    say(format!(
        "@@ OVERRUN fixed: fence {} signalled, {DST_BYTES} bytes copied and checked (validation on)",
        fixed.id
    ));
    let _ = dev.stop_capture();
    dev.free(src).map_err(|x| e(&x))?;
    dev.free(dst).map_err(|x| e(&x))?;
    ensure!(dev.shutdown().leaked_buffers == 0, "leaked buffers");
    sink.into_inner().into_inner().map_err(|x| format!("{CAPTURE}: {}", x.error()))?;

    if drm.generation() != 2 {
        // The guide quotes a gen2 run; on gen1 the walk's own checks above
        // (the fault, the refusal, the fix) are the test, and the
        // devcoredump must still be there.
        let _ = std::fs::remove_file(CAPTURE);
        return fixture::take_devcoredump().map(|_| ());
    }
    check_blocks(&blocks, "guest-run", &run.join("\n"))?;
    check_blocks(&blocks, "guest-state", &state)?;
    let dump = fixture::take_devcoredump()?;
    check_blocks(&blocks, "guest-devcoredump", &dump)?;
    std::fs::write(DEVCOREDUMP, &dump).map_err(|x| format!("{DEVCOREDUMP}: {x}"))?;
    let (log, _) = kernel_log(seen)?;
    check_blocks(&blocks, "guest-dmesg", &log.join("\n"))?;
    // The guide's commands, run on the capture and the devcoredump this
    // walk saved: the same renderings as the `umd-dump` binary's.
    for b in guide::named(&blocks, "guest-umd-dump")? {
        let mut text = String::new();
        for c in b.commands() {
            let path = c.strip_prefix("umd-dump ").ok_or(format!("not a umd-dump command: {c}"))?;
            let bytes = std::fs::read(path.trim()).map_err(|x| format!("{path}: {x}"))?;
            if umd_dump::devcoredump::is_devcoredump(&bytes) {
                let d = umd_dump::devcoredump::parse(&bytes).map_err(|x| format!("{path}: {x}"))?;
                text += &umd_dump::devcoredump::render_text(&d);
            } else {
                text += &umd_dump::capture::render_text(&bytes)?;
            }
        }
        ensure!(!b.commands().is_empty(), "guide block at line {} runs no command", b.line);
        guide::check(b, &text)?;
    }
    let _ = std::fs::remove_file(CAPTURE);
    let _ = std::fs::remove_file(DEVCOREDUMP);
    Ok(())
}
