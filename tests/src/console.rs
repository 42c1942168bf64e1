//! Harness for the console tests: `lksctl console` as a process, an HTTP
//! client for its endpoints, and a minimal W3C WebDriver client driving
//! headless Chromium through `chromedriver` (Debian's `chromium` and
//! `chromium-driver`; scripts/setup.sh installs them). A missing browser
//! fails the test: it never skips.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::server::Server;
use crate::{Proc, bin, bin_dir, free_addr, wait_for_port};

/// How long a page may take to show what the test waits for.
pub const PAGE_WAIT: Duration = Duration::from_secs(15);

/// A running `lksctl console`.
pub struct Console {
    pub addr: SocketAddr,
    proc: Proc,
    _dir: tempfile::TempDir,
}

impl Console {
    /// `lksctl --config <admin.conf> console --listen LISTEN` (a free
    /// loopback port when `listen` is None); waits until it serves.
    pub fn start(server: &Server, listen: Option<SocketAddr>) -> Console {
        let addr = listen.unwrap_or_else(free_addr);
        let dir = tempfile::tempdir().expect("create temp dir");
        let mut cmd = Command::new(bin("lksctl"));
        cmd.arg("--config")
            .arg(server.admin_conf_path())
            .args(["console", "--listen", &addr.to_string()])
            .env_remove("LKSCTL_CONFIG");
        let proc = Proc::spawn("lksctl-console", cmd, dir.path());
        let reach = if addr.ip().is_unspecified() {
            SocketAddr::from(([127, 0, 0, 1], addr.port()))
        } else {
            addr
        };
        wait_for_port(reach, Duration::from_secs(10));
        Console {
            addr: reach,
            proc,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    pub fn log(&self) -> String {
        self.proc.log_text()
    }

    /// SIGTERM (as Ctrl-C); the exit code.
    pub fn stop(&mut self) -> Option<i32> {
        self.proc.terminate(Duration::from_secs(5))
    }
}

/// A blocking HTTP client (reqwest on a private runtime).
pub struct Http {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
}

/// Status and parsed JSON body (Null if not JSON).
pub struct Reply {
    pub status: u16,
    pub json: Value,
    pub text: String,
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl Http {
    pub fn new() -> Http {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("build a runtime");
        // Plain HTTP only, but reqwest wants a TLS provider all the same.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .no_proxy()
            .build()
            .expect("build an HTTP client");
        Http { rt, client }
    }

    pub fn request(&self, method: &str, url: &str, headers: &[(&str, &str)], body: Option<&Value>) -> Reply {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut req = self.client.request(method, url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b.to_string());
        }
        self.rt.block_on(async {
            let resp = req.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
            let status = resp.status().as_u16();
            let text = resp
                .text()
                .await
                .unwrap_or_else(|e| panic!("{url}: read body: {e}"));
            let json = serde_json::from_str(&text).unwrap_or(Value::Null);
            Reply { status, json, text }
        })
    }

    pub fn get(&self, url: &str) -> Reply {
        self.request("GET", url, &[], None)
    }
}

/// The page's CSRF token, from the `<meta>` the console serves.
pub fn page_token(html: &str) -> String {
    let at = html
        .find("name=\"lks-console-token\" content=\"")
        .unwrap_or_else(|| panic!("no token in the page:\n{html}"));
    let rest = &html[at + "name=\"lks-console-token\" content=\"".len()..];
    rest[..rest.find('"').expect("end of token")].to_string()
}

/// Where the test run's screenshots go: `target/console-screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    // bin_dir() is target/debug (or LKS_BIN_DIR): its parent is target/.
    let dir = bin_dir()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(bin_dir)
        .join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("create the screenshot dir");
    dir
}

/// Finds a program on PATH; panics (never skips) with the fix when missing.
fn program(name: &str, package: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!("{name} not found on PATH: install Debian's {package} (bash scripts/setup.sh does)")
        })
}

/// A headless Chromium session over WebDriver.
pub struct Browser {
    http: Http,
    base: String,
    session: String,
    _driver: Proc,
    _dir: tempfile::TempDir,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    pub fn start() -> Browser {
        let chromium = program("chromium", "chromium");
        let driver_bin = program("chromedriver", "chromium-driver");
        let dir = tempfile::tempdir().expect("create temp dir");
        let addr = free_addr();
        let mut cmd = Command::new(driver_bin);
        cmd.arg(format!("--port={}", addr.port()));
        let driver = Proc::spawn("chromedriver", cmd, dir.path());
        wait_for_port(addr, Duration::from_secs(20));
        let http = Http::new();
        let base = format!("http://{addr}");
        let profile = dir.path().join("profile");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1366,900", "--no-first-run", "--no-default-browser-check",
                         format!("--user-data-dir={}", profile.display())],
            },
        }}});
        let r = http.request("POST", &format!("{base}/session"), &[], Some(&caps));
        assert_eq!(r.status, 200, "start a Chromium session: {}", r.text);
        let session = r.json["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id: {}", r.text))
            .to_string();
        Browser {
            http,
            base,
            session,
            _driver: driver,
            _dir: dir,
        }
    }

    fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let body = body.or_else(|| (method == "POST").then(|| json!({})));
        let r = self.http.request(method, &url, &[], body.as_ref());
        assert_eq!(r.status, 200, "WebDriver {method} {path}: {}", r.text);
        r.json["value"].clone()
    }

    pub fn goto(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({ "url": url })));
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page.
    pub fn js(&self, script: &str, args: Value) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
    }

    /// The element matching a CSS selector, as WebDriver names it.
    pub fn find(&self, css: &str) -> String {
        let v = self.cmd(
            "POST",
            "/element",
            Some(json!({ "using": "css selector", "value": css })),
        );
        v[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("find {css}: {v}"))
            .to_string()
    }

    /// Clicks, as a user would (WebDriver scrolls it into view first).
    pub fn click(&self, css: &str) {
        let id = self.find(css);
        self.cmd("POST", &format!("/element/{id}/click"), None);
    }

    /// Types `text` into an element (after clearing it).
    pub fn type_into(&self, css: &str, text: &str) {
        let id = self.find(css);
        self.cmd("POST", &format!("/element/{id}/clear"), None);
        self.cmd(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        );
    }

    /// The text of the first element matching `css` ("" if none).
    pub fn text(&self, css: &str) -> String {
        self.js(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : '';",
            json!([css]),
        )
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    /// Waits until `cond` holds for the page; panics with what it saw.
    pub fn wait(&self, what: &str, mut cond: impl FnMut(&Browser) -> bool) {
        let start = Instant::now();
        while !cond(self) {
            assert!(
                start.elapsed() < PAGE_WAIT,
                "timed out waiting for {what}; the page shows:\n{}",
                self.text("main")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the text of `css` contains `want`.
    pub fn wait_text(&self, css: &str, want: &str) {
        self.wait(&format!("{css} to show {want:?}"), |b| b.text(css).contains(want));
    }

    /// Saves a PNG of the window as `dir/NAME.png`.
    pub fn screenshot(&self, dir: &Path, name: &str) {
        use base64::Engine as _;
        let v = self.cmd("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("screenshot data"))
            .expect("screenshot is base64");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("write screenshot");
    }

    pub fn hash(&self) -> String {
        self.js("return location.hash;", json!([]))
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let url = format!("{}/session/{}", self.base, self.session);
        let _ = self.http.request("DELETE", &url, &[], None);
    }
}
