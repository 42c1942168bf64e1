//! The control server's state: one narrow trait per aggregate (clusters,
//! tokens, nodes and their reports, bundles and desired states, rollouts,
//! events, the audit trail, blob records), each beside its rows and the
//! rules over them. Two backends implement all of them, each a crate of its
//! own that only reads and writes: `lks-store-sqlite` (the embedded store)
//! and `lks-store-etcd`. [`Store`] is all of them at once, what the server
//! holds. With the `conformance` feature, [`conformance`] is the one suite
//! of behavioural tests both backends run ([`conformance_suite!`]).
//!
//! Every method is one atomic unit: a caller never sees half of an
//! enrolment, a publish or a rollout start. Rows are plain Rust: a
//! stored bundle comes back decoded and validated beside the encoded
//! protobuf it is sent to agents as ([`StoredBundle`]), and a record that
//! does not read back is [`StoreError::Corrupt`].

#![forbid(unsafe_code)]

mod audit;
pub mod blobrecs;
mod bundles;
pub mod clock;
mod clusters;
// Test code the backends' tests call: a case that fails panics.
#[cfg(feature = "conformance")]
#[allow(clippy::unwrap_used, clippy::expect_used, async_fn_in_trait)]
pub mod conformance;
pub mod deltas;
mod dump;
mod events;
mod nodes;
mod plans;
mod reboots;
mod releases;
mod rollouts;
mod tokens;

pub use audit::*;
pub use blobrecs::{BlobRecord, BlobRecords, BundleUsers, RecordAt};
pub use bundles::*;
pub use clusters::*;
pub use deltas::{DeltaRow, DeltaStore, NoPatch};
pub use dump::*;
pub use events::*;
pub use nodes::*;
pub use plans::*;
pub use reboots::*;
pub use releases::*;
pub use rollouts::*;
pub use tokens::*;

/// Why a store operation failed. The variants that describe the caller's
/// request (`NotFound`, `NotDesired`, `AlreadyExists`, `Conflict`, `Token`)
/// map to gRPC status codes; `Corrupt` and `Backend` are internal failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The request names a record the store does not hold: `kind` named
    /// `name`, and what to do about it when there is something (`hint`).
    #[error("{}", not_found_text(*kind, name, *hint))]
    NotFound {
        kind: Kind,
        name: String,
        hint: Option<Hint>,
    },
    /// A retry names a bundle that is not one the node should hold.
    #[error("bundle {bundle} is not desired for node {node}")]
    NotDesired { bundle: String, node: String },
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Token(TokenRefusal),
    /// The backing store cannot be reached now (etcd down or without
    /// quorum); the request may be retried.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A stored record does not read back as what was stored: `kind`
    /// named `name`, and why.
    #[error("stored {kind} {name} is unreadable: {why}")]
    Corrupt {
        kind: Kind,
        name: String,
        why: Unreadable,
    },
    /// The backend failed in a way the caller cannot fix: what it was
    /// doing, and the error it got there (kept as the source).
    #[error("store: {0}")]
    Backend(#[source] BackendError),
}

/// A [`StoreError::Backend`] failure. Its text is one line: what the
/// backend was doing and, when an error caused it, that error's text too,
/// as a user sees it in a status; the error itself stays the source, for
/// whoever walks the chain.
#[derive(Debug)]
pub struct BackendError {
    what: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            None => f.write_str(&self.what),
            Some(e) if self.what.is_empty() => write!(f, "{e}"),
            Some(e) => write!(f, "{}: {e}", self.what),
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// What kind of record a [`StoreError::NotFound`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Cluster,
    Node,
    /// A bundle version (`NAME@VERSION`).
    Bundle,
    Rollout,
    /// A release record (`VERSION of CLUSTER`).
    Release,
    /// A trust-root rotation (`VERSION of CLUSTER`).
    Root,
    /// A release plan.
    Plan,
}

impl Kind {
    fn missing(self) -> &'static str {
        match self {
            Kind::Node => "is not enrolled",
            Kind::Bundle => "is not published",
            Kind::Cluster | Kind::Rollout | Kind::Release | Kind::Root | Kind::Plan => "does not exist",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Cluster => "cluster",
            Kind::Node => "node",
            Kind::Bundle => "bundle",
            Kind::Rollout => "rollout",
            Kind::Release => "release",
            Kind::Root => "trust root",
            Kind::Plan => "plan",
        })
    }
}

/// What an operator can do about a record that is not there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hint {
    /// `lksctl cluster create NAME`.
    CreateCluster,
    /// `lksctl bundle publish DIR`.
    PublishBundle,
}

/// `cluster NAME does not exist; create it with …`: the one line a missing
/// record reads as.
fn not_found_text(kind: Kind, name: &str, hint: Option<Hint>) -> String {
    let what = format!("{kind} {name} {}", kind.missing());
    match hint {
        None => what,
        Some(Hint::CreateCluster) => format!("{what}; create it with `lksctl cluster create {name}`"),
        Some(Hint::PublishBundle) => format!("{what}; publish it with `lksctl bundle publish DIR`"),
    }
}

impl StoreError {
    /// `kind` named `name` is not in the store.
    pub fn not_found(kind: Kind, name: impl Into<String>) -> Self {
        StoreError::NotFound {
            kind,
            name: name.into(),
            hint: None,
        }
    }

    /// The same, saying what to do about it.
    pub fn not_found_hint(kind: Kind, name: impl Into<String>, hint: Hint) -> Self {
        StoreError::NotFound {
            kind,
            name: name.into(),
            hint: Some(hint),
        }
    }

    /// The backend found something broken that no error of its own names
    /// (a record missing from its own transaction, an unknown state).
    pub fn backend(what: impl Into<String>) -> Self {
        StoreError::Backend(BackendError {
            what: what.into(),
            source: None,
        })
    }

    /// The backend failed `what` (a verb phrase, e.g. "open /var/lib/…")
    /// with `source`: "store: {what}: {source}".
    pub fn backend_at(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        StoreError::Backend(BackendError {
            what: what.into(),
            source: Some(source.into()),
        })
    }

    /// The backend's own error, which says what failed by itself:
    /// "store: {source}".
    pub fn backend_source(source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        StoreError::backend_at(String::new(), source)
    }

    /// One failure answered to each of many callers (the reports of one
    /// etcd batch): `Unavailable` stays so, so that they retry; anything
    /// else is a `Backend` failure ("store: {e}") whose source is `e`
    /// itself, shared.
    pub fn shared(e: &std::sync::Arc<StoreError>) -> Self {
        match &**e {
            StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
            _ => StoreError::backend_source(SharedError(e.clone())),
        }
    }
}

/// A [`StoreError`] several callers are answered with
/// ([`StoreError::shared`]): it reads as the error and its source is the
/// error's own source, so a chain walked from any caller names it once.
#[derive(Debug)]
struct SharedError(std::sync::Arc<StoreError>);

impl std::fmt::Display for SharedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&*self.0)
    }
}

// The SQLite backend's `?` on its driver's errors; here because of the
// orphan rule (neither type is the backend's own).
#[cfg(feature = "rusqlite")]
impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::backend_source(e)
    }
}

#[cfg(feature = "rusqlite")]
impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::backend_at("stored JSON", e)
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The control server's persistent state: every aggregate's store. Code
/// that needs one aggregate takes that trait; the server holds an
/// `Arc<dyn Store>` and calls any of them through it.
pub trait Store:
    ClusterStore
    + TokenStore
    + NodeStore
    + NodeStatusStore
    + BundleStore
    + DesiredStore
    + RolloutStore
    + EventStore
    + AuditStore
    + ReleaseStore
    + RebootStore
    + BlobRecords
    + DeltaStore
    + PlanStore
    + Send
    + Sync
    + 'static
{
}

impl<T> Store for T where
    T: ClusterStore
        + TokenStore
        + NodeStore
        + NodeStatusStore
        + BundleStore
        + DesiredStore
        + RolloutStore
        + EventStore
        + AuditStore
        + ReleaseStore
        + RebootStore
        + BlobRecords
        + DeltaStore
        + PlanStore
        + Send
        + Sync
        + 'static
{
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_record_reads_as_one_line_saying_what_and_what_to_do() {
        let cases = [
            (
                StoreError::not_found(Kind::Cluster, "a"),
                "cluster a does not exist",
            ),
            (
                StoreError::not_found(Kind::Rollout, "r1"),
                "rollout r1 does not exist",
            ),
            (StoreError::not_found(Kind::Node, "n1"), "node n1 is not enrolled"),
            (
                StoreError::not_found_hint(Kind::Cluster, "a", Hint::CreateCluster),
                "cluster a does not exist; create it with `lksctl cluster create a`",
            ),
            (
                StoreError::not_found_hint(Kind::Bundle, "k@1", Hint::PublishBundle),
                "bundle k@1 is not published; publish it with `lksctl bundle publish DIR`",
            ),
            (
                StoreError::NotDesired {
                    bundle: "b".into(),
                    node: "n1".into(),
                },
                "bundle b is not desired for node n1",
            ),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text);
        }
    }

    /// A backend failure reads as before ("store: what: cause") and keeps
    /// the cause as its source, down to the backend's own error.
    #[test]
    fn a_backend_failure_keeps_its_cause() {
        use std::error::Error as _;

        let io = || std::io::Error::new(std::io::ErrorKind::PermissionDenied, "permission denied");
        let e = StoreError::backend_at("open /d/lks.db", io());
        assert_eq!(e.to_string(), "store: open /d/lks.db: permission denied");
        let cause = e.source().and_then(|b| b.source()).unwrap();
        assert!(cause.downcast_ref::<std::io::Error>().is_some());

        let e = StoreError::backend_source(io());
        assert_eq!(e.to_string(), "store: permission denied");
        assert!(e.source().and_then(|b| b.source()).is_some());

        let shared = std::sync::Arc::new(StoreError::backend_at("etcd", io()));
        let e = StoreError::shared(&shared);
        assert_eq!(e.to_string(), "store: store: etcd: permission denied");
        let root = std::iter::successors(e.source(), |&c| c.source()).last().unwrap();
        assert!(
            root.downcast_ref::<std::io::Error>().is_some(),
            "the chain ends at the cause"
        );
        let down = std::sync::Arc::new(StoreError::Unavailable("etcd: down".into()));
        assert!(matches!(StoreError::shared(&down), StoreError::Unavailable(m) if m == "etcd: down"));

        let e = StoreError::backend("lease poisoned");
        assert_eq!(e.to_string(), "store: lease poisoned");
        assert!(e.source().and_then(|b| b.source()).is_none());
    }
}
