//! Garbage in, no crash out: random and semi-structured command streams on
//! both generations, MMU off and on. The model must never panic; each
//! engine either completes, halts with a well-formed fault (and its IRQ
//! bit), or hangs (WAIT_MEM / CHAIN loop / huge operation) and is then
//! recovered by a reset.

mod common;

use std::time::{Duration, Instant};

use common::*;
use proptest::prelude::*;
use refgpu_model::faultinject::SplitMix64;
use refgpu_model::packet::{self, Context, Generation};
use refgpu_model::regs;
use refgpu_model::ModelConfig;

const FUZZ_MEM: u64 = 8 << 20;

fn fuzz_rig(gen: Generation) -> Rig {
    Rig::with_config(ModelConfig { mem_size: FUZZ_MEM, ..config(gen) })
}

/// IB areas: 8 IBs of exactly [`IB_DW`] dwords each.
const IB_DW: u32 = 64;

/// Memory no generated packet writes (operands start at +4 MiB).
const ZERO_AREA: u64 = MEM_BASE + 0x1E_0000;

fn ib_addr(k: u64) -> u64 {
    MEM_BASE + 0x20_0000 + 0x4_0000 * k
}

/// A semi-structured stream: mostly valid packets with random operands
/// (addresses in memory, small sizes). About one decision in `chaos` goes
/// wild: raw garbage, a flipped bit, an address anywhere in (or past) the
/// window, a misaligned fence, a random IB size. `base` is the GPU address
/// of the first dword (for the gen2 32-byte padding); `in_ib` selects
/// CHAIN instead of INDIRECT_BUFFER. At most `max_dw` dwords.
fn structured(
    gen: Generation,
    rng: &mut SplitMix64,
    max_dw: usize,
    base: u64,
    in_ib: bool,
    chaos: u64,
) -> Vec<u32> {
    let enc = Enc(gen);
    let mut st = Stream::new(enc, base);
    let wild = |rng: &mut SplitMix64| rng.next_u64() % chaos == 0;
    let data = |rng: &mut SplitMix64, align: u64| -> u64 {
        let span = if wild(rng) { FUZZ_MEM } else { 0x10_0000 };
        (MEM_BASE + 0x20_0000 + 0x20_0000 + rng.next_u64() % span) & !(align - 1)
    };
    loop {
        let start_len = st.dw.len();
        let r = rng.next_u64();
        let small = |rng: &mut SplitMix64| 1 + (rng.next_u64() % 0x3000) as u32;
        let kind = if wild(rng) { 10 } else { (r >> 8) % 10 };
        let ib_size = |rng: &mut SplitMix64| if wild(rng) { 1 + (rng.next_u64() % 80) as u32 } else { IB_DW };
        let p = match kind {
            0 => enc.nop((r >> 16) as u32 % 4),
            1 => {
                let n = 1 + (r >> 16) as usize % 8;
                let d: Vec<u32> = (0..n).map(|_| rng.next_u64() as u32).collect();
                enc.write_data(data(rng, 4), &d)
            }
            2 => enc.dma_copy(data(rng, 1), data(rng, 1), small(rng)),
            3 => enc.fill(data(rng, 4), small(rng) & !3 | 4, rng.next_u64() as u32),
            4 => {
                let align = if wild(rng) { 4 } else { 64 };
                enc.fence(data(rng, align), rng.next_u64(), r % 2 == 0)
            }
            5 => {
                let wide = r % 2 == 0;
                let mask = if wide { u64::MAX } else { 0xFFFF_FFFF };
                if wild(rng) {
                    // Anything: may block forever.
                    enc.wait_mem(data(rng, 8), (r >> 20) % 3, mask, ((r >> 24) % 7) as u8, wide)
                } else {
                    // On memory nothing writes (0): EQ/GE/LE/SEQ_GE 0 hold.
                    let op = [0u8, 2, 4, 6][(r >> 24) as usize % 4];
                    enc.wait_mem(ZERO_AREA + 8 * ((r >> 28) % 64), 0, mask, op, wide)
                }
            }
            6 => enc.timestamp(data(rng, 8)),
            7 if !in_ib => {
                let k = rng.next_u64() % 8;
                enc.ib(ib_addr(k), ib_size(rng))
            }
            7 => {
                let k = rng.next_u64() % 8;
                enc.chain(ib_addr(k), ib_size(rng))
            }
            8 => enc.barrier(r % 2 == 0, r % 3 == 0),
            9 => enc.dispatch(
                ((r >> 16) % 3) as u8,
                data(rng, 4),
                data(rng, 4),
                data(rng, 4),
                small(rng) / 4 + 1,
                rng.next_u64() as u32,
            ),
            _ => (0..1 + (r >> 16) % 4).map(|_| rng.next_u64() as u32).collect(),
        };
        let mut p = p;
        if wild(rng) {
            let i = (r >> 40) as usize % p.len();
            p[i] ^= 1 << ((r >> 48) % 32);
        }
        if matches!(kind, 2 | 3 | 9) {
            st.push_dma(p);
        } else {
            st.push(p);
        }
        if st.dw.len() > max_dw {
            st.dw.truncate(start_len);
            break;
        }
    }
    st.dw
}

enum Outcome {
    Completed,
    Halted,
    Hung,
}

/// Runs `stream` on engine `e` and classifies the result; hangs are reset.
fn run_case(r: &mut Rig, e: usize, stream: &[u32]) -> Outcome {
    r.submit(e, stream);
    let start = Instant::now();
    let mut last = (u32::MAX, u64::MAX);
    let mut still_since = Instant::now();
    let mut last_rptr = u32::MAX;
    let mut rptr_since = Instant::now();
    let outcome = loop {
        let s = r.snap(e);
        if s.halted() {
            let f = s.fault.expect("HALTED without a valid FAULT_STATUS");
            assert!(
                s.fault_status & 0xC0 == 0 && (s.fault_status >> 16) & 0x7FFF == 0,
                "{:#x}",
                s.fault_status
            );
            assert_eq!(f.opcode as u32, (s.fault_status >> 8) & 0xFF);
            // The engine sets the IRQ bit just after publishing HALTED.
            r.wait_for("fault IRQ_STATUS bit of a halted engine", || {
                r.m.read_reg(regs::IRQ_STATUS) & regs::irq_fault_bit(e) != 0
            });
            if std::env::var_os("FUZZ_VERBOSE").is_some() {
                let mut d = [0u32; 10];
                let _ = r.m.read_dwords(f.addr & !3, &mut d);
                eprintln!("e{e} halt at rptr {:#x}/{:#x}: {f} {d:08x?}", s.rptr, r.wptr[e]);
            }
            break Outcome::Halted;
        }
        if s.rptr == r.wptr[e] && !s.busy() {
            break Outcome::Completed;
        }
        if s.rptr != last_rptr {
            last_rptr = s.rptr;
            rptr_since = Instant::now();
        }
        if (s.rptr, s.cur_addr) != last {
            last = (s.rptr, s.cur_addr);
            still_since = Instant::now();
        }
        // Hung: blocked in WAIT_MEM, or RPTR stuck (a CHAIN loop), or the
        // overall budget is spent. Short streams finish in milliseconds.
        if (s.waiting() && still_since.elapsed() > Duration::from_millis(20))
            || rptr_since.elapsed() > Duration::from_millis(150)
            || start.elapsed() > Duration::from_secs(2)
        {
            break Outcome::Hung;
        }
        std::thread::sleep(Duration::from_micros(200));
    };
    // Recover every engine state with a reset, and check it is clean.
    r.reset(e);
    let s = r.snap(e);
    assert_eq!((s.status, s.rptr, s.fault_status, s.ib_size), (0, 0, 0, 0));
    assert!(r.m.engines_alive(), "an engine thread died");
    outcome
}

fn check_followup_works(r: &mut Rig, e: usize) {
    let s = r.enc.fence(MEM_BASE + 0x1F_FFC0, 0xF00D, false);
    r.m.write_u64(MEM_BASE + 0x1F_FFC0, 0).unwrap();
    r.submit(e, &s);
    r.wait_idle(e);
    assert_eq!(r.m.read_u64(MEM_BASE + 0x1F_FFC0).unwrap(), 0xF00D);
}

/// Optionally turn the MMU on: identity-map the rings and a random subset
/// of the data area with random permissions (and a few bad PTEs).
fn maybe_mmu(r: &Rig, rng: &mut SplitMix64) {
    if rng.next_u64() % 3 != 0 {
        return;
    }
    let mut pt = PageTables::new(&r.m, PT_POOL, PT_POOL_SIZE);
    pt.map_range_4k(&r.m, RING_AREA, RING_AREA, 3 * RING_STRIDE, RW);
    pt.map_range_4k(&r.m, MEM_BASE + 0x1F_F000, MEM_BASE + 0x1F_F000, 0x1000, RW);
    for i in 0..64u64 {
        let va = MEM_BASE + 0x20_0000 + 0x1000 * (rng.next_u64() % 1536);
        let x = rng.next_u64();
        let pte = match x % 6 {
            0 => (va & !0xFFF) | 0x1C0 | PTE_V | PTE_T, // reserved bits
            1 => 0x10_0000 | PTE_V | PTE_T | RW,        // outside memory
            _ => (va & !0xFFF) | PTE_V | PTE_T | ((x >> 8) & RW),
        };
        pt.set_raw(&r.m, va, 3, pte);
        let _ = i;
    }
    pt.enable(&r.m);
}

fn fill_ibs(r: &Rig, gen: Generation, rng: &mut SplitMix64) {
    for k in 0..8u64 {
        let at = ib_addr(k);
        let mut s = structured(gen, rng, IB_DW as usize - 1, at, true, 200);
        // Pad to exactly IB_DW dwords with one NOP.
        let pad = IB_DW as usize - s.len();
        s.extend(Enc(gen).nop(pad as u32 - 1));
        r.m.write_dwords(at, &s).unwrap();
    }
}

fn fuzz_one(gen: Generation, seed: u64, structured_stream: bool, raw: &[u32]) {
    let mut rng = SplitMix64::new(seed);
    let mut r = fuzz_rig(gen);
    maybe_mmu(&r, &mut rng);
    // Fill some IB-able memory with more structured garbage so IBs and
    // CHAINs land on packets.
    fill_ibs(&r, gen, &mut rng);
    let e = (seed % 3) as usize;
    let chaos = 2 + rng.next_u64() % 100;
    let stream = if structured_stream {
        structured(gen, &mut rng, 1000, r.ring_va[e], false, chaos)
    } else {
        raw.to_vec()
    };
    if stream.is_empty() {
        return;
    }
    match run_case(&mut r, e, &stream) {
        Outcome::Completed | Outcome::Halted | Outcome::Hung => {}
    }
    check_followup_works(&mut r, e);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_dwords_never_crash(gen2 in any::<bool>(), seed in any::<u64>(), raw in prop::collection::vec(any::<u32>(), 1..600)) {
        let gen = if gen2 { Generation::Gen2 } else { Generation::Gen1 };
        fuzz_one(gen, seed, false, &raw);
    }

    #[test]
    fn structured_garbage_never_crashes(gen2 in any::<bool>(), seed in any::<u64>()) {
        let gen = if gen2 { Generation::Gen2 } else { Generation::Gen1 };
        fuzz_one(gen, seed, true, &[]);
    }

    /// The pure decoder on arbitrary words: never panics, and whatever it
    /// accepts re-checks consistently.
    #[test]
    fn decoder_never_panics(gen2 in any::<bool>(), h in any::<u32>(), payload in prop::collection::vec(any::<u32>(), 0..16), engine in 0usize..3, in_ib in any::<bool>(), addr in any::<u64>()) {
        let gen = if gen2 { Generation::Gen2 } else { Generation::Gen1 };
        if let Ok(hd) = packet::decode_header(gen, h) {
            let mut p = payload.clone();
            p.resize(hd.ndw as usize, 0);
            let ctx = Context { engine, in_ib, addr: addr & !3 };
            let _ = packet::decode_payload(gen, ctx, hd, &p);
            // A wrong payload length is rejected, not a panic.
            let _ = packet::decode_payload(gen, ctx, hd, &payload);
        }
    }
}

#[test]
fn fixed_seeds_reach_every_outcome_class() {
    // Deterministic seeds; make sure the fuzzer's classification is
    // exercised on each outcome at least once.
    let mut seen = [0u32; 3];
    for gen in gens() {
        for seed in 0..40u64 {
            let mut rng = SplitMix64::new(seed);
            let mut r = fuzz_rig(gen);
            fill_ibs(&r, gen, &mut rng);
            // Mostly COMPUTE, which runs every packet including DISPATCH.
            let e = if seed % 4 == 0 { (seed / 4 % 3) as usize } else { COMPUTE };
            let s = structured(gen, &mut rng, 1000, r.ring_va[e], false, 200);
            match run_case(&mut r, e, &s) {
                Outcome::Completed => seen[0] += 1,
                Outcome::Halted => seen[1] += 1,
                Outcome::Hung => seen[2] += 1,
            }
        }
    }
    eprintln!("completed / halted / hung: {seen:?}");
    assert!(seen[1] > 0, "no halted case");
}
