//! Random-ioctl fuzzing (docs/linux.md, "The adversarial suite"): every
//! refgpu ioctl and the DRM core ioctls the driver relies on, with random
//! sizes, flags, counts, handles, offsets and pointers, for a fixed number
//! of iterations from a seeded PRNG (`rgtest.seed=N` on the kernel command
//! line, else [`DEFAULT_SEED`]). Pointers go into an arena of read-write,
//! read-only and `PROT_NONE` pages (never into the fuzzer's own memory),
//! unaligned, or across the end of the read-write pages; now and then the
//! arguments are valid ones (live handles, mapped VAs, a real IB), so the
//! deep paths run too. Every call must return 0 or an errno of the
//! ioctl's documented set; a WARN panics the kernel (`panic_on_warn`).
//! The fuzzer runs in a child process, so what it created and could not
//! learn about (an object whose handle was to be written to a read-only
//! page) goes with the child's files.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use refgpu_uapi as u;
use umd_core::cmd::{Command, Payload};

use crate::drm;
use crate::ensure;
use crate::fixture::{Fx, DATA_VA, IB_VA};
use crate::R;

/// The seed when the command line gives none.
pub const DEFAULT_SEED: u64 = 0x005E_ED0F_2EF6_0001;
/// Iterations (ioctl calls) per run: a budget in calls, not in time, so a
/// seed always makes the same calls.
pub const ITERATIONS: u32 = 12_000;

/// The workloads' splitmix64 (`conformance::faults::Rng`), with the
/// fuzzer's choices on top.
pub struct Rng(conformance::faults::Rng);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(conformance::faults::Rng(seed))
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.below(n)
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// One of `v` (non-empty).
    pub fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }
}

/// The seed: `rgtest.seed=N` of the kernel command line, or the default.
pub fn seed() -> u64 {
    std::fs::read_to_string("/proc/cmdline")
        .ok()
        .and_then(|c| c.split_whitespace().find_map(|w| w.strip_prefix("rgtest.seed=")?.parse().ok()))
        .unwrap_or(DEFAULT_SEED)
}

const PAGE: usize = 4096;
/// GET_PARAM VA_START and MAX_BIND_OPS (docs/linux.md).
const VA_START: u64 = 1 << 20;
const MAX_BIND_OPS: u32 = 4096;
/// DRM core's syncobj ioctls (6.12) copy their handle array with an
/// unchecked `kmalloc_array(count_handles)`, which WARNs in the page
/// allocator for a count whose array exceeds the largest page order
/// (4 MiB): a WARN under `panic_on_warn`, in code that is not the
/// driver's. The fuzzer keeps those counts below this (the waits' other
/// per-handle arrays stay far below 4 MiB too).
const CORE_COUNT_MAX: u32 = 1 << 14;
/// Fuzzed VAs lie below this (or are boundaries and garbage): the
/// fuzzer unmaps it all now and then, so its mappings pin little memory.
const FUZZ_VA_END: u64 = 1 << 30;
/// Read-write pages at the arena's start.
const RW_PAGES: usize = 128;
/// Then one PROT_NONE page, one read-only page, one PROT_NONE page.
const ARENA_PAGES: usize = RW_PAGES + 3;
const RW_END: usize = RW_PAGES * PAGE;
const RO_START: usize = RW_END + PAGE;
/// Where in the read-write pages each argument of a call goes.
const SLOT: [usize; 3] = [0, 8 * PAGE, 64 * PAGE];

/// The fuzzer's memory: the only memory its pointers may name.
struct Arena {
    base: *mut u8,
}

impl Arena {
    fn new() -> Result<Arena, String> {
        // SAFETY: a fresh private anonymous mapping chosen by the kernel.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ARENA_PAGES * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        ensure!(p != libc::MAP_FAILED, "mmap arena: errno {}", drm::errno());
        let a = Arena { base: p.cast() };
        a.protect(RW_END, PAGE, libc::PROT_NONE)?;
        a.protect(RO_START, PAGE, libc::PROT_READ)?;
        a.protect(RO_START + PAGE, PAGE, libc::PROT_NONE)?;
        Ok(a)
    }

    fn protect(&self, off: usize, len: usize, prot: i32) -> R {
        // SAFETY: page-aligned range inside the arena's mapping.
        let r = unsafe { libc::mprotect(self.base.add(off).cast(), len, prot) };
        ensure!(r == 0, "mprotect: errno {}", drm::errno());
        Ok(())
    }

    fn addr(&self, off: usize) -> u64 {
        self.base as u64 + off as u64
    }

    /// Copies `bytes` to `off`, clipped to the read-write pages (or to the
    /// read-only page, made writable for the copy).
    fn write(&self, off: usize, bytes: &[u8]) -> R {
        let (lo, hi) = if off >= RO_START { (RO_START, RO_START + PAGE) } else { (0, RW_END) };
        if off < lo || off >= hi {
            return Ok(());
        }
        let n = bytes.len().min(hi - off);
        if lo == RO_START {
            self.protect(RO_START, PAGE, libc::PROT_READ | libc::PROT_WRITE)?;
        }
        // SAFETY: `[off, off + n)` lies in writable pages of the arena.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(off), n) };
        if lo == RO_START {
            self.protect(RO_START, PAGE, libc::PROT_READ)?;
        }
        Ok(())
    }

    /// The dword at `off` of the read-write pages.
    fn r32(&self, off: usize) -> u32 {
        let mut b = [0u8; 4];
        if off + 4 <= RW_END {
            // SAFETY: in the read-write pages.
            unsafe { std::ptr::copy_nonoverlapping(self.base.add(off), b.as_mut_ptr(), 4) };
        }
        u32::from_le_bytes(b)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: the arena's own mapping.
        unsafe { libc::munmap(self.base.cast(), ARENA_PAGES * PAGE) };
    }
}

/// Where an argument (the ioctl's struct or an array it points at) goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Aligned, in read-write memory.
    Good,
    /// Read-write, 1..7 bytes off alignment.
    Unaligned,
    /// Ends 1..len bytes into the PROT_NONE page after the read-write pages.
    Crossing,
    /// In the PROT_NONE page.
    NoAccess,
    /// In the read-only page.
    ReadOnly,
    /// NULL, a kernel address, a non-canonical one.
    Wild,
}

/// One argument of a call: its bytes and place; `off` is set by `lay`.
struct Arg {
    bytes: Vec<u8>,
    place: Place,
    off: Option<usize>,
}

/// Little-endian struct builder.
#[derive(Default)]
struct B(Vec<u8>);

impl B {
    fn u32(mut self, v: u32) -> B {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> B {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
}

/// The errnos a call may return: docs/linux.md for the driver's ioctls,
/// DRM core's documented ones for its own.
mod errs {
    use libc::*;
    pub const GET_PARAM: &[i32] = &[EINVAL, EFAULT];
    pub const BO_CREATE: &[i32] = &[EINVAL, E2BIG, EFAULT, ENOMEM];
    pub const MMAP_OFFSET: &[i32] = &[EINVAL, ENOENT, EPERM, EFAULT, ENOMEM];
    pub const VM_BIND: &[i32] = &[EINVAL, ENOENT, EACCES, EEXIST, EFAULT, ENOSPC, ENOMEM, EINTR];
    pub const CTX_CREATE: &[i32] = &[EINVAL, EBUSY, EFAULT, ENOMEM];
    pub const CTX_DESTROY: &[i32] = &[EINVAL, ENOENT, EFAULT];
    pub const SUBMIT: &[i32] = &[EINVAL, ENOENT, ECANCELED, EBUSY, EMFILE, ENOMEM, EFAULT];
    pub const CTX_QUERY: &[i32] = &[EINVAL, ENOENT, EFAULT];
    pub const SUBMIT_BATCH: &[i32] = &[EINVAL, E2BIG, ENOENT, ECANCELED, EBUSY, ENOMEM, EFAULT];
    pub const GEM_CLOSE: &[i32] = &[EINVAL, EFAULT];
    pub const PRIME_EXPORT: &[i32] = &[EINVAL, ENOENT, EFAULT, ENOMEM, EMFILE];
    pub const PRIME_IMPORT: &[i32] = &[EINVAL, EBADF, EFAULT, ENOMEM];
    pub const SYNCOBJ: &[i32] = &[EINVAL, ENOENT, EFAULT, ENOMEM];
    pub const SYNCOBJ_FD: &[i32] = &[EINVAL, ENOENT, EBADF, EFAULT, ENOMEM, EMFILE];
    pub const SYNCOBJ_WAIT: &[i32] = &[EINVAL, ENOENT, EFAULT, ENOMEM, ETIME];
}

const fn core_nr(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | ((b'd' as u32) << 8) | nr
}

/// What the fuzzer keeps of what its calls created: handles and fds to
/// use as valid arguments.
#[derive(Default)]
struct Pool {
    bos: Vec<u32>,
    /// Sizes of the BOs in `bos` (imported ones: at least a page).
    sizes: std::collections::HashMap<u32, u64>,
    syncobjs: Vec<u32>,
    ctxs: Vec<u32>,
    fds: VecDeque<RawFd>,
    /// A valid IB: VA and size in dwords.
    ib: (u64, u32),
}

impl Pool {
    fn keep_fd(&mut self, fd: i32) {
        if fd >= 0 {
            self.fds.push_back(fd);
        }
        while self.fds.len() > 24 {
            if let Some(old) = self.fds.pop_front() {
                // SAFETY: an fd a call of ours returned, closed once.
                unsafe { libc::close(old) };
            }
        }
    }
}

/// One call being built.
struct Call {
    name: &'static str,
    req: u32,
    allowed: &'static [i32],
    args: Vec<Arg>,
}

/// The fuzzer's state.
struct Fuzz {
    rng: Rng,
    arena: Arena,
    pool: Pool,
    fd: RawFd,
    va_end: u64,
    ib_max: u32,
}

impl Fuzz {
    fn handle(&mut self, pool: &[u32]) -> u32 {
        if !pool.is_empty() && self.rng.chance(3, 5) {
            return self.rng.pick(pool);
        }
        match self.rng.below(5) {
            0 => 0,
            1 => u32::MAX,
            2 => self.rng.below(64) as u32,
            _ => self.rng.next() as u32,
        }
    }

    fn flags(&mut self, valid: u32) -> u32 {
        match self.rng.below(8) {
            0..=3 => 0,
            4 | 5 => valid & self.rng.next() as u32,
            6 => 1 << self.rng.below(32),
            _ => self.rng.next() as u32,
        }
    }

    /// A count for an array of at most `max` entries: 0, small, the
    /// limit, one past it, or anything.
    fn count(&mut self, max: u32) -> u32 {
        match self.rng.below(10) {
            0 => 0,
            1..=5 => 1 + self.rng.below(4) as u32,
            6 => max,
            7 => max + 1,
            8 => self.rng.below(u64::from(max) + 2) as u32,
            _ => self.rng.next() as u32,
        }
    }

    /// A count for DRM core's syncobj arrays, below [`CORE_COUNT_MAX`].
    fn core_count(&mut self) -> u32 {
        self.count(64) % CORE_COUNT_MAX
    }

    fn pad(&mut self) -> u32 {
        if self.rng.chance(1, 12) {
            self.rng.next() as u32
        } else {
            0
        }
    }

    /// A GPU VA: mostly page-aligned in the user range, else a boundary
    /// or garbage.
    fn va(&mut self) -> u64 {
        match self.rng.below(12) {
            0..=5 => VA_START + PAGE as u64 * self.rng.below((FUZZ_VA_END - VA_START) / PAGE as u64),
            6 => IB_VA,
            7 => DATA_VA,
            8 => self.va_end - PAGE as u64 * (1 + self.rng.below(4)),
            9 => self.rng.pick(&[0, PAGE as u64, VA_START - PAGE as u64, self.va_end, u64::MAX - 4095]),
            10 => self.rng.next() & !0xFFF,
            _ => self.rng.next(),
        }
    }

    /// A byte size: page multiples up to 1 MiB mostly, else 0, unaligned,
    /// 16 MiB or beyond the machine's RAM (never between 16 MiB and 2 GiB:
    /// a buffer that big, once mapped, pins much of the guest's RAM).
    fn size(&mut self) -> u64 {
        match self.rng.below(10) {
            0..=5 => PAGE as u64 * (1 + self.rng.below(256)),
            6 => 0,
            7 => 1 + self.rng.below(1 << 16),
            8 => self.rng.pick(&[2 << 30, 1 << 40, u64::MAX, u64::MAX - 4095, 1 << 63]),
            _ => self.rng.pick(&[16 << 20, PAGE as u64]),
        }
    }

    /// A sync array of `n` entries (at most 70 written).
    fn syncs(&mut self, n: u32) -> Vec<u8> {
        let mut b = B::default();
        for _ in 0..n.min(70) {
            let pool = self.pool.syncobjs.clone();
            let h = self.handle(&pool);
            let flags = if self.rng.chance(1, 16) { self.rng.next() as u32 } else { 0 };
            let point = match self.rng.below(4) {
                0 => 0,
                1 | 2 => 1 + self.rng.below(8),
                _ => self.rng.next(),
            };
            b = b.u32(h).u32(flags).u64(point);
        }
        b.0
    }

    /// A timeline point array of `n` entries (at most 70 written).
    fn points(&mut self, n: u32) -> Vec<u8> {
        let mut b = B::default();
        for _ in 0..n.min(70) {
            let p = if self.rng.chance(3, 4) { self.rng.below(8) } else { self.rng.next() };
            b = b.u64(p);
        }
        b.0
    }

    /// A handle array of `n` entries (at most 70 written).
    fn handles(&mut self, n: u32, pool: &[u32]) -> Vec<u8> {
        let mut b = B::default();
        for _ in 0..n.min(70) {
            let h = self.handle(pool);
            b = b.u32(h);
        }
        b.0
    }

    /// An absolute wait timeout that never blocks for long: 0, the past,
    /// or a few milliseconds ahead.
    fn timeout(&mut self) -> u64 {
        match self.rng.below(4) {
            0 => 0,
            1 => self.rng.pick(&[1, i64::MIN as u64, u64::MAX]),
            _ => (drm::now_ns() + self.rng.below(3_000_000) as i64) as u64,
        }
    }

    /// An fd: one of ours, a bad number, or stdin.
    fn fd_arg(&mut self) -> u32 {
        if !self.pool.fds.is_empty() && self.rng.chance(1, 2) {
            let i = self.rng.below(self.pool.fds.len() as u64) as usize;
            return self.pool.fds[i] as u32;
        }
        let any = self.rng.next() as u32;
        self.rng.pick(&[u32::MAX, 0, 1000, self.fd as u32, any])
    }

    /// The next call, its struct first and the arrays it points at after.
    fn build(&mut self) -> Call {
        let c = |name, req, allowed| Call { name, req, allowed, args: Vec::new() };
        let arg = |bytes: Vec<u8>| Arg { bytes, place: Place::Good, off: None };
        let bos = self.pool.bos.clone();
        let syncobjs = self.pool.syncobjs.clone();
        let ctxs = self.pool.ctxs.clone();
        let mut call;
        match self.rng.below(20) {
            0 => {
                call = c("GET_PARAM", u::DRM_IOCTL_REFGPU_GET_PARAM, errs::GET_PARAM);
                let p =
                    if self.rng.chance(3, 4) { self.rng.below(14) as u32 } else { self.rng.next() as u32 };
                let pad = self.pad();
                call.args.push(arg(B::default().u32(p).u32(pad).u64(self.rng.next()).0));
            }
            1 | 2 => {
                call = c("BO_CREATE", u::DRM_IOCTL_REFGPU_BO_CREATE, errs::BO_CREATE);
                let (size, flags) = (self.size(), self.flags(u::BO_FLAGS_MASK));
                call.args.push(arg(B::default().u64(size).u32(flags).u32(0).0));
            }
            3 => {
                call = c("BO_MMAP_OFFSET", u::DRM_IOCTL_REFGPU_BO_MMAP_OFFSET, errs::MMAP_OFFSET);
                let (h, pad) = (self.handle(&bos), self.pad());
                call.args.push(arg(B::default().u32(h).u32(pad).u64(0).0));
            }
            4 | 5 if !bos.is_empty() => {
                call = c("VM_BIND", u::DRM_IOCTL_REFGPU_VM_BIND, errs::VM_BIND);
                let n = 1 + self.rng.below(3) as u32;
                let mut ops = B::default();
                for _ in 0..n {
                    let span = (FUZZ_VA_END - VA_START) / PAGE as u64;
                    let va = VA_START + PAGE as u64 * self.rng.below(span);
                    if self.rng.chance(2, 3) {
                        let h = self.rng.pick(&bos);
                        let pages = self.pool.sizes.get(&h).copied().unwrap_or(PAGE as u64) / PAGE as u64;
                        let size = 1 + self.rng.below(pages.max(1));
                        let off = self.rng.below(pages.max(size) - size + 1);
                        let fl = self.rng.below(2) as u32;
                        ops = ops.u32(u::VM_BIND_OP_MAP).u32(fl).u32(h).u32(0).u64(off * PAGE as u64).u64(va);
                        ops = ops.u64(size * PAGE as u64);
                    } else {
                        let size = PAGE as u64 * (1 + self.rng.below(1024));
                        ops = ops.u32(u::VM_BIND_OP_UNMAP).u32(0).u32(0).u32(0).u64(0).u64(va).u64(size);
                    }
                }
                let no = self.rng.below(2) as u32;
                let outs = match self.pool.syncobjs.first() {
                    Some(&h) if no == 1 => B::default().u32(h).u32(0).u64(0).0,
                    _ => Vec::new(),
                };
                let no = outs.len() as u32 / 16;
                call.args.push(arg(B::default().u32(0).u32(n).u32(0).u32(no).u64(0).u64(0).u64(0).0));
                call.args.extend([arg(ops.0), arg(Vec::new()), arg(outs)]);
            }
            6 => {
                call = c("VM_BIND", u::DRM_IOCTL_REFGPU_VM_BIND, errs::VM_BIND);
                let n = self.count(MAX_BIND_OPS);
                let (ni, no) = (self.count(64), self.count(64));
                let flags = self.flags(0);
                let mut ops = B::default();
                for _ in 0..n.min(5000) {
                    let map = self.rng.chance(1, 2);
                    let op = if self.rng.chance(15, 16) { u32::from(!map) } else { self.rng.next() as u32 };
                    let fl = if map { self.flags(u::VM_BIND_OP_FLAGS_MASK) } else { self.flags(0) };
                    let h = if map { self.handle(&bos) } else { self.handle(&[0]) };
                    let off = if map && self.rng.chance(1, 2) { 0 } else { self.size() };
                    let (va, size) = (self.va(), self.size());
                    let pad = self.pad();
                    ops = ops.u32(op).u32(fl).u32(h).u32(pad).u64(off).u64(va).u64(size);
                }
                let ins = self.syncs(ni);
                let outs = self.syncs(no);
                call.args.push(arg(B::default().u32(flags).u32(n).u32(ni).u32(no).u64(0).u64(0).u64(0).0));
                call.args.extend([arg(ops.0), arg(ins), arg(outs)]);
            }
            7 => {
                call = c("CTX_CREATE", u::DRM_IOCTL_REFGPU_CTX_CREATE, errs::CTX_CREATE);
                let e = if self.rng.chance(7, 8) { self.rng.below(4) as u32 } else { self.rng.next() as u32 };
                let (f, pad) = (self.flags(0), self.pad());
                call.args.push(arg(B::default().u32(e).u32(f).u32(0).u32(pad).0));
            }
            8 => {
                call = c("CTX_DESTROY", u::DRM_IOCTL_REFGPU_CTX_DESTROY, errs::CTX_DESTROY);
                let (id, pad) = (self.handle(&ctxs), self.pad());
                call.args.push(arg(B::default().u32(id).u32(pad).0));
            }
            9 | 10 if !ctxs.is_empty() => {
                call = c("SUBMIT", u::DRM_IOCTL_REFGPU_SUBMIT, errs::SUBMIT);
                let ctx = self.rng.pick(&ctxs);
                let flags = self.rng.below(2) as u32;
                let (va, dw) = self.pool.ib;
                let outs = match self.pool.syncobjs.first() {
                    Some(&h) if self.rng.chance(1, 2) => {
                        B::default().u32(h).u32(0).u64(self.rng.below(2) * (1 + self.rng.below(1 << 20))).0
                    }
                    _ => Vec::new(),
                };
                let no = outs.len() as u32 / 16;
                call.args.push(arg(B::default()
                    .u32(ctx)
                    .u32(flags)
                    .u64(va)
                    .u32(dw)
                    .u32(0)
                    .u32(no)
                    .u32(u32::MAX)
                    .u64(0)
                    .u64(0)
                    .u64(0)
                    .0));
                call.args.extend([arg(Vec::new()), arg(outs)]);
            }
            9..=11 => {
                call = c("SUBMIT", u::DRM_IOCTL_REFGPU_SUBMIT, errs::SUBMIT);
                let ctx = self.handle(&ctxs);
                let flags = self.flags(u::SUBMIT_FLAGS_MASK);
                let (va, dw) = match self.rng.below(6) {
                    0..=2 => self.pool.ib,
                    3 => (self.va() & !31, 1 + self.rng.below(256) as u32),
                    4 => (self.va(), self.rng.pick(&[0, self.ib_max, self.ib_max + 1, u32::MAX])),
                    _ => (self.rng.next(), self.rng.next() as u32),
                };
                let (ni, no) = (self.count(64), self.count(64));
                let ins = self.syncs(ni);
                let outs = self.syncs(no);
                call.args.push(arg(B::default()
                    .u32(ctx)
                    .u32(flags)
                    .u64(va)
                    .u32(dw)
                    .u32(ni)
                    .u32(no)
                    .u32(u32::MAX)
                    .u64(0)
                    .u64(0)
                    .u64(0)
                    .0));
                call.args.extend([arg(ins), arg(outs)]);
            }
            12 => {
                call = c("CTX_QUERY", u::DRM_IOCTL_REFGPU_CTX_QUERY, errs::CTX_QUERY);
                let (id, pad) = (self.handle(&ctxs), self.pad());
                call.args.push(arg(B::default()
                    .u32(id)
                    .u32(0)
                    .u32(0)
                    .u32(pad)
                    .u64(0)
                    .u64(0)
                    .u64(0)
                    .u64(0)
                    .0));
            }
            13 => {
                call = c("GEM_CLOSE", core_nr(1, 0x09, 8), errs::GEM_CLOSE);
                let (h, pad) = (self.handle(&bos), self.pad());
                call.args.push(arg(B::default().u32(h).u32(pad).0));
            }
            14 => {
                if self.rng.chance(1, 2) {
                    call = c("PRIME_HANDLE_TO_FD", core_nr(3, 0x2d, 12), errs::PRIME_EXPORT);
                    let h = self.handle(&bos);
                    let f = if self.rng.chance(3, 4) {
                        self.rng.pick(&[0, 0o2, 0o2000000, 0o2000002])
                    } else {
                        self.flags(0)
                    };
                    call.args.push(arg(B::default().u32(h).u32(f).u32(u32::MAX).0));
                } else {
                    call = c("PRIME_FD_TO_HANDLE", core_nr(3, 0x2e, 12), errs::PRIME_IMPORT);
                    let fd = self.fd_arg();
                    let f = self.flags(0);
                    call.args.push(arg(B::default().u32(0).u32(f).u32(fd).0));
                }
            }
            15 => {
                if self.rng.chance(1, 2) {
                    call = c("SYNCOBJ_CREATE", core_nr(3, 0xBF, 8), errs::SYNCOBJ);
                    let f = self.flags(1);
                    call.args.push(arg(B::default().u32(0).u32(f).0));
                } else {
                    call = c("SYNCOBJ_DESTROY", core_nr(3, 0xC0, 8), errs::SYNCOBJ);
                    let (h, pad) = (self.handle(&syncobjs), self.pad());
                    call.args.push(arg(B::default().u32(h).u32(pad).0));
                }
            }
            16 => {
                // SYNCOBJ_HANDLE_TO_FD / FD_TO_HANDLE (flag 1: a sync_file).
                let export = self.rng.chance(1, 2);
                call = if export {
                    c("SYNCOBJ_HANDLE_TO_FD", core_nr(3, 0xC1, 16), errs::SYNCOBJ_FD)
                } else {
                    c("SYNCOBJ_FD_TO_HANDLE", core_nr(3, 0xC2, 16), errs::SYNCOBJ_FD)
                };
                let h = self.handle(&syncobjs);
                let f = self.flags(1);
                let fd = if export { u32::MAX } else { self.fd_arg() };
                let pad = self.pad();
                call.args.push(arg(B::default().u32(h).u32(f).u32(fd).u32(pad).0));
            }
            17 => {
                // SYNCOBJ_WAIT or TIMELINE_WAIT: bounded timeouts.
                let timeline = self.rng.chance(1, 2);
                let n = self.core_count();
                let flags = self.flags(0xF);
                let timeout = self.timeout();
                let hs = self.handles(n, &syncobjs);
                let pad = self.pad();
                if timeline {
                    call = c("SYNCOBJ_TIMELINE_WAIT", core_nr(3, 0xCA, 48), errs::SYNCOBJ_WAIT);
                    let pts = self.points(n);
                    call.args.push(arg(B::default()
                        .u64(0)
                        .u64(0)
                        .u64(timeout)
                        .u32(n)
                        .u32(flags)
                        .u32(0)
                        .u32(pad)
                        .u64(0)
                        .0));
                    call.args.extend([arg(hs), arg(pts)]);
                } else {
                    call = c("SYNCOBJ_WAIT", core_nr(3, 0xC3, 40), errs::SYNCOBJ_WAIT);
                    call.args.push(arg(B::default()
                        .u64(0)
                        .u64(timeout)
                        .u32(n)
                        .u32(flags)
                        .u32(0)
                        .u32(pad)
                        .u64(0)
                        .0));
                    call.args.push(arg(hs));
                }
            }
            19 => {
                // The job array, then a sync array the jobs' syncs point
                // into (its third slot) or wild and PROT_NONE pointers.
                call = c("SUBMIT_BATCH", u::DRM_IOCTL_REFGPU_SUBMIT_BATCH, errs::SUBMIT_BATCH);
                let job = std::mem::size_of::<u::BatchJob>() as u32;
                let ctx = self.handle(&ctxs);
                let (flags, pad) = (self.flags(0), self.pad());
                let n = self.count(64);
                let stride = match self.rng.below(8) {
                    0..=4 => job,
                    5 => job + 8 * (1 + self.rng.below(4) as u32),
                    _ => self.rng.pick(&[0, job - 8, 4096, 4097, u32::MAX]),
                };
                let nsync = self.count(64);
                let syncs = self.syncs(nsync);
                let sync_at = self.arena.addr(SLOT[2]);
                let none = self.arena.addr(RW_END);
                let mut jobs = Vec::new();
                let fit = (48 * PAGE) / (stride.clamp(1, 8192) as usize);
                for _ in 0..(n as usize).min(70).min(fit) {
                    let (va, dw) =
                        if self.rng.chance(3, 4) { self.pool.ib } else { (self.va(), self.count(1 << 20)) };
                    let jf = if self.rng.chance(1, 10) { self.flags(0) } else { 0 };
                    let mut b = B::default().u32(jf).u32(dw).u64(va);
                    for _ in 0..2 {
                        let (st, cnt, at) = match self.rng.below(6) {
                            0..=2 => (16, 0, 0),
                            3 => (16, nsync.min(70), sync_at),
                            4 => (self.rng.pick(&[0, 8, 24, 4097]), 1 + self.rng.below(3) as u32, sync_at),
                            _ => (16, self.count(64), self.rng.pick(&[0, none, 0xffff_8000_0000_0000])),
                        };
                        b = b.u32(st).u32(cnt).u64(at);
                    }
                    let mut bytes = b.0;
                    let tail = if self.rng.chance(1, 8) { 1 } else { 0 };
                    // Laid out at the stride (a wild one at most a page and
                    // a bit: the kernel refuses it before reading).
                    bytes.resize(bytes.len().max(stride.min(4104) as usize), tail);
                    jobs.extend_from_slice(&bytes);
                }
                call.args.push(arg(B::default()
                    .u32(ctx)
                    .u32(flags)
                    .u32(stride)
                    .u32(n)
                    .u64(0)
                    .u64(0)
                    .u32(u32::MAX)
                    .u32(pad)
                    .0));
                call.args.extend([arg(jobs), arg(syncs)]);
            }
            _ => {
                // RESET, SIGNAL, TIMELINE_SIGNAL, QUERY, TRANSFER.
                let n = self.core_count();
                let hs = self.handles(n, &syncobjs);
                let pts = self.points(n);
                let flags = self.flags(1);
                let pad = self.pad();
                match self.rng.below(5) {
                    0 | 1 => {
                        let (name, nr) = if self.rng.chance(1, 2) {
                            ("SYNCOBJ_RESET", 0xC4)
                        } else {
                            ("SYNCOBJ_SIGNAL", 0xC5)
                        };
                        call = c(name, core_nr(3, nr, 16), errs::SYNCOBJ);
                        call.args.push(arg(B::default().u64(0).u32(n).u32(pad).0));
                        call.args.push(arg(hs));
                    }
                    2 | 3 => {
                        let (name, nr) = if self.rng.chance(1, 2) {
                            ("SYNCOBJ_TIMELINE_SIGNAL", 0xCD)
                        } else {
                            ("SYNCOBJ_QUERY", 0xCB)
                        };
                        call = c(name, core_nr(3, nr, 24), errs::SYNCOBJ);
                        call.args.push(arg(B::default().u64(0).u64(0).u32(n).u32(flags).0));
                        call.args.extend([arg(hs), arg(pts)]);
                    }
                    _ => {
                        // No WAIT_FOR_SUBMIT (bit 1): it waits seconds for a point.
                        call = c("SYNCOBJ_TRANSFER", core_nr(3, 0xCC, 32), errs::SYNCOBJ);
                        let (s, d) = (self.handle(&syncobjs), self.handle(&syncobjs));
                        let (sp, dp) = (self.rng.below(8), self.rng.below(8));
                        let f = self.flags(0) & !2;
                        call.args.push(arg(B::default().u32(s).u32(d).u64(sp).u64(dp).u32(f).u32(pad).0));
                    }
                }
            }
        }
        call
    }

    /// Places every argument and patches the pointers into the struct
    /// (pointer fields follow the struct's layout: see `ptr_fields`).
    /// Returns the struct's address and whether it is readable back.
    fn lay(&mut self, call: &mut Call) -> Result<u64, String> {
        let special = self.rng.below(call.args.len() as u64) as usize;
        let mut addrs = Vec::new();
        for (i, a) in call.args.iter_mut().enumerate() {
            let place = if i == special {
                match self.rng.below(20) {
                    0..=13 => Place::Good,
                    14 => Place::Unaligned,
                    15 | 16 => Place::Crossing,
                    17 => Place::NoAccess,
                    18 => Place::ReadOnly,
                    _ => Place::Wild,
                }
            } else if self.rng.chance(1, 16) {
                self.rng.pick(&[Place::Unaligned, Place::Wild])
            } else {
                Place::Good
            };
            a.place = place;
            let len = a.bytes.len().max(1);
            let off = match place {
                Place::Good => Some(SLOT[i.min(2)]),
                Place::Unaligned => Some(SLOT[i.min(2)] + 1 + self.rng.below(7) as usize),
                Place::Crossing => Some(RW_END - len.saturating_sub(1 + self.rng.below(len as u64) as usize)),
                Place::NoAccess => Some(RW_END + self.rng.below(PAGE as u64) as usize),
                Place::ReadOnly => Some(RO_START + PAGE.saturating_sub(len.min(PAGE))),
                Place::Wild => None,
            };
            a.off = off;
            let addr = match off {
                Some(o) => self.arena.addr(o),
                None => {
                    self.rng.pick(&[0, 0xffff_8000_0000_0000, 0x8000_0000_0000_0000, 0xffff_ffff_ffff_f000])
                }
            };
            addrs.push(addr);
        }
        // Patch the array pointers into the struct, then write everything.
        let fields = ptr_fields(call.name);
        for (&at, &addr) in fields.iter().zip(addrs.iter().skip(1)) {
            call.args[0].bytes[at..at + 8].copy_from_slice(&addr.to_le_bytes());
        }
        // Arrays first, the struct last (a crossing array and the struct
        // never share a slot: only one argument is special).
        for a in call.args.iter().rev() {
            if let Some(o) = a.off {
                if matches!(a.place, Place::Good | Place::Unaligned | Place::Crossing | Place::ReadOnly) {
                    self.arena.write(o, &a.bytes)?;
                }
            }
        }
        Ok(addrs[0])
    }

    /// Learns handles and fds from a successful call whose struct is
    /// readable.
    fn learn(&mut self, call: &Call) {
        let a = &call.args[0];
        let Some(off) = a.off.filter(|_| matches!(a.place, Place::Good | Place::Unaligned)) else { return };
        match call.name {
            "BO_CREATE" => {
                let h = self.arena.r32(off + 12);
                let mut size = [0u8; 8];
                size.copy_from_slice(&a.bytes[..8]);
                self.pool.sizes.insert(h, u64::from_le_bytes(size));
                self.pool.bos.push(h);
            }
            "CTX_CREATE" => self.pool.ctxs.push(self.arena.r32(off + 8)),
            "SYNCOBJ_CREATE" | "SYNCOBJ_FD_TO_HANDLE" => self.pool.syncobjs.push(self.arena.r32(off)),
            "PRIME_FD_TO_HANDLE" => self.pool.bos.push(self.arena.r32(off)),
            "PRIME_HANDLE_TO_FD" => self.pool.keep_fd(self.arena.r32(off + 8) as i32),
            "SYNCOBJ_HANDLE_TO_FD" => self.pool.keep_fd(self.arena.r32(off + 8) as i32),
            "SUBMIT" => self.pool.keep_fd(self.arena.r32(off + 28) as i32),
            _ => {}
        }
        // BOs are closed by `unmap_all` (a BO once mapped stays pinned
        // until it is freed); syncobjs and contexts cost little.
        for p in [&mut self.pool.syncobjs, &mut self.pool.ctxs] {
            if p.len() > 48 {
                p.remove(0);
            }
        }
    }
}

impl Fuzz {
    /// Unmaps `[VA_START, FUZZ_VA_END)`, maps the fixture's IB and data
    /// buffers again (if the fuzzer has not closed them) and closes the
    /// BOs beyond the pool's newest 24: what the mappings pinned goes.
    fn unmap_all(&mut self, fx: &Fx) -> R {
        fx.dev
            .unmap(VA_START, FUZZ_VA_END - VA_START)
            .map_err(|e| format!("UNMAP of the fuzzed range: errno {e}"))?;
        for b in [&fx.ib, &fx.data] {
            let _ = fx.dev.map(b.handle, 0, b.va, b.size, 0);
        }
        while self.pool.bos.len() > 24 {
            let h = self.pool.bos.remove(0);
            self.pool.sizes.remove(&h);
            let _ = fx.dev.gem_close(h);
        }
        Ok(())
    }
}

/// Byte offsets, in the struct, of the pointers to its arrays, in the
/// order of the call's arguments after the struct.
fn ptr_fields(name: &str) -> &'static [usize] {
    match name {
        "VM_BIND" => &[16, 24, 32],
        "SUBMIT" => &[32, 40],
        "SUBMIT_BATCH" => &[16],
        "SYNCOBJ_TIMELINE_WAIT" => &[0, 8],
        "SYNCOBJ_WAIT" | "SYNCOBJ_RESET" | "SYNCOBJ_SIGNAL" => &[0],
        "SYNCOBJ_TIMELINE_SIGNAL" | "SYNCOBJ_QUERY" => &[0, 8],
        _ => &[],
    }
}

/// The test: the fuzzer runs [`ITERATIONS`] calls in a child process; the
/// parent waits for its report (the child writes its progress to a shared
/// page, so a call that never returns is named), then for the driver to
/// let go of what the child's files held.
pub fn ioctl_fuzz() -> R {
    let seed = seed();
    let base = crate::fixture::live()?;
    println!("guest: ioctl_fuzz: seed {seed} (rgtest.seed={seed} repeats this run), {ITERATIONS} calls");
    // SAFETY: a fresh shared anonymous page: [iteration, done flag].
    let shared = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    ensure!(shared != libc::MAP_FAILED, "mmap: errno {}", drm::errno());
    let progress = shared.cast::<std::sync::atomic::AtomicU64>();
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) into a two-element array.
    ensure!(unsafe { libc::pipe(fds.as_mut_ptr()) } == 0, "pipe: errno {}", drm::errno());
    // SAFETY: fork(2); the child runs the fuzzer and _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: the page is mapped shared in both processes and holds
        // only atomics.
        let progress = unsafe { &*progress };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(seed, progress)))
            .unwrap_or_else(|_| Err("panicked".into()));
        let msg = r.err().unwrap_or_else(|| "ok".into()).replace('\n', " | ");
        // SAFETY: the report on the pipe, then _exit (no destructor of the
        // parent's state runs in the child).
        unsafe {
            libc::write(fds[1], msg.as_ptr().cast(), msg.len());
            libc::_exit(0)
        }
    }
    // SAFETY: our copy of the write end.
    unsafe { libc::close(fds[1]) };
    let t0 = Instant::now();
    let mut st = 0;
    let mut report = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        // SAFETY: reaping our own child without blocking.
        if unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) } == pid {
            break;
        }
        if t0.elapsed() > Duration::from_secs(300) {
            // SAFETY: the child's progress word.
            let at = unsafe { &*progress }.load(std::sync::atomic::Ordering::SeqCst);
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut st, 0);
            }
            return Err(format!(
                "the fuzzer did not finish within 300 s: call {at} never returned (seed {seed})"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    loop {
        // SAFETY: reading our end of the pipe into a local buffer.
        let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        report.extend_from_slice(&buf[..n as usize]);
    }
    // SAFETY: our read end and the shared page.
    unsafe {
        libc::close(fds[0]);
        libc::munmap(shared, PAGE);
    }
    let report = String::from_utf8_lossy(&report).into_owned();
    println!("guest: ioctl_fuzz: {ITERATIONS} calls in {} ms", t0.elapsed().as_millis());
    // The child's jobs end by themselves: a faulting one at once, a hung
    // one within two job_timeout_ms windows, a moving one (a CHAIN loop of
    // a random IB) at job_max_ms (10 s); the runner's 5 s are too short
    // for the last.
    let t1 = Instant::now();
    let mut shown = Instant::now();
    while crate::fixture::live()? != base {
        if shown.elapsed() > Duration::from_secs(2) {
            shown = Instant::now();
            let d = crate::fixture::debugfs_dir()?;
            let e = std::fs::read_to_string(d.join("engines")).unwrap_or_default();
            println!(
                "guest: ioctl_fuzz: still draining after {} ms: live {:?}, engines: {}",
                t1.elapsed().as_millis(),
                crate::fixture::live()?,
                e.replace('\n', " / ")
            );
        }
        if t1.elapsed() > Duration::from_secs(60) {
            let d = crate::fixture::debugfs_dir()?;
            let e = std::fs::read_to_string(d.join("engines")).unwrap_or_default();
            let c = std::fs::read_to_string(d.join("counts")).unwrap_or_default();
            return Err(format!(
                "60 s after the fuzzer exited the driver still holds its objects: {} | {}",
                c.replace('\n', " "),
                e.replace('\n', " / ")
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("guest: ioctl_fuzz: drained in {} ms", t1.elapsed().as_millis());
    // Judged once drained, so that a failure leaves nothing to the next test.
    ensure!(report == "ok", "seed {seed}: {report}");
    println!("guest: ioctl_fuzz: engine resets logged since boot: {:?}", reset_tally()?);
    // What the child's jobs still hold goes once they have ended.
    crate::fixture::clear_devcoredumps()
}

/// The child's fuzzer.
fn run(seed: u64, progress: &std::sync::atomic::AtomicU64) -> R {
    let mut fx = Fx::new()?;
    let (ib, dw) = fx.ib(&[Command::WriteData { dst: DATA_VA + 0x40, data: Payload::Words(&[0xF022]) }])?;
    let va_end = fx.dev.param(u::param::VA_END).map_err(|e| format!("VA_END: errno {e}"))?;
    let ib_max = fx.dev.param(u::param::IB_MAX_DWORDS).map_err(|e| format!("IB_MAX: errno {e}"))? as u32;
    let mut f = Fuzz {
        rng: Rng::new(seed),
        arena: Arena::new()?,
        pool: Pool {
            bos: vec![fx.ib.handle, fx.data.handle],
            sizes: [(fx.ib.handle, fx.ib.size), (fx.data.handle, fx.data.size)].into(),
            syncobjs: vec![fx.sync],
            ib: (ib, dw),
            ..Pool::default()
        },
        fd: fx.dev.fd(),
        va_end,
        ib_max,
    };
    let mut bad = Vec::new();
    let mut tally = std::collections::BTreeMap::<(&str, i32), u32>::new();
    for i in 0..ITERATIONS {
        progress.store(u64::from(i), std::sync::atomic::Ordering::SeqCst);
        if i % 256 == 255 {
            f.unmap_all(&fx)?;
        }
        let mut call = f.build();
        let mut req = call.req;
        if f.rng.chance(1, 16) {
            // A size field DRM core did not expect: it copies what fits.
            let size = f.rng.below(96) as u32;
            req = (req & !(0x3FFF << 16)) | (size << 16);
        }
        let addr = f.lay(&mut call)?;
        // SAFETY: `addr` is in the fuzzer's arena or an address no user
        // mapping has (NULL, kernel, non-canonical); the kernel checks it
        // with its user-copy routines and writes back at most the size in
        // `req` (at most 96 bytes; the arena's struct slot has 8 pages).
        let r = unsafe { libc::ioctl(f.fd, req as _, addr as *mut libc::c_void) };
        let e = if r == 0 { 0 } else { drm::errno() };
        *tally.entry((call.name, e)).or_default() += 1;
        if e == 0 {
            if req == call.req {
                f.learn(&call);
            }
        } else if !call.allowed.contains(&e) && bad.len() < 8 {
            let places: Vec<_> = call.args.iter().map(|a| a.place).collect();
            let struct_hex: String = call.args[0].bytes.iter().map(|b| format!("{b:02x}")).collect();
            bad.push(format!(
                "call {i} {} (req {req:#x}, places {places:?}, struct {struct_hex}): errno {e}, not in {:?}",
                call.name, call.allowed
            ));
        }
    }
    let summary: Vec<String> = tally.iter().map(|((n, e), c)| format!("{n}:{e}x{c}")).collect();
    println!("guest: ioctl_fuzz: results (call:errno x count) {}", summary.join(" "));
    ensure!(bad.is_empty(), "{} calls returned undocumented errnos: {}", bad.len(), bad.join("; "));
    for fd in f.pool.fds.drain(..) {
        // SAFETY: fds our calls returned, closed once.
        unsafe { libc::close(fd) };
    }
    Ok(())
}

/// The engine resets the kernel logged since boot, by reason (a fresh
/// reader of /dev/kmsg: the suite's own reader is left alone).
fn reset_tally() -> Result<std::collections::BTreeMap<String, u32>, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 8192];
    let mut tally = std::collections::BTreeMap::<String, u32>::new();
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let rec = String::from_utf8_lossy(&buf[..n]).into_owned();
                for w in [
                    "faulted, resetting",
                    "hung, resetting",
                    "ran past job_max_ms, resetting",
                    "fault outside",
                ] {
                    if rec.contains(w) {
                        *tally.entry(w.into()).or_default() += 1;
                    }
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    Ok(tally)
}
