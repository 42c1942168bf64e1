//! The peer ledger the replicas' trackers share (`lks-tracker`'s
//! `ledger`): `swarm/fetching/CLUSTER/HEX/ID`, the nodes fetching a blob
//! through replica ID (under its lease), and `swarm/seed/CLUSTER/HEX`, the
//! one node of a cluster that may fetch the blob from the server now (a
//! claim taken on a compare of its revision, under the lease of the
//! replica that took it). When to read, write and claim is the tracker's.

use std::collections::BTreeMap;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use lks_proto::Digest;
use serde::{Deserialize, Serialize};

use lks_store::{Result, StoreError};

use crate::{EtcdStore, kv_of};

/// The nodes fetching one blob through one replica: node → fetches from
/// the server.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct FetchersDoc {
    nodes: BTreeMap<String, bool>,
}

/// Who may fetch one blob from the server now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SeedDoc {
    node: String,
    until_ms: i64,
}

fn fetching_prefix(cluster: &str, digest: &Digest) -> String {
    format!("swarm/fetching/{cluster}/{}/", digest.hex())
}

fn seed_key(cluster: &str, digest: &Digest) -> String {
    format!("swarm/seed/{cluster}/{}", digest.hex())
}

/// The peer ledger, over the store's connection.
pub struct Swarm<'a> {
    store: &'a EtcdStore,
}

impl EtcdStore {
    /// The peer ledger (`swarm/`).
    pub fn swarm(&self) -> Swarm<'_> {
        Swarm { store: self }
    }
}

impl Swarm<'_> {
    /// Under this replica's lease once it has one: gone with the replica.
    fn lease_opts(&self) -> Option<PutOptions> {
        let lease = self.store.lease_id();
        (lease != 0).then(|| PutOptions::new().with_lease(lease))
    }

    /// The nodes fetching `digest` of `cluster` through the other replicas
    /// (node, from the server), in the order of the replicas' ids.
    pub async fn others_fetching(&self, cluster: &str, digest: &Digest) -> Result<Vec<(String, bool)>> {
        let docs: Vec<(String, FetchersDoc)> =
            self.store.range_docs(&fetching_prefix(cluster, digest)).await?;
        Ok(docs
            .into_iter()
            .filter(|(replica, _)| replica != self.store.replica())
            .flat_map(|(_, doc)| doc.nodes)
            .collect())
    }

    /// Writes this replica's fetchers of `digest` (node → from the server)
    /// under its lease; removes its document when there are none.
    pub async fn publish_fetching(
        &self,
        cluster: &str,
        digest: &Digest,
        nodes: &BTreeMap<String, bool>,
    ) -> Result<()> {
        let key = self.store.key(&format!(
            "{}{}",
            fetching_prefix(cluster, digest),
            self.store.replica()
        ));
        let mut kv = kv_of(&self.store.client);
        if nodes.is_empty() {
            kv.delete(key, None)
                .await
                .map_err(|e| StoreError::backend_at("delete a fetchers document", e))?;
        } else {
            let doc = serde_json::to_vec(&FetchersDoc { nodes: nodes.clone() })
                .map_err(|e| StoreError::backend_at("encode a fetchers document", e))?;
            kv.put(key, doc, self.lease_opts())
                .await
                .map_err(|e| StoreError::backend_at("write a fetchers document", e))?;
        }
        Ok(())
    }

    /// Whether `node` is (now) the seed of `digest` in `cluster`: it held
    /// the claim, or nobody holds a live one. A claim lasts `ttl_ms` from
    /// `now_ms` and is renewed once half spent; it is taken over (when
    /// absent or expired) only on a compare of its revision, so two
    /// replicas never both grant it.
    pub async fn claim_seed(
        &self,
        cluster: &str,
        digest: &Digest,
        node: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<bool> {
        let key = self.store.key(&seed_key(cluster, digest));
        let mine = serde_json::to_vec(&SeedDoc {
            node: node.to_string(),
            until_ms: now_ms + ttl_ms,
        })
        .map_err(|e| StoreError::backend_at("encode a seed claim", e))?;
        let mut kv = kv_of(&self.store.client);
        for _ in 0..3 {
            let resp = kv
                .get(key.clone(), Some(GetOptions::new()))
                .await
                .map_err(|e| StoreError::backend_at("read a seed claim", e))?;
            let compare = match resp.kvs().first() {
                None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                Some(item) => {
                    let held: Option<SeedDoc> = serde_json::from_slice(item.value()).ok();
                    match held {
                        Some(h) if h.node == node && h.until_ms - now_ms > ttl_ms / 2 => {
                            return Ok(true);
                        }
                        Some(h) if h.node != node && h.until_ms > now_ms => return Ok(false),
                        _ => Compare::mod_revision(key.clone(), CompareOp::Equal, item.mod_revision()),
                    }
                }
            };
            let txn = Txn::new().when([compare]).and_then([TxnOp::put(
                key.clone(),
                mine.clone(),
                self.lease_opts(),
            )]);
            let done = kv
                .txn(txn)
                .await
                .map_err(|e| StoreError::backend_at("write a seed claim", e))?;
            if done.succeeded() {
                return Ok(true);
            }
        }
        // Other replicas kept changing it: someone else holds it.
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestEtcd;

    #[tokio::test]
    async fn fetchers_and_seed_claims_under_the_swarm_keys() {
        let etcd = TestEtcd::start_with(|| lks_e2e::free_addr().port());
        let (a, b) = (etcd.store("ra").await, etcd.store("rb").await);
        let d = Digest::of(b"blob");
        let nodes: BTreeMap<String, bool> = [("n1".to_string(), true)].into();
        a.swarm().publish_fetching("c", &d, &nodes).await.unwrap();
        assert_eq!(
            b.swarm().others_fetching("c", &d).await.unwrap(),
            vec![("n1".to_string(), true)]
        );
        assert!(a.swarm().others_fetching("c", &d).await.unwrap().is_empty());
        let key = format!("swarm/fetching/c/{}/ra", d.hex());
        let (raw, _) = a.get_bytes(&key).await.unwrap().unwrap();
        assert_eq!(raw, br#"{"nodes":{"n1":true}}"#);
        a.swarm()
            .publish_fetching("c", &d, &BTreeMap::new())
            .await
            .unwrap();
        assert!(a.get_bytes(&key).await.unwrap().is_none());

        assert!(a.swarm().claim_seed("c", &d, "n1", 1_000, 10_000).await.unwrap());
        assert!(!b.swarm().claim_seed("c", &d, "n2", 2_000, 10_000).await.unwrap());
        assert!(a.swarm().claim_seed("c", &d, "n1", 2_000, 10_000).await.unwrap());
        // Expired: another node takes it over.
        assert!(b.swarm().claim_seed("c", &d, "n2", 20_000, 10_000).await.unwrap());
        let (raw, _) = a
            .get_bytes(&format!("swarm/seed/c/{}", d.hex()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(raw, br#"{"node":"n2","until_ms":30000}"#);
    }
}
