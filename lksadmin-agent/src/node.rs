//! The node itself: the facts it reports, the files it makes for its own
//! identity (certificate entries, its node certificate's renewal), the
//! agent replacing its own binary, and systemd notification.

pub mod certs;
pub mod facts;
pub mod notify;
pub mod renew;
pub mod selfupdate;
