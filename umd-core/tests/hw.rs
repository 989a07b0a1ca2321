//! The generation descriptions are internally consistent, and probing the
//! ID register picks the right one.

use umd_core::hw::{probe, ChipId, Generation, Loc, Ndw, PacketKind, ProbeError};

#[test]
fn descriptions_are_consistent() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        let d = gen.desc();
        assert_eq!(d.generation, gen);
        for (i, kind) in PacketKind::ALL.iter().enumerate() {
            let p = d.packet(*kind).unwrap_or_else(|| panic!("{gen} describes {}", kind.name()));
            assert_eq!(d.packets[i].kind, *kind, "{gen}: table order");
            assert_eq!(
                d.by_opcode(p.opcode).map(|q| q.kind),
                Some(*kind),
                "{gen}: opcode {:#x} unique",
                p.opcode
            );
            // Fields never overlap and lie inside the fixed payload / FLAGS.
            let fixed = p.fixed_ndw();
            let mut used = vec![0u32; usize::from(fixed)];
            let mut flags = 0u32;
            for f in p.fields {
                match f.loc {
                    Loc::Flags(b) => {
                        assert!(u32::from(b.shift + b.width) <= u32::from(d.header.flags.width));
                        assert_eq!(flags & b.mask(), 0, "{gen} {}: FLAGS overlap", kind.name());
                        flags |= b.mask();
                    }
                    Loc::Payload { dw, bits } => {
                        assert!(dw < fixed as u8 && bits.shift + bits.width <= 32);
                        assert_eq!(used[usize::from(dw)] & bits.mask(), 0, "{gen} {}: overlap", kind.name());
                        used[usize::from(dw)] |= bits.mask();
                    }
                    Loc::Wide(n) => {
                        assert!(u16::from(n) + 2 <= fixed);
                        for dw in [n, n + 1] {
                            assert_eq!(used[usize::from(dw)], 0, "{gen} {}: overlap", kind.name());
                            used[usize::from(dw)] = u32::MAX;
                        }
                    }
                }
            }
            if let Ndw::Fixed(n) = p.ndw {
                assert!(u32::from(n) <= d.limits.max_ndw);
            }
        }
        // Chunks start IB-aligned; that must imply packet alignment.
        assert_eq!(d.rules.ib_align % d.rules.exec_align, 0);
        assert_eq!(d.rules.ib_align % 4, 0);
        // Header fields do not overlap.
        let h = &d.header;
        let tag = h.tag.map_or(0, |(b, _)| b.mask());
        let fields = [h.opcode.mask(), h.flags.mask(), h.ndw.mask(), tag];
        for (i, a) in fields.iter().enumerate() {
            for b in &fields[i + 1..] {
                assert_eq!(a & b, 0, "{gen}: header fields overlap");
            }
        }
        assert!(d.limits.max_ndw <= h.ndw.max());
    }
}

#[test]
fn probe_picks_the_generation() {
    assert_eq!(probe(0x5247_0103), Ok(ChipId { generation: Generation::Gen1, revision: 3 }));
    assert_eq!(probe(0x5247_0200), Ok(ChipId { generation: Generation::Gen2, revision: 0 }));
    assert_eq!(ChipId { generation: Generation::Gen2, revision: 7 }.id_register(), 0x5247_0207);
}

#[test]
fn probe_rejects_other_devices() {
    assert_eq!(probe(0), Err(ProbeError::NotRefgpu { id: 0 }));
    assert_eq!(probe(0xFFFF_FFFF), Err(ProbeError::NotRefgpu { id: 0xFFFF_FFFF }));
    assert_eq!(probe(0x5247_0300), Err(ProbeError::UnknownGeneration { generation: 3 }));
    assert_eq!(probe(0x5247_0000), Err(ProbeError::UnknownGeneration { generation: 0 }));
    assert!(ProbeError::NotRefgpu { id: 0 }.to_string().contains("not a refgpu"));
}
