//! Board bring-up on `mps2-an386`: the [`Hal`] of the shared-RAM transport
//! (SysTick time, no caches), the GPU carve-out in the PSRAM, the check
//! that the configured pools fit it, and the attach to the model.

use core::ptr::NonNull;

use umd_core::direct::{DoesNotFit, MemoryPlan};

use crate::carveout::CarveOut;
use crate::shared_ram::{layout, AttachError, Hal, SharedRamGpu};

/// The CPU half of the transport on the M4.
#[derive(Clone, Copy, Debug, Default)]
pub struct MpsHal;

impl Hal for MpsHal {
    type Delay<'a> = crate::arch::timer::Delay;

    fn now_ns(&self) -> u64 {
        crate::arch::timer::now_ns()
    }

    fn delay(&self) -> crate::arch::timer::Delay {
        crate::arch::timer::Delay
    }

    /// No data cache on the Cortex-M4: writes reach the PSRAM as issued.
    fn cache_clean(&self, _addr: usize, _len: usize) {}

    /// No data cache on the Cortex-M4: reads see the PSRAM.
    fn cache_invalidate(&self, _addr: usize, _len: usize) {}
}

/// How long bring-up waits for a model to attach (a failure guard).
pub const ATTACH_WAIT_NS: u64 = 3_000_000_000;

/// Why bring-up failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoardError {
    /// The carve-out is larger than the PSRAM's system memory or not page
    /// aligned.
    CarveOut(usize),
    /// The configured pools do not fit the carve-out (named).
    CarveOutTooSmall(DoesNotFit),
    /// No model, or a model with another layout.
    Attach(AttachError),
}

impl core::fmt::Display for BoardError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BoardError::CarveOut(n) => {
                write!(f, "a GPU carve-out of {n:#x} bytes does not fit the PSRAM's {:#x}", layout::MEM_SIZE)
            }
            BoardError::CarveOutTooSmall(e) => {
                write!(f, "GPU carve-out too small for the configured pools: {e}")
            }
            BoardError::Attach(e) => write!(f, "{e}"),
        }
    }
}

/// Checks that `plan` fits a carve-out of `carve_bytes` at the start of
/// the PSRAM, waits for the model (up to [`ATTACH_WAIT_NS`]) and returns
/// the transport. Call once.
pub fn bring_up(carve_bytes: usize, plan: &MemoryPlan) -> Result<SharedRamGpu<MpsHal>, BoardError> {
    if carve_bytes > layout::MEM_SIZE || carve_bytes % crate::carveout::PAGE != 0 {
        return Err(BoardError::CarveOut(carve_bytes));
    }
    plan.check(carve_bytes).map_err(BoardError::CarveOutTooSmall)?;
    let carve = CarveOut::new(layout::REGION_BASE, layout::REGION_BASE as u64, carve_bytes)
        .ok_or(BoardError::CarveOut(carve_bytes))?;
    let region = NonNull::new(layout::REGION_BASE as *mut u32).ok_or(BoardError::CarveOut(carve_bytes))?;
    // SAFETY: the PSRAM at REGION_BASE is REGION_SIZE bytes of RAM that
    // QEMU maps from the shared file; the image's link map places nothing
    // there (memory.x uses SSRAM1 and SSRAM2/3 only), so the model and
    // this transport are its only users. The carve-out covers the first
    // `carve_bytes` (checked <= MEM_SIZE) at the same device addresses:
    // the model's system memory starts at REGION_BASE.
    let g =
        unsafe { SharedRamGpu::attach(region, carve, MpsHal, ATTACH_WAIT_NS) }.map_err(BoardError::Attach)?;
    crate::info!(
        "shared RAM: model attached, GPU carve-out {:#x} +{:#x}, plan {} bytes",
        layout::REGION_BASE,
        carve_bytes,
        plan.total()
    );
    Ok(g)
}
