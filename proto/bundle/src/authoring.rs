//! The `bundle.toml` authoring format (DESIGN §4) and loading a bundle
//! directory into a validated [`Manifest`] plus the local source of each file.
//!
//! Every error names the file and the field (`bundle.toml: file[2].mode: …`)
//! or, for TOML syntax errors, the file and line.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::arch::{Arch, ForeignExecutable, UnknownArch};
use crate::certs::{
    CertificateSpec, DEFAULT_TTL, KubeconfigSpec, MAX_CERTIFICATES, MAX_KUBECONFIGS, UnknownProfile,
};
use crate::digest::Digest;
use crate::duration::{DurationError, parse_duration};
use crate::elf::ElfError;
use crate::limits::*;
use crate::manifest::{HealthCheck, Manifest, ManifestError, Reboot, Step, UnknownReboot};
use crate::path::{BundlePath, PathError};

/// Name of the manifest file in a bundle directory.
pub const BUNDLE_TOML: &str = "bundle.toml";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBundle {
    name: String,
    version: String,
    #[serde(default, rename = "file")]
    files: Vec<RawFile>,
    #[serde(default, rename = "step")]
    steps: Vec<RawStep>,
    health: Option<RawHealth>,
    #[serde(default, rename = "certificate")]
    certificates: Vec<RawCertificate>,
    #[serde(default, rename = "kubeconfig")]
    kubeconfigs: Vec<RawKubeconfig>,
    #[serde(default)]
    self_update: bool,
    #[serde(default)]
    architectures: Vec<String>,
    reboot: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCertificate {
    path: String,
    key_path: String,
    profile: String,
    #[serde(default)]
    common_name: String,
    #[serde(default)]
    organizations: Vec<String>,
    #[serde(default)]
    dns_names: Vec<String>,
    #[serde(default)]
    ip_addresses: Vec<String>,
    ttl: Option<String>,
    ca_path: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKubeconfig {
    path: String,
    certificate: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    path: String,
    source: Option<String>,
    url: Option<String>,
    sha256: Option<String>,
    size: Option<u64>,
    mode: Option<RawMode>,
    arch: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawMode {
    Text(String),
    Number(i64),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    name: String,
    run: Vec<String>,
    timeout: Option<String>,
    #[serde(default)]
    on_heal: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    run: Vec<String>,
    timeout: Option<String>,
    retries: Option<u32>,
    interval: Option<String>,
}

/// Where the bytes of one file come from when publishing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileSource {
    /// A file in the bundle directory, uploaded to the control server.
    Local(PathBuf),
    /// A mirror; nothing is uploaded.
    Url,
}

/// A bundle directory, loaded and validated.
#[derive(Clone, Debug)]
pub struct AuthoredBundle {
    pub manifest: Manifest,
    /// Parallel to `manifest.files`.
    pub sources: Vec<FileSource>,
}

impl AuthoredBundle {
    /// Local files to upload, one per distinct digest, in manifest order.
    pub fn uploads(&self) -> Vec<(Digest, u64, PathBuf)> {
        let mut seen = std::collections::HashSet::new();
        self.manifest
            .files
            .iter()
            .zip(&self.sources)
            .filter_map(|(f, s)| match s {
                FileSource::Local(p) if seen.insert(f.digest) => Some((f.digest, f.size, p.clone())),
                _ => None,
            })
            .collect()
    }
}

/// Error loading a bundle directory: one line naming file and field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {message}")]
pub struct AuthoringError {
    pub file: String,
    pub message: String,
}

/// Why `bundle.toml` text was refused. Each variant names the field
/// (`file[2].mode`) and carries the value or path that failed.
#[derive(Debug, thiserror::Error)]
pub enum BundleTomlError {
    /// A TOML syntax or type error, `line N: message` ([`toml_error`]).
    #[error("{0}")]
    Syntax(String),
    #[error("{what}: {count} entries; the limit is {limit}")]
    TooMany {
        what: &'static str,
        count: usize,
        limit: usize,
    },
    /// A field that is missing, or given together with one it excludes.
    #[error("{field}: {reason}")]
    Field { field: String, reason: &'static str },
    #[error("{field}: {source}")]
    Path { field: String, source: PathError },
    #[error("{field}: {source}")]
    Arch { field: String, source: UnknownArch },
    #[error("{field}: {source}")]
    Mode { field: String, source: ModeError },
    #[error("{field}: {source}")]
    Duration { field: String, source: DurationError },
    #[error("{field}: {source}")]
    Profile { field: String, source: UnknownProfile },
    #[error("reboot: {source}")]
    Reboot { source: UnknownReboot },
    #[error("{field}: {source}")]
    SourcePath { field: String, source: SourcePathError },
    /// A local source that could not be read (or hashed).
    #[error("{field}: {path}: {source}")]
    Read {
        field: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{field}: {path} is not a regular file")]
    NotAFile { field: String, path: PathBuf },
    /// The declared `sha256` is not the local source's.
    #[error("{field}: does not match {src} ({digest})")]
    DigestMismatch {
        field: String,
        src: String,
        digest: Digest,
    },
    /// The declared `size` is not the local source's.
    #[error("{field}: {declared} does not match {src} ({size} bytes)")]
    SizeMismatch {
        field: String,
        declared: u64,
        src: String,
        size: u64,
    },
    /// A mirrored file's size could not be learnt.
    #[error("{field}: {source}")]
    Size { field: String, source: SizeError },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The file of a self-update bundle is no executable.
    #[error("{field}: {path} is {source}; a self_update bundle carries the agent's binary")]
    NotExecutable {
        field: String,
        path: PathBuf,
        source: ElfError,
    },
    /// A file with an `arch` is an executable for another one.
    #[error("{field}: {path} is {source}, but the entry has arch = \"{arch}\"")]
    ForeignArch {
        field: String,
        path: PathBuf,
        arch: Arch,
        source: ForeignExecutable,
    },
    /// An arch-neutral executable that does not suit every architecture.
    #[error(
        "{field}: {path} is {source}, but the entry has no arch and the bundle is also for {arch}; \
         give it the arch it is for"
    )]
    NeutralForeign {
        field: String,
        path: PathBuf,
        arch: Arch,
        source: ForeignExecutable,
    },
}

/// Why a file's `mode` was refused; carries the value given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModeError {
    #[error("{text:?} is not an octal mode such as \"0644\"")]
    NotOctal { text: String },
    #[error("{text:?} is not an octal mode")]
    Unparsable { text: String },
    #[error("{number} is not a mode")]
    Number { number: i64 },
    #[error("{mode:o} is more than 7777")]
    TooLarge { mode: u32 },
}

/// Why a file's `source` was refused; carries the value given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourcePathError {
    #[error("{src:?} must be a path relative to the bundle directory")]
    NotRelative { src: String },
    #[error("{src:?} must stay inside the bundle directory (no \"..\")")]
    Escapes { src: String },
}

/// Why a [`UrlSizer`] gave no size.
#[derive(Debug, thiserror::Error)]
pub enum SizeError {
    /// `size` must be written out ([`RequireSize`]).
    #[error("missing `size` (required with url here)")]
    Required,
    /// Fetching the file to learn its size failed.
    #[error("no size given and fetching {url} to learn it failed: {source}")]
    Fetch {
        url: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The mirrored bytes are not the declared ones.
    #[error("{url} has sha256 {}, not the declared {}", .got.hex(), .declared.hex())]
    Digest {
        url: String,
        got: Digest,
        declared: Digest,
    },
}

/// Finds the size of a mirrored file whose `bundle.toml` entry gives no
/// `size` (lksctl downloads it and checks the sha256 on the way).
pub trait UrlSizer {
    fn size_of(&mut self, url: &str, digest: &Digest) -> Result<u64, SizeError>;
}

/// A [`UrlSizer`] for callers that require `size` to be written out.
pub struct RequireSize;

impl UrlSizer for RequireSize {
    fn size_of(&mut self, _url: &str, _digest: &Digest) -> Result<u64, SizeError> {
        Err(SizeError::Required)
    }
}

/// Loads `dir/bundle.toml`, hashes every local source file and validates the
/// result.
pub fn load_bundle_dir(dir: &Path, sizer: &mut dyn UrlSizer) -> Result<AuthoredBundle, AuthoringError> {
    let toml_path = dir.join(BUNDLE_TOML);
    let file = toml_path.display().to_string();
    let err = |message: String| AuthoringError {
        file: file.clone(),
        message,
    };
    let meta = std::fs::metadata(&toml_path).map_err(|e| err(format!("cannot read: {e}")))?;
    if meta.len() > MAX_BUNDLE_TOML_SIZE {
        return Err(err(format!(
            "{} bytes; the limit is {MAX_BUNDLE_TOML_SIZE}",
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(&toml_path).map_err(|e| err(format!("cannot read: {e}")))?;
    parse_bundle_toml(&text, dir, sizer).map_err(|e| AuthoringError {
        file,
        message: e.to_string(),
    })
}

/// Parses `bundle.toml` text; source files are resolved relative to `dir`.
pub fn parse_bundle_toml(
    text: &str,
    dir: &Path,
    sizer: &mut dyn UrlSizer,
) -> Result<AuthoredBundle, BundleTomlError> {
    use BundleTomlError as E;
    let raw: RawBundle = toml::from_str(text).map_err(|e| E::Syntax(toml_error(text, &e)))?;
    let (files, sources) = files::parse_files(raw.files, dir, sizer)?;
    let steps = parse_steps(raw.steps)?;
    let health = raw.health.map(parse_health).transpose()?;
    let certificates = parse_certificates(raw.certificates)?;
    let kubeconfigs = parse_kubeconfigs(raw.kubeconfigs)?;
    let architectures = raw
        .architectures
        .iter()
        .enumerate()
        .map(|(i, a)| {
            Arch::parse(a).map_err(|source| E::Arch {
                field: format!("architectures[{i}]"),
                source,
            })
        })
        .collect::<Result<Vec<_>, E>>()?;
    let manifest = Manifest {
        architectures,
        name: raw.name,
        version: raw.version,
        files,
        steps,
        health,
        certificates,
        kubeconfigs,
        issued: Vec::new(),
        self_update: raw.self_update,
        reboot: raw
            .reboot
            .as_deref()
            .map(str::parse::<Reboot>)
            .transpose()
            .map_err(|source| E::Reboot { source })?
            .unwrap_or_default(),
    };
    manifest.validate()?;
    check_elf_arches(&manifest, &sources)?;
    check_self_update_executable(&manifest, &sources)?;
    Ok(AuthoredBundle { manifest, sources })
}

/// The `[[step]]`s, each with its timeout or the default.
fn parse_steps(raw: Vec<RawStep>) -> Result<Vec<Step>, BundleTomlError> {
    raw.into_iter()
        .enumerate()
        .map(|(i, s)| {
            Ok(Step {
                name: s.name,
                run: s.run,
                timeout: opt_duration(s.timeout, DEFAULT_STEP_TIMEOUT).map_err(|source| {
                    BundleTomlError::Duration {
                        field: format!("step[{i}].timeout"),
                        source,
                    }
                })?,
                on_heal: s.on_heal,
            })
        })
        .collect()
}

/// A bad duration in `field`.
fn bad_duration(field: &str) -> impl FnOnce(DurationError) -> BundleTomlError + use<> {
    let field = field.to_string();
    move |source| BundleTomlError::Duration { field, source }
}

/// `[health]`, with the defaults for what it leaves out.
fn parse_health(h: RawHealth) -> Result<HealthCheck, BundleTomlError> {
    Ok(HealthCheck {
        run: h.run,
        timeout: opt_duration(h.timeout, DEFAULT_HEALTH_TIMEOUT).map_err(bad_duration("health.timeout"))?,
        retries: h.retries.unwrap_or(DEFAULT_HEALTH_RETRIES),
        interval: opt_duration(h.interval, DEFAULT_HEALTH_INTERVAL)
            .map_err(bad_duration("health.interval"))?,
    })
}

/// The `[[certificate]]`s the node makes, at most [`MAX_CERTIFICATES`].
fn parse_certificates(raw: Vec<RawCertificate>) -> Result<Vec<CertificateSpec>, BundleTomlError> {
    use BundleTomlError as E;
    if raw.len() > MAX_CERTIFICATES {
        return Err(E::TooMany {
            what: "certificate",
            count: raw.len(),
            limit: MAX_CERTIFICATES,
        });
    }
    raw.into_iter()
        .enumerate()
        .map(|(i, c)| {
            let field = |n: &str| format!("certificate[{i}].{n}");
            let path = |n: &str, v: &str| {
                BundlePath::new(v).map_err(|source| E::Path {
                    field: field(n),
                    source,
                })
            };
            Ok(CertificateSpec {
                path: path("path", &c.path)?,
                key_path: path("key_path", &c.key_path)?,
                profile: c.profile.parse().map_err(|source| E::Profile {
                    field: field("profile"),
                    source,
                })?,
                common_name: c.common_name,
                organizations: c.organizations,
                dns_names: c.dns_names,
                ip_addresses: c.ip_addresses,
                ttl: opt_duration(c.ttl, DEFAULT_TTL).map_err(bad_duration(&field("ttl")))?,
                ca_path: c.ca_path.map(|p| path("ca_path", &p)).transpose()?,
            })
        })
        .collect()
}

/// The `[[kubeconfig]]`s the node writes, at most [`MAX_KUBECONFIGS`].
fn parse_kubeconfigs(raw: Vec<RawKubeconfig>) -> Result<Vec<KubeconfigSpec>, BundleTomlError> {
    use BundleTomlError as E;
    if raw.len() > MAX_KUBECONFIGS {
        return Err(E::TooMany {
            what: "kubeconfig",
            count: raw.len(),
            limit: MAX_KUBECONFIGS,
        });
    }
    raw.into_iter()
        .enumerate()
        .map(|(i, k)| {
            let path = |n: &str, v: &str| {
                BundlePath::new(v).map_err(|source| E::Path {
                    field: format!("kubeconfig[{i}].{n}"),
                    source,
                })
            };
            Ok(KubeconfigSpec {
                path: path("path", &k.path)?,
                certificate: path("certificate", &k.certificate)?,
            })
        })
        .collect()
}

/// The node checks a self-update's architecture; here its (single-arch,
/// local) file must at least be an executable, not a script or a tarball.
fn check_self_update_executable(manifest: &Manifest, sources: &[FileSource]) -> Result<(), BundleTomlError> {
    use BundleTomlError as E;
    if manifest.self_update
        && !manifest.is_multi_arch()
        && let Some(FileSource::Local(p)) = sources.first()
    {
        let field = || "file[0].source".to_string();
        let head = head_of(p).map_err(|source| E::Read {
            field: field(),
            path: p.clone(),
            source,
        })?;
        crate::elf::parse_header(&head).map_err(|source| E::NotExecutable {
            field: field(),
            path: p.clone(),
            source,
        })?;
    }
    Ok(())
}

/// The first bytes of a local source (an ELF header needs 64).
fn head_of(p: &Path) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(64);
    std::io::Read::read_to_end(&mut std::io::Read::take(std::fs::File::open(p)?, 64), &mut head)?;
    Ok(head)
}

/// In a multi-arch bundle no node may get an executable for another
/// machine: a file with an `arch` must be no ELF executable or one for
/// that architecture, and an arch-neutral ELF executable must suit every
/// architecture of the bundle. A self-update's file must be an
/// executable at all. Only local sources are read; the agent checks every
/// file again before it installs it.
fn check_elf_arches(m: &Manifest, sources: &[FileSource]) -> Result<(), BundleTomlError> {
    use BundleTomlError as E;
    if !m.is_multi_arch() {
        return Ok(());
    }
    let arches = m.arches();
    for (i, (f, s)) in m.files.iter().zip(sources).enumerate() {
        let FileSource::Local(p) = s else { continue };
        let field = || format!("file[{i}].source");
        let head = head_of(p).map_err(|source| E::Read {
            field: field(),
            path: p.clone(),
            source,
        })?;
        if m.self_update {
            crate::elf::parse_header(&head).map_err(|source| E::NotExecutable {
                field: field(),
                path: p.clone(),
                source,
            })?;
        }
        match f.arch {
            Some(a) => a.check_elf(&head).map_err(|source| E::ForeignArch {
                field: field(),
                path: p.clone(),
                arch: a,
                source,
            })?,
            None => {
                for a in &arches {
                    a.check_elf(&head).map_err(|source| E::NeutralForeign {
                        field: field(),
                        path: p.clone(),
                        arch: *a,
                        source,
                    })?;
                }
            }
        }
    }
    Ok(())
}

fn opt_duration(s: Option<String>, default: Duration) -> Result<Duration, DurationError> {
    s.map_or(Ok(default), |s| parse_duration(&s))
}

fn parse_mode(m: RawMode) -> Result<u32, ModeError> {
    let v = match m {
        RawMode::Text(s) => {
            let digits = s.strip_prefix("0o").unwrap_or(&s);
            if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
                return Err(ModeError::NotOctal { text: s });
            }
            match u32::from_str_radix(digits, 8) {
                Ok(v) => v,
                Err(_) => return Err(ModeError::Unparsable { text: s }),
            }
        }
        // `mode = 0o644` in TOML arrives as the integer 420.
        RawMode::Number(n) => u32::try_from(n).map_err(|_| ModeError::Number { number: n })?,
    };
    if v > 0o7777 {
        return Err(ModeError::TooLarge { mode: v });
    }
    Ok(v)
}

/// A source must be a relative path inside the bundle directory.
fn source_path(dir: &Path, src: &str) -> Result<PathBuf, SourcePathError> {
    let p = Path::new(src);
    if src.is_empty() || p.is_absolute() {
        return Err(SourcePathError::NotRelative { src: src.into() });
    }
    if p.components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(SourcePathError::Escapes { src: src.into() });
    }
    Ok(dir.join(p))
}

/// `line N: message` for a TOML syntax or type error: one line, for any
/// TOML file we read (`bundle.toml`, the agent's settings).
pub fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())]
                .bytes()
                .filter(|&b| b == b'\n')
                .count()
                + 1;
            format!("line {line}: {msg}")
        }
        None => msg,
    }
}

mod files;

#[cfg(test)]
mod tests;
