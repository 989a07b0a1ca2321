//! The whole driver state in one call: [`DeviceCore::dump_state`] writes
//! queues, rings, fences (emitted, completed, failed), pending waits, the
//! IB pool, buffer classes and every live buffer's range, VA and local
//! memory, statistics, the kept hang and fault reports and (with the
//! `capture` feature) the capture session,
//! as text or JSON ([`DumpFormat`]), into any [`core::fmt::Write`]: no
//! heap, and bounded time (every loop runs over a fixed-capacity table).
//!
//! A queue whose submit lock is held elsewhere (the dump may run from a
//! hang handler while a thread is inside a submission) is shown without
//! its hardware state (`"busy": true`); nothing waits for it.

use core::fmt::{self, Write};

use super::{Backend, DeviceCore};

/// The form of a state dump.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpFormat {
    /// Indented `key: value` lines, hang reports with their decoded
    /// command windows.
    Text,
    /// One JSON object.
    Json,
}

/// Escapes a JSON string's characters on their way to `w`.
struct Escape<'a, W: Write + ?Sized>(&'a mut W);

impl<W: Write + ?Sized> Write for Escape<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            match c {
                '"' => self.0.write_str("\\\"")?,
                '\\' => self.0.write_str("\\\\")?,
                '\n' => self.0.write_str("\\n")?,
                c if (c as u32) < 0x20 => write!(self.0, "\\u{:04x}", c as u32)?,
                c => self.0.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// Writes nested objects and lists either as text or as JSON.
struct Out<'w, W: Write + ?Sized> {
    w: &'w mut W,
    json: bool,
    depth: usize,
    /// No member written yet in the innermost JSON object or list.
    first: bool,
}

impl<W: Write + ?Sized> Out<'_, W> {
    fn indent(&mut self) -> fmt::Result {
        for _ in 0..self.depth {
            self.w.write_str("  ")?;
        }
        Ok(())
    }

    fn sep(&mut self) -> fmt::Result {
        if !self.first {
            self.w.write_char(',')?;
        }
        self.first = false;
        Ok(())
    }

    fn key(&mut self, k: &str) -> fmt::Result {
        if self.json {
            self.sep()?;
            write!(self.w, "\"{k}\":")
        } else {
            self.indent()?;
            write!(self.w, "{k}: ")
        }
    }

    /// An object member (`k` empty: a list element).
    fn open(&mut self, k: &str) -> fmt::Result {
        if self.json {
            if k.is_empty() {
                self.sep()?;
            } else {
                self.key(k)?;
            }
            self.w.write_char('{')?;
        } else {
            self.indent()?;
            self.w.write_str(if k.is_empty() { "-" } else { k })?;
            self.w.write_str(if k.is_empty() { "\n" } else { ":\n" })?;
        }
        self.first = true;
        self.depth = self.depth.saturating_add(1);
        Ok(())
    }

    fn list(&mut self, k: &str) -> fmt::Result {
        if self.json {
            self.key(k)?;
            self.w.write_char('[')?;
        } else {
            self.indent()?;
            writeln!(self.w, "{k}:")?;
        }
        self.first = true;
        self.depth = self.depth.saturating_add(1);
        Ok(())
    }

    fn close(&mut self, list: bool) -> fmt::Result {
        self.depth = self.depth.saturating_sub(1);
        self.first = false;
        if self.json {
            self.w.write_char(if list { ']' } else { '}' })?;
        }
        Ok(())
    }

    fn num(&mut self, k: &str, v: u64) -> fmt::Result {
        self.key(k)?;
        write!(self.w, "{v}")?;
        self.eol()
    }

    fn hex(&mut self, k: &str, v: u64) -> fmt::Result {
        self.key(k)?;
        if self.json {
            write!(self.w, "{v}")?;
        } else {
            write!(self.w, "{v:#x}")?;
        }
        self.eol()
    }

    fn flag(&mut self, k: &str, v: bool) -> fmt::Result {
        self.key(k)?;
        write!(self.w, "{v}")?;
        self.eol()
    }

    fn text(&mut self, k: &str, v: impl fmt::Display) -> fmt::Result {
        self.key(k)?;
        if self.json {
            self.w.write_char('"')?;
            write!(Escape(&mut *self.w), "{v}")?;
            self.w.write_char('"')?;
        } else {
            write!(self.w, "{v}")?;
        }
        self.eol()
    }

    fn null(&mut self, k: &str) -> fmt::Result {
        self.key(k)?;
        self.w.write_str(if self.json { "null" } else { "-" })?;
        self.eol()
    }

    fn eol(&mut self) -> fmt::Result {
        if self.json {
            Ok(())
        } else {
            self.w.write_char('\n')
        }
    }
}

impl<'d, B: Backend, const CHUNKS: usize> DeviceCore<'d, B, CHUNKS> {
    /// Writes the whole driver state into `w` as text or JSON (see the
    /// module docs of [`crate::engine::dump`]).
    ///
    /// ```
    /// # use umd_core::engine::dump::DumpFormat;
    /// # fn show<B: umd_core::engine::Backend>(dev: &umd_core::engine::DeviceCore<'_, B>) {
    /// let mut text = heapless::String::<16384>::new();
    /// // A writer that runs out of room answers `fmt::Error`; the device
    /// // is not changed by a dump.
    /// let _ = dev.dump_state(&mut text, DumpFormat::Text);
    /// # }
    /// ```
    pub fn dump_state<W: Write + ?Sized>(&self, w: &mut W, format: DumpFormat) -> fmt::Result {
        let mut o = Out { w, json: format == DumpFormat::Json, depth: 0, first: true };
        if o.json {
            o.w.write_char('{')?;
        }
        self.dump_device(&mut o)?;
        self.dump_queues(&mut o)?;
        self.dump_memory(&mut o)?;
        self.dump_stats(&mut o)?;
        self.dump_hangs(&mut o, format)?;
        #[cfg(feature = "capture")]
        self.dump_capture(&mut o)?;
        if o.json {
            o.w.write_str("}\n")?;
        }
        Ok(())
    }

    fn dump_device<W: Write + ?Sized>(&self, o: &mut Out<'_, W>) -> fmt::Result {
        let chip = self.b.chip();
        o.open("device")?;
        o.num("id", u64::from(self.id.0))?;
        o.num("generation", u64::from(chip.generation.number()))?;
        o.num("revision", u64::from(chip.revision))?;
        o.text("mode", if B::MODE == super::Mode::Direct { "direct" } else { "kernel" })?;
        o.flag("mmu", self.b.translates())?;
        o.flag("lost", self.is_lost())?;
        o.num("queues", self.nq as u64)?;
        o.close(false)
    }

    fn dump_queues<W: Write + ?Sized>(&self, o: &mut Out<'_, W>) -> fmt::Result {
        o.list("queues")?;
        for (qi, q) in self.queues.iter().enumerate().take(self.nq) {
            let (emitted, completed) = (q.emitted(), q.completed());
            o.open("")?;
            o.num("queue", qi as u64)?;
            o.num("emitted", emitted.0)?;
            o.num("completed", completed.0)?;
            o.num("pending", emitted.distance(completed).max(0) as u64)?;
            o.num("processed", q.processed.load(crate::sync::atomic::Ordering::Acquire))?;
            o.num("batch_held", self.held_count(q))?;
            o.list("failed")?;
            let mut res = Ok(());
            let acked = q.failures(&mut |r| {
                res = res.and_then(|()| {
                    o.open("")?;
                    o.num("after", r.after.0)?;
                    o.num("upto", r.upto.0)?;
                    o.text("error", r.error)?;
                    o.close(false)
                });
            });
            res?;
            o.close(true)?;
            o.num("acknowledged", acked.0)?;
            match q.submit.try_lock() {
                Some(qs) => {
                    let hw = self.b.queue_state(&qs, qi);
                    drop(qs);
                    o.flag("busy", false)?;
                    match hw.ring {
                        Some(r) => {
                            o.open("ring")?;
                            o.hex("va", r.va)?;
                            o.num("size", r.size as u64)?;
                            o.hex("wptr", r.wptr as u64)?;
                            o.hex("wptr_published", r.published as u64)?;
                            o.hex("rptr_seen", r.rptr_seen as u64)?;
                            match r.rptr {
                                Some(v) => o.hex("rptr", u64::from(v))?,
                                None => o.null("rptr")?,
                            }
                            o.close(false)?;
                        }
                        None => o.null("ring")?,
                    }
                    if let Some((held, ctx)) = hw.held {
                        o.num("held", held as u64)?;
                        o.flag("context", ctx)?;
                    }
                }
                None => o.flag("busy", true)?,
            }
            o.close(false)?;
        }
        o.close(true)?;
        // Every pending submission's waits on other queues.
        o.list("waits")?;
        let deps = self.deps.lock();
        let mut res = Ok(());
        let _: Option<()> = deps.find_waiter(|consumer, producer| {
            res = res.and_then(|()| {
                o.open("")?;
                o.text("waiter", consumer)?;
                o.text("on", producer)?;
                o.flag("signalled", producer.is_signalled_by(self.completed_of(producer.queue)))?;
                o.close(false)
            });
            None
        });
        drop(deps);
        res?;
        o.close(true)
    }

    fn dump_memory<W: Write + ?Sized>(&self, o: &mut Out<'_, W>) -> fmt::Result {
        let pool = self.ib.stats();
        let (va, bytes) = self.ib.range();
        o.open("ib_pool")?;
        o.hex("va", va)?;
        o.num("bytes", bytes as u64)?;
        o.num("chunks", CHUNKS as u64)?;
        o.num("free", pool.free as u64)?;
        o.num("recording", pool.recording as u64)?;
        o.num("in_flight", pool.in_flight as u64)?;
        o.num("open", pool.open as u64)?;
        o.close(false)?;
        let mem = self.mem.lock();
        let b = mem.buffers.stats();
        let vs = mem.va.get().map(crate::mem::va::VaAllocator::stats);
        let local = mem.local.is_active().then(|| mem.local.usage());
        drop(mem);
        o.open("buffers")?;
        o.num("live", b.live)?;
        o.num("live_bytes", b.live_bytes)?;
        o.num("waiting", b.waiting)?;
        o.num("waiting_bytes", b.waiting_bytes)?;
        o.num("capacity", b.capacity)?;
        o.num("deferred_frees", b.deferred_frees)?;
        o.num("immediate_frees", b.immediate_frees)?;
        o.num("slabs", b.pool.slabs)?;
        o.num("slab_capacity", b.pool.slab_capacity)?;
        o.list("classes")?;
        for (name, c) in ["small", "medium", "large"].iter().zip(b.pool.classes.iter()) {
            o.open("")?;
            o.text("class", name)?;
            o.num("live", c.live)?;
            o.num("requested", c.requested)?;
            o.num("reserved", c.reserved)?;
            o.num("high_water", c.high_water)?;
            o.num("backed", c.backed)?;
            o.close(false)?;
        }
        o.close(true)?;
        // Every live buffer with its address range, to match a fault's or
        // a packet's address against (under the memory lock, as the
        // capture ring and the hang log are written under theirs).
        o.list("list")?;
        let mut res = Ok(());
        self.mem.lock().buffers.leak_report(|e| {
            res = res.and_then(|()| {
                o.open("")?;
                o.num("serial", e.info.serial)?;
                o.text("tag", e.info.tag)?;
                o.hex("va", e.info.va)?;
                o.num("size", e.info.size)?;
                o.hex("end", e.info.va.saturating_add(e.info.size))?;
                o.close(false)
            });
        });
        res?;
        o.close(true)?;
        o.close(false)?;
        match vs {
            Some(v) => {
                o.open("va")?;
                o.num("arena", v.arena)?;
                o.num("used", v.used)?;
                o.num("free", v.free)?;
                o.num("largest_free", v.largest_free)?;
                o.close(false)?;
            }
            None => o.null("va")?,
        }
        match local {
            Some((size, used)) => {
                o.open("local_memory")?;
                o.num("size", size)?;
                o.num("used", used)?;
                o.close(false)?;
            }
            None => o.null("local_memory")?,
        }
        Ok(())
    }

    fn dump_stats<W: Write + ?Sized>(&self, o: &mut Out<'_, W>) -> fmt::Result {
        let s = self.stats();
        o.open("stats")?;
        for (k, v) in [
            ("submissions", s.submissions),
            ("fences_signalled", s.fences_signalled),
            ("hangs", s.hangs),
            ("faults", s.faults),
            ("resets", s.resets),
            ("propagated_failures", s.propagated_failures),
            ("ring_wraps", s.ring_wraps),
            ("doorbells", s.doorbells),
            ("pool_waits", s.pool_waits),
            ("dep_waits", s.dep_waits),
            ("irq_status_acks", s.irq_status_acks),
            ("wait_ns", s.wait_ns),
            ("pte_writes", s.pte_writes),
            ("tlb_invalidations", s.tlb_invalidations),
            ("evictions", s.evictions),
            ("restores", s.restores),
            ("bytes_moved", s.bytes_moved),
            ("thrash_events", s.thrash_events),
            ("restores_deferred", s.restores_deferred),
            ("local_fallbacks", s.local_fallbacks),
            ("history_merges", s.history_merges),
        ] {
            o.num(k, v)?;
        }
        o.close(false)
    }

    fn dump_hangs<W: Write + ?Sized>(&self, o: &mut Out<'_, W>, format: DumpFormat) -> fmt::Result {
        let log = self.last_hang.lock();
        o.open("hangs")?;
        o.num("total", log.total())?;
        o.num("kept", log.iter().count() as u64)?;
        o.num("capacity", log.capacity() as u64)?;
        o.list("reports")?;
        for r in log.iter() {
            o.open("")?;
            o.num("queue", u64::from(r.queue.0))?;
            o.num("at_ns", r.at_ns)?;
            o.text("reason", r.reason)?;
            o.text("kind", if r.reason.fault().is_some() { "fault" } else { "hang" })?;
            o.num("emitted", r.emitted.0)?;
            o.num("completed", r.completed.0)?;
            o.hex("rptr", u64::from(r.rptr))?;
            o.hex("wptr", u64::from(r.wptr))?;
            o.hex("cur_addr", r.cur_addr)?;
            match r.near {
                Some(n) => o.text("near", n)?,
                None => o.null("near")?,
            }
            if format == DumpFormat::Text {
                // The report as a hang handler prints it, windows decoded.
                write!(o.w, "{r}")?;
            }
            o.close(false)?;
        }
        o.close(true)?;
        o.close(false)
    }

    #[cfg(feature = "capture")]
    fn dump_capture<W: Write + ?Sized>(&self, o: &mut Out<'_, W>) -> fmt::Result {
        let s = self.capture_stats();
        let st = self.capture.lock();
        o.open("capture")?;
        o.flag("running", st.session.is_some())?;
        o.num("recorded", s.recorded)?;
        o.num("lost", s.lost)?;
        o.num("dropped", s.dropped)?;
        o.num("emitted", s.emitted)?;
        o.list("ring")?;
        let mut res = Ok(());
        if let Some(r) = st.session.as_ref().and_then(|c| c.ring.as_deref()) {
            r.summaries(&mut |m| {
                res = res.and_then(|()| {
                    o.open("")?;
                    o.text("fence", crate::sync::FenceId { queue: m.queue, seqno: m.seqno })?;
                    o.hex("ib", m.first_va)?;
                    o.num("dwords", m.dwords)?;
                    o.num("segments", u64::from(m.segments))?;
                    o.list("waits")?;
                    for w in m.waits.iter().take(usize::from(m.nwaits)) {
                        if o.json {
                            o.sep()?;
                            write!(o.w, "\"{w}\"")?;
                        } else {
                            o.indent()?;
                            writeln!(o.w, "- {w}")?;
                        }
                    }
                    o.close(true)?;
                    o.close(false)
                });
            });
        }
        res?;
        o.close(true)?;
        o.close(false)
    }
}

/// The examples of `docs/capture-and-dump.md`, run as doc tests (they use
/// the `capture` feature and the scripted fake).
#[cfg(all(doctest, feature = "capture"))]
#[doc = include_str!("../../../docs/capture-and-dump.md")]
struct CaptureAndDumpGuide;
