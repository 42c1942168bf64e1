//! The lksadmin wire contract as Rust: the gRPC and protobuf code generated
//! from `proto/lks/v1/*.proto`, and the codec the generated services use.
//!
//! This crate holds generated code and only what that code needs, so the
//! contract builds on its own and nothing here has rules to keep. What a
//! message *means* — a valid manifest, a digest, a signature — is decided
//! in `lks-bundle`, which converts these types into its own with `TryFrom`;
//! agent, server and `lksctl` reach both through the `lks-proto` facade
//! (`lks_proto::pb` is this crate's [`pb`]).

#![forbid(unsafe_code)]

pub mod codec;

/// Generated protobuf and gRPC code for package `lks.v1`.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("lks.v1");

    /// Encoded `FileDescriptorSet` of the contract, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/lks_v1_descriptor.bin"));
}
