//! The memory map of QEMU's `virt` machine as this platform uses it, and
//! the identity map the MMU runs with.
//!
//! | range | what | mapping |
//! | --- | --- | --- |
//! | `0x0800_0000` | GICv2 distributor | Device-nGnRE (GiB 0) |
//! | `0x0801_0000` | GICv2 CPU interface | Device-nGnRE |
//! | `0x0802_0000` | GICv2m MSI frame | Device-nGnRE |
//! | `0x0900_0000` | PL011 UART | Device-nGnRE |
//! | `0x1000_0000 ..= 0x3efe_ffff` | PCI 32-bit MMIO window: BARs assigned here | Device-nGnRE |
//! | `0x4000_0000` | RAM (the shared file the model maps) | normal WB (GiB 1) |
//! | `0x4008_0000` | this image (code, data, 1 MiB boot stack; ≤ 15 MiB) | |
//! | `0x4100_0000` | GPU carve-out ([`CARVEOUT_SIZE`]) | |
//! | `0x40_1000_0000` | PCI ECAM (bus 0..255) | Device-nGnRE (GiB 256) |
//!
//! The identity map is aarch64-rt's *initial* page table: one static level-1
//! table of 1 GiB blocks that aarch64-rt's entry code installs before any
//! Rust code runs. The descriptor and MAIR encodings come from
//! `aarch64-paging` (`El1Attributes`, `Mair`, both `const`); its `IdMap`
//! does not fit this point of the boot (it builds its tables at run time,
//! and Rust code cannot run before the MMU is on: with the MMU off every
//! access is Device memory and the compiler's unaligned accesses fault).

/// GICv2 distributor.
pub const GICD: usize = 0x0800_0000;
/// GICv2 CPU interface.
pub const GICC: usize = 0x0801_0000;
/// GICv2m MSI frame.
pub const GICV2M: usize = 0x0802_0000;
/// PL011 UART.
pub const UART: usize = 0x0900_0000;
/// PCI ECAM window (high ECAM, used by `virt` with highmem on).
pub const ECAM: usize = 0x40_1000_0000;
/// PCI 32-bit MMIO window start.
pub const PCI_MMIO: u64 = 0x1000_0000;
/// PCI 32-bit MMIO window length.
pub const PCI_MMIO_LEN: u64 = 0x2eff_0000;
/// Start of RAM.
pub const RAM: usize = 0x4000_0000;
/// Where the image is linked (`bm-images/memory.ld`).
pub const IMAGE: usize = 0x4008_0000;
/// GPU carve-out start (physical = CPU address: the map is identity).
pub const CARVEOUT: usize = 0x4100_0000;
/// GPU carve-out size; RAM must reach `CARVEOUT + CARVEOUT_SIZE`
/// (QEMU `-m 128M` or more).
pub const CARVEOUT_SIZE: usize = 64 << 20;

// The carve-out lies in the normal-memory GiB, above the image's 15 MiB.
const _: () = assert!(CARVEOUT + CARVEOUT_SIZE <= RAM + (1 << 30));
const _: () = assert!(IMAGE + (15 << 20) <= CARVEOUT);

/// Stage-1 attributes of the Device blocks: MAIR index 0, access flag, never
/// executable.
const DEVICE: El1Attributes = El1Attributes::VALID
    .union(El1Attributes::ATTRIBUTE_INDEX_0)
    .union(El1Attributes::ACCESSED)
    .union(El1Attributes::PXN)
    .union(El1Attributes::UXN);

/// Stage-1 attributes of the RAM block: MAIR index 1, inner shareable,
/// access flag.
const NORMAL: El1Attributes = El1Attributes::VALID
    .union(El1Attributes::ATTRIBUTE_INDEX_1)
    .union(El1Attributes::INNER_SHAREABLE)
    .union(El1Attributes::ACCESSED);

/// MAIR_EL1: index 0 Device-nGnRE, index 1 normal write-back RW-allocate.
pub const MAIR: u64 = Mair::EMPTY
    .with_attribute(0, MairAttribute::DEVICE_NGNRE)
    .with_attribute(
        1,
        MairAttribute::normal(
            NormalMemory::WriteBackNonTransientReadWriteAllocate,
            NormalMemory::WriteBackNonTransientReadWriteAllocate,
        ),
    )
    .0;

/// Level-1 block descriptor for 1 GiB of Device-nGnRE at `pa`.
pub const fn device_block(pa: usize) -> usize {
    pa | DEVICE.bits()
}

/// Level-1 block descriptor for 1 GiB of normal cacheable memory at `pa`.
pub const fn normal_block(pa: usize) -> usize {
    pa | NORMAL.bits()
}

/// The 512 level-1 entries (39-bit VA, 1 GiB each) of the identity map:
/// GiB 0 (GIC, UART, PCI MMIO) Device, GiB 1 (RAM) normal, GiB 256 (ECAM)
/// Device; everything else faults.
pub const fn idmap() -> [usize; 512] {
    let mut t = [0usize; 512];
    t[0] = device_block(0);
    t[1] = normal_block(RAM);
    t[ECAM >> 30] = device_block(ECAM & !((1 << 30) - 1));
    t
}

use aarch64_paging::descriptor::El1Attributes;
use aarch64_paging::mair::{Mair, MairAttribute, NormalMemory};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_are_the_architectural_values() {
        // Valid block, AttrIndx 0, AF, PXN, UXN.
        assert_eq!(device_block(0), 0x0060_0000_0000_0401);
        // Valid block, AttrIndx 1, SH inner shareable, AF.
        assert_eq!(normal_block(RAM), 0x4000_0705);
        // MAIR: Attr0 = 0x04 (Device-nGnRE), Attr1 = 0xff (Normal WB RW-alloc).
        assert_eq!(MAIR, 0xff04);
    }

    #[test]
    fn idmap_covers_the_devices_and_ram() {
        let t = idmap();
        assert_eq!(t[0] & 0b11, 0b01, "block descriptor");
        assert_eq!(t[1] & !0xfff & ((1 << 48) - 1), RAM);
        assert_eq!((t[1] >> 2) & 7, 1, "RAM uses MAIR index 1 (normal)");
        assert_eq!((t[0] >> 2) & 7, 0, "MMIO uses MAIR index 0 (device)");
        assert_eq!(t[256] & 0xffff_ffff_f000, 0x40_0000_0000);
        assert_eq!(t.iter().filter(|&&d| d != 0).count(), 3);
    }
}
