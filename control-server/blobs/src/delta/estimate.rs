//! The delta maker's estimate before a full diff (issue [upgrade-cost]):
//! the share of a new file's bytes that its base can supply, so a pair
//! that would not pay is skipped for a small fraction of a diff's cost.
//!
//! bsdiff builds a patch from exact matches extended while at least half
//! the bytes still agree, so a rebuilt binary whose addresses shifted (a
//! byte changed every dozen or so) patches to a few percent; comparing
//! chunks or short windows whole calls such a pair half unrelated
//! (measured on kubectl builds: 47–57 % of 8-byte windows shared, against
//! bsdiff patches of 3–7 % of the file). So the estimate finds alignments
//! and then compares bytes, as bsdiff does:
//!
//! 1. One streaming pass over each file: a rolling (gear) hash of every
//!    [`WINDOW`]-byte window, and of those the [`SAMPLE`] smallest
//!    distinct values with where they first occur (a bottom-k sketch).
//!    Values below both sketches' largest are a uniform sample of both
//!    files' distinct windows.
//! 2. The new file's sampled windows that the base holds too are anchors:
//!    each pairs an offset in the new file with one in the base.
//! 3. Around each sampled window of the new file ([`SPAN`] bytes), the
//!    bytes are compared with the base's under the nearest anchors'
//!    alignments; the share of equal bytes under the best one counts if it
//!    is at least half (bsdiff's rule), else nothing. The mean over the
//!    sample is the estimate.
//!
//! Memory is bounded by the sketches and one read buffer whatever the
//! files' sizes; step 3 reads at most `2 × SAMPLE` spans of each file.
//! Repeated windows count once: repeats (padding, zero runs) cost a
//! compressed patch next to nothing, and one frequent value sampled or not
//! would swing the estimate.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Windows kept per file: the estimate's memory (a few hundred KiB) and
/// its precision (about ±2 % of the share).
pub const SAMPLE: usize = 8192;
/// The window a hash value covers: each byte shifts the hash by
/// `64 / WINDOW` bits, so a byte has left it after this many more.
pub const WINDOW: u64 = 8;
const SHIFT: u32 = (64 / WINDOW) as u32;
/// The bytes compared around a sampled window under an alignment.
pub const SPAN: u64 = 256;
/// What one read takes from a file.
const READ_BUFFER: usize = 1 << 20;

/// 256 fixed pseudo-random 64-bit values, one per byte value (splitmix64
/// of the byte): the gear hash's table.
const GEAR: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = mix(i as u64 ^ 0x9e37_79b9_7f4a_7c15);
        i += 1;
    }
    t
};

/// splitmix64's finaliser: spreads a value's bits over all 64.
const fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A bottom-k sketch of a file: its [`SAMPLE`] smallest distinct window
/// values, each with the offset just past the window's first occurrence.
#[derive(Debug, Default)]
pub struct Sketch {
    kept: BTreeMap<u64, u64>,
    /// Every byte of the file.
    total: u64,
}

impl Sketch {
    /// Every value at or below this is kept: the largest kept once the
    /// sketch is full, else any.
    fn threshold(&self) -> u64 {
        match self.kept.last_key_value() {
            Some((&largest, _)) if self.kept.len() >= SAMPLE => largest,
            _ => u64::MAX,
        }
    }

    fn add(&mut self, v: u64, end: u64) {
        if self.kept.contains_key(&v) {
            return;
        }
        self.kept.insert(v, end);
        if self.kept.len() > SAMPLE {
            self.kept.pop_last();
        }
    }

    /// The sketch of everything `r` yields, in one pass.
    pub fn of(mut r: impl Read) -> io::Result<Sketch> {
        let mut sketch = Sketch::default();
        let mut buf = vec![0u8; READ_BUFFER];
        let (mut h, mut threshold) = (0u64, u64::MAX);
        loop {
            let n = match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let mut bytes = &buf[..n];
            // The first window is whole only after WINDOW bytes.
            while sketch.total < WINDOW - 1
                && let Some((&b, rest)) = bytes.split_first()
            {
                h = (h << SHIFT).wrapping_add(GEAR[b as usize]);
                sketch.total += 1;
                bytes = rest;
            }
            let at = sketch.total;
            for (i, &b) in bytes.iter().enumerate() {
                h = (h << SHIFT).wrapping_add(GEAR[b as usize]);
                if h <= threshold {
                    sketch.add(h, at + i as u64 + 1);
                    threshold = sketch.threshold();
                }
            }
            sketch.total += bytes.len() as u64;
        }
        Ok(sketch)
    }
}

/// Random access to a file's bytes (a file, or bytes in memory in tests).
pub trait At {
    /// Fills `buf` from `offset` as far as the content goes; the bytes read.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl At for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            match FileExt::read_at(self, &mut buf[n..], offset + n as u64) {
                Ok(0) => break,
                Ok(m) => n += m,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }
}

impl At for &[u8] {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let from = usize::try_from(offset).unwrap_or(usize::MAX).min(self.len());
        let n = buf.len().min(self.len() - from);
        buf[..n].copy_from_slice(&self[from..from + n]);
        Ok(n)
    }
}

/// The estimated share, in percent (0–100), of `target`'s bytes that
/// `base` can supply (the module's steps 2 and 3). A target shorter than
/// a window is 0 %.
pub fn supplied_percent(
    (base, base_sketch): (&impl At, &Sketch),
    (target, target_sketch): (&impl At, &Sketch),
) -> io::Result<u8> {
    let cut = base_sketch.threshold().min(target_sketch.threshold());
    let sampled: Vec<(u64, u64)> = target_sketch
        .kept
        .range(..=cut)
        .map(|(v, at)| (*v, *at))
        .collect();
    if sampled.is_empty() {
        return Ok(0);
    }
    // Anchors by their offset in the target: the alignment base - target.
    let anchors: BTreeMap<u64, i128> = sampled
        .iter()
        .filter_map(|(v, at)| Some((*at, i128::from(*base_sketch.kept.get(v)?) - i128::from(*at))))
        .collect();
    let (mut t, mut b) = (vec![0u8; SPAN as usize], vec![0u8; SPAN as usize]);
    let mut sum = 0u64;
    for (_, at) in &sampled {
        let start = at.saturating_sub(SPAN / 2);
        let n = target.read_at(&mut t, start)?;
        let near = [anchors.range(..=*at).next_back(), anchors.range(at + 1..).next()];
        let mut best = 0;
        for (_, shift) in near.into_iter().flatten() {
            let Ok(from) = u64::try_from(i128::from(start) + shift) else {
                continue;
            };
            let m = base.read_at(&mut b[..n], from)?;
            let equal = t[..m].iter().zip(&b[..m]).filter(|(x, y)| x == y).count();
            best = best.max(equal * 100 / n.max(1));
        }
        if best >= 50 {
            sum += best as u64;
        }
    }
    Ok(u8::try_from(sum / sampled.len() as u64).unwrap_or(100))
}

/// [`supplied_percent`] of two files: each read once in full, then in a
/// bounded number of spans.
pub fn estimate_files(base: &Path, target: &Path) -> io::Result<u8> {
    let (b, t) = (File::open(base)?, File::open(target)?);
    let (bs, ts) = (Sketch::of(&b)?, Sketch::of(&t)?);
    supplied_percent((&b, &bs), (&t, &ts))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic noise (xorshift64*): unrelated for different seeds.
    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = mix(seed) | 1;
        (0..len)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
            })
            .collect()
    }

    fn est(base: &[u8], target: &[u8]) -> u8 {
        let (bs, ts) = (Sketch::of(base).unwrap(), Sketch::of(target).unwrap());
        supplied_percent((&base, &bs), (&target, &ts)).unwrap()
    }

    const LEN: usize = 4 << 20;

    #[test]
    fn identical_files_share_everything() {
        let a = noise(LEN, 1);
        assert_eq!(est(&a, &a), 100);
    }

    #[test]
    fn unrelated_files_share_nothing() {
        assert!(est(&noise(LEN, 1), &noise(LEN, 2)) <= 1);
        assert_eq!(est(&noise(LEN, 1), &[]), 0, "an empty target");
        assert_eq!(est(&[], &noise(LEN, 1)), 0, "an empty base");
    }

    #[test]
    fn an_insertion_in_the_middle_keeps_the_rest_shared() {
        let a = noise(LEN, 3);
        let mut b = a.clone();
        b.splice(LEN / 2..LEN / 2, noise(4096, 4));
        let p = est(&a, &b);
        assert!(p >= 95, "{p}");
    }

    #[test]
    fn a_truncated_or_appended_file_is_mostly_shared() {
        let a = noise(LEN, 5);
        let truncated = &a[..LEN * 3 / 4];
        let p = est(&a, truncated);
        assert!(p >= 95, "truncated: {p}");
        let mut appended = a.clone();
        appended.extend(noise(LEN / 10, 6));
        let p = est(&a, &appended);
        assert!((85..=95).contains(&p), "appended a tenth: {p}");
    }

    #[test]
    fn scattered_small_edits_still_leave_most_chunks_shared() {
        // A rebuilt binary: a byte changed every 4 KiB.
        let a = noise(LEN, 7);
        let mut b = a.clone();
        for i in (0..LEN).step_by(4096) {
            b[i] ^= 0x5a;
        }
        let p = est(&a, &b);
        assert!(p >= 90, "{p}");
    }

    #[test]
    fn half_related_is_about_half() {
        let a = noise(LEN, 8);
        let mut b = a[..LEN / 2].to_vec();
        b.extend(noise(LEN / 2, 9));
        let p = est(&a, &b);
        assert!((40..=60).contains(&p), "{p}");
    }

    #[test]
    fn repeated_content_counts_once() {
        // Long zero runs make many identical maximal chunks: one
        // fingerprint, counted once, so the unrelated halves decide.
        let mut a = vec![0u8; LEN / 2];
        a.extend(noise(LEN / 2, 10));
        let mut b = vec![0u8; LEN / 2];
        b.extend(noise(LEN / 2, 11));
        let p = est(&a, &b);
        assert!(p <= 2, "{p}");
    }

    #[test]
    fn the_sketch_stays_bounded() {
        let s = Sketch::of(&noise(LEN, 12)[..]).unwrap();
        assert_eq!(s.kept.len(), SAMPLE);
        assert_eq!(s.total, LEN as u64);
    }

    #[test]
    fn reads_of_any_size_give_the_same_sketch() {
        // A reader that yields 7 bytes at a time.
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(7).min(self.0.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let a = noise(1 << 16, 13);
        let (whole, trickled) = (Sketch::of(&a[..]).unwrap(), Sketch::of(Trickle(&a)).unwrap());
        assert_eq!(whole.kept, trickled.kept);
        assert_eq!(whole.total, trickled.total);
    }
}
