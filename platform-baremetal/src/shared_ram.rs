//! The refgpu over the shared-RAM binding (`docs/refgpu.md` 2.3, "shared
//! RAM"), as a [`Platform`] + [`DirectIo`](umd_core::platform::DirectIo) for `umd-core`: for a host
//! without PCI (QEMU `mps2-an386`, a Cortex-M4), where the model maps the
//! board's 16 MiB PSRAM as a file and the register page and doorbells live
//! in its last 8 KiB.
//!
//! | call | what happens |
//! | --- | --- |
//! | `read_reg` / `write_reg` | the ivshmem binding's rules ([`umd_core::ivshmem::Binding`]) over the register page at region + 0xFF_E000 |
//! | `doorbell(e)`, `control_doorbell` | atomic add of 1 to DOORBELL(v) in the doorbell page (the model watches the words); an engine that does not exist is refused with `Unsupported` |
//! | `dma_alloc/free` | pages of the region's system memory ([`CarveOut`]), zeroed |
//! | caches | nothing to maintain: the Cortex-M4 has no data cache (the hook is still the [`Hal`]'s) |
//! | `wait_irq` | `Unsupported`: the binding has no interrupt path, the core polls |
//!
//! Liveness: ATTACH must read "RGSR" at bring-up ([`SharedRamGpu::attach`]
//! waits for it a bounded time, then reports that no model is running).
//! Afterwards, in the core's wait loop (`delay_ns`), the core's
//! [`Liveness`] check: ATTACH cleared (the model shut down) or CLOCK frozen
//! for [`SharedRamGpu::loss_window_ns`] (the model was killed) marks the
//! device lost: every register call then fails with
//! [`PlatformError::DeviceLost`].
//!
//! No 64-bit atomics: [`Liveness`] keeps its state under a spin lock, so
//! the type builds for `thumbv7em` (which has 32-bit atomics only).
//!
//! The type is portable (a [`Hal`] and a raw pointer): host tests drive it
//! over an ordinary 16 MiB buffer.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

use embedded_hal::delay::DelayNs;
use umd_core::ivshmem::{device_clock, Binding, Health, Liveness, SharedPage};
use umd_core::platform::{IrqWait, Platform, PlatformError};

use crate::carveout::{CarveOut, DmaPages, NODES};
pub use crate::hal::Hal;

/// The binding's layout (mirrors `refgpu_model::shared_ram`, which the
/// driver does not depend on; a test checks that the two agree).
pub mod layout {
    /// Size of the region (QEMU `mps2-an386` PSRAM).
    pub const REGION_SIZE: usize = 16 << 20;
    /// Its address on `mps2-an386`.
    pub const REGION_BASE: usize = 0x2100_0000;
    /// Offset of the register page.
    pub const REGS_OFFSET: usize = REGION_SIZE - 0x2000;
    /// Offset of the doorbell page.
    pub const BELLS_OFFSET: usize = REGION_SIZE - 0x1000;
    /// System memory: the region below the binding pages.
    pub const MEM_SIZE: usize = REGION_SIZE - 0x2000;
    /// Doorbell page +0x00: ATTACH.
    pub const ATTACH_OFF: usize = 0x00;
    /// ATTACH while a model is attached ("RGSR").
    pub const ATTACH_MAGIC: u32 = u32::from_le_bytes(*b"RGSR");
    /// +0x04: layout version.
    pub const VERSION_OFF: usize = 0x04;
    /// The version this transport speaks.
    pub const VERSION: u32 = 1;
    /// +0x08: system memory size.
    pub const MEM_SIZE_OFF: usize = 0x08;
    /// +0x10: MEM_BASE bits 31:0 (the device address of the region's first
    /// byte); bits 63:32 at +0x14.
    pub const MEM_BASE_OFF: usize = 0x10;
    /// +0x40 + 4 * v: DOORBELL(v).
    pub const DOORBELL_OFF: usize = 0x40;
    /// Doorbell words (three engines, control).
    pub const DOORBELLS: u32 = 4;
}

/// Why [`SharedRamGpu::attach`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AttachError {
    /// ATTACH did not read "RGSR" within the wait: no model is running on
    /// the RAM file (start `refgpu-sim --shared-ram FILE`).
    NoModel {
        /// How long the transport waited, in ms.
        waited_ms: u32,
    },
    /// The doorbell page names another layout version.
    Version(u32),
    /// The model's system memory is not the size this layout has (another
    /// region size?).
    MemSize(u32),
    /// The carve-out's device address does not follow from the model's
    /// MEM_BASE (`docs/refgpu.md` 2.3, "Device addresses"): the model runs
    /// with another `--mem-base` than the one the carve-out assumes.
    MemBase {
        /// MEM_BASE the model published.
        model: u64,
        /// The carve-out's device address.
        carve: u64,
        /// The device address the carve-out's first page has under the
        /// model's MEM_BASE.
        expected: u64,
    },
}

impl core::fmt::Display for AttachError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AttachError::NoModel { waited_ms } => write!(
                f,
                "no model attached to the shared RAM (ATTACH not \"RGSR\" after {waited_ms} ms): \
                 is refgpu-sim --shared-ram running on QEMU's RAM file?"
            ),
            AttachError::Version(v) => write!(f, "shared-RAM layout version {v}, this driver speaks 1"),
            AttachError::MemSize(s) => {
                write!(f, "model system memory is {s:#x} bytes, the layout has {:#x}", layout::MEM_SIZE)
            }
            AttachError::MemBase { model, carve, expected } => write!(
                f,
                "the model's MEM_BASE is {model:#x}: the carve-out's first page is at device address \
                 {expected:#x}, not {carve:#x} (start refgpu-sim with the --mem-base the board uses)"
            ),
        }
    }
}

impl core::error::Error for AttachError {}

/// Default for [`SharedRamGpu::loss_window_ns`]: the spec's loss window.
pub use umd_core::ivshmem::LOSS_WINDOW_NS;

/// The refgpu in a shared RAM region.
pub struct SharedRamGpu<H: Hal, const N: usize = NODES> {
    region: NonNull<AtomicU32>,
    carve: DmaPages<N>,
    hal: H,
    binding: Binding,
    lost: Liveness,
    rung: AtomicU32,
    /// How long CLOCK may stay frozen before the device counts as lost.
    pub loss_window_ns: u64,
}

impl<H: Hal, const N: usize> SharedRamGpu<H, N> {
    /// Waits up to `wait_ns` for a model to attach to the region at
    /// `region` (ATTACH = "RGSR"), checks the layout, and wraps it with
    /// the carve-out `carve` (pages of the region's system memory).
    ///
    /// # Safety
    /// `region` must be the start of the shared RAM region,
    /// [`layout::REGION_SIZE`] bytes, valid for the value's life and
    /// reached by nothing else but the model; the carve-out's pages must lie
    /// in the region's system memory (below [`layout::MEM_SIZE`]) at the
    /// device addresses the model uses for them, and be used by nothing
    /// else.
    pub unsafe fn attach(
        region: NonNull<u32>,
        carve: CarveOut<N>,
        hal: H,
        wait_ns: u64,
    ) -> Result<SharedRamGpu<H, N>, AttachError> {
        let g = SharedRamGpu {
            region: region.cast(),
            // SAFETY: the carve-out's pages are the device's and used by
            // nothing else (the contract above).
            carve: unsafe { DmaPages::new(carve) },
            hal,
            binding: Binding::new(),
            lost: Liveness::new(0, 0),
            rung: AtomicU32::new(0),
            loss_window_ns: LOSS_WINDOW_NS,
        };
        let t0 = g.hal.now_ns();
        loop {
            if g.bell_word(layout::ATTACH_OFF) == layout::ATTACH_MAGIC {
                break;
            }
            let waited = g.hal.now_ns().saturating_sub(t0);
            if waited >= wait_ns {
                return Err(AttachError::NoModel {
                    waited_ms: (waited / 1_000_000).min(u64::from(u32::MAX)) as u32,
                });
            }
            g.hal.delay().delay_ms(1);
        }
        match g.bell_word(layout::VERSION_OFF) {
            layout::VERSION => {}
            v => return Err(AttachError::Version(v)),
        }
        match g.bell_word(layout::MEM_SIZE_OFF) {
            s if s as usize == layout::MEM_SIZE => {}
            s => return Err(AttachError::MemSize(s)),
        }
        let model = u64::from(g.bell_word(layout::MEM_BASE_OFF))
            | (u64::from(g.bell_word(layout::MEM_BASE_OFF + 4)) << 32);
        let (carve_cpu, carve) = g.carve.bases();
        let offset = carve_cpu.wrapping_sub(region.as_ptr() as usize) as u64;
        let expected = model.wrapping_add(offset);
        if expected != carve {
            return Err(AttachError::MemBase { model, carve, expected });
        }
        let lost = Liveness::new(device_clock(&g.reg_page()).unwrap_or(0), g.hal.now_ns());
        Ok(SharedRamGpu { lost, ..g })
    }

    fn word_at(&self, byte_off: usize) -> Option<&AtomicU32> {
        if byte_off >= layout::REGION_SIZE || byte_off % 4 != 0 {
            return None;
        }
        // SAFETY: `attach`'s contract: the region is REGION_SIZE bytes and
        // stays valid; the offset is inside it and dword aligned.
        Some(unsafe { &*self.region.as_ptr().add(byte_off / 4) })
    }

    fn bell_word(&self, off: usize) -> u32 {
        self.word_at(layout::BELLS_OFFSET + off).map_or(0, |w| w.load(Ordering::Acquire))
    }

    /// Whether the device was found lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// Doorbells rung so far (engine and control).
    pub fn doorbells_rung(&self) -> u32 {
        self.rung.load(Ordering::Relaxed)
    }

    /// The hardware half.
    pub fn hal(&self) -> &H {
        &self.hal
    }

    /// Pages of the carve-out in use.
    pub fn dma_pages_used(&self) -> usize {
        self.carve.used_pages()
    }

    /// Checks that the model is still there ([`Liveness::check`]: ATTACH
    /// set and CLOCK moving within the loss window). Marks the device lost
    /// otherwise.
    pub fn check_heartbeat(&self) -> bool {
        let attached = self.bell_word(layout::ATTACH_OFF) == layout::ATTACH_MAGIC;
        let clock = device_clock(&self.reg_page()).unwrap_or(0);
        match self.lost.check(attached, clock, self.hal.now_ns(), self.loss_window_ns) {
            Health::Alive => true,
            Health::Detached => {
                crate::warn!("shared RAM: the model detached (ATTACH cleared): device lost");
                false
            }
            Health::Frozen { clock, for_ns } => {
                crate::warn!(
                    "shared RAM: model heartbeat (CLOCK {:#x}) frozen for {} ms: device lost",
                    clock,
                    for_ns / 1_000_000
                );
                false
            }
            Health::Lost => false,
        }
    }

    /// The register page, as the binding sees it.
    fn reg_page(&self) -> RegPage<'_, H, N> {
        RegPage(self)
    }

    fn ring(&self, vector: u32) -> Result<(), PlatformError> {
        if self.lost.is_lost() {
            return Err(PlatformError::DeviceLost);
        }
        let w = self
            .word_at(layout::BELLS_OFFSET + layout::DOORBELL_OFF + 4 * vector as usize)
            .filter(|_| vector < layout::DOORBELLS)
            .ok_or(PlatformError::Unsupported)?;
        // Ring, register-page and fence writes before the doorbell.
        core::sync::atomic::fence(Ordering::SeqCst);
        w.fetch_add(1, Ordering::Release);
        self.rung.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

// SAFETY: the pointer is the shared region, valid for the value's life
// (`attach`'s contract) and not tied to a thread.
unsafe impl<H: Hal + Send, const N: usize> Send for SharedRamGpu<H, N> {}
// SAFETY: through `&self` the region is touched only with 32-bit atomics,
// the carve-out and the liveness state under their locks; the HAL must be
// `Sync`.
unsafe impl<H: Hal + Sync, const N: usize> Sync for SharedRamGpu<H, N> {}

// SAFETY: every region comes from the carve-out, which never hands a page
// out twice; `attach`'s contract makes those pages ours and reachable by
// the device at the carve-out's device addresses; they are zeroed (and
// cleaned through the HAL) before being returned. `now_ns` is the HAL's
// monotonic clock.
unsafe impl<H: Hal, const N: usize> Platform for SharedRamGpu<H, N> {
    type RawMutex = umd_core::platform::SpinLock;

    crate::transport::carve_out_platform_methods!();

    fn wait_irq(&self, _timeout_ns: u64) -> IrqWait {
        IrqWait::Unsupported
    }
}

crate::transport::binding_direct_io!(SharedRamGpu);

/// The register page inside the region, as the binding sees it.
struct RegPage<'a, H: Hal, const N: usize>(&'a SharedRamGpu<H, N>);

impl<H: Hal, const N: usize> SharedPage for RegPage<'_, H, N> {
    fn word(&self, off: u32) -> Option<&AtomicU32> {
        if off >= 4096 {
            return None;
        }
        self.0.word_at(layout::REGS_OFFSET + off as usize)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;
    use umd_core::hw::regs::{self, engine as er};
    use umd_core::platform::{DirectIo, DmaFlags};

    struct FakeHal {
        t: core::cell::Cell<u64>,
    }

    struct FakeDelay<'a>(&'a core::cell::Cell<u64>);

    impl DelayNs for FakeDelay<'_> {
        fn delay_ns(&mut self, ns: u32) {
            self.0.set(self.0.get() + u64::from(ns));
        }
    }

    impl Hal for FakeHal {
        type Delay<'a> = FakeDelay<'a>;
        fn now_ns(&self) -> u64 {
            self.t.get()
        }
        fn delay(&self) -> FakeDelay<'_> {
            FakeDelay(&self.t)
        }
        fn cache_clean(&self, _addr: usize, _len: usize) {}
        fn cache_invalidate(&self, _addr: usize, _len: usize) {}
    }

    /// A 16 MiB region as u32 words (4-aligned; the carve-out needs page
    /// alignment, so it starts at the first page boundary inside).
    fn region() -> Vec<u32> {
        vec![0u32; layout::REGION_SIZE / 4 + 1024]
    }

    fn w(r: &mut [u32], off: usize) -> &mut u32 {
        &mut r[off / 4]
    }

    fn attached(r: &mut [u32]) {
        *w(r, layout::BELLS_OFFSET + layout::ATTACH_OFF) = layout::ATTACH_MAGIC;
        *w(r, layout::BELLS_OFFSET + layout::VERSION_OFF) = 1;
        *w(r, layout::BELLS_OFFSET + layout::MEM_SIZE_OFF) = layout::MEM_SIZE as u32;
        *w(r, layout::BELLS_OFFSET + layout::MEM_BASE_OFF) = carve_dev(r) as u32;
        *w(r, layout::BELLS_OFFSET + layout::MEM_BASE_OFF + 4) = 0;
    }

    /// The model's MEM_BASE under which the test carve-out (at the first
    /// page boundary of the buffer, device address REGION_BASE) is right.
    fn carve_dev(r: &[u32]) -> u64 {
        let base = r.as_ptr() as usize;
        layout::REGION_BASE as u64 - (base.next_multiple_of(4096) - base) as u64
    }

    fn attach(r: &mut [u32], wait_ns: u64) -> Result<SharedRamGpu<FakeHal>, AttachError> {
        let base = r.as_mut_ptr() as usize;
        let page = base.next_multiple_of(4096);
        let carve = CarveOut::new(page, layout::REGION_BASE as u64, 8 * 4096).unwrap();
        // SAFETY: the buffer outlives the transport in every test and holds
        // REGION_SIZE bytes from `base`; the carve-out's 8 pages lie inside.
        unsafe {
            SharedRamGpu::attach(
                NonNull::new(base as *mut u32).unwrap(),
                carve,
                FakeHal { t: Default::default() },
                wait_ns,
            )
        }
    }

    #[test]
    fn layout_matches_the_models() {
        use refgpu_model::shared_ram as m;
        assert_eq!(layout::REGION_SIZE as u64, m::REGION_SIZE);
        assert_eq!(layout::REGION_BASE as u64, m::REGION_BASE);
        assert_eq!(layout::REGS_OFFSET as u64, m::regs_offset(m::REGION_SIZE));
        assert_eq!(layout::BELLS_OFFSET as u64, m::doorbell_page_offset(m::REGION_SIZE));
        assert_eq!(layout::MEM_SIZE as u64, m::mem_size(m::REGION_SIZE));
        assert_eq!(
            (layout::ATTACH_OFF, layout::ATTACH_MAGIC, layout::VERSION_OFF, layout::VERSION),
            (m::ATTACH_OFF, m::ATTACH_MAGIC, m::VERSION_OFF, m::VERSION)
        );
        assert_eq!(
            (layout::MEM_SIZE_OFF, layout::MEM_BASE_OFF, layout::DOORBELL_OFF),
            (m::MEM_SIZE_OFF, m::MEM_BASE_OFF, m::DOORBELL_OFF)
        );
        assert_eq!(layout::DOORBELLS as usize, m::DOORBELLS);
        // The core's description of the layout is the model's too.
        use umd_core::ivshmem::shared_ram as c;
        assert_eq!(c::regs_offset(layout::REGION_SIZE), layout::REGS_OFFSET);
        assert_eq!(c::doorbell_page_offset(layout::REGION_SIZE), layout::BELLS_OFFSET);
        assert_eq!(
            [c::ATTACH_OFF, c::VERSION_OFF, c::MEM_SIZE_OFF, c::MEM_BASE_OFF, c::DOORBELL_OFF]
                .map(|o| o as usize),
            [m::ATTACH_OFF, m::VERSION_OFF, m::MEM_SIZE_OFF, m::MEM_BASE_OFF, m::DOORBELL_OFF]
        );
        assert_eq!(
            (c::ATTACH_MAGIC, c::VERSION, c::DOORBELLS as usize),
            (m::ATTACH_MAGIC, m::VERSION, m::DOORBELLS)
        );
    }

    #[test]
    fn no_model_is_an_error_after_the_wait() {
        let mut r = region();
        match attach(&mut r, 50_000_000) {
            Err(AttachError::NoModel { waited_ms }) => assert_eq!(waited_ms, 50),
            other => panic!("{:?}", other.map(|_| ())),
        }
        attached(&mut r);
        *w(&mut r, layout::BELLS_OFFSET + layout::VERSION_OFF) = 2;
        assert_eq!(attach(&mut r, 0).err(), Some(AttachError::Version(2)));
        attached(&mut r);
        *w(&mut r, layout::BELLS_OFFSET + layout::MEM_SIZE_OFF) = 0x1000;
        assert_eq!(attach(&mut r, 0).err(), Some(AttachError::MemSize(0x1000)));
        attached(&mut r);
        let right = carve_dev(&r);
        *w(&mut r, layout::BELLS_OFFSET + layout::MEM_BASE_OFF) = 0x6000_0000;
        let e = attach(&mut r, 0).err();
        assert_eq!(
            e,
            Some(AttachError::MemBase {
                model: 0x6000_0000,
                carve: layout::REGION_BASE as u64,
                expected: 0x6000_0000 + (layout::REGION_BASE as u64 - right),
            })
        );
        assert!(std::format!("{}", e.unwrap()).contains("MEM_BASE is 0x60000000"));
    }

    #[test]
    fn registers_and_doorbell_words() {
        let mut r = region();
        attached(&mut r);
        let g = attach(&mut r, 0).unwrap();
        g.write_reg(regs::IRQ_MASK, 0x707).unwrap();
        g.write_reg(regs::engine_reg(1, er::RING_WPTR), 0x40).unwrap();
        g.write_reg(regs::engine_reg(1, er::RING_RPTR), 0x99).unwrap(); // read-only: dropped
        g.doorbell(2).unwrap();
        g.doorbell(2).unwrap();
        g.control_doorbell().unwrap();
        g.write_reg(regs::engine_reg(0, er::DOORBELL), 1).unwrap();
        assert_eq!(g.doorbell(3), Err(PlatformError::Unsupported), "no engine 3");
        assert_eq!(g.doorbell(u32::MAX), Err(PlatformError::Unsupported));
        assert_eq!(g.wait_irq(1000), IrqWait::Unsupported, "polling only");
        assert_eq!(g.doorbells_rung(), 4);
        let reg = |r: &mut [u32], o: u32| *w(r, layout::REGS_OFFSET + o as usize);
        assert_eq!(reg(&mut r, regs::IRQ_MASK), 0x707);
        assert_eq!(reg(&mut r, regs::engine_reg(1, er::RING_WPTR)), 0x40);
        assert_eq!(reg(&mut r, regs::engine_reg(1, er::RING_RPTR)), 0);
        let bells: Vec<u32> =
            (0..4).map(|v| *w(&mut r, layout::BELLS_OFFSET + layout::DOORBELL_OFF + 4 * v)).collect();
        assert_eq!(bells, [1, 0, 2, 1], "engine 0 once, engine 2 twice, control once, nothing else");
        // Nothing written outside the two binding words touched.
        assert_eq!(*w(&mut r, layout::BELLS_OFFSET + layout::DOORBELL_OFF + 16), 0);
    }

    #[test]
    fn dma_pages_are_device_addressed_and_bounded() {
        let mut r = region();
        attached(&mut r);
        let g = attach(&mut r, 0).unwrap();
        let a = g.dma_alloc(100, DmaFlags::CPU).unwrap();
        assert_eq!((a.dev_addr(), a.len()), (layout::REGION_BASE as u64, 4096));
        assert_eq!(
            g.dma_alloc(8 * 4096, DmaFlags::CPU).err(),
            Some(PlatformError::OutOfMemory { len: 8 * 4096 })
        );
        g.dma_free(a);
        assert_eq!(g.dma_pages_used(), 0);
    }

    #[test]
    fn detach_or_frozen_clock_means_device_lost() {
        let mut r = region();
        attached(&mut r);
        let g = attach(&mut r, 0).unwrap();
        g.delay_ns(LOSS_WINDOW_NS / 2);
        assert!(!g.is_lost());
        g.delay_ns(LOSS_WINDOW_NS);
        assert!(g.is_lost(), "CLOCK frozen past the window");
        assert_eq!(g.read_reg(regs::ID), Err(PlatformError::DeviceLost));
        assert_eq!(g.doorbell(0), Err(PlatformError::DeviceLost));

        let g = attach(&mut r, 0).unwrap();
        // The model side clears ATTACH.
        g.word_at(layout::BELLS_OFFSET).unwrap().store(0, Ordering::Release);
        g.delay_ns(1000);
        assert!(g.is_lost(), "ATTACH cleared: lost at once");
        assert_eq!(g.write_reg(regs::IRQ_MASK, 1), Err(PlatformError::DeviceLost));
    }
}
