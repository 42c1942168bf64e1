//! Where blob bytes come from: the control server (`FetchBlob` over the
//! node's mTLS channel) or, for files with a `url`, a mirror over HTTP(S).
//! Both sit behind [`BlobSource`] so the engine can be tested with a fake.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::stream::BoxStream;
use lks_proto::{FileSpec, pb};
use tonic::transport::Channel;

/// A stream of bytes from `offset` on.
pub struct BlobStream {
    /// Where the stream really starts: the requested offset, or 0 if the
    /// source cannot resume.
    pub offset: u64,
    pub chunks: BoxStream<'static, Result<Vec<u8>, SourceError>>,
}

/// The source could not deliver (now). Always worth retrying later; a bad
/// byte is caught by the verifier, not here.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SourceError(pub String);

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub trait BlobSource: Send + Sync {
    fn open<'a>(&'a self, file: &'a FileSpec, offset: u64) -> BoxFuture<'a, Result<BlobStream, SourceError>>;

    /// Peer sharing, while the node's cluster has it on.
    fn swarm(&self) -> Option<&crate::link::swarm::Swarm> {
        None
    }
}

/// Where a file's bytes come from, for messages.
pub fn origin(file: &FileSpec) -> String {
    match &file.url {
        Some(u) => u.clone(),
        None => "the control server".into(),
    }
}

/// The channel of the current server connection, shared with blob fetches.
#[derive(Clone, Default)]
pub struct SharedChannel(Arc<Mutex<Option<Channel>>>);

impl SharedChannel {
    pub fn set(&self, ch: Option<Channel>) {
        if let Ok(mut g) = self.0.lock() {
            *g = ch;
        }
    }

    pub fn get(&self) -> Option<Channel> {
        self.0.lock().ok().and_then(|g| g.clone())
    }
}

/// The real source: mirror URLs with reqwest, everything else from the server.
#[derive(Clone)]
pub struct NetSource {
    http: reqwest::Client,
    server: SharedChannel,
    swarm: Option<Arc<crate::link::swarm::Swarm>>,
}

impl NetSource {
    pub fn new(server: SharedChannel) -> Result<Self, SourceError> {
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(20))
            .read_timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| SourceError(format!("build HTTP client: {}", error_chain(&e))))?;
        Ok(NetSource {
            http,
            server,
            swarm: None,
        })
    }

    /// Fetches through peers while peer sharing is on.
    pub fn with_swarm(mut self, swarm: Arc<crate::link::swarm::Swarm>) -> Self {
        self.swarm = Some(swarm);
        self
    }

    async fn open_url(&self, url: &str, offset: u64) -> Result<BlobStream, SourceError> {
        let mut req = self.http.get(url);
        if offset > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={offset}-"));
        }
        let resp = req
            .send()
            .await
            .map_err(|e| SourceError(format!("GET {url}: {}", error_chain(&e))))?;
        let status = resp.status();
        let start = if status == reqwest::StatusCode::PARTIAL_CONTENT {
            offset
        } else if status.is_success() {
            0
        } else {
            return Err(SourceError(format!("GET {url}: HTTP {status}")));
        };
        let url = url.to_string();
        let chunks = resp
            .bytes_stream()
            .map(move |r| {
                r.map(|b| b.to_vec())
                    .map_err(|e| SourceError(format!("GET {url}: {}", error_chain(&e))))
            })
            .boxed();
        Ok(BlobStream {
            offset: start,
            chunks,
        })
    }

    async fn open_server(&self, file: &FileSpec, offset: u64) -> Result<BlobStream, SourceError> {
        let channel = self
            .server
            .get()
            .ok_or_else(|| SourceError("not connected to the control server".into()))?;
        let mut client = pb::agent_service_client::AgentServiceClient::new(channel);
        let digest = file.digest.to_string();
        let resp = client
            .fetch_blob(pb::FetchBlobRequest {
                length: 0,
                digest: digest.clone(),
                offset,
            })
            .await
            .map_err(|s| SourceError(format!("FetchBlob {digest}: {}", s.message())))?;
        let size = file.size;
        let chunks = resp
            .into_inner()
            .map(move |r| match r {
                Ok(c) if c.total_size != 0 && c.total_size != size => Err(SourceError(format!(
                    "FetchBlob {digest}: server announces {} bytes, the manifest {size}",
                    c.total_size
                ))),
                Ok(c) => Ok(c.data),
                Err(s) => Err(SourceError(format!("FetchBlob {digest}: {}", s.message()))),
            })
            .boxed();
        Ok(BlobStream { offset, chunks })
    }
}

impl BlobSource for NetSource {
    fn open<'a>(&'a self, file: &'a FileSpec, offset: u64) -> BoxFuture<'a, Result<BlobStream, SourceError>> {
        Box::pin(async move {
            match &file.url {
                Some(url) => self.open_url(url, offset).await,
                None => self.open_server(file, offset).await,
            }
        })
    }

    fn swarm(&self) -> Option<&crate::link::swarm::Swarm> {
        self.swarm.as_deref().filter(|s| s.is_on())
    }
}

/// An error with its sources, on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}
