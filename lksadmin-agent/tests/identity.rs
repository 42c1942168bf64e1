//! `[[certificate]]` and `[[kubeconfig]]` in the engine: keys made on the
//! node, certificates from an issuer (here an in-process CA standing in for
//! the control server's `IssueCertificate`, which the end-to-end tests use
//! for real), installed, healed and renewed like any managed file.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use lks_proto::certs::{CertificateSpec, KubeconfigSpec, Profile};
use lks_proto::manifest::{HealthCheck, Step};
use lks_proto::{BundlePath, BundleState, FileSpec, Manifest, SignedBundle, pb};
use lksadmin_agent::apply::desired::Desired;
use lksadmin_agent::apply::engine::{Engine, EngineConfig, Reporter, StatusSnapshot};
use lksadmin_agent::apply::report::NodeEvent;
use lksadmin_agent::apply::runner::ProcessRunner;
use lksadmin_agent::apply::source::{BlobSource, BlobStream, SourceError};
use lksadmin_agent::clock::SystemClock;
use lksadmin_agent::config::StateDir;
use lksadmin_agent::node::certs::{CertIssuer, IssueError};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType, IsCa,
    Issuer, KeyPair,
};
use tokio::sync::{mpsc, watch};

struct NoBlobs;

impl BlobSource for NoBlobs {
    fn open<'a>(&'a self, _f: &'a FileSpec, _o: u64) -> BoxFuture<'a, Result<BlobStream, SourceError>> {
        Box::pin(async { Err(SourceError("no blobs here".into())) })
    }
}

enum Mode {
    Sign,
    Refuse(&'static str),
    Offline,
}

/// A CA in memory; checks each CSR with the same rule the server applies.
struct FakeIssuer {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
    mode: Mutex<Mode>,
    /// Validity of what it signs, relative to now: (not_before, not_after).
    validity: Mutex<(Duration, Duration)>,
    requests: Mutex<Vec<pb::IssueCertificateRequest>>,
    addresses: Vec<std::net::IpAddr>,
}

impl FakeIssuer {
    fn new() -> Arc<Self> {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "tenant-ca");
        p.distinguished_name = dn;
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_pem = p.self_signed(&key).unwrap().pem();
        Arc::new(FakeIssuer {
            issuer: Issuer::from_ca_cert_pem(&ca_pem, key).unwrap(),
            ca_pem,
            mode: Mutex::new(Mode::Sign),
            validity: Mutex::new((Duration::from_secs(60), Duration::from_secs(3600))),
            requests: Mutex::new(Vec::new()),
            addresses: lksadmin_agent::node::certs::addresses(),
        })
    }

    fn set(&self, m: Mode) {
        *self.mode.lock().unwrap() = m;
    }

    fn calls(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
}

impl CertIssuer for FakeIssuer {
    fn issue(
        &self,
        req: pb::IssueCertificateRequest,
    ) -> BoxFuture<'_, Result<pb::IssueCertificateResponse, IssueError>> {
        Box::pin(async move {
            self.requests.lock().unwrap().push(req.clone());
            match &*self.mode.lock().unwrap() {
                Mode::Sign => {}
                Mode::Refuse(why) => return Err(IssueError::Refused(why.to_string())),
                Mode::Offline => return Err(IssueError::Unavailable("not connected".into())),
            }
            let spec = identity_manifest("1")
                .certificates
                .into_iter()
                .find(|c| c.path.as_str() == req.path)
                .expect("a certificate of the bundle");
            let names = spec.names_for(NODE, &self.addresses).unwrap();
            lks_proto::certs::check_csr(&req.csr_pem, &names)
                .expect("the CSR asks for exactly the profile's names");
            let mut csr = CertificateSigningRequestParams::from_pem(&req.csr_pem).unwrap();
            let (back, ahead) = *self.validity.lock().unwrap();
            let now = time::OffsetDateTime::now_utc();
            csr.params.not_before = now - back;
            csr.params.not_after = now + ahead;
            csr.params.serial_number = Some(rcgen::SerialNumber::from(rand_serial()));
            let cert = csr.signed_by(&self.issuer).unwrap();
            Ok(pb::IssueCertificateResponse {
                certificate_pem: cert.pem(),
                ca_pem: self.ca_pem.clone(),
                api_server: "https://api.tenant-a.example:6443".into(),
                cluster: "tenant-a".into(),
                serial: "01".into(),
                not_after_ms: 0,
            })
        })
    }
}

fn rand_serial() -> Vec<u8> {
    let mut b = [0u8; 16];
    getrandom::getrandom(&mut b).unwrap();
    b[0] &= 0x7f;
    b.to_vec()
}

const NODE: &str = "worker-1";

fn p(s: &str) -> BundlePath {
    BundlePath::new(s).unwrap()
}

fn identity_manifest(version: &str) -> Manifest {
    Manifest {
        name: "kubelet-identity".into(),
        version: version.into(),
        certificates: vec![
            CertificateSpec {
                path: p("/var/lib/kubelet/pki/kubelet-client.crt"),
                key_path: p("/var/lib/kubelet/pki/kubelet-client.key"),
                profile: Profile::KubeletClient,
                common_name: String::new(),
                organizations: Vec::new(),
                dns_names: Vec::new(),
                ip_addresses: Vec::new(),
                ttl: Duration::from_secs(3600),
                ca_path: Some(p("/etc/kubernetes/pki/ca.crt")),
            },
            CertificateSpec {
                path: p("/var/lib/kubelet/pki/kubelet.crt"),
                key_path: p("/var/lib/kubelet/pki/kubelet.key"),
                profile: Profile::KubeletServing,
                common_name: String::new(),
                organizations: Vec::new(),
                dns_names: Vec::new(),
                ip_addresses: Vec::new(),
                ttl: Duration::from_secs(3600),
                ca_path: Some(p("/etc/kubernetes/pki/ca.crt")),
            },
        ],
        kubeconfigs: vec![KubeconfigSpec {
            path: p("/etc/kubernetes/kubelet.conf"),
            certificate: p("/var/lib/kubelet/pki/kubelet-client.crt"),
        }],
        ..Default::default()
    }
}

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    log: PathBuf,
    issuer: Arc<FakeIssuer>,
    engine: Engine,
    generation: u64,
    _status: watch::Receiver<StatusSnapshot>,
    _events: mpsc::Receiver<NodeEvent>,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let (stx, srx) = watch::channel(StatusSnapshot::default());
        let (etx, erx) = mpsc::channel(256);
        let issuer = FakeIssuer::new();
        let engine = Engine::open(
            EngineConfig {
                state_dir: StateDir::new(tmp.path().join("state")),
                root: root.clone(),
                node: NODE.into(),
                trusted: vec![],
                arch: lks_proto::arch::Arch::host(),
            },
            Arc::new(NoBlobs),
            Arc::new(ProcessRunner),
            Arc::new(SystemClock),
            Reporter::new(stx, etx),
        )
        .unwrap()
        .with_issuer(issuer.clone());
        Fixture {
            log: tmp.path().join("steps.log"),
            _tmp: tmp,
            root,
            issuer,
            engine,
            generation: 0,
            _status: srx,
            _events: erx,
        }
    }

    /// The identity bundle with a step that logs and a health check that
    /// fails while `<tmp>/unhealthy` exists.
    fn bundle(&self, version: &str) -> SignedBundle {
        let mut m = identity_manifest(version);
        m.steps = vec![Step {
            name: "restart kubelet".into(),
            run: vec![
                "sh".into(),
                "-c".into(),
                format!("echo restarted >> {}", self.log.display()),
            ],
            timeout: Duration::from_secs(10),
            on_heal: false,
        }];
        m.health = Some(HealthCheck {
            run: vec![
                "sh".into(),
                "-c".into(),
                format!("test ! -e {}", self.log.with_file_name("unhealthy").display()),
            ],
            timeout: Duration::from_secs(5),
            retries: 1,
            interval: Duration::from_millis(10),
        });
        SignedBundle {
            chunks_signature: None,
            manifest: m,
            signature: None,
        }
    }

    async fn desire(&mut self, b: SignedBundle) {
        self.generation += 1;
        let d = pb::DesiredState {
            generation: self.generation,
            bundles: vec![pb::SignedBundle::from(&b)],
            ..Default::default()
        };
        self.engine.accept_desired(&Desired::from(&d)).await.unwrap();
    }

    fn read(&self, path: &str) -> Option<(Vec<u8>, u32)> {
        let full = self.root.join(path.trim_start_matches('/'));
        let bytes = std::fs::read(&full).ok()?;
        Some((
            bytes,
            std::fs::metadata(&full).unwrap().permissions().mode() & 0o7777,
        ))
    }

    fn status(&self) -> (BundleState, String) {
        let r = &self.engine.state().bundles["kubelet-identity"];
        (r.status.state, r.status.message.clone())
    }

    fn restarts(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .count()
    }
}

/// The public key of a PEM certificate and of a PEM private key.
fn cert_spki(pem: &[u8]) -> Vec<u8> {
    let der = lks_proto::identity::pem_certs(std::str::from_utf8(pem).unwrap()).unwrap();
    let (_, c) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
    c.public_key().raw.to_vec()
}

fn key_spki(pem: &[u8]) -> Vec<u8> {
    use rcgen::PublicKeyData;
    KeyPair::from_pem(std::str::from_utf8(pem).unwrap())
        .unwrap()
        .subject_public_key_info()
}

#[tokio::test]
async fn certificates_keys_ca_and_kubeconfig_are_made_on_the_node() {
    let mut f = Fixture::new();
    f.desire(f.bundle("1")).await;
    assert_eq!(f.status(), (BundleState::Applied, String::new()));
    assert_eq!(f.issuer.calls(), 2);
    for (crt, key) in [
        (
            "/var/lib/kubelet/pki/kubelet-client.crt",
            "/var/lib/kubelet/pki/kubelet-client.key",
        ),
        (
            "/var/lib/kubelet/pki/kubelet.crt",
            "/var/lib/kubelet/pki/kubelet.key",
        ),
    ] {
        let (cert, cert_mode) = f.read(crt).unwrap();
        let (k, key_mode) = f.read(key).unwrap();
        assert_eq!((cert_mode, key_mode), (0o644, 0o600));
        assert_eq!(
            cert_spki(&cert),
            key_spki(&k),
            "{crt} is for the key made on the node"
        );
    }
    let (ca, _) = f.read("/etc/kubernetes/pki/ca.crt").unwrap();
    assert_eq!(ca, f.issuer.ca_pem.as_bytes());
    let (kc, kc_mode) = f.read("/etc/kubernetes/kubelet.conf").unwrap();
    let kc = String::from_utf8(kc).unwrap();
    assert_eq!(kc_mode, 0o600);
    assert!(
        kc.contains("server: \"https://api.tenant-a.example:6443\""),
        "{kc}"
    );
    assert!(
        kc.contains("client-certificate: \"/var/lib/kubelet/pki/kubelet-client.crt\""),
        "{kc}"
    );
    assert!(kc.contains("- name: \"system:node:worker-1\""), "{kc}");
    assert_eq!(f.restarts(), 1);

    // The same version again asks for nothing.
    f.desire(f.bundle("1")).await;
    assert_eq!(f.issuer.calls(), 2);

    // A deleted key comes back from the node's own cache: the same bytes.
    let (key_before, _) = f.read("/var/lib/kubelet/pki/kubelet-client.key").unwrap();
    std::fs::remove_file(f.root.join("var/lib/kubelet/pki/kubelet-client.key")).unwrap();
    let report = f.engine.heal().await.unwrap();
    assert_eq!(report.repaired.len(), 1, "{report:?}");
    assert_eq!(
        f.read("/var/lib/kubelet/pki/kubelet-client.key").unwrap().0,
        key_before
    );
    assert_eq!(f.issuer.calls(), 2, "a repair asks for no certificate");

    // A new version brings new keys; removing the bundle removes them all.
    f.desire(f.bundle("2")).await;
    assert_eq!(f.issuer.calls(), 4);
    assert_ne!(
        f.read("/var/lib/kubelet/pki/kubelet-client.key").unwrap().0,
        key_before
    );
    f.generation += 1;
    let empty = pb::DesiredState {
        generation: f.generation,
        ..Default::default()
    };
    f.engine.accept_desired(&Desired::from(&empty)).await.unwrap();
    for path in [
        "/var/lib/kubelet/pki/kubelet-client.key",
        "/etc/kubernetes/kubelet.conf",
        "/etc/kubernetes/pki/ca.crt",
    ] {
        assert!(f.read(path).is_none(), "{path} left behind");
    }
}

#[tokio::test]
async fn a_refused_certificate_fails_the_bundle_and_installs_nothing() {
    let mut f = Fixture::new();
    f.issuer.set(Mode::Refuse("cluster tenant-a has no CA"));
    f.desire(f.bundle("1")).await;
    let (state, message) = f.status();
    assert_eq!(state, BundleState::Failed);
    assert!(
        message.contains("certificate refused: cluster tenant-a has no CA; asking again at"),
        "{message}"
    );
    assert!(
        std::fs::read_dir(&f.root).unwrap().next().is_none(),
        "nothing is written"
    );
    assert_eq!(f.restarts(), 0);
    // Not asked again before the wait is over.
    f.desire(f.bundle("1")).await;
    assert_eq!(f.issuer.calls(), 1);
}

#[tokio::test]
async fn an_unreachable_issuer_leaves_the_bundle_pending_until_it_answers() {
    let mut f = Fixture::new();
    f.issuer.set(Mode::Offline);
    f.desire(f.bundle("1")).await;
    let (state, message) = f.status();
    assert_eq!(state, BundleState::Pending);
    assert!(message.contains("waiting for a certificate"), "{message}");
    f.issuer.set(Mode::Sign);
    f.desire(f.bundle("1")).await;
    assert_eq!(f.status().0, BundleState::Applied);
}

#[tokio::test]
async fn renewal_replaces_the_pair_and_keeps_the_old_one_when_health_fails() {
    let mut f = Fixture::new();
    // Issued an hour ago, valid ten more minutes: past its renewal point.
    *f.issuer.validity.lock().unwrap() = (Duration::from_secs(3600), Duration::from_secs(600));
    f.desire(f.bundle("1")).await;
    assert_eq!(f.status().0, BundleState::Applied);
    let (cert1, _) = f.read("/var/lib/kubelet/pki/kubelet-client.crt").unwrap();
    let (key1, _) = f.read("/var/lib/kubelet/pki/kubelet-client.key").unwrap();

    f.engine.renew_due().await.unwrap();
    assert_eq!(f.issuer.calls(), 4, "both certificates of the bundle renewed");
    let (cert2, _) = f.read("/var/lib/kubelet/pki/kubelet-client.crt").unwrap();
    let (key2, mode) = f.read("/var/lib/kubelet/pki/kubelet-client.key").unwrap();
    assert_ne!(cert1, cert2);
    assert_ne!(key1, key2);
    assert_eq!(mode, 0o600);
    assert_eq!(cert_spki(&cert2), key_spki(&key2));
    assert_eq!(f.restarts(), 2, "the bundle's steps ran for the new pair");
    assert_eq!(f.status(), (BundleState::Applied, String::new()));

    // The next renewal fails its health check: the pair in use stays.
    std::fs::write(f.log.with_file_name("unhealthy"), b"").unwrap();
    f.engine.renew_due().await.unwrap();
    assert_eq!(f.issuer.calls(), 6);
    assert_eq!(
        f.read("/var/lib/kubelet/pki/kubelet-client.crt").unwrap().0,
        cert2
    );
    assert_eq!(f.read("/var/lib/kubelet/pki/kubelet-client.key").unwrap().0, key2);
    let (state, message) = f.status();
    assert_eq!(state, BundleState::Applied, "{message}");
    assert!(message.contains("certificate renewal rolled back"), "{message}");
    // Not again right away.
    f.engine.renew_due().await.unwrap();
    assert_eq!(f.issuer.calls(), 6);

    // A certificate not yet due is left alone.
    let mut g = Fixture::new();
    g.desire(g.bundle("1")).await;
    g.engine.renew_due().await.unwrap();
    assert_eq!(g.issuer.calls(), 2);
}
