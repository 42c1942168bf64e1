//! The reboot gates' I/O (issue [reboots] item 3): a cluster's Prometheus
//! (`--reboot-alert-gate URL`, `GET URL/api/v1/alerts`) and its tenant
//! API (`--blocking-pod-selector`, one pod list per cluster) asked for the
//! answers `lks_rollout::gates` decides on. They are asked only while a
//! node wants a slot that nothing but the gates keeps from it
//! (`reboot::gated`), each answer kept [`TTL`] (the leader's lock, `node
//! get`, `reboot status` and FleetLock share it), each ask bounded by
//! [`ASK_TIMEOUT`]. An ask that fails is an answer too: the gate is closed
//! and the reason says why.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lks_kube::tenant::TenantApis;
use lks_proto::sync::lock;
use lks_rollout::gates::{self, GateAnswer, PromAlert, Unanswered};
use lks_rollout::reboot::{self, RebootClock, RebootView};

use crate::store::{AlertGate, ClusterRow, RebootLock};

/// How long an answer is reused.
pub const TTL: Duration = Duration::from_secs(3);
/// An ask of Prometheus gives up after this (connect and answer).
pub const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest `/api/v1/alerts` answer read.
const MAX_ANSWER: usize = 8 << 20;

type Pods = Result<Arc<HashMap<String, Vec<String>>>, Arc<AskError>>;
type Alerts = Result<Arc<Vec<PromAlert>>, Arc<AskError>>;

/// Why a gate's question got no answer (the gate is then closed, and the
/// node's wait reason says this, on one line).
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("the HTTP client cannot be made")]
    Client(#[source] reqwest::Error),
    #[error("{0}")]
    Http(#[source] reqwest::Error),
    #[error("an answer over {MAX_ANSWER} bytes")]
    TooLarge,
    #[error("HTTP {0}")]
    Status(u16),
    #[error("no answer within {}s", ASK_TIMEOUT.as_secs())]
    Timeout,
    #[error("not a Prometheus /api/v1/alerts answer")]
    NotAlerts(#[source] serde_json::Error),
    #[error("not a Prometheus /api/v1/alerts answer: no data")]
    NoData,
    #[error("Prometheus answered {status}: {error}")]
    Refused { status: String, error: String },
    #[error("cluster {0} has no kubeconfig")]
    NoKubeconfig(String),
    #[error(transparent)]
    Tenant(#[from] lks_kube::tenant::TenantError),
}

/// A failed ask as the pure gates take it: the shared error itself.
fn unanswered(e: &Arc<AskError>) -> Unanswered {
    Unanswered::shared(e.clone())
}

/// The gates' clients and their last answers.
pub struct Gates {
    http: Result<reqwest::Client, Arc<AskError>>,
    tenants: Arc<TenantApis>,
    /// By Prometheus URL: when asked, and its alerts (or why not).
    alerts: Mutex<HashMap<String, (Instant, Alerts)>>,
    /// By (cluster, selector): when asked, and the blocking pods by node.
    pods: Mutex<HashMap<(String, String), (Instant, Pods)>>,
}

impl Gates {
    pub fn new(tenants: Arc<TenantApis>) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(ASK_TIMEOUT)
            .timeout(ASK_TIMEOUT)
            .build()
            .map_err(|e| Arc::new(AskError::Client(e)));
        Gates {
            http,
            tenants,
            alerts: Mutex::default(),
            pods: Mutex::default(),
        }
    }

    /// Fills in the gates' answers for the nodes of `c` that only the
    /// gates could keep from a slot now; asks nothing when there are none.
    pub async fn fill(
        &self,
        c: &ClusterRow,
        lock: &RebootLock,
        views: &mut BTreeMap<String, RebootView>,
        clock: &mut RebootClock,
    ) {
        let wanted = reboot::gated(&c.reboots, lock, views, clock);
        if wanted.is_empty() {
            return;
        }
        if let Some(g) = &c.reboots.alert_gate {
            clock.alerts = self.alerts(g).await;
        }
        if !c.reboots.blocking_pod_selector.is_empty() && clock.tenant_api {
            let pods = self.pods(&c.name, &c.reboots.blocking_pod_selector).await;
            for n in wanted {
                if let Some(v) = views.get_mut(&n) {
                    v.blocking_pods = on_node(&pods, &n);
                }
            }
        }
    }

    /// The answers for one FleetLock `pre-reboot`: the alert gate's, and
    /// the blocking-pod gate's for `node` (the id's node, if it names one).
    pub async fn fill_one(
        &self,
        c: &ClusterRow,
        node: Option<(&str, &mut RebootView)>,
        clock: &mut RebootClock,
    ) {
        if let Some(g) = &c.reboots.alert_gate {
            clock.alerts = self.alerts(g).await;
        }
        if let Some((name, v)) = node
            && !c.reboots.blocking_pod_selector.is_empty()
            && clock.tenant_api
        {
            let pods = self.pods(&c.name, &c.reboots.blocking_pod_selector).await;
            v.blocking_pods = on_node(&pods, name);
        }
    }

    /// The firing alerts of `g`'s Prometheus its filter matches, or why
    /// they could not be read.
    async fn alerts(&self, g: &AlertGate) -> GateAnswer {
        let cached = lock(&self.alerts)
            .get(&g.url)
            .filter(|(at, _)| at.elapsed() < TTL)
            .map(|(_, a)| a.clone());
        let all = match cached {
            Some(a) => a,
            None => {
                let a = self.ask_prometheus(&g.url).await.map(Arc::new);
                if let Err(why) = &a {
                    tracing::warn!(url = %g.url, error = %unanswered(why), "reboot alert gate: Prometheus cannot be asked; the gate is closed");
                }
                lock(&self.alerts).insert(g.url.clone(), (Instant::now(), a.clone()));
                a
            }
        };
        // Checked when set; a filter that no longer compiles closes the gate.
        let filter = match gates::compile_filter(&g.filter) {
            Ok(f) => f,
            Err(e) => return Some(Err(Unanswered::new(e))),
        };
        Some(
            all.map(|a| gates::blocking_alerts(&a, filter.as_ref()))
                .map_err(|e| unanswered(&e)),
        )
    }

    async fn ask_prometheus(&self, url: &str) -> Result<Vec<PromAlert>, Arc<AskError>> {
        let http = self.http.as_ref().map_err(Arc::clone)?;
        let ask = async {
            let mut resp = http
                .get(format!("{url}/api/v1/alerts"))
                .send()
                .await
                .map_err(AskError::Http)?;
            let status = resp.status();
            if resp.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
                return Err(AskError::TooLarge);
            }
            // Read piece by piece: an answer without a length is cut at
            // the limit, not read whole first.
            let mut body = Vec::new();
            while let Some(piece) = resp.chunk().await.map_err(AskError::Http)? {
                if body.len() + piece.len() > MAX_ANSWER {
                    return Err(AskError::TooLarge);
                }
                body.extend_from_slice(&piece);
            }
            if !status.is_success() {
                return Err(AskError::Status(status.as_u16()));
            }
            parse_alerts(&body)
        };
        match tokio::time::timeout(ASK_TIMEOUT, ask).await {
            Ok(r) => r,
            Err(_) => Err(AskError::Timeout),
        }
        .map_err(Arc::new)
    }

    /// The blocking pods of `cluster` by node, or why they could not be read.
    async fn pods(&self, cluster: &str, selector: &str) -> Pods {
        let key = (cluster.to_string(), selector.to_string());
        if let Some((_, p)) = lock(&self.pods).get(&key).filter(|(at, _)| at.elapsed() < TTL) {
            return p.clone();
        }
        let p = match self.tenants.blocking_pods(cluster, selector).await {
            Ok(Some(by_node)) => Ok(Arc::new(by_node)),
            Ok(None) => Err(Arc::new(AskError::NoKubeconfig(cluster.to_string()))),
            Err(e) => Err(Arc::new(AskError::Tenant(e))),
        };
        if let Err(why) = &p {
            tracing::warn!(%cluster, error = %unanswered(why), "reboot blocking-pod gate: the tenant API cannot be asked; the gate is closed");
        }
        lock(&self.pods).insert(key, (Instant::now(), p.clone()));
        p
    }
}

fn on_node(pods: &Pods, node: &str) -> GateAnswer {
    Some(
        pods.as_ref()
            .map(|by_node| by_node.get(node).cloned().unwrap_or_default())
            .map_err(unanswered),
    )
}

#[derive(serde::Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    data: Option<Data>,
}

#[derive(serde::Deserialize)]
struct Data {
    alerts: Vec<Alert>,
}

#[derive(serde::Deserialize)]
struct Alert {
    #[serde(default)]
    labels: HashMap<String, String>,
    #[serde(default)]
    state: String,
}

/// Prometheus' `/api/v1/alerts` answer: every active alert, its name (the
/// `alertname` label) and state.
pub fn parse_alerts(body: &[u8]) -> Result<Vec<PromAlert>, AskError> {
    let a: Answer = serde_json::from_slice(body).map_err(AskError::NotAlerts)?;
    if a.status != "success" {
        return Err(AskError::Refused {
            status: a.status,
            error: a.error,
        });
    }
    let data = a.data.ok_or(AskError::NoData)?;
    Ok(data
        .alerts
        .into_iter()
        .map(|mut al| PromAlert {
            name: al.labels.remove("alertname").unwrap_or_default(),
            state: al.state,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alerts_answer_is_read() {
        let body = br#"{"status":"success","data":{"alerts":[
            {"labels":{"alertname":"KubeNodeNotReady","severity":"warning"},"annotations":{},"state":"firing","activeAt":"2026-01-01T00:00:00Z","value":"1e+00"},
            {"labels":{"alertname":"Slow"},"state":"pending"}]}}"#;
        let a = parse_alerts(body).unwrap();
        assert_eq!(
            a,
            vec![
                PromAlert {
                    name: "KubeNodeNotReady".into(),
                    state: "firing".into()
                },
                PromAlert {
                    name: "Slow".into(),
                    state: "pending".into()
                },
            ]
        );
        assert_eq!(
            parse_alerts(br#"{"status":"error","errorType":"internal","error":"boom"}"#)
                .unwrap_err()
                .to_string(),
            "Prometheus answered error: boom"
        );
        assert!(
            lks_proto::report::one_line(&parse_alerts(b"<html>").unwrap_err())
                .starts_with("not a Prometheus /api/v1/alerts answer: ")
        );
    }
}
