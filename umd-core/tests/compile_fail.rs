//! The lifetime rules of the safe API, proved by programs that must not
//! compile: a mapping can not outlive its device or be used after
//! shutdown, a device can not outlive its storage or platform, two devices
//! can not share a storage, a mapping can not move to another thread.

#[test]
fn lifetime_rules() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
}
