//! The lksadmin wire contract and the bundle rules every layer shares.
//!
//! Agent, control server and `lksctl` all link this crate so they can never
//! disagree about what a bundle is: the generated gRPC types live in [`pb`];
//! everything else is plain Rust that the generated types convert into with
//! `TryFrom` (see [`convert`]), so an invalid message is refused at the edge
//! with an error naming the field.

#![forbid(unsafe_code)]

pub mod adminconf;
pub mod arch;
pub mod authoring;
pub mod backoff;
pub mod canonical;
pub mod certs;
pub mod chunks;
pub mod codec;
pub mod convert;
pub mod digest;
pub mod duration;
pub mod elf;
pub mod fsutil;
pub mod identity;
pub mod labels;
pub mod limits;
pub mod manifest;
pub mod names;
pub mod path;
pub mod sign;
pub mod tls;
pub mod token;
#[cfg(feature = "windows")]
pub mod windows;
pub mod wire;

/// Where the control server offers the agent's Debian package over HTTPS:
/// this prefix, then a Debian architecture (`/v1/agent-package/amd64`).
/// The cloud-init line `lksctl cloud-init` writes downloads from it.
pub const AGENT_PACKAGE_PATH: &str = "/v1/agent-package/";

pub use digest::Digest;
pub use manifest::{BundleState, FileSpec, HealthCheck, Manifest, SignedBundle, Step};
pub use path::BundlePath;

/// Generated protobuf and gRPC code for package `lks.v1`.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("lks.v1");

    /// Encoded `FileDescriptorSet` of the contract, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/lks_v1_descriptor.bin"));
}
