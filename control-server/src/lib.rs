//! lksadmin control server: the gRPC agent and admin APIs, its PKI, the
//! SQLite and etcd stores, the blob store, replication between replicas, and `lksctl`, the operator CLI.
//!
//! `main.rs` and `bin/lksctl.rs` only parse arguments and wire signals; all
//! behaviour lives here so tests can drive it.

#![forbid(unsafe_code)]

pub mod adminconf;
pub mod admission;
pub mod api;
pub mod authz;
pub mod blobs;
pub mod clock;
pub mod controller;
pub mod fsutil;
pub mod hub;
pub mod metrics;
pub mod migrate;
pub mod packages;
pub mod peers;
pub mod pki;
pub mod ratelimit;
pub mod rebalance;
pub mod replicas;
pub mod rollout;
pub mod server;
pub mod store;
pub mod tlsaccept;
pub mod tracker;
pub mod windows;

pub use server::{Config, ServerError, run};
