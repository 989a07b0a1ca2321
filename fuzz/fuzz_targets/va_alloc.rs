//! The GPU VA allocator against a shadow interval set, on operation
//! sequences from the fuzzer's bytes (alloc with any size, alignment and
//! placement, by address or by handle; fixed allocations anywhere; retire;
//! free of live, retired, stale, made-up and interior addresses, and by current and
//! stale handles, which must give exactly what a free of the address gives). Invariants: an allocation is aligned,
//! inside the arena and overlaps no other (shadow check); a refusal is a
//! typed error that changes nothing (stats equal before and after); the
//! stats match the shadow (used bytes, count); `validate` holds after every
//! step; once everything is freed the arena is one hole again. The low bit
//! of the second byte chooses recycling (`VaAllocator::new_recycling`),
//! where a refused allocation may first flush the recycled ranges (then
//! only the used bytes and the allocations must be unchanged).
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use umd_core::mem::va::{VaAllocator, VaHandle, VaNode, VaPlacement, VaStats, MIN_ALIGN};

fuzz_target!(|data: &[u8]| {
    let (Some(&b0), Some(&b1)) = (data.first(), data.get(1)) else { return };
    let nodes = 4 + usize::from(b0 % 60);
    let base = u64::from(b1) * MIN_ALIGN * 1024;
    let size = 64 * MIN_ALIGN << (b0 >> 6);
    let storage = vec![VaNode::EMPTY; nodes].into_boxed_slice();
    let rest = data.get(2..).unwrap_or(&[]);
    if b1 & 1 == 0 {
        run(VaAllocator::new(storage, base, size).expect("arena"), rest);
    } else {
        run(VaAllocator::new_recycling(storage, base, size).expect("arena"), rest);
    }
});

/// A refused allocation changed nothing (with recycling: nothing but the
/// recycled ranges, which it may have flushed).
fn unchanged<const R: bool>(va: &VaAllocator<Box<[VaNode]>, R>, before: VaStats, what: &str) {
    let s = va.stats();
    if R {
        assert_eq!(
            (s.used, s.allocations, s.high_water),
            (before.used, before.allocations, before.high_water),
            "{what}"
        );
    } else {
        assert_eq!(s, before, "{what}");
    }
}

/// The operations of `data` on `va`.
fn run<const R: bool>(mut va: VaAllocator<Box<[VaNode]>, R>, data: &[u8]) {
    let (base, size) = (va.base(), va.size());
    let mut it = data.iter().copied();
    let mut next = || it.next();
    // Shadow: start -> (size, retired).
    let mut shadow: BTreeMap<u64, (u64, bool)> = BTreeMap::new();
    // Every handle ever returned (current or stale).
    let mut handles: Vec<VaHandle> = Vec::new();
    let word = |next: &mut dyn FnMut() -> Option<u8>| -> Option<u64> {
        let mut v = 0u64;
        for _ in 0..3 {
            v = v << 8 | u64::from(next()?);
        }
        Some(v)
    };
    loop {
        let Some(op) = next() else { break };
        let before = va.stats();
        let pick = |n: u64| shadow.keys().nth((n as usize) % shadow.len().max(1)).copied();
        match op % 6 {
            0 | 1 => {
                let Some(w) = word(&mut next) else { break };
                let sz = (w & 0xFFFF) * (1 + (w >> 20));
                let align = 1u64 << ((w >> 16) % 24);
                let placement = if op & 0x80 == 0 { VaPlacement::BottomUp } else { VaPlacement::TopDown };
                let r = if op & 0x40 == 0 {
                    va.alloc(sz, align, placement)
                } else {
                    va.alloc_handle(sz, align, placement).map(|h| {
                        handles.push(h);
                        h.addr()
                    })
                };
                match r {
                    Ok(a) => {
                        let r = va.lookup(a).expect("a fresh allocation is found");
                        assert!(r.size >= sz.max(1) && r.size % MIN_ALIGN == 0);
                        assert_eq!(a % align.max(MIN_ALIGN), 0, "alignment");
                        assert!(a >= base && a + r.size <= base + size, "inside the arena");
                        if let Some((&s, &(l, _))) = shadow.range(..=a).next_back() {
                            assert!(s + l <= a, "overlaps [{s:#x}, +{l:#x})");
                        }
                        if let Some((&s, _)) = shadow.range(a..).next() {
                            assert!(a + r.size <= s, "overlaps the next allocation at {s:#x}");
                        }
                        shadow.insert(a, (r.size, false));
                    }
                    Err(_) => unchanged(&va, before, "a refused alloc changed the allocator"),
                }
            }
            2 => {
                let Some(w) = word(&mut next) else { break };
                let addr = base + (w & 0xFFF) * MIN_ALIGN + if w & 0x8000 != 0 { 4 } else { 0 };
                let sz = (w >> 12 & 0xFF) * MIN_ALIGN + 1;
                match va.alloc_fixed(addr, sz) {
                    Ok(a) => {
                        assert_eq!(a, addr);
                        let l = va.lookup(a).expect("found").size;
                        let clash =
                            shadow.range(..a + l).next_back().is_some_and(|(&s, &(sl, _))| s + sl > a);
                        assert!(!clash, "fixed allocation overlaps");
                        shadow.insert(a, (l, false));
                    }
                    Err(_) => unchanged(&va, before, "a refused fixed alloc changed the allocator"),
                }
            }
            3 => {
                let Some(n) = next() else { break };
                if let Some(a) = pick(u64::from(n)) {
                    let (l, retired) = shadow[&a];
                    let r = va.retire(a);
                    if retired {
                        assert!(r.is_err(), "a second retire is refused");
                    } else {
                        assert_eq!(r, Ok(l));
                        shadow.insert(a, (l, true));
                    }
                }
            }
            4 if op & 0x40 != 0 && !handles.is_empty() => {
                // Free by a handle, current or stale: the same as a free of
                // its address.
                let Some(n) = next() else { break };
                let h = handles[usize::from(n) % handles.len()];
                match shadow.remove(&h.addr()) {
                    Some((l, _)) => assert_eq!(va.free_handle(h), Ok(l)),
                    None => {
                        assert!(va.free_handle(h).is_err(), "a stale handle is refused");
                        assert_eq!(va.stats(), before, "a refused free changed the allocator");
                    }
                }
                assert!(va.free_handle(h).is_err(), "a double free is refused");
            }
            4 => {
                let Some(n) = next() else { break };
                if let Some(a) = pick(u64::from(n)) {
                    let (l, _) = shadow.remove(&a).expect("picked");
                    if l > MIN_ALIGN {
                        // An interior granule of the allocation is not one.
                        let inner = a + MIN_ALIGN * (1 + u64::from(n) % (l / MIN_ALIGN - 1));
                        assert!(va.free(inner).is_err() && va.lookup(inner).is_none(), "interior address");
                        assert_eq!(va.stats(), before, "a refused free changed the allocator");
                    }
                    assert_eq!(va.free(a), Ok(l));
                    assert!(va.free(a).is_err(), "a double free is refused");
                }
            }
            _ => {
                // A made-up address: refused unless it is an allocation.
                let Some(w) = word(&mut next) else { break };
                let a = base.wrapping_add(w * 4);
                if !shadow.contains_key(&a) {
                    assert!(va.free(a).is_err() && va.retire(a).is_err() && va.lookup(a).is_none());
                    assert_eq!(va.stats(), before, "a refused free changed the allocator");
                }
            }
        }
        va.validate().expect("allocator invariants");
        let s = va.stats();
        assert_eq!(s.used, shadow.values().map(|v| v.0).sum::<u64>(), "used bytes");
        assert_eq!(s.allocations as usize, shadow.len(), "allocation count");
    }
    for (a, (l, _)) in std::mem::take(&mut shadow) {
        assert_eq!(va.free(a), Ok(l));
    }
    va.flush_recycled();
    let s = va.stats();
    assert_eq!((s.used, s.free, s.holes, s.allocations), (0, size, 1, 0), "all memory back");
    va.validate().expect("allocator invariants");
}
