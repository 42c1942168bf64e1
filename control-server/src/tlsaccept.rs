//! TLS on the agent/admin port, done here rather than by tonic: every
//! accepted connection is handshaken in its own task, at most
//! `--max-tls-handshakes` at a time in arrival order ([`crate::admission`]),
//! and handed to the gRPC server through a bounded channel once it is done.
//!
//! tonic's own TLS starts a handshake for every accepted connection at
//! once: under thousands of reconnecting agents they all share the CPU and
//! all finish late, past the clients' connect timeout. Here the admitted
//! ones finish quickly and the rest wait their turn (or are closed, if
//! they waited longer than a client would).
//!
//! The TLS configuration is the one tonic built from the same material:
//! the serving chain and key, client certificates optional (`Enroll` has
//! none) but verified against the CA when sent, ALPN `h2`. Handlers see
//! the peer certificates as before: tonic reads them from the
//! [`TlsStream`]'s connect info.
//!
//! Each finished connection is handed on boxed ([`TlsConn`]), as tonic's
//! own TLS did: the connection task then holds a pointer rather than the
//! whole TLS state inline in its future, which the async state machine
//! may lay out more than once (BENCHMARKS.md, server memory per agent).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt as _};
use rustls::server::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};

use crate::admission::{Admitted, Handshakes};
use crate::metrics::Metrics;

/// The server side of TLS: `chain_pem` (serving certificate first), its
/// key, and the CA that client certificates must chain to. Enroll is the
/// one call without a client certificate; every other handler checks the
/// peer certificate itself.
pub fn server_config(
    chain_pem: &str,
    key_pem: &str,
    ca_pem: &str,
) -> Result<Arc<ServerConfig>, lks_proto::tls::TlsSetupError> {
    lks_proto::tls::server_config(chain_pem, key_pem, ca_pem, lks_proto::tls::ClientCerts::Optional)
}

/// Handshakes the connections `accepted` yields and yields the finished
/// ones, until `cancel` fires. A slow client never holds up accepting:
/// each connection gets its own task.
pub fn incoming(
    accepted: impl Stream<Item = std::io::Result<TcpStream>> + Send + 'static,
    config: Arc<ServerConfig>,
    handshakes: Handshakes,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) -> impl Stream<Item = std::io::Result<TlsConn>> + Send + 'static {
    // Room for every connection holding a slot: a finished handshake never
    // waits long to be handed on.
    let (tx, rx) = mpsc::channel(handshakes.in_progress_bound());
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        let mut accepted = std::pin::pin!(accepted);
        loop {
            let stream = tokio::select! {
                _ = cancel.cancelled() => return,
                s = accepted.next() => match s {
                    Some(Ok(s)) => s,
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "accept failed");
                        continue;
                    }
                    None => return,
                },
            };
            let accepted_at = Instant::now();
            let (tx, acceptor, handshakes, metrics, cancel) = (
                tx.clone(),
                acceptor.clone(),
                handshakes.clone(),
                metrics.clone(),
                cancel.clone(),
            );
            tokio::spawn(async move {
                let peer = stream.peer_addr().ok();
                let queued = |q: bool| metrics.tls_handshake_queued(q);
                let admitted = tokio::select! {
                    _ = cancel.cancelled() => return,
                    a = handshakes.admit(accepted_at, acceptor.accept(stream), queued) => a,
                };
                metrics.tls_handshake(admitted.label());
                match admitted {
                    Admitted::Done(tls, permit) => {
                        tokio::select! {
                            _ = cancel.cancelled() => {}
                            _ = tx.send(Ok(TlsConn(Box::new(tls)))) => {}
                        }
                        drop(permit);
                    }
                    Admitted::Shed => {
                        tracing::debug!(
                            ?peer,
                            "closed a connection that waited too long for its TLS handshake"
                        )
                    }
                    Admitted::TimedOut => tracing::debug!(?peer, "TLS handshake timed out"),
                    Admitted::Failed(e) => tracing::debug!(?peer, error = %e, "TLS handshake failed"),
                }
            });
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|s| (s, rx)) })
}

/// A finished server-side TLS connection, boxed. Reads, writes and the
/// connect info (peer address and certificates) are the inner stream's.
pub struct TlsConn(Box<TlsStream<TcpStream>>);

impl Connected for TlsConn {
    type ConnectInfo = TlsConnectInfo<TcpConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.connect_info()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}
