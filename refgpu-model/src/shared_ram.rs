//! The shared-RAM binding's layout (`docs/refgpu.md` 2.3, "shared RAM"):
//! a RAM region both sides map (QEMU `mps2-an386`'s PSRAM), system memory
//! first, then the register page and the doorbell page in its last 8 KiB.
//! The model's side (`refgpu-sim --shared-ram`) uses these constants; the
//! host's side mirrors them (the driver does not depend on the model).

/// Size of the region: QEMU's `mps2-an386` PSRAM, which its
/// `memory-backend-file` must match exactly.
pub const REGION_SIZE: u64 = 16 << 20;
/// Physical address of the region on `mps2-an386`.
pub const REGION_BASE: u64 = 0x2100_0000;
/// Offset of the register page from the region's start, for a region of
/// `size` bytes.
pub const fn regs_offset(size: u64) -> u64 {
    size - 0x2000
}
/// Offset of the doorbell page from the region's start.
pub const fn doorbell_page_offset(size: u64) -> u64 {
    size - 0x1000
}
/// System memory the model sees: the region minus the binding pages.
pub const fn mem_size(size: u64) -> u64 {
    size - 0x2000
}
/// u32 at +0x00 of the doorbell page: ATTACH.
pub const ATTACH_OFF: usize = 0x00;
/// ATTACH while a model is attached: the bytes "RGSR".
pub const ATTACH_MAGIC: u32 = u32::from_le_bytes(*b"RGSR");
/// u32 at +0x04: layout version.
pub const VERSION_OFF: usize = 0x04;
/// The layout version described here.
pub const VERSION: u32 = 1;
/// u32 at +0x08: bytes of system memory.
pub const MEM_SIZE_OFF: usize = 0x08;
/// u32 at +0x10: MEM_BASE bits 31:0 (the device address of the region's
/// first byte); bits 63:32 at +0x14.
pub const MEM_BASE_OFF: usize = 0x10;
/// u32 at +0x40 + 4 * v: DOORBELL(v), a counter the host increments.
pub const DOORBELL_OFF: usize = 0x40;
/// Doorbell words: three engines and the control doorbell.
pub const DOORBELLS: usize = 4;

/// The model's doorbell watching schedule: how long to wait before the
/// next look at the doorbell words, given how long they have been quiet
/// (`None`: busy re-read). The spec's figures: spin for 50 µs after a
/// doorbell, then 10 µs sleeps until 1 ms of quiet, 100 µs until 100 ms,
/// then 1 ms.
pub fn watch_interval(quiet: core::time::Duration) -> Option<core::time::Duration> {
    use core::time::Duration;
    if quiet < Duration::from_micros(50) {
        None
    } else if quiet < Duration::from_millis(1) {
        Some(Duration::from_micros(10))
    } else if quiet < Duration::from_millis(100) {
        Some(Duration::from_micros(100))
    } else {
        Some(Duration::from_millis(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;

    #[test]
    fn layout_of_the_16_mib_region() {
        assert_eq!(regs_offset(REGION_SIZE), 0xFF_E000);
        assert_eq!(doorbell_page_offset(REGION_SIZE), 0xFF_F000);
        assert_eq!(mem_size(REGION_SIZE), 0xFF_E000);
        assert_eq!(ATTACH_MAGIC, 0x5253_4752);
        assert_eq!(REGION_BASE + regs_offset(REGION_SIZE), 0x21FF_E000);
    }

    #[test]
    fn watch_schedule_backs_off() {
        let at = |us| watch_interval(Duration::from_micros(us));
        assert_eq!(at(0), None);
        assert_eq!(at(49), None);
        assert_eq!(at(50), Some(Duration::from_micros(10)));
        assert_eq!(at(999), Some(Duration::from_micros(10)));
        assert_eq!(at(1_000), Some(Duration::from_micros(100)));
        assert_eq!(at(99_999), Some(Duration::from_micros(100)));
        assert_eq!(at(100_000), Some(Duration::from_millis(1)));
        assert_eq!(at(10_000_000), Some(Duration::from_millis(1)));
    }
}
