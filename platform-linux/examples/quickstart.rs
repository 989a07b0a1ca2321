//! The README's example: bring a device up on the in-process model, copy a
//! buffer on the COPY queue, fill part of the copy on the COMPUTE queue
//! after it, read the result back. `cargo test` compiles it; it runs in a
//! few milliseconds.

use platform_linux::InProcess;
use refgpu_model::ModelConfig;
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::{BufferUse, Submit};
use umd_core::mem::BufferDesc;
use umd_core::storage::DeviceStorage;
use umd_core::sync::QueueId;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let platform = InProcess::new(ModelConfig::default())?; // UMD_* read here
                                                            // The device's tables: caller-placed (a `static` in firmware), never moved.
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, InProcess, 16> =
        Device::new(&platform, &mut storage, platform.config(), MmuMode::DEFAULT)?;

    let src = dev.alloc(&BufferDesc::new(65536).tag("src"))?;
    let dst = dev.alloc(&BufferDesc::new(65536).tag("dst"))?;
    dev.write(src, 0, &[0xAB; 65536])?; // cleaned for the GPU by the driver
    let (s, d) = (dev.va(src)?, dev.va(dst)?);

    let copy = dev.submit(QueueId::COPY, &[], |cb| cb.copy(s, d, 65536))?;
    let (waits, uses) = ([copy], [BufferUse::write(dst)]);
    let fill = Submit::on(QueueId::COMPUTE).after(&waits).using(&uses); // after the copy
    let done = dev.submit_with(&fill, |cb| cb.fill(d, 256, 0))?;
    dev.free(src)?; // safe at once: reused only after `copy` has signalled

    dev.wait(done, 1_000_000_000)?; // a hang is detected, reported and the queue reset
    let mut out = [0u8; 512];
    dev.read(dst, 0, &mut out)?; // invalidated for the CPU by the driver
    assert!(out[..256].iter().all(|b| *b == 0) && out[256..].iter().all(|b| *b == 0xAB));
    dev.free(dst)?;
    let report = dev.shutdown();
    println!("copied and filled; {} buffers leaked", report.leaked_buffers);
    Ok(())
}
