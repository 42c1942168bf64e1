//! Enrolling a node with a bootstrap token: the token checked (in constant
//! time, so response timing does not reveal how much of a guessed secret
//! was right), the node's name and labels, its CSR signed by the server
//! CA, and the node recorded by the store — which counts the token's use
//! and seeds the node's desired state in its transaction (lks-store's
//! enrolment rules). Every refusal names its outcome for the metrics.

use std::collections::HashMap;
use std::time::Duration;

use lks_pki::{Pki, PkiError};
use lks_proto::identity::NodeIdentity;
use lks_proto::labels::{LabelError, Labels, validate_label};
use lks_proto::limits::MAX_LABELS;
use lks_proto::names::{NameError, validate_node_name};
use lks_proto::token::{BootstrapToken, MalformedToken};
use subtle::ConstantTimeEq;

use super::{Kind, OpError};
use crate::clock::now_ms;
use crate::store::{NewNode, NodeStore, StoreError, TokenRefusal, TokenStore};

/// An enrolment as a node asks for it.
#[derive(Clone, Debug, Default)]
pub struct Enrolment {
    /// The bootstrap token, as written (`ID.SECRET`).
    pub token: String,
    pub node_name: String,
    /// The node's own labels; the token's win on conflict.
    pub labels: HashMap<String, String>,
    pub csr_pem: String,
}

/// A node enrolled: its certificate and the CA that signed it.
#[derive(Clone, Debug)]
pub struct Enrolled {
    pub certificate_pem: String,
    pub ca_pem: String,
    pub node_name: String,
    pub cluster: String,
    /// Unix seconds.
    pub expires_at: i64,
}

/// Why an enrolment is refused.
#[derive(Debug, thiserror::Error)]
pub enum EnrolError {
    #[error(transparent)]
    MalformedToken(#[from] MalformedToken),
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("{0} labels; the limit is {MAX_LABELS}")]
    TooManyLabels(usize),
    #[error(transparent)]
    Label(#[from] LabelError),
    #[error(transparent)]
    Token(TokenRefusal),
    #[error(transparent)]
    Csr(PkiError),
    /// The node exists, enrolled by another token or with another key.
    #[error("{0}")]
    Exists(String),
}

impl EnrolError {
    pub fn kind(&self) -> Kind {
        match self {
            EnrolError::Token(_) => Kind::Unauthenticated,
            EnrolError::Exists(_) => Kind::AlreadyExists,
            _ => Kind::Invalid,
        }
    }
}

/// The outcome of an enrolment that failed, as `lks_enrollments_total`
/// counts it: `error` when the server failed, else what was refused.
pub fn outcome(e: &OpError) -> &'static str {
    match e {
        OpError::Enrol(EnrolError::MalformedToken(_) | EnrolError::Token(TokenRefusal::Unknown)) => {
            "invalid_token"
        }
        OpError::Enrol(EnrolError::Token(TokenRefusal::Expired)) => "expired_token",
        OpError::Enrol(EnrolError::Token(TokenRefusal::UsedUp)) => "used_up_token",
        OpError::Enrol(EnrolError::Name(_) | EnrolError::TooManyLabels(_) | EnrolError::Label(_)) => {
            "invalid_argument"
        }
        OpError::Enrol(EnrolError::Csr(_)) => "invalid_csr",
        OpError::Enrol(EnrolError::Exists(_)) => "already_exists",
        _ => "error",
    }
}

/// Enrols the node `r` names into the cluster of its token.
pub async fn enrol(
    store: &(impl TokenStore + NodeStore + ?Sized),
    pki: &Pki,
    cert_ttl: Duration,
    r: Enrolment,
) -> Result<Enrolled, OpError> {
    let token: BootstrapToken = r.token.parse().map_err(EnrolError::from)?;
    validate_node_name(&r.node_name).map_err(EnrolError::from)?;
    if r.labels.len() > MAX_LABELS {
        return Err(EnrolError::TooManyLabels(r.labels.len()).into());
    }
    for (k, v) in &r.labels {
        validate_label(k, v).map_err(EnrolError::from)?;
    }
    let stored = store
        .get_token(token.id())
        .await?
        .ok_or(EnrolError::Token(TokenRefusal::Unknown))?;
    // A wrong secret looks like an unknown id.
    if !bool::from(stored.secret_hash.ct_eq(token.secret_hash().as_bytes())) {
        return Err(EnrolError::Token(TokenRefusal::Unknown).into());
    }
    let now = now_ms();
    if stored.expires_at_ms <= now {
        return Err(EnrolError::Token(TokenRefusal::Expired).into());
    }
    // A token with no use left may still repeat an enrolment whose
    // answer was lost: the store decides, in its transaction.
    let id = NodeIdentity::new(&stored.cluster, &r.node_name).map_err(EnrolError::from)?;
    let cert = pki
        .issue_node_cert(&r.csr_pem, &id, cert_ttl)
        .map_err(EnrolError::Csr)?;
    // The node's own labels first; the token's labels win on conflict.
    let mut labels: Labels = r.labels.into_iter().collect();
    labels.extend(stored.labels.clone());
    store
        .enroll_node(NewNode {
            name: id.node.clone(),
            cluster: id.cluster.clone(),
            labels,
            cert_serial: cert.serial.clone(),
            key_hash: cert.key_hash.clone(),
            token_id: stored.id.clone(),
            now_ms: now,
        })
        .await
        .map_err(|e| match e {
            StoreError::Token(t) => EnrolError::Token(t).into(),
            StoreError::AlreadyExists(m) => EnrolError::Exists(m).into(),
            e => OpError::Store(e),
        })?;
    Ok(Enrolled {
        certificate_pem: cert.pem,
        ca_pem: pki.ca_pem().to_string(),
        node_name: id.node,
        cluster: id.cluster,
        expires_at: cert.not_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_is_counted_by_what_was_refused() {
        let refused = |e: EnrolError| outcome(&OpError::Enrol(e));
        assert_eq!(refused(EnrolError::Token(TokenRefusal::Unknown)), "invalid_token");
        assert_eq!(refused(EnrolError::Token(TokenRefusal::Expired)), "expired_token");
        assert_eq!(refused(EnrolError::Token(TokenRefusal::UsedUp)), "used_up_token");
        assert_eq!(refused(EnrolError::TooManyLabels(65)), "invalid_argument");
        assert_eq!(
            refused(EnrolError::Exists("node a exists".into())),
            "already_exists"
        );
        let malformed = "no-dot".parse::<BootstrapToken>().unwrap_err();
        assert_eq!(refused(EnrolError::MalformedToken(malformed)), "invalid_token");
        let store = OpError::Store(StoreError::Unavailable("down".into()));
        assert_eq!(outcome(&store), "error");
    }

    #[test]
    fn a_refused_token_answers_unauthenticated_and_the_rest_invalid() {
        assert_eq!(
            EnrolError::Token(TokenRefusal::Expired).kind(),
            Kind::Unauthenticated
        );
        assert_eq!(EnrolError::Exists("x".into()).kind(), Kind::AlreadyExists);
        assert_eq!(EnrolError::TooManyLabels(65).kind(), Kind::Invalid);
        assert_eq!(
            EnrolError::TooManyLabels(65).to_string(),
            format!("65 labels; the limit is {MAX_LABELS}")
        );
    }
}
