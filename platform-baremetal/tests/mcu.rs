//! The MCU configuration's carve-out (`McuCarveOut`, `MCU_NODES` nodes)
//! holds the blocks of an MCU configuration's device at its largest, with
//! a hole between each two (`docs/memory.md`, "Choosing the capacities").

use platform_baremetal::carveout::MCU_NODES;
use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::hw::Generation;
use umd_core::mem::AllocError;
use umd_core::platform::fake::Fake;
use umd_core::storage::{McuStorage, MCU_CHUNKS};

/// Bring-up (MMU bypassed, the default `Config`) and all 64 buffers
/// large, one block each: the most blocks the device can hold.
#[test]
fn the_mcu_carve_out_holds_an_mcu_device_at_its_largest() {
    let fake = Fake::new(Generation::Gen2, 32 << 20);
    let mut storage: Box<McuStorage> = Box::default();
    let dev = Device::<Fake, MCU_CHUNKS>::new(&fake, &mut storage, Config::DEFAULT, MmuMode::Bypass).unwrap();
    let at_bring_up = fake.state().allocs;
    let hs: Vec<_> = (0..64).map(|_| dev.alloc_buffer(128 * 1024).unwrap()).collect();
    assert!(matches!(dev.alloc_buffer(128 * 1024), Err(AllocError::TableFull { capacity: 64 })));
    let blocks = fake.state().allocs;
    assert_eq!(blocks, at_bring_up + 64, "one block per large buffer");
    assert!(2 * blocks < MCU_NODES, "{blocks} blocks and their holes need {} nodes", 2 * blocks + 1);
    hs.into_iter().for_each(|h| dev.free(h).unwrap());
}
