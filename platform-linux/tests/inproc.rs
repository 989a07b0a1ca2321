//! The in-process platform end to end: `umd_core::direct::Device` on a
//! model in this process, both generations, MMU on, interrupts and polling.

use platform_linux::{selftest, InProcess};
use refgpu_model::{Generation, ModelConfig};
use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::platform::{DirectIo, IrqWait, Platform};
use umd_core::storage::DeviceStorage;
use umd_core::sync::QueueId;

fn platform(generation: Generation) -> InProcess {
    InProcess::new(ModelConfig {
        generation,
        mem_base: 0x4000_0000,
        mem_size: 32 << 20,
        ..Default::default()
    })
    .expect("model")
}

fn device<'d>(p: &'d InProcess, storage: &'d mut DeviceStorage, use_irq: bool) -> Device<'d, InProcess> {
    let cfg = Config { use_irq, ..Config::DEFAULT };
    match Device::new(p, storage, cfg, MmuMode::DEFAULT) {
        Ok(d) => d,
        Err(e) => panic!("Device::new: {e}"),
    }
}

#[test]
fn registers_and_doorbell_directly() {
    // Platform layer only, no Device: ID probe, RW1C IRQ_STATUS, a ring
    // with one WRITE_DATA + FENCE(irq) on COPY, MMU off.
    use umd_core::hw::regs::{self, engine as er};
    let p = platform(Generation::Gen1);
    assert_eq!(p.read_reg(regs::ID).unwrap() >> 16, 0x5247);
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
    p.write_reg(regs::engine_reg(e, er::RING_WPTR), 36).unwrap();
    p.doorbell(e).unwrap();
    let mut woke = false;
    for _ in 0..1000 {
        if p.wait_irq(20_000_000) == IrqWait::Interrupt {
            woke = true;
            break;
        }
    }
    assert!(woke, "no interrupt");
    assert_eq!(data.read_u32(0), Some(0xC0DE));
    assert_eq!(data.read_u64(64), Some(7));
    assert_eq!(p.read_reg(regs::IRQ_STATUS).unwrap() & regs::irq_fence(e), regs::irq_fence(e));
    p.write_reg(regs::IRQ_STATUS, regs::irq_fence(e)).unwrap();
    assert_eq!(p.read_reg(regs::IRQ_STATUS).unwrap(), 0);
    p.dma_free(ring);
    p.dma_free(data);
    assert_eq!(p.dma_pages_used(), 0);
}

fn run(generation: Generation, use_irq: bool) {
    let p = platform(generation);
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev = device(&p, &mut storage, use_irq);
    selftest::all(&dev).unwrap_or_else(|e| panic!("{generation:?} irq={use_irq}: {e}"));
    // Whether an interrupt wait happened at all depends on timing (a fence
    // may land during the initial spin); `fence_wait_sleeps_on_the_interrupt`
    // forces it. Polling-only must never wait for an interrupt.
    if !use_irq {
        assert_eq!(p.irq_wakeups(), 0, "polling-only device used interrupts");
    }
    let report = dev.shutdown();
    assert_eq!(report.leaked_buffers, 0);
    assert_eq!(p.dma_pages_used(), 0, "regions leaked");
}

#[test]
fn gen1_irq() {
    run(Generation::Gen1, true);
}

#[test]
fn gen1_polling() {
    run(Generation::Gen1, false);
}

#[test]
fn gen2_irq() {
    run(Generation::Gen2, true);
}

#[test]
fn gen2_polling() {
    run(Generation::Gen2, false);
}

#[test]
fn single_fence_wait_with_interrupt() {
    let p = platform(Generation::Gen2);
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev = device(&p, &mut storage, true);
    let buf = dev.alloc_buffer(4096).unwrap();
    let va = dev.va(buf).unwrap();
    let f = dev.submit(QueueId(1), &[], |cb| cb.write_data(va, &[42])).unwrap();
    dev.wait(f, selftest::WAIT_GUARD_NS).unwrap();
    assert_eq!(dev.read_u32(buf, 0), Ok(42));
    dev.free(buf).unwrap();
    assert_eq!(dev.shutdown().leaked_buffers, 0);
}

#[test]
fn fence_wait_sleeps_on_the_interrupt() {
    let p = platform(Generation::Gen2);
    selftest::fence_wait_sleeps_on_the_interrupt(p, |p| p.irq_wakeups()).unwrap_or_else(|e| panic!("{e}"));
}
