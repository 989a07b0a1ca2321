//! Physical page allocator benchmark: the cost of an alloc/free pair
//! (free a random live block, allocate a new one) at 100, 10,000 and
//! 50,000 live blocks, for `umd_core::mem::pages::PageAlloc` and, in the
//! same run, the first-fit bitmap it replaced (`common/pages_load.rs`).
//! Workloads: every block 8 KiB (2 pages), and a mix of 1 to 64 pages;
//! the window is twice the pages of the first live blocks. Each figure is
//! the best of five timed passes of `STEPS` pairs, one schedule after the
//! other (the machine may be loaded; the best pass is the least
//! disturbed).
//!
//! Run: `cargo bench -p umd-core --bench pages`

#![allow(missing_docs)]

#[path = "common/pages_load.rs"]
mod pages_load;

use std::hint::black_box;
use std::time::Instant;

use pages_load::{page_alloc, replay, Bitmap, Load, Pages, Schedule};

const STEPS: usize = 20_000;
const PASSES: usize = 5;

/// Nanoseconds per pair: the best of [`PASSES`] passes.
fn time<P: Pages>(p: &mut P, live: &mut Vec<(usize, usize)>, s: &Schedule) -> f64 {
    let mut best = f64::MAX;
    for pass in s.steps.chunks(STEPS) {
        let t = Instant::now();
        black_box(replay(p, live, pass));
        best = best.min(t.elapsed().as_nanos() as f64 / pass.len() as f64);
    }
    best
}

fn main() {
    println!(
        "{:<8} {:>7} {:>8} {:>13} {:>13} {:>8}",
        "load", "live", "window", "bitmap ns", "PageAlloc ns", "ratio"
    );
    for load in [Load::Block8k, Load::Mixed] {
        let mut first = None;
        for live in [100, 10_000, 50_000] {
            let s = Schedule::new(load, live, STEPS * PASSES);
            let mut bm = Bitmap::new(s.window);
            let mut bm_live = s.fill(&mut bm);
            let bitmap = time(&mut bm, &mut bm_live, &s);
            let mut pa = page_alloc(&s);
            let mut pa_live = s.fill(&mut pa);
            let ours = time(&mut pa, &mut pa_live, &s);
            let (b0, o0) = *first.get_or_insert((bitmap, ours));
            println!(
                "{:<8} {:>7} {:>8} {:>13.1} {:>13.1} {:>8.1}   growth from 100 live: bitmap {:.2}x, PageAlloc {:.2}x",
                format!("{load:?}"),
                live,
                s.window,
                bitmap,
                ours,
                bitmap / ours,
                bitmap / b0,
                ours / o0
            );
        }
    }
}
