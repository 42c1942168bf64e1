//! [`ManifestError`], the one error of every manifest rule, naming the
//! field that broke it. Its own module, below `certs` and `manifest`, which
//! both check rules (the certificate entries and the rest of the manifest),
//! so neither needs the other for it; users name it as
//! `manifest::ManifestError`.

use std::fmt;

/// A rule a manifest broke: `field` is a path such as `file[2].mode`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ManifestError {
    pub field: String,
    pub reason: String,
}

impl ManifestError {
    pub fn new(field: impl Into<String>, reason: impl fmt::Display) -> Self {
        ManifestError {
            field: field.into(),
            reason: reason.to_string(),
        }
    }
}
