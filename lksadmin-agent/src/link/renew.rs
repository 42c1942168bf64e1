//! Node certificate renewal: at a random point in 70–90 % of the current
//! certificate's lifetime, a new key and CSR go to `RenewCertificate` over
//! the current mTLS channel, and the new key and certificate replace the old
//! pair in one atomic directory exchange.

use std::fs::File;
use std::time::Duration;

use lks_proto::fsutil::{self, FsError};
use lks_proto::identity::{cert_info, pem_certs};
use lks_proto::pb;
use nix::fcntl::RenameFlags;
use rcgen::{CertificateParams, KeyPair, PublicKeyData};
use tokio_util::sync::CancellationToken;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::clock::now_ms;
use crate::config::StateDir;
use crate::link::backoff::{self, Backoff, unit_random};
use crate::link::channel::SharedChannel;

#[derive(Debug, thiserror::Error)]
pub enum RenewError {
    #[error("read the node certificate: {0}")]
    Read(String),
    #[error("not connected to the control server")]
    NotConnected,
    #[error("make a key and CSR: {0}")]
    KeyGen(String),
    #[error("RenewCertificate: {0}")]
    Rpc(String),
    #[error("the renewed certificate {0}")]
    BadCert(&'static str),
    #[error(transparent)]
    Fs(#[from] FsError),
}

/// `(not_before, not_after)` of the node certificate, in Unix seconds.
pub fn validity(dirs: &StateDir) -> Result<(i64, i64), RenewError> {
    let pem = std::fs::read_to_string(dirs.node_cert()).map_err(|e| RenewError::Read(e.to_string()))?;
    let der = pem_certs(&pem).map_err(|e| RenewError::Read(e.to_string()))?;
    let info = cert_info(&der[0]).map_err(|e| RenewError::Read(e.to_string()))?;
    Ok((info.not_before, info.not_after))
}

/// A random instant (Unix ms) in 70–90 % of the validity window.
pub fn renewal_point(not_before: i64, not_after: i64) -> i64 {
    let life_ms = (not_after - not_before).max(0) * 1000;
    not_before * 1000 + (life_ms as f64 * (0.7 + 0.2 * unit_random())) as i64
}

/// Renews the certificate whenever it is due, until cancelled.
pub async fn renewal_loop(dirs: StateDir, channel: SharedChannel, cancel: CancellationToken) {
    let mut renewed = false;
    loop {
        let due = match validity(&dirs) {
            // Right after a renewal, a certificate whose 70–90 % point is
            // already past (a lifetime short against the issuer's backdating)
            // is renewed halfway through what is left, never in a tight loop.
            Ok((nb, na)) if renewed => {
                renewal_point(nb, na).max(now_ms() + (na * 1000 - now_ms()).max(2000) / 2)
            }
            Ok((nb, na)) => renewal_point(nb, na),
            Err(e) => {
                tracing::warn!("certificate renewal: {e}");
                now_ms() + 3_600_000
            }
        };
        // Sleep in bounded slices so a clock change is noticed.
        loop {
            let left = due - now_ms();
            if left <= 0 {
                break;
            }
            let slice = Duration::from_millis(left.min(600_000) as u64);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(slice) => {}
            }
        }
        let mut backoff = Backoff::new(Duration::from_secs(5), Duration::from_secs(600));
        loop {
            match renew_once(&dirs, &channel).await {
                Ok(not_after) => {
                    tracing::info!(valid_until = %crate::clock::when(not_after * 1000), "renewed the node certificate");
                    renewed = true;
                    break;
                }
                Err(e) => {
                    tracing::warn!("renew the node certificate: {e}");
                    if !backoff::wait(&mut backoff, None, &cancel).await {
                        return;
                    }
                }
            }
        }
    }
}

/// One renewal; returns the new certificate's `not_after`.
pub async fn renew_once(dirs: &StateDir, channel: &SharedChannel) -> Result<i64, RenewError> {
    let ch = channel.get().ok_or(RenewError::NotConnected)?;
    let key = KeyPair::generate().map_err(|e| RenewError::KeyGen(e.to_string()))?;
    let csr_pem = CertificateParams::default()
        .serialize_request(&key)
        .and_then(|c| c.pem())
        .map_err(|e| RenewError::KeyGen(e.to_string()))?;
    let resp = pb::agent_service_client::AgentServiceClient::new(ch)
        .renew_certificate(pb::RenewCertificateRequest { csr_pem })
        .await
        .map_err(|s| RenewError::Rpc(s.message().to_string()))?
        .into_inner();
    let der = pem_certs(&resp.certificate_pem).map_err(|_| RenewError::BadCert("is not PEM"))?;
    let (_, cert) =
        X509Certificate::from_der(&der[0]).map_err(|_| RenewError::BadCert("is not valid X.509"))?;
    if cert.public_key().raw != key.subject_public_key_info().as_slice() {
        return Err(RenewError::BadCert("is not for the new key"));
    }
    let not_after = cert.validity().not_after.timestamp();
    install(dirs, &key.serialize_pem(), &resp.certificate_pem)?;
    Ok(not_after)
}

/// Replaces `pki/` with a directory holding the new key, certificate and
/// the unchanged CA, by `RENAME_EXCHANGE`: key and certificate switch
/// together or not at all.
pub fn install(dirs: &StateDir, key_pem: &str, cert_pem: &str) -> Result<(), RenewError> {
    let new = dirs.path().join("pki.new");
    fsutil::remove_dir_all(&new)?;
    fsutil::create_dir(&new, 0o700)?;
    let ca = std::fs::read(dirs.ca_cert()).map_err(|e| FsError::new("read", &dirs.ca_cert(), e))?;
    fsutil::write_atomic(&new.join("ca.crt"), &ca, 0o644)?;
    fsutil::write_atomic(&new.join("node.key"), key_pem.as_bytes(), 0o600)?;
    fsutil::write_atomic(&new.join("node.crt"), cert_pem.as_bytes(), 0o644)?;
    let dir = File::open(dirs.path()).map_err(|e| FsError::new("open", dirs.path(), e))?;
    nix::fcntl::renameat2(&dir, "pki.new", &dir, "pki", RenameFlags::RENAME_EXCHANGE)
        .map_err(|e| FsError::new("exchange", &dirs.pki(), e.into()))?;
    fsutil::sync_dir(dirs.path())?;
    fsutil::remove_dir_all(&new)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_point_is_in_70_to_90_percent() {
        for _ in 0..200 {
            let p = renewal_point(1000, 2000);
            assert!((1_700_000..=1_900_000).contains(&p), "{p}");
        }
    }

    #[test]
    fn install_swaps_key_and_cert_together() {
        let d = tempfile::tempdir().unwrap();
        let dirs = StateDir::new(d.path());
        std::fs::create_dir(dirs.pki()).unwrap();
        std::fs::write(dirs.ca_cert(), "CA").unwrap();
        std::fs::write(dirs.node_key(), "old key").unwrap();
        std::fs::write(dirs.node_cert(), "old cert").unwrap();
        install(&dirs, "new key", "new cert").unwrap();
        assert_eq!(std::fs::read_to_string(dirs.node_key()).unwrap(), "new key");
        assert_eq!(std::fs::read_to_string(dirs.node_cert()).unwrap(), "new cert");
        assert_eq!(std::fs::read_to_string(dirs.ca_cert()).unwrap(), "CA");
        assert!(!d.path().join("pki.new").exists());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dirs.node_key()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
