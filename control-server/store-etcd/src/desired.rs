//! Desired states: what each node should hold, and the blobs it may fetch on etcd.

use lks_proto::Digest;

use async_trait::async_trait;

use lks_store::{DesiredState, DesiredStore, Kind, Result, StoreError};

use crate::EtcdStore;
use crate::docs::{ActualDoc, BundleDoc, DesiredDoc, NodeDoc};
use crate::rolloutdocs;
use crate::rolloutdocs::RolloutDoc;

#[async_trait]
impl DesiredStore for EtcdStore {
    async fn desired_state(&self, node: &str) -> Result<DesiredState> {
        let Some(d) = self
            .get::<DesiredDoc>(&self.key(&format!("desired/{node}")))
            .await?
            .value
        else {
            return Err(StoreError::not_found(Kind::Node, node.to_string()));
        };
        self.desired_from(node, d).await
    }

    async fn desired_state_after(&self, node: &str, sent: Option<u64>) -> Result<DesiredState> {
        // A push after a change the watch delivered: the copy already holds
        // the document that changed, newer than what the stream sent, so
        // etcd is not asked for it again (one read per node and rollout on
        // every replica). At a Hello, `sent` is below what the agent has:
        // a copy that holds at least that serves a reconnecting fleet
        // without a read each. Nothing newer in the copy (a new node, or
        // this replica's own write not seen by its watch yet): etcd.
        if let Some(sent) = sent
            && let Some(d) = self.cached_desired(node)
            && d.generation > sent
        {
            return self.desired_from(node, d).await;
        }
        self.desired_state(node).await
    }

    async fn blob_grants(&self, node: &str, digest: &Digest) -> Result<Vec<(String, String)>> {
        // Compared with the documents' digests as stored, as text.
        let digest = digest.to_string();
        let digest = digest.as_str();
        let mut grants = Vec::new();
        let Some(n) = self
            .get::<NodeDoc>(&self.key(&format!("nodes/{node}")))
            .await?
            .value
        else {
            return Ok(grants);
        };
        let desired = self
            .get::<DesiredDoc>(&self.key(&format!("desired/{node}")))
            .await?
            .value
            .unwrap_or_default();
        let holds = |b: &str, v: &str| {
            let key = self.key(&format!("bundles/{b}/{v}"));
            async move {
                Ok::<bool, StoreError>(
                    self.get::<BundleDoc>(&key)
                        .await?
                        .value
                        .is_some_and(|d| d.blob_digests.iter().any(|x| x == digest)),
                )
            }
        };
        for (b, v) in &desired.bundles {
            if holds(b, v).await? {
                grants.push((b.to_string(), v.to_string()));
            }
        }
        // A reported bundle counts only if a rollout of the node's cluster
        // assigned that version to it (as its target or the version it
        // replaced): a node cannot read another tenant's blobs by claiming
        // to hold their bundle.
        let reported: Vec<(&str, &ActualDoc)> = n
            .actual
            .iter()
            .filter(|(b, a)| desired.bundles.get(b) != Some(&a.version))
            .collect();
        if reported.is_empty() {
            return Ok(grants);
        }
        let rollouts = self.range::<RolloutDoc>(&self.key("rollouts/")).await?;
        for (b, a) in reported {
            let mut assigned = false;
            for (id, r, _) in &rollouts {
                if r.cluster != n.cluster || r.bundle != b {
                    continue;
                }
                if self.row_of(id, r, node).await?.is_some_and(|rn| {
                    (rn.flags & rolloutdocs::TOUCHED != 0 && r.version == a.version)
                        || rn.previous_version == a.version
                }) {
                    assigned = true;
                    break;
                }
            }
            if assigned && holds(b, &a.version).await? {
                grants.push((b.to_string(), a.version.to_string()));
            }
        }
        Ok(grants)
    }
}
