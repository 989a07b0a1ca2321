//! One cell of the fault matrix on bare metal, shared by the `fault`
//! (aarch64, ivshmem) and `m-fault` (Cortex-M4, shared RAM) images:
//! `conformance::faults`' seeded workload while `refgpu-sim` injects the
//! fault it was started with, then the accounting printed for the host
//! test (`qemu-tests/tests/faults.rs`, `tests/cortex_m.rs`).
//!
//! Lines: `@@ KILL_MODEL_NOW` halfway when the cell kills the server (the
//! harness then kills `refgpu-sim`; the image goes on once its transport
//! has seen the model's heartbeat stop, as the co-simulation matrix goes on
//! once the server is gone), `@@ ACCOUNTING <key>=<n> ...` and
//! `@@ CHECK ok` or `@@ CHECK FAILED <what broke>`.

use conformance::faults::{self, Accounting, Workload};
use platform_baremetal::arch::timer;
use platform_baremetal::println;
use umd_core::engine::{Backend, DeviceCore};

use crate::suite::Console;

/// Submissions of a cell (as in the hosted matrices).
pub const JOBS: usize = 48;

/// A cell's parameters (from the image's command line).
#[derive(Clone, Copy, Debug)]
pub struct Cell {
    /// The workload's seed.
    pub seed: u64,
    /// Queues (bit mask) whose fault outlives the run.
    pub lasting: u8,
    /// Ask for the server to be killed halfway.
    pub kill: bool,
}

/// Runs the cell on `dev` and prints its accounting and check. `alive`
/// polls the transport's heartbeat check (false once the model is seen
/// gone). `None` when the workload could not start (printed as
/// `@@ FATAL`).
pub fn run<B: Backend + Sync, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    cell: Cell,
    alive: &dyn Fn() -> bool,
) -> Option<Accounting> {
    let w = Workload { seed: cell.seed, jobs: JOBS, impaired_after: cell.lasting };
    let mut midway = || {
        if cell.kill {
            println!("@@ KILL_MODEL_NOW after {} submissions", JOBS / 2);
            let t0 = timer::now_ns();
            while alive() && timer::now_ns().saturating_sub(t0) < faults::GUARD_NS {
                core::hint::spin_loop();
            }
            println!("model seen gone: {}", !alive());
        }
    };
    let acc = match faults::run(dev, w, &mut midway, &mut || {}, &mut Console) {
        Ok(acc) => acc,
        Err(e) => {
            println!("@@ FATAL the workload did not start: {e}");
            return None;
        }
    };
    println!(
        "@@ ACCOUNTING submitted={} signalled={} hung={} fault={} lost_device={} never={} dependency={} lost={} wrong_data={} refused={} unexpected={} leaked={} waiting={} busy_chunks={} probe_failures={} device_lost={} usable={}",
        acc.submitted,
        acc.signalled,
        acc.failed_hung,
        acc.failed_fault,
        acc.failed_lost,
        acc.failed_never,
        acc.failed_dependency,
        acc.lost,
        acc.wrong_data,
        acc.refused,
        acc.unexpected_refusals,
        acc.leaked_buffers,
        acc.frees_waiting,
        acc.chunks_busy,
        acc.probe_failures,
        u8::from(acc.device_lost),
        u8::from(acc.usable_after)
    );
    match acc.check() {
        Ok(()) => println!("@@ CHECK ok"),
        Err(e) => println!("@@ CHECK FAILED {e}"),
    }
    Some(acc)
}
