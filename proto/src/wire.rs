//! What a gRPC server of lksadmin (the control server, an agent's peer
//! listener) answers to bytes that are not a valid request: the
//! transport limits, and `invalid_argument` for a malformed message.
//!
//! tonic reports a request it cannot decode — protobuf that does not parse,
//! a gRPC frame cut short, a bad compression flag — as `internal`, the code
//! for a fault of the server. Here it is the client's fault, and monitoring
//! that counts `internal` as a server bug must not page anyone for a rogue
//! client. Decoding happens inside tonic, before a handler runs, so the
//! answer is corrected in two places: [`MalformedRequestLayer`] rewrites
//! the status of an answer without a body (unary, server-streaming and
//! client-streaming calls: the handler never ran or returned the error),
//! and the one bidirectional stream (`Connect`) maps what it receives with
//! [`client_status`].
//!
//! Error messages often quote what the client sent (a name, a digest). A
//! status message travels as an HTTP/2 header, so a quoted megabyte would
//! make the answer itself too large for the client to read; every status
//! message is therefore cut at [`MAX_STATUS_MESSAGE`] bytes on the way out.

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http::{Request, Response};

/// Largest message the server decodes (tonic's default, stated here so a
/// dependency update cannot move it).
pub const MAX_MESSAGE: usize = 4 << 20;
/// Largest HTTP/2 header list a client may send (hyper's default, stated
/// for the same reason). gRPC metadata of a legitimate call is far below.
pub const MAX_HEADER_LIST: u32 = 16 << 10;

/// Longest status message sent to a client, in bytes.
pub const MAX_STATUS_MESSAGE: usize = 4096;

/// The response metadata key a server's warnings about an accepted request
/// travel in, one value each (as kube-apiserver's `Warning` header): the
/// control server sets it on a rollout start, lksctl prints each value.
pub const WARNING_METADATA: &str = "lks-warning";

/// The beginnings of the messages tonic gives a request it could not
/// decode (tonic 0.14: `codec/decode.rs`, and tonic-prost's codec).
const DECODE_ERRORS: &[&str] = &[
    "failed to decode Protobuf message",
    "Unexpected EOF decoding stream",
    "protocol error: received message with",
    "Error decompressing",
];

/// `status` as the client should see it: a request tonic could not decode
/// is `invalid_argument`; anything else is unchanged.
pub fn client_status(status: Status) -> Status {
    if status.code() == tonic::Code::Internal && DECODE_ERRORS.iter().any(|p| status.message().starts_with(p))
    {
        Status::invalid_argument(format!("malformed request: {}", status.message()))
    } else {
        status
    }
}

/// `status` with its message cut to [`MAX_STATUS_MESSAGE`] bytes.
pub fn bounded(status: Status) -> Status {
    let m = status.message();
    if m.len() <= MAX_STATUS_MESSAGE {
        return status;
    }
    let mut end = MAX_STATUS_MESSAGE;
    while !m.is_char_boundary(end) {
        end -= 1;
    }
    Status::new(
        status.code(),
        format!("{}… ({} more bytes cut)", &m[..end], m.len() - end),
    )
}

/// Rewrites a trailers-only answer that reports an undecodable request,
/// and cuts any status message to its bound.
#[derive(Clone, Copy, Default)]
pub struct MalformedRequestLayer;

impl<S> tower_layer::Layer<S> for MalformedRequestLayer {
    type Service = MalformedRequest<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MalformedRequest { inner }
    }
}

#[derive(Clone)]
pub struct MalformedRequest<S> {
    inner: S,
}

impl<S> tower_service::Service<Request<Body>> for MalformedRequest<S>
where
    S: tower_service::Service<Request<Body>, Response = Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut resp = fut.await?;
            rewrite(&mut resp);
            Ok(resp)
        })
    }
}

/// Corrects the status in the headers of a trailers-only answer.
fn rewrite(resp: &mut Response<Body>) {
    let Some(status) = Status::from_header_map(resp.headers()) else {
        return;
    };
    let (code, len) = (status.code(), status.message().len());
    let fixed = bounded(client_status(status));
    if fixed.code() != code || fixed.message().len() != len {
        // Replaces grpc-status and grpc-message; cannot fail for a message
        // that was a valid header value a moment ago.
        let _ = fixed.add_header(resp.headers_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_errors_become_invalid_argument_and_nothing_else_does() {
        for m in [
            "failed to decode Protobuf message: buffer underflow",
            "Unexpected EOF decoding stream.",
            "protocol error: received message with invalid compression flag: 2",
        ] {
            let s = client_status(Status::internal(m));
            assert_eq!(s.code(), tonic::Code::InvalidArgument, "{m}");
            assert!(s.message().ends_with(m), "{}", s.message());
        }
        let store = client_status(Status::internal("control server storage error: disk I/O error"));
        assert_eq!(
            store.code(),
            tonic::Code::Internal,
            "a server fault stays internal"
        );
        let other = client_status(Status::out_of_range("Error, decoded message length too large"));
        assert_eq!(other.code(), tonic::Code::OutOfRange);
    }

    #[test]
    fn long_messages_are_cut_on_a_char_boundary() {
        let short = bounded(Status::not_found("x"));
        assert_eq!(short.message(), "x");
        let long = bounded(Status::invalid_argument(format!(
            "digest \"{}\"",
            "é".repeat(1 << 20)
        )));
        assert_eq!(long.code(), tonic::Code::InvalidArgument);
        assert!(
            long.message().len() < MAX_STATUS_MESSAGE + 64,
            "{}",
            long.message().len()
        );
        assert!(long.message().ends_with("more bytes cut)"));
    }

    #[test]
    fn trailers_only_answers_are_rewritten() {
        let mut resp =
            Status::internal("failed to decode Protobuf message: invalid varint").into_http::<Body>();
        rewrite(&mut resp);
        let s = Status::from_header_map(resp.headers()).expect("status in the headers");
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert!(s.message().contains("invalid varint"), "{}", s.message());

        let mut resp = Status::internal("control server storage error: x").into_http::<Body>();
        rewrite(&mut resp);
        let s = Status::from_header_map(resp.headers()).unwrap();
        assert_eq!(s.code(), tonic::Code::Internal);

        let mut resp = Status::invalid_argument("n".repeat(1 << 20)).into_http::<Body>();
        rewrite(&mut resp);
        let s = Status::from_header_map(resp.headers()).unwrap();
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert!(s.message().len() < MAX_STATUS_MESSAGE + 64);
    }
}
