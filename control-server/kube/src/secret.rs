//! A tenant kubeconfig at rest: sealed with the server's `--encryption-key-file`
//! key when it has one (hex of the envelope, associated data
//! `<prefix>clusterkube/<cluster>#kubeconfig`, so a value copied to another
//! cluster fails to open), else kept as the checked text (SQLite: in the
//! 0700 data dir, like the cluster CA keys). The store sees only the opaque
//! string, as for cluster CA keys (`lks_pki::clusterca::keys`).

use lks_pki::seal::{OpenTextError, SealError, SealKey, open_text, seal_text, sealed_envelope};

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error(
        "cluster {cluster}: the kubeconfig is encrypted; give lks-control-server --encryption-key-file with the key it was sealed with"
    )]
    NoSealKey { cluster: String },
    #[error("cluster {cluster}: open the kubeconfig: {source}")]
    Open {
        cluster: String,
        #[source]
        source: OpenTextError,
    },
    #[error("cluster {cluster}: seal the kubeconfig: {source}")]
    Seal {
        cluster: String,
        #[source]
        source: SealError,
    },
}

/// The stored form of a kubeconfig: sealed (hex) with `seal` for `aad`
/// (the store's `sealed_aad`), else the text.
pub fn seal_kubeconfig(
    seal: Option<&SealKey>,
    aad: &[u8],
    cluster: &str,
    text: &str,
) -> Result<String, SecretError> {
    seal_text(seal, aad, text).map_err(|source| SecretError::Seal {
        cluster: cluster.to_string(),
        source,
    })
}

/// The text of a stored kubeconfig. One stored before the server had an
/// encryption key is read as it is: a kubeconfig (JSON or YAML) is never
/// hex of a sealed envelope.
pub fn open_kubeconfig(
    seal: Option<&SealKey>,
    aad: &[u8],
    cluster: &str,
    stored: &str,
) -> Result<String, SecretError> {
    let Some(envelope) = sealed_envelope(stored) else {
        return Ok(stored.to_string());
    };
    open_text(seal, aad, &envelope).map_err(|e| match e {
        OpenTextError::NoKey => SecretError::NoSealKey {
            cluster: cluster.to_string(),
        },
        source => SecretError::Open {
            cluster: cluster.to_string(),
            source,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_kubeconfig_hides_its_token_and_opens_only_for_its_cluster() {
        let seal = SealKey::from_bytes(&[7; 32]);
        let text = r#"{"users":[{"name":"lks","user":{"token":"s3cr3t-token"}}]}"#;
        let stored = seal_kubeconfig(Some(&seal), b"/lks/clusterkube/a#kubeconfig", "a", text).unwrap();
        assert!(!stored.contains("s3cr3t"), "sealed");
        assert_eq!(
            open_kubeconfig(Some(&seal), b"/lks/clusterkube/a#kubeconfig", "a", &stored).unwrap(),
            text
        );
        // Bound to where it is kept (the store's `sealed_aad`): copied to
        // another cluster's name, or under another prefix, refused.
        assert!(matches!(
            open_kubeconfig(Some(&seal), b"/lks/clusterkube/b#kubeconfig", "b", &stored),
            Err(SecretError::Open { .. })
        ));
        assert!(open_kubeconfig(Some(&seal), b"/other/clusterkube/a#kubeconfig", "a", &stored).is_err());
        // Without the key: one line naming the flag.
        let e = open_kubeconfig(None, b"/lks/clusterkube/a#kubeconfig", "a", &stored).unwrap_err();
        assert!(e.to_string().contains("--encryption-key-file"), "{e}");
        // Another key does not open it.
        let other = SealKey::from_bytes(&[8; 32]);
        assert!(open_kubeconfig(Some(&other), b"/lks/clusterkube/a#kubeconfig", "a", &stored).is_err());
    }

    #[test]
    fn without_a_key_the_text_is_stored_and_read_back() {
        let text = "apiVersion: v1\nkind: Config\n";
        assert_eq!(seal_kubeconfig(None, b"", "a", text).unwrap(), text);
        assert_eq!(open_kubeconfig(None, b"", "a", text).unwrap(), text);
        // Stored before the server had a key: read as it is.
        let seal = SealKey::from_bytes(&[7; 32]);
        assert_eq!(open_kubeconfig(Some(&seal), b"", "a", text).unwrap(), text);
    }
}
