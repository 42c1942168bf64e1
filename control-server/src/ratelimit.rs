//! A token bucket per peer IP, to slow down token guessing on `Enroll`, and
//! per node, to bound what one node can make the CA sign.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Buckets beyond this many peers trigger a sweep of the full ones.
const SWEEP_AT: usize = 10_000;

pub struct RateLimiter<K = IpAddr> {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<K, (f64, Instant)>>,
}

impl<K: Eq + Hash> RateLimiter<K> {
    /// `rate` tokens per second, at most `burst` saved up.
    pub fn new(rate: f64, burst: f64) -> Self {
        RateLimiter {
            rate,
            burst,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `ip`; false if none is left.
    pub fn allow(&self, ip: K) -> bool {
        self.allow_at(ip, Instant::now()).is_ok()
    }

    /// Takes one token for `ip`, or says how long until the next one.
    pub fn check(&self, ip: K) -> Result<(), Duration> {
        self.allow_at(ip, Instant::now())
    }

    fn allow_at(&self, ip: K, now: Instant) -> Result<(), Duration> {
        // One map update per call, whole after a panic; a poisoned map
        // let every request through before (a limiter that failed open).
        let mut b = lks_proto::sync::lock(&self.buckets);
        if b.len() >= SWEEP_AT {
            let (rate, burst) = (self.rate, self.burst);
            b.retain(|_, (tokens, at)| *tokens + now.duration_since(*at).as_secs_f64() * rate < burst);
        }
        let (tokens, at) = b.entry(ip).or_insert((self.burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.rate).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            // A rate of 0 never refills: "forever".
            Err(Duration::try_from_secs_f64((1.0 - *tokens) / self.rate).unwrap_or(Duration::MAX))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate() {
        let l = RateLimiter::new(5.0, 3.0);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let t = Instant::now();
        assert!((0..3).all(|_| l.allow_at(ip, t).is_ok()));
        assert_eq!(
            l.allow_at(ip, t),
            Err(Duration::from_millis(200)),
            "the wait for one token"
        );
        assert!(l.allow_at(other, t).is_ok(), "buckets are per peer");
        assert!(l.allow_at(ip, t + Duration::from_millis(250)).is_ok());
        assert!(l.allow_at(ip, t + Duration::from_millis(250)).is_err());
        let never = RateLimiter::new(0.0, 1.0);
        assert!(never.allow_at(ip, t).is_ok());
        assert_eq!(
            never.allow_at(ip, t),
            Err(Duration::MAX),
            "a rate of 0 never refills"
        );
    }
}
