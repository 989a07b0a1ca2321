//! Shared test helpers: a hand-written packet writer taken straight from
//! the tables of `docs/refgpu.md` (deliberately not `umd-core`'s encoder),
//! a page-table builder and a ring driver.
#![allow(dead_code)]

use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use refgpu_model::regs::{self, eng};
use refgpu_model::{ChannelSink, EngineSnapshot, Fault, FaultKind, Generation, Model, ModelConfig};

/// Failure guard for every wait (never a performance assertion).
pub const GUARD: Duration = Duration::from_secs(10);

pub const MEM_BASE: u64 = 0x4000_0000;
pub const MEM_SIZE: u64 = 64 << 20;
/// Page-table pool (physical).
pub const PT_POOL: u64 = MEM_BASE;
pub const PT_POOL_SIZE: u64 = 1 << 20;
/// Rings: engine e at RING_AREA + e * RING_STRIDE.
pub const RING_AREA: u64 = MEM_BASE + 0x10_0000;
pub const RING_STRIDE: u64 = 0x1_0000;
/// Scratch data area.
pub const DATA: u64 = MEM_BASE + 0x20_0000;

pub const GFX: usize = 0;
pub const COMPUTE: usize = 1;
pub const COPY: usize = 2;

// ---------------------------------------------------------------------
// Packet writer (spec sections 5 and 6)
// ---------------------------------------------------------------------

/// Writes packets of one generation as dwords.
#[derive(Clone, Copy, Debug)]
pub struct Enc(pub Generation);

fn lo(a: u64) -> u32 {
    a as u32
}
fn hi(a: u64) -> u32 {
    (a >> 32) as u32
}

impl Enc {
    pub fn gen(&self) -> Generation {
        self.0
    }

    /// Header from spec 5.1.
    pub fn header(&self, opcode: u8, flags: u8, ndw: u32) -> u32 {
        match self.0 {
            Generation::Gen1 => (u32::from(opcode) << 24) | (u32::from(flags) << 16) | (ndw & 0xFFFF),
            Generation::Gen2 => {
                (0x7 << 28) | ((ndw & 0xFFF) << 16) | (u32::from(flags) << 8) | u32::from(opcode)
            }
        }
    }

    /// Opcodes from spec 5.3.
    pub fn op(&self, name: &str) -> u8 {
        let (g1, g2) = match name {
            "NOP" => (0x00, 0x00),
            "WRITE_DATA" => (0x01, 0x10),
            "DMA_COPY" => (0x02, 0x20),
            "FILL" => (0x03, 0x21),
            "FENCE" => (0x04, 0x30),
            "WAIT_MEM" => (0x05, 0x31),
            "TIMESTAMP" => (0x06, 0x32),
            "INDIRECT_BUFFER" => (0x07, 0x40),
            "CHAIN" => (0x08, 0x41),
            "BARRIER" => (0x09, 0x50),
            "DISPATCH" => (0x0A, 0x60),
            _ => panic!("unknown packet {name}"),
        };
        match self.0 {
            Generation::Gen1 => g1,
            Generation::Gen2 => g2,
        }
    }

    pub fn nop(&self, ndw: u32) -> Vec<u32> {
        let mut v = vec![self.header(self.op("NOP"), 0, ndw)];
        v.extend(std::iter::repeat_n(0, ndw as usize));
        v
    }

    pub fn write_data(&self, dst: u64, data: &[u32]) -> Vec<u32> {
        let mut v = vec![self.header(self.op("WRITE_DATA"), 0, 2 + data.len() as u32), lo(dst), hi(dst)];
        v.extend_from_slice(data);
        v
    }

    pub fn dma_copy(&self, src: u64, dst: u64, size: u32) -> Vec<u32> {
        let h = self.header(self.op("DMA_COPY"), 0, 5);
        match self.0 {
            Generation::Gen1 => vec![h, lo(src), hi(src), lo(dst), hi(dst), size],
            Generation::Gen2 => vec![h, size, lo(src), hi(src), lo(dst), hi(dst)],
        }
    }

    pub fn fill(&self, dst: u64, size: u32, value: u32) -> Vec<u32> {
        let h = self.header(self.op("FILL"), 0, 4);
        match self.0 {
            Generation::Gen1 => vec![h, lo(dst), hi(dst), size, value],
            Generation::Gen2 => vec![h, size, lo(dst), hi(dst), value],
        }
    }

    pub fn fence(&self, addr: u64, value: u64, irq: bool) -> Vec<u32> {
        vec![self.header(self.op("FENCE"), irq as u8, 4), lo(addr), hi(addr), lo(value), hi(value)]
    }

    /// `op`: 0 EQ .. 6 SEQ_GE.
    pub fn wait_mem(&self, addr: u64, reference: u64, mask: u64, op: u8, wide: bool) -> Vec<u32> {
        let ctl = op | if wide { 8 } else { 0 };
        match self.0 {
            Generation::Gen1 => vec![
                self.header(self.op("WAIT_MEM"), ctl, 6),
                lo(addr),
                hi(addr),
                lo(reference),
                hi(reference),
                lo(mask),
                hi(mask),
            ],
            Generation::Gen2 => vec![
                self.header(self.op("WAIT_MEM"), 0, 7),
                u32::from(ctl),
                lo(addr),
                hi(addr),
                lo(reference),
                hi(reference),
                lo(mask),
                hi(mask),
            ],
        }
    }

    pub fn timestamp(&self, addr: u64) -> Vec<u32> {
        vec![self.header(self.op("TIMESTAMP"), 0, 2), lo(addr), hi(addr)]
    }

    pub fn ib(&self, addr: u64, size_dw: u32) -> Vec<u32> {
        vec![self.header(self.op("INDIRECT_BUFFER"), 0, 3), lo(addr), hi(addr), size_dw]
    }

    pub fn chain(&self, addr: u64, size_dw: u32) -> Vec<u32> {
        vec![self.header(self.op("CHAIN"), 0, 3), lo(addr), hi(addr), size_dw]
    }

    pub fn barrier(&self, wait_idle: bool, invalidate: bool) -> Vec<u32> {
        let bits = wait_idle as u8 | (invalidate as u8) << 1;
        match self.0 {
            Generation::Gen1 => vec![self.header(self.op("BARRIER"), bits, 0)],
            Generation::Gen2 => vec![self.header(self.op("BARRIER"), 0, 1), u32::from(bits)],
        }
    }

    /// `op`: 0 ADD_U32, 1 MUL_U32, 2 SAXPY_F32.
    pub fn dispatch(&self, op: u8, a: u64, b: u64, dst: u64, count: u32, scalar: u32) -> Vec<u32> {
        match self.0 {
            Generation::Gen1 => vec![
                self.header(self.op("DISPATCH"), op, 8),
                lo(a),
                hi(a),
                lo(b),
                hi(b),
                lo(dst),
                hi(dst),
                count,
                scalar,
            ],
            Generation::Gen2 => vec![
                self.header(self.op("DISPATCH"), 0, 8),
                u32::from(op) | (count << 8),
                lo(a),
                hi(a),
                lo(b),
                hi(b),
                lo(dst),
                hi(dst),
                scalar,
            ],
        }
    }
}

/// Builds a packet stream, padding gen2 DMA_COPY/FILL/DISPATCH to 32 bytes
/// relative to `base`.
pub struct Stream {
    pub enc: Enc,
    pub base: u64,
    pub dw: Vec<u32>,
}

impl Stream {
    pub fn new(enc: Enc, base: u64) -> Self {
        Self { enc, base, dw: Vec::new() }
    }

    pub fn addr(&self) -> u64 {
        self.base + 4 * self.dw.len() as u64
    }

    /// Pads with one NOP so the next packet starts `align`-aligned.
    pub fn align(&mut self, align: u64) -> &mut Self {
        let rem = self.addr() % align;
        if rem != 0 {
            let pad_dw = ((align - rem) / 4) as u32;
            let nop = self.enc.nop(pad_dw - 1);
            self.dw.extend(nop);
        }
        self
    }

    pub fn push(&mut self, p: Vec<u32>) -> &mut Self {
        self.dw.extend(p);
        self
    }

    /// Pushes a DMA-class packet (aligned for gen2).
    pub fn push_dma(&mut self, p: Vec<u32>) -> &mut Self {
        if self.enc.0 == Generation::Gen2 {
            self.align(32);
        }
        self.push(p)
    }
}

// ---------------------------------------------------------------------
// Page tables
// ---------------------------------------------------------------------

pub const PTE_V: u64 = 1;
pub const PTE_T: u64 = 2;
pub const PTE_R: u64 = 4;
pub const PTE_W: u64 = 8;
pub const RW: u64 = PTE_R | PTE_W;

/// Builds four-level tables in the model's memory.
pub struct PageTables {
    pub root: u64,
    next: u64,
    end: u64,
}

impl PageTables {
    pub fn new(m: &Model, pool: u64, size: u64) -> Self {
        let mut pt = Self { root: 0, next: pool, end: pool + size };
        pt.root = pt.alloc(m);
        pt
    }

    fn alloc(&mut self, m: &Model) -> u64 {
        let t = self.next;
        assert!(t + 4096 <= self.end, "page-table pool exhausted");
        self.next += 4096;
        m.write_mem(t, &[0u8; 4096]).unwrap();
        t
    }

    /// Table at `level` (1..=3) covering `va`, creating the path.
    fn table_for(&mut self, m: &Model, va: u64, level: u32) -> u64 {
        let mut table = self.root;
        for l in 0..level {
            let idx = (va >> (39 - 9 * l)) & 0x1FF;
            let pte_addr = table + 8 * idx;
            let pte = m.read_u64(pte_addr).unwrap();
            table = if pte & PTE_V != 0 {
                pte & 0x0000_FFFF_FFFF_F000
            } else {
                let t = self.alloc(m);
                m.write_u64(pte_addr, t | PTE_V | PTE_T).unwrap();
                t
            };
        }
        table
    }

    /// Physical address of the entry for `va` at `level`.
    pub fn entry_addr(&mut self, m: &Model, va: u64, level: u32) -> u64 {
        let t = self.table_for(m, va, level);
        t + 8 * ((va >> (39 - 9 * level)) & 0x1FF)
    }

    pub fn map_4k(&mut self, m: &Model, va: u64, pa: u64, perms: u64) {
        let e = self.entry_addr(m, va, 3);
        m.write_u64(e, pa | PTE_V | PTE_T | perms).unwrap();
    }

    pub fn map_2m(&mut self, m: &Model, va: u64, pa: u64, perms: u64) {
        let e = self.entry_addr(m, va, 2);
        m.write_u64(e, pa | PTE_V | perms).unwrap();
    }

    /// Maps `[va, va+len)` to `[pa, ..)` with 4 KiB pages.
    pub fn map_range_4k(&mut self, m: &Model, va: u64, pa: u64, len: u64, perms: u64) {
        let mut off = 0;
        while off < len {
            self.map_4k(m, va + off, pa + off, perms);
            off += 4096;
        }
    }

    pub fn set_raw(&mut self, m: &Model, va: u64, level: u32, pte: u64) {
        let e = self.entry_addr(m, va, level);
        m.write_u64(e, pte).unwrap();
    }

    /// Writes MMU_ROOT and enables the MMU.
    pub fn enable(&self, m: &Model) {
        m.write_reg(regs::MMU_ROOT_LO, self.root as u32);
        m.write_reg(regs::MMU_ROOT_HI, (self.root >> 32) as u32);
        m.write_reg(regs::MMU_CTRL, regs::MMU_ENABLE);
    }
}

// ---------------------------------------------------------------------
// Model rig
// ---------------------------------------------------------------------

pub struct Rig {
    pub m: Model,
    pub irq: Receiver<u32>,
    pub enc: Enc,
    /// GPU address of each engine's ring.
    pub ring_va: [u64; 3],
    pub ring_size: u32,
    /// Driver-side write offset of each ring.
    pub wptr: [u32; 3],
}

pub fn config(gen: Generation) -> ModelConfig {
    ModelConfig {
        generation: gen,
        revision: 7,
        mem_base: MEM_BASE,
        mem_size: MEM_SIZE,
        ..ModelConfig::default()
    }
}

impl Rig {
    /// A model with MMU off; rings at RING_AREA (GPU address = physical).
    pub fn new(gen: Generation) -> Self {
        Self::with_config(config(gen))
    }

    pub fn with_config(cfg: ModelConfig) -> Self {
        let gen = cfg.generation;
        let (sink, irq) = ChannelSink::new();
        let m = Model::with_irq_sink(cfg, sink as Arc<_>).unwrap();
        let ring_va = [RING_AREA, RING_AREA + RING_STRIDE, RING_AREA + 2 * RING_STRIDE];
        let r = Self { m, irq, enc: Enc(gen), ring_va, ring_size: 4096, wptr: [0; 3] };
        for (e, va) in ring_va.into_iter().enumerate() {
            r.setup_ring(e, va, 4096);
        }
        r.m.write_reg(regs::IRQ_MASK, 0x707);
        r
    }

    pub fn ereg(e: usize, off: u32) -> u32 {
        regs::engine_base(e) + off
    }

    pub fn setup_ring(&self, e: usize, va: u64, size: u32) {
        self.m.write_reg(Self::ereg(e, eng::RING_BASE_LO), va as u32);
        self.m.write_reg(Self::ereg(e, eng::RING_BASE_HI), (va >> 32) as u32);
        self.m.write_reg(Self::ereg(e, eng::RING_SIZE), size);
        self.m.write_reg(Self::ereg(e, eng::CTRL), regs::CTRL_ENABLE);
    }

    /// Physical address of a ring offset (MMU off or identity mapped).
    pub fn ring_pa(&self, e: usize, off: u32) -> u64 {
        self.ring_va[e] + u64::from(off)
    }

    /// Copies packets into ring `e` at the driver's wptr (no wrap handling:
    /// the caller keeps packets inside the ring), publishes and rings.
    pub fn submit(&mut self, e: usize, dw: &[u32]) {
        let off = self.wptr[e];
        self.m.write_dwords(self.ring_pa(e, off), dw).unwrap();
        let new = (off + 4 * dw.len() as u32) % self.ring_size;
        self.publish(e, new);
    }

    pub fn publish(&mut self, e: usize, wptr: u32) {
        self.wptr[e] = wptr;
        self.m.write_reg(Self::ereg(e, eng::RING_WPTR), wptr);
        self.m.write_reg(Self::ereg(e, eng::DOORBELL), 1);
    }

    pub fn snap(&self, e: usize) -> EngineSnapshot {
        self.m.engine_snapshot(e).unwrap()
    }

    /// Waits until `cond` holds (10 s guard).
    pub fn wait_for(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < GUARD, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Waits until engine `e` consumed everything (RPTR == WPTR, not busy)
    /// and asserts it did not halt.
    pub fn wait_idle(&self, e: usize) {
        self.wait_for("engine idle", || {
            let s = self.snap(e);
            assert!(!s.halted(), "engine {e} halted: {:?}", s.fault);
            s.rptr == self.wptr[e] && s.status & regs::STATUS_BUSY == 0
        });
    }

    /// Waits until engine `e` halts and returns its fault.
    ///
    /// A fault sets STATUS.HALTED and IRQ_STATUS bit `8+e` (spec 4.4), but
    /// not atomically: the engine thread publishes HALTED first and sets
    /// the IRQ bit right after, so a test that sees HALTED may still read
    /// the IRQ bit as 0. Wait for both, so that callers can assert on
    /// IRQ_STATUS without racing the engine thread.
    pub fn wait_fault(&self, e: usize) -> Fault {
        self.wait_for("engine fault", || self.snap(e).halted());
        self.wait_for("fault IRQ_STATUS bit of a halted engine", || {
            self.m.read_reg(regs::IRQ_STATUS) & regs::irq_fault_bit(e) != 0
        });
        self.snap(e).fault.expect("halted engine without VALID fault")
    }

    /// Expects a fault with this kind/access/address/opcode and the IRQ bit.
    pub fn expect_fault(
        &self,
        e: usize,
        kind: FaultKind,
        access: refgpu_model::Access,
        addr: u64,
        opcode: u8,
    ) -> Fault {
        let f = self.wait_fault(e);
        assert_eq!(
            (f.kind, f.access, f.addr, f.opcode),
            (kind, access, addr, opcode),
            "unexpected fault {f}"
        );
        assert_ne!(self.m.read_reg(regs::IRQ_STATUS) & regs::irq_fault_bit(e), 0, "fault IRQ bit");
        f
    }

    /// Resets engine `e` via CTRL (keeps ENABLE) and forgets the driver wptr.
    pub fn reset(&mut self, e: usize) {
        self.m.write_reg(Self::ereg(e, eng::CTRL), regs::CTRL_ENABLE | regs::CTRL_RESET);
        assert_eq!(self.m.read_reg(Self::ereg(e, eng::CTRL)), regs::CTRL_ENABLE);
        self.wptr[e] = 0;
    }

    /// Drains interrupt vectors received so far.
    pub fn drain_irqs(&self) -> Vec<u32> {
        self.irq.try_iter().collect()
    }

    /// Waits for the next vector (guarded).
    pub fn next_irq(&self) -> u32 {
        self.irq.recv_timeout(GUARD).expect("no interrupt")
    }

    pub fn read_u32s(&self, pa: u64, n: usize) -> Vec<u32> {
        let mut v = vec![0; n];
        self.m.read_dwords(pa, &mut v).unwrap();
        v
    }
}

pub fn gens() -> [Generation; 2] {
    [Generation::Gen1, Generation::Gen2]
}

pub fn inv() -> FaultKind {
    FaultKind::InvalidPacket
}
