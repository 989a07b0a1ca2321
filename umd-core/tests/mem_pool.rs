//! Size-class pools over a backing, and the buffer manager's fence-gated
//! frees, against a shadow model.

use std::collections::HashMap;

use heapless::Deque;
use proptest::prelude::*;
use umd_core::mem::buffer::{BufferDesc, BufferSlot};
use umd_core::mem::manager::{AllocError, Buffers};
use umd_core::mem::pool::{
    Backing, BackingError, MemKind, Place, Pool, PoolAlloc, PoolError, SizeClass, Slab,
};
use umd_core::mem::va::{VaAllocator, VaError, VaNode, VaPlacement};
use umd_core::sync::{DeviceId, Seqno, MAX_QUEUES};

const MIB: u64 = 1 << 20;

/// Blocks are VA ranges; the block value is its address.
struct VaBacking {
    va: VaAllocator<Vec<VaNode>>,
    blocks: HashMap<u64, u64>,
    acquired: u64,
    released: u64,
}

impl VaBacking {
    fn new(nodes: usize, size: u64) -> VaBacking {
        VaBacking {
            va: VaAllocator::new(vec![VaNode::EMPTY; nodes], 0x1000_0000, size).unwrap(),
            blocks: HashMap::new(),
            acquired: 0,
            released: 0,
        }
    }
}

impl Backing for VaBacking {
    type Block = u64;
    const PLACES_AT: bool = true;
    fn acquire(&mut self, bytes: u64, place: Place, _kind: MemKind) -> Result<(u64, u64), BackingError> {
        assert_eq!(bytes % 4096, 0, "blocks are whole pages");
        let a = match place {
            Place::Aligned(align) => self.va.alloc(bytes, align, VaPlacement::BottomUp),
            Place::At(at) => self.va.alloc_fixed(at, bytes),
        }
        .map_err(BackingError::Va)?;
        for (&b, &l) in &self.blocks {
            assert!(a + bytes <= b || b + l <= a, "blocks overlap");
        }
        self.blocks.insert(a, bytes);
        self.acquired += 1;
        Ok((a, a))
    }
    fn release(&mut self, addr: u64, bytes: u64, block: u64) {
        assert_eq!(addr, block);
        assert_eq!(self.blocks.remove(&addr), Some(bytes), "released what was acquired");
        self.va.free(addr).unwrap();
        self.released += 1;
    }
}

fn slabs(n: usize) -> Vec<Slab<u64>> {
    (0..n).map(|_| Slab::EMPTY).collect()
}

#[test]
fn classes_bins_and_slabs() {
    let mut k = VaBacking::new(256, 64 * MIB);
    let mut p = Pool::new(slabs(64));
    assert_eq!(SizeClass::of(1023), SizeClass::Small);
    assert_eq!(SizeClass::of(1024), SizeClass::Medium);
    assert_eq!(SizeClass::of(64 << 10), SizeClass::Medium);
    assert_eq!(SizeClass::of((64 << 10) + 1), SizeClass::Large);
    let a = p.alloc(&mut k, 100, 1, MemKind::DEFAULT).unwrap();
    let b = p.alloc(&mut k, 100, 1, MemKind::DEFAULT).unwrap();
    assert_eq!(a.reserved(), 128);
    assert_eq!(b.addr(), a.addr() + 128, "small objects share one slab");
    let c = p.alloc(&mut k, 3000, 1, MemKind::DEFAULT).unwrap();
    assert_eq!((c.reserved(), c.class()), (4096, SizeClass::Medium));
    let l = p.alloc(&mut k, 100_000, 1, MemKind::DEFAULT).unwrap();
    assert_eq!((l.reserved(), l.class()), (102_400, SizeClass::Large));
    // Another kind of memory never shares a slab.
    let ro =
        p.alloc(&mut k, 100, 1, MemKind { gpu_read_only: true, device_only: false, local: false }).unwrap();
    assert_ne!(ro.addr(), a.addr() + 256);
    // An alignment up to 4 KiB stays in a slab bin; above it goes large.
    let d = p.alloc(&mut k, 100, 4096, MemKind::DEFAULT).unwrap();
    assert_eq!(d.addr() % 4096, 0);
    assert_eq!(d.class(), SizeClass::Small);
    let e = p.alloc(&mut k, 100, MIB, MemKind::DEFAULT).unwrap();
    assert_eq!(e.addr() % MIB, 0);
    assert_eq!(e.class(), SizeClass::Large);
    let st = p.stats();
    assert_eq!(st.classes[0].live, 4);
    assert_eq!(st.classes[1].live, 1);
    assert_eq!(st.classes[2].live, 2);
    for x in [a, b, c, l, ro, d, e] {
        p.free(&mut k, x).unwrap();
    }
    // Empty slabs are kept (one per kind and bin) until trimmed.
    assert!(p.stats().empty_slabs > 0);
    p.trim(&mut k);
    assert_eq!(p.stats().slabs, 0);
    assert!(k.blocks.is_empty());
    assert_eq!(k.acquired, k.released);
}

#[test]
fn a_kept_slab_saves_the_backing_call() {
    let mut k = VaBacking::new(64, 16 * MIB);
    let mut p = Pool::new(slabs(8));
    for _ in 0..100 {
        let a = p.alloc(&mut k, 64, 1, MemKind::DEFAULT).unwrap();
        p.free(&mut k, a).unwrap();
    }
    assert_eq!(k.acquired, 1, "one slab for a hundred alloc/free pairs");
}

/// A block at a fixed address: any size is a large block of its own,
/// exactly there; a taken, outside or misaligned address is refused and
/// changes nothing.
#[test]
fn fixed_address_blocks() {
    const BASE: u64 = 0x1000_0000;
    let mut k = VaBacking::new(64, 16 * MIB);
    let mut p = Pool::new(slabs(8));
    let small = p.alloc(&mut k, 100, 1, MemKind::DEFAULT).unwrap();
    let a = p.alloc_at(&mut k, 100, BASE + 8 * MIB, MemKind::DEFAULT).unwrap();
    assert_eq!((a.addr(), a.class(), a.reserved()), (BASE + 8 * MIB, SizeClass::Large, 4096));
    // Above 2 MiB a fixed block keeps its address (no 2 MiB alignment).
    let big = p.alloc_at(&mut k, 3 * MIB, BASE + 12 * MIB + 4096, MemKind::DEFAULT).unwrap();
    assert_eq!((big.addr(), big.reserved()), (BASE + 12 * MIB + 4096, 3 * MIB));
    let before = (p.stats(), k.acquired, k.blocks.clone());
    let refused = |p: &mut Pool<Vec<Slab<u64>>, u64>, k: &mut VaBacking, size, at| {
        p.alloc_at(k, size, at, MemKind::DEFAULT).map(|a| a.addr())
    };
    let va = |e| Err(PoolError::Backing { class: SizeClass::Large, error: BackingError::Va(e) });
    assert_eq!(refused(&mut p, &mut k, 4096, BASE + 8 * MIB), va(VaError::Overlap), "taken");
    assert_eq!(
        refused(&mut p, &mut k, 8192, BASE + 8 * MIB - 4096),
        va(VaError::Overlap),
        "overlaps the end"
    );
    assert_eq!(refused(&mut p, &mut k, 4096, small.addr()), va(VaError::Overlap), "inside a slab");
    assert_eq!(refused(&mut p, &mut k, 4096, BASE - 4096), va(VaError::OutOfRange));
    assert_eq!(refused(&mut p, &mut k, 8192, BASE + 16 * MIB - 4096), va(VaError::OutOfRange));
    assert_eq!(refused(&mut p, &mut k, 4096, BASE + 128), Err(PoolError::BadAlignment { align: 4096 }));
    assert_eq!(refused(&mut p, &mut k, 0, BASE + 4 * MIB), Err(PoolError::ZeroSize));
    assert_eq!(refused(&mut p, &mut k, u64::MAX, BASE), Err(PoolError::TooLarge { size: u64::MAX }));
    assert_eq!((p.stats(), k.acquired, k.blocks.clone()), before, "a refusal changed the pool");
    for x in [a, big, small] {
        p.free(&mut k, x).unwrap();
    }
    // Freed, the address can be had again.
    let again = p.alloc_at(&mut k, 4096, BASE + 8 * MIB, MemKind::DEFAULT).unwrap();
    assert_eq!(again.addr(), BASE + 8 * MIB);
    p.free(&mut k, again).unwrap();
    p.trim(&mut k);
    assert!(k.blocks.is_empty());
}

#[test]
fn bad_input_leaves_the_pool_unchanged() {
    let mut k = VaBacking::new(4, 4 * MIB);
    let mut p = Pool::new(slabs(2));
    let keep = p.alloc(&mut k, 200, 1, MemKind::DEFAULT).unwrap();
    let before = p.stats();
    assert_eq!(p.alloc(&mut k, 0, 1, MemKind::DEFAULT).unwrap_err(), PoolError::ZeroSize);
    assert_eq!(p.alloc(&mut k, 10, 3, MemKind::DEFAULT).unwrap_err(), PoolError::BadAlignment { align: 3 });
    assert_eq!(
        p.alloc(&mut k, 10, 4 * MIB, MemKind::DEFAULT).unwrap_err(),
        PoolError::BadAlignment { align: 4 * MIB }
    );
    assert_eq!(
        p.alloc(&mut k, u64::MAX, 1, MemKind::DEFAULT).unwrap_err(),
        PoolError::TooLarge { size: u64::MAX }
    );
    assert!(matches!(
        p.alloc(&mut k, 8 * MIB, 1, MemKind::DEFAULT),
        Err(PoolError::Backing { class: SizeClass::Large, error: BackingError::Va(_) })
    ));
    // Two slab descriptors: a third bin finds none.
    let b = p.alloc(&mut k, 2000, 1, MemKind::DEFAULT).unwrap();
    let before2 = p.stats();
    assert_eq!(
        p.alloc(&mut k, 600, 1, MemKind::DEFAULT).unwrap_err(),
        PoolError::SlabCapacity { class: SizeClass::Small }
    );
    assert_eq!(p.stats(), before2);
    p.free(&mut k, b).unwrap();
    let live = |s: umd_core::mem::PoolStats| s.classes.map(|c| (c.live, c.requested, c.reserved));
    assert_eq!(live(p.stats()), live(before));
    p.free(&mut k, keep).unwrap();
    p.trim(&mut k);
    assert!(k.blocks.is_empty());
}

// ----- the buffer manager ---------------------------------------------------

/// Storage for a manager in a test.
struct Store {
    slots: Vec<BufferSlot<u64>>,
    slabs: Vec<Slab<u64>>,
    fifos: [Deque<u32, 256>; MAX_QUEUES],
}

impl Store {
    fn new() -> Store {
        Store {
            slots: (0..256).map(|_| BufferSlot::EMPTY).collect(),
            slabs: slabs(64),
            fifos: std::array::from_fn(|_| Deque::new()),
        }
    }

    fn buffers(&mut self) -> Buffers<'_, u64> {
        let [a, b, c, d] = &mut self.fifos;
        Buffers::new(
            DeviceId(7),
            &mut self.slots,
            &mut self.slabs,
            [a.as_mut_view(), b.as_mut_view(), c.as_mut_view(), d.as_mut_view()],
        )
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: u64, declared: bool },
    Use { pick: usize, queue: usize },
    Free { pick: usize },
    Signal { queue: usize, by: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..100_000, any::<bool>()).prop_map(|(size, declared)| Op::Alloc { size, declared }),
        3 => (any::<usize>(), 0usize..3).prop_map(|(pick, queue)| Op::Use { pick, queue }),
        3 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (0usize..3, 0u64..4).prop_map(|(queue, by)| Op::Signal { queue, by }),
    ]
}

const CASES: u32 = if cfg!(miri) { 3 } else { 200 };
const STEPS: usize = if cfg!(miri) { 40 } else { 300 };

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() })]

    /// Memory of a freed buffer is never handed out again before every
    /// fence of its gate has signalled; live buffers never overlap; after
    /// everything is freed and signalled the backing is empty again.
    #[test]
    fn freed_memory_is_not_reused_before_its_fences(ops in proptest::collection::vec(op(), 1..STEPS)) {
        let mut store = Store::new();
        let mut bufs = store.buffers();
        let mut k = VaBacking::new(512, 256 * MIB);
        let mut emitted = [0u64; 3];
        let mut completed = [0u64; 3];
        // (handle, addr, reserved, declared, last use per queue)
        let mut live: Vec<(_, u64, u64, bool, [u64; 3])> = Vec::new();
        // (addr, reserved, gate per queue) of freed buffers not yet known released.
        let mut waiting: Vec<(u64, u64, [u64; 3])> = Vec::new();
        for op in ops {
            let em = emitted;
            let co = completed;
            match op {
                Op::Alloc { size, declared } => {
                    let desc = if declared { BufferDesc::new(size).declared() } else { BufferDesc::new(size) };
                    match bufs.alloc(&mut k, &desc) {
                        Ok(h) => {
                            let info = bufs.info(h).unwrap();
                            let (s, e) = (info.va, info.va + info.reserved);
                            for &(_, a, r, _, _) in &live {
                                prop_assert!(e <= a || a + r <= s, "overlaps a live buffer");
                            }
                            // Still gated: its fences have not all signalled.
                            for &(a, r, gate) in &waiting {
                                let gated = (0..3).any(|q| gate[q] > completed[q]);
                                prop_assert!(!gated || e <= a || a + r <= s, "reused before its fence");
                            }
                            live.push((h, info.va, info.reserved, declared, [0; 3]));
                        }
                        Err(e) => prop_assert!(matches!(e, AllocError::TableFull { .. } | AllocError::VaSpace { .. } | AllocError::VaNodes | AllocError::SlabCapacity { .. }), "{e:?}"),
                    }
                }
                Op::Use { pick, queue } => {
                    if !live.is_empty() {
                        let n = live.len();
                        let entry = &mut live[pick % n];
                        emitted[queue] += 1;
                        bufs.note_use(entry.0, queue, Seqno(emitted[queue]));
                        entry.4[queue] = emitted[queue];
                    }
                }
                Op::Free { pick } => {
                    if !live.is_empty() {
                        let (h, a, r, declared, uses) = live.swap_remove(pick % live.len());
                        // The gate the manager must apply: implicit -> every
                        // queue's last emitted; declared -> its own uses.
                        let gate = if declared { uses } else { em };
                        bufs.free(&mut k, h, 3, &|q| Seqno(co[q]), &|q| Seqno(em[q]), false).unwrap();
                        prop_assert!(bufs.free(&mut k, h, 3, &|q| Seqno(co[q]), &|q| Seqno(em[q]), false).is_err());
                        waiting.push((a, r, gate));
                    }
                }
                Op::Signal { queue, by } => {
                    completed[queue] = (completed[queue] + by).min(emitted[queue]);
                    let co = completed;
                    bufs.reclaim(&mut k, queue, &|q| Seqno(co[q]), usize::MAX);
                    waiting.retain(|(_, _, g)| (0..3).any(|q| g[q] > co[q]));
                }
            }
        }
        for (h, ..) in live.drain(..) {
            bufs.free(&mut k, h, 3, &|q| Seqno(completed[q]), &|q| Seqno(emitted[q]), false).unwrap();
        }
        for q in 0..3 {
            let done = emitted;
            bufs.reclaim(&mut k, q, &|x| Seqno(done[x]), usize::MAX);
        }
        // Passing a queue hands an entry to the next queue of its gate.
        for q in 0..3 {
            let done = emitted;
            bufs.reclaim(&mut k, q, &|x| Seqno(done[x]), usize::MAX);
        }
        let s = bufs.stats();
        prop_assert_eq!((s.live, s.waiting), (0, 0));
        bufs.trim(&mut k);
        prop_assert!(k.blocks.is_empty(), "{} blocks left", k.blocks.len());
        prop_assert_eq!(k.acquired, k.released);
    }
}

/// A pool allocation is not `Copy`: giving it back twice does not compile.
#[allow(dead_code)]
fn single_ownership(p: &mut Pool<Vec<Slab<u64>>, u64>, k: &mut VaBacking, a: PoolAlloc<u64>) {
    let _ = p.free(k, a);
}
