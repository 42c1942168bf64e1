//! Coordinated reboots' test agents (issue [reboots]): a sandboxed agent
//! whose reboot command simulates a reboot (a new boot ID in the file
//! `LKS_AGENT_BOOT_ID_FILE` names, the sentinel emptied, a mark left),
//! which the test restarts as the boot would; and `reboot status` read
//! back.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::agent::Agent;
use crate::server::Server;

/// An agent whose reboot command simulates a reboot, with the OS sentinel
/// set (it needs one).
pub struct Sim {
    pub agent: Agent,
    marker: PathBuf,
    /// Reboots the test carried out (restarts after the command ran).
    restarts: usize,
    /// Whether the test restarts it after its reboot command (false: the
    /// node never comes back).
    pub comes_back: bool,
}

impl Sim {
    pub fn new(server: &Server, cluster: &str, name: &str) -> Sim {
        let mut agent = Agent::new(name);
        agent.heal_interval = "500ms".into();
        let boot_id_file = agent.work_dir().join("boot_id");
        std::fs::write(&boot_id_file, format!("{name}-boot-0\n")).unwrap();
        let marker = agent.work_dir().join("rebooted");
        let script = agent.work_dir().join("reboot.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho rebooted >> '{m}'\necho \"{name}-boot-$(wc -l < '{m}')\" > '{b}'\nrm -f '{r}'/var/run/reboot-required*\n",
                m = marker.display(),
                b = boot_id_file.display(),
                r = agent.root.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        agent.run_env.push((
            "LKS_AGENT_BOOT_ID_FILE".into(),
            boot_id_file.display().to_string(),
        ));
        agent.run_args = vec!["--reboot-command".into(), script.display().to_string()];
        std::fs::create_dir_all(agent.path("/var/run")).unwrap();
        std::fs::write(
            agent.path("/var/run/reboot-required"),
            "*** System restart required ***\n",
        )
        .unwrap();
        agent.join(server, cluster, &[]);
        agent.start();
        agent.wait_connected();
        Sim {
            agent,
            marker,
            restarts: 0,
            comes_back: true,
        }
    }

    /// Times its reboot command ran.
    pub fn reboots(&self) -> usize {
        std::fs::read_to_string(&self.marker)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// Down: its reboot command ran and the test has not restarted it.
    pub fn down(&self) -> bool {
        self.reboots() > self.restarts
    }

    /// Restarts it once its reboot command ran ("the boot"); true if it did.
    pub fn boot_if_rebooted(&mut self) -> bool {
        if !self.comes_back || !self.down() {
            return false;
        }
        assert_eq!(self.agent.stop(), Some(0));
        self.restarts = self.reboots();
        self.agent.start();
        true
    }
}

pub fn status(server: &Server, cluster: &str) -> serde_json::Value {
    server.lksctl_json(&["reboot", "status", "--cluster", cluster])
}

/// Slots held in `status`.
pub fn holders(st: &serde_json::Value) -> usize {
    st["slots_taken"].as_u64().unwrap() as usize
}

pub fn node_state(st: &serde_json::Value, node: &str) -> (String, String) {
    st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == node)
        .map(|n| {
            (
                n["state"].as_str().unwrap().to_string(),
                n["message"].as_str().unwrap().to_string(),
            )
        })
        .unwrap_or_default()
}

/// Runs the simulated boots until `done`, sampling that at most `n` nodes
/// hold a slot and at most `n` are down at any time.
pub fn drive(
    server: &Server,
    cluster: &str,
    sims: &mut [Sim],
    n: usize,
    mut done: impl FnMut(&serde_json::Value) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut most_held, mut most_down) = (0, 0);
    loop {
        let st = status(server, cluster);
        // A node that never comes back stays down; its slot is freed.
        let down = sims.iter().filter(|s| s.comes_back && s.down()).count();
        most_held = most_held.max(holders(&st));
        most_down = most_down.max(down);
        assert!(holders(&st) <= n, "more than {n} slots held: {st}");
        assert!(down <= n, "more than {n} nodes down at once");
        if done(&st) {
            break;
        }
        assert!(Instant::now() < deadline, "not done in time: {st}");
        for s in sims.iter_mut() {
            s.boot_if_rebooted();
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    assert!(most_held >= 1 && most_down >= 1, "something was rebooted");
}

/// One FleetLock call as Zincati makes it, with curl: client `id`'s body
/// POSTed to `url` (with the protocol's header if `header`, and `extra`
/// curl flags). The HTTP status and the body.
pub fn fleetlock_curl(url: &str, id: &str, header: bool, extra: &[&str]) -> (u16, String) {
    let body = format!(r#"{{"client_params": {{"id": "{id}", "group": "default"}}}}"#);
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "10",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "-X",
        "POST",
    ]);
    cmd.args(extra);
    if header {
        cmd.args(["-H", "fleet-lock-protocol: true"]);
    }
    let out = cmd.args(["-d", &body, url]).output().expect("run curl");
    assert!(
        out.status.success(),
        "curl {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.trim().parse().unwrap(), body.to_string())
}
