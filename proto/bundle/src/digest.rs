//! SHA-256 digests (`sha256:<hex>`) and streaming verification.
//!
//! Every byte that reaches a node or the blob store passes through a
//! [`Verifier`], which fails as soon as a stream is longer than declared and
//! checks the digest at the end, so a bad byte never becomes a committed file.

use std::fmt;
use std::io::{self, Read};
use std::path::Path;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// A SHA-256 digest. Text form: `sha256:` followed by 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

/// Why a digest string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("digest {0:?} does not start with \"sha256:\"")]
    MissingPrefix(String),
    #[error("digest {0:?} must have 64 lowercase hex digits after \"sha256:\"")]
    BadHex(String),
}

impl Digest {
    pub const PREFIX: &'static str = "sha256:";

    /// Digest of a byte slice.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(Sha256::digest(bytes).into())
    }

    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Digest(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64 hex digits, without the `sha256:` prefix.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 lowercase hex digits without a prefix (the `sha256 = "…"`
    /// field of `bundle.toml`).
    pub fn from_hex(s: &str) -> Result<Self, DigestError> {
        if s.len() != 64
            || !s
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(DigestError::BadHex(s.to_string()));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|_| DigestError::BadHex(s.to_string()))?;
        Ok(Digest(out))
    }

    /// Digest and size of a file, read in a stream.
    pub fn of_file(path: &Path) -> io::Result<(Digest, u64)> {
        Self::of_reader(std::fs::File::open(path)?)
    }

    /// Digest and size of everything a reader yields.
    pub fn of_reader(mut r: impl Read) -> io::Result<(Digest, u64)> {
        let mut h = Hasher::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                return Ok(h.finish());
            }
            h.update(&buf[..n]);
        }
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", Self::PREFIX, self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex = s
            .strip_prefix(Self::PREFIX)
            .ok_or_else(|| DigestError::MissingPrefix(s.to_string()))?;
        Digest::from_hex(hex).map_err(|_| DigestError::BadHex(s.to_string()))
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Incremental SHA-256 that also counts bytes.
#[derive(Clone, Default)]
pub struct Hasher {
    sha: Sha256,
    len: u64,
}

impl Hasher {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.sha.update(bytes);
        self.len += bytes.len() as u64;
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn finish(self) -> (Digest, u64) {
        (Digest(self.sha.finalize().into()), self.len)
    }
}

/// Why a stream did not match what was declared for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("more than the declared {expected} bytes")]
    TooLong { expected: u64 },
    #[error("{got} bytes instead of the declared {expected}")]
    SizeMismatch { expected: u64, got: u64 },
    #[error("checksum mismatch: expected {expected}, got {got}")]
    DigestMismatch { expected: Digest, got: Digest },
}

/// Checks a stream against a declared digest and size while it flows.
///
/// `update` fails the moment the stream passes the declared size, so a client
/// never buffers or writes more than it was promised.
#[derive(Clone)]
pub struct Verifier {
    expected: Digest,
    size: u64,
    hasher: Hasher,
}

impl Verifier {
    pub fn new(expected: Digest, size: u64) -> Self {
        Verifier {
            expected,
            size,
            hasher: Hasher::new(),
        }
    }

    /// Continues a verification from bytes already on disk (a resumed download).
    pub fn resume(expected: Digest, size: u64, prefix: impl Read) -> io::Result<Self> {
        let mut v = Self::new(expected, size);
        let mut r = prefix;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                break;
            }
            v.update(&buf[..n]).map_err(io::Error::other)?;
        }
        Ok(v)
    }

    pub fn update(&mut self, bytes: &[u8]) -> Result<(), VerifyError> {
        if self.hasher.len() + bytes.len() as u64 > self.size {
            return Err(VerifyError::TooLong { expected: self.size });
        }
        self.hasher.update(bytes);
        Ok(())
    }

    /// Bytes seen so far.
    pub fn received(&self) -> u64 {
        self.hasher.len()
    }

    pub fn finish(self) -> Result<(), VerifyError> {
        let (got, len) = self.hasher.finish();
        if len != self.size {
            return Err(VerifyError::SizeMismatch {
                expected: self.size,
                got: len,
            });
        }
        if got != self.expected {
            return Err(VerifyError::DigestMismatch {
                expected: self.expected,
                got,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn known_vector_and_round_trip() {
        let d = Digest::of(b"");
        assert_eq!(d.to_string(), EMPTY);
        assert_eq!(EMPTY.parse::<Digest>().unwrap(), d);
    }

    #[test]
    fn rejects_malformed() {
        assert!(matches!(
            "e3b0".parse::<Digest>(),
            Err(DigestError::MissingPrefix(_))
        ));
        assert!(matches!(
            "sha256:e3b0".parse::<Digest>(),
            Err(DigestError::BadHex(_))
        ));
        assert!(EMPTY.to_uppercase().parse::<Digest>().is_err());
        assert!(format!("{EMPTY}0").parse::<Digest>().is_err());
        assert!("md5:d41d8cd98f00b204e9800998ecf8427e".parse::<Digest>().is_err());
    }

    #[test]
    fn verifier_catches_every_mismatch() {
        let data = b"hello world";
        let d = Digest::of(data);

        let mut ok = Verifier::new(d, data.len() as u64);
        ok.update(&data[..5]).unwrap();
        ok.update(&data[5..]).unwrap();
        ok.finish().unwrap();

        let mut long = Verifier::new(d, 5);
        assert_eq!(long.update(data), Err(VerifyError::TooLong { expected: 5 }));

        let mut short = Verifier::new(d, data.len() as u64);
        short.update(&data[..3]).unwrap();
        assert!(matches!(short.finish(), Err(VerifyError::SizeMismatch { .. })));

        let mut flipped = Verifier::new(d, data.len() as u64);
        flipped.update(b"hello World").unwrap();
        assert!(matches!(
            flipped.finish(),
            Err(VerifyError::DigestMismatch { .. })
        ));
    }

    #[test]
    fn resume_continues_the_hash() {
        let data = b"0123456789";
        let d = Digest::of(data);
        let mut v = Verifier::resume(d, 10, &data[..4]).unwrap();
        assert_eq!(v.received(), 4);
        v.update(&data[4..]).unwrap();
        v.finish().unwrap();
    }
}
