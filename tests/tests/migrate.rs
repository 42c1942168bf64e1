//! `lks-control-server migrate --from-sqlite` (DESIGN §6, §8): a single
//! SQLite server with real enrolled agents holding a bundle is stopped and
//! moved onto a throwaway etcd; a replica on the old address takes over.
//! The agents reconnect with the certificates they have — no re-join — and
//! keep their state; the CA pin, the operator's admin.conf and unused
//! bootstrap tokens still work; a new rollout reaches the agents.
//! Refusals write nothing: a second migrate into the same prefix, and a
//! migrate of a running server's data dir.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use lks_e2e::agent::{
    Agent, BundleFile, CONVERGE, join_info, node_bundle, node_connected, node_events, write_bundle,
};
use lks_e2e::etcd::Etcd;
use lks_e2e::server::Server;
use lks_e2e::{bin, ok_stdout, one_line_error, run, wait_until};
use lks_proto::pb;

const PREFIX: &str = "/lks-migrated/";

fn migrate(from: &Path, etcd: &Etcd, prefix: &str) -> Output {
    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.arg("migrate")
        .arg("--from-sqlite")
        .arg(from)
        .args(["--store", "etcd", "--etcd-endpoints", &etcd.url()])
        .args(["--etcd-prefix", prefix]);
    run(cmd)
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.display().to_string(), std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn app(parent: &Path, version: &str) -> std::path::PathBuf {
    let content = format!("v={version}\n");
    write_bundle(
        parent,
        "app",
        version,
        &[BundleFile {
            path: "/etc/app.conf",
            content: content.as_bytes(),
            mode: "0644",
        }],
        "",
    )
}

/// Publishes release 1 of c1 naming app@1 (signed by a fresh key: the
/// server cannot check signatures) and returns the server's listing.
fn release_app(server: &Server) -> Vec<pb::ReleaseInfo> {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut admin = server.admin_client().await;
        let digest = admin
            .get_bundle(pb::GetBundleRequest {
                name: "app".into(),
                version: "1".into(),
            })
            .await
            .expect("get app@1")
            .into_inner()
            .info
            .expect("bundle info")
            .manifest_digest;
        let release = lks_proto::release::Release {
            channel: "c1".into(),
            version: 1,
            expires_at_ms: 4_000_000_000_000,
            bundles: [(
                "app".to_string(),
                lks_proto::release::ReleasedBundle {
                    version: "1".into(),
                    manifest_digest: digest.parse().expect("digest"),
                },
            )]
            .into(),
        };
        let key = lks_proto::sign::SigningKey::generate();
        let signed = lks_proto::release::SignedRelease::sign(release, &[&key]);
        admin
            .publish_release(pb::PublishReleaseRequest {
                release: Some(pb::SignedRelease::from(&signed)),
            })
            .await
            .expect("publish release");
        releases_of(server).await
    })
}

async fn releases_of(server: &Server) -> Vec<pb::ReleaseInfo> {
    server
        .admin_client()
        .await
        .list_releases(pb::ListReleasesRequest {
            cluster: "c1".into(),
            limit: 0,
        })
        .await
        .expect("list releases")
        .into_inner()
        .releases
}

fn roll_out(server: &Server, bundle: &str) -> String {
    let id = server
        .lksctl_ok(&["rollout", "start", "--cluster", "c1", "--bundle", bundle])
        .trim()
        .to_string();
    wait_until(CONVERGE, "rollout completed", || {
        server.lksctl_json(&["rollout", "status", &id])["state"] == "completed"
    });
    id
}

#[test]
fn a_single_server_moves_onto_etcd_and_its_agents_follow_without_rejoining() {
    let etcd = Etcd::start();
    let (mut old, agents, cluster_ca, first, released) = a_sqlite_server_whose_two_agents_hold_app_1();
    // A token made before the move, used after it.
    let spare = join_info(&old, "c1", &["--uses", "1"]);
    let pin = spare.ca_cert_hash.clone();

    a_running_servers_data_dir_is_refused_and_nothing_written(&old, &etcd);

    let identities: Vec<Vec<u8>> = agents
        .iter()
        .map(|a| std::fs::read(a.state_dir.join("pki/node.crt")).unwrap())
        .collect();
    // The audit trail of everything done so far, without the store's ids.
    let trail = without_ids(old.lksctl_json(&["audit", "--limit", "10000"]));
    assert!(trail.len() >= 4, "{trail:?}");
    assert_eq!(old.stop(), Some(0));
    migrated_with_every_count_in_its_summary_and_the_sqlite_dir_only_read(&old, &etcd, trail.len(), &pin);
    a_second_migrate_into_the_same_prefix_writes_nothing(&old, &etcd);

    // A replica on the address the agents have stored.
    let replica = Server::start_at(
        old.addr,
        &[
            "--store",
            "etcd",
            "--etcd-endpoints",
            &etcd.url(),
            "--etcd-prefix",
            PREFIX,
            "--lease-ttl",
            "3s",
        ],
    );
    the_replica_has_the_ca_audit_releases_pin_and_state(
        &replica,
        &old,
        &Moved {
            cluster_ca: &cluster_ca,
            trail: &trail,
            released: &released,
            pin: &pin,
            first: &first,
        },
        &agents,
    );
    the_agents_reconnect_with_the_certificates_they_had(&replica, &agents, &identities);

    // A new version reaches the agents through the replica.
    assert_eq!(replica.publish(&app(replica.work_dir(), "2")), "app@2");
    roll_out(&replica, "app@2");
    for a in &agents {
        a.wait_bundle("app", "2", "applied");
        assert_eq!(a.read("/etc/app.conf").unwrap().0, b"v=2\n");
    }
    // The operator's old admin.conf works against the replica too.
    assert!(old.lksctl_ok(&["cluster", "list"]).contains("c1"));

    // The token made before the move enrols a new node, which gets the
    // cluster's target at once.
    let mut late = Agent::new("n3");
    ok_stdout(
        &late.join_raw(&spare.server, &spare.token, &spare.ca_cert_hash, &[]),
        "join with a migrated token",
    );
    late.start();
    late.wait_bundle("app", "2", "applied");
}

/// A SQLite server with cluster c1 (API server set), agents n1 and n2
/// holding app@1 through a rollout, and a signed release of app. Returns
/// the server, the agents, c1's CA, the rollout's ID and the releases.
fn a_sqlite_server_whose_two_agents_hold_app_1() -> (Server, Vec<Agent>, String, String, Vec<pb::ReleaseInfo>)
{
    let old = Server::start();
    old.lksctl_ok(&[
        "cluster",
        "create",
        "c1",
        "--api-server",
        "https://c1.example:6443",
    ]);
    let cluster_ca = old.lksctl_ok(&["cluster", "ca", "c1"]);
    let mut agents = Vec::new();
    for name in ["n1", "n2"] {
        let mut a = Agent::new(name);
        a.join(&old, "c1", &[]);
        a.start();
        agents.push(a);
    }
    for a in &agents {
        a.wait_connected();
    }
    assert_eq!(old.publish(&app(old.work_dir(), "1")), "app@1");
    let first = roll_out(&old, "app@1");
    for a in &agents {
        a.wait_bundle("app", "1", "applied");
    }
    let released = release_app(&old);
    assert_eq!(released.len(), 1);
    (old, agents, cluster_ca, first, released)
}

/// While the server runs: refused, nothing written.
fn a_running_servers_data_dir_is_refused_and_nothing_written(old: &Server, etcd: &Etcd) {
    let before = etcd.revision_and_keys();
    let err = one_line_error(
        &migrate(&old.data_dir, etcd, PREFIX),
        "migrate of a running server",
    );
    assert!(err.contains("stop the server first"), "{err}");
    assert_eq!(etcd.revision_and_keys(), before, "nothing written");
}

/// Audit records without the store's ids.
fn without_ids(v: serde_json::Value) -> Vec<serde_json::Value> {
    v.as_array()
        .expect("audit records")
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.as_object_mut().expect("a record").remove("id");
            r
        })
        .collect()
}

/// The stopped server migrated: the summary counts everything (the audit
/// records, the release) and shows the CA pin; the SQLite data dir is only
/// read.
fn migrated_with_every_count_in_its_summary_and_the_sqlite_dir_only_read(
    old: &Server,
    etcd: &Etcd,
    trail_len: usize,
    pin: &str,
) {
    let untouched = snapshot(&old.data_dir);
    let out = migrate(&old.data_dir, etcd, PREFIX);
    let summary = ok_stdout(&out, "migrate");
    eprintln!("{summary}\n{}", String::from_utf8_lossy(&out.stderr));
    for line in [
        "clusters    1 (1 with a CA",
        "nodes       2",
        "bundles     1 (1 blobs",
        "rollouts    1",
        &format!("audit       {} records", trail_len),
        "releases    1 (0 trust-root rotations)",
    ] {
        assert!(summary.contains(line), "{line:?} in:\n{summary}");
    }
    assert!(summary.contains(pin), "{summary}");
    assert!(summary.contains("left untouched"), "{summary}");
    assert_eq!(
        snapshot(&old.data_dir),
        untouched,
        "the SQLite data dir is only read"
    );
}

/// A second migrate into the same prefix is refused and writes nothing.
fn a_second_migrate_into_the_same_prefix_writes_nothing(old: &Server, etcd: &Etcd) {
    let after = etcd.revision_and_keys();
    let err = one_line_error(&migrate(&old.data_dir, etcd, PREFIX), "second migrate");
    assert!(err.contains(&format!("{PREFIX}identity")), "{err}");
    assert_eq!(etcd.revision_and_keys(), after, "nothing written");
}

/// What the move must carry along.
struct Moved<'a> {
    cluster_ca: &'a str,
    trail: &'a [serde_json::Value],
    released: &'a [pb::ReleaseInfo],
    pin: &'a str,
    /// The rollout completed before the move.
    first: &'a str,
}

/// The replica has the server's CA, the cluster CA and API server, the
/// audit trail in its order, the signed release as stored, the same CA
/// pin, and the nodes' bundle states and the rollout before any agent is
/// back.
fn the_replica_has_the_ca_audit_releases_pin_and_state(
    replica: &Server,
    old: &Server,
    m: &Moved<'_>,
    agents: &[Agent],
) {
    assert_eq!(replica.admin_conf().ca_cert, old.admin_conf().ca_cert);
    // The cluster CA and API server came along.
    assert_eq!(replica.lksctl_ok(&["cluster", "ca", "c1"]), m.cluster_ca);
    let c1 = replica.lksctl_json(&["cluster", "list"]);
    assert_eq!(c1[0]["api_server"], "https://c1.example:6443", "{c1}");
    assert_eq!(c1[0]["has_ca"], true, "{c1}");
    // The audit trail came along, in its order.
    assert_eq!(
        without_ids(replica.lksctl_json(&["audit", "--limit", "10000"])),
        m.trail,
        "the audit trail after the move"
    );
    // The signed release came along, as stored.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    assert_eq!(
        rt.block_on(releases_of(replica)),
        m.released,
        "releases after the move"
    );
    let tok = replica.lksctl_json(&["token", "create", "--cluster", "c1"]);
    assert_eq!(tok["ca_cert_hash"], m.pin, "the CA pin is unchanged");
    // The state came along, before any agent is back.
    for a in agents {
        let (v, st, _) = node_bundle(replica, &a.name, "app").expect("bundle state migrated");
        assert_eq!((v.as_str(), st.as_str()), ("1", "applied"), "{}", a.name);
    }
    let st = replica.lksctl_json(&["rollout", "status", m.first]);
    assert_eq!(st["state"], "completed", "{st}");
    assert_eq!(st["updated"], 2, "{st}");
}

/// Both agents reconnect to the replica with the certificates they had,
/// enrolled once (before the move), app@1 still applied.
fn the_agents_reconnect_with_the_certificates_they_had(
    replica: &Server,
    agents: &[Agent],
    identities: &[Vec<u8>],
) {
    wait_until(Duration::from_secs(90), "both agents reconnected", || {
        agents.iter().all(|a| node_connected(replica, &a.name))
    });
    let list = replica.lksctl_json(&["node", "list"]);
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");
    for (a, cert) in agents.iter().zip(identities) {
        let enrolments = node_events(replica, &a.name)
            .iter()
            .filter(|(kind, _)| kind == "enrolled")
            .count();
        assert_eq!(enrolments, 1, "{} enrolled once, before the move", a.name);
        let now = std::fs::read(a.state_dir.join("pki/node.crt")).unwrap();
        assert_eq!(&now, cert, "{} kept its certificate", a.name);
        a.wait_bundle("app", "1", "applied");
    }
}

#[test]
fn sealed_keys_need_the_key_and_an_unreachable_etcd_is_one_line() {
    let etcd = Etcd::start();
    let mut old = Server::start();
    old.create_cluster("c1");
    let pin = join_info(&old, "c1", &[]).ca_cert_hash;
    assert_eq!(old.stop(), Some(0));

    let down = lks_e2e::free_addr();
    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.arg("migrate").arg("--from-sqlite").arg(&old.data_dir).args([
        "--store",
        "etcd",
        "--etcd-endpoints",
        &format!("http://{down}"),
    ]);
    let err = one_line_error(&run(cmd), "migrate to an etcd that is down");
    assert!(err.contains("cannot reach etcd"), "{err}");

    let key = old.work_dir().join("etcd.key");
    std::fs::write(&key, "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n").unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let key = key.display().to_string();
    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.arg("migrate")
        .arg("--from-sqlite")
        .arg(&old.data_dir)
        .args(["--store", "etcd", "--etcd-endpoints", &etcd.url()])
        .args(["--etcd-prefix", PREFIX, "--encryption-key-file", &key]);
    let summary = ok_stdout(&run(cmd), "sealed migrate");
    assert!(summary.contains("private keys sealed with k1:"), "{summary}");

    let url = etcd.url();
    let replica = |extra: &[&str]| {
        let mut args = vec![
            "--store",
            "etcd",
            "--etcd-endpoints",
            &url,
            "--etcd-prefix",
            PREFIX,
        ];
        args.extend_from_slice(extra);
        // Bounded, should it wrongly start serving.
        let mut cmd = Command::new("timeout");
        cmd.arg("30")
            .arg(bin("lks-control-server"))
            .arg("--data-dir")
            .arg(old.work_dir().join("replica"))
            .args(["--listen", "127.0.0.1:0"])
            .args(&args);
        cmd
    };
    // Without the key a replica cannot open the CA, and says why.
    let out = run(replica(&[]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--encryption-key-file"),
        "{err}"
    );
    let r = Server::start_at(
        lks_e2e::free_addr(),
        &[
            "--store",
            "etcd",
            "--etcd-endpoints",
            &url,
            "--etcd-prefix",
            PREFIX,
            "--encryption-key-file",
            &key,
        ],
    );
    let tok = r.lksctl_json(&["token", "create", "--cluster", "c1"]);
    assert_eq!(tok["ca_cert_hash"], pin.as_str(), "the CA pin is unchanged");
}

/// Binary deltas (issue [delta]): the records and patch blobs move with
/// their versions, and the moved store offers the same patch (its own
/// maker is off, so it cannot have made it again).
#[test]
fn binary_deltas_move_with_their_versions_and_the_moved_store_offers_them() {
    const PATH: &str = "/opt/app/bin/app";
    let etcd = Etcd::start();
    let mut old = Server::start_with(&["--delta-interval", "1s"]);
    old.create_cluster("c1");
    let v1 = lks_e2e::noise(1 << 20, 5);
    let mut v2 = v1.clone();
    v2[1000] ^= 1;
    v2.splice(500_000..500_000, *b"a patch release");
    let publish = |server: &Server, v: &str, content: &[u8]| {
        let dir = tempfile::tempdir().unwrap();
        let b = write_bundle(
            dir.path(),
            "app",
            v,
            &[BundleFile {
                path: PATH,
                content,
                mode: "0755",
            }],
            "",
        );
        assert_eq!(server.publish(&b), format!("app@{v}"));
    };
    publish(&old, "1", &v1);
    publish(&old, "2", &v2);
    let mut deltas = serde_json::Value::Null;
    wait_until(Duration::from_secs(60), "the patch of app@2", || {
        deltas = old.lksctl_json(&["bundle", "get", "app@2"])["deltas"].clone();
        deltas.as_array().is_some_and(|d| !d.is_empty())
    });
    let patch_size = deltas[0]["size"].as_u64().unwrap();
    assert_eq!(old.stop(), Some(0));

    let prefix = "/lks-migrated-deltas/";
    let out = migrate(&old.data_dir, &etcd, prefix);
    let summary = ok_stdout(&out, "migrate");
    for line in [
        "bundles     2 (3 blobs",
        "deltas      1 patches (0 skipped recorded)",
    ] {
        assert!(summary.contains(line), "{line:?} in:\n{summary}");
    }
    let replica = Server::start_with(&[
        "--store",
        "etcd",
        "--etcd-endpoints",
        &etcd.url(),
        "--etcd-prefix",
        prefix,
        "--delta-interval",
        "off",
    ]);
    assert_eq!(
        replica.lksctl_json(&["bundle", "get", "app@2"])["deltas"],
        deltas,
        "the same records after the move"
    );

    // A node holding app@1 gets app@2 through the moved patch.
    let mut a = Agent::new("d1");
    a.join(&replica, "c1", &[]);
    a.start();
    roll_out(&replica, "app@1");
    a.wait_bundle("app", "1", "applied");
    let cached = a
        .state_dir
        .join("cache/sha256")
        .join(lks_proto::Digest::of(&v1).hex());
    wait_until(Duration::from_secs(30), "app@1 in the node's cache", || {
        cached.exists()
    });
    let sent =
        |kind: &str| replica.metric(&format!("lks_blob_bytes_served_by_kind_total{{kind=\"{kind}\"}}"));
    let (delta0, whole0) = (sent("delta"), sent("whole"));
    roll_out(&replica, "app@2");
    a.wait_bundle("app", "2", "applied");
    assert_eq!(a.read(PATH).unwrap().0, v2, "rebuilt byte-exact");
    assert!(a.log().contains("blob rebuilt from a delta and verified"));
    assert_eq!(sent("delta") - delta0, patch_size, "the moved patch, once");
    assert_eq!(sent("whole"), whole0, "no whole file");
    a.stop();
}
