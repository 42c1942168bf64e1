//! `lksctl console`: the operator console, a small HTTP server inside lksctl
//! that serves its pages (embedded; no CDN, no build step) and JSON
//! endpoints mirroring the lksctl verbs, answered through the admin API with
//! the operator's `admin.conf` — the control server gains no listener.
//!
//! Safety: it binds loopback unless told otherwise (then warns); every
//! request's `Host` must name the listen address (against DNS rebinding,
//! unless it listens on every address); a POST needs the per-process token
//! embedded in the served page (`X-Console-Token`) and, when the browser
//! sends one, an `Origin` of this same address. No CORS header is ever sent.

mod api;
mod http;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use lks_proto::adminconf::AdminConfFile;

/// Connections served at once; more wait in the accept queue.
const MAX_CONNECTIONS: usize = 64;
/// How long open connections get to finish after Ctrl-C.
const GRACE: Duration = Duration::from_secs(2);

/// Serves the console on `listen` until Ctrl-C or SIGTERM.
pub async fn run(config: &Path, listen: SocketAddr, open: bool) -> anyhow::Result<()> {
    // The file is checked now, so a wrong path fails before anything listens;
    // the server itself may be down (the pages say so).
    AdminConfFile::load(config).context(
        "load lksctl config (give --config FILE or set LKSCTL_CONFIG; the server writes admin.conf in its data dir)",
    )?;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("listen on {listen}"))?;
    let local = listener.local_addr().context("read the listen address")?;
    if !local.ip().is_loopback() {
        eprintln!(
            "warning: --listen {local} is not a loopback address: anyone who can reach it can see the fleet \
             and pause, abort, roll back and start rollouts with the rights of {}",
            config.display()
        );
    }
    let console = Arc::new(http::Console::new(config.to_path_buf(), local)?);
    let url = console.url();
    outln!("lksctl console: serving {url} (Ctrl-C stops it)");
    if open {
        open_browser(&url);
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    serve(listener, console, shutdown).await;
    eprintln!("lksctl console: stopped");
    Ok(())
}

async fn cancel_on_signal(shutdown: CancellationToken) {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    shutdown.cancel();
}

/// Accepts connections until `shutdown`, then lets open ones finish within
/// [`GRACE`].
async fn serve(listener: TcpListener, console: Arc<http::Console>, shutdown: CancellationToken) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut conns = JoinSet::new();
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => break,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("lksctl console: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Finished connections are reaped as we go.
        while conns.try_join_next().is_some() {}
        let console = console.clone();
        let shutdown = shutdown.clone();
        conns.spawn(async move {
            let _permit = permit;
            let svc = service_fn(move |req| {
                let console = console.clone();
                async move { Ok::<_, Infallible>(console.handle(req).await) }
            });
            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(GRACE, conn).await;
                }
            }
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(GRACE + Duration::from_millis(500), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    conns.abort_all();
}

/// `xdg-open URL`; says where to go if that does not work.
fn open_browser(url: &str) {
    let opened = std::process::Command::new("xdg-open")
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    match opened {
        Ok(mut child) => {
            let url = url.to_string();
            // Reaped off the async threads; a failing opener leaves the URL on screen.
            std::thread::spawn(move || {
                if !child.wait().is_ok_and(|s| s.success()) {
                    eprintln!("lksctl console: xdg-open failed; open {url} in a browser");
                }
            });
        }
        Err(e) => eprintln!("lksctl console: cannot run xdg-open ({e}); open {url} in a browser"),
    }
}
