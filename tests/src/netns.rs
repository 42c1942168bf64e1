//! Real network namespaces for the network-fault tests (DESIGN §9): the
//! control server in one, each tenant VM's agent in another, joined by veth
//! pairs through a router namespace that forwards what the agents open and
//! drops every connection the server side tries to open (nftables,
//! connection tracking: the stateful firewall or NAT in front of a tenant
//! network). Faults are injected at the router: a link cut (`ip link set
//! down`), random loss (nftables `numgen`), a rate limit (`tc tbf`) and,
//! where the kernel has it, delay (`tc netem`).
//!
//! Addresses are 10.231.0.0/16 inside the namespaces only: the server is
//! 10.231.0.2, agent `i` is 10.231.i.2, the router .1 on each link. Every
//! namespace (and with it its veths, qdiscs and rules) is removed when the
//! [`Net`] is dropped, pass or fail.
//!
//! These tests need root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and `nft`. Where
//! namespaces cannot be made they fail with the reason, unless
//! `LKS_SKIP_NETNS=1` asks to skip them, which they then print.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::agent::Agent;
use crate::server::Server;

pub const SERVER_IP: &str = "10.231.0.2";
pub const SERVER_PORT: u16 = 7443;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The namespaces of one test.
pub struct Net {
    id: String,
    agents: usize,
    /// Whether `tc netem` exists in this kernel (delay can be injected).
    pub has_netem: bool,
    /// The neighbour-table thresholds to put back (see [`Net::tenant_lan`]).
    neigh_restore: Option<[String; 3]>,
}

const GC_THRESH: [&str; 3] = [
    "/proc/sys/net/ipv4/neigh/default/gc_thresh1",
    "/proc/sys/net/ipv4/neigh/default/gc_thresh2",
    "/proc/sys/net/ipv4/neigh/default/gc_thresh3",
];

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn must(args: &[&str]) {
    sh(args).unwrap_or_else(|e| panic!("{e}"));
}

impl Net {
    /// Builds the server, router and `agents` agent namespaces; `None` if
    /// they cannot be made and `LKS_SKIP_NETNS=1` says to skip.
    pub fn new(agents: usize) -> Option<Net> {
        let mut net = Self::empty()?;
        net.build(agents);
        Some(net)
    }

    /// One tenant network: the agents' namespaces `a1`…`aN` on one bridge
    /// (`lan`, in the router namespace; agent `i` is 10.231.1.`i+1`), so
    /// they reach each other directly, and the server only through the
    /// router, which still lets nothing in that the tenants did not open.
    /// [`Net::limit_lan`] caps the router's link into the tenant network.
    pub fn tenant_lan(agents: usize) -> Option<Net> {
        assert!(agents <= 250, "one /24");
        let mut net = Self::empty()?;
        net.size_neighbour_table(agents);
        net.build_lan(agents);
        Some(net)
    }

    /// The kernel's ARP table is one for all namespaces: N nodes that all
    /// talk to each other need about N² entries, past the default limit of
    /// 1,024 from some 30 nodes on ("neighbor table overflow", connections
    /// that never start). Raised for the test, put back when it ends.
    fn size_neighbour_table(&mut self, agents: usize) {
        let need = 2 * (agents + 2) * (agents + 2);
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default().trim().to_string();
        let now: [String; 3] = GC_THRESH.map(read);
        if now[2].parse::<usize>().unwrap_or(0) >= need {
            return;
        }
        for (p, v) in GC_THRESH.iter().zip([need / 4, need / 2, need]) {
            std::fs::write(p, v.to_string()).unwrap_or_else(|e| panic!("raise {p}: {e}"));
        }
        self.neigh_restore = Some(now);
    }

    fn empty() -> Option<Net> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let id = format!("lks{}x{n}", std::process::id());
        let net = Net {
            id,
            agents: 0,
            has_netem: false,
            neigh_restore: None,
        };
        if let Err(e) = sh(&["ip", "netns", "add", &net.ns("r")]).and_then(|()| sh(&["nft", "--version"])) {
            let why = format!(
                "network namespaces with nftables are needed (root, CAP_NET_ADMIN, iproute2 and \
                 nftables from scripts/setup.sh): {e}"
            );
            if std::env::var_os("LKS_SKIP_NETNS").is_some_and(|v| v == "1") {
                eprintln!("SKIPPED (LKS_SKIP_NETNS=1): {why}");
                return None;
            }
            panic!("{why}; set LKS_SKIP_NETNS=1 to skip these tests explicitly");
        }
        Some(net)
    }

    /// Name of a namespace of this test: `r`, `s`, `a1`, …
    pub fn ns(&self, part: &str) -> String {
        format!("{}-{part}", self.id)
    }

    /// `ip netns exec NS` for namespace `part`.
    pub fn wrapper(&self, part: &str) -> Vec<String> {
        ["ip", "netns", "exec"]
            .iter()
            .map(|s| s.to_string())
            .chain([self.ns(part)])
            .collect()
    }

    fn link(&self, ns: &str, router_if: &str, net: u8) {
        let (r, other) = (self.ns("r"), self.ns(ns));
        must(&["ip", "netns", "add", &other]);
        must(&["ip", "-n", &other, "link", "set", "lo", "up"]);
        must(&[
            "ip", "link", "add", router_if, "netns", &r, "type", "veth", "peer", "name", "eth0", "netns",
            &other,
        ]);
        must(&[
            "ip",
            "-n",
            &r,
            "addr",
            "add",
            &format!("10.231.{net}.1/24"),
            "dev",
            router_if,
        ]);
        must(&[
            "ip",
            "-n",
            &other,
            "addr",
            "add",
            &format!("10.231.{net}.2/24"),
            "dev",
            "eth0",
        ]);
        must(&["ip", "-n", &r, "link", "set", router_if, "up"]);
        must(&["ip", "-n", &other, "link", "set", "eth0", "up"]);
        must(&[
            "ip",
            "-n",
            &other,
            "route",
            "add",
            "default",
            "via",
            &format!("10.231.{net}.1"),
        ]);
    }

    /// The router namespace, forwarding, and the server's link to it.
    fn router_and_server(&mut self) -> String {
        let r = self.ns("r");
        must(&["ip", "-n", &r, "link", "set", "lo", "up"]);
        must(&[
            "ip",
            "netns",
            "exec",
            &r,
            "sh",
            "-c",
            "echo 1 > /proc/sys/net/ipv4/ip_forward",
        ]);
        self.link("s", "srv", 0);
        r
    }

    fn build(&mut self, agents: usize) {
        self.router_and_server();
        for i in 1..=agents {
            self.agents = i;
            self.link(&format!("a{i}"), &format!("a{i}"), i as u8);
        }
        self.firewall();
    }

    fn build_lan(&mut self, agents: usize) {
        let r = self.router_and_server();
        must(&["ip", "-n", &r, "link", "add", "lan", "type", "bridge"]);
        must(&["ip", "-n", &r, "addr", "add", "10.231.1.1/24", "dev", "lan"]);
        must(&["ip", "-n", &r, "link", "set", "lan", "up"]);
        for i in 1..=agents {
            self.agents = i;
            let (port, ns) = (format!("a{i}"), self.ns(&format!("a{i}")));
            must(&["ip", "netns", "add", &ns]);
            must(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
            must(&[
                "ip", "link", "add", &port, "netns", &r, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ]);
            must(&["ip", "-n", &r, "link", "set", &port, "master", "lan"]);
            must(&["ip", "-n", &r, "link", "set", &port, "up"]);
            let addr = format!("10.231.1.{}/24", i + 1);
            must(&["ip", "-n", &ns, "addr", "add", &addr, "dev", "eth0"]);
            must(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
            must(&["ip", "-n", &ns, "route", "add", "default", "via", "10.231.1.1"]);
        }
        self.firewall();
    }

    /// Caps what the router sends into the tenant network (what comes from
    /// the server; the nodes' traffic to each other stays on the bridge).
    pub fn limit_lan(&self, rate: &str) {
        self.tbf("lan", rate, "64kb", "1s");
    }

    /// A token bucket on the router's interface `dev`.
    fn tbf(&self, dev: &str, rate: &str, burst: &str, latency: &str) {
        must(&[
            "tc",
            "-n",
            &self.ns("r"),
            "qdisc",
            "replace",
            "dev",
            dev,
            "root",
            "tbf",
            "rate",
            rate,
            "burst",
            burst,
            "latency",
            latency,
        ]);
    }

    /// Bytes the router has sent into the tenant network.
    pub fn lan_tx_bytes(&self) -> u64 {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns("r"),
                "cat",
                "/sys/class/net/lan/statistics/tx_bytes",
            ])
            .output()
            .expect("read the lan counters");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("lan tx_bytes: {:?}", String::from_utf8_lossy(&out.stderr)))
    }

    fn firewall(&mut self) {
        let r = self.ns("r");
        // Replies and what the agents open pass; the server side opens
        // nothing towards a tenant, and tenants do not reach each other.
        let rules = "table inet lks {\n\
             chain impair { type filter hook forward priority -10; policy accept; }\n\
             chain forward { type filter hook forward priority 0; policy accept;\n\
               ct state established,related accept\n\
               iifname \"srv\" drop\n\
               iifname \"a*\" oifname \"a*\" drop\n\
             }\n\
           }\n";
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &r, "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().expect("run nft");
        {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("nft stdin")
                .write_all(rules.as_bytes())
                .expect("write nft rules");
        }
        let out = child.wait_with_output().expect("wait for nft");
        assert!(
            out.status.success(),
            "load the router's nftables rules: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.has_netem = sh(&[
            "tc", "-n", &r, "qdisc", "add", "dev", "srv", "root", "netem", "delay", "0ms",
        ])
        .is_ok();
        if self.has_netem {
            must(&["tc", "-n", &r, "qdisc", "del", "dev", "srv", "root"]);
        }
    }

    /// Server address inside its namespace.
    pub fn server_addr() -> SocketAddr {
        format!("{SERVER_IP}:{SERVER_PORT}")
            .parse()
            .expect("server address")
    }

    /// Starts the control server in the server namespace.
    pub fn server(&self, args: &[&str]) -> Server {
        let metrics = format!("{SERVER_IP}:9090").parse().expect("metrics address");
        Server::start_wrapped(&self.wrapper("s"), Self::server_addr(), metrics, args)
    }

    /// An etcd in the server namespace, for replicas there ([`Net::replica`]).
    pub fn etcd(&self) -> crate::etcd::Etcd {
        let at = |port: u16| format!("{SERVER_IP}:{port}").parse().expect("etcd address");
        crate::etcd::Etcd::start_wrapped(self.wrapper("s"), at(2379), at(2380))
    }

    /// Replica `k` (0, 1, …) of a control plane on `etcd` (see
    /// [`Net::etcd`]) in the server namespace: port 7443 + k, metrics
    /// 9090 + k; a 3 s lease; blobs in etcd up to 128 MiB; `extra` appended.
    pub fn replica(&self, k: u16, etcd: &crate::etcd::Etcd, extra: &[&str]) -> Server {
        let at = |port: u16| format!("{SERVER_IP}:{port}").parse().expect("replica address");
        let url = etcd.url();
        let mut args = vec![
            "--store",
            "etcd",
            "--etcd-endpoints",
            &url,
            "--etcd-prefix",
            "/lks/",
            "--lease-ttl",
            "3s",
            // Blobs in etcd's chunks: room for the benchmark's 64 MiB file.
            "--etcd-max-blob-size",
            "134217728",
        ];
        args.extend_from_slice(extra);
        Server::start_wrapped(&self.wrapper("s"), at(SERVER_PORT + k), at(9090 + k), &args)
    }

    /// An agent whose processes run in namespace `a{i}`.
    pub fn agent(&self, i: usize, name: &str) -> Agent {
        assert!(i >= 1 && i <= self.agents, "no agent namespace a{i}");
        let mut a = Agent::new(name);
        a.wrapper = self.wrapper(&format!("a{i}"));
        a
    }

    /// Proves the one-way policy: agent `i` opens a connection to the
    /// server's address, the server's namespace cannot open one to a
    /// listener in agent `i`'s namespace.
    pub fn check_one_way(&self, i: usize) {
        assert!(
            crate::probe_tcp(&self.wrapper(&format!("a{i}")), Self::server_addr()),
            "agent a{i} cannot reach the server at {}",
            Self::server_addr()
        );
        let ns = self.ns(&format!("a{i}"));
        let addr: SocketAddr = format!("10.231.{i}.2:7000").parse().expect("agent address");
        let listener = in_netns(&ns, move || TcpListener::bind(addr)).expect("listen in the agent namespace");
        // The listener works from inside its own namespace …
        let local = in_netns(&ns, move || {
            TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        });
        assert!(local.is_ok(), "the agent's own listener answers: {local:?}");
        // … and cannot be reached from the server's.
        assert!(
            !crate::probe_tcp(&self.wrapper("s"), addr),
            "the server namespace opened a connection to agent a{i}: the one-way policy does not hold"
        );
        drop(listener);
    }

    /// Cuts agent `i`'s link at the router (the cable pulled: no reset,
    /// packets vanish).
    pub fn cut(&self, i: usize) {
        must(&["ip", "-n", &self.ns("r"), "link", "set", &format!("a{i}"), "down"]);
    }

    /// Restores agent `i`'s link.
    pub fn restore(&self, i: usize) {
        must(&["ip", "-n", &self.ns("r"), "link", "set", &format!("a{i}"), "up"]);
    }

    /// Limits what the router sends to agent `i` to `rate` (e.g. `16mbit`).
    pub fn rate(&self, i: usize, rate: &str) {
        self.tbf(&format!("a{i}"), rate, "32kb", "500ms");
    }

    /// Removes the rate limit (or delay) of agent `i`'s link.
    pub fn unlimit(&self, i: usize) {
        let _ = sh(&[
            "tc",
            "-n",
            &self.ns("r"),
            "qdisc",
            "del",
            "dev",
            &format!("a{i}"),
            "root",
        ]);
    }

    /// Drops `percent` % of the packets in each direction of agent `i`'s
    /// link, at random.
    pub fn loss(&self, i: usize, percent: u32) {
        let r = self.ns("r");
        for dir in ["iifname", "oifname"] {
            must(&[
                "ip",
                "netns",
                "exec",
                &r,
                "nft",
                "add",
                "rule",
                "inet",
                "lks",
                "impair",
                dir,
                &format!("a{i}"),
                "numgen",
                "random",
                "mod",
                "100",
                "<",
                &percent.to_string(),
                "drop",
            ]);
        }
    }

    /// Delays every packet to and from agent `i` by `ms` (netem, on both
    /// ends of the link); false if this kernel has no netem.
    pub fn delay(&self, i: usize, ms: u32) -> bool {
        if !self.has_netem {
            return false;
        }
        let d = format!("{ms}ms");
        must(&[
            "tc",
            "-n",
            &self.ns("r"),
            "qdisc",
            "replace",
            "dev",
            &format!("a{i}"),
            "root",
            "netem",
            "delay",
            &d,
        ]);
        must(&[
            "tc",
            "-n",
            &self.ns(&format!("a{i}")),
            "qdisc",
            "replace",
            "dev",
            "eth0",
            "root",
            "netem",
            "delay",
            &d,
        ]);
        true
    }

    /// Names of this test's namespaces that still exist.
    pub fn left_over(&self) -> Vec<String> {
        let out = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns list");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| n.starts_with(&format!("{}-", self.id)))
            .map(str::to_string)
            .collect()
    }

    fn remove(&self) {
        let mut names = vec![self.ns("r"), self.ns("s")];
        names.extend((1..=self.agents).map(|i| self.ns(&format!("a{i}"))));
        for n in names {
            let _ = sh(&["ip", "netns", "del", &n]);
        }
    }

    /// Removes every namespace now and asserts none is left.
    pub fn close(self) {
        self.remove();
        let left = self.left_over();
        assert!(left.is_empty(), "namespaces left behind: {left:?}");
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace removes its veths (and so their peers),
        // qdiscs and nftables rules with it.
        self.remove();
        if let Some(old) = self.neigh_restore.take() {
            for (p, v) in GC_THRESH.iter().zip(old) {
                let _ = std::fs::write(p, v);
            }
        }
    }
}

/// Runs `f` on a thread that has entered network namespace `ns`; sockets
/// it makes stay in that namespace.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET)
            .unwrap_or_else(|e| panic!("enter {path}: {e}"));
        f()
    })
    .join()
    .expect("namespace thread")
}
