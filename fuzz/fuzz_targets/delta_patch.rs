//! Fuzzes the binary delta appliers (`lks_proto::delta`, both algorithms),
//! which read patches a server or a peer sent: whatever the bytes, applying
//! them to a base either fails with an error or writes exactly the size the
//! patch declares, never panics, never reads outside the base and never
//! writes past the size (the writer below refuses it).
#![no_main]

use std::io::{self, Write};

use libfuzzer_sys::fuzz_target;
use lks_proto::delta;

/// A base with structure and noise, as binaries have.
fn base() -> Vec<u8> {
    (0..4096u32)
        .map(|i| if i % 64 < 16 { (i / 64) as u8 } else { (i.wrapping_mul(2654435761) >> 13) as u8 })
        .collect()
}

/// Refuses a byte past `left`.
struct Bounded {
    left: u64,
}

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len() as u64;
        assert!(n <= self.left, "the applier wrote past the size it checked");
        self.left -= n;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let base = base();
    for alg in delta::ALGORITHMS {
        // The size the patch declares (bytes 24..32 of either header),
        // bounded so that a run stays short.
        let Some(size) = data.get(24..32).map(|b| u64::from_le_bytes(b.try_into().unwrap())) else {
            let _ = delta::apply(alg, &base, data, 0, Bounded { left: 0 });
            continue;
        };
        if size > 1 << 20 {
            continue;
        }
        if let Ok(n) = delta::apply(alg, &base, data, size, Bounded { left: size }) {
            assert_eq!(n, size);
        }
    }
});
