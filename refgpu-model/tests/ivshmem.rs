//! The ivshmem binding (spec 2.3): the model over caller-provided mappings
//! of the register page and system memory, with a "host" on the other side
//! that only uses 32-bit atomics on the page and rings doorbells.

mod common;

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use refgpu_model::regs::{self, eng};
use refgpu_model::{ChannelSink, Generation, Model};

/// Stand-ins for the two shared mappings (8-aligned allocations).
struct Mappings {
    regs: Vec<u64>,
    mem: Vec<u64>,
}

/// The host side: 32-bit atomics on the shared page only.
struct Host {
    page: *mut u32,
}

impl Host {
    fn reg(&self, off: u32) -> &AtomicU32 {
        assert!(off % 4 == 0 && off < 4096);
        // SAFETY: `page` points at the 4 KiB register page, which outlives
        // the Host in every test; all accesses to it are atomic.
        unsafe { AtomicU32::from_ptr(self.page.add(off as usize / 4)) }
    }
    fn read(&self, off: u32) -> u32 {
        self.reg(off).load(Ordering::SeqCst)
    }
    fn write(&self, off: u32, v: u32) {
        self.reg(off).store(v, Ordering::SeqCst)
    }
    fn ereg(e: usize, off: u32) -> u32 {
        regs::engine_base(e) + off
    }
}

/// The model, the host view and the mappings. Fields drop in order: the
/// model (joining its threads) before the mappings it points into.
struct Setup {
    m: Model,
    h: Host,
    rx: std::sync::mpsc::Receiver<u32>,
    maps: Box<Mappings>,
}

fn shared_model(gen: Generation) -> Setup {
    let mut maps =
        Box::new(Mappings { regs: vec![0xFFFF_FFFF_FFFF_FFFF; 512], mem: vec![0; (MEM_SIZE / 8) as usize] });
    let regs_ptr = NonNull::new(maps.regs.as_mut_ptr().cast::<u8>()).unwrap();
    let mem_ptr = NonNull::new(maps.mem.as_mut_ptr().cast::<u8>()).unwrap();
    let (sink, rx) = ChannelSink::new();
    // SAFETY: both allocations are 8-aligned, of the right sizes, and live in
    // `maps`, which `Setup` drops after the model (field order). The tests
    // touch the page only through atomics.
    let m = unsafe { Model::new_shared(config(gen), regs_ptr, mem_ptr, Some(sink as Arc<_>)) }.unwrap();
    let host = Host { page: regs_ptr.as_ptr().cast::<u32>() };
    Setup { m, h: host, rx, maps }
}

#[test]
fn page_is_initialised() {
    let t = shared_model(Generation::Gen2);
    let (m, h) = (&t.m, &t.h);
    assert!(m.is_shared());
    assert_eq!(h.read(regs::ID), 0x5247_0207);
    assert_eq!(h.read(regs::ENGINE_COUNT), 3);
    assert_eq!(h.read(regs::IRQ_STATUS), 0);
    assert_eq!(h.read(Host::ereg(2, eng::FAULT_STATUS)), 0);
}

#[test]
fn clock_is_published_as_one_64_bit_value() {
    let t = shared_model(Generation::Gen1);
    let h = &t.h;
    let read = || loop {
        let hi = h.read(regs::CLOCK_HI);
        let lo = h.read(regs::CLOCK_LO);
        if h.read(regs::CLOCK_HI) == hi {
            break (u64::from(hi) << 32) | u64::from(lo);
        }
    };
    // The model publishes the clock every 100 µs from its own thread, which
    // a loaded machine may not run for a while: poll (GUARD is a failure
    // guard, not a bound) for a first value, then for a later one.
    let poll = |what: &str, ok: &dyn Fn(u64) -> bool| {
        let t0 = std::time::Instant::now();
        loop {
            let v = read();
            if ok(v) {
                break v;
            }
            assert!(t0.elapsed() < GUARD, "timed out: {what} (CLOCK {v})");
            std::thread::sleep(Duration::from_micros(200));
        }
    };
    let a = poll("CLOCK published", &|v| v > 0);
    let b = poll("CLOCK moved", &|v| v > a);
    assert!(a > 0 && b > a, "{a} {b}");
}

#[test]
fn doorbells_apply_host_writes() {
    for gen in gens() {
        let t = shared_model(gen);
        let (m, h) = (&t.m, &t.h);
        let rx = &t.rx;
        let enc = Enc(gen);
        let e = COPY;
        let ring = RING_AREA;
        // Memory written through the shared mapping (here: the model's own
        // helpers act on the same bytes).
        let mut s = enc.write_data(DATA, &[0xAA, 0xBB]);
        s.extend(enc.fence(DATA + 0x40, 5, true));
        m.write_dwords(ring, &s).unwrap();
        h.write(Host::ereg(e, eng::RING_BASE_LO), ring as u32);
        h.write(Host::ereg(e, eng::RING_BASE_HI), 0);
        h.write(Host::ereg(e, eng::RING_SIZE), 4096);
        h.write(Host::ereg(e, eng::CTRL), regs::CTRL_ENABLE);
        h.write(regs::IRQ_MASK, 0x707);
        h.write(Host::ereg(e, eng::RING_WPTR), 4 * s.len() as u32);
        // The engine doorbell alone: CTRL.ENABLE is not applied yet.
        m.doorbell(e as u32);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(h.read(Host::ereg(e, eng::RING_RPTR)), 0);
        assert_ne!(h.read(Host::ereg(e, eng::STATUS)) & regs::STATUS_BUSY, 0);
        // The control doorbell applies CTRL and IRQ_MASK.
        m.doorbell(regs::CONTROL_VECTOR);
        assert_eq!(rx.recv_timeout(GUARD).unwrap(), e as u32);
        // The interrupt comes from inside the FENCE; RPTR moves after it.
        let t0 = std::time::Instant::now();
        while h.read(Host::ereg(e, eng::RING_RPTR)) != 4 * s.len() as u32
            || h.read(Host::ereg(e, eng::STATUS)) != 0
        {
            assert!(t0.elapsed() < GUARD);
            std::thread::yield_now();
        }
        assert_eq!(m.read_u64(DATA + 0x40).unwrap(), 5);
        assert_eq!(m.read_u32(DATA + 4).unwrap(), 0xBB);
        // IRQ_STATUS: set by the model, cleared by the host's atomic AND.
        assert_eq!(h.read(regs::IRQ_STATUS), regs::irq_fence_bit(e));
        h.reg(regs::IRQ_STATUS).fetch_and(!regs::irq_fence_bit(e), Ordering::SeqCst);
        // A second submission: only WPTR + engine doorbell.
        let s2 = enc.fence(DATA + 0x80, 6, true);
        m.write_dwords(ring + 4 * s.len() as u64, &s2).unwrap();
        h.write(Host::ereg(e, eng::RING_WPTR), 4 * (s.len() + s2.len()) as u32);
        m.doorbell(e as u32);
        assert_eq!(rx.recv_timeout(GUARD).unwrap(), e as u32, "a new 0 -> 1 edge after the host cleared it");
        assert_eq!(m.read_u64(DATA + 0x80).unwrap(), 6);
        // Unknown vectors are ignored.
        m.doorbell(4);
        m.doorbell(0xFFFF);
    }
}

#[test]
fn control_doorbell_reset_mmu_and_invalidate() {
    let t = shared_model(Generation::Gen1);
    let (m, h) = (&t.m, &t.h);
    let enc = Enc(Generation::Gen1);
    let e = GFX;
    // A hang: WAIT_MEM that never holds.
    let s = enc.wait_mem(DATA, 1, 1, 0, false);
    m.write_dwords(RING_AREA, &s).unwrap();
    h.write(Host::ereg(e, eng::RING_BASE_LO), RING_AREA as u32);
    h.write(Host::ereg(e, eng::RING_SIZE), 4096);
    h.write(Host::ereg(e, eng::CTRL), regs::CTRL_ENABLE);
    m.doorbell(regs::CONTROL_VECTOR);
    h.write(Host::ereg(e, eng::RING_WPTR), 4 * s.len() as u32);
    m.doorbell(e as u32);
    let wait = |what: &str, f: &dyn Fn() -> bool| {
        let t0 = std::time::Instant::now();
        while !f() {
            assert!(t0.elapsed() < GUARD, "timed out: {what}");
            std::thread::sleep(Duration::from_micros(200));
        }
    };
    wait("WAITING", &|| h.read(Host::ereg(e, eng::STATUS)) & regs::STATUS_WAITING != 0);
    // Reset: CTRL.RESET reads 1 until the model completes it.
    h.write(Host::ereg(e, eng::CTRL), regs::CTRL_ENABLE | regs::CTRL_RESET);
    m.doorbell(regs::CONTROL_VECTOR);
    wait("reset done", &|| h.read(Host::ereg(e, eng::CTRL)) == regs::CTRL_ENABLE);
    assert_eq!(h.read(Host::ereg(e, eng::STATUS)), 0);
    assert_eq!(h.read(Host::ereg(e, eng::RING_WPTR)), 0);
    assert_eq!(h.read(Host::ereg(e, eng::RING_RPTR)), 0);
    // MMU: tables built by the host in shared memory, then MMU_CTRL/ROOT
    // applied by the control doorbell.
    let mut pt = PageTables::new(m, PT_POOL, PT_POOL_SIZE);
    pt.map_range_4k(m, RING_AREA, RING_AREA, RING_STRIDE, RW);
    pt.map_4k(m, 0x77_0000_0000, DATA + 0x1000, RW);
    h.write(regs::MMU_ROOT_LO, pt.root as u32);
    h.write(regs::MMU_ROOT_HI, 0);
    h.write(regs::MMU_CTRL, 1);
    m.doorbell(regs::CONTROL_VECTOR);
    let s = enc.write_data(0x77_0000_0000, &[0x11]);
    m.write_dwords(RING_AREA, &s).unwrap();
    h.write(Host::ereg(e, eng::RING_WPTR), 4 * s.len() as u32);
    m.doorbell(e as u32);
    wait("write 1", &|| m.read_u32(DATA + 0x1000).unwrap() == 0x11);
    // Remap and invalidate through the page.
    pt.map_4k(m, 0x77_0000_0000, DATA + 0x2000, RW);
    h.write(regs::MMU_INVALIDATE, 1);
    m.doorbell(regs::CONTROL_VECTOR);
    assert_eq!(h.read(regs::MMU_INVALIDATE), 0, "cleared once done");
    let s2 = enc.write_data(0x77_0000_0000, &[0x22]);
    m.write_dwords(RING_AREA + 4 * s.len() as u64, &s2).unwrap();
    h.write(Host::ereg(e, eng::RING_WPTR), 4 * (s.len() + s2.len()) as u32);
    m.doorbell(e as u32);
    wait("write 2", &|| m.read_u32(DATA + 0x2000).unwrap() == 0x22);
    assert_eq!(m.read_u32(DATA + 0x1000).unwrap(), 0x11);
}

#[test]
fn wait_mem_sees_writes_it_is_not_told_about() {
    // Another process writes shared memory without any doorbell: WAIT_MEM
    // must notice by polling.
    let t = shared_model(Generation::Gen2);
    let (m, h) = (&t.m, &t.h);
    let maps = &t.maps;
    let enc = Enc(Generation::Gen2);
    let mut s = enc.wait_mem(DATA, 3, u64::MAX, 0, true);
    s.extend(enc.write_data(DATA + 0x100, &[1]));
    m.write_dwords(RING_AREA, &s).unwrap();
    h.write(Host::ereg(0, eng::RING_BASE_LO), RING_AREA as u32);
    h.write(Host::ereg(0, eng::RING_SIZE), 4096);
    h.write(Host::ereg(0, eng::CTRL), 1);
    m.doorbell(3);
    h.write(Host::ereg(0, eng::RING_WPTR), 4 * s.len() as u32);
    m.doorbell(0);
    // Blocked in WAIT_MEM before the write (a fixed sleep could end before
    // the engine thread even fetched the packet).
    let t0 = std::time::Instant::now();
    while h.read(Host::ereg(0, eng::STATUS)) & regs::STATUS_WAITING == 0 {
        assert!(t0.elapsed() < GUARD, "timed out: WAITING");
        std::thread::sleep(Duration::from_micros(200));
    }
    // Write the semaphore "behind the model's back", as another process
    // would: a raw atomic store into the mapping.
    let idx = ((DATA - MEM_BASE) / 8) as usize;
    let p = maps.mem.as_ptr().wrapping_add(idx).cast_mut();
    // SAFETY: `p` points at an 8-aligned u64 inside the live mapping; the
    // model only accesses it atomically.
    unsafe { std::sync::atomic::AtomicU64::from_ptr(p) }.store(3, Ordering::Release);
    let t0 = std::time::Instant::now();
    while m.read_u32(DATA + 0x100).unwrap() != 1 {
        assert!(t0.elapsed() < GUARD);
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// ENGINE_ROOT (spec 3.4) over ivshmem: written into the page, applied by
/// the control doorbell, cleared when the host departs is the server's job.
#[test]
fn engine_root_applies_on_the_control_doorbell() {
    let t = shared_model(Generation::Gen1);
    let (m, h) = (&t.m, &t.h);
    let enc = Enc(Generation::Gen1);
    let e = COPY;
    let va = 0x66_0000_0000u64;
    // MMU_ROOT tables a: ring + va -> DATA; engine tables b: ring + va -> DATA + 0x1000.
    let mut a = PageTables::new(m, PT_POOL, PT_POOL_SIZE / 2);
    let mut b = PageTables::new(m, PT_POOL + PT_POOL_SIZE / 2, PT_POOL_SIZE / 2);
    for pt in [&mut a, &mut b] {
        pt.map_range_4k(m, RING_AREA, RING_AREA, RING_STRIDE, RW);
    }
    a.map_4k(m, va, DATA, RW);
    b.map_4k(m, va, DATA + 0x1000, RW);
    h.write(regs::MMU_ROOT_LO, a.root as u32);
    h.write(regs::MMU_ROOT_HI, 0);
    h.write(regs::MMU_CTRL, 1);
    h.write(Host::ereg(e, eng::RING_BASE_LO), RING_AREA as u32);
    h.write(Host::ereg(e, eng::RING_SIZE), 4096);
    h.write(Host::ereg(e, eng::CTRL), regs::CTRL_ENABLE);
    m.doorbell(regs::CONTROL_VECTOR);
    let wait = |what: &str, f: &dyn Fn() -> bool| {
        let t0 = std::time::Instant::now();
        while !f() {
            assert!(t0.elapsed() < GUARD, "timed out: {what}");
            std::thread::sleep(Duration::from_micros(200));
        }
    };
    let mut wptr = 0u32;
    let mut run = |data: u32| {
        let s = enc.write_data(va, &[data]);
        m.write_dwords(RING_AREA + u64::from(wptr), &s).unwrap();
        wptr += 4 * s.len() as u32;
        h.write(Host::ereg(e, eng::RING_WPTR), wptr);
        m.doorbell(e as u32);
        wait("idle", &|| {
            h.read(Host::ereg(e, eng::RING_RPTR)) == wptr
                && h.read(Host::ereg(e, eng::STATUS)) & regs::STATUS_BUSY == 0
        });
    };
    // Written but not applied: still MMU_ROOT.
    h.write(0x040 + 8 * e as u32, b.root as u32);
    h.write(0x044 + 8 * e as u32, 0);
    run(1);
    assert_eq!(m.read_u32(DATA).unwrap(), 1, "not applied before the control doorbell");
    m.doorbell(regs::CONTROL_VECTOR);
    run(2);
    assert_eq!(m.read_u32(DATA + 0x1000).unwrap(), 2, "applied by the control doorbell");
    assert_eq!(m.translate_engine(e, va), Ok(DATA + 0x1000));
    assert_eq!(m.translate_engine(GFX, va), Ok(DATA), "other engines keep MMU_ROOT");
}
