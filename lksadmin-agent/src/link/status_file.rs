//! `status.json`: the connection's state (connected, to which server,
//! since when, the last contact and error), kept up to date by the
//! connection task through the writer `run` passes it, and read by
//! `lksadmin-agent status`.

use std::sync::Mutex;

use lks_proto::fsutil;

use crate::clock::now_ms;
use crate::config::StateDir;

/// `status.json`, written by `run`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConnStatus {
    pub pid: u32,
    pub connected: bool,
    #[serde(default)]
    pub server: String,
    /// When the current connection was established (ms).
    #[serde(default)]
    pub since_ms: i64,
    /// Last message from a server (ms; 0: never).
    #[serde(default)]
    pub last_contact_ms: i64,
    #[serde(default)]
    pub last_error: String,
    pub updated_at_ms: i64,
}

/// Owner of `status.json` inside `run`.
pub struct ConnStatusFile {
    dirs: StateDir,
    cur: Mutex<ConnStatus>,
}

impl ConnStatusFile {
    pub fn new(dirs: StateDir) -> Self {
        let last_contact_ms = fsutil::read_json::<ConnStatus>(&dirs.status())
            .ok()
            .flatten()
            .map_or(0, |s| s.last_contact_ms);
        ConnStatusFile {
            dirs,
            cur: Mutex::new(ConnStatus {
                pid: std::process::id(),
                last_contact_ms,
                ..ConnStatus::default()
            }),
        }
    }

    /// Applies `f` and writes the file.
    pub fn update(&self, f: impl FnOnce(&mut ConnStatus)) {
        // A status each update rewrites fields of and writes whole: what a
        // panic in `f` left is written over by the next update, so the
        // lock is taken as it is rather than every update dropped.
        let mut cur = lks_proto::sync::lock(&self.cur);
        f(&mut cur);
        cur.updated_at_ms = now_ms();
        if let Err(e) = fsutil::write_json(&self.dirs.status(), &*cur, 0o644) {
            tracing::warn!("write status file: {e}");
        }
    }

    pub fn get(&self) -> ConnStatus {
        lks_proto::sync::lock(&self.cur).clone()
    }
}
