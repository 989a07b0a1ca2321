//! The smoke image on both generations, polling and MSI: one test per
//! scenario, plus one per run for the exit status and generation.

use qemu_tests::{check_run, check_scenario, Mode, Run};

fn run(generation: u8, mode: Mode) -> Run {
    Run::new("smoke", generation, mode)
}

macro_rules! suite {
    ($m:ident, $gen:expr, $mode:expr) => {
        mod $m {
            use super::*;

            #[test]
            fn exits_zero_on_the_right_generation() {
                check_run(&run($gen, $mode));
            }
            #[test]
            fn copy_fill_write_gfx() {
                check_scenario(&run($gen, $mode), "copy_fill_write_gfx");
            }
            #[test]
            fn copy_fill_write_compute() {
                check_scenario(&run($gen, $mode), "copy_fill_write_compute");
            }
            #[test]
            fn copy_fill_write_copy() {
                check_scenario(&run($gen, $mode), "copy_fill_write_copy");
            }
            #[test]
            fn fences_in_order_gfx() {
                check_scenario(&run($gen, $mode), "fences_in_order_gfx");
            }
            #[test]
            fn fences_in_order_compute() {
                check_scenario(&run($gen, $mode), "fences_in_order_compute");
            }
            #[test]
            fn fences_in_order_copy() {
                check_scenario(&run($gen, $mode), "fences_in_order_copy");
            }
            #[test]
            fn cross_queue() {
                check_scenario(&run($gen, $mode), "cross_queue");
            }
        }
    };
}

suite!(gen1_polling, 1, Mode::Polling);
suite!(gen2_polling, 2, Mode::Polling);
suite!(gen1_msi, 1, Mode::Msi);
suite!(gen2_msi, 2, Mode::Msi);
