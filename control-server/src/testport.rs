//! Loopback ports for the helper processes unit tests start (etcd, an S3
//! server), as the end-to-end harness picks them (`tests/src/lib.rs`,
//! `free_addr`): at random below the kernel's ephemeral range, so that no
//! outgoing connection of a concurrently running test takes the port
//! between this pick and the helper's bind ("Address already in use").

use std::net::TcpListener;
use std::sync::Mutex;

/// A port that was free a moment ago; never the same twice in one process.
pub(crate) fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    const LOWEST: u16 = 10_000;
    let below = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    if below > LOWEST {
        for _ in 0..1_000 {
            let span = f64::from(below - LOWEST);
            let port = LOWEST + (lks_proto::backoff::unit_random() * span) as u16;
            if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.push(port);
                return port;
            }
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local_addr").port()
}

#[cfg(test)]
mod tests {
    #[test]
    fn ports_are_below_the_ephemeral_range_and_never_repeat() {
        let ports: Vec<u16> = (0..50).map(|_| super::free_port()).collect();
        let mut unique = ports.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        if let Some(low) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
            .filter(|&low| low > 10_000)
        {
            assert!(ports.iter().all(|&p| (10_000..low).contains(&p)), "{ports:?}");
        }
    }
}
