//! Functional model ("C-model") of the reference GPU, refgpu, exactly as
//! specified in `docs/refgpu.md`.
//!
//! # Structure
//!
//! One module per concept:
//!
//! | module | what |
//! | --- | --- |
//! | [`regs`] | register offsets and bits; the register page as 1024 atomics, owned or over a shared mapping |
//! | [`mem`] | [`SysMem`]: the physical memory window, owned or a raw shared mapping, accessed only with atomics |
//! | [`mmu`] | the four-level page walk, permission checks and a per-engine TLB |
//! | [`packet`] | header and payload decoding of both generations into a validated [`Packet`] |
//! | `engine` | one thread per engine: ring and IB fetch, RPTR/STATUS/CUR_ADDR publishing, faults, reset |
//! | `exec` | the memory side of every packet (WRITE_DATA … DISPATCH, WAIT_MEM sleeping) |
//! | [`dispatch`] | DISPATCH element arithmetic |
//! | [`faultinject`] | latency, dropped fences, stalled engines, delayed interrupts |
//! | `shm` | `shm::Mapping` (feature `shm`): the shared mappings of the ivshmem binding, for the server and the host side |
//! | [`shared_ram`] | the shared-RAM binding's layout and doorbell-watch schedule |
//! | [`irq`] | IRQ_STATUS edges, vector delivery thread, [`IrqSink`] |
//! | [`wake`] | lost-wake-up-free sleeping with bounded re-check intervals |
//! | `model` | [`Model`]: construction, register semantics of both transports, memory helpers, shutdown |
//!
//! # Example
//!
//! ```
//! use refgpu_model::{Model, ModelConfig, regs};
//!
//! let m = Model::new(ModelConfig::default()).unwrap();
//! let id = m.read_reg(regs::ID);
//! assert_eq!(id >> 16, 0x5247);
//! // Ring of engine 2 at 0x4000_0000 (MMU off), one gen1 WRITE_DATA.
//! let ring = 0x4000_0000u64;
//! m.write_dwords(ring, &[0x0100_0003, 0x4000_1000, 0, 0xCAFE_F00D]).unwrap();
//! let e = regs::engine_base(2);
//! m.write_reg(e + regs::eng::RING_BASE_LO, ring as u32);
//! m.write_reg(e + regs::eng::RING_SIZE, 4096);
//! m.write_reg(e + regs::eng::CTRL, regs::CTRL_ENABLE);
//! m.write_reg(e + regs::eng::RING_WPTR, 16);
//! m.write_reg(e + regs::eng::DOORBELL, 1);
//! while m.read_reg(e + regs::eng::RING_RPTR) != 16 {
//!     std::thread::yield_now();
//! }
//! assert_eq!(m.read_u32(0x4000_1000).unwrap(), 0xCAFE_F00D);
//! ```
//!
//! The model never panics on guest input: every bad command stream ends in
//! a latched fault (or a hang the driver must reset), never in a crash.

#[cfg(feature = "shm")]
mod bell;
pub mod clock;
mod control;
pub mod dispatch;
mod engine;
mod error;
mod exec;
pub mod faultinject;
pub mod irq;
pub mod ivshmem_info;
pub mod mem;
pub mod mmu;
mod model;
pub mod packet;
pub mod regs;
pub mod shared_ram;
#[cfg(feature = "shm")]
pub mod shm;
pub mod wake;

pub use error::{Access, Fault, FaultKind, ModelError};
pub use faultinject::FaultInjection;
pub use irq::{ChannelSink, IrqSink};
pub use mem::SysMem;
pub use model::{EngineSnapshot, Model, ModelConfig};
pub use packet::{Generation, Packet};
