use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::digest::Digest;
use crate::limits::{MAX_RELEASE_BUNDLES, MAX_RELEASE_BYTES, MAX_ROOT_BYTES, MAX_ROOT_KEYS, MAX_SIGNATURES};
use crate::sign::{PublisherKey, SigningKey};

const CH: &str = "tenant-a";
const NOW: i64 = 1_800_000_000_000;
const DAY: i64 = 86_400_000;

fn release(version: u64, kubelet: &str) -> Release {
    let mut bundles = BTreeMap::new();
    bundles.insert(
        "kubelet".to_string(),
        ReleasedBundle {
            version: kubelet.into(),
            manifest_digest: Digest::of(kubelet.as_bytes()),
        },
    );
    bundles.insert(
        "containerd".to_string(),
        ReleasedBundle {
            version: "1.7.2".into(),
            manifest_digest: Digest::of(b"containerd 1.7.2"),
        },
    );
    Release {
        channel: CH.into(),
        version,
        expires_at_ms: NOW + DAY,
        bundles,
    }
}

fn keys(n: usize) -> Vec<SigningKey> {
    (0..n).map(|_| SigningKey::generate()).collect()
}

fn state(keys: &[SigningKey], threshold: u32) -> TrustState {
    TrustState::new(TrustRoot::initial(keys.iter().map(SigningKey::public), threshold).unwrap())
}

fn root(version: u64, keys: &[&SigningKey], threshold: u32) -> TrustRoot {
    TrustRoot {
        version,
        keys: keys.iter().map(|k| k.public()).collect(),
        threshold,
        expires_at_ms: NOW + 365 * DAY,
    }
}

fn threshold_err(e: TrustError) -> (usize, Vec<String>) {
    match e {
        TrustError::Threshold { valid, bad, .. } => (valid, bad),
        other => panic!("expected a threshold error, got {other}"),
    }
}

#[test]
fn a_threshold_of_distinct_listed_keys_is_needed() {
    let k = keys(3);
    let mut s = state(&k, 2);
    // One key, however many times it signs, counts once.
    let mut once = SignedRelease::sign(release(1, "1.29"), &[&k[0], &k[0]]);
    once.signatures.push(once.signatures[0].clone());
    let e = s.accept_release(&once, CH, NOW).unwrap_err();
    assert_eq!(threshold_err(e.clone()), (1, vec![]));
    assert_eq!(
        e.to_string(),
        "release 1 of tenant-a has 1 of the 2 signatures needed from the keys of trust root 1"
    );
    // Unknown keys are ignored, not an error, and do not count.
    let stranger = SigningKey::generate();
    let mut with_stranger = SignedRelease::sign(release(1, "1.29"), &[&stranger, &k[0]]);
    with_stranger.signatures.push(KeySignature {
        public_key: [0xff; 32],
        signature: [0; 64],
    });
    assert_eq!(
        threshold_err(s.accept_release(&with_stranger, CH, NOW).unwrap_err()).0,
        1
    );
    with_stranger
        .signatures
        .push(k[2].sign_release(&with_stranger.release));
    s.accept_release(&with_stranger, CH, NOW).unwrap();
    assert_eq!(s.release_version, 1);
}

#[test]
fn a_bad_signature_by_a_listed_key_does_not_count_and_is_named() {
    let k = keys(2);
    let mut s = state(&k, 2);
    let mut signed = SignedRelease::sign(release(1, "1.29"), &[&k[0], &k[1]]);
    signed.signatures[1].signature[5] ^= 1;
    let before = s.clone();
    let e = s.accept_release(&signed, CH, NOW).unwrap_err();
    assert_eq!(threshold_err(e.clone()), (1, vec![k[1].public().fingerprint()]));
    assert!(
        e.to_string()
            .ends_with(&format!("(bad signature by {})", k[1].public().fingerprint()))
    );
    assert_eq!(s, before, "a refused release leaves the state as it was");
    // A good signature by the same key next to the bad one counts, and the
    // key is not blamed.
    signed.signatures.push(k[1].sign_release(&signed.release));
    s.accept_release(&signed, CH, NOW).unwrap();
    // A signature over another record does not verify for this one.
    let other = release(2, "1.30");
    let forged = SignedRelease {
        release: other,
        signatures: signed.signatures.clone(),
    };
    assert_eq!(
        threshold_err(s.accept_release(&forged, CH, NOW).unwrap_err()).0,
        0
    );
}

#[test]
fn a_key_with_a_good_signature_is_not_blamed_for_a_bad_one() {
    let k = keys(3);
    let mut s = state(&k, 3);
    let mut signed = SignedRelease::sign(release(1, "1.29"), &[&k[0], &k[1]]);
    let mut broken = signed.signatures[0].clone();
    broken.signature[0] ^= 1;
    signed.signatures.insert(0, broken.clone());
    signed.signatures.push(broken);
    assert_eq!(
        threshold_err(s.accept_release(&signed, CH, NOW).unwrap_err()),
        (2, vec![])
    );
}

#[test]
fn rollback_is_refused_and_a_newer_release_can_name_older_bundles() {
    let k = keys(1);
    let mut s = state(&k, 1);
    s.accept_release(&SignedRelease::sign(release(9, "1.30"), &[&k[0]]), CH, NOW)
        .unwrap();
    let old = SignedRelease::sign(release(7, "1.29"), &[&k[0]]);
    let e = s.accept_release(&old, CH, NOW).unwrap_err();
    assert_eq!(
        e,
        TrustError::Rollback {
            channel: CH.into(),
            got: 7,
            have: 9
        }
    );
    assert_eq!(
        e.to_string(),
        "release 7 of tenant-a is older than release 9 this node already accepted \
         (a rollback needs a newer signed release)"
    );
    let back = s
        .accept_release(&SignedRelease::sign(release(10, "1.29"), &[&k[0]]), CH, NOW)
        .unwrap();
    assert_eq!(back.bundles["kubelet"].version, "1.29");
    assert_eq!(s.release_version, 10);
}

#[test]
fn the_same_release_again_is_no_change_and_a_different_one_is_refused() {
    let k = keys(1);
    let mut s = state(&k, 1);
    let r = SignedRelease::sign(release(3, "1.29"), &[&k[0]]);
    assert_eq!(s.accept_release(&r, CH, NOW).unwrap(), r.release);
    assert_eq!(s.accept_release(&r, CH, NOW + 1).unwrap(), r.release);
    assert_eq!(s.release_digest, Some(r.release.digest()));
    let other = SignedRelease::sign(release(3, "1.30"), &[&k[0]]);
    let e = s.accept_release(&other, CH, NOW + 2).unwrap_err();
    assert_eq!(
        e,
        TrustError::Equivocation {
            channel: CH.into(),
            version: 3
        }
    );
    // Re-signed for freshness under the same version: also a different record.
    let mut fresher = release(3, "1.29");
    fresher.expires_at_ms += DAY;
    let fresher = SignedRelease::sign(fresher, &[&k[0]]);
    assert!(matches!(
        s.accept_release(&fresher, CH, NOW + 3),
        Err(TrustError::Equivocation { .. })
    ));
}

#[test]
fn an_expired_release_is_refused_and_the_state_kept() {
    let k = keys(1);
    let mut s = state(&k, 1);
    let r = SignedRelease::sign(release(1, "1.29"), &[&k[0]]);
    let at = r.release.expires_at_ms;
    s.accept_release(&r, CH, at - 1).unwrap();
    let before = s.clone();
    let e = s.accept_release(&r, CH, at).unwrap_err();
    assert_eq!(
        e,
        TrustError::Expired {
            channel: CH.into(),
            version: 1,
            at,
            now: at
        }
    );
    assert_eq!(
        e.to_string(),
        "release 1 of tenant-a expired at 2027-01-16T08:00:00Z and the node's clock reads \
         2027-01-16T08:00:00Z (the publisher must sign a fresh release)"
    );
    assert_eq!(s, before);
    // A newer, fresh release is accepted after it.
    let mut next = release(2, "1.29");
    next.expires_at_ms = at + DAY;
    s.accept_release(&SignedRelease::sign(next, &[&k[0]]), CH, at + 5)
        .unwrap();
}

#[test]
fn the_clock_may_not_go_back_and_the_latest_time_only_rises() {
    let k = keys(1);
    let mut s = state(&k, 1);
    s.accept_release(&SignedRelease::sign(release(1, "1.29"), &[&k[0]]), CH, NOW)
        .unwrap();
    assert_eq!(s.latest_known_time_ms, NOW);
    let next = SignedRelease::sign(release(2, "1.30"), &[&k[0]]);
    let e = s.accept_release(&next, CH, NOW - 1).unwrap_err();
    assert_eq!(
        e,
        TrustError::ClockWentBack {
            now: NOW - 1,
            latest_known: NOW
        }
    );
    assert_eq!(s.latest_known_time_ms, NOW);
    assert_eq!(
        e.to_string(),
        "the node's clock reads 2027-01-15T07:59:59.999Z, earlier than 2027-01-15T08:00:00Z when it \
         last accepted signed metadata (the clock went back; fix it before accepting releases)"
    );
    // Refused records never raise it; accepted ones do.
    let stale = SignedRelease::sign(release(1, "1.29"), &[&k[0]]);
    s.accept_release(&stale, CH, NOW + DAY).unwrap_err();
    assert_eq!(s.latest_known_time_ms, NOW);
    s.accept_release(&next, CH, NOW + 10).unwrap();
    assert_eq!(s.latest_known_time_ms, NOW + 10);
    // The clock guard applies to root rotations too.
    let k2 = SigningKey::generate();
    let r2 = SignedRoot::sign(root(2, &[&k[0], &k2], 1), &[&k[0], &k2]);
    assert!(matches!(
        s.accept_root(&r2, NOW),
        Err(TrustError::ClockWentBack { .. })
    ));
    s.accept_root(&r2, NOW + 20).unwrap();
    assert_eq!(s.latest_known_time_ms, NOW + 20);
}

#[test]
fn a_release_for_another_channel_is_refused() {
    let k = keys(1);
    let mut s = state(&k, 1);
    let mut r = release(1, "1.29");
    r.channel = "tenant-b".into();
    let e = s
        .accept_release(&SignedRelease::sign(r, &[&k[0]]), CH, NOW)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "release 1 is for tenant-b, but this node follows tenant-a"
    );
}

#[test]
fn only_the_released_bundle_versions_and_digests_are_admitted() {
    let r = release(4, "1.29");
    r.admits("kubelet", "1.29", &Digest::of(b"1.29")).unwrap();
    let e = r.admits("kubelet", "1.30", &Digest::of(b"1.30")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "bundle kubelet@1.30 is not in release 4 of tenant-a (it releases version 1.29)"
    );
    let e = r.admits("etcd", "3.5", &Digest::of(b"3.5")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "bundle etcd@3.5 is not in release 4 of tenant-a (it releases no such bundle)"
    );
    // The released version with other content: a signed bundle of another
    // release under the same version string.
    let e = r.admits("kubelet", "1.29", &Digest::of(b"other")).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "bundle kubelet@1.29 has manifest digest {}, but release 4 of tenant-a released it with {}",
            Digest::of(b"other"),
            Digest::of(b"1.29")
        )
    );
}

#[test]
fn a_root_rotates_with_both_thresholds() {
    let k = keys(4);
    let mut s = state(&k[..2], 2);
    let next = root(2, &[&k[1], &k[2], &k[3]], 2);
    // Old threshold (k0, k1) and new threshold (k1, k2).
    let ok = SignedRoot::sign(next.clone(), &[&k[0], &k[1], &k[2]]);
    // Missing the old root's threshold: only k1 of the old keys.
    let no_old = SignedRoot::sign(next.clone(), &[&k[1], &k[2], &k[3]]);
    let e = s.accept_root(&no_old, NOW).unwrap_err();
    assert_eq!(
        e.to_string(),
        "trust root 2 has 1 of the 2 signatures needed from the keys of trust root 1"
    );
    // Missing its own threshold: only k1 of the new keys.
    let no_new = SignedRoot::sign(next.clone(), &[&k[0], &k[1]]);
    let e = s.accept_root(&no_new, NOW).unwrap_err();
    assert_eq!(
        e.to_string(),
        "trust root 2 has 1 of the 2 signatures needed from its own keys"
    );
    assert_eq!(s.root.version, 1, "refused rotations change nothing");
    s.accept_root(&ok, NOW).unwrap();
    assert_eq!(s.root, next);

    // k0 was rotated out: it no longer counts for releases…
    let by_old = SignedRelease::sign(release(1, "1.29"), &[&k[0], &k[1]]);
    assert_eq!(
        threshold_err(s.accept_release(&by_old, CH, NOW).unwrap_err()).0,
        1
    );
    s.accept_release(&SignedRelease::sign(release(1, "1.29"), &[&k[2], &k[3]]), CH, NOW)
        .unwrap();
    // …nor for the next root.
    let third = root(3, &[&k[2], &k[3]], 1);
    let by_old = SignedRoot::sign(third.clone(), &[&k[0], &k[2]]);
    assert_eq!(threshold_err(s.accept_root(&by_old, NOW).unwrap_err()).0, 1);
    s.accept_root(&SignedRoot::sign(third, &[&k[1], &k[2]]), NOW)
        .unwrap();
    assert_eq!(s.root.version, 3);
}

#[test]
fn roots_rotate_one_version_at_a_time() {
    let k = keys(2);
    let mut s = state(&k[..1], 1);
    let skip = SignedRoot::sign(root(3, &[&k[0], &k[1]], 1), &[&k[0], &k[1]]);
    let e = s.accept_root(&skip, NOW).unwrap_err();
    assert_eq!(
        e.to_string(),
        "trust root 3 cannot follow trust root 1: roots rotate one version at a time (expected trust root 2)"
    );
    let same = SignedRoot::sign(root(1, &[&k[0], &k[1]], 1), &[&k[0], &k[1]]);
    assert!(matches!(
        s.accept_root(&same, NOW),
        Err(TrustError::RootVersion { .. })
    ));
    // The chain 1 → 2 → 3 applies one at a time.
    s.accept_root(&SignedRoot::sign(root(2, &[&k[0], &k[1]], 1), &[&k[0]]), NOW)
        .unwrap();
    s.accept_root(&skip, NOW).unwrap();
    assert_eq!(s.root.version, 3);
}

#[test]
fn expired_roots_are_refused_and_stop_releases() {
    let k = keys(1);
    let mut s = state(&k, 1);
    let mut r2 = root(2, &[&k[0]], 1);
    r2.expires_at_ms = NOW;
    let e = s
        .accept_root(&SignedRoot::sign(r2.clone(), &[&k[0]]), NOW)
        .unwrap_err();
    assert!(matches!(e, TrustError::RootExpired { version: 2, .. }), "{e}");
    s.accept_root(&SignedRoot::sign(r2, &[&k[0]]), NOW - 1).unwrap();
    // Once the current root has expired, no release is accepted…
    let rel = SignedRelease::sign(release(1, "1.29"), &[&k[0]]);
    let e = s.accept_release(&rel, CH, NOW).unwrap_err();
    assert!(e.to_string().starts_with("trust root 2 expired at"), "{e}");
    // …until a new root is.
    s.accept_root(&SignedRoot::sign(root(3, &[&k[0]], 1), &[&k[0]]), NOW)
        .unwrap();
    s.accept_release(&rel, CH, NOW).unwrap();
    // The initial root never expires.
    assert!(!state(&k, 1).root.is_expired(i64::MAX));
}

#[test]
fn records_are_bounded_and_validated_before_signatures() {
    let k = keys(1);
    let mut s = state(&k, 1);
    let mut many = SignedRelease::sign(release(1, "1.29"), &[&k[0]]);
    many.signatures = vec![many.signatures[0].clone(); MAX_SIGNATURES + 1];
    assert!(matches!(
        s.accept_release(&many, CH, NOW),
        Err(TrustError::TooManySignatures { .. })
    ));
    let mut big = release(1, "1.29");
    for i in 0..MAX_RELEASE_BUNDLES {
        big.bundles.insert(
            format!("b{i}"),
            ReleasedBundle {
                version: "1".into(),
                manifest_digest: Digest::of(b"x"),
            },
        );
    }
    assert!(matches!(big.validate(), Err(TrustError::TooManyBundles { .. })));
    let bad: Vec<fn(&mut Release)> = vec![
        |r| r.channel = "Tenant".into(),
        |r| r.channel = "tenant-".into(),
        |r| r.version = 0,
        |r| {
            let b = r.bundles.remove("kubelet").unwrap();
            r.bundles.insert("Kubelet".into(), b);
        },
        |r| r.bundles.get_mut("kubelet").unwrap().version = "1\n2".into(),
        |r| r.bundles.get_mut("kubelet").unwrap().version = String::new(),
    ];
    for (i, f) in bad.into_iter().enumerate() {
        let mut r = release(1, "1.29");
        f(&mut r);
        // Validated before signatures: even a well-signed one is refused.
        let e = s
            .accept_release(&SignedRelease::sign(r, &[&k[0]]), CH, NOW)
            .unwrap_err();
        assert!(!matches!(e, TrustError::Threshold { .. }), "case {i}: {e}");
    }
    let e = release(1, "1.29");
    let mut e2 = e.clone();
    e2.bundles.get_mut("kubelet").unwrap().version = "1\n2".into();
    assert_eq!(
        e2.validate().unwrap_err().to_string(),
        "release 1 of tenant-a, bundle kubelet: version \"1\\n2\" contains a control character"
    );
}

#[test]
fn trust_roots_follow_their_rules() {
    let k = keys(MAX_ROOT_KEYS + 1);
    let publics = || k.iter().map(SigningKey::public);
    assert!(matches!(
        TrustRoot::initial(publics(), 1),
        Err(TrustError::TooManyKeys { .. })
    ));
    assert!(matches!(
        TrustRoot::initial(std::iter::empty::<PublisherKey>(), 1),
        Err(TrustError::NoKeys { .. })
    ));
    assert!(matches!(
        TrustRoot::initial(publics().take(2), 3),
        Err(TrustError::BadThreshold { .. })
    ));
    assert!(matches!(
        TrustRoot::initial(publics().take(2), 0),
        Err(TrustError::BadThreshold { .. })
    ));
    // Repeats in the configuration are dropped: two distinct keys.
    let r = TrustRoot::initial([k[0].public(), k[1].public(), k[0].public()], 2).unwrap();
    assert_eq!(r.keys.len(), 2);
    // A received root that lists a key twice is refused.
    let mut dup = root(2, &[&k[0], &k[1], &k[0]], 2);
    assert!(matches!(dup.validate(), Err(TrustError::DuplicateKey { .. })));
    dup.keys.pop();
    dup.validate().unwrap();
    // Key order carries no meaning.
    let mut swapped = dup.clone();
    swapped.keys.reverse();
    assert_eq!(swapped.encode(), dup.encode());
}

/// A fixed record encodes to fixed bytes: an accidental change to the
/// encoding would invalidate every signature already given. The digests
/// were computed apart from this code, from the layouts documented on `encode`.
/// The key is RFC 8032's first test vector.
#[test]
fn the_canonical_encodings_are_pinned() {
    let r = release(7, "1.29.3");
    assert_eq!(
        r.digest().to_string(),
        "sha256:3cc2e8ca9f08aa086586593e6642b8df7b192ff0eababccd14287cf95d28dd04"
    );
    let key = PublisherKey::from_bytes(&[
        0xd7, 0x5a, 0x98, 0x01, 0x82, 0xb1, 0x0a, 0xb7, 0xd5, 0x4b, 0xfe, 0xd3, 0xc9, 0x64, 0x07, 0x3a, 0x0e,
        0xe1, 0x72, 0xf3, 0xda, 0xa6, 0x23, 0x25, 0xaf, 0x02, 0x1a, 0x68, 0xf7, 0x07, 0x51, 0x1a,
    ])
    .unwrap();
    let root = TrustRoot {
        version: 2,
        keys: vec![key],
        threshold: 1,
        expires_at_ms: NOW,
    };
    assert_eq!(
        Digest::of(&root.encode()).to_string(),
        "sha256:deb63d10e6d5db655392dd5e3521cf2011f599acc5fd7585666531d4fcb0672e"
    );
    assert!(r.encode().starts_with(RELEASE_DOMAIN));
    assert!(root.encode().starts_with(ROOT_DOMAIN));
}

#[test]
fn every_field_changes_the_release_encoding() {
    let base = release(1, "1.29").encode();
    let mutations: Vec<fn(&mut Release)> = vec![
        |r| r.channel.push('b'),
        |r| r.version += 1,
        |r| r.expires_at_ms += 1,
        |r| r.bundles.get_mut("kubelet").unwrap().version.push('1'),
        |r| r.bundles.get_mut("kubelet").unwrap().manifest_digest = Digest::of(b"x"),
        |r| {
            r.bundles.remove("containerd");
        },
        // Moving a character between a name and its version must not collide.
        |r| {
            let b = r.bundles.remove("kubelet").unwrap();
            r.bundles.insert(
                "kubelet1".into(),
                ReleasedBundle {
                    version: ".29".into(),
                    ..b
                },
            );
        },
    ];
    for (i, f) in mutations.into_iter().enumerate() {
        let mut r = release(1, "1.29");
        f(&mut r);
        assert_ne!(r.encode(), base, "mutation {i} left the encoding unchanged");
    }
}

#[test]
fn every_field_changes_the_root_encoding() {
    let k = keys(3);
    let base = root(2, &[&k[0], &k[1]], 1);
    let mutations: Vec<fn(&mut TrustRoot, PublisherKey)> = vec![
        |r, _| r.version += 1,
        |r, _| r.expires_at_ms += 1,
        |r, _| r.threshold += 1,
        |r, _| {
            r.keys.pop();
        },
        |r, other| r.keys[1] = other,
    ];
    for (i, f) in mutations.into_iter().enumerate() {
        let mut r = base.clone();
        f(&mut r, k[2].public());
        assert_ne!(
            r.encode(),
            base.encode(),
            "mutation {i} left the encoding unchanged"
        );
    }
}

/// Each refusal is one line: the attack suite prints it after
/// `TRUSTATTACK name refused: `.
#[test]
fn every_error_is_one_line() {
    let k = keys(2);
    let mut s = state(&k, 2);
    let r = release(1, "1.29");
    let mut errors = vec![
        s.accept_release(&SignedRelease::sign(r.clone(), &[&k[0]]), CH, NOW)
            .unwrap_err(),
        s.accept_release(&SignedRelease::sign(r.clone(), &[]), "tenant-b", NOW)
            .unwrap_err(),
        r.admits("kubelet", "1.30", &Digest::of(b"x")).unwrap_err(),
        r.admits("kubelet", "1.29", &Digest::of(b"x")).unwrap_err(),
        TrustRoot::initial(std::iter::empty::<PublisherKey>(), 1).unwrap_err(),
        TrustRoot::initial([k[0].public()], 2).unwrap_err(),
        root(2, &[&k[0], &k[0]], 1).validate().unwrap_err(),
    ];
    s.accept_release(&SignedRelease::sign(r.clone(), &[&k[0], &k[1]]), CH, NOW)
        .unwrap();
    let mut r2 = r.clone();
    r2.bundles.clear();
    errors.extend([
        s.accept_release(&SignedRelease::sign(r2, &[&k[0], &k[1]]), CH, NOW)
            .unwrap_err(),
        s.accept_release(&SignedRelease::sign(r.clone(), &[&k[0], &k[1]]), CH, NOW - 1)
            .unwrap_err(),
        s.accept_release(&SignedRelease::sign(r, &[&k[0], &k[1]]), CH, NOW + DAY)
            .unwrap_err(),
        s.accept_root(&SignedRoot::sign(root(3, &[&k[0]], 1), &[]), NOW)
            .unwrap_err(),
    ]);
    for e in errors {
        let line = e.to_string();
        assert!(!line.is_empty() && !line.contains('\n'), "{line:?}");
    }
}

#[test]
fn a_maximal_signed_record_fits_the_byte_limits() {
    let name = |i: usize| format!("{i:0>63}");
    let mut r = release(u64::MAX, "1");
    r.channel = "c".repeat(crate::limits::MAX_NAME_LEN);
    r.bundles = (0..MAX_RELEASE_BUNDLES)
        .map(|i| {
            let b = ReleasedBundle {
                version: "v".repeat(crate::limits::MAX_VERSION_LEN),
                manifest_digest: Digest::of(b"x"),
            };
            (name(i), b)
        })
        .collect();
    r.validate().unwrap();
    // Generous wire framing: 16 bytes per field on top of the raw bytes.
    let fields = 4 + 3 * MAX_RELEASE_BUNDLES + 2 * MAX_SIGNATURES;
    let wire = r.encode().len() + MAX_SIGNATURES * (32 + 64) + 16 * fields;
    assert!(wire <= MAX_RELEASE_BYTES, "{wire} > {MAX_RELEASE_BYTES}");
    let k = keys(MAX_ROOT_KEYS);
    let root = TrustRoot::initial(k.iter().map(SigningKey::public), 1).unwrap();
    let fields = 4 + MAX_ROOT_KEYS + 2 * MAX_SIGNATURES;
    let wire = root.encode().len() + MAX_SIGNATURES * (32 + 64) + 16 * fields;
    assert!(wire <= MAX_ROOT_BYTES, "{wire} > {MAX_ROOT_BYTES}");
}

#[test]
fn signatures_do_not_cross_record_kinds() {
    let k = keys(1);
    let mut s = state(&k, 1);
    // A root signature presented as a release signature, and a manifest
    // signature: different domains, so neither verifies.
    let r = release(1, "1.29");
    let root_sig = k[0].sign_root(&s.root);
    let manifest_sig = k[0].sign(&crate::manifest::tests::sample());
    for sig in [root_sig.signature, manifest_sig.signature] {
        let signed = SignedRelease {
            release: r.clone(),
            signatures: vec![KeySignature {
                public_key: k[0].public().to_bytes(),
                signature: sig,
            }],
        };
        assert!(matches!(
            s.accept_release(&signed, CH, NOW),
            Err(TrustError::Threshold { .. })
        ));
    }
}

#[test]
fn trust_state_round_trips_through_json() {
    let k = keys(3);
    let mut s = state(&k, 2);
    s.accept_release(&SignedRelease::sign(release(5, "1.29"), &[&k[0], &k[2]]), CH, NOW)
        .unwrap();
    let json = serde_json::to_string(&s).unwrap();
    let back: TrustState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, s);
    assert!(json.contains(&hex::encode(k[1].public().to_bytes())), "{json}");
    // A state written without a digest still reads.
    let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v.as_object_mut().unwrap().remove("release_digest");
    let old: TrustState = serde_json::from_value(v).unwrap();
    assert_eq!(old.release_digest, None);
    // A key that is not a key is refused.
    let bad = json.replace(&hex::encode(k[1].public().to_bytes()), &"zz".repeat(32));
    assert!(serde_json::from_str::<TrustState>(&bad).is_err());
    let r = release(1, "1.29");
    let back: Release = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back, r);
}

fn arb_release() -> impl Strategy<Value = Release> {
    (
        "[a-z][a-z0-9-]{0,8}[a-z0-9]",
        1u64..5,
        any::<i64>(),
        proptest::collection::btree_map("[a-z][a-z0-9-]{0,6}", ("[a-z0-9.]{1,6}", any::<[u8; 4]>()), 0..4),
    )
        .prop_map(|(channel, version, expires_at_ms, bundles)| Release {
            channel,
            version,
            expires_at_ms,
            bundles: bundles
                .into_iter()
                .map(|(n, (v, d))| {
                    let b = ReleasedBundle {
                        version: v,
                        manifest_digest: Digest::of(&d),
                    };
                    (n, b)
                })
                .collect(),
        })
}

proptest! {
    #[test]
    fn encode_is_injective(a in arb_release(), b in arb_release()) {
        prop_assert_eq!(a == b, a.encode() == b.encode());
    }

    #[test]
    fn a_signature_does_not_cover_another_record(a in arb_release(), b in arb_release()) {
        prop_assume!(a != b);
        let key = SigningKey::generate();
        let mut s = TrustState::new(TrustRoot::initial([key.public()], 1).unwrap());
        let forged = SignedRelease { release: b.clone(), signatures: vec![key.sign_release(&a)] };
        let ok = |r: Result<Release, TrustError>| !matches!(r, Err(TrustError::Threshold { .. }));
        prop_assert!(!ok(s.accept_release(&forged, &b.channel, 0)));
        let genuine = SignedRelease { release: b.clone(), signatures: vec![key.sign_release(&b)] };
        prop_assert!(ok(s.accept_release(&genuine, &b.channel, 0)));
    }
}
