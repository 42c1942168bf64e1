//! Blobs in an S3 bucket (`--blob-store s3://BUCKET/PREFIX`), end to end:
//! real replicas on a real etcd, a real S3 server (`s3s-fs`, which
//! `scripts/setup.sh` installs), real agents and lksctl.
//!
//! - Large files: 150 MiB published through one replica (over etcd's
//!   32 MiB default cap: etcd holds no byte of it), that replica killed,
//!   two agents on the other replicas receive it byte-exact from a rollout
//!   started through a survivor.
//! - The object store lost mid-publish: one error line, nothing recorded;
//!   the same publish succeeds once it is back.
//! - The object store lost while a replica that lacks a blob serves it:
//!   the agent waits, and gets it once the store is back.
//! - Start refusals: credentials, bucket, endpoint, flag misuse; one line,
//!   nothing written.
//! - One SQLite server whose local copies were lost refetches them.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use lks_e2e::agent::{Agent, BundleFile, CONVERGE, write_bundle};
use lks_e2e::etcd::Etcd;
use lks_e2e::s3::{S3, write_credentials};
use lks_e2e::server::Server;
use lks_e2e::{bin, noise, one_line_error, run, wait_until};
use lks_proto::Digest;

const BUCKET: &str = "lks-blobs";

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A replica on `etcd` keeping blobs in `s3` under `s3_prefix`, with the
/// credentials in its environment.
fn s3_replica(etcd: &Etcd, prefix: &str, s3: &S3, s3_prefix: &str) -> Server {
    etcd.replica_with_env(prefix, &strs(&s3.server_args(s3_prefix)), &s3.env())
}

/// Joins and starts an agent named `name` that dials `servers`
/// (comma-separated URLs), with a token made through `via`.
fn agent(via: &Server, cluster: &str, name: &str, servers: &str) -> Agent {
    let tok = via.lksctl_json(&["token", "create", "--cluster", cluster]);
    let mut a = Agent::new(name);
    let out = a.join_raw(
        servers,
        tok["token"].as_str().unwrap(),
        tok["ca_cert_hash"].as_str().unwrap(),
        &[],
    );
    assert!(
        out.status.success(),
        "join {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    a.start();
    a.wait_connected();
    a
}

/// Starts a rollout of `bundle` to `cluster` through `via`; returns its id.
fn roll_out(via: &Server, cluster: &str, bundle: &str) -> String {
    via.lksctl_ok(&["rollout", "start", "--cluster", cluster, "--bundle", bundle])
        .trim()
        .to_string()
}

fn rollout_state(via: &Server, id: &str) -> serde_json::Value {
    via.lksctl_json(&["rollout", "status", id])
}

/// Waits (generously: the agent retries a blob every 15 s) until the
/// rollout completed.
fn wait_completed(via: &Server, id: &str, timeout: Duration) {
    wait_until(timeout, &format!("rollout {id} completed"), || {
        rollout_state(via, id)["state"] == "completed"
    });
    let st = rollout_state(via, id);
    assert_eq!(st["failed"], 0, "{st}");
}

/// Digest and size of a file of an agent's root.
fn digest_of(a: &Agent, path: &str) -> (Digest, u64) {
    Digest::of_file(&a.path(path)).unwrap_or_else(|e| panic!("{}: read {path}: {e}", a.name))
}

/// Where a server keeps its verified copy of `d`.
fn local_blob(s: &Server, d: &Digest) -> PathBuf {
    let hex = d.hex();
    s.data_dir.join("blobs/sha256").join(&hex[..2]).join(hex)
}

/// The bucket key of `d` under `prefix`.
fn object_key(prefix: &str, d: &Digest) -> String {
    let hex = d.hex();
    let p = if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    };
    format!("{p}sha256/{}/{hex}", &hex[..2])
}

/// `NAME@VERSION`s of `bundle list`.
fn bundles(via: &Server) -> Vec<String> {
    via.lksctl_json(&["bundle", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            format!(
                "{}@{}",
                b["name"].as_str().unwrap(),
                b["version"].as_str().unwrap()
            )
        })
        .collect()
}

fn fetched_from_store(s: &Server) -> bool {
    s.log().contains("blob fetched from the blob store")
}

#[test]
fn a_150_mib_file_goes_through_the_bucket_and_survives_its_publisher() {
    let started = Instant::now();
    let etcd = Etcd::start();
    let s3 = S3::start(BUCKET);
    let prefix = "/lks-test-s3-big/";
    let s3_prefix = "some/prefix";
    let mut r1 = s3_replica(&etcd, prefix, &s3, s3_prefix);
    let r2 = s3_replica(&etcd, prefix, &s3, s3_prefix);
    // The third takes its credentials from a file (mode 0600).
    let tmp = tempfile::tempdir().unwrap();
    let creds = tmp.path().join("s3-credentials");
    s3.credentials_file(&creds);
    let mut args = s3.server_args(s3_prefix);
    args.extend(["--s3-credentials-file".into(), creds.display().to_string()]);
    let r3 = etcd.replica(prefix, &strs(&args));

    r1.lksctl_ok(&["cluster", "create", "c1"]);
    // Neither agent knows r1; each prefers another survivor.
    let a = agent(&r2, "c1", "a", &format!("{},{}", r2.url(), r3.url()));
    let b = agent(&r2, "c1", "b", &format!("{},{}", r3.url(), r2.url()));

    let data = noise(150 << 20, 0x5eed_0150);
    let digest = Digest::of(&data);
    let dir = write_bundle(
        r1.work_dir(),
        "big",
        "1",
        &[
            BundleFile {
                path: "/opt/big/data.bin",
                content: &data,
                mode: "0640",
            },
            BundleFile {
                path: "/etc/big.conf",
                content: b"size=150M\n",
                mode: "0644",
            },
        ],
        "",
    );
    drop(data);
    let t = Instant::now();
    assert_eq!(r1.publish(&dir), "big@1");
    let publish_took = t.elapsed();
    // Published means in the bucket: the publisher may go now.
    r1.kill9();
    std::fs::remove_dir_all(&dir).unwrap();

    // Over etcd's 32 MiB cap, yet published: etcd holds the bundle, not a
    // byte of the blob.
    assert_eq!(etcd.keys_under(&format!("{prefix}bundles/big/1")), 1);
    assert_eq!(etcd.keys_under(&format!("{prefix}blobs/")), 0);
    let small = Digest::of(b"size=150M\n");
    let mut want = vec![object_key(s3_prefix, &digest), object_key(s3_prefix, &small)];
    want.sort();
    assert_eq!(s3.objects(), want, "one object per blob, under the prefix");
    for r in [&r2, &r3] {
        assert!(!local_blob(r, &digest).exists(), "only the publisher had it");
    }

    let t = Instant::now();
    let id = roll_out(&r2, "c1", "big@1");
    wait_completed(&r2, &id, Duration::from_secs(240));
    let rollout_took = t.elapsed();
    for ag in [&a, &b] {
        ag.wait_bundle("big", "1", "applied");
        assert_eq!(
            digest_of(ag, "/opt/big/data.bin"),
            (digest, 150 << 20),
            "{}: byte-exact",
            ag.name
        );
        assert_eq!(
            ag.read("/etc/big.conf").unwrap(),
            (b"size=150M\n".to_vec(), 0o644)
        );
    }
    // Whichever survivor served an agent fetched the blob from the bucket
    // and keeps its own verified copy.
    assert!(
        fetched_from_store(&r2) || fetched_from_store(&r3),
        "r2:\n{}\nr3:\n{}",
        r2.log(),
        r3.log()
    );
    for r in [&r2, &r3] {
        if fetched_from_store(r) {
            assert_eq!(Digest::of_file(&local_blob(r, &digest)).unwrap().0, digest);
        }
    }
    eprintln!(
        "150 MiB: publish {publish_took:?}, rollout to 2 agents {rollout_took:?}, test {:?}",
        started.elapsed()
    );
}

#[test]
fn an_object_store_lost_mid_publish_fails_it_cleanly_and_a_retry_succeeds() {
    let mut s3 = S3::start(BUCKET);
    let s = Server::start_with_env(&strs(&s3.server_args("p")), &s3.env());
    let data = noise(128 << 20, 0xdead_beef);
    let digest = Digest::of(&data);
    let dir = write_bundle(
        s.work_dir(),
        "mid",
        "1",
        &[BundleFile {
            path: "/opt/mid.bin",
            content: &data,
            mode: "0644",
        }],
        "",
    );
    drop(data);
    let dir_arg = dir.display().to_string();

    // The server takes the upload, then copies the blob into the bucket
    // in parts: kill the object store as soon as that copy begins.
    let out = std::thread::scope(|scope| {
        let publish = scope.spawn(|| s.lksctl(&["bundle", "publish", &dir_arg]));
        let deadline = Instant::now() + Duration::from_secs(120);
        while !s3.upload_started() {
            assert!(
                !publish.is_finished(),
                "publish ended before the upload to the bucket began"
            );
            assert!(Instant::now() < deadline, "no upload to the bucket began");
            std::thread::sleep(Duration::from_millis(2));
        }
        s3.stop();
        publish.join().unwrap()
    });
    let err = one_line_error(&out, "publish with the object store gone");
    eprintln!("publish refused: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains("mid@1"), "{err}");
    assert!(err.contains(&format!("s3://{BUCKET}/p")), "{err}");
    assert!(err.contains("unavailable"), "{err}");
    assert!(!bundles(&s).contains(&"mid@1".to_string()), "not recorded");
    assert!(s3.objects().is_empty(), "{:?}", s3.objects());

    s3.start_again();
    assert_eq!(s.publish(&dir), "mid@1");
    assert_eq!(bundles(&s), ["mid@1"]);
    assert_eq!(s3.objects(), [object_key("p", &digest)]);
    let obj = s3.bucket_dir().join(object_key("p", &digest));
    assert_eq!(Digest::of_file(&obj).unwrap(), (digest, 128 << 20));
}

#[test]
fn a_replica_waits_for_an_object_store_that_went_away_and_serves_once_it_is_back() {
    let etcd = Etcd::start();
    let mut s3 = S3::start(BUCKET);
    let prefix = "/lks-test-s3-down/";
    let ra = s3_replica(&etcd, prefix, &s3, "");
    let rb = s3_replica(&etcd, prefix, &s3, "");
    ra.lksctl_ok(&["cluster", "create", "c1"]);
    // The agent knows only rb, which will lack the blob.
    let a = agent(&ra, "c1", "a", &rb.url());

    // Larger than one part: a multipart object.
    let data = noise(20 << 20, 42);
    let digest = Digest::of(&data);
    let dir = write_bundle(
        ra.work_dir(),
        "svc",
        "1",
        &[BundleFile {
            path: "/opt/svc.bin",
            content: &data,
            mode: "0755",
        }],
        "",
    );
    assert_eq!(ra.publish(&dir), "svc@1");
    assert!(!local_blob(&rb, &digest).exists());

    s3.stop();
    let id = roll_out(&ra, "c1", "svc@1");
    wait_until(CONVERGE, "the agent waiting for the blob", || {
        a.bundle("svc")
            .is_some_and(|(v, st, m)| v == "1" && st == "pending" && m.contains("waiting for blobs"))
    });
    // A while longer: it keeps waiting; nothing half-written appears.
    std::thread::sleep(Duration::from_secs(3));
    let (_, st, msg) = a.bundle("svc").unwrap();
    assert_eq!(st, "pending", "{msg}");
    assert!(msg.contains("unavailable"), "{msg}");
    eprintln!("agent meanwhile: {st}: {msg}");
    assert!(!a.path("/opt/svc.bin").exists());
    assert!(!local_blob(&rb, &digest).exists());
    assert_ne!(rollout_state(&ra, &id)["state"], "completed");

    s3.start_again();
    // The agent asks again every 15 s.
    wait_completed(&ra, &id, Duration::from_secs(120));
    a.wait_bundle("svc", "1", "applied");
    assert_eq!(digest_of(&a, "/opt/svc.bin"), (digest, 20 << 20));
    assert!(fetched_from_store(&rb), "{}", rb.log());
    assert!(local_blob(&rb, &digest).exists());
}

/// Runs the server with `args` (and `env` on top of a test environment
/// without AWS variables) until it exits; returns its output and the data
/// dir it was given.
fn refused_start(args: &[&str], env: &[(&str, &str)]) -> (std::process::Output, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.arg("--data-dir")
        .arg(tmp.path().join("data"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .envs(env.iter().copied());
    (run(cmd), tmp)
}

/// Asserts a refused start: one `error: ` line containing every `needle`,
/// exit code `code` (any failure if None), no data dir; returns the line.
fn assert_refused(args: &[&str], env: &[(&str, &str)], code: Option<i32>, needles: &[&str]) -> String {
    let (out, tmp) = refused_start(args, env);
    let what = format!("start with {args:?}");
    let err = one_line_error(&out, &what);
    assert!(err.starts_with("error: "), "{what}: {err}");
    for n in needles {
        assert!(err.contains(n), "{what}: {n:?} not in {err:?}");
    }
    if let Some(c) = code {
        assert_eq!(out.status.code(), Some(c), "{what}: {err}");
    }
    assert!(
        !tmp.path().join("data").exists(),
        "{what}: the data dir was created"
    );
    err
}

#[test]
fn a_server_refuses_to_start_on_an_unusable_bucket_and_writes_nothing() {
    let s3 = S3::start(BUCKET);
    let ep = s3.endpoint();
    let (id, secret) = (lks_e2e::s3::ACCESS_KEY, lks_e2e::s3::SECRET_KEY);
    let good_env = [("AWS_ACCESS_KEY_ID", id), ("AWS_SECRET_ACCESS_KEY", secret)];
    let bucket = format!("s3://{BUCKET}/p");

    let wrong = "not-the-secret-4711";
    let err = assert_refused(
        &["--blob-store", &bucket, "--s3-endpoint", &ep],
        &[("AWS_ACCESS_KEY_ID", id), ("AWS_SECRET_ACCESS_KEY", wrong)],
        Some(1),
        &["error: blob store s3://lks-blobs/p: ", "credentials"],
    );
    assert!(!err.contains(wrong), "the secret is never printed: {err}");

    assert_refused(
        &["--blob-store", "s3://no-such-bucket", "--s3-endpoint", &ep],
        &good_env,
        Some(1),
        &["error: blob store s3://no-such-bucket", "bucket does not exist"],
    );

    // A replica on etcd checks the bucket before it touches etcd.
    let etcd = Etcd::start();
    let before = etcd.revision_and_keys();
    assert!(before.0 > 0, "etcd answers with its revision: {before:?}");
    let etcd_url = etcd.url();
    assert_refused(
        &[
            "--store",
            "etcd",
            "--etcd-endpoints",
            &etcd_url,
            "--blob-store",
            "s3://no-such-bucket/p",
            "--s3-endpoint",
            &ep,
        ],
        &good_env,
        Some(1),
        &["bucket does not exist"],
    );
    assert_eq!(etcd.revision_and_keys(), before, "nothing written to etcd");

    let closed = lks_e2e::free_addr();
    assert_refused(
        &[
            "--blob-store",
            &bucket,
            "--s3-endpoint",
            &format!("http://{closed}"),
        ],
        &good_env,
        Some(1),
        &["error: blob store s3://lks-blobs/p", "unavailable"],
    );

    // Usage errors: exit 2.
    assert_refused(
        &["--s3-endpoint", &ep],
        &good_env,
        Some(2),
        &["--blob-store s3://"],
    );
    assert_refused(
        &["--blob-store", "local", "--s3-region", "eu-west-1"],
        &good_env,
        Some(2),
        &["--blob-store s3://"],
    );
    let tmp = tempfile::tempdir().unwrap();
    let creds = tmp.path().join("credentials");
    write_credentials(&creds, id, secret, 0o644);
    let creds_arg = creds.display().to_string();
    assert_refused(
        &[
            "--blob-store",
            &bucket,
            "--s3-endpoint",
            &ep,
            "--s3-credentials-file",
            &creds_arg,
        ],
        &[],
        Some(2),
        &["--s3-credentials-file", "0644", "0600"],
    );
    assert_refused(
        &["--blob-store", &bucket, "--s3-endpoint", &ep],
        &[],
        Some(2),
        &["AWS_ACCESS_KEY_ID", "--s3-credentials-file"],
    );
    // The checks wrote nothing into the bucket either.
    assert!(s3.objects().is_empty(), "{:?}", s3.objects());
}

/// Removes every file under `dir`; returns how many there were.
fn remove_files(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            n += remove_files(&p);
        } else {
            std::fs::remove_file(&p).unwrap();
            n += 1;
        }
    }
    n
}

#[test]
fn a_single_server_refetches_lost_local_copies_from_the_bucket() {
    let s3 = S3::start(BUCKET);
    let tmp = tempfile::tempdir().unwrap();
    let creds = tmp.path().join("credentials");
    s3.credentials_file(&creds);
    let mut args = s3.server_args("");
    args.extend(["--s3-credentials-file".into(), creds.display().to_string()]);
    let s = Server::start_with(&strs(&args));
    s.create_cluster("c1");
    let a = agent(&s, "c1", "a", &s.url());

    let data = noise(3 << 20, 7);
    let digest = Digest::of(&data);
    let dir = write_bundle(
        s.work_dir(),
        "app",
        "1",
        &[
            BundleFile {
                path: "/opt/app.bin",
                content: &data,
                mode: "0644",
            },
            BundleFile {
                path: "/etc/app.conf",
                content: b"x=1\n",
                mode: "0600",
            },
        ],
        "",
    );
    assert_eq!(s.publish(&dir), "app@1");
    assert_eq!(s3.objects().len(), 2, "{:?}", s3.objects());
    // The server's own copies are gone (a lost disk, say); the bucket has them.
    assert_eq!(remove_files(&s.data_dir.join("blobs/sha256")), 2);

    let id = roll_out(&s, "c1", "app@1");
    wait_completed(&s, &id, Duration::from_secs(60));
    a.wait_bundle("app", "1", "applied");
    assert_eq!(digest_of(&a, "/opt/app.bin"), (digest, 3 << 20));
    assert_eq!(a.read("/etc/app.conf").unwrap(), (b"x=1\n".to_vec(), 0o600));
    assert!(fetched_from_store(&s), "{}", s.log());
    assert!(local_blob(&s, &digest).exists(), "its copy is back");
}
