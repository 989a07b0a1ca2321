//! Command-stream capture: every committed IB (its CHAINs followed) with
//! its queue, fence value and waits, as records of a `.rgcs` capture file
//! (format version 2, `docs/refgpu.md` section 8.1), into a sink.
//!
//! The records are built by the device (`umd-core`'s `capture` feature,
//! `DeviceCore::start_capture`); this module holds the
//! format, the sinks and the reader:
//!
//! - [`CaptureSink`]: where records go. A sink that fails (a full disk, a
//!   stalled UART) never stops a submission: the record is counted as lost.
//! - [`CaptureRing`]: the last records in RAM, readable after the fact (the
//!   oldest are overwritten and counted as dropped); with
//!   [`Capture::on_failure`] it is a flight recorder, emitted into the sink
//!   when a hang or fault is reported.
//! - [`HexLines`]: records as `rgcs:` hex lines over any
//!   [`core::fmt::Write`] (a UART); `umd-dump --hex` turns them back into a
//!   capture.
//! - [`Records`]: the reader (`umd-dump` prints a capture with it).
//!
//! ```
//! use umd_core::debug::capture::{CaptureRing, Record, Records, RecordWriter};
//! use umd_core::sync::{FenceId, QueueId, Seqno};
//!
//! // A ring of 256 bytes keeping at most 2 records.
//! let mut ring = CaptureRing::<256, 2>::new();
//! for seqno in 1..=3u64 {
//!     let waits = [FenceId { queue: QueueId(0), seqno: Seqno(seqno) }];
//!     let ib = [0x7001_0000u32, 0];
//!     let w = RecordWriter::new(QueueId(1), Seqno(seqno), &waits);
//!     w.write(&mut ring, &[(0x1000, 2, Some(&ib[..]))]).unwrap();
//! }
//! assert_eq!(ring.dropped(), 1); // the first one was overwritten
//! let mut bytes = [0u8; 256];
//! let n = ring.copy_records(&mut bytes);
//! let seen: Vec<u64> = Records::new(&bytes[..n])
//!     .filter_map(|r| match r.unwrap() {
//!         Record::Submit(s) => Some(s.seqno.0),
//!         Record::Lost(_) => None,
//!     })
//!     .collect();
//! assert_eq!(seen, [2, 3]);
//! ```

use core::fmt;

use crate::hw::ChipId;
use crate::sync::{FenceId, QueueId, Seqno};

/// Format version of a capture file (a `.rgcs` file of records; version 1
/// is one bare stream).
pub const CAPTURE_VERSION: u32 = 2;
/// Tag of a submission record.
pub const SUBMIT_TAG: [u8; 4] = *b"SUBM";
/// Tag of a loss record (records that never reached the sink or the ring).
pub const LOST_TAG: [u8; 4] = *b"LOST";
/// Size of a submission record's header.
pub const RECORD_HEADER: usize = 24;
/// Size of one wait in a record.
pub const WAIT_BYTES: usize = 16;
/// Size of a segment's header in a record.
pub const SEGMENT_HEADER: usize = 16;
/// Size of a loss record.
pub const LOST_BYTES: usize = 16;
/// CHAINs followed per submission at most; a longer chain is cut (flag
/// [`FLAG_CUT`]).
pub const MAX_SEGMENTS: usize = 64;
/// Record flag: a segment's memory could not be read (its dwords are
/// missing, its size is recorded).
pub const FLAG_UNREADABLE: u32 = 1;
/// Record flag: the CHAIN walk stopped at [`MAX_SEGMENTS`] or at a CHAIN
/// that loops back.
pub const FLAG_CUT: u32 = 2;

/// A sink could not take bytes (disk full, UART stalled, record too big).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SinkError;

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "capture sink refused the record")
    }
}

/// Where capture bytes go. A record is `begin(len)`, `write`s of exactly
/// `len` bytes in all, `end()`; the file header is written the same way.
pub trait CaptureSink: Send {
    /// A record of `len` bytes starts.
    fn begin(&mut self, len: usize) -> Result<(), SinkError> {
        let _ = len;
        Ok(())
    }
    /// Bytes of the record.
    fn write(&mut self, bytes: &[u8]) -> Result<(), SinkError>;
    /// The record is complete.
    fn end(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

/// Writes one whole record (or header) into `sink`.
pub fn write_whole(sink: &mut dyn CaptureSink, bytes: &[u8]) -> Result<(), SinkError> {
    sink.begin(bytes.len())?;
    sink.write(bytes)?;
    sink.end()
}

/// The header of a capture file for `chip` (a `.rgcs` header of version 2).
pub fn file_header(chip: ChipId) -> [u8; crate::decode::STREAM_HEADER_LEN] {
    let mut h = crate::decode::StreamFile::header(chip, 0);
    put(&mut h, 4, &CAPTURE_VERSION.to_le_bytes());
    h
}

/// The chip and the records of a capture file (a `.rgcs` file of format
/// version [`CAPTURE_VERSION`]).
pub fn parse_file(bytes: &[u8]) -> Result<(ChipId, &[u8]), crate::decode::StreamFileError> {
    use crate::decode::{StreamFileError, STREAM_HEADER_LEN, STREAM_MAGIC};
    let (head, records) = bytes.split_at_checked(STREAM_HEADER_LEN).ok_or(StreamFileError::TooShort)?;
    if head.get(..4) != Some(&STREAM_MAGIC[..]) {
        return Err(StreamFileError::BadMagic);
    }
    let version = le64(head, 4) as u32;
    if version != CAPTURE_VERSION {
        return Err(StreamFileError::UnsupportedVersion(version));
    }
    let chip = crate::hw::probe(le64(head, 8) as u32).map_err(StreamFileError::Probe)?;
    Ok((chip, records))
}

/// A loss record: `count` records were dropped or lost before this point.
pub fn lost_record(count: u64) -> [u8; LOST_BYTES] {
    let mut r = [0u8; LOST_BYTES];
    put(&mut r, 0, &LOST_TAG);
    put(&mut r, 4, &(LOST_BYTES as u32).to_le_bytes());
    put(&mut r, 8, &count.to_le_bytes());
    r
}

/// Copies `bytes` into `buf` at `at` (what does not fit is left out).
fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    // Byte by byte, as `StreamFile::header` copies: no length check to
    // panic in a no-panic build.
    if let Some(d) = buf.get_mut(at..at.saturating_add(bytes.len())) {
        d.iter_mut().zip(bytes).for_each(|(d, s)| *d = *s);
    }
}

/// One IB segment to record: GPU address, size in dwords, the dwords (None
/// when its memory could not be read).
pub type Segment<'a> = (u64, u32, Option<&'a [u32]>);

/// Builds a submission record.
#[derive(Clone, Copy, Debug)]
pub struct RecordWriter<'a> {
    queue: QueueId,
    seqno: Seqno,
    waits: &'a [FenceId],
}

impl<'a> RecordWriter<'a> {
    /// A record of submission `seqno` on `queue` after `waits` (at most
    /// 255 are recorded).
    pub const fn new(queue: QueueId, seqno: Seqno, waits: &'a [FenceId]) -> Self {
        RecordWriter { queue, seqno, waits }
    }

    fn waits(&self) -> &'a [FenceId] {
        self.waits.get(..self.waits.len().min(255)).unwrap_or(&[])
    }

    /// The record's length in bytes for `segments`.
    pub fn len(&self, segments: &[Segment<'_>]) -> usize {
        let seg: usize = segments
            .iter()
            .map(|s| SEGMENT_HEADER.saturating_add(s.2.map_or(0, |d| d.len().saturating_mul(4))))
            .fold(0, usize::saturating_add);
        RECORD_HEADER.saturating_add(self.waits().len().saturating_mul(WAIT_BYTES)).saturating_add(seg)
    }

    /// Writes the record for `segments` (each with its flags) into `sink`.
    pub fn write(&self, sink: &mut dyn CaptureSink, segments: &[Segment<'_>]) -> Result<(), SinkError> {
        self.write_flagged(sink, segments, 0)
    }

    /// [`RecordWriter::write`] with extra flags ([`FLAG_CUT`]).
    pub fn write_flagged(
        &self,
        sink: &mut dyn CaptureSink,
        segments: &[Segment<'_>],
        flags: u32,
    ) -> Result<(), SinkError> {
        let len = self.len(segments);
        let len32 = u32::try_from(len).map_err(|_| SinkError)?;
        let nseg = u16::try_from(segments.len()).map_err(|_| SinkError)?;
        let unreadable = if segments.iter().any(|s| s.2.is_none()) { FLAG_UNREADABLE } else { 0 };
        let mut head = [0u8; RECORD_HEADER];
        put(&mut head, 0, &SUBMIT_TAG);
        put(&mut head, 4, &len32.to_le_bytes());
        put(&mut head, 8, &[self.queue.0, self.waits().len() as u8]);
        put(&mut head, 10, &nseg.to_le_bytes());
        put(&mut head, 12, &(flags | unreadable).to_le_bytes());
        put(&mut head, 16, &self.seqno.0.to_le_bytes());
        sink.begin(len)?;
        sink.write(&head)?;
        for w in self.waits() {
            let mut b = [0u8; WAIT_BYTES];
            put(&mut b, 0, &u32::from(w.queue.0).to_le_bytes());
            put(&mut b, 8, &w.seqno.0.to_le_bytes());
            sink.write(&b)?;
        }
        for &(va, ndw, dwords) in segments {
            let stored = dwords.map_or(0, <[u32]>::len) as u32;
            let mut b = [0u8; SEGMENT_HEADER];
            put(&mut b, 0, &va.to_le_bytes());
            put(&mut b, 8, &ndw.to_le_bytes());
            put(&mut b, 12, &stored.to_le_bytes());
            sink.write(&b)?;
            // 16 dwords a write: a call per dword would cost more than
            // the copy.
            for chunk in dwords.unwrap_or(&[]).chunks(16) {
                let mut b = [0u8; 64];
                for (o, d) in b.chunks_exact_mut(4).zip(chunk) {
                    o.copy_from_slice(&d.to_le_bytes());
                }
                sink.write(b.get(..chunk.len().saturating_mul(4)).unwrap_or(&[]))?;
            }
        }
        sink.end()
    }
}

/// A byte FIFO over a fixed array, written and read in at most two
/// slice copies.
struct ByteRing<const N: usize> {
    buf: [u8; N],
    start: usize,
    len: usize,
}

impl<const N: usize> ByteRing<N> {
    const fn new() -> Self {
        ByteRing { buf: [0; N], start: 0, len: 0 }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn clear(&mut self) {
        self.start = 0;
        self.len = 0;
    }

    /// The bytes, oldest first, as two slices.
    fn as_slices(&self) -> (&[u8], &[u8]) {
        let end = self.start.saturating_add(self.len);
        let first = self.buf.get(self.start..end.min(N)).unwrap_or(&[]);
        let second = self.buf.get(..end.saturating_sub(N)).unwrap_or(&[]);
        (first, second)
    }

    fn iter(&self) -> impl Iterator<Item = &u8> + '_ {
        let (a, b) = self.as_slices();
        a.iter().chain(b)
    }

    /// Drops the `n` oldest bytes.
    fn pop_front(&mut self, n: usize) {
        let n = n.min(self.len);
        self.start = self.start.saturating_add(n).checked_rem(N).unwrap_or(0);
        self.len = self.len.saturating_sub(n);
    }

    /// Appends `bytes` whole, or nothing when they do not fit.
    fn push(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() > N.saturating_sub(self.len) {
            return false;
        }
        let at = self.start.saturating_add(self.len).checked_rem(N).unwrap_or(0);
        let (a, b) = bytes.split_at(bytes.len().min(N.saturating_sub(at)));
        if let Some(d) = self.buf.get_mut(at..at.saturating_add(a.len())) {
            d.copy_from_slice(a);
        }
        if let Some(d) = self.buf.get_mut(..b.len()) {
            d.copy_from_slice(b);
        }
        self.len = self.len.saturating_add(bytes.len());
        true
    }
}

/// The last records in RAM: at most `RECORDS` records in `BYTES` bytes;
/// a new record overwrites the oldest ones (counted in
/// [`CaptureRing::dropped`]), never waits. A record larger than the whole
/// ring is refused (counted as lost by the device).
pub struct CaptureRing<const BYTES: usize = 65536, const RECORDS: usize = 64> {
    bytes: ByteRing<BYTES>,
    records: usize,
    dropped: u64,
    /// The record being written, and whether it was refused.
    open: bool,
}

impl<const BYTES: usize, const RECORDS: usize> CaptureRing<BYTES, RECORDS> {
    /// An empty ring (a `const fn`: usable in a `static`).
    pub const fn new() -> Self {
        CaptureRing { bytes: ByteRing::new(), records: 0, dropped: 0, open: false }
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.records
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// Records overwritten to make room since the ring was made (or
    /// cleared).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Forgets every record and the drop count.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.records = 0;
        self.dropped = 0;
    }

    /// Removes the oldest record.
    fn pop_oldest(&mut self) {
        let mut len = [0u8; 4];
        for (i, b) in self.bytes.iter().skip(4).take(4).enumerate() {
            if let Some(d) = len.get_mut(i) {
                *d = *b;
            }
        }
        self.bytes.pop_front((u32::from_le_bytes(len) as usize).max(8));
        self.records = self.records.saturating_sub(1);
        self.dropped = self.dropped.saturating_add(1);
    }

    /// Copies the records, oldest first, into `out`; returns the bytes
    /// written (whole records only: those that do not fit are left out).
    pub fn copy_records(&self, out: &mut [u8]) -> usize {
        let mut n = 0usize;
        for (d, s) in out.iter_mut().zip(self.bytes.iter()) {
            *d = *s;
            n = n.saturating_add(1);
        }
        // Cut at the last whole record.
        let mut whole = 0usize;
        while let Some(len) = out.get(whole.saturating_add(4)..whole.saturating_add(8)) {
            let l = le64(len, 0) as u32 as usize;
            let end = whole.saturating_add(l.max(8));
            if end > n {
                break;
            }
            whole = end;
        }
        whole
    }

    /// Writes the ring as a capture into `sink`: the file header for
    /// `chip`, a loss record if records were dropped, then the records.
    pub fn emit(&self, chip: ChipId, sink: &mut dyn CaptureSink) -> Result<(), SinkError> {
        write_whole(sink, &file_header(chip))?;
        if self.dropped > 0 {
            write_whole(sink, &lost_record(self.dropped))?;
        }
        let (a, b) = self.bytes.as_slices();
        let mut rest = (a, b);
        while !rest.0.is_empty() || !rest.1.is_empty() {
            let head: [u8; 8] = core::array::from_fn(|i| {
                rest.0.get(i).or_else(|| rest.1.get(i.wrapping_sub(rest.0.len()))).copied().unwrap_or(0)
            });
            let len = (le64(&head, 4) as u32 as usize).max(8);
            sink.begin(len)?;
            let first = len.min(rest.0.len());
            let (x, y) = rest.0.split_at(first);
            sink.write(x)?;
            let second = len.saturating_sub(first).min(rest.1.len());
            let (u, v) = rest.1.split_at(second);
            sink.write(u)?;
            sink.end()?;
            rest = if y.is_empty() { (v, &[]) } else { (y, rest.1) };
        }
        Ok(())
    }
}

impl<const BYTES: usize, const RECORDS: usize> Default for CaptureRing<BYTES, RECORDS> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const BYTES: usize, const RECORDS: usize> fmt::Debug for CaptureRing<BYTES, RECORDS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaptureRing")
            .field("records", &self.records)
            .field("bytes", &self.bytes.len())
            .field("dropped", &self.dropped)
            .finish()
    }
}

impl<const BYTES: usize, const RECORDS: usize> CaptureSink for CaptureRing<BYTES, RECORDS> {
    fn begin(&mut self, len: usize) -> Result<(), SinkError> {
        self.open = false;
        if len > BYTES || RECORDS == 0 {
            return Err(SinkError);
        }
        while self.records > 0 && (self.records >= RECORDS || BYTES.saturating_sub(self.bytes.len()) < len) {
            self.pop_oldest();
        }
        self.open = true;
        Ok(())
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), SinkError> {
        if !self.open {
            return Err(SinkError);
        }
        if self.bytes.push(bytes) {
            Ok(())
        } else {
            Err(SinkError)
        }
    }

    fn end(&mut self) -> Result<(), SinkError> {
        if !self.open {
            return Err(SinkError);
        }
        self.open = false;
        self.records = self.records.saturating_add(1);
        Ok(())
    }
}

/// The prefix of a hex line ([`HexLines`]).
pub const HEX_PREFIX: &str = "rgcs: ";

/// Capture bytes as text lines `rgcs: <hex>` (32 bytes a line) over any
/// [`core::fmt::Write`] (a UART). Lines of other output may come between
/// them: `umd-dump --hex` keeps only these. A write error (a stalled
/// UART) is the sink's error.
#[derive(Debug)]
pub struct HexLines<W: fmt::Write + Send> {
    out: W,
    col: usize,
}

impl<W: fmt::Write + Send> HexLines<W> {
    /// Lines into `out`.
    pub const fn new(out: W) -> Self {
        HexLines { out, col: 0 }
    }

    /// The writer back.
    pub fn into_inner(self) -> W {
        self.out
    }
}

impl<W: fmt::Write + Send> CaptureSink for HexLines<W> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), SinkError> {
        for b in bytes {
            if self.col == 0 {
                self.out.write_str(HEX_PREFIX).map_err(|_| SinkError)?;
            }
            write!(self.out, "{b:02x}").map_err(|_| SinkError)?;
            self.col = self.col.saturating_add(1);
            if self.col == 32 {
                self.out.write_char('\n').map_err(|_| SinkError)?;
                self.col = 0;
            }
        }
        Ok(())
    }

    fn end(&mut self) -> Result<(), SinkError> {
        if self.col != 0 {
            self.col = 0;
            self.out.write_char('\n').map_err(|_| SinkError)?;
        }
        Ok(())
    }
}

/// What a capture session records, and where.
pub struct Capture<'d> {
    /// Queues captured (bit `q`); `u32::MAX` for all.
    pub queues: u32,
    /// The RAM ring, if any: every record goes there.
    pub ring: Option<&'d mut (dyn RingSink + 'd)>,
    /// The sink, if any: every record, or with `on_failure` the ring's
    /// contents when a hang or fault is reported.
    pub sink: Option<&'d mut (dyn CaptureSink + 'd)>,
    /// A flight recorder: the sink gets nothing until a hang or fault,
    /// then the ring (the last records before it).
    pub on_failure: bool,
}

impl fmt::Debug for Capture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Capture")
            .field("queues", &self.queues)
            .field("ring", &self.ring.is_some())
            .field("sink", &self.sink.is_some())
            .field("on_failure", &self.on_failure)
            .finish()
    }
}

impl<'d> Capture<'d> {
    /// Every record of every queue into `sink` (a file, a UART).
    pub fn to_sink(sink: &'d mut (dyn CaptureSink + 'd)) -> Self {
        Capture { queues: u32::MAX, ring: None, sink: Some(sink), on_failure: false }
    }

    /// Every record into a RAM ring, read after the fact.
    pub fn to_ring(ring: &'d mut (dyn RingSink + 'd)) -> Self {
        Capture { queues: u32::MAX, ring: Some(ring), sink: None, on_failure: false }
    }

    /// A flight recorder: the last records in `ring`, written into `sink`
    /// with each hang or fault report.
    pub fn flight_recorder(ring: &'d mut (dyn RingSink + 'd), sink: &'d mut (dyn CaptureSink + 'd)) -> Self {
        Capture { queues: u32::MAX, ring: Some(ring), sink: Some(sink), on_failure: true }
    }

    /// Only the queues in `mask` (bit `q`).
    pub fn queues(mut self, mask: u32) -> Self {
        self.queues = mask;
        self
    }
}

/// A RAM ring of records, whatever its size ([`CaptureRing`]).
pub trait RingSink: CaptureSink {
    /// Records held.
    fn records(&self) -> usize;
    /// Records overwritten.
    fn dropped(&self) -> u64;
    /// Writes the ring as a capture ([`CaptureRing::emit`]).
    fn emit(&self, chip: ChipId, sink: &mut dyn CaptureSink) -> Result<(), SinkError>;
    /// Calls `f` with each record's summary, oldest first.
    fn summaries(&self, f: &mut dyn FnMut(Summary));
}

impl<const BYTES: usize, const RECORDS: usize> RingSink for CaptureRing<BYTES, RECORDS> {
    fn records(&self) -> usize {
        self.records
    }
    fn dropped(&self) -> u64 {
        self.dropped
    }
    fn emit(&self, chip: ChipId, sink: &mut dyn CaptureSink) -> Result<(), SinkError> {
        CaptureRing::emit(self, chip, sink)
    }
    fn summaries(&self, f: &mut dyn FnMut(Summary)) {
        let mut it = self.bytes.iter().copied();
        let take = |n: usize, it: &mut dyn Iterator<Item = u8>| -> u64 {
            let b: [u8; 8] = core::array::from_fn(|i| if i < n { it.next().unwrap_or(0) } else { 0 });
            u64::from_le_bytes(b)
        };
        for _ in 0..self.records {
            let _tag = take(4, &mut it);
            let len = take(4, &mut it) as usize;
            let queue = take(1, &mut it) as u8;
            let waits = take(1, &mut it) as u8;
            let segments = take(2, &mut it) as u16;
            let flags = take(4, &mut it) as u32;
            let seqno = take(8, &mut it);
            let mut s = Summary {
                queue: QueueId(queue),
                seqno: Seqno(seqno),
                waits: [FenceId { queue: QueueId(0), seqno: Seqno(0) }; 4],
                nwaits: waits,
                segments,
                first_va: 0,
                dwords: 0,
                flags,
            };
            let mut used = RECORD_HEADER;
            for i in 0..usize::from(waits) {
                let q = take(4, &mut it) as u8;
                let _ = take(4, &mut it);
                let sq = take(8, &mut it);
                if let Some(w) = s.waits.get_mut(i) {
                    *w = FenceId { queue: QueueId(q), seqno: Seqno(sq) };
                }
                used = used.saturating_add(WAIT_BYTES);
            }
            for i in 0..segments {
                let va = take(8, &mut it);
                let ndw = take(4, &mut it);
                let stored = take(4, &mut it) as usize;
                if i == 0 {
                    s.first_va = va;
                }
                s.dwords = s.dwords.saturating_add(ndw);
                for _ in 0..stored.saturating_mul(4) {
                    it.next();
                }
                used = used.saturating_add(SEGMENT_HEADER).saturating_add(stored.saturating_mul(4));
            }
            for _ in used..len {
                it.next();
            }
            f(s);
        }
    }
}

/// A captured submission in brief (the state dump lists these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// The queue.
    pub queue: QueueId,
    /// Its fence value.
    pub seqno: Seqno,
    /// Its first waits (up to 4; `nwaits` says how many it had).
    pub waits: [FenceId; 4],
    /// How many waits it had.
    pub nwaits: u8,
    /// IB segments (CHAINs followed).
    pub segments: u16,
    /// GPU address of the first segment.
    pub first_va: u64,
    /// Dwords in all segments.
    pub dwords: u64,
    /// Record flags ([`FLAG_UNREADABLE`], [`FLAG_CUT`]).
    pub flags: u32,
}

/// Why bytes are not a capture record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// The record runs past the end of the bytes (at this offset).
    Truncated(usize),
    /// An unknown tag at this offset.
    BadTag(usize),
    /// The record's parts do not add up to its length (at this offset).
    BadLength(usize),
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::Truncated(o) => write!(f, "record at byte {o} is truncated"),
            RecordError::BadTag(o) => write!(f, "no record tag at byte {o}"),
            RecordError::BadLength(o) => write!(f, "record at byte {o}: its parts do not match its length"),
        }
    }
}

impl core::error::Error for RecordError {}

/// One record read back.
#[derive(Clone, Copy, Debug)]
pub enum Record<'a> {
    /// A submission.
    Submit(Submission<'a>),
    /// `count` records were dropped or lost here.
    Lost(u64),
}

/// A submission read back from a capture.
#[derive(Clone, Copy, Debug)]
pub struct Submission<'a> {
    /// The queue.
    pub queue: QueueId,
    /// Its fence value.
    pub seqno: Seqno,
    /// Flags ([`FLAG_UNREADABLE`], [`FLAG_CUT`]).
    pub flags: u32,
    waits: &'a [u8],
    segments: &'a [u8],
    nseg: u16,
}

impl<'a> Submission<'a> {
    /// Its waits.
    pub fn waits(&self) -> impl Iterator<Item = FenceId> + 'a {
        self.waits
            .chunks_exact(WAIT_BYTES)
            .map(|w| FenceId { queue: QueueId(w.first().copied().unwrap_or(0)), seqno: Seqno(le64(w, 8)) })
    }

    /// Its IB segments, in execution order: (GPU address, size in dwords,
    /// the stored bytes; empty when the memory was not readable).
    pub fn segments(&self) -> impl Iterator<Item = (u64, u32, &'a [u8])> + 'a {
        let mut rest = self.segments;
        (0..self.nseg).map_while(move |_| {
            let va = le64(rest, 0);
            let ndw = le64(rest, 8) as u32;
            let stored = (le64(rest, 12) as u32 as usize).saturating_mul(4);
            let end = SEGMENT_HEADER.saturating_add(stored);
            let bytes = rest.get(SEGMENT_HEADER..end)?;
            rest = rest.get(end..).unwrap_or(&[]);
            Some((va, ndw, bytes))
        })
    }
}

/// The little-endian u64 at `at` in `b` (missing bytes read as 0).
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(core::array::from_fn(|i| b.get(at.wrapping_add(i)).copied().unwrap_or(0)))
}

/// The records of a capture (the bytes after the file header), in order.
#[derive(Clone, Debug)]
pub struct Records<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Records<'a> {
    /// Records in `bytes`.
    pub const fn new(bytes: &'a [u8]) -> Self {
        Records { bytes, at: 0 }
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        let at = self.at;
        let rest = self.bytes.get(at..).filter(|r| !r.is_empty())?;
        // An error ends the iteration.
        self.at = self.bytes.len();
        let Some(head) = rest.get(..8) else { return Some(Err(RecordError::Truncated(at))) };
        let len = le64(head, 4) as u32 as usize;
        let Some(rec) = rest.get(..len) else { return Some(Err(RecordError::Truncated(at))) };
        let tag = head.get(..4);
        if tag == Some(&LOST_TAG[..]) && len == LOST_BYTES {
            self.at = at.saturating_add(len);
            return Some(Ok(Record::Lost(le64(rec, 8))));
        }
        if tag != Some(&SUBMIT_TAG[..]) || len < RECORD_HEADER {
            return Some(Err(RecordError::BadTag(at)));
        }
        let nw = usize::from(rec.get(9).copied().unwrap_or(0));
        let nseg = le64(rec, 10) as u16;
        let wend = RECORD_HEADER.saturating_add(nw.saturating_mul(WAIT_BYTES));
        let (Some(waits), Some(segments)) = (rec.get(RECORD_HEADER..wend), rec.get(wend..)) else {
            return Some(Err(RecordError::BadLength(at)));
        };
        let s = Submission {
            queue: QueueId(rec.get(8).copied().unwrap_or(0)),
            seqno: Seqno(le64(rec, 16)),
            flags: le64(rec, 12) as u32,
            waits,
            segments,
            nseg,
        };
        // The segments must fill the record exactly.
        let mut used = 0usize;
        let mut rest = segments;
        for _ in 0..nseg {
            let stored = (le64(rest, 12) as u32 as usize).saturating_mul(4);
            let end = SEGMENT_HEADER.saturating_add(stored);
            if rest.len() < end {
                return Some(Err(RecordError::BadLength(at)));
            }
            used = used.saturating_add(end);
            rest = rest.get(end..).unwrap_or(&[]);
        }
        if used != segments.len() {
            return Some(Err(RecordError::BadLength(at)));
        }
        self.at = at.saturating_add(len);
        Some(Ok(Record::Submit(s)))
    }
}

/// Counters of a capture session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureStats {
    /// Submissions recorded (into the ring or the sink).
    pub recorded: u64,
    /// Records the sink (or the ring) refused: lost.
    pub lost: u64,
    /// Records the ring overwrote to make room.
    pub dropped: u64,
    /// Times the ring was emitted with a hang or fault report.
    pub emitted: u64,
}
