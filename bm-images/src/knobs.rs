//! The driver configuration from the boot command line: every word
//! `umd.<key>=<value>` (QEMU: `-semihosting-config ...,arg=umd.ring_bytes=8192`)
//! is an entry of umd-core's `key=value` text format
//! ([`umd_core::config`]), applied over the image's own configuration
//! all or nothing ([`Config::with_text`]). A bad entry is reported
//! (the images print `@@ CONFIG_ERROR <why>`, naming the key) and the
//! image's configuration stays in effect; the images then print the
//! configuration the device runs with as `@@ CONFIG <key=value ...>`.
//! Host code (the demo's launcher) uses [`PREFIX`] to pass entries.

use core::fmt;

use umd_core::config::Config;

/// The prefix that marks a configuration entry on the command line.
pub const PREFIX: &str = "umd.";

/// Bytes of configuration text the command line can carry (the
/// semihosting command line is 256 bytes).
const TEXT_BYTES: usize = 256;

/// Too much configuration text for the command line's buffer.
#[derive(Clone, Copy, Debug)]
struct TooLong;

impl fmt::Display for TooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "more than {TEXT_BYTES} bytes of configuration")
    }
}

/// `base` with the `umd.` entries of `words` applied; or, after handing
/// the first bad entry's error to `refused`, `base`.
pub fn apply<'a>(
    base: Config,
    words: impl Iterator<Item = &'a str>,
    refused: impl FnOnce(&dyn fmt::Display),
) -> Config {
    let mut buf = [0u8; TEXT_BYTES];
    let mut len = 0usize;
    for w in words.filter_map(|w| w.strip_prefix(PREFIX)) {
        let end = len.saturating_add(w.len()).saturating_add(1);
        let Some(slot) = buf.get_mut(len..end) else {
            refused(&TooLong);
            return base;
        };
        let (text, sep) = slot.split_at_mut(w.len());
        text.copy_from_slice(w.as_bytes());
        sep.fill(b'\n');
        len = end;
    }
    // Whole words of a `str` joined by newlines: UTF-8.
    let text = core::str::from_utf8(buf.get(..len).unwrap_or(&[])).unwrap_or("");
    match base.with_text(text) {
        Ok(c) => c,
        Err(e) => {
            refused(&e);
            base
        }
    }
}
