//! The node's links: the one outward stream to the control server and the
//! gRPC channels under it (CA pin, mTLS, backoff), where blob bytes come
//! from (the server, a mirror, peers), and peer sharing, both the
//! fetching and the serving side.

pub mod backoff;
pub mod channel;
pub mod client;
pub mod connection;
pub mod peer;
pub mod pin;
pub mod source;
pub mod swarm;
