//! The server's use cases, between the gRPC handlers and what they drive:
//! publishing a bundle (`publish.rs`). Each operation takes plain Rust
//! (domain types, already decoded) and answers plain Rust or an
//! [`OpError`]; none names tonic or a generated request type, so an
//! operation reads as its steps and a test can call it without a server.
//!
//! It sits below `api` (whose handlers decode a request, call an
//! operation and encode its answer, and turn an [`OpError`] into a status
//! in one place) and above the store, the blob store, the metrics and the
//! rollout modules it drives. It never names `api`.

pub mod publish;

use crate::blobs::BlobError;
use crate::store::StoreError;

pub use publish::PublishError;

/// What kind of refusal or failure an error is: how the edge answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The request is wrong; retrying it unchanged fails the same way.
    Invalid,
    /// What the request would create exists already.
    AlreadyExists,
    /// The server failed; the message says where.
    Internal,
}

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The store failed or refused.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The blob store failed for `what` (a file's target path; empty if
    /// the failure concerns no one file).
    #[error("{}", if what.is_empty() { source.to_string() } else { format!("{what}: {source}") })]
    Blob {
        what: String,
        #[source]
        source: BlobError,
    },
}

impl OpError {
    /// A blob store failure concerning the file at `what`.
    pub fn blob(what: impl Into<String>, source: BlobError) -> Self {
        OpError::Blob {
            what: what.into(),
            source,
        }
    }
}
