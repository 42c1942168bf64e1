//! Signed release records on this node (issue [trust]): the trust journal
//! (`trust.json`) and the checks the engine makes with it before it
//! applies or removes anything.
//!
//! The rules themselves are the shared ones ([`lks_proto::release`]); this
//! module keeps their state durable and turns their verdicts into what the
//! node reports:
//!
//! - **Off** (`trust_threshold` 0 in `join.toml`, the default): nothing
//!   here does anything; a desired state's release and roots are ignored.
//! - **On**: every desired state's root rotations are applied in version
//!   order (stopping at the first refused), then its release is offered to
//!   [`TrustState::accept_release`]. What is accepted is written to
//!   `trust.json` (temp file, fsync, rename, fsync of the directory)
//!   *before* the engine acts on it. A bundle is applied at a new version
//!   only if the current release names exactly that version and manifest
//!   digest and has not expired ([`Trust::admits`]); a bundle the current
//!   release still names is not removed ([`Trust::keeps`]). Once that
//!   release has expired the node reports `stale-release`, whatever it
//!   refused since (a refusal stays in the message as detail): a stale
//!   server replaying an older release must not hide the freeze.
//! - **Broken**: `trust.json` could not be read or does not hold together.
//!   It is never reset silently (that would let a server roll the node
//!   back): the node reports `refused` naming the file, applies no new
//!   version and removes nothing; drift repair goes on.
//!
//! Clock guard: a clock reading more than [`CLOCK_TOLERANCE_MS`] earlier
//! than the latest time the node accepted signed metadata at is reported
//! (`clock`) and nothing is accepted or applied. Within the tolerance (an
//! NTP step back) the latest known time is used as "now", so the shared
//! rules, which allow no step back at all, accept it.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use lks_proto::fsutil::{self, FsError};
use lks_proto::release::{Release, SignedRelease, SignedRoot, TrustError, TrustRoot, TrustState};
use lks_proto::sign::PublisherKey;
use lks_proto::{Digest, pb};
use prost::Message;

use crate::apply::report::TrustReport;
use crate::clock::rfc3339;

/// How far the clock may read behind the latest known time before the
/// node refuses to trust it (an NTP correction steps back by less).
pub const CLOCK_TOLERANCE_MS: i64 = 60_000;

/// Re-accepting the release the node already holds only raises the latest
/// known time; that alone is written down at most this often (the guard
/// loses at most this much after a crash).
const KNOWN_TIME_WRITE_STEP_MS: i64 = 600_000;

/// The longest the engine sleeps before looking at the release's expiry
/// again (the wall clock may jump meanwhile).
const MAX_WAKEUP_MS: i64 = 3_600_000;

/// `trust.json`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrustFile {
    /// Root, highest release version and its digest, latest known time.
    pub state: TrustState,
    /// The accepted signed release: standard base64 of its protobuf
    /// encoding (`lks.v1.SignedRelease`), checked again when read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    /// Why the last release or root the server sent was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Refusal>,
}

/// The node's trust condition, as `TrustStatus.state` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Condition {
    Ok,
    StaleRelease,
    NoRelease,
    Refused,
    Clock,
}

impl Condition {
    pub fn as_str(self) -> &'static str {
        match self {
            Condition::Ok => "ok",
            Condition::StaleRelease => "stale-release",
            Condition::NoRelease => "no-release",
            Condition::Refused => "refused",
            Condition::Clock => "clock",
        }
    }
}

/// A refusal, reported until a later desired state settles it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Refusal {
    pub condition: Condition,
    /// The error's text (the one line operators read).
    pub message: String,
    /// What makes two refusals the same reason: the text without the
    /// clock's reading, so a reason is reported (and evented) once.
    pub key: String,
}

impl Refusal {
    fn of(e: &TrustError) -> Self {
        let (condition, key) = match e {
            TrustError::Expired {
                channel, version, at, ..
            } => (Condition::StaleRelease, expiry_key(channel, *version, *at)),
            TrustError::ClockWentBack { latest_known, .. } => {
                (Condition::Clock, format!("clock {latest_known}"))
            }
            TrustError::RootExpired { version, at, .. } => {
                (Condition::Refused, format!("root expired {version} {at}"))
            }
            other => (Condition::Refused, other.to_string()),
        };
        Refusal {
            condition,
            message: e.to_string(),
            key,
        }
    }

    /// Whether this is the refusal of `r` itself for having expired (the
    /// server offering the node's own release again after its expiry).
    fn is_expiry_of(&self, r: &Release) -> bool {
        self.key == expiry_key(&r.channel, r.version, r.expires_at_ms)
    }
}

/// The [`Refusal::key`] of an expired release: one reason whatever the
/// clock read when it was seen.
fn expiry_key(channel: &str, version: u64, at: i64) -> String {
    format!("expired {channel} {version} {at}")
}

/// Why a bundle version is not applied (or a bundle not removed): the
/// bundle's status message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAdmitted {
    #[error("not released: {0}")]
    NotReleased(TrustError),
    #[error(
        "release expired: {release} expired at {} (the publisher must sign a fresh release)",
        rfc3339(*.at)
    )]
    Expired { release: String, at: i64 },
    #[error("no release: this node has accepted no signed release of {channel} yet")]
    NoRelease { channel: String },
    #[error("clock: {0}")]
    Clock(String),
    #[error("trust state unreadable: {0}")]
    Broken(String),
}

/// What the node trusts, and in what condition.
#[derive(Debug)]
pub struct Trust {
    path: PathBuf,
    channel: String,
    mode: Mode,
}

#[derive(Debug)]
enum Mode {
    Off,
    /// `trust.json` unreadable, or trust misconfigured: the one line why.
    Broken(String),
    On(Box<On>),
}

#[derive(Debug)]
struct On {
    file: TrustFile,
    /// The decoded form of `file.release`.
    release: Option<Release>,
    /// Set while the clock reads too far behind the latest known time
    /// (kept while the reason is the same, so its text stays put).
    clock: Option<Refusal>,
}

impl Trust {
    /// Trust off: today's behaviour.
    pub fn off() -> Self {
        Trust {
            path: PathBuf::new(),
            channel: String::new(),
            mode: Mode::Off,
        }
    }

    /// Reads `path` without writing anything (for `status`). Off when
    /// `threshold` is 0; a missing file is the initial state built from
    /// `keys` and `threshold`.
    pub fn load(path: &Path, channel: &str, keys: Vec<PublisherKey>, threshold: u32) -> Self {
        let mode = if threshold == 0 {
            Mode::Off
        } else {
            match read(path, keys, threshold) {
                Ok(on) => Mode::On(Box::new(on)),
                Err(why) => Mode::Broken(why.to_string()),
            }
        };
        Trust {
            path: path.to_path_buf(),
            channel: channel.to_string(),
            mode,
        }
    }

    /// [`Trust::load`], then writes the initial state if there was no file
    /// yet, so the journal exists from the first start on.
    pub fn open(path: &Path, channel: &str, keys: Vec<PublisherKey>, threshold: u32) -> Self {
        let mut t = Self::load(path, channel, keys, threshold);
        if let Mode::On(on) = &t.mode
            && !path.exists()
            && let Err(e) = write(path, &on.file)
        {
            t.mode = Mode::Broken(e.to_string());
        }
        t
    }

    pub fn is_on(&self) -> bool {
        !matches!(self.mode, Mode::Off)
    }

    /// The release the node follows, if any.
    pub fn release(&self) -> Option<&Release> {
        match &self.mode {
            Mode::On(on) => on.release.as_ref(),
            _ => None,
        }
    }

    /// The persisted state, if trust is on and readable.
    pub fn state(&self) -> Option<&TrustState> {
        match &self.mode {
            Mode::On(on) => Some(&on.file.state),
            _ => None,
        }
    }

    /// Takes in a desired state's root rotations and release (module doc):
    /// persisted before it returns. Returns the reason of a refusal that is
    /// new (not the one already reported), for the `release_refused` event.
    pub fn update(
        &mut self,
        release: Option<&Result<SignedRelease, TrustError>>,
        roots: &[Result<SignedRoot, TrustError>],
        now_ms: i64,
    ) -> Result<Option<String>, FsError> {
        let Mode::On(on) = &mut self.mode else {
            return Ok(None);
        };
        let now = match effective_now(&on.file.state, now_ms) {
            Ok(now) => {
                on.clock = None;
                now
            }
            Err(e) => {
                let r = Refusal::of(&e);
                let news = on.clock.as_ref().is_none_or(|c| c.key != r.key);
                if news {
                    on.clock = Some(r.clone());
                }
                return Ok(news.then_some(r.message));
            }
        };
        let mut next = on.file.clone();
        let mut refusal: Option<Refusal> = None;
        let mut accepted: Option<(Release, String)> = None;
        let mut ordered: Vec<&Result<SignedRoot, TrustError>> = roots.iter().collect();
        ordered.sort_by_key(|r| r.as_ref().map_or(u64::MAX, |s| s.root.version));
        for r in ordered {
            match r {
                Ok(s) if s.root.version <= next.state.root.version => {}
                Ok(s) => match next.state.accept_root(s, now) {
                    Ok(()) => tracing::info!(version = s.root.version, "trust root rotated"),
                    Err(e) => {
                        refusal = Some(Refusal::of(&e));
                        break;
                    }
                },
                Err(e) => {
                    refusal = Some(Refusal::of(e));
                    break;
                }
            }
        }
        match release {
            None => {}
            Some(Err(e)) => {
                refusal.get_or_insert_with(|| Refusal::of(e));
            }
            Some(Ok(s)) => match next.state.accept_release(s, &self.channel, now) {
                Ok(r) => {
                    if Some(&r) != on.release.as_ref() {
                        let encoded = pb::SignedRelease::from(s).encode_to_vec();
                        accepted = Some((r, base64::engine::general_purpose::STANDARD.encode(encoded)));
                    }
                }
                Err(e) => {
                    refusal.get_or_insert_with(|| Refusal::of(&e));
                }
            },
        }
        if let Some((_, b64)) = &accepted {
            next.release = Some(b64.clone());
        }
        let news = refusal
            .as_ref()
            .filter(|r| on.file.refusal.as_ref().is_none_or(|old| old.key != r.key))
            .map(|r| r.message.clone());
        // The same reason keeps its first text (the clock's reading in it
        // would change every time).
        next.refusal = match (refusal, &on.file.refusal) {
            (Some(r), Some(old)) if old.key == r.key => Some(old.clone()),
            (r, _) => r,
        };
        let only_time = TrustFile {
            state: TrustState {
                latest_known_time_ms: on.file.state.latest_known_time_ms,
                ..next.state.clone()
            },
            ..next.clone()
        } == on.file;
        let time_moved = next.state.latest_known_time_ms - on.file.state.latest_known_time_ms;
        if !only_time || time_moved >= KNOWN_TIME_WRITE_STEP_MS {
            write(&self.path, &next)?;
        }
        if let Some((r, _)) = accepted {
            tracing::info!(release = r.version, channel = %r.channel, "signed release accepted");
            on.release = Some(r);
        }
        on.file = next;
        Ok(news)
    }

    /// Looks at the clock again (the timer, a heal tick): the `clock`
    /// condition comes and goes with it.
    pub fn refresh(&mut self, now_ms: i64) {
        let Mode::On(on) = &mut self.mode else { return };
        match effective_now(&on.file.state, now_ms) {
            Ok(_) => on.clock = None,
            Err(e) => {
                let r = Refusal::of(&e);
                if on.clock.as_ref().is_none_or(|c| c.key != r.key) {
                    on.clock = Some(r);
                }
            }
        }
    }

    /// Whether bundle `name` may be applied at `version` with this
    /// canonical manifest digest.
    pub fn admits(&self, name: &str, version: &str, digest: &Digest, now_ms: i64) -> Result<(), NotAdmitted> {
        let on = match &self.mode {
            Mode::Off => return Ok(()),
            Mode::Broken(why) => return Err(NotAdmitted::Broken(why.clone())),
            Mode::On(on) => on,
        };
        let now = effective_now(&on.file.state, now_ms).map_err(|e| {
            NotAdmitted::Clock(
                on.clock
                    .as_ref()
                    .map_or_else(|| e.to_string(), |c| c.message.clone()),
            )
        })?;
        let Some(release) = &on.release else {
            return Err(NotAdmitted::NoRelease {
                channel: self.channel.clone(),
            });
        };
        if release.is_expired(now) {
            return Err(NotAdmitted::Expired {
                release: release.id(),
                at: release.expires_at_ms,
            });
        }
        release
            .admits(name, version, digest)
            .map_err(NotAdmitted::NotReleased)
    }

    /// Why bundle `name` must not be removed although the desired state no
    /// longer lists it, if it must not (the rest of its status message).
    pub fn keeps(&self, name: &str) -> Option<String> {
        match &self.mode {
            Mode::Off => None,
            Mode::Broken(why) => Some(format!(
                "trust state unreadable ({why}); nothing is removed until it can be read"
            )),
            Mode::On(on) => on
                .release
                .as_ref()
                .filter(|r| r.bundles.contains_key(name))
                .map(|r| {
                    format!(
                        "{} still names {name} (the desired state omits it); \
                         removed once a release without it is accepted",
                        r.id()
                    )
                }),
        }
    }

    /// What the node reports at `now_ms`.
    pub fn report(&self, now_ms: i64) -> TrustReport {
        let on = match &self.mode {
            Mode::Off => return TrustReport::default(),
            Mode::Broken(why) => {
                return TrustReport {
                    enabled: true,
                    state: Condition::Refused.as_str().into(),
                    message: why.clone(),
                    ..TrustReport::default()
                };
            }
            Mode::On(on) => on,
        };
        let mut report = TrustReport {
            enabled: true,
            state: String::new(),
            message: String::new(),
            release_version: on.release.as_ref().map_or(0, |r| r.version),
            release_expires_at_ms: on.release.as_ref().map_or(0, |r| r.expires_at_ms),
            root_version: on.file.state.root.version,
        };
        let now = now_ms.max(on.file.state.latest_known_time_ms);
        let expired = on.release.as_ref().filter(|r| r.is_expired(now));
        let (condition, message) = if let Some(c) = &on.clock {
            (c.condition, c.message.clone())
        } else if let Some(r) = expired {
            // Expiry outranks a refusal: a stale server (one restored from
            // a backup) that keeps replaying an older release keeps its
            // refusal alive for ever, and the freeze it causes must still
            // show as `stale-release`. The refusal stays as detail.
            (
                Condition::StaleRelease,
                stale_message(r, on.file.refusal.as_ref()),
            )
        } else if let Some(r) = &on.file.refusal {
            (r.condition, r.message.clone())
        } else if on.release.is_some() {
            (Condition::Ok, String::new())
        } else {
            (
                Condition::NoRelease,
                format!("no signed release of {} accepted yet", self.channel),
            )
        };
        report.state = condition.as_str().into();
        report.message = message;
        report
    }

    /// How long until the current release expires, when it has not yet
    /// (capped, so a jumping clock is looked at again).
    pub fn wakeup_ms(&self, now_ms: i64) -> Option<i64> {
        let Mode::On(on) = &self.mode else { return None };
        let r = on.release.as_ref()?;
        let now = now_ms.max(on.file.state.latest_known_time_ms);
        (!r.is_expired(now)).then(|| (r.expires_at_ms - now).clamp(0, MAX_WAKEUP_MS))
    }
}

/// Why the node is stale: its release `r` expired; and `refusal`, the last
/// release or root the server sent that was refused, unless it is only
/// `r` itself offered again (its expiry is said already).
fn stale_message(r: &Release, refusal: Option<&Refusal>) -> String {
    let stale = format!(
        "{} expired at {}; keeping what is installed until a fresh release is accepted",
        r.id(),
        rfc3339(r.expires_at_ms)
    );
    match refusal {
        Some(x) if !x.is_expiry_of(r) => {
            format!(
                "{stale}; the server's last release or root was refused: {}",
                x.message
            )
        }
        _ => stale,
    }
}

/// `now_ms`, or the latest known time when the clock reads up to
/// [`CLOCK_TOLERANCE_MS`] behind it; an error when it reads further back.
fn effective_now(state: &TrustState, now_ms: i64) -> Result<i64, TrustError> {
    let latest = state.latest_known_time_ms;
    if now_ms < latest.saturating_sub(CLOCK_TOLERANCE_MS) {
        return Err(TrustError::ClockWentBack {
            now: now_ms,
            latest_known: latest,
        });
    }
    Ok(now_ms.max(latest))
}

fn write(path: &Path, file: &TrustFile) -> Result<(), FsError> {
    fsutil::write_json(path, file, 0o600)
}

/// Why `trust.json` cannot be taken as the "on" state: the one line
/// `status` shows.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    File(#[from] FsError),
    #[error("the configured trust: {0}")]
    Configured(#[source] Box<TrustError>),
    #[error("{}: release: {source}", path.display())]
    Release {
        path: PathBuf,
        #[source]
        source: ReleaseError,
    },
    #[error("{}: {source}", path.display())]
    Root {
        path: PathBuf,
        #[source]
        source: Box<TrustError>,
    },
    #[error("{}: the stored release does not match release {version} it records", path.display())]
    Mismatch { path: PathBuf, version: u64 },
}

/// Why the release `trust.json` keeps could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("{0}")]
    Base64(#[from] base64::DecodeError),
    #[error("{0}")]
    Decode(#[from] prost::DecodeError),
    #[error("{0}")]
    Trust(#[from] Box<TrustError>),
}

/// The release `trust.json` keeps (base64 of a `SignedRelease`).
fn decode_release(b64: &str) -> Result<Release, ReleaseError> {
    let raw = base64::engine::general_purpose::STANDARD.decode(b64)?;
    let msg = pb::SignedRelease::decode(raw.as_slice())?;
    Ok(SignedRelease::try_from(msg).map_err(Box::new)?.release)
}

/// Reads `trust.json` into the "on" state.
fn read(path: &Path, keys: Vec<PublisherKey>, threshold: u32) -> Result<On, ReadError> {
    let Some(bytes) = fsutil::read_optional(path)? else {
        let root = TrustRoot::initial(keys, threshold).map_err(|e| ReadError::Configured(Box::new(e)))?;
        return Ok(On {
            file: TrustFile {
                state: TrustState::new(root),
                release: None,
                refusal: None,
            },
            release: None,
            clock: None,
        });
    };
    let file: TrustFile = fsutil::parse_json(path, &bytes)?;
    let release = match &file.release {
        None => None,
        Some(b64) => Some(decode_release(b64).map_err(|source| ReadError::Release {
            path: path.to_path_buf(),
            source,
        })?),
    };
    let s = &file.state;
    file.state.root.validate().map_err(|e| ReadError::Root {
        path: path.to_path_buf(),
        source: Box::new(e),
    })?;
    let holds = match &release {
        None => s.release_version == 0,
        Some(r) => r.version == s.release_version && Some(r.digest()) == s.release_digest,
    };
    if !holds {
        return Err(ReadError::Mismatch {
            path: path.to_path_buf(),
            version: s.release_version,
        });
    }
    Ok(On {
        file,
        release,
        clock: None,
    })
}

#[cfg(test)]
mod tests;
