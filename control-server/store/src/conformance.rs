//! One set of behavioural tests every `Store` must pass, declared once
//! ([`conformance_suite!`]): lks-store-sqlite runs them in its unit tests
//! against an in-memory database, lks-store-etcd against a throwaway etcd.
//! Built with the `conformance` feature, which the backends' tests turn on.
//! The cases are grouped by aggregate in `conformance/`.

use lks_proto::labels::Labels;
use lks_proto::{BundleState, Digest, FileSpec, Manifest, SignedBundle};

use crate::{
    BundleRow, BundleStatusRow, NewBundle, NewNode, NewRollout, RolloutCommit, RolloutRow, StoredBundle,
    TargetChange, TokenRow,
};

mod audit;
mod bundles;
mod clusters;
mod deltas;
mod nodes;
mod plans;
mod reboots;
mod releases;
mod rollouts;

pub use audit::*;
pub use bundles::*;
pub use clusters::*;
pub use deltas::*;
pub use nodes::*;
pub use plans::*;
pub use reboots::*;
pub use releases::*;
pub use rollouts::*;

fn token(id: &str, cluster: &str, uses: Option<u32>, expires_at_ms: i64) -> TokenRow {
    TokenRow {
        id: id.into(),
        secret_hash: [7; 32],
        cluster: cluster.into(),
        expires_at_ms,
        remaining_uses: uses,
        labels: Labels::new(),
        created_at_ms: 0,
    }
}

fn node(name: &str, cluster: &str, token: &str, labels: &[(&str, &str)]) -> NewNode {
    NewNode {
        name: name.into(),
        cluster: cluster.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        cert_serial: format!("serial-{name}"),
        key_hash: format!("sha256:key-{name}"),
        token_id: token.into(),
        now_ms: 1000,
    }
}

/// A valid unsigned bundle `name@version` with one file whose content
/// `tag` picks: two tags are two contents of one version.
pub fn signed_bundle(name: &str, version: &str, tag: &str) -> SignedBundle {
    let content = format!("{name}@{version} {tag}");
    let manifest = Manifest {
        name: name.into(),
        version: version.into(),
        files: vec![FileSpec {
            path: "/etc/lks-test/file".parse().unwrap(),
            digest: Digest::of(content.as_bytes()),
            size: content.len() as u64,
            mode: 0o644,
            url: None,
            chunks: None,
            arch: None,
        }],
        ..Default::default()
    };
    manifest.validate().unwrap();
    SignedBundle {
        manifest,
        signature: None,
        chunks_signature: None,
    }
}

/// [`signed_bundle`] to publish; the server holds [`blob`]`(name, version)`.
pub fn bundle(name: &str, version: &str, tag: &str) -> NewBundle {
    NewBundle::new(signed_bundle(name, version, tag), vec![blob(name, version)], 5)
}

/// The blob [`bundle`] has the server hold for `name@version`.
pub fn blob(name: &str, version: &str) -> Digest {
    Digest::of(format!("blob-{name}-{version}").as_bytes())
}

/// The bytes a desired state carries for [`bundle`]`(name, version, tag)`.
pub fn encoded(name: &str, version: &str, tag: &str) -> Vec<u8> {
    StoredBundle::new(signed_bundle(name, version, tag))
        .encoded()
        .to_vec()
}

/// The row `b` reads back as.
pub fn row_of(b: &NewBundle) -> BundleRow {
    BundleRow {
        name: b.name.clone(),
        version: b.version.clone(),
        bundle: b.bundle.clone(),
        manifest_digest: b.manifest_digest,
        signed: b.signed,
        files: b.files,
        total_size: b.total_size,
        published_at_ms: b.now_ms,
    }
}

pub fn rollout(id: &str, cluster: &str, b: &str, v: &str, selector: &[(&str, &str)]) -> NewRollout {
    NewRollout {
        id: id.into(),
        cluster: cluster.into(),
        bundle: b.into(),
        version: v.into(),
        selector: selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        batch_size: 0,
        failure_threshold: 1,
        offline_deadline_ms: 600_000,
        policy: Default::default(),
        started_by: String::new(),
        now_ms: 10,
    }
}

pub fn commit(r: &RolloutRow, assign: &[(&str, Option<&str>)], target: TargetChange) -> RolloutCommit {
    RolloutCommit {
        rollout: r.clone(),
        assign: assign
            .iter()
            .map(|(n, v)| (n.to_string(), v.map(str::to_string)))
            .collect(),
        target,
        events: Vec::new(),
    }
}

fn held(version: &str, generation: u64) -> BundleStatusRow {
    BundleStatusRow {
        fetched_from_server: 0,
        fetched_from_peers: 0,
        fetched_as_delta: 0,
        name: "k".into(),
        version: version.into(),
        state: BundleState::Applied,
        message: String::new(),
        updated_at_ms: 1,
        generation,
    }
}

/// What a case about a corrupt record asks of a backend: to store a bundle
/// version's persisted fields as given, past every check. Each backend
/// implements it in its tests.
pub trait WriteStored {
    async fn write_stored_bundle(
        &self,
        name: &str,
        version: &str,
        signed_bundle: &[u8],
        manifest_digest: &str,
    );
}

/// Declares one `#[tokio::test]` per conformance case, the list kept here
/// once: each case runs against the store `$setup` makes, a block that
/// evaluates (inside the test's async body) to `(guard, store)`, the guard
/// kept alive until the case ends (a throwaway etcd, or `()`). Each backend
/// calls it once in its tests, so a new case runs on every backend.
#[macro_export]
macro_rules! conformance_suite {
    ($setup:block) => {
        $crate::conformance_suite!(@cases $setup;
            clusters_and_tokens,
            enrolment_consumes_uses_atomically_and_names_are_unique,
            bundles_are_immutable,
            rollouts_assign_only_what_the_controller_decides,
            a_report_that_leaves_out_an_undesired_bundle_means_it_was_removed,
            status_and_events,
            rollout_policies_are_stored,
            a_start_is_refused_for_the_first_precondition_it_fails,
            a_lost_enrolment_answer_can_be_repeated_with_the_same_key,
            a_node_with_its_stream_open_is_not_enrolled_over,
            a_joiner_starts_on_its_targets_and_joins_live_rollouts,
            cluster_cas_and_issued_certificates,
            peer_settings_are_stored_per_cluster,
            tenant_kube_access_is_kept_beside_the_cluster,
            certificate_records_outlive_their_node,
            certificate_records_expire_with_renewals,
            blob_records_are_compared_on_revisions,
            bundle_versions_in_use_are_not_deleted,
            bundles_read_back_typed,
            a_bundle_stored_unreadable_is_a_typed_error,
            the_audit_trail_keeps_records_in_order_filters_and_prunes,
            the_audit_trail_pages_past_many_records,
            releases_only_move_forward,
            one_release_version_is_stored_once_under_a_race,
            roots_follow_one_another,
            a_nodes_reported_trust_is_kept_with_it,
            a_nodes_reboot_state_and_requests_are_kept,
            reboot_policies_and_locks_are_kept_and_written_on_revisions,
            enrolled_nodes_are_counted,
            deltas_live_and_die_with_their_bundle_version,
            a_skip_is_recorded_with_its_reason_and_replaced_by_a_later_record,
            plans_are_stored_whole_and_compared_on_their_revision,
            clusters_carry_labels,
        );
    };
    (@cases $setup:block; $($name:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $name() {
            let (_guard, store) = $setup;
            $crate::conformance::$name(&store).await;
        }
    )*};
}
pub use crate::conformance_suite;
