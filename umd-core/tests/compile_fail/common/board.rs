// A platform that is never run: the files here only have to type-check
// (or fail to, at the line their `.stderr` names). Not the scripted fake
// (`umd_core::platform::fake`): nothing here runs, so no device need be
// behind the platform, and the expected compiler output names this type.
use umd_core::platform::{DirectIo, DmaFlags, DmaRegion, Platform, PlatformError};

pub struct Board;

// SAFETY: never called; the files only type-check.
unsafe impl Platform for Board {
    type RawMutex = umd_core::platform::SpinLock;
    fn dma_alloc(&self, _: usize, _: DmaFlags) -> Result<DmaRegion, PlatformError> {
        Err(PlatformError::Unsupported)
    }
    fn dma_free(&self, _: DmaRegion) {}
    fn now_ns(&self) -> u64 {
        0
    }
    fn delay_ns(&self, _: u64) {}
}

impl DirectIo for Board {
    fn read_reg(&self, _: u32) -> Result<u32, PlatformError> {
        Err(PlatformError::Unsupported)
    }
    fn write_reg(&self, _: u32, _: u32) -> Result<(), PlatformError> {
        Err(PlatformError::Unsupported)
    }
    fn doorbell(&self, _: u32) -> Result<(), PlatformError> {
        Err(PlatformError::Unsupported)
    }
}
