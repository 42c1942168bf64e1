//! `lksctl release` and `lksctl root`: signed release records and trust-root
//! rotations (lks_proto::release). The control server stores and hands
//! them out; nodes that require releases (`lksadmin-agent join
//! --trust-threshold N`) check them, so the keys that sign them never need
//! to be on the server.
//!
//! A release is drafted from the cluster's newest one (`create`), signed
//! where the keys are (`sign`, any number of times, one key each or
//! several), checked as a node would (`check`) and stored (`publish`).
//! Freshness is one command: `resign` makes the newest release again as a
//! new version with a later expiry, signs it and publishes it; run it from
//! a timer on a machine that holds a key (TUF's timestamp role, with the
//! release keys online there).

mod file;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Subcommand;
use lks_proto::SignedBundle;
use lks_proto::canonical::manifest_digest;
use lks_proto::duration::parse_duration;
use lks_proto::names::{parse_bundle_ref, validate_bundle_name, validate_cluster_name};
use lks_proto::pb;
use lks_proto::release::{Release, ReleasedBundle, SignedRelease, SignedRoot, TrustRoot, TrustState};
use lks_proto::sign::{PublisherKey, SigningKey};
use serde_json::{Value, json};

use crate::client::{Client, status};
use crate::output::{Format, now_ms, print_json, rfc3339_ms, table};

#[derive(Subcommand)]
pub enum ReleaseCmd {
    /// Draft the next release of a cluster: the bundles of its newest
    /// release, changed by --bundle and --drop, as a new version. Written
    /// to --out; signed with each --key; stored with --publish.
    Create {
        #[arg(long)]
        cluster: String,
        /// Release this bundle version (NAME@VERSION; repeatable): adds the
        /// bundle or replaces the version the newest release names.
        #[arg(long = "bundle", value_name = "NAME@VERSION")]
        bundles: Vec<String>,
        /// Leave this bundle out (repeatable).
        #[arg(long = "drop", value_name = "NAME")]
        drops: Vec<String>,
        /// How long nodes accept it; after that they report stale-release
        /// until a newer one arrives.
        #[arg(long, default_value = "30d", value_parser = parse_duration)]
        expires: Duration,
        /// The release's version [default: the newest stored + 1].
        #[arg(long)]
        version: Option<u64>,
        /// Sign with this ed25519 private key (PREFIX.key; repeatable).
        #[arg(long = "key", value_name = "FILE.key")]
        keys: Vec<PathBuf>,
        /// Write the release file here.
        #[arg(long, value_name = "FILE", required_unless_present = "publish")]
        out: Option<PathBuf>,
        /// Store it on the server now.
        #[arg(long)]
        publish: bool,
    },
    /// Add signatures to a release file, in place (a key that signed
    /// before signs again).
    Sign {
        file: PathBuf,
        /// ed25519 private key (PREFIX.key; repeatable).
        #[arg(long = "key", value_name = "FILE.key", required = true)]
        keys: Vec<PathBuf>,
    },
    /// Check a release file as a node trusting these keys would: its
    /// rules, its expiry and a threshold of valid signatures. No server.
    Check {
        file: PathBuf,
        /// A public key the node trusts (PREFIX.pub; repeatable).
        #[arg(long = "trust-key", value_name = "FILE.pub", required = true)]
        trust_keys: Vec<PathBuf>,
        /// How many of them must have signed.
        #[arg(long, default_value_t = 1)]
        threshold: u32,
    },
    /// Store a signed release file on the server; nodes of its cluster get
    /// it with their next desired state.
    Publish {
        file: PathBuf,
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// Make the newest release again as a new version with a later expiry,
    /// sign it and publish it: the one command that keeps nodes fresh.
    Resign {
        #[arg(long)]
        cluster: String,
        /// ed25519 private key (PREFIX.key; repeatable).
        #[arg(long = "key", value_name = "FILE.key", required = true)]
        keys: Vec<PathBuf>,
        #[arg(long, default_value = "30d", value_parser = parse_duration)]
        expires: Duration,
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// A cluster's stored releases, newest first.
    Show {
        #[arg(long)]
        cluster: String,
        /// At most this many (0: all).
        #[arg(long, default_value_t = 0)]
        limit: u32,
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
}

#[derive(Subcommand)]
pub enum RootCmd {
    /// Draft a trust-root rotation: the key set nodes trust from its
    /// version on. Nodes accept it only when a threshold of their current
    /// keys and a threshold of its own keys signed it.
    Create {
        #[arg(long)]
        cluster: String,
        /// A public key of the new root (PREFIX.pub; repeatable).
        #[arg(long = "trust-key", value_name = "FILE.pub", required = true)]
        trust_keys: Vec<PathBuf>,
        /// How many of the new keys must sign a release.
        #[arg(long, default_value_t = 1)]
        threshold: u32,
        /// "never", or how long nodes accept the root.
        #[arg(long, default_value = "never")]
        expires: String,
        /// The root's version [default: the newest stored + 1; 2 for the
        /// first rotation, since a node's own keys are root 1].
        #[arg(long)]
        version: Option<u64>,
        /// Sign with this ed25519 private key (PREFIX.key; repeatable).
        #[arg(long = "key", value_name = "FILE.key")]
        keys: Vec<PathBuf>,
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Add signatures to a root file, in place.
    Sign {
        file: PathBuf,
        #[arg(long = "key", value_name = "FILE.key", required = true)]
        keys: Vec<PathBuf>,
    },
    /// Store a signed root file on the server for its cluster's nodes.
    Publish {
        file: PathBuf,
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// A cluster's stored trust-root rotations, in version order.
    Show {
        #[arg(long)]
        cluster: String,
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
}

impl ReleaseCmd {
    /// Arguments checked before anything is read or dialled.
    pub fn check(&self) -> anyhow::Result<()> {
        match self {
            ReleaseCmd::Create {
                cluster,
                bundles,
                drops,
                version,
                ..
            } => {
                validate_cluster_name(cluster).context("--cluster")?;
                for b in bundles {
                    parse_bundle_ref(b).context("--bundle")?;
                }
                for d in drops {
                    validate_bundle_name(d).context("--drop")?;
                }
                if *version == Some(0) {
                    bail!("--version: versions start at 1");
                }
                Ok(())
            }
            ReleaseCmd::Resign { cluster, .. } | ReleaseCmd::Show { cluster, .. } => {
                validate_cluster_name(cluster).context("--cluster")
            }
            ReleaseCmd::Check { threshold: 0, .. } => bail!("--threshold must be at least 1"),
            _ => Ok(()),
        }
    }
}

impl RootCmd {
    pub fn check(&self) -> anyhow::Result<()> {
        match self {
            RootCmd::Create {
                cluster,
                threshold,
                version,
                expires,
                ..
            } => {
                validate_cluster_name(cluster).context("--cluster")?;
                if *threshold == 0 {
                    bail!("--threshold must be at least 1");
                }
                if matches!(version, Some(0 | 1)) {
                    bail!("--version: a node's own keys are root 1; a rotation is version 2 or later");
                }
                root_expiry(expires, 0).map(|_| ())
            }
            RootCmd::Show { cluster, .. } => validate_cluster_name(cluster).context("--cluster"),
            _ => Ok(()),
        }
    }
}

/// `--expires never|DURATION` of a root, as `expires_at_ms`.
fn root_expiry(v: &str, now: i64) -> anyhow::Result<i64> {
    if v == "never" {
        return Ok(TrustRoot::NEVER_EXPIRES);
    }
    let d = parse_duration(v).context("--expires (\"never\" or a duration)")?;
    Ok(now.saturating_add(ms(d)))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn load_keys(paths: &[PathBuf]) -> anyhow::Result<Vec<SigningKey>> {
    paths
        .iter()
        .map(|p| SigningKey::from_file(p).context("--key"))
        .collect()
}

fn load_public(paths: &[PathBuf]) -> anyhow::Result<Vec<PublisherKey>> {
    paths
        .iter()
        .map(|p| PublisherKey::from_file(p).context("--trust-key"))
        .collect()
}

/// Runs a command that needs no server (`release sign|check`, `root sign`).
pub fn run_offline_release(cmd: ReleaseCmd) -> anyhow::Result<()> {
    match cmd {
        ReleaseCmd::Sign { file, keys } => {
            let keys = load_keys(&keys)?;
            let mut s = file::read_release(&file)?;
            let r = s.release.clone();
            let who = file::add_signatures(&mut s.signatures, &keys, |k| k.sign_release(&r));
            file::write(&file, &file::release_json(&s))?;
            outln!(
                "signed {} with {}; {} signature(s) in {}",
                s.release.id(),
                who.join(", "),
                s.signatures.len(),
                file.display()
            );
            Ok(())
        }
        ReleaseCmd::Check {
            file,
            trust_keys,
            threshold,
        } => {
            let keys = load_public(&trust_keys)?;
            let s = file::read_release(&file)?;
            let root = TrustRoot::initial(keys, threshold).context("--trust-key/--threshold")?;
            let mut state = TrustState::new(root);
            let r = state
                .accept_release(&s, &s.release.channel, now_ms())
                .with_context(|| file.display().to_string())?;
            outln!(
                "{}: a node trusting these keys accepts {} ({} bundles, expires {})",
                file.display(),
                r.id(),
                r.bundles.len(),
                rfc3339_ms(r.expires_at_ms).unwrap_or_default()
            );
            Ok(())
        }
        _ => bail!("this release command needs the server"),
    }
}

pub fn run_offline_root(cmd: RootCmd) -> anyhow::Result<()> {
    match cmd {
        RootCmd::Sign { file, keys } => {
            let keys = load_keys(&keys)?;
            let (cluster, mut s) = file::read_root(&file)?;
            let r = s.root.clone();
            let who = file::add_signatures(&mut s.signatures, &keys, |k| k.sign_root(&r));
            file::write(&file, &file::root_json(&cluster, &s))?;
            outln!(
                "signed {} of {cluster} with {}; {} signature(s) in {}",
                s.root.id(),
                who.join(", "),
                s.signatures.len(),
                file.display()
            );
            Ok(())
        }
        _ => bail!("this root command needs the server"),
    }
}

/// Whether a command runs without a server.
pub fn release_offline(cmd: &ReleaseCmd) -> bool {
    matches!(cmd, ReleaseCmd::Sign { .. } | ReleaseCmd::Check { .. })
}

pub fn root_offline(cmd: &RootCmd) -> bool {
    matches!(cmd, RootCmd::Sign { .. })
}

/// After `rollout start`: a note when the cluster has signed releases
/// and its newest does not name the version rolled out, which nodes that
/// require releases would refuse. `None` when nothing needs saying, or
/// the releases cannot be read (the rollout itself has started).
pub async fn start_hint(c: &mut Client, url: &str, r: &pb::Rollout) -> Option<String> {
    let newest = newest(c, url, &r.cluster).await.ok()??.release;
    let named = newest.bundles.get(&r.bundle).map(|b| b.version.as_str());
    if named == Some(r.version.as_str()) {
        return None;
    }
    Some(format!(
        "note: {} does not name {}@{}; nodes of {} that require signed releases refuse it until one does \
         (lksctl release create --cluster {} --bundle {}@{} --key PREFIX.key --publish)",
        newest.id(),
        r.bundle,
        r.version,
        r.cluster,
        r.cluster,
        r.bundle,
        r.version
    ))
}

/// After `rollout rollback`: nodes that require signed releases return to
/// an older version only once a newer release names it.
pub async fn rollback_hint(c: &mut Client, url: &str, r: &pb::Rollout) -> Option<String> {
    let newest = newest(c, url, &r.cluster).await.ok()??.release;
    let named = newest.bundles.get(&r.bundle)?;
    Some(format!(
        "note: {} names {}@{}; nodes of {} that require signed releases return to an older version only \
         once a newer release names it (lksctl release create --cluster {} --bundle {}@OLD_VERSION --key PREFIX.key --publish)",
        newest.id(),
        r.bundle,
        named.version,
        r.cluster,
        r.cluster,
        r.bundle
    ))
}

async fn newest(c: &mut Client, url: &str, cluster: &str) -> anyhow::Result<Option<SignedRelease>> {
    let r = c
        .list_releases(pb::ListReleasesRequest {
            cluster: cluster.into(),
            limit: 1,
        })
        .await
        .map_err(|s| status(url, s))
        .with_context(|| format!("list the releases of {cluster}"))?
        .into_inner();
    r.releases
        .into_iter()
        .next()
        .and_then(|i| i.release)
        .map(|m| {
            SignedRelease::try_from(m).with_context(|| format!("the server's newest release of {cluster}"))
        })
        .transpose()
}

/// The digest of the canonical manifest of the published `name@version`.
async fn released_bundle(
    c: &mut Client,
    url: &str,
    name: &str,
    version: &str,
) -> anyhow::Result<ReleasedBundle> {
    let b = crate::bundle::get(c, url, &format!("{name}@{version}")).await?;
    let sb = SignedBundle::try_from(b.bundle.unwrap_or_default())
        .with_context(|| format!("bundle {name}@{version} as the server returned it"))?;
    Ok(ReleasedBundle {
        version: version.into(),
        manifest_digest: manifest_digest(&sb.manifest),
    })
}

pub async fn run_release(c: &mut Client, url: &str, cmd: ReleaseCmd) -> anyhow::Result<()> {
    match cmd {
        ReleaseCmd::Create {
            cluster,
            bundles,
            drops,
            expires,
            version,
            keys,
            out,
            publish,
        } => {
            let keys = load_keys(&keys)?;
            let base = newest(c, url, &cluster).await?;
            let have = base.as_ref().map_or(0, |b| b.release.version);
            let version = version.unwrap_or(have + 1);
            if version <= have {
                bail!(
                    "--version {version}: {cluster} already has release {have}; a new release needs a higher version"
                );
            }
            let mut set = base.map(|b| b.release.bundles).unwrap_or_default();
            for d in &drops {
                if set.remove(d).is_none() {
                    bail!("--drop {d}: release {have} of {cluster} names no such bundle");
                }
            }
            for b in &bundles {
                let (name, v) = parse_bundle_ref(b).context("--bundle")?;
                let rb = released_bundle(c, url, &name, &v).await?;
                set.insert(name, rb);
            }
            if set.is_empty() {
                bail!("{cluster} has no release to start from: name its bundles with --bundle NAME@VERSION");
            }
            let release = Release {
                channel: cluster,
                version,
                expires_at_ms: now_ms().saturating_add(ms(expires)),
                bundles: set,
            };
            release.validate()?;
            let refs: Vec<&SigningKey> = keys.iter().collect();
            let signed = SignedRelease::sign(release, &refs);
            if let Some(out) = &out {
                file::write(out, &file::release_json(&signed))?;
                outln!(
                    "wrote {} ({}; {} signature(s)) to {}",
                    signed.release.id(),
                    bundle_list(&signed.release),
                    signed.signatures.len(),
                    out.display()
                );
            }
            if publish {
                let info = publish_release(c, url, &signed).await?;
                outln!("{}", published_line(&info));
            }
            Ok(())
        }
        ReleaseCmd::Publish { file, output } => {
            let signed = file::read_release(&file)?;
            show_published(&publish_release(c, url, &signed).await?, output)
        }
        ReleaseCmd::Resign {
            cluster,
            keys,
            expires,
            output,
        } => {
            let keys = load_keys(&keys)?;
            let Some(base) = newest(c, url, &cluster).await? else {
                bail!("{cluster} has no release to sign again: create one with `lksctl release create`");
            };
            let release = Release {
                version: base.release.version + 1,
                expires_at_ms: now_ms().saturating_add(ms(expires)),
                ..base.release
            };
            let refs: Vec<&SigningKey> = keys.iter().collect();
            let info = publish_release(c, url, &SignedRelease::sign(release, &refs)).await?;
            show_published(&info, output)
        }
        ReleaseCmd::Show {
            cluster,
            limit,
            output,
        } => {
            let r = c
                .list_releases(pb::ListReleasesRequest {
                    cluster: cluster.clone(),
                    limit,
                })
                .await
                .map_err(|s| status(url, s))
                .with_context(|| format!("list the releases of {cluster}"))?
                .into_inner();
            if output == Format::Json {
                return print_json(&json!(r.releases.iter().map(release_json).collect::<Vec<_>>()));
            }
            out!("{}", releases_table(&r.releases));
            Ok(())
        }
        cmd @ (ReleaseCmd::Sign { .. } | ReleaseCmd::Check { .. }) => run_offline_release(cmd),
    }
}

/// `release show` as a table, an expired release marked.
fn releases_table(releases: &[pb::ReleaseInfo]) -> String {
    let now = now_ms();
    let rows: Vec<Vec<String>> = releases
        .iter()
        .filter_map(|i| {
            let pbr = i.release.as_ref()?;
            let rel = pbr.release.as_ref()?;
            let expiry = rfc3339_ms(rel.expires_at_ms).unwrap_or_else(|| "-".into());
            Some(vec![
                rel.version.to_string(),
                if rel.expires_at_ms <= now {
                    format!("{expiry} (expired)")
                } else {
                    expiry
                },
                pb_bundle_list(rel),
                signers(&pbr.signatures),
                rfc3339_ms(i.published_at_ms).unwrap_or_else(|| "-".into()),
            ])
        })
        .collect();
    table(
        &["VERSION", "EXPIRES", "BUNDLES", "SIGNED BY", "PUBLISHED"],
        &rows,
    )
}

pub async fn run_root(c: &mut Client, url: &str, cmd: RootCmd) -> anyhow::Result<()> {
    match cmd {
        RootCmd::Create {
            cluster,
            trust_keys,
            threshold,
            expires,
            version,
            keys,
            out,
        } => {
            let new_keys = load_public(&trust_keys)?;
            let signing = load_keys(&keys)?;
            let have = list_roots(c, url, &cluster)
                .await?
                .iter()
                .filter_map(|i| i.root.as_ref()?.root.as_ref().map(|r| r.version))
                .max()
                .unwrap_or(1);
            let version = version.unwrap_or(have + 1);
            if version != have + 1 {
                bail!(
                    "--version {version}: the newest trust root of {cluster} is {have}, so the next is {}",
                    have + 1
                );
            }
            let mut root = TrustRoot::initial(new_keys, threshold).context("--trust-key/--threshold")?;
            root.version = version;
            root.expires_at_ms = root_expiry(&expires, now_ms())?;
            let refs: Vec<&SigningKey> = signing.iter().collect();
            let signed = SignedRoot::sign(root, &refs);
            file::write(&out, &file::root_json(&cluster, &signed))?;
            outln!(
                "wrote {} of {cluster} ({} keys, threshold {}; {} signature(s)) to {}",
                signed.root.id(),
                signed.root.keys.len(),
                signed.root.threshold,
                signed.signatures.len(),
                out.display()
            );
            outln!(
                "nodes accept it once a threshold of their current keys and {} of its own keys have signed it",
                signed.root.threshold
            );
            Ok(())
        }
        RootCmd::Publish { file, output } => {
            let (cluster, signed) = file::read_root(&file)?;
            let info = c
                .publish_root(pb::PublishRootRequest {
                    cluster: cluster.clone(),
                    root: Some((&signed).into()),
                })
                .await
                .map_err(|s| status(url, s))
                .with_context(|| format!("publish {} of {cluster}", signed.root.id()))?
                .into_inner();
            if output == Format::Json {
                print_json(&root_json(&info))
            } else {
                outln!(
                    "published {} of {cluster}; its nodes get it with their next desired state",
                    signed.root.id()
                );
                Ok(())
            }
        }
        RootCmd::Show { cluster, output } => {
            let roots = list_roots(c, url, &cluster).await?;
            if output == Format::Json {
                return print_json(&json!(roots.iter().map(root_json).collect::<Vec<_>>()));
            }
            let rows: Vec<Vec<String>> = roots
                .iter()
                .filter_map(|i| {
                    let s = i.root.as_ref()?;
                    let r = s.root.as_ref()?;
                    Some(vec![
                        r.version.to_string(),
                        r.threshold.to_string(),
                        key_list(&r.keys),
                        rfc3339_ms(r.expires_at_ms).unwrap_or_else(|| "never".into()),
                        signers(&s.signatures),
                        rfc3339_ms(i.published_at_ms).unwrap_or_else(|| "-".into()),
                    ])
                })
                .collect();
            out!(
                "{}",
                table(
                    &[
                        "VERSION",
                        "THRESHOLD",
                        "KEYS",
                        "EXPIRES",
                        "SIGNED BY",
                        "PUBLISHED"
                    ],
                    &rows
                )
            );
            Ok(())
        }
        cmd @ RootCmd::Sign { .. } => run_offline_root(cmd),
    }
}

async fn list_roots(c: &mut Client, url: &str, cluster: &str) -> anyhow::Result<Vec<pb::RootInfo>> {
    Ok(c.list_roots(pb::ListRootsRequest {
        cluster: cluster.into(),
    })
    .await
    .map_err(|s| status(url, s))
    .with_context(|| format!("list the trust roots of {cluster}"))?
    .into_inner()
    .roots)
}

async fn publish_release(c: &mut Client, url: &str, s: &SignedRelease) -> anyhow::Result<pb::ReleaseInfo> {
    if s.signatures.is_empty() {
        bail!(
            "{} is not signed: sign it with `lksctl release sign FILE --key PREFIX.key` first",
            s.release.id()
        );
    }
    Ok(c.publish_release(pb::PublishReleaseRequest {
        release: Some(s.into()),
    })
    .await
    .map_err(|st| status(url, st))
    .with_context(|| format!("publish {}", s.release.id()))?
    .into_inner())
}

/// What `release publish|resign` print: one line, or the stored release.
fn show_published(info: &pb::ReleaseInfo, output: Format) -> anyhow::Result<()> {
    if output == Format::Json {
        print_json(&release_json(info))
    } else {
        outln!("{}", published_line(info));
        Ok(())
    }
}

fn published_line(i: &pb::ReleaseInfo) -> String {
    let Some(r) = i.release.as_ref().and_then(|s| s.release.as_ref()) else {
        return "published".into();
    };
    format!(
        "published release {} of {} ({}; expires {}); its nodes get it with their next desired state",
        r.version,
        r.channel,
        pb_bundle_list(r),
        rfc3339_ms(r.expires_at_ms).unwrap_or_else(|| "-".into())
    )
}

fn bundle_list(r: &Release) -> String {
    r.bundles
        .iter()
        .map(|(n, b)| format!("{n}@{}", b.version))
        .collect::<Vec<_>>()
        .join(", ")
}

fn pb_bundle_list(r: &pb::Release) -> String {
    let mut v: Vec<String> = r
        .bundles
        .iter()
        .map(|b| format!("{}@{}", b.name, b.version))
        .collect();
    v.sort();
    v.join(",")
}

fn fingerprint(raw: &[u8]) -> String {
    crate::output::key_fingerprint(raw).unwrap_or_else(|| "(not a key)".into())
}

fn signers(sigs: &[pb::KeySignature]) -> String {
    if sigs.is_empty() {
        return "-".into();
    }
    sigs.iter()
        .map(|s| fingerprint(&s.public_key))
        .collect::<Vec<_>>()
        .join(",")
}

fn key_list(keys: &[Vec<u8>]) -> String {
    keys.iter().map(|k| fingerprint(k)).collect::<Vec<_>>().join(",")
}

/// One stored release as `-o json` prints it.
pub fn release_json(i: &pb::ReleaseInfo) -> Value {
    let s = i.release.clone().unwrap_or_default();
    let r = s.release.clone().unwrap_or_default();
    let bundles: serde_json::Map<String, Value> = r
        .bundles
        .iter()
        .map(|b| {
            (
                b.name.clone(),
                json!({"version": b.version, "manifest_digest": b.manifest_digest}),
            )
        })
        .collect();
    json!({
        "cluster": r.channel,
        "version": r.version,
        "expires_at": rfc3339_ms(r.expires_at_ms),
        "bundles": bundles,
        "signed_by": s.signatures.iter().map(|k| fingerprint(&k.public_key)).collect::<Vec<_>>(),
        "digest": i.digest,
        "published_at": rfc3339_ms(i.published_at_ms),
    })
}

/// One stored root as `-o json` prints it.
pub fn root_json(i: &pb::RootInfo) -> Value {
    let s = i.root.clone().unwrap_or_default();
    let r = s.root.clone().unwrap_or_default();
    json!({
        "cluster": i.cluster,
        "version": r.version,
        "threshold": r.threshold,
        "keys": r.keys.iter().map(|k| fingerprint(k)).collect::<Vec<_>>(),
        "expires_at": rfc3339_ms(r.expires_at_ms),
        "signed_by": s.signatures.iter().map(|k| fingerprint(&k.public_key)).collect::<Vec<_>>(),
        "published_at": rfc3339_ms(i.published_at_ms),
    })
}
