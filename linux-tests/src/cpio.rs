//! A writer for the `newc` cpio format, the format of a Linux initramfs
//! (the kernel's initramfs buffer format: an ASCII header per entry, name and
//! data padded to 4 bytes, a `TRAILER!!!` entry at the end).

use std::io::{self, Write};

/// An uncompressed `newc` archive being written.
pub struct Cpio<W: Write> {
    out: W,
    ino: u32,
    written: u64,
}

impl<W: Write> Cpio<W> {
    /// An empty archive writing to `out`.
    pub fn new(out: W) -> Self {
        Cpio { out, ino: 1, written: 0 }
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) -> io::Result<()> {
        self.entry_dev(name, mode, data, (0, 0))
    }

    fn entry_dev(&mut self, name: &str, mode: u32, data: &[u8], rdev: (u32, u32)) -> io::Result<()> {
        let namesize = name.len() + 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            rdev.0,
            rdev.1,
            namesize,
            0
        );
        self.ino += 1;
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(data)?;
        self.pad()
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.written += b.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - self.written % 4) % 4;
        self.put(&[0; 3][..n as usize])
    }

    /// A directory (no leading `/`).
    pub fn dir(&mut self, name: &str) -> io::Result<()> {
        self.entry(name, 0o040_755, &[])
    }

    /// A regular file with permission bits `perm`.
    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.entry(name, 0o100_000 | (perm & 0o7777), data)
    }

    /// A character device node (`dev/console` must exist before the
    /// kernel starts `/init`, which gets it as stdin, stdout and stderr).
    pub fn chardev(&mut self, name: &str, perm: u32, major: u32, minor: u32) -> io::Result<()> {
        self.entry_dev(name, 0o020_000 | (perm & 0o7777), &[], (major, minor))
    }

    /// Writes the trailer and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.entry("TRAILER!!!", 0, &[])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::Cpio;

    #[test]
    fn newc_layout() {
        let mut c = Cpio::new(Vec::new());
        c.file("init", 0o755, b"abc").unwrap();
        let v = c.finish().unwrap();
        // Header (110 bytes) + "init\0" = 115, padded to 116; data 3 -> 120.
        assert_eq!(&v[..6], b"070701");
        assert_eq!(&v[6..14], b"00000001", "inode");
        assert_eq!(&v[14..22], b"000081ed", "regular file, 0755");
        assert_eq!(&v[54..62], b"00000003", "file size");
        assert_eq!(&v[94..102], b"00000005", "name size with NUL");
        assert_eq!(&v[110..115], b"init\0");
        assert_eq!(&v[116..119], b"abc");
        assert_eq!(v.len() % 4, 0);
        assert!(v.windows(10).any(|w| w == b"TRAILER!!!"));
    }
}
