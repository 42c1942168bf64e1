//! Node-made certificates (`[[certificate]]`) and kubeconfigs
//! (`[[kubeconfig]]`): what a bundle asks for, the names a profile allows
//! for one node, and the check of a CSR against them.
//!
//! A bundle is the same bytes for every node, so it carries the *request*
//! (profile, names, ttl); each node makes its own key, sends a CSR, and the
//! server signs it with the tenant cluster's CA. The agent builds its CSR
//! from [`CertificateSpec::names_for`] and the server signs only a CSR that
//! [`check_csr`] accepts against the names the same function gives for the
//! calling node — one function, so agent and server never disagree.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

use crate::path::BundlePath;
use crate::rule::ManifestError;

/// Why a name template of a `[[certificate]]` entry, or the name it
/// expands to, was refused; carries the template or name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertNameError {
    #[error("{template:?} must be 1 to {MAX_NAME_LEN} printable characters")]
    Template { template: String },
    #[error("{template:?} has a \"{{\" without \"}}\"")]
    Unclosed { template: String },
    #[error("{template:?} has a \"}}\" without \"{{\"")]
    Unopened { template: String },
    /// A placeholder other than `{node}`.
    #[error("{template:?} uses {{{placeholder}}}; the only placeholder is {{node}}")]
    Placeholder { template: String, placeholder: String },
    /// The name `{node}` expanded to is too long.
    #[error("{name:?} is longer than {MAX_NAME_LEN} bytes")]
    Expanded { name: String },
    #[error("{name:?} is not a lowercase DNS name")]
    DnsName { name: String },
    #[error("{value:?} is not an IP address")]
    IpAddress { value: String },
}

/// Why a node's CSR was refused: it is no CSR, or it asks for more or
/// other names than the node may have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    #[error("the CSR is not PEM: {detail}")]
    NotPem { detail: String },
    #[error("expected a CERTIFICATE REQUEST, got {label:?}")]
    Label { label: String },
    #[error("the CSR does not parse: {detail}")]
    Parse { detail: String },
    #[error("the CSR's subject has a value that is not a string")]
    SubjectNotString,
    #[error("the CSR's subject carries {attribute} = {value:?}; only CN and O are allowed")]
    SubjectAttribute { attribute: String, value: String },
    #[error("the CSR asks for common name {asked:?}; this node may only have {allowed:?}")]
    CommonName { asked: String, allowed: String },
    #[error("the CSR asks for organizations {asked:?}; this node may only have {allowed:?}")]
    Organizations {
        asked: Vec<String>,
        allowed: Vec<String>,
    },
    #[error("the CSR asks for an extension other than subjectAltName")]
    Extension,
    #[error("the CSR has a malformed IP address SAN")]
    IpSan,
    #[error("the CSR asks for a SAN that is not allowed: {san}")]
    San { san: String },
    #[error("the CSR asks for DNS names {asked:?}; this node may only have {allowed:?}")]
    DnsNames {
        asked: Vec<String>,
        allowed: Vec<String>,
    },
    /// The addresses as text, so the message lists them quoted.
    #[error("the CSR asks for IP addresses {asked:?}; this node may only have {allowed:?}")]
    IpAddresses {
        asked: Vec<String>,
        allowed: Vec<String>,
    },
}

/// Lifetime of an issued certificate when the bundle gives no `ttl`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(720 * 3600);
/// Shortest `ttl` (tests of rotation use a short one).
pub const MIN_TTL: Duration = Duration::from_secs(30);
/// Longest `ttl`: ten years (the cluster CA's own expiry caps it anyway).
pub const MAX_TTL: Duration = Duration::from_secs(87_600 * 3600);
/// Most `[[certificate]]` entries in one bundle.
pub const MAX_CERTIFICATES: usize = 16;
/// Most `[[kubeconfig]]` entries in one bundle.
pub const MAX_KUBECONFIGS: usize = 16;
/// Most names of one kind (organizations, DNS names, IP addresses).
pub const MAX_NAMES: usize = 64;
/// Longest name, after `{node}` is expanded.
pub const MAX_NAME_LEN: usize = 512;
/// Most addresses a node may report for its serving certificate.
pub const MAX_ADDRESSES: usize = 32;

/// What a certificate is for; fixes or bounds its names and key usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// kubelet → apiserver: CN `system:node:<node>`, O `system:nodes`.
    KubeletClient,
    /// apiserver → kubelet: CN `system:node:<node>`, SANs the node's name
    /// and the addresses it reported.
    KubeletServing,
    /// A client certificate with the names the bundle gives.
    Client,
    /// A server certificate with the names the bundle gives.
    Server,
}

impl Profile {
    pub const ALL: [Profile; 4] = [
        Profile::KubeletClient,
        Profile::KubeletServing,
        Profile::Client,
        Profile::Server,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Profile::KubeletClient => "kubelet-client",
            Profile::KubeletServing => "kubelet-serving",
            Profile::Client => "client",
            Profile::Server => "server",
        }
    }

    /// Client authentication (else server authentication).
    pub fn is_client(self) -> bool {
        matches!(self, Profile::KubeletClient | Profile::Client)
    }

    /// The bundle gives the names (else the profile fixes them).
    pub fn takes_names(self) -> bool {
        matches!(self, Profile::Client | Profile::Server)
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `profile` that is none of [`Profile::ALL`]; carries the name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown profile {name:?}: expected kubelet-client, kubelet-serving, client or server")]
pub struct UnknownProfile {
    pub name: String,
}

impl FromStr for Profile {
    type Err = UnknownProfile;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Profile::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownProfile { name: s.into() })
    }
}

/// One `[[certificate]]`: a key made on the node and a certificate for it
/// signed by the cluster CA.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CertificateSpec {
    /// Where the certificate (PEM) goes.
    pub path: BundlePath,
    /// Where the private key (PEM, mode 0600) goes; made on the node.
    pub key_path: BundlePath,
    pub profile: Profile,
    /// `client`/`server` only; `{node}` is the node's name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub common_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub organizations: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_names: Vec<String>,
    /// Literal addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
    #[serde(rename = "ttl_ms", with = "crate::duration::millis")]
    pub ttl: Duration,
    /// Where to write the cluster CA certificate, if anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_path: Option<BundlePath>,
}

/// One `[[kubeconfig]]`: a kubeconfig for the tenant cluster whose user is a
/// `[[certificate]]` of the same bundle.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KubeconfigSpec {
    pub path: BundlePath,
    /// The `path` of a client `[[certificate]]` of the bundle.
    pub certificate: BundlePath,
}

/// Subject and SANs of a certificate for one node, sorted and deduplicated
/// where order carries no meaning (organizations keep theirs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertNames {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    /// Client authentication (else server).
    pub client: bool,
}

impl CertificateSpec {
    /// Every rule of one entry; `field` is its name (`certificate[1]`).
    pub fn validate(&self, field: &str) -> Result<(), ManifestError> {
        let f = |n: &str| format!("{field}.{n}");
        if self.path == self.key_path {
            return Err(ManifestError::new(f("key_path"), "must differ from path"));
        }
        if let Some(ca) = &self.ca_path
            && (ca == &self.path || ca == &self.key_path)
        {
            return Err(ManifestError::new(
                f("ca_path"),
                "must differ from path and key_path",
            ));
        }
        if self.ttl < MIN_TTL || self.ttl > MAX_TTL {
            return Err(ManifestError::new(
                f("ttl"),
                format!(
                    "{} is outside {} to {}",
                    crate::duration::format_duration(self.ttl),
                    crate::duration::format_duration(MIN_TTL),
                    crate::duration::format_duration(MAX_TTL)
                ),
            ));
        }
        if !self.profile.takes_names() {
            for (name, given) in [
                ("common_name", !self.common_name.is_empty()),
                ("organizations", !self.organizations.is_empty()),
                ("dns_names", !self.dns_names.is_empty()),
                ("ip_addresses", !self.ip_addresses.is_empty()),
            ] {
                if given {
                    return Err(ManifestError::new(
                        f(name),
                        format!("not allowed with profile {}: it fixes the names", self.profile),
                    ));
                }
            }
            return Ok(());
        }
        if self.common_name.is_empty() {
            return Err(ManifestError::new(
                f("common_name"),
                format!("required with profile {}", self.profile),
            ));
        }
        check_template(&self.common_name).map_err(|e| ManifestError::new(f("common_name"), e))?;
        for (name, list) in [
            ("organizations", &self.organizations),
            ("dns_names", &self.dns_names),
            ("ip_addresses", &self.ip_addresses),
        ] {
            if list.len() > MAX_NAMES {
                return Err(ManifestError::new(
                    f(name),
                    format!("{} entries; the limit is {MAX_NAMES}", list.len()),
                ));
            }
        }
        if self.organizations.len() > 1 {
            // The signer (rcgen) keeps one value per attribute type in a
            // subject; Kubernetes reads groups from O, so one group it is.
            return Err(ManifestError::new(
                f("organizations"),
                "at most one organization (one Kubernetes group) per certificate",
            ));
        }
        for o in &self.organizations {
            check_template(o).map_err(|e| ManifestError::new(f("organizations"), e))?;
        }
        for d in &self.dns_names {
            check_template(d)
                .and_then(|_| check_dns_name(&expand(d, "node")?))
                .map_err(|e| ManifestError::new(f("dns_names"), e))?;
        }
        for ip in &self.ip_addresses {
            ip.parse::<IpAddr>()
                .map_err(|_| ManifestError::new(f("ip_addresses"), format!("{ip:?} is not an IP address")))?;
        }
        if self.profile == Profile::Server && self.dns_names.is_empty() && self.ip_addresses.is_empty() {
            return Err(ManifestError::new(
                f("dns_names"),
                "a server certificate needs at least one DNS name or IP address",
            ));
        }
        Ok(())
    }

    /// The paths this entry writes: certificate, key and CA (if any).
    pub fn paths(&self) -> impl Iterator<Item = &BundlePath> {
        [&self.path, &self.key_path]
            .into_iter()
            .chain(self.ca_path.as_ref())
    }

    /// The names a certificate of this entry carries when issued to `node`,
    /// whose reported addresses are `addresses` (used by kubelet-serving).
    pub fn names_for(&self, node: &str, addresses: &[IpAddr]) -> Result<CertNames, CertNameError> {
        let kubelet = format!("system:node:{node}");
        let mut names = match self.profile {
            Profile::KubeletClient => CertNames {
                common_name: kubelet,
                organizations: vec!["system:nodes".into()],
                dns_names: Vec::new(),
                ip_addresses: Vec::new(),
                client: true,
            },
            Profile::KubeletServing => CertNames {
                common_name: kubelet,
                organizations: vec!["system:nodes".into()],
                dns_names: vec![node.to_string()],
                ip_addresses: addresses.iter().take(MAX_ADDRESSES).copied().collect(),
                client: false,
            },
            Profile::Client | Profile::Server => CertNames {
                common_name: expand(&self.common_name, node)?,
                organizations: self
                    .organizations
                    .iter()
                    .map(|o| expand(o, node))
                    .collect::<Result<_, _>>()?,
                dns_names: self
                    .dns_names
                    .iter()
                    .map(|d| expand(d, node))
                    .collect::<Result<_, _>>()?,
                ip_addresses: self
                    .ip_addresses
                    .iter()
                    .map(|ip| {
                        ip.parse()
                            .map_err(|_| CertNameError::IpAddress { value: ip.clone() })
                    })
                    .collect::<Result<_, _>>()?,
                client: self.profile == Profile::Client,
            },
        };
        names.dns_names.sort();
        names.dns_names.dedup();
        names.ip_addresses.sort();
        names.ip_addresses.dedup();
        Ok(names)
    }
}

/// Expands `{node}`; any other `{…}` is an error.
pub fn expand(template: &str, node: &str) -> Result<String, CertNameError> {
    check_template(template)?;
    let out = template.replace("{node}", node);
    if out.len() > MAX_NAME_LEN {
        return Err(CertNameError::Expanded { name: out });
    }
    Ok(out)
}

/// A name template: printable, and `{node}` the only placeholder.
fn check_template(t: &str) -> Result<(), CertNameError> {
    let template = || t.to_string();
    if t.is_empty() || t.len() > MAX_NAME_LEN || t.chars().any(char::is_control) {
        return Err(CertNameError::Template { template: template() });
    }
    let mut rest = t;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            return Err(CertNameError::Unclosed { template: template() });
        };
        let name = &after[..close];
        if name != "node" {
            return Err(CertNameError::Placeholder {
                template: template(),
                placeholder: name.into(),
            });
        }
        rest = &after[close + 1..];
    }
    if rest.contains('}') {
        return Err(CertNameError::Unopened { template: template() });
    }
    Ok(())
}

/// A DNS name for a SAN: lowercase labels, an optional leading `*.`.
fn check_dns_name(d: &str) -> Result<(), CertNameError> {
    let body = d.strip_prefix("*.").unwrap_or(d);
    let ok = !body.is_empty()
        && body.len() <= 253
        && body.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(CertNameError::DnsName { name: d.into() })
    }
}

/// Checks that a PEM CSR asks for exactly `want`: the subject's common name
/// and organizations and nothing else, and exactly the DNS and IP SANs
/// (in any order), and no other extension. The signature is checked where
/// the CSR is signed.
pub fn check_csr(csr_pem: &str, want: &CertNames) -> Result<(), CsrError> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(csr_pem.as_bytes()).map_err(|e| CsrError::NotPem {
        detail: e.to_string(),
    })?;
    if pem.label != "CERTIFICATE REQUEST" {
        return Err(CsrError::Label { label: pem.label });
    }
    let (_, csr) = X509CertificationRequest::from_der(&pem.contents).map_err(|e| CsrError::Parse {
        detail: e.to_string(),
    })?;
    let info = &csr.certification_request_info;
    let mut cn = Vec::new();
    let mut orgs = Vec::new();
    for attr in info.subject.iter_attributes() {
        let value = attr.as_str().map_err(|_| CsrError::SubjectNotString)?.to_string();
        if *attr.attr_type() == x509_parser::oid_registry::OID_X509_COMMON_NAME {
            cn.push(value);
        } else if *attr.attr_type() == x509_parser::oid_registry::OID_X509_ORGANIZATION_NAME {
            orgs.push(value);
        } else {
            return Err(CsrError::SubjectAttribute {
                attribute: attr.attr_type().to_string(),
                value,
            });
        }
    }
    if cn != [want.common_name.clone()] {
        return Err(CsrError::CommonName {
            asked: cn.join(", "),
            allowed: want.common_name.clone(),
        });
    }
    if orgs != want.organizations {
        return Err(CsrError::Organizations {
            asked: orgs,
            allowed: want.organizations.clone(),
        });
    }
    let mut dns = BTreeSet::new();
    let mut ips = BTreeSet::new();
    for ext in csr.requested_extensions().into_iter().flatten() {
        let ParsedExtension::SubjectAlternativeName(san) = ext else {
            return Err(CsrError::Extension);
        };
        for n in &san.general_names {
            match n {
                GeneralName::DNSName(d) => {
                    dns.insert(d.to_string());
                }
                GeneralName::IPAddress(b) => {
                    let ip = match b.len() {
                        4 => IpAddr::from(<[u8; 4]>::try_from(*b).unwrap_or_default()),
                        16 => IpAddr::from(<[u8; 16]>::try_from(*b).unwrap_or_default()),
                        _ => return Err(CsrError::IpSan),
                    };
                    ips.insert(ip);
                }
                other => {
                    return Err(CsrError::San {
                        san: other.to_string(),
                    });
                }
            }
        }
    }
    let want_dns: BTreeSet<String> = want.dns_names.iter().cloned().collect();
    if dns != want_dns {
        return Err(CsrError::DnsNames {
            asked: dns.into_iter().collect(),
            allowed: want.dns_names.clone(),
        });
    }
    let want_ips: BTreeSet<IpAddr> = want.ip_addresses.iter().copied().collect();
    if ips != want_ips {
        return Err(CsrError::IpAddresses {
            asked: ips.iter().map(ToString::to_string).collect(),
            allowed: want.ip_addresses.iter().map(ToString::to_string).collect(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> BundlePath {
        BundlePath::new(s).unwrap()
    }

    pub fn spec(profile: Profile) -> CertificateSpec {
        CertificateSpec {
            path: p("/var/lib/kubelet/pki/kubelet-client.crt"),
            key_path: p("/var/lib/kubelet/pki/kubelet-client.key"),
            profile,
            common_name: String::new(),
            organizations: Vec::new(),
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
            ttl: DEFAULT_TTL,
            ca_path: Some(p("/etc/kubernetes/pki/ca.crt")),
        }
    }

    fn named(profile: Profile) -> CertificateSpec {
        CertificateSpec {
            common_name: "{node}-proxy".into(),
            organizations: vec!["{node}-group".into()],
            dns_names: vec!["{node}.svc".into(), "a.example".into()],
            ip_addresses: vec!["10.0.0.1".into()],
            ..spec(profile)
        }
    }

    fn csr(names: &CertNames, extra_ou: bool) -> String {
        let mut params = rcgen::CertificateParams::default();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, names.common_name.as_str());
        for o in &names.organizations {
            dn.push(rcgen::DnType::OrganizationName, o.as_str());
        }
        if extra_ou {
            dn.push(rcgen::DnType::OrganizationalUnitName, "ops");
        }
        params.distinguished_name = dn;
        for d in &names.dns_names {
            params
                .subject_alt_names
                .push(rcgen::SanType::DnsName(d.clone().try_into().unwrap()));
        }
        for ip in &names.ip_addresses {
            params.subject_alt_names.push(rcgen::SanType::IpAddress(*ip));
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    #[test]
    fn profiles_fix_or_take_names() {
        let addrs: Vec<IpAddr> = vec!["192.0.2.7".parse().unwrap(), "2001:db8::7".parse().unwrap()];
        let c = spec(Profile::KubeletClient).names_for("w1", &addrs).unwrap();
        assert_eq!(c.common_name, "system:node:w1");
        assert_eq!(c.organizations, ["system:nodes"]);
        assert!(c.dns_names.is_empty() && c.ip_addresses.is_empty() && c.client);
        let s = spec(Profile::KubeletServing).names_for("w1", &addrs).unwrap();
        assert_eq!(s.dns_names, ["w1"]);
        assert_eq!(s.ip_addresses, addrs);
        assert!(!s.client);
        let n = named(Profile::Server).names_for("w1", &addrs).unwrap();
        assert_eq!(n.common_name, "w1-proxy");
        assert_eq!(n.organizations, ["w1-group"]);
        assert_eq!(n.dns_names, ["a.example", "w1.svc"]);
        assert_eq!(n.ip_addresses, ["10.0.0.1".parse::<IpAddr>().unwrap()]);
        for p in Profile::ALL {
            assert_eq!(p.as_str().parse::<Profile>().unwrap(), p);
        }
        assert!(
            "kubelet"
                .parse::<Profile>()
                .unwrap_err()
                .to_string()
                .contains("unknown profile")
        );
    }

    #[test]
    fn each_rule_names_its_field() {
        type Case = (fn(&mut CertificateSpec), &'static str);
        let cases: Vec<Case> = vec![
            (|c| c.key_path = c.path.clone(), "c.key_path"),
            (|c| c.ca_path = Some(c.key_path.clone()), "c.ca_path"),
            (|c| c.ttl = Duration::from_secs(1), "c.ttl"),
            (|c| c.ttl = MAX_TTL * 2, "c.ttl"),
            (|c| c.common_name = "x".into(), "c.common_name"),
            (|c| c.dns_names = vec!["x".into()], "c.dns_names"),
        ];
        for (mutate, field) in cases {
            let mut c = spec(Profile::KubeletClient);
            mutate(&mut c);
            assert_eq!(c.validate("c").unwrap_err().field, field);
        }
        type Named = (fn(&mut CertificateSpec), &'static str, &'static str);
        let named_cases: Vec<Named> = vec![
            (|c| c.common_name.clear(), "c.common_name", "required"),
            (
                |c| c.common_name = "{host}".into(),
                "c.common_name",
                "only placeholder is {node}",
            ),
            (|c| c.common_name = "{node".into(), "c.common_name", "without"),
            (|c| c.common_name = "node}".into(), "c.common_name", "without"),
            (
                |c| c.organizations = vec!["{cluster}".into()],
                "c.organizations",
                "{cluster}",
            ),
            (
                |c| c.organizations.push("b".into()),
                "c.organizations",
                "at most one",
            ),
            (
                |c| c.dns_names = vec!["Bad_Name".into()],
                "c.dns_names",
                "DNS name",
            ),
            (
                |c| c.ip_addresses = vec!["10.0.0.300".into()],
                "c.ip_addresses",
                "not an IP",
            ),
            (
                |c| c.ip_addresses = vec!["{node}".into()],
                "c.ip_addresses",
                "not an IP",
            ),
            (
                |c| {
                    c.dns_names.clear();
                    c.ip_addresses.clear();
                },
                "c.dns_names",
                "at least one",
            ),
        ];
        for (mutate, field, why) in named_cases {
            let mut c = named(Profile::Server);
            mutate(&mut c);
            let e = c.validate("c").unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.reason.contains(why), "{e}");
        }
        named(Profile::Server).validate("c").unwrap();
        let mut wildcard = named(Profile::Client);
        wildcard.dns_names = vec!["*.{node}.example".into()];
        wildcard.ip_addresses.clear();
        wildcard.validate("c").unwrap();
    }

    #[test]
    fn a_csr_must_ask_for_exactly_the_allowed_names() {
        let addrs: Vec<IpAddr> = vec!["192.0.2.7".parse().unwrap()];
        for spec in [
            spec(Profile::KubeletClient),
            spec(Profile::KubeletServing),
            named(Profile::Server),
        ] {
            let want = spec.names_for("w1", &addrs).unwrap();
            check_csr(&csr(&want, false), &want).unwrap();
            let err = check_csr(&csr(&want, true), &want).unwrap_err().to_string();
            assert!(err.contains("only CN and O"), "{err}");
        }
        let want = spec(Profile::KubeletServing).names_for("w1", &addrs).unwrap();
        let other = spec(Profile::KubeletServing).names_for("w2", &addrs).unwrap();
        assert!(
            check_csr(&csr(&other, false), &want)
                .unwrap_err()
                .to_string()
                .contains("common name")
        );
        let mut extra = want.clone();
        extra.dns_names.push("evil.example".into());
        assert!(
            check_csr(&csr(&extra, false), &want)
                .unwrap_err()
                .to_string()
                .contains("DNS names")
        );
        let mut more_ips = want.clone();
        more_ips.ip_addresses.push("198.51.100.1".parse().unwrap());
        assert!(
            check_csr(&csr(&more_ips, false), &want)
                .unwrap_err()
                .to_string()
                .contains("IP addresses")
        );
        let mut org = want.clone();
        org.organizations = vec!["system:masters".into()];
        assert!(
            check_csr(&csr(&org, false), &want)
                .unwrap_err()
                .to_string()
                .contains("organizations")
        );
        assert!(
            check_csr("garbage", &want)
                .unwrap_err()
                .to_string()
                .contains("not PEM")
        );
        let mut other_cn = want.clone();
        other_cn.common_name = "system:node:w9".into();
        assert_eq!(
            check_csr(&csr(&other_cn, false), &want).unwrap_err(),
            CsrError::CommonName {
                asked: "system:node:w9".into(),
                allowed: "system:node:w1".into(),
            }
        );
        let cert = rcgen::generate_simple_self_signed(vec!["x".into()]).unwrap();
        assert!(
            check_csr(&cert.cert.pem(), &want)
                .unwrap_err()
                .to_string()
                .contains("CERTIFICATE REQUEST")
        );
    }
}
