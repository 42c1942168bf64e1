//! A file's chunk list: the SHA-256 of each fixed-size piece, so a file can
//! be fetched in pieces from several sources (peer sharing) and a source
//! that sends one bad byte is caught at that piece, not after the whole
//! file. A list is bound to its file's digest: the server recomputes it
//! from the bytes it hashes to that digest at publish and refuses a publish
//! whose list differs, and a signed bundle's lists count only under
//! `chunks_signature`, by the key that signed the digest. So a file whose
//! every piece matched a list of one digest per piece ([`Chunks::validate`])
//! is the file of that digest: an agent hashes each byte once, as its piece
//! arrives, not the assembled file again.

use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

use crate::digest::Digest;

/// Chunk size `lksctl bundle publish` uses.
pub const DEFAULT_CHUNK_SIZE: u32 = 4 << 20;
/// Smallest chunk size a manifest may name.
pub const MIN_CHUNK_SIZE: u32 = 64 << 10;
/// Largest chunk size a manifest may name.
pub const MAX_CHUNK_SIZE: u32 = 64 << 20;

/// Why a chunk list does not fit the file it describes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunksError {
    #[error("chunk size {size} is outside {MIN_CHUNK_SIZE}..={MAX_CHUNK_SIZE}")]
    Size { size: u32 },
    #[error("{got} chunk digests for {file_size} bytes in {size}-byte chunks; expected {want}")]
    Count {
        got: usize,
        file_size: u64,
        size: u32,
        want: u64,
    },
    #[error("the one chunk's digest is not the file's")]
    OneChunk,
}

/// The chunk list of one file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Chunks {
    /// Every piece but the last is this long.
    pub size: u32,
    /// SHA-256 of each piece, in order.
    pub digests: Vec<Digest>,
}

impl Chunks {
    /// How many pieces of `chunk_size` a file of `file_size` bytes has.
    pub fn count(file_size: u64, chunk_size: u32) -> u64 {
        file_size.div_ceil(u64::from(chunk_size.max(1)))
    }

    /// Offset and length of piece `i` of a file of `file_size` bytes.
    pub fn range(&self, i: usize, file_size: u64) -> (u64, u64) {
        let start = i as u64 * u64::from(self.size);
        (start, u64::from(self.size).min(file_size.saturating_sub(start)))
    }

    /// The index of the piece that starts at `offset`, if one does.
    pub fn index_at(&self, offset: u64) -> Option<usize> {
        let size = u64::from(self.size);
        (offset % size == 0)
            .then(|| (offset / size) as usize)
            .filter(|&i| i < self.digests.len())
    }

    /// Checks the list against the file it describes: a size in bounds,
    /// exactly one digest per piece, and for a one-piece file the piece is
    /// the file.
    pub fn validate(&self, file_size: u64, file_digest: &Digest) -> Result<(), ChunksError> {
        if !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&self.size) {
            return Err(ChunksError::Size { size: self.size });
        }
        let want = Self::count(file_size, self.size);
        if self.digests.len() as u64 != want {
            return Err(ChunksError::Count {
                got: self.digests.len(),
                file_size,
                size: self.size,
                want,
            });
        }
        if want == 1 && self.digests[0] != *file_digest {
            return Err(ChunksError::OneChunk);
        }
        Ok(())
    }

    /// Reads `r` to the end: its digest, its size and its chunk list.
    pub fn of_reader(mut r: impl Read, chunk_size: u32) -> io::Result<(Digest, u64, Chunks)> {
        let mut whole = Sha256::new();
        let mut pieces = ChunkHasher::new(chunk_size);
        let mut buf = vec![0u8; 256 << 10];
        loop {
            let n = match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            whole.update(&buf[..n]);
            pieces.update(&buf[..n]);
        }
        let total = pieces.len();
        Ok((
            Digest::from_bytes(whole.finalize().into()),
            total,
            pieces.finish(),
        ))
    }
}

/// Computes a chunk list as the bytes stream past.
pub struct ChunkHasher {
    size: u32,
    piece: Sha256,
    in_piece: u64,
    total: u64,
    digests: Vec<Digest>,
}

impl ChunkHasher {
    pub fn new(chunk_size: u32) -> Self {
        ChunkHasher {
            size: chunk_size.max(1),
            piece: Sha256::new(),
            in_piece: 0,
            total: 0,
            digests: Vec::new(),
        }
    }

    pub fn update(&mut self, mut bytes: &[u8]) {
        let chunk = u64::from(self.size);
        self.total += bytes.len() as u64;
        while !bytes.is_empty() {
            let take = ((chunk - self.in_piece) as usize).min(bytes.len());
            self.piece.update(&bytes[..take]);
            self.in_piece += take as u64;
            bytes = &bytes[take..];
            if self.in_piece == chunk {
                self.digests
                    .push(Digest::from_bytes(self.piece.finalize_reset().into()));
                self.in_piece = 0;
            }
        }
    }

    /// Bytes seen so far.
    pub fn len(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    pub fn finish(mut self) -> Chunks {
        if self.in_piece > 0 {
            self.digests
                .push(Digest::from_bytes(self.piece.finalize().into()));
        }
        Chunks {
            size: self.size,
            digests: self.digests,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_file_and_the_last_is_short() {
        let bytes: Vec<u8> = (0..(2 * MIN_CHUNK_SIZE + 10)).map(|i| (i % 251) as u8).collect();
        let (d, n, c) = Chunks::of_reader(&bytes[..], MIN_CHUNK_SIZE).unwrap();
        assert_eq!(d, Digest::of(&bytes));
        assert_eq!(n, bytes.len() as u64);
        assert_eq!(c.digests.len(), 3);
        for i in 0..3 {
            let (off, len) = c.range(i, n);
            let piece = &bytes[off as usize..(off + len) as usize];
            assert_eq!(c.digests[i], Digest::of(piece), "piece {i}");
            assert_eq!(c.index_at(off), Some(i));
        }
        assert_eq!(c.range(2, n).1, 10);
        assert_eq!(c.index_at(1), None);
        assert_eq!(c.index_at(3 * u64::from(MIN_CHUNK_SIZE)), None);
        c.validate(n, &d).unwrap();
    }

    #[test]
    fn a_list_that_does_not_fit_the_file_is_refused() {
        let bytes = vec![7u8; MIN_CHUNK_SIZE as usize * 2];
        let (d, n, c) = Chunks::of_reader(&bytes[..], MIN_CHUNK_SIZE).unwrap();
        let mut short = c.clone();
        short.digests.pop();
        assert_eq!(
            short.validate(n, &d).unwrap_err().to_string(),
            format!("1 chunk digests for {n} bytes in {MIN_CHUNK_SIZE}-byte chunks; expected 2")
        );
        let mut tiny = c.clone();
        tiny.size = 1024;
        assert_eq!(
            tiny.validate(n, &d).unwrap_err().to_string(),
            format!("chunk size 1024 is outside {MIN_CHUNK_SIZE}..={MAX_CHUNK_SIZE}")
        );
        // One piece: it must be the file.
        let (d1, n1, mut one) = Chunks::of_reader(&bytes[..100], MIN_CHUNK_SIZE).unwrap();
        one.validate(n1, &d1).unwrap();
        one.digests[0] = Digest::of(b"other");
        assert_eq!(one.validate(n1, &d1).unwrap_err(), ChunksError::OneChunk);
        assert_eq!(
            ChunksError::OneChunk.to_string(),
            "the one chunk's digest is not the file's"
        );
    }
}
