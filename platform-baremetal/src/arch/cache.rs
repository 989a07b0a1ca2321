//! Data-cache maintenance by virtual address range, to the point of
//! coherency (what a non-coherent SoC GPU needs; QEMU's TCG does not model
//! caches, so on `virt` these only cost instructions, but they keep the
//! code right for hardware).

use core::arch::asm;

/// Smallest data-cache line, from CTR_EL0.DminLine.
pub fn line_size() -> usize {
    let ctr: u64;
    // SAFETY: reading CTR_EL0 has no side effects.
    unsafe { asm!("mrs {}, ctr_el0", out(reg) ctr, options(nomem, nostack, preserves_flags)) };
    4 << ((ctr >> 16) & 0xf)
}

fn lines(addr: usize, len: usize, mut op: impl FnMut(usize)) {
    if len == 0 {
        return;
    }
    let line = line_size();
    let mut a = addr & !(line - 1);
    let end = addr.saturating_add(len);
    while a < end {
        op(a);
        a += line;
    }
    // SAFETY: a barrier has no memory-safety effect; it completes the
    // maintenance before later accesses (and before a doorbell).
    unsafe { asm!("dsb sy", options(nostack, preserves_flags)) };
}

/// Cleans `[addr, addr + len)` to the point of coherency (`dc cvac`).
pub fn clean(addr: usize, len: usize) {
    lines(addr, len, |a| {
        // SAFETY: cleaning a line writes back data already ours; the
        // address is mapped (the caller's region).
        unsafe { asm!("dc cvac, {}", in(reg) a, options(nostack, preserves_flags)) }
    });
}

/// Cleans and invalidates `[addr, addr + len)` (`dc civac`): partial lines
/// at the ends keep their CPU-side neighbours, and the device's writes
/// become visible.
pub fn invalidate(addr: usize, len: usize) {
    lines(addr, len, |a| {
        // SAFETY: clean+invalidate never loses data; the address is mapped.
        unsafe { asm!("dc civac, {}", in(reg) a, options(nostack, preserves_flags)) }
    });
}
