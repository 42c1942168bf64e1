//! Bad bundles are refused by the real agent with nothing written: a
//! checksum mismatch from a mirror, an unsigned bundle on a node that trusts
//! a publisher key, and a symlink planted in the root pointing outside.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use lks_e2e::agent::{Agent, BundleFile, Mirror, publish_and_roll_out, wait_node_bundle, write_bundle};
use lks_e2e::server::Server;

fn sha256_hex(bytes: &[u8]) -> String {
    lks_proto::Digest::of(bytes).hex()
}

#[test]
fn checksum_mismatch_from_a_mirror_fails_naming_file_and_url() {
    let server = Server::start();
    server.create_cluster("c1");
    let mut agent = Agent::new("mirror-node");
    agent.join(&server, "c1", &[]);
    agent.start();

    let real = b"the real kubelet binary".to_vec();
    let mirror = Mirror::start(BTreeMap::from([(
        "/kubelet".to_string(),
        b"the evil kubelet binary".to_vec(),
    )]));
    let url = format!("{}/kubelet", mirror.url);
    let extra = format!(
        "[[file]]\npath = \"/usr/local/bin/kubelet\"\nurl = \"{url}\"\nsha256 = \"{}\"\nsize = {}\nmode = \"0755\"\n",
        sha256_hex(&real),
        real.len()
    );
    let dir = write_bundle(server.work_dir(), "kubelet", "1", &[], &extra);
    publish_and_roll_out(&server, "c1", &dir, None);
    let msg = wait_node_bundle(&server, "mirror-node", "kubelet", "1", "failed");
    assert!(msg.contains("/usr/local/bin/kubelet"), "{msg}");
    assert!(msg.contains(&url), "{msg}");
    assert!(msg.contains("checksum mismatch"), "{msg}");
    assert_eq!(agent.read("/usr/local/bin/kubelet"), None, "nothing written");
    assert!(!agent.path("/usr").exists(), "not even a directory");
    assert_eq!(agent.stop(), Some(0));
}

#[test]
fn unsigned_bundle_is_refused_by_a_node_that_trusts_a_key() {
    let server = Server::start();
    server.create_cluster("c1");
    let prefix = server.work_dir().join("publisher");
    server.lksctl_ok(&["bundle", "keygen", "--out", prefix.to_str().unwrap()]);
    let key = prefix.with_extension("key");
    let public = prefix.with_extension("pub");
    let mut agent = Agent::new("strict-node");
    agent.join(&server, "c1", &["--trust-key", public.to_str().unwrap()]);
    agent.start();

    let files = [BundleFile {
        path: "/etc/secure.conf",
        content: b"only from the publisher",
        mode: "0600",
    }];
    let unsigned = write_bundle(server.work_dir(), "secure", "1", &files, "");
    publish_and_roll_out(&server, "c1", &unsigned, None);
    let msg = wait_node_bundle(&server, "strict-node", "secure", "1", "failed");
    assert!(msg.contains("not signed"), "{msg}");
    assert_eq!(agent.read("/etc/secure.conf"), None, "nothing written");

    let signed = write_bundle(server.work_dir(), "secure", "2", &files, "");
    publish_and_roll_out(&server, "c1", &signed, Some(&key));
    wait_node_bundle(&server, "strict-node", "secure", "2", "applied");
    assert_eq!(
        agent.read("/etc/secure.conf"),
        Some((b"only from the publisher".to_vec(), 0o600))
    );
    assert_eq!(agent.stop(), Some(0));
}

/// A node joined with `--trust-threshold` applies a signed bundle only as a
/// signed release names it: without one (a server that sends none) nothing
/// is written, and `status` says why.
#[test]
fn a_node_requiring_signed_releases_applies_nothing_without_one() {
    let server = Server::start();
    server.create_cluster("c1");
    let prefix = server.work_dir().join("publisher");
    server.lksctl_ok(&["bundle", "keygen", "--out", prefix.to_str().unwrap()]);
    let key = prefix.with_extension("key");
    let public = prefix.with_extension("pub");
    let mut agent = Agent::new("release-node");
    agent.join(
        &server,
        "c1",
        &["--trust-key", public.to_str().unwrap(), "--trust-threshold", "1"],
    );
    let config = std::fs::read_to_string(agent.state_dir.join("join.toml")).unwrap();
    assert!(config.contains("trust_threshold = 1"), "{config}");
    agent.start();

    let files = [BundleFile {
        path: "/etc/secure.conf",
        content: b"only as released",
        mode: "0600",
    }];
    let signed = write_bundle(server.work_dir(), "secure", "1", &files, "");
    publish_and_roll_out(&server, "c1", &signed, Some(&key));
    let msg = wait_node_bundle(&server, "release-node", "secure", "1", "failed");
    assert_eq!(
        msg,
        "no release: this node has accepted no signed release of c1 yet"
    );
    assert_eq!(agent.read("/etc/secure.conf"), None, "nothing written");
    let trust = &agent.status()["trust"];
    assert_eq!(trust["enabled"], true, "{trust}");
    assert_eq!(trust["state"], "no-release", "{trust}");
    assert_eq!(trust["root_version"], 1, "{trust}");
    assert!(
        agent.state_dir.join("trust.json").exists(),
        "journalled from the first start"
    );
    assert_eq!(agent.stop(), Some(0));
}

#[test]
fn symlink_planted_in_the_root_pointing_outside_is_refused() {
    let server = Server::start();
    server.create_cluster("c1");
    let mut agent = Agent::new("planted-node");
    agent.join(&server, "c1", &[]);
    let outside = agent.work_dir().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir_all(agent.path("/etc")).unwrap();
    std::os::unix::fs::symlink(&outside, agent.path("/etc/kubernetes")).unwrap();
    agent.start();

    let dir = write_bundle(
        server.work_dir(),
        "kube",
        "1",
        &[
            BundleFile {
                path: "/etc/hosts.d/a",
                content: b"inside",
                mode: "0644",
            },
            BundleFile {
                path: "/etc/kubernetes/pki/ca.crt",
                content: b"would escape",
                mode: "0644",
            },
        ],
        "",
    );
    publish_and_roll_out(&server, "c1", &dir, None);
    let msg = wait_node_bundle(&server, "planted-node", "kube", "1", "failed");
    assert!(msg.contains("leave the node root"), "{msg}");
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "nothing written outside"
    );
    assert_eq!(
        agent.read("/etc/hosts.d/a"),
        None,
        "nothing written inside either"
    );
    assert_eq!(agent.stop(), Some(0));
}
