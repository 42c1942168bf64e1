//! `PublishBundle` on the wire: the header decoded, then each chunk
//! message handed to the publish (`ops::publish`, which verifies, stores
//! and records) in stream order. A publish refused or broken off halfway
//! is aborted, so it leaves nothing behind.

use lks_proto::pb;
use lks_proto::pb::publish_bundle_request::Msg as PublishMsg;
use lks_proto::{Digest, SignedBundle};
use tonic::{Response, Status, Streaming};

use super::super::invalid;
use super::Deps;
use crate::ops::publish::{Begun, Publish};

/// `PublishBundle`: the header, the bytes, then the record.
pub(in crate::api) async fn publish(
    s: &Deps,
    mut inbound: Streaming<pb::PublishBundleRequest>,
) -> Result<Response<pb::PublishBundleResponse>, Status> {
    let signed = read_header(&mut inbound).await?;
    let (name, version) = (signed.manifest.name.clone(), signed.manifest.version.clone());
    let mut p = match Publish::begin(s.clone(), signed).await? {
        Begun::Published => {
            // Identical: read the rest so the client sees a clean close.
            while inbound.message().await?.is_some() {}
            return Ok(Response::new(pb::PublishBundleResponse {
                name,
                version,
                created: false,
            }));
        }
        Begun::Receiving(p) => p,
    };
    if let Err(st) = receive(&mut p, &mut inbound).await {
        p.abort().await;
        return Err(st);
    }
    let created = p.finish().await?;
    Ok(Response::new(pb::PublishBundleResponse {
        name,
        version,
        created,
    }))
}

/// The first message: the signed bundle.
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
    SignedBundle::try_from(header).map_err(|e| invalid(format!("invalid bundle manifest: {e}")))
}

/// Hands the chunks to the publish to the end of the stream.
async fn receive(p: &mut Publish, inbound: &mut Streaming<pb::PublishBundleRequest>) -> Result<(), Status> {
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
        p.chunk(d, &chunk.data).await?;
    }
    Ok(())
}
