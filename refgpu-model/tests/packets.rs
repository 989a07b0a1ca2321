//! Every packet of both generations, with data checks.

mod common;

use common::*;
use refgpu_model::regs::{self, eng};
use refgpu_model::{Access, Generation};

/// The test-side packet writer reproduces the worked examples of spec
/// section 7 exactly (so the streams below are the spec's encodings).
#[test]
fn writer_matches_spec_section_7() {
    const D: u64 = 0x12_3456_7800;
    const S: u64 = 0x12_3456_9000;
    const F: u64 = 0x12_3456_7840;
    let hex = |s: &str| s.split_whitespace().map(|w| u32::from_str_radix(w, 16).unwrap()).collect::<Vec<_>>();
    for (gen, table) in [
        (
            Generation::Gen1,
            [
                "00000000",
                "00000001 00000000",
                "01000004 34567800 00000012 DEADBEEF 01234567",
                "02000005 34569000 00000012 34567800 00000012 00001000",
                "03000004 34567800 00000012 00000040 A5A5A5A5",
                "04010004 34567840 00000012 00000002 00000001",
                "050E0006 34567840 00000012 00000005 00000000 FFFFFFFF FFFFFFFF",
                "06000002 34567800 00000012",
                "07000003 34569000 00000012 00000040",
                "08000003 34569000 00000012 00000010",
                "09030000",
                "0A020008 34569000 00000012 34567800 00000012 34568800 00000012 00000100 40000000",
            ],
        ),
        (
            Generation::Gen2,
            [
                "70000000",
                "70010000 00000000",
                "70040010 34567800 00000012 DEADBEEF 01234567",
                "70050020 00001000 34569000 00000012 34567800 00000012",
                "70040021 00000040 34567800 00000012 A5A5A5A5",
                "70040130 34567840 00000012 00000002 00000001",
                "70070031 0000000E 34567840 00000012 00000005 00000000 FFFFFFFF FFFFFFFF",
                "70020032 34567800 00000012",
                "70030040 34569000 00000012 00000040",
                "70030041 34569000 00000012 00000010",
                "70010050 00000003",
                "70080060 00010002 34569000 00000012 34567800 00000012 34568800 00000012 40000000",
            ],
        ),
    ] {
        let e = Enc(gen);
        let ours = [
            e.nop(0),
            e.nop(1),
            e.write_data(D, &[0xDEAD_BEEF, 0x0123_4567]),
            e.dma_copy(S, D, 0x1000),
            e.fill(D, 64, 0xA5A5_A5A5),
            e.fence(F, 0x1_0000_0002, true),
            e.wait_mem(F, 5, u64::MAX, 6, true),
            e.timestamp(D),
            e.ib(S, 64),
            e.chain(S, 16),
            e.barrier(true, true),
            e.dispatch(2, S, D, D + 0x1000, 256, 0x4000_0000),
        ];
        for (o, t) in ours.iter().zip(table) {
            assert_eq!(*o, hex(t), "{gen:?}: {t}");
        }
    }
}

#[test]
fn id_and_engine_count() {
    for gen in gens() {
        let r = Rig::new(gen);
        assert_eq!(r.m.read_reg(regs::ID), 0x5247_0007 | (u32::from(gen.number()) << 8));
        assert_eq!(r.m.read_reg(regs::ENGINE_COUNT), 3);
        assert_eq!(r.m.read_reg(0x008), 0, "unlisted offset reads 0");
        r.m.write_reg(0x008, 5);
        assert_eq!(r.m.read_reg(0x008), 0, "unlisted offset ignores writes");
        assert_eq!(r.m.read_reg(0x1000), 0);
        assert_eq!(r.m.read_reg(0x011), 0, "misaligned offset");
    }
}

#[test]
fn clock_latch_and_monotonic() {
    let r = Rig::new(Generation::Gen1);
    let read = || {
        let lo = r.m.read_reg(regs::CLOCK_LO);
        let hi = r.m.read_reg(regs::CLOCK_HI);
        (u64::from(hi) << 32) | u64::from(lo)
    };
    let a = read();
    std::thread::sleep(std::time::Duration::from_millis(2));
    let b = read();
    assert!(b > a && b - a >= 2_000_000, "{a} {b}");
}

#[test]
fn nop_any_payload() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        let e = r.enc;
        let mut s = e.nop(0);
        s.extend(e.nop(5).iter().enumerate().map(|(i, &d)| if i == 0 { d } else { 0xFFFF_FFFF }));
        s.extend(e.nop(1));
        r.submit(GFX, &s);
        r.wait_idle(GFX);
        assert_eq!(r.snap(GFX).rptr, 4 * 9);
        assert_eq!(r.snap(GFX).cur_addr, r.ring_va[GFX] + 4 * 7, "CUR_ADDR = last header");
    }
}

#[test]
fn write_data() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        let data: Vec<u32> = (0..100).map(|i| 0x1000_0000 + i).collect();
        let s = r.enc.write_data(DATA + 4, &data);
        r.submit(COPY, &s);
        r.wait_idle(COPY);
        assert_eq!(r.read_u32s(DATA + 4, 100), data);
        assert_eq!(r.read_u32s(DATA, 1), [0]);
        assert_eq!(r.read_u32s(DATA + 404, 1), [0]);
    }
}

#[test]
fn write_data_max_ndw() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        r.ring_size = 65536;
        r.setup_ring(GFX, r.ring_va[GFX], 65536);
        let max = gen.rules().max_ndw as usize;
        let data: Vec<u32> = (0..max as u32 - 2).map(|i| i.wrapping_mul(0x9E37_79B9)).collect();
        let s = r.enc.write_data(DATA, &data);
        assert_eq!(s.len(), max + 1);
        r.submit(GFX, &s);
        r.wait_idle(GFX);
        assert_eq!(r.read_u32s(DATA, data.len()), data);
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn dma_copy_sizes_and_offsets() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        let src = DATA + 0x10_0000;
        let cases: [(u64, u64, u32); 5] =
            [(0, 0, 1), (3, 5, 7), (0, 0, 4096), (1, 2, 70_001), (4095, 9, 200_000)];
        let mut st = Stream::new(r.enc, r.ring_va[COPY]);
        let mut expect = Vec::new();
        for (i, &(so, dofs, size)) in cases.iter().enumerate() {
            let s = src + 0x4_0000 * i as u64 + so;
            let d = DATA + 0x40_0000 + 0x4_0000 * i as u64 + dofs;
            let p = pattern(size as usize, i as u8 + 1);
            r.m.write_mem(s, &p).unwrap();
            st.push_dma(r.enc.dma_copy(s, d, size));
            expect.push((d, p));
        }
        let dw = st.dw.clone();
        r.submit(COPY, &dw);
        r.wait_idle(COPY);
        for (d, p) in expect {
            let mut got = vec![0u8; p.len() + 2];
            r.m.read_mem(d - 1, &mut got).unwrap();
            assert_eq!(&got[1..=p.len()], &p[..], "{gen:?} copy to {d:#x}");
            assert_eq!(got[0], 0);
            assert_eq!(got[p.len() + 1], 0);
        }
    }
}

#[test]
fn dma_copy_overlap_is_memmove() {
    for gen in gens() {
        for (src_off, dst_off) in [(0u64, 100u64), (100, 0), (0, 70_000), (70_000, 0), (0, 0)] {
            let mut r = Rig::new(gen);
            let size = 200_000u32;
            let base = DATA;
            let p = pattern(size as usize + 70_000, 9);
            r.m.write_mem(base, &p).unwrap();
            let mut st = Stream::new(r.enc, r.ring_va[COPY]);
            st.push_dma(r.enc.dma_copy(base + src_off, base + dst_off, size));
            let dw = st.dw.clone();
            r.submit(COPY, &dw);
            r.wait_idle(COPY);
            let mut model = p.clone();
            model.copy_within(src_off as usize..(src_off as usize + size as usize), dst_off as usize);
            let mut got = vec![0u8; model.len()];
            r.m.read_mem(base, &mut got).unwrap();
            assert!(got == model, "{gen:?} overlap {src_off}->{dst_off}");
        }
    }
}

#[test]
fn fill() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        let mut st = Stream::new(r.enc, r.ring_va[GFX]);
        st.push_dma(r.enc.fill(DATA + 4, 4, 0x1111_1111));
        st.push_dma(r.enc.fill(DATA + 12, 100_004, 0xA5A5_A5A5));
        let dw = st.dw.clone();
        r.submit(GFX, &dw);
        r.wait_idle(GFX);
        let v = r.read_u32s(DATA, 3 + 25_001 + 1);
        assert_eq!(&v[..3], &[0, 0x1111_1111, 0]);
        assert!(v[3..3 + 25_001].iter().all(|&x| x == 0xA5A5_A5A5));
        assert_eq!(v[3 + 25_001], 0);
    }
}

#[test]
fn fence_with_and_without_irq() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        let f = DATA + 0x40;
        let mut s = r.enc.fence(f, 0x1_0000_0002, false);
        s.extend(r.enc.fence(f + 64, 0xFFFF_FFFF_0000_0001, true));
        r.submit(COMPUTE, &s);
        r.wait_idle(COMPUTE);
        assert_eq!(r.m.read_u64(f).unwrap(), 0x1_0000_0002);
        assert_eq!(r.m.read_u64(f + 64).unwrap(), 0xFFFF_FFFF_0000_0001);
        assert_eq!(r.next_irq(), COMPUTE as u32);
        assert_eq!(r.m.read_reg(regs::IRQ_STATUS), regs::irq_fence_bit(COMPUTE));
        // RW1C: writing 0 bits changes nothing, writing the bit clears it.
        r.m.write_reg(regs::IRQ_STATUS, 0);
        assert_eq!(r.m.read_reg(regs::IRQ_STATUS), regs::irq_fence_bit(COMPUTE));
        r.m.write_reg(regs::IRQ_STATUS, regs::irq_fence_bit(COMPUTE));
        assert_eq!(r.m.read_reg(regs::IRQ_STATUS), 0);
        // Vectors are delivered by a thread, so an extra one might not have
        // arrived yet; the model's count of raised vectors is exact.
        assert_eq!(r.m.irq_count(COMPUTE), 1, "one FENCE IRQ, one vector");
        assert!(r.drain_irqs().is_empty(), "one FENCE IRQ, one vector");
    }
}

#[test]
fn fence_irq_masked_then_unmasked() {
    let mut r = Rig::new(Generation::Gen1);
    r.m.write_reg(regs::IRQ_MASK, 0);
    let s = r.enc.fence(DATA, 1, true);
    r.submit(GFX, &s);
    r.wait_idle(GFX);
    assert_eq!(r.m.read_reg(regs::IRQ_STATUS), 1);
    assert!(r.irq.recv_timeout(std::time::Duration::from_millis(50)).is_err(), "masked: no vector");
    // Unmasking a pending bit is a 0 -> 1 edge of STATUS & MASK.
    r.m.write_reg(regs::IRQ_MASK, 1);
    assert_eq!(r.next_irq(), 0);
    // Already pending and unmasked: a second fence raises no new edge.
    let s = r.enc.fence(DATA, 2, true);
    r.submit(GFX, &s);
    r.wait_idle(GFX);
    assert!(r.irq.recv_timeout(std::time::Duration::from_millis(50)).is_err());
    r.m.write_reg(regs::IRQ_STATUS, 1);
    let s = r.enc.fence(DATA, 3, true);
    r.submit(GFX, &s);
    assert_eq!(r.next_irq(), 0);
}

#[test]
fn wait_mem_ops_all_true() {
    // (op, mem, ref, mask, wide): each holds, so the engine passes.
    let cases: &[(u8, u64, u64, u64, bool)] = &[
        (0, 5, 5, u64::MAX, true),
        (0, 0xAB00_0005, 0xCD00_0005, 0xFF, false),
        (1, 4, 5, u64::MAX, true),
        (2, 5, 5, 0xFFFF_FFFF, false),
        (2, 1 << 40, 5, u64::MAX, true),
        (3, 6, 5, 0xFFFF_FFFF, false),
        (4, 5, 5, u64::MAX, true),
        (5, 4, 5, 0xFFFF_FFFF, false),
        (6, 5, 5, u64::MAX, true),
        (6, 2, 0xFFFF_FFF0, 0xFFFF_FFFF, false), // wrapped sequence
        (6, 2, 0xFFFF_FFFF_FFFF_FFF0, u64::MAX, true),
    ];
    for gen in gens() {
        let mut r = Rig::new(gen);
        let mut s = Vec::new();
        for (i, &(op, mem, reference, mask, wide)) in cases.iter().enumerate() {
            let a = DATA + 16 * i as u64;
            if wide {
                r.m.write_u64(a, mem).unwrap();
            } else {
                r.m.write_u32(a, mem as u32).unwrap();
            }
            s.extend(r.enc.wait_mem(a, reference, mask, op, wide));
        }
        s.extend(r.enc.write_data(DATA + 0x1000, &[0x600D]));
        r.submit(GFX, &s);
        r.wait_idle(GFX);
        assert_eq!(r.read_u32s(DATA + 0x1000, 1), [0x600D]);
    }
}

#[test]
fn wait_mem_ops_block_until_true() {
    // (op, initial, final, ref, wide)
    let cases: &[(u8, u64, u64, u64, bool)] = &[
        (0, 0, 7, 7, true),
        (1, 7, 8, 7, false),
        (2, 3, 7, 7, true),
        (3, 7, 8, 7, false),
        (4, 9, 7, 7, true),
        (5, 7, 6, 7, false),
        (6, 0xFFFF_FFFF_FFFF_FFFF, 1, 1, true),
        (6, 0x8000_0001, 0x2, 0x1, false),
    ];
    for gen in gens() {
        for &(op, init, fin, reference, wide) in cases {
            let mut r = Rig::new(gen);
            let a = DATA;
            r.m.write_u64(a, init).unwrap();
            let mut s = r.enc.wait_mem(a, reference, if wide { u64::MAX } else { 0xFFFF_FFFF }, op, wide);
            s.extend(r.enc.write_data(DATA + 0x100, &[1]));
            r.submit(GFX, &s);
            r.wait_for("WAITING", || r.snap(GFX).waiting());
            std::thread::sleep(std::time::Duration::from_millis(5));
            assert_eq!(r.read_u32s(DATA + 0x100, 1), [0], "op {op} must still block");
            let st = r.snap(GFX);
            assert!(st.busy() && st.waiting() && st.rptr == 0, "{st:?}");
            r.m.write_u64(a, fin).unwrap();
            r.wait_idle(GFX);
            assert_eq!(r.read_u32s(DATA + 0x100, 1), [1]);
            assert!(!r.snap(GFX).waiting());
        }
    }
}

#[test]
fn timestamp() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        let lo = r.m.read_reg(regs::CLOCK_LO);
        let before = (u64::from(r.m.read_reg(regs::CLOCK_HI)) << 32) | u64::from(lo);
        let s = r.enc.timestamp(DATA + 8);
        r.submit(GFX, &s);
        r.wait_idle(GFX);
        let lo = r.m.read_reg(regs::CLOCK_LO);
        let after = (u64::from(r.m.read_reg(regs::CLOCK_HI)) << 32) | u64::from(lo);
        let t = r.m.read_u64(DATA + 8).unwrap();
        assert!(before <= t && t <= after, "{before} <= {t} <= {after}");
    }
}

#[test]
fn indirect_buffer_and_chain() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        let e = r.enc;
        let ib1 = DATA + 0x1000;
        let ib2 = DATA + 0x3000;
        let ib3 = DATA + 0x5000;
        // IB3: plain end.
        let mut s3 = e.write_data(DATA + 0x108, &[3]);
        s3.extend(e.nop(3));
        r.m.write_dwords(ib3, &s3).unwrap();
        // IB2: writes, chains to IB3; packet after CHAIN is not executed.
        let mut s2 = e.write_data(DATA + 0x104, &[2]);
        s2.extend(e.chain(ib3, s3.len() as u32));
        s2.extend(e.write_data(DATA + 0x1F0, &[0xBAD]));
        r.m.write_dwords(ib2, &s2).unwrap();
        let mut s1 = e.write_data(DATA + 0x100, &[1]);
        s1.extend(e.chain(ib2, s2.len() as u32));
        r.m.write_dwords(ib1, &s1).unwrap();
        let mut ring = e.ib(ib1, s1.len() as u32);
        ring.extend(e.write_data(DATA + 0x10C, &[4]));
        r.submit(GFX, &ring);
        r.wait_idle(GFX);
        assert_eq!(r.read_u32s(DATA + 0x100, 4), [1, 2, 3, 4]);
        assert_eq!(r.read_u32s(DATA + 0x1F0, 1), [0]);
        let st = r.snap(GFX);
        assert_eq!((st.ib_base, st.ib_size, st.status & regs::STATUS_IN_IB), (0, 0, 0));
        assert_eq!(st.cur_addr, r.ring_va[GFX] + 16);
    }
}

#[test]
fn barrier_variants() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        let mut s = Vec::new();
        for (w, i) in [(false, false), (true, false), (false, true), (true, true)] {
            s.extend(r.enc.barrier(w, i));
        }
        s.extend(r.enc.write_data(DATA, &[9]));
        r.submit(COPY, &s);
        r.wait_idle(COPY);
        assert_eq!(r.read_u32s(DATA, 1), [9]);
    }
}

fn f(x: f32) -> u32 {
    x.to_bits()
}

#[test]
fn dispatch_ops() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        let n = 3000u32; // crosses several pages
        let a = DATA + 0x1_0000;
        let b = DATA + 0x2_0000 + 12;
        let add_dst = DATA + 0x4_0000;
        let mul_dst = DATA + 0x6_0000;
        let saxpy_dst = DATA + 0x8_0000;
        let av: Vec<u32> = (0..n).map(|i| i.wrapping_mul(0x0100_0193) ^ 0xDEAD).collect();
        let bv: Vec<u32> = (0..n).map(|i| 0xFFFF_FFF0u32.wrapping_add(i)).collect();
        r.m.write_dwords(a, &av).unwrap();
        r.m.write_dwords(b, &bv).unwrap();
        let mut st = Stream::new(r.enc, r.ring_va[COMPUTE]);
        st.push_dma(r.enc.dispatch(0, a, b, add_dst, n, 0x1234_5678));
        st.push_dma(r.enc.dispatch(1, a, b, mul_dst, n, 0));
        // SAXPY over float data.
        let fa: Vec<u32> = (0..n).map(|i| f(i as f32 * 0.37 - 100.0)).collect();
        let fb: Vec<u32> = (0..n).map(|i| f(1.0 / (i as f32 + 1.0))).collect();
        let fa_pa = DATA + 0xA_0000;
        let fb_pa = DATA + 0xC_0000;
        r.m.write_dwords(fa_pa, &fa).unwrap();
        r.m.write_dwords(fb_pa, &fb).unwrap();
        st.push_dma(r.enc.dispatch(2, fa_pa, fb_pa, saxpy_dst, n, f(2.5)));
        let dw = st.dw.clone();
        r.submit(COMPUTE, &dw);
        r.wait_idle(COMPUTE);
        let add = r.read_u32s(add_dst, n as usize);
        let mul = r.read_u32s(mul_dst, n as usize);
        let sax = r.read_u32s(saxpy_dst, n as usize);
        for i in 0..n as usize {
            assert_eq!(add[i], av[i].wrapping_add(bv[i]));
            assert_eq!(mul[i], av[i].wrapping_mul(bv[i]));
            let want = 2.5f32 * f32::from_bits(fa[i]) + f32::from_bits(fb[i]);
            assert_eq!(sax[i], want.to_bits(), "saxpy {i}");
        }
    }
}

#[test]
fn dispatch_saxpy_is_not_fused() {
    // s * a = 1 + 2^-22 + 2^-46 rounds to 1 + 2^-22; adding b = -(1 + 2^-22)
    // gives exactly 0. A fused multiply-add would give 2^-46.
    let s = f32::from_bits(0x3F80_0001);
    let a = f32::from_bits(0x3F80_0001);
    let b = -f32::from_bits(0x3F80_0002);
    assert_ne!(s.mul_add(a, b), 0.0, "the case must discriminate");
    for gen in gens() {
        let mut r = Rig::new(gen);
        r.m.write_u32(DATA, a.to_bits()).unwrap();
        r.m.write_u32(DATA + 4, b.to_bits()).unwrap();
        r.m.write_u32(DATA + 8, 0xFFFF_FFFF).unwrap();
        let mut st = Stream::new(r.enc, r.ring_va[COMPUTE]);
        st.push_dma(r.enc.dispatch(2, DATA, DATA + 4, DATA + 8, 1, s.to_bits()));
        let dw = st.dw.clone();
        r.submit(COMPUTE, &dw);
        r.wait_idle(COMPUTE);
        assert_eq!(r.read_u32s(DATA + 8, 1), [0]);
    }
}

#[test]
fn dispatch_in_place_aliasing() {
    // DST == A: element i reads A[i] before writing DST[i].
    for gen in gens() {
        let mut r = Rig::new(gen);
        let v: Vec<u32> = (1..=64).collect();
        r.m.write_dwords(DATA, &v).unwrap();
        let mut st = Stream::new(r.enc, r.ring_va[COMPUTE]);
        st.push_dma(r.enc.dispatch(0, DATA, DATA, DATA, 64, 0));
        let dw = st.dw.clone();
        r.submit(COMPUTE, &dw);
        r.wait_idle(COMPUTE);
        let want: Vec<u32> = v.iter().map(|x| x * 2).collect();
        assert_eq!(r.read_u32s(DATA, 64), want);
    }
}

#[test]
fn dispatch_only_on_compute() {
    for gen in gens() {
        for e in [GFX, COPY] {
            let mut r = Rig::new(gen);
            let s = r.enc.dispatch(0, DATA, DATA, DATA, 1, 0);
            r.submit(e, &s);
            r.expect_fault(e, inv(), Access::Fetch, r.ring_va[e], r.enc.op("DISPATCH"));
        }
    }
}

#[test]
fn status_and_registers_after_work() {
    let mut r = Rig::new(Generation::Gen2);
    let s = r.enc.write_data(DATA, &[1, 2]);
    r.submit(GFX, &s);
    r.wait_idle(GFX);
    let st = r.snap(GFX);
    assert_eq!(st.status, 0);
    assert_eq!(st.rptr, 20);
    assert_eq!(r.m.read_reg(Rig::ereg(GFX, eng::RING_WPTR)), 20);
    assert_eq!(r.m.read_reg(Rig::ereg(GFX, eng::DOORBELL)), 0, "DOORBELL is write-only");
}

#[test]
fn model_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<refgpu_model::Model>();
    check::<refgpu_model::SysMem>();
}
