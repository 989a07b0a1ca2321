//! 32-bit correctness on the target (`mps2-an386`, `usize` = 32 bits,
//! no 64-bit atomics): the driver with its GPU VA arena at the top of the
//! 48-bit space (0x7FFF_0000_0000), so every buffer address, page-table
//! index and packet operand is far above 4 GiB, and sizes above
//! `usize::MAX`. One `@@ RESULT <check> PASS|FAIL <why>` line per check,
//! exit 0 when all passed.
#![no_std]
#![no_main]

use bm_images::boot_m::{self, Gpu};
use platform_baremetal::arch::exit;
use platform_baremetal::{image_main, println};
use umd_core::config::Config;
use umd_core::direct::{MemoryPlan, MmuMode};
use umd_core::sync::QueueId;

image_main!(main);

/// The arena: the last 4 GiB below 2^47.
const VA_BASE: u64 = 0x7FFF_0000_0000;
const MMU: MmuMode = MmuMode::Enabled { va_base: VA_BASE, va_size: 1 << 32, table_pages: 64 };
const LEN: usize = 64 * 1024;

static DEVICE: boot_m::Slot<8> = boot_m::slot();
static mut BUF: [u8; LEN] = [0; LEN];

fn check(name: &str, r: Result<(), &'static str>, failed: &mut u32) {
    match r {
        Ok(()) => println!("@@ RESULT {name} PASS"),
        Err(why) => {
            *failed += 1;
            println!("@@ RESULT {name} FAIL {why}");
        }
    }
}

fn high_va_copy(dev: &Gpu<8>) -> Result<(), &'static str> {
    // SAFETY: single core; only this function touches BUF.
    let buf = unsafe { &mut *core::ptr::addr_of_mut!(BUF) };
    let src = dev.alloc_buffer(LEN as u64).map_err(|_| "alloc src")?;
    let dst = dev.alloc_buffer(LEN as u64).map_err(|_| "alloc dst")?;
    let (s, d) = (dev.va(src).map_err(|_| "va")?, dev.va(dst).map_err(|_| "va")?);
    if s < VA_BASE || d < VA_BASE || s > u64::from(u32::MAX) << 15 {
        return Err("buffer outside the 48-bit arena");
    }
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i * 7 + (i >> 8)) as u8;
    }
    dev.write(src, 0, buf).map_err(|_| "write")?;
    let f = dev.submit(QueueId::COPY, &[], |cb| cb.copy(s, d, LEN as u64)).map_err(|_| "submit copy")?;
    let g = dev
        .submit(QueueId::COMPUTE, &[f], |cb| cb.fill(d + 0x100, 0x100, 0xA5A5_A5A5))
        .map_err(|_| "submit fill")?;
    dev.wait(g, 10_000_000_000).map_err(|_| "wait")?;
    buf.fill(0);
    dev.read(dst, 0, buf).map_err(|_| "read")?;
    for (i, b) in buf.iter().enumerate() {
        let want = if (0x100..0x200).contains(&i) { 0xA5 } else { (i * 7 + (i >> 8)) as u8 };
        if *b != want {
            return Err("a byte at a high GPU address is wrong");
        }
    }
    dev.free(src).map_err(|_| "free")?;
    dev.free(dst).map_err(|_| "free")
}

fn sizes_over_usize(dev: &Gpu<8>) -> Result<(), &'static str> {
    // 8 GiB: larger than the 32-bit address space; refused with a typed
    // error, never truncated to a small size.
    if dev.alloc_buffer(8 << 30).is_ok() {
        return Err("an 8 GiB buffer was accepted");
    }
    if dev.alloc_buffer((1 << 32) + 4096).is_ok() {
        return Err("a 4 GiB + 4 KiB buffer was accepted (truncated to 4 KiB?)");
    }
    let huge = Config { ib_chunk_bytes: usize::MAX / 2, ..Config::DEFAULT };
    let plan = MemoryPlan::new(&huge, MMU, 8, 3);
    if plan.total() != usize::MAX || plan.check(boot_m::CARVEOUT_BYTES).map_err(|e| e.what) != Err("IB pool")
    {
        return Err("a pool plan wrapped around usize");
    }
    Ok(())
}

fn main() -> ! {
    let dev = boot_m::device("m-width", &DEVICE, Config::DEFAULT, MMU);
    println!("usize bits {}, 64-bit atomics: {}", usize::BITS, cfg!(target_has_atomic = "64"));
    let mut failed = 0;
    check(
        "usize_is_32_bits_no_64_bit_atomics",
        if usize::BITS == 32 && !cfg!(target_has_atomic = "64") {
            Ok(())
        } else {
            Err("not a 32-bit target without 64-bit atomics")
        },
        &mut failed,
    );
    check("high_va_copy_and_fill", high_va_copy(dev), &mut failed);
    check("sizes_over_usize_refused", sizes_over_usize(dev), &mut failed);
    println!("@@ DONE passed={} failed={failed}", 3 - failed);
    exit::exit(if failed == 0 { 0 } else { 1 })
}
