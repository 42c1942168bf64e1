//! Resources (issue [reliability] item 4): the node root on a small tmpfs
//! that fills while a new version is staged. One clear error, the old
//! version intact, no staged leftovers (the space is given back), and the
//! version applies once space is freed. The server's data dir full: a
//! publish is refused with one line, nothing half-stored, connected agents
//! keep their streams. Each test prints one `RESFAULT` line.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use lks_e2e::agent::{Agent, BundleFile, CONVERGE, node_connected, write_bundle};
use lks_e2e::rollout::Fleet;
use lks_e2e::server::Server;
use lks_e2e::wait_until;

/// A tmpfs mounted on a directory, unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs needs root (CAP_SYS_ADMIN): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Tmpfs(dir.to_path_buf())
    }

    fn resize(&self, size: &str) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "remount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Bytes in use (statvfs).
    fn used(&self) -> u64 {
        let s = nix::sys::statvfs::statvfs(&self.0).expect("statvfs");
        (s.blocks() - s.blocks_free()) * s.fragment_size()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

fn bundle(f: &Fleet, version: &str, files: &[(&str, Vec<u8>)]) -> String {
    let fs: Vec<BundleFile<'_>> = files
        .iter()
        .map(|(p, c)| BundleFile {
            path: p,
            content: c,
            mode: "0644",
        })
        .collect();
    let dir = write_bundle(f.server.work_dir(), "fill", version, &fs, "");
    f.server.publish(&dir)
}

#[test]
fn root_fills_mid_stage_one_error_old_version_intact_space_back_then_retry_applies() {
    let t0 = Instant::now();
    let mut f = Fleet::start("c1", 0);
    let mut a = Agent::new("n1");
    let disk = Tmpfs::mount(&a.root, "6m");
    a.join(&f.server, "c1", &[]);
    a.start();
    a.wait_connected();
    f.agents.push(a);
    let old = vec![1u8; 1 << 20];
    let v1 = bundle(&f, "1", &[("/etc/fill/a", old.clone())]);
    f.roll_out(&v1, &[]);
    let a = f.agent("n1");
    a.wait_bundle("fill", "1", "applied");
    let used_v1 = disk.used();
    let files_v1 = files_under(&a.root);

    // v2 needs about 8 MiB next to the old 1 MiB: the 6 MiB root fills mid-stage.
    let (b, c) = (vec![2u8; 4 << 20], vec![3u8; 4 << 20]);
    let v2 = bundle(&f, "2", &[("/etc/fill/a", b.clone()), ("/etc/fill/b", c.clone())]);
    f.roll_out(&v2, &[]);
    let mut msg = String::new();
    wait_until(CONVERGE, "v2 fails for lack of space", || {
        match a.bundle("fill") {
            Some((v, s, m)) if v == "2" && (s == "failed" || s == "rolled_back") => {
                msg = m;
                true
            }
            _ => false,
        }
    });
    assert_eq!(msg.lines().count(), 1, "one line: {msg}");
    assert!(
        msg.contains("No space left") || msg.contains("space"),
        "says why: {msg}"
    );
    assert_eq!(
        a.read("/etc/fill/a").map(|(b, _)| b == old),
        Some(true),
        "v1 intact"
    );
    assert_eq!(
        files_under(&a.root),
        files_v1,
        "nothing staged is left in the root"
    );
    assert!(
        disk.used() <= used_v1 + 64 * 1024,
        "space given back: {} > {used_v1}",
        disk.used()
    );

    // Space freed: a retry applies v2.
    disk.resize("32m");
    f.server.lksctl_ok(&["node", "retry", "n1", "--bundle", "fill"]);
    wait_until(Duration::from_secs(60), "v2 applies after the retry", || {
        a.bundle("fill")
            .is_some_and(|(v, s, _)| v == "2" && s == "applied")
    });
    assert_eq!(a.read("/etc/fill/a").map(|(x, _)| x == b), Some(true));
    assert_eq!(a.read("/etc/fill/b").map(|(x, _)| x == c), Some(true));
    eprintln!(
        "RESFAULT node-root-full-mid-stage: tries=1 clear_errors=1 old_version_intact=1 leftover_files=0 \
         retry_applied=1 secs={:.1} error={msg:?}",
        t0.elapsed().as_secs_f64()
    );
    let mut a = f.agents.pop().unwrap();
    a.stop();
    drop(disk);
    drop(a);
}

#[test]
fn server_data_dir_full_refuses_publish_in_one_line_and_keeps_streams() {
    let t0 = Instant::now();
    let mut disk = None;
    let server = Server::start_prepared(&[], |d| disk = Some(Tmpfs::mount(d, "12m")));
    let disk = disk.expect("mounted");
    server.create_cluster("c1");
    let mut a = Agent::new("n1");
    a.join(&server, "c1", &[]);
    a.start();
    a.wait_connected();
    let connects = |a: &Agent| a.log().matches(" connected server=").count();
    let before = connects(&a);
    assert!(before >= 1, "the agent logs its connection:\n{}", a.log());
    let big = vec![5u8; 16 << 20];
    let dir = write_bundle(
        server.work_dir(),
        "huge",
        "1",
        &[BundleFile {
            path: "/opt/huge",
            content: &big,
            mode: "0644",
        }],
        "",
    );
    let out = server.lksctl(&["bundle", "publish", dir.to_str().unwrap()]);
    let err = lks_e2e::one_line_error(&out, "publish onto a full data dir");
    let listed = server.lksctl_json(&["bundle", "list"]);
    assert!(
        !listed.as_array().unwrap().iter().any(|b| b["name"] == "huge"),
        "nothing half-stored is listed: {listed}"
    );
    let tmp = server.data_dir.join("blobs/tmp");
    let staged = std::fs::read_dir(&tmp).map(|d| d.count()).unwrap_or(0);
    assert_eq!(staged, 0, "staging left in {}", tmp.display());
    // The agent kept its stream, and the server still serves it.
    assert!(node_connected(&server, "n1"));
    assert_eq!(a.status()["connection"]["connected"], true);
    let small = write_bundle(
        server.work_dir(),
        "small",
        "1",
        &[BundleFile {
            path: "/etc/small",
            content: b"fits\n",
            mode: "0644",
        }],
        "",
    );
    lks_e2e::agent::publish_and_roll_out(&server, "c1", &small, None);
    a.wait_bundle("small", "1", "applied");
    assert_eq!(connects(&a), before, "the stream was never re-established");
    eprintln!(
        "RESFAULT server-data-dir-full: publishes_refused=1/1 one_line=1 half_stored=0 streams_kept=1/1 \
         later_publish_ok=1 secs={:.1} error={err:?}",
        t0.elapsed().as_secs_f64()
    );
    a.stop();
    drop(disk);
}
