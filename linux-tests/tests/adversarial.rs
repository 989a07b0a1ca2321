//! The adversarial guest suite (`linux_tests::ADVERSARIAL_TESTS`) under
//! QEMU, one boot per GPU generation: ioctl fuzzing, threads racing on one
//! file, fork with inherited files, unmap and close under running jobs,
//! ring saturation and signals during waits (docs/linux.md, "The
//! adversarial suite").

use linux_tests::Suite;

#[test]
fn gen1_adversarial_suite() {
    linux_tests::check_suite(1, Suite::Adversarial);
}

#[test]
fn gen2_adversarial_suite() {
    linux_tests::check_suite(2, Suite::Adversarial);
}
