//! The control server's state: one narrow trait per aggregate (clusters,
//! tokens, nodes and their reports, bundles and desired states, rollouts,
//! events, blob records), each beside its rows, and two backends that
//! implement all of them: the embedded SQLite store and etcd, one file per
//! aggregate in each. [`Store`] is all of them at once, what the server
//! holds.
//!
//! Every method is one atomic unit: a caller never sees half of an
//! enrolment, a publish or a rollout start. Rows are plain Rust; protobuf
//! appears only as the opaque bytes of a stored `SignedBundle`.

pub mod blobrecs;
mod bundles;
mod clusters;
#[cfg(test)]
pub(crate) mod conformance;
mod dump;
pub mod etcd;
mod events;
mod nodes;
mod rollouts;
pub mod sqlite;
mod tokens;

pub use blobrecs::{BlobRecord, BlobRecords, BundleUsers, RecordAt};
pub use bundles::*;
pub use clusters::*;
pub use dump::*;
pub use etcd::{EtcdConfig, EtcdStore};
pub use events::*;
pub use nodes::*;
pub use rollouts::*;
pub use sqlite::SqliteStore;
pub use tokens::*;

/// Why a store operation failed. The variants that describe the caller's
/// request (`NotFound`, `AlreadyExists`, `Conflict`, `Token`) map to gRPC
/// status codes; `Backend` is an internal failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    NotFound(String),
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
    #[error("store: {0}")]
    Backend(String),
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
    + BlobRecords
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
        + BlobRecords
        + Send
        + Sync
        + 'static
{
}
