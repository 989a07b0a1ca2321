//! The Linux co-sim backend (`platform_linux::Cosim`) end to end against a
//! `refgpu-sim` child process: register-level checks, then
//! `umd_core::direct::Device` on both generations with the MMU on, waits
//! with interrupts and polling-only, a refused second host, and the server
//! dying under a waiting driver.

mod common;

use common::*;
use platform_linux::{selftest, Cosim};
use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::error::{FenceStatus, WaitError};
use umd_core::hw::regs::{self, engine as er};
use umd_core::platform::{DirectIo, IrqWait, Platform};
use umd_core::storage::DeviceStorage;
use umd_core::sync::{FenceError, QueueId};

fn device<'d>(p: &'d Cosim, storage: &'d mut DeviceStorage, use_irq: bool) -> Device<'d, Cosim> {
    match Device::new(p, storage, Config { use_irq, ..Config::DEFAULT }, MmuMode::DEFAULT) {
        Ok(d) => d,
        Err(e) => panic!("Device::new: {e}"),
    }
}

fn run(gen: &str, use_irq: bool) {
    let sim = Sim::start(&["--gen", gen]);
    let p = Cosim::connect(&sim.socket).expect("connect");
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev = device(&p, &mut storage, use_irq);
    assert_eq!(u32::from(dev.chip().generation.number()), gen.parse::<u32>().unwrap());
    selftest::all(&dev).unwrap_or_else(|e| panic!("gen{gen} irq={use_irq}: {e}\n{}", sim.log_text()));
    // Whether an interrupt wait happened at all depends on timing (a fence
    // may land during the initial spin); `fence_wait_sleeps_on_the_interrupt`
    // forces it. Polling-only must never wait for an interrupt.
    if !use_irq {
        assert_eq!(p.irq_wakeups(), 0, "polling-only device used interrupts");
    }
    assert_eq!(dev.shutdown().leaked_buffers, 0);
    assert_eq!(p.dma_pages_used(), 0, "regions leaked");
}

#[test]
fn gen1_irq() {
    run("1", true);
}

#[test]
fn gen1_polling() {
    run("1", false);
}

#[test]
fn gen2_irq() {
    run("2", true);
}

#[test]
fn gen2_polling() {
    run("2", false);
}

#[test]
fn registers_doorbells_and_interrupts_without_device() {
    let sim = Sim::start(&[]);
    let p = Cosim::connect(&sim.socket).unwrap();
    assert_eq!(p.peer_id(), 1);
    assert_eq!(p.mem_window(), (MEM_BASE, MEM_SIZE as usize));
    assert_eq!(p.read_reg(regs::ID).unwrap(), 0x5247_0100);
    // CLOCK_LO latches CLOCK_HI; the pair moves.
    let t0 =
        u64::from(p.read_reg(regs::CLOCK_LO).unwrap()) | u64::from(p.read_reg(regs::CLOCK_HI).unwrap()) << 32;
    // The server publishes the clock periodically; on a loaded machine the
    // next update may take a while (10 s is a failure guard, not a bound).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut t1 = t0;
    while t1 <= t0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
        t1 = u64::from(p.read_reg(regs::CLOCK_LO).unwrap())
            | u64::from(p.read_reg(regs::CLOCK_HI).unwrap()) << 32;
    }
    assert!(t1 > t0, "clock {t0} -> {t1}");
    // Read-only registers are not writable through the platform.
    p.write_reg(regs::ID, 0).unwrap();
    assert_eq!(p.read_reg(regs::ID).unwrap(), 0x5247_0100);
    // A gen1 WRITE_DATA + FENCE(irq) on COPY, MMU off.
    let mut ring = p.dma_alloc(4096, umd_core::platform::DmaFlags::CPU).unwrap();
    let data = p.dma_alloc(4096, umd_core::platform::DmaFlags::CPU).unwrap();
    let d = data.dev_addr();
    let words = [0x0100_0003, d as u32, (d >> 32) as u32, 0xC0DE, 0x0401_0004, (d + 64) as u32, 0, 7, 0];
    ring.words_mut()[..words.len()].copy_from_slice(&words);
    let e = 2;
    p.write_reg(regs::IRQ_MASK, regs::irq_fence(e)).unwrap();
    p.write_reg(regs::engine_reg(e, er::RING_BASE_LO), ring.dev_addr() as u32).unwrap();
    p.write_reg(regs::engine_reg(e, er::RING_SIZE), 4096).unwrap();
    p.write_reg(regs::engine_reg(e, er::CTRL), er::CTRL_ENABLE).unwrap();
    p.control_doorbell().unwrap();
    p.write_reg(regs::engine_reg(e, er::RING_WPTR), 36).unwrap();
    p.doorbell(e).unwrap();
    let mut woke = false;
    for _ in 0..1000 {
        if p.wait_irq(30_000_000) == IrqWait::Interrupt {
            woke = true;
            break;
        }
    }
    assert!(woke, "no interrupt");
    assert_eq!(data.read_u32(0), Some(0xC0DE));
    assert_eq!(data.read_u64(64), Some(7));
    // The FENCE's interrupt is raised while the packet executes; RPTR moves
    // past it only afterwards (spec 4.1), so wait for it (failure guard only).
    // (The bound is time, not a number of tries: a starved server may take
    // longer than any fixed count of yields.)
    let start = std::time::Instant::now();
    loop {
        let rptr = p.read_reg(regs::engine_reg(e, er::RING_RPTR)).unwrap();
        if rptr == 36 {
            break;
        }
        assert!(start.elapsed() < GUARD, "RPTR stuck at {rptr}, expected 36");
        std::thread::yield_now();
    }
    // RW1C for the core = atomic AND of the complement on the page.
    assert_eq!(p.read_reg(regs::IRQ_STATUS).unwrap(), regs::irq_fence(e));
    p.write_reg(regs::IRQ_STATUS, regs::irq_fence(e)).unwrap();
    assert_eq!(p.read_reg(regs::IRQ_STATUS).unwrap(), 0);
    // A second FENCE through the engine's DOORBELL register.
    let more = [0x0401_0004, (d + 128) as u32, 0, 8, 0];
    ring.words_mut()[9..14].copy_from_slice(&more);
    p.write_reg(regs::engine_reg(e, er::RING_WPTR), 56).unwrap();
    p.write_reg(regs::engine_reg(e, er::DOORBELL), 1).unwrap();
    let start = std::time::Instant::now();
    while data.read_u64(128) != Some(8) {
        assert!(start.elapsed() < GUARD, "second fence never landed");
        // Yield rather than spin: the server needs a core too.
        std::thread::yield_now();
    }
    p.dma_free(ring);
    p.dma_free(data);
    assert_eq!(p.dma_pages_used(), 0);
}

#[test]
fn second_host_is_refused_while_the_first_runs() {
    let sim = Sim::start(&[]);
    let p = Cosim::connect(&sim.socket).expect("connect");
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev = device(&p, &mut storage, true);
    match Cosim::connect(&sim.socket) {
        Err(platform_linux::CosimError::Closed) => {}
        other => panic!("second host: {other:?}"),
    }
    selftest::copy_fill_write(&dev, QueueId::COPY, 7).unwrap();
    dev.shutdown();
}

#[test]
fn server_dying_fails_pending_fences_as_device_lost() {
    let mut sim = Sim::start(&["--stall-engines", "0x4"]);
    let p = Cosim::connect(&sim.socket).expect("connect");
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev = device(&p, &mut storage, true);
    let buf = dev.alloc_buffer(4096).unwrap();
    let va = dev.va(buf).unwrap();
    let f = dev.submit(QueueId::COPY, &[], |cb| cb.write_data(va, &[1])).unwrap();
    assert_eq!(dev.query(f), Ok(FenceStatus::Pending));
    sim.signal_and_wait(rustix::process::Signal::KILL);
    assert_eq!(dev.wait(f, 60_000_000_000), Err(WaitError::Failed(FenceError::DeviceLost)));
    assert!(dev.is_lost());
    assert!(p.is_lost());
    // Memory the lost work held is never reused; teardown gives it back.
    dev.free(buf).unwrap();
    let report = dev.shutdown();
    assert_eq!((report.leaked_buffers, report.released_waiting), (0, 1));
    assert_eq!(p.dma_pages_used(), 0);
}

#[test]
fn fence_wait_sleeps_on_the_interrupt() {
    // The server writes our eventfd for the fence interrupt: the wait must
    // sleep in `wait_irq` and be woken by it (the check is shared with the
    // in-process platform's tests).
    let sim = Sim::start(&["--gen", "2"]);
    let p = Cosim::connect(&sim.socket).expect("connect");
    selftest::fence_wait_sleeps_on_the_interrupt(p, |p| p.irq_wakeups())
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log_text()));
}
