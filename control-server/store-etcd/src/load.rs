//! The load board: `load/ID`, how many agents replica ID holds (its URL
//! and count, under its lease), which the server's `rebalance` reads to
//! spread agents over the replicas.

use serde::{Deserialize, Serialize};

use lks_store::Result;

use crate::{EtcdStore, json};

const LOAD: &str = "load/";

/// What one replica holds, as it publishes it (`load/ID`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Load {
    pub url: String,
    pub connected: usize,
}

/// The replicas' published loads, over the store's connection.
pub struct LoadBoard<'a> {
    store: &'a EtcdStore,
}

impl EtcdStore {
    /// The load board (`load/ID`).
    pub fn load_board(&self) -> LoadBoard<'_> {
        LoadBoard { store: self }
    }
}

impl LoadBoard<'_> {
    /// Publishes this replica's load under its lease, so it goes with the
    /// replica; false (nothing written) while the replica has no lease.
    pub async fn publish(&self, load: &Load) -> Result<bool> {
        self.store
            .put_leased(&format!("{LOAD}{}", self.store.replica()), json(load)?)
            .await
    }

    /// The loads the other replicas published.
    pub async fn others(&self) -> Result<Vec<Load>> {
        Ok(self
            .store
            .range_docs::<Load>(LOAD)
            .await?
            .into_iter()
            .filter(|(id, _)| id != self.store.replica())
            .map(|(_, l)| l)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestEtcd;

    #[tokio::test]
    async fn each_replica_reads_the_others_loads() {
        let etcd = TestEtcd::start_with(|| lks_e2e::free_addr().port());
        let (a, b) = (etcd.store("ra").await, etcd.store("rb").await);
        let la = Load {
            url: "https://a".into(),
            connected: 7,
        };
        assert!(a.load_board().publish(&la).await.unwrap());
        assert_eq!(b.load_board().others().await.unwrap(), vec![la.clone()]);
        assert!(a.load_board().others().await.unwrap().is_empty());
        // As the rebalancer wrote it before the board moved here.
        let (raw, _) = a.get_bytes("load/ra").await.unwrap().unwrap();
        assert_eq!(raw, br#"{"url":"https://a","connected":7}"#);

        // Without a lease nothing is written.
        a.set_lease(0);
        assert!(!a.load_board().publish(&la).await.unwrap());
    }
}
