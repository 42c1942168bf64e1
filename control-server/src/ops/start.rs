//! Starting a rollout: every precondition is checked before the rollout is
//! stored — a retried start (same request ID) gets its rollout back, the
//! bundle must be published and the cluster exist, an identity bundle
//! needs the cluster's CA and API server, the limits, no path conflict on
//! any target node, the policy (`lks_rollout::policy`), the kubelet version
//! against the tenant API server's (`start/skew.rs`), and a rollout that
//! drains waits until every replica reads its fields. Then the rollout
//! controller records it and starts its first batch.

pub mod skew;

use std::collections::HashMap;

use lks_proto::Manifest;
use lks_proto::labels::{Labels, selector_matches};
use lks_proto::manifest::check_paths_disjoint;
use lks_proto::names::{NameError, validate_bundle_name, validate_cluster_name, validate_version};
use lks_rollout::{Policy, PolicyError};

use super::{Kind, OpError};
use crate::clock::now_ms;
use crate::controller;
use crate::store::{
    BundleRow, BundleStore, ClusterRow, ClusterStore, NewRollout, NodeStore, RolloutRow, RolloutState,
    RolloutStore, StoredBundle,
};

/// Longest request ID.
const MAX_REQUEST_ID: usize = 128;
/// The store format whose fields a rollout that drains keeps (its policy's
/// `drain`, its rows' kube steps): an older replica that rewrote the
/// rollout would drop them.
const DRAIN_FORMAT: u32 = 1;

/// A rollout start as the operator asked for it. The names and the
/// selector are valid (checked where the request was decoded); everything
/// else is checked here, in the order the operator's mistakes are named.
#[derive(Clone, Debug, Default)]
pub struct StartRollout {
    pub cluster: String,
    pub bundle: String,
    pub version: String,
    pub selector: Labels,
    /// Empty: a random rollout ID. Otherwise the rollout ID derives from
    /// it, so a retried start finds the rollout it started.
    pub request_id: String,
    /// Batch size, threshold, offline nodes, canaries, pacing, draining.
    pub policy: Policy,
    /// The tenant API server's version (`v1.37.2`) when the cluster has a
    /// kubeconfig and its API answered; the kubelet version a draining
    /// start names is checked against it (`start/skew.rs`).
    pub tenant_api_version: Option<String>,
    /// The admin who asked.
    pub started_by: String,
}

/// A rollout as it stands after its start, and what the operator should be
/// told about it (one line each; nothing stops the start).
#[derive(Debug)]
pub struct Started {
    pub row: RolloutRow,
    pub warnings: Vec<String>,
}

/// Why a rollout is not started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The cluster's, bundle's or version's name is malformed.
    #[error(transparent)]
    Name(#[from] NameError),
    #[error(transparent)]
    Selector(#[from] super::labels::LabelsError),
    #[error("request ID is {len} bytes, more than {MAX_REQUEST_ID}")]
    RequestIdTooLong { len: usize },
    #[error("request ID {id:?} has {c:?}; use only A-Z a-z 0-9 . _ : / -")]
    RequestIdChar { id: String, c: char },
    #[error(
        "request ID {request_id:?} already started rollout {id} ({cluster} {bundle}@{version}); a new rollout needs a new request ID"
    )]
    RequestIdTaken {
        request_id: String,
        id: String,
        cluster: String,
        bundle: String,
        version: String,
    },
    #[error("bundle {bundle}@{version} is not published; publish it with `lksctl bundle publish DIR`")]
    NoBundle { bundle: String, version: String },
    #[error("cluster {cluster} does not exist")]
    NoCluster { cluster: String },
    #[error(
        "bundle {bundle} has [[certificate]] entries but cluster {cluster} has no CA to sign them; \
         give it one with `lksctl cluster set {cluster} --generate-ca` (or --ca-cert and --ca-key)"
    )]
    NoClusterCa { bundle: String, cluster: String },
    #[error(
        "bundle {bundle} has [[kubeconfig]] entries but cluster {cluster} has no API server address; \
         set one with `lksctl cluster set {cluster} --api-server URL`"
    )]
    NoApiServer { bundle: String, cluster: String },
    #[error("assigned bundle {bundle}@{version} is missing")]
    AssignedMissing { bundle: String, version: String },
    #[error("node {node}: bundle {bundle} conflicts with bundle {other}: {why}")]
    PathConflict {
        node: String,
        bundle: String,
        other: String,
        why: String,
    },
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Skew(#[from] skew::NewerThanApi),
    #[error(
        "{what} waits until every replica is upgraded: replica {replica} runs {release} (store format {format}, this needs {needs}); \
         finish the rolling upgrade, or start it without --drain"
    )]
    OlderReplica {
        what: &'static str,
        replica: String,
        /// "release X", or what a replica from before releases were announced runs.
        release: String,
        format: u32,
        needs: u32,
    },
}

impl StartError {
    pub fn kind(&self) -> Kind {
        match self {
            StartError::RequestIdTaken { .. } => Kind::AlreadyExists,
            StartError::NoBundle { .. } | StartError::NoCluster { .. } => Kind::NotFound,
            StartError::NoClusterCa { .. }
            | StartError::NoApiServer { .. }
            | StartError::PathConflict { .. }
            | StartError::OlderReplica { .. }
            | StartError::Skew(_) => Kind::FailedPrecondition,
            StartError::AssignedMissing { .. } => Kind::Internal,
            StartError::Policy(e) if e.is_precondition() => Kind::FailedPrecondition,
            StartError::Policy(_) => Kind::Invalid,
            StartError::Name(_)
            | StartError::Selector(_)
            | StartError::RequestIdTooLong { .. }
            | StartError::RequestIdChar { .. } => Kind::Invalid,
        }
    }
}

/// What a start request names, checked before anything is read, in this
/// order: the cluster's, bundle's and version's names, then the selector
/// (returned sorted, as [`StartRollout::selector`] holds it).
pub fn check_names(
    cluster: &str,
    bundle: &str,
    version: &str,
    selector: &HashMap<String, String>,
) -> Result<Labels, StartError> {
    validate_cluster_name(cluster)?;
    validate_bundle_name(bundle)?;
    validate_version(version)?;
    Ok(super::labels::check("selector", selector)?)
}

/// Starts the rollout `r` asks for (or answers the one its request ID
/// started already); returns it as it stands after its first decision.
pub async fn start(
    store: &(impl RolloutStore + BundleStore + ClusterStore + NodeStore + ?Sized),
    controller: &controller::Handle,
    r: StartRollout,
) -> Result<Started, OpError> {
    check_request_id(&r.request_id)?;
    let id = if r.request_id.is_empty() {
        random_id()
    } else {
        let id = request_rollout_id(&r.request_id);
        if let Some(done) = store.get_rollout(&id).await? {
            return Ok(Started {
                row: same_request(&r, done)?,
                warnings: Vec::new(),
            });
        }
        id
    };
    let bundle = store
        .get_bundle(&r.bundle, &r.version)
        .await?
        .ok_or_else(|| StartError::NoBundle {
            bundle: r.bundle.clone(),
            version: r.version.clone(),
        })?;
    let cluster = store
        .get_cluster(&r.cluster)
        .await?
        .ok_or_else(|| StartError::NoCluster {
            cluster: r.cluster.clone(),
        })?;
    identity_preconditions(&cluster, bundle.bundle.manifest())?;
    r.policy.validate().map_err(StartError::from)?;
    check_path_conflicts(store, &r.cluster, &r.selector, &bundle).await?;
    let matched = matched_nodes(store, &r.cluster, &r.selector).await?;
    let mut seed = [0u8; 8];
    let _ = getrandom::getrandom(&mut seed);
    let resolved = r
        .policy
        .resolve(&cluster, matched, &r.request_id, u64::from_le_bytes(seed))
        .map_err(StartError::from)?;
    let policy = resolved.policy;
    let mut warnings = Vec::new();
    if let Some(d) = policy.drain.as_ref().filter(|d| !d.kubelet_version.is_empty())
        && let Some(api) = &r.tenant_api_version
    {
        warnings.extend(skew::check(&r.cluster, &d.kubelet_version, api).map_err(StartError::from)?);
    }
    if policy.drain.is_some() {
        every_replica_reads(store, DRAIN_FORMAT, "a rollout that drains").await?;
    }
    if policy.ignore_windows {
        tracing::warn!(cluster = %r.cluster, bundle = %r.bundle, admin = %r.started_by, "rollout ignores maintenance windows");
    }
    let row = controller
        .start(NewRollout {
            id,
            cluster: r.cluster,
            bundle: r.bundle,
            version: r.version,
            selector: r.selector,
            batch_size: resolved.batch_size,
            failure_threshold: resolved.failure_threshold,
            offline_deadline_ms: resolved.offline_deadline.as_millis() as u64,
            policy,
            started_by: r.started_by,
            now_ms: now_ms(),
        })
        .await?;
    Ok(Started { row, warnings })
}

/// Nodes of `cluster` the selector matches now.
async fn matched_nodes(
    store: &(impl NodeStore + ?Sized),
    cluster: &str,
    selector: &Labels,
) -> Result<usize, OpError> {
    let nodes = store.list_nodes(Some(cluster)).await?;
    Ok(nodes
        .iter()
        .filter(|n| selector_matches(selector, &n.labels))
        .count())
}

/// Two bundles on one node may not own the same path (DESIGN §4): the
/// new version is checked against every other bundle of each target node.
async fn check_path_conflicts(
    store: &(impl RolloutStore + BundleStore + NodeStore + ?Sized),
    cluster: &str,
    selector: &Labels,
    bundle: &BundleRow,
) -> Result<(), OpError> {
    let new = bundle.bundle.manifest();
    let mut cache: HashMap<(String, String), StoredBundle> = HashMap::new();
    let nodes = store.list_nodes(Some(cluster)).await?;
    // Versions a rollout of another bundle will still give a node count
    // as if they were assigned already: nodes an active rollout has not
    // started, and the deferred or held nodes a completed one may still
    // catch up.
    let mut coming: HashMap<&str, Vec<(String, String)>> = HashMap::new();
    // The rollouts still driven are the ones that may yet assign.
    let driven = store.rollouts_to_drive().await?;
    for r in driven.iter().filter(|r| {
        r.cluster == cluster
            && r.bundle != new.name
            && r.state != RolloutState::RollingBack
            && r.needs_driving()
    }) {
        for rn in r.nodes.iter().filter(|rn| rn.startable()) {
            coming
                .entry(rn.name.as_str())
                .or_default()
                .push((r.bundle.clone(), r.version.clone()));
        }
    }
    for n in nodes.iter().filter(|n| selector_matches(selector, &n.labels)) {
        // What this node would install: its architecture's variant. A
        // node the bundle has no variant for fails at its turn instead.
        let arch = crate::store::facts_architecture(&n.facts_json);
        let Ok(new) = new.for_arch(arch) else { continue };
        let mut paths: Vec<(String, lks_proto::BundlePath)> = new
            .owned_paths()
            .into_iter()
            .map(|p| (new.name.clone(), p.clone()))
            .collect();
        let mut others: Vec<(String, String)> = n
            .desired
            .iter()
            .filter(|(b, _)| **b != new.name)
            .map(|(b, v)| (b.clone(), v.clone()))
            .collect();
        others.extend(coming.get(n.name.as_str()).into_iter().flatten().cloned());
        for key in &others {
            if !cache.contains_key(key) {
                let (b, v) = key;
                let row = store
                    .get_bundle(b, v)
                    .await?
                    .ok_or_else(|| StartError::AssignedMissing {
                        bundle: b.clone(),
                        version: v.clone(),
                    })?;
                cache.insert(key.clone(), row.bundle);
            }
        }
        for key in &others {
            if let Some(m) = cache.get(key).and_then(|b| b.manifest().for_arch(arch).ok()) {
                paths.extend(m.owned_paths().into_iter().map(|p| (m.name.clone(), p.clone())));
            }
        }
        if let Err((i, why)) = check_paths_disjoint(paths.iter().map(|(_, p)| p)) {
            return Err(StartError::PathConflict {
                node: n.name.clone(),
                bundle: new.name.clone(),
                other: paths[i].0.clone(),
                why: why.to_string(),
            }
            .into());
        }
    }
    Ok(())
}

/// A bundle with `[[certificate]]` needs a cluster CA to sign them, and
/// one with `[[kubeconfig]]` the tenant API server's address: refused
/// before any node is asked, rather than failing on every node.
fn identity_preconditions(cluster: &ClusterRow, m: &Manifest) -> Result<(), StartError> {
    if !m.certificates.is_empty() && cluster.ca_cert_pem.is_none() {
        return Err(StartError::NoClusterCa {
            bundle: m.id(),
            cluster: cluster.name.clone(),
        });
    }
    if !m.kubeconfigs.is_empty() && cluster.api_server.is_none() {
        return Err(StartError::NoApiServer {
            bundle: m.id(),
            cluster: cluster.name.clone(),
        });
    }
    Ok(())
}

/// Refuses `what` while a live replica of the region is of a release that
/// does not read store format `format` (the version-skew contract).
async fn every_replica_reads(
    store: &(impl RolloutStore + ?Sized),
    format: u32,
    what: &'static str,
) -> Result<(), OpError> {
    match store.older_replica(format).await? {
        None => Ok(()),
        Some(o) => Err(StartError::OlderReplica {
            what,
            replica: o.replica,
            release: if o.release.is_empty() {
                "an older release (before the version-skew contract)".to_string()
            } else {
                format!("release {}", o.release)
            },
            format: o.format,
            needs: format,
        }
        .into()),
    }
}

fn check_request_id(id: &str) -> Result<(), StartError> {
    if id.len() > MAX_REQUEST_ID {
        return Err(StartError::RequestIdTooLong { len: id.len() });
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '/' | '-')))
    {
        return Err(StartError::RequestIdChar {
            id: id.to_string(),
            c,
        });
    }
    Ok(())
}

/// The ID of the rollout a request ID starts
/// ([`lks_rollout::plan::request_rollout_id`], which a release plan knows
/// its rollouts by before it starts them).
fn request_rollout_id(request_id: &str) -> String {
    lks_rollout::plan::request_rollout_id(request_id)
}

/// A start sent again: the rollout its request ID started, when it is for
/// the same cluster, bundle and version.
fn same_request(r: &StartRollout, done: RolloutRow) -> Result<RolloutRow, StartError> {
    if done.policy.request_id == r.request_id
        && (done.cluster.as_str(), done.bundle.as_str(), done.version.as_str())
            == (r.cluster.as_str(), r.bundle.as_str(), r.version.as_str())
    {
        return Ok(done);
    }
    Err(StartError::RequestIdTaken {
        request_id: r.request_id.clone(),
        id: done.id,
        cluster: done.cluster,
        bundle: done.bundle,
        version: done.version,
    })
}

fn random_id() -> String {
    let mut b = [0u8; 6];
    let _ = getrandom::getrandom(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RolloutPolicy;

    fn cluster(ca: bool, api: bool) -> ClusterRow {
        ClusterRow {
            name: "tenant-a".into(),
            created_at_ms: 0,
            node_count: 0,
            maintenance_windows: Vec::new(),
            ca_cert_pem: ca.then(|| "PEM".into()),
            api_server: api.then(|| "https://api:6443".into()),
            peer: crate::store::PeerSettings::default(),
            kube: Default::default(),
            labels: Default::default(),
            reboots: Default::default(),
        }
    }

    #[test]
    fn identity_bundles_need_a_ca_and_kubeconfigs_an_api_server() {
        let text = "name = \"id\"\nversion = \"1\"\n\
            [[certificate]]\npath = \"/a.crt\"\nkey_path = \"/a.key\"\nprofile = \"kubelet-client\"\n\
            [[kubeconfig]]\npath = \"/k.conf\"\ncertificate = \"/a.crt\"\n";
        let m = lks_proto::authoring::parse_bundle_toml(
            text,
            std::path::Path::new("/"),
            &mut lks_proto::authoring::RequireSize,
        )
        .unwrap()
        .manifest;
        identity_preconditions(&cluster(true, true), &m).unwrap();
        let e = identity_preconditions(&cluster(false, true), &m).unwrap_err();
        assert_eq!(e.kind(), Kind::FailedPrecondition);
        assert!(e.to_string().contains("cluster tenant-a has no CA"), "{e}");
        let e = identity_preconditions(&cluster(true, false), &m).unwrap_err();
        assert!(e.to_string().contains("has no API server address"), "{e}");
        let plain = Manifest {
            name: "plain".into(),
            version: "1".into(),
            ..Default::default()
        };
        identity_preconditions(&cluster(false, false), &plain).unwrap();
    }

    #[test]
    fn a_request_id_names_one_rollout_and_a_retry_gets_it_back() {
        assert_eq!(request_rollout_id("kube:abc"), request_rollout_id("kube:abc"));
        assert_ne!(request_rollout_id("kube:abc"), request_rollout_id("kube:abd"));
        let id = request_rollout_id("kube:abc");
        assert!(
            id.len() == 12 && id.chars().all(|c| c.is_ascii_hexdigit()),
            "{id}"
        );

        check_request_id("").unwrap();
        check_request_id("kube:0b7c-11/ci.job_7").unwrap();
        let e = check_request_id("a b").unwrap_err();
        assert_eq!(e.kind(), Kind::Invalid);
        assert!(e.to_string().contains("' '"), "{e}");
        assert!(check_request_id(&"x".repeat(129)).is_err());

        let req = StartRollout {
            cluster: "a".into(),
            bundle: "k".into(),
            version: "2".into(),
            request_id: "kube:abc".into(),
            ..Default::default()
        };
        let policy = RolloutPolicy {
            request_id: "kube:abc".into(),
            ..Default::default()
        };
        let done = NewRollout {
            id,
            cluster: "a".into(),
            bundle: "k".into(),
            version: "2".into(),
            selector: Labels::new(),
            batch_size: 1,
            failure_threshold: 1,
            offline_deadline_ms: 1,
            policy,
            started_by: "admin".into(),
            now_ms: 1,
        }
        .start(Vec::new(), None);
        assert_eq!(same_request(&req, done.clone()).unwrap(), done);
        let other = StartRollout {
            version: "3".into(),
            ..req
        };
        let e = same_request(&other, done).unwrap_err();
        assert_eq!(e.kind(), Kind::AlreadyExists);
        assert!(
            e.to_string().contains("already started rollout") && e.to_string().contains("k@2"),
            "{e}"
        );
    }
    #[test]
    fn names_are_checked_in_order_then_the_selector() {
        let none = HashMap::new();
        let e = |c: &str, b: &str, v: &str, sel: &HashMap<String, String>| {
            check_names(c, b, v, sel).unwrap_err().to_string()
        };
        assert!(e("Bad_Cluster", "Bad_Bundle", "", &none).contains("cluster name"));
        assert!(e("c", "Bad_Bundle", "", &none).contains("bundle name"));
        assert!(e("c", "b", "", &none).contains("version"));
        let bad = HashMap::from([("-x".to_string(), "v".to_string())]);
        assert!(e("c", "b", "1", &bad).starts_with("selector: "));
        let sel = HashMap::from([("zone".to_string(), "a".to_string())]);
        assert_eq!(check_names("c", "b", "1", &sel).unwrap().len(), 1);
    }
}

#[cfg(test)]
mod store_tests {
    use std::sync::Arc;

    use std::time::Duration;

    use lks_proto::SignedBundle;

    use super::*;
    use crate::store::sqlite::SqliteStore;
    use crate::store::{NewBundle, NewCluster, Store};

    fn asked() -> StartRollout {
        StartRollout {
            cluster: "tenant-a".into(),
            bundle: "kubelet".into(),
            version: "1".into(),
            policy: Policy {
                batch_size: Some(1),
                ..Default::default()
            },
            started_by: "admin".into(),
            ..Default::default()
        }
    }

    /// Refusals come in the order an operator's mistakes are named, all
    /// before the controller (which this test never runs) is asked.
    #[tokio::test]
    async fn preconditions_are_checked_in_order_before_the_controller_is_asked() {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
        let (controller, _inbox) = controller::channel();
        let refused = |r: StartRollout| {
            let (store, controller) = (store.clone(), controller.clone());
            async move { start(&*store, &controller, r).await.err().unwrap() }
        };

        let e = refused(asked()).await;
        assert_eq!(e.kind(), Some(Kind::NotFound));
        assert_eq!(
            e.to_string(),
            "bundle kubelet@1 is not published; publish it with `lksctl bundle publish DIR`"
        );
        let signed = SignedBundle {
            manifest: Manifest {
                name: "kubelet".into(),
                version: "1".into(),
                ..Default::default()
            },
            signature: None,
            chunks_signature: None,
        };
        store
            .put_bundle(NewBundle::new(signed, Vec::new(), 1))
            .await
            .unwrap();
        assert_eq!(
            refused(asked()).await.to_string(),
            "cluster tenant-a does not exist"
        );
        store
            .create_cluster(NewCluster {
                name: "tenant-a".into(),
                now_ms: 1,
                ca: None,
                api_server: None,
            })
            .await
            .unwrap();
        let late = Duration::from_secs(8 * 24 * 3600);
        let big = StartRollout {
            policy: Policy {
                batch_size: Some(lks_rollout::policy::MAX_BATCH_SIZE + 1),
                offline_deadline: Some(late),
                ..Default::default()
            },
            ..asked()
        };
        let e = refused(big).await;
        assert!(
            matches!(
                e,
                OpError::Start(StartError::Policy(PolicyError::BatchTooLarge { .. }))
            ),
            "{e}"
        );
        let late = StartRollout {
            policy: Policy {
                offline_deadline: Some(late),
                ..Default::default()
            },
            ..asked()
        };
        assert!(matches!(
            refused(late).await,
            OpError::Start(StartError::Policy(PolicyError::DeadlineTooLong))
        ));
        // No node matches: a canary of one is more than the rollout has.
        let canary = StartRollout {
            policy: Policy {
                canary: 1,
                ..Default::default()
            },
            ..asked()
        };
        assert_eq!(
            refused(canary).await.to_string(),
            "--canary 1 is more than the 0 node(s) the rollout matches"
        );
        let bad_id = StartRollout {
            request_id: "a b".into(),
            ..asked()
        };
        assert_eq!(refused(bad_id).await.kind(), Some(Kind::Invalid));
    }
}
