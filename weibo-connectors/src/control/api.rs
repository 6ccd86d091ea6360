//! The control plane's HTTP API (JSON), served behind the admin API's
//! gate (`weibo::AdminService`): loopback unless given a token, the same
//! checks of hosts and origins.
//!
//! | request | what |
//! | --- | --- |
//! | `GET /` | the page of the jobs (`/dashboard/app.js`, `/dashboard/style.css`) |
//! | `GET /api/jobs` | every job: spec and status (`?live=1`: with each running job's `GET /api/job`) |
//! | `POST /api/jobs` | submit a job (its spec) and start it |
//! | `GET /api/jobs/{name}` | its spec, status and latest events |
//! | `PUT /api/jobs/{name}` | replace its spec (the next start runs it) |
//! | `DELETE /api/jobs/{name}` | remove a job that does not run |
//! | `POST /api/jobs/{name}/start` | start it |
//! | `POST /api/jobs/{name}/stop` | stop it (`{"savepoint": "<name>"}` to take one) |
//! | `POST /api/jobs/{name}/upgrade` | stop it with a savepoint and start a new spec from it (`{"savepoint": "<name>", "spec": {...}}`; without `savepoint`, from its last checkpoint) |
//! | `POST /api/jobs/{name}/savepoint` | take savepoint `{"name": "<name>"}`; the job runs on |
//! | `POST /api/jobs/{name}/cancel` | kill it |
//! | `GET /api/jobs/{name}/logs?lines=N` | the last lines of its output |

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::{ControlError, ControlPlane, JobSpec};

/// The API's routes over `plane`.
pub fn routes(plane: ControlPlane) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/dashboard", get(page))
        .route(
            "/dashboard/app.js",
            get(|| async { file("text/javascript; charset=utf-8", include_str!("page/app.js")) }),
        )
        .route(
            "/dashboard/style.css",
            get(|| async { file("text/css; charset=utf-8", include_str!("page/style.css")) }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .route("/api/jobs", get(list).post(submit))
        .route("/api/jobs/{name}", get(show).put(update).delete(remove))
        .route("/api/jobs/{name}/start", post(start))
        .route("/api/jobs/{name}/stop", post(stop))
        .route("/api/jobs/{name}/upgrade", post(upgrade))
        .route("/api/jobs/{name}/savepoint", post(savepoint))
        .route("/api/jobs/{name}/cancel", post(cancel))
        .route("/api/jobs/{name}/logs", get(logs))
        .fallback(|| async { answer_error(StatusCode::NOT_FOUND, "no such endpoint".into()).into_response() })
        .with_state(plane)
}

/// An error answer: its status and message.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, axum::Json(json!({ "error": self.1, "status": self.0.as_u16() }))).into_response()
    }
}

fn answer_error(status: StatusCode, message: String) -> ApiError {
    ApiError(status, message)
}

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> Self {
        let status = match &e {
            ControlError::NoJob(_) => StatusCode::NOT_FOUND,
            ControlError::Exists(_) | ControlError::Refused(_) => StatusCode::CONFLICT,
            ControlError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, e.to_string())
    }
}

type Answer = Result<Response, ApiError>;

fn ok(value: Value) -> Answer {
    Ok(axum::Json(value).into_response())
}

/// `bytes` as a `T`, or 400 naming where the JSON is wrong.
fn body<T: serde::de::DeserializeOwned>(bytes: &Bytes, what: &str) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        answer_error(
            StatusCode::BAD_REQUEST,
            format!("the body is not {what}: {e} (line {}, column {})", e.line(), e.column()),
        )
    })
}

fn job_json(plane: &ControlPlane, spec: &JobSpec) -> Value {
    let status = plane.status(&spec.name).ok();
    json!({ "name": spec.name, "spec": spec, "status": status })
}

async fn page() -> Response {
    file("text/html; charset=utf-8", include_str!("page/index.html"))
}

fn file(content_type: &'static str, body: &'static str) -> Response {
    ([(axum::http::header::CONTENT_TYPE, content_type), (axum::http::header::CACHE_CONTROL, "no-cache")], body)
        .into_response()
}

async fn list(State(plane): State<ControlPlane>, uri: axum::http::Uri) -> Answer {
    let live = match uri.query().unwrap_or_default() {
        "" => false,
        "live=1" => true,
        other => {
            return Err(answer_error(StatusCode::BAD_REQUEST, format!("`{other}`: the only parameter is `live=1`")));
        }
    };
    let all = plane.list();
    // Each running job's own view (its last checkpoint), asked of all at
    // once, a second at most each.
    let mut asked = tokio::task::JoinSet::new();
    if live {
        for (i, (spec, status)) in all.iter().enumerate() {
            if status.phase == super::Phase::Running && spec.admin.is_some() {
                let spec = spec.clone();
                asked.spawn(async move {
                    let admin = spec.admin.clone().unwrap_or_default();
                    let answer = tokio::time::timeout(
                        std::time::Duration::from_secs(1),
                        super::admin_get(&admin, &spec, "/api/job"),
                    )
                    .await;
                    (i, answer.ok().and_then(Result::ok))
                });
            }
        }
    }
    let mut views = vec![Value::Null; all.len()];
    while let Some(done) = asked.join_next().await {
        if let Ok((i, Some(view))) = done
            && let Some(slot) = views.get_mut(i)
        {
            *slot = view;
        }
    }
    let jobs: Vec<Value> = all
        .iter()
        .zip(views)
        .map(|((spec, status), view)| json!({ "name": spec.name, "spec": spec, "status": status, "live": view }))
        .collect();
    ok(json!({ "jobs": jobs }))
}

async fn submit(State(plane): State<ControlPlane>, bytes: Bytes) -> Answer {
    let spec: JobSpec = body(&bytes, "a job's spec")?;
    plane.submit(spec.clone())?;
    Ok((StatusCode::CREATED, axum::Json(job_json(&plane, &spec))).into_response())
}

async fn show(State(plane): State<ControlPlane>, Path(name): Path<String>) -> Answer {
    let spec = plane.spec(&name)?;
    let events = plane.events(&name)?;
    let mut job = job_json(&plane, &spec);
    if let Some(map) = job.as_object_mut() {
        map.insert("events".into(), json!(events));
    }
    ok(job)
}

async fn update(State(plane): State<ControlPlane>, Path(name): Path<String>, bytes: Bytes) -> Answer {
    let spec: JobSpec = body(&bytes, "a job's spec")?;
    if spec.name != name {
        return Err(answer_error(
            StatusCode::BAD_REQUEST,
            format!("the spec names job `{}`, the path `{name}`", spec.name),
        ));
    }
    plane.update(spec.clone())?;
    ok(job_json(&plane, &spec))
}

async fn remove(State(plane): State<ControlPlane>, Path(name): Path<String>) -> Answer {
    plane.remove(&name)?;
    ok(json!({ "removed": name }))
}

async fn start(State(plane): State<ControlPlane>, Path(name): Path<String>) -> Answer {
    plane.start(&name)?;
    ok(json!({ "starting": name }))
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StopBody {
    #[serde(default)]
    savepoint: Option<String>,
}

async fn stop(State(plane): State<ControlPlane>, Path(name): Path<String>, bytes: Bytes) -> Answer {
    let request: StopBody = if bytes.is_empty() { StopBody::default() } else { body(&bytes, "a stop request")? };
    plane.stop(&name, request.savepoint).await?;
    ok(json!({ "stopping": name }))
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct UpgradeBody {
    #[serde(default)]
    savepoint: Option<String>,
    #[serde(default)]
    spec: Option<JobSpec>,
}

async fn upgrade(State(plane): State<ControlPlane>, Path(name): Path<String>, bytes: Bytes) -> Answer {
    let request: UpgradeBody =
        if bytes.is_empty() { UpgradeBody::default() } else { body(&bytes, "an upgrade request")? };
    plane.upgrade(&name, request.spec, request.savepoint).await?;
    ok(json!({ "upgrading": name }))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SavepointBody {
    name: String,
}

async fn savepoint(State(plane): State<ControlPlane>, Path(name): Path<String>, bytes: Bytes) -> Answer {
    let request: SavepointBody = body(&bytes, "a savepoint request ({\"name\": \"...\"})")?;
    let path = plane.savepoint(&name, &request.name).await?;
    Ok((StatusCode::CREATED, axum::Json(json!({ "job": name, "savepoint": request.name, "path": path })))
        .into_response())
}

async fn cancel(State(plane): State<ControlPlane>, Path(name): Path<String>) -> Answer {
    plane.cancel(&name)?;
    ok(json!({ "cancelling": name }))
}

async fn logs(State(plane): State<ControlPlane>, Path(name): Path<String>, uri: axum::http::Uri) -> Answer {
    let mut wanted = 100;
    for pair in uri.query().unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("lines", n)) => {
                wanted = n.parse::<usize>().map_err(|_| {
                    answer_error(StatusCode::BAD_REQUEST, format!("`lines={n}`: the number of lines is a count"))
                })?;
            }
            _ => return Err(answer_error(StatusCode::BAD_REQUEST, format!("`{pair}`: the only parameter is `lines`"))),
        }
    }
    let lines = plane.logs(&name, wanted.min(10_000))?;
    ok(json!({ "job": name, "lines": lines }))
}
