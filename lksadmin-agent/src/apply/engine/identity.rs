//! The node's own identity files: for a bundle's `[[certificate]]` and
//! `[[kubeconfig]]` entries, a fresh key and CSR each, the certificate the
//! cluster CA issues, the CA and the kubeconfigs, made into the cache; and
//! their renewal once a certificate passes its renewal point.

use std::collections::BTreeMap;
use std::fs;

use lks_proto::{BundlePath, BundleState, FileSpec, Manifest, pb};

use super::{Engine, EngineError, RENEW_RETRY_MS, Verdict};
use crate::clock::rfc3339;
use crate::node::certs::{self, IssueError, Issued};

impl Engine {
    /// Makes the node's own files for `m`'s `[[certificate]]` and
    /// `[[kubeconfig]]` entries — a fresh key each, a certificate the
    /// cluster CA signs for it, the CA, the kubeconfigs — into the cache,
    /// and returns `m` with them as `issued`. The keys stay in the state
    /// dir (mode 0600) and the node root; nothing but CSRs leaves the node.
    pub(super) async fn make_identity_files(&self, m: &Manifest) -> Result<Manifest, IssueError> {
        let mut out = m.requested();
        if m.certificates.is_empty() {
            return Ok(out);
        }
        let now = self.clock.now_ms();
        let mut answers: BTreeMap<BundlePath, (pb::IssueCertificateResponse, String)> = BTreeMap::new();
        for c in &m.certificates {
            let names = certs::names_for(c, &self.node)
                .map_err(|e| IssueError::Refused(format!("{}: {e}", c.path)))?;
            let k =
                certs::key_and_csr(&names).map_err(|e| IssueError::Refused(format!("{}: {e}", c.path)))?;
            let resp = self
                .issuer
                .issue(pb::IssueCertificateRequest {
                    bundle: m.name.clone(),
                    version: m.version.clone(),
                    path: c.path.to_string(),
                    csr_pem: k.csr_pem,
                })
                .await?;
            let issued = certs::check_issued(&resp.certificate_pem, &k.spki, now)
                .map_err(|e| IssueError::Refused(format!("{}: {e}", c.path)))?;
            if lks_proto::identity::pem_certs(&resp.ca_pem).is_err() {
                return Err(IssueError::Refused(format!(
                    "{}: the server sent no cluster CA",
                    c.path
                )));
            }
            self.put_made(&mut out, &c.path, resp.certificate_pem.as_bytes(), 0o644)?;
            self.put_made(&mut out, &c.key_path, k.key_pem.as_bytes(), 0o600)?;
            if let Some(ca) = &c.ca_path
                && !out.issued.iter().any(|f| &f.path == ca)
            {
                self.put_made(&mut out, ca, resp.ca_pem.as_bytes(), 0o644)?;
            }
            tracing::info!(
                bundle = %m.name,
                path = %c.path,
                serial = %issued.serial,
                not_after = %rfc3339(issued.not_after_ms),
                "certificate issued by cluster {}", resp.cluster
            );
            answers.insert(c.path.clone(), (resp, names.common_name));
        }
        for k in &m.kubeconfigs {
            let (Some(c), Some((resp, user))) = (m.certificate(&k.certificate), answers.get(&k.certificate))
            else {
                return Err(IssueError::Refused(format!(
                    "{}: no certificate {}",
                    k.path, k.certificate
                )));
            };
            if resp.api_server.is_empty() {
                return Err(IssueError::Refused(format!(
                    "{}: cluster {} has no API server address; set one with `lksctl cluster set {} --api-server URL`",
                    k.path, resp.cluster, resp.cluster
                )));
            }
            let text = certs::kubeconfig(
                &resp.cluster,
                &resp.api_server,
                &resp.ca_pem,
                user,
                c.path.as_str(),
                c.key_path.as_str(),
            );
            self.put_made(&mut out, &k.path, text.as_bytes(), 0o600)?;
        }
        out.validate()
            .map_err(|e| IssueError::Refused(format!("the files made for {}: {e}", m.id())))?;
        Ok(out)
    }

    fn put_made(
        &self,
        m: &mut Manifest,
        path: &BundlePath,
        bytes: &[u8],
        mode: u32,
    ) -> Result<(), IssueError> {
        let digest = self
            .cache
            .insert(bytes)
            .map_err(|e| IssueError::Unavailable(format!("cache: {e}")))?;
        m.issued.push(FileSpec {
            chunks: None,
            arch: None,
            path: path.clone(),
            digest,
            size: bytes.len() as u64,
            mode,
            url: None,
        });
        Ok(())
    }

    /// A renewal that could not even start: the bundle stays applied with
    /// its current certificates; tried again after [`RENEW_RETRY_MS`].
    pub(super) fn renewal_failed(&mut self, name: &str, version: &str, why: &str) -> Result<(), EngineError> {
        let retry_at = self.clock.now_ms().saturating_add(RENEW_RETRY_MS);
        let message = format!(
            "certificate renewal failed: {why}; keeping the current certificates, trying again at {}",
            rfc3339(retry_at)
        );
        tracing::warn!(bundle = name, version, "{message}");
        self.set_status(
            name,
            version,
            Verdict {
                state: BundleState::Applied,
                message: message.clone(),
                sticky: None,
            },
        )?;
        if let Some(r) = self.state.bundles.get_mut(name) {
            r.renew_retry_at_ms = retry_at;
        }
        self.save_state()?;
        self.event("renewal_failed", name, version, &message);
        Ok(())
    }

    /// Validity of each installed certificate of `m`, read from the cache,
    /// with the `ttl` its entry asked for.
    pub fn certificate_validity(&self, m: &Manifest) -> Vec<(BundlePath, std::time::Duration, Issued)> {
        m.certificates
            .iter()
            .filter_map(|c| {
                let f = m.issued.iter().find(|f| f.path == c.path)?;
                let bytes = fs::read(self.cache.blob_path(&f.digest)).ok()?;
                Some((c.path.clone(), c.ttl, certs::validity(&bytes)?))
            })
            .collect()
    }

    /// Renews the certificates of every applied bundle one of whose
    /// certificates has passed its renewal point: a transaction like any
    /// apply (steps, health check), that keeps the current pair if it fails.
    pub async fn renew_due(&mut self) -> Result<(), EngineError> {
        self.recover().await?;
        let now = self.clock.now_ms();
        let mut due = Vec::new();
        for (name, r) in &self.state.bundles {
            let Some(inst) = &r.installed else { continue };
            if inst.certificates.is_empty()
                || r.status.state != BundleState::Applied
                || r.status.version != inst.version
                || now < r.renew_retry_at_ms
            {
                continue;
            }
            let validity = self.certificate_validity(inst);
            let missing = validity.len() < inst.certificates.len();
            if missing
                || validity
                    .iter()
                    .any(|(_, ttl, c)| now >= certs::renew_at_ms(&self.node, c, *ttl))
            {
                due.push(name.clone());
            }
        }
        for name in due {
            let Some(rec) = self.state.bundles.get(&name).cloned() else {
                continue;
            };
            let Some(inst) = rec.installed.clone() else {
                continue;
            };
            tracing::info!(bundle = %name, version = %inst.version, "renewing certificates");
            self.apply(&inst.requested(), Some(rec), String::new(), true)
                .await?;
        }
        Ok(())
    }
}
