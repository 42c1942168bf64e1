//! `reboot = "required"`: an applied version is recorded in the node's
//! reboot state (`reboot.json`), once; a version without it is not.

use lks_proto::manifest::Reboot;
use lksadmin_agent::node::reboot::{RebootSettings, Reboots, Stance};

use super::*;

#[tokio::test]
async fn an_applied_version_that_requires_a_reboot_is_recorded_once() {
    let f = fixture();
    let reboots = Reboots::open(&StateDir::new(&f.state), &f.root, RebootSettings::default()).unwrap();
    let mut f = Fixture {
        engine: f.engine.with_reboots(reboots.clone()),
        ..f
    };
    let plain = f.manifest("conf", "1", &[("/etc/conf", b"plain", 0o644)]);
    f.desire(vec![unsigned(plain.clone())]).await;
    assert_eq!(f.status("conf").1, BundleState::Applied);
    assert_eq!(reboots.report().state, Stance::None);

    let mut kernel = f.manifest("kernel", "1", &[("/boot/vmlinuz", b"k1", 0o644)]);
    kernel.reboot = Reboot::Required;
    f.desire(vec![unsigned(plain.clone()), unsigned(kernel.clone())])
        .await;
    assert_eq!(f.status("kernel").1, BundleState::Applied);
    let r = reboots.report();
    assert_eq!(
        (r.state, r.reason.as_str()),
        (Stance::Required, "bundle kernel@1")
    );
    // The same desired state again (a reconcile) records nothing new.
    f.desire(vec![unsigned(plain), unsigned(kernel)]).await;
    assert_eq!(reboots.report().reason, "bundle kernel@1");
    let file = std::fs::read_to_string(f.state.join("reboot.json")).unwrap();
    assert!(file.contains("\"kernel@1\""), "{file}");
}
