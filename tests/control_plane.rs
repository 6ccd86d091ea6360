//! The control plane for one machine (`weibo_connectors::control`), with
//! real processes: a job killed with SIGKILL is restarted from its
//! checkpoint and commits exactly what a run that never died does; a
//! crash loop ends as failed with its restarts counted; a control plane
//! started again adopts the jobs that still run and restarts one that died
//! meanwhile; a second one on the same directory is refused; a stop takes
//! a savepoint through the job's admin API, and a stop whose savepoint
//! cannot be taken leaves the job running.
//!
//! The binary job is this test binary itself, started with
//! `WEIBO_CONTROL_CHILD` set, running only the `child` test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use weibo::Job;
use weibo::sinks::TxnFileSink;
use weibo::sources::Generator;
use weibo_connectors::control::{ControlError, ControlPlane, JobSpec, JobStatus, Phase, RestartPolicy, routes};
use weibo_tests::crash;

const LINES: usize = 6_000;

/// A running sum per key over generated lines `i % 7, i % 100`, at
/// `rate` lines a second (none: as fast as it goes; 5,000 make about
/// 1.2 s in all), checkpointed every 100 ms, into the exactly-once file
/// sink; with an admin API at `admin` when given.
fn pipeline(out: &Path, checkpoints: &Path, admin: Option<&str>, rate: f64) -> Job {
    let mut job = Job::new("controlled").with_checkpoints(checkpoints, Duration::from_millis(100));
    if let Some(addr) = admin {
        job = job.with_admin(addr);
    }
    let mut lines = Generator::new(LINES as u64, |i| (i % 7, i % 100, 1u64));
    if rate > 0.0 {
        lines = lines.with_rate(rate);
    }
    job.source(lines)
        .name("lines")
        .key_by(|e: &(u64, u64, u64)| e.0)
        .with_partitions(2)
        .reduce(|a, b| (a.0, a.1 + b.1, a.2 + b.2))
        .name("running")
        .sink_exactly_once(TxnFileSink::json_lines(out));
    job
}

/// The binary job's life: run the pipeline to the end.
#[test]
fn child() {
    let Ok(spec) = std::env::var("WEIBO_CONTROL_CHILD") else { return };
    let parts: Vec<&str> = spec.split('|').collect();
    let admin = parts.get(2).filter(|a| !a.is_empty()).copied();
    let rate = parts.get(3).and_then(|p| p.parse().ok()).unwrap_or(5_000.0);
    let mut job = pipeline(Path::new(parts[0]), Path::new(parts[1]), admin, rate);
    // What a binary run by `weibo serve` does to start from the savepoint
    // of an upgrade.
    // ANCHOR: restore
    if let Ok(savepoint) = std::env::var("WEIBO_RESTORE_FROM") {
        job = job.restore_from(savepoint);
    }
    // ANCHOR_END: restore
    weibo::testing::block_on(job.run()).unwrap();
}

struct Dirs {
    root: tempfile::TempDir,
    out: PathBuf,
    checkpoints: PathBuf,
    /// Another checkpoint directory: an upgraded version's.
    checkpoints2: PathBuf,
}

fn dirs() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let (out, checkpoints) = (root.path().join("out"), root.path().join("checkpoints"));
    Dirs { out, checkpoints, checkpoints2: root.path().join("checkpoints-2"), root }
}

fn reference() -> BTreeMap<String, usize> {
    let d = dirs();
    weibo::testing::block_on(pipeline(&d.out, &d.checkpoints, None, 0.0).run()).unwrap();
    let out = crash::committed_lines(&d.out);
    assert_eq!(out.len(), LINES, "one running sum a line");
    out
}

fn policy(max_restarts: u32) -> RestartPolicy {
    RestartPolicy { max_restarts, window_secs: 600, backoff_ms: 50, max_backoff_ms: 200 }
}

/// The spec of the binary job over `d`, at `rate` lines a second.
fn binary_job(name: &str, d: &Dirs, admin: Option<&str>, rate: f64) -> JobSpec {
    binary_job_in(name, &d.out, &d.checkpoints, admin, rate)
}

/// The spec of the binary job writing to `out`, its checkpoints in
/// `checkpoints`.
fn binary_job_in(name: &str, out: &Path, checkpoints: &Path, admin: Option<&str>, rate: f64) -> JobSpec {
    let exe = std::env::current_exe().unwrap().display().to_string();
    let spec = format!("{}|{}|{}|{rate}", out.display(), checkpoints.display(), admin.unwrap_or(""));
    JobSpec {
        name: name.into(),
        command: vec![exe, "--exact".into(), "child".into(), "--nocapture".into(), "--test-threads=1".into()],
        env: BTreeMap::from([("WEIBO_CONTROL_CHILD".to_string(), spec)]),
        dir: None,
        admin: admin.map(|a| format!("http://{a}")),
        restart: policy(5),
    }
}

fn command_job(name: &str, command: &[&str], restart: RestartPolicy) -> JobSpec {
    JobSpec {
        name: name.into(),
        command: command.iter().map(|s| (*s).to_string()).collect(),
        env: BTreeMap::new(),
        dir: None,
        admin: None,
        restart,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Kills process `pid` (which may have ended meanwhile).
fn kill(pid: u32) {
    let _ = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// Kills the processes it was given when dropped: no job outlives a test
/// that failed.
#[derive(Default)]
struct Reaper(std::sync::Mutex<Vec<u32>>);

impl Reaper {
    fn watch(&self, pid: Option<u32>) {
        if let Some(pid) = pid {
            self.0.lock().unwrap().push(pid);
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for pid in self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter() {
            if alive(*pid) {
                let _ = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            }
        }
    }
}

const LONG: Duration = Duration::from_secs(120);

async fn running(plane: &ControlPlane, name: &str, other_than: Option<u32>) -> JobStatus {
    plane.wait_for(name, LONG, |s| s.phase == Phase::Running && s.pid.is_some() && s.pid != other_than).await.unwrap()
}

#[test]
fn a_killed_job_is_restarted_from_its_checkpoint_and_commits_exactly_once() {
    if std::env::var("WEIBO_CONTROL_CHILD").is_ok() {
        return;
    }
    let want = reference();
    let d = dirs();
    let reaper = Reaper::default();
    let rt = runtime();
    rt.block_on(async {
        let plane = ControlPlane::open(d.root.path().join("plane")).unwrap();
        plane.submit(binary_job("sums", &d, None, 5_000.0)).unwrap();
        let mut pid = None;
        for kills in 0..2u32 {
            // Its next life, unless the last one ended just before its kill.
            let status = plane
                .wait_for("sums", LONG, |s| {
                    s.phase == Phase::Finished || (s.phase == Phase::Running && s.pid.is_some() && s.pid != pid)
                })
                .await
                .unwrap();
            if status.phase == Phase::Finished {
                break;
            }
            reaper.watch(status.pid);
            assert_eq!(status.restarts, kills);
            // Killed once this life has committed something past the
            // last one's output.
            let before = crash::committed_lines(&d.out).len();
            let deadline = tokio::time::Instant::now() + LONG;
            while crash::committed_lines(&d.out).len() <= before && plane.status("sums").unwrap().pid == status.pid {
                assert!(tokio::time::Instant::now() < deadline, "life {kills} committed nothing");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if plane.status("sums").unwrap().phase == Phase::Finished {
                break;
            }
            pid = status.pid;
            kill(pid.unwrap());
        }
        let done = plane.wait_for("sums", LONG, |s| s.phase == Phase::Finished).await.unwrap();
        assert!(done.restarts >= 1, "{done:?}");
        assert_eq!(done.last_exit.as_deref(), Some("exit code 0"));
        let events = plane.events("sums").unwrap();
        assert!(
            events.iter().any(|e| e.to == Phase::Restarting && e.reason.contains("killed by signal 9")),
            "{events:?}"
        );
        // The events are on disk too, one a line.
        let on_disk = std::fs::read_to_string(d.root.path().join("plane/jobs/sums/events.jsonl")).unwrap();
        assert_eq!(on_disk.lines().count(), events.len());
    });
    crash::assert_committed_once(&crash::committed_lines(&d.out), &want);
}

#[test]
fn a_crash_loop_ends_as_failed_with_its_restarts_counted() {
    if std::env::var("WEIBO_CONTROL_CHILD").is_ok() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let plane = ControlPlane::open(root.path()).unwrap();
        plane.submit(command_job("crashes", &["sh", "-c", "echo starting; exit 3"], policy(2))).unwrap();
        let failed = plane.wait_for("crashes", LONG, |s| s.phase == Phase::Failed).await.unwrap();
        assert_eq!(failed.restarts, 3, "two restarts allowed, the third fails it: {failed:?}");
        assert!(!failed.wanted);
        assert_eq!(failed.last_exit.as_deref(), Some("exit code 3"));
        assert!(failed.reason.contains("a crash loop: 3 restarts within 600 s (at most 2)"), "{}", failed.reason);
        let starts = plane.logs("crashes", 100).unwrap().iter().filter(|l| *l == "starting").count();
        assert_eq!(starts, 3, "three lives: the first and two restarts");
        // Failed stays failed, until started again by hand.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(plane.status("crashes").unwrap().phase, Phase::Failed);
        plane.start("crashes").unwrap();
        let again = plane.wait_for("crashes", LONG, |s| s.phase == Phase::Failed && s.restarts == 6).await.unwrap();
        assert!(!again.wanted);
        // A program that cannot be started fails at once, saying why.
        plane.submit(command_job("missing", &["/nonexistent/program"], policy(2))).unwrap();
        let missing = plane.wait_for("missing", LONG, |s| s.phase == Phase::Failed).await.unwrap();
        assert!(missing.reason.contains("cannot run `/nonexistent/program`"), "{}", missing.reason);
        // A removed job is gone, its files with it.
        plane.remove("missing").unwrap();
        assert!(matches!(plane.status("missing"), Err(ControlError::NoJob(_))));
        assert!(!root.path().join("jobs/missing").exists());
    });
}

#[test]
fn a_control_plane_started_again_adopts_its_running_jobs_and_restarts_the_dead() {
    if std::env::var("WEIBO_CONTROL_CHILD").is_ok() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let first = runtime();
    let pid = first.block_on(async {
        let plane = ControlPlane::open(root.path()).unwrap();
        plane.submit(command_job("sleeper", &["sleep", "600"], policy(5))).unwrap();
        let status = running(&plane, "sleeper", None).await;
        reaper.watch(status.pid);
        // A second control plane on the same directory is refused.
        let second = ControlPlane::open(root.path()).unwrap_err().to_string();
        assert!(second.contains("another control plane has the directory"), "{second}");
        status.pid.unwrap()
    });
    // The control plane's process ends: its runtime and supervisors go,
    // the job's process runs on.
    drop(first);
    assert!(alive(pid), "the job outlives its control plane");
    let second = runtime();
    let pid = second.block_on(async {
        let plane = ControlPlane::open(root.path()).unwrap();
        let adopted = plane.wait_for("sleeper", LONG, |s| s.reason.contains("adopted")).await.unwrap();
        assert_eq!((adopted.phase, adopted.pid), (Phase::Running, Some(pid)), "adopted, not started again");
        assert_eq!(adopted.restarts, 0);
        // The adopted process dies: restarted.
        kill(pid);
        let restarted = running(&plane, "sleeper", Some(pid)).await;
        reaper.watch(restarted.pid);
        assert_eq!(restarted.restarts, 1);
        assert!(restarted.last_exit.as_deref().is_some_and(|e| e.contains("adopted")), "{restarted:?}");
        restarted.pid.unwrap()
    });
    drop(second);
    // It dies while no control plane watches: the next one restarts it.
    kill(pid);
    let third = runtime();
    third.block_on(async {
        let plane = ControlPlane::open(root.path()).unwrap();
        let restarted = running(&plane, "sleeper", Some(pid)).await;
        reaper.watch(restarted.pid);
        assert_eq!(restarted.restarts, 2);
        assert!(
            plane
                .events("sleeper")
                .unwrap()
                .iter()
                .any(|e| e.reason.contains("ended while no control plane watched it")),
            "{:?}",
            plane.events("sleeper")
        );
        // Stopped without an admin API: SIGTERM, and it is stopped.
        plane.stop("sleeper", None).await.unwrap();
        let stopped = plane.wait_for("sleeper", LONG, |s| s.phase == Phase::Stopped).await.unwrap();
        assert_eq!(stopped.last_exit.as_deref(), Some("killed by signal 15"));
        assert!(!restarted.pid.is_some_and(alive));
        // A savepoint needs the job's admin API.
        plane.start("sleeper").unwrap();
        let again = running(&plane, "sleeper", None).await;
        reaper.watch(again.pid);
        let refused = plane.stop("sleeper", Some("sp".into())).await.unwrap_err().to_string();
        assert!(refused.contains("has no admin API to take a savepoint through"), "{refused}");
        assert_eq!(plane.status("sleeper").unwrap().phase, Phase::Running);
        plane.cancel("sleeper").unwrap();
        let cancelled = plane.wait_for("sleeper", LONG, |s| s.phase == Phase::Cancelled).await.unwrap();
        assert_eq!(cancelled.last_exit.as_deref(), Some("killed by signal 9"));
    });
}

/// Waits until the job's admin API at `admin` takes connections (once
/// the job has started).
async fn until_listening(admin: &str) {
    let deadline = tokio::time::Instant::now() + LONG;
    while std::net::TcpStream::connect(admin).is_err() {
        assert!(tokio::time::Instant::now() < deadline, "the job's admin API at {admin} never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A port free now on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn a_stop_takes_a_savepoint_through_the_admin_api_or_leaves_the_job_running() {
    if std::env::var("WEIBO_CONTROL_CHILD").is_ok() {
        return;
    }
    let want = reference();
    let d = dirs();
    let reaper = Reaper::default();
    let admin = format!("127.0.0.1:{}", free_port());
    let rt = runtime();
    rt.block_on(async {
        let plane = ControlPlane::open(d.root.path().join("plane")).unwrap();
        // Slow enough (about 20 s) to be stopped before it ends.
        plane.submit(binary_job("sums", &d, Some(&admin), 300.0)).unwrap();
        let status = running(&plane, "sums", None).await;
        reaper.watch(status.pid);
        until_listening(&admin).await;
        // A savepoint name the job refuses: the stop is refused, the job
        // runs on, unharmed.
        let refused = plane.stop("sums", Some("../escape".into())).await.unwrap_err().to_string();
        assert!(refused.contains("was not stopped"), "{refused}");
        let after = plane.status("sums").unwrap();
        assert_eq!((after.phase, after.pid), (Phase::Running, status.pid), "{after:?}");
        assert!(plane.events("sums").unwrap().iter().any(|e| e.reason.starts_with("the stop was refused")));
        // A good one: stopped, with the savepoint written.
        plane.stop("sums", Some("before-upgrade".into())).await.unwrap();
        let stopped = plane.wait_for("sums", LONG, |s| s.phase == Phase::Stopped).await.unwrap();
        assert!(!stopped.wanted);
        assert!(d.checkpoints.join("savepoints/before-upgrade").is_dir(), "the savepoint is written");
        // Started again, it goes on from its last checkpoint to the end.
        plane.start("sums").unwrap();
        let done = plane.wait_for("sums", LONG, |s| s.phase == Phase::Finished).await.unwrap();
        assert_eq!(done.restarts, 0, "stopped and started, never restarted: {done:?}");
    });
    crash::assert_committed_once(&crash::committed_lines(&d.out), &want);
}

/// The variables of process `pid`.
fn environ(pid: u32) -> Vec<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    bytes.split(|b| *b == 0).map(|v| String::from_utf8_lossy(v).into_owned()).collect()
}

#[test]
fn an_upgrade_starts_the_new_version_from_its_savepoint_or_leaves_the_old_one_running() {
    if std::env::var("WEIBO_CONTROL_CHILD").is_ok() {
        return;
    }
    let want = reference();
    let d = dirs();
    let reaper = Reaper::default();
    let admin = format!("127.0.0.1:{}", free_port());
    let rt = runtime();
    rt.block_on(async {
        let plane = ControlPlane::open(d.root.path().join("plane")).unwrap();
        // Version 1, slow.
        plane.submit(binary_job("sums", &d, Some(&admin), 300.0)).unwrap();
        let v1 = running(&plane, "sums", None).await;
        reaper.watch(v1.pid);
        until_listening(&admin).await;
        // A savepoint, and the job runs on.
        let taken = plane.savepoint("sums", "mid-run").await.unwrap();
        assert_eq!(Path::new(&taken), d.checkpoints.join("savepoints/mid-run"));
        assert_eq!(plane.status("sums").unwrap().pid, v1.pid);
        // Version 2 runs faster, keeps its checkpoints elsewhere (so only
        // the savepoint can give it version 1's state and positions), and
        // says so in its environment.
        let mut v2 = binary_job_in("sums", &d.out, &d.checkpoints2, Some(&admin), 5_000.0);
        v2.env.insert("VERSION".into(), "2".into());
        // A savepoint the job refuses: no upgrade, version 1 runs on.
        let refused = plane.upgrade("sums", Some(v2.clone()), Some("../bad".into())).await.unwrap_err().to_string();
        assert!(refused.contains("was not upgraded"), "{refused}");
        let after = plane.status("sums").unwrap();
        assert_eq!((after.phase, after.pid, after.restore_from), (Phase::Running, v1.pid, None));
        assert!(!plane.spec("sums").unwrap().env.contains_key("VERSION"), "the spec is unchanged");
        assert!(plane.events("sums").unwrap().iter().any(|e| e.reason.starts_with("the upgrade was refused")));
        // A spec for another job is refused before anything is asked.
        let mut other = v2.clone();
        other.name = "other".into();
        assert!(plane.upgrade("sums", Some(other), Some("x".into())).await.is_err());
        // The upgrade: version 2 starts from the savepoint.
        plane.upgrade("sums", Some(v2.clone()), Some("to-v2".into())).await.unwrap();
        let started = running(&plane, "sums", v1.pid).await;
        reaper.watch(started.pid);
        let savepoint = d.checkpoints.join("savepoints/to-v2");
        assert!(savepoint.is_dir());
        let env = environ(started.pid.unwrap());
        assert!(env.contains(&"VERSION=2".to_string()), "the new spec runs");
        let restore = format!("WEIBO_RESTORE_FROM={}", savepoint.display());
        assert!(env.contains(&restore), "started from the savepoint: {env:?}");
        assert_eq!(plane.spec("sums").unwrap(), v2);
        // Killed at once, before its first checkpoint or just after: it
        // starts from the savepoint again, or from a checkpoint of its own,
        // never from nothing.
        kill(started.pid.unwrap());
        assert!(
            plane
                .events("sums")
                .unwrap()
                .iter()
                .any(|e| e.reason.contains("upgraded: the new version starts from savepoint")),
            "{:?}",
            plane.events("sums")
        );
        let done = plane.wait_for("sums", LONG, |s| s.phase == Phase::Finished).await.unwrap();
        assert_eq!(done.restarts, 1, "{done:?}");
    });
    crash::assert_committed_once(&crash::committed_lines(&d.out), &want);
}

/// Waits up to 30 s for `expression` to be true in the page.
async fn until(page: &mut weibo_tests::Page, what: &str, expression: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while page.eval(expression).await != serde_json::Value::Bool(true) {
        assert!(
            std::time::Instant::now() < deadline,
            "the page never showed {what} ({expression}); errors: {:?}",
            page.errors()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The page of the control plane in headless Chromium.
#[test]
fn the_jobs_page_shows_the_jobs_takes_a_savepoint_and_stops_one() {
    if std::env::var("WEIBO_CONTROL_CHILD").is_ok() {
        return;
    }
    let d = dirs();
    let reaper = Reaper::default();
    let admin = format!("127.0.0.1:{}", free_port());
    let rt = runtime();
    rt.block_on(async {
        let plane = ControlPlane::open(d.root.path().join("plane")).unwrap();
        let options = weibo::AdminOptions::new("127.0.0.1:0");
        let service = weibo::AdminService::serve("control", &options, routes(plane.clone())).unwrap();
        let addr = service.local_addr();
        plane.submit(binary_job("sums", &d, Some(&admin), 300.0)).unwrap();
        plane.submit(command_job("sleeper", &["sleep", "600"], policy(5))).unwrap();
        reaper.watch(running(&plane, "sums", None).await.pid);
        reaper.watch(running(&plane, "sleeper", None).await.pid);

        let browser = weibo_tests::Browser::start(1280, 800).await;
        let mut page = browser.page().await;
        page.navigate(&format!("http://{addr}/")).await;
        until(
            &mut page,
            "two running jobs",
            "document.querySelectorAll('#jobs tr[data-phase=\"running\"]').length === 2",
        )
        .await;
        // The job's own last checkpoint, asked of its admin API.
        until(
            &mut page,
            "the last checkpoint of sums",
            "/^[0-9]+$/.test(document.querySelector('#jobs tr[data-job=\"sums\"] td.checkpoint').textContent)",
        )
        .await;
        let link = page.eval("document.querySelector('#jobs tr[data-job=\"sums\"] a').href").await;
        assert_eq!(link, serde_json::Value::String(format!("http://{admin}/dashboard")));
        assert_eq!(
            page.eval(
                "document.querySelectorAll('#jobs tr[data-job=\"sleeper\"] button[data-action=\"savepoint\"]').length"
            )
            .await,
            serde_json::json!(0),
            "no savepoint without an admin API"
        );
        // A savepoint from the page; the job runs on.
        page.eval("document.querySelector('#jobs tr[data-job=\"sums\"] button[data-action=\"savepoint\"]').click()")
            .await;
        until(
            &mut page,
            "the savepoint's path",
            "/savepoint of sums written to /.test(document.querySelector('#result').textContent)",
        )
        .await;
        let written: Vec<String> = std::fs::read_dir(d.checkpoints.join("savepoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(written.iter().any(|n| n.starts_with("ui-")), "{written:?}");
        assert_eq!(plane.status("sums").unwrap().phase, Phase::Running);
        // A stop from the page.
        page.eval("document.querySelector('#jobs tr[data-job=\"sleeper\"] button[data-action=\"stop\"]').click()")
            .await;
        until(
            &mut page,
            "the sleeper stopped",
            "document.querySelector('#jobs tr[data-job=\"sleeper\"]').dataset.phase === 'stopped'",
        )
        .await;
        assert_eq!(plane.status("sleeper").unwrap().phase, Phase::Stopped);
        assert!(page.errors().is_empty(), "{:?}", page.errors());
        plane.cancel("sums").unwrap();
        plane.wait_for("sums", LONG, |s| s.phase == Phase::Cancelled).await.unwrap();
    });
}
