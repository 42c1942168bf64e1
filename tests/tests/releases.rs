//! Signed releases and trust roots on a real control server (issue
//! [trust]): what `PublishRelease`/`PublishRoot` check and store, what a
//! node is sent in its desired state (the highest release that admits its
//! bundles, every root rotation) and that a publish pushes at once, the
//! trust a node reports in `node list`, and, on etcd, a release published
//! on one replica reaching a node on another.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lks_e2e::server::{Server, TestNode, next_desired, node_json};
use lks_e2e::wait_until;
use lks_proto::Digest;
use lks_proto::pb::{self, AgentMessage};
use lks_proto::release::{Release, ReleasedBundle, SignedRelease, SignedRoot, TrustRoot};
use lks_proto::sign::SigningKey;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(15);

/// The manifest digest the server stored for `name@version`.
async fn manifest_digest(s: &Server, name: &str, version: &str) -> Digest {
    let b = s
        .admin_client()
        .await
        .get_bundle(pb::GetBundleRequest {
            name: name.into(),
            version: version.into(),
        })
        .await
        .expect("get bundle")
        .into_inner();
    b.info
        .expect("bundle info")
        .manifest_digest
        .parse()
        .expect("digest")
}

fn release(
    cluster: &str,
    version: u64,
    bundles: &[(&str, &str, Digest)],
    key: &SigningKey,
) -> pb::SignedRelease {
    let r = Release {
        channel: cluster.into(),
        version,
        expires_at_ms: 4_000_000_000_000,
        bundles: bundles
            .iter()
            .map(|(n, v, d)| {
                (
                    n.to_string(),
                    ReleasedBundle {
                        version: v.to_string(),
                        manifest_digest: *d,
                    },
                )
            })
            .collect::<BTreeMap<_, _>>(),
    };
    pb::SignedRelease::from(&SignedRelease::sign(r, &[key]))
}

fn root(version: u64, keys: &[&SigningKey]) -> pb::SignedRoot {
    let r = TrustRoot {
        version,
        keys: keys.iter().map(|k| k.public()).collect(),
        threshold: 1,
        expires_at_ms: 0,
    };
    pb::SignedRoot::from(&SignedRoot::sign(r, keys))
}

async fn publish(s: &Server, r: pb::SignedRelease) -> Result<pb::ReleaseInfo, tonic::Status> {
    s.admin_client()
        .await
        .publish_release(pb::PublishReleaseRequest { release: Some(r) })
        .await
        .map(tonic::Response::into_inner)
}

fn version_of(d: &pb::DesiredState) -> Option<u64> {
    d.release
        .as_ref()
        .and_then(|r| r.release.as_ref())
        .map(|r| r.version)
}

fn trust_report(state: &str, version: u64) -> AgentMessage {
    AgentMessage {
        msg: Some(pb::agent_message::Msg::Status(pb::StatusReport {
            generation: 0,
            bundles: Vec::new(),
            trust: Some(pb::TrustStatus {
                enabled: true,
                state: state.into(),
                message: format!("release {version} of tenant-a"),
                release_version: version,
                release_expires_at_ms: 1_900_000_000_000,
                root_version: 2,
            }),
            reboot: None,
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_are_checked_stored_and_sent_to_the_clusters_nodes() {
    let s = Server::start();
    s.create_cluster("tenant-a");
    let t = s.token("tenant-a", &[]);
    let w1 = TestNode::enroll(&s, &t, "w1", &[]).await;
    let v1 = s.write_bundle("v1", "demo", "1", &[("/etc/demo.conf", b"one", "0644")]);
    let v2 = s.write_bundle("v2", "demo", "2", &[("/etc/demo.conf", b"two", "0644")]);
    s.publish(&v1);
    s.publish(&v2);
    let (d1, d2) = (
        manifest_digest(&s, "demo", "1").await,
        manifest_digest(&s, "demo", "2").await,
    );
    let key = SigningKey::generate();

    let (tx, mut stream) = w1.connect(vec![]).await.expect("connect");
    let first = next_desired(&mut stream).await;
    assert_eq!(first.release, None, "the cluster has no release yet");
    assert!(first.roots.is_empty());

    refusals_are_one_line_each_and_store_nothing(&s, &key, d1, d2).await;
    release_1_is_sent_at_once_and_a_version_keeps_its_record(&s, &mut stream, &first, &key, d1, d2).await;
    a_node_is_sent_the_highest_release_that_admits_its_bundles(&s, &mut stream, &key, d1, d2).await;
    a_root_rotation_is_checked_and_pushed_at_once(&s, &mut stream, &key).await;
    the_trust_a_node_reports_is_listed_and_counted(&s, &tx).await;

    // A state the protocol does not name ends the stream, invalid_argument.
    tx.send(trust_report("fine", 2)).await.unwrap();
    let end = tokio::time::timeout(WAIT, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("stream ends");
    assert_eq!(end.unwrap_err().code(), Code::InvalidArgument);

    // Both publishes are in the audit trail.
    let audit = s.lksctl_ok(&["audit", "--since", "1h"]);
    assert!(audit.contains("PublishRelease"), "{audit}");
    assert!(audit.contains("release 2 of tenant-a"), "{audit}");
    assert!(audit.contains("PublishRoot"), "{audit}");
}

/// Refusals, one line each, nothing stored: an unknown cluster, a bundle
/// not published, another manifest digest, version 0.
async fn refusals_are_one_line_each_and_store_nothing(s: &Server, key: &SigningKey, d1: Digest, d2: Digest) {
    let e = publish(s, release("nope", 1, &[], key)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = publish(s, release("tenant-a", 1, &[("demo", "3", d1)], key))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(
        e.message(),
        "release 1 of tenant-a: bundle demo@3 is not published; publish it before releasing it"
    );
    let e = publish(s, release("tenant-a", 1, &[("demo", "1", d2)], key))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message()
            .starts_with("release 1 of tenant-a: bundle demo@1 is published with manifest digest"),
        "{}",
        e.message()
    );
    let mut no_version = release("tenant-a", 1, &[], key);
    no_version.release.as_mut().unwrap().version = 0;
    assert_eq!(
        publish(s, no_version).await.unwrap_err().code(),
        Code::InvalidArgument
    );
}

/// Release 1 names demo@1; the node (on no bundle) is sent it at once.
/// The same record again changes nothing; another record under version
/// 1 is refused.
async fn release_1_is_sent_at_once_and_a_version_keeps_its_record(
    s: &Server,
    stream: &mut tonic::Streaming<pb::ServerMessage>,
    first: &pb::DesiredState,
    key: &SigningKey,
    d1: Digest,
    d2: Digest,
) {
    let r1 = publish(s, release("tenant-a", 1, &[("demo", "1", d1)], key))
        .await
        .expect("publish release 1");
    assert!(r1.digest.starts_with("sha256:"), "{r1:?}");
    assert!(r1.published_at_ms > 0);
    let d = next_desired(stream).await;
    assert_eq!(version_of(&d), Some(1));
    assert_eq!(
        d.generation, first.generation,
        "no new generation, only the release"
    );
    assert_eq!(
        d.release.as_ref(),
        r1.release.as_ref(),
        "sent as stored, signatures and all"
    );

    // The same record again changes nothing; another record under version
    // 1, or an older version, is refused.
    publish(s, release("tenant-a", 1, &[("demo", "1", d1)], key))
        .await
        .expect("identical record again");
    let e = publish(s, release("tenant-a", 1, &[("demo", "2", d2)], key))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
}

/// Release 2 names demo@2: the node, holding nothing, gets the highest;
/// on demo@1 it is sent release 1. Below the highest a publish is
/// refused unless it is a stored record again; releases list newest first.
async fn a_node_is_sent_the_highest_release_that_admits_its_bundles(
    s: &Server,
    stream: &mut tonic::Streaming<pb::ServerMessage>,
    key: &SigningKey,
    d1: Digest,
    d2: Digest,
) {
    publish(s, release("tenant-a", 2, &[("demo", "2", d2)], key))
        .await
        .expect("publish release 2");
    assert_eq!(version_of(&next_desired(stream).await), Some(2));

    // On demo@1 the node is sent release 1, the highest that admits it.
    let id = s.lksctl_json(&["rollout", "start", "--cluster", "tenant-a", "--bundle", "demo@1"])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let d = next_desired(stream).await;
    assert_eq!(lks_e2e::server::bundle_ids(&d), ["demo@1"]);
    assert_eq!(version_of(&d), Some(1), "the highest release naming demo@1");
    assert!(!id.is_empty());

    // Below the highest: refused, unless it is a stored record again.
    let e = publish(s, release("tenant-a", 1, &[], key)).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "another record under version 1");
    publish(s, release("tenant-a", 1, &[("demo", "1", d1)], key))
        .await
        .expect("stored release 1 again");
    let listed = s
        .admin_client()
        .await
        .list_releases(pb::ListReleasesRequest {
            cluster: "tenant-a".into(),
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        listed
            .releases
            .iter()
            .map(|r| r.release.as_ref().unwrap().release.as_ref().unwrap().version)
            .collect::<Vec<_>>(),
        [2, 1],
        "newest first"
    );
}

/// A root rotation: version 2 first, pushed at once; version 4 skips 3.
async fn a_root_rotation_is_checked_and_pushed_at_once(
    s: &Server,
    stream: &mut tonic::Streaming<pb::ServerMessage>,
    key: &SigningKey,
) {
    let next_key = SigningKey::generate();
    let mut admin = s.admin_client().await;
    let e = admin
        .publish_root(pb::PublishRootRequest {
            cluster: "tenant-a".into(),
            root: Some(root(3, &[key])),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let r2 = admin
        .publish_root(pb::PublishRootRequest {
            cluster: "tenant-a".into(),
            root: Some(root(2, &[key, &next_key])),
        })
        .await
        .expect("publish root 2")
        .into_inner();
    assert_eq!(r2.cluster, "tenant-a");
    let d = next_desired(stream).await;
    assert_eq!(d.roots, [r2.root.clone().unwrap()]);
    assert_eq!(version_of(&d), Some(1), "still the release that admits demo@1");
    let roots = admin
        .list_roots(pb::ListRootsRequest {
            cluster: "tenant-a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(roots.roots.len(), 1);
}

/// The trust the node reports: in node list (table and JSON) and metrics.
async fn the_trust_a_node_reports_is_listed_and_counted(
    s: &Server,
    tx: &tokio::sync::mpsc::Sender<AgentMessage>,
) {
    wait_until(WAIT, "w1 listed with no trust", || {
        node_json(&s.lksctl_json(&["node", "list"]), "w1")["trust"].is_null()
    });
    tx.send(trust_report("stale-release", 2)).await.unwrap();
    wait_until(WAIT, "w1's stale release listed", || {
        node_json(&s.lksctl_json(&["node", "list"]), "w1")["trust"]["state"] == "stale-release"
    });
    let n = s.lksctl_json(&["node", "get", "w1"]);
    assert_eq!(n["trust"]["release_version"], 2);
    assert_eq!(n["trust"]["root_version"], 2);
    assert_eq!(n["trust"]["message"], "release 2 of tenant-a");
    let table = s.lksctl_ok(&["node", "list"]);
    assert!(table.lines().next().unwrap().contains("RELEASE"), "{table}");
    let row = table.lines().find(|l| l.starts_with("w1")).unwrap();
    // RELEASE, then REBOOT (`-`: an agent that reports no reboot state).
    assert!(row.trim_end().ends_with("2 stale-release  -"), "{table}");
    assert!(
        s.lksctl_ok(&["node", "get", "w1"])
            .contains("Release:      2 stale-release")
    );
    assert_eq!(s.metric("lks_nodes_trust_state{state=\"stale-release\"}"), 1);
    tx.send(trust_report("ok", 2)).await.unwrap();
    wait_until(WAIT, "w1 back to ok", || {
        node_json(&s.lksctl_json(&["node", "list"]), "w1")["trust"]["state"] == "ok"
    });
    assert_eq!(s.metric("lks_nodes_trust_state{state=\"stale-release\"}"), 0);
    assert_eq!(s.metric("lks_nodes_trust_state{state=\"ok\"}"), 1);
}

/// On etcd, a release published through one replica reaches a node whose
/// stream is on another within that replica's cache TTL (5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_published_on_one_replica_reaches_nodes_on_another() {
    let etcd = lks_e2e::etcd::Etcd::start();
    let r1 = etcd.replica("/lks-rel/", &[]);
    let r2 = etcd.replica("/lks-rel/", &[]);
    r1.create_cluster("tenant-a");
    let t = r1.token("tenant-a", &[]);
    let mut w1 = TestNode::enroll(&r1, &t, "w1", &[]).await;
    w1.url = r2.url();
    // Its Hello reports its trust: no release yet.
    w1.trust = Some(pb::TrustStatus {
        enabled: true,
        state: "no-release".into(),
        message: String::new(),
        release_version: 0,
        release_expires_at_ms: 0,
        root_version: 1,
    });
    let (_tx, mut stream) = w1.connect(vec![]).await.expect("connect to r2");
    assert_eq!(next_desired(&mut stream).await.release, None);
    wait_until(WAIT, "w1's trust listed by the other replica", || {
        node_json(&r1.lksctl_json(&["node", "list"]), "w1")["trust"]["state"] == "no-release"
    });
    let table = r1.lksctl_ok(&["node", "list"]);
    let row = table.lines().find(|l| l.starts_with("w1")).unwrap();
    assert!(row.trim_end().ends_with("- no-release  -"), "{table}");
    assert_eq!(r2.metric("lks_nodes_trust_state{state=\"no-release\"}"), 1);
    assert_eq!(
        r1.metric("lks_nodes_trust_state{state=\"no-release\"}"),
        0,
        "counted where the stream is"
    );

    let key = SigningKey::generate();
    let started = std::time::Instant::now();
    publish(&r1, release("tenant-a", 7, &[], &key))
        .await
        .expect("publish on r1");
    let d = next_desired(&mut stream).await;
    assert_eq!(version_of(&d), Some(7));
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "took {:?}",
        started.elapsed()
    );
    // The other replica refuses what the first one stored.
    let e = publish(&r2, release("tenant-a", 6, &[], &key)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
}
