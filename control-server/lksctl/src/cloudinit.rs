//! `lksctl token create --cloud-init`: the `#cloud-config` user-data that
//! installs the agent on a new VM, enrols it with the token's join line and
//! starts it.
//!
//! Every scalar is written as a JSON string (JSON is a subset of YAML), so no
//! value can break out of its place whatever characters it holds; list-form
//! `runcmd` entries are shell-quoted by cloud-init itself. The one shell line
//! is the server's join command, written exactly as `token create` prints it,
//! and checked to hold only characters with no meaning to the shell.

use std::fmt::Write as _;

// The server's package endpoint, followed by the architecture: one
// definition for the server that serves it and the user-data that fetches it.
use lks_proto::AGENT_PACKAGE_PATH as PATH_PREFIX;

/// Where the VM gets the `lksadmin-agent` package from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackageSource<'a> {
    /// The control server's own package (`lks-control-server
    /// --agent-package`), for the VM's architecture: downloaded with curl
    /// over HTTPS from each server URL in turn, the server checked against
    /// the cluster CA, which the user-data carries (the same CA the join
    /// pins by hash).
    Server {
        /// Comma-separated `https://HOST:PORT` URLs, as in the join line.
        servers: &'a str,
        /// PEM of the cluster CA.
        ca_pem: &'a str,
        /// What the server offers now, for a comment (`amd64 0.1.0-1, …`).
        offered: &'a str,
    },
    /// `packages: [lksadmin-agent]`: an apt repository the image (or an
    /// `apt:` section added to the user-data) already knows.
    Apt,
    /// The `.deb` at this http(s) URL, downloaded with curl and installed
    /// with `apt-get install` (its dependencies, libc6 and systemd, are on
    /// every systemd-based Debian or Ubuntu image).
    Url(&'a str),
}

/// What the user-data is made of.
#[derive(Clone, Copy, Debug)]
pub struct UserData<'a> {
    pub cluster: &'a str,
    /// `lksadmin-agent join --server … --token … --ca-cert-hash …`, as the
    /// server returned it.
    pub join_command: &'a str,
    /// When the token expires (RFC 3339), for the header comment.
    pub expires_at: &'a str,
    pub package: PackageSource<'a>,
    /// Publisher keys (PEM) the node trusts (`join --trust-key`): it then
    /// refuses bundles no key signed. Empty: none.
    pub trust_keys: &'a [String],
    /// `join --trust-threshold`: the node requires signed releases signed
    /// by this many of `trust_keys`. 0: not required.
    pub trust_threshold: u32,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CloudInitError {
    #[error("--package-url {0:?}: must be an http:// or https:// URL without spaces or control characters")]
    PackageUrl(String),
    #[error("the server's join command {0:?} is not one `lksadmin-agent join …` line of plain characters")]
    JoinCommand(String),
    #[error("the server's URL {0:?} is not an https:// URL of plain characters")]
    ServerUrl(String),
    #[error("the server returned no CA certificate (PEM) to download its agent package with")]
    CaPem,
    #[error(
        "--trust-threshold {threshold}: it must be between 1 and the number of distinct --trust-key files ({keys})"
    )]
    TrustThreshold { threshold: u32, keys: usize },
    #[error("a trusted key is not an ed25519 public key in PEM form")]
    TrustKey,
}

/// Where the downloaded package is kept until it is installed: a tmpfs, so
/// nothing is left on disk after a reboot even if `rm` never ran.
const DEB_PATH: &str = "/run/lksadmin-agent.deb";
/// Where the cluster CA is written for curl, on the same tmpfs.
const CA_PATH: &str = "/run/lksadmin-bootstrap-ca.pem";

/// Where trusted publisher key `i` is written for `join --trust-key`, which
/// copies it into the agent's state dir; on the tmpfs too.
fn trust_key_path(i: usize) -> String {
    format!("/run/lksadmin-trust-key-{i}.pub")
}

/// Renders the user-data.
pub fn render(u: &UserData<'_>) -> Result<String, CloudInitError> {
    check_join_command(u.join_command)?;
    match u.package {
        PackageSource::Url(url) => check_package_url(url)?,
        PackageSource::Server { servers, ca_pem, .. } => {
            check_server_urls(servers)?;
            if !ca_pem.contains("-----BEGIN CERTIFICATE-----") {
                return Err(CloudInitError::CaPem);
            }
        }
        PackageSource::Apt => {}
    }
    for pem in u.trust_keys {
        if lks_proto::sign::PublisherKey::from_pem(pem).is_none() {
            return Err(CloudInitError::TrustKey);
        }
    }
    if u.trust_threshold as usize > u.trust_keys.len() {
        return Err(CloudInitError::TrustThreshold {
            threshold: u.trust_threshold,
            keys: u.trust_keys.len(),
        });
    }
    let mut out = String::from("#cloud-config\n");
    // Cluster names are [a-z0-9-] and the time is RFC 3339: safe in a comment.
    let _ = writeln!(
        out,
        "# Enrols this VM into lksadmin cluster {}; the token expires at {}.",
        comment_safe(u.cluster),
        comment_safe(u.expires_at)
    );
    out.push_str(
        "# Generated by `lksctl token create --cloud-init`. runcmd is one shell script:\n\
         # `set -e` stops it at the first failing command, and cloud-init reports the error.\n",
    );
    let mut runcmd: Vec<Entry<'_>> = vec![Entry::Shell("set -e".into())];
    let mut write_files = false;
    match u.package {
        PackageSource::Server {
            servers,
            ca_pem,
            offered,
        } => {
            let _ = writeln!(
                out,
                "# lksadmin-agent comes from the control server, which now offers: {}.\n\
                 # curl checks the server against the cluster CA below, the CA the join pins.",
                comment_safe(offered)
            );
            out.push_str("write_files:\n");
            write_files = true;
            let _ = writeln!(out, "  - path: {}", json_str(CA_PATH));
            out.push_str("    permissions: \"0644\"\n");
            let _ = writeln!(out, "    content: {}", json_str(ca_pem));
            runcmd.push(Entry::Shell("arch=$(dpkg --print-architecture)".into()));
            // The URLs are checked to hold no shell syntax; "$arch" is
            // quoted. Each server is tried in turn.
            runcmd.push(Entry::Shell(format!(
                "ok=no; for s in {}; do if curl -fsSL --proto =https --retry 5 --retry-connrefused \
                 --cacert {CA_PATH} -o {DEB_PATH} \"$s{PATH_PREFIX}$arch\"; then ok=yes; break; fi; done",
                servers.split(',').collect::<Vec<_>>().join(" ")
            )));
            runcmd.push(Entry::Shell(
                "test \"$ok\" = yes || { echo \"lksadmin: no agent package for $arch from the control server\" >&2; exit 1; }"
                    .into(),
            ));
            runcmd.push(install_deb());
            runcmd.push(Entry::Argv(vec!["rm", "-f", DEB_PATH, CA_PATH]));
        }
        PackageSource::Apt => {
            out.push_str(
                "# lksadmin-agent comes from an apt repository the image already has configured.\n\
                 packages:\n  - \"lksadmin-agent\"\n",
            );
        }
        PackageSource::Url(url) => {
            runcmd.push(Entry::Argv(vec![
                "curl",
                "-fsSL",
                "--retry",
                "5",
                "--retry-connrefused",
                "-o",
                DEB_PATH,
                url,
            ]));
            runcmd.push(install_deb());
            runcmd.push(Entry::Argv(vec!["rm", "-f", DEB_PATH]));
        }
    }
    // The keys the node trusts, for `join --trust-key`; join keeps copies.
    let key_paths: Vec<String> = (0..u.trust_keys.len()).map(trust_key_path).collect();
    for (path, pem) in key_paths.iter().zip(u.trust_keys) {
        if !write_files {
            out.push_str("# The publisher keys this node trusts: it refuses bundles none of them signed.\nwrite_files:\n");
            write_files = true;
        }
        let _ = writeln!(out, "  - path: {}", json_str(path));
        out.push_str("    permissions: \"0644\"\n");
        let _ = writeln!(out, "    content: {}", json_str(pem));
    }
    // The flags added hold only the fixed paths above and digits.
    let mut join = u.join_command.to_string();
    for p in &key_paths {
        let _ = write!(join, " --trust-key {p}");
    }
    if u.trust_threshold > 0 {
        let _ = write!(join, " --trust-threshold {}", u.trust_threshold);
    }
    runcmd.push(Entry::Shell(join));
    if !key_paths.is_empty() {
        let mut rm = vec!["rm", "-f"];
        rm.extend(key_paths.iter().map(String::as_str));
        runcmd.push(Entry::Argv(rm));
    }
    runcmd.push(Entry::Argv(vec![
        "systemctl",
        "enable",
        "--now",
        "lksadmin-agent",
    ]));
    out.push_str("runcmd:\n");
    for e in &runcmd {
        let _ = writeln!(out, "  - {}", e.yaml());
    }
    Ok(out)
}

/// `apt-get install` of the downloaded package (its dependencies, libc6
/// and systemd, are on every systemd-based Debian or Ubuntu
/// image).
fn install_deb() -> Entry<'static> {
    Entry::Argv(vec![
        "env",
        "DEBIAN_FRONTEND=noninteractive",
        "apt-get",
        "install",
        "-y",
        "--no-install-recommends",
        DEB_PATH,
    ])
}

/// One `runcmd` item: a shell line, or an argv that cloud-init quotes.
enum Entry<'a> {
    Shell(String),
    Argv(Vec<&'a str>),
}

impl Entry<'_> {
    fn yaml(&self) -> String {
        match self {
            Entry::Shell(s) => json_str(s),
            Entry::Argv(v) => format!(
                "[{}]",
                v.iter().map(|s| json_str(s)).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

fn json_str(s: &str) -> String {
    // Serialising a &str cannot fail; the fallback is never used.
    serde_json::to_string(s).unwrap_or_default()
}

fn comment_safe(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

/// Checks a `--package-url` (also done by [`render`]).
pub fn check_package_url(url: &str) -> Result<(), CloudInitError> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    match rest {
        Some(r) if !r.is_empty() && !url.chars().any(|c| c.is_whitespace() || c.is_control()) => Ok(()),
        _ => Err(CloudInitError::PackageUrl(url.to_string())),
    }
}

/// Characters that mean nothing to the shell, in or out of double quotes
/// (URLs with IPv6 brackets and comma lists included).
fn plain(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._:/,=@+-[]%".contains(c)
}

/// Server URLs go into a shell line: each must be `https://` and plain.
fn check_server_urls(servers: &str) -> Result<(), CloudInitError> {
    let ok = |s: &str| {
        s.strip_prefix("https://")
            .is_some_and(|rest| !rest.is_empty() && rest.chars().all(|c| plain(c) && c != ','))
    };
    if servers.split(',').all(ok) {
        Ok(())
    } else {
        Err(CloudInitError::ServerUrl(servers.to_string()))
    }
}

/// The join line runs as a shell line, so it may hold only plain characters
/// and single spaces.
fn check_join_command(cmd: &str) -> Result<(), CloudInitError> {
    if cmd.starts_with("lksadmin-agent join ")
        && cmd.chars().all(|c| c == ' ' || plain(c))
        && !cmd.contains("  ")
    {
        Ok(())
    } else {
        Err(CloudInitError::JoinCommand(cmd.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOIN: &str = "lksadmin-agent join --server https://10.0.0.1:7443,https://[fd00::1]:7443 \
                        --token abcdef.0123456789abcdef --ca-cert-hash sha256:00ff";

    fn user_data(package: PackageSource<'_>) -> UserData<'_> {
        UserData {
            cluster: "tenant-a",
            join_command: JOIN,
            expires_at: "2030-01-01T00:00:00Z",
            package,
            trust_keys: &[],
            trust_threshold: 0,
        }
    }

    /// The `runcmd` items, decoded: Err(shell line) or Ok(argv).
    fn runcmd(text: &str) -> Vec<Result<Vec<String>, String>> {
        let body = text.split_once("\nruncmd:\n").expect("a runcmd section").1;
        body.lines()
            .map(|l| {
                let item = l.strip_prefix("  - ").expect("a list item");
                match serde_json::from_str::<Vec<String>>(item) {
                    Ok(argv) => Ok(argv),
                    Err(_) => Err(serde_json::from_str::<String>(item).expect("a JSON string")),
                }
            })
            .collect()
    }

    #[test]
    fn package_url_downloads_installs_joins_and_starts() {
        let url = "http://127.0.0.1:8080/lksadmin-agent_0.1.0-1_amd64.deb";
        let text = render(&user_data(PackageSource::Url(url))).unwrap();
        assert!(text.starts_with("#cloud-config\n"), "{text}");
        assert!(!text.contains("packages:"), "{text}");
        assert!(text.contains("cluster tenant-a; the token expires at 2030-01-01T00:00:00Z"));
        let argv = |v: &[&str]| Ok(v.iter().map(|s| s.to_string()).collect());
        assert_eq!(
            runcmd(&text),
            vec![
                Err("set -e".to_string()),
                argv(&[
                    "curl",
                    "-fsSL",
                    "--retry",
                    "5",
                    "--retry-connrefused",
                    "-o",
                    DEB_PATH,
                    url
                ]),
                argv(&[
                    "env",
                    "DEBIAN_FRONTEND=noninteractive",
                    "apt-get",
                    "install",
                    "-y",
                    "--no-install-recommends",
                    DEB_PATH
                ]),
                argv(&["rm", "-f", DEB_PATH]),
                Err(JOIN.to_string()),
                argv(&["systemctl", "enable", "--now", "lksadmin-agent"]),
            ]
        );
    }

    #[test]
    fn trusted_keys_are_written_passed_to_join_and_removed() {
        let keys = [
            lks_proto::sign::SigningKey::generate().public().to_pem(),
            lks_proto::sign::SigningKey::generate().public().to_pem(),
        ];
        let text = render(&UserData {
            trust_keys: &keys,
            trust_threshold: 2,
            ..user_data(PackageSource::Apt)
        })
        .unwrap();
        let files = text.split_once("\nwrite_files:\n").expect("write_files").1;
        for (i, pem) in keys.iter().enumerate() {
            let entry = format!(
                "  - path: \"/run/lksadmin-trust-key-{i}.pub\"\n    permissions: \"0644\"\n    content: {}\n",
                json_str(pem)
            );
            assert!(files.contains(&entry), "{text}");
        }
        let cmds = runcmd(&text);
        assert_eq!(
            cmds[1],
            Err(format!(
                "{JOIN} --trust-key /run/lksadmin-trust-key-0.pub --trust-key /run/lksadmin-trust-key-1.pub \
                 --trust-threshold 2"
            ))
        );
        assert_eq!(
            cmds[2],
            Ok(vec![
                "rm".to_string(),
                "-f".into(),
                "/run/lksadmin-trust-key-0.pub".into(),
                "/run/lksadmin-trust-key-1.pub".into()
            ])
        );

        // Beside the server's CA, one write_files list.
        let text = render(&UserData {
            trust_keys: &keys[..1],
            trust_threshold: 0,
            ..user_data(PackageSource::Server {
                servers: "https://10.0.0.1:7443",
                ca_pem: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
                offered: "amd64 0.1.0-1",
            })
        })
        .unwrap();
        assert_eq!(text.matches("write_files:").count(), 1, "{text}");
        assert!(
            text.contains("--trust-key /run/lksadmin-trust-key-0.pub\""),
            "{text}"
        );
        assert!(!text.contains("--trust-threshold"), "{text}");

        let e = render(&UserData {
            trust_keys: &keys[..1],
            trust_threshold: 2,
            ..user_data(PackageSource::Apt)
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--trust-threshold 2: it must be between 1 and the number of distinct --trust-key files (1)"
        );
        let bad = ["not a key".to_string()];
        let e = render(&UserData {
            trust_keys: &bad,
            ..user_data(PackageSource::Apt)
        })
        .unwrap_err();
        assert_eq!(e, CloudInitError::TrustKey);
    }

    #[test]
    fn without_url_the_package_comes_from_apt() {
        let text = render(&user_data(PackageSource::Apt)).unwrap();
        assert!(text.starts_with("#cloud-config\n"), "{text}");
        assert!(
            text.contains("\npackages:\n  - \"lksadmin-agent\"\nruncmd:\n"),
            "{text}"
        );
        assert!(!text.contains("curl"), "{text}");
        let cmds = runcmd(&text);
        assert_eq!(cmds.len(), 3, "{text}");
        assert_eq!(cmds[0], Err("set -e".into()));
        assert_eq!(cmds[1], Err(JOIN.into()), "the exact join line");
    }

    #[test]
    fn odd_url_characters_stay_inside_their_string() {
        let url = "https://mirror.example/a\"b'c$(id)`x`\\#d.deb?x=1&y=2";
        let text = render(&user_data(PackageSource::Url(url))).unwrap();
        let cmds = runcmd(&text);
        assert_eq!(cmds[1].as_ref().unwrap().last().map(String::as_str), Some(url));
    }

    #[test]
    fn bad_package_urls_are_refused() {
        for url in [
            "",
            "http://",
            "ftp://x/a.deb",
            "file:///tmp/a.deb",
            "/tmp/a.deb",
            "http://x/a b.deb",
            "http://x/a.deb\n  - [rm, -rf, /]",
            "http://x/\u{7}.deb",
        ] {
            assert_eq!(
                render(&user_data(PackageSource::Url(url))),
                Err(CloudInitError::PackageUrl(url.into())),
                "{url:?}"
            );
        }
    }

    #[test]
    fn a_join_command_with_shell_syntax_is_refused() {
        for cmd in [
            "",
            "lksadmin-agent run",
            "lksadmin-agent join --token x; rm -rf /",
            "lksadmin-agent join --token $(id)",
            "lksadmin-agent join --token x\nreboot",
            "lksadmin-agent join --token 'x'",
            "curl evil | sh",
        ] {
            let u = UserData {
                join_command: cmd,
                ..user_data(PackageSource::Apt)
            };
            assert_eq!(
                render(&u),
                Err(CloudInitError::JoinCommand(cmd.into())),
                "{cmd:?}"
            );
        }
    }

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    fn from_server(servers: &str) -> PackageSource<'_> {
        PackageSource::Server {
            servers,
            ca_pem: CA,
            offered: "amd64 0.1.0-1, arm64 0.1.0-1",
        }
    }

    /// The `write_files` section, decoded: (path, permissions, content).
    fn write_files(text: &str) -> Vec<(String, String, String)> {
        let body = text
            .split_once("\nwrite_files:\n")
            .expect("a write_files section")
            .1
            .split_once("\nruncmd:\n")
            .expect("runcmd after it")
            .0;
        let field = |l: &str, key: &str| -> String {
            serde_json::from_str(l.trim_start().strip_prefix(key).expect(key)).expect("a JSON string")
        };
        let lines: Vec<&str> = body.lines().collect();
        lines
            .chunks(3)
            .map(|c| {
                (
                    field(c[0], "- path: "),
                    field(c[1], "permissions: "),
                    field(c[2], "content: "),
                )
            })
            .collect()
    }

    #[test]
    fn from_the_server_the_ca_is_written_and_curl_pins_it() {
        let text = render(&user_data(from_server(
            "https://10.0.0.1:7443,https://[fd00::1]:7443",
        )))
        .unwrap();
        assert!(text.starts_with("#cloud-config\n"), "{text}");
        assert!(!text.contains("packages:"), "{text}");
        assert!(
            text.contains("which now offers: amd64 0.1.0-1, arm64 0.1.0-1."),
            "{text}"
        );
        assert_eq!(
            write_files(&text),
            vec![(CA_PATH.to_string(), "0644".to_string(), CA.to_string())]
        );
        let cmds = runcmd(&text);
        let shell = |i: usize| cmds[i].clone().expect_err("a shell line");
        assert_eq!(shell(0), "set -e");
        assert_eq!(shell(1), "arch=$(dpkg --print-architecture)");
        let fetch = shell(2);
        assert!(
            fetch.starts_with("ok=no; for s in https://10.0.0.1:7443 https://[fd00::1]:7443; do if curl "),
            "{fetch}"
        );
        for arg in [
            "-fsSL",
            "--proto =https",
            &format!("--cacert {CA_PATH}"),
            &format!("-o {DEB_PATH}"),
            "\"$s/v1/agent-package/$arch\"; then ok=yes; break; fi; done",
        ] {
            assert!(fetch.contains(arg), "{arg} in {fetch}");
        }
        assert!(shell(3).starts_with("test \"$ok\" = yes || {"), "{}", shell(3));
        let argv = |v: &[&str]| Ok(v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            cmds[4],
            argv(&[
                "env",
                "DEBIAN_FRONTEND=noninteractive",
                "apt-get",
                "install",
                "-y",
                "--no-install-recommends",
                DEB_PATH
            ])
        );
        assert_eq!(cmds[5], argv(&["rm", "-f", DEB_PATH, CA_PATH]));
        assert_eq!(cmds[6], Err(JOIN.to_string()));
        assert_eq!(cmds[7], argv(&["systemctl", "enable", "--now", "lksadmin-agent"]));
        assert_eq!(cmds.len(), 8);
    }

    /// The runcmd script, run by sh with curl, dpkg and the rest replaced by
    /// functions: it downloads from the first server that answers, stops at
    /// the first failure, and joins only after the install.
    #[test]
    fn the_server_form_runs_as_a_shell_script() {
        let text = render(&user_data(from_server("https://a:1,https://b:2"))).unwrap();
        let script: Vec<String> = runcmd(&text)
            .into_iter()
            .map(|c| match c {
                // sh function names cannot hold a '-'.
                Err(line) => line.replace("lksadmin-agent join", "lksadmin_agent join"),
                Ok(argv) => argv.join(" "),
            })
            .collect();
        let run = |curl_ok_for: &str| {
            let stubs = format!(
                "dpkg() {{ echo amd64; }}\n\
                 curl() {{ for a; do u=$a; done; echo \"curl $u\"; case $u in {curl_ok_for}) return 0;; esac; return 22; }}\n\
                 env() {{ echo \"install $*\"; }}\nrm() {{ echo \"rm $*\"; }}\n\
                 lksadmin_agent() {{ echo join; }}\nsystemctl() {{ echo \"systemctl $*\"; }}\n"
            );
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("{stubs}{}", script.join("\n")))
                .output()
                .unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        };
        let (ok, out, err) = run("https://b:2/v1/agent-package/amd64");
        assert!(ok, "{out}{err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "curl https://a:1/v1/agent-package/amd64");
        assert_eq!(lines[1], "curl https://b:2/v1/agent-package/amd64");
        assert!(
            lines[2].starts_with("install DEBIAN_FRONTEND=noninteractive apt-get install"),
            "{out}"
        );
        assert_eq!(lines[4], "join");
        assert_eq!(lines[5], "systemctl enable --now lksadmin-agent");

        let (ok, out, err) = run("nothing");
        assert!(!ok, "{out}");
        assert!(!out.contains("install") && !out.contains("join"), "{out}");
        assert_eq!(
            err.trim(),
            "lksadmin: no agent package for amd64 from the control server"
        );
    }

    #[test]
    fn server_urls_and_ca_are_checked() {
        for servers in [
            "",
            "http://10.0.0.1:7443",
            "https://",
            "https://a:1,",
            "https://a:1;reboot",
            "https://a:1 https://b:2",
            "https://$(id):1",
            "https://a:1\"",
        ] {
            assert_eq!(
                render(&user_data(from_server(servers))),
                Err(CloudInitError::ServerUrl(servers.into())),
                "{servers:?}"
            );
        }
        let no_ca = PackageSource::Server {
            servers: "https://a:1",
            ca_pem: "",
            offered: "amd64 1",
        };
        assert_eq!(render(&user_data(no_ca)), Err(CloudInitError::CaPem));
    }

    #[test]
    fn error_messages_are_one_line() {
        let e = render(&user_data(PackageSource::Url("http://x/a\nb"))).unwrap_err();
        assert!(!e.to_string().contains('\n'), "{e}");
    }
}
