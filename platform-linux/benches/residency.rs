//! Local memory: the cost of a forced eviction + restore of a buffer
//! against a plain GPU copy of the same bytes between two system-memory
//! buffers, in the same run, on the in-process model (gen2, 2 MiB of local
//! memory; the model charges 64 ns per KiB of system memory and 8 ns per
//! KiB of local memory a transfer touches). An eviction is a COPY-engine
//! copy local -> system plus a remap; a restore the way back.
//!
//! Run: `cargo bench -p platform-linux --bench residency`

use std::time::Instant;

use platform_linux::InProcess;
use refgpu_model::{Generation, ModelConfig};
use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::{BufferUse, Submit};
use umd_core::mem::BufferDesc;
use umd_core::storage::DeviceStorage;
use umd_core::sync::QueueId;

const ROUNDS: usize = 21;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let p = InProcess::new(ModelConfig {
        generation: Generation::Gen2,
        mem_size: 64 << 20,
        ..ModelConfig::default()
    })
    .unwrap();
    let mut storage: Box<DeviceStorage> = Box::default();
    let cfg = Config { local_min_residency: 0, ..Config::DEFAULT };
    let dev: Device<'_, InProcess, 16> = Device::new(&p, &mut storage, cfg, MmuMode::DEFAULT).unwrap();
    println!(
        "{:>8} | {:>12} {:>12} {:>12} | {:>10}",
        "bytes", "evict us", "restore us", "copy us", "(e+r)/copy"
    );
    for size in [64u64 << 10, 256 << 10, 1 << 20] {
        let w = dev.alloc(&BufferDesc::new(size).local()).unwrap();
        let a = dev.alloc(&BufferDesc::new(size).declared().device_only()).unwrap();
        let b = dev.alloc(&BufferDesc::new(size).declared().device_only()).unwrap();
        let (av, bv) = (dev.va(a).unwrap(), dev.va(b).unwrap());
        let (mut ev, mut re, mut cp) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let t = Instant::now();
            dev.evict(w).unwrap();
            ev.push(t.elapsed().as_secs_f64() * 1e6);
            let t = Instant::now();
            dev.make_resident(w).unwrap();
            re.push(t.elapsed().as_secs_f64() * 1e6);
            let uses = [BufferUse::read(a), BufferUse::write(b)];
            let t = Instant::now();
            let f =
                dev.submit_with(&Submit::on(QueueId::COPY).using(&uses), |cb| cb.copy(av, bv, size)).unwrap();
            dev.wait(f, 5_000_000_000).unwrap();
            cp.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let (e, r, c) = (median(ev), median(re), median(cp));
        println!("{size:>8} | {e:>12.1} {r:>12.1} {c:>12.1} | {:>10.2}", (e + r) / c);
        for h in [w, a, b] {
            dev.free(h).unwrap();
        }
    }
    let s = dev.stats();
    println!("evictions {} restores {} bytes moved {}", s.evictions, s.restores, s.bytes_moved);
}
