//! Fuzzes the `bundle.toml` parser: any input must give a manifest that
//! passes validation or a one-line error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lks_proto::authoring::{RequireSize, parse_bundle_toml};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let dir = std::env::temp_dir().join("lks-fuzz-empty-bundle-dir");
    match parse_bundle_toml(text, &dir, &mut RequireSize) {
        Ok(b) => assert!(b.manifest.validate().is_ok()),
        Err(e) => assert!(!e.to_string().contains('\n'), "multi-line error: {e}"),
    }
});
