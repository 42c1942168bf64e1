//! Sizes of mirrored bundle files (`url` without `size` in `bundle.toml`).
//!
//! `bundle publish` downloads such a file once from its mirror, hashing it
//! while it streams, and refuses the bundle unless the bytes match the
//! declared sha256. So a published manifest always carries a size that was
//! seen together with its digest, and a wrong checksum is caught on the
//! operator's machine instead of on every node.

use lks_proto::Digest;
use lks_proto::authoring::{SizeError, UrlSizer};
use lks_proto::digest::Hasher;
use lks_proto::limits::MAX_FILE_SIZE;

/// The HTTP client could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("set up HTTP client: {0}")]
pub struct ClientError(reqwest::Error);

/// Why the download that learns a file's size failed.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("{0}")]
    Request(reqwest::Error),
    #[error("HTTP {0}")]
    Status(reqwest::StatusCode),
    #[error("larger than the {MAX_FILE_SIZE}-byte limit")]
    TooLarge,
}

/// Downloads with reqwest on the runtime behind `handle`; call it from a
/// blocking thread (`spawn_blocking`), never from an async task.
pub struct MirrorSizer {
    handle: tokio::runtime::Handle,
    client: reqwest::Client,
}

impl MirrorSizer {
    pub fn new(handle: tokio::runtime::Handle) -> Result<Self, ClientError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(15))
            .build()
            .map_err(ClientError)?;
        Ok(MirrorSizer { handle, client })
    }
}

impl UrlSizer for MirrorSizer {
    fn size_of(&mut self, url: &str, digest: &Digest) -> Result<u64, SizeError> {
        self.handle.block_on(async {
            let fail = |e: FetchError| SizeError::Fetch {
                url: url.to_string(),
                source: Box::new(e),
            };
            let mut resp = self
                .client
                .get(url)
                .send()
                .await
                .map_err(|e| fail(FetchError::Request(e)))?;
            if !resp.status().is_success() {
                return Err(fail(FetchError::Status(resp.status())));
            }
            let mut h = Hasher::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| fail(FetchError::Request(e)))? {
                h.update(&chunk);
                if h.len() > MAX_FILE_SIZE {
                    return Err(fail(FetchError::TooLarge));
                }
            }
            let (got, size) = h.finish();
            if got != *digest {
                return Err(SizeError::Digest {
                    url: url.to_string(),
                    got,
                    declared: *digest,
                });
            }
            Ok(size)
        })
    }
}
