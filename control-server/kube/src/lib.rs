//! The tenant clusters' Kubernetes APIs (issue [kube-drain]): the
//! kubeconfig a cluster is given, checked ([`config`]) and sealed at rest
//! ([`secret`]); a client of each tenant API ([`tenant`]); what the server
//! reads there, the Node objects ([`nodes`]); a node's cordon, evictions,
//! uncordon and Ready check ([`drain`]); and the rollout controller's tasks
//! that run them, answering as an `lks_rollout::KubeFact` ([`work`]).
//!
//! kube0 hosts the tenant control planes, so the server reaches each
//! tenant's API server directly, never through a node. This crate does the
//! I/O; what a draining node's turn decides is `lks-rollout`'s pure
//! `drain`. It links the store's rows and traits, `lks-pki`'s sealing and
//! `lks-rollout`'s answer type, never the server, a store backend or tonic.

#![forbid(unsafe_code)]

pub mod config;
pub mod drain;
pub mod nodes;
pub mod secret;
pub mod tenant;
pub mod work;
