//! The DRM platform: kernel-mediated mode over the refgpu kernel driver's
//! render node (`kmd/`, uAPI in `docs/linux.md`).
//!
//! [`Drm`] implements [`KernelIo`]: buffer objects are GEM objects
//! (`BO_CREATE`, mapped for the CPU through `BO_MMAP_OFFSET` + `mmap` unless
//! created device-only), binds are `VM_BIND`, each queue is a kernel context
//! (`CTX_CREATE`) and signals points of its own timeline syncobj, host waits
//! are `DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT`, reset status is `CTX_QUERY`. Core
//! DRM ioctls go through `drm-ffi`; the driver's own through `rustix`.
//!
//! Besides the trait: [`Drm::export_sync_file`] turns a fence's timeline
//! point into a sync_file for another process or device,
//! [`Drm::import_sync_file`] and [`Drm::import_syncobj`] turn foreign syncs
//! into [`ForeignSync`]s a submission can wait for
//! ([`umd_core::engine::Submit::after_foreign`]).

use std::ffi::c_void;
use std::fmt;
use std::fs::OpenOptions;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use refgpu_uapi as u;
use rustix::io::Errno;
use rustix::ioctl::{Ioctl, IoctlOutput, Opcode};
use rustix::mm::{MapFlags, ProtFlags};
use umd_core::platform::{
    submit_each, BatchError, ContextId, ContextStatus, DmaFlags, DmaRegion, ForeignSync, Guilt, KernelInfo,
    KernelIo, KernelJob, KernelSubmitError, KernelSync, KernelWait, Platform, PlatformError,
};

/// The GPU page size (VM_BIND granule).
const PAGE: u64 = 4096;

/// `DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE`: `DRM_IOWR(0xC2, struct drm_syncobj_handle)`.
const DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE: u32 = (3 << 30)
    | ((std::mem::size_of::<drm_ffi::drm_syncobj_handle>() as u32) << 16)
    | ((b'd' as u32) << 8)
    | 0xC2;

/// Why a refgpu render node could not be opened.
#[derive(Debug)]
pub enum DrmError {
    /// Opening the node failed.
    Open(PathBuf, std::io::Error),
    /// No render node of the refgpu driver was found.
    NotFound,
    /// The node belongs to another driver.
    NotRefgpu(PathBuf, String),
    /// An ioctl failed during bring-up.
    Ioctl(&'static str, Errno),
    /// A bad `UMD_*` variable or `UMD_CONFIG` file ([`crate::config`]).
    Config(crate::config::ConfigError),
}

impl fmt::Display for DrmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DrmError::Open(p, e) => write!(f, "opening {}: {e}", p.display()),
            DrmError::NotFound => write!(f, "no refgpu render node under /dev/dri"),
            DrmError::NotRefgpu(p, name) => write!(f, "{} is driven by {name:?}, not refgpu", p.display()),
            DrmError::Ioctl(what, e) => write!(f, "{what}: {e}"),
            DrmError::Config(e) => write!(f, "configuration from the environment: {e}"),
        }
    }
}

impl std::error::Error for DrmError {}

/// One ioctl with an argument the kernel reads and writes back.
struct Call<'a, T> {
    op: u32,
    arg: &'a mut T,
}

// SAFETY: `op` is one of refgpu_uapi's request codes and `T` the structure
// the request encodes (refgpu-uapi's layout test checks both against the C
// header); the kernel reads and writes only `size_of::<T>()` bytes.
unsafe impl<T> Ioctl for Call<'_, T> {
    type Output = ();
    const IS_MUTATING: bool = true;

    fn opcode(&self) -> Opcode {
        self.op as Opcode
    }

    fn as_ptr(&mut self) -> *mut c_void {
        (self.arg as *mut T).cast()
    }

    unsafe fn output_from_ptr(_: IoctlOutput, _: *mut c_void) -> rustix::io::Result<()> {
        Ok(())
    }
}

/// The driver's errnos: `EIO` a lost device (present, not answering),
/// `ENODEV` an unplugged one; both end the device for the UMD.
fn os(e: Errno) -> PlatformError {
    match e {
        Errno::NODEV | Errno::IO => PlatformError::DeviceLost,
        Errno::NOMEM => PlatformError::OutOfMemory { len: 0 },
        e => PlatformError::Os(e.raw_os_error()),
    }
}

fn io_os(e: std::io::Error) -> PlatformError {
    // An error without an errno is not the device's.
    Errno::from_io_error(&e).map_or(PlatformError::Os(Errno::IO.raw_os_error()), os)
}

/// One job of [`Drm::submit_jobs`]: an IB and the syncobjs it waits for
/// and signals (`SUBMIT_BATCH`, docs/linux.md).
#[derive(Clone, Copy, Debug)]
pub struct BatchJob<'a> {
    /// The IB's GPU address.
    pub ib_va: u64,
    /// Its length in dwords.
    pub ib_dwords: u32,
    /// Waited for before the job runs.
    pub in_syncs: &'a [u::BatchSync],
    /// Signalled with the job's fence.
    pub out_syncs: &'a [u::BatchSync],
}

/// Why [`Drm::submit_jobs`] failed: no job was queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRefused {
    /// The kernel's errno (`EINVAL` from a kernel without `SUBMIT_BATCH`, as
    /// for any ioctl a DRM driver does not have).
    pub errno: Errno,
    /// The job the error is about, when it is one job's.
    pub job: Option<usize>,
}

/// A refgpu render node, as a kernel-mode platform.
#[derive(Debug)]
pub struct Drm {
    fd: OwnedFd,
    info: KernelInfo,
    generation: u32,
    /// Jobs one `SUBMIT_BATCH` takes; 0 when the kernel (minor version 0)
    /// has no such call. Read once, at open.
    max_batch: usize,
    /// One timeline syncobj per queue.
    timelines: Vec<u32>,
    /// Binary syncobjs holding imported foreign syncs.
    foreign: Mutex<Vec<u32>>,
    /// The configuration the environment gives ([`Drm::config`]).
    config: umd_core::config::Config,
    /// Ioctls made since the node was opened ([`Drm::ioctls`]).
    ioctls: AtomicU64,
}

impl Drm {
    /// Opens the first render node driven by `refgpu`.
    pub fn open_default() -> Result<Drm, DrmError> {
        let mut nodes: Vec<PathBuf> = std::fs::read_dir("/dev/dri")
            .map_err(|e| DrmError::Open("/dev/dri".into(), e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("renderD")))
            .collect();
        nodes.sort();
        for n in nodes {
            match Drm::open(&n) {
                Err(DrmError::NotRefgpu(..)) => continue,
                r => return r,
            }
        }
        Err(DrmError::NotFound)
    }

    /// Opens the render node at `path`: checks the driver, reads its
    /// parameters and creates a timeline per queue. The `UMD_*`
    /// environment is read first ([`Drm::config`]); a bad value is
    /// [`DrmError::Config`] and nothing is opened.
    pub fn open(path: &Path) -> Result<Drm, DrmError> {
        let config = crate::config::from_env().map_err(DrmError::Config)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| DrmError::Open(path.to_path_buf(), e))?;
        let fd: OwnedFd = file.into();
        let (name, minor) =
            driver_version(fd.as_fd()).map_err(|e| DrmError::Ioctl("DRM_IOCTL_VERSION", e))?;
        if name != "refgpu" {
            return Err(DrmError::NotRefgpu(path.to_path_buf(), name));
        }
        let param =
            |p: u32, what: &'static str| get_param(fd.as_fd(), p).map_err(|e| DrmError::Ioctl(what, e));
        let info = KernelInfo {
            chip_id: param(u::param::CHIP_ID, "GET_PARAM CHIP_ID")? as u32,
            engines: param(u::param::ENGINE_COUNT, "GET_PARAM ENGINE_COUNT")? as u32,
            va_start: param(u::param::VA_START, "GET_PARAM VA_START")?,
            va_end: param(u::param::VA_END, "GET_PARAM VA_END")?,
            ib_align: param(u::param::IB_ALIGN, "GET_PARAM IB_ALIGN")?,
        };
        let generation = param(u::param::GENERATION, "GET_PARAM GENERATION")? as u32;
        // SUBMIT_BATCH came with minor version 1: an older kernel gets a
        // SUBMIT per job.
        let max_batch = if minor >= u::MINOR_SUBMIT_BATCH {
            param(u::param::MAX_BATCH_JOBS, "GET_PARAM MAX_BATCH_JOBS")? as usize
        } else {
            0
        };
        let mut timelines = Vec::new();
        for _ in 0..info.engines {
            match drm_ffi::syncobj::create(fd.as_fd(), false) {
                Ok(s) => timelines.push(s.handle),
                Err(e) => {
                    return Err(DrmError::Ioctl(
                        "SYNCOBJ_CREATE",
                        Errno::from_io_error(&e).unwrap_or(Errno::IO),
                    ))
                }
            }
        }
        Ok(Drm {
            fd,
            info,
            generation,
            max_batch,
            timelines,
            foreign: Mutex::new(Vec::new()),
            config,
            ioctls: AtomicU64::new(0),
        })
    }

    /// The driver configuration for devices on this node: the defaults
    /// with the `UMD_*` environment and `UMD_CONFIG` file applied (read
    /// when the node was opened, [`crate::config`]).
    pub fn config(&self) -> umd_core::config::Config {
        self.config
    }

    /// The DRM file descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The chip's generation (1 or 2), as the kernel reports it.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The ioctls this node has made since it was opened (those of
    /// [`Drm::open`] not counted): what a submission, a wait or a buffer
    /// costs in calls into the kernel.
    pub fn ioctls(&self) -> u64 {
        self.ioctls.load(Ordering::Relaxed)
    }

    /// Counts one ioctl ([`Drm::ioctls`]).
    fn count(&self) {
        self.ioctls.fetch_add(1, Ordering::Relaxed);
    }

    /// How many jobs one [`Drm::submit_jobs`] takes: 0 when the kernel
    /// has no `SUBMIT_BATCH` (driver minor version 0).
    pub fn max_batch_jobs(&self) -> usize {
        self.max_batch
    }

    /// `SUBMIT_BATCH`: queues `jobs` on context `ctx`, in order, all or
    /// none, in one ioctl. Returns the first job's sequence number on the
    /// context (the others follow it one by one). At most
    /// [`Drm::max_batch_jobs`] jobs (`EINVAL` past it, and from a
    /// kernel without the call).
    pub fn submit_jobs(&self, ctx: ContextId, jobs: &[BatchJob<'_>]) -> Result<u64, BatchRefused> {
        let refused = |errno| BatchRefused { errno, job: None };
        let count = u32::try_from(jobs.len()).map_err(|_| refused(Errno::INVAL))?;
        let array = |s: &[u::BatchSync]| -> Result<u::ObjArray, BatchRefused> {
            let mut a = u::ObjArray::of(s);
            a.count = u32::try_from(s.len()).map_err(|_| refused(Errno::INVAL))?;
            Ok(a)
        };
        let mut descs = Vec::with_capacity(jobs.len());
        for j in jobs {
            descs.push(u::BatchJob {
                flags: 0,
                ib_size_dw: j.ib_dwords,
                ib_va: j.ib_va,
                in_syncs: array(j.in_syncs)?,
                out_syncs: array(j.out_syncs)?,
            });
        }
        let mut a = u::SubmitBatch { ctx_id: ctx.0, jobs: u::ObjArray::of(&descs), ..Default::default() };
        a.jobs.count = count;
        // `descs` and the sync slices it points into outlive the call.
        match self.call(u::DRM_IOCTL_REFGPU_SUBMIT_BATCH, &mut a) {
            Ok(()) => Ok(a.first_seqno),
            Err(errno) => Err(BatchRefused {
                errno,
                job: (a.error_index != u::BATCH_NO_INDEX).then_some(a.error_index as usize),
            }),
        }
    }

    fn timeline(&self, queue: u32) -> Result<u32, PlatformError> {
        self.timelines.get(queue as usize).copied().ok_or(PlatformError::Os(Errno::INVAL.raw_os_error()))
    }

    fn call<T>(&self, op: u32, arg: &mut T) -> Result<(), Errno> {
        self.count();
        // SAFETY: see `Call`; callers pair each request code with its
        // structure.
        unsafe { rustix::ioctl::ioctl(&self.fd, Call { op, arg }) }
    }

    fn bind_ops(&self, ops: &[u::VmBindOp]) -> Result<(), PlatformError> {
        let mut a = u::VmBind { op_count: ops.len() as u32, ops: ops.as_ptr() as u64, ..Default::default() };
        self.call(u::DRM_IOCTL_REFGPU_VM_BIND, &mut a).map_err(os)
    }

    /// Exports `sync` (a fence's point, see
    /// [`umd_core::kernel::KernelDevice::sync_point`]) as a sync_file.
    pub fn export_sync_file(&self, sync: KernelSync) -> Result<OwnedFd, PlatformError> {
        let tl = self.timeline(sync.queue)?;
        self.count();
        let tmp = drm_ffi::syncobj::create(self.fd(), false).map_err(io_os)?.handle;
        self.count();
        let r = drm_ffi::syncobj::transfer(self.fd(), tl, tmp, sync.point, 0).and_then(|_| {
            self.count();
            drm_ffi::syncobj::handle_to_fd(self.fd(), tmp, true)
        });
        self.count();
        let _ = drm_ffi::syncobj::destroy(self.fd(), tmp);
        let h = r.map_err(io_os)?;
        // SAFETY: the kernel returned a new file descriptor we now own.
        Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(h.fd) })
    }

    /// Exports queue `queue`'s whole timeline as a syncobj fd (another
    /// process imports it with `SYNCOBJ_FD_TO_HANDLE` and waits for points).
    pub fn export_timeline(&self, queue: u32) -> Result<OwnedFd, PlatformError> {
        self.count();
        let h = drm_ffi::syncobj::handle_to_fd(self.fd(), self.timeline(queue)?, false).map_err(io_os)?;
        // SAFETY: the kernel returned a new file descriptor we now own.
        Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(h.fd) })
    }

    /// Imports a sync_file: a submission made with it in
    /// [`umd_core::engine::Submit::after_foreign`] waits for its fence.
    pub fn import_sync_file(&self, fd: BorrowedFd<'_>) -> Result<ForeignSync, PlatformError> {
        self.count();
        let h = drm_ffi::syncobj::create(self.fd(), false).map_err(io_os)?.handle;
        let mut a = drm_ffi::drm_syncobj_handle {
            handle: h,
            flags: drm_ffi::DRM_SYNCOBJ_FD_TO_HANDLE_FLAGS_IMPORT_SYNC_FILE,
            fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
            pad: 0,
            point: 0,
        };
        // drm-ffi's wrapper imports into handle 0 (which the kernel
        // refuses): the ioctl is made here, into the new syncobj.
        let r = self.call(DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE, &mut a).map_err(os);
        if let Err(e) = r {
            self.count();
            let _ = drm_ffi::syncobj::destroy(self.fd(), h);
            return Err(e);
        }
        self.keep_foreign(h);
        Ok(ForeignSync(u64::from(h)))
    }

    /// Imports a binary syncobj fd another process exported.
    pub fn import_syncobj(&self, fd: BorrowedFd<'_>) -> Result<ForeignSync, PlatformError> {
        self.count();
        let h = drm_ffi::syncobj::fd_to_handle(self.fd(), fd, false).map_err(io_os)?.handle;
        self.keep_foreign(h);
        Ok(ForeignSync(u64::from(h)))
    }

    fn keep_foreign(&self, h: u32) {
        self.foreign.lock().unwrap_or_else(|p| p.into_inner()).push(h);
    }

    /// Forgets an imported sync (submissions already made keep waiting for
    /// it). An unknown one changes nothing.
    pub fn release_foreign(&self, f: ForeignSync) {
        let mut v = self.foreign.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = v.iter().position(|h| u64::from(*h) == f.0) {
            let h = v.swap_remove(i);
            self.count();
            let _ = drm_ffi::syncobj::destroy(self.fd(), h);
        }
    }

    fn is_foreign(&self, f: ForeignSync) -> bool {
        self.foreign.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|h| u64::from(*h) == f.0)
    }
}

impl Drop for Drm {
    fn drop(&mut self) {
        for h in self.timelines.drain(..) {
            let _ = drm_ffi::syncobj::destroy(self.fd.as_fd(), h);
        }
        for h in self.foreign.get_mut().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = drm_ffi::syncobj::destroy(self.fd.as_fd(), h);
        }
    }
}

/// The driver's name and minor version (`DRM_IOCTL_VERSION`).
fn driver_version(fd: BorrowedFd<'_>) -> Result<(String, i32), Errno> {
    let mut name: Vec<i8> = Vec::new();
    let v = drm_ffi::get_version(fd, Some(&mut name), None, None)
        .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
    Ok((name.iter().map(|c| *c as u8 as char).collect(), v.version_minor))
}

fn get_param(fd: BorrowedFd<'_>, param: u32) -> Result<u64, Errno> {
    let mut a = u::GetParam { param, ..Default::default() };
    // SAFETY: see `Call`.
    unsafe { rustix::ioctl::ioctl(fd, Call { op: u::DRM_IOCTL_REFGPU_GET_PARAM, arg: &mut a }) }?;
    Ok(a.value)
}

fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64)
}

// SAFETY: regions are GEM objects of this file, mapped shared for the CPU
// at a page-aligned address for their whole size and unmapped only in
// `dma_free`; the device reaches them through the VM bindings the core
// makes. The clock is CLOCK_MONOTONIC.
unsafe impl Platform for Drm {
    type RawMutex = crate::FairLock;

    fn dma_alloc(&self, len: usize, flags: DmaFlags) -> Result<DmaRegion, PlatformError> {
        let size = (len.max(1) as u64).next_multiple_of(PAGE);
        let bo_flags = if flags.device_only { u::BO_NO_CPU_MAPPING } else { 0 };
        let mut c = u::BoCreate { size, flags: bo_flags, ..Default::default() };
        self.call(u::DRM_IOCTL_REFGPU_BO_CREATE, &mut c).map_err(|e| match e {
            Errno::NOMEM | Errno::TOOBIG => PlatformError::OutOfMemory { len },
            e => os(e),
        })?;
        let close = |e| {
            self.count();
            let _ = drm_ffi::gem::close(self.fd(), c.handle);
            e
        };
        let cpu = if flags.device_only {
            None
        } else {
            let mut m = u::BoMmapOffset { handle: c.handle, ..Default::default() };
            self.call(u::DRM_IOCTL_REFGPU_BO_MMAP_OFFSET, &mut m).map_err(|e| close(os(e)))?;
            // SAFETY: a new shared mapping of the object (the kernel checks
            // the offset and size); nothing else maps this address.
            let p = unsafe {
                rustix::mm::mmap(
                    std::ptr::null_mut(),
                    size as usize,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::SHARED,
                    &self.fd,
                    m.offset,
                )
            }
            .map_err(|e| close(os(e)))?;
            Some(NonNull::new(p.cast::<u8>()).ok_or_else(|| close(PlatformError::OutOfMemory { len }))?)
        };
        // SAFETY: see the impl comment; the handle names this object alone.
        Ok(unsafe { DmaRegion::with_handle(cpu, 0, size as usize, u64::from(c.handle)) })
    }

    fn dma_free(&self, region: DmaRegion) {
        if let Some(p) = region.cpu_ptr() {
            // SAFETY: the mapping `dma_alloc` made, of the region's length.
            let _ = unsafe { rustix::mm::munmap(p.as_ptr().cast(), region.len()) };
        }
        if let Ok(h) = u32::try_from(region.handle()) {
            self.count();
            let _ = drm_ffi::gem::close(self.fd(), h);
        }
    }

    fn now_ns(&self) -> u64 {
        now_ns()
    }

    fn delay_ns(&self, ns: u64) {
        std::thread::sleep(std::time::Duration::from_nanos(ns));
    }
}

impl KernelIo for Drm {
    fn info(&self) -> Result<KernelInfo, PlatformError> {
        Ok(self.info)
    }

    fn create_context(&self, queue: u32) -> Result<ContextId, PlatformError> {
        let mut a = u::CtxCreate { engine: queue, ..Default::default() };
        self.call(u::DRM_IOCTL_REFGPU_CTX_CREATE, &mut a).map_err(os)?;
        Ok(ContextId(a.ctx_id))
    }

    fn destroy_context(&self, ctx: ContextId) {
        let mut a = u::CtxDestroy { ctx_id: ctx.0, pad: 0 };
        let _ = self.call(u::DRM_IOCTL_REFGPU_CTX_DESTROY, &mut a);
    }

    fn context_status(&self, ctx: ContextId) -> Result<ContextStatus, PlatformError> {
        let mut a = u::CtxQuery { ctx_id: ctx.0, ..Default::default() };
        self.call(u::DRM_IOCTL_REFGPU_CTX_QUERY, &mut a).map_err(os)?;
        Ok(match a.state {
            u::ctx_state::OK => ContextStatus::Ok,
            u::ctx_state::INNOCENT => ContextStatus::Innocent,
            u::ctx_state::GUILTY => {
                let cause = if a.fault_status != 0 {
                    Guilt::Fault { status: a.fault_status as u32, addr: a.fault_addr }
                } else {
                    Guilt::Hang
                };
                ContextStatus::Guilty { seqno: a.guilty_seqno, cause }
            }
            _ => ContextStatus::DeviceLost,
        })
    }

    fn bind(
        &self,
        va: u64,
        region: &DmaRegion,
        offset: u64,
        len: u64,
        read_only: bool,
    ) -> Result<(), PlatformError> {
        let handle =
            u32::try_from(region.handle()).map_err(|_| PlatformError::Os(Errno::INVAL.raw_os_error()))?;
        let op = u::VmBindOp {
            op: u::VM_BIND_OP_MAP,
            flags: if read_only { u::VM_BIND_READ_ONLY } else { 0 },
            handle,
            bo_offset: offset,
            va,
            size: len.next_multiple_of(PAGE),
            ..Default::default()
        };
        self.bind_ops(&[op])
    }

    fn unbind(&self, va: u64, len: u64) -> Result<(), PlatformError> {
        let op = u::VmBindOp {
            op: u::VM_BIND_OP_UNMAP,
            va,
            size: len.next_multiple_of(PAGE),
            ..Default::default()
        };
        self.bind_ops(&[op])
    }

    fn submit(
        &self,
        ctx: ContextId,
        ib_va: u64,
        ib_dwords: u32,
        waits: &[KernelWait],
        signal: KernelSync,
    ) -> Result<u64, KernelSubmitError> {
        let mut ins = [u::Sync::default(); 16];
        let mut n = 0;
        for w in waits {
            let s = match *w {
                KernelWait::Point(p) => u::Sync {
                    handle: self.timeline(p.queue).map_err(KernelSubmitError::Platform)?,
                    flags: 0,
                    point: p.point,
                },
                KernelWait::Foreign(f) if self.is_foreign(f) => {
                    u::Sync { handle: f.0 as u32, flags: 0, point: 0 }
                }
                KernelWait::Foreign(_) => {
                    return Err(KernelSubmitError::Platform(PlatformError::Os(Errno::NOENT.raw_os_error())))
                }
            };
            let slot = ins
                .get_mut(n)
                .ok_or(KernelSubmitError::Platform(PlatformError::Os(Errno::INVAL.raw_os_error())))?;
            *slot = s;
            n += 1;
        }
        let out = [u::Sync {
            handle: self.timeline(signal.queue).map_err(KernelSubmitError::Platform)?,
            flags: 0,
            point: signal.point,
        }];
        let mut a = u::Submit {
            ctx_id: ctx.0,
            ib_va,
            ib_size_dw: ib_dwords,
            in_sync_count: n as u32,
            out_sync_count: 1,
            out_fence_fd: -1,
            in_syncs: ins.as_ptr() as u64,
            out_syncs: out.as_ptr() as u64,
            ..Default::default()
        };
        self.call(u::DRM_IOCTL_REFGPU_SUBMIT, &mut a).map(|()| a.seqno).map_err(submit_error)
    }

    fn submit_batch(&self, ctx: ContextId, jobs: &[KernelJob<'_>]) -> Result<u64, BatchError> {
        // One job is one SUBMIT: a batch of one costs more than SUBMIT in
        // the kernel (docs/perf.md, "Kernel-mode driver in a guest").
        if self.max_batch == 0 || jobs.len() == 1 {
            return submit_each(self, ctx, jobs);
        }
        let mut first = None;
        for (c, chunk) in jobs.chunks(self.max_batch).enumerate() {
            let queued = c * self.max_batch;
            let platform = |e| BatchError { queued, error: KernelSubmitError::Platform(e) };
            // Per job: its waits, then its one signal.
            let mut syncs: Vec<Vec<u::BatchSync>> = Vec::with_capacity(chunk.len());
            for j in chunk {
                let mut v = Vec::with_capacity(j.waits.len() + 1);
                for w in j.waits {
                    v.push(match *w {
                        KernelWait::Point(p) => {
                            let handle = self.timeline(p.queue).map_err(platform)?;
                            batch_sync(handle, p.point)
                        }
                        KernelWait::Foreign(f) if self.is_foreign(f) => batch_sync(f.0 as u32, 0),
                        KernelWait::Foreign(_) => {
                            return Err(platform(PlatformError::Os(Errno::NOENT.raw_os_error())))
                        }
                    });
                }
                v.push(batch_sync(self.timeline(j.signal.queue).map_err(platform)?, j.signal.point));
                syncs.push(v);
            }
            let descs: Vec<BatchJob<'_>> = chunk
                .iter()
                .zip(&syncs)
                .map(|(j, s)| {
                    let (ins, out) = s.split_at(s.len() - 1);
                    BatchJob { ib_va: j.ib_va, ib_dwords: j.ib_dwords, in_syncs: ins, out_syncs: out }
                })
                .collect();
            let seq = self
                .submit_jobs(ctx, &descs)
                .map_err(|r| BatchError { queued, error: submit_error(r.errno) })?;
            first.get_or_insert(seq);
        }
        Ok(first.unwrap_or(0))
    }

    fn completed(&self, queue: u32) -> Result<u64, PlatformError> {
        let mut points = [0u64];
        self.count();
        drm_ffi::syncobj::query(self.fd(), &[self.timeline(queue)?], &mut points, false).map_err(io_os)?;
        Ok(points[0])
    }

    fn wait(&self, sync: KernelSync, timeout_ns: u64) -> Result<bool, PlatformError> {
        let deadline = now_ns().saturating_add(timeout_ns).min(i64::MAX as u64) as i64;
        let tl = self.timeline(sync.queue)?;
        self.count();
        match drm_ffi::syncobj::timeline_wait(self.fd(), &[tl], &[sync.point], deadline, true, true, false) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(Errno::TIME.raw_os_error()) => Ok(false),
            Err(e) if e.raw_os_error() == Some(Errno::INTR.raw_os_error()) => Ok(false),
            Err(e) => Err(io_os(e)),
        }
    }

    fn signal(&self, sync: KernelSync) -> Result<(), PlatformError> {
        self.count();
        drm_ffi::syncobj::timeline_signal(self.fd(), &[self.timeline(sync.queue)?], &[sync.point])
            .map(|_| ())
            .map_err(io_os)
    }
}

/// SUBMIT's and SUBMIT_BATCH's errnos, as the core sees them.
fn submit_error(e: Errno) -> KernelSubmitError {
    match e {
        Errno::CANCELED => KernelSubmitError::Cancelled,
        Errno::NODEV | Errno::IO => KernelSubmitError::DeviceLost,
        e => KernelSubmitError::Platform(os(e)),
    }
}

/// A SUBMIT_BATCH sync: a timeline point, or (point 0) a binary syncobj,
/// as SUBMIT reads `point`.
fn batch_sync(handle: u32, point: u64) -> u::BatchSync {
    let flags = if point == 0 { u::batch_sync::BINARY } else { u::batch_sync::TIMELINE };
    u::BatchSync { handle, flags, point }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_or_unplugged_device_is_lost_and_nothing_else_is() {
        assert_eq!(os(Errno::IO), PlatformError::DeviceLost);
        assert_eq!(os(Errno::NODEV), PlatformError::DeviceLost);
        assert_eq!(os(Errno::FAULT), PlatformError::Os(Errno::FAULT.raw_os_error()));
        assert_eq!(os(Errno::INVAL), PlatformError::Os(Errno::INVAL.raw_os_error()));
        // An error without an errno is not the device's.
        let other = std::io::Error::other("not an OS error");
        assert_eq!(io_os(other), PlatformError::Os(Errno::IO.raw_os_error()));
        let eio = std::io::Error::from_raw_os_error(Errno::IO.raw_os_error());
        assert_eq!(io_os(eio), PlatformError::DeviceLost);
    }
}
