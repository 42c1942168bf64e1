//! The patch-release scenario the delta tests run against one server or
//! two replicas (see [`scenario`]).

use super::*;

/// The scenario: `publisher` publishes and starts rollouts, the agents
/// join `other` (the same server, or another replica, which then serves
/// patches another replica made through the shared blob store).
/// `corrupt(hex)` damages a patch where `other` serves it from, or is
/// `None` where that cannot be reached. `algorithm`: the patches' format
/// the servers were told to make (`--delta-algorithm`).
pub(super) fn scenario(publisher: &Server, other: &Server, algorithm: &str, corrupt: Option<&dyn Fn(&str)>) {
    publisher.create_cluster("c");
    let work = tempfile::tempdir().unwrap();
    let v1 = noise(SIZE, 7);
    let v2 = next_release(&v1, 1);
    let v3 = next_release(&v2, 2);
    let v4 = next_release(&v3, 3);

    let mut a = Agent::new("n0");
    // No heal pass copies a target back into the cache mid-test (case 3).
    a.heal_interval = "1h".into();
    a.join(other, "c", &[]);
    a.start();
    let mut sc = Scenario {
        publisher,
        other,
        work,
        a,
    };
    sc.app_1_is_installed_and_has_no_patch(&v1);
    sc.v2_comes_as_a_patch_made_from_v1(&v1, &v2, algorithm);
    sc.corrupt_patches_are_refused_for_the_whole_file(&v2, &v3, corrupt);
    let whole3 =
        sc.a_base_gone_from_the_cache_is_rebuilt_from_the_installed_file(&v3, &v4, corrupt.is_some());
    sc.a_node_without_any_base_gets_the_whole_file(&v4, whole3);
    sc.a.stop();
}

/// One run of the scenario: the servers, the versions' directory and
/// node n0, which takes each version in turn.
struct Scenario<'a> {
    publisher: &'a Server,
    other: &'a Server,
    work: tempfile::TempDir,
    a: Agent,
}

impl Scenario<'_> {
    /// The bytes of `kind` both servers served (once when they are one).
    fn served(&self, kind: &str) -> u64 {
        served(self.publisher, kind)
            + if std::ptr::eq(self.publisher, self.other) {
                0
            } else {
                served(self.other, kind)
            }
    }

    /// The bytes patches saved, on both servers (once when they are one).
    fn saved(&self) -> u64 {
        served_saved(self.publisher)
            + if std::ptr::eq(self.publisher, self.other) {
                0
            } else {
                served_saved(self.other)
            }
    }

    /// Where n0's cache keeps `content`.
    fn cached(&self, content: &[u8]) -> PathBuf {
        self.a
            .state_dir
            .join("cache/sha256")
            .join(Digest::of(content).hex())
    }

    /// app@1 rolled out and in n0's cache; it has no patch.
    fn app_1_is_installed_and_has_no_patch(&self, v1: &[u8]) {
        assert_eq!(
            self.publisher.publish(&version(self.work.path(), "1", v1)),
            "app@1"
        );
        roll_out(self.publisher, "app@1");
        wait_node_bundle(self.publisher, "n0", "app", "1", "applied");
        wait_until(Duration::from_secs(30), "app@1 in the node's cache", || {
            self.cached(v1).exists()
        });
        assert!(
            self.publisher.lksctl_json(&["bundle", "get", "app@1"])["deltas"]
                .as_array()
                .unwrap()
                .is_empty()
        );
    }

    /// Case 1: v2 through a patch made from v1's bytes.
    fn v2_comes_as_a_patch_made_from_v1(&self, v1: &[u8], v2: &[u8], algorithm: &str) {
        assert_eq!(
            self.publisher.publish(&version(self.work.path(), "2", v2)),
            "app@2"
        );
        let deltas = wait_deltas(self.publisher, "2", 1);
        let d = &deltas[0];
        assert_eq!(
            (&d["path"], &d["from_version"]),
            (&PATH.into(), &"1".into()),
            "{d}"
        );
        assert_eq!(d["file_size"], v2.len() as u64);
        assert_eq!(d["base_sha256"], Digest::of(v1).hex());
        assert_eq!(d["algorithm"], algorithm, "{d}");
        let patch_size = d["size"].as_u64().unwrap();
        assert!(patch_size * 20 < v2.len() as u64, "patch of {patch_size} bytes");
        let (delta0, whole0) = (self.served("delta"), self.served("whole"));
        let fetched = roll_out(self.publisher, "app@2");
        wait_node_bundle(self.publisher, "n0", "app", "2", "applied");
        // `rollout status -o json`: the rollout's bytes, patches against whole.
        assert_eq!(fetched["from_server"], patch_size, "{fetched}");
        assert_eq!(
            (&fetched["as_delta"], &fetched["whole"]),
            (&patch_size.into(), &0.into()),
            "{fetched}"
        );
        assert_eq!(
            std::fs::read(self.a.root.join(&PATH[1..])).unwrap(),
            v2,
            "rebuilt byte-exact"
        );
        let (delta1, whole1) = (self.served("delta"), self.served("whole"));
        assert_eq!(delta1 - delta0, patch_size, "the patch, once");
        assert_eq!(whole1, whole0, "no whole file");
        let saved = self.saved();
        assert!(saved >= v2.len() as u64 - patch_size, "bytes saved counted");
        assert!(self.a.log().contains("blob rebuilt from a delta and verified"));
        // The node says what it fetched, and how much of it was patches.
        let n = self.publisher.lksctl_json(&["node", "get", "n0"]);
        let b = &n["bundles"][0];
        assert_eq!((&b["name"], &b["version"]), (&"app".into(), &"2".into()), "{n}");
        assert_eq!(b["fetched_from_server"], patch_size, "{n}");
        assert_eq!(b["fetched_as_delta"], patch_size, "{n}");
        println!(
            "DELTA file={} patch={patch_size} ({:.2} %)",
            v2.len(),
            patch_size as f64 * 100.0 / v2.len() as f64
        );
    }

    /// Case 2: v3's patches corrupted where they are served from: the node
    /// refuses them and fetches the whole file.
    fn corrupt_patches_are_refused_for_the_whole_file(
        &self,
        v2: &[u8],
        v3: &[u8],
        corrupt: Option<&dyn Fn(&str)>,
    ) {
        wait_until(Duration::from_secs(30), "app@2 in the node's cache", || {
            self.cached(v2).exists()
        });
        assert_eq!(
            self.publisher.publish(&version(self.work.path(), "3", v3)),
            "app@3"
        );
        let deltas3 = wait_deltas(self.publisher, "3", 2);
        if let Some(corrupt) = corrupt {
            for d in &deltas3 {
                corrupt(d["sha256"].as_str().unwrap());
            }
        }
        let (delta2, whole2) = (self.served("delta"), self.served("whole"));
        roll_out(self.publisher, "app@3");
        wait_node_bundle(self.publisher, "n0", "app", "3", "applied");
        assert_eq!(std::fs::read(self.a.root.join(&PATH[1..])).unwrap(), v3);
        if corrupt.is_some() {
            assert!(
                self.served("whole") - whole2 >= v3.len() as u64,
                "the whole file after the bad patch"
            );
            assert!(
                self.a.log().contains("delta not used, fetching the whole file"),
                "one line says why"
            );
        } else {
            assert!(self.served("delta") > delta2 && self.served("whole") == whole2);
        }
    }

    /// Case 3: the base gone from the node's cache: rebuilt from the installed
    /// file (hashed whole first), still a patch. Returns the whole-file
    /// bytes served so far.
    fn a_base_gone_from_the_cache_is_rebuilt_from_the_installed_file(
        &self,
        v3: &[u8],
        v4: &[u8],
        corrupted: bool,
    ) -> u64 {
        wait_until(Duration::from_secs(30), "app@3 in the node's cache", || {
            self.cached(v3).exists()
        });
        assert_eq!(
            self.publisher.publish(&version(self.work.path(), "4", v4)),
            "app@4"
        );
        let deltas = wait_deltas(self.publisher, "4", 2);
        std::fs::remove_file(self.cached(v3)).unwrap();
        let (delta3, whole3) = (self.served("delta"), self.served("whole"));
        roll_out(self.publisher, "app@4");
        wait_node_bundle(self.publisher, "n0", "app", "4", "applied");
        assert_eq!(std::fs::read(self.a.root.join(&PATH[1..])).unwrap(), v4);
        let from_v3 = deltas.iter().find(|d| d["from_version"] == "3").unwrap();
        assert_eq!(self.served("delta") - delta3, from_v3["size"].as_u64().unwrap());
        assert_eq!(self.served("whole"), whole3, "no whole file");
        let rebuilt = self
            .a
            .log()
            .matches("blob rebuilt from a delta and verified")
            .count();
        assert_eq!(rebuilt, if corrupted { 2 } else { 3 });

        whole3
    }

    /// Case 4: a node without any base (it joins now and gets app@4 at once):
    /// the whole file.
    fn a_node_without_any_base_gets_the_whole_file(&self, v4: &[u8], whole3: u64) {
        let mut b = Agent::new("n1");
        b.join(self.other, "c", &[]);
        b.start();
        wait_node_bundle(self.publisher, "n1", "app", "4", "applied");
        assert_eq!(std::fs::read(b.root.join(&PATH[1..])).unwrap(), v4);
        assert!(self.served("whole") - whole3 >= v4.len() as u64);
        assert!(!b.log().contains("rebuilt from a delta"));
        b.stop();
    }
}
