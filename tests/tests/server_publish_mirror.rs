//! `lksctl bundle publish` with a mirrored file that gives no `size`: the
//! CLI downloads it once from the mirror, checks the declared sha256 and
//! records the size; a mirror serving other bytes, or no bytes, is refused
//! with one line and nothing is stored.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use lks_e2e::agent::Mirror;
use lks_e2e::one_line_error;
use lks_e2e::server::Server;
use lks_proto::Digest;

const BINARY: &[u8] = b"#!/bin/sh\necho pretend kubelet\n";

fn bundle_dir(server: &Server, version: &str, url: &str, sha_hex: &str) -> std::path::PathBuf {
    let d = server.work_dir().join(format!("mirrored-{version}"));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("bundle.toml"),
        format!(
            "name = \"mirrored\"\nversion = \"{version}\"\n\n[[file]]\npath = \"/usr/local/bin/tool\"\n\
             url = \"{url}\"\nsha256 = \"{sha_hex}\"\nmode = \"0755\"\n"
        ),
    )
    .unwrap();
    d
}

#[test]
fn publish_sizes_mirrored_files_and_checks_their_digest() {
    let server = Server::start();
    let mirror = Mirror::start(BTreeMap::from([
        ("/tool".to_string(), BINARY.to_vec()),
        ("/other".to_string(), b"not the tool".to_vec()),
    ]));
    let good = Digest::of(BINARY).hex();

    let dir = bundle_dir(&server, "1", &format!("{}/tool", mirror.url), &good);
    assert_eq!(server.publish(&dir).trim(), "mirrored@1");
    let list = server.lksctl_json(&["bundle", "list"]);
    let b = list
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "mirrored")
        .expect("published bundle listed");
    assert_eq!(b["total_size"].as_u64(), Some(BINARY.len() as u64), "{b}");

    // The mirror serves other bytes under the URL: refused, nothing stored.
    let dir = bundle_dir(&server, "2", &format!("{}/other", mirror.url), &good);
    let out = server.lksctl(&["bundle", "publish", dir.to_str().unwrap()]);
    let err = one_line_error(&out, "publish with a wrong mirror digest");
    assert!(
        err.contains("file[0].size") && err.contains("not the declared"),
        "{err}"
    );

    // The mirror does not have the file at all.
    let dir = bundle_dir(&server, "3", &format!("{}/missing", mirror.url), &good);
    let out = server.lksctl(&["bundle", "publish", dir.to_str().unwrap()]);
    let err = one_line_error(&out, "publish with a missing mirror file");
    assert!(err.contains("HTTP 404"), "{err}");

    let list = server.lksctl_json(&["bundle", "list"]);
    let versions: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["name"] == "mirrored")
        .map(|b| b["version"].as_str().unwrap())
        .collect();
    assert_eq!(versions, ["1"], "refused versions are not stored");
}
