//! The one library agent, control server and `lksctl` link: the wire
//! contract, the bundle rules, and the small pieces of plumbing they share.
//!
//! It is a facade over two crates, so every `lks_proto::…` path stays the
//! same for its users:
//! - `lks-wire` (proto/wire/): the code generated from `lks/v1/*.proto`,
//!   re-exported as [`pb`], and its [`codec`];
//! - `lks-bundle` (proto/bundle/): the bundle rules — [`manifest`],
//!   `bundle.toml` ([`authoring`]), [`digest`], [`canonical`] encoding,
//!   [`sign`]atures, signed [`release`] records, target [`path`]s,
//!   [`limits`] — and [`convert`], the
//!   `TryFrom` from the generated types that applies them, so an invalid
//!   message is refused at the edge with an error naming the field.
//!
//! Generated code and rules are apart so that each is read and reviewed on
//! its own: the generated code has no rules to keep, and the rules see the
//! generated types in one file only (`convert`). What lives here itself is
//! shared by more than one binary but is neither: backoff, TLS
//! configuration, node identities and tokens,
//! durable writes, `admin.conf`, errors as one line ([`report`]), and the
//! answer to malformed requests ([`wire`]).

#![forbid(unsafe_code)]

pub mod adminconf;
pub mod backoff;
pub mod delta;
pub mod fsutil;
pub mod identity;
pub mod labels;
pub mod report;
pub mod sync;
pub mod tls;
pub mod token;
#[cfg(feature = "windows")]
pub mod windows;
pub mod wire;

pub use lks_bundle::{
    BundlePath, BundleState, Digest, FileSpec, HealthCheck, Manifest, SignedBundle, Step, arch, authoring,
    canonical, certs, chunks, convert, digest, duration, elf, limits, manifest, names, path, rate, release,
    served, sign,
};
pub use lks_wire::{codec, pb};

/// Where the control server offers the agent's Debian package over HTTPS:
/// this prefix, then a Debian architecture (`/v1/agent-package/amd64`).
/// The cloud-init line `lksctl cloud-init` writes downloads from it.
pub const AGENT_PACKAGE_PATH: &str = "/v1/agent-package/";
