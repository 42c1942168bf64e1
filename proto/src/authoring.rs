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
mod tests {
    use super::*;
    use crate::pb;
    use proptest::prelude::*;

    const GOOD: &str = r#"
name = "kubelet"
version = "1.29.3-1"

[[file]]
path = "/etc/kubernetes/kubelet.conf"
source = "kubelet.conf"
mode = "0600"

[[file]]
path = "/usr/local/bin/kubelet"
url = "https://mirror.internal/kubelet-1.29.3"
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
size = 4
mode = "0755"

[[step]]
name = "restart kubelet"
run = ["systemctl", "restart", "kubelet"]
timeout = "60s"

[health]
run = ["/usr/local/bin/kubelet-healthy"]
timeout = "10s"
retries = 5
interval = "2s"
"#;

    fn dir_with(files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (name, bytes) in files {
            std::fs::write(d.path().join(name), bytes).unwrap();
        }
        d
    }

    #[test]
    fn loads_the_design_example() {
        let d = dir_with(&[("kubelet.conf", b"conf"), (BUNDLE_TOML, GOOD.as_bytes())]);
        let b = load_bundle_dir(d.path(), &mut RequireSize).unwrap();
        let m = &b.manifest;
        assert_eq!(m.id(), "kubelet@1.29.3-1");
        assert_eq!(m.files[0].digest, Digest::of(b"conf"));
        assert_eq!(m.files[0].mode, 0o600);
        assert_eq!(
            m.files[1].url.as_deref(),
            Some("https://mirror.internal/kubelet-1.29.3")
        );
        assert_eq!(m.steps[0].timeout, Duration::from_secs(60));
        assert_eq!(m.health.as_ref().unwrap().retries, 5);
        assert_eq!(b.sources[1], FileSource::Url);
        assert_eq!(b.uploads().len(), 1);
    }

    #[test]
    fn toml_to_manifest_to_protobuf_and_back() {
        let d = dir_with(&[("kubelet.conf", b"conf")]);
        let b = parse_bundle_toml(GOOD, d.path(), &mut RequireSize).unwrap();
        let back: Manifest = pb::Manifest::from(&b.manifest).try_into().unwrap();
        assert_eq!(back, b.manifest);
    }

    #[test]
    fn field_order_in_toml_does_not_change_the_canonical_bytes() {
        let d = dir_with(&[("kubelet.conf", b"conf")]);
        let reordered = r#"
version = "1.29.3-1"
name = "kubelet"

[health]
interval = "2s"
retries = 5
timeout = "10s"
run = ["/usr/local/bin/kubelet-healthy"]

[[file]]
mode = "0755"
size = 4
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
url = "https://mirror.internal/kubelet-1.29.3"
path = "/usr/local/bin/kubelet"

[[file]]
mode = "0600"
source = "kubelet.conf"
path = "/etc/kubernetes/kubelet.conf"

[[step]]
timeout = "60s"
run = ["systemctl", "restart", "kubelet"]
name = "restart kubelet"
"#;
        let a = parse_bundle_toml(GOOD, d.path(), &mut RequireSize).unwrap();
        let b = parse_bundle_toml(reordered, d.path(), &mut RequireSize).unwrap();
        assert_eq!(
            crate::canonical::encode(&a.manifest),
            crate::canonical::encode(&b.manifest)
        );
    }

    #[test]
    fn every_error_names_the_field() {
        let d = dir_with(&[("kubelet.conf", b"conf")]);
        let cases = [
            (
                GOOD.replace("source = \"kubelet.conf\"", "source = \"missing.conf\""),
                "file[0].source",
            ),
            (
                GOOD.replace("source = \"kubelet.conf\"", "source = \"../etc/passwd\""),
                "file[0].source",
            ),
            (
                GOOD.replace("source = \"kubelet.conf\"", "source = \"/etc/passwd\""),
                "file[0].source",
            ),
            (
                GOOD.replace("\"/etc/kubernetes/kubelet.conf\"", "\"/etc/../kubelet.conf\""),
                "file[0].path",
            ),
            (
                GOOD.replace("\"/etc/kubernetes/kubelet.conf\"", "\"etc/kubelet.conf\""),
                "file[0].path",
            ),
            (GOOD.replace("mode = \"0600\"", "mode = \"0999\""), "file[0].mode"),
            (GOOD.replace("mode = \"0600\"", "mode = \"rw\""), "file[0].mode"),
            (
                GOOD.replace("sha256 = \"9f86", "sha256 = \"XX86"),
                "file[1].sha256",
            ),
            (GOOD.replace("size = 4\n", ""), "file[1].size"),
            (
                GOOD.replace("timeout = \"60s\"", "timeout = \"60\""),
                "step[0].timeout",
            ),
            (GOOD.replace("retries = 5", "retries = 0"), "health.retries"),
            (GOOD.replace("name = \"kubelet\"", "name = \"Kubelet\""), "name"),
            (
                GOOD.replace("version = \"1.29.3-1\"", "version = \"\""),
                "version",
            ),
            (
                GOOD.replace("run = [\"systemctl\", \"restart\", \"kubelet\"]", "run = []"),
                "step[0].run",
            ),
            (
                GOOD.replace(
                    "url = \"https://mirror.internal/kubelet-1.29.3\"",
                    "source = \"kubelet.conf\"\nurl = \"https://x/y\"",
                ),
                "file[1].source",
            ),
        ];
        for (text, field) in cases {
            let e = parse_bundle_toml(&text, d.path(), &mut RequireSize).expect_err(field);
            assert!(e.starts_with(&format!("{field}: ")), "expected {field}, got {e}");
        }
    }

    const IDENTITY: &str = r#"
name = "kubelet-identity"
version = "1"

[[certificate]]
path = "/var/lib/kubelet/pki/kubelet-client.crt"
key_path = "/var/lib/kubelet/pki/kubelet-client.key"
profile = "kubelet-client"
ca_path = "/etc/kubernetes/pki/ca.crt"

[[certificate]]
path = "/var/lib/kubelet/pki/kubelet.crt"
key_path = "/var/lib/kubelet/pki/kubelet.key"
profile = "kubelet-serving"
ttl = "24h"
ca_path = "/etc/kubernetes/pki/ca.crt"

[[kubeconfig]]
path = "/etc/kubernetes/kubelet.conf"
certificate = "/var/lib/kubelet/pki/kubelet-client.crt"
"#;

    #[test]
    fn certificates_and_kubeconfigs() {
        let d = dir_with(&[]);
        let b = parse_bundle_toml(IDENTITY, d.path(), &mut RequireSize).unwrap();
        let m = &b.manifest;
        assert!(m.files.is_empty());
        assert_eq!(m.certificates.len(), 2);
        assert_eq!(m.certificates[0].ttl, DEFAULT_TTL);
        assert_eq!(m.certificates[1].ttl, Duration::from_secs(86400));
        assert_eq!(m.kubeconfigs[0].certificate, m.certificates[0].path);
        let back = Manifest::try_from(pb::Manifest::from(m)).unwrap();
        assert_eq!(&back, m);
        let cases = [
            (
                "profile = \"kubelet-client\"",
                "profile = \"kubelet\"",
                "certificate[0].profile: unknown profile",
            ),
            (
                "ttl = \"24h\"",
                "ttl = \"24\"",
                "certificate[1].ttl: invalid duration",
            ),
            (
                "ttl = \"24h\"",
                "ttl = \"1s\"",
                "certificate[1].ttl: 1s is outside",
            ),
            (
                "profile = \"kubelet-client\"",
                "profile = \"client\"\ncommon_name = \"{hostname}\"",
                "certificate[0].common_name: \"{hostname}\" uses {hostname}",
            ),
            (
                "certificate = \"/var/lib/kubelet/pki/kubelet-client.crt\"",
                "certificate = \"/var/lib/kubelet/pki/kubelet.crt\"",
                "kubeconfig[0].certificate: /var/lib/kubelet/pki/kubelet.crt has profile kubelet-serving",
            ),
            (
                "path = \"/etc/kubernetes/kubelet.conf\"",
                "path = \"/var/lib/kubelet/pki/kubelet.key\"",
                "kubeconfig[0].path: /var/lib/kubelet/pki/kubelet.key is listed twice",
            ),
            (
                "ttl = \"24h\"",
                "ttl = \"24h\"\nserial = 3",
                "unknown field `serial`",
            ),
        ];
        for (from, to, want) in cases {
            let text = IDENTITY.replacen(from, to, 1);
            let e = parse_bundle_toml(&text, d.path(), &mut RequireSize).unwrap_err();
            assert!(e.contains(want), "{to}: expected {want:?}, got {e}");
        }
    }

    #[test]
    fn self_update_bundles_carry_one_executable_and_nothing_else() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let d = dir_with(&[
            ("agent", &me[..4096]),
            ("script", b"#!/bin/sh\n"),
            ("other", b"x"),
        ]);
        let good = "name = \"lksadmin-agent\"\nversion = \"2\"\nself_update = true\n\
                    [[file]]\npath = \"/usr/bin/lksadmin-agent\"\nsource = \"agent\"\nmode = \"0755\"\n";
        let b = parse_bundle_toml(good, d.path(), &mut RequireSize).unwrap();
        assert!(b.manifest.self_update);
        let back = Manifest::try_from(pb::Manifest::from(&b.manifest)).unwrap();
        assert!(back.self_update);
        let cases = [
            (
                good.replace("source = \"agent\"", "source = \"script\""),
                "no ELF header",
            ),
            (
                good.replace("0755", "0644"),
                "file[0].mode: the agent's binary must be executable",
            ),
            (
                format!("{good}[[file]]\npath = \"/etc/x\"\nsource = \"other\"\n"),
                "exactly one file",
            ),
            (
                format!("{good}[[step]]\nname = \"x\"\nrun = [\"true\"]\n"),
                "step: a self_update bundle has no steps",
            ),
            (
                format!("{good}[health]\nrun = [\"true\"]\n"),
                "health: a self_update bundle has no health check",
            ),
        ];
        for (text, want) in cases {
            let e = parse_bundle_toml(&text, d.path(), &mut RequireSize).unwrap_err();
            assert!(e.contains(want), "expected {want:?}, got {e}");
        }
    }

    fn elf(machine: u16) -> Vec<u8> {
        crate::elf::fixture_header(machine, 2)
    }

    const MULTI: &str = r#"
name = "kubelet"
version = "1.31.2"
architectures = ["amd64", "arm64"]

[[file]]
path = "/usr/bin/kubelet"
source = "kubelet-amd64"
arch = "amd64"
mode = "0755"

[[file]]
path = "/usr/bin/kubelet"
source = "kubelet-arm64"
arch = "arm64"
mode = "0755"

[[file]]
path = "/etc/kubelet.conf"
source = "conf"
"#;

    #[test]
    fn multi_arch_bundles_and_their_refusals() {
        let d = dir_with(&[
            ("kubelet-amd64", &elf(62)),
            ("kubelet-arm64", &elf(183)),
            ("conf", b"conf"),
            ("script", b"#!/bin/sh\n"),
        ]);
        let b = parse_bundle_toml(MULTI, d.path(), &mut RequireSize).unwrap();
        let m = &b.manifest;
        assert_eq!(crate::arch::list(&m.architectures), "amd64, arm64");
        assert_eq!(m.files[1].arch.map(|a| a.as_str()), Some("arm64"));
        assert_eq!(m.files[2].arch, None);
        assert_eq!(b.uploads().len(), 3);
        let back = Manifest::try_from(pb::Manifest::from(m)).unwrap();
        assert_eq!(&back, m);
        let cases = [
            (
                MULTI.replace("source = \"kubelet-arm64\"", "source = \"kubelet-amd64\""),
                "file[1].source: ",
                "is an executable for x86_64 (amd64), but the entry has arch = \"arm64\"",
            ),
            (
                MULTI.replace("source = \"conf\"", "source = \"kubelet-amd64\""),
                "file[2].source: ",
                "is an executable for x86_64 (amd64), but the entry has no arch and the bundle is also for arm64",
            ),
            (
                MULTI.replace("arch = \"arm64\"\n", "arch = \"aarch64\"\n"),
                "file[1].arch: ",
                "\"aarch64\" is not an architecture name",
            ),
            (
                MULTI.replace("[\"amd64\", \"arm64\"]", "[\"amd64\", \"arm64\", \"riscv64\"]"),
                "file[0].path: ",
                "the bundle is for riscv64, but /usr/bin/kubelet has no file for it (amd64 has one); add a file with arch = \"riscv64\"",
            ),
            (
                MULTI.replace("[\"amd64\", \"arm64\"]", "[\"amd64\", \"x\"]"),
                "architectures[1]: ",
                "not an architecture name",
            ),
            (
                MULTI.replace(
                    "source = \"kubelet-arm64\"\narch = \"arm64\"\n",
                    "source = \"kubelet-arm64\"\n",
                ),
                "file[1].path: ",
                "/usr/bin/kubelet is both arch-neutral (file[1]) and for amd64 (file[0])",
            ),
        ];
        for (text, field, want) in cases {
            let e = parse_bundle_toml(&text, d.path(), &mut RequireSize).unwrap_err();
            assert!(
                e.starts_with(field) && e.contains(want),
                "expected {field}{want:?}, got {e}"
            );
            assert!(!e.contains('\n'), "one line: {e}");
        }
        // Non-executables may carry an arch: a per-arch config or script.
        let script = MULTI.replace("source = \"kubelet-arm64\"", "source = \"script\"");
        parse_bundle_toml(&script, d.path(), &mut RequireSize).unwrap();
    }

    #[test]
    fn syntax_and_unknown_fields_report_a_line() {
        let d = dir_with(&[]);
        let e = parse_bundle_toml(
            "name = \"x\"\nversion = \"1\"\nbogus = 3\n",
            d.path(),
            &mut RequireSize,
        )
        .unwrap_err();
        assert!(e.starts_with("line 3:") && e.contains("bogus"), "{e}");
        let e = parse_bundle_toml("name = \n", d.path(), &mut RequireSize).unwrap_err();
        assert!(e.starts_with("line 1:"), "{e}");
        let e = parse_bundle_toml("version = \"1\"\n", d.path(), &mut RequireSize).unwrap_err();
        assert!(e.contains("name"), "{e}");
    }

    #[test]
    fn load_error_names_the_file() {
        let d = dir_with(&[(
            BUNDLE_TOML,
            b"name = \"x\"\nversion = \"1\"\n[[file]]\npath = \"/a/../b\"\nsource = \"s\"\n",
        )]);
        let e = load_bundle_dir(d.path(), &mut RequireSize)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bundle.toml: file[0].path:"), "{e}");
        let e = load_bundle_dir(&d.path().join("nope"), &mut RequireSize)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bundle.toml: cannot read"), "{e}");
    }

    #[test]
    fn declared_sha_of_a_local_file_must_match() {
        let d = dir_with(&[("kubelet.conf", b"other")]);
        let text = GOOD.replace(
            "mode = \"0600\"",
            "mode = \"0600\"\nsha256 = \"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"",
        );
        let e = parse_bundle_toml(&text, d.path(), &mut RequireSize).unwrap_err();
        assert!(e.starts_with("file[0].sha256:"), "{e}");
    }

    #[test]
    fn integer_modes_and_sizer() {
        struct Four;
        impl UrlSizer for Four {
            fn size_of(&mut self, _: &str, _: &Digest) -> Result<u64, String> {
                Ok(4)
            }
        }
        let d = dir_with(&[("kubelet.conf", b"conf")]);
        let text = GOOD
            .replace("mode = \"0600\"", "mode = 0o640")
            .replace("size = 4\n", "");
        let b = parse_bundle_toml(&text, d.path(), &mut Four).unwrap();
        assert_eq!(b.manifest.files[0].mode, 0o640);
        assert_eq!(b.manifest.files[1].size, 4);
    }

    proptest! {
        #[test]
        fn parser_never_panics(s in "\\PC{0,200}") {
            let d = std::env::temp_dir();
            let _ = parse_bundle_toml(&s, &d, &mut RequireSize);
        }

        /// Manifest → protobuf bytes → manifest is the identity for any valid manifest.
        #[test]
        fn protobuf_round_trip(
            name in "[a-z][a-z0-9-]{0,20}",
            version in "[0-9a-z.+-]{1,20}",
            paths in prop::collection::btree_set("(/[a-z0-9_]{1,8}){1,4}", 0..6),
            mode in 0u32..0o7777,
            size in 0u64..1_000_000,
            steps in prop::collection::vec(prop::collection::vec("[ -~]{1,10}", 1..4), 0..4),
        ) {
            use prost::Message;
            let paths: Vec<BundlePath> = paths.iter().map(|p| BundlePath::new(p).unwrap()).collect();
            prop_assume!(crate::manifest::check_paths_disjoint(paths.iter()).is_ok());
            let m = Manifest {
                name, version,
                files: paths.into_iter().enumerate().map(|(i, path)| FileSpec { chunks: None, arch: None,
                    path, digest: Digest::of(&[i as u8]), size, mode,
                    url: (i % 2 == 1).then(|| format!("https://m/{i}")),
                }).collect(),
                steps: steps.into_iter().enumerate().map(|(i, run)| Step {
                    name: format!("s{i}"), run, timeout: Duration::from_millis(1 + i as u64),
                }).collect(),
                health: None,
                ..Default::default()
            };
            prop_assume!(m.validate().is_ok());
            let bytes = pb::Manifest::from(&m).encode_to_vec();
            let back: Manifest = pb::Manifest::decode(bytes.as_slice()).unwrap().try_into().unwrap();
            prop_assert_eq!(crate::canonical::encode(&back), crate::canonical::encode(&m));
            prop_assert_eq!(back, m);
        }
    }
}
