//! Admission control for the agent/admin port: how many TLS handshakes run
//! at once, and how many `Connect` streams are being opened at once.
//!
//! Both are a FIFO semaphore (tokio's is fair: first come, first served).
//! A TLS handshake that waited for its turn longer than a client would
//! wait is not started at all: the client has likely given up, and the CPU
//! goes to those still waiting. A stream open that finds no room within a
//! short wait is refused with `unavailable` and a retry hint, so a
//! reconnecting fleet is spread out instead of timing out.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// TLS handshakes in progress per core when `--max-tls-handshakes` is
/// not given.
pub const HANDSHAKES_PER_CORE: usize = 64;
/// How long one admitted handshake may take (a slow or silent client is
/// cut off after this).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an accepted connection may wait for a handshake slot: well
/// under the agent's 20 s connect timeout, so a connection that gets its
/// turn still has a client waiting for it.
pub const HANDSHAKE_QUEUE_TIMEOUT: Duration = Duration::from_secs(10);

/// `--max-tls-handshakes` when not given: [`HANDSHAKES_PER_CORE`] per
/// core. A handshake is a few milliseconds of CPU but two round trips of
/// waiting, so a core keeps many in flight.
pub fn default_max_handshakes() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    HANDSHAKES_PER_CORE * cores
}

/// How a connection's turn at the TLS handshake ended.
#[derive(Debug)]
pub enum Admitted<T, E> {
    /// Handshaken; the permit is held until the connection is handed on.
    Done(T, OwnedSemaphorePermit),
    /// Waited longer than [`HandshakeLimits::queue_timeout`]: closed
    /// without a handshake.
    Shed,
    /// Admitted, but the handshake took longer than
    /// [`HandshakeLimits::handshake_timeout`].
    TimedOut,
    /// The handshake failed (a bad client certificate, a non-TLS client…).
    Failed(E),
}

impl<T, E> Admitted<T, E> {
    /// The `result` label of `lks_tls_handshakes_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Admitted::Done(..) => "ok",
            Admitted::Shed => "shed",
            Admitted::TimedOut => "timeout",
            Admitted::Failed(_) => "failed",
        }
    }
}

/// The bound on TLS handshakes in progress.
#[derive(Clone, Copy, Debug)]
pub struct HandshakeLimits {
    pub max_in_progress: usize,
    pub handshake_timeout: Duration,
    pub queue_timeout: Duration,
}

impl Default for HandshakeLimits {
    fn default() -> Self {
        HandshakeLimits {
            max_in_progress: default_max_handshakes(),
            handshake_timeout: HANDSHAKE_TIMEOUT,
            queue_timeout: HANDSHAKE_QUEUE_TIMEOUT,
        }
    }
}

/// Hands out handshake slots in arrival order.
#[derive(Clone)]
pub struct Handshakes {
    slots: Arc<Semaphore>,
    limits: HandshakeLimits,
}

impl Handshakes {
    pub fn new(limits: HandshakeLimits) -> Self {
        Handshakes {
            slots: Arc::new(Semaphore::new(limits.max_in_progress.max(1))),
            limits,
        }
    }

    /// Handshakes running now (or handshaken and being handed on).
    pub fn in_progress(&self) -> usize {
        self.in_progress_bound() - self.slots.available_permits()
    }

    /// The most that run at once.
    pub fn in_progress_bound(&self) -> usize {
        self.limits.max_in_progress.max(1)
    }

    /// Waits for a slot (until `queue_timeout` after `accepted_at`), then
    /// runs `handshake` for at most `handshake_timeout`. `queued` is
    /// called when the connection starts and stops waiting (for the gauge).
    pub async fn admit<F, T, E>(
        &self,
        accepted_at: Instant,
        handshake: F,
        queued: impl Fn(bool),
    ) -> Admitted<T, E>
    where
        F: Future<Output = Result<T, E>>,
    {
        let deadline = accepted_at + self.limits.queue_timeout;
        queued(true);
        let permit = tokio::time::timeout_at(deadline, self.slots.clone().acquire_owned()).await;
        queued(false);
        let permit = match permit {
            // A free slot is taken even past the deadline (timeout_at
            // tries first); the deadline still holds.
            Ok(Ok(p)) if Instant::now() < deadline => p,
            // Timed out; or closed, which this semaphore never is.
            _ => return Admitted::Shed,
        };
        match tokio::time::timeout(self.limits.handshake_timeout, handshake).await {
            Ok(Ok(t)) => Admitted::Done(t, permit),
            Ok(Err(e)) => Admitted::Failed(e),
            Err(_) => Admitted::TimedOut,
        }
    }
}

/// How many `Connect` streams may be between the call and their first
/// desired state (the store reads and writes of a stream's opening).
pub const MAX_STREAMS_OPENING: usize = 256;
/// How long a `Connect` waits for room before it is refused. Long: the
/// caller has paid for its TLS handshake, and a refusal makes it pay again
/// after the hint (a first bench with 2 s refused almost every agent of a
/// 10,000-agent storm once). A refusal is for a store that does not keep
/// up, not for a crowd that is merely queueing.
pub const STREAM_OPEN_WAIT: Duration = Duration::from_secs(10);
/// The retry hint a refused `Connect` carries; the client adds up to 20 %
/// jitter, so a refused crowd does not come back at once.
pub const STREAM_OPEN_RETRY: Duration = Duration::from_secs(3);

/// Room for streams being opened.
pub struct OpenGate {
    slots: Arc<Semaphore>,
    max: usize,
    wait: Duration,
}

impl OpenGate {
    pub fn new(max: usize, wait: Duration) -> Self {
        OpenGate {
            slots: Arc::new(Semaphore::new(max.max(1))),
            max: max.max(1),
            wait,
        }
    }

    /// A slot, waiting at most the gate's wait; `None`: over capacity.
    pub async fn enter(&self) -> Option<OwnedSemaphorePermit> {
        match tokio::time::timeout(self.wait, self.slots.clone().acquire_owned()).await {
            Ok(Ok(p)) => Some(p),
            _ => None,
        }
    }

    /// Streams being opened now.
    pub fn opening(&self) -> usize {
        self.max - self.slots.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn limits(max: usize) -> HandshakeLimits {
        HandshakeLimits {
            max_in_progress: max,
            handshake_timeout: Duration::from_secs(10),
            queue_timeout: Duration::from_secs(5),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_the_bound_run_at_once_and_in_arrival_order() {
        let h = Handshakes::new(limits(3));
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..12 {
            let (h, running, peak, order) = (h.clone(), running.clone(), peak.clone(), order.clone());
            let accepted = Instant::now();
            tasks.push(tokio::spawn(async move {
                let hs = async {
                    order.lock().unwrap().push(i);
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, ()>(i)
                };
                match h.admit(accepted, hs, |_| {}).await {
                    Admitted::Done(v, permit) => {
                        drop(permit);
                        v
                    }
                    other => panic!("{i}: {}", other.label()),
                }
            }));
            // Each arrives a little after the one before.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(peak.load(Ordering::SeqCst), 3, "the bound was reached and held");
        assert_eq!(
            *order.lock().unwrap(),
            (0..12).collect::<Vec<_>>(),
            "first come, first served"
        );
        assert_eq!(h.in_progress(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_waited_too_long_is_shed_without_a_handshake() {
        let h = Handshakes::new(limits(1));
        // A silent client holds the only slot until the handshake timeout.
        let silent = {
            let h = h.clone();
            tokio::spawn(async move {
                h.admit(Instant::now(), std::future::pending::<Result<(), ()>>(), |_| {})
                    .await
                    .label()
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(h.in_progress(), 1);
        let started = Arc::new(AtomicUsize::new(0));
        let queued = Arc::new(AtomicUsize::new(0));
        let waiting = {
            let (h, started, queued) = (h.clone(), started.clone(), queued.clone());
            tokio::spawn(async move {
                let t0 = Instant::now();
                let r = h
                    .admit(
                        t0,
                        async {
                            started.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, ()>(())
                        },
                        |q| {
                            if q {
                                queued.fetch_add(1, Ordering::SeqCst);
                            } else {
                                queued.fetch_sub(1, Ordering::SeqCst);
                            }
                        },
                    )
                    .await;
                (r.label(), t0.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(queued.load(Ordering::SeqCst), 1, "waiting in the queue");
        let (label, after) = waiting.await.unwrap();
        assert_eq!(label, "shed");
        assert_eq!(after, Duration::from_secs(5), "shed at the queue timeout");
        assert_eq!(started.load(Ordering::SeqCst), 0, "no handshake was started");
        assert_eq!(queued.load(Ordering::SeqCst), 0);
        assert_eq!(silent.await.unwrap(), "timeout", "the silent client is cut off");
        assert_eq!(h.in_progress(), 0, "its slot is given back");
    }

    #[tokio::test(start_paused = true)]
    async fn the_queue_wait_counts_from_the_accept_and_failures_free_the_slot() {
        let h = Handshakes::new(limits(1));
        // Accepted 6 s ago (say, while the accept loop was starved): its
        // turn has passed even though a slot is free.
        let accepted = Instant::now();
        tokio::time::sleep(Duration::from_secs(6)).await;
        let r = h.admit(accepted, async { Ok::<_, ()>(()) }, |_| {}).await;
        assert_eq!(r.label(), "shed");
        let r = h
            .admit(Instant::now(), async { Err::<(), _>("bad certificate") }, |_| {})
            .await;
        assert!(matches!(r, Admitted::Failed("bad certificate")));
        assert_eq!(h.in_progress(), 0);
        let r = h.admit(Instant::now(), async { Ok::<_, ()>(7) }, |_| {}).await;
        let Admitted::Done(7, permit) = r else {
            panic!("admitted")
        };
        assert_eq!(h.in_progress(), 1, "held until handed on");
        drop(permit);
        assert_eq!(h.in_progress(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_open_gate_waits_briefly_then_refuses() {
        let g = OpenGate::new(2, Duration::from_secs(2));
        let a = g.enter().await.expect("room");
        let _b = g.enter().await.expect("room");
        assert_eq!(g.opening(), 2);
        let t0 = Instant::now();
        assert!(g.enter().await.is_none(), "full: refused");
        assert_eq!(t0.elapsed(), Duration::from_secs(2), "after the wait");
        let later = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            drop(a);
        });
        assert!(g.enter().await.is_some(), "a slot freed within the wait");
        later.await.unwrap();
    }
}
