//! Leaving QEMU with a status: semihosting `SYS_EXIT_EXTENDED` (QEMU needs
//! `-semihosting` or `-semihosting-config enable=on`), so the host reads
//! the status as QEMU's exit code. Without semihosting the `hlt` traps: the
//! harness always enables it.

/// Exits QEMU with `code` (0 = success).
pub fn exit(code: i32) -> ! {
    crate::arch::console::flush();
    semihosting::process::exit(code)
}

/// The semihosting command line (`-semihosting-config arg=...`), copied
/// into `buf`; empty when there is none.
pub fn cmdline(buf: &mut [u8; 256]) -> &str {
    let mut raw = [core::mem::MaybeUninit::<u8>::uninit(); 256];
    match semihosting::sys::arm_compat::sys_get_cmdline_uninit(&mut raw) {
        Ok(s) => {
            let n = s.len().min(buf.len());
            buf[..n].copy_from_slice(&s[..n]);
            core::str::from_utf8(&buf[..n]).unwrap_or("")
        }
        Err(_) => "",
    }
}
