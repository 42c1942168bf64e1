//! The rules a manifest must follow (DESIGN §4 and the limits of
//! [`crate::limits`]): what [`Manifest::validate`] checks before a bundle is
//! signed, published, sent or applied.

use super::*;

impl Manifest {
    /// Checks every rule of DESIGN §4 and the limits of [`crate::limits`].
    pub fn validate(&self) -> Result<(), ManifestError> {
        validate_bundle_name(&self.name).map_err(|e| ManifestError::new("name", e))?;
        validate_version(&self.version).map_err(|e| ManifestError::new("version", e))?;
        if self.files.len() > MAX_FILES {
            return Err(ManifestError::new(
                "file",
                format!("{} files; the limit is {MAX_FILES}", self.files.len()),
            ));
        }
        let mut total: u64 = 0;
        for (i, f) in self.files.iter().enumerate() {
            let field = |name: &str| format!("file[{i}].{name}");
            if f.mode > 0o7777 {
                return Err(ManifestError::new(
                    field("mode"),
                    format!("{:o} is not a permission mode", f.mode),
                ));
            }
            if f.size > MAX_FILE_SIZE {
                return Err(ManifestError::new(
                    field("size"),
                    format!("{} bytes; the limit is {MAX_FILE_SIZE}", f.size),
                ));
            }
            if f.size == 0 && f.digest != Digest::of(b"") {
                return Err(ManifestError::new(
                    field("size"),
                    format!("0 bytes, but {} is not the digest of an empty file", f.digest),
                ));
            }
            total = total.saturating_add(f.size);
            if let Some(url) = &f.url {
                validate_url(url).map_err(|e| ManifestError::new(field("url"), e))?;
            }
            if let Some(c) = &f.chunks {
                c.validate(f.size, &f.digest)
                    .map_err(|e| ManifestError::new(field("chunks"), e))?;
            }
        }
        if total > MAX_BUNDLE_SIZE {
            return Err(ManifestError::new(
                "file",
                format!("{total} bytes in all; the limit is {MAX_BUNDLE_SIZE}"),
            ));
        }
        self.validate_arches()?;
        self.validate_identity_files()?;
        self.validate_self_update()?;
        if self.steps.len() > MAX_STEPS {
            return Err(ManifestError::new(
                "step",
                format!("{} steps; the limit is {MAX_STEPS}", self.steps.len()),
            ));
        }
        for (i, s) in self.steps.iter().enumerate() {
            if s.name.is_empty() || s.name.len() > MAX_STEP_NAME_LEN || s.name.chars().any(char::is_control) {
                return Err(ManifestError::new(
                    format!("step[{i}].name"),
                    format!("must be 1 to {MAX_STEP_NAME_LEN} printable characters"),
                ));
            }
            validate_argv(&s.run).map_err(|e| ManifestError::new(format!("step[{i}].run"), e))?;
            validate_timeout(s.timeout).map_err(|e| ManifestError::new(format!("step[{i}].timeout"), e))?;
        }
        if let Some(h) = &self.health {
            validate_argv(&h.run).map_err(|e| ManifestError::new("health.run", e))?;
            validate_timeout(h.timeout).map_err(|e| ManifestError::new("health.timeout", e))?;
            if h.retries == 0 || h.retries > MAX_HEALTH_RETRIES {
                return Err(ManifestError::new(
                    "health.retries",
                    format!("must be 1 to {MAX_HEALTH_RETRIES}"),
                ));
            }
            if h.interval > MAX_TIMEOUT {
                return Err(ManifestError::new("health.interval", "longer than 1h"));
            }
        }
        Ok(())
    }
}

impl Manifest {
    /// `architectures` and each file's `arch`: a path is either
    /// arch-neutral or per architecture, and every architecture the bundle
    /// is for has a file for every path that differs by architecture.
    fn validate_arches(&self) -> Result<(), ManifestError> {
        if self.architectures.len() > MAX_ARCHITECTURES {
            return Err(ManifestError::new(
                "architectures",
                format!(
                    "{} entries; the limit is {MAX_ARCHITECTURES}",
                    self.architectures.len()
                ),
            ));
        }
        let mut declared = BTreeSet::new();
        for (i, a) in self.architectures.iter().enumerate() {
            if !declared.insert(*a) {
                return Err(ManifestError::new(
                    format!("architectures[{i}]"),
                    format!("{a} is listed twice"),
                ));
            }
        }
        for (i, f) in self.files.iter().enumerate() {
            if let Some(a) = f.arch
                && !declared.is_empty()
                && !declared.contains(&a)
            {
                return Err(ManifestError::new(
                    format!("file[{i}].arch"),
                    format!(
                        "{a} is not one of the bundle's architectures ({})",
                        arch::list(&declared)
                    ),
                ));
            }
        }
        let mut by_path: std::collections::BTreeMap<&BundlePath, Vec<(usize, Option<Arch>)>> =
            Default::default();
        for (i, f) in self.files.iter().enumerate() {
            by_path.entry(&f.path).or_default().push((i, f.arch));
        }
        let arches = self.arches();
        for (path, files) in &by_path {
            let neutral = files.iter().find(|(_, a)| a.is_none());
            let specific = files.iter().find_map(|(i, a)| a.map(|a| (*i, a)));
            match (neutral, specific) {
                (Some((n, _)), Some((i, a))) => {
                    return Err(ManifestError::new(
                        format!("file[{}].path", n.max(&i)),
                        format!(
                            "{path} is both arch-neutral (file[{n}]) and for {a} (file[{i}]): \
                             give every file of that path an arch, or none"
                        ),
                    ));
                }
                (_, Some((i, has))) => {
                    if let Some(missing) = arches
                        .iter()
                        .find(|a| !files.iter().any(|(_, f)| *f == Some(**a)))
                    {
                        return Err(ManifestError::new(
                            format!("file[{i}].path"),
                            format!(
                                "the bundle is for {missing}, but {path} has no file for it ({has} has one); \
                                 add a file with arch = \"{missing}\""
                            ),
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A self-update carries the agent's binary and nothing else: its
    /// activation is the hand-over to the new agent, its health check that
    /// agent coming back.
    fn validate_self_update(&self) -> Result<(), ManifestError> {
        if !self.self_update {
            return Ok(());
        }
        let err = |field: &str, why: &str| Err(ManifestError::new(field, why));
        // One binary per architecture: what a node selects is one file.
        for a in self.variants() {
            let n = self
                .files
                .iter()
                .filter(|f| a.is_none_or(|a| f.is_for(a)))
                .count();
            if n != 1 {
                let each = a.map_or(String::new(), |a| format!(" for {a}"));
                return err(
                    "file",
                    &format!(
                        "a self_update bundle holds exactly one file{each}, the agent's binary; this one has {n}"
                    ),
                );
            }
        }
        if let Some(i) = self.files.iter().position(|f| f.mode & 0o111 == 0) {
            return err(
                &format!("file[{i}].mode"),
                "the agent's binary must be executable (e.g. \"0755\")",
            );
        }
        if !self.certificates.is_empty() || !self.kubeconfigs.is_empty() {
            return err(
                "certificate",
                "a self_update bundle holds no certificates or kubeconfigs",
            );
        }
        if !self.steps.is_empty() {
            return err(
                "step",
                "a self_update bundle has no steps: its activation is the hand-over",
            );
        }
        if self.health.is_some() {
            return err(
                "health",
                "a self_update bundle has no health check: the new agent must reconnect instead",
            );
        }
        Ok(())
    }

    /// `[[certificate]]`, `[[kubeconfig]]` and the paths of everything.
    fn validate_identity_files(&self) -> Result<(), ManifestError> {
        if self.certificates.len() > MAX_CERTIFICATES {
            return Err(ManifestError::new(
                "certificate",
                format!(
                    "{} entries; the limit is {MAX_CERTIFICATES}",
                    self.certificates.len()
                ),
            ));
        }
        if self.kubeconfigs.len() > MAX_KUBECONFIGS {
            return Err(ManifestError::new(
                "kubeconfig",
                format!(
                    "{} entries; the limit is {MAX_KUBECONFIGS}",
                    self.kubeconfigs.len()
                ),
            ));
        }
        for (i, c) in self.certificates.iter().enumerate() {
            c.validate(&format!("certificate[{i}]"))?;
        }
        for (i, k) in self.kubeconfigs.iter().enumerate() {
            let Some(c) = self.certificate(&k.certificate) else {
                return Err(ManifestError::new(
                    format!("kubeconfig[{i}].certificate"),
                    format!(
                        "{} is not the path of a [[certificate]] of this bundle",
                        k.certificate
                    ),
                ));
            };
            if !c.profile.is_client() {
                return Err(ManifestError::new(
                    format!("kubeconfig[{i}].certificate"),
                    format!(
                        "{} has profile {}; a kubeconfig needs a client certificate",
                        k.certificate, c.profile
                    ),
                ));
            }
        }
        // Every path once: files, then each certificate's paths, then the
        // kubeconfigs. A CA path may be shared by several certificates (one
        // cluster, one CA), nothing else.
        let mut generated: Vec<(String, &BundlePath)> = Vec::new();
        let mut cas: BTreeSet<&BundlePath> = BTreeSet::new();
        for (i, c) in self.certificates.iter().enumerate() {
            generated.push((format!("certificate[{i}].path"), &c.path));
            generated.push((format!("certificate[{i}].key_path"), &c.key_path));
            if let Some(ca) = &c.ca_path
                && cas.insert(ca)
            {
                generated.push((format!("certificate[{i}].ca_path"), ca));
            }
        }
        for (i, k) in self.kubeconfigs.iter().enumerate() {
            generated.push((format!("kubeconfig[{i}].path"), &k.path));
        }
        // What one node installs must be disjoint: per architecture, its
        // files and the neutral ones, then the generated paths.
        for a in self.variants() {
            let mut names: Vec<(String, &BundlePath)> = self
                .files
                .iter()
                .enumerate()
                .filter(|(_, f)| a.is_none_or(|a| f.is_for(a)))
                .map(|(i, f)| (format!("file[{i}].path"), &f.path))
                .collect();
            names.extend(generated.iter().map(|(n, p)| (n.clone(), *p)));
            check_paths_disjoint(names.iter().map(|(_, p)| *p))
                .map_err(|(i, reason)| ManifestError::new(names[i].0.clone(), reason))?;
        }
        let generated = self.generated_paths();
        let mut seen = BTreeSet::new();
        for (i, f) in self.issued.iter().enumerate() {
            if !generated.contains(&f.path) || !seen.insert(&f.path) {
                return Err(ManifestError::new(
                    format!("issued[{i}].path"),
                    format!(
                        "{} is not a certificate, key, CA or kubeconfig path of this bundle",
                        f.path
                    ),
                ));
            }
            if f.mode > 0o7777 || f.url.is_some() {
                return Err(ManifestError::new(format!("issued[{i}]"), "bad mode or a url"));
            }
        }
        Ok(())
    }
}

/// Two files may not share a path, and no file may sit "inside" another
/// (`/etc/a` and `/etc/a/b`). Returns the index of the offending path. The
/// same rule decides whether two bundles may be held by one node.
pub fn check_paths_disjoint<'a>(paths: impl Iterator<Item = &'a BundlePath>) -> Result<(), (usize, String)> {
    let mut seen: BTreeSet<&BundlePath> = BTreeSet::new();
    for (i, p) in paths.enumerate() {
        if seen.contains(p) {
            return Err((i, format!("{p} is listed twice")));
        }
        // Sorted order puts an ancestor right before its descendants, and a
        // descendant right after its ancestor.
        let prev = seen.range::<&BundlePath, _>(..p).next_back();
        let next = seen.range::<&BundlePath, _>(p..).next();
        for other in prev.into_iter().chain(next) {
            if other.is_ancestor_of(p) || p.is_ancestor_of(other) {
                return Err((i, format!("{p} and {other} cannot both be files")));
            }
        }
        seen.insert(p);
    }
    Ok(())
}

/// Why a file's `url` was refused (the field is named by the caller).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum UrlError {
    #[error("{len} bytes long; the limit is {MAX_URL_LEN}")]
    TooLong { len: usize },
    #[error("{url:?} is not an http(s) URL")]
    Scheme { url: String },
    #[error("{url:?} contains whitespace or a control character")]
    Characters { url: String },
}

/// Why a step's or health check's `run` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum ArgvError {
    #[error("needs a command: a non-empty list of arguments")]
    NoCommand,
    #[error("{count} arguments; the limit is {MAX_ARGS}")]
    TooMany { count: usize },
    #[error("an argument is {len} bytes long; the limit is {MAX_ARG_LEN}")]
    TooLong { len: usize },
    #[error("an argument contains a NUL byte")]
    Nul,
}

/// Why a step's or health check's `timeout` was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum TimeoutError {
    #[error("must be longer than zero")]
    Zero,
    #[error("longer than 1h")]
    TooLong,
}

fn validate_url(url: &str) -> Result<(), UrlError> {
    if url.len() > MAX_URL_LEN {
        return Err(UrlError::TooLong { len: url.len() });
    }
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(UrlError::Scheme { url: url.into() });
    }
    if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(UrlError::Characters { url: url.into() });
    }
    Ok(())
}

fn validate_argv(run: &[String]) -> Result<(), ArgvError> {
    if run.is_empty() || run[0].is_empty() {
        return Err(ArgvError::NoCommand);
    }
    if run.len() > MAX_ARGS {
        return Err(ArgvError::TooMany { count: run.len() });
    }
    for a in run {
        if a.len() > MAX_ARG_LEN {
            return Err(ArgvError::TooLong { len: a.len() });
        }
        if a.contains('\0') {
            return Err(ArgvError::Nul);
        }
    }
    Ok(())
}

fn validate_timeout(t: Duration) -> Result<(), TimeoutError> {
    if t.is_zero() {
        return Err(TimeoutError::Zero);
    }
    if t > MAX_TIMEOUT {
        return Err(TimeoutError::TooLong);
    }
    Ok(())
}
