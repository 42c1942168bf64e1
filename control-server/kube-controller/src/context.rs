//! What the reconcilers share while this copy leads (kube-rs' controller
//! context, [`Ctx`]): the kube0 client, the one admin connection
//! ([`admin::Pool`]), the server's nodes and rollouts as the last poll
//! read them ([`Latest`]), what this copy changed on the server since,
//! the refused starts waiting for their retry ([`Attempts`]); and how a reconcile ends: its [`Error`], and the error
//! policy ([`error_policy`]) that requeues a failed object with a backoff
//! of its own while the others go on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::Stream;
use kube::runtime::controller::Action;
use kube::runtime::finalizer;
use kube::runtime::reflector::ObjectRef;
use lks_proto::backoff::Backoff;
use lks_proto::pb;
use lks_proto::report::one_line;
use tokio::sync::watch;

use crate::admin::{self, CallError};

/// How a reconcile failed. The object's status says what a user must
/// know (a refused spec is not an error: it is `Ready=False` and the
/// reconcile succeeds); an error is what kept the controller from getting
/// that far, and the object is tried again.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {}", kube_line(.source))]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{what}: {source}")]
    Admin {
        what: String,
        #[source]
        source: CallError,
    },
    /// The server's nodes have not been read since this copy leads.
    #[error("the server's nodes are not read yet")]
    NotRead,
    /// Not a failure: the object waits (its status says for what) and is
    /// looked at again every interval.
    #[error("{0}")]
    Waiting(String),
    #[error(transparent)]
    Finalizer(Box<finalizer::Error<Error>>),
}

/// A kube error as one line: the API server's message and code, without
/// kube-rs' dump of the whole Status.
fn kube_line(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({} {})", s.message, s.code, s.reason),
        e => one_line(e),
    }
}

impl Error {
    pub fn kube(what: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            what: what.into(),
            source,
        }
    }

    pub fn admin(what: impl Into<String>, source: CallError) -> Self {
        Error::Admin {
            what: what.into(),
            source,
        }
    }

    /// Whether the object is waiting rather than failing: tried again at
    /// the interval, without a backoff or a warning.
    pub fn waiting(&self) -> bool {
        match self {
            Error::NotRead | Error::Waiting(_) => true,
            Error::Finalizer(f) => match f.as_ref() {
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.waiting(),
                _ => false,
            },
            Error::Kube { .. } | Error::Admin { .. } => false,
        }
    }
}

impl From<finalizer::Error<Error>> for Error {
    fn from(e: finalizer::Error<Error>) -> Self {
        Error::Finalizer(Box::new(e))
    }
}

/// What a poll read from the server, by key (an `LksNode`'s name, a
/// rollout's ID), and when that read began.
pub struct Read<T> {
    pub items: HashMap<String, T>,
    pub at: Instant,
}

/// The latest [`Read`] of one kind of server state, and a tick for each
/// new one.
pub struct Latest<T>(watch::Sender<Option<Arc<Read<T>>>>);

impl<T: Send + Sync + 'static> Latest<T> {
    fn new() -> Self {
        Latest(watch::Sender::new(None))
    }

    /// What a poll that began `at` read; wakes every subscriber.
    pub fn publish(&self, items: HashMap<String, T>, at: Instant) -> Arc<Read<T>> {
        let read = Arc::new(Read { items, at });
        self.0.send_replace(Some(read.clone()));
        read
    }

    /// The latest read; waits up to `wait` for the first.
    pub async fn get(&self, wait: Duration) -> Result<Arc<Read<T>>, Error> {
        let mut rx = self.0.subscribe();
        match tokio::time::timeout(wait, rx.wait_for(Option::is_some)).await {
            Ok(Ok(r)) => r.clone().ok_or(Error::NotRead),
            _ => Err(Error::NotRead),
        }
    }

    /// A tick for each read published from now on.
    pub fn polled(&self) -> impl Stream<Item = ()> + Send + 'static {
        futures::stream::unfold(self.0.subscribe(), |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        })
    }
}

/// Refused starts: when each object (by UID) was last tried, and at which
/// generation; one is tried again after `retry`, or at once when its spec
/// changed.
pub struct Attempts {
    retry: Duration,
    tried: HashMap<String, (Instant, i64)>,
}

impl Attempts {
    pub fn new(retry: Duration) -> Self {
        Attempts {
            retry,
            tried: HashMap::new(),
        }
    }

    pub fn due(&self, uid: &str, generation: i64) -> bool {
        self.tried
            .get(uid)
            .is_none_or(|(at, g)| *g != generation || at.elapsed() >= self.retry)
    }

    pub fn tried(&mut self, uid: &str, generation: i64) {
        self.tried.insert(uid.to_string(), (Instant::now(), generation));
    }

    pub fn forget(&mut self, uid: &str) {
        self.tried.remove(uid);
    }
}

/// Each failing object's own backoff (1 s, ×1.6 per failure, jittered,
/// up to the cap); a success forgets it.
pub struct Backoffs {
    max: Duration,
    by_object: Mutex<HashMap<String, Backoff>>,
}

impl Backoffs {
    pub fn new(max: Duration) -> Self {
        Backoffs {
            max,
            by_object: Mutex::new(HashMap::new()),
        }
    }

    /// How long `key` waits after one more failure.
    pub fn failed(&self, key: &str) -> Duration {
        let initial = Duration::from_secs(1).min(self.max);
        self.by_object
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.to_string())
            .or_insert_with(|| Backoff::new(initial, self.max))
            .next_delay()
    }

    pub fn succeeded(&self, key: &str) {
        self.by_object
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }
}

/// What the reconcilers of one leadership share.
pub struct Ctx {
    pub kube: kube::Client,
    pub admin: Arc<admin::Pool>,
    /// The controller's namespace: where mirrors of rollouts started
    /// outside Git are made.
    pub namespace: String,
    /// How often the server is read, and each object looked at again.
    pub interval: Duration,
    /// How often a refused start is tried again; the longest a failed
    /// object waits.
    pub retry: Duration,
    /// The server's nodes, by the name of their `LksNode`.
    pub nodes: Latest<pb::Node>,
    /// The server's rollouts, by ID.
    pub rollouts: Latest<pb::Rollout>,
    attempts: Mutex<Attempts>,
    /// When this copy last changed a server object (`node/NAME`,
    /// `rollout/ID`): a read that began before is stale for it.
    acted: Mutex<HashMap<String, Instant>>,
    backoffs: Backoffs,
}

impl Ctx {
    pub fn new(
        kube: kube::Client,
        admin: Arc<admin::Pool>,
        namespace: &str,
        interval: Duration,
        retry: Duration,
    ) -> Self {
        Ctx {
            kube,
            admin,
            namespace: namespace.to_string(),
            interval,
            retry,
            nodes: Latest::new(),
            rollouts: Latest::new(),
            attempts: Mutex::new(Attempts::new(retry)),
            acted: Mutex::new(HashMap::new()),
            backoffs: Backoffs::new(retry.max(Duration::from_secs(1))),
        }
    }

    pub fn attempts(&self) -> std::sync::MutexGuard<'_, Attempts> {
        self.attempts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that this copy changed the server object `key` just now.
    pub fn acted(&self, key: &str) {
        self.acted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.to_string(), Instant::now());
    }

    /// Whether a read that began `at` shows `key` as it is: this copy has
    /// not changed it since.
    pub fn current(&self, key: &str, at: Instant) -> bool {
        let mut acted = self.acted.lock().unwrap_or_else(PoisonError::into_inner);
        match acted.get(key) {
            Some(t) if *t >= at => false,
            Some(_) => {
                acted.remove(key);
                true
            }
            None => true,
        }
    }

    /// Ends a reconcile of `obj`: a success forgets its backoff.
    pub fn done<K>(&self, obj: &K, r: Result<Action, Error>) -> Result<Action, Error>
    where
        K: kube::Resource<DynamicType = ()>,
    {
        if r.is_ok() {
            self.backoffs.succeeded(&ObjectRef::from_obj(obj).to_string());
        }
        r
    }
}

/// The error policy of every controller: a waiting object is looked at
/// again at the interval; a failed one is logged and tried again after
/// its own backoff, while the others go on.
pub fn error_policy<K>(obj: Arc<K>, e: &Error, ctx: Arc<Ctx>) -> Action
where
    K: kube::Resource<DynamicType = ()>,
{
    let key = ObjectRef::from_obj(obj.as_ref()).to_string();
    if e.waiting() {
        tracing::debug!(object = %key, reason = %e, "waiting");
        return Action::requeue(ctx.interval);
    }
    let delay = ctx.backoffs.failed(&key);
    tracing::warn!(object = %key, error = %e, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_start_is_retried_later_or_when_the_spec_changes() {
        let retry = Duration::from_secs(30);
        let mut a = Attempts::new(retry);
        assert!(a.due("u", 1));
        a.tried("u", 1);
        assert!(!a.due("u", 1));
        assert!(a.due("u", 2));
        a.tried.insert("u".into(), (Instant::now() - retry, 1));
        assert!(a.due("u", 1));
        a.forget("u");
        assert!(a.tried.is_empty());
    }

    #[test]
    fn each_object_backs_off_on_its_own_up_to_the_cap_and_a_success_resets_it() {
        let b = Backoffs::new(Duration::from_secs(4));
        let first = b.failed("a");
        assert!(first <= Duration::from_millis(1200), "{first:?}");
        let mut last = first;
        for _ in 0..10 {
            last = b.failed("a");
        }
        assert!(
            last >= Duration::from_millis(3200) && last <= Duration::from_millis(4800),
            "{last:?}"
        );
        assert!(
            b.failed("b") <= Duration::from_millis(1200),
            "another object starts afresh"
        );
        b.succeeded("a");
        assert!(b.failed("a") <= Duration::from_millis(1200));
    }

    #[test]
    fn waiting_is_told_apart_from_failing_through_the_finalizer() {
        let w = Error::from(finalizer::Error::CleanupFailed(Error::Waiting("nodes".into())));
        assert!(w.waiting());
        assert_eq!(w.to_string(), "failed to clean up object: nodes");
        let f = Error::from(finalizer::Error::ApplyFailed(Error::admin(
            "list clusters",
            CallError::Status(tonic::Status::unavailable("down")),
        )));
        assert!(!f.waiting());
        assert!(Error::NotRead.waiting());
        let refused =
            kube::core::Status::failure("lksclusters \"b\" is forbidden: no", "Invalid").with_code(422);
        let e = Error::kube("write LksCluster b status", kube::Error::Api(Box::new(refused)));
        assert_eq!(
            e.to_string(),
            "write LksCluster b status: lksclusters \"b\" is forbidden: no (422 Invalid)"
        );
    }

    #[tokio::test]
    async fn a_read_is_waited_for_and_stale_for_what_was_changed_since() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kube = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let ctx = Ctx::new(
            kube,
            Arc::new(admin::Pool::new("/nonexistent".into())),
            "lksadmin",
            Duration::from_millis(50),
            Duration::from_secs(2),
        );
        assert!(matches!(ctx.nodes.get(ctx.interval).await, Err(Error::NotRead)));
        let mut polled = Box::pin(ctx.nodes.polled());
        let before = Instant::now();
        ctx.acted("node/w1");
        let n = pb::Node {
            name: "w1".into(),
            ..Default::default()
        };
        ctx.nodes.publish(HashMap::from([("w1".to_string(), n)]), before);
        use futures::StreamExt as _;
        assert_eq!(polled.next().await, Some(()));
        let read = ctx.nodes.get(ctx.interval).await.unwrap();
        assert_eq!(read.items["w1"].name, "w1");
        assert!(!ctx.current("node/w1", read.at), "changed after the read began");
        assert!(ctx.current("node/w2", read.at));
        assert!(
            ctx.current("node/w1", Instant::now()),
            "a read begun after the change"
        );
        assert!(
            ctx.acted.lock().unwrap().is_empty(),
            "forgotten once a read covers it"
        );
    }
}
