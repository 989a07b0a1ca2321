//! Captures end to end: a device on the scripted fake records into a
//! `.rgcs` file (`IoSink`) and into `rgcs:` hex lines among other UART
//! output; `umd-dump` prints every submission in order with its fence and
//! waits, rebuilds the file from the hex lines, and a sink on a full disk
//! (`/dev/full`) loses records without failing a submission.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use umd_core::config::Config;
use umd_core::debug::capture::{Capture, CaptureRing, HexLines};
use umd_core::direct::{Device, MmuMode};
use umd_core::hw::Generation;
use umd_core::platform::fake::{EngineFault, Fake};
use umd_core::storage::DeviceStorage;
use umd_core::sync::{FenceError, QueueId};
use umd_dump::capture::IoSink;

fn dump(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_umd-dump")).args(args).output().expect("umd-dump runs")
}

fn leak<T>(t: T) -> &'static mut T {
    Box::leak(Box::new(t))
}

fn device() -> Device<'static, Fake, 4> {
    let fake = leak(Fake::new(Generation::Gen2, 8 << 20));
    let storage: &'static mut DeviceStorage<256, 256, 64, 256> = Box::leak(Box::default());
    let cfg = Config { ring_bytes: 4096, ib_chunk_bytes: 4096, use_irq: false, ..Config::DEFAULT };
    Device::new(fake, storage, cfg, MmuMode::Bypass).expect("device comes up")
}

/// A scratch directory of this test binary (removed by the test).
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("umd-dump-capture-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_capture_file_prints_every_submission_in_order_with_fence_and_waits() {
    let dir = scratch("file");
    let path = dir.join("run.rgcs");
    let dev = device();
    let sink = leak(IoSink::new(std::fs::File::create(&path).unwrap()));
    dev.start_capture(Capture::to_sink(sink));
    let a = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    let b = dev
        .submit(QueueId::COMPUTE, &[a], |cb| (0..600).try_for_each(|i| cb.timestamp(0x8030_0000 + 8 * i)))
        .unwrap();
    let c = dev.submit(QueueId::COPY, &[a, b], |cb| cb.fill(0x8030_0000, 64, 7)).unwrap();
    dev.wait(c, 1_000_000_000).unwrap();
    dev.stop_capture();
    let o = dump(&[path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let heads: Vec<&str> = text.lines().filter(|l| l.starts_with("submission ")).collect();
    assert_eq!(heads.len(), 3, "{text}");
    assert!(heads[0].starts_with("submission 1: fence q0:1 after []"), "{text}");
    assert!(heads[1].starts_with("submission 2: fence q1:1 after [q0:1]"), "{text}");
    assert!(heads[2].starts_with("submission 3: fence q2:1 after [q0:1, q1:1]"), "{text}");
    // The chained IB's packets, all of them, and the CHAIN between.
    assert_eq!(text.matches("TIMESTAMP").count(), 601, "{text}");
    assert!(text.contains("CHAIN"), "{text}");
    assert!(text.contains("FILL"), "{text}");
    assert!(text.ends_with("-- gen2: 3 submissions, 0 dropped or lost\n"), "{text}");
    let o = dump(&["--json", path.to_str().unwrap()]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["submissions"][2]["waits"][1]["queue"], 1);
    assert_eq!(j["submissions"][1]["fence"], 1);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A UART: everything the firmware prints, shared with the test.
#[derive(Clone, Default)]
struct Uart(Arc<Mutex<String>>);

impl core::fmt::Write for Uart {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.0.lock().unwrap().push_str(s);
        Ok(())
    }
}

#[test]
fn a_flight_recorder_over_a_uart_is_rebuilt_into_a_capture() {
    let dir = scratch("hex");
    let uart = Uart::default();
    let dev = device();
    let ring = leak(CaptureRing::<65536, 2>::new());
    let lines = leak(HexLines::new(uart.clone()));
    dev.start_capture(Capture::flight_recorder(ring, lines));
    uart.0.lock().unwrap().push_str("boot: refgpu up\n");
    for _ in 0..3 {
        let f = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
        dev.wait(f, 1_000_000_000).unwrap();
    }
    dev.platform().state().engines[2].fault = EngineFault::Stuck;
    let h = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0008)).unwrap();
    assert_eq!(
        dev.wait(h, 10_000_000_000).unwrap_err(),
        umd_core::error::WaitError::Failed(FenceError::DeviceHung)
    );
    let log = dir.join("uart.log");
    std::fs::write(&log, uart.0.lock().unwrap().as_str()).unwrap();
    let rebuilt = dir.join("rebuilt.rgcs");
    let o = dump(&["--hex", log.to_str().unwrap(), "--out", rebuilt.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = dump(&[rebuilt.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{text}");
    assert!(text.starts_with("-- 2 earlier submissions dropped or lost\n"), "{text}");
    let heads: Vec<&str> = text.lines().filter(|l| l.starts_with("submission ")).collect();
    assert_eq!(heads.len(), 2, "{text}");
    assert!(heads[0].contains("fence q2:3 ") && heads[1].contains("fence q2:4 "), "{text}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_full_disk_loses_records_and_submission_goes_on() {
    let dev = device();
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    dev.start_capture(Capture::to_sink(leak(IoSink::new(full))));
    let mut last = None;
    for i in 0..5 {
        last = Some(dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000 + 8 * i)).unwrap());
    }
    dev.wait(last.unwrap(), 1_000_000_000).unwrap();
    let s = dev.capture_stats();
    // The header and the five records.
    assert_eq!((s.recorded, s.lost), (0, 6), "{s:?}");
    assert_eq!(dev.stats().submissions, 5);
}

#[test]
fn bad_hex_lines_are_an_error() {
    let dir = scratch("badhex");
    let log = dir.join("bad.log");
    std::fs::write(&log, "rgcs: 524\n").unwrap();
    let o = dump(&["--hex", log.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("line 1: odd number of hex digits"));
    std::fs::remove_dir_all(dir).unwrap();
}
