//! Facts about this machine for the `Hello` message.

use lks_proto::arch::Arch;
use lks_proto::pb;
use sysinfo::{Disks, MemoryRefreshKind, RefreshKind, System};

/// The agent's version: the crate's, or what the build set in
/// `LKS_AGENT_VERSION` (a packager's `0.1.0+deb12u1`; the self-update VM
/// test builds a second agent that reports another version this way).
pub const AGENT_VERSION: &str = match option_env!("LKS_AGENT_VERSION") {
    Some(v) => v,
    None => env!("CARGO_PKG_VERSION"),
};

/// Bundle features this agent carries out (`Hello.features`).
pub const FEATURES: &[&str] = &[
    lks_proto::manifest::FEATURE_CERTIFICATES,
    lks_proto::manifest::FEATURE_SELF_UPDATE,
    lks_proto::manifest::FEATURE_MULTI_ARCH,
    lks_proto::manifest::FEATURE_DELTAS,
    lks_proto::manifest::FEATURE_HEAL_STEPS,
    lks_proto::manifest::FEATURE_REBOOT,
];

/// Tests only: the architecture this agent reports and installs files of
/// instead of its own (a Debian name), so one machine can play an arm64
/// node. Never set it on a real node: the node would install binaries it
/// cannot run.
pub const TEST_ONLY_ARCH_ENV: &str = "LKS_AGENT_TEST_ONLY_ARCH";

/// The architecture whose files of a multi-arch bundle this node installs
/// (`NodeFacts.architecture`): the one this agent was built for, which its
/// package shares with the node's userland.
pub fn architecture() -> Option<Arch> {
    static ARCH: std::sync::OnceLock<Option<Arch>> = std::sync::OnceLock::new();
    *ARCH.get_or_init(|| match std::env::var(TEST_ONLY_ARCH_ENV) {
        Ok(v) if !v.is_empty() => match Arch::parse(&v) {
            Ok(a) => {
                tracing::warn!("{TEST_ONLY_ARCH_ENV}={a}: acting as an {a} node (tests only)");
                Some(a)
            }
            Err(e) => {
                tracing::warn!("{TEST_ONLY_ARCH_ENV} ignored: {e}");
                Arch::host()
            }
        },
        _ => Arch::host(),
    })
}

/// Collects hostname, OS, kernel, architecture, CPUs, memory, disks and the
/// boot id. Anything unavailable is left empty rather than failing.
pub fn collect() -> pb::NodeFacts {
    let memory_bytes =
        System::new_with_specifics(RefreshKind::nothing().with_memory(MemoryRefreshKind::everything()))
            .map(|s| s.total_memory())
            .unwrap_or(0);
    let disks = Disks::new_with_refreshed_list()
        .map(|d| {
            d.iter()
                .map(|d| pb::Disk {
                    mount_point: d.mount_point().to_string_lossy().into_owned(),
                    total_bytes: d.total_space(),
                    available_bytes: d.available_space(),
                })
                .collect()
        })
        .unwrap_or_default();
    pb::NodeFacts {
        peer_listen: String::new(),
        architecture: architecture().map(|a| a.to_string()).unwrap_or_default(),
        hostname: System::host_name().unwrap_or_default(),
        os: System::long_os_version().unwrap_or_default(),
        kernel: System::kernel_version().unwrap_or_default(),
        arch: System::cpu_arch(),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get() as u32),
        memory_bytes,
        disks,
        agent_version: AGENT_VERSION.into(),
        boot_id: crate::node::reboot::boot_id(),
        addresses: crate::node::certs::addresses()
            .iter()
            .map(ToString::to_string)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn collects_something() {
        let f = super::collect();
        assert!(f.cpus >= 1);
        assert!(!f.arch.is_empty());
        // The build's architecture by its Debian name (x86_64 → amd64).
        assert_eq!(
            f.architecture,
            lks_proto::arch::Arch::from_rust(std::env::consts::ARCH)
                .unwrap()
                .as_str()
        );
        assert!(super::FEATURES.contains(&"multi-arch"));
        assert!(super::FEATURES.contains(&"heal-steps"));
        assert!(super::FEATURES.contains(&"reboot"));
        assert_eq!(f.agent_version, super::AGENT_VERSION);
    }
}
