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

/// The binding info page: at [`info::OFFSET`] of the shared memory, written
/// by the server before any peer connects and never changed afterwards.
/// All fields little-endian. A QEMU guest does not need it (it knows its
/// RAM); a Linux host reads it to find system memory.
pub mod info {
    /// Offset of the info page in the shared memory.
    pub const OFFSET: usize = 0x1000;
    /// u32 at +0x00: magic, the bytes "RGSI".
    pub const MAGIC_OFF: usize = 0x00;
    /// The magic value (`u32::from_le_bytes(*b"RGSI")`).
    pub const MAGIC: u32 = u32::from_le_bytes(*b"RGSI");
    /// u32 at +0x04: layout version.
    pub const VERSION_OFF: usize = 0x04;
    /// The layout version described here.
    pub const VERSION: u32 = 1;
    /// u32 at +0x08: eventfds (vectors) per peer.
    pub const VECTORS_OFF: usize = 0x08;
    /// u32 at +0x0C: the model's peer id.
    pub const MODEL_ID_OFF: usize = 0x0C;
    /// u64 at +0x10: physical address of system memory's first byte.
    pub const MEM_BASE_OFF: usize = 0x10;
    /// u64 at +0x18: size of system memory in bytes.
    pub const MEM_SIZE_OFF: usize = 0x18;
    /// u64 at +0x20: offset in the memory file of `MEM_BASE`.
    pub const MEM_FILE_OFFSET_OFF: usize = 0x20;
    /// u32 at +0x28: length of the memory file's path in bytes.
    pub const PATH_LEN_OFF: usize = 0x28;
    /// +0x40..: the absolute path of the memory file (UTF-8, not
    /// NUL-terminated).
    pub const PATH_OFF: usize = 0x40;
    /// Longest path that fits.
    pub const PATH_MAX: usize = 0x1000 - PATH_OFF;
    /// Smallest shared memory holding the register page and this page.
    pub const MIN_SHM: usize = OFFSET + 0x1000;
}
