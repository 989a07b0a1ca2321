//! Command line of `refgpu-sim`: a `clap` derive description ([`Cli`])
//! turned into [`Options`], with the value parsers (sizes with K/M/G,
//! durations with a unit, engine masks) and the range checks that do not
//! depend on the file system ([`validate`]).

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use refgpu_model::{shared_ram, FaultInjection, Generation};

/// The command line as `clap` sees it (help text from these comments).
#[derive(Parser, Debug)]
#[command(
    name = "refgpu-sim",
    version,
    override_usage = "refgpu-sim --socket <PATH> --mem-file <PATH> [OPTIONS]\n       refgpu-sim --shared-ram <FILE> [OPTIONS]",
    about = "The reference GPU's co-simulation server: the functional model as peer 0 of QEMU's ivshmem-doorbell protocol",
    after_help = "Numbers take 0x hex and K/M/G (binary) suffixes; durations need a unit: ns, us, ms or s."
)]
pub struct Cli {
    /// UNIX socket to listen on (removed on exit)
    #[arg(long, value_name = "PATH", required_unless_present = "shared_ram")]
    socket: Option<PathBuf>,
    /// System memory: a file mapped shared (QEMU guest RAM with
    /// memory-backend-file,share=on; created with --mem-file-offset +
    /// --mem-size bytes if missing)
    #[arg(long, value_name = "PATH", required_unless_present = "shared_ram")]
    mem_file: Option<PathBuf>,
    /// Shared-RAM binding instead of ivshmem (docs/refgpu.md 2.3): attach
    /// to this RAM file (QEMU mps2-an386's PSRAM with
    /// memory-backend-file,share=on; must exist and be exactly 16 MiB);
    /// register page and doorbells in its last 8 KiB, polling only
    #[arg(long, value_name = "FILE", conflicts_with_all = ["socket", "mem_file", "mem_size", "mem_file_offset", "shm_size", "vectors"])]
    shared_ram: Option<PathBuf>,
    /// Physical address of the file's first used byte [default: 0x40000000;
    /// 0x21000000 with --shared-ram]
    #[arg(long, value_name = "ADDR", value_parser = address)]
    mem_base: Option<u64>,
    /// Size of system memory
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = bytes)]
    mem_size: u64,
    /// Offset in the file of ADDR
    #[arg(long, value_name = "N", default_value = "0", value_parser = bytes)]
    mem_file_offset: u64,
    /// Generation
    #[arg(long = "gen", value_name = "1|2", default_value = "1", value_parser = generation)]
    generation: Generation,
    /// ivshmem shared memory, a power of two >= 8K
    #[arg(long, value_name = "BYTES", default_value = "64K", value_parser = bytes)]
    shm_size: u64,
    /// Eventfds per peer, >= 4, = QEMU's vectors=
    #[arg(long, value_name = "N", default_value = "4", value_parser = count)]
    vectors: u32,
    /// Delay before every packet (e.g. 10us)
    #[arg(long, value_name = "DUR", default_value = "0ns", value_parser = duration)]
    packet_latency: Duration,
    /// Engine bit mask for --packet-latency
    #[arg(long, value_name = "M", default_value = "0x7", value_parser = mask)]
    latency_engines: u8,
    /// Drop the n-th FENCE of each engine [default: off]
    #[arg(long, value_name = "N", value_parser = fence_number)]
    drop_fence_nth: Option<u64>,
    /// Drop each FENCE with probability P
    #[arg(long = "drop-fence-prob", value_name = "P", default_value = "0", value_parser = probability)]
    drop_fence_probability: f64,
    /// Engine bit mask for fence dropping
    #[arg(long, value_name = "M", default_value = "0x7", value_parser = mask)]
    drop_fence_engines: u8,
    /// Seed of the drop probability streams
    #[arg(long, value_name = "N", default_value = "0", value_parser = number)]
    seed: u64,
    /// Engines (bit mask) that stop fetching
    #[arg(long, value_name = "M", default_value = "0", value_parser = mask)]
    stall_engines: u8,
    /// Delay of interrupt delivery
    #[arg(long, value_name = "DUR", default_value = "0ns", value_parser = duration)]
    irq_delay: Duration,
    /// WAIT_MEM re-read interval
    #[arg(long, value_name = "DUR", default_value = "50us", value_parser = duration)]
    wait_poll: Duration,
    /// CLOCK update interval in the register page
    #[arg(long, value_name = "DUR", default_value = "100us", value_parser = duration)]
    clock_publish: Duration,
    /// Local memory of a gen2 device (docs/refgpu.md 3.5), a multiple of
    /// 4K; 0 for none [default: 2M on gen2, none on gen1]
    #[arg(long, value_name = "BYTES", value_parser = bytes)]
    local_mem: Option<u64>,
    /// Transfer time of system memory per KiB moved (docs/refgpu.md 3.5);
    /// raise it to model a GPU whose work outweighs the host's
    #[arg(long, value_name = "NS", default_value = "64", value_parser = count)]
    sys_ns_per_kib: u32,
    /// Transfer time of local memory per KiB moved
    #[arg(long, value_name = "NS", default_value = "8", value_parser = count)]
    local_ns_per_kib: u32,
}

impl From<Cli> for Options {
    fn from(c: Cli) -> Options {
        let shared = c.shared_ram.is_some();
        Options {
            socket: c.socket.unwrap_or_default(),
            mem_file: c.mem_file.unwrap_or_default(),
            mem_file_offset: c.mem_file_offset,
            mem_base: c.mem_base.unwrap_or(if shared { shared_ram::REGION_BASE } else { 0x4000_0000 }),
            mem_size: if shared { shared_ram::mem_size(shared_ram::REGION_SIZE) } else { c.mem_size },
            shared_ram: c.shared_ram,
            generation: c.generation,
            shm_size: c.shm_size,
            vectors: c.vectors,
            fault: FaultInjection {
                packet_latency: c.packet_latency,
                latency_engines: c.latency_engines,
                drop_fence_nth: c.drop_fence_nth,
                drop_fence_probability: c.drop_fence_probability,
                drop_fence_engines: c.drop_fence_engines,
                seed: c.seed,
                stalled_engines: c.stall_engines,
                irq_delay: c.irq_delay,
            },
            wait_poll: c.wait_poll,
            clock_publish: c.clock_publish,
            local_mem: c.local_mem,
            ns_per_kib: [c.sys_ns_per_kib, c.local_ns_per_kib],
        }
    }
}

/// The one-line usage (`Usage: refgpu-sim --socket <PATH> ...`), for errors
/// found after parsing.
pub fn usage() -> String {
    Cli::command().render_usage().to_string()
}

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
    /// Local memory (`None`: the generation's default).
    pub local_mem: Option<u64>,
    /// Transfer time per KiB of system and local memory (ns).
    pub ns_per_kib: [u32; 2],
    /// The shared-RAM binding's RAM file (`None`: ivshmem, with `socket`
    /// and `mem_file`). With it, `mem_size` is the region's system memory
    /// (16 MiB - 8 KiB) and `socket`, `mem_file` are unused.
    pub shared_ram: Option<PathBuf>,
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
            local_mem: None,
            ns_per_kib: [64, 8],
            shared_ram: None,
        }
    }

    /// Options of the shared-RAM binding with the defaults above for
    /// `file` (base 0x2100_0000, system memory 16 MiB - 8 KiB).
    pub fn shared_ram(file: impl Into<PathBuf>) -> Self {
        Self {
            mem_base: shared_ram::REGION_BASE,
            mem_size: shared_ram::mem_size(shared_ram::REGION_SIZE),
            shared_ram: Some(file.into()),
            ..Self::new("", "")
        }
    }
}

/// A bad command line.
#[derive(Debug)]
pub enum ArgError {
    /// What `clap` reports: an unknown option, a missing option or value, a
    /// value its parser refused (the message names the option and why), or
    /// `--help` / `--version` (`exit_code()` is 0 for those). `print()`
    /// shows it with the usage.
    Cli(clap::Error),
    /// A value that parsed but is out of range ([`validate`]).
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
            ArgError::Cli(e) => write!(f, "{}", e.render().to_string().trim_end()),
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

fn address(v: &str) -> Result<u64, String> {
    parse_size(v).ok_or_else(|| "an address (decimal or 0x hex, K/M/G suffixes)".into())
}

fn bytes(v: &str) -> Result<u64, String> {
    parse_size(v).ok_or_else(|| "a size in bytes (decimal or 0x hex, K/M/G suffixes)".into())
}

fn number(v: &str) -> Result<u64, String> {
    parse_size(v).ok_or_else(|| "a number (decimal or 0x hex)".into())
}

fn count(v: &str) -> Result<u32, String> {
    parse_size(v).and_then(|n| u32::try_from(n).ok()).ok_or_else(|| "a count".into())
}

fn fence_number(v: &str) -> Result<u64, String> {
    parse_size(v).filter(|&n| n > 0).ok_or_else(|| "a fence number, counted from 1".into())
}

fn generation(v: &str) -> Result<Generation, String> {
    match v {
        "1" => Ok(Generation::Gen1),
        "2" => Ok(Generation::Gen2),
        _ => Err("1 or 2".into()),
    }
}

fn mask(v: &str) -> Result<u8, String> {
    match parse_size(v) {
        Some(m) if m <= 0x7 => Ok(m as u8),
        _ => Err("an engine bit mask, 0 ..= 0x7".into()),
    }
}

fn probability(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|p| (0.0..=1.0).contains(p))
        .ok_or_else(|| "a probability, 0.0 ..= 1.0".into())
}

fn duration(v: &str) -> Result<Duration, String> {
    parse_duration(v).ok_or_else(|| "a duration with a unit: ns, us, ms, s".into())
}

/// Parses the arguments (without the program name) and checks the ranges.
pub fn parse_args<I, T>(args: I) -> Result<Options, ArgError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let argv = std::iter::once(OsString::from("refgpu-sim")).chain(args.into_iter().map(Into::into));
    let o = Options::from(Cli::try_parse_from(argv).map_err(ArgError::Cli)?);
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
    if let Some(l) = o.local_mem {
        if l % 4096 != 0 || (l > 0 && o.generation == Generation::Gen1) || l > 1 << 40 {
            return Err(invalid("--local-mem", &show(l), "a multiple of 4 KiB up to 1 TiB, and 0 on gen1"));
        }
    }
    for (name, v) in [("--sys-ns-per-kib", o.ns_per_kib[0]), ("--local-ns-per-kib", o.ns_per_kib[1])] {
        if v > 10_000_000 {
            return Err(invalid(name, &v.to_string(), "at most 10000000 (10 ms per KiB)"));
        }
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
    use clap::error::ErrorKind;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_description_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_options_defaults() {
        assert_eq!(
            parse_args(args("--socket /tmp/s --mem-file /tmp/m")).unwrap(),
            Options::new("/tmp/s", "/tmp/m")
        );
    }

    #[test]
    fn parses_everything() {
        let o = parse_args(args(
            "--socket /tmp/s --mem-file /tmp/m --mem-base 0x80000000 --mem-size 16M --gen 2 \
             --shm-size=1M --vectors 6 --packet-latency 10us --latency-engines 0x4 --drop-fence-nth 3 \
             --drop-fence-prob 0.5 --drop-fence-engines 1 --seed 7 --stall-engines 2 --irq-delay 1ms \
             --mem-file-offset 8K --wait-poll 20us --clock-publish 1ms",
        ))
        .unwrap();
        assert_eq!(o.socket, PathBuf::from("/tmp/s"));
        assert_eq!(o.mem_file, PathBuf::from("/tmp/m"));
        assert_eq!(o.mem_base, 0x8000_0000);
        assert_eq!(o.mem_size, 16 << 20);
        assert_eq!(o.mem_file_offset, 8192);
        assert_eq!(o.generation, Generation::Gen2);
        assert_eq!(o.shm_size, 1 << 20);
        assert_eq!(o.vectors, 6);
        assert_eq!(o.fault.packet_latency, Duration::from_micros(10));
        assert_eq!(o.fault.latency_engines, 4);
        assert_eq!(o.fault.drop_fence_nth, Some(3));
        assert_eq!(o.fault.drop_fence_probability, 0.5);
        assert_eq!(o.fault.drop_fence_engines, 1);
        assert_eq!(o.fault.seed, 7);
        assert_eq!(o.fault.stalled_engines, 2);
        assert_eq!(o.fault.irq_delay, Duration::from_millis(1));
        assert_eq!(o.wait_poll, Duration::from_micros(20));
        assert_eq!(o.clock_publish, Duration::from_millis(1));
    }

    /// The error for `extra` after the required options: its kind and its
    /// rendered message.
    fn bad(extra: &str) -> (Option<ErrorKind>, String) {
        match parse_args(args(&format!("--socket s --mem-file m {extra}"))).unwrap_err() {
            ArgError::Cli(e) => (Some(e.kind()), e.render().to_string()),
            e @ ArgError::Invalid { .. } => (None, e.to_string()),
        }
    }

    #[test]
    fn rejects_bad_values_naming_the_option_and_why() {
        for (extra, option, why) in [
            ("--gen 3", "--gen", "1 or 2"),
            ("--vectors x", "--vectors", "a count"),
            ("--irq-delay 5", "--irq-delay", "a duration with a unit"),
            ("--stall-engines 8", "--stall-engines", "an engine bit mask"),
            ("--drop-fence-prob 1.5", "--drop-fence-prob", "a probability"),
            ("--drop-fence-nth 0", "--drop-fence-nth", "counted from 1"),
            ("--mem-size 12Q", "--mem-size", "a size in bytes"),
        ] {
            let (kind, msg) = bad(extra);
            assert_eq!(kind, Some(ErrorKind::ValueValidation), "{extra}: {msg}");
            assert!(msg.contains(option) && msg.contains(why), "{extra}: {msg}");
        }
        assert_eq!(bad("--frobnicate 1").0, Some(ErrorKind::UnknownArgument));
        assert_eq!(bad("--seed").0, Some(ErrorKind::InvalidValue));
        let e = parse_args(args("--mem-file m")).unwrap_err();
        assert!(matches!(&e, ArgError::Cli(c) if c.kind() == ErrorKind::MissingRequiredArgument), "{e}");
        assert!(e.to_string().contains("--socket"), "{e}");
    }

    #[test]
    fn range_checks_after_parsing() {
        let (kind, msg) = bad("--vectors 3");
        assert_eq!(
            (kind, msg.as_str()),
            (None, "--vectors \"3\": 4 ..= 64 (3 engines and the control doorbell)")
        );
        let (kind, msg) = bad("--shm-size 12K");
        assert!(kind.is_none() && msg.starts_with("--shm-size") && msg.contains("power of two"), "{msg}");
        assert!(bad("--mem-size 6000").1.starts_with("--mem-size"));
        assert!(bad("--mem-base 0x1001").1.starts_with("--mem-base"));
        assert!(bad("--mem-file-offset 100").1.starts_with("--mem-file-offset"));
        assert!(bad("--sys-ns-per-kib 10000001").1.starts_with("--sys-ns-per-kib"));
        assert!(bad("--local-ns-per-kib 20000000").1.starts_with("--local-ns-per-kib"));
        assert_eq!(bad("--sys-ns-per-kib=-1").0, Some(ErrorKind::ValueValidation));
    }

    #[test]
    fn memory_speed() {
        let o = parse_args(args("--socket s --mem-file m")).unwrap();
        assert_eq!(o.ns_per_kib, [64, 8], "the model's defaults");
        let o =
            parse_args(args("--socket s --mem-file m --sys-ns-per-kib 40000 --local-ns-per-kib 0")).unwrap();
        assert_eq!(o.ns_per_kib, [40_000, 0]);
    }

    #[test]
    fn shared_ram_mode() {
        let o = parse_args(args("--shared-ram /tmp/ram --gen 2 --stall-engines 1")).unwrap();
        assert_eq!(
            o,
            Options {
                generation: Generation::Gen2,
                fault: FaultInjection { stalled_engines: 1, ..FaultInjection::default() },
                ..Options::shared_ram("/tmp/ram")
            }
        );
        assert_eq!((o.mem_base, o.mem_size), (0x2100_0000, 0xFF_E000));
        assert_eq!(parse_args(args("--shared-ram r --mem-base 0x60000000")).unwrap().mem_base, 0x6000_0000);
        for extra in ["--socket s", "--mem-file m", "--mem-size 8M", "--vectors 5", "--shm-size 1M"] {
            let e = parse_args(args(&format!("--shared-ram r {extra}"))).unwrap_err();
            assert!(
                matches!(&e, ArgError::Cli(c) if c.kind() == ErrorKind::ArgumentConflict),
                "{extra}: {e}"
            );
        }
        let e = parse_args(args("--gen 2")).unwrap_err();
        assert!(matches!(&e, ArgError::Cli(c) if c.kind() == ErrorKind::MissingRequiredArgument), "{e}");
    }

    #[test]
    fn help_and_version_are_not_failures() {
        for a in ["--help", "-h", "--version"] {
            match parse_args(args(a)).unwrap_err() {
                ArgError::Cli(e) => assert_eq!(e.exit_code(), 0, "{a}"),
                e => panic!("{a}: {e}"),
            }
        }
        let help = Cli::command().render_long_help().to_string();
        for opt in ["--socket", "--mem-file", "--shared-ram", "--drop-fence-prob", "--clock-publish", "K/M/G"]
        {
            assert!(help.contains(opt), "{opt} missing from --help");
        }
        assert!(usage().contains("--socket <PATH>") && usage().contains("--shared-ram <FILE>"));
    }
}
