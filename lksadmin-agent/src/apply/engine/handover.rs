//! The engine's side of a self-update (see [`crate::apply::selfupdate`]): stage
//! and hand over, pick up a hand-over after a restart, commit.

use std::path::{Path, PathBuf};

use lks_proto::elf::ElfError;
use lks_proto::{BundlePath, BundleState, Digest, Manifest};

use super::{Engine, EngineError, Verdict};
use crate::apply::selfupdate::{self, HANDING_OVER, Paths, Pending, ROLLED_BACK, TRYING};
use crate::apply::state::{BundleRecord, StatusRec};

impl Engine {
    fn su_paths(&self) -> Paths {
        Paths::new(self.dirs.path())
    }

    /// True once a self-update is staged and this process should exit with
    /// [`selfupdate::HANDOVER_EXIT`].
    pub fn handover_requested(&self) -> bool {
        self.handover
    }

    /// True while this process is a new agent that has not committed yet.
    pub fn on_trial(&self) -> bool {
        self.on_trial.is_some()
    }

    /// Verifies and stages the new binary of a self-update bundle (its
    /// blob is cached and verified), then asks for the hand-over.
    pub(super) async fn hand_over(&mut self, m: &Manifest, key: String) -> Result<(), EngineError> {
        let (name, version) = (m.name.as_str(), m.version.as_str());
        let f = &m.files[0];
        let own = match self.self_update_refusal(m) {
            Ok(own) => own,
            Err(why) => return self.fail_once(name, version, why.to_string(), Some(key)),
        };
        let paths = self.su_paths();
        lks_proto::fsutil::create_dir(&paths.dir, 0o700)?;
        let staged = paths.new_binary();
        if let Err(e) = stage_binary(&self.cache.blob_path(&f.digest), &staged, &f.digest) {
            paths.clear();
            return self.fail_once(
                name,
                version,
                format!("self-update: stage the new binary: {e}"),
                None,
            );
        }
        let new_version = match selfupdate::test_run(&staged).await {
            Ok(v) => v,
            Err(e) => {
                paths.clear();
                return self.fail_once(
                    name,
                    version,
                    format!("self-update refused: the new agent binary {e}"),
                    Some(key),
                );
            }
        };
        let own_digest = selfupdate::file_digest(&own).ok();
        if own_digest == Some(f.digest) {
            // Already running exactly this binary (installed by a package).
            paths.clear();
            return self.record_self_update(m, "this agent already runs that binary");
        }
        self.save_hand_over(m, key, &new_version, &own, own_digest, &paths)?;
        let message = format!(
            "handing over from agent {} to {new_version}",
            crate::node::facts::AGENT_VERSION
        );
        self.set_status(
            name,
            version,
            Verdict {
                state: BundleState::Applying,
                message: message.clone(),
                sticky: None,
            },
        )?;
        self.event("self_update", name, version, &message);
        tracing::warn!(
            bundle = name,
            version,
            "{message}: exiting for the guard to switch binaries"
        );
        self.handover = true;
        Ok(())
    }

    /// Why this agent will not take the self-update `m`: its own binary
    /// cannot be found, `m` would replace another file, or the new binary
    /// is not for this host. Otherwise the path this agent runs from.
    fn self_update_refusal(&self, m: &Manifest) -> Result<PathBuf, Refusal> {
        let f = &m.files[0];
        let target = self.root_path.join(f.path.relative());
        let own = selfupdate::own_exe().map_err(Refusal::OwnExe)?;
        match target.canonicalize() {
            Ok(t) if t == own => {}
            _ => {
                return Err(Refusal::OtherFile {
                    path: f.path.clone(),
                    own,
                });
            }
        }
        let blob = self.cache.blob_path(&f.digest);
        match selfupdate::head(&blob, 64) {
            Ok(h) => match lks_proto::elf::check_for_host(&h) {
                Ok(_) => Ok(own),
                Err(source) => Err(Refusal::NotForHost {
                    path: f.path.clone(),
                    source,
                }),
            },
            Err(source) => Err(Refusal::Unreadable {
                path: f.path.clone(),
                source,
            }),
        }
    }

    /// Writes what the guard and the next start need to finish the
    /// hand-over: the manifest, then the pending record.
    fn save_hand_over(
        &self,
        m: &Manifest,
        key: String,
        new_version: &str,
        own: &Path,
        own_digest: Option<Digest>,
        paths: &Paths,
    ) -> Result<(), EngineError> {
        let mut p = Pending::default();
        p.set("PHASE", HANDING_OVER);
        p.set("BUNDLE", m.name.as_str());
        p.set("VERSION", m.version.as_str());
        p.set("KEY", key);
        p.set("NEW_SHA256", m.files[0].digest.hex());
        p.set("NEW_VERSION", new_version);
        p.set("OLD_VERSION", crate::node::facts::AGENT_VERSION);
        p.set("OLD_SHA256", own_digest.map(|d| d.hex()).unwrap_or_default());
        p.set("TARGET", own.display().to_string());
        p.set("DEADLINE_S", selfupdate::deadline().as_secs().to_string());
        p.set("STARTED_MS", self.clock.now_ms().to_string());
        let manifest = serde_json::to_vec(m).map_err(|e| {
            EngineError::Fs(lks_proto::fsutil::FsError::new(
                "encode",
                &paths.manifest(),
                std::io::Error::other(e),
            ))
        })?;
        lks_proto::fsutil::write_atomic(&paths.manifest(), &manifest, 0o600)?;
        p.save(&paths.pending())?;
        Ok(())
    }

    /// Picks up a hand-over after a restart: a new agent on trial waits to
    /// commit; an old agent brought back by the guard reports the
    /// rollback; a hand-over that never happened is reported.
    pub async fn resume_self_update(&mut self) -> Result<(), EngineError> {
        let paths = self.su_paths();
        let Some(p) = Pending::load(&paths.pending())? else {
            return Ok(());
        };
        let (name, version) = (p.get("BUNDLE").to_string(), p.get("VERSION").to_string());
        let own = selfupdate::own_exe()
            .and_then(|e| selfupdate::file_digest(&e))
            .map(|d| d.hex())
            .unwrap_or_default();
        let running_new = !own.is_empty() && own == p.get("NEW_SHA256");
        match p.get("PHASE") {
            TRYING | HANDING_OVER if running_new => {
                let message = format!(
                    "agent {} started; committing once reconnected",
                    p.get("NEW_VERSION")
                );
                tracing::info!(bundle = %name, version = %version, "{message}");
                self.set_status(
                    &name,
                    &version,
                    Verdict {
                        state: BundleState::Applying,
                        message,
                        sticky: None,
                    },
                )?;
                self.on_trial = Some(p);
            }
            ROLLED_BACK | TRYING => {
                let why = Pending::load(&paths.result())?
                    .map(|r| r.get("REASON").to_string())
                    .filter(|r| !r.is_empty())
                    .unwrap_or_else(|| "the previous agent binary is running again".into());
                let message = format!(
                    "self-update to agent {} rolled back to {}: {why}",
                    p.get("NEW_VERSION"),
                    crate::node::facts::AGENT_VERSION
                );
                self.set_status(
                    &name,
                    &version,
                    Verdict {
                        state: BundleState::RolledBack,
                        message: message.clone(),
                        sticky: Some(p.get("KEY").to_string()),
                    },
                )?;
                self.record_apply(&name, &version, "rolled_back", &message);
                self.save_state()?;
                self.event("rolled_back", &name, &version, &message);
                paths.clear();
            }
            _ => {
                // Restarted without the guard switching binaries: the unit
                // lacks the guard, or the agent was not run by systemd.
                // Reported once, not retried in a loop.
                let message = format!(
                    "self-update to agent {} did not happen: the agent restarted with the old binary; \
                     is lksadmin-agent.service's ExecStopPost=lksadmin-agent-guard in place? \
                     (`lksctl node retry` tries again)",
                    p.get("NEW_VERSION")
                );
                self.set_status(
                    &name,
                    &version,
                    Verdict {
                        state: BundleState::Failed,
                        message: message.clone(),
                        sticky: Some(p.get("KEY").to_string()),
                    },
                )?;
                self.event("failed", &name, &version, &message);
                paths.clear();
            }
        }
        self.publish();
        Ok(())
    }

    /// Commits the self-update this process is on trial for: it has
    /// started, loaded the state, reconnected and is about to report.
    pub fn commit_self_update(&mut self) -> Result<(), EngineError> {
        let Some(p) = self.on_trial.take() else {
            return Ok(());
        };
        let paths = self.su_paths();
        let m: Manifest = match read_record(&paths.manifest()) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!("self-update record unreadable ({e}); keeping this agent");
                paths.clear();
                return Ok(());
            }
        };
        // The record goes first: from here on the guard has nothing to undo.
        let _ = lks_proto::fsutil::remove_file_durable(&paths.pending());
        let message = format!(
            "agent updated from {} to {}",
            p.get("OLD_VERSION"),
            p.get("NEW_VERSION")
        );
        self.record_self_update(&m, &message)?;
        paths.clear();
        Ok(())
    }

    /// Records a self-update as installed and applied.
    fn record_self_update(&mut self, m: &Manifest, message: &str) -> Result<(), EngineError> {
        let now = self.clock.now_ms();
        let rec = self.state.bundles.entry(m.name.clone()).or_insert_with(|| {
            BundleRecord::new(StatusRec {
                version: m.version.clone(),
                state: BundleState::Applied,
                message: String::new(),
                updated_at_ms: now,
            })
        });
        rec.installed = Some(m.clone());
        rec.originals.clear();
        rec.status = StatusRec {
            version: m.version.clone(),
            state: BundleState::Applied,
            message: String::new(),
            updated_at_ms: now,
        };
        rec.clear_failures();
        rec.gave_up = 0;
        self.record_apply(&m.name, &m.version, "applied", message);
        self.save_state()?;
        tracing::info!(bundle = %m.name, version = %m.version, "{message}");
        self.event("applied", &m.name.clone(), &m.version.clone(), message);
        self.publish();
        Ok(())
    }
}

/// Why this agent will not take a self-update: the one line its status
/// shows.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("self-update: find this agent's binary: {0}")]
    OwnExe(#[source] std::io::Error),
    #[error("self-update refused: it would replace {path} but this agent runs from {}", own.display())]
    OtherFile { path: BundlePath, own: PathBuf },
    #[error("self-update refused: {path} is {source}")]
    NotForHost {
        path: BundlePath,
        #[source]
        source: ElfError,
    },
    #[error("self-update refused: {path} is {source}")]
    Unreadable {
        path: BundlePath,
        #[source]
        source: std::io::Error,
    },
}

/// Why the new binary could not be staged for the guard.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("staged copy has digest {got}, expected {want}")]
    Digest { got: Digest, want: Digest },
}

/// Why the hand-over's manifest could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    Read(#[from] std::io::Error),
    #[error("{0}")]
    Parse(#[from] serde_json::Error),
}

/// The manifest `save_hand_over` wrote.
fn read_record(path: &Path) -> Result<Manifest, RecordError> {
    Ok(serde_json::from_slice(&std::fs::read(path)?)?)
}

/// A verified copy of `blob` at `staged`, executable, synced: what the
/// guard installs.
fn stage_binary(blob: &Path, staged: &Path, digest: &Digest) -> Result<(), StageError> {
    std::fs::copy(blob, staged)?;
    std::fs::set_permissions(staged, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    std::fs::File::open(staged)?.sync_all()?;
    match selfupdate::file_digest(staged)? {
        d if d == *digest => Ok(()),
        got => Err(StageError::Digest { got, want: *digest }),
    }
}
