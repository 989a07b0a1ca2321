//! [`umd_core::config::Config`] with environment-variable overrides.
//!
//! | variable | field | values |
//! | --- | --- | --- |
//! | `UMD_IB_CHUNK_BYTES` | `ib_chunk_bytes` | bytes, a multiple of 256 from 1 KiB (`64K` style suffixes K/M allowed) |
//! | `UMD_RING_BYTES` | `ring_bytes` | a power of two from 4 KiB to 4 MiB |
//! | `UMD_BATCHING` | `batching` | `1/0`, `true/false`, `yes/no`, `on/off` |
//! | `UMD_POOL_EXHAUSTION` | `pool_exhaustion` | `wait` or `error` |
//! | `UMD_USE_IRQ` | `use_irq` | boolean as above |
//! | `UMD_WAIT_SPIN_NS` | `wait_steps[0].until_ns` | ns of busy spinning before polling with pauses; less than `wait_steps[1].until_ns` |
//! | `UMD_HANG_WINDOW_MS` | `hang.window_ns` | ms without progress before a queue counts as hung, >= 1 |
//! | `UMD_HANG_MIN_PROGRESS_BYTES` | `hang.min_progress_bytes` | bytes |
//! | `UMD_HANG_MAX_WINDOWS` | `hang.max_windows_without_fence` | windows without a fence, >= 1 |
//!
//! Unset variables keep the base value. [`from_lookup`] takes the lookup as
//! a closure so tests need not touch the process environment.

use std::fmt;

use umd_core::config::{Config, PoolExhaustion};

/// Every variable this module reads.
pub const VARS: &[&str] = &[
    "UMD_IB_CHUNK_BYTES",
    "UMD_RING_BYTES",
    "UMD_BATCHING",
    "UMD_POOL_EXHAUSTION",
    "UMD_USE_IRQ",
    "UMD_WAIT_SPIN_NS",
    "UMD_HANG_WINDOW_MS",
    "UMD_HANG_MIN_PROGRESS_BYTES",
    "UMD_HANG_MAX_WINDOWS",
];

/// What is wrong with a value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigErrorKind {
    /// Not a non-negative integer.
    NotANumber,
    /// Does not fit the field.
    TooLarge,
    /// Not one of the boolean spellings.
    NotABool,
    /// Not one of the allowed words.
    UnknownChoice(&'static [&'static str]),
    /// A number outside the allowed range.
    OutOfRange(&'static str),
}

/// A bad environment variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong.
    pub kind: ConfigErrorKind,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={:?}: ", self.var, self.value)?;
        match &self.kind {
            ConfigErrorKind::NotANumber => write!(f, "not a number"),
            ConfigErrorKind::TooLarge => write!(f, "too large"),
            ConfigErrorKind::NotABool => write!(f, "not a boolean (1/0, true/false, yes/no, on/off)"),
            ConfigErrorKind::UnknownChoice(c) => write!(f, "expected one of {}", c.join(", ")),
            ConfigErrorKind::OutOfRange(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The defaults overridden by the process environment.
pub fn from_env() -> Result<Config, ConfigError> {
    from_lookup(Config::DEFAULT, |k| std::env::var(k).ok())
}

struct Var<'a> {
    var: &'static str,
    value: &'a str,
}

impl Var<'_> {
    fn err(&self, kind: ConfigErrorKind) -> ConfigError {
        ConfigError { var: self.var, value: self.value.to_owned(), kind }
    }

    fn int(&self) -> Result<u64, ConfigError> {
        let t = self.value.trim();
        let (digits, mul) = match t.as_bytes().last() {
            Some(b'k' | b'K') => (&t[..t.len() - 1], 1u64 << 10),
            Some(b'm' | b'M') => (&t[..t.len() - 1], 1 << 20),
            _ => (t, 1),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(self.err(ConfigErrorKind::NotANumber));
        }
        let n: u64 = digits.parse().map_err(|_| self.err(ConfigErrorKind::TooLarge))?;
        n.checked_mul(mul).ok_or_else(|| self.err(ConfigErrorKind::TooLarge))
    }

    fn usize(&self) -> Result<usize, ConfigError> {
        usize::try_from(self.int()?).map_err(|_| self.err(ConfigErrorKind::TooLarge))
    }

    fn bool(&self) -> Result<bool, ConfigError> {
        match self.value.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err(self.err(ConfigErrorKind::NotABool)),
        }
    }
}

/// `base` overridden by the variables `get` returns.
pub fn from_lookup(base: Config, get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    let mut c = base;
    let values: Vec<(&'static str, String)> = VARS.iter().filter_map(|v| get(v).map(|x| (*v, x))).collect();
    for (var, value) in &values {
        let v = Var { var, value };
        match *var {
            "UMD_IB_CHUNK_BYTES" => {
                let n = v.usize()?;
                if n < 1024 || n % 256 != 0 {
                    return Err(v.err(ConfigErrorKind::OutOfRange("a multiple of 256, at least 1 KiB")));
                }
                c.ib_chunk_bytes = n;
            }
            "UMD_RING_BYTES" => {
                let n = v.usize()?;
                if !n.is_power_of_two() || !(4096..=4 << 20).contains(&n) {
                    return Err(v.err(ConfigErrorKind::OutOfRange("a power of two from 4 KiB to 4 MiB")));
                }
                c.ring_bytes = n;
            }
            "UMD_BATCHING" => c.batching = v.bool()?,
            "UMD_POOL_EXHAUSTION" => {
                c.pool_exhaustion = match value.trim() {
                    "wait" => PoolExhaustion::WaitOldest,
                    "error" => PoolExhaustion::Error,
                    _ => return Err(v.err(ConfigErrorKind::UnknownChoice(&["wait", "error"]))),
                }
            }
            "UMD_USE_IRQ" => c.use_irq = v.bool()?,
            "UMD_WAIT_SPIN_NS" => {
                let n = v.int()?;
                if n >= c.wait_steps[1].until_ns {
                    return Err(
                        v.err(ConfigErrorKind::OutOfRange("less than the end of the second wait step"))
                    );
                }
                c.wait_steps[0].until_ns = n;
            }
            "UMD_HANG_WINDOW_MS" => {
                let ms = v.int()?;
                if ms == 0 {
                    return Err(v.err(ConfigErrorKind::OutOfRange("at least 1 ms")));
                }
                c.hang.window_ns =
                    ms.checked_mul(1_000_000).ok_or_else(|| v.err(ConfigErrorKind::TooLarge))?;
            }
            "UMD_HANG_MIN_PROGRESS_BYTES" => c.hang.min_progress_bytes = v.int()?,
            "UMD_HANG_MAX_WINDOWS" => {
                let n = u32::try_from(v.int()?).map_err(|_| v.err(ConfigErrorKind::TooLarge))?;
                if n == 0 {
                    return Err(v.err(ConfigErrorKind::OutOfRange("at least 1")));
                }
                c.hang.max_windows_without_fence = n;
            }
            _ => {}
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        from_lookup(Config::DEFAULT, |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn nothing_set_is_the_default() {
        assert_eq!(with(&[]).unwrap(), Config::DEFAULT);
    }

    #[test]
    fn every_variable_overrides() {
        let c = with(&[
            ("UMD_IB_CHUNK_BYTES", "128K"),
            ("UMD_RING_BYTES", "8192"),
            ("UMD_BATCHING", "off"),
            ("UMD_POOL_EXHAUSTION", "error"),
            ("UMD_USE_IRQ", "0"),
            ("UMD_WAIT_SPIN_NS", "500"),
            ("UMD_HANG_WINDOW_MS", "250"),
            ("UMD_HANG_MIN_PROGRESS_BYTES", "32"),
            ("UMD_HANG_MAX_WINDOWS", "8"),
        ])
        .unwrap();
        assert_eq!(c.ib_chunk_bytes, 128 << 10);
        assert_eq!(c.ring_bytes, 8192);
        assert!(!c.batching);
        assert_eq!(c.pool_exhaustion, PoolExhaustion::Error);
        assert!(!c.use_irq);
        assert_eq!(c.wait_steps[0].until_ns, 500);
        assert_eq!(c.hang.window_ns, 250_000_000);
        assert_eq!(c.hang.min_progress_bytes, 32);
        assert_eq!(c.hang.max_windows_without_fence, 8);
        assert!(with(&[("UMD_POOL_EXHAUSTION", "wait"), ("UMD_BATCHING", "YES")]).unwrap().batching);
    }

    #[test]
    fn typed_errors() {
        let kind = |k: &str, v: &str| with(&[(k, v)]).unwrap_err();
        let e = kind("UMD_IB_CHUNK_BYTES", "lots");
        assert_eq!((e.var, e.kind), ("UMD_IB_CHUNK_BYTES", ConfigErrorKind::NotANumber));
        assert_eq!(
            kind("UMD_IB_CHUNK_BYTES", "1000").kind,
            ConfigErrorKind::OutOfRange("a multiple of 256, at least 1 KiB")
        );
        assert_eq!(
            kind("UMD_RING_BYTES", "12288").kind,
            ConfigErrorKind::OutOfRange("a power of two from 4 KiB to 4 MiB")
        );
        assert_eq!(kind("UMD_RING_BYTES", "99999999999999999999").kind, ConfigErrorKind::TooLarge);
        assert_eq!(kind("UMD_BATCHING", "maybe").kind, ConfigErrorKind::NotABool);
        assert_eq!(
            kind("UMD_POOL_EXHAUSTION", "panic").kind,
            ConfigErrorKind::UnknownChoice(&["wait", "error"])
        );
        assert_eq!(kind("UMD_HANG_WINDOW_MS", "0").kind, ConfigErrorKind::OutOfRange("at least 1 ms"));
        assert_eq!(kind("UMD_HANG_WINDOW_MS", "18446744073709551615").kind, ConfigErrorKind::TooLarge);
        assert_eq!(kind("UMD_HANG_MAX_WINDOWS", "4294967296").kind, ConfigErrorKind::TooLarge);
        assert_eq!(kind("UMD_WAIT_SPIN_NS", "-5").kind, ConfigErrorKind::NotANumber);
        assert!(matches!(kind("UMD_WAIT_SPIN_NS", "100000").kind, ConfigErrorKind::OutOfRange(_)));
        assert_eq!(
            kind("UMD_USE_IRQ", "2").to_string(),
            "UMD_USE_IRQ=\"2\": not a boolean (1/0, true/false, yes/no, on/off)"
        );
    }
}
