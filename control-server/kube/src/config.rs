//! The kubeconfig a cluster is given for its tenant API (`lksctl cluster
//! set NAME --kubeconfig FILE`), checked before it is stored.
//!
//! The server runs in kube0 with access to every tenant, so a kubeconfig is
//! held to what the server can use without trusting its author with
//! anything else:
//! - credentials inline only: a bearer token, or a client certificate and
//!   key as data. No `exec` or `auth-provider` plugin (a command the server
//!   would run), no `tokenFile`, `client-certificate` or `client-key` path
//!   (a file the server would read), no basic auth, no impersonation;
//! - the tenant API's CA inline (`certificate-authority-data`), and never
//!   `insecure-skip-tls-verify`: the server pins the tenant's CA;
//! - an `https://` server; no proxy.
//!
//! What is stored is the current context alone, rewritten as JSON (which
//! is YAML): the cluster, the user and nothing else of the file.

use base64::Engine as _;
use kube::config::{Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};
use secrecy::ExposeSecret as _;

/// Largest kubeconfig accepted; a ServiceAccount's is ~3 KiB.
pub const MAX_KUBECONFIG: usize = 64 * 1024;

/// Why a kubeconfig is refused; each one line an operator can act on.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("kubeconfig is larger than 64 KiB")]
    TooLarge,
    #[error("not a kubeconfig: {0}")]
    Parse(String),
    #[error("kubeconfig has no current-context: set one (kubectl config use-context)")]
    NoCurrentContext,
    #[error("kubeconfig: {what} {name:?} (of the current context) is not in the file")]
    Missing { what: &'static str, name: String },
    #[error("kubeconfig: {0}")]
    Refused(String),
}

/// A checked kubeconfig: one cluster, one user, one context.
#[derive(Clone)]
pub struct TenantKubeconfig {
    kubeconfig: Kubeconfig,
    /// The tenant API server's URL.
    pub server: String,
    /// The user's name in the file, and how it authenticates ("token" or
    /// "client certificate").
    pub user: String,
    pub auth: &'static str,
}

impl std::fmt::Debug for TenantKubeconfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantKubeconfig")
            .field("server", &self.server)
            .field("user", &self.user)
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

fn refused(why: impl Into<String>) -> KubeconfigError {
    KubeconfigError::Refused(why.into())
}

impl TenantKubeconfig {
    /// Checks `text` (YAML or JSON) and keeps its current context only.
    pub fn check(text: &str) -> Result<TenantKubeconfig, KubeconfigError> {
        if text.len() > MAX_KUBECONFIG {
            return Err(KubeconfigError::TooLarge);
        }
        let kc = Kubeconfig::from_yaml(text).map_err(|e| KubeconfigError::Parse(one_line(&e.to_string())))?;
        let current = kc
            .current_context
            .clone()
            .filter(|c| !c.is_empty())
            .ok_or(KubeconfigError::NoCurrentContext)?;
        let missing = |what: &'static str, name: &str| KubeconfigError::Missing {
            what,
            name: name.to_string(),
        };
        let ctx = kc
            .contexts
            .iter()
            .find(|c| c.name == current)
            .ok_or_else(|| missing("context", &current))?;
        let c = ctx.context.clone().ok_or_else(|| missing("context", &current))?;
        let user_name = c
            .user
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| refused(format!("context {current:?} names no user")))?;
        let cluster = kc
            .clusters
            .iter()
            .find(|n| n.name == c.cluster)
            .ok_or_else(|| missing("cluster", &c.cluster))?;
        let user = kc
            .auth_infos
            .iter()
            .find(|n| n.name == user_name)
            .ok_or_else(|| missing("user", &user_name))?;
        let server = check_cluster(cluster)?;
        let auth = check_user(user)?;
        let kubeconfig = Kubeconfig {
            current_context: Some(current.clone()),
            contexts: vec![NamedContext {
                name: current,
                context: Some(kube::config::Context {
                    cluster: c.cluster.clone(),
                    user: Some(user_name.clone()),
                    ..Default::default()
                }),
                other: Default::default(),
            }],
            clusters: vec![cluster.clone()],
            auth_infos: vec![user.clone()],
            api_version: Some("v1".into()),
            kind: Some("Config".into()),
            ..Default::default()
        };
        Ok(TenantKubeconfig {
            kubeconfig,
            server,
            user: user_name,
            auth,
        })
    }

    /// The kubeconfig as it is stored: JSON of the current context only.
    pub fn to_text(&self) -> String {
        // A Kubeconfig is maps, strings and numbers: it always serialises.
        serde_json::to_string(&self.kubeconfig).unwrap_or_default()
    }

    /// The parsed kubeconfig, for building a client.
    pub fn kubeconfig(&self) -> &Kubeconfig {
        &self.kubeconfig
    }
}

fn check_cluster(n: &NamedCluster) -> Result<String, KubeconfigError> {
    let name = &n.name;
    let c = n
        .cluster
        .as_ref()
        .ok_or_else(|| refused(format!("cluster {name:?} is empty")))?;
    let server = c
        .server
        .clone()
        .ok_or_else(|| refused(format!("cluster {name:?} has no server")))?;
    let uri: http::Uri = server
        .parse()
        .map_err(|e| refused(format!("cluster {name:?}: server {server:?} is not a URL ({e})")))?;
    if uri.scheme_str() != Some("https") || uri.host().is_none_or(str::is_empty) {
        return Err(refused(format!(
            "cluster {name:?}: server {server:?} must be an https:// URL with a host"
        )));
    }
    if c.insecure_skip_tls_verify == Some(true) {
        return Err(refused(format!(
            "cluster {name:?} sets insecure-skip-tls-verify: the server verifies the tenant API against its CA; give certificate-authority-data"
        )));
    }
    if c.certificate_authority.is_some() {
        return Err(refused(format!(
            "cluster {name:?} names a CA file (certificate-authority): inline it as certificate-authority-data (kubectl config view --raw --flatten)"
        )));
    }
    let ca = c.certificate_authority_data.as_deref().ok_or_else(|| {
        refused(format!(
            "cluster {name:?} has no certificate-authority-data: the server pins the tenant API's CA"
        ))
    })?;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(ca.trim())
        .map_err(|e| {
            refused(format!(
                "cluster {name:?}: certificate-authority-data is not base64 ({e})"
            ))
        })?;
    let pem = String::from_utf8_lossy(&pem);
    if lks_proto::identity::pem_certs(&pem).map_or(true, |c| c.is_empty()) {
        return Err(refused(format!(
            "cluster {name:?}: certificate-authority-data holds no PEM certificate"
        )));
    }
    if c.proxy_url.is_some() {
        return Err(refused(format!(
            "cluster {name:?} sets proxy-url: the server dials the tenant API directly"
        )));
    }
    Ok(server)
}

fn check_user(n: &NamedAuthInfo) -> Result<&'static str, KubeconfigError> {
    let name = &n.name;
    let u = n
        .auth_info
        .as_ref()
        .ok_or_else(|| refused(format!("user {name:?} is empty")))?;
    let no = |what: &str, why: &str| refused(format!("user {name:?} uses {what}: {why}"));
    if u.exec.is_some() {
        return Err(no(
            "an exec plugin",
            "the server runs no command from a kubeconfig; use a ServiceAccount token (packaging/kubernetes/tenant/README.md)",
        ));
    }
    if u.auth_provider.is_some() {
        return Err(no(
            "an auth-provider",
            "use a ServiceAccount token (packaging/kubernetes/tenant/README.md)",
        ));
    }
    for (set, what) in [
        (u.token_file.is_some(), "tokenFile"),
        (u.client_certificate.is_some(), "client-certificate (a file)"),
        (u.client_key.is_some(), "client-key (a file)"),
    ] {
        if set {
            return Err(no(
                what,
                "the server reads no file named by a kubeconfig; inline it (kubectl config view --raw --flatten)",
            ));
        }
    }
    if u.username.is_some() || u.password.is_some() {
        return Err(no("basic authentication", "Kubernetes removed it; use a token"));
    }
    if u.impersonate.is_some() || u.impersonate_groups.is_some() || u.impersonate_uid.is_some() {
        return Err(no("impersonation", "give the credential of the identity itself"));
    }
    let token = u
        .token
        .as_ref()
        .is_some_and(|t| !t.expose_secret().trim().is_empty());
    let cert = u.client_certificate_data.is_some();
    let key = u.client_key_data.is_some();
    match (token, cert, key) {
        (true, false, false) => Ok("token"),
        (false, true, true) => Ok("client certificate"),
        (true, _, _) => Err(refused(format!(
            "user {name:?} has a token and a client certificate: give one"
        ))),
        (false, true, false) | (false, false, true) => Err(refused(format!(
            "user {name:?}: client-certificate-data and client-key-data go together"
        ))),
        (false, false, false) => Err(refused(format!(
            "user {name:?} has no credential: give a token or client-certificate-data and client-key-data"
        ))),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_data() -> String {
        // A real certificate: pem_certs parses the DER.
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .self_signed(&key)
            .unwrap();
        base64::engine::general_purpose::STANDARD.encode(cert.pem())
    }

    fn kubeconfig(cluster_extra: &str, user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: lks@t\ncontexts:\n- name: lks@t\n  context: {{cluster: t, user: lks}}\n- name: other\n  context: {{cluster: t, user: other}}\nclusters:\n- name: t\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority-data: {}\n{cluster_extra}users:\n- name: lks\n  user:\n{user}- name: other\n  user:\n    exec: {{command: /bin/sh, apiVersion: client.authentication.k8s.io/v1}}\n",
            ca_data()
        )
    }

    #[test]
    fn a_token_kubeconfig_is_kept_to_its_current_context() {
        let k = TenantKubeconfig::check(&kubeconfig("", "    token: abc.def\n")).unwrap();
        assert_eq!(k.server, "https://10.0.0.1:6443");
        assert_eq!(k.user, "lks");
        assert_eq!(k.auth, "token");
        let text = k.to_text();
        assert!(
            !text.contains("exec"),
            "the other context's user is dropped: {text}"
        );
        assert!(!text.contains("other"), "{text}");
        // What is stored checks again, unchanged.
        let again = TenantKubeconfig::check(&text).unwrap();
        assert_eq!(again.to_text(), text);
        assert!(text.contains("abc.def"));
        assert!(
            !format!("{k:?}").contains("abc.def"),
            "Debug never shows the token"
        );
    }

    #[test]
    fn client_certificate_data_is_accepted_as_a_pair() {
        let k = TenantKubeconfig::check(&kubeconfig(
            "",
            "    client-certificate-data: Y2VydA==\n    client-key-data: a2V5\n",
        ))
        .unwrap();
        assert_eq!(k.auth, "client certificate");
        let e =
            TenantKubeconfig::check(&kubeconfig("", "    client-certificate-data: Y2VydA==\n")).unwrap_err();
        assert!(e.to_string().contains("go together"), "{e}");
    }

    #[test]
    fn what_the_server_must_not_run_read_or_skip_is_refused() {
        let token = "    token: abc\n";
        for (cluster, user, says) in [
            (
                "",
                "    exec: {command: aws, apiVersion: client.authentication.k8s.io/v1}\n",
                "exec plugin",
            ),
            ("", "    auth-provider: {name: oidc}\n", "auth-provider"),
            ("", "    tokenFile: /etc/shadow\n", "tokenFile"),
            (
                "",
                "    client-certificate: /a.crt\n    client-key: /a.key\n",
                "a file",
            ),
            ("", "    username: a\n    password: b\n", "basic"),
            ("", "    token: abc\n    as: admin\n", "impersonation"),
            ("", "    {}\n", "no credential"),
            (
                "    insecure-skip-tls-verify: true\n",
                token,
                "insecure-skip-tls-verify",
            ),
            ("    certificate-authority: /etc/ca.crt\n", token, "CA file"),
            ("    proxy-url: http://proxy:3128\n", token, "proxy-url"),
        ] {
            let e = TenantKubeconfig::check(&kubeconfig(cluster, user)).unwrap_err();
            let line = e.to_string();
            assert!(line.contains(says), "{cluster}{user}: {line}");
            assert_eq!(line.lines().count(), 1, "{line}");
        }
    }

    #[test]
    fn the_server_must_be_https_with_a_pinned_ca() {
        let good = kubeconfig("", "    token: abc\n");
        let http = good.replace("https://10.0.0.1:6443", "http://10.0.0.1:6443");
        assert!(
            TenantKubeconfig::check(&http)
                .unwrap_err()
                .to_string()
                .contains("https://")
        );
        let no_ca = good
            .lines()
            .filter(|l| !l.contains("certificate-authority-data"))
            .collect::<Vec<_>>()
            .join("\n");
        let e = TenantKubeconfig::check(&no_ca).unwrap_err().to_string();
        assert!(e.contains("certificate-authority-data"), "{e}");
        // "not a cert", base64: a value, but no certificate in it.
        let not_pem = good.replacen(
            "certificate-authority-data: ",
            "certificate-authority-data: bm90IGEgY2VydA== #",
            1,
        );
        let e = TenantKubeconfig::check(&not_pem).unwrap_err().to_string();
        assert!(e.contains("no PEM certificate"), "{e}");
    }

    #[test]
    fn malformed_or_incomplete_files_are_one_clear_line() {
        for (text, says) in [
            ("{", "not a kubeconfig"),
            ("apiVersion: v1\nkind: Config\n", "no current-context"),
            (
                "apiVersion: v1\nkind: Config\ncurrent-context: x\n",
                "context \"x\"",
            ),
        ] {
            let e = TenantKubeconfig::check(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
            assert_eq!(e.lines().count(), 1);
        }
        let big = "#".repeat(MAX_KUBECONFIG + 1);
        assert!(matches!(
            TenantKubeconfig::check(&big),
            Err(KubeconfigError::TooLarge)
        ));
    }
}
