//! Logging: to journald (with priorities) when systemd runs the agent,
//! otherwise to stderr.

use std::fmt::Write as _;
use std::os::unix::net::UnixDatagram;
use std::sync::OnceLock;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// Installs the global subscriber. `RUST_LOG` overrides `default_level`.
pub fn init(default_level: &str) {
    let filter = filter(std::env::var("RUST_LOG").ok().as_deref(), default_level);
    if crate::node::notify::under_systemd() && std::env::var_os("LKS_LOG_STDERR").is_none() {
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(JournalLayer)
            .try_init();
    } else {
        // The fmt subscriber alone stops at INFO; `filter` decides.
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::level_filters::LevelFilter::TRACE)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
            .finish()
            .with(filter)
            .try_init();
    }
}

/// `RUST_LOG` as `level` and `target=level` directives, comma-separated
/// (`info,lksadmin_agent=debug`); unset, empty or malformed, `default_level`.
/// A plain target filter, not `EnvFilter`: its span and field directives
/// would link a regex engine into the agent for nothing it uses.
fn filter(rust_log: Option<&str>, default_level: &str) -> Targets {
    rust_log
        .filter(|s| !s.trim().is_empty())
        .and_then(|s| s.parse().ok())
        .or_else(|| default_level.parse().ok())
        .unwrap_or_else(|| Targets::new().with_default(Level::INFO))
}

/// Sends each event to journald as one entry with a syslog priority.
struct JournalLayer;

#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.rest, " {}={value}", field.name());
        }
    }
}

impl<S: Subscriber> Layer<S> for JournalLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let priority = match *event.metadata().level() {
            Level::ERROR => 3,
            Level::WARN => 4,
            Level::INFO => 6,
            Level::DEBUG | Level::TRACE => 7,
        };
        let entry = journal_entry(&[
            ("PRIORITY", &priority.to_string()),
            ("MESSAGE", &format!("{}{}", f.message, f.rest)),
            ("TARGET", event.metadata().target()),
            ("SYSLOG_IDENTIFIER", syslog_identifier()),
        ]);
        let _ = journal_socket().map(|s| s.send_to(&entry, JOURNAL_SOCKET));
    }
}

/// journald's native protocol: one datagram per entry. libsystemd's
/// `sd_journal_send` speaks the same, but linking libsystemd (and the
/// libraries it loads) cost the agent about 1 MiB of resident memory
/// (BENCHMARKS.md, "Agent footprint").
const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

fn journal_socket() -> Option<&'static UnixDatagram> {
    static SOCKET: OnceLock<Option<UnixDatagram>> = OnceLock::new();
    SOCKET.get_or_init(|| UnixDatagram::unbound().ok()).as_ref()
}

/// What `sd_journal_send` adds to every entry (`journalctl -t` matches
/// it): the program's name as it was started.
fn syslog_identifier() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        std::env::args_os()
            .next()
            .as_deref()
            .map(std::path::Path::new)
            .and_then(|p| p.file_name())
            .map_or_else(|| "lksadmin-agent".into(), |n| n.to_string_lossy().into_owned())
    })
}

/// `KEY=VALUE` lines; a value holding a newline is sent as `KEY`, a newline,
/// its length (64-bit little endian) and its bytes.
fn journal_entry(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in fields {
        out.extend_from_slice(key.as_bytes());
        if value.contains('\n') {
            out.push(b'\n');
            out.extend_from_slice(&(value.len() as u64).to_le_bytes());
        } else {
            out.push(b'=');
        }
        out.extend_from_slice(value.as_bytes());
        out.push(b'\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use tracing::Level;

    use super::{filter, journal_entry};

    #[test]
    fn journal_entries_frame_values_with_newlines() {
        assert_eq!(
            journal_entry(&[("PRIORITY", "6"), ("MESSAGE", "applied")]),
            b"PRIORITY=6\nMESSAGE=applied\n"
        );
        let mut want = b"MESSAGE\n".to_vec();
        want.extend_from_slice(&5u64.to_le_bytes());
        want.extend_from_slice(b"a\nb=c\n");
        assert_eq!(journal_entry(&[("MESSAGE", "a\nb=c")]), want);
    }

    #[test]
    fn rust_log_overrides_the_default_level() {
        let f = filter(Some("info,lksadmin_agent=debug"), "warn");
        assert!(f.would_enable("lksadmin_agent::engine", &Level::DEBUG));
        assert!(f.would_enable("h2::proto", &Level::INFO));
        assert!(!f.would_enable("h2::proto", &Level::DEBUG));
    }

    #[test]
    fn unset_empty_or_malformed_rust_log_keeps_the_default() {
        for v in [None, Some(""), Some("  "), Some("x=notalevel")] {
            let f = filter(v, "warn");
            assert!(f.would_enable("lksadmin_agent", &Level::WARN), "{v:?}");
            assert!(!f.would_enable("lksadmin_agent", &Level::INFO), "{v:?}");
        }
    }
}
