//! Removal, status and systemd readiness with no server; the fuzz seeds.

use super::*;

#[test]
fn crash_during_removal_ends_with_the_original_back() {
    let base = baseline();
    let original: Files = BTreeMap::from([
        ("/etc/app/a.conf", Some((&b"pre-existing a"[..], 0o644))),
        ("/etc/app/b.conf", None),
        ("/usr/bin/c", None),
    ]);
    for point in [
        "staging",
        "staged-partial",
        "backing-up",
        "switching",
        "switch-partial",
        "committed",
        "state-saved",
    ] {
        let n = base.clone_dirs();
        n.desire(2, vec![]);
        n.crash_at(point);
        n.assert_each_file_old_or_new(&v1_files(), &original, point);
        n.run_until("bundle removed after restart", |n| n.bundle_state().is_none());
        assert!(n.matches(&original), "{point}: original not restored");
        n.assert_clean(point);
    }
    // The removal also works without any crash, from nothing.
    assert!(nothing().values().all(Option::is_none));
}

#[test]
fn status_shows_the_local_view_offline() {
    let n = baseline();
    let out = Command::new(AGENT)
        .args(["status", "-o", "json", "--state-dir"])
        .arg(&n.state)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["node"], "crash-node");
    assert_eq!(v["cluster"], "c1");
    assert_eq!(v["bundles"][0]["name"], "app");
    assert_eq!(v["bundles"][0]["version"], "1");
    assert_eq!(v["bundles"][0]["state"], "applied");
    assert_eq!(v["last_apply"]["outcome"], "applied");
    assert_eq!(v["connection"]["connected"], false);
    assert_eq!(v["connection"]["agent_running"], false);
    let text = Command::new(AGENT)
        .args(["status", "--state-dir"])
        .arg(&n.state)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("crash-node (cluster c1)"), "{text}");
    assert!(text.contains("agent not running"), "{text}");
}

#[test]
fn ready_status_and_watchdog_reach_systemd_without_a_server() {
    let n = baseline();
    let sock_path = n.state.parent().unwrap().join("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut child = n.spawn_env(
        None,
        &[
            ("NOTIFY_SOCKET", sock_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "400000"),
        ],
    );
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        let Ok(len) = sock.recv(&mut buf) else { break };
        let msg = String::from_utf8_lossy(&buf[..len]).into_owned();
        seen.push(msg);
        let all = seen.join("\n");
        if all.contains("READY=1") && all.matches("WATCHDOG=1").count() >= 2 {
            break;
        }
    }
    terminate(&mut child);
    let all = seen.join("\n");
    // The server (127.0.0.1:1) is unreachable: readiness never waits for it.
    assert!(all.contains("READY=1"), "{all}");
    assert!(
        all.contains("STATUS=node crash-node of cluster c1: local state loaded"),
        "{all}"
    );
    assert!(all.matches("WATCHDOG=1").count() >= 2, "{all}");
}

/// Not a check: `LKS_FUZZ_SEEDS=<dir>` collects the journal, state and
/// desired-state files the real agent leaves at a few crash points (an
/// upgrade, a failing upgrade, a removal) as seeds for the fuzz corpus:
/// `<dir>/journal/` and `<dir>/state/` (state.json and desired.pb alike),
/// and the example bundles, signed and encoded as on the wire, in
/// `<dir>/pb_manifest/`. `bash scripts/fuzz.sh --seed` runs it.
#[test]
#[ignore = "writes fuzz seeds; run by scripts/fuzz.sh --seed"]
fn write_fuzz_seeds() {
    let out = PathBuf::from(std::env::var_os("LKS_FUZZ_SEEDS").expect("LKS_FUZZ_SEEDS names the seed dir"));
    for sub in ["journal", "state", "pb_manifest"] {
        std::fs::create_dir_all(out.join(sub)).unwrap();
    }
    let keep = |n: &Node, case: &str| {
        let dirs = StateDir::new(&n.state);
        for (from, to) in [
            (dirs.journal(), out.join("journal").join(format!("{case}.json"))),
            (dirs.state(), out.join("state").join(format!("{case}.state.json"))),
            (
                dirs.desired(),
                out.join("state").join(format!("{case}.desired.pb")),
            ),
        ] {
            if from.exists() {
                std::fs::copy(from, to).unwrap();
            }
        }
    };
    let base = baseline();
    keep(&base, "baseline");
    let cases: [(&str, Vec<Manifest>, &[&str]); 3] = [
        (
            "upgrade",
            vec![manifest("2", &v2_files(), false)],
            &["switching", "committed"],
        ),
        (
            "failing",
            vec![manifest("2", &v2_files(), true)],
            &["checking", "rolling-back"],
        ),
        ("removal", vec![], &["switch-partial"]),
    ];
    for (case, bundles, points) in cases {
        for point in points {
            let n = base.clone_dirs();
            n.desire(2, bundles.clone());
            n.crash_at(point);
            keep(&n, &format!("{case}-{point}"));
        }
    }
    let key = lks_proto::sign::SigningKey::generate();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/bundles");
    for e in std::fs::read_dir(examples).unwrap().flatten() {
        let Ok(b) = lks_proto::authoring::load_bundle_dir(&e.path(), &mut lks_proto::authoring::RequireSize)
        else {
            continue;
        };
        let signed = SignedBundle {
            chunks_signature: None,
            signature: Some(key.sign(&b.manifest)),
            manifest: b.manifest,
        };
        let name = format!("{}.pb", e.file_name().to_string_lossy());
        let bytes = prost::Message::encode_to_vec(&pb::SignedBundle::from(&signed));
        std::fs::write(out.join("pb_manifest").join(name), bytes).unwrap();
    }
}
