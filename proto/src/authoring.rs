//! The `bundle.toml` authoring format (DESIGN §4) and loading a bundle
//! directory into a validated [`Manifest`] plus the local source of each file.
//!
//! Every error names the file and the field (`bundle.toml: file[2].mode: …`)
//! or, for TOML syntax errors, the file and line.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::arch::Arch;
use crate::certs::{CertificateSpec, DEFAULT_TTL, KubeconfigSpec, MAX_CERTIFICATES, MAX_KUBECONFIGS};
use crate::chunks::{Chunks, DEFAULT_CHUNK_SIZE};
use crate::digest::Digest;
use crate::duration::parse_duration;
use crate::limits::*;
use crate::manifest::{FileSpec, HealthCheck, Manifest, ManifestError, Step};
use crate::path::BundlePath;

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

/// Finds the size of a mirrored file whose `bundle.toml` entry gives no
/// `size` (lksctl downloads it and checks the sha256 on the way).
pub trait UrlSizer {
    fn size_of(&mut self, url: &str, digest: &Digest) -> Result<u64, String>;
}

/// A [`UrlSizer`] for callers that require `size` to be written out.
pub struct RequireSize;

impl UrlSizer for RequireSize {
    fn size_of(&mut self, _url: &str, _digest: &Digest) -> Result<u64, String> {
        Err("missing `size` (required with url here)".into())
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
    parse_bundle_toml(&text, dir, sizer).map_err(|e| AuthoringError { file, message: e })
}

/// Parses `bundle.toml` text; source files are resolved relative to `dir`.
pub fn parse_bundle_toml(text: &str, dir: &Path, sizer: &mut dyn UrlSizer) -> Result<AuthoredBundle, String> {
    let raw: RawBundle = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
    let mut files = Vec::with_capacity(raw.files.len());
    let mut sources = Vec::with_capacity(raw.files.len());
    if raw.files.len() > MAX_FILES {
        return Err(format!(
            "file: {} entries; the limit is {MAX_FILES}",
            raw.files.len()
        ));
    }
    let mut hashed: BTreeMap<PathBuf, (Digest, u64, Option<Chunks>)> = BTreeMap::new();
    for (i, f) in raw.files.into_iter().enumerate() {
        let field = |n: &str| format!("file[{i}].{n}");
        let fail = |n: &str, why: String| format!("{}: {why}", field(n));
        let path = BundlePath::new(&f.path).map_err(|e| fail("path", e.to_string()))?;
        let arch = f
            .arch
            .as_deref()
            .map(Arch::parse)
            .transpose()
            .map_err(|e| fail("arch", e))?;
        let mode = match f.mode {
            None => 0o644,
            Some(m) => parse_mode(m).map_err(|e| fail("mode", e))?,
        };
        let declared = f
            .sha256
            .as_deref()
            .map(Digest::from_hex)
            .transpose()
            .map_err(|_| fail("sha256", "must be 64 lowercase hex digits".into()))?;
        let (digest, size, source, url, chunks) = match (f.source, f.url) {
            (Some(_), Some(_)) => return Err(fail("source", "give either source or url, not both".into())),
            (None, None) => {
                return Err(fail(
                    "source",
                    "missing: give source (a file in the bundle directory) or url".into(),
                ));
            }
            (Some(src), None) => {
                let local = source_path(dir, &src).map_err(|e| fail("source", e))?;
                let (digest, size, chunks) = match hashed.get(&local) {
                    Some(v) => v.clone(),
                    None => {
                        let meta = std::fs::metadata(&local)
                            .map_err(|e| fail("source", format!("{}: {e}", local.display())))?;
                        if !meta.is_file() {
                            return Err(fail(
                                "source",
                                format!("{} is not a regular file", local.display()),
                            ));
                        }
                        // One read gives the digest and the chunk list; a
                        // file of one chunk needs no list (its piece is
                        // the file).
                        let v = std::fs::File::open(&local)
                            .and_then(|f| Chunks::of_reader(f, DEFAULT_CHUNK_SIZE))
                            .map(|(d, n, c)| (d, n, (n > u64::from(DEFAULT_CHUNK_SIZE)).then_some(c)))
                            .map_err(|e| fail("source", format!("{}: {e}", local.display())))?;
                        hashed.insert(local.clone(), v.clone());
                        v
                    }
                };
                if let Some(d) = declared
                    && d != digest
                {
                    return Err(fail("sha256", format!("does not match {src} ({digest})")));
                }
                if let Some(s) = f.size
                    && s != size
                {
                    return Err(fail("size", format!("{s} does not match {src} ({size} bytes)")));
                }
                (digest, size, FileSource::Local(local), None, chunks)
            }
            (None, Some(url)) => {
                let digest = declared.ok_or_else(|| fail("sha256", "missing (required with url)".into()))?;
                let size = match f.size {
                    Some(s) => s,
                    None => sizer.size_of(&url, &digest).map_err(|e| fail("size", e))?,
                };
                (digest, size, FileSource::Url, Some(url), None)
            }
        };
        files.push(FileSpec {
            arch,
            path,
            digest,
            size,
            mode,
            url,
            chunks,
        });
        sources.push(source);
    }
    let steps = raw
        .steps
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            Ok(Step {
                name: s.name,
                run: s.run,
                timeout: opt_duration(s.timeout, DEFAULT_STEP_TIMEOUT)
                    .map_err(|e| format!("step[{i}].timeout: {e}"))?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let health = raw
        .health
        .map(|h| {
            Ok::<_, String>(HealthCheck {
                run: h.run,
                timeout: opt_duration(h.timeout, DEFAULT_HEALTH_TIMEOUT)
                    .map_err(|e| format!("health.timeout: {e}"))?,
                retries: h.retries.unwrap_or(DEFAULT_HEALTH_RETRIES),
                interval: opt_duration(h.interval, DEFAULT_HEALTH_INTERVAL)
                    .map_err(|e| format!("health.interval: {e}"))?,
            })
        })
        .transpose()?;
    if raw.certificates.len() > MAX_CERTIFICATES {
        return Err(format!(
            "certificate: {} entries; the limit is {MAX_CERTIFICATES}",
            raw.certificates.len()
        ));
    }
    let certificates = raw
        .certificates
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let fail = |n: &str, why: String| format!("certificate[{i}].{n}: {why}");
            let path = |n: &str, v: &str| BundlePath::new(v).map_err(|e| fail(n, e.to_string()));
            Ok(CertificateSpec {
                path: path("path", &c.path)?,
                key_path: path("key_path", &c.key_path)?,
                profile: c.profile.parse().map_err(|e| fail("profile", e))?,
                common_name: c.common_name,
                organizations: c.organizations,
                dns_names: c.dns_names,
                ip_addresses: c.ip_addresses,
                ttl: opt_duration(c.ttl, DEFAULT_TTL).map_err(|e| fail("ttl", e))?,
                ca_path: c.ca_path.map(|p| path("ca_path", &p)).transpose()?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    if raw.kubeconfigs.len() > MAX_KUBECONFIGS {
        return Err(format!(
            "kubeconfig: {} entries; the limit is {MAX_KUBECONFIGS}",
            raw.kubeconfigs.len()
        ));
    }
    let kubeconfigs = raw
        .kubeconfigs
        .into_iter()
        .enumerate()
        .map(|(i, k)| {
            let path = |n: &str, v: &str| BundlePath::new(v).map_err(|e| format!("kubeconfig[{i}].{n}: {e}"));
            Ok(KubeconfigSpec {
                path: path("path", &k.path)?,
                certificate: path("certificate", &k.certificate)?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let architectures = raw
        .architectures
        .iter()
        .enumerate()
        .map(|(i, a)| Arch::parse(a).map_err(|e| format!("architectures[{i}]: {e}")))
        .collect::<Result<Vec<_>, String>>()?;
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
    };
    manifest.validate().map_err(|e: ManifestError| e.to_string())?;
    check_elf_arches(&manifest, &sources)?;
    if manifest.self_update
        && !manifest.is_multi_arch()
        && let Some(FileSource::Local(p)) = sources.first()
    {
        // The node checks the architecture; here it must at least be an
        // executable, not a script or a tarball.
        let mut head = Vec::with_capacity(64);
        std::io::Read::read_to_end(
            &mut std::io::Read::take(
                std::fs::File::open(p).map_err(|e| format!("file[0].source: {}: {e}", p.display()))?,
                64,
            ),
            &mut head,
        )
        .map_err(|e| format!("file[0].source: {}: {e}", p.display()))?;
        crate::elf::parse_header(&head).map_err(|e| {
            format!(
                "file[0].source: {} is {e}; a self_update bundle carries the agent's binary",
                p.display()
            )
        })?;
    }
    Ok(AuthoredBundle { manifest, sources })
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
fn check_elf_arches(m: &Manifest, sources: &[FileSource]) -> Result<(), String> {
    if !m.is_multi_arch() {
        return Ok(());
    }
    let arches = m.arches();
    for (i, (f, s)) in m.files.iter().zip(sources).enumerate() {
        let FileSource::Local(p) = s else { continue };
        let head = head_of(p).map_err(|e| format!("file[{i}].source: {}: {e}", p.display()))?;
        if m.self_update {
            crate::elf::parse_header(&head).map_err(|e| {
                format!(
                    "file[{i}].source: {} is {e}; a self_update bundle carries the agent's binary",
                    p.display()
                )
            })?;
        }
        match f.arch {
            Some(a) => a.check_elf(&head).map_err(|e| {
                format!(
                    "file[{i}].source: {} is {e}, but the entry has arch = \"{a}\"",
                    p.display()
                )
            })?,
            None => {
                for a in &arches {
                    a.check_elf(&head).map_err(|e| {
                        format!(
                            "file[{i}].source: {} is {e}, but the entry has no arch and the bundle is also for {a}; \
                             give it the arch it is for",
                            p.display()
                        )
                    })?;
                }
            }
        }
    }
    Ok(())
}

fn opt_duration(s: Option<String>, default: Duration) -> Result<Duration, String> {
    s.map_or(Ok(default), |s| parse_duration(&s))
}

fn parse_mode(m: RawMode) -> Result<u32, String> {
    let v = match m {
        RawMode::Text(s) => {
            let digits = s.strip_prefix("0o").unwrap_or(&s);
            if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
                return Err(format!("{s:?} is not an octal mode such as \"0644\""));
            }
            u32::from_str_radix(digits, 8).map_err(|_| format!("{s:?} is not an octal mode"))?
        }
        // `mode = 0o644` in TOML arrives as the integer 420.
        RawMode::Number(n) => u32::try_from(n).map_err(|_| format!("{n} is not a mode"))?,
    };
    if v > 0o7777 {
        return Err(format!("{v:o} is more than 7777"));
    }
    Ok(v)
}

/// A source must be a relative path inside the bundle directory.
fn source_path(dir: &Path, src: &str) -> Result<PathBuf, String> {
    let p = Path::new(src);
    if src.is_empty() || p.is_absolute() {
        return Err(format!("{src:?} must be a path relative to the bundle directory"));
    }
    if p.components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "{src:?} must stay inside the bundle directory (no \"..\")"
        ));
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

#[cfg(test)]
mod tests;
