//! Decoding of the Cortex-M (ARMv7-M) fault status registers for the
//! HardFault report: CFSR (MMFSR, BFSR, UFSR), HFSR, and whether MMFAR and
//! BFAR hold the faulting address. Portable, so the host tests it; the
//! handler that reads the registers is `arch::fault` on the target.

use core::fmt;

/// CFSR bits and their names (ARMv7-M ARM B3.2.15).
const CFSR_BITS: [(u32, &str); 19] = [
    (0, "IACCVIOL (instruction access violation)"),
    (1, "DACCVIOL (data access violation)"),
    (3, "MUNSTKERR (MemManage fault on unstacking)"),
    (4, "MSTKERR (MemManage fault on stacking)"),
    (5, "MLSPERR (MemManage fault on FP lazy state)"),
    (7, "MMARVALID"),
    (8, "IBUSERR (instruction bus error)"),
    (9, "PRECISERR (precise data bus error)"),
    (10, "IMPRECISERR (imprecise data bus error)"),
    (11, "UNSTKERR (bus fault on unstacking)"),
    (12, "STKERR (bus fault on stacking)"),
    (13, "LSPERR (bus fault on FP lazy state)"),
    (15, "BFARVALID"),
    (16, "UNDEFINSTR (undefined instruction)"),
    (17, "INVSTATE (invalid EPSR state, e.g. Thumb bit clear)"),
    (18, "INVPC (invalid EXC_RETURN)"),
    (19, "NOCP (no coprocessor)"),
    (24, "UNALIGNED (unaligned access)"),
    (25, "DIVBYZERO (division by zero)"),
];

/// HFSR bits and their names.
const HFSR_BITS: [(u32, &str); 3] = [
    (1, "VECTTBL (vector table read fault)"),
    (30, "FORCED (a configurable fault escalated)"),
    (31, "DEBUGEVT (debug event)"),
];

/// The fault status registers as read in the handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultStatus {
    /// Configurable Fault Status Register (0xE000_ED28).
    pub cfsr: u32,
    /// HardFault Status Register (0xE000_ED2C).
    pub hfsr: u32,
    /// MemManage Fault Address Register (0xE000_ED34).
    pub mmfar: u32,
    /// BusFault Address Register (0xE000_ED38).
    pub bfar: u32,
}

impl FaultStatus {
    /// The data address of a MemManage fault, when MMFAR is valid.
    pub fn mem_manage_address(&self) -> Option<u32> {
        (self.cfsr & (1 << 7) != 0).then_some(self.mmfar)
    }

    /// The data address of a bus fault, when BFAR is valid.
    pub fn bus_fault_address(&self) -> Option<u32> {
        (self.cfsr & (1 << 15) != 0).then_some(self.bfar)
    }

    /// The fault's class: which of the three CFSR parts has bits set.
    pub fn class(&self) -> &'static str {
        match self.cfsr {
            c if c & 0xFF != 0 => "MemManage fault",
            c if c & 0xFF00 != 0 => "BusFault",
            c if c & 0xFFFF_0000 != 0 => "UsageFault",
            _ if self.hfsr & (1 << 1) != 0 => "vector table read fault",
            _ => "HardFault with no configurable fault recorded",
        }
    }
}

fn names(v: u32, bits: &[(u32, &'static str)], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let mut first = true;
    for (b, n) in bits {
        if v & (1 << b) != 0 {
            write!(f, "{}{n}", if first { "" } else { ", " })?;
            first = false;
        }
    }
    if first {
        write!(f, "none")?;
    }
    Ok(())
}

impl fmt::Display for FaultStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: CFSR {:#010x} [", self.class(), self.cfsr)?;
        names(self.cfsr, &CFSR_BITS, f)?;
        write!(f, "] HFSR {:#010x} [", self.hfsr)?;
        names(self.hfsr, &HFSR_BITS, f)?;
        write!(f, "] MMFAR {:#010x}", self.mmfar)?;
        if self.mem_manage_address().is_none() {
            write!(f, " (not valid)")?;
        }
        write!(f, " BFAR {:#010x}", self.bfar)?;
        if self.bus_fault_address().is_none() {
            write!(f, " (not valid)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::string::ToString;

    #[test]
    fn precise_bus_fault_escalated() {
        let s = FaultStatus { cfsr: 0x8200, hfsr: 0x4000_0000, mmfar: 0xE000_EDF8, bfar: 0x3000_0040 };
        assert_eq!(s.class(), "BusFault");
        assert_eq!(s.bus_fault_address(), Some(0x3000_0040));
        assert_eq!(s.mem_manage_address(), None);
        assert_eq!(
            s.to_string(),
            "BusFault: CFSR 0x00008200 [PRECISERR (precise data bus error), BFARVALID] \
             HFSR 0x40000000 [FORCED (a configurable fault escalated)] MMFAR 0xe000edf8 (not valid) \
             BFAR 0x30000040"
        );
    }

    #[test]
    fn usage_and_memmanage_faults() {
        let u = FaultStatus { cfsr: 1 << 16, hfsr: 1 << 30, mmfar: 0, bfar: 0 };
        assert_eq!(u.class(), "UsageFault");
        assert!(u.to_string().contains("UNDEFINSTR"), "{u}");
        assert!(u.to_string().contains("BFAR 0x00000000 (not valid)"), "{u}");
        let m = FaultStatus { cfsr: 0x82, hfsr: 0, mmfar: 0x10, bfar: 0 };
        assert_eq!((m.class(), m.mem_manage_address()), ("MemManage fault", Some(0x10)));
        let none = FaultStatus { cfsr: 0, hfsr: 0, mmfar: 0, bfar: 0 };
        assert!(none.to_string().contains("CFSR 0x00000000 [none]"), "{none}");
    }
}
