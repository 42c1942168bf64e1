//! Creating a cluster (its CA imported or generated, its API server) and
//! changing one (`SetCluster`: API server, CA, peer sharing, tenant
//! Kubernetes access, maintenance windows). Every request is checked whole
//! before anything is stored; then whom a change concerns is told (the
//! agents' streams, the peer-settings cache, the rollout controller).

use std::sync::Arc;

use lks_kube::config::{KubeconfigError, TenantKubeconfig};
use lks_kube::secret::SecretError;
use lks_kube::tenant::TenantApis;
use lks_pki::clusterca::{CaError, ClusterCa, ClusterCas, KeyError};
use lks_proto::windows::{self, WindowError};
use time::OffsetDateTime;

use super::{Kind, OpError};
use crate::hub::Hub;
use crate::peers::PeerCache;
use crate::store::{ClusterKube, ClusterRow, EventRow, NewCluster, PeerSettings, Store};

/// Most concurrent uploads per node an operator may allow.
pub const MAX_PEER_UPLOADS: u32 = 64;
/// Windows per cluster; more is a mistake, not a schedule.
pub const MAX_WINDOWS: usize = 32;
/// Largest CA certificate or key PEM accepted; kubeadm's are ~1–2 KiB.
const MAX_PEM: usize = 64 * 1024;
const MAX_URL: usize = 2048;

crate::context::shared_view! {
    /// What the cluster operations use: the store, the tenant CAs and APIs,
    /// and whom to tell when a cluster's settings change (the agents'
    /// streams, the peer-settings cache, the rollout controller).
    pub struct Deps {
        store: Arc<dyn Store>,
        cluster_cas: Arc<ClusterCas>,
        tenants: Arc<TenantApis>,
        hub: Arc<Hub>,
        peers: Arc<PeerCache>,
        rollouts_changed: Arc<tokio::sync::Notify>,
    }
}

/// Why a cluster is not created or changed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cluster {0} does not exist")]
    NoCluster(String),
    #[error("cluster {0} already exists")]
    Exists(String),
    #[error("API server {url:?}: {why}")]
    ApiServer { url: String, why: String },
    #[error("give an API server or clear it, not both")]
    ApiServerBoth,
    #[error("CA certificate or key is larger than 64 KiB")]
    PemTooLarge,
    #[error("a CA certificate needs its key: give --ca-key too")]
    CertWithoutKey,
    #[error("a CA key needs its certificate: give --ca-cert too")]
    KeyWithoutCert,
    #[error("import a CA (--ca-cert/--ca-key) or generate one (--generate-ca), not both")]
    ImportAndGenerate,
    #[error("cluster {0} already has a CA; replacing it would orphan every certificate issued with it")]
    HasCa(String),
    #[error(transparent)]
    Ca(#[from] CaError),
    /// The CA key could not be sealed for the store.
    #[error("{0}")]
    SealCa(#[source] KeyError),
    /// The kubeconfig could not be sealed for the store.
    #[error("{0}")]
    SealKubeconfig(#[source] SecretError),
    #[error("peer port {0} is out of range: give 1 to 65535")]
    PeerPort(u32),
    #[error("peer max uploads {0} is out of range: give 1 to {MAX_PEER_UPLOADS}")]
    PeerMaxUploads(u32),
    #[error("give a kubeconfig or remove it, not both")]
    KubeconfigBoth,
    #[error("--kubeconfig: {0}")]
    Kubeconfig(#[source] KubeconfigError),
    #[error("cluster {0}: draining needs the tenant API: give --kubeconfig FILE (or --drain off)")]
    DrainWithoutKubeconfig(String),
    #[error(
        "nothing to set: give --maintenance-window (repeatable), --no-maintenance-window, \
         --api-server, --no-api-server, --ca-cert with --ca-key, --generate-ca, \
         --peer-sharing, --peer-port, --peer-upload-rate, --peer-max-uploads, \
         --kubeconfig, --drain, --reboots, --max-concurrent-reboots, --reboot-timeout, \
         --on-reboot-timeout, --reboot-alert-gate, --alert-filter, --no-reboot-alert-gate, \
         --blocking-pod-selector, --no-blocking-pod-selector, --labels or --no-labels"
    )]
    NothingToSet,
    #[error("give maintenance windows or clear them, not both")]
    WindowsBoth,
    #[error("nothing to set: give --maintenance-window (repeatable) or --no-maintenance-window")]
    NoWindows,
    #[error("{0} maintenance windows; the limit is {MAX_WINDOWS}")]
    TooManyWindows(usize),
    #[error(transparent)]
    Window(#[from] WindowError),
    #[error("set cluster: nothing was changed")]
    NothingChanged,
}

impl ClusterError {
    pub fn kind(&self) -> Kind {
        match self {
            ClusterError::NoCluster(_) => Kind::NotFound,
            ClusterError::Exists(_) => Kind::AlreadyExists,
            ClusterError::HasCa(_) | ClusterError::DrainWithoutKubeconfig(_) => Kind::FailedPrecondition,
            ClusterError::SealCa(_) | ClusterError::SealKubeconfig(_) | ClusterError::NothingChanged => {
                Kind::Internal
            }
            _ => Kind::Invalid,
        }
    }
}

/// A new cluster as an operator asks for it (its name valid).
#[derive(Clone, Debug, Default)]
pub struct CreateCluster {
    pub name: String,
    /// Empty: none.
    pub api_server: String,
    /// The CA to import; both empty: one is generated.
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
}

/// A `SetCluster` request (its name valid): each part changes the
/// cluster only when given.
#[derive(Clone, Debug, Default)]
pub struct SetCluster {
    pub name: String,
    pub maintenance_windows: Vec<String>,
    pub clear_maintenance_windows: bool,
    pub api_server: Option<String>,
    pub clear_api_server: bool,
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    pub generate_ca: bool,
    pub peer_sharing: Option<bool>,
    pub peer_port: Option<u32>,
    pub peer_upload_rate: Option<u64>,
    pub peer_max_uploads: Option<u32>,
    pub kubeconfig: Option<String>,
    pub clear_kubeconfig: bool,
    pub drain: Option<bool>,
    /// Replaces the cluster's labels (checked); `Some` empty clears them.
    pub labels: Option<lks_proto::labels::Labels>,
    /// `--reboots`, `--max-concurrent-reboots`, `--reboot-timeout`,
    /// `--on-reboot-timeout` (issue [reboots]).
    pub reboots: super::reboot::RebootChange,
}

/// A cluster changed: as stored now, and the kubeconfig the change gave
/// it (to try once stored).
pub struct Changed {
    pub row: ClusterRow,
    pub kubeconfig: Option<TenantKubeconfig>,
}

/// Checks an API server URL: `https://HOST[:PORT][/PATH]`, one token.
pub fn check_api_server(url: &str) -> Result<String, ClusterError> {
    let bad = |why: &str| ClusterError::ApiServer {
        url: url.to_string(),
        why: why.to_string(),
    };
    if url.len() > MAX_URL {
        return Err(bad("longer than 2048 bytes"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("contains whitespace"));
    }
    let uri: hyper::Uri = url.parse().map_err(|e| bad(&format!("not a URL ({e})")))?;
    if uri.scheme_str() != Some("https") {
        return Err(bad("must be an https:// URL"));
    }
    let Some(auth) = uri.authority() else {
        return Err(bad("has no host"));
    };
    if auth.as_str().contains('@') {
        return Err(bad("must not carry user information"));
    }
    if auth.host().is_empty() {
        return Err(bad("has no host"));
    }
    Ok(url.to_string())
}

/// The CA to import from a request's PEM pair: both or neither.
fn import_pair<'a>(cert: &'a str, key: &'a str) -> Result<Option<(&'a str, &'a str)>, ClusterError> {
    if cert.len() > MAX_PEM || key.len() > MAX_PEM {
        return Err(ClusterError::PemTooLarge);
    }
    match (cert.is_empty(), key.is_empty()) {
        (true, true) => Ok(None),
        (false, false) => Ok(Some((cert, key))),
        (false, true) => Err(ClusterError::CertWithoutKey),
        (true, false) => Err(ClusterError::KeyWithoutCert),
    }
}

fn how(imported: bool) -> &'static str {
    if imported { "imported" } else { "generated" }
}

/// Creates a cluster with its CA (imported, or generated when none is
/// given) and API server, in one store write.
pub async fn create(s: &Deps, r: CreateCluster, admin: &str, now_ms: i64) -> Result<ClusterRow, OpError> {
    let api_server = match r.api_server.as_str() {
        "" => None,
        u => Some(check_api_server(u)?),
    };
    let import = import_pair(&r.ca_cert_pem, &r.ca_key_pem)?;
    if s.store.cluster_exists(&r.name).await? {
        return Err(ClusterError::Exists(r.name).into());
    }
    let ca = ClusterCas::make(&r.name, import, OffsetDateTime::now_utc()).map_err(ClusterError::from)?;
    let stored = s
        .cluster_cas
        .to_stored(&ca, &r.name)
        .map_err(ClusterError::SealCa)?;
    let row = s
        .store
        .create_cluster(NewCluster {
            name: r.name.clone(),
            now_ms,
            ca: Some(stored),
            api_server: api_server.clone(),
        })
        .await?;
    let mut message = format!(
        "cluster created by {admin} with a CA {} ({})",
        how(import.is_some()),
        ca.hash()
    );
    if let Some(u) = &api_server {
        message.push_str(&format!("; API server {u}"));
    }
    record(s, EventRow::cluster_created(&r.name, message, now_ms)).await;
    tracing::info!(cluster = %r.name, admin = %admin, ca = how(import.is_some()), ca_cert_hash = %ca.hash(), "cluster created");
    Ok(row)
}

/// An event outside a store transaction; a failure to record it is logged,
/// the change it describes stands.
async fn record(s: &Deps, e: EventRow) {
    if let Err(err) = s.store.add_event(e).await {
        tracing::warn!(error = %err, "record event");
    }
}

/// `SetCluster`: the whole request is checked (windows included) before
/// anything is stored. `now_ms` is asked at each write.
pub async fn set(s: &Deps, r: SetCluster, admin: &str, now_ms: impl Fn() -> i64) -> Result<Changed, OpError> {
    let name = r.name.clone();
    let wants_windows = r.clear_maintenance_windows || !r.maintenance_windows.is_empty();
    let change = check_change(s, &r).await?;
    if !wants_windows && r.labels.is_none() && change.is_empty() {
        return Err(ClusterError::NothingToSet.into());
    }
    let windows = if wants_windows {
        Some(check_windows(&r)?)
    } else {
        None
    };
    // The kubeconfig given, as check_change parsed it: tried once stored.
    let kubeconfig = change.kube.as_ref().and_then(|k| k.kubeconfig.clone()).flatten();
    let mut row = apply_change(s, &name, change, admin, now_ms()).await?;
    if let Some(w) = windows {
        let event = EventRow::windows_set(&name, &w, admin, now_ms());
        let c = s.store.set_cluster_windows(&name, w, event).await?;
        tracing::info!(cluster = %name, admin = %admin, windows = ?c.maintenance_windows, "maintenance windows set");
        // Rollouts waiting for a window may start at once, or must stop starting.
        s.rollouts_changed.notify_one();
        row = Some(c);
    }
    if let Some(labels) = r.labels {
        let event = EventRow::cluster_labels_set(&name, &labels, admin, now_ms());
        let c = s.store.set_cluster_labels(&name, labels, event).await?;
        tracing::info!(cluster = %name, admin = %admin, labels = ?c.labels, "cluster labels set");
        row = Some(c);
    }
    let row = row.ok_or(ClusterError::NothingChanged)?;
    Ok(Changed { row, kubeconfig })
}

/// The windows a `SetCluster` request stores, in canonical form.
fn check_windows(r: &SetCluster) -> Result<Vec<String>, ClusterError> {
    if r.clear_maintenance_windows && !r.maintenance_windows.is_empty() {
        return Err(ClusterError::WindowsBoth);
    }
    if !r.clear_maintenance_windows && r.maintenance_windows.is_empty() {
        return Err(ClusterError::NoWindows);
    }
    if r.maintenance_windows.len() > MAX_WINDOWS {
        return Err(ClusterError::TooManyWindows(r.maintenance_windows.len()));
    }
    let parsed = windows::parse_all(&r.maintenance_windows)?;
    Ok(parsed.iter().map(|w| w.to_string()).collect())
}

/// The peer-sharing part of a `SetCluster` request, checked: each field
/// replaces the stored one only when given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerChange {
    pub enabled: Option<bool>,
    pub port: Option<u16>,
    pub upload_rate: Option<u64>,
    pub max_uploads: Option<u32>,
}

impl PeerChange {
    /// Checks the request's peer fields: a port of 1 to 65535, 1 to
    /// [`MAX_PEER_UPLOADS`] uploads. `None` if it gives none.
    pub fn check(r: &SetCluster) -> Result<Option<PeerChange>, ClusterError> {
        let port = r
            .peer_port
            .map(|p| match u16::try_from(p) {
                Ok(p) if p > 0 => Ok(p),
                _ => Err(ClusterError::PeerPort(p)),
            })
            .transpose()?;
        let max_uploads = r
            .peer_max_uploads
            .map(|n| {
                if (1..=MAX_PEER_UPLOADS).contains(&n) {
                    Ok(n)
                } else {
                    Err(ClusterError::PeerMaxUploads(n))
                }
            })
            .transpose()?;
        let c = PeerChange {
            enabled: r.peer_sharing,
            port,
            upload_rate: r.peer_upload_rate,
            max_uploads,
        };
        Ok((c != PeerChange::default()).then_some(c))
    }

    /// The settings `old` becomes.
    pub fn merge(self, old: PeerSettings) -> PeerSettings {
        PeerSettings {
            enabled: self.enabled.unwrap_or(old.enabled),
            port: self.port.unwrap_or(old.port),
            upload_rate: self.upload_rate.unwrap_or(old.upload_rate),
            max_uploads: self.max_uploads.unwrap_or(old.max_uploads),
        }
    }
}

/// The tenant-API part of a `SetCluster` request, checked: each part
/// replaces the stored one only when given.
#[derive(Debug, Default)]
pub struct KubeChange {
    /// `Some(None)`: remove the kubeconfig.
    pub kubeconfig: Option<Option<TenantKubeconfig>>,
    pub drain: Option<bool>,
}

impl KubeChange {
    /// Checks the request's kubeconfig and drain default; `None` if it
    /// gives neither.
    pub fn check(r: &SetCluster) -> Result<Option<KubeChange>, ClusterError> {
        let kubeconfig = match (&r.kubeconfig, r.clear_kubeconfig) {
            (Some(_), true) => return Err(ClusterError::KubeconfigBoth),
            (Some(text), false) => Some(Some(
                TenantKubeconfig::check(text).map_err(ClusterError::Kubeconfig)?,
            )),
            (None, true) => Some(None),
            (None, false) => None,
        };
        let c = KubeChange {
            kubeconfig,
            drain: r.drain,
        };
        Ok((c.kubeconfig.is_some() || c.drain.is_some()).then_some(c))
    }

    /// Refuses a change that would leave the cluster draining without a
    /// kubeconfig: its rollouts could not start.
    pub fn check_against(&self, cluster: &str, old: &ClusterKube) -> Result<(), ClusterError> {
        let drain = self.drain.unwrap_or(old.drain);
        let kubeconfig = match &self.kubeconfig {
            Some(k) => k.is_some(),
            None => old.kubeconfig.is_some(),
        };
        if drain && !kubeconfig {
            return Err(ClusterError::DrainWithoutKubeconfig(cluster.to_string()));
        }
        Ok(())
    }

    /// What the event log says of it.
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        match &self.kubeconfig {
            Some(Some(k)) => parts.push(format!(
                "kubeconfig set (tenant API {}, user {}, {})",
                k.server, k.user, k.auth
            )),
            Some(None) => parts.push("kubeconfig removed".to_string()),
            None => {}
        }
        match self.drain {
            Some(true) => parts.push("rollouts drain by default".to_string()),
            Some(false) => parts.push("rollouts do not drain by default".to_string()),
            None => {}
        }
        parts.join("; ")
    }
}

/// What a `SetCluster` request asks besides windows.
struct ClusterChange {
    api_server: Option<Option<String>>,
    ca: Option<ClusterCa>,
    ca_imported: bool,
    peer: Option<PeerChange>,
    kube: Option<KubeChange>,
    reboots: Option<super::reboot::RebootChange>,
}

impl ClusterChange {
    fn is_empty(&self) -> bool {
        self.api_server.is_none()
            && self.ca.is_none()
            && self.peer.is_none()
            && self.kube.is_none()
            && self.reboots.is_none()
    }
}

/// Checks the API-server, CA, peer-sharing and tenant-API part of a
/// `SetCluster` request; a CA is made (imported or generated) only for an
/// existing cluster without one.
async fn check_change(s: &Deps, r: &SetCluster) -> Result<ClusterChange, OpError> {
    let peer = PeerChange::check(r)?;
    let kube = KubeChange::check(r)?;
    let reboots = r.reboots.clone().check()?;
    if let Some(k) = &kube {
        let old = s
            .store
            .cluster_kube(&r.name)
            .await?
            .ok_or_else(|| ClusterError::NoCluster(r.name.clone()))?;
        k.check_against(&r.name, &old)?;
    }
    let api_server = match (&r.api_server, r.clear_api_server) {
        (Some(_), true) => return Err(ClusterError::ApiServerBoth.into()),
        (Some(u), false) => Some(Some(check_api_server(u)?)),
        (None, true) => Some(None),
        (None, false) => None,
    };
    let import = import_pair(&r.ca_cert_pem, &r.ca_key_pem)?;
    if import.is_some() && r.generate_ca {
        return Err(ClusterError::ImportAndGenerate.into());
    }
    let mut ca = None;
    if import.is_some() || r.generate_ca {
        let c = s
            .store
            .get_cluster(&r.name)
            .await?
            .ok_or_else(|| ClusterError::NoCluster(r.name.clone()))?;
        if c.ca_cert_pem.is_some() {
            return Err(ClusterError::HasCa(r.name.clone()).into());
        }
        ca = Some(ClusterCas::make(&r.name, import, OffsetDateTime::now_utc()).map_err(ClusterError::from)?);
    }
    Ok(ClusterChange {
        api_server,
        ca,
        ca_imported: import.is_some(),
        peer,
        kube,
        reboots,
    })
}

/// Stores a checked change: the CA first (the one part the store may
/// still refuse, if another request gave the cluster a CA meanwhile).
async fn apply_change(
    s: &Deps,
    name: &str,
    c: ClusterChange,
    admin: &str,
    now_ms: i64,
) -> Result<Option<ClusterRow>, OpError> {
    let mut row = None;
    if let Some(ca) = &c.ca {
        let stored = s.cluster_cas.to_stored(ca, name).map_err(ClusterError::SealCa)?;
        let hash = ca.hash().to_string();
        let event = EventRow::ca_set(name, how(c.ca_imported), &hash, admin, now_ms);
        row = Some(s.store.set_cluster_ca(name, stored, event).await?);
        tracing::info!(cluster = %name, admin = %admin, ca = how(c.ca_imported), ca_cert_hash = %hash, "cluster CA set");
    }
    if let Some(api) = c.api_server {
        let event = EventRow::api_server_set(name, api.as_deref(), admin, now_ms);
        row = Some(s.store.set_cluster_api_server(name, api.clone(), event).await?);
        tracing::info!(cluster = %name, admin = %admin, api_server = ?api, "cluster API server set");
    }
    if let Some(change) = c.peer {
        row = Some(set_peer(s, name, change, admin, now_ms).await?);
    }
    if let Some(change) = c.kube {
        row = Some(set_kube(s, name, change, admin, now_ms).await?);
    }
    if let Some(change) = c.reboots {
        row = Some(super::reboot::set_policy(&*s.store, name, change, admin, now_ms).await?);
    }
    Ok(row)
}

/// Stores the cluster's tenant-API access merged with `change` (the
/// kubeconfig sealed like a CA key). Read, merge, write, as [`set_peer`].
async fn set_kube(
    s: &Deps,
    name: &str,
    change: KubeChange,
    admin: &str,
    now_ms: i64,
) -> Result<ClusterRow, OpError> {
    let old = s
        .store
        .cluster_kube(name)
        .await?
        .ok_or_else(|| ClusterError::NoCluster(name.to_string()))?;
    change.check_against(name, &old)?;
    let kubeconfig = match &change.kubeconfig {
        Some(Some(k)) => Some(
            s.tenants
                .to_stored(name, k)
                .map_err(ClusterError::SealKubeconfig)?,
        ),
        Some(None) => None,
        None => old.kubeconfig.clone(),
    };
    let kube = ClusterKube {
        kubeconfig,
        drain: change.drain.unwrap_or(old.drain),
    };
    let what = change.describe();
    let event = EventRow::kube_set(name, &what, admin, now_ms);
    let row = s.store.set_cluster_kube(name, kube, event).await?;
    s.tenants.forget(name);
    tracing::info!(cluster = %name, admin = %admin, change = %what, "tenant Kubernetes access set");
    Ok(row)
}

/// Stores the cluster's peer-sharing settings merged with `change`, and
/// has every agent of this replica look again at once (other replicas see
/// the change within [`crate::peers::TTL`]).
///
/// Read, merge, write: two requests changing different fields of one
/// cluster at the same moment may lose one of the changes (the last write
/// wins), as with any other cluster setting.
async fn set_peer(
    s: &Deps,
    name: &str,
    change: PeerChange,
    admin: &str,
    now_ms: i64,
) -> Result<ClusterRow, OpError> {
    let old = s
        .store
        .get_cluster(name)
        .await?
        .ok_or_else(|| ClusterError::NoCluster(name.to_string()))?
        .peer;
    let peer = change.merge(old);
    let event = EventRow::peer_sharing_set(name, &peer, admin, now_ms);
    let row = s.store.set_cluster_peer(name, peer, event).await?;
    s.peers.invalidate(name);
    if peer != old {
        s.hub.notify_all();
    }
    tracing::info!(
        cluster = %name,
        admin = %admin,
        enabled = peer.enabled,
        port = peer.port,
        upload_rate = peer.upload_rate,
        max_uploads = peer.max_uploads,
        "peer sharing set"
    );
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_server_urls_are_https_with_a_host() {
        for ok in [
            "https://10.0.0.1:6443",
            "https://k.example",
            "https://[fd00::1]:6443/",
            "https://k.example/path",
        ] {
            assert_eq!(check_api_server(ok).unwrap(), ok);
        }
        for bad in [
            "http://k.example",
            "k.example:6443",
            "https://",
            "https:///x",
            "https://a b",
            "https://k.example\n",
            "https://user@k.example",
            "",
        ] {
            let e = check_api_server(bad).unwrap_err();
            assert_eq!(e.kind(), Kind::Invalid, "{bad}");
            assert!(e.to_string().starts_with(&format!("API server {bad:?}: ")), "{e}");
        }
    }

    fn peer_request(port: Option<u32>, max_uploads: Option<u32>) -> SetCluster {
        SetCluster {
            name: "c".into(),
            peer_port: port,
            peer_max_uploads: max_uploads,
            ..Default::default()
        }
    }

    #[test]
    fn peer_ports_and_upload_limits_are_checked() {
        assert_eq!(PeerChange::check(&peer_request(None, None)).unwrap(), None);
        for (port, uploads) in [(1, 1), (7444, 4), (65535, MAX_PEER_UPLOADS)] {
            let c = PeerChange::check(&peer_request(Some(port), Some(uploads)))
                .unwrap()
                .unwrap();
            assert_eq!((c.port, c.max_uploads), (Some(port as u16), Some(uploads)));
        }
        for port in [0, 65536, u32::MAX] {
            let e = PeerChange::check(&peer_request(Some(port), None)).unwrap_err();
            assert_eq!(e.kind(), Kind::Invalid);
            assert_eq!(
                e.to_string(),
                format!("peer port {port} is out of range: give 1 to 65535")
            );
        }
        for n in [0, MAX_PEER_UPLOADS + 1] {
            let e = PeerChange::check(&peer_request(None, Some(n))).unwrap_err();
            assert_eq!(e.kind(), Kind::Invalid);
            assert!(!e.to_string().contains('\n'), "{e}");
            assert!(e.to_string().contains("give 1 to 64"), "{e}");
        }
    }

    #[test]
    fn peer_fields_not_given_keep_their_value() {
        let old = PeerSettings {
            enabled: false,
            port: 7555,
            upload_rate: 1000,
            max_uploads: 8,
        };
        let on = PeerChange::check(&SetCluster {
            peer_sharing: Some(true),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(on.merge(old), PeerSettings { enabled: true, ..old });
        let rate = PeerChange::check(&SetCluster {
            peer_upload_rate: Some(0),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(
            rate.merge(old),
            PeerSettings {
                upload_rate: 0,
                ..old
            },
            "set while off: stored, still off"
        );
    }

    #[test]
    fn windows_are_set_or_cleared_and_bounded() {
        let set = |windows: &[&str], clear: bool| SetCluster {
            maintenance_windows: windows.iter().map(|w| w.to_string()).collect(),
            clear_maintenance_windows: clear,
            ..Default::default()
        };
        assert!(matches!(
            check_windows(&set(&[], false)),
            Err(ClusterError::NoWindows)
        ));
        assert_eq!(check_windows(&set(&[], true)).unwrap(), Vec::<String>::new());
        let many = vec!["bogus"; MAX_WINDOWS + 1];
        let e = check_windows(&set(&many, false)).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{} maintenance windows; the limit is {MAX_WINDOWS}",
                MAX_WINDOWS + 1
            )
        );
        let e = check_windows(&set(&["bogus"], true)).unwrap_err();
        assert_eq!(e.kind(), Kind::Invalid);
        assert!(matches!(
            check_windows(&set(&["bogus"], false)),
            Err(ClusterError::Window(_))
        ));
    }

    #[test]
    fn a_kube_change_may_not_leave_a_cluster_draining_blind() {
        let old = ClusterKube::default();
        let drain = KubeChange {
            kubeconfig: None,
            drain: Some(true),
        };
        let e = drain.check_against("tenant-a", &old).unwrap_err();
        assert_eq!(e.kind(), Kind::FailedPrecondition);
        assert_eq!(
            e.to_string(),
            "cluster tenant-a: draining needs the tenant API: give --kubeconfig FILE (or --drain off)"
        );
        let both = SetCluster {
            kubeconfig: Some("x".into()),
            clear_kubeconfig: true,
            ..Default::default()
        };
        assert!(matches!(
            KubeChange::check(&both),
            Err(ClusterError::KubeconfigBoth)
        ));
        assert_eq!(
            KubeChange::check(&SetCluster::default())
                .unwrap()
                .map(|c| c.drain),
            None
        );
    }
}
