//! The admin API: an HTTP server embedded in the job's process
//! (`Job::with_admin`), to see a running job and steer it from outside
//! the binary: its status, plan, metrics and checkpoints as JSON; a
//! savepoint by name, a stop (with or without one), a cancel; liveness
//! and readiness probes for a container orchestrator.
//!
//! It binds loopback unless told otherwise; on any other address it
//! requires a bearer token (`Job::with_admin_token`), compared as a
//! SHA-256 digest in constant time, and every request without it or with
//! a wrong one gets 401 and changes nothing. The probes (`/healthz`,
//! `/readyz`) need no token: they reveal only whether the job runs; nor
//! does the dashboard's page (`/`, `/dashboard` and its script and
//! style), which holds no data and reads everything through the API with
//! the token. What a request must be to get through (its `Host`, its
//! origin, its body) is in [`gate`]; how the server keeps its sockets and
//! tasks bounded, in [`server`].

mod gate;
mod server;
#[cfg(feature = "admin-tls")]
mod tls;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};

use crate::checkpoint::history::History;
use crate::checkpoint::{CheckpointStorage, SavepointRequest};
use crate::error::{Error, Result};
use crate::metrics::Registry;
use crate::runtime::status::JobState;

/// How a job's (or a group's) admin API listens and whom it answers:
/// its address, its bearer token, the host names it answers for besides
/// its address and `localhost`, how many connections it keeps open, and
/// (feature `admin-tls`) its TLS certificate. [`Job::with_admin`] and
/// [`Job::with_admin_token`] set the first two; the rest needs
/// [`Job::with_admin_options`]. Needs the `admin` feature.
///
/// ```
/// let options = weibo::AdminOptions::new("0.0.0.0:8081")
///     .with_token("s3cr3t")
///     .with_allowed_host("jobs.example.com")
///     .with_max_connections(32);
/// let job = weibo::Job::new("orders").with_admin_options(options);
/// # drop(job);
/// ```
///
/// [`Job::with_admin`]: crate::Job::with_admin
/// [`Job::with_admin_token`]: crate::Job::with_admin_token
/// [`Job::with_admin_options`]: crate::Job::with_admin_options
#[derive(Clone)]
pub struct AdminOptions {
    addr: String,
    token: Option<String>,
    hosts: Vec<String>,
    max_connections: usize,
    #[cfg(feature = "admin-tls")]
    tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// Never shows the token.
impl std::fmt::Debug for AdminOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminOptions")
            .field("addr", &self.addr)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .field("hosts", &self.hosts)
            .field("max_connections", &self.max_connections)
            .finish_non_exhaustive()
    }
}

impl AdminOptions {
    /// The most connections open at once unless told otherwise.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 64;

    /// An admin API on `addr` (`127.0.0.1:8081`; port 0 for any free
    /// one), without a token: loopback only.
    pub fn new(addr: impl Into<String>) -> Self {
        Self {
            addr: addr.into(),
            token: None,
            hosts: Vec::new(),
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            #[cfg(feature = "admin-tls")]
            tls: None,
        }
    }

    /// The same options on another address.
    #[must_use]
    pub fn with_addr(mut self, addr: impl Into<String>) -> Self {
        self.addr = addr.into();
        self
    }

    /// The bearer token every request but the probes and the dashboard's
    /// files must carry (`Authorization: Bearer <token>`): required to
    /// bind anything but loopback.
    #[must_use]
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// A host name the API answers for (in the requests' `Host` header,
    /// and as the origin of the pages that may change things without the
    /// token), besides the address it is bound to and `localhost`: the
    /// name a reverse proxy forwards, or the machine's DNS name. Any other
    /// name gets 421, so that a page whose name an attacker pointed at
    /// this address (DNS rebinding) cannot use the API.
    #[must_use]
    pub fn with_allowed_host(mut self, name: impl Into<String>) -> Self {
        let name: String = name.into();
        // A port given with the name is not part of it.
        self.hosts.push(gate::host_name(&name).to_ascii_lowercase());
        self
    }

    /// The most connections open at once (64 unless set; at least 1).
    /// One more takes the place of the connection that has waited longest
    /// without a request; when all have a request in progress, it is
    /// answered 503.
    #[must_use]
    pub fn with_max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Serves HTTPS with the certificate chain and private key in these
    /// PEM files (read when the job starts). Needs the `admin-tls`
    /// feature.
    #[cfg(feature = "admin-tls")]
    #[must_use]
    pub fn with_tls(mut self, certificate: impl Into<std::path::PathBuf>, key: impl Into<std::path::PathBuf>) -> Self {
        self.tls = Some((certificate.into(), key.into()));
        self
    }
}

/// Routes of one's own, served as a job's admin API is: from a thread of
/// its own, loopback unless given a token (then every request but
/// `/healthz`, `/readyz`, `/` and the `/dashboard/` files needs it as a
/// bearer token), the same checks of `Host` and `Origin` (a page of
/// another site cannot change anything), the same caps on connections,
/// heads, bodies and request rates. What `weibo serve` (the control
/// plane of `weibo-connectors`) serves its API with. Stops when dropped.
/// Needs the `admin` feature.
///
/// ```
/// # weibo::testing::block_on(async {
/// let routes = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
/// let service = weibo::AdminService::serve("tools", &weibo::AdminOptions::new("127.0.0.1:0"), routes)?;
/// assert!(service.local_addr().ip().is_loopback());
/// # Ok::<(), weibo::Error>(())
/// # })?;
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Debug)]
pub struct AdminService {
    local_addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
}

impl AdminService {
    /// Binds `options`' address and serves `routes` there as `name`.
    ///
    /// # Errors
    /// [`Error::Refused`] as for a job's admin API: an address that does
    /// not parse, a non-loopback one without a token, one that cannot be
    /// bound, a TLS certificate or key that cannot be read.
    pub fn serve(name: &str, options: &AdminOptions, routes: Router) -> Result<Self> {
        let (local_addr, shutdown) = serve(name, options, routes, gate::Layout::Job)?;
        let token = options.token.as_deref().is_some_and(|t| !t.is_empty());
        tracing::info!(service = name, %local_addr, token, "admin service listening{}",
            if token { " (requests need the bearer token)" } else { "" });
        Ok(Self { local_addr, shutdown: Some(shutdown) })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for AdminService {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// What the admin API can do to a running job: filled in once the job
/// has started (before, only the status and the plan are known).
pub(crate) struct Control {
    pub(crate) registry: Registry,
    pub(crate) requests: Option<mpsc::UnboundedSender<SavepointRequest>>,
    pub(crate) completed: Arc<AtomicU64>,
    pub(crate) cancel: Arc<Mutex<Option<oneshot::Sender<()>>>>,
    pub(crate) history: Arc<History>,
    pub(crate) storage: Option<Arc<dyn CheckpointStorage>>,
}

/// The admin API's view of its job.
pub(crate) struct Admin {
    job: String,
    started: Instant,
    status: watch::Receiver<JobState>,
    plan: Value,
    control: OnceLock<Control>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Admin({})", self.job)
    }
}

/// A running admin server: shuts down when dropped (it stops accepting,
/// closes its idle connections, and gives requests in progress a second). For a job in an
/// [`AdminGroup`], its place in the group: dropped, the job leaves it.
#[derive(Debug)]
pub(crate) struct AdminServer {
    pub(crate) admin: Arc<Admin>,
    pub(crate) local_addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    group: Option<AdminGroup>,
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(group) = &self.group {
            let mut jobs = group.state.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // Only this job's entry: a job of the same name may have
            // joined since (a partition's task restarted).
            if jobs.get(&self.admin.job).is_some_and(|a| Arc::ptr_eq(a, &self.admin)) {
                jobs.remove(&self.admin.job);
            }
        }
    }
}

/// Binds `options.addr` for the admin API of `job` (refusing a
/// non-loopback address without a token) and starts serving `app` on it
/// from a thread of its own: the server's address and the sender that
/// stops it.
fn serve(
    job: &str,
    options: &AdminOptions,
    app: Router,
    layout: gate::Layout,
) -> Result<(SocketAddr, oneshot::Sender<()>)> {
    let refused = |message: String| Error::Refused { job: job.to_string(), message };
    let addr_text = &options.addr;
    let addr: SocketAddr = addr_text
        .parse()
        .map_err(|e| refused(format!("the admin API's address `{addr_text}` is not an address and port: {e}")))?;
    let token = options.token.as_deref().filter(|t| !t.is_empty());
    if !addr.ip().is_loopback() && token.is_none() {
        return Err(refused(format!(
            "the admin API would listen on {addr}, which is not loopback, without a token: set one \
             (`Job::with_admin_token`, `AdminOptions::with_token`, `KafkaGroup::with_admin_token`), or bind 127.0.0.1"
        )));
    }
    #[cfg(feature = "admin-tls")]
    let tls = match &options.tls {
        Some((certificate, key)) => Some(tls::acceptor(certificate, key).map_err(refused)?),
        None => None,
    };
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| refused(format!("the admin API cannot listen on {addr}: {e}")))?;
    let local_addr = listener.local_addr().map_err(|e| refused(format!("the admin API's address: {e}")))?;
    let gate = gate::Gate { token: token.map(gate::digest), bound: local_addr, hosts: options.hosts.clone(), layout };
    let serving = server::Serving {
        app,
        requests: Mutex::new(server::Pace::new(server::REQUESTS_PER_SECOND)),
        gate: Arc::new(gate),
        max_connections: options.max_connections,
        #[cfg(feature = "admin-tls")]
        tls,
    };
    let shutdown = server::spawn(job, listener, serving)
        .map_err(|e| refused(format!("the admin API's thread cannot start: {e}")))?;
    Ok((local_addr, shutdown))
}

impl Admin {
    fn new(job: &str, status: watch::Receiver<JobState>, plan: Value) -> Arc<Self> {
        Arc::new(Self { job: job.to_string(), started: Instant::now(), status, plan, control: OnceLock::new() })
    }
}

/// Binds `options.addr` (refusing a non-loopback address without a
/// token) and serves the admin API of job `job` from a thread of its own.
///
/// # Errors
/// [`Error::Refused`] for an address that does not parse, a non-loopback
/// one without a token, one that cannot be bound, or a TLS certificate
/// or key that cannot be read.
pub(crate) fn start(
    job: &str,
    options: &AdminOptions,
    status: watch::Receiver<JobState>,
    plan: Value,
) -> Result<AdminServer> {
    let admin = Admin::new(job, status, plan);
    let (local_addr, shutdown) = serve(job, options, router(admin.clone()), gate::Layout::Job)?;
    let token = options.token.as_deref().is_some_and(|t| !t.is_empty());
    tracing::info!(job, %local_addr, token, "admin API listening{}",
        if token { " (requests need the bearer token)" } else { "" });
    Ok(AdminServer { admin, local_addr, shutdown: Some(shutdown), group: None })
}

/// Adds job `job` to `group`'s admin API, under `/jobs/<job>/`, until the
/// returned server is dropped.
///
/// # Errors
/// [`Error::Refused`] when the group already has a job of that name.
pub(crate) fn join(
    group: &AdminGroup,
    job: &str,
    status: watch::Receiver<JobState>,
    plan: Value,
) -> Result<AdminServer> {
    let admin = Admin::new(job, status, plan);
    {
        let mut jobs = group.state.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // A job of the same name that has ended (a partition's task
        // before it restarted) gives way; one still running does not.
        if jobs.get(job).is_some_and(|a| !a.state().has_ended()) {
            return Err(Error::Refused {
                job: job.to_string(),
                message: format!("the admin group `{}` already has a job named `{job}`", group.state.name),
            });
        }
        jobs.insert(job.to_string(), admin.clone());
    }
    Ok(AdminServer { admin, local_addr: group.server.local_addr, shutdown: None, group: Some(group.clone()) })
}

/// One admin API for several jobs in one process (the tasks of a
/// `KafkaGroup`, say): each job's endpoints and dashboard under
/// `/jobs/<job>/`, and for all of them `/healthz`, `/readyz` (ready when
/// every job is), `/api/jobs`, `/metrics` (every job's families, told
/// apart by their `job` label) and a page listing the jobs at `/`. A job
/// joins with [`Job::with_admin_group`](crate::Job::with_admin_group) and
/// leaves when its handle is dropped; the server stops when the group and
/// every job's handle are gone. Needs the `admin` feature.
///
/// ```
/// # weibo::testing::block_on(async {
/// let group = weibo::AdminGroup::serve("tasks", "127.0.0.1:0", None)?;
/// let job = weibo::Job::new("task-0").with_admin_group(&group);
/// job.source(weibo::sources::IterSource::new(0..3u32)).sink(weibo::sinks::Blackhole::new());
/// let handle = job.spawn()?;
/// assert_eq!(handle.admin_addr(), Some(group.local_addr()));
/// assert_eq!(group.jobs(), ["task-0"]);
/// # Ok::<(), weibo::Error>(())
/// # })?;
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct AdminGroup {
    state: Arc<GroupState>,
    server: Arc<GroupServer>,
}

/// What the group's server reads: its jobs.
struct GroupState {
    name: String,
    jobs: Mutex<std::collections::BTreeMap<String, Arc<Admin>>>,
    /// Whether the jobs' owner starts and stops them (a `KafkaGroup`):
    /// stop and cancel through the API are refused.
    keeps_lifecycle: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for GroupState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupState").field("name", &self.name).finish_non_exhaustive()
    }
}

/// The group's server: stops when the last handle on it is dropped.
#[derive(Debug)]
struct GroupServer {
    local_addr: SocketAddr,
    shutdown: Mutex<Option<oneshot::Sender<()>>>,
}

impl Drop for GroupServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
            let _ = tx.send(());
        }
    }
}

impl AdminGroup {
    /// Binds `addr` and serves the group `name`'s admin API from a
    /// thread of its own: loopback by default; any other address needs a
    /// `token` (every request but the probes and the pages must then carry
    /// it as a bearer token). [`AdminGroup::serve_with`] takes the other
    /// options.
    ///
    /// # Errors
    /// [`Error::Refused`] for an address that does not parse, a
    /// non-loopback one without a token, or one that cannot be bound.
    pub fn serve(name: &str, addr: &str, token: Option<&str>) -> Result<Self> {
        let mut options = AdminOptions::new(addr);
        options.token = token.map(str::to_string);
        Self::serve_with(name, &options)
    }

    /// Binds `options.addr` and serves the group `name`'s admin API as
    /// `options` say, from a thread of its own.
    ///
    /// # Errors
    /// [`Error::Refused`] for an address that does not parse, a
    /// non-loopback one without a token, one that cannot be bound, or a TLS
    /// certificate or key that cannot be read.
    pub fn serve_with(name: &str, options: &AdminOptions) -> Result<Self> {
        let state = Arc::new(GroupState {
            name: name.to_string(),
            jobs: Mutex::new(std::collections::BTreeMap::new()),
            keeps_lifecycle: std::sync::atomic::AtomicBool::new(false),
        });
        let (local_addr, shutdown) = serve(name, options, group_router(state.clone()), gate::Layout::Group)?;
        let token = options.token.as_deref().is_some_and(|t| !t.is_empty());
        tracing::info!(group = name, %local_addr, token, "admin API of a group of jobs listening{}",
            if token { " (requests need the bearer token)" } else { "" });
        Ok(Self { state, server: Arc::new(GroupServer { local_addr, shutdown: Mutex::new(Some(shutdown)) }) })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr
    }

    /// Refuses `POST /jobs/<job>/api/stop` and `/api/cancel` from now on
    /// (409): for jobs whose owner starts and stops them, as a `KafkaGroup`
    /// does with its tasks (a task stopped from outside would leave its
    /// partition unread until the next rebalance).
    pub fn refuse_stop_and_cancel(&self) {
        self.state.keeps_lifecycle.store(true, Ordering::Relaxed);
    }

    /// The names of the jobs in it now.
    pub fn jobs(&self) -> Vec<String> {
        self.state.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).keys().cloned().collect()
    }
}

impl Admin {
    /// Gives the admin API the running job's controls.
    pub(crate) fn attach(&self, control: Control) {
        let _ = self.control.set(control);
    }
}

fn router(admin: Arc<Admin>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/api/job", get(job_status))
        .route("/api/plan", get(plan))
        .route("/api/metrics", get(metrics))
        .route("/api/checkpoints", get(checkpoints))
        .route("/api/savepoints", get(savepoints).post(take_savepoint))
        .route("/api/stop", post(stop))
        .route("/api/cancel", post(cancel))
        .route("/metrics", get(prometheus))
        .route("/", get(dashboard_page))
        .route("/dashboard", get(dashboard_page))
        .route("/dashboard/app.js", get(dashboard_script))
        .route("/dashboard/style.css", get(dashboard_style))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(admin)
}

fn group_router(state: Arc<GroupState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(group_readyz))
        .route("/api/jobs", get(group_jobs))
        .route("/metrics", get(group_prometheus))
        .route("/", get(group_page))
        .route("/dashboard", get(group_page))
        .route("/dashboard/group.js", get(group_script))
        .route("/dashboard/style.css", get(dashboard_style))
        .route("/jobs/{job}", axum::routing::any(group_job_root))
        .route("/jobs/{job}/", axum::routing::any(group_job))
        .route("/jobs/{job}/{*rest}", axum::routing::any(group_job))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

impl GroupState {
    fn job(&self, name: &str) -> Option<Arc<Admin>> {
        self.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(name).cloned()
    }

    fn all(&self) -> Vec<Arc<Admin>> {
        self.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values().cloned().collect()
    }
}

/// Ready when every job of the group is (a group without jobs, waiting for
/// partitions, is ready); says each job's state.
async fn group_readyz(State(group): State<Arc<GroupState>>) -> Response {
    let jobs = group.all();
    let ready = jobs.iter().all(|a| a.ready());
    let states: serde_json::Map<String, Value> = jobs.iter().map(|a| (a.job.clone(), a.state_name())).collect();
    readiness(ready, json!({ "ready": ready, "jobs": states }))
}

/// 200 with `body` when ready, 503 otherwise.
fn readiness(ready: bool, body: Value) -> Response {
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(body)).into_response()
}

async fn group_jobs(State(group): State<Arc<GroupState>>) -> Answer {
    let jobs: Vec<Value> = group
        .all()
        .iter()
        .map(|a| {
            json!({
                "job": a.job,
                "status": a.state(),
                "uptime_ms": u64::try_from(a.started.elapsed().as_millis()).unwrap_or(u64::MAX),
                "api": format!("jobs/{}/api/job", encode_segment(&a.job)),
                "dashboard": format!("jobs/{}/dashboard", encode_segment(&a.job)),
            })
        })
        .collect();
    ok(json!({ "group": group.name, "jobs": jobs }))
}

/// Every job's families in one exposition: a family's samples from all
/// jobs together, under one `# TYPE` line.
async fn group_prometheus(State(group): State<Arc<GroupState>>) -> Answer {
    let mut merged: Vec<crate::metrics::prometheus::Family> = Vec::new();
    for admin in group.all() {
        let Some(families) = admin.families() else { continue };
        for family in families {
            match merged.iter_mut().find(|f| f.name == family.name) {
                Some(f) => f.samples.extend(family.samples),
                None => merged.push(family),
            }
        }
    }
    Ok(exposition(&merged))
}

/// `/jobs/<job>`: on to `/jobs/<job>/`, so that the dashboard's relative
/// links resolve under the job.
async fn group_job_root(uri: axum::http::Uri) -> Response {
    let to = match uri.query() {
        Some(q) => format!("{}/?{q}", uri.path()),
        None => format!("{}/", uri.path()),
    };
    (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, to)]).into_response()
}

async fn group_job(
    State(group): State<Arc<GroupState>>,
    params: std::result::Result<
        axum::extract::Path<std::collections::HashMap<String, String>>,
        axum::extract::rejection::PathRejection,
    >,
    request: axum::extract::Request,
) -> Response {
    // A path that does not decode (`%a0`): the API's own 400, in JSON.
    let params = match params {
        Ok(axum::extract::Path(params)) => params,
        Err(e) => return ApiError(StatusCode::BAD_REQUEST, format!("a path that is not one: {e}")).into_response(),
    };
    let job = params.get("job").cloned().unwrap_or_default();
    dispatch(&group, &job, request).await
}

/// The path of `uri` after `/jobs/<segment>`, as received (still
/// percent-encoded), with its query.
fn rest_of(uri: &axum::http::Uri) -> String {
    let path = uri.path();
    let after = path.strip_prefix("/jobs/").unwrap_or_default();
    let rest = after.find('/').map_or("/", |at| after.get(at..).unwrap_or("/"));
    match uri.query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_string(),
    }
}

/// A path segment with everything but unreserved characters
/// percent-encoded (for links to a job by name).
fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Answers `request` for `/jobs/<job>/<rest>` as job `job`'s own admin API
/// answers `/<rest>` (the gate has checked the group's token: anything
/// but the job's pages and probes needs it before the job is even looked
/// up, so names cannot be probed without it); a group that runs its
/// jobs' lifecycle itself (a `KafkaGroup`) refuses to stop or cancel one
/// of them.
async fn dispatch(group: &GroupState, job: &str, mut request: axum::extract::Request) -> Response {
    use tower::ServiceExt as _;
    let rest = rest_of(request.uri());
    let path = rest.split('?').next().unwrap_or_default();
    let Some(admin) = group.job(job) else {
        return ApiError(StatusCode::NOT_FOUND, format!("the group has no job `{job}`: see /api/jobs")).into_response();
    };
    if group.keeps_lifecycle.load(Ordering::Relaxed) && matches!(path, "/api/stop" | "/api/cancel") {
        return ApiError(
            StatusCode::CONFLICT,
            format!(
                "`{job}` is one of the group `{}`'s tasks: the group starts and stops them (stop the group, or let a \
                 rebalance move the partition)",
                group.name
            ),
        )
        .into_response();
    }
    match rest.parse::<axum::http::Uri>() {
        Ok(uri) => *request.uri_mut() = uri,
        Err(e) => return ApiError(StatusCode::BAD_REQUEST, format!("a path that is not one: {e}")).into_response(),
    }
    match router(admin).oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// The group's page: its jobs, each with a link to its dashboard.
const GROUP_PAGE: &str = include_str!("dashboard/group.html");
const GROUP_SCRIPT: &str = include_str!("dashboard/group.js");

async fn group_page() -> Response {
    dashboard_file("text/html; charset=utf-8", GROUP_PAGE)
}

async fn group_script() -> Response {
    dashboard_file("text/javascript; charset=utf-8", GROUP_SCRIPT)
}

/// An error as the API answers it: a status and `{"error": ...}`.
#[derive(Debug)]
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": self.1, "status": self.0.as_u16() });
        let mut response = (self.0, axum::Json(body)).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

type Answer = std::result::Result<Response, ApiError>;

fn ok(value: Value) -> Answer {
    Ok(axum::Json(value).into_response())
}

impl Admin {
    fn control(&self) -> std::result::Result<&Control, ApiError> {
        self.control.get().ok_or_else(|| ApiError(StatusCode::SERVICE_UNAVAILABLE, "the job is still starting".into()))
    }

    fn state(&self) -> JobState {
        self.status.borrow().clone()
    }

    /// The state's name alone (`running`, `failed`, ...): what the probes
    /// say without the token.
    fn state_name(&self) -> Value {
        serde_json::to_value(self.state()).ok().and_then(|v| v.get("state").cloned()).unwrap_or(Value::Null)
    }

    /// Restored, processing, and its controls attached.
    fn ready(&self) -> bool {
        self.state() == JobState::Running && self.control.get().is_some()
    }

    /// The job's instrument families now, once it has started.
    fn families(&self) -> Option<Vec<crate::metrics::prometheus::Family>> {
        let control = self.control.get()?;
        let totals = control.requests.is_some().then(|| control.history.totals());
        Some(crate::metrics::prometheus::families(
            &self.job,
            &control.registry.snapshot(),
            totals.as_ref(),
            self.started.elapsed().as_secs_f64(),
        ))
    }
}

async fn not_found() -> ApiError {
    ApiError(StatusCode::NOT_FOUND, "no such endpoint: see the book's \"Operating a job\" chapter".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError(StatusCode::METHOD_NOT_ALLOWED, "the endpoint does not take this method".into())
}

/// The dashboard: a page, its script and its style, embedded in the
/// binary (no build step, nothing fetched from elsewhere).
const DASHBOARD_PAGE: &str = include_str!("dashboard/index.html");
const DASHBOARD_SCRIPT: &str = include_str!("dashboard/app.js");
const DASHBOARD_STYLE: &str = include_str!("dashboard/style.css");

/// Serves one of the dashboard's files, with a policy that lets the page
/// load only its own script and style and talk only to this server.
fn dashboard_file(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src data:; frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn dashboard_page() -> Response {
    dashboard_file("text/html; charset=utf-8", DASHBOARD_PAGE)
}

async fn dashboard_script() -> Response {
    dashboard_file("text/javascript; charset=utf-8", DASHBOARD_SCRIPT)
}

async fn dashboard_style() -> Response {
    dashboard_file("text/css; charset=utf-8", DASHBOARD_STYLE)
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready: restored, processing, and the API's controls attached. Says
/// only the state's name (an error's text needs the token: `/api/job`).
async fn readyz(State(admin): State<Arc<Admin>>) -> Response {
    let ready = admin.ready();
    readiness(ready, json!({ "ready": ready, "state": admin.state_name() }))
}

async fn job_status(State(admin): State<Arc<Admin>>) -> Answer {
    let last = admin.control.get().map(|c| c.completed.load(Ordering::Relaxed)).filter(|n| *n > 0);
    ok(json!({
        "job": admin.job,
        "status": admin.state(),
        "uptime_ms": u64::try_from(admin.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "last_checkpoint": last,
        "checkpoints": admin.control.get().is_some_and(|c| c.requests.is_some()),
    }))
}

async fn plan(State(admin): State<Arc<Admin>>) -> Answer {
    ok(admin.plan.clone())
}

async fn metrics(State(admin): State<Arc<Admin>>) -> Answer {
    let snapshot = admin.control()?.registry.snapshot();
    ok(serde_json::to_value(&snapshot).map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?)
}

async fn checkpoints(State(admin): State<Arc<Admin>>) -> Answer {
    let history = &admin.control()?.history;
    let state: Vec<Value> = history
        .totals()
        .state
        .into_iter()
        .map(|(operator, bytes, files)| json!({ "operator": operator, "bytes": bytes, "files": files }))
        .collect();
    ok(json!({ "checkpoints": history.records(), "state": state }))
}

async fn savepoints(State(admin): State<Arc<Admin>>) -> Answer {
    let control = admin.control()?;
    let Some(storage) = control.storage.clone() else {
        return Err(no_checkpoints());
    };
    // Off the server's one thread: listing an object store takes a while.
    let listing = storage.clone();
    let names = tokio::task::spawn_blocking(move || crate::checkpoint::savepoints_in(&*listing))
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("listing the savepoints: {e}")))?
        .map_err(job_error)?;
    let found: Vec<Value> = names
        .into_iter()
        .map(|name| {
            let path = storage.locate(&format!("savepoints/{name}"));
            json!({ "name": name, "path": path })
        })
        .collect();
    ok(json!({ "savepoints": found }))
}

/// The job's metrics in Prometheus' text format (behind the token, which a
/// scrape config gives as `authorization: { credentials: ... }`).
async fn prometheus(State(admin): State<Arc<Admin>>) -> Answer {
    admin.control()?; // 503 while the job is still starting
    Ok(exposition(&admin.families().unwrap_or_default()))
}

/// `families` in Prometheus' text format, as a response.
fn exposition(families: &[crate::metrics::prometheus::Family]) -> Response {
    let text = crate::metrics::prometheus::prometheus_text(families);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

fn no_checkpoints() -> ApiError {
    ApiError(
        StatusCode::CONFLICT,
        "the job takes no checkpoints (`Job::with_checkpoints`): it has no savepoints".into(),
    )
}

/// Why a savepoint name is refused, if it is.
fn bad_name(name: &str) -> Option<ApiError> {
    let valid = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    (!valid).then(|| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("`{name}` is not a savepoint name: use up to 128 letters, digits, `-`, `_` and `.` (not first)"),
        )
    })
}

/// The API's answer to a job's error.
fn job_error(e: Error) -> ApiError {
    let status = match &e {
        Error::Refused { .. } => StatusCode::CONFLICT,
        Error::Checkpoint { message, .. } if message == crate::checkpoint::SAVEPOINT_EXISTS => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError(status, e.report().to_string())
}

/// Asks the job for a checkpoint now, or a savepoint named `name`.
async fn request(control: &Control, name: Option<String>) -> std::result::Result<std::path::PathBuf, ApiError> {
    let Some(tx) = &control.requests else { return Err(no_checkpoints()) };
    let (reply, answer) = oneshot::channel();
    let gone = || ApiError(StatusCode::CONFLICT, "the job has stopped taking checkpoints".into());
    tx.send(SavepointRequest { name, reply }).map_err(|_| gone())?;
    answer.await.map_err(|_| gone())?.map_err(job_error)
}

async fn take_savepoint(State(admin): State<Arc<Admin>>, bytes: Bytes) -> Answer {
    let [name] = gate::object(&bytes, &[("name", gate::Field::Text)])?;
    let name = name.unwrap_or_default();
    if let Some(e) = bad_name(&name) {
        return Err(e);
    }
    let control = admin.control()?;
    let path = request(control, Some(name.clone())).await?;
    tracing::info!(job = %admin.job, savepoint = %name, path = %path.display(), "savepoint taken through the admin API");
    Ok((StatusCode::CREATED, axum::Json(json!({ "name": name, "path": path }))).into_response())
}

/// Stops the job: with a savepoint first if the body names one, else
/// with a last checkpoint (if the job takes checkpoints); then cancels it
/// and waits for it to end.
async fn stop(State(admin): State<Arc<Admin>>, bytes: Bytes) -> Answer {
    let [savepoint] = gate::object(&bytes, &[("savepoint", gate::Field::MaybeText)])?;
    if let Some(e) = savepoint.as_deref().and_then(bad_name) {
        return Err(e);
    }
    let control = admin.control()?;
    if admin.state().has_ended() {
        return Err(ApiError(StatusCode::CONFLICT, "the job has already ended".into()));
    }
    let path = match (&savepoint, &control.requests) {
        (Some(_), None) => return Err(no_checkpoints()),
        (Some(name), Some(_)) => Some(request(control, Some(name.clone())).await?),
        (None, Some(_)) => match request(control, None).await {
            Ok(p) => Some(p),
            // Every source has ended: the job is finishing with its final
            // checkpoint; cancelling would lose it. Wait for the end.
            Err(e) if e.1.contains(crate::checkpoint::ALL_SOURCES_ENDED) => {
                let state = ended(&admin).await;
                return ok(json!({ "stopped": true, "checkpoint": null, "status": state }));
            }
            Err(e) => {
                tracing::warn!(job = %admin.job, error = %e.1, "no last checkpoint before stopping");
                None
            }
        },
        (None, None) => None,
    };
    let state = end(&admin, control).await;
    tracing::info!(job = %admin.job, "stopped through the admin API");
    ok(json!({ "stopped": true, "checkpoint": path, "status": state }))
}

async fn cancel(State(admin): State<Arc<Admin>>, bytes: Bytes) -> Answer {
    gate::object(&bytes, &[])?;
    let control = admin.control()?;
    if admin.state().has_ended() {
        return Err(ApiError(StatusCode::CONFLICT, "the job has already ended".into()));
    }
    let state = end(&admin, control).await;
    tracing::info!(job = %admin.job, "cancelled through the admin API");
    ok(json!({ "cancelled": true, "status": state }))
}

/// Cancels the job and waits until it has ended.
async fn end(admin: &Admin, control: &Control) -> JobState {
    if let Some(tx) = control.cancel.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
        let _ = tx.send(());
    }
    ended(admin).await
}

/// Waits for the job to end.
async fn ended(admin: &Admin) -> JobState {
    let mut status = admin.status.clone();
    let _ = status.wait_for(JobState::has_ended).await;
    admin.state()
}
