//! The bundle manifest: what a bundle version contains and how it activates.
//!
//! Fields are public for reading; anything built from outside input goes
//! through [`Manifest::validate`] (the `TryFrom` conversions and the
//! `bundle.toml` loader call it), which applies every rule of DESIGN §4.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::arch::{self, Arch};
use crate::certs::{CertificateSpec, KubeconfigSpec, MAX_CERTIFICATES, MAX_KUBECONFIGS};
use crate::chunks::Chunks;
use crate::digest::Digest;
use crate::limits::*;
use crate::names::{validate_bundle_name, validate_version};
use crate::path::BundlePath;

mod validate;

pub use crate::rule::ManifestError;
pub use validate::check_paths_disjoint;

/// `Hello.features` of an agent that carries out `[[certificate]]` and
/// `[[kubeconfig]]`.
pub const FEATURE_CERTIFICATES: &str = "certificates";
/// `Hello.features` of an agent that carries out `self_update` bundles.
pub const FEATURE_SELF_UPDATE: &str = "self-update";
/// `Hello.features` of an agent that installs only its own architecture's
/// files of a multi-arch bundle (`arch`, `architectures`).
pub const FEATURE_MULTI_ARCH: &str = "multi-arch";
/// `Hello.features` of an agent that asks for binary deltas
/// (`FindDeltas`) and rebuilds files from them (issue [delta]). Transport
/// only: no bundle needs it.
pub const FEATURE_DELTAS: &str = "deltas";
/// `Hello.features` of an agent that runs a bundle's `on_heal` steps after
/// a heal pass restored one of its files.
pub const FEATURE_HEAL_STEPS: &str = "heal-steps";
/// `Hello.features` of an agent that records a bundle's `reboot =
/// "required"` and reports it, and carries out the server's reboot
/// requests (`DesiredState.reboot`).
pub const FEATURE_REBOOT: &str = "reboot";
/// At most this many entries in `architectures`.
pub const MAX_ARCHITECTURES: usize = 16;

/// One file of a bundle.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileSpec {
    pub path: BundlePath,
    pub digest: Digest,
    pub size: u64,
    /// Permission bits, at most `0o7777`.
    pub mode: u32,
    /// Mirror to fetch the bytes from instead of the control server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Chunk list, for fetching pieces from several sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks: Option<Chunks>,
    /// Only nodes of this architecture install the file; `None`: every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<Arch>,
}

impl FileSpec {
    /// The same file, whatever the chunk list it travels with (a transport
    /// detail: a node that got it without one holds the same bytes).
    pub fn same_content(&self, other: &FileSpec) -> bool {
        self.path == other.path
            && self.digest == other.digest
            && self.size == other.size
            && self.mode == other.mode
            && self.url == other.url
            && self.arch == other.arch
    }

    /// Whether a node of `arch` installs this file.
    pub fn is_for(&self, arch: Arch) -> bool {
        self.arch.is_none_or(|a| a == arch)
    }
}

/// A command run after the files are in place.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Step {
    pub name: String,
    pub run: Vec<String>,
    #[serde(rename = "timeout_ms", with = "crate::duration::millis")]
    pub timeout: Duration,
    /// `on_heal = true`: also run after a heal pass restored a file of the
    /// bundle (before its health check), e.g. to restart the service that
    /// read the drifted file. Absent from records an older agent wrote.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_heal: bool,
}

/// Whether applying a bundle version takes a reboot to take effect
/// (`reboot = "required"` in `bundle.toml`; a kernel, a containerd
/// shim). Absent: it does not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reboot {
    #[default]
    NotRequired,
    Required,
}

impl Reboot {
    pub fn is_required(self) -> bool {
        self == Reboot::Required
    }

    fn is_not_required(&self) -> bool {
        !self.is_required()
    }
}

/// A `reboot` value other than `"required"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a reboot policy; the one value is \"required\" (leave `reboot` out otherwise)")]
pub struct UnknownReboot(pub String);

impl FromStr for Reboot {
    type Err = UnknownReboot;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "required" => Ok(Reboot::Required),
            _ => Err(UnknownReboot(s.to_string())),
        }
    }
}

impl fmt::Display for Reboot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reboot::NotRequired => "not-required",
            Reboot::Required => "required",
        })
    }
}

/// The check that must pass before a bundle version is committed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HealthCheck {
    pub run: Vec<String>,
    #[serde(rename = "timeout_ms", with = "crate::duration::millis")]
    pub timeout: Duration,
    pub retries: u32,
    #[serde(rename = "interval_ms", with = "crate::duration::millis")]
    pub interval: Duration,
}

/// One version of one bundle.
///
/// Serialisable for local records (the agent's state and journal); reading
/// one back applies [`Manifest::validate`], like every other way in.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "UncheckedManifest")]
pub struct Manifest {
    pub name: String,
    pub version: String,
    pub files: Vec<FileSpec>,
    pub steps: Vec<Step>,
    pub health: Option<HealthCheck>,
    /// `[[certificate]]`: keys made on the node, certificates signed by the
    /// cluster CA. The manifest carries the request only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<CertificateSpec>,
    /// `[[kubeconfig]]`: kubeconfigs for the tenant cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubeconfigs: Vec<KubeconfigSpec>,
    /// The files a node made for `certificates` and `kubeconfigs`
    /// (certificate, key, CA, kubeconfig), once it has made them. Local to
    /// the node: never on the wire, never signed — the agent records what
    /// it installed here so that switching, rollback and drift repair treat
    /// them like any other file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub issued: Vec<FileSpec>,
    /// `self_update = true`: the bundle's one file is the agent's own
    /// binary (DESIGN §5).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub self_update: bool,
    /// `architectures = [...]`: the only architectures whose nodes may
    /// hold this bundle. Empty: those its files name, or any if none does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub architectures: Vec<Arch>,
    /// `reboot = "required"`: the node needs a reboot once this version is
    /// applied; only agents with [`FEATURE_REBOOT`] may hold it.
    #[serde(default, skip_serializing_if = "Reboot::is_not_required")]
    pub reboot: Reboot,
}

/// The serde form of a [`Manifest`] before validation.
#[derive(serde::Deserialize)]
struct UncheckedManifest {
    name: String,
    version: String,
    files: Vec<FileSpec>,
    #[serde(default)]
    steps: Vec<Step>,
    #[serde(default)]
    health: Option<HealthCheck>,
    #[serde(default)]
    certificates: Vec<CertificateSpec>,
    #[serde(default)]
    kubeconfigs: Vec<KubeconfigSpec>,
    #[serde(default)]
    issued: Vec<FileSpec>,
    #[serde(default)]
    self_update: bool,
    #[serde(default)]
    architectures: Vec<Arch>,
    #[serde(default)]
    reboot: Reboot,
}

impl TryFrom<UncheckedManifest> for Manifest {
    type Error = ManifestError;

    fn try_from(u: UncheckedManifest) -> Result<Self, Self::Error> {
        let m = Manifest {
            name: u.name,
            version: u.version,
            files: u.files,
            steps: u.steps,
            health: u.health,
            certificates: u.certificates,
            kubeconfigs: u.kubeconfigs,
            issued: u.issued,
            self_update: u.self_update,
            architectures: u.architectures,
            reboot: u.reboot,
        };
        m.validate()?;
        Ok(m)
    }
}

/// Why a node may not hold a multi-arch bundle version; carries the
/// bundle (`name@version`) and the architectures involved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArchRefusal {
    #[error("{bundle} has no files for architecture {arch} (it is for {})", arch::list(.arches))]
    NoFiles {
        bundle: String,
        arch: Arch,
        arches: BTreeSet<Arch>,
    },
    #[error("{bundle} is for {}, and the node reported no architecture", arch::list(.arches))]
    NoneReported { bundle: String, arches: BTreeSet<Arch> },
}

/// What a node must have to hold a bundle version: agent features and one
/// of its architectures. Kept by the rollout controller per version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// `name@version`.
    pub id: String,
    pub features: Vec<&'static str>,
    /// Empty: any architecture.
    pub arches: BTreeSet<Arch>,
}

impl Needs {
    pub fn of(m: &Manifest) -> Needs {
        Needs {
            id: m.id(),
            features: m.required_features(),
            arches: m.arches(),
        }
    }

    /// Whether a node must be judged at all.
    pub fn is_empty(&self) -> bool {
        self.features.is_empty() && self.arches.is_empty()
    }

    /// Why a node of `arch` (`None`: it reported none) may not hold the
    /// version; `None` if it may.
    pub fn arch_refusal(&self, arch: Option<Arch>) -> Option<String> {
        self.arch_mismatch(arch).map(|r| r.to_string())
    }

    /// [`Needs::arch_refusal`] as a value.
    pub fn arch_mismatch(&self, arch: Option<Arch>) -> Option<ArchRefusal> {
        if self.arches.is_empty() {
            return None;
        }
        match arch {
            Some(a) if self.arches.contains(&a) => None,
            Some(a) => Some(ArchRefusal::NoFiles {
                bundle: self.id.clone(),
                arch: a,
                arches: self.arches.clone(),
            }),
            None => Some(ArchRefusal::NoneReported {
                bundle: self.id.clone(),
                arches: self.arches.clone(),
            }),
        }
    }

    /// Why a node whose agent announced `features` and reported `arch`
    /// fails at its turn: a missing feature first (an older agent would
    /// drop the entries it does not know), then its architecture. The
    /// words of `rollout status` and `rollout start --dry-run`.
    pub fn node_refusal(&self, features: &[String], arch: Option<Arch>) -> Option<String> {
        if let Some(f) = self.features.iter().find(|f| !features.iter().any(|h| h == *f)) {
            return Some(format!(
                "its agent does not announce the {f:?} feature {} needs (an older agent \
                 would drop those entries); update the agent first",
                self.id
            ));
        }
        self.arch_refusal(arch)
    }
}

impl Manifest {
    /// `name@version`.
    pub fn id(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }

    /// Sum of all file sizes.
    pub fn total_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// The files to install: the bundle's own and those the node made.
    pub fn all_files(&self) -> impl Iterator<Item = &FileSpec> {
        self.files.iter().chain(&self.issued)
    }

    /// The paths the node makes the bytes of: every certificate, key, CA
    /// and kubeconfig path (a CA path shared by several certificates once).
    pub fn generated_paths(&self) -> BTreeSet<&BundlePath> {
        self.certificates
            .iter()
            .flat_map(|c| c.paths())
            .chain(self.kubeconfigs.iter().map(|k| &k.path))
            .collect()
    }

    /// Every path this bundle owns on a node: its files and the generated ones.
    pub fn owned_paths(&self) -> Vec<&BundlePath> {
        let mut v: Vec<&BundlePath> = self.files.iter().map(|f| &f.path).collect();
        v.extend(self.generated_paths());
        v
    }

    /// The manifest as published: without what a node made.
    pub fn requested(&self) -> Manifest {
        Manifest {
            issued: Vec::new(),
            ..self.clone()
        }
    }

    /// The same bundle version as `published`, ignoring what the node made.
    pub fn same_request(&self, published: &Manifest) -> bool {
        self.name == published.name
            && self.version == published.version
            && self.files.len() == published.files.len()
            && self
                .files
                .iter()
                .zip(&published.files)
                .all(|(a, b)| a.same_content(b))
            && self.steps == published.steps
            && self.health == published.health
            && self.certificates == published.certificates
            && self.kubeconfigs == published.kubeconfigs
            && self.self_update == published.self_update
            && self.architectures == published.architectures
            && self.reboot == published.reboot
    }

    /// Whether files differ by architecture or the bundle is limited to
    /// some: only agents with [`FEATURE_MULTI_ARCH`] may hold it.
    pub fn is_multi_arch(&self) -> bool {
        !self.architectures.is_empty() || self.files.iter().any(|f| f.arch.is_some())
    }

    /// The architectures whose nodes may hold this bundle: those declared,
    /// else those its files name. Empty: any node (an arch-neutral bundle).
    pub fn arches(&self) -> BTreeSet<Arch> {
        if !self.architectures.is_empty() {
            return self.architectures.iter().copied().collect();
        }
        self.files.iter().filter_map(|f| f.arch).collect()
    }

    /// The variants a node may select: each architecture, or one
    /// arch-neutral variant (`None`).
    fn variants(&self) -> Vec<Option<Arch>> {
        let arches = self.arches();
        if arches.is_empty() {
            vec![None]
        } else {
            arches.into_iter().map(Some).collect()
        }
    }

    /// Why a node of `arch` (`None`: it reported none) may not hold this
    /// bundle; `None` if it may. The same words at the rollout's turn,
    /// in `rollout start --dry-run` and on the node.
    pub fn arch_refusal(&self, arch: Option<Arch>) -> Option<String> {
        Needs::of(self).arch_refusal(arch)
    }

    /// The manifest a node of `arch` installs: the arch-neutral files and
    /// those for `arch`, `architectures` narrowed to `[arch]`. An
    /// arch-neutral bundle is returned as it is. Refused (with
    /// [`Manifest::arch_refusal`]'s reason) when the bundle is not for `arch`.
    pub fn for_arch(&self, arch: Option<Arch>) -> Result<Manifest, ArchRefusal> {
        if !self.is_multi_arch() {
            return Ok(self.clone());
        }
        let needs = Needs::of(self);
        if let Some(why) = needs.arch_mismatch(arch) {
            return Err(why);
        }
        // A multi-arch bundle has architectures, so a node that reported
        // none was refused above.
        let Some(a) = arch else {
            return Err(ArchRefusal::NoneReported {
                bundle: needs.id,
                arches: needs.arches,
            });
        };
        Ok(Manifest {
            files: self.files.iter().filter(|f| f.is_for(a)).cloned().collect(),
            architectures: vec![a],
            ..self.clone()
        })
    }

    /// The agent features (`Hello.features`) a node needs to carry out this
    /// bundle whole: an older agent would drop the fields it does not know.
    pub fn required_features(&self) -> Vec<&'static str> {
        let mut f = Vec::new();
        if !self.certificates.is_empty() || !self.kubeconfigs.is_empty() {
            f.push(FEATURE_CERTIFICATES);
        }
        if self.self_update {
            f.push(FEATURE_SELF_UPDATE);
        }
        if self.is_multi_arch() {
            f.push(FEATURE_MULTI_ARCH);
        }
        if self.has_heal_steps() {
            f.push(FEATURE_HEAL_STEPS);
        }
        if self.reboot.is_required() {
            f.push(FEATURE_REBOOT);
        }
        f
    }

    /// The steps a heal pass runs after restoring a file of this bundle,
    /// in their order.
    pub fn heal_steps(&self) -> impl Iterator<Item = &Step> {
        self.steps.iter().filter(|s| s.on_heal)
    }

    /// Whether a step has `on_heal`: only agents with
    /// [`FEATURE_HEAL_STEPS`] may hold the bundle.
    pub fn has_heal_steps(&self) -> bool {
        self.heal_steps().next().is_some()
    }

    /// The certificate entry whose certificate is at `path`.
    pub fn certificate(&self, path: &BundlePath) -> Option<&CertificateSpec> {
        self.certificates.iter().find(|c| &c.path == path)
    }
}

/// An ed25519 publisher signature over the canonical manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    pub public_key: [u8; 32],
    pub signature: [u8; 64],
}

/// A manifest as distributed: with its publisher signature, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedBundle {
    pub manifest: Manifest,
    pub signature: Option<Signature>,
    /// By the same key over [`crate::canonical::encode_chunks`]; set when
    /// the bundle is signed and a file has a chunk list.
    pub chunks_signature: Option<[u8; 64]>,
}

/// State of one bundle on one node (the `state` field of `node list -o json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BundleState {
    Pending,
    Applying,
    Applied,
    Failed,
    RolledBack,
}

impl BundleState {
    pub fn as_str(self) -> &'static str {
        match self {
            BundleState::Pending => "pending",
            BundleState::Applying => "applying",
            BundleState::Applied => "applied",
            BundleState::Failed => "failed",
            BundleState::RolledBack => "rolled_back",
        }
    }
}

impl fmt::Display for BundleState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A bundle state name that is none of [`BundleState`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown bundle state {0:?}")]
pub struct UnknownBundleState(pub String);

impl FromStr for BundleState {
    type Err = UnknownBundleState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "pending" => BundleState::Pending,
            "applying" => BundleState::Applying,
            "applied" => BundleState::Applied,
            "failed" => BundleState::Failed,
            "rolled_back" => BundleState::RolledBack,
            _ => return Err(UnknownBundleState(s.to_string())),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests;
