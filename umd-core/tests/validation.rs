//! The validation mode (feature `validation`) on the scripted fake: every
//! class of bad operand refused with the packet, field, buffer and problem
//! named, nothing executed, the queue usable after; correct work passes;
//! off by default. Without the feature, switching it on is refused (the
//! last test, compiled either way).

use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::hw::Generation;
use umd_core::platform::fake::Fake;
use umd_core::storage::DeviceStorage;

type Storage = DeviceStorage<256, 256, 64, 256>;

fn cfg() -> Config {
    Config { ring_bytes: 4096, ib_chunk_bytes: 4096, use_irq: false, ..Config::DEFAULT }
}

fn with_device(f: impl FnOnce(&Device<'_, Fake, 4>)) {
    let fake = Fake::new(Generation::Gen2, 8 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev = Device::<Fake, 4>::new(&fake, &mut storage, cfg(), MmuMode::Bypass).expect("device comes up");
    f(&dev);
}

#[cfg(feature = "validation")]
mod on {
    use super::with_device;
    use umd_core::cmd::{Command, CompareOp, DispatchOp};
    use umd_core::engine::validate::{Problem, ValidationError};
    use umd_core::engine::{BufferUse, Submit};
    use umd_core::error::SubmitError;
    use umd_core::hw::{Field, PacketKind};
    use umd_core::mem::BufferDesc;
    use umd_core::platform::fake::Mode;
    use umd_core::sync::QueueId;

    fn refused(r: Result<umd_core::sync::Fence, SubmitError>) -> ValidationError {
        match r {
            Err(SubmitError::Invalid(e)) => e,
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn every_bad_operand_is_refused_and_nothing_runs() {
        with_device(|dev| {
            assert!(!dev.validation(), "off by default");
            dev.set_validation(true).unwrap();
            dev.platform().state().mode = Mode::Manual;
            let w = dev.alloc(&BufferDesc::new(1000).tag("weights")).unwrap();
            let wv = dev.va(w).unwrap();
            let ro = dev.alloc(&BufferDesc::new(256).gpu_read_only().tag("lut")).unwrap();
            let rov = dev.va(ro).unwrap();
            let gone = dev.alloc(&BufferDesc::new(512).tag("old")).unwrap();
            let gv = dev.va(gone).unwrap();
            // Pin "old" behind an in-flight fence, then free it: freed, not yet recycled.
            let pin = dev.submit(QueueId::COPY, &[], |cb| cb.copy(gv, wv, 4)).unwrap();
            dev.free(gone).unwrap();
            let doorbells = dev.platform().state().doorbells;

            // Overrun: a DMA_COPY longer than its buffer, in the second packet.
            let e = refused(dev.submit(QueueId::COPY, &[], |cb| {
                cb.fill(wv, 16, 0)?;
                cb.copy(wv + 16, wv, 1000)
            }));
            assert_eq!((e.packet, e.opcode, e.field), (1, PacketKind::DmaCopy, Field::Src));
            match e.problem {
                Problem::Overrun { buffer } => {
                    assert_eq!((buffer.tag, buffer.size, e.overrun()), ("weights", 1000, 16))
                }
                p => panic!("{p:?}"),
            }
            assert!(e.to_string().contains("runs 16 bytes past the end of buffer 'weights'"), "{e}");
            // Outside every buffer.
            let e = refused(dev.submit(QueueId::COPY, &[], |cb| cb.write_data(0x7_0000_0000, &[1])));
            assert!(matches!(e.problem, Problem::Outside { .. }), "{e}");
            // Inside a freed buffer.
            let e = refused(dev.submit(QueueId::COPY, &[], |cb| cb.fill(gv, 64, 0)));
            assert!(matches!(e.problem, Problem::Freed { buffer } if buffer.tag == "old"), "{e}");
            // A write to a GPU read-only buffer (reading it is fine).
            let e = refused(dev.submit(QueueId::COPY, &[], |cb| cb.copy(wv, rov, 64)));
            assert_eq!(e.field, Field::Dst);
            assert!(matches!(e.problem, Problem::ReadOnly { buffer } if buffer.tag == "lut"), "{e}");
            // Wrap-around: address + size runs past the top of gen2's 48-bit
            // address space.
            let e = refused(dev.submit(QueueId::COPY, &[], |cb| cb.copy((1 << 48) - 64, wv, 128)));
            assert_eq!(e.problem, Problem::Wraps, "{e}");
            // DISPATCH operands, WAIT_MEM, FENCE, TIMESTAMP.
            let e = refused(dev.submit(QueueId::COMPUTE, &[], |cb| {
                cb.push(&Command::Dispatch {
                    op: DispatchOp::AddU32,
                    a: wv,
                    b: wv,
                    dst: wv + 800,
                    count: 100,
                    scalar_bits: 0,
                })
            }));
            assert_eq!(e.field, Field::Dst);
            assert!(matches!(e.problem, Problem::Overrun { .. }) && e.overrun() == 200, "{e}");
            let e = refused(dev.submit(QueueId::COPY, &[], |cb| {
                cb.push(&Command::WaitMem {
                    addr: wv + 1000,
                    reference: 0,
                    mask: 0xFFFF_FFFF,
                    op: CompareOp::Eq,
                    wide: false,
                })
            }));
            assert!(matches!(e.problem, Problem::Outside { .. } | Problem::Overrun { .. }), "{e}");
            let st = dev.alloc(&BufferDesc::new(12).tag("stamp")).unwrap();
            let sv = dev.va(st).unwrap();
            let e = refused(dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(sv + 8)));
            assert!(
                matches!(e.problem, Problem::Overrun { buffer } if buffer.tag == "stamp") && e.overrun() == 4,
                "{e}"
            );

            assert_eq!(dev.platform().state().doorbells, doorbells, "nothing reached the GPU");
            assert_eq!(dev.pool_stats().recording, 0, "refused recordings gave their chunks back");
            // Correct work passes, and the queue runs.
            let ok = dev.submit(QueueId::COPY, &[], |cb| cb.copy(wv, wv + 500, 500)).unwrap();
            dev.platform().state().run_all();
            dev.wait(pin, 1_000_000_000).unwrap();
            dev.wait(ok, 1_000_000_000).unwrap();
            dev.set_validation(false).unwrap();
            // Off: the same overrun is submitted (the device will deal with it).
            dev.platform().state().mode = Mode::Manual;
            assert!(dev.submit(QueueId::COPY, &[], |cb| cb.copy(wv + 16, wv, 1000)).is_ok());
        });
    }

    #[test]
    fn declared_buffers_must_be_declared_for_what_the_packet_does() {
        with_device(|dev| {
            dev.set_validation(true).unwrap();
            let a = dev.alloc(&BufferDesc::new(4096).declared().tag("a")).unwrap();
            let b = dev.alloc(&BufferDesc::new(4096).declared().tag("b")).unwrap();
            let (av, bv) = (dev.va(a).unwrap(), dev.va(b).unwrap());
            let copy = |cb: &mut umd_core::ibpool::Recorder<'_>| cb.copy(av, bv, 64);
            // Not declared at all.
            let e = refused(dev.submit(QueueId::COPY, &[], copy));
            assert!(
                matches!(e.problem, Problem::Undeclared { buffer, write: false } if buffer.tag == "a"),
                "{e}"
            );
            // The destination declared for reading only.
            let uses = [BufferUse::read(a), BufferUse::read(b)];
            let e = refused(dev.submit_with(&Submit::on(QueueId::COPY).using(&uses), copy));
            assert!(
                matches!(e.problem, Problem::Undeclared { buffer, write: true } if buffer.tag == "b"),
                "{e}"
            );
            // Declared as used.
            let uses = [BufferUse::read(a), BufferUse::write(b)];
            let f = dev.submit_with(&Submit::on(QueueId::COPY).using(&uses), copy).unwrap();
            let r = dev.wait(f, 1_000_000_000);
            assert!(r.is_ok(), "{r:?}: {}", dev.last_hang().map(|h| h.to_string()).unwrap_or_default());
            // A caller-built IB must lie in a live buffer.
            let e = refused(dev.submit_ib(&Submit::on(QueueId::COPY), 0x7_0000_0000, 8));
            assert_eq!(e.opcode, PacketKind::IndirectBuffer);
        });
    }

    /// Encodes `cmds` as an IB whose first dword is at GPU address `at`
    /// (`shift` bytes added to the address the encoder is told, to place
    /// packets where the generation does not allow them).
    fn encode_ib(at: u64, shift: u64, cmds: &[Command<'_>]) -> Vec<u32> {
        let enc = umd_core::cmd::Encoder::new(umd_core::hw::Generation::Gen2);
        let mut out = vec![0u32; 64 * cmds.len().max(1)];
        let mut pos = 0;
        for c in cmds {
            pos += enc.encode(c, &mut out, pos, at + shift).unwrap();
        }
        out.truncate(pos);
        out
    }

    /// Writes `cmds` as an IB at byte `off` of buffer `h`; returns its
    /// address and size in dwords.
    fn put_ib(
        dev: &super::Device<'_, super::Fake, 4>,
        h: umd_core::mem::BufferHandle,
        off: u64,
        cmds: &[Command<'_>],
    ) -> (u64, u64) {
        let at = dev.va(h).unwrap() + off;
        let words = encode_ib(at, 0, cmds);
        dev.write_words(h, off, &words).unwrap();
        (at, words.len() as u64)
    }

    /// The engine rule: DISPATCH recorded for the GFX or COPY queue (whose
    /// engines do not run it, `docs/refgpu.md` section 1) is refused before
    /// submission, naming the packet and the queue, in a recorded IB and in
    /// a caller-built one; on COMPUTE it passes. Off, it is submitted (the
    /// engine would stop on it with INVALID_PACKET).
    #[test]
    fn dispatch_off_the_compute_queue_is_refused_naming_packet_and_queue() {
        with_device(|dev| {
            dev.set_validation(true).unwrap();
            dev.platform().state().mode = Mode::Manual;
            let w = dev.alloc(&BufferDesc::new(4096).tag("data")).unwrap();
            let wv = dev.va(w).unwrap();
            let dispatch = Command::Dispatch {
                op: DispatchOp::AddU32,
                a: wv,
                b: wv + 256,
                dst: wv + 512,
                count: 64,
                scalar_bits: 0,
            };
            let doorbells = dev.platform().state().doorbells;
            for q in [QueueId::GFX, QueueId::COPY] {
                let e = refused(dev.submit(q, &[], |cb| {
                    cb.fill(wv, 16, 0)?;
                    cb.push(&dispatch)
                }));
                assert_eq!((e.packet, e.opcode, e.field), (1, PacketKind::Dispatch, Field::Op), "{e}");
                assert_eq!(e.problem, Problem::WrongEngine { queue: q }, "{e}");
                let text = e.to_string();
                assert!(
                    text.contains("packet 1 (DISPATCH)") && text.contains(&format!("queue {q}")),
                    "{text}"
                );
            }
            // A caller-built IB holding DISPATCH, for the COPY queue.
            let ib = dev.alloc(&BufferDesc::new(4096).tag("ib")).unwrap();
            let (at, n) = put_ib(dev, ib, 0, &[dispatch]);
            let e = refused(dev.submit_ib(&Submit::on(QueueId::COPY), at, n));
            assert_eq!((e.packet, e.problem), (0, Problem::WrongEngine { queue: QueueId::COPY }), "{e}");
            assert_eq!(dev.platform().state().doorbells, doorbells, "nothing refused reached the GPU");
            assert_eq!(dev.pool_stats().recording, 0, "refused recordings gave their chunks back");
            // On COMPUTE the same packet passes, recorded or caller-built.
            assert!(dev.submit(QueueId::COMPUTE, &[], |cb| cb.push(&dispatch)).is_ok());
            assert!(dev.submit_ib(&Submit::on(QueueId::COMPUTE), at, n).is_ok());
            // Off: submitted as the caller asked.
            dev.set_validation(false).unwrap();
            assert!(dev.submit(QueueId::GFX, &[], |cb| cb.push(&dispatch)).is_ok());
        });
    }

    /// A caller-built IB (`submit_ib`) is walked as a recorded one: an
    /// overrunning DMA in it, in the first IB or behind a CHAIN, is refused
    /// with the packet named (counted across the chain) and nothing reaches
    /// the GPU; correct IBs pass and run.
    #[test]
    fn a_caller_built_ib_is_walked_packet_by_packet() {
        with_device(|dev| {
            dev.set_validation(true).unwrap();
            dev.platform().state().mode = Mode::Manual;
            let w = dev.alloc(&BufferDesc::new(1000).tag("weights")).unwrap();
            let wv = dev.va(w).unwrap();
            let ib = dev.alloc(&BufferDesc::new(8192).tag("ib")).unwrap();
            let doorbells = dev.platform().state().doorbells;

            let (at, n) = put_ib(
                dev,
                ib,
                0,
                &[
                    Command::Fill { dst: wv, size: 16, value: 0 },
                    Command::Copy { src: wv + 16, dst: wv, size: 1000 },
                ],
            );
            let e = refused(dev.submit_ib(&Submit::on(QueueId::COPY), at, n));
            assert_eq!((e.packet, e.opcode, e.field), (1, PacketKind::DmaCopy, Field::Src), "{e}");
            assert!(matches!(e.problem, Problem::Overrun { buffer } if buffer.tag == "weights"), "{e}");
            assert_eq!(e.overrun(), 16);

            // Behind a CHAIN: the second IB's first packet is packet 1.
            let (second, n2) = put_ib(dev, ib, 2048, &[Command::Copy { src: wv + 16, dst: wv, size: 1000 }]);
            let (at, n) = put_ib(
                dev,
                ib,
                0,
                &[
                    Command::Fill { dst: wv, size: 16, value: 0 },
                    Command::Chain { addr: second, size_dw: n2 as u32 },
                ],
            );
            let e = refused(dev.submit_ib(&Submit::on(QueueId::COPY), at, n));
            assert_eq!((e.packet, e.opcode, e.field), (1, PacketKind::DmaCopy, Field::Src), "{e}");
            assert_eq!(e.overrun(), 16, "{e}");
            assert_eq!(dev.platform().state().doorbells, doorbells, "nothing reached the GPU");

            // Correct: a FILL, then a CHAIN to a WRITE_DATA; both run.
            let (second, n2) = put_ib(dev, ib, 2048, &[Command::write_data(wv + 64, &[0x5EED])]);
            let (at, n) = put_ib(
                dev,
                ib,
                0,
                &[
                    Command::Fill { dst: wv, size: 64, value: 7 },
                    Command::Chain { addr: second, size_dw: n2 as u32 },
                ],
            );
            let f = dev.submit_ib(&Submit::on(QueueId::COPY), at, n).unwrap();
            dev.platform().state().run_all();
            dev.wait(f, 1_000_000_000).unwrap();
            assert_eq!((dev.read_u32(w, 15), dev.read_u32(w, 16)), (Ok(7), Ok(0x5EED)));

            // Off: the overrunning IB is submitted (the device will fault).
            dev.set_validation(false).unwrap();
            let (at, n) = put_ib(dev, ib, 0, &[Command::Copy { src: wv + 16, dst: wv, size: 1000 }]);
            assert!(dev.submit_ib(&Submit::on(QueueId::COPY), at, n).is_ok());
        });
    }

    /// The walk of a caller-built IB is bounded and every way it can not
    /// go on is a typed refusal: a CHAIN outside every buffer or past its
    /// buffer's end, a CHAIN back to an IB already walked (to itself, or
    /// two IBs to each other), more than `MAX_CHAIN_HOPS` IBs, bytes that
    /// do not decode, a packet the GPU would stop on, an IB in a buffer
    /// the CPU can not read or that is mapped.
    #[test]
    fn a_caller_built_ib_that_can_not_be_walked_is_refused() {
        use umd_core::decode::Violation;
        use umd_core::engine::validate::MAX_CHAIN_HOPS;
        with_device(|dev| {
            dev.set_validation(true).unwrap();
            dev.platform().state().mode = Mode::Manual;
            let w = dev.alloc(&BufferDesc::new(4096).tag("data")).unwrap();
            let wv = dev.va(w).unwrap();
            let ib = dev.alloc(&BufferDesc::new(MAX_CHAIN_HOPS as u64 * 64 + 4096).tag("ib")).unwrap();
            let iv = dev.va(ib).unwrap();
            let doorbells = dev.platform().state().doorbells;
            let chain = |addr, size_dw| Command::Chain { addr, size_dw };

            // A CHAIN outside every buffer, and one running past its end.
            let (at, n) = put_ib(dev, ib, 0, &[chain(0x7_0000_0000, 8)]);
            let e = refused(dev.submit_ib(&Submit::on(QueueId::COPY), at, n));
            assert_eq!((e.opcode, e.addr), (PacketKind::Chain, 0x7_0000_0000), "{e}");
            assert!(matches!(e.problem, Problem::Outside { .. }), "{e}");
            let end = iv + MAX_CHAIN_HOPS as u64 * 64 + 4096;
            let (at, n) = put_ib(dev, ib, 0, &[chain(end - 64, 32)]);
            let e = refused(dev.submit_ib(&Submit::on(QueueId::COPY), at, n));
            assert_eq!(e.opcode, PacketKind::Chain, "{e}");
            assert!(matches!(e.problem, Problem::Overrun { buffer } if buffer.tag == "ib"), "{e}");
            assert_eq!(e.overrun(), 64, "{e}");

            // A CHAIN to itself; two IBs chaining to each other.
            let (at, n) = put_ib(dev, ib, 0, &[chain(iv, 4)]);
            assert_eq!(n, 4);
            let e = refused(dev.submit_ib(&Submit::on(QueueId::COPY), at, n));
            assert_eq!((e.opcode, e.problem), (PacketKind::Chain, Problem::ChainLoop), "{e}");
            put_ib(dev, ib, 64, &[chain(iv, 4)]);
            let (at, n) = put_ib(dev, ib, 0, &[chain(iv + 64, 4)]);
            let e = refused(dev.submit_ib(&Submit::on(QueueId::COPY), at, n));
            assert_eq!((e.addr, e.problem), (iv, Problem::ChainLoop), "{e}");

            // A chain of MAX_CHAIN_HOPS IBs is walked; one more is refused.
            for i in 0..MAX_CHAIN_HOPS as u64 {
                put_ib(dev, ib, 64 * i, &[chain(iv + 64 * (i + 1), 4)]);
            }
            put_ib(dev, ib, 64 * MAX_CHAIN_HOPS as u64, &[Command::write_data(wv, &[1])]);
            let e = refused(dev.submit_ib(&Submit::on(QueueId::COPY), iv, 4));
            assert_eq!((e.addr, e.problem), (iv + 64 * MAX_CHAIN_HOPS as u64, Problem::ChainTooLong), "{e}");
            assert_eq!(dev.platform().state().doorbells, doorbells, "nothing refused reached the GPU");
            let f = dev.submit_ib(&Submit::on(QueueId::COPY), iv + 64, 4).unwrap();
            dev.platform().state().run_all();
            dev.wait(f, 1_000_000_000).unwrap();
            assert_eq!(dev.read_u32(w, 0), Ok(1));
            let doorbells_ok = dev.platform().state().doorbells;

            // Bytes that do not decode.
            dev.write_words(ib, 0, &[0xFFFF_FFFF; 8]).unwrap();
            let e = refused(dev.submit_ib(&Submit::on(QueueId::COPY), iv, 8));
            assert_eq!(e.problem, Problem::Undecodable, "{e}");
            // An INDIRECT_BUFFER inside an IB.
            let (at, n) = put_ib(dev, ib, 0, &[Command::IndirectBuffer { addr: iv + 2048, size_dw: 8 }]);
            let e = refused(dev.submit_ib(&Submit::on(QueueId::COPY), at, n));
            assert_eq!(
                (e.opcode, e.problem),
                (PacketKind::IndirectBuffer, Problem::InvalidPacket { violation: None }),
                "{e}"
            );
            // A FILL whose header is not 32-byte aligned (gen2): a one-dword
            // NOP, then the FILL encoded as if it were at an aligned address.
            let mut nop = [0u32; 1];
            umd_core::cmd::Encoder::new(umd_core::hw::Generation::Gen2).write_nops(&mut nop).unwrap();
            let words = encode_ib(iv + 4, 28, &[Command::Fill { dst: wv, size: 64, value: 0 }]);
            dev.write_words(ib, 0, &nop).unwrap();
            dev.write_words(ib, 4, &words).unwrap();
            let e = refused(dev.submit_ib(&Submit::on(QueueId::COPY), iv, 1 + words.len() as u64));
            assert_eq!(e.opcode, PacketKind::Fill, "{e}");
            assert!(
                matches!(
                    e.problem,
                    Problem::InvalidPacket { violation: Some(Violation::PacketMisaligned { .. }) }
                ),
                "{e}"
            );

            // An IB in a device-only buffer, and in a mapped one.
            let hidden = dev.alloc(&BufferDesc::new(4096).device_only().tag("hidden")).unwrap();
            let e = refused(dev.submit_ib(&Submit::on(QueueId::COPY), dev.va(hidden).unwrap(), 8));
            assert!(matches!(e.problem, Problem::Unreadable { buffer } if buffer.tag == "hidden"), "{e}");
            assert!(e.to_string().contains("can not be validated"), "{e}");
            let (at, n) = put_ib(dev, ib, 0, &[Command::write_data(wv, &[2])]);
            {
                let _m = dev.map(ib).unwrap();
                let e = refused(dev.submit_ib(&Submit::on(QueueId::COPY), at, n));
                assert!(matches!(e.problem, Problem::Mapped { buffer } if buffer.tag == "ib"), "{e}");
            }
            assert_eq!(dev.platform().state().doorbells, doorbells_ok, "nothing refused reached the GPU");
        });
    }
}

#[cfg(not(feature = "validation"))]
#[test]
fn without_the_feature_validation_can_not_be_switched_on() {
    with_device(|dev| {
        assert_eq!(dev.set_validation(true), Err(umd_core::engine::validate::ValidationUnavailable));
        assert!(!dev.validation());
        assert_eq!(dev.set_validation(false), Ok(()));
    });
}

#[test]
fn a_fault_report_names_the_nearest_buffer() {
    use umd_core::debug::NearBuffer;
    let near = |addr| NearBuffer { tag: "weights", serial: 3, va: 0x1000, size: 65536, freed: false, addr };
    assert_eq!(
        near(0x1000 + 65536 + 16).to_string(),
        "16 bytes past buffer 'weights' #3 (65536 bytes at 0x1000)"
    );
    assert_eq!(near(0xff8).to_string(), "8 bytes before buffer 'weights' #3 (65536 bytes at 0x1000)");
    let freed = NearBuffer { freed: true, ..near(0x1010) };
    assert_eq!(freed.to_string(), "16 bytes into freed buffer 'weights' #3 (65536 bytes at 0x1000)");
}
