//! Fuzzes protobuf → manifest: a decoded message either converts into a
//! manifest that validates and re-encodes to the same canonical bytes, or is
//! refused with an error naming a field.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lks_proto::{Manifest, SignedBundle, canonical, pb};
use prost::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = pb::SignedBundle::decode(data) {
        match SignedBundle::try_from(msg) {
            Ok(b) => {
                assert!(b.manifest.validate().is_ok());
                let again = Manifest::try_from(pb::Manifest::from(&b.manifest)).expect("re-conversion");
                assert_eq!(canonical::encode(&again), canonical::encode(&b.manifest));
            }
            Err(e) => assert!(!e.field.is_empty()),
        }
    }
});
