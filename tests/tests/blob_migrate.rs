//! `lks-control-server migrate --blobs-from-etcd`: a running etcd
//! installation moves its blobs from etcd chunks into an S3 bucket
//! (`s3s-fs`), in the two steps the README gives:
//!
//! - copy while the replicas run on etcd: the bucket gets every blob,
//!   verified; running it again copies nothing;
//! - `--delete-from-etcd` is refused, naming a replica, while one still
//!   keeps its blobs in etcd; once the replicas run on the bucket it
//!   removes the chunks from etcd, and a node that joins then is served
//!   from the bucket byte-exact.
//!
//! And `migrate --from-sqlite … --blob-store s3://…`: a file larger than
//! `--etcd-max-blob-size` refuses a migration into etcd, naming the file,
//! but not one into a bucket, where that limit plays no part.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use lks_e2e::agent::{Agent, BundleFile, wait_node_bundle, write_bundle};
use lks_e2e::etcd::Etcd;
use lks_e2e::s3::S3;
use lks_e2e::server::Server;
use lks_e2e::{bin, noise, ok_stdout, one_line_error, run};
use lks_proto::Digest;

const PREFIX: &str = "/lks-test-blob-migrate/";

/// `lks-control-server migrate --blobs-from-etcd …` with the bucket's
/// credentials in the environment.
fn migrate(etcd: &Etcd, s3: &S3, extra: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.args(["migrate", "--blobs-from-etcd", "--store", "etcd"])
        .args(["--etcd-endpoints", &etcd.url(), "--etcd-prefix", PREFIX])
        .args(s3.server_args("moved"))
        .args(extra)
        .env_remove("RUST_LOG")
        .envs(s3.env());
    run(cmd)
}

#[test]
fn an_etcd_installation_moves_its_blobs_into_a_bucket() {
    let etcd = Etcd::start();
    let s3 = S3::start("lks-blobs");
    let mut r1 = etcd.replica(PREFIX, &[]);
    let mut r2 = etcd.replica(PREFIX, &[]);
    r1.create_cluster("c");
    let content = noise(2 << 20, 5);
    let work = tempfile::tempdir().unwrap();
    let dir = write_bundle(
        work.path(),
        "app",
        "1",
        &[BundleFile {
            path: "/opt/app/bin",
            content: &content,
            mode: "0755",
        }],
        "",
    );
    assert_eq!(r1.publish(&dir), "app@1");
    let mut a = Agent::new("n0");
    a.join(&r2, "c", &[]);
    a.start();
    r1.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "c",
        "--bundle",
        "app@1",
        "--wait",
    ]);
    let in_etcd = etcd.keys_under(&format!("{PREFIX}blobs/"));
    assert!(in_etcd >= 3, "meta and chunks in etcd: {in_etcd}");
    assert!(s3.objects().is_empty());

    let out = ok_stdout(&migrate(&etcd, &s3, &[]), "migrate --blobs-from-etcd");
    assert!(
        out.contains("copied 1 blobs (2097152 bytes) from etcd to s3://lks-blobs/moved"),
        "{out}"
    );
    assert!(out.contains("--delete-from-etcd"), "{out}");
    let hex = Digest::of(&content).hex();
    assert!(
        s3.objects().iter().any(|o| o.ends_with(&hex)),
        "{:?}",
        s3.objects()
    );
    let again = ok_stdout(&migrate(&etcd, &s3, &[]), "migrate again");
    assert!(
        again.contains("copied 0 blobs") && again.contains("1 were there already"),
        "{again}"
    );

    // The replicas still keep blobs in etcd: deleting them is refused.
    let e = one_line_error(
        &migrate(&etcd, &s3, &["--delete-from-etcd"]),
        "delete while on etcd",
    );
    assert!(e.contains("still keeps its blobs in etcd"), "{e}");
    assert_eq!(etcd.keys_under(&format!("{PREFIX}blobs/")), in_etcd);

    // Restarted on the bucket (a fresh replica, nothing local), then deleted.
    r1.stop();
    r2.stop();
    let args = s3.server_args("moved");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r3 = etcd.replica_with_env(PREFIX, &args, &s3.env());
    let out = ok_stdout(&migrate(&etcd, &s3, &["--delete-from-etcd"]), "delete from etcd");
    assert!(out.contains("deleted 1 blobs (2097152 bytes) from etcd"), "{out}");
    assert_eq!(etcd.keys_under(&format!("{PREFIX}blobs/")), 0);

    let mut b = Agent::new("n1");
    b.join(&r3, "c", &[]);
    b.start();
    wait_node_bundle(&r3, "n1", "app", "1", "applied");
    assert_eq!(b.read("/opt/app/bin").unwrap().0, content);
    assert!(r3.log().contains("blob fetched from the blob store"));
}

#[test]
fn migrate_blobs_needs_a_bucket() {
    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.args([
        "migrate",
        "--blobs-from-etcd",
        "--store",
        "etcd",
        "--etcd-endpoints",
        "http://127.0.0.1:1",
    ]);
    let e = one_line_error(&run(cmd), "no bucket");
    assert!(e.contains("--blob-store s3://"), "{e}");
    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.args([
        "migrate",
        "--store",
        "etcd",
        "--etcd-endpoints",
        "http://127.0.0.1:1",
    ]);
    let out = run(cmd);
    assert!(!out.status.success());
}

#[test]
fn a_file_over_the_etcd_limit_refuses_no_migration_into_a_bucket() {
    const FROM_PREFIX: &str = "/lks-test-from-sqlite/";
    let etcd = Etcd::start();
    let s3 = S3::start("lks-blobs");
    let mut old = Server::start();
    old.create_cluster("c");
    let content = noise(64 << 10, 7);
    let work = tempfile::tempdir().unwrap();
    let dir = write_bundle(
        work.path(),
        "app",
        "1",
        &[BundleFile {
            path: "/opt/app/bin",
            content: &content,
            mode: "0755",
        }],
        "",
    );
    assert_eq!(old.publish(&dir), "app@1");
    assert_eq!(old.stop(), Some(0));
    let from_sqlite = |extra: &[String]| {
        let mut cmd = Command::new(bin("lks-control-server"));
        cmd.arg("migrate")
            .arg("--from-sqlite")
            .arg(&old.data_dir)
            .args(["--store", "etcd", "--etcd-endpoints", &etcd.url()])
            .args(["--etcd-prefix", FROM_PREFIX, "--etcd-max-blob-size", "1024"])
            .args(extra)
            .env_remove("RUST_LOG")
            .envs(s3.env());
        run(cmd)
    };

    // Into etcd the file is over the limit: refused, naming it, nothing written.
    let e = one_line_error(&from_sqlite(&[]), "migrate into etcd");
    assert!(
        e.contains("bundle app@1: /opt/app/bin is 65536 bytes, more than the 1024 bytes")
            && e.contains("--blob-store s3://"),
        "{e}"
    );
    assert_eq!(etcd.keys_under(FROM_PREFIX), 0);

    // Into a bucket the etcd limit plays no part.
    let out = ok_stdout(&from_sqlite(&s3.server_args("moved")), "migrate into a bucket");
    assert!(out.contains("bundles     1 (1 blobs, 65536 bytes)"), "{out}");
    let hex = Digest::of(&content).hex();
    assert!(
        s3.objects().iter().any(|o| o.ends_with(&hex)),
        "{:?}",
        s3.objects()
    );
    assert_eq!(
        etcd.keys_under(&format!("{FROM_PREFIX}blobs/")),
        0,
        "no bytes in etcd"
    );

    // A replica on the bucket serves it to a new node byte-exact.
    let args = s3.server_args("moved");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = etcd.replica_with_env(FROM_PREFIX, &args, &s3.env());
    let mut a = Agent::new("n0");
    a.join(&r, "c", &[]);
    a.start();
    r.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "c",
        "--bundle",
        "app@1",
        "--wait",
    ]);
    wait_node_bundle(&r, "n0", "app", "1", "applied");
    assert_eq!(a.read("/opt/app/bin").unwrap().0, content);
}
