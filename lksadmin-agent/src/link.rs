//! The node's links: the one outward stream to the control server and the
//! gRPC channels under it (CA pin, mTLS, backoff), where blob bytes come
//! from (the server, a mirror, peers), certificates signed and the node
//! certificate renewed over that channel, and peer sharing, both the
//! fetching and the serving side. It implements the apply layer's blob
//! ports and the node layer's certificate port.

pub mod backoff;
pub mod channel;
pub mod client;
pub mod connection;
pub mod issuer;
pub mod peer;
pub mod pin;
pub mod renew;
pub mod source;
pub mod status_file;
pub mod swarm;
