//! The DRM file: core DRM ioctls (`include/uapi/drm/drm.h`), refgpu's
//! (through `refgpu_uapi`), mmap, sync_file info. Errors are errno values.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use refgpu_uapi as u;

/// An errno.
pub type Errno = i32;

/// `_IOC` request codes for the core ioctls.
const fn ioc(dir: u32, ty: u8, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | ((ty as u32) << 8) | nr
}
const fn drm_iowr<T>(nr: u32) -> u32 {
    ioc(3, b'd', nr, std::mem::size_of::<T>())
}
const fn drm_iow<T>(nr: u32) -> u32 {
    ioc(1, b'd', nr, std::mem::size_of::<T>())
}

/// `struct drm_version`.
#[repr(C)]
#[derive(Default)]
pub struct DrmVersion {
    /// Major.
    pub major: i32,
    /// Minor.
    pub minor: i32,
    /// Patch level.
    pub patch: i32,
    /// Name buffer length.
    pub name_len: usize,
    /// Name buffer.
    pub name: u64,
    /// Date buffer length.
    pub date_len: usize,
    /// Date buffer.
    pub date: u64,
    /// Description buffer length.
    pub desc_len: usize,
    /// Description buffer.
    pub desc: u64,
}

#[repr(C)]
#[derive(Default)]
struct GemClose {
    handle: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Default)]
struct PrimeHandle {
    handle: u32,
    flags: u32,
    fd: i32,
}

#[repr(C)]
#[derive(Default)]
struct SyncobjCreate {
    handle: u32,
    flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct SyncobjDestroy {
    handle: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Default)]
struct SyncobjTimelineWait {
    handles: u64,
    points: u64,
    timeout_nsec: i64,
    count_handles: u32,
    flags: u32,
    first_signaled: u32,
    pad: u32,
    deadline_nsec: u64,
}

#[repr(C)]
#[derive(Default)]
struct SyncobjWait {
    handles: u64,
    timeout_nsec: i64,
    count_handles: u32,
    flags: u32,
    first_signaled: u32,
    pad: u32,
    deadline_nsec: u64,
}

#[repr(C)]
#[derive(Default)]
struct SyncobjTimelineArray {
    handles: u64,
    points: u64,
    count_handles: u32,
    flags: u32,
}

/// `DRM_IOCTL_VERSION`.
pub const DRM_IOCTL_VERSION: u32 = drm_iowr::<DrmVersion>(0x00);
const DRM_IOCTL_GEM_CLOSE: u32 = drm_iow::<GemClose>(0x09);
const DRM_IOCTL_PRIME_HANDLE_TO_FD: u32 = drm_iowr::<PrimeHandle>(0x2d);
const DRM_IOCTL_PRIME_FD_TO_HANDLE: u32 = drm_iowr::<PrimeHandle>(0x2e);
const DRM_IOCTL_SYNCOBJ_CREATE: u32 = drm_iowr::<SyncobjCreate>(0xBF);
const DRM_IOCTL_SYNCOBJ_DESTROY: u32 = drm_iowr::<SyncobjDestroy>(0xC0);
const DRM_IOCTL_SYNCOBJ_WAIT: u32 = drm_iowr::<SyncobjWait>(0xC3);
const DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT: u32 = drm_iowr::<SyncobjTimelineWait>(0xCA);
const DRM_IOCTL_SYNCOBJ_QUERY: u32 = drm_iowr::<SyncobjTimelineArray>(0xCB);
/// `DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL`.
const WAIT_ALL: u32 = 1 << 0;
/// `DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT`.
const WAIT_FOR_SUBMIT: u32 = 1 << 1;
/// `DRM_RDWR | DRM_CLOEXEC` for PRIME export.
const PRIME_FLAGS: u32 = 0o2 | 0o2000000;

/// `struct sync_file_info`.
#[repr(C)]
#[derive(Default)]
struct SyncFileInfo {
    name: [u8; 32],
    status: i32,
    flags: u32,
    num_fences: u32,
    pad: u32,
    sync_fence_info: u64,
}
const SYNC_IOC_FILE_INFO: u32 = ioc(3, b'>', 4, std::mem::size_of::<SyncFileInfo>());

/// The calling thread's errno.
pub fn errno() -> Errno {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `ioctl(fd, req, arg)`, retried on EINTR/EAGAIN as libdrm does.
pub fn ioctl<T>(fd: RawFd, req: u32, arg: &mut T) -> Result<(), Errno> {
    loop {
        match ioctl_once(fd, req, arg) {
            Err(e) if e == libc::EINTR || e == libc::EAGAIN => {}
            r => return r,
        }
    }
}

/// `ioctl(fd, req, arg)` once: EINTR is returned, not retried.
pub fn ioctl_once<T>(fd: RawFd, req: u32, arg: &mut T) -> Result<(), Errno> {
    // SAFETY: `arg` is a live, exclusively borrowed #[repr(C)] value of
    // the size encoded in `req`; the kernel reads and writes at most
    // that many bytes. Pointers inside it are the caller's business
    // (the tests pass valid buffers, or invalid ones on purpose: the
    // kernel checks them with copy_from_user).
    let r = unsafe { libc::ioctl(fd, req as _, arg as *mut T) };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn now_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// An open refgpu render node.
pub struct Dev {
    fd: OwnedFd,
}

/// The refgpu render node (`/dev/dri/renderD<minor>`), found through
/// sysfs: the minor is the first free one when the device registers, which
/// after an unbind depends on whether the old device was released yet.
pub fn render_node() -> Option<String> {
    std::fs::read_dir("/sys/class/drm").ok()?.flatten().find_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let driver = std::fs::read_link(e.path().join("device/driver")).ok()?;
        (name.starts_with("renderD") && driver.file_name()? == "refgpu").then(|| format!("/dev/dri/{name}"))
    })
}

impl Dev {
    /// Opens the render node.
    pub fn open() -> Result<Dev, Errno> {
        let node = render_node().ok_or(libc::ENOENT)?;
        let p = CString::new(node).map_err(|_| libc::EINVAL)?;
        Dev::open_node(&p)
    }

    /// Opens the render node `node` (the open(2) alone).
    pub fn open_node(node: &std::ffi::CStr) -> Result<Dev, Errno> {
        // SAFETY: open(2) on a NUL-terminated path.
        let fd = unsafe { libc::open(node.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(errno());
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        Ok(Dev { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// The raw file descriptor.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// A raw ioctl on this file.
    pub fn ioctl<T>(&self, req: u32, arg: &mut T) -> Result<(), Errno> {
        ioctl(self.fd(), req, arg)
    }

    /// DRM_IOCTL_VERSION with the driver name.
    pub fn version(&self) -> Result<(DrmVersion, String), Errno> {
        let mut name = [0u8; 64];
        let mut v = DrmVersion { name_len: name.len(), name: name.as_mut_ptr() as u64, ..Default::default() };
        self.ioctl(DRM_IOCTL_VERSION, &mut v)?;
        let n = v.name_len.min(name.len());
        let s = String::from_utf8_lossy(&name[..n]).into_owned();
        Ok((v, s))
    }

    /// DRM_IOCTL_VERSION without buffers (the null ioctl of the benchmark).
    pub fn version_null(&self) -> Result<(), Errno> {
        let mut v = DrmVersion::default();
        self.ioctl(DRM_IOCTL_VERSION, &mut v)
    }

    /// GET_PARAM.
    pub fn param(&self, param: u32) -> Result<u64, Errno> {
        let mut a = u::GetParam { param, ..Default::default() };
        self.ioctl(u::DRM_IOCTL_REFGPU_GET_PARAM, &mut a)?;
        Ok(a.value)
    }

    /// BO_CREATE.
    pub fn bo_create(&self, size: u64, flags: u32) -> Result<u32, Errno> {
        let mut a = u::BoCreate { size, flags, handle: 0 };
        self.ioctl(u::DRM_IOCTL_REFGPU_BO_CREATE, &mut a)?;
        Ok(a.handle)
    }

    /// BO_MMAP_OFFSET.
    pub fn mmap_offset(&self, handle: u32) -> Result<u64, Errno> {
        let mut a = u::BoMmapOffset { handle, ..Default::default() };
        self.ioctl(u::DRM_IOCTL_REFGPU_BO_MMAP_OFFSET, &mut a)?;
        Ok(a.offset)
    }

    /// mmap of `size` bytes at the fake `offset`.
    pub fn mmap(&self, offset: u64, size: usize) -> Result<Map, Errno> {
        map_fd(self.fd(), offset, size)
    }

    /// GEM_CLOSE.
    pub fn gem_close(&self, handle: u32) -> Result<(), Errno> {
        let mut a = GemClose { handle, pad: 0 };
        self.ioctl(DRM_IOCTL_GEM_CLOSE, &mut a)
    }

    /// VM_BIND with explicit syncs.
    pub fn vm_bind_syncs(&self, ops: &[u::VmBindOp], ins: &[u::Sync], outs: &[u::Sync]) -> Result<(), Errno> {
        let mut a = u::VmBind {
            flags: 0,
            op_count: ops.len() as u32,
            in_sync_count: ins.len() as u32,
            out_sync_count: outs.len() as u32,
            ops: ops.as_ptr() as u64,
            in_syncs: ins.as_ptr() as u64,
            out_syncs: outs.as_ptr() as u64,
        };
        self.ioctl(u::DRM_IOCTL_REFGPU_VM_BIND, &mut a)
    }

    /// VM_BIND of `ops`.
    pub fn vm_bind(&self, ops: &[u::VmBindOp]) -> Result<(), Errno> {
        self.vm_bind_syncs(ops, &[], &[])
    }

    /// Maps `size` bytes of `handle` from `bo_offset` at `va`.
    pub fn map(&self, handle: u32, bo_offset: u64, va: u64, size: u64, flags: u32) -> Result<(), Errno> {
        self.vm_bind(&[map_op(handle, bo_offset, va, size, flags)])
    }

    /// Unmaps `[va, va + size)`.
    pub fn unmap(&self, va: u64, size: u64) -> Result<(), Errno> {
        self.vm_bind(&[unmap_op(va, size)])
    }

    /// CTX_CREATE on `engine`.
    pub fn ctx_create(&self, engine: u32) -> Result<u32, Errno> {
        let mut a = u::CtxCreate { engine, ..Default::default() };
        self.ioctl(u::DRM_IOCTL_REFGPU_CTX_CREATE, &mut a)?;
        Ok(a.ctx_id)
    }

    /// CTX_DESTROY.
    pub fn ctx_destroy(&self, ctx_id: u32) -> Result<(), Errno> {
        let mut a = u::CtxDestroy { ctx_id, pad: 0 };
        self.ioctl(u::DRM_IOCTL_REFGPU_CTX_DESTROY, &mut a)
    }

    /// CTX_QUERY.
    pub fn ctx_query(&self, ctx_id: u32) -> Result<u::CtxQuery, Errno> {
        let mut a = u::CtxQuery { ctx_id, ..Default::default() };
        self.ioctl(u::DRM_IOCTL_REFGPU_CTX_QUERY, &mut a)?;
        Ok(a)
    }

    /// SUBMIT.
    pub fn submit_full(
        &self,
        ctx_id: u32,
        ib_va: u64,
        ib_size_dw: u32,
        ins: &[u::Sync],
        outs: &[u::Sync],
        flags: u32,
    ) -> Result<u::Submit, Errno> {
        let mut a = u::Submit {
            ctx_id,
            flags,
            ib_va,
            ib_size_dw,
            in_sync_count: ins.len() as u32,
            out_sync_count: outs.len() as u32,
            out_fence_fd: -1,
            in_syncs: ins.as_ptr() as u64,
            out_syncs: outs.as_ptr() as u64,
            seqno: 0,
        };
        self.ioctl(u::DRM_IOCTL_REFGPU_SUBMIT, &mut a)?;
        Ok(a)
    }

    /// SUBMIT signalling timeline point `point` of `syncobj` (0: binary).
    pub fn submit(
        &self,
        ctx_id: u32,
        ib_va: u64,
        ib_size_dw: u32,
        syncobj: u32,
        point: u64,
    ) -> Result<(), Errno> {
        self.submit_full(ctx_id, ib_va, ib_size_dw, &[], &[sync(syncobj, point)], 0).map(|_| ())
    }

    /// SYNCOBJ_CREATE.
    pub fn syncobj(&self) -> Result<u32, Errno> {
        let mut a = SyncobjCreate::default();
        self.ioctl(DRM_IOCTL_SYNCOBJ_CREATE, &mut a)?;
        Ok(a.handle)
    }

    /// SYNCOBJ_DESTROY.
    pub fn syncobj_destroy(&self, handle: u32) -> Result<(), Errno> {
        let mut a = SyncobjDestroy { handle, pad: 0 };
        self.ioctl(DRM_IOCTL_SYNCOBJ_DESTROY, &mut a)
    }

    /// SYNCOBJ_TIMELINE_WAIT for one point, `timeout_ns` from now (waits
    /// for the point's fence to be submitted too).
    pub fn wait_point(&self, handle: u32, point: u64, timeout_ns: i64) -> Result<(), Errno> {
        self.timeline_wait(handle, point, timeout_ns, ioctl)
    }

    /// SYNCOBJ_TIMELINE_WAIT as [`Dev::wait_point`], once: a signal
    /// returns EINTR unless the kernel restarts the ioctl (SA_RESTART).
    pub fn wait_point_once(&self, handle: u32, point: u64, timeout_ns: i64) -> Result<(), Errno> {
        self.timeline_wait(handle, point, timeout_ns, ioctl_once)
    }

    /// SYNCOBJ_TIMELINE_WAIT for one point through `call` ([`ioctl`] or
    /// [`ioctl_once`]); the deadline is absolute, so a retry keeps it.
    fn timeline_wait(
        &self,
        handle: u32,
        point: u64,
        timeout_ns: i64,
        call: fn(RawFd, u32, &mut SyncobjTimelineWait) -> Result<(), Errno>,
    ) -> Result<(), Errno> {
        let handles = [handle];
        let points = [point];
        let mut a = SyncobjTimelineWait {
            handles: handles.as_ptr() as u64,
            points: points.as_ptr() as u64,
            timeout_nsec: now_ns().saturating_add(timeout_ns),
            count_handles: 1,
            flags: WAIT_ALL | WAIT_FOR_SUBMIT,
            ..Default::default()
        };
        call(self.fd(), DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT, &mut a)
    }

    /// SYNCOBJ_WAIT (binary) for one syncobj, `timeout_ns` from now, once.
    pub fn wait_binary_once(&self, handle: u32, timeout_ns: i64) -> Result<(), Errno> {
        let handles = [handle];
        let mut a = SyncobjWait {
            handles: handles.as_ptr() as u64,
            timeout_nsec: now_ns().saturating_add(timeout_ns),
            count_handles: 1,
            flags: WAIT_ALL,
            ..Default::default()
        };
        ioctl_once(self.fd(), DRM_IOCTL_SYNCOBJ_WAIT, &mut a)
    }

    /// Gives up the file descriptor: the caller closes it.
    pub fn into_raw_fd(self) -> RawFd {
        use std::os::fd::IntoRawFd;
        self.fd.into_raw_fd()
    }

    /// SYNCOBJ_QUERY: the timeline's last signalled point.
    pub fn query_point(&self, handle: u32) -> Result<u64, Errno> {
        let handles = [handle];
        let mut points = [0u64];
        let mut a = SyncobjTimelineArray {
            handles: handles.as_ptr() as u64,
            points: points.as_mut_ptr() as u64,
            count_handles: 1,
            flags: 0,
        };
        self.ioctl(DRM_IOCTL_SYNCOBJ_QUERY, &mut a)?;
        Ok(points[0])
    }

    /// PRIME_HANDLE_TO_FD.
    pub fn prime_export(&self, handle: u32) -> Result<OwnedFd, Errno> {
        let mut a = PrimeHandle { handle, flags: PRIME_FLAGS, fd: -1 };
        self.ioctl(DRM_IOCTL_PRIME_HANDLE_TO_FD, &mut a)?;
        // SAFETY: the kernel returned a new fd that we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(a.fd) })
    }

    /// PRIME_FD_TO_HANDLE.
    pub fn prime_import(&self, fd: RawFd) -> Result<u32, Errno> {
        let mut a = PrimeHandle { handle: 0, flags: 0, fd };
        self.ioctl(DRM_IOCTL_PRIME_FD_TO_HANDLE, &mut a)?;
        Ok(a.handle)
    }
}

/// A MAP op.
pub fn map_op(handle: u32, bo_offset: u64, va: u64, size: u64, flags: u32) -> u::VmBindOp {
    u::VmBindOp { op: u::VM_BIND_OP_MAP, flags, handle, pad: 0, bo_offset, va, size }
}

/// An UNMAP op.
pub fn unmap_op(va: u64, size: u64) -> u::VmBindOp {
    u::VmBindOp { op: u::VM_BIND_OP_UNMAP, flags: 0, handle: 0, pad: 0, bo_offset: 0, va, size }
}

/// A sync entry.
pub fn sync(handle: u32, point: u64) -> u::Sync {
    u::Sync { handle, flags: 0, point }
}

/// A shared CPU mapping, unmapped on drop. Accessed with volatile loads and
/// stores only (the GPU writes it concurrently).
pub struct Map {
    ptr: *mut u8,
    len: usize,
}

/// mmap(2) of `fd` at `offset`.
pub fn map_fd(fd: RawFd, offset: u64, len: usize) -> Result<Map, Errno> {
    // SAFETY: a fresh shared mapping chosen by the kernel; nothing else
    // refers to that address range.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(errno());
    }
    Ok(Map { ptr: p.cast(), len })
}

// SAFETY: the mapping is process-wide memory accessed only with volatile
// loads and stores of aligned dwords; sharing it between threads is as safe
// as sharing it with the GPU.
unsafe impl Sync for Map {}
// SAFETY: as for Sync; munmap from any thread is fine.
unsafe impl Send for Map {}

impl Map {
    /// Reads the dword at byte offset `off`.
    pub fn r32(&self, off: usize) -> u32 {
        assert!(off % 4 == 0 && off + 4 <= self.len, "r32 out of range");
        // SAFETY: in bounds and aligned (checked); the mapping lives as long
        // as self. Volatile: the GPU writes this memory.
        unsafe { std::ptr::read_volatile(self.ptr.add(off).cast::<u32>()) }
    }

    /// Writes the dword at byte offset `off`.
    pub fn w32(&self, off: usize, v: u32) {
        assert!(off % 4 == 0 && off + 4 <= self.len, "w32 out of range");
        // SAFETY: as for r32.
        unsafe { std::ptr::write_volatile(self.ptr.add(off).cast::<u32>(), v) }
    }

    /// Writes dwords from byte offset `off`.
    pub fn write(&self, off: usize, dw: &[u32]) {
        for (i, d) in dw.iter().enumerate() {
            self.w32(off + 4 * i, *d);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this value owns.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// SYNC_IOC_FILE_INFO status of a sync_file: 1 signalled, 0 active,
/// negative the fence's error.
pub fn sync_file_status(fd: RawFd) -> Result<i32, Errno> {
    let mut a = SyncFileInfo::default();
    ioctl(fd, SYNC_IOC_FILE_INFO, &mut a)?;
    Ok(a.status)
}

/// poll(2) for POLLIN (a signalled sync_file), `timeout_ms`.
pub fn poll_in(fd: RawFd, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    r == 1 && p.revents & libc::POLLIN != 0
}
