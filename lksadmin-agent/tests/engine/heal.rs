//! Drift repair and what survives a restart.

use super::*;

#[tokio::test]
async fn heal_restores_drifted_and_deleted_files_offline_and_reports() {
    let mut f = fixture();
    let mut m = f.manifest(
        "h",
        "1",
        &[
            ("/etc/h/a", b"alpha", 0o600),
            ("/etc/h/b", b"beta", 0o755),
            ("/etc/h/c", b"gamma", 0o644),
        ],
    );
    m.health = health(&format!("echo healthy >> {}", f.log.display()), 1);
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.status("h").1, BundleState::Applied);
    f.event_kinds();
    assert_eq!(
        f.engine.heal().await.unwrap().repaired.len(),
        0,
        "nothing drifted yet"
    );

    f.source.clear(); // offline: the cache is enough
    std::fs::write(f.path("/etc/h/a"), b"edited").unwrap();
    std::fs::set_permissions(f.path("/etc/h/b"), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::remove_file(f.path("/etc/h/c")).unwrap();
    let report = f.engine.heal().await.unwrap();
    assert_eq!(report.repaired.len(), 3, "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(f.read("/etc/h/a"), Some((b"alpha".to_vec(), 0o600)));
    assert_eq!(f.read("/etc/h/b"), Some((b"beta".to_vec(), 0o755)));
    assert_eq!(f.read("/etc/h/c"), Some((b"gamma".to_vec(), 0o644)));
    assert_eq!(f.event_kinds(), vec!["repaired"]);
    let last = f.engine.state().last_repair.clone().unwrap();
    assert!(
        last.message.contains("/etc/h/a (content changed)"),
        "{}",
        last.message
    );
    assert!(
        last.message.contains("/etc/h/b (mode changed)"),
        "{}",
        last.message
    );
    assert!(last.message.contains("/etc/h/c (missing)"), "{}", last.message);
    assert!(last.message.contains("health check passed"), "{}", last.message);
    assert_eq!(
        f.log_lines().len(),
        2,
        "health check ran on apply and after the repair"
    );
}

/// An idle heal pass proves unchanged files by their inode (a stat), reads
/// only what changed, and hashes everything once an hour regardless.
#[tokio::test]
async fn heal_reads_only_what_changed_and_everything_hourly() {
    // A real time (2026): the first pass after a start is no full pass
    // for files this process wrote.
    let clock = Arc::new(TestClock(std::sync::atomic::AtomicI64::new(1_790_000_000_000)));
    let mut f = fixture_full(vec![], clock.clone());
    let m = f.manifest(
        "h",
        "1",
        &[
            ("/etc/h/a", b"alpha", 0o644),
            ("/etc/h/b", b"bravo", 0o644),
            ("/etc/h/c", b"charl", 0o644),
        ],
    );
    f.desire(vec![unsigned(m)]).await;
    // The engine wrote them, verified: nothing to read until they change.
    let first = f.engine.heal().await.unwrap();
    assert_eq!((first.hashed, first.repaired.len()), (0, 0), "{first:?}");

    // Same size, other bytes: the inode changed, so it is read and repaired.
    std::fs::write(f.path("/etc/h/a"), b"ALPHA").unwrap();
    let r = f.engine.heal().await.unwrap();
    assert_eq!(r.repaired, vec!["/etc/h/a (content changed)".to_string()]);
    assert_eq!(f.read("/etc/h/a"), Some((b"alpha".to_vec(), 0o644)));
    // The same bytes written again: read once, nothing to repair.
    std::fs::write(f.path("/etc/h/b"), b"bravo").unwrap();
    let r = f.engine.heal().await.unwrap();
    assert!(r.repaired.is_empty(), "{r:?}");
    assert!(
        r.hashed >= 1 && r.hashed <= 2,
        "b (and the repaired a) read: {r:?}"
    );
    assert_eq!(f.engine.heal().await.unwrap().hashed, 0);

    // An hour later every file is read again.
    clock.0.fetch_add(3_600_000, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(f.engine.heal().await.unwrap().hashed, 3);
    assert_eq!(f.engine.heal().await.unwrap().hashed, 0);
}

#[tokio::test]
async fn an_upgrade_reads_the_old_file_only_when_its_inode_changed() {
    let mut f = fixture();
    let v = |f: &Fixture, version: &str, bytes: &'static [u8]| {
        f.manifest("big", version, &[("/usr/bin/big", bytes, 0o755)])
    };
    f.desire(vec![unsigned(v(&f, "1", b"version one"))]).await;
    assert_eq!(f.status("big").1, BundleState::Applied);

    // The file v1 left, as the engine wrote it: proved by its inode.
    f.desire(vec![unsigned(v(&f, "2", b"version two"))]).await;
    assert_eq!(f.status("big").1, BundleState::Applied);
    assert_eq!(f.engine.backups_read(), 0);

    // The same bytes written again (a new ctime): read once, and it is
    // still backed up by the cached blob.
    std::fs::write(f.path("/usr/bin/big"), b"version two").unwrap();
    let mut v3 = v(&f, "3", b"version 333");
    v3.steps = vec![sh("fail", "exit 1")];
    f.desire(vec![unsigned(v3)]).await;
    assert_eq!(f.engine.backups_read(), 1);
    assert_eq!(f.status("big").1, BundleState::RolledBack);
    assert_eq!(f.read("/usr/bin/big"), Some((b"version two".to_vec(), 0o755)));

    // Drifted bytes of the same size are read, found different and copied:
    // the rollback puts back exactly what was there, not the cached blob.
    std::fs::write(f.path("/usr/bin/big"), b"VERSION TWO").unwrap();
    let mut v4 = v(&f, "4", b"version 444");
    v4.steps = vec![sh("fail", "exit 1")];
    f.desire(vec![unsigned(v4)]).await;
    assert_eq!(f.engine.backups_read(), 2);
    assert_eq!(f.status("big").1, BundleState::RolledBack);
    assert_eq!(f.read("/usr/bin/big"), Some((b"VERSION TWO".to_vec(), 0o755)));
}

/// A kill after the journal closed but before the backups were deleted
/// leaves them; the next reconcile removes them.
#[tokio::test]
async fn backups_of_a_finished_transaction_left_by_a_kill_are_removed() {
    let mut f = fixture();
    let stale = f.state.join("txn/41");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("0"), b"a copy of a replaced file").unwrap();
    let m = f.manifest("s", "1", &[("/etc/s", b"s", 0o644)]);
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.status("s").1, BundleState::Applied);
    assert!(!stale.exists(), "stale backups still there");
}

#[tokio::test]
async fn state_survives_reopening_the_engine() {
    let mut f = fixture();
    let m = f.manifest("p", "1", &[("/etc/p", b"persist", 0o644)]);
    f.desire(vec![unsigned(m)]).await;
    let reopened = Engine::open(
        EngineConfig {
            state_dir: StateDir::new(&f.state),
            root: f.root.clone(),
            node: "node-1".into(),
            trusted: vec![],
            arch: lks_proto::arch::Arch::host(),
        },
        Arc::new(FakeSource::default()),
        Arc::new(ProcessRunner),
        Arc::new(SystemClock),
        Reporter::default(),
    )
    .unwrap();
    assert_eq!(reopened.installed()["p"], "1");
    assert_eq!(reopened.snapshot().generation, 1);
}

#[tokio::test]
async fn a_blob_just_fetched_is_staged_without_hashing_it_again_unless_its_inode_changed() {
    let mut f = fixture();
    let good = b"kubelet, fetched and verified".to_vec();
    let d = Digest::of(&good);
    // Fetched (verified as it streamed), stored, then staged: the staging
    // copy does not hash it a second time.
    let m = f.manifest("k", "1", &[("/usr/bin/kubelet", &good, 0o755)]);
    f.desire(vec![unsigned(m.clone())]).await;
    assert_eq!(f.status("k").1, BundleState::Applied);
    assert_eq!(f.read("/usr/bin/kubelet"), Some((good.clone(), 0o755)));
    assert_eq!(f.engine.stages_unhashed(), 1);

    // The cached blob changed on disk after that (same size, new ctime):
    // another bundle wanting the same bytes stages it hashing it, and the
    // corruption is caught before anything reaches its target.
    let blob = f.state.join("cache/sha256").join(d.hex());
    std::fs::write(&blob, b"kubelet, changed on the disk!").unwrap();
    assert_eq!(std::fs::metadata(&blob).unwrap().len(), good.len() as u64);
    let m2 = f.manifest("k2", "1", &[("/opt/k2/kubelet", &good, 0o755)]);
    f.desire(vec![unsigned(m.clone()), unsigned(m2)]).await;
    let (_, state, message) = f.status("k2");
    assert_ne!(state, BundleState::Applied, "{message}");
    assert!(message.contains("/opt/k2/kubelet"), "{message}");
    assert_eq!(f.engine.stages_unhashed(), 1);
    assert!(f.read("/opt/k2/kubelet").is_none());
    // The corrupt entry was dropped; the end of the reconcile copied the
    // blob into the cache again from k's intact target, verified.
    assert_eq!(
        std::fs::read(&blob).unwrap(),
        good,
        "the corrupt entry is dropped"
    );
}
