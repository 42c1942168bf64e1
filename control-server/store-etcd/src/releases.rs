//! Releases and trust roots on etcd: `releases/CLUSTER/VERSION` and
//! `roots/CLUSTER/VERSION` (versions as 20 digits, so key order is
//! version order), and `relhead/CLUSTER`, the highest release's version
//! and digest. A release put compares the head's revision and writes head
//! and record together; a root put compares that its version is absent
//! and the one before it present. So two replicas never both store one
//! version, and no version is skipped.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, TxnOp};
use serde::{Deserialize, Serialize};

use lks_store::{Kind, Result, StoreError};

use crate::{EtcdStore, MAX_ATTEMPTS, backoff, busy, corrupt, json, kv_of, reads, unavailable};
use lks_store::{
    ReleaseRow, ReleaseStore, RootRow, Stored, StoredRelease, StoredRoot, highest_root, release_digest,
    release_order, root_order,
};

#[derive(Serialize, Deserialize)]
struct ReleaseDoc {
    /// The encoded `SignedRelease`, hex.
    signed_release: String,
    digest: String,
    published_at_ms: i64,
}

#[derive(Serialize, Deserialize)]
struct HeadDoc {
    version: u64,
    digest: String,
}

#[derive(Serialize, Deserialize)]
struct RootDoc {
    /// The encoded `SignedRoot`, hex.
    signed_root: String,
    published_at_ms: i64,
}

fn release_key(cluster: &str, version: u64) -> String {
    format!("releases/{cluster}/{version:020}")
}

fn root_key(cluster: &str, version: u64) -> String {
    format!("roots/{cluster}/{version:020}")
}

/// The version a record key ends in.
fn key_version(kind: Kind, cluster: &str, rest: &str) -> Result<u64> {
    rest.parse().map_err(|_| StoreError::Corrupt {
        kind,
        name: format!("{rest} of {cluster}"),
        why: lks_store::Unreadable::Record("the key does not end in a version".into()),
    })
}

fn unhex(kind: Kind, cluster: &str, version: u64, text: &str) -> Result<Vec<u8>> {
    hex::decode(text).map_err(|e| StoreError::Corrupt {
        kind,
        name: format!("{version} of {cluster}"),
        why: e.into(),
    })
}

impl EtcdStore {
    /// Releases and roots of a dump (migration from SQLite), as stored.
    pub(super) async fn import_releases(&self, releases: &[ReleaseRow], roots: &[RootRow]) -> Result<()> {
        for r in releases {
            self.put_release(r.release.clone(), r.published_at_ms).await?;
        }
        for r in roots {
            self.put_root(&r.cluster, r.root.clone(), r.published_at_ms)
                .await?;
        }
        Ok(())
    }
}

#[async_trait]
impl ReleaseStore for EtcdStore {
    async fn put_release(&self, r: StoredRelease, now_ms: i64) -> Result<Stored> {
        let cluster = r.cluster().to_string();
        let head_key = self.key(&format!("relhead/{cluster}"));
        let doc = ReleaseDoc {
            signed_release: hex::encode(r.encoded()),
            digest: r.digest().to_string(),
            published_at_ms: now_ms,
        };
        let head = HeadDoc {
            version: r.version(),
            digest: r.digest().to_string(),
        };
        let rec_key = self.key(&release_key(&cluster, r.version()));
        for attempt in 0..MAX_ATTEMPTS {
            let have = self.get::<HeadDoc>(&head_key).await?;
            let highest = match &have.value {
                Some(h) => Some((h.version, release_digest(&cluster, h.version, &h.digest)?)),
                None => None,
            };
            // Records are never changed once written: no compare needed.
            let same = match self.get::<ReleaseDoc>(&rec_key).await?.value {
                Some(d) => Some(release_digest(&cluster, r.version(), &d.digest)?),
                None => None,
            };
            if let Some(done) = release_order(&r, highest, same)? {
                return Ok(done);
            }
            let stored = self
                .txn(
                    vec![have.compare(&head_key)],
                    vec![
                        TxnOp::put(head_key.clone(), json(&head)?, None),
                        TxnOp::put(rec_key.clone(), json(&doc)?, None),
                    ],
                )
                .await?;
            if stored {
                return Ok(Stored::Created);
            }
            backoff(attempt).await;
        }
        Err(busy("publish release"))
    }

    async fn list_releases(&self, cluster: &str, limit: u32) -> Result<Vec<ReleaseRow>> {
        let prefix = self.key(&format!("releases/{cluster}/"));
        let mut opts = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Key, SortOrder::Descend);
        if limit > 0 {
            opts = opts.with_limit(i64::from(limit));
        }
        let resp = kv_of(&self.client)
            .get(prefix.clone(), Some(opts))
            .await
            .map_err(unavailable)?;
        self.note_read(reads::Read::Range, &prefix, resp.kvs());
        let mut out = Vec::with_capacity(resp.kvs().len());
        for item in resp.kvs() {
            let key = String::from_utf8_lossy(item.key()).into_owned();
            let version = key_version(Kind::Release, cluster, &key[prefix.len()..])?;
            let d: ReleaseDoc = serde_json::from_slice(item.value()).map_err(|e| corrupt(&key, e))?;
            let bytes = unhex(Kind::Release, cluster, version, &d.signed_release)?;
            out.push(ReleaseRow {
                cluster: cluster.to_string(),
                release: StoredRelease::decode(cluster, version, bytes)?,
                published_at_ms: d.published_at_ms,
            });
        }
        Ok(out)
    }

    async fn put_root(&self, cluster: &str, root: StoredRoot, now_ms: i64) -> Result<Stored> {
        let v = root.version();
        let key = self.key(&root_key(cluster, v));
        let doc = RootDoc {
            signed_root: hex::encode(root.encoded()),
            published_at_ms: now_ms,
        };
        for attempt in 0..MAX_ATTEMPTS {
            let have = self.list_roots(cluster).await?;
            let highest = highest_root(have.last().map(|r| r.root.version()));
            let same = have.iter().find(|r| r.root.version() == v).map(|r| &r.root);
            if let Some(done) = root_order(cluster, &root, highest, same)? {
                return Ok(done);
            }
            // v is highest + 1: absent, and the one before it (unless the
            // nodes' own 1) still present.
            let mut compares = vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)];
            if v > 2 {
                compares.push(Compare::create_revision(
                    self.key(&root_key(cluster, v - 1)),
                    CompareOp::Greater,
                    0,
                ));
            }
            if self
                .txn(compares, vec![TxnOp::put(key.clone(), json(&doc)?, None)])
                .await?
            {
                return Ok(Stored::Created);
            }
            backoff(attempt).await;
        }
        Err(busy("publish trust root"))
    }

    async fn list_roots(&self, cluster: &str) -> Result<Vec<RootRow>> {
        let prefix = self.key(&format!("roots/{cluster}/"));
        let mut out = Vec::new();
        // Key order is version order (20 digits).
        for (rest, d, _) in self.range::<RootDoc>(&prefix).await? {
            let version = key_version(Kind::Root, cluster, &rest)?;
            let bytes = unhex(Kind::Root, cluster, version, &d.signed_root)?;
            out.push(RootRow {
                cluster: cluster.to_string(),
                root: StoredRoot::decode(cluster, version, bytes)?,
                published_at_ms: d.published_at_ms,
            });
        }
        Ok(out)
    }
}
