//! Local memory through the driver on the in-process model (gen2 has 2 MiB
//! of local memory by default): placement, explicit eviction and restore
//! with contents kept under one GPU address, the typed refusals, the
//! fallback where there is no local memory, and a clean shutdown.

use platform_linux::InProcess;
use refgpu_model::{Generation, ModelConfig};
use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::{BufferUse, MoveError, Residency, Submit};
use umd_core::mem::BufferDesc;
use umd_core::storage::DeviceStorage;
use umd_core::sync::QueueId;

const T: u64 = 5_000_000_000;

fn model(gen: Generation) -> InProcess {
    InProcess::new(ModelConfig { generation: gen, mem_size: 64 << 20, ..ModelConfig::default() }).unwrap()
}

#[test]
fn contents_survive_eviction_and_restore_under_one_address() {
    let p = model(Generation::Gen2);
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, InProcess, 16> =
        Device::new(&p, &mut storage, Config::DEFAULT, MmuMode::DEFAULT).unwrap();
    let lm = dev.local_memory().expect("gen2 has local memory");
    assert_eq!(lm.size, 2 << 20);
    let w = dev.alloc(&BufferDesc::new(256 << 10).local().tag("weights")).unwrap();
    let back = dev.alloc(&BufferDesc::new(256 << 10).declared()).unwrap();
    let (wv, bv) = (dev.va(w).unwrap(), dev.va(back).unwrap());
    assert_eq!(dev.residency(w), Ok(Residency::Local));
    assert_eq!(dev.local_memory().unwrap().used, 256 << 10);
    // The CPU can not touch it.
    assert!(dev.write_words(w, 0, &[1]).is_err());
    let fill = [BufferUse::write(w)];
    let f = dev
        .submit_with(&Submit::on(QueueId::COPY).using(&fill), |cb| cb.fill(wv, 256 << 10, 0xC0FFEE))
        .unwrap();
    // Busy while its fill is in flight (or already done: then it moves).
    match dev.evict(w) {
        Err(MoveError::Busy) | Ok(()) => {}
        other => panic!("{other:?}"),
    }
    dev.wait(f, T).unwrap();
    if dev.residency(w) == Ok(Residency::Local) {
        dev.evict(w).unwrap();
    }
    assert_eq!(dev.residency(w), Ok(Residency::System));
    assert_eq!(dev.va(w).unwrap(), wv, "the GPU address did not change");
    assert_eq!(dev.local_memory().unwrap().used, 0);
    assert_eq!(dev.evict(w), Err(MoveError::NotLocal), "already in system memory");
    let read = |dev: &Device<'_, InProcess, 16>| {
        let uses = [BufferUse::read(w), BufferUse::write(back)];
        let f = dev
            .submit_with(&Submit::on(QueueId::COPY).using(&uses), |cb| cb.copy(wv, bv, 256 << 10))
            .unwrap();
        dev.wait(f, T).unwrap();
        (dev.read_u32(back, 0).unwrap(), dev.read_u32(back, (64 << 10) - 1).unwrap())
    };
    assert_eq!(read(&dev), (0xC0FFEE, 0xC0FFEE), "read from system memory after the eviction");
    dev.make_resident(w).unwrap();
    assert_eq!(dev.residency(w), Ok(Residency::Local));
    assert_eq!(read(&dev), (0xC0FFEE, 0xC0FFEE), "read from local memory after the restore");
    let s = dev.stats();
    assert!(s.evictions >= 1 && s.restores >= 1 && s.bytes_moved >= 2 * (256 << 10), "{s:?}");
    // A plain buffer is not a local one.
    assert_eq!(dev.evict(back), Err(MoveError::NotLocal));
    dev.free(w).unwrap();
    dev.free(back).unwrap();
    assert_eq!(dev.shutdown().leaked_buffers, 0);
    assert_eq!(p.dma_pages_used(), 0, "every system page came back");
}

#[test]
fn without_local_memory_the_buffer_lives_in_system_memory() {
    let p = model(Generation::Gen1);
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, InProcess, 16> =
        Device::new(&p, &mut storage, Config::DEFAULT, MmuMode::DEFAULT).unwrap();
    assert_eq!(dev.local_memory(), None);
    let w = dev.alloc(&BufferDesc::new(4096).local()).unwrap();
    assert_eq!(dev.residency(w), Ok(Residency::System));
    assert_eq!(dev.evict(w), Err(MoveError::NotLocal));
    assert_eq!(dev.make_resident(w), Err(MoveError::NotLocal));
    dev.free(w).unwrap();
}

/// Seed for the stress tests' schedule: `UMD_STRESS_SEED` or the clock;
/// printed so that a failure can be replayed.
fn seed() -> u64 {
    let s = std::env::var("UMD_STRESS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    println!("seed {s} (UMD_STRESS_SEED={s} replays the schedule's pauses)");
    s
}

/// The stress tests' configuration: a 5 s hang window, so that an engine
/// thread of the in-process model starved on a loaded host is not taken
/// for a hang (the tests are about moves, not hangs).
const STRESS_CONFIG: Config = Config {
    hang: umd_core::config::HangConfig { window_ns: 5_000_000_000, ..Config::DEFAULT.hang },
    ..Config::DEFAULT
};

/// Moves race declared work: one thread fills a local buffer on COMPUTE
/// and copies it out on GFX, declaring both uses, while `movers` threads
/// evict it and bring it back as fast as they can. A move and a declared
/// use exclude each other (`docs/memory.md`, "Local memory and
/// eviction"), so every round must read back exactly what it wrote, no
/// job may fault, and no memory may be lost.
fn moves_race_declared_work(movers: usize, rounds: u32) {
    let mut rng = seed();
    let p = model(Generation::Gen2);
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, InProcess, 16> =
        Device::new(&p, &mut storage, STRESS_CONFIG, MmuMode::DEFAULT).unwrap();
    const BYTES: u64 = 256 << 10;
    let w = dev.alloc(&BufferDesc::new(BYTES).local().tag("moved")).unwrap();
    let back = dev.alloc(&BufferDesc::new(BYTES).declared().tag("back")).unwrap();
    let (wv, bv) = (dev.va(w).unwrap(), dev.va(back).unwrap());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let moved = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|t| {
        for m in 0..movers {
            let (dev, stop, moved) = (&dev, &stop, &moved);
            t.spawn(move || {
                let mut i = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i = i.wrapping_add(1);
                    let r = if (i + m as u32) % 2 == 0 { dev.evict(w) } else { dev.make_resident(w) };
                    match r {
                        Ok(()) => {
                            moved.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(MoveError::Busy | MoveError::NotLocal | MoveError::NoRoom) => {}
                        Err(e) => panic!("mover {m}: {e:?}"),
                    }
                }
            });
        }
        let mut bad = Vec::new();
        for round in 1..=rounds {
            let value = 0x5A00_0000 | round;
            let fill = [BufferUse::write(w)];
            let f = dev
                .submit_with(&Submit::on(QueueId::COMPUTE).using(&fill), |cb| cb.fill(wv, BYTES, value))
                .unwrap();
            if let Err(e) = dev.wait(f, T) {
                bad.push(format!("round {round}: the fill failed: {e:?}"));
            }
            // A pause of 0-63 µs lets the movers in between the two jobs.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            std::thread::sleep(std::time::Duration::from_micros(rng % 64));
            let uses = [BufferUse::read(w), BufferUse::write(back)];
            let c =
                dev.submit_with(&Submit::on(QueueId::GFX).using(&uses), |cb| cb.copy(wv, bv, BYTES)).unwrap();
            if let Err(e) = dev.wait(c, T) {
                bad.push(format!("round {round}: the copy-out failed: {e:?}"));
            }
            let got = (dev.read_u32(back, 0).unwrap(), dev.read_u32(back, BYTES / 4 - 1).unwrap());
            if got != (value, value) {
                bad.push(format!("round {round}: wrote {value:#x}, read back {:#x} / {:#x}", got.0, got.1));
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(bad.is_empty(), "{} of {rounds} rounds went wrong:\n{}", bad.len(), bad.join("\n"));
    });
    let moves = moved.load(std::sync::atomic::Ordering::Relaxed);
    println!("{rounds} rounds, {movers} movers, {moves} moves, every round read back what it wrote");
    assert!(moves > 0, "no move happened: the test proved nothing");
    dev.free(w).unwrap();
    dev.free(back).unwrap();
    assert_eq!(dev.shutdown().leaked_buffers, 0);
    assert_eq!(p.dma_pages_used(), 0, "every system page came back");
}

#[test]
fn a_move_and_a_declared_use_exclude_each_other() {
    moves_race_declared_work(1, 400);
}

#[test]
fn two_movers_and_a_declared_use_lose_nothing() {
    moves_race_declared_work(2, 400);
}

/// A local allocation that local memory's free pages hold only in pieces
/// (fragmented: enough free bytes, no run long enough) evicts idle buffers
/// until it fits, as when the bytes themselves are missing, and never
/// spins on the retry: 8 buffers of 256 KiB fill the 2 MiB, every other
/// one is freed (1 MiB free in four holes of 256 KiB), then 512 KiB is
/// asked for. Before, the room-making step saw enough free bytes, said so
/// without evicting, the retry failed again, and the allocation looped
/// forever without letting time pass. A watchdog of 30 s (a failure
/// guard, not a performance bound) turns that into a failure.
#[test]
fn a_local_allocation_in_fragmented_local_memory_evicts_instead_of_spinning() {
    let p: &'static InProcess = Box::leak(Box::new(model(Generation::Gen2)));
    let storage: &'static mut DeviceStorage = Box::leak(Box::default());
    let dev: &'static Device<'static, InProcess, 16> =
        Box::leak(Box::new(Device::new(p, storage, Config::DEFAULT, MmuMode::DEFAULT).unwrap()));
    assert_eq!(dev.local_memory().map(|l| l.size), Some(2 << 20));
    let mut bufs: Vec<_> = (0..8).map(|_| dev.alloc(&BufferDesc::new(256 << 10).local()).unwrap()).collect();
    assert!(bufs.iter().all(|b| dev.residency(*b) == Ok(Residency::Local)));
    assert_eq!(dev.local_memory().unwrap().used, 2 << 20, "local memory full");
    for i in [6, 4, 2, 0] {
        dev.free(bufs.remove(i)).unwrap();
    }
    assert_eq!(dev.local_memory().unwrap().used, 1 << 20, "four holes of 256 KiB");
    let before = dev.stats();
    let t = std::thread::spawn(move || dev.alloc(&BufferDesc::new(512 << 10).local()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !t.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "a local allocation in fragmented local memory did not return within 30 s (it spins)"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let big = t.join().unwrap().expect("the allocation succeeds");
    let s = dev.stats();
    assert_eq!(dev.residency(big), Ok(Residency::Local), "room was made by eviction: {s:?}");
    assert!(s.evictions > before.evictions, "{s:?}");
    assert_eq!(s.local_fallbacks, before.local_fallbacks, "{s:?}");
    dev.free(big).unwrap();
    for b in bufs {
        dev.free(b).unwrap();
    }
    assert_eq!(dev.buffer_stats().live, 0);
}
