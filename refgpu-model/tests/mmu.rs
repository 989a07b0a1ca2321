//! MMU: 4 KiB pages, 2 MiB blocks, the spec's example walk, every fault kind
//! with the right FAULT_STATUS / FAULT_ADDR / IRQ, invalidation.

mod common;

use common::*;
use refgpu_model::regs::{self};
use refgpu_model::{Access, FaultKind, Generation};

/// A rig with the MMU on: rings identity-mapped with 4 KiB pages.
fn mmu_rig(gen: Generation) -> (Rig, PageTables) {
    let r = Rig::new(gen);
    let mut pt = PageTables::new(&r.m, PT_POOL, PT_POOL_SIZE);
    pt.map_range_4k(&r.m, RING_AREA, RING_AREA, 3 * RING_STRIDE, RW);
    pt.enable(&r.m);
    (r, pt)
}

const VA4K: u64 = 0x12_3456_7000;
const VA2M: u64 = 0x20_0000_0000;

#[test]
fn spec_example_walk() {
    let r = Rig::new(Generation::Gen1);
    let mut pt = PageTables::new(&r.m, PT_POOL, PT_POOL_SIZE);
    let va = 0x0000_0012_3456_7800u64;
    pt.set_raw(&r.m, va, 3, 0x0000_0000_4010_300F);
    pt.enable(&r.m);
    assert_eq!(r.m.translate(va), Ok(0x4010_3800));
    pt.set_raw(&r.m, va, 2, 0x0000_0000_4020_000D);
    assert_eq!(r.m.translate(va), Ok(0x4036_7800));
}

#[test]
fn pages_4k_and_blocks_2m() {
    for gen in gens() {
        let (mut r, mut pt) = mmu_rig(gen);
        // Two virtually contiguous 4 KiB pages on physically distant frames.
        pt.map_4k(&r.m, VA4K, DATA + 0x5000, RW);
        pt.map_4k(&r.m, VA4K + 0x1000, DATA + 0x1000, RW);
        // Two virtually contiguous 2 MiB blocks in reverse physical order.
        pt.map_2m(&r.m, VA2M, MEM_BASE + 0x80_0000, RW);
        pt.map_2m(&r.m, VA2M + 0x20_0000, MEM_BASE + 0x60_0000, RW);
        let mut st = Stream::new(r.enc, r.ring_va[COPY]);
        st.push(r.enc.write_data(VA4K + 0xFF8, &[1, 2, 3, 4]));
        st.push_dma(r.enc.fill(VA2M + 0x1F_F000, 0x2000, 0x7777_7777));
        st.push_dma(r.enc.dma_copy(VA4K + 0xFF8, VA2M + 0x1F_FFFC, 16));
        let dw = st.dw.clone();
        r.submit(COPY, &dw);
        r.wait_idle(COPY);
        assert_eq!(r.read_u32s(DATA + 0x5FF8, 2), [1, 2]);
        assert_eq!(r.read_u32s(DATA + 0x1000, 2), [3, 4]);
        // FILL covered [1F_F000, 20_1000) of the VA range: the last 4 KiB of
        // block 1 (PA 0x40A0_0000 - 0x1000) and the first of block 2.
        assert_eq!(r.read_u32s(MEM_BASE + 0x9F_F000, 1), [0x7777_7777]);
        assert_eq!(r.read_u32s(MEM_BASE + 0x60_0FFC, 1), [0x7777_7777]);
        assert_eq!(r.read_u32s(MEM_BASE + 0x60_1000, 1), [0]);
        // The copy straddles the block boundary.
        assert_eq!(r.read_u32s(MEM_BASE + 0x9F_FFFC, 1), [1]);
        assert_eq!(r.read_u32s(MEM_BASE + 0x60_0000, 3), [2, 3, 4]);
    }
}

#[test]
fn ring_and_ib_through_the_mmu() {
    for gen in gens() {
        let (mut r, mut pt) = mmu_rig(gen);
        let ib_va = 0x7_0000_0000u64;
        pt.map_4k(&r.m, ib_va, DATA + 0x8000, PTE_R);
        pt.map_4k(&r.m, VA4K, DATA, RW);
        r.m.write_dwords(DATA + 0x8000, &r.enc.write_data(VA4K, &[0xAB])).unwrap();
        let s = r.enc.ib(ib_va, 4);
        r.submit(GFX, &s);
        r.wait_idle(GFX);
        assert_eq!(r.read_u32s(DATA, 1), [0xAB]);
    }
}

fn write_fault_case(
    gen: Generation,
    setup: impl Fn(&Rig, &mut PageTables),
    va: u64,
    kind: FaultKind,
    fault_va: u64,
) {
    let (mut r, mut pt) = mmu_rig(gen);
    setup(&r, &mut pt);
    let s = r.enc.write_data(va, &[0x1234]);
    r.submit(GFX, &s);
    let opcode = r.enc.op("WRITE_DATA");
    r.expect_fault(GFX, kind, Access::Write, fault_va, opcode);
    assert_eq!(r.next_irq(), GFX as u32);
    let st = r.snap(GFX);
    assert!(st.halted() && st.busy(), "{st:?}");
    assert_eq!(st.rptr, 0, "RPTR stays at the faulting packet");
    assert_eq!(st.cur_addr, r.ring_va[GFX]);
    assert_eq!(st.fault_status >> 31, 1);
    assert_eq!(st.fault_status, 0x8000_0000 | kind as u32 | (1 << 4) | (u32::from(opcode) << 8));
}

#[test]
fn translation_fault() {
    for gen in gens() {
        write_fault_case(gen, |_, _| {}, VA4K + 0x44, FaultKind::Translation, VA4K + 0x44);
        // A valid path with an invalid leaf.
        write_fault_case(
            gen,
            |r, pt| pt.set_raw(&r.m, VA4K, 3, (DATA | RW | PTE_T) & !PTE_V),
            VA4K + 8,
            FaultKind::Translation,
            VA4K + 8,
        );
    }
}

#[test]
fn permission_faults() {
    for gen in gens() {
        // Write to a read-only page.
        write_fault_case(gen, |r, pt| pt.map_4k(&r.m, VA4K, DATA, PTE_R), VA4K, FaultKind::Permission, VA4K);
        // Read (DMA source) from a write-only page.
        let (mut r, mut pt) = mmu_rig(gen);
        pt.map_4k(&r.m, VA4K, DATA, PTE_W);
        pt.map_4k(&r.m, VA4K + 0x1000, DATA + 0x1000, RW);
        let mut st = Stream::new(r.enc, r.ring_va[COPY]);
        st.push_dma(r.enc.dma_copy(VA4K + 0x10, VA4K + 0x1000, 4));
        let dw = st.dw.clone();
        r.submit(COPY, &dw);
        r.expect_fault(COPY, FaultKind::Permission, Access::Read, VA4K + 0x10, r.enc.op("DMA_COPY"));
        // Fetch from a page without READ.
        let (mut r, mut pt) = mmu_rig(gen);
        pt.map_4k(&r.m, RING_AREA, RING_AREA, PTE_W);
        r.m.write_reg(regs::MMU_INVALIDATE, 1);
        let s = r.enc.nop(0);
        r.submit(GFX, &s);
        r.expect_fault(GFX, FaultKind::Permission, Access::Fetch, RING_AREA, 0);
    }
}

type Setup = Box<dyn Fn(&Rig, &mut PageTables)>;

#[test]
fn bad_pte_faults() {
    // L0 index 1: not shared with the identity-mapped rings.
    const VAB: u64 = 0x80_3456_7000;
    for gen in gens() {
        let cases: Vec<(&str, Setup)> = vec![
            (
                "reserved bit 6 in leaf",
                Box::new(|r, pt| pt.set_raw(&r.m, VAB, 3, DATA | PTE_V | PTE_T | RW | 1 << 6)),
            ),
            (
                "reserved bit 48 in leaf",
                Box::new(|r, pt| pt.set_raw(&r.m, VAB, 3, DATA | PTE_V | PTE_T | RW | 1 << 48)),
            ),
            ("L3 with TABLE = 0", Box::new(|r, pt| pt.set_raw(&r.m, VAB, 3, DATA | PTE_V | RW))),
            ("CACHE = 3", Box::new(|r, pt| pt.set_raw(&r.m, VAB, 3, DATA | PTE_V | PTE_T | RW | 3 << 4))),
            ("L0 with TABLE = 0", Box::new(|r, pt| pt.set_raw(&r.m, VAB, 0, (PT_POOL + 0x8_0000) | PTE_V))),
            ("L1 with TABLE = 0", Box::new(|r, pt| pt.set_raw(&r.m, VAB, 1, (PT_POOL + 0x8_0000) | PTE_V))),
            (
                "reserved bit in a table entry",
                Box::new(|r, pt| {
                    pt.map_4k(&r.m, VAB, DATA, RW);
                    let e = pt.entry_addr(&r.m, VAB, 1);
                    let v = r.m.read_u64(e).unwrap();
                    r.m.write_u64(e, v | 1 << 11).unwrap();
                }),
            ),
            (
                "2 MiB block with ADDR bits 20:12 set",
                Box::new(|r, pt| pt.set_raw(&r.m, VAB, 2, (MEM_BASE + 0x60_1000) | PTE_V | RW)),
            ),
        ];
        for (what, setup) in cases {
            let (mut r, mut pt) = mmu_rig(gen);
            setup(&r, &mut pt);
            let s = r.enc.write_data(VAB + 0x20, &[1]);
            r.submit(GFX, &s);
            let f = r.wait_fault(GFX);
            assert_eq!(
                (f.kind, f.access, f.addr, f.opcode),
                (FaultKind::BadPte, Access::Write, VAB + 0x20, r.enc.op("WRITE_DATA")),
                "{gen:?}: {what}"
            );
        }
    }
}

#[test]
fn cache_hints_and_table_perm_bits_are_accepted() {
    for gen in gens() {
        let (mut r, mut pt) = mmu_rig(gen);
        for (i, cache) in [0u64, 1, 2].into_iter().enumerate() {
            pt.map_4k(&r.m, VA4K + 0x1000 * i as u64, DATA + 0x1000 * i as u64, RW | cache << 4);
        }
        let mut s = Vec::new();
        for i in 0..3u64 {
            s.extend(r.enc.write_data(VA4K + 0x1000 * i, &[i as u32 + 1]));
        }
        r.submit(GFX, &s);
        r.wait_idle(GFX);
        for i in 0..3u64 {
            assert_eq!(r.read_u32s(DATA + 0x1000 * i, 1), [i as u32 + 1]);
        }
    }
}

#[test]
fn bus_faults() {
    for gen in gens() {
        // Leaf pointing outside system memory.
        write_fault_case(
            gen,
            |r, pt| pt.map_4k(&r.m, VA4K, 0x1000_0000, RW),
            VA4K + 4,
            FaultKind::Bus,
            VA4K + 4,
        );
        // Table pointer outside system memory.
        write_fault_case(
            gen,
            |r, pt| pt.set_raw(&r.m, VA4K, 2, 0x8000_0000 | PTE_V | PTE_T),
            VA4K + 4,
            FaultKind::Bus,
            VA4K + 4,
        );
        // MMU off: a physical address outside the window.
        let mut r = Rig::new(gen);
        let s = r.enc.write_data(MEM_BASE + MEM_SIZE, &[1]);
        r.submit(GFX, &s);
        r.expect_fault(GFX, FaultKind::Bus, Access::Write, MEM_BASE + MEM_SIZE, r.enc.op("WRITE_DATA"));
        let mut r = Rig::new(gen);
        let s = r.enc.write_data(0x1000, &[1]);
        r.submit(GFX, &s);
        r.expect_fault(GFX, FaultKind::Bus, Access::Write, 0x1000, r.enc.op("WRITE_DATA"));
    }
}

#[test]
fn ring_above_48_bits_is_a_translation_fault() {
    let (r, _pt) = mmu_rig(Generation::Gen2);
    let va = 0x1_0000_0000_0000u64 | RING_AREA;
    r.setup_ring(GFX, va, 4096);
    let mut r = r;
    r.m.write_reg(Rig::ereg(GFX, regs::eng::RING_WPTR), 4);
    r.m.write_reg(Rig::ereg(GFX, regs::eng::DOORBELL), 1);
    r.wptr[GFX] = 4;
    r.expect_fault(GFX, FaultKind::Translation, Access::Fetch, va, 0);
}

#[test]
fn ib_at_unmapped_memory() {
    for gen in gens() {
        let (mut r, _pt) = mmu_rig(gen);
        let ib = 0x9_0000_0000u64;
        let mut s = r.enc.nop(0);
        s.extend(r.enc.ib(ib, 16));
        r.submit(GFX, &s);
        r.expect_fault(GFX, FaultKind::Translation, Access::Fetch, ib, 0);
        let st = r.snap(GFX);
        assert_eq!(st.rptr, 4, "RPTR at the INDIRECT_BUFFER packet");
        assert_eq!(st.cur_addr, ib);
        assert_eq!((st.ib_base, st.ib_size), (ib, 16));
        assert_ne!(st.status & regs::STATUS_IN_IB, 0);
    }
}

#[test]
fn ib_payload_fetch_fault_crosses_into_unmapped_page() {
    for gen in gens() {
        let (mut r, mut pt) = mmu_rig(gen);
        let ib = 0x9_0000_0000u64;
        pt.map_4k(&r.m, ib, DATA + 0x3000, PTE_R);
        // A WRITE_DATA whose header is the last dword of the mapped page.
        let p = r.enc.write_data(DATA + 0x100, &[5]);
        r.m.write_dwords(DATA + 0x3FFC, &p[..1]).unwrap();
        let s = r.enc.ib(ib + 0xFE0, 16);
        // Fill the IB's first dwords with NOPs up to the header.
        let nops = r.enc.nop((0xFFC - 0xFE0) / 4 - 1);
        r.m.write_dwords(DATA + 0x3FE0, &nops).unwrap();
        r.submit(GFX, &s);
        r.expect_fault(GFX, FaultKind::Translation, Access::Fetch, ib + 0x1000, r.enc.op("WRITE_DATA"));
        assert_eq!(r.snap(GFX).cur_addr, ib + 0xFFC);
    }
}

#[test]
fn partial_effects_on_fault() {
    for gen in gens() {
        // WRITE_DATA spanning into an unmapped page writes nothing.
        let (mut r, mut pt) = mmu_rig(gen);
        pt.map_4k(&r.m, VA4K, DATA, RW);
        let s = r.enc.write_data(VA4K + 0xFF8, &[1, 2, 3]);
        r.submit(GFX, &s);
        r.expect_fault(GFX, FaultKind::Translation, Access::Write, VA4K + 0x1000, r.enc.op("WRITE_DATA"));
        assert_eq!(r.read_u32s(DATA + 0xFF8, 2), [0, 0]);

        // DMA_COPY: the prefix before the unmapped page is written.
        let (mut r, mut pt) = mmu_rig(gen);
        pt.map_4k(&r.m, VA4K, DATA, RW);
        pt.map_4k(&r.m, VA2M, DATA + 0x1_0000, RW);
        pt.map_4k(&r.m, VA2M + 0x1000, DATA + 0x2_0000, RW);
        r.m.write_mem(DATA + 0x1_0000, &[0x5A; 0x2000]).unwrap();
        let mut st = Stream::new(r.enc, r.ring_va[COPY]);
        st.push_dma(r.enc.dma_copy(VA2M, VA4K, 0x2000));
        let dw = st.dw.clone();
        r.submit(COPY, &dw);
        r.expect_fault(COPY, FaultKind::Translation, Access::Write, VA4K + 0x1000, r.enc.op("DMA_COPY"));
        let mut got = vec![0u8; 0x1000];
        r.m.read_mem(DATA, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == 0x5A));

        // FILL likewise.
        let (mut r, mut pt) = mmu_rig(gen);
        pt.map_4k(&r.m, VA4K, DATA, RW);
        let mut st = Stream::new(r.enc, r.ring_va[GFX]);
        st.push_dma(r.enc.fill(VA4K + 0x800, 0x1000, 0xEEEE_EEEE));
        let dw = st.dw.clone();
        r.submit(GFX, &dw);
        r.expect_fault(GFX, FaultKind::Translation, Access::Write, VA4K + 0x1000, r.enc.op("FILL"));
        assert_eq!(r.read_u32s(DATA + 0xFFC, 1), [0xEEEE_EEEE]);

        // DISPATCH: B's second page is unmapped: READ fault at that element.
        let (mut r, mut pt) = mmu_rig(gen);
        pt.map_range_4k(&r.m, VA4K, DATA, 0x2000, RW);
        pt.map_4k(&r.m, VA2M, DATA + 0x4000, RW);
        pt.map_range_4k(&r.m, VA2M + 0x10_0000, DATA + 0x8000, 0x2000, RW);
        let mut st = Stream::new(r.enc, r.ring_va[COMPUTE]);
        st.push_dma(r.enc.dispatch(0, VA4K, VA2M + 0xF00, VA2M + 0x10_0000, 0x100, 0));
        let dw = st.dw.clone();
        r.submit(COMPUTE, &dw);
        r.expect_fault(COMPUTE, FaultKind::Translation, Access::Read, VA2M + 0x1000, r.enc.op("DISPATCH"));
    }
}

#[test]
fn fence_wait_timestamp_faults() {
    for gen in gens() {
        let unmapped = 0x5_0000_0000u64;
        for (name, pkt, access) in [
            ("FENCE", Enc(gen).fence(unmapped, 1, true), Access::Write),
            ("TIMESTAMP", Enc(gen).timestamp(unmapped), Access::Write),
            ("WAIT_MEM", Enc(gen).wait_mem(unmapped, 1, 1, 0, false), Access::Read),
        ] {
            let (mut r, _pt) = mmu_rig(gen);
            r.submit(GFX, &pkt);
            r.expect_fault(GFX, FaultKind::Translation, access, unmapped, r.enc.op(name));
            assert_eq!(r.m.read_reg(regs::IRQ_STATUS) & 1, 0, "{name}: no fence IRQ");
        }
    }
}

#[test]
fn invalidate_and_invalid_to_valid() {
    for gen in gens() {
        let (mut r, mut pt) = mmu_rig(gen);
        // Invalid -> valid needs no invalidation.
        let s = r.enc.write_data(VA4K, &[1]);
        r.submit(GFX, &s);
        r.expect_fault(GFX, FaultKind::Translation, Access::Write, VA4K, r.enc.op("WRITE_DATA"));
        r.reset(GFX);
        assert_eq!(r.m.read_reg(regs::IRQ_STATUS) & regs::irq_engine_bits(GFX), 0);
        pt.map_4k(&r.m, VA4K, DATA, RW);
        r.submit(GFX, &s);
        r.wait_idle(GFX);
        assert_eq!(r.read_u32s(DATA, 1), [1]);
        // Remap valid -> valid: after MMU_INVALIDATE the new frame is used.
        pt.map_4k(&r.m, VA4K, DATA + 0x1000, RW);
        r.m.write_reg(regs::MMU_INVALIDATE, 1);
        assert_eq!(r.m.read_reg(regs::MMU_INVALIDATE), 0);
        let s = r.enc.write_data(VA4K, &[2]);
        r.submit(GFX, &s);
        r.wait_idle(GFX);
        assert_eq!(r.read_u32s(DATA + 0x1000, 1), [2]);
        assert_eq!(r.read_u32s(DATA, 1), [1]);
    }
}

#[test]
fn fault_irq_vector_and_mask() {
    let (mut r, _pt) = mmu_rig(Generation::Gen1);
    r.m.write_reg(regs::IRQ_MASK, 0x7);
    let s = r.enc.write_data(VA4K, &[1]);
    r.submit(COPY, &s);
    r.wait_fault(COPY);
    assert_eq!(r.m.read_reg(regs::IRQ_STATUS), regs::irq_fault_bit(COPY));
    assert!(r.irq.recv_timeout(std::time::Duration::from_millis(30)).is_err(), "FAULT bit masked");
    r.m.write_reg(regs::IRQ_MASK, 0x700);
    assert_eq!(r.next_irq(), COPY as u32);
}
