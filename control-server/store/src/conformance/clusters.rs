//! Conformance cases: Clusters, tokens, peer settings, cluster CAs and issued certificates.

use crate::conformance::{node, token};
use crate::{
    ClusterKube, EventFilter, EventRow, Hint, IssuedCertRow, Kind, KubeFlags, NewCluster, PeerSettings,
    Store, StoreError, StoredCa,
};

#[allow(clippy::too_many_lines)]
pub async fn clusters_and_tokens(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    assert!(matches!(
        s.create_cluster(NewCluster::new("a", 2)).await,
        Err(StoreError::AlreadyExists(_))
    ));
    assert!(matches!(
        s.create_token(token("tok001", "nope", None, 10)).await,
        Err(StoreError::NotFound {
            kind: Kind::Cluster,
            hint: Some(Hint::CreateCluster),
            ..
        })
    ));
    s.create_token(token("tok001", "a", Some(1), 10_000))
        .await
        .unwrap();
    assert_eq!(
        s.get_token("tok001").await.unwrap().unwrap().remaining_uses,
        Some(1)
    );
    assert!(s.get_token("zzz").await.unwrap().is_none());
    assert_eq!(s.list_clusters().await.unwrap()[0].name, "a");
}

fn cert(cluster: &str, node: &str, serial: &str, path: &str, issued_at_ms: i64) -> IssuedCertRow {
    IssuedCertRow {
        cluster: cluster.into(),
        node: node.into(),
        serial: serial.into(),
        profile: "kubelet-client".into(),
        bundle: "kubelet".into(),
        version: "1".into(),
        path: path.into(),
        not_before_ms: issued_at_ms - 300_000,
        not_after_ms: issued_at_ms + 3_600_000,
        issued_at_ms,
    }
}

pub async fn peer_settings_are_stored_per_cluster(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_cluster(NewCluster::new("b", 1)).await.unwrap();
    // A new cluster: off, with the defaults.
    let a = s.get_cluster("a").await.unwrap().unwrap();
    assert_eq!(a.peer, PeerSettings::default());
    assert_eq!(
        a.peer,
        PeerSettings {
            enabled: false,
            port: 7444,
            upload_rate: 0,
            max_uploads: 4
        }
    );

    s.set_cluster_windows(
        "a",
        vec!["Sat 02:00-06:00 UTC".into()],
        EventRow::windows_set("a", &["Sat 02:00-06:00 UTC".into()], "admin", 2),
    )
    .await
    .unwrap();
    let on = PeerSettings {
        enabled: true,
        port: 7555,
        // Above i64::MAX: the whole u64 range is kept.
        upload_rate: u64::MAX - 1,
        max_uploads: 64,
    };
    let set = s
        .set_cluster_peer("a", on, EventRow::peer_sharing_set("a", &on, "admin", 3))
        .await
        .unwrap();
    assert_eq!(set.peer, on);
    assert_eq!(
        set.maintenance_windows,
        ["Sat 02:00-06:00 UTC"],
        "other settings stay"
    );
    assert_eq!(s.get_cluster("a").await.unwrap().unwrap().peer, on);
    let listed = s.list_clusters().await.unwrap();
    assert_eq!(
        listed.iter().map(|c| c.peer).collect::<Vec<_>>(),
        [on, PeerSettings::default()]
    );

    // Off: the other settings keep their values.
    let off = PeerSettings { enabled: false, ..on };
    let set = s
        .set_cluster_peer("a", off, EventRow::peer_sharing_set("a", &off, "admin", 4))
        .await
        .unwrap();
    assert_eq!(set.peer, off);
    assert_eq!(s.get_cluster("a").await.unwrap().unwrap().peer, off);
    assert_eq!(
        s.get_cluster("b").await.unwrap().unwrap().peer,
        PeerSettings::default()
    );

    assert!(matches!(
        s.set_cluster_peer("nope", on, EventRow::peer_sharing_set("nope", &on, "admin", 5))
            .await,
        Err(StoreError::NotFound {
            kind: Kind::Cluster,
            ..
        })
    ));
    assert!(s.get_cluster("nope").await.unwrap().is_none());
    let events = s
        .list_events(EventFilter {
            cluster: Some("a".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let peer: Vec<&EventRow> = events.iter().filter(|e| e.kind == "peer_sharing").collect();
    assert_eq!(peer.len(), 2, "{events:?}");
    assert!(
        peer.iter()
            .any(|e| e.message.contains("peer sharing on by admin: port 7555")),
        "{peer:?}"
    );
    assert!(
        peer.iter()
            .any(|e| e.message.contains("peer sharing off by admin")),
        "{peer:?}"
    );
}

/// A cluster's CA and API server, and the certificates its CA issued:
/// the steps below, in order, on one store.
pub async fn cluster_cas_and_issued_certificates(s: &dyn Store) {
    let ca = a_cluster_is_created_with_its_ca(s).await;
    a_ca_is_set_once_on_a_cluster_made_without(s, &ca).await;
    the_api_server_is_set_and_cleared(s, &ca).await;
    issued_certificates_are_ordered_and_filtered(s).await;
}

/// Cluster `a`, created with a CA and an API server; a second create
/// changes nothing. Returns the CA.
async fn a_cluster_is_created_with_its_ca(s: &dyn Store) -> StoredCa {
    let ca = StoredCa {
        cert_pem: "-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----\n".into(),
        key: "sealed-or-pem".into(),
    };
    let c = s
        .create_cluster(NewCluster {
            ca: Some(ca.clone()),
            api_server: Some("https://10.0.0.1:6443".into()),
            ..NewCluster::new("a", 1)
        })
        .await
        .unwrap();
    assert_eq!(c.ca_cert_pem.as_deref(), Some(ca.cert_pem.as_str()));
    assert_eq!(c.api_server.as_deref(), Some("https://10.0.0.1:6443"));
    // A refused create changes nothing: the first CA stays.
    assert!(matches!(
        s.create_cluster(NewCluster {
            ca: Some(StoredCa {
                cert_pem: "other".into(),
                key: "other".into()
            }),
            ..NewCluster::new("a", 2)
        })
        .await,
        Err(StoreError::AlreadyExists(_))
    ));
    assert_eq!(s.cluster_ca("a").await.unwrap(), Some(ca.clone()));
    let listed = s.list_clusters().await.unwrap();
    assert_eq!(listed[0].ca_cert_pem.as_deref(), Some(ca.cert_pem.as_str()));
    assert_eq!(listed[0].api_server.as_deref(), Some("https://10.0.0.1:6443"));
    let got = s.get_cluster("a").await.unwrap().unwrap();
    assert_eq!(got.api_server.as_deref(), Some("https://10.0.0.1:6443"));
    ca
}

/// An event of cluster `old` of `kind`, as a change records it.
fn old_event(kind: &str) -> EventRow {
    EventRow {
        id: 0,
        at_ms: 5,
        cluster: "old".into(),
        node: String::new(),
        rollout_id: String::new(),
        kind: kind.into(),
        bundle: String::new(),
        version: String::new(),
        message: kind.into(),
    }
}

/// A cluster made before CAs: none, until one is set, once.
async fn a_ca_is_set_once_on_a_cluster_made_without(s: &dyn Store, ca: &StoredCa) {
    s.create_cluster(NewCluster::new("old", 1)).await.unwrap();
    let old = s.get_cluster("old").await.unwrap().unwrap();
    assert_eq!((old.ca_cert_pem, old.api_server), (None, None));
    assert_eq!(s.cluster_ca("old").await.unwrap(), None);
    assert_eq!(s.cluster_ca("nope").await.unwrap(), None);
    let set = s
        .set_cluster_ca("old", ca.clone(), old_event("cluster_ca"))
        .await
        .unwrap();
    assert_eq!(set.ca_cert_pem.as_deref(), Some(ca.cert_pem.as_str()));
    assert_eq!(s.cluster_ca("old").await.unwrap(), Some(ca.clone()));
    let again = StoredCa {
        cert_pem: "x".into(),
        key: "y".into(),
    };
    assert!(matches!(
        s.set_cluster_ca("old", again.clone(), old_event("cluster_ca")).await,
        Err(StoreError::Conflict(m)) if m.contains("already has a CA")
    ));
    assert_eq!(s.cluster_ca("old").await.unwrap(), Some(ca.clone()));
    assert!(matches!(
        s.set_cluster_ca("nope", again, old_event("cluster_ca")).await,
        Err(StoreError::NotFound {
            kind: Kind::Cluster,
            ..
        })
    ));
}

/// The API server is set and cleared; windows stay as they were.
async fn the_api_server_is_set_and_cleared(s: &dyn Store, ca: &StoredCa) {
    s.set_cluster_windows(
        "old",
        vec!["Sat 02:00-06:00 UTC".into()],
        old_event("maintenance_windows"),
    )
    .await
    .unwrap();
    let set = s
        .set_cluster_api_server(
            "old",
            Some("https://k.example:6443".into()),
            old_event("api_server"),
        )
        .await
        .unwrap();
    assert_eq!(set.api_server.as_deref(), Some("https://k.example:6443"));
    assert_eq!(set.maintenance_windows, ["Sat 02:00-06:00 UTC"]);
    assert_eq!(set.ca_cert_pem.as_deref(), Some(ca.cert_pem.as_str()));
    let cleared = s
        .set_cluster_api_server("old", None, old_event("api_server"))
        .await
        .unwrap();
    assert_eq!(cleared.api_server, None);
    assert_eq!(
        s.cluster_ca("old").await.unwrap(),
        Some(ca.clone()),
        "the CA survives"
    );
    assert!(matches!(
        s.set_cluster_api_server("nope", None, old_event("api_server"))
            .await,
        Err(StoreError::NotFound {
            kind: Kind::Cluster,
            ..
        })
    ));
    let kinds: Vec<String> = s
        .list_events(EventFilter {
            cluster: Some("old".into()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(kinds.iter().any(|k| k == "cluster_ca"), "{kinds:?}");
    assert_eq!(
        kinds.iter().filter(|k| *k == "api_server").count(),
        2,
        "{kinds:?}"
    );
}

/// Issued certificates: ordered by node, path, issue time; filtered.
async fn issued_certificates_are_ordered_and_filtered(s: &dyn Store) {
    s.record_certificate(cert("a", "n2", "03", "/b", 30))
        .await
        .unwrap();
    s.record_certificate(cert("a", "n1", "02", "/b", 20))
        .await
        .unwrap();
    s.record_certificate(cert("a", "n1", "01", "/a", 40))
        .await
        .unwrap();
    s.record_certificate(cert("a", "n1", "04", "/a", 10))
        .await
        .unwrap();
    s.record_certificate(cert("old", "n1", "05", "/a", 50))
        .await
        .unwrap();
    assert!(matches!(
        s.record_certificate(cert("a", "n1", "01", "/z", 60)).await,
        Err(StoreError::AlreadyExists(_))
    ));
    assert!(matches!(
        s.record_certificate(cert("nope", "n1", "09", "/a", 60)).await,
        Err(StoreError::NotFound {
            kind: Kind::Cluster,
            ..
        })
    ));
    let serials = |rows: Vec<IssuedCertRow>| rows.into_iter().map(|r| r.serial).collect::<Vec<_>>();
    assert_eq!(
        serials(s.list_certificates(Some("a"), None).await.unwrap()),
        ["04", "01", "02", "03"]
    );
    assert_eq!(
        serials(s.list_certificates(Some("a"), Some("n1")).await.unwrap()),
        ["04", "01", "02"]
    );
    assert_eq!(
        serials(s.list_certificates(None, Some("n1")).await.unwrap()),
        ["04", "01", "05", "02"]
    );
    assert_eq!(s.list_certificates(None, None).await.unwrap().len(), 5);
    assert!(
        s.list_certificates(Some("a"), Some("n"))
            .await
            .unwrap()
            .is_empty()
    );
    let one = &s.list_certificates(Some("a"), Some("n2")).await.unwrap()[0];
    assert_eq!(one, &cert("a", "n2", "03", "/b", 30));
}

/// A new certificate drops its node's records of the same path that
/// expired more than the retention before it; nothing else.
pub async fn certificate_records_expire_with_renewals(s: &dyn Store) {
    use crate::CERT_RECORD_RETENTION_MS as KEEP;
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    // cert(): valid for an hour from its issue time.
    s.record_certificate(cert("a", "n1", "01", "/a", 0))
        .await
        .unwrap();
    s.record_certificate(cert("a", "n1", "02", "/b", 0))
        .await
        .unwrap();
    s.record_certificate(cert("a", "n2", "03", "/a", 0))
        .await
        .unwrap();
    // Issued just within the retention of 01's expiry: 01 stays.
    let hour = 3_600_000;
    s.record_certificate(cert("a", "n1", "04", "/a", hour + KEEP))
        .await
        .unwrap();
    let serials = |rows: Vec<IssuedCertRow>| rows.into_iter().map(|r| r.serial).collect::<Vec<_>>();
    assert_eq!(
        serials(s.list_certificates(Some("a"), None).await.unwrap()),
        ["01", "04", "02", "03"]
    );
    // Past it: 01 goes; n1's /b and n2's /a are not this node and path.
    s.record_certificate(cert("a", "n1", "05", "/a", hour + KEEP + 1))
        .await
        .unwrap();
    assert_eq!(
        serials(s.list_certificates(Some("a"), None).await.unwrap()),
        ["04", "05", "02", "03"]
    );
}

/// Deleting a node keeps the record of its certificates (audit).
pub async fn certificate_records_outlive_their_node(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_token(token("tok001", "a", None, i64::MAX))
        .await
        .unwrap();
    s.enroll_node(node("n1", "a", "tok001", &[])).await.unwrap();
    s.record_certificate(cert("a", "n1", "0a", "/a", 10))
        .await
        .unwrap();
    assert!(s.delete_node("n1").await.unwrap());
    assert_eq!(s.list_certificates(Some("a"), Some("n1")).await.unwrap().len(), 1);
}

pub async fn tenant_kube_access_is_kept_beside_the_cluster(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_cluster(NewCluster::new("b", 1)).await.unwrap();
    // A new cluster: no kubeconfig, no drain.
    assert_eq!(s.cluster_kube("a").await.unwrap(), Some(ClusterKube::default()));
    assert_eq!(
        s.get_cluster("a").await.unwrap().unwrap().kube,
        KubeFlags::default()
    );
    assert_eq!(s.cluster_kube("nope").await.unwrap(), None);

    let kube = ClusterKube {
        kubeconfig: Some("sealed-or-yaml".into()),
        drain: true,
    };
    let row = s
        .set_cluster_kube(
            "a",
            kube.clone(),
            EventRow::kube_set("a", "kubeconfig set", "admin", 2),
        )
        .await
        .unwrap();
    assert_eq!(
        row.kube,
        KubeFlags {
            kubeconfig: true,
            drain: true
        }
    );
    assert_eq!(s.cluster_kube("a").await.unwrap(), Some(kube.clone()));
    assert_eq!(s.get_cluster("a").await.unwrap().unwrap().kube, row.kube);
    let listed = s.list_clusters().await.unwrap();
    assert_eq!(
        listed.iter().map(|c| c.kube).collect::<Vec<_>>(),
        [row.kube, KubeFlags::default()]
    );
    // Another setting of the cluster leaves it alone, and shows it.
    let after = s
        .set_cluster_windows(
            "a",
            vec!["Sat 02:00-06:00 UTC".into()],
            EventRow::windows_set("a", &["Sat 02:00-06:00 UTC".into()], "admin", 3),
        )
        .await
        .unwrap();
    assert_eq!(after.kube, row.kube);
    assert_eq!(s.cluster_kube("a").await.unwrap(), Some(kube));

    // Removed.
    let row = s
        .set_cluster_kube(
            "a",
            ClusterKube::default(),
            EventRow::kube_set("a", "kubeconfig removed", "admin", 4),
        )
        .await
        .unwrap();
    assert_eq!(row.kube, KubeFlags::default());
    assert_eq!(s.cluster_kube("a").await.unwrap(), Some(ClusterKube::default()));
    assert!(matches!(
        s.set_cluster_kube(
            "nope",
            ClusterKube::default(),
            EventRow::kube_set("nope", "x", "admin", 5)
        )
        .await,
        Err(StoreError::NotFound {
            kind: Kind::Cluster,
            ..
        })
    ));
    let events = s
        .list_events(EventFilter {
            cluster: Some("a".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let kube: Vec<&EventRow> = events.iter().filter(|e| e.kind == "kube_access").collect();
    assert_eq!(kube.len(), 2, "{events:?}");
    assert!(
        kube.iter().any(|e| e.message == "kubeconfig set by admin"),
        "{kube:?}"
    );
}
