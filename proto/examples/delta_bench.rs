//! The measurement behind BENCHMARKS.md "Binary deltas": makes or applies
//! one patch with `lks_proto::delta`, so each step's time and peak memory
//! can be taken on its own (`/usr/bin/time -v`). ALG is `bsdiff4` (the
//! default) or `bsdiff4-zstd`.
//!
//! ```sh
//! cargo run --release -p lks-proto --example delta_bench -- make [ALG] OLD NEW PATCH
//! cargo run --release -p lks-proto --example delta_bench -- apply [ALG] OLD PATCH OUT SIZE
//! cargo run --release -p lks-proto --example delta_bench -- transcode PATCH4 PATCHZ
//! ```

use std::io::BufWriter;
use std::time::Instant;

use lks_proto::delta;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    let alg = match args.get(1) {
        Some(a) if delta::ALGORITHMS.contains(a) => args.remove(1),
        _ => delta::ALGORITHM,
    };
    match args.as_slice() {
        ["make", old, new, patch] => {
            let (old, new) = (std::fs::read(old)?, std::fs::read(new)?);
            let t = Instant::now();
            let p = delta::make_as(alg, &old, &new)?;
            let ms = t.elapsed().as_millis();
            std::fs::write(patch, &p)?;
            println!(
                "make {alg}: {} -> {} bytes, patch {} bytes ({:.2} %), {ms} ms",
                old.len(),
                new.len(),
                p.len(),
                p.len() as f64 * 100.0 / new.len() as f64
            );
        }
        ["apply", old, patch, out, size] => {
            let (old, patch) = (std::fs::read(old)?, std::fs::read(patch)?);
            let t = Instant::now();
            let out = BufWriter::with_capacity(1 << 20, std::fs::File::create(out)?);
            let n = delta::apply(alg, &old, &patch, size.parse()?, out)?;
            println!("apply {alg}: {n} bytes in {} ms", t.elapsed().as_millis());
        }
        ["transcode", from, to] => {
            let p = std::fs::read(from)?;
            let t = Instant::now();
            let z = delta::sections::transcode(&p)?;
            std::fs::write(to, &z)?;
            println!(
                "transcode: {} -> {} bytes in {} ms",
                p.len(),
                z.len(),
                t.elapsed().as_millis()
            );
        }
        _ => {
            return Err(
                "usage: delta_bench make [ALG] OLD NEW PATCH | apply [ALG] OLD PATCH OUT SIZE | transcode PATCH4 PATCHZ"
                    .into(),
            );
        }
    }
    Ok(())
}
