//! Validation of the names that appear in the contract: bundle names and
//! versions, cluster names, node names.

use crate::limits::{MAX_NAME_LEN, MAX_VERSION_LEN};

/// A bundle name: `[a-z0-9][a-z0-9-]*`, at most 63 bytes.
pub fn validate_bundle_name(name: &str) -> Result<(), String> {
    dns_label(name, "bundle name")
}

/// A cluster name: a DNS label (`[a-z0-9]([a-z0-9-]*[a-z0-9])?`, at most 63 bytes).
pub fn validate_cluster_name(name: &str) -> Result<(), String> {
    dns_label(name, "cluster name")?;
    if name.ends_with('-') {
        return Err(format!("invalid cluster name {name:?}: must not end with '-'"));
    }
    Ok(())
}

/// A node name: a DNS-1123 subdomain (labels joined by '.', at most 253 bytes),
/// the same rule Kubernetes applies to node names.
pub fn validate_node_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("node name is empty".into());
    }
    if name.len() > 253 {
        return Err(format!(
            "node name is {} bytes long; the limit is 253",
            name.len()
        ));
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
            return Err(format!(
                "invalid node name {name:?}: use lowercase letters, digits, '-' and '.', \
                 starting and ending each part with a letter or digit"
            ));
        }
    }
    Ok(())
}

/// A bundle version: any non-empty string of printable characters, at most
/// 128 bytes. Control characters are refused because versions end up in logs,
/// tables and file names.
pub fn validate_version(version: &str) -> Result<(), String> {
    if version.is_empty() {
        return Err("version is empty".into());
    }
    if version.len() > MAX_VERSION_LEN {
        return Err(format!(
            "version is {} bytes long; the limit is {MAX_VERSION_LEN}",
            version.len()
        ));
    }
    if version.chars().any(|c| c.is_control()) {
        return Err(format!("version {version:?} contains a control character"));
    }
    Ok(())
}

/// Splits `NAME@VERSION` and validates both halves.
pub fn parse_bundle_ref(s: &str) -> Result<(String, String), String> {
    let (name, version) = s
        .split_once('@')
        .ok_or_else(|| format!("invalid bundle reference {s:?}: expected NAME@VERSION"))?;
    validate_bundle_name(name)?;
    validate_version(version)?;
    Ok((name.to_string(), version.to_string()))
}

fn dns_label(name: &str, what: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("{what} is empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "{what} {name:?} is {} bytes long; the limit is {MAX_NAME_LEN}",
            name.len()
        ));
    }
    let first = name.as_bytes()[0];
    if !(first.is_ascii_lowercase() || first.is_ascii_digit())
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(format!(
            "invalid {what} {name:?}: use lowercase letters, digits and '-', starting with a letter or digit"
        ));
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
}
