//! Certificates and keys: the server's own PKI (`server.rs`: its CA,
//! serving and admin certificates, node certificates at enrolment), the
//! tenant cluster CAs (`clusterca.rs`, their keys at rest in
//! `clusterca/keys.rs`), and the sealing of private keys at rest
//! (`seal.rs`). What a node may have signed by its cluster's CA is the
//! use case `ops::issue`.

pub mod clusterca;
pub mod seal;
mod server;

pub(crate) use server::{BACKDATE, random_serial};
pub use server::{IssuedCert, Pki, PkiError, SharedIdentity};
