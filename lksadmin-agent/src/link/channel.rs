//! The channel of the current server connection, shared by everything that
//! calls the server on it (blob fetches, certificates, renewal, peer
//! sharing's tracker), and the one-line error text the link code reports.

use std::sync::{Arc, Mutex};

use lks_proto::sync::lock;
use tonic::transport::Channel;

/// The channel of the current server connection, shared with blob fetches,
/// certificate requests and renewal. One slot written, whole after a
/// panic: locked with [`lock`].
#[derive(Clone, Default)]
pub struct SharedChannel(Arc<Mutex<Option<Channel>>>);

impl SharedChannel {
    pub fn set(&self, ch: Option<Channel>) {
        *lock(&self.0) = ch;
    }

    pub fn get(&self) -> Option<Channel> {
        lock(&self.0).clone()
    }
}

/// An error with its sources, on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}
