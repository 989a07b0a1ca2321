//! The refgpu DRM driver's uAPI: a `no_std` mirror of
//! `kmd/include/uapi/refgpu_drm.h`.
//!
//! Every structure is `#[repr(C)]` with the header's field order, sizes and
//! explicit padding; `tests/layout.rs` compiles the C header with `gcc` and
//! compares every size, field offset and ioctl number with this crate.
//! `docs/linux.md` specifies each ioctl and its errors.
//!
//! The ioctl numbers are full request codes for `ioctl(2)` on the DRM file
//! descriptor (Linux `_IOC` encoding, as on x86_64 and aarch64).
#![no_std]

/// Builds a Linux ioctl request code (`_IOC(dir, type, nr, size)`).
const fn ioc(dir: u32, ty: u8, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | ((ty as u32) << 8) | nr
}

/// `_IOC_WRITE`: userspace writes the argument.
const IOC_WRITE: u32 = 1;
/// `_IOC_READ`: the kernel writes the argument back.
const IOC_READ: u32 = 2;
/// `DRM_IOCTL_BASE`.
pub const DRM_IOCTL_BASE: u8 = b'd';
/// `DRM_COMMAND_BASE`: first driver-private ioctl number.
pub const DRM_COMMAND_BASE: u32 = 0x40;

/// `DRM_IOWR(DRM_COMMAND_BASE + nr, T)`.
pub const fn drm_iowr<T>(nr: u32) -> u32 {
    ioc(IOC_READ | IOC_WRITE, DRM_IOCTL_BASE, DRM_COMMAND_BASE + nr, core::mem::size_of::<T>())
}

/// `DRM_IOW(DRM_COMMAND_BASE + nr, T)`.
pub const fn drm_iow<T>(nr: u32) -> u32 {
    ioc(IOC_WRITE, DRM_IOCTL_BASE, DRM_COMMAND_BASE + nr, core::mem::size_of::<T>())
}

/// Driver-private ioctl numbers (offsets from [`DRM_COMMAND_BASE`]).
pub mod nr {
    /// `DRM_REFGPU_GET_PARAM`.
    pub const GET_PARAM: u32 = 0x00;
    /// `DRM_REFGPU_BO_CREATE`.
    pub const BO_CREATE: u32 = 0x01;
    /// `DRM_REFGPU_BO_MMAP_OFFSET`.
    pub const BO_MMAP_OFFSET: u32 = 0x02;
    /// `DRM_REFGPU_VM_BIND`.
    pub const VM_BIND: u32 = 0x03;
    /// `DRM_REFGPU_CTX_CREATE`.
    pub const CTX_CREATE: u32 = 0x04;
    /// `DRM_REFGPU_CTX_DESTROY`.
    pub const CTX_DESTROY: u32 = 0x05;
    /// `DRM_REFGPU_SUBMIT`.
    pub const SUBMIT: u32 = 0x06;
    /// `DRM_REFGPU_CTX_QUERY`.
    pub const CTX_QUERY: u32 = 0x07;
    /// `DRM_REFGPU_SUBMIT_BATCH` (driver minor version 1).
    pub const SUBMIT_BATCH: u32 = 0x08;
}

/// `DRM_IOCTL_REFGPU_GET_PARAM`.
pub const DRM_IOCTL_REFGPU_GET_PARAM: u32 = drm_iowr::<GetParam>(nr::GET_PARAM);
/// `DRM_IOCTL_REFGPU_BO_CREATE`.
pub const DRM_IOCTL_REFGPU_BO_CREATE: u32 = drm_iowr::<BoCreate>(nr::BO_CREATE);
/// `DRM_IOCTL_REFGPU_BO_MMAP_OFFSET`.
pub const DRM_IOCTL_REFGPU_BO_MMAP_OFFSET: u32 = drm_iowr::<BoMmapOffset>(nr::BO_MMAP_OFFSET);
/// `DRM_IOCTL_REFGPU_VM_BIND`.
pub const DRM_IOCTL_REFGPU_VM_BIND: u32 = drm_iow::<VmBind>(nr::VM_BIND);
/// `DRM_IOCTL_REFGPU_CTX_CREATE`.
pub const DRM_IOCTL_REFGPU_CTX_CREATE: u32 = drm_iowr::<CtxCreate>(nr::CTX_CREATE);
/// `DRM_IOCTL_REFGPU_CTX_DESTROY`.
pub const DRM_IOCTL_REFGPU_CTX_DESTROY: u32 = drm_iow::<CtxDestroy>(nr::CTX_DESTROY);
/// `DRM_IOCTL_REFGPU_SUBMIT`.
pub const DRM_IOCTL_REFGPU_SUBMIT: u32 = drm_iowr::<Submit>(nr::SUBMIT);
/// `DRM_IOCTL_REFGPU_CTX_QUERY`.
pub const DRM_IOCTL_REFGPU_CTX_QUERY: u32 = drm_iowr::<CtxQuery>(nr::CTX_QUERY);
/// `DRM_IOCTL_REFGPU_SUBMIT_BATCH` (driver minor version 1).
pub const DRM_IOCTL_REFGPU_SUBMIT_BATCH: u32 = drm_iowr::<SubmitBatch>(nr::SUBMIT_BATCH);

/// The driver's minor version (`DRM_IOCTL_VERSION`) from which
/// [`DRM_IOCTL_REFGPU_SUBMIT_BATCH`] and [`param::MAX_BATCH_JOBS`] exist.
pub const MINOR_SUBMIT_BATCH: i32 = 1;

/// Engines (`REFGPU_ENGINE_*`).
pub mod engine {
    /// GFX.
    pub const GFX: u32 = 0;
    /// COMPUTE.
    pub const COMPUTE: u32 = 1;
    /// COPY.
    pub const COPY: u32 = 2;
    /// Number of engines.
    pub const COUNT: u32 = 3;
}

/// GET_PARAM parameters (`REFGPU_PARAM_*`).
pub mod param {
    /// The ID register.
    pub const CHIP_ID: u32 = 0;
    /// 1 or 2.
    pub const GENERATION: u32 = 1;
    /// Number of engines.
    pub const ENGINE_COUNT: u32 = 2;
    /// First GPU VA userspace may bind.
    pub const VA_START: u32 = 3;
    /// One past the last GPU VA userspace may bind.
    pub const VA_END: u32 = 4;
    /// Largest SUBMIT `ib_size_dw`.
    pub const IB_MAX_DWORDS: u32 = 5;
    /// SUBMIT `ib_va` alignment in bytes.
    pub const IB_ALIGN: u32 = 6;
    /// GPU address width of packet operands.
    pub const VA_BITS: u32 = 7;
    /// VM_BIND granule.
    pub const PAGE_SIZE: u32 = 8;
    /// Largest VM_BIND `op_count`.
    pub const MAX_BIND_OPS: u32 = 9;
    /// Largest sync count per ioctl.
    pub const MAX_SYNCS: u32 = 10;
    /// The hang-detection window in milliseconds.
    pub const JOB_TIMEOUT_MS: u32 = 11;
    /// Largest SUBMIT_BATCH job count (driver minor version 1).
    pub const MAX_BATCH_JOBS: u32 = 12;
}

/// `struct drm_refgpu_get_param`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GetParam {
    /// In: a [`param`] value.
    pub param: u32,
    /// Must be zero.
    pub pad: u32,
    /// Out.
    pub value: u64,
}

/// `REFGPU_BO_NO_CPU_MAPPING`: mmap and MMAP_OFFSET are refused.
pub const BO_NO_CPU_MAPPING: u32 = 1 << 0;
/// `REFGPU_BO_GPU_READ_ONLY`: only READ_ONLY binds are allowed.
pub const BO_GPU_READ_ONLY: u32 = 1 << 1;
/// `REFGPU_BO_FLAGS_MASK`.
pub const BO_FLAGS_MASK: u32 = BO_NO_CPU_MAPPING | BO_GPU_READ_ONLY;

/// `struct drm_refgpu_bo_create`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BoCreate {
    /// In: bytes, a non-zero multiple of the page size.
    pub size: u64,
    /// In: `BO_*` flags.
    pub flags: u32,
    /// Out: the GEM handle.
    pub handle: u32,
}

/// `struct drm_refgpu_bo_mmap_offset`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BoMmapOffset {
    /// In: GEM handle.
    pub handle: u32,
    /// Must be zero.
    pub pad: u32,
    /// Out: the offset to pass to `mmap(2)` on the DRM fd.
    pub offset: u64,
}

/// `struct drm_refgpu_sync`: point 0 names a binary syncobj.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sync {
    /// Syncobj handle.
    pub handle: u32,
    /// Must be zero.
    pub flags: u32,
    /// Timeline point, or 0 for a binary syncobj.
    pub point: u64,
}

/// `REFGPU_VM_BIND_OP_MAP`.
pub const VM_BIND_OP_MAP: u32 = 0;
/// `REFGPU_VM_BIND_OP_UNMAP`.
pub const VM_BIND_OP_UNMAP: u32 = 1;
/// `REFGPU_VM_BIND_READ_ONLY`: the GPU may read, not write.
pub const VM_BIND_READ_ONLY: u32 = 1 << 0;
/// `REFGPU_VM_BIND_OP_FLAGS_MASK`.
pub const VM_BIND_OP_FLAGS_MASK: u32 = VM_BIND_READ_ONLY;

/// `struct drm_refgpu_vm_bind_op`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmBindOp {
    /// [`VM_BIND_OP_MAP`] or [`VM_BIND_OP_UNMAP`].
    pub op: u32,
    /// `VM_BIND_*` flags (MAP only).
    pub flags: u32,
    /// MAP: GEM handle; UNMAP: zero.
    pub handle: u32,
    /// Must be zero.
    pub pad: u32,
    /// MAP: page-aligned offset in the BO; UNMAP: zero.
    pub bo_offset: u64,
    /// Page-aligned GPU VA.
    pub va: u64,
    /// Page-aligned, non-zero size.
    pub size: u64,
}

/// `struct drm_refgpu_vm_bind`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmBind {
    /// Must be zero.
    pub flags: u32,
    /// Number of [`VmBindOp`]s.
    pub op_count: u32,
    /// Number of in-syncs (waited for).
    pub in_sync_count: u32,
    /// Number of out-syncs (signalled).
    pub out_sync_count: u32,
    /// User pointer to `[VmBindOp; op_count]`.
    pub ops: u64,
    /// User pointer to `[Sync; in_sync_count]`.
    pub in_syncs: u64,
    /// User pointer to `[Sync; out_sync_count]`.
    pub out_syncs: u64,
}

/// `struct drm_refgpu_ctx_create`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtxCreate {
    /// In: an [`engine`] value.
    pub engine: u32,
    /// In: must be zero.
    pub flags: u32,
    /// Out: the context id (non-zero).
    pub ctx_id: u32,
    /// Must be zero.
    pub pad: u32,
}

/// `struct drm_refgpu_ctx_destroy`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtxDestroy {
    /// The context id.
    pub ctx_id: u32,
    /// Must be zero.
    pub pad: u32,
}

/// `REFGPU_SUBMIT_OUT_SYNC_FILE`: return a sync_file in `out_fence_fd`.
pub const SUBMIT_OUT_SYNC_FILE: u32 = 1 << 0;
/// `REFGPU_SUBMIT_FLAGS_MASK`.
pub const SUBMIT_FLAGS_MASK: u32 = SUBMIT_OUT_SYNC_FILE;

/// `struct drm_refgpu_submit`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Submit {
    /// In: the context id.
    pub ctx_id: u32,
    /// In: `SUBMIT_*` flags.
    pub flags: u32,
    /// In: GPU VA of the indirect buffer.
    pub ib_va: u64,
    /// In: its size in dwords.
    pub ib_size_dw: u32,
    /// In: number of in-syncs.
    pub in_sync_count: u32,
    /// In: number of out-syncs.
    pub out_sync_count: u32,
    /// Out: the sync_file fd, or -1.
    pub out_fence_fd: i32,
    /// User pointer to `[Sync; in_sync_count]`.
    pub in_syncs: u64,
    /// User pointer to `[Sync; out_sync_count]`.
    pub out_syncs: u64,
    /// Out: the job's sequence number on its context.
    pub seqno: u64,
}

/// `struct drm_refgpu_obj_array`: an array of structures that may grow in
/// later versions. A `stride` below the structure this crate defines is
/// `EINVAL`, a larger one (at most 4096) must have zero bytes past it
/// (`E2BIG`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjArray {
    /// The size of one element, as the caller knows the structure.
    pub stride: u32,
    /// Elements.
    pub count: u32,
    /// User pointer to `count` elements, `stride` bytes apart.
    pub array: u64,
}

impl ObjArray {
    /// The array of `items`, with their own size as the stride.
    pub fn of<T>(items: &[T]) -> ObjArray {
        ObjArray {
            stride: core::mem::size_of::<T>() as u32,
            count: items.len() as u32,
            array: items.as_ptr() as u64,
        }
    }
}

/// SUBMIT_BATCH sync types (`REFGPU_BATCH_SYNC_*`).
pub mod batch_sync {
    /// A binary syncobj; `point` must be 0.
    pub const BINARY: u32 = 0;
    /// A non-zero point on a timeline syncobj.
    pub const TIMELINE: u32 = 1;
    /// The bits the type takes.
    pub const TYPE_MASK: u32 = 0xff;
}

/// `struct drm_refgpu_batch_sync`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchSync {
    /// The syncobj handle.
    pub handle: u32,
    /// A [`batch_sync`] type; other bits zero.
    pub flags: u32,
    /// `TIMELINE`: the point, non-zero; `BINARY`: zero.
    pub point: u64,
}

/// `struct drm_refgpu_batch_job`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchJob {
    /// Must be zero.
    pub flags: u32,
    /// The IB's size in dwords.
    pub ib_size_dw: u32,
    /// GPU VA of the IB.
    pub ib_va: u64,
    /// [`BatchSync`]s waited for.
    pub in_syncs: ObjArray,
    /// [`BatchSync`]s signalled with the job's fence.
    pub out_syncs: ObjArray,
}

/// SUBMIT_BATCH `error_index` when the error is not one job's.
pub const BATCH_NO_INDEX: u32 = u32::MAX;

/// `struct drm_refgpu_submit_batch`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubmitBatch {
    /// In: the context id.
    pub ctx_id: u32,
    /// Must be zero.
    pub flags: u32,
    /// In: the [`BatchJob`]s, queued in array order.
    pub jobs: ObjArray,
    /// Out: the sequence number of `jobs[0]` (`jobs[i]` has `first_seqno + i`).
    pub first_seqno: u64,
    /// Out: the job whose check failed, or [`BATCH_NO_INDEX`].
    pub error_index: u32,
    /// Must be zero.
    pub pad: u32,
}

/// Context states of CTX_QUERY (`REFGPU_CTX_STATE_*`).
pub mod ctx_state {
    /// No reset touched the context.
    pub const OK: u32 = 0;
    /// Its engine was reset for another context; its jobs ran again.
    pub const INNOCENT: u32 = 1;
    /// It hung or faulted: its submits fail with `ECANCELED`.
    pub const GUILTY: u32 = 2;
    /// The device stopped responding.
    pub const DEVICE_LOST: u32 = 3;
}

/// `struct drm_refgpu_ctx_query`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtxQuery {
    /// In: the context id.
    pub ctx_id: u32,
    /// Out: a [`ctx_state`] value.
    pub state: u32,
    /// Out: the context's engine.
    pub engine: u32,
    /// Must be zero.
    pub pad: u32,
    /// Out: engine resets that had this context's jobs in the ring (it
    /// was guilty or innocent); other clients' resets do not count.
    pub reset_count: u64,
    /// Out: FAULT_STATUS when guilty by a fault, else 0.
    pub fault_status: u64,
    /// Out: the faulting GPU address, or 0.
    pub fault_addr: u64,
    /// Out: when guilty, the SUBMIT `seqno` of the job that hung or
    /// faulted (every later job of the context failed too); else 0.
    pub guilty_seqno: u64,
}
