//! Conditions as Kubernetes objects keep them: one per type, whose
//! `lastTransitionTime` moves only when its status changes.

use crate::crd::Condition;

/// Now, RFC 3339 to the second.
pub fn now() -> String {
    let t = time::OffsetDateTime::now_utc();
    t.replace_nanosecond(0)
        .unwrap_or(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// A condition of `type_` saying `on` for `reason` (one CamelCase word)
/// with a one-line `message`, about spec `generation`.
pub fn condition(type_: &str, on: bool, reason: &str, message: &str, generation: i64) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if on { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        last_transition_time: String::new(),
        observed_generation: generation,
    }
}

/// Sets `new` in `conds` (replacing the one of its type), keeping the
/// previous transition time when the status did not change, else `now`.
pub fn set(conds: &mut Vec<Condition>, mut new: Condition, now: &str) {
    match conds.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            new.last_transition_time = if old.status == new.status && !old.last_transition_time.is_empty() {
                old.last_transition_time.clone()
            } else {
                now.to_string()
            };
            *old = new;
        }
        None => {
            new.last_transition_time = now.to_string();
            conds.push(new);
        }
    }
}

/// The condition of `type_`, if any.
pub fn get<'a>(conds: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conds.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let mut c = Vec::new();
        set(&mut c, condition("Ready", false, "Refused", "no", 1), "t1");
        assert_eq!(c[0].last_transition_time, "t1");
        set(&mut c, condition("Ready", false, "Refused", "still no", 2), "t2");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].last_transition_time, "t1", "same status: same transition");
        assert_eq!(c[0].message, "still no");
        assert_eq!(c[0].observed_generation, 2);
        set(&mut c, condition("Ready", true, "Reconciled", "", 2), "t3");
        assert_eq!(c[0].last_transition_time, "t3");
        assert_eq!(get(&c, "Ready").map(|c| c.status.as_str()), Some("True"));
        assert!(get(&c, "Failed").is_none());
        assert!(now().ends_with('Z'), "{}", now());
    }
}
