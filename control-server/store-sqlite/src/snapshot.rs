//! A consistent copy of a live database, for `lks-control-server backup`:
//! SQLite's online backup API reads every page in one read transaction
//! (WAL lets the running server keep writing meanwhile), so the copy is
//! the database as of one commit — never a file copy of pages mid-write.

use std::path::Path;
use std::time::Duration;

use lks_store::{Result, StoreError};
use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags};

use crate::SqliteStore;

/// How long a copy waits for a lock before it gives up.
const LOCKED_FOR: Duration = Duration::from_secs(30);

impl SqliteStore {
    /// Copies the database at `src` (a server may be running on it) into
    /// the new file `dst`, in the rollback-journal mode so that `dst` is one
    /// self-contained file, and checks the copy's integrity.
    pub fn snapshot(src: &Path, dst: &Path) -> Result<()> {
        let at = |what: &str, p: &Path| format!("{what} {}", p.display());
        // Read-write without create: a reader of a WAL database needs its
        // shared-memory file, and a missing database is an error, not a new one.
        let from = Connection::open_with_flags(
            src,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| StoreError::backend_at(at("open", src), e))?;
        from.busy_timeout(LOCKED_FOR)?;
        let mut to = Connection::open(dst).map_err(|e| StoreError::backend_at(at("create", dst), e))?;
        {
            let backup =
                Backup::new(&from, &mut to).map_err(|e| StoreError::backend_at(at("back up", src), e))?;
            let started = std::time::Instant::now();
            // All pages in one step: one read transaction, one commit's state.
            loop {
                match backup
                    .step(-1)
                    .map_err(|e| StoreError::backend_at(at("back up", src), e))?
                {
                    StepResult::Done => break,
                    StepResult::More => {}
                    StepResult::Busy | StepResult::Locked if started.elapsed() < LOCKED_FOR => {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    StepResult::Busy | StepResult::Locked => {
                        return Err(StoreError::Unavailable(format!(
                            "{} stayed locked for {LOCKED_FOR:?}; try again",
                            src.display()
                        )));
                    }
                    _ => {}
                }
            }
        }
        to.pragma_update(None, "journal_mode", "DELETE")?;
        let check: String = to.pragma_query_value(None, "integrity_check", |r| r.get(0))?;
        if check != "ok" {
            return Err(StoreError::backend(format!(
                "the copy of {} fails SQLite's integrity check: {check}",
                src.display()
            )));
        }
        to.close()
            .map_err(|(_, e)| StoreError::backend_at(at("close", dst), e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lks_store::{ClusterStore, NewCluster};

    #[tokio::test]
    async fn a_snapshot_holds_what_was_committed_and_opens_on_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("state.db");
        let store = SqliteStore::open(&live).unwrap();
        store.create_cluster(NewCluster::new("c1", 1_000)).await.unwrap();
        let copy = dir.path().join("copy.db");
        SqliteStore::snapshot(&live, &copy).unwrap();
        store.create_cluster(NewCluster::new("c2", 2_000)).await.unwrap();
        assert!(
            !dir.path().join("copy.db-wal").exists(),
            "one self-contained file"
        );
        let dump = SqliteStore::open_exclusive(&copy).unwrap().dump().await.unwrap();
        let names: Vec<_> = dump.clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["c1"], "the copy is the database as of the snapshot");
        let e = SqliteStore::snapshot(&dir.path().join("absent.db"), &dir.path().join("x.db"))
            .err()
            .unwrap();
        assert!(e.to_string().contains("absent.db"), "{e}");
    }
}
