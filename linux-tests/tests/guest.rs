//! The guest suite (`linux_tests::GUEST_TESTS`) under QEMU, one boot per
//! GPU generation: the driver's uAPI, functional, isolation, hang/fault,
//! teardown tests and the benchmarks, all in one boot.

#[test]
fn gen1_guest_suite() {
    linux_tests::check_generation(1);
}

#[test]
fn gen2_guest_suite() {
    linux_tests::check_generation(2);
}
