//! What checking a signed release record costs a node (issue 30: "checking
//! a record costs < 1 ms"): `TrustState::accept_release` on a release of
//! 256 bundles (the most one may name), signed 1-of-1 and 3-of-5, against
//! the floor of the same work done by hand: one SHA-256 of the encoded
//! record and one ed25519 verification per counted signature.
//!
//! `cargo run --release -p lks-bundle --example release_check [ROUNDS]`
//! prints the median of ROUNDS (default 2000) of each, in microseconds.

// A measurement, not a service: a check that fails stops it with the step
// that failed, like a test.
#![allow(clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Instant;

use lks_bundle::Digest;
use lks_bundle::release::{Release, ReleasedBundle, SignedRelease, TrustRoot, TrustState};
use lks_bundle::sign::SigningKey;

fn median_us(rounds: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn release(bundles: usize) -> Release {
    let bundles: BTreeMap<String, ReleasedBundle> = (0..bundles)
        .map(|i| {
            (
                format!("bundle-{i:03}"),
                ReleasedBundle {
                    version: format!("1.{i}.0-1"),
                    manifest_digest: Digest::of(format!("manifest {i}").as_bytes()),
                },
            )
        })
        .collect();
    Release {
        channel: "tenant-a".into(),
        version: 7,
        expires_at_ms: i64::MAX,
        bundles,
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let keys: Vec<SigningKey> = (0..5).map(|_| SigningKey::generate()).collect();
    let r = release(256);
    let encoded = r.encode();
    println!(
        "release of {} bundles, {} bytes encoded; median of {rounds} runs",
        r.bundles.len(),
        encoded.len()
    );
    for (threshold, signers) in [(1usize, 1usize), (3, 5)] {
        let root = TrustRoot::initial(keys[..signers].iter().map(SigningKey::public), threshold as u32)
            .expect("a valid root");
        let signed = SignedRelease::sign(r.clone(), &keys[..signers].iter().collect::<Vec<_>>());
        let state = TrustState::new(root);
        let check = median_us(rounds, || {
            let mut s = state.clone();
            s.accept_release(&signed, "tenant-a", 1_800_000_000_000)
                .expect("accepted");
        });
        // The floor: hash the record once, verify `threshold` signatures.
        let publics: Vec<_> = keys[..signers].iter().map(SigningKey::public).collect();
        let floor = median_us(rounds, || {
            let bytes = r.encode();
            let _ = Digest::of(&bytes);
            for (k, s) in publics.iter().zip(&signed.signatures).take(threshold) {
                let vk = ed25519_dalek::VerifyingKey::from_bytes(&k.to_bytes()).expect("key");
                let sig = ed25519_dalek::Signature::from_bytes(&s.signature);
                vk.verify_strict(&bytes, &sig).expect("verifies");
            }
        });
        println!(
            "accept_release {threshold}-of-{signers}: {check:.1} us  (floor: encode + sha256 + {threshold} ed25519 verify: {floor:.1} us)"
        );
    }
}
