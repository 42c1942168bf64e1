//! Published bundle versions on etcd.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, TxnOp};

use lks_store::{BundleRow, BundleStore, Kind, NewBundle, PutOutcome, RawBundleRow, Result, StoreError};

use crate::docs::BundleDoc;
use crate::{EtcdStore, busy, corrupt, json};

#[async_trait]
impl BundleStore for EtcdStore {
    async fn put_bundle(&self, b: NewBundle) -> Result<PutOutcome> {
        let key = self.key(&format!("bundles/{}/{}", b.name, b.version));
        let doc = BundleDoc {
            signed_bundle: hex::encode(b.bundle.encoded()),
            manifest_digest: b.manifest_digest.to_string(),
            signed: b.signed,
            files: b.files,
            total_size: b.total_size,
            published_at_ms: b.now_ms,
            blob_digests: b.blob_digests.iter().map(ToString::to_string).collect(),
        };
        let created = self
            .txn(
                vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)],
                vec![TxnOp::put(key.clone(), json(&doc)?, None)],
            )
            .await?;
        if created {
            return Ok(PutOutcome::Created);
        }
        match self.get::<BundleDoc>(&key).await?.value {
            Some(d) if d.manifest_digest == doc.manifest_digest => Ok(PutOutcome::Unchanged),
            Some(d) => Err(StoreError::AlreadyExists(format!(
                "bundle {}@{} already exists with other content ({}); versions are immutable, publish a new version",
                b.name, b.version, d.manifest_digest
            ))),
            None => Err(busy("publish bundle")),
        }
    }

    async fn get_bundle(&self, name: &str, version: &str) -> Result<Option<BundleRow>> {
        let key = self.key(&format!("bundles/{name}/{version}"));
        self.get::<BundleDoc>(&key)
            .await?
            .value
            .map(|d| bundle_row(name, version, d))
            .transpose()
    }

    async fn list_bundles(&self, name: Option<&str>) -> Result<Vec<BundleRow>> {
        let prefix = match name {
            Some(n) => self.key(&format!("bundles/{n}/")),
            None => self.key("bundles/"),
        };
        let mut out = Vec::new();
        for (rest, d, _) in self.range::<BundleDoc>(&prefix).await? {
            let (n, v) = match name {
                Some(n) => (n.to_string(), rest),
                None => match rest.split_once('/') {
                    Some((n, v)) => (n.to_string(), v.to_string()),
                    None => continue,
                },
            };
            out.push(bundle_row(&n, &v, d)?);
        }
        out.sort_by(|a, b| {
            (a.name.as_str(), a.published_at_ms, a.version.as_str()).cmp(&(
                b.name.as_str(),
                b.published_at_ms,
                b.version.as_str(),
            ))
        });
        Ok(out)
    }
}

/// The row of the document `bundles/NAME/VERSION`, read through
/// [`RawBundleRow::typed`] like SQLite's.
pub(super) fn bundle_row(name: &str, version: &str, d: BundleDoc) -> Result<BundleRow> {
    let signed_bundle = hex::decode(&d.signed_bundle).map_err(|e| StoreError::Corrupt {
        kind: Kind::Bundle,
        name: format!("{name}@{version}"),
        why: e.into(),
    })?;
    RawBundleRow {
        name: name.to_string(),
        version: version.to_string(),
        signed_bundle,
        manifest_digest: d.manifest_digest,
        signed: d.signed,
        files: d.files,
        total_size: d.total_size,
        published_at_ms: d.published_at_ms,
    }
    .typed()
}

/// The document stored at `bundles/NAME/VERSION` (`rest`) read as a dump
/// reads it: its row and the blobs the server serves for it
/// (`lks-control-server backup --store etcd` builds its blob manifest so).
pub(crate) fn dumped_bundle(rest: &str, value: &[u8]) -> Result<lks_store::DumpedBundle> {
    let (name, version) = rest
        .strip_prefix("bundles/")
        .and_then(|r| r.split_once('/'))
        .ok_or_else(|| corrupt(rest, "not a bundles/NAME/VERSION key"))?;
    let d: BundleDoc = serde_json::from_slice(value).map_err(|e| corrupt(rest, e))?;
    let blob_digests = d
        .blob_digests
        .iter()
        .map(|s| s.parse().map_err(|e| corrupt(rest, e)))
        .collect::<Result<Vec<_>>>()?;
    Ok(lks_store::DumpedBundle {
        row: bundle_row(name, version, d)?,
        blob_digests,
    })
}
