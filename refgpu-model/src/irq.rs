//! Interrupts (`docs/refgpu.md` sections 2.1 and 2.3).
//!
//! IRQ_STATUS lives in the register page. The model sets bits with an
//! atomic OR; the host clears them (RW1C in-process, atomic AND over
//! ivshmem). Vector `e` is raised when, for engine `e`, a bit of
//! `IRQ_STATUS & IRQ_MASK` goes from 0 to 1: either the model sets a
//! status bit that was 0 and is unmasked (the old value comes from the
//! atomic OR itself, so a host clear is never missed), or the host unmasks
//! a bit that is pending (compared against the mask last applied).
//!
//! A vector an engine raises while no delay is injected and nothing is
//! queued goes to the [`IrqSink`] at once, from the engine's thread (one
//! thread hop less between the fence write and the host's wake-up). Every
//! other vector (a delay is injected, or earlier ones are still queued, or
//! it comes from an IRQ_MASK change) is delivered by one thread per model,
//! in order, each after the injected `irq_delay`. The sink is a callback
//! (in-process platform, tests) or the co-sim server forwarding vector `e`
//! to the host peer's eventfd; it must not call back into the model.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::regs::{self, RegPage, NUM_ENGINES};

/// Receives interrupt vectors.
pub trait IrqSink: Send + Sync {
    /// Vector `vector` (the engine number) was raised.
    fn raise(&self, vector: u32);
}

impl<F: Fn(u32) + Send + Sync> IrqSink for F {
    fn raise(&self, vector: u32) {
        self(vector)
    }
}

/// An [`IrqSink`] that sends vectors into a channel.
pub struct ChannelSink(Mutex<Sender<u32>>);

impl ChannelSink {
    /// A sink and the receiver that gets its vectors.
    pub fn new() -> (Arc<Self>, Receiver<u32>) {
        let (tx, rx) = mpsc::channel();
        (Arc::new(Self(Mutex::new(tx))), rx)
    }
}

impl IrqSink for ChannelSink {
    fn raise(&self, vector: u32) {
        // A closed receiver just means nobody listens any more.
        let _ = self.0.lock().unwrap_or_else(|p| p.into_inner()).send(vector);
    }
}

/// The model's interrupt logic.
pub(crate) struct Irq {
    regs: Arc<RegPage>,
    applied_mask: AtomicU32,
    delay_ns: AtomicU64,
    counts: [AtomicU64; NUM_ENGINES],
    tx: Mutex<Option<Sender<(Instant, u32)>>>,
    /// Vectors queued for the delivery thread and not yet raised.
    queued: Arc<AtomicUsize>,
    /// The sink, for vectors raised at once.
    sink: Option<Arc<dyn IrqSink>>,
}

/// The delivery thread's side of [`Irq`].
pub(crate) struct Delivery {
    rx: Receiver<(Instant, u32)>,
    queued: Arc<AtomicUsize>,
    sink: Option<Arc<dyn IrqSink>>,
}

impl Irq {
    /// The interrupt logic and the delivery thread's side.
    pub fn new(regs: Arc<RegPage>, sink: Option<Arc<dyn IrqSink>>) -> (Self, Delivery) {
        let (tx, rx) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let irq = Self {
            regs,
            applied_mask: AtomicU32::new(0),
            delay_ns: AtomicU64::new(0),
            counts: Default::default(),
            tx: Mutex::new(Some(tx)),
            queued: Arc::clone(&queued),
            sink: sink.clone(),
        };
        (irq, Delivery { rx, queued, sink })
    }

    /// Sets IRQ_STATUS bits (from an engine's thread); raises the vectors
    /// whose unmasked bits went from 0 to 1, at once when nothing is
    /// queued and no delay is injected.
    pub fn set_status(&self, bits: u32) {
        let old = self.regs.fetch_or(regs::IRQ_STATUS, bits);
        let rising = bits & !old & self.applied_mask.load(Ordering::SeqCst);
        if rising == 0 {
            return;
        }
        if self.delay_ns.load(Ordering::Relaxed) == 0 && self.queued.load(Ordering::SeqCst) == 0 {
            for e in 0..NUM_ENGINES {
                if rising & regs::irq_engine_bits(e) != 0 {
                    self.counts[e].fetch_add(1, Ordering::SeqCst);
                    if let Some(s) = &self.sink {
                        s.raise(e as u32);
                    }
                }
            }
            return;
        }
        self.deliver_edges(rising);
    }

    /// Clears IRQ_STATUS bits (RW1C write, or an engine reset).
    pub fn clear_status(&self, bits: u32) {
        self.regs.fetch_and(regs::IRQ_STATUS, !bits);
    }

    /// Applies a new IRQ_MASK.
    pub fn apply_mask(&self, mask: u32) {
        let old = self.applied_mask.swap(mask, Ordering::SeqCst);
        let status = self.regs.load(regs::IRQ_STATUS);
        self.deliver_edges(status & mask & !old);
    }

    /// Sets the injected delivery delay.
    pub fn set_delay(&self, d: Duration) {
        self.delay_ns.store(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Number of times vector `v` was raised.
    pub fn count(&self, v: usize) -> u64 {
        self.counts.get(v).map_or(0, |c| c.load(Ordering::SeqCst))
    }

    fn deliver_edges(&self, rising: u32) {
        for e in 0..NUM_ENGINES {
            if rising & regs::irq_engine_bits(e) != 0 {
                self.counts[e].fetch_add(1, Ordering::SeqCst);
                let at = Instant::now() + Duration::from_nanos(self.delay_ns.load(Ordering::Relaxed));
                if let Some(tx) = self.tx.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    self.queued.fetch_add(1, Ordering::SeqCst);
                    if tx.send((at, e as u32)).is_err() {
                        self.queued.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            }
        }
    }

    /// Stops delivery: the delivery thread ends once the queue is drained.
    pub fn close(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// Body of the delivery thread.
pub(crate) fn delivery_loop(d: Delivery) {
    while let Ok((at, v)) = d.rx.recv() {
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        if let Some(s) = &d.sink {
            s.raise(v);
        }
        d.queued.fetch_sub(1, Ordering::SeqCst);
    }
}
