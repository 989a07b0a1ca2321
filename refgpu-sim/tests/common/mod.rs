//! Test support: a `refgpu-sim` child process in a temp dir (killed and
//! cleaned up on drop), a hand-written ivshmem client, shared mappings.
#![allow(dead_code)]

use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::{Duration, Instant};

use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

/// Failure guard for anything that waits (never a performance threshold).
pub const GUARD: Duration = Duration::from_secs(30);
/// System memory of the test servers.
pub const MEM_BASE: u64 = 0x4000_0000;
/// Size of system memory.
pub const MEM_SIZE: u64 = 16 << 20;

/// A running server; SIGKILLed on drop if still running; its temp dir
/// (socket, memory file, log) goes with it.
pub struct Sim {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub mem: PathBuf,
    pub log: PathBuf,
}

impl Sim {
    /// Starts `refgpu-sim` with the test defaults plus `extra` arguments
    /// and waits until its socket accepts connections.
    pub fn start(extra: &[&str]) -> Sim {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("sim.sock");
        let mem = dir.path().join("mem.img");
        let log = dir.path().join("sim.log");
        let child = Command::new(env!("CARGO_BIN_EXE_refgpu-sim"))
            .arg("--socket")
            .arg(&socket)
            .arg("--mem-file")
            .arg(&mem)
            .args(["--mem-base", &format!("{MEM_BASE:#x}"), "--mem-size", &MEM_SIZE.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn refgpu-sim");
        let mut sim = Sim { child: Some(child), dir, socket, mem, log };
        let start = Instant::now();
        // The server prints its "listening" line after bind; wait for it so
        // that no probe connection is counted as a host.
        while !sim.log_text().contains("listening on") {
            if let Some(st) = sim.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("refgpu-sim exited at start ({st}): {}", sim.log_text());
            }
            assert!(start.elapsed() < GUARD, "refgpu-sim did not start: {}", sim.log_text());
            std::thread::sleep(Duration::from_millis(5));
        }
        sim
    }

    /// The server's stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle` (failure guard: GUARD).
    pub fn wait_log(&self, needle: &str) {
        let start = Instant::now();
        while !self.log_text().contains(needle) {
            assert!(start.elapsed() < GUARD, "log never showed {needle:?}:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Sends `sig` and waits for the exit.
    pub fn signal_and_wait(&mut self, sig: rustix::process::Signal) -> ExitStatus {
        let mut c = self.child.take().expect("running");
        let pid = rustix::process::Pid::from_child(&c);
        rustix::process::kill_process(pid, sig).expect("kill");
        let start = Instant::now();
        loop {
            if let Some(st) = c.try_wait().expect("wait") {
                return st;
            }
            if start.elapsed() > GUARD {
                let _ = c.kill();
                let _ = c.wait();
                panic!("refgpu-sim did not exit on {sig:?}: {}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if let Some(mut c) = self.child.take() {
            if panicking {
                // The host was dropped first: give the server the time to
                // park the device and log its diagnosis of a stuck engine.
                let start = Instant::now();
                while !self.log_text().contains("device parked") && start.elapsed() < Duration::from_secs(7) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        // A failed test shows what the server said.
        if panicking {
            eprintln!("refgpu-sim's log:\n{}", self.log_text());
        }
    }
}

/// One message, or None at EOF.
pub fn recv(s: &UnixStream) -> Option<(i64, Option<OwnedFd>)> {
    let mut buf = [0u8; 8];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let r =
        recvmsg(s, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC | RecvFlags::WAITALL).expect("recvmsg");
    let mut fds: Vec<OwnedFd> = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    if r.bytes == 0 {
        return None;
    }
    assert_eq!(r.bytes, 8, "short message");
    assert!(fds.len() <= 1, "more than one fd with one message");
    Some((i64::from_le_bytes(buf), fds.pop()))
}

/// A hand-written host: the setup it received.
pub struct Client {
    pub stream: UnixStream,
    pub id: i64,
    pub shm: Map,
    pub shm_size: u64,
    pub doorbells: Vec<OwnedFd>,
    pub irqs: Vec<OwnedFd>,
}

impl Client {
    /// Connects and checks every setup message (order, values, fds).
    pub fn connect(sim: &Sim, vectors: usize) -> Client {
        let stream = UnixStream::connect(&sim.socket).expect("connect");
        stream.set_read_timeout(Some(GUARD)).unwrap();
        Self::setup(stream, vectors).expect("server closed the connection during setup")
    }

    /// Reads the setup messages; None if the server closed at once.
    pub fn setup(stream: UnixStream, vectors: usize) -> Option<Client> {
        let (v, fd) = recv(&stream)?;
        assert_eq!((v, fd.is_some()), (0, false), "first message: protocol version 0, no fd");
        let (id, fd) = recv(&stream).expect("id");
        assert!(id >= 1 && fd.is_none(), "second message: our id (>= 1, the model is 0), no fd; got {id}");
        let (m, shm_fd) = recv(&stream).expect("shm");
        assert_eq!(m, -1, "third message: -1 with the shared memory");
        let shm_fd = shm_fd.expect("shm fd");
        let shm_size = rustix::fs::fstat(&shm_fd).unwrap().st_size as u64;
        let shm = Map::new(&shm_fd, shm_size as usize, 0);
        let mut doorbells = Vec::new();
        for _ in 0..vectors {
            let (p, fd) = recv(&stream).expect("model peer vector");
            assert_eq!(p, 0, "the model peer's vectors come first, with id 0");
            doorbells.push(fd.expect("model eventfd"));
        }
        let mut irqs = Vec::new();
        for _ in 0..vectors {
            let (p, fd) = recv(&stream).expect("own vector");
            assert_eq!(p, id, "then our own vectors, with our id");
            irqs.push(fd.expect("own eventfd"));
        }
        Some(Client { stream, id, shm, shm_size, doorbells, irqs })
    }

    /// Rings vector `v` of the model.
    pub fn ring(&self, v: usize) {
        rustix::io::write(&self.doorbells[v], &1u64.to_ne_bytes()).unwrap();
    }

    /// Waits for an interrupt on our vector `v`; returns the count.
    pub fn wait_irq(&self, v: usize) -> u64 {
        let mut fds = [rustix::event::PollFd::new(&self.irqs[v], rustix::event::PollFlags::IN)];
        let ts = rustix::event::Timespec { tv_sec: GUARD.as_secs() as _, tv_nsec: 0 };
        let n = rustix::event::poll(&mut fds, Some(&ts)).unwrap();
        if n != 1 {
            panic!("no interrupt on vector {v} in {GUARD:?}; {}", self.registers(v));
        }
        let mut b = [0u8; 8];
        rustix::io::read(&self.irqs[v], &mut b).unwrap();
        u64::from_ne_bytes(b)
    }

    /// The interrupt and engine `e`'s registers, for failure messages.
    pub fn registers(&self, e: usize) -> String {
        use refgpu_model::regs::{self, eng};
        use std::sync::atomic::Ordering::SeqCst;
        let r = |off: u32| self.reg(off).load(SeqCst);
        let er = |off: u32| r(regs::engine_base(e) + off);
        format!(
            "IRQ_STATUS {:#x} IRQ_MASK {:#x}; engine {e}: CTRL {:#x} STATUS {:#x} RING_RPTR {:#x} RING_WPTR {:#x} \
             FAULT_STATUS {:#x}",
            r(regs::IRQ_STATUS),
            r(regs::IRQ_MASK),
            er(eng::CTRL),
            er(eng::STATUS),
            er(eng::RING_RPTR),
            er(eng::RING_WPTR),
            er(eng::FAULT_STATUS)
        )
    }

    /// A register of the shared page.
    pub fn reg(&self, off: u32) -> &AtomicU32 {
        self.shm.u32(off as usize)
    }
}

/// A shared mapping, unmapped on drop.
pub struct Map {
    ptr: NonNull<u8>,
    len: usize,
}

impl Map {
    pub fn new(fd: impl AsFd, len: usize, off: u64) -> Map {
        use rustix::mm::{mmap, MapFlags, ProtFlags};
        // SAFETY: a fresh mapping at a kernel-chosen address.
        let p = unsafe {
            mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd, off)
        }
        .expect("mmap");
        Map { ptr: NonNull::new(p.cast()).unwrap(), len }
    }

    /// Maps the whole system-memory file of `sim`.
    pub fn mem(sim: &Sim) -> Map {
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&sim.mem).unwrap();
        Map::new(&f, MEM_SIZE as usize, 0)
    }

    pub fn u32(&self, off: usize) -> &AtomicU32 {
        assert!(off % 4 == 0 && off + 4 <= self.len);
        // SAFETY: in range, aligned, shared memory accessed atomically only.
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(off).cast()) }
    }

    pub fn u64(&self, off: usize) -> &AtomicU64 {
        assert!(off % 8 == 0 && off + 8 <= self.len);
        // SAFETY: in range, aligned, shared memory accessed atomically only.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(off).cast()) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: the range mmap returned.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
