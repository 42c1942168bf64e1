//! What the operations' tests start from (tests only): cluster `a`, its
//! enrolment token and enrolled nodes, in any store.

use lks_store::conformance::{commit, rollout};

use crate::store::{
    ClusterStore, NewCluster, NewNode, NodeStore, RolloutStore, TargetChange, TokenRow, TokenStore,
};

/// The id of cluster `a`'s token: no expiry, no use limit, no labels.
pub const TOKEN: &str = "abcdef";

/// Cluster `a` and its token [`TOKEN`].
pub async fn cluster_a(store: &(impl ClusterStore + TokenStore + ?Sized)) {
    store.create_cluster(NewCluster::new("a", 0)).await.unwrap();
    store
        .create_token(TokenRow {
            id: TOKEN.into(),
            secret_hash: [0; 32],
            cluster: "a".into(),
            expires_at_ms: i64::MAX,
            remaining_uses: None,
            labels: Default::default(),
            created_at_ms: 0,
        })
        .await
        .unwrap();
}

/// Node `name` of cluster `a` enrolled with [`TOKEN`], its certificate's
/// serial `serial` and its key's hash `key_hash`.
pub async fn enrol(store: &(impl NodeStore + ?Sized), name: &str, serial: &str, key_hash: &str) {
    store
        .enroll_node(NewNode {
            name: name.into(),
            cluster: "a".into(),
            labels: Default::default(),
            cert_serial: serial.into(),
            key_hash: key_hash.into(),
            token_id: TOKEN.into(),
            now_ms: 1,
        })
        .await
        .unwrap();
}

/// Puts `bundle@1` in node `n1`'s desired state, as a rollout's commit
/// does (rollout `r1` of cluster `a`).
pub async fn assign_n1(store: &(impl RolloutStore + ?Sized), bundle: &str) {
    let r = store
        .start_rollout(rollout("r1", "a", bundle, "1", &[]))
        .await
        .unwrap();
    store
        .commit_rollout(commit(&r, &[("n1", Some("1"))], TargetChange::Keep))
        .await
        .unwrap();
}
