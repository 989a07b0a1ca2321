//! The refgpu kernel driver's devcoredump (`docs/linux.md`, "The
//! devcoredump"): [`parse`] reads its text into a [`Devcoredump`], and
//! [`render_text`] prints its header and its ring and IB windows decoded
//! with the dumped generation's tables, the packet at RPTR (ring) and at
//! CUR_ADDR (IB) marked `=>`.
//!
//! The parser is strict: a line it does not expect, a missing field or a
//! window cut short (a file truncated in transit) is a [`ParseError`]
//! naming the line, never a panic.

use std::fmt::{self, Write as _};

use umd_core::decode::Decoder;
use umd_core::hw::Generation;

/// The first line of every dump.
pub const FIRST_LINE: &str = "refgpu devcoredump";

/// Dwords per line of a ring or IB window.
const WORDS_PER_LINE: usize = 8;

/// Whether `bytes` start like a devcoredump (its first line).
pub fn is_devcoredump(bytes: &[u8]) -> bool {
    bytes.strip_prefix(FIRST_LINE.as_bytes()).is_some_and(|rest| rest.first() == Some(&b'\n'))
}

/// A parsed devcoredump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Devcoredump {
    /// Why the engine was reset (`fault`, `timeout (...)`).
    pub reason: String,
    /// The ID register.
    pub chip_id: u32,
    /// The generation whose packet tables decode the windows.
    pub generation: Generation,
    /// Engine index.
    pub engine: u32,
    /// Engine name (`gfx`, `compute`, `copy`).
    pub engine_name: String,
    /// The culprit job, if the engine was executing one's IB.
    pub job: Option<Job>,
    /// Sequence numbers the engine emitted and saw complete.
    pub seqno_emitted: u64,
    /// See [`Devcoredump::seqno_emitted`].
    pub seqno_completed: u64,
    /// The driver's ring head and tail (byte counts, not wrapped).
    pub ring_head: u64,
    /// See [`Devcoredump::ring_head`].
    pub ring_tail: u64,
    /// The engine's registers, in dump order (`RPTR`, `CUR_ADDR`, ...).
    pub registers: Vec<(String, u64)>,
    /// The ring window: (byte offset in the ring, dword), in dump order.
    pub ring: Vec<(u32, u32)>,
    /// The IB windows, in dump order (`head`, then `cur` if there is one).
    pub ib_windows: Vec<IbWindow>,
}

/// The culprit job of a dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Its context id.
    pub context: u32,
    /// GPU address of its IB.
    pub ib_va: u64,
    /// Size of its IB in dwords.
    pub ib_size_dw: u32,
    /// The process that opened the file of its context.
    pub pid: i32,
    /// That process's command name.
    pub comm: String,
}

/// A window of a culprit's memory: dwords from `va` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbWindow {
    /// `head` (the IB from its start) or `cur` (from CUR_ADDR).
    pub name: String,
    /// GPU address of the first dword.
    pub va: u64,
    /// Dwords the window was to show (for `head`, the IB's size).
    pub dwords: u32,
    /// The dwords shown.
    pub words: Vec<u32>,
    /// Where the window ended.
    pub end: WindowEnd,
}

/// How an IB window ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowEnd {
    /// Every dword of the window is shown.
    Complete,
    /// Cut at a GPU address, for a reason (`window limit`, `not mapped`,
    /// `outside GPU memory`, `VM busy`, `dump buffer full`).
    Cut {
        /// The first address not shown.
        at: u64,
        /// Why.
        reason: String,
    },
}

/// What is wrong with a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// The first line is not [`FIRST_LINE`].
    NotADump,
    /// The input is not UTF-8 text.
    NotText,
    /// A line that does not belong where it is.
    Unexpected(String),
    /// A field whose value does not parse.
    BadValue {
        /// The field.
        field: &'static str,
        /// Its text.
        text: String,
    },
    /// A generation the decoder has no tables for.
    UnknownGeneration(u64),
    /// A field given twice.
    Duplicate(String),
    /// A required field or section absent before the end.
    Missing(&'static str),
    /// A window's dword line does not start where the last one ended.
    NotContiguous {
        /// Where it should start.
        expected: u64,
        /// Where it starts.
        found: u64,
    },
    /// The file ends inside an IB window (no `ib window end:` line).
    Truncated,
}

/// A dump that does not parse: the line (1-based) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// The line number (the last line + 1 for something missing at the end).
    pub line: usize,
    /// What is wrong.
    pub kind: ErrorKind,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "devcoredump line {}: ", self.line)?;
        match &self.kind {
            ErrorKind::NotADump => {
                write!(f, "not a refgpu devcoredump (the first line is not {FIRST_LINE:?})")
            }
            ErrorKind::NotText => write!(f, "not UTF-8 text"),
            ErrorKind::Unexpected(l) => write!(f, "unexpected line {l:?}"),
            ErrorKind::BadValue { field, text } => write!(f, "bad {field}: {text:?}"),
            ErrorKind::UnknownGeneration(n) => write!(f, "no generation {n}: expected 1 or 2"),
            ErrorKind::Duplicate(k) => write!(f, "{k} given twice"),
            ErrorKind::Missing(what) => write!(f, "{what} missing"),
            ErrorKind::NotContiguous { expected, found } => {
                write!(f, "window line at {found:#x}, expected {expected:#x}")
            }
            ErrorKind::Truncated => write!(f, "the file ends inside an IB window"),
        }
    }
}

impl std::error::Error for ParseError {}

/// The registers a dump shows, in its order.
const REGISTERS: [&str; 14] = [
    "RING_BASE",
    "RING_SIZE",
    "RPTR",
    "WPTR",
    "CTRL",
    "STATUS",
    "CUR_ADDR",
    "IB_BASE",
    "IB_SIZE",
    "FAULT_STATUS",
    "FAULT_ADDR",
    "ENGINE_ROOT",
    // Header fields that are numbers too, checked like registers.
    "chip_id",
    "generation",
];

fn hex(field: &'static str, text: &str) -> Result<u64, ErrorKind> {
    text.strip_prefix("0x")
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .ok_or_else(|| ErrorKind::BadValue { field, text: text.into() })
}

fn dec<T: std::str::FromStr>(field: &'static str, text: &str) -> Result<T, ErrorKind> {
    text.parse().map_err(|_| ErrorKind::BadValue { field, text: text.into() })
}

/// Splits `text` into the words after each of `keys` (`"head 0x1 tail
/// 0x2"` with `["head", "tail"]`).
fn keyed<'a, const N: usize>(
    field: &'static str,
    text: &'a str,
    keys: [&str; N],
) -> Result<[&'a str; N], ErrorKind> {
    let words: Vec<&str> = text.split(' ').collect();
    let bad = || ErrorKind::BadValue { field, text: text.into() };
    if words.len() != 2 * N {
        return Err(bad());
    }
    let mut out = [""; N];
    for (i, k) in keys.iter().enumerate() {
        if words[2 * i] != *k {
            return Err(bad());
        }
        out[i] = words[2 * i + 1];
    }
    Ok(out)
}

/// `NAME (TEXT)` into the number and the text in parentheses.
fn number_and_name<T: std::str::FromStr>(field: &'static str, text: &str) -> Result<(T, String), ErrorKind> {
    let bad = || ErrorKind::BadValue { field, text: text.into() };
    let (n, rest) = text.split_once(" (").ok_or_else(bad)?;
    let name = rest.strip_suffix(')').ok_or_else(bad)?;
    Ok((dec(field, n)?, name.to_string()))
}

/// Eight-digit hex dwords separated by single spaces, at most a line's.
fn dwords(field: &'static str, text: &str) -> Result<Vec<u32>, ErrorKind> {
    let bad = || ErrorKind::BadValue { field, text: text.into() };
    let words: Vec<&str> = text.strip_prefix(' ').ok_or_else(bad)?.split(' ').collect();
    if words.len() > WORDS_PER_LINE {
        return Err(bad());
    }
    words
        .iter()
        .map(|w| if w.len() == 8 { u32::from_str_radix(w, 16).map_err(|_| bad()) } else { Err(bad()) })
        .collect()
}

/// What the parser expects next.
enum State {
    Header,
    Ring,
    Window,
    BetweenWindows,
}

/// Reads a devcoredump's text.
pub fn parse(bytes: &[u8]) -> Result<Devcoredump, ParseError> {
    let text = std::str::from_utf8(bytes).map_err(|_| ParseError { line: 1, kind: ErrorKind::NotText })?;
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    match lines.next() {
        Some((_, FIRST_LINE)) => {}
        _ => return Err(ParseError { line: 1, kind: ErrorKind::NotADump }),
    }
    let mut p = Partial::default();
    let mut state = State::Header;
    let mut last = 1;
    for (n, line) in lines {
        last = n;
        let at = |kind| ParseError { line: n, kind };
        state = p.line(state, line).map_err(at)?;
    }
    if matches!(state, State::Window) {
        return Err(ParseError { line: last + 1, kind: ErrorKind::Truncated });
    }
    p.finish().map_err(|kind| ParseError { line: last + 1, kind })
}

#[derive(Default)]
struct Partial {
    reason: Option<String>,
    engine: Option<(u32, String)>,
    context: Option<Option<(u32, u64, u32)>>,
    process: Option<(i32, String)>,
    seqno: Option<(u64, u64)>,
    ring_pos: Option<(u64, u64)>,
    registers: Vec<(String, u64)>,
    ring_seen: bool,
    ring: Vec<(u32, u32)>,
    windows: Vec<IbWindow>,
}

impl Partial {
    fn line(&mut self, state: State, line: &str) -> Result<State, ErrorKind> {
        let unexpected = || ErrorKind::Unexpected(line.into());
        match state {
            State::Header => {
                if line.starts_with("ring window (") && line.ends_with("):") {
                    self.ring_seen = true;
                    return Ok(State::Ring);
                }
                let (key, value) = line.split_once(": ").ok_or_else(unexpected)?;
                self.field(key, value)?;
                Ok(State::Header)
            }
            State::Ring | State::BetweenWindows => {
                if let Some(rest) = line.strip_prefix("ib window ") {
                    let (name, rest) = rest.split_once(": ").ok_or_else(unexpected)?;
                    if name.is_empty() || name.contains(' ') || name == "end" {
                        return Err(unexpected());
                    }
                    let [va, dw] = keyed("ib window", rest, ["va", "dwords"])?;
                    self.windows.push(IbWindow {
                        name: name.into(),
                        va: hex("ib window va", va)?,
                        dwords: dec("ib window dwords", dw)?,
                        words: Vec::new(),
                        end: WindowEnd::Complete,
                    });
                    return Ok(State::Window);
                }
                if matches!(state, State::BetweenWindows) {
                    return Err(unexpected());
                }
                let (off, words) = line.split_once(':').ok_or_else(unexpected)?;
                if off.len() != 4 {
                    return Err(unexpected());
                }
                let mut off = u32::from_str_radix(off, 16)
                    .map_err(|_| ErrorKind::BadValue { field: "ring offset", text: off.into() })?;
                for w in dwords("ring dwords", words)? {
                    self.ring.push((off, w));
                    off = off.wrapping_add(4);
                }
                Ok(State::Ring)
            }
            State::Window => {
                let Some(win) = self.windows.last_mut() else { return Err(unexpected()) };
                if let Some(end) = line.strip_prefix("ib window end: ") {
                    win.end = if end == "complete" {
                        WindowEnd::Complete
                    } else {
                        let rest = end.strip_prefix("cut at ").ok_or_else(unexpected)?;
                        let (at, reason) = rest.split_once(": ").ok_or_else(unexpected)?;
                        WindowEnd::Cut { at: hex("cut address", at)?, reason: reason.into() }
                    };
                    return Ok(State::BetweenWindows);
                }
                let (va, words) = line.split_once(':').ok_or_else(unexpected)?;
                if va.len() != 16 {
                    return Err(unexpected());
                }
                let va = u64::from_str_radix(va, 16)
                    .map_err(|_| ErrorKind::BadValue { field: "IB address", text: va.into() })?;
                let expected = win.va.wrapping_add(4 * win.words.len() as u64);
                if va != expected {
                    return Err(ErrorKind::NotContiguous { expected, found: va });
                }
                win.words.extend(dwords("IB dwords", words)?);
                Ok(State::Window)
            }
        }
    }

    fn field(&mut self, key: &str, value: &str) -> Result<(), ErrorKind> {
        let dup = || ErrorKind::Duplicate(key.into());
        fn set<T>(slot: &mut Option<T>, v: T, dup: impl Fn() -> ErrorKind) -> Result<(), ErrorKind> {
            if slot.is_some() {
                return Err(dup());
            }
            *slot = Some(v);
            Ok(())
        }
        match key {
            "reason" => set(&mut self.reason, value.to_string(), dup),
            "engine" => set(&mut self.engine, number_and_name("engine", value)?, dup),
            "context" => {
                let job = if value.starts_with("none") {
                    None
                } else {
                    let words: Vec<&str> = value.split(' ').collect();
                    let bad = || ErrorKind::BadValue { field: "context", text: value.into() };
                    let [ctx, "ib_va:", va, "ib_size_dw:", dw] = words[..] else { return Err(bad()) };
                    Some((dec("context", ctx)?, hex("ib_va", va)?, dec("ib_size_dw", dw)?))
                };
                set(&mut self.context, job, dup)
            }
            "process" => set(&mut self.process, number_and_name("process", value)?, dup),
            "seqno" => {
                let [e, c] = keyed("seqno", value, ["emitted", "completed"])?;
                set(&mut self.seqno, (dec("seqno", e)?, dec("seqno", c)?), dup)
            }
            "ring" => {
                let [h, t] = keyed("ring", value, ["head", "tail"])?;
                set(&mut self.ring_pos, (hex("ring head", h)?, hex("ring tail", t)?), dup)
            }
            _ => {
                let Some(name) = REGISTERS.iter().find(|r| **r == key) else {
                    return Err(ErrorKind::Unexpected(format!("{key}: {value}")));
                };
                if self.registers.iter().any(|(k, _)| k == key) {
                    return Err(dup());
                }
                let v = if key == "generation" { dec(name, value)? } else { hex(name, value)? };
                self.registers.push((key.to_string(), v));
                Ok(())
            }
        }
    }

    fn finish(mut self) -> Result<Devcoredump, ErrorKind> {
        let mut take = |name: &'static str| -> Result<u64, ErrorKind> {
            let i = self.registers.iter().position(|(k, _)| k == name).ok_or(ErrorKind::Missing(name))?;
            Ok(self.registers.remove(i).1)
        };
        let chip_id = take("chip_id")?;
        let gen_number = take("generation")?;
        let chip_id = u32::try_from(chip_id)
            .map_err(|_| ErrorKind::BadValue { field: "chip_id", text: format!("{chip_id:#x}") })?;
        let generation = u8::try_from(gen_number)
            .ok()
            .and_then(Generation::from_number)
            .ok_or(ErrorKind::UnknownGeneration(gen_number))?;
        for r in &REGISTERS[..12] {
            if !self.registers.iter().any(|(k, _)| k == r) {
                return Err(ErrorKind::Missing(r));
            }
        }
        let (engine, engine_name) = self.engine.ok_or(ErrorKind::Missing("engine"))?;
        let job = match (self.context.ok_or(ErrorKind::Missing("context"))?, self.process) {
            (Some((context, ib_va, ib_size_dw)), Some((pid, comm))) => {
                Some(Job { context, ib_va, ib_size_dw, pid, comm })
            }
            (Some(_), None) => return Err(ErrorKind::Missing("process")),
            (None, Some(_)) => return Err(ErrorKind::Unexpected("process of no context".into())),
            (None, None) => None,
        };
        let (seqno_emitted, seqno_completed) = self.seqno.ok_or(ErrorKind::Missing("seqno"))?;
        let (ring_head, ring_tail) = self.ring_pos.ok_or(ErrorKind::Missing("ring"))?;
        if !self.ring_seen {
            return Err(ErrorKind::Missing("ring window"));
        }
        if job.is_some() && self.windows.is_empty() {
            return Err(ErrorKind::Missing("the culprit's IB window"));
        }
        Ok(Devcoredump {
            reason: self.reason.ok_or(ErrorKind::Missing("reason"))?,
            chip_id,
            generation,
            engine,
            engine_name,
            job,
            seqno_emitted,
            seqno_completed,
            ring_head,
            ring_tail,
            registers: self.registers,
            ring: self.ring,
            ib_windows: self.windows,
        })
    }
}

impl Devcoredump {
    /// A register's value (`RPTR`, `CUR_ADDR`, ...).
    pub fn register(&self, name: &str) -> Option<u64> {
        self.registers.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }
}

fn bytes_of(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Decoded packets of `words` at `va`, indented, `=>` on the one that
/// holds `mark`.
fn decoded(out: &mut String, gen: Generation, words: &[u32], va: u64, mark: Option<u64>) {
    let bytes = bytes_of(words);
    for item in Decoder::new(gen, &bytes, va) {
        let end = item.va.wrapping_add(item.raw.len() as u64);
        let here = mark.is_some_and(|m| m >= item.va && m < end);
        let _ = writeln!(out, "  {} {}", if here { "=>" } else { "  " }, crate::text_line(&item));
    }
}

/// The dump as text: its header, the ring from RPTR and each IB window
/// decoded, the packet at RPTR and at CUR_ADDR marked `=>`.
pub fn render_text(d: &Devcoredump) -> String {
    let mut out = String::new();
    let reg = |name| d.register(name).unwrap_or(0);
    let _ = writeln!(out, "devcoredump: {}", d.reason);
    let _ = writeln!(
        out,
        "  {}, chip_id {:#010x}, engine {} ({})",
        d.generation, d.chip_id, d.engine, d.engine_name
    );
    match &d.job {
        Some(j) => {
            let _ = writeln!(
                out,
                "  context {} of process {} ({}), IB {:#x} ({} dwords)",
                j.context, j.pid, j.comm, j.ib_va, j.ib_size_dw
            );
        }
        None => out.push_str("  no job's IB was executing\n"),
    }
    let _ = writeln!(
        out,
        "  seqno emitted {} completed {}; ring head {:#x} tail {:#x}",
        d.seqno_emitted, d.seqno_completed, d.ring_head, d.ring_tail
    );
    for chunk in d.registers.chunks(4) {
        let regs: Vec<String> = chunk.iter().map(|(k, v)| format!("{k} {v:#x}")).collect();
        let _ = writeln!(out, "  {}", regs.join(", "));
    }
    let rptr = reg("RPTR");
    // The ring from RPTR (a packet header) to the end of the window or
    // the ring; the dwords before RPTR raw (they may start mid-packet).
    let from = d.ring.iter().position(|(off, _)| u64::from(*off) == rptr);
    match from {
        Some(i) => {
            let before: Vec<String> = d.ring[..i].iter().map(|(_, w)| format!("{w:08x}")).collect();
            let _ = writeln!(out, "ring before RPTR {rptr:#x}: {} dwords", before.len());
            for line in before.chunks(WORDS_PER_LINE) {
                let _ = writeln!(out, "     {}", line.join(" "));
            }
            let run = d.ring[i..].windows(2).take_while(|p| p[1].0 == p[0].0.wrapping_add(4)).count() + 1;
            let words: Vec<u32> = d.ring[i..i + run].iter().map(|(_, w)| *w).collect();
            let _ = writeln!(out, "ring from RPTR {rptr:#x}:");
            decoded(&mut out, d.generation, &words, rptr, Some(rptr));
        }
        None => {
            let _ = writeln!(out, "ring window ({} dwords): RPTR {rptr:#x} is not in it", d.ring.len());
        }
    }
    let cur = reg("CUR_ADDR");
    for w in &d.ib_windows {
        let end = match &w.end {
            WindowEnd::Complete => "complete".to_string(),
            WindowEnd::Cut { at, reason } => format!("cut at {at:#x}: {reason}"),
        };
        let _ = writeln!(
            out,
            "ib window {} at {:#x}: {} of {} dwords shown, {end}",
            w.name,
            w.va,
            w.words.len(),
            w.dwords
        );
        decoded(&mut out, d.generation, &w.words, w.va, Some(cur));
    }
    out
}
