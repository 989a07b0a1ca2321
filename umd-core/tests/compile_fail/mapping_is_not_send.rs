// A mapping stays on the thread that made it (it holds the buffer's CPU
// pointer and borrows the device).
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
    std::thread::scope(|s| {
        s.spawn(move || drop(m));
    });
}
