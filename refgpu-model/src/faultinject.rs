//! Fault-injection knobs, changeable while the model runs.
//!
//! [`FaultInjection`] is plain data; [`crate::Model::set_fault_injection`]
//! swaps it in. Engines notice the change at their next packet (they compare
//! a version number) and restart their FENCE counters and random streams, so
//! a test that sets a config and then submits work gets deterministic
//! results for a given seed.
//!
//! | knob | effect |
//! | --- | --- |
//! | `packet_latency` | the engines in `latency_engines` wait this long before each packet (ring and IB) |
//! | `drop_fence_nth` | the engines in `drop_fence_engines` drop their n-th FENCE (1-based, counted per engine since the config was set): no memory write, no interrupt |
//! | `drop_fence_probability` | each FENCE of those engines is dropped with this probability, from a per-engine SplitMix64 stream seeded by `seed` |
//! | `stalled_engines` | these engines stop fetching (a packet already executing finishes); clearing the bit resumes them. RESET still works. |
//! | `irq_delay` | interrupt vectors are delivered this long after IRQ_STATUS is set |

use std::time::Duration;

/// Bit mask of all three engines.
pub const ALL_ENGINES: u8 = 0b111;

/// The fault-injection configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultInjection {
    /// Delay before each packet.
    pub packet_latency: Duration,
    /// Engines (bit mask) that get `packet_latency`.
    pub latency_engines: u8,
    /// Drop the n-th FENCE of each engine in `drop_fence_engines`.
    pub drop_fence_nth: Option<u64>,
    /// Probability (0.0 ..= 1.0) to drop each FENCE.
    pub drop_fence_probability: f64,
    /// Engines (bit mask) whose fences may be dropped.
    pub drop_fence_engines: u8,
    /// Seed of the random streams.
    pub seed: u64,
    /// Engines (bit mask) that stop fetching.
    pub stalled_engines: u8,
    /// Delay of interrupt delivery.
    pub irq_delay: Duration,
}

impl Default for FaultInjection {
    fn default() -> Self {
        Self {
            packet_latency: Duration::ZERO,
            latency_engines: ALL_ENGINES,
            drop_fence_nth: None,
            drop_fence_probability: 0.0,
            drop_fence_engines: ALL_ENGINES,
            seed: 0,
            stalled_engines: 0,
            irq_delay: Duration::ZERO,
        }
    }
}

/// SplitMix64: a tiny, seedable, good-enough generator for injection.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator with the given seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform value in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Per-engine view of the injection config.
#[derive(Debug)]
pub(crate) struct EngineInjection {
    pub version: u64,
    pub latency: Duration,
    drop_nth: Option<u64>,
    drop_probability: f64,
    fences: u64,
    rng: SplitMix64,
}

impl EngineInjection {
    pub fn new(engine: usize, version: u64, cfg: &FaultInjection) -> Self {
        let bit = 1u8 << engine;
        let drops = cfg.drop_fence_engines & bit != 0;
        Self {
            version,
            latency: if cfg.latency_engines & bit != 0 { cfg.packet_latency } else { Duration::ZERO },
            drop_nth: if drops { cfg.drop_fence_nth } else { None },
            drop_probability: if drops { cfg.drop_fence_probability } else { 0.0 },
            fences: 0,
            rng: SplitMix64::new(cfg.seed ^ (engine as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F)),
        }
    }

    /// Called for every FENCE that would write: whether to drop it.
    pub fn drop_this_fence(&mut self) -> bool {
        self.fences += 1;
        let nth = self.drop_nth == Some(self.fences);
        let random = self.drop_probability > 0.0 && self.rng.next_f64() < self.drop_probability;
        nth || random
    }
}
