//! Load spread over replicas (`--store etcd`): each replica publishes how
//! many agents it holds (on the store's load board, `load/ID` under its
//! lease, [`EtcdStore::load_board`]), and one that holds
//! clearly more than its share asks some of its agents to reconnect to the
//! least loaded replica, a few per round, until it is back at its share. A
//! replica that restarts (or joins) does not sit empty while the others
//! hold the fleet.
//!
//! The move is an end of stream with `UNAVAILABLE`, a short retry hint and
//! the target replica's URL in the `lks-reconnect-to` trailer: an agent
//! that has that URL in its server list goes there next, any other agent
//! (older ones, or agents joined through a load balancer's URL) to the
//! next server in its list, as after any end of stream.

use std::sync::Arc;
use std::time::Duration;

use crate::context::Shared;
use crate::store::EtcdStore;
/// What one replica holds, as it publishes it.
pub use crate::store::etcd::Load;

/// Default for `--rebalance-interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// An unchanged load is published again this often.
const REPUBLISH: Duration = Duration::from_secs(60);

/// What a replica decides in one round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Agents to ask to move now.
    pub moves: usize,
    /// Where to ("": let them pick).
    pub to: String,
    /// Still above its share after these moves: keep shedding next round.
    pub shedding: bool,
}

/// One round's decision for the replica whose load is `own`, among
/// `others` (the live replicas' published loads). A replica starts
/// shedding only well above its share (10 %, and at least 2 agents) and
/// then sheds until it is at its share, at most 5 % of its agents (at
/// least 1) per round, so that agents move a few at a time and replicas do
/// not trade the same agents back and forth.
pub fn plan(own: usize, others: &[Load], shedding: bool) -> Plan {
    let idle = Plan {
        moves: 0,
        to: String::new(),
        shedding: false,
    };
    if others.is_empty() {
        return idle;
    }
    let total = own + others.iter().map(|l| l.connected).sum::<usize>();
    let n = others.len() + 1;
    let fair = total.div_ceil(n);
    let start = fair + (fair / 10).max(2);
    if own <= fair || (!shedding && own <= start) {
        return idle;
    }
    let moves = (own - fair).min((own / 20).max(1));
    let least = others.iter().min_by_key(|l| l.connected);
    let to = least
        .filter(|l| l.connected < fair)
        .map(|l| l.url.clone())
        .unwrap_or_default();
    Plan {
        moves,
        to,
        shedding: own - moves > fair,
    }
}

/// Every `interval` until shutdown: publish this replica's load, read the
/// others', and move agents as [`plan`] says.
pub async fn run(s: Arc<Shared>, store: EtcdStore, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shedding = false;
    // What was last published, and when: an unchanged load is written
    // again only once a minute (a new lease drops the old key).
    let mut published: Option<(usize, tokio::time::Instant)> = None;
    loop {
        tokio::select! {
            _ = s.cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let own = s.hub.connected();
        let me = Load {
            url: s.server_url.clone(),
            connected: own,
        };
        let fresh = published.is_some_and(|(n, at)| n == own && at.elapsed() < REPUBLISH);
        if !fresh {
            match store.load_board().publish(&me).await {
                Ok(true) => published = Some((own, tokio::time::Instant::now())),
                Ok(false) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "publish this replica's load");
                    continue;
                }
            }
        }
        let others: Vec<Load> = match store.load_board().others().await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "read the replicas' loads");
                continue;
            }
        };
        let p = plan(own, &others, shedding);
        shedding = p.shedding;
        if p.moves == 0 {
            continue;
        }
        let mut moved = 0;
        for node in s.hub.some_serving(p.moves) {
            moved += usize::from(s.hub.ask_to_move(&node, &p.to));
        }
        s.metrics.agents_moved(moved as u64);
        tracing::info!(
            moved,
            held = own,
            to = if p.to.is_empty() {
                "(their next server)"
            } else {
                p.to.as_str()
            },
            "rebalancing: this replica holds more than its share; asked agents to move"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(n: &[usize]) -> Vec<Load> {
        n.iter()
            .enumerate()
            .map(|(i, &c)| Load {
                url: format!("https://r{i}"),
                connected: c,
            })
            .collect()
    }

    #[test]
    fn balanced_replicas_move_nobody() {
        assert_eq!(plan(10, &at(&[10, 10]), false).moves, 0);
        assert_eq!(plan(11, &at(&[10, 9]), false).moves, 0, "within the slack");
        assert_eq!(plan(5, &[], false).moves, 0, "alone");
    }

    #[test]
    fn a_restarted_replica_gets_its_share_a_few_at_a_time() {
        // Two replicas hold 12 each, the third came back empty.
        let p = plan(12, &at(&[12, 0]), false);
        assert_eq!((p.moves, p.to.as_str(), p.shedding), (1, "https://r1", true));
        // Once started it goes on down to its share (8), past the slack.
        let p = plan(9, &at(&[9, 6]), true);
        assert_eq!((p.moves, p.shedding), (1, false));
        assert_eq!(plan(8, &at(&[8, 8]), true).moves, 0);
        // Large fleets: 5 % of what it holds per round.
        let p = plan(20_000, &at(&[10_000, 0]), false);
        assert_eq!((p.moves, p.to.as_str()), (1_000, "https://r1"));
    }

    #[test]
    fn the_least_loaded_replica_is_named() {
        let p = plan(20, &at(&[12, 9, 11]), false);
        assert_eq!((p.moves, p.to.as_str()), (1, "https://r1"));
    }
}
