//! Fuzzes the agent's transaction journal reader (`journal.json`, read on
//! every start to finish or undo an interrupted apply): any bytes either
//! parse into a transaction that the agent's own writer stores and reads
//! back unchanged, or are refused with a one-line error naming the file.
#![no_main]

use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use lksadmin_agent::apply::journal::Journal;

fuzz_target!(|data: &[u8]| {
    let journal = Journal::new(PathBuf::from("/var/lib/lksadmin/journal.json"));
    match journal.parse(data) {
        Ok(txn) => {
            let written = journal.encode(&txn).expect("an accepted transaction encodes");
            let back = journal
                .parse(&written)
                .expect("the agent reads back what it wrote");
            assert_eq!(back, txn);
            assert_eq!(journal.encode(&back).expect("re-encode"), written);
            let _ = (txn.describe(), txn.phase.touched_targets());
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains(['\n', '\r']), "multi-line error: {msg:?}");
            assert!(
                msg.starts_with("parse /var/lib/lksadmin/journal.json: "),
                "{msg:?}"
            );
        }
    }
});
