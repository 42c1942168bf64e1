//! `LksCluster.spec.reboots` (issue [reboots]): the reboot policy and its
//! gates, as `cluster set --reboots …` sets them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use std::time::Duration;

use super::SpecValue;

/// `cluster set --reboots … --max-concurrent-reboots …
/// --reboot-timeout … --on-reboot-timeout …`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reboots {
    /// "auto" (nodes that report a reboot required, and `lksctl reboot
    /// start`), "manual" (only `reboot start`) or "off".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<SpecValue<lks_proto::pb::RebootMode>>,
    /// Nodes rebooting at once, from their drain until back Ready (≥ 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrent: Option<u32>,
    /// How long a node has, from taking its slot, to be back Ready, e.g.
    /// "30m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<SpecValue<Duration>>,
    /// What a reboot-lost node's slot becomes: "free" or "keep".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<SpecValue<lks_proto::pb::RebootTimeoutPolicy>>,
    /// No slot while an alert its filter matches is firing in this
    /// Prometheus (`--reboot-alert-gate URL --alert-filter REGEX`); `{}`
    /// with an empty url removes the gate; absent: left as the server has
    /// it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert_gate: Option<AlertGateSpec>,
    /// A Kubernetes label selector: a node running a pod it matches in the
    /// tenant cluster gets no slot (`--blocking-pod-selector`); "" removes
    /// it; absent: left as the server has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocking_pod_selector: Option<String>,
}

/// `cluster set --reboot-alert-gate URL --alert-filter REGEX`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AlertGateSpec {
    /// The Prometheus base URL (http[s]://HOST:PORT[/PATH]), asked at
    /// URL/api/v1/alerts; empty: no gate.
    #[serde(default)]
    pub url: String,
    /// A regular expression searched in each firing alert's name; empty:
    /// every firing alert holds reboots.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub filter: String,
}
