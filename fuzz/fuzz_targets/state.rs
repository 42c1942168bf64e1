//! Fuzzes the agent's state file readers, both read on every start: the
//! same bytes go to the `state.json` reader and to the `desired.pb` reader.
//! Either accepts them as a value its own writer stores and reads back
//! unchanged, or refuses them with a one-line error naming the file.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use lksadmin_agent::apply::state::{LocalState, parse_desired};
use prost::Message;

fn one_line(msg: &str, file: &Path) {
    assert!(!msg.contains(['\n', '\r']), "multi-line error: {msg:?}");
    assert!(
        msg.contains(&*file.to_string_lossy()),
        "error does not name the file: {msg:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    let path = Path::new("/var/lib/lksadmin/state.json");
    match LocalState::parse(path, data) {
        Ok(state) => {
            let written = state.encode(path).expect("an accepted state encodes");
            let back = LocalState::parse(path, &written).expect("the agent reads back what it wrote");
            assert_eq!(back, state);
            assert_eq!(back.encode(path).expect("re-encode"), written);
            assert_eq!(state.statuses().len(), state.bundles.len());
        }
        Err(e) => one_line(&e.to_string(), path),
    }

    let path = Path::new("/var/lib/lksadmin/desired.pb");
    match parse_desired(path, data) {
        Ok(desired) => {
            let written = desired.encode_to_vec();
            let back = parse_desired(path, &written).expect("the agent reads back what it wrote");
            // Value equality only: `retry` is a HashMap, so the encoded
            // order of its entries may differ between two encodings.
            assert_eq!(back, desired);
        }
        Err(e) => one_line(&e.to_string(), path),
    }
});
