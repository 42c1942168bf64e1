use super::*;
use x509_parser::extensions::{GeneralName, ParsedExtension};

const RSA_CRT: &str = include_str!("testdata/test-only-rsa-ca.crt");
const RSA_KEY: &str = include_str!("testdata/test-only-rsa-ca.key");
const EC_CRT: &str = include_str!("testdata/test-only-ec-ca.crt");
const EC_KEY: &str = include_str!("testdata/test-only-ec-ca.key");

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

fn csr(alg: &'static rcgen::SignatureAlgorithm) -> String {
    let key = KeyPair::generate_for(alg).unwrap();
    // Names in the CSR are ignored: only its public key counts.
    let p = CertificateParams::new(vec!["evil.example".to_string()]).unwrap();
    p.serialize_request(&key).unwrap().pem().unwrap()
}

fn template(usage: Usage) -> CertTemplate {
    CertTemplate {
        common_name: "system:node:w1".into(),
        organizations: vec!["system:nodes".into(), "second".into()],
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        usage,
        ttl: Duration::from_secs(3600),
    }
}

fn der(pem: &str) -> Vec<u8> {
    single_cert(pem).unwrap()
}

/// Checks what every issued certificate must be; returns its DER.
fn check_issued(ca: &ClusterCa, s: &SignedCert, t: &CertTemplate) -> Vec<u8> {
    let d = der(&s.pem);
    let ca_der = der(ca.cert_pem());
    let (_, c) = X509Certificate::from_der(&d).unwrap();
    let (_, cac) = X509Certificate::from_der(&ca_der).unwrap();
    assert_eq!(
        c.issuer().as_raw(),
        cac.subject().as_raw(),
        "issuer is the CA's subject"
    );
    c.verify_signature(Some(cac.public_key()))
        .expect("signed by the CA");
    assert_eq!(hex::encode(c.raw_serial()), s.serial);
    assert!(!c.is_ca());
    let cn: Vec<_> = c
        .subject()
        .iter_common_name()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(cn, [t.common_name.as_str()]);
    let orgs: Vec<_> = c
        .subject()
        .iter_organization()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(orgs, t.organizations);
    let eku = c.extended_key_usage().unwrap().unwrap().value;
    assert_eq!(eku.client_auth, t.usage == Usage::Client);
    assert_eq!(eku.server_auth, t.usage == Usage::Server);
    assert!(c.key_usage().unwrap().unwrap().value.digital_signature());
    assert_eq!(c.validity().not_after.timestamp() * 1000, s.not_after_ms);
    assert_eq!(c.validity().not_before.timestamp() * 1000, s.not_before_ms);
    let mut sans = Vec::new();
    for e in c.extensions() {
        if let ParsedExtension::SubjectAlternativeName(san) = e.parsed_extension() {
            for n in &san.general_names {
                match n {
                    GeneralName::DNSName(d) => sans.push(d.to_string()),
                    GeneralName::IPAddress(b) => sans.push(format!("ip:{}", hex::encode(b))),
                    other => sans.push(format!("{other:?}")),
                }
            }
        }
    }
    let want: Vec<String> = t
        .dns_names
        .iter()
        .cloned()
        .chain(t.ip_addresses.iter().map(|ip| match ip {
            IpAddr::V4(a) => format!("ip:{}", hex::encode(a.octets())),
            IpAddr::V6(a) => format!("ip:{}", hex::encode(a.octets())),
        }))
        .collect();
    assert_eq!(sans, want, "SANs come from the template only");
    d
}

#[test]
fn a_generated_ca_signs_client_and_server_certificates() {
    let ca = ClusterCa::generate("tenant-a", now()).unwrap();
    let ca_der = der(ca.cert_pem());
    let (_, c) = X509Certificate::from_der(&ca_der).unwrap();
    assert!(c.is_ca());
    assert_eq!(
        c.subject().iter_common_name().next().unwrap().as_str().unwrap(),
        "tenant-a-ca"
    );
    let ku = c.key_usage().unwrap().unwrap().value;
    assert!(ku.key_cert_sign() && ku.crl_sign());
    let left = c.validity().not_after.timestamp() - now().unix_timestamp();
    assert!((left - 10 * 365 * 86400).abs() < 60, "ten years: {left}s");
    assert_eq!(ca.hash(), ca_cert_hash(&der(ca.cert_pem())).unwrap());

    let client = template(Usage::Client);
    let s = ca
        .sign(&csr(&rcgen::PKCS_ECDSA_P256_SHA256), &client, now())
        .unwrap();
    check_issued(&ca, &s, &client);
    let t0 = now().unix_timestamp() * 1000;
    assert!(s.not_before_ms <= t0 - 250_000, "backdated for clock skew");
    assert!((s.not_after_ms - t0 - 3_600_000).abs() < 5_000);

    let server = CertTemplate {
        common_name: "w1".into(),
        organizations: Vec::new(),
        dns_names: vec!["w1".into(), "w1.cluster.internal".into()],
        ip_addresses: vec!["10.0.0.7".parse().unwrap(), "fd00::7".parse().unwrap()],
        usage: Usage::Server,
        ttl: Duration::from_secs(86400),
    };
    let s2 = ca.sign(&csr(&rcgen::PKCS_ED25519), &server, now()).unwrap();
    check_issued(&ca, &s2, &server);
    assert_ne!(s.serial, s2.serial, "random serials");
    assert_eq!(s.serial, s.serial.to_lowercase());

    // The key round-trips through its PEM.
    let again = ClusterCa::load(ca.cert_pem(), ca.key_pem()).unwrap();
    let s3 = again
        .sign(&csr(&rcgen::PKCS_ECDSA_P256_SHA256), &client, now())
        .unwrap();
    check_issued(&ca, &s3, &client);
}

#[test]
fn the_validity_is_clamped_to_the_ca_and_an_expired_ca_signs_nothing() {
    let ca = ClusterCa::generate("c", now()).unwrap();
    let mut t = template(Usage::Client);
    t.ttl = Duration::from_secs(20 * 365 * 86400);
    let s = ca.sign(&csr(&rcgen::PKCS_ECDSA_P256_SHA256), &t, now()).unwrap();
    assert_eq!(s.not_after_ms, ca.not_after().unix_timestamp() * 1000);
    t.ttl = Duration::MAX;
    let s = ca.sign(&csr(&rcgen::PKCS_ECDSA_P256_SHA256), &t, now()).unwrap();
    assert_eq!(s.not_after_ms, ca.not_after().unix_timestamp() * 1000);
    let later = ca.not_after() + time::Duration::seconds(1);
    let e = ca
        .sign(&csr(&rcgen::PKCS_ECDSA_P256_SHA256), &t, later)
        .unwrap_err();
    assert!(matches!(e, CaError::Expired(_)), "{e}");
}

#[test]
fn a_csr_must_be_well_formed_and_self_signed() {
    let ca = ClusterCa::generate("c", now()).unwrap();
    let t = template(Usage::Client);
    assert!(matches!(ca.sign("garbage", &t, now()), Err(CaError::BadCsr(_))));
    let good = csr(&rcgen::PKCS_ECDSA_P256_SHA256);
    use base64::Engine as _;
    use rustls_pki_types::CertificateSigningRequestDer;
    let mut d = CertificateSigningRequestDer::from_pem_slice(good.as_bytes())
        .unwrap()
        .as_ref()
        .to_vec();
    let n = d.len();
    d[n - 5] ^= 0x55;
    let bad = format!(
        "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
        base64::engine::general_purpose::STANDARD.encode(&d)
    );
    assert!(matches!(ca.sign(&bad, &t, now()), Err(CaError::BadCsr(_))));
    let mut empty = t.clone();
    empty.common_name.clear();
    assert!(matches!(
        ca.sign(&good, &empty, now()),
        Err(CaError::BadTemplate(_))
    ));
}

#[test]
fn an_imported_rsa_ca_with_a_pkcs1_key_signs() {
    let ca = ClusterCa::import(RSA_CRT, RSA_KEY, now()).unwrap();
    assert_eq!(ca.cert_pem().trim(), RSA_CRT.trim(), "the certificate as given");
    assert!(
        ca.key_pem().starts_with("-----BEGIN PRIVATE KEY-----"),
        "kept as PKCS#8"
    );
    for alg in [&rcgen::PKCS_ECDSA_P256_SHA256, &rcgen::PKCS_ECDSA_P384_SHA384] {
        let t = template(Usage::Client);
        let s = ca.sign(&csr(alg), &t, now()).unwrap();
        let d = check_issued(&ca, &s, &t);
        let (_, c) = X509Certificate::from_der(&d).unwrap();
        assert_eq!(
            c.signature_algorithm.algorithm.to_id_string(),
            "1.2.840.113549.1.1.11"
        );
    }
    // Loaded back from what the store keeps, it is the same CA.
    let back = ClusterCa::load(ca.cert_pem(), ca.key_pem()).unwrap();
    assert_eq!(back.hash(), ca.hash());
}

#[test]
fn an_imported_ec_ca_with_a_sec1_key_signs() {
    let ca = ClusterCa::import(EC_CRT, EC_KEY, now()).unwrap();
    let t = template(Usage::Server);
    let s = ca.sign(&csr(&rcgen::PKCS_ECDSA_P256_SHA256), &t, now()).unwrap();
    check_issued(&ca, &s, &t);
}

#[test]
fn imports_are_refused_with_one_clear_reason() {
    let n = now();
    let other = ClusterCa::generate("other", n).unwrap();
    let e = ClusterCa::import(RSA_CRT, other.key_pem(), n).unwrap_err();
    assert!(matches!(e, CaError::KeyMismatch), "{e}");
    let e = ClusterCa::import(EC_CRT, RSA_KEY, n).unwrap_err();
    assert!(matches!(e, CaError::KeyMismatch), "{e}");

    let two = format!("{RSA_CRT}{}", other.cert_pem());
    let e = ClusterCa::import(&two, RSA_KEY, n).unwrap_err();
    assert!(matches!(e, CaError::SeveralCertificates(2)), "{e}");
    assert!(matches!(
        ClusterCa::import("garbage", RSA_KEY, n),
        Err(CaError::NoCertificate)
    ));
    assert!(matches!(
        ClusterCa::import(RSA_CRT, "garbage", n),
        Err(CaError::BadKey(_))
    ));
    assert!(matches!(
        ClusterCa::import(RSA_CRT, RSA_CRT, n),
        Err(CaError::BadKey(_))
    ));

    // A leaf certificate is not a CA.
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["x".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let e = ClusterCa::import(&leaf.pem(), &key.serialize_pem(), n).unwrap_err();
    assert!(matches!(e, CaError::NotCa), "{e}");

    // A CA whose key usage lacks keyCertSign may not sign.
    let mut p = CertificateParams::default();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let ca = p.self_signed(&key).unwrap();
    let e = ClusterCa::import(&ca.pem(), &key.serialize_pem(), n).unwrap_err();
    assert!(matches!(e, CaError::NoCertSign), "{e}");

    // Expired, and not yet valid.
    let mut p = CertificateParams::default();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.not_before = n - time::Duration::days(30);
    p.not_after = n - time::Duration::days(1);
    let old = p.self_signed(&key).unwrap();
    let e = ClusterCa::import(&old.pem(), &key.serialize_pem(), n).unwrap_err();
    assert!(matches!(e, CaError::Expired(_)), "{e}");
    p.not_before = n + time::Duration::days(1);
    p.not_after = n + time::Duration::days(30);
    let future = p.self_signed(&key).unwrap();
    let e = ClusterCa::import(&future.pem(), &key.serialize_pem(), n).unwrap_err();
    assert!(matches!(e, CaError::NotYetValid(_)), "{e}");

    // Every refusal is one line.
    for e in [
        CaError::KeyMismatch.to_string(),
        ClusterCa::import("garbage", "garbage", n)
            .unwrap_err()
            .to_string(),
        ClusterCa::import(RSA_CRT, "garbage", n).unwrap_err().to_string(),
    ] {
        assert!(!e.contains('\n'), "{e}");
    }
}
