//! What the engine makes of a desired state's bad entries: an invalid
//! bundle with a valid name is reported failed once, one without a valid
//! name is ignored, a name listed twice keeps its first entry.

use super::*;

impl Fixture {
    async fn desire_wire(&mut self, bundles: Vec<pb::SignedBundle>) {
        self.generation += 1;
        let d = pb::DesiredState {
            generation: self.generation,
            bundles,
            ..Default::default()
        };
        self.engine.accept_desired(&Desired::from(&d)).await.unwrap();
    }
}

#[tokio::test]
async fn an_invalid_bundle_is_reported_failed_once_under_its_name() {
    let mut f = fixture();
    let m = f.manifest("app", "2", &[("/etc/app.conf", b"two", 0o644)]);
    let mut bad = pb::SignedBundle::from(&unsigned(m));
    bad.signature = vec![1; 3];
    let key = Digest::of(&prost::Message::encode_to_vec(&bad)).to_string();
    f.desire_wire(vec![bad.clone()]).await;
    let (version, state, message) = f.status("app");
    assert_eq!((version.as_str(), state), ("2", BundleState::Failed));
    assert!(
        message.starts_with("invalid bundle app@2: signature: "),
        "{message}"
    );
    assert_eq!(
        f.engine.state().bundles["app"].sticky.as_deref(),
        Some(key.as_str())
    );
    assert_eq!(f.event_kinds(), ["failed"]);
    assert_eq!(f.read("/etc/app.conf"), None);

    f.desire_wire(vec![bad]).await;
    assert_eq!(f.event_kinds(), Vec::<String>::new(), "no news, no event");
    assert_eq!(f.status("app").2, message);
}

#[tokio::test]
async fn a_bundle_without_a_valid_name_is_ignored_and_the_rest_applied() {
    let mut f = fixture();
    let mut nameless = pb::SignedBundle::from(&unsigned(f.manifest("x", "1", &[])));
    if let Some(m) = nameless.manifest.as_mut() {
        m.name = "Not A Name".into();
    }
    let good = f.manifest("app", "1", &[("/etc/app.conf", b"one", 0o644)]);
    f.desire_wire(vec![nameless, pb::SignedBundle::from(&unsigned(good))])
        .await;
    assert_eq!(f.engine.installed(), BTreeMap::from([("app".into(), "1".into())]));
    assert_eq!(f.engine.state().bundles.len(), 1);
}

#[tokio::test]
async fn a_bundle_listed_twice_applies_its_first_entry() {
    let mut f = fixture();
    let first = f.manifest("app", "1", &[("/etc/app.conf", b"one", 0o644)]);
    let second = f.manifest("app", "2", &[("/etc/app.conf", b"two", 0o644)]);
    f.desire_wire(vec![
        pb::SignedBundle::from(&unsigned(first)),
        pb::SignedBundle::from(&unsigned(second)),
    ])
    .await;
    assert_eq!(f.status("app").0, "1");
    assert_eq!(f.read("/etc/app.conf"), Some((b"one".to_vec(), 0o644)));
}
