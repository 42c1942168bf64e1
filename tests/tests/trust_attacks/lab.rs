//! The attacks' laboratory: a real agent joined to a real server whose
//! TLS identity a rogue server then serves with, the honest state the node
//! is returned to between attacks, and how each attack's outcome is read
//! from what the node reports (a refusal, or a give-away).

use lks_e2e::agent::Agent;
use lks_e2e::rogue::{Heard, Record, RogueServer, state_name};
use lks_e2e::server::Server;
use lks_e2e::trust::{TestBundle, desired};
use lks_proto::pb;
use lks_proto::release::{SignedRelease, SignedRoot};

use super::{ANSWER, CONVERGE, OFFSET_ENV, SETTLE};

pub(crate) enum Verdict {
    Refused(String),
    Accepted(String),
}

/// One attack: the desired state the rogue server sends, what would give
/// its success away, and what the agent's refusal must say.
pub(crate) struct Attack {
    pub(crate) name: &'static str,
    pub(crate) desired: pb::DesiredState,
    /// `NAME@VERSION`s the node must not report applied.
    pub(crate) bundles: Vec<String>,
    /// A release version the node must not report accepted (None when the
    /// attack reuses the version the node holds, or its release is honest).
    pub(crate) release: Option<u64>,
    /// The refusal: one of these in a trust, bundle or event message...
    pub(crate) phrases: &'static [&'static str],
    /// ... or one of these trust states.
    pub(crate) states: &'static [&'static str],
}

/// What the node should hold between attacks.
pub(crate) struct Honest {
    pub(crate) release: SignedRelease,
    pub(crate) roots: Vec<SignedRoot>,
    pub(crate) app: TestBundle,
    pub(crate) cfg: TestBundle,
}

impl Honest {
    pub(crate) fn desired(&self) -> pb::DesiredState {
        desired(Some(&self.release), &self.roots, &[&self.app, &self.cfg])
    }

    pub(crate) fn root_version(&self) -> u64 {
        self.roots.last().map_or(1, |r| r.root.version)
    }
}

pub(crate) struct Lab {
    pub(crate) rogue: RogueServer,
    pub(crate) agent: Agent,
    /// The agent was joined with `--trust-threshold` (a build that has it).
    pub(crate) trust_on: bool,
    pub(crate) honest: Honest,
    /// Messages the node was still reporting when the honest state was
    /// back: not an answer to the next attack.
    pub(crate) stale: Vec<String>,
    pub(crate) results: Vec<(&'static str, Verdict)>,
    /// The real server, stopped; its data dir (the TLS identity the rogue
    /// server serves with) lives as long as it does.
    pub(crate) _server: Server,
}

pub(crate) fn is_settled(b: &pb::BundleStatus) -> bool {
    b.state != pb::BundleState::Applying as i32 && b.state != pb::BundleState::Pending as i32
}

pub(crate) fn applied(r: &Record, b: &TestBundle) -> bool {
    r.heard
        .bundles()
        .iter()
        .any(|s| s.name == b.name() && s.version == b.version() && s.state == pb::BundleState::Applied as i32)
}

impl Lab {
    /// The node's files are the honest bundles' (version 2 once set up),
    /// byte for byte, and nothing else is in its root; else what differs.
    pub(crate) fn files_changed(&self) -> Option<String> {
        let honest: Vec<&str> = [&self.honest.app, &self.honest.cfg]
            .iter()
            .flat_map(|b| b.files.iter().map(|(p, _)| p.as_str()))
            .collect();
        if let Some(other) = files_under(&self.agent.root)
            .into_iter()
            .find(|p| !honest.contains(&p.as_str()))
        {
            return Some(format!("{other} is in the node's root"));
        }
        for b in [&self.honest.app, &self.honest.cfg] {
            for (path, want) in &b.files {
                match self.agent.read(path) {
                    Some((bytes, 0o644)) if bytes == *want => {}
                    Some((bytes, mode)) => {
                        return Some(format!(
                            "{path} now holds {:?} (mode {mode:o})",
                            String::from_utf8_lossy(&bytes).trim_end()
                        ));
                    }
                    None => return Some(format!("{path} is gone")),
                }
            }
        }
        None
    }

    /// Sends `d` and waits until the node reports `app` and `cfg` applied
    /// for it (and, with trust on, trust `ok` at `release` and `root`);
    /// panics with the last records if it does not.
    pub(crate) fn converge(
        &mut self,
        d: pb::DesiredState,
        app: &TestBundle,
        cfg: &TestBundle,
        release: u64,
        root: u64,
    ) {
        let mark = self.rogue.mark();
        let g = self.rogue.send_desired(d);
        let trust_on = self.trust_on;
        let done = self.rogue.wait_for(mark, CONVERGE, |r| {
            let trust_ok = !trust_on
                || r.heard.trust().is_some_and(|t| {
                    t.state == "ok" && t.release_version == release && t.root_version == root
                });
            (r.heard.generation().is_some_and(|x| x >= g) && applied(r, app) && applied(r, cfg) && trust_ok)
                .then(|| r.heard.messages())
        });
        let Some(messages) = done else {
            panic!(
                "the node did not reach {} and {} (release {release}, root {root}) within {CONVERGE:?}; it said:\n{}",
                app.id(),
                cfg.id(),
                said(&self.rogue.records_since(mark))
            );
        };
        self.stale = messages;
    }

    /// Puts the honest state back and checks the files.
    pub(crate) fn restore(&mut self) {
        let (app, cfg) = (self.honest.app.clone(), self.honest.cfg.clone());
        let (release, root) = (self.honest.release.release.version, self.honest.root_version());
        self.converge(self.honest.desired(), &app, &cfg, release, root);
        if let Some(diff) = self.files_changed() {
            panic!("the honest state is reported back, but {diff}");
        }
    }

    /// Restarts the agent, its trust clock moved by `offset_ms` (0: none),
    /// and waits for its Hello.
    pub(crate) fn restart_agent(&mut self, offset_ms: i64) {
        self.agent.stop();
        self.agent.run_env.retain(|(k, _)| k != OFFSET_ENV);
        if offset_ms != 0 {
            self.agent
                .run_env
                .push((OFFSET_ENV.into(), offset_ms.to_string()));
        }
        let mark = self.rogue.mark();
        self.agent.start();
        let hello = self.rogue.wait_for(mark, CONVERGE, |r| match &r.heard {
            Heard::Hello(h) => Some(h.trust.clone()),
            _ => None,
        });
        let Some(trust) = hello else {
            panic!("the restarted agent did not connect within {CONVERGE:?}");
        };
        // It says which release it holds from its first word on.
        if self.trust_on {
            let held = trust.map(|t| t.release_version);
            let want = self.honest.release.release.version;
            assert_eq!(
                held,
                Some(want),
                "the restarted agent's Hello names release {want}"
            );
        }
    }

    pub(crate) fn verdict(&mut self, name: &'static str, v: Verdict) {
        match &v {
            Verdict::Refused(why) => println!("TRUSTATTACK {name} refused ({why})"),
            Verdict::Accepted(why) => println!("TRUSTATTACK {name} ACCEPTED ({why})"),
        }
        self.results.push((name, v));
    }

    /// Sends the attack, judges the node's answer, records the verdict.
    pub(crate) fn attack(&mut self, a: Attack) {
        let name = a.name;
        let v = self.judge(a);
        self.verdict(name, v);
    }

    /// Sends the attack and judges the node's answer.
    pub(crate) fn judge(&mut self, a: Attack) -> Verdict {
        let mark = self.rogue.mark();
        let g = self.rogue.send_desired(a.desired.clone());
        let stale = self.stale.clone();
        let honest_root = self.honest.root_version();
        let first = self.rogue.wait_for(mark, ANSWER, |r| {
            gave_away(r, &a, honest_root)
                .map(Err)
                .or_else(|| refusal(r, &a, &stale).map(Ok))
        });
        match first {
            None => Verdict::Accepted(format!(
                "no refusal saying {:?} within {ANSWER:?}; the node said: {}",
                a.phrases.iter().chain(a.states).collect::<Vec<_>>(),
                last_words(&self.rogue.records_since(mark))
            )),
            Some(Err(away)) => Verdict::Accepted(away),
            Some(Ok(reason)) => {
                // Let the node finish with this generation, then look again
                // at everything it said and at its files.
                self.rogue.wait_for(mark, SETTLE, |r| {
                    (r.heard.generation().is_some_and(|x| x >= g) && r.heard.bundles().iter().all(is_settled))
                        .then_some(())
                });
                let records = self.rogue.records_since(mark);
                if let Some(away) = records.iter().find_map(|r| gave_away(r, &a, honest_root)) {
                    return Verdict::Accepted(away);
                }
                if let Some(diff) = self.files_changed() {
                    return Verdict::Accepted(diff);
                }
                // The node keeps its release and says so.
                let last = records.iter().rev().find_map(|r| r.heard.trust());
                let honest = &self.honest.release.release;
                match last {
                    None if self.trust_on => {
                        Verdict::Accepted(format!("{reason}; but no trust status reported"))
                    }
                    None => Verdict::Refused(reason),
                    Some(t)
                        if t.release_version == honest.version
                            && t.release_expires_at_ms == honest.expires_at_ms =>
                    {
                        Verdict::Refused(format!(
                            "{reason}; release {} kept, trust {}",
                            t.release_version, t.state
                        ))
                    }
                    Some(t) => Verdict::Accepted(format!(
                        "{reason}; but the node now follows release {} expiring at {} ms (trust {})",
                        t.release_version, t.release_expires_at_ms, t.state
                    )),
                }
            }
        }
    }
}

/// Every entry under `root` that is not a directory, as a path on the
/// node (`/etc/app/app.conf`).
pub(crate) fn files_under(root: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display()));
        for e in entries {
            let e = e.expect("read a directory entry");
            let path = e.path();
            if e.file_type().expect("file type").is_dir() {
                dirs.push(path);
            } else if let Ok(rel) = path.strip_prefix(root) {
                out.push(format!("/{}", rel.display()));
            }
        }
    }
    out
}

/// What shows the attack worked: the attacker's bundle version applied,
/// its release accepted, or a trust root above the honest one taken.
pub(crate) fn gave_away(r: &Record, a: &Attack, honest_root: u64) -> Option<String> {
    for s in r.heard.bundles() {
        let id = format!("{}@{}", s.name, s.version);
        if s.state == pb::BundleState::Applied as i32 && a.bundles.contains(&id) {
            return Some(format!("{id} applied"));
        }
    }
    let t = r.heard.trust()?;
    if t.root_version > honest_root {
        return Some(format!("trust root {} accepted", t.root_version));
    }
    a.release
        .filter(|v| t.release_version == *v)
        .map(|v| format!("release {v} accepted (trust {})", t.state))
}

/// The node's refusal, in the words the attack expects.
pub(crate) fn refusal(r: &Record, a: &Attack, stale: &[String]) -> Option<String> {
    if let Some(t) = r.heard.trust()
        && a.states.contains(&t.state.as_str())
    {
        return Some(format!("trust {}: {}", t.state, t.message));
    }
    r.heard
        .messages()
        .into_iter()
        .find(|m| !stale.contains(m) && a.phrases.iter().any(|p| m.contains(p)))
}

/// The last thing the node reported, in one line.
pub(crate) fn last_words(records: &[Record]) -> String {
    records
        .iter()
        .rev()
        .find(|r| !matches!(r.heard, Heard::Event(_)))
        .map_or_else(|| "nothing".into(), |r| one_line(&r.heard))
}

pub(crate) fn one_line(h: &Heard) -> String {
    let mut parts: Vec<String> = h
        .bundles()
        .iter()
        .map(|b| format!("{}@{} {}", b.name, b.version, state_name(b.state)))
        .collect();
    if let Some(t) = h.trust() {
        parts.push(format!(
            "trust {} release {} root {}",
            t.state, t.release_version, t.root_version
        ));
    }
    parts.extend(h.messages());
    parts.join("; ")
}

/// Everything the node said, one record a line, for a failure message.
pub(crate) fn said(records: &[Record]) -> String {
    records
        .iter()
        .map(|r| one_line(&r.heard))
        .collect::<Vec<_>>()
        .join("\n")
}
