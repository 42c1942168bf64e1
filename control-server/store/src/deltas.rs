//! Binary deltas (issue [delta]) the server holds: per file of a bundle
//! version, the patch that rebuilds it from the file at the same path (and
//! architecture) of an earlier version, or why there is none ([`NoPatch`]:
//! skipped before a diff, or abandoned after one), so it is not tried
//! again while that reason holds.
//!
//! A row lives as long as its bundle version: deleting the version drops
//! its rows, and the blob collector keeps a patch while a row names it
//! ([`crate::BlobRecords::referenced_blobs`]). A patch is transport
//! only (the agent checks the rebuilt file against the manifest), so a row
//! needs no signature.

use async_trait::async_trait;
use lks_proto::Digest;

use super::Result;

/// One file's patch from one earlier version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeltaRow {
    /// The bundle version whose file the patch rebuilds.
    pub name: String,
    pub version: String,
    pub path: String,
    /// "" for a neutral file.
    pub arch: String,
    /// The earlier version and its file's bytes, the patch's base.
    pub from_version: String,
    pub base: Digest,
    /// The file the patch rebuilds, and its size.
    pub target: Digest,
    pub size: u64,
    /// The patch blob; `None`: skipped (`why`, and `note`, say why).
    pub patch: Option<Digest>,
    pub patch_size: u64,
    pub algorithm: String,
    pub note: String,
    pub made_at_ms: i64,
    /// Why there is no patch (issue [upgrade-cost]); `None` for a patch,
    /// and for a row recorded before the reasons were (a patch over half
    /// its file: `note`).
    pub why: Option<NoPatch>,
}

/// Why a file has no patch from a base (issue [upgrade-cost]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoPatch {
    /// Skipped before the diff: the estimate said the base supplies
    /// `saving` % of the file, less than the `min` % asked for
    /// (`--delta-min-saving`).
    Estimate { saving: u8, min: u8 },
    /// Skipped before the diff: making it needs about `need` bytes of
    /// memory, more than `cap` (`--delta-max-memory`).
    Memory { need: u64, cap: u64 },
    /// Abandoned after the diff: the patch (`patch_size` bytes) was over
    /// half its file.
    TooLarge { patch_size: u64 },
}

impl NoPatch {
    /// Abandoned (a diff was made and thrown away), not skipped.
    pub fn abandoned(&self) -> bool {
        matches!(self, NoPatch::TooLarge { .. })
    }

    /// The stored form, the same on every backend: `estimate SAVING MIN`,
    /// `memory NEED CAP`, `too-large PATCH_SIZE`.
    pub fn encode(&self) -> String {
        match self {
            NoPatch::Estimate { saving, min } => format!("estimate {saving} {min}"),
            NoPatch::Memory { need, cap } => format!("memory {need} {cap}"),
            NoPatch::TooLarge { patch_size } => format!("too-large {patch_size}"),
        }
    }

    /// The stored form read back; `""` is `None` (a patch, or an older
    /// row).
    pub fn decode(s: &str) -> std::result::Result<Option<NoPatch>, BadNoPatch> {
        let bad = || BadNoPatch(s.to_string());
        let mut words = s.split(' ');
        let kind = words.next().unwrap_or_default();
        let mut num = || -> std::result::Result<u64, BadNoPatch> {
            words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)
        };
        let why = match kind {
            "" => return Ok(None),
            "estimate" => NoPatch::Estimate {
                saving: u8::try_from(num()?).map_err(|_| bad())?,
                min: u8::try_from(num()?).map_err(|_| bad())?,
            },
            "memory" => NoPatch::Memory {
                need: num()?,
                cap: num()?,
            },
            "too-large" => NoPatch::TooLarge { patch_size: num()? },
            _ => return Err(bad()),
        };
        if words.next().is_some() {
            return Err(bad());
        }
        Ok(Some(why))
    }
}

/// A stored [`NoPatch`] this build cannot read.
#[derive(Debug, thiserror::Error)]
#[error("unknown no-patch reason {0:?}")]
pub struct BadNoPatch(pub String);

/// The deltas of bundle versions, on SQLite and etcd alike (one
/// conformance suite, `store::conformance::deltas`).
#[async_trait]
pub trait DeltaStore: Send + Sync {
    /// Records a patch (or a skip) for its file and base. A row with a
    /// patch already there for them is kept as it is; one without is
    /// replaced (the maker tries a pair again once the limits that skipped
    /// it changed). Refused (`NotFound`) if the bundle version is gone.
    async fn put_delta(&self, row: &DeltaRow) -> Result<()>;
    /// Every row of NAME@VERSION, made and skipped.
    async fn deltas_of(&self, name: &str, version: &str) -> Result<Vec<DeltaRow>>;
    /// The patches that rebuild `target` (made ones only), from any bundle
    /// version holding it.
    async fn deltas_to(&self, target: &Digest) -> Result<Vec<DeltaRow>>;
    /// The rows whose patch is `patch`.
    async fn deltas_by_patch(&self, patch: &Digest) -> Result<Vec<DeltaRow>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_reads_back_as_written() {
        for why in [
            NoPatch::Estimate { saving: 3, min: 50 },
            NoPatch::Memory {
                need: 1 << 31,
                cap: 1 << 30,
            },
            NoPatch::TooLarge { patch_size: 77 },
        ] {
            assert_eq!(NoPatch::decode(&why.encode()).unwrap(), Some(why));
        }
        assert_eq!(NoPatch::decode("").unwrap(), None);
        for bad in [
            "estimate 3",
            "estimate 300 50",
            "memory 1 2 3",
            "later 1",
            "too-large x",
        ] {
            assert!(NoPatch::decode(bad).is_err(), "{bad}");
        }
    }
}
