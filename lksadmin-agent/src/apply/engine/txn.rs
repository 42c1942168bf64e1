//! The transaction of one bundle change, as a persisted state machine:
//! run it phase by phase (stage → back up → switch → steps → health
//! check), commit it or roll it back, and finish or undo one a crash
//! interrupted ([`Engine::recover`]). Every phase change goes through
//! [`crate::apply::journal`] and is durable before it takes effect. The file
//! operations of each phase are in `files.rs`.

use std::fs;
use std::path::Path;

use lks_proto::fsutil::{self, FsError};
use lks_proto::manifest::Step;
use lks_proto::{BundleState, Digest, Manifest};

use super::{
    ApplyError, Engine, EngineError, MAX_INTERRUPTED, MIB, RENEW_RETRY_MS, Verdict, give_up_backoff_ms,
};
use crate::apply::journal::{Event, Next, Phase, Txn};
use crate::apply::runner::{CommandSpec, Outcome};
use crate::apply::state::{BundleRecord, Content, OriginalRec, StatusRec};
use crate::clock::rfc3339;
use crate::fault;

impl Engine {
    /// Finishes (after the commit record) or undoes (before it) a
    /// transaction a crash interrupted.
    pub async fn recover(&mut self) -> Result<(), EngineError> {
        let Some(mut txn) = self.journal.load()? else {
            // Only a kill leaves stale backups, so the first recovery of a
            // process finds them all; later ones (every reconcile, heal
            // and renewal tick) need not look again.
            if !self.backups_checked {
                self.backups_checked = true;
                self.remove_stale_backups();
            }
            return Ok(());
        };
        tracing::warn!(bundle = %txn.bundle, phase = %txn.phase, "finishing a transaction interrupted by a restart");
        match txn.phase.clone() {
            Phase::Committed => self.finish_commit(txn).await,
            Phase::RollingBack { .. } => self.finish_rollback(txn).await,
            p => {
                let reason = format!("the agent stopped during {} of {}", p.name(), txn.describe());
                self.advance(&mut txn, Event::Failed { reason, retry: true })?;
                self.finish_rollback(txn).await
            }
        }
    }

    /// Removes the backup dirs of transactions that are over. A kill
    /// between closing the journal and deleting a transaction's backups
    /// leaves them behind (up to a copy of every file it replaced); with no
    /// journal open, no backup is needed any more.
    fn remove_stale_backups(&self) {
        let Ok(entries) = fs::read_dir(self.dirs.path().join("txn")) else {
            return;
        };
        for e in entries.flatten() {
            match fsutil::remove_dir_all(&e.path()) {
                Ok(()) => {
                    tracing::info!(dir = %e.path().display(), "removed the backups of a finished transaction")
                }
                Err(err) => tracing::warn!("remove stale backups: {err}"),
            }
        }
    }

    /// Moves `txn` to its next phase: in memory, then one durable journal
    /// write, then the fault point of the new phase.
    fn advance(&self, txn: &mut Txn, event: Event) -> Result<(), EngineError> {
        match txn.phase.next(event)? {
            Next::Phase(p) => {
                txn.phase = p;
                self.journal.write(txn)?;
                fault::point(txn.phase.name());
            }
            Next::Done => self.journal.clear()?,
        }
        Ok(())
    }

    pub(super) async fn run_txn(&mut self, mut txn: Txn) -> Result<(), EngineError> {
        self.journal.write(&txn)?;
        fault::point("staging");

        for (i, plan) in txn.plans.iter().enumerate() {
            if let Err(reason) = self.stage(plan, &txn.plans[..i]) {
                return self.fail_txn(txn, reason).await;
            }
            if i == 0 {
                fault::point("staged-partial");
            }
        }
        self.advance(&mut txn, Event::Staged)?;

        let backup_dir = self.dirs.txn(txn.seq);
        if let Err(e) = fsutil::create_dir(&backup_dir, 0o700) {
            return self.fail_txn(txn, e.into()).await;
        }
        for i in 0..txn.plans.len() {
            let from = txn.from.as_ref();
            match self.backup(&backup_dir, i, &txn.plans[i], from) {
                Ok(content) => txn.plans[i].backup = Some(content),
                Err(reason) => return self.fail_txn(txn, reason).await,
            }
        }
        if let Err(e) = fsutil::sync_dir(&backup_dir) {
            return self.fail_txn(txn, e.into()).await;
        }
        self.advance(&mut txn, Event::BackedUp)?;

        for (i, plan) in txn.plans.iter().enumerate() {
            if let Err(reason) = self.switch(plan) {
                return self.fail_txn(txn, reason).await;
            }
            if i == 0 {
                fault::point("switch-partial");
            }
        }
        self.advance(&mut txn, Event::Switched)?;
        self.remember_written(&txn);

        if let Some(to) = txn.to.clone() {
            if let Err(reason) = self.run_steps(&to).await {
                return self.fail_txn(txn, reason).await;
            }
            self.advance(&mut txn, Event::StepsPassed)?;
            if let Err(reason) = self.health_check(&to).await {
                return self.fail_txn(txn, reason).await;
            }
        } else {
            self.advance(&mut txn, Event::StepsPassed)?;
        }
        self.advance(&mut txn, Event::Healthy)?;
        self.finish_commit(txn).await
    }

    /// Rolls `txn` back for `error`, which becomes the journalled reason:
    /// the text the bundle's status and event carry.
    async fn fail_txn(&mut self, mut txn: Txn, error: ApplyError) -> Result<(), EngineError> {
        let reason = error.to_string();
        tracing::warn!(bundle = %txn.bundle, "{}: {reason}", txn.describe());
        self.advance(&mut txn, Event::Failed { reason, retry: false })?;
        self.finish_rollback(txn).await
    }

    /// Restores every backed-up target, removes staged temps, re-runs the
    /// previous version's steps if targets were touched, records the
    /// outcome and closes the journal. Idempotent: recovery calls it again
    /// after a crash in the middle.
    async fn finish_rollback(&mut self, mut txn: Txn) -> Result<(), EngineError> {
        let Phase::RollingBack {
            reason,
            touched,
            retry,
            guarded,
        } = txn.phase.clone()
        else {
            return Err(EngineError::NotRollingBack {
                bundle: txn.bundle.clone(),
                phase: txn.phase.name(),
            });
        };
        // A bundle without steps or health check runs no code of its own:
        // a crash in those phases was the agent's, not the bundle's.
        let guarded = guarded
            && txn
                .to
                .as_ref()
                .is_some_and(|m| !m.steps.is_empty() || m.health.is_some());
        let backup_dir = self.dirs.txn(txn.seq);
        self.give_back(&txn, touched);
        let unrestorable = if touched {
            self.restore_backups(&txn, &backup_dir)?
        } else {
            Vec::new()
        };
        self.remove_temps(&txn);
        let message = self.rollback_message(&txn, reason, &unrestorable, touched).await;
        let renewal_retry = txn
            .renewal
            .then(|| self.clock.now_ms().saturating_add(RENEW_RETRY_MS));
        let how = RolledBack {
            touched,
            retry,
            guarded,
            renewal_retry,
        };
        let (version, verdict, kind, retry_at_ms) = self.rollback_verdict(&txn, message, &how);
        let message = verdict.message.clone();
        let interrupted = self.state.bundles.get(&txn.bundle).map_or(0, |r| r.interrupted);
        self.set_status(&txn.bundle, &version, verdict)?;
        if let Some(r) = self.state.bundles.get_mut(&txn.bundle) {
            r.interrupted = if kind == "interrupted" { interrupted } else { 0 };
            r.retry_at_ms = retry_at_ms;
            if let Some(at) = renewal_retry {
                r.renew_retry_at_ms = at;
            }
        }
        self.record_apply(&txn.bundle, &version, kind, &message);
        self.save_state()?;
        fault::point("state-saved");
        self.advance(&mut txn, Event::Finished)?;
        let _ = fsutil::remove_dir_all(&backup_dir);
        self.event(kind, &txn.bundle.clone(), &version, &message);
        self.publish();
        // Reported: what the switches replaced may be freed now.
        self.retired.release();
        Ok(())
    }

    /// Restores every backed-up target of `txn` from `backup_dir`; returns
    /// why each one that cannot be restored was left as found.
    fn restore_backups(&mut self, txn: &Txn, backup_dir: &Path) -> Result<Vec<String>, EngineError> {
        let mut unrestorable = Vec::new();
        let mut first = true;
        for plan in &txn.plans {
            let Some(content) = &plan.backup else { continue };
            // A parent swapped since the switch for a symlink out of the
            // root (or for a file) can never be restored through: writing
            // there would leave the root, and failing here would keep the
            // journal open and wedge every later apply, heal and renewal.
            if let Some(why) = self.unreachable(&plan.path) {
                tracing::warn!(path = %plan.path, "not restored during rollback: {why}");
                unrestorable.push(why.to_string());
                continue;
            }
            self.restore(backup_dir, plan, content)
                .map_err(|error| EngineError::Restore {
                    path: plan.path.clone(),
                    error: Box::new(error),
                })?;
            if first {
                fault::point("rollback-partial");
                first = false;
            }
        }
        Ok(unrestorable)
    }

    /// The rollback's reason, with what was left unrestored and, when
    /// targets were touched, the outcome of re-running the previous
    /// version's steps.
    async fn rollback_message(
        &mut self,
        txn: &Txn,
        reason: String,
        unrestorable: &[String],
        touched: bool,
    ) -> String {
        let mut message = reason;
        if !unrestorable.is_empty() {
            message = format!(
                "{message}; not restored, left as found: {}",
                unrestorable.join("; ")
            );
        }
        if touched && let Some(from) = &txn.from {
            if let Err(e) = self.run_steps(from).await {
                message = format!(
                    "{message}; re-running the steps of {}@{} also failed: {e}",
                    from.name, from.version
                );
            }
        }
        message
    }

    /// What a finished rollback leaves: the version the status names, its
    /// verdict, the event kind and when to try again (0: not on a timer).
    fn rollback_verdict(
        &mut self,
        txn: &Txn,
        message: String,
        how: &RolledBack,
    ) -> (String, Verdict, &'static str, i64) {
        let verdict = |state, message, sticky| Verdict {
            state,
            message,
            sticky,
        };
        match (&txn.to, &txn.from) {
            // A renewal that failed leaves the version applied, with the
            // pair it had: tried again later.
            (Some(to), _) if txn.renewal => (
                to.version.clone(),
                verdict(
                    BundleState::Applied,
                    format!(
                        "certificate renewal rolled back: {message}; keeping the current certificates, \
                         trying again at {}",
                        rfc3339(how.renewal_retry.unwrap_or_default())
                    ),
                    None,
                ),
                "renewal_failed",
                0,
            ),
            // A crash in the agent's own phases says nothing about the
            // bundle: try again, however often it happens.
            (Some(to), _) if how.retry && !how.guarded => (
                to.version.clone(),
                verdict(
                    BundleState::Pending,
                    format!("{message}; rolled back, will retry"),
                    None,
                ),
                "interrupted",
                0,
            ),
            (Some(to), _) if how.retry => {
                let (v, retry_at_ms) = self.count_interruption(txn, message);
                (to.version.clone(), v, "interrupted", retry_at_ms)
            }
            (Some(to), _) if how.touched => (
                to.version.clone(),
                verdict(BundleState::RolledBack, message, Some(txn.key.clone())),
                "rolled_back",
                0,
            ),
            (Some(to), _) => (
                to.version.clone(),
                verdict(BundleState::Failed, message, None),
                "failed",
                0,
            ),
            (None, Some(from)) => (
                from.version.clone(),
                verdict(BundleState::Failed, format!("removal failed: {message}"), None),
                "failed",
                0,
            ),
            (None, None) => (
                String::new(),
                verdict(BundleState::Failed, message, None),
                "failed",
                0,
            ),
        }
    }

    /// Counts an interruption of a guarded phase: after
    /// [`MAX_INTERRUPTED`] in a row the bundle is given up on until a
    /// backed-off time; before, it is tried again. Returns the verdict and
    /// that time (0 when not given up).
    fn count_interruption(&mut self, txn: &Txn, message: String) -> (Verdict, i64) {
        let mut retry_at_ms = 0;
        // Finishing this rollback again after a crash must not count
        // its interruption twice.
        let rec = self.state.bundles.get(&txn.bundle);
        let fresh = u32::from(rec.is_none_or(|r| r.counted_txn != Some(txn.seq)));
        let n = rec.map_or(0, |r| r.interrupted) + fresh;
        let v = if n >= MAX_INTERRUPTED {
            let gave_up = rec.map_or(0, |r| r.gave_up) + fresh;
            retry_at_ms = match rec.map_or(0, |r| r.retry_at_ms) {
                at if fresh == 0 && at > 0 => at,
                _ => self
                    .clock
                    .now_ms()
                    .saturating_add(give_up_backoff_ms(gave_up.max(1))),
            };
            if let Some(r) = self.state.bundles.get_mut(&txn.bundle) {
                r.gave_up = gave_up;
            }
            Verdict {
                state: BundleState::Failed,
                message: format!(
                    "gave up after {n} interrupted attempts: {message}; trying again at {} \
                     (or now with `lksctl node retry {}`)",
                    rfc3339(retry_at_ms),
                    self.node
                ),
                sticky: Some(txn.key.clone()),
            }
        } else {
            Verdict {
                state: BundleState::Pending,
                message: format!("{message}; rolled back, will retry"),
                sticky: None,
            }
        };
        if let Some(r) = self.state.bundles.get_mut(&txn.bundle) {
            r.interrupted = n;
            r.counted_txn = Some(txn.seq);
        }
        (v, retry_at_ms)
    }

    /// Records the new version (and the originals it took over), closes the
    /// journal and drops the backups. Idempotent, like `finish_rollback`.
    async fn finish_commit(&mut self, mut txn: Txn) -> Result<(), EngineError> {
        let backup_dir = self.dirs.txn(txn.seq);
        self.remove_temps(&txn);
        let now = self.clock.now_ms();
        let (kind, version) = match &txn.to {
            Some(to) => {
                let mut originals = txn.kept_originals.clone();
                for plan in txn.plans.iter().filter(|p| p.newly_owned) {
                    let content = match &plan.backup {
                        Some(Content::File {
                            digest,
                            size,
                            mode,
                            stored,
                        }) => {
                            let keep = self.keep_original(&backup_dir.join(stored), digest)?;
                            Content::File {
                                digest: *digest,
                                size: *size,
                                mode: *mode,
                                stored: keep,
                            }
                        }
                        _ => Content::Absent,
                    };
                    originals.push(OriginalRec {
                        path: plan.path.clone(),
                        content,
                    });
                }
                let rec = self.state.bundles.entry(txn.bundle.clone()).or_insert_with(|| {
                    BundleRecord::new(StatusRec {
                        version: to.version.clone(),
                        state: BundleState::Applied,
                        message: String::new(),
                        updated_at_ms: now,
                    })
                });
                rec.installed = Some(to.clone());
                rec.originals = originals;
                rec.status = StatusRec {
                    version: to.version.clone(),
                    state: BundleState::Applied,
                    message: String::new(),
                    updated_at_ms: now,
                };
                rec.clear_failures();
                rec.gave_up = 0;
                rec.renew_retry_at_ms = 0;
                (
                    if txn.renewal { "renewed" } else { "applied" },
                    to.version.clone(),
                )
            }
            None => {
                self.state.bundles.remove(&txn.bundle);
                (
                    "removed",
                    txn.from.as_ref().map(|f| f.version.clone()).unwrap_or_default(),
                )
            }
        };
        self.record_apply(&txn.bundle, &version, kind, "");
        self.save_state()?;
        fault::point("state-saved");
        // Before the journal closes: a restart here commits again, and
        // recording the same version twice is one record.
        if kind == "applied"
            && let (Some(to), Some(r)) = (&txn.to, &self.reboots)
            && to.reboot.is_required()
        {
            r.bundle_applied(&to.id(), now);
        }
        self.advance(&mut txn, Event::Finished)?;
        let _ = fsutil::remove_dir_all(&backup_dir);
        let bundle = txn.bundle.clone();
        let fetched = self
            .state
            .bundles
            .get(&bundle)
            .map_or((0, 0), |r| r.fetched_for(&version));
        let message = match fetched {
            (0, 0) => format!("{kind} {bundle}@{version}"),
            (s, p) => format!(
                "{kind} {bundle}@{version}; fetched {:.1} MiB: {:.1} MiB from the control server, {:.1} MiB from peers",
                (s + p) as f64 / MIB,
                s as f64 / MIB,
                p as f64 / MIB
            ),
        };
        self.event_with(kind, &bundle, &version, &message, fetched);
        self.publish();
        // Reported: what the switches replaced may be freed now.
        self.retired.release();
        Ok(())
    }

    /// Copies a backup into the originals store (content-addressed).
    fn keep_original(&self, backup: &Path, digest: &Digest) -> Result<String, EngineError> {
        let dir = self.dirs.originals();
        fsutil::create_dir(&dir, 0o700)?;
        let name = digest.hex();
        let dst = dir.join(&name);
        if dst.is_file() {
            return Ok(name);
        }
        let bytes = fs::read(backup).map_err(|e| FsError::new("read backup", backup, e))?;
        fsutil::write_atomic(&dst, &bytes, 0o600)?;
        Ok(name)
    }

    fn env(&self, m: &Manifest) -> Vec<(String, String)> {
        vec![
            ("LKS_ROOT".into(), self.root_path.to_string_lossy().into_owned()),
            ("LKS_BUNDLE".into(), m.name.clone()),
            ("LKS_VERSION".into(), m.version.clone()),
            ("LKS_NODE".into(), self.node.clone()),
        ]
    }

    async fn run_steps(&self, m: &Manifest) -> Result<(), ApplyError> {
        self.run_these_steps(m, &m.steps).await
    }

    /// The steps a heal pass runs after restoring a file of `m`
    /// (`on_heal`), in order, as apply runs them; the first failure stops
    /// them.
    pub(super) async fn run_heal_steps(&self, m: &Manifest) -> Result<(), ApplyError> {
        self.run_these_steps(m, m.heal_steps()).await
    }

    async fn run_these_steps<'a>(
        &self,
        m: &Manifest,
        steps: impl IntoIterator<Item = &'a Step>,
    ) -> Result<(), ApplyError> {
        for s in steps {
            let out = self
                .runner
                .run(&CommandSpec {
                    argv: s.run.clone(),
                    env: self.env(m),
                    timeout: s.timeout,
                })
                .await;
            if !out.success() {
                return Err(ApplyError::Step {
                    name: s.name.clone(),
                    outcome: out,
                });
            }
        }
        Ok(())
    }

    pub(super) async fn health_check(&self, m: &Manifest) -> Result<(), ApplyError> {
        let Some(h) = &m.health else { return Ok(()) };
        let spec = CommandSpec {
            argv: h.run.clone(),
            env: self.env(m),
            timeout: h.timeout,
        };
        let tries = h.retries.max(1);
        let mut last = Outcome::SpawnFailed {
            reason: "not run".into(),
        };
        for attempt in 1..=tries {
            last = self.runner.run(&spec).await;
            if last.success() {
                return Ok(());
            }
            if attempt < tries {
                tokio::time::sleep(h.interval).await;
            }
        }
        Err(ApplyError::HealthCheck { tries, last })
    }
}

/// How a rollback went, for its verdict.
struct RolledBack {
    /// Targets were switched, so backups were restored.
    touched: bool,
    /// A crash interrupted the transaction (not the bundle failing).
    retry: bool,
    /// The crash came in a phase that runs the bundle's own code.
    guarded: bool,
    /// A failed renewal is tried again at this time.
    renewal_retry: Option<i64>,
}
