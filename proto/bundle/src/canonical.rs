//! The canonical byte encoding of a manifest: what is hashed and signed.
//!
//! Length-prefixed big-endian fields in a fixed order, after a domain
//! separator, with files sorted by path (their order carries no meaning) and
//! steps in their given order (it does). Two manifests that mean the same
//! thing encode to the same bytes, whatever the field or file order of the
//! `bundle.toml` or protobuf they came from; any difference in meaning gives
//! different bytes, since every variable-length field carries its length.

use crate::digest::Digest;
use crate::manifest::Manifest;

/// Domain separator; bump the version if the encoding ever changes.
pub const DOMAIN: &[u8] = b"lks.bundle.manifest.v1\0";

/// The canonical encoding of `m`.
pub fn encode(m: &Manifest) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + m.files.len() * 128);
    out.extend_from_slice(DOMAIN);
    put_str(&mut out, &m.name);
    put_str(&mut out, &m.version);

    let files = sorted_files(m);
    put_u32(&mut out, files.len() as u32);
    for f in &files {
        put_str(&mut out, f.path.as_str());
        out.extend_from_slice(f.digest.as_bytes());
        out.extend_from_slice(&f.size.to_be_bytes());
        put_u32(&mut out, f.mode);
        match &f.url {
            None => out.push(0),
            Some(u) => {
                out.push(1);
                put_str(&mut out, u);
            }
        }
    }

    put_u32(&mut out, m.steps.len() as u32);
    for s in &m.steps {
        put_str(&mut out, &s.name);
        put_argv(&mut out, &s.run);
        out.extend_from_slice(&(s.timeout.as_millis() as u64).to_be_bytes());
    }

    match &m.health {
        None => out.push(0),
        Some(h) => {
            out.push(1);
            put_argv(&mut out, &h.run);
            out.extend_from_slice(&(h.timeout.as_millis() as u64).to_be_bytes());
            put_u32(&mut out, h.retries);
            out.extend_from_slice(&(h.interval.as_millis() as u64).to_be_bytes());
        }
    }

    // Added with `[[certificate]]`: present only when used, so manifests
    // without them keep the bytes (and signatures) they always had.
    if !m.certificates.is_empty() || !m.kubeconfigs.is_empty() {
        out.push(b'C');
        let mut certs: Vec<_> = m.certificates.iter().collect();
        certs.sort_by(|a, b| a.path.cmp(&b.path));
        put_u32(&mut out, certs.len() as u32);
        for c in certs {
            put_str(&mut out, c.path.as_str());
            put_str(&mut out, c.key_path.as_str());
            put_str(&mut out, c.profile.as_str());
            put_str(&mut out, &c.common_name);
            put_argv(&mut out, &c.organizations);
            put_argv(&mut out, &c.dns_names);
            put_argv(&mut out, &c.ip_addresses);
            out.extend_from_slice(&(c.ttl.as_millis() as u64).to_be_bytes());
            put_str(&mut out, c.ca_path.as_ref().map_or("", |p| p.as_str()));
        }
        let mut kcs: Vec<_> = m.kubeconfigs.iter().collect();
        kcs.sort_by(|a, b| a.path.cmp(&b.path));
        put_u32(&mut out, kcs.len() as u32);
        for k in kcs {
            put_str(&mut out, k.path.as_str());
            put_str(&mut out, k.certificate.as_str());
        }
    }
    // Added with self-updates, the same way.
    if m.self_update {
        out.push(b'S');
    }
    // Added with multi-arch bundles, the same way: the declared
    // architectures, then each file's arch ("" for neutral) in the order
    // the files were encoded above.
    if m.is_multi_arch() {
        out.push(b'A');
        let declared: Vec<String> = m.architectures.iter().map(|a| a.to_string()).collect();
        put_argv(&mut out, &declared);
        put_u32(&mut out, files.len() as u32);
        for f in &files {
            put_str(&mut out, f.arch.map_or("", |a| a.as_str()));
        }
    }
    // Added with `on_heal` steps, the same way: one byte per step, in the
    // order the steps were encoded above.
    if m.has_heal_steps() {
        out.push(b'H');
        put_u32(&mut out, m.steps.len() as u32);
        out.extend(m.steps.iter().map(|s| u8::from(s.on_heal)));
    }
    // Added with `reboot = "required"`, the same way.
    if m.reboot.is_required() {
        out.push(b'R');
    }
    out
}

/// Files by path, then arch (neutral first): one path has several files
/// only when they are for different architectures.
fn sorted_files(m: &Manifest) -> Vec<&crate::manifest::FileSpec> {
    let mut files: Vec<_> = m.files.iter().collect();
    files.sort_by(|a, b| (&a.path, a.arch).cmp(&(&b.path, b.arch)));
    files
}

/// Domain separator of [`encode_chunks`].
pub const CHUNKS_DOMAIN: &[u8] = b"lks.bundle.chunks.v1\0";

/// What `chunks_signature` signs: the canonical encoding of `m` (so the
/// chunk lists are bound to exactly this manifest), then each file's chunk
/// list in path order. Kept apart from [`encode`] so that agents from
/// before chunk lists verify `signature` as they always did.
pub fn encode_chunks(m: &Manifest) -> Vec<u8> {
    let mut out = CHUNKS_DOMAIN.to_vec();
    out.extend_from_slice(&encode(m));
    let files: Vec<_> = sorted_files(m)
        .into_iter()
        .filter_map(|f| Some((f, f.chunks.as_ref()?)))
        .collect();
    put_u32(&mut out, files.len() as u32);
    for (f, c) in files {
        put_str(&mut out, f.path.as_str());
        if m.is_multi_arch() {
            put_str(&mut out, f.arch.map_or("", |a| a.as_str()));
        }
        put_u32(&mut out, c.size);
        put_u32(&mut out, c.digests.len() as u32);
        for d in &c.digests {
            out.extend_from_slice(d.as_bytes());
        }
    }
    out
}

/// Whether any file of `m` has a chunk list.
pub fn has_chunks(m: &Manifest) -> bool {
    m.files.iter().any(|f| f.chunks.is_some())
}

/// SHA-256 of the canonical encoding: the identity of a bundle's content.
pub fn manifest_digest(m: &Manifest) -> Digest {
    Digest::of(&encode(m))
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len() as u32);
    out.extend_from_slice(s.as_bytes());
}

fn put_argv(out: &mut Vec<u8>, argv: &[String]) {
    put_u32(out, argv.len() as u32);
    for a in argv {
        put_str(out, a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::tests::sample;
    use std::time::Duration;

    #[test]
    fn file_order_does_not_matter() {
        let a = sample();
        let mut b = sample();
        b.files.reverse();
        assert_eq!(encode(&a), encode(&b));
        assert_eq!(manifest_digest(&a), manifest_digest(&b));
    }

    #[test]
    fn step_order_matters() {
        let mut a = sample();
        a.steps.push(crate::manifest::Step {
            name: "second".into(),
            run: vec!["true".into()],
            timeout: Duration::from_secs(1),
            on_heal: false,
        });
        let mut b = a.clone();
        b.steps.reverse();
        assert_ne!(encode(&a), encode(&b));
    }

    #[test]
    fn every_field_changes_the_encoding() {
        let base = encode(&sample());
        let mutations: Vec<fn(&mut Manifest)> = vec![
            |m| m.name.push('x'),
            |m| m.version.push('x'),
            |m| m.files[0].mode = 0o644,
            |m| m.files[0].size += 1,
            |m| m.files[0].digest = Digest::of(b"other"),
            |m| m.files[0].url = Some("https://x/y".into()),
            |m| m.files[1].url = None,
            |m| m.steps[0].run.push("--now".into()),
            |m| m.steps[0].timeout += Duration::from_millis(1),
            |m| m.health = None,
            |m| m.health.as_mut().unwrap().retries += 1,
            |m| m.self_update = true,
            |m| m.steps[0].on_heal = true,
            |m| m.reboot = crate::manifest::Reboot::Required,
            // Moving a character between adjacent strings must not collide.
            |m| {
                m.steps[0].run[0] = "systemctlr".into();
                m.steps[0].run[1] = "estart".into();
            },
        ];
        for (i, f) in mutations.into_iter().enumerate() {
            let mut m = sample();
            f(&mut m);
            assert_ne!(encode(&m), base, "mutation {i} left the encoding unchanged");
        }
    }

    /// The digest of a manifest without certificates, as published before
    /// `[[certificate]]` existed: its signatures must keep verifying.
    #[test]
    fn manifests_without_certificates_keep_their_bytes() {
        assert_eq!(
            manifest_digest(&sample()).to_string(),
            "sha256:f88e9353c8bea42043baf34c1074661cc489f7b46a238922925413ac128a5c06",
        );
    }

    /// Manifests that use every section but `on_heal`, pinned before
    /// `on_heal` existed: their signatures must keep verifying.
    #[test]
    fn manifests_without_heal_steps_keep_their_bytes() {
        let mut all = multi_arch();
        let identity = crate::manifest::tests::sample_with_identity();
        all.certificates = identity.certificates.clone();
        all.kubeconfigs = identity.kubeconfigs.clone();
        all.self_update = true;
        all.steps.push(crate::manifest::tests::sample().steps[0].clone());
        let pinned = [
            (
                sample(),
                "sha256:f88e9353c8bea42043baf34c1074661cc489f7b46a238922925413ac128a5c06",
            ),
            (
                identity,
                "sha256:4f72271e2a3def79ba1e5024e015d8f9135a8c2a7f4af08a69c6ce1d567ad7e7",
            ),
            (
                multi_arch(),
                "sha256:0449857bf01517cf57039a2893ebcf2675afde71d5665d8144622aeff0da5118",
            ),
            (
                all,
                "sha256:ae35e7ce3412b3313bd8cf077cbe83c8f2c32da8a419ec0ddc25085869c81934",
            ),
        ];
        for (i, (m, digest)) in pinned.into_iter().enumerate() {
            assert_eq!(manifest_digest(&m).to_string(), digest, "manifest {i}");
        }
    }

    /// Which steps run on heal is signed: not only whether any does.
    #[test]
    fn which_step_runs_on_heal_is_signed() {
        let two = |first: bool, second: bool| {
            let mut m = sample();
            let mut s = m.steps[0].clone();
            s.name = "reload".into();
            m.steps[0].on_heal = first;
            s.on_heal = second;
            m.steps.push(s);
            encode(&m)
        };
        let encodings = [
            two(false, false),
            two(true, false),
            two(false, true),
            two(true, true),
        ];
        for (i, a) in encodings.iter().enumerate() {
            for b in &encodings[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn every_certificate_field_changes_the_encoding() {
        let base = encode(&crate::manifest::tests::sample_with_identity());
        let mutations: Vec<fn(&mut Manifest)> = vec![
            |m| m.certificates[0].key_path = "/k2".parse().unwrap(),
            |m| m.certificates[0].profile = crate::certs::Profile::Client,
            |m| m.certificates[1].common_name.push('x'),
            |m| m.certificates[1].organizations.push("o".into()),
            |m| m.certificates[1].dns_names.push("d".into()),
            |m| m.certificates[1].ip_addresses.clear(),
            |m| m.certificates[0].ttl += Duration::from_millis(1),
            |m| m.certificates[0].ca_path = None,
            |m| m.kubeconfigs[0].path = "/etc/other.conf".parse().unwrap(),
            |m| m.kubeconfigs.clear(),
            |m| m.certificates.reverse(),
        ];
        for (i, f) in mutations.into_iter().enumerate() {
            let mut m = crate::manifest::tests::sample_with_identity();
            f(&mut m);
            if i == 10 {
                assert_eq!(encode(&m), base, "certificate order carries no meaning");
            } else {
                assert_ne!(encode(&m), base, "mutation {i} left the encoding unchanged");
            }
        }
        let mut issued = crate::manifest::tests::sample_with_identity();
        issued.issued.push(issued.files[0].clone());
        assert_eq!(encode(&issued), base, "what the node made is not signed");
    }

    /// `sample()` with its binary in two variants.
    fn multi_arch() -> Manifest {
        use crate::arch::Arch;
        let mut m = sample();
        let mut arm = m.files[1].clone();
        m.files[1].arch = Some(Arch::parse("amd64").unwrap());
        arm.arch = Some(Arch::parse("arm64").unwrap());
        arm.digest = Digest::of(b"arm binary");
        m.files.push(arm);
        m.validate().unwrap();
        m
    }

    #[test]
    fn architectures_are_signed_and_old_bytes_kept() {
        use crate::arch::Arch;
        let base = encode(&multi_arch());
        let mutations: Vec<fn(&mut Manifest)> = vec![
            // The variants' labels swapped: another binary for each node.
            |m| {
                m.files[1].arch = Some(Arch::parse("arm64").unwrap());
                m.files[2].arch = Some(Arch::parse("amd64").unwrap());
            },
            |m| m.architectures = vec![Arch::parse("amd64").unwrap(), Arch::parse("arm64").unwrap()],
        ];
        for (i, f) in mutations.into_iter().enumerate() {
            let mut m = multi_arch();
            f(&mut m);
            assert_ne!(encode(&m), base, "mutation {i} left the encoding unchanged");
        }
        let mut reordered = multi_arch();
        reordered.files.reverse();
        assert_eq!(encode(&reordered), base, "file order carries no meaning");
        // A manifest without arch fields encodes as it always did (the
        // digest pinned above), whatever the new code around it.
        let mut neutral = multi_arch();
        neutral.files.truncate(2);
        neutral.files[1].arch = None;
        assert_eq!(encode(&neutral), encode(&sample()));
    }
}
