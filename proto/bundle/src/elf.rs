//! Just enough of the ELF header to tell whether a file is an executable
//! for this machine: a self-update is refused at publish when its file is
//! no ELF executable at all, and on the node when it is one for another
//! architecture — before anything is replaced.

/// What the header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElfInfo {
    /// `e_machine`.
    pub machine: u16,
}

impl ElfInfo {
    /// The architecture's name as Rust spells it (`std::env::consts::ARCH`),
    /// or the raw number.
    pub fn arch(&self) -> String {
        match arch_of(self.machine) {
            Some(a) => a.to_string(),
            None => format!("machine {}", self.machine),
        }
    }
}

/// Why a file is no ELF executable, or none for this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ElfError {
    #[error("not an ELF executable (no ELF header)")]
    NoHeader,
    #[error("not an ELF executable (byte order {0})")]
    ByteOrder(u8),
    #[error("an ELF file of type {e_type}, not an executable")]
    NotExecutable { e_type: u16 },
    /// An executable for another machine than this node's.
    #[error(
        "an executable for {}, but this node is {}",
        ElfInfo { machine: *.machine }.arch(),
        std::env::consts::ARCH
    )]
    ForeignHost { machine: u16 },
}

const MACHINES: &[(u16, &str)] = &[
    (3, "x86"),
    (40, "arm"),
    (62, "x86_64"),
    (183, "aarch64"),
    (243, "riscv64"),
    (21, "powerpc64"),
    (22, "s390x"),
    (258, "loongarch64"),
];

fn arch_of(machine: u16) -> Option<&'static str> {
    MACHINES.iter().find(|(m, _)| *m == machine).map(|(_, a)| *a)
}

/// `e_machine` of the architecture this program was built for.
pub fn host_machine() -> Option<u16> {
    MACHINES
        .iter()
        .find(|(_, a)| *a == std::env::consts::ARCH)
        .map(|(m, _)| *m)
}

/// Reads the header of an ELF executable (`ET_EXEC` or `ET_DYN`) from its
/// first bytes (64 are enough).
pub fn parse_header(b: &[u8]) -> Result<ElfInfo, ElfError> {
    if b.len() < 20 || &b[..4] != b"\x7fELF" {
        return Err(ElfError::NoHeader);
    }
    let u16_at = |i: usize| match b[5] {
        1 => Ok(u16::from_le_bytes([b[i], b[i + 1]])),
        2 => Ok(u16::from_be_bytes([b[i], b[i + 1]])),
        other => Err(ElfError::ByteOrder(other)),
    };
    let e_type = u16_at(16)?;
    if e_type != 2 && e_type != 3 {
        return Err(ElfError::NotExecutable { e_type });
    }
    Ok(ElfInfo { machine: u16_at(18)? })
}

/// Checks that `b` starts an ELF executable for this machine.
pub fn check_for_host(b: &[u8]) -> Result<ElfInfo, ElfError> {
    let info = parse_header(b)?;
    if Some(info.machine) != host_machine() {
        return Err(ElfError::ForeignHost {
            machine: info.machine,
        });
    }
    Ok(info)
}

/// A 64-byte ELF64 little-endian header of type `e_type` (2: an
/// executable) for `machine` (62 x86_64, 183 aarch64): what the checks
/// above read. For tests and fixtures; it is no program.
pub fn fixture_header(machine: u16, e_type: u16) -> Vec<u8> {
    let mut h = vec![0u8; 64];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = 2;
    h[5] = 1;
    h[16..18].copy_from_slice(&e_type.to_le_bytes());
    h[18..20].copy_from_slice(&machine.to_le_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(machine: u16, e_type: u16) -> Vec<u8> {
        fixture_header(machine, e_type)
    }

    #[test]
    fn this_test_binary_is_for_this_host() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let info = check_for_host(&me[..64]).unwrap();
        assert_eq!(info.arch(), std::env::consts::ARCH);
    }

    #[test]
    fn foreign_and_non_executables_are_named() {
        let foreign = if host_machine() == Some(183) { 62 } else { 183 };
        let e = check_for_host(&header(foreign, 2)).unwrap_err();
        assert_eq!(e, ElfError::ForeignHost { machine: foreign });
        assert_eq!(
            e.to_string(),
            format!(
                "an executable for {}, but this node is {}",
                ElfInfo { machine: foreign }.arch(),
                std::env::consts::ARCH
            )
        );
        assert_eq!(
            parse_header(b"#!/bin/sh\necho hi\n").unwrap_err().to_string(),
            "not an ELF executable (no ELF header)"
        );
        assert_eq!(
            parse_header(&header(62, 1)).unwrap_err().to_string(),
            "an ELF file of type 1, not an executable"
        );
        let mut odd = header(62, 2);
        odd[5] = 7;
        assert_eq!(
            parse_header(&odd).unwrap_err().to_string(),
            "not an ELF executable (byte order 7)"
        );
        assert!(parse_header(b"\x7fELF").is_err());
        assert_eq!(parse_header(&header(243, 3)).unwrap().arch(), "riscv64");
    }
}
