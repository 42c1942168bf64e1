//! The node itself: the facts it reports, the files it makes for its own
//! identity (certificate entries, its node certificate's renewal), the
//! agent replacing its own binary, systemd notification, and giving freed
//! heap memory back to the kernel.

pub mod certs;
pub mod facts;
pub mod memory;
pub mod notify;
pub mod renew;
pub mod selfupdate;
