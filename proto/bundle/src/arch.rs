//! CPU architectures of multi-arch bundles (`arch = "arm64"` on a file,
//! `architectures = [...]` on a bundle) and of nodes (`NodeFacts.architecture`).
//!
//! Names are Debian's (`dpkg --print-architecture`), which are Go's for the
//! architectures Kubernetes ships (amd64, arm64, s390x, riscv64, loong64).
//! Only the names below are accepted, so a bundle cannot name an
//! architecture no node would ever report.

use std::fmt;

/// One architecture: its Debian name, `std::env::consts::ARCH` of a build
/// for it, and the ELF `e_machine` of its executables.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Arch(&'static str);

/// (Debian name, Rust `ARCH`, ELF `e_machine`).
const KNOWN: &[(&str, &str, u16)] = &[
    ("amd64", "x86_64", 62),
    ("arm64", "aarch64", 183),
    ("armhf", "arm", 40),
    ("i386", "x86", 3),
    ("ppc64el", "powerpc64", 21),
    ("s390x", "s390x", 22),
    ("riscv64", "riscv64", 243),
    ("loong64", "loongarch64", 258),
];

/// A name that is none of the known architectures; carries the name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name:?} is not an architecture name; use one of {}", known_names())]
pub struct UnknownArch {
    pub name: String,
}

fn known_names() -> String {
    KNOWN.iter().map(|(n, _, _)| *n).collect::<Vec<_>>().join(", ")
}

/// An ELF executable for another machine than the architecture it was
/// checked against: "an executable for x86_64 (amd64)".
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "an executable for {}{}",
    crate::elf::ElfInfo { machine: *.machine }.arch(),
    Arch::of_machine(*.machine).map_or(String::new(), |a| format!(" ({a})"))
)]
pub struct ForeignExecutable {
    /// The file's `e_machine`.
    pub machine: u16,
}

impl Arch {
    /// Parses a Debian architecture name.
    pub fn parse(s: &str) -> Result<Arch, UnknownArch> {
        KNOWN
            .iter()
            .find(|(n, _, _)| *n == s)
            .map(|(n, _, _)| Arch(n))
            .ok_or_else(|| UnknownArch { name: s.into() })
    }

    pub fn as_str(&self) -> &'static str {
        self.0
    }

    /// The Debian name of `rust_arch` (`std::env::consts::ARCH`).
    pub fn from_rust(rust_arch: &str) -> Option<Arch> {
        KNOWN
            .iter()
            .find(|(_, r, _)| *r == rust_arch)
            .map(|(n, _, _)| Arch(n))
    }

    /// The architecture this program was built for: the one whose files a
    /// node installs (the agent's package matches the node's userland).
    pub fn host() -> Option<Arch> {
        Self::from_rust(std::env::consts::ARCH)
    }

    /// `e_machine` of its ELF executables.
    pub fn elf_machine(&self) -> u16 {
        KNOWN
            .iter()
            .find(|(n, _, _)| *n == self.0)
            .map_or(0, |(_, _, m)| *m)
    }

    /// Whether the first bytes of a file (64 are enough) are fine for this
    /// architecture: anything that is no ELF executable is (configs,
    /// scripts); an ELF executable must be for this machine. The error
    /// says what the file is for.
    pub fn check_elf(&self, head: &[u8]) -> Result<(), ForeignExecutable> {
        match crate::elf::parse_header(head) {
            Ok(info) if info.machine != self.elf_machine() => Err(ForeignExecutable {
                machine: info.machine,
            }),
            _ => Ok(()),
        }
    }

    /// The architecture whose executables have this `e_machine`.
    pub fn of_machine(machine: u16) -> Option<Arch> {
        KNOWN
            .iter()
            .find(|(_, _, m)| *m == machine)
            .map(|(n, _, _)| Arch(n))
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Debug for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Arch({})", self.0)
    }
}

impl std::str::FromStr for Arch {
    type Err = UnknownArch;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Arch::parse(s)
    }
}

impl serde::Serialize for Arch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Arch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Arch::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A list of architectures for messages: `amd64, arm64`.
pub fn list<'a>(arches: impl IntoIterator<Item = &'a Arch>) -> String {
    arches
        .into_iter()
        .map(|a| a.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_names_map_to_debian_names() {
        let cases = [
            ("x86_64", Some("amd64")),
            ("aarch64", Some("arm64")),
            ("arm", Some("armhf")),
            ("x86", Some("i386")),
            ("powerpc64", Some("ppc64el")),
            ("s390x", Some("s390x")),
            ("riscv64", Some("riscv64")),
            ("loongarch64", Some("loong64")),
            ("sparc64", None),
        ];
        for (rust, debian) in cases {
            assert_eq!(Arch::from_rust(rust).map(|a| a.as_str()), debian, "{rust}");
        }
        let host = Arch::host().expect("the test host is a known architecture");
        assert_eq!(Some(host.elf_machine()), crate::elf::host_machine());
    }

    #[test]
    fn only_known_names_parse() {
        assert_eq!(Arch::parse("arm64").unwrap().as_str(), "arm64");
        let e = Arch::parse("aarch64").unwrap_err();
        assert_eq!(e.name, "aarch64");
        assert_eq!(
            e.to_string(),
            "\"aarch64\" is not an architecture name; use one of \
             amd64, arm64, armhf, i386, ppc64el, s390x, riscv64, loong64"
        );
        assert!(Arch::parse("").is_err());
        assert!(Arch::parse("AMD64").is_err());
        #[derive(serde::Deserialize)]
        struct W {
            a: Arch,
        }
        assert_eq!(
            toml::from_str::<W>("a = \"riscv64\"").unwrap().a.as_str(),
            "riscv64"
        );
        assert!(toml::from_str::<W>("a = \"mips\"").is_err());
    }

    fn header(machine: u16) -> Vec<u8> {
        crate::elf::fixture_header(machine, 2)
    }

    #[test]
    fn elf_headers_are_checked_against_the_architecture() {
        let amd64 = Arch::parse("amd64").unwrap();
        let arm64 = Arch::parse("arm64").unwrap();
        amd64.check_elf(&header(62)).unwrap();
        arm64.check_elf(&header(183)).unwrap();
        assert_eq!(
            arm64.check_elf(&header(62)).unwrap_err().to_string(),
            "an executable for x86_64 (amd64)"
        );
        assert_eq!(
            amd64.check_elf(&header(999)).unwrap_err().to_string(),
            "an executable for machine 999"
        );
        amd64.check_elf(b"#!/bin/sh\n").unwrap();
        amd64.check_elf(b"").unwrap();
    }
}
