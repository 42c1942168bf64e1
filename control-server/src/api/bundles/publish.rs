//! `PublishBundle`: a signed bundle's header, then the bytes of every
//! file the server holds, streamed and verified (digest, size, chunk list)
//! as they arrive. Large blobs stream on into the blob store; every blob
//! is claimed before it takes its name, and only a publish verified whole
//! records the bundle, so a publish refused halfway leaves nothing behind.

use std::collections::{BTreeMap, HashSet};

use lks_proto::chunks::ChunkHasher;
use lks_proto::chunks::Chunks;
use lks_proto::pb;
use lks_proto::pb::publish_bundle_request::Msg as PublishMsg;
use lks_proto::{Digest, Manifest, SignedBundle, canonical, sign};
use tonic::{Response, Status, Streaming};

use super::super::invalid;
use super::Deps;
use crate::authz::{blob_status, store_status};
use crate::blobs::{BlobError, BlobWriter, StagedBlob, Upload};
use crate::clock::now_ms;
use crate::store::{EventRow, NewBundle, PutOutcome};

/// `PublishBundle`: the header, the bytes, then the record.
pub(in crate::api) async fn publish(
    s: &Deps,
    mut inbound: Streaming<pb::PublishBundleRequest>,
) -> Result<Response<pb::PublishBundleResponse>, Status> {
    let signed = read_header(&mut inbound).await?;
    let m = &signed.manifest;
    let manifest_digest = canonical::manifest_digest(m);
    if let Some(same) = already_published(s, m, &manifest_digest, &mut inbound).await? {
        return Ok(Response::new(same));
    }
    let expected = expected_blobs(s, m)?;
    let lists = chunk_lists(m)?;
    let mut rx = Receiver::default();
    if let Err(st) = rx.receive(s, m, &mut inbound, &expected, &lists).await {
        if let Some(up) = rx.streaming.take() {
            up.abort().await;
        }
        rx.uploads.abort_all().await;
        return Err(st);
    }
    let Receiver {
        done,
        staged,
        mut uploads,
        ..
    } = rx;
    if let Err(st) = prepare(s, m, &expected, &lists, &done, staged).await {
        uploads.abort_all().await;
        return Err(st);
    }
    let in_store = finish_uploads(s, m, &expected, uploads).await?;
    persist_rest(s, m, &expected, &in_store).await?;
    let (name, version) = (m.name.clone(), m.version.clone());
    let created = record(s, signed, &expected).await?;
    Ok(Response::new(pb::PublishBundleResponse {
        name,
        version,
        created,
    }))
}

/// The first message: the signed bundle, its signature checked.
async fn read_header(inbound: &mut Streaming<pb::PublishBundleRequest>) -> Result<SignedBundle, Status> {
    let header = match inbound.message().await? {
        Some(pb::PublishBundleRequest {
            msg: Some(PublishMsg::Header(h)),
        }) => h,
        Some(_) => {
            return Err(invalid(
                "the first message of a publish must be the bundle header",
            ));
        }
        None => return Err(invalid("empty publish stream")),
    };
    let signed =
        SignedBundle::try_from(header).map_err(|e| invalid(format!("invalid bundle manifest: {e}")))?;
    if signed.signature.is_some() {
        sign::verify(&signed, &[]).map_err(invalid)?;
    }
    Ok(signed)
}

/// A version published already: the same content is answered `created:
/// false` (the rest of the stream read, so the client sees a clean close),
/// other content is refused — versions are immutable.
async fn already_published(
    s: &Deps,
    m: &Manifest,
    manifest_digest: &Digest,
    inbound: &mut Streaming<pb::PublishBundleRequest>,
) -> Result<Option<pb::PublishBundleResponse>, Status> {
    let id = m.id();
    let Some(existing) = s
        .store
        .get_bundle(&m.name, &m.version)
        .await
        .map_err(store_status)?
    else {
        return Ok(None);
    };
    if existing.manifest_digest != *manifest_digest {
        return Err(Status::already_exists(format!(
            "bundle {id} already exists with other content; versions are immutable, publish a new version"
        )));
    }
    // Identical: read the rest so the client sees a clean close.
    while inbound.message().await?.is_some() {}
    Ok(Some(pb::PublishBundleResponse {
        name: m.name.clone(),
        version: m.version.clone(),
        created: false,
    }))
}

/// The bytes the server must hold: files without a mirror URL, each
/// within the blob store's size limit.
fn expected_blobs(s: &Deps, m: &Manifest) -> Result<BTreeMap<Digest, u64>, Status> {
    let mut expected: BTreeMap<Digest, u64> = BTreeMap::new();
    for (i, f) in m.files.iter().enumerate().filter(|(_, f)| f.url.is_none()) {
        if let Some(size) = expected.insert(f.digest, f.size)
            && size != f.size
        {
            return Err(invalid(format!(
                "file[{i}]: digest {} is listed with two different sizes",
                f.digest
            )));
        }
    }
    if let Some(max) = s.blobs.store().max_blob_size()
        && let Some((d, size)) = expected.iter().find(|(_, size)| **size > max)
    {
        return Err(invalid(format!(
            "{}: {}",
            path_of(m, d),
            BlobError::TooLarge {
                digest: *d,
                size: *size,
                max
            }
        )));
    }
    Ok(expected)
}

/// Chunk lists are checked against the bytes like the digests are: a list
/// that does not describe its file would make every peer that serves it
/// look like a liar. One list per digest.
fn chunk_lists(m: &Manifest) -> Result<BTreeMap<Digest, &Chunks>, Status> {
    let mut lists: BTreeMap<Digest, &Chunks> = BTreeMap::new();
    for (i, f) in m.files.iter().enumerate() {
        if let Some(c) = &f.chunks
            && let Some(other) = lists.insert(f.digest, c)
            && other != c
        {
            return Err(invalid(format!(
                "file[{i}]: digest {} is listed with two different chunk lists",
                f.digest
            )));
        }
    }
    Ok(lists)
}

/// The target path of a served blob, for error messages.
fn path_of(m: &Manifest, d: &Digest) -> String {
    m.files
        .iter()
        .find(|f| f.digest == *d)
        .map(|f| f.path.to_string())
        .unwrap_or_default()
}

/// The blobs of a publish as their chunks arrive.
#[derive(Default)]
struct Receiver {
    pieces: Option<ChunkHasher>,
    done: HashSet<Digest>,
    current: Option<BlobWriter>,
    staged: Vec<StagedBlob>,
    /// Large blobs also stream into the blob store as they arrive
    /// (visible there only once verified and claimed, in `prepare`).
    uploads: Uploads,
    streaming: Option<Box<dyn Upload>>,
}

impl Receiver {
    /// Reads the chunks to the end of the stream: each blob is written
    /// locally, hashed against its chunk list, and staged when it ends.
    async fn receive(
        &mut self,
        s: &Deps,
        m: &Manifest,
        inbound: &mut Streaming<pb::PublishBundleRequest>,
        expected: &BTreeMap<Digest, u64>,
        lists: &BTreeMap<Digest, &Chunks>,
    ) -> Result<(), Status> {
        let id = m.id();
        while let Some(msg) = inbound.message().await? {
            let chunk = match msg.msg {
                Some(PublishMsg::Chunk(c)) => c,
                Some(PublishMsg::Header(_)) => {
                    return Err(invalid("a publish carries exactly one header"));
                }
                None => return Err(invalid("empty message in publish stream")),
            };
            let d: Digest = chunk
                .digest
                .parse()
                .map_err(|e| invalid(format!("chunk digest: {e}")))?;
            if self.current.as_ref().map(BlobWriter::digest) != Some(d) {
                self.end_current(m, lists).await?;
                if self.done.contains(&d) {
                    return Err(invalid(format!("chunks of {d} are not contiguous")));
                }
                let size = *expected.get(&d).ok_or_else(|| {
                    invalid(format!(
                        "upload of {d}, which is not a file of {id} (or is fetched from a mirror URL)"
                    ))
                })?;
                self.current = Some(
                    s.blobs
                        .local
                        .writer(d, size)
                        .await
                        .map_err(|e| Status::internal(e.to_string()))?,
                );
                self.pieces = lists.get(&d).map(|c| ChunkHasher::new(c.size));
                self.streaming = s
                    .blobs
                    .store()
                    .start_upload(&d, size)
                    .await
                    .map_err(|e| blob_status(&path_of(m, &d), e))?;
            }
            if let Some(p) = self.pieces.as_mut() {
                p.update(&chunk.data);
            }
            if let Some(w) = self.current.as_mut() {
                w.write(&chunk.data)
                    .await
                    .map_err(|e| invalid(format!("upload rejected: {e}")))?;
            }
            if let Some(up) = self.streaming.as_mut() {
                up.write(&chunk.data)
                    .await
                    .map_err(|e| blob_status(&path_of(m, &d), e))?;
            }
        }
        self.end_current(m, lists).await
    }

    /// The blob being received (if any) ended: checked and staged.
    async fn end_current(&mut self, m: &Manifest, lists: &BTreeMap<Digest, &Chunks>) -> Result<(), Status> {
        if let Some(w) = self.current.take() {
            check_pieces(
                &path_of(m, &w.digest()),
                lists.get(&w.digest()),
                self.pieces.take(),
            )?;
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

/// Everything received: blobs the server held already are checked against
/// their chunk lists, empty files need no bytes, any other missing blob
/// refuses the publish; then every blob is claimed and the staged ones
/// take their local names.
async fn prepare(
    s: &Deps,
    m: &Manifest,
    expected: &BTreeMap<Digest, u64>,
    lists: &BTreeMap<Digest, &Chunks>,
    done: &HashSet<Digest>,
    mut staged: Vec<StagedBlob>,
) -> Result<(), Status> {
    // Blobs the server held already: their lists against the copy.
    for (d, c) in lists.iter().filter(|(d, _)| !done.contains(*d)) {
        let p = s.blobs.local.path(d);
        if !p.is_file() {
            continue; // not uploaded: refused below
        }
        let size = c.size;
        let read = tokio::task::spawn_blocking(move || {
            std::fs::File::open(&p).and_then(|f| lks_proto::chunks::Chunks::of_reader(f, size))
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| Status::internal(format!("read blob {d}: {e}")))?;
        check_list(&path_of(m, d), c, &read.2)?;
    }
    for (d, size) in expected {
        if done.contains(d) || s.blobs.local.contains(d) {
            continue;
        }
        if *size == 0 {
            let w = s
                .blobs
                .local
                .writer(*d, 0)
                .await
                .map_err(|e| Status::internal(e.to_string()))?;
            staged.push(
                w.stage()
                    .await
                    .map_err(|e| invalid(format!("upload rejected: {e}")))?,
            );
            continue;
        }
        return Err(invalid(format!(
            "the bytes of {} ({d}) were not uploaded",
            path_of(m, d)
        )));
    }

    // Claimed before they take their local names: from here on no
    // garbage collector deletes them (blobs/gc.rs).
    let store_name = s.blobs.store().describe();
    for (d, size) in expected {
        crate::blobs::gc::claim(&*s.store, &store_name, d, *size, now_ms)
            .await
            .map_err(|e| blob_status(&path_of(m, d), e))?;
    }
    // Every byte is verified: only now do the blobs enter the store, so
    // a publish refused halfway leaves none behind.
    for b in staged {
        b.commit()
            .await
            .map_err(|e| Status::internal(format!("store blob: {e}")))?;
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
) -> Result<HashSet<Digest>, Status> {
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
            return Err(blob_status(&path_of(m, &d), e));
        }
    }
    Ok(in_store)
}

/// The rest into the blob store before the bundle is recorded, so any
/// replica can serve them once publish answers (blobs/mod.rs).
async fn persist_rest(
    s: &Deps,
    m: &Manifest,
    expected: &BTreeMap<Digest, u64>,
    in_store: &HashSet<Digest>,
) -> Result<(), Status> {
    for (d, size) in expected.iter().filter(|(d, _)| !in_store.contains(*d)) {
        let uploaded = s
            .blobs
            .persist(d, *size)
            .await
            .map_err(|e| blob_status(&path_of(m, d), e))?;
        if uploaded {
            s.metrics.blob_bytes_stored(*size);
        }
    }
    Ok(())
}

/// Records the bundle (and, if it is new, the `bundle_published` event);
/// true if it was created.
async fn record(s: &Deps, signed: SignedBundle, expected: &BTreeMap<Digest, u64>) -> Result<bool, Status> {
    let new = NewBundle::new(signed, expected.keys().copied().collect(), now_ms());
    let (stored, is_signed) = (new.bundle.clone(), new.signed);
    let m = stored.manifest();
    let id = m.id();
    let outcome = s.store.put_bundle(new).await.map_err(store_status)?;
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
            .await
            .map_err(store_status)?;
        tracing::info!(bundle = %id, signed = is_signed, "bundle published");
    }
    Ok(created)
}

/// Refuses an upload whose bytes do not match the chunk list of its file.
fn check_pieces(
    path: &str,
    list: Option<&&lks_proto::chunks::Chunks>,
    pieces: Option<ChunkHasher>,
) -> Result<(), Status> {
    match (list, pieces) {
        (Some(list), Some(p)) => check_list(path, list, &p.finish()),
        _ => Ok(()),
    }
}

fn check_list(
    path: &str,
    list: &lks_proto::chunks::Chunks,
    got: &lks_proto::chunks::Chunks,
) -> Result<(), Status> {
    match list.digests.iter().zip(&got.digests).position(|(a, b)| a != b) {
        None if list.digests.len() == got.digests.len() => Ok(()),
        i => Err(invalid(format!(
            "upload rejected: {path}: chunk {} does not match the manifest's chunk list",
            i.unwrap_or(list.digests.len().min(got.digests.len()))
        ))),
    }
}

/// The last chunk of a blob of a publish arrived: it is verified and
/// staged, and its streamed upload (if any) waits for the claim.
async fn end_blob(
    w: BlobWriter,
    streaming: Option<Box<dyn Upload>>,
    done: &mut HashSet<Digest>,
    staged: &mut Vec<StagedBlob>,
    uploads: &mut Uploads,
) -> Result<(), Status> {
    let digest = w.digest();
    done.insert(digest);
    match w.stage().await {
        Ok(b) => staged.push(b),
        Err(e) => {
            // Not the blob: its upload never completes.
            if let Some(up) = streaming {
                up.abort().await;
            }
            return Err(invalid(format!("upload rejected: {e}")));
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
