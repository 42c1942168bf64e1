//! The channel of the current server connection, shared by everything that
//! calls the server on it (blob fetches, certificates, renewal, peer
//! sharing's tracker), and the one-line error text the link code reports.

use std::sync::{Arc, Mutex};

use tonic::transport::Channel;

/// The channel of the current server connection, shared with blob fetches,
/// certificate requests and renewal.
#[derive(Clone, Default)]
pub struct SharedChannel(Arc<Mutex<Option<Channel>>>);

impl SharedChannel {
    pub fn set(&self, ch: Option<Channel>) {
        if let Ok(mut g) = self.0.lock() {
            *g = ch;
        }
    }

    pub fn get(&self) -> Option<Channel> {
        self.0.lock().ok().and_then(|g| g.clone())
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
