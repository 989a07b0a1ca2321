//! [`umd_core::config::Config`] from the process environment: a
//! `key=value` file named by `UMD_CONFIG`, then one `UMD_<KEY>` variable
//! per tunable (the key in capitals: `UMD_RING_BYTES`, `UMD_HANG_WINDOW_NS`,
//! `UMD_WAIT_STEP1_INTERVAL_NS`, ...), a variable overriding the file.
//! Both are turned into the text format of [`umd_core::config`] and read
//! by its one parser ([`Config::with_text`]), so the keys, units, ranges
//! and errors are those of its table, the same as firmware's.
//!
//! Every platform constructor of this crate ([`crate::InProcess`],
//! [`crate::Cosim`], `Drm`) reads the environment once and fails with a
//! [`ConfigError`] naming the variable (or the file's line) on a bad value;
//! its `config()` is the defaults with the environment applied. Other
//! `UMD_*` variables (test seeds) are not tunables and are left alone.
//! [`from_lookup`] takes the lookups as closures so tests need not touch
//! the process environment.

use std::fmt;
use std::path::PathBuf;

use umd_core::config::{Config, Key, ParseErrorKind};

/// The variable naming a configuration file.
pub const CONFIG_VAR: &str = "UMD_CONFIG";

/// The variable of `key`: `UMD_` and the key's name in capitals.
pub fn var_name(key: Key) -> String {
    format!("UMD_{}", key.name().to_ascii_uppercase())
}

/// Why the environment's configuration was refused (nothing of it applies).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// A `UMD_<KEY>` variable.
    Var {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
        /// What is wrong (an unknown key can not happen here).
        kind: ParseErrorKind,
    },
    /// An entry of the `UMD_CONFIG` file.
    File {
        /// The file.
        path: PathBuf,
        /// The entry's line (from 1; 0 for a range error in a value the
        /// file did not set).
        line: usize,
        /// The key as written.
        key: String,
        /// What is wrong.
        kind: ParseErrorKind,
    },
    /// The `UMD_CONFIG` file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// The OS's error.
        error: String,
    },
}

fn problem(f: &mut fmt::Formatter<'_>, key: &str, kind: ParseErrorKind) -> fmt::Result {
    match (kind, Key::from_name(key)) {
        (ParseErrorKind::UnknownKey, _) => write!(f, "unknown key `{key}`"),
        (ParseErrorKind::Malformed, Some(k)) => write!(f, "malformed value, expected {}", k.range()),
        (ParseErrorKind::Malformed, None) => write!(f, "`{key}` is not a key=value entry"),
        (ParseErrorKind::OutOfRange(k), _) => write!(f, "out of range: expected {}", k.range()),
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Var { var, value, kind } => {
                write!(f, "{var}={value:?}: ")?;
                let key = var.strip_prefix("UMD_").unwrap_or(var).to_ascii_lowercase();
                match kind {
                    // A value checked against another tunable: name it.
                    ParseErrorKind::OutOfRange(k) if k.name() != key => {
                        write!(f, "{} out of range: expected {}", var_name(*k), k.range())
                    }
                    _ => problem(f, &key, *kind),
                }
            }
            ConfigError::File { path, line, key, kind } => {
                write!(f, "{} ({CONFIG_VAR}) line {line}: `{key}`: ", path.display())?;
                problem(f, key, *kind)
            }
            ConfigError::Read { path, error } => {
                write!(f, "{} ({CONFIG_VAR}): {error}", path.display())
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// The defaults with the process environment applied.
pub fn from_env() -> Result<Config, ConfigError> {
    from_env_over(Config::DEFAULT)
}

/// `base` with the process environment applied.
pub fn from_env_over(base: Config) -> Result<Config, ConfigError> {
    from_lookup(base, |k| std::env::var(k).ok(), |p| std::fs::read_to_string(p).map_err(|e| e.to_string()))
}

/// `base` with the file `get(UMD_CONFIG)` names (read by `read`) applied,
/// then the `UMD_<KEY>` variables `get` returns.
pub fn from_lookup(
    base: Config,
    get: impl Fn(&str) -> Option<String>,
    read: impl Fn(&std::path::Path) -> Result<String, String>,
) -> Result<Config, ConfigError> {
    let mut c = base;
    if let Some(path) = get(CONFIG_VAR).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        let text = read(&path).map_err(|error| ConfigError::Read { path: path.clone(), error })?;
        c = c.with_text(&text).map_err(|e| ConfigError::File {
            path,
            line: e.line,
            key: e.key.to_owned(),
            kind: e.kind,
        })?;
    }
    // One entry per line, so an error's line names its variable.
    let vars: Vec<(Key, String, String)> =
        Key::ALL.into_iter().filter_map(|k| get(&var_name(k)).map(|v| (k, var_name(k), v))).collect();
    let mut text = String::new();
    for (_, var, value) in &vars {
        let v = value.trim();
        // A value is one token: a separator would smuggle in another entry.
        if v.is_empty() || v.contains(|ch: char| ch.is_whitespace() || matches!(ch, ';' | '#' | '=')) {
            return Err(ConfigError::Var {
                var: var.clone(),
                value: value.clone(),
                kind: ParseErrorKind::Malformed,
            });
        }
        let key = var.strip_prefix("UMD_").unwrap_or(var).to_ascii_lowercase();
        text.push_str(&format!("{key}={v}\n"));
    }
    c.with_text(&text).map_err(|e| {
        // The line's variable; for a range error in a value no variable
        // set, the one whose value was checked against it (or the first).
        let at = e.line.checked_sub(1).and_then(|i| vars.get(i));
        let at = at.or_else(|| {
            vars.iter().find(|(k, _, _)| matches!(e.kind, ParseErrorKind::OutOfRange(r) if r == *k))
        });
        let (var, value) = match at.or(vars.first()) {
            Some((_, var, value)) => (var.clone(), value.clone()),
            None => (e.key.to_owned(), String::new()),
        };
        ConfigError::Var { var, value, kind: e.kind }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use umd_core::config::PoolExhaustion;

    fn with(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        with_file(pairs, None)
    }

    fn with_file(pairs: &[(&str, &str)], file: Option<&str>) -> Result<Config, ConfigError> {
        let file = file.map(str::to_owned);
        from_lookup(
            Config::DEFAULT,
            |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()),
            |_| file.clone().ok_or_else(|| "No such file or directory (os error 2)".to_owned()),
        )
    }

    #[test]
    fn nothing_set_is_the_default() {
        assert_eq!(with(&[("UMD_STRESS_SEED", "7")]).unwrap(), Config::DEFAULT);
    }

    #[test]
    fn every_key_has_its_variable() {
        let text = Config::DEFAULT.text().to_string();
        let pairs: Vec<(String, String)> = text
            .split(' ')
            .filter_map(|e| e.split_once('='))
            .map(|(k, v)| (format!("UMD_{}", k.to_ascii_uppercase()), v.to_owned()))
            .collect();
        assert_eq!(pairs.len(), Key::ALL.len());
        let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(with(&refs).unwrap(), Config::DEFAULT);
        let c = with(&[
            ("UMD_IB_CHUNK_BYTES", "128K"),
            ("UMD_RING_BYTES", "8192"),
            ("UMD_BATCHING", "off"),
            ("UMD_POOL_EXHAUSTION", "error"),
            ("UMD_DEP_WAIT_NS", "7000000"),
            ("UMD_LOCAL_MIN_RESIDENCY", "2"),
            ("UMD_HANG_UNSUBMITTED_WAIT_NS", "2000000000"),
            ("UMD_WAIT_STEP0_UNTIL_NS", "200000"),
            ("UMD_WAIT_STEP1_UNTIL_NS", "400000"),
        ])
        .unwrap();
        assert_eq!((c.ib_chunk_bytes, c.ring_bytes, c.batching), (128 << 10, 8192, false));
        assert_eq!(c.pool_exhaustion, PoolExhaustion::Error);
        assert_eq!((c.dep_wait_ns, c.local_min_residency), (7_000_000, 2));
        assert_eq!(c.hang.unsubmitted_wait_ns, Some(2_000_000_000));
        assert_eq!((c.wait_steps[0].until_ns, c.wait_steps[1].until_ns), (200_000, 400_000));
    }

    #[test]
    fn a_bad_variable_is_named() {
        let e = with(&[("UMD_BATCHING", "on"), ("UMD_RING_BYTES", "12288")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "UMD_RING_BYTES=\"12288\": out of range: expected a power of two from 4 KiB to 4 MiB"
        );
        let e = with(&[("UMD_USE_IRQ", "2")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "UMD_USE_IRQ=\"2\": malformed value, expected a boolean (1/0, true/false, yes/no, on/off)"
        );
        // One token per variable.
        let e = with(&[("UMD_RING_BYTES", "8192 batching=off")]).unwrap_err();
        assert!(
            matches!(&e, ConfigError::Var { var, kind: ParseErrorKind::Malformed, .. } if var == "UMD_RING_BYTES"),
            "{e}"
        );
        // Checked against another tunable: the step that ends too early.
        let e = with(&[("UMD_WAIT_STEP0_UNTIL_NS", "500000")]).unwrap_err();
        assert_eq!(
            e,
            ConfigError::Var {
                var: "UMD_WAIT_STEP0_UNTIL_NS".into(),
                value: "500000".into(),
                kind: ParseErrorKind::OutOfRange(Key::WaitStepUntil(1))
            }
        );
        assert!(e.to_string().contains("UMD_WAIT_STEP1_UNTIL_NS out of range"), "{e}");
    }

    #[test]
    fn the_config_file_then_the_variables() {
        let file = "# bring-up board\nring_bytes=8K\nhang_window_ns=2000000000\n";
        let c = with_file(&[("UMD_CONFIG", "/etc/umd.conf"), ("UMD_RING_BYTES", "32K")], Some(file)).unwrap();
        assert_eq!((c.ring_bytes, c.hang.window_ns), (32 << 10, 2_000_000_000), "the variable wins");
        let e =
            with_file(&[("UMD_CONFIG", "/etc/umd.conf")], Some("ring_bytes=8K\nring_size=4K")).unwrap_err();
        assert_eq!(e.to_string(), "/etc/umd.conf (UMD_CONFIG) line 2: `ring_size`: unknown key `ring_size`");
        let e = with_file(&[("UMD_CONFIG", "/nonexistent")], None).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }), "{e}");
        assert!(e.to_string().starts_with("/nonexistent (UMD_CONFIG): "), "{e}");
    }
}
