//! The tenant clusters' Kubernetes APIs (issue [kube-drain]): the
//! kubeconfig a cluster is given, checked ([`config`]) and sealed at rest
//! ([`secret`]); a client of each tenant API ([`tenant`]); and what the
//! server reads there, the Node objects ([`nodes`]).
//!
//! kube0 hosts the tenant control planes, so the server reaches each
//! tenant's API server directly, never through a node.

pub mod config;
pub mod drain;
pub mod nodes;
pub mod secret;
pub mod tenant;
pub mod work;
