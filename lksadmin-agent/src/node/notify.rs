//! systemd integration: `READY=1`, `STATUS=…`, `STOPPING=1` and the
//! watchdog, over the `sd_notify` protocol: one datagram of `KEY=VALUE`
//! lines to the socket in `NOTIFY_SOCKET`. Outside systemd (no
//! `NOTIFY_SOCKET`) every call is a no-op.
//!
//! The protocol is spoken here rather than through libsystemd: linking it
//! (and the compression and crypto libraries it loads) cost every node
//! about 1 MiB of resident memory for these few datagrams (BENCHMARKS.md,
//! "Agent footprint").

use std::ffi::OsStr;
use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

fn send(state: &[(&str, &str)]) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = notify_to(&socket, &message(state)) {
        tracing::debug!("sd_notify: {e}");
    }
}

/// `KEY=VALUE` lines, as `sd_notify` takes them.
fn message(state: &[(&str, &str)]) -> String {
    state
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Sends `msg` to a notify socket: a path, or an abstract socket (`@name`).
fn notify_to(socket: &OsStr, msg: &str) -> io::Result<()> {
    let bytes = socket.as_encoded_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name)?
        }
        None if bytes.starts_with(b"/") => SocketAddr::from_pathname(socket)?,
        None => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "NOTIFY_SOCKET is neither a path nor an abstract socket",
            ));
        }
    };
    UnixDatagram::unbound()?.send_to_addr(msg.as_bytes(), &addr)?;
    Ok(())
}

pub fn ready(status: &str) {
    send(&[("READY", "1"), ("STATUS", status)]);
}

pub fn status(status: &str) {
    send(&[("STATUS", status)]);
}

pub fn stopping() {
    send(&[("STOPPING", "1"), ("STATUS", "stopping")]);
}

pub fn watchdog() {
    send(&[("WATCHDOG", "1")]);
}

/// Half of `WATCHDOG_USEC`, if systemd armed a watchdog for this process.
pub fn watchdog_interval() -> Option<Duration> {
    watchdog_usec(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    )
    .map(|usec| Duration::from_micros(usec / 2))
}

/// `sd_watchdog_enabled`: `WATCHDOG_USEC` when it is a positive number and
/// `WATCHDOG_PID`, if set, names this process.
fn watchdog_usec(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<u64> {
    let usec = usec?.parse::<u64>().ok().filter(|&u| u > 0)?;
    match pid {
        Some(p) if p.parse::<u32>().ok() != Some(own_pid) => None,
        _ => Some(usec),
    }
}

/// True when systemd started this process with its output going to the
/// journal.
pub fn under_systemd() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some() || std::env::var_os("INVOCATION_ID").is_some()
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;

    use super::*;

    #[test]
    fn notify_sends_one_datagram_of_lines_to_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        notify_to(
            path.as_os_str(),
            &message(&[("READY", "1"), ("STATUS", "loaded")]),
        )
        .unwrap();
        let mut buf = [0u8; 256];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=loaded");
    }

    #[test]
    fn notify_reaches_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("lks-notify-test-{}", std::process::id());
        let rx = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
        notify_to(OsStr::new(&format!("@{name}")), "WATCHDOG=1").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"WATCHDOG=1");
    }

    #[test]
    fn notify_refuses_a_relative_socket() {
        assert!(notify_to(OsStr::new("notify"), "READY=1").is_err());
    }

    #[test]
    fn watchdog_is_armed_for_this_process_only() {
        assert_eq!(watchdog_usec(Some("30000000"), None, 7), Some(30_000_000));
        assert_eq!(watchdog_usec(Some("30000000"), Some("7"), 7), Some(30_000_000));
        assert_eq!(watchdog_usec(Some("30000000"), Some("8"), 7), None);
        assert_eq!(watchdog_usec(Some("0"), None, 7), None);
        assert_eq!(watchdog_usec(Some("soon"), None, 7), None);
        assert_eq!(watchdog_usec(None, Some("7"), 7), None);
    }
}
