//! The images' defmt logs, decoded on the host.
//!
//! The images (built with `bm-images`' `defmt` feature) write defmt frames
//! (rzCOBS-encoded, 0-delimited) over semihosting with `defmt-semihosting`,
//! which writes to the semihosting `:tt` stream: with `target=native` QEMU
//! writes those bytes to its own stdout. So the harness gives QEMU's
//! stdout to the frames alone and sends the PL011 text (the `@@` result
//! lines) to QEMU's stderr instead (`-chardev file,path=/dev/stderr`,
//! `-serial chardev:`). A thread decodes the frames as they arrive with
//! `defmt-decoder`, using the string table in the image ELF's `.defmt`
//! section and, for the location of each log statement, the ELF's DWARF
//! line info.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;

use defmt_decoder::{DecodeError, Locations, Table};

/// The message of the line standing in for a frame that did not decode.
pub const MALFORMED: &str = "(host: malformed defmt frame skipped)";

/// One decoded defmt log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// `error`, `warn`, `info`, `debug`, `trace`, or empty for `println`.
    pub level: String,
    /// The image's timestamp (generic timer, µs), as the image formats it.
    pub timestamp: Option<String>,
    /// The message with its arguments formatted.
    pub message: String,
    /// `path:line` of the log statement (relative to the workspace when
    /// it is inside it), when the ELF's line info has it.
    pub location: Option<String>,
}

impl fmt::Display for LogLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(t) = &self.timestamp {
            write!(f, "{t:>12} ")?;
        }
        write!(f, "{:<5} {}", self.level.to_uppercase(), self.message)?;
        if let Some(l) = &self.location {
            write!(f, "  ({l})")?;
        }
        Ok(())
    }
}

/// The image's defmt table and log-statement locations.
pub struct Decoder {
    table: Table,
    locations: Option<Locations>,
    root: PathBuf,
}

impl Decoder {
    /// Reads `elf`'s `.defmt` table; `Ok(None)` when the image was built
    /// without defmt.
    pub fn for_image(elf: &Path, workspace_root: &Path) -> Result<Option<Decoder>, String> {
        let bytes = std::fs::read(elf).map_err(|e| format!("reading {}: {e}", elf.display()))?;
        let Some(table) =
            Table::parse(&bytes).map_err(|e| format!("defmt table of {}: {e}", elf.display()))?
        else {
            return Ok(None);
        };
        // Locations are a convenience: a missing or odd line table only
        // drops the `(file:line)` suffix.
        let locations = table.get_locations(&bytes).ok().filter(|l| !l.is_empty());
        Ok(Some(Decoder { table, locations, root: workspace_root.to_path_buf() }))
    }

    /// Starts the thread that decodes the frames read from `r` (QEMU's
    /// stdout) as they arrive and pushes the lines into `out`, until `r`
    /// ends (QEMU exited or was killed).
    pub fn spawn(
        self,
        mut r: impl Read + Send + 'static,
        out: Arc<Mutex<Vec<LogLine>>>,
    ) -> thread::JoinHandle<()> {
        thread::spawn(move || {
            let mut stream = self.table.new_stream_decoder();
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n @ 1..) = r.read(&mut buf) {
                stream.received(&buf[..n]);
                let mut lines = Vec::new();
                loop {
                    match stream.decode() {
                        Ok(frame) => lines.push(LogLine {
                            level: frame.level().map(|l| l.as_str()).unwrap_or("").to_string(),
                            timestamp: frame.display_timestamp().map(|t| t.to_string()),
                            message: frame.display_message().to_string(),
                            location: self.location(frame.index()),
                        }),
                        Err(DecodeError::UnexpectedEof) => break,
                        Err(DecodeError::Malformed) => {
                            lines.push(LogLine {
                                level: "error".into(),
                                timestamp: None,
                                message: MALFORMED.into(),
                                location: None,
                            });
                            if !self.table.encoding().can_recover() {
                                return;
                            }
                        }
                    }
                }
                if let Ok(mut v) = out.lock() {
                    v.extend(lines);
                }
            }
        })
    }

    fn location(&self, index: u64) -> Option<String> {
        let loc = self.locations.as_ref()?.get(&index)?;
        let file = loc.file.strip_prefix(&self.root).unwrap_or(&loc.file);
        Some(format!("{}:{}", file.display(), loc.line))
    }
}
