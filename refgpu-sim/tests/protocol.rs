//! `refgpu-sim` speaking the ivshmem server protocol to a hand-written
//! client: message order and fds, interrupts through the right eventfds, a
//! host leaving mid-run, a second host, a malformed message, signals.

mod common;

use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Instant;

use common::*;
use refgpu_model::regs::{self, eng};
use rustix::process::Signal;

const E: usize = 2; // COPY

fn ereg(c: &Client, r: u32) -> &std::sync::atomic::AtomicU32 {
    c.reg(regs::engine_base(E) + r)
}

/// Programs COPY's ring at MEM_BASE (MMU off) with `words` and runs it.
fn run_ring(c: &Client, mem: &Map, words: &[u32]) {
    for (i, w) in words.iter().enumerate() {
        mem.u32(i * 4).store(*w, SeqCst);
    }
    c.reg(regs::IRQ_MASK).store(regs::irq_engine_bits(E), SeqCst);
    ereg(c, eng::RING_BASE_LO).store(MEM_BASE as u32, SeqCst);
    ereg(c, eng::RING_BASE_HI).store(0, SeqCst);
    ereg(c, eng::RING_SIZE).store(4096, SeqCst);
    ereg(c, eng::CTRL).store(regs::CTRL_ENABLE, SeqCst);
    c.ring(regs::CONTROL_VECTOR as usize);
    ereg(c, eng::RING_WPTR).store(words.len() as u32 * 4, SeqCst);
    c.ring(E);
}

/// WRITE_DATA 0xC0DE at +0x100 and FENCE(irq) `value` at +0x140 (gen1).
fn write_and_fence(value: u32) -> Vec<u32> {
    let d = MEM_BASE as u32 + 0x100;
    vec![0x0100_0003, d, 0, 0xC0DE, 0x0401_0004, d + 0x40, 0, value, 0]
}

fn job_with_irq(c: &Client, mem: &Map, value: u32) {
    run_ring(c, mem, &write_and_fence(value));
    assert!(c.wait_irq(E) >= 1);
    assert_eq!(mem.u32(0x100).load(SeqCst), 0xC0DE);
    assert_eq!(mem.u64(0x140).load(SeqCst), u64::from(value));
    assert_ne!(c.reg(regs::IRQ_STATUS).load(SeqCst) & 1 << E, 0);
    c.reg(regs::IRQ_STATUS).fetch_and(!(1 << E), SeqCst);
}

#[test]
fn setup_messages_and_one_job() {
    let mut sim = Sim::start(&["--gen", "2", "--shm-size", "128K", "--vectors", "5"]);
    let c = Client::connect(&sim, 5);
    assert_eq!(c.id, 1);
    assert_eq!(c.shm_size, 128 << 10);
    assert_eq!(c.reg(regs::ID).load(SeqCst), 0x5247_0200);
    assert_eq!(c.reg(regs::ENGINE_COUNT).load(SeqCst), 3);
    // The info page names the memory file and the window.
    assert_eq!(c.shm.u32(0x1000).load(SeqCst), u32::from_le_bytes(*b"RGSI"));
    assert_eq!(c.shm.u32(0x1008).load(SeqCst), 5);
    assert_eq!(c.shm.u64(0x1010).load(SeqCst), MEM_BASE);
    assert_eq!(c.shm.u64(0x1018).load(SeqCst), MEM_SIZE);
    // Gen2 job: WRITE_DATA + FENCE(irq) at a 64-byte aligned address.
    let mem = Map::mem(&sim);
    let d = MEM_BASE as u32 + 0x100;
    run_ring(&c, &mem, &[0x7003_0010, d, 0, 0xC0DE, 0x7004_0130, d + 0x40, 0, 9, 0]);
    assert!(c.wait_irq(E) >= 1);
    assert_eq!(mem.u32(0x100).load(SeqCst), 0xC0DE);
    assert_eq!(mem.u64(0x140).load(SeqCst), 9);
    // The clock moves in the shared page.
    let t0 = c.reg(regs::CLOCK_LO).load(SeqCst);
    let start = Instant::now();
    while c.reg(regs::CLOCK_LO).load(SeqCst) == t0 {
        assert!(start.elapsed() < GUARD, "CLOCK never moved");
        // Yield rather than spin: the server needs a core to publish it.
        std::thread::yield_now();
    }
    drop(c);
    let st = sim.signal_and_wait(Signal::TERM);
    assert!(st.success(), "exit status {st}");
    assert!(!sim.socket.exists(), "socket left behind");
    assert!(sim.log_text().contains("signal 15: shutting down"));
}

#[test]
fn second_host_refused_first_keeps_working_third_accepted() {
    let mut sim = Sim::start(&[]);
    let mem = Map::mem(&sim);
    let c1 = Client::connect(&sim, 4);
    let s2 = UnixStream::connect(&sim.socket).unwrap();
    s2.set_read_timeout(Some(GUARD)).unwrap();
    assert!(Client::setup(s2, 4).is_none(), "a second host got setup messages");
    sim.wait_log("refusing connection: peer 1 is connected (one host at a time)");
    job_with_irq(&c1, &mem, 1);
    drop(c1);
    sim.wait_log("peer 1 disconnected");
    let c3 = Client::connect(&sim, 4);
    assert_eq!(c3.id, 2, "ids count up per accepted host");
    job_with_irq(&c3, &mem, 2);
    assert!(sim.alive());
}

#[test]
fn host_leaving_mid_run_parks_the_device() {
    let mut sim = Sim::start(&[]);
    let mem = Map::mem(&sim);
    let c1 = Client::connect(&sim, 4);
    // COPY blocks in WAIT_MEM on a word that stays 0 (EQ 1, 32-bit).
    let w = MEM_BASE as u32 + 0x200;
    run_ring(&c1, &mem, &[0x0500_0006, w, 0, 1, 0, 0xFFFF_FFFF, 0]);
    let start = Instant::now();
    while ereg(&c1, eng::STATUS).load(SeqCst) & regs::STATUS_WAITING == 0 {
        assert!(start.elapsed() < GUARD, "engine never waited");
        std::thread::yield_now();
    }
    c1.reg(regs::MMU_CTRL).store(0, SeqCst);
    let shm = c1.shm_size;
    drop(c1);
    sim.wait_log("device parked");
    assert!(sim.alive(), "the server died with its host");
    let c2 = Client::connect(&sim, 4);
    assert_eq!(c2.shm_size, shm);
    assert_eq!(ereg(&c2, eng::CTRL).load(SeqCst), 0, "engine not disabled / reset incomplete");
    assert_eq!(ereg(&c2, eng::STATUS).load(SeqCst), 0, "engine still busy");
    assert_eq!(ereg(&c2, eng::RING_RPTR).load(SeqCst), 0);
    assert_eq!(c2.reg(regs::IRQ_MASK).load(SeqCst), 0);
    assert_eq!(c2.reg(regs::IRQ_STATUS).load(SeqCst), 0);
    // And the parked device works for the new host.
    job_with_irq(&c2, &mem, 3);
}

/// A host may ring as soon as it has read its last setup message: the
/// interrupt of that first job must reach the eventfd it was just given,
/// however late the server's thread gets back to it. Many short-lived hosts
/// in a row, each ringing at once (a lost interrupt fails within `GUARD`).
#[test]
fn host_ringing_right_after_setup_gets_its_interrupt() {
    let sim = Sim::start(&[]);
    let mem = Map::mem(&sim);
    for i in 1..=30 {
        let c = Client::connect(&sim, 4);
        job_with_irq(&c, &mem, i);
        drop(c);
        let start = Instant::now();
        while sim.log_text().matches("device parked").count() < i as usize {
            assert!(start.elapsed() < GUARD, "host {i} was not parked:\n{}", sim.log_text());
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

#[test]
fn malformed_message_disconnects_that_host_only() {
    let mut sim = Sim::start(&[]);
    let c1 = Client::connect(&sim, 4);
    rustix::io::write(&c1.stream, b"bad").unwrap();
    assert!(recv(&c1.stream).is_none(), "the server kept a host that broke the protocol");
    sim.wait_log("peer 1: protocol error: received 3 byte(s)");
    let c2 = Client::connect(&sim, 4);
    let mem = Map::mem(&sim);
    job_with_irq(&c2, &mem, 4);
    drop(c2);
    let st = sim.signal_and_wait(Signal::INT);
    assert!(st.success());
    assert!(!sim.socket.exists());
}

#[test]
fn bad_command_line_exits_with_usage() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_refgpu-sim"))
        .args(["--socket", "/nonexistent/s", "--mem-file", "/nonexistent/m", "--gen", "3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid value '3' for '--gen <1|2>': 1 or 2") && err.contains("try '--help'"),
        "{err}"
    );
    // A value that parses but is out of range: the range check, then the usage.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_refgpu-sim"))
        .args(["--socket", "/nonexistent/s", "--mem-file", "/nonexistent/m", "--vectors", "3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--vectors \"3\": 4 ..= 64") && err.contains("Usage: refgpu-sim"), "{err}");
    // --help is not an error.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_refgpu-sim")).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("--drop-fence-prob <P>"));
}

#[test]
fn live_socket_is_not_stolen() {
    let sim = Sim::start(&[]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_refgpu-sim"))
        .arg("--socket")
        .arg(&sim.socket)
        .arg("--mem-file")
        .arg(sim.dir.path().join("other.img"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by a running server"));
}

/// Section 2.3: a control doorbell rung before an engine's doorbell is
/// applied before that engine fetches, although the engine takes its own
/// doorbell on its own thread. Each round turns the MMU on with an empty
/// root table, rings the control doorbell and at once the engine: the ring
/// fetch must fault (TRANSLATION at the ring's address), never run with
/// the MMU still off (which would write the fence).
#[test]
fn control_doorbell_applies_before_a_later_engine_doorbell() {
    let sim = Sim::start(&[]);
    let c = Client::connect(&sim, 4);
    let mem = Map::mem(&sim);
    let root = MEM_BASE + 0x1000;
    for i in 0..1024 {
        mem.u32(0x1000 + i * 4).store(0, SeqCst);
    }
    let words = write_and_fence(1);
    for (i, w) in words.iter().enumerate() {
        mem.u32(i * 4).store(*w, SeqCst);
    }
    for round in 0..200 {
        mem.u64(0x140).store(0, SeqCst);
        // Reset the engine with the MMU off, keeping it enabled (so only
        // the MMU, not CTRL.ENABLE, stands between the doorbell and a
        // fetch), then program its ring.
        c.reg(regs::MMU_CTRL).store(0, SeqCst);
        ereg(&c, eng::CTRL).store(regs::CTRL_RESET | regs::CTRL_ENABLE, SeqCst);
        c.ring(regs::CONTROL_VECTOR as usize);
        let start = Instant::now();
        while ereg(&c, eng::CTRL).load(SeqCst) & regs::CTRL_RESET != 0 {
            assert!(start.elapsed() < GUARD, "reset never completed");
            std::thread::yield_now();
        }
        ereg(&c, eng::RING_BASE_LO).store(MEM_BASE as u32, SeqCst);
        ereg(&c, eng::RING_BASE_HI).store(0, SeqCst);
        ereg(&c, eng::RING_SIZE).store(4096, SeqCst);
        // MMU on with nothing mapped: control doorbell, then at once the
        // engine's doorbell.
        c.reg(regs::MMU_ROOT_LO).store(root as u32, SeqCst);
        c.reg(regs::MMU_ROOT_HI).store(0, SeqCst);
        c.reg(regs::MMU_CTRL).store(regs::MMU_ENABLE, SeqCst);
        c.ring(regs::CONTROL_VECTOR as usize);
        ereg(&c, eng::RING_WPTR).store(words.len() as u32 * 4, SeqCst);
        c.ring(E);
        let start = Instant::now();
        while ereg(&c, eng::STATUS).load(SeqCst) & regs::STATUS_HALTED == 0 {
            assert_eq!(mem.u64(0x140).load(SeqCst), 0, "round {round}: the ring ran with the MMU off");
            assert!(start.elapsed() < GUARD, "round {round}: engine neither faulted nor ran");
            std::thread::yield_now();
        }
        assert_eq!(mem.u64(0x140).load(SeqCst), 0, "round {round}: the ring ran with the MMU off");
        assert_eq!(ereg(&c, eng::FAULT_ADDR_LO).load(SeqCst), MEM_BASE as u32, "round {round}");
    }
}

/// Plain shared memory does not protect the words hosts may only read: a
/// host that scribbled over ID and the binding info page, then broke the
/// protocol with bytes carrying a file descriptor, must leave them intact
/// for the next host (found by the `protocol` fuzz target). The descriptor
/// it sent is never taken, and the next host's device works.
#[test]
fn read_only_words_are_restored_after_a_host_with_fds_breaks_the_protocol() {
    let sim = Sim::start(&[]);
    let c1 = Client::connect(&sim, 4);
    let id = c1.reg(regs::ID).load(SeqCst);
    let info_magic = c1.shm.u32(0x1000).load(SeqCst);
    let path_len = c1.shm.u32(0x1028).load(SeqCst);
    c1.reg(regs::ID).store(0xDEAD_BEEF, SeqCst);
    c1.reg(regs::ENGINE_COUNT).store(7, SeqCst);
    c1.shm.u32(0x1000).store(0, SeqCst);
    c1.shm.u32(0x1028).store(0xFFFF, SeqCst);
    let efd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    let msg = (-1i64).to_le_bytes();
    let iov = [std::io::IoSlice::new(&msg)];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    let fds = [std::os::fd::AsFd::as_fd(&efd)];
    assert!(control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)));
    rustix::net::sendmsg(&c1.stream, &iov, &mut control, rustix::net::SendFlags::NOSIGNAL).unwrap();
    assert!(recv(&c1.stream).is_none(), "the server kept a host that sent it an fd");
    sim.wait_log("peer 1: protocol error: received 8 byte(s)");
    sim.wait_log("device parked");
    let c2 = Client::connect(&sim, 4);
    assert_eq!(c2.reg(regs::ID).load(SeqCst), id);
    assert_eq!(c2.reg(regs::ENGINE_COUNT).load(SeqCst), 3);
    assert_eq!(c2.shm.u32(0x1000).load(SeqCst), info_magic);
    assert_eq!(c2.shm.u32(0x1028).load(SeqCst), path_len);
    let mem = Map::mem(&sim);
    job_with_irq(&c2, &mem, 5);
}
