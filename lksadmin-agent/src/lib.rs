//! lksadmin node agent: joins a tenant cluster, keeps one outward gRPC
//! stream to the control server, applies signed bundles through a
//! journalled state machine, and heals drift — also while the server is
//! unreachable.
//!
//! `main.rs` only parses the command line, builds the runtime and wires
//! signals; everything else lives here so tests can drive it:
//!
//! | where | what |
//! |---|---|
//! | [`apply`] | the engine and its journalled transactions, the blob cache, local state, durable writes, the step runner, drift watching |
//! | [`link`] | the stream to the control server, its channels, blob sources, peer sharing |
//! | [`node`] | facts, identity files and certificate renewal, self-update, systemd notify, giving freed memory back |
//! | top level | `run` (the daemon), `join`, `config` and `settings`, `status`, logging, the clock, fault points |

// One module may call into libc (`node::memory`, `malloc_trim`), with its
// reason beside the call; everything else is safe Rust.
#![deny(unsafe_code)]

pub mod apply;
pub mod clock;
pub mod config;
pub mod fault;
pub mod join;
pub mod link;
pub mod logging;
pub mod node;
pub mod run;
pub mod settings;
pub mod status;
