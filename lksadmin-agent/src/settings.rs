//! Node-local settings for `run`: `/etc/lksadmin/agent.toml`, the conffile
//! the Debian package ships (all keys commented out).
//!
//! Not to be confused with `STATE_DIR/join.toml`, which `join` writes (see
//! [`crate::config`]; it was `STATE_DIR/agent.toml` before, and is still
//! read under that name). Every key here mirrors a flag of `run`; a flag given on
//! the command line wins over the file, and the file over the built-in
//! default. A missing default file means "all defaults"; an unreadable or
//! malformed one is an error, so that a typo never silently falls back.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lks_proto::authoring::toml_error;
use serde::Deserialize;

use crate::config::DEFAULT_STATE_DIR;
use crate::node::reboot::RebootSettings;
use crate::run::{DEFAULT_HEAL_INTERVAL, RunOptions};

/// Where `run` looks for its settings unless `--config` says otherwise.
pub const DEFAULT_SETTINGS_FILE: &str = "/etc/lksadmin/agent.toml";

/// Shortest heal interval accepted from a flag or the file: below this the
/// agent would spend its time hashing files.
const MIN_HEAL_INTERVAL: Duration = Duration::from_millis(100);

/// The settings file, parsed. `None`: not set in the file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub state_dir: Option<PathBuf>,
    pub root: Option<PathBuf>,
    pub heal_interval: Option<Duration>,
    pub peer_listen: Option<std::net::SocketAddr>,
    pub reboot: RebootKeys,
}

/// `reboot_sentinel`, `reboot_check`, `reboot_command` (file) and
/// `--reboot-sentinel`, `--reboot-check`, `--reboot-command` (flags).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RebootKeys {
    pub sentinel: Option<PathBuf>,
    pub check: Option<String>,
    pub command: Option<String>,
}

impl RebootKeys {
    /// Each one given here, else `other`'s.
    fn or(self, other: RebootKeys) -> RebootKeys {
        RebootKeys {
            sentinel: self.sentinel.or(other.sentinel),
            check: self.check.or(other.check),
            command: self.command.or(other.command),
        }
    }

    /// With the defaults for what neither gave.
    fn resolve(self) -> RebootSettings {
        let d = RebootSettings::default();
        RebootSettings {
            sentinel: self.sentinel.unwrap_or(d.sentinel),
            check: self.check,
            command: self.command.unwrap_or(d.command),
        }
    }

    /// Checks values from the file or a flag: an absolute sentinel path,
    /// commands that are not blank.
    pub fn check(&self) -> Result<(), InvalidSetting> {
        if let Some(p) = &self.sentinel
            && !p.is_absolute()
        {
            return Err(InvalidSetting::NotAbsolute {
                key: "reboot_sentinel",
                path: p.display().to_string(),
            });
        }
        for (key, v) in [("reboot_check", &self.check), ("reboot_command", &self.command)] {
            if v.as_deref().is_some_and(|c| c.trim().is_empty()) {
                return Err(InvalidSetting::EmptyCommand { key });
            }
        }
        Ok(())
    }
}

/// What `run` was given on the command line. `None`: flag not given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunFlags {
    pub state_dir: Option<PathBuf>,
    pub root: Option<PathBuf>,
    pub heal_interval: Option<Duration>,
    pub peer_listen: Option<std::net::SocketAddr>,
    pub reboot: RebootKeys,
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    // `error`, not `source`: the I/O error is part of this one line, not a
    // cause that anyhow's `{:#}` would print a second time.
    #[error("read {path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: InvalidSetting },
}

/// Why the text of a settings file was not accepted: one line naming the
/// line or the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSetting {
    /// Not TOML, or a key this agent does not know (the text names the
    /// line).
    #[error("{0}")]
    Toml(String),
    #[error("{key}: {path:?} must be an absolute path")]
    NotAbsolute { key: &'static str, path: String },
    #[error("heal_interval: {0}")]
    HealInterval(BadHealInterval),
    #[error("peer_listen: {0:?} is not IP:PORT")]
    PeerListen(String),
    #[error("{key}: an empty command")]
    EmptyCommand { key: &'static str },
}

/// Why a heal interval (flag or file) was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadHealInterval {
    /// Not a duration (the text says why).
    #[error("{0}")]
    Parse(lks_proto::duration::DurationError),
    #[error("{0:?} is too short; use at least 100ms")]
    TooShort(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    state_dir: Option<PathBuf>,
    root: Option<PathBuf>,
    heal_interval: Option<String>,
    peer_listen: Option<String>,
    reboot_sentinel: Option<PathBuf>,
    reboot_check: Option<String>,
    reboot_command: Option<String>,
}

/// Parses a heal interval (`60s`, `5m`, …) as the flag and the file accept it.
pub fn parse_heal_interval(s: &str) -> Result<Duration, BadHealInterval> {
    let d = lks_proto::duration::parse_duration(s).map_err(BadHealInterval::Parse)?;
    if d < MIN_HEAL_INTERVAL {
        return Err(BadHealInterval::TooShort(s.to_string()));
    }
    Ok(d)
}

impl Settings {
    /// Reads the settings file. When `required` is false (the default path,
    /// not named by the operator), a missing file yields all defaults.
    pub fn load(path: &Path, required: bool) -> Result<Settings, SettingsError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Settings::parse(&text).map_err(|reason| SettingsError::Invalid {
                path: path.to_path_buf(),
                reason,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => Ok(Settings::default()),
            Err(error) => Err(SettingsError::Read {
                path: path.to_path_buf(),
                error,
            }),
        }
    }

    /// Parses the text of a settings file; the error is one line naming the
    /// line and the key.
    pub fn parse(text: &str) -> Result<Settings, InvalidSetting> {
        let raw: RawSettings =
            toml::from_str(text).map_err(|e| InvalidSetting::Toml(toml_error(text, &e)))?;
        for (key, p) in [("state_dir", &raw.state_dir), ("root", &raw.root)] {
            if let Some(p) = p
                && !p.is_absolute()
            {
                return Err(InvalidSetting::NotAbsolute {
                    key,
                    path: p.display().to_string(),
                });
            }
        }
        let heal_interval = raw
            .heal_interval
            .as_deref()
            .map(parse_heal_interval)
            .transpose()
            .map_err(InvalidSetting::HealInterval)?;
        let peer_listen = raw
            .peer_listen
            .as_deref()
            .map(|s| {
                s.parse::<std::net::SocketAddr>()
                    .map_err(|_| InvalidSetting::PeerListen(s.to_string()))
            })
            .transpose()?;
        let reboot = RebootKeys {
            sentinel: raw.reboot_sentinel,
            check: raw.reboot_check,
            command: raw.reboot_command,
        };
        reboot.check()?;
        Ok(Settings {
            state_dir: raw.state_dir,
            root: raw.root,
            heal_interval,
            peer_listen,
            reboot,
        })
    }

    /// The options `run` uses: each flag given, else the file's value, else
    /// the default (for `root`: the one `join` stored).
    pub fn resolve(self, flags: RunFlags) -> RunOptions {
        RunOptions {
            state_dir: flags
                .state_dir
                .or(self.state_dir)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
            root: flags.root.or(self.root),
            heal_interval: flags
                .heal_interval
                .or(self.heal_interval)
                .unwrap_or(DEFAULT_HEAL_INTERVAL),
            peer_listen: flags.peer_listen.or(self.peer_listen),
            reboot: flags.reboot.or(self.reboot).resolve(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conffile the package ships: everything commented out.
    const SHIPPED: &str = include_str!("../../packaging/deb/agent.toml");

    #[test]
    fn shipped_conffile_is_all_defaults() {
        assert_eq!(Settings::parse(SHIPPED).unwrap(), Settings::default());
        let opts = Settings::parse(SHIPPED).unwrap().resolve(RunFlags::default());
        assert_eq!(opts.state_dir, PathBuf::from(DEFAULT_STATE_DIR));
        assert_eq!(opts.root, None);
        assert_eq!(opts.heal_interval, DEFAULT_HEAL_INTERVAL);
        assert_eq!(opts.reboot, RebootSettings::default());
        assert_eq!(opts.reboot.command, "systemctl reboot");
    }

    #[test]
    fn shipped_conffile_uncommented_parses() {
        // Each commented-out example in the shipped file is valid when enabled.
        let enabled: String = SHIPPED
            .lines()
            .map(|l| match l.strip_prefix('#') {
                Some(rest) if rest.contains(" = ") && !rest.starts_with(' ') => rest,
                _ => l,
            })
            .collect::<Vec<_>>()
            .join("\n");
        let s = Settings::parse(&enabled).unwrap();
        assert_eq!(s.state_dir, Some(PathBuf::from("/var/lib/lksadmin")));
        assert_eq!(s.root, Some(PathBuf::from("/")));
        assert_eq!(s.heal_interval, Some(Duration::from_secs(60)));
        assert_eq!(s.peer_listen, Some("10.0.0.5:7444".parse().unwrap()));
        assert_eq!(s.reboot.sentinel, Some(PathBuf::from("/var/run/reboot-required")));
        assert_eq!(s.reboot.check.as_deref(), Some("/usr/local/bin/needs-reboot"));
        assert_eq!(s.reboot.command.as_deref(), Some("systemctl reboot"));
    }

    #[test]
    fn reboot_keys_flow_flag_over_file_over_default() {
        let s = Settings::parse(
            "reboot_sentinel = \"/run/need-reboot\"\nreboot_command = \"/sbin/shutdown -r now\"\n",
        )
        .unwrap();
        let from_file = s.clone().resolve(RunFlags::default()).reboot;
        assert_eq!(from_file.sentinel, PathBuf::from("/run/need-reboot"));
        assert_eq!(from_file.command, "/sbin/shutdown -r now");
        assert_eq!(from_file.check, None);
        let flags = RunFlags {
            reboot: RebootKeys {
                command: Some("/bin/true".into()),
                check: Some("test -e /x".into()),
                sentinel: None,
            },
            ..RunFlags::default()
        };
        let both = s.resolve(flags).reboot;
        assert_eq!(both.command, "/bin/true");
        assert_eq!(both.check.as_deref(), Some("test -e /x"));
        assert_eq!(both.sentinel, PathBuf::from("/run/need-reboot"));
        for (text, want) in [
            (
                "reboot_sentinel = \"run/x\"",
                "reboot_sentinel: \"run/x\" must be an absolute path",
            ),
            ("reboot_command = \" \"", "reboot_command: an empty command"),
            ("reboot_check = \"\"", "reboot_check: an empty command"),
        ] {
            assert_eq!(Settings::parse(text).unwrap_err().to_string(), want);
        }
    }

    #[test]
    fn file_values_are_defaults_and_flags_win() {
        let s = Settings::parse("state_dir = \"/srv/lks\"\nroot = \"/mnt/node\"\nheal_interval = \"5m\"\n")
            .unwrap();
        let from_file = s.clone().resolve(RunFlags::default());
        assert_eq!(from_file.state_dir, PathBuf::from("/srv/lks"));
        assert_eq!(from_file.root, Some(PathBuf::from("/mnt/node")));
        assert_eq!(from_file.heal_interval, Duration::from_secs(300));

        let flags = RunFlags {
            state_dir: Some("/tmp/state".into()),
            root: Some("/tmp/root".into()),
            heal_interval: Some(Duration::from_secs(2)),
            peer_listen: Some("127.0.0.1:9".parse().unwrap()),
            reboot: RebootKeys::default(),
        };
        let from_flags = s.clone().resolve(flags.clone());
        assert_eq!(from_flags.state_dir, PathBuf::from("/tmp/state"));
        assert_eq!(from_flags.root, Some(PathBuf::from("/tmp/root")));
        assert_eq!(from_flags.heal_interval, Duration::from_secs(2));
        assert_eq!(from_flags.peer_listen, Some("127.0.0.1:9".parse().unwrap()));

        // One flag given: only that one overrides.
        let mixed = s.resolve(RunFlags {
            heal_interval: Some(Duration::from_secs(1)),
            ..RunFlags::default()
        });
        assert_eq!(mixed.state_dir, PathBuf::from("/srv/lks"));
        assert_eq!(mixed.heal_interval, Duration::from_secs(1));
    }

    #[test]
    fn malformed_files_are_one_line_errors() {
        for (text, want) in [
            ("state_dir = ", "line 1:"),
            ("heal_interval = \"soon\"", "heal_interval:"),
            ("heal_interval = \"1ms\"", "too short"),
            ("heal_interval = 60", "line 1:"),
            (
                "state_dir = \"relative/dir\"",
                "state_dir: \"relative/dir\" must be an absolute path",
            ),
            ("root = \"node\"", "root:"),
            ("peer_listen = \"7444\"", "peer_listen: \"7444\" is not IP:PORT"),
            (
                "# comment\nservers = [\"https://x\"]\n",
                "line 2: unknown field `servers`",
            ),
        ] {
            let err = Settings::parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err:?} lacks {want:?}");
            assert!(!err.contains('\n'), "{text:?}: multi-line error {err:?}");
        }
    }

    #[test]
    fn missing_default_file_is_fine_but_a_named_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("agent.toml");
        assert_eq!(Settings::load(&missing, false).unwrap(), Settings::default());
        let err = Settings::load(&missing, true).unwrap_err().to_string();
        assert!(err.starts_with(&format!("read {}:", missing.display())), "{err}");

        std::fs::write(&missing, "heal_interval = \"10s\"\n").unwrap();
        let s = Settings::load(&missing, false).unwrap();
        assert_eq!(s.heal_interval, Some(Duration::from_secs(10)));

        std::fs::write(&missing, "heal_interval = [\n").unwrap();
        let err = Settings::load(&missing, false).unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}: line ", missing.display())), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn a_directory_is_a_read_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = Settings::load(dir.path(), false).unwrap_err();
        assert!(matches!(err, SettingsError::Read { .. }), "{err}");
    }
}
