//! Fuzzes protobuf → signed release / trust root, and a node accepting
//! them (issue [trust]): a decoded message either converts into a record
//! that passes its own rules and converts back to an equal record, or is
//! refused with one line; accepting the record into a node's trust state
//! never panics, and a refusal leaves the state exactly as it was. The
//! first byte picks the kind (even: release, odd: root).
#![no_main]

use libfuzzer_sys::fuzz_target;
use lks_proto::pb;
use lks_proto::release::{SignedRelease, SignedRoot, TrustRoot, TrustState};
use lks_proto::sign::PublisherKey;
use prost::Message;

/// A node's root 1: one key (the ed25519 base point, a valid public key
/// whose private key nobody uses here), threshold 1.
fn state() -> TrustState {
    let mut raw = [0x66u8; 32];
    raw[0] = 0x58;
    let key = PublisherKey::from_bytes(&raw).expect("the base point is a valid key");
    TrustState::new(TrustRoot::initial([key], 1).expect("a valid root"))
}

/// 2027-01-15, a fixed clock.
const NOW_MS: i64 = 1_800_000_000_000;

fuzz_target!(|data: &[u8]| {
    let Some((kind, rest)) = data.split_first() else {
        return;
    };
    if kind % 2 == 0 {
        let Ok(msg) = pb::SignedRelease::decode(rest) else {
            return;
        };
        match SignedRelease::try_from(msg) {
            Ok(r) => {
                r.release.validate().expect("a converted release keeps its rules");
                let back = SignedRelease::try_from(pb::SignedRelease::from(&r)).expect("re-conversion");
                assert_eq!(back, r);
                let mut st = state();
                let before = st.clone();
                if let Err(e) = st.accept_release(&r, &r.release.channel, NOW_MS) {
                    assert_eq!(st, before, "a refusal changes nothing");
                    assert!(!e.to_string().contains('\n'), "{e}");
                }
            }
            Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
        }
    } else {
        let Ok(msg) = pb::SignedRoot::decode(rest) else {
            return;
        };
        match SignedRoot::try_from(msg) {
            Ok(r) => {
                r.root.validate().expect("a converted root keeps its rules");
                let back = SignedRoot::try_from(pb::SignedRoot::from(&r)).expect("re-conversion");
                assert_eq!(back, r);
                let mut st = state();
                let before = st.clone();
                if let Err(e) = st.accept_root(&r, NOW_MS) {
                    assert_eq!(st, before, "a refusal changes nothing");
                    assert!(!e.to_string().contains('\n'), "{e}");
                }
            }
            Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
        }
    }
});
