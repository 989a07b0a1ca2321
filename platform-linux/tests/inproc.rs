//! The in-process platform end to end: `umd_core::direct::Device` on a
//! model in this process, both generations, MMU on, interrupts and polling.

use platform_linux::{selftest, Cache, InProcess, InProcessOptions};
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
    let f = dev.submit(QueueId::COMPUTE, &[], |cb| cb.write_data(va, &[42])).unwrap();
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

/// What a FENCE rung through a ring that the CPU wrote into a write-back
/// cached region does: `maintain` says whether the driver cleans the ring
/// before the doorbell and invalidates the fence slot before reading it.
/// Returns (the fence value the GPU wrote to memory, what the CPU reads).
fn fence_through_cached_ring(p: &InProcess, maintain: bool) -> (u64, u64) {
    use umd_core::hw::regs::{self, engine as er};
    use umd_core::platform::DmaFlags;
    let mut ring = p.dma_alloc(4096, DmaFlags::CPU).unwrap();
    let fence = p.dma_alloc(4096, DmaFlags::CPU).unwrap();
    let f = fence.dev_addr();
    // gen1: FENCE(addr, value 7, no irq); the rest of the ring is NOPs (0).
    let words = [0x0400_0004, f as u32, (f >> 32) as u32, 7, 0];
    ring.words_mut()[..words.len()].copy_from_slice(&words);
    if maintain {
        p.cache_clean(&ring, 0, 20);
    }
    let e = 2;
    // Reset the engine (RPTR = WPTR = 0) in case an earlier call used it.
    p.write_reg(regs::engine_reg(e, er::CTRL), er::CTRL_RESET).unwrap();
    p.control_doorbell().unwrap();
    while p.read_reg(regs::engine_reg(e, er::CTRL)).unwrap() & er::CTRL_RESET != 0 {
        std::thread::yield_now();
    }
    p.write_reg(regs::engine_reg(e, er::RING_BASE_LO), ring.dev_addr() as u32).unwrap();
    p.write_reg(regs::engine_reg(e, er::RING_BASE_HI), (ring.dev_addr() >> 32) as u32).unwrap();
    p.write_reg(regs::engine_reg(e, er::RING_SIZE), 4096).unwrap();
    p.write_reg(regs::engine_reg(e, er::CTRL), er::CTRL_ENABLE).unwrap();
    p.control_doorbell().unwrap();
    p.write_reg(regs::engine_reg(e, er::RING_WPTR), 20).unwrap();
    p.doorbell(e).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while p.read_reg(regs::engine_reg(e, er::RING_RPTR)).unwrap() != 20 {
        assert!(std::time::Instant::now() < deadline, "the engine did not reach WPTR");
        std::thread::yield_now();
    }
    let status = p.read_reg(regs::engine_reg(e, er::STATUS)).unwrap();
    assert_eq!(status & er::STATUS_HALTED, 0, "the engine faulted");
    let in_memory = p.model().read_u64(f).unwrap();
    if maintain {
        p.cache_invalidate(&fence, 0, 8);
    }
    let cpu_sees = fence.read_u64(0).unwrap();
    p.dma_free(ring);
    p.dma_free(fence);
    (in_memory, cpu_sees)
}

fn write_back_platform() -> InProcess {
    let cfg = ModelConfig {
        generation: Generation::Gen1,
        mem_base: 0x4000_0000,
        mem_size: 4 << 20,
        ..Default::default()
    };
    // No spontaneous write-back: the outcome depends on the driver alone.
    InProcess::with_options(cfg, InProcessOptions { cache: Cache::WriteBack { seed: 1, evict_per_mille: 0 } })
        .expect("model")
}

#[test]
fn write_back_cache_needs_the_clean_and_the_invalidate() {
    // Coherent: no maintenance needed.
    assert_eq!(fence_through_cached_ring(&platform(Generation::Gen1), false), (7, 7));
    // Write-back with maintenance: the GPU runs the FENCE, the CPU sees it.
    let p = write_back_platform();
    assert_eq!(fence_through_cached_ring(&p, true), (7, 7));
    let s = p.cache_stats();
    assert_eq!((s.lines_cleaned, s.lines_invalidated), (1, 1));
    // Without: the GPU fetched a ring of NOPs (the packets never left the
    // CPU cache), so no fence; the CPU would not have seen one anyway.
    let p = write_back_platform();
    assert_eq!(fence_through_cached_ring(&p, false), (0, 0));
    assert_eq!(p.cache_stats().lines_cleaned, 0);
}

#[test]
fn write_back_cache_catches_a_dropped_clean() {
    // The driver cleans, but the clean of the ring's line is dropped
    // (fault injection): the same failure as a forgotten clean.
    let p = write_back_platform();
    p.ignore_cleans(0x4000_0000..0x4000_0000 + (4 << 20)).unwrap();
    assert_eq!(fence_through_cached_ring(&p, true), (0, 0));
    assert_eq!(p.cache_stats().cleans_ignored, 1);
    p.clear_ignored_cleans().unwrap();
    assert_eq!(fence_through_cached_ring(&p, true), (7, 7));
}

/// A job bracketed by TIMESTAMPs, placed on the CPU timeline with
/// `clock_sync` (the model's clock starts at 0 when it is created, the
/// platform's is CLOCK_MONOTONIC: a wrong offset or sign puts the span
/// far outside its submission), lands between the submit and the wait's
/// return, and is exported on the GPU engine's track.
#[test]
fn gpu_spans_land_inside_their_submission_on_the_cpu_timeline() {
    use umd_core::debug::{trace::TraceStorage, TraceKind, TraceRing};
    let p = platform(Generation::Gen2);
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev = device(&p, &mut storage, true);
    let ts = dev.alloc_buffer(4096).unwrap();
    let work = dev.alloc_buffer(1 << 20).unwrap();
    let (tva, wva) = (dev.va(ts).unwrap(), dev.va(work).unwrap());
    // Let the model's clock and the platform's drift apart from creation.
    std::thread::sleep(std::time::Duration::from_millis(5));
    let sync = dev.clock_sync().expect("direct mode reads the device clock");
    let before = p.now_ns();
    let f = dev
        .submit(QueueId::COPY, &[], |cb| {
            cb.timestamp(tva)?;
            cb.fill(wva, 1 << 20, 0xA5A5_A5A5)?;
            cb.timestamp(tva + 8)
        })
        .unwrap();
    dev.wait(f, 10_000_000_000).unwrap();
    let after = p.now_ns();
    let mut raw = [0u8; 16];
    dev.read(ts, 0, &mut raw).unwrap();
    let start = u64::from_le_bytes(raw[..8].try_into().unwrap());
    let end = u64::from_le_bytes(raw[8..].try_into().unwrap());
    assert!(start != 0 && end >= start, "timestamps {start} {end}");
    let mut tstore = TraceStorage::<8>::new();
    let mut ring = TraceRing::new(&mut tstore);
    ring.record_gpu_span(2, f.seqno().0, &sync, start, end);
    let ev = *ring.iter().next().unwrap();
    assert_eq!(ev.kind, TraceKind::GpuSpan);
    assert_eq!(ev.arg, end - start);
    let slack = sync.uncertainty_ns;
    assert!(ev.ts_ns + slack >= before, "span starts {} ns before its submit", before - ev.ts_ns);
    assert!(ev.ts_ns + ev.arg <= after + slack, "span ends {} ns after the wait", ev.ts_ns + ev.arg - after);
    let mut json = String::new();
    ring.write_chrome_json(&mut json).unwrap();
    assert!(json.contains("\"GPU engines (TIMESTAMPs)\""), "{json}");
    assert!(json.contains("\"ph\":\"X\",\"pid\":2,\"tid\":2"), "{json}");
    dev.free(ts).unwrap();
    dev.free(work).unwrap();
}

/// The write-back model (64-byte lines written back whole): the CPU writes
/// a buffer, the GPU fills it, then the CPU writes single words and byte
/// runs that start or end inside lines and reads one word of a line. Every
/// byte the CPU did not write keeps the GPU's fill, no line is left dirty,
/// and a job rung afterwards (every dirty line evicted at every doorbell
/// with `evict_per_mille: 1000`) changes nothing. Without the driver's
/// invalidate of the partly covered lines, their clean wrote the CPU's
/// stale copy of the rest of the line over the fill.
#[test]
fn write_back_cache_keeps_gpu_data_beside_a_partial_line_write() {
    for (generation, evict_per_mille) in [(Generation::Gen1, 0), (Generation::Gen2, 1000)] {
        let cfg = ModelConfig { generation, mem_base: 0x4000_0000, mem_size: 8 << 20, ..Default::default() };
        let p = InProcess::with_options(
            cfg,
            InProcessOptions { cache: Cache::WriteBack { seed: 3, evict_per_mille } },
        )
        .expect("model");
        let mut storage: Box<DeviceStorage> = Box::default();
        let dev = device(&p, &mut storage, false);
        let h = dev.alloc_buffer(4096).unwrap();
        let va = dev.va(h).unwrap();
        let stale: Vec<u32> = (0..1024).map(|i| 0xAAAA_0000 | i).collect();
        dev.write_words(h, 0, &stale).unwrap();
        let f = dev.submit(QueueId::COPY, &[], |cb| cb.fill(va, 4096, 0xB0B0_B0B0)).unwrap();
        dev.wait(f, 5_000_000_000).unwrap();
        let mut want = vec![0xB0u8; 4096];
        assert_eq!(dev.read_u32(h, 600), Ok(0xB0B0_B0B0), "{generation:?}: partial read");
        dev.write_words(h, 4, &[0x1234_5678]).unwrap();
        want[4..8].copy_from_slice(&0x1234_5678u32.to_le_bytes());
        dev.write(h, 100, &[0x11; 10]).unwrap();
        want[100..110].fill(0x11);
        dev.write_words(h, 188, &[0x2222_2222, 0x3333_3333]).unwrap();
        want[188..192].copy_from_slice(&0x2222_2222u32.to_le_bytes());
        want[192..196].copy_from_slice(&0x3333_3333u32.to_le_bytes());
        dev.write(h, 1000, &[0x44; 300]).unwrap();
        want[1000..1300].fill(0x44);
        assert_eq!(p.dirty_lines(), 0, "{generation:?}: a CPU write left a dirty line");
        // Another job: its doorbell is where the model evicts.
        let f = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(va + 4096 - 8)).unwrap();
        dev.wait(f, 5_000_000_000).unwrap();
        let mut got = vec![0u8; 4096];
        dev.read(h, 0, &mut got).unwrap();
        got[4088..].copy_from_slice(&want[4088..]); // the timestamp
        let bad: Vec<usize> = (0..4096).filter(|&i| got[i] != want[i]).collect();
        assert!(bad.is_empty(), "{generation:?}: {} bytes differ, first at {:?}", bad.len(), bad.first());
        dev.free(h).unwrap();
        assert_eq!(dev.shutdown().leaked_buffers, 0);
    }
}
