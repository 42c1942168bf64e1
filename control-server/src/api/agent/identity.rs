//! The agent API's node identity: enrolment with a bootstrap token (rate
//! limited per address here, then `ops::enrol`), certificate renewal
//! (`ops::renew`), and the certificates a bundle's `[[certificate]]`
//! entries ask for (`ops::issue`: its per-node limit, then the certificate).

use std::sync::Arc;
use std::time::Duration;

use lks_pki::Pki;
use lks_pki::clusterca::ClusterCas;
use lks_proto::backoff::with_retry_hint;
use lks_proto::pb;
use tonic::{Request, Response, Status};

use crate::authz::require_node;
use crate::metrics::Metrics;
use crate::ops::OpError;
use crate::ops::enrol::{self, Enrolment};
use crate::ops::issue::{self, CertRequest};
use crate::ops::renew;
use crate::ratelimit::RateLimiter;
use crate::store::Store;

crate::context::shared_view! {
    /// What the identity handlers use: the store, the server CA (node
    /// certificates) and the tenant CAs (bundle certificates), the limits on
    /// enrolment per address and on certificates per node, the metrics.
    pub(super) struct Deps {
        store: Arc<dyn Store>,
        pki: Arc<Pki>,
        cluster_cas: Arc<ClusterCas>,
        limiter: Arc<RateLimiter>,
        issue_limiter: Arc<RateLimiter<String>>,
        metrics: Arc<Metrics>,
        node_cert_ttl: Duration,
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
    let csr_pem = req.into_inner().csr_pem;
    let r = renew::renew(
        &*s.store,
        &s.pki,
        s.node_cert_ttl,
        &caller.id,
        &caller.serial,
        &csr_pem,
    )
    .await?;
    tracing::info!(node = %caller.id.node, "certificate renewed");
    Ok(Response::new(pb::RenewCertificateResponse {
        certificate_pem: r.certificate_pem,
        expires_at: r.expires_at,
    }))
}

/// `IssueCertificate`: a certificate of a bundle's `[[certificate]]`
/// (`ops::issue`), at most as many per node as `issue_limiter` allows
/// (`ops::issue::admit`).
pub(super) async fn issue(
    s: &Deps,
    req: Request<pb::IssueCertificateRequest>,
) -> Result<Response<pb::IssueCertificateResponse>, Status> {
    let caller = require_node(&req, &*s.store).await?;
    issue::admit(&s.issue_limiter, &caller.id).map_err(OpError::from)?;
    let r = req.into_inner();
    let asked = CertRequest {
        bundle: r.bundle,
        version: r.version,
        path: r.path,
        csr_pem: r.csr_pem,
    };
    let what = asked.what();
    match issue::issue(&*s.store, &s.cluster_cas, &caller.id, asked).await {
        Ok(c) => {
            tracing::info!(node = %caller.id.node, %what, serial = %c.serial, "certificate issued");
            Ok(Response::new(pb::IssueCertificateResponse {
                certificate_pem: c.certificate_pem,
                ca_pem: c.ca_pem,
                api_server: c.api_server,
                cluster: c.cluster,
                serial: c.serial,
                not_after_ms: c.not_after_ms,
            }))
        }
        Err(e) => {
            let status = Status::from(e);
            tracing::warn!(node = %caller.id.node, %what, error = %status.message(), "certificate refused");
            Err(status)
        }
    }
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
