use super::*;

#[tokio::test(start_paused = true)]
async fn the_rate_limit_paces_bytes() {
    let r = RateLimit::new(1_000_000);
    let t0 = tokio::time::Instant::now();
    for _ in 0..10 {
        r.take(250_000).await;
    }
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(2_400), "2.5 MB at 1 MB/s: {took:?}");
    assert!(took <= Duration::from_millis(2_600), "{took:?}");
    let free = RateLimit::new(0);
    let t1 = tokio::time::Instant::now();
    free.take(u64::MAX).await;
    assert_eq!(t1.elapsed(), Duration::ZERO);
}

#[test]
fn what_a_node_holds_is_a_bitmap_of_verified_pieces_and_each_piece_tells_the_watchers() {
    let dir = std::env::temp_dir().join(format!("lks-peer-holding-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sha256")).unwrap();
    let shared = Shared::default();
    let d = Digest::of(b"blob");
    let mut changed = shared.changed.subscribe();
    changed.mark_unchanged();

    let none = holding(&dir, &shared, &d, 10);
    assert_eq!((none.have, none.pieces, none.whole), (vec![0, 0], 10, false));

    let p = Arc::new(Partial {
        path: dir.join("part"),
        have: Mutex::new(vec![false; 10]),
    });
    shared.start_partial(d, p.clone());
    shared.verified(&p, 0);
    shared.verified(&p, 9);
    assert!(changed.has_changed().unwrap(), "the watchers were told");
    let some = holding(&dir, &shared, &d, 10);
    assert_eq!(some.have, vec![0b0000_0001, 0b0000_0010]);
    assert_eq!(bits(&some.have, 10), 2);
    assert!(bit(&some.have, 9) && !bit(&some.have, 8) && !bit(&some.have, 80));
    assert!(held(&dir, &shared, &d, 9) && !held(&dir, &shared, &d, 1));

    // Whole in the cache: every piece, and `whole`.
    std::fs::write(dir.join("sha256").join(d.hex()), b"blob").unwrap();
    let all = holding(&dir, &shared, &d, 10);
    assert!(all.whole);
    assert_eq!(bits(&all.have, 10), 10);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_patch_is_served_while_the_blob_it_rebuilds_is() {
    let shared = Shared::default();
    let file = Digest::of(b"file v2");
    let desired = |files: Vec<pb::FileEntry>| pb::DesiredState {
        bundles: vec![pb::SignedBundle {
            manifest: Some(pb::Manifest {
                files,
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    shared.set_served(&desired(vec![pb::FileEntry {
        path: "/usr/bin/tool".into(),
        digest: file.to_string(),
        size: 7,
        ..Default::default()
    }]));
    let patch = Digest::of(b"patch");
    assert_eq!(shared.served(&patch), None, "not fetched: not served");
    let one_piece = BlobInfo {
        size: 5,
        chunks: None,
    };
    shared.add_patch(patch, one_piece.clone(), file);
    assert_eq!(
        shared.served(&patch),
        Some(BlobInfo {
            size: 5,
            chunks: None
        })
    );
    // A patch of a blob this node does not serve is not served either.
    let other = Digest::of(b"other patch");
    shared.add_patch(other, one_piece, Digest::of(b"not desired"));
    assert_eq!(shared.served(&other), None);
    // The file no longer desired: neither is its patch, and it is
    // forgotten.
    shared.set_served(&desired(Vec::new()));
    assert_eq!(shared.served(&patch), None);
    assert!(lock(&shared.patches).is_empty());
}

/// The messages an upload of `bytes` sends, as sent.
fn sent(bytes: PieceBytes) -> Vec<Vec<u8>> {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(piece_messages(bytes).map(Result::unwrap).collect())
}

#[test]
fn a_cached_piece_is_checked_before_it_is_sent_unless_just_verified() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("sha256")).unwrap();
    let shared = Shared::default();
    let d = Digest::of(b"blob bytes");
    let path = dir.path().join("sha256").join(d.hex());
    std::fs::write(&path, b"blob bytes").unwrap();
    let read = |shared: &Shared| read_piece(dir.path(), shared, &d, 0, 0, 10, &d);
    let checked = read(&shared).unwrap();
    assert!(matches!(checked, PieceBytes::Checked(_)), "{checked:?}");
    assert_eq!(sent(checked).concat(), b"blob bytes");
    // Rotted on disk: refused, not sent.
    std::fs::write(&path, b"blob bytEs").unwrap();
    let e = read(&shared).unwrap_err();
    assert_eq!(e.code(), tonic::Code::DataLoss, "{e}");
    // This node's own download was verified moments ago: served as read,
    // a message at a time while it is sent (the receiver checks every
    // piece).
    shared.download_verified(d);
    let verified = read(&shared).unwrap();
    assert!(matches!(verified, PieceBytes::Verified { .. }), "{verified:?}");
    assert_eq!(sent(verified).concat(), b"blob bytEs");
    // Not another blob's.
    assert!(!shared.fresh(&Digest::of(b"other")));
}

/// A download staging moved beside its target is still served, from
/// the file kept open, until the engine releases it.
#[test]
fn a_moved_download_is_served_until_released() {
    let dir = tempfile::tempdir().unwrap();
    let fetched = dir.path().join("fetched");
    std::fs::create_dir_all(&fetched).unwrap();
    let shared = Shared::default();
    let d = Digest::of(b"blob bytes");
    let path = fetched.join(d.hex());
    std::fs::write(&path, b"blob bytes").unwrap();
    shared.keep_moved(d, std::fs::File::open(&path).unwrap());
    // Moved out of the cache's sight, as staging does.
    std::fs::rename(&path, dir.path().join("target")).unwrap();
    assert!(held(dir.path(), &shared, &d, 0));
    assert!(holding(dir.path(), &shared, &d, 1).whole);
    let read = || read_piece(dir.path(), &shared, &d, 0, 0, 10, &d);
    assert_eq!(sent(read().unwrap()).concat(), b"blob bytes");
    shared.release_moved();
    assert!(!held(dir.path(), &shared, &d, 0));
    assert_eq!(read().unwrap_err().code(), tonic::Code::NotFound);
}

/// A piece is read into messages of at most [`MESSAGE`] bytes, checked
/// across all of them before any is sent.
#[test]
fn a_piece_is_read_into_its_messages_and_checked_across_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("sha256")).unwrap();
    let shared = Shared::default();
    let mut bytes: Vec<u8> = (0..2 * MESSAGE + 5).map(|i| (i % 253) as u8).collect();
    let d = Digest::of(&bytes);
    let path = dir.path().join("sha256").join(d.hex());
    std::fs::write(&path, &bytes).unwrap();
    // The piece from byte 7 to the end, against its own digest.
    let len = bytes.len() as u64 - 7;
    let want = Digest::of(&bytes[7..]);
    let read = || read_piece(dir.path(), &shared, &d, 1, 7, len, &want);
    let m = sent(read().unwrap());
    let sizes: Vec<usize> = m.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![MESSAGE, MESSAGE - 2]);
    assert_eq!(m.concat(), &bytes[7..]);
    // The last byte of the last message rotted: nothing is sent.
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(read().unwrap_err().code(), tonic::Code::DataLoss);
}

/// Bytes this node verified moments ago are read as they are sent, in
/// messages of at most [`MESSAGE`] bytes; a file cut short since is an
/// error, at the start when it cannot hold the piece, else where the read
/// fails.
#[test]
fn a_just_verified_piece_is_read_as_it_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("sha256")).unwrap();
    let shared = Shared::default();
    let bytes: Vec<u8> = (0..2 * MESSAGE + 5).map(|i| (i % 251) as u8).collect();
    let d = Digest::of(&bytes);
    let path = dir.path().join("sha256").join(d.hex());
    std::fs::write(&path, &bytes).unwrap();
    shared.download_verified(d);
    let len = bytes.len() as u64 - 7;
    let read = || read_piece(dir.path(), &shared, &d, 1, 7, len, &Digest::of(&bytes[7..]));
    let m = sent(read().unwrap());
    let sizes: Vec<usize> = m.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![MESSAGE, MESSAGE - 2]);
    assert_eq!(m.concat(), &bytes[7..]);
    // Cut short before the upload starts: refused at once.
    std::fs::write(&path, &bytes[..MESSAGE]).unwrap();
    assert_eq!(read().unwrap_err().code(), tonic::Code::NotFound);
    // Cut short while it is sent: the first message goes, then the error.
    std::fs::write(&path, &bytes).unwrap();
    let upload = read().unwrap();
    std::fs::write(&path, &bytes[..MESSAGE + 7]).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let got: Vec<Result<Vec<u8>, Status>> = rt.block_on(piece_messages(upload).collect());
    assert_eq!(got.len(), 2, "one message, then the error ends the upload");
    assert_eq!(got[0].as_ref().unwrap(), &bytes[7..7 + MESSAGE]);
    assert_eq!(got[1].as_ref().unwrap_err().code(), tonic::Code::DataLoss);
}

#[test]
fn pieces_without_a_list_are_the_whole_file() {
    let i = BlobInfo {
        size: 10,
        chunks: None,
    };
    assert_eq!(i.pieces(), vec![(0, 10)]);
    let d = Digest::of(b"x");
    assert_eq!(i.piece_digest(0, &d), d);
}
