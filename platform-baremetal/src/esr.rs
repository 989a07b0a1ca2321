//! Decoding of the exception syndrome (ESR_EL1) for the fault report the
//! exception vectors print: exception class, and for aborts the fault
//! status code, access direction and level.

use core::fmt;

/// A decoded ESR_EL1 value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Syndrome(pub u64);

impl Syndrome {
    /// Exception class, `ESR[31:26]`.
    pub fn class(self) -> u8 {
        ((self.0 >> 26) & 0x3f) as u8
    }

    /// Instruction-specific syndrome, `ESR[24:0]`.
    pub fn iss(self) -> u32 {
        (self.0 & 0x1ff_ffff) as u32
    }

    /// Name of the exception class.
    pub fn class_name(self) -> &'static str {
        match self.class() {
            0x00 => "unknown reason",
            0x01 => "WFI/WFE trapped",
            0x07 => "FP/SIMD access trapped (CPACR_EL1.FPEN)",
            0x0e => "illegal execution state",
            0x15 => "SVC",
            0x18 => "MSR/MRS/system instruction trapped",
            0x20 => "instruction abort from a lower EL",
            0x21 => "instruction abort",
            0x22 => "PC alignment fault",
            0x24 => "data abort from a lower EL",
            0x25 => "data abort",
            0x26 => "SP alignment fault",
            0x2c => "floating-point exception",
            0x2f => "SError",
            0x30 | 0x31 => "breakpoint",
            0x32 | 0x33 => "software step",
            0x34 | 0x35 => "watchpoint",
            0x3c => "BRK instruction",
            _ => "other",
        }
    }

    /// Whether this is an instruction or data abort (FAR_EL1 is valid).
    pub fn is_abort(self) -> bool {
        matches!(self.class(), 0x20 | 0x21 | 0x24 | 0x25)
    }

    /// For aborts: the fault status code, `ISS[5:0]`, described.
    pub fn fault_status(self) -> FaultStatus {
        FaultStatus((self.iss() & 0x3f) as u8)
    }

    /// For data aborts: whether the access was a write (WnR).
    pub fn is_write(self) -> bool {
        self.class() & !1 == 0x24 && self.iss() & (1 << 6) != 0
    }
}

/// A data/instruction fault status code (DFSC/IFSC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FaultStatus(pub u8);

impl fmt::Display for FaultStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = self.0 & 3;
        match self.0 & 0x3c {
            0x00 => write!(f, "address size fault, level {level}"),
            0x04 => write!(f, "translation fault, level {level}"),
            0x08 => write!(f, "access flag fault, level {level}"),
            0x0c => write!(f, "permission fault, level {level}"),
            0x10 if self.0 == 0x10 => write!(f, "synchronous external abort"),
            0x20 if self.0 == 0x21 => write!(f, "alignment fault"),
            _ => write!(f, "fault status {:#04x}", self.0),
        }
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EC {:#04x} ({})", self.class(), self.class_name())?;
        if self.is_abort() {
            write!(f, ", {}", self.fault_status())?;
            if self.class() & !1 == 0x24 {
                write!(f, ", {}", if self.is_write() { "write" } else { "read" })?;
            }
        }
        write!(f, ", ISS {:#x}", self.iss())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::string::ToString;

    #[test]
    fn decodes_a_translation_fault_on_write() {
        // EC 0x25, IL, WnR, DFSC 0x05 (translation fault, level 1).
        let s = Syndrome((0x25 << 26) | (1 << 25) | (1 << 6) | 0x05);
        assert!(s.is_abort() && s.is_write());
        assert_eq!(s.to_string(), "EC 0x25 (data abort), translation fault, level 1, write, ISS 0x45");
    }

    #[test]
    fn decodes_alignment_and_other_classes() {
        assert_eq!(Syndrome((0x25 << 26) | 0x21).fault_status().to_string(), "alignment fault");
        assert_eq!(Syndrome(0x07 << 26).class_name(), "FP/SIMD access trapped (CPACR_EL1.FPEN)");
        assert_eq!(Syndrome(0x3c << 26).to_string(), "EC 0x3c (BRK instruction), ISS 0x0");
        assert!(!Syndrome(0x15 << 26).is_abort());
    }
}
