//! The shared-RAM binding (`docs/refgpu.md` 2.3, "shared RAM"): the model
//! attached to a RAM file that a host without PCI maps as its RAM (QEMU
//! `mps2-an386`'s PSRAM), no socket and no ivshmem peer.
//!
//! The file is the whole region: system memory first, the register page
//! and the doorbell page in its last 8 KiB
//! ([`refgpu_model::shared_ram`]). The file must exist and be exactly
//! 16 MiB (QEMU refuses any other size for that board's RAM, so a file
//! of another size is a mistake of the harness, reported at once).
//!
//! One thread (the caller of [`SharedRamServer::run`]) watches the
//! doorbell words adaptively ([`refgpu_model::shared_ram::watch_interval`]:
//! a busy loop for 50 µs after a doorbell, then sleeps growing to 1 ms
//! while idle) and turns every change of word `v` into
//! `model.doorbell(v)`. The sleeps are `poll`s on the signalfd, so
//! SIGINT/SIGTERM end the loop at once: the server then clears ATTACH
//! (hosts see the model gone) and shuts the model down. There is no
//! interrupt path: the model sets IRQ_STATUS but raises nothing.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use refgpu_model::regs;
use refgpu_model::shared_ram as layout;
use refgpu_model::shm::Mapping;
use refgpu_model::{Model, ModelConfig};
use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::args::Options;
use crate::server::ServerError;
use crate::sys;

fn log(msg: std::fmt::Arguments<'_>) {
    eprintln!("refgpu-sim: {msg}");
}

/// The model attached to a shared RAM file. Field order is drop order:
/// the model stops before the mapping it uses goes away.
pub struct SharedRamServer {
    model: Model,
    ram: Mapping,
    sigfd: OwnedFd,
    path: PathBuf,
    doorbells: u64,
    seen: [u32; layout::DOORBELLS],
}

impl SharedRamServer {
    /// Opens and checks the RAM file, initialises the register page,
    /// starts the model and sets ATTACH. Blocks SIGINT/SIGTERM in the
    /// calling thread first (see [`crate::Server::new`]).
    pub fn new(opts: Options) -> Result<Self, ServerError> {
        crate::args::validate(&opts).map_err(|e| ServerError::Config(e.to_string()))?;
        let Some(path) = opts.shared_ram.clone() else {
            return Err(ServerError::Config("no --shared-ram file given".into()));
        };
        let sigfd = sys::termination_signalfd().map_err(|e| ServerError::Io("blocking SIGINT/SIGTERM", e))?;
        let file = OpenOptions::new().read(true).write(true).open(&path).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                ServerError::Config(format!(
                    "--shared-ram {}: no such file (create it with exactly 16 MiB, the size of the \
                     RAM QEMU maps from it: truncate -s 16M FILE)",
                    path.display()
                ))
            } else {
                ServerError::Io("opening --shared-ram", e)
            }
        })?;
        let len = file.metadata().map_err(|e| ServerError::Io("stat --shared-ram", e))?.len();
        if len != layout::REGION_SIZE {
            return Err(ServerError::Config(format!(
                "--shared-ram {} is {len:#x} bytes; it must be exactly 16 MiB ({:#x}), the size of \
                 mps2-an386's PSRAM that QEMU maps from it",
                path.display(),
                layout::REGION_SIZE
            )));
        }
        let ram = Mapping::new(&file, layout::REGION_SIZE as usize, 0)
            .map_err(|e| ServerError::Io("mapping --shared-ram", e))?;
        let word = |off: u64| ram.u32_at(off as usize);
        let attach_off = layout::doorbell_page_offset(layout::REGION_SIZE) + layout::ATTACH_OFF as u64;
        let clock_off = layout::regs_offset(layout::REGION_SIZE) + u64::from(regs::CLOCK_LO);
        if word(attach_off).is_some_and(|w| w.load(Ordering::Acquire) == layout::ATTACH_MAGIC) {
            // Set by a live model, or left by one that was killed: a live
            // one publishes CLOCK every `clock_publish`.
            let before = word(clock_off).map(|w| w.load(Ordering::Acquire));
            std::thread::sleep(Duration::from_millis(20));
            if word(clock_off).map(|w| w.load(Ordering::Acquire)) != before {
                return Err(ServerError::Config(format!(
                    "--shared-ram {}: another model is attached (ATTACH set and CLOCK moving)",
                    path.display()
                )));
            }
        }
        let cfg = ModelConfig {
            generation: opts.generation,
            revision: 0,
            mem_base: opts.mem_base,
            mem_size: layout::mem_size(layout::REGION_SIZE),
            wait_poll_interval: opts.wait_poll,
            clock_publish_interval: opts.clock_publish,
            fault_injection: opts.fault.clone(),
            local_size: opts.local_mem,
            sys_ns_per_kib: opts.ns_per_kib[0],
            local_ns_per_kib: opts.ns_per_kib[1],
        };
        // The register page lies inside the mapping, 8 KiB from its end.
        let regs_ptr = std::ptr::NonNull::new(
            ram.ptr().as_ptr().wrapping_add(layout::regs_offset(layout::REGION_SIZE) as usize),
        )
        .ok_or_else(|| ServerError::Config("register page at address 0".into()))?;
        // SAFETY: the mapping is page aligned and REGION_SIZE bytes long;
        // the register page is the 4 KiB at REGION_SIZE - 8 KiB (page
        // aligned) and system memory the first REGION_SIZE - 8 KiB bytes,
        // so both lie in it and do not overlap. `ram` is a field declared
        // after `model`, so it outlives the model. This process touches the
        // mapping only with atomics; the host may write concurrently.
        let model =
            unsafe { Model::new_shared(cfg, regs_ptr, ram.ptr(), None) }.map_err(ServerError::Model)?;
        let mut s = SharedRamServer { model, ram, sigfd, path, doorbells: 0, seen: [0; layout::DOORBELLS] };
        // Doorbells rung before the attach are not events (spec 2.3).
        s.seen = s.bells();
        s.store(layout::VERSION_OFF, layout::VERSION);
        s.store(layout::MEM_SIZE_OFF, layout::mem_size(layout::REGION_SIZE) as u32);
        s.store(layout::MEM_BASE_OFF, opts.mem_base as u32);
        s.store(layout::MEM_BASE_OFF + 4, (opts.mem_base >> 32) as u32);
        s.store(layout::ATTACH_OFF, layout::ATTACH_MAGIC);
        log(format_args!(
            "attached to {} (shared RAM, gen {}, system memory {:#x}+{:#x}, register page at {:#x}, \
             doorbells at {:#x}; polling only)",
            s.path.display(),
            opts.generation.number(),
            opts.mem_base,
            layout::mem_size(layout::REGION_SIZE),
            opts.mem_base + layout::regs_offset(layout::REGION_SIZE),
            opts.mem_base + layout::doorbell_page_offset(layout::REGION_SIZE) + layout::DOORBELL_OFF as u64,
        ));
        Ok(s)
    }

    /// A word of the doorbell page.
    fn bell_word(&self, off: usize) -> Option<&AtomicU32> {
        self.ram.u32_at(layout::doorbell_page_offset(layout::REGION_SIZE) as usize + off)
    }

    fn store(&self, off: usize, v: u32) {
        if let Some(w) = self.bell_word(off) {
            w.store(v, Ordering::Release);
        }
    }

    fn bells(&self) -> [u32; layout::DOORBELLS] {
        core::array::from_fn(|v| {
            self.bell_word(layout::DOORBELL_OFF + 4 * v).map_or(0, |w| w.load(Ordering::Acquire))
        })
    }

    /// The model (diagnostics).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Doorbells seen so far (changes of a doorbell word).
    pub fn doorbells_seen(&self) -> u64 {
        self.doorbells
    }

    /// Watches the doorbells until SIGINT or SIGTERM.
    pub fn run(&mut self) -> Result<(), ServerError> {
        let mut seen = self.seen;
        let mut last = Instant::now();
        let mut last_signal_check = last;
        loop {
            let now = self.bells();
            let mut rang = false;
            for (v, (n, s)) in now.iter().zip(seen.iter_mut()).enumerate() {
                if n != s {
                    *s = *n;
                    rang = true;
                    self.doorbells += 1;
                    self.model.doorbell(v as u32);
                }
            }
            if rang {
                last = Instant::now();
            }
            match layout::watch_interval(last.elapsed()) {
                None => {
                    // Busy re-reading; look at signals once a millisecond.
                    if last_signal_check.elapsed() >= Duration::from_millis(1) {
                        last_signal_check = Instant::now();
                        if self.wait_signal(Duration::ZERO)? {
                            return Ok(());
                        }
                    }
                    std::hint::spin_loop();
                }
                Some(d) => {
                    if self.wait_signal(d)? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Sleeps up to `d` on the signalfd; true when a termination signal
    /// arrived (logged).
    fn wait_signal(&self, d: Duration) -> Result<bool, ServerError> {
        let ts = Timespec { tv_sec: d.as_secs() as _, tv_nsec: d.subsec_nanos() as _ };
        let mut fds = [PollFd::new(&self.sigfd, PollFlags::IN)];
        match poll(&mut fds, Some(&ts)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => Ok(false),
            Ok(_) => {
                let signo = sys::read_signal(&self.sigfd).unwrap_or(0);
                log(format_args!(
                    "signal {signo}: detaching from {} ({} doorbells seen) and shutting down",
                    self.path.display(),
                    self.doorbells
                ));
                Ok(true)
            }
            Err(e) => Err(ServerError::Io("poll", e.into())),
        }
    }
}

impl Drop for SharedRamServer {
    fn drop(&mut self) {
        // Hosts see the model gone at once (before the clock stops).
        self.store(layout::ATTACH_OFF, 0);
        self.model.shutdown();
    }
}
