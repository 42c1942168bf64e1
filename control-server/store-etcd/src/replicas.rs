//! The replica registry and the leader's record: `replicas/ID` (a
//! replica's [`ReplicaInfo`], bound to its lease) and `leader` (the id of
//! the replica that drives rollouts, bound to the winner's lease), and the
//! lease itself ([`ReplicaLease`]). The server's `replicas` module decides
//! when to take, renew and give up a lease and when to campaign; what is
//! written where, under which lease and on which compare is here.

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, LeaseClient, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp,
};

use lks_store::{Result, StoreError};

use crate::docs::ReplicaInfo;
use crate::{EtcdStore, json, unavailable};

/// Where replica ID registers (its own key), and the prefix of all.
const REPLICAS: &str = "replicas/";
/// The election record.
const LEADER: &str = "leader";
/// How long a renewal waits for etcd's acknowledgement.
const RENEW_ACK: Duration = Duration::from_secs(3);

/// The replica registry and the election, over the store's connection.
pub struct Replicas<'a> {
    store: &'a EtcdStore,
}

/// An etcd lease this replica holds, and once [`ReplicaLease::keep_alive`]
/// started it, the stream that keeps it alive.
pub struct ReplicaLease {
    id: i64,
    client: LeaseClient,
    keeper: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
}

impl EtcdStore {
    /// The replica registry (`replicas/ID`) and the election (`leader`).
    pub fn replicas(&self) -> Replicas<'_> {
        Replicas { store: self }
    }
}

impl Replicas<'_> {
    /// A new lease of `ttl_s` seconds (not yet kept alive).
    pub async fn grant(&self, ttl_s: i64) -> Result<ReplicaLease> {
        let mut client = self.store.client.lease_client();
        let id = client.grant(ttl_s, None).await.map_err(unavailable)?.id();
        Ok(ReplicaLease {
            id,
            client,
            keeper: None,
        })
    }

    /// Registers this replica (`replicas/ID`, `info`) under `lease`, and
    /// makes it the lease this replica's other leased keys go under.
    pub async fn register(&self, lease: &ReplicaLease, info: &ReplicaInfo) -> Result<()> {
        let key = self.store.key(&format!("{REPLICAS}{}", self.store.replica()));
        let mut kv = crate::kv_of(&self.store.client);
        kv.put(key, json(info)?, Some(PutOptions::new().with_lease(lease.id)))
            .await
            .map_err(unavailable)?;
        self.store.set_lease(lease.id);
        Ok(())
    }

    /// Every registered replica, by id; an entry that does not read fails
    /// the whole list.
    pub async fn list(&self) -> Result<Vec<(String, ReplicaInfo)>> {
        self.store.range_docs::<ReplicaInfo>(REPLICAS).await
    }

    /// The URLs of the live replicas: `own` first, then the others' sorted
    /// and without repeats. An entry that does not read is left out. Not
    /// counted in [`crate::reads`].
    pub async fn urls(&self, own: &str) -> Result<Vec<String>> {
        let mut kv = crate::kv_of(&self.store.client);
        let resp = kv
            .get(self.store.key(REPLICAS), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| StoreError::Unavailable(format!("etcd: {e}")))?;
        let mut urls = vec![own.to_string()];
        let mut others: Vec<String> = resp
            .kvs()
            .iter()
            .filter_map(|kv| serde_json::from_slice::<ReplicaInfo>(kv.value()).ok())
            .map(|r| r.url)
            .filter(|u| u != own)
            .collect();
        others.sort();
        others.dedup();
        urls.extend(others);
        Ok(urls)
    }

    /// Becomes leader if nobody is: `leader` is created, bound to `lease`,
    /// only while it does not exist. True if this replica leads now (the
    /// record names it, under this very lease).
    pub async fn campaign(&self, lease: &ReplicaLease) -> Result<bool> {
        let key = self.store.key(LEADER);
        let me = self.store.replica().as_bytes().to_vec();
        let mut kv = crate::kv_of(&self.store.client);
        let resp = kv
            .txn(
                Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key.clone(),
                        me.clone(),
                        Some(PutOptions::new().with_lease(lease.id)),
                    )])
                    .or_else([TxnOp::get(key.clone(), None)]),
            )
            .await
            .map_err(unavailable)?;
        if resp.succeeded() {
            return Ok(true);
        }
        for r in resp.op_responses() {
            if let etcd_client::TxnOpResponse::Get(g) = r
                && let Some(kv) = g.kvs().first()
            {
                return Ok(kv.value() == me.as_slice() && kv.lease() == lease.id);
            }
        }
        Ok(false)
    }
}

impl ReplicaLease {
    /// etcd's id of the lease.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Starts keeping the lease alive (the stream [`Self::renew`] uses).
    pub async fn keep_alive(&mut self) -> Result<()> {
        let (keeper, acks) = self.client.keep_alive(self.id).await.map_err(unavailable)?;
        self.keeper = Some((keeper, acks));
        Ok(())
    }

    /// Renews the lease; false if etcd did not within `RENEW_ACK` (the
    /// lease is lost), or it was never kept alive.
    pub async fn renew(&mut self) -> bool {
        let Some((keeper, acks)) = self.keeper.as_mut() else {
            return false;
        };
        match keeper.keep_alive().await {
            Ok(()) => matches!(
                tokio::time::timeout(RENEW_ACK, acks.message()).await,
                Ok(Ok(Some(r))) if r.ttl() > 0
            ),
            Err(_) => false,
        }
    }

    /// Gives the lease up: every key under it (the registration, the
    /// leader's record, the leased documents) goes at once.
    pub async fn revoke(&mut self) -> Result<()> {
        self.client.revoke(self.id).await.map_err(unavailable)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestEtcd;

    fn info(url: &str) -> ReplicaInfo {
        ReplicaInfo {
            url: url.into(),
            started_at_ms: 1,
            blob_store: "etcd".into(),
            release: "0.1.0".into(),
            store_format: 1,
        }
    }

    #[tokio::test]
    async fn registration_election_and_revocation_follow_the_lease() {
        let etcd = TestEtcd::start_with(|| lks_e2e::free_addr().port());
        let (a, b) = (etcd.store("ra").await, etcd.store("rb").await);
        let mut la = a.replicas().grant(10).await.unwrap();
        la.keep_alive().await.unwrap();
        a.replicas().register(&la, &info("https://a")).await.unwrap();
        assert_eq!(a.lease_id(), la.id());
        let mut lb = b.replicas().grant(10).await.unwrap();
        b.replicas().register(&lb, &info("https://b")).await.unwrap();

        // The same key and document as before the registry moved here.
        let (raw, _) = a.get_bytes("replicas/ra").await.unwrap().unwrap();
        assert_eq!(
            serde_json::from_slice::<ReplicaInfo>(&raw).unwrap(),
            info("https://a")
        );
        assert_eq!(
            a.replicas().urls("https://b").await.unwrap(),
            vec!["https://b".to_string(), "https://a".to_string()]
        );
        let ids: Vec<String> = a
            .replicas()
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(ids, ["ra", "rb"]);

        assert!(a.replicas().campaign(&la).await.unwrap());
        assert!(
            a.replicas().campaign(&la).await.unwrap(),
            "the leader stays leader"
        );
        assert!(!b.replicas().campaign(&lb).await.unwrap());
        assert_eq!(a.get_bytes("leader").await.unwrap().unwrap().0, b"ra");
        assert!(la.renew().await);

        // The leader gives up its lease: its record goes, the other wins.
        la.revoke().await.unwrap();
        assert!(a.get_bytes("leader").await.unwrap().is_none());
        assert!(a.get_bytes("replicas/ra").await.unwrap().is_none());
        assert!(b.replicas().campaign(&lb).await.unwrap());
        assert!(!la.renew().await, "a revoked lease does not renew");
        assert!(!lb.renew().await, "a lease never kept alive does not renew");
        lb.revoke().await.unwrap();
    }
}
