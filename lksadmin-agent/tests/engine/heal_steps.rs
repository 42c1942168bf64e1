//! `on_heal` steps: run after a heal pass restored a file of their bundle,
//! never otherwise; a failing one is reported, never rolled back.

use super::*;

/// A step that appends `line` to the step log, on heal too if `on_heal`.
fn log_step(f: &Fixture, name: &str, line: &str, on_heal: bool) -> Step {
    Step {
        on_heal,
        ..sh(name, &format!("echo \"{line}\" >> {}", f.log.display()))
    }
}

fn logged_health(f: &Fixture) -> Option<HealthCheck> {
    health(&format!("echo healthy >> {}", f.log.display()), 1)
}

#[tokio::test]
async fn a_repair_runs_the_on_heal_steps_then_the_health_check() {
    let mut f = fixture();
    let mut m = f.manifest(
        "k",
        "1",
        &[
            ("/etc/k/dropin.conf", b"ExecStart=/usr/bin/k", 0o644),
            ("/etc/k/other.conf", b"other", 0o644),
        ],
    );
    m.steps = vec![
        log_step(&f, "daemon-reload", "reload", false),
        log_step(&f, "restart k", "restart $LKS_BUNDLE@$LKS_VERSION", true),
    ];
    m.health = logged_health(&f);
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.status("k").1, BundleState::Applied);
    assert_eq!(f.log_lines(), vec!["reload", "restart k@1", "healthy"]);
    f.event_kinds();

    // Nothing drifted: no step, no health check.
    assert!(f.engine.heal().await.unwrap().repaired.is_empty());
    assert_eq!(f.log_lines().len(), 3);

    std::fs::write(f.path("/etc/k/dropin.conf"), b"ExecStart=/tmp/evil").unwrap();
    std::fs::remove_file(f.path("/etc/k/other.conf")).unwrap();
    let report = f.engine.heal().await.unwrap();
    assert_eq!(report.repaired.len(), 2, "{report:?}");
    // Once per pass, however many files were restored; only the on_heal step.
    assert_eq!(
        f.log_lines()[3..],
        ["restart k@1".to_string(), "healthy".to_string()]
    );
    assert_eq!(f.event_kinds(), vec!["repaired"]);
    let last = f.engine.state().last_repair.clone().unwrap();
    assert_eq!(
        last.message,
        "restored /etc/k/dropin.conf (content changed), /etc/k/other.conf (missing); \
         ran step \"restart k\"; health check passed"
    );
    assert_eq!(f.status("k"), ("1".into(), BundleState::Applied, String::new()));
}

#[tokio::test]
async fn no_step_runs_when_nothing_could_be_restored() {
    let mut f = fixture();
    let mut m = f.manifest("k", "1", &[("/etc/k/dropin.conf", b"dropin", 0o644)]);
    m.steps = vec![log_step(&f, "restart k", "restart", true)];
    m.health = logged_health(&f);
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.log_lines(), vec!["restart", "healthy"]);
    f.event_kinds();

    // Offline, with the cached blob gone: the repair fails entirely.
    f.source.clear();
    std::fs::remove_file(f.state.join("cache/sha256").join(Digest::of(b"dropin").hex())).unwrap();
    std::fs::write(f.path("/etc/k/dropin.conf"), b"edited").unwrap();
    let report = f.engine.heal().await.unwrap();
    assert!(
        report.repaired.is_empty() && report.failed.len() == 1,
        "{report:?}"
    );
    assert_eq!(f.event_kinds(), vec!["repair_failed"]);
    assert_eq!(
        f.log_lines().len(),
        2,
        "no step, no health check: {:?}",
        f.log_lines()
    );
}

#[tokio::test]
async fn a_failing_on_heal_step_is_reported_and_the_health_check_still_runs() {
    let mut f = fixture();
    let mut m = f.manifest("k", "1", &[("/etc/k/dropin.conf", b"dropin", 0o644)]);
    let broken = f.root.join("broken");
    m.steps = vec![
        Step {
            on_heal: true,
            ..sh(
                "systemctl restart k",
                &format!(
                    "if [ -e {} ]; then echo no unit >&2; exit 3; fi",
                    broken.display()
                ),
            )
        },
        log_step(&f, "after", "after", true),
    ];
    m.health = logged_health(&f);
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.status("k").1, BundleState::Applied);
    assert_eq!(f.log_lines(), vec!["after", "healthy"]);
    f.event_kinds();

    std::fs::write(&broken, b"").unwrap();
    std::fs::remove_file(f.path("/etc/k/dropin.conf")).unwrap();
    let report = f.engine.heal().await.unwrap();
    assert_eq!(report.repaired.len(), 1, "{report:?}");
    assert_eq!(f.read("/etc/k/dropin.conf"), Some((b"dropin".to_vec(), 0o644)));
    // The step after the failed one did not run; the health check did.
    assert_eq!(f.log_lines()[2..], ["healthy".to_string()]);
    assert_eq!(f.event_kinds(), vec!["repaired"], "never a rollback");
    let last = f.engine.state().last_repair.clone().unwrap();
    assert_eq!(last.outcome, "repaired");
    assert_eq!(
        last.message,
        "restored /etc/k/dropin.conf (missing); step \"systemctl restart k\" exited with \
         status 3: no unit; health check passed"
    );
    assert_eq!(f.status("k"), ("1".into(), BundleState::Applied, String::new()));
}
