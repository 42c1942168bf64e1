//! A real Prometheus on loopback for the reboot alert gate's tests:
//! Debian's `prometheus` (`scripts/setup.sh` installs it; `LKS_PROMETHEUS`
//! overrides the binary), scraping every second a metrics target the test
//! controls ([`Target`]: a tiny HTTP server whose answer the test sets) and
//! evaluating the test's alerting rules every second. Its data lives in a
//! temp dir; it is killed and the dir removed when the value is dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{Proc, free_addr, wait_until};

/// The prometheus binary: `$LKS_PROMETHEUS`, else `prometheus` on PATH.
fn prometheus_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LKS_PROMETHEUS") {
        return PathBuf::from(p);
    }
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("prometheus"))
            .find(|p| p.is_file())
    });
    found.expect("prometheus not found: install Debian's prometheus (bash scripts/setup.sh does) or set LKS_PROMETHEUS")
}

/// A metrics endpoint whose text the test sets: any GET is answered with
/// it (`text/plain; version=0.0.4`).
pub struct Target {
    pub addr: SocketAddr,
    body: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Target {
    pub fn start(body: &str) -> Target {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let body = Arc::new(Mutex::new(body.to_string()));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (body.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let text = b.lock().unwrap().clone();
                        let _ = answer(conn, &text);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Target {
            addr,
            body,
            stop,
            thread: Some(thread),
        }
    }

    /// What the next scrape reads.
    pub fn set(&self, body: &str) {
        *self.body.lock().unwrap() = body.to_string();
    }
}

fn answer(mut conn: TcpStream, body: &str) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 64 * 1024 {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `GET http://ADDR/PATH` over HTTP/1.0: the status and body; `None` when
/// nothing answers.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(c, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = String::new();
    c.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

pub struct Prometheus {
    /// Dropped (killed) before its dir is removed.
    proc: Option<Proc>,
    dir: tempfile::TempDir,
    pub addr: SocketAddr,
}

impl Prometheus {
    /// Starts Prometheus scraping `target` every second and evaluating
    /// `rules` (the YAML of one rule group's `rules:` list, indented by
    /// four spaces) every second; returns once it is ready.
    pub fn start(target: SocketAddr, rules: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        let addr = free_addr();
        std::fs::write(
            dir.path().join("rules.yml"),
            format!("groups:\n- name: lks-e2e\n  interval: 1s\n  rules:\n{rules}"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n- rules.yml\nscrape_configs:\n- job_name: e2e\n  static_configs:\n  - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let mut cmd = Command::new(prometheus_bin());
        cmd.current_dir(dir.path())
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"));
        let proc = Proc::spawn("prometheus", cmd, dir.path());
        let p = Prometheus {
            proc: Some(proc),
            dir,
            addr,
        };
        wait_until(Duration::from_secs(30), "prometheus ready", || {
            http_get(addr, "/-/ready").is_some_and(|(s, _)| s == 200)
        });
        p
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The names of the alerts firing now (pending ones left out).
    pub fn firing(&self) -> Vec<String> {
        let Some((200, body)) = http_get(self.addr, "/api/v1/alerts") else {
            return Vec::new();
        };
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let mut out: Vec<String> = v["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["state"] == "firing")
            .filter_map(|a| a["labels"]["alertname"].as_str().map(str::to_string))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// SIGKILL: the gate's Prometheus is gone.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }

    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}
