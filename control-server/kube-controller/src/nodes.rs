//! `LksNode` → the server's node (issue [kube-front], item 2): each
//! mirrored node's hold converges to its `spec.hold` (spec wins: a hold
//! set or lifted with lksctl is put back as the spec says), and its status
//! is the node as the last poll read it. The objects themselves are made
//! and deleted with the server's nodes by [`crate::poll`]; a mirror made
//! for a new node starts with the hold the server has, so nothing changes
//! when the controller first sees it.

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use lks_proto::pb;

use crate::context::{Ctx, Error};
use crate::crd::{Hold, LksNode};
use crate::mirror;
use crate::object::write_status;

/// What brings a node's hold to what its spec says.
#[derive(Debug, PartialEq, Eq)]
pub enum HoldChange {
    Hold(String),
    Release,
}

pub fn hold_change(n: &pb::Node, want: Option<&Hold>) -> Option<HoldChange> {
    match want {
        Some(h) if !n.held || n.hold_reason != h.reason => Some(HoldChange::Hold(h.reason.clone())),
        None if n.held => Some(HoldChange::Release),
        _ => None,
    }
}

/// Reconciles one `LksNode` (kube-rs' `Controller` calls it for each
/// object on its own when its spec changes, and for every one after each
/// poll of the server's nodes).
pub async fn reconcile(obj: Arc<LksNode>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let r = converge(&ctx, &obj).await;
    ctx.done(obj.as_ref(), r)
}

async fn converge(ctx: &Ctx, obj: &LksNode) -> Result<Action, Error> {
    // The next poll looks again; this is the fallback for a missed one.
    let again = Action::requeue(ctx.retry.max(ctx.interval));
    let name = obj.name_any();
    let key = format!("node/{name}");
    let read = ctx.nodes.get(ctx.interval).await?;
    // Not on the server (the poll deletes the object), or changed by this
    // copy since the read began: the next poll shows it as it is.
    let Some(n) = read.items.get(&name).filter(|_| ctx.current(&key, read.at)) else {
        return Ok(again);
    };
    if let Some(change) = hold_change(n, obj.spec.hold.as_ref()) {
        let node = n.name.clone();
        let answer = match &change {
            HoldChange::Hold(reason) => {
                let req = pb::HoldNodeRequest {
                    name: node.clone(),
                    reason: reason.clone(),
                };
                ctx.admin
                    .call(|mut a| async move { a.hold_node(req).await })
                    .await
            }
            HoldChange::Release => {
                let req = pb::UnholdNodeRequest { name: node.clone() };
                ctx.admin
                    .call(|mut a| async move { a.unhold_node(req).await })
                    .await
            }
        };
        answer.map_err(|e| {
            let verb = if change == HoldChange::Release {
                "release"
            } else {
                "hold"
            };
            Error::admin(format!("{verb} node {node}"), e)
        })?;
        ctx.acted(&key);
        tracing::info!(node = %node, ?change, "node hold converged to its LksNode spec");
    }
    let api: Api<LksNode> = Api::all(ctx.kube.clone());
    let old = obj.status.clone();
    let status = Some(mirror::node_status(n));
    write_status(&api, &name, &old, &status).await?;
    Ok(again)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hold_follows_the_spec() {
        let mut n = pb::Node::default();
        let hold = |r: &str| Hold { reason: r.into() };
        assert_eq!(hold_change(&n, None), None);
        assert_eq!(
            hold_change(&n, Some(&hold("disk"))),
            Some(HoldChange::Hold("disk".into()))
        );
        n.held = true;
        n.hold_reason = "disk".into();
        assert_eq!(hold_change(&n, Some(&hold("disk"))), None);
        assert_eq!(
            hold_change(&n, Some(&hold("other"))),
            Some(HoldChange::Hold("other".into())),
            "a new reason is sent"
        );
        assert_eq!(hold_change(&n, None), Some(HoldChange::Release));
    }
}
