//! Command-stream capture (feature `capture`) on the scripted fake: every
//! committed IB with its CHAINs followed, its queue, fence and waits, into
//! a stream sink, a RAM ring, hex lines, or a flight recorder emitted with
//! a hang report; filters by queue; a full ring drops the oldest, a failing
//! sink loses records, and submission goes on either way.

use std::sync::{Arc, Mutex};

use umd_core::cmd::{Command, Encoder};
use umd_core::config::Config;
use umd_core::debug::capture::{
    parse_file, Capture, CaptureRing, CaptureSink, HexLines, Record, Records, SinkError, Submission,
    CAPTURE_VERSION,
};
use umd_core::decode::{Decoder, StreamFile, STREAM_HEADER_LEN};
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::dump::DumpFormat;
use umd_core::engine::Submit;
use umd_core::error::WaitError;
use umd_core::hw::Generation;
use umd_core::platform::fake::{EngineFault, Fake};
use umd_core::storage::DeviceStorage;
use umd_core::sync::{FenceError, FenceId, QueueId};

type Storage = DeviceStorage<256, 256, 64, 256>;

fn cfg() -> Config {
    Config { ring_bytes: 4096, ib_chunk_bytes: 4096, use_irq: false, ..Config::DEFAULT }
}

/// A sink into a shared byte vector, failing once it holds `limit` bytes
/// (a full disk).
#[derive(Clone, Default)]
struct VecSink {
    bytes: Arc<Mutex<Vec<u8>>>,
    limit: Option<usize>,
}

impl CaptureSink for VecSink {
    fn write(&mut self, b: &[u8]) -> Result<(), SinkError> {
        let mut v = self.bytes.lock().unwrap();
        if self.limit.is_some_and(|l| v.len() + b.len() > l) {
            return Err(SinkError);
        }
        v.extend_from_slice(b);
        Ok(())
    }
}

fn leak<T>(t: T) -> &'static mut T {
    Box::leak(Box::new(t))
}

fn device(gen: Generation) -> Device<'static, Fake, 4> {
    let fake = leak(Fake::new(gen, 8 << 20));
    let storage: &'static mut Storage = Box::leak(Box::default());
    Device::new(fake, storage, cfg(), MmuMode::Bypass).expect("device comes up")
}

fn submissions(capture: &[u8]) -> Vec<Submission<'_>> {
    let (_, records) = parse_file(capture).expect("a capture header");
    assert_eq!(u32::from_le_bytes(capture[4..8].try_into().unwrap()), CAPTURE_VERSION);
    assert!(StreamFile::parse(capture).is_err(), "not a version 1 stream");
    Records::new(records)
        .filter_map(|r| match r.expect("well-formed records") {
            Record::Submit(s) => Some(s),
            Record::Lost(_) => None,
        })
        .collect()
}

/// The packets of a captured submission, CHAINs followed.
fn packets(gen: Generation, s: &Submission<'_>) -> Vec<String> {
    let mut out = Vec::new();
    for (va, ndw, bytes) in s.segments() {
        assert_eq!(bytes.len(), ndw as usize * 4, "the whole segment was captured");
        for item in Decoder::new(gen, bytes, va) {
            out.push(item.result.map(|p| p.desc.kind.name().to_string()).unwrap_or_default());
        }
    }
    out
}

#[test]
fn every_submission_is_captured_in_order_with_its_fence_waits_and_chained_ib() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        let dev = device(gen);
        let sink = leak(VecSink::default());
        let bytes = sink.bytes.clone();
        assert!(dev.start_capture(Capture::to_sink(sink)).is_none());
        let a = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
        // 600 packets of 3+ dwords: more than one 4 KiB chunk, so chained.
        let b = dev
            .submit(QueueId::COMPUTE, &[a], |cb| (0..600).try_for_each(|i| cb.timestamp(0x8030_0000 + 8 * i)))
            .unwrap();
        let c = dev.submit(QueueId::COPY, &[a, b], |cb| cb.timestamp(0x8030_0010)).unwrap();
        dev.wait(c, 1_000_000_000).unwrap();
        let capture = bytes.lock().unwrap().clone();
        let subs = submissions(&capture);
        let ids: Vec<FenceId> = subs.iter().map(|s| FenceId { queue: s.queue, seqno: s.seqno }).collect();
        assert_eq!(ids, [a.id, b.id, c.id]);
        let waits: Vec<Vec<FenceId>> = subs.iter().map(|s| s.waits().collect()).collect();
        assert_eq!(waits, [vec![], vec![a.id], vec![a.id, b.id]]);
        assert!(subs[1].segments().count() >= 2, "the CHAIN was followed");
        let p = packets(gen, &subs[1]);
        assert_eq!(p.iter().filter(|k| *k == "TIMESTAMP").count(), 600, "{gen}: {p:?}");
        assert_eq!(dev.capture_stats().recorded, 3);
        assert_eq!(dev.capture_stats().lost, 0);
        assert!(dev.stop_capture().is_some());
        // Stopped: nothing more is recorded.
        dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
        assert_eq!(bytes.lock().unwrap().len(), capture.len());
    }
}

#[test]
fn a_queue_filter_captures_only_its_queues() {
    let dev = device(Generation::Gen1);
    let ring = leak(CaptureRing::<8192, 16>::new());
    dev.start_capture(Capture::to_ring(ring).queues(1 << QueueId::COMPUTE.0));
    for q in [QueueId::GFX, QueueId::COMPUTE, QueueId::COPY, QueueId::COMPUTE] {
        dev.submit(q, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    }
    let queues = dev.with_capture(|c| {
        let mut v = Vec::new();
        c.unwrap().ring.as_deref().unwrap().summaries(&mut |s| v.push((s.queue, s.seqno.0)));
        v
    });
    assert_eq!(queues, [(QueueId::COMPUTE, 1), (QueueId::COMPUTE, 2)]);
}

#[test]
fn a_caller_ib_is_captured_through_its_buffer() {
    let dev = device(Generation::Gen2);
    let buf = dev.alloc_buffer(4096).unwrap();
    let va = dev.va(buf).unwrap();
    let enc = Encoder::new(Generation::Gen2);
    let mut words = [0u32; 16];
    let n = enc.encode(&Command::Timestamp { addr: va + 256 }, &mut words, 0, va).unwrap();
    dev.write_words(buf, 0, &words[..n]).unwrap();
    let sink = leak(VecSink::default());
    let bytes = sink.bytes.clone();
    dev.start_capture(Capture::to_sink(sink));
    let f = dev.submit_ib(&Submit::on(QueueId::GFX), va, n as u64).unwrap();
    dev.wait(f, 1_000_000_000).unwrap();
    let capture = bytes.lock().unwrap().clone();
    let subs = submissions(&capture);
    assert_eq!(subs.len(), 1);
    assert_eq!(packets(Generation::Gen2, &subs[0]), ["TIMESTAMP"]);
    assert_eq!(subs[0].flags, 0, "readable, not cut");
}

#[test]
fn a_full_ring_drops_the_oldest_and_counts_them() {
    let dev = device(Generation::Gen1);
    let ring = leak(CaptureRing::<65536, 3>::new());
    dev.start_capture(Capture::to_ring(ring));
    let fences: Vec<_> =
        (0..5).map(|_| dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap()).collect();
    let s = dev.capture_stats();
    assert_eq!((s.recorded, s.dropped, s.lost), (5, 2, 0));
    let c = dev.stop_capture().unwrap();
    let ring = c.ring.unwrap();
    let mut seqnos = Vec::new();
    ring.summaries(&mut |m| seqnos.push(m.seqno));
    assert_eq!(seqnos, fences[2..].iter().map(|f| f.id.seqno).collect::<Vec<_>>());
}

#[test]
fn a_failing_sink_loses_records_but_never_a_submission() {
    let dev = device(Generation::Gen1);
    // Room for the header and about one record: a disk that fills up.
    let sink = leak(VecSink { limit: Some(STREAM_HEADER_LEN + 60), ..VecSink::default() });
    dev.start_capture(Capture::to_sink(sink));
    let mut last = None;
    for i in 0..4 {
        last = Some(dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000 + 8 * i)).unwrap());
    }
    dev.wait(last.unwrap(), 1_000_000_000).unwrap();
    let s = dev.capture_stats();
    assert_eq!(s.recorded + s.lost, 4);
    assert!(s.lost >= 3, "{s:?}");
    assert_eq!(dev.stats().submissions, 4);
}

/// A UART that stalls after `room` characters.
struct Uart {
    out: String,
    room: usize,
}

impl core::fmt::Write for Uart {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        if self.out.len() + s.len() > self.room {
            return Err(core::fmt::Error);
        }
        self.out.push_str(s);
        Ok(())
    }
}

#[test]
fn a_stalled_uart_loses_records_but_never_a_submission() {
    let dev = device(Generation::Gen1);
    let stalled = leak(HexLines::new(Uart { out: String::new(), room: 60 }));
    dev.start_capture(Capture::to_sink(stalled));
    for _ in 0..3 {
        dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    }
    let s = dev.capture_stats();
    assert_eq!(s.recorded, 0, "{s:?}");
    assert_eq!(s.lost, 3, "{s:?}");
}

#[test]
fn hex_lines_decode_back_to_the_capture() {
    let mut ring = CaptureRing::<4096, 8>::new();
    let w = umd_core::debug::capture::RecordWriter::new(QueueId(2), umd_core::sync::Seqno(7), &[]);
    w.write(&mut ring, &[(0x1000, 1, Some(&[0x7000_0000]))]).unwrap();
    let mut hex = HexLines::new(String::new());
    let chip = umd_core::hw::ChipId { generation: Generation::Gen1, revision: 0 };
    ring.emit(chip, &mut hex).unwrap();
    let text = hex.into_inner();
    let bytes: Vec<u8> = text
        .lines()
        .filter_map(|l| l.strip_prefix("rgcs: "))
        .flat_map(|h| (0..h.len()).step_by(2).map(move |i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()))
        .collect();
    let subs = submissions(&bytes);
    assert_eq!((subs[0].queue, subs[0].seqno.0), (QueueId(2), 7));
}

#[test]
fn the_flight_recorder_emits_the_last_submissions_with_a_hang() {
    let dev = device(Generation::Gen1);
    let ring = leak(CaptureRing::<65536, 3>::new());
    let sink = leak(VecSink::default());
    let bytes = sink.bytes.clone();
    dev.start_capture(Capture::flight_recorder(ring, sink));
    // Work that completes, then work that hangs.
    for _ in 0..3 {
        let f = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
        dev.wait(f, 1_000_000_000).unwrap();
    }
    assert!(bytes.lock().unwrap().is_empty(), "nothing before a failure");
    dev.platform().state().engines[2].fault = EngineFault::Stuck;
    let h1 = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0008)).unwrap();
    let h2 = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0010)).unwrap();
    assert_eq!(dev.wait(h2, 10_000_000_000), Err(WaitError::Failed(FenceError::DeviceHung)));
    let capture = bytes.lock().unwrap().clone();
    let lost: Vec<u64> = Records::new(&capture[STREAM_HEADER_LEN..])
        .filter_map(|r| match r.unwrap() {
            Record::Lost(n) => Some(n),
            Record::Submit(_) => None,
        })
        .collect();
    assert_eq!(lost, [2], "two of five overwritten, and said so");
    let ids: Vec<u64> = submissions(&capture).iter().map(|s| s.seqno.0).collect();
    assert_eq!(ids, [3, h1.id.seqno.0, h2.id.seqno.0]);
    assert_eq!(dev.capture_stats().emitted, 1);
    // The state dump lists the ring too.
    let mut json = String::new();
    dev.dump_state(&mut json, DumpFormat::Json).unwrap();
    let j: serde_json::Value = serde_json::from_str(&json).expect(&json);
    assert_eq!(j["capture"]["dropped"], 2, "{json}");
    assert_eq!(j["capture"]["ring"][2]["fence"], h2.id.to_string(), "{json}");
}

#[test]
fn a_record_larger_than_the_ring_is_lost_and_the_ring_kept() {
    let dev = device(Generation::Gen1);
    let ring = leak(CaptureRing::<256, 8>::new());
    dev.start_capture(Capture::to_ring(ring));
    dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    // 100 packets: far more than 256 bytes.
    dev.submit(QueueId::GFX, &[], |cb| (0..100).try_for_each(|i| cb.timestamp(0x8030_0000 + 8 * i))).unwrap();
    let s = dev.capture_stats();
    assert_eq!((s.recorded, s.lost, s.dropped), (1, 1, 0), "{s:?}");
    let kept = dev.with_capture(|c| c.unwrap().ring.as_deref().unwrap().records());
    assert_eq!(kept, 1, "the small record stays");
}
