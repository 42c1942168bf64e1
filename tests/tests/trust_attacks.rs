//! Attacks on signed releases (issue #30 [trust], item 3), counted, with the
//! control server as the attacker.
//!
//! A real `lks-control-server` enrols a real agent that trusts one publisher
//! key (`join --trust-key K1.pub --trust-threshold 1`). Then the server is
//! stopped and a rogue server ([`lks_e2e::rogue`]) takes over its address,
//! serving certificate and key: the agent connects to it with its pinned
//! CA and node certificate as it would to the real one. The rogue server
//! first publishes honestly (release 1 naming app@1 and cfg@1, then release
//! 2 naming app@2 and cfg@2, everything signed with K1) and waits until the
//! node holds version 2. Then it attacks, one attack after another, and
//! puts the honest state back after each.
//!
//! An attack is `refused` when the agent said why in the words of the
//! shared rules (a `TrustError`, as its trust status, a bundle's status or
//! an event says it), never reported the attacker's bundle version applied
//! (nor the attacker's release, or a trust root above the honest one,
//! accepted), still names the honest release (version and expiry) in its
//! last trust status, and the node's files still hold version 2 byte for
//! byte. Anything else is `ACCEPTED`, with what gave it
//! away. One `TRUSTATTACK NAME refused|ACCEPTED (REASON)` line per attack
//! is printed (RELIABILITY.md, "Trust attacks", is drawn from them), then
//! a summary, also as a `HOSTILE trust-attacks: …` line, and the test
//! fails, after all have run, if any was accepted.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lks_e2e::agent::Agent;
use lks_e2e::rogue::{RogueServer, ServerTls, state_name};
use lks_e2e::server::Server;
use lks_e2e::trust::{TestBundle, desired, now_ms, release};
use lks_proto::limits::MAX_RELEASE_BYTES;
use lks_proto::pb;
use lks_proto::release::{Release, SignedRelease, SignedRoot, TrustRoot};
use lks_proto::sign::SigningKey;

/// The node's cluster: the channel its releases are for.
#[path = "trust_attacks/lab.rs"]
mod lab;

use lab::{Attack, Honest, Lab, Verdict, is_settled, last_words, said};

const CHANNEL: &str = "c1";
const APP: &str = "/etc/app/app.conf";
const CFG: &str = "/etc/cfg/cfg.conf";
/// How long the agent may take to answer an attack.
const ANSWER: Duration = Duration::from_secs(15);
/// How long the agent may take to settle after its answer (and to hang up
/// an endless stream).
const SETTLE: Duration = Duration::from_secs(5);
/// How long the agent may take to reach a state the server publishes.
const CONVERGE: Duration = Duration::from_secs(30);
const HOUR_MS: i64 = 3_600_000;
/// The clock set back two days: an expiry an hour ago reads as almost two
/// days ahead.
const CLOCK_BACK_MS: i64 = -48 * HOUR_MS;
/// The release the freeze attack lets run out lives this long.
const SHORT_LIFE_MS: i64 = 8_000;
const OFFSET_ENV: &str = "LKS_AGENT_CLOCK_OFFSET_MS";

fn content(name: &str, version: &str) -> Vec<u8> {
    format!("{name} {version}: the publisher's bytes\n").into_bytes()
}

fn bundle(key: &SigningKey, name: &str, version: &str) -> TestBundle {
    let path = if name == "app" { APP } else { CFG };
    TestBundle::new(key, name, version, &[(path, &content(name, version))])
}

fn signed(r: Release, keys: &[&SigningKey]) -> SignedRelease {
    SignedRelease::sign(r, keys)
}

/// The publisher's keys, and the expiry of its honest releases.
struct Keys {
    k1: SigningKey,
    k2: SigningKey,
    forger: SigningKey,
    future: i64,
}

/// Every bundle the rogue server can serve: app@0..5 and cfg@0..3, all
/// signed with K1, and another app@5 (also K1's) that release 9 does not name.
struct Bundles {
    app: Vec<TestBundle>,
    cfg: Vec<TestBundle>,
    evil_app5: TestBundle,
}

/// The bundles the node must not report applied: the attacker's one.
fn attacker(b: &TestBundle) -> Vec<String> {
    vec![b.id()]
}

/// The scenarios, in order: see the module doc and RELIABILITY.md.
#[test]
fn a_rogue_server_gets_nothing_past_the_release_checks() {
    let started = Instant::now();
    let keys = Keys {
        k1: SigningKey::generate(),
        k2: SigningKey::generate(),
        forger: SigningKey::generate(),
        future: now_ms() + 30 * 24 * HOUR_MS,
    };

    let (mut lab, b, r1, r2) = rogue_server_takes_over_a_node_that_holds_release_2(&keys);
    let expired = replays_lower_mixed_and_expired_releases_are_refused(&mut lab, &keys, &b, &r1, &r2);
    forged_foreign_equivocating_and_oversized_releases_are_refused(&mut lab, &keys, &b);
    withheld_bundle(&mut lab, &r2, &b.cfg[2]);
    lab.restore();
    a_clock_set_back_does_not_revive_an_expired_release(&mut lab, &b, &expired);
    an_endless_blob_is_hung_up_on(&mut lab, &keys, &b);
    a_bundle_with_another_digest_is_refused(&mut lab, &keys, &b);
    a_rotated_out_key_and_a_forged_root_are_refused(&mut lab, &keys, &b);

    let r11 = lab.honest.release.clone();
    freeze(&mut lab, 14, &keys.k2);
    stale_server_freeze(&mut lab, 15, &keys.k2, &r11);
    report_and_fail_if_any_was_accepted(lab, started);
}

/// A real server enrols the agent (trusting K1), then a rogue server takes
/// over its address and TLS identity and publishes honestly: release 1,
/// then release 2. Returns the lab, the bundles and releases 1 and 2.
fn rogue_server_takes_over_a_node_that_holds_release_2(
    keys: &Keys,
) -> (Lab, Bundles, SignedRelease, SignedRelease) {
    let (k1, future) = (&keys.k1, keys.future);
    let server = Server::start();
    server.create_cluster(CHANNEL);
    let agent = Agent::new("attacked");
    let (_, k1_pub) = k1
        .write_pair(&agent.work_dir().join("publisher"))
        .expect("write the publisher key");
    let help = String::from_utf8_lossy(&agent.cli(&["join", "--help"]).stdout).into_owned();
    let trust_on = help.contains("--trust-threshold");
    let mut join = vec!["--trust-key", k1_pub.to_str().expect("utf-8 path")];
    if trust_on {
        join.extend(["--trust-threshold", "1"]);
    } else {
        println!("TRUSTATTACK note: this agent has no --trust-threshold: release checks are off");
    }
    agent.join(&server, CHANNEL, &join);

    // The server turns attacker: same address, same TLS identity.
    let mut server = server;
    server.stop();
    let rogue = RogueServer::start(server.addr, &ServerTls::from_data_dir(&server.data_dir));

    let app: Vec<TestBundle> = (0..=5).map(|v| bundle(k1, "app", &v.to_string())).collect();
    let cfg: Vec<TestBundle> = (0..=3).map(|v| bundle(k1, "cfg", &v.to_string())).collect();
    let evil_app5 = TestBundle::new(k1, "app", "5", &[(APP, b"app 5: not what release 9 names\n")]);
    for b in app.iter().chain(&cfg).chain([&evil_app5]) {
        if b.version() != "4" {
            for (_, bytes) in &b.files {
                rogue.add_blob(bytes);
            }
        }
    }
    rogue.add_endless_blob(&content("app", "4"));

    let r1 = signed(release(CHANNEL, 1, future, &[&app[1], &cfg[1]]), &[k1]);
    let r2 = signed(release(CHANNEL, 2, future, &[&app[2], &cfg[2]]), &[k1]);
    let mut lab = Lab {
        rogue,
        agent,
        trust_on,
        honest: Honest {
            release: r1.clone(),
            roots: Vec::new(),
            app: app[1].clone(),
            cfg: cfg[1].clone(),
        },
        stale: Vec::new(),
        results: Vec::new(),
        _server: server,
    };
    lab.agent.start();

    // Honest publishing: release 1, then release 2.
    lab.restore();
    lab.honest = Honest {
        release: r2.clone(),
        roots: Vec::new(),
        app: app[2].clone(),
        cfg: cfg[2].clone(),
    };
    lab.restore();
    assert!(
        lab.rogue.connects() >= 1,
        "the agent connected to the rogue server"
    );
    (lab, Bundles { app, cfg, evil_app5 }, r1, r2)
}

/// An old bundle replayed, a lower release, app@3 mixed into release 2 and
/// an expired release 4: each refused. Returns the expired release.
fn replays_lower_mixed_and_expired_releases_are_refused(
    lab: &mut Lab,
    keys: &Keys,
    b: &Bundles,
    r1: &SignedRelease,
    r2: &SignedRelease,
) -> SignedRelease {
    let (k1, future, app, cfg) = (&keys.k1, keys.future, &b.app, &b.cfg);
    // The publisher's release 3 names app@3 with cfg@3; the server
    // withholds it, and mixes its app@3 with release 2 and cfg@2 below.
    let r3 = signed(release(CHANNEL, 3, future, &[&app[3], &cfg[3]]), &[k1]);
    let (name, released) = app[3].released();
    r3.release
        .admits(&name, &released.version, &released.manifest_digest)
        .expect("release 3 names app@3");
    let expired = signed(
        release(CHANNEL, 4, now_ms() - HOUR_MS, &[&app[3], &cfg[2]]),
        &[k1],
    );

    lab.attack(Attack {
        name: "replay-old-bundle",
        desired: desired(Some(r2), &[], &[&app[1], &cfg[2]]),
        bundles: attacker(&app[1]),
        release: None,
        phrases: &["is not in release"],
        states: &[],
    });
    lab.restore();

    lab.attack(Attack {
        name: "lower-release",
        desired: desired(Some(r1), &[], &[&app[1], &cfg[1]]),
        bundles: vec![app[1].id(), cfg[1].id()],
        release: Some(1),
        phrases: &["is older than release"],
        states: &[],
    });
    lab.restore();

    lab.attack(Attack {
        name: "mix-and-match",
        desired: desired(Some(r2), &[], &[&app[3], &cfg[2]]),
        bundles: attacker(&app[3]),
        release: None,
        phrases: &["is not in release"],
        states: &[],
    });
    lab.restore();

    lab.attack(Attack {
        name: "expired-release",
        desired: desired(Some(&expired), &[], &[&app[3], &cfg[2]]),
        bundles: attacker(&app[3]),
        release: Some(4),
        phrases: &["expired at"],
        states: &[],
    });
    lab.restore();
    expired
}

/// A release signed by a forger, another tenant's release, a second
/// release 2 and a release over MAX_RELEASE_BYTES: each refused.
fn forged_foreign_equivocating_and_oversized_releases_are_refused(lab: &mut Lab, keys: &Keys, b: &Bundles) {
    let (k1, future, app, cfg) = (&keys.k1, keys.future, &b.app, &b.cfg);
    let forged = signed(release(CHANNEL, 5, future, &[&app[3], &cfg[2]]), &[&keys.forger]);
    lab.attack(Attack {
        name: "forged-release",
        desired: desired(Some(&forged), &[], &[&app[3], &cfg[2]]),
        bundles: attacker(&app[3]),
        release: Some(5),
        phrases: &["signatures needed"],
        states: &[],
    });
    lab.restore();

    // Tenant c2's release, honestly signed by the same publisher.
    let other_tenant = signed(release("c2", 3, future, &[&app[3], &cfg[2]]), &[k1]);
    lab.attack(Attack {
        name: "other-channel",
        desired: desired(Some(&other_tenant), &[], &[&app[3], &cfg[2]]),
        bundles: attacker(&app[3]),
        release: Some(3),
        phrases: &["but this node follows c1"],
        states: &[],
    });
    lab.restore();

    // Another release 2 (other bundles, another expiry: a report shows
    // which one the node follows).
    let other2 = signed(release(CHANNEL, 2, future + HOUR_MS, &[&app[3], &cfg[2]]), &[k1]);
    lab.attack(Attack {
        name: "equivocation",
        desired: desired(Some(&other2), &[], &[&app[3], &cfg[2]]),
        bundles: attacker(&app[3]),
        release: None,
        phrases: &["differs from the release"],
        states: &[],
    });
    lab.restore();

    // Over MAX_RELEASE_BYTES (128 KiB): a thousand bundles with long
    // versions, checked below (the byte limit is what is tested, before
    // the count limit).
    let mut big = release(CHANNEL, 6, future, &[&app[3], &cfg[2]]);
    let filler = app[3].released().1.manifest_digest;
    for i in 0..1_000 {
        big.bundles.insert(
            format!("filler-{i:04}"),
            lks_proto::release::ReleasedBundle {
                version: format!("{i}-{}", "x".repeat(120)),
                manifest_digest: filler,
            },
        );
    }
    let big = signed(big, &[k1]);
    let size = prost::Message::encoded_len(&pb::SignedRelease::from(&big));
    assert!(size > MAX_RELEASE_BYTES, "the oversized release is {size} bytes");
    lab.attack(Attack {
        name: "oversized-release",
        desired: desired(Some(&big), &[], &[&app[3], &cfg[2]]),
        bundles: attacker(&app[3]),
        release: Some(6),
        phrases: &["bytes encoded; the limit is"],
        states: &[],
    });
    lab.restore();
}

/// The clock set back two days makes the expired release 4 current
/// again, unless the node remembers when it last accepted something.
fn a_clock_set_back_does_not_revive_an_expired_release(lab: &mut Lab, b: &Bundles, expired: &SignedRelease) {
    let (app, cfg) = (&b.app, &b.cfg);
    lab.restart_agent(CLOCK_BACK_MS);
    lab.attack(Attack {
        name: "clock-set-back",
        desired: desired(Some(expired), &[], &[&app[3], &cfg[2]]),
        bundles: attacker(&app[3]),
        release: Some(4),
        phrases: &["the clock went back"],
        states: &["clock"],
    });
    lab.restart_agent(0);
    lab.restore();
}

/// An honest release 7 names app@4, whose blob never ends: the agent
/// refuses it and hangs up the stream.
fn an_endless_blob_is_hung_up_on(lab: &mut Lab, keys: &Keys, b: &Bundles) {
    let (k1, future, app, cfg) = (&keys.k1, keys.future, &b.app, &b.cfg);
    let r7 = signed(release(CHANNEL, 7, future, &[&app[4], &cfg[2]]), &[k1]);
    lab.honest.release = r7.clone();
    let mut v = lab.judge(Attack {
        name: "endless-blob",
        desired: desired(Some(&r7), &[], &[&app[4], &cfg[2]]),
        bundles: attacker(&app[4]),
        release: None,
        phrases: &["more than the declared"],
        states: &[],
    });
    // The agent must also have hung up: the server's stream task sees it
    // a moment after the agent reports.
    let hung_up = Instant::now();
    while lab.rogue.endless_sent().is_empty() && hung_up.elapsed() < SETTLE {
        std::thread::sleep(Duration::from_millis(50));
    }
    let sent = lab.rogue.endless_sent();
    if let Verdict::Refused(why) = &v {
        v = match sent.iter().max() {
            None => Verdict::Accepted(format!(
                "{why}; but the endless stream was still being read {SETTLE:?} later"
            )),
            Some(most) => Verdict::Refused(format!(
                "{why}; {} fetch(es), each hung up by the agent with at most {most} bytes queued",
                sent.len()
            )),
        };
    }
    lab.verdict("endless-blob", v);
    lab.honest.release = signed(release(CHANNEL, 8, future, &[&app[2], &cfg[2]]), &[k1]);
    lab.restore();
}

/// An honest release 9 names app@5; the server sends another app@5,
/// signed by the same publisher key.
fn a_bundle_with_another_digest_is_refused(lab: &mut Lab, keys: &Keys, b: &Bundles) {
    let (k1, future, app, cfg) = (&keys.k1, keys.future, &b.app, &b.cfg);
    let r9 = signed(release(CHANNEL, 9, future, &[&app[5], &cfg[2]]), &[k1]);
    lab.honest.release = r9.clone();
    lab.attack(Attack {
        name: "digest-mismatch",
        desired: desired(Some(&r9), &[], &[&b.evil_app5, &cfg[2]]),
        bundles: attacker(&b.evil_app5),
        release: None,
        phrases: &["has manifest digest"],
        states: &[],
    });
    lab.honest.release = signed(release(CHANNEL, 10, future, &[&app[2], &cfg[2]]), &[k1]);
    lab.restore();
}

/// Root 2 rotates K1 out for K2 (signed by both, as the rule wants);
/// release 11 and the bundles from now on are K2's (an agent without
/// release checks knows no root: it keeps trusting K1 alone). Then K1
/// alone signs release 12, and the forger brings its own root 3: both
/// refused.
fn a_rotated_out_key_and_a_forged_root_are_refused(lab: &mut Lab, keys: &Keys, b: &Bundles) {
    let (k1, k2, forger, future, app, cfg) = (&keys.k1, &keys.k2, &keys.forger, keys.future, &b.app, &b.cfg);
    let bundle_key = if lab.trust_on { k2 } else { k1 };
    let root2 = TrustRoot {
        version: 2,
        keys: vec![k2.public()],
        threshold: 1,
        expires_at_ms: TrustRoot::NEVER_EXPIRES,
    };
    lab.honest = Honest {
        release: signed(release(CHANNEL, 11, future, &[&app[2], &cfg[2]]), &[k2]),
        roots: vec![SignedRoot::sign(root2, &[k1, k2])],
        app: bundle(bundle_key, "app", "2"),
        cfg: bundle(bundle_key, "cfg", "2"),
    };
    lab.restore();
    let by_old_key = signed(release(CHANNEL, 12, future, &[&app[3], &cfg[2]]), &[k1]);
    lab.attack(Attack {
        name: "rotated-out-key",
        desired: desired(Some(&by_old_key), &lab.honest.roots, &[&app[3], &lab.honest.cfg]),
        bundles: attacker(&app[3]),
        release: Some(12),
        phrases: &["signatures needed from the keys of trust root 2"],
        states: &[],
    });
    lab.restore();

    // The forger's root 3 (its own key only), signed by itself, with its
    // release 13 and its own signature on app@3.
    let root3 = TrustRoot {
        version: 3,
        keys: vec![forger.public()],
        threshold: 1,
        expires_at_ms: TrustRoot::NEVER_EXPIRES,
    };
    let mut roots = lab.honest.roots.clone();
    roots.push(SignedRoot::sign(root3, &[forger]));
    let forged_app3 = bundle(forger, "app", "3");
    let by_forger = signed(
        release(CHANNEL, 13, future, &[&forged_app3, &lab.honest.cfg]),
        &[forger],
    );
    lab.attack(Attack {
        name: "forged-root",
        desired: desired(Some(&by_forger), &roots, &[&forged_app3, &lab.honest.cfg]),
        bundles: attacker(&forged_app3),
        release: Some(13),
        phrases: &["trust root 3 has 0 of the 1 signatures needed from the keys of trust root 2"],
        states: &[],
    });
    lab.restore();
}

/// Prints the summary lines, stops the agent and fails if any attack was
/// accepted.
fn report_and_fail_if_any_was_accepted(mut lab: Lab, started: Instant) {
    let accepted: Vec<&str> = lab
        .results
        .iter()
        .filter(|(_, v)| matches!(v, Verdict::Accepted(_)))
        .map(|(n, _)| *n)
        .collect();
    println!(
        "TRUSTATTACK summary: {} attacks, {} refused, {} accepted{} ({:.1}s)",
        lab.results.len(),
        lab.results.len() - accepted.len(),
        accepted.len(),
        if accepted.is_empty() {
            String::new()
        } else {
            format!(": {}", accepted.join(", "))
        },
        started.elapsed().as_secs_f64()
    );
    // The same counts in the form scripts/reliability.sh reads.
    println!(
        "HOSTILE trust-attacks: tried={} refused={} trust_on={} secs={:.1} accepted={}",
        lab.results.len(),
        lab.results.len() - accepted.len(),
        u8::from(lab.trust_on),
        started.elapsed().as_secs_f64(),
        accepted.len()
    );
    lab.agent.stop();
    assert!(accepted.is_empty(), "attacks accepted: {}", accepted.join(", "));
}

/// The server leaves app out of the desired state while release 2 still
/// names it: app must stay installed.
fn withheld_bundle(lab: &mut Lab, r2: &SignedRelease, cfg2: &TestBundle) {
    let mark = lab.rogue.mark();
    let sent = Instant::now();
    let g = lab.rogue.send_desired(desired(Some(r2), &[], &[cfg2]));
    // A report for this generation with nothing in flight, a second on at
    // least, so that a removal has had its time.
    let answer = lab.rogue.wait_for(mark, ANSWER, |r| {
        (r.at >= sent + Duration::from_secs(1)
            && r.heard.generation().is_some_and(|x| x >= g)
            && r.heard.bundles().iter().all(is_settled))
        .then(|| r.heard.clone())
    });
    let v = match answer {
        None => Verdict::Accepted(format!("no report for generation {g} within {ANSWER:?}")),
        Some(h) => match h.bundles().iter().find(|b| b.name == "app") {
            Some(b) if b.version == "2" && b.state == pb::BundleState::Applied as i32 => {
                match lab.files_changed() {
                    Some(diff) => Verdict::Accepted(diff),
                    None if b.message.is_empty() => Verdict::Refused("app@2 kept, applied".into()),
                    None => Verdict::Refused(format!("app@2 kept, applied: {}", b.message)),
                }
            }
            Some(b) => Verdict::Accepted(format!(
                "app@{} {}: {}",
                b.version,
                state_name(b.state),
                b.message
            )),
            None => Verdict::Accepted(match lab.files_changed() {
                Some(diff) => format!("app removed: {diff}"),
                None => "app no longer reported".into(),
            }),
        },
    };
    lab.verdict("withheld-bundle", v);
}

/// Sends the honest bundles with release `version`, signed by `key` and
/// expiring [`SHORT_LIFE_MS`] from now, and waits until the node follows it.
/// Not `restore`, which wants trust `ok`: on a slow machine the node may
/// already call the release stale when it first reports it.
fn take_short_release(lab: &mut Lab, version: u64, key: &SigningKey) {
    let expires = now_ms() + SHORT_LIFE_MS;
    let (app, cfg) = (&lab.honest.app, &lab.honest.cfg);
    lab.honest.release = signed(release(CHANNEL, version, expires, &[app, cfg]), &[key]);
    let mark = lab.rogue.mark();
    let g = lab.rogue.send_desired(lab.honest.desired());
    let trust_on = lab.trust_on;
    let taken = lab.rogue.wait_for(mark, CONVERGE, |r| {
        let generation = r.heard.generation().is_some_and(|x| x >= g);
        let release = !trust_on || r.heard.trust().is_some_and(|t| t.release_version == version);
        (generation && release).then_some(())
    });
    assert!(
        taken.is_some(),
        "release {version} was not accepted within {CONVERGE:?}; the node said:\n{}",
        said(&lab.rogue.records_since(mark))
    );
}

/// The server stops sending newer releases: the node's release runs out
/// and the node must say so (`stale-release`) rather than go on quietly.
fn freeze(lab: &mut Lab, version: u64, key: &SigningKey) {
    let mark = lab.rogue.mark();
    take_short_release(lab, version, key);
    let wait = Duration::from_millis(SHORT_LIFE_MS as u64) + ANSWER;
    let stale = lab.rogue.wait_for(mark, wait, |r| {
        let t = r.heard.trust()?;
        (t.state == "stale-release").then(|| format!("trust {}: {}", t.state, t.message))
    });
    let v = match (stale, lab.files_changed()) {
        (Some(_), Some(diff)) => Verdict::Accepted(diff),
        (Some(why), None) => Verdict::Refused(why),
        (None, _) => Verdict::Accepted(format!(
            "no stale-release reported within {wait:?} of release {version} running out; the node said: {}",
            last_words(&lab.rogue.records_since(mark))
        )),
    };
    lab.verdict("freeze", v);
}

/// A stale server (say, restored from an old backup) replays an older,
/// genuine release after the node took a newer one, and goes on doing so.
/// The node refuses it; once its own release runs out it must say
/// `stale-release`, the refusal kept as detail, not `refused` for ever:
/// that is exactly the freeze such a server causes.
fn stale_server_freeze(lab: &mut Lab, version: u64, key: &SigningKey, older: &SignedRelease) {
    take_short_release(lab, version, key);
    let mark = lab.rogue.mark();
    let (app, cfg) = (&lab.honest.app, &lab.honest.cfg);
    lab.rogue
        .send_desired(desired(Some(older), &lab.honest.roots, &[app, cfg]));
    let refusal = format!("is older than release {version}");
    let wait = Duration::from_millis(SHORT_LIFE_MS as u64) + ANSWER;
    let stale = lab.rogue.wait_for(mark, wait, |r| {
        let t = r.heard.trust()?;
        (t.state == "stale-release" && t.release_version == version && t.message.contains(&refusal))
            .then(|| format!("trust {}: {}", t.state, t.message))
    });
    let v = match (stale, lab.files_changed()) {
        (Some(_), Some(diff)) => Verdict::Accepted(diff),
        (Some(why), None) => Verdict::Refused(why),
        (None, _) => Verdict::Accepted(format!(
            "no stale-release naming the refusal ({refusal:?}) within {wait:?} of release {version} running out; \
             the node said: {}",
            last_words(&lab.rogue.records_since(mark))
        )),
    };
    lab.verdict("stale-server-freeze", v);
}
