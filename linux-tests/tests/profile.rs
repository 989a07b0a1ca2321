//! The profile suite (`linux_tests::PROFILE_TESTS`) under QEMU, one boot
//! per GPU generation: where a SUBMIT's time goes, from ftrace in the
//! guest (docs/perf.md, "Where a SUBMIT's time goes"). Ignored by
//! default (a measurement, not a check): `cargo test -p linux-tests
//! --test profile -- --ignored --nocapture`.

use linux_tests::Suite;

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn gen1_submit_profile() {
    linux_tests::check_suite(1, Suite::Profile);
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn gen2_submit_profile() {
    linux_tests::check_suite(2, Suite::Profile);
}
