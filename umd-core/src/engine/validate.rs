//! The validation mode: every packet of a submission checked against the
//! device's buffers before the GPU sees it (`docs/architecture.md`,
//! "Validation, fault reports and events": a DMA size that disagrees
//! with the buffer's real size runs past the allocation, faults, and
//! becomes a hang).
//!
//! Compiled in with the `validation` feature and switched on at run time
//! ([`DeviceCore::set_validation`](super::DeviceCore::set_validation)); without the feature no checking code
//! exists and a submission costs what it always did. The error types
//! ([`crate::error::validation`], re-exported here) are always present, so
//! code that matches on [`SubmitError`](crate::error::SubmitError) builds
//! either way.
//!
//! What is checked, for every memory operand of every packet (WRITE_DATA,
//! DMA_COPY, FILL, FENCE, WAIT_MEM, TIMESTAMP, DISPATCH, INDIRECT_BUFFER),
//! following CHAINs through the IB pool:
//!
//! - the range `[addr, addr + len)` does not wrap past the top of the
//!   generation's address space;
//! - it lies inside one buffer of the device, whole; a range that starts in
//!   a buffer and runs past its requested size is an overrun (by how many
//!   bytes), one in no buffer is outside (the nearest buffer is named);
//! - the buffer is live, not freed;
//! - a write does not target a GPU read-only buffer;
//! - a buffer with declared tracking is declared by the submission, and a
//!   write targets one declared for writing (otherwise its free would not
//!   wait for this work).
//!
//! And for every packet, whatever its operands: the queue's engine
//! executes it (`docs/refgpu.md` sections 1 and 4.4: DISPATCH runs on the
//! COMPUTE engine only; GFX and COPY run every other packet). A DISPATCH
//! recorded for the GFX or COPY queue is refused with
//! [`Problem::WrongEngine`], naming the packet and the queue. Without the
//! validation mode the submission is accepted, as the hardware's contract
//! lets it be: the engine stops on the packet with an INVALID_PACKET fault,
//! the fence fails with [`FenceError::Fault`](crate::sync::FenceError::Fault)
//! and the queue is reset (conformance scenario `dispatch_on_wrong_queue`
//! checks both sides on every platform).
//!
//! An IB the caller built ([`DeviceCore::submit_ib`](super::DeviceCore::submit_ib))
//! is walked the same way, through the CPU's view of the buffers it lies
//! in (CHAINs included, each target checked as a read of a live buffer
//! first), and also refused when the GPU would stop on one of its packets
//! (a rule of the generation broken, an INDIRECT_BUFFER inside an IB),
//! when it can not be read (a device-only or mapped buffer), and when its
//! CHAINs loop or hold more than [`MAX_CHAIN_HOPS`] IBs.
//!
//! A refused submission is not executed; the error names the packet (its
//! index in the IB, counting across chained chunks), the field, the
//! address, the buffer and the problem.

use core::fmt;

pub use crate::error::validation::{BufferRef, Problem, ValidationError, MAX_CHAIN_HOPS};

/// The validation mode is not compiled into this build (the `validation`
/// feature of `umd-core`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValidationUnavailable;

impl fmt::Display for ValidationUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "umd-core was built without the validation feature")
    }
}

impl core::error::Error for ValidationUnavailable {}

impl<'d, B: super::Backend, const CHUNKS: usize> super::DeviceCore<'d, B, CHUNKS> {
    /// Switches the validation mode on or off (off by default). Without
    /// the `validation` feature, switching it on is refused.
    pub fn set_validation(&self, on: bool) -> Result<(), ValidationUnavailable> {
        #[cfg(feature = "validation")]
        {
            self.validating.store(on, crate::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
        #[cfg(not(feature = "validation"))]
        {
            if on {
                Err(ValidationUnavailable)
            } else {
                Ok(())
            }
        }
    }

    /// Whether submissions are validated.
    pub fn validation(&self) -> bool {
        #[cfg(feature = "validation")]
        {
            self.validating.load(crate::sync::atomic::Ordering::Relaxed)
        }
        #[cfg(not(feature = "validation"))]
        {
            false
        }
    }
}

#[cfg(feature = "validation")]
mod check {
    use super::{BufferRef, Problem, ValidationError, MAX_CHAIN_HOPS};
    use crate::cmd::{Command, DispatchOp};
    use crate::decode::Decoder;
    use crate::engine::buffers::{BufferAccess, BufferUse};
    use crate::engine::{Backend, DeviceCore};
    use crate::hw::{Field, IbRef, PacketKind};
    use crate::mem::buffer::{BufferInfo, Tracking};
    use crate::mem::manager::Buffers;
    use crate::platform::Platform;
    use crate::sync::QueueId;

    /// Whether the engine of `queue` executes packets of `kind`
    /// (`docs/refgpu.md` section 1: DISPATCH on COMPUTE only).
    fn engine_executes(queue: QueueId, kind: PacketKind) -> bool {
        kind != PacketKind::Dispatch || queue == QueueId::COMPUTE
    }

    /// One memory operand of a packet.
    #[derive(Clone, Copy)]
    struct Operand {
        field: Field,
        addr: u64,
        len: u64,
        write: bool,
    }

    const fn op(field: Field, addr: u64, len: u64, write: bool) -> Option<Operand> {
        Some(Operand { field, addr, len, write })
    }

    /// The memory a command reads and writes (`docs/refgpu.md` section 6).
    fn operands(c: &Command<'_>) -> [Option<Operand>; 3] {
        match *c {
            Command::WriteData { dst, data } => {
                [op(Field::Dst, dst, (data.len() as u64).saturating_mul(4), true), None, None]
            }
            Command::Copy { src, dst, size } => {
                [op(Field::Src, src, size, false), op(Field::Dst, dst, size, true), None]
            }
            Command::Fill { dst, size, .. } => [op(Field::Dst, dst, size, true), None, None],
            Command::Fence { addr, .. } => [op(Field::Addr, addr, 8, true), None, None],
            Command::WaitMem { addr, wide, .. } => {
                [op(Field::Addr, addr, if wide { 8 } else { 4 }, false), None, None]
            }
            Command::Timestamp { addr } => [op(Field::Addr, addr, 8, true), None, None],
            Command::IndirectBuffer { addr, size_dw } => {
                [op(Field::Addr, addr, u64::from(size_dw).saturating_mul(4), false), None, None]
            }
            Command::Dispatch { op: o, a, b, dst, count, .. } => {
                let n = u64::from(count).saturating_mul(4);
                let b = match o {
                    DispatchOp::AddU32 | DispatchOp::MulU32 | DispatchOp::SaxpyF32 => {
                        op(Field::B, b, n, false)
                    }
                };
                [op(Field::A, a, n, false), b, op(Field::Dst, dst, n, true)]
            }
            Command::Nop { .. } | Command::Chain { .. } | Command::Barrier { .. } => [None, None, None],
        }
    }

    fn buffer_ref(i: &BufferInfo) -> BufferRef {
        BufferRef { tag: i.tag, va: i.va, size: i.size }
    }

    impl<'d, B: Backend, const CHUNKS: usize> DeviceCore<'d, B, CHUNKS> {
        /// Checks every packet of the IB at `ib` (in the IB pool), following
        /// CHAINs, against `queue`'s engine, the device's buffers and
        /// `declared`.
        pub(crate) fn validate_ib(
            &self,
            queue: QueueId,
            ib: IbRef,
            declared: &[BufferUse],
        ) -> Result<(), ValidationError> {
            let gen = self.enc.desc().generation;
            let (pool_va, pool_len) = self.ib.range();
            let bytes = self.ib.region().bytes();
            // One lock for the whole walk: buffers can not change under it.
            let mem = self.mem.lock();
            let mut next = Some(ib);
            let mut index = 0u32;
            // Each chunk is visited once; a CHAIN loop would be a recorder bug.
            let mut hops = 0usize;
            while let Some(IbRef { va, dwords: dw }) = next.take() {
                let va = va.get();
                hops = hops.saturating_add(1);
                let undecodable = ValidationError {
                    packet: index,
                    opcode: PacketKind::Chain,
                    field: Field::Addr,
                    addr: va,
                    len: u64::from(dw).saturating_mul(4),
                    problem: Problem::Undecodable,
                };
                let off =
                    va.checked_sub(pool_va).filter(|o| *o < pool_len as u64).ok_or(undecodable)? as usize;
                let end = off.saturating_add((dw as usize).saturating_mul(4));
                let seg =
                    bytes.get(off..end).filter(|_| hops <= CHUNKS.saturating_add(1)).ok_or(undecodable)?;
                for item in Decoder::new(gen, seg, va) {
                    let p = item.result.map_err(|_| ValidationError { packet: index, ..undecodable })?;
                    if let Command::Chain { addr, size_dw } = p.command {
                        next = Some(IbRef::new(addr, size_dw));
                        continue;
                    }
                    if let Command::Nop { .. } = p.command {
                        // Padding the encoder inserted is not counted.
                        continue;
                    }
                    if !engine_executes(queue, p.desc.kind) {
                        return Err(ValidationError {
                            packet: index,
                            opcode: p.desc.kind,
                            field: Field::Op,
                            addr: item.va,
                            len: item.raw.len() as u64,
                            problem: Problem::WrongEngine { queue },
                        });
                    }
                    {
                        for o in operands(&p.command).into_iter().flatten() {
                            self.check_operand(&mem.buffers, o, declared).map_err(|problem| {
                                ValidationError {
                                    packet: index,
                                    opcode: p.desc.kind,
                                    field: o.field,
                                    addr: o.addr,
                                    len: o.len,
                                    problem,
                                }
                            })?;
                        }
                    }
                    index = index.saturating_add(1);
                }
            }
            Ok(())
        }

        /// Checks an IB the caller built (`ib`, for `queue`) and
        /// every IB its CHAINs name, packet by packet as [`DeviceCore::validate_ib`]
        /// does, reading them through the CPU's view of the buffers they lie
        /// in. Each IB must lie whole in one live, CPU-readable, unmapped
        /// buffer (declared if its tracking is declared); the walk visits at
        /// most [`MAX_CHAIN_HOPS`] IBs and refuses a CHAIN back to one it
        /// walked.
        pub(crate) fn validate_caller_ib(
            &self,
            queue: QueueId,
            ib: IbRef,
            declared: &[BufferUse],
        ) -> Result<(), ValidationError> {
            let gen = self.enc.desc().generation;
            // One lock for the whole walk: buffers can not change under it,
            // and no copy or guard can write them meanwhile.
            let mem = self.mem.lock();
            let mut visited = [0u64; MAX_CHAIN_HOPS];
            let mut hops = 0usize;
            let mut next = Some((ib, PacketKind::IndirectBuffer));
            let mut index = 0u32;
            while let Some((IbRef { va, dwords: dw }, opcode)) = next.take() {
                let va = va.get();
                let len = u64::from(dw).saturating_mul(4);
                let refuse = move |problem| ValidationError {
                    packet: index,
                    opcode,
                    field: Field::Addr,
                    addr: va,
                    len,
                    problem,
                };
                if visited.get(..hops).is_some_and(|v| v.contains(&va)) {
                    return Err(refuse(Problem::ChainLoop));
                }
                let slot = visited.get_mut(hops).ok_or(refuse(Problem::ChainTooLong))?;
                *slot = va;
                hops = hops.saturating_add(1);
                let seg = self.caller_ib_bytes(&mem.buffers, va, len, declared).map_err(refuse)?;
                for item in Decoder::new(gen, seg, va) {
                    let p = item.result.map_err(|_| ValidationError {
                        packet: index,
                        opcode,
                        field: Field::Addr,
                        addr: item.va,
                        len: item.raw.len() as u64,
                        problem: Problem::Undecodable,
                    })?;
                    let invalid = match p.command {
                        Command::IndirectBuffer { .. } => Some(None),
                        _ => p.violation.map(Some),
                    };
                    if let Some(violation) = invalid {
                        return Err(ValidationError {
                            packet: index,
                            opcode: p.desc.kind,
                            field: Field::Addr,
                            addr: item.va,
                            len: item.raw.len() as u64,
                            problem: Problem::InvalidPacket { violation },
                        });
                    }
                    match p.command {
                        // What follows a CHAIN in its IB is never run.
                        Command::Chain { addr, size_dw } => {
                            next = Some((IbRef::new(addr, size_dw), PacketKind::Chain));
                            break;
                        }
                        Command::Nop { .. } => continue,
                        _ => {}
                    }
                    if !engine_executes(queue, p.desc.kind) {
                        return Err(ValidationError {
                            packet: index,
                            opcode: p.desc.kind,
                            field: Field::Op,
                            addr: item.va,
                            len: item.raw.len() as u64,
                            problem: Problem::WrongEngine { queue },
                        });
                    }
                    for o in operands(&p.command).into_iter().flatten() {
                        self.check_operand(&mem.buffers, o, declared).map_err(|problem| ValidationError {
                            packet: index,
                            opcode: p.desc.kind,
                            field: o.field,
                            addr: o.addr,
                            len: o.len,
                            problem,
                        })?;
                    }
                    index = index.saturating_add(1);
                }
            }
            Ok(())
        }

        /// The bytes of `len` at `va` as the GPU will fetch them, if they
        /// lie whole in one live buffer the CPU can read and nobody maps.
        /// The CPU cache over them is invalidated first (the GPU may have
        /// written the IB); that discards nothing, as an unmapped buffer has
        /// no dirty line (`docs/memory.md` 3b).
        fn caller_ib_bytes<'m>(
            &self,
            buffers: &'m Buffers<'_, crate::storage::Backed>,
            va: u64,
            len: u64,
            declared: &[BufferUse],
        ) -> Result<&'m [u8], Problem> {
            self.check_operand(
                buffers,
                Operand { field: Field::Addr, addr: va, len, write: false },
                declared,
            )?;
            // (`check_operand` found it live, holding the whole range.)
            let Some((info, Some(h))) = buffers.nearest(va) else { return Err(Problem::Undecodable) };
            let buffer = buffer_ref(&info);
            if buffers.live(h).map_err(|_| Problem::Freed { buffer })?.mapped {
                return Err(Problem::Mapped { buffer });
            }
            let (region, off, _) = buffers.memory(h).map_err(|_| Problem::Unreadable { buffer })?;
            let base = region.cpu_ptr().ok_or(Problem::Unreadable { buffer })?;
            let start = va
                .checked_sub(info.va)
                .and_then(|d| d.checked_add(off))
                .and_then(|s| usize::try_from(s).ok())
                .ok_or(Problem::Unreadable { buffer })?;
            let n = usize::try_from(len).map_err(|_| Problem::Unreadable { buffer })?;
            if start.checked_add(n).is_none_or(|e| e > region.len()) {
                return Err(Problem::Unreadable { buffer });
            }
            self.b.platform().cache_invalidate(region, start, n);
            // SAFETY: `start + n` lies inside the region's CPU mapping
            // (checked), which stays valid while the block lives, and the
            // block lives while `buffers` is borrowed (the memory lock is
            // held by the caller). The range is inside one buffer that no
            // guard maps (checked), so no `&mut` view of it exists, and
            // every CPU copy into a buffer takes the memory lock, so none
            // writes it while the slice lives. The GPU's own accesses are
            // DMA, outside the CPU's memory model; an IB being submitted is
            // not one the GPU still writes.
            Ok(unsafe { core::slice::from_raw_parts(base.as_ptr().add(start), n) })
        }

        fn check_operand(
            &self,
            buffers: &Buffers<'_, crate::storage::Backed>,
            o: Operand,
            declared: &[BufferUse],
        ) -> Result<(), Problem> {
            if o.len == 0 {
                return Ok(());
            }
            // The device's addresses have the generation's width: a range
            // that runs past the top wraps to address 0.
            let top = self.enc.desc().va_limit();
            let end = o.addr.checked_add(o.len).filter(|e| *e <= top).ok_or(Problem::Wraps)?;
            let found = buffers.nearest(o.addr);
            let Some((info, handle)) =
                found.filter(|(i, _)| o.addr >= i.va && o.addr < i.va.saturating_add(i.size))
            else {
                return Err(Problem::Outside { nearest: found.map(|(i, _)| buffer_ref(&i)) });
            };
            let buffer = buffer_ref(&info);
            let Some(handle) = handle else { return Err(Problem::Freed { buffer }) };
            let buf_end = info.va.saturating_add(info.size);
            if end > buf_end {
                return Err(Problem::Overrun { buffer });
            }
            if o.write && info.kind.gpu_read_only {
                return Err(Problem::ReadOnly { buffer });
            }
            if info.tracking == Tracking::Declared {
                let decl = declared.iter().find(|u| u.buffer == handle);
                match decl {
                    None => return Err(Problem::Undeclared { buffer, write: o.write }),
                    Some(u) if o.write && u.access == BufferAccess::Read => {
                        return Err(Problem::Undeclared { buffer, write: true })
                    }
                    Some(_) => {}
                }
            }
            Ok(())
        }
    }
}
