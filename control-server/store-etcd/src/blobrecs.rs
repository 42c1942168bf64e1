//! [`BlobRecords`] on etcd: `blobrecs/sha256:HEX` holds a blob's record;
//! every decision is a transaction on revisions. A `deleting` mark is
//! written under this replica's lease, so it vanishes with a replica that
//! dies halfway through a deletion and publishes do not wait on it forever.

use std::collections::HashSet;

use lks_proto::Digest;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp};
use serde::de::DeserializeOwned;

use lks_store::{Kind, Result, RolloutStore, StoreError};

use crate::docs::{BundleDoc, DesiredDoc, TargetDoc};
use crate::{Doc, EtcdStore, MAX_ATTEMPTS, busy, corrupt, json, unavailable};
use lks_store::blobrecs::{BlobRecord, BlobRecords, BundleUsers, RecordAt};

fn rec_key(d: &Digest) -> String {
    format!("blobrecs/{d}")
}

impl EtcdStore {
    /// Every document under `rest` (a prefix below the store's own), by key
    /// suffix.
    pub(crate) async fn range_docs<T: DeserializeOwned>(&self, rest: &str) -> Result<Vec<(String, T)>> {
        Ok(self
            .range::<T>(&self.key(rest))
            .await?
            .into_iter()
            .map(|(k, v, _)| (k, v))
            .collect())
    }

    /// This replica's lease (0: none yet).
    pub(crate) fn lease_id(&self) -> i64 {
        // One slot written: whole after a panic, kept rather than read as
        // "no lease".
        *lks_proto::sync::lock(&self.lease)
    }

    /// Puts `value` at `rest` under this replica's lease, so it vanishes
    /// with the replica; false (nothing written) while it has no lease.
    pub(crate) async fn put_leased(&self, rest: &str, value: Vec<u8>) -> Result<bool> {
        let lease = self.lease_id();
        if lease == 0 {
            return Ok(false);
        }
        let mut kv = crate::kv_of(&self.client);
        kv.put(self.key(rest), value, Some(PutOptions::new().with_lease(lease)))
            .await
            .map_err(unavailable)?;
        Ok(true)
    }

    /// Reads a whole prefix with the revision it was read at.
    async fn range_at<T: DeserializeOwned>(&self, prefix: &str) -> Result<(Vec<(String, T)>, i64)> {
        let mut kv = crate::kv_of(&self.client);
        let resp = kv
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let mut out = Vec::with_capacity(resp.kvs().len());
        for item in resp.kvs() {
            let key = String::from_utf8_lossy(item.key()).into_owned();
            let v = serde_json::from_slice(item.value()).map_err(|e| corrupt(&key, e))?;
            out.push((key[prefix.len()..].to_string(), v));
        }
        Ok((out, rev))
    }

    /// One transaction; the revision it wrote at if its compares held.
    async fn txn_rev(&self, compares: Vec<Compare>, ops: Vec<TxnOp>) -> Result<Option<i64>> {
        let mut kv = crate::kv_of(&self.client);
        let resp = kv
            .txn(Txn::new().when(compares).and_then(ops))
            .await
            .map_err(unavailable)?;
        Ok(resp
            .succeeded()
            .then(|| resp.header().map_or(0, |h| h.revision())))
    }
}

#[async_trait]
impl BlobRecords for EtcdStore {
    async fn blob_record(&self, d: &Digest) -> Result<Option<RecordAt>> {
        let doc: Doc<BlobRecord> = self.get(&self.key(&rec_key(d))).await?;
        Ok(doc.value.map(|record| RecordAt {
            digest: *d,
            record,
            rev: doc.rev,
        }))
    }

    async fn put_blob_record(&self, d: &Digest, record: &BlobRecord, rev: i64) -> Result<Option<i64>> {
        let key = self.key(&rec_key(d));
        let doc = Doc::<BlobRecord> { value: None, rev };
        self.txn_rev(
            vec![doc.compare(&key)],
            vec![TxnOp::put(key, json(record)?, None)],
        )
        .await
    }

    async fn delete_blob_record(&self, d: &Digest, rev: i64) -> Result<bool> {
        let key = self.key(&rec_key(d));
        Ok(self
            .txn_rev(
                vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)],
                vec![TxnOp::delete(key, None)],
            )
            .await?
            .is_some())
    }

    async fn blob_records(&self) -> Result<Vec<RecordAt>> {
        let mut out = Vec::new();
        for (rest, record, rev) in self.range::<BlobRecord>(&self.key("blobrecs/")).await? {
            let digest = rest
                .parse()
                .map_err(|e| corrupt(&format!("blobrecs/{rest}"), e))?;
            out.push(RecordAt { digest, record, rev });
        }
        Ok(out)
    }

    async fn referenced_blobs(&self) -> Result<(HashSet<Digest>, i64)> {
        let (docs, rev) = self.range_at::<BundleDoc>(&self.key("bundles/")).await?;
        let mut set = HashSet::new();
        let versions: HashSet<String> = docs.iter().map(|(key, _)| key.clone()).collect();
        for (key, doc) in docs {
            for d in doc.blob_digests {
                set.insert(d.parse().map_err(|e| corrupt(&format!("bundles/{key}"), e))?);
            }
        }
        // A patch is referenced while its bundle version is. One made after
        // `rev` was claimed before its upload (lks_blobs::gc), so the
        // collector's grace keeps it until its row is read.
        for r in self.all_deltas().await? {
            if let Some(p) = r.patch
                && versions.contains(&format!("{}/{}", r.name, r.version))
            {
                set.insert(p);
            }
        }
        Ok((set, rev))
    }

    async fn mark_blob_deleting(
        &self,
        d: &Digest,
        mark: &BlobRecord,
        rev: i64,
        bundles_rev: i64,
    ) -> Result<Option<i64>> {
        let key = self.key(&rec_key(d));
        let mut mark = mark.clone();
        mark.deleting = true;
        let lease = self.lease_id();
        let opts = (lease != 0).then(|| PutOptions::new().with_lease(lease));
        let at = Doc::<BlobRecord> { value: None, rev };
        self.txn_rev(
            vec![
                at.compare(&key),
                // No bundle version recorded since the collector read them.
                Compare::mod_revision(self.key("bundles/"), CompareOp::Less, bundles_rev + 1).with_prefix(),
                // Nor a delta, whose row references its patch.
                Compare::mod_revision(self.key("deltas/"), CompareOp::Less, bundles_rev + 1).with_prefix(),
            ],
            vec![TxnOp::put(key, json(&mark)?, opts)],
        )
        .await
    }

    async fn delete_bundle(&self, name: &str, version: &str) -> Result<()> {
        let id = format!("{name}@{version}");
        let bkey = self.key(&format!("bundles/{name}/{version}"));
        for _ in 0..MAX_ATTEMPTS {
            let bundle: Doc<BundleDoc> = self.get(&bkey).await?;
            if bundle.value.is_none() {
                return Err(StoreError::not_found(Kind::Bundle, id.to_string()));
            }
            // Everything below is compared against the first read's revision.
            let (desired, read_rev) = self.range_at::<DesiredDoc>(&self.key("desired/")).await?;
            let (targets, _) = self.range_at::<TargetDoc>(&self.key("targets/")).await?;
            let rollouts = self.rollouts_to_drive().await?;
            let users = BundleUsers {
                nodes: desired
                    .into_iter()
                    .filter(|(_, d)| d.bundles.get(name).is_some_and(|v| v == version))
                    .map(|(node, _)| node)
                    .collect(),
                clusters: targets
                    .into_iter()
                    .filter_map(|(k, t)| {
                        let (cluster, bundle) = k.split_once('/')?;
                        (bundle == name && t.version == version).then(|| cluster.to_string())
                    })
                    .collect(),
                rollouts: rollouts
                    .into_iter()
                    .filter(|r| r.bundle == name && r.may_assign(version))
                    .map(|r| r.id)
                    .collect(),
            };
            if !users.is_empty() {
                return Err(StoreError::Conflict(users.refusal(&id)));
            }
            let unchanged =
                |p: &str| Compare::mod_revision(self.key(p), CompareOp::Less, read_rev + 1).with_prefix();
            let compares = vec![
                bundle.compare(&bkey),
                unchanged("desired/"),
                unchanged("targets/"),
                unchanged("rollouts/"),
                unchanged("drive/"),
            ];
            if self
                .txn(
                    compares,
                    vec![
                        TxnOp::delete(bkey.clone(), None),
                        TxnOp::delete(
                            self.key(&super::deltas::version_prefix(name, version)),
                            Some(DeleteOptions::new().with_prefix()),
                        ),
                    ],
                )
                .await?
            {
                return Ok(());
            }
        }
        Err(busy("delete bundle"))
    }
}
