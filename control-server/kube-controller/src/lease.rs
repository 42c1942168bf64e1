//! Leader election through a `coordination.k8s.io/v1` Lease, so that two
//! copies of the controller can run (a Deployment with 2 replicas): the
//! holder renews it every [`RENEW`]; another copy takes it over only once
//! it has not been renewed for [`DURATION`]. Every write is guarded by the
//! Lease's resourceVersion, so two copies never both hold it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};

/// How long a Lease not renewed is still its holder's.
pub const DURATION: Duration = Duration::from_secs(15);
/// How often the holder renews it.
pub const RENEW: Duration = Duration::from_secs(5);

/// Why the Lease could not be taken or renewed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("lease {name}: {source}")]
    Kube {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("lease {0}: kube0 did not answer within {RENEW:?}")]
    Timeout(String),
}

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
}

impl Elector {
    pub fn new(client: kube::Client, namespace: &str, name: &str, identity: &str) -> Self {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
        }
    }

    /// [`Elector::lead`], given at most [`RENEW`]: a kube0 that does not
    /// answer is an error, so the caller can stop leading before another
    /// copy may take the Lease over.
    pub async fn lead_in_time(&self) -> Result<bool, LeaseError> {
        match tokio::time::timeout(RENEW, self.lead()).await {
            Ok(Ok(l)) => Ok(l),
            Ok(Err(source)) => Err(LeaseError::Kube {
                name: self.name.clone(),
                source,
            }),
            Err(_) => Err(LeaseError::Timeout(self.name.clone())),
        }
    }

    /// Takes or renews the Lease; true while this copy holds it. A write
    /// that lost a race (409) is "not leading", not an error.
    pub async fn lead(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let duration = i32::try_from(DURATION.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return conflict_is_false(self.api.create(&PostParams::default(), &lease).await);
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let ours = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let expired = spec.renew_time.as_ref().is_none_or(|t| {
            let held = i64::from(spec.lease_duration_seconds.unwrap_or(duration)).max(1);
            t.0.as_second().saturating_add(held) < now.as_second()
        });
        if !ours && !expired {
            return Ok(false);
        }
        if !ours {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.lease_duration_seconds = Some(duration);
        spec.renew_time = Some(MicroTime(now));
        // replace carries the resourceVersion read: a concurrent write wins.
        conflict_is_false(self.api.replace(&self.name, &PostParams::default(), &lease).await)
    }
}

fn conflict_is_false(r: Result<Lease, kube::Error>) -> Result<bool, kube::Error> {
    match r {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}
