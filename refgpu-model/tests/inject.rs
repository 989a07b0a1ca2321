//! Fault-injection knobs, each on its own.

mod common;

use std::time::{Duration, Instant};

use common::*;
use refgpu_model::regs;
use refgpu_model::{FaultInjection, Generation};

#[test]
fn packet_latency_on_one_engine() {
    let mut r = Rig::new(Generation::Gen1);
    r.m.set_fault_injection(FaultInjection {
        packet_latency: Duration::from_millis(5),
        latency_engines: 1 << GFX,
        ..FaultInjection::default()
    });
    let nops = vec![0u32; 10];
    let t0 = Instant::now();
    r.submit(GFX, &nops);
    r.wait_idle(GFX);
    let gfx_done = t0.elapsed();
    assert!(gfx_done >= Duration::from_millis(50), "10 packets x 5 ms: {gfx_done:?}");
    // The COPY engine has no latency. Comparing completion times would
    // depend on scheduling; instead give GFX an hour before each packet:
    // COPY runs all of its packets while GFX still waits before its first.
    r.m.set_fault_injection(FaultInjection {
        packet_latency: Duration::from_secs(3600),
        latency_engines: 1 << GFX,
        ..FaultInjection::default()
    });
    r.submit(GFX, &nops);
    r.submit(COPY, &nops);
    r.wait_idle(COPY);
    assert_eq!(r.snap(GFX).rptr, 40, "GFX ran a packet inside its latency");
    // A reset abandons the wait.
    r.reset(GFX);
    // Removing the knob at runtime.
    r.m.set_fault_injection(FaultInjection::default());
    assert_eq!(r.m.fault_injection(), FaultInjection::default());
    r.submit(GFX, &nops);
    r.wait_idle(GFX);
}

#[test]
fn drop_the_nth_fence() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        r.m.set_fault_injection(FaultInjection {
            drop_fence_nth: Some(2),
            drop_fence_engines: 1 << COMPUTE,
            ..FaultInjection::default()
        });
        let mut s = Vec::new();
        for i in 0..4u64 {
            s.extend(r.enc.fence(DATA + 64 * i, i + 1, true));
        }
        r.submit(COMPUTE, &s);
        r.wait_idle(COMPUTE);
        let got: Vec<u64> = (0..4).map(|i| r.m.read_u64(DATA + 64 * i).unwrap()).collect();
        assert_eq!(got, [1, 0, 3, 4], "{gen:?}");
        // GFX (not in the mask) keeps all its fences.
        let mut s = Vec::new();
        for i in 0..4u64 {
            s.extend(r.enc.fence(DATA + 0x1000 + 64 * i, i + 1, false));
        }
        r.submit(GFX, &s);
        r.wait_idle(GFX);
        let got: Vec<u64> = (0..4).map(|i| r.m.read_u64(DATA + 0x1000 + 64 * i).unwrap()).collect();
        assert_eq!(got, [1, 2, 3, 4]);
    }
}

fn dropped_set(seed: u64, p: f64) -> Vec<bool> {
    let mut r = Rig::new(Generation::Gen2);
    r.m.set_fault_injection(FaultInjection { drop_fence_probability: p, seed, ..FaultInjection::default() });
    let mut s = Vec::new();
    for i in 0..150u64 {
        s.extend(r.enc.fence(DATA + 64 * i, 1, false));
    }
    r.submit(GFX, &s);
    r.wait_idle(GFX);
    (0..150).map(|i| r.m.read_u64(DATA + 64 * i).unwrap() == 0).collect()
}

#[test]
fn drop_fences_with_seeded_probability() {
    let a = dropped_set(42, 0.5);
    let b = dropped_set(42, 0.5);
    let c = dropped_set(43, 0.5);
    assert_eq!(a, b, "same seed, same drops");
    assert_ne!(a, c, "another seed, other drops");
    let n = a.iter().filter(|&&d| d).count();
    assert!((30..=120).contains(&n), "{n} of 150 dropped at p = 0.5");
    assert!(dropped_set(1, 1.0).iter().all(|&d| d));
    assert!(dropped_set(1, 0.0).iter().all(|&d| !d));
}

#[test]
fn dropped_fence_raises_no_interrupt() {
    let mut r = Rig::new(Generation::Gen1);
    r.m.set_fault_injection(FaultInjection { drop_fence_nth: Some(1), ..FaultInjection::default() });
    let s = r.enc.fence(DATA, 5, true);
    r.submit(GFX, &s);
    r.wait_idle(GFX);
    assert_eq!(r.m.read_u64(DATA).unwrap(), 0);
    assert_eq!(r.m.read_reg(regs::IRQ_STATUS), 0);
}

#[test]
fn stalled_engine_stops_fetching() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        r.m.set_fault_injection(FaultInjection { stalled_engines: 1 << COPY, ..FaultInjection::default() });
        let s = r.enc.write_data(DATA, &[1]);
        r.submit(COPY, &s);
        r.submit(GFX, &r.enc.write_data(DATA + 4, &[2]));
        r.wait_idle(GFX);
        std::thread::sleep(Duration::from_millis(30));
        let st = r.snap(COPY);
        assert_eq!((st.rptr, st.busy()), (0, true));
        assert_eq!(r.read_u32s(DATA, 2), [0, 2]);
        r.m.set_fault_injection(FaultInjection::default());
        r.wait_idle(COPY);
        assert_eq!(r.read_u32s(DATA, 1), [1]);
    }
}

#[test]
fn stall_mid_ib_and_reset_while_stalled() {
    let mut r = Rig::new(Generation::Gen1);
    let ib = DATA + 0x1000;
    let mut body = r.enc.write_data(DATA, &[1]);
    body.extend(r.enc.wait_mem(DATA + 0x100, 1, 1, 0, false));
    body.extend(r.enc.write_data(DATA + 4, &[2]));
    r.m.write_dwords(ib, &body).unwrap();
    let s = r.enc.ib(ib, body.len() as u32);
    r.submit(GFX, &s);
    r.wait_for("waiting", || r.snap(GFX).waiting());
    r.m.set_fault_injection(FaultInjection { stalled_engines: 1, ..FaultInjection::default() });
    r.m.write_u32(DATA + 0x100, 1).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(r.read_u32s(DATA, 2), [1, 0], "stalled before the next packet of the IB");
    r.reset(GFX);
    assert_eq!(r.snap(GFX).status, 0);
    r.m.set_fault_injection(FaultInjection::default());
    let s = r.enc.write_data(DATA + 8, &[3]);
    r.submit(GFX, &s);
    r.wait_idle(GFX);
    assert_eq!(r.read_u32s(DATA, 3), [1, 0, 3]);
}

#[test]
fn delayed_interrupts() {
    let mut r = Rig::new(Generation::Gen2);
    let delay = Duration::from_millis(150);
    r.m.set_fault_injection(FaultInjection { irq_delay: delay, ..FaultInjection::default() });
    let s = r.enc.fence(DATA, 1, true);
    let t0 = Instant::now();
    r.submit(GFX, &s);
    r.wait_for("IRQ_STATUS", || r.m.read_reg(regs::IRQ_STATUS) & 1 != 0);
    assert_eq!(r.m.read_u64(DATA).unwrap(), 1, "the fence itself is not delayed");
    assert_eq!(r.next_irq(), GFX as u32);
    assert!(t0.elapsed() >= delay, "vector delivered after {:?}", t0.elapsed());
    // Back to immediate delivery.
    r.m.set_fault_injection(FaultInjection::default());
    r.m.write_reg(regs::IRQ_STATUS, 1);
    let s = r.enc.fence(DATA, 2, true);
    r.submit(GFX, &s);
    assert_eq!(r.next_irq(), GFX as u32);
}

#[test]
fn initial_injection_from_config() {
    let cfg = refgpu_model::ModelConfig {
        fault_injection: FaultInjection { stalled_engines: 0b111, ..FaultInjection::default() },
        ..config(Generation::Gen1)
    };
    let mut r = Rig::with_config(cfg);
    let s = r.enc.write_data(DATA, &[1]);
    r.submit(GFX, &s);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(r.snap(GFX).rptr, 0);
    r.m.set_fault_injection(FaultInjection::default());
    r.wait_idle(GFX);
}
