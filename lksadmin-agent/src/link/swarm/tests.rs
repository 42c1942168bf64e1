//! The end of a fetch in pieces: what is checked once every piece came.

use std::sync::Mutex;

use lks_proto::Digest;
use lks_proto::digest::VerifyError;

use super::check_complete;
use crate::apply::source::SwarmError;
use crate::link::peer::Partial;

fn partial(dir: &std::path::Path, bytes: &[u8], have: Vec<bool>) -> Partial {
    let path = dir.join("x.pieces");
    std::fs::write(&path, bytes).unwrap();
    Partial {
        path,
        have: Mutex::new(have),
    }
}

#[tokio::test]
async fn a_file_of_held_pieces_and_its_length_is_complete() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = b"every piece matched".to_vec();
    let p = partial(dir.path(), &bytes, vec![true, true]);
    check_complete(&p.path, &p, &Digest::of(&bytes), bytes.len() as u64)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_piece_not_held_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = b"one piece never came".to_vec();
    let p = partial(dir.path(), &bytes, vec![true, false, true]);
    let e = check_complete(&p.path, &p, &Digest::of(&bytes), bytes.len() as u64)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, SwarmError::Unavailable(m) if m.starts_with("piece 1 of ") && m.ends_with(" is missing")),
        "{e}"
    );
}

#[tokio::test]
async fn a_file_of_another_length_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = b"longer than the manifest says".to_vec();
    let p = partial(dir.path(), &bytes, vec![true]);
    let e = check_complete(&p.path, &p, &Digest::of(&bytes), 4)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            SwarmError::Corrupt(VerifyError::SizeMismatch { expected: 4, got }) if got == bytes.len() as u64
        ),
        "{e}"
    );
}

/// Debug builds hash the assembled file as well: bytes that are not the
/// file's (a piece written at the wrong place) fail there.
#[cfg(debug_assertions)]
#[tokio::test]
async fn in_debug_builds_bytes_that_are_not_the_files_fail_the_whole_file_check() {
    let dir = tempfile::tempdir().unwrap();
    let want = b"the published bytes".to_vec();
    let mut landed = want.clone();
    landed.swap(0, 4);
    let p = partial(dir.path(), &landed, vec![true]);
    let e = check_complete(&p.path, &p, &Digest::of(&want), want.len() as u64)
        .await
        .unwrap_err();
    assert!(
        matches!(e, SwarmError::Corrupt(VerifyError::DigestMismatch { .. })),
        "{e}"
    );
}
