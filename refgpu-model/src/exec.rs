//! The memory side of each packet (`docs/refgpu.md` section 6).
//!
//! Every operand access is translated through the engine's
//! [`crate::mmu::Translator`] page by page and then performed on
//! [`crate::mem::SysMem`] with atomics. Rules kept here:
//!
//! - WRITE_DATA, FENCE, TIMESTAMP and WAIT_MEM translate every page they
//!   touch before writing anything, so a fault leaves no effect.
//! - DMA_COPY, FILL and DISPATCH work in chunks and may leave a prefix of
//!   their destination written when they fault, as the spec allows. An
//!   overlapping DMA_COPY with `dst > src` is copied back to front after
//!   checking every page (memmove semantics, no partial effect).
//! - FENCE stores its value with release ordering after all earlier writes;
//!   gen2 misaligned fences arrive here as `dropped` and do nothing.
//! - After a packet that wrote memory, the memory waker is rung so that any
//!   engine in WAIT_MEM re-reads at once.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::dispatch;
use crate::engine::{bus, Engine, Res, Stop, CHUNK};
use crate::error::Access;
use crate::packet::{CompareOp, DispatchOp, Packet};
use crate::regs;

/// WAIT_MEM re-reads this many times (yielding in between) before it
/// starts sleeping on the memory waker.
const WAIT_SPINS: u32 = 64;
/// The longest re-read interval of a WAIT_MEM that nothing wakes.
const WAIT_POLL_MAX: Duration = Duration::from_millis(1);

impl Engine {
    /// Executes one non-IB packet.
    pub(crate) fn exec_packet(&mut self, pkt: Packet, opcode: u8) -> Res<()> {
        match pkt {
            Packet::Nop | Packet::IndirectBuffer { .. } | Packet::Chain { .. } => Ok(()),
            Packet::WriteData { dst, count } => self.write_data(dst, count, opcode),
            Packet::DmaCopy { src, dst, size } => self.dma_copy(src, dst, size, opcode),
            Packet::Fill { dst, size, value } => self.fill(dst, size, value, opcode),
            Packet::Fence { addr, value, irq, dropped } => self.fence(addr, value, irq, dropped, opcode),
            Packet::WaitMem { addr, reference, mask, op, wide } => {
                self.wait_mem(addr, reference, mask, op, wide, opcode)
            }
            Packet::Timestamp { addr } => {
                let t = self.xl(addr, Access::Write, opcode)?;
                let now = self.sh.clock.now_ns();
                self.sh
                    .mem
                    .write_u64(t.pa, now, Ordering::Release)
                    .map_err(|_| bus(addr, Access::Write, opcode))?;
                self.sh.mem_waker.wake();
                Ok(())
            }
            Packet::Barrier { wait_idle, invalidate: _ } => {
                // Every write of this engine is already complete when its
                // packet ends; WAIT_IDLE adds a full fence for visibility.
                // The model keeps no read caches, so INVALIDATE has nothing
                // to discard.
                if wait_idle {
                    crate::mem::full_fence();
                }
                Ok(())
            }
            Packet::Dispatch { op, a, b, dst, count, scalar } => {
                self.dispatch(op, a, b, dst, count, scalar, opcode)
            }
        }
    }

    /// Checks that `[va, va + len)` is accessible for `access` (translating
    /// page by page).
    fn probe(&mut self, va: u64, len: u64, access: Access, opcode: u8) -> Res<()> {
        let mut done = 0u64;
        let mut steps = 0u32;
        while done < len {
            let a = va.wrapping_add(done);
            let t = self.xl(a, access, opcode)?;
            done += t.extent.max(1);
            steps = steps.wrapping_add(1);
            if steps % 4096 == 0 {
                self.check_abort()?;
            }
        }
        Ok(())
    }

    fn write_data(&mut self, dst: u64, count: u32, opcode: u8) -> Res<()> {
        let len = u64::from(count) * 4;
        self.probe(dst, len, Access::Write, opcode)?;
        let buf = std::mem::take(&mut self.buf);
        let data = buf.get(2..2 + count as usize).unwrap_or(&[]);
        let mut i = 0usize;
        let mut result = Ok(());
        while i < data.len() {
            let va = dst + 4 * i as u64;
            let t = match self.xl(va, Access::Write, opcode) {
                Ok(t) => t,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            let n = ((t.extent / 4) as usize).clamp(1, data.len() - i);
            if self.sh.phys(t.pa).write_u32s(t.pa, &data[i..i + n]).is_err() {
                result = Err(bus(va, Access::Write, opcode).into());
                break;
            }
            self.charge(t.pa, 4 * n as u64);
            i += n;
        }
        self.buf = buf;
        self.sh.mem_waker.wake();
        result
    }

    /// Copies `len` (<= CHUNK) bytes from `src` to `dst` through the staging
    /// buffer: the whole source chunk is read before any of it is written.
    fn copy_chunk(&mut self, src: u64, dst: u64, len: usize, opcode: u8) -> Res<()> {
        let mut tmp = std::mem::take(&mut self.tmp);
        let r = self.copy_chunk_with(&mut tmp, src, dst, len, opcode);
        self.tmp = tmp;
        r
    }

    fn copy_chunk_with(&mut self, tmp: &mut [u8], src: u64, dst: u64, len: usize, opcode: u8) -> Res<()> {
        let len = len.min(tmp.len());
        let mut i = 0usize;
        while i < len {
            let va = src + i as u64;
            let t = self.xl(va, Access::Read, opcode)?;
            let n = (t.extent.min((len - i) as u64) as usize).max(1);
            self.sh
                .phys(t.pa)
                .read_bytes(t.pa, &mut tmp[i..i + n])
                .map_err(|_| bus(va, Access::Read, opcode))?;
            self.charge(t.pa, n as u64);
            i += n;
        }
        let mut i = 0usize;
        while i < len {
            let va = dst + i as u64;
            let t = self.xl(va, Access::Write, opcode)?;
            let n = (t.extent.min((len - i) as u64) as usize).max(1);
            self.sh
                .phys(t.pa)
                .write_bytes(t.pa, &tmp[i..i + n])
                .map_err(|_| bus(va, Access::Write, opcode))?;
            self.charge(t.pa, n as u64);
            i += n;
        }
        Ok(())
    }

    fn dma_copy(&mut self, src: u64, dst: u64, size: u64, opcode: u8) -> Res<()> {
        let overlap = src < dst + size && dst < src + size;
        let r = if overlap && dst > src {
            // Back to front, after checking every page so that a fault has
            // no effect.
            self.probe(src, size, Access::Read, opcode)?;
            self.probe(dst, size, Access::Write, opcode)?;
            let mut end = size;
            let mut r = Ok(());
            while end > 0 {
                if let Err(e) = self.check_abort() {
                    r = Err(e);
                    break;
                }
                let n = end.min(CHUNK as u64);
                let start = end - n;
                if let Err(e) = self.copy_chunk(src + start, dst + start, n as usize, opcode) {
                    r = Err(e);
                    break;
                }
                end = start;
            }
            r
        } else {
            let mut done = 0u64;
            let mut r = Ok(());
            while done < size {
                if let Err(e) = self.check_abort() {
                    r = Err(e);
                    break;
                }
                let n = (size - done).min(CHUNK as u64);
                if let Err(e) = self.copy_chunk(src + done, dst + done, n as usize, opcode) {
                    r = Err(e);
                    break;
                }
                done += n;
            }
            r
        };
        self.sh.mem_waker.wake();
        r
    }

    fn fill(&mut self, dst: u64, size: u64, value: u32, opcode: u8) -> Res<()> {
        let mut done = 0u64;
        let mut since_check = 0u64;
        let r = loop {
            if done >= size {
                break Ok(());
            }
            if since_check >= CHUNK as u64 {
                since_check = 0;
                if let Err(e) = self.check_abort() {
                    break Err(e);
                }
            }
            let va = dst + done;
            let t = match self.xl(va, Access::Write, opcode) {
                Ok(t) => t,
                Err(e) => break Err(e),
            };
            let n = t.extent.min(size - done).min(CHUNK as u64) & !3;
            if n == 0 {
                break Err(bus(va, Access::Write, opcode).into());
            }
            if self.sh.phys(t.pa).fill_u32(t.pa, n, value).is_err() {
                break Err(bus(va, Access::Write, opcode).into());
            }
            self.charge(t.pa, n);
            done += n;
            since_check += n;
        };
        self.sh.mem_waker.wake();
        r
    }

    fn fence(&mut self, addr: u64, value: u64, irq: bool, dropped: bool, opcode: u8) -> Res<()> {
        if dropped {
            return Ok(());
        }
        let t = self.xl(addr, Access::Write, opcode)?;
        if self.inj.drop_this_fence() {
            return Ok(());
        }
        self.sh
            .mem
            .write_u64(t.pa, value, Ordering::Release)
            .map_err(|_| bus(addr, Access::Write, opcode))?;
        self.sh.mem_waker.wake();
        if irq {
            self.sh.irq.set_status(regs::irq_fence_bit(self.id));
        }
        Ok(())
    }

    fn read_wait_value(&mut self, addr: u64, wide: bool, opcode: u8) -> Res<u64> {
        let t = self.xl(addr, Access::Read, opcode)?;
        let mem = self.sh.phys(t.pa);
        let v = if wide { mem.read_u64(t.pa) } else { mem.read_u32(t.pa).map(u64::from) };
        v.map_err(|_| bus(addr, Access::Read, opcode).into())
    }

    fn wait_mem(
        &mut self,
        addr: u64,
        reference: u64,
        mask: u64,
        op: CompareOp,
        wide: bool,
        opcode: u8,
    ) -> Res<()> {
        let mut tries = 0u32;
        let mut waiting_since: Option<Instant> = None;
        let r = loop {
            let seen = self.sh.mem_waker.seq();
            let m = match self.read_wait_value(addr, wide, opcode) {
                Ok(m) => m,
                Err(e) => break Err(e),
            };
            if op.holds(m & mask, reference & mask, wide) {
                break Ok(());
            }
            if self.aborting() {
                break Err(Stop::Abort);
            }
            if tries == 0 {
                self.set_waiting(true);
            }
            if tries < WAIT_SPINS {
                tries += 1;
                std::thread::yield_now();
            } else {
                // Re-read at `wait_poll` at first, then at a tenth of the
                // time waited so far, up to WAIT_POLL_MAX: a wait that
                // never holds (a hang) costs little host CPU, and a write
                // nothing wakes is seen within 10 % of the wait's age.
                let since = *waiting_since.get_or_insert_with(Instant::now);
                let interval = self.sh.wait_poll.max((since.elapsed() / 10).min(WAIT_POLL_MAX));
                self.sh.mem_waker.wait(seen, interval);
            }
        };
        self.set_waiting(false);
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &mut self,
        op: DispatchOp,
        a: u64,
        b: u64,
        dst: u64,
        count: u32,
        scalar: u32,
        opcode: u8,
    ) -> Res<()> {
        let count = u64::from(count);
        let mut i = 0u64;
        let r = loop {
            if i >= count {
                break Ok(());
            }
            if let Err(e) = self.check_abort() {
                break Err(e);
            }
            let ta = match self.xl(a + 4 * i, Access::Read, opcode) {
                Ok(t) => t,
                Err(e) => break Err(e),
            };
            let tb = match self.xl(b + 4 * i, Access::Read, opcode) {
                Ok(t) => t,
                Err(e) => break Err(e),
            };
            let td = match self.xl(dst + 4 * i, Access::Write, opcode) {
                Ok(t) => t,
                Err(e) => break Err(e),
            };
            let run = (ta.extent.min(tb.extent).min(td.extent) / 4).clamp(1, count - i).min(CHUNK as u64 / 4);
            let sh = std::sync::Arc::clone(&self.sh);
            let mut err = None;
            for k in 0..run {
                let x = sh.phys(ta.pa).read_u32(ta.pa + 4 * k);
                let y = sh.phys(tb.pa).read_u32(tb.pa + 4 * k);
                let (x, y) = match (x, y) {
                    (Ok(x), Ok(y)) => (x, y),
                    (Err(_), _) => {
                        err = Some(bus(a + 4 * (i + k), Access::Read, opcode));
                        break;
                    }
                    (_, Err(_)) => {
                        err = Some(bus(b + 4 * (i + k), Access::Read, opcode));
                        break;
                    }
                };
                if sh.phys(td.pa).write_u32(td.pa + 4 * k, dispatch::element(op, x, y, scalar)).is_err() {
                    err = Some(bus(dst + 4 * (i + k), Access::Write, opcode));
                    break;
                }
            }
            for pa in [ta.pa, tb.pa, td.pa] {
                self.charge(pa, 4 * run);
            }
            if let Some(f) = err {
                break Err(f.into());
            }
            i += run;
        };
        self.sh.mem_waker.wake();
        r
    }
}
