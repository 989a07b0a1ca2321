//! What the two shared-memory transports ([`crate::ivshmem`],
//! [`crate::shared_ram`]) have in common, written once and expanded into
//! each one's trait implementations:
//!
//! - [`carve_out_platform_methods`]: the `Platform` methods other than
//!   `wait_irq` (DMA pages from the carve-out, cache maintenance and the
//!   clock through the [`Hal`](crate::hal::Hal), a delay that checks the
//!   model's heartbeat);
//! - [`binding_direct_io`]: the whole `DirectIo` implementation (registers
//!   through the ivshmem binding's rules, refused once the device is lost;
//!   doorbells rung by the transport).
//!
//! Macros rather than a shared inner type: `Platform` and `DirectIo` are
//! the core's traits, implemented once per transport type, and forwarding
//! each method to an inner value would write every method again.

/// The `Platform` methods `dma_alloc`, `dma_free`, `cache_clean`,
/// `cache_invalidate`, `now_ns` and `delay_ns`, for use inside
/// `unsafe impl<H: Hal> Platform for T<H>` of a transport `T` with fields
/// `carve: DmaPages` and `hal: H` and a method
/// `check_heartbeat(&self) -> bool`.
///
/// - `dma_alloc`/`dma_free`: pages of the carve-out, zeroed and cleaned
///   through the HAL before they are handed out (the flags ask for nothing
///   the carve-out does not give);
/// - `cache_clean`/`cache_invalidate`: the HAL's maintenance of the
///   region's CPU range, clamped to the region;
/// - `now_ns`: the HAL's monotonic clock;
/// - `delay_ns`: the HAL's delay, then a heartbeat check (the core's wait
///   loop is where a lost device is noticed).
macro_rules! carve_out_platform_methods {
    () => {
        fn dma_alloc(
            &self,
            len: usize,
            _flags: ::umd_core::platform::DmaFlags,
        ) -> Result<::umd_core::platform::DmaRegion, ::umd_core::platform::PlatformError> {
            self.carve.alloc(len, |cpu, len| self.hal.cache_clean(cpu, len))
        }

        fn dma_free(&self, region: ::umd_core::platform::DmaRegion) {
            self.carve.free(region);
        }

        fn cache_clean(&self, region: &::umd_core::platform::DmaRegion, offset: usize, len: usize) {
            if let Some((addr, len)) = $crate::carveout::cache_span(region, offset, len) {
                self.hal.cache_clean(addr, len);
            }
        }

        fn cache_invalidate(&self, region: &::umd_core::platform::DmaRegion, offset: usize, len: usize) {
            if let Some((addr, len)) = $crate::carveout::cache_span(region, offset, len) {
                self.hal.cache_invalidate(addr, len);
            }
        }

        fn now_ns(&self) -> u64 {
            self.hal.now_ns()
        }

        fn delay_ns(&self, ns: u64) {
            $crate::hal::delay_ns(&self.hal, ns);
            self.check_heartbeat();
        }
    };
}
pub(crate) use carve_out_platform_methods;

/// `impl<H: Hal, const N: usize> DirectIo for $transport<H, N>`, for a transport with fields
/// `lost: Liveness` and `binding: Binding` and methods
/// `reg_page(&self) -> impl SharedPage` (its register page) and
/// `ring(&self, vector: u32) -> Result<(), PlatformError>` (rings a
/// doorbell vector of the model):
///
/// - `read_reg`/`write_reg`: [`PlatformError::DeviceLost`] once the device
///   is lost, else the binding's rules on the register page; a write the
///   binding turns into a doorbell rings that vector;
/// - `doorbell(e)`: vector `e`, an engine that does not exist refused with
///   [`PlatformError::Unsupported`]; `control_doorbell`: the control vector.
///
/// [`PlatformError::DeviceLost`]: umd_core::platform::PlatformError::DeviceLost
/// [`PlatformError::Unsupported`]: umd_core::platform::PlatformError::Unsupported
macro_rules! binding_direct_io {
    ($transport:ident) => {
        impl<H: $crate::hal::Hal, const N: usize> ::umd_core::platform::DirectIo for $transport<H, N> {
            fn read_reg(&self, offset: u32) -> Result<u32, ::umd_core::platform::PlatformError> {
                if self.lost.is_lost() {
                    return Err(::umd_core::platform::PlatformError::DeviceLost);
                }
                self.binding.read(&self.reg_page(), offset)
            }

            fn write_reg(&self, offset: u32, value: u32) -> Result<(), ::umd_core::platform::PlatformError> {
                if self.lost.is_lost() {
                    return Err(::umd_core::platform::PlatformError::DeviceLost);
                }
                match self.binding.write(&self.reg_page(), offset, value)? {
                    ::umd_core::ivshmem::Written::Doorbell(e) => self.ring(e),
                    ::umd_core::ivshmem::Written::Done => Ok(()),
                }
            }

            fn doorbell(&self, engine: u32) -> Result<(), ::umd_core::platform::PlatformError> {
                if engine >= ::umd_core::hw::regs::ENGINES {
                    return Err(::umd_core::platform::PlatformError::Unsupported);
                }
                self.ring(engine)
            }

            fn control_doorbell(&self) -> Result<(), ::umd_core::platform::PlatformError> {
                self.ring(::umd_core::hw::regs::CONTROL_VECTOR)
            }
        }
    };
}
pub(crate) use binding_direct_io;
