//! Starting a rollout on etcd: which nodes it takes (from the watch-fed
//! copy when it is fresh, else from etcd) and the one transaction that
//! records it.

use etcd_client::{Compare, CompareOp, GetOptions, TxnOp};

use lks_store::{
    BundleStore, ClusterStore, EventRow, NewRollout, Result, RolloutNodeRow, RolloutRow, StartChecks, Target,
};

use crate::docs::{DesiredDoc, NodeDoc, TargetDoc};
use crate::rolloutdocs;
use crate::rolloutdocs::{RolloutDoc, RolloutNodeDoc};
use crate::{Doc, EtcdStore, MAX_ATTEMPTS, busy, corrupt, json, kv_of, reads, rollouts, unavailable};
use std::collections::HashMap;

impl EtcdStore {
    /// [`Store::start_rollout`] on etcd: the rollout, its drive key and its
    /// active marker in one transaction that also proves no node of the
    /// region was created since its members were read.
    pub(super) async fn start_rollout_in_etcd(&self, r: NewRollout) -> Result<RolloutRow> {
        for attempt in 0..MAX_ATTEMPTS {
            let akey = self.key(&format!("active/{}/{}", r.cluster, r.bundle));
            let active = match self.get_raw(&akey).await? {
                Some((other, _)) => {
                    let other = String::from_utf8_lossy(&other).into_owned();
                    let state = self
                        .get::<RolloutDoc>(&self.key(&format!("rollouts/{other}")))
                        .await?
                        .value
                        .map_or_else(|| "running".to_string(), |d| d.state);
                    Some((other, state))
                }
                None => None,
            };
            r.may_start(&StartChecks {
                cluster_exists: self.cluster_exists(&r.cluster).await?,
                bundle_published: self.get_bundle(&r.bundle, &r.version).await?.is_some(),
                active,
            })?;
            // Node membership is compared as a range of creations: a node
            // enrolled meanwhile makes the start read again (or the
            // enrolment adds it, since the active marker is written here).
            // The members come from the watch-fed copy when it is fresh,
            // at the copy's revision; a start that lost its race reads etcd.
            let nprefix = self.key("nodes/");
            let from_copy = if attempt == 0 {
                self.with_cache(|c, _| (c.rev, members_of(&r, c.nodes(), |n| c.desired(n))))
                    .await
            } else {
                None
            };
            let (read_rev, nodes) = match from_copy {
                Some(x) => x,
                None => self.members_from_etcd(&r).await?,
            };
            let tkey = self.key(&format!("targets/{}/{}", r.cluster, r.bundle));
            let target: Doc<TargetDoc> = self.get(&tkey).await?;
            let row = r.start(
                nodes,
                target.value.clone().map(|t| Target {
                    version: t.version,
                    selector: t.selector,
                    rollout_id: t.rollout_id,
                }),
            );
            let batch_size = row.batch_size;
            let rkey = self.key(&rolloutdocs::header_key(&r.id));
            // The rows: with the header when they fit in its transaction,
            // else before it (rows without a header are no rollout).
            let mut ops = Vec::new();
            let mut rows = Vec::with_capacity(row.nodes.len());
            for n in &row.nodes {
                rows.push(self.put(
                    &rolloutdocs::row_key(&r.id, &n.name),
                    json(&RolloutNodeDoc::from_row(n))?,
                ));
            }
            let pre_written = rows.len() > rollouts::ROWS_PER_TXN;
            if pre_written {
                let mut rows = rows.into_iter().peekable();
                while rows.peek().is_some() {
                    let chunk: Vec<TxnOp> = rows.by_ref().take(rollouts::ROWS_ALONE_PER_TXN).collect();
                    self.txn(Vec::new(), chunk).await?;
                }
            } else {
                ops.extend(rows);
            }
            ops.extend([
                TxnOp::put(akey.clone(), r.id.as_bytes().to_vec(), None),
                self.put(&format!("drive/{}", r.id), Vec::new()),
                TxnOp::put(rkey.clone(), json(&RolloutDoc::header(&row))?, None),
            ]);
            if let Some(op) = self.event_op(&[EventRow::rollout_started(&r, batch_size, row.nodes.len())])? {
                ops.push(op);
            }
            let compares = vec![
                Compare::create_revision(akey, CompareOp::Equal, 0),
                Compare::create_revision(rkey, CompareOp::Equal, 0),
                // No node created since the read (one enrolled meanwhile
                // would be in neither the rollout nor, without the active
                // marker, its own start). Only creations: every connect and
                // report rewrites node documents, and in a region of
                // thousands of agents a start that compared every change
                // lost its race 16 times over ("other replicas kept
                // changing the same records"; the scale-out benchmark,
                // 30,000 agents). Labels and cluster never change after
                // enrolment; a node deleted meanwhile is skipped at its turn.
                Compare::create_revision(nprefix, CompareOp::Less, read_rev + 1).with_prefix(),
                target.compare(&tkey),
                // Not deleted meanwhile (`bundle delete`).
                Compare::create_revision(
                    self.key(&format!("bundles/{}/{}", r.bundle, r.version)),
                    CompareOp::Greater,
                    0,
                ),
            ];
            if self.txn(compares, ops).await? {
                return Ok(row);
            }
            if pre_written {
                // The rows of a start that lost its race: the next try
                // writes its own.
                kv_of(&self.client)
                    .delete(
                        self.key(&rolloutdocs::rows_prefix(&r.id)),
                        Some(etcd_client::DeleteOptions::new().with_prefix()),
                    )
                    .await
                    .map_err(unavailable)?;
            }
        }
        Err(busy("start rollout"))
    }

    /// A new rollout's nodes read from etcd, and the revision read at.
    async fn members_from_etcd(&self, r: &NewRollout) -> Result<(i64, Vec<RolloutNodeRow>)> {
        let nprefix = self.key("nodes/");
        let mut kv = crate::kv_of(&self.client);
        let resp = kv
            .get(nprefix.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        self.note_read(reads::Read::Range, &nprefix, resp.kvs());
        let read_rev = resp.header().map_or(0, |h| h.revision());
        let desired: HashMap<String, DesiredDoc> = self
            .range::<DesiredDoc>(&self.key("desired/"))
            .await?
            .into_iter()
            .map(|(k, v, _)| (k, v))
            .collect();
        let mut docs = Vec::with_capacity(resp.kvs().len());
        for item in resp.kvs() {
            let key = String::from_utf8_lossy(item.key()).into_owned();
            let d: NodeDoc = serde_json::from_slice(item.value()).map_err(|e| corrupt(&key, e))?;
            docs.push((key[nprefix.len()..].to_string(), d));
        }
        Ok((
            read_rev,
            members_of(r, docs.iter().map(|(n, d)| (n.as_str(), d)), |n| desired.get(n)),
        ))
    }
}

/// The nodes a new rollout takes: of its cluster, matching its selector,
/// each with the version of the bundle it was meant to have.
fn members_of<'a>(
    r: &NewRollout,
    nodes: impl Iterator<Item = (&'a str, &'a NodeDoc)>,
    desired: impl Fn(&str) -> Option<&'a DesiredDoc>,
) -> Vec<RolloutNodeRow> {
    nodes
        .filter(|(_, d)| r.takes(&d.cluster, &d.labels))
        .map(|(name, _)| {
            let previous = desired(name)
                .and_then(|x| x.bundles.get(&r.bundle).map(String::from))
                .unwrap_or_default();
            RolloutNodeRow::waiting(name, &previous)
        })
        .collect()
}
