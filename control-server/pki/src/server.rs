//! The server's PKI: its CA, serving certificate, admin client certificate,
//! and the node certificates issued at enrolment.
//!
//! Everything lives in `DATA_DIR/pki/` as PEM, private keys mode 0600. The CA
//! is made once; the serving certificate is re-issued when the names it must
//! carry change or it nears expiry. Node identities are chosen by the server:
//! a CSR contributes only its public key (its signature is checked by rcgen),
//! never a name.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lks_proto::Digest;
use lks_proto::identity::{NodeIdentity, admin_uri, ca_cert_hash, cert_info};
use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use time::OffsetDateTime;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use lks_proto::fsutil::write_atomic;

const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 86400);
const SERVER_VALIDITY: Duration = Duration::from_secs(365 * 86400);
const ADMIN_VALIDITY: Duration = Duration::from_secs(2 * 365 * 86400);
/// A certificate with less validity left than this is re-issued at start.
const RENEW_BEFORE: Duration = Duration::from_secs(30 * 86400);
/// Tolerated clock skew between server and nodes.
pub(crate) const BACKDATE: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("generate {what}: {source}")]
    Generate {
        what: &'static str,
        source: rcgen::Error,
    },
    #[error("invalid certificate signing request: {0}")]
    BadCsr(String),
}

/// A certificate issued to a node.
#[derive(Clone, Debug)]
pub struct IssuedCert {
    pub pem: String,
    /// As [`lks_proto::identity::cert_info`] prints it; what the store keeps.
    pub serial: String,
    /// Unix seconds.
    pub not_after: i64,
    /// `sha256:` + hex SHA-256 of the certified key's SubjectPublicKeyInfo.
    pub key_hash: String,
}

/// What every replica of a control plane shares: the CA and the admin
/// credential, as PEM. Private keys are sealed before they are stored when
/// the server has an encryption key (see `identity.rs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedIdentity {
    pub ca_cert: String,
    pub ca_key: String,
    pub admin_cert: String,
    pub admin_key: String,
}

impl SharedIdentity {
    /// A new CA and an admin credential signed by it.
    pub fn generate() -> Result<SharedIdentity, PkiError> {
        let now = OffsetDateTime::now_utc();
        let (ca_cert, key) = new_ca(now)?;
        let ca_key = key.serialize_pem();
        let issuer = Issuer::from_ca_cert_pem(&ca_cert, key).map_err(|e| PkiError::Invalid {
            path: PathBuf::from("(new CA)"),
            message: e.to_string(),
        })?;
        let (admin_cert, admin_key) = new_admin_cert(&issuer, now)?;
        Ok(SharedIdentity {
            ca_cert,
            ca_key,
            admin_cert,
            admin_key,
        })
    }

    /// Reads a single server's PKI directory (`DATA_DIR/pki`), for `migrate`.
    pub fn from_dir(dir: &Path) -> Result<SharedIdentity, PkiError> {
        Ok(SharedIdentity {
            ca_cert: read(&dir.join("ca.crt"))?,
            ca_key: read(&dir.join("ca.key"))?,
            admin_cert: read(&dir.join("admin.crt"))?,
            admin_key: read(&dir.join("admin.key"))?,
        })
    }
}

/// The CA and the material the server needs to serve TLS.
pub struct Pki {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    ca_hash: Digest,
    /// Serving certificate followed by the CA certificate, so a joining agent
    /// can pin the CA from the handshake.
    pub server_chain_pem: String,
    pub server_key_pem: String,
    pub admin_cert_pem: String,
    pub admin_key_pem: String,
}

impl Pki {
    /// Loads the PKI from `dir`, creating what is missing. `names` are the
    /// DNS names or IP addresses the serving certificate must carry.
    pub fn load_or_create(dir: &Path, names: &[String]) -> Result<Pki, PkiError> {
        std::fs::create_dir_all(dir).map_err(|source| PkiError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
        let now = OffsetDateTime::now_utc();
        let ca_crt = dir.join("ca.crt");
        let ca_key = dir.join("ca.key");
        let (ca_pem, ca_key_pair) = if ca_crt.exists() && ca_key.exists() {
            (read(&ca_crt)?, parse_key(&ca_key)?)
        } else {
            let (cert_pem, key) = new_ca(now)?;
            // Key first: a CA certificate without its key would be useless.
            write(&ca_key, key.serialize_pem().as_bytes(), 0o600)?;
            write(&ca_crt, cert_pem.as_bytes(), 0o644)?;
            (cert_pem, key)
        };
        let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key_pair).map_err(|e| PkiError::Invalid {
            path: ca_crt.clone(),
            message: e.to_string(),
        })?;
        let ca_der = first_der(&ca_crt, &ca_pem)?;
        let ca_hash = ca_cert_hash(&ca_der).map_err(|e| PkiError::Invalid {
            path: ca_crt.clone(),
            message: e.to_string(),
        })?;

        let server_crt = dir.join("server.crt");
        let server_key = dir.join("server.key");
        let keep_server = server_crt.exists()
            && server_key.exists()
            && read(&server_crt)
                .ok()
                .and_then(|pem| first_der(&server_crt, &pem).ok())
                .is_some_and(|der| still_valid(&der, now) && has_names(&der, names));
        let (server_pem, server_key_pem) = if keep_server {
            (read(&server_crt)?, read(&server_key)?)
        } else {
            let (cert_pem, key_pem) = new_server_cert(names, &issuer, now)?;
            write(&server_key, key_pem.as_bytes(), 0o600)?;
            write(&server_crt, cert_pem.as_bytes(), 0o644)?;
            (cert_pem, key_pem)
        };

        let admin_crt = dir.join("admin.crt");
        let admin_key = dir.join("admin.key");
        let keep_admin = admin_crt.exists()
            && admin_key.exists()
            && read(&admin_crt)
                .ok()
                .and_then(|pem| first_der(&admin_crt, &pem).ok())
                .is_some_and(|der| still_valid(&der, now));
        let (admin_cert_pem, admin_key_pem) = if keep_admin {
            (read(&admin_crt)?, read(&admin_key)?)
        } else {
            let (cert_pem, key_pem) = new_admin_cert(&issuer, now)?;
            write(&admin_key, key_pem.as_bytes(), 0o600)?;
            write(&admin_crt, cert_pem.as_bytes(), 0o644)?;
            (cert_pem, key_pem)
        };

        Ok(Pki {
            issuer,
            server_chain_pem: format!("{}{}", ensure_newline(&server_pem), ensure_newline(&ca_pem)),
            ca_pem,
            ca_hash,
            server_key_pem,
            admin_cert_pem,
            admin_key_pem,
        })
    }

    /// The PKI of one replica of a shared control plane: CA and admin
    /// credential from `id` (kept in etcd), and a serving certificate of
    /// its own for `names`, made now and kept in memory only.
    pub fn from_shared(id: &SharedIdentity, names: &[String]) -> Result<Pki, PkiError> {
        let shared = Path::new("etcd:identity");
        let invalid = |message: String| PkiError::Invalid {
            path: shared.to_path_buf(),
            message,
        };
        let key = KeyPair::from_pem(&id.ca_key).map_err(|e| invalid(format!("CA key: {e}")))?;
        let issuer = Issuer::from_ca_cert_pem(&id.ca_cert, key).map_err(|e| invalid(format!("CA: {e}")))?;
        let ca_der = first_der(shared, &id.ca_cert)?;
        let ca_hash = ca_cert_hash(&ca_der).map_err(|e| invalid(e.to_string()))?;
        let (server_pem, server_key_pem) = new_server_cert(names, &issuer, OffsetDateTime::now_utc())?;
        Ok(Pki {
            issuer,
            server_chain_pem: format!("{}{}", ensure_newline(&server_pem), ensure_newline(&id.ca_cert)),
            ca_pem: id.ca_cert.clone(),
            ca_hash,
            server_key_pem,
            admin_cert_pem: id.admin_cert.clone(),
            admin_key_pem: id.admin_key.clone(),
        })
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The kubeadm-style pin agents check (`sha256:<hex>`).
    pub fn ca_hash(&self) -> Digest {
        self.ca_hash
    }

    /// Issues a node certificate for the key in `csr_pem`. Only the CSR's
    /// public key is used; the identity is `id`, chosen by the caller.
    pub fn issue_node_cert(
        &self,
        csr_pem: &str,
        id: &NodeIdentity,
        ttl: Duration,
    ) -> Result<IssuedCert, PkiError> {
        let csr = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| PkiError::BadCsr(e.to_string()))?;
        let now = OffsetDateTime::now_utc();
        let mut p = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, id.node.as_str());
        name.push(DnType::OrganizationName, id.cluster.as_str());
        p.distinguished_name = name;
        p.subject_alt_names = vec![SanType::URI(ia5(id.to_uri())?)];
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        p.not_before = now - BACKDATE;
        p.not_after = now + ttl;
        p.serial_number = Some(random_serial());
        let cert = p
            .signed_by(&csr.public_key, &self.issuer)
            .map_err(|source| PkiError::Generate {
                what: "node certificate",
                source,
            })?;
        let info = cert_info(cert.der()).map_err(|e| PkiError::BadCsr(e.to_string()))?;
        let key_hash = lks_proto::identity::ca_cert_hash(cert.der())
            .map_err(|e| PkiError::BadCsr(e.to_string()))?
            .to_string();
        Ok(IssuedCert {
            pem: cert.pem(),
            serial: info.serial,
            not_after: info.not_after,
            key_hash,
        })
    }
}

fn new_ca(now: OffsetDateTime) -> Result<(String, KeyPair), PkiError> {
    let key = KeyPair::generate().map_err(|source| PkiError::Generate {
        what: "CA key",
        source,
    })?;
    let mut p = CertificateParams::default();
    p.distinguished_name = dn("lksadmin CA");
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.not_before = now - BACKDATE;
    p.not_after = now + CA_VALIDITY;
    p.serial_number = Some(random_serial());
    let cert = p.self_signed(&key).map_err(|source| PkiError::Generate {
        what: "CA certificate",
        source,
    })?;
    Ok((cert.pem(), key))
}

fn new_server_cert(
    names: &[String],
    issuer: &Issuer<'static, KeyPair>,
    now: OffsetDateTime,
) -> Result<(String, String), PkiError> {
    let key = KeyPair::generate().map_err(|source| PkiError::Generate {
        what: "serving key",
        source,
    })?;
    let mut p = CertificateParams::new(names.to_vec()).map_err(|source| PkiError::Generate {
        what: "serving certificate",
        source,
    })?;
    p.distinguished_name = dn("lks-control-server");
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.not_before = now - BACKDATE;
    p.not_after = now + SERVER_VALIDITY;
    p.serial_number = Some(random_serial());
    let cert = p.signed_by(&key, issuer).map_err(|source| PkiError::Generate {
        what: "serving certificate",
        source,
    })?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn new_admin_cert(
    issuer: &Issuer<'static, KeyPair>,
    now: OffsetDateTime,
) -> Result<(String, String), PkiError> {
    let key = KeyPair::generate().map_err(|source| PkiError::Generate {
        what: "admin key",
        source,
    })?;
    let mut p = CertificateParams::default();
    p.distinguished_name = dn("admin");
    p.subject_alt_names = vec![SanType::URI(ia5(admin_uri("admin"))?)];
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    p.not_before = now - BACKDATE;
    p.not_after = now + ADMIN_VALIDITY;
    p.serial_number = Some(random_serial());
    let cert = p.signed_by(&key, issuer).map_err(|source| PkiError::Generate {
        what: "admin certificate",
        source,
    })?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn dn(cn: &str) -> DistinguishedName {
    let mut d = DistinguishedName::new();
    d.push(DnType::CommonName, cn);
    d
}

fn ia5(s: String) -> Result<Ia5String, PkiError> {
    Ia5String::try_from(s).map_err(|e| PkiError::BadCsr(e.to_string()))
}

/// 16 random bytes with the top bit clear: positive, and unique enough that
/// the serial can name a certificate in the store.
pub(crate) fn random_serial() -> SerialNumber {
    let mut b = [0u8; 16];
    // getrandom only fails when the OS has no entropy source at all; a fixed
    // serial would then still be caught by the revocation check.
    let _ = getrandom::getrandom(&mut b);
    b[0] = (b[0] & 0x7f) | 0x40;
    SerialNumber::from_slice(&b)
}

fn read(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|source| PkiError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn write(path: &Path, bytes: &[u8], mode: u32) -> Result<(), PkiError> {
    // The error names the path already: only the cause is kept.
    write_atomic(path, bytes, mode).map_err(|e| PkiError::Write {
        path: path.to_path_buf(),
        source: e.source,
    })
}

fn parse_key(path: &Path) -> Result<KeyPair, PkiError> {
    KeyPair::from_pem(&read(path)?).map_err(|e| PkiError::Invalid {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

fn first_der(path: &Path, pem: &str) -> Result<Vec<u8>, PkiError> {
    lks_proto::identity::pem_certs(pem)
        .ok()
        .and_then(|v| v.into_iter().next())
        .ok_or_else(|| PkiError::Invalid {
            path: path.to_path_buf(),
            message: "no certificate in PEM".into(),
        })
}

fn ensure_newline(s: &str) -> String {
    if s.ends_with('\n') {
        s.to_string()
    } else {
        format!("{s}\n")
    }
}

fn still_valid(der: &[u8], now: OffsetDateTime) -> bool {
    cert_info(der).is_ok_and(|i| i.not_after > (now + RENEW_BEFORE).unix_timestamp())
}

/// True if the certificate carries every one of `names` as a DNS or IP SAN.
fn has_names(der: &[u8], names: &[String]) -> bool {
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return false;
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return false;
    };
    let mut have: Vec<String> = Vec::new();
    for n in &san.value.general_names {
        match n {
            GeneralName::DNSName(d) => have.push(d.to_string()),
            GeneralName::IPAddress(b) => {
                if let Ok(a) = <[u8; 4]>::try_from(*b) {
                    have.push(IpAddr::from(a).to_string());
                } else if let Ok(a) = <[u8; 16]>::try_from(*b) {
                    have.push(IpAddr::from(a).to_string());
                }
            }
            _ => {}
        }
    }
    names.iter().all(|n| have.contains(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lks_proto::identity::Identity;

    fn names() -> Vec<String> {
        vec!["127.0.0.1".into(), "localhost".into()]
    }

    #[test]
    fn creates_once_and_reuses() {
        let dir = tempfile::tempdir().unwrap();
        let a = Pki::load_or_create(dir.path(), &names()).unwrap();
        let b = Pki::load_or_create(dir.path(), &names()).unwrap();
        assert_eq!(a.ca_hash(), b.ca_hash());
        assert_eq!(a.server_chain_pem, b.server_chain_pem);
        assert_eq!(a.admin_cert_pem, b.admin_cert_pem);
        let chain = lks_proto::identity::pem_certs(&a.server_chain_pem).unwrap();
        assert_eq!(chain.len(), 2, "serving cert plus CA");
        assert!(cert_info(&chain[1]).unwrap().is_ca);
        let admin = lks_proto::identity::pem_certs(&a.admin_cert_pem).unwrap();
        assert_eq!(
            Identity::from_cert_der(&admin[0]).unwrap(),
            Identity::Admin { name: "admin".into() }
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        let mut more = names();
        more.push("cp.example.internal".into());
        let c = Pki::load_or_create(dir.path(), &more).unwrap();
        assert_eq!(
            c.ca_hash(),
            a.ca_hash(),
            "the CA survives a new advertise address"
        );
        assert_ne!(c.server_chain_pem, a.server_chain_pem, "serving cert re-issued");
    }

    #[test]
    fn node_identity_comes_from_the_server_not_the_csr() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::load_or_create(dir.path(), &names()).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec!["evil.example".to_string()]).unwrap();
        p.subject_alt_names
            .push(SanType::URI(Ia5String::try_from("urn:lks:admin:admin").unwrap()));
        let csr = p.serialize_request(&key).unwrap().pem().unwrap();
        let id = NodeIdentity::new("tenant-a", "w1").unwrap();
        let issued = pki.issue_node_cert(&csr, &id, Duration::from_secs(3600)).unwrap();
        let der = &lks_proto::identity::pem_certs(&issued.pem).unwrap()[0];
        assert_eq!(Identity::from_cert_der(der).unwrap(), Identity::Node(id.clone()));
        assert_eq!(cert_info(der).unwrap().serial, issued.serial);
        assert!(!has_names(der, &["evil.example".to_string()]));

        assert!(matches!(
            pki.issue_node_cert("garbage", &id, Duration::from_secs(60)),
            Err(PkiError::BadCsr(_))
        ));
        // A CSR whose signature does not match its key is refused.
        let good = CertificateParams::default().serialize_request(&key).unwrap();
        let mut der = good.der().to_vec();
        let n = der.len();
        der[n - 5] ^= 0x55;
        let pem = format!(
            "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
            base64_lines(&der)
        );
        assert!(matches!(
            pki.issue_node_cert(&pem, &id, Duration::from_secs(60)),
            Err(PkiError::BadCsr(_))
        ));
    }

    fn base64_lines(der: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for c in der.chunks(3) {
            let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
            let v = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= c.len() {
                    s.push(A[((v >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    s.push('=');
                }
            }
        }
        s
    }
}
