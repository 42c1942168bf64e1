//! Conversions between the generated protobuf types and the domain types.
//!
//! Protobuf → domain is `TryFrom` and applies every bundle rule, so a server
//! or agent never acts on a message it has not validated. The error names the
//! field (`file[3].digest: …`) and maps to `Status::invalid_argument`.

use std::time::Duration;

use crate::arch::Arch;
use crate::certs::{CertificateSpec, KubeconfigSpec};
use crate::chunks::Chunks;
use crate::digest::Digest;
use crate::limits::{
    DEFAULT_HEALTH_INTERVAL, DEFAULT_HEALTH_RETRIES, DEFAULT_HEALTH_TIMEOUT, DEFAULT_STEP_TIMEOUT,
};
use crate::manifest::{
    BundleState, FileSpec, HealthCheck, Manifest, ManifestError, Reboot, Signature, SignedBundle, Step,
};
use crate::path::BundlePath;
use lks_wire::pb;

impl TryFrom<pb::Manifest> for Manifest {
    type Error = ManifestError;

    fn try_from(m: pb::Manifest) -> Result<Self, Self::Error> {
        let files = m
            .files
            .into_iter()
            .enumerate()
            .map(|(i, f)| file_from_pb(i, f))
            .collect::<Result<Vec<_>, ManifestError>>()?;
        let steps = m
            .steps
            .into_iter()
            .map(|s| Step {
                name: s.name,
                run: s.run,
                timeout: ms_or(s.timeout_ms, DEFAULT_STEP_TIMEOUT),
                on_heal: s.on_heal,
            })
            .collect();
        let health = m.health.map(|h| HealthCheck {
            run: h.run,
            timeout: ms_or(h.timeout_ms, DEFAULT_HEALTH_TIMEOUT),
            retries: if h.retries == 0 {
                DEFAULT_HEALTH_RETRIES
            } else {
                h.retries
            },
            interval: ms_or(h.interval_ms, DEFAULT_HEALTH_INTERVAL),
        });
        let certificates = m
            .certificates
            .into_iter()
            .enumerate()
            .map(|(i, c)| certificate_from_pb(i, c))
            .collect::<Result<Vec<_>, ManifestError>>()?;
        let kubeconfigs = m
            .kubeconfigs
            .into_iter()
            .enumerate()
            .map(|(i, k)| {
                let path = |n: &str, v: &str| {
                    BundlePath::new(v).map_err(|e| ManifestError::new(format!("kubeconfig[{i}].{n}"), e))
                };
                Ok(KubeconfigSpec {
                    path: path("path", &k.path)?,
                    certificate: path("certificate", &k.certificate)?,
                })
            })
            .collect::<Result<Vec<_>, ManifestError>>()?;
        let architectures = m
            .architectures
            .iter()
            .enumerate()
            .map(|(i, a)| Arch::parse(a).map_err(|e| ManifestError::new(format!("architectures[{i}]"), e)))
            .collect::<Result<Vec<_>, _>>()?;
        let manifest = Manifest {
            architectures,
            name: m.name,
            version: m.version,
            files,
            steps,
            health,
            certificates,
            kubeconfigs,
            issued: Vec::new(),
            self_update: m.self_update,
            reboot: if m.reboot_required {
                Reboot::Required
            } else {
                Reboot::NotRequired
            },
        };
        manifest.validate()?;
        Ok(manifest)
    }
}

/// `file[i]` of a manifest on the wire.
fn file_from_pb(i: usize, f: pb::FileEntry) -> Result<FileSpec, ManifestError> {
    let field = |n: &str| format!("file[{i}].{n}");
    Ok(FileSpec {
        arch: (!f.arch.is_empty())
            .then(|| Arch::parse(&f.arch))
            .transpose()
            .map_err(|e| ManifestError::new(field("arch"), e))?,
        path: BundlePath::new(&f.path).map_err(|e| ManifestError::new(field("path"), e))?,
        digest: f
            .digest
            .parse::<Digest>()
            .map_err(|e| ManifestError::new(field("digest"), e))?,
        size: f.size,
        mode: f.mode,
        url: (!f.url.is_empty()).then_some(f.url),
        chunks: match (f.chunk_size, f.chunk_digests.len()) {
            (0, 0) => None,
            (size, _) => Some(Chunks {
                size,
                digests: f
                    .chunk_digests
                    .iter()
                    .map(|d| {
                        <[u8; 32]>::try_from(d.as_slice())
                            .map(Digest::from_bytes)
                            .map_err(|_| {
                                ManifestError::new(field("chunk_digests"), "a digest is not 32 bytes")
                            })
                    })
                    .collect::<Result<_, _>>()?,
            }),
        },
    })
}

/// `certificate[i]` of a manifest on the wire.
fn certificate_from_pb(i: usize, c: pb::CertificateRequest) -> Result<CertificateSpec, ManifestError> {
    let field = |n: &str| format!("certificate[{i}].{n}");
    let path = |n: &str, v: &str| BundlePath::new(v).map_err(|e| ManifestError::new(field(n), e));
    Ok(CertificateSpec {
        path: path("path", &c.path)?,
        key_path: path("key_path", &c.key_path)?,
        profile: c
            .profile
            .parse()
            .map_err(|e| ManifestError::new(field("profile"), e))?,
        common_name: c.common_name,
        organizations: c.organizations,
        dns_names: c.dns_names,
        ip_addresses: c.ip_addresses,
        ttl: ms_or(c.ttl_ms, crate::certs::DEFAULT_TTL),
        ca_path: (!c.ca_path.is_empty())
            .then(|| path("ca_path", &c.ca_path))
            .transpose()?,
    })
}

fn ms_or(ms: u64, default: Duration) -> Duration {
    if ms == 0 {
        default
    } else {
        Duration::from_millis(ms)
    }
}

impl From<&Manifest> for pb::Manifest {
    fn from(m: &Manifest) -> Self {
        pb::Manifest {
            name: m.name.clone(),
            version: m.version.clone(),
            files: m
                .files
                .iter()
                .map(|f| pb::FileEntry {
                    path: f.path.to_string(),
                    digest: f.digest.to_string(),
                    size: f.size,
                    mode: f.mode,
                    url: f.url.clone().unwrap_or_default(),
                    arch: f.arch.map(|a| a.to_string()).unwrap_or_default(),
                    chunk_size: f.chunks.as_ref().map_or(0, |c| c.size),
                    chunk_digests: f
                        .chunks
                        .iter()
                        .flat_map(|c| &c.digests)
                        .map(|d| d.as_bytes().to_vec())
                        .collect(),
                })
                .collect(),
            steps: m
                .steps
                .iter()
                .map(|s| pb::Step {
                    name: s.name.clone(),
                    run: s.run.clone(),
                    timeout_ms: s.timeout.as_millis() as u64,
                    on_heal: s.on_heal,
                })
                .collect(),
            health: m.health.as_ref().map(|h| pb::HealthCheck {
                run: h.run.clone(),
                timeout_ms: h.timeout.as_millis() as u64,
                retries: h.retries,
                interval_ms: h.interval.as_millis() as u64,
            }),
            certificates: m
                .certificates
                .iter()
                .map(|c| pb::CertificateRequest {
                    path: c.path.to_string(),
                    key_path: c.key_path.to_string(),
                    profile: c.profile.as_str().into(),
                    common_name: c.common_name.clone(),
                    organizations: c.organizations.clone(),
                    dns_names: c.dns_names.clone(),
                    ip_addresses: c.ip_addresses.clone(),
                    ttl_ms: c.ttl.as_millis() as u64,
                    ca_path: c.ca_path.as_ref().map(ToString::to_string).unwrap_or_default(),
                })
                .collect(),
            kubeconfigs: m
                .kubeconfigs
                .iter()
                .map(|k| pb::Kubeconfig {
                    path: k.path.to_string(),
                    certificate: k.certificate.to_string(),
                })
                .collect(),
            self_update: m.self_update,
            architectures: m.architectures.iter().map(ToString::to_string).collect(),
            reboot_required: m.reboot.is_required(),
        }
    }
}

impl TryFrom<pb::SignedBundle> for SignedBundle {
    type Error = ManifestError;

    fn try_from(b: pb::SignedBundle) -> Result<Self, Self::Error> {
        let manifest: Manifest = b
            .manifest
            .ok_or_else(|| ManifestError::new("manifest", "missing"))?
            .try_into()?;
        let signature = match (b.signature.len(), b.signer_public_key.len()) {
            (0, 0) => None,
            (64, 32) => {
                let mut signature = [0u8; 64];
                signature.copy_from_slice(&b.signature);
                let mut public_key = [0u8; 32];
                public_key.copy_from_slice(&b.signer_public_key);
                Some(Signature {
                    public_key,
                    signature,
                })
            }
            (s, k) => {
                return Err(ManifestError::new(
                    "signature",
                    format!("expected a 64-byte signature and a 32-byte key, got {s} and {k} bytes"),
                ));
            }
        };
        let chunks_signature = match b.chunks_signature.len() {
            0 => None,
            _ if signature.is_none() => {
                return Err(ManifestError::new(
                    "chunks_signature",
                    "set on an unsigned bundle",
                ));
            }
            64 => {
                let mut s = [0u8; 64];
                s.copy_from_slice(&b.chunks_signature);
                Some(s)
            }
            n => {
                return Err(ManifestError::new(
                    "chunks_signature",
                    format!("expected 64 bytes, got {n}"),
                ));
            }
        };
        Ok(SignedBundle {
            manifest,
            signature,
            chunks_signature,
        })
    }
}

impl From<&SignedBundle> for pb::SignedBundle {
    fn from(b: &SignedBundle) -> Self {
        pb::SignedBundle {
            manifest: Some((&b.manifest).into()),
            signature: b
                .signature
                .as_ref()
                .map(|s| s.signature.to_vec())
                .unwrap_or_default(),
            signer_public_key: b
                .signature
                .as_ref()
                .map(|s| s.public_key.to_vec())
                .unwrap_or_default(),
            chunks_signature: b.chunks_signature.map(|s| s.to_vec()).unwrap_or_default(),
        }
    }
}

impl TryFrom<pb::BundleState> for BundleState {
    type Error = ManifestError;

    fn try_from(s: pb::BundleState) -> Result<Self, Self::Error> {
        Ok(match s {
            pb::BundleState::Pending => BundleState::Pending,
            pb::BundleState::Applying => BundleState::Applying,
            pb::BundleState::Applied => BundleState::Applied,
            pb::BundleState::Failed => BundleState::Failed,
            pb::BundleState::RolledBack => BundleState::RolledBack,
            pb::BundleState::Unspecified => return Err(ManifestError::new("state", "unspecified")),
        })
    }
}

impl From<BundleState> for pb::BundleState {
    fn from(s: BundleState) -> Self {
        match s {
            BundleState::Pending => pb::BundleState::Pending,
            BundleState::Applying => pb::BundleState::Applying,
            BundleState::Applied => pb::BundleState::Applied,
            BundleState::Failed => pb::BundleState::Failed,
            BundleState::RolledBack => pb::BundleState::RolledBack,
        }
    }
}

/// Decodes the `state` field of a `BundleStatus` (an `i32` on the wire).
pub fn bundle_state_from_i32(v: i32) -> Result<BundleState, ManifestError> {
    pb::BundleState::try_from(v)
        .map_err(|_| ManifestError::new("state", format!("unknown value {v}")))?
        .try_into()
}

/// The name of a rollout's state (an `i32` on the wire) as `rollout status
/// -o json` and the `LksRollout` phase show it; "unknown" for a value this
/// build does not know.
pub fn rollout_state_str(v: i32) -> &'static str {
    match pb::RolloutState::try_from(v) {
        Ok(pb::RolloutState::Running) => "running",
        Ok(pb::RolloutState::Paused) => "paused",
        Ok(pb::RolloutState::Completed) => "completed",
        Ok(pb::RolloutState::Failed) => "failed",
        Ok(pb::RolloutState::Aborted) => "aborted",
        Ok(pb::RolloutState::RolledBack) => "rolled_back",
        Ok(pb::RolloutState::RollingBack) => "rolling_back",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::tests::sample;
    use prost::Message;

    #[test]
    fn manifest_round_trips_through_protobuf_bytes() {
        let m = sample();
        let bytes = pb::Manifest::from(&m).encode_to_vec();
        let back: Manifest = pb::Manifest::decode(bytes.as_slice())
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn reboot_crosses_the_wire_both_ways() {
        let mut m = sample();
        assert!(!pb::Manifest::from(&m).reboot_required);
        m.reboot = crate::manifest::Reboot::Required;
        let p = pb::Manifest::from(&m);
        assert!(p.reboot_required);
        let back: Manifest = pb::Manifest::decode(p.encode_to_vec().as_slice())
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn on_heal_crosses_the_wire_both_ways() {
        let mut m = sample();
        m.steps[0].on_heal = true;
        let p = pb::Manifest::from(&m);
        assert!(p.steps[0].on_heal);
        let back: Manifest = pb::Manifest::decode(p.encode_to_vec().as_slice())
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(back, m);
        assert!(!pb::Manifest::from(&sample()).steps[0].on_heal);
    }

    #[test]
    fn invalid_messages_name_the_field() {
        let mut p = pb::Manifest::from(&sample());
        p.files[1].path = "/etc/../shadow".into();
        assert_eq!(Manifest::try_from(p).unwrap_err().field, "file[1].path");

        let mut p = pb::Manifest::from(&sample());
        p.files[0].digest = "md5:abc".into();
        assert_eq!(Manifest::try_from(p).unwrap_err().field, "file[0].digest");

        let mut p = pb::Manifest::from(&sample());
        p.name = "UPPER".into();
        assert_eq!(Manifest::try_from(p).unwrap_err().field, "name");

        let b = pb::SignedBundle {
            manifest: None,
            ..Default::default()
        };
        assert_eq!(SignedBundle::try_from(b).unwrap_err().field, "manifest");

        let b = pb::SignedBundle {
            chunks_signature: Vec::new(),
            manifest: Some(pb::Manifest::from(&sample())),
            signature: vec![0; 10],
            signer_public_key: vec![0; 32],
        };
        assert_eq!(SignedBundle::try_from(b).unwrap_err().field, "signature");
    }

    #[test]
    fn zero_timeouts_mean_defaults() {
        let mut p = pb::Manifest::from(&sample());
        p.steps[0].timeout_ms = 0;
        p.health.as_mut().unwrap().retries = 0;
        let m = Manifest::try_from(p).unwrap();
        assert_eq!(m.steps[0].timeout, DEFAULT_STEP_TIMEOUT);
        assert_eq!(m.health.unwrap().retries, DEFAULT_HEALTH_RETRIES);
    }

    #[test]
    fn states() {
        assert_eq!(
            bundle_state_from_i32(pb::BundleState::RolledBack as i32).unwrap(),
            BundleState::RolledBack
        );
        assert!(bundle_state_from_i32(0).is_err());
        assert!(bundle_state_from_i32(99).is_err());
    }
}
