//! `lksctl` against a real control server: every command, its output
//! contract, and one-line errors.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use lks_e2e::server::Server;
use lks_e2e::{bin, one_line_error, run};

#[test]
fn clusters_and_tokens() {
    let s = Server::start();
    clusters_are_created_checked_and_listed(&s);
    a_token_prints_a_complete_join_line_and_json(&s);
    cloud_init_installs_the_agent_and_trusts_the_publisher_keys(&s);
    bad_token_options_are_one_line_errors(&s);
}

/// Clusters: created with a generated CA, a duplicate and a bad name
/// refused, listed as a table and as JSON.
fn clusters_are_created_checked_and_listed(s: &Server) {
    let out = s.lksctl_ok(&["cluster", "create", "tenant-a"]);
    assert!(
        out.trim()
            .starts_with("cluster tenant-a created (CA generated, sha256:"),
        "{out}"
    );
    let e = one_line_error(&s.lksctl(&["cluster", "create", "tenant-a"]), "duplicate cluster");
    assert!(e.starts_with("error: ") && e.contains("already exists"), "{e}");
    let e = one_line_error(&s.lksctl(&["cluster", "create", "Bad_Name"]), "bad cluster name");
    assert!(e.contains("invalid cluster name"), "{e}");
    s.create_cluster("tenant-b");
    let list = s.lksctl_ok(&["cluster", "list"]);
    assert!(list.starts_with("NAME"), "{list}");
    assert!(list.contains("tenant-a") && list.contains("tenant-b"));
    let j = s.lksctl_json(&["cluster", "list"]);
    assert_eq!(j.as_array().unwrap().len(), 2);
}

/// The join line is complete and copy-pasteable; the JSON has every
/// field, and the pin printed is the CA the server really serves.
fn a_token_prints_a_complete_join_line_and_json(s: &Server) {
    let line = s.lksctl_ok(&["token", "create", "--cluster", "tenant-a"]);
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&words[..3], ["lksadmin-agent", "join", "--server"]);
    assert_eq!(words[3], s.url());
    assert_eq!(words[4], "--token");
    assert!(
        words[5].parse::<lks_proto::token::BootstrapToken>().is_ok(),
        "{line}"
    );
    assert_eq!(words[6], "--ca-cert-hash");
    assert!(words[7].starts_with("sha256:") && words[7].len() == 71, "{line}");
    assert_eq!(words.len(), 8, "{line}");

    let j = s.lksctl_json(&[
        "token",
        "create",
        "--cluster",
        "tenant-a",
        "--ttl",
        "1h",
        "--uses",
        "3",
        "--labels",
        "role=worker",
    ]);
    for k in ["token", "ca_cert_hash", "server", "join_command", "expires_at"] {
        assert!(j[k].is_string(), "{k} missing in {j}");
    }
    assert_eq!(j["server"], s.url());
    let exp = j["expires_at"].as_str().unwrap();
    assert!(exp.ends_with('Z') && exp.contains('T'), "RFC 3339: {exp}");
    assert!(
        j["join_command"]
            .as_str()
            .unwrap()
            .contains(j["token"].as_str().unwrap())
    );
    // The pin printed is the CA the server really serves.
    let ca = s.admin_conf().ca_cert;
    let der = &lks_proto::identity::pem_certs(&ca).unwrap()[0];
    assert_eq!(
        j["ca_cert_hash"],
        lks_proto::identity::ca_cert_hash(der).unwrap().to_string()
    );

    assert_eq!(j["agent_packages"], serde_json::json!([]), "no --agent-package");
}

/// A server without --agent-package: the package comes from apt, and
/// lksctl says so on stderr; or from --package-url. Trusted publisher
/// keys and signed releases from the first boot.
fn cloud_init_installs_the_agent_and_trusts_the_publisher_keys(s: &Server) {
    let out = s.lksctl(&["token", "create", "--cluster", "tenant-a", "--cloud-init"]);
    let ci = lks_e2e::ok_stdout(&out, "token create --cloud-init");
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(
        note.starts_with("note: the server offers no agent package") && note.lines().count() == 1,
        "{note}"
    );
    assert!(ci.starts_with("#cloud-config\n"), "{ci}");
    assert!(ci.contains("\npackages:\n  - \"lksadmin-agent\"\n"), "{ci}");
    assert!(ci.contains("  - \"lksadmin-agent join --server "), "{ci}");
    let url = "http://127.0.0.1:8080/lksadmin-agent_0.1.0-1_amd64.deb";
    let ci = s.lksctl_ok(&[
        "token",
        "create",
        "--cluster",
        "tenant-a",
        "--cloud-init",
        "--package-url",
        url,
    ]);
    assert!(!ci.contains("packages:"), "{ci}");
    assert!(
        ci.contains(&format!("\"/run/lksadmin-agent.deb\", \"{url}\"]")),
        "{ci}"
    );
    // Trusted publisher keys and signed releases from the first boot.
    let prefix = s.work_dir().join("publisher");
    s.lksctl_ok(&["bundle", "keygen", "--out", prefix.to_str().unwrap()]);
    let public = prefix.with_extension("pub");
    let public = public.to_str().unwrap();
    let ci = s.lksctl_ok(&[
        "token",
        "create",
        "--cluster",
        "tenant-a",
        "--cloud-init",
        "--trust-key",
        public,
        "--trust-threshold",
        "1",
    ]);
    assert!(ci.contains("  - path: \"/run/lksadmin-trust-key-0.pub\""), "{ci}");
    assert!(
        ci.contains("--trust-key /run/lksadmin-trust-key-0.pub --trust-threshold 1\""),
        "{ci}"
    );
}

/// Bad --package-url, --trust-key and --trust-threshold combinations, an
/// unknown cluster, bad labels and a bad TTL: one line each.
fn bad_token_options_are_one_line_errors(s: &Server) {
    let url = "http://127.0.0.1:8080/lksadmin-agent_0.1.0-1_amd64.deb";
    let prefix = s.work_dir().join("publisher");
    let public = prefix.with_extension("pub");
    let public = public.to_str().unwrap();
    for (args, what) in [
        (
            vec!["--cloud-init", "--package-url", "ftp://x/a.deb"],
            "must be an http:// or https:// URL",
        ),
        (vec!["--package-url", url], "--cloud-init"),
        (
            vec!["--cloud-init", "--trust-key", public, "--trust-threshold", "2"],
            "--trust-threshold 2: it must be between 1 and the number of distinct --trust-key files (1)",
        ),
        (
            vec!["--cloud-init", "--trust-key", "/nonexistent.pub"],
            "--trust-key: ",
        ),
        (vec!["--trust-key", public], "--cloud-init"),
    ] {
        let mut argv = vec!["token", "create", "--cluster", "tenant-a"];
        argv.extend(args);
        let e = one_line_error(&s.lksctl(&argv), "bad --package-url");
        assert!(e.contains(what), "{e}");
    }

    let e = one_line_error(
        &s.lksctl(&["token", "create", "--cluster", "nope"]),
        "unknown cluster",
    );
    assert!(e.contains("cluster nope does not exist"), "{e}");
    let e = one_line_error(
        &s.lksctl(&[
            "token",
            "create",
            "--cluster",
            "tenant-a",
            "--labels",
            "bad label",
        ]),
        "bad labels",
    );
    assert!(e.contains("--labels"), "{e}");
    let e = one_line_error(
        &s.lksctl(&["token", "create", "--cluster", "tenant-a", "--ttl", "10"]),
        "bad ttl",
    );
    assert!(e.contains("invalid duration"), "{e}");
}

#[test]
fn config_errors_are_one_line() {
    let s = Server::start();
    let dir = s.work_dir();
    // No --config, no $LKSCTL_CONFIG, no ./admin.conf.
    let mut cmd = Command::new(bin("lksctl"));
    cmd.args(["cluster", "list"])
        .current_dir(dir)
        .env_remove("LKSCTL_CONFIG");
    let e = one_line_error(&run(cmd), "missing config");
    assert!(e.contains("admin.conf") && e.contains("LKSCTL_CONFIG"), "{e}");

    // $LKSCTL_CONFIG is honoured.
    let mut cmd = Command::new(bin("lksctl"));
    cmd.args(["cluster", "list"])
        .current_dir(dir)
        .env("LKSCTL_CONFIG", s.admin_conf_path());
    assert!(run(cmd).status.success());

    // ./admin.conf is the last fallback.
    std::fs::copy(s.admin_conf_path(), dir.join("admin.conf")).unwrap();
    let mut cmd = Command::new(bin("lksctl"));
    cmd.args(["cluster", "list"])
        .current_dir(dir)
        .env_remove("LKSCTL_CONFIG");
    assert!(run(cmd).status.success());

    let e = one_line_error(&s.lksctl(&["cluster", "frobnicate"]), "unknown subcommand");
    assert!(e.starts_with("error: "), "{e}");
}

#[test]
fn unreachable_server_is_a_clear_error() {
    let mut s = Server::start();
    s.stop();
    let e = one_line_error(&s.lksctl(&["cluster", "list"]), "server down");
    assert!(e.contains("cannot reach control server at https://"), "{e}");
}

#[test]
fn bundles_publish_list_and_keys() {
    let s = Server::start();
    let prefix = s.work_dir().join("publisher");
    let out = s.lksctl_ok(&["bundle", "keygen", "--out", prefix.to_str().unwrap()]);
    assert!(
        out.contains("publisher.key") && out.contains("publisher.pub"),
        "{out}"
    );
    let e = one_line_error(
        &s.lksctl(&["bundle", "keygen", "--out", prefix.to_str().unwrap()]),
        "keygen over existing keys",
    );
    assert!(e.contains("exists"), "{e}");
    let key = format!("{}.key", prefix.display());

    let dir = s.write_bundle(
        "b1",
        "kubelet",
        "1.29.3-1",
        &[
            ("/etc/kubernetes/kubelet.conf", b"conf", "0600"),
            ("/usr/local/bin/kubelet", b"#!/bin/sh\necho kubelet\n", "0755"),
            ("/usr/local/bin/copy", b"#!/bin/sh\necho kubelet\n", "0755"),
        ],
    );
    let out = s.lksctl_ok(&["bundle", "publish", dir.to_str().unwrap(), "--sign-key", &key]);
    assert_eq!(out.trim(), "kubelet@1.29.3-1");
    // Identical content: success, nothing changes.
    let o = s.lksctl(&["bundle", "publish", dir.to_str().unwrap(), "--sign-key", &key]);
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "kubelet@1.29.3-1");
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing changed"));

    // Other bytes under the same name@version are refused.
    std::fs::write(dir.join("f0"), b"other conf").unwrap();
    let e = one_line_error(
        &s.lksctl(&["bundle", "publish", dir.to_str().unwrap()]),
        "re-publish",
    );
    assert!(e.contains("already exists with other content"), "{e}");

    let unsigned = s.write_bundle("b2", "empty-file", "1", &[("/etc/empty", b"", "0644")]);
    assert_eq!(s.publish(&unsigned), "empty-file@1");

    let list = s.lksctl_json(&["bundle", "list"]);
    let arr = list.as_array().unwrap();
    assert_eq!(arr.len(), 2, "{list}");
    let k = arr.iter().find(|b| b["name"] == "kubelet").unwrap();
    assert_eq!(k["version"], "1.29.3-1");
    assert_eq!(k["files"], 3);
    assert_eq!(k["signed"], true);
    assert!(k["manifest_digest"].as_str().unwrap().starts_with("sha256:"));
    let e = arr.iter().find(|b| b["name"] == "empty-file").unwrap();
    assert_eq!(e["signed"], false);
    let table = s.lksctl_ok(&["bundle", "list"]);
    assert!(table.starts_with("NAME") && table.contains("kubelet"), "{table}");

    // A missing or broken bundle dir is one clear line.
    let e = one_line_error(&s.lksctl(&["bundle", "publish", "/nonexistent"]), "missing dir");
    assert!(e.contains("bundle.toml"), "{e}");
    let e = one_line_error(
        &s.lksctl(&[
            "bundle",
            "publish",
            dir.to_str().unwrap(),
            "--sign-key",
            "/nonexistent.key",
        ]),
        "missing key",
    );
    assert!(e.contains("nonexistent.key"), "{e}");
}

#[test]
fn path_escape_in_bundle_toml_is_refused_before_upload() {
    let s = Server::start();
    let d = s.work_dir().join("evil");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("x"), b"x").unwrap();
    std::fs::write(
        d.join("bundle.toml"),
        "name = \"evil\"\nversion = \"1\"\n[[file]]\npath = \"/etc/../x\"\nsource = \"x\"\n",
    )
    .unwrap();
    let e = one_line_error(
        &s.lksctl(&["bundle", "publish", d.to_str().unwrap()]),
        "path escape",
    );
    assert!(e.contains("file[0].path") && e.contains(".."), "{e}");
    std::fs::write(
        d.join("bundle.toml"),
        "name = \"evil\"\nversion = \"1\"\n[[file]]\npath = \"/etc/x\"\nsource = \"../../etc/passwd\"\n",
    )
    .unwrap();
    let e = one_line_error(
        &s.lksctl(&["bundle", "publish", d.to_str().unwrap()]),
        "source escape",
    );
    assert!(e.contains("file[0].source"), "{e}");
    assert_eq!(s.lksctl_json(&["bundle", "list"]), serde_json::json!([]));
}

#[test]
fn rollouts_nodes_and_events_without_agents() {
    let s = Server::start();
    s.create_cluster("tenant-a");
    let dir = s.write_bundle("b", "demo", "1", &[("/etc/demo", b"demo", "0644")]);
    s.publish(&dir);

    let e = one_line_error(
        &s.lksctl(&["rollout", "start", "--cluster", "tenant-a", "--bundle", "demo@2"]),
        "unknown version",
    );
    assert!(e.contains("demo@2 is not published"), "{e}");
    let e = one_line_error(
        &s.lksctl(&["rollout", "start", "--cluster", "nope", "--bundle", "demo@1"]),
        "unknown cluster",
    );
    assert!(e.contains("cluster nope does not exist"), "{e}");
    let e = one_line_error(
        &s.lksctl(&["rollout", "start", "--cluster", "tenant-a", "--bundle", "demo"]),
        "bad ref",
    );
    assert!(e.contains("NAME@VERSION"), "{e}");
    // A choice that is none of its words is refused by lksctl's parser,
    // which lists them; the policy's other checks are the server's lines.
    let start = |extra: &[&str]| {
        let mut a = vec!["rollout", "start", "--cluster", "tenant-a", "--bundle", "demo@1"];
        a.extend_from_slice(extra);
        s.lksctl(&a)
    };
    let out = start(&["--drain", "--on-drain-timeout", "bogus"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("invalid value 'bogus' for '--on-drain-timeout")
            && err.contains("[possible values: fail, skip]"),
        "{err}"
    );
    let e = one_line_error(&start(&["--drain-timeout", "5m"]), "tuned without drain");
    assert!(e.ends_with("need --drain"), "{e}");
    let e = one_line_error(&start(&["--batch-interval", "8d"]), "pause too long");
    assert!(
        e.ends_with("batch interval is longer than the limit of 7 days"),
        "{e}"
    );
    assert_eq!(
        s.lksctl_json(&["rollout", "list"]),
        serde_json::json!([]),
        "nothing started"
    );

    // No node matches: the rollout completes at once; --wait exits 0.
    let id = s.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "tenant-a",
        "--bundle",
        "demo@1",
        "--wait",
    ]);
    let id = id.lines().next().unwrap().trim().to_string();
    let st = s.lksctl_json(&["rollout", "status", &id]);
    assert_eq!(st["id"], id.as_str());
    assert_eq!(st["state"], "completed");
    for k in ["total", "updated", "failed", "pending"] {
        assert_eq!(st[k], 0, "{k}");
    }
    let j = s.lksctl_json(&[
        "rollout",
        "start",
        "--cluster",
        "tenant-a",
        "--bundle",
        "demo@1",
        "--selector",
        "role=db",
    ]);
    assert!(j["id"].is_string(), "{j}");
    let list = s.lksctl_ok(&["rollout", "list"]);
    assert!(list.starts_with("ID") && list.contains(&id), "{list}");
    let watched = s.lksctl_ok(&["rollout", "status", &id, "--watch"]);
    assert!(watched.contains("completed"), "{watched}");
    let text = s.lksctl_ok(&["rollout", "status", &id]);
    assert!(text.contains("State:") && text.contains("completed"), "{text}");

    let e = one_line_error(&s.lksctl(&["rollout", "status", "nope"]), "unknown rollout");
    assert!(e.contains("rollout nope does not exist"), "{e}");
    let e = one_line_error(&s.lksctl(&["rollout", "pause", &id]), "pause");
    assert!(e.contains("only a running rollout can be paused"), "{e}");
    let e = one_line_error(&s.lksctl(&["rollout", "resume", &id]), "resume");
    assert!(e.contains("only a paused rollout can be resumed"), "{e}");
    let e = one_line_error(&s.lksctl(&["rollout", "abort", &id]), "abort ended");
    assert!(e.contains("already ended"), "{e}");
    let rb = s.lksctl_ok(&["rollout", "rollback", &id]);
    assert!(rb.contains("rolled_back"), "{rb}");

    assert_eq!(s.lksctl_json(&["node", "list"]), serde_json::json!([]));
    let e = one_line_error(&s.lksctl(&["node", "get", "ghost"]), "unknown node");
    assert!(e.contains("node ghost does not exist"), "{e}");
    let e = one_line_error(&s.lksctl(&["node", "delete", "ghost"]), "delete unknown node");
    assert!(e.contains("node ghost does not exist"), "{e}");
    let e = one_line_error(
        &s.lksctl(&["node", "list", "--cluster", "nope"]),
        "unknown cluster",
    );
    assert!(e.contains("does not exist"), "{e}");

    let ev = s.lksctl_ok(&["event", "list"]);
    assert!(
        ev.contains("bundle_published") && ev.contains("rollout_started"),
        "{ev}"
    );
    let evj = s.lksctl_json(&["event", "list", "--cluster", "tenant-a"]);
    assert!(
        evj.as_array().unwrap().iter().all(|e| e["cluster"] == "tenant-a"),
        "{evj}"
    );
}

/// A reader that stops early (`lksctl … | head -1`, `| grep -q`) ends
/// lksctl quietly: status 0, no panic on the closed pipe.
#[test]
fn a_closed_output_pipe_ends_lksctl_quietly() {
    let s = Server::start();
    s.create_cluster("pipe");
    for args in [&["cluster", "list", "-o", "json"][..], &["cluster", "list"][..]] {
        let mut child = Command::new(bin("lksctl"))
            .arg("--config")
            .arg(s.admin_conf_path())
            .args(args)
            .env_remove("LKSCTL_CONFIG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn lksctl");
        // The reader goes away before lksctl has dialled the server.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait for lksctl");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "lksctl {args:?}: {:?}: {err}", out.status);
        assert!(!err.contains("panicked"), "lksctl {args:?}: {err}");
    }
}
