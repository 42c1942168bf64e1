//! The ports the apply layer fetches blob bytes through, owned here so the
//! engine and the cache name no network code: [`BlobSource`] (a file's
//! bytes from an offset: the control server or a mirror) and
//! [`PieceSource`] (a file in checked pieces from peers and the server,
//! while peer sharing is on), with their errors. `link/` implements them;
//! the engine's tests use fakes.

use std::path::Path;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use lks_proto::{Digest, FileSpec};

/// A stream of bytes from `offset` on.
pub struct BlobStream {
    /// Where the stream really starts: the requested offset, or 0 if the
    /// source cannot resume.
    pub offset: u64,
    pub chunks: BoxStream<'static, Result<prost::bytes::Bytes, SourceError>>,
}

/// The source could not deliver (now). Always worth retrying later; a bad
/// byte is caught by the verifier, not here.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SourceError(pub String);

pub trait BlobSource: Send + Sync {
    fn open<'a>(&'a self, file: &'a FileSpec, offset: u64) -> BoxFuture<'a, Result<BlobStream, SourceError>>;

    /// Peer sharing, while the node's cluster has it on.
    fn swarm(&self) -> Option<&dyn PieceSource> {
        None
    }

    /// The patches (binary deltas, issue [delta]) the source offers that
    /// rebuild `file` from other bytes, smallest first; none by default
    /// (and from a server that predates them). A patch is fetched with
    /// [`BlobSource::open`] (or [`BlobSource::swarm`]) under
    /// [`DeltaOffer::patch_spec`].
    fn deltas<'a>(&'a self, _file: &'a FileSpec) -> BoxFuture<'a, Result<Vec<DeltaOffer>, SourceError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// This node is about to fetch the patch of `offer`, which rebuilds
    /// `target`, and keeps it in its cache afterwards: peer sharing may
    /// serve it to other nodes (its verified pieces while it arrives).
    fn holding_patch(&self, _offer: &DeltaOffer, _target: &Digest) {}

    /// Staging is about to move the verified download of `digest` at
    /// `path` (in `cache/fetched/`) beside its target. While peer sharing
    /// is on, it opens it to serve it from there until the engine has
    /// cached it again ([`BlobSource::release_moved`]): a node that just
    /// finished its download is the one its peers fetch from most.
    fn keep_serving_moved(&self, _digest: Digest, _path: &Path) {}

    /// What staging moved is cached now, or will not be: serve it from the
    /// cache only.
    fn release_moved(&self) {}
}

/// One patch a source offers: it rebuilds a file from the bytes `base`.
/// Transport only: the rebuilt file is checked against the manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeltaOffer {
    pub base: Digest,
    pub patch: Digest,
    pub patch_size: u64,
    pub algorithm: String,
    /// The patch's piece list, for one of more than one piece (peer
    /// sharing moves it in checked pieces); `None`: one piece.
    pub chunks: Option<lks_proto::chunks::Chunks>,
}

impl DeltaOffer {
    /// The patch as a blob to fetch, named after the file it rebuilds.
    pub fn patch_spec(&self, file: &FileSpec) -> FileSpec {
        FileSpec {
            path: file.path.clone(),
            digest: self.patch,
            size: self.patch_size,
            mode: 0o600,
            url: None,
            chunks: self.chunks.clone(),
            arch: file.arch,
        }
    }
}

/// Fetches a file in pieces, each checked as it arrives, into `part`, and
/// checks the whole file once more; says how many bytes came from the
/// server and how many from peers.
pub trait PieceSource: Send + Sync {
    fn fetch<'a>(
        &'a self,
        file: &'a FileSpec,
        part: &'a Path,
    ) -> BoxFuture<'a, Result<(u64, u64), SwarmError>>;
}

#[derive(Debug, thiserror::Error)]
pub enum SwarmError {
    /// The server has no tracker, or the file cannot go in pieces: fetch it
    /// the old way.
    #[error("{0}")]
    Unsupported(String),
    /// Nothing could deliver now; try again later.
    #[error("{0}")]
    Unavailable(String),
    /// Bytes that are not what the manifest says, from the server (or the
    /// file assembled from checked pieces, which a right chunk list rules
    /// out).
    #[error("{0}")]
    Corrupt(lks_proto::digest::VerifyError),
}

/// Where a file's bytes come from, for messages.
pub fn origin(file: &FileSpec) -> String {
    match &file.url {
        Some(u) => u.clone(),
        None => "the control server".into(),
    }
}
