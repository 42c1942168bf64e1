//! Writing a [`Dump`] into an empty prefix, for `lks-control-server
//! migrate`: the same documents, keys and indexes the store writes itself
//! (`active/` for active rollouts, `drive/` for rollouts to drive, the
//! generation counter), every key created with a `create_revision == 0`
//! compare, at most [`MAX_IMPORT_OPS`] keys per transaction.

use etcd_client::{Compare, CompareOp, GetOptions, TxnOp};

use lks_store::{Dump, EventRow, Result, StoreError};

use crate::docs::{BundleDoc, ClusterDoc, DesiredDoc, NodeDoc, TargetDoc, actual_doc};
use crate::events::EventDoc;
use crate::rolloutdocs;
use crate::rolloutdocs::{RolloutDoc, RolloutNodeDoc};
use crate::smallmap::SmallMap;
use crate::tokens::TokenDoc;
use crate::{EtcdStore, clusters, json, nonce, unavailable};

/// Keys written per transaction (etcd allows 128 by default).
const MAX_IMPORT_OPS: usize = 100;
/// Bytes of documents per transaction, below etcd's 1.5 MiB request limit.
const MAX_IMPORT_BYTES: usize = 1 << 20;
/// Events per event document; ids are derived from the document's revision
/// times 1000 plus the index, so a document holds fewer than 1000.
const EVENTS_PER_DOC: usize = 500;

impl EtcdStore {
    /// The first key under the prefix, if any: an import goes only into an
    /// empty prefix.
    pub async fn first_key(&self) -> Result<Option<String>> {
        let mut kv = crate::kv_of(&self.client);
        let resp = kv
            .get(
                self.prefix.clone(),
                Some(GetOptions::new().with_prefix().with_keys_only().with_limit(1)),
            )
            .await
            .map_err(unavailable)?;
        Ok(resp
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned()))
    }

    /// Deletes every key under the prefix: undoes an import that failed
    /// half-way, into a prefix that was empty before it.
    pub async fn remove_import(&self) -> Result<()> {
        let mut kv = crate::kv_of(&self.client);
        kv.delete(
            self.prefix.clone(),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    /// Writes everything in `d` as new documents. Refused with `Conflict`
    /// if any of the keys exists (nothing of two installations is merged);
    /// the transactions before that one stay written.
    pub async fn import(&self, d: &Dump) -> Result<()> {
        self.create_batched(documents(d)?).await?;
        self.import_events(&d.events).await?;
        self.import_audit(&d.audit).await?;
        self.import_releases(&d.releases, &d.roots).await?;
        Ok(())
    }

    /// Creates `docs` in order, as many per transaction as the limits allow.
    async fn create_batched(&self, docs: Vec<(String, Vec<u8>)>) -> Result<()> {
        let mut batch: Vec<(String, Vec<u8>)> = Vec::new();
        let mut bytes = 0;
        for (rest, value) in docs {
            if batch.len() == MAX_IMPORT_OPS || (!batch.is_empty() && bytes + value.len() > MAX_IMPORT_BYTES)
            {
                self.create_all(std::mem::take(&mut batch)).await?;
                bytes = 0;
            }
            bytes += value.len();
            batch.push((rest, value));
        }
        if !batch.is_empty() {
            self.create_all(batch).await?;
        }
        Ok(())
    }

    /// The events, one document per transaction: ids come from its
    /// revision, so the events keep their order.
    async fn import_events(&self, events: &[EventRow]) -> Result<()> {
        for chunk in events.chunks(EVENTS_PER_DOC) {
            let at = chunk.iter().map(|e| e.at_ms).max().unwrap_or_default().max(0);
            let docs: Vec<EventDoc> = chunk.iter().map(EventDoc::from_row).collect();
            self.create_all(vec![(
                format!("{}{at:016}-{}", super::events::EVENTS, nonce()),
                json(&docs)?,
            )])
            .await?;
        }
        Ok(())
    }

    /// Creates every key in one transaction, or none if any exists (also
    /// `lks-control-server restore --store etcd`).
    pub(crate) async fn create_all(&self, docs: Vec<(String, Vec<u8>)>) -> Result<()> {
        let mut compares = Vec::with_capacity(docs.len());
        let mut ops = Vec::with_capacity(docs.len());
        for (rest, value) in &docs {
            let key = self.key(rest);
            compares.push(Compare::create_revision(key.clone(), CompareOp::Equal, 0));
            ops.push(TxnOp::put(key, value.clone(), None));
        }
        if self.txn(compares, ops).await? {
            return Ok(());
        }
        for (rest, _) in &docs {
            if self.get_bytes(rest).await?.is_some() {
                return Err(StoreError::Conflict(format!(
                    "{} already exists in etcd; something else writes under {}",
                    self.key(rest),
                    self.prefix
                )));
            }
        }
        Err(StoreError::Conflict(format!(
            "keys under {} changed while they were written",
            self.prefix
        )))
    }
}

/// Every document of `d` but the events, audit and releases, in the order
/// they are created: the generation counter, clusters, bundles, nodes,
/// rollouts, plans.
fn documents(d: &Dump) -> Result<Vec<(String, Vec<u8>)>> {
    let mut docs: Vec<(String, Vec<u8>)> = Vec::new();
    docs.push((
        "meta/generation".into(),
        d.max_generation().to_string().into_bytes(),
    ));
    cluster_docs(d, &mut docs)?;
    bundle_docs(d, &mut docs)?;
    node_docs(d, &mut docs)?;
    rollout_docs(d, &mut docs)?;
    for p in &d.plans {
        docs.push((format!("plans/{}", p.name), json(p)?));
    }
    Ok(docs)
}

/// Clusters, their Kubernetes access, certificates and join tokens.
fn cluster_docs(d: &Dump, docs: &mut Vec<(String, Vec<u8>)>) -> Result<()> {
    for c in &d.clusters {
        let ca = d.cluster_cas.iter().find(|(n, _)| *n == c.name).map(|(_, ca)| ca);
        docs.push((
            format!("clusters/{}", c.name),
            json(&ClusterDoc {
                created_at_ms: c.created_at_ms,
                maintenance_windows: c.maintenance_windows.clone(),
                ca_cert_pem: ca.map(|a| a.cert_pem.clone()),
                ca_key: ca.map(|a| a.key.clone()),
                api_server: c.api_server.clone(),
                peer: c.peer,
                labels: c.labels.clone(),
                reboots: (c.reboots != Default::default()).then_some(c.reboots.clone()),
            })?,
        ));
    }
    for (name, k) in &d.cluster_kube {
        docs.push((
            format!("clusterkube/{name}"),
            json(&clusters::KubeDoc::from_kube(k))?,
        ));
    }
    for r in &d.certificates {
        docs.push((clusters::cert_key(r), json(&clusters::CertDoc::from_row(r))?));
    }
    for t in &d.tokens {
        docs.push((format!("tokens/{}", t.id), json(&TokenDoc::from_row(t))?));
    }
    Ok(())
}

/// Bundle versions.
fn bundle_docs(d: &Dump, docs: &mut Vec<(String, Vec<u8>)>) -> Result<()> {
    for b in &d.bundles {
        let r = &b.row;
        docs.push((
            format!("bundles/{}/{}", r.name, r.version),
            json(&BundleDoc {
                signed_bundle: hex::encode(r.bundle.encoded()),
                manifest_digest: r.manifest_digest.to_string(),
                signed: r.signed,
                files: r.files,
                total_size: r.total_size,
                published_at_ms: r.published_at_ms,
                blob_digests: b.blob_digests.iter().map(ToString::to_string).collect(),
            })?,
        ));
    }
    Ok(())
}

/// Nodes and their desired states.
fn node_docs(d: &Dump, docs: &mut Vec<(String, Vec<u8>)>) -> Result<()> {
    for n in &d.nodes {
        docs.push((
            format!("nodes/{}", n.name),
            json(&NodeDoc {
                cluster: n.cluster.as_str().into(),
                labels: n.labels.clone(),
                cert_serial: n.cert_serial.as_str().into(),
                facts_json: n.facts_json.as_str().into(),
                last_seen_ms: n.last_seen_ms,
                enrolled_at_ms: n.enrolled_at_ms,
                replica: String::new(),
                actual: n.actual.iter().map(|(b, a)| (b.clone(), actual_doc(a))).collect(),
                hold: n.hold.as_deref().map(Box::from),
                key_hash: n.key_hash.as_str().into(),
                trust: n.trust.clone().map(Box::new),
                reboot: n.reboot.clone().map(Box::new),
            })?,
        ));
        docs.push((
            format!("desired/{}", n.name),
            json(&DesiredDoc {
                generation: n.generation,
                bundles: n.desired.clone().into(),
                // A pending retry request is not moved: the operator
                // can ask again.
                retry: SmallMap::new(),
                // Moved, so request ids keep growing for the node.
                reboot: n.reboot_request,
            })?,
        ));
    }
    Ok(())
}

/// Targets and rollouts, with the `active/` and `drive/` indexes.
fn rollout_docs(d: &Dump, docs: &mut Vec<(String, Vec<u8>)>) -> Result<()> {
    for t in &d.targets {
        docs.push((
            format!("targets/{}/{}", t.cluster, t.bundle),
            json(&TargetDoc {
                version: t.target.version.clone(),
                selector: t.target.selector.clone(),
                rollout_id: t.target.rollout_id.clone(),
            })?,
        ));
    }
    for r in &d.rollouts {
        if r.state.is_active() {
            docs.push((
                format!("active/{}/{}", r.cluster, r.bundle),
                r.id.as_bytes().to_vec(),
            ));
        }
        if r.needs_driving() {
            docs.push((format!("drive/{}", r.id), Vec::new()));
        }
        for n in &r.nodes {
            docs.push((
                rolloutdocs::row_key(&r.id, &n.name),
                json(&RolloutNodeDoc::from_row(n))?,
            ));
        }
        docs.push((rolloutdocs::header_key(&r.id), json(&RolloutDoc::header(r))?));
    }
    Ok(())
}
