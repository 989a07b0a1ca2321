//! Rings, IBs and CHAIN, INVALID_PACKET rules of both generations, reset,
//! CTRL.ENABLE.

mod common;

use common::*;
use refgpu_model::regs::{self, eng};
use refgpu_model::{Access, FaultKind, Generation};

/// Writes packets into ring `e`, padding to the end with a NOP when a
/// packet would cross it (spec 4.1), and submits.
fn ring_write(r: &mut Rig, e: usize, pkt: &[u32]) {
    let size = r.ring_size;
    let bytes = 4 * pkt.len() as u32;
    let mut off = r.wptr[e];
    if off + bytes > size {
        let pad = (size - off) / 4;
        let nop = r.enc.nop(pad - 1);
        r.m.write_dwords(r.ring_pa(e, off), &nop).unwrap();
        off = 0;
    }
    r.m.write_dwords(r.ring_pa(e, off), pkt).unwrap();
    r.publish(e, (off + bytes) % size);
}

#[test]
fn ring_wraps_many_times() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        let mut expect = Vec::new();
        let mut wraps = 0;
        let mut last = 0;
        for i in 0..600u32 {
            let n = 1 + (i * 7) % 40;
            let data: Vec<u32> = (0..n).map(|k| i * 1000 + k).collect();
            let dst = DATA + 0x200 * u64::from(i);
            let p = r.enc.write_data(dst, &data);
            // Keep at most half the ring in flight so we never overrun RPTR.
            r.wait_for("ring space", || {
                let used = (r.wptr[GFX] + r.ring_size - r.snap(GFX).rptr) % r.ring_size;
                used + 4 * p.len() as u32 + 256 < r.ring_size / 2
            });
            ring_write(&mut r, GFX, &p);
            if r.wptr[GFX] < last {
                wraps += 1;
            }
            last = r.wptr[GFX];
            expect.push((dst, data));
        }
        r.wait_idle(GFX);
        assert!(wraps >= 10, "only {wraps} wraps");
        for (dst, data) in expect {
            assert_eq!(r.read_u32s(dst, data.len()), data);
        }
    }
}

#[test]
fn ring_can_hold_size_minus_4() {
    let mut r = Rig::new(Generation::Gen1);
    // 1023 one-dword NOPs fill RING_SIZE - 4 bytes.
    let nops: Vec<u32> = vec![0; 1023];
    r.submit(GFX, &nops);
    r.wait_idle(GFX);
    assert_eq!(r.snap(GFX).rptr, 4092);
    // Next packet wraps: pad with one NOP at 4092, WRITE_DATA at 0.
    let p = r.enc.write_data(DATA, &[77]);
    ring_write(&mut r, GFX, &p);
    r.wait_idle(GFX);
    assert_eq!(r.read_u32s(DATA, 1), [77]);
}

#[test]
fn packet_crossing_ring_end_or_wptr() {
    for gen in gens() {
        // Crossing the end of the ring.
        let mut r = Rig::new(gen);
        let nops = vec![r.enc.nop(0)[0]; 1022];
        r.submit(GFX, &nops);
        r.wait_idle(GFX);
        let p = r.enc.write_data(DATA, &[1]);
        r.m.write_dwords(r.ring_pa(GFX, 4088), &p[..2]).unwrap();
        r.m.write_dwords(r.ring_pa(GFX, 0), &p[2..]).unwrap();
        r.publish(GFX, 8);
        r.expect_fault(GFX, inv(), Access::Fetch, r.ring_va[GFX] + 4088, r.enc.op("WRITE_DATA"));
        assert_eq!(r.snap(GFX).rptr, 4088);
        // Crossing WPTR.
        let mut r = Rig::new(gen);
        let p = r.enc.write_data(DATA, &[1, 2]);
        r.m.write_dwords(r.ring_pa(GFX, 0), &p).unwrap();
        r.publish(GFX, 8);
        r.expect_fault(GFX, inv(), Access::Fetch, r.ring_va[GFX], r.enc.op("WRITE_DATA"));
        assert_eq!(r.read_u32s(DATA, 2), [0, 0]);
    }
}

#[test]
fn bad_wptr_is_invalid_packet() {
    for wptr in [6u32, 4096, 8192] {
        let mut r = Rig::new(Generation::Gen2);
        r.m.write_dwords(r.ring_pa(GFX, 0), &[0x7000_0000; 4]).unwrap();
        r.publish(GFX, wptr);
        r.expect_fault(GFX, inv(), Access::Fetch, r.ring_va[GFX], 0);
    }
}

/// Submits `pkt` at ring offset 0 of `e` and expects INVALID_PACKET with
/// the given raw opcode at the ring start; nothing after it runs.
fn expect_invalid(gen: Generation, e: usize, pkt: Vec<u32>, opcode: u8, what: &str) {
    let mut r = Rig::new(gen);
    let mut s = pkt;
    s.extend(r.enc.write_data(DATA + 0xF00, &[0xBAD]));
    r.submit(e, &s);
    let f = r.wait_fault(e);
    assert_eq!(
        (f.kind, f.access, f.addr, f.opcode),
        (FaultKind::InvalidPacket, Access::Fetch, r.ring_va[e], opcode),
        "{gen:?}: {what}"
    );
    assert_ne!(r.m.read_reg(regs::IRQ_STATUS) & regs::irq_fault_bit(e), 0);
    assert_eq!(r.read_u32s(DATA + 0xF00, 1), [0], "{what}: nothing after the fault runs");
    let st = r.snap(e);
    assert_eq!((st.rptr, st.cur_addr), (0, r.ring_va[e]));
    assert!(st.halted());
}

#[test]
fn invalid_headers() {
    let g1 = Enc(Generation::Gen1);
    let g2 = Enc(Generation::Gen2);
    // Reserved opcodes.
    for op in [0x0Bu8, 0x10, 0x80, 0xFF] {
        expect_invalid(Generation::Gen1, GFX, vec![g1.header(op, 0, 0)], op, "gen1 reserved opcode");
    }
    for op in [0x01u8, 0x0A, 0x11, 0x22, 0x33, 0x42, 0x51, 0x61, 0xFF] {
        expect_invalid(Generation::Gen2, GFX, vec![g2.header(op, 0, 0)], op, "gen2 reserved opcode");
    }
    // Gen2 TYPE != 7.
    for t in [0u32, 6, 0xF] {
        expect_invalid(Generation::Gen2, GFX, vec![t << 28], 0, "gen2 TYPE");
    }
    // NDW out of range.
    expect_invalid(Generation::Gen1, GFX, vec![g1.header(0, 0, 257)], 0, "gen1 NOP NDW 257");
    expect_invalid(Generation::Gen1, GFX, vec![g1.header(0, 0, 0xFFFF)], 0, "gen1 NOP NDW 0xFFFF");
    for gen in gens() {
        let e = Enc(gen);
        let mut wd = e.write_data(DATA, &[1]);
        wd.truncate(3);
        wd[0] = e.header(e.op("WRITE_DATA"), 0, 2);
        expect_invalid(gen, GFX, wd, e.op("WRITE_DATA"), "WRITE_DATA NDW 2");
        let mut f = e.fence(DATA, 1, false);
        f[0] = e.header(e.op("FENCE"), 0, 5);
        f.push(0);
        expect_invalid(gen, GFX, f, e.op("FENCE"), "FENCE NDW 5");
        let mut b = e.barrier(true, false);
        b[0] = e.header(e.op("BARRIER"), 0, b.len() as u32);
        b.push(0);
        expect_invalid(gen, GFX, b, e.op("BARRIER"), "BARRIER NDW + 1");
        // FLAGS that must be 0.
        for name in ["NOP", "WRITE_DATA", "DMA_COPY", "FILL", "TIMESTAMP", "INDIRECT_BUFFER"] {
            let mut p = match name {
                "NOP" => e.nop(0),
                "WRITE_DATA" => e.write_data(DATA, &[1]),
                "DMA_COPY" => e.dma_copy(DATA, DATA + 64, 4),
                "FILL" => e.fill(DATA, 4, 0),
                "TIMESTAMP" => e.timestamp(DATA),
                _ => e.ib(DATA + 0x100, 1),
            };
            p[0] |= match gen {
                Generation::Gen1 => 0x80 << 16,
                Generation::Gen2 => 0x80 << 8,
            };
            expect_invalid(gen, GFX, p, e.op(name), &format!("{name} FLAGS"));
        }
        let mut f = e.fence(DATA, 1, true);
        f[0] |= match gen {
            Generation::Gen1 => 2 << 16,
            Generation::Gen2 => 2 << 8,
        };
        expect_invalid(gen, GFX, f, e.op("FENCE"), "FENCE reserved flag");
    }
    // Gen2-only FLAGS = 0 rules.
    let mut w = g2.wait_mem(DATA, 0, 0, 0, false);
    w[0] |= 1 << 8;
    expect_invalid(Generation::Gen2, GFX, w, 0x31, "gen2 WAIT_MEM FLAGS");
    let mut d = g2.dispatch(0, DATA, DATA, DATA, 1, 0);
    d[0] |= 1 << 8;
    expect_invalid(Generation::Gen2, COMPUTE, d, 0x60, "gen2 DISPATCH FLAGS");
    let mut b = g2.barrier(false, false);
    b[0] |= 1 << 8;
    expect_invalid(Generation::Gen2, GFX, b, 0x50, "gen2 BARRIER FLAGS");
}

#[test]
fn invalid_payload_fields() {
    let g1 = Enc(Generation::Gen1);
    let g2 = Enc(Generation::Gen2);
    type Case = (Generation, usize, Vec<u32>, u8, &'static str);
    let mut cases: Vec<Case> = vec![
        // Gen1 reserved size bits / fields.
        (Generation::Gen1, COPY, g1.dma_copy(DATA, DATA + 64, 1 << 24), 0x02, "gen1 DMA size bit 24"),
        (Generation::Gen1, COPY, g1.fill(DATA, 4 | 1 << 24, 0), 0x03, "gen1 FILL size bit 24"),
        (Generation::Gen1, GFX, g1.wait_mem(DATA, 0, 0, 0x10, false), 0x05, "gen1 WAIT_MEM flag bit 4"),
        (Generation::Gen1, GFX, vec![g1.header(0x09, 0x04, 0)], 0x09, "gen1 BARRIER flag bit 2"),
        (
            Generation::Gen1,
            COMPUTE,
            g1.dispatch(0x10, DATA, DATA, DATA, 1, 0),
            0x0A,
            "gen1 DISPATCH flag bit 4",
        ),
        (
            Generation::Gen1,
            COMPUTE,
            g1.dispatch(0, DATA, DATA, DATA, 1 << 16, 0),
            0x0A,
            "gen1 DISPATCH count bit 16",
        ),
        // Gen2 reserved fields.
        (Generation::Gen2, GFX, g2.wait_mem(DATA, 0, 0, 0x10, false), 0x31, "gen2 WAIT_MEM P0 bit 4"),
        (Generation::Gen2, GFX, vec![0x7001_0050, 4], 0x50, "gen2 BARRIER P0 bit 2"),
        (
            Generation::Gen2,
            COMPUTE,
            g2.dispatch(0x10, DATA, DATA, DATA, 1, 0),
            0x60,
            "gen2 DISPATCH P0 bit 4",
        ),
        // Limits (gen2).
        (Generation::Gen2, COPY, g2.dma_copy(DATA, DATA + 64, (1 << 30) + 1), 0x20, "gen2 DMA > 1 GiB"),
        (Generation::Gen2, COPY, g2.fill(DATA, (1 << 30) + 4, 0), 0x21, "gen2 FILL > 1 GiB"),
        (Generation::Gen2, GFX, g2.ib(DATA + 0x100, 4_194_305), 0x40, "gen2 IB too big"),
        (Generation::Gen1, GFX, g1.ib(DATA + 0x100, 262_145), 0x07, "gen1 IB too big"),
        // Address width.
        (Generation::Gen1, GFX, g1.write_data(1 << 40, &[1]), 0x01, "gen1 40-bit width"),
        (Generation::Gen2, GFX, g2.write_data(1 << 48, &[1]), 0x10, "gen2 48-bit width"),
        (Generation::Gen2, GFX, g2.fence((1 << 48) | 4, 1, false), 0x30, "gen2 misaligned fence above width"),
        (Generation::Gen1, GFX, g1.ib(1 << 40, 4), 0x07, "gen1 IB above width"),
        // Ring-only / IB-only / COMPUTE-only.
        (Generation::Gen1, GFX, g1.chain(DATA + 0x100, 4), 0x08, "gen1 CHAIN in the ring"),
        (Generation::Gen2, GFX, g2.chain(DATA + 0x100, 4), 0x41, "gen2 CHAIN in the ring"),
        // Gen1 misaligned fence.
        (Generation::Gen1, GFX, g1.fence(DATA + 4, 1, true), 0x04, "gen1 misaligned FENCE"),
        // Gen2 misaligned IB.
        (Generation::Gen2, GFX, g2.ib(DATA + 0x104, 4), 0x40, "gen2 IB not 32-aligned"),
        (Generation::Gen1, GFX, g1.ib(DATA + 0x102, 4), 0x07, "gen1 IB not 4-aligned"),
    ];
    for gen in gens() {
        let e = Enc(gen);
        let mut add = |e_: usize, p: Vec<u32>, name: &str, what: &'static str| {
            cases.push((gen, e_, p, e.op(name), what));
        };
        add(COPY, e.dma_copy(DATA, DATA + 64, 0), "DMA_COPY", "DMA size 0");
        add(COPY, e.fill(DATA, 0, 0), "FILL", "FILL size 0");
        add(COPY, e.fill(DATA, 6, 0), "FILL", "FILL size not multiple of 4");
        add(COPY, e.fill(DATA + 2, 4, 0), "FILL", "FILL dst misaligned");
        add(GFX, e.write_data(DATA + 2, &[1]), "WRITE_DATA", "WRITE_DATA dst misaligned");
        add(GFX, e.timestamp(DATA + 4), "TIMESTAMP", "TIMESTAMP not 8-aligned");
        add(GFX, e.wait_mem(DATA + 4, 0, 0, 0, true), "WAIT_MEM", "wide WAIT_MEM not 8-aligned");
        add(GFX, e.wait_mem(DATA + 2, 0, 0, 0, false), "WAIT_MEM", "WAIT_MEM not 4-aligned");
        add(GFX, e.wait_mem(DATA, 0, 0, 7, false), "WAIT_MEM", "WAIT_MEM op 7");
        add(GFX, e.wait_mem(DATA, 1 << 32, 0, 0, false), "WAIT_MEM", "narrow WAIT_MEM REF_HI");
        add(GFX, e.wait_mem(DATA, 0, 1 << 32, 0, false), "WAIT_MEM", "narrow WAIT_MEM MASK_HI");
        add(COMPUTE, e.dispatch(3, DATA, DATA, DATA, 1, 0), "DISPATCH", "DISPATCH op 3");
        add(COMPUTE, e.dispatch(15, DATA, DATA, DATA, 1, 0), "DISPATCH", "DISPATCH op 15");
        add(COMPUTE, e.dispatch(0, DATA, DATA, DATA, 0, 0), "DISPATCH", "DISPATCH count 0");
        add(COMPUTE, e.dispatch(0, DATA + 2, DATA, DATA, 1, 0), "DISPATCH", "DISPATCH A misaligned");
        add(COMPUTE, e.dispatch(0, DATA, DATA, DATA + 1, 1, 0), "DISPATCH", "DISPATCH DST misaligned");
        add(GFX, e.ib(DATA + 0x100, 0), "INDIRECT_BUFFER", "IB size 0");
    }
    for (gen, e, p, op, what) in cases {
        expect_invalid(gen, e, p, op, what);
    }
}

#[test]
fn gen2_dma_class_headers_must_be_32_aligned() {
    let e = Enc(Generation::Gen2);
    for (name, p, engine) in [
        ("DMA_COPY", e.dma_copy(DATA, DATA + 0x100, 4), COPY),
        ("FILL", e.fill(DATA, 4, 1), COPY),
        ("DISPATCH", e.dispatch(0, DATA, DATA, DATA, 1, 0), COMPUTE),
    ] {
        let mut r = Rig::new(Generation::Gen2);
        let mut s = e.nop(0);
        s.extend(p);
        r.submit(engine, &s);
        r.expect_fault(engine, inv(), Access::Fetch, r.ring_va[engine] + 4, e.op(name));
        assert_eq!(r.snap(engine).rptr, 4);
        // The same packets 32-byte aligned (and gen1 at any dword) run.
        let mut r = Rig::new(Generation::Gen2);
        let mut st = Stream::new(e, r.ring_va[engine]);
        st.push(e.nop(0));
        st.push_dma(match name {
            "DMA_COPY" => e.dma_copy(DATA, DATA + 0x100, 4),
            "FILL" => e.fill(DATA, 4, 1),
            _ => e.dispatch(0, DATA, DATA, DATA, 1, 0),
        });
        let dw = st.dw.clone();
        r.submit(engine, &dw);
        r.wait_idle(engine);
    }
    let g1 = Enc(Generation::Gen1);
    let mut r = Rig::new(Generation::Gen1);
    let mut s = g1.nop(0);
    s.extend(g1.fill(DATA, 4, 1));
    r.submit(COPY, &s);
    r.wait_idle(COPY);
    assert_eq!(r.read_u32s(DATA, 1), [1]);
}

#[test]
fn gen2_misaligned_fence_is_silently_dropped() {
    let mut r = Rig::new(Generation::Gen2);
    let e = r.enc;
    let mut s = Vec::new();
    for off in [8u64, 32, 4, 60] {
        s.extend(e.fence(DATA + off, 0x55, true));
    }
    s.extend(e.fence(DATA + 0x40, 0x66, false));
    s.extend(e.write_data(DATA + 0x100, &[1]));
    r.submit(GFX, &s);
    r.wait_idle(GFX);
    assert_eq!(r.read_u32s(DATA, 16), [0; 16], "no misaligned fence wrote");
    assert_eq!(r.m.read_u64(DATA + 0x40).unwrap(), 0x66);
    assert_eq!(r.read_u32s(DATA + 0x100, 1), [1], "engine continued");
    assert_eq!(r.m.read_reg(regs::IRQ_STATUS), 0, "no interrupt, no fault");
    assert!(r.snap(GFX).fault.is_none());
    assert!(r.irq.recv_timeout(std::time::Duration::from_millis(30)).is_err());
}

#[test]
fn gen1_fence_alignment() {
    let mut r = Rig::new(Generation::Gen1);
    let s = r.enc.fence(DATA + 8, 0x55, false);
    r.submit(GFX, &s);
    r.wait_idle(GFX);
    assert_eq!(r.m.read_u64(DATA + 8).unwrap(), 0x55);
}

#[test]
fn ib_rules() {
    for gen in gens() {
        let e = Enc(gen);
        let ib = DATA + 0x1000;
        // INDIRECT_BUFFER inside an IB.
        let mut r = Rig::new(gen);
        let inner = e.ib(DATA + 0x2000, 4);
        r.m.write_dwords(ib, &inner).unwrap();
        let s = e.ib(ib, inner.len() as u32);
        r.submit(GFX, &s);
        r.expect_fault(GFX, inv(), Access::Fetch, ib, e.op("INDIRECT_BUFFER"));
        let st = r.snap(GFX);
        assert_eq!((st.rptr, st.cur_addr, st.ib_base, st.ib_size), (0, ib, ib, 4));
        // Packet crossing the end of the IB.
        let mut r = Rig::new(gen);
        let mut body = e.nop(0);
        body.extend(e.write_data(DATA, &[1, 2]));
        r.m.write_dwords(ib, &body).unwrap();
        let s = e.ib(ib, body.len() as u32 - 1);
        r.submit(GFX, &s);
        r.expect_fault(GFX, inv(), Access::Fetch, ib + 4, e.op("WRITE_DATA"));
        // CHAIN with bad target: misaligned / too large / zero.
        for (addr, size) in [(ib + 0x24, 4u32), (ib + 0x100, 0), (ib + 0x100, gen.rules().max_ib_dwords + 1)]
        {
            if gen == Generation::Gen1 && addr % 4 == 0 && size == 4 {
                continue; // 4-aligned is fine on gen1
            }
            let mut r = Rig::new(gen);
            let c = e.chain(addr, size);
            r.m.write_dwords(ib, &c).unwrap();
            let s = e.ib(ib, 4);
            r.submit(GFX, &s);
            r.expect_fault(GFX, inv(), Access::Fetch, ib, e.op("CHAIN"));
        }
    }
}

#[test]
fn long_chain_of_ibs() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        let e = r.enc;
        // 200 IBs, each writing its index and chaining to the next.
        let n = 200u64;
        for i in 0..n {
            let ib = DATA + 0x1_0000 + 0x100 * i;
            let mut body = e.write_data(DATA + 4 * i, &[i as u32 + 1]);
            if i + 1 < n {
                body.extend(e.chain(ib + 0x100, 8));
            } else {
                body.extend(e.nop(3));
            }
            assert_eq!(body.len(), 8);
            r.m.write_dwords(ib, &body).unwrap();
        }
        let s = e.ib(DATA + 0x1_0000, 8);
        r.submit(GFX, &s);
        r.wait_idle(GFX);
        let want: Vec<u32> = (1..=n as u32).collect();
        assert_eq!(r.read_u32s(DATA, n as usize), want);
    }
}

#[test]
fn reset_clears_state_and_keeps_config() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        r.m.write_reg(regs::IRQ_MASK, 0x505);
        let mut s = r.enc.fence(DATA, 1, true);
        s.extend(r.enc.write_data(DATA + 2, &[1])); // INVALID: misaligned
        r.submit(GFX, &s);
        r.wait_fault(GFX);
        assert_eq!(r.m.read_reg(regs::IRQ_STATUS) & 0x101, 0x101);
        r.m.write_reg(regs::IRQ_STATUS, 0); // no-op
        r.reset(GFX);
        let st = r.snap(GFX);
        assert_eq!(
            (st.rptr, st.wptr, st.status, st.fault_status, st.cur_addr, st.ib_base, st.ib_size),
            (0, 0, 0, 0, 0, 0, 0)
        );
        assert_eq!(r.m.read_reg(Rig::ereg(GFX, eng::FAULT_ADDR_LO)), 0);
        assert_eq!(r.m.read_reg(regs::IRQ_STATUS) & 0x101, 0);
        assert_eq!(r.m.read_reg(regs::IRQ_MASK), 0x505);
        assert_eq!(r.m.read_reg(Rig::ereg(GFX, eng::RING_BASE_LO)), r.ring_va[GFX] as u32);
        assert_eq!(r.m.read_reg(Rig::ereg(GFX, eng::RING_SIZE)), 4096);
        assert_eq!(r.m.read_reg(Rig::ereg(GFX, eng::CTRL)), regs::CTRL_ENABLE);
        let s = r.enc.write_data(DATA + 0x10, &[2]);
        r.submit(GFX, &s);
        r.wait_idle(GFX);
        assert_eq!(r.read_u32s(DATA + 0x10, 1), [2]);
    }
}

#[test]
fn reset_of_one_engine_leaves_others_alone() {
    let mut r = Rig::new(Generation::Gen1);
    let s = r.enc.fence(DATA, 1, true);
    r.submit(COPY, &s);
    r.wait_idle(COPY);
    let s = r.enc.write_data(DATA + 2, &[1]);
    r.submit(GFX, &s);
    r.wait_fault(GFX);
    r.reset(GFX);
    assert_eq!(r.m.read_reg(regs::IRQ_STATUS), regs::irq_fence_bit(COPY));
    assert_eq!(r.snap(COPY).rptr, 20);
}

#[test]
fn ctrl_enable_gates_fetching() {
    let mut r = Rig::new(Generation::Gen2);
    r.m.write_reg(Rig::ereg(GFX, eng::CTRL), 0);
    let s = r.enc.write_data(DATA, &[3]);
    r.submit(GFX, &s);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let st = r.snap(GFX);
    assert_eq!((st.rptr, st.busy()), (0, true), "disabled, RPTR != WPTR: BUSY");
    assert_eq!(r.read_u32s(DATA, 1), [0]);
    r.m.write_reg(Rig::ereg(GFX, eng::CTRL), regs::CTRL_ENABLE);
    r.wait_idle(GFX);
    assert_eq!(r.read_u32s(DATA, 1), [3]);
}

#[test]
fn status_in_ib_and_ib_registers_while_waiting_in_an_ib() {
    let mut r = Rig::new(Generation::Gen1);
    let ib = DATA + 0x1000;
    let mut body = r.enc.nop(0);
    body.extend(r.enc.wait_mem(DATA, 1, u64::MAX, 0, true));
    r.m.write_dwords(ib, &body).unwrap();
    let mut s = r.enc.nop(1);
    s.extend(r.enc.ib(ib, body.len() as u32));
    r.submit(GFX, &s);
    r.wait_for("waiting", || r.snap(GFX).waiting());
    let st = r.snap(GFX);
    assert_eq!(st.status, regs::STATUS_BUSY | regs::STATUS_WAITING | regs::STATUS_IN_IB);
    assert_eq!((st.rptr, st.cur_addr, st.ib_base, st.ib_size), (8, ib + 4, ib, body.len() as u32));
    r.m.write_u64(DATA, 1).unwrap();
    r.wait_idle(GFX);
    assert_eq!(r.snap(GFX).status, 0);
}
