//! Labels a request carries (a token's, a rollout's selector): at most
//! `MAX_LABELS`, each key and value as Kubernetes allows them.

use std::collections::HashMap;

use lks_proto::labels::{LabelError, Labels, validate_label};
use lks_proto::limits::MAX_LABELS;

use super::Kind;

/// Why a request's labels were refused; `what` names the field.
#[derive(Debug, thiserror::Error)]
pub enum LabelsError {
    #[error("{what}: {count} labels; the limit is {MAX_LABELS}")]
    TooMany { what: &'static str, count: usize },
    #[error("{what}: {source}")]
    Label {
        what: &'static str,
        #[source]
        source: LabelError,
    },
}

impl LabelsError {
    pub fn kind(&self) -> Kind {
        Kind::Invalid
    }
}

/// Checks `labels` (the field `what` of a request) and keeps them sorted.
pub fn check(what: &'static str, labels: &HashMap<String, String>) -> Result<Labels, LabelsError> {
    if labels.len() > MAX_LABELS {
        return Err(LabelsError::TooMany {
            what,
            count: labels.len(),
        });
    }
    for (k, v) in labels {
        validate_label(k, v).map_err(|source| LabelsError::Label { what, source })?;
    }
    Ok(labels.clone().into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_over_the_limit_or_malformed_are_refused_naming_the_field() {
        let ok = HashMap::from([("zone".to_string(), "a".to_string())]);
        assert_eq!(check("labels", &ok).unwrap().len(), 1);
        let many: HashMap<String, String> = (0..=MAX_LABELS).map(|i| (format!("k{i}"), "v".into())).collect();
        assert_eq!(
            check("selector", &many).unwrap_err().to_string(),
            format!("selector: {} labels; the limit is {MAX_LABELS}", MAX_LABELS + 1)
        );
        let bad = HashMap::from([("-bad".to_string(), "v".to_string())]);
        assert!(
            check("labels", &bad)
                .unwrap_err()
                .to_string()
                .starts_with("labels: ")
        );
    }
}
