//! The measurement behind BENCHMARKS.md "Binary deltas": makes or applies
//! one bsdiff 4 patch with `lks_proto::delta`, so each step's time and peak
//! memory can be taken on its own (`/usr/bin/time -v`).
//!
//! ```sh
//! cargo run --release -p lks-proto --example delta_bench -- make OLD NEW PATCH
//! cargo run --release -p lks-proto --example delta_bench -- apply OLD PATCH OUT SIZE
//! ```

use std::io::BufWriter;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["make", old, new, patch] => {
            let (old, new) = (std::fs::read(old)?, std::fs::read(new)?);
            let t = Instant::now();
            let p = lks_proto::delta::make(&old, &new)?;
            let ms = t.elapsed().as_millis();
            std::fs::write(patch, &p)?;
            println!(
                "make: {} -> {} bytes, patch {} bytes ({:.2} %), {ms} ms",
                old.len(),
                new.len(),
                p.len(),
                p.len() as f64 * 100.0 / new.len() as f64
            );
        }
        ["apply", old, patch, out, size] => {
            let (old, patch) = (std::fs::read(old)?, std::fs::read(patch)?);
            let t = Instant::now();
            let out = BufWriter::new(std::fs::File::create(out)?);
            let n = lks_proto::delta::apply(lks_proto::delta::ALGORITHM, &old, &patch, size.parse()?, out)?;
            println!("apply: {n} bytes in {} ms", t.elapsed().as_millis());
        }
        _ => return Err("usage: delta_bench make OLD NEW PATCH | apply OLD PATCH OUT SIZE".into()),
    }
    Ok(())
}
