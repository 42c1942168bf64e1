//! Validation of the names that appear in the contract: bundle names and
//! versions, cluster names, node names.

use crate::limits::{MAX_NAME_LEN, MAX_VERSION_LEN};

/// Why a name, version or bundle reference was refused. The message names
/// what was checked and carries the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// `what` (a bundle name, a node name, a version, …) is empty.
    #[error("{what} is empty")]
    Empty { what: &'static str },
    /// A DNS-label name over [`MAX_NAME_LEN`] bytes.
    #[error("{what} {name:?} is {len} bytes long; the limit is {MAX_NAME_LEN}")]
    LabelTooLong {
        what: &'static str,
        name: String,
        len: usize,
    },
    /// A DNS-label name with a character or start outside the rule.
    #[error(
        "invalid {what} {name:?}: use lowercase letters, digits and '-', starting with a letter or digit"
    )]
    LabelChars { what: &'static str, name: String },
    #[error("invalid cluster name {name:?}: must not end with '-'")]
    ClusterTrailingDash { name: String },
    /// A node name or a version over its limit.
    #[error("{what} is {len} bytes long; the limit is {limit}")]
    TooLong {
        what: &'static str,
        len: usize,
        limit: usize,
    },
    #[error(
        "invalid node name {name:?}: use lowercase letters, digits, '-' and '.', \
         starting and ending each part with a letter or digit"
    )]
    NodeChars { name: String },
    #[error("version {version:?} contains a control character")]
    VersionControlChar { version: String },
    #[error("invalid bundle reference {reference:?}: expected NAME@VERSION")]
    BundleRef { reference: String },
}

/// A bundle name: `[a-z0-9][a-z0-9-]*`, at most 63 bytes.
pub fn validate_bundle_name(name: &str) -> Result<(), NameError> {
    dns_label(name, "bundle name")
}

/// A cluster name: a DNS label (`[a-z0-9]([a-z0-9-]*[a-z0-9])?`, at most 63 bytes).
pub fn validate_cluster_name(name: &str) -> Result<(), NameError> {
    dns_label(name, "cluster name")?;
    if name.ends_with('-') {
        return Err(NameError::ClusterTrailingDash { name: name.into() });
    }
    Ok(())
}

/// A node name: a DNS-1123 subdomain (labels joined by '.', at most 253 bytes),
/// the same rule Kubernetes applies to node names.
pub fn validate_node_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { what: "node name" });
    }
    if name.len() > 253 {
        return Err(NameError::TooLong {
            what: "node name",
            len: name.len(),
            limit: 253,
        });
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(NameError::NodeChars { name: name.into() });
        }
    }
    Ok(())
}

/// A bundle version: any non-empty string of printable characters, at most
/// 128 bytes. Control characters are refused because versions end up in logs,
/// tables and file names.
pub fn validate_version(version: &str) -> Result<(), NameError> {
    if version.is_empty() {
        return Err(NameError::Empty { what: "version" });
    }
    if version.len() > MAX_VERSION_LEN {
        return Err(NameError::TooLong {
            what: "version",
            len: version.len(),
            limit: MAX_VERSION_LEN,
        });
    }
    if version.chars().any(|c| c.is_control()) {
        return Err(NameError::VersionControlChar {
            version: version.into(),
        });
    }
    Ok(())
}

/// Splits `NAME@VERSION` and validates both halves.
pub fn parse_bundle_ref(s: &str) -> Result<(String, String), NameError> {
    let (name, version) = s
        .split_once('@')
        .ok_or_else(|| NameError::BundleRef { reference: s.into() })?;
    validate_bundle_name(name)?;
    validate_version(version)?;
    Ok((name.to_string(), version.to_string()))
}

fn dns_label(name: &str, what: &'static str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { what });
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::LabelTooLong {
            what,
            name: name.into(),
            len: name.len(),
        });
    }
    let first = name.as_bytes()[0];
    if !(first.is_ascii_lowercase() || first.is_ascii_digit())
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(NameError::LabelChars {
            what,
            name: name.into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_names() {
        assert!(validate_bundle_name("kubelet").is_ok());
        assert!(validate_bundle_name("kube-proxy-2").is_ok());
        assert!(validate_bundle_name("").is_err());
        assert!(validate_bundle_name("-x").is_err());
        assert!(validate_bundle_name("Kubelet").is_err());
        assert!(validate_bundle_name("a_b").is_err());
        assert!(validate_bundle_name(&"a".repeat(64)).is_err());
    }

    #[test]
    fn node_names() {
        assert!(validate_node_name("worker-1.tenant-a").is_ok());
        assert!(validate_node_name("worker..1").is_err());
        assert!(validate_node_name("-worker").is_err());
        assert!(validate_node_name("Worker").is_err());
        assert!(validate_node_name(&"a".repeat(254)).is_err());
    }

    #[test]
    fn versions_and_refs() {
        assert!(validate_version("1.29.3-1").is_ok());
        assert!(validate_version("").is_err());
        assert!(validate_version("1\n2").is_err());
        assert_eq!(
            parse_bundle_ref("kubelet@1.29.3").unwrap(),
            ("kubelet".to_string(), "1.29.3".to_string())
        );
        assert!(parse_bundle_ref("kubelet").is_err());
        assert!(parse_bundle_ref("@1").is_err());
        assert!(parse_bundle_ref("kubelet@").is_err());
    }

    #[test]
    fn cluster_names() {
        assert!(validate_cluster_name("tenant-a").is_ok());
        assert!(validate_cluster_name("tenant-").is_err());
        assert!(validate_cluster_name("tenant.a").is_err());
    }

    #[test]
    fn messages_are_unchanged_and_carry_the_value() {
        let cases: [(Result<(), NameError>, &str); 8] = [
            (validate_bundle_name(""), "bundle name is empty"),
            (
                validate_bundle_name(&"a".repeat(64)),
                &format!(
                    "bundle name {:?} is 64 bytes long; the limit is 63",
                    "a".repeat(64)
                ),
            ),
            (
                validate_bundle_name("Kubelet"),
                "invalid bundle name \"Kubelet\": use lowercase letters, digits and '-', starting with a letter or digit",
            ),
            (
                validate_cluster_name("tenant-"),
                "invalid cluster name \"tenant-\": must not end with '-'",
            ),
            (
                validate_node_name(&"a".repeat(254)),
                "node name is 254 bytes long; the limit is 253",
            ),
            (
                validate_node_name("-w"),
                "invalid node name \"-w\": use lowercase letters, digits, '-' and '.', \
                 starting and ending each part with a letter or digit",
            ),
            (
                validate_version("1\n2"),
                "version \"1\\n2\" contains a control character",
            ),
            (
                parse_bundle_ref("kubelet").map(|_| ()),
                "invalid bundle reference \"kubelet\": expected NAME@VERSION",
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got.unwrap_err().to_string(), want);
        }
        assert_eq!(
            parse_bundle_ref("kubelet@").unwrap_err(),
            NameError::Empty { what: "version" }
        );
    }
}
