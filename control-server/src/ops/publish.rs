//! Publishing a bundle: a signed bundle's header, then the bytes of every
//! file the server holds, verified (digest, size, chunk list — the rules
//! of `lks_proto::served`) as they arrive. Large blobs stream on into the
//! blob store; every blob is claimed before it takes its name, and only a
//! publish verified whole records the bundle, so a publish refused halfway
//! leaves nothing behind.
//!
//! [`Publish::begin`] checks the header, [`Publish::chunk`] takes each
//! piece of bytes in stream order, [`Publish::finish`] verifies, stores
//! and records; [`Publish::abort`] drops whatever a refused publish began.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use lks_proto::chunks::{ChunkHasher, Chunks};
use lks_proto::served::{self, ChunkMismatch, ServedError};
use lks_proto::sign::{self, SignError};
use lks_proto::{Digest, Manifest, SignedBundle, canonical};

use super::{Kind, OpError};
use crate::clock::now_ms;
use crate::metrics::Metrics;
use crate::store::{EventRow, NewBundle, PutOutcome, Store};
use lks_blobs::{BlobError, BlobWriter, Blobs, StagedBlob, Upload};

/// Why a publish is refused (or failed on the server's side).
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Signature(#[from] SignError),
    #[error("bundle {id} already exists with other content; versions are immutable, publish a new version")]
    Immutable { id: String },
    #[error(transparent)]
    Served(#[from] ServedError),
    #[error("chunks of {digest} are not contiguous")]
    NotContiguous { digest: Digest },
    #[error("upload of {digest}, which is not a file of {id} (or is fetched from a mirror URL)")]
    NotAFile { digest: Digest, id: String },
    /// The bytes of a blob are not what the manifest says.
    #[error("upload rejected: {0}")]
    Rejected(#[source] BlobError),
    #[error("upload rejected: {path}: {source}")]
    ChunkList {
        path: String,
        #[source]
        source: ChunkMismatch,
    },
    #[error("the bytes of {path} ({digest}) were not uploaded")]
    NotUploaded { path: String, digest: Digest },
    /// The local blob directory failed.
    #[error("{0}")]
    Local(#[source] BlobError),
    #[error("read blob {digest}: {source}")]
    ReadHeld {
        digest: Digest,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("store blob: {0}")]
    Commit(#[source] BlobError),
}

impl PublishError {
    pub fn kind(&self) -> Kind {
        match self {
            PublishError::Immutable { .. } => Kind::AlreadyExists,
            PublishError::Local(_)
            | PublishError::ReadHeld { .. }
            | PublishError::Join(_)
            | PublishError::Commit(_) => Kind::Internal,
            _ => Kind::Invalid,
        }
    }
}

crate::context::shared_view! {
    /// What a publish uses: the store it records the bundle in, the blobs
    /// it uploads into, the metrics it counts them in.
    #[derive(Clone)]
    pub struct Deps {
        store: Arc<dyn Store>,
        blobs: Arc<Blobs>,
        metrics: Arc<Metrics>,
    }
}

/// How a publish begins.
pub enum Begun {
    /// The same content is published at this version already: nothing to
    /// receive, and the answer is `created: false`.
    Published,
    /// A new version: its bytes are awaited.
    Receiving(Box<Publish>),
}

/// A publish under way.
pub struct Publish {
    deps: Deps,
    signed: SignedBundle,
    /// The blobs the server must hold, with their sizes.
    expected: BTreeMap<Digest, u64>,
    /// The chunk list of each digest that has one.
    lists: BTreeMap<Digest, Chunks>,
    pieces: Option<ChunkHasher>,
    done: HashSet<Digest>,
    current: Option<BlobWriter>,
    staged: Vec<StagedBlob>,
    /// Large blobs also stream into the blob store as they arrive
    /// (visible there only once verified and claimed, in `prepare`).
    uploads: Uploads,
    streaming: Option<Box<dyn Upload>>,
}

impl Publish {
    /// The header: its signature (if any) checked, then either the same
    /// version published already (identical content: nothing to do; other
    /// content: refused, versions are immutable) or the blobs to await.
    pub async fn begin(deps: Deps, signed: SignedBundle) -> Result<Begun, OpError> {
        if signed.signature.is_some() {
            sign::verify(&signed, &[]).map_err(PublishError::from)?;
        }
        let m = &signed.manifest;
        if let Some(existing) = deps.store.get_bundle(&m.name, &m.version).await? {
            if existing.manifest_digest != canonical::manifest_digest(m) {
                return Err(PublishError::Immutable { id: m.id() }.into());
            }
            return Ok(Begun::Published);
        }
        let expected = served::served_blobs(m).map_err(PublishError::from)?;
        if let Some(max) = deps.blobs.store().max_blob_size()
            && let Some((d, size)) = expected.iter().find(|(_, size)| **size > max)
        {
            let too_large = BlobError::TooLarge {
                digest: *d,
                size: *size,
                max,
            };
            return Err(OpError::blob(path_of(m, d), too_large));
        }
        let lists = served::chunk_lists(m)
            .map_err(PublishError::from)?
            .into_iter()
            .map(|(d, c)| (d, c.clone()))
            .collect();
        Ok(Begun::Receiving(Box::new(Publish {
            deps,
            signed,
            expected,
            lists,
            pieces: None,
            done: HashSet::new(),
            current: None,
            staged: Vec::new(),
            uploads: Uploads::default(),
            streaming: None,
        })))
    }

    /// The next piece of bytes, of the blob `d`: the blob being received
    /// goes on, or it ended and `d` begins. Each blob is written locally
    /// (and, if large, into the blob store), hashed against its chunk list.
    pub async fn chunk(&mut self, d: Digest, data: &[u8]) -> Result<(), OpError> {
        if self.current.as_ref().map(BlobWriter::digest) != Some(d) {
            self.end_current().await?;
            if self.done.contains(&d) {
                return Err(PublishError::NotContiguous { digest: d }.into());
            }
            let size = *self.expected.get(&d).ok_or_else(|| PublishError::NotAFile {
                digest: d,
                id: self.signed.manifest.id(),
            })?;
            let blobs = &self.deps.blobs;
            self.current = Some(blobs.local.writer(d, size).await.map_err(PublishError::Local)?);
            self.pieces = self.lists.get(&d).map(|c| ChunkHasher::new(c.size));
            self.streaming = blobs
                .store()
                .start_upload(&d, size)
                .await
                .map_err(|e| OpError::blob(path_of(&self.signed.manifest, &d), e))?;
        }
        if let Some(p) = self.pieces.as_mut() {
            p.update(data);
        }
        if let Some(w) = self.current.as_mut() {
            w.write(data).await.map_err(PublishError::Rejected)?;
        }
        if let Some(up) = self.streaming.as_mut() {
            up.write(data)
                .await
                .map_err(|e| OpError::blob(path_of(&self.signed.manifest, &d), e))?;
        }
        Ok(())
    }

    /// A refused publish: the blob store keeps none of its uploads.
    pub async fn abort(mut self) {
        if let Some(up) = self.streaming.take() {
            up.abort().await;
        }
        self.uploads.abort_all().await;
    }

    /// Every byte arrived: the last blob checked, the blobs verified,
    /// claimed and stored, the bundle recorded. True if it was created
    /// (false if a publish of the same content raced this one).
    pub async fn finish(mut self) -> Result<bool, OpError> {
        if let Err(e) = self.end_current().await {
            self.abort().await;
            return Err(e);
        }
        let Publish {
            deps,
            signed,
            expected,
            lists,
            done,
            staged,
            mut uploads,
            ..
        } = self;
        let m = &signed.manifest;
        if let Err(e) = prepare(&deps, m, &expected, &lists, &done, staged).await {
            uploads.abort_all().await;
            return Err(e);
        }
        let in_store = finish_uploads(&deps, m, &expected, uploads).await?;
        persist_rest(&deps, m, &expected, &in_store).await?;
        record(&deps, signed, &expected).await
    }

    /// The blob being received (if any) ended: checked and staged.
    async fn end_current(&mut self) -> Result<(), OpError> {
        if let Some(w) = self.current.take() {
            let d = w.digest();
            if let (Some(list), Some(p)) = (self.lists.get(&d), self.pieces.take()) {
                check_list(&self.signed.manifest, &d, list, &p.finish())?;
            }
            end_blob(
                w,
                self.streaming.take(),
                &mut self.done,
                &mut self.staged,
                &mut self.uploads,
            )
            .await?;
        }
        Ok(())
    }
}

/// The target path of a served blob, for error messages.
fn path_of(m: &Manifest, d: &Digest) -> String {
    m.files
        .iter()
        .find(|f| f.digest == *d)
        .map(|f| f.path.to_string())
        .unwrap_or_default()
}

/// Refuses an upload whose bytes do not match the chunk list of its file.
fn check_list(m: &Manifest, d: &Digest, list: &Chunks, got: &Chunks) -> Result<(), PublishError> {
    served::check_chunk_list(list, got).map_err(|source| PublishError::ChunkList {
        path: path_of(m, d),
        source,
    })
}

/// Everything received: blobs the server held already are checked against
/// their chunk lists, empty files need no bytes, any other missing blob
/// refuses the publish; then every blob is claimed and the staged ones
/// take their local names.
async fn prepare(
    s: &Deps,
    m: &Manifest,
    expected: &BTreeMap<Digest, u64>,
    lists: &BTreeMap<Digest, Chunks>,
    done: &HashSet<Digest>,
    mut staged: Vec<StagedBlob>,
) -> Result<(), OpError> {
    // Blobs the server held already: their lists against the copy.
    for (d, c) in lists.iter().filter(|(d, _)| !done.contains(*d)) {
        let p = s.blobs.local.path(d);
        if !p.is_file() {
            continue; // not uploaded: refused below
        }
        let size = c.size;
        let read = tokio::task::spawn_blocking(move || {
            std::fs::File::open(&p).and_then(|f| Chunks::of_reader(f, size))
        })
        .await
        .map_err(PublishError::from)?
        .map_err(|source| PublishError::ReadHeld { digest: *d, source })?;
        check_list(m, d, c, &read.2)?;
    }
    for (d, size) in expected {
        if done.contains(d) || s.blobs.local.contains(d) {
            continue;
        }
        if *size == 0 {
            let w = s.blobs.local.writer(*d, 0).await.map_err(PublishError::Local)?;
            staged.push(w.stage().await.map_err(PublishError::Rejected)?);
            continue;
        }
        return Err(PublishError::NotUploaded {
            path: path_of(m, d),
            digest: *d,
        }
        .into());
    }

    // Claimed before they take their local names: from here on no
    // garbage collector deletes them (lks_blobs::gc).
    let store_name = s.blobs.store().describe();
    for (d, size) in expected {
        lks_blobs::gc::claim(&*s.store, &store_name, d, *size, now_ms)
            .await
            .map_err(|e| OpError::blob(path_of(m, d), e))?;
    }
    // Every byte is verified: only now do the blobs enter the store, so
    // a publish refused halfway leaves none behind.
    for b in staged {
        b.commit().await.map_err(PublishError::Commit)?;
    }
    Ok(())
}

/// Streamed uploads complete now that their blobs are verified and
/// claimed (or are dropped if another publish stored the blob). Returns
/// the blobs they took care of.
async fn finish_uploads(
    s: &Deps,
    m: &Manifest,
    expected: &BTreeMap<Digest, u64>,
    mut uploads: Uploads,
) -> Result<HashSet<Digest>, OpError> {
    let mut in_store: HashSet<Digest> = HashSet::new();
    while let Some((d, up)) = uploads.0.pop() {
        in_store.insert(d);
        let done = match s.blobs.store().contains(&d).await {
            Ok(true) => {
                up.abort().await;
                Ok(())
            }
            Ok(false) => up.finish().await.map(|()| {
                s.metrics
                    .blob_bytes_stored(expected.get(&d).copied().unwrap_or(0));
            }),
            Err(e) => {
                up.abort().await;
                Err(e)
            }
        };
        if let Err(e) = done {
            uploads.abort_all().await;
            return Err(OpError::blob(path_of(m, &d), e));
        }
    }
    Ok(in_store)
}

/// The rest into the blob store before the bundle is recorded, so any
/// replica can serve them once publish answers (lks_blobs::Blobs).
async fn persist_rest(
    s: &Deps,
    m: &Manifest,
    expected: &BTreeMap<Digest, u64>,
    in_store: &HashSet<Digest>,
) -> Result<(), OpError> {
    for (d, size) in expected.iter().filter(|(d, _)| !in_store.contains(*d)) {
        let uploaded = s
            .blobs
            .persist(d, *size)
            .await
            .map_err(|e| OpError::blob(path_of(m, d), e))?;
        if uploaded {
            s.metrics.blob_bytes_stored(*size);
        }
    }
    Ok(())
}

/// Records the bundle (and, if it is new, the `bundle_published` event);
/// true if it was created.
async fn record(s: &Deps, signed: SignedBundle, expected: &BTreeMap<Digest, u64>) -> Result<bool, OpError> {
    let new = NewBundle::new(signed, expected.keys().copied().collect(), now_ms());
    let (stored, is_signed) = (new.bundle.clone(), new.signed);
    let m = stored.manifest();
    let id = m.id();
    let outcome = s.store.put_bundle(new).await?;
    let created = outcome == PutOutcome::Created;
    if created {
        s.store
            .add_event(EventRow::bundle(
                "bundle_published",
                &m.name,
                &m.version,
                format!("{} file(s), {} bytes", m.files.len(), m.total_size()),
                now_ms(),
            ))
            .await?;
        tracing::info!(bundle = %id, signed = is_signed, "bundle published");
    }
    Ok(created)
}

/// The last chunk of a blob of a publish arrived: it is verified and
/// staged, and its streamed upload (if any) waits for the claim.
async fn end_blob(
    w: BlobWriter,
    streaming: Option<Box<dyn Upload>>,
    done: &mut HashSet<Digest>,
    staged: &mut Vec<StagedBlob>,
    uploads: &mut Uploads,
) -> Result<(), PublishError> {
    let digest = w.digest();
    done.insert(digest);
    match w.stage().await {
        Ok(b) => staged.push(b),
        Err(e) => {
            // Not the blob: its upload never completes.
            if let Some(up) = streaming {
                up.abort().await;
            }
            return Err(PublishError::Rejected(e));
        }
    }
    if let Some(up) = streaming {
        uploads.0.push((digest, up));
    }
    Ok(())
}

/// Uploads a publish streamed into the blob store, not yet completed.
#[derive(Default)]
struct Uploads(Vec<(Digest, Box<dyn Upload>)>);

impl Uploads {
    /// A publish that fails leaves none of them behind in the store.
    async fn abort_all(&mut self) {
        for (_, up) in self.0.drain(..) {
            up.abort().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use lks_proto::FileSpec;
    use lks_proto::manifest::Step;

    use super::*;
    use crate::store::sqlite::SqliteStore;
    use lks_blobs::{LocalBlobs, LocalDirStore};

    fn deps(dir: &std::path::Path) -> Deps {
        let local = LocalBlobs::open(dir).unwrap();
        let durable = Arc::new(LocalDirStore::new(local.clone()));
        Deps {
            store: Arc::new(SqliteStore::open_in_memory().unwrap()),
            blobs: Arc::new(Blobs::new(local, durable)),
            metrics: Arc::new(Metrics::default()),
        }
    }

    fn bundle(version: &str, files: &[(&str, &[u8])]) -> SignedBundle {
        let files = files
            .iter()
            .map(|(path, content)| FileSpec {
                path: lks_proto::BundlePath::new(path).unwrap(),
                digest: Digest::of(content),
                size: content.len() as u64,
                mode: 0o644,
                url: None,
                chunks: None,
                arch: None,
            })
            .collect();
        SignedBundle {
            manifest: Manifest {
                name: "kubelet".into(),
                version: version.into(),
                files,
                steps: vec![Step {
                    name: "restart".into(),
                    run: vec!["true".into()],
                    timeout: std::time::Duration::from_secs(5),
                    on_heal: false,
                }],
                ..Default::default()
            },
            signature: None,
            chunks_signature: None,
        }
    }

    async fn receiving(d: &Deps, b: SignedBundle) -> Box<Publish> {
        match Publish::begin(d.clone(), b).await.unwrap() {
            Begun::Receiving(p) => p,
            Begun::Published => panic!("not published yet"),
        }
    }

    #[tokio::test]
    async fn a_publish_stores_its_blobs_and_records_the_bundle_once() {
        let dir = tempfile::tempdir().unwrap();
        let d = deps(dir.path());
        let b = bundle("1", &[("/etc/a.conf", b"alpha"), ("/etc/b.conf", b"beta")]);
        let mut p = receiving(&d, b.clone()).await;
        p.chunk(Digest::of(b"alpha"), b"al").await.unwrap();
        p.chunk(Digest::of(b"alpha"), b"pha").await.unwrap();
        p.chunk(Digest::of(b"beta"), b"beta").await.unwrap();
        assert!(p.finish().await.unwrap(), "created");
        assert!(d.blobs.local.contains(&Digest::of(b"alpha")));
        assert!(d.store.get_bundle("kubelet", "1").await.unwrap().is_some());

        // The same content again: nothing to receive.
        assert!(matches!(
            Publish::begin(d.clone(), b).await.unwrap(),
            Begun::Published
        ));
        // Other content under the same version: refused.
        let other = bundle("1", &[("/etc/a.conf", b"gamma")]);
        let e = Publish::begin(d.clone(), other).await.err().unwrap();
        assert!(
            matches!(e, OpError::Publish(PublishError::Immutable { .. })),
            "{e}"
        );
        assert_eq!(e.kind(), Some(Kind::AlreadyExists));
    }

    #[tokio::test]
    async fn a_refused_publish_records_nothing_and_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = deps(dir.path());
        let b = bundle("2", &[("/etc/a.conf", b"alpha"), ("/etc/b.conf", b"beta")]);

        // Bytes of no file of the bundle.
        let mut p = receiving(&d, b.clone()).await;
        let e = p.chunk(Digest::of(b"zeta"), b"zeta").await.unwrap_err();
        assert!(e.to_string().contains("which is not a file of kubelet@2"), "{e}");
        p.abort().await;

        // A file whose bytes never came.
        let mut p = receiving(&d, b.clone()).await;
        p.chunk(Digest::of(b"alpha"), b"alpha").await.unwrap();
        let e = p.finish().await.unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "the bytes of /etc/b.conf ({}) were not uploaded",
                Digest::of(b"beta")
            )
        );
        assert_eq!(e.kind(), Some(Kind::Invalid));

        // Bytes that are not the file's.
        let mut p = receiving(&d, b).await;
        p.chunk(Digest::of(b"alpha"), b"alphx").await.unwrap();
        let e = p.chunk(Digest::of(b"beta"), b"beta").await.unwrap_err();
        assert!(e.to_string().starts_with("upload rejected: "), "{e}");
        p.abort().await;

        assert!(d.store.get_bundle("kubelet", "2").await.unwrap().is_none());
        assert!(!d.blobs.local.contains(&Digest::of(b"alpha")));
    }

    #[tokio::test]
    async fn chunks_of_one_blob_come_together() {
        let dir = tempfile::tempdir().unwrap();
        let d = deps(dir.path());
        let b = bundle("3", &[("/etc/a.conf", b"alpha"), ("/etc/b.conf", b"beta")]);
        let mut p = receiving(&d, b).await;
        p.chunk(Digest::of(b"alpha"), b"alpha").await.unwrap();
        p.chunk(Digest::of(b"beta"), b"beta").await.unwrap();
        let e = p.chunk(Digest::of(b"alpha"), b"").await.unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("chunks of {} are not contiguous", Digest::of(b"alpha"))
        );
        p.abort().await;
    }
}
