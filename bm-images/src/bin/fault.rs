//! Fault image: failures on purpose, for the fault tests.
//!
//! Semihosting command line (after the image name):
//!
//! - `cpu`: reads an unmapped address (GiB 4, outside the identity map)
//!   after printing `@@ FAULT_ADDR <addr>`; the exception handler prints
//!   the decoded report (class, fault status, FAR, ELR, registers) and
//!   exits with status 3.
//! - `device_loss`: submits small jobs on every queue in a loop, waiting
//!   for each; after a few prints `@@ KILL_MODEL_NOW` (the harness then
//!   kills `refgpu-sim`). When a submit or wait fails, prints
//!   `@@ DEVICE_LOST ...` with how long after the last completed fence the
//!   loss was detected, the report, and exits with status 4.
//! - `matrix`: one cell of the fault matrix (`bm_images::fault_matrix`)
//!   on the suite's device: `lasting=<mask>` names the queues whose fault
//!   outlives the run (the server's knobs are fixed at its start),
//!   `seed=<n>` the workload's seed, `kill` kills the server halfway. Then
//!   shuts the device down (leaks and DMA pages counted in
//!   `@@ SHUTDOWN leaked_buffers=<n> dma_pages=<n>`) and exits with status
//!   0 when the accounting and the shutdown hold, 1 otherwise.
//!
//! - `overrun`: the walk of `docs/debugging.md` (direct mode, MMU on):
//!   a DMA_COPY larger than its destination buffer faults on the page past
//!   its end. Prints the wait's error, the fault report and the state dump
//!   after it (`@@ REPORT overrun-fault`, `@@ REPORT state-after-overrun`),
//!   the validation mode's refusal of the same submission, the fixed copy,
//!   then a wait on a fence never submitted with the state dump while it
//!   blocks (`@@ REPORT state-deadlock`) and a wait cycle refused. Every
//!   submission is captured onto the UART as `rgcs:` hex lines. Then
//!   goes on with `cpu` if that is also given (one boot for both), else
//!   exits with status 0 when every step saw what it expected, 1
//!   otherwise (after `@@ OVERRUN_FAILED <why>`).
//!
//! Plus `polling` (default) or `msi`.
#![no_std]
#![no_main]

use bm_images::boot;
use bm_images::device_loss;
use bm_images::fault_matrix::{self, Cell};
use bm_images::suite::{print_state, Console};
use conformance::{SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_baremetal::arch::exit;
use platform_baremetal::{image_main, println};
use umd_core::config::Config;
use umd_core::debug::capture::{Capture, HexLines};
use umd_core::direct::{InPlace, MmuMode};
use umd_core::error::{SubmitError, WaitError};
use umd_core::mem::buffer::BufferDesc;
use umd_core::sync::{FenceError, QueueId};

image_main!(main);

/// Unmapped: the identity map covers GiB 0, 1 and 256 only.
const UNMAPPED: usize = 0x1_0000_0040;

/// The memory of the device of `device_loss` and of `matrix` (one runs per boot).
static DEVICE: boot::Slot<8> = boot::slot();
static SUITE_DEVICE: boot::Slot<SUITE_CHUNKS> = boot::slot();
/// The device of `overrun`.
static OVERRUN_DEVICE: boot::Slot<8> = boot::slot();
/// Where `overrun` captures to: `rgcs:` lines on the UART.
static CAPTURE_SINK: spin::Mutex<HexLines<Console>> = spin::Mutex::new(HexLines::new(Console));

/// `overrun`'s source buffer, and the size its COPY should have had.
const SRC_BYTES: u64 = 64 << 10;
/// `overrun`'s destination buffer: smaller than the copy.
const DST_BYTES: u64 = 4 << 10;
/// A span the destination is aligned to, so that nothing is mapped after it.
const SPAN: u64 = 2 << 20;
/// How long `overrun` waits for a fence (a failure guard; a fault is seen
/// long before).
const GUARD_NS: u64 = 10_000_000_000;
/// How long `overrun` waits on the fence behind a never-submitted one
/// before it dumps the state (the wait times out by design).
const BLOCKED_NS: u64 = 50_000_000;

fn main() -> ! {
    if boot::has_arg("overrun") {
        let ok = match overrun() {
            Ok(()) => true,
            Err(why) => {
                println!("@@ OVERRUN_FAILED {why}");
                false
            }
        };
        if !boot::has_arg("cpu") {
            exit::exit(if ok { 0 } else { 1 })
        }
    }
    if boot::has_arg("cpu") {
        println!("@@ BOOT fault mode={}", boot::mode_name(boot::mode()));
        println!("@@ FAULT_ADDR {UNMAPPED:#x}");
        // SAFETY: deliberately invalid: the read faults (translation fault,
        // level 1) and the exception handler reports it and exits; it never
        // returns a value.
        let v = unsafe { (UNMAPPED as *const u64).read_volatile() };
        println!("@@ FATAL read of an unmapped address returned {v:#x}");
        exit::exit(1)
    }
    if boot::has_arg("device_loss") {
        device_loss()
    }
    if boot::has_arg("matrix") {
        matrix()
    }
    println!("@@ FATAL fault image: say `cpu`, `device_loss` or `matrix`");
    exit::exit(2)
}

fn matrix() -> ! {
    let (mut io, _mode) = boot::transport("fault");
    // A killed server is noticed by the transport's heartbeat after one
    // hang window, as by the core's hang check.
    io.loss_window_ns = SUITE_CONFIG.hang.window_ns;
    let dev = boot::device_on(&SUITE_DEVICE, io, SUITE_CONFIG, SUITE_MMU);
    let cell = Cell {
        seed: boot::arg_u64("seed").unwrap_or(conformance::faults::seed(false)),
        lasting: boot::arg_u64("lasting").and_then(|m| u8::try_from(m).ok()).unwrap_or(0),
        kill: boot::has_arg("kill"),
    };
    let Some(acc) = fault_matrix::run(&dev, cell, &|| dev.platform().check_heartbeat()) else {
        exit::exit(2)
    };
    let report = InPlace::shutdown(dev);
    let pages = boot::transport_ref().map_or(0, |t| t.dma_pages_used());
    println!("@@ SHUTDOWN leaked_buffers={} dma_pages={pages}", report.leaked_buffers);
    let clean = acc.check().is_ok() && report.leaked_buffers == 0 && pages == 0;
    exit::exit(if clean { 0 } else { 1 })
}

fn device_loss() -> ! {
    let cfg = Config::DEFAULT;
    let (mut io, _mode) = boot::transport("fault");
    // The transport's heartbeat check gives up after one hang window, like
    // the core's hang check.
    io.loss_window_ns = cfg.hang.window_ns;
    let dev = boot::device_on(&DEVICE, io, cfg, MmuMode::DEFAULT);
    device_loss::run(&dev, cfg.hang.window_ns, &|| dev.platform().is_lost())
}

/// The walk of `docs/debugging.md` on the bare-metal device; `Err` names
/// the step that did not see what it expected.
fn overrun() -> Result<(), &'static str> {
    let dev = boot::device_on(&OVERRUN_DEVICE, boot::transport("fault").0, Config::DEFAULT, MmuMode::DEFAULT);
    let Some(sink) = CAPTURE_SINK.try_lock() else { return Err("the capture sink is taken") };
    let sink: &'static mut HexLines<Console> = spin::mutex::MutexGuard::leak(sink);
    dev.start_capture(Capture::to_sink(sink));
    let src = dev.alloc(&BufferDesc::new(SRC_BYTES).tag("src")).map_err(|_| "alloc src")?;
    // A free 2 MiB-aligned span for the destination, so that nothing is
    // mapped right after it (a buffer freed before any use is unmapped at once).
    let hole = dev.alloc(&BufferDesc::new(SPAN).align(SPAN)).map_err(|_| "alloc hole")?;
    dev.free(hole).map_err(|_| "free hole")?;
    let dst = dev.alloc(&BufferDesc::new(DST_BYTES).align(SPAN).tag("dst")).map_err(|_| "alloc dst")?;
    let s = dev.va(src).map_err(|_| "va src")?;
    let d = dev.va(dst).map_err(|_| "va dst")?;
    let page = [0x5Au8; 4096];
    for off in (0..SRC_BYTES).step_by(page.len()) {
        dev.write(src, off, &page).map_err(|_| "write src")?;
    }
    println!("@@ OVERRUN buffers src={s:#x}+{SRC_BYTES} dst={d:#x}+{DST_BYTES}");

    // The bug: the copy's size is the source's, not the destination's.
    let f = dev.submit(QueueId::COPY, &[], |cb| cb.copy(s, d, SRC_BYTES)).map_err(|_| "submit")?;
    println!("@@ OVERRUN submitted fence {} COPY {SRC_BYTES} bytes {s:#x} -> {d:#x}", f.id);
    match dev.wait(f, GUARD_NS) {
        Err(e @ WaitError::Failed(FenceError::Fault(_))) => println!("@@ OVERRUN wait: Err({e})"),
        Ok(()) => return Err("the overrun completed"),
        Err(_) => return Err("the overrun's wait failed without a fault"),
    }
    match dev.query(f) {
        Ok(st) => println!("@@ OVERRUN query: {st:?}"),
        Err(_) => return Err("query"),
    }
    let Some(report) = dev.last_hang() else { return Err("no fault report") };
    println!("@@ REPORT overrun-fault BEGIN");
    println!("{report}");
    println!("@@ REPORT END");
    print_state(&dev, "state-after-", "overrun");

    // The validation mode refuses the same submission before the GPU sees it.
    dev.set_validation(true).map_err(|_| "validation not compiled in")?;
    match dev.submit(QueueId::COPY, &[], |cb| cb.copy(s, d, SRC_BYTES)) {
        Err(SubmitError::Invalid(e)) => println!("@@ OVERRUN validation: {e}"),
        Ok(_) => return Err("validation let the overrun through"),
        Err(_) => return Err("validation refused it for another reason"),
    }

    // The fix: the copy's size is the destination's.
    let fixed = dev.submit(QueueId::COPY, &[], |cb| cb.copy(s, d, DST_BYTES)).map_err(|_| "fixed submit")?;
    dev.wait(fixed, GUARD_NS).map_err(|_| "the fixed copy failed")?;
    let mut out = [0u8; DST_BYTES as usize];
    dev.read(dst, 0, &mut out).map_err(|_| "read dst")?;
    if out.iter().any(|b| *b != 0x5A) {
        return Err("the fixed copy's data");
    }
    dev.set_validation(false).map_err(|_| "validation off")?;
    println!(
        "@@ OVERRUN fixed: fence {} signalled, {DST_BYTES} bytes copied and checked (validation on)",
        fixed.id
    );

    // A deadlock: GFX waits for a COMPUTE fence nobody submitted.
    let ghost = dev.next_fence(QueueId::COMPUTE).ok_or("next fence")?;
    let blocked =
        dev.submit(QueueId::GFX, &[ghost], |cb| cb.write_data(d, &[0xB10C])).map_err(|_| "blocked submit")?;
    match dev.wait(blocked, BLOCKED_NS) {
        Err(WaitError::Timeout) => println!("@@ DEADLOCK wait for {}: Err(timed out)", blocked.id),
        _ => return Err("the blocked wait did not time out"),
    }
    print_state(&dev, "", "state-deadlock");
    // Closing the cycle (COMPUTE after the blocked GFX fence) is refused.
    match dev.submit(QueueId::COMPUTE, &[blocked], |cb| cb.write_data(d + 4, &[1])) {
        Err(e @ SubmitError::Cycle(_)) => println!("@@ DEADLOCK refused: Err({e})"),
        _ => return Err("the cycle was not refused"),
    }
    // Submitting the producer releases it.
    let producer =
        dev.submit(QueueId::COMPUTE, &[], |cb| cb.write_data(d + 4, &[1])).map_err(|_| "producer")?;
    dev.wait(blocked, GUARD_NS).map_err(|_| "the released wait")?;
    println!("@@ DEADLOCK released by {}: {} signalled", producer.id, blocked.id);
    let _ = dev.stop_capture();
    dev.free(src).map_err(|_| "free src")?;
    dev.free(dst).map_err(|_| "free dst")?;
    Ok(())
}
