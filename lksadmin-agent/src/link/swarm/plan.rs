//! Which piece to ask for next, and from whom: what this node knows of
//! each peer (what it said it holds, how busy it is) and the choice itself
//! ([`start_pieces`]), kept apart from the I/O of [`super::Swarm::fetch`]
//! so it can be tested on its own.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use lks_proto::pb;

use super::{
    ASK_EVERY, ASK_FEW, ASK_SOON, BUSY_BACKOFF, FEW_PEERS, MAX_BUSY_BACKOFF, PER_PEER, SERVER_WINDOW, Source,
    WINDOW,
};

/// Most pieces in flight from the server at once (4 MiB pieces: 24 MiB
/// of buffers at most, beside [`WINDOW`]'s from peers).
pub(super) const MAX_SERVER_WINDOW: usize = 6;
/// The time one server piece should take: a piece that arrives in under
/// half of it means the link has room for one more in flight; one that
/// takes over twice as long, one fewer.
const PIECE_TARGET: Duration = Duration::from_millis(500);

/// Starts what can start, up to [`WINDOW`] pieces in flight (`running`
/// of them already): the rarest pieces first from the peers that said
/// they hold them, then what older peers may hold, then the server: for
/// what no peer holds when this node is a seed, for anything when it is
/// stalled.
pub(super) fn start_pieces(plan: &mut Plan<'_>, start: &mut dyn FnMut(Source, usize), mut running: usize) {
    let n = plan.peers.len().max(1);
    let mut todo: Vec<(usize, usize)> = plan
        .missing
        .iter()
        .copied()
        .filter(|i| !plan.in_flight.contains(i))
        .map(|i| {
            let holders: usize = plan.peers.iter().filter(|p| !p.dropped && p.have.has(i)).count();
            (holders, i)
        })
        .collect();
    // Rarest first; `missing` is already in this node's own order, and
    // the sort is stable.
    todo.sort_by_key(|&(holders, _)| if holders == 0 { usize::MAX } else { holders });
    for (rank, &(holders, i)) in todo.iter().enumerate() {
        if running >= WINDOW.max(plan.server_window) {
            return;
        }
        let t = plan.tried.entry(i).or_default();
        let pick = plan
            .peers
            .iter_mut()
            .filter(|p| {
                !p.dropped
                    && p.in_flight < p.per_peer()
                    && p.busy_until.is_none_or(|b| b <= plan.now)
                    && !t.contains(&p.node)
                    && (p.have.has(i) || matches!(p.have, Have::Blind))
            })
            // Known holders before older peers asked blindly; then the
            // least busy; ties spread by the piece's rank.
            .enumerate()
            .min_by_key(|(k, p)| (!p.have.has(i), p.in_flight, p.failures, (k + rank) % n))
            .map(|(_, p)| p);
        let source = match pick {
            Some(p) => {
                p.in_flight += 1;
                p.busy_until = None;
                Source::Peer(p.node.clone(), p.address)
            }
            None if *plan.server_in_flight < plan.server_window
                && (plan.server == ServerUse::Any || (plan.server == ServerUse::Unheld && holders == 0)) =>
            {
                *plan.server_in_flight += 1;
                Source::Server
            }
            None => continue,
        };
        plan.in_flight.insert(i);
        running += 1;
        start(source, i);
    }
}

/// How soon to ask the tracker again, knowing `live` peers (not dropped),
/// allowed the server or not, and whether the last answer named a peer
/// this fetch did not know (`grew`): nobody to fetch from and not the
/// server, soon; few peers and the last answer named new ones, within a
/// second, for those that started since (an answer with nobody new means
/// the cluster has nobody more to name now); else every few seconds.
pub(super) fn ask_interval(live: usize, server_ok: bool, grew: bool) -> Duration {
    if !server_ok && live == 0 {
        ASK_SOON
    } else if live < FEW_PEERS && grew {
        ASK_FEW
    } else {
        ASK_EVERY
    }
}

/// How many pieces a node fetches from the server at once, adapted to what
/// the link delivers: [`SERVER_WINDOW`] at first (behind a slow link a
/// seed's pieces then land one after another, so its peers can start),
/// one more each time a piece arrives in under half of [`PIECE_TARGET`]
/// (the link, or the server, had room), up to [`MAX_SERVER_WINDOW`]; one
/// fewer, not below [`SERVER_WINDOW`], when one takes over twice as long.
/// Behind 200 Mbit/s a 4 MiB piece with two in flight takes about 0.3 s,
/// so the window stays 2; on a fast LAN pieces arrive in tens of
/// milliseconds and the window opens until they no longer do.
#[derive(Debug)]
pub(super) struct ServerWindow {
    pub(super) size: usize,
}

impl ServerWindow {
    pub(super) fn new() -> Self {
        ServerWindow { size: SERVER_WINDOW }
    }

    /// A piece from the server arrived after `took`.
    pub(super) fn arrived(&mut self, took: Duration) {
        if took < PIECE_TARGET / 2 {
            self.size = (self.size + 1).min(MAX_SERVER_WINDOW);
        } else if took > PIECE_TARGET * 2 {
            self.size = self.size.saturating_sub(1).max(SERVER_WINDOW);
        }
    }
}

pub(super) struct Found {
    pub(super) node: String,
    pub(super) address: SocketAddr,
}

pub(super) struct PeerState {
    pub(super) node: String,
    pub(super) address: SocketAddr,
    pub(super) in_flight: usize,
    pub(super) failures: u32,
    pub(super) dropped: bool,
    /// What it said it holds.
    pub(super) have: Have,
    /// Its `WatchPieces` stream is open.
    pub(super) watching: bool,
    /// It said it was busy: not asked again before then.
    pub(super) busy_until: Option<Instant>,
    /// How many times in a row it said so, since it last gave a piece.
    pub(super) busy_streak: u32,
}

impl PeerState {
    pub(super) fn new(f: Found) -> Self {
        PeerState {
            node: f.node,
            address: f.address,
            in_flight: 0,
            failures: 0,
            dropped: false,
            have: Have::Unknown,
            watching: false,
            busy_until: None,
            busy_streak: 0,
        }
    }

    /// How many pieces may be asked of it at once: [`PER_PEER`], one while
    /// it says it is busy (a second request would only wait in its line,
    /// holding a place of this node's window).
    pub(super) fn per_peer(&self) -> usize {
        if self.busy_streak > 0 { 1 } else { PER_PEER }
    }

    /// It said it is busy: not asked again for [`BUSY_BACKOFF`], doubled
    /// each time in a row, up to [`MAX_BUSY_BACKOFF`].
    pub(super) fn said_busy(&mut self, now: Instant) {
        let wait = BUSY_BACKOFF
            .saturating_mul(1 << self.busy_streak.min(8))
            .min(MAX_BUSY_BACKOFF);
        self.busy_streak += 1;
        self.busy_until = Some(now + wait);
    }

    /// It gave a piece: as eager as any again.
    pub(super) fn gave(&mut self) {
        self.busy_streak = 0;
    }
}

/// What a peer holds, as far as this node knows.
#[derive(Debug)]
pub(super) enum Have {
    /// Not heard from yet: not asked for anything.
    Unknown,
    /// An older agent without `WatchPieces`: asked for any piece, blindly.
    Blind,
    /// What its last `PiecesHeld` said.
    Known(pb::PiecesHeld),
}

impl Have {
    /// It said it holds piece `i`.
    pub(super) fn has(&self, i: usize) -> bool {
        match self {
            Have::Known(h) => h.whole || crate::link::peer::bit(&h.have, i),
            _ => false,
        }
    }

    pub(super) fn count(&self, pieces: usize) -> usize {
        (0..pieces).filter(|&i| self.has(i)).count()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum ServerUse {
    No,
    /// Pieces no peer holds (this node is a seed).
    Unheld,
    /// Any piece (this node is stalled).
    Any,
}

/// What [`start_pieces`] works on.
pub(super) struct Plan<'a> {
    /// The pieces not held yet, in this node's own order.
    pub(super) missing: &'a [usize],
    pub(super) in_flight: &'a mut HashSet<usize>,
    pub(super) tried: &'a mut HashMap<usize, HashSet<String>>,
    pub(super) peers: &'a mut Vec<PeerState>,
    /// What the server may be asked for.
    pub(super) server: ServerUse,
    pub(super) server_in_flight: &'a mut usize,
    /// Pieces it may have in flight from the server ([`ServerWindow`]).
    pub(super) server_window: usize,
    pub(super) now: Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(name: &str, have: Have) -> PeerState {
        let mut p = PeerState::new(Found {
            node: name.into(),
            address: "127.0.0.1:1".parse().unwrap(),
        });
        p.have = have;
        p
    }

    fn known(pieces: usize, held: &[usize]) -> Have {
        let mut have = vec![0u8; pieces.div_ceil(8)];
        for &i in held {
            have[i / 8] |= 1 << (i % 8);
        }
        Have::Known(pb::PiecesHeld {
            have,
            pieces: pieces as u32,
            whole: false,
        })
    }

    /// Runs one planning pass; returns what started where.
    fn plan(
        missing: &[usize],
        peers: &mut Vec<PeerState>,
        server: ServerUse,
        running: usize,
        tried: &mut HashMap<usize, HashSet<String>>,
    ) -> Vec<(String, usize)> {
        let mut in_flight = HashSet::new();
        let mut server_in_flight = 0;
        let mut started = Vec::new();
        start_pieces(
            &mut Plan {
                missing,
                in_flight: &mut in_flight,
                tried,
                peers,
                server,
                server_in_flight: &mut server_in_flight,
                server_window: SERVER_WINDOW,
                now: Instant::now(),
            },
            &mut |source, i| {
                let who = match source {
                    Source::Server => "server".to_string(),
                    Source::Peer(n, _) => n,
                };
                started.push((who, i));
            },
            running,
        );
        assert_eq!(in_flight.len(), started.len());
        started
    }

    #[test]
    fn the_rarest_piece_goes_first_and_only_to_a_peer_that_holds_it() {
        // Piece 3 is held by one peer, 1 by two, 0 and 2 by nobody.
        let mut peers = vec![peer("a", known(4, &[1, 3])), peer("b", known(4, &[1]))];
        let got = plan(&[0, 1, 2, 3], &mut peers, ServerUse::No, 0, &mut HashMap::new());
        assert_eq!(got, vec![("a".into(), 3), ("b".into(), 1)]);
        // Nobody holds 0 and 2, and the server may not be asked: they wait.
        assert_eq!(peers[0].in_flight, 1);
        assert_eq!(peers[1].in_flight, 1);
    }

    #[test]
    fn a_seed_takes_from_the_server_what_no_peer_holds_two_at_a_time() {
        let mut peers = vec![peer("a", known(6, &[5, 4]))];
        let got = plan(
            &[0, 1, 2, 4, 5],
            &mut peers,
            ServerUse::Unheld,
            0,
            &mut HashMap::new(),
        );
        assert_eq!(
            got,
            vec![
                ("a".into(), 4),
                ("a".into(), 5),
                ("server".into(), 0),
                ("server".into(), 1)
            ]
        );
        // A holder busy: a seed waits for it rather than take the piece
        // from the server again; a stalled node does not.
        let mut peers = vec![peer("a", known(2, &[0]))];
        peers[0].busy_until = Some(Instant::now() + Duration::from_secs(5));
        assert!(plan(&[0], &mut peers, ServerUse::Unheld, 0, &mut HashMap::new()).is_empty());
        assert_eq!(
            plan(&[0], &mut peers, ServerUse::Any, 0, &mut HashMap::new()),
            vec![("server".into(), 0)]
        );
    }

    #[test]
    fn the_tracker_is_asked_again_soon_only_while_that_can_name_more() {
        // Nobody to fetch from, and not the server: the seed is a node
        // this one has not been told of yet.
        assert_eq!(ask_interval(0, false, false), ASK_SOON);
        // The start of a batch: few known, and the last answer had news.
        assert_eq!(ask_interval(1, true, true), ASK_FEW);
        assert_eq!(ask_interval(FEW_PEERS - 1, false, true), ASK_FEW);
        // The last answer named nobody new: the cluster has no more.
        assert_eq!(ask_interval(3, true, false), ASK_EVERY);
        // A seed alone in its cluster, and a node that knows enough.
        assert_eq!(ask_interval(0, true, false), ASK_EVERY);
        assert_eq!(ask_interval(FEW_PEERS, true, true), ASK_EVERY);
    }

    #[test]
    fn the_server_window_opens_on_a_fast_link_and_closes_on_a_slow_one() {
        let mut w = ServerWindow::new();
        assert_eq!(w.size, SERVER_WINDOW);
        // Behind 200 Mbit/s: 0.3 s a piece, the window stays.
        w.arrived(Duration::from_millis(300));
        assert_eq!(w.size, SERVER_WINDOW);
        // A fast LAN: it opens, up to its bound.
        for _ in 0..20 {
            w.arrived(Duration::from_millis(40));
        }
        assert_eq!(w.size, MAX_SERVER_WINDOW);
        // The link slows down: it closes, not below where it started.
        for _ in 0..20 {
            w.arrived(Duration::from_secs(2));
        }
        assert_eq!(w.size, SERVER_WINDOW);
    }

    #[test]
    fn a_full_window_a_busy_peer_and_a_tried_one_start_nothing_more() {
        let mut peers = vec![peer("a", known(4, &[0, 1, 2, 3]))];
        assert!(plan(&[0, 1], &mut peers, ServerUse::Any, WINDOW, &mut HashMap::new()).is_empty());

        peers[0].busy_until = Some(Instant::now() + Duration::from_secs(5));
        assert!(plan(&[0, 1], &mut peers, ServerUse::No, 0, &mut HashMap::new()).is_empty());

        peers[0].busy_until = None;
        let mut tried = HashMap::from([(0, HashSet::from(["a".to_string()]))]);
        assert_eq!(
            plan(&[0, 1], &mut peers, ServerUse::No, 0, &mut tried),
            vec![("a".into(), 1)]
        );
    }

    #[test]
    fn a_busy_peer_is_asked_one_piece_at_a_time_and_later_each_time_in_a_row() {
        let now = Instant::now();
        let mut p = peer("a", known(4, &[0, 1, 2, 3]));
        assert_eq!(p.per_peer(), PER_PEER);
        p.said_busy(now);
        assert_eq!(p.busy_until, Some(now + BUSY_BACKOFF));
        p.said_busy(now);
        assert_eq!(p.busy_until, Some(now + BUSY_BACKOFF * 2));
        for _ in 0..20 {
            p.said_busy(now);
        }
        assert_eq!(p.busy_until, Some(now + MAX_BUSY_BACKOFF));
        // Its wait over, one piece at a time, not PER_PEER.
        p.busy_until = None;
        let mut peers = vec![p];
        let got = plan(&[0, 1, 2], &mut peers, ServerUse::No, 0, &mut HashMap::new());
        assert_eq!(got, vec![("a".into(), 0)]);
        // A piece from it: as eager as any again.
        peers[0].gave();
        assert_eq!(peers[0].per_peer(), PER_PEER);
    }

    #[test]
    fn known_holders_come_before_older_peers_asked_blindly_and_unknown_ones_are_not_asked() {
        let mut peers = vec![
            peer("old", Have::Blind),
            peer("silent", Have::Unknown),
            peer("new", known(2, &[0])),
        ];
        let got = plan(&[0, 1], &mut peers, ServerUse::No, 0, &mut HashMap::new());
        assert_eq!(got, vec![("new".into(), 0), ("old".into(), 1)]);
        assert_eq!(peers[1].in_flight, 0);
    }

    #[test]
    fn a_whole_holder_holds_every_piece_and_dropped_peers_none() {
        let whole = Have::Known(pb::PiecesHeld {
            have: vec![],
            pieces: 20,
            whole: true,
        });
        assert_eq!(whole.count(20), 20);
        let mut peers = vec![peer("bad", known(2, &[0, 1])), peer("w", whole)];
        peers[0].dropped = true;
        let got = plan(&[0, 1], &mut peers, ServerUse::No, 0, &mut HashMap::new());
        assert_eq!(got, vec![("w".into(), 0), ("w".into(), 1)]);
        assert_eq!(known(9, &[8]).count(9), 1);
    }
}
