//! The node itself, below everything that applies or talks: the facts it
//! reports, the keys and certificates it makes for a bundle's certificate
//! entries (and the [`certs::CertIssuer`] port that gets them signed),
//! systemd notification, giving freed heap memory back to the kernel,
//! background work at the lowest CPU priority, starting a file's disk
//! write early, and rebooting (what the node owes a reboot, its boot ID,
//! the reboot command).

pub mod certs;
pub mod disk;
pub mod facts;
pub mod memory;
pub mod notify;
pub mod priority;
pub mod reboot;
