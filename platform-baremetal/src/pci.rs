//! PCI: enumeration of bus 0 through ECAM and BAR assignment.
//!
//! Nothing assigns BARs on QEMU's `virt` machine without firmware, so the
//! driver sizes every memory BAR (write all-ones, read back the mask) and
//! places it, naturally aligned, in a window of the host bridge's MMIO
//! space, then enables memory decoding and bus mastering.
//!
//! The logic works over the [`ConfigSpace`] trait: the aarch64 side
//! implements it with volatile loads and stores to the ECAM window, host
//! tests with a fake device.

/// 32-bit access to PCI configuration space.
pub trait ConfigSpace {
    /// Reads the dword at `offset` (4-byte aligned) of function `bdf`.
    fn read(&mut self, bdf: Bdf, offset: u16) -> u32;
    /// Writes the dword at `offset` of function `bdf`.
    fn write(&mut self, bdf: Bdf, offset: u16, value: u32);
}

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
}

/// Configuration-space offsets used here.
pub mod cfg {
    /// Vendor ID [15:0], device ID [31:16].
    pub const ID: u16 = 0x00;
    /// Command [15:0], status [31:16].
    pub const COMMAND: u16 = 0x04;
    /// Header type in [23:16].
    pub const HEADER: u16 = 0x0C;
    /// First BAR.
    pub const BAR0: u16 = 0x10;
    /// Capabilities pointer.
    pub const CAP_PTR: u16 = 0x34;
    /// Command: memory space enable.
    pub const CMD_MEMORY: u32 = 1 << 1;
    /// Command: bus master enable.
    pub const CMD_MASTER: u32 = 1 << 2;
    /// Command: INTx disable.
    pub const CMD_INTX_DISABLE: u32 = 1 << 10;
    /// Status: capabilities list present.
    pub const STATUS_CAPS: u32 = 1 << 20;
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
pub fn enumerate_bus0(cs: &mut impl ConfigSpace, mut found: impl FnMut(Function)) {
    for dev in 0..32u8 {
        for func in 0..8u8 {
            let bdf = Bdf { bus: 0, dev, func };
            let id = cs.read(bdf, cfg::ID);
            if id & 0xffff == 0xffff {
                if func == 0 {
                    break;
                }
                continue;
            }
            found(Function { bdf, vendor: id as u16, device: (id >> 16) as u16 });
            let multi = cs.read(bdf, cfg::HEADER) & (0x80 << 16) != 0;
            if func == 0 && !multi {
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
}

impl core::fmt::Display for BarError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BarError::WindowFull { bar, size } => write!(f, "no room for BAR{bar} ({size:#x} bytes)"),
            BarError::IoBar(b) => write!(f, "BAR{b} is an I/O BAR (unsupported)"),
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
    cs: &mut impl ConfigSpace,
    bdf: Bdf,
    window: &mut BarWindow,
) -> Result<[Bar; 6], BarError> {
    let mut bars = [Bar::default(); 6];
    let cmd = cs.read(bdf, cfg::COMMAND) & 0xffff;
    cs.write(bdf, cfg::COMMAND, cmd & !(cfg::CMD_MEMORY | cfg::CMD_MASTER));
    let mut i = 0u8;
    while i < 6 {
        let off = cfg::BAR0 + 4 * u16::from(i);
        let orig = cs.read(bdf, off);
        if orig & 1 != 0 {
            // I/O BAR: leave it, report only if it is implemented.
            cs.write(bdf, off, 0xffff_ffff);
            let mask = cs.read(bdf, off);
            cs.write(bdf, off, orig);
            if mask & !3 != 0 {
                return Err(BarError::IoBar(i));
            }
            i += 1;
            continue;
        }
        let is_64 = (orig >> 1) & 3 == 2 && i < 5;
        cs.write(bdf, off, 0xffff_ffff);
        let lo = cs.read(bdf, off) & !0xf;
        let hi = if is_64 {
            cs.write(bdf, off + 4, 0xffff_ffff);
            cs.read(bdf, off + 4)
        } else {
            0xffff_ffff
        };
        let mask = (u64::from(hi) << 32) | u64::from(lo);
        if lo == 0 && (!is_64 || hi == 0) {
            // Not implemented.
            cs.write(bdf, off, 0);
            i += if is_64 { 2 } else { 1 };
            continue;
        }
        let size = (!mask).wrapping_add(1);
        let addr = window.take(size).ok_or(BarError::WindowFull { bar: i, size })?;
        cs.write(bdf, off, addr as u32);
        if is_64 {
            cs.write(bdf, off + 4, (addr >> 32) as u32);
        }
        if let Some(b) = bars.get_mut(usize::from(i)) {
            *b = Bar { addr, size, is_64 };
        }
        i += if is_64 { 2 } else { 1 };
    }
    cs.write(bdf, cfg::COMMAND, cmd | cfg::CMD_MEMORY | cfg::CMD_MASTER);
    Ok(bars)
}

/// Finds the capability `id` in the function's list; returns its offset.
pub fn find_capability(cs: &mut impl ConfigSpace, bdf: Bdf, id: u8) -> Option<u16> {
    if cs.read(bdf, cfg::COMMAND) & cfg::STATUS_CAPS == 0 {
        return None;
    }
    let mut ptr = (cs.read(bdf, cfg::CAP_PTR) & 0xfc) as u16;
    for _ in 0..48 {
        if ptr == 0 {
            return None;
        }
        let hdr = cs.read(bdf, ptr);
        if hdr as u8 == id {
            return Some(ptr);
        }
        ptr = ((hdr >> 8) & 0xfc) as u16;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One fake function at 00:03.0 with a 256 B BAR0, a 4 KiB BAR1 and a
    /// 64-bit 1 MiB BAR2 (the ivshmem-doorbell layout).
    struct Fake {
        cfg: [u32; 64],
        sizes: [u64; 6],
    }

    impl Fake {
        fn new() -> Fake {
            let mut cfg = [0u32; 64];
            cfg[0] = 0x1110_1af4;
            cfg[1] = 1 << 20;
            cfg[0x34 / 4] = 0x40;
            cfg[0x40 / 4] = 0x11; // MSI-X, end of list
            cfg[4 + 2] = 0b0100; // BAR2: 64-bit memory
            Fake { cfg, sizes: [0x100, 0x1000, 0x10_0000, 0, 0, 0] }
        }
    }

    impl ConfigSpace for Fake {
        fn read(&mut self, bdf: Bdf, offset: u16) -> u32 {
            if bdf != (Bdf { bus: 0, dev: 3, func: 0 }) {
                return 0xffff_ffff;
            }
            self.cfg[usize::from(offset / 4)]
        }
        fn write(&mut self, bdf: Bdf, offset: u16, value: u32) {
            assert_eq!(bdf, Bdf { bus: 0, dev: 3, func: 0 });
            let idx = usize::from(offset / 4);
            self.cfg[idx] = match offset {
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
                0x04 => (self.cfg[1] & 0xffff_0000) | (value & 0xffff),
                _ => value,
            };
        }
    }

    #[test]
    fn finds_the_device_and_assigns_bars() {
        let mut f = Fake::new();
        let mut found = None;
        enumerate_bus0(&mut f, |func| found = Some(func));
        let func = found.unwrap();
        assert_eq!((func.vendor, func.device, func.bdf.dev), (0x1af4, 0x1110, 3));
        assert_eq!(func.bdf.ecam_offset(), 3 << 15);
        let mut w = BarWindow::new(0x1000_0000, 0x2eff_0000);
        let bars = assign_bars(&mut f, func.bdf, &mut w).unwrap();
        assert_eq!(bars[0], Bar { addr: 0x1000_0000, size: 0x100, is_64: false });
        assert_eq!(bars[1], Bar { addr: 0x1000_1000, size: 0x1000, is_64: false });
        assert_eq!(bars[2], Bar { addr: 0x1010_0000, size: 0x10_0000, is_64: true });
        assert_eq!(f.cfg[4 + 2] & !0xf, 0x1010_0000);
        assert_eq!(f.cfg[4 + 3], 0);
        assert_eq!(f.cfg[1] & 0x6, 0x6, "memory and bus master enabled");
        assert_eq!(find_capability(&mut f, func.bdf, 0x11), Some(0x40));
        assert_eq!(find_capability(&mut f, func.bdf, 0x05), None);
    }

    #[test]
    fn window_full_is_an_error() {
        let mut f = Fake::new();
        let mut w = BarWindow::new(0x1000_0000, 0x8000);
        let e = assign_bars(&mut f, Bdf { bus: 0, dev: 3, func: 0 }, &mut w).unwrap_err();
        assert_eq!(e, BarError::WindowFull { bar: 2, size: 0x10_0000 });
    }
}
