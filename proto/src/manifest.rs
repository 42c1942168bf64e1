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

/// `Hello.features` of an agent that carries out `[[certificate]]` and
/// `[[kubeconfig]]`.
pub const FEATURE_CERTIFICATES: &str = "certificates";
/// `Hello.features` of an agent that carries out `self_update` bundles.
pub const FEATURE_SELF_UPDATE: &str = "self-update";
/// `Hello.features` of an agent that installs only its own architecture's
/// files of a multi-arch bundle (`arch`, `architectures`).
pub const FEATURE_MULTI_ARCH: &str = "multi-arch";
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
        };
        m.validate()?;
        Ok(m)
    }
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
        if self.arches.is_empty() {
            return None;
        }
        match arch {
            Some(a) if self.arches.contains(&a) => None,
            Some(a) => Some(format!(
                "{} has no files for architecture {a} (it is for {})",
                self.id,
                arch::list(&self.arches)
            )),
            None => Some(format!(
                "{} is for {}, and the node reported no architecture",
                self.id,
                arch::list(&self.arches)
            )),
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

/// A rule a manifest broke: `field` is a path such as `file[2].mode`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ManifestError {
    pub field: String,
    pub reason: String,
}

impl ManifestError {
    pub fn new(field: impl Into<String>, reason: impl fmt::Display) -> Self {
        ManifestError {
            field: field.into(),
            reason: reason.to_string(),
        }
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
    pub fn for_arch(&self, arch: Option<Arch>) -> Result<Manifest, String> {
        if !self.is_multi_arch() {
            return Ok(self.clone());
        }
        if let Some(why) = self.arch_refusal(arch) {
            return Err(why);
        }
        let Some(a) = arch else {
            return Err(format!("{} needs the node's architecture", self.id()));
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
        f
    }

    /// The certificate entry whose certificate is at `path`.
    pub fn certificate(&self, path: &BundlePath) -> Option<&CertificateSpec> {
        self.certificates.iter().find(|c| &c.path == path)
    }

    /// Checks every rule of DESIGN §4 and the limits of [`crate::limits`].
    pub fn validate(&self) -> Result<(), ManifestError> {
        validate_bundle_name(&self.name).map_err(|e| ManifestError::new("name", e))?;
        validate_version(&self.version).map_err(|e| ManifestError::new("version", e))?;
        if self.files.len() > MAX_FILES {
            return Err(ManifestError::new(
                "file",
                format!("{} files; the limit is {MAX_FILES}", self.files.len()),
            ));
        }
        let mut total: u64 = 0;
        for (i, f) in self.files.iter().enumerate() {
            let field = |name: &str| format!("file[{i}].{name}");
            if f.mode > 0o7777 {
                return Err(ManifestError::new(
                    field("mode"),
                    format!("{:o} is not a permission mode", f.mode),
                ));
            }
            if f.size > MAX_FILE_SIZE {
                return Err(ManifestError::new(
                    field("size"),
                    format!("{} bytes; the limit is {MAX_FILE_SIZE}", f.size),
                ));
            }
            if f.size == 0 && f.digest != Digest::of(b"") {
                return Err(ManifestError::new(
                    field("size"),
                    format!("0 bytes, but {} is not the digest of an empty file", f.digest),
                ));
            }
            total = total.saturating_add(f.size);
            if let Some(url) = &f.url {
                validate_url(url).map_err(|e| ManifestError::new(field("url"), e))?;
            }
            if let Some(c) = &f.chunks {
                c.validate(f.size, &f.digest)
                    .map_err(|e| ManifestError::new(field("chunks"), e))?;
            }
        }
        if total > MAX_BUNDLE_SIZE {
            return Err(ManifestError::new(
                "file",
                format!("{total} bytes in all; the limit is {MAX_BUNDLE_SIZE}"),
            ));
        }
        self.validate_arches()?;
        self.validate_identity_files()?;
        self.validate_self_update()?;
        if self.steps.len() > MAX_STEPS {
            return Err(ManifestError::new(
                "step",
                format!("{} steps; the limit is {MAX_STEPS}", self.steps.len()),
            ));
        }
        for (i, s) in self.steps.iter().enumerate() {
            if s.name.is_empty() || s.name.len() > MAX_STEP_NAME_LEN || s.name.chars().any(char::is_control) {
                return Err(ManifestError::new(
                    format!("step[{i}].name"),
                    format!("must be 1 to {MAX_STEP_NAME_LEN} printable characters"),
                ));
            }
            validate_argv(&s.run).map_err(|e| ManifestError::new(format!("step[{i}].run"), e))?;
            validate_timeout(s.timeout).map_err(|e| ManifestError::new(format!("step[{i}].timeout"), e))?;
        }
        if let Some(h) = &self.health {
            validate_argv(&h.run).map_err(|e| ManifestError::new("health.run", e))?;
            validate_timeout(h.timeout).map_err(|e| ManifestError::new("health.timeout", e))?;
            if h.retries == 0 || h.retries > MAX_HEALTH_RETRIES {
                return Err(ManifestError::new(
                    "health.retries",
                    format!("must be 1 to {MAX_HEALTH_RETRIES}"),
                ));
            }
            if h.interval > MAX_TIMEOUT {
                return Err(ManifestError::new("health.interval", "longer than 1h"));
            }
        }
        Ok(())
    }
}

impl Manifest {
    /// `architectures` and each file's `arch`: a path is either
    /// arch-neutral or per architecture, and every architecture the bundle
    /// is for has a file for every path that differs by architecture.
    fn validate_arches(&self) -> Result<(), ManifestError> {
        if self.architectures.len() > MAX_ARCHITECTURES {
            return Err(ManifestError::new(
                "architectures",
                format!(
                    "{} entries; the limit is {MAX_ARCHITECTURES}",
                    self.architectures.len()
                ),
            ));
        }
        let mut declared = BTreeSet::new();
        for (i, a) in self.architectures.iter().enumerate() {
            if !declared.insert(*a) {
                return Err(ManifestError::new(
                    format!("architectures[{i}]"),
                    format!("{a} is listed twice"),
                ));
            }
        }
        for (i, f) in self.files.iter().enumerate() {
            if let Some(a) = f.arch
                && !declared.is_empty()
                && !declared.contains(&a)
            {
                return Err(ManifestError::new(
                    format!("file[{i}].arch"),
                    format!(
                        "{a} is not one of the bundle's architectures ({})",
                        arch::list(&declared)
                    ),
                ));
            }
        }
        let mut by_path: std::collections::BTreeMap<&BundlePath, Vec<(usize, Option<Arch>)>> =
            Default::default();
        for (i, f) in self.files.iter().enumerate() {
            by_path.entry(&f.path).or_default().push((i, f.arch));
        }
        let arches = self.arches();
        for (path, files) in &by_path {
            let neutral = files.iter().find(|(_, a)| a.is_none());
            let specific = files.iter().find_map(|(i, a)| a.map(|a| (*i, a)));
            match (neutral, specific) {
                (Some((n, _)), Some((i, a))) => {
                    return Err(ManifestError::new(
                        format!("file[{}].path", n.max(&i)),
                        format!(
                            "{path} is both arch-neutral (file[{n}]) and for {a} (file[{i}]): \
                             give every file of that path an arch, or none"
                        ),
                    ));
                }
                (_, Some((i, has))) => {
                    if let Some(missing) = arches
                        .iter()
                        .find(|a| !files.iter().any(|(_, f)| *f == Some(**a)))
                    {
                        return Err(ManifestError::new(
                            format!("file[{i}].path"),
                            format!(
                                "the bundle is for {missing}, but {path} has no file for it ({has} has one); \
                                 add a file with arch = \"{missing}\""
                            ),
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A self-update carries the agent's binary and nothing else: its
    /// activation is the hand-over to the new agent, its health check that
    /// agent coming back.
    fn validate_self_update(&self) -> Result<(), ManifestError> {
        if !self.self_update {
            return Ok(());
        }
        let err = |field: &str, why: &str| Err(ManifestError::new(field, why));
        // One binary per architecture: what a node selects is one file.
        for a in self.variants() {
            let n = self
                .files
                .iter()
                .filter(|f| a.is_none_or(|a| f.is_for(a)))
                .count();
            if n != 1 {
                let each = a.map_or(String::new(), |a| format!(" for {a}"));
                return err(
                    "file",
                    &format!(
                        "a self_update bundle holds exactly one file{each}, the agent's binary; this one has {n}"
                    ),
                );
            }
        }
        if let Some(i) = self.files.iter().position(|f| f.mode & 0o111 == 0) {
            return err(
                &format!("file[{i}].mode"),
                "the agent's binary must be executable (e.g. \"0755\")",
            );
        }
        if !self.certificates.is_empty() || !self.kubeconfigs.is_empty() {
            return err(
                "certificate",
                "a self_update bundle holds no certificates or kubeconfigs",
            );
        }
        if !self.steps.is_empty() {
            return err(
                "step",
                "a self_update bundle has no steps: its activation is the hand-over",
            );
        }
        if self.health.is_some() {
            return err(
                "health",
                "a self_update bundle has no health check: the new agent must reconnect instead",
            );
        }
        Ok(())
    }

    /// `[[certificate]]`, `[[kubeconfig]]` and the paths of everything.
    fn validate_identity_files(&self) -> Result<(), ManifestError> {
        if self.certificates.len() > MAX_CERTIFICATES {
            return Err(ManifestError::new(
                "certificate",
                format!(
                    "{} entries; the limit is {MAX_CERTIFICATES}",
                    self.certificates.len()
                ),
            ));
        }
        if self.kubeconfigs.len() > MAX_KUBECONFIGS {
            return Err(ManifestError::new(
                "kubeconfig",
                format!(
                    "{} entries; the limit is {MAX_KUBECONFIGS}",
                    self.kubeconfigs.len()
                ),
            ));
        }
        for (i, c) in self.certificates.iter().enumerate() {
            c.validate(&format!("certificate[{i}]"))?;
        }
        for (i, k) in self.kubeconfigs.iter().enumerate() {
            let Some(c) = self.certificate(&k.certificate) else {
                return Err(ManifestError::new(
                    format!("kubeconfig[{i}].certificate"),
                    format!(
                        "{} is not the path of a [[certificate]] of this bundle",
                        k.certificate
                    ),
                ));
            };
            if !c.profile.is_client() {
                return Err(ManifestError::new(
                    format!("kubeconfig[{i}].certificate"),
                    format!(
                        "{} has profile {}; a kubeconfig needs a client certificate",
                        k.certificate, c.profile
                    ),
                ));
            }
        }
        // Every path once: files, then each certificate's paths, then the
        // kubeconfigs. A CA path may be shared by several certificates (one
        // cluster, one CA), nothing else.
        let mut generated: Vec<(String, &BundlePath)> = Vec::new();
        let mut cas: BTreeSet<&BundlePath> = BTreeSet::new();
        for (i, c) in self.certificates.iter().enumerate() {
            generated.push((format!("certificate[{i}].path"), &c.path));
            generated.push((format!("certificate[{i}].key_path"), &c.key_path));
            if let Some(ca) = &c.ca_path
                && cas.insert(ca)
            {
                generated.push((format!("certificate[{i}].ca_path"), ca));
            }
        }
        for (i, k) in self.kubeconfigs.iter().enumerate() {
            generated.push((format!("kubeconfig[{i}].path"), &k.path));
        }
        // What one node installs must be disjoint: per architecture, its
        // files and the neutral ones, then the generated paths.
        for a in self.variants() {
            let mut names: Vec<(String, &BundlePath)> = self
                .files
                .iter()
                .enumerate()
                .filter(|(_, f)| a.is_none_or(|a| f.is_for(a)))
                .map(|(i, f)| (format!("file[{i}].path"), &f.path))
                .collect();
            names.extend(generated.iter().map(|(n, p)| (n.clone(), *p)));
            check_paths_disjoint(names.iter().map(|(_, p)| *p))
                .map_err(|(i, reason)| ManifestError::new(names[i].0.clone(), reason))?;
        }
        let generated = self.generated_paths();
        let mut seen = BTreeSet::new();
        for (i, f) in self.issued.iter().enumerate() {
            if !generated.contains(&f.path) || !seen.insert(&f.path) {
                return Err(ManifestError::new(
                    format!("issued[{i}].path"),
                    format!(
                        "{} is not a certificate, key, CA or kubeconfig path of this bundle",
                        f.path
                    ),
                ));
            }
            if f.mode > 0o7777 || f.url.is_some() {
                return Err(ManifestError::new(format!("issued[{i}]"), "bad mode or a url"));
            }
        }
        Ok(())
    }
}

/// Two files may not share a path, and no file may sit "inside" another
/// (`/etc/a` and `/etc/a/b`). Returns the index of the offending path. The
/// same rule decides whether two bundles may be held by one node.
pub fn check_paths_disjoint<'a>(paths: impl Iterator<Item = &'a BundlePath>) -> Result<(), (usize, String)> {
    let mut seen: BTreeSet<&BundlePath> = BTreeSet::new();
    for (i, p) in paths.enumerate() {
        if seen.contains(p) {
            return Err((i, format!("{p} is listed twice")));
        }
        // Sorted order puts an ancestor right before its descendants, and a
        // descendant right after its ancestor.
        let prev = seen.range::<&BundlePath, _>(..p).next_back();
        let next = seen.range::<&BundlePath, _>(p..).next();
        for other in prev.into_iter().chain(next) {
            if other.is_ancestor_of(p) || p.is_ancestor_of(other) {
                return Err((i, format!("{p} and {other} cannot both be files")));
            }
        }
        seen.insert(p);
    }
    Ok(())
}

fn validate_url(url: &str) -> Result<(), String> {
    if url.len() > MAX_URL_LEN {
        return Err(format!("{} bytes long; the limit is {MAX_URL_LEN}", url.len()));
    }
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(format!("{url:?} is not an http(s) URL"));
    }
    if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!("{url:?} contains whitespace or a control character"));
    }
    Ok(())
}

fn validate_argv(run: &[String]) -> Result<(), String> {
    if run.is_empty() || run[0].is_empty() {
        return Err("needs a command: a non-empty list of arguments".into());
    }
    if run.len() > MAX_ARGS {
        return Err(format!("{} arguments; the limit is {MAX_ARGS}", run.len()));
    }
    for a in run {
        if a.len() > MAX_ARG_LEN {
            return Err(format!(
                "an argument is {} bytes long; the limit is {MAX_ARG_LEN}",
                a.len()
            ));
        }
        if a.contains('\0') {
            return Err("an argument contains a NUL byte".into());
        }
    }
    Ok(())
}

fn validate_timeout(t: Duration) -> Result<(), String> {
    if t.is_zero() {
        return Err("must be longer than zero".into());
    }
    if t > MAX_TIMEOUT {
        return Err("longer than 1h".into());
    }
    Ok(())
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

impl FromStr for BundleState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "pending" => BundleState::Pending,
            "applying" => BundleState::Applying,
            "applied" => BundleState::Applied,
            "failed" => BundleState::Failed,
            "rolled_back" => BundleState::RolledBack,
            _ => return Err(format!("unknown bundle state {s:?}")),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn sample() -> Manifest {
        Manifest {
            name: "kubelet".into(),
            version: "1.29.3-1".into(),
            files: vec![
                FileSpec {
                    chunks: None,
                    arch: None,
                    path: BundlePath::new("/etc/kubernetes/kubelet.conf").unwrap(),
                    digest: Digest::of(b"conf"),
                    size: 4,
                    mode: 0o600,
                    url: None,
                },
                FileSpec {
                    chunks: None,
                    arch: None,
                    path: BundlePath::new("/usr/local/bin/kubelet").unwrap(),
                    digest: Digest::of(b"binary"),
                    size: 6,
                    mode: 0o755,
                    url: Some("https://mirror.internal/kubelet-1.29.3".into()),
                },
            ],
            steps: vec![Step {
                name: "restart kubelet".into(),
                run: vec!["systemctl".into(), "restart".into(), "kubelet".into()],
                timeout: Duration::from_secs(60),
            }],
            health: Some(HealthCheck {
                run: vec!["/usr/local/bin/kubelet-healthy".into()],
                timeout: Duration::from_secs(10),
                retries: 5,
                interval: Duration::from_secs(2),
            }),
            ..Default::default()
        }
    }

    /// `sample()` with a kubelet client and a named server certificate and
    /// a kubeconfig.
    pub fn sample_with_identity() -> Manifest {
        use crate::certs::{CertificateSpec, KubeconfigSpec, Profile};
        let p = |s: &str| BundlePath::new(s).unwrap();
        Manifest {
            certificates: vec![
                CertificateSpec {
                    path: p("/var/lib/kubelet/pki/kubelet-client.crt"),
                    key_path: p("/var/lib/kubelet/pki/kubelet-client.key"),
                    profile: Profile::KubeletClient,
                    common_name: String::new(),
                    organizations: Vec::new(),
                    dns_names: Vec::new(),
                    ip_addresses: Vec::new(),
                    ttl: crate::certs::DEFAULT_TTL,
                    ca_path: Some(p("/etc/kubernetes/pki/ca.crt")),
                },
                CertificateSpec {
                    path: p("/etc/proxy/tls.crt"),
                    key_path: p("/etc/proxy/tls.key"),
                    profile: Profile::Server,
                    common_name: "{node}".into(),
                    organizations: Vec::new(),
                    dns_names: vec!["{node}.proxy".into()],
                    ip_addresses: vec!["10.0.0.1".into()],
                    ttl: Duration::from_secs(3600),
                    ca_path: Some(p("/etc/kubernetes/pki/ca.crt")),
                },
            ],
            kubeconfigs: vec![KubeconfigSpec {
                path: p("/etc/kubernetes/kubelet.conf.d/node.conf"),
                certificate: p("/var/lib/kubelet/pki/kubelet-client.crt"),
            }],
            ..sample()
        }
    }

    #[test]
    fn identity_files_are_validated_with_every_path() {
        let m = sample_with_identity();
        m.validate().unwrap();
        assert_eq!(m.generated_paths().len(), 6, "the shared CA path counts once");
        assert_eq!(m.owned_paths().len(), 8);
        type Case = (fn(&mut Manifest), &'static str);
        let cases: Vec<Case> = vec![
            (
                |m| m.certificates[1].path = m.files[0].path.clone(),
                "certificate[1].path",
            ),
            (
                |m| m.kubeconfigs[0].path = m.certificates[0].key_path.clone(),
                "kubeconfig[0].path",
            ),
            (
                |m| m.certificates[1].ca_path = Some(BundlePath::new("/etc/proxy/tls.crt/ca").unwrap()),
                "certificate[1].ca_path",
            ),
            (
                |m| m.kubeconfigs[0].certificate = BundlePath::new("/nope").unwrap(),
                "kubeconfig[0].certificate",
            ),
            (
                |m| m.kubeconfigs[0].certificate = m.certificates[1].path.clone(),
                "kubeconfig[0].certificate",
            ),
            (
                |m| m.certificates[0].common_name = "x".into(),
                "certificate[0].common_name",
            ),
            (|m| m.issued.push(m.files[0].clone()), "issued[0].path"),
        ];
        for (mutate, field) in cases {
            let mut m = sample_with_identity();
            mutate(&mut m);
            let err = m.validate().expect_err(field);
            assert_eq!(err.field, field, "{err}");
        }
        let mut made = sample_with_identity();
        let mut f = made.files[0].clone();
        f.path = made.certificates[0].key_path.clone();
        made.issued.push(f);
        made.validate().unwrap();
        assert!(made.same_request(&sample_with_identity()));
        assert_eq!(made.requested(), sample_with_identity());
        assert_eq!(made.all_files().count(), 3);
        let text = toml::to_string(&made).unwrap();
        assert_eq!(toml::from_str::<Manifest>(&text).unwrap(), made);
    }

    fn arch(s: &str) -> Arch {
        Arch::parse(s).unwrap()
    }

    /// `sample()` with its binary for amd64 and arm64.
    pub fn sample_multi_arch() -> Manifest {
        let mut m = sample();
        let mut arm = m.files[1].clone();
        m.files[1].arch = Some(arch("amd64"));
        arm.arch = Some(arch("arm64"));
        arm.digest = Digest::of(b"arm binary");
        arm.url = Some("https://mirror.internal/kubelet-1.29.3-arm64".into());
        m.files.push(arm);
        m
    }

    #[test]
    fn each_node_selects_its_variant() {
        let m = sample_multi_arch();
        m.validate().unwrap();
        assert!(m.is_multi_arch() && !sample().is_multi_arch());
        assert_eq!(m.required_features(), vec![FEATURE_MULTI_ARCH]);
        assert!(sample().required_features().is_empty());
        assert_eq!(arch::list(&m.arches()), "amd64, arm64");
        let arm = m.for_arch(Some(arch("arm64"))).unwrap();
        assert_eq!(arm.files.len(), 2);
        assert_eq!(arm.files[1].digest, Digest::of(b"arm binary"));
        assert_eq!(arm.architectures, vec![arch("arm64")]);
        arm.validate().unwrap();
        assert_eq!(
            arm.for_arch(Some(arch("arm64"))).unwrap(),
            arm,
            "selecting again changes nothing"
        );
        assert!(!arm.same_request(&m.for_arch(Some(arch("amd64"))).unwrap()));
        assert_eq!(
            m.for_arch(Some(arch("riscv64"))).unwrap_err(),
            "kubelet@1.29.3-1 has no files for architecture riscv64 (it is for amd64, arm64)"
        );
        assert!(m.for_arch(None).unwrap_err().contains("reported no architecture"));
        // An arch-neutral bundle goes to every node, even one reporting none.
        assert_eq!(sample().for_arch(None).unwrap(), sample());
        assert_eq!(sample().arch_refusal(Some(arch("s390x"))), None);
        // Declared architectures limit a bundle without per-arch files.
        let mut only = sample();
        only.architectures = vec![arch("amd64")];
        only.validate().unwrap();
        assert!(only.for_arch(Some(arch("arm64"))).is_err());
        assert_eq!(only.for_arch(Some(arch("amd64"))).unwrap().files.len(), 2);
        // Records on the node keep the labels.
        let text = toml::to_string(&arm).unwrap();
        assert_eq!(toml::from_str::<Manifest>(&text).unwrap(), arm);
    }

    #[test]
    fn a_node_is_judged_by_its_features_then_its_architecture() {
        let needs = Needs::of(&sample_multi_arch());
        let new = vec![FEATURE_MULTI_ARCH.to_string()];
        assert_eq!(needs.node_refusal(&new, Some(arch("arm64"))), None);
        let old = needs
            .node_refusal(&["certificates".to_string()], Some(arch("arm64")))
            .unwrap();
        assert!(
            old.starts_with("its agent does not announce the \"multi-arch\" feature kubelet@1.29.3-1 needs"),
            "{old}"
        );
        assert_eq!(
            needs.node_refusal(&new, Some(arch("s390x"))).unwrap(),
            "kubelet@1.29.3-1 has no files for architecture s390x (it is for amd64, arm64)"
        );
        assert!(
            needs
                .node_refusal(&new, None)
                .unwrap()
                .contains("reported no architecture")
        );
        let neutral = Needs::of(&sample());
        assert!(neutral.is_empty());
        assert_eq!(
            neutral.node_refusal(&[], None),
            None,
            "old agents keep arch-neutral bundles"
        );
    }

    #[test]
    fn architecture_rules_name_their_field() {
        type Case = (fn(&mut Manifest), &'static str, &'static str);
        let cases: Vec<Case> = vec![
            (
                |m| m.files[2].arch = Some(arch("amd64")),
                "file[2].path",
                "listed twice",
            ),
            (
                |m| m.files[2].arch = None,
                "file[2].path",
                "both arch-neutral (file[2]) and for amd64 (file[1])",
            ),
            (
                |m| m.architectures = vec![arch("amd64"), arch("arm64"), arch("s390x")],
                "file[1].path",
                "the bundle is for s390x, but /usr/local/bin/kubelet has no file for it",
            ),
            (
                |m| m.architectures = vec![arch("amd64")],
                "file[2].arch",
                "arm64 is not one of the bundle's architectures (amd64)",
            ),
            (
                |m| m.architectures = vec![arch("amd64"), arch("arm64"), arch("amd64")],
                "architectures[2]",
                "amd64 is listed twice",
            ),
            (
                |m| {
                    // Another arch-specific path that only amd64 has.
                    let mut f = m.files[1].clone();
                    f.path = BundlePath::new("/usr/local/bin/kubeadm").unwrap();
                    m.files.push(f);
                },
                "file[3].path",
                "the bundle is for arm64, but /usr/local/bin/kubeadm has no file for it (amd64 has one)",
            ),
            (
                |m| {
                    // Nested paths collide within one architecture too.
                    for i in [1, 2] {
                        let mut f = m.files[i].clone();
                        f.path = BundlePath::new("/usr/local/bin/kubelet/x").unwrap();
                        m.files.push(f);
                    }
                },
                "file[3].path",
                "cannot both be files",
            ),
        ];
        for (mutate, field, why) in cases {
            let mut m = sample_multi_arch();
            mutate(&mut m);
            let err = m.validate().expect_err(field);
            assert_eq!(err.field, field, "{err}");
            assert!(err.reason.contains(why), "{err}");
        }
    }

    #[test]
    fn a_self_update_may_carry_one_binary_per_architecture() {
        let mut m = sample_multi_arch();
        m.files.remove(0);
        m.steps.clear();
        m.health = None;
        m.self_update = true;
        m.validate().unwrap();
        m.files.pop();
        m.architectures = vec![arch("amd64"), arch("arm64")];
        let err = m.validate().unwrap_err();
        assert!(err.reason.contains("no file for it"), "{err}");
        let mut two = sample_multi_arch();
        two.steps.clear();
        two.health = None;
        two.self_update = true;
        let err = two.validate().unwrap_err();
        assert!(err.reason.contains("exactly one file for amd64"), "{err}");
    }

    #[test]
    fn sample_is_valid() {
        sample().validate().unwrap();
        assert_eq!(sample().id(), "kubelet@1.29.3-1");
        assert_eq!(sample().total_size(), 10);
    }

    #[test]
    fn each_rule_names_its_field() {
        type Case = (fn(&mut Manifest), &'static str);
        let cases: Vec<Case> = vec![
            (|m| m.name = "Bad".into(), "name"),
            (|m| m.version = String::new(), "version"),
            (|m| m.files[1].mode = 0o10000, "file[1].mode"),
            (|m| m.files[0].size = MAX_FILE_SIZE + 1, "file[0].size"),
            (|m| m.files[0].size = 0, "file[0].size"),
            (|m| m.files[1].url = Some("ftp://x".into()), "file[1].url"),
            (|m| m.files[1].path = m.files[0].path.clone(), "file[1].path"),
            (
                |m| m.files[1].path = BundlePath::new("/etc/kubernetes/kubelet.conf/x").unwrap(),
                "file[1].path",
            ),
            (|m| m.steps[0].run.clear(), "step[0].run"),
            (|m| m.steps[0].name.clear(), "step[0].name"),
            (|m| m.steps[0].timeout = Duration::ZERO, "step[0].timeout"),
            (|m| m.steps[0].run.push("a\0b".into()), "step[0].run"),
            (|m| m.health.as_mut().unwrap().retries = 0, "health.retries"),
            (
                |m| m.health.as_mut().unwrap().timeout = Duration::from_secs(7200),
                "health.timeout",
            ),
        ];
        for (mutate, field) in cases {
            let mut m = sample();
            mutate(&mut m);
            let err = m.validate().expect_err(field);
            assert_eq!(err.field, field, "{err}");
        }
    }

    #[test]
    fn serde_round_trip_validates_on_the_way_in() {
        let m = sample();
        let text = toml::to_string(&m).unwrap();
        assert!(text.contains("timeout_ms = 60000"), "{text}");
        assert_eq!(toml::from_str::<Manifest>(&text).unwrap(), m);
        let bad = text.replace("name = \"kubelet\"", "name = \"Kubelet\"");
        let err = toml::from_str::<Manifest>(&bad).unwrap_err().to_string();
        assert!(err.contains("name"), "{err}");
    }

    #[test]
    fn disjoint_paths() {
        let p = |s: &str| BundlePath::new(s).unwrap();
        let ok = [p("/a/b"), p("/a/c"), p("/ab")];
        assert!(check_paths_disjoint(ok.iter()).is_ok());
        let nested = [p("/a/b/c"), p("/x"), p("/a/b")];
        assert_eq!(check_paths_disjoint(nested.iter()).unwrap_err().0, 2);
    }

    #[test]
    fn states_round_trip() {
        for s in [
            BundleState::Pending,
            BundleState::Applying,
            BundleState::Applied,
            BundleState::Failed,
            BundleState::RolledBack,
        ] {
            assert_eq!(s.as_str().parse::<BundleState>().unwrap(), s);
            assert_eq!(serde_json_like(s), format!("\"{}\"", s.as_str()));
        }
    }

    fn serde_json_like(s: BundleState) -> String {
        // toml cannot serialise a bare enum; a one-field table shows the tag.
        #[derive(serde::Serialize)]
        struct W {
            s: BundleState,
        }
        toml::to_string(&W { s })
            .unwrap()
            .trim()
            .trim_start_matches("s = ")
            .to_string()
    }
}
