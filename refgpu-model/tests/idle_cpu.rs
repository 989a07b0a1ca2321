//! A hung engine (WAIT_MEM that never holds, CHAIN loop) must sleep or
//! yield, not spin: over a quiet interval the process uses well under one
//! core. Alone in its own test binary so no other test adds CPU time.
//! Linux only (reads /proc/self/stat).

#![cfg(target_os = "linux")]

mod common;

use std::time::{Duration, Instant};

use common::*;

/// CPU time (user + system) of this process in clock ticks (USER_HZ).
fn cpu_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn cpu_share(d: Duration) -> f64 {
    let t0 = cpu_ticks();
    let start = Instant::now();
    std::thread::sleep(d);
    let ticks = (cpu_ticks() - t0) as f64;
    ticks / (start.elapsed().as_secs_f64() * 100.0)
}

#[test]
fn hung_engines_do_not_spin() {
    for gen in gens() {
        let mut r = Rig::new(gen);
        let e = r.enc;
        let s = e.wait_mem(DATA, 1, u64::MAX, 0, true);
        r.submit(GFX, &s);
        let ia = DATA + 0x1000;
        r.m.write_dwords(ia, &e.chain(ia, 4)).unwrap();
        let s = e.ib(ia, 4);
        r.submit(COPY, &s);
        r.wait_for("waiting", || r.snap(GFX).waiting());
        r.wait_for("COPY in the self-CHAIN", || r.snap(COPY).cur_addr == ia);
        std::thread::sleep(Duration::from_millis(50));
        let share = cpu_share(Duration::from_millis(500));
        eprintln!("{gen:?}: two hung engines use {:.0}% of a core", share * 100.0);
        assert!(share < 0.5, "{gen:?}: two hung engines used {:.0}% of a core", share * 100.0);
        r.reset(GFX);
        r.reset(COPY);
    }
}
