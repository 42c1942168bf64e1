//! Applying, rolling back and refusing bundles; downloads from a faulty source.

use super::*;

#[tokio::test]
async fn apply_writes_exact_bytes_and_modes_and_runs_steps_with_env() {
    let mut f = fixture();
    let mut m = f.manifest(
        "kubelet",
        "1.0",
        &[
            ("/etc/kubernetes/kubelet.conf", b"conf-v1\n", 0o600),
            ("/usr/local/bin/kubelet", b"\x7fELF-bin", 0o755),
        ],
    );
    m.steps = vec![f.logging_step()];
    m.health = health("exit 0", 1);
    f.desire(vec![unsigned(m)]).await;

    assert_eq!(
        f.read("/etc/kubernetes/kubelet.conf"),
        Some((b"conf-v1\n".to_vec(), 0o600))
    );
    assert_eq!(
        f.read("/usr/local/bin/kubelet"),
        Some((b"\x7fELF-bin".to_vec(), 0o755))
    );
    assert_eq!(f.status("kubelet").1, BundleState::Applied);
    let root = std::path::absolute(&f.root).unwrap();
    assert_eq!(
        f.log_lines(),
        vec![format!("1.0 root={} bundle=kubelet node=node-1", root.display())]
    );
    assert!(f.event_kinds().contains(&"applied".to_string()));
    assert!(
        !f.tree().iter().any(|p| p.contains(".lks.")),
        "no temp entries left: {:?}",
        f.tree()
    );
    assert!(!f.state.join("journal.json").exists());

    // Same desired state again: nothing to do, steps do not run again.
    let again = f.engine.state().bundles["kubelet"].installed.clone().unwrap();
    f.desire(vec![unsigned(again)]).await;
    assert_eq!(f.log_lines().len(), 1);
}

#[tokio::test]
async fn failing_step_rolls_back_to_exact_previous_bytes_and_modes() {
    let mut f = fixture();
    write_file(&f.path("/etc/app/keep.conf"), b"pre-existing", 0o640);
    let mut v1 = f.manifest(
        "app",
        "1",
        &[
            ("/etc/app/keep.conf", b"v1 keep", 0o600),
            ("/etc/app/old.conf", b"v1 old", 0o644),
        ],
    );
    v1.steps = vec![f.logging_step()];
    f.desire(vec![unsigned(v1)]).await;
    assert_eq!(f.status("app").1, BundleState::Applied);
    // Someone changed the mode since: the rollback restores what was there.
    std::fs::set_permissions(
        f.path("/etc/app/old.conf"),
        std::fs::Permissions::from_mode(0o604),
    )
    .unwrap();

    let mut v2 = f.manifest(
        "app",
        "2",
        &[
            ("/etc/app/keep.conf", b"v2 keep", 0o644),
            ("/etc/app/new.conf", b"v2 new", 0o600),
        ],
    );
    v2.steps = vec![
        f.logging_step(),
        sh(
            "restart app",
            "echo first >&2; echo 'app failed to start' >&2; exit 3",
        ),
    ];
    f.desire(vec![unsigned(v2)]).await;

    assert_eq!(f.read("/etc/app/keep.conf"), Some((b"v1 keep".to_vec(), 0o600)));
    assert_eq!(f.read("/etc/app/old.conf"), Some((b"v1 old".to_vec(), 0o604)));
    assert_eq!(f.read("/etc/app/new.conf"), None, "file added by v2 removed");
    let (version, state, message) = f.status("app");
    assert_eq!((version.as_str(), state), ("2", BundleState::RolledBack));
    assert!(message.contains("\"restart app\""), "{message}");
    assert!(message.contains("status 3"), "{message}");
    assert!(message.contains("app failed to start"), "{message}");
    // v1's step ran on install and again after the rollback; v2's log step ran once.
    let versions: Vec<String> = f
        .log_lines()
        .iter()
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect();
    assert_eq!(versions, ["1", "2", "1"]);
    assert_eq!(f.engine.installed()["app"], "1");
    assert!(f.event_kinds().contains(&"rolled_back".to_string()));
    assert!(!f.tree().iter().any(|p| p.contains(".lks.")), "{:?}", f.tree());

    // The failed version is not retried for the same desired state ...
    let before = f.log_lines().len();
    f.engine.reconcile(&Desired::from(&state_of(&f))).await.unwrap();
    assert_eq!(f.log_lines().len(), before);
}

#[tokio::test]
async fn failing_health_check_rolls_back_first_install_to_nothing() {
    let mut f = fixture();
    write_file(&f.path("/etc/pre"), b"was here", 0o600);
    let mut m = f.manifest(
        "svc",
        "1",
        &[("/etc/pre", b"new", 0o644), ("/etc/added", b"added", 0o644)],
    );
    m.health = health("echo not healthy >&2; exit 1", 3);
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.read("/etc/pre"), Some((b"was here".to_vec(), 0o600)));
    assert_eq!(f.read("/etc/added"), None);
    let (_, state, message) = f.status("svc");
    assert_eq!(state, BundleState::RolledBack);
    assert!(message.contains("health check failed 3 time(s)"), "{message}");
    assert!(message.contains("not healthy"), "{message}");
}

#[tokio::test]
async fn removal_restores_the_file_that_existed_before() {
    let mut f = fixture();
    write_file(&f.path("/etc/motd"), b"original motd", 0o640);
    let v1 = f.manifest(
        "motd",
        "1",
        &[
            ("/etc/motd", b"managed v1", 0o644),
            ("/etc/motd.d/extra", b"x", 0o644),
        ],
    );
    f.desire(vec![unsigned(v1)]).await;
    // An upgrade keeps the original for the bundle's lifetime.
    let v2 = f.manifest("motd", "2", &[("/etc/motd", b"managed v2", 0o644)]);
    f.desire(vec![unsigned(v2)]).await;
    assert_eq!(f.read("/etc/motd"), Some((b"managed v2".to_vec(), 0o644)));
    assert_eq!(f.read("/etc/motd.d/extra"), None, "file dropped by v2 removed");
    f.desire(vec![]).await;
    assert_eq!(f.read("/etc/motd"), Some((b"original motd".to_vec(), 0o640)));
    assert!(f.engine.state().bundles.is_empty());
    assert!(f.event_kinds().contains(&"removed".to_string()));
    // Originals are dropped with the bundle.
    let left = std::fs::read_dir(f.state.join("originals"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0);
}

#[tokio::test]
async fn several_bundles_and_a_path_conflict_refuses_the_newcomer() {
    let mut f = fixture();
    let a = f.manifest("a", "1", &[("/etc/shared/conf", b"a", 0o644)]);
    let b = f.manifest("b", "1", &[("/etc/b", b"b", 0o644)]);
    f.desire(vec![unsigned(a.clone()), unsigned(b.clone())]).await;
    assert_eq!(f.status("a").1, BundleState::Applied);
    assert_eq!(f.status("b").1, BundleState::Applied);

    let same = f.manifest("c", "1", &[("/etc/shared/conf", b"c", 0o600)]);
    let nested = f.manifest("d", "1", &[("/etc/shared/conf/inner", b"d", 0o600)]);
    f.desire(vec![
        unsigned(a.clone()),
        unsigned(b.clone()),
        unsigned(same),
        unsigned(nested),
    ])
    .await;
    let (_, state, message) = f.status("c");
    assert_eq!(state, BundleState::Failed);
    assert!(
        message.contains("/etc/shared/conf") && message.contains("bundle a@1"),
        "{message}"
    );
    assert_eq!(f.status("d").1, BundleState::Failed);
    assert_eq!(f.read("/etc/shared/conf"), Some((b"a".to_vec(), 0o644)));
}

#[tokio::test]
async fn unsigned_or_foreign_signed_bundles_are_refused_when_a_key_is_trusted() {
    let key = SigningKey::generate();
    let other = SigningKey::generate();
    let mut f = fixture_with_keys(vec![key.public()]);
    let m = f.manifest("sec", "1", &[("/etc/sec", b"secret", 0o600)]);
    f.desire(vec![unsigned(m.clone())]).await;
    let (_, state, message) = f.status("sec");
    assert_eq!(state, BundleState::Failed);
    assert!(message.contains("not signed"), "{message}");
    assert!(f.tree().is_empty(), "nothing written: {:?}", f.tree());

    let foreign = SignedBundle {
        chunks_signature: None,
        signature: Some(other.sign(&m)),
        manifest: m.clone(),
    };
    f.desire(vec![foreign]).await;
    let (_, state, message) = f.status("sec");
    assert_eq!(state, BundleState::Failed);
    assert!(message.contains("not a trusted publisher key"), "{message}");
    assert!(f.tree().is_empty());

    let mut tampered_sig: Signature = key.sign(&m);
    tampered_sig.signature[0] ^= 1;
    f.desire(vec![SignedBundle {
        chunks_signature: None,
        signature: Some(tampered_sig),
        manifest: m.clone(),
    }])
    .await;
    assert_eq!(f.status("sec").1, BundleState::Failed);
    assert!(f.tree().is_empty());

    let mut m2 = m.clone();
    m2.version = "2".into();
    f.desire(vec![SignedBundle {
        chunks_signature: None,
        signature: Some(key.sign(&m2)),
        manifest: m2,
    }])
    .await;
    assert_eq!(f.status("sec").1, BundleState::Applied);
    assert_eq!(f.read("/etc/sec"), Some((b"secret".to_vec(), 0o600)));
}

#[tokio::test]
async fn symlink_planted_in_root_pointing_outside_fails_and_writes_nothing_outside() {
    let mut f = fixture();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(f.path("/etc")).unwrap();
    symlink(outside.path(), f.path("/etc/kubernetes")).unwrap();
    let m = f.manifest(
        "kube",
        "1",
        &[
            ("/etc/ok.conf", b"fine", 0o644),
            ("/etc/kubernetes/pki/ca.crt", b"ca", 0o644),
        ],
    );
    f.desire(vec![unsigned(m)]).await;
    let (_, state, message) = f.status("kube");
    assert_eq!(state, BundleState::Failed);
    assert!(message.contains("leave the node root"), "{message}");
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "nothing written outside"
    );
    assert_eq!(f.read("/etc/ok.conf"), None, "nothing written inside either");
}

#[tokio::test]
async fn a_parent_swapped_for_an_outside_symlink_before_rollback_does_not_wedge_the_engine() {
    let mut f = fixture();
    let outside = tempfile::tempdir().unwrap();
    let moved = tempfile::tempdir().unwrap();
    let mut m = f.manifest(
        "sw",
        "1",
        &[("/etc/ok.conf", b"fine", 0o644), ("/etc/sw/x", b"x", 0o644)],
    );
    // Between the switch and the rollback the directory of a switched file
    // becomes a symlink to a directory outside the root.
    m.steps = vec![sh(
        "swap and fail",
        &format!(
            "mv \"$LKS_ROOT/etc/sw\" {moved}/sw && ln -s {outside} \"$LKS_ROOT/etc/sw\" && exit 1",
            moved = moved.path().display(),
            outside = outside.path().display()
        ),
    )];
    f.desire(vec![unsigned(m)]).await;
    let (_, state, message) = f.status("sw");
    assert_eq!(state, BundleState::RolledBack, "{message}");
    assert!(
        message.contains("not restored, left as found: /etc/sw/x") && message.contains("leave the node root"),
        "{message}"
    );
    assert_eq!(f.read("/etc/ok.conf"), None, "the reachable file is rolled back");
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "nothing removed or written outside"
    );

    // The journal is closed: the next bundle applies.
    let other = f.manifest("other", "1", &[("/etc/other.conf", b"other", 0o644)]);
    f.desire(vec![unsigned(other)]).await;
    assert_eq!(f.status("other").1, BundleState::Applied);
    assert_eq!(f.read("/etc/other.conf"), Some((b"other".to_vec(), 0o644)));
}

#[tokio::test]
async fn checksum_mismatch_from_a_mirror_fails_naming_file_and_url() {
    let mut f = fixture();
    let good = b"the real binary";
    let mut m = f.manifest("bin", "1", &[]);
    m.files.push(FileSpec {
        chunks: None,
        arch: None,
        path: BundlePath::new("/usr/bin/tool").unwrap(),
        digest: Digest::of(good),
        size: good.len() as u64,
        mode: 0o755,
        url: Some("http://mirror.test/tool".into()),
    });
    f.source
        .by_url
        .lock()
        .unwrap()
        .insert("http://mirror.test/tool".into(), b"the evil binary".to_vec());
    f.desire(vec![unsigned(m.clone())]).await;
    let (_, state, message) = f.status("bin");
    assert_eq!(state, BundleState::Failed);
    assert!(message.contains("/usr/bin/tool"), "{message}");
    assert!(message.contains("http://mirror.test/tool"), "{message}");
    assert!(message.contains("checksum mismatch"), "{message}");
    assert!(f.tree().is_empty(), "{:?}", f.tree());
    assert!(!f.engine.cache().contains(&Digest::of(good)));

    // A longer body is cut off as soon as it passes the declared size.
    let mut m2 = m.clone();
    m2.version = "2".into();
    f.source.by_url.lock().unwrap().insert(
        "http://mirror.test/tool".into(),
        b"the real binary plus more".to_vec(),
    );
    f.desire(vec![unsigned(m2)]).await;
    let (_, state, message) = f.status("bin");
    assert_eq!(state, BundleState::Failed);
    assert!(message.contains("more than the declared"), "{message}");
}

#[tokio::test]
async fn a_cached_blob_corrupted_on_disk_never_reaches_the_target() {
    let mut f = fixture();
    let good = b"kubelet, the real one".to_vec();
    let m = f.manifest("k", "1", &[("/usr/bin/kubelet", &good, 0o755)]);
    // Verified once, then changed on disk (same size): staging hashes it
    // again while its writer thread writes the staged copy.
    let d = Digest::of(&good);
    let cache = f.state.join("cache/sha256");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::write(cache.join(d.hex()), b"kubelet, the evil one").unwrap();
    f.desire(vec![unsigned(m.clone())]).await;
    let (_, state, message) = f.status("k");
    assert_ne!(state, BundleState::Applied, "{message}");
    assert!(message.contains("/usr/bin/kubelet"), "{message}");
    assert!(
        !f.tree()
            .iter()
            .any(|p| p.ends_with("kubelet") || p.contains(".lks.")),
        "nothing written beside the target: {:?}",
        f.tree()
    );
    assert!(!f.engine.cache().contains(&d), "the corrupt entry is dropped");

    // The next version with the same bytes fetches them again and applies.
    let mut m2 = m;
    m2.version = "2".into();
    f.desire(vec![unsigned(m2)]).await;
    assert_eq!(f.status("k").1, BundleState::Applied);
    assert_eq!(f.read("/usr/bin/kubelet"), Some((good, 0o755)));
}

#[tokio::test]
async fn blob_source_offline_leaves_bundle_pending_then_applies() {
    let mut f = fixture();
    let m = f.manifest("late", "1", &[("/etc/late", b"late bytes", 0o644)]);
    f.source.clear();
    f.desire(vec![unsigned(m)]).await;
    let (_, state, message) = f.status("late");
    assert_eq!(state, BundleState::Pending);
    assert!(message.contains("offline"), "{message}");
    assert!(f.tree().is_empty());
    f.source.add(b"late bytes");
    f.engine.reconcile(&Desired::from(&state_of(&f))).await.unwrap();
    assert_eq!(f.status("late").1, BundleState::Applied);
}

#[tokio::test]
async fn partial_download_resumes_at_its_offset() {
    let f = fixture();
    let bytes = b"0123456789abcdef".to_vec();
    f.source.add(&bytes);
    let d = Digest::of(&bytes);
    let partial = f.state.join("cache/partial");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join(d.hex()), &bytes[..6]).unwrap();
    let spec = FileSpec {
        chunks: None,
        arch: None,
        path: BundlePath::new("/x").unwrap(),
        digest: d,
        size: bytes.len() as u64,
        mode: 0o644,
        url: None,
    };
    f.engine.cache().ensure(&spec, &f.source).await.unwrap();
    assert_eq!(*f.source.offsets.lock().unwrap(), vec![6]);
    assert_eq!(
        std::fs::read(f.state.join("cache/sha256").join(d.hex())).unwrap(),
        bytes
    );
}
