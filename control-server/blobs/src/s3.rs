//! `--blob-store s3://BUCKET/PREFIX`: blobs in an S3-compatible bucket
//! (Ceph RGW, MinIO, OpenStack Swift's S3 API, AWS S3), through the Arrow
//! project's `object_store` client, signing with ring.
//!
//! Layout: `PREFIX/sha256/ab/<hex>`, one object per blob. A blob up to
//! [`PART`] bytes is one `PUT`; a larger one a multipart upload, which S3
//! makes visible under its key only when it completes. Either way the bytes
//! are hashed while they are read from the local file and the upload is
//! abandoned, never completed, if they are not the blob; after it the
//! object's size is read back. No size limit applies: etcd holds none of it.
//!
//! Credentials come from `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (and
//! `AWS_SESSION_TOKEN`) or from a file in the AWS shared-credentials form
//! (`--s3-credentials-file`), never from the command line.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lks_proto::Digest;
use lks_proto::digest::Verifier;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig, WriteMultipart,
};
use tokio::io::AsyncReadExt;

use crate::{BlobError, BlobStore, LocalBlobs, StoredBlob};

/// Part size of a multipart upload; smaller blobs go in one `PUT`.
pub const PART: usize = 16 << 20;
/// Parts of one upload in flight at once (memory: `PART` × this).
const PARTS_IN_FLIGHT: usize = 4;
/// How long the check at start may take before the store counts as unreachable.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the bucket is and how to sign for it.
#[derive(Clone)]
pub struct S3Config {
    pub bucket: String,
    /// Key prefix inside the bucket, without leading or trailing `/`.
    pub prefix: String,
    /// `https://rgw.example:443`; AWS itself when `None`.
    pub endpoint: Option<String>,
    pub region: String,
    /// `BUCKET.endpoint/key` instead of `endpoint/BUCKET/key`.
    pub virtual_hosted: bool,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    /// PEM roots to trust for the endpoint besides the system's.
    pub ca_cert_pem: Option<Vec<u8>>,
}

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret.
        f.debug_struct("S3Config")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("virtual_hosted", &self.virtual_hosted)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum S3ConfigError {
    #[error("--blob-store {0:?}: expected s3://BUCKET or s3://BUCKET/PREFIX")]
    Url(String),
    #[error("--s3-endpoint {0:?} is not an http:// or https:// URL")]
    Endpoint(String),
    #[error(
        "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or name a credentials \
         file with --s3-credentials-file"
    )]
    NoCredentials,
    #[error("--s3-credentials-file {path}: {message}")]
    CredentialsFile { path: PathBuf, message: String },
    #[error("--s3-ca-cert {path}: {message}")]
    CaCert { path: PathBuf, message: String },
}

/// `s3://BUCKET[/PREFIX]` split into bucket and prefix.
pub fn parse_url(url: &str) -> Result<(String, String), S3ConfigError> {
    let bad = || S3ConfigError::Url(url.to_string());
    let rest = url.strip_prefix("s3://").ok_or_else(bad)?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    // S3's bucket naming rules: 3-63 of [a-z0-9.-], starting and ending alphanumeric.
    let ok_bucket = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
        && bucket.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix = prefix.trim_matches('/');
    let ok_prefix = prefix
        .split('/')
        .all(|s| prefix.is_empty() || (!s.is_empty() && s != "." && s != ".."))
        && !prefix.chars().any(|c| c.is_control() || c == '\\');
    if !ok_bucket || !ok_prefix {
        return Err(bad());
    }
    Ok((bucket.to_string(), prefix.to_string()))
}

/// Credentials from the environment, or from `file` when given.
pub fn credentials(file: Option<&Path>) -> Result<(String, String, Option<String>), S3ConfigError> {
    if let Some(path) = file {
        return credentials_file(path);
    }
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
        (Some(id), Some(secret)) => Ok((id, secret, var("AWS_SESSION_TOKEN"))),
        _ => Err(S3ConfigError::NoCredentials),
    }
}

/// The `[default]` profile (or the only one) of an AWS shared-credentials
/// file: `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`.
fn credentials_file(path: &Path) -> Result<(String, String, Option<String>), S3ConfigError> {
    use std::os::unix::fs::MetadataExt;
    let err = |message: String| S3ConfigError::CredentialsFile {
        path: path.to_path_buf(),
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
    if meta.mode() & 0o077 != 0 {
        return Err(err(format!(
            "mode {:04o} lets others read the secret; make it 0600 (or 0400)",
            meta.mode() & 0o7777
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let (mut id, mut secret, mut token) = (None, None, None);
    let mut section = String::from("default");
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_string();
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(err(format!("line {}: expected `key = value`", n + 1)));
        };
        if section != "default" {
            continue;
        }
        let v = Some(v.trim().to_string());
        match k.trim() {
            "aws_access_key_id" => id = v,
            "aws_secret_access_key" => secret = v,
            "aws_session_token" => token = v,
            _ => {}
        }
    }
    match (id, secret) {
        (Some(id), Some(secret)) if !id.is_empty() && !secret.is_empty() => Ok((id, secret, token)),
        _ => Err(err(
            "no aws_access_key_id and aws_secret_access_key in its [default] profile".into(),
        )),
    }
}

impl S3Config {
    /// Reads the CA file if given.
    pub fn read_ca(path: &Path) -> Result<Vec<u8>, S3ConfigError> {
        let pem = std::fs::read(path).map_err(|e| S3ConfigError::CaCert {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        object_store::Certificate::from_pem(&pem).map_err(|e| S3ConfigError::CaCert {
            path: path.to_path_buf(),
            message: one_line(&e.to_string()),
        })?;
        Ok(pem)
    }

    pub fn check_endpoint(endpoint: &str) -> Result<(), S3ConfigError> {
        let rest = endpoint
            .strip_prefix("https://")
            .or_else(|| endpoint.strip_prefix("http://"));
        match rest {
            Some(host) if !host.is_empty() && !host.starts_with('/') => Ok(()),
            _ => Err(S3ConfigError::Endpoint(endpoint.to_string())),
        }
    }
}

/// Blobs in an S3 bucket.
#[derive(Clone)]
pub struct S3Store {
    store: Arc<AmazonS3>,
    root: Key,
    name: String,
}

/// Error text on one line, and not a page of it.
fn one_line(s: &str) -> String {
    let mut s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.len() > 400 {
        let mut cut = 400;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

impl S3Store {
    pub fn new(cfg: &S3Config) -> Result<Self, BlobError> {
        // reqwest's rustls takes the process's provider: ring, as everywhere.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let name = if cfg.prefix.is_empty() {
            format!("s3://{}", cfg.bucket)
        } else {
            format!("s3://{}/{}", cfg.bucket, cfg.prefix)
        };
        let mut client = ClientOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            // A large blob may take minutes; a stalled one is cut by the
            // read timeout instead.
            .with_timeout_disabled()
            .with_read_timeout(Duration::from_secs(30));
        if let Some(e) = &cfg.endpoint
            && e.starts_with("http://")
        {
            client = client.with_allow_http(true);
        }
        if let Some(pem) = &cfg.ca_cert_pem {
            let cert = object_store::Certificate::from_pem(pem).map_err(|e| BlobError::Refused {
                store: name.clone(),
                message: format!("--s3-ca-cert: {}", one_line(&e.to_string())),
            })?;
            client = client.with_root_certificate(cert);
        }
        let retry = RetryConfig {
            backoff: BackoffConfig::default(),
            max_retries: 3,
            retry_timeout: Duration::from_secs(20),
        };
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&cfg.bucket)
            .with_region(&cfg.region)
            .with_access_key_id(&cfg.access_key_id)
            .with_secret_access_key(&cfg.secret_access_key)
            .with_virtual_hosted_style_request(cfg.virtual_hosted)
            .with_client_options(client)
            .with_retry(retry);
        if let Some(t) = &cfg.session_token {
            b = b.with_token(t);
        }
        if let Some(e) = &cfg.endpoint {
            b = b.with_endpoint(e);
        }
        let store = b.build().map_err(|e| BlobError::Refused {
            store: name.clone(),
            message: one_line(&e.to_string()),
        })?;
        Ok(S3Store {
            store: Arc::new(store),
            root: Key::from(cfg.prefix.as_str()),
            name,
        })
    }

    fn dir(&self) -> Key {
        self.root.clone().join("sha256")
    }

    fn key(&self, d: &Digest) -> Key {
        let hex = d.hex();
        self.dir().join(&hex[..2]).join(hex)
    }

    /// What an object store error means here. Some errors (a list on a
    /// missing bucket, a bad signature) arrive as generic ones carrying
    /// S3's error code in the body: those are read too.
    fn error(&self, what: &str, e: object_store::Error) -> BlobError {
        let text = one_line(&e.to_string());
        let refused = |message: String| BlobError::Refused {
            store: self.name.clone(),
            message,
        };
        if text.contains("NoSuchBucket") {
            return refused(format!(
                "{what}: the bucket does not exist (create it, or check --s3-endpoint)"
            ));
        }
        let denied = matches!(
            e,
            object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. }
        ) || [
            "AccessDenied",
            "SignatureDoesNotMatch",
            "InvalidAccessKeyId",
            "403 Forbidden",
        ]
        .iter()
        .any(|code| text.contains(code));
        if denied {
            return refused(format!(
                "{what}: the credentials are refused (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or \
                 --s3-credentials-file): {text}"
            ));
        }
        BlobError::Unavailable {
            store: self.name.clone(),
            message: format!("{what}: {text}"),
        }
    }

    /// Checks the object's size after an upload.
    async fn read_back(&self, d: &Digest, size: u64) -> Result<(), BlobError> {
        let meta = self
            .store
            .head(&self.key(d))
            .await
            .map_err(|e| self.error(&format!("read back {d}"), e))?;
        if meta.size != size {
            return Err(BlobError::Corrupt {
                store: self.name.clone(),
                digest: *d,
                message: format!("holds {} bytes after the upload of {size}", meta.size),
            });
        }
        Ok(())
    }

    async fn check_inner(&self) -> Result<(), BlobError> {
        match self.store.list_with_delimiter(Some(&self.root)).await {
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => {
                return Err(BlobError::Refused {
                    store: self.name.clone(),
                    message: "list the bucket: the bucket does not exist (create it, or check --s3-endpoint)"
                        .into(),
                });
            }
            Err(e) => return Err(self.error("list the bucket", e)),
        }
        // Writing is what publish needs: prove it with a probe object.
        let mut nonce = [0u8; 8];
        let _ = getrandom::getrandom(&mut nonce);
        let probe = self.root.clone().join(".probe").join(hex::encode(nonce));
        self.store
            .put(&probe, PutPayload::from_static(b"lksadmin"))
            .await
            .map_err(|e| self.error("write a probe object", e))?;
        self.store
            .delete(&probe)
            .await
            .map_err(|e| self.error("delete the probe object", e))?;
        Ok(())
    }

    async fn put_multipart(&self, d: &Digest, size: u64, from: &Path, key: &Key) -> Result<(), BlobError> {
        let io = |e: std::io::Error| BlobError::Io {
            path: from.to_path_buf(),
            source: e,
        };
        let mut file = tokio::fs::File::open(from).await.map_err(io)?;
        let upload = self
            .store
            .put_multipart(key)
            .await
            .map_err(|e| self.error(&format!("start the upload of {d}"), e))?;
        let mut w = WriteMultipart::new_with_chunk_size(upload, PART);
        let mut verifier = Verifier::new(*d, size);
        let mut buf = vec![0u8; 1 << 20];
        let outcome: Result<(), BlobError> = async {
            loop {
                let n = file.read(&mut buf).await.map_err(io)?;
                if n == 0 {
                    break;
                }
                verifier
                    .update(&buf[..n])
                    .map_err(|source| BlobError::Verify { digest: *d, source })?;
                w.wait_for_capacity(PARTS_IN_FLIGHT)
                    .await
                    .map_err(|e| self.error(&format!("upload a part of {d}"), e))?;
                w.write(&buf[..n]);
            }
            verifier
                .clone()
                .finish()
                .map_err(|source| BlobError::Verify { digest: *d, source })
        }
        .await;
        if let Err(e) = outcome {
            // Never completed: nothing appears under the key.
            let _ = w.abort().await;
            return Err(e);
        }
        w.finish()
            .await
            .map_err(|e| self.error(&format!("complete the upload of {d}"), e))?;
        Ok(())
    }
}

/// A multipart upload fed as a publish streams in.
struct S3Upload {
    store: S3Store,
    d: Digest,
    size: u64,
    w: WriteMultipart,
}

#[async_trait::async_trait]
impl crate::Upload for S3Upload {
    async fn write(&mut self, bytes: &[u8]) -> Result<(), BlobError> {
        self.w
            .wait_for_capacity(PARTS_IN_FLIGHT)
            .await
            .map_err(|e| self.store.error(&format!("upload a part of {}", self.d), e))?;
        self.w.write(bytes);
        Ok(())
    }

    async fn finish(self: Box<Self>) -> Result<(), BlobError> {
        let S3Upload { store, d, size, w } = *self;
        w.finish()
            .await
            .map_err(|e| store.error(&format!("complete the upload of {d}"), e))?;
        store.read_back(&d, size).await
    }

    async fn abort(self: Box<Self>) {
        let _ = self.w.abort().await;
    }
}

#[async_trait::async_trait]
impl BlobStore for S3Store {
    fn describe(&self) -> String {
        self.name.clone()
    }

    async fn check(&self) -> Result<(), BlobError> {
        match tokio::time::timeout(CHECK_TIMEOUT, self.check_inner()).await {
            Ok(r) => r,
            Err(_) => Err(BlobError::Unavailable {
                store: self.name.clone(),
                message: format!(
                    "no answer within {}s (check --s3-endpoint)",
                    CHECK_TIMEOUT.as_secs()
                ),
            }),
        }
    }

    async fn start_upload(&self, d: &Digest, size: u64) -> Result<Option<Box<dyn crate::Upload>>, BlobError> {
        // Small blobs go in one PUT from the file; a blob the bucket holds
        // is not sent again.
        if size <= PART as u64 || self.contains(d).await? {
            return Ok(None);
        }
        let upload = self
            .store
            .put_multipart(&self.key(d))
            .await
            .map_err(|e| self.error(&format!("start the upload of {d}"), e))?;
        Ok(Some(Box::new(S3Upload {
            store: self.clone(),
            d: *d,
            size,
            w: WriteMultipart::new_with_chunk_size(upload, PART),
        })))
    }

    async fn contains(&self, d: &Digest) -> Result<bool, BlobError> {
        match self.store.head(&self.key(d)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.error(&format!("look up {d}"), e)),
        }
    }

    async fn put(&self, d: &Digest, size: u64, from: &Path) -> Result<(), BlobError> {
        let key = self.key(d);
        if size <= PART as u64 {
            let bytes = tokio::fs::read(from).await.map_err(|e| BlobError::Io {
                path: from.to_path_buf(),
                source: e,
            })?;
            let mut verifier = Verifier::new(*d, size);
            verifier
                .update(&bytes)
                .and_then(|()| verifier.finish())
                .map_err(|source| BlobError::Verify { digest: *d, source })?;
            self.store
                .put(&key, PutPayload::from(bytes))
                .await
                .map_err(|e| self.error(&format!("upload {d}"), e))?;
        } else {
            self.put_multipart(d, size, from, &key).await?;
        }
        self.read_back(d, size).await
    }

    async fn fetch(&self, d: &Digest, into: &LocalBlobs) -> Result<bool, BlobError> {
        let got = match self.store.get(&self.key(d)).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(self.error(&format!("download {d}"), e)),
        };
        let mut w = into.writer(*d, got.meta.size).await?;
        let mut stream = got.into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.error(&format!("download {d}"), e))?;
            w.write(&chunk).await?;
        }
        w.finish().await?;
        Ok(true)
    }

    async fn delete(&self, d: &Digest) -> Result<(), BlobError> {
        match self.store.delete(&self.key(d)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error(&format!("delete {d}"), e)),
        }
    }

    async fn list(&self) -> Result<Vec<StoredBlob>, BlobError> {
        let mut out = Vec::new();
        let mut stream = self.store.list(Some(&self.dir()));
        while let Some(meta) = stream.next().await {
            let meta = meta.map_err(|e| self.error("list blobs", e))?;
            if let Some(digest) = meta.location.filename().and_then(|n| Digest::from_hex(n).ok()) {
                out.push(StoredBlob {
                    digest,
                    size: meta.size,
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("s3://lks-blobs").unwrap(),
            ("lks-blobs".into(), "".into())
        );
        assert_eq!(
            parse_url("s3://lks-blobs/region-a/blobs/").unwrap(),
            ("lks-blobs".into(), "region-a/blobs".into())
        );
        for bad in [
            "lks-blobs",
            "s3://",
            "s3://ab",
            "s3://Upper",
            "s3://b_x/p",
            "s3://bkt/a/../b",
            "s3://-bkt",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn credentials_file_default_profile_and_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("creds");
        std::fs::write(
            &p,
            "[other]\naws_access_key_id = X\n[default]\naws_access_key_id = AKID\naws_secret_access_key = s3cr3t\n",
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = credentials(Some(&p)).unwrap_err().to_string();
        assert!(e.contains("0600"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            credentials(Some(&p)).unwrap(),
            ("AKID".into(), "s3cr3t".into(), None)
        );
        std::fs::write(&p, "[default]\naws_access_key_id = AKID\n").unwrap();
        assert!(credentials(Some(&p)).is_err());
    }

    #[test]
    fn debug_hides_the_secret() {
        let cfg = S3Config {
            bucket: "b".into(),
            prefix: String::new(),
            endpoint: None,
            region: "us-east-1".into(),
            virtual_hosted: false,
            access_key_id: "AKID".into(),
            secret_access_key: "very-secret".into(),
            session_token: Some("tok-secret".into()),
            ca_cert_pem: None,
        };
        let s = format!("{cfg:?}");
        assert!(!s.contains("very-secret"));
        assert!(!s.contains("tok-secret"));
    }
}
