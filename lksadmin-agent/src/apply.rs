//! Applying bundles to this node: the desired state in the agent's own
//! terms, the engine and its journalled transactions, the blob cache, the
//! persisted local state, the signed-release journal and its checks,
//! what is reported to the server, the confined
//! node root, the inode trust that spares re-reading files, the step and
//! health-check runner, drift watching, the agent replacing its own binary,
//! and the ports blob bytes come through ([`source`]).

pub mod cache;
pub mod desired;
pub mod drift;
pub mod engine;
pub mod flushwriter;
pub mod inode;
pub mod journal;
pub mod rebuild;
pub mod report;
pub mod retired;
pub mod root;
pub mod runner;
pub mod selfupdate;
pub mod source;
pub mod state;
pub mod trust;
