//! The console's JSON endpoints: each one is an lksctl verb, answered with
//! the admin API and rendered by lksctl's own `-o json` code; actions run
//! the verb's own code, so they do what it does and fail with its words.
//!
//! GET  clusters                      cluster list -o json
//! GET  nodes?cluster=C               node list [--cluster C] -o json
//! GET  nodes/NAME                    node get NAME -o json
//! GET  bundles                       bundle list -o json
//! GET  bundles/NAME/VERSION          bundle get NAME@VERSION -o json
//! GET  rollouts?cluster=C            rollout list [--cluster C] -o json
//! GET  rollouts/ID                   rollout status ID -o json
//! GET  plans                         plan list -o json
//! GET  plans/NAME                    plan status NAME -o json
//! GET  events?cluster=&node=&rollout=&limit=   event list … -o json
//! GET  audit?verb=&since=MS&limit=   audit [--verb V] [--limit N] -o json
//! GET  selector?cluster=C&selector=S the nodes a rollout start would target
//! GET  info                          the console and the server it uses
//! POST rollouts                      rollout start (JSON body: cluster, bundle,
//!                                    selector, batch_size, failure_threshold)
//! POST rollouts/ID/VERB              rollout pause|resume|abort|rollback ID
//! POST plans/NAME/VERB               plan pause|resume|abort|rollback NAME

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use hyper::StatusCode;
use lks_proto::labels::selector_matches;
use lks_proto::names::{validate_cluster_name, validate_node_name};
use lks_proto::pb;
use lks_proto::report::one_line;
use lks_rollout::policy::{OfflinePolicy, Policy};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::client::{self, Client, RpcError, status};
use crate::flags::labels;
use crate::rollout::{self, Verb};
use crate::{bundle, output, plan};

/// How long one endpoint may take before the server counts as unreachable.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A failed endpoint: lksctl's error line (without `error: `), and whether
/// the control server could not be reached at all.
#[derive(Debug)]
pub struct ApiError {
    code: StatusCode,
    msg: String,
    unreachable: bool,
    /// The start form's field the error is about, when it is known.
    field: Option<&'static str>,
}

impl ApiError {
    fn new(code: StatusCode, msg: impl Into<String>) -> ApiError {
        ApiError {
            code,
            msg: msg.into(),
            unreachable: false,
            field: None,
        }
    }

    fn unreachable(msg: impl Into<String>) -> ApiError {
        ApiError {
            code: StatusCode::BAD_GATEWAY,
            msg: msg.into(),
            unreachable: true,
            field: None,
        }
    }

    pub fn http_status(&self) -> StatusCode {
        self.code
    }

    pub fn to_json(&self) -> Value {
        json!({ "error": self.msg, "unreachable": self.unreachable, "field": self.field })
    }
}

/// An lksctl error, as lksctl prints it after `error: `.
impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> ApiError {
        use tonic::Code;
        let msg = one_line(&*e).replace('\n', " ");
        let Some(rpc) = e.chain().find_map(|c| c.downcast_ref::<RpcError>()) else {
            // Checked before dialling, like lksctl's own checks.
            let field = ["cluster", "bundle", "selector"]
                .into_iter()
                .find(|f| msg.starts_with(&format!("--{f}:")));
            return ApiError {
                field,
                ..ApiError::new(StatusCode::BAD_REQUEST, msg)
            };
        };
        let code = match rpc.code {
            Code::Unavailable | Code::DeadlineExceeded => return ApiError::unreachable(msg),
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
            Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::BAD_GATEWAY,
        };
        let field = if rpc.code == Code::NotFound && msg.contains(": bundle ") {
            Some("bundle")
        } else if rpc.code == Code::NotFound && msg.contains(": cluster ") {
            Some("cluster")
        } else {
            None
        };
        ApiError {
            field,
            ..ApiError::new(code, msg)
        }
    }
}

type ApiResult = Result<Value, ApiError>;

/// The admin API as the console uses it: one connection, made on demand
/// and made again (to whichever replica answers) once it fails.
pub struct Api {
    config: PathBuf,
    conn: Mutex<Option<(Client, String)>>,
}

impl Api {
    pub fn new(config: PathBuf) -> Api {
        Api {
            config,
            conn: Mutex::new(None),
        }
    }

    async fn client(&self) -> Result<(Client, String), ApiError> {
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref() {
            return Ok(c.clone());
        }
        let c = client::connect(&self.config)
            .await
            .map_err(|e| ApiError::unreachable(one_line(&*e).replace('\n', " ")))?;
        *conn = Some(c.clone());
        Ok(c)
    }

    /// An unreachable server is dialled again next time: through
    /// `admin.conf`'s list, so another replica can take over.
    async fn forget_if_unreachable(&self, r: &ApiResult) {
        if matches!(r, Err(e) if e.unreachable) {
            *self.conn.lock().await = None;
        }
    }

    async fn timed(&self, f: impl Future<Output = ApiResult>) -> ApiResult {
        let r = match tokio::time::timeout(CALL_TIMEOUT, f).await {
            Ok(r) => r,
            Err(_) => Err(ApiError::unreachable(format!(
                "the control server did not answer within {CALL_TIMEOUT:?}"
            ))),
        };
        self.forget_if_unreachable(&r).await;
        r
    }

    pub async fn get(&self, path: &str, query: &str) -> ApiResult {
        let q = Query::parse(query);
        let parts: Vec<String> = path.split('/').map(percent_decode).collect();
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        if parts == ["info"] {
            let server = self.conn.lock().await.as_ref().map(|(_, url)| url.clone());
            return Ok(json!({
                "version": env!("CARGO_PKG_VERSION"),
                "config": self.config.display().to_string(),
                "server": server,
            }));
        }
        self.timed(async {
            let (mut c, url) = self.client().await?;
            let c = &mut c;
            let st = |s: tonic::Status| status(&url, s);
            match parts.as_slice() {
                ["clusters"] => {
                    let r = c.list_clusters(pb::ListClustersRequest {}).await;
                    let r = r.map_err(st).context("list clusters")?.into_inner();
                    Ok(json!(
                        r.clusters.iter().map(output::cluster_json).collect::<Vec<_>>()
                    ))
                }
                ["nodes"] => {
                    let r = c
                        .list_nodes(pb::ListNodesRequest {
                            cluster: q.get("cluster"),
                        })
                        .await;
                    let r = r.map_err(st).context("list nodes")?.into_inner();
                    Ok(json!(r.nodes.iter().map(output::node_json).collect::<Vec<_>>()))
                }
                ["nodes", name] => {
                    validate_node_name(name).map_err(anyhow::Error::from)?;
                    let r = c
                        .get_node(pb::GetNodeRequest {
                            name: name.to_string(),
                        })
                        .await;
                    let n = r.map_err(st).with_context(|| format!("get node {name}"))?;
                    Ok(output::node_json(n.get_ref()))
                }
                ["bundles"] => {
                    let r = c.list_bundles(pb::ListBundlesRequest::default()).await;
                    let r = r.map_err(st).context("list bundles")?.into_inner();
                    Ok(json!(
                        r.bundles.iter().map(output::bundle_json).collect::<Vec<_>>()
                    ))
                }
                ["bundles", name, version] => {
                    let b = bundle::get(c, &url, &format!("{name}@{version}")).await?;
                    Ok(bundle::detail_json(&b))
                }
                ["rollouts"] => {
                    let r = c
                        .list_rollouts(pb::ListRolloutsRequest {
                            cluster: q.get("cluster"),
                        })
                        .await;
                    let r = r.map_err(st).context("list rollouts")?.into_inner();
                    Ok(json!(
                        r.rollouts.iter().map(output::rollout_json).collect::<Vec<_>>()
                    ))
                }
                ["rollouts", id] => {
                    let r = c.get_rollout(pb::RolloutRef { id: id.to_string() }).await;
                    let r = r.map_err(st).with_context(|| format!("get rollout {id}"))?;
                    Ok(output::rollout_json(r.get_ref()))
                }
                ["plans"] => {
                    let r = c.list_plans(pb::ListPlansRequest {}).await;
                    let r = r.map_err(st).context("list plans")?.into_inner();
                    Ok(json!(r.plans.iter().map(plan::plan_json).collect::<Vec<_>>()))
                }
                ["plans", name] => Ok(plan::plan_json(&plan::get(c, &url, name).await?)),
                ["events"] => events(c, &url, &q).await,
                ["audit"] => audit(c, &url, &q).await,
                ["selector"] => selector(c, &url, &q).await,
                _ => Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("no endpoint /api/{path}"),
                )),
            }
        })
        .await
    }

    pub async fn post(&self, path: &str, body: &[u8]) -> ApiResult {
        let parts: Vec<String> = path.split('/').map(percent_decode).collect();
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        match parts.as_slice() {
            ["rollouts"] => {
                let form: StartForm = serde_json::from_slice(body).map_err(|e| {
                    ApiError::new(StatusCode::BAD_REQUEST, format!("invalid start request: {e}"))
                })?;
                // Checked before dialling, as lksctl does.
                rollout::check_start(&form.cluster, &form.bundle, &form.selector)?;
                self.timed(async {
                    let (mut c, url) = self.client().await?;
                    let (r, warnings) = rollout::start(
                        &mut c,
                        &url,
                        &rollout::Start {
                            cluster: &form.cluster,
                            bundle: &form.bundle,
                            selector: &form.selector,
                            policy: Policy {
                                batch_size: (form.batch_size > 0).then_some(form.batch_size),
                                failure_threshold: (form.failure_threshold > 0)
                                    .then_some(form.failure_threshold),
                                offline: Some(OfflinePolicy::Defer),
                                ..Default::default()
                            },
                            request_id: "",
                        },
                    )
                    .await?;
                    Ok(json!({
                        "message": output::rollout_line(&r),
                        "rollout": output::rollout_json(&r),
                        "warnings": warnings,
                    }))
                })
                .await
            }
            ["rollouts", id, verb] => {
                let verb = Verb::parse(verb).ok_or_else(|| {
                    ApiError::new(
                        StatusCode::NOT_FOUND,
                        format!("no rollout action {verb:?} (pause, resume, abort, rollback)"),
                    )
                })?;
                self.timed(async {
                    let (mut c, url) = self.client().await?;
                    let r = rollout::act(&mut c, &url, verb, id).await?;
                    Ok(json!({ "message": output::rollout_line(&r), "rollout": output::rollout_json(&r) }))
                })
                .await
            }
            ["plans", name, verb] => {
                let verb = plan::Verb::parse(verb).ok_or_else(|| {
                    ApiError::new(
                        StatusCode::NOT_FOUND,
                        format!("no plan action {verb:?} (pause, resume, abort, rollback)"),
                    )
                })?;
                self.timed(async {
                    let (mut c, url) = self.client().await?;
                    let p = plan::act(&mut c, &url, verb, name).await?;
                    Ok(json!({ "message": plan::plan_line(&p), "plan": plan::plan_json(&p) }))
                })
                .await
            }
            _ => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no action /api/{path}"),
            )),
        }
    }
}

/// The start form: what `rollout start` takes from it; every other flag
/// keeps its default.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StartForm {
    cluster: String,
    bundle: String,
    #[serde(default)]
    selector: String,
    #[serde(default)]
    batch_size: u32,
    #[serde(default)]
    failure_threshold: u32,
}

/// `GET /api/events?cluster=&node=&rollout=&limit=`.
async fn events(c: &mut Client, url: &str, q: &Query) -> ApiResult {
    let st = |s: tonic::Status| status(url, s);
    let limit = q.get("limit");
    let limit = if limit.is_empty() {
        0
    } else {
        limit
            .parse()
            .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid limit {limit:?}")))?
    };
    let r = c
        .list_events(pb::ListEventsRequest {
            cluster: q.get("cluster"),
            node: q.get("node"),
            rollout_id: q.get("rollout"),
            limit,
        })
        .await;
    let r = r.map_err(st).context("list events")?.into_inner();
    Ok(json!(r.events.iter().map(output::event_json).collect::<Vec<_>>()))
}

/// `GET /api/audit?since=&verb=&limit=`: the audit trail.
async fn audit(c: &mut Client, url: &str, q: &Query) -> ApiResult {
    let st = |s: tonic::Status| status(url, s);
    let number = |k: &str| -> Result<i64, ApiError> {
        let v = q.get(k);
        if v.is_empty() {
            return Ok(0);
        }
        v.parse()
            .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid {k} {v:?}")))
    };
    let limit = u32::try_from(number("limit")?)
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, "invalid limit".to_string()))?;
    let r = c
        .list_audit(pb::ListAuditRequest {
            since_ms: number("since")?,
            verb: q.get("verb"),
            limit,
        })
        .await;
    let r = r.map_err(st).context("list the audit trail")?.into_inner();
    Ok(json!(
        r.records
            .iter()
            .map(crate::audit::record_json)
            .collect::<Vec<_>>()
    ))
}

/// `GET /api/selector?cluster=&selector=`: how many nodes a rollout's
/// selector would take, how many of them connected, and the first 20.
async fn selector(c: &mut Client, url: &str, q: &Query) -> ApiResult {
    let st = |s: tonic::Status| status(url, s);
    let cluster = q.get("cluster");
    validate_cluster_name(&cluster).context("--cluster")?;
    let selector = labels("--selector", &q.get("selector"))?;
    let r = c
        .list_nodes(pb::ListNodesRequest {
            cluster: cluster.clone(),
        })
        .await;
    let r = r.map_err(st).context("list nodes")?.into_inner();
    let matching: Vec<&pb::Node> = r
        .nodes
        .iter()
        .filter(|n| {
            let l: lks_proto::labels::Labels = n.labels.clone().into_iter().collect();
            selector_matches(&selector, &l)
        })
        .collect();
    Ok(json!({
        "cluster": cluster,
        "matches": matching.len(),
        "connected": matching.iter().filter(|n| n.connected).count(),
        "nodes": matching.iter().take(20).map(|n| &n.name).collect::<Vec<_>>(),
    }))
}

/// An `application/x-www-form-urlencoded` query.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: &str) -> Query {
        Query(
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (
                        percent_decode(&k.replace('+', " ")),
                        percent_decode(&v.replace('+', " ")),
                    )
                })
                .collect(),
        )
    }

    /// The first value of `key`, or empty.
    fn get(&self, key: &str) -> String {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }
}

/// `%XX` escapes decoded; a malformed escape stays as it is.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(v) = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use anyhow::anyhow;

    use super::*;

    #[test]
    fn queries_decode() {
        let q = Query::parse("cluster=c%2D1&selector=role%3Dweb%2Czone%3Da&x&empty=");
        assert_eq!(q.get("cluster"), "c-1");
        assert_eq!(q.get("selector"), "role=web,zone=a");
        assert_eq!(q.get("x"), "");
        assert_eq!(q.get("missing"), "");
        assert_eq!(percent_decode("a+b%zz%4"), "a+b%zz%4");
        assert_eq!(Query::parse("k=a+b").get("k"), "a b");
    }

    #[test]
    fn errors_keep_lksctls_words_and_say_what_failed() {
        let e: ApiError = anyhow!("--selector: invalid label \"x\": expected key=value").into();
        assert_eq!((e.code, e.field), (StatusCode::BAD_REQUEST, Some("selector")));
        let e: ApiError = status(
            "https://cp:7443",
            tonic::Status::failed_precondition("rollout r is completed"),
        )
        .context("pause rollout r")
        .into();
        assert_eq!(e.msg, "pause rollout r: rollout r is completed");
        assert_eq!(e.code, StatusCode::CONFLICT);
        assert!(!e.unreachable);
        let e: ApiError = status(
            "https://cp:7443",
            tonic::Status::unavailable("connection refused"),
        )
        .context("list nodes")
        .into();
        assert!(e.unreachable);
        assert_eq!(e.to_json()["unreachable"], true);
    }
}
