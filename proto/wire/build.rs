//! Compiles the wire contract in `proto/lks/v1/*.proto` (one folder up:
//! the `.proto` files stay where every reader of the contract looks for them)
//! with tonic-prost-build. protoc comes from Debian's `protobuf-compiler`
//! (installed by scripts/setup.sh).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "../lks/v1/bundle.proto",
        "../lks/v1/agent.proto",
        "../lks/v1/admin.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // The `Connect` RPC would clash with the generated `connect` constructor;
        // clients build their own TLS channel anyway.
        .build_transport(false)
        // prost's codec with 1 KiB stream buffers instead of 8 KiB (src/codec.rs).
        .codec_path("crate::codec::LeanCodec")
        // A blob's bytes are a slice of the buffer they were decoded from
        // (no copy into a new Vec per message) and go out as they were read.
        .bytes(".lks.v1.BlobChunk.data")
        .file_descriptor_set_path(out.join("lks_v1_descriptor.bin"))
        .compile_protos(&protos, &[".."])?;
    Ok(())
}
