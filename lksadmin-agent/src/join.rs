//! `lksadmin-agent join`: enrol this node into a tenant cluster.
//!
//! Everything given on the command line is validated first; then the
//! servers (`--server` may list several replicas) are tried in turn: each
//! one's CA is checked against the pin ([`crate::link::pin`]) before the token is
//! sent to it, and only a server that cannot be reached passes the turn to
//! the next; the node key is made here and never leaves the node (only a CSR
//! goes out). The identity is written into a temp directory inside the state
//! dir and moved into place piece by piece, `join.toml` last: it is the
//! commit marker, so a join that fails at any point leaves no identity (and
//! leftovers of a crashed join are cleared by the next one).
//!
//! A server that rate-limits enrolment (`resource_exhausted`) is not a
//! refusal: the VMs of a tenant network often reach kube0 through one NAT
//! address and share its enrolment budget, and a cloud-init join runs once.
//! Such a join waits (backoff with jitter) and tries again, for up to
//! [`BUSY_DEADLINE`]. So does a join whose request got no answer (the
//! server died or restarted with it in flight): it sends the same key
//! again, which gets back an enrolment the server stored before its answer
//! was lost.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use lks_proto::fsutil::{self, FsError};
use lks_proto::identity::{ca_cert_hash, pem_certs};
use lks_proto::sign::PublisherKey;
use lks_proto::token::BootstrapToken;
use lks_proto::{Digest, pb};
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, PublicKeyData};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::config::{AgentConfig, JOIN_FILE, StateDir};
use crate::link::backoff::{Backoff, retry_hint};
use crate::link::client;
use crate::link::pin::{self, PinError};

const PIN_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a join keeps trying servers that rate-limit enrolment.
pub const BUSY_DEADLINE: Duration = Duration::from_secs(300);

/// The parsed command line of `join`.
#[derive(Clone, Debug)]
pub struct JoinRequest {
    pub servers: String,
    pub token: String,
    pub ca_cert_hash: String,
    pub node_name: Option<String>,
    pub labels: Option<String>,
    pub state_dir: PathBuf,
    pub root: PathBuf,
    pub trust_keys: Vec<PathBuf>,
    /// `--trust-threshold`: `None` leaves release records off.
    pub trust_threshold: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinOutcome {
    Joined {
        node: String,
        cluster: String,
        expires_at: i64,
    },
    AlreadyJoined {
        node: String,
        cluster: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("invalid --server: {0}")]
    BadServer(String),
    #[error("{0}")]
    BadToken(lks_proto::token::MalformedToken),
    #[error("invalid --ca-cert-hash {0:?}: expected sha256:<64 lowercase hex digits>")]
    BadPin(String),
    #[error("invalid --node-name: {0}")]
    BadNodeName(lks_proto::names::NameError),
    /// The host has no readable hostname.
    #[error("cannot use the hostname as node name: {0}; pass --node-name")]
    NoHostname(nix::errno::Errno),
    /// The hostname is no valid node name.
    #[error("cannot use the hostname as node name: {0}; pass --node-name")]
    BadHostname(lks_proto::names::NameError),
    #[error("invalid --labels: {0}")]
    BadLabels(lks_proto::labels::LabelError),
    #[error("--trust-key {path}: {reason}")]
    BadTrustKey { path: PathBuf, reason: String },
    #[error(
        "invalid --trust-threshold {threshold}: it must be between 1 and the number of distinct --trust-key files ({keys})"
    )]
    BadTrustThreshold { threshold: u32, keys: usize },
    #[error("--root {path}: {reason}")]
    BadRoot { path: PathBuf, reason: String },
    #[error(
        "{dir} already holds the identity of node {node} in cluster {cluster}, joined with other parameters; remove {dir} to join again"
    )]
    JoinedDifferently {
        dir: PathBuf,
        node: String,
        cluster: String,
    },
    #[error(transparent)]
    Pin(#[from] PinError),
    #[error("could not reach any server: {0}")]
    Unreachable(String),
    #[error(
        "no enrolment after {waited:?} of retrying: {last}; run join again (it sends the same key, so an enrolment the server stored is given back)"
    )]
    Busy { waited: Duration, last: String },
    #[error("generate the node key: {0}")]
    KeyGen(String),
    #[error("{server} refused the join: {message}")]
    Refused { server: String, message: String },
    #[error("{server}: {reason}")]
    BadResponse { server: String, reason: String },
    #[error("write the node identity: {0}")]
    Write(#[from] FsError),
    #[error("read the existing identity: {0}")]
    Existing(String),
}

/// Everything `join` will store, validated.
struct Plan {
    servers: Vec<String>,
    token: BootstrapToken,
    pin: Digest,
    node_name: String,
    labels: BTreeMap<String, String>,
    root: PathBuf,
    trusted: Vec<String>,
    trust_threshold: u32,
    dirs: StateDir,
}

/// Parses `--server`: one URL or several separated by commas, each
/// `https://HOST[:PORT]` (a bare `HOST:PORT` means https). An empty item or
/// a URL given twice is refused rather than skipped: it is a typo in a line
/// that is usually pasted into many machines.
pub fn parse_servers(arg: &str) -> Result<Vec<String>, JoinError> {
    let mut servers: Vec<String> = Vec::new();
    for (i, item) in arg.split(',').enumerate() {
        let item = item.trim();
        if item.is_empty() {
            return Err(JoinError::BadServer(if arg.trim().is_empty() {
                "no URL given".into()
            } else {
                format!("item {} of {arg:?} is empty", i + 1)
            }));
        }
        let url = client::normalize_url(item);
        pin::host_port(&url).map_err(|e| JoinError::BadServer(e.to_string()))?;
        if servers.contains(&url) {
            return Err(JoinError::BadServer(format!("{url} is listed twice")));
        }
        servers.push(url);
    }
    Ok(servers)
}

fn validate(req: &JoinRequest) -> Result<Plan, JoinError> {
    let servers = parse_servers(&req.servers)?;
    let token = BootstrapToken::from_str(req.token.trim()).map_err(JoinError::BadToken)?;
    let pin =
        Digest::from_str(req.ca_cert_hash.trim()).map_err(|_| JoinError::BadPin(req.ca_cert_hash.clone()))?;
    let node_name = match &req.node_name {
        Some(n) => {
            lks_proto::names::validate_node_name(n).map_err(JoinError::BadNodeName)?;
            n.clone()
        }
        None => {
            let host = nix::unistd::gethostname()
                .map_err(JoinError::NoHostname)?
                .to_string_lossy()
                .to_lowercase();
            lks_proto::names::validate_node_name(&host).map_err(JoinError::BadHostname)?;
            host
        }
    };
    let labels =
        lks_proto::labels::parse_labels(req.labels.as_deref().unwrap_or("")).map_err(JoinError::BadLabels)?;
    let root = std::path::absolute(&req.root).map_err(|e| JoinError::BadRoot {
        path: req.root.clone(),
        reason: e.to_string(),
    })?;
    if !root.is_dir() {
        return Err(JoinError::BadRoot {
            path: req.root.clone(),
            reason: "not an existing directory".into(),
        });
    }
    let mut trusted = Vec::new();
    for path in &req.trust_keys {
        let key = PublisherKey::from_file(path).map_err(|e| JoinError::BadTrustKey {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        trusted.push(key.to_pem());
    }
    trusted.sort();
    trusted.dedup();
    let trust_threshold = match req.trust_threshold {
        None => 0,
        Some(n) if n >= 1 && n as usize <= trusted.len() => n,
        Some(n) => {
            return Err(JoinError::BadTrustThreshold {
                threshold: n,
                keys: trusted.len(),
            });
        }
    };
    Ok(Plan {
        trust_threshold,
        servers,
        token,
        pin,
        node_name,
        labels,
        root,
        trusted,
        dirs: StateDir::new(&req.state_dir),
    })
}

/// Runs `join`.
pub async fn join(req: &JoinRequest) -> Result<JoinOutcome, JoinError> {
    let plan = validate(req)?;
    if plan.dirs.is_joined() {
        return already_joined(&plan);
    }

    let key = join_key(&plan.dirs)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, plan.node_name.as_str());
    params.distinguished_name = dn;
    let csr_pem = params
        .serialize_request(&key)
        .and_then(|csr| csr.pem())
        .map_err(|e| JoinError::KeyGen(format!("make the CSR: {e}")))?;

    let key_pem = key.serialize_pem();
    let dir_existed = plan.dirs.path().exists();
    let (server, resp) = match enroll_any(&plan, &csr_pem, &key_pem).await {
        Ok(r) => r,
        // Keep the key only while the outcome is unknown: a server that
        // answered no enrolled nothing with it, and a refused join leaves
        // nothing behind. A join that gave up retrying may have been
        // enrolled by a server whose answer was lost.
        Err(e) => {
            if !matches!(e, JoinError::Unreachable(_) | JoinError::Busy { .. }) {
                let _ = std::fs::remove_file(join_key_path(&plan.dirs));
                if !dir_existed {
                    let _ = std::fs::remove_dir(plan.dirs.path());
                }
            }
            return Err(e);
        }
    };

    let bad = |reason: &str| JoinError::BadResponse {
        server: server.clone(),
        reason: reason.into(),
    };
    let ca = pem_certs(&resp.ca_pem).map_err(|_| bad("no CA certificate in the response"))?;
    if ca.first().map(|c| ca_cert_hash(c)) != Some(Ok(plan.pin)) {
        return Err(bad("the CA in the response does not match --ca-cert-hash"));
    }
    let certs = pem_certs(&resp.certificate_pem).map_err(|_| bad("no node certificate in the response"))?;
    let leaf = certs
        .first()
        .ok_or_else(|| bad("no node certificate in the response"))?;
    let (_, parsed) =
        X509Certificate::from_der(leaf).map_err(|_| bad("the node certificate is not valid X.509"))?;
    if parsed.public_key().raw != key.subject_public_key_info().as_slice() {
        return Err(bad("the node certificate is not for the key in our CSR"));
    }
    lks_proto::names::validate_cluster_name(&resp.cluster).map_err(|e| bad(&e.to_string()))?;
    lks_proto::names::validate_node_name(&resp.node_name).map_err(|e| bad(&e.to_string()))?;

    let cfg = AgentConfig {
        servers: plan.servers.clone(),
        node_name: resp.node_name.clone(),
        cluster: resp.cluster.clone(),
        root: plan.root.clone(),
        ca_cert_hash: plan.pin.to_string(),
        labels: plan.labels.clone(),
        trust_threshold: plan.trust_threshold,
    };
    store(
        &plan.dirs,
        &cfg,
        &key.serialize_pem(),
        &resp.certificate_pem,
        &resp.ca_pem,
        &plan.trusted,
    )?;
    let _ = std::fs::remove_file(join_key_path(&plan.dirs));
    Ok(JoinOutcome::Joined {
        node: resp.node_name,
        cluster: resp.cluster,
        expires_at: resp.expires_at,
    })
}

fn join_key_path(dirs: &StateDir) -> PathBuf {
    dirs.path().join(".join.key")
}

/// The key this join enrols with: the one an earlier join of this state
/// dir sent without learning the outcome, or a new one. If the server
/// enrolled the node but its answer was lost (the server killed, the link
/// cut), the next `join` sends the same key, and the server gives that
/// enrolment back instead of refusing the name as taken.
fn join_key(dirs: &StateDir) -> Result<KeyPair, JoinError> {
    let path = join_key_path(dirs);
    match std::fs::read_to_string(&path) {
        Ok(pem) => KeyPair::from_pem(&pem).map_err(|e| {
            JoinError::KeyGen(format!(
                "{}: {e}; remove it to join with a new key",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            KeyPair::generate().map_err(|e| JoinError::KeyGen(e.to_string()))
        }
        Err(e) => Err(JoinError::KeyGen(format!("read {}: {e}", path.display()))),
    }
}

/// Writes the key down (0600) once a server was reached and the request is
/// about to be sent: from here on its outcome may be lost. A join that
/// reaches no server writes nothing.
fn keep_join_key(dirs: &StateDir, key_pem: &str) -> Result<(), JoinError> {
    let path = join_key_path(dirs);
    if path.exists() {
        return Ok(());
    }
    fsutil::create_dir(dirs.path(), 0o700)?;
    fsutil::write_atomic(&path, key_pem.as_bytes(), 0o600)?;
    Ok(())
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// How one server's enrolment attempt ended, if not with a certificate.
enum Attempt {
    /// Not reached, or reached but unavailable: the next server may answer.
    Unreachable(String),
    /// Too many enrolments from this address just now, or no answer to
    /// the request: worth a later try, with the same key, no sooner than
    /// the server's retry hint if it gave one.
    Busy(String, Option<Duration>),
    /// The server answered and said no (bad token, CA pin mismatch, …):
    /// another replica of the same cluster would say the same, so stop.
    Final(JoinError),
}

/// Enrols with the servers in order until one answers. Only a server that
/// cannot be reached, or is rate-limiting, passes the turn to the next; an
/// answer, yes or no, ends the join. A round in which some server was only
/// rate-limiting is tried again after a pause, until [`BUSY_DEADLINE`].
async fn enroll_any(
    plan: &Plan,
    csr_pem: &str,
    key_pem: &str,
) -> Result<(String, pb::EnrollResponse), JoinError> {
    retry_while_busy(
        BUSY_DEADLINE,
        Backoff::new(Duration::from_secs(1), Duration::from_secs(30)),
        || enroll_round(plan, csr_pem, key_pem),
    )
    .await
}

/// A round in which no server enrolled the node but some were busy.
#[derive(Debug, Default)]
struct BusyRound {
    reasons: Vec<String>,
    /// The shortest retry hint a busy server gave: the soonest one of them
    /// expects to have room.
    retry_after: Option<Duration>,
}

/// One pass over the servers: `Err(Ok(busy))` if none answered but some
/// were rate-limiting.
async fn enroll_round(
    plan: &Plan,
    csr_pem: &str,
    key_pem: &str,
) -> Result<(String, pb::EnrollResponse), Result<BusyRound, JoinError>> {
    let mut unreachable = Vec::new();
    let mut busy = BusyRound::default();
    for url in &plan.servers {
        match enroll_at(plan, url, csr_pem, key_pem).await {
            Ok(resp) => return Ok((url.clone(), resp)),
            Err(Attempt::Final(e)) => return Err(Err(e)),
            Err(Attempt::Unreachable(e)) => {
                tracing::info!("{e}; trying the next server");
                unreachable.push(e);
            }
            Err(Attempt::Busy(e, hint)) => {
                tracing::info!("{e}; trying the next server");
                busy.reasons.push(e);
                busy.retry_after = match (busy.retry_after, hint) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
    }
    if busy.reasons.is_empty() {
        Err(Err(JoinError::Unreachable(unreachable.join("; "))))
    } else {
        Err(Ok(busy))
    }
}

/// Runs `round` until it succeeds or fails for good; a round that was
/// only rate-limited is repeated after the next backoff delay (at least
/// the servers' retry hint), as long as that stays within `deadline`.
async fn retry_while_busy<T, F, Fut>(
    deadline: Duration,
    mut backoff: Backoff,
    mut round: F,
) -> Result<T, JoinError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Result<BusyRound, JoinError>>>,
{
    let started = tokio::time::Instant::now();
    loop {
        let (busy, hint) = match round().await {
            Ok(v) => return Ok(v),
            Err(Err(e)) => return Err(e),
            Err(Ok(b)) => (b.reasons.join("; "), b.retry_after),
        };
        let delay = backoff.next_delay_with(hint);
        let waited = started.elapsed();
        if waited + delay > deadline {
            return Err(JoinError::Busy { waited, last: busy });
        }
        tracing::warn!("{busy}; retrying in {:.1}s", delay.as_secs_f64());
        tokio::time::sleep(delay).await;
    }
}

/// Checks `url` against the CA pin, and only then sends it the token.
async fn enroll_at(
    plan: &Plan,
    url: &str,
    csr_pem: &str,
    key_pem: &str,
) -> Result<pb::EnrollResponse, Attempt> {
    let ca_der = match pin::fetch_pinned_ca(url, &plan.pin, PIN_TIMEOUT).await {
        Ok(ca) => ca,
        Err(e) if e.is_refusal() => return Err(Attempt::Final(e.into())),
        Err(e) => return Err(Attempt::Unreachable(e.to_string())),
    };
    let refused = |message: String| {
        Attempt::Final(JoinError::Refused {
            server: url.to_string(),
            message,
        })
    };
    let ca_der = rustls_pki_types::CertificateDer::from(ca_der);
    let anchor = webpki::anchor_from_trusted_cert(&ca_der)
        .map_err(|e| refused(format!("the pinned CA is not usable: {e}")))?
        .to_owned();
    let tls = tonic::transport::ClientTlsConfig::new().trust_anchor(anchor);
    let channel = client::endpoint(url, tls)
        .map_err(|e| refused(e.to_string()))?
        .connect()
        .await
        .map_err(|e| Attempt::Unreachable(format!("{url}: {}", crate::link::channel::error_chain(&e))))?;
    let mut api = pb::agent_service_client::AgentServiceClient::new(channel);
    keep_join_key(&plan.dirs, key_pem).map_err(Attempt::Final)?;
    api.enroll(pb::EnrollRequest {
        token: plan.token.to_string(),
        node_name: plan.node_name.clone(),
        csr_pem: csr_pem.to_string(),
        labels: plan.labels.clone().into_iter().collect(),
    })
    .await
    .map(tonic::Response::into_inner)
    .map_err(|s| enrol_failed(url, &s))
}

/// How an `Enroll` call sent to `url` ended without a certificate: a
/// refusal is final; everything else is tried again after a pause, with
/// the same key (the `.join.key` file stays).
///
/// That includes a call that got no answer: the connection dropped with
/// the request in flight, the server died or restarted, or failed while
/// serving it. It may have stored the enrolment before its answer was
/// lost; the repeat, with the same key, gets that enrolment back, where a
/// new key would find the name taken and the node could never join.
fn enrol_failed(url: &str, s: &tonic::Status) -> Attempt {
    use std::error::Error as _;
    let msg = format!("{url}: {}", one_line(s.message()));
    match s.code() {
        tonic::Code::ResourceExhausted => Attempt::Busy(msg, retry_hint(s)),
        // Made on this side from a transport error: no answer came.
        _ if s.source().is_some() => Attempt::Busy(format!("{msg} (no answer)"), None),
        tonic::Code::Unavailable
        | tonic::Code::Unknown
        | tonic::Code::Internal
        | tonic::Code::Cancelled
        | tonic::Code::DeadlineExceeded
        | tonic::Code::Aborted => Attempt::Busy(format!("{msg} (no answer)"), retry_hint(s)),
        _ => Attempt::Final(JoinError::Refused {
            server: url.to_string(),
            message: one_line(s.message()),
        }),
    }
}

fn already_joined(plan: &Plan) -> Result<JoinOutcome, JoinError> {
    let cfg = plan
        .dirs
        .load_config()
        .map_err(|e| JoinError::Existing(e.to_string()))?;
    let trusted = {
        let mut v: Vec<String> = plan
            .dirs
            .trusted_keys()
            .map_err(|e| JoinError::Existing(e.to_string()))?
            .iter()
            .map(PublisherKey::to_pem)
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let same = cfg.servers == plan.servers
        && cfg.node_name == plan.node_name
        && cfg.ca_cert_hash == plan.pin.to_string()
        && cfg.root == plan.root
        && cfg.labels == plan.labels
        && cfg.trust_threshold == plan.trust_threshold
        && trusted == plan.trusted;
    if same {
        Ok(JoinOutcome::AlreadyJoined {
            node: cfg.node_name,
            cluster: cfg.cluster,
        })
    } else {
        Err(JoinError::JoinedDifferently {
            dir: plan.dirs.path().to_path_buf(),
            node: cfg.node_name,
            cluster: cfg.cluster,
        })
    }
}

/// Writes the identity: everything into `.join-tmp`, fsynced, then moved
/// into place with `join.toml` last.
fn store(
    dirs: &StateDir,
    cfg: &AgentConfig,
    key_pem: &str,
    cert_pem: &str,
    ca_pem: &str,
    trusted: &[String],
) -> Result<(), JoinError> {
    fsutil::create_dir(dirs.path(), 0o700)?;
    // Leftovers of an earlier join that never committed.
    for p in [dirs.pki(), dirs.trusted()] {
        fsutil::remove_dir_all(&p)?;
    }
    let tmp = dirs.path().join(".join-tmp");
    fsutil::remove_dir_all(&tmp)?;
    let result = (|| -> Result<(), FsError> {
        fsutil::create_dir(&tmp.join("pki"), 0o700)?;
        fsutil::create_dir(&tmp.join("trusted"), 0o755)?;
        fsutil::write_atomic(&tmp.join("pki/node.key"), key_pem.as_bytes(), 0o600)?;
        fsutil::write_atomic(&tmp.join("pki/node.crt"), cert_pem.as_bytes(), 0o644)?;
        fsutil::write_atomic(&tmp.join("pki/ca.crt"), ca_pem.as_bytes(), 0o644)?;
        for (i, pem) in trusted.iter().enumerate() {
            fsutil::write_atomic(&tmp.join(format!("trusted/key-{i}.pub")), pem.as_bytes(), 0o644)?;
        }
        fsutil::write_atomic(&tmp.join(JOIN_FILE), cfg.to_toml().as_bytes(), 0o600)?;
        fsutil::sync_dir(&tmp)?;
        rename(&tmp.join("pki"), &dirs.pki())?;
        rename(&tmp.join("trusted"), &dirs.trusted())?;
        rename(&tmp.join(JOIN_FILE), &dirs.config())?;
        fsutil::sync_dir(dirs.path())
    })();
    if result.is_err() && !dirs.is_joined() {
        let _ = fsutil::remove_dir_all(&dirs.pki());
        let _ = fsutil::remove_dir_all(&dirs.trusted());
    }
    let _ = fsutil::remove_dir_all(&tmp);
    result.map_err(JoinError::Write)
}

fn rename(from: &Path, to: &Path) -> Result<(), FsError> {
    std::fs::rename(from, to).map_err(|e| FsError::new("move into place", to, e))
}

#[cfg(test)]
mod tests;
