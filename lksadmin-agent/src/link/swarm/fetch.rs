//! One fetch in pieces, as a loop: ask the tracker, start pieces from peers
//! and the server, then take in whichever comes first — a piece, news from
//! a watched peer, or the time for the next step. [`Fetch`] is what the
//! loop knows between rounds.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, OptionFuture};
use futures::stream::{FuturesUnordered, SelectAll};
use futures::{FutureExt, StreamExt};
use lks_proto::{Digest, FileSpec};

use super::plan::{Have, PeerState, Plan, ServerUse, ServerWindow, ask_interval, start_pieces};
use super::{
    Answer, AskError, BLIND_RETRY, BUSY_BACKOFF, MAX_FAILURES, News, NewsStream, PieceError, PieceJob, STALL,
    STARVED, Source, Swarm, lock,
};
use crate::apply::source::SwarmError;
use crate::link::peer::{BlobInfo, Partial};

/// What one fetch knows between rounds of its loop.
struct Fetch<'p> {
    digest: Digest,
    pieces: &'p [(u64, u64)],
    partial: &'p Partial,
    /// The pieces file, written at each piece's offset by the piece's own
    /// fetch.
    out: Arc<std::fs::File>,
    /// Where this node starts going through the pieces.
    start: usize,
    peers: Vec<PeerState>,
    server_ok: bool,
    last_ask: Option<Instant>,
    /// The last answer named a peer this fetch did not know.
    grew: bool,
    /// The last verified piece of this node's own, and the last piece a
    /// watched peer gained: while the swarm moves, waiting is right.
    last_progress: Instant,
    last_swarm: Instant,
    tried: HashMap<usize, HashSet<String>>,
    in_flight: HashSet<usize>,
    server_in_flight: usize,
    server_window: ServerWindow,
    from_server: u64,
    from_peers: u64,
}

impl Swarm {
    pub(super) async fn fetch_pieces(
        &self,
        file: &FileSpec,
        info: &BlobInfo,
        pieces: &[(u64, u64)],
        partial: &Partial,
    ) -> Result<(u64, u64), SwarmError> {
        let mut f = Fetch::open(file, pieces, partial)?;
        let digest = f.digest;
        let mut running = FuturesUnordered::new();
        let mut news: SelectAll<NewsStream<'_>> = SelectAll::new();
        // The tracker's answer is awaited beside the pieces, not before
        // them: a slow answer (replicas reading etcd on a busy machine)
        // holds up no piece.
        let mut asking: Option<BoxFuture<'_, Answer>> = None;
        loop {
            let missing = f.missing();
            if missing.is_empty() && running.is_empty() {
                break;
            }
            let ask_every = f.ask_every();
            if asking.is_none() && f.last_ask.is_none_or(|t| t.elapsed() >= ask_every) {
                asking = Some(self.ask(digest).boxed());
                f.last_ask = Some(Instant::now());
            }
            let now = Instant::now();
            let stalled = f.stalled(now);
            let running_now = running.len();
            let out = f.out.clone();
            f.start_pieces(&missing, stalled, now, running_now, &mut |source, i| {
                let (offset, len) = pieces[i];
                let job = PieceJob {
                    digest,
                    i,
                    offset,
                    len,
                    want: info.piece_digest(i, &digest),
                };
                running.push(self.piece(source, job, out.clone()));
            });
            let wake = f.wake(now, ask_every, stalled, running.is_empty());
            tokio::select! {
                Some(answer) = OptionFuture::from(asking.as_mut()), if asking.is_some() => {
                    asking = None;
                    self.take_answer(&mut f, &mut news, answer)?;
                }
                Some((source, i, got, took)) = running.next(), if !running.is_empty() => {
                    self.piece_done(&mut f, source, i, got, took)?;
                }
                Some((node, n)) = news.next(), if !news.is_empty() => f.news(&node, n),
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
        f.finish()
    }

    /// Takes in the tracker's answer (who holds the blob), and watches
    /// what each peer holds: new ones, and those whose watch ended before
    /// they held the blob whole.
    fn take_answer<'s>(
        &'s self,
        f: &mut Fetch<'_>,
        news: &mut SelectAll<NewsStream<'s>>,
        answer: Answer,
    ) -> Result<(), SwarmError> {
        match answer {
            Ok((found, server)) => {
                f.server_ok = server;
                f.grew = false;
                for p in found {
                    if !f.peers.iter().any(|s| s.node == p.node) {
                        f.peers.push(PeerState::new(p));
                        f.grew = true;
                    }
                }
            }
            Err(AskError::Unsupported(why)) => {
                if f.from_peers == 0 && f.from_server == 0 {
                    return Err(SwarmError::Unsupported(why));
                }
                f.server_ok = true;
            }
            Err(AskError::Failed(why)) => {
                tracing::debug!("peer sharing: ask the tracker: {why}");
            }
        }
        for p in f.peers.iter_mut().filter(|p| !p.dropped && !p.watching) {
            if matches!(p.have, Have::Unknown) || matches!(&p.have, Have::Known(h) if !h.whole) {
                p.watching = true;
                news.push(self.watch(p.node.clone(), p.address, f.digest));
            }
        }
        f.tried.clear();
        f.last_ask = Some(Instant::now());
        Ok(())
    }

    /// Takes in one piece that finished, from the server or a peer.
    fn piece_done(
        &self,
        f: &mut Fetch<'_>,
        source: Source,
        i: usize,
        got: Result<u64, PieceError>,
        took: Duration,
    ) -> Result<(), SwarmError> {
        f.in_flight.remove(&i);
        let peer = match &source {
            Source::Server => {
                f.server_in_flight -= 1;
                if got.is_ok() {
                    f.server_window.arrived(took);
                    tracing::debug!(
                        piece = i,
                        ms = took.as_millis() as u64,
                        window = f.server_window.size,
                        "peer sharing: a piece from the server"
                    );
                }
                None
            }
            Source::Peer(node, _) => f.peers.iter().position(|p| &p.node == node),
        };
        match got {
            Ok(n) => {
                self.piece_arrived(f, peer, i, n);
                Ok(())
            }
            Err(e) => self.piece_refused(f, peer, i, e),
        }
    }

    /// A verified piece (written at its offset by its fetch): served from
    /// now on, counted.
    fn piece_arrived(&self, f: &mut Fetch<'_>, peer: Option<usize>, i: usize, n: u64) {
        self.shared.verified(f.partial, i);
        // Its disk write starts now, beside the transfer: the fsync at the
        // end then has little left (node::disk).
        let (out, (offset, len)) = (f.out.clone(), f.pieces[i]);
        tokio::task::spawn_blocking(move || {
            if let Err(e) = crate::node::disk::start_writeback(&out, offset, len) {
                tracing::debug!(
                    piece = i,
                    "peer sharing: cannot start writing the piece back: {e}"
                );
            }
        });
        f.last_progress = Instant::now();
        match peer {
            Some(k) => {
                let p = &mut f.peers[k];
                p.in_flight -= 1;
                p.failures = 0;
                p.gave();
                f.from_peers += n;
                self.stats.from_peers.fetch_add(n, Ordering::Relaxed);
            }
            None => {
                f.from_server += n;
                self.stats.from_server.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// A piece that did not come: the source waits, is tried no more for
    /// it, or is dropped; from the server, the fetch may end here.
    fn piece_refused(
        &self,
        f: &mut Fetch<'_>,
        peer: Option<usize>,
        i: usize,
        e: PieceError,
    ) -> Result<(), SwarmError> {
        match (e, peer) {
            (PieceError::Write(e), _) => {
                return Err(SwarmError::Unavailable(format!(
                    "write {}: {e}",
                    f.partial.path.display()
                )));
            }
            (PieceError::Busy(why), Some(k)) => {
                let p = &mut f.peers[k];
                tracing::debug!(peer = %p.node, piece = i, "peer sharing: peer busy: {why}");
                p.in_flight -= 1;
                p.said_busy(Instant::now());
            }
            (PieceError::NotYet(why), Some(k)) => {
                let p = &mut f.peers[k];
                tracing::debug!(peer = %p.node, piece = i, "peer sharing: not from this peer now: {why}");
                p.in_flight -= 1;
                if p.have.has(i) {
                    // It said it holds the piece: it is between its
                    // download and its cache (a moment), not without it.
                    // Again soon.
                    p.busy_until = Some(Instant::now() + BUSY_BACKOFF);
                } else {
                    f.tried.entry(i).or_default().insert(p.node.clone());
                }
            }
            (PieceError::Busy(_) | PieceError::NotYet(_), None) => {}
            (PieceError::Failed(why), Some(k)) => {
                let p = &mut f.peers[k];
                p.in_flight -= 1;
                p.failures += 1;
                f.tried.entry(i).or_default().insert(p.node.clone());
                if p.failures >= MAX_FAILURES {
                    p.dropped = true;
                    tracing::info!(peer = %p.node, "peer sharing: peer dropped for this fetch: {why}");
                }
            }
            (PieceError::Failed(why), None) => {
                if f.peers.iter().all(|p| p.dropped) {
                    return Err(SwarmError::Unavailable(why));
                }
            }
            (PieceError::Bad(_, _), Some(k)) if f.peers[k].dropped => {
                // A second piece in flight from a peer already dropped and
                // reported.
                f.peers[k].in_flight -= 1;
            }
            (PieceError::Bad(_, got), Some(k)) => {
                let p = &mut f.peers[k];
                p.in_flight -= 1;
                p.dropped = true;
                self.report_bad_peer(&p.node, &f.digest, i, &got);
            }
            (PieceError::Bad(expected, got), None) => {
                let _ = std::fs::remove_file(&f.partial.path);
                return Err(SwarmError::Corrupt(
                    lks_proto::digest::VerifyError::DigestMismatch { expected, got },
                ));
            }
        }
        Ok(())
    }
}

impl<'p> Fetch<'p> {
    /// Opens (or resumes) the pieces file at its full size.
    fn open(file: &FileSpec, pieces: &'p [(u64, u64)], partial: &'p Partial) -> Result<Self, SwarmError> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .mode(0o600)
            .open(&partial.path)
            .map_err(|e| SwarmError::Unavailable(format!("open {}: {e}", partial.path.display())))?;
        out.set_len(file.size)
            .map_err(|e| SwarmError::Unavailable(format!("size {}: {e}", partial.path.display())))?;
        // Each node goes through the pieces from its own random start: two
        // nodes fetching from the server fetch different halves first and
        // then take the rest from each other, and among equally rare pieces
        // the nodes after them ask for different ones at once.
        let start = {
            let mut b = [0u8; 8];
            let _ = getrandom::getrandom(&mut b);
            (u64::from_le_bytes(b) % pieces.len().max(1) as u64) as usize
        };
        Ok(Fetch {
            digest: file.digest,
            pieces,
            partial,
            out: Arc::new(out),
            start,
            peers: Vec::new(),
            server_ok: false,
            last_ask: None,
            grew: false,
            last_progress: Instant::now(),
            last_swarm: Instant::now(),
            tried: HashMap::new(),
            in_flight: HashSet::new(),
            server_in_flight: 0,
            server_window: ServerWindow::new(),
            from_server: 0,
            from_peers: 0,
        })
    }

    /// The pieces not held yet, in this node's own order.
    fn missing(&self) -> Vec<usize> {
        let n = self.pieces.len();
        let have = lock(&self.partial.have);
        (0..n)
            .map(|k| (k + self.start) % n.max(1))
            .filter(|i| !have[*i])
            .collect()
    }

    /// When to ask the tracker again ([`ask_interval`]).
    fn ask_every(&self) -> Duration {
        let live = self.peers.iter().filter(|p| !p.dropped).count();
        ask_interval(live, self.server_ok, self.grew)
    }

    /// Every peer named was dropped (one that does not serve the blob at
    /// all, e.g. an agent that restarted since it fetched a patch and
    /// forgot it): nothing to wait for. Or nothing moved for too long.
    fn stalled(&self, now: Instant) -> bool {
        let orphaned = !self.peers.is_empty() && self.peers.iter().all(|p| p.dropped);
        orphaned
            || (self.last_progress.max(self.last_swarm) + STALL <= now)
            || self.last_progress + STARVED <= now
    }

    /// Starts the pieces there is room for, from peers and, as allowed,
    /// the server.
    fn start_pieces(
        &mut self,
        missing: &[usize],
        stalled: bool,
        now: Instant,
        running: usize,
        start: &mut dyn FnMut(Source, usize),
    ) {
        let server = if stalled {
            ServerUse::Any
        } else if self.server_ok {
            ServerUse::Unheld
        } else {
            ServerUse::No
        };
        start_pieces(
            &mut Plan {
                missing,
                in_flight: &mut self.in_flight,
                tried: &mut self.tried,
                peers: &mut self.peers,
                server,
                server_in_flight: &mut self.server_in_flight,
                server_window: self.server_window.size,
                now,
            },
            start,
            running,
        );
    }

    /// When to look again without a piece or news: the next ask, the
    /// stall, a busy peer's wait, or a blind peer's retry.
    fn wake(&self, now: Instant, ask_every: Duration, stalled: bool, idle: bool) -> tokio::time::Instant {
        let mut wake = self.last_ask.unwrap_or(now) + ask_every;
        if !stalled {
            wake = wake
                .min(self.last_progress.max(self.last_swarm) + STALL)
                .min(self.last_progress + STARVED);
        }
        for p in self.peers.iter().filter(|p| !p.dropped) {
            if let Some(b) = p.busy_until {
                wake = wake.min(b);
            }
            if idle && matches!(p.have, Have::Blind) {
                // An older peer says nothing by itself: ask it again soon.
                wake = wake.min(now + BLIND_RETRY);
            }
        }
        tokio::time::Instant::from_std(wake.max(now + Duration::from_millis(10)))
    }

    /// News from a watched peer: what it holds now, or why its watch ended.
    fn news(&mut self, node: &str, n: News) {
        let Some(p) = self.peers.iter_mut().find(|p| p.node == node) else {
            return;
        };
        match n {
            News::Held(h) => {
                let before = p.have.count(self.pieces.len());
                p.have = Have::Known(h);
                if p.have.count(self.pieces.len()) > before {
                    self.last_swarm = Instant::now();
                }
            }
            News::Unsupported => {
                p.watching = false;
                p.have = Have::Blind;
            }
            News::NotServed(why) => {
                p.watching = false;
                p.dropped = true;
                tracing::debug!(peer = %p.node, "peer sharing: peer dropped for this fetch: {why}");
            }
            News::Ended(why) => {
                p.watching = false;
                if let Some(why) = why {
                    tracing::debug!(peer = %p.node, "peer sharing: piece watch ended: {why}");
                }
            }
        }
    }

    /// Every piece in: the pieces file made durable; where the bytes came
    /// from.
    fn finish(self) -> Result<(u64, u64), SwarmError> {
        self.out
            .sync_all()
            .map_err(|e| SwarmError::Unavailable(format!("fsync {}: {e}", self.partial.path.display())))?;
        Ok((self.from_server, self.from_peers))
    }
}
