//! What a publish must carry: the blobs a control server holds for a
//! manifest (every file without a mirror URL, one size per digest), the
//! one chunk list each digest may have, and whether the bytes that arrived
//! match that list. The server applies these rules as a publish streams
//! in; they live here, beside the manifest, so no other reader of a
//! manifest can count its blobs differently.

use std::collections::BTreeMap;

use crate::chunks::Chunks;
use crate::digest::Digest;
use crate::manifest::Manifest;

/// Why a manifest cannot be published as it lists its files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServedError {
    #[error("file[{index}]: digest {digest} is listed with two different sizes")]
    TwoSizes { index: usize, digest: Digest },
    #[error("file[{index}]: digest {digest} is listed with two different chunk lists")]
    TwoChunkLists { index: usize, digest: Digest },
}

/// The bytes that arrived for a file are not the pieces its chunk list
/// names: `index` is the first piece that differs (or, if one list is a
/// prefix of the other, the length of the shorter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("chunk {index} does not match the manifest's chunk list")]
pub struct ChunkMismatch {
    pub index: usize,
}

/// The blobs a server must hold for `m`, by digest, with their sizes: its
/// files without a mirror URL. Two files may share a digest, never with
/// two sizes.
pub fn served_blobs(m: &Manifest) -> Result<BTreeMap<Digest, u64>, ServedError> {
    let mut sizes = BTreeMap::new();
    for (index, f) in m.files.iter().enumerate().filter(|(_, f)| f.url.is_none()) {
        if let Some(size) = sizes.insert(f.digest, f.size)
            && size != f.size
        {
            return Err(ServedError::TwoSizes {
                index,
                digest: f.digest,
            });
        }
    }
    Ok(sizes)
}

/// The chunk list of each digest of `m` that has one (mirrored files
/// included: peers share them too). A list that does not describe its file
/// would make every peer that serves it look like a liar, so a digest has
/// at most one.
pub fn chunk_lists(m: &Manifest) -> Result<BTreeMap<Digest, &Chunks>, ServedError> {
    let mut lists: BTreeMap<Digest, &Chunks> = BTreeMap::new();
    for (index, f) in m.files.iter().enumerate() {
        if let Some(c) = &f.chunks
            && let Some(other) = lists.insert(f.digest, c)
            && other != c
        {
            return Err(ServedError::TwoChunkLists {
                index,
                digest: f.digest,
            });
        }
    }
    Ok(lists)
}

/// Checks the chunk list measured over the bytes that arrived (`got`)
/// against the manifest's (`list`): the same digests, as many.
pub fn check_chunk_list(list: &Chunks, got: &Chunks) -> Result<(), ChunkMismatch> {
    match list.digests.iter().zip(&got.digests).position(|(a, b)| a != b) {
        None if list.digests.len() == got.digests.len() => Ok(()),
        i => Err(ChunkMismatch {
            index: i.unwrap_or(list.digests.len().min(got.digests.len())),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::FileSpec;

    fn d(n: u8) -> Digest {
        Digest::of(&[n])
    }

    fn file(path: &str, digest: Digest, size: u64) -> FileSpec {
        FileSpec {
            path: crate::BundlePath::new(path).unwrap(),
            digest,
            size,
            mode: 0o644,
            url: None,
            chunks: None,
            arch: None,
        }
    }

    fn manifest(files: Vec<FileSpec>) -> Manifest {
        Manifest {
            files,
            ..Default::default()
        }
    }

    fn chunks(size: u32, digests: &[u8]) -> Chunks {
        Chunks {
            size,
            digests: digests.iter().map(|n| d(*n)).collect(),
        }
    }

    #[test]
    fn served_blobs_are_the_unmirrored_files_once_per_digest() {
        let mut mirrored = file("/etc/c", d(3), 30);
        mirrored.url = Some("https://mirror.example/c".into());
        let m = manifest(vec![
            file("/etc/a", d(1), 10),
            file("/etc/b", d(2), 20),
            file("/etc/a2", d(1), 10),
            mirrored,
        ]);
        let got = served_blobs(&m).unwrap();
        assert_eq!(got, BTreeMap::from([(d(1), 10), (d(2), 20)]));
    }

    #[test]
    fn a_digest_with_two_sizes_is_refused_at_the_second() {
        let m = manifest(vec![
            file("/etc/a", d(1), 10),
            file("/etc/b", d(2), 20),
            file("/etc/c", d(1), 11),
        ]);
        let e = served_blobs(&m).unwrap_err();
        assert_eq!(
            e,
            ServedError::TwoSizes {
                index: 2,
                digest: d(1)
            }
        );
        assert_eq!(
            e.to_string(),
            format!("file[2]: digest {} is listed with two different sizes", d(1))
        );
    }

    #[test]
    fn a_mirrored_file_does_not_count_towards_sizes() {
        let mut mirrored = file("/etc/b", d(1), 11);
        mirrored.url = Some("https://mirror.example/b".into());
        let m = manifest(vec![file("/etc/a", d(1), 10), mirrored]);
        assert_eq!(served_blobs(&m).unwrap(), BTreeMap::from([(d(1), 10)]));
    }

    #[test]
    fn one_chunk_list_per_digest() {
        let mut a = file("/etc/a", d(1), 10);
        a.chunks = Some(chunks(65536, &[7]));
        let mut same = file("/etc/a2", d(1), 10);
        same.chunks = Some(chunks(65536, &[7]));
        let plain = file("/etc/b", d(2), 20);
        let m = manifest(vec![a, same, plain]);
        let lists = chunk_lists(&m).unwrap();
        assert_eq!(lists.len(), 1);
        assert_eq!(lists[&d(1)], &chunks(65536, &[7]));

        let mut other = file("/etc/a3", d(1), 10);
        other.chunks = Some(chunks(65536, &[8]));
        let mut m = m;
        m.files.push(other);
        let e = chunk_lists(&m).unwrap_err();
        assert_eq!(
            e,
            ServedError::TwoChunkLists {
                index: 3,
                digest: d(1)
            }
        );
        assert_eq!(
            e.to_string(),
            format!(
                "file[3]: digest {} is listed with two different chunk lists",
                d(1)
            )
        );
    }

    #[test]
    fn a_chunk_list_matches_only_the_same_pieces() {
        let list = chunks(65536, &[1, 2, 3]);
        assert_eq!(check_chunk_list(&list, &chunks(65536, &[1, 2, 3])), Ok(()));
        assert_eq!(
            check_chunk_list(&list, &chunks(65536, &[1, 9, 3])),
            Err(ChunkMismatch { index: 1 })
        );
        // One list a prefix of the other: the first piece one lacks.
        assert_eq!(
            check_chunk_list(&list, &chunks(65536, &[1, 2])),
            Err(ChunkMismatch { index: 2 })
        );
        assert_eq!(
            check_chunk_list(&list, &chunks(65536, &[1, 2, 3, 4])),
            Err(ChunkMismatch { index: 3 })
        );
        assert_eq!(
            ChunkMismatch { index: 1 }.to_string(),
            "chunk 1 does not match the manifest's chunk list"
        );
    }
}
