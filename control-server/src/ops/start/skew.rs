//! Kubernetes' version skew policy for the kubelet a rollout installs
//! (`rollout start --kubelet-version`): a kubelet may not be newer than its
//! API server, and may be up to three minor versions older. A start that
//! would break the first rule is refused; one that would leave a node more
//! than three minors behind is started with a warning (the operator may be
//! part-way through a longer upgrade of the control plane).

/// How many minor versions a kubelet may trail its API server.
pub const MAX_MINORS_BEHIND: u32 = 3;

/// A kubelet newer than the API server it would talk to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--kubelet-version {kubelet} is newer than cluster {cluster}'s API server ({api}): a kubelet may not be \
     newer than its API server (Kubernetes' version skew policy); upgrade the tenant control plane first"
)]
pub struct NewerThanApi {
    pub cluster: String,
    pub kubelet: String,
    pub api: String,
}

/// `(major, minor)` of a version like `v1.37.2`, `1.37.2` or
/// `v1.38.0-rc.1+abc`; `None` if it does not look like one.
pub fn minor_of(v: &str) -> Option<(u32, u32)> {
    let v = v.strip_prefix('v').unwrap_or(v);
    let mut parts = v.splitn(3, '.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?;
    // `37`, or `37-rc.1` / `37+abc` when there is no patch part.
    let digits = minor.split(['-', '+']).next()?;
    Some((major, digits.parse().ok()?))
}

/// Checks `kubelet` against the API server's `api` version of `cluster`:
/// an error when the kubelet is newer, a warning (one line) when it would
/// trail by more than [`MAX_MINORS_BEHIND`] minors or when either version
/// cannot be read, nothing otherwise.
pub fn check(cluster: &str, kubelet: &str, api: &str) -> Result<Option<String>, NewerThanApi> {
    let (Some(k), Some(a)) = (minor_of(kubelet), minor_of(api)) else {
        return Ok(Some(format!(
            "cluster {cluster}'s API server reports version {api:?}, which cannot be compared with \
             --kubelet-version {kubelet}: the version skew was not checked"
        )));
    };
    if k > a {
        return Err(NewerThanApi {
            cluster: cluster.to_string(),
            kubelet: kubelet.to_string(),
            api: api.to_string(),
        });
    }
    if k.0 == a.0 && a.1 - k.1 > MAX_MINORS_BEHIND {
        return Ok(Some(format!(
            "--kubelet-version {kubelet} would leave nodes {} minor versions behind cluster {cluster}'s API \
             server ({api}); Kubernetes supports at most {MAX_MINORS_BEHIND}",
            a.1 - k.1
        )));
    }
    if k.0 < a.0 {
        return Ok(Some(format!(
            "--kubelet-version {kubelet} is a major version behind cluster {cluster}'s API server ({api}); \
             Kubernetes supports at most {MAX_MINORS_BEHIND} minor versions of skew"
        )));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_with_or_without_v_and_with_suffixes() {
        assert_eq!(minor_of("v1.37.2"), Some((1, 37)));
        assert_eq!(minor_of("1.36.3"), Some((1, 36)));
        assert_eq!(minor_of("v1.38.0-rc.1+abc"), Some((1, 38)));
        assert_eq!(minor_of("v1.38-rc.0"), Some((1, 38)));
        assert_eq!(minor_of("v1"), None);
        assert_eq!(minor_of("latest"), None);
        assert_eq!(minor_of("v1.x.0"), None);
    }

    #[test]
    fn a_kubelet_newer_than_the_api_server_is_refused() {
        let e = check("tenant-a", "v1.38.0", "v1.37.2").unwrap_err();
        assert_eq!(
            e.to_string(),
            "--kubelet-version v1.38.0 is newer than cluster tenant-a's API server (v1.37.2): a kubelet may \
             not be newer than its API server (Kubernetes' version skew policy); upgrade the tenant control \
             plane first"
        );
        assert!(check("tenant-a", "v2.0.0", "v1.37.2").is_err());
    }

    #[test]
    fn the_same_minor_or_up_to_three_behind_is_fine() {
        for k in ["v1.37.2", "v1.37.9", "v1.36.3", "v1.34.0"] {
            assert_eq!(check("c", k, "v1.37.2"), Ok(None), "{k}");
        }
    }

    #[test]
    fn more_than_three_minors_behind_is_a_warning() {
        let w = check("c", "v1.33.1", "v1.37.2").unwrap().unwrap();
        assert_eq!(
            w,
            "--kubelet-version v1.33.1 would leave nodes 4 minor versions behind cluster c's API server \
             (v1.37.2); Kubernetes supports at most 3"
        );
        assert!(check("c", "v0.9.0", "v1.37.2").unwrap().is_some());
    }

    #[test]
    fn an_unreadable_version_is_a_warning_not_a_refusal() {
        let w = check("c", "v1.37.2", "weird").unwrap().unwrap();
        assert!(w.contains("not checked"), "{w}");
    }
}
