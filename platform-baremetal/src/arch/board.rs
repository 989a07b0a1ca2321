//! Board bring-up on `virt`: PCI ECAM access, finding and setting up the
//! ivshmem-doorbell device, and the [`Hal`] the GPU transport runs on.

use core::cell::RefCell;
use core::ptr::NonNull;

use pci_types::{ConfigRegionAccess, PciAddress};
use safe_mmio::fields::ReadWrite;
use safe_mmio::{field, UniqueMmioPointer};
use umd_core::platform::IrqWait;

use crate::carveout::CarveOut;
use crate::ivshmem::{self, Hal, IvshmemGpu};
use crate::map;
use crate::pci::{self, Bar, BarError, BarWindow, Bdf};

/// Dwords of bus 0's configuration space in ECAM (32 devices x 8
/// functions x 4 KiB).
const ECAM_BUS0_DWORDS: usize = 32 * 8 * 4096 / 4;

/// Configuration space of bus 0 through the ECAM window (`safe-mmio`).
/// Functions on other buses read all-ones and ignore writes.
pub struct Ecam {
    regs: RefCell<UniqueMmioPointer<'static, [ReadWrite<u32>]>>,
}

impl Ecam {
    /// The ECAM window of bus 0.
    ///
    /// # Safety
    /// At most one `Ecam` may exist at a time: it is the window's only user.
    unsafe fn bus0() -> Option<Ecam> {
        let base = NonNull::new(map::ECAM as *mut ReadWrite<u32>)?;
        // SAFETY: the ECAM window is mapped as Device memory (GiB 256 of the
        // identity map) and bus 0 covers its first 1 MiB; every dword of it
        // is a valid configuration read or write (absent functions read
        // all-ones); this function's contract makes the pointer unique.
        let regs = unsafe { UniqueMmioPointer::new(NonNull::slice_from_raw_parts(base, ECAM_BUS0_DWORDS)) };
        Some(Ecam { regs: RefCell::new(regs) })
    }

    fn index(address: PciAddress, offset: u16) -> usize {
        (Bdf::from(address).ecam_offset() + usize::from(offset & 0xffc)) / 4
    }
}

impl ConfigRegionAccess for Ecam {
    unsafe fn read(&self, address: PciAddress, offset: u16) -> u32 {
        self.regs.borrow_mut().get(Self::index(address, offset)).map_or(u32::MAX, |mut r| r.read())
    }

    unsafe fn write(&self, address: PciAddress, offset: u16, value: u32) {
        if let Some(mut r) = self.regs.borrow_mut().get(Self::index(address, offset)) {
            r.write(value);
        }
    }
}

/// How GPU waits learn that the device is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum IrqMode {
    /// The core polls fences (no interrupts).
    Polling,
    /// MSI-X through the GICv2m frame; `wait_irq` sleeps in `wfi`.
    Msi,
}

/// The CPU half of the GPU transport on `virt`.
#[derive(Debug)]
pub struct VirtHal {
    mode: IrqMode,
}

impl Hal for VirtHal {
    type Delay<'a> = crate::arch::timer::Delay;

    fn now_ns(&self) -> u64 {
        crate::arch::timer::now_ns()
    }

    fn delay(&self) -> crate::arch::timer::Delay {
        crate::arch::timer::Delay
    }

    fn cache_clean(&self, addr: usize, len: usize) {
        crate::arch::cache::clean(addr, len)
    }

    fn cache_invalidate(&self, addr: usize, len: usize) {
        crate::arch::cache::invalidate(addr, len)
    }

    fn wait_irq(&self, timeout_ns: u64) -> IrqWait {
        match self.mode {
            IrqMode::Polling => IrqWait::Unsupported,
            IrqMode::Msi => crate::arch::irq::wait(timeout_ns),
        }
    }
}

/// Called by the IRQ vector.
pub fn handle_irq() {
    crate::arch::irq::handle_irq()
}

/// Vectors the device is started with (QEMU `vectors=4`).
const VECTORS: u32 = 4;

/// One entry of an MSI-X table (PCI 3.0, 6.8.2).
#[repr(C)]
struct MsixEntry {
    addr_lo: ReadWrite<u32>,
    addr_hi: ReadWrite<u32>,
    data: ReadWrite<u32>,
    ctrl: ReadWrite<u32>,
}

/// Points the device's MSI-X vectors at the GICv2m frame (vector `i` →
/// SPI `first + i`), unmasks them, enables MSI-X and sets the GIC up.
fn setup_msix(ecam: &Ecam, bdf: Bdf, bars: &[Bar; 6]) -> Result<(), BoardError> {
    let mut msix = pci::find_msix(ecam, bdf).ok_or(BoardError::Msi("no MSI-X capability"))?;
    let bar =
        bars.get(usize::from(msix.table_bar())).ok_or(BoardError::Msi("MSI-X table BIR out of range"))?;
    if bar.size == 0 {
        return Err(BoardError::Msi("MSI-X table BAR not assigned"));
    }
    let entries = usize::from(msix.table_size());
    if u64::from(msix.table_offset()) + 16 * entries as u64 > bar.size {
        return Err(BoardError::Msi("MSI-X table does not fit its BAR"));
    }
    let (first, count) = crate::arch::irq::v2m_spis();
    if count < VECTORS || (entries as u32) < VECTORS {
        return Err(BoardError::Msi("fewer MSI SPIs or MSI-X entries than vectors"));
    }
    let base = NonNull::new((bar.addr + u64::from(msix.table_offset())) as *mut MsixEntry)
        .ok_or(BoardError::Msi("MSI-X table at address 0"))?;
    // SAFETY: the table (`entries` x 16 bytes, checked to fit) lies in the
    // BAR just assigned inside the PCI window, which the identity map covers
    // as Device memory; nothing else accesses it.
    let mut table = unsafe { UniqueMmioPointer::new(NonNull::slice_from_raw_parts(base, entries)) };
    let doorbell = (map::GICV2M + crate::arch::irq::V2M_MSI_SETSPI_NS) as u64;
    for i in 0..VECTORS {
        let mut e = table.get(i as usize).ok_or(BoardError::Msi("MSI-X entry out of range"))?;
        field!(e, addr_lo).write(doorbell as u32);
        field!(e, addr_hi).write((doorbell >> 32) as u32);
        field!(e, data).write(first + i);
        field!(e, ctrl).write(0); // unmasked
    }
    crate::arch::irq::init(first, VECTORS).map_err(|_| BoardError::Msi("GIC refused to enable an SPI"))?;
    msix.set_function_mask(false, ecam);
    msix.set_enabled(true, ecam);
    crate::info!("MSI-X: {} vectors -> GICv2m SPIs {}..{}", VECTORS, first, first + VECTORS);
    Ok(())
}

/// Why bring-up failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum BoardError {
    /// No ivshmem device on bus 0 (QEMU started without `-device
    /// ivshmem-doorbell`?).
    NoIvshmem,
    /// BAR assignment failed.
    Bars(BarError),
    /// BAR2 (shared memory) is too small for the register and info pages.
    SmallShm(u64),
    /// The model does not see the carve-out: its memory window (from the
    /// info page) does not contain it (QEMU `-m` or `--mem-size` too small).
    CarveOutOutsideModel {
        /// Model memory base.
        base: u64,
        /// Model memory size.
        size: u64,
    },
    /// The shared memory has no refgpu-sim info page (another server?).
    NoInfoPage,
    /// MSI-X or GIC setup failed.
    Msi(&'static str),
    /// The model never answered the control doorbell (`IvshmemGpu::wait_link`).
    NoDoorbellLink,
}

impl core::fmt::Display for BoardError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BoardError::NoIvshmem => write!(f, "no ivshmem device (1af4:1110) on PCI bus 0"),
            BoardError::Bars(e) => write!(f, "BAR assignment: {e}"),
            BoardError::SmallShm(s) => write!(f, "ivshmem shared memory is {s:#x} bytes, need >= 8 KiB"),
            BoardError::CarveOutOutsideModel { base, size } => write!(
                f,
                "the model's memory [{base:#x}, +{size:#x}) does not contain the GPU carve-out [{:#x}, +{:#x})",
                map::CARVEOUT,
                map::CARVEOUT_SIZE
            ),
            BoardError::NoInfoPage => write!(f, "no refgpu-sim info page in the shared memory"),
            BoardError::Msi(why) => write!(f, "MSI-X setup: {why}"),
            BoardError::NoDoorbellLink => write!(
                f,
                "the model did not answer the control doorbell within {} ms",
                ivshmem::LINK_TIMEOUT_NS / 1_000_000
            ),
        }
    }
}

/// The GPU found on the bus, set up and wrapped for `umd-core`.
pub struct Gpu {
    /// The transport (implements `Platform` + `DirectIo`).
    pub io: IvshmemGpu<VirtHal>,
    /// Where the device is.
    pub bdf: Bdf,
    /// Its BARs after assignment.
    pub bars: [Bar; 6],
}

/// Enumerates PCI, assigns BARs, finds the ivshmem-doorbell device and
/// wraps it with the RAM carve-out. Call once.
pub fn bring_up(mode: IrqMode) -> Result<Gpu, BoardError> {
    // SAFETY: bring-up runs once; this is the only `Ecam`.
    let ecam = unsafe { Ecam::bus0() }.ok_or(BoardError::NoIvshmem)?;
    let mut found = None;
    pci::enumerate_bus0(&ecam, |f| {
        crate::info!(
            "pci {:02x}:{:02x}.{} {:04x}:{:04x}",
            f.bdf.bus,
            f.bdf.dev,
            f.bdf.func,
            f.vendor,
            f.device
        );
        if f.vendor == ivshmem::VENDOR_ID && f.device == ivshmem::DEVICE_ID && found.is_none() {
            found = Some(f.bdf);
        }
    });
    let bdf = found.ok_or(BoardError::NoIvshmem)?;
    let mut window = BarWindow::new(map::PCI_MMIO, map::PCI_MMIO_LEN);
    let bars = pci::assign_bars(&ecam, bdf, &mut window).map_err(BoardError::Bars)?;
    for (i, b) in bars.iter().enumerate().filter(|(_, b)| b.size != 0) {
        crate::info!("  BAR{} {:#x} size {:#x}{}", i, b.addr, b.size, if b.is_64 { " (64-bit)" } else { "" });
    }
    if bars[2].size < 0x2000 {
        return Err(BoardError::SmallShm(bars[2].size));
    }
    let (Some(bar0), Some(shm)) =
        (NonNull::new(bars[0].addr as *mut u32), NonNull::new(bars[2].addr as *mut u32))
    else {
        return Err(BoardError::NoIvshmem);
    };
    let carve = CarveOut::new(map::CARVEOUT, map::CARVEOUT as u64, map::CARVEOUT_SIZE)
        .ok_or(BoardError::NoIvshmem)?;
    // SAFETY: BAR0 and BAR2 were just assigned inside the PCI MMIO window,
    // which the identity map covers as Device memory; nothing else uses
    // them. The carve-out is RAM above the image (`map`), used by nothing
    // else, and the model reaches it at the same physical addresses (the
    // RAM file is mapped at 0x4000_0000; checked against the info page).
    let io = unsafe { IvshmemGpu::new(bar0, shm, carve, VirtHal { mode }) };
    let (base, size) = io.model_memory().ok_or(BoardError::NoInfoPage)?;
    let (lo, hi) = (map::CARVEOUT as u64, (map::CARVEOUT + map::CARVEOUT_SIZE) as u64);
    if lo < base || hi > base.saturating_add(size) {
        return Err(BoardError::CarveOutOutsideModel { base, size });
    }
    crate::debug!("model memory {:#x} +{:#x}, GPU carve-out {:#x} +{:#x}", base, size, lo, hi - lo);
    // QEMU may not know the model's doorbells yet (it learns them after
    // boot has started): make sure they arrive before the driver rings.
    let rings = io.wait_link(ivshmem::LINK_TIMEOUT_NS).map_err(|_| BoardError::NoDoorbellLink)?;
    if rings > 1 {
        crate::info!("ivshmem: the model answered the control doorbell after {} rings", rings);
    }
    if mode == IrqMode::Msi {
        setup_msix(&ecam, bdf, &bars)?;
    }
    crate::info!(
        "ivshmem at {:02x}.{}: peer {} model peer {}",
        bdf.dev,
        bdf.func,
        io.peer_id(),
        io.model_peer()
    );
    Ok(Gpu { io, bdf, bars })
}
