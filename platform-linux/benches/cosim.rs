//! Co-simulation round-trip latency (`docs/perf.md`, "Co-simulation"):
//! doorbell → fence visible in the host process, polling and with an
//! interrupt wait, against the floor of the transport (an eventfd
//! ping-pong between two processes) measured in the same run; the
//! in-process platform for comparison.
//!
//! ```sh
//! CARGO_TARGET_DIR=/work/target-cosim cargo build --release -p refgpu-sim
//! CARGO_TARGET_DIR=/work/target-cosim cargo bench -p platform-linux --bench cosim
//! ```
//!
//! The server binary is taken from `$REFGPU_SIM`, else from the `release`
//! directory next to this benchmark's executable.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use platform_linux::{Cosim, InProcess};
use refgpu_model::ModelConfig;
use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::hw::regs::{self, engine as er};
use umd_core::platform::{DirectIo, IrqWait};
use umd_core::storage::DeviceStorage;
use umd_core::sync::QueueId;

const WARMUP: usize = 1_000;
const ITERS: usize = 10_000;

struct Stats {
    median: f64,
    p99: f64,
    mean: f64,
}

fn stats(mut ns: Vec<u64>) -> Stats {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() as f64 * q) as usize).min(ns.len() - 1)] as f64 / 1000.0;
    let mean = ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1000.0;
    Stats { median: at(0.5), p99: at(0.99), mean }
}

/// One table row; ratios against the floor with the same number of
/// cross-process wakeups (`floor`: one for polling, two for interrupts).
fn row(name: &str, s: &Stats, floor: &Stats) {
    println!(
        "| {name} | {:.1} | {:.1} | {:.1} | {:.2}x | {:.2}x |",
        s.median,
        s.p99,
        s.mean,
        s.median / floor.median,
        s.p99 / floor.p99
    );
}

// ----- eventfd ping-pong between two processes -----

/// Child side of the one-wakeup floor: block on the eventfd, answer
/// through a word of shared memory.
fn pong_shm(args: &[String]) {
    let num = |i: usize| args[i].parse::<i32>().expect("fd number");
    // SAFETY: the parent passed these inherited fd numbers (an eventfd and
    // a memfd) for us to own; nothing else in this process uses them.
    let (rx, mfd) = unsafe { (OwnedFd::from_raw_fd(num(0)), OwnedFd::from_raw_fd(num(1))) };
    let n: usize = args[2].parse().expect("count");
    let word = map_word(&mfd);
    let mut b = [0u8; 8];
    for i in 1..=n as u64 {
        rustix::io::read(&rx, &mut b).expect("read");
        word.store(i, std::sync::atomic::Ordering::Release);
    }
}

/// The first 8 bytes of a memfd, mapped shared (leaked: the benchmark
/// process ends soon).
fn map_word(fd: &OwnedFd) -> &'static std::sync::atomic::AtomicU64 {
    use rustix::mm::{mmap, MapFlags, ProtFlags};
    // SAFETY: a fresh 4 KiB shared mapping at a kernel-chosen address.
    let p = unsafe {
        mmap(std::ptr::null_mut(), 4096, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd, 0)
    }
    .expect("mmap");
    // SAFETY: page aligned, never unmapped, only accessed atomically.
    unsafe { std::sync::atomic::AtomicU64::from_ptr(p.cast()) }
}

/// One cross-process wakeup, answer by shared memory: the floor of a
/// doorbell whose completion the host polls for.
fn ping_shm() -> Stats {
    use rustix::event::{eventfd, EventfdFlags};
    use rustix::fs::{memfd_create, MemfdFlags};
    let a = eventfd(0, EventfdFlags::empty()).expect("eventfd");
    let m = memfd_create("pong", MemfdFlags::empty()).expect("memfd");
    rustix::fs::ftruncate(&m, 4096).expect("ftruncate");
    let word = map_word(&m);
    let total = WARMUP + ITERS;
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args(["--pong-shm", &a.as_raw_fd().to_string(), &m.as_raw_fd().to_string(), &total.to_string()])
        .spawn()
        .expect("spawn pong");
    let mut ns = Vec::with_capacity(ITERS);
    for i in 1..=total as u64 {
        let t = Instant::now();
        rustix::io::write(&a, &1u64.to_ne_bytes()).expect("write");
        while word.load(std::sync::atomic::Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
        if i as usize > WARMUP {
            ns.push(t.elapsed().as_nanos() as u64);
        }
    }
    child.wait().expect("pong");
    stats(ns)
}

fn pong(args: &[String]) {
    let num = |i: usize| args[i].parse::<i32>().expect("fd number");
    // SAFETY: the parent passed these inherited eventfd numbers for us to
    // own; nothing else in this process uses them.
    let (rx, tx) = unsafe { (OwnedFd::from_raw_fd(num(0)), OwnedFd::from_raw_fd(num(1))) };
    let n: usize = args[2].parse().expect("count");
    let mut b = [0u8; 8];
    for _ in 0..n {
        rustix::io::read(&rx, &mut b).expect("read");
        rustix::io::write(&tx, &1u64.to_ne_bytes()).expect("write");
    }
}

fn ping_pong() -> Stats {
    use rustix::event::{eventfd, EventfdFlags};
    // Inheritable, blocking eventfds.
    let a = eventfd(0, EventfdFlags::empty()).expect("eventfd");
    let b = eventfd(0, EventfdFlags::empty()).expect("eventfd");
    let total = WARMUP + ITERS;
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args(["--pong", &a.as_raw_fd().to_string(), &b.as_raw_fd().to_string(), &total.to_string()])
        .spawn()
        .expect("spawn pong");
    let mut buf = [0u8; 8];
    let mut ns = Vec::with_capacity(ITERS);
    for i in 0..total {
        let t = Instant::now();
        rustix::io::write(&a, &1u64.to_ne_bytes()).expect("write");
        rustix::io::read(&b, &mut buf).expect("read");
        if i >= WARMUP {
            ns.push(t.elapsed().as_nanos() as u64);
        }
    }
    child.wait().expect("pong");
    stats(ns)
}

// ----- raw ring round trips over any DirectIo platform -----

/// Each iteration: one gen1 FENCE (irq) on COPY, WPTR, doorbell; then spin
/// on the fence word (`irq = false`) or `wait_irq` until it shows.
fn ring_round_trips<P: DirectIo>(p: &mut P, irq: bool) -> Stats {
    let size = 64 * 1024usize;
    let mut ring = p.dma_alloc(size, umd_core::platform::DmaFlags::CPU).expect("ring");
    let fence = p.dma_alloc(4096, umd_core::platform::DmaFlags::CPU).expect("fence");
    let f = fence.dev_addr();
    let e = 2u32;
    let w = |p: &mut P, r, v| p.write_reg(r, v).expect("reg");
    w(p, regs::MMU_CTRL, 0);
    w(p, regs::engine_reg(e, er::CTRL), er::CTRL_RESET);
    p.control_doorbell().expect("ctl");
    while p.read_reg(regs::engine_reg(e, er::CTRL)).expect("reg") & er::CTRL_RESET != 0 {}
    w(p, regs::engine_reg(e, er::RING_BASE_LO), ring.dev_addr() as u32);
    w(p, regs::engine_reg(e, er::RING_BASE_HI), (ring.dev_addr() >> 32) as u32);
    w(p, regs::engine_reg(e, er::RING_SIZE), size as u32);
    w(p, regs::engine_reg(e, er::RING_WPTR), 0);
    w(p, regs::engine_reg(e, er::CTRL), er::CTRL_ENABLE);
    w(p, regs::IRQ_MASK, if irq { regs::irq_fence(e) } else { 0 });
    p.control_doorbell().expect("ctl");
    let mut off = 0usize;
    let mut ns = Vec::with_capacity(ITERS);
    for i in 1..=(WARMUP + ITERS) as u32 {
        if off + 20 > size {
            let ndw = ((size - off) / 4 - 1) as u32;
            ring.words_mut()[off / 4] = ndw; // gen1 NOP padding to the end
            off = 0;
        }
        let pkt = [0x0401_0004, f as u32, (f >> 32) as u32, i, 0];
        ring.words_mut()[off / 4..off / 4 + 5].copy_from_slice(&pkt);
        off += 20;
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        let t = Instant::now();
        w(p, regs::engine_reg(e, er::RING_WPTR), (off % size) as u32);
        p.doorbell(e).expect("doorbell");
        if irq {
            while fence.read_u64(0) != Some(u64::from(i)) {
                if p.wait_irq(1_000_000_000) == IrqWait::Interrupt {
                    w(p, regs::IRQ_STATUS, regs::irq_fence(e));
                }
            }
        } else {
            while fence.read_u64(0) != Some(u64::from(i)) {
                std::hint::spin_loop();
            }
        }
        if i as usize > WARMUP {
            ns.push(t.elapsed().as_nanos() as u64);
        }
        if off == size {
            off = 0;
        }
    }
    w(p, regs::engine_reg(e, er::CTRL), 0);
    w(p, regs::IRQ_MASK, 0);
    p.control_doorbell().expect("ctl");
    p.dma_free(ring);
    p.dma_free(fence);
    stats(ns)
}

/// `Device::submit` of one WRITE_DATA + `Device::wait`, per iteration.
fn device_round_trips<P: DirectIo>(p: P, use_irq: bool) -> (Stats, P) {
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, P> =
        match Device::new(&p, &mut storage, Config { use_irq, ..Config::DEFAULT }, MmuMode::DEFAULT) {
            Ok(d) => d,
            Err(e) => panic!("Device::new: {e}"),
        };
    let buf = dev.alloc_buffer(4096).expect("buffer");
    let va = dev.va(buf).expect("va");
    let mut ns = Vec::with_capacity(ITERS);
    for i in 0..(WARMUP + ITERS) as u32 {
        let t = Instant::now();
        let f = dev.submit(QueueId::COPY, &[], |cb| cb.write_data(va, &[i])).expect("submit");
        dev.wait(f, 10_000_000_000).expect("wait");
        if i as usize >= WARMUP {
            ns.push(t.elapsed().as_nanos() as u64);
        }
    }
    dev.free(buf).expect("free");
    dev.shutdown();
    drop(storage);
    (stats(ns), p)
}

// ----- the server -----

struct Server {
    child: Child,
    _dir: tempfile::TempDir,
    socket: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sim_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("REFGPU_SIM") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("exe");
    // target/release/deps/cosim-HASH -> target/release/refgpu-sim
    let p = exe.parent().and_then(|d| d.parent()).expect("target dir").join("refgpu-sim");
    if !p.exists() {
        eprintln!(
            "{} not found: run `cargo build --release -p refgpu-sim` first (or set REFGPU_SIM)",
            p.display()
        );
        std::process::exit(1);
    }
    p
}

fn start_server() -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("sim.sock");
    let child = Command::new(sim_binary())
        .arg("--socket")
        .arg(&socket)
        .arg("--mem-file")
        .arg(dir.path().join("mem.img"))
        .args(["--mem-size", "32M"])
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn refgpu-sim");
    let start = Instant::now();
    while !socket.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "refgpu-sim did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(20));
    Server { child, _dir: dir, socket }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--pong") => return pong(&args[2..]),
        Some("--pong-shm") => return pong_shm(&args[2..]),
        _ => {}
    }
    if args.iter().any(|a| a == "--list") {
        return; // `cargo bench -- --list` compatibility
    }
    println!("co-simulation round trips, {ITERS} iterations after {WARMUP} warm-up, times in µs");
    let floor2 = ping_pong();
    let floor1 = ping_shm();
    println!();
    println!("| path | median | p99 | mean | median / floor | p99 / floor |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    row("floor 1: eventfd wake + shared-memory reply (1 wakeup)", &floor1, &floor1);
    row("floor 2: eventfd ping-pong, 2 processes (2 wakeups)", &floor2, &floor2);
    let server = start_server();
    let mut cosim = Cosim::connect(&server.socket).expect("connect");
    let s = ring_round_trips(&mut cosim, false);
    row("co-sim: doorbell → fence, polling (vs floor 1)", &s, &floor1);
    let s = ring_round_trips(&mut cosim, true);
    row("co-sim: doorbell → fence, interrupt wait (vs floor 2)", &s, &floor2);
    let (s, cosim) = device_round_trips(cosim, false);
    row("co-sim: Device submit + wait, polling (vs floor 1)", &s, &floor1);
    let (s, cosim) = device_round_trips(cosim, true);
    row("co-sim: Device submit + wait, interrupts (vs floor 2)", &s, &floor2);
    drop(cosim);
    drop(server);
    let cfg = ModelConfig { mem_size: 32 << 20, ..Default::default() };
    let mut inproc = InProcess::new(cfg).expect("model");
    let s = ring_round_trips(&mut inproc, false);
    row("in-process: doorbell → fence, polling (vs floor 1)", &s, &floor1);
    let s = ring_round_trips(&mut inproc, true);
    row("in-process: doorbell → fence, interrupt wait (vs floor 2)", &s, &floor2);
    let (s, inproc) = device_round_trips(inproc, false);
    row("in-process: Device submit + wait, polling (vs floor 1)", &s, &floor1);
    let (s, _inproc) = device_round_trips(inproc, true);
    row("in-process: Device submit + wait, interrupts (vs floor 2)", &s, &floor2);
}
