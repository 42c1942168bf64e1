//! The local view printed by `lksadmin-agent status`: the state dir's
//! records and the connection status file `run` keeps up to date
//! ([`ConnStatus`], written by the connection).

use lks_proto::BundleState;
use lks_proto::fsutil::{self, FsError};

use crate::apply::journal::Journal;
use crate::apply::report::TrustReport;
use crate::apply::state::{Activity, LocalState};
use crate::apply::trust::Trust;
use crate::clock::{now_ms, when};
use crate::config::{ConfigError, StateDir};
use crate::link::status_file::ConnStatus;
use crate::node::reboot::{RebootFile, Stance};

/// A `run` that has not refreshed the status file for this long is
/// considered gone (heartbeats refresh it every few seconds).
const STALE_MS: i64 = 45_000;

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Fs(#[from] FsError),
}

#[derive(serde::Serialize)]
struct BundleView {
    name: String,
    version: String,
    state: BundleState,
    message: String,
    updated_at_ms: i64,
}

/// A certificate this node made for a bundle (`[[certificate]]`).
#[derive(serde::Serialize)]
struct CertView {
    bundle: String,
    path: String,
    profile: String,
    serial: String,
    not_after: String,
    not_after_ms: i64,
    /// `valid`; `renewing` once past its renewal point; `expired`.
    state: &'static str,
}

#[derive(serde::Serialize)]
struct ConnectionView {
    agent_running: bool,
    connected: bool,
    server: String,
    since_ms: i64,
    last_contact_ms: i64,
    last_error: String,
}

#[derive(serde::Serialize)]
struct InProgress {
    bundle: String,
    target: String,
    phase: &'static str,
}

#[derive(serde::Serialize)]
struct StatusView {
    node: String,
    cluster: String,
    servers: Vec<String>,
    root: String,
    desired_generation: u64,
    bundles: Vec<BundleView>,
    certificates: Vec<CertView>,
    in_progress: Option<InProgress>,
    last_apply: Option<Activity>,
    last_repair: Option<Activity>,
    connection: ConnectionView,
    /// Release trust as the journal (`trust.json`) says at this moment.
    trust: TrustReport,
    /// What `reboot.json` records (bundles that need a reboot, the reboot
    /// in progress or its failure), in this boot; the sentinel and the
    /// check command are `run`'s to read.
    reboot: RebootView,
}

#[derive(serde::Serialize)]
struct RebootView {
    /// "none", "required", "rebooting", "failed".
    state: &'static str,
    reason: String,
    since_ms: i64,
    boot_id: String,
    request: u64,
}

/// `reboot.json` as of this boot (not written: `run` owns it).
fn reboot_view(dirs: &StateDir) -> Result<RebootView, StatusError> {
    let mut file: RebootFile = fsutil::read_json(&dirs.reboot())?.unwrap_or_default();
    file.on_boot(&crate::node::reboot::boot_id());
    let r = file.report(&[]);
    Ok(RebootView {
        state: match r.state {
            Stance::None => "none",
            s => s.as_str(),
        },
        reason: r.reason,
        since_ms: r.since_ms,
        boot_id: r.boot_id,
        request: r.request,
    })
}

fn gather(dirs: &StateDir) -> Result<StatusView, StatusError> {
    let cfg = dirs.load_config()?;
    let state = LocalState::load(&dirs.state())?;
    let conn: ConnStatus = fsutil::read_json(&dirs.status())?.unwrap_or_default();
    let now = now_ms();
    let alive = conn.pid != 0
        && now - conn.updated_at_ms < STALE_MS
        && nix::sys::signal::kill(nix::unistd::Pid::from_raw(conn.pid as i32), None).is_ok();
    let in_progress = Journal::new(dirs.journal()).load()?.map(|t| InProgress {
        bundle: t.bundle.clone(),
        target: t.describe(),
        phase: t.phase.name(),
    });
    let cache = crate::apply::cache::Cache::new(dirs.cache());
    let mut certificates = Vec::new();
    for (name, r) in &state.bundles {
        let Some(m) = &r.installed else { continue };
        for c in &m.certificates {
            let Some(f) = m.issued.iter().find(|f| f.path == c.path) else {
                continue;
            };
            let Some(v) = std::fs::read(cache.blob_path(&f.digest))
                .ok()
                .and_then(|b| crate::node::certs::validity(&b))
            else {
                continue;
            };
            let state = if now >= v.not_after_ms {
                "expired"
            } else if now >= crate::node::certs::renew_at_ms(&cfg.node_name, &v, c.ttl) {
                "renewing"
            } else {
                "valid"
            };
            certificates.push(CertView {
                bundle: name.clone(),
                path: c.path.to_string(),
                profile: c.profile.as_str().into(),
                serial: v.serial.clone(),
                not_after: when(v.not_after_ms),
                not_after_ms: v.not_after_ms,
                state,
            });
        }
    }
    let trust = if cfg.trust_threshold == 0 {
        TrustReport::default()
    } else {
        let keys = dirs.trusted_keys().unwrap_or_default();
        let mut t = Trust::load(&dirs.trust(), &cfg.cluster, keys, cfg.trust_threshold);
        t.refresh(now);
        t.report(now)
    };
    Ok(StatusView {
        reboot: reboot_view(dirs)?,
        trust,
        certificates,
        node: cfg.node_name,
        cluster: cfg.cluster,
        servers: cfg.servers,
        root: cfg.root.display().to_string(),
        desired_generation: state.generation,
        bundles: state
            .bundles
            .iter()
            .map(|(name, r)| BundleView {
                name: name.clone(),
                version: r.status.version.clone(),
                state: r.status.state,
                message: r.status.message.clone(),
                updated_at_ms: r.status.updated_at_ms,
            })
            .collect(),
        in_progress,
        last_apply: state.last_apply,
        last_repair: state.last_repair,
        connection: ConnectionView {
            agent_running: alive,
            connected: alive && conn.connected,
            server: conn.server,
            since_ms: conn.since_ms,
            last_contact_ms: conn.last_contact_ms,
            last_error: conn.last_error,
        },
    })
}

/// The text `status` prints: JSON or a human summary.
pub fn render(dirs: &StateDir, json: bool) -> Result<String, StatusError> {
    let v = gather(dirs)?;
    if json {
        return Ok(serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    let mut out = String::new();
    let line = |out: &mut String, k: &str, v: &str| out.push_str(&format!("{k:<13} {v}\n"));
    line(&mut out, "node:", &format!("{} (cluster {})", v.node, v.cluster));
    line(&mut out, "servers:", &v.servers.join(", "));
    line(&mut out, "root:", &v.root);
    let c = &v.connection;
    let conn = if !c.agent_running {
        "agent not running".to_string()
    } else if c.connected {
        format!("connected to {} since {}", c.server, when(c.since_ms))
    } else if c.last_error.is_empty() {
        "not connected".to_string()
    } else {
        format!("not connected ({})", c.last_error)
    };
    line(&mut out, "connection:", &conn);
    line(&mut out, "last contact:", &when(c.last_contact_ms));
    if let Some(p) = &v.in_progress {
        line(&mut out, "in progress:", &format!("{} ({})", p.target, p.phase));
    }
    let activity = |a: &Option<Activity>| match a {
        Some(a) if a.message.is_empty() => {
            format!("{}@{} {} at {}", a.bundle, a.version, a.outcome, when(a.at_ms))
        }
        Some(a) => format!(
            "{}@{} {} at {}: {}",
            a.bundle,
            a.version,
            a.outcome,
            when(a.at_ms),
            a.message
        ),
        None => "never".into(),
    };
    line(&mut out, "trust:", &trust_line(&v.trust));
    let r = &v.reboot;
    let reboot = match (r.state, r.reason.as_str()) {
        ("none", _) => "not required".to_string(),
        (s, "") => format!("{s} since {}", when(r.since_ms)),
        (s, why) => format!("{s} since {}: {why}", when(r.since_ms)),
    };
    line(&mut out, "reboot:", &reboot);
    line(&mut out, "last apply:", &activity(&v.last_apply));
    line(&mut out, "last repair:", &activity(&v.last_repair));
    if v.bundles.is_empty() {
        out.push_str("bundles:      none\n");
    } else {
        out.push_str("bundles:\n");
        out.push_str(&format!(
            "  {:<24} {:<20} {:<12} MESSAGE\n",
            "NAME", "VERSION", "STATE"
        ));
        for b in &v.bundles {
            out.push_str(&format!(
                "  {:<24} {:<20} {:<12} {}\n",
                b.name,
                b.version,
                b.state.as_str(),
                b.message
            ));
        }
    }
    if !v.certificates.is_empty() {
        out.push_str("certificates:\n");
        out.push_str(&format!(
            "  {:<44} {:<16} {:<26} STATE\n",
            "PATH", "PROFILE", "NOT-AFTER"
        ));
        for c in &v.certificates {
            out.push_str(&format!(
                "  {:<44} {:<16} {:<26} {}\n",
                c.path, c.profile, c.not_after, c.state
            ));
        }
    }
    Ok(out.trim_end().to_string())
}

/// `trust:` in `status`: "off", or the state, the release and its expiry,
/// the root, and the message.
fn trust_line(t: &TrustReport) -> String {
    if !t.enabled {
        return "off (signed release records not required)".into();
    }
    let release = if t.release_version == 0 {
        "no release".to_string()
    } else {
        format!(
            "release {} (expires {})",
            t.release_version,
            when(t.release_expires_at_ms)
        )
    };
    let mut line = format!("{}, {release}, root {}", t.state, t.root_version);
    if !t.message.is_empty() {
        line.push_str(": ");
        line.push_str(&t.message);
    }
    line
}
