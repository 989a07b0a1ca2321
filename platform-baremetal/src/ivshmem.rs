//! The refgpu over QEMU's `ivshmem-doorbell` device (`docs/refgpu.md` 2.3),
//! as a [`Platform`] + [`DirectIo`] for `umd-core`.
//!
//! | call | what happens |
//! | --- | --- |
//! | `read_reg` | 32-bit atomic load from the register page (BAR2 offset 0); CLOCK_LO reads HI, LO, HI until HI is stable and latches HI for the next CLOCK_HI read; DOORBELL reads 0 |
//! | `write_reg` | 32-bit atomic store to the RW registers; IRQ_STATUS (write-1-to-clear for the core) becomes an atomic AND of the complement; a DOORBELL write rings that engine's vector; writes to read-only registers are dropped (on a plain shared page they would clobber the model's state) |
//! | `doorbell(e)` | BAR0 offset 12 ← `(model_peer << 16) \| e` |
//! | `control_doorbell` | the same with vector 3 |
//! | `wait_link` (once, before use) | MMU_INVALIDATE ← 1 and the control doorbell, rung again every millisecond until the model clears the register (QEMU drops doorbells until it has the model's eventfds) |
//! | `dma_alloc/free` | pages of the RAM carve-out ([`CarveOut`]), zeroed and cleaned to memory |
//! | `cache_*`, time, `wait_irq` | the [`Hal`] (on aarch64: `dc cvac`/`dc civac` by line, the generic timer, `wfi` on the GICv2m MSI); delays through the board's `embedded_hal::delay::DelayNs` |
//!
//! Device loss: the model publishes CLOCK every 100 µs while it lives. When
//! the core sits in `delay_ns` or `wait_irq` (its wait loop), the transport
//! runs the core's [`Liveness`] check (ivshmem has no attach word: only
//! CLOCK counts); a CLOCK frozen for [`IvshmemGpu::loss_window_ns`]
//! marks the device lost, and every register call from then on fails with
//! [`PlatformError::DeviceLost`] (the core turns that into failed fences).
//!
//! The type is portable: the hardware half is the [`Hal`] and two raw
//! pointers, so host tests drive it over an ordinary page.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

use embedded_hal::delay::DelayNs;
use safe_mmio::fields::{ReadPure, ReadWrite, WriteOnly};
use safe_mmio::{field, UniqueMmioPointer};

use umd_core::hw::regs;
use umd_core::ivshmem::{device_clock, Binding, Health, Liveness, SharedPage};
use umd_core::platform::{DirectIo, IrqWait, Platform, PlatformError};

use crate::carveout::{CarveOut, DmaPages, NODES};

/// PCI IDs of QEMU's ivshmem device.
pub const VENDOR_ID: u16 = 0x1af4;
/// Device ID (ivshmem-plain and ivshmem-doorbell share it).
pub const DEVICE_ID: u16 = 0x1110;

/// BAR0 of the ivshmem device: four 32-bit registers (QEMU's ivshmem
/// specification), accessed through `safe-mmio`.
#[repr(C)]
#[derive(Debug)]
pub struct Bar0Regs {
    /// Interrupt mask (INTx mode only).
    pub intr_mask: ReadWrite<u32>,
    /// Interrupt status (INTx mode only).
    pub intr_status: ReadWrite<u32>,
    /// Our peer id (IVPosition).
    pub iv_position: ReadPure<u32>,
    /// Doorbell: write `(peer << 16) | vector`.
    pub doorbell: WriteOnly<u32>,
}

/// The binding info page `refgpu-sim` writes at offset 0x1000 of the
/// shared memory (mirrors `refgpu_sim::proto::info`).
pub mod info {
    /// Offset of the page in the shared memory.
    pub const OFFSET: usize = 0x1000;
    /// u32 magic "RGSI".
    pub const MAGIC: u32 = u32::from_le_bytes(*b"RGSI");
    /// u32: eventfds (vectors) per peer.
    pub const VECTORS_OFF: usize = 0x08;
    /// u32: the model's peer id.
    pub const MODEL_ID_OFF: usize = 0x0C;
    /// u64: physical base of system memory the model sees.
    pub const MEM_BASE_OFF: usize = 0x10;
    /// u64: size of that memory.
    pub const MEM_SIZE_OFF: usize = 0x18;
}

pub use crate::hal::Hal;

/// The refgpu behind an ivshmem-doorbell device.
pub struct IvshmemGpu<H: Hal, const N: usize = NODES> {
    /// BAR0; the lock makes the `&self` doorbell the pointer's one user.
    bar0: spin::Mutex<UniqueMmioPointer<'static, Bar0Regs>>,
    page: NonNull<AtomicU32>,
    model_peer: u32,
    carve: DmaPages<N>,
    hal: H,
    binding: Binding,
    lost: Liveness,
    /// How long CLOCK may stay frozen before the device counts as lost.
    pub loss_window_ns: u64,
}

/// Default for [`IvshmemGpu::loss_window_ns`]: the spec's loss window.
pub use umd_core::ivshmem::LOSS_WINDOW_NS;

/// How long [`IvshmemGpu::wait_link`] waits for an answer before it rings
/// the control doorbell again.
pub const LINK_RETRY_NS: u64 = 1_000_000;

/// A sensible limit for [`IvshmemGpu::wait_link`]: 5 s (a failure guard).
pub const LINK_TIMEOUT_NS: u64 = 5_000_000_000;

impl<H: Hal, const N: usize> IvshmemGpu<H, N> {
    /// Wraps an ivshmem-doorbell device whose BAR0 registers are at `bar0`
    /// and whose shared memory (register page, then the info page) is at
    /// `shm`. The model's peer id comes from the info page when present
    /// (else 0).
    ///
    /// # Safety
    /// `bar0` must map the device's BAR0 (16 bytes at least) and `shm` its
    /// BAR2 (8 KiB at least), both valid for the life of the value and
    /// used by nothing else; the carve-out's pages must be memory the
    /// device reaches at the carve-out's device addresses and that nothing
    /// else uses.
    pub unsafe fn new(bar0: NonNull<u32>, shm: NonNull<u32>, carve: CarveOut<N>, hal: H) -> IvshmemGpu<H, N> {
        let mut g = IvshmemGpu {
            // SAFETY: the contract above: BAR0 is mapped for 16 bytes (the
            // four registers of `Bar0Regs`), 4-aligned, and only this value
            // accesses it.
            bar0: spin::Mutex::new(unsafe { UniqueMmioPointer::new(bar0.cast::<Bar0Regs>()) }),
            page: shm.cast(),
            model_peer: 0,
            // SAFETY: the carve-out's pages are the device's and used by
            // nothing else (the contract above).
            carve: unsafe { DmaPages::new(carve) },
            hal,
            binding: Binding::new(),
            lost: Liveness::new(0, 0),
            loss_window_ns: LOSS_WINDOW_NS,
        };
        if g.shm_word(info::OFFSET) == info::MAGIC {
            g.model_peer = g.shm_word(info::OFFSET + info::MODEL_ID_OFF) & 0xffff;
        }
        g.lost = Liveness::new(0, g.hal.now_ns());
        g
    }

    fn shm_word(&self, byte_off: usize) -> u32 {
        // SAFETY: `new`'s contract: the shared memory is at least 8 KiB;
        // callers pass offsets below that, dword aligned.
        unsafe { (*self.page.as_ptr().add(byte_off / 4)).load(Ordering::Acquire) }
    }

    /// Our ivshmem peer id (IVPosition).
    pub fn peer_id(&self) -> u32 {
        let mut regs = self.bar0.lock();
        field!(*regs, iv_position).read()
    }

    /// The model's peer id.
    pub fn model_peer(&self) -> u32 {
        self.model_peer
    }

    /// System memory the model sees (base, size), from the info page.
    pub fn model_memory(&self) -> Option<(u64, u64)> {
        if self.shm_word(info::OFFSET) != info::MAGIC {
            return None;
        }
        let d = |o| {
            u64::from(self.shm_word(info::OFFSET + o))
                | (u64::from(self.shm_word(info::OFFSET + o + 4)) << 32)
        };
        Some((d(info::MEM_BASE_OFF), d(info::MEM_SIZE_OFF)))
    }

    /// Whether the device was found lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// The hardware half.
    pub fn hal(&self) -> &H {
        &self.hal
    }

    /// Pages of the carve-out in use.
    pub fn dma_pages_used(&self) -> usize {
        self.carve.used_pages()
    }

    /// The register page, as the binding sees it.
    fn reg_page(&self) -> RegPage {
        RegPage(self.page)
    }

    fn ring(&self, vector: u32) -> Result<(), PlatformError> {
        if self.lost.is_lost() {
            return Err(PlatformError::DeviceLost);
        }
        // Make the register-page and ring writes visible before the model
        // wakes (the doorbell is a Device-memory store).
        core::sync::atomic::fence(Ordering::SeqCst);
        let mut regs = self.bar0.lock();
        field!(*regs, doorbell).write((self.model_peer << 16) | vector);
        Ok(())
    }

    /// Waits until the model takes this host's doorbells; returns how many
    /// control doorbells that took (1 when the first was answered).
    ///
    /// QEMU learns the model's doorbell eventfds from the server after the
    /// device is realized, in its main loop, and silently drops a doorbell
    /// rung to a peer whose eventfds it does not have yet
    /// (`docs/refgpu.md` section 2.3, "link-up"): a guest that rings before
    /// then loses the doorbell. The probe writes MMU_INVALIDATE = 1 and
    /// rings the control doorbell, again every [`LINK_RETRY_NS`], until the
    /// model has cleared the register; an invalidation changes no state,
    /// so applying it twice is harmless. The control doorbell is the
    /// model's last vector, whose eventfd the server sends after the
    /// engines', so once it is answered every doorbell reaches the model.
    /// Call it once after [`IvshmemGpu::new`], before the device is used.
    ///
    /// # Errors
    ///
    /// [`PlatformError::DeviceLost`] when the model did not answer within
    /// `timeout_ns` (or the device was already lost).
    pub fn wait_link(&self, timeout_ns: u64) -> Result<u32, PlatformError> {
        self.write_reg(regs::MMU_INVALIDATE, 1)?;
        let start = self.hal.now_ns();
        let mut rings = 0u32;
        loop {
            self.ring(regs::CONTROL_VECTOR)?;
            rings = rings.saturating_add(1);
            let again = self.hal.now_ns().saturating_add(LINK_RETRY_NS);
            loop {
                if self.read_reg(regs::MMU_INVALIDATE)? & 1 == 0 {
                    return Ok(rings);
                }
                let now = self.hal.now_ns();
                if now.saturating_sub(start) > timeout_ns {
                    return Err(PlatformError::DeviceLost);
                }
                if now >= again {
                    break;
                }
                self.hal.delay().delay_ns(10_000);
            }
        }
    }

    /// Checks the model's heartbeat ([`Liveness::check`]: CLOCK moving);
    /// marks the device lost when it stood still for longer than the loss
    /// window.
    pub fn check_heartbeat(&self) -> bool {
        let clock = device_clock(&self.reg_page()).unwrap_or(0);
        match self.lost.check(true, clock, self.hal.now_ns(), self.loss_window_ns) {
            Health::Alive => true,
            Health::Frozen { clock, for_ns } => {
                crate::warn!(
                    "ivshmem: model heartbeat (CLOCK {:#x}) frozen for {} ms: device lost",
                    clock,
                    for_ns / 1_000_000
                );
                false
            }
            Health::Detached | Health::Lost => false,
        }
    }
}

// SAFETY: the raw pointers are the device's BAR0 registers and the shared
// register page, valid for the transport's life (`new`'s contract) and
// reachable from any CPU; nothing about them is tied to a thread.
unsafe impl<H: Hal + Send, const N: usize> Send for IvshmemGpu<H, N> {}
// SAFETY: through `&self` the register page is only touched with atomics,
// BAR0 with single volatile stores (the doorbell) and loads, the carve-out
// under its lock, the loss state with atomics; the HAL must be `Sync`.
unsafe impl<H: Hal + Sync, const N: usize> Sync for IvshmemGpu<H, N> {}

// SAFETY: every region comes from the carve-out, which never hands a page
// out twice; `new`'s contract makes those pages ours and reachable by the
// device at the carve-out's device addresses; they are zeroed and cleaned
// before being returned. `now_ns` is the HAL's monotonic clock.
unsafe impl<H: Hal, const N: usize> Platform for IvshmemGpu<H, N> {
    type RawMutex = umd_core::platform::SpinLock;

    crate::transport::carve_out_platform_methods!();

    fn wait_irq(&self, timeout_ns: u64) -> IrqWait {
        if !self.check_heartbeat() {
            return IrqWait::Interrupt; // the next register access reports the loss
        }
        // Wake at least every 10 ms to look at the heartbeat.
        let r = self.hal.wait_irq(timeout_ns.min(10_000_000));
        self.check_heartbeat();
        match r {
            IrqWait::TimedOut if timeout_ns > 10_000_000 => IrqWait::Interrupt, // the core re-checks and waits again
            r => r,
        }
    }
}

crate::transport::binding_direct_io!(IvshmemGpu);

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::boxed::Box;
    use std::vec::Vec;
    use umd_core::hw::regs::engine as er;
    use umd_core::platform::{DirectIo, DmaFlags};

    struct FakeHal {
        t: core::cell::Cell<u64>,
        cleaned: core::cell::RefCell<Vec<(usize, usize)>>,
        /// A fake model: from this time on, it clears MMU_INVALIDATE (the
        /// word behind the pointer) as if a doorbell reached it.
        link_up: core::cell::Cell<Option<(u64, NonNull<AtomicU32>)>>,
    }

    /// Advances the fake clock instead of waiting.
    struct FakeDelay<'a>(&'a FakeHal);

    impl DelayNs for FakeDelay<'_> {
        fn delay_ns(&mut self, ns: u32) {
            let t = self.0.t.get() + u64::from(ns);
            self.0.t.set(t);
            if let Some((at, word)) = self.0.link_up.get() {
                if t >= at {
                    // SAFETY: the test's page outlives the transport.
                    unsafe { word.as_ref() }.store(0, Ordering::SeqCst);
                }
            }
        }
    }

    impl Hal for FakeHal {
        type Delay<'a> = FakeDelay<'a>;
        fn now_ns(&self) -> u64 {
            self.t.get()
        }
        fn delay(&self) -> FakeDelay<'_> {
            FakeDelay(self)
        }
        fn cache_clean(&self, addr: usize, len: usize) {
            self.cleaned.borrow_mut().push((addr, len));
        }
        fn cache_invalidate(&self, _addr: usize, _len: usize) {}
    }

    #[repr(align(4096))]
    struct Pages([u32; 4096]);

    fn gpu(shm: &mut Pages, bar0: &mut [u32; 4], dma: &mut Pages) -> IvshmemGpu<FakeHal> {
        shm.0[info::OFFSET / 4] = info::MAGIC;
        shm.0[(info::OFFSET + info::MODEL_ID_OFF) / 4] = 7;
        let base = dma.0.as_mut_ptr() as usize;
        let carve = CarveOut::new(base, 0x4100_0000, 4 * 4096).unwrap();
        // SAFETY: all three live for the test, used through `g` only.
        unsafe {
            IvshmemGpu::new(
                NonNull::new(bar0.as_mut_ptr()).unwrap(),
                NonNull::new(shm.0.as_mut_ptr()).unwrap(),
                carve,
                FakeHal { t: Default::default(), cleaned: Default::default(), link_up: Default::default() },
            )
        }
    }

    #[test]
    fn registers_doorbells_and_irq_status() {
        let mut shm = Box::new(Pages([0; 4096]));
        let mut bar0 = [0u32; 4];
        let mut dma = Box::new(Pages([0; 4096]));
        let g = gpu(&mut shm, &mut bar0, &mut dma);
        assert_eq!(g.model_peer(), 7);
        g.write_reg(regs::IRQ_MASK, 0x707).unwrap();
        g.write_reg(regs::engine_reg(1, er::RING_WPTR), 0x40).unwrap();
        g.write_reg(regs::engine_reg(1, er::RING_RPTR), 0x99).unwrap(); // read-only: dropped
        g.doorbell(2).unwrap();
        g.control_doorbell().unwrap();
        g.write_reg(regs::engine_reg(0, er::DOORBELL), 1).unwrap();
        drop(g);
        assert_eq!(shm.0[regs::IRQ_MASK as usize / 4], 0x707);
        assert_eq!(shm.0[regs::engine_reg(1, er::RING_WPTR) as usize / 4], 0x40);
        assert_eq!(shm.0[regs::engine_reg(1, er::RING_RPTR) as usize / 4], 0);
        assert_eq!(bar0[3], 7 << 16, "the last ring was engine 0's DOORBELL write");
        shm.0[regs::IRQ_STATUS as usize / 4] = 0x105;
        let g = gpu(&mut shm, &mut bar0, &mut dma);
        g.write_reg(regs::IRQ_STATUS, 0x101).unwrap();
        drop(g);
        assert_eq!(shm.0[regs::IRQ_STATUS as usize / 4], 0x004, "atomic AND of the complement");
    }

    #[test]
    fn dma_is_zeroed_cleaned_and_freed() {
        let mut shm = Box::new(Pages([0; 4096]));
        let mut bar0 = [0u32; 4];
        let mut dma = Box::new(Pages([0xffff_ffff; 4096]));
        let base = dma.0.as_ptr() as usize;
        let g = gpu(&mut shm, &mut bar0, &mut dma);
        let r = g.dma_alloc(100, DmaFlags::CPU).unwrap();
        assert_eq!((r.dev_addr(), r.len()), (0x4100_0000, 4096));
        assert!(r.words().iter().all(|&w| w == 0));
        assert_eq!(*g.hal().cleaned.borrow(), [(base, 4096)]);
        assert!(g.dma_alloc(4 * 4096, DmaFlags::CPU).is_err());
        g.dma_free(r);
        assert_eq!(g.dma_pages_used(), 0);
    }

    #[test]
    fn link_probe_rings_until_the_model_answers() {
        let mut shm = Box::new(Pages([0; 4096]));
        let mut bar0 = [0u32; 4];
        let mut dma = Box::new(Pages([0; 4096]));
        let inv = NonNull::from(&shm.0[regs::MMU_INVALIDATE as usize / 4]).cast::<AtomicU32>();
        let g = gpu(&mut shm, &mut bar0, &mut dma);
        // Doorbells before 3.5 ms are lost (QEMU has not the eventfds yet).
        g.hal().link_up.set(Some((3_500_000, inv)));
        assert_eq!(g.wait_link(LINK_TIMEOUT_NS), Ok(4), "rung at 0, 1, 2 and 3 ms");
        drop(g);
        assert_eq!(bar0[3], (7 << 16) | regs::CONTROL_VECTOR, "the control doorbell of the model's peer");
    }

    #[test]
    fn link_probe_without_a_model_is_device_lost() {
        let mut shm = Box::new(Pages([0; 4096]));
        let mut bar0 = [0u32; 4];
        let mut dma = Box::new(Pages([0; 4096]));
        let g = gpu(&mut shm, &mut bar0, &mut dma);
        assert_eq!(g.wait_link(20_000_000), Err(PlatformError::DeviceLost));
        assert!((20_000_000..21_000_000).contains(&g.hal().t.get()), "gave up at the limit");
        drop(g);
        assert_eq!(shm.0[regs::MMU_INVALIDATE as usize / 4], 1, "nobody answered");
    }

    #[test]
    fn frozen_clock_means_device_lost() {
        let mut shm = Box::new(Pages([0; 4096]));
        let mut bar0 = [0u32; 4];
        let mut dma = Box::new(Pages([0; 4096]));
        let g = gpu(&mut shm, &mut bar0, &mut dma);
        // The fake page's CLOCK never moves.
        for _ in 0..3 {
            g.delay_ns(LOSS_WINDOW_NS);
        }
        assert!(g.is_lost());
        assert_eq!(g.hal().t.get(), 3 * LOSS_WINDOW_NS, "each delay waited its whole length");
        assert_eq!(g.read_reg(regs::ID), Err(PlatformError::DeviceLost));
        assert_eq!(g.doorbell(0), Err(PlatformError::DeviceLost));
    }
}

/// The register page at the start of BAR2, as the binding sees it.
#[derive(Clone, Copy)]
struct RegPage(NonNull<AtomicU32>);

impl SharedPage for RegPage {
    fn word(&self, off: u32) -> Option<&AtomicU32> {
        if off >= 4096 || off % 4 != 0 {
            return None;
        }
        // SAFETY: the offset lies in the 4 KiB register page at the start of
        // the shared memory (contract of `IvshmemGpu::new`), dword aligned;
        // the page outlives the platform that holds the pointer.
        Some(unsafe { &*self.0.as_ptr().add(off as usize / 4) })
    }
}
