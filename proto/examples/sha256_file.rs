//! Prints `sha256:<hex>  SIZE  PATH` for each file, hashing it the way the
//! agent and the server verify blobs (64 KiB reads through `Digest`).
//! Used by scripts/bench.sh against `sha256sum` as the baseline.

fn main() {
    let mut failed = false;
    for path in std::env::args_os().skip(1) {
        match lks_proto::Digest::of_file(std::path::Path::new(&path)) {
            Ok((d, size)) => println!("{d}  {size}  {}", path.to_string_lossy()),
            Err(e) => {
                eprintln!("error: {}: {e}", path.to_string_lossy());
                failed = true;
            }
        }
    }
    std::process::exit(i32::from(failed));
}
