//! Endless mirrors and a tampered blob on the server.

use super::*;

// ---- a mirror that never stops, a blob tampered in the server's store ----
#[test]
fn endless_mirrors_and_a_tampered_server_blob_write_nothing() {
    let start = Instant::now();
    let server = Server::start();
    server.create_cluster("c1");
    let mut agent = Agent::new("mirrored");
    agent.join(&server, "c1", &[]);
    agent.start();
    let mirror = EndlessMirror::start();

    // The declared file: 256 KiB of zeros, which the endless stream even
    // starts with, so only the length gives it away.
    const SIZE: usize = 256 << 10;
    let digest = Digest::of(&vec![0u8; SIZE]).hex();
    let mut messages = Vec::new();
    for (name, path) in [("endless", "/endless"), ("lying", "/lying")] {
        let extra = format!(
            "[[file]]\npath = \"/opt/{name}.bin\"\nurl = \"{}{path}\"\nsha256 = \"{digest}\"\nsize = {SIZE}\nmode = \"0755\"\n",
            mirror.url
        );
        let dir = write_bundle(server.work_dir(), name, "1", &[], &extra);
        publish_and_roll_out(&server, "c1", &dir, None);
        messages.push(wait_node_bundle(&server, "mirrored", name, "1", "failed"));
    }
    let mirror_refused = messages
        .iter()
        .filter(|m| m.contains(&format!("more than the declared {SIZE} bytes")))
        .count();
    // Let any download still running finish before counting.
    std::thread::sleep(Duration::from_millis(500));
    let sent = mirror.sent.load(Ordering::Relaxed);
    let connections = mirror.connections.load(Ordering::Relaxed);
    let kept = largest_file(&agent.state_dir);

    // A blob flipped on the server's disk after publish.
    let body: Vec<u8> = (0..65_536u32).map(|i| (i % 251) as u8).collect();
    let dir = write_bundle(
        server.work_dir(),
        "tamper",
        "1",
        &[BundleFile {
            path: "/etc/tamper.conf",
            content: &body,
            mode: "0644",
        }],
        "",
    );
    server.publish(&dir);
    let hex = Digest::of(&body).hex();
    let blob = server.data_dir.join("blobs/sha256").join(&hex[..2]).join(&hex);
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[1000] ^= 0x55;
    std::fs::write(&blob, &bytes).unwrap();
    server.lksctl_ok(&["rollout", "start", "--cluster", "c1", "--bundle", "tamper@1"]);
    let msg = wait_node_bundle(&server, "mirrored", "tamper", "1", "failed");
    let tamper_refused = usize::from(msg.contains("checksum mismatch") && msg.contains("/etc/tamper.conf"));
    let written = [
        agent.path("/opt/endless.bin"),
        agent.path("/opt/lying.bin"),
        agent.path("/etc/tamper.conf"),
    ]
    .iter()
    .filter(|p| p.exists())
    .count();

    // The agent still applies a good bundle.
    let ok = write_bundle(
        server.work_dir(),
        "fine",
        "1",
        &[BundleFile {
            path: "/etc/fine.conf",
            content: b"fine\n",
            mode: "0644",
        }],
        "",
    );
    publish_and_roll_out(&server, "c1", &ok, None);
    wait_node_bundle(&server, "mirrored", "fine", "1", "applied");
    let still_applies = agent.read("/etc/fine.conf") == Some((b"fine\n".to_vec(), 0o644));
    let panics = panics_in(&agent.log()) + panics_in(&server.log());
    println!(
        "HOSTILE endless-mirror-and-tampered-blob: tried=3 refused={} accepted={} written={written} \
         mirror_connections={connections} mirror_bytes_sent={sent} declared_bytes={SIZE} largest_file_kept={kept} \
         panics={panics} agent_still_applies={} secs={:.1}",
        mirror_refused + tamper_refused,
        3 - mirror_refused - tamper_refused,
        u8::from(still_applies),
        start.elapsed().as_secs_f64()
    );
    for m in &messages {
        eprintln!("  mirror: {m}");
    }
    eprintln!("  tamper: {msg}");
    assert_eq!(mirror_refused, 2, "{messages:?}");
    assert_eq!(tamper_refused, 1, "{msg}");
    assert_eq!(written, 0);
    assert!(
        kept <= SIZE as u64,
        "the agent kept a {kept}-byte file for a {SIZE}-byte blob"
    );
    // Sent is what the kernel took before the agent hung up: the socket
    // buffers, not the stream. 64 MiB per connection is far above them and
    // far below the 256 MiB the mirror would send to a reader that never stops.
    assert!(
        sent <= connections * (64 << 20),
        "{sent} bytes over {connections} connections"
    );
    assert!(still_applies);
    assert_eq!(panics, 0);
    assert_eq!(agent.stop(), Some(0));
}
