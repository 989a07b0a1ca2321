//! PCI: enumeration of bus 0 through ECAM and BAR assignment.
//!
//! Nothing assigns BARs on QEMU's `virt` machine without firmware, so the
//! driver sizes every memory BAR and places it, naturally aligned, in a
//! window of the host bridge's MMIO space, then enables memory decoding and
//! bus mastering.
//!
//! Header decoding, BAR sizing and the capability list come from the
//! `pci_types` crate; this module adds what it leaves to the caller: the
//! walk over bus 0, the placement of BARs in a window, and guards where
//! `pci_types` would panic on a malformed device (a BAR with the reserved
//! memory type). Configuration space is any
//! [`pci_types::ConfigRegionAccess`]: the aarch64 side implements it over
//! the ECAM window (`arch::board::Ecam`, with `safe-mmio`), host tests with a
//! fake device.

use pci_types::capability::{MsixCapability, PciCapability};
pub use pci_types::ConfigRegionAccess;
use pci_types::{Bar as PciBar, CommandRegister, EndpointHeader, PciAddress, PciHeader};

/// Bus, device, function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Bdf {
    /// Bus number.
    pub bus: u8,
    /// Device number, 0..32.
    pub dev: u8,
    /// Function number, 0..8.
    pub func: u8,
}

impl Bdf {
    /// Byte offset of this function's 4 KiB in an ECAM window.
    pub fn ecam_offset(self) -> usize {
        (usize::from(self.bus) << 20) | (usize::from(self.dev) << 15) | (usize::from(self.func) << 12)
    }

    /// The function's address for `pci_types` (segment 0).
    pub fn address(self) -> PciAddress {
        PciAddress::new(0, self.bus, self.dev, self.func)
    }
}

impl From<PciAddress> for Bdf {
    fn from(a: PciAddress) -> Bdf {
        Bdf { bus: a.bus(), dev: a.device(), func: a.function() }
    }
}

/// A function found on the bus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Function {
    /// Where it is.
    pub bdf: Bdf,
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
}

/// Finds every function on bus 0, calling `found` for each.
pub fn enumerate_bus0(cs: &impl ConfigRegionAccess, mut found: impl FnMut(Function)) {
    for dev in 0..32u8 {
        for func in 0..8u8 {
            let bdf = Bdf { bus: 0, dev, func };
            let header = PciHeader::new(bdf.address());
            let (vendor, device) = header.id(cs);
            if vendor == 0xffff {
                if func == 0 {
                    break;
                }
                continue;
            }
            found(Function { bdf, vendor, device });
            if func == 0 && !header.has_multiple_functions(cs) {
                break;
            }
        }
    }
}

/// A BAR after assignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Bar {
    /// Bus address assigned (0 if the BAR is absent).
    pub addr: u64,
    /// Size in bytes (0 if absent).
    pub size: u64,
    /// Whether it is a 64-bit BAR (it takes two slots).
    pub is_64: bool,
}

/// A bump allocator over an MMIO window for BARs.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BarWindow {
    next: u64,
    end: u64,
}

/// Why BAR assignment failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum BarError {
    /// The window has no room for a BAR of this size.
    WindowFull {
        /// BAR index.
        bar: u8,
        /// Its size.
        size: u64,
    },
    /// An I/O-space BAR (not supported: `virt` has no I/O window here).
    IoBar(u8),
    /// A memory BAR with the reserved type (bits 2:1 = 0b01 or 0b11).
    ReservedType(u8),
    /// The function has no type-0 (endpoint) header.
    NotEndpoint,
}

impl core::fmt::Display for BarError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BarError::WindowFull { bar, size } => write!(f, "no room for BAR{bar} ({size:#x} bytes)"),
            BarError::IoBar(b) => write!(f, "BAR{b} is an I/O BAR (unsupported)"),
            BarError::ReservedType(b) => write!(f, "BAR{b} has the reserved memory type"),
            BarError::NotEndpoint => write!(f, "not an endpoint (type 0 header)"),
        }
    }
}

impl BarWindow {
    /// The window `[base, base + len)`.
    pub const fn new(base: u64, len: u64) -> BarWindow {
        BarWindow { next: base, end: base + len }
    }

    fn take(&mut self, size: u64) -> Option<u64> {
        let addr = self.next.checked_next_multiple_of(size)?;
        let end = addr.checked_add(size)?;
        if end > self.end {
            return None;
        }
        self.next = end;
        Some(addr)
    }
}

/// Sizes and assigns the six BARs of a type-0 function from `window`
/// (64-bit BARs too, placed below 4 GiB when the window is), then enables
/// memory decoding and bus mastering. Decoding is off while BARs move.
pub fn assign_bars(
    cs: &impl ConfigRegionAccess,
    bdf: Bdf,
    window: &mut BarWindow,
) -> Result<[Bar; 6], BarError> {
    let mut header =
        EndpointHeader::from_header(PciHeader::new(bdf.address()), cs).ok_or(BarError::NotEndpoint)?;
    header.update_command(cs, |c| c - (CommandRegister::MEMORY_ENABLE | CommandRegister::BUS_MASTER_ENABLE));
    let mut bars = [Bar::default(); 6];
    let mut slot = 0u8;
    while slot < 6 {
        // `pci_types` panics on the reserved memory types: refuse them first.
        // SAFETY: a BAR register of a function that exists is a valid
        // configuration read.
        let raw = unsafe { cs.read(bdf.address(), 0x10 + 4 * u16::from(slot)) };
        if raw & 1 == 0 && matches!((raw >> 1) & 3, 1 | 3) {
            return Err(BarError::ReservedType(slot));
        }
        let (size, is_64) = match header.bar(slot, cs) {
            None => (0, false), // not implemented
            Some(PciBar::Io { .. }) => return Err(BarError::IoBar(slot)),
            Some(PciBar::Memory32 { size, .. }) => (u64::from(size), false),
            Some(PciBar::Memory64 { size, .. }) => (size, true),
        };
        if size != 0 {
            let addr = window.take(size).ok_or(BarError::WindowFull { bar: slot, size })?;
            let value = usize::try_from(addr).map_err(|_| BarError::WindowFull { bar: slot, size })?;
            // SAFETY: `addr` is a naturally aligned range of the bridge's
            // window that no other BAR holds, and fits the BAR's width (the
            // 32-bit window); decoding is off while it moves.
            unsafe { header.write_bar(slot, cs, value) }
                .map_err(|_| BarError::WindowFull { bar: slot, size })?;
            if let Some(b) = bars.get_mut(usize::from(slot)) {
                *b = Bar { addr, size, is_64 };
            }
        }
        slot += if is_64 { 2 } else { 1 };
    }
    header.update_command(cs, |c| c | CommandRegister::MEMORY_ENABLE | CommandRegister::BUS_MASTER_ENABLE);
    Ok(bars)
}

/// The function's MSI-X capability, if it lists one (`pci_types` decodes
/// the table's BAR, offset and size). The walk stops after 48
/// capabilities, so a list that loops back on itself ends; a loop made only
/// of null (ID 0) entries is skipped inside `pci_types` and not bounded.
pub fn find_msix(cs: &impl ConfigRegionAccess, bdf: Bdf) -> Option<MsixCapability> {
    let header = EndpointHeader::from_header(PciHeader::new(bdf.address()), cs)?;
    header.capabilities(cs).take(48).find_map(|c| match c {
        PciCapability::MsiX(m) => Some(m),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One fake function at 00:03.0 with a 256 B BAR0, a 4 KiB BAR1 and a
    /// 64-bit 1 MiB BAR2 (the ivshmem-doorbell layout).
    struct Fake {
        cfg: core::cell::RefCell<[u32; 64]>,
        sizes: [u64; 6],
    }

    impl Fake {
        fn new() -> Fake {
            let mut cfg = [0u32; 64];
            cfg[0] = 0x1110_1af4;
            cfg[1] = 1 << 20;
            cfg[0x34 / 4] = 0x40;
            cfg[0x40 / 4] = 0x11; // MSI-X, end of list
            cfg[0x44 / 4] = 0x1; // table in BAR1 at offset 0
            cfg[4 + 2] = 0b0100; // BAR2: 64-bit memory
            Fake { cfg: core::cell::RefCell::new(cfg), sizes: [0x100, 0x1000, 0x10_0000, 0, 0, 0] }
        }

        fn cfg(&self, i: usize) -> u32 {
            self.cfg.borrow()[i]
        }
    }

    impl ConfigRegionAccess for Fake {
        unsafe fn read(&self, address: PciAddress, offset: u16) -> u32 {
            if Bdf::from(address) != (Bdf { bus: 0, dev: 3, func: 0 }) {
                return 0xffff_ffff;
            }
            self.cfg.borrow()[usize::from(offset / 4)]
        }
        unsafe fn write(&self, address: PciAddress, offset: u16, value: u32) {
            assert_eq!(Bdf::from(address), Bdf { bus: 0, dev: 3, func: 0 });
            let idx = usize::from(offset / 4);
            let old = self.cfg.borrow()[idx];
            self.cfg.borrow_mut()[idx] = match offset {
                0x10..=0x24 => {
                    let bar = idx - 4;
                    // BAR3 is the high half of BAR2.
                    let (size, hi) = if bar == 3 { (self.sizes[2], true) } else { (self.sizes[bar], false) };
                    let mask = (!(size.wrapping_sub(1))) & if size == 0 { 0 } else { u64::MAX };
                    let flags = if bar == 2 { 0b0100 } else { 0 };
                    if hi {
                        value & (mask >> 32) as u32
                    } else {
                        (value & mask as u32 & !0xf) | flags
                    }
                }
                // Status (upper half) is read-only / write-1-to-clear.
                0x04 => (old & 0xffff_0000) | (value & 0xffff),
                _ => value,
            };
        }
    }

    #[test]
    fn finds_the_device_and_assigns_bars() {
        let f = Fake::new();
        let mut found = None;
        enumerate_bus0(&f, |func| found = Some(func));
        let func = found.unwrap();
        assert_eq!((func.vendor, func.device, func.bdf.dev), (0x1af4, 0x1110, 3));
        assert_eq!(func.bdf.ecam_offset(), 3 << 15);
        let mut w = BarWindow::new(0x1000_0000, 0x2eff_0000);
        let bars = assign_bars(&f, func.bdf, &mut w).unwrap();
        assert_eq!(bars[0], Bar { addr: 0x1000_0000, size: 0x100, is_64: false });
        assert_eq!(bars[1], Bar { addr: 0x1000_1000, size: 0x1000, is_64: false });
        assert_eq!(bars[2], Bar { addr: 0x1010_0000, size: 0x10_0000, is_64: true });
        assert_eq!(bars[3], Bar::default(), "the high half of BAR2");
        assert_eq!(f.cfg(4 + 2) & !0xf, 0x1010_0000);
        assert_eq!(f.cfg(4 + 2) & 0xf, 0b0100, "type bits kept");
        assert_eq!(f.cfg(4 + 3), 0);
        assert_eq!(f.cfg(4), 0x1000_0000);
        assert_eq!(f.cfg(1) & 0x6, 0x6, "memory and bus master enabled");
        let msix = find_msix(&f, func.bdf).unwrap();
        assert_eq!((msix.table_bar(), msix.table_offset(), msix.table_size()), (1, 0, 1));
    }

    #[test]
    fn window_full_is_an_error() {
        let f = Fake::new();
        let mut w = BarWindow::new(0x1000_0000, 0x8000);
        let e = assign_bars(&f, Bdf { bus: 0, dev: 3, func: 0 }, &mut w).unwrap_err();
        assert_eq!(e, BarError::WindowFull { bar: 2, size: 0x10_0000 });
    }

    #[test]
    fn malformed_devices_are_errors_not_panics() {
        let bdf = Bdf { bus: 0, dev: 3, func: 0 };
        let f = Fake::new();
        f.cfg.borrow_mut()[4 + 2] = 0b0010; // BAR2: reserved memory type 0b01
        let e = assign_bars(&f, bdf, &mut BarWindow::new(0x1000_0000, 0x2eff_0000)).unwrap_err();
        assert_eq!(e, BarError::ReservedType(2));
        let f = Fake::new();
        f.cfg.borrow_mut()[0x0C / 4] = 1 << 16; // a PCI-PCI bridge header
        let e = assign_bars(&f, bdf, &mut BarWindow::new(0x1000_0000, 0x2eff_0000)).unwrap_err();
        assert_eq!(e, BarError::NotEndpoint);
        assert!(find_msix(&f, bdf).is_none());
        // A capability list that points at itself ends (no MSI-X in it).
        let f = Fake::new();
        f.cfg.borrow_mut()[0x40 / 4] = 0x4009; // vendor capability, next = itself
        assert!(find_msix(&f, bdf).is_none());
        // No devices at all: nothing found.
        let mut n = 0;
        enumerate_bus0(&NoDevices, |_| n += 1);
        assert_eq!(n, 0);
    }

    struct NoDevices;

    impl ConfigRegionAccess for NoDevices {
        unsafe fn read(&self, _: PciAddress, _: u16) -> u32 {
            0xffff_ffff
        }
        unsafe fn write(&self, _: PciAddress, _: u16, _: u32) {
            panic!("write to an absent function");
        }
    }
}
