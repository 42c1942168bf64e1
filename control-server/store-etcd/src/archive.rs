//! The prefix as keys, for `backup --store etcd` and `restore --store
//! etcd` (the server's `backup::etcd`, which owns the archive format):
//! which keys a backup takes, read at one revision, what each is for the
//! summary's counts, and how a restore writes them back.
//!
//! A backup takes every key under the prefix but
//! - keys under a lease (`replicas/ID`, `load/ID`, `leader`, the peer
//!   ledger's, a collector's `deleting` mark): they belong to live
//!   replicas and end with them;
//! - `blobs/` (blob bytes in etcd's chunks; the archive carries blobs as
//!   blob entries) and `deltas/` (patch records: derived data, made again
//!   by the restored replicas' maker).
//!
//! A restore writes `identity` first (the caller's claim on the prefix,
//! `identity()`), then every other key with a create-only compare,
//! at most `MAX_OPS` keys and `MAX_BYTES` per transaction; audit
//! records and event documents take their ids from the revision that
//! created them, so each goes alone, in key (time) order.

use etcd_client::GetOptions;

use lks_store::{DumpedBundle, Result};

use crate::bundles::dumped_bundle;
use crate::limits::prefix_end;
use crate::{EtcdStore, kv_of};

/// Keys per range read of the snapshot.
const PAGE: i64 = 256;
/// Keys written per restore transaction (etcd allows 128 by default).
const MAX_OPS: usize = 100;
/// Bytes of values per restore transaction, below etcd's 1.5 MiB limit.
const MAX_BYTES: usize = 1 << 20;
/// Families whose ids come from the revision that created each key: one
/// key per transaction.
const ONE_PER_TXN: &[&str] = &["audit/", "timeline/", "events/"];
/// Families not archived (see the module doc).
const NOT_ARCHIVED: &[&str] = &["blobs/", "deltas/"];
const IDENTITY: &str = "identity";
const GENERATION: &str = "meta/generation";

/// What an archived key is, for a backup's counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArchivedKey {
    /// `clusters/NAME`; `with_ca` if it holds the cluster's CA.
    Cluster {
        with_ca: bool,
    },
    Cert,
    Token,
    Node,
    Target,
    Rollout,
    Audit,
    Release,
    Root,
    /// An event document, with the events it holds.
    Events(usize),
    /// `meta/generation`: the generation floor.
    GenerationFloor(u64),
    /// A node's desired state, with its generation.
    Desired {
        generation: u64,
    },
    /// The control plane's identity document.
    Identity,
    /// A published bundle, as a dump reads it.
    Bundle(Box<DumpedBundle>),
    /// Anything else (indexes, liveness, the rows of rollouts, …).
    Other,
}

/// What stopped reading the prefix.
#[derive(Debug, thiserror::Error)]
pub enum ReadError<E> {
    /// etcd refused a read; `compacted`: etcd compacted the revision the
    /// backup reads at while it read.
    #[error(
        "read {prefix}: {message}{}",
        if *compacted {
            " (etcd compacted the revision the backup reads at while it read: run the backup again)"
        } else {
            ""
        }
    )]
    Etcd {
        prefix: String,
        message: String,
        compacted: bool,
    },
    /// The caller's `each` failed.
    #[error(transparent)]
    Each(E),
}

/// The prefix as keys, over the store's connection.
pub struct Archive<'a> {
    store: &'a EtcdStore,
}

impl EtcdStore {
    /// The prefix as keys, for backup and restore.
    pub fn archive(&self) -> Archive<'_> {
        Archive { store: self }
    }
}

/// The generation floor stored in `meta/generation` (0 if unreadable).
fn floor_of(value: &[u8]) -> u64 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// What the key `rest` (below the prefix) holding `value` is.
pub fn archived_key(rest: &str, value: &[u8]) -> Result<ArchivedKey> {
    let family = rest.split('/').next().unwrap_or("");
    let json = || serde_json::from_slice::<serde_json::Value>(value).unwrap_or_default();
    Ok(match family {
        "clusters" => ArchivedKey::Cluster {
            with_ca: json().get("ca_cert_pem").is_some_and(|v| !v.is_null()),
        },
        "certs" => ArchivedKey::Cert,
        "tokens" => ArchivedKey::Token,
        "nodes" => ArchivedKey::Node,
        "targets" => ArchivedKey::Target,
        "rollouts" => ArchivedKey::Rollout,
        "audit" => ArchivedKey::Audit,
        "releases" => ArchivedKey::Release,
        "roots" => ArchivedKey::Root,
        "timeline" | "events" => ArchivedKey::Events(json().as_array().map_or(0, Vec::len)),
        "meta" if rest == GENERATION => ArchivedKey::GenerationFloor(floor_of(value)),
        "desired" => ArchivedKey::Desired {
            generation: json()
                .get("generation")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0),
        },
        "identity" if rest == IDENTITY => ArchivedKey::Identity,
        "bundles" => ArchivedKey::Bundle(Box::new(dumped_bundle(rest, value)?)),
        _ => ArchivedKey::Other,
    })
}

/// The identity document among archived `pairs`, if any.
pub fn archived_identity(pairs: &[(String, Vec<u8>)]) -> Option<&[u8]> {
    pairs
        .iter()
        .find(|(k, _)| k == IDENTITY)
        .map(|(_, v)| v.as_slice())
}

/// `meta/generation` for the restored prefix. Replicas hand out
/// generations as that floor plus etcd's revision (`next_generation`), so
/// every generation in an archive read at `revision` is at most its floor
/// plus that revision. A new etcd starts at a lower revision: with this
/// floor every generation handed out after the restore is above every one
/// in the archive, as `migrate` sets it from a data dir (a node's own
/// desired state also never goes below its last one plus 1).
fn restored_floor(pairs: &[(String, Vec<u8>)], revision: i64) -> u64 {
    let old = pairs
        .iter()
        .find(|(k, _)| k == GENERATION)
        .map_or(0, |(_, v)| floor_of(v));
    old + revision.max(0) as u64 + 1
}

/// Sets `meta/generation` of archived `pairs` (read at `revision`) to the
/// floor a restore must write (`restored_floor`).
pub fn raise_generation_floor(pairs: &mut Vec<(String, Vec<u8>)>, revision: i64) {
    let floor = restored_floor(pairs, revision);
    pairs.retain(|(k, _)| k != GENERATION);
    pairs.push((GENERATION.into(), floor.to_string().into_bytes()));
}

impl Archive<'_> {
    /// Reads every archived key under the prefix at one revision — the
    /// first read's — in pages, calling `each` with the key below the
    /// prefix and its value, in key order; returns the revision.
    pub async fn read<E>(
        &self,
        mut each: impl FnMut(&str, &[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<i64, ReadError<E>> {
        let prefix = self.store.prefix().as_bytes().to_vec();
        let etcd = |e: etcd_client::Error| ReadError::Etcd {
            prefix: self.store.prefix().to_string(),
            compacted: e.to_string().contains("compacted"),
            message: e.to_string(),
        };
        let mut kv = kv_of(&self.store.client);
        let first = kv
            .get(prefix.clone(), Some(GetOptions::new().with_limit(1)))
            .await
            .map_err(etcd)?;
        let revision = first.header().map_or(0, |h| h.revision());
        // Two ranges around `blobs/`, whose chunks are never read here.
        let blobs = [&prefix[..], b"blobs/"].concat();
        let ranges = [
            (prefix.clone(), blobs.clone()),
            (prefix_end(&blobs), prefix_end(&prefix)),
        ];
        for (from, end) in ranges {
            let mut start = from;
            loop {
                let resp = kv
                    .get(
                        start.clone(),
                        Some(
                            GetOptions::new()
                                .with_range(end.clone())
                                .with_revision(revision)
                                .with_limit(PAGE),
                        ),
                    )
                    .await
                    .map_err(etcd)?;
                for item in resp.kvs() {
                    let rest = String::from_utf8_lossy(&item.key()[prefix.len()..]).into_owned();
                    if item.lease() != 0 || NOT_ARCHIVED.iter().any(|p| rest.starts_with(p)) {
                        continue;
                    }
                    each(&rest, item.value()).map_err(ReadError::Each)?;
                }
                match resp.kvs().last() {
                    Some(last) if resp.more() => start = [last.key(), &[0][..]].concat(),
                    _ => break,
                }
            }
        }
        Ok(revision)
    }

    /// Writes every archived key of `pairs` but the identity (written
    /// first, by the claim on the prefix), in transactions of at most
    /// `MAX_OPS` keys and `MAX_BYTES`, a key of `ONE_PER_TXN` alone
    /// in its own; refused (`Conflict`) if any exists.
    pub async fn restore(&self, pairs: &[(String, Vec<u8>)]) -> Result<()> {
        let mut batch: Vec<(String, Vec<u8>)> = Vec::new();
        let mut bytes = 0;
        for pair in pairs.iter().filter(|(k, _)| k != IDENTITY) {
            let alone = ONE_PER_TXN.iter().any(|p| pair.0.starts_with(p));
            if !batch.is_empty() && (alone || batch.len() == MAX_OPS || bytes + pair.1.len() > MAX_BYTES) {
                self.store.create_all(std::mem::take(&mut batch)).await?;
                bytes = 0;
            }
            bytes += pair.1.len();
            batch.push(pair.clone());
            if alone {
                self.store.create_all(std::mem::take(&mut batch)).await?;
                bytes = 0;
            }
        }
        if !batch.is_empty() {
            self.store.create_all(batch).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestEtcd;

    #[test]
    fn the_restored_floor_is_above_every_archived_generation() {
        let mut pairs = vec![
            ("meta/generation".to_string(), b"5000".to_vec()),
            ("nodes/n".to_string(), b"{}".to_vec()),
        ];
        assert_eq!(
            restored_floor(&pairs, 70),
            5071,
            "above every generation read at revision 70"
        );
        assert_eq!(restored_floor(&[], 70), 71);
        raise_generation_floor(&mut pairs, 70);
        assert_eq!(
            pairs,
            vec![
                ("nodes/n".to_string(), b"{}".to_vec()),
                ("meta/generation".to_string(), b"5071".to_vec()),
            ]
        );
    }

    #[test]
    fn keys_are_counted_by_family() {
        let k = |rest: &str, v: &str| archived_key(rest, v.as_bytes()).unwrap();
        assert_eq!(
            k("clusters/a", r#"{"ca_cert_pem":"x"}"#),
            ArchivedKey::Cluster { with_ca: true }
        );
        assert_eq!(
            k("clusters/a", r#"{"ca_cert_pem":null}"#),
            ArchivedKey::Cluster { with_ca: false }
        );
        assert_eq!(k("timeline/1-x", "[{},{}]"), ArchivedKey::Events(2));
        assert_eq!(k("meta/generation", " 12\n"), ArchivedKey::GenerationFloor(12));
        assert_eq!(
            k("desired/n", r#"{"generation":9}"#),
            ArchivedKey::Desired { generation: 9 }
        );
        assert_eq!(k("identity", "{}"), ArchivedKey::Identity);
        assert_eq!(k("identity#x", "{}"), ArchivedKey::Other);
        assert_eq!(k("drive/r1", ""), ArchivedKey::Other);
        assert!(
            archived_key("bundles/k", b"{}").is_err(),
            "not a bundles/NAME/VERSION key"
        );
    }

    #[tokio::test]
    async fn a_backup_reads_what_a_restore_writes_back() {
        let etcd = TestEtcd::start_with(|| lks_e2e::free_addr().port());
        let s = etcd.store("r1").await;
        s.identity().create(b"{}".to_vec()).await.unwrap();
        s.put_bytes("nodes/n1", b"{}".to_vec()).await.unwrap();
        s.put_bytes("audit/0001-a", b"{}".to_vec()).await.unwrap();
        s.put_bytes("blobs/sha256:00/meta", b"{}".to_vec()).await.unwrap();
        s.put_bytes("deltas/v/f", b"{}".to_vec()).await.unwrap();
        s.put_bytes("zz", b"last".to_vec()).await.unwrap();
        // `replicas/r1`, written under its lease by `TestEtcd::store`, is skipped.
        let mut read = Vec::new();
        let rev = s
            .archive()
            .read(|rest, v| {
                read.push((rest.to_string(), v.to_vec()));
                Ok::<_, std::convert::Infallible>(())
            })
            .await
            .unwrap();
        assert!(rev > 0);
        let keys: Vec<&str> = read.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["audit/0001-a", "identity", "nodes/n1", "zz"]);
        assert_eq!(archived_identity(&read), Some(&b"{}"[..]));

        let cfg = crate::EtcdConfig {
            endpoints: vec![etcd.url().to_string()],
            prefix: "/restored".into(),
            ..Default::default()
        };
        let t = EtcdStore::connect(&cfg, "restore").await.unwrap();
        t.archive().restore(&read).await.unwrap();
        assert!(
            t.identity().get().await.unwrap().is_none(),
            "the identity is the claim's"
        );
        assert_eq!(t.get_bytes("zz").await.unwrap().unwrap().0, b"last");
        assert!(matches!(
            t.archive().restore(&read).await,
            Err(lks_store::StoreError::Conflict(_))
        ));
    }
}
