//! The reference GPU model (`refgpu-model`, in-process, as `refgpu-sim`
//! runs it) on arbitrary rings and IBs of either generation: the fuzzer's
//! bytes are the memory image (three rings and whatever IBs, page tables
//! and data follow them), the ring sizes and write pointers, the MMU
//! setting, and a short script of doorbells, resets, enable toggles,
//! memory pokes and IRQ_STATUS clears.
//!
//! Invariants:
//!
//! - the host process survives (no panic in any model thread: libFuzzer's
//!   panic hook aborts; every engine thread is still alive at the end);
//! - every engine settles within a step budget into a state the spec
//!   allows (`docs/refgpu.md` 4.4, 4.5): idle, halted with a valid latched
//!   fault and its IRQ_STATUS bit, or still working on a hang the spec
//!   allows (WAIT_MEM, a CHAIN loop, a long transfer); an engine that is not
//!   halted has no latched fault, and RPTR stays inside its ring;
//! - differential against `umd-core`'s decoder: with one engine running
//!   (no other writer of its ring), a valid RING_SIZE and WPTR, the MMU off
//!   and no host script, a first ring packet the decoder refuses (reserved
//!   opcode, bad tag or length, reserved bits or operations, crossing WPTR)
//!   halts the engine with INVALID_PACKET at RING_BASE, and a first packet
//!   the decoder accepts without a rule violation is never reported as an
//!   INVALID_PACKET there;
//! - whatever ran, a reset of every engine (which must complete: an engine
//!   that never notices its reset request hangs the input into libFuzzer's
//!   timeout) leaves the registers as section 4.5 says, and a valid FENCE
//!   job then runs on every engine.
#![no_main]

use libfuzzer_sys::fuzz_target;
use refgpu_model::regs::{self, eng, NUM_ENGINES};
use refgpu_model::{FaultKind, Generation, Model, ModelConfig};
use umd_core::decode::Decoder;

/// Physical address of system memory.
const BASE: u64 = 0x4000_0000;
/// System memory: the fuzzer's image at BASE, the probe rings and fences
/// at [`PROBE`].
const MEM: u64 = 256 << 10;
/// Engine `e`'s ring is at `BASE + e * RING_STRIDE` (inside the image).
const RING_STRIDE: u64 = 0x400;
/// Largest image copied into memory.
const IMAGE_MAX: usize = 0x3_0000;
/// Probe rings (0x100 each) and fence slots (64 bytes each).
const PROBE: u64 = BASE + 0x3_0000;
const PROBE_FENCES: u64 = BASE + 0x3_8000;
/// Polls of 20 µs while waiting for the engines to settle.
const SETTLE_STEPS: u32 = 500;
/// Polls while waiting for a probe fence: generous (a loaded machine), and
/// left as soon as the fence lands.
const PROBE_STEPS: u32 = 250_000;
/// Header bytes before the script.
const HEADER: usize = 9;

fn ereg(m: &Model, e: usize, off: u32) -> u32 {
    m.read_reg(regs::engine_base(e) + off)
}

fn wreg(m: &Model, e: usize, off: u32, v: u32) {
    m.write_reg(regs::engine_base(e) + off, v);
}

fn pause() {
    std::thread::sleep(std::time::Duration::from_micros(20));
}

/// Whether engine `e` has nothing more to do that the spec bounds.
fn settled(m: &Model, e: usize) -> bool {
    let s = m.engine_snapshot(e).expect("engine index");
    let enabled = s.ctrl & regs::CTRL_ENABLE != 0;
    s.halted() || s.waiting() || !enabled || (s.rptr == s.wptr && !s.busy())
}

/// Polls until `cond` holds; false if it still does not after
/// [`PROBE_STEPS`] polls (seconds: only a model that never gets there, or
/// a machine that starves it for that long, runs out).
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..PROBE_STEPS {
        if cond() {
            return true;
        }
        pause();
    }
    cond()
}

/// Polls until every engine settles or the budget runs out (a hang the
/// spec allows: a CHAIN loop, a long transfer).
fn settle(m: &Model) {
    for _ in 0..SETTLE_STEPS {
        if (0..NUM_ENGINES).all(|e| settled(m, e)) {
            return;
        }
        pause();
    }
}

/// Ring size from a header byte: a power of two most of the time, any
/// multiple of 4 or an odd value sometimes (a bad RING_SIZE must fault,
/// not crash).
fn ring_size(code: u8) -> u32 {
    match code % 8 {
        0..=2 => 0x100 << (code % 8),
        3 => 0x400,
        4 => u32::from(code) * 4,
        5 => u32::from(code) * 3 + 1,
        6 => 0,
        _ => 0x1_0000,
    }
}

fn fence_packet(gen: Generation, pa: u64, value: u64) -> [u32; 5] {
    let header = match gen {
        Generation::Gen1 => (0x04 << 24) | 4,
        Generation::Gen2 => (0x7 << 28) | (4 << 16) | 0x30,
    };
    [header, pa as u32, (pa >> 32) as u32, value as u32, (value >> 32) as u32]
}

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER {
        return;
    }
    let (head, rest) = data.split_at(HEADER);
    let flags = head[0];
    let gen = if flags & 1 == 0 { Generation::Gen1 } else { Generation::Gen2 };
    let mmu = flags & 2 != 0;
    // Solo: only this engine is enabled and rung, so nothing but its own
    // packets touches memory (the decoder comparison needs that).
    let solo = (flags & 8 != 0).then_some(usize::from(flags >> 4) % NUM_ENGINES);
    let nops = usize::from(head[8] % 17);
    let (script, image) = rest.split_at((2 * nops).min(rest.len()));
    let image = &image[..image.len().min(IMAGE_MAX)];

    let cfg = ModelConfig {
        generation: gen,
        mem_base: BASE,
        mem_size: MEM,
        local_size: Some(if gen == Generation::Gen2 { 64 << 10 } else { 0 }),
        sys_ns_per_kib: 0,
        local_ns_per_kib: 0,
        wait_poll_interval: std::time::Duration::from_micros(20),
        ..ModelConfig::default()
    };
    let m = Model::new(cfg).expect("model config");
    m.write_mem(BASE, image).expect("image inside memory");
    if mmu {
        let root = BASE + u64::from(head[1] % 48) * 0x1000;
        m.write_reg(regs::MMU_ROOT_LO, root as u32);
        m.write_reg(regs::MMU_ROOT_HI, (root >> 32) as u32);
        m.write_reg(regs::MMU_CTRL, regs::MMU_ENABLE);
    }
    m.write_reg(regs::IRQ_MASK, if flags & 4 != 0 { !0 } else { 0 });
    let mut rings = [(0u64, 0u32, 0u32); NUM_ENGINES];
    for (e, ring) in rings.iter_mut().enumerate() {
        let base = BASE + e as u64 * RING_STRIDE;
        let size = ring_size(head[2 + e]);
        let wptr = u32::from(head[5 + e]) * 4;
        *ring = (base, size, wptr);
        wreg(&m, e, eng::RING_BASE_LO, base as u32);
        wreg(&m, e, eng::RING_BASE_HI, (base >> 32) as u32);
        wreg(&m, e, eng::RING_SIZE, size);
        wreg(&m, e, eng::RING_WPTR, wptr);
        if solo.is_none_or(|s| s == e) {
            wreg(&m, e, eng::CTRL, regs::CTRL_ENABLE);
            wreg(&m, e, eng::DOORBELL, 1);
        }
    }

    for op in script.chunks(2) {
        let (kind, arg) = (op[0], op.get(1).copied().unwrap_or(0));
        let e = usize::from(arg) % NUM_ENGINES;
        match kind % 8 {
            0 => wreg(&m, e, eng::DOORBELL, 1),
            1 => {
                wreg(&m, e, eng::RING_WPTR, u32::from(arg / 3) * 4);
                wreg(&m, e, eng::DOORBELL, 1);
            }
            2 => wreg(&m, e, eng::CTRL, regs::CTRL_ENABLE | regs::CTRL_RESET),
            3 => {
                let on = ereg(&m, e, eng::CTRL) & regs::CTRL_ENABLE == 0;
                wreg(&m, e, eng::CTRL, if on { regs::CTRL_ENABLE } else { 0 });
            }
            4 => settle(&m),
            5 => m.write_reg(regs::IRQ_STATUS, !0),
            6 => m.write_reg(regs::MMU_INVALIDATE, 1),
            _ => {
                // A host write that a WAIT_MEM may be waiting for.
                let pa = BASE + u64::from(arg) * 8;
                let _ = m.write_u64(pa, u64::from(kind >> 3));
            }
        }
    }
    settle(&m);

    assert!(m.engines_alive(), "an engine thread died on guest input");
    for (e, &(base, size, wptr)) in rings.iter().enumerate() {
        let s = m.engine_snapshot(e).expect("engine index");
        assert_eq!(s.rptr % 4, 0, "engine {e}: RPTR {:#x} not a dword offset", s.rptr);
        if s.halted() {
            assert!(s.fault.is_some(), "engine {e} halted without a valid fault: {s:x?}");
            assert!(!s.waiting(), "engine {e}: halted and waiting");
            if nops == 0 {
                // The engine raises the IRQ_STATUS bit right after HALTED.
                let bit = regs::irq_fault_bit(e);
                assert!(
                    eventually(|| m.read_reg(regs::IRQ_STATUS) & bit != 0),
                    "engine {e}: fault without its IRQ_STATUS bit"
                );
            }
        } else if s.fault.is_some() {
            // The engine publishes the fault before HALTED: one caught in
            // between (its budget ran out) must show HALTED shortly.
            assert!(
                eventually(|| m.engine_snapshot(e).is_some_and(|s| s.halted())),
                "engine {e}: a latched fault without HALTED: {s:x?}"
            );
        }
        if size != 0 && s.rptr != 0 {
            assert!(s.rptr < size, "engine {e}: RPTR {:#x} outside a ring of {size:#x}", s.rptr);
        }

        // Differential check of the first ring packet against umd-core's
        // decoder (the only engine running, no host writes, MMU off, a WPTR
        // that describes packets).
        let valid_ring = size.is_power_of_two() && wptr % 4 == 0 && wptr > 0 && wptr < size;
        let in_image = (e as u64 * RING_STRIDE + u64::from(wptr)) as usize <= image.len();
        if solo == Some(e) && nops == 0 && !mmu && valid_ring && in_image {
            let off = e * RING_STRIDE as usize;
            let bytes = &image[off..off + wptr as usize];
            let dgen = match gen {
                Generation::Gen1 => umd_core::hw::Generation::Gen1,
                Generation::Gen2 => umd_core::hw::Generation::Gen2,
            };
            let first = Decoder::new(dgen, bytes, base).next().expect("a non-empty ring has an item");
            let ring_invalid = |s: &refgpu_model::EngineSnapshot| {
                s.fault.is_some_and(|f| f.kind == FaultKind::InvalidPacket && f.addr == base && s.rptr == 0)
            };
            if let Err(err) = &first.result {
                // The engine must get to it and halt, whatever the load.
                assert!(
                    eventually(|| m.engine_snapshot(e).is_some_and(|s| s.halted())),
                    "engine {e} ({gen:?}): the decoder refuses the first ring packet ({err}) but the model \
                     never halts: {:x?}",
                    m.engine_snapshot(e)
                );
            }
            let s = m.engine_snapshot(e).expect("engine index");
            match first.result {
                Err(err) => assert!(
                    ring_invalid(&s),
                    "engine {e} ({gen:?}): the decoder refuses the first ring packet ({err}) but the model \
                     reports {s:x?}"
                ),
                Ok(p) if p.violation.is_none() => assert!(
                    !ring_invalid(&s),
                    "engine {e} ({gen:?}): the decoder accepts the first ring packet ({:?}) but the model \
                     reports INVALID_PACKET there: {s:x?}",
                    p.command
                ),
                Ok(_) => {}
            }
        }
    }

    // Reset every engine: the reset must complete and clear what 4.5 says.
    for (e, &(base, size, _)) in rings.iter().enumerate() {
        wreg(&m, e, eng::CTRL, regs::CTRL_ENABLE | regs::CTRL_RESET);
        let s = m.engine_snapshot(e).expect("engine index");
        assert_eq!(s.ctrl, regs::CTRL_ENABLE, "engine {e}: CTRL after reset");
        assert_eq!(
            (s.rptr, s.wptr, s.status, s.fault_status),
            (0, 0, 0, 0),
            "engine {e} after reset: {s:x?}"
        );
        assert_eq!((s.cur_addr, s.ib_base, s.ib_size), (0, 0, 0), "engine {e} after reset: {s:x?}");
        assert_eq!(
            m.read_reg(regs::IRQ_STATUS) & regs::irq_engine_bits(e),
            0,
            "engine {e}: IRQ bits after reset"
        );
        let kept =
            u64::from(ereg(&m, e, eng::RING_BASE_LO)) | u64::from(ereg(&m, e, eng::RING_BASE_HI)) << 32;
        assert_eq!((kept, ereg(&m, e, eng::RING_SIZE)), (base, size), "engine {e}: ring kept by reset");
    }

    // The device is consistent: a valid FENCE job runs on every engine.
    m.write_reg(regs::MMU_CTRL, 0);
    for e in 0..NUM_ENGINES {
        m.write_reg(regs::engine_root_lo(e), 0);
        m.write_reg(regs::engine_root_hi(e), 0);
    }
    for e in 0..NUM_ENGINES {
        let ring = PROBE + e as u64 * 0x100;
        let slot = PROBE_FENCES + e as u64 * 64;
        let value = 0x5EED_0000_0000_0000 | (e as u64 + 1);
        m.write_u64(slot, 0).expect("fence slot");
        m.write_dwords(ring, &fence_packet(gen, slot, value)).expect("probe ring");
        wreg(&m, e, eng::RING_BASE_LO, ring as u32);
        wreg(&m, e, eng::RING_BASE_HI, (ring >> 32) as u32);
        wreg(&m, e, eng::RING_SIZE, 0x100);
        wreg(&m, e, eng::RING_WPTR, 20);
        wreg(&m, e, eng::DOORBELL, 1);
    }
    for e in 0..NUM_ENGINES {
        let slot = PROBE_FENCES + e as u64 * 64;
        let value = 0x5EED_0000_0000_0000 | (e as u64 + 1);
        let mut steps = 0;
        while m.read_u64(slot).expect("fence slot") != value {
            steps += 1;
            assert!(steps < PROBE_STEPS, "engine {e}: probe FENCE never landed: {:x?}", m.engine_snapshot(e));
            pause();
        }
        while ereg(&m, e, eng::RING_RPTR) != 20 {
            steps += 1;
            assert!(
                steps < PROBE_STEPS,
                "engine {e}: RPTR never passed the probe: {:x?}",
                m.engine_snapshot(e)
            );
            pause();
        }
        let s = m.engine_snapshot(e).expect("engine index");
        assert!(!s.halted() && s.fault.is_none(), "engine {e}: the probe faulted: {s:x?}");
    }
    m.shutdown();
});
