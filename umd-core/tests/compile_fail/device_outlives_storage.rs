// A device borrows its storage and its platform: neither can go first.
include!("common/board.rs");

use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::storage::DeviceStorage;

fn main() {
    let board = Board;
    let dev = {
        let mut storage: DeviceStorage<16, 16, 4, 16> = DeviceStorage::new();
        let dev: Device<'_, Board> = Device::new(&board, &mut storage, Config::DEFAULT, MmuMode::DEFAULT).unwrap();
        dev
    };
    let _ = dev.stats();
}
