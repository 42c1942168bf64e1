//! Sizes of mirrored bundle files (`url` without `size` in `bundle.toml`).
//!
//! `bundle publish` downloads such a file once from its mirror, hashing it
//! while it streams, and refuses the bundle unless the bytes match the
//! declared sha256. So a published manifest always carries a size that was
//! seen together with its digest, and a wrong checksum is caught on the
//! operator's machine instead of on every node.

use lks_proto::Digest;
use lks_proto::authoring::UrlSizer;
use lks_proto::digest::Hasher;
use lks_proto::limits::MAX_FILE_SIZE;

/// Downloads with reqwest on the runtime behind `handle`; call it from a
/// blocking thread (`spawn_blocking`), never from an async task.
pub struct MirrorSizer {
    handle: tokio::runtime::Handle,
    client: reqwest::Client,
}

impl MirrorSizer {
    pub fn new(handle: tokio::runtime::Handle) -> Result<Self, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(15))
            .build()
            .map_err(|e| format!("set up HTTP client: {e}"))?;
        Ok(MirrorSizer { handle, client })
    }
}

impl UrlSizer for MirrorSizer {
    fn size_of(&mut self, url: &str, digest: &Digest) -> Result<u64, String> {
        self.handle.block_on(async {
            let fail = |e: &dyn std::fmt::Display| {
                format!("no size given and fetching {url} to learn it failed: {e}")
            };
            let mut resp = self.client.get(url).send().await.map_err(|e| fail(&e))?;
            if !resp.status().is_success() {
                return Err(fail(&format!("HTTP {}", resp.status())));
            }
            let mut h = Hasher::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| fail(&e))? {
                h.update(&chunk);
                if h.len() > MAX_FILE_SIZE {
                    return Err(fail(&format!("larger than the {MAX_FILE_SIZE}-byte limit")));
                }
            }
            let (got, size) = h.finish();
            if got != *digest {
                return Err(format!(
                    "{url} has sha256 {}, not the declared {}",
                    got.hex(),
                    digest.hex()
                ));
            }
            Ok(size)
        })
    }
}
