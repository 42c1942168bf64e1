//! Release trust across a crash: the release an apply runs under is in
//! `trust.json` before the apply starts, so a node killed mid-apply and
//! restarted against a stale server (one that replays the older signed
//! release) finishes the newer version and refuses the older one.

use lks_proto::canonical::manifest_digest;
use lks_proto::release::{Release, ReleasedBundle, SignedRelease};
use lks_proto::sign::SigningKey;
use lksadmin_agent::apply::trust::TrustFile;

use super::*;

fn release(version: u64, m: &Manifest) -> pb::SignedRelease {
    let r = Release {
        channel: "c1".into(),
        version,
        // Valid for a day from now: the agent reads the real clock.
        expires_at_ms: lksadmin_agent::clock::now_ms() + 86_400_000,
        bundles: [(
            m.name.clone(),
            ReleasedBundle {
                version: m.version.clone(),
                manifest_digest: manifest_digest(m),
            },
        )]
        .into(),
    };
    KEY.with(|k| pb::SignedRelease::from(&SignedRelease::sign(r, &[k])))
}

thread_local! {
    static KEY: SigningKey = SigningKey::generate();
}

impl Node {
    /// Turns release records on (threshold 1, this thread's key).
    fn require_releases(&self) {
        let dirs = StateDir::new(&self.state);
        std::fs::create_dir_all(dirs.trusted()).unwrap();
        let public = KEY.with(|k| k.public().to_pem());
        std::fs::write(dirs.trusted().join("key-0.pub"), public).unwrap();
        let mut cfg = dirs.load_config().unwrap();
        cfg.trust_threshold = 1;
        std::fs::write(dirs.config(), cfg.to_toml()).unwrap();
    }

    /// [`Node::desire`] of one bundle, signed, with a signed release.
    fn desire_released(&self, generation: u64, m: Manifest, release: pb::SignedRelease) {
        self.desire(generation, vec![]);
        let d = pb::DesiredState {
            generation,
            bundles: vec![KEY.with(|k| pb::SignedBundle::from(&k.sign_bundle(m)))],
            release: Some(release),
            ..Default::default()
        };
        save_desired(&StateDir::new(&self.state).desired(), &Desired::from(&d)).unwrap();
    }

    fn trust_file(&self) -> TrustFile {
        lks_proto::fsutil::read_json(&StateDir::new(&self.state).trust())
            .unwrap()
            .unwrap()
    }
}

#[test]
fn a_release_is_journalled_before_its_apply_and_a_replayed_older_one_is_refused_after_a_crash() {
    let n = Node::new();
    n.require_releases();
    let v1 = manifest("1", &v1_files(), false);
    let v2 = manifest("2", &v2_files(), false);
    n.desire_released(1, v1.clone(), release(1, &v1));
    n.run_until("v1 applied under release 1", |n| {
        n.bundle_state() == Some(("1".into(), BundleState::Applied))
    });
    assert!(n.matches(&v1_files()));

    // Release 2 with v2; the agent dies once v2's commit record is down.
    n.desire_released(2, v2.clone(), release(2, &v2));
    n.crash_at("committed");
    assert_eq!(
        n.trust_file().state.release_version,
        2,
        "journalled before the apply"
    );

    // A stale server replays release 1 with v1 to the restarted node.
    n.desire_released(3, v1.clone(), release(1, &v1));
    n.run_until("v2 finished and v1 refused", |n| {
        n.bundle_state() == Some(("1".into(), BundleState::Failed))
    });
    assert!(n.matches(&v2_files()), "v2 stays installed");
    n.assert_clean("after the replay");
    let r = &n.local_state().bundles["app"];
    assert_eq!(r.installed.as_ref().map(|m| m.version.as_str()), Some("2"));
    assert_eq!(
        r.status.message,
        "not released: bundle app@1 is not in release 2 of c1 (it releases version 2)"
    );
    let t = n.trust_file();
    assert_eq!(t.state.release_version, 2);
    let refusal = t.refusal.expect("the replay is recorded as refused");
    assert!(
        refusal.message.contains("older than release 2"),
        "{}",
        refusal.message
    );
}
