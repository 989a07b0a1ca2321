// A CPU mapping of a buffer can not outlive the device: the memory goes
// back to the platform when the device does.
include!("common/board.rs");

use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::storage::DeviceStorage;

fn main() {
    let board = Board;
    let mut storage: DeviceStorage<16, 16, 4, 16> = DeviceStorage::new();
    let bytes = {
        let dev: Device<'_, Board> = Device::new(&board, &mut storage, Config::DEFAULT, MmuMode::DEFAULT).unwrap();
        let h = dev.alloc_buffer(64).unwrap();
        let m = dev.map(h).unwrap();
        m
    };
    let _ = bytes.bytes();
}
