//! The cache's tests: downloads verified on the way in, kept only whole,
//! resumed, and patches fetched, resumed and kept for peers.

use super::*;
use futures::future::BoxFuture;
use lks_proto::BundlePath;
use source::{BlobStream, SourceError};

/// Serves `bytes` in 1000-byte chunks, whatever the manifest says.
struct Serve(Vec<u8>);

impl BlobSource for Serve {
    fn open<'a>(&'a self, _: &'a FileSpec, offset: u64) -> BoxFuture<'a, Result<BlobStream, SourceError>> {
        let rest = self.0[offset as usize..].to_vec();
        Box::pin(async move {
            let chunks: Vec<_> = rest
                .chunks(1000)
                .map(|c| Ok(prost::bytes::Bytes::copy_from_slice(c)))
                .collect();
            Ok(BlobStream {
                offset,
                chunks: futures::stream::iter(chunks).boxed(),
            })
        })
    }
}

fn spec(bytes: &[u8]) -> FileSpec {
    FileSpec {
        chunks: None,
        arch: None,
        path: BundlePath::new("/usr/bin/tool").unwrap(),
        digest: Digest::of(bytes),
        size: bytes.len() as u64,
        mode: 0o755,
        url: None,
    }
}

#[tokio::test]
async fn a_corrupted_download_never_reaches_the_cache() {
    let d = tempfile::tempdir().unwrap();
    let cache = Cache::new(d.path().join("cache"));
    let good: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let mut bad = good.clone();
    bad[9_500] ^= 1;
    let f = spec(&good);
    let err = cache.ensure(&f, &Serve(bad)).await.unwrap_err();
    assert!(matches!(err, FetchError::Verify { .. }), "{err}");
    assert!(!cache.contains(&f.digest));
    assert!(!cache.partials().join(f.digest.hex()).exists(), "no partial kept");

    cache.ensure(&f, &Serve(good.clone())).await.unwrap();
    assert_eq!(fs::read(cache.blob_path(&f.digest)).unwrap(), good);
    assert!(!cache.partials().join(f.digest.hex()).exists());
}

#[tokio::test]
async fn an_apply_fetch_lands_in_fetched_and_is_known_good_there() {
    let d = tempfile::tempdir().unwrap();
    let cache = Cache::new(d.path().join("cache"));
    let good: Vec<u8> = (0..5_000u32).map(|i| (i * 7) as u8).collect();
    let f = spec(&good);
    let got = cache.fetch(&f, &Serve(good.clone())).await.unwrap();
    assert_eq!(got.from_server, good.len() as u64);
    assert!(!cache.contains(&f.digest), "not in the cache yet");
    let p = cache.verified_fetched(&f.digest, f.size).unwrap().unwrap();
    assert!(
        cache.known(&f.digest, &p),
        "verified as it streamed, not hashed again"
    );
    assert_eq!(fs::read(&p).unwrap(), good);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
    // A second fetch finds it; promoting it makes the cache entry.
    let again = cache.fetch(&f, &Serve(vec![])).await.unwrap();
    assert_eq!(again, Fetched::default());
    assert!(cache.promote_fetched(&f.digest, f.size).unwrap());
    assert!(cache.contains(&f.digest) && !p.exists());
}

/// Offers one patch for `file` and serves it, cut after `cut` bytes
/// on the first request; the file itself is unavailable. Records the
/// offsets the patch is asked from.
struct FlakyPatch {
    file: Digest,
    offer: source::DeltaOffer,
    patch: Vec<u8>,
    cut: usize,
    asked: std::sync::Mutex<Vec<u64>>,
}

impl BlobSource for FlakyPatch {
    fn open<'a>(&'a self, file: &'a FileSpec, offset: u64) -> BoxFuture<'a, Result<BlobStream, SourceError>> {
        Box::pin(async move {
            if file.digest != self.offer.patch {
                return Err(SourceError("the file is not served here".into()));
            }
            let first = {
                let mut asked = self.asked.lock().unwrap();
                asked.push(offset);
                asked.len() == 1
            };
            let rest = self.patch[offset as usize..].to_vec();
            let mut chunks: Vec<Result<prost::bytes::Bytes, SourceError>> = Vec::new();
            if first {
                chunks.push(Ok(prost::bytes::Bytes::copy_from_slice(&rest[..self.cut])));
                chunks.push(Err(SourceError("connection reset".into())));
            } else {
                chunks.push(Ok(rest.into()));
            }
            Ok(BlobStream {
                offset,
                chunks: futures::stream::iter(chunks).boxed(),
            })
        })
    }

    fn deltas<'a>(
        &'a self,
        file: &'a FileSpec,
    ) -> BoxFuture<'a, Result<Vec<source::DeltaOffer>, SourceError>> {
        let offers = if file.digest == self.file {
            vec![self.offer.clone()]
        } else {
            Vec::new()
        };
        Box::pin(async move { Ok(offers) })
    }
}

#[tokio::test]
async fn an_interrupted_patch_download_resumes_at_its_verified_length_and_the_patch_is_kept() {
    let d = tempfile::tempdir().unwrap();
    let cache = Cache::new(d.path().join("cache"));
    let old: Vec<u8> = (0..200_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let mut new = old.clone();
    new[70_000] ^= 1;
    new.splice(100_000..100_000, *b"inserted");
    let base = cache.insert(&old).unwrap();
    let patch = lks_proto::delta::make(&old, &new).unwrap();
    let f = spec(&new);
    let src = FlakyPatch {
        file: f.digest,
        offer: source::DeltaOffer {
            base,
            patch: Digest::of(&patch),
            patch_size: patch.len() as u64,
            algorithm: lks_proto::delta::ALGORITHM.into(),
            chunks: None,
        },
        cut: patch.len() / 2,
        patch: patch.clone(),
        asked: Default::default(),
    };
    // Cut mid-patch (and the file unavailable too): nothing installed,
    // the verified part of the patch kept.
    let err = cache.fetch(&f, &src).await.unwrap_err();
    assert!(matches!(err, FetchError::Unavailable { .. }), "{err}");
    let part = cache.partials().join(src.offer.patch.hex());
    assert_eq!(fs::metadata(&part).unwrap().len(), src.cut as u64);
    // Again: the patch resumes where it stopped, the file is rebuilt.
    let got = cache.fetch(&f, &src).await.unwrap();
    assert_eq!(*src.asked.lock().unwrap(), [0, src.cut as u64]);
    let rest = (patch.len() - src.cut) as u64;
    assert_eq!((got.from_server, got.as_delta, got.from_peers), (rest, rest, 0));
    let p = cache.verified_fetched(&f.digest, f.size).unwrap().unwrap();
    assert_eq!(fs::read(p).unwrap(), new);
    // The patch stays cached (for peers) while the file is kept.
    assert_eq!(fs::read(cache.blob_path(&src.offer.patch)).unwrap(), patch);
    cache.gc(&BTreeSet::from([f.digest])).unwrap();
    assert!(cache.contains(&src.offer.patch));
    cache.gc(&BTreeSet::new()).unwrap();
    assert!(!cache.contains(&src.offer.patch));
}

#[test]
fn a_fetched_file_changed_on_disk_is_hashed_and_dropped() {
    let d = tempfile::tempdir().unwrap();
    let cache = Cache::new(d.path().join("cache"));
    let good = b"good bytes".to_vec();
    let f = spec(&good);
    cache.create_fetched_dir().unwrap();
    fs::write(cache.fetched_path(&f.digest), b"evil bytes").unwrap();
    assert_eq!(cache.verified_fetched(&f.digest, f.size).unwrap(), None);
    assert!(!cache.fetched_path(&f.digest).exists());
    assert!(!cache.promote_fetched(&f.digest, f.size).unwrap());
}

/// A file holding `bytes`, open for reading.
fn source(dir: &Path, bytes: &[u8]) -> File {
    let p = dir.join("source");
    fs::write(&p, bytes).unwrap();
    File::open(&p).unwrap()
}

#[test]
fn a_copy_into_the_cache_is_kept_only_if_it_matches() {
    let d = tempfile::tempdir().unwrap();
    let cache = Cache::new(d.path().join("cache"));
    let good = b"the bytes that were switched in".to_vec();
    let f = spec(&good);
    let copy = |bytes: &[u8]| {
        cache
            .copy_in(source(d.path(), bytes), &f.digest, f.size, false)
            .unwrap()
    };
    // A target that drifted (same size): nothing cached, nothing left.
    let drifted = b"THE BYTES THAT WERE SWITCHED IN".to_vec();
    assert!(!copy(&drifted));
    assert!(!cache.contains(&f.digest));
    assert_eq!(fs::read_dir(cache.partials()).unwrap().count(), 0);
    // Longer than the manifest says: refused as soon as it passes.
    let longer = [good.clone(), b"more".to_vec()].concat();
    assert!(!copy(&longer));
    assert!(!cache.contains(&f.digest));
    // The right bytes: cached, and trusted by staging while unchanged.
    assert!(copy(&good));
    assert_eq!(fs::read(cache.blob_path(&f.digest)).unwrap(), good);
    let (_, known) = cache.open_checked(&f.digest).unwrap().unwrap();
    assert!(known);
    assert_eq!(fs::read_dir(cache.partials()).unwrap().count(), 0);
}

/// A source whose inode the engine vouches for is copied by the kernel,
/// not hashed; its length is still checked, across the copy's chunks.
#[test]
fn a_known_source_is_copied_unhashed_but_its_length_is_checked() {
    let d = tempfile::tempdir().unwrap();
    let cache = Cache::new(d.path().join("cache"));
    // Three chunks and a bit: the copy goes on past its first chunk.
    let good: Vec<u8> = (0..3 * COPY_CHUNK as usize + 17)
        .map(|i| (i % 251) as u8)
        .collect();
    let copy = |bytes: &[u8]| {
        let f = spec(bytes);
        cache
            .copy_in(source(d.path(), bytes), &f.digest, f.size, true)
            .unwrap()
    };
    let f = spec(&good);
    for wrong in [&good[..good.len() - 1], &[&good[..], b"x"].concat()[..]] {
        assert!(
            !cache
                .copy_in(source(d.path(), wrong), &f.digest, f.size, true)
                .unwrap()
        );
        assert!(!cache.contains(&f.digest));
        assert_eq!(fs::read_dir(cache.partials()).unwrap().count(), 0);
    }
    assert!(copy(&good));
    assert_eq!(fs::read(cache.blob_path(&f.digest)).unwrap(), good);
    // Shorter than one chunk, too.
    let small = b"small".to_vec();
    assert!(copy(&small));
    assert_eq!(fs::read(cache.blob_path(&spec(&small).digest)).unwrap(), small);
}
