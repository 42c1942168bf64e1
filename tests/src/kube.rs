//! A real tenant control plane on loopback for the Kubernetes tests:
//! Debian's etcd, and kube-apiserver, kube-controller-manager and kubectl
//! of the release pinned in `tests/kube/go.mod`, built from the Go module
//! proxy by `scripts/kube.sh` (which `scripts/setup.sh` runs) into
//! `~/.cache/lksadmin/kube-<version>/bin` (`LKS_KUBE_BIN_DIR` overrides).
//!
//! What runs is what kubeadm would run for a tenant, minus kubelets:
//! client-certificate authentication with an admin in `system:masters`,
//! service-account signing keys, `--authorization-mode=Node,RBAC`, and the
//! controller manager's disruption controller, so a PodDisruptionBudget's
//! status is computed by Kubernetes itself. There are no kubelets: a test
//! that needs Node objects or pod status writes them as a kubelet would
//! (see [`SimulatedKubelet`]), and says so.
//!
//! Everything lives in a temp dir; the processes are killed and the dir
//! removed when the value is dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use base64::Engine;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};

use crate::etcd::Etcd;
use crate::{Proc, free_addr, run, wait_until};

/// The directory of the built control-plane binaries.
pub fn kube_bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LKS_KUBE_BIN_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("LKS_KUBE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").expect("HOME is set");
            Path::new(&home).join(".cache/lksadmin")
        });
    cache
        .join(format!("kube-{}", kube_version().trim_start_matches('v')))
        .join("bin")
}

/// The pinned Kubernetes release (`v1.37.2`), read from `tests/kube/go.mod`
/// so that the module is the one place that names it.
pub fn kube_version() -> String {
    let go_mod = Path::new(env!("CARGO_MANIFEST_DIR")).join("kube/go.mod");
    let text = std::fs::read_to_string(&go_mod).unwrap_or_else(|e| panic!("read {}: {e}", go_mod.display()));
    text.lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("require") && w.next() == Some("k8s.io/kubernetes"))
                .then(|| w.next().map(str::to_string))
                .flatten()
        })
        .unwrap_or_else(|| panic!("{} requires no k8s.io/kubernetes", go_mod.display()))
}

fn kube_bin(name: &str) -> PathBuf {
    let p = kube_bin_dir().join(name);
    assert!(
        p.is_file(),
        "{} not found: build the tenant control plane with `bash scripts/kube.sh` (scripts/setup.sh runs it)",
        p.display()
    );
    p
}

/// A client certificate and key (PEM) signed by the control plane's CA.
pub struct ClientCert {
    pub cert_pem: String,
    pub key_pem: String,
}

/// How a [`KubeControlPlane`] is started, beyond what every test gets.
#[derive(Clone, Debug, Default)]
pub struct KubeOptions {
    /// Record every request in an audit log (`Metadata` level, one JSON
    /// line per request once its response is sent) that
    /// [`KubeControlPlane::audit_events`] reads: who asked what, measured
    /// by the API server itself.
    pub audit: bool,
}

/// etcd, kube-apiserver and kube-controller-manager on loopback.
pub struct KubeControlPlane {
    /// The API server's address (`https://{api}`).
    pub api: SocketAddr,
    /// The cluster CA (PEM): it signed the serving certificate and every
    /// client certificate.
    pub ca_pem: String,
    /// An admin kubeconfig (`system:masters`).
    pub admin_kubeconfig: PathBuf,
    /// The audit log, when [`KubeOptions::audit`] asked for one.
    pub audit_log: Option<PathBuf>,
    issuer: Issuer<'static, KeyPair>,
    // Dropped in this order: the processes before etcd, etcd before the
    // dir they write into.
    kcm: Option<Proc>,
    apiserver: Option<Proc>,
    etcd: Option<Etcd>,
    dir: tempfile::TempDir,
}

impl KubeControlPlane {
    /// Starts etcd, the API server and the controller manager, and returns
    /// once the API server is ready (`/readyz`) and the `default`
    /// ServiceAccount exists (pods can be created).
    pub fn start() -> KubeControlPlane {
        Self::start_with(KubeOptions::default())
    }

    /// [`KubeControlPlane::start`], with `opts`.
    pub fn start_with(opts: KubeOptions) -> KubeControlPlane {
        let dir = tempfile::tempdir().expect("temp dir");
        let pki = dir.path().join("pki");
        std::fs::create_dir_all(&pki).expect("create pki dir");
        let (ca_pem, issuer, files) = generate_pki(&pki);
        let api = free_addr();

        let mut cp = KubeControlPlane {
            api,
            ca_pem,
            admin_kubeconfig: dir.path().join("admin.conf"),
            audit_log: opts.audit.then(|| dir.path().join("audit.log")),
            issuer,
            kcm: None,
            apiserver: None,
            etcd: Some(Etcd::start()),
            dir,
        };
        let admin = cp.client_cert("kubernetes-admin", &["system:masters"]);
        cp.write_kubeconfig(&cp.admin_kubeconfig.clone(), "kubernetes-admin", &admin);
        cp.start_apiserver(&files, &pki);
        cp.start_controller_manager(&files);
        cp
    }

    /// Starts kube-apiserver on etcd, with `files`, RBAC and the Node
    /// authoriser (and an audit log when asked for one), and waits until
    /// it is ready.
    fn start_apiserver(&mut self, files: &PkiFiles, pki: &Path) {
        let api = self.api;
        let etcd_url = self.etcd.as_ref().map(Etcd::url).expect("etcd started");
        let PkiFiles {
            ca_file,
            cert_file,
            key_file,
            sa_private,
            sa_public,
        } = files;
        let write = |name: &str, text: &str| write_pki_file(pki, name, text);

        let mut apiserver = Command::new(kube_bin("kube-apiserver"));
        apiserver
            .arg(format!("--etcd-servers={etcd_url}"))
            .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
            .arg(format!("--secure-port={}", api.port()))
            .arg(format!(
                "--cert-dir={}",
                self.dir.path().join("apiserver").display()
            ))
            .arg(format!("--tls-cert-file={}", cert_file.display()))
            .arg(format!("--tls-private-key-file={}", key_file.display()))
            .arg(format!("--client-ca-file={}", ca_file.display()))
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg(format!("--service-account-key-file={}", sa_public.display()))
            .arg(format!(
                "--service-account-signing-key-file={}",
                sa_private.display()
            ))
            .arg("--service-cluster-ip-range=10.96.0.0/16")
            .arg("--authorization-mode=Node,RBAC")
            .arg("--enable-admission-plugins=NodeRestriction")
            // Loopback is no address for the `kubernetes` Service's
            // endpoints, and no pod here would dial it.
            .arg("--endpoint-reconciler-type=none")
            .arg("--profiling=false")
            .arg("--v=1");
        if let Some(log) = &self.audit_log {
            let policy = write(
                "audit-policy.yaml",
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
            );
            apiserver
                .arg(format!("--audit-policy-file={}", policy.display()))
                .arg(format!("--audit-log-path={}", log.display()))
                .arg("--audit-log-format=json")
                // Written before the response is sent: a request is in the
                // log by the time its client has the answer.
                .arg("--audit-log-mode=blocking")
                .arg("--audit-log-maxsize=0");
        }
        self.apiserver = Some(Proc::spawn("kube-apiserver", apiserver, self.dir.path()));
        self.wait_ready(Duration::from_secs(120));
    }

    /// Starts kube-controller-manager with the controllers the tests lean
    /// on, and waits for the `default` ServiceAccount it makes.
    fn start_controller_manager(&mut self, files: &PkiFiles) {
        let PkiFiles {
            ca_file, sa_private, ..
        } = files;
        // The controller manager with the controllers the tests lean on:
        // `disruption` computes PodDisruptionBudget status, `serviceaccount`
        // makes each namespace's `default` ServiceAccount (pods need it),
        // `serviceaccount-token` fills ServiceAccount token Secrets (the
        // tenant RBAC's `lksadmin-token`).
        // Not `nodelifecycle`: with no kubelet posting leases it would mark
        // every Node Unknown and taint it, on its own schedule.
        let kcm_conf = self.dir.path().join("controller-manager.conf");
        let kcm_cert = self.client_cert("system:kube-controller-manager", &[]);
        self.write_kubeconfig(&kcm_conf, "system:kube-controller-manager", &kcm_cert);
        let mut kcm = Command::new(kube_bin("kube-controller-manager"));
        kcm.arg(format!("--kubeconfig={}", kcm_conf.display()))
            .arg(format!("--authentication-kubeconfig={}", kcm_conf.display()))
            .arg(format!("--authorization-kubeconfig={}", kcm_conf.display()))
            .arg("--controllers=disruption,serviceaccount,serviceaccount-token")
            .arg(format!(
                "--service-account-private-key-file={}",
                sa_private.display()
            ))
            .arg(format!("--root-ca-file={}", ca_file.display()))
            .arg("--leader-elect=false")
            // Each controller with its own ServiceAccount and the roles
            // Kubernetes bootstraps for it, as kubeadm runs it.
            .arg("--use-service-account-credentials=true")
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", free_addr().port()))
            .arg(format!("--cert-dir={}", self.dir.path().join("kcm").display()))
            .arg("--v=1");
        self.kcm = Some(Proc::spawn("kube-controller-manager", kcm, self.dir.path()));
        wait_until(
            Duration::from_secs(60),
            "the controller manager to create the default ServiceAccount",
            || {
                self.kubectl(&["get", "serviceaccount", "default", "-n", "default"])
                    .status
                    .success()
            },
        );
    }

    /// `https://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("https://{}", self.api)
    }

    /// The directory everything of this control plane is written to.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn wait_ready(&mut self, timeout: Duration) {
        let start = std::time::Instant::now();
        loop {
            let out = self.kubectl(&["get", "--raw", "/readyz"]);
            if out.status.success() {
                return;
            }
            if let Some(p) = self.apiserver.as_mut()
                && let Some(st) = p.exited()
            {
                panic!(
                    "kube-apiserver exited ({st}) before it was ready:\n{}",
                    p.log_text()
                );
            }
            assert!(
                start.elapsed() < timeout,
                "kube-apiserver not ready after {timeout:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// A client certificate for `user` in `groups`, signed by the CA.
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> ClientCert {
        let key = KeyPair::generate().expect("client key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("client params");
        p.distinguished_name.push(DnType::CommonName, user);
        for g in groups {
            p.distinguished_name.push(DnType::OrganizationName, *g);
        }
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p.signed_by(&key, &self.issuer).expect("sign client cert");
        ClientCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Writes a kubeconfig for this API server authenticating `user` with
    /// `cert`.
    pub fn write_kubeconfig(&self, path: &Path, user: &str, cert: &ClientCert) {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let auth = format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(&cert.cert_pem),
            b64(&cert.key_pem)
        );
        std::fs::write(path, self.kubeconfig_text(user, &auth))
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// A kubeconfig for this API server authenticating with a bearer token
    /// (a ServiceAccount's, say), as text.
    pub fn token_kubeconfig(&self, user: &str, token: &str) -> String {
        self.kubeconfig_text(user, &format!("    token: {token}\n"))
    }

    fn kubeconfig_text(&self, user: &str, auth: &str) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: tenant\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\ncontexts:\n- name: {user}@tenant\n  context:\n    cluster: tenant\n    user: {user}\ncurrent-context: {user}@tenant\nusers:\n- name: {user}\n  user:\n{auth}",
            self.url()
        )
    }

    /// kubectl of the same release with the admin kubeconfig.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        let mut c = Command::new(kube_bin("kubectl"));
        c.arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
            .arg("--request-timeout=20s")
            .args(args);
        run(c)
    }

    /// kubectl with `stdin` as the manifest (`kubectl apply -f -`, say).
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        use std::io::Write;
        let mut c = Command::new(kube_bin("kubectl"));
        c.arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
            .arg("--request-timeout=20s")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().expect("spawn kubectl");
        child
            .stdin
            .take()
            .expect("kubectl stdin")
            .write_all(stdin.as_bytes())
            .expect("write kubectl stdin");
        child.wait_with_output().expect("wait for kubectl")
    }

    /// `kubectl …`, asserting success; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        crate::ok_stdout(&self.kubectl(args), &format!("kubectl {}", args.join(" ")))
    }

    /// `kubectl … -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let text = self.kubectl_ok(&a);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("kubectl {args:?}: not JSON ({e}): {text}"))
    }

    /// `kubectl apply -f -` of `manifest`, asserting success.
    pub fn apply(&self, manifest: &str) {
        crate::ok_stdout(
            &self.kubectl_stdin(&["apply", "-f", "-"], manifest),
            &format!("kubectl apply of\n{manifest}"),
        );
    }

    /// The audit log's size now: [`KubeControlPlane::audit_events`] from
    /// here reads what came after.
    pub fn audit_mark(&self) -> u64 {
        self.audit_log
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map_or(0, |m| m.len())
    }

    /// The audit events (one JSON object per request) written since `mark`
    /// ([`KubeControlPlane::audit_mark`]); panics without
    /// [`KubeOptions::audit`].
    pub fn audit_events(&self, mark: u64) -> Vec<serde_json::Value> {
        use std::io::{Read, Seek};
        let p = self
            .audit_log
            .as_ref()
            .expect("started without KubeOptions::audit");
        let mut f = std::fs::File::open(p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
        f.seek(std::io::SeekFrom::Start(mark))
            .expect("seek the audit log");
        let mut text = String::new();
        f.read_to_string(&mut text).expect("read the audit log");
        // A line still being written is left for the next read.
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The API server's log so far.
    pub fn apiserver_log(&self) -> String {
        self.apiserver.as_ref().map(Proc::log_text).unwrap_or_default()
    }

    /// Creates namespace `ns` and waits for its `default` ServiceAccount
    /// (pods cannot be created before it exists).
    pub fn create_namespace(&self, ns: &str) {
        self.kubectl_ok(&["create", "namespace", ns]);
        wait_until(
            Duration::from_secs(60),
            &format!("namespace {ns}'s ServiceAccount"),
            || {
                self.kubectl(&["get", "serviceaccount", "default", "-n", ns])
                    .status
                    .success()
            },
        );
    }

    /// The token the token controller writes into Secret `ns/secret` (of
    /// type kubernetes.io/service-account-token), once it is there.
    pub fn service_account_token(&self, ns: &str, secret: &str) -> String {
        let mut token = String::new();
        wait_until(
            Duration::from_secs(60),
            &format!("the token controller to fill {ns}/{secret}"),
            || {
                let s = self.get_json(&["get", "secret", secret, "-n", ns]);
                token = s["data"]["token"].as_str().unwrap_or_default().to_string();
                !token.is_empty()
            },
        );
        base64::engine::general_purpose::STANDARD
            .decode(&token)
            .ok()
            .and_then(|t| String::from_utf8(t).ok())
            .expect("the token Secret holds base64 text")
    }

    /// Applies packaging/kubernetes/tenant/rbac.yaml and returns the
    /// `lksadmin` ServiceAccount's kubeconfig (text) and token, minted as
    /// packaging/kubernetes/tenant/README.md says.
    pub fn lksadmin_kubeconfig(&self) -> (String, String) {
        let rbac = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes/tenant/rbac.yaml");
        let rbac = std::fs::read_to_string(&rbac).unwrap_or_else(|e| panic!("read {}: {e}", rbac.display()));
        self.apply(&rbac);
        let token = self.service_account_token("kube-system", "lksadmin-token");
        (self.token_kubeconfig("lksadmin", &token), token)
    }
}

/// A pod of `app` in `ns` bound to `node` (as if scheduled there),
/// owned by `owner` (kind, uid) when given; labelled as written by the
/// tests' simulated kubelet.
pub fn pod_manifest(ns: &str, name: &str, node: &str, app: &str, owner: Option<(&str, &str)>) -> String {
    let owner = owner
        .map(|(kind, uid)| {
            format!(
                "  ownerReferences:\n  - apiVersion: apps/v1\n    kind: {kind}\n    name: {app}\n    uid: {uid}\n    controller: true\n"
            )
        })
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n    app: {app}\n  annotations:\n    lksadmin.test/written-by: simulated-kubelet\n{owner}spec:\n  nodeName: {node}\n  containers:\n  - name: c\n    image: registry.invalid/pause:1\n"
    )
}

/// Writes Node objects and pod status as a kubelet would: the tests have no
/// kubelet, so this stands in for one, and only where a test says so. It
/// uses the admin credential (a real kubelet's node credential could not
/// create pods for other nodes, which the tests need).
pub struct SimulatedKubelet<'a> {
    pub cp: &'a KubeControlPlane,
    pub node: String,
}

impl<'a> SimulatedKubelet<'a> {
    pub fn new(cp: &'a KubeControlPlane, node: &str) -> Self {
        SimulatedKubelet {
            cp,
            node: node.to_string(),
        }
    }

    /// Registers the Node object, `Ready` as given, reporting
    /// `kubelet_version`.
    pub fn register(&self, ready: bool, kubelet_version: &str) {
        self.cp.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {}\n  labels:\n    kubernetes.io/hostname: {}\n",
            self.node, self.node
        ));
        self.set_ready(ready, kubelet_version);
    }

    /// Posts the node's status: its `Ready` condition and kubelet version.
    pub fn set_ready(&self, ready: bool, kubelet_version: &str) {
        let now = "2026-01-01T00:00:00Z";
        let status = serde_json::json!({
            "status": {
                "conditions": [{
                    "type": "Ready",
                    "status": if ready { "True" } else { "False" },
                    "reason": if ready { "KubeletReady" } else { "KubeletNotReady" },
                    "message": "written by the tests' simulated kubelet",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }],
                "nodeInfo": {
                    "kubeletVersion": kubelet_version,
                    "architecture": "amd64", "operatingSystem": "linux",
                    "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "",
                    "kubeProxyVersion": "", "machineID": "", "osImage": "", "systemUUID": "",
                },
            }
        });
        self.cp.kubectl_ok(&[
            "patch",
            "node",
            &self.node,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ]);
    }
}

/// Marks a pod Running and Ready, as its node's kubelet would (the tests'
/// simulated kubelet); a failure is returned, not asserted, so background
/// threads can call it.
pub fn set_pod_ready(cp: &KubeControlPlane, ns: &str, pod: &str) -> bool {
    let status = serde_json::json!({"status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
    }});
    cp.kubectl(&[
        "patch",
        "pod",
        pod,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ])
    .status
    .success()
}

/// The control plane's files under `pki/`: the CA certificate, the API
/// server's serving pair, the service-account key pair.
struct PkiFiles {
    ca_file: PathBuf,
    cert_file: PathBuf,
    key_file: PathBuf,
    sa_private: PathBuf,
    sa_public: PathBuf,
}

/// Writes `text` to `pki/name`.
fn write_pki_file(pki: &Path, name: &str, text: &str) -> PathBuf {
    let p = pki.join(name);
    std::fs::write(&p, text).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    p
}

/// Generates the cluster CA (its PEM and issuer), the API server's
/// serving certificate and the service-account key, and writes them
/// under `pki`.
fn generate_pki(pki: &Path) -> (String, Issuer<'static, KeyPair>, PkiFiles) {
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kubernetes");
    let ca_pem = ca_params.self_signed(&ca_key).expect("self-sign CA").pem();
    let issuer = Issuer::new(ca_params, ca_key);

    let serving_key = KeyPair::generate().expect("serving key");
    let mut serving = CertificateParams::new(
        [
            "127.0.0.1",
            "localhost",
            "10.96.0.1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ]
        .map(String::from)
        .to_vec(),
    )
    .expect("serving params");
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving
        .signed_by(&serving_key, &issuer)
        .expect("sign serving cert");
    // Service-account tokens: an ECDSA P-256 key, its public half for
    // verifying.
    let sa_key = KeyPair::generate().expect("service-account key");

    let write = |name: &str, text: &str| write_pki_file(pki, name, text);
    let ca_file = write("ca.crt", &ca_pem);
    let cert_file = write("apiserver.crt", &serving_cert.pem());
    let key_file = write("apiserver.key", &serving_key.serialize_pem());
    let sa_private = write("sa.key", &sa_key.serialize_pem());
    let sa_public = write("sa.pub", &sa_key.public_key_pem());
    (
        ca_pem,
        issuer,
        PkiFiles {
            ca_file,
            cert_file,
            key_file,
            sa_private,
            sa_public,
        },
    )
}
