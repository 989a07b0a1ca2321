//! The device clock: nanoseconds since the model started, from the host's
//! monotonic clock. TIMESTAMP and CLOCK_LO/HI read it.

use std::time::Instant;

/// Monotonic nanosecond clock.
pub struct Clock {
    start: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// A clock reading 0 now.
    pub fn new() -> Self {
        Self { start: Instant::now() }
    }

    /// Nanoseconds since the model started.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}
