//! Test fixtures: an open device with an IB buffer, a data buffer and a
//! timeline syncobj; buffers; IB encoding with `umd_core::cmd::Encoder`;
//! debugfs counts; devcoredumps; a closure run in a child process.

use std::sync::OnceLock;

use refgpu_uapi as u;
use umd_core::cmd::{Command, Encoder};
use umd_core::hw::Generation;

use crate::drm::{map_op, Dev, Errno, Map};

static EXPECTED_GEN: OnceLock<Option<u32>> = OnceLock::new();

/// Records the generation the harness booted.
pub fn set_expected_gen(g: Option<u32>) {
    let _ = EXPECTED_GEN.set(g);
}

/// The generation the harness booted, if it said.
pub fn expected_gen() -> Option<u32> {
    EXPECTED_GEN.get().copied().flatten()
}

/// Where the fixture maps its IB buffer.
pub const IB_VA: u64 = 0x1000_0000;
/// Where the fixture maps its data buffer.
pub const DATA_VA: u64 = 0x2000_0000;
/// IB buffer size.
pub const IB_SIZE: u64 = 256 << 10;
/// Data buffer size.
pub const DATA_SIZE: u64 = 1 << 20;
/// Timeout for waits that must succeed (a failure guard).
pub const WAIT_NS: i64 = 10_000_000_000;

/// A buffer: handle, CPU mapping, GPU VA.
pub struct Buf {
    /// GEM handle.
    pub handle: u32,
    /// Size in bytes.
    pub size: u64,
    /// GPU VA it is bound at.
    pub va: u64,
    /// CPU mapping.
    pub map: Map,
}

/// Creates a BO of `size`, maps it for the CPU and binds it at `va`.
pub fn buf(dev: &Dev, size: u64, va: u64) -> Result<Buf, String> {
    let handle = dev.bo_create(size, 0).map_err(|e| format!("BO_CREATE: errno {e}"))?;
    let off = dev.mmap_offset(handle).map_err(|e| format!("MMAP_OFFSET: errno {e}"))?;
    let map = dev.mmap(off, size as usize).map_err(|e| format!("mmap: errno {e}"))?;
    dev.vm_bind(&[map_op(handle, 0, va, size, 0)]).map_err(|e| format!("VM_BIND map {va:#x}: errno {e}"))?;
    Ok(Buf { handle, size, va, map })
}

/// A device with an IB buffer, a data buffer and a timeline syncobj.
pub struct Fx {
    /// The open render node.
    pub dev: Dev,
    /// The GPU generation.
    pub gen: Generation,
    /// IBs are encoded here.
    pub ib: Buf,
    /// Scratch data.
    pub data: Buf,
    /// A timeline syncobj; [`Fx::run`] signals its next point.
    pub sync: u32,
    /// Last point used on `sync`.
    pub point: u64,
    ib_pos: u64,
}

impl Fx {
    /// Opens the device and sets everything up.
    pub fn new() -> Result<Fx, String> {
        let dev = Dev::open().map_err(|e| format!("open: errno {e}"))?;
        let gen = match dev.param(u::param::GENERATION) {
            Ok(1) => Generation::Gen1,
            Ok(2) => Generation::Gen2,
            other => return Err(format!("GET_PARAM GENERATION: {other:?}")),
        };
        let ib = buf(&dev, IB_SIZE, IB_VA)?;
        let data = buf(&dev, DATA_SIZE, DATA_VA)?;
        let sync = dev.syncobj().map_err(|e| format!("SYNCOBJ_CREATE: errno {e}"))?;
        Ok(Fx { dev, gen, ib, data, sync, point: 0, ib_pos: 0 })
    }

    /// Encodes `cmds` as one IB in the IB buffer (64-byte aligned, wrapping
    /// to the start when full: callers wait before reusing); returns its VA
    /// and size in dwords.
    pub fn ib(&mut self, cmds: &[Command<'_>]) -> Result<(u64, u32), String> {
        encode_ib(self.gen, &self.ib, &mut self.ib_pos, cmds)
    }

    /// Submits `cmds` on `ctx`, signalling the next point of `sync`.
    pub fn run(&mut self, ctx: u32, cmds: &[Command<'_>]) -> Result<u64, String> {
        let (va, dw) = self.ib(cmds)?;
        self.point += 1;
        self.dev.submit(ctx, va, dw, self.sync, self.point).map_err(|e| format!("SUBMIT: errno {e}"))?;
        Ok(self.point)
    }

    /// Waits for `point` of `sync`.
    pub fn wait(&self, point: u64) -> Result<(), String> {
        self.dev
            .wait_point(self.sync, point, WAIT_NS)
            .map_err(|e| format!("TIMELINE_WAIT point {point}: errno {e}"))
    }

    /// A context on `engine`.
    pub fn ctx(&self, engine: u32) -> Result<u32, String> {
        self.dev.ctx_create(engine).map_err(|e| format!("CTX_CREATE: errno {e}"))
    }
}

/// Encodes `cmds` into `buf` at `*pos` (bytes), 64-byte aligned.
pub fn encode_ib(
    gen: Generation,
    buf: &Buf,
    pos: &mut u64,
    cmds: &[Command<'_>],
) -> Result<(u64, u32), String> {
    let enc = Encoder::new(gen);
    let mut out = vec![0u32; 8192];
    let mut n = 0usize;
    let start = (*pos + 63) & !63;
    let start = if start + 4 * out.len() as u64 > buf.size { 0 } else { start };
    let va = buf.va + start;
    for c in cmds {
        n += enc.encode(c, &mut out, n, va).map_err(|e| format!("encode {c:?}: {e}"))?;
    }
    buf.map.write(start as usize, &out[..n]);
    *pos = start + 4 * n as u64;
    Ok((va, n as u32))
}

/// Expects `r` to fail with `errno`.
pub fn expect_errno<T: std::fmt::Debug>(r: Result<T, Errno>, errno: Errno, what: &str) -> Result<(), String> {
    match r {
        Err(e) if e == errno => Ok(()),
        Err(e) => Err(format!("{what}: errno {e}, expected {errno}")),
        Ok(v) => Err(format!("{what}: succeeded ({v:?}), expected errno {errno}")),
    }
}

/// The refgpu debugfs directory.
pub fn debugfs_dir() -> Result<std::path::PathBuf, String> {
    let base = std::path::Path::new("/sys/kernel/debug/dri");
    for e in std::fs::read_dir(base).map_err(|e| format!("{}: {e}", base.display()))? {
        let p = e.map_err(|e| e.to_string())?.path();
        if p.join("counts").exists() {
            return Ok(p);
        }
    }
    Err("no refgpu debugfs directory with `counts`".into())
}

/// The live object counts of debugfs `counts`.
pub fn counts() -> Result<std::collections::BTreeMap<String, i64>, String> {
    let p = debugfs_dir()?.join("counts");
    let s = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    Ok(s.lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(k, v)| v.trim().parse().ok().map(|v| (k.to_string(), v)))
        .collect())
}

/// The live BO, VM, context and job counts.
pub fn live() -> Result<[i64; 4], String> {
    let c = counts()?;
    let g = |k: &str| c.get(k).copied().ok_or(format!("counts has no {k}"));
    Ok([g("bos")?, g("vms")?, g("contexts")?, g("jobs")?])
}

/// The devcoredump entries present (`devcdN`).
fn devcds() -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/sys/class/devcoredump")
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("devcd"))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (up to 10 s) for a devcoredump, reads it, dismisses it and waits
/// until it is gone. The entry appears before its `data` file
/// (`device_add()` links the class entry, then adds the attributes): a
/// missing `data` is waited for like a missing entry.
pub fn take_devcoredump() -> Result<String, String> {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(d) = devcds().first() {
            let data = d.join("data");
            match std::fs::read(&data) {
                Ok(bytes) => {
                    clear_devcoredumps()?;
                    return Ok(String::from_utf8_lossy(&bytes).into_owned());
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("{}: {e}", data.display())),
            }
        }
        if t0.elapsed() > std::time::Duration::from_secs(10) {
            return Err("no devcoredump under /sys/class/devcoredump".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Dismisses every devcoredump (writing to `data`) and waits (up to 5 s)
/// until they are gone: the kernel removes them asynchronously.
pub fn clear_devcoredumps() -> Result<(), String> {
    let t0 = std::time::Instant::now();
    loop {
        let d = devcds();
        if d.is_empty() {
            return Ok(());
        }
        for p in &d {
            let _ = std::fs::write(p.join("data"), b"1");
        }
        if t0.elapsed() > std::time::Duration::from_secs(5) {
            return Err(format!("devcoredumps not dismissed: {d:?}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Runs `f` in a child process (fork(2)) and returns its result: the
/// child's error comes back through a pipe; a child that dies otherwise
/// (a signal) fails with its wait status.
pub fn in_child(f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    use std::io::{Read, Write};
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) fills two descriptors.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if r != 0 {
        return Err(format!("pipe2: errno {}", crate::drm::errno()));
    }
    // SAFETY: both were just created and are owned by nobody else.
    let (mut rd, mut wr) =
        unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) };
    // SAFETY: fork(2); the child runs `f`, writes its error and _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        drop(rd);
        let code = match f() {
            Ok(()) => 0,
            Err(e) => {
                let _ = wr.write_all(e.as_bytes());
                1
            }
        };
        // SAFETY: _exit in the child; no destructors of the parent's state.
        unsafe { libc::_exit(code) };
    }
    drop(wr);
    if pid < 0 {
        return Err(format!("fork: errno {}", crate::drm::errno()));
    }
    let mut msg = String::new();
    let _ = rd.read_to_string(&mut msg);
    let mut st = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    match (libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, msg.is_empty()) {
        (true, _) => Ok(()),
        (false, false) => Err(msg),
        (false, true) => Err(format!("the child process ended with wait status {st:#x}")),
    }
}
