//! Drift: a heal pass re-verifies every managed file (by its inode's
//! metadata, by hash when that changed or once every [`FULL_REHASH_MS`]),
//! restores the drifted ones from the cache and re-runs the bundle's
//! `on_heal` steps and health check; and housekeeping drops cached blobs
//! and originals nothing refers to any more.

use std::collections::BTreeSet;
use std::fs;

use lks_proto::{BundlePath, Digest, FileSpec, Manifest};

use super::files::write_entry;
use super::{ApplyError, Engine, EngineError, FULL_REHASH_MS, HealReport, is_regular};
use crate::apply::desired::Desired;
use crate::apply::inode::InodeMeta;
use crate::apply::root::RootError;
use crate::apply::state::{Activity, Content};

impl Engine {
    /// Re-verifies every managed file by size, mode and hash; restores the
    /// drifted ones from the cache (fetching again if needed), re-runs the
    /// `on_heal` steps and the health check of each bundle a file of which
    /// was restored, and reports. A file whose inode is unchanged since its
    /// bytes last matched is not read again, except once every
    /// [`FULL_REHASH_MS`]: an idle node's pass costs a `stat` per file, not
    /// a read of every byte it manages.
    pub async fn heal(&mut self) -> Result<HealReport, EngineError> {
        self.recover().await?;
        // A kill between a commit and its cache copy left blobs uncached.
        self.fill_cache();
        let mut report = HealReport::default();
        let now = self.clock.now_ms();
        let full =
            now.saturating_sub(self.last_full_heal_ms) >= FULL_REHASH_MS || now < self.last_full_heal_ms;
        if full {
            self.last_full_heal_ms = now;
        }
        let bundles: Vec<(String, Manifest)> = self
            .state
            .bundles
            .iter()
            .filter_map(|(n, r)| r.installed.clone().map(|m| (n.clone(), m)))
            // The agent's own binary is the package manager's as much as
            // ours: a self-update is never "repaired" back.
            .filter(|(_, m)| !m.self_update)
            .collect();
        for (name, m) in bundles {
            let mut repaired = Vec::new();
            let mut failed = Vec::new();
            for f in m.all_files() {
                match self.check_file(f, full, &mut report.hashed) {
                    Ok(None) => {}
                    Ok(Some(why)) => match self.repair_file(f).await {
                        Ok(()) => repaired.push(format!("{} ({why})", f.path)),
                        Err(e) => failed.push(format!("{} ({why}): {e}", f.path)),
                    },
                    Err(e) => failed.push(format!("{}: {e}", f.path)),
                }
            }
            if repaired.is_empty() && failed.is_empty() {
                continue;
            }
            let mut message = String::new();
            if !repaired.is_empty() {
                message = format!("restored {}{}", repaired.join(", "), self.after_repair(&m).await);
                self.event("repaired", &name, &m.version, &message);
            }
            if !failed.is_empty() {
                let f = format!("could not restore {}", failed.join(", "));
                self.event("repair_failed", &name, &m.version, &f);
                message = if message.is_empty() {
                    f
                } else {
                    format!("{message}; {f}")
                };
            }
            self.state.last_repair = Some(Activity {
                at_ms: self.clock.now_ms(),
                bundle: name.clone(),
                version: m.version.clone(),
                outcome: if failed.is_empty() {
                    "repaired"
                } else {
                    "repair_failed"
                }
                .into(),
                message,
            });
            self.save_state()?;
            report.repaired.extend(repaired);
            report.failed.extend(failed);
        }
        Ok(report)
    }

    /// What a bundle does once a file of it was restored: its `on_heal`
    /// steps, then its health check, each outcome as "; …" for the
    /// report. A failed step stops the steps after it, but the health
    /// check still runs: the files are the committed version, so there is
    /// nothing to roll back to — the report is the remedy.
    async fn after_repair(&self, m: &Manifest) -> String {
        let mut out = String::new();
        let steps: Vec<String> = m.heal_steps().map(|s| format!("{:?}", s.name)).collect();
        match self.run_heal_steps(m).await {
            Ok(()) if steps.is_empty() => {}
            Ok(()) if steps.len() == 1 => out.push_str(&format!("; ran step {}", steps[0])),
            Ok(()) => out.push_str(&format!("; ran steps {}", steps.join(", "))),
            Err(e) => out.push_str(&format!("; {e}")),
        }
        match self.health_check(m).await {
            Ok(()) if m.health.is_some() => out.push_str("; health check passed"),
            Ok(()) => {}
            Err(e) => out.push_str(&format!("; {e}")),
        }
        out
    }

    /// Whether `path`'s inode is as it was when its bytes were last found
    /// (or written) to be `digest`: then they still are (see [`InodeMeta`]).
    pub(super) fn unchanged_since_verified(
        &self,
        path: &BundlePath,
        st: &nix::sys::stat::FileStat,
        digest: &Digest,
    ) -> bool {
        self.verified
            .get(path)
            .is_some_and(|(meta, d)| *meta == InodeMeta::of(st) && d == digest)
    }

    /// Why a managed file differs from its manifest entry, if it does.
    /// Unless `full`, a file whose inode is as it was when its bytes last
    /// matched is not read again; `hashed` counts the files that were.
    fn check_file(
        &mut self,
        f: &FileSpec,
        full: bool,
        hashed: &mut usize,
    ) -> Result<Option<&'static str>, ApplyError> {
        let parent = match self.root.parent(&f.path, false) {
            Ok(p) => p,
            Err(RootError::MissingParent { .. }) => return Ok(Some("missing")),
            Err(e) => return Err(e.into()),
        };
        let Some(st) = parent.stat_target()? else {
            return Ok(Some("missing"));
        };
        if !is_regular(&st) {
            return Ok(Some("replaced by something that is not a regular file"));
        }
        if st.st_size as u64 != f.size {
            self.verified.remove(&f.path);
            return Ok(Some("content changed"));
        }
        if st.st_mode & 0o7777 != f.mode {
            self.verified.remove(&f.path);
            return Ok(Some("mode changed"));
        }
        if !full && self.unchanged_since_verified(&f.path, &st, &f.digest) {
            return Ok(None);
        }
        let Some(file) = parent.open_target()? else {
            return Ok(Some("missing"));
        };
        // The metadata of the very inode that is read: if the path is
        // replaced meanwhile, the next pass sees another inode.
        let st = nix::sys::stat::fstat(&file).map_err(|error| ApplyError::CheckStat {
            path: f.path.clone(),
            error,
        })?;
        *hashed += 1;
        let (digest, _) = Digest::of_reader(file).map_err(|error| ApplyError::CheckRead {
            path: f.path.clone(),
            error,
        })?;
        if digest != f.digest {
            self.verified.remove(&f.path);
            return Ok(Some("content changed"));
        }
        if st.st_mode & 0o7777 != f.mode {
            self.verified.remove(&f.path);
            return Ok(Some("mode changed"));
        }
        self.verified.insert(f.path.clone(), (InodeMeta::of(&st), digest));
        Ok(None)
    }

    /// Writes the blob of `f` over its target (fetching it again if the
    /// cache lost it), by rename, durably.
    async fn repair_file(&self, f: &FileSpec) -> Result<(), ApplyError> {
        let spec = FileSpec {
            chunks: None,
            arch: None,
            path: f.path.clone(),
            digest: f.digest,
            size: f.size,
            mode: f.mode,
            url: f.url.clone(),
        };
        // A download a rollback gave back is as good as a fetch, once it
        // is verified.
        self.cache.promote_fetched(&f.digest, f.size)?;
        self.cache.ensure(&spec, &*self.source).await?;
        let src = self
            .cache
            .open(&f.digest)?
            .ok_or_else(|| ApplyError::RepairNotCached { path: f.path.clone() })?;
        let parent = self.root.parent(&f.path, true)?;
        let temp = ".lks.heal.tmp";
        if let Err(e) = write_entry(&parent, temp, src, f.digest, f.size, f.mode, false) {
            let _ = parent.remove_entry(&temp.into());
            let _ = self.cache.remove(&f.digest);
            return Err(ApplyError::Repair {
                path: f.path.clone(),
                error: e,
            });
        }
        let name = parent.name().clone();
        Ok(parent
            .rename_entry(&temp.into(), &name)
            .and_then(|()| parent.sync())?)
    }

    /// Drops cached blobs and originals nothing refers to any more: not
    /// installed, not in `desired`.
    pub(super) fn gc(&self, desired: &Desired) {
        let mut keep = BTreeSet::new();
        let mut originals = BTreeSet::new();
        for r in self.state.bundles.values() {
            for f in r
                .installed
                .iter()
                .filter(|m| !m.self_update)
                .flat_map(|m| m.all_files())
            {
                keep.insert(f.digest);
            }
            for o in &r.originals {
                if let Content::File { stored, .. } = &o.content {
                    originals.insert(stored.clone());
                }
            }
        }
        for sb in desired.valid() {
            keep.extend(sb.manifest.files.iter().map(|f| f.digest));
        }
        if let Err(e) = self.cache.gc(&keep) {
            tracing::warn!("clean the blob cache: {e}");
        }
        if let Ok(rd) = fs::read_dir(self.dirs.originals()) {
            for e in rd.filter_map(Result::ok) {
                if !originals.contains(&e.file_name().to_string_lossy().into_owned()) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
}
