//! A throwaway etcd on loopback (Debian's etcd-server), for the tests of
//! this crate and, with the `testing` feature, of the server's modules that
//! run on etcd.
// Test support: a step that fails panics the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use etcd_client::PutOptions;

use crate::{EtcdConfig, EtcdStore};

/// A throwaway etcd on loopback (Debian's etcd-server), killed on drop.
pub struct TestEtcd {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl TestEtcd {
    /// Starts one on two loopback ports `port` picks (the tests pass the
    /// end-to-end harness's picker, `lks_e2e::free_addr`, which this crate
    /// does not link outside its own tests).
    pub fn start_with(port: impl Fn() -> u16) -> TestEtcd {
        let (client, peer) = (port(), port());
        let dir = tempfile::tempdir().unwrap();
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = std::process::Command::new(std::env::var("LKS_ETCD").unwrap_or_else(|_| "etcd".into()))
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args(["--name", "t", "--initial-cluster", &format!("t={peer_url}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start etcd (Debian's etcd-server; bash scripts/setup.sh installs it)");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
            assert!(std::time::Instant::now() < deadline, "etcd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        TestEtcd {
            child,
            url,
            _dir: dir,
        }
    }

    /// The client URL etcd listens on.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A store for `replica`, registered as a live replica (as
    /// `replicas::run_lease` does) so that its streams count as connected.
    pub async fn store(&self, replica: &str) -> EtcdStore {
        let cfg = EtcdConfig {
            endpoints: vec![self.url.clone()],
            prefix: "/test/".into(),
            ..Default::default()
        };
        let s = EtcdStore::connect(&cfg, replica).await.unwrap();
        let id = s.client.lease_client().grant(60, None).await.unwrap().id();
        s.client
            .kv_client()
            .put(
                s.key(&format!("replicas/{replica}")),
                "{}",
                Some(PutOptions::new().with_lease(id)),
            )
            .await
            .unwrap();
        s.set_lease(id);
        s
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
