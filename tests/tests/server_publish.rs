//! Hostile or broken input on the admin API, sent as hand-made gRPC
//! requests: every one must be refused with a clear status and leave no
//! bundle and no blob behind.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use lks_e2e::server::{Server, raw_unary};
use lks_proto::pb::{self, publish_bundle_request::Msg};
use lks_proto::{Digest, sign::SigningKey};
use prost::Message;
use tonic::Code;

fn file(path: &str, content: &[u8]) -> pb::FileEntry {
    pb::FileEntry {
        chunk_size: 0,
        chunk_digests: Vec::new(),
        path: path.into(),
        digest: Digest::of(content).to_string(),
        size: content.len() as u64,
        mode: 0o644,
        url: String::new(),
        arch: String::new(),
    }
}

fn manifest(name: &str, version: &str, files: Vec<pb::FileEntry>) -> pb::SignedBundle {
    pb::SignedBundle {
        chunks_signature: Vec::new(),
        manifest: Some(pb::Manifest {
            name: name.into(),
            version: version.into(),
            files,
            steps: vec![],
            health: None,
            ..Default::default()
        }),
        signature: vec![],
        signer_public_key: vec![],
    }
}

fn header(b: pb::SignedBundle) -> pb::PublishBundleRequest {
    pb::PublishBundleRequest {
        msg: Some(Msg::Header(b)),
    }
}

fn chunk(digest: &str, data: &[u8]) -> pb::PublishBundleRequest {
    pb::PublishBundleRequest {
        msg: Some(Msg::Chunk(pb::FileChunk {
            digest: digest.into(),
            data: data.to_vec(),
        })),
    }
}

async fn publish(
    s: &Server,
    msgs: Vec<pb::PublishBundleRequest>,
) -> Result<pb::PublishBundleResponse, tonic::Status> {
    let mut c = s.admin_client().await;
    c.publish_bundle(tokio_stream::iter(msgs))
        .await
        .map(tonic::Response::into_inner)
}

fn count_files(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else { return 0 };
    rd.map(|e| {
        let p = e.unwrap().path();
        if p.is_dir() { count_files(&p) } else { 1 }
    })
    .sum()
}

fn assert_nothing_stored(s: &Server) {
    assert_eq!(s.lksctl_json(&["bundle", "list"]), serde_json::json!([]));
    assert_eq!(
        count_files(&s.data_dir.join("blobs")),
        0,
        "no blob and no temp file left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_uploads_store_nothing() {
    let s = Server::start();
    let good = b"good";
    let d = Digest::of(good).to_string();

    // Bytes that do not match the declared digest.
    let e = publish(
        &s,
        vec![
            header(manifest("a", "1", vec![file("/etc/a", good)])),
            chunk(&d, b"evil"),
        ],
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("checksum mismatch"), "{e:?}");

    // More bytes than declared: refused at the chunk that overflows.
    let big = vec![7u8; 1 << 20];
    let msgs = vec![
        header(manifest("a", "1", vec![file("/etc/a", good)])),
        chunk(&d, &big),
        chunk(&d, &big),
        chunk(&d, &big),
    ];
    let e = publish(&s, msgs).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("more than the declared 4 bytes"), "{e:?}");

    // A declared size beyond the per-file limit is refused from the header alone.
    let mut huge = file("/usr/bin/huge", good);
    huge.size = lks_proto::limits::MAX_FILE_SIZE + 1;
    let e = publish(&s, vec![header(manifest("a", "1", vec![huge]))])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("file[0].size") && e.message().contains("limit"),
        "{e:?}"
    );

    // One message over the transport limit.
    let e = publish(
        &s,
        vec![
            header(manifest("a", "1", vec![file("/etc/a", good)])),
            chunk(&d, &vec![0u8; 5 << 20]),
        ],
    )
    .await
    .unwrap_err();
    assert!(
        matches!(e.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{e:?}"
    );

    // Missing bytes, stray bytes, bad order.
    let e = publish(&s, vec![header(manifest("a", "1", vec![file("/etc/a", good)]))])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("were not uploaded"), "{e:?}");
    let other = Digest::of(b"other").to_string();
    let e = publish(
        &s,
        vec![
            header(manifest("a", "1", vec![file("/etc/a", good)])),
            chunk(&other, b"other"),
        ],
    )
    .await
    .unwrap_err();
    assert!(e.message().contains("not a file of a@1"), "{e:?}");
    let e = publish(&s, vec![chunk(&d, good)]).await.unwrap_err();
    assert!(e.message().contains("first message"), "{e:?}");
    let h = manifest("a", "1", vec![file("/etc/a", good)]);
    let e = publish(&s, vec![header(h.clone()), header(h)]).await.unwrap_err();
    assert!(e.message().contains("exactly one header"), "{e:?}");
    let e = publish(&s, vec![]).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // The first file's bytes are fine, the second's are not: neither is kept.
    let second = b"second";
    let msgs = vec![
        header(manifest(
            "a",
            "1",
            vec![file("/etc/a", good), file("/etc/b", second)],
        )),
        chunk(&d, good),
        chunk(&Digest::of(second).to_string(), b"SECOND"),
    ];
    let e = publish(&s, msgs).await.unwrap_err();
    assert!(e.message().contains("checksum mismatch"), "{e:?}");

    assert_nothing_stored(&s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_manifests_are_refused() {
    let s = Server::start();
    let x = b"x";
    let dx = Digest::of(x).to_string();
    for (path, what) in [
        ("/etc/../x", "dot-dot"),
        ("etc/x", "relative"),
        ("/etc//x", "empty component"),
        ("/", "root"),
    ] {
        let e = publish(
            &s,
            vec![header(manifest("evil", "1", vec![file(path, x)])), chunk(&dx, x)],
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{what}");
        assert!(e.message().contains("file[0].path"), "{what}: {e:?}");
    }
    let e = publish(&s, vec![header(manifest("Evil", "1", vec![]))])
        .await
        .unwrap_err();
    assert!(e.message().contains("name"), "{e:?}");
    let mut bad_digest = file("/etc/x", x);
    bad_digest.digest = "sha256:XYZ".into();
    let e = publish(&s, vec![header(manifest("evil", "1", vec![bad_digest]))])
        .await
        .unwrap_err();
    assert!(e.message().contains("file[0].digest"), "{e:?}");
    let mut no_manifest = manifest("evil", "1", vec![]);
    no_manifest.manifest = None;
    let e = publish(&s, vec![header(no_manifest)]).await.unwrap_err();
    assert!(e.message().contains("manifest"), "{e:?}");

    // Signatures: a signature over other content, or a mangled one.
    let key = SigningKey::generate();
    let m: lks_proto::Manifest = manifest("signed", "1", vec![file("/etc/x", x)])
        .manifest
        .unwrap()
        .try_into()
        .unwrap();
    let sig = key.sign(&m);
    let mut tampered = manifest("signed", "1", vec![file("/etc/y", x)]);
    tampered.signature = sig.signature.to_vec();
    tampered.signer_public_key = sig.public_key.to_vec();
    let e = publish(&s, vec![header(tampered), chunk(&dx, x)])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("signature does not match"), "{e:?}");
    let mut short = manifest("signed", "1", vec![file("/etc/x", x)]);
    short.signature = vec![1; 10];
    short.signer_public_key = sig.public_key.to_vec();
    let e = publish(&s, vec![header(short), chunk(&dx, x)]).await.unwrap_err();
    assert!(e.message().contains("signature"), "{e:?}");
    assert_nothing_stored(&s);

    // The genuine signed bundle goes through.
    let mut ok = manifest("signed", "1", vec![file("/etc/x", x)]);
    ok.signature = sig.signature.to_vec();
    ok.signer_public_key = sig.public_key.to_vec();
    let r = publish(&s, vec![header(ok.clone()), chunk(&dx, x)])
        .await
        .unwrap();
    assert!(r.created);
    let r = publish(&s, vec![header(ok), chunk(&dx, x)]).await.unwrap();
    assert!(!r.created, "identical re-publish changes nothing");
    // Same name@version, other bytes.
    let y = b"y";
    let e = publish(
        &s,
        vec![
            header(manifest("signed", "1", vec![file("/etc/x", y)])),
            chunk(&Digest::of(y).to_string(), y),
        ],
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    let list = s.lksctl_json(&["bundle", "list"]);
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["signed"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_protobuf_on_the_wire_is_refused() {
    let s = Server::start();
    let conf = s.admin_conf();
    let admin = lks_e2e::server::channel(
        &s.url(),
        &conf.ca_cert,
        Some((&conf.client_cert, &conf.client_key)),
    )
    .await;
    // Field 1 (a string) whose length runs past the end of the message.
    for garbage in [vec![0x0a, 0x7f, b'x'], vec![0xff; 16], vec![0x08]] {
        let e = raw_unary(
            admin.clone(),
            "/lks.v1.AdminService/CreateCluster",
            garbage.clone(),
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        let e = raw_unary(
            s.anonymous_channel().await,
            "/lks.v1.AgentService/Enroll",
            garbage,
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    }
    // Well-formed protobuf with an invalid field value.
    let body = pb::CreateClusterRequest {
        name: "../etc".into(),
        ..Default::default()
    }
    .encode_to_vec();
    let e = raw_unary(admin.clone(), "/lks.v1.AdminService/CreateCluster", body)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // The server is unharmed and stored nothing.
    let body = pb::ListClustersRequest {}.encode_to_vec();
    let out = raw_unary(admin, "/lks.v1.AdminService/ListClusters", body)
        .await
        .expect("still serving");
    assert!(
        pb::ListClustersResponse::decode(out.as_slice())
            .unwrap()
            .clusters
            .is_empty()
    );
}
