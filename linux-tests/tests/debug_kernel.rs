//! The guest suites on the debug kernel (`tools/build-debug-kernel.sh`:
//! lockdep, KASAN, kmemleak, DEBUG_OBJECTS, DMA-API debugging, failslab),
//! one boot per GPU generation and suite: every test of
//! `linux_tests::GUEST_TESTS` plus `linux_tests::DEBUG_KERNEL_TESTS`
//! (failslab over every driver ioctl, a kmemleak scan), and every test of
//! `linux_tests::ADVERSARIAL_TESTS` plus the kmemleak scan
//! (`linux_tests::Suite::tests`). Ignored by default: the first run builds
//! the kernel (tens of minutes on two cores; cached outside the clone
//! after that) and each boot is several times slower than the stock
//! kernel's. Run with
//!
//! ```text
//! cargo test -p linux-tests --test debug_kernel -- --ignored
//! ```
//!
//! See docs/reliability.md, "The debug kernel".

use linux_tests::{KernelKind, Suite};

#[test]
#[ignore = "builds and boots the debug kernel (slow): cargo test -p linux-tests --test debug_kernel -- --ignored"]
fn gen1_guest_suite_debug_kernel() {
    linux_tests::check_generation_on(1, KernelKind::Debug);
}

#[test]
#[ignore = "builds and boots the debug kernel (slow): cargo test -p linux-tests --test debug_kernel -- --ignored"]
fn gen2_guest_suite_debug_kernel() {
    linux_tests::check_generation_on(2, KernelKind::Debug);
}

#[test]
#[ignore = "builds and boots the debug kernel (slow): cargo test -p linux-tests --test debug_kernel -- --ignored"]
fn gen1_adversarial_suite_debug_kernel() {
    linux_tests::check_suite_on(1, Suite::Adversarial, KernelKind::Debug);
}

#[test]
#[ignore = "builds and boots the debug kernel (slow): cargo test -p linux-tests --test debug_kernel -- --ignored"]
fn gen2_adversarial_suite_debug_kernel() {
    linux_tests::check_suite_on(2, Suite::Adversarial, KernelKind::Debug);
}
