//! What every handler and background task of one server process shares:
//! [`Shared`], built once by [`crate::server`] (which wires the process).
//! The API handlers never see it whole: `AdminApi::new` and
//! `AgentApi::new` hand each resource's handlers a narrow `Deps` of the
//! parts they use (the store, the hub, the PKI, …), each declared with
//! [`shared_view!`] so that what it holds is Shared's own field by name
//! and type, and the replicas' tasks and the rebalancer take it as a
//! whole.
//!
//! It sits below them: it names the store, the blob store, the hub, the
//! PKI and the queues of the tasks it feeds (the rollout controller's
//! [`controller::Handle`], the peer-settings cache), never an API module.
//! The rollout controller and the peer-settings refresher take narrow
//! dependencies of their own ([`controller::Deps`],
//! [`crate::peers::run`]) rather than this, so no arrow points back up.

use std::sync::Arc;
use std::time::Duration;

use lks_kube::tenant::TenantApis;
use lks_pki::Pki;
use lks_pki::clusterca::ClusterCas;
use lks_tracker::Tracker;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::OpenGate;
use crate::controller;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::packages::AgentPackages;
use crate::peers::PeerCache;
use crate::ratelimit::RateLimiter;
use crate::releases::ReleaseCache;
use crate::store::Store;
use lks_blobs::Blobs;

/// State shared by every handler and background task.
pub struct Shared {
    pub store: Arc<dyn Store>,
    /// Local blobs and the store where they are durable.
    pub blobs: Arc<Blobs>,
    /// What `GET /v1/agent-package/ARCH` serves.
    pub agent_packages: Arc<AgentPackages>,
    pub pki: Arc<Pki>,
    /// Tenant cluster CAs: `cluster_cas.load(name)` gives a cluster's CA
    /// ready to sign, its key opened with the encryption key if sealed.
    pub cluster_cas: Arc<ClusterCas>,
    /// Tenant cluster APIs: a client of each cluster's, from the
    /// kubeconfig it was given (`cluster set --kubeconfig`).
    pub tenants: Arc<TenantApis>,
    /// The reboot gates' answers (Prometheus alerts, blocking pods),
    /// shared by the reboot lock, `node get` and FleetLock.
    pub reboot_gates: Arc<crate::rebootgates::Gates>,
    pub hub: Arc<Hub>,
    /// Peer-sharing settings by cluster, for the desired states sent.
    pub peers: Arc<PeerCache>,
    /// Signed releases and trust roots by cluster, for the desired states
    /// sent.
    pub releases: Arc<ReleaseCache>,
    pub metrics: Arc<Metrics>,
    pub limiter: Arc<RateLimiter>,
    /// Room for `Connect` streams being opened (store work before the
    /// first desired state); beyond it a `Connect` is shed.
    pub opening: Arc<OpenGate>,
    /// Certificates each node may have signed: a burst for a bundle's
    /// worth, then one per ten seconds.
    pub issue_limiter: Arc<RateLimiter<String>>,
    /// Poked when a node reports, connects or is deleted, so the rollout
    /// controller looks again.
    pub rollouts_changed: Arc<Notify>,
    /// Operator commands to the rollout controller.
    pub rollouts: controller::Handle,
    /// Bumped whenever a rollout changed, for `WatchRollout` streams.
    pub rollout_updates: watch::Sender<u64>,
    /// `https://HOST:PORT` that agents and lksctl dial to reach this replica.
    pub server_url: String,
    /// True while this replica drives rollouts (always, on SQLite).
    pub leader: watch::Receiver<bool>,
    /// Every replica's URL, this one's first (only this one, on SQLite).
    pub servers: watch::Receiver<Vec<String>>,
    /// `--join-url`: what join lines name, if given.
    pub join_urls: Vec<String>,
    pub node_cert_ttl: Duration,
    pub ping_interval: Duration,
    /// Fires at shutdown.
    pub cancel: CancellationToken,
    /// Every per-stream and background task, so shutdown can wait for them.
    pub tasks: TaskTracker,
    /// Peer sharing: who holds which blob (`FindPeers`).
    pub tracker: Arc<Tracker>,
}

/// Declares a view of [`Shared`]: a struct of some of its fields, each
/// under Shared's own name, and `of(&Shared)`, which fills each from the
/// field of that name. The fields are listed once, so the struct and its
/// constructor cannot drift apart, and a field that is not Shared's, or
/// of another type, does not compile. A field's type may be narrower than
/// Shared's where it coerces: the store as the one aggregate trait the
/// view uses (`Arc<dyn TokenStore>` from `Arc<dyn Store>`). A view whose
/// calls reach several aggregates holds the whole `dyn Store` (a trait
/// object names one trait), and each function it calls names the
/// aggregates it uses in its bounds.
macro_rules! shared_view {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $($(#[$field_meta:meta])* $field:ident: $ty:ty),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $($(#[$field_meta])* pub $field: $ty,)*
        }

        impl $name {
            /// The parts of `s` this view holds.
            pub fn of(s: &$crate::context::Shared) -> Self {
                $name {
                    $($field: s.$field.clone(),)*
                }
            }
        }
    };
}
pub(crate) use shared_view;
