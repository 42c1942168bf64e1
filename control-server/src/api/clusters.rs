//! The admin API's clusters: creating them with their CA (imported or
//! generated) and API server, changing them (`SetCluster`, maintenance
//! windows included), listing them, handing out the CA certificate, and
//! the record of certificates issued with the CAs. Every request is checked
//! whole before anything is stored.

use std::collections::HashMap;
use std::sync::Arc;

use lks_proto::names::{validate_cluster_name, validate_node_name};
use lks_proto::pb;
use time::OffsetDateTime;
use tonic::{Response, Status};

use super::{invalid, policy};
use crate::authz::store_status;
use crate::clock::now_ms;
use crate::context::Shared;
use crate::hub::Hub;
use crate::kube::config::TenantKubeconfig;
use crate::kube::tenant::{self, TenantApis};
use crate::peers::PeerCache;
use crate::pki::clusterca::{ClusterCa, ClusterCas};
use crate::store::{
    ClusterKube, ClusterRow, ClusterStore, EventRow, IssuedCertRow, NewCluster, PeerSettings, Store,
};

/// What the cluster handlers use: the store, the tenant CAs, and whom to
/// tell when a cluster's settings change (the agents' streams, the
/// peer-settings cache, the rollout controller).
pub(super) struct Deps {
    pub store: Arc<dyn Store>,
    pub cluster_cas: Arc<ClusterCas>,
    pub tenants: Arc<TenantApis>,
    pub hub: Arc<Hub>,
    pub peers: Arc<PeerCache>,
    pub rollouts_changed: Arc<tokio::sync::Notify>,
}

impl Deps {
    pub fn of(s: &Shared) -> Self {
        Deps {
            store: s.store.clone(),
            cluster_cas: s.cluster_cas.clone(),
            tenants: s.tenants.clone(),
            hub: s.hub.clone(),
            peers: s.peers.clone(),
            rollouts_changed: s.rollouts_changed.clone(),
        }
    }
}

/// Most concurrent uploads per node an operator may allow.
pub const MAX_PEER_UPLOADS: u32 = 64;

/// Largest CA certificate or key PEM accepted; kubeadm's are ~1–2 KiB.
const MAX_PEM: usize = 64 * 1024;
const MAX_URL: usize = 2048;

/// Checks an API server URL: `https://HOST[:PORT][/PATH]`, one token.
pub fn check_api_server(url: &str) -> Result<String, Status> {
    let bad = |why: &str| invalid(format!("API server {url:?}: {why}"));
    if url.len() > MAX_URL {
        return Err(bad("longer than 2048 bytes"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("contains whitespace"));
    }
    let uri: tonic::codegen::http::Uri = url.parse().map_err(|e| bad(&format!("not a URL ({e})")))?;
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
fn import_pair<'a>(cert: &'a str, key: &'a str) -> Result<Option<(&'a str, &'a str)>, Status> {
    if cert.len() > MAX_PEM || key.len() > MAX_PEM {
        return Err(invalid("CA certificate or key is larger than 64 KiB"));
    }
    match (cert.is_empty(), key.is_empty()) {
        (true, true) => Ok(None),
        (false, false) => Ok(Some((cert, key))),
        (false, true) => Err(invalid("a CA certificate needs its key: give --ca-key too")),
        (true, false) => Err(invalid("a CA key needs its certificate: give --ca-cert too")),
    }
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

fn how(imported: bool) -> &'static str {
    if imported { "imported" } else { "generated" }
}

/// Creates a cluster with its CA (imported, or generated when none is
/// given) and API server, in one store write.
pub async fn create(
    s: &Deps,
    r: pb::CreateClusterRequest,
    admin: &str,
    now_ms: i64,
) -> Result<ClusterRow, Status> {
    validate_cluster_name(&r.name).map_err(invalid)?;
    let api_server = match r.api_server.as_str() {
        "" => None,
        u => Some(check_api_server(u)?),
    };
    let import = import_pair(&r.ca_cert_pem, &r.ca_key_pem)?;
    if s.store.cluster_exists(&r.name).await.map_err(store_status)? {
        return Err(Status::already_exists(format!(
            "cluster {} already exists",
            r.name
        )));
    }
    let ca = ClusterCas::make(&r.name, import, OffsetDateTime::now_utc()).map_err(invalid)?;
    let stored = s.cluster_cas.to_stored(&ca, &r.name).map_err(internal)?;
    let row = s
        .store
        .create_cluster(NewCluster {
            name: r.name.clone(),
            now_ms,
            ca: Some(stored),
            api_server: api_server.clone(),
        })
        .await
        .map_err(store_status)?;
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
    pub fn check(r: &pb::SetClusterRequest) -> Result<Option<PeerChange>, Status> {
        let port = r
            .peer_port
            .map(|p| match u16::try_from(p) {
                Ok(p) if p > 0 => Ok(p),
                _ => Err(invalid(format!("peer port {p} is out of range: give 1 to 65535"))),
            })
            .transpose()?;
        let max_uploads = r
            .peer_max_uploads
            .map(|n| {
                if (1..=MAX_PEER_UPLOADS).contains(&n) {
                    Ok(n)
                } else {
                    Err(invalid(format!(
                        "peer max uploads {n} is out of range: give 1 to {MAX_PEER_UPLOADS}"
                    )))
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
    pub fn check(r: &pb::SetClusterRequest) -> Result<Option<KubeChange>, Status> {
        let kubeconfig = match (&r.kubeconfig, r.clear_kubeconfig) {
            (Some(_), true) => return Err(invalid("give a kubeconfig or remove it, not both")),
            (Some(text), false) => Some(Some(
                TenantKubeconfig::check(text).map_err(|e| invalid(format!("--kubeconfig: {e}")))?,
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
    pub fn check_against(&self, cluster: &str, old: &ClusterKube) -> Result<(), Status> {
        let drain = self.drain.unwrap_or(old.drain);
        let kubeconfig = match &self.kubeconfig {
            Some(k) => k.is_some(),
            None => old.kubeconfig.is_some(),
        };
        if drain && !kubeconfig {
            return Err(Status::failed_precondition(format!(
                "cluster {cluster}: draining needs the tenant API: give --kubeconfig FILE (or --drain off)"
            )));
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
pub struct ClusterChange {
    pub api_server: Option<Option<String>>,
    pub ca: Option<ClusterCa>,
    pub ca_imported: bool,
    pub peer: Option<PeerChange>,
    pub kube: Option<KubeChange>,
}

impl ClusterChange {
    pub fn is_empty(&self) -> bool {
        self.api_server.is_none() && self.ca.is_none() && self.peer.is_none() && self.kube.is_none()
    }
}

/// Checks the API-server, CA and peer-sharing part of a `SetCluster`
/// request; a CA is made (imported or generated) only for an existing
/// cluster without one.
pub async fn check_change(s: &Deps, r: &pb::SetClusterRequest) -> Result<ClusterChange, Status> {
    let peer = PeerChange::check(r)?;
    let kube = KubeChange::check(r)?;
    if let Some(k) = &kube {
        let old = s
            .store
            .cluster_kube(&r.name)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("cluster {} does not exist", r.name)))?;
        k.check_against(&r.name, &old)?;
    }
    let api_server = match (&r.api_server, r.clear_api_server) {
        (Some(_), true) => return Err(invalid("give an API server or clear it, not both")),
        (Some(u), false) => Some(Some(check_api_server(u)?)),
        (None, true) => Some(None),
        (None, false) => None,
    };
    let import = import_pair(&r.ca_cert_pem, &r.ca_key_pem)?;
    if import.is_some() && r.generate_ca {
        return Err(invalid(
            "import a CA (--ca-cert/--ca-key) or generate one (--generate-ca), not both",
        ));
    }
    let mut ca = None;
    if import.is_some() || r.generate_ca {
        let c = s
            .store
            .get_cluster(&r.name)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("cluster {} does not exist", r.name)))?;
        if c.ca_cert_pem.is_some() {
            return Err(Status::failed_precondition(format!(
                "cluster {} already has a CA; replacing it would orphan every certificate issued with it",
                r.name
            )));
        }
        ca = Some(ClusterCas::make(&r.name, import, OffsetDateTime::now_utc()).map_err(invalid)?);
    }
    Ok(ClusterChange {
        api_server,
        ca,
        ca_imported: import.is_some(),
        peer,
        kube,
    })
}

/// Stores a checked change: the CA first (the one part the store may
/// still refuse, if another request gave the cluster a CA meanwhile).
pub async fn apply_change(
    s: &Deps,
    name: &str,
    c: ClusterChange,
    admin: &str,
    now_ms: i64,
) -> Result<Option<ClusterRow>, Status> {
    let mut row = None;
    if let Some(ca) = &c.ca {
        let stored = s.cluster_cas.to_stored(ca, name).map_err(internal)?;
        let hash = ca.hash().to_string();
        let event = EventRow::ca_set(name, how(c.ca_imported), &hash, admin, now_ms);
        row = Some(
            s.store
                .set_cluster_ca(name, stored, event)
                .await
                .map_err(store_status)?,
        );
        tracing::info!(cluster = %name, admin = %admin, ca = how(c.ca_imported), ca_cert_hash = %hash, "cluster CA set");
    }
    if let Some(api) = c.api_server {
        let event = EventRow::api_server_set(name, api.as_deref(), admin, now_ms);
        row = Some(
            s.store
                .set_cluster_api_server(name, api.clone(), event)
                .await
                .map_err(store_status)?,
        );
        tracing::info!(cluster = %name, admin = %admin, api_server = ?api, "cluster API server set");
    }
    if let Some(change) = c.peer {
        row = Some(set_peer(s, name, change, admin, now_ms).await?);
    }
    if let Some(change) = c.kube {
        row = Some(set_kube(s, name, change, admin, now_ms).await?);
    }
    Ok(row)
}

/// Stores the cluster's tenant-API access merged with `change` (the
/// kubeconfig sealed like a CA key), then tries the new kubeconfig.
/// Read, merge, write, as [`set_peer`].
async fn set_kube(
    s: &Deps,
    name: &str,
    change: KubeChange,
    admin: &str,
    now_ms: i64,
) -> Result<ClusterRow, Status> {
    let old = s
        .store
        .cluster_kube(name)
        .await
        .map_err(store_status)?
        .ok_or_else(|| Status::not_found(format!("cluster {name} does not exist")))?;
    change.check_against(name, &old)?;
    let kubeconfig = match &change.kubeconfig {
        Some(Some(k)) => Some(s.tenants.to_stored(name, k).map_err(internal)?),
        Some(None) => None,
        None => old.kubeconfig.clone(),
    };
    let kube = ClusterKube {
        kubeconfig,
        drain: change.drain.unwrap_or(old.drain),
    };
    let what = change.describe();
    let event = EventRow::kube_set(name, &what, admin, now_ms);
    let row = s
        .store
        .set_cluster_kube(name, kube, event)
        .await
        .map_err(store_status)?;
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
) -> Result<ClusterRow, Status> {
    let old = s
        .store
        .get_cluster(name)
        .await
        .map_err(store_status)?
        .ok_or_else(|| Status::not_found(format!("cluster {name} does not exist")))?
        .peer;
    let peer = change.merge(old);
    let event = EventRow::peer_sharing_set(name, &peer, admin, now_ms);
    let row = s
        .store
        .set_cluster_peer(name, peer, event)
        .await
        .map_err(store_status)?;
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

/// The CA certificate of a cluster.
pub async fn ca_pem(s: &Deps, name: &str) -> Result<String, Status> {
    validate_cluster_name(name).map_err(invalid)?;
    let c = s
        .store
        .get_cluster(name)
        .await
        .map_err(store_status)?
        .ok_or_else(|| Status::not_found(format!("cluster {name} does not exist")))?;
    c.ca_cert_pem.ok_or_else(|| {
        Status::failed_precondition(format!(
            "cluster {name} has no CA; give it one with `lksctl cluster set {name} --generate-ca` or --ca-cert/--ca-key"
        ))
    })
}

pub fn cert_pb(r: IssuedCertRow, now_ms: i64) -> pb::IssuedCertificate {
    pb::IssuedCertificate {
        expired: r.not_after_ms <= now_ms,
        cluster: r.cluster,
        node: r.node,
        serial: r.serial,
        profile: r.profile,
        bundle: r.bundle,
        version: r.version,
        path: r.path,
        not_before_ms: r.not_before_ms,
        not_after_ms: r.not_after_ms,
        issued_at_ms: r.issued_at_ms,
    }
}

/// Only the newest record of each node, bundle and path, in the store's
/// order.
pub fn newest_only(rows: Vec<IssuedCertRow>) -> Vec<IssuedCertRow> {
    let mut newest: HashMap<(String, String, String), (i64, String)> = HashMap::new();
    for r in &rows {
        let k = (r.node.clone(), r.bundle.clone(), r.path.clone());
        let v = (r.issued_at_ms, r.serial.clone());
        let e = newest.entry(k).or_insert_with(|| v.clone());
        if v > *e {
            *e = v;
        }
    }
    rows.into_iter()
        .filter(|r| {
            newest
                .get(&(r.node.clone(), r.bundle.clone(), r.path.clone()))
                .is_some_and(|(_, serial)| *serial == r.serial)
        })
        .collect()
}

/// The certificates a `ListCertificates` request asks for.
pub async fn list(
    s: &Deps,
    r: pb::ListCertificatesRequest,
    now_ms: i64,
) -> Result<Vec<pb::IssuedCertificate>, Status> {
    if !r.cluster.is_empty() {
        validate_cluster_name(&r.cluster).map_err(invalid)?;
        if !s.store.cluster_exists(&r.cluster).await.map_err(store_status)? {
            return Err(Status::not_found(format!("cluster {} does not exist", r.cluster)));
        }
    }
    if !r.node.is_empty() {
        validate_node_name(&r.node).map_err(invalid)?;
    }
    if r.expiring_within_ms < 0 {
        return Err(invalid("expiring_within_ms must not be negative"));
    }
    let rows = s
        .store
        .list_certificates(
            (!r.cluster.is_empty()).then_some(r.cluster.as_str()),
            (!r.node.is_empty()).then_some(r.node.as_str()),
        )
        .await
        .map_err(store_status)?;
    let rows = if r.all { rows } else { newest_only(rows) };
    let horizon = now_ms.saturating_add(r.expiring_within_ms);
    Ok(rows
        .into_iter()
        .filter(|c| r.expiring_within_ms == 0 || c.not_after_ms <= horizon)
        .map(|c| cert_pb(c, now_ms))
        .collect())
}

/// The newest certificate of each bundle and path of one node.
pub async fn node_certs(
    store: &(impl ClusterStore + ?Sized),
    cluster: &str,
    node: &str,
    now_ms: i64,
) -> Result<Vec<pb::IssuedCertificate>, Status> {
    let rows = store
        .list_certificates(Some(cluster), Some(node))
        .await
        .map_err(store_status)?;
    Ok(newest_only(rows)
        .into_iter()
        .map(|c| cert_pb(c, now_ms))
        .collect())
}

/// `SetCluster`: windows are checked before anything is stored.
pub(super) async fn set(
    s: &Deps,
    r: pb::SetClusterRequest,
    who: String,
) -> Result<Response<pb::Cluster>, Status> {
    validate_cluster_name(&r.name).map_err(invalid)?;
    let name = r.name.clone();
    let wants_windows = r.clear_maintenance_windows || !r.maintenance_windows.is_empty();
    let change = check_change(s, &r).await?;
    if !wants_windows && change.is_empty() {
        return Err(invalid(
            "nothing to set: give --maintenance-window (repeatable), --no-maintenance-window, \
             --api-server, --no-api-server, --ca-cert with --ca-key, --generate-ca, \
             --peer-sharing, --peer-port, --peer-upload-rate, --peer-max-uploads, \
             --kubeconfig or --drain",
        ));
    }
    // Windows are checked before anything is stored.
    let windows = if wants_windows {
        Some(policy::check_windows(&r)?)
    } else {
        None
    };
    // The kubeconfig given, as check_change parsed it: tried once stored.
    let given = change.kube.as_ref().and_then(|k| k.kubeconfig.clone()).flatten();
    let mut row = apply_change(s, &name, change, &who, now_ms()).await?;
    if let Some(w) = windows {
        let c = policy::set_windows(s.store.as_ref(), &name, w, &who, now_ms()).await?;
        tracing::info!(cluster = %name, admin = %who, windows = ?c.maintenance_windows, "maintenance windows set");
        // Rollouts waiting for a window may start at once, or must stop starting.
        s.rollouts_changed.notify_one();
        row = Some(c);
    }
    let c = row.ok_or_else(|| Status::internal("set cluster: nothing was changed"))?;
    let mut answer = policy::cluster_pb(c, now_ms());
    if let Some(k) = given {
        answer.kube_probe = tenant::probe(&k).await;
    }
    Ok(Response::new(answer))
}

/// `ListClusters`.
pub(super) async fn list_clusters(s: &Deps) -> Result<Response<pb::ListClustersResponse>, Status> {
    let clusters = s.store.list_clusters().await.map_err(store_status)?;
    let now = now_ms();
    Ok(Response::new(pb::ListClustersResponse {
        clusters: clusters.into_iter().map(|c| policy::cluster_pb(c, now)).collect(),
    }))
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
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
        }
    }

    fn row(node: &str, path: &str, serial: &str, at: i64) -> IssuedCertRow {
        IssuedCertRow {
            cluster: "c".into(),
            node: node.into(),
            serial: serial.into(),
            profile: "client".into(),
            bundle: "b".into(),
            version: "1".into(),
            path: path.into(),
            not_before_ms: 0,
            not_after_ms: at + 10,
            issued_at_ms: at,
        }
    }

    #[test]
    fn only_the_newest_of_each_node_bundle_and_path_is_shown() {
        let rows = vec![
            row("n1", "/a", "01", 1),
            row("n1", "/a", "02", 5),
            row("n1", "/b", "03", 2),
            row("n2", "/a", "04", 1),
        ];
        let serials: Vec<String> = newest_only(rows).into_iter().map(|r| r.serial).collect();
        assert_eq!(serials, ["02", "03", "04"]);
        assert!(cert_pb(row("n", "/a", "1", 5), 15).expired);
        assert!(!cert_pb(row("n", "/a", "1", 5), 14).expired);
    }

    fn peer_request(port: Option<u32>, max_uploads: Option<u32>) -> pb::SetClusterRequest {
        pb::SetClusterRequest {
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
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert_eq!(
                e.message(),
                format!("peer port {port} is out of range: give 1 to 65535")
            );
        }
        for n in [0, MAX_PEER_UPLOADS + 1] {
            let e = PeerChange::check(&peer_request(None, Some(n))).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(!e.message().contains('\n'), "{}", e.message());
            assert!(e.message().contains("give 1 to 64"), "{}", e.message());
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
        let on = PeerChange::check(&pb::SetClusterRequest {
            peer_sharing: Some(true),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(on.merge(old), PeerSettings { enabled: true, ..old });
        let rate = PeerChange::check(&pb::SetClusterRequest {
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
}
