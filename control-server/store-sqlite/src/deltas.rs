//! [`DeltaStore`] on SQLite: the `deltas` table, one row per file of a
//! bundle version and base.

use async_trait::async_trait;
use lks_proto::Digest;
use rusqlite::Connection;
use rusqlite::params;

use lks_store::{Kind, Result, StoreError};

use crate::SqliteStore;
use lks_store::deltas::{DeltaRow, DeltaStore, NoPatch};

const COLUMNS: &str = "name, version, path, arch, base, from_version, target, size, patch, patch_size, algorithm, note, made_at_ms, why";

fn digest(what: &str, d: &str) -> Result<Digest> {
    d.parse()
        .map_err(|e| StoreError::backend_at(format!("delta {what} {d}"), e))
}

/// A row as stored: digests as text, read back by [`typed`].
struct Raw {
    row: DeltaRow,
    base: String,
    target: String,
    patch: String,
    why: String,
}

fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<Raw> {
    let zero = Digest::of(b"");
    Ok(Raw {
        row: DeltaRow {
            name: r.get(0)?,
            version: r.get(1)?,
            path: r.get(2)?,
            arch: r.get(3)?,
            base: zero,
            from_version: r.get(5)?,
            target: zero,
            size: r.get::<_, i64>(7)? as u64,
            patch: None,
            patch_size: r.get::<_, i64>(9)? as u64,
            algorithm: r.get(10)?,
            note: r.get(11)?,
            made_at_ms: r.get(12)?,
            why: None,
        },
        base: r.get(4)?,
        target: r.get(6)?,
        patch: r.get(8)?,
        why: r.get(13)?,
    })
}

fn typed(raw: Raw) -> Result<DeltaRow> {
    let mut row = raw.row;
    row.base = digest("base", &raw.base)?;
    row.target = digest("target", &raw.target)?;
    if !raw.patch.is_empty() {
        row.patch = Some(digest("patch", &raw.patch)?);
    }
    row.why = NoPatch::decode(&raw.why).map_err(|e| StoreError::backend_at("read a delta row", e))?;
    Ok(row)
}

fn select(c: &Connection, filter: &str, args: &[&dyn rusqlite::ToSql]) -> Result<Vec<DeltaRow>> {
    let mut stmt = c.prepare(&format!(
        "SELECT {COLUMNS} FROM deltas WHERE {filter} ORDER BY name, version, path, arch, from_version"
    ))?;
    let rows = stmt.query_map(args, read)?.collect::<Result<Vec<_>, _>>()?;
    rows.into_iter().map(typed).collect()
}

#[async_trait]
impl DeltaStore for SqliteStore {
    async fn put_delta(&self, row: &DeltaRow) -> Result<()> {
        let r = row.clone();
        self.tx(move |tx| {
            let exists: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM bundles WHERE name = ?1 AND version = ?2)",
                params![r.name, r.version],
                |x| x.get(0),
            )?;
            if !exists {
                return Err(StoreError::not_found(Kind::Bundle, format!("{}@{}", r.name, r.version)));
            }
            tx.execute(
                &format!(
                    "INSERT INTO deltas ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
                     ON CONFLICT (name, version, path, arch, base) DO UPDATE SET
                         from_version = excluded.from_version, target = excluded.target,
                         size = excluded.size, patch = excluded.patch,
                         patch_size = excluded.patch_size, algorithm = excluded.algorithm,
                         note = excluded.note, made_at_ms = excluded.made_at_ms, why = excluded.why
                     WHERE deltas.patch = ''"
                ),
                params![
                    r.name,
                    r.version,
                    r.path,
                    r.arch,
                    r.base.to_string(),
                    r.from_version,
                    r.target.to_string(),
                    r.size as i64,
                    r.patch.map(|p| p.to_string()).unwrap_or_default(),
                    r.patch_size as i64,
                    r.algorithm,
                    r.note,
                    r.made_at_ms,
                    r.why.map(|w| w.encode()).unwrap_or_default(),
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn deltas_of(&self, name: &str, version: &str) -> Result<Vec<DeltaRow>> {
        let (name, version) = (name.to_string(), version.to_string());
        self.call(move |c| select(c, "name = ?1 AND version = ?2", &[&name, &version]))
            .await
    }

    async fn deltas_to(&self, target: &Digest) -> Result<Vec<DeltaRow>> {
        let t = target.to_string();
        self.call(move |c| select(c, "target = ?1 AND patch != ''", &[&t]))
            .await
    }

    async fn deltas_by_patch(&self, patch: &Digest) -> Result<Vec<DeltaRow>> {
        let p = patch.to_string();
        self.call(move |c| select(c, "patch = ?1", &[&p])).await
    }
}
