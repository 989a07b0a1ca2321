//! The README's example: record a fill, a copy and a fence into chained
//! chunks, then decode what was written.

use umd_core::cmd::{split_region, CommandBuffer, EncodeError, SliceChunks};
use umd_core::decode::Decoder;
use umd_core::hw::{probe, Generation};

/// Fill, copy and signal a fence; returns what the ring must call.
fn record(gen: Generation, ib_memory: &mut [u32]) -> Result<(u64, u32), EncodeError> {
    let chunks = SliceChunks::new(split_region(ib_memory, 0x10_0000, 16 * 1024));
    let mut cb = CommandBuffer::new(gen, chunks);
    cb.fill(0x20_0000, 4096, 0xA5A5_A5A5)?;
    cb.copy(0x20_0000, 0x30_0000, 4096)?;
    cb.fence(0x40_0000, 1, true)?;
    let ib = cb.finish()?;
    Ok((ib.gpu_va, ib.size_dw))
}

fn main() {
    // A gen2 chip, as its ID register would announce it.
    let chip = match probe(0x5247_0200) {
        Ok(c) => c,
        Err(e) => return eprintln!("probe: {e}"),
    };
    let mut mem = vec![0u32; 64 * 1024];
    match record(chip.generation, &mut mem) {
        Ok((va, size_dw)) => {
            println!("INDIRECT_BUFFER to {va:#x}, {size_dw} dwords:");
            let bytes: Vec<u8> = mem[..size_dw as usize].iter().flat_map(|d| d.to_le_bytes()).collect();
            for item in Decoder::new(chip.generation, &bytes, va) {
                match item.result {
                    Ok(p) => println!("  {:#x}  {p}", item.va),
                    Err(e) => println!("  {:#x}  !! {e}", item.va),
                }
            }
        }
        Err(e) => eprintln!("record: {e}"),
    }
}
