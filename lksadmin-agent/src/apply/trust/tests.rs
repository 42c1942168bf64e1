use std::collections::BTreeMap;

use lks_proto::release::ReleasedBundle;
use lks_proto::sign::SigningKey;

use super::*;

const T0: i64 = 1_800_000_000_000;
const HOUR: i64 = 3_600_000;

struct Keys {
    a: SigningKey,
    b: SigningKey,
}

fn keys() -> Keys {
    Keys {
        a: SigningKey::generate(),
        b: SigningKey::generate(),
    }
}

fn digest_of(name: &str, version: &str) -> Digest {
    Digest::of(format!("{name}@{version}").as_bytes())
}

fn release(version: u64, expires_at_ms: i64, bundles: &[(&str, &str)]) -> Release {
    Release {
        channel: "c1".into(),
        version,
        expires_at_ms,
        bundles: bundles
            .iter()
            .map(|(n, v)| {
                (
                    n.to_string(),
                    ReleasedBundle {
                        version: v.to_string(),
                        manifest_digest: digest_of(n, v),
                    },
                )
            })
            .collect::<BTreeMap<_, _>>(),
    }
}

fn signed(r: Release, by: &[&SigningKey]) -> Option<Result<SignedRelease, TrustError>> {
    Some(Ok(SignedRelease::sign(r, by)))
}

/// Trust on with key `a` alone (threshold 1), journal in a temp dir.
fn on(k: &Keys) -> (tempfile::TempDir, PathBuf, Trust) {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("trust.json");
    let t = Trust::open(&path, "c1", vec![k.a.public()], 1);
    (d, path, t)
}

#[test]
fn off_ignores_releases_and_admits_everything() {
    let mut t = Trust::off();
    let garbage = Some(Err(TrustError::NoKeys { version: 1 }));
    assert_eq!(t.update(garbage.as_ref(), &[], T0).unwrap(), None);
    assert_eq!(t.admits("app", "9", &digest_of("app", "9"), T0), Ok(()));
    assert_eq!(t.keeps("app"), None);
    assert_eq!(t.report(T0), TrustReport::default());
    assert!(!t.is_on());
    assert_eq!(t.wakeup_ms(T0), None);
    // Threshold 0 in join.toml is off too, and writes nothing.
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("trust.json");
    let t = Trust::open(&path, "c1", vec![SigningKey::generate().public()], 0);
    assert!(!t.is_on());
    assert!(!path.exists());
}

#[test]
fn the_journal_is_written_at_first_start_and_reports_no_release() {
    let k = keys();
    let (_d, path, t) = on(&k);
    assert!(path.exists(), "the initial state is journalled at once");
    let r = t.report(T0);
    assert_eq!(
        (r.enabled, r.state.as_str(), r.root_version),
        (true, "no-release", 1)
    );
    assert_eq!(r.message, "no signed release of c1 accepted yet");
    let err = t.admits("app", "1", &digest_of("app", "1"), T0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no release: this node has accepted no signed release of c1 yet"
    );
}

#[test]
fn an_accepted_release_is_durable_before_update_returns_and_survives_a_restart() {
    let k = keys();
    let (_d, path, mut t) = on(&k);
    let r2 = release(2, T0 + HOUR, &[("app", "1")]);
    assert_eq!(
        t.update(signed(r2.clone(), &[&k.a]).as_ref(), &[], T0).unwrap(),
        None
    );
    let on_disk: TrustFile = fsutil::read_json(&path).unwrap().unwrap();
    assert_eq!(on_disk.state.release_version, 2);
    assert_eq!(on_disk.state.release_digest, Some(r2.digest()));
    assert_eq!(on_disk.state.latest_known_time_ms, T0);
    assert!(on_disk.release.is_some());
    let again = Trust::open(&path, "c1", vec![k.a.public()], 1);
    assert_eq!(again.release(), Some(&r2));
    assert_eq!(again.admits("app", "1", &digest_of("app", "1"), T0 + 1), Ok(()));
    let rep = again.report(T0 + 1);
    assert_eq!((rep.state.as_str(), rep.release_version), ("ok", 2));
    assert_eq!(rep.release_expires_at_ms, T0 + HOUR);
}

#[test]
fn an_older_release_is_a_refused_rollback_reported_once() {
    let k = keys();
    let (_d, path, mut t) = on(&k);
    t.update(
        signed(release(3, T0 + HOUR, &[("app", "2")]), &[&k.a]).as_ref(),
        &[],
        T0,
    )
    .unwrap();
    let old = signed(release(2, T0 + HOUR, &[("app", "1")]), &[&k.a]);
    let news = t
        .update(old.as_ref(), &[], T0 + 1)
        .unwrap()
        .expect("a new reason");
    assert!(news.contains("older than release 3"), "{news}");
    assert_eq!(
        t.update(old.as_ref(), &[], T0 + 2).unwrap(),
        None,
        "not news twice"
    );
    assert_eq!(t.release().map(|r| r.version), Some(3), "the newer one is kept");
    let rep = t.report(T0 + 2);
    assert_eq!(
        (rep.state.as_str(), rep.message.as_str()),
        ("refused", news.as_str())
    );
    assert!(t.admits("app", "1", &digest_of("app", "1"), T0 + 2).is_err());
    // The refusal is journalled (status reads it), and goes once the
    // server sends the current release again.
    let on_disk: TrustFile = fsutil::read_json(&path).unwrap().unwrap();
    assert_eq!(on_disk.refusal.map(|r| r.condition), Some(Condition::Refused));
    t.update(
        signed(release(3, T0 + HOUR, &[("app", "2")]), &[&k.a]).as_ref(),
        &[],
        T0 + 3,
    )
    .unwrap();
    assert_eq!(t.report(T0 + 3).state, "ok");
}

#[test]
fn a_deliberate_rollback_is_a_newer_release_naming_the_older_version() {
    let k = keys();
    let (_d, _p, mut t) = on(&k);
    t.update(
        signed(release(3, T0 + HOUR, &[("app", "2")]), &[&k.a]).as_ref(),
        &[],
        T0,
    )
    .unwrap();
    t.update(
        signed(release(4, T0 + HOUR, &[("app", "1")]), &[&k.a]).as_ref(),
        &[],
        T0,
    )
    .unwrap();
    assert_eq!(t.admits("app", "1", &digest_of("app", "1"), T0), Ok(()));
    assert!(t.admits("app", "2", &digest_of("app", "2"), T0).is_err());
}

#[test]
fn a_bundle_the_release_does_not_name_is_not_released() {
    let k = keys();
    let (_d, _p, mut t) = on(&k);
    t.update(
        signed(release(2, T0 + HOUR, &[("kubelet", "1.31")]), &[&k.a]).as_ref(),
        &[],
        T0,
    )
    .unwrap();
    let other_version = t
        .admits("kubelet", "1.30", &digest_of("kubelet", "1.30"), T0)
        .unwrap_err();
    assert_eq!(
        other_version.to_string(),
        "not released: bundle kubelet@1.30 is not in release 2 of c1 (it releases version 1.31)"
    );
    let other_bundle = t.admits("etcd", "1", &digest_of("etcd", "1"), T0).unwrap_err();
    assert!(
        other_bundle.to_string().ends_with("(it releases no such bundle)"),
        "{other_bundle}"
    );
    // The same version with another manifest: signed bundles of two releases mixed.
    let mixed = t
        .admits("kubelet", "1.31", &digest_of("kubelet", "1.30"), T0)
        .unwrap_err();
    assert!(
        matches!(mixed, NotAdmitted::NotReleased(TrustError::DigestMismatch { .. })),
        "{mixed}"
    );
    assert!(
        mixed
            .to_string()
            .starts_with("not released: bundle kubelet@1.31 has manifest digest")
    );
}

#[test]
fn an_expired_release_makes_the_node_stale_and_applies_nothing_new() {
    let k = keys();
    let (_d, _p, mut t) = on(&k);
    let expires = T0 + HOUR;
    t.update(
        signed(release(2, expires, &[("app", "1")]), &[&k.a]).as_ref(),
        &[],
        T0,
    )
    .unwrap();
    assert_eq!(t.wakeup_ms(T0), Some(HOUR), "the timer fires at the expiry");
    assert_eq!(t.report(expires - 1).state, "ok");
    let rep = t.report(expires);
    assert_eq!(rep.state, "stale-release");
    assert!(
        rep.message.starts_with("release 2 of c1 expired at "),
        "{}",
        rep.message
    );
    assert_eq!(t.wakeup_ms(expires), None);
    let err = t.admits("app", "1", &digest_of("app", "1"), expires).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("release expired: release 2 of c1 expired at "),
        "{err}"
    );
    assert_eq!(
        t.keeps("app").as_deref(),
        Some(
            "release 2 of c1 still names app (the desired state omits it); \
             removed once a release without it is accepted"
        ),
        "it keeps what it has"
    );
    // The server offering the same, now expired, release: stale, said once.
    let same = signed(release(2, expires, &[("app", "1")]), &[&k.a]);
    let news = t.update(same.as_ref(), &[], expires + 5).unwrap().expect("news");
    assert!(news.contains("expired at"), "{news}");
    assert_eq!(t.update(same.as_ref(), &[], expires + 6).unwrap(), None);
    assert_eq!(t.report(expires + 6).state, "stale-release");
}

#[test]
fn a_refusal_does_not_hide_the_expiry_of_the_release_the_node_follows() {
    let k = keys();
    let (_d, path, mut t) = on(&k);
    let expires = T0 + HOUR;
    let r3 = signed(release(3, expires, &[("app", "2")]), &[&k.a]);
    t.update(r3.as_ref(), &[], T0).unwrap();
    // A stale server (restored from a backup) replays release 2, and goes
    // on replaying it: refused, once.
    let old = signed(release(2, T0 + 2 * HOUR, &[("app", "1")]), &[&k.a]);
    let refusal = t.update(old.as_ref(), &[], T0 + 1).unwrap().expect("news");
    assert!(refusal.contains("older than release 3"), "{refusal}");
    assert_eq!(t.report(expires - 1).state, "refused");
    assert_eq!(
        t.wakeup_ms(expires - 1),
        Some(1),
        "the expiry timer runs while refused"
    );
    // Release 3 runs out: the freeze shows, the refusal as its detail.
    let rep = t.report(expires);
    assert_eq!(
        (rep.state.as_str(), rep.release_version, rep.release_expires_at_ms),
        ("stale-release", 3, expires)
    );
    let stale = format!(
        "release 3 of c1 expired at {}; keeping what is installed until a fresh release is accepted; \
         the server's last release or root was refused: {refusal}",
        rfc3339(expires)
    );
    assert_eq!(rep.message, stale);
    assert_eq!(
        t.update(old.as_ref(), &[], expires + 1).unwrap(),
        None,
        "not news again"
    );
    assert_eq!(t.report(expires + 1).message, stale);
    // The journal still holds the refusal; a restart reports the same.
    let on_disk: TrustFile = fsutil::read_json(&path).unwrap().unwrap();
    assert_eq!(on_disk.refusal.map(|r| r.condition), Some(Condition::Refused));
    let again = Trust::open(&path, "c1", vec![k.a.public()], 1);
    assert_eq!(again.report(expires + 2).state, "stale-release");
    // A clock set back still says so first: expiry cannot be judged by it.
    let mut back = again;
    back.refresh(T0 - CLOCK_TOLERANCE_MS - 1);
    assert_eq!(back.report(T0 - CLOCK_TOLERANCE_MS - 1).state, "clock");
    // A fresh release ends both.
    let r4 = signed(release(4, expires + HOUR, &[("app", "2")]), &[&k.a]);
    assert_eq!(t.update(r4.as_ref(), &[], expires + 3).unwrap(), None);
    let rep = t.report(expires + 3);
    assert_eq!((rep.state.as_str(), rep.message.as_str()), ("ok", ""));
}

#[test]
fn the_own_release_offered_again_after_its_expiry_is_said_once_in_the_message() {
    let k = keys();
    let (_d, _p, mut t) = on(&k);
    let expires = T0 + HOUR;
    let r2 = signed(release(2, expires, &[("app", "1")]), &[&k.a]);
    t.update(r2.as_ref(), &[], T0).unwrap();
    t.update(r2.as_ref(), &[], expires + 1)
        .unwrap()
        .expect("refused as expired");
    let rep = t.report(expires + 1);
    assert_eq!(rep.state, "stale-release");
    assert!(!rep.message.contains("was refused"), "{}", rep.message);
    // An expired *newer* release is another record: it is the detail.
    let r5 = signed(release(5, expires, &[("app", "3")]), &[&k.a]);
    let news = t.update(r5.as_ref(), &[], expires + 2).unwrap().expect("news");
    assert!(news.starts_with("release 5 of c1 expired at "), "{news}");
    let rep = t.report(expires + 2);
    assert_eq!(rep.release_version, 2);
    assert!(
        rep.message.starts_with("release 2 of c1 expired at ")
            && rep.message.ends_with(&format!("was refused: {news}")),
        "{}",
        rep.message
    );
}

#[test]
fn a_release_without_the_threshold_or_for_another_channel_is_refused() {
    let k = keys();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("trust.json");
    let mut t = Trust::open(&path, "c1", vec![k.a.public(), k.b.public()], 2);
    let one = signed(release(2, T0 + HOUR, &[("app", "1")]), &[&k.a]);
    let news = t.update(one.as_ref(), &[], T0).unwrap().unwrap();
    assert!(news.contains("has 1 of the 2 signatures"), "{news}");
    let mut other = release(2, T0 + HOUR, &[("app", "1")]);
    other.channel = "c2".into();
    let news = t
        .update(signed(other, &[&k.a, &k.b]).as_ref(), &[], T0)
        .unwrap()
        .unwrap();
    assert!(news.contains("is for c2, but this node follows c1"), "{news}");
    let malformed = Some(Err(TrustError::Malformed {
        what: "signed release".into(),
        why: "no release".into(),
    }));
    let news = t.update(malformed.as_ref(), &[], T0).unwrap().unwrap();
    assert_eq!(news, "signed release: no release");
    assert_eq!(t.report(T0).state, "refused");
    assert_eq!(t.release(), None);
}

fn root(version: u64, keys: &[&SigningKey]) -> TrustRoot {
    TrustRoot {
        version,
        keys: keys.iter().map(|k| k.public()).collect(),
        threshold: 1,
        expires_at_ms: TrustRoot::NEVER_EXPIRES,
    }
}

#[test]
fn root_rotations_apply_in_version_order_then_the_new_keys_sign() {
    let k = keys();
    let c = SigningKey::generate();
    let (_d, path, mut t) = on(&k);
    // Sent out of order: v3 (b → c) before v2 (a → b).
    let r3 = SignedRoot::sign(root(3, &[&c]), &[&k.b, &c]);
    let r2 = SignedRoot::sign(root(2, &[&k.b]), &[&k.a, &k.b]);
    let rel = signed(release(2, T0 + HOUR, &[("app", "1")]), &[&c]);
    assert_eq!(
        t.update(rel.as_ref(), &[Ok(r3), Ok(r2.clone())], T0).unwrap(),
        None
    );
    assert_eq!(t.report(T0).root_version, 3);
    assert_eq!(t.report(T0).state, "ok");
    let on_disk: TrustFile = fsutil::read_json(&path).unwrap().unwrap();
    assert_eq!(on_disk.state.root.version, 3);
    // A rotated-out key no longer signs.
    let by_a = signed(release(3, T0 + HOUR, &[("app", "2")]), &[&k.a]);
    assert!(t.update(by_a.as_ref(), &[Ok(r2)], T0).unwrap().is_some());
    assert_eq!(t.release().map(|r| r.version), Some(2));
}

#[test]
fn a_refused_rotation_stops_the_chain_but_the_release_is_still_checked() {
    let k = keys();
    let c = SigningKey::generate();
    let (_d, _p, mut t) = on(&k);
    // v2 is not signed by the current root's key a.
    let bad2 = SignedRoot::sign(root(2, &[&k.b]), &[&k.b]);
    let r3 = SignedRoot::sign(root(3, &[&c]), &[&k.b, &c]);
    let rel = signed(release(2, T0 + HOUR, &[("app", "1")]), &[&k.a]);
    let news = t.update(rel.as_ref(), &[Ok(bad2), Ok(r3)], T0).unwrap().unwrap();
    assert!(
        news.starts_with("trust root 2 has 0 of the 1 signatures"),
        "{news}"
    );
    let rep = t.report(T0);
    assert_eq!((rep.state.as_str(), rep.root_version), ("refused", 1));
    assert_eq!(
        t.release().map(|r| r.version),
        Some(2),
        "root 1 still signs releases"
    );
}

#[test]
fn a_corrupt_journal_is_never_reset() {
    let k = keys();
    let (_d, path, mut t) = on(&k);
    t.update(
        signed(release(5, T0 + HOUR, &[("app", "1")]), &[&k.a]).as_ref(),
        &[],
        T0,
    )
    .unwrap();
    std::fs::write(&path, b"{ not json").unwrap();
    let mut t = Trust::open(&path, "c1", vec![k.a.public()], 1);
    assert_eq!(std::fs::read(&path).unwrap(), b"{ not json", "left as it is");
    let rep = t.report(T0);
    assert_eq!(rep.state, "refused");
    assert!(
        rep.message.contains(&path.display().to_string()),
        "{}",
        rep.message
    );
    assert!(!rep.message.contains('\n'));
    // An old release is not accepted into a fresh state, nothing is
    // admitted, and nothing is removed.
    let old = signed(release(1, T0 + HOUR, &[("app", "0")]), &[&k.a]);
    assert_eq!(t.update(old.as_ref(), &[], T0).unwrap(), None);
    let err = t.admits("app", "0", &digest_of("app", "0"), T0).unwrap_err();
    assert!(err.to_string().starts_with("trust state unreadable: "), "{err}");
    assert!(t.keeps("app").is_some());
    // A stored release that does not match the version it records.
    let mut f: TrustFile = TrustFile {
        state: TrustState::new(TrustRoot::initial([k.a.public()], 1).unwrap()),
        release: None,
        refusal: None,
    };
    f.state.release_version = 4;
    fsutil::write_json(&path, &f, 0o600).unwrap();
    let rep = Trust::open(&path, "c1", vec![k.a.public()], 1).report(T0);
    assert_eq!(rep.state, "refused");
    assert!(
        rep.message.contains("does not match release 4"),
        "{}",
        rep.message
    );
}

#[test]
fn a_clock_set_back_beyond_the_tolerance_accepts_and_admits_nothing() {
    let k = keys();
    let (_d, _p, mut t) = on(&k);
    t.update(
        signed(release(2, T0 + HOUR, &[("app", "1")]), &[&k.a]).as_ref(),
        &[],
        T0,
    )
    .unwrap();
    let back = T0 - CLOCK_TOLERANCE_MS - 1;
    let newer = signed(release(3, T0 + 2 * HOUR, &[("app", "2")]), &[&k.a]);
    let news = t.update(newer.as_ref(), &[], back).unwrap().unwrap();
    assert!(news.contains("the clock went back"), "{news}");
    assert_eq!(
        t.update(newer.as_ref(), &[], back - 1).unwrap(),
        None,
        "said once"
    );
    assert_eq!(t.release().map(|r| r.version), Some(2));
    let rep = t.report(back);
    assert_eq!(
        (rep.state.as_str(), rep.message.as_str()),
        ("clock", news.as_str())
    );
    let err = t.admits("app", "1", &digest_of("app", "1"), back).unwrap_err();
    assert_eq!(err.to_string(), format!("clock: {news}"));
    // The clock comes right again.
    t.refresh(T0);
    assert_eq!(t.report(T0).state, "ok");
}

#[test]
fn a_clock_step_back_within_the_tolerance_counts_as_the_latest_known_time() {
    let k = keys();
    let (_d, path, mut t) = on(&k);
    let expires = T0 + HOUR;
    t.update(
        signed(release(2, expires, &[("app", "1")]), &[&k.a]).as_ref(),
        &[],
        T0,
    )
    .unwrap();
    let back = T0 - CLOCK_TOLERANCE_MS + 1;
    let newer = signed(release(3, expires, &[("app", "2")]), &[&k.a]);
    assert_eq!(t.update(newer.as_ref(), &[], back).unwrap(), None);
    assert_eq!(t.release().map(|r| r.version), Some(3));
    assert_eq!(t.admits("app", "2", &digest_of("app", "2"), back), Ok(()));
    let on_disk: TrustFile = fsutil::read_json(&path).unwrap().unwrap();
    assert_eq!(on_disk.state.latest_known_time_ms, T0, "never moves back");
}

#[test]
fn re_accepting_the_same_release_writes_the_known_time_only_now_and_then() {
    let k = keys();
    let (_d, path, mut t) = on(&k);
    let rel = signed(release(2, T0 + 2 * HOUR, &[("app", "1")]), &[&k.a]);
    t.update(rel.as_ref(), &[], T0).unwrap();
    t.update(rel.as_ref(), &[], T0 + 1000).unwrap();
    let on_disk: TrustFile = fsutil::read_json(&path).unwrap().unwrap();
    assert_eq!(on_disk.state.latest_known_time_ms, T0);
    t.update(rel.as_ref(), &[], T0 + KNOWN_TIME_WRITE_STEP_MS + 1000)
        .unwrap();
    let on_disk: TrustFile = fsutil::read_json(&path).unwrap().unwrap();
    assert_eq!(
        on_disk.state.latest_known_time_ms,
        T0 + KNOWN_TIME_WRITE_STEP_MS + 1000
    );
}
