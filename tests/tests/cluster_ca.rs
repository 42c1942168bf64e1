//! Tenant cluster CAs (DESIGN §3, §6) against a real server and lksctl:
//! generated and imported CAs (RSA with kubeadm's PKCS#1 key, and ECDSA,
//! made with openssl), the refusals that store nothing, the API server,
//! and the CA key never showing up in logs or (sealed) in etcd's files.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use lks_e2e::etcd::Etcd;
use lks_e2e::server::Server;
use lks_e2e::{one_line_error, run};

fn have_openssl() -> bool {
    Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = run({
        let mut c = Command::new("openssl");
        c.args(args).current_dir(dir);
        c
    });
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed certificate and its key made with openssl: `kind` is
/// `rsa` (PKCS#1 key, as kubeadm writes it), `ec` (PKCS#8), or `leaf` (not
/// a CA).
fn make_ca(dir: &Path, name: &str, kind: &str) -> (PathBuf, PathBuf) {
    let crt = format!("{name}.crt");
    let key = format!("{name}.key");
    let subj = format!("/CN={name}");
    match kind {
        "rsa" => {
            openssl(dir, &["genrsa", "-traditional", "-out", &key, "2048"]);
            openssl(
                dir,
                &[
                    "req",
                    "-x509",
                    "-new",
                    "-key",
                    &key,
                    "-days",
                    "365",
                    "-subj",
                    &subj,
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                    "-out",
                    &crt,
                ],
            );
        }
        // ec and leaf differ only in the basic constraints.
        _ => {
            let constraints = if kind == "ec" {
                "basicConstraints=critical,CA:TRUE"
            } else {
                "basicConstraints=critical,CA:FALSE"
            };
            openssl(
                dir,
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:P-256",
                    "-nodes",
                    "-keyout",
                    &key,
                    "-days",
                    "365",
                    "-subj",
                    &subj,
                    "-addext",
                    constraints,
                    "-out",
                    &crt,
                ],
            )
        }
    }
    (dir.join(crt), dir.join(key))
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A line of the key's base64 body, distinctive enough to grep for.
fn key_line(key: &Path) -> String {
    let text = std::fs::read_to_string(key).unwrap();
    text.lines().nth(2).unwrap().to_string()
}

fn cluster_names(s: &Server) -> Vec<String> {
    s.lksctl_json(&["cluster", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

fn cluster<'a>(list: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("cluster {name} in {list}"))
}

#[test]
fn clusters_get_a_generated_or_imported_ca_and_refused_imports_store_nothing() {
    let server = Server::start();
    let pem = a_created_cluster_gets_a_generated_ca_shown_as_pem(&server);

    // One without the other: refused before any RPC.
    let dir = server.work_dir().to_path_buf();
    a_half_or_garbage_import_is_refused_before_any_rpc(&server, &dir);
    the_api_server_is_set_checked_and_cleared_and_a_ca_never_replaced(&server, &pem);

    if !have_openssl() {
        eprintln!("openssl is not installed: imports of openssl-made CAs not tested here");
        assert_eq!(cluster_names(&server), ["gen"]);
        return;
    }
    the_generated_ca_is_a_ca(&pem);

    let (rsa_crt, rsa_key) = make_ca(&dir, "rsa", "rsa");
    let (ec_crt, ec_key) = make_ca(&dir, "ec", "ec");
    let (leaf_crt, leaf_key) = make_ca(&dir, "leaf", "leaf");
    rsa_and_ec_cas_are_imported_exactly(&server, (&rsa_crt, &rsa_key), (&ec_crt, &ec_key));
    refused_imports_store_nothing(
        &server,
        (&rsa_crt, &rsa_key),
        (&ec_crt, &ec_key),
        (&leaf_crt, &leaf_key),
    );

    for key in [&rsa_key, &ec_key] {
        let line = key_line(key);
        assert!(!server.log().contains(&line), "CA key bytes in the server log");
    }
}

/// `cluster create` generates a CA: listed with its hash, printed as PEM
/// only; the list keeps its old fields. Returns the PEM.
fn a_created_cluster_gets_a_generated_ca_shown_as_pem(server: &Server) -> String {
    let out = server.lksctl_ok(&["cluster", "create", "gen"]);
    assert!(
        out.starts_with("cluster gen created (CA generated, sha256:"),
        "{out}"
    );
    let pem = server.lksctl_ok(&["cluster", "ca", "gen"]);
    assert!(
        pem.starts_with("-----BEGIN CERTIFICATE-----\n"),
        "PEM only: {pem}"
    );
    assert!(
        pem.trim_end().ends_with("-----END CERTIFICATE-----"),
        "PEM only: {pem}"
    );
    let list = server.lksctl_json(&["cluster", "list"]);
    let generated = cluster(&list, "gen");
    assert_eq!(generated["has_ca"], true, "{generated}");
    assert!(
        generated["ca_cert_hash"].as_str().unwrap().starts_with("sha256:"),
        "{generated}"
    );
    assert!(generated["api_server"].is_null(), "{generated}");
    assert!(
        generated.get("maintenance_windows").is_some(),
        "old fields stay: {generated}"
    );
    let table = server.lksctl_ok(&["cluster", "list"]);
    assert!(
        table.starts_with("NAME") && table.contains("API-SERVER") && table.contains("CA"),
        "{table}"
    );

    pem
}

/// A CA certificate without its key, and garbage for both.
fn a_half_or_garbage_import_is_refused_before_any_rpc(server: &Server, dir: &Path) {
    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "garbage\n").unwrap();
    let err = one_line_error(
        &server.lksctl(&["cluster", "create", "half", "--ca-cert", path(&garbage)]),
        "a CA certificate without its key",
    );
    assert!(err.contains("--ca-key"), "{err}");
    let err = one_line_error(
        &server.lksctl(&[
            "cluster",
            "create",
            "junk",
            "--ca-cert",
            path(&garbage),
            "--ca-key",
            path(&garbage),
        ]),
        "garbage",
    );
    assert!(err.contains("CA key") || err.contains("CA certificate"), "{err}");
}

/// The API server: set, refused when not https, cleared. A CA is never
/// replaced; maintenance windows and `cluster certs` work as before.
fn the_api_server_is_set_checked_and_cleared_and_a_ca_never_replaced(server: &Server, pem: &str) {
    let out = server.lksctl_ok(&["cluster", "set", "gen", "--api-server", "https://10.0.0.1:6443"]);
    assert!(out.contains("API server https://10.0.0.1:6443"), "{out}");
    let list = server.lksctl_json(&["cluster", "list"]);
    assert_eq!(cluster(&list, "gen")["api_server"], "https://10.0.0.1:6443");
    let err = one_line_error(
        &server.lksctl(&["cluster", "set", "gen", "--api-server", "http://10.0.0.1:6443"]),
        "a plain http API server",
    );
    assert!(err.contains("https://"), "{err}");
    server.lksctl_ok(&["cluster", "set", "gen", "--no-api-server"]);
    let list = server.lksctl_json(&["cluster", "list"]);
    assert!(cluster(&list, "gen")["api_server"].is_null());
    // A CA is never replaced.
    let err = one_line_error(
        &server.lksctl(&["cluster", "set", "gen", "--generate-ca"]),
        "a second CA",
    );
    assert!(err.contains("already has a CA"), "{err}");
    assert_eq!(
        server.lksctl_ok(&["cluster", "ca", "gen"]),
        pem,
        "the CA is unchanged"
    );
    // Maintenance windows still work as before.
    let out = server.lksctl_ok(&[
        "cluster",
        "set",
        "gen",
        "--maintenance-window",
        "Sat 02:00-06:00 UTC",
    ]);
    assert!(out.contains("maintenance windows"), "{out}");
    assert_eq!(
        server.lksctl_json(&["cluster", "certs", "gen"]),
        serde_json::json!([])
    );
    let err = one_line_error(
        &server.lksctl(&["cluster", "certs", "nope"]),
        "certs of no cluster",
    );
    assert!(err.contains("does not exist"), "{err}");
}

/// openssl reads the generated CA as a CA named after its cluster.
fn the_generated_ca_is_a_ca(pem: &str) {
    let info = Command::new("openssl")
        .args(["x509", "-noout", "-text"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write as _;
            c.stdin.take().unwrap().write_all(pem.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(text.contains("CA:TRUE") && text.contains("gen-ca"), "{text}");
}

/// An RSA CA (with its API server) and an ECDSA CA are imported: `cluster
/// ca` prints exactly the imported certificate.
fn rsa_and_ec_cas_are_imported_exactly(server: &Server, rsa: (&Path, &Path), ec: (&Path, &Path)) {
    let ((rsa_crt, rsa_key), (ec_crt, ec_key)) = (rsa, ec);
    let out = server.lksctl_ok(&[
        "cluster",
        "create",
        "kube",
        "--ca-cert",
        path(rsa_crt),
        "--ca-key",
        path(rsa_key),
        "--api-server",
        "https://kube.example:6443",
    ]);
    assert!(
        out.starts_with("cluster kube created (CA imported, sha256:"),
        "{out}"
    );
    assert_eq!(
        server.lksctl_ok(&["cluster", "ca", "kube"]),
        std::fs::read_to_string(rsa_crt).unwrap(),
        "exactly the imported certificate"
    );
    server.lksctl_ok(&[
        "cluster",
        "create",
        "ecc",
        "--ca-cert",
        path(ec_crt),
        "--ca-key",
        path(ec_key),
    ]);
    assert_eq!(
        server.lksctl_ok(&["cluster", "ca", "ecc"]),
        std::fs::read_to_string(ec_crt).unwrap()
    );
    let list = server.lksctl_json(&["cluster", "list"]);
    assert_eq!(cluster(&list, "kube")["api_server"], "https://kube.example:6443");
}

/// A key of another CA, a leaf certificate and a key as certificate are
/// refused and store nothing; an imported CA is never replaced.
fn refused_imports_store_nothing(
    server: &Server,
    rsa: (&Path, &Path),
    ec: (&Path, &Path),
    leaf: (&Path, &Path),
) {
    let ((rsa_crt, rsa_key), (ec_crt, ec_key), (leaf_crt, leaf_key)) = (rsa, ec, leaf);
    for (name, crt, key, want) in [
        ("mismatch", &rsa_crt, &ec_key, "does not belong"),
        ("notca", &leaf_crt, &leaf_key, "not a CA"),
        ("keyascert", &rsa_key, &rsa_key, "no PEM certificate"),
    ] {
        let err = one_line_error(
            &server.lksctl(&[
                "cluster",
                "create",
                name,
                "--ca-cert",
                path(crt),
                "--ca-key",
                path(key),
            ]),
            name,
        );
        assert!(err.contains(want), "{name}: {err}");
    }
    assert_eq!(
        cluster_names(server),
        ["ecc", "gen", "kube"],
        "nothing stored for a refusal"
    );

    // A cluster made before CAs can only get one once (here: `gen` has one).
    let err = one_line_error(
        &server.lksctl(&[
            "cluster",
            "set",
            "kube",
            "--ca-cert",
            path(ec_crt),
            "--ca-key",
            path(ec_key),
        ]),
        "replacing an imported CA",
    );
    assert!(err.contains("already has a CA"), "{err}");
}

#[test]
fn with_an_encryption_key_the_ca_key_never_reaches_etcd_in_clear() {
    if !have_openssl() {
        eprintln!("openssl is not installed: skipped");
        return;
    }
    let etcd = Etcd::start();
    let work = tempfile::tempdir().unwrap();
    let seal = work.path().join("etcd.key");
    std::fs::write(&seal, "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n").unwrap();
    std::fs::set_permissions(&seal, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let server = etcd.replica("/lks-ca/", &["--encryption-key-file", path(&seal)]);
    let (crt, key) = make_ca(work.path(), "tenant", "rsa");
    server.lksctl_ok(&[
        "cluster",
        "create",
        "t",
        "--ca-cert",
        path(&crt),
        "--ca-key",
        path(&key),
    ]);
    server.lksctl_ok(&["cluster", "create", "g"]);
    assert_eq!(
        server.lksctl_ok(&["cluster", "ca", "t"]),
        std::fs::read_to_string(&crt).unwrap()
    );
    let line = key_line(&key);
    let mut files = 0;
    let mut stack = vec![etcd.data_dir()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                files += 1;
                let bytes = std::fs::read(&p).unwrap();
                assert!(
                    !bytes.windows(line.len()).any(|w| w == line.as_bytes()),
                    "CA key bytes in clear in {}",
                    p.display()
                );
                assert!(
                    !bytes.windows(11).any(|w| w == b"PRIVATE KEY"),
                    "a PEM private key in clear in {}",
                    p.display()
                );
            }
        }
    }
    assert!(files > 0, "etcd's data dir was read");
    assert!(!server.log().contains(&line), "CA key bytes in the server log");
}
