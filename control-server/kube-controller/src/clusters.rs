//! `LksCluster` → the server's cluster (issue [kube-front], item 2): the
//! spec is the user's and wins; the controller creates the cluster if the
//! server has none of that name (adopting one that exists), then sends
//! what differs — maintenance windows, API server, CA (only to a cluster
//! without one: a CA is never replaced), peer sharing, kubeconfig, drain
//! default, reboot policy and labels ([`crate::settings`]) — and writes
//! the status (nodes, connected, CA hash, what the tenant API answered,
//! `Ready`).
//!
//! A spec the server refuses, or a Secret that is missing, becomes
//! `Ready=False` with one line saying why, and is tried again every
//! interval. Deleting an `LksCluster`
//! is refused (its finalizer stays, `Ready=False`, reason `HasNodes`)
//! while nodes are enrolled in the cluster; without nodes the finalizer is
//! removed and the server keeps the cluster's record and CA (the admin API
//! has no cluster deletion), so a new `LksCluster` of that name adopts it.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use lks_proto::pb;
use sha2::{Digest as _, Sha256};

use crate::admin::{CallError, connection_lost};
use crate::conditions::{self, condition};
use crate::context::{Ctx, Error, Read};
use crate::crd::{LksCluster, LksClusterSpec, LksClusterStatus, SecretKeyRef, SecretName};
use crate::object::write_status;
use lks_proto::report::one_line;

/// The finalizer every `LksCluster` carries while the controller runs.
pub const FINALIZER: &str = "lksadmin.io/cluster";

/// What the Secrets a spec names hold.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Secrets {
    /// `caSecret`'s `tls.crt` and `tls.key`.
    pub ca: Option<(String, String)>,
    /// `kubeconfig`'s key.
    pub kubeconfig: Option<String>,
}

/// 16 hex digits of the SHA-256 of `text`: enough to see a change, never
/// the secret itself.
pub fn digest16(text: &[u8]) -> String {
    Sha256::digest(text)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What to send to the server for `spec`: a `CreateCluster` when it has no
/// cluster of that name, and a `SetCluster` for what differs (`None`:
/// nothing does). `applied` is the digest of the kubeconfig last sent.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub create: Option<pb::CreateClusterRequest>,
    pub set: Option<pb::SetClusterRequest>,
}

/// A spec that cannot be carried out as written (one line).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("spec.peerSharing.uploadRate: {0}")]
    Rate(#[from] lks_proto::rate::RateError),
    #[error(transparent)]
    Settings(#[from] crate::policy::SpecError),
    #[error(
        "the server's CA of cluster {0} is not the one in spec.caSecret: a cluster's CA is never replaced \
         (remove spec.caSecret, or name the Secret of the CA the cluster has)"
    )]
    CaMismatch(String),
}

/// PEM text without its line breaks, so two encodings of one certificate
/// compare equal.
fn pem_body(pem: &str) -> String {
    pem.chars().filter(|c| !c.is_whitespace()).collect()
}

pub fn plan(
    name: &str,
    spec: &LksClusterSpec,
    secrets: &Secrets,
    server: Option<&pb::Cluster>,
    server_ca_pem: Option<&str>,
    applied_kubeconfig: &str,
) -> Result<Plan, SpecError> {
    let mut plan = Plan::default();
    let fresh;
    let server = match server {
        Some(s) => s,
        None => {
            let (ca_cert_pem, ca_key_pem) = secrets.ca.clone().unwrap_or_default();
            plan.create = Some(pb::CreateClusterRequest {
                name: name.to_string(),
                ca_cert_pem,
                ca_key_pem,
                api_server: spec.api_server.clone().unwrap_or_default(),
            });
            // What the created cluster will be: the rest is set after.
            fresh = pb::Cluster {
                name: name.to_string(),
                has_ca: true,
                api_server: spec.api_server.clone().unwrap_or_default(),
                ..Default::default()
            };
            &fresh
        }
    };
    let mut set = pb::SetClusterRequest {
        name: name.to_string(),
        ..Default::default()
    };
    let mut any = false;
    if spec.maintenance_windows != server.maintenance_windows {
        set.maintenance_windows = spec.maintenance_windows.clone();
        set.clear_maintenance_windows = spec.maintenance_windows.is_empty();
        any = true;
    }
    match &spec.api_server {
        Some(a) if *a != server.api_server => {
            set.api_server = Some(a.clone());
            any = true;
        }
        None if !server.api_server.is_empty() => {
            set.clear_api_server = true;
            any = true;
        }
        _ => {}
    }
    if !server.has_ca {
        match &secrets.ca {
            Some((cert, key)) => {
                set.ca_cert_pem = cert.clone();
                set.ca_key_pem = key.clone();
            }
            None => set.generate_ca = true,
        }
        any = true;
    } else if let (Some((cert, _)), Some(have)) = (&secrets.ca, server_ca_pem)
        && pem_body(cert) != pem_body(have)
    {
        return Err(SpecError::CaMismatch(name.to_string()));
    }
    let peer = server.peer_sharing.as_ref();
    match (&spec.peer_sharing, peer) {
        (None, Some(_)) => {
            set.peer_sharing = Some(false);
            any = true;
        }
        (None, None) => {}
        (Some(want), have) => {
            if have.is_none() {
                set.peer_sharing = Some(true);
                any = true;
            }
            if let Some(p) = want.port
                && have.is_none_or(|h| h.port != u32::from(p))
            {
                set.peer_port = Some(u32::from(p));
                any = true;
            }
            let rate = match &want.upload_rate {
                Some(r) => lks_proto::rate::parse_rate(r)?,
                None => 0,
            };
            if have.map_or(rate != 0, |h| h.upload_rate != rate) {
                set.peer_upload_rate = Some(rate);
                any = true;
            }
            if let Some(m) = want.max_uploads
                && have.is_none_or(|h| h.max_uploads != m)
            {
                set.peer_max_uploads = Some(m);
                any = true;
            }
        }
    }
    match &secrets.kubeconfig {
        Some(k) if !server.has_kubeconfig || digest16(k.as_bytes()) != applied_kubeconfig => {
            set.kubeconfig = Some(k.clone());
            any = true;
        }
        None if server.has_kubeconfig => {
            set.clear_kubeconfig = true;
            any = true;
        }
        _ => {}
    }
    if spec.drain != server.drain {
        set.drain = Some(spec.drain);
        any = true;
    }
    any |= crate::settings::reboots_and_labels(spec, server, &mut set)?;
    plan.set = any.then_some(set);
    Ok(plan)
}

/// Why a Secret a spec names could not be read as text: one line that
/// names what is missing.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("Secret {ns}/{name}: {}", one_line(.source))]
    Read {
        ns: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("Secret {ns}/{name} does not exist")]
    Missing { ns: String, name: String },
    #[error("Secret {ns}/{name} has no key {key:?}")]
    NoKey { ns: String, name: String, key: String },
    #[error("Secret {ns}/{name} key {key:?} is not UTF-8 text")]
    NotText {
        ns: String,
        name: String,
        key: String,
        #[source]
        source: std::string::FromUtf8Error,
    },
}

/// Reads a key of a Secret as text.
async fn secret_text(kube: &kube::Client, ns: &str, name: &str, key: &str) -> Result<String, SecretError> {
    let api: Api<Secret> = Api::namespaced(kube.clone(), ns);
    let (ns, name) = (ns.to_string(), name.to_string());
    let s = match api.get_opt(&name).await {
        Ok(Some(s)) => s,
        Ok(None) => return Err(SecretError::Missing { ns, name }),
        Err(source) => return Err(SecretError::Read { ns, name, source }),
    };
    let bytes = s
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .or_else(|| {
            s.string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|t| t.clone().into_bytes())
        })
        .ok_or_else(|| SecretError::NoKey {
            ns: ns.clone(),
            name: name.clone(),
            key: key.to_string(),
        })?;
    String::from_utf8(bytes).map_err(|source| SecretError::NotText {
        ns,
        name,
        key: key.to_string(),
        source,
    })
}

async fn read_secrets(kube: &kube::Client, spec: &LksClusterSpec) -> Result<Secrets, SecretError> {
    let mut out = Secrets::default();
    if let Some(SecretName { name, namespace }) = &spec.ca_secret {
        out.ca = Some((
            secret_text(kube, namespace, name, "tls.crt").await?,
            secret_text(kube, namespace, name, "tls.key").await?,
        ));
    }
    if let Some(SecretKeyRef { name, namespace, key }) = &spec.kubeconfig {
        out.kubeconfig = Some(secret_text(kube, namespace, name, key).await?);
    }
    Ok(out)
}

/// Nodes and connected nodes per cluster.
pub fn counts<'a>(nodes: impl IntoIterator<Item = &'a pb::Node>) -> BTreeMap<String, (u32, u32)> {
    let mut m: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    for n in nodes {
        let e = m.entry(n.cluster.clone()).or_default();
        e.0 += 1;
        e.1 += u32::from(n.connected);
    }
    m
}

/// Reconciles one `LksCluster` (kube-rs' `Controller` calls it for each
/// object on its own, so one that fails holds up no other): its finalizer
/// ([`kube::runtime::finalizer`]), then the spec carried out, or the
/// deletion. Looked at again every interval, so drift made with lksctl is
/// put back and the status follows the server's nodes.
pub async fn reconcile(obj: Arc<LksCluster>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let api: Api<LksCluster> = Api::all(ctx.kube.clone());
    let r = finalizer(&api, FINALIZER, obj.clone(), |event| async {
        match event {
            Event::Apply(o) => apply(&ctx, &api, &o).await,
            Event::Cleanup(o) => cleanup(&ctx, &api, &o).await,
        }
    })
    .await
    .map_err(Error::from);
    ctx.done(obj.as_ref(), r)
}

/// The nodes and connected nodes of cluster `name`, as the last poll read
/// them.
fn counts_of(nodes: &Read<pb::Node>, name: &str) -> (u32, u32) {
    counts(nodes.items.values().filter(|n| n.cluster == name))
        .get(name)
        .copied()
        .unwrap_or_default()
}

/// A deleted `LksCluster`: refused (`Ready=False`, reason `HasNodes`, the
/// finalizer kept) while nodes are enrolled in the cluster; without nodes
/// the finalizer goes, and the server keeps the cluster's record and CA.
async fn cleanup(ctx: &Ctx, api: &Api<LksCluster>, obj: &LksCluster) -> Result<Action, Error> {
    let name = obj.name_any();
    let generation = obj.metadata.generation.unwrap_or(0);
    let (nodes, connected) = counts_of(&*ctx.nodes.get(ctx.interval).await?, &name);
    if nodes == 0 {
        tracing::info!(cluster = %name, "LksCluster deleted; the server keeps its record and CA");
        return Ok(Action::await_change());
    }
    let old = obj.status.clone().unwrap_or_default();
    let mut status = LksClusterStatus {
        nodes,
        connected,
        observed_generation: generation,
        ..old.clone()
    };
    let msg = format!(
        "cluster {name} has {nodes} enrolled node(s): delete them first (lksctl node delete NAME, \
         after draining them from the tenant cluster); the LksCluster stays until then"
    );
    conditions::set(
        &mut status.conditions,
        condition("Ready", false, "HasNodes", &msg, generation),
        &conditions::now(),
    );
    write_status(api, &name, &old, &status).await?;
    Err(Error::Waiting(msg))
}

async fn apply(ctx: &Ctx, api: &Api<LksCluster>, obj: &LksCluster) -> Result<Action, Error> {
    let name = obj.name_any();
    let generation = obj.metadata.generation.unwrap_or(0);
    let old = obj.status.clone().unwrap_or_default();
    let servers = ctx
        .admin
        .call(|mut a| async move { a.list_clusters(pb::ListClustersRequest::default()).await })
        .await
        .map_err(|e| Error::admin("list clusters", e))?
        .clusters;
    let server = servers.iter().find(|c| c.name == name);
    // The counts are the status's only use of the nodes: kept as they
    // were until the server's nodes are read.
    let (nodes, connected) = match ctx.nodes.get(ctx.interval).await {
        Ok(n) => counts_of(&n, &name),
        Err(_) => (old.nodes, old.connected),
    };
    let mut status = LksClusterStatus {
        nodes,
        connected,
        ca_cert_hash: server.map(|s| s.ca_cert_hash.clone()).unwrap_or_default(),
        observed_generation: generation,
        ..old.clone()
    };
    let now = conditions::now();
    let refuse = |status: &mut LksClusterStatus, reason: &str, msg: String| {
        tracing::warn!(cluster = %name, reason, message = %msg, "LksCluster not carried out");
        conditions::set(
            &mut status.conditions,
            condition("Ready", false, reason, &msg, generation),
            &now,
        );
    };
    let again = Action::requeue(ctx.interval);
    let secrets = match read_secrets(&ctx.kube, &obj.spec).await {
        Ok(s) => s,
        Err(e) => {
            refuse(&mut status, "SecretMissing", e.to_string());
            write_status(api, &name, &old, &status).await?;
            return Ok(again);
        }
    };
    let server_ca = server_ca(ctx, &name, server, &secrets).await?;
    let plan = match plan(
        &name,
        &obj.spec,
        &secrets,
        server,
        server_ca.as_deref(),
        &old.kubeconfig_digest,
    ) {
        Ok(p) => p,
        Err(e) => {
            refuse(&mut status, "Invalid", e.to_string());
            write_status(api, &name, &old, &status).await?;
            return Ok(again);
        }
    };
    if let Err(Refused(message)) = apply_plan(ctx, &name, plan, &mut status).await? {
        refuse(&mut status, "Refused", message);
        write_status(api, &name, &old, &status).await?;
        return Ok(again);
    }
    conditions::set(
        &mut status.conditions,
        condition(
            "Ready",
            true,
            "Reconciled",
            "the server's cluster is as the spec says",
            generation,
        ),
        &now,
    );
    write_status(api, &name, &old, &status).await?;
    Ok(again)
}

/// The CA the server holds for the cluster, when both it and the spec
/// have one (to compare with `caSecret`).
async fn server_ca(
    ctx: &Ctx,
    name: &str,
    server: Option<&pb::Cluster>,
    secrets: &Secrets,
) -> Result<Option<String>, Error> {
    Ok(match (server, &secrets.ca) {
        (Some(s), Some(_)) if s.has_ca => {
            let req = pb::GetClusterCaRequest {
                name: name.to_string(),
            };
            Some(
                ctx.admin
                    .call(|mut a| async move { a.get_cluster_ca(req).await })
                    .await
                    .map_err(|e| Error::admin(format!("read the CA of cluster {name}"), e))?
                    .ca_cert_pem,
            )
        }
        _ => None,
    })
}

/// A call of the plan the server refused: its line.
struct Refused(String);

/// The server's answer to a call of the plan: a refusal is the spec's
/// (it goes into the status); no answer at all is an error (tried again).
fn refused_or_error(name: &str, e: CallError) -> Result<Refused, Error> {
    match e {
        CallError::Status(s) if !connection_lost(s.code()) => Ok(Refused(s.message().to_string())),
        e => Err(Error::admin(format!("cluster {name}"), e)),
    }
}

/// Carries the plan out: creates the cluster, then sets what differs,
/// recording in `status` what the server answered.
async fn apply_plan(
    ctx: &Ctx,
    name: &str,
    plan: Plan,
    status: &mut LksClusterStatus,
) -> Result<Result<(), Refused>, Error> {
    if let Some(c) = plan.create {
        match ctx
            .admin
            .call(|mut a| async move { a.create_cluster(c).await })
            .await
        {
            Ok(r) => {
                status.ca_cert_hash = r.ca_cert_hash;
                tracing::info!(cluster = %name, "cluster created on the server");
            }
            Err(e) => return refused_or_error(name, e).map(Err),
        }
    }
    if let Some(set) = plan.set {
        let kubeconfig = set.kubeconfig.as_deref().map(|k| digest16(k.as_bytes()));
        let clear = set.clear_kubeconfig;
        match ctx
            .admin
            .call(|mut a| async move { a.set_cluster(set).await })
            .await
        {
            Ok(r) => {
                status.ca_cert_hash = r.ca_cert_hash;
                if let Some(d) = kubeconfig {
                    status.kubeconfig_digest = d;
                    status.kube_probe = r.kube_probe;
                } else if clear {
                    status.kubeconfig_digest.clear();
                    status.kube_probe.clear();
                }
                tracing::info!(cluster = %name, "cluster settings converged to the LksCluster spec");
            }
            Err(e) => return refused_or_error(name, e).map(Err),
        }
    }
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::PeerSharing;

    fn server() -> pb::Cluster {
        pb::Cluster {
            name: "a".into(),
            has_ca: true,
            ca_cert_hash: "sha256:ab".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_spec_the_server_already_has_changes_nothing() {
        let spec = LksClusterSpec::default();
        let p = plan("a", &spec, &Secrets::default(), Some(&server()), None, "").unwrap();
        assert_eq!(
            p,
            Plan::default(),
            "applying the same manifest twice changes nothing"
        );

        let spec = LksClusterSpec {
            api_server: Some("https://api:6443".into()),
            drain: true,
            maintenance_windows: vec!["Sat 02:00-06:00 UTC".into()],
            peer_sharing: Some(PeerSharing {
                port: Some(7444),
                upload_rate: Some("200Mbit".into()),
                max_uploads: None,
            }),
            ..Default::default()
        };
        let mut s = server();
        s.api_server = "https://api:6443".into();
        s.drain = true;
        s.maintenance_windows = vec!["Sat 02:00-06:00 UTC".into()];
        s.peer_sharing = Some(pb::PeerSharing {
            port: 7444,
            upload_rate: 25_000_000,
            max_uploads: 4,
        });
        let p = plan("a", &spec, &Secrets::default(), Some(&s), None, "").unwrap();
        assert_eq!(p, Plan::default());
    }

    #[test]
    fn what_differs_is_sent_and_the_spec_wins() {
        let spec = LksClusterSpec {
            drain: true,
            peer_sharing: Some(PeerSharing::default()),
            ..Default::default()
        };
        let mut s = server();
        s.api_server = "https://old:6443".into();
        s.maintenance_windows = vec!["Sat 02:00-06:00 UTC".into()];
        let set = plan("a", &spec, &Secrets::default(), Some(&s), None, "")
            .unwrap()
            .set
            .unwrap();
        assert!(set.clear_api_server, "absent from the spec: removed");
        assert!(set.clear_maintenance_windows && set.maintenance_windows.is_empty());
        assert_eq!(set.drain, Some(true));
        assert_eq!(set.peer_sharing, Some(true));
        assert_eq!(set.peer_port, None, "absent: the server's default");
        assert_eq!(set.kubeconfig, None);

        // A kubeconfig is sent when the server has none or the Secret changed.
        let secrets = Secrets {
            kubeconfig: Some("apiVersion: v1\n".into()),
            ..Default::default()
        };
        let none = LksClusterSpec::default();
        let set = plan("a", &none, &secrets, Some(&server()), None, "")
            .unwrap()
            .set
            .unwrap();
        assert_eq!(set.kubeconfig.as_deref(), Some("apiVersion: v1\n"));
        let mut with = server();
        with.has_kubeconfig = true;
        let digest = digest16(b"apiVersion: v1\n");
        assert_eq!(
            plan("a", &none, &secrets, Some(&with), None, &digest).unwrap(),
            Plan::default()
        );
        assert!(
            plan("a", &none, &secrets, Some(&with), None, "0000")
                .unwrap()
                .set
                .is_some()
        );
        let set = plan("a", &none, &Secrets::default(), Some(&with), None, &digest)
            .unwrap()
            .set
            .unwrap();
        assert!(set.clear_kubeconfig);
    }

    #[test]
    fn a_new_cluster_is_created_with_its_ca_and_a_ca_is_never_replaced() {
        let spec = LksClusterSpec {
            api_server: Some("https://api:6443".into()),
            ..Default::default()
        };
        let secrets = Secrets {
            ca: Some((
                "-----BEGIN CERTIFICATE-----\nAAAA\nBBBB\n-----END CERTIFICATE-----\n".into(),
                "KEY".into(),
            )),
            ..Default::default()
        };
        let p = plan("a", &spec, &secrets, None, None, "").unwrap();
        let c = p.create.unwrap();
        assert_eq!((c.name.as_str(), c.ca_key_pem.as_str()), ("a", "KEY"));
        assert_eq!(c.api_server, "https://api:6443");
        assert_eq!(p.set, None, "nothing else to set");

        let same = "-----BEGIN CERTIFICATE-----\r\nAAAABBBB\r\n-----END CERTIFICATE-----";
        assert_eq!(
            plan(
                "a",
                &LksClusterSpec::default(),
                &secrets,
                Some(&server()),
                Some(same),
                ""
            )
            .unwrap(),
            Plan::default()
        );
        let e = plan(
            "a",
            &LksClusterSpec::default(),
            &secrets,
            Some(&server()),
            Some("OTHER"),
            "",
        )
        .unwrap_err();
        assert!(e.to_string().contains("never replaced"), "{e}");

        let mut no_ca = server();
        no_ca.has_ca = false;
        let set = plan(
            "a",
            &LksClusterSpec::default(),
            &Secrets::default(),
            Some(&no_ca),
            None,
            "",
        )
        .unwrap()
        .set
        .unwrap();
        assert!(set.generate_ca);

        let bad = LksClusterSpec {
            peer_sharing: Some(PeerSharing {
                upload_rate: Some("50Mb".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = plan("a", &bad, &Secrets::default(), Some(&server()), None, "").unwrap_err();
        assert!(
            e.to_string().starts_with("spec.peerSharing.uploadRate: \"50Mb\""),
            "{e}"
        );
    }

    #[test]
    fn nodes_are_counted_per_cluster() {
        let n = |c: &str, on: bool| pb::Node {
            cluster: c.into(),
            connected: on,
            ..Default::default()
        };
        let c = counts(&[n("a", true), n("a", false), n("b", true)]);
        assert_eq!(c["a"], (2, 1));
        assert_eq!(c["b"], (1, 1));
    }
}
