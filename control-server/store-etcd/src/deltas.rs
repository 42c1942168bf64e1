//! [`DeltaStore`] on etcd: `deltas/<V>/<F>`, one JSON document per file and
//! base of a bundle version, where V hashes NAME@VERSION and F the path,
//! architecture and base (so one version's rows are one prefix, whatever
//! its version string holds). A row is written only while its bundle
//! version exists, once if it names a patch; a row without one (a skip) is
//! replaced by a later record, guarded by its revision. Deleting the
//! version deletes the prefix in the same transaction (`blobrecs.rs`).

use lks_proto::Digest;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, TxnOp};
use serde::{Deserialize, Serialize};

use lks_store::{Kind, Result, StoreError};

use crate::{EtcdStore, corrupt, json};
use lks_store::deltas::{DeltaRow, DeltaStore, NoPatch};

#[derive(Serialize, Deserialize)]
struct DeltaDoc {
    name: String,
    version: String,
    path: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    arch: String,
    from_version: String,
    base: String,
    target: String,
    size: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    patch: String,
    #[serde(default)]
    patch_size: u64,
    algorithm: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    note: String,
    made_at_ms: i64,
    /// `NoPatch`'s stored form (issue [upgrade-cost]); absent for a patch
    /// and in rows written before.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    why: String,
}

/// The prefix of NAME@VERSION's rows.
pub(super) fn version_prefix(name: &str, version: &str) -> String {
    let v = Digest::of(format!("{name}\0{version}").as_bytes());
    format!("deltas/{}/", v.hex())
}

fn row_key(r: &DeltaRow) -> String {
    let f = Digest::of(format!("{}\0{}\0{}", r.path, r.arch, r.base).as_bytes());
    format!("{}{}", version_prefix(&r.name, &r.version), f.hex())
}

fn doc(r: &DeltaRow) -> DeltaDoc {
    DeltaDoc {
        name: r.name.clone(),
        version: r.version.clone(),
        path: r.path.clone(),
        arch: r.arch.clone(),
        from_version: r.from_version.clone(),
        base: r.base.to_string(),
        target: r.target.to_string(),
        size: r.size,
        patch: r.patch.map(|p| p.to_string()).unwrap_or_default(),
        patch_size: r.patch_size,
        algorithm: r.algorithm.clone(),
        note: r.note.clone(),
        made_at_ms: r.made_at_ms,
        why: r.why.map(|w| w.encode()).unwrap_or_default(),
    }
}

fn row(key: &str, d: DeltaDoc) -> Result<DeltaRow> {
    let digest = |s: &str| -> Result<Digest> { s.parse().map_err(|e| corrupt(&format!("deltas/{key}"), e)) };
    Ok(DeltaRow {
        base: digest(&d.base)?,
        target: digest(&d.target)?,
        patch: if d.patch.is_empty() {
            None
        } else {
            Some(digest(&d.patch)?)
        },
        why: NoPatch::decode(&d.why).map_err(|e| corrupt(&format!("deltas/{key}"), e))?,
        name: d.name,
        version: d.version,
        path: d.path,
        arch: d.arch,
        from_version: d.from_version,
        size: d.size,
        patch_size: d.patch_size,
        algorithm: d.algorithm,
        note: d.note,
        made_at_ms: d.made_at_ms,
    })
}

impl EtcdStore {
    /// Every row, with its bundle version (few: files of large versions
    /// times k earlier versions).
    pub(super) async fn all_deltas(&self) -> Result<Vec<DeltaRow>> {
        let mut out = Vec::new();
        for (key, d, _) in self.range::<DeltaDoc>(&self.key("deltas/")).await? {
            out.push(row(&key, d)?);
        }
        Ok(out)
    }
}

#[async_trait]
impl DeltaStore for EtcdStore {
    async fn put_delta(&self, r: &DeltaRow) -> Result<()> {
        let bkey = self.key(&format!("bundles/{}/{}", r.name, r.version));
        let key = self.key(&row_key(r));
        let written = self
            .txn(
                vec![
                    Compare::create_revision(bkey.clone(), CompareOp::Greater, 0),
                    Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                ],
                vec![TxnOp::put(key.clone(), json(&doc(r))?, None)],
            )
            .await?;
        if written {
            return Ok(());
        }
        if self.get_raw(&bkey).await?.is_none() {
            return Err(StoreError::not_found(
                Kind::Bundle,
                format!("{}@{}", r.name, r.version),
            ));
        }
        // A row is there: kept if it names a patch, else replaced unless
        // another write came first (that one stands).
        let held = self.get::<DeltaDoc>(&key).await?;
        if held.value.is_none_or(|d| !d.patch.is_empty()) {
            return Ok(());
        }
        self.txn(
            vec![
                Compare::create_revision(bkey, CompareOp::Greater, 0),
                Compare::mod_revision(key.clone(), CompareOp::Equal, held.rev),
            ],
            vec![TxnOp::put(key, json(&doc(r))?, None)],
        )
        .await?;
        Ok(())
    }

    async fn deltas_of(&self, name: &str, version: &str) -> Result<Vec<DeltaRow>> {
        let mut out = Vec::new();
        for (key, d, _) in self
            .range::<DeltaDoc>(&self.key(&version_prefix(name, version)))
            .await?
        {
            out.push(row(&key, d)?);
        }
        out.sort_by(|a, b| (&a.path, &a.arch, &a.from_version).cmp(&(&b.path, &b.arch, &b.from_version)));
        Ok(out)
    }

    async fn deltas_to(&self, target: &Digest) -> Result<Vec<DeltaRow>> {
        Ok(self
            .all_deltas()
            .await?
            .into_iter()
            .filter(|r| r.target == *target && r.patch.is_some())
            .collect())
    }

    async fn deltas_by_patch(&self, patch: &Digest) -> Result<Vec<DeltaRow>> {
        Ok(self
            .all_deltas()
            .await?
            .into_iter()
            .filter(|r| r.patch == Some(*patch))
            .collect())
    }
}
