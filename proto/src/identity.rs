//! Identities carried in certificates, and the CA pin.
//!
//! A node certificate names its node and cluster in a URI SAN
//! `urn:lks:node:<cluster>:<node>`; the admin certificate carries
//! `urn:lks:admin:<name>`. The server derives who is calling from the
//! verified peer certificate only, through [`Identity::from_cert_der`].
//! The CA pin is kubeadm's: `sha256:` + hex SHA-256 of the CA certificate's
//! DER SubjectPublicKeyInfo.

use std::fmt;

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::digest::Digest;
use crate::names::{NameError, validate_cluster_name, validate_node_name};

const NODE_PREFIX: &str = "urn:lks:node:";
const ADMIN_PREFIX: &str = "urn:lks:admin:";

/// Who a certificate belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    Node(NodeIdentity),
    Admin { name: String },
}

/// A node of a tenant cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeIdentity {
    pub cluster: String,
    pub node: String,
}

impl NodeIdentity {
    pub fn new(cluster: &str, node: &str) -> Result<Self, NameError> {
        validate_cluster_name(cluster)?;
        validate_node_name(node)?;
        Ok(NodeIdentity {
            cluster: cluster.into(),
            node: node.into(),
        })
    }

    /// The URI SAN to put in the node certificate.
    pub fn to_uri(&self) -> String {
        format!("{NODE_PREFIX}{}:{}", self.cluster, self.node)
    }
}

impl fmt::Display for NodeIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.cluster, self.node)
    }
}

/// The URI SAN of an admin certificate.
pub fn admin_uri(name: &str) -> String {
    format!("{ADMIN_PREFIX}{name}")
}

/// Why a certificate could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    #[error("certificate is not valid DER X.509")]
    Malformed,
    #[error("certificate carries no lksadmin identity")]
    NoIdentity,
    #[error("certificate carries more than one lksadmin identity")]
    AmbiguousIdentity,
    #[error("certificate identity {0:?} is malformed")]
    BadIdentity(String),
    #[error("no PEM certificate found")]
    NoPem,
}

impl Identity {
    /// Reads the identity from a (verified) DER certificate.
    pub fn from_cert_der(der: &[u8]) -> Result<Self, CertError> {
        let (_, cert) = X509Certificate::from_der(der).map_err(|_| CertError::Malformed)?;
        let san = cert
            .subject_alternative_name()
            .map_err(|_| CertError::Malformed)?;
        let mut found = None;
        for name in san.iter().flat_map(|s| s.value.general_names.iter()) {
            let GeneralName::URI(uri) = name else { continue };
            let id = if let Some(rest) = uri.strip_prefix(NODE_PREFIX) {
                let (cluster, node) = rest
                    .split_once(':')
                    .ok_or_else(|| CertError::BadIdentity(uri.to_string()))?;
                Identity::Node(
                    NodeIdentity::new(cluster, node).map_err(|_| CertError::BadIdentity(uri.to_string()))?,
                )
            } else if let Some(name) = uri.strip_prefix(ADMIN_PREFIX) {
                if name.is_empty() {
                    return Err(CertError::BadIdentity(uri.to_string()));
                }
                Identity::Admin {
                    name: name.to_string(),
                }
            } else {
                continue;
            };
            if found.replace(id).is_some() {
                return Err(CertError::AmbiguousIdentity);
            }
        }
        found.ok_or(CertError::NoIdentity)
    }
}

/// Facts of a certificate the agent and server need besides its identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// Unix seconds.
    pub not_before: i64,
    /// Unix seconds.
    pub not_after: i64,
    /// Serial number, lowercase hex with ':' separators as x509 tools print it.
    pub serial: String,
    pub is_ca: bool,
}

pub fn cert_info(der: &[u8]) -> Result<CertInfo, CertError> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|_| CertError::Malformed)?;
    Ok(CertInfo {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        serial: cert.raw_serial_as_string(),
        is_ca: cert.is_ca(),
    })
}

/// The kubeadm-style CA pin: `sha256:` + hex SHA-256 of the DER SubjectPublicKeyInfo.
pub fn ca_cert_hash(ca_der: &[u8]) -> Result<Digest, CertError> {
    let (_, cert) = X509Certificate::from_der(ca_der).map_err(|_| CertError::Malformed)?;
    Ok(Digest::of(cert.public_key().raw))
}

/// Every certificate in a PEM text, as DER.
pub fn pem_certs(pem: &str) -> Result<Vec<Vec<u8>>, CertError> {
    let mut out = Vec::new();
    for p in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        let p = p.map_err(|_| CertError::NoPem)?;
        if p.label == "CERTIFICATE" {
            out.push(p.contents);
        }
    }
    if out.is_empty() {
        return Err(CertError::NoPem);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_identity_rules() {
        let id = NodeIdentity::new("tenant-a", "worker-1").unwrap();
        assert_eq!(id.to_uri(), "urn:lks:node:tenant-a:worker-1");
        assert!(NodeIdentity::new("Tenant", "w").is_err());
        assert!(NodeIdentity::new("t", "w:x").is_err());
    }

    fn cert_with_uris(uris: &[&str], ca: bool) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        for u in uris {
            params
                .subject_alt_names
                .push(rcgen::SanType::URI((*u).try_into().unwrap()));
        }
        if ca {
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn identities_from_real_certificates() {
        let node = cert_with_uris(&["urn:lks:node:tenant-a:worker-1"], false);
        assert_eq!(
            Identity::from_cert_der(&node).unwrap(),
            Identity::Node(NodeIdentity::new("tenant-a", "worker-1").unwrap())
        );
        let admin = cert_with_uris(&["https://example.com", &admin_uri("admin")], false);
        assert_eq!(
            Identity::from_cert_der(&admin).unwrap(),
            Identity::Admin { name: "admin".into() }
        );
        assert_eq!(
            Identity::from_cert_der(&cert_with_uris(&[], false)),
            Err(CertError::NoIdentity)
        );
        let two = cert_with_uris(&["urn:lks:node:a:b", "urn:lks:admin:x"], false);
        assert_eq!(Identity::from_cert_der(&two), Err(CertError::AmbiguousIdentity));
        let forged = cert_with_uris(&["urn:lks:node:a:../../b"], false);
        assert!(matches!(
            Identity::from_cert_der(&forged),
            Err(CertError::BadIdentity(_))
        ));
    }

    #[test]
    fn ca_hash_covers_the_public_key_only() {
        let ca = cert_with_uris(&[], true);
        let info = cert_info(&ca).unwrap();
        assert!(info.is_ca && info.not_after > info.not_before);
        let h = ca_cert_hash(&ca).unwrap();
        assert_ne!(
            h,
            ca_cert_hash(&cert_with_uris(&[], true)).unwrap(),
            "different keys, different pins"
        );
        let (_, cert) = X509Certificate::from_der(&ca).unwrap();
        assert_eq!(h, Digest::of(cert.public_key().raw));
    }

    #[test]
    fn garbage_is_malformed() {
        assert_eq!(Identity::from_cert_der(b"nope"), Err(CertError::Malformed));
        assert_eq!(ca_cert_hash(b"nope"), Err(CertError::Malformed));
        assert_eq!(pem_certs("hello"), Err(CertError::NoPem));
    }
}
