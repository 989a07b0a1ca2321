// The device can not be shut down while a buffer is mapped.
include!("common/board.rs");

use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::storage::DeviceStorage;

fn main() {
    let board = Board;
    let mut storage: DeviceStorage<16, 16, 4, 16> = DeviceStorage::new();
    let dev: Device<'_, Board> = Device::new(&board, &mut storage, Config::DEFAULT, MmuMode::DEFAULT).unwrap();
    let h = dev.alloc_buffer(64).unwrap();
    let m = dev.map(h).unwrap();
    dev.shutdown();
    let _ = m.bytes();
}
