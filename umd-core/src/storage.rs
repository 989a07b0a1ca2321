//! The device's large tables, in memory the integrator places.
//!
//! A device keeps fixed-capacity tables (buffer handles, slab descriptors,
//! GPU VA nodes, the dependency graph, the trace) that add up to tens or
//! hundreds of KiB. They live in a [`DeviceStorage`] the integrator puts
//! where it wants, typically a `static` (it has a `const` constructor, so
//! it is placed by the loader and never moved on a stack), and lends to
//! the device for the device's lifetime. The device itself is small.
//!
//! Every capacity is a const parameter: the default [`DeviceStorage`]
//! suits a host or a large SoC, [`McuStorage`] (with [`MCU_CHUNKS`] IB
//! chunks) a microcontroller; a full table is refused with an error whose
//! [`Limit`] names the parameter to raise (`docs/memory.md`, "Choosing the
//! capacities"; bytes per unit in `docs/perf.md`, "Capacity and RAM per
//! configuration").
//!
//! ```ignore
//! static STORAGE: static_cell::ConstStaticCell<DeviceStorage> = ConstStaticCell::new(DeviceStorage::new());
//! let dev = Device::new(&PLATFORM, STORAGE.take(), Config::DEFAULT, MmuMode::DEFAULT)?;
//! ```

use core::mem::MaybeUninit;

use heapless::Deque;

use crate::debug::trace::TraceStorage;
use crate::debug::{HangLog, HangReport};
use crate::mem::buffer::BufferSlot;
use crate::mem::pool::Slab;
use crate::mem::va::{VaHandle, VaNode};
use crate::platform::DmaRegion;
use crate::sync::deps::DepGraph;
pub use crate::sync::deps::PENDING_WAITS;
use crate::sync::MAX_QUEUES;

/// The MCU configuration's storage (`docs/memory.md`, "Choosing the
/// capacities"; its size is in `docs/perf.md`, "Capacity and RAM per
/// configuration"): 64 buffer handles; no GPU VA nodes (the MMU bypassed,
/// [`crate::direct::MmuMode::Bypass`]: a buffer's GPU address is its
/// memory's own, and bring-up with the MMU on is refused for want of
/// nodes); 16 slab descriptors (64 buffers of any slab bin: the 64 KiB
/// bin's slab has the fewest slots, 4); no trace events and no
/// local-memory nodes (built without the `trace` and `local-memory`
/// features); one hang report. With [`MCU_CHUNKS`] IB chunks and one
/// generation.
pub type McuStorage = DeviceStorage<64, 0, 16, 0, 0, 1>;

/// IB chunks of the MCU configuration's device
/// (`Device<'_, P, MCU_CHUNKS>`, the default count).
pub const MCU_CHUNKS: usize = 16;

pub use crate::config::Limit;

/// The dependency graph of a device.
pub type Deps = DepGraph<MAX_QUEUES, PENDING_WAITS>;

/// Storage for one device: `BUFFERS` buffer handles, `VA_NODES` GPU VA
/// allocator nodes, `SLABS` slab descriptors, `TRACE` trace events,
/// `LOCAL_NODES` nodes of the local-memory page allocator
/// ([`crate::mem::pages::PageAlloc`]: one per local block or hole between
/// blocks, so the default 128 keep at least 63 local buffers whatever the
/// holes; local memory of any size is managed) and the last `HANGS` hang
/// and fault reports
/// ([`crate::debug::HangLog`]). `docs/perf.md` lists its size per configuration.
pub struct DeviceStorage<
    const BUFFERS: usize = 1024,
    const VA_NODES: usize = 1024,
    const SLABS: usize = 256,
    const TRACE: usize = 256,
    const LOCAL_NODES: usize = 128,
    const HANGS: usize = { crate::debug::HANG_REPORTS },
> {
    /// Zeroed, not initialised: an empty slot is not all zeros (the
    /// compiler encodes `Free` in a niche of value 2, and a `repr(u8)` tag
    /// that would make it 0 costs 5 % of a small alloc/free), while an
    /// all-zero storage lands in `.bss` rather than `.data` (and flash).
    /// [`DeviceStorage::parts`] writes every slot before lending them.
    pub(crate) buffers: [MaybeUninit<BufferSlot<Backed>>; BUFFERS],
    pub(crate) retiring: [Deque<u32, BUFFERS>; MAX_QUEUES],
    /// Zeroed too (`Slab::block: None` is a niche of value 2); written
    /// empty by [`DeviceStorage::parts`].
    pub(crate) slabs: [MaybeUninit<Slab<Backed>>; SLABS],
    pub(crate) va: [VaNode; VA_NODES],
    pub(crate) deps: Deps,
    pub(crate) trace: TraceStorage<TRACE>,
    pub(crate) local: [VaNode; LOCAL_NODES],
    /// Zeroed, not `None`: `Option<HangReport>` keeps `None` in a niche
    /// that is not all zeros, and the storage must stay all zeros
    /// (`.bss`, no flash image: `tools/footprint.sh` checks it).
    pub(crate) hangs: [MaybeUninit<Option<HangReport>>; HANGS],
}

impl<
        const BUFFERS: usize,
        const VA_NODES: usize,
        const SLABS: usize,
        const TRACE: usize,
        const LOCAL_NODES: usize,
        const HANGS: usize,
    > DeviceStorage<BUFFERS, VA_NODES, SLABS, TRACE, LOCAL_NODES, HANGS>
{
    /// Empty storage (a `const fn`: usable in a `static`).
    pub const fn new() -> Self {
        DeviceStorage {
            buffers: [const { MaybeUninit::zeroed() }; BUFFERS],
            retiring: [const { Deque::new() }; MAX_QUEUES],
            slabs: [const { MaybeUninit::zeroed() }; SLABS],
            va: [VaNode::ZEROED; VA_NODES],
            deps: DepGraph::new(),
            trace: TraceStorage::new(),
            local: [VaNode::ZEROED; LOCAL_NODES],
            hangs: [const { MaybeUninit::zeroed() }; HANGS],
        }
    }

    /// Splits the storage into the parts a device uses.
    pub(crate) fn parts(&mut self) -> StorageParts<'_> {
        let [r0, r1, r2, r3] = &mut self.retiring;
        StorageParts {
            buffers: init_all(&mut self.buffers, || BufferSlot::EMPTY),
            retiring: [r0.as_mut_view(), r1.as_mut_view(), r2.as_mut_view(), r3.as_mut_view()],
            slabs: init_all(&mut self.slabs, || Slab::EMPTY),
            va: &mut self.va,
            deps: &mut self.deps,
            trace: crate::debug::TraceRing::new(&mut self.trace),
            local: &mut self.local,
            hangs: HangLog::new(init_all(&mut self.hangs, || None)),
        }
    }
}

/// Writes `empty()` into every element of `raw` and lends them as
/// initialised values.
fn init_all<T>(raw: &mut [MaybeUninit<T>], empty: impl Fn() -> T) -> &mut [T] {
    for s in raw.iter_mut() {
        // The previous content is not dropped: buffer slots, slab
        // descriptors and hang reports have no drop glue.
        s.write(empty());
    }
    // SAFETY: the loop above initialised every element; `MaybeUninit<T>`
    // has the layout of `T`, so the slice cast keeps length and layout; the
    // returned borrow is the exclusive one taken of `raw`, so no element
    // can be de-initialised while it lives.
    unsafe { &mut *(core::ptr::from_mut(raw) as *mut [T]) }
}

impl<
        const BUFFERS: usize,
        const VA_NODES: usize,
        const SLABS: usize,
        const TRACE: usize,
        const LOCAL_NODES: usize,
        const HANGS: usize,
    > Default for DeviceStorage<BUFFERS, VA_NODES, SLABS, TRACE, LOCAL_NODES, HANGS>
{
    fn default() -> Self {
        Self::new()
    }
}

impl<
        const BUFFERS: usize,
        const VA_NODES: usize,
        const SLABS: usize,
        const TRACE: usize,
        const LOCAL_NODES: usize,
        const HANGS: usize,
    > core::fmt::Debug for DeviceStorage<BUFFERS, VA_NODES, SLABS, TRACE, LOCAL_NODES, HANGS>
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DeviceStorage")
            .field("buffers", &BUFFERS)
            .field("va_nodes", &VA_NODES)
            .field("slabs", &SLABS)
            .field("trace", &TRACE)
            .field("hangs", &HANGS)
            .finish()
    }
}

/// A storage's parts, borrowed by a device.
pub(crate) struct StorageParts<'s> {
    pub(crate) buffers: &'s mut [BufferSlot<Backed>],
    pub(crate) retiring: [&'s mut heapless::deque::DequeView<u32>; MAX_QUEUES],
    pub(crate) slabs: &'s mut [Slab<Backed>],
    pub(crate) va: &'s mut [VaNode],
    pub(crate) deps: &'s mut Deps,
    pub(crate) trace: crate::debug::TraceRing<'s>,
    pub(crate) local: &'s mut [VaNode],
    pub(crate) hangs: HangLog<'s>,
}

/// A block of the pools: its memory and, with the MMU on, the VA
/// allocator's handle for its GPU address, so that releasing the block
/// frees the address without looking it up ([`VaAllocator::free_handle`](crate::mem::VaAllocator::free_handle)).
#[derive(Debug)]
pub(crate) struct Backed {
    /// The memory.
    pub(crate) region: DmaRegion,
    /// Its GPU address range (`None` with the MMU bypassed).
    pub(crate) va: Option<VaHandle>,
}

impl core::ops::Deref for Backed {
    type Target = DmaRegion;
    fn deref(&self) -> &DmaRegion {
        &self.region
    }
}
