//! `lksctl bundle delete` and the blob garbage collector, end to end, on a
//! single server (blobs in its data dir) and on replicas over etcd with
//! blobs in an S3 bucket (`s3s-fs`):
//!
//! - a version in use (a rollout, a node's desired state, a cluster's
//!   target) is refused with one line naming who uses it;
//! - once every node moved on, the old version is deleted, and its bytes
//!   (those no other version shares) leave the blob store and every
//!   replica's copy; a blob two versions share stays; the new version is
//!   still delivered byte-exact to a node that joins afterwards;
//! - `bundle list` shows the bytes each version holds; metrics count what
//!   was stored and reclaimed.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use lks_e2e::agent::{Agent, BundleFile, wait_node_bundle, write_bundle};
use lks_e2e::etcd::Etcd;
use lks_e2e::s3::S3;
use lks_e2e::server::Server;
use lks_e2e::{noise, one_line_error, wait_until};
use lks_proto::Digest;

/// Fast collection for the test: a pass every second, and a grace period
/// of a few seconds (longer than any publish here takes).
const GC: [&str; 4] = ["--blob-gc-interval", "1s", "--blob-gc-grace", "3s"];

/// Where a server keeps its local copy of `d`.
fn local_copy(server: &Server, d: &Digest) -> PathBuf {
    let hex = d.hex();
    server
        .work_dir()
        .join("data/blobs/sha256")
        .join(&hex[..2])
        .join(hex)
}

/// Two versions of `app`: `/opt/app/shared` is the same in both,
/// `/opt/app/bin` differs. Returns their directories.
fn two_versions(dir: &Path, shared: &[u8], v1: &[u8], v2: &[u8]) -> (PathBuf, PathBuf) {
    let version = |v: &str, bin| {
        let file = |path, content| BundleFile {
            path,
            content,
            mode: "0644",
        };
        write_bundle(
            dir,
            "app",
            v,
            &[file("/opt/app/shared", shared), file("/opt/app/bin", bin)],
            "",
        )
    };
    (version("1", v1), version("2", v2))
}

fn roll_out_and_wait(via: &Server, id: &str) -> String {
    // The rollout ID is the first line; progress may follow.
    let out = via.lksctl_ok(&["rollout", "start", "--cluster", "c", "--bundle", id, "--wait"]);
    out.lines().next().unwrap_or_default().trim().to_string()
}

fn held_bytes(via: &Server, version: &str) -> u64 {
    let list = via.lksctl_json(&["bundle", "list"]);
    list.as_array()
        .unwrap()
        .iter()
        .find(|b| b["version"] == version)
        .and_then(|b| b["held_bytes"].as_u64())
        .unwrap_or_else(|| panic!("app@{version} not listed: {list}"))
}

/// The scenario, on whichever servers: `publisher` publishes and starts
/// rollouts, `other` serves the agents too; `gone(d)` tells whether a blob
/// left the blob store.
fn delete_and_collect(publisher: &Server, other: &Server, work: &Path, gone: impl Fn(&Digest) -> bool) {
    publisher.create_cluster("c");
    let (shared, v1, v2) = (noise(1 << 20, 1), noise(3 << 20, 2), noise(2 << 20, 3));
    let (ds, d1, d2) = (Digest::of(&shared), Digest::of(&v1), Digest::of(&v2));
    let (dir1, dir2) = two_versions(work, &shared, &v1, &v2);

    let mut a = Agent::new("n0");
    a.join(other, "c", &[]);
    a.start();
    assert_eq!(publisher.publish(&dir1), "app@1");
    assert_eq!(held_bytes(publisher, "1"), (1 << 20) + (3 << 20));
    roll_out_and_wait(publisher, "app@1");
    wait_node_bundle(publisher, "n0", "app", "1", "applied");

    // In use: the node's desired state and the cluster's target.
    let e = one_line_error(
        &publisher.lksctl(&["bundle", "delete", "app@1"]),
        "delete app@1 in use",
    );
    assert!(
        e.starts_with("error: ")
            && e.contains("app@1 is in use by")
            && e.contains("node n0")
            && e.contains("cluster c"),
        "{e}"
    );
    let e = one_line_error(
        &publisher.lksctl(&["bundle", "delete", "app@9"]),
        "delete unknown",
    );
    assert!(e.contains("app@9 is not published"), "{e}");
    let e = one_line_error(
        &publisher.lksctl(&["bundle", "delete", "app"]),
        "delete without version",
    );
    assert!(e.contains("NAME@VERSION"), "{e}");

    assert_eq!(publisher.publish(&dir2), "app@2");
    let r2 = roll_out_and_wait(publisher, "app@2");
    wait_node_bundle(publisher, "n0", "app", "2", "applied");

    // Before: every place holds app@1's own blob (the agent fetched it
    // through `other`).
    assert!(!gone(&d1) && local_copy(publisher, &d1).exists() && local_copy(other, &d1).exists());
    let out = publisher.lksctl_json(&["bundle", "delete", "app@1"]);
    assert_eq!(out["version"], "1");
    assert_eq!(
        out["reclaimable_bytes"],
        3 << 20,
        "only what app@2 does not share"
    );
    let listed = publisher.lksctl_json(&["bundle", "list"]);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");

    wait_until(
        Duration::from_secs(30),
        "app@1's own blob to be reclaimed",
        || gone(&d1) && !local_copy(publisher, &d1).exists() && !local_copy(other, &d1).exists(),
    );
    // Shared and current blobs stay; a node that joins now gets app@2.
    assert!(!gone(&ds) && !gone(&d2));
    let mut b = Agent::new("n1");
    b.join(other, "c", &[]);
    b.start();
    wait_node_bundle(publisher, "n1", "app", "2", "applied");
    assert_eq!(b.read("/opt/app/bin").unwrap().0, v2);
    assert_eq!(b.read("/opt/app/shared").unwrap().0, shared);
    // A deleted version can be neither rolled out nor published as other content.
    let e = one_line_error(
        &publisher.lksctl(&["rollout", "start", "--cluster", "c", "--bundle", "app@1"]),
        "roll out deleted",
    );
    assert!(e.contains("app@1"), "{e}");
    // Nor can a rollback return nodes to it.
    let e = one_line_error(
        &publisher.lksctl(&["rollout", "rollback", &r2]),
        "roll back to deleted",
    );
    assert!(e.contains("app@1, which was deleted"), "{e}");
    let metrics = publisher.http_get("/metrics");
    assert!(
        metrics.contains("lks_blob_store_reclaimed_bytes_total"),
        "{metrics}"
    );
}

#[test]
fn a_single_server_deletes_old_versions_and_reclaims_their_bytes() {
    let s = Server::start_with(&GC);
    let work = tempfile::tempdir().unwrap();
    delete_and_collect(&s, &s, work.path(), |d| !local_copy(&s, d).exists());
    let m = s.http_get("/metrics");
    let reclaimed = m
        .lines()
        .find_map(|l| l.strip_prefix("lks_blob_store_reclaimed_bytes_total "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert_eq!(reclaimed, Some(3 << 20), "{m}");
}

#[test]
fn replicas_on_etcd_and_s3_reclaim_in_the_bucket_and_every_copy() {
    let etcd = Etcd::start();
    let s3 = S3::start("lks-blobs");
    let mut args: Vec<String> = s3.server_args("gc");
    args.extend(GC.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r1 = etcd.replica_with_env("/lks-test-gc/", &args, &s3.env());
    let r2 = etcd.replica_with_env("/lks-test-gc/", &args, &s3.env());
    let work = tempfile::tempdir().unwrap();
    let in_bucket = |d: &Digest| {
        let hex = d.hex();
        s3.objects().iter().any(|o| o.ends_with(&hex))
    };
    delete_and_collect(&r1, &r2, work.path(), |d| !in_bucket(d));
}
