//! Signed release records in the engine (issue [trust]): a new version is
//! applied only as the node's accepted release names it, the journal is
//! durable before the apply, a bundle the release names is not removed,
//! an older release is refused, an expired one leaves the node stale, and
//! with trust off a release changes nothing.

use std::sync::atomic::{AtomicI64, Ordering};

use lks_proto::canonical::manifest_digest;
use lks_proto::release::{Release, ReleasedBundle, SignedRelease};

use super::*;

const T0: i64 = 1_800_000_000_000;
const HOUR: i64 = 3_600_000;

struct Trusted {
    f: Fixture,
    key: SigningKey,
    clock: Arc<TestClock>,
}

fn trusted() -> Trusted {
    let key = SigningKey::generate();
    let clock = Arc::new(TestClock(AtomicI64::new(T0)));
    // As `join` leaves it: the release keys sign bundles too.
    let f = fixture_trust(vec![key.public()], clock.clone(), Some((vec![key.public()], 1)));
    Trusted { f, key, clock }
}

fn release(version: u64, expires_at_ms: i64, bundles: &[&Manifest]) -> Release {
    Release {
        channel: "c1".into(),
        version,
        expires_at_ms,
        bundles: bundles
            .iter()
            .map(|m| {
                (
                    m.name.clone(),
                    ReleasedBundle {
                        version: m.version.clone(),
                        manifest_digest: manifest_digest(m),
                    },
                )
            })
            .collect(),
    }
}

impl Trusted {
    async fn desire(&mut self, bundles: &[&Manifest], release: Option<Release>) {
        let f = &mut self.f;
        f.generation += 1;
        let d = pb::DesiredState {
            generation: f.generation,
            bundles: bundles
                .iter()
                .map(|m| pb::SignedBundle::from(&self.key.sign_bundle((*m).clone())))
                .collect(),
            release: release.map(|r| pb::SignedRelease::from(&SignedRelease::sign(r, &[&self.key]))),
            ..Default::default()
        };
        f.engine.accept_desired(&Desired::from(&d)).await.unwrap();
    }

    fn events(&mut self) -> Vec<(String, String)> {
        let mut out = vec![];
        while let Ok(e) = self.f.events.try_recv() {
            out.push((e.kind, e.message));
        }
        out
    }
}

#[tokio::test]
async fn only_what_the_release_names_is_applied_and_its_journal_is_durable_first() {
    let mut t = trusted();
    let v1 = t.f.manifest("app", "1", &[("/etc/app.conf", b"one", 0o644)]);
    t.desire(&[&v1], None).await;
    let (_, state, message) = t.f.status("app");
    assert_eq!(state, BundleState::Failed);
    assert_eq!(
        message,
        "no release: this node has accepted no signed release of c1 yet"
    );
    assert_eq!(t.f.engine.snapshot().trust.state, "no-release");

    t.desire(&[&v1], Some(release(1, T0 + HOUR, &[&v1]))).await;
    assert_eq!(t.f.status("app").1, BundleState::Applied);
    assert_eq!(t.f.read("/etc/app.conf").unwrap().0, b"one");

    // A signed app@2 the release does not name: refused, app@1 kept.
    let v2 = t.f.manifest("app", "2", &[("/etc/app.conf", b"two", 0o644)]);
    t.events();
    t.desire(&[&v2], Some(release(1, T0 + HOUR, &[&v1]))).await;
    let (version, state, message) = t.f.status("app");
    assert_eq!((version.as_str(), state), ("2", BundleState::Failed));
    assert_eq!(
        message,
        "not released: bundle app@2 is not in release 1 of c1 (it releases version 1)"
    );
    assert_eq!(t.f.engine.installed()["app"], "1");
    assert_eq!(t.f.read("/etc/app.conf").unwrap().0, b"one");
    assert_eq!(t.events().len(), 1, "one failed event");
    t.desire(&[&v2], Some(release(1, T0 + HOUR, &[&v1]))).await;
    assert!(t.events().is_empty(), "not reported again");

    // Release 2 names it; its step proves trust.json already holds it.
    let mut v2 = v2;
    let journal = t.f.state.join("trust.json");
    v2.steps = vec![sh(
        "check",
        &format!("grep -q '\"release_version\": 2' {}", journal.display()),
    )];
    t.desire(&[&v2], Some(release(2, T0 + HOUR, &[&v2]))).await;
    assert_eq!(
        t.f.status("app"),
        ("2".into(), BundleState::Applied, String::new())
    );
    assert_eq!(t.f.read("/etc/app.conf").unwrap().0, b"two");
    let trust = t.f.engine.snapshot().trust;
    assert_eq!(
        (
            trust.enabled,
            trust.state.as_str(),
            trust.release_version,
            trust.root_version
        ),
        (true, "ok", 2, 1)
    );
}

#[tokio::test]
async fn an_older_release_is_refused_and_the_installed_version_kept() {
    let mut t = trusted();
    let v1 = t.f.manifest("app", "1", &[("/etc/app.conf", b"one", 0o644)]);
    let v2 = t.f.manifest("app", "2", &[("/etc/app.conf", b"two", 0o644)]);
    t.desire(&[&v2], Some(release(2, T0 + HOUR, &[&v2]))).await;
    assert_eq!(t.f.engine.installed()["app"], "2");
    t.events();
    // A stale server replays release 1 (signed, genuine) with app@1.
    t.desire(&[&v1], Some(release(1, T0 + HOUR, &[&v1]))).await;
    assert_eq!(t.f.engine.installed()["app"], "2");
    assert_eq!(t.f.read("/etc/app.conf").unwrap().0, b"two");
    let (_, state, message) = t.f.status("app");
    assert_eq!(state, BundleState::Failed);
    assert!(
        message.starts_with("not released: bundle app@1 is not in release 2 of c1"),
        "{message}"
    );
    let events = t.events();
    let refused: Vec<_> = events.iter().filter(|(k, _)| k == "release_refused").collect();
    assert_eq!(refused.len(), 1, "{events:?}");
    assert!(refused[0].1.contains("older than release 2"), "{}", refused[0].1);
    let trust = t.f.engine.snapshot().trust;
    assert_eq!((trust.state.as_str(), trust.release_version), ("refused", 2));
    t.desire(&[&v1], Some(release(1, T0 + HOUR, &[&v1]))).await;
    assert!(
        !t.events().iter().any(|(k, _)| k == "release_refused"),
        "once per reason"
    );
    // The stale server goes on replaying release 1 until release 2 runs
    // out: the expiry timer turns the refusal into the freeze it is.
    assert_eq!(
        t.f.engine.trust_wakeup(),
        Some(Duration::from_millis(HOUR as u64 + 1))
    );
    t.clock.0.store(T0 + HOUR, Ordering::SeqCst);
    t.f.engine.refresh_trust();
    let trust = t.f.engine.snapshot().trust;
    assert_eq!(
        (trust.state.as_str(), trust.release_version),
        ("stale-release", 2)
    );
    assert!(
        trust.message.starts_with("release 2 of c1 expired at ")
            && trust
                .message
                .contains("was refused: release 1 of c1 is older than release 2"),
        "{}",
        trust.message
    );
    assert_eq!(t.f._status.borrow().trust, trust, "and it is published");
    t.desire(&[&v1], Some(release(1, T0 + HOUR, &[&v1]))).await;
    assert_eq!(t.f.engine.snapshot().trust.state, "stale-release");
    assert_eq!(t.f.engine.installed()["app"], "2", "it keeps what it has");
}

#[tokio::test]
async fn a_bundle_the_release_names_is_not_removed_until_a_release_drops_it() {
    let mut t = trusted();
    let app = t.f.manifest("app", "1", &[("/etc/app.conf", b"one", 0o644)]);
    t.desire(&[&app], Some(release(1, T0 + HOUR, &[&app]))).await;
    t.events();
    // The server withholds it: it stays.
    t.desire(&[], Some(release(1, T0 + HOUR, &[&app]))).await;
    assert_eq!(t.f.read("/etc/app.conf").unwrap().0, b"one");
    let (_, state, message) = t.f.status("app");
    assert_eq!(state, BundleState::Applied);
    assert!(
        message.starts_with("not removed: release 1 of c1 still names app"),
        "{message}"
    );
    let kinds: Vec<_> = t.events().into_iter().map(|(k, _)| k).collect();
    assert_eq!(kinds, ["removal_withheld"]);
    t.desire(&[], Some(release(1, T0 + HOUR, &[&app]))).await;
    assert!(t.events().is_empty(), "said once");
    // Listed again: applied, the message gone.
    t.desire(&[&app], Some(release(1, T0 + HOUR, &[&app]))).await;
    assert_eq!(
        t.f.status("app"),
        ("1".into(), BundleState::Applied, String::new())
    );
    // A release without it: removed.
    t.desire(&[], Some(release(2, T0 + HOUR, &[]))).await;
    assert_eq!(t.f.read("/etc/app.conf"), None);
    assert!(!t.f.engine.state().bundles.contains_key("app"));
}

#[tokio::test]
async fn an_expired_release_makes_the_node_stale_and_keeps_what_it_has() {
    let mut t = trusted();
    let v1 = t.f.manifest("app", "1", &[("/etc/app.conf", b"one", 0o644)]);
    t.desire(&[&v1], Some(release(1, T0 + 1000, &[&v1]))).await;
    assert_eq!(t.f.engine.installed()["app"], "1");
    assert_eq!(t.f.engine.trust_wakeup(), Some(Duration::from_millis(1001)));
    t.clock.0.store(T0 + 2000, Ordering::SeqCst);
    t.f.engine.refresh_trust();
    let trust = t.f.engine.snapshot().trust;
    assert_eq!(trust.state, "stale-release");
    assert!(
        trust.message.starts_with("release 1 of c1 expired at "),
        "{}",
        trust.message
    );
    // The published snapshot (what the connection reports) flipped too.
    assert_eq!(t.f._status.borrow().trust.state, "stale-release");
    // A server offering only an expired newer release gets nothing applied.
    let v2 = t.f.manifest("app", "2", &[("/etc/app.conf", b"two", 0o644)]);
    t.desire(&[&v2], Some(release(2, T0 + 1500, &[&v2]))).await;
    assert_eq!(t.f.engine.installed()["app"], "1");
    let (_, state, message) = t.f.status("app");
    assert_eq!(state, BundleState::Failed);
    assert!(
        message.starts_with("release expired: release 1 of c1 expired at "),
        "{message}"
    );
    assert_eq!(t.f.engine.snapshot().trust.state, "stale-release");
    // Drift repair of what it has goes on.
    std::fs::write(t.f.path("/etc/app.conf"), b"edited").unwrap();
    t.f.engine.heal().await.unwrap();
    assert_eq!(t.f.read("/etc/app.conf").unwrap().0, b"one");
}

#[tokio::test]
async fn with_trust_off_a_release_changes_nothing() {
    let mut f = fixture();
    let m = f.manifest("app", "1", &[("/etc/app.conf", b"one", 0o644)]);
    f.generation += 1;
    let d = pb::DesiredState {
        generation: f.generation,
        bundles: vec![pb::SignedBundle::from(&unsigned(m))],
        // Malformed and unsigned: ignored with trust off.
        release: Some(pb::SignedRelease::default()),
        ..Default::default()
    };
    f.engine.accept_desired(&Desired::from(&d)).await.unwrap();
    assert_eq!(f.status("app").1, BundleState::Applied);
    let trust = f.engine.snapshot().trust;
    assert!(!trust.enabled && trust.state.is_empty(), "{trust:?}");
    assert!(!f.state.join("trust.json").exists());
    f.generation += 1;
    let gone = pb::DesiredState {
        generation: f.generation,
        ..Default::default()
    };
    f.engine.accept_desired(&Desired::from(&gone)).await.unwrap();
    assert_eq!(f.read("/etc/app.conf"), None, "removed as before");
}

#[tokio::test]
async fn a_clock_set_back_applies_nothing_new_and_a_small_step_back_is_tolerated() {
    let mut t = trusted();
    let v1 = t.f.manifest("app", "1", &[("/etc/app.conf", b"one", 0o644)]);
    let v2 = t.f.manifest("app", "2", &[("/etc/app.conf", b"two", 0o644)]);
    t.desire(&[&v1], Some(release(1, T0 + HOUR, &[&v1]))).await;
    t.events();
    // Two minutes back: beyond the 60 s tolerance.
    t.clock.0.store(T0 - 120_000, Ordering::SeqCst);
    t.desire(&[&v2], Some(release(2, T0 + HOUR, &[&v2]))).await;
    assert_eq!(t.f.engine.installed()["app"], "1");
    let (_, state, message) = t.f.status("app");
    assert_eq!(state, BundleState::Failed);
    assert!(message.starts_with("clock: the node's clock reads "), "{message}");
    let trust = t.f.engine.snapshot().trust;
    assert_eq!((trust.state.as_str(), trust.release_version), ("clock", 1));
    let refused: Vec<_> = t
        .events()
        .into_iter()
        .filter(|(k, _)| k == "release_refused")
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    t.clock.0.store(T0 - 119_000, Ordering::SeqCst);
    t.desire(&[&v2], Some(release(2, T0 + HOUR, &[&v2]))).await;
    assert!(
        !t.events().iter().any(|(k, _)| k == "release_refused"),
        "the same reason is not reported again"
    );
    // 30 s back (an NTP step): counts as the latest known time.
    t.clock.0.store(T0 - 30_000, Ordering::SeqCst);
    t.desire(&[&v2], Some(release(2, T0 + HOUR, &[&v2]))).await;
    assert_eq!(t.f.engine.installed()["app"], "2");
    assert_eq!(t.f.engine.snapshot().trust.state, "ok");
}

#[tokio::test]
async fn an_unreadable_trust_journal_applies_and_removes_nothing_but_repairs_drift() {
    let mut t = trusted();
    let v1 = t.f.manifest("app", "1", &[("/etc/app.conf", b"one", 0o644)]);
    t.desire(&[&v1], Some(release(1, T0 + HOUR, &[&v1]))).await;
    let journal = t.f.state.join("trust.json");
    std::fs::write(&journal, b"\0garbage").unwrap();
    // The agent restarts: the journal is read again.
    let reopened = lksadmin_agent::apply::trust::Trust::open(&journal, "c1", vec![t.key.public()], 1);
    t.f.engine = Engine::open(
        EngineConfig {
            state_dir: StateDir::new(&t.f.state),
            root: t.f.root.clone(),
            node: "node-1".into(),
            trusted: vec![t.key.public()],
            arch: None,
        },
        Arc::new(t.f.source.clone()),
        Arc::new(ProcessRunner),
        t.clock.clone(),
        Reporter::default(),
    )
    .unwrap()
    .with_trust(reopened);
    let trust = t.f.engine.snapshot().trust;
    assert_eq!(trust.state, "refused");
    assert!(trust.message.contains("trust.json"), "{}", trust.message);
    assert_eq!(std::fs::read(&journal).unwrap(), b"\0garbage", "never reset");

    let v2 = t.f.manifest("app", "2", &[("/etc/app.conf", b"two", 0o644)]);
    t.desire(&[&v2], Some(release(2, T0 + HOUR, &[&v2]))).await;
    assert_eq!(t.f.engine.installed()["app"], "1");
    assert!(t.f.status("app").2.starts_with("trust state unreadable: "));
    t.desire(&[], None).await;
    assert_eq!(t.f.read("/etc/app.conf").unwrap().0, b"one", "not removed");
    std::fs::write(t.f.path("/etc/app.conf"), b"edited").unwrap();
    t.f.engine.heal().await.unwrap();
    assert_eq!(t.f.read("/etc/app.conf").unwrap().0, b"one", "drift repaired");
}

#[tokio::test]
async fn after_a_root_rotation_the_new_keys_sign_releases_and_bundles() {
    use lks_proto::release::{SignedRoot, TrustRoot};
    let old = SigningKey::generate();
    let new = SigningKey::generate();
    let clock = Arc::new(TestClock(AtomicI64::new(T0)));
    let mut f = fixture_trust(vec![old.public()], clock.clone(), Some((vec![old.public()], 1)));
    let v1 = f.manifest("app", "1", &[("/etc/app.conf", b"one", 0o644)]);
    let rotation = SignedRoot::sign(
        TrustRoot {
            version: 2,
            keys: vec![new.public()],
            threshold: 1,
            expires_at_ms: TrustRoot::NEVER_EXPIRES,
        },
        &[&old, &new],
    );
    f.generation += 1;
    let d = pb::DesiredState {
        generation: f.generation,
        bundles: vec![pb::SignedBundle::from(&new.sign_bundle(v1.clone()))],
        release: Some(pb::SignedRelease::from(&SignedRelease::sign(
            release(1, T0 + HOUR, &[&v1]),
            &[&new],
        ))),
        roots: vec![pb::SignedRoot::from(&rotation)],
        ..Default::default()
    };
    f.engine.accept_desired(&Desired::from(&d)).await.unwrap();
    assert_eq!(f.status("app"), ("1".into(), BundleState::Applied, String::new()));
    let trust = f.engine.snapshot().trust;
    assert_eq!(
        (trust.state.as_str(), trust.root_version, trust.release_version),
        ("ok", 2, 1)
    );
    // The rotated-out key signs nothing any more.
    let v2 = f.manifest("app", "2", &[("/etc/app.conf", b"two", 0o644)]);
    f.generation += 1;
    let d = pb::DesiredState {
        generation: f.generation,
        bundles: vec![pb::SignedBundle::from(&old.sign_bundle(v2.clone()))],
        release: Some(pb::SignedRelease::from(&SignedRelease::sign(
            release(2, T0 + HOUR, &[&v2]),
            &[&old],
        ))),
        ..Default::default()
    };
    f.engine.accept_desired(&Desired::from(&d)).await.unwrap();
    assert_eq!(f.engine.installed()["app"], "1");
    assert_eq!(f.engine.snapshot().trust.state, "refused");
}
