//! Encryption of private keys at rest (`--encryption-key-file`, DESIGN §3).
//!
//! One AES-256-GCM key ([`SealKey`]) seals each secret value before it is
//! written to the store and opens it after it is read. All cryptography is
//! `ring`'s; this module only frames it.
//!
//! A sealed value is a self-describing binary envelope:
//!
//! ```text
//! b"lks-aesgcm-v1:" ++ key id (11 ASCII bytes, "k1:" + 8 hex) ++ b":"
//!   ++ nonce (12 random bytes) ++ ciphertext ++ GCM tag (16 bytes)
//! ```
//!
//! The 26-byte header is in clear so that a reader can tell a sealed value
//! from a plaintext one ([`is_sealed`]) and name the key a value was sealed
//! with when it is not the key it was given. The header is authenticated too:
//! the GCM associated data is the header followed by the caller's `aad`, the
//! name the value is stored under (e.g. its etcd key), so a value copied or
//! swapped to another name fails to open. The header has a fixed length, so
//! that concatenation is unambiguous.
//!
//! Every seal draws a fresh 96-bit nonce from the system CSPRNG. With random
//! nonces one key should seal well under 2^32 values (NIST SP 800-38D §8.3);
//! private keys in the store are written a handful of times each.

use std::fmt;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// The first bytes of every sealed value; `v1` names this envelope layout.
const MAGIC: &[u8] = b"lks-aesgcm-v1:";
/// "k1:" + 8 hex digits.
const KEY_ID_LEN: usize = 11;
/// MAGIC + key id + ':'.
const HEADER_LEN: usize = MAGIC.len() + KEY_ID_LEN + 1;
const TAG_LEN: usize = 16;
/// A key file holds 44 base64 characters and a newline; anything much larger
/// is the wrong file, and is not read whole.
const MAX_KEY_FILE_LEN: u64 = 4096;
const KEY_LEN: usize = 32;
const CREATE_HINT: &str = "create one with `head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE`";

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("read encryption key file {path}: {source}")]
    ReadKeyFile { path: PathBuf, source: std::io::Error },
    #[error("encryption key file {path} is not a regular file")]
    KeyFileNotRegular { path: PathBuf },
    #[error(
        "encryption key file {path} is readable or writable by group or others (mode {mode:04o}); run `chmod 600 {path}`"
    )]
    KeyFileMode { path: PathBuf, mode: u32 },
    #[error("encryption key file {path} is larger than {MAX_KEY_FILE_LEN} bytes; {CREATE_HINT}")]
    KeyFileTooLarge { path: PathBuf },
    #[error("encryption key file {path} is not base64 ({source}); {CREATE_HINT}")]
    KeyFileBase64 {
        path: PathBuf,
        source: base64::DecodeError,
    },
    #[error("encryption key file {path} decodes to {len} bytes, expected {KEY_LEN}; {CREATE_HINT}")]
    KeyFileLength { path: PathBuf, len: usize },
    #[error("value is not sealed (it does not start with \"lks-aesgcm-v1:\")")]
    NotSealed,
    #[error("sealed value is truncated ({len} bytes)")]
    Truncated { len: usize },
    #[error("sealed value has a malformed header (bad key id)")]
    MalformedHeader,
    #[error(
        "value was sealed with encryption key {sealed_with}, but the key given is {given}; start the server with the key file it was sealed with"
    )]
    WrongKey { sealed_with: String, given: String },
    #[error(
        "sealed value failed authentication: it was altered, or it is stored under another name than the one it was sealed for"
    )]
    Unauthentic,
    #[error("no random nonce: the system random number generator failed")]
    Random,
    #[error("value too large to seal")]
    TooLarge,
}

/// An AES-256-GCM key for values at rest, with its short id.
pub struct SealKey {
    key: LessSafeKey,
    id: String,
    rng: SystemRandom,
}

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealKey").field("id", &self.id).finish()
    }
}

impl SealKey {
    /// Reads the key file: exactly 32 random bytes, base64-encoded (as in a
    /// Kubernetes EncryptionConfiguration `aesgcm` secret:
    /// `head -c 32 /dev/urandom | base64`), surrounding whitespace ignored.
    /// Refuses a file that group or others may read or write.
    pub fn load(path: &Path) -> Result<SealKey, SealError> {
        let read_err = |source| SealError::ReadKeyFile {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read_err)?;
        // The mode of the file actually opened, not of whatever the path names
        // a moment later; Kubernetes secret volumes are symlinks, and the
        // open followed them.
        let meta = file.metadata().map_err(read_err)?;
        if !meta.is_file() {
            return Err(SealError::KeyFileNotRegular {
                path: path.to_path_buf(),
            });
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(SealError::KeyFileMode {
                path: path.to_path_buf(),
                mode,
            });
        }
        let mut text = Vec::new();
        file.take(MAX_KEY_FILE_LEN + 1)
            .read_to_end(&mut text)
            .map_err(read_err)?;
        if text.len() as u64 > MAX_KEY_FILE_LEN {
            return Err(SealError::KeyFileTooLarge {
                path: path.to_path_buf(),
            });
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim_ascii())
            .map_err(|source| SealError::KeyFileBase64 {
                path: path.to_path_buf(),
                source,
            })?;
        let key: [u8; KEY_LEN] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| SealError::KeyFileLength {
                path: path.to_path_buf(),
                len: bytes.len(),
            })?;
        Ok(SealKey::from_bytes(&key))
    }

    pub fn from_bytes(key: &[u8; KEY_LEN]) -> SealKey {
        let digest = ring::digest::digest(&ring::digest::SHA256, key);
        let mut id = String::from("k1:");
        for b in &digest.as_ref()[..4] {
            id.push_str(&format!("{b:02x}"));
        }
        // Infallible: AES_256_GCM takes exactly a 32-byte key, and the type
        // says that is what we have.
        #[allow(clippy::expect_used)]
        let unbound = UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte AES-256-GCM key");
        SealKey {
            key: LessSafeKey::new(unbound),
            id,
            rng: SystemRandom::new(),
        }
    }

    /// "k1:" + the first 8 hex digits of SHA-256(key). Stored in each
    /// envelope so that a wrong key is named, not reported as garbage.
    pub fn key_id(&self) -> String {
        self.id.clone()
    }

    /// Seals `plaintext` for the name `aad` (e.g. the etcd key it is stored
    /// under) with a fresh random nonce. Fails only if the system random
    /// number generator does, or for a value beyond AES-GCM's ~64 GiB limit.
    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Result<Vec<u8>, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).map_err(|_| SealError::Random)?;
        let mut out = Vec::with_capacity(HEADER_LEN + NONCE_LEN + plaintext.len() + TAG_LEN);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(self.id.as_bytes());
        out.push(b':');
        let associated = associated_data(&out, aad);
        out.extend_from_slice(&nonce);
        let mut body = plaintext.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(associated),
                &mut body,
            )
            .map_err(|_| SealError::TooLarge)?;
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Opens a value [`seal`](Self::seal) made for the same `aad`.
    pub fn open(&self, sealed: &[u8], aad: &[u8]) -> Result<Vec<u8>, SealError> {
        if !is_sealed(sealed) {
            return Err(SealError::NotSealed);
        }
        let truncated = SealError::Truncated { len: sealed.len() };
        let Some(header) = sealed.get(..HEADER_LEN) else {
            return Err(truncated);
        };
        let key_id = &header[MAGIC.len()..MAGIC.len() + KEY_ID_LEN];
        if !valid_key_id(key_id) || header[HEADER_LEN - 1] != b':' {
            return Err(SealError::MalformedHeader);
        }
        if key_id != self.id.as_bytes() {
            return Err(SealError::WrongKey {
                sealed_with: String::from_utf8_lossy(key_id).into_owned(),
                given: self.id.clone(),
            });
        }
        if sealed.len() < HEADER_LEN + NONCE_LEN + TAG_LEN {
            return Err(truncated);
        }
        let (nonce, body) = sealed[HEADER_LEN..].split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::MalformedHeader)?;
        let mut body = body.to_vec();
        let plain_len = self
            .key
            .open_in_place(nonce, Aad::from(associated_data(header, aad)), &mut body)
            .map_err(|_| SealError::Unauthentic)?
            .len();
        body.truncate(plain_len);
        Ok(body)
    }
}

/// True if `bytes` is a sealed envelope, so a reader can tell "encrypted, but
/// no key given" apart from a plaintext value. A truncated envelope still
/// counts as sealed; [`SealKey::open`] reports it.
pub fn is_sealed(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// A secret value as the store keeps it: sealed for `aad` with `seal`
/// (hex of the envelope), or the text as it is without a key.
pub fn seal_text(seal: Option<&SealKey>, aad: &[u8], text: &str) -> Result<String, SealError> {
    match seal {
        None => Ok(text.to_string()),
        Some(k) => Ok(hex::encode(k.seal(text.as_bytes(), aad)?)),
    }
}

/// The envelope a stored value holds, if it is hex of one; `None` for a
/// value stored as plaintext.
pub fn sealed_envelope(stored: &str) -> Option<Vec<u8>> {
    hex::decode(stored).ok().filter(|b| is_sealed(b))
}

/// Why a sealed stored value did not open as text.
#[derive(Debug, thiserror::Error)]
pub enum OpenTextError {
    /// Sealed, and the server has no key.
    #[error("no encryption key given")]
    NoKey,
    #[error("{0}")]
    Seal(#[from] SealError),
    #[error("not UTF-8 text: {0}")]
    NotText(#[from] std::string::FromUtf8Error),
}

/// Opens `envelope` (from [`sealed_envelope`]) for `aad` as text.
pub fn open_text(seal: Option<&SealKey>, aad: &[u8], envelope: &[u8]) -> Result<String, OpenTextError> {
    let k = seal.ok_or(OpenTextError::NoKey)?;
    Ok(String::from_utf8(k.open(envelope, aad)?)?)
}

fn associated_data(header: &[u8], aad: &[u8]) -> Vec<u8> {
    let mut associated = Vec::with_capacity(header.len() + aad.len());
    associated.extend_from_slice(header);
    associated.extend_from_slice(aad);
    associated
}

fn valid_key_id(id: &[u8]) -> bool {
    id.len() == KEY_ID_LEN
        && id.starts_with(b"k1:")
        && id[3..]
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    const KEY_A: [u8; 32] = [7; 32];
    const KEY_B: [u8; 32] = [9; 32];
    const AAD: &[u8] = b"/lksadmin/v1/ca/key";

    fn write_key_file(dir: &Path, contents: &[u8], mode: u32) -> PathBuf {
        let path = dir.join("key");
        fs::write(&path, contents).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn round_trip() {
        let key = SealKey::from_bytes(&KEY_A);
        for plain in [&b""[..], b"x", b"-----BEGIN PRIVATE KEY-----\nabc\n"] {
            let sealed = key.seal(plain, AAD).unwrap();
            assert!(is_sealed(&sealed));
            assert_eq!(sealed.len(), HEADER_LEN + NONCE_LEN + plain.len() + TAG_LEN);
            assert_eq!(key.open(&sealed, AAD).unwrap(), plain);
        }
    }

    #[test]
    fn envelope_header_names_the_key_and_nonces_differ() {
        let key = SealKey::from_bytes(&KEY_A);
        let id = key.key_id();
        assert!(id.starts_with("k1:") && id.len() == KEY_ID_LEN, "{id}");
        assert!(valid_key_id(id.as_bytes()));
        let one = key.seal(b"secret", AAD).unwrap();
        let two = key.seal(b"secret", AAD).unwrap();
        assert_eq!(one[..HEADER_LEN], *format!("lks-aesgcm-v1:{id}:").as_bytes());
        assert_ne!(one, two, "a fresh nonce per seal");
        assert!(!one.windows(6).any(|w| w == b"secret"));
    }

    #[test]
    fn key_id_is_sha256_prefix() {
        // sha256 of 32 zero bytes is 66687aadf862bd77...
        assert_eq!(SealKey::from_bytes(&[0; 32]).key_id(), "k1:66687aad");
        assert_ne!(
            SealKey::from_bytes(&KEY_A).key_id(),
            SealKey::from_bytes(&KEY_B).key_id()
        );
    }

    #[test]
    fn debug_does_not_print_the_key() {
        let key = SealKey::from_bytes(&KEY_A);
        assert_eq!(
            format!("{key:?}"),
            format!("SealKey {{ id: {:?} }}", key.key_id())
        );
    }

    #[test]
    fn wrong_key_names_both_ids() {
        let a = SealKey::from_bytes(&KEY_A);
        let b = SealKey::from_bytes(&KEY_B);
        let sealed = a.seal(b"secret", AAD).unwrap();
        let err = b.open(&sealed, AAD).unwrap_err();
        assert!(
            matches!(&err, SealError::WrongKey { sealed_with, given }
                if *sealed_with == a.key_id() && *given == b.key_id()),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains(&a.key_id()) && msg.contains(&b.key_id()), "{msg}");
    }

    #[test]
    fn wrong_aad_is_refused() {
        let key = SealKey::from_bytes(&KEY_A);
        let sealed = key.seal(b"secret", b"/lksadmin/v1/a").unwrap();
        assert!(matches!(
            key.open(&sealed, b"/lksadmin/v1/b"),
            Err(SealError::Unauthentic)
        ));
        assert!(matches!(key.open(&sealed, b""), Err(SealError::Unauthentic)));
    }

    #[test]
    fn every_tampered_byte_is_detected() {
        let key = SealKey::from_bytes(&KEY_A);
        let sealed = key.seal(b"a private key", AAD).unwrap();
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x01;
            let err = key.open(&bad, AAD).unwrap_err();
            let expected = match i {
                i if i < MAGIC.len() => matches!(err, SealError::NotSealed),
                // Flipping the low bit of a key id digit yields another
                // valid digit ('0'..'9', 'a'..'f' flip within the set or out
                // of it), so both outcomes name the header.
                i if i < HEADER_LEN => {
                    matches!(err, SealError::WrongKey { .. } | SealError::MalformedHeader)
                }
                _ => matches!(err, SealError::Unauthentic),
            };
            assert!(expected, "byte {i}: {err:?}");
        }
    }

    #[test]
    fn truncated_is_refused() {
        let key = SealKey::from_bytes(&KEY_A);
        let sealed = key.seal(b"secret", AAD).unwrap();
        for len in MAGIC.len()..sealed.len() {
            let err = key.open(&sealed[..len], AAD).unwrap_err();
            let ok = if len < HEADER_LEN + NONCE_LEN + TAG_LEN {
                matches!(err, SealError::Truncated { .. })
            } else {
                matches!(err, SealError::Unauthentic)
            };
            assert!(ok, "len {len}: {err:?}");
        }
    }

    #[test]
    fn plaintext_is_not_sealed() {
        let key = SealKey::from_bytes(&KEY_A);
        assert!(!is_sealed(b"-----BEGIN PRIVATE KEY-----"));
        assert!(!is_sealed(b""));
        assert!(!is_sealed(b"lks-aesgcm-v1"));
        assert!(is_sealed(b"lks-aesgcm-v1:"));
        assert!(matches!(
            key.open(b"-----BEGIN PRIVATE KEY-----", AAD),
            Err(SealError::NotSealed)
        ));
    }

    #[test]
    fn load_reads_base64_with_whitespace() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_key_file(dir.path(), format!("  \n{}\n\n", b64(&KEY_A)).as_bytes(), 0o600);
        let key = SealKey::load(&path).unwrap();
        assert_eq!(key.key_id(), SealKey::from_bytes(&KEY_A).key_id());
        let sealed = SealKey::from_bytes(&KEY_A).seal(b"secret", AAD).unwrap();
        assert_eq!(key.open(&sealed, AAD).unwrap(), b"secret");
        let ro = write_key_file(dir.path(), b64(&KEY_A).as_bytes(), 0o400);
        SealKey::load(&ro).unwrap();
    }

    #[test]
    fn load_refuses_group_or_world_access() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o640, 0o604, 0o660, 0o644, 0o620, 0o602] {
            let path = write_key_file(dir.path(), b64(&KEY_A).as_bytes(), mode);
            let err = SealKey::load(&path).unwrap_err();
            assert!(matches!(err, SealError::KeyFileMode { .. }), "{mode:o}: {err:?}");
            let msg = err.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(msg.contains(&format!("{mode:04o}")), "{msg}");
        }
    }

    #[test]
    fn load_refuses_wrong_length() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0, 16, 31, 33, 64] {
            let path = write_key_file(dir.path(), b64(&vec![1u8; len]).as_bytes(), 0o600);
            let err = SealKey::load(&path).unwrap_err();
            assert!(
                matches!(err, SealError::KeyFileLength { len: l, .. } if l == len),
                "{len}: {err:?}"
            );
            assert!(err.to_string().contains(&path.display().to_string()));
        }
    }

    #[test]
    fn load_refuses_bad_base64() {
        let dir = tempfile::tempdir().unwrap();
        let raw = write_key_file(dir.path(), &KEY_A, 0o600);
        let err = SealKey::load(&raw).unwrap_err();
        assert!(matches!(err, SealError::KeyFileBase64 { .. }), "{err:?}");
        assert!(err.to_string().contains(&raw.display().to_string()));
        let mut text = b64(&KEY_A);
        text.insert(10, '!');
        let path = write_key_file(dir.path(), text.as_bytes(), 0o600);
        assert!(matches!(
            SealKey::load(&path),
            Err(SealError::KeyFileBase64 { .. })
        ));
    }

    #[test]
    fn load_refuses_missing_large_and_non_regular() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent");
        let err = SealKey::load(&missing).unwrap_err();
        assert!(matches!(err, SealError::ReadKeyFile { .. }), "{err:?}");
        assert!(err.to_string().contains(&missing.display().to_string()));

        let big = write_key_file(dir.path(), &vec![b'A'; 8192], 0o600);
        assert!(matches!(
            SealKey::load(&big),
            Err(SealError::KeyFileTooLarge { .. })
        ));

        let sub = dir.path().join("dir");
        fs::create_dir(&sub).unwrap();
        fs::set_permissions(&sub, fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(
            SealKey::load(&sub),
            Err(SealError::KeyFileNotRegular { .. })
        ));
    }

    #[test]
    fn load_follows_symlinks_like_a_secret_volume() {
        let dir = tempfile::tempdir().unwrap();
        let target = write_key_file(dir.path(), b64(&KEY_A).as_bytes(), 0o600);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(
            SealKey::load(&link).unwrap().key_id(),
            SealKey::from_bytes(&KEY_A).key_id()
        );
    }
}
