//! The server offers the agent `.deb` (`--agent-package`) over HTTPS on its
//! gRPC port, for `lksctl token create --cloud-init` user-data to download
//! with the CA it carries: no client certificate, only the packages given,
//! the bytes `token create` reported, and a clear refusal of bad files at
//! start with nothing created.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use lks_e2e::server::Server;
use lks_e2e::{bin, one_line_error, run};
use lks_proto::Digest;

/// A file that passes the server's check: the `ar` magic and the first
/// member name of every .deb, then `body`.
fn fake_deb(dir: &Path, name: &str, body: &[u8]) -> PathBuf {
    let mut bytes = b"!<arch>\ndebian-binary   ".to_vec();
    bytes.extend_from_slice(body);
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn payload(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// An HTTPS client that trusts only `ca_pem` and has no client certificate.
fn https_client(ca_pem: &str) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .https_only(true)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_server_serves_its_agent_packages_to_whoever_trusts_its_ca() {
    let files = tempfile::tempdir().unwrap();
    let amd64 = fake_deb(
        files.path(),
        "lksadmin-agent_1.0.0-1_amd64.deb",
        &payload(1, 300_000),
    );
    let arm64 = fake_deb(
        files.path(),
        "lksadmin-agent_1.0.0-1_arm64.deb",
        &payload(2, 1000),
    );
    let amd64_bytes = std::fs::read(&amd64).unwrap();
    let mut server = Server::start_with(&[
        "--agent-package",
        arm64.to_str().unwrap(),
        "--agent-package",
        amd64.to_str().unwrap(),
    ]);
    server.create_cluster("tenant-a");

    let (url, ca) = token_create_reports_the_packages_and_the_ca(&server, &amd64_bytes);

    // Anyone who trusts the CA downloads it; no client certificate needed.
    let http = https_client(&ca);
    anyone_who_trusts_the_ca_downloads_it(&http, &url, &amd64_bytes).await;
    only_the_packages_are_served(&http, &server, &url, &amd64_bytes).await;

    // A client that does not trust the CA gets no package.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let stranger = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .build()
        .unwrap();
    assert!(stranger.get(&url).send().await.is_err());

    let metrics = server.http_get("/metrics");
    assert!(
        metrics.contains("lks_agent_package_requests_total{result=\"ok\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "lks_agent_package_bytes_served_total {}",
            amd64_bytes.len()
        )),
        "{metrics}"
    );

    // The served bytes were imported at start: replacing the file changes
    // nothing until the server is restarted with it; then the same URL
    // serves the new package (user-data made earlier stays valid).
    let newer = payload(3, 5000);
    fake_deb(files.path(), "lksadmin-agent_1.0.0-1_amd64.deb", &newer);
    let resp = http.get(&url).send().await.unwrap();
    assert_eq!(resp.bytes().await.unwrap().as_ref(), amd64_bytes.as_slice());
    let v2 = fake_deb(files.path(), "lksadmin-agent_1.1.0-1_amd64.deb", &newer);
    server.set_args(&["--agent-package", v2.to_str().unwrap()]);
    server.restart();
    let resp = http.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let got = resp.bytes().await.unwrap();
    assert_eq!(got.as_ref(), std::fs::read(&v2).unwrap().as_slice());
    let j = server.lksctl_json(&["token", "create", "--cluster", "tenant-a"]);
    assert_eq!(j["agent_packages"][0]["version"], "1.1.0-1", "{j}");
    assert_eq!(j["agent_packages"].as_array().unwrap().len(), 1, "{j}");
}

/// token create reports the packages, sorted by architecture, and the CA.
/// Returns the amd64 package's URL and the CA.
fn token_create_reports_the_packages_and_the_ca(server: &Server, amd64_bytes: &[u8]) -> (String, String) {
    let j = server.lksctl_json(&["token", "create", "--cluster", "tenant-a"]);
    let pkgs = j["agent_packages"].as_array().unwrap();
    assert_eq!(pkgs.len(), 2, "{j}");
    let p = &pkgs[0];
    assert_eq!(p["arch"], "amd64");
    assert_eq!(p["version"], "1.0.0-1");
    assert_eq!(p["file_name"], "lksadmin-agent_1.0.0-1_amd64.deb");
    assert_eq!(p["digest"], Digest::of(amd64_bytes).to_string());
    assert_eq!(p["size"], amd64_bytes.len() as u64);
    let url = format!("{}/v1/agent-package/amd64", server.url());
    assert_eq!(p["url"], url.as_str());
    assert_eq!(pkgs[1]["arch"], "arm64");
    let ca = j["ca_cert_pem"].as_str().unwrap();
    assert_eq!(ca, server.admin_conf().ca_cert);

    (url, ca.to_string())
}

/// The package, its type, ETag and length, with no client certificate.
async fn anyone_who_trusts_the_ca_downloads_it(http: &reqwest::Client, url: &str, amd64_bytes: &[u8]) {
    let resp = http.get(url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "application/vnd.debian.binary-package"
    );
    assert_eq!(
        resp.headers()["etag"],
        format!("\"{}\"", Digest::of(amd64_bytes)).as_str()
    );
    assert_eq!(resp.bytes().await.unwrap().as_ref(), amd64_bytes);
    let head = http.head(url).send().await.unwrap();
    assert_eq!(head.status(), 200);
    assert_eq!(
        head.headers()["content-length"],
        amd64_bytes.len().to_string().as_str()
    );
}

/// Only the packages: other architectures, other paths (the blob store is
/// never reachable by path), other methods are refused.
async fn only_the_packages_are_served(
    http: &reqwest::Client,
    server: &Server,
    url: &str,
    amd64_bytes: &[u8],
) {
    let resp = http
        .get(format!("{}/v1/agent-package/riscv64", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(
        resp.text().await.unwrap(),
        "no agent package for architecture \"riscv64\"; this server offers: amd64, arm64\n"
    );
    let digest = Digest::of(amd64_bytes).hex();
    // Paths outside the prefix reach the gRPC router, which knows no such
    // method; the blob store is never reachable by path.
    for (path, status) in [
        (format!("/v1/agent-package/sha256:{digest}"), Some(404)),
        ("/v1/agent-package/amd64/".to_string(), Some(404)),
        (
            format!("/v1/agent-package/../blobs/sha256/{}/{digest}", &digest[..2]),
            None,
        ),
        (format!("/blobs/sha256/{}/{digest}", &digest[..2]), None),
    ] {
        let resp = http.get(format!("{}{path}", server.url())).send().await.unwrap();
        if let Some(s) = status {
            assert_eq!(resp.status(), s, "{path}");
        }
        let body = resp.bytes().await.unwrap();
        assert!(body.len() < 1000, "{path}: {} bytes", body.len());
    }
    let resp = http.post(url).body("x").send().await.unwrap();
    assert_eq!(resp.status(), 405);
    assert_eq!(resp.headers()["allow"], "GET, HEAD");
}

/// The user-data of `--cloud-init` downloads from the server with the CA
/// it writes, and that CA is the one the join line pins.
#[tokio::test(flavor = "multi_thread")]
async fn cloud_init_user_data_downloads_from_the_server() {
    let files = tempfile::tempdir().unwrap();
    let deb = fake_deb(
        files.path(),
        "lksadmin-agent_1.0.0-1_amd64.deb",
        &payload(4, 4096),
    );
    let server = Server::start_with(&["--agent-package", deb.to_str().unwrap()]);
    server.create_cluster("tenant-a");
    let out = server.lksctl(&["token", "create", "--cluster", "tenant-a", "--cloud-init"]);
    let ud = lks_e2e::ok_stdout(&out, "token create --cloud-init");
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!ud.contains("packages:"), "{ud}");
    assert!(ud.contains("which now offers: amd64 1.0.0-1."), "{ud}");

    // The CA in write_files, decoded from its JSON string.
    let content = ud
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("content: "))
        .expect("write_files content");
    let ca: String = serde_json::from_str(content).unwrap();
    let der = &lks_proto::identity::pem_certs(&ca).unwrap()[0];
    let pin = lks_proto::identity::ca_cert_hash(der).unwrap().to_string();
    assert!(ud.contains(&format!("--ca-cert-hash {pin}")), "{ud}");
    assert!(
        ud.contains(&format!("for s in {}; do if curl ", server.url())),
        "{ud}"
    );
    assert!(ud.contains("\\\"$s/v1/agent-package/$arch\\\""), "{ud}");

    // What curl would fetch on an amd64 VM, with that CA only.
    let got = https_client(&ca)
        .get(format!("{}/v1/agent-package/amd64", server.url()))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(got.as_ref(), std::fs::read(&deb).unwrap().as_slice());

    // --apt and --package-url still choose otherwise.
    let ud = server.lksctl_ok(&[
        "token",
        "create",
        "--cluster",
        "tenant-a",
        "--cloud-init",
        "--apt",
    ]);
    assert!(ud.contains("\npackages:\n  - \"lksadmin-agent\"\n"), "{ud}");
    assert!(!ud.contains("write_files"), "{ud}");
    let e = one_line_error(
        &server.lksctl(&[
            "token",
            "create",
            "--cluster",
            "tenant-a",
            "--cloud-init",
            "--apt",
            "--package-url",
            "https://x/a.deb",
        ]),
        "--apt with --package-url",
    );
    assert!(e.contains("cannot be used with"), "{e}");
}

#[test]
fn bad_agent_packages_are_refused_before_anything_is_created() {
    let files = tempfile::tempdir().unwrap();
    let good = fake_deb(files.path(), "lksadmin-agent_1.0.0-1_amd64.deb", b"x");
    let twice = fake_deb(files.path(), "lksadmin-agent_2.0.0-1_amd64.deb", b"y");
    let misnamed = fake_deb(files.path(), "agent.deb", b"x");
    let text = files.path().join("lksadmin-agent_1.0.0-1_arm64.deb");
    std::fs::write(&text, "not a package\n").unwrap();
    let missing = files.path().join("lksadmin-agent_1.0.0-1_riscv64.deb");

    for (args, what) in [
        (
            vec![&misnamed],
            "the file name must be lksadmin-agent_<version>_<arch>.deb",
        ),
        (vec![&text], "not a Debian package"),
        (vec![&missing], "No such file or directory"),
        (
            vec![&good, &twice],
            "--agent-package given twice for architecture amd64",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut cmd = Command::new(bin("lks-control-server"));
        cmd.arg("--data-dir").arg(&data).args(["--listen", "127.0.0.1:0"]);
        for a in &args {
            cmd.arg("--agent-package").arg(a);
        }
        let e = one_line_error(&run(cmd), what);
        assert!(e.starts_with("error: ") && e.contains(what), "{e}");
        assert!(!data.exists(), "{what}: the data dir was created");
    }
}
