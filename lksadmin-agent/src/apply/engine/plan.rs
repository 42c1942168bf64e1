//! Planning: from a desired state to the transactions that converge the
//! node on it. Which bundles to remove and which to apply, whether a
//! version is refused before anything is written (signature, a path
//! another bundle owns, a foreign ELF, a target that is not a regular
//! file), fetching its blobs, and the per-path plan a transaction runs.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;

use lks_proto::sign;
use lks_proto::{BundlePath, BundleState, Manifest, SignedBundle};

use super::{ApplyError, Engine, EngineError, ISSUE_RETRY_MS, Verdict, bundle_key, is_regular};
use crate::apply::cache::FetchError;
use crate::apply::desired::{Desired, DesiredBundle};
use crate::apply::journal::{PathPlan, Phase, Txn, Want};
use crate::apply::root::RootError;
use crate::apply::state::{BundleRecord, Content, OriginalRec};
use crate::clock::rfc3339;
use crate::node::certs::IssueError;

/// How the status message of a bundle kept by [`Engine::withhold_removal`]
/// starts.
const NOT_REMOVED: &str = "not removed: ";

impl Engine {
    /// Stores `desired` durably, then converges on it.
    pub async fn accept_desired(&mut self, desired: &Desired) -> Result<(), EngineError> {
        crate::apply::state::save_desired(&self.dirs.desired(), desired)?;
        self.reconcile(desired).await
    }

    /// Converges the node on `desired`: removes bundles no longer listed,
    /// applies new versions, one bundle at a time.
    pub async fn reconcile(&mut self, desired: &Desired) -> Result<(), EngineError> {
        self.recover().await?;
        if desired.generation < self.state.generation {
            tracing::warn!(
                got = desired.generation,
                had = self.state.generation,
                "desired state generation went backwards; following the server"
            );
        }
        self.state.generation = desired.generation;
        self.take_trust(desired)?;
        for name in &desired.duplicates {
            tracing::warn!(bundle = %name, "bundle listed twice in the desired state; using the first");
        }
        let mut wanted: Vec<&SignedBundle> = Vec::new();
        for b in &desired.bundles {
            let (name, version) = (b.name(), b.version());
            if let Some(&seq) = desired.retry.get(name)
                && let Some(r) = self.state.bundles.get_mut(name)
                && seq > r.retry_seen
            {
                // The operator asked for another try (`lksctl node retry`).
                r.retry_seen = seq;
                if r.sticky.is_some() || r.interrupted > 0 || r.retry_at_ms > 0 {
                    r.clear_failures();
                    r.gave_up = 0;
                    tracing::info!(bundle = %name, version = %version, "retrying at the operator's request");
                    self.event("retry", name, version, "retry requested by the operator");
                }
                self.save_state()?;
            }
            match b {
                DesiredBundle::Valid(sb) => wanted.push(sb),
                DesiredBundle::Invalid(i) => {
                    let message = format!("invalid bundle {name}@{version}: {}", i.error);
                    self.fail_once(name, version, message, Some(i.key.to_string()))?;
                }
                DesiredBundle::Unnamed { error, .. } => {
                    tracing::warn!("ignoring an invalid bundle in the desired state: {error}");
                }
            }
        }
        let names = desired.names();
        let gone: Vec<String> = self
            .state
            .bundles
            .keys()
            .filter(|n| !names.contains(n.as_str()))
            .cloned()
            .collect();
        for name in gone {
            if let Some(why) = self.trust.keeps(&name) {
                self.withhold_removal(&name, &why)?;
                continue;
            }
            self.remove_bundle(&name).await?;
        }
        for sb in wanted {
            self.converge(sb).await?;
            if self.handover {
                // The process exits for the new agent: nothing more now.
                return Ok(());
            }
        }
        self.save_state()?;
        self.publish();
        self.fill_cache();
        self.gc(desired);
        Ok(())
    }

    /// With trust on: applies the desired state's root rotations and
    /// release to the trust journal (durable before anything acts on it),
    /// and reports a refusal once per reason.
    fn take_trust(&mut self, desired: &Desired) -> Result<(), EngineError> {
        let now = self.trust_now();
        if let Some(reason) = self.trust.update(desired.release.as_ref(), &desired.roots, now)? {
            tracing::warn!("signed release refused: {reason}");
            self.event("release_refused", "", "", &reason);
        }
        Ok(())
    }

    /// A bundle the desired state omits but the node's release still names
    /// (or whose release cannot be read) stays installed: a server cannot
    /// withhold a bundle into removal. Said once, in its status message.
    fn withhold_removal(&mut self, name: &str, why: &str) -> Result<(), EngineError> {
        let Some(rec) = self.state.bundles.get(name) else {
            return Ok(());
        };
        let Some(installed) = rec.installed.as_ref() else {
            // Nothing on disk to keep: forget the record as before.
            self.state.bundles.remove(name);
            self.save_state()?;
            self.publish();
            return Ok(());
        };
        let version = installed.version.clone();
        let message = format!("{NOT_REMOVED}{why}");
        if rec.status.message == message && rec.status.version == version {
            return Ok(());
        }
        tracing::warn!(bundle = name, version = %version, "{message}");
        self.set_status(
            name,
            &version,
            Verdict {
                state: BundleState::Applied,
                message: message.clone(),
                sticky: None,
            },
        )?;
        self.event("removal_withheld", name, &version, &message);
        Ok(())
    }

    /// Sets a failure state and emits an event only when it is news.
    pub(super) fn fail_once(
        &mut self,
        bundle: &str,
        version: &str,
        message: String,
        sticky: Option<String>,
    ) -> Result<(), EngineError> {
        let news = self.state.bundles.get(bundle).is_none_or(|r| {
            r.status.version != version
                || r.status.state != BundleState::Failed
                || r.status.message != message
        });
        self.set_status(
            bundle,
            version,
            Verdict {
                state: BundleState::Failed,
                message: message.clone(),
                sticky,
            },
        )?;
        if news {
            tracing::warn!(bundle, version, "{message}");
            self.record_apply(bundle, version, "failed", &message);
            self.save_state()?;
            self.event("failed", bundle, version, &message);
        }
        Ok(())
    }

    async fn converge(&mut self, sb: &SignedBundle) -> Result<(), EngineError> {
        let published = &sb.manifest;
        if self
            .on_trial
            .as_ref()
            .is_some_and(|p| p.get("BUNDLE") == published.name)
        {
            // This process is that self-update; it commits once reported.
            return Ok(());
        }
        let key = bundle_key(sb);
        // A multi-arch bundle: this node installs its architecture's files
        // and the neutral ones, never another architecture's, whatever the
        // server sent (the signature below covers every variant).
        let selected = match published.for_arch(self.arch) {
            Ok(s) => s,
            Err(why) => {
                let why = format!("refused: {why}");
                return self.fail_once(&published.name, &published.version, why, Some(key));
            }
        };
        let m = &selected;
        let want = m.clone();
        let rec = self.state.bundles.get(&m.name).cloned();
        if let Some(r) = &rec
            && r.installed.as_ref().is_some_and(|i| i.same_request(&want))
        {
            // (A bundle kept against a desired state that omitted it is
            // simply applied again once it is listed.)
            if r.status.version != m.version
                || r.status.state != BundleState::Applied
                || r.status.message.starts_with(NOT_REMOVED)
            {
                self.set_status(
                    &m.name,
                    &m.version,
                    Verdict {
                        state: BundleState::Applied,
                        message: String::new(),
                        sticky: None,
                    },
                )?;
            }
            return Ok(());
        }
        // A new version (or a first install) needs the node's release to
        // name it, with this manifest; else the installed one is kept (its
        // drift repair goes on). Evaluated on every reconcile, so a newly
        // accepted release lets it through; the status message changes
        // only with the reason, so it is reported once.
        let digest = lks_proto::canonical::manifest_digest(published);
        if let Err(why) = self
            .trust
            .admits(&published.name, &published.version, &digest, self.trust_now())
        {
            return self.fail_once(&m.name, &m.version, why.to_string(), Some(format!("trust:{key}")));
        }
        if let Some(r) = &rec {
            if r.sticky.as_deref() == Some(key.as_str())
                && r.status.version == m.version
                && matches!(r.status.state, BundleState::Failed | BundleState::RolledBack)
            {
                if r.retry_at_ms == 0 || self.clock.now_ms() < r.retry_at_ms {
                    return Ok(());
                }
                // The crash-loop guard's wait is over: try once more.
                tracing::info!(bundle = %m.name, version = %m.version, "trying again after giving up");
                if let Some(r) = self.state.bundles.get_mut(&m.name) {
                    r.clear_failures();
                }
            }
        }
        if let Err(e) = sign::verify(sb, &self.bundle_keys()) {
            return self.fail_once(&m.name, &m.version, e.to_string(), Some(key));
        }
        if let Some(reason) = self.conflict(m) {
            return self.fail_once(&m.name, &m.version, reason, None);
        }
        if !sign::chunks_usable(sb) {
            // Chunk lists its signer did not sign are not used: its files
            // come from the control server whole, as before chunk lists.
            let mut bare = m.clone();
            bare.files.iter_mut().for_each(|f| f.chunks = None);
            return self.apply(&bare, rec, key, false).await;
        }
        self.apply(m, rec, key, false).await
    }

    /// The keys a bundle may be signed by: the publisher keys given to
    /// `join`, and with release records on the current trust root's keys
    /// too, so a rotation to new keys does not leave their bundles refused
    /// (what is applied is bound by the release's threshold anyway).
    fn bundle_keys(&self) -> std::borrow::Cow<'_, [lks_proto::sign::PublisherKey]> {
        match self.trust.state() {
            Some(s) if s.root.keys.iter().any(|k| !self.trusted.contains(k)) => {
                let mut keys = self.trusted.clone();
                keys.extend(s.root.keys.iter().filter(|k| !self.trusted.contains(k)).cloned());
                std::borrow::Cow::Owned(keys)
            }
            _ => std::borrow::Cow::Borrowed(&self.trusted),
        }
    }

    /// A reason if `m` would own a path (or a parent/child of one) that
    /// another bundle on this node owns.
    fn conflict(&self, m: &Manifest) -> Option<String> {
        for (other, r) in &self.state.bundles {
            if *other == m.name {
                continue;
            }
            let Some(inst) = &r.installed else { continue };
            for f in m.owned_paths() {
                for g in inst.owned_paths() {
                    let pair = [f, g];
                    if lks_proto::manifest::check_paths_disjoint(pair.into_iter()).is_err() {
                        return Some(format!(
                            "bundle {}@{} refused: its file {} collides with {} of bundle {}@{} on this node",
                            m.name, m.version, f, g, other, inst.version
                        ));
                    }
                }
            }
        }
        None
    }

    /// Installs `m` (a published manifest). A `renewal` installs the same
    /// version again with newly issued certificates; it keeps the bundle
    /// `applied` whatever happens, and a failure keeps the current pair.
    pub(super) async fn apply(
        &mut self,
        m: &Manifest,
        rec: Option<BundleRecord>,
        key: String,
        renewal: bool,
    ) -> Result<(), EngineError> {
        let (name, version) = (m.name.as_str(), m.version.as_str());
        if !renewal {
            self.set_status(
                name,
                version,
                Verdict {
                    state: BundleState::Applying,
                    message: String::new(),
                    sticky: None,
                },
            )?;
            tracing::info!(bundle = name, version, "applying");
        }
        for f in &m.files {
            // A self-update is staged from the cache (`hand_over`); every
            // other file's download is moved beside its target.
            let got = if m.self_update {
                self.cache.ensure(f, &*self.source).await
            } else {
                self.cache_from_installed(&f.digest);
                let installed = self.delta_base(name, f);
                self.cache.fetch_with_base(f, &*self.source, installed).await
            };
            match got {
                Ok(got) => {
                    if (got.from_server, got.from_peers) != (0, 0)
                        && let Some(r) = self.state.bundles.get_mut(name)
                    {
                        r.add_fetched(version, got.from_server, got.from_peers, got.as_delta);
                    }
                }
                Err(e @ FetchError::Unavailable { .. }) => {
                    return self.wait_for(name, version, format!("waiting for blobs: {e}"));
                }
                Err(e @ FetchError::Verify { .. }) => {
                    return self.fail_once(name, version, e.to_string(), Some(key));
                }
                Err(FetchError::Fs(e)) => {
                    return self.fail_once(name, version, format!("cache: {e}"), None);
                }
            }
        }
        if let Err(why) = self.check_arch_elf(m) {
            return self.fail_once(name, version, why.to_string(), Some(key));
        }
        if m.self_update {
            return self.hand_over(m, key).await;
        }
        let made = match self.make_identity_files(m).await {
            Ok(made) => made,
            Err(e) if renewal => return self.renewal_failed(name, version, &e.to_string()),
            Err(IssueError::Unavailable(e)) => {
                return self.wait_for(name, version, format!("waiting for a certificate: {e}"));
            }
            Err(IssueError::Refused(e)) => {
                // Asked again after a while: the operator may fix the cause
                // (a cluster CA, an API server) without a new bundle.
                let retry_at = self.clock.now_ms().saturating_add(ISSUE_RETRY_MS);
                self.fail_once(
                    name,
                    version,
                    format!("certificate refused: {e}; asking again at {}", rfc3339(retry_at)),
                    Some(key),
                )?;
                if let Some(r) = self.state.bundles.get_mut(name) {
                    r.retry_at_ms = retry_at;
                }
                return self.save_state();
            }
        };
        let m = &made;
        if let Err(reason) = self.precheck(m) {
            if renewal {
                return self.renewal_failed(name, version, &reason.to_string());
            }
            return self.fail_once(name, version, reason.to_string(), None);
        }
        let from = rec.as_ref().and_then(|r| r.installed.clone());
        let originals = rec.map(|r| r.originals).unwrap_or_default();
        let mut txn = self.plan(name, from, Some(m.clone()), &originals)?;
        txn.key = key;
        txn.renewal = renewal;
        self.run_txn(txn).await
    }

    /// In a multi-arch bundle, every fetched file that is an ELF
    /// executable must be one for this node: publish checks the files it
    /// uploads, but not those behind a mirror URL, and a server is not
    /// trusted with this.
    fn check_arch_elf(&self, m: &Manifest) -> Result<(), ApplyError> {
        let Some(arch) = self.arch.filter(|_| m.is_multi_arch()) else {
            return Ok(());
        };
        for f in &m.files {
            let path = [
                self.cache.fetched_path(&f.digest),
                self.cache.blob_path(&f.digest),
            ]
            .into_iter()
            .find(|p| p.exists());
            let Some(path) = path else { continue };
            let mut head = Vec::with_capacity(64);
            let read = File::open(&path).and_then(|file| file.take(64).read_to_end(&mut head));
            if read.is_err() {
                continue;
            }
            arch.check_elf(&head).map_err(|why| ApplyError::ForeignElf {
                path: f.path.clone(),
                why,
                arch,
            })?;
        }
        Ok(())
    }

    /// `pending` for something the node cannot have now (a blob, a
    /// certificate): tried again on the next reconcile.
    fn wait_for(&mut self, name: &str, version: &str, message: String) -> Result<(), EngineError> {
        tracing::warn!(bundle = name, version, "{message}");
        self.set_status(
            name,
            version,
            Verdict {
                state: BundleState::Pending,
                message,
                sticky: None,
            },
        )
    }

    /// Checks, before anything is written, that every target can be reached
    /// beneath the root and is a regular file (or absent).
    fn precheck(&self, m: &Manifest) -> Result<(), ApplyError> {
        for f in m.all_files() {
            match self.root.parent(&f.path, false) {
                Ok(parent) => match parent.stat_target() {
                    Ok(Some(st)) if !is_regular(&st) => {
                        return Err(ApplyError::PrecheckNotRegular { path: f.path.clone() });
                    }
                    Ok(_) => {}
                    Err(e) => return Err(e.into()),
                },
                Err(RootError::MissingParent { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    async fn remove_bundle(&mut self, name: &str) -> Result<(), EngineError> {
        let Some(rec) = self.state.bundles.get(name).cloned() else {
            return Ok(());
        };
        let Some(from) = rec.installed.clone().filter(|m| !m.self_update) else {
            // Never delete the agent's own binary: a self-update leaves the
            // desired state by being forgotten (roll out another to move).
            self.state.bundles.remove(name);
            self.save_state()?;
            self.publish();
            return Ok(());
        };
        tracing::info!(bundle = name, version = %from.version, "removing");
        let txn = self.plan(name, Some(from), None, &rec.originals)?;
        self.run_txn(txn).await
    }

    /// Builds the per-path plan of a transaction from `from` to `to`.
    fn plan(
        &mut self,
        bundle: &str,
        from: Option<Manifest>,
        to: Option<Manifest>,
        originals: &[OriginalRec],
    ) -> Result<Txn, EngineError> {
        self.state.txn_seq += 1;
        let seq = self.state.txn_seq;
        self.save_state()?;
        let old: BTreeSet<&BundlePath> = from.iter().flat_map(|m| m.all_files().map(|f| &f.path)).collect();
        let new: BTreeSet<&BundlePath> = to.iter().flat_map(|m| m.all_files().map(|f| &f.path)).collect();
        let mut plans = Vec::new();
        for f in to.iter().flat_map(|m| m.all_files()) {
            plans.push(PathPlan {
                path: f.path.clone(),
                temp: String::new(),
                want: Want::Blob {
                    digest: f.digest,
                    size: f.size,
                    mode: f.mode,
                },
                backup: None,
                newly_owned: !old.contains(&f.path),
            });
        }
        for f in from.iter().flat_map(|m| m.all_files()) {
            if new.contains(&f.path) {
                continue;
            }
            let want = match originals.iter().find(|o| o.path == f.path).map(|o| &o.content) {
                Some(Content::File {
                    digest,
                    size,
                    mode,
                    stored,
                }) => Want::Original {
                    digest: *digest,
                    size: *size,
                    mode: *mode,
                    stored: stored.clone(),
                },
                _ => Want::Absent,
            };
            plans.push(PathPlan {
                path: f.path.clone(),
                temp: String::new(),
                want,
                backup: None,
                newly_owned: false,
            });
        }
        for (i, p) in plans.iter_mut().enumerate() {
            p.temp = format!(".lks.{seq}.{i}.tmp");
        }
        let kept_originals = originals
            .iter()
            .filter(|o| new.contains(&o.path))
            .cloned()
            .collect();
        Ok(Txn {
            seq,
            bundle: bundle.to_string(),
            from,
            to,
            plans,
            kept_originals,
            key: String::new(),
            renewal: false,
            phase: Phase::Staging,
        })
    }
}
