//! Addresses the device uses, as types: a GPU virtual address
//! ([`GpuVa`]) and an indirect buffer the ring calls ([`IbRef`]).
//!
//! Both are plain values with no cost over the integers they hold
//! (`#[repr(transparent)]`, `Copy`); they keep an address from being
//! mistaken for a length, a handle or a CPU pointer on the paths between
//! the layers. The public API still takes and returns `u64` addresses
//! where the caller gives them.

/// An address in the device's view of memory: a GPU virtual address with
/// the MMU on, the physical address the device uses with it bypassed.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GpuVa(u64);

impl GpuVa {
    /// The address `va`.
    #[inline(always)]
    pub const fn new(va: u64) -> GpuVa {
        GpuVa(va)
    }

    /// The address as an integer (for packets, registers and the API).
    #[inline(always)]
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// An indirect buffer: `dwords` dwords of commands at `va`, what an
/// INDIRECT_BUFFER packet names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbRef {
    /// The first dword's address.
    pub va: GpuVa,
    /// Its length in dwords.
    pub dwords: u32,
}

impl IbRef {
    /// `dwords` dwords at `va`.
    #[inline(always)]
    pub const fn new(va: u64, dwords: u32) -> IbRef {
        IbRef { va: GpuVa(va), dwords }
    }
}
