//! The controller (issue [kube-front], item 2; issue [shape-3], item 4):
//! copies elect a leader through a Lease ([`crate::lease`]), renewed every
//! [`RENEW`]; while this copy holds it, it runs
//! - one kube-rs `Controller` per kind it reconciles — `LksCluster`
//!   ([`crate::clusters`]), declared `LksRollout`s ([`crate::rollouts`]),
//!   `LksNode` ([`crate::nodes`]) — each calling its reconciler for one
//!   object at a time, on a change of the object's spec (`metadata.generation`),
//!   finalizers or deletion (the controller's own status writes wake
//!   nothing), after each poll of the server, and at the requeue its last
//!   reconcile asked for; a failed object is tried again after its own
//!   backoff ([`crate::context::error_policy`]) while the others go on;
//! - the poll of the server ([`crate::poll`]) every `interval`.
//!
//! Losing the Lease stops them (each running reconcile is let finish); the
//! admin connection is shared by all and kept across leaderships.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kube::api::Api;
use kube::runtime::controller::{self, Action, Controller, Error as ControllerError};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Predicate as _, WatchStreamExt as _, predicates, watcher};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admin;
use crate::context::{Ctx, Error, error_policy};
use crate::crd::{LksCluster, LksNode, LksPlan, LksRollout};
use crate::lease::{DURATION, Elector, LeaseError, RENEW};
use crate::mirror::{MANAGED_BY, ME};
use crate::{clusters, nodes, plans, poll, rollouts};

pub struct Options {
    pub admin_conf: PathBuf,
    /// Namespace of the Lease.
    pub namespace: String,
    pub lease: String,
    /// This copy's name in the Lease (the pod name).
    pub identity: String,
    pub interval: Duration,
    /// How often a refused LksRollout start is tried again.
    pub retry_interval: Duration,
}

/// Runs until `cancel`: leads when it can, and reconciles while it leads.
pub async fn run(opts: Options, kube: kube::Client, cancel: CancellationToken) {
    let elector = Elector::new(kube.clone(), &opts.namespace, &opts.lease, &opts.identity);
    let admin = Arc::new(admin::Pool::new(opts.admin_conf.clone()));
    let mut leadership = Leadership::default();
    let mut session: Option<Session> = None;
    let mut tick = tokio::time::interval(RENEW.min(opts.interval));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        let leading = leadership.after(elector.lead_in_time().await, Instant::now());
        if leading == session.is_some() {
            continue;
        }
        tracing::info!(leading, identity = %opts.identity, "leadership changed");
        session = match session.take() {
            Some(s) => {
                s.stop().await;
                None
            }
            None => {
                let ctx = Ctx::new(
                    kube.clone(),
                    admin.clone(),
                    &opts.namespace,
                    opts.interval,
                    opts.retry_interval,
                );
                Some(Session::start(Arc::new(ctx)))
            }
        };
    }
    if let Some(s) = session {
        s.stop().await;
    }
}

/// Whether this copy leads, from its attempts to take or renew the Lease.
/// A failed attempt (kube0 not answering) keeps a leader leading while
/// its last renewal is recent enough that no other copy can have taken
/// the Lease over, so one slow answer does not restart the controllers.
#[derive(Default)]
struct Leadership {
    renewed: Option<Instant>,
}

impl Leadership {
    fn after(&mut self, attempt: Result<bool, LeaseError>, now: Instant) -> bool {
        match attempt {
            Ok(true) => self.renewed = Some(now),
            Ok(false) => self.renewed = None,
            Err(e) => {
                tracing::warn!(error = %e, "lease");
                if self
                    .renewed
                    .is_some_and(|t| now.duration_since(t) >= DURATION.saturating_sub(RENEW))
                {
                    self.renewed = None;
                }
            }
        }
        self.renewed.is_some()
    }
}

/// The controllers and the poll of one leadership.
struct Session {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Session {
    fn start(ctx: Arc<Ctx>) -> Self {
        let stop = CancellationToken::new();
        let task = tokio::spawn(lead(ctx, stop.clone()));
        Session { stop, task }
    }

    /// Stops the controllers, letting running reconciles finish (for as
    /// long as a Lease lasts).
    async fn stop(self) {
        self.stop.cancel();
        let abort = self.task.abort_handle();
        if tokio::time::timeout(DURATION, self.task).await.is_err() {
            tracing::warn!("reconciles did not finish; stopped");
            abort.abort();
        }
    }
}

/// How many objects of one kind are reconciled at once: enough to keep
/// up with thousands of `LksNode`s each poll, few enough that kube0 and the
/// server see a bounded number of requests from this copy.
pub const CONCURRENCY: u16 = 16;

/// A `Controller` of `K` that wakes on a change of an object's spec
/// (generation: a new object, a spec change, deletion begun) or
/// finalizers; status writes wake nothing.
fn controller<K>(api: Api<K>, config: watcher::Config, stop: &CancellationToken) -> Controller<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let changes = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            predicates::generation.combine(predicates::finalizers),
            Default::default(),
        );
    Controller::for_stream(changes, reader)
        .with_config(controller::Config::default().concurrency(CONCURRENCY))
        .graceful_shutdown_on(stop.clone().cancelled_owned())
}

/// Logs what a controller's stream reports besides reconciles (those log
/// themselves, through the error policy).
async fn outcome<K: kube::Resource>(
    r: Result<(ObjectRef<K>, Action), ControllerError<Error, watcher::Error>>,
) {
    match r {
        Ok(_) | Err(ControllerError::ReconcilerFailed(..)) => {}
        Err(ControllerError::ObjectNotFound(o)) => tracing::debug!(object = %o, "gone before its reconcile"),
        Err(e) => tracing::warn!(error = %e, "controller"),
    }
}

/// What one leadership runs, until `stop`.
async fn lead(ctx: Arc<Ctx>, stop: CancellationToken) {
    let kube = ctx.kube.clone();
    let mine = format!("{MANAGED_BY}={ME}");
    let not_mine = format!("{MANAGED_BY}!={ME}");
    let clusters = controller(
        Api::<LksCluster>::all(kube.clone()),
        watcher::Config::default(),
        &stop,
    )
    .run(clusters::reconcile, error_policy, ctx.clone())
    .for_each(outcome);
    // Declared LksRollouts: the mirrors of rollouts started outside Git are
    // the poll's.
    let rollouts = controller(
        Api::<LksRollout>::all(kube.clone()),
        watcher::Config::default().labels(&not_mine),
        &stop,
    )
    .reconcile_all_on(ctx.rollouts.polled())
    .run(rollouts::reconcile, error_policy, ctx.clone())
    .for_each(outcome);
    let plans = controller(
        Api::<LksPlan>::all(kube.clone()),
        watcher::Config::default(),
        &stop,
    )
    .run(plans::reconcile, error_policy, ctx.clone())
    .for_each(outcome);
    let nodes = controller(
        Api::<LksNode>::all(kube),
        watcher::Config::default().labels(&mine),
        &stop,
    )
    .reconcile_all_on(ctx.nodes.polled())
    .run(nodes::reconcile, error_policy, ctx.clone())
    .for_each(outcome);
    tokio::join!(
        poll::run(ctx.clone(), stop.clone()),
        clusters,
        rollouts,
        plans,
        nodes
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreachable() -> LeaseError {
        LeaseError::Timeout("lks-kube-controller".into())
    }

    #[test]
    fn a_leader_keeps_leading_through_a_failed_renewal_while_no_one_can_take_over() {
        let t0 = Instant::now();
        let mut l = Leadership::default();
        assert!(!l.after(Err(unreachable()), t0), "never led");
        assert!(l.after(Ok(true), t0));
        assert!(l.after(Err(unreachable()), t0 + RENEW), "one failed renewal");
        assert!(
            !l.after(Err(unreachable()), t0 + DURATION - RENEW),
            "stops before another copy may take the Lease"
        );
        assert!(l.after(Ok(true), t0 + DURATION));
        assert!(
            !l.after(Ok(false), t0 + DURATION + RENEW),
            "the Lease is another's"
        );
    }
}
