//! `bsdiff4-zstd`: bsdiff 4's three sections (controls, differences,
//! extra bytes) each in one zstd frame instead of a bzip2 stream.
//!
//! Why: applying a bsdiff 4 patch spends nearly all its time decoding
//! bzip2 (the differences section is as long as the file, mostly zeros);
//! zstd decodes the same bytes about ten times faster, so a node rebuilds
//! a file in less time than it takes to fetch it over loopback
//! (BENCHMARKS.md, "Binary deltas: the rebuild's time"). The search that
//! finds the differences is qbsdiff's, unchanged: [`transcode`] re-encodes
//! the sections of the patch it made.
//!
//! Layout (all integers as bsdiff 4 writes them: 8 bytes, little endian,
//! sign in the top bit):
//!
//! ```text
//! "BSDIFZ40" | controls' frame length | differences' frame length | file size
//! | controls frame | differences frame | extra frame
//! ```
//!
//! A control is three integers: `add` bytes of the base (from the base's
//! cursor) plus as many difference bytes, then `copy` extra bytes, then the
//! base's cursor moves by `seek`. The applier refuses anything that reads
//! outside the base, runs past the file's size or ends short, so a corrupt
//! or lying patch fails (or gives bytes the caller's digest check refuses);
//! it never panics or allocates by a patch's say-so.

use std::io::{self, Read, Write};

use bzip2::read::BzDecoder;

const MAGIC: &[u8; 8] = b"BSDIFZ40";
const BSDIFF4: &[u8; 8] = b"BSDIFF40";
const HEADER: usize = 32;
/// zstd level of the three frames: the differences are long runs of zeros,
/// which every level packs about as well (measured on the kubectl pair:
/// see BENCHMARKS.md); 19 costs the server a second more per 80 MB, once.
const LEVEL: i32 = 19;
/// The largest window a frame may ask the decoder for (1 << 23 = 8 MiB):
/// the encoder keeps to it, so a node's memory for the three decoders is
/// bounded whatever the patch says.
const WINDOW_LOG: u32 = 23;
/// Output chunk: what the applier holds of the rebuilt file at once.
const CHUNK: usize = 1 << 20;

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

fn int(b: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    let x = u64::from_le_bytes(a);
    if x >> 63 == 0 || x == 1 << 63 {
        x as i64
    } else {
        ((x & ((1 << 63) - 1)) as i64).wrapping_neg()
    }
}

fn put_int(x: i64, out: &mut Vec<u8>) {
    let v = if x < 0 {
        x.unsigned_abs() | (1 << 63)
    } else {
        x as u64
    };
    out.extend_from_slice(&v.to_le_bytes());
}

/// The three sections of a patch, by the lengths its header gives.
fn split<'a>(patch: &'a [u8], magic: &[u8; 8]) -> io::Result<(u64, [&'a [u8]; 3])> {
    if patch.len() < HEADER || &patch[..8] != magic {
        return Err(invalid("not a patch of this kind (its header)"));
    }
    let len = |at: usize| usize::try_from(int(&patch[at..at + 8])).ok();
    let (Some(c), Some(d)) = (len(8), len(16)) else {
        return Err(invalid("a section length is negative"));
    };
    let size = u64::try_from(int(&patch[24..32])).map_err(|_| invalid("the file size is negative"))?;
    let body = &patch[HEADER..];
    if c.checked_add(d).is_none_or(|n| n > body.len()) {
        return Err(invalid("the sections run past the patch"));
    }
    let (ctrl, rest) = body.split_at(c);
    let (diff, extra) = rest.split_at(d);
    Ok((size, [ctrl, diff, extra]))
}

/// Checks a bsdiff 4 patch's header (its magic, and section lengths that
/// fit the patch) before qbsdiff reads it: qbsdiff adds the lengths
/// unchecked, so a forged header overflows there (found by fuzzing).
pub fn check_bsdiff4(patch: &[u8]) -> io::Result<u64> {
    split(patch, BSDIFF4).map(|(size, _)| size)
}

/// Re-encodes a bsdiff 4 patch (qbsdiff's) as `bsdiff4-zstd`, streaming
/// each section from bzip2 into zstd: memory is the two codecs' windows,
/// never a section decoded whole.
pub fn transcode(bsdiff4: &[u8]) -> io::Result<Vec<u8>> {
    let (size, sections) = split(bsdiff4, BSDIFF4)?;
    let mut frames = Vec::with_capacity(3);
    for s in sections {
        let mut frame = Vec::new();
        let mut enc = zstd::stream::write::Encoder::new(&mut frame, LEVEL)?;
        enc.window_log(WINDOW_LOG)?;
        io::copy(&mut BzDecoder::new(s), &mut enc)?;
        enc.finish()?;
        frames.push(frame);
    }
    let mut out = Vec::with_capacity(HEADER + frames.iter().map(Vec::len).sum::<usize>());
    out.extend_from_slice(MAGIC);
    put_int(frames[0].len() as i64, &mut out);
    put_int(frames[1].len() as i64, &mut out);
    put_int(size as i64, &mut out);
    for f in &frames {
        out.extend_from_slice(f);
    }
    Ok(out)
}

/// The size of the file a `bsdiff4-zstd` patch rebuilds, from its header.
pub fn target_size(patch: &[u8]) -> io::Result<u64> {
    split(patch, MAGIC).map(|(size, _)| size)
}

fn decoder(frame: &[u8]) -> io::Result<zstd::stream::read::Decoder<'_, &[u8]>> {
    let mut d = zstd::stream::read::Decoder::with_buffer(frame)?;
    d.window_log_max(WINDOW_LOG)?;
    Ok(d)
}

/// Reads exactly `buf.len()` bytes, or none at a clean end (`Ok(false)`).
fn read_all_or_none(r: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) if n == 0 => return Ok(false),
            Ok(0) => return Err(invalid("a control is cut short")),
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Rebuilds the file from `base` and a `bsdiff4-zstd` patch into `out`, a
/// chunk of at most 1 MiB at a time. Returns the bytes written. Errors of
/// `out` come back as they are.
pub fn apply(base: &[u8], patch: &[u8], out: &mut impl Write) -> io::Result<u64> {
    let (size, [ctrl, diff, extra]) = split(patch, MAGIC)?;
    let (mut ctrl, mut diff, mut extra) = (decoder(ctrl)?, decoder(diff)?, decoder(extra)?);
    let mut chunk = vec![0u8; CHUNK.min(usize::try_from(size).unwrap_or(CHUNK)).max(1)];
    let mut control = [0u8; 24];
    let (mut cursor, mut written) = (0usize, 0u64);
    while read_all_or_none(&mut ctrl, &mut control)? {
        let add = u64::try_from(int(&control[0..8])).map_err(|_| invalid("a negative add"))?;
        let copy = u64::try_from(int(&control[8..16])).map_err(|_| invalid("a negative copy"))?;
        let seek = int(&control[16..24]);
        if add
            .checked_add(copy)
            .and_then(|n| n.checked_add(written))
            .is_none_or(|n| n > size)
        {
            return Err(invalid("the controls run past the file's size"));
        }
        let add = usize::try_from(add).map_err(|_| invalid("an add over the address space"))?;
        if cursor.checked_add(add).is_none_or(|end| end > base.len()) {
            return Err(invalid("a control reads past the base"));
        }
        let mut left = add;
        while left > 0 {
            let k = left.min(chunk.len());
            diff.read_exact(&mut chunk[..k])?;
            for (x, b) in chunk[..k].iter_mut().zip(&base[cursor..cursor + k]) {
                *x = x.wrapping_add(*b);
            }
            out.write_all(&chunk[..k])?;
            cursor += k;
            left -= k;
        }
        let mut left = copy;
        while left > 0 {
            let k = left.min(chunk.len() as u64) as usize;
            extra.read_exact(&mut chunk[..k])?;
            out.write_all(&chunk[..k])?;
            left -= k as u64;
        }
        written += add as u64 + copy;
        cursor = i64::try_from(cursor)
            .ok()
            .and_then(|c| c.checked_add(seek))
            .and_then(|c| usize::try_from(c).ok())
            .filter(|c| *c <= base.len())
            .ok_or_else(|| invalid("a control seeks outside the base"))?;
    }
    if written != size {
        return Err(invalid("the controls end before the file does"));
    }
    let mut probe = [0u8; 1];
    if diff.read(&mut probe)? != 0 || extra.read(&mut probe)? != 0 {
        return Err(invalid("bytes are left over after the last control"));
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Vec<u8>, Vec<u8>) {
        let old: Vec<u8> = (0..300_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let mut new = old.clone();
        new[70_000] ^= 1;
        new.splice(100_000..100_000, *b"inserted");
        new.extend_from_slice(b"and a tail the base never had");
        (old, new)
    }

    #[test]
    fn a_transcoded_patch_rebuilds_what_the_bsdiff4_one_does() {
        let (old, new) = pair();
        let p4 = crate::delta::make(&old, &new).unwrap();
        let pz = transcode(&p4).unwrap();
        assert_eq!(target_size(&pz).unwrap(), new.len() as u64);
        let mut out = Vec::new();
        assert_eq!(apply(&old, &pz, &mut out).unwrap(), new.len() as u64);
        assert_eq!(out, new);
        // A bsdiff 4 patch is not this kind, and the reverse.
        assert!(apply(&old, &p4, &mut Vec::new()).is_err());
        assert!(transcode(&pz).is_err());
    }

    #[test]
    fn integers_round_trip_with_their_sign() {
        for x in [0i64, 1, -1, 1 << 40, -(1 << 40), i64::MAX, -i64::MAX] {
            let mut b = Vec::new();
            put_int(x, &mut b);
            assert_eq!(int(&b), x);
        }
    }

    /// A patch whose controls are these triples, differences all zero
    /// (copies of the base) and `extra` extra bytes, for `size` bytes.
    fn forged(controls: &[(i64, i64, i64)], extra: usize, size: i64) -> Vec<u8> {
        let mut c = Vec::new();
        let mut adds = 0;
        for &(a, k, s) in controls {
            put_int(a, &mut c);
            put_int(k, &mut c);
            put_int(s, &mut c);
            adds += a.max(0) as usize;
        }
        let frames = [
            zstd::encode_all(&c[..], 1).unwrap(),
            zstd::encode_all(&vec![0u8; adds][..], 1).unwrap(),
            zstd::encode_all(&vec![7u8; extra][..], 1).unwrap(),
        ];
        let mut out = MAGIC.to_vec();
        put_int(frames[0].len() as i64, &mut out);
        put_int(frames[1].len() as i64, &mut out);
        put_int(size, &mut out);
        for f in frames {
            out.extend_from_slice(&f);
        }
        out
    }

    #[test]
    fn a_lying_patch_is_refused_not_obeyed() {
        let base = vec![1u8; 1000];
        let ok = forged(&[(1000, 10, -1000), (500, 0, 0)], 10, 1510);
        let mut out = Vec::new();
        assert_eq!(apply(&base, &ok, &mut out).unwrap(), 1510);
        assert_eq!(&out[1000..1010], &[7u8; 10]);
        for (why, p) in [
            ("reads past the base", forged(&[(1001, 0, 0)], 0, 1001)),
            ("seeks before the base", forged(&[(10, 0, -11), (1, 0, 0)], 0, 11)),
            ("runs past the size", forged(&[(1000, 0, 0)], 0, 999)),
            ("ends short", forged(&[(10, 0, 0)], 0, 11)),
            ("negative add", forged(&[(-1, 0, 0)], 0, 0)),
            ("negative copy", forged(&[(0, -5, 0)], 0, 0)),
            ("bytes left over", forged(&[(10, 0, 0)], 5, 10)),
            ("a huge size", forged(&[(10, 0, 0)], 0, i64::MAX)),
        ] {
            assert!(apply(&base, &p, &mut Vec::new()).is_err(), "{why}");
        }
        // Truncated anywhere, or a section length pointing past the end.
        for cut in [0, 8, 31, ok.len() / 2, ok.len() - 1] {
            assert!(apply(&base, &ok[..cut], &mut Vec::new()).is_err(), "cut at {cut}");
        }
        let mut long = ok.clone();
        long[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(apply(&base, &long, &mut Vec::new()).is_err());
    }
}
