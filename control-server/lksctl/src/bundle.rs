//! `lksctl bundle`: write a publisher key pair, publish a bundle directory
//! (its manifest, signed or not, then the files it names, streamed), list,
//! delete, and `get NAME@VERSION`: one published bundle with what its
//! manifest holds — files, steps, health check, certificates, kubeconfigs —
//! and who signed it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use lks_proto::SignedBundle;
use lks_proto::authoring::load_bundle_dir;
use lks_proto::duration::format_duration;
use lks_proto::names::parse_bundle_ref;
use lks_proto::pb::{self, publish_bundle_request::Msg as PublishMsg};
use lks_proto::sign::SigningKey;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::client::{Client, status};
use crate::mirror;
use crate::output::{self, Format, print_json, table};

/// Upload chunk size for bundle files.
const CHUNK: usize = 1 << 20;

#[derive(Subcommand)]
pub enum BundleCmd {
    /// Write a new ed25519 publisher key pair: PREFIX.key and PREFIX.pub.
    Keygen {
        #[arg(long)]
        out: PathBuf,
    },
    /// Publish the bundle in DIR (its bundle.toml and files).
    Publish {
        dir: PathBuf,
        /// Sign the manifest with this ed25519 private key (PREFIX.key).
        #[arg(long)]
        sign_key: Option<PathBuf>,
    },
    /// Show one published bundle: signer, files, steps, health check, certificates.
    Get {
        /// NAME@VERSION
        bundle: String,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// Delete one bundle version. Refused, naming them, while a rollout,
    /// a node's desired state or a cluster's target uses it; the blob
    /// garbage collector then reclaims the bytes no other version uses.
    Delete {
        /// NAME@VERSION
        bundle: String,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// List published bundles.
    List {
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
}

/// `lksctl bundle …`.
pub async fn run(c: &mut Client, url: &str, cmd: BundleCmd) -> anyhow::Result<()> {
    let st = |s: tonic::Status| status(url, s);
    match cmd {
        BundleCmd::Keygen { out } => keygen(&out)?,
        BundleCmd::Publish { dir, sign_key } => publish(c, url, &dir, sign_key.as_deref()).await?,
        BundleCmd::Get { bundle, output } => {
            let b = get(c, url, &bundle).await?;
            if output == Format::Json {
                print_json(&detail_json(&b))?;
            } else {
                out!("{}", detail_text(&b));
            }
        }
        BundleCmd::Delete { bundle, output } => {
            let r = delete(c, url, &bundle).await?;
            if output == Format::Json {
                print_json(&serde_json::json!({
                    "name": r.name,
                    "version": r.version,
                    "reclaimable_bytes": r.reclaimable_bytes,
                }))?;
            } else {
                outln!(
                    "bundle {}@{} deleted; {} bytes no other version uses go at the next blob garbage collection",
                    r.name,
                    r.version,
                    r.reclaimable_bytes
                );
            }
        }
        BundleCmd::List { output } => {
            let r = c
                .list_bundles(pb::ListBundlesRequest::default())
                .await
                .map_err(st)
                .context("list bundles")?
                .into_inner();
            if output == Format::Json {
                print_json(&serde_json::json!(
                    r.bundles.iter().map(output::bundle_json).collect::<Vec<_>>()
                ))?;
            } else {
                out!("{}", output::bundles_table(&r.bundles));
            }
        }
    }
    Ok(())
}

pub fn keygen(out: &Path) -> anyhow::Result<()> {
    let (k, p) = SigningKey::generate()
        .write_pair(out)
        .context("write publisher key pair")?;
    outln!(
        "wrote {} (private, keep it secret) and {}",
        k.display(),
        p.display()
    );
    Ok(())
}

async fn publish(c: &mut Client, url: &str, dir: &Path, sign_key: Option<&Path>) -> anyhow::Result<()> {
    // Loading hashes every local file and may download mirrored ones whose
    // size is not given: blocking work, off the async threads.
    let handle = tokio::runtime::Handle::current();
    let bundle_dir = dir.to_path_buf();
    let authored = tokio::task::spawn_blocking(move || {
        let mut sizer = mirror::MirrorSizer::new(handle).map_err(anyhow::Error::from)?;
        load_bundle_dir(&bundle_dir, &mut sizer).map_err(anyhow::Error::from)
    })
    .await
    .context("load bundle")?
    .with_context(|| format!("load bundle {}", dir.display()))?;
    let key = sign_key
        .map(SigningKey::from_file)
        .transpose()
        .context("load signing key")?;
    let manifest = authored.manifest.clone();
    let id = manifest.id();
    let signed = match &key {
        Some(k) => k.sign_bundle(manifest),
        None => SignedBundle {
            chunks_signature: None,
            signature: None,
            manifest,
        },
    };
    let header = pb::PublishBundleRequest {
        msg: Some(PublishMsg::Header(pb::SignedBundle::from(&signed))),
    };
    let uploads = authored.uploads();
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::PublishBundleRequest>(4);
    // Files are read while the upload runs, so memory stays at a few chunks.
    let reader = tokio::spawn(async move {
        if tx.send(header).await.is_err() {
            return Ok(());
        }
        for (digest, _size, path) in uploads {
            let mut f = tokio::fs::File::open(&path)
                .await
                .with_context(|| format!("open {}", path.display()))?;
            let mut buf = vec![0u8; CHUNK];
            let mut sent_any = false;
            loop {
                let n = f
                    .read(&mut buf)
                    .await
                    .with_context(|| format!("read {}", path.display()))?;
                if n == 0 && sent_any {
                    break;
                }
                let msg = pb::PublishBundleRequest {
                    msg: Some(PublishMsg::Chunk(pb::FileChunk {
                        digest: digest.to_string(),
                        data: buf[..n].to_vec(),
                    })),
                };
                if tx.send(msg).await.is_err() {
                    return Ok(());
                }
                sent_any = true;
                if n == 0 {
                    break;
                }
            }
        }
        Ok::<(), anyhow::Error>(())
    });
    let result = c
        .publish_bundle(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await;
    let read = reader.await.context("upload task")?;
    let r = match result {
        Ok(r) => r.into_inner(),
        Err(s) => {
            read.with_context(|| format!("publish {id}"))?;
            return Err(status(url, s)).with_context(|| format!("publish {id}"));
        }
    };
    read.with_context(|| format!("publish {id}"))?;
    if !r.created {
        eprintln!("{id} was already published with identical content; nothing changed");
    }
    outln!("{}@{}", r.name, r.version);
    Ok(())
}

/// Fetches `NAME@VERSION`.
pub async fn get(c: &mut Client, url: &str, reference: &str) -> anyhow::Result<pb::Bundle> {
    let (name, version) = parse_bundle_ref(reference)?;
    c.get_bundle(pb::GetBundleRequest { name, version })
        .await
        .map_err(|s| status(url, s))
        .with_context(|| format!("get bundle {reference}"))
        .map(tonic::Response::into_inner)
}

/// `bundle delete NAME@VERSION`.
pub async fn delete(c: &mut Client, url: &str, reference: &str) -> anyhow::Result<pb::DeleteBundleResponse> {
    let (name, version) = parse_bundle_ref(reference)?;
    c.delete_bundle(pb::GetBundleRequest { name, version })
        .await
        .map_err(|s| status(url, s))
        .with_context(|| format!("delete bundle {reference}"))
        .map(tonic::Response::into_inner)
}

fn ms(v: u64) -> Option<String> {
    (v > 0).then(|| format_duration(Duration::from_millis(v)))
}

/// `ed25519:…` fingerprint of the signer's key, as the agent names trusted keys.
fn signer(b: &pb::SignedBundle) -> Option<String> {
    output::key_fingerprint(&b.signer_public_key)
}

fn mode(m: u32) -> String {
    format!("{m:04o}")
}

/// `bundle get -o json`: `bundle list -o json`'s fields, `signer`, and the
/// manifest.
pub fn detail_json(b: &pb::Bundle) -> Value {
    let mut v = b
        .info
        .as_ref()
        .map(output::bundle_json)
        .unwrap_or_else(|| json!({}));
    let sb = b.bundle.clone().unwrap_or_default();
    let m = sb.manifest.clone().unwrap_or_default();
    v["signer"] = json!(signer(&sb));
    // `reboot = "required"`: nodes need a reboot once it is applied; null: not.
    v["reboot"] = json!(m.reboot_required.then_some("required"));
    v["manifest"] = json!({
        "files": m.files.iter().map(|f| json!({
            "path": f.path,
            "size": f.size,
            "sha256": f.digest.strip_prefix("sha256:").unwrap_or(&f.digest),
            "mode": mode(f.mode),
            "url": (!f.url.is_empty()).then_some(&f.url),
            // null: every node installs it.
            "arch": (!f.arch.is_empty()).then_some(&f.arch),
        })).collect::<Vec<_>>(),
        // As declared in bundle.toml (`architectures` above: in effect).
        "architectures": m.architectures,
        "steps": m.steps.iter().map(|s| json!({
            "name": s.name,
            "run": s.run,
            "timeout": ms(s.timeout_ms),
            // Also run after a heal pass restored a file of the bundle.
            "on_heal": s.on_heal,
        })).collect::<Vec<_>>(),
        "health": m.health.as_ref().map(|h| json!({
            "run": h.run,
            "timeout": ms(h.timeout_ms),
            "retries": h.retries,
            "interval": ms(h.interval_ms),
        })),
        "certificates": m.certificates.iter().map(|c| json!({
            "path": c.path,
            "key_path": c.key_path,
            "profile": c.profile,
            "common_name": (!c.common_name.is_empty()).then_some(&c.common_name),
            "organizations": c.organizations,
            "dns_names": c.dns_names,
            "ip_addresses": c.ip_addresses,
            "ttl": ms(c.ttl_ms),
            "ca_path": (!c.ca_path.is_empty()).then_some(&c.ca_path),
        })).collect::<Vec<_>>(),
        "kubeconfigs": m.kubeconfigs.iter().map(|k| json!({
            "path": k.path,
            "certificate": k.certificate,
        })).collect::<Vec<_>>(),
    });
    // Not part of the manifest: the binary deltas the server holds for its
    // files (made after the publish), one per file and earlier version.
    v["deltas"] = json!(
        b.deltas
            .iter()
            .map(|d| json!({
                "path": d.path,
                "arch": (!d.arch.is_empty()).then_some(&d.arch),
                "from_version": d.from_version,
                "size": d.patch_size,
                "file_size": d.size,
                "sha256": d.patch_digest.strip_prefix("sha256:").unwrap_or(&d.patch_digest),
                "base_sha256": d.base_digest.strip_prefix("sha256:").unwrap_or(&d.base_digest),
                "algorithm": d.algorithm,
            }))
            .collect::<Vec<_>>()
    );
    // The pairs tried without a patch, and why (issue [upgrade-cost]).
    v["no_deltas"] = json!(b.no_deltas.iter().map(no_delta_json).collect::<Vec<_>>());
    v
}

/// One file and base without a patch: `reason` (`estimate`, `memory`,
/// `too_large`, `unknown` for a record older than the reasons), the
/// numbers behind it, and `message`, the reason in words.
fn no_delta_json(d: &pb::NoDelta) -> Value {
    use pb::NoDeltaReason as R;
    let reason = d.reason();
    let message = match reason {
        R::Estimate => format!("estimated saving {}% < {}%", d.estimated_saving, d.min_saving),
        R::Memory => format!(
            "making it needs about {} of memory > --delta-max-memory {}",
            output::bytes_text(d.memory_needed),
            output::bytes_text(d.memory_cap)
        ),
        R::TooLarge => format!(
            "the patch ({}) was over half the file",
            output::bytes_text(d.patch_size)
        ),
        R::Unspecified if d.note.is_empty() => "tried, not kept".to_string(),
        R::Unspecified => d.note.clone(),
    };
    let when = |r: R, v: Value| if reason == r { v } else { Value::Null };
    json!({
        "path": d.path,
        "arch": (!d.arch.is_empty()).then_some(&d.arch),
        "from_version": d.from_version,
        "file_size": d.size,
        "base_sha256": d.base_digest.strip_prefix("sha256:").unwrap_or(&d.base_digest),
        "reason": match reason {
            R::Estimate => "estimate",
            R::Memory => "memory",
            R::TooLarge => "too_large",
            R::Unspecified => "unknown",
        },
        "message": message,
        "estimated_saving": when(R::Estimate, json!(d.estimated_saving)),
        "min_saving": when(R::Estimate, json!(d.min_saving)),
        "memory_needed": when(R::Memory, json!(d.memory_needed)),
        "memory_cap": when(R::Memory, json!(d.memory_cap)),
        "patch_size": when(R::TooLarge, json!(d.patch_size)),
    })
}

fn indented(s: &mut String, t: String) {
    for l in t.lines() {
        s.push_str("  ");
        s.push_str(l);
        s.push('\n');
    }
}

pub fn detail_text(b: &pb::Bundle) -> String {
    let v = detail_json(b);
    let str_of = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    let mut s = String::new();
    let kv = |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<12}{v}\n"));
    kv(
        &mut s,
        "Bundle:",
        format!("{}@{}", str_of(&v["name"]), str_of(&v["version"])),
    );
    kv(&mut s, "Digest:", str_of(&v["manifest_digest"]));
    kv(
        &mut s,
        "Signer:",
        v["signer"].as_str().unwrap_or("unsigned").to_string(),
    );
    kv(&mut s, "Published:", str_of(&v["published_at"]));
    let arches: Vec<String> = v["architectures"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect())
        .unwrap_or_default();
    kv(&mut s, "Arch:", output::arches_text(&arches));
    kv(
        &mut s,
        "Reboot:",
        v["reboot"].as_str().unwrap_or("not required").to_string(),
    );
    let m = &v["manifest"];
    let rows = |key: &str, cols: &[&str]| -> Vec<Vec<String>> {
        m[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| cols.iter().map(|c| str_of(&e[*c])).collect())
                    .collect()
            })
            .unwrap_or_default()
    };
    s.push_str("Files:\n");
    let per_arch = m["files"]
        .as_array()
        .is_some_and(|a| a.iter().any(|f| f["arch"].is_string()));
    let (head, cols): (&[&str], &[&str]) = if per_arch {
        (
            &["PATH", "SIZE", "MODE", "SHA256", "ARCH"],
            &["path", "size", "mode", "sha256", "arch"],
        )
    } else {
        (
            &["PATH", "SIZE", "MODE", "SHA256"],
            &["path", "size", "mode", "sha256"],
        )
    };
    indented(&mut s, table(head, &rows("files", cols)));
    if let Some(steps) = m["steps"].as_array().filter(|a| !a.is_empty()) {
        s.push_str("Steps:\n");
        let rows: Vec<Vec<String>> = steps
            .iter()
            .map(|st| {
                vec![
                    str_of(&st["name"]),
                    run_text(&st["run"]),
                    str_of(&st["timeout"]),
                    if st["on_heal"] == true { "yes" } else { "no" }.into(),
                ]
            })
            .collect();
        indented(&mut s, table(&["NAME", "RUN", "TIMEOUT", "ON HEAL"], &rows));
    }
    if let Some(h) = m["health"].as_object() {
        kv(
            &mut s,
            "Health:",
            format!(
                "{} (timeout {}, {} retries, every {})",
                run_text(&h["run"]),
                str_of(&h["timeout"]),
                str_of(&h["retries"]),
                str_of(&h["interval"])
            ),
        );
    }
    if let Some(deltas) = v["deltas"].as_array().filter(|a| !a.is_empty()) {
        s.push_str("Deltas:\n");
        let rows: Vec<Vec<String>> = deltas
            .iter()
            .map(|d| {
                vec![
                    str_of(&d["path"]),
                    str_of(&d["from_version"]),
                    str_of(&d["size"]),
                    str_of(&d["algorithm"]),
                ]
            })
            .collect();
        indented(&mut s, table(&["PATH", "FROM", "SIZE", "ALGORITHM"], &rows));
    }
    if let Some(none) = v["no_deltas"].as_array().filter(|a| !a.is_empty()) {
        s.push_str("No patch:\n");
        let rows: Vec<Vec<String>> = none
            .iter()
            .map(|d| {
                vec![
                    str_of(&d["path"]),
                    str_of(&d["from_version"]),
                    format!("none ({})", str_of(&d["message"])),
                ]
            })
            .collect();
        indented(&mut s, table(&["PATH", "FROM", "PATCH"], &rows));
    }
    if m["certificates"].as_array().is_some_and(|a| !a.is_empty()) {
        s.push_str("Certificates:\n");
        indented(
            &mut s,
            table(
                &["PATH", "PROFILE", "KEY", "TTL"],
                &rows("certificates", &["path", "profile", "key_path", "ttl"]),
            ),
        );
    }
    if m["kubeconfigs"].as_array().is_some_and(|a| !a.is_empty()) {
        s.push_str("Kubeconfigs:\n");
        indented(
            &mut s,
            table(
                &["PATH", "CERTIFICATE"],
                &rows("kubeconfigs", &["path", "certificate"]),
            ),
        );
    }
    s
}

fn run_text(v: &Value) -> String {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detail_json_shows_the_manifest_and_the_signer() {
        let key = lks_proto::sign::SigningKey::generate().public();
        let b = pb::Bundle {
            info: Some(pb::BundleInfo {
                name: "k".into(),
                version: "1".into(),
                files: 1,
                ..Default::default()
            }),
            bundle: Some(pb::SignedBundle {
                chunks_signature: Vec::new(),
                manifest: Some(pb::Manifest {
                    name: "k".into(),
                    version: "1".into(),
                    files: vec![pb::FileEntry {
                        chunk_size: 0,
                        chunk_digests: Vec::new(),
                        path: "/etc/k.conf".into(),
                        digest: format!("sha256:{}", "ab".repeat(32)),
                        size: 3,
                        mode: 0o640,
                        url: String::new(),
                        arch: String::new(),
                    }],
                    steps: vec![pb::Step {
                        name: "restart".into(),
                        run: vec!["systemctl".into(), "restart".into(), "k".into()],
                        timeout_ms: 30_000,
                        on_heal: true,
                    }],
                    ..Default::default()
                }),
                signature: vec![0; 64],
                signer_public_key: key.to_bytes().to_vec(),
            }),
            deltas: vec![pb::HeldDelta {
                path: "/etc/k.conf".into(),
                arch: String::new(),
                from_version: "0".into(),
                base_digest: format!("sha256:{}", "cd".repeat(32)),
                patch_digest: format!("sha256:{}", "ef".repeat(32)),
                patch_size: 2,
                size: 3,
                algorithm: "bsdiff4".into(),
            }],
            no_deltas: vec![pb::NoDelta {
                path: "/usr/bin/k".into(),
                from_version: "0".into(),
                base_digest: format!("sha256:{}", "cd".repeat(32)),
                size: 1 << 20,
                reason: pb::NoDeltaReason::Estimate.into(),
                estimated_saving: 3,
                min_saving: 50,
                note: "estimated saving 3% < 50%".into(),
                ..Default::default()
            }],
        };
        let v = detail_json(&b);
        assert_eq!(v["name"], "k");
        assert_eq!(v["files"], 1, "the list's count stays");
        assert_eq!(v["signer"], key.fingerprint());
        let f = &v["manifest"]["files"][0];
        assert_eq!(
            (&f["mode"], &f["sha256"]),
            (&json!("0640"), &json!("ab".repeat(32)))
        );
        assert_eq!(v["manifest"]["steps"][0]["timeout"], "30s");
        assert_eq!(v["manifest"]["steps"][0]["on_heal"], true);
        assert!(v["manifest"]["health"].is_null());
        assert!(v["reboot"].is_null());
        let t = detail_text(&b);
        assert!(t.contains("Reboot:     not required\n"), "{t}");
        let mut rebooting = b.clone();
        if let Some(m) = rebooting.bundle.as_mut().and_then(|sb| sb.manifest.as_mut()) {
            m.reboot_required = true;
        }
        assert_eq!(detail_json(&rebooting)["reboot"], "required");
        assert!(detail_text(&rebooting).contains("Reboot:     required\n"));
        assert!(t.contains("/etc/k.conf  3     0640"), "{t}");
        assert!(t.contains("systemctl restart k"), "{t}");
        assert!(t.contains("ON HEAL") && t.contains("30s      yes"), "{t}");
        let d = &v["deltas"][0];
        assert_eq!(
            (&d["from_version"], &d["size"], &d["arch"]),
            (&json!("0"), &json!(2), &Value::Null)
        );
        assert_eq!(d["sha256"], "ef".repeat(32));
        assert!(
            t.contains("Deltas:") && t.contains("/etc/k.conf  0     2     bsdiff4"),
            "{t}"
        );
        let n = &v["no_deltas"][0];
        assert_eq!(
            (
                &n["reason"],
                &n["estimated_saving"],
                &n["min_saving"],
                &n["memory_cap"]
            ),
            (&json!("estimate"), &json!(3), &json!(50), &Value::Null)
        );
        assert_eq!(n["message"], "estimated saving 3% < 50%");
        assert!(
            t.contains("No patch:") && t.contains("/usr/bin/k  0     none (estimated saving 3% < 50%)"),
            "{t}"
        );
    }

    #[test]
    fn each_reason_for_no_patch_says_its_numbers() {
        let d = |reason: pb::NoDeltaReason| pb::NoDelta {
            reason: reason.into(),
            memory_needed: 3 << 30,
            memory_cap: 2 << 30,
            patch_size: 600 << 20,
            note: "the patch (629145600 bytes) is over 50 % of the file".into(),
            ..Default::default()
        };
        let m = |r| no_delta_json(&d(r))["message"].as_str().unwrap().to_string();
        assert!(m(pb::NoDeltaReason::Memory).contains("3.0 GiB of memory > --delta-max-memory 2.0 GiB"));
        assert!(m(pb::NoDeltaReason::TooLarge).contains("600.0 MiB"));
        assert_eq!(
            no_delta_json(&d(pb::NoDeltaReason::Unspecified))["reason"],
            "unknown"
        );
        assert!(m(pb::NoDeltaReason::Unspecified).contains("over 50 %"));
    }
}
