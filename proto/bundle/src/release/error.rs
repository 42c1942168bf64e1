//! Why a release record, a trust root or a bundle was refused: one line
//! each, naming the record and the reason, printed as it is to operators.

use crate::digest::Digest;
use crate::limits::{MAX_RELEASE_BUNDLES, MAX_ROOT_KEYS, MAX_SIGNATURES};
use crate::names::NameError;

/// Why [`super::TrustState`] or [`super::Release::admits`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    #[error(
        "the node's clock reads {}, earlier than {} when it last accepted signed metadata \
         (the clock went back; fix it before accepting releases)",
        when(*.now),
        when(*.latest_known)
    )]
    ClockWentBack { now: i64, latest_known: i64 },
    #[error("release {version} is for {got}, but this node follows {want}")]
    WrongChannel { version: u64, got: String, want: String },
    #[error(
        "{what} has {valid} of the {threshold} signatures needed from {signers}{}",
        bad_suffix(.bad)
    )]
    Threshold {
        /// The record: "release 7 of tenant-a", "trust root 2".
        what: String,
        /// Whose keys: "the keys of trust root 1", "its own keys".
        signers: String,
        valid: usize,
        threshold: u32,
        /// Fingerprints of listed keys whose signature did not verify.
        bad: Vec<String>,
    },
    #[error(
        "release {got} of {channel} is older than release {have} this node already accepted \
         (a rollback needs a newer signed release)"
    )]
    Rollback { channel: String, got: u64, have: u64 },
    #[error(
        "release {version} of {channel} differs from the release {version} this node already accepted \
         (every signed change needs a new version)"
    )]
    Equivocation { channel: String, version: u64 },
    #[error(
        "release {version} of {channel} expired at {} and the node's clock reads {} \
         (the publisher must sign a fresh release)",
        when(*.at),
        when(*.now)
    )]
    Expired {
        channel: String,
        version: u64,
        at: i64,
        now: i64,
    },
    #[error(
        "trust root {version} expired at {} and the node's clock reads {} \
         (the publisher must sign a new trust root)",
        when(*.at),
        when(*.now)
    )]
    RootExpired { version: u64, at: i64, now: i64 },
    #[error(
        "trust root {got} cannot follow trust root {have}: roots rotate one version at a time \
         (expected trust root {want})"
    )]
    RootVersion { got: u64, have: u64, want: u64 },
    #[error("{what}: {source}")]
    InvalidName {
        /// The record and field: "release 7 of tenant-a, bundle kubelet".
        what: String,
        source: NameError,
    },
    #[error("{what} has version 0; versions start at 1")]
    ZeroVersion { what: String },
    #[error("release {version} of {channel} names {count} bundles; the limit is {MAX_RELEASE_BUNDLES}")]
    TooManyBundles {
        channel: String,
        version: u64,
        count: usize,
    },
    #[error("{what} carries {count} signatures; the limit is {MAX_SIGNATURES}")]
    TooManySignatures { what: String, count: usize },
    #[error("trust root {version} has {count} keys; the limit is {MAX_ROOT_KEYS}")]
    TooManyKeys { version: u64, count: usize },
    #[error("trust root {version} has no keys")]
    NoKeys { version: u64 },
    #[error("trust root {version} lists key {key} twice")]
    DuplicateKey { version: u64, key: String },
    #[error(
        "trust root {version} has threshold {threshold} with {keys} keys; \
         it must be between 1 and the number of keys"
    )]
    BadThreshold {
        version: u64,
        threshold: u32,
        keys: usize,
    },
    #[error("bundle {name}@{version} is not in release {release} of {channel}{}", released_suffix(.released))]
    NotReleased {
        channel: String,
        release: u64,
        name: String,
        version: String,
        /// The version of `name` the release does name, if any.
        released: Option<String>,
    },
    #[error(
        "bundle {bundle} has manifest digest {got}, but release {release} of {channel} \
         released it with {expected}"
    )]
    DigestMismatch {
        channel: String,
        release: u64,
        /// `NAME@VERSION` (one string keeps the error small).
        bundle: String,
        expected: Digest,
        got: Digest,
    },
    #[error("{what}: {why}")]
    Malformed {
        /// The record and field: "release 7 of tenant-a: bundles[3].manifest_digest".
        what: String,
        why: String,
    },
    #[error("{what} is {size} bytes encoded; the limit is {limit}")]
    TooLarge {
        what: &'static str,
        size: usize,
        limit: usize,
    },
}

/// Unix milliseconds as RFC 3339 (UTC); `"{ms} ms"` for a time no
/// calendar date can say.
fn when(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| format!("{ms} ms"))
}

fn bad_suffix(bad: &[String]) -> String {
    if bad.is_empty() {
        String::new()
    } else {
        format!(" (bad signature by {})", bad.join(", "))
    }
}

fn released_suffix(released: &Option<String>) -> String {
    match released {
        Some(v) => format!(" (it releases version {v})"),
        None => " (it releases no such bundle)".into(),
    }
}
