//! systemd integration: `READY=1`, `STATUS=…`, `STOPPING=1` and the
//! watchdog, through libsystemd's `sd_notify`. Outside systemd (no
//! `NOTIFY_SOCKET`) every call is a no-op.

use std::time::Duration;

fn send(state: &[(&str, &str)]) {
    if let Err(e) = systemd::daemon::notify(state.iter()) {
        tracing::debug!("sd_notify: {e}");
    }
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
    match systemd::daemon::watchdog_enabled() {
        Ok(usec) if usec > 0 => Some(Duration::from_micros(usec / 2)),
        _ => None,
    }
}

/// True when systemd started this process with its output going to the
/// journal.
pub fn under_systemd() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some() || std::env::var_os("INVOCATION_ID").is_some()
}
