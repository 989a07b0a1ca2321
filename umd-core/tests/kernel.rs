//! Kernel-mediated mode against a fake kernel driver: the core picks VAs
//! and binds buffers, records IBs, passes wait/signal timeline points to the
//! kernel, rejects cycles, and turns a kernel reset into failed fences.

mod support;

use std::sync::{Mutex, MutexGuard};

use support::FakeState;
use umd_core::cmd::Command;
use umd_core::config::Config;
use umd_core::decode::Decoder;
use umd_core::hw::{ChipId, Generation};
use umd_core::kernel::KernelDevice;
use umd_core::platform::{DmaFlags, DmaRegion, KernelError, KernelIo, KernelSync, Platform, PlatformError};
use umd_core::queue::{FenceStatus, SubmitError, WaitError};
use umd_core::storage::DeviceStorage;
use umd_core::sync::{Cause, FenceError, QueueId};

struct Job {
    engine: u32,
    ib_va: u64,
    ib_dw: u32,
    waits: Vec<KernelSync>,
    signal: KernelSync,
}

/// A kernel driver: owns "rings" (job lists) and VA bindings; runs jobs
/// when told, in order per engine, once their waits have signalled.
struct KState {
    mem: FakeState,
    gen: Generation,
    bindings: Vec<(u64, u64, usize, bool)>,
    jobs: Vec<Job>,
    completed: [u64; 3],
    reset: [Option<u64>; 3],
}

/// The fake kernel behind a mutex (the core calls platforms through `&self`).
struct FakeKernel(Mutex<KState>);

impl FakeKernel {
    fn new(gen: Generation) -> FakeKernel {
        FakeKernel(Mutex::new(KState::new(gen)))
    }

    fn k(&self) -> MutexGuard<'_, KState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl KState {
    fn new(gen: Generation) -> KState {
        KState {
            mem: FakeState::new(gen, 4 << 20),
            gen,
            bindings: Vec::new(),
            jobs: Vec::new(),
            completed: [0; 3],
            reset: [None; 3],
        }
    }

    fn translate(&self, va: u64) -> Option<u64> {
        self.bindings
            .iter()
            .find(|(v, _, len, _)| va >= *v && va < v + *len as u64)
            .map(|(v, d, _, _)| d + (va - v))
    }

    /// Runs every runnable job (in order per engine).
    fn run(&mut self) {
        for _ in 0..8 {
            let mut i = 0;
            while i < self.jobs.len() {
                let runnable = {
                    let j = &self.jobs[i];
                    let first_of_engine = !self.jobs[..i].iter().any(|o| o.engine == j.engine);
                    first_of_engine && j.waits.iter().all(|w| self.completed[w.engine as usize] >= w.value)
                };
                if !runnable {
                    i += 1;
                    continue;
                }
                let j = self.jobs.remove(i);
                let base = self.translate(j.ib_va).expect("IB is bound");
                let bytes: Vec<u8> = (0..j.ib_dw as u64)
                    .flat_map(|k| self.mem.read_u32(base + 4 * k).unwrap().to_le_bytes())
                    .collect();
                for item in Decoder::new(self.gen, &bytes, j.ib_va) {
                    match item.result.expect("IB decodes").command {
                        Command::WriteData { dst, data } => {
                            let d = self.translate(dst).unwrap();
                            for (k, w) in data.iter().enumerate() {
                                self.mem.write_u32(d + 4 * k as u64, w);
                            }
                        }
                        Command::Fill { dst, size, value } => {
                            let d = self.translate(dst).unwrap();
                            for k in 0..size / 4 {
                                self.mem.write_u32(d + 4 * k, value);
                            }
                        }
                        _ => {}
                    }
                }
                self.completed[j.signal.engine as usize] = j.signal.value;
            }
        }
    }
}

// SAFETY: memory comes from the fake, whose contract holds; time grows.
unsafe impl Platform for FakeKernel {
    type RawMutex = umd_core::platform::SpinLock;

    fn dma_alloc(&self, len: usize, _flags: DmaFlags) -> Result<DmaRegion, PlatformError> {
        self.k().mem.dma_alloc(len)
    }
    fn dma_free(&self, r: DmaRegion) {
        self.k().mem.dma_free(r)
    }
    fn now_ns(&self) -> u64 {
        self.k().mem.now_ns()
    }
    fn delay_ns(&self, ns: u64) {
        self.k().mem.delay_ns(ns)
    }
}

impl KernelIo for FakeKernel {
    fn chip_id(&self) -> Result<u32, PlatformError> {
        Ok(ChipId { generation: self.k().gen, revision: 0 }.id_register())
    }
    fn bind_va(&self, va: u64, region: &DmaRegion, len: usize, writable: bool) -> Result<(), PlatformError> {
        self.k().bindings.push((va, region.dev_addr(), len, writable));
        Ok(())
    }
    fn unbind_va(&self, va: u64, _len: usize) -> Result<(), PlatformError> {
        self.k().bindings.retain(|b| b.0 != va);
        Ok(())
    }
    fn submit(
        &self,
        engine: u32,
        ib_va: u64,
        ib_dw: u32,
        waits: &[KernelSync],
        signal: KernelSync,
    ) -> Result<(), PlatformError> {
        self.k().jobs.push(Job { engine, ib_va, ib_dw, waits: waits.to_vec(), signal });
        Ok(())
    }
    fn completed(&self, engine: u32) -> Result<u64, KernelError> {
        let mut k = self.k();
        if let Some(upto) = k.reset[engine as usize].take() {
            k.completed[engine as usize] = upto;
            return Err(KernelError::Reset { upto });
        }
        Ok(k.completed[engine as usize])
    }
}

fn cfg() -> Config {
    Config { ib_chunk_bytes: 4096, use_irq: false, ..Config::DEFAULT }
}

type Storage = DeviceStorage<256, 256, 64, 256>;

fn with_kernel(gen: Generation, f: impl FnOnce(&KernelDevice<'_, FakeKernel, 4>, &FakeKernel)) {
    let k = FakeKernel::new(gen);
    let mut storage: Box<Storage> = Box::default();
    let dev = KernelDevice::<FakeKernel, 4>::new(&k, &mut storage, cfg(), 1 << 32, 1 << 32).unwrap();
    f(&dev, &k);
}

#[test]
fn submit_wait_and_data_through_the_kernel() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        let k = FakeKernel::new(gen);
        let mut storage: Box<Storage> = Box::default();
        let dev = KernelDevice::<FakeKernel, 4>::new(&k, &mut storage, cfg(), 1 << 32, 1 << 32).unwrap();
        assert_eq!(dev.chip().generation, gen);
        let buf = dev.alloc_buffer(8192).unwrap();
        let b = dev.va(buf).unwrap();
        assert!(b >= 1 << 32, "the core chose the VA");
        let f = dev
            .submit(QueueId(2), &[], |cb| {
                cb.fill(b, 4096, 0x5555_5555)?;
                cb.write_data(b + 4096, &[1, 2, 3])
            })
            .unwrap();
        assert_eq!(dev.query(f), Ok(FenceStatus::Pending));
        k.k().run();
        dev.wait(f, 1_000_000_000).unwrap();
        assert_eq!(dev.read_u32(buf, 100), Ok(0x5555_5555));
        assert_eq!(dev.read_u32(buf, 1026), Ok(3));
        dev.free(buf).unwrap();
        assert_eq!(dev.shutdown().leaked_buffers, 0);
        assert_eq!(k.k().mem.allocs, 0);
        assert!(k.k().bindings.is_empty(), "every bind was undone");
    }
}

#[test]
fn waits_become_kernel_sync_points_and_cycles_are_rejected() {
    with_kernel(Generation::Gen2, |dev, k| {
        let copy = dev.submit(QueueId(2), &[], |cb| cb.timestamp(0x1_0000_0000)).unwrap();
        let compute = dev.submit(QueueId(1), &[copy], |cb| cb.timestamp(0x1_0000_0008)).unwrap();
        {
            let st = k.k();
            assert_eq!(st.jobs.len(), 2);
            assert_eq!(st.jobs[1].waits, vec![KernelSync { engine: 2, value: 1 }]);
            assert_eq!(st.jobs[1].signal, KernelSync { engine: 1, value: 1 });
        }
        // Wait-before-signal on COPY:2, then COPY waiting for that: a cycle.
        let future = dev.next_fence(QueueId(2)).unwrap();
        let gfx = dev.submit(QueueId(0), &[future], |cb| cb.timestamp(0x1_0000_0010)).unwrap();
        let err = dev.submit(QueueId(2), &[gfx], |cb| cb.timestamp(0x1_0000_0018)).unwrap_err();
        assert!(matches!(err, SubmitError::Cycle(_)), "{err:?}");
        assert_eq!(k.k().jobs.len(), 3, "the rejected work never reached the kernel");
        dev.submit(QueueId(2), &[], |cb| cb.timestamp(0x1_0000_0018)).unwrap();
        k.k().run();
        dev.wait(gfx, 1_000_000_000).unwrap();
        dev.wait(compute, 1_000_000_000).unwrap();
    });
}

#[test]
fn a_kernel_reset_fails_the_cancelled_fences_and_their_dependents() {
    with_kernel(Generation::Gen1, |dev, k| {
        let f1 = dev.submit(QueueId(0), &[], |cb| cb.timestamp(0x1_0000_0000)).unwrap();
        let f2 = dev.submit(QueueId(0), &[], |cb| cb.timestamp(0x1_0000_0008)).unwrap();
        let consumer = dev.submit(QueueId(1), &[f2], |cb| cb.timestamp(0x1_0000_0010)).unwrap();
        k.k().jobs.retain(|j| j.engine != 0);
        k.k().reset[0] = Some(2);
        assert_eq!(dev.wait(f1, 1_000_000_000), Err(WaitError::Failed(FenceError::DeviceHung)));
        assert_eq!(dev.query(f2), Ok(FenceStatus::Failed(FenceError::DeviceHung)));
        k.k().run();
        assert_eq!(
            dev.wait(consumer, 1_000_000_000),
            Err(WaitError::Failed(FenceError::Dependency { producer: f2.id, cause: Cause::Hung }))
        );
        assert_eq!(
            dev.submit(QueueId(1), &[f2], |cb| cb.timestamp(0x1_0000_0000)),
            Err(SubmitError::DependencyFailed { fence: f2, error: FenceError::DeviceHung })
        );
        // The queue goes on.
        let f3 = dev.submit(QueueId(0), &[], |cb| cb.timestamp(0x1_0000_0010)).unwrap();
        k.k().run();
        dev.wait(f3, 1_000_000_000).unwrap();
        assert_eq!(dev.stats().resets, 1);
    });
}

#[test]
fn a_full_dependency_table_waits_then_refuses_in_kernel_mode_too() {
    let k = FakeKernel::new(Generation::Gen2);
    let mut storage: Box<Storage> = Box::default();
    let c = Config { dep_wait_ns: 2_000_000, ..cfg() };
    let dev = KernelDevice::<FakeKernel, 16>::new(&k, &mut storage, c, 1 << 32, 1 << 32).unwrap();
    let copy = dev.submit(QueueId(2), &[], |cb| cb.timestamp(0x1_0000_0000)).unwrap();
    for _ in 0..umd_core::engine::PENDING_WAITS {
        dev.submit(QueueId(0), &[copy], |cb| cb.timestamp(0x1_0000_0008)).unwrap();
    }
    let jobs = k.k().jobs.len();
    assert_eq!(
        dev.submit(QueueId(0), &[copy], |cb| cb.timestamp(0x1_0000_0008)),
        Err(SubmitError::TooManyPending(QueueId(0)))
    );
    assert_eq!(k.k().jobs.len(), jobs, "nothing reached the kernel");
    k.k().run();
    dev.submit(QueueId(0), &[copy], |cb| cb.timestamp(0x1_0000_0008)).unwrap();
}

#[test]
fn bad_inputs() {
    with_kernel(Generation::Gen2, |dev, k| {
        assert_eq!(
            dev.submit(QueueId(5), &[], |cb| cb.timestamp(0)),
            Err(SubmitError::UnknownQueue(QueueId(5)))
        );
        assert_eq!(dev.submit(QueueId(0), &[], |_| Ok(())), Err(SubmitError::Empty));
        let future = dev.last_emitted(QueueId(0)).unwrap().later(9);
        assert_eq!(dev.wait(future, 1), Err(WaitError::NotSubmitted(future)));
        let f = dev.submit(QueueId(0), &[], |cb| cb.timestamp(0x1_0000_0000)).unwrap();
        assert_eq!(dev.wait(f, 0), Err(WaitError::Timeout));
        assert!(k.k().jobs.len() == 1);
    });
}
