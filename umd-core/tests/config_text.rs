//! The run-time configuration: `Config::validate` names the tunable out
//! of range, and the `key=value` text (`Config::with_text`, the format
//! Linux and firmware share) sets every tunable, round-trips through
//! `Config::text`, and refuses an unknown key, a malformed value or one
//! out of range with a typed error naming the key, all or nothing.

use umd_core::config::{Config, Key, ParseErrorKind, PoolExhaustion, RangeError};

#[test]
fn the_defaults_are_valid_and_round_trip_through_the_text() {
    assert_eq!(Config::DEFAULT.validate(), Ok(()));
    let text = Config::DEFAULT.text().to_string();
    assert_eq!(Config::DEFAULT.with_text(&text), Ok(Config::DEFAULT), "{text}");
    // Every key is printed once.
    for k in Key::ALL {
        assert_eq!(text.matches(&format!("{}=", k.name())).count(), 1, "{} in {text}", k.name());
        assert_eq!(Key::from_name(k.name()), Some(k));
    }
    assert_eq!(Config::DEFAULT.with_text(""), Ok(Config::DEFAULT));
    assert_eq!(Config::DEFAULT.with_text("  # only a comment\n\n;"), Ok(Config::DEFAULT));
}

#[test]
fn every_key_sets_its_field() {
    let text = "ib_chunk_bytes=128K ring_bytes=8192; batching=off\n\
                pool_exhaustion=error use_irq=0 # a comment=ignored\n\
                wait_step0_until_ns=500 wait_step1_until_ns=50000 wait_step2_until_ns=2000000\n\
                wait_step0_interval_ns=0 wait_step1_interval_ns=2000 wait_step2_interval_ns=20000 wait_step3_interval_ns=200000\n\
                dep_wait_ns=7000000 local_min_residency=9\n\
                hang_window_ns=250000000 hang_min_progress_bytes=32 hang_max_windows=8\r\n\
                hang_unsubmitted_wait_ns=3000000000\n";
    let c = Config::DEFAULT.with_text(text).unwrap();
    assert_eq!(c.ib_chunk_bytes, 128 << 10);
    assert_eq!(c.ring_bytes, 8192);
    assert!(!c.batching);
    assert_eq!(c.pool_exhaustion, PoolExhaustion::Error);
    assert!(!c.use_irq);
    let until: Vec<u64> = c.wait_steps.iter().map(|s| s.until_ns).collect();
    let every: Vec<u64> = c.wait_steps.iter().map(|s| s.interval_ns).collect();
    assert_eq!(until, [500, 50_000, 2_000_000, u64::MAX]);
    assert_eq!(every, [0, 2_000, 20_000, 200_000]);
    assert_eq!((c.dep_wait_ns, c.local_min_residency), (7_000_000, 9));
    assert_eq!(c.hang.window_ns, 250_000_000);
    assert_eq!((c.hang.min_progress_bytes, c.hang.max_windows_without_fence), (32, 8));
    assert_eq!(c.hang.unsubmitted_wait_ns, Some(3_000_000_000));
    // Printed and read back, the same configuration.
    assert_eq!(Config::DEFAULT.with_text(&c.text().to_string()), Ok(c));
    // A later entry overrides an earlier one; `none` clears the limit.
    let c2 = c.with_text("ring_bytes=4K ring_bytes=16K hang_unsubmitted_wait_ns=none batching=YES").unwrap();
    assert_eq!((c2.ring_bytes, c2.hang.unsubmitted_wait_ns, c2.batching), (16 << 10, None, true));
}

#[test]
fn bad_entries_are_typed_errors_naming_the_key_and_nothing_changes() {
    let base = Config { ring_bytes: 8192, ..Config::DEFAULT };
    let kind = |t: &str| {
        let e = base.with_text(t).unwrap_err();
        (e.key.to_string(), e.line, e.kind)
    };
    assert_eq!(kind("ring_bytes=16K\nring_byte=4096"), ("ring_byte".into(), 2, ParseErrorKind::UnknownKey));
    assert_eq!(kind("ring_bytes=lots"), ("ring_bytes".into(), 1, ParseErrorKind::Malformed));
    assert_eq!(kind("ring_bytes="), ("ring_bytes".into(), 1, ParseErrorKind::Malformed));
    assert_eq!(kind("batching=maybe"), ("batching".into(), 1, ParseErrorKind::Malformed));
    assert_eq!(kind("pool_exhaustion=panic"), ("pool_exhaustion".into(), 1, ParseErrorKind::Malformed));
    assert_eq!(kind("dep_wait_ns=-5"), ("dep_wait_ns".into(), 1, ParseErrorKind::Malformed));
    assert_eq!(
        kind("dep_wait_ns=5K"),
        ("dep_wait_ns".into(), 1, ParseErrorKind::Malformed),
        "no suffix on times"
    );
    assert_eq!(kind("use_irq"), ("use_irq".into(), 1, ParseErrorKind::Malformed));
    let range = |k: Key| ParseErrorKind::OutOfRange(k);
    assert_eq!(kind("ring_bytes=12288"), ("ring_bytes".into(), 1, range(Key::RingBytes)));
    assert_eq!(kind("ib_chunk_bytes=1000"), ("ib_chunk_bytes".into(), 1, range(Key::IbChunkBytes)));
    assert_eq!(kind("hang_window_ns=0"), ("hang_window_ns".into(), 1, range(Key::HangWindowNs)));
    assert_eq!(
        kind("batch_window_ns=100000001"),
        ("batch_window_ns".into(), 1, range(Key::BatchWindowNs)),
        "the batch window is at most 100 ms"
    );
    assert_eq!(kind("batch_window_ns=1K"), ("batch_window_ns".into(), 1, ParseErrorKind::Malformed));
    assert_eq!(Config::DEFAULT.batch_window_ns, 0, "off by default");
    if cfg!(feature = "deferred-doorbells") {
        let c = Config::DEFAULT.with_text("batch_window_ns=100000000").unwrap();
        assert_eq!(c.batch_window_ns, 100_000_000);
    } else {
        assert_eq!(
            kind("batch_window_ns=1000"),
            ("batch_window_ns".into(), 1, range(Key::BatchWindowNs)),
            "a window needs the deferred-doorbells feature"
        );
    }
    assert_eq!(
        kind("hang_max_windows=4294967296"),
        ("hang_max_windows".into(), 1, range(Key::HangMaxWindows))
    );
    assert_eq!(
        kind("local_min_residency=5000"),
        ("local_min_residency".into(), 1, range(Key::LocalMinResidency))
    );
    assert_eq!(
        kind("hang_unsubmitted_wait_ns=5"),
        ("hang_unsubmitted_wait_ns".into(), 1, range(Key::HangUnsubmittedWaitNs))
    );
    assert_eq!(
        kind("wait_step3_interval_ns=2000000000"),
        ("wait_step3_interval_ns".into(), 1, range(Key::WaitStepInterval(3)))
    );
    // The steps out of order: step 1 ends before step 0.
    assert_eq!(
        kind("\nwait_step0_until_ns=200000"),
        ("wait_step1_until_ns".into(), 0, range(Key::WaitStepUntil(1)))
    );
    assert_eq!(
        kind("wait_step1_until_ns=1000"),
        ("wait_step1_until_ns".into(), 1, range(Key::WaitStepUntil(1)))
    );
    assert_eq!(
        kind("ring_bytes=99999999999999999999"),
        ("ring_bytes".into(), 1, ParseErrorKind::Malformed),
        "a number too large for any field"
    );
    // All or nothing: the good entries before the bad one are not applied.
    assert!(base.with_text("batching=off ring_bytes=16K\nhang_max_windows=0").is_err());
    assert_eq!(base.ring_bytes, 8192);
    // The messages name the key and the expected values.
    let e = base.with_text("ring_bytes=12288").unwrap_err();
    assert_eq!(
        e.to_string(),
        "line 1: `ring_bytes` out of range: expected a power of two from 4 KiB to 4 MiB"
    );
    let e = base.with_text("a=1\nfoo=2").unwrap_err();
    assert_eq!(e.to_string(), "line 1: unknown key `a`");
}

#[test]
fn validate_names_the_tunable_out_of_range() {
    let bad = |c: Config| c.validate().unwrap_err();
    let d = Config::DEFAULT;
    assert_eq!(bad(Config { ring_bytes: 3000, ..d }), RangeError { key: Key::RingBytes });
    assert_eq!(bad(Config { ib_chunk_bytes: 32 << 20, ..d }), RangeError { key: Key::IbChunkBytes });
    assert_eq!(bad(Config { dep_wait_ns: u64::MAX, ..d }), RangeError { key: Key::DepWaitNs });
    let mut steps = d.wait_steps;
    steps[3].until_ns = 5_000_000;
    assert_eq!(bad(Config { wait_steps: steps, ..d }), RangeError { key: Key::WaitStepUntil(2) });
    let mut steps = d.wait_steps;
    steps[2].interval_ns = 2_000_000_000;
    assert_eq!(bad(Config { wait_steps: steps, ..d }), RangeError { key: Key::WaitStepInterval(2) });
    let h = d.hang;
    let hang = |hang| Config { hang, ..d };
    use umd_core::config::HangConfig;
    assert_eq!(bad(hang(HangConfig { max_windows_without_fence: 0, ..h })).key, Key::HangMaxWindows);
    assert_eq!(bad(hang(HangConfig { min_progress_bytes: 2 << 20, ..h })).key, Key::HangMinProgressBytes);
    assert_eq!(
        bad(hang(HangConfig { unsubmitted_wait_ns: Some(u64::MAX), ..h })).to_string(),
        "hang_unsubmitted_wait_ns out of range: expected ns from 1 ms to 1 h, or `none`"
    );
}
