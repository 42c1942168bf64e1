//! Downloads moved into place, the blob cache, and bytes shared between files and bundles.

use super::*;

fn dir_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Issue [write-once]: the download is moved into place (no staged copy),
/// and the cache entry is made after the commit from the target, verified.
#[tokio::test]
async fn a_fresh_install_moves_the_download_into_place_and_caches_it_after_the_commit() {
    let mut f = fixture();
    let good = b"kubelet bytes, written once on the rollout's path".to_vec();
    let d = Digest::of(&good);
    let m = f.manifest("k", "1", &[("/usr/bin/kubelet", &good, 0o755)]);
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.status("k").1, BundleState::Applied);
    assert_eq!(f.read("/usr/bin/kubelet"), Some((good.clone(), 0o755)));
    assert_eq!(*f.source.offsets.lock().unwrap(), vec![0], "fetched once");
    assert_eq!(f.engine.stages_unhashed(), 1, "moved, not copied");
    assert!(
        dir_names(&f.state.join("cache/fetched")).is_empty(),
        "the download was moved"
    );
    assert_eq!(
        std::fs::read(f.state.join("cache/sha256").join(d.hex())).unwrap(),
        good
    );
    assert!(dir_names(&f.state.join("cache/partial")).is_empty());
    assert_eq!(f.tree(), vec!["usr", "usr/bin", "usr/bin/kubelet"]);

    // The cache entry is its own inode: editing the target in place does
    // not touch it, and an offline heal restores from it.
    f.source.clear();
    std::fs::write(f.path("/usr/bin/kubelet"), b"edited in place").unwrap();
    let report = f.engine.heal().await.unwrap();
    assert_eq!(report.repaired.len(), 1, "{report:?}");
    assert_eq!(f.read("/usr/bin/kubelet"), Some((good, 0o755)));
}

/// A target that drifted between its switch and its cache copy is never
/// cached: the copy is hashed and dropped; offline, repair says it failed
/// rather than restore anything unverified; online, it fetches.
#[tokio::test]
async fn a_target_that_drifted_before_its_cache_copy_is_not_cached() {
    let mut f = fixture();
    let good = b"the bytes the manifest names".to_vec();
    let d = Digest::of(&good);
    let m = f.manifest("k", "1", &[("/etc/k.conf", &good, 0o644)]);
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.status("k").1, BundleState::Applied);
    // As if the agent was killed before the copy, and the file was edited
    // (same size) before it ran again.
    std::fs::remove_file(f.state.join("cache/sha256").join(d.hex())).unwrap();
    std::fs::write(f.path("/etc/k.conf"), b"THE BYTES THE MANIFEST NAMES").unwrap();
    assert_eq!(f.engine.cache_copies(), 1, "the copy after the commit");
    f.engine.fill_cache();
    assert_eq!(f.engine.cache_copies(), 2);
    assert!(!f.engine.cache().contains(&d), "drifted bytes were cached");
    assert!(
        dir_names(&f.state.join("cache/partial")).is_empty(),
        "copy left behind"
    );

    f.source.clear();
    let report = f.engine.heal().await.unwrap();
    assert_eq!(report.repaired.len(), 0, "{report:?}");
    assert_eq!(report.failed.len(), 1, "{report:?}");
    assert!(!f.engine.cache().contains(&d));
    assert_eq!(
        f.engine.cache_copies(),
        2,
        "a file whose copy did not match is not read again while unchanged"
    );
    assert_eq!(
        f.read("/etc/k.conf"),
        Some((b"THE BYTES THE MANIFEST NAMES".to_vec(), 0o644)),
        "nothing unverified restored"
    );

    f.source.add(&good);
    let report = f.engine.heal().await.unwrap();
    assert_eq!(report.repaired.len(), 1, "{report:?}");
    assert_eq!(f.read("/etc/k.conf"), Some((good.clone(), 0o644)));
    assert_eq!(
        std::fs::read(f.state.join("cache/sha256").join(d.hex())).unwrap(),
        good
    );
}

/// Two files of one bundle with the same bytes: the download goes to the
/// first, the second is copied from the first's staged entry, verified.
#[tokio::test]
async fn two_files_with_the_same_bytes_are_both_installed_from_one_download() {
    let mut f = fixture();
    let same = b"one blob, two paths".to_vec();
    let m = f.manifest(
        "twin",
        "1",
        &[("/etc/a/one", &same, 0o644), ("/etc/b/two", &same, 0o600)],
    );
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.status("twin").1, BundleState::Applied, "{}", f.status("twin").2);
    assert_eq!(f.read("/etc/a/one"), Some((same.clone(), 0o644)));
    assert_eq!(f.read("/etc/b/two"), Some((same.clone(), 0o600)));
    assert_eq!(*f.source.offsets.lock().unwrap(), vec![0], "fetched once");
    assert!(!f.tree().iter().any(|p| p.contains(".lks.")), "{:?}", f.tree());

    // The first path drifted before the cache copy: the copy comes from
    // the second, intact one.
    let d = Digest::of(&same);
    let blob = f.state.join("cache/sha256").join(d.hex());
    std::fs::remove_file(&blob).unwrap();
    std::fs::write(f.path("/etc/a/one"), b"ONE BLOB, TWO PATHS").unwrap();
    f.engine.fill_cache();
    assert_eq!(std::fs::read(&blob).unwrap(), same);
}

/// A rolled-back version's bytes are given back to `fetched/`: trying it
/// again (`lksctl node retry`) needs no download, and they are hashed
/// before they are used again.
#[tokio::test]
async fn a_rolled_back_version_is_tried_again_without_a_new_download() {
    let mut f = fixture();
    let v1 = f.manifest("svc", "1", &[("/etc/svc.conf", b"one", 0o644)]);
    f.desire(vec![unsigned(v1)]).await;
    let flag = f.root.join("healthy");
    let mut v2 = f.manifest(
        "svc",
        "2",
        &[
            ("/etc/svc.conf", b"two, and longer", 0o644),
            ("/etc/svc.d/new", b"new file", 0o644),
        ],
    );
    v2.health = health(&format!("test -e {}", flag.display()), 1);
    f.desire(vec![unsigned(v2.clone())]).await;
    assert_eq!(f.status("svc").1, BundleState::RolledBack);
    assert_eq!(f.read("/etc/svc.conf"), Some((b"one".to_vec(), 0o644)));
    assert_eq!(f.read("/etc/svc.d/new"), None);
    let fetched = dir_names(&f.state.join("cache/fetched"));
    assert_eq!(fetched.len(), 2, "{fetched:?}");

    f.source.clear();
    std::fs::write(&flag, b"").unwrap();
    let mut d = state_of(&f);
    d.generation += 1;
    d.retry.insert("svc".into(), d.generation);
    f.engine.accept_desired(&Desired::from(&d)).await.unwrap();
    assert_eq!(f.status("svc").1, BundleState::Applied, "{}", f.status("svc").2);
    assert_eq!(
        f.read("/etc/svc.conf"),
        Some((b"two, and longer".to_vec(), 0o644))
    );
    assert_eq!(f.read("/etc/svc.d/new"), Some((b"new file".to_vec(), 0o644)));
    assert!(dir_names(&f.state.join("cache/fetched")).is_empty());
}

/// A download left in `fetched/` that does not match (damaged on disk, or
/// left by an earlier process) is hashed before use, dropped, fetched again.
#[tokio::test]
async fn a_damaged_fetched_blob_is_dropped_and_fetched_again() {
    let mut f = fixture();
    let good = b"the real thing".to_vec();
    let d = Digest::of(&good);
    let dir = f.state.join("cache/fetched");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(d.hex()), b"the fake thing").unwrap();
    let m = f.manifest("r", "1", &[("/etc/r", &good, 0o644)]);
    f.desire(vec![unsigned(m.clone())]).await;
    assert_eq!(f.status("r").1, BundleState::Applied, "{}", f.status("r").2);
    assert_eq!(*f.source.offsets.lock().unwrap(), vec![0], "fetched again");
    assert_eq!(f.read("/etc/r"), Some((good, 0o644)));
}

/// Two bundles applied in one reconcile with the same bytes: the second
/// copies them from the first's target (verified) instead of downloading
/// them again, though the first's cache copy comes only after the reconcile.
#[tokio::test]
async fn a_second_bundle_with_the_same_bytes_takes_them_from_the_first_not_the_network() {
    let mut f = fixture();
    let same = b"bytes shared by two bundles".to_vec();
    let a = f.manifest("a", "1", &[("/opt/a/bin", &same, 0o755)]);
    let b = f.manifest("b", "1", &[("/opt/b/bin", &same, 0o755)]);
    f.desire(vec![unsigned(a), unsigned(b)]).await;
    assert_eq!(f.status("a").1, BundleState::Applied);
    assert_eq!(f.status("b").1, BundleState::Applied, "{}", f.status("b").2);
    assert_eq!(f.read("/opt/b/bin"), Some((same.clone(), 0o755)));
    assert_eq!(*f.source.offsets.lock().unwrap(), vec![0], "downloaded once");
    assert_eq!(f.engine.cache_copies(), 1, "copied once, from a's target");
}

/// Issue [upgrade-cost]: a large file an upgrade replaces is held open
/// through the switch and closed after the report (so the rename does not
/// free it on the rollout's path); a small one, a fresh install and a
/// rollback's restore are as before, and every outcome is the same.
#[tokio::test]
async fn a_large_replaced_file_is_released_after_the_report() {
    let mut f = fixture();
    let big = |b: u8| -> &'static [u8] { Box::leak(vec![b; 2 << 20].into_boxed_slice()) };
    let v = |f: &Fixture, version: &str, bytes: &'static [u8]| {
        f.manifest(
            "big",
            version,
            &[("/usr/bin/big", bytes, 0o755), ("/etc/big.conf", b"small", 0o644)],
        )
    };
    f.desire(vec![unsigned(v(&f, "1", big(1)))]).await;
    assert_eq!(f.status("big").1, BundleState::Applied);
    assert_eq!(f.engine.files_retired(), 0, "a fresh install replaces nothing");

    f.desire(vec![unsigned(v(&f, "2", big(2)))]).await;
    assert_eq!(f.status("big").1, BundleState::Applied);
    assert_eq!(f.read("/usr/bin/big").unwrap().0, big(2));
    assert_eq!(
        f.engine.files_retired(),
        1,
        "the large file only, not the unchanged small one"
    );

    // A failed step rolls back: the file the switch replaced was held
    // through it, and the old version is restored as before.
    let mut v3 = v(&f, "3", big(3));
    v3.steps = vec![sh("fail", "exit 1")];
    f.desire(vec![unsigned(v3)]).await;
    assert_eq!(f.status("big").1, BundleState::RolledBack);
    assert_eq!(f.read("/usr/bin/big").unwrap().0, big(2));
    assert_eq!(f.engine.files_retired(), 2);
}
