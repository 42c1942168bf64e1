//! The server's wall clock: every time the server stores or compares
//! (token expiry, last-seen, rollout timestamps, events) is Unix
//! milliseconds from [`now_ms`], and [`rfc3339`] is how the server writes
//! one in a message; both are the store's clock (`lks_store::clock`), so
//! the crates below the server (`lks-pki`, `lks-kube`) keep the same time.

pub use lks_store::clock::{now_ms, rfc3339};
