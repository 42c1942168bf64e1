//! Hard links and swapped directories planted in the node's root.

use super::*;

// ---- the node root: hard links and swaps between verify and rename -------

struct Secret {
    path: PathBuf,
    bytes: Vec<u8>,
    ino: u64,
    mtime_ns: i128,
}

impl Secret {
    fn plant(dir: &Path) -> Secret {
        let path = dir.join("shadow");
        let bytes = b"root:$6$not-for-the-agent:19000:0:99999:7:::\n".to_vec();
        std::fs::write(&path, &bytes).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let m = std::fs::metadata(&path).unwrap();
        Secret {
            ino: m.ino(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            path,
            bytes,
        }
    }

    /// True if the file, its inode and its mtime are untouched.
    fn intact(&self) -> bool {
        let m = std::fs::metadata(&self.path).unwrap();
        std::fs::read(&self.path).unwrap() == self.bytes
            && m.ino() == self.ino
            && i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()) == self.mtime_ns
            && m.mode() & 0o7777 == 0o600
    }

    fn link_at(&self, at: &Path) {
        let _ = std::fs::remove_file(at);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::hard_link(&self.path, at).unwrap();
    }
}

fn ino(p: &Path) -> u64 {
    std::fs::symlink_metadata(p).map(|m| m.ino()).unwrap_or(0)
}

/// Starts the agent with a fault point armed, lets it reach it and die.
fn run_until_fault(agent: &mut Agent, point: &str, roll_out: impl FnOnce()) {
    agent.wrapper = vec!["env".into(), format!("LKS_AGENT_FAULT={point}")];
    agent.start();
    agent.wait_connected();
    roll_out();
    wait_until(CONVERGE, "the agent to stop at its fault point", || {
        agent.exited().is_some()
    });
    agent.wrapper.clear();
}

#[test]
fn hard_links_and_swapped_dirs_planted_in_the_root_are_never_written_through() {
    let start = Instant::now();
    let server = Server::start();
    server.create_cluster("c1");
    let mut agent = Agent::new("planted");
    agent.heal_interval = "1s".into();
    agent.join(&server, "c1", &[]);
    // The file a hostile local user wants the agent to overwrite: same
    // filesystem as the root (a hard link cannot cross one), outside it.
    let secret = Secret::plant(agent.work_dir());
    let outside = agent.work_dir().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let mut tally = Tally::default();

    a_link_at_a_managed_path_before_the_first_apply(&server, &mut agent, &secret, &mut tally);
    a_file_swapped_for_a_link_is_healed(&mut agent, &secret, &mut tally);
    links_planted_between_verify_and_rename_are_replaced(&server, &mut agent, &secret, &mut tally);
    let msg = a_staged_dir_swapped_for_a_symlink_out_of_the_root_fails(&server, &mut agent, &outside);
    let Tally { links, mut through } = tally;
    let tried = links + 1;
    let replaced = links - through;
    let outside_entries = std::fs::read_dir(&outside).unwrap().count();
    if outside_entries != 0 {
        through += 1;
    }
    let refused = u32::from(msg.contains("leave the node root"));

    // The agent is still alive and still applies what is legitimate.
    let v3 = write_bundle(server.work_dir(), "hl", "3", &hl_files(b"a v3\n", b"b v3\n"), "");
    publish_and_roll_out(&server, "c1", &v3, None);
    wait_node_bundle(&server, "planted", "hl", "3", "applied");
    let still_applies = agent.read("/etc/hl/a") == Some((b"a v3\n".to_vec(), 0o644));
    let panics = panics_in(&agent.log()) + panics_in(&server.log());
    println!(
        "HOSTILE planted-links: tried={tried} refused={refused} links_replaced={replaced} \
         written={through} outside_entries={outside_entries} secret_intact={} panics={panics} \
         agent_still_applies={} secs={:.1}",
        u8::from(secret.intact()),
        u8::from(still_applies),
        start.elapsed().as_secs_f64()
    );
    assert_eq!((tried, replaced, through), (5, 4, 0));
    assert_eq!(outside_entries, 0, "nothing written outside the root");
    assert_eq!(refused, 1, "{msg}");
    assert!(secret.intact());
    assert_eq!(
        std::fs::metadata(&secret.path).unwrap().nlink(),
        1,
        "every planted link was replaced"
    );
    assert!(still_applies);
    assert_eq!(panics, 0);
    assert_eq!(agent.stop(), Some(0));
}

/// The planted links checked, and those written through.
#[derive(Default)]
struct Tally {
    links: u32,
    through: u32,
}

impl Tally {
    /// Counts a planted link; written through when the secret changed or
    /// `target` is the secret's inode.
    fn check(&mut self, secret: &Secret, what: &str, target: Option<&Path>) {
        self.links += 1;
        let ok = secret.intact() && target.is_none_or(|t| ino(t) != secret.ino);
        if !ok {
            self.through += 1;
            eprintln!("{what}: written through");
        }
    }
}

/// Bundle hl's two files, with contents `a` and `b`.
fn hl_files(a: &'static [u8], b: &'static [u8]) -> Vec<BundleFile<'static>> {
    vec![
        BundleFile {
            path: "/etc/hl/a",
            content: a,
            mode: "0644",
        },
        BundleFile {
            path: "/etc/hl/b",
            content: b,
            mode: "0644",
        },
    ]
}

/// Case 1: a hard link at a managed path before the first apply.
fn a_link_at_a_managed_path_before_the_first_apply(
    server: &Server,
    agent: &mut Agent,
    secret: &Secret,
    tally: &mut Tally,
) {
    secret.link_at(&agent.path("/etc/hl/a"));
    agent.start();
    let v1 = write_bundle(server.work_dir(), "hl", "1", &hl_files(b"a v1\n", b"b v1\n"), "");
    publish_and_roll_out(server, "c1", &v1, None);
    wait_node_bundle(server, "planted", "hl", "1", "applied");
    assert_eq!(agent.read("/etc/hl/a"), Some((b"a v1\n".to_vec(), 0o644)));
    tally.check(secret, "link before apply", Some(&agent.path("/etc/hl/a")));
}

/// Case 2, drift: a managed file swapped for a hard link; heal replaces it.
fn a_file_swapped_for_a_link_is_healed(agent: &mut Agent, secret: &Secret, tally: &mut Tally) {
    secret.link_at(&agent.path("/etc/hl/b"));
    wait_until(CONVERGE, "heal to replace the planted link", || {
        agent.read("/etc/hl/b") == Some((b"b v1\n".to_vec(), 0o644))
    });
    tally.check(secret, "link as drift", Some(&agent.path("/etc/hl/b")));
    assert_eq!(agent.stop(), Some(0));
}

/// Case 3, between verify and rename: v2 is staged and backed up, the agent
/// dies, links appear at an existing and at a new target, it restarts.
fn links_planted_between_verify_and_rename_are_replaced(
    server: &Server,
    agent: &mut Agent,
    secret: &Secret,
    tally: &mut Tally,
) {
    let mut v2_files = hl_files(b"a v2\n", b"b v2\n");
    v2_files.push(BundleFile {
        path: "/etc/hl/c",
        content: b"c v2\n",
        mode: "0600",
    });
    let v2 = write_bundle(server.work_dir(), "hl", "2", &v2_files, "");
    run_until_fault(agent, "switching", || {
        publish_and_roll_out(server, "c1", &v2, None);
    });
    secret.link_at(&agent.path("/etc/hl/a"));
    secret.link_at(&agent.path("/etc/hl/c"));
    agent.start();
    wait_node_bundle(server, "planted", "hl", "2", "applied");
    assert_eq!(agent.read("/etc/hl/a"), Some((b"a v2\n".to_vec(), 0o644)));
    assert_eq!(agent.read("/etc/hl/c"), Some((b"c v2\n".to_vec(), 0o600)));
    tally.check(
        secret,
        "link at an existing target between verify and rename",
        Some(&agent.path("/etc/hl/a")),
    );
    tally.check(
        secret,
        "link at a new target between verify and rename",
        Some(&agent.path("/etc/hl/c")),
    );
    assert_eq!(agent.stop(), Some(0));
}

/// Case 4, between verify and rename: the staged file's directory is swapped
/// for a symlink to a directory outside the root. Returns the failure.
fn a_staged_dir_swapped_for_a_symlink_out_of_the_root_fails(
    server: &Server,
    agent: &mut Agent,
    outside: &Path,
) -> String {
    let sw = write_bundle(
        server.work_dir(),
        "sw",
        "1",
        &[BundleFile {
            path: "/etc/sw/x",
            content: b"x\n",
            mode: "0644",
        }],
        "",
    );
    run_until_fault(agent, "switching", || {
        publish_and_roll_out(server, "c1", &sw, None);
    });
    std::fs::rename(agent.path("/etc/sw"), agent.work_dir().join("sw.moved")).unwrap();
    std::os::unix::fs::symlink(outside, agent.path("/etc/sw")).unwrap();
    agent.start();

    wait_node_bundle(server, "planted", "sw", "1", "failed")
}
