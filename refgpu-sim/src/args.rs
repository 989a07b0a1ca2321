//! Command line of `refgpu-sim`, parsed by hand into [`Options`] with typed
//! errors.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use refgpu_model::{FaultInjection, Generation};

/// Usage text printed by `--help` and after an argument error.
pub const USAGE: &str = "\
usage: refgpu-sim --socket PATH --mem-file PATH [options]

  --socket PATH          UNIX socket to listen on (removed on exit)
  --mem-file PATH        system memory: a file mapped shared (QEMU guest RAM
                         with memory-backend-file,share=on; created with
                         --mem-file-offset + --mem-size bytes if missing)
  --mem-base ADDR        physical address of the file's first used byte
                         [0x40000000]
  --mem-size BYTES       size of system memory [64M]
  --mem-file-offset N    offset in the file of ADDR [0]
  --gen 1|2              generation [1]
  --shm-size BYTES       ivshmem shared memory, power of two >= 8K [64K]
  --vectors N            eventfds per peer, >= 4, = QEMU's vectors= [4]
  --packet-latency DUR   delay before every packet (e.g. 10us) [0]
  --latency-engines M    engine bit mask for --packet-latency [0x7]
  --drop-fence-nth N     drop the n-th FENCE of each engine [off]
  --drop-fence-prob P    drop each FENCE with probability P [0]
  --drop-fence-engines M engine bit mask for fence dropping [0x7]
  --seed N               seed of the drop probability streams [0]
  --stall-engines M      engines (bit mask) that stop fetching [0]
  --irq-delay DUR        delay of interrupt delivery [0]
  --wait-poll DUR        WAIT_MEM re-read interval [50us]
  --clock-publish DUR    CLOCK update interval in the register page [100us]
  --help                 this text

Numbers take 0x hex and K/M/G (binary) suffixes; durations need a unit:
ns, us, ms or s.";

/// Everything the server needs to start.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Socket path.
    pub socket: PathBuf,
    /// System-memory file.
    pub mem_file: PathBuf,
    /// Offset in the file of `mem_base`.
    pub mem_file_offset: u64,
    /// Physical address of system memory.
    pub mem_base: u64,
    /// Size of system memory.
    pub mem_size: u64,
    /// Device generation.
    pub generation: Generation,
    /// Size of the ivshmem shared memory.
    pub shm_size: u64,
    /// Eventfds per peer.
    pub vectors: u32,
    /// Fault injection.
    pub fault: FaultInjection,
    /// WAIT_MEM poll interval of the model.
    pub wait_poll: Duration,
    /// CLOCK publishing interval.
    pub clock_publish: Duration,
}

impl Options {
    /// Options with the defaults above for `socket` and `mem_file`.
    pub fn new(socket: impl Into<PathBuf>, mem_file: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            mem_file: mem_file.into(),
            mem_file_offset: 0,
            mem_base: 0x4000_0000,
            mem_size: 64 << 20,
            generation: Generation::Gen1,
            shm_size: 64 << 10,
            vectors: 4,
            fault: FaultInjection::default(),
            wait_poll: Duration::from_micros(50),
            clock_publish: Duration::from_micros(100),
        }
    }
}

/// A bad command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgError {
    /// `--help` was given.
    Help,
    /// An option nobody knows.
    Unknown(String),
    /// An option without its value.
    MissingValue(&'static str),
    /// A required option is absent.
    Missing(&'static str),
    /// A value that does not parse or is out of range.
    Invalid {
        /// The option.
        option: &'static str,
        /// The value given.
        value: String,
        /// What is wrong.
        why: &'static str,
    },
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgError::Help => write!(f, "help requested"),
            ArgError::Unknown(o) => write!(f, "unknown option {o:?}"),
            ArgError::MissingValue(o) => write!(f, "{o} needs a value"),
            ArgError::Missing(o) => write!(f, "{o} is required"),
            ArgError::Invalid { option, value, why } => write!(f, "{option} {value:?}: {why}"),
        }
    }
}

impl std::error::Error for ArgError {}

/// Parses a number: decimal or 0x hex, with an optional K/M/G (KiB, MiB,
/// GiB) suffix.
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim().replace('_', "");
    let (digits, mul) = match t.char_indices().last()? {
        (i, 'k' | 'K') => (&t[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&t[..i], 1 << 20),
        (i, 'g' | 'G') => (&t[..i], 1 << 30),
        _ => (t.as_str(), 1),
    };
    let v = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok()?,
        None => digits.parse::<u64>().ok()?,
    };
    v.checked_mul(mul)
}

/// Parses a duration with a unit: `500ns`, `10us`, `2ms`, `1s`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "ns" => Duration::from_nanos(n),
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        _ => return None,
    })
}

fn invalid(option: &'static str, value: &str, why: &'static str) -> ArgError {
    ArgError::Invalid { option, value: value.to_owned(), why }
}

fn mask(option: &'static str, v: &str) -> Result<u8, ArgError> {
    match parse_size(v) {
        Some(m) if m <= 0x7 => Ok(m as u8),
        _ => Err(invalid(option, v, "an engine bit mask, 0 ..= 0x7")),
    }
}

/// Parses the arguments (without the program name).
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Options, ArgError> {
    let mut o = Options::new("", "");
    let (mut socket, mut mem_file) = (None, None);
    let mut it = args.into_iter();
    const OPTS: &[&str] = &[
        "--socket",
        "--mem-file",
        "--mem-base",
        "--mem-size",
        "--mem-file-offset",
        "--gen",
        "--shm-size",
        "--vectors",
        "--packet-latency",
        "--latency-engines",
        "--drop-fence-nth",
        "--drop-fence-prob",
        "--drop-fence-engines",
        "--seed",
        "--stall-engines",
        "--irq-delay",
        "--wait-poll",
        "--clock-publish",
    ];
    while let Some(arg) = it.next() {
        if arg == "--help" || arg == "-h" {
            return Err(ArgError::Help);
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
            None => (arg.clone(), None),
        };
        let Some(&opt) = OPTS.iter().find(|o| **o == name) else {
            return Err(ArgError::Unknown(arg));
        };
        let v = match inline {
            Some(v) => v,
            None => it.next().ok_or(ArgError::MissingValue(opt))?,
        };
        let size = |why| parse_size(&v).ok_or_else(|| invalid(opt, &v, why));
        let dur =
            || parse_duration(&v).ok_or_else(|| invalid(opt, &v, "a duration with a unit: ns, us, ms, s"));
        match opt {
            "--socket" => socket = Some(PathBuf::from(&v)),
            "--mem-file" => mem_file = Some(PathBuf::from(&v)),
            "--mem-base" => o.mem_base = size("an address")?,
            "--mem-size" => o.mem_size = size("a size in bytes")?,
            "--mem-file-offset" => o.mem_file_offset = size("an offset in bytes")?,
            "--gen" => {
                o.generation = match v.as_str() {
                    "1" => Generation::Gen1,
                    "2" => Generation::Gen2,
                    _ => return Err(invalid(opt, &v, "1 or 2")),
                }
            }
            "--shm-size" => o.shm_size = size("a size in bytes")?,
            "--vectors" => {
                o.vectors = u32::try_from(size("a count")?).map_err(|_| invalid(opt, &v, "a count"))?
            }
            "--packet-latency" => o.fault.packet_latency = dur()?,
            "--latency-engines" => o.fault.latency_engines = mask(opt, &v)?,
            "--drop-fence-nth" => o.fault.drop_fence_nth = Some(size("a fence number from 1")?),
            "--drop-fence-prob" => {
                o.fault.drop_fence_probability = v
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| invalid(opt, &v, "a probability, 0.0 ..= 1.0"))?
            }
            "--drop-fence-engines" => o.fault.drop_fence_engines = mask(opt, &v)?,
            "--seed" => o.fault.seed = size("a number")?,
            "--stall-engines" => o.fault.stalled_engines = mask(opt, &v)?,
            "--irq-delay" => o.fault.irq_delay = dur()?,
            "--wait-poll" => o.wait_poll = dur()?,
            "--clock-publish" => o.clock_publish = dur()?,
            _ => return Err(ArgError::Unknown(arg)),
        }
    }
    o.socket = socket.ok_or(ArgError::Missing("--socket"))?;
    o.mem_file = mem_file.ok_or(ArgError::Missing("--mem-file"))?;
    validate(&o)?;
    Ok(o)
}

/// Checks the ranges that do not depend on the file system.
pub fn validate(o: &Options) -> Result<(), ArgError> {
    let show = |v: u64| format!("{v:#x}");
    if !o.shm_size.is_power_of_two() || o.shm_size < crate::proto::info::MIN_SHM as u64 {
        return Err(invalid("--shm-size", &show(o.shm_size), "a power of two of at least 8 KiB"));
    }
    if !(crate::proto::MIN_VECTORS..=64).contains(&o.vectors) {
        return Err(invalid(
            "--vectors",
            &o.vectors.to_string(),
            "4 ..= 64 (3 engines and the control doorbell)",
        ));
    }
    if o.mem_size == 0 || o.mem_size % 4096 != 0 {
        return Err(invalid("--mem-size", &show(o.mem_size), "a non-zero multiple of 4 KiB"));
    }
    if o.mem_base % 4096 != 0 || o.mem_base.checked_add(o.mem_size).is_none_or(|e| e > 1 << 48) {
        return Err(invalid(
            "--mem-base",
            &show(o.mem_base),
            "4 KiB aligned, window ending at or below 2^48",
        ));
    }
    if o.mem_file_offset % 4096 != 0 {
        return Err(invalid("--mem-file-offset", &show(o.mem_file_offset), "a multiple of 4 KiB"));
    }
    if o.fault.drop_fence_nth == Some(0) {
        return Err(invalid("--drop-fence-nth", "0", "fences are counted from 1"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_everything() {
        let o = parse_args(args(
            "--socket /tmp/s --mem-file /tmp/m --mem-base 0x80000000 --mem-size 16M --gen 2 \
             --shm-size=1M --vectors 6 --packet-latency 10us --latency-engines 0x4 --drop-fence-nth 3 \
             --drop-fence-prob 0.5 --drop-fence-engines 1 --seed 7 --stall-engines 2 --irq-delay 1ms",
        ))
        .unwrap();
        assert_eq!(o.mem_base, 0x8000_0000);
        assert_eq!(o.mem_size, 16 << 20);
        assert_eq!(o.generation, Generation::Gen2);
        assert_eq!(o.shm_size, 1 << 20);
        assert_eq!(o.vectors, 6);
        assert_eq!(o.fault.packet_latency, Duration::from_micros(10));
        assert_eq!(o.fault.latency_engines, 4);
        assert_eq!(o.fault.drop_fence_nth, Some(3));
        assert_eq!(o.fault.drop_fence_probability, 0.5);
        assert_eq!(o.fault.stalled_engines, 2);
        assert_eq!(o.fault.irq_delay, Duration::from_millis(1));
    }

    #[test]
    fn rejects_bad_values() {
        let base = "--socket s --mem-file m ";
        let bad = |extra: &str| parse_args(args(&format!("{base}{extra}"))).unwrap_err();
        assert!(matches!(bad("--gen 3"), ArgError::Invalid { option: "--gen", .. }));
        assert!(matches!(bad("--vectors 3"), ArgError::Invalid { option: "--vectors", .. }));
        assert!(matches!(bad("--shm-size 12K"), ArgError::Invalid { option: "--shm-size", .. }));
        assert!(matches!(bad("--irq-delay 5"), ArgError::Invalid { option: "--irq-delay", .. }));
        assert!(matches!(bad("--stall-engines 8"), ArgError::Invalid { option: "--stall-engines", .. }));
        assert!(matches!(bad("--frobnicate 1"), ArgError::Unknown(_)));
        assert!(matches!(bad("--seed"), ArgError::MissingValue("--seed")));
        assert_eq!(parse_args(args("--mem-file m")).unwrap_err(), ArgError::Missing("--socket"));
    }
}
