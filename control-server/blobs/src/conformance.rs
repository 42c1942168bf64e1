//! One suite for every [`BlobStore`]: the data dir, etcd chunks and an S3
//! bucket (a real S3 server, `s3s-fs`, which `scripts/setup.sh` installs)
//! must behave alike, so the backends cannot drift apart.

use lks_proto::Digest;

use crate::{BlobError, BlobStore, Blobs, LocalBlobs, S3Config, S3Store};

/// Writes `data` as a verified local blob and returns its digest.
async fn local_blob(local: &LocalBlobs, data: &[u8]) -> Digest {
    let d = Digest::of(data);
    let mut w = local.writer(d, data.len() as u64).await.unwrap();
    w.write(data).await.unwrap();
    w.finish().await.unwrap();
    d
}

/// Bytes that are not all alike, so a misplaced part shows.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

/// Put, look up, fetch into another replica's dir, list and delete.
pub async fn blobs_round_trip(store: &dyn BlobStore, sizes: &[usize]) {
    let publisher = tempfile::tempdir().unwrap();
    let publisher = LocalBlobs::open(publisher.path()).unwrap();
    let mut digests = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let data = pattern(len, i as u8);
        let d = local_blob(&publisher, &data).await;
        assert!(
            !store.contains(&d).await.unwrap(),
            "{} holds {d} before it was put",
            store.describe()
        );
        store.put(&d, len as u64, &publisher.path(&d)).await.unwrap();
        assert!(store.contains(&d).await.unwrap());
        // Putting it again changes nothing.
        store.put(&d, len as u64, &publisher.path(&d)).await.unwrap();
        digests.push((d, data));
    }

    let replica = tempfile::tempdir().unwrap();
    let replica = LocalBlobs::open(replica.path()).unwrap();
    for (d, data) in &digests {
        assert!(store.fetch(d, &replica).await.unwrap());
        assert_eq!(&std::fs::read(replica.path(d)).unwrap(), data, "{d} byte-exact");
    }
    let absent = Digest::of(b"never put");
    assert!(!store.fetch(&absent, &replica).await.unwrap());
    assert!(!replica.contains(&absent));

    let mut listed = store.list().await.unwrap();
    listed.sort_by_key(|b| b.digest);
    let mut want: Vec<_> = digests.iter().map(|(d, data)| (*d, data.len() as u64)).collect();
    want.sort();
    assert_eq!(
        listed.iter().map(|b| (b.digest, b.size)).collect::<Vec<_>>(),
        want,
        "list names every blob with its size"
    );

    let (gone, _) = &digests[0];
    store.delete(gone).await.unwrap();
    store.delete(gone).await.unwrap();
    assert!(!store.contains(gone).await.unwrap());
    let other = tempfile::tempdir().unwrap();
    let other = LocalBlobs::open(other.path()).unwrap();
    assert!(!store.fetch(gone, &other).await.unwrap());
    assert_eq!(store.list().await.unwrap().len(), digests.len() - 1);
}

/// A file that is not the blob it claims to be never enters the store.
pub async fn a_wrong_file_is_never_stored(store: &dyn BlobStore, len: usize) {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalBlobs::open(dir.path()).unwrap();
    let data = pattern(len, 7);
    let d = Digest::of(&data);
    let mut flipped = data.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 1;
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, &flipped).unwrap();
    let err = store.put(&d, len as u64, &wrong).await.unwrap_err();
    assert!(matches!(err, BlobError::Verify { .. }), "{err}");
    assert!(!store.contains(&d).await.unwrap(), "nothing under {d}");
    let short = dir.path().join("short");
    std::fs::write(&short, &data[..len / 2]).unwrap();
    assert!(store.put(&d, len as u64, &short).await.is_err());
    assert!(!store.contains(&d).await.unwrap());
    assert!(store.list().await.unwrap().iter().all(|b| b.digest != d));
    let _ = local;
}

/// Through [`Blobs`]: a replica that lacks a blob fetches it once.
pub async fn replicas_fetch_what_another_published(store: std::sync::Arc<dyn BlobStore>) {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let a = Blobs::new(LocalBlobs::open(a.path()).unwrap(), store.clone());
    let b = std::sync::Arc::new(Blobs::new(LocalBlobs::open(b.path()).unwrap(), store));
    let data = pattern(3 << 20, 3);
    let d = local_blob(&a.local, &data).await;
    a.persist(&d, data.len() as u64).await.unwrap();
    // Several requests at once: one fetch, every caller sees the blob.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let b = b.clone();
        tasks.push(tokio::spawn(async move { b.ensure_local(&d).await.unwrap() }));
    }
    for t in tasks {
        assert!(t.await.unwrap());
    }
    assert_eq!(std::fs::read(b.local.path(&d)).unwrap(), data);
    assert!(!b.ensure_local(&Digest::of(b"absent")).await.unwrap());
}

/// A real S3 server on loopback: the end-to-end harness's `s3s-fs`
/// (`lks_e2e::s3`, which `scripts/setup.sh` installs), killed and removed
/// on drop.
pub struct TestS3(lks_e2e::s3::S3);

impl TestS3 {
    /// Starts the server with one bucket, `bucket`.
    pub fn start(bucket: &str) -> TestS3 {
        TestS3(lks_e2e::s3::S3::start(bucket))
    }

    pub fn config(&self, bucket: &str, prefix: &str) -> S3Config {
        S3Config {
            bucket: bucket.into(),
            prefix: prefix.into(),
            endpoint: Some(format!("http://{}", self.0.addr)),
            region: "us-east-1".into(),
            virtual_hosted: false,
            access_key_id: lks_e2e::s3::ACCESS_KEY.into(),
            secret_access_key: lks_e2e::s3::SECRET_KEY.into(),
            session_token: None,
            ca_cert_pem: None,
        }
    }

    pub fn store(&self, bucket: &str, prefix: &str) -> S3Store {
        S3Store::new(&self.config(bucket, prefix)).unwrap()
    }
}

/// A throwaway etcd, on a port the end-to-end harness picks.
pub fn test_etcd() -> lks_store_etcd::testing::TestEtcd {
    lks_store_etcd::testing::TestEtcd::start_with(|| lks_e2e::free_addr().port())
}

mod on_local_dir {
    use super::*;
    use crate::LocalDirStore;

    fn store(dir: &std::path::Path) -> LocalDirStore {
        LocalDirStore::new(LocalBlobs::open(dir).unwrap())
    }

    #[tokio::test]
    async fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        blobs_round_trip(&store(dir.path()), &[0, 1, 5 << 20]).await;
    }

    #[tokio::test]
    async fn wrong_file() {
        let dir = tempfile::tempdir().unwrap();
        a_wrong_file_is_never_stored(&store(dir.path()), 1 << 20).await;
    }

    #[tokio::test]
    async fn replicas_fetch() {
        let dir = tempfile::tempdir().unwrap();
        replicas_fetch_what_another_published(std::sync::Arc::new(store(dir.path()))).await;
    }
}

mod on_etcd {
    use super::*;
    use crate::EtcdChunks;

    #[tokio::test]
    async fn round_trip() {
        let etcd = crate::conformance::test_etcd();
        let store = EtcdChunks::new(etcd.store("r1").await, 32 << 20);
        // Sizes around the chunk size: empty, one byte, one chunk and a half.
        blobs_round_trip(&store, &[0, 1, (1 << 20) + (1 << 19)]).await;
    }

    #[tokio::test]
    async fn wrong_file() {
        let etcd = crate::conformance::test_etcd();
        let store = EtcdChunks::new(etcd.store("r1").await, 32 << 20);
        a_wrong_file_is_never_stored(&store, (2 << 20) + 5).await;
    }

    #[tokio::test]
    async fn replicas_fetch_and_the_cap() {
        let etcd = crate::conformance::test_etcd();
        let store = std::sync::Arc::new(EtcdChunks::new(etcd.store("r1").await, 4 << 20));
        replicas_fetch_what_another_published(store.clone()).await;
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::new(LocalBlobs::open(dir.path()).unwrap(), store);
        let data = pattern((4 << 20) + 1, 1);
        let d = local_blob(&blobs.local, &data).await;
        let err = blobs.persist(&d, data.len() as u64).await.unwrap_err();
        assert!(matches!(err, BlobError::TooLarge { .. }), "{err}");
    }
}

mod on_s3 {
    use super::*;
    use crate::s3::PART;

    #[tokio::test]
    async fn round_trip() {
        let s3 = TestS3::start("lks-blobs");
        let store = s3.store("lks-blobs", "region-a");
        store.check().await.unwrap();
        // One PUT, and a multipart upload of three parts (the last short).
        blobs_round_trip(&store, &[0, 1, 2 * PART + 12_345]).await;
    }

    #[tokio::test]
    async fn wrong_file() {
        let s3 = TestS3::start("lks-blobs");
        let store = s3.store("lks-blobs", "");
        a_wrong_file_is_never_stored(&store, 1 << 20).await;
        // A multipart upload abandoned halfway leaves no object either.
        a_wrong_file_is_never_stored(&store, PART + 1).await;
    }

    #[tokio::test]
    async fn replicas_fetch() {
        let s3 = TestS3::start("lks-blobs");
        replicas_fetch_what_another_published(std::sync::Arc::new(s3.store("lks-blobs", "p"))).await;
    }

    #[tokio::test]
    async fn a_streamed_upload_is_visible_only_once_finished() {
        let s3 = TestS3::start("lks-blobs");
        let store = s3.store("lks-blobs", "stream");
        let data = pattern(PART + 4321, 11);
        let d = Digest::of(&data);
        assert!(
            store.start_upload(&d, 10).await.unwrap().is_none(),
            "small: one PUT later"
        );
        // Abandoned: nothing under the name.
        let mut up = store.start_upload(&d, data.len() as u64).await.unwrap().unwrap();
        up.write(&data[..PART]).await.unwrap();
        up.abort().await;
        assert!(!store.contains(&d).await.unwrap());
        // Sent in pieces, then finished: byte-exact.
        let mut up = store.start_upload(&d, data.len() as u64).await.unwrap().unwrap();
        for piece in data.chunks(1 << 20) {
            up.write(piece).await.unwrap();
        }
        assert!(!store.contains(&d).await.unwrap(), "invisible until finished");
        up.finish().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let local = LocalBlobs::open(dir.path()).unwrap();
        assert!(store.fetch(&d, &local).await.unwrap());
        assert_eq!(std::fs::read(local.path(&d)).unwrap(), data);
        assert!(
            store.start_upload(&d, data.len() as u64).await.unwrap().is_none(),
            "held already"
        );
    }

    #[tokio::test]
    async fn the_check_names_what_is_wrong() {
        let s3 = TestS3::start("lks-blobs");
        let missing = s3
            .store("no-such-bucket", "")
            .check()
            .await
            .unwrap_err()
            .to_string();
        assert!(missing.contains("bucket does not exist"), "{missing}");
        let mut cfg = s3.config("lks-blobs", "");
        cfg.secret_access_key = "wrong".into();
        let denied = S3Store::new(&cfg).unwrap().check().await.unwrap_err().to_string();
        assert!(denied.contains("credentials are refused"), "{denied}");
        let mut cfg = s3.config("lks-blobs", "");
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        cfg.endpoint = Some(format!("http://{closed}"));
        let down = S3Store::new(&cfg).unwrap().check().await.unwrap_err();
        assert!(down.is_unavailable(), "{down}");
        assert!(!down.to_string().contains('\n'));
    }
}
