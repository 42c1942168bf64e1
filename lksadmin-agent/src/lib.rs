//! lksadmin node agent: joins a tenant cluster, keeps one outward gRPC
//! stream to the control server, applies signed bundles through a
//! journalled state machine, and heals drift — also while the server is
//! unreachable.
//!
//! `main.rs` only parses the command line, builds the runtime and wires
//! signals; everything else lives here so tests can drive it.
//!
//! The folders are the layers, bottom to top; a module imports only its own
//! layer or lower ones (`scripts/check-layers.sh`; README, "Modules"):
//!
//! | layer | what |
//! |---|---|
//! | `clock`, `fault`, `config` | time, test-only fault points, the state dir and the identity `join` wrote |
//! | [`node`] | facts, the keys and certificates the node makes (and the `CertIssuer` port), systemd notify, giving freed memory back |
//! | [`apply`] | the engine and its journalled transactions, the blob cache and the ports blob bytes come through, local state, the step runner, drift watching, self-update |
//! | [`link`] | the stream to the control server, its channels, blob sources and the certificate issuer over them, renewal, peer sharing, `status.json` |
//! | top level | `status`, logging, `join`, `run` (the daemon), `settings` |

// Three modules may call into libc (`node::memory`: `mallopt`,
// `malloc_trim`; `node::priority`: `setpriority`; `node::disk`:
// `sync_file_range`), none of which nix wraps, with the reason beside each
// call; everything else is safe Rust.
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
