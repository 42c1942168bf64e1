//! The bundle rules: what a bundle is, and what makes one valid.
//!
//! A bundle's [`Manifest`] (files, steps, health check, certificates), the
//! `bundle.toml` it is authored in ([`authoring`]), its SHA-256 [`Digest`]s
//! and chunk lists, the canonical encoding that is signed ([`canonical`],
//! [`sign`]), the target paths files may have ([`BundlePath`]), the signed
//! [`release`] records that say which bundle versions are current, and the
//! limits on all of it. Agent, control server and `lksctl` share this one
//! implementation, so they can never disagree about what a bundle is.
//!
//! Everything here is plain Rust. The generated protobuf types live in
//! `lks-wire`; [`convert`] turns them into these types with `TryFrom`, which
//! applies every rule, so an invalid message is refused at the edge with an
//! error naming the field. The binaries reach this crate through the
//! `lks-proto` facade, at the same paths (`lks_proto::manifest`, …).

#![forbid(unsafe_code)]

pub mod arch;
pub mod authoring;
pub mod canonical;
pub mod certs;
pub mod chunks;
pub mod convert;
pub mod digest;
pub mod duration;
pub mod elf;
pub mod limits;
pub mod manifest;
pub mod names;
pub mod path;
pub mod rate;
pub mod release;
mod rule;
pub mod served;
pub mod sign;

pub use digest::Digest;
pub use manifest::{BundleState, FileSpec, HealthCheck, Manifest, SignedBundle, Step};
pub use path::BundlePath;
