//! Issuing a certificate of a bundle (`IssueCertificate`): a node's CSR
//! for a `[[certificate]]` of a bundle assigned to it, signed with its
//! tenant cluster's CA.
//!
//! What may be signed is decided here and nowhere else: the bundle version
//! must be in the calling node's desired state, the entry must be one of
//! its `[[certificate]]`s, and the CSR must ask for exactly the names
//! `lks_proto::certs` gives that entry for *this* node (its name from the
//! mTLS certificate, its addresses from its last `Hello`). The certificate
//! is then built from those names, not from the CSR — only the CSR's key
//! is used — and its serial is recorded before it is returned, then the
//! issue is recorded as the node's event.

use std::net::IpAddr;
use std::time::Duration;

use lks_pki::clusterca::{CaError, CertTemplate, ClusterCas, KeyError, SignedCert, Usage};
use lks_proto::BundlePath;
use lks_proto::certs::{CertNameError, CertNames, CsrError, check_csr};
use lks_proto::identity::NodeIdentity;
use lks_proto::names::{NameError, validate_bundle_name, validate_version};
use lks_proto::path::PathError;

use super::event::{self, NodeEvent};
use super::{Kind, OpError};
use crate::clock::now_ms;
use crate::ratelimit::RateLimiter;
use crate::store::{
    BundleStore, ClusterStore, EventStore, IssuedCertRow, Kind as RowKind, NodeRow, NodeStore, StoreError,
    StoredBundle,
};

/// Largest CSR accepted (a P-256 CSR with 32 SANs is about 2 KiB).
const MAX_CSR: usize = 16 * 1024;

/// A certificate as a node asks for it: the entry at `path` of
/// `bundle@version`.
#[derive(Clone, Debug, Default)]
pub struct CertRequest {
    pub bundle: String,
    pub version: String,
    pub path: String,
    pub csr_pem: String,
}

impl CertRequest {
    /// `bundle@version path`, as logs and the node's event name it.
    pub fn what(&self) -> String {
        format!("{}@{} {}", self.bundle, self.version, self.path)
    }
}

/// A signed certificate, with what the node needs beside it.
#[derive(Clone, Debug)]
pub struct BundleCert {
    pub certificate_pem: String,
    /// The tenant cluster's CA.
    pub ca_pem: String,
    /// The cluster's API server (empty if it has none).
    pub api_server: String,
    pub cluster: String,
    pub serial: String,
    pub not_after_ms: i64,
}

/// Why a certificate was not issued (besides the store's refusal).
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error("bundle: {0}")]
    BundleName(NameError),
    #[error("version: {0}")]
    Version(NameError),
    #[error("path: {0}")]
    Path(PathError),
    #[error("the CSR is {0} bytes; the limit is {MAX_CSR}")]
    CsrTooLarge(usize),
    #[error("bundle {bundle}@{version} is not assigned to node {node}")]
    NotAssigned {
        bundle: String,
        version: String,
        node: String,
    },
    #[error("{path} is not a [[certificate]] of bundle {bundle}@{version}")]
    NotACertificate {
        path: BundlePath,
        bundle: String,
        version: String,
    },
    #[error(transparent)]
    Names(CertNameError),
    /// The CSR does not ask for the names the entry gives this node.
    #[error("{path}: {source}")]
    CsrNames { path: BundlePath, source: CsrError },
    #[error("cluster {cluster} CA: {source}")]
    CaUnreadable { cluster: String, source: KeyError },
    #[error(
        "cluster {0} has no CA to sign node certificates; give it one with \
         `lksctl cluster set {0} --generate-ca` (or --ca-cert and --ca-key)"
    )]
    NoCa(String),
    #[error("{path}: {source}")]
    Sign { path: BundlePath, source: CaError },
    #[error("cluster {0} no longer exists")]
    ClusterGone(String),
    /// The node asked for more certificates than its limit allows now.
    #[error("node {0} asked for too many certificates; retry in a minute")]
    TooMany(String),
}

impl IssueError {
    pub fn kind(&self) -> Kind {
        match self {
            IssueError::NotAssigned { .. } | IssueError::CsrNames { .. } => Kind::PermissionDenied,
            IssueError::CaUnreadable { .. } => Kind::Internal,
            IssueError::NoCa(_) | IssueError::ClusterGone(_) => Kind::FailedPrecondition,
            IssueError::TooMany(_) => Kind::ResourceExhausted,
            _ => Kind::Invalid,
        }
    }
}

/// Takes one of the certificates node `id` may have signed now
/// (`limiter`: a burst for a bundle's worth, then one per ten seconds).
pub fn admit(limiter: &RateLimiter<String>, id: &NodeIdentity) -> Result<(), IssueError> {
    if !limiter.allow(id.node.clone()) {
        return Err(IssueError::TooMany(id.node.clone()));
    }
    Ok(())
}

/// Signs `r` for the node `id`, records the certificate and the event.
pub async fn issue(
    store: &(impl NodeStore + BundleStore + ClusterStore + EventStore + ?Sized),
    cas: &ClusterCas,
    id: &NodeIdentity,
    r: CertRequest,
) -> Result<BundleCert, OpError> {
    validate_bundle_name(&r.bundle).map_err(IssueError::BundleName)?;
    validate_version(&r.version).map_err(IssueError::Version)?;
    let path = BundlePath::new(&r.path).map_err(IssueError::Path)?;
    if r.csr_pem.len() > MAX_CSR {
        return Err(IssueError::CsrTooLarge(r.csr_pem.len()).into());
    }
    let node = store
        .get_node(&id.node)
        .await?
        .ok_or_else(|| StoreError::not_found(RowKind::Node, id.node.clone()))?;
    let bundle = assigned(store, &node, &r.bundle, &r.version).await?;
    let spec = bundle
        .manifest()
        .certificate(&path)
        .ok_or_else(|| IssueError::NotACertificate {
            path: path.clone(),
            bundle: r.bundle.clone(),
            version: r.version.clone(),
        })?;
    let names = spec
        .names_for(&id.node, &reported_addresses(&node.facts_json))
        .map_err(IssueError::Names)?;
    check_csr(&r.csr_pem, &names).map_err(|source| IssueError::CsrNames {
        path: path.clone(),
        source,
    })?;
    let ca = cas
        .load(&id.cluster)
        .await
        .map_err(|source| IssueError::CaUnreadable {
            cluster: id.cluster.clone(),
            source,
        })?
        .ok_or_else(|| IssueError::NoCa(id.cluster.clone()))?;
    let signed = ca
        .sign(
            &r.csr_pem,
            &template(&names, spec.ttl),
            time::OffsetDateTime::now_utc(),
        )
        .map_err(|source| IssueError::Sign {
            path: path.clone(),
            source,
        })?;
    let cluster = store
        .get_cluster(&id.cluster)
        .await?
        .ok_or_else(|| IssueError::ClusterGone(id.cluster.clone()))?;
    // Recorded before it is handed out: no certificate exists that the
    // store does not know of.
    store
        .record_certificate(IssuedCertRow {
            cluster: id.cluster.clone(),
            node: id.node.clone(),
            serial: signed.serial.clone(),
            profile: spec.profile.as_str().into(),
            bundle: r.bundle.clone(),
            version: r.version.clone(),
            path: path.to_string(),
            not_before_ms: signed.not_before_ms,
            not_after_ms: signed.not_after_ms,
            issued_at_ms: now_ms(),
        })
        .await?;
    event::record(store, id, issued_event(&r, &signed)).await;
    Ok(BundleCert {
        certificate_pem: signed.pem,
        ca_pem: ca.cert_pem().to_string(),
        api_server: cluster.api_server.unwrap_or_default(),
        cluster: id.cluster.clone(),
        serial: signed.serial,
        not_after_ms: signed.not_after_ms,
    })
}

/// `bundle@version` if the node's desired state holds it.
async fn assigned(
    store: &(impl BundleStore + ?Sized),
    node: &NodeRow,
    bundle: &str,
    version: &str,
) -> Result<StoredBundle, OpError> {
    let not_assigned = || IssueError::NotAssigned {
        bundle: bundle.to_string(),
        version: version.to_string(),
        node: node.name.clone(),
    };
    if node.desired.get(bundle).map(String::as_str) != Some(version) {
        return Err(not_assigned().into());
    }
    // Deleted since the node's row was read: no longer assigned either.
    Ok(store
        .get_bundle(bundle, version)
        .await?
        .map(|row| row.bundle)
        .ok_or_else(not_assigned)?)
}

/// The certificate `names` ask for, valid for `ttl`.
fn template(names: &CertNames, ttl: Duration) -> CertTemplate {
    CertTemplate {
        common_name: names.common_name.clone(),
        organizations: names.organizations.clone(),
        dns_names: names.dns_names.clone(),
        ip_addresses: names.ip_addresses.clone(),
        usage: if names.client {
            Usage::Client
        } else {
            Usage::Server
        },
        ttl,
    }
}

/// The node's event for the certificate `signed` for `r`.
fn issued_event<'a>(r: &'a CertRequest, signed: &SignedCert) -> NodeEvent<'a> {
    NodeEvent {
        kind: "certificate_issued",
        bundle: &r.bundle,
        version: &r.version,
        message: format!(
            "{}: serial {}, valid until {}",
            r.what(),
            signed.serial,
            crate::clock::rfc3339(signed.not_after_ms)
        ),
        at_ms: now_ms(),
    }
}

/// The addresses of the node's last `Hello` (none if it never sent any).
fn reported_addresses(facts_json: &str) -> Vec<IpAddr> {
    serde_json::from_str::<serde_json::Value>(facts_json)
        .ok()
        .and_then(|v| v.get("addresses").cloned())
        .and_then(|a| serde_json::from_value::<Vec<String>>(a).ok())
        .unwrap_or_default()
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_over_its_certificate_limit_is_told_to_retry_later() {
        let limiter = RateLimiter::new(0.0, 2.0);
        let (n1, n2) = (
            NodeIdentity::new("a", "n1").unwrap(),
            NodeIdentity::new("a", "n2").unwrap(),
        );
        admit(&limiter, &n1).unwrap();
        admit(&limiter, &n1).unwrap();
        let e = OpError::from(admit(&limiter, &n1).unwrap_err());
        assert_eq!(e.kind(), Some(Kind::ResourceExhausted));
        assert_eq!(
            e.to_string(),
            "node n1 asked for too many certificates; retry in a minute"
        );
        admit(&limiter, &n2).unwrap();
    }

    #[test]
    fn addresses_come_from_the_facts_and_only_parse() {
        let f = r#"{"hostname":"w1","addresses":["192.0.2.1","nonsense","2001:db8::1"]}"#;
        assert_eq!(
            reported_addresses(f),
            vec![
                "192.0.2.1".parse::<IpAddr>().unwrap(),
                "2001:db8::1".parse().unwrap()
            ]
        );
        assert!(reported_addresses("").is_empty());
        assert!(reported_addresses(r#"{"hostname":"w1"}"#).is_empty());
    }
}

#[cfg(test)]
mod store_tests {
    use std::sync::Arc;

    use lks_pki::clusterca::ClusterCa;
    use lks_proto::SignedBundle;

    use super::*;
    use crate::store::sqlite::SqliteStore;
    use crate::store::{EventFilter, EventRow, NewBundle, Store};

    const BUNDLE_TOML: &str = "name = \"id\"\nversion = \"1\"\n\
        [[certificate]]\npath = \"/a.crt\"\nkey_path = \"/a.key\"\nprofile = \"kubelet-client\"\n";

    /// Cluster `a` with node `n1` enrolled and bundle `id@1` published
    /// but not assigned; no CA.
    async fn store() -> (Arc<dyn Store>, ClusterCas, NodeIdentity) {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
        crate::ops::fixture::cluster_a(&*store).await;
        crate::ops::fixture::enrol(&*store, "n1", "01", "sha256:00").await;
        let manifest = lks_proto::authoring::parse_bundle_toml(
            BUNDLE_TOML,
            std::path::Path::new("/"),
            &mut lks_proto::authoring::RequireSize,
        )
        .unwrap()
        .manifest;
        let signed = SignedBundle {
            manifest,
            signature: None,
            chunks_signature: None,
        };
        store
            .put_bundle(NewBundle::new(signed, Vec::new(), 1))
            .await
            .unwrap();
        let cas = ClusterCas::new(store.clone(), None);
        (store, cas, NodeIdentity::new("a", "n1").unwrap())
    }

    /// Puts `id@1` in `n1`'s desired state, as a rollout's commit does.
    async fn assign(store: &dyn Store) {
        crate::ops::fixture::assign_n1(store, "id").await;
    }

    async fn give_ca(store: &dyn Store, cas: &ClusterCas) -> ClusterCa {
        let ca = ClusterCas::make("a", None, time::OffsetDateTime::now_utc()).unwrap();
        let event = EventRow {
            id: 0,
            at_ms: 1,
            cluster: "a".into(),
            node: String::new(),
            rollout_id: String::new(),
            kind: "cluster_ca".into(),
            bundle: String::new(),
            version: String::new(),
            message: String::new(),
        };
        store
            .set_cluster_ca("a", cas.to_stored(&ca, "a").unwrap(), event)
            .await
            .unwrap();
        ca
    }

    /// A CSR for a kubelet client certificate of node `node`.
    fn csr(node: &str) -> String {
        let mut params = rcgen::CertificateParams::default();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
        dn.push(rcgen::DnType::OrganizationName, "system:nodes");
        params.distinguished_name = dn;
        let key = rcgen::KeyPair::generate().unwrap();
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    fn asked() -> CertRequest {
        CertRequest {
            bundle: "id".into(),
            version: "1".into(),
            path: "/a.crt".into(),
            csr_pem: csr("n1"),
        }
    }

    /// Every refusal, in the order the checks run, each with the kind and
    /// text a node sees; none signs or records anything.
    #[tokio::test]
    async fn a_request_is_refused_for_the_first_check_it_fails_and_nothing_is_recorded() {
        let (store, cas, id) = store().await;
        let refused = |r: CertRequest, id: NodeIdentity| {
            let (store, cas) = (store.clone(), &cas);
            async move { issue(&*store, cas, &id, r).await.err().unwrap() }
        };
        let check = |e: OpError, kind: Kind, text: &str| {
            assert_eq!(e.kind(), Some(kind), "{e}");
            assert!(e.to_string().starts_with(text), "{e}");
        };

        let bad = |f: fn(&mut CertRequest)| {
            let mut r = asked();
            f(&mut r);
            r
        };
        check(
            refused(bad(|r| r.bundle = "Bad_Name".into()), id.clone()).await,
            Kind::Invalid,
            "bundle: ",
        );
        check(
            refused(bad(|r| r.version = String::new()), id.clone()).await,
            Kind::Invalid,
            "version: ",
        );
        check(
            refused(bad(|r| r.path = "a.crt".into()), id.clone()).await,
            Kind::Invalid,
            "path: ",
        );
        check(
            refused(bad(|r| r.csr_pem = "x".repeat(MAX_CSR + 1)), id.clone()).await,
            Kind::Invalid,
            "the CSR is 16385 bytes; the limit is 16384",
        );
        let e = refused(asked(), NodeIdentity::new("a", "n9").unwrap()).await;
        assert!(matches!(e, OpError::Store(StoreError::NotFound { .. })), "{e}");
        check(
            refused(asked(), id.clone()).await,
            Kind::PermissionDenied,
            "bundle id@1 is not assigned to node n1",
        );

        assign(&*store).await;
        check(
            refused(bad(|r| r.path = "/b.crt".into()), id.clone()).await,
            Kind::Invalid,
            "/b.crt is not a [[certificate]] of bundle id@1",
        );
        check(
            refused(bad(|r| r.csr_pem = csr("n2")), id.clone()).await,
            Kind::PermissionDenied,
            "/a.crt: ",
        );
        check(
            refused(asked(), id.clone()).await,
            Kind::FailedPrecondition,
            "cluster a has no CA to sign node certificates; give it one with \
             `lksctl cluster set a --generate-ca` (or --ca-cert and --ca-key)",
        );
        assert!(store.list_certificates(None, None).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_certificate_is_recorded_and_its_issue_is_the_nodes_event() {
        let (store, cas, id) = store().await;
        assign(&*store).await;
        let ca = give_ca(&*store, &cas).await;
        let c = issue(&*store, &cas, &id, asked()).await.unwrap();
        assert_eq!((c.cluster.as_str(), c.api_server.as_str()), ("a", ""));
        assert_eq!(c.ca_pem, ca.cert_pem());

        let [row] = store
            .list_certificates(Some("a"), Some("n1"))
            .await
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(
            (row.serial.as_str(), row.profile.as_str(), row.path.as_str()),
            (c.serial.as_str(), "kubelet-client", "/a.crt")
        );
        assert_eq!(row.not_after_ms, c.not_after_ms);
        let events = store
            .list_events(EventFilter {
                node: Some("n1".into()),
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        let issued = events.iter().find(|e| e.kind == "certificate_issued").unwrap();
        assert_eq!((issued.bundle.as_str(), issued.version.as_str()), ("id", "1"));
        assert!(
            issued
                .message
                .starts_with(&format!("id@1 /a.crt: serial {}, valid until ", c.serial)),
            "{}",
            issued.message
        );
    }
}
