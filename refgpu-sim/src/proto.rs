//! The ivshmem server protocol on the wire, and the binding info page.
//!
//! Every message is one int64 in little-endian byte order, optionally with
//! one file descriptor attached by SCM_RIGHTS. Peers never send anything to
//! the server; the server reads from a peer's socket only to notice that it
//! left (EOF) or misbehaves (any data).

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};

use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// The protocol version the server announces first.
pub const PROTOCOL_VERSION: i64 = 0;
/// The value sent with the shared-memory fd.
pub const SHM_MESSAGE: i64 = -1;
/// Peer id of the model (the server).
pub const MODEL_PEER_ID: u16 = 0;
/// Vectors the model needs: 3 engine doorbells and the control doorbell.
pub const MIN_VECTORS: u32 = 4;

/// Sends one message: `value`, with `fd` attached if given.
pub fn send_msg(sock: impl AsFd, value: i64, fd: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
    let bytes = value.to_le_bytes();
    let iov = [IoSlice::new(&bytes)];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(fd) = fd {
        fds = [fd];
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(std::io::Error::other("control buffer too small"));
        }
    }
    let n = sendmsg(sock.as_fd(), &iov, &mut control, SendFlags::NOSIGNAL)?;
    if n != bytes.len() {
        return Err(std::io::Error::other("short send"));
    }
    Ok(())
}

/// The binding info page layout (defined once, in the model crate).
pub use refgpu_model::ivshmem_info as info;
