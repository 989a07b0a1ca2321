//! `refgpu-sim`: the reference GPU's functional model as a co-simulation
//! server speaking QEMU's ivshmem server protocol.
//!
//! The server is itself the ivshmem peer 0, the *model peer*. A host (QEMU's
//! `ivshmem-doorbell` device, or a Linux process through
//! `platform_linux::cosim`) connects to its UNIX socket and receives, as
//! int64 little-endian messages with file descriptors passed by SCM_RIGHTS
//! (QEMU's `docs/specs/ivshmem-spec.rst`):
//!
//! 1. the protocol version, 0;
//! 2. its own peer id (1, 2, ... one per connection);
//! 3. -1 with the shared-memory fd (a memfd);
//! 4. the model peer's id, 0, once per vector with that vector's eventfd
//!    (the host writes them: vectors 0..2 ring the engines, 3 is the
//!    control doorbell, `docs/refgpu.md` 2.3);
//! 5. its own id once per vector with its eventfds (the model writes vector
//!    `e` to interrupt the host for engine `e`).
//!
//! Shared memory layout: the register page at offset 0 (4 KiB, spec 2.3),
//! then a read-only *binding info page* at 0x1000 ([`proto::info`]) telling
//! a Linux host where system memory is (file path, offset, base, size).
//! System memory itself is a file both sides map: QEMU's guest RAM
//! (`memory-backend-file,share=on`), or a file the server creates for a
//! Linux host.
//!
//! One host at a time: the model has one host. A second connection while a
//! host is connected is refused (logged, closed at once); a host that
//! disconnects leaves the device reset and parked for the next one (see
//! [`server`]).
//!
//! # Why a crate of its own
//!
//! The server needs OS plumbing (sockets, eventfd, memfd, signals via
//! `rustix` and `libc`) that the model crate, a portable std library used
//! in-process by host tests, should not carry. (The shared mapping is the
//! exception: both sides of the binding need it, so it is the model's
//! `shm::Mapping`, behind the model's `shm` feature.) Keeping the binary, its
//! protocol tests and the end-to-end tests of the Linux co-sim backend in
//! one package also lets every test start the freshly built server through
//! `env!("CARGO_BIN_EXE_refgpu-sim")` instead of hunting for it in
//! `target/`.
//!
//! With `--shared-ram FILE` there is no socket and no peer: the model
//! attaches to a RAM file that a host without PCI (QEMU `mps2-an386`) maps
//! as its RAM, and watches doorbell words in it ([`shared_ram`],
//! `docs/refgpu.md` 2.3).
//!
//! Modules: [`args`] (command line), [`proto`] (wire format and the info
//! page), [`server`] (the peer, its event loop and the model), [`shared_ram`]
//! (the shared-RAM binding's server), `sys`
//! (eventfds, signals).

pub mod args;
pub mod proto;
pub mod server;
pub mod shared_ram;
mod sys;

pub use args::{parse_args, usage, ArgError, Options};
pub use server::{Server, ServerError, Turn};
pub use shared_ram::SharedRamServer;
