//! Local memory (docs/refgpu.md section 3.5): the registers, data moved
//! between system and local memory by the COPY engine through the MMU,
//! a page moved from one kind to the other without changing its GPU
//! address, no host access, page tables in local memory are BUS faults,
//! and configuration errors.

mod common;

use common::*;
use refgpu_model::regs;
use refgpu_model::{FaultKind, Generation, Model, ModelConfig};

const VA: u64 = 0x30_0000_0000;

fn rig() -> (Rig, PageTables) {
    let r = Rig::new(Generation::Gen2);
    let mut pt = PageTables::new(&r.m, PT_POOL, PT_POOL_SIZE);
    pt.map_range_4k(&r.m, RING_AREA, RING_AREA, 3 * RING_STRIDE, RW);
    pt.map_range_4k(&r.m, DATA, DATA, 0x4000, RW);
    pt.enable(&r.m);
    (r, pt)
}

fn reg64(m: &Model, lo: u32) -> u64 {
    u64::from(m.read_reg(lo)) | u64::from(m.read_reg(lo + 4)) << 32
}

#[test]
fn registers_report_the_window() {
    let (r, _) = rig();
    assert_eq!(reg64(&r.m, regs::LOCAL_BASE_LO), regs::LOCAL_BASE);
    assert_eq!(reg64(&r.m, regs::LOCAL_SIZE_LO), regs::LOCAL_SIZE_DEFAULT);
    // Read-only.
    r.m.write_reg(regs::LOCAL_SIZE_LO, 1);
    assert_eq!(reg64(&r.m, regs::LOCAL_SIZE_LO), regs::LOCAL_SIZE_DEFAULT);
    // Gen1 has none; gen2 can be configured without.
    let g1 = Rig::new(Generation::Gen1);
    assert_eq!(reg64(&g1.m, regs::LOCAL_SIZE_LO), 0);
    let none = Rig::with_config(ModelConfig { local_size: Some(0), ..config(Generation::Gen2) });
    assert_eq!(reg64(&none.m, regs::LOCAL_SIZE_LO), 0);
}

#[test]
fn copy_in_and_out_and_move_a_page_under_one_address() {
    let (mut r, mut pt) = rig();
    let local = regs::LOCAL_BASE + 0x3000;
    pt.map_4k(&r.m, VA, local, RW);
    r.m.write_dwords(DATA, &[1, 2, 3, 4]).unwrap();
    let mut st = Stream::new(r.enc, r.ring_va[COPY]);
    st.push_dma(r.enc.dma_copy(DATA, VA, 16));
    st.push_dma(r.enc.fill(VA + 16, 16, 9));
    st.push_dma(r.enc.dma_copy(VA, DATA + 0x1000, 32));
    let dw = st.dw.clone();
    r.submit(COPY, &dw);
    r.wait_idle(COPY);
    assert_eq!(r.read_u32s(DATA + 0x1000, 8), [1, 2, 3, 4, 9, 9, 9, 9]);
    // The host can not reach local memory.
    assert!(r.m.read_u32(local).is_err());
    assert!(r.m.write_u32(local, 5).is_err());
    // Move the page to system memory: copy it out, remap, invalidate; the
    // GPU address now reads the system copy.
    let mut st = Stream::new(r.enc, r.ring_va[COPY] + u64::from(r.wptr[COPY]));
    pt.map_4k(&r.m, VA + 0x1000, DATA + 0x2000, RW);
    st.push_dma(r.enc.dma_copy(VA, VA + 0x1000, 4096));
    let dw = st.dw.clone();
    r.submit(COPY, &dw);
    r.wait_idle(COPY);
    pt.map_4k(&r.m, VA, DATA + 0x2000, RW);
    r.m.write_reg(regs::MMU_INVALIDATE, 1);
    let mut st = Stream::new(r.enc, r.ring_va[COPY] + u64::from(r.wptr[COPY]));
    st.push_dma(r.enc.dma_copy(VA + 16, DATA + 0x3000, 16));
    let dw = st.dw.clone();
    r.submit(COPY, &dw);
    r.wait_idle(COPY);
    assert_eq!(r.read_u32s(DATA + 0x3000, 4), [9, 9, 9, 9]);
}

#[test]
fn page_tables_in_local_memory_are_bus_faults() {
    let (mut r, mut pt) = rig();
    // An L3 table pointer that names local memory.
    pt.set_raw(&r.m, VA, 2, regs::LOCAL_BASE | 0x3);
    let mut st = Stream::new(r.enc, r.ring_va[COPY]);
    st.push(r.enc.write_data(VA, &[1]));
    let dw = st.dw.clone();
    r.submit(COPY, &dw);
    let f = r.wait_fault(COPY);
    assert_eq!(f.kind, FaultKind::Bus);
}

#[test]
fn configuration_errors() {
    let bad = |cfg: ModelConfig| Model::new(cfg).is_err();
    assert!(
        bad(ModelConfig { local_size: Some(8 << 20), ..config(Generation::Gen1) }),
        "gen1 with local memory"
    );
    assert!(bad(ModelConfig { local_size: Some(4097), ..config(Generation::Gen2) }), "not a page multiple");
    assert!(
        bad(ModelConfig { mem_base: regs::LOCAL_BASE, local_size: Some(4096), ..config(Generation::Gen2) }),
        "system memory over the local window"
    );
}
