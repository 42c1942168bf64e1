//! The backup archive: one self-verifying file, written and read as a
//! stream (no tar: a small length-prefixed layout is all it needs).
//!
//! ```text
//! MAGIC (8 bytes) | manifest length (u64, big-endian) | manifest (JSON)
//! | the bytes of each manifest `files` entry, in order, `size` bytes each
//! | END (8 bytes) | SHA-256 of every byte before END (32 bytes)
//! ```
//!
//! The manifest names every entry with its size and SHA-256, so a reader
//! checks each entry as it streams past, and the closing SHA-256 covers the
//! manifest and the layout itself: a truncated archive ends early, an
//! altered byte fails an entry's digest or the closing one. Entry names are
//! the data dir's own relative paths, from a fixed set ([`EntryName`]), so a
//! hostile archive cannot name a path outside the directory it restores to.

use std::io::{self, Read, Write};

use lks_proto::Digest;
use lks_proto::digest::Hasher;
use serde::{Deserialize, Serialize};

/// First bytes of every archive (format 1).
pub const MAGIC: &[u8; 8] = b"LKSBKP\x00\x01";
/// Marks the closing SHA-256.
const END: &[u8; 8] = b"LKSBKEND";
/// The manifest of a data dir with many thousands of blobs stays far below.
const MAX_MANIFEST: u64 = 256 << 20;
/// The manifest format this server writes and reads.
pub const FORMAT: u32 = 1;

/// What the archive holds, written first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// The `lks-control-server` version that wrote it.
    pub server_version: String,
    /// RFC 3339 and Unix milliseconds.
    pub created_at: String,
    pub created_at_ms: i64,
    /// `sqlite` (a data dir) or `etcd` (every key under a prefix).
    pub store: StoreKind,
    /// The data dir, or `ENDPOINTS PREFIX@REVISION` for etcd.
    pub source: String,
    /// Every entry, in archive order.
    pub files: Vec<FileEntry>,
    /// Every blob a bundle in the archive serves, by digest.
    pub blobs: Vec<BlobEntry>,
    /// True if the blobs' bytes are entries (`--with-blobs`).
    pub blobs_included: bool,
    pub counts: Counts,
    /// Where an etcd backup was read (absent for a data dir's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdOrigin>,
}

/// The etcd prefix and revision an `etcd/keys` entry was read at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdOrigin {
    pub prefix: String,
    /// Every key was read at this revision: one consistent snapshot.
    pub revision: i64,
    /// Keys in `etcd/keys`.
    pub keys: u64,
    /// Id of the encryption key that sealed the private keys, if any:
    /// the restored replicas need that key file, and sealed keys open only
    /// under this prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_with: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Sqlite,
    Etcd,
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreKind::Sqlite => "sqlite",
            StoreKind::Etcd => "etcd",
        })
    }
}

/// One entry: a file of the data dir by its relative path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub name: String,
    pub size: u64,
    pub sha256: Digest,
    /// Unix permission bits it is restored with.
    pub mode: u32,
}

/// A blob a bundle serves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobEntry {
    pub digest: Digest,
    pub size: u64,
    /// `NAME@VERSION` of the bundles serving it.
    pub bundles: Vec<String>,
}

/// How many of each kind the snapshot holds.
pub type Counts = crate::store::DumpCounts;

/// The entries an archive may hold, each a fixed place in a data dir.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryName {
    /// `state.db`: the SQLite snapshot.
    State,
    /// `admin.conf`.
    AdminConf,
    /// `pki/NAME`: the CA, serving and admin certificates and keys.
    Pki(String),
    /// `blobs/sha256/XX/HEX`: a blob's bytes.
    Blob(Digest),
    /// `etcd/keys`: every key under an etcd prefix (see `backup::etcd`).
    EtcdKeys,
}

impl EntryName {
    pub fn parse(name: &str) -> Option<EntryName> {
        match name {
            "state.db" => return Some(EntryName::State),
            "admin.conf" => return Some(EntryName::AdminConf),
            "etcd/keys" => return Some(EntryName::EtcdKeys),
            _ => {}
        }
        if let Some(file) = name.strip_prefix("pki/") {
            let plain = !file.is_empty()
                && !file.starts_with('.')
                && file
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_');
            return plain.then(|| EntryName::Pki(file.to_string()));
        }
        let rest = name.strip_prefix("blobs/sha256/")?;
        let (dir, hex) = rest.split_once('/')?;
        let d = Digest::from_hex(hex).ok()?;
        (d.hex() == hex && hex.get(..2) == Some(dir)).then_some(EntryName::Blob(d))
    }

    /// The relative path in the data dir.
    pub fn path(&self) -> String {
        match self {
            EntryName::State => "state.db".into(),
            EntryName::AdminConf => "admin.conf".into(),
            EntryName::EtcdKeys => "etcd/keys".into(),
            EntryName::Pki(f) => format!("pki/{f}"),
            EntryName::Blob(d) => {
                let hex = d.hex();
                format!("blobs/sha256/{}/{hex}", &hex[..2])
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("not a control server backup archive (it does not start with the archive's marker)")]
    NotAnArchive,
    #[error(
        "the archive is truncated: it ends at byte {at}, inside {inside}; use a complete copy of the archive"
    )]
    Truncated { at: u64, inside: String },
    #[error("the archive's manifest is unreadable (the archive was altered or damaged): {0}")]
    Manifest(#[source] serde_json::Error),
    #[error(
        "the archive's manifest is {0} bytes long, more than any backup holds: the archive was altered or damaged"
    )]
    ManifestTooLarge(u64),
    #[error(
        "archive format {0} is newer than this lks-control-server reads ({FORMAT}); restore with the version that wrote it"
    )]
    Format(u32),
    #[error("the archive's manifest names {0:?}, which is no file of a data dir: the archive was altered")]
    BadName(String),
    #[error("the archive's manifest names {0} twice: the archive was altered")]
    Duplicate(String),
    #[error(
        "entry {name}: {size} bytes, SHA-256 {actual}, but the manifest says {expected}: the archive was altered or damaged"
    )]
    EntryDigest {
        name: String,
        size: u64,
        actual: Digest,
        expected: Digest,
    },
    #[error("the archive's closing SHA-256 does not match its content: the archive was altered or damaged")]
    Checksum,
    #[error("the archive has bytes after its end: it was altered, or two files were joined")]
    TrailingBytes,
    #[error("{name} changed while it was being archived ({why}); run the backup again")]
    Changed { name: String, why: String },
    #[error("write {name} into the archive: the manifest lists {expected} next")]
    OutOfOrder { name: String, expected: String },
    #[error("the archive holds {0} of its {1} entries: entries are missing")]
    Incomplete(usize, usize),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ArchiveError {
    let what = what.into();
    move |source| ArchiveError::Io { what, source }
}

impl Manifest {
    /// Checks the manifest's own rules: known format, fixed names, each
    /// once, a blob entry's digest its name's.
    pub fn validate(&self) -> Result<(), ArchiveError> {
        if self.format > FORMAT {
            return Err(ArchiveError::Format(self.format));
        }
        let mut seen = std::collections::HashSet::new();
        for f in &self.files {
            let name = EntryName::parse(&f.name).ok_or_else(|| ArchiveError::BadName(f.name.clone()))?;
            if let EntryName::Blob(d) = name
                && d != f.sha256
            {
                return Err(ArchiveError::BadName(f.name.clone()));
            }
            if !seen.insert(f.name.as_str()) {
                return Err(ArchiveError::Duplicate(f.name.clone()));
            }
        }
        Ok(())
    }
}

/// Writes an archive: the manifest first, then each of its entries in
/// order (each checked against the manifest while it is copied), then the
/// closing SHA-256.
pub struct ArchiveWriter<W: Write> {
    out: W,
    hasher: Hasher,
    files: Vec<FileEntry>,
    next: usize,
}

impl<W: Write> ArchiveWriter<W> {
    pub fn new(mut out: W, manifest: &Manifest) -> Result<Self, ArchiveError> {
        manifest.validate()?;
        let json = serde_json::to_vec(manifest).map_err(ArchiveError::Manifest)?;
        let mut hasher = Hasher::new();
        let len = (json.len() as u64).to_be_bytes();
        for part in [&MAGIC[..], &len[..], &json[..]] {
            out.write_all(part).map_err(io_err("write the archive"))?;
            hasher.update(part);
        }
        Ok(ArchiveWriter {
            out,
            hasher,
            files: manifest.files.clone(),
            next: 0,
        })
    }

    /// Copies the entry `name` (the next the manifest lists) from `from`;
    /// refused unless it has exactly the size and SHA-256 the manifest says.
    pub fn entry(&mut self, name: &str, mut from: impl Read) -> Result<(), ArchiveError> {
        let Some(want) = self.files.get(self.next).cloned() else {
            return Err(ArchiveError::OutOfOrder {
                name: name.into(),
                expected: "nothing".into(),
            });
        };
        if want.name != name {
            return Err(ArchiveError::OutOfOrder {
                name: name.into(),
                expected: want.name,
            });
        }
        let mut entry = Hasher::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = from.read(&mut buf).map_err(io_err(format!("read {name}")))?;
            if n == 0 {
                break;
            }
            if entry.len() + n as u64 > want.size {
                return Err(ArchiveError::Changed {
                    name: name.into(),
                    why: format!("it grew beyond {} bytes", want.size),
                });
            }
            entry.update(&buf[..n]);
            self.hasher.update(&buf[..n]);
            self.out
                .write_all(&buf[..n])
                .map_err(io_err("write the archive"))?;
        }
        let (digest, size) = entry.finish();
        if (digest, size) != (want.sha256, want.size) {
            return Err(ArchiveError::Changed {
                name: name.into(),
                why: format!(
                    "{size} bytes with {digest}, expected {} bytes with {}",
                    want.size, want.sha256
                ),
            });
        }
        self.next += 1;
        Ok(())
    }

    /// Writes the closing SHA-256; returns the output and the SHA-256 of
    /// the whole archive (what `sha256sum` prints for it).
    pub fn finish(mut self) -> Result<(W, Digest), ArchiveError> {
        if self.next != self.files.len() {
            return Err(ArchiveError::Incomplete(self.next, self.files.len()));
        }
        let body = self.hasher.clone().finish().0;
        for part in [&END[..], &body.as_bytes()[..]] {
            self.out.write_all(part).map_err(io_err("write the archive"))?;
            self.hasher.update(part);
        }
        self.out.flush().map_err(io_err("write the archive"))?;
        Ok((self.out, self.hasher.finish().0))
    }
}

/// Reads an archive back: the manifest, then each entry into a writer the
/// caller gives, then the closing SHA-256.
pub struct ArchiveReader<R: Read> {
    inp: R,
    hasher: Hasher,
    manifest: Manifest,
    next: usize,
}

/// An entry as read: its manifest line and whether its bytes matched.
pub struct ReadEntry {
    pub entry: FileEntry,
    pub name: EntryName,
    /// The error if its size or SHA-256 differ from the manifest's.
    pub problem: Option<ArchiveError>,
}

impl<R: Read> ArchiveReader<R> {
    pub fn open(mut inp: R) -> Result<Self, ArchiveError> {
        let mut hasher = Hasher::new();
        let mut magic = [0u8; 8];
        read_exact(&mut inp, &mut magic, &mut hasher, "its marker").map_err(|e| match e {
            ArchiveError::Truncated { .. } => ArchiveError::NotAnArchive,
            e => e,
        })?;
        if &magic != MAGIC {
            return Err(ArchiveError::NotAnArchive);
        }
        let mut len = [0u8; 8];
        read_exact(&mut inp, &mut len, &mut hasher, "the manifest's length")?;
        let len = u64::from_be_bytes(len);
        if len > MAX_MANIFEST {
            return Err(ArchiveError::ManifestTooLarge(len));
        }
        let mut json = vec![0u8; len as usize];
        read_exact(&mut inp, &mut json, &mut hasher, "the manifest")?;
        let manifest: Manifest = serde_json::from_slice(&json).map_err(ArchiveError::Manifest)?;
        manifest.validate()?;
        Ok(ArchiveReader {
            inp,
            hasher,
            manifest,
            next: 0,
        })
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The manifest line of the entry [`Self::next_entry`] reads next.
    pub fn next_file(&self) -> Option<&FileEntry> {
        self.manifest.files.get(self.next)
    }

    /// Copies the next entry into `into`, checking it against the
    /// manifest; `None` after the last. An entry whose bytes differ is
    /// returned with its problem (the caller collects them); an archive
    /// that ends inside it is an error.
    pub fn next_entry(&mut self, mut into: impl Write) -> Result<Option<ReadEntry>, ArchiveError> {
        let Some(entry) = self.manifest.files.get(self.next).cloned() else {
            return Ok(None);
        };
        let name = EntryName::parse(&entry.name).ok_or_else(|| ArchiveError::BadName(entry.name.clone()))?;
        let mut own = Hasher::new();
        let mut left = entry.size;
        let mut buf = vec![0u8; 64 * 1024];
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            let n = self
                .inp
                .read(&mut buf[..want])
                .map_err(io_err("read the archive"))?;
            if n == 0 {
                return Err(ArchiveError::Truncated {
                    at: self.hasher.len(),
                    inside: format!("entry {}", entry.name),
                });
            }
            self.hasher.update(&buf[..n]);
            own.update(&buf[..n]);
            into.write_all(&buf[..n])
                .map_err(io_err(format!("write {}", entry.name)))?;
            left -= n as u64;
        }
        let (actual, size) = own.finish();
        let problem = (actual != entry.sha256).then(|| ArchiveError::EntryDigest {
            name: entry.name.clone(),
            size,
            actual,
            expected: entry.sha256,
        });
        self.next += 1;
        Ok(Some(ReadEntry { entry, name, problem }))
    }

    /// Reads the closing SHA-256 (after every entry) and checks it, and
    /// that nothing follows it.
    pub fn finish(mut self) -> Result<(), ArchiveError> {
        if self.next != self.manifest.files.len() {
            return Err(ArchiveError::Incomplete(self.next, self.manifest.files.len()));
        }
        let body = self.hasher.clone().finish().0;
        let mut end = [0u8; 40];
        read_exact(&mut self.inp, &mut end, &mut self.hasher, "its closing SHA-256")?;
        if &end[..8] != END || end[8..] != body.as_bytes()[..] {
            return Err(ArchiveError::Checksum);
        }
        let mut more = [0u8; 1];
        match self.inp.read(&mut more).map_err(io_err("read the archive"))? {
            0 => Ok(()),
            _ => Err(ArchiveError::TrailingBytes),
        }
    }
}

/// Fills `buf` or says where the archive ended.
fn read_exact(
    inp: &mut impl Read,
    buf: &mut [u8],
    hasher: &mut Hasher,
    inside: &str,
) -> Result<(), ArchiveError> {
    let mut got = 0;
    while got < buf.len() {
        let n = inp.read(&mut buf[got..]).map_err(io_err("read the archive"))?;
        if n == 0 {
            return Err(ArchiveError::Truncated {
                at: hasher.len() + got as u64,
                inside: inside.into(),
            });
        }
        got += n;
    }
    hasher.update(buf);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, bytes: &[u8]) -> FileEntry {
        FileEntry {
            name: name.into(),
            size: bytes.len() as u64,
            sha256: Digest::of(bytes),
            mode: 0o600,
        }
    }

    fn sample() -> (Manifest, Vec<(String, Vec<u8>)>) {
        let blob = b"kubelet bytes".to_vec();
        let d = Digest::of(&blob);
        let files = vec![
            ("state.db".to_string(), b"sqlite snapshot".to_vec()),
            ("pki/ca.key".to_string(), b"-----BEGIN PRIVATE KEY-----".to_vec()),
            ("admin.conf".to_string(), Vec::new()),
            (EntryName::Blob(d).path(), blob.clone()),
        ];
        let manifest = Manifest {
            format: FORMAT,
            server_version: "0.1.0".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            created_at_ms: 1_767_225_600_000,
            store: StoreKind::Sqlite,
            source: "/var/lib/lks".into(),
            files: files.iter().map(|(n, b)| entry(n, b)).collect(),
            blobs: vec![BlobEntry {
                digest: d,
                size: blob.len() as u64,
                bundles: vec!["kubelet@1".into()],
            }],
            blobs_included: true,
            counts: Counts {
                nodes: 3,
                ..Default::default()
            },
            etcd: None,
        };
        (manifest, files)
    }

    fn write(manifest: &Manifest, files: &[(String, Vec<u8>)]) -> (Vec<u8>, Digest) {
        let mut w = ArchiveWriter::new(Vec::new(), manifest).unwrap();
        for (n, b) in files {
            w.entry(n, &b[..]).unwrap();
        }
        w.finish().unwrap()
    }

    /// An entry's name, bytes and problem.
    type Got = (String, Vec<u8>, Option<String>);

    /// Every entry's bytes and problem, then the closing check.
    fn read(bytes: &[u8]) -> Result<(Manifest, Vec<Got>), ArchiveError> {
        let mut r = ArchiveReader::open(bytes)?;
        let manifest = r.manifest().clone();
        let mut out = Vec::new();
        loop {
            let mut buf = Vec::new();
            let Some(e) = r.next_entry(&mut buf)? else { break };
            out.push((e.entry.name, buf, e.problem.map(|p| p.to_string())));
        }
        r.finish()?;
        Ok((manifest, out))
    }

    #[test]
    fn an_archive_reads_back_what_was_written() {
        let (manifest, files) = sample();
        let (bytes, digest) = write(&manifest, &files);
        assert_eq!(digest, Digest::of(&bytes), "the printed SHA-256 is the file's");
        let (m, got) = read(&bytes).unwrap();
        assert_eq!(m, manifest);
        let want: Vec<_> = files.into_iter().map(|(n, b)| (n, b, None)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn every_truncation_is_refused() {
        let (manifest, files) = sample();
        let (bytes, _) = write(&manifest, &files);
        for cut in 0..bytes.len() {
            let e = read(&bytes[..cut])
                .err()
                .unwrap_or_else(|| panic!("cut at {cut} was read"));
            assert!(
                matches!(e, ArchiveError::Truncated { .. } | ArchiveError::NotAnArchive),
                "cut at {cut}: {e}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(read(&longer), Err(ArchiveError::TrailingBytes)));
    }

    #[test]
    fn every_altered_byte_is_refused() {
        let (manifest, files) = sample();
        let (bytes, _) = write(&manifest, &files);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x20;
            let refused = match read(&bad) {
                Err(_) => true,
                Ok((_, entries)) => entries.iter().any(|e| e.2.is_some()),
            };
            assert!(refused, "byte {i} altered was accepted");
        }
    }

    #[test]
    fn an_altered_entry_is_named() {
        let (manifest, files) = sample();
        let (mut bytes, _) = write(&manifest, &files);
        // The blob's bytes, not the manifest's mention of kubelet@1.
        let at = bytes.windows(13).rposition(|w| w == b"kubelet bytes").unwrap();
        bytes[at] = b'K';
        let mut r = ArchiveReader::open(&bytes[..]).unwrap();
        let mut problems = Vec::new();
        while let Some(e) = r.next_entry(io::sink()).unwrap() {
            problems.extend(e.problem.map(|p| p.to_string()));
        }
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("entry blobs/sha256/"), "{}", problems[0]);
        assert!(matches!(r.finish(), Err(ArchiveError::Checksum)));
    }

    #[test]
    fn names_outside_the_data_dir_are_refused() {
        for bad in [
            "../state.db",
            "/etc/passwd",
            "pki/../state.db",
            "pki/.hidden",
            "pki/",
            "pki/a/b",
            "blobs/sha256/00/abc",
            "state.db/x",
        ] {
            assert_eq!(EntryName::parse(bad), None, "{bad}");
        }
        let d = Digest::of(b"x");
        let hex = d.hex();
        assert_eq!(
            EntryName::parse(&format!("blobs/sha256/ff/{hex}")),
            None,
            "the fan-out dir is the digest's first byte"
        );
        assert_eq!(
            EntryName::parse(&EntryName::Blob(d).path()),
            Some(EntryName::Blob(d))
        );

        let (mut manifest, _) = sample();
        manifest.files[0].name = "../x".into();
        assert!(matches!(manifest.validate(), Err(ArchiveError::BadName(_))));
        let (mut manifest, _) = sample();
        manifest.files[3].sha256 = Digest::of(b"other");
        assert!(
            matches!(manifest.validate(), Err(ArchiveError::BadName(_))),
            "a blob entry is the bytes of its digest"
        );
        let (mut manifest, _) = sample();
        manifest.files[1] = manifest.files[0].clone();
        assert!(matches!(manifest.validate(), Err(ArchiveError::Duplicate(_))));
    }

    #[test]
    fn a_writer_refuses_bytes_that_are_not_the_manifests() {
        let (manifest, files) = sample();
        let mut w = ArchiveWriter::new(Vec::new(), &manifest).unwrap();
        let e = w.entry("admin.conf", &b""[..]).err().unwrap();
        assert!(matches!(e, ArchiveError::OutOfOrder { .. }), "{e}");
        let e = w.entry("state.db", &b"sqlite snapshot, grown"[..]).err().unwrap();
        assert!(
            e.to_string().contains("changed while it was being archived"),
            "{e}"
        );
        let mut w = ArchiveWriter::new(Vec::new(), &manifest).unwrap();
        w.entry(&files[0].0, &files[0].1[..]).unwrap();
        assert!(matches!(w.finish(), Err(ArchiveError::Incomplete(1, 4))));
    }
}
