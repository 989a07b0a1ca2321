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
//! | `0x4008_0000` | this image (code, data, 1 MiB boot stack; < 15.5 MiB) | |
//! | `0x4100_0000` | GPU carve-out ([`CARVEOUT_SIZE`]) | |
//! | `0x40_1000_0000` | PCI ECAM (bus 0..255) | Device-nGnRE (GiB 256) |

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

/// Block descriptor (level 1, 1 GiB): valid.
const VALID: usize = 1 << 0;
/// AttrIndx[2:0] at bits 4:2.
const fn attr(i: usize) -> usize {
    i << 2
}
/// Inner shareable.
const SH_INNER: usize = 3 << 8;
/// Access flag.
const AF: usize = 1 << 10;
/// Privileged execute never.
const PXN: usize = 1 << 53;
/// Unprivileged execute never.
const UXN: usize = 1 << 54;

/// MAIR_EL1: index 0 Device-nGnRE, index 1 normal write-back RW-allocate.
pub const MAIR: u64 = 0x04 | (0xff << 8);

/// Level-1 block descriptor for 1 GiB of Device-nGnRE at `pa`.
pub const fn device_block(pa: usize) -> usize {
    pa | VALID | attr(0) | AF | PXN | UXN
}

/// Level-1 block descriptor for 1 GiB of normal cacheable memory at `pa`.
pub const fn normal_block(pa: usize) -> usize {
    pa | VALID | attr(1) | SH_INNER | AF
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

#[cfg(test)]
mod tests {
    use super::*;

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
