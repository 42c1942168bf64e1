//! lksadmin node agent: joins a tenant cluster, keeps one outward gRPC
//! stream to the control server, applies signed bundles through a
//! journalled state machine, and heals drift — also while the server is
//! unreachable.
//!
//! `main.rs` only parses the command line, builds the runtime and wires
//! signals; everything else lives here so tests can drive it.

#![forbid(unsafe_code)]

pub mod backoff;
pub mod cache;
pub mod certs;
pub mod client;
pub mod clock;
pub mod config;
pub mod connection;
pub mod drift;
pub mod engine;
pub mod facts;
pub mod fault;
pub mod flushwriter;
pub mod fsutil;
pub mod join;
pub mod journal;
pub mod logging;
pub mod notify;
pub mod peer;
pub mod pin;
pub mod renew;
pub mod run;
pub mod runner;
pub mod selfupdate;
pub mod settings;
pub mod source;
pub mod state;
pub mod status;
pub mod swarm;
