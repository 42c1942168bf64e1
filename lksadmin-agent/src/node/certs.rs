//! The files a node makes for a bundle's `[[certificate]]` and
//! `[[kubeconfig]]` entries: a key made here (it never leaves the node), a
//! CSR for exactly the names the entry's profile gives this node, the
//! certificate the cluster CA signs for it (`IssueCertificate` over the
//! node's own mTLS channel), the CA, and kubeconfigs that point at the pair.
//!
//! The engine installs the results like any other file of the bundle; this
//! module only makes the bytes and decides when a certificate is due for
//! renewal. Asking the server is the [`CertIssuer`] port, which `link/`
//! implements over the node's channel.

use std::net::IpAddr;
use std::time::Duration;

use base64::Engine as _;
use futures::future::BoxFuture;
use lks_proto::certs::{CertNames, CertificateSpec};
use lks_proto::identity::{cert_info, pem_certs};
use lks_proto::pb;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, PublicKeyData, SanType};
use sha2::Digest as _;

/// Why a certificate could not be had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IssueError {
    /// The server could not be asked (not connected, overloaded): try later.
    #[error("{0}")]
    Unavailable(String),
    /// The server (or this node) refused: waiting will not help until
    /// something changes (the bundle, the cluster's CA or API server).
    #[error("{0}")]
    Refused(String),
}

/// Signs CSRs: the control server in production, a fake in tests.
pub trait CertIssuer: Send + Sync {
    fn issue(
        &self,
        req: pb::IssueCertificateRequest,
    ) -> BoxFuture<'_, Result<pb::IssueCertificateResponse, IssueError>>;
}

/// For an engine that is never asked for certificates (tests).
pub struct NoIssuer;

impl CertIssuer for NoIssuer {
    fn issue(
        &self,
        _req: pb::IssueCertificateRequest,
    ) -> BoxFuture<'_, Result<pb::IssueCertificateResponse, IssueError>> {
        Box::pin(async {
            Err(IssueError::Unavailable(
                "this agent has no certificate issuer".into(),
            ))
        })
    }
}

/// A key made here and the CSR for it.
pub struct KeyAndCsr {
    pub key_pem: String,
    pub csr_pem: String,
    /// DER SubjectPublicKeyInfo of the key, to check the certificate.
    pub spki: Vec<u8>,
}

/// Why this node could not ask for a certificate (its names, its key, the
/// CSR), or refuses the one the server issued. The engine prefixes the
/// certificate's path.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The entry's names for this node (the text says which is wrong).
    #[error("{0}")]
    Names(lks_proto::certs::CertNameError),
    #[error("generate a key: {0}")]
    GenerateKey(rcgen::Error),
    #[error("DNS name {name:?}: {error}")]
    DnsName { name: String, error: rcgen::Error },
    #[error("make a CSR: {0}")]
    Csr(rcgen::Error),
    #[error("the issued certificate: {0}")]
    Issued(lks_proto::identity::CertError),
    #[error("expected one certificate, got {0}")]
    NotOne(usize),
    #[error("the issued certificate does not parse: {0}")]
    Parse(x509_parser::nom::Err<x509_parser::error::X509Error>),
    #[error("the issued certificate is not for the key made here")]
    OtherKey,
    #[error("the issued certificate has already expired")]
    Expired,
}

/// Makes a fresh ECDSA P-256 key and a CSR asking for exactly `names`.
pub fn key_and_csr(names: &CertNames) -> Result<KeyAndCsr, CertError> {
    let key = KeyPair::generate().map_err(CertError::GenerateKey)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, names.common_name.as_str());
    if let Some(o) = names.organizations.first() {
        dn.push(DnType::OrganizationName, o.as_str());
    }
    params.distinguished_name = dn;
    for d in &names.dns_names {
        let name = d.clone().try_into().map_err(|error| CertError::DnsName {
            name: d.clone(),
            error,
        })?;
        params.subject_alt_names.push(SanType::DnsName(name));
    }
    for ip in &names.ip_addresses {
        params.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    let csr = params
        .serialize_request(&key)
        .and_then(|c| c.pem())
        .map_err(CertError::Csr)?;
    Ok(KeyAndCsr {
        key_pem: key.serialize_pem(),
        csr_pem: csr,
        spki: key.subject_public_key_info(),
    })
}

/// What the engine needs to know of an issued certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    pub serial: String,
    pub not_before_ms: i64,
    pub not_after_ms: i64,
}

/// Checks a certificate the server returned: one certificate, for our key,
/// valid now. Returns its validity.
pub fn check_issued(cert_pem: &str, spki: &[u8], now_ms: i64) -> Result<Issued, CertError> {
    let ders = pem_certs(cert_pem).map_err(CertError::Issued)?;
    let [der] = ders.as_slice() else {
        return Err(CertError::NotOne(ders.len()));
    };
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(CertError::Parse)?;
    if cert.public_key().raw != spki {
        return Err(CertError::OtherKey);
    }
    let info = cert_info(der).map_err(CertError::Issued)?;
    if info.not_after * 1000 <= now_ms {
        return Err(CertError::Expired);
    }
    Ok(Issued {
        serial: info.serial,
        not_before_ms: info.not_before * 1000,
        not_after_ms: info.not_after * 1000,
    })
}

/// Validity of a certificate PEM (a cached blob), if it parses.
pub fn validity(cert_pem: &[u8]) -> Option<Issued> {
    let text = std::str::from_utf8(cert_pem).ok()?;
    let der = pem_certs(text).ok()?.into_iter().next()?;
    let info = cert_info(&der).ok()?;
    Some(Issued {
        serial: info.serial,
        not_before_ms: info.not_before * 1000,
        not_after_ms: info.not_after * 1000,
    })
}

/// When to renew: at 60–70 % of the lifetime ("about 2/3"), the exact
/// point fixed per node and certificate so a fleet issued at once spreads
/// its renewals over a tenth of the lifetime instead of renewing together.
/// The lifetime is the entry's `ttl` (the issuer backdates `not_before` a
/// few minutes for clock skew, which must not count), or less when the
/// CA's own expiry cut it short.
pub fn renew_at_ms(node: &str, c: &Issued, ttl: Duration) -> i64 {
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    let life = (c.not_after_ms - c.not_before_ms).clamp(0, ttl_ms);
    let h = sha2::Sha256::digest(format!("{node}\0{}", c.serial).as_bytes());
    let u = f64::from(u16::from_be_bytes([h[0], h[1]])) / 65536.0;
    c.not_after_ms - (life as f64 * (0.4 - 0.1 * u)) as i64
}

/// A kubeconfig for the tenant cluster: the server and CA inline, the
/// user's certificate and key by path (as kubeadm writes `kubelet.conf`),
/// so a renewed pair needs no new kubeconfig.
pub fn kubeconfig(
    cluster: &str,
    api_server: &str,
    ca_pem: &str,
    user: &str,
    cert_path: &str,
    key_path: &str,
) -> String {
    // Every scalar is written as a JSON string, which YAML reads as the
    // same double-quoted scalar: nothing a name contains can break out.
    let q = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    let (cluster, server, ca, context) = (q(cluster), q(api_server), q(&ca), q(&format!("{user}@{cluster}")));
    let (user, cert, key) = (q(user), q(cert_path), q(key_path));
    [
        "apiVersion: v1".to_string(),
        "kind: Config".into(),
        "clusters:".into(),
        format!("- name: {cluster}"),
        "  cluster:".into(),
        format!("    server: {server}"),
        format!("    certificate-authority-data: {ca}"),
        "users:".into(),
        format!("- name: {user}"),
        "  user:".into(),
        format!("    client-certificate: {cert}"),
        format!("    client-key: {key}"),
        "contexts:".into(),
        format!("- name: {context}"),
        "  context:".into(),
        format!("    cluster: {cluster}"),
        format!("    user: {user}"),
        format!("current-context: {context}"),
        "preferences: {}".into(),
        String::new(),
    ]
    .join("\n")
}

/// The node's addresses for a kubelet-serving certificate: every address
/// of an interface that is up, except loopback and link-local, sorted.
pub fn addresses() -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = match nix::ifaddrs::getifaddrs() {
        Ok(it) => it
            .filter(|i| i.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP))
            .filter_map(|i| {
                let a = i.address?;
                if let Some(v4) = a.as_sockaddr_in() {
                    Some(IpAddr::V4(v4.ip()))
                } else {
                    a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
                }
            })
            .filter(|ip| match ip {
                IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local() && !v4.is_unspecified(),
                IpAddr::V6(v6) => {
                    !v6.is_loopback() && !v6.is_unspecified() && (v6.segments()[0] & 0xffc0) != 0xfe80
                }
            })
            .collect(),
        Err(e) => {
            tracing::warn!("list the node's addresses: {e}");
            Vec::new()
        }
    };
    out.sort();
    out.dedup();
    out.truncate(lks_proto::certs::MAX_ADDRESSES);
    out
}

/// The names `spec` gives this node now.
pub fn names_for(spec: &CertificateSpec, node: &str) -> Result<CertNames, CertError> {
    spec.names_for(node, &addresses()).map_err(CertError::Names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lks_proto::certs::Profile;

    #[test]
    fn csr_asks_for_exactly_the_profile_names() {
        let spec = CertificateSpec {
            path: "/a.crt".parse().unwrap(),
            key_path: "/a.key".parse().unwrap(),
            profile: Profile::KubeletServing,
            common_name: String::new(),
            organizations: Vec::new(),
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
            ttl: lks_proto::certs::DEFAULT_TTL,
            ca_path: None,
        };
        let names = spec.names_for("w1", &["192.0.2.1".parse().unwrap()]).unwrap();
        let k = key_and_csr(&names).unwrap();
        lks_proto::certs::check_csr(&k.csr_pem, &names).unwrap();
        assert!(k.key_pem.contains("PRIVATE KEY"));
        // A certificate for another key is refused.
        let other = rcgen::generate_simple_self_signed(vec!["w1".into()]).unwrap();
        let e = check_issued(&other.cert.pem(), &k.spki, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not for the key"), "{e}");
    }

    #[test]
    fn renewal_is_spread_between_60_and_70_percent() {
        let mut points = std::collections::BTreeSet::new();
        for i in 0..200 {
            let c = Issued {
                serial: format!("{i:x}"),
                not_before_ms: 0,
                not_after_ms: 1_000_000,
            };
            let at = renew_at_ms("node", &c, Duration::from_secs(3600));
            assert!((600_000..=700_000).contains(&at), "{at}");
            points.insert(at / 10_000);
        }
        assert!(points.len() >= 8, "renewals cluster: {points:?}");
        // Backdating does not count: a 30 s certificate backdated by five
        // minutes is renewed 18–21 s after it was issued.
        let backdated = Issued {
            serial: "1".into(),
            not_before_ms: 0,
            not_after_ms: 330_000,
        };
        let at = renew_at_ms("node", &backdated, Duration::from_secs(30));
        assert!((318_000..=321_000).contains(&at), "{at}");
    }

    #[test]
    fn kubeconfig_quotes_every_value() {
        let k = kubeconfig(
            "c1",
            "https://api.c1:6443",
            "PEM",
            "system:node:w1",
            "/var/lib/kubelet/pki/kubelet-client.crt",
            "/var/lib/kubelet/pki/kubelet-client.key",
        );
        assert!(k.contains("    server: \"https://api.c1:6443\"\n"), "{k}");
        assert!(k.contains("certificate-authority-data: \"UEVN\""), "{k}");
        assert!(k.contains("current-context: \"system:node:w1@c1\""), "{k}");
        let odd = kubeconfig("c\"1", "https://x", "", "u\nx", "/a", "/b");
        assert!(odd.contains("\"c\\\"1\"") && odd.contains("\"u\\nx\""), "{odd}");
    }
}
