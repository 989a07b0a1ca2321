//! VA allocator: behaviour, bad input, and property tests against a shadow model.

use proptest::prelude::*;
use umd_core::mem::va::{Placement, VaAllocator, VaError, VaNode, VaStats, MIN_ALIGN};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn arena(nodes: usize, base: u64, size: u64) -> VaAllocator<Box<[VaNode]>> {
    VaAllocator::new(vec![VaNode::EMPTY; nodes].into_boxed_slice(), base, size).unwrap()
}

fn baseline(a: &VaAllocator<Box<[VaNode]>>) {
    let s = a.stats();
    assert_eq!(s.used, 0);
    assert_eq!(s.free, a.size());
    assert_eq!(s.largest_free, a.size());
    assert_eq!(s.holes, 1);
    assert_eq!(s.allocations, 0);
    assert_eq!(s.nodes_used, 1);
    assert_eq!(s.fragmentation_ppm(), 0);
    let mut holes = Vec::new();
    a.for_each_hole(|s, l| holes.push((s, l)));
    assert_eq!(holes, vec![(a.base(), a.size())]);
    a.validate().unwrap();
}

#[test]
fn bottom_up_and_top_down() {
    let mut a = arena(64, 0x1_0000_0000, 4 * GIB);
    let x = a.alloc(4096, 4096, Placement::BottomUp).unwrap();
    assert_eq!(x, 0x1_0000_0000);
    let y = a.alloc(4096, 4096, Placement::TopDown).unwrap();
    assert_eq!(y, 0x1_0000_0000 + 4 * GIB - 4096);
    let z = a.alloc(100, 1, Placement::BottomUp).unwrap();
    assert_eq!(z, 0x1_0000_1000);
    assert_eq!(a.lookup(z).unwrap().size, MIN_ALIGN);
    let s = a.stats();
    assert_eq!(s.used, 4096 * 2 + 128);
    assert_eq!(s.allocations, 3);
    a.validate().unwrap();
    for v in [x, y, z] {
        a.free(v).unwrap();
        a.validate().unwrap();
    }
    baseline(&a);
    assert_eq!(a.stats().high_water, 4096 * 2 + 128);
}

#[test]
fn alignment_2m_exact_fit_found() {
    // A hole of exactly 2 MiB at a 2 MiB boundary must be used even though it
    // is smaller than size + align.
    let mut a = arena(64, 0, 8 * MIB);
    let f1 = a.alloc_fixed(0, 2 * MIB).unwrap();
    let _f2 = a.alloc_fixed(4 * MIB, 4 * MIB).unwrap();
    assert_eq!(f1, 0);
    let x = a.alloc(2 * MIB, 2 * MIB, Placement::BottomUp).unwrap();
    assert_eq!(x, 2 * MIB);
    assert_eq!(a.alloc(128, 128, Placement::BottomUp), Err(VaError::NoSpace));
    a.validate().unwrap();
}

#[test]
fn coalescing_both_sides() {
    let mut a = arena(64, 0, MIB);
    let p: Vec<u64> = (0..4).map(|_| a.alloc(4096, 4096, Placement::BottomUp).unwrap()).collect();
    a.free(p[0]).unwrap();
    a.free(p[2]).unwrap();
    assert_eq!(a.stats().holes, 3);
    a.free(p[1]).unwrap();
    assert_eq!(a.stats().holes, 2);
    assert_eq!(a.stats().largest_free, MIB - 4 * 4096);
    a.free(p[3]).unwrap();
    baseline(&a);
}

fn unchanged<T: std::fmt::Debug>(
    a: &mut VaAllocator<Box<[VaNode]>>,
    op: impl FnOnce(&mut VaAllocator<Box<[VaNode]>>) -> Result<T, VaError>,
    want: VaError,
) {
    let before: VaStats = a.stats();
    let mut ranges = Vec::new();
    a.for_each_allocation(|r| ranges.push(r));
    assert_eq!(op(a).unwrap_err(), want);
    assert_eq!(a.stats(), before);
    let mut after = Vec::new();
    a.for_each_allocation(|r| after.push(r));
    assert_eq!(ranges, after);
    a.validate().unwrap();
}

#[test]
fn bad_input_leaves_state_unchanged() {
    let mut a = arena(5, 0x10_0000, 16 * MIB);
    let x = a.alloc(4096, 4096, Placement::BottomUp).unwrap();
    let y = a.alloc_fixed(0x10_0000 + 8 * MIB, MIB).unwrap();
    unchanged(&mut a, |a| a.alloc(0, 4096, Placement::BottomUp), VaError::ZeroSize);
    unchanged(&mut a, |a| a.alloc(4096, 3, Placement::BottomUp), VaError::BadAlignment);
    unchanged(&mut a, |a| a.alloc(4096, 0, Placement::BottomUp), VaError::BadAlignment);
    unchanged(&mut a, |a| a.alloc(u64::MAX, 128, Placement::BottomUp), VaError::Overflow);
    unchanged(&mut a, |a| a.alloc(u64::MAX - 100, 128, Placement::TopDown), VaError::Overflow);
    unchanged(&mut a, |a| a.alloc(64 * MIB, 4096, Placement::BottomUp), VaError::NoSpace);
    unchanged(&mut a, |a| a.alloc(4096, 1 << 63, Placement::BottomUp), VaError::NoSpace);
    unchanged(&mut a, |a| a.alloc(MIB, 1 << 63, Placement::TopDown), VaError::NoSpace);
    unchanged(&mut a, |a| a.alloc_fixed(0, 4096), VaError::OutOfRange);
    unchanged(&mut a, |a| a.alloc_fixed(0x10_0000 + 16 * MIB - 4096, 8192), VaError::OutOfRange);
    unchanged(&mut a, |a| a.alloc_fixed(u64::MAX - 127, 4096), VaError::Overflow);
    unchanged(&mut a, |a| a.alloc_fixed(0x10_0000 + 8 * MIB - 4096, 8192), VaError::Overlap);
    unchanged(&mut a, |a| a.alloc_fixed(x, 128), VaError::Overlap);
    unchanged(&mut a, |a| a.alloc_fixed(0x10_0000 + 100, 128), VaError::BadAlignment);
    unchanged(&mut a, |a| a.free(x + 128), VaError::NotAllocated);
    unchanged(&mut a, |a| a.free(0xdead_0000), VaError::NotAllocated);
    a.free(x).unwrap();
    unchanged(&mut a, |a| a.free(x), VaError::NotAllocated);
    a.retire(y).unwrap();
    unchanged(&mut a, |a| a.retire(y), VaError::AlreadyRetired);
    // Node capacity: 5 nodes. Holes: [0,8M) [9M,16M) + alloc y = 3 nodes.
    let p = a.alloc(4096, 4096, Placement::BottomUp).unwrap(); // splits front: +1 node (4)
    let q = a.alloc(4096, 4096, Placement::TopDown).unwrap(); // 5 nodes
    assert_eq!(a.stats().nodes_used, 5);
    // A request that needs one new node fails cleanly.
    unchanged(&mut a, |a| a.alloc_fixed(0x10_0000 + 2 * MIB, 4096), VaError::NodeCapacity);
    // One that consumes a hole exactly needs no new node... there is none here;
    // freeing gives nodes back.
    a.free(q).unwrap();
    a.free(p).unwrap();
    a.free(y).unwrap();
    baseline(&a);
}

#[test]
fn bad_arena() {
    assert_eq!(VaAllocator::new([VaNode::EMPTY; 0], 0, 4096).err(), Some(VaError::BadArena));
    assert_eq!(VaAllocator::new([VaNode::EMPTY; 4], 0, 0).err(), Some(VaError::BadArena));
    assert_eq!(VaAllocator::new([VaNode::EMPTY; 4], 100, 4096).err(), Some(VaError::BadArena));
    assert_eq!(
        VaAllocator::new([VaNode::EMPTY; 4], u64::MAX - 4095 - 127, 8192).err(),
        Some(VaError::BadArena)
    );
    // A static-array allocator works too (const generic capacity).
    let mut a = VaAllocator::new([VaNode::EMPTY; 8], 0, 1 << 48).unwrap();
    assert_eq!(a.alloc(1 << 47, 1 << 47, Placement::TopDown), Ok(1 << 47));
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: u64, align_log2: u32, top: bool },
    Fixed { slot: u64, size: u64 },
    Free { pick: usize },
    Retire { pick: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..300_000, 0u32..22, any::<bool>()).prop_map(|(size, align_log2, top)| Op::Alloc { size, align_log2, top }),
        1 => (0u64..512, 1u64..70_000).prop_map(|(slot, size)| Op::Fixed { slot, size }),
        3 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Retire { pick }),
    ]
}

const CASES: u32 = if cfg!(miri) { 4 } else { 256 };
const STEPS: usize = if cfg!(miri) { 40 } else { 300 };

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences(ops in proptest::collection::vec(op(), 1..STEPS), nodes in 3usize..400) {
        let base = 0x4000_0000u64;
        let size = 64 * MIB;
        let mut a = arena(nodes, base, size);
        let mut live: Vec<(u64, u64)> = Vec::new();
        for op in ops {
            let before = a.stats();
            match op {
                Op::Alloc { size: s, align_log2, top } => {
                    let align = 1u64 << align_log2;
                    let pl = if top { Placement::TopDown } else { Placement::BottomUp };
                    match a.alloc(s, align, pl) {
                        Ok(addr) => {
                            prop_assert_eq!(addr % align.max(MIN_ALIGN), 0);
                            let len = a.lookup(addr).unwrap().size;
                            prop_assert!(len >= s && len < s + MIN_ALIGN);
                            prop_assert!(addr >= base && addr + len <= base + size);
                            for &(b, l) in &live {
                                prop_assert!(addr + len <= b || b + l <= addr, "overlap");
                            }
                            live.push((addr, len));
                        }
                        Err(e) => {
                            prop_assert!(matches!(e, VaError::NoSpace | VaError::NodeCapacity), "{e}");
                            prop_assert_eq!(a.stats(), before);
                        }
                    }
                }
                Op::Fixed { slot, size: s } => {
                    let addr = base + slot * (size / 512);
                    let len = s.div_ceil(MIN_ALIGN) * MIN_ALIGN;
                    let overlaps = live.iter().any(|&(b, l)| addr < b + l && b < addr + len);
                    let outside = addr + len > base + size;
                    match a.alloc_fixed(addr, s) {
                        Ok(got) => {
                            prop_assert_eq!(got, addr);
                            prop_assert!(!overlaps && !outside);
                            live.push((addr, len));
                        }
                        Err(e) => {
                            match e {
                                VaError::Overlap => prop_assert!(overlaps && !outside),
                                VaError::OutOfRange => prop_assert!(outside),
                                VaError::NodeCapacity => prop_assert!(!overlaps && !outside),
                                other => prop_assert!(false, "unexpected {other}"),
                            }
                            prop_assert_eq!(a.stats(), before);
                        }
                    }
                }
                Op::Free { pick } => {
                    if live.is_empty() {
                        prop_assert_eq!(a.free(base), Err(VaError::NotAllocated));
                    } else {
                        let (addr, len) = live.swap_remove(pick % live.len());
                        prop_assert_eq!(a.free(addr), Ok(len));
                        prop_assert_eq!(a.free(addr), Err(VaError::NotAllocated));
                    }
                }
                Op::Retire { pick } => {
                    if !live.is_empty() {
                        let (addr, _) = live[pick % live.len()];
                        let was = a.lookup(addr).unwrap().retired;
                        let r = a.retire(addr);
                        prop_assert_eq!(r.is_err(), was);
                    }
                }
            }
            a.validate().map_err(TestCaseError::fail)?;
            let s = a.stats();
            prop_assert_eq!(s.used, live.iter().map(|x| x.1).sum::<u64>());
            prop_assert_eq!(s.allocations as usize, live.len());
            prop_assert!(s.nodes_used <= nodes as u64);
        }
        for (addr, _) in live.drain(..) {
            a.free(addr).unwrap();
        }
        baseline(&a);
    }
}
