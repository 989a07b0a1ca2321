//! Hangs and recovery: WAIT_MEM that never holds, CHAIN loops, reset during
//! a long DMA, cross-engine waits, shutdown of a hung model.

mod common;

use std::time::Duration;

use common::*;
use refgpu_model::regs;
use refgpu_model::{Generation, Model};

/// Samples (RPTR, CUR_ADDR, fence) twice and says whether anything moved.
fn progressed(r: &Rig, e: usize, fence: u64, over: Duration) -> bool {
    let sample = || {
        let s = r.snap(e);
        (s.rptr, s.cur_addr, r.m.read_u64(fence).unwrap())
    };
    let a = sample();
    std::thread::sleep(over);
    a != sample()
}

#[test]
fn wait_mem_forever_then_reset() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        let mut s = r.enc.wait_mem(DATA, 1, u64::MAX, 0, true);
        s.extend(r.enc.fence(DATA + 0x40, 1, true));
        r.submit(GFX, &s);
        r.wait_for("waiting", || r.snap(GFX).waiting());
        assert!(!progressed(&r, GFX, DATA + 0x40, Duration::from_millis(100)));
        let st = r.snap(GFX);
        assert!(st.busy() && st.waiting() && !st.halted());
        r.reset(GFX);
        assert_eq!(r.snap(GFX).status, 0);
        assert_eq!(r.m.read_u64(DATA + 0x40).unwrap(), 0, "abandoned packets never ran");
        let s = r.enc.fence(DATA + 0x80, 2, false);
        r.submit(GFX, &s);
        r.wait_idle(GFX);
        assert_eq!(r.m.read_u64(DATA + 0x80).unwrap(), 2);
    }
}

#[test]
fn wait_mem_satisfied_by_another_engine() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        let e = r.enc;
        let src = DATA + 0x10_0000;
        let mid = DATA + 0x20_0000;
        let dst = DATA + 0x30_0000;
        let sem = DATA + 0x40;
        let payload: Vec<u8> = (0..0x8_0000).map(|i| (i * 13 % 251) as u8).collect();
        r.m.write_mem(src, &payload).unwrap();
        // GFX waits for COPY's fence, then copies what COPY produced.
        let mut g = Stream::new(e, r.ring_va[GFX]);
        g.push(e.wait_mem(sem, 7, u64::MAX, 6, true));
        g.push_dma(e.dma_copy(mid, dst, payload.len() as u32));
        g.push(e.fence(sem + 64, 1, true));
        let gdw = g.dw.clone();
        r.submit(GFX, &gdw);
        r.wait_for("GFX waiting", || r.snap(GFX).waiting());
        let mut c = Stream::new(e, r.ring_va[COPY]);
        c.push_dma(e.dma_copy(src, mid, payload.len() as u32));
        c.push(e.fence(sem, 7, false));
        let cdw = c.dw.clone();
        r.submit(COPY, &cdw);
        r.wait_idle(COPY);
        r.wait_idle(GFX);
        let mut got = vec![0u8; payload.len()];
        r.m.read_mem(dst, &mut got).unwrap();
        assert!(got == payload, "{gen:?}: release/acquire through the fence");
    }
}

#[test]
fn three_engine_pipeline_with_semaphores() {
    // COPY -> COMPUTE -> COPY through fences, 20 rounds.
    let mut r = Rig::new(Generation::Gen2);
    let e = r.enc;
    let n = 1024u32;
    let a = DATA;
    let b = DATA + 0x1_0000;
    let out = DATA + 0x2_0000;
    let sem1 = DATA + 0x10_0000;
    let sem2 = DATA + 0x10_0040;
    let ones = vec![1u32; n as usize];
    r.m.write_dwords(b, &ones).unwrap();
    for round in 1..=20u64 {
        let mut c1 = Stream::new(e, r.ring_va[COPY] + u64::from(r.wptr[COPY]));
        c1.push_dma(e.fill(a, 4 * n, round as u32));
        c1.push(e.fence(sem1, round, false));
        let mut k = Stream::new(e, r.ring_va[COMPUTE] + u64::from(r.wptr[COMPUTE]));
        k.push(e.wait_mem(sem1, round, u64::MAX, 6, true));
        k.push_dma(e.dispatch(0, a, b, out, n, 0));
        k.push(e.fence(sem2, round, true));
        let kdw = k.dw.clone();
        let cdw = c1.dw.clone();
        r.submit(COMPUTE, &kdw);
        r.submit(COPY, &cdw);
        r.wait_for("round", || r.m.read_u64(sem2).unwrap() == round);
        let v = r.read_u32s(out, n as usize);
        assert!(v.iter().all(|&x| x == round as u32 + 1), "round {round}");
        r.wait_idle(COPY);
        r.wait_idle(COMPUTE);
        // Rewind the rings each round.
        r.reset(COPY);
        r.reset(COMPUTE);
    }
}

#[test]
fn chain_loop_is_a_resettable_hang() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        let e = r.enc;
        // IB A chains to B, B chains back to A.
        let ia = DATA + 0x1000;
        let ib = DATA + 0x2000;
        r.m.write_dwords(ia, &e.chain(ib, 4)).unwrap();
        r.m.write_dwords(ib, &e.chain(ia, 4)).unwrap();
        let mut s = e.ib(ia, 4);
        s.extend(e.fence(DATA + 0x40, 1, true));
        r.submit(GFX, &s);
        // Wait until the engine is in the loop (a fixed sleep would let a
        // starved engine thread pass the checks below without ever having
        // started), then check that it stays there.
        r.wait_for("GFX in the CHAIN loop", || {
            let st = r.snap(GFX);
            st.status & regs::STATUS_IN_IB != 0 && (st.cur_addr == ia || st.cur_addr == ib)
        });
        // The driver's view: RPTR and the fence do not move.
        let st = r.snap(GFX);
        assert!(st.busy() && !st.halted());
        assert_eq!(st.rptr, 0);
        assert_eq!(r.m.read_u64(DATA + 0x40).unwrap(), 0);
        let before = r.snap(GFX).rptr;
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(r.snap(GFX).rptr, before, "no progress");
        // Other engines still run meanwhile.
        let w = e.write_data(DATA + 0x100, &[5]);
        r.submit(COPY, &w);
        r.wait_idle(COPY);
        r.reset(GFX);
        assert_eq!(r.snap(GFX).status, 0);
        let s = e.fence(DATA + 0x80, 9, false);
        r.submit(GFX, &s);
        r.wait_idle(GFX);
        assert_eq!(r.m.read_u64(DATA + 0x80).unwrap(), 9);
        assert_eq!(r.m.read_u64(DATA + 0x40).unwrap(), 0);
    }
}

#[test]
fn self_chain_keeps_cur_addr_still() {
    let mut r = Rig::new(Generation::Gen1);
    let ia = DATA + 0x1000;
    r.m.write_dwords(ia, &r.enc.chain(ia, 4)).unwrap();
    let s = r.enc.ib(ia, 4);
    r.submit(COMPUTE, &s);
    // Wait until the engine reached the self-CHAIN; only then can nothing
    // move any more (before, CUR_ADDR goes from the ring to the IB).
    r.wait_for("COMPUTE in the self-CHAIN", || {
        let st = r.snap(COMPUTE);
        st.status & regs::STATUS_IN_IB != 0 && st.cur_addr == ia
    });
    assert!(!progressed(&r, COMPUTE, DATA + 0x40, Duration::from_millis(100)));
    assert_eq!(r.snap(COMPUTE).cur_addr, ia);
    r.reset(COMPUTE);
}

#[test]
fn reset_during_long_dma() {
    // A 1 GiB gen2 DMA_COPY whose source and destination VAs alias one
    // 2 MiB physical block each, cheap in host memory, in an IB that CHAINs
    // back to itself: the engine copies for as long as it is not reset, so
    // the reset lands while a DMA runs (or in the instant of a CHAIN hop)
    // however late this thread gets to it. A single DMA could finish first
    // on a loaded machine, and the FENCE behind it would then run.
    let mut r = Rig::new(Generation::Gen2);
    let e = r.enc;
    let mut pt = PageTables::new(&r.m, PT_POOL, PT_POOL_SIZE);
    pt.map_range_4k(&r.m, RING_AREA, RING_AREA, 3 * RING_STRIDE, RW);
    pt.map_range_4k(&r.m, DATA, DATA, 0x1000, RW);
    let (src_va, dst_va) = (0x40_0000_0000u64, 0x80_0000_0000u64);
    for i in 0..512u64 {
        pt.map_2m(&r.m, src_va + (i << 21), MEM_BASE + (4 << 20), PTE_R);
        pt.map_2m(&r.m, dst_va + (i << 21), MEM_BASE + (8 << 20), RW);
    }
    pt.enable(&r.m);
    r.m.write_mem(MEM_BASE + (4 << 20), &[0x5Au8; 4096]).unwrap();
    // The IB (32-byte aligned, identity mapped): DMA_COPY, CHAIN to itself.
    let ib = DATA + 0x800;
    let mut body = e.dma_copy(src_va, dst_va, 1 << 30);
    body.extend(e.chain(ib, 10));
    assert_eq!(body.len(), 10);
    r.m.write_dwords(ib, &body).unwrap();
    let mut st = Stream::new(e, r.ring_va[COPY]);
    st.push(e.nop(0));
    st.push(e.ib(ib, body.len() as u32));
    st.push(e.fence(DATA + 0x40, 1, false));
    let dw = st.dw.clone();
    r.submit(COPY, &dw);
    r.wait_for("DMA under way, CUR_ADDR at the DMA", || {
        let s = r.snap(COPY);
        r.m.read_u32(MEM_BASE + (8 << 20)).unwrap() != 0 && (s.cur_addr, s.busy()) == (ib, true)
    });
    r.reset(COPY);
    let s = r.snap(COPY);
    assert_eq!((s.status, s.rptr, s.fault_status), (0, 0, 0));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(r.m.read_u64(DATA + 0x40).unwrap(), 0, "the packets after the DMA never ran");
    let w = e.write_data(DATA + 0x100, &[1]);
    r.submit(COPY, &w);
    r.wait_idle(COPY);
    assert_eq!(r.read_u32s(DATA + 0x100, 1), [1]);
}

#[test]
fn reset_while_halted_waiting_or_idle_is_quick() {
    let mut r = Rig::new(Generation::Gen1);
    for _ in 0..20 {
        r.reset(GFX); // idle
    }
    let s = r.enc.wait_mem(DATA, 1, 1, 0, false);
    r.submit(GFX, &s);
    r.wait_for("waiting", || r.snap(GFX).waiting());
    r.reset(GFX);
    let s = vec![0xFF00_0000];
    r.submit(GFX, &s);
    r.wait_fault(GFX);
    r.reset(GFX);
    assert_eq!(r.snap(GFX).status, 0);
}

#[test]
fn drop_of_a_hung_model_returns() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = Rig::new(Generation::Gen2);
        let e = r.enc;
        let s = e.wait_mem(DATA, 1, 1, 0, false);
        r.submit(GFX, &s);
        let ia = DATA + 0x1000;
        r.m.write_dwords(ia, &e.chain(ia, 4)).unwrap();
        let s = e.ib(ia, 4);
        r.submit(COPY, &s);
        // Hung for real before the shutdown: GFX waiting, COPY looping.
        r.wait_for("GFX waiting", || r.snap(GFX).waiting());
        r.wait_for("COPY in the self-CHAIN", || r.snap(COPY).cur_addr == ia);
        let m: Model = r.m;
        m.shutdown();
        assert!(!m.engines_alive());
        drop(m);
        tx.send(()).unwrap();
    });
    // The thread first waits (each with a GUARD) for the hang itself.
    rx.recv_timeout(3 * GUARD).expect("shutdown of a hung model must return");
}

#[test]
fn irq_status_is_cleared_by_reset_only_for_that_engine() {
    let mut r = Rig::new(Generation::Gen1);
    for e in [GFX, COMPUTE, COPY] {
        let s = r.enc.fence(DATA + 0x40 * e as u64, 1, true);
        r.submit(e, &s);
        r.wait_idle(e);
    }
    assert_eq!(r.m.read_reg(regs::IRQ_STATUS), 0x7);
    r.reset(COMPUTE);
    assert_eq!(r.m.read_reg(regs::IRQ_STATUS), 0x5);
}
