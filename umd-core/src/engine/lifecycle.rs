//! Bringing a device up and down: the parts both modes share (storage, the
//! IB pool, buffers) and the teardown that `Drop` runs, with the leak
//! report.

use core::fmt;
use core::mem::{ManuallyDrop, MaybeUninit};
use core::ops::{Deref, DerefMut};
use core::ptr::addr_of_mut;
use core::sync::atomic::AtomicBool;

use lock_api::Mutex;

use crate::cmd::Encoder;
use crate::config::Config;
use crate::hw::ProbeError;
use crate::ibpool::{IbPool, PoolSetupError};
use crate::mem::manager::Buffers;
use crate::mem::pagetable::{Perms, PtError};
use crate::mem::va::{VaAllocator, VaError, VaPlacement};
use crate::platform::{DmaFlags, DmaGuard, DmaRegion, Platform, PlatformError};
use crate::storage::DeviceStorage;
use crate::sync::{FaultInfo, MAX_QUEUES};

use super::backend::Backend;
use super::queue::QueueCore;
use super::{next_device_id, Counters, DeviceCore, MemState, Tunables};

/// Why a device could not be brought up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InitError {
    /// The ID register names no supported chip.
    Probe(ProbeError),
    /// A platform call failed.
    Platform(PlatformError),
    /// The configuration does not fit the chip or the build (`what` says
    /// which value and why).
    BadConfig(&'static str),
    /// A tunable is outside its range ([`crate::config::Config::validate`],
    /// which every bring-up runs first).
    OutOfRange(crate::config::RangeError),
    /// The IB pool could not be laid out.
    Pool(PoolSetupError),
    /// The GPU VA arena or allocator refused.
    Va(VaError),
    /// Building the page tables failed.
    Vm(PtError),
    /// Mapping the driver's memory failed.
    Map,
    /// The engine did not finish a reset or invalidate handshake.
    Handshake(&'static str),
    /// The platform had no GPU-visible memory left for one of the device's
    /// fixed pools (`what`: `"page tables"`, `"fence slots"`, `"ring"` or
    /// `"IB pool"`, the names of `direct::MemoryPlan`, whose `check` says
    /// before bring-up which pool a carve-out cannot hold).
    OutOfMemory {
        /// The pool that did not fit.
        what: &'static str,
        /// Its size in bytes.
        len: usize,
    },
    /// The bring-up fence round trip failed (direct mode): a FENCE packet
    /// on `queue`'s engine, writing a scratch word of the fence-slot page,
    /// faulted, or no engine's came back to the CPU (an engine that only
    /// stays silent is left to the hang check). The device does not reach the
    /// platform's DMA memory at the device addresses it was given: a wrong
    /// memory base, or memory outside the device's window
    /// (`docs/porting.md`, "Device addresses").
    RoundTrip {
        /// The queue whose engine ran the fence.
        queue: u8,
        /// The scratch word's device (physical) address.
        phys: u64,
        /// The device addresses of the driver's fence page and rings,
        /// `[lowest, end)`.
        window: (u64, u64),
        /// The fault the engine reported, if it did.
        fault: Option<FaultInfo>,
    },
}

impl fmt::Display for InitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitError::Probe(e) => write!(f, "probe: {e}"),
            InitError::Platform(e) => write!(f, "platform: {e}"),
            InitError::BadConfig(what) => write!(f, "bad configuration: {what}"),
            InitError::OutOfRange(e) => write!(f, "bad configuration: {e}"),
            InitError::Pool(e) => write!(f, "IB pool: {e}"),
            InitError::Va(e @ VaError::NodeCapacity) => {
                write!(f, "GPU VA: {e}; {}", crate::storage::Limit::VaNodes)
            }
            InitError::Va(e) => write!(f, "GPU VA: {e}"),
            InitError::Vm(e) => write!(f, "page tables: {e}"),
            InitError::Map => write!(f, "mapping the driver's memory failed"),
            InitError::Handshake(what) => write!(f, "device did not complete {what}"),
            InitError::RoundTrip { queue, phys, window, fault } => {
                write!(
                    f,
                    "bring-up fence round trip on queue q{queue}: the fence to physical address {phys:#x} "
                )?;
                match fault {
                    Some(info) => write!(f, "faulted ({info})")?,
                    None => write!(f, "never reached the CPU")?,
                }
                write!(
                    f,
                    "; the driver's memory is at device addresses [{:#x}, {:#x}): is that inside the \
                     device's memory window, at the CPU's bytes? (a wrong memory base?)",
                    window.0, window.1
                )
            }
            InitError::OutOfMemory { what, len } => write!(
                f,
                "out of GPU-visible memory for the {what} ({len} bytes): the platform's DMA memory is \
                 smaller than the device's fixed pools (MemoryPlan::check says what fits)"
            ),
        }
    }
}

impl core::error::Error for InitError {}

/// The bring-up error for a failed allocation of the pool `what`:
/// [`InitError::OutOfMemory`] naming it when the platform ran out of
/// memory, the platform's error otherwise.
pub(crate) fn init_alloc_error(what: &'static str, e: PlatformError) -> InitError {
    match e {
        PlatformError::OutOfMemory { len } => InitError::OutOfMemory { what, len },
        e => InitError::Platform(e),
    }
}

/// What was still allocated when a device went down.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Buffers never freed.
    pub leaked_buffers: u64,
    /// Their requested bytes.
    pub leaked_bytes: u64,
    /// Freed buffers whose fences never came (device lost or hung at
    /// teardown), released now.
    pub released_waiting: u64,
}

/// A device built in memory its integrator provides (a `static`, a
/// section of its own), so that bring-up writes the engine's state where
/// it stays instead of building it on the stack and moving it (on
/// Cortex-M4 the engine is about 9 KB): see
/// [`Device::new_in`](crate::direct::Device::new_in).
///
/// It owns the device: dereferences to it, and dropping it drops the
/// device in place (stopping it and giving back its memory, as dropping a
/// [`Device`](crate::direct::Device) does); the memory is the
/// integrator's again afterwards. [`InPlace::leak`] keeps the device for
/// the rest of the program instead.
pub struct InPlace<'s, T> {
    /// Initialised for as long as `self` lives (only
    /// [`DeviceCore::assemble_in`] makes one, after writing every field).
    slot: &'s mut MaybeUninit<T>,
}

impl<'s, T> InPlace<'s, T> {
    /// The device, for the rest of the borrow of its memory; it is never
    /// dropped (nor stopped) then, as a `static` device never is.
    pub fn leak(this: Self) -> &'s mut T {
        let this = ManuallyDrop::new(this);
        // SAFETY: `this.slot` is the exclusive borrow of an initialised
        // value (the type's invariant); `this` is never dropped, so the
        // borrow moves out once and the value is not dropped behind it.
        let slot: &'s mut MaybeUninit<T> = unsafe { core::ptr::read(&this.slot) };
        // SAFETY: initialised (the type's invariant).
        unsafe { slot.assume_init_mut() }
    }

    /// The device moved out of its memory (for callers that keep it by
    /// value: [`Device::new`](crate::direct::Device::new)).
    pub(crate) fn into_inner(this: Self) -> T {
        let this = ManuallyDrop::new(this);
        // SAFETY: initialised (the type's invariant); `this` is not dropped,
        // so the value is read out once and never dropped in place.
        unsafe { this.slot.assume_init_read() }
    }
}

impl<T> Deref for InPlace<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: initialised (the type's invariant).
        unsafe { self.slot.assume_init_ref() }
    }
}

impl<T> DerefMut for InPlace<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: initialised (the type's invariant).
        unsafe { self.slot.assume_init_mut() }
    }
}

impl<T> Drop for InPlace<'_, T> {
    fn drop(&mut self) {
        // SAFETY: initialised (the type's invariant), and dropped only here,
        // once: after it the slot is plain memory again.
        unsafe { self.slot.assume_init_drop() }
    }
}

impl<T: fmt::Debug> fmt::Debug for InPlace<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<'d, B: Backend, const CHUNKS: usize> InPlace<'_, DeviceCore<'d, B, CHUNKS>> {
    /// Stops the device and gives back its memory, as
    /// [`DeviceCore::shutdown`]; returns the leak report. An associated
    /// function, as [`InPlace::leak`], so that it is not mistaken for the
    /// device's own method.
    pub fn shutdown(mut this: Self) -> ShutdownReport {
        this.teardown()
    }
}

impl<'d, B: Backend, const CHUNKS: usize> DeviceCore<'d, B, CHUNKS> {
    /// An engine over `b`, written into `slot`, with the tables of
    /// `storage`, GPU VA arena `va_arena` (None: addresses are the
    /// memory's own), backend mapping state `maps` and per-queue state
    /// `queues`. The IB pool is set up by [`DeviceCore::init_ib_pool`] once the
    /// backend can map memory. Each field is written where it stays: no
    /// engine-sized value is built on the stack.
    pub(crate) fn assemble_in<
        's,
        const BUF: usize,
        const VA: usize,
        const SL: usize,
        const TR: usize,
        const LW: usize,
        const HG: usize,
    >(
        slot: &'s mut MaybeUninit<Self>,
        b: B,
        storage: &'d mut DeviceStorage<BUF, VA, SL, TR, LW, HG>,
        cfg: Config,
        va_arena: Option<(u64, u64)>,
        maps: B::Maps,
        queues: [B::Queue; MAX_QUEUES],
    ) -> Result<InPlace<'s, Self>, InitError> {
        // The slot's address hidden from the optimiser: when it is a
        // `static` (the usual firmware slot) and the program has one
        // device, link-time optimisation would otherwise propagate the
        // address into every function that reaches the device and turn
        // each field access into a 32-bit absolute address (on Cortex-M4
        // 600 B more code in all; costs nothing at run time).
        let slot = core::hint::black_box(slot);
        let id = next_device_id();
        let nq = b.queues().min(MAX_QUEUES);
        let enc = Encoder::new(b.chip().generation);
        let parts = storage.parts();
        // A backend without an allocator gets no arena (direct mode
        // refuses the MMU before this without the `mmu` feature). The one
        // step that can fail, before anything is written.
        let va = match va_arena.filter(|_| B::VA_ALLOCATOR) {
            // A storage without VA nodes (`McuStorage`) is for the MMU
            // bypassed: named as the parameter to raise.
            Some(_) if parts.va.is_empty() => return Err(InitError::Va(VaError::NodeCapacity)),
            Some((base, size)) => {
                Some(VaAllocator::new_recycling(parts.va, base, size).map_err(InitError::Va)?)
            }
            None => None,
        };
        let buffers = Buffers::new(id, parts.buffers, parts.slabs, parts.retiring);
        *parts.deps = crate::storage::Deps::new();
        // Every field of the engine, by name and without `..`: a field
        // added to `DeviceCore` and not written below fails to compile here.
        let _written = |e: &Self| {
            #[rustfmt::skip]
            let DeviceCore {
                id: _, b: _, enc: _, cfg: _, tun: _, nq: _, queues: _, ib: _, mem: _, deps: _,
                trace: _, last_hang: _, stats: _, lost: _, fault_irqs: _, reclaim_backlog: _,
                #[cfg(feature = "capture")]
                capture: _,
                #[cfg(feature = "validation")]
                validating: _,
                torn_down: _,
            } = e;
        };
        let e = slot.as_mut_ptr();
        // SAFETY: `e` is the slot's memory, exclusively borrowed, aligned
        // and large enough for `Self`; each write initialises one field (or
        // one queue) through a raw place, without a reference to the
        // uninitialised whole, and overwrites nothing that needs dropping
        // (the slot holds no value: `&mut MaybeUninit` never drops one).
        // `queues` has `MAX_QUEUES` elements, so `q.add(i)` stays inside
        // the field. The pattern above lists every field and each is
        // written once here, so the slot is initialised afterwards.
        unsafe {
            addr_of_mut!((*e).id).write(id);
            addr_of_mut!((*e).b).write(b);
            addr_of_mut!((*e).enc).write(enc);
            addr_of_mut!((*e).cfg).write(cfg);
            addr_of_mut!((*e).tun)
                .write(Mutex::new(Tunables { pool_exhaustion: cfg.pool_exhaustion, hang: cfg.hang }));
            addr_of_mut!((*e).nq).write(nq);
            let q = addr_of_mut!((*e).queues).cast::<QueueCore<super::Raw<B>, B::Queue>>();
            for (i, qs) in queues.into_iter().enumerate() {
                q.add(i).write(QueueCore::new(qs));
            }
            addr_of_mut!((*e).ib).write(IbPool::unset());
            addr_of_mut!((*e).mem).write(Mutex::new(MemState {
                buffers,
                va: super::buffers::VaSlot::new(va),
                maps,
                local: crate::mem::local::LocalMem::new(parts.local),
            }));
            addr_of_mut!((*e).deps).write(Mutex::new(parts.deps));
            addr_of_mut!((*e).trace).write(Mutex::new(parts.trace));
            addr_of_mut!((*e).last_hang).write(Mutex::new(parts.hangs));
            addr_of_mut!((*e).stats).write(Counters::default());
            addr_of_mut!((*e).lost).write(AtomicBool::new(false));
            addr_of_mut!((*e).fault_irqs).write(crate::sync::fault_irqs::FaultIrqs::new());
            addr_of_mut!((*e).reclaim_backlog).write(core::sync::atomic::AtomicU32::new(0));
            #[cfg(feature = "capture")]
            addr_of_mut!((*e).capture).write(Mutex::new(super::capture::CaptureState::default()));
            #[cfg(feature = "validation")]
            addr_of_mut!((*e).validating).write(AtomicBool::new(false));
            addr_of_mut!((*e).torn_down).write(AtomicBool::new(false));
        }
        Ok(InPlace { slot })
    }

    /// Allocates `len` bytes (rounded to 4 KiB) of CPU-visible memory and
    /// maps it for the GPU at a VA the core chooses (or its own address with
    /// the MMU bypassed).
    pub(crate) fn alloc_mapped(
        &mut self,
        what: &'static str,
        len: usize,
        perms: Perms,
    ) -> Result<(DmaRegion, u64), InitError> {
        let len = len.max(1).checked_next_multiple_of(4096).ok_or(InitError::BadConfig("size"))?;
        let p = self.b.platform();
        // Freed on every error below (no lock is held: `&mut self`).
        let region =
            DmaGuard::new(p, p.dma_alloc(len, DmaFlags::CPU).map_err(|e| init_alloc_error(what, e))?);
        let mem = self.mem.get_mut();
        let Some(va) = mem.va.get_mut() else {
            let addr = region.dev_addr();
            return Ok((region.keep(), addr));
        };
        let align = if len >= 2 << 20 { 2 << 20 } else { 4096 };
        let addr = va.alloc(len as u64, align, VaPlacement::TopDown).map_err(InitError::Va)?;
        if self.b.map(&mut mem.maps, addr, &region, perms).is_err() {
            let _ = va.free(addr);
            return Err(InitError::Map);
        }
        Ok((region.keep(), addr))
    }

    /// Allocates and maps the IB pool (read-only for the GPU).
    pub(crate) fn init_ib_pool(&mut self) -> Result<(), InitError> {
        let len = self.cfg.ib_chunk_bytes.saturating_mul(CHUNKS).next_multiple_of(4096);
        let (region, va) = self.alloc_mapped("IB pool", len, Perms::RO)?;
        match IbPool::new(region, va, self.cfg.ib_chunk_bytes) {
            Ok(pool) => {
                self.ib = pool;
                Ok(())
            }
            Err((e, region)) => {
                self.unmap_driver(region, va);
                Err(InitError::Pool(e))
            }
        }
    }

    fn unmap_driver(&mut self, region: DmaRegion, va: u64) {
        let mem = self.mem.get_mut();
        if let Some(a) = mem.va.get_mut() {
            // As `Backer::release`: a range still mapped keeps its VA.
            if self.b.unmap(&mut mem.maps, va, region.len() as u64).is_ok() {
                let _ = a.free(va);
            }
        }
        self.b.platform().dma_free(region);
    }

    /// Stops the device and gives back every block of memory: buffers
    /// (live ones are leaks, reported), buffers waiting for fences that
    /// will never come, the IB pool, and the backend's own memory.
    /// Returns the leak report (the same happens, logged, on drop).
    pub fn shutdown(mut self) -> ShutdownReport {
        self.teardown()
    }

    pub(crate) fn teardown(&mut self) -> ShutdownReport {
        if self.torn_down.swap(true, crate::sync::atomic::Ordering::AcqRel) {
            return ShutdownReport::default();
        }
        // Held submissions (deferred doorbells) reach the hardware before
        // it stops, as an explicit flush would hand them over.
        self.publish_all_mut();
        self.b.stop();
        let mut report = ShutdownReport::default();
        let stats = self.mem.get_mut().buffers.stats();
        report.released_waiting = stats.waiting;
        self.mem.get_mut().buffers.leak_report(|l| {
            report.leaked_buffers = report.leaked_buffers.saturating_add(1);
            report.leaked_bytes = report.leaked_bytes.saturating_add(l.info.size);
            crate::log::log_warn!(
                "leak: buffer #{} ({} bytes at {:#x}, tag '{}') was never freed",
                l.info.serial,
                l.info.size,
                l.info.va,
                l.info.tag
            );
        });
        {
            // No lock is held here (`&mut self`): blocks past what `off`
            // keeps are freed as they are released, the rest just after.
            let mut off = super::buffers::OffLock::new();
            let mem = self.mem.get_mut();
            let (buffers, mut backer) = mem.split(&self.b, &mut off);
            buffers.release_all(&mut backer);
            off.finish(self.b.platform());
        }
        if let Some((region, va)) = self.ib.release() {
            self.unmap_driver(region, va);
        }
        for q in self.queues.iter_mut() {
            self.b.release_queue(q.submit.get_mut());
        }
        let maps = &mut self.mem.get_mut().maps;
        self.b.release(maps);
        report
    }
}

impl<'d, B: Backend, const CHUNKS: usize> Drop for DeviceCore<'d, B, CHUNKS> {
    fn drop(&mut self) {
        self.teardown();
    }
}
