//! The co-simulation binding info page (`docs/refgpu.md` section 2.3): at
//! [`OFFSET`] of the ivshmem shared memory, written by `refgpu-sim` before
//! any peer connects and never changed afterwards. All fields
//! little-endian. A QEMU guest does not need it (it knows its RAM); a Linux
//! host reads it to find system memory. Server and client both use these
//! constants, so the layout is written down once.

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
