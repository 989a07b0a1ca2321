//! Co-simulation backend: this process is an ivshmem peer of `refgpu-sim`
//! and drives the model through shared memory, as a QEMU guest would
//! through the `ivshmem-doorbell` device (`docs/refgpu.md` 2.3).
//!
//! [`Cosim::connect`] reads the server's setup messages (QEMU's ivshmem
//! protocol: version 0, our peer id, -1 with the shared-memory fd, then one
//! eventfd per vector for each peer), maps the shared memory (register page
//! at offset 0, binding info page at 0x1000) and the system-memory file the
//! info page names, and implements [`Platform`] + [`DirectIo`]:
//!
//! | call | what happens |
//! | --- | --- |
//! | `read_reg` | 32-bit atomic load from the register page; CLOCK_LO reads HI, LO, HI until HI is stable and latches HI for the next CLOCK_HI read (the MMIO semantics of spec 2.1); DOORBELL reads 0 |
//! | `write_reg` | 32-bit atomic store to the RW registers; IRQ_STATUS (RW1C for the core) becomes an atomic AND of the complement; a DOORBELL write rings that engine's vector; writes to read-only registers are dropped (on a plain shared page they would clobber the model's state) |
//! | `doorbell(e)` | writes the model peer's eventfd for vector `e` |
//! | `control_doorbell` | writes the model peer's eventfd for vector 3 |
//! | `wait_irq` | `poll` on our own eventfds of vectors 0..2 (and the socket, to notice the server leaving); drains them |
//! | `dma_alloc/free` | 4 KiB pages carved from the system-memory window (`umd_core::mem::pages::PageAlloc`) |
//! | `now_ns`, `delay_ns` | CLOCK_MONOTONIC; spin below 2 µs, yield below 100 µs, sleep above |
//!
//! The server leaving (socket EOF) is noticed in `wait_irq` and in delays of
//! 100 µs or more; from then on every register call fails with
//! [`PlatformError::DeviceLost`], which the core turns into failed fences.
//!
//! Drop order: give every [`DmaRegion`] back (e.g. `Device::shutdown`)
//! before dropping the [`Cosim`]; dropping it unmaps system memory and
//! closes the connection (the server then resets and parks the device).

use std::fmt;
use std::fs::OpenOptions;
use std::io::{self, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use umd_core::config::Config;
use umd_core::hw::regs;
use umd_core::ivshmem::{Binding, SharedPage, Written};
use umd_core::platform::{DirectIo, DmaFlags, DmaRegion, IrqWait, Platform, PlatformError};

use crate::sys;
use crate::{page_heap, PageHeap};
use refgpu_model::shm::Mapping;
use umd_core::mem::pages::PAGE;

/// The binding info page written by `refgpu-sim` at offset 0x1000 of the
/// shared memory (one definition, shared with the server).
pub use refgpu_model::ivshmem_info as info;

/// Where system memory is, when the server's info page should not be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemWindow {
    /// File to map.
    pub path: PathBuf,
    /// Offset in the file of `base`.
    pub file_offset: u64,
    /// Physical address of the window.
    pub base: u64,
    /// Size in bytes.
    pub size: u64,
}

/// Connection options.
#[derive(Clone, Debug)]
pub struct CosimOptions {
    /// How long the setup messages may take.
    pub setup_timeout: Duration,
    /// System memory, overriding the info page.
    pub mem: Option<MemWindow>,
    /// Vectors per peer when the server has no info page.
    pub vectors: u32,
}

impl Default for CosimOptions {
    fn default() -> Self {
        Self { setup_timeout: Duration::from_secs(10), mem: None, vectors: 4 }
    }
}

/// Why connecting failed.
#[derive(Debug)]
pub enum CosimError {
    /// An OS call failed.
    Io(&'static str, io::Error),
    /// The server closed the connection during setup (it refuses a second
    /// host while one is connected).
    Closed,
    /// The server broke the protocol.
    Protocol(String),
    /// No info page and no [`CosimOptions::mem`].
    NoMemWindow,
    /// A bad `UMD_*` variable or `UMD_CONFIG` file ([`crate::config`]).
    Config(crate::config::ConfigError),
}

impl fmt::Display for CosimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CosimError::Io(what, e) => write!(f, "{what}: {e}"),
            CosimError::Closed => {
                write!(f, "the server closed the connection during setup (is another host connected?)")
            }
            CosimError::Protocol(s) => write!(f, "ivshmem protocol error: {s}"),
            CosimError::NoMemWindow => write!(f, "the server has no info page; give CosimOptions::mem"),
            CosimError::Config(e) => write!(f, "configuration from the environment: {e}"),
        }
    }
}

impl std::error::Error for CosimError {}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> CosimError {
    move |e| CosimError::Io(what, e)
}

/// One protocol message: the value and the fd that came with it.
fn recv_msg(s: &UnixStream) -> Result<(i64, Option<OwnedFd>), CosimError> {
    let mut buf = [0u8; 8];
    let mut got = 0usize;
    let mut fd = None;
    while got < 8 {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [IoSliceMut::new(&mut buf[got..])];
        let r = match recvmsg(s, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(r) => r,
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::AGAIN) => {
                return Err(CosimError::Io("receiving setup", io::ErrorKind::TimedOut.into()))
            }
            Err(e) => return Err(CosimError::Io("receiving setup", e.into())),
        };
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = msg {
                for f in fds {
                    if fd.is_some() {
                        return Err(CosimError::Protocol("more than one fd with a message".into()));
                    }
                    fd = Some(f);
                }
            }
        }
        if r.bytes == 0 {
            return Err(CosimError::Closed);
        }
        got += r.bytes;
    }
    Ok((i64::from_le_bytes(buf), fd))
}

/// A connection to `refgpu-sim`: the co-simulation [`Platform`].
#[derive(Debug)]
pub struct Cosim {
    stream: UnixStream,
    peer_id: u16,
    model_id: u32,
    shm: Mapping,
    mem: Mapping,
    doorbells: Vec<OwnedFd>,
    irqs: Vec<OwnedFd>,
    mem_base: u64,
    heap: Mutex<PageHeap>,
    binding: Binding,
    lost: AtomicBool,
    irq_wakeups: AtomicU64,
    config: Config,
}

impl Cosim {
    /// Connects with default options.
    pub fn connect(socket: impl AsRef<Path>) -> Result<Self, CosimError> {
        Self::connect_with(socket, &CosimOptions::default())
    }

    /// Connects, receives the setup messages and maps both memories.
    /// The `UMD_*` environment is read first ([`Cosim::config`]); a bad
    /// value is [`CosimError::Config`] and nothing is connected.
    pub fn connect_with(socket: impl AsRef<Path>, opts: &CosimOptions) -> Result<Self, CosimError> {
        let config = crate::config::from_env().map_err(CosimError::Config)?;
        let stream = UnixStream::connect(socket).map_err(io_err("connecting to refgpu-sim"))?;
        stream.set_read_timeout(Some(opts.setup_timeout)).map_err(io_err("socket timeout"))?;
        let (v, fd) = recv_msg(&stream)?;
        if v != 0 || fd.is_some() {
            return Err(CosimError::Protocol(format!("expected protocol version 0 without fd, got {v}")));
        }
        let (id, fd) = recv_msg(&stream)?;
        let peer_id = u16::try_from(id).ok().filter(|_| fd.is_none()).ok_or_else(|| {
            CosimError::Protocol(format!("expected our peer id (0..=65535) without fd, got {id}"))
        })?;
        let (m, shm_fd) = recv_msg(&stream)?;
        let shm_fd = match (m, shm_fd) {
            (-1, Some(f)) => f,
            _ => return Err(CosimError::Protocol(format!("expected -1 with the shared-memory fd, got {m}"))),
        };
        let shm_len =
            rustix::fs::fstat(&shm_fd).map_err(|e| CosimError::Io("fstat shm", e.into()))?.st_size as usize;
        if shm_len < 4096 {
            return Err(CosimError::Protocol(format!(
                "shared memory of {shm_len} bytes has no register page"
            )));
        }
        let shm = Mapping::new(&shm_fd, shm_len, 0).map_err(io_err("mapping shared memory"))?;
        let word = |off: usize| shm.u32_at(info::OFFSET + off).map(|w| w.load(Ordering::Acquire));
        let has_info =
            word(info::MAGIC_OFF) == Some(info::MAGIC) && word(info::VERSION_OFF) == Some(info::VERSION);
        let (vectors, model_id) = if has_info {
            (word(info::VECTORS_OFF).unwrap_or(4), word(info::MODEL_ID_OFF).unwrap_or(0))
        } else {
            (opts.vectors, 0)
        };
        if vectors < 4 {
            return Err(CosimError::Protocol(format!("{vectors} vectors; refgpu needs 4")));
        }
        let window = match (&opts.mem, has_info) {
            (Some(w), _) => w.clone(),
            (None, true) => read_window(&shm)?,
            (None, false) => return Err(CosimError::NoMemWindow),
        };

        // Peer fds until the model and we have one per vector.
        let (mut doorbells, mut irqs) = (Vec::new(), Vec::new());
        while doorbells.len() < vectors as usize || irqs.len() < vectors as usize {
            let (id, fd) = recv_msg(&stream)?;
            match (id, fd) {
                (id, Some(fd)) if id == i64::from(model_id) => doorbells.push(fd),
                (id, Some(fd)) if id == i64::from(peer_id) => irqs.push(fd),
                (id, None) if id == i64::from(model_id) => {
                    return Err(CosimError::Protocol("the model peer left during setup".into()))
                }
                (id, _) if !(0..=0xFFFF).contains(&id) => {
                    return Err(CosimError::Protocol(format!("bad peer id {id}")))
                }
                _ => {} // another peer: not ours to talk to
            }
            if doorbells.len() > vectors as usize || irqs.len() > vectors as usize {
                return Err(CosimError::Protocol(format!("more than {vectors} eventfds for a peer")));
            }
        }
        stream.set_nonblocking(true).map_err(io_err("socket non-blocking"))?;

        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&window.path)
            .map_err(io_err("opening system memory"))?;
        let size =
            usize::try_from(window.size).map_err(|_| CosimError::Protocol("window too large".into()))?;
        if size % PAGE != 0 || window.base % PAGE as u64 != 0 {
            return Err(CosimError::Protocol("system memory window not 4 KiB aligned".into()));
        }
        let heap = page_heap(size / PAGE)
            .map_err(|e| CosimError::Protocol(format!("system memory window of {size} bytes: {e}")))?;
        let mem = Mapping::new(&file, size, window.file_offset).map_err(io_err("mapping system memory"))?;
        Ok(Self {
            stream,
            peer_id,
            model_id,
            shm,
            mem,
            doorbells,
            irqs,
            mem_base: window.base,
            heap: Mutex::new(heap),
            binding: Binding::new(),
            lost: AtomicBool::new(false),
            irq_wakeups: AtomicU64::new(0),
            config,
        })
    }

    /// The driver configuration for devices on this platform: the
    /// defaults with the `UMD_*` environment and `UMD_CONFIG` file applied
    /// (read when the platform was made, [`crate::config`]).
    pub fn config(&self) -> Config {
        self.config
    }

    /// Our ivshmem peer id.
    pub fn peer_id(&self) -> u16 {
        self.peer_id
    }

    /// Physical address and size of system memory.
    pub fn mem_window(&self) -> (u64, usize) {
        (self.mem_base, self.mem.len())
    }

    /// Pages (4 KiB) of system memory in use by DMA allocations.
    pub fn dma_pages_used(&self) -> usize {
        self.heap.lock().unwrap_or_else(|p| p.into_inner()).used_pages()
    }

    /// How many times `wait_irq` woke up on an interrupt.
    pub fn irq_wakeups(&self) -> u64 {
        self.irq_wakeups.load(Ordering::Relaxed)
    }

    /// Whether the server went away.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Checks the socket without blocking; marks the device lost on EOF or
    /// error. Returns whether the link is up.
    pub fn check_link(&self) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return false;
        }
        let mut fds = [PollFd::new(&self.stream, PollFlags::IN)];
        if matches!(poll(&mut fds, Some(&Timespec { tv_sec: 0, tv_nsec: 0 })), Ok(n) if n > 0) {
            self.drain_socket();
        }
        !self.lost.load(Ordering::Acquire)
    }

    /// Reads whatever the server sent after setup (peer notifications); EOF
    /// means the server is gone.
    fn drain_socket(&self) {
        loop {
            match recv_msg(&self.stream) {
                Ok((id, None)) if id == i64::from(self.model_id) => self.lost.store(true, Ordering::Release), // the model peer left
                Ok(_) => {}
                Err(CosimError::Io(_, e)) if e.kind() == io::ErrorKind::TimedOut => return,
                Err(_) => {
                    self.lost.store(true, Ordering::Release);
                    return;
                }
            }
        }
    }

    /// Some physical address → host pointer, for tests and tools (None
    /// outside the window).
    pub fn host_ptr(&self, pa: u64, len: usize) -> Option<NonNull<u8>> {
        let off = usize::try_from(pa.checked_sub(self.mem_base)?).ok()?;
        if off.checked_add(len)? > self.mem.len() {
            return None;
        }
        // SAFETY: `off` lies inside the mapping (checked above).
        NonNull::new(unsafe { self.mem.ptr().as_ptr().add(off) })
    }

    fn ring(&self, vector: usize) -> Result<(), PlatformError> {
        if self.lost.load(Ordering::Acquire) {
            return Err(PlatformError::DeviceLost);
        }
        let fd = self.doorbells.get(vector).ok_or(PlatformError::Unsupported)?;
        sys::eventfd_signal(fd).map_err(|e| PlatformError::Os(e.raw_os_error().unwrap_or(0)))
    }
}

fn read_window(shm: &Mapping) -> Result<MemWindow, CosimError> {
    let w = |off: usize| shm.u32_at(info::OFFSET + off).map_or(0, |w| w.load(Ordering::Acquire));
    let d = |off: usize| u64::from(w(off)) | (u64::from(w(off + 4)) << 32);
    let len = w(info::PATH_LEN_OFF) as usize;
    let start = info::OFFSET + info::PATH_OFF;
    if start + len > shm.len() {
        return Err(CosimError::Protocol("info page path out of range".into()));
    }
    let bytes: Vec<u8> = (0..len)
        .map(|i| {
            // Byte i of the path, from its aligned dword.
            let o = start + i;
            shm.u32_at(o & !3).map_or(0, |w| (w.load(Ordering::Acquire) >> ((o & 3) * 8)) as u8)
        })
        .collect();
    let path =
        String::from_utf8(bytes).map_err(|_| CosimError::Protocol("info page path is not UTF-8".into()))?;
    Ok(MemWindow {
        path: PathBuf::from(path),
        file_offset: d(info::MEM_FILE_OFFSET_OFF),
        base: d(info::MEM_BASE_OFF),
        size: d(info::MEM_SIZE_OFF),
    })
}

// SAFETY: every region returned by `dma_alloc` is a distinct, page-aligned
// run of pages of the shared system-memory mapping (the heap never hands a
// page out twice), valid while `self` lives, zeroed, and the device reaches
// the same bytes at `mem_base + offset`; `now_ns` is CLOCK_MONOTONIC.
unsafe impl Platform for Cosim {
    type RawMutex = crate::FairLock;

    fn dma_alloc(&self, len: usize, _flags: DmaFlags) -> Result<DmaRegion, PlatformError> {
        let len = len.max(1).checked_next_multiple_of(PAGE).ok_or(PlatformError::OutOfMemory { len })?;
        let first = self
            .heap
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .alloc(len / PAGE)
            .map_err(|_| PlatformError::OutOfMemory { len })?;
        let off = first * PAGE;
        // SAFETY: pages `first .. first + len/PAGE` lie inside the mapping
        // (the heap covers exactly `mem.len() / PAGE` pages) and were free,
        // so nothing else on the CPU side uses them.
        let cpu = unsafe {
            let p = self.mem.ptr().as_ptr().add(off);
            std::ptr::write_bytes(p, 0, len);
            NonNull::new_unchecked(p)
        };
        // SAFETY: see the impl-level comment; the range is ours until
        // `dma_free`.
        Ok(unsafe { DmaRegion::new(cpu, self.mem_base + off as u64, len) })
    }

    fn dma_free(&self, region: DmaRegion) {
        let off = region.dev_addr().wrapping_sub(self.mem_base) as usize;
        if off % PAGE == 0 && off < self.mem.len() {
            // A run this platform did not hand out frees nothing.
            let _ = self
                .heap
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .free(off / PAGE, region.len().div_ceil(PAGE));
        }
    }

    fn now_ns(&self) -> u64 {
        sys::monotonic_ns()
    }

    fn delay_ns(&self, ns: u64) {
        if ns >= 100_000 {
            self.check_link();
        }
        sys::delay_ns(ns);
    }

    fn wait_irq(&self, timeout_ns: u64) -> IrqWait {
        if self.lost.load(Ordering::Acquire) {
            return IrqWait::Interrupt; // the next register access reports the loss
        }
        let deadline = Instant::now() + Duration::from_nanos(timeout_ns);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ts = Timespec { tv_sec: left.as_secs() as _, tv_nsec: left.subsec_nanos() as _ };
            let (irq, sock) = {
                let mut fds: Vec<PollFd<'_>> =
                    self.irqs.iter().take(3).map(|f| PollFd::new(f, PollFlags::IN)).collect();
                fds.push(PollFd::new(&self.stream, PollFlags::IN));
                match poll(&mut fds, Some(&ts)) {
                    Ok(0) => return IrqWait::TimedOut,
                    Ok(_) => {}
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) => return IrqWait::Unsupported,
                }
                let n = fds.len();
                (fds[..n - 1].iter().any(|f| !f.revents().is_empty()), !fds[n - 1].revents().is_empty())
            };
            if sock {
                self.drain_socket();
                if self.lost.load(Ordering::Acquire) {
                    return IrqWait::Interrupt;
                }
            }
            if irq {
                for f in self.irqs.iter().take(3) {
                    sys::eventfd_drain(f);
                }
                self.irq_wakeups.fetch_add(1, Ordering::Relaxed);
                return IrqWait::Interrupt;
            }
            if left.is_zero() {
                return IrqWait::TimedOut;
            }
        }
    }
}

impl DirectIo for Cosim {
    fn read_reg(&self, offset: u32) -> Result<u32, PlatformError> {
        if self.lost.load(Ordering::Acquire) {
            return Err(PlatformError::DeviceLost);
        }
        self.binding.read(&RegPage(&self.shm), offset)
    }

    fn write_reg(&self, offset: u32, value: u32) -> Result<(), PlatformError> {
        if self.lost.load(Ordering::Acquire) {
            return Err(PlatformError::DeviceLost);
        }
        match self.binding.write(&RegPage(&self.shm), offset, value)? {
            Written::Doorbell(e) => self.ring(e as usize),
            Written::Done => Ok(()),
        }
    }

    fn doorbell(&self, engine: u32) -> Result<(), PlatformError> {
        if engine >= regs::ENGINES {
            return Err(PlatformError::Unsupported);
        }
        self.ring(engine as usize)
    }

    fn control_doorbell(&self) -> Result<(), PlatformError> {
        self.ring(regs::CONTROL_VECTOR as usize)
    }
}

/// The register page at the start of the shared memory, as the binding sees it.
struct RegPage<'a>(&'a Mapping);

impl SharedPage for RegPage<'_> {
    fn word(&self, off: u32) -> Option<&AtomicU32> {
        self.0.u32_at(off as usize).filter(|_| off < 4096)
    }
}
