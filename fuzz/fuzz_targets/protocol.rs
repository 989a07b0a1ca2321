//! `refgpu-sim`'s ivshmem server side on bad input from hosts
//! (`docs/refgpu.md` 2.3, "bad input from a host"). One server per
//! process, in-process, driven synchronously with [`Server::turn`] (zero
//! timeout) after everything a scripted host does: connect (also a second
//! host while one is connected), read its setup messages or not, send any
//! bytes (partial messages, well-formed int64s, the server's own messages
//! sent back) with or without file descriptors attached (eventfds, memfds,
//! its own socket), half-close, close, ring any of the model's vectors,
//! write any word of the shared memory (register page and the read-only
//! binding info page).
//!
//! Invariants after every input: the server is still serving (no panic; a
//! turn never fails); every host that sent something or left is
//! disconnected; the process holds exactly the file descriptors it held
//! before the input (none a host sent is kept, none of a departed host's
//! eventfds leaks: the count equals a fresh server's with no host); the
//! device is parked (IRQ_MASK, MMU_CTRL, IRQ_STATUS, every engine's CTRL
//! and STATUS 0) with its read-only words as published
//! at start; and a well-formed host then gets exactly the setup messages of
//! the spec (version 0, its id, -1 with the shared memory, one eventfd per
//! vector for the model and for itself, nothing else), runs a FENCE job
//! through the register page and its doorbells, receives the interrupt on
//! its own eventfd, and leaves the device parked again.
#![no_main]

use std::cell::RefCell;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use refgpu_model::regs::{self, eng, NUM_ENGINES};
use refgpu_model::shm::Mapping;
use refgpu_sim::{Options, Server, Turn};
use rustix::event::{eventfd, EventfdFlags};
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, Shutdown,
};

const VECTORS: usize = 5;
const SHM: usize = 64 << 10;
const MEM_BASE: u64 = 0x4000_0000;
const MEM: u64 = 1 << 20;
/// Polls (each a server turn of up to 1 ms) before an expected event
/// counts as never coming: seconds, left as soon as it comes.
const GUARD: u32 = 10_000;

struct Sim {
    server: Server,
    /// The shared memory's read-only words as first seen: (offset, value).
    read_only: Vec<(usize, u32)>,
    /// Descriptors open with the server up and no host ever connected.
    fds_fresh: usize,
    _dir: PathBuf,
}

thread_local! {
    static SIM: RefCell<Option<Sim>> = const { RefCell::new(None) };
}

fn start() -> Sim {
    let dir = std::env::temp_dir().join(format!("refgpu-fuzz-protocol-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut opts = Options::new(dir.join("sock"), dir.join("mem"));
    opts.mem_size = MEM;
    opts.mem_base = MEM_BASE;
    opts.shm_size = SHM as u64;
    opts.vectors = VECTORS as u32;
    opts.wait_poll = Duration::from_micros(20);
    opts.ns_per_kib = [0, 0];
    let mut server = Server::new(opts).expect("server starts");
    let fds_fresh = open_fds();
    // A host's view of the read-only words, through its own mapping.
    let c = Client::connect(&mut server);
    let mut read_only: Vec<(usize, u32)> = [regs::ID, regs::ENGINE_COUNT].map(|r| (r as usize, 0)).to_vec();
    read_only.extend((0x1000..0x2000).step_by(4).map(|o| (o, 0)));
    for (off, v) in &mut read_only {
        *v = c.shm.u32_at(*off).expect("inside shm").load(SeqCst);
    }
    assert_eq!(read_only[0].1 >> 16, regs::ID_MAGIC);
    c.leave(&mut server);
    Sim { server, read_only, fds_fresh, _dir: dir }
}

/// One turn without waiting; the server must not fail or stop.
fn turn(s: &mut Server) {
    assert_eq!(s.turn(Some(Duration::ZERO)).expect("a server turn"), Turn::Continue);
}

/// Turns (up to 1 ms each) until `cond` holds.
fn turn_until(s: &mut Server, what: &str, mut cond: impl FnMut(&Server) -> bool) {
    for _ in 0..GUARD {
        if cond(s) {
            return;
        }
        assert_eq!(s.turn(Some(Duration::from_millis(1))).expect("a server turn"), Turn::Continue);
    }
    assert!(cond(s), "{what}");
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
}

/// One message received without blocking: Ok(None) when nothing is there,
/// Err(()) on EOF or an error.
fn recv_msg(s: &UnixStream) -> Result<Option<(i64, Vec<OwnedFd>)>, ()> {
    let mut buf = [0u8; 8];
    let mut got = 0;
    let mut fds = Vec::new();
    while got < 8 {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [IoSliceMut::new(&mut buf[got..])];
        let flags = RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC;
        let r = match recvmsg(s, &mut iov, &mut control, flags) {
            Ok(r) => r,
            Err(rustix::io::Errno::AGAIN) if got == 0 => return Ok(None),
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => continue,
            Err(_) => return Err(()),
        };
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(f) = m {
                fds.extend(f);
            }
        }
        if r.bytes == 0 {
            return Err(());
        }
        got += r.bytes;
    }
    Ok(Some((i64::from_le_bytes(buf), fds)))
}

fn send_with_fds(s: &UnixStream, bytes: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) {
    let iov = [IoSlice::new(bytes)];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    // The server may have closed this connection already: any error is
    // the host's problem, not the server's.
    let _ = sendmsg(s, &iov, &mut control, SendFlags::NOSIGNAL | SendFlags::DONTWAIT);
}

/// A host that completed its setup.
struct Client {
    _stream: UnixStream,
    id: u16,
    shm: Mapping,
    bells: Vec<OwnedFd>,
    irqs: Vec<OwnedFd>,
}

impl Client {
    /// A well-formed host: connects, and checks that its setup messages are
    /// exactly those of the spec.
    fn connect(server: &mut Server) -> Client {
        let stream = UnixStream::connect(server_socket()).expect("connect");
        turn_until(server, "the server never accepted a well-formed host", |s| s.host_id().is_some());
        let id = server.host_id().expect("connected");
        let next = || match recv_msg(&stream) {
            Ok(Some(m)) => m,
            other => panic!("setup message missing: {:?}", other.map(|o| o.map(|m| m.0))),
        };
        let (v, fds) = next();
        assert_eq!((v, fds.len()), (0, 0), "version 0 without fd");
        let (v, fds) = next();
        assert_eq!((v, fds.len()), (i64::from(id), 0), "our id without fd");
        let (v, mut fds) = next();
        assert_eq!((v, fds.len()), (-1, 1), "-1 with the shared-memory fd");
        let shm_fd = fds.pop().expect("one fd");
        let size = rustix::fs::fstat(&shm_fd).expect("fstat").st_size;
        assert_eq!(size, SHM as i64, "shared memory size");
        let shm = Mapping::new(&shm_fd, SHM, 0).expect("map shm");
        let mut bells = Vec::new();
        let mut irqs = Vec::new();
        for (peer, out) in [(0, &mut bells), (i64::from(id), &mut irqs)] {
            for _ in 0..VECTORS {
                let (v, mut fds) = next();
                assert_eq!((v, fds.len()), (peer, 1), "peer {peer}'s eventfd");
                out.push(fds.pop().expect("one fd"));
            }
        }
        assert!(matches!(recv_msg(&stream), Ok(None)), "a message after the setup");
        Client { _stream: stream, id, shm, bells, irqs }
    }

    fn reg(&self, off: u32) -> &std::sync::atomic::AtomicU32 {
        self.shm.u32_at(off as usize).expect("register page")
    }

    fn ring(&self, v: usize) {
        rustix::io::write(&self.bells[v], &1u64.to_ne_bytes()).expect("doorbell");
    }

    /// A gen1 FENCE (with interrupt) on engine `e` through the page.
    fn fence_job(&self, server: &mut Server, e: usize, value: u64) {
        let m = server.model();
        let ring = MEM_BASE + 0x1000 * e as u64;
        let slot = MEM_BASE + 0x8000 + 64 * e as u64;
        m.write_u64(slot, 0).expect("slot");
        let pkt = [0x0401_0004, slot as u32, (slot >> 32) as u32, value as u32, (value >> 32) as u32];
        m.write_dwords(ring, &pkt).expect("ring");
        let r = |off: u32| self.reg(regs::engine_base(e) + off);
        self.reg(regs::IRQ_MASK).store(regs::irq_engine_bits(e), SeqCst);
        r(eng::RING_BASE_LO).store(ring as u32, SeqCst);
        r(eng::RING_BASE_HI).store((ring >> 32) as u32, SeqCst);
        r(eng::RING_SIZE).store(0x1000, SeqCst);
        r(eng::CTRL).store(regs::CTRL_ENABLE, SeqCst);
        self.ring(regs::CONTROL_VECTOR as usize);
        r(eng::RING_WPTR).store(20, SeqCst);
        self.ring(e);
        turn_until(server, "the FENCE of a well-formed host never landed", |s| {
            s.model().read_u64(slot).ok() == Some(value)
        });
        let irq = &self.irqs[e];
        turn_until(server, "no interrupt on the host's eventfd", |_| {
            let mut b = [0u8; 8];
            matches!(rustix::io::read(irq, &mut b), Ok(8))
        });
        self.reg(regs::IRQ_STATUS).fetch_and(!regs::irq_engine_bits(e), SeqCst);
    }

    fn leave(self, server: &mut Server) {
        let id = self.id;
        drop(self);
        turn_until(server, "the server kept a host that left", |s| s.host_id() != Some(id));
    }
}

fn server_socket() -> PathBuf {
    std::env::temp_dir().join(format!("refgpu-fuzz-protocol-{}", std::process::id())).join("sock")
}

/// A scripted host: its socket and, once it read them, its setup fds.
struct Host {
    stream: Option<UnixStream>,
    shm: Option<Mapping>,
    bells: Vec<OwnedFd>,
    /// Broke the protocol or left: keeps no setup fd it reads later.
    departed: bool,
}

impl Host {
    /// The host is about to break the protocol or leave: from then on it
    /// does not use the shared memory or doorbells it was given. (It could:
    /// ivshmem cannot take them back, see `docs/refgpu.md` 2.3; what it
    /// did with them would then reach the next host's device.)
    fn depart(&mut self) {
        self.departed = true;
        self.shm = None;
        self.bells.clear();
    }
}

fn check_parked(sim: &Sim) {
    let m = sim.server.model();
    // The register page's read-only words (the info page is checked
    // through the next host's mapping).
    for (off, v) in sim.read_only.iter().filter(|(off, _)| *off < 0x1000) {
        assert_eq!(m.read_reg(*off as u32), *v, "read-only register {off:#x} not restored");
    }
    for r in [regs::IRQ_MASK, regs::MMU_CTRL, regs::IRQ_STATUS] {
        assert_eq!(m.read_reg(r), 0, "register {r:#x} not parked");
    }
    for e in 0..NUM_ENGINES {
        let s = m.engine_snapshot(e).expect("engine");
        assert_eq!((s.ctrl, s.status, s.rptr), (0, 0, 0), "engine {e} not parked: {s:x?}");
    }
}

fuzz_target!(|data: &[u8]| {
    SIM.with(|cell| {
        let mut cell = cell.borrow_mut();
        let sim = cell.get_or_insert_with(start);
        let fds_before = open_fds();
        let mut hosts: Vec<Host> = Vec::new();
        let mut it = data.iter().copied();
        while let Some(op) = it.next() {
            let arg = it.next().unwrap_or(0);
            let h = usize::from(arg >> 4) % hosts.len().max(1);
            match op % 10 {
                0 if hosts.len() < 4 => {
                    if let Ok(s) = UnixStream::connect(server_socket()) {
                        hosts.push(Host { stream: Some(s), shm: None, bells: Vec::new(), departed: false });
                    }
                }
                1 => {
                    // Read whatever the server sent; keep the setup fds.
                    if let Some(host) = hosts.get_mut(h) {
                        if let Some(s) = &host.stream {
                            while let Ok(Some((v, mut fds))) = recv_msg(s) {
                                match (v, fds.pop().filter(|_| !host.departed)) {
                                    (-1, Some(fd)) if host.shm.is_none() => {
                                        host.shm = Mapping::new(&fd, SHM, 0).ok();
                                    }
                                    (0, Some(fd)) if host.bells.len() < VECTORS => host.bells.push(fd),
                                    _ => {}
                                }
                            }
                        }
                    }
                }
                2 | 3 | 9 => {
                    let n = usize::from(arg % 17).max(usize::from(op % 10 != 2));
                    let mut bytes: Vec<u8> = it.by_ref().take(n).collect();
                    if op % 10 == 9 {
                        // One of the server's own messages, sent back.
                        bytes = [-1i64, 0, 1][usize::from(arg) % 3].to_le_bytes().to_vec();
                    }
                    if bytes.is_empty() {
                        bytes.push(0);
                    }
                    if let Some(host) = hosts.get_mut(h) {
                        host.depart();
                    }
                    if let Some(Host { stream: Some(s), .. }) = hosts.get(h) {
                        if op % 10 == 2 {
                            send_with_fds(s, &bytes, &[]);
                        } else {
                            let efd = eventfd(0, EventfdFlags::CLOEXEC).expect("eventfd");
                            let mfd = rustix::fs::memfd_create("fuzz", rustix::fs::MemfdFlags::CLOEXEC)
                                .expect("memfd");
                            let all = [efd.as_fd(), mfd.as_fd(), s.as_fd()];
                            let k = 1 + usize::from(op / 10) % 3;
                            send_with_fds(s, &bytes, &all[..k]);
                        }
                    }
                }
                4 => {
                    if let Some(host) = hosts.get_mut(h) {
                        host.depart();
                    }
                    if let Some(Host { stream: Some(s), .. }) = hosts.get(h) {
                        let _ = rustix::net::shutdown(s, Shutdown::Write);
                    }
                }
                5 => {
                    if let Some(host) = hosts.get_mut(h) {
                        host.depart();
                        host.stream = None;
                    }
                }
                6 => {
                    if let Some(bell) =
                        hosts.get(h).and_then(|host| host.bells.get(usize::from(arg) % VECTORS))
                    {
                        let _ = rustix::io::write(bell, &u64::from(op / 10 + 1).to_ne_bytes());
                    }
                }
                7 => {
                    let off = (usize::from(arg) << 4 | usize::from(op >> 4)) * 4 % 0x2000;
                    let v = u32::from_le_bytes([0; 4].map(|_| it.next().unwrap_or(0)));
                    if let Some(shm) = hosts.get(h).and_then(|host| host.shm.as_ref()) {
                        if let Some(w) = shm.u32_at(off) {
                            w.store(v, SeqCst);
                        }
                    }
                }
                8 => {
                    let _ = sim.server.turn(Some(Duration::from_micros(u64::from(arg) * 4)));
                }
                _ => {}
            }
            turn(&mut sim.server);
        }
        drop(hosts);
        turn_until(&mut sim.server, "a host that left is still connected", |s| s.host_id().is_none());
        check_parked(sim);

        let c = Client::connect(&mut sim.server);
        for (off, v) in &sim.read_only {
            assert_eq!(c.shm.u32_at(*off).expect("shm").load(SeqCst), *v, "read-only word {off:#x} changed");
        }
        for e in 0..NUM_ENGINES {
            c.fence_job(&mut sim.server, e, 0xF00D_0000 + u64::from(c.id) * 4 + e as u64);
        }
        c.leave(&mut sim.server);
        check_parked(sim);
        assert_eq!(open_fds(), fds_before, "file descriptors leaked");
        // And none is kept for a host that left (its interrupt eventfds).
        assert_eq!(open_fds(), sim.fds_fresh, "descriptors held for a departed host");
    });
});
