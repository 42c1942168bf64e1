//! The signed bundles a replica sends in desired states, kept in memory.
//!
//! Every agent's desired state carries the signed bundles it names, read
//! from their `bundles/NAME/VERSION` documents (a 20-file bundle is about
//! 8 KiB there, hex-encoded). In a rollout every agent asks once, so a
//! rollout to 10,000 nodes read the same few documents 10,000 times. A
//! bundle document never changes while it exists (publishing the same
//! version again writes nothing; a different one is refused), but it can be
//! deleted and a different bundle published under the same version, so a
//! copy here is used only while etcd says the document is the one copied:
//! the read asks etcd for the key's revision alone (`keys_only`) and reads
//! the value only when that is not the revision copied.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use etcd_client::{GetOptions, Txn, TxnOp};

use super::{EtcdStore, corrupt, kv_of, read_answers, unavailable};
use crate::docs::BundleDoc;
use lks_store::Result;

/// Bytes of signed bundles kept; past it the copy starts afresh.
const MAX_BYTES: usize = 32 << 20;

/// Copies of signed bundles by document key, with the revision they were
/// read at.
#[derive(Default)]
pub(super) struct BundleDocs {
    docs: Mutex<Copies>,
}

#[derive(Default)]
struct Copies {
    by_key: HashMap<String, (i64, Arc<Vec<u8>>)>,
    bytes: usize,
}

impl BundleDocs {
    fn get(&self, key: &str) -> Option<(i64, Arc<Vec<u8>>)> {
        self.lock().by_key.get(key).cloned()
    }

    fn put(&self, key: &str, rev: i64, signed: Arc<Vec<u8>>) {
        let mut c = self.lock();
        if c.bytes + signed.len() > MAX_BYTES {
            c.by_key.clear();
            c.bytes = 0;
        }
        c.bytes += signed.len();
        if let Some((_, old)) = c.by_key.insert(key.to_string(), (rev, signed)) {
            c.bytes -= old.len();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Copies> {
        self.docs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl EtcdStore {
    /// The signed bundles of the documents `keys`, in order (`None`: no
    /// such document), in one round trip when all are copied here.
    pub(super) async fn signed_bundles(&self, keys: &[String]) -> Result<Vec<Option<Arc<Vec<u8>>>>> {
        let copies: Vec<Option<(i64, Arc<Vec<u8>>)>> = keys.iter().map(|k| self.bundle_docs.get(k)).collect();
        let mut out = vec![None; keys.len()];
        // What etcd has: the revision alone where a copy may do.
        let mut stale = Vec::new();
        for (chunk_at, chunk) in keys.chunks(128).enumerate() {
            let base = chunk_at * 128;
            let ops: Vec<TxnOp> = chunk
                .iter()
                .enumerate()
                .map(|(i, k)| {
                    let opts = copies[base + i]
                        .is_some()
                        .then(|| GetOptions::new().with_keys_only());
                    TxnOp::get(k.clone(), opts)
                })
                .collect();
            let resp = kv_of(&self.client)
                .txn(Txn::new().and_then(ops))
                .await
                .map_err(unavailable)?;
            for (i, g) in read_answers(resp, chunk.len())?.into_iter().enumerate() {
                let at = base + i;
                let Some(kv) = g.kvs().first() else { continue };
                match &copies[at] {
                    Some((rev, signed)) if *rev == kv.mod_revision() => out[at] = Some(signed.clone()),
                    // Deleted and published again since it was copied.
                    Some(_) => stale.push(at),
                    None => out[at] = Some(self.copy_bundle(&keys[at], kv.value(), kv.mod_revision())?),
                }
            }
        }
        for at in stale {
            let Some((value, rev)) = self.get_raw(&keys[at]).await? else {
                continue;
            };
            out[at] = Some(self.copy_bundle(&keys[at], &value, rev)?);
        }
        Ok(out)
    }

    fn copy_bundle(&self, key: &str, value: &[u8], rev: i64) -> Result<Arc<Vec<u8>>> {
        let doc: BundleDoc = serde_json::from_slice(value).map_err(|e| corrupt(key, e))?;
        let signed = Arc::new(hex::decode(&doc.signed_bundle).map_err(|e| corrupt(key, e))?);
        self.bundle_docs.put(key, rev, signed.clone());
        Ok(signed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::TestEtcd;
    use lks_store::BundleStore;
    use lks_store::blobrecs::BlobRecords;
    use lks_store::conformance::{bundle, encoded};

    #[test]
    fn the_copies_stay_within_their_bytes() {
        let d = BundleDocs::default();
        let big = Arc::new(vec![0u8; MAX_BYTES / 2 + 1]);
        d.put("a", 1, big.clone());
        d.put("a", 2, big.clone());
        assert_eq!(d.lock().bytes, big.len(), "a replaced copy is not counted twice");
        d.put("b", 1, big.clone());
        assert!(d.get("a").is_none(), "over the bound: started afresh");
        assert_eq!(d.get("b").unwrap().0, 1);
        assert_eq!(d.lock().bytes, big.len());
    }

    /// A copy is used while etcd holds the same document, and not once the
    /// version was deleted and published again with other content.
    #[tokio::test]
    async fn a_copy_is_used_only_while_it_is_the_stored_document() {
        let etcd = TestEtcd::start();
        let s = etcd.store("r1").await;
        s.put_bundle(bundle("k", "1", "d1")).await.unwrap();
        let keys = vec![s.key("bundles/k/1"), s.key("bundles/k/2")];
        let first = s.signed_bundles(&keys).await.unwrap();
        assert_eq!(first[0].as_deref(), Some(&encoded("k", "1", "d1")));
        assert!(first[1].is_none(), "no such version");
        assert!(s.bundle_docs.get(&keys[0]).is_some(), "copied");
        assert_eq!(s.signed_bundles(&keys).await.unwrap(), first);

        // Another replica deletes it and publishes other bytes as k@1.
        let other = etcd.store("r2").await;
        other.delete_bundle("k", "1").await.unwrap();
        assert!(s.signed_bundles(&keys).await.unwrap()[0].is_none(), "deleted");
        other.put_bundle(bundle("k", "1", "d2")).await.unwrap();
        assert_eq!(
            s.signed_bundles(&keys).await.unwrap()[0].as_deref(),
            Some(&encoded("k", "1", "d2"))
        );
    }
}
