//! `refgpu-sim --shared-ram`: the shared-RAM binding (`docs/refgpu.md`
//! 2.3) driven by hand through a mapping of the RAM file: attach, a job
//! rung through the doorbell words and polled (no interrupts), fault
//! injection, the binding pages outside system memory, clean shutdown,
//! and the errors for a missing or wrongly sized file.

use std::process::{Command, Stdio};
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use refgpu_model::regs::{self, eng};
use refgpu_model::shared_ram as layout;
use refgpu_model::shm::Mapping;
use rustix::process::{kill_process, Pid, Signal};

/// Failure guard for anything that waits (never a performance threshold).
const GUARD: Duration = Duration::from_secs(30);
const BASE: u32 = layout::REGION_BASE as u32;
const E: usize = 2; // COPY

struct Sim {
    child: Option<std::process::Child>,
    log: std::path::PathBuf,
    ram: Mapping,
    _dir: tempfile::TempDir,
}

impl Sim {
    /// A 16 MiB RAM file and the server attached to it.
    fn start(extra: &[&str]) -> Sim {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ram.img");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.set_len(layout::REGION_SIZE).unwrap();
        let ram = Mapping::new(&f, layout::REGION_SIZE as usize, 0).unwrap();
        let log = dir.path().join("sim.log");
        let child = Command::new(env!("CARGO_BIN_EXE_refgpu-sim"))
            .arg("--shared-ram")
            .arg(&path)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let sim = Sim { child: Some(child), log, ram, _dir: dir };
        let start = Instant::now();
        while sim.bell_page(layout::ATTACH_OFF).load(SeqCst) != layout::ATTACH_MAGIC {
            assert!(start.elapsed() < GUARD, "never attached: {}", sim.log_text());
            std::thread::sleep(Duration::from_millis(2));
        }
        sim
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn word(&self, off: u64) -> &AtomicU32 {
        self.ram.u32_at(off as usize).unwrap()
    }

    fn reg(&self, r: u32) -> &AtomicU32 {
        self.word(layout::regs_offset(layout::REGION_SIZE) + u64::from(r))
    }

    fn ereg(&self, r: u32) -> &AtomicU32 {
        self.reg(regs::engine_base(E) + r)
    }

    fn bell_page(&self, off: usize) -> &AtomicU32 {
        self.word(layout::doorbell_page_offset(layout::REGION_SIZE) + off as u64)
    }

    /// Rings vector `v`: adds 1 to its doorbell word.
    fn ring(&self, v: usize) {
        self.bell_page(layout::DOORBELL_OFF + 4 * v).fetch_add(1, SeqCst);
    }

    /// Polls until `f` holds (failure guard GUARD).
    fn until(&self, what: &str, f: impl Fn() -> bool) {
        let start = Instant::now();
        while !f() {
            assert!(start.elapsed() < GUARD, "{what} never happened: {}", self.log_text());
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Programs COPY's ring at the region's start (MMU off) with `words`
    /// and rings it; waits until RPTR reached the end.
    fn run_ring(&self, words: &[u32]) {
        for (i, w) in words.iter().enumerate() {
            self.word(0x1000 + 4 * i as u64).store(*w, SeqCst);
        }
        self.reg(regs::IRQ_MASK).store(regs::irq_engine_bits(E), SeqCst);
        self.ereg(eng::RING_BASE_LO).store(BASE + 0x1000, SeqCst);
        self.ereg(eng::RING_SIZE).store(4096, SeqCst);
        self.ereg(eng::CTRL).store(regs::CTRL_ENABLE, SeqCst);
        self.ring(regs::CONTROL_VECTOR as usize);
        let end = words.len() as u32 * 4;
        self.ereg(eng::RING_WPTR).store(end, SeqCst);
        self.ring(E);
        self.until("RPTR at WPTR", || {
            self.ereg(eng::RING_RPTR).load(SeqCst) == end || self.ereg(eng::FAULT_STATUS).load(SeqCst) != 0
        });
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().unwrap();
        kill_process(Pid::from_child(&c), Signal::TERM).unwrap();
        let start = Instant::now();
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return st;
            }
            assert!(start.elapsed() < GUARD, "no exit on SIGTERM: {}", self.log_text());
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// WRITE_DATA 0xC0DE at +0x100 and FENCE(irq) `value` at +0x140 (gen1).
fn write_and_fence(value: u32) -> Vec<u32> {
    let d = BASE + 0x100;
    vec![0x0100_0003, d, 0, 0xC0DE, 0x0401_0004, d + 0x40, 0, value, 0]
}

#[test]
fn attach_job_polled_and_clean_shutdown() {
    let sim = Sim::start(&["--gen", "2"]);
    assert_eq!(sim.reg(regs::ID).load(SeqCst), 0x5247_0200);
    assert_eq!(sim.reg(regs::ENGINE_COUNT).load(SeqCst), 3);
    assert_eq!(sim.bell_page(layout::VERSION_OFF).load(SeqCst), 1);
    assert_eq!(sim.bell_page(layout::MEM_SIZE_OFF).load(SeqCst), 0xFF_E000);
    assert_eq!(sim.bell_page(layout::MEM_BASE_OFF).load(SeqCst), BASE, "MEM_BASE published");
    assert_eq!(sim.bell_page(layout::MEM_BASE_OFF + 4).load(SeqCst), 0);
    // The server logs its attach line after it sets ATTACH (which is all
    // `Sim::start` waits for): wait for the line, then check it.
    sim.until("the attach line in the log", || sim.log_text().contains("polling only)"));
    let log = sim.log_text();
    assert!(log.contains("register page at 0x21ffe000"), "{log}");
    // CLOCK is the heartbeat.
    let c0 = sim.reg(regs::CLOCK_LO).load(SeqCst);
    sim.until("CLOCK moving", || sim.reg(regs::CLOCK_LO).load(SeqCst) != c0);
    drop(sim);

    let mut sim = Sim::start(&[]);
    sim.run_ring(&write_and_fence(7));
    assert_eq!(sim.word(0x100).load(SeqCst), 0xC0DE);
    assert_eq!(sim.word(0x140).load(SeqCst), 7, "the fence value, seen by polling");
    assert_ne!(sim.reg(regs::IRQ_STATUS).load(SeqCst) & (1 << E), 0, "IRQ_STATUS set, nothing raised");

    // A second job on the same ring: doorbells keep working after idling
    // long enough for the watcher to back off.
    std::thread::sleep(Duration::from_millis(150));
    let more = [0x0100_0003, BASE + 0x200, 0, 0xBEEF];
    for (i, w) in more.iter().enumerate() {
        sim.word(0x1000 + 36 + 4 * i as u64).store(*w, SeqCst);
    }
    sim.ereg(eng::RING_WPTR).store(36 + 16, SeqCst);
    sim.ring(E);
    sim.until("second job", || sim.word(0x200).load(SeqCst) == 0xBEEF);

    let st = sim.terminate();
    assert!(st.success(), "{st}: {}", sim.log_text());
    assert_eq!(sim.bell_page(layout::ATTACH_OFF).load(SeqCst), 0, "ATTACH cleared on a clean shutdown");
    let log = sim.log_text();
    assert!(log.contains("detaching from") && log.contains("doorbells seen"), "{log}");
    assert_eq!(sim.word(0x140).load(SeqCst), 7, "system memory is left as it is");
}

#[test]
fn fault_injection_and_binding_pages_outside_memory() {
    // The first fence of every engine dropped.
    let sim = Sim::start(&["--drop-fence-nth", "1"]);
    sim.run_ring(&write_and_fence(9));
    assert_eq!(sim.word(0x100).load(SeqCst), 0xC0DE, "the write ran");
    assert_eq!(sim.word(0x140).load(SeqCst), 0, "the fence was dropped");
    drop(sim);

    // A GPU write to the register page: a BUS fault, the page untouched.
    let sim = Sim::start(&[]);
    let regs_pa = BASE + layout::regs_offset(layout::REGION_SIZE) as u32;
    sim.run_ring(&[0x0100_0003, regs_pa + regs::IRQ_MASK, 0, 0xFFFF_FFFF]);
    let fs = sim.ereg(eng::FAULT_STATUS).load(SeqCst);
    assert_eq!(fs >> 31, 1, "fault latched: {fs:#x}");
    assert_eq!(fs & 0xF, 5, "BUS fault: {fs:#x}");
    assert_eq!(sim.ereg(eng::FAULT_ADDR_LO).load(SeqCst), regs_pa + regs::IRQ_MASK);
    assert_eq!(sim.reg(regs::IRQ_MASK).load(SeqCst), regs::irq_engine_bits(E));
}

#[test]
fn a_killed_model_leaves_attach_set_and_clock_frozen() {
    let mut sim = Sim::start(&["--clock-publish", "100us"]);
    let mut c = sim.child.take().unwrap();
    c.kill().unwrap();
    c.wait().unwrap();
    let c0 = sim.reg(regs::CLOCK_LO).load(SeqCst);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(sim.reg(regs::CLOCK_LO).load(SeqCst), c0, "no heartbeat after the kill");
    assert_eq!(sim.bell_page(layout::ATTACH_OFF).load(SeqCst), layout::ATTACH_MAGIC);
}

fn start_err(setup: impl FnOnce(&std::path::Path)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ram.img");
    setup(&path);
    let out = Command::new(env!("CARGO_BIN_EXE_refgpu-sim"))
        .arg("--shared-ram")
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn missing_or_wrongly_sized_file_is_refused() {
    let e = start_err(|_| {});
    assert!(e.contains("no such file") && e.contains("exactly 16 MiB"), "{e}");
    for len in [0, 8 << 20, (16 << 20) + 4096] {
        let e = start_err(|p| std::fs::File::create(p).unwrap().set_len(len).unwrap());
        assert!(e.contains(&format!("is {len:#x} bytes")) && e.contains("exactly 16 MiB"), "{len}: {e}");
    }
}

#[test]
fn a_second_model_on_a_live_file_is_refused() {
    let sim = Sim::start(&[]);
    let path = sim._dir.path().join("ram.img");
    let out = Command::new(env!("CARGO_BIN_EXE_refgpu-sim")).arg("--shared-ram").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("another model is attached"), "{e}");
    assert_eq!(sim.reg(regs::ID).load(SeqCst) >> 16, 0x5247, "the live model's page untouched");
}
