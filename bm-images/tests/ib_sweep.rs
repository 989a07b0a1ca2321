//! The IB sweep's checks on the host: the shape check accepts the shape
//! the sweep has and refuses each way a sweep can go wrong, a row reads
//! back from its line, and the repeats merge into their medians.

use bm_images::ib_sweep::{
    self, check_shape, chunks_for, merge, Row, ShapeError, CHUNK_SIZES, LARGE_PACKETS, ROUNDS,
    SMALL_PER_ROUND,
};

/// CHAINs of the large submissions per chunk size, as the sweep counts
/// them (32 KiB in 4 KiB chunks: 8 each; 16 KiB: 2; 64 KiB: one every
/// second round; ...).
const LARGE_CHAINS: [u64; 6] = [128, 32, 8, 2, 0, 0];

/// The rows of a sweep with every property the check wants, up to
/// `max_ib` bytes of chunk.
fn good(max_ib: usize) -> Vec<Row> {
    ib_sweep::sizes_within(max_ib)
        .zip(LARGE_CHAINS)
        .map(|(c, chains)| Row {
            chunk_bytes: c,
            chunks: chunks_for(c),
            pool_bytes: chunks_for(c) * c,
            submissions: (ROUNDS * (SMALL_PER_ROUND + 1)) as u64,
            chains,
            large_chains: chains,
            ..Row::default()
        })
        .collect()
}

#[test]
fn the_sweeps_shape_passes_on_both_generations() {
    assert_eq!(check_shape(&good(16 << 20), 16 << 20), Ok(()));
    assert_eq!(good(16 << 20).len(), CHUNK_SIZES.len());
    assert_eq!(check_shape(&good(1 << 20), 1 << 20), Ok(()));
    assert_eq!(good(1 << 20).len(), CHUNK_SIZES.len() - 1, "gen1 stops at its 1 MiB IB limit");
}

#[test]
fn a_missing_row_fails() {
    let mut rows = good(16 << 20);
    rows.pop();
    assert_eq!(check_shape(&rows, 16 << 20), Err(ShapeError::Rows { seen: 5, expected: 6 }));
    assert_eq!(check_shape(&good(16 << 20), 1 << 20), Err(ShapeError::Rows { seen: 6, expected: 5 }));
}

#[test]
fn a_chunk_size_not_applied_fails() {
    let mut rows = good(16 << 20);
    let r = &mut rows[0];
    r.chunk_bytes = 64 << 10;
    r.pool_bytes = r.chunks * r.chunk_bytes;
    assert_eq!(
        check_shape(&rows, 16 << 20),
        Err(ShapeError::ChunkSize { expected: 4 << 10, seen: 64 << 10 })
    );
}

#[test]
fn a_pool_not_sized_by_its_chunks_fails() {
    let mut rows = good(16 << 20);
    rows[2].pool_bytes = 64 << 10;
    assert_eq!(
        check_shape(&rows, 16 << 20),
        Err(ShapeError::PoolSize { chunk_bytes: 64 << 10, pool_bytes: 64 << 10 })
    );
}

#[test]
fn memory_that_does_not_grow_fails() {
    // 8 MiB chunks in a pool of 2: 16 MiB, no more than 16 chunks of 1 MiB.
    let mut rows = good(16 << 20);
    let last = rows.len() - 1;
    rows[last].chunks = 2;
    rows[last].pool_bytes = 16 << 20;
    assert_eq!(check_shape(&rows, 16 << 20), Err(ShapeError::MemoryNotGrowing { chunk_bytes: 8 << 20 }));
}

#[test]
fn chains_that_grow_with_the_chunk_fail() {
    let mut rows = good(16 << 20);
    rows[3].chains = 9;
    assert_eq!(check_shape(&rows, 16 << 20), Err(ShapeError::ChainsGrowing { chunk_bytes: 256 << 10 }));
}

#[test]
fn chains_not_counted_at_the_ends_fail() {
    // No CHAIN counted at all (every recording seen as one chunk).
    let mut rows = good(16 << 20);
    for r in &mut rows {
        r.chains = 0;
        r.large_chains = 0;
    }
    assert_eq!(check_shape(&rows, 16 << 20), Err(ShapeError::ChainsAtTheEnds));
    // The largest chunks chaining every large submission.
    let mut rows = good(1 << 20);
    for r in rows.iter_mut().skip(2) {
        (r.chains, r.large_chains) = (ROUNDS as u64, ROUNDS as u64);
    }
    assert_eq!(check_shape(&rows, 1 << 20), Err(ShapeError::ChainsAtTheEnds));
    // 4 KiB chunks must chain a 32 KiB submission at least 7 times.
    assert_eq!(LARGE_PACKETS * 16, 32 << 10);
    let mut rows = good(16 << 20);
    rows[0].large_chains = 7 * ROUNDS as u64 - 1;
    assert_eq!(check_shape(&rows, 16 << 20), Err(ShapeError::ChainsAtTheEnds));
}

#[test]
fn a_short_row_fails() {
    let mut rows = good(16 << 20);
    rows[4].submissions -= 1;
    assert_eq!(check_shape(&rows, 16 << 20), Err(ShapeError::Submissions { chunk_bytes: 1 << 20 }));
}

#[test]
fn a_row_reads_back_from_its_line() {
    let mut r = good(16 << 20)[1];
    r.peak_busy_bytes = 65536;
    r.small_cpu.median = 2500;
    r.small_cpu.p90 = 3100;
    r.large_cpu.median = 57000;
    r.large_cpu.p90 = 61000;
    r.cpu_per_submit_ns = 5900;
    r.small_latency.median = 15700;
    r.large_latency.median = 197200;
    r.ring_wraps = 3;
    r.pool_waits = 4;
    let line = r.to_string();
    assert!(line.starts_with("ib_sweep chunk_bytes=16384 "), "{line}");
    assert_eq!(Row::parse(&line), Some(r));
    // Not a row: another name, a field missing, a value not a number.
    assert_eq!(Row::parse(&line.replacen("ib_sweep", "bench", 1)), None);
    assert_eq!(Row::parse(line.rsplit_once(' ').map(|(a, _)| a).unwrap()), None);
    assert_eq!(Row::parse(&line.replace("pool_waits=4", "pool_waits=x")), None);
}

#[test]
fn repeats_merge_into_their_medians() {
    let base = good(16 << 20)[2];
    let reps: Vec<Row> = [300, 100, 200]
        .into_iter()
        .map(|t| {
            let mut r = base;
            r.cpu_per_submit_ns = t;
            r.small_cpu.median = t / 10;
            r
        })
        .collect();
    let m = merge(&reps).unwrap();
    assert_eq!((m.cpu_per_submit_ns, m.small_cpu.median), (200, 20));
    assert_eq!((m.chunk_bytes, m.pool_bytes, m.chains), (base.chunk_bytes, base.pool_bytes, base.chains));
    // Repeats of different chunk sizes do not merge.
    assert_eq!(merge(&[base, good(16 << 20)[3]]), None);
    assert_eq!(merge(&[]), None);
}
