//! Target paths of bundle files and the rules they obey.
//!
//! A [`BundlePath`] is absolute and already normalised: no empty, `.` or `..`
//! component, no trailing slash, no NUL, within `PATH_MAX`/`NAME_MAX`. Nothing
//! is ever normalised silently: a path that is not in normal form is refused,
//! so the path an operator reads in `bundle.toml` is the path that is written.

use std::fmt;
use std::str::FromStr;

use crate::limits::{MAX_COMPONENT_LEN, MAX_PATH_LEN};

/// A validated, absolute, normalised target path.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BundlePath(String);

/// Why a target path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path is empty")]
    Empty,
    #[error("path {0:?} is not absolute")]
    NotAbsolute(String),
    #[error("path \"/\" names the root itself, not a file")]
    Root,
    #[error("path contains a NUL byte")]
    Nul,
    #[error("path is {len} bytes long; the limit is {MAX_PATH_LEN}")]
    TooLong { len: usize },
    #[error("path {0:?} has an empty component (\"//\" or a trailing \"/\")")]
    EmptyComponent(String),
    #[error("path {0:?} has a \".\" component")]
    Dot(String),
    #[error("path {0:?} contains \"..\"")]
    DotDot(String),
    #[error("path {path:?} has a component of {len} bytes; the limit is {MAX_COMPONENT_LEN}")]
    ComponentTooLong { path: String, len: usize },
}

impl BundlePath {
    /// Validates `s` as a target path.
    pub fn new(s: &str) -> Result<Self, PathError> {
        if s.is_empty() {
            return Err(PathError::Empty);
        }
        if s.contains('\0') {
            return Err(PathError::Nul);
        }
        if s.len() > MAX_PATH_LEN {
            return Err(PathError::TooLong { len: s.len() });
        }
        let Some(rest) = s.strip_prefix('/') else {
            return Err(PathError::NotAbsolute(s.to_string()));
        };
        if rest.is_empty() {
            return Err(PathError::Root);
        }
        for comp in rest.split('/') {
            match comp {
                "" => return Err(PathError::EmptyComponent(s.to_string())),
                "." => return Err(PathError::Dot(s.to_string())),
                ".." => return Err(PathError::DotDot(s.to_string())),
                c if c.len() > MAX_COMPONENT_LEN => {
                    return Err(PathError::ComponentTooLong {
                        path: s.to_string(),
                        len: c.len(),
                    });
                }
                _ => {}
            }
        }
        Ok(BundlePath(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path without its leading `/`, for resolving under a root.
    pub fn relative(&self) -> &str {
        &self.0[1..]
    }

    /// Every component, first to last.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.relative().split('/')
    }

    /// The last component.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or_default()
    }

    /// The parent directory relative to the root (`""` for a file in `/`).
    pub fn parent_relative(&self) -> &str {
        let rel = self.relative();
        rel.rfind('/').map_or("", |i| &rel[..i])
    }

    /// True if `self` is a proper ancestor directory of `other`
    /// (`/etc/a` of `/etc/a/b`), which would make the two files collide.
    pub fn is_ancestor_of(&self, other: &BundlePath) -> bool {
        other.0.len() > self.0.len()
            && other.0.starts_with(&self.0)
            && other.0.as_bytes()[self.0.len()] == b'/'
    }
}

impl fmt::Display for BundlePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for BundlePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl FromStr for BundlePath {
    type Err = PathError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BundlePath::new(s)
    }
}

impl AsRef<str> for BundlePath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl serde::Serialize for BundlePath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for BundlePath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        BundlePath::new(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_normal_paths() {
        let p = BundlePath::new("/etc/kubernetes/kubelet.conf").unwrap();
        assert_eq!(p.relative(), "etc/kubernetes/kubelet.conf");
        assert_eq!(p.file_name(), "kubelet.conf");
        assert_eq!(p.parent_relative(), "etc/kubernetes");
        assert_eq!(
            p.components().collect::<Vec<_>>(),
            ["etc", "kubernetes", "kubelet.conf"]
        );
        assert_eq!(BundlePath::new("/x").unwrap().parent_relative(), "");
        assert!(
            BundlePath::new("/etc/..foo/.bar").is_ok(),
            "dots inside a name are fine"
        );
    }

    #[test]
    fn rejects_every_bad_form() {
        let long_component = format!("/{}", "a".repeat(256));
        let long_path = format!("/{}", ["a"; 2049].join("/"));
        type Case<'a> = (&'a str, fn(&PathError) -> bool);
        let cases: Vec<Case<'_>> = vec![
            ("", |e| matches!(e, PathError::Empty)),
            ("etc/passwd", |e| matches!(e, PathError::NotAbsolute(_))),
            ("./etc", |e| matches!(e, PathError::NotAbsolute(_))),
            ("/", |e| matches!(e, PathError::Root)),
            ("/etc//passwd", |e| matches!(e, PathError::EmptyComponent(_))),
            ("//etc/passwd", |e| matches!(e, PathError::EmptyComponent(_))),
            ("/etc/", |e| matches!(e, PathError::EmptyComponent(_))),
            ("/etc/./passwd", |e| matches!(e, PathError::Dot(_))),
            ("/../etc/passwd", |e| matches!(e, PathError::DotDot(_))),
            ("/etc/../../passwd", |e| matches!(e, PathError::DotDot(_))),
            ("/etc/kubernetes/..", |e| matches!(e, PathError::DotDot(_))),
            ("/etc/pass\0wd", |e| matches!(e, PathError::Nul)),
            (&long_component, |e| {
                matches!(e, PathError::ComponentTooLong { .. })
            }),
            (&long_path, |e| matches!(e, PathError::TooLong { .. })),
        ];
        for (input, check) in cases {
            let err = BundlePath::new(input).expect_err(input);
            assert!(check(&err), "{input:?} gave {err:?}");
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn ancestry() {
        let a = BundlePath::new("/etc/a").unwrap();
        assert!(a.is_ancestor_of(&BundlePath::new("/etc/a/b").unwrap()));
        assert!(!a.is_ancestor_of(&BundlePath::new("/etc/ab").unwrap()));
        assert!(!a.is_ancestor_of(&a));
    }

    fn component() -> impl Strategy<Value = String> {
        prop_oneof![
            8 => "[a-zA-Z0-9_.-]{1,12}",
            1 => Just(".".to_string()),
            1 => Just("..".to_string()),
            1 => Just(String::new()),
        ]
    }

    proptest! {
        /// A path is accepted exactly when it is already in normal form, and
        /// an accepted path survives display/parse unchanged.
        #[test]
        fn accepted_iff_normal(comps in prop::collection::vec(component(), 0..8)) {
            let s = format!("/{}", comps.join("/"));
            let normal = !comps.is_empty()
                && comps.iter().all(|c| !c.is_empty() && c != "." && c != "..");
            match BundlePath::new(&s) {
                Ok(p) => {
                    prop_assert!(normal, "accepted non-normal {s:?}");
                    prop_assert_eq!(p.to_string(), s.clone());
                    prop_assert_eq!(BundlePath::new(p.as_str()).unwrap(), p.clone());
                    prop_assert!(p.components().all(|c| c != ".." && c != "." && !c.is_empty()));
                }
                Err(_) => prop_assert!(!normal, "refused normal {s:?}"),
            }
        }

        #[test]
        fn never_panics(s in "\\PC{0,64}") {
            let _ = BundlePath::new(&s);
        }
    }
}
