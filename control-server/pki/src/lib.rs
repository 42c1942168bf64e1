//! Certificates and keys of the control server: its own PKI (`server.rs`:
//! its CA, serving and admin certificates, node certificates at
//! enrolment), the tenant cluster CAs (`clusterca.rs`, their keys at rest
//! in `clusterca/keys.rs`), and the sealing of private keys at rest
//! (`seal.rs`). What a node may have signed by its cluster's CA is the
//! server's use case `ops::issue`; this crate only makes, keeps and signs.
//!
//! It links the store's rows and traits (`lks-store`, where a cluster CA's
//! key is kept) and the shared identity code (`lks-proto`), never the
//! server, a store backend or tonic.

#![forbid(unsafe_code)]

pub mod clusterca;
pub mod seal;
mod server;

pub use server::{IssuedCert, Pki, PkiError, SharedIdentity};
