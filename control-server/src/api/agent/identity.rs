//! The agent API's node identity: enrolment with a bootstrap token (rate
//! limited per address here, then `ops::enrol`), certificate renewal, and
//! the certificates a bundle's `[[certificate]]` entries ask for.

use std::sync::Arc;
use std::time::Duration;

use lks_proto::backoff::with_retry_hint;
use lks_proto::identity::NodeIdentity;
use lks_proto::pb;
use tonic::{Request, Response, Status};

use super::{issue, record_event};
use crate::authz::{require_node, store_status};
use crate::clock::now_ms;
use crate::context::Shared;
use crate::metrics::Metrics;
use crate::ops::enrol::{self, Enrolment};
use crate::pki::Pki;
use crate::pki::clusterca::ClusterCas;
use crate::ratelimit::RateLimiter;
use crate::store::Store;

/// What the identity handlers use: the store, the server CA (node
/// certificates) and the tenant CAs (bundle certificates), the limits on
/// enrolment per address and on certificates per node, the metrics.
pub(super) struct Deps {
    pub store: Arc<dyn Store>,
    pub pki: Arc<Pki>,
    pub cluster_cas: Arc<ClusterCas>,
    pub limiter: Arc<RateLimiter>,
    pub issue_limiter: Arc<RateLimiter<String>>,
    pub metrics: Arc<Metrics>,
    pub node_cert_ttl: Duration,
}

impl Deps {
    pub fn of(s: &Shared) -> Self {
        Deps {
            store: s.store.clone(),
            pki: s.pki.clone(),
            cluster_cas: s.cluster_cas.clone(),
            limiter: s.limiter.clone(),
            issue_limiter: s.issue_limiter.clone(),
            metrics: s.metrics.clone(),
            node_cert_ttl: s.node_cert_ttl,
        }
    }
}

/// `Enroll`: rate limited per address; the outcome is counted by its metrics label.
pub(super) async fn enroll(
    s: &Deps,
    req: Request<pb::EnrollRequest>,
) -> Result<Response<pb::EnrollResponse>, Status> {
    if let Some(addr) = req.remote_addr()
        && let Err(wait) = s.limiter.check(addr.ip())
    {
        s.metrics.enrollment("rate_limited");
        // The human text for people, the hint for clients (agents and
        // lks-loadgen wait at least that long).
        let wait = wait.clamp(Duration::from_millis(100), Duration::from_secs(60));
        return Err(with_retry_hint(
            Status::resource_exhausted(format!(
                "too many enrolment attempts from {}; retry in {:.1} s",
                addr.ip(),
                wait.as_secs_f64()
            )),
            wait,
        ));
    }
    let r = req.into_inner();
    let node_name = r.node_name.clone();
    let asked = Enrolment {
        token: r.token,
        node_name: r.node_name,
        labels: r.labels,
        csr_pem: r.csr_pem,
    };
    match enrol::enrol(&*s.store, &s.pki, s.node_cert_ttl, asked).await {
        Ok(e) => {
            s.metrics.enrollment("ok");
            tracing::info!(node = %e.node_name, cluster = %e.cluster, "node enrolled");
            Ok(Response::new(pb::EnrollResponse {
                certificate_pem: e.certificate_pem,
                ca_pem: e.ca_pem,
                node_name: e.node_name,
                cluster: e.cluster,
                expires_at: e.expires_at,
            }))
        }
        Err(e) => {
            let result = enrol::outcome(&e);
            let status = Status::from(e);
            s.metrics.enrollment(result);
            tracing::warn!(node = %node_name, result, error = %status.message(), "enrolment refused");
            Err(status)
        }
    }
}

/// `RenewCertificate`: a new node certificate for the same identity; the
/// outcome is counted (`lks_certificate_renewals_total`).
pub(super) async fn renew(
    s: &Deps,
    req: Request<pb::RenewCertificateRequest>,
) -> Result<Response<pb::RenewCertificateResponse>, Status> {
    let r = renew_inner(s, req).await;
    s.metrics.certificate_renewal(match &r {
        Ok(_) => "ok",
        Err(status) => renewal_outcome(status.code()),
    });
    r
}

/// A failed renewal: the server could not do it (`error`, the agent retries
/// and an operator should look at the server), or it refused the node or its
/// CSR (`refused`).
fn renewal_outcome(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Unavailable
        | Code::Internal
        | Code::Unknown
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::ResourceExhausted
        | Code::DataLoss
        | Code::Cancelled => "error",
        _ => "refused",
    }
}

async fn renew_inner(
    s: &Deps,
    req: Request<pb::RenewCertificateRequest>,
) -> Result<Response<pb::RenewCertificateResponse>, Status> {
    let caller = require_node(&req, &*s.store).await?;
    let r = req.into_inner();
    let cert = s
        .pki
        .issue_node_cert(&r.csr_pem, &caller.id, s.node_cert_ttl)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    s.store
        .replace_cert_serial(&caller.id.node, &caller.serial, &cert.serial)
        .await
        .map_err(store_status)?;
    event(
        s,
        &caller.id,
        "certificate_renewed",
        "",
        "",
        format!("new serial {}", cert.serial),
    )
    .await;
    tracing::info!(node = %caller.id.node, "certificate renewed");
    Ok(Response::new(pb::RenewCertificateResponse {
        certificate_pem: cert.pem,
        expires_at: cert.not_after,
    }))
}

/// `IssueCertificate`: a certificate of a bundle's `[[certificate]]` (the rules are in `issue.rs`).
pub(super) async fn issue(
    s: &Deps,
    req: Request<pb::IssueCertificateRequest>,
) -> Result<Response<pb::IssueCertificateResponse>, Status> {
    let caller = require_node(&req, &*s.store).await?;
    if !s.issue_limiter.allow(caller.id.node.clone()) {
        return Err(Status::resource_exhausted(format!(
            "node {} asked for too many certificates; retry in a minute",
            caller.id.node
        )));
    }
    let r = req.into_inner();
    let what = format!("{}@{} {}", r.bundle, r.version, r.path);
    match issue::issue(s, &caller.id, r).await {
        Ok((resp, bundle, version)) => {
            tracing::info!(node = %caller.id.node, %what, serial = %resp.serial, "certificate issued");
            event(
                s,
                &caller.id,
                "certificate_issued",
                &bundle,
                &version,
                format!(
                    "{what}: serial {}, valid until {}",
                    resp.serial,
                    crate::clock::rfc3339(resp.not_after_ms)
                ),
            )
            .await;
            Ok(Response::new(resp))
        }
        Err(status) => {
            tracing::warn!(node = %caller.id.node, %what, error = %status.message(), "certificate refused");
            Err(status)
        }
    }
}

async fn event(s: &Deps, id: &NodeIdentity, kind: &str, bundle: &str, version: &str, message: String) {
    record_event(&*s.store, id, kind, bundle, version, message, now_ms()).await;
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    #[test]
    fn renewal_failures_are_refusals_or_server_errors() {
        for c in [
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::InvalidArgument,
            Code::NotFound,
        ] {
            assert_eq!(super::renewal_outcome(c), "refused", "{c:?}");
        }
        for c in [Code::Unavailable, Code::Internal, Code::DeadlineExceeded] {
            assert_eq!(super::renewal_outcome(c), "error", "{c:?}");
        }
    }
}
