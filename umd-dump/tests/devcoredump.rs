//! The devcoredump reader (`docs/linux.md`, "The devcoredump") on a dump
//! written by hand from the documented format: its fields, its decoded
//! windows with the packets at RPTR and CUR_ADDR marked, the command line,
//! and a typed error naming the line for anything else.

use std::io::Write as _;
use std::process::{Command, Stdio};

use proptest::prelude::*;
use umd_core::hw::Generation;
use umd_dump::devcoredump::{parse, render_text, ErrorKind, WindowEnd};

/// A gen1 stall: the engine is on the FENCE at 0x40000004 of a 7-dword
/// IB (NOP, FENCE, NOP); RPTR (0x90) is on the ring's INDIRECT_BUFFER,
/// the job's FENCE behind it.
const GOLDEN: &str = "\
refgpu devcoredump
reason: timeout (no progress for job_timeout_ms)
chip_id: 0x52470100
generation: 1
engine: 0 (gfx)
context: 3 ib_va: 0x40000000 ib_size_dw: 7
process: 812 (refgpu-guest)
seqno: emitted 5 completed 4
ring: head 0x90 tail 0xb4
RING_BASE: 0x0000000000100000
RING_SIZE: 0x1000
RPTR: 0x90
WPTR: 0xb4
CTRL: 0x0
STATUS: 0xb
CUR_ADDR: 0x0000000040000004
IB_BASE: 0x0000000040000000
IB_SIZE: 0x7
FAULT_STATUS: 0x00000000
FAULT_ADDR: 0x0000000000000000
ENGINE_ROOT: 0x0000000000203000
ring window (64 dwords from RPTR - 128 bytes):
0010: 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
0030: 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
0050: 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
0070: 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
0090: 07000003 40000000 00000000 00000007 04010004 00fe0000 00000000 00000005
00b0: 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
00d0: 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
00f0: 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
ib window head: va 0x0000000040000000 dwords 7
0000000040000000: 00000000 04010004 00001000 00000000 0000002a 00000000 00000000
ib window end: complete
";

#[test]
fn golden_dump_fields() {
    let d = parse(GOLDEN.as_bytes()).expect("the golden dump parses");
    assert_eq!(d.reason, "timeout (no progress for job_timeout_ms)");
    assert_eq!(d.chip_id, 0x5247_0100);
    assert_eq!(d.generation, Generation::Gen1);
    assert_eq!((d.engine, d.engine_name.as_str()), (0, "gfx"));
    let j = d.job.as_ref().expect("a culprit");
    assert_eq!(
        (j.context, j.ib_va, j.ib_size_dw, j.pid, j.comm.as_str()),
        (3, 0x4000_0000, 7, 812, "refgpu-guest")
    );
    assert_eq!((d.seqno_emitted, d.seqno_completed, d.ring_head, d.ring_tail), (5, 4, 0x90, 0xb4));
    assert_eq!(d.registers.len(), 12);
    assert_eq!(d.register("RPTR"), Some(0x90));
    assert_eq!(d.register("CUR_ADDR"), Some(0x4000_0004));
    assert_eq!(d.register("ENGINE_ROOT"), Some(0x20_3000));
    assert_eq!(d.ring.len(), 64);
    assert_eq!(d.ring[0], (0x10, 0));
    assert_eq!(d.ring[32], (0x90, 0x0700_0003));
    assert_eq!(d.ib_windows.len(), 1);
    let w = &d.ib_windows[0];
    assert_eq!((w.name.as_str(), w.va, w.dwords), ("head", 0x4000_0000, 7));
    assert_eq!(w.words, [0, 0x0401_0004, 0x1000, 0, 0x2a, 0, 0]);
    assert_eq!(w.end, WindowEnd::Complete);
}

#[test]
fn golden_dump_renders_with_marks() {
    let text = render_text(&parse(GOLDEN.as_bytes()).unwrap());
    let marked: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("=>")).collect();
    assert_eq!(marked.len(), 2, "the packet at RPTR and the one at CUR_ADDR:\n{text}");
    assert!(marked[0].contains("INDIRECT_BUFFER") && marked[0].contains("0x000000000090"), "{text}");
    assert!(marked[1].contains("FENCE") && marked[1].contains("0x000040000004"), "{text}");
    for want in [
        "devcoredump: timeout (no progress for job_timeout_ms)",
        "gen1, chip_id 0x52470100, engine 0 (gfx)",
        "context 3 of process 812 (refgpu-guest), IB 0x40000000 (7 dwords)",
        "ring before RPTR 0x90: 32 dwords",
        "ib window head at 0x40000000: 7 of 7 dwords shown, complete",
    ] {
        assert!(text.contains(want), "lacks {want:?}:\n{text}");
    }
    // The ring decodes from RPTR: its FENCE follows the INDIRECT_BUFFER.
    let ring: Vec<&str> =
        text.lines().skip_while(|l| !l.starts_with("ring from RPTR")).skip(1).take(2).collect();
    assert!(ring[1].contains("FENCE") && ring[1].contains("0x0000000000a0"), "{text}");
}

#[test]
fn cut_windows_and_no_culprit() {
    // A window cut at an unmapped page, then one from CUR_ADDR.
    let cut = GOLDEN.replace(
        "0000000040000000: 00000000 04010004 00001000 00000000 0000002a 00000000 00000000\nib window end: complete\n",
        "0000000040000000: 00000000 04010004\nib window end: cut at 0x0000000040000008: not mapped\n\
         ib window cur: va 0x0000000050000000 dwords 256\nib window end: cut at 0x0000000050000000: VM busy\n",
    );
    let d = parse(cut.as_bytes()).unwrap();
    assert_eq!(d.ib_windows.len(), 2);
    assert_eq!(d.ib_windows[0].words, [0, 0x0401_0004]);
    assert_eq!(d.ib_windows[0].end, WindowEnd::Cut { at: 0x4000_0008, reason: "not mapped".into() });
    assert_eq!((d.ib_windows[1].name.as_str(), d.ib_windows[1].words.len()), ("cur", 0));
    let text = render_text(&d);
    assert!(text.contains("2 of 7 dwords shown, cut at 0x40000008: not mapped"), "{text}");
    assert!(text.contains("truncated"), "the cut FENCE decodes as truncated:\n{text}");
    // A fault between jobs: no process, no window.
    let none = GOLDEN
        .replace(
            "context: 3 ib_va: 0x40000000 ib_size_dw: 7\nprocess: 812 (refgpu-guest)\n",
            "context: none (no job's IB was executing)\n",
        )
        .replace("reason: timeout (no progress for job_timeout_ms)", "reason: fault");
    let none = &none[..none.find("ib window head").unwrap()];
    let d = parse(none.as_bytes()).unwrap();
    assert!(d.job.is_none() && d.ib_windows.is_empty());
    assert!(render_text(&d).contains("no job's IB was executing"));
}

fn error_of(text: &str) -> (usize, ErrorKind) {
    let e = parse(text.as_bytes()).expect_err("an error");
    assert!(e.to_string().starts_with(&format!("devcoredump line {}: ", e.line)), "{e}");
    (e.line, e.kind)
}

#[test]
fn bad_input_names_its_line() {
    assert_eq!(error_of("refgpu devcoredum\n").0, 1);
    assert_eq!(error_of("").1, ErrorKind::NotADump);
    assert_eq!(
        error_of(&GOLDEN.replace("generation: 1", "generation: 3")).1,
        ErrorKind::UnknownGeneration(3)
    );
    let (line, kind) = error_of(&GOLDEN.replace("RPTR: 0x90", "RPTR: 90"));
    assert_eq!((line, kind), (12, ErrorKind::BadValue { field: "RPTR", text: "90".into() }));
    assert_eq!(error_of(&GOLDEN.replace("CTRL: 0x0\n", "")).1, ErrorKind::Missing("CTRL"));
    assert_eq!(
        error_of(&GOLDEN.replace("CTRL: 0x0\n", "CTRL: 0x0\nCTRL: 0x1\n")),
        (15, ErrorKind::Duplicate("CTRL".into()))
    );
    assert_eq!(error_of(&GOLDEN.replace("CTRL: 0x0\n", "BOGUS: 0x0\n")).0, 14);
    assert_eq!(
        error_of(&GOLDEN.replace("process: 812 (refgpu-guest)\n", "")).1,
        ErrorKind::Missing("process")
    );
    let (line, kind) = error_of(&GOLDEN.replace("0000000040000000: ", "0000000040000004: "));
    assert_eq!((line, kind), (32, ErrorKind::NotContiguous { expected: 0x4000_0000, found: 0x4000_0004 }));
    assert_eq!(error_of(&GOLDEN.replace(" 0000002a ", " 2a ")).0, 32);
    // Cut in transit: inside the window, or before it.
    assert_eq!(
        error_of(GOLDEN.strip_suffix("ib window end: complete\n").unwrap()),
        (33, ErrorKind::Truncated)
    );
    let before = &GOLDEN[..GOLDEN.find("ib window head").unwrap()];
    assert_eq!(error_of(before).1, ErrorKind::Missing("the culprit's IB window"));
    assert_eq!(error_of(&GOLDEN[..GOLDEN.find("ring window").unwrap()]).1, ErrorKind::Missing("ring window"));
    // Every cut of the golden dump is an error or (at a line's end after
    // the last window) the whole dump, never a panic.
    for n in 0..GOLDEN.len() {
        if let Ok(d) = parse(&GOLDEN.as_bytes()[..n]) {
            assert_eq!(d, parse(GOLDEN.as_bytes()).unwrap(), "cut at {n}");
        }
    }
}

fn umd_dump(input: &[u8], args: &[&str]) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_umd-dump"))
        .args(args)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("umd-dump runs");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn command_line_recognises_a_dump() {
    let o = umd_dump(GOLDEN.as_bytes(), &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), render_text(&parse(GOLDEN.as_bytes()).unwrap()));
    let o = umd_dump(GOLDEN.replace("RPTR: 0x90", "RPTR: zz").as_bytes(), &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("-: devcoredump line 12: bad RPTR: \"zz\""));
    let o = umd_dump(GOLDEN.as_bytes(), &["--json"]);
    assert_eq!(o.status.code(), Some(2));
}

proptest! {
    /// Any line of the golden dump replaced by arbitrary text: a parse or
    /// a typed error, never a panic; the rendering of what parses neither.
    #[test]
    fn a_mangled_line_never_panics(line in 0usize..34, text in "[ -~]{0,90}") {
        let mut lines: Vec<&str> = GOLDEN.lines().collect();
        let i = line % lines.len();
        lines[i] = &text;
        let mangled = lines.join("\n");
        match parse(mangled.as_bytes()) {
            Ok(d) => { let _ = render_text(&d); }
            Err(e) => prop_assert!(e.line >= 1 && e.line <= lines.len() + 1, "{e}"),
        }
    }

    /// Arbitrary bytes after the first line: the same.
    #[test]
    fn arbitrary_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = b"refgpu devcoredump\n".to_vec();
        bytes.extend(tail);
        if let Ok(d) = parse(&bytes) {
            let _ = render_text(&d);
        }
    }
}
