//! A platform over a shared-memory transport, written the way
//! `docs/porting.md` ("Shared-memory transports") describes: a Linux
//! process maps the 16 MiB RAM file of `refgpu-sim --shared-ram FILE` and
//! acts as the CPU of the shared-RAM binding (`docs/refgpu.md` 2.3). The
//! register page goes through `umd_core::ivshmem::Binding`, doorbells are
//! atomic adds to the doorbell words, the model's liveness is
//! `umd_core::ivshmem::Liveness`, and every DMA address is the published
//! MEM_BASE plus the offset in the region. `main` then runs the
//! conformance suite on it ("Run the conformance suite on your board").
//!
//! ```sh
//! truncate -s 16M /tmp/ram.img
//! cargo run -p refgpu-sim -- --shared-ram /tmp/ram.img --gen 2 &
//! cargo run -p refgpu-sim --example shared_ram_port -- /tmp/ram.img
//! ```
//!
//! `refgpu-sim/tests/porting_example.rs` builds and runs this file against
//! a freshly started model, so the guide's example cannot rot.

use std::fs::OpenOptions;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use umd_core::hw::regs;
use umd_core::ivshmem::shared_ram::{self, ATTACH_MAGIC, DOORBELL_OFF};
use umd_core::ivshmem::{device_clock, Binding, Health, Liveness, SharedPage, Written, LOSS_WINDOW_NS};
use umd_core::mem::pages::{PageAlloc, PAGE};
use umd_core::mem::va::VaNode;
use umd_core::platform::{DirectIo, DmaFlags, DmaRegion, Platform, PlatformError, SpinLock};

// The binding's layout (docs/refgpu.md 2.3, "shared RAM"): the region is
// QEMU mps2-an386's 16 MiB PSRAM, as `refgpu-sim --shared-ram` maps it.
const REGION: usize = 16 << 20;
const REGS: usize = shared_ram::regs_offset(REGION); // register page
const BELLS: usize = shared_ram::doorbell_page_offset(REGION); // doorbell page
/// Nodes of the page allocator: one per DMA block live or hole between
/// blocks (`docs/memory.md`, "Physical pages"), 40 KiB.
const NODES: usize = 1024;

/// Why attaching failed.
#[derive(Debug)]
pub enum AttachError {
    /// Opening or mapping the file failed.
    Io(std::io::Error),
    /// ATTACH never read "RGSR": no model runs on the file.
    NoModel,
    /// Another layout version, or a region that is not the binding's.
    Layout(&'static str, u32),
}

/// The refgpu over the shared RAM file.
pub struct SharedRamBoard {
    /// The whole region, mapped shared; unmapped in `Drop`.
    region: NonNull<AtomicU32>,
    /// Device address of the region's first byte (the published MEM_BASE).
    mem_base: u64,
    /// System memory pages, handed out as DMA regions (from the
    /// published MEM_SIZE on: `None` until then).
    pages: Mutex<Option<PageAlloc<[VaNode; NODES]>>>,
    binding: Binding,
    live: Liveness,
    t0: Instant,
}

// SAFETY: `region` is a shared mapping owned by this value (unmapped only
// in `Drop`), not tied to any thread.
unsafe impl Send for SharedRamBoard {}
// SAFETY: through `&self` the region is only touched with 32-bit atomics
// (the register and doorbell pages, through `word`) or, for DMA pages, by
// whoever owns the `DmaRegion` the page allocator handed out once; it is
// behind a mutex and `Binding` and `Liveness` are thread-safe.
unsafe impl Sync for SharedRamBoard {}

impl SharedRamBoard {
    /// Maps `path` (the model's RAM file), waits up to `wait` for a model
    /// to attach and reads MEM_BASE and MEM_SIZE from the doorbell page.
    pub fn attach(path: &Path, wait: Duration) -> Result<SharedRamBoard, AttachError> {
        let f = OpenOptions::new().read(true).write(true).open(path).map_err(AttachError::Io)?;
        if f.metadata().map_err(AttachError::Io)?.len() != REGION as u64 {
            return Err(AttachError::Layout("file size", 0));
        }
        // SAFETY: a new shared mapping of the whole file; nothing else in
        // this process refers to the address range it returns.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                REGION,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &f,
                0,
            )
        }
        .map_err(|e| AttachError::Io(e.into()))?;
        let region = NonNull::new(p.cast::<AtomicU32>()).ok_or(AttachError::Layout("mapping", 0))?;
        let mut b = SharedRamBoard {
            region,
            mem_base: 0,
            pages: Mutex::new(None),
            binding: Binding::new(),
            live: Liveness::new(0, 0),
            t0: Instant::now(),
        };
        let published = loop {
            match shared_ram::published(&Bells(&b)) {
                Some(p) if p.attached => break p,
                _ if b.t0.elapsed() > wait => return Err(AttachError::NoModel),
                _ => std::thread::sleep(Duration::from_millis(1)),
            }
        };
        if published.version != shared_ram::VERSION {
            return Err(AttachError::Layout("version", published.version));
        }
        let mem_size = published.mem_size as usize;
        if mem_size != REGS {
            return Err(AttachError::Layout("MEM_SIZE", published.mem_size));
        }
        // Device addresses come from the model, never from a constant here.
        b.mem_base = published.mem_base;
        b.pages = Mutex::new(Some(
            PageAlloc::new([VaNode::ZEROED; NODES], mem_size / PAGE)
                .map_err(|_| AttachError::Layout("pages", published.mem_size))?,
        ));
        b.live = Liveness::new(device_clock(&Regs(&b)).unwrap_or(0), b.now_ns());
        Ok(b)
    }

    /// The 32-bit word at byte `off` of the region (the binding pages only
    /// are touched this way).
    fn word(&self, off: usize) -> &AtomicU32 {
        assert!(off < REGION && off % 4 == 0);
        // SAFETY: inside the mapping and aligned (checked above); the
        // mapping lives as long as `self`.
        unsafe { &*self.region.as_ptr().add(off / 4) }
    }

    /// Rings vector `v` (0..2 engines, 3 control): one atomic add of 1.
    fn ring(&self, v: u32) -> Result<(), PlatformError> {
        if self.live.is_lost() {
            return Err(PlatformError::DeviceLost);
        }
        self.word(BELLS + (DOORBELL_OFF + 4 * v) as usize).fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// The liveness check of the spec: ATTACH set, CLOCK moving.
    fn check_alive(&self) {
        let attached = self.word(BELLS).load(Ordering::Acquire) == ATTACH_MAGIC;
        let clock = device_clock(&Regs(self)).unwrap_or(0);
        match self.live.check(attached, clock, self.now_ns(), LOSS_WINDOW_NS) {
            Health::Detached => eprintln!("model detached: device lost"),
            Health::Frozen { for_ns, .. } => {
                eprintln!("CLOCK frozen for {} ms: device lost", for_ns / 1_000_000)
            }
            Health::Alive | Health::Lost => {}
        }
    }
}

impl Drop for SharedRamBoard {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `attach`; the device built over this
        // board borrowed it and has been dropped, so no reference remains.
        let _ = unsafe { rustix::mm::munmap(self.region.as_ptr().cast(), REGION) };
    }
}

/// The register page as the binding sees it, borrowed from the board (so
/// no reference outlives the mapping).
struct Regs<'a>(&'a SharedRamBoard);

impl SharedPage for Regs<'_> {
    fn word(&self, off: u32) -> Option<&AtomicU32> {
        (off < 4096 && off % 4 == 0).then(|| self.0.word(REGS + off as usize))
    }
}

/// The doorbell page, for `shared_ram::published`.
struct Bells<'a>(&'a SharedRamBoard);

impl SharedPage for Bells<'_> {
    fn word(&self, off: u32) -> Option<&AtomicU32> {
        (off < 4096 && off % 4 == 0).then(|| self.0.word(BELLS + off as usize))
    }
}

// SAFETY: every region is a run of system-memory pages the allocator hands
// out once, zeroed, at CPU address region + offset and device address
// MEM_BASE + offset (the device-address rule of docs/refgpu.md 2.3); the
// model is the device side of the memory, not another CPU user. `now_ns`
// is `Instant`, which is monotonic.
unsafe impl Platform for SharedRamBoard {
    type RawMutex = SpinLock;

    fn dma_alloc(&self, len: usize, _flags: DmaFlags) -> Result<DmaRegion, PlatformError> {
        let len = len.max(1).next_multiple_of(PAGE);
        let oom = PlatformError::OutOfMemory { len };
        let mut pages = self.pages.lock().map_err(|_| oom)?;
        let first = pages.as_mut().ok_or(oom)?.alloc(len / PAGE).map_err(|_| oom)?;
        drop(pages);
        let off = first * PAGE;
        // SAFETY: `off + len` lies in system memory (the allocator manages
        // MEM_SIZE bytes), which precedes the binding pages in the mapping.
        let cpu = unsafe { self.region.as_ptr().cast::<u8>().add(off) };
        // SAFETY: the pages are ours until `dma_free` (see the impl comment).
        unsafe { cpu.write_bytes(0, len) };
        let cpu = NonNull::new(cpu).ok_or(oom)?;
        // SAFETY: see the impl comment.
        Ok(unsafe { DmaRegion::new(cpu, self.mem_base + off as u64, len) })
    }

    fn dma_free(&self, r: DmaRegion) {
        let first = r.dev_addr().wrapping_sub(self.mem_base) as usize / PAGE;
        if let Ok(mut pages) = self.pages.lock() {
            if let Some(pages) = pages.as_mut() {
                let _ = pages.free(first, r.len() / PAGE); // refuses runs it did not hand out
            }
        }
    }

    fn now_ns(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    fn delay_ns(&self, ns: u64) {
        if ns >= 100_000 {
            std::thread::sleep(Duration::from_nanos(ns));
        } else {
            let until = self.now_ns().saturating_add(ns);
            while self.now_ns() < until {
                std::hint::spin_loop();
            }
        }
        self.check_alive(); // the core's wait loop is where a loss is seen
    }
    // wait_irq: the default (Unsupported): shared RAM has no interrupts.
}

impl DirectIo for SharedRamBoard {
    fn read_reg(&self, off: u32) -> Result<u32, PlatformError> {
        if self.live.is_lost() {
            return Err(PlatformError::DeviceLost);
        }
        self.binding.read(&Regs(self), off)
    }

    fn write_reg(&self, off: u32, v: u32) -> Result<(), PlatformError> {
        if self.live.is_lost() {
            return Err(PlatformError::DeviceLost);
        }
        match self.binding.write(&Regs(self), off, v)? {
            Written::Doorbell(e) => self.ring(e),
            Written::Done => Ok(()),
        }
    }

    fn doorbell(&self, e: u32) -> Result<(), PlatformError> {
        if e >= regs::ENGINES {
            return Err(PlatformError::Unsupported); // vector 3 is the control doorbell
        }
        self.ring(e)
    }

    fn control_doorbell(&self) -> Result<(), PlatformError> {
        self.ring(regs::CONTROL_VECTOR)
    }
}

/// Threads for the scenarios that submit from several at once.
struct Threads;

impl conformance::Parallel for Threads {
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        std::thread::scope(|s| {
            for i in 0..tasks {
                s.spawn(move || task(i));
            }
        });
    }
}

/// Attaches to the model on `path`, checks the memory plan, brings the
/// device up with the suite's configuration and runs every conformance
/// scenario. Returns (passed, failed, skipped); prints each result.
pub fn run_suite(path: &Path) -> Result<(usize, usize, usize), String> {
    use conformance::{run_all, Env, Outcome, SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
    use umd_core::direct::{Device, MemoryPlan};
    use umd_core::storage::DeviceStorage;

    let board =
        SharedRamBoard::attach(path, Duration::from_secs(10)).map_err(|e| format!("attach: {e:?}"))?;
    // The fixed pools first (page tables, fence slots, rings, IB pool):
    // MemoryPlan::check names the one that does not fit.
    let plan = MemoryPlan::new(&SUITE_CONFIG, SUITE_MMU, SUITE_CHUNKS, 3);
    plan.check(REGS).map_err(|e| format!("memory plan: {e}"))?;
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, SharedRamBoard, SUITE_CHUNKS> =
        Device::new(&board, &mut storage, SUITE_CONFIG, SUITE_MMU)
            .map_err(|e| format!("Device::new: {e}"))?;
    let (mut pass, mut fail, mut skip) = (0, 0, 0);
    run_all(&dev, &Env { parallel: Some(&Threads) }, |r| {
        println!("shared RAM: {r}");
        match r.outcome {
            Outcome::Pass => pass += 1,
            Outcome::Fail => fail += 1,
            Outcome::Skip => skip += 1,
        }
    });
    let report = dev.shutdown();
    if report.leaked_buffers != 0 {
        return Err(format!("{} buffers leaked", report.leaked_buffers));
    }
    Ok((pass, fail, skip))
}

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: shared_ram_port RAM_FILE (the file refgpu-sim --shared-ram runs on)");
        std::process::exit(2);
    };
    match run_suite(Path::new(&path)) {
        Ok((pass, 0, skip)) => println!("conformance: {pass} passed, {skip} skipped, 0 failed"),
        Ok((pass, fail, skip)) => {
            println!("conformance: {pass} passed, {skip} skipped, {fail} FAILED");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
