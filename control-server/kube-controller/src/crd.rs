//! The custom resources kube0 declares lksadmin with (API group
//! `lksadmin.io`, version `v1alpha1`; issue [kube-front]). The Rust types
//! are the source: the CRD manifests under `packaging/kubernetes/crds/`
//! are generated from them (`lks-kube-controller crds`) and a test keeps
//! the committed files equal to what the types generate.
//!
//! Who owns what (GitOps): the user owns every `spec`, the controller only
//! `status`. `LksNode` and `LksBundleVersion` mirror the server; of them
//! only `LksNode.spec.hold` is the user's.
//!
//! Field names follow Kubernetes conventions (camelCase); durations are
//! strings as lksctl takes them ("10m", "90s"), and a choice is one of its
//! words ("defer", "wait"), which the schema lists: both are [`SpecValue`]s.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::time::Duration;

use kube::CustomResource;
use lks_proto::duration::{DurationError, format_duration, parse_duration};
use lks_rollout::policy::{DrainTimeout, OfflinePolicy};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

mod reboots;
pub use reboots::{AlertGateSpec, Reboots};

/// The API group of every lksadmin resource.
pub const GROUP: &str = "lksadmin.io";
/// Its only version so far.
pub const VERSION: &str = "v1alpha1";

/// What a [`SpecValue`] holds: a duration or one of the policy's choices,
/// read from and written as its text.
pub trait SpecText: Sized {
    /// What the value is, for the schema's name.
    const WHAT: &'static str;
    fn parse_text(text: &str) -> Option<Self>;
    fn to_text(&self) -> String;
    /// The words a choice is one of; empty: any text that parses.
    fn words() -> Vec<&'static str> {
        Vec::new()
    }
}

impl SpecText for Duration {
    const WHAT: &'static str = "Duration";
    fn parse_text(text: &str) -> Option<Self> {
        parse_duration(text).ok()
    }
    fn to_text(&self) -> String {
        format_duration(*self)
    }
}

impl SpecText for OfflinePolicy {
    const WHAT: &'static str = "OfflinePolicy";
    fn parse_text(text: &str) -> Option<Self> {
        OfflinePolicy::parse(text)
    }
    fn to_text(&self) -> String {
        self.as_str().to_string()
    }
    fn words() -> Vec<&'static str> {
        [OfflinePolicy::Defer, OfflinePolicy::Wait]
            .map(OfflinePolicy::as_str)
            .to_vec()
    }
}

impl SpecText for DrainTimeout {
    const WHAT: &'static str = "DrainTimeout";
    fn parse_text(text: &str) -> Option<Self> {
        DrainTimeout::parse(text)
    }
    fn to_text(&self) -> String {
        self.as_str().to_string()
    }
    fn words() -> Vec<&'static str> {
        [DrainTimeout::Fail, DrainTimeout::Skip]
            .map(DrainTimeout::as_str)
            .to_vec()
    }
}

impl SpecText for lks_proto::pb::RebootMode {
    const WHAT: &'static str = "RebootMode";
    fn parse_text(text: &str) -> Option<Self> {
        use lks_proto::pb::RebootMode as M;
        [M::Auto, M::Manual, M::Off]
            .into_iter()
            .find(|m| reboot_mode_word(*m) == text)
    }
    fn to_text(&self) -> String {
        reboot_mode_word(*self).to_string()
    }
    fn words() -> Vec<&'static str> {
        vec!["auto", "manual", "off"]
    }
}

/// `cluster set --reboots`' word for a mode (unspecified reads as off,
/// the server's default).
pub fn reboot_mode_word(m: lks_proto::pb::RebootMode) -> &'static str {
    use lks_proto::pb::RebootMode as M;
    match m {
        M::Auto => "auto",
        M::Manual => "manual",
        M::Off | M::Unspecified => "off",
    }
}

impl SpecText for lks_proto::pb::RebootTimeoutPolicy {
    const WHAT: &'static str = "RebootTimeoutPolicy";
    fn parse_text(text: &str) -> Option<Self> {
        use lks_proto::pb::RebootTimeoutPolicy as P;
        [P::Free, P::Keep]
            .into_iter()
            .find(|p| reboot_timeout_word(*p) == text)
    }
    fn to_text(&self) -> String {
        reboot_timeout_word(*self).to_string()
    }
    fn words() -> Vec<&'static str> {
        vec!["free", "keep"]
    }
}

/// `cluster set --on-reboot-timeout`' word (unspecified reads as free,
/// the server's default).
pub fn reboot_timeout_word(p: lks_proto::pb::RebootTimeoutPolicy) -> &'static str {
    use lks_proto::pb::RebootTimeoutPolicy as P;
    match p {
        P::Keep => "keep",
        P::Free | P::Unspecified => "free",
    }
}

impl SpecText for lks_proto::pb::PlanOnHalt {
    const WHAT: &'static str = "PlanOnHalt";
    fn parse_text(text: &str) -> Option<Self> {
        use lks_proto::pb::PlanOnHalt as H;
        [H::Pause, H::Finish].into_iter().find(|h| h.to_text() == text)
    }
    fn to_text(&self) -> String {
        match self {
            lks_proto::pb::PlanOnHalt::Pause => "pause",
            lks_proto::pb::PlanOnHalt::Finish => "finish",
        }
        .to_string()
    }
    fn words() -> Vec<&'static str> {
        vec!["pause", "finish"]
    }
}

/// A typed spec field, kept as written: serialized back as the same text
/// (so a stored object, and the digest of a started spec, stay as they
/// were), a choice's schema lists its words (`enum:`). Text that does not
/// parse — stored before the schema refused it, or a duration, which the
/// schema does not check — still reads, so one such object never stops
/// the controller from reading the others; [`SpecValue::get`] refuses it,
/// and the controller reports it on that object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecValue<T> {
    text: String,
    _of: PhantomData<T>,
}

impl<T: SpecText> SpecValue<T> {
    /// The value as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// What it says; `None`: the text names nothing.
    pub fn get(&self) -> Option<T> {
        T::parse_text(&self.text)
    }
}

impl SpecValue<Duration> {
    /// The duration, or why the text is none.
    pub fn duration(&self) -> Result<Duration, DurationError> {
        parse_duration(&self.text)
    }
}

impl<T: SpecText> From<T> for SpecValue<T> {
    fn from(v: T) -> Self {
        SpecValue {
            text: v.to_text(),
            _of: PhantomData,
        }
    }
}

impl<T: SpecText> From<&str> for SpecValue<T> {
    /// Any text, as a user may write it (what [`Self::get`] makes of it is
    /// decided when it is read).
    fn from(text: &str) -> Self {
        SpecValue {
            text: text.to_string(),
            _of: PhantomData,
        }
    }
}

impl<T> Serialize for SpecValue<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de, T> Deserialize<'de> for SpecValue<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|text| SpecValue {
            text,
            _of: PhantomData,
        })
    }
}

impl<T: SpecText> JsonSchema for SpecValue<T> {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        T::WHAT.into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let words = T::words();
        if words.is_empty() {
            json_schema!({"type": "string"})
        } else {
            json_schema!({"type": "string", "enum": words})
        }
    }
}

/// A reference to a key of a Secret in kube0 (what the controller reads,
/// never copies into a spec or status).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    pub name: String,
    pub namespace: String,
    /// The key in the Secret's data.
    pub key: String,
}

/// A condition as Kubernetes objects report them (`Ready`, `Progressing`,
/// `Completed`, `Failed`); Argo CD and Flux health checks read these.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    /// One CamelCase word.
    #[serde(default)]
    pub reason: String,
    /// One line: for a refused spec, the server's reason.
    #[serde(default)]
    pub message: String,
    /// RFC 3339.
    #[serde(default)]
    pub last_transition_time: String,
    /// The spec generation this condition is about.
    #[serde(default)]
    pub observed_generation: i64,
}

/// A tenant cluster (`lksctl cluster create/set`).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "lksadmin.io",
    version = "v1alpha1",
    kind = "LksCluster",
    plural = "lksclusters",
    shortname = "lkscl",
    status = "LksClusterStatus",
    printcolumn = r#"{"name":"Nodes","type":"integer","jsonPath":".status.nodes"}"#,
    printcolumn = r#"{"name":"Connected","type":"integer","jsonPath":".status.connected"}"#,
    printcolumn = r#"{"name":"Drain","type":"boolean","jsonPath":".spec.drain"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct LksClusterSpec {
    /// The tenant API server's URL for node kubeconfigs (`--api-server`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server: Option<String>,
    /// The tenant cluster CA to import (a `kubernetes.io/tls` Secret's
    /// `tls.crt` and `tls.key`); absent: the server generates one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret: Option<SecretName>,
    /// The kubeconfig of the tenant API the server drains with
    /// (`--kubeconfig`; packaging/kubernetes/tenant/README.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<SecretKeyRef>,
    /// Rollouts drain each node at its turn unless they say otherwise.
    #[serde(default)]
    pub drain: bool,
    /// `DAYS HH:MM-HH:MM ZONE`, e.g. "Sat,Sun 02:00-06:00 Europe/Berlin";
    /// empty: nodes may start at any time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub maintenance_windows: Vec<String>,
    /// Peer sharing between the cluster's nodes; absent: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_sharing: Option<PeerSharing>,
    /// Coordinated reboots (`cluster set --reboots …`, issue [reboots]);
    /// absent, and each field absent: left as the server has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboots: Option<Reboots>,
    /// The cluster's labels (`cluster set --labels k=v,…`), which release
    /// plans select clusters by; replaces them all, `{}` removes them;
    /// absent: left as the server has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

/// A Secret in kube0 by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretName {
    pub name: String,
    pub namespace: String,
}

/// `cluster set --peer-sharing on --peer-port … --peer-upload-rate …
/// --peer-max-uploads …`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeerSharing {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// "50MiB", "200Mbit", or bytes per second; absent: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_rate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uploads: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LksClusterStatus {
    #[serde(default)]
    pub nodes: u32,
    #[serde(default)]
    pub connected: u32,
    /// `sha256:…` of the cluster CA, as join lines pin it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca_cert_hash: String,
    /// What the server found at the tenant API when it was last given the
    /// kubeconfig, e.g. "reachable, Kubernetes v1.37.2, 3 nodes".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kube_probe: String,
    /// 16 hex digits of the SHA-256 of the kubeconfig last sent to the
    /// server (never the kubeconfig): a changed Secret is sent again.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kubeconfig_digest: String,
    #[serde(default)]
    pub observed_generation: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// An enrolled node, mirrored from the server; only `spec.hold` is the
/// user's.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "lksadmin.io",
    version = "v1alpha1",
    kind = "LksNode",
    plural = "lksnodes",
    shortname = "lksno",
    status = "LksNodeStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".status.cluster"}"#,
    printcolumn = r#"{"name":"Connected","type":"boolean","jsonPath":".status.connected"}"#,
    printcolumn = r#"{"name":"Kube","type":"string","jsonPath":".status.kube.state"}"#,
    printcolumn = r#"{"name":"Agent","type":"string","jsonPath":".status.agentVersion"}"#,
    printcolumn = r#"{"name":"Arch","type":"string","jsonPath":".status.architecture"}"#,
    printcolumn = r#"{"name":"Bundles","type":"string","jsonPath":".status.bundleSummary"}"#,
    printcolumn = r#"{"name":"Trust","type":"string","jsonPath":".status.trust.state","priority":1}"#,
    printcolumn = r#"{"name":"Held","type":"string","jsonPath":".spec.hold.reason","priority":1}"#,
    printcolumn = r#"{"name":"Last Seen","type":"date","jsonPath":".status.lastSeen"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct LksNodeSpec {
    /// Hold the node (`lksctl node hold --reason`): it gets no new desired
    /// state; absent: not held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hold {
    /// One line, at most 512 bytes.
    #[serde(default)]
    pub reason: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LksNodeStatus {
    #[serde(default)]
    pub cluster: String,
    #[serde(default)]
    pub connected: bool,
    /// RFC 3339; absent: never seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub agent_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub architecture: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bundles: Vec<NodeBundle>,
    /// "kubelet@1.37.2 applied, …", for the table.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bundle_summary: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<NodeTrust>,
    /// The node as its tenant cluster sees it ([kube-drain]); absent when
    /// the cluster has no kubeconfig.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube: Option<NodeKube>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeBundle {
    pub name: String,
    pub version: String,
    /// "pending", "applying", "applied", "failed", "rolled_back".
    pub state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTrust {
    /// "ok", "stale-release", "refused", "clock", "no-release".
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub release_version: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeKube {
    /// "Ready", "NotReady", "Unknown", "cordoned", "absent", "unreachable".
    pub state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kubelet_version: String,
    #[serde(default)]
    pub unschedulable: bool,
    /// The rollout whose cordon this is, if lksadmin's.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cordoned_by: String,
}

/// A rollout (`lksctl rollout start`). `spec.paused: true` pauses it;
/// deleting an active one aborts it (a finalizer); a rollback is a new
/// LksRollout (`spec.rollbackOf`).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "lksadmin.io",
    version = "v1alpha1",
    kind = "LksRollout",
    plural = "lksrollouts",
    shortname = "lksro",
    namespaced,
    status = "LksRolloutStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.cluster"}"#,
    printcolumn = r#"{"name":"Bundle","type":"string","jsonPath":".spec.bundle"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Updated","type":"integer","jsonPath":".status.updated"}"#,
    printcolumn = r#"{"name":"Failed","type":"integer","jsonPath":".status.failed"}"#,
    printcolumn = r#"{"name":"Total","type":"integer","jsonPath":".status.total"}"#,
    printcolumn = r#"{"name":"Applying","type":"integer","jsonPath":".status.applying","priority":1}"#,
    printcolumn = r#"{"name":"ID","type":"string","jsonPath":".status.id","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct LksRolloutSpec {
    /// The LksCluster (tenant cluster) name.
    pub cluster: String,
    /// `NAME@VERSION` of a published bundle (see `kubectl get
    /// lksbundleversions`).
    pub bundle: String,
    /// Only nodes with these labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// The rollout policy (its fields sit in the spec itself).
    #[serde(flatten)]
    pub policy: RolloutPolicySpec,
    /// Pause (true) and resume (false) the rollout.
    #[serde(default)]
    pub paused: bool,
    /// The server's ID of the rollout this one rolls back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_of: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Canary {
    pub count: u32,
    /// How long canaries must stay committed, e.g. "10m"; absent: 10m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak: Option<SpecValue<Duration>>,
}

/// `rollout start --drain …`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Drain {
    pub enabled: bool,
    /// e.g. "10m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<SpecValue<Duration>>,
    /// e.g. "5m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_timeout: Option<SpecValue<Duration>>,
    /// "fail" (default) or "skip".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<SpecValue<DrainTimeout>>,
    #[serde(default)]
    pub delete_local_data: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_version: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LksRolloutStatus {
    /// The server's rollout ID, once started.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// "running", "paused", "completed", "failed", "aborted",
    /// "rolling_back", "rolled_back".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    #[serde(default)]
    pub total: u32,
    #[serde(default)]
    pub updated: u32,
    #[serde(default)]
    pub failed: u32,
    #[serde(default)]
    pub pending: u32,
    #[serde(default)]
    pub deferred: u32,
    #[serde(default)]
    pub held: u32,
    /// Batch progress: nodes applying now (at most the batch size) ...
    #[serde(default)]
    pub applying: u32,
    /// ... when the next batch may start (RFC 3339; `batchInterval`) ...
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub next_batch_at: String,
    /// ... and, with canaries, where they are: "picking", "applying",
    /// "soaking" or "passed".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub canary_phase: String,
    /// One line: the server's message.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// 16 hex digits of the SHA-256 of the spec (without `paused`) the
    /// rollout was started with: after the start only `paused` may change.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub started_spec_digest: String,
    #[serde(default)]
    pub observed_generation: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A published bundle version, mirrored read-only from the server so that
/// a rollout manifest can be checked with `kubectl get`.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "lksadmin.io",
    version = "v1alpha1",
    kind = "LksBundleVersion",
    plural = "lksbundleversions",
    shortname = "lksbv",
    printcolumn = r#"{"name":"Bundle","type":"string","jsonPath":".spec.bundle"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version"}"#,
    printcolumn = r#"{"name":"Files","type":"integer","jsonPath":".spec.files"}"#,
    printcolumn = r#"{"name":"Signed","type":"boolean","jsonPath":".spec.signed"}"#,
    printcolumn = r#"{"name":"Published","type":"date","jsonPath":".spec.publishedAt"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct LksBundleVersionSpec {
    pub bundle: String,
    pub version: String,
    #[serde(default)]
    pub files: u32,
    #[serde(default)]
    pub signed: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub architectures: Vec<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub published_at: String,
}

/// A release plan (`lksctl plan create`, issue [fleet-plans]): one bundle
/// version to the clusters of its groups, in order. Created once, named
/// as the object; `spec.paused` pauses and resumes it; deleting a plan
/// still going aborts it (a finalizer).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "lksadmin.io",
    version = "v1alpha1",
    kind = "LksPlan",
    plural = "lksplans",
    shortname = "lkspl",
    status = "LksPlanStatus",
    printcolumn = r#"{"name":"Bundle","type":"string","jsonPath":".spec.bundle"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"In Flight","type":"integer","jsonPath":".status.inFlight"}"#,
    printcolumn = r#"{"name":"Failures","type":"integer","jsonPath":".status.failures"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct LksPlanSpec {
    /// `NAME@VERSION` of a published bundle.
    pub bundle: String,
    /// In order (`--group NAME=SELECTOR`): cluster names ("a,b"), cluster
    /// labels ("k=v[,k2=v2]"), or "*" (every cluster not in an earlier
    /// group).
    pub groups: Vec<PlanGroupSpec>,
    /// Between one group's end and the next group's start, e.g. "1h".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak: Option<SpecValue<Duration>>,
    /// Most clusters with a running rollout at once; absent: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_clusters_in_flight: Option<u32>,
    /// Failed cluster rollouts that halt the plan; absent: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_budget: Option<u32>,
    /// What a halted plan does with its running rollouts: "pause"
    /// (default) or "finish".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_halt: Option<SpecValue<lks_proto::pb::PlanOnHalt>>,
    /// A plan running longer than this raises an alert, e.g. "12h".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert_after: Option<SpecValue<Duration>>,
    /// Each cluster's rollout: its node selector and policy, as an
    /// `LksRollout` spec says them.
    #[serde(default)]
    pub rollout: PlanRollout,
    /// Pause (true) and resume (false) the plan.
    #[serde(default)]
    pub paused: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanGroupSpec {
    pub name: String,
    pub selector: String,
}

/// The rollout of each cluster of a plan: an `LksRollout` spec's selector
/// and policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanRollout {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    #[serde(flatten)]
    pub policy: RolloutPolicySpec,
}

/// A rollout's policy as a spec says it, written once for `LksRollout`
/// and `LksPlan` (its fields sit in the spec that holds it); converted to
/// and from the one `lks_rollout::Policy` by `policy.rs`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPolicySpec {
    /// Most nodes applying at once; absent: the server's default (10 %).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u32>,
    /// Failed nodes that stop the rollout; absent: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<u32>,
    /// "defer" (default) or "wait".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offline: Option<SpecValue<OfflinePolicy>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<Canary>,
    /// Pause between batches, e.g. "5m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_interval: Option<SpecValue<Duration>>,
    #[serde(default)]
    pub ignore_windows: bool,
    /// Drain each node around its turn; absent: the cluster's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<Drain>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LksPlanStatus {
    /// "running", "paused", "halted", "completed", "aborted",
    /// "rolling_back", "rolled_back".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default)]
    pub in_flight: u32,
    #[serde(default)]
    pub failures: u32,
    #[serde(default)]
    pub budget_used: u32,
    #[serde(default)]
    pub overdue: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<PlanGroupStatus>,
    /// As `LksRolloutStatus.startedSpecDigest`: after the create only
    /// `paused` may change.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub started_spec_digest: String,
    #[serde(default)]
    pub observed_generation: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanGroupStatus {
    pub name: String,
    /// "waiting", "running", "soaking", "done".
    pub state: String,
    /// RFC 3339, while soaking.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub soak_until: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<PlanClusterStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanClusterStatus {
    pub name: String,
    /// "waiting", "soaking", "running", "completed", "failed", "skipped",
    /// "rolling_back", "rolled_back".
    pub state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rollout_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default)]
    pub total: u32,
    #[serde(default)]
    pub updated: u32,
    #[serde(default)]
    pub failed: u32,
}
