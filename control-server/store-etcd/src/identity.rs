//! The control plane's identity document (`identity`: CA and admin
//! credential, keys sealed if asked). Its format and sealing are the
//! server's (`replicas`); where it is stored, and that it is created only
//! once, is here.

use lks_store::Result;

use crate::EtcdStore;

const IDENTITY: &str = "identity";

/// The identity document, over the store's connection.
pub struct Identity<'a> {
    store: &'a EtcdStore,
}

impl EtcdStore {
    /// The identity document (`identity`).
    pub fn identity(&self) -> Identity<'_> {
        Identity { store: self }
    }
}

impl Identity<'_> {
    /// The full key, as messages name it (`/lksadmin/v1/identity`).
    pub fn key(&self) -> String {
        self.store.key(IDENTITY)
    }

    /// What sealed parts of the document are bound to: the full key and
    /// `#which`, so a sealed key moved to another prefix or field does not
    /// open.
    pub fn aad(&self, which: &str) -> Vec<u8> {
        self.store.key(&format!("{IDENTITY}#{which}")).into_bytes()
    }

    /// The stored document and its revision, if any.
    pub async fn get(&self) -> Result<Option<(Vec<u8>, i64)>> {
        self.store.get_bytes(IDENTITY).await
    }

    /// Stores `doc` if no identity is stored; returns what is stored
    /// afterwards (`doc`, or the one another replica stored first).
    pub async fn create(&self, doc: Vec<u8>) -> Result<Vec<u8>> {
        self.store.create_once(IDENTITY, doc).await
    }

    /// Replaces the document if it still has revision `rev`.
    pub async fn replace(&self, rev: i64, doc: Vec<u8>) -> Result<bool> {
        self.store.replace(IDENTITY, rev, doc).await
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::TestEtcd;

    #[tokio::test]
    async fn the_identity_is_created_once_and_replaced_on_its_revision() {
        let etcd = TestEtcd::start_with(|| lks_e2e::free_addr().port());
        let s = etcd.store("r1").await;
        let id = s.identity();
        assert_eq!(id.key(), "/test/identity");
        assert_eq!(id.aad("ca_key"), b"/test/identity#ca_key");
        assert!(id.get().await.unwrap().is_none());
        assert_eq!(id.create(b"one".to_vec()).await.unwrap(), b"one");
        assert_eq!(
            id.create(b"two".to_vec()).await.unwrap(),
            b"one",
            "the first one stays"
        );
        let (doc, rev) = id.get().await.unwrap().unwrap();
        assert_eq!(doc, b"one");
        assert!(id.replace(rev, b"three".to_vec()).await.unwrap());
        assert!(
            !id.replace(rev, b"four".to_vec()).await.unwrap(),
            "stale revision"
        );
        assert_eq!(s.get_bytes("identity").await.unwrap().unwrap().0, b"three");
    }
}
