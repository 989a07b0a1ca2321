// Two devices can not share one storage.
include!("common/board.rs");

use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::storage::DeviceStorage;

fn main() {
    let board = Board;
    let mut storage: DeviceStorage<16, 16, 4, 16> = DeviceStorage::new();
    let a: Device<'_, Board> = Device::new(&board, &mut storage, Config::DEFAULT, MmuMode::DEFAULT).unwrap();
    let b: Device<'_, Board> = Device::new(&board, &mut storage, Config::DEFAULT, MmuMode::DEFAULT).unwrap();
    let _ = (a.stats(), b.stats());
}
