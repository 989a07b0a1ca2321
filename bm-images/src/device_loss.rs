//! The `device_loss` case of the fault images (aarch64 `fault`, Cortex-M
//! `m-fault`): small jobs on every queue until the harness kills the model,
//! then how long the driver took to see the device gone.

use platform_baremetal::arch::{exit, timer};
use platform_baremetal::println;
use umd_core::engine::{Backend, DeviceCore};
use umd_core::sync::QueueId;

/// Exit status when the device was lost (and reported).
pub const EXIT_DEVICE_LOST: i32 = 4;

/// Submits a one-dword WRITE_DATA on queue `i % 3` and waits for it, for
/// `i` = 0, 1, ...; after 20 prints `@@ KILL_MODEL_NOW` (the harness then
/// kills `refgpu-sim`). The first failed submit or wait prints
/// `@@ DEVICE_LOST detected <ms> ms after the last completed fence (hang
/// window <ms> ms): submit|wait: <error>`, the loss flags
/// (`transport_lost`: the transport's own view), the hang report and the
/// statistics, and exits with [`EXIT_DEVICE_LOST`]. Exits 2 when the buffer
/// can not be had, 1 when the device is never lost.
pub fn run<B: Backend + Sync, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    window_ns: u64,
    transport_lost: &dyn Fn() -> bool,
) -> ! {
    let va = match dev.alloc_buffer(4096).map(|b| dev.va(b)) {
        Ok(Ok(va)) => va,
        _ => {
            println!("@@ FATAL alloc");
            exit::exit(2)
        }
    };
    let mut last_ok = timer::now_ns();
    for i in 0..1_000_000u64 {
        if i == 20 {
            println!("@@ KILL_MODEL_NOW after {i} fences");
        }
        let q = QueueId((i % 3) as u8);
        let err = match dev.submit(q, &[], |cb| cb.write_data(va + 4 * (i % 1024), &[i as u32])) {
            Ok(f) => match dev.wait(f, 30_000_000_000) {
                Ok(()) => None,
                Err(e) => Some(Err(e)),
            },
            Err(e) => Some(Ok(e)),
        };
        let Some(err) = err else {
            last_ok = timer::now_ns();
            continue;
        };
        let ms = timer::now_ns().saturating_sub(last_ok) / 1_000_000;
        let window_ms = window_ns / 1_000_000;
        match err {
            Ok(e) => println!(
                "@@ DEVICE_LOST detected {ms} ms after the last completed fence (hang window {window_ms} ms): submit: {e}"
            ),
            Err(e) => println!(
                "@@ DEVICE_LOST detected {ms} ms after the last completed fence (hang window {window_ms} ms): wait: {e}"
            ),
        }
        println!("device lost: {}, transport lost: {}", dev.is_lost(), transport_lost());
        if let Some(h) = dev.last_hang() {
            println!("{h}");
        }
        println!("stats: {:?}", dev.stats());
        exit::exit(EXIT_DEVICE_LOST)
    }
    println!("@@ FATAL the device was never lost");
    exit::exit(1)
}
