//! A build for one generation (`--no-default-features --features gen1` or
//! `gen2`): the other generation is unknown to it, and the one it has
//! probes, encodes and decodes. Run by `.ci/run` for each generation.
#![cfg(not(all(feature = "gen1", feature = "gen2")))]

use umd_core::cmd::{Command, Encoder};
use umd_core::decode::Decoder;
use umd_core::hw::{probe, Generation, ProbeError, ID_MAGIC};

fn id(generation: u8) -> u32 {
    (u32::from(ID_MAGIC) << 16) | (u32::from(generation) << 8)
}

/// The generation built in, and the other one.
#[cfg(feature = "gen1")]
const BUILT: (u8, u8) = (1, 2);
#[cfg(feature = "gen2")]
const BUILT: (u8, u8) = (2, 1);

#[test]
fn the_other_generation_is_unknown() {
    let (_, other) = BUILT;
    assert_eq!(probe(id(other)), Err(ProbeError::UnknownGeneration { generation: other }));
    assert_eq!(Generation::from_number(other), None);
}

#[test]
fn the_built_generation_encodes_and_decodes() {
    let (have, _) = BUILT;
    let chip = probe(id(have)).expect("the built generation probes");
    assert_eq!(chip.generation.number(), have);
    let enc = Encoder::new(chip.generation);
    let mut out = [0u32; 64];
    let mut pos = 0;
    for cmd in [
        Command::Fence { addr: 0x1000, value: 7, irq: true },
        Command::Copy { src: 0x2000, dst: 0x3000, size: 64 },
        Command::Fill { dst: 0x4000, size: 64, value: 0 },
    ] {
        pos += enc.encode(&cmd, &mut out, pos, 0x10_0000).expect("encodes");
    }
    let bytes: Vec<u8> = out[..pos].iter().flat_map(|d| d.to_le_bytes()).collect();
    let items: Vec<_> = Decoder::new(chip.generation, &bytes, 0x10_0000).collect();
    assert!(items.iter().all(|i| i.result.is_ok()));
    assert!(items.len() >= 3);
}
