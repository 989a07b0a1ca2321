//! The `umd-dump` command line: shipped streams decode as documented, the
//! shipped files are current, and bad input gets a clear error and exit 2.

use std::path::PathBuf;
use std::process::{Command, Output};

fn streams() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/streams")
}

fn dump(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_umd-dump")).args(args).output().expect("umd-dump runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn shipped_streams_are_current() {
    for (name, bytes) in umd_dump::examples::all() {
        let shipped = std::fs::read(streams().join(name)).expect("shipped stream exists");
        assert_eq!(shipped, bytes, "{name} is stale: run `cargo run -p umd-dump --example make_streams`");
    }
}

#[test]
fn worked_examples_decode_cleanly() {
    for (file, gen, packets) in [("gen1-worked-examples.rgcs", 1, 12), ("gen2-worked-examples.rgcs", 2, 14)] {
        let o = dump(&[streams().join(file).to_str().unwrap()]);
        assert!(o.status.success(), "{file}: {}", String::from_utf8_lossy(&o.stderr));
        let text = stdout(&o);
        assert!(
            text.contains(&format!("-- gen{gen}: "))
                && text.contains(&format!("{packets} packets, 0 decode errors, 0 rule violations")),
            "{file}:\n{text}"
        );
        // One line per packet plus the summary.
        assert_eq!(text.lines().count(), packets + 1);
        for name in [
            "WRITE_DATA",
            "DMA_COPY",
            "FILL",
            "FENCE",
            "WAIT_MEM",
            "TIMESTAMP",
            "INDIRECT_BUFFER",
            "CHAIN",
            "BARRIER",
            "DISPATCH",
        ] {
            assert!(text.contains(name), "{file} shows {name}");
        }
    }
    // Field values and the hex column, from the spec's FENCE example.
    let text = stdout(&dump(&[streams().join("gen1-worked-examples.rgcs").to_str().unwrap()]));
    let fence = text.lines().find(|l| l.contains("FENCE")).unwrap();
    assert!(fence.contains("ADDR=0x1234567840 VALUE=0x100000002 IRQ"), "{fence}");
    assert!(fence.ends_with("| 04010004 34567840 00000012 00000002 00000001"), "{fence}");
}

#[test]
fn broken_stream_lists_every_problem() {
    let o = dump(&[streams().join("gen2-broken.rgcs").to_str().unwrap()]);
    assert!(o.status.success());
    let text = stdout(&o);
    assert!(text.contains("silently drop the fence"), "{text}");
    assert!(text.contains("packet header not 32-byte aligned"), "{text}");
    assert!(text.contains("reserved opcode 0xee"), "{text}");
    assert!(text.contains("truncated: packet needs 68 bytes, 8 left"), "{text}");
    assert!(text.contains("4 packets, 2 decode errors, 2 rule violations"), "{text}");
}

#[test]
fn json_output_is_machine_readable() {
    let o = dump(&["--json", streams().join("gen2-broken.rgcs").to_str().unwrap()]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    assert_eq!(v["generation"], 2);
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 6);
    assert_eq!(items[0]["packet"], "TIMESTAMP");
    assert_eq!(items[0]["fields"]["ADDR"], 0x12_3456_7800u64);
    assert!(items[1]["violation"].as_str().unwrap().contains("64-byte"));
    assert!(items[4]["error"].as_str().unwrap().contains("reserved opcode"));
}

#[test]
fn raw_streams_need_a_generation() {
    let dir = std::env::temp_dir().join(format!("umd-dump-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let raw = dir.join("raw.bin");
    // gen1 TIMESTAMP at 0x2000.
    let bytes: Vec<u8> = [0x0600_0002u32, 0x2000, 0].iter().flat_map(|d| d.to_le_bytes()).collect();
    std::fs::write(&raw, &bytes).unwrap();
    let o = dump(&[raw.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("needs --gen"));
    let o = dump(&["--gen", "1", "--base", "0x4000", raw.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(stdout(&o).starts_with("000000  0x000000004000  TIMESTAMP ADDR=0x2000"), "{}", stdout(&o));
    // Bad arguments and bad files.
    for args in [vec!["--gen", "3", "x"], vec!["--gen"], vec!["--bogus"], vec![], vec!["/nonexistent/file"]] {
        let o = dump(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(!o.stderr.is_empty());
    }
    // A container with an unknown version and one with a foreign ID.
    let mut bad = umd_core::decode::StreamFile::header(
        umd_core::hw::ChipId { generation: umd_core::hw::Generation::Gen1, revision: 0 },
        0,
    )
    .to_vec();
    bad[4] = 9;
    std::fs::write(dir.join("v9.rgcs"), &bad).unwrap();
    let o = dump(&[dir.join("v9.rgcs").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("version 9"));
    bad[4] = 1;
    bad[9] = 7; // ID bits 15:8: generation 7
    std::fs::write(dir.join("g7.rgcs"), &bad).unwrap();
    let o = dump(&[dir.join("g7.rgcs").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("generation 7"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn help_and_argument_errors_come_from_clap() {
    let o = dump(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    let help = stdout(&o);
    for want in ["Usage: umd-dump [OPTIONS] <FILE|->", "--gen <1|2>", "--base <ADDR>", "--json"] {
        assert!(help.contains(want), "help lacks {want:?}:\n{help}");
    }
    for (args, want) in [
        (vec!["--bogus", "x"], "unexpected argument '--bogus'"),
        (vec!["--gen", "3", "x"], "invalid value '3' for '--gen <1|2>'"),
        (vec!["--base", "0xzz", "x"], "invalid value '0xzz' for '--base <ADDR>'"),
        (vec![], "required arguments were not provided"),
    ] {
        let o = dump(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        // clap's message, before anything runs.
        assert!(err.starts_with("error: ") && err.contains(want), "{args:?}: {err}");
    }
}
