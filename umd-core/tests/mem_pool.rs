//! Size-class pools, fence-gated reuse and buffer handles.

use proptest::prelude::*;
use umd_core::mem::buffer::{BufferError, BufferFlags, Buffers};
use umd_core::mem::deferred::{DeferredError, DeferredFifo};
use umd_core::mem::pagetable::CachePolicy;
use umd_core::mem::pool::{Pool, PoolAlloc, PoolError, SizeClass};
use umd_core::mem::va::{VaAllocator, VaError, VaNode};
use umd_core::sync::{FenceId, QueueId, Seqno};

const MIB: u64 = 1 << 20;
type P = Pool<Box<[VaNode]>, 64, 16, 3>;

fn pool(nodes: usize, size: u64) -> P {
    let va = VaAllocator::new(vec![VaNode::EMPTY; nodes].into_boxed_slice(), 0x1000_0000, size).unwrap();
    Pool::new(va)
}

fn fence(q: u8, s: u64) -> FenceId {
    FenceId::new(QueueId(q), s)
}

fn assert_baseline(p: &P) {
    let s = p.stats();
    assert_eq!(s.va.used, 0);
    assert_eq!(s.va.holes, 1);
    assert_eq!(s.va.largest_free, s.va.arena);
    assert_eq!(s.va.nodes_used, 1);
    assert_eq!(s.slabs, 0);
    assert_eq!(s.pending, 0);
    assert_eq!(s.pending_bytes, 0);
    for c in s.classes {
        assert_eq!((c.live, c.requested, c.reserved), (0, 0, 0));
    }
    p.va().validate().unwrap();
}

#[test]
fn classes_bins_and_separation() {
    let mut p = pool(256, 64 * MIB);
    assert_eq!(SizeClass::of(1023), SizeClass::Small);
    assert_eq!(SizeClass::of(1024), SizeClass::Medium);
    assert_eq!(SizeClass::of(64 << 10), SizeClass::Medium);
    assert_eq!(SizeClass::of((64 << 10) + 1), SizeClass::Large);
    let a = p.alloc(100, 1).unwrap();
    let b = p.alloc(100, 1).unwrap();
    assert_eq!(a.reserved(), 128);
    assert_eq!(b.addr(), a.addr() + 128, "small objects share one slab");
    let c = p.alloc(3000, 1).unwrap();
    assert_eq!(c.reserved(), 4096);
    assert_eq!(c.class(), SizeClass::Medium);
    let l = p.alloc(100_000, 1).unwrap();
    assert_eq!(l.reserved(), 102_400);
    assert_eq!(l.class(), SizeClass::Large);
    // Large from the bottom, slabs from the top.
    assert_eq!(l.addr(), 0x1000_0000);
    assert!(a.addr() > 0x1000_0000 + 32 * MIB);
    assert_eq!(p.stats().slabs, 2);
    // An alignment above the slot size moves to a bigger bin.
    let d = p.alloc(100, 4096).unwrap();
    assert_eq!(d.addr() % 4096, 0);
    assert_eq!(d.reserved(), 4096);
    // 1 MiB alignment of a small object goes large.
    let e = p.alloc(100, MIB).unwrap();
    assert_eq!(e.addr() % MIB, 0);
    assert_eq!(e.class(), SizeClass::Small);
    let st = p.stats();
    assert_eq!(st.classes[0].live, 4);
    assert_eq!(st.classes[1].live, 1);
    assert_eq!(st.classes[2].live, 1);
    for x in [a, b, c, l, d, e] {
        p.free(x).unwrap();
    }
    assert_baseline(&p);
}

#[test]
fn slab_fills_and_releases() {
    let mut p = pool(256, 64 * MIB);
    // 128 B bin: 64 slots per slab.
    let v: Vec<PoolAlloc> = (0..65).map(|_| p.alloc(128, 128).unwrap()).collect();
    assert_eq!(p.stats().slabs, 2);
    let mut addrs: Vec<u64> = v.iter().map(|a| a.addr()).collect();
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), 65);
    for a in v {
        p.free(a).unwrap();
    }
    assert_baseline(&p);
}

#[test]
fn bad_input_leaves_pool_unchanged() {
    let mut p = pool(4, 4 * MIB);
    let keep = p.alloc(200, 1).unwrap();
    let before = p.stats();
    assert_eq!(p.alloc(0, 1).unwrap_err(), PoolError::Va(VaError::ZeroSize));
    assert_eq!(p.alloc(10, 3).unwrap_err(), PoolError::Va(VaError::BadAlignment));
    assert_eq!(p.alloc(u64::MAX, 1).unwrap_err(), PoolError::Va(VaError::Overflow));
    assert_eq!(p.alloc(u64::MAX - 4000, 4096).unwrap_err(), PoolError::Va(VaError::Overflow));
    assert_eq!(p.alloc(8 * MIB, 1).unwrap_err(), PoolError::Va(VaError::NoSpace));
    assert_eq!(p.alloc(4096, 1 << 63).unwrap_err(), PoolError::Va(VaError::NoSpace));
    assert_eq!(p.stats(), before);
    // A deferred free on a queue the pool does not track hands the token back.
    let (e, keep) = p.free_after(keep, fence(7, 1)).unwrap_err();
    assert_eq!(e, PoolError::Deferred(DeferredError::BadQueue));
    assert_eq!(p.stats(), before);
    // Node capacity: 4 nodes; hole + slab = 2; each large alloc adds one.
    let l1 = p.alloc(MIB, 1).unwrap();
    let l2 = p.alloc(MIB, 1).unwrap();
    let before = p.stats();
    assert_eq!(p.alloc(MIB, 1).unwrap_err(), PoolError::Va(VaError::NodeCapacity));
    assert_eq!(p.stats(), before);
    for a in [keep, l1, l2] {
        p.free(a).unwrap();
    }
    assert_baseline(&p);
}

#[test]
fn slab_descriptor_capacity() {
    let va = VaAllocator::new(vec![VaNode::EMPTY; 64].into_boxed_slice(), 0, 64 * MIB).unwrap();
    let mut p: Pool<Box<[VaNode]>, 2, 4, 1> = Pool::new(va);
    let a = p.alloc(128, 1).unwrap();
    let b = p.alloc(256, 1).unwrap();
    let before = p.stats();
    assert_eq!(p.alloc(512, 1).unwrap_err(), PoolError::SlabCapacity);
    assert_eq!(p.stats(), before);
    p.free(a).unwrap();
    let c = p.alloc(512, 1).unwrap();
    p.free(b).unwrap();
    p.free(c).unwrap();
    assert_eq!(p.stats().slabs, 0);
}

#[test]
fn fence_gated_reuse_stops_at_first_unsignalled() {
    let mut p = pool(256, 64 * MIB);
    let a = p.alloc(MIB, 1).unwrap();
    let b = p.alloc(500, 1).unwrap();
    let c = p.alloc(MIB, 1).unwrap();
    let a_addr = a.addr();
    p.free_after(a, fence(0, 10)).unwrap();
    p.free_after(b, fence(0, 30)).unwrap();
    p.free_after(c, fence(0, 20)).unwrap(); // older seqno pushed late: reclaimed late, never early
    assert_eq!(p.stats().pending, 3);
    // The memory is still reserved: a new allocation cannot get a_addr.
    let x = p.alloc(MIB, 1).unwrap();
    assert_ne!(x.addr(), a_addr);
    assert_eq!(p.reclaim(0, Seqno(9), 100), 0);
    assert_eq!(p.reclaim(1, Seqno(100), 100), 0, "other queue's fences do not help");
    assert_eq!(p.reclaim(0, Seqno(25), 100), 1, "stops at seqno 30");
    assert_eq!(p.stats().pending, 2);
    assert_eq!(p.reclaim(0, Seqno(30), 1), 1, "budget bounds the work");
    assert_eq!(p.reclaim(0, Seqno(30), 100), 1);
    assert_eq!(p.stats().pending, 0);
    p.free(x).unwrap();
    assert_baseline(&p);
}

#[test]
fn fence_wraparound() {
    let mut p = pool(256, 64 * MIB);
    let a = p.alloc(4096, 1).unwrap();
    p.free_after(a, fence(2, u64::MAX - 1)).unwrap();
    let b = p.alloc(4096, 1).unwrap();
    p.free_after(b, fence(2, 1)).unwrap(); // after the wrap
    assert_eq!(p.reclaim(2, Seqno(u64::MAX - 2), 10), 0);
    assert_eq!(p.reclaim(2, Seqno(u64::MAX), 10), 1);
    assert_eq!(p.reclaim(2, Seqno(0), 10), 0);
    assert_eq!(p.reclaim(2, Seqno(1), 10), 1);
    assert_baseline(&p);
}

#[test]
fn deferred_fifo_full_hands_back() {
    let mut f: DeferredFifo<u32, 2> = DeferredFifo::new();
    f.push(fence(0, 1), 1).unwrap();
    f.push(fence(0, 2), 2).unwrap();
    assert_eq!(f.push(fence(0, 3), 3), Err((DeferredError::Full, 3)));
    assert_eq!(f.pop_signalled(Seqno(1)), Some((fence(0, 1), 1)));
    f.push(fence(0, 3), 3).unwrap();
    let mut seen = Vec::new();
    f.for_each(|fc, v| seen.push((fc.seqno.0, *v)));
    assert_eq!(seen, vec![(2, 2), (3, 3)]);
    let mut drained = Vec::new();
    f.drain(|_, v| drained.push(v));
    assert_eq!(drained, vec![2, 3]);
    assert!(f.is_empty());
    let mut z: DeferredFifo<u32, 0> = DeferredFifo::new();
    assert_eq!(z.push(fence(0, 1), 9), Err((DeferredError::Full, 9)));
    assert_eq!(z.pop_signalled(Seqno(5)), None);
}

#[test]
fn pool_deferred_full() {
    let va = VaAllocator::new(vec![VaNode::EMPTY; 64].into_boxed_slice(), 0, 64 * MIB).unwrap();
    let mut p: Pool<Box<[VaNode]>, 8, 1, 1> = Pool::new(va);
    let a = p.alloc(4096, 1).unwrap();
    let b = p.alloc(4096, 1).unwrap();
    p.free_after(a, fence(0, 1)).unwrap();
    let before = p.stats();
    let (e, b) = p.free_after(b, fence(0, 2)).unwrap_err();
    assert_eq!(e, PoolError::Deferred(DeferredError::Full));
    assert_eq!(p.stats(), before);
    assert_eq!(p.reclaim(0, Seqno(1), 4), 1);
    p.free(b).unwrap();
    assert_eq!(p.stats().va.used, 0);
}

type B = Buffers<Box<[VaNode]>, 4, 16, 8, 2>;

fn buffers() -> B {
    let va = VaAllocator::new(vec![VaNode::EMPTY; 64].into_boxed_slice(), 0x10_0000, 256 * MIB).unwrap();
    Buffers::new(Pool::new(va))
}

#[test]
fn buffer_handles_and_leak_report() {
    let mut b = buffers();
    let flags = BufferFlags { cpu_visible: true, gpu_read_only: false, cache: CachePolicy::WriteCombined };
    let h1 = b.create(4096, 4096, flags, "ring").unwrap();
    let h2 = b.create(300, 64, BufferFlags::default(), "fence slots").unwrap();
    let info = b.info(h1).unwrap();
    assert_eq!((info.size, info.tag, info.flags), (4096, "ring", flags));
    assert_eq!(info.va % 4096, 0);
    let mut leaks = Vec::new();
    b.leak_report(|e| leaks.push((e.handle, e.info.size, e.info.tag)));
    assert_eq!(leaks, vec![(h1, 4096, "ring"), (h2, 300, "fence slots")]);

    let stats = b.stats();
    b.destroy(h1).unwrap();
    let after_destroy = b.stats();
    // Double free and stale use: errors, nothing changes.
    assert_eq!(b.destroy(h1), Err(BufferError::Stale));
    assert_eq!(b.info(h1), Err(BufferError::Stale));
    assert_eq!(b.destroy_after(h1, fence(0, 1)), Err(BufferError::Stale));
    assert_eq!(b.stats(), after_destroy);
    assert_ne!(stats, after_destroy);
    // The slot is reused; the old handle still fails and never reaches the new buffer.
    let h3 = b.create(8192, 4096, flags, "ib").unwrap();
    assert_ne!(h3, h1);
    assert_eq!(b.info(h1), Err(BufferError::Stale));
    assert_eq!(b.info(h3).unwrap().tag, "ib");
    // Unknown handles: never issued, forged.
    let forged = umd_core::mem::BufferHandle::from_bits((1u64 << 32) | 3);
    assert_eq!(b.info(forged), Err(BufferError::Unknown));
    assert_eq!(b.destroy(umd_core::mem::BufferHandle::from_bits(99)), Err(BufferError::Unknown));
    assert_eq!(b.info(umd_core::mem::BufferHandle::from_bits(h3.to_bits())).unwrap().size, 8192);
    // Zero size / bad alignment / overflow are pool errors, state unchanged.
    let s = b.stats();
    assert_eq!(b.create(0, 1, flags, "x"), Err(BufferError::Pool(PoolError::Va(VaError::ZeroSize))));
    assert_eq!(b.create(10, 6, flags, "x"), Err(BufferError::Pool(PoolError::Va(VaError::BadAlignment))));
    assert_eq!(b.create(u64::MAX, 1, flags, "x"), Err(BufferError::Pool(PoolError::Va(VaError::Overflow))));
    assert_eq!(b.stats(), s);
    assert_eq!(b.live(), 2);
    // Table full (capacity 4).
    let h4 = b.create(10, 1, flags, "a").unwrap();
    let h5 = b.create(10, 1, flags, "b").unwrap();
    let s = b.stats();
    assert_eq!(b.create(10, 1, flags, "c"), Err(BufferError::TableFull));
    assert_eq!(b.stats(), s);
    // Deferred destroy: handle dies now, memory after the fence.
    b.destroy_after(h4, fence(1, 5)).unwrap();
    assert_eq!(b.info(h4), Err(BufferError::Stale));
    assert_eq!(b.stats().pending, 1);
    assert_eq!(
        b.destroy_after(h5, fence(2, 5)),
        Err(BufferError::Pool(PoolError::Deferred(DeferredError::BadQueue)))
    );
    assert_eq!(b.reclaim(1, Seqno(5), 8), 1);
    for h in [h2, h3, h5] {
        b.destroy(h).unwrap();
    }
    assert_eq!(b.live(), 0);
    let mut leaks = 0;
    b.leak_report(|_| leaks += 1);
    assert_eq!(leaks, 0);
    assert_eq!(b.stats().va.used, 0);
    assert_eq!(b.stats().va.holes, 1);
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { class: u8, size: u64, align_log2: u32 },
    Free { pick: usize },
    FreeAfter { pick: usize, queue: u8, ahead: u64 },
    Signal { queue: u8, by: u64, budget: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..3, 1u64..4096, 0u32..13).prop_map(|(class, size, align_log2)| Op::Alloc { class, size, align_log2 }),
        2 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (any::<usize>(), 0u8..3, 0u64..4).prop_map(|(pick, queue, ahead)| Op::FreeAfter { pick, queue, ahead }),
        2 => (0u8..3, 0u64..3, 1usize..5).prop_map(|(queue, by, budget)| Op::Signal { queue, by, budget }),
    ]
}

const CASES: u32 = if cfg!(miri) { 3 } else { 200 };
const STEPS: usize = if cfg!(miri) { 40 } else { 300 };

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() })]

    /// Live and pending ranges never overlap, alignment is honoured, deferred
    /// memory is not reused before its fence, and after freeing everything
    /// and signalling every fence the arena is one hole again.
    #[test]
    fn random_alloc_free_deferred(ops in proptest::collection::vec(op(), 1..STEPS)) {
        let mut p = pool(512, 256 * MIB);
        let mut live: Vec<PoolAlloc> = Vec::new();
        // (addr, reserved, queue, seqno) of deferred frees.
        let mut pending: Vec<(u64, u64, u8, u64)> = Vec::new();
        let mut submitted = [0u64; 3];
        let mut completed = [0u64; 3];
        for op in ops {
            match op {
                Op::Alloc { class, size, align_log2 } => {
                    let size = match class { 0 => size % 1023 + 1, 1 => 1024 + size * 15, _ => 65 * 1024 + size * 97 };
                    let align = 1u64 << align_log2;
                    let before = p.stats();
                    match p.alloc(size, align) {
                        Ok(a) => {
                            prop_assert_eq!(a.addr() % align.max(128), 0);
                            prop_assert!(a.reserved() >= size);
                            let (s, e) = (a.addr(), a.addr() + a.reserved());
                            for o in &live {
                                prop_assert!(e <= o.addr() || o.addr() + o.reserved() <= s, "overlaps live");
                            }
                            for &(pa, pr, _, _) in &pending {
                                prop_assert!(e <= pa || pa + pr <= s, "reused before its fence");
                            }
                            live.push(a);
                        }
                        Err(_) => prop_assert_eq!(p.stats(), before),
                    }
                }
                Op::Free { pick } => {
                    if !live.is_empty() {
                        let a = live.swap_remove(pick % live.len());
                        let r = a.reserved();
                        prop_assert_eq!(p.free(a).unwrap(), r);
                    }
                }
                Op::FreeAfter { pick, queue, ahead } => {
                    if !live.is_empty() {
                        let a = live.swap_remove(pick % live.len());
                        let q = queue as usize;
                        submitted[q] += ahead;
                        let seq = submitted[q];
                        let rec = (a.addr(), a.reserved(), queue, seq);
                        let before = p.stats();
                        match p.free_after(a, fence(queue, seq)) {
                            Ok(()) => pending.push(rec),
                            Err((e, a)) => {
                                prop_assert_eq!(e, PoolError::Deferred(DeferredError::Full));
                                prop_assert_eq!(p.pending_on(queue), 16);
                                prop_assert_eq!(p.stats(), before);
                                live.push(a);
                            }
                        }
                    }
                }
                Op::Signal { queue, by, budget } => {
                    let q = queue as usize;
                    completed[q] = (completed[q] + by).min(submitted[q]);
                    let n = p.reclaim(queue, Seqno(completed[q]), budget);
                    // Entries are per-queue FIFO: the first n of this queue go.
                    let mut removed = 0;
                    let mut i = 0;
                    while i < pending.len() && removed < n {
                        if pending[i].2 == queue {
                            prop_assert!(pending[i].3 <= completed[q], "reclaimed before its fence");
                            pending.remove(i);
                            removed += 1;
                        } else {
                            i += 1;
                        }
                    }
                    prop_assert_eq!(removed, n);
                }
            }
            let s = p.stats();
            prop_assert_eq!(s.pending as usize, pending.len());
            prop_assert_eq!(s.pending_bytes, pending.iter().map(|x| x.1).sum::<u64>());
            let reserved: u64 = live.iter().map(|a| a.reserved()).sum::<u64>() + s.pending_bytes;
            prop_assert_eq!(s.classes.iter().map(|c| c.reserved).sum::<u64>(), reserved);
            p.va().validate().map_err(TestCaseError::fail)?;
        }
        for a in live.drain(..) {
            p.free(a).unwrap();
        }
        for q in 0..3u8 {
            p.reclaim(q, Seqno(submitted[q as usize]), usize::MAX);
        }
        assert_baseline(&p);
    }
}
