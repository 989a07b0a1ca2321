//! The C API's firmware (`umd-capi/firmware/m4`, written in C, built with
//! Debian's `gcc-arm-none-eabi` and picolibc, linking `libumd_capi.a` for
//! `thumbv7em-none-eabihf`) on the Cortex-M4 of QEMU `mps2-an386`, the GPU
//! in the board's shared RAM through the C transport: buffers, a copy, a
//! dispatch behind a cross-queue wait, an event, an injected hang reported
//! and recovered (every output word checked), the state dump printed after
//! that hang, and shutdown with the leak report, on both generations;
//! before bring-up, that the transport keeps writes of the read-write
//! ENGINE_ROOT registers.

use qemu_tests::{boot, c_firmware, Run, Status};

fn runs(generation: u8) {
    let elf = c_firmware().unwrap_or_else(|e| panic!("{e}"));
    let image: &'static str = Box::leak(elf.display().to_string().into_boxed_str());
    let out = boot(&Run::cortex_m(image, generation)).unwrap_or_else(|e| panic!("gen{generation}: {e}"));
    let tail = out.tail(30);
    for name in ["c_engine_roots", "c_workload", "c_dump", "c_shutdown"] {
        assert_eq!(out.boot.status(name), Some(&Status::Pass), "gen{generation}: {name}\n{tail}");
    }
    for line in [
        "dispatch after a cross-queue wait: 1024 words checked",
        "hang reported",
        "recovered: 1024 words checked",
        "state dump (ok, ",
        "reason: no progress for ",
        "kind: hang",
    ] {
        assert!(
            out.boot.console.iter().any(|l| l.contains(line)),
            "gen{generation}: no line {line:?}\n{tail}"
        );
    }
    assert_eq!(out.boot.exit_code, Some(0), "gen{generation}: exit status\n{tail}");
}

#[test]
fn c_firmware_gen1() {
    runs(1);
}

#[test]
fn c_firmware_gen2() {
    runs(2);
}
