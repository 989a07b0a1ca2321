//! Per-engine address-space roots (`docs/refgpu.md` 3.4): ENGINE_ROOT_LO/HI(e)
//! at 0x040 + 8*e / 0x044 + 8*e, 0 = MMU_ROOT, kept across an engine reset,
//! a change discards that engine's cached translations, MMU_CTRL.ENABLE = 0
//! makes addresses physical whatever the roots hold. Register offsets and
//! packets are written here from the spec, not taken from the model's
//! constants.

mod common;

use common::*;
use refgpu_model::regs::{self, eng};
use refgpu_model::{Access, FaultKind, Generation};

/// ENGINE_ROOT_LO(e), from the spec's table (2.1).
fn root_lo(e: usize) -> u32 {
    0x040 + 8 * e as u32
}

/// ENGINE_ROOT_HI(e).
fn root_hi(e: usize) -> u32 {
    0x044 + 8 * e as u32
}

const VA: u64 = 0x12_3456_7000;
/// Second page-table pool, for the per-engine tables.
const PT_POOL_B: u64 = DATA + 0x100_0000;

fn set_engine_root(r: &Rig, e: usize, root: u64) {
    r.m.write_reg(root_lo(e), root as u32);
    r.m.write_reg(root_hi(e), (root >> 32) as u32);
}

/// A rig with the MMU on and MMU_ROOT tables `a` mapping the rings
/// (identity) and VA -> DATA; tables `b` mapping the rings and VA ->
/// DATA + 0x1000.
fn two_spaces(gen: Generation) -> (Rig, PageTables, PageTables) {
    let r = Rig::new(gen);
    let mut a = PageTables::new(&r.m, PT_POOL, PT_POOL_SIZE);
    a.map_range_4k(&r.m, RING_AREA, RING_AREA, 3 * RING_STRIDE, RW);
    a.map_4k(&r.m, VA, DATA, RW);
    let mut b = PageTables::new(&r.m, PT_POOL_B, PT_POOL_SIZE);
    b.map_range_4k(&r.m, RING_AREA, RING_AREA, 3 * RING_STRIDE, RW);
    b.map_4k(&r.m, VA, DATA + 0x1000, RW);
    a.enable(&r.m);
    (r, a, b)
}

#[test]
fn registers_read_back_and_reset_to_zero() {
    let r = Rig::new(Generation::Gen1);
    for e in 0..3 {
        assert_eq!(r.m.read_reg(root_lo(e)), 0, "reset value");
        assert_eq!(r.m.read_reg(root_hi(e)), 0, "reset value");
    }
    r.m.write_reg(root_lo(1), 0x1234_5000);
    r.m.write_reg(root_hi(1), 0x0000_00AB);
    assert_eq!(r.m.read_reg(root_lo(1)), 0x1234_5000);
    assert_eq!(r.m.read_reg(root_hi(1)), 0xAB);
    assert_eq!(r.m.read_reg(root_lo(0)), 0, "other engines untouched");
    assert_eq!(r.m.read_reg(root_lo(2)), 0, "other engines untouched");
}

#[test]
fn each_engine_translates_through_its_own_root() {
    for gen in gens() {
        let (mut r, _a, b) = two_spaces(gen);
        // COPY gets tables b, GFX keeps MMU_ROOT (ENGINE_ROOT = 0).
        set_engine_root(&r, COPY, b.root);
        r.submit(GFX, &r.enc.write_data(VA, &[0xA1]));
        r.submit(COPY, &r.enc.write_data(VA, &[0xB2]));
        r.wait_idle(GFX);
        r.wait_idle(COPY);
        assert_eq!(r.read_u32s(DATA, 1), [0xA1], "GFX through MMU_ROOT");
        assert_eq!(r.read_u32s(DATA + 0x1000, 1), [0xB2], "COPY through ENGINE_ROOT(2)");
        assert_eq!(r.m.translate_engine(COPY, VA), Ok(DATA + 0x1000));
        assert_eq!(r.m.translate_engine(GFX, VA), Ok(DATA));
    }
}

#[test]
fn an_address_mapped_only_in_mmu_root_faults_in_an_engine_space() {
    for gen in gens() {
        let (mut r, mut a, b) = two_spaces(gen);
        let only_a = 0x55_0000_0000u64;
        a.map_4k(&r.m, only_a, DATA + 0x2000, RW);
        set_engine_root(&r, COMPUTE, b.root);
        r.submit(COMPUTE, &r.enc.write_data(only_a, &[1]));
        let op = r.enc.op("WRITE_DATA");
        r.expect_fault(COMPUTE, FaultKind::Translation, Access::Write, only_a, op);
        assert_eq!(r.read_u32s(DATA + 0x2000, 1), [0], "nothing written");
        // GFX, on MMU_ROOT, reaches it.
        r.submit(GFX, &r.enc.write_data(only_a, &[7]));
        r.wait_idle(GFX);
        assert_eq!(r.read_u32s(DATA + 0x2000, 1), [7]);
    }
}

#[test]
fn the_ring_is_fetched_through_the_engine_root() {
    let gen = Generation::Gen1;
    let (mut r, _a, _b) = two_spaces(gen);
    // Tables c map VA but not the ring: the first fetch faults.
    let mut c = PageTables::new(&r.m, PT_POOL_B + PT_POOL_SIZE, PT_POOL_SIZE);
    c.map_4k(&r.m, VA, DATA + 0x3000, RW);
    set_engine_root(&r, GFX, c.root);
    r.submit(GFX, &r.enc.write_data(VA, &[9]));
    r.expect_fault(GFX, FaultKind::Translation, Access::Fetch, RING_AREA, 0);
    assert_eq!(r.read_u32s(DATA + 0x3000, 1), [0]);
}

#[test]
fn a_root_change_discards_that_engines_cached_translations() {
    for gen in gens() {
        let (mut r, mut a, b) = two_spaces(gen);
        // GFX caches VA -> DATA through MMU_ROOT.
        r.submit(GFX, &r.enc.write_data(VA, &[1]));
        r.wait_idle(GFX);
        // Remap VA in a without MMU_INVALIDATE (a valid entry changed: the
        // device may still use the old translation)...
        a.map_4k(&r.m, VA, DATA + 0x4000, RW);
        // ... then switch GFX to b and back to MMU_ROOT (0): each change
        // discards GFX's cached translations, so GFX now walks a afresh.
        set_engine_root(&r, GFX, b.root);
        r.submit(GFX, &r.enc.write_data(VA, &[2]));
        r.wait_idle(GFX);
        assert_eq!(r.read_u32s(DATA + 0x1000, 1), [2], "through b");
        set_engine_root(&r, GFX, 0);
        r.submit(GFX, &r.enc.write_data(VA, &[3]));
        r.wait_idle(GFX);
        assert_eq!(r.read_u32s(DATA + 0x4000, 1), [3], "the new mapping of a, no stale entry");
        assert_eq!(r.read_u32s(DATA, 1), [1]);
    }
}

#[test]
fn kept_across_an_engine_reset() {
    let gen = Generation::Gen2;
    let (mut r, _a, b) = two_spaces(gen);
    set_engine_root(&r, COPY, b.root);
    r.reset(COPY);
    assert_eq!(r.m.read_reg(root_lo(COPY)), b.root as u32, "kept like RING_BASE");
    assert_eq!(r.m.read_reg(root_hi(COPY)), (b.root >> 32) as u32);
    r.submit(COPY, &r.enc.write_data(VA, &[0x5A]));
    r.wait_idle(COPY);
    assert_eq!(r.read_u32s(DATA + 0x1000, 1), [0x5A]);
}

#[test]
fn mmu_disabled_ignores_engine_roots() {
    let mut r = Rig::new(Generation::Gen1);
    let b = PageTables::new(&r.m, PT_POOL_B, PT_POOL_SIZE);
    set_engine_root(&r, GFX, b.root);
    assert_eq!(r.m.read_reg(regs::MMU_CTRL), 0);
    // With the MMU off the GPU address is physical: the ring at RING_AREA
    // and the operand DATA + 0x10 are reached directly.
    r.submit(GFX, &r.enc.write_data(DATA + 0x10, &[0x77]));
    r.wait_idle(GFX);
    assert_eq!(r.read_u32s(DATA + 0x10, 1), [0x77]);
    assert_eq!(r.m.translate_engine(GFX, DATA + 0x10), Ok(DATA + 0x10));
}

#[test]
fn mmu_invalidate_covers_engine_roots() {
    for gen in gens() {
        let (mut r, _a, mut b) = two_spaces(gen);
        set_engine_root(&r, COPY, b.root);
        r.submit(COPY, &r.enc.write_data(VA, &[1]));
        r.wait_idle(COPY);
        b.map_4k(&r.m, VA, DATA + 0x5000, RW);
        r.m.write_reg(regs::MMU_INVALIDATE, 1);
        r.submit(COPY, &r.enc.write_data(VA, &[2]));
        r.wait_idle(COPY);
        assert_eq!(r.read_u32s(DATA + 0x5000, 1), [2]);
        // Engine registers in the same page are unaffected by the roots.
        assert_eq!(r.m.read_reg(regs::engine_base(COPY) + eng::RING_SIZE), 4096);
    }
}
