//! lksadmin control server: the gRPC agent and admin APIs, the use cases
//! behind them, the rollout controller and replication between replicas,
//! over crates of their own: the store (`lks-store` and its SQLite and
//! etcd backends), the PKI (`lks-pki`), the rollout decisions
//! (`lks-rollout`), the tenant clusters' Kubernetes APIs (`lks-kube`),
//! peer sharing's tracker (`lks-tracker`) and the blobs — blob store,
//! collector, delta maker — (`lks-blobs`). `lksctl`, the
//! operator CLI, and `lks-loadgen` are crates of
//! their own beside it (`control-server/lksctl`, `control-server/loadgen`)
//! that link `lks-proto`, not this crate.
//!
//! `main.rs` only parses arguments and wires signals; all behaviour lives
//! here so tests can drive it.

#![forbid(unsafe_code)]

pub mod admission;
pub mod api;
pub mod authz;
pub mod backup;
pub mod clock;
pub mod clustercache;
pub mod context;
pub mod controller;
pub mod fleetlock;
pub mod hub;
pub mod metrics;
pub mod migrate;
pub mod ops;
pub mod packages;
pub mod peers;
pub mod plans;
pub mod ratelimit;
pub mod rebalance;
pub mod rebootgates;
pub mod reboots;
pub mod releases;
pub mod replicas;
pub mod server;
pub mod store;
pub mod tlsaccept;

// Shared with lksctl through lks-proto; kept at their old paths here.
pub use lks_proto::{adminconf, fsutil, windows};

pub use server::{Config, ServerError, run};
