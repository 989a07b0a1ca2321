//! The model peer: shared memory, eventfds, the model, and the event loop.
//!
//! One thread (the caller of [`Server::run`]) polls the signalfd, the
//! listening socket, the connected host's socket and the model's control
//! doorbell eventfd (vector 3, applied with `model.take_control_bell()`;
//! higher vectors are drained and ignored). The engine doorbells (vectors
//! 0..2) are not this thread's: they are handed to the model
//! (`Model::attach_doorbells`), whose idle engine threads sleep on them, so
//! a host's doorbell wakes the engine that runs the packets directly. Model
//! interrupts (vector `e` = engine `e`) are written to the host's eventfd
//! for vector `e` through [`HostIrq`], by the engine's own thread unless a
//! delay is injected.
//!
//! Host lifecycle:
//!
//! - **connect**: peer ids count up from 1 (0 is the model); the host gets
//!   the protocol messages in QEMU's order (version, its id, -1 + shm fd,
//!   the model's id with one eventfd per vector, its own id with one eventfd
//!   per vector). Interrupts go to the host's eventfds from before the
//!   first message, so a host that rings as soon as it has its setup gets
//!   the interrupt of that first job.
//! - **a second host** while one is connected is refused: the server logs
//!   `refusing connection: peer N is connected (one host at a time)` and
//!   closes the new socket before sending anything.
//! - **disconnect** (EOF, hang-up, or a protocol error): the host's
//!   eventfds are dropped and the device is *parked* as by a function-level
//!   reset: IRQ_MASK = 0, MMU off, ENGINE_ROOT = 0, every engine reset with CTRL = RESET
//!   (which also disables it), IRQ_STATUS cleared, pending doorbells
//!   discarded; the words hosts may only read (ID, ENGINE_COUNT,
//!   LOCAL_BASE/SIZE, the binding info page) are put back as published at
//!   start, whatever the host wrote there. System memory is left as it is. The model and the server
//!   keep running for the next host.
//! - **protocol errors**: ivshmem peers never send data to the server, so
//!   any byte from the host is an error, whatever it looks like (a partial
//!   message, a well-formed int64, one with fds attached): it is logged
//!   (`peer N: protocol error: ...`) and the host is disconnected. Fds a
//!   host attaches are never received: the kernel closes them.
//! - **SIGINT / SIGTERM**: the loop ends, the model shuts down, the socket
//!   file is removed (also on drop).

use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use refgpu_model::regs::{self, eng, CONTROL_VECTOR, NUM_ENGINES};
use refgpu_model::{IrqSink, Model, ModelConfig, ModelError};
use rustix::event::{poll, PollFd, PollFlags};
use rustix::fs::{memfd_create, MemfdFlags};
use rustix::net::RecvFlags;

use crate::args::Options;
use crate::proto::{self, info, send_msg};
use crate::sys;
use refgpu_model::shm::{Mapping, OutOfMapping};

/// Why the server could not start or stopped.
#[derive(Debug)]
pub enum ServerError {
    /// A bad option combination found at start.
    Config(String),
    /// An OS call failed.
    Io(&'static str, io::Error),
    /// The model refused its configuration.
    Model(ModelError),
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerError::Config(s) => write!(f, "{s}"),
            ServerError::Io(what, e) => write!(f, "{what}: {e}"),
            ServerError::Model(e) => write!(f, "model: {e:?}"),
        }
    }
}

impl std::error::Error for ServerError {}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> ServerError {
    move |e| ServerError::Io(what, e)
}

/// Forwards model interrupts to the connected host's eventfds.
pub struct HostIrq {
    fds: Mutex<Vec<OwnedFd>>,
    raised: AtomicU64,
}

impl HostIrq {
    fn set(&self, fds: Vec<OwnedFd>) {
        *self.fds.lock().unwrap_or_else(|p| p.into_inner()) = fds;
    }

    /// Interrupts forwarded so far.
    pub fn raised(&self) -> u64 {
        self.raised.load(Ordering::Relaxed)
    }
}

impl IrqSink for HostIrq {
    fn raise(&self, vector: u32) {
        let fds = self.fds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(fd) = fds.get(vector as usize) {
            // A full counter (2^64 - 2 unread interrupts) is the only
            // failure; the host sees the interrupt anyway.
            let _ = sys::eventfd_signal(fd);
            self.raised.fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct Host {
    id: u16,
    stream: UnixStream,
}

/// What a [`Server::turn`] ended with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Go on serving.
    Continue,
    /// SIGINT or SIGTERM arrived: stop (the caller drops the server).
    Stop,
}

/// The co-simulation server. Field order is drop order: the model stops
/// before the mappings it uses go away.
pub struct Server {
    model: Model,
    shm: Mapping,
    _mem: Mapping,
    shm_fd: OwnedFd,
    model_efds: Vec<OwnedFd>,
    irq: Arc<HostIrq>,
    listener: UnixListener,
    sigfd: OwnedFd,
    host: Option<Host>,
    next_id: u16,
    socket: PathBuf,
    opts: Options,
    /// The words of the shared memory hosts must not write (the register
    /// page's identity registers and the binding info page) as published
    /// at start, put back when a host leaves.
    read_only: Vec<(usize, u32)>,
}

fn log(msg: fmt::Arguments<'_>) {
    eprintln!("refgpu-sim: {msg}");
}

impl Server {
    /// Creates the shared memory, eventfds, the model and the listening
    /// socket. Blocks SIGINT/SIGTERM in the calling thread first (so the
    /// model's threads inherit the mask and [`Server::run`] sees them):
    /// call it before starting other threads.
    pub fn new(opts: Options) -> Result<Self, ServerError> {
        crate::args::validate(&opts).map_err(|e| ServerError::Config(e.to_string()))?;
        let sigfd = sys::termination_signalfd().map_err(io_err("blocking SIGINT/SIGTERM"))?;

        // System memory: open (or create) the file and map the window.
        let need = opts.mem_file_offset + opts.mem_size;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&opts.mem_file)
            .map_err(io_err("opening --mem-file"))?;
        let len = file.metadata().map_err(io_err("stat --mem-file"))?.len();
        if len == 0 {
            file.set_len(need).map_err(io_err("sizing --mem-file"))?;
        } else if len < need {
            return Err(ServerError::Config(format!(
                "--mem-file {} is {len:#x} bytes, the window needs {need:#x} (offset + size)",
                opts.mem_file.display()
            )));
        }
        let mem_size =
            usize::try_from(opts.mem_size).map_err(|_| ServerError::Config("--mem-size too large".into()))?;
        let mem =
            Mapping::new(&file, mem_size, opts.mem_file_offset).map_err(io_err("mapping --mem-file"))?;
        let mem_path = std::fs::canonicalize(&opts.mem_file).map_err(io_err("resolving --mem-file"))?;
        let path_bytes = mem_path.to_string_lossy().into_owned().into_bytes();
        if path_bytes.len() > info::PATH_MAX {
            return Err(ServerError::Config(format!("--mem-file path longer than {} bytes", info::PATH_MAX)));
        }

        // ivshmem shared memory: register page + info page.
        let shm_fd = memfd_create("refgpu-ivshmem", MemfdFlags::CLOEXEC)
            .map_err(|e| ServerError::Io("memfd_create", e.into()))?;
        rustix::fs::ftruncate(&shm_fd, opts.shm_size).map_err(|e| ServerError::Io("sizing shm", e.into()))?;
        let shm = Mapping::new(&shm_fd, opts.shm_size as usize, 0).map_err(io_err("mapping shm"))?;
        write_info_page(&shm, &opts, &path_bytes)
            .map_err(|e| ServerError::Config(format!("writing the info page: {e}")))?;

        let model_efds = (0..opts.vectors)
            .map(|_| sys::new_eventfd())
            .collect::<io::Result<Vec<_>>>()
            .map_err(io_err("eventfd"))?;
        let irq = Arc::new(HostIrq { fds: Mutex::new(Vec::new()), raised: AtomicU64::new(0) });
        let cfg = ModelConfig {
            generation: opts.generation,
            revision: 0,
            mem_base: opts.mem_base,
            mem_size: opts.mem_size,
            wait_poll_interval: opts.wait_poll,
            clock_publish_interval: opts.clock_publish,
            fault_injection: opts.fault.clone(),
            local_size: opts.local_mem,
            sys_ns_per_kib: opts.ns_per_kib[0],
            local_ns_per_kib: opts.ns_per_kib[1],
        };
        let sink: Arc<dyn IrqSink> = irq.clone();
        // SAFETY: both mappings are page aligned, `shm` holds at least 8 KiB
        // (>= the 4 KiB register page) and `mem` exactly `mem_size` bytes;
        // they are fields of the returned Server declared after `model`, so
        // they outlive it (the model is dropped first). This process touches
        // them only with atomics; the host process may write concurrently.
        let model = unsafe { Model::new_shared(cfg, shm.ptr(), mem.ptr(), Some(sink)) }
            .map_err(ServerError::Model)?;
        let bells = [0, 1, 2, CONTROL_VECTOR as usize]
            .map(|v| model_efds[v].try_clone())
            .into_iter()
            .collect::<io::Result<Vec<_>>>()
            .map_err(io_err("eventfd"))?;
        let bells: [OwnedFd; 4] =
            bells.try_into().map_err(|_| ServerError::Config("four doorbell eventfds".into()))?;
        model.attach_doorbells(bells).map_err(io_err("attaching doorbells"))?;

        let read_only = read_only_words(&shm);
        let listener = bind(&opts.socket)?;
        log(format_args!(
            "listening on {} (gen {}, system memory {:#x}+{:#x} from {} at offset {:#x}, shm {:#x} bytes, {} vectors)",
            opts.socket.display(),
            opts.generation.number(),
            opts.mem_base,
            opts.mem_size,
            mem_path.display(),
            opts.mem_file_offset,
            opts.shm_size,
            opts.vectors
        ));
        Ok(Self {
            model,
            shm,
            _mem: mem,
            shm_fd,
            model_efds,
            irq,
            listener,
            sigfd,
            host: None,
            next_id: 1,
            socket: opts.socket.clone(),
            opts,
            read_only,
        })
    }

    /// The model (diagnostics).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Interrupts forwarded to hosts so far.
    pub fn irqs_forwarded(&self) -> u64 {
        self.irq.raised()
    }

    /// Serves until SIGINT or SIGTERM.
    pub fn run(&mut self) -> Result<(), ServerError> {
        while self.turn(None)? == Turn::Continue {}
        Ok(())
    }

    /// One turn of the event loop: waits up to `timeout` (`None`: for
    /// ever) for an event, then handles every event that is ready: control
    /// doorbells, the connected host's socket (EOF or a protocol error
    /// disconnects it), a new connection, a termination signal. [`run`]
    /// is this in a loop; a caller that drives the server itself (the
    /// `protocol` fuzz target, tests) turns it with a zero timeout after
    /// each thing it did.
    ///
    /// [`run`]: Server::run
    pub fn turn(&mut self, timeout: Option<Duration>) -> Result<Turn, ServerError> {
        // The engines' doorbells belong to the engine threads.
        let first = CONTROL_VECTOR as usize;
        let n = self.model_efds.len() - first;
        let timeout = timeout.map(|d| rustix::event::Timespec {
            tv_sec: d.as_secs().try_into().unwrap_or(i64::MAX),
            tv_nsec: d.subsec_nanos().into(),
        });
        let (sig, listen, bells, host) = {
            let mut fds = Vec::with_capacity(n + 3);
            fds.push(PollFd::new(&self.sigfd, PollFlags::IN));
            fds.push(PollFd::new(&self.listener, PollFlags::IN));
            for e in &self.model_efds[first..] {
                fds.push(PollFd::new(e, PollFlags::IN));
            }
            if let Some(h) = &self.host {
                fds.push(PollFd::new(&h.stream, PollFlags::IN));
            }
            match poll(&mut fds, timeout.as_ref()) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => return Ok(Turn::Continue),
                Err(e) => return Err(ServerError::Io("poll", e.into())),
            }
            let ready = |f: &PollFd<'_>| !f.revents().is_empty();
            let bells: Vec<bool> = fds[2..2 + n].iter().map(ready).collect();
            (ready(&fds[0]), ready(&fds[1]), bells, fds.get(2 + n).is_some_and(ready))
        };
        for (i, _) in bells.iter().enumerate().filter(|(_, r)| **r) {
            if i == 0 {
                self.model.take_control_bell();
            } else {
                sys::eventfd_drain(&self.model_efds[first + i]);
            }
        }
        if sig {
            let signo = sys::read_signal(&self.sigfd).unwrap_or(0);
            log(format_args!("signal {signo}: shutting down"));
            return Ok(Turn::Stop);
        }
        if host {
            self.service_host();
        }
        if listen {
            self.accept();
        }
        Ok(Turn::Continue)
    }

    /// The peer id of the connected host, if one is connected.
    pub fn host_id(&self) -> Option<u16> {
        self.host.as_ref().map(|h| h.id)
    }

    fn accept(&mut self) {
        let stream = match self.listener.accept() {
            Ok((s, _)) => s,
            Err(e) => {
                log(format_args!("accept failed: {e}"));
                return;
            }
        };
        if let Some(h) = &self.host {
            log(format_args!("refusing connection: peer {} is connected (one host at a time)", h.id));
            drop(stream);
            return;
        }
        let id = self.next_id;
        self.next_id = if self.next_id == u16::MAX { 1 } else { self.next_id + 1 };
        match self.greet(&stream, id) {
            Ok(()) => {
                log(format_args!("peer {id} connected"));
                self.host = Some(Host { id, stream });
            }
            Err(e) => {
                log(format_args!("peer {id}: setup failed: {e}; disconnecting"));
                self.park();
            }
        }
    }

    /// Makes the host's interrupt eventfds, forwards interrupts to them and
    /// sends the setup messages. Forwarding starts before the host has its
    /// eventfds: the host may ring as soon as it has read the last message,
    /// and an interrupt raised before this thread got back to it would be
    /// lost; raised early, it waits in the eventfd's counter.
    fn greet(&self, s: &UnixStream, id: u16) -> io::Result<()> {
        let host_efds = (0..self.opts.vectors).map(|_| sys::new_eventfd()).collect::<io::Result<Vec<_>>>()?;
        self.irq.set(host_efds.iter().map(OwnedFd::try_clone).collect::<io::Result<Vec<_>>>()?);
        send_msg(s, proto::PROTOCOL_VERSION, None)?;
        send_msg(s, i64::from(id), None)?;
        send_msg(s, proto::SHM_MESSAGE, Some(self.shm_fd.as_fd()))?;
        for fd in &self.model_efds {
            send_msg(s, i64::from(proto::MODEL_PEER_ID), Some(fd.as_fd()))?;
        }
        for fd in &host_efds {
            send_msg(s, i64::from(id), Some(fd.as_fd()))?;
        }
        Ok(())
    }

    fn service_host(&mut self) {
        let Some(h) = &self.host else { return };
        let mut buf = [0u8; 64];
        let why = match rustix::net::recv(&h.stream, &mut buf[..], RecvFlags::DONTWAIT) {
            Ok((0, _)) => None,
            Ok((n, _)) => Some(format!(
                "protocol error: received {n} byte(s) ({:02x?}...); ivshmem peers never send to the server",
                &buf[..n.min(8)]
            )),
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => return,
            Err(e) => Some(format!("socket error: {e}")),
        };
        let id = h.id;
        match why {
            None => log(format_args!("peer {id} disconnected")),
            Some(w) => log(format_args!("peer {id}: {w}; disconnecting")),
        }
        self.host = None;
        self.park();
    }

    /// Resets and parks the device after a host left (see the module docs).
    fn park(&mut self) {
        self.irq.set(Vec::new());
        // Register offsets are inside the page the mapping holds (>= 8 KiB).
        let store = |off: u32, v: u32| {
            if let Some(w) = self.shm.u32_at(off as usize) {
                w.store(v, Ordering::SeqCst);
            }
        };
        let load = |off: u32| self.shm.u32_at(off as usize).map_or(0, |w| w.load(Ordering::SeqCst));
        store(regs::IRQ_MASK, 0);
        store(regs::MMU_CTRL, 0);
        for e in 0..NUM_ENGINES {
            store(regs::engine_root_lo(e), 0);
            store(regs::engine_root_hi(e), 0);
            store(regs::engine_base(e) + eng::CTRL, regs::CTRL_RESET);
        }
        self.model.doorbell(CONTROL_VECTOR);
        let deadline = Instant::now() + Duration::from_secs(5);
        let busy =
            || (0..NUM_ENGINES).any(|e| load(regs::engine_base(e) + eng::CTRL) & regs::CTRL_RESET != 0);
        while busy() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
        if busy() {
            log(format_args!("warning: an engine did not finish its reset while parking"));
            for e in 0..NUM_ENGINES {
                if load(regs::engine_base(e) + eng::CTRL) & regs::CTRL_RESET != 0 {
                    log(format_args!("  {}", self.model.engine_diagnosis(e)));
                }
            }
        }
        store(regs::IRQ_STATUS, 0);
        // Plain shared memory: a host may have scribbled over words that
        // are read-only by contract; the next host must find them intact.
        for &(off, v) in &self.read_only {
            if let Some(w) = self.shm.u32_at(off) {
                w.store(v, Ordering::SeqCst);
            }
        }
        for fd in &self.model_efds {
            sys::eventfd_drain(fd);
        }
        log(format_args!("device parked (engines reset and disabled, interrupts masked, MMU off)"));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.model.shutdown();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Writes the binding info page (`docs/refgpu.md` 2.3), magic last with
/// release order so a host that sees it sees every field.
fn write_info_page(shm: &Mapping, opts: &Options, path: &[u8]) -> Result<(), OutOfMapping> {
    let base = info::OFFSET;
    let w32 = |off: usize, v: u32, order: Ordering| {
        shm.u32_at(base + off).ok_or(OutOfMapping { off: base + off, len: 4 }).map(|w| w.store(v, order))
    };
    let w64 = |off: usize, v: u64| {
        shm.u64_at(base + off)
            .ok_or(OutOfMapping { off: base + off, len: 8 })
            .map(|w| w.store(v, Ordering::Relaxed))
    };
    w32(info::VERSION_OFF, info::VERSION, Ordering::Relaxed)?;
    w32(info::VECTORS_OFF, opts.vectors, Ordering::Relaxed)?;
    w32(info::MODEL_ID_OFF, u32::from(proto::MODEL_PEER_ID), Ordering::Relaxed)?;
    w64(info::MEM_BASE_OFF, opts.mem_base)?;
    w64(info::MEM_SIZE_OFF, opts.mem_size)?;
    w64(info::MEM_FILE_OFFSET_OFF, opts.mem_file_offset)?;
    w32(info::PATH_LEN_OFF, path.len() as u32, Ordering::Relaxed)?;
    shm.write_bytes(base + info::PATH_OFF, path)?;
    w32(info::MAGIC_OFF, info::MAGIC, Ordering::Release)
}

/// The words hosts may only read, with their current values: ID,
/// ENGINE_COUNT, LOCAL_BASE/LOCAL_SIZE, and the whole binding info page.
fn read_only_words(shm: &Mapping) -> Vec<(usize, u32)> {
    let identity = [
        regs::ID,
        regs::ENGINE_COUNT,
        regs::LOCAL_BASE_LO,
        regs::LOCAL_BASE_HI,
        regs::LOCAL_SIZE_LO,
        regs::LOCAL_SIZE_HI,
    ]
    .map(|r| r as usize);
    let info_page = (info::OFFSET..info::OFFSET + 0x1000).step_by(4);
    identity
        .into_iter()
        .chain(info_page)
        .filter_map(|off| shm.u32_at(off).map(|w| (off, w.load(Ordering::SeqCst))))
        .collect()
}

/// Binds the socket, replacing a stale socket file but never a live server.
fn bind(path: &Path) -> Result<UnixListener, ServerError> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(ServerError::Config(format!("{} is in use by a running server", path.display())));
        }
        std::fs::remove_file(path).map_err(io_err("removing stale socket"))?;
    }
    UnixListener::bind(path).map_err(io_err("binding --socket"))
}
