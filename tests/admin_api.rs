//! The admin API over real HTTP: every endpoint of a running job, a
//! savepoint taken through it and restored, a stop with a savepoint,
//! bad names (400), a job without checkpoints (409), a failed job's
//! readiness, and the bearer token (401 without it or with a wrong one,
//! and nothing changes).

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use weibo::sinks::CollectSink;
use weibo::sources::Generator;
use weibo::time::WatermarkStrategy;
use weibo::{Job, JobState};
use weibo_tests::http;

async fn json(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> (u16, Value) {
    let (status, text) = http(addr, method, path, token, body).await;
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}")))
}

/// Running totals per key, on two workers, at `rate` events a second.
fn totals(job: &Job, rate: f64, out: &CollectSink<(u64, u64)>) {
    job.source(Generator::new(1_000_000, |i| (i % 10, 1u64)).with_rate(rate))
        .name("events")
        .key_by(|e: &(u64, u64)| e.0)
        .with_partitions(2)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .uid("totals")
        .sink(out.clone());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_of_a_running_job_and_a_savepoint_taken_through_it_restores() {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("admin").with_checkpoints(dir.path(), Duration::from_secs(3600)).with_admin("127.0.0.1:0");
    let out = CollectSink::new();
    totals(&job, 20_000.0, &out);
    let handle = job.spawn().unwrap();
    let addr = handle.admin_addr().unwrap();

    assert_eq!(http(addr, "GET", "/healthz", None, None).await, (200, "ok\n".to_string()));
    let (status, ready) = json(addr, "GET", "/readyz", None, None).await;
    assert_eq!((status, &ready["ready"]), (200, &Value::Bool(true)), "{ready}");
    let (status, job) = json(addr, "GET", "/api/job", None, None).await;
    assert_eq!(status, 200);
    assert_eq!((job["job"].as_str(), job["status"]["state"].as_str()), (Some("admin"), Some("running")), "{job}");
    assert_eq!(job["checkpoints"], Value::Bool(true));

    let (status, plan) = json(addr, "GET", "/api/plan", None, None).await;
    assert_eq!(status, 200);
    let nodes = plan["nodes"].as_array().unwrap();
    let reduce = nodes.iter().find(|n| n["id"] == "totals").unwrap();
    assert_eq!((reduce["kind"].as_str(), reduce["parallelism"].as_u64()), (Some("reduce"), Some(2)), "{plan}");
    assert_eq!(reduce["stateful"], Value::Bool(true));
    assert_eq!(reduce["inputs"][0]["edge"], "hash");

    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, metrics) = json(addr, "GET", "/api/metrics", None, None).await;
    assert_eq!(status, 200);
    let events = metrics["operators"].as_array().unwrap().iter().find(|o| o["name"] == "events").unwrap();
    let read = events["records_out"].as_u64().unwrap();
    assert!(read > 0 && read <= handle.metrics().operator("events").unwrap().records_out, "{metrics}");
    assert!(metrics["edges"].as_array().is_some_and(|e| !e.is_empty()));

    let (status, history) = json(addr, "GET", "/api/checkpoints", None, None).await;
    assert_eq!((status, history["checkpoints"].as_array().map(Vec::len)), (200, Some(0)));
    let (status, listed) = json(addr, "GET", "/api/savepoints", None, None).await;
    assert_eq!((status, listed["savepoints"].as_array().map(Vec::len)), (200, Some(0)));

    // A savepoint by name; the same name again is a conflict; a bad name a bad request.
    let (status, taken) = json(addr, "POST", "/api/savepoints", None, Some(r#"{"name": "via-api"}"#)).await;
    assert_eq!(status, 201, "{taken}");
    let path = std::path::PathBuf::from(taken["path"].as_str().unwrap());
    assert!(path.join("MANIFEST").is_file());
    let (status, again) = json(addr, "POST", "/api/savepoints", None, Some(r#"{"name": "via-api"}"#)).await;
    assert_eq!(status, 409, "{again}");
    for bad in [r#"{"name": "../escape"}"#, r#"{"name": ""}"#, r#"{"nom": "x"}"#, "not json"] {
        let (status, err) = json(addr, "POST", "/api/savepoints", None, Some(bad)).await;
        assert_eq!(status, 400, "{bad}: {err}");
        assert!(err["error"].is_string());
    }
    let (_, listed) = json(addr, "GET", "/api/savepoints", None, None).await;
    assert_eq!(listed["savepoints"][0]["name"], "via-api", "{listed}");
    let (_, history) = json(addr, "GET", "/api/checkpoints", None, None).await;
    let records = history["checkpoints"].as_array().unwrap();
    let first = &records[0];
    assert_eq!(
        (first["kind"].as_str(), first["outcome"].as_str()),
        (Some("savepoint"), Some("completed")),
        "{history}"
    );
    assert!(first["bytes"].as_u64().unwrap() > 0 && first["duration_ms"].as_f64().unwrap() > 0.0, "{first}");
    assert_eq!(handle.checkpoint_history()[0].id, first["id"].as_u64().unwrap());
    // The savepoint's state, per operator; its alignment; per-instance counts.
    assert_eq!(history["state"][0]["operator"], "totals", "{history}");
    assert!(history["state"][0]["bytes"].as_u64().unwrap() > 0, "{history}");
    let (_, metrics) = json(addr, "GET", "/api/metrics", None, None).await;
    let reduce = metrics["operators"].as_array().unwrap().iter().find(|o| o["name"] == "reduce").unwrap();
    let busy: f64 = metrics["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["operators"][0] == "reduce")
        .map(|t| t["busy_ms"].as_f64().unwrap())
        .sum();
    assert!(busy > 0.0, "the reduce's tasks spent time on batches: {metrics}");
    let instances = reduce["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 2, "{reduce}");
    let summed: u64 = instances.iter().map(|i| i["records_in"].as_u64().unwrap()).sum();
    assert_eq!(summed, reduce["records_in"].as_u64().unwrap());
    assert!(
        instances.iter().all(|i| i["records_in"].as_u64().unwrap() > 0),
        "keys 0..10 reach both instances: {reduce}"
    );
    // The reduce's state: its ten keys in memory, over its two instances.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = handle.metrics();
        let value = m.operator("reduce").and_then(|o| o.state.iter().find(|s| s.state == "value").cloned());
        if let Some(v) = value.filter(|v| v.memory_entries == 10) {
            assert!(v.memory_bytes >= 10 * 16 && v.table_entries.is_none(), "{v:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the state's size: {:?}", m.operator("reduce"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = handle.prometheus_metrics();
    assert!(text.contains(r#"weibo_state_memory_entries{job="admin",operator="reduce",state="value"} 10"#), "{text}");
    assert!(text.contains(r#"weibo_checkpoint_started_total{job="admin"} 1"#), "{text}");
    assert!(text.contains(r#"weibo_operator_instance_records_in_total{job="admin",operator="reduce",instance="1"}"#));

    let (status, _) = json(addr, "GET", "/api/nothing", None, None).await;
    assert_eq!(status, 404);

    // Stop with a savepoint: the job ends, and the savepoint restores.
    let (status, stopped) = json(addr, "POST", "/api/stop", None, Some(r#"{"savepoint": "last"}"#)).await;
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(stopped["status"]["state"], "stopped");
    assert_eq!(handle.status(), JobState::Stopped);
    let (status, _) = json(addr, "GET", "/readyz", None, None).await;
    assert_eq!(status, 503, "not ready once stopped");
    let (status, _) = json(addr, "POST", "/api/cancel", None, None).await;
    assert_eq!(status, 409, "already ended");
    let last = std::path::PathBuf::from(stopped["checkpoint"].as_str().unwrap());
    handle.cancel().await.unwrap();
    let before = out.values().iter().map(|(_, n)| *n).max().unwrap();

    // The savepoint taken through the API restores: totals go on from it.
    let restored = Job::new("admin").restore_from(&last);
    let after = CollectSink::new();
    totals(&restored, 20_000.0, &after);
    let handle = restored.spawn().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    handle.cancel().await.unwrap();
    let resumed = after.values().iter().map(|(_, n)| *n).min().unwrap();
    assert!(resumed > 1 && resumed <= before + 1, "totals resume from the savepoint: {resumed} after {before}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_without_checkpoints_has_no_savepoints_and_a_failed_job_is_not_ready() {
    let job = Job::new("plain").with_admin("127.0.0.1:0");
    job.source(Generator::new(u64::MAX, |i| i).with_rate(1_000.0)).sink(CollectSink::new());
    let handle = job.spawn().unwrap();
    let addr = handle.admin_addr().unwrap();
    let (status, err) = json(addr, "POST", "/api/savepoints", None, Some(r#"{"name": "x"}"#)).await;
    assert_eq!(status, 409, "{err}");
    assert!(err["error"].as_str().unwrap().contains("no checkpoints"), "{err}");
    let (status, _) = json(addr, "GET", "/api/savepoints", None, None).await;
    assert_eq!(status, 409);
    let (status, _) = json(addr, "POST", "/api/stop", None, Some(r#"{"savepoint": "x"}"#)).await;
    assert_eq!(status, 409);
    assert_eq!(handle.status(), JobState::Running, "a refused stop changes nothing");
    let (status, cancelled) = json(addr, "POST", "/api/cancel", None, None).await;
    assert_eq!((status, cancelled["status"]["state"].as_str()), (200, Some("stopped")), "{cancelled}");
    handle.cancel().await.unwrap();

    let job = Job::new("failing").with_admin("127.0.0.1:0");
    job.source(Generator::new(u64::MAX, |i| i).with_rate(1_000.0))
        .process(weibo::on_error::Fail, |x: &u64| if *x < 50 { Ok(*x) } else { Err("no more") })
        .sink(CollectSink::new());
    let handle = job.spawn().unwrap();
    let addr = handle.admin_addr().unwrap();
    weibo_tests::until_ended(&handle).await;
    let (status, ready) = json(addr, "GET", "/readyz", None, None).await;
    assert_eq!((status, ready["state"].as_str()), (503, Some("failed")), "{ready}");
    assert!(!ready.to_string().contains("no more"), "the probe tells no error without the token: {ready}");
    let (_, job) = json(addr, "GET", "/api/job", None, None).await;
    assert!(job["status"]["error"].as_str().unwrap().contains("no more"), "{job}");
    assert!(handle.wait().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_right_token_every_request_gets_401_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("guarded")
        .with_checkpoints(dir.path(), Duration::from_secs(3600))
        .with_admin("127.0.0.1:0")
        .with_admin_token("s3cret-token");
    job.source(Generator::new(u64::MAX, |i| i).with_rate(1_000.0)).sink(CollectSink::new());
    let handle = job.spawn().unwrap();
    let addr = handle.admin_addr().unwrap();
    for token in [None, Some("wrong"), Some("s3cret-toke"), Some("s3cret-token-")] {
        for (method, path, body) in [
            ("GET", "/api/job", None),
            ("GET", "/api/metrics", None),
            ("POST", "/api/savepoints", Some(r#"{"name": "sneaky"}"#)),
            ("POST", "/api/stop", None),
            ("POST", "/api/cancel", None),
        ] {
            let (status, err) = json(addr, method, path, token, body).await;
            assert_eq!(status, 401, "{method} {path} with {token:?}: {err}");
        }
    }
    assert_eq!(handle.status(), JobState::Running, "nothing was stopped");
    assert!(handle.checkpoint_history().is_empty(), "no savepoint was taken");
    assert!(!dir.path().join("savepoints/sneaky").exists());
    // The probes need no token.
    assert_eq!(http(addr, "GET", "/healthz", None, None).await.0, 200);
    assert_eq!(http(addr, "GET", "/readyz", None, None).await.0, 200);
    let (status, _) = json(addr, "GET", "/api/job", Some("s3cret-token"), None).await;
    assert_eq!(status, 200);
    let (status, _) = json(addr, "POST", "/api/cancel", Some("s3cret-token"), None).await;
    assert_eq!(status, 200);
    assert_eq!(handle.status(), JobState::Stopped);
    handle.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_address_without_a_token_is_refused() {
    let job = Job::new("exposed").with_admin("0.0.0.0:0");
    job.source(Generator::new(10, |i| i)).sink(CollectSink::new());
    let err = job.spawn().unwrap_err().to_string();
    assert!(err.contains("not loopback") && err.contains("with_admin_token"), "{err}");
    let job = Job::new("typo").with_admin("localhost:80:80");
    job.source(Generator::new(10, |i| i)).sink(CollectSink::new());
    let err = job.spawn().unwrap_err().to_string();
    assert!(err.contains("localhost:80:80"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_job_says_so_and_refuses_to_stop() {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("short").with_checkpoints(dir.path(), Duration::from_secs(3600)).with_admin("127.0.0.1:0");
    job.source(Generator::new(1_000, |i| i))
        .with_timestamps(|i: &u64| 1_700_000_000_000 + i64::try_from(*i).unwrap(), WatermarkStrategy::monotonous())
        .name("stamped")
        .sink(CollectSink::new());
    let handle = job.spawn().unwrap();
    let addr = handle.admin_addr().unwrap();
    weibo_tests::until_ended(&handle).await;
    assert_eq!(handle.status(), JobState::Finished);
    // At the end of the input every operator is at the end of time (its
    // lag is not measured any more), the source among them.
    let metrics = handle.metrics();
    assert!(metrics.operators.iter().all(|o| o.watermark == Some(i64::MAX)), "{:?}", metrics.operators);
    assert!(!handle.prometheus_metrics().contains("weibo_operator_watermark_lag_seconds{"));
    let (status, ready) = json(addr, "GET", "/readyz", None, None).await;
    assert_eq!((status, ready["state"].as_str()), (503, Some("finished")), "{ready}");
    let (_, job) = json(addr, "GET", "/api/job", None, None).await;
    assert_eq!(job["status"]["state"], "finished", "{job}");
    assert!(job["last_checkpoint"].as_u64().is_some(), "the final checkpoint: {job}");
    let (_, history) = json(addr, "GET", "/api/checkpoints", None, None).await;
    assert_eq!(history["checkpoints"][0]["kind"], "final", "{history}");
    let (status, _) = json(addr, "POST", "/api/stop", None, None).await;
    assert_eq!(status, 409);
    let (status, err) = json(addr, "DELETE", "/api/job", None, None).await;
    assert_eq!(status, 405, "{err}");
    let long = format!(r#"{{"name": "{}"}}"#, "n".repeat(129));
    let (status, _) = json(addr, "POST", "/api/savepoints", None, Some(&long)).await;
    assert_eq!(status, 400);
    handle.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_address_with_a_token_serves_the_api() {
    let job = Job::new("exposed").with_admin("0.0.0.0:0").with_admin_token("t0ken");
    job.source(Generator::new(u64::MAX, |i| i).with_rate(100.0)).sink(CollectSink::new());
    let handle = job.spawn().unwrap();
    let bound = handle.admin_addr().unwrap();
    assert!(bound.ip().is_unspecified());
    let addr: SocketAddr = format!("127.0.0.1:{}", bound.port()).parse().unwrap();
    assert_eq!(json(addr, "GET", "/api/job", None, None).await.0, 401);
    assert_eq!(json(addr, "GET", "/api/job", Some("t0ken"), None).await.0, 200);
    handle.cancel().await.unwrap();
}

/// Several jobs behind one admin API (`AdminGroup`): each under
/// `/jobs/<name>/` with all its endpoints and dashboard, the group's
/// listing, probes and one `/metrics` for all; the group's token guards
/// them all; a job leaves when its handle is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_serves_one_admin_api_for_its_jobs() {
    let group = weibo::AdminGroup::serve("tasks", "127.0.0.1:0", Some("group-token")).unwrap();
    let addr = group.local_addr();
    let spawn = |name: &str| {
        let job = Job::new(name).with_admin_group(&group);
        job.source(Generator::new(u64::MAX, |i| (i % 10, 1u64)).with_rate(5_000.0))
            .name("events")
            .sink(CollectSink::new());
        job.spawn().unwrap()
    };
    let (a, b) = (spawn("task-a"), spawn("task-b"));
    assert_eq!((a.admin_addr(), b.admin_addr()), (Some(addr), Some(addr)));
    assert_eq!(group.jobs(), ["task-a", "task-b"]);
    let token = Some("group-token");

    // Two running jobs of one name cannot share the group; nor can a job
    // have both APIs.
    let twin = Job::new("task-a").with_admin_group(&group);
    twin.source(Generator::new(3, |i| i)).sink(CollectSink::new());
    let err = twin.spawn().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("already has a job named `task-a`"), "{err}");
    let both = Job::new("both").with_admin("127.0.0.1:0").with_admin_group(&group);
    both.source(Generator::new(3, |i| i)).sink(CollectSink::new());
    assert!(both.spawn().err().is_some_and(|e| e.to_string().contains("choose one")));

    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while [&a, &b].iter().any(|h| h.metrics().operator("events").is_none_or(|o| o.records_out == 0)) {
        assert!(std::time::Instant::now() < deadline, "both jobs read");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, ready) = json(addr, "GET", "/readyz", None, None).await;
    assert_eq!((status, &ready["jobs"]["task-b"]), (200, &Value::from("running")), "{ready}");
    for path in ["/api/jobs", "/metrics", "/jobs/task-a/api/job", "/jobs/task-b/api/metrics"] {
        assert_eq!(http(addr, "GET", path, None, None).await.0, 401, "{path} without the token");
    }
    let (status, listed) = json(addr, "GET", "/api/jobs", token, None).await;
    assert_eq!(status, 200);
    let names: Vec<&str> = listed["jobs"].as_array().unwrap().iter().map(|j| j["job"].as_str().unwrap()).collect();
    assert_eq!(names, ["task-a", "task-b"], "{listed}");
    assert_eq!(listed["jobs"][0]["dashboard"], "jobs/task-a/dashboard");
    let (status, job) = json(addr, "GET", "/jobs/task-b/api/job", token, None).await;
    assert_eq!((status, job["job"].as_str()), (200, Some("task-b")), "{job}");
    let (status, metrics) = json(addr, "GET", "/jobs/task-a/api/metrics", token, None).await;
    assert_eq!(status, 200);
    assert!(metrics["operators"][0]["records_out"].as_u64().unwrap() > 0, "{metrics}");
    assert_eq!(json(addr, "GET", "/jobs/nobody/api/job", token, None).await.0, 404);
    assert_eq!(
        http(addr, "GET", "/jobs/nobody/api/job", None, None).await.0,
        401,
        "no probing names without the token"
    );
    // One exposition: each family once, with both jobs' samples.
    let (_, text) = http(addr, "GET", "/metrics", token, None).await;
    assert_eq!(text.matches("# TYPE weibo_operator_records_out_total counter").count(), 1, "{text}");
    for name in ["task-a", "task-b"] {
        assert!(text.contains(&format!(r#"weibo_operator_records_out_total{{job="{name}",operator="events"}}"#)));
    }
    // The pages: the group's list and each job's dashboard, with its files.
    let (status, page) = http(addr, "GET", "/", None, None).await;
    assert!(status == 200 && page.contains("dashboard/group.js"), "{page}");
    for path in ["/jobs/task-a/dashboard", "/jobs/task-a/"] {
        let (status, page) = http(addr, "GET", path, None, None).await;
        assert!(status == 200 && page.contains("<title>Weibo job</title>"), "{path}: {page}");
    }
    let (status, _) = http(addr, "GET", "/jobs/task-a", None, None).await;
    assert_eq!(status, 308, "on to /jobs/task-a/, where the page's relative links resolve under the job");
    assert_eq!(http(addr, "GET", "/jobs/task-a/dashboard/app.js", None, None).await.0, 200);
    // A stop through the group reaches the one job.
    let (status, stopped) = json(addr, "POST", "/jobs/task-a/api/stop", token, None).await;
    assert_eq!((status, stopped["stopped"].as_bool()), (200, Some(true)), "{stopped}");
    assert_eq!(a.status(), JobState::Stopped);
    assert_eq!(b.status(), JobState::Running);

    // Dropped, a job leaves; the server stays while the group does.
    drop(a);
    assert_eq!(group.jobs(), ["task-b"]);
    let (_, listed) = json(addr, "GET", "/api/jobs", token, None).await;
    assert_eq!(listed["jobs"].as_array().map(Vec::len), Some(1), "{listed}");
    b.cancel().await.unwrap();
    assert!(group.jobs().is_empty());
    let (status, ready) = json(addr, "GET", "/readyz", None, None).await;
    assert_eq!(status, 200, "a group without jobs waits, ready: {ready}");
}

/// On fjall with a small cache, a state's metrics show its table on disk
/// and the cache's misses as well as its hits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_on_fjall_reports_its_table_and_its_cache() {
    let dir = tempfile::tempdir().unwrap();
    let backend = weibo::state::FjallBackend::builder(dir.path()).with_object_cache(64 * 1024).open().unwrap();
    let job = Job::new("on-disk").with_state_backend(backend);
    job.source(Generator::new(u64::MAX, |i| (i % 50_000, 1u64)).with_rate(200_000.0))
        .name("events")
        .key_by(|e: &(u64, u64)| e.0)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .sink(CollectSink::new());
    let handle = job.spawn().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let value = loop {
        let m = handle.metrics();
        let value = m.operator("reduce").and_then(|o| o.state.iter().find(|s| s.state == "value").cloned());
        if let Some(v) = value.filter(|v| v.table_entries.unwrap_or(0) > 0 && v.cache_misses > 0) {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "no table or no misses: {:?}", m.operator("reduce"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(value.cache_hits > 0 && value.memory_entries < 50_000, "{value:?}");
    let text = handle.prometheus_metrics();
    assert!(
        text.contains(r#"weibo_state_cache_misses_total{job="on-disk",operator="reduce",state="value"}"#),
        "{text}"
    );
    assert!(text.contains("# TYPE weibo_state_table_size_bytes gauge"), "{text}");
    handle.cancel().await.unwrap();
}
