//! The `weibo` binary as a CI or an operator runs it: exit codes, what it
//! prints, and a YAML job run by it, watched and stopped through its admin
//! API by it.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn weibo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weibo")).args(args).env_remove("WEIBO_ADMIN_TOKEN").output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const GOOD: &str = r#"job: evens
sources:
  numbers: { generator: { count: 100, fields: { n: "i", square: "i * i" } } }
pipeline:
  - from: numbers
  - filter: "event.n % 2 == 0"
  - to: out
sinks:
  out: { file: { path: OUT } }
"#;

const BAD: &str = r#"job: evens
sources:
  numbers: { generator: { count: 100, fields: { n: "i" } } }
pipeline:
  - from: numbers
  - filter: "event.m % 2 == 0"
  - to: nowhere
"#;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text.replace("OUT", &dir.join("out.jsonl").display().to_string())).unwrap();
    path.display().to_string()
}

#[test]
fn validate_plan_and_run_exit_codes_and_output() {
    let dir = tempfile::tempdir().unwrap();
    let (good, bad) = (write(dir.path(), "good.yaml", GOOD), write(dir.path(), "bad.yaml", BAD));

    let ok = weibo(&["validate", &good]);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    assert_eq!(text(&ok.stdout).trim(), format!("{good}: valid (job `evens`, 3 steps)"));

    let refused = weibo(&["validate", &good, &bad]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = text(&refused.stderr);
    assert!(stderr.contains(&format!("{bad}:6:14: no field `m` in the records of this step")), "{stderr}");
    assert!(stderr.contains("help: did you mean `event.n`?"), "{stderr}");
    assert!(stderr.contains(&format!("{bad}:7:9: no sink named `nowhere`")), "{stderr}");
    assert!(stderr.contains("1 of 2 pipeline file(s) are not valid"), "{stderr}");

    let missing = weibo(&["validate", &dir.path().join("none.yaml").display().to_string()]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains("cannot read the file"), "{}", text(&missing.stderr));

    // A command line it does not understand.
    assert_eq!(weibo(&["validate"]).status.code(), Some(2));
    assert_eq!(weibo(&["valdate", &good]).status.code(), Some(2));

    let plan = weibo(&["plan", &good]);
    assert_eq!(plan.status.code(), Some(0), "{}", text(&plan.stderr));
    let plan = text(&plan.stdout);
    assert!(plan.contains("job `evens`") && plan.contains("plan of job `evens`"), "{plan}");
    // The generator's fields and the filter run as one operator.
    assert!(plan.contains("process_batch `numbers:fields+filter` (on error: fail)"), "{plan}");
    assert_eq!(weibo(&["plan", &bad]).status.code(), Some(1));

    let run = weibo(&["run", &good]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    assert!(text(&run.stdout).contains("filter"), "{}", text(&run.stdout));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 50);
    let mut squares: Vec<i64> = lines.iter().map(|l| l["square"].as_i64().unwrap()).collect();
    squares.sort_unstable();
    assert_eq!(squares[..3], [0, 4, 16]);
}

/// `weibo run --admin`, then `weibo status` and `weibo stop` against it.
#[test]
fn a_yaml_job_run_by_weibo_is_watched_and_stopped_by_weibo() {
    let dir = tempfile::tempdir().unwrap();
    let file = r#"job: endless
checkpoints: { storage: CP, interval: 200ms }
sources:
  ticks: { generator: { rate: 2000, fields: { n: "i" } } }
pipeline:
  - from: ticks
  - key_by: "event.n % 10"
  - aggregate: { count: "count()" }
  - to: { blackhole: {} }
"#
    .replace("CP", &dir.path().join("cp").display().to_string());
    let path = dir.path().join("endless.yaml");
    std::fs::write(&path, file).unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_weibo"))
        .args(["run", &path.display().to_string(), "--admin", &addr])
        .env("WEIBO_ADMIN_TOKEN", "secret")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let url = format!("http://{addr}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let out =
            Command::new(env!("CARGO_BIN_EXE_weibo")).args(["status", &url, "--token", "secret"]).output().unwrap();
        let line = text(&out.stdout);
        if out.status.success() && line.contains("last checkpoint") {
            break line;
        }
        assert!(Instant::now() < deadline, "no checkpoint: {line} {}", text(&out.stderr));
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.starts_with("job `endless`: running"), "{status}");
    let unauthorised = weibo(&["status", &url]);
    assert_eq!(unauthorised.status.code(), Some(1));
    assert!(text(&unauthorised.stderr).contains("401"), "{}", text(&unauthorised.stderr));

    let stop = Command::new(env!("CARGO_BIN_EXE_weibo"))
        .args(["stop", &url, "--savepoint", "before-upgrade"])
        .env("WEIBO_ADMIN_TOKEN", "secret")
        .output()
        .unwrap();
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop.stderr));
    assert!(text(&stop.stdout).contains("job stopped"), "{}", text(&stop.stdout));
    let exit = child.wait().unwrap();
    assert!(exit.success(), "weibo run ended with {exit}");
    let savepoint = dir.path().join("cp/savepoints/before-upgrade");
    let verify = weibo(&["checkpoint", "verify", &savepoint.display().to_string()]);
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify.stderr));
    assert!(text(&verify.stdout).contains("of job `endless` is whole"), "{}", text(&verify.stdout));
}

#[test]
fn test_runs_the_test_files_of_a_folder_and_fails_on_a_wrong_expectation() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/yaml");
    let ok = weibo(&["test", &examples.display().to_string()]);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    assert!(text(&ok.stdout).contains("test(s) passed"), "{}", text(&ok.stdout));
    assert!(
        text(&ok.stdout)
            .contains("clicks_test.yaml: test `a click after the allowed lateness goes to late_clicks`: ok")
    );

    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "evens.yaml", GOOD);
    std::fs::write(
        dir.path().join("evens_test.yaml"),
        "pipeline: evens.yaml\ntests:\n  - name: odd numbers pass\n    input: [ { n: 1, square: 1 }, { n: 2, square: 4 } ]\n    expect: { out: [ { n: 1, square: 1 } ] }\n",
    )
    .unwrap();
    let failed = weibo(&["test", &dir.path().display().to_string()]);
    assert_eq!(failed.status.code(), Some(1));
    let stdout = text(&failed.stdout);
    assert!(stdout.contains("test `odd numbers pass`: FAILED"), "{stdout}");
    assert!(stdout.contains("sink `out` did not get {\"n\":1,\"square\":1}"), "{stdout}");
    assert!(stdout.contains("sink `out` got {\"n\":2,\"square\":4}, which the test does not expect"), "{stdout}");
    assert!(text(&failed.stderr).contains("1 test(s) failed, 0 passed"), "{}", text(&failed.stderr));
    assert_eq!(weibo(&["test", &dir.path().join("none").display().to_string()]).status.code(), Some(1));
}

/// A local S3 server (moto, which the README's test command installs) on
/// a free port, stopped when dropped.
struct Moto {
    child: std::process::Child,
    endpoint: String,
    port: u16,
}

impl Moto {
    fn start() -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "moto_server: install it with `python3 -m pip install 'moto[server]'` (the README's test command does)",
            );
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto_server did not listen on port {port} in 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Moto { child, endpoint: format!("http://127.0.0.1:{port}"), port }
    }

    /// Creates bucket `name` (moto takes an unsigned request).
    fn bucket(&self, name: &str) {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            stream,
            "PUT /{name} HTTP/1.1\r\nhost: 127.0.0.1:{}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            self.port
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "creating bucket {name}: {answer}");
    }

    /// `weibo` with the `AWS_*` variables of this server.
    fn weibo(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_weibo"))
            .args(args)
            .env("AWS_ENDPOINT", &self.endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "testsecret")
            .output()
            .unwrap()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `weibo checkpoint list|inspect|verify` on a job's checkpoints in S3,
/// by URL: the same answers as for a directory, and a damaged checkpoint
/// named by its URL.
#[test]
fn checkpoint_subcommands_read_a_job_s_checkpoints_in_s3() {
    use weibo::checkpoint::CheckpointStorage;
    let moto = Moto::start();
    moto.bucket("jobs");
    let storage = weibo_connectors::s3::S3Storage::builder("jobs", "teams/counts")
        .with_endpoint(&moto.endpoint)
        .with_region("us-east-1")
        .with_credentials("test", "testsecret")
        .allow_http()
        .path_style()
        .build()
        .unwrap();
    let job = weibo::Job::new("counts").with_checkpoint_storage(storage.clone(), Duration::from_secs(60));
    job.source(weibo::sources::IterSource::new(0..1_000u64))
        .key_by(|x: &u64| x % 7)
        .fold(|| 0u64, |acc, x| *acc += x)
        .name("totals")
        .uid("totals")
        .sink(weibo::sinks::CollectSink::new());
    tokio::runtime::Runtime::new().unwrap().block_on(job.run()).unwrap();

    let list = moto.weibo(&["checkpoint", "list", "s3://jobs/teams/counts"]);
    assert_eq!(list.status.code(), Some(0), "{}", text(&list.stderr));
    let listed = text(&list.stdout);
    let url = listed
        .lines()
        .find_map(|l| l.split_whitespace().nth(2).filter(|u| u.starts_with("s3://jobs/teams/counts/chk-")))
        .unwrap_or_else(|| panic!("no checkpoint listed: {listed}"))
        .to_string();

    let verify = moto.weibo(&["checkpoint", "verify", &url]);
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify.stderr));
    assert!(text(&verify.stdout).starts_with(&format!("{url}: checkpoint ")), "{}", text(&verify.stdout));
    assert!(text(&verify.stdout).contains("of job `counts` is whole"), "{}", text(&verify.stdout));

    let key = moto.weibo(&["checkpoint", "inspect", &url, "--operator", "totals", "--key", "3"]);
    assert_eq!(key.status.code(), Some(0), "{}", text(&key.stderr));
    let total: u64 = (0..1_000u64).filter(|x| x % 7 == 3).sum();
    assert!(text(&key.stdout).ends_with(&format!(": {total}\n")), "{}", text(&key.stdout));

    // A state file gone (state files are shared between checkpoints, under
    // `shared/`): verify fails, naming it.
    let all = storage.list("").unwrap();
    let state =
        all.iter().find(|f| f.starts_with("shared/totals-")).unwrap_or_else(|| panic!("no state file in {all:?}"));
    storage.delete(state).unwrap();
    let damaged = moto.weibo(&["checkpoint", "verify", &url]);
    assert_eq!(damaged.status.code(), Some(1));
    let name = state.rsplit('/').next().unwrap();
    assert!(text(&damaged.stderr).contains(name), "{}", text(&damaged.stderr));

    let none = moto.weibo(&["checkpoint", "list", "s3://jobs/nothing-here"]);
    assert_eq!(none.status.code(), Some(0), "{}", text(&none.stderr));
    assert_eq!(text(&none.stdout).trim(), "s3://jobs/nothing-here: no complete checkpoint and no savepoint");
    let no_bucket = moto.weibo(&["checkpoint", "verify", "s3:///chk-1"]);
    assert_eq!(no_bucket.status.code(), Some(1));
    assert!(text(&no_bucket.stderr).contains("names its bucket"), "{}", text(&no_bucket.stderr));
}

/// `weibo serve` in a child process, killed when dropped (its jobs are
/// killed by the test that started them).
struct Serve(std::process::Child, String);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path) -> Serve {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weibo"))
        .args(["serve", "--dir", &dir.display().to_string(), "--listen", "127.0.0.1:0"])
        .env_remove("WEIBO_ADMIN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let url = line.trim().rsplit_once("API on ").map(|(_, url)| url.to_string()).unwrap_or_default();
    assert!(url.starts_with("http://127.0.0.1:"), "{line}");
    Serve(child, url)
}

/// `weibo jobs --server <url> <args>`.
fn jobs(server: &Serve, args: &[&str]) -> Output {
    let mut all = vec!["jobs", "--server", &server.1];
    all.extend_from_slice(args);
    weibo(&all)
}

/// Polls `weibo jobs status <name> --json` until its phase is `phase`.
fn wait_phase(server: &Serve, name: &str, phase: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = jobs(server, &["status", name, "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let job: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if job["status"]["phase"] == phase {
            return job;
        }
        assert!(Instant::now() < deadline, "job `{name}` never {phase}: {job}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn serve_runs_a_yaml_job_and_a_program_and_jobs_manages_them() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.yaml", GOOD);
    let server = serve(&dir.path().join("plane"));

    // A YAML job, run by this `weibo`: it ends by itself.
    let submitted = jobs(&server, &["submit", "evens", "--yaml", &good]);
    assert_eq!(submitted.status.code(), Some(0), "{}", text(&submitted.stderr));
    assert!(text(&submitted.stdout).starts_with("submitted evens: "), "{}", text(&submitted.stdout));
    let finished = wait_phase(&server, "evens", "finished");
    assert_eq!(finished["status"]["last_exit"], "exit code 0");
    let written = std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap();
    assert_eq!(written.lines().count(), 50, "the job's output");
    let logs = jobs(&server, &["logs", "evens", "--lines", "1000"]);
    assert!(text(&logs.stdout).contains("--- weibo serve: starting"), "{}", text(&logs.stdout));
    let bad_file = jobs(&server, &["submit", "again", "--yaml", &write(dir.path(), "bad.yaml", BAD)]);
    assert_eq!(bad_file.status.code(), Some(1));
    assert!(text(&bad_file.stderr).contains("no field `m`"), "{}", text(&bad_file.stderr));

    // A program: listed running, stopped (SIGTERM, no admin API), removed.
    let sleeper = jobs(&server, &["submit", "sleeper", "--", "sleep", "600"]);
    assert_eq!(sleeper.status.code(), Some(0), "{}", text(&sleeper.stderr));
    let running = wait_phase(&server, "sleeper", "running");
    let pid = running["status"]["pid"].as_u64().unwrap();
    let list = text(&jobs(&server, &["list"]).stdout);
    assert!(list.contains("evens: finished"), "{list}");
    assert!(list.contains(&format!("sleeper: running (process {pid} started), 0 restarts, process {pid}")), "{list}");
    let taken = jobs(&server, &["submit", "sleeper", "--", "true"]);
    assert_eq!(taken.status.code(), Some(1));
    assert!(
        text(&taken.stderr).contains("409 Conflict: a job named `sleeper` exists already"),
        "{}",
        text(&taken.stderr)
    );
    let busy = jobs(&server, &["remove", "sleeper"]);
    assert_eq!(busy.status.code(), Some(1));
    assert!(text(&busy.stderr).contains("job `sleeper` is running: stop or cancel it first"), "{}", text(&busy.stderr));
    let stopped = jobs(&server, &["stop", "sleeper"]);
    assert_eq!(stopped.status.code(), Some(0), "{}", text(&stopped.stderr));
    assert!(text(&stopped.stdout).starts_with("sleeper: stopped (stopped on request)"), "{}", text(&stopped.stdout));
    let status = text(&jobs(&server, &["status", "sleeper"]).stdout);
    assert!(status.contains("running -> stopping: stop asked: SIGTERM"), "{status}");
    let removed = jobs(&server, &["remove", "sleeper"]);
    assert_eq!(removed.status.code(), Some(0), "{}", text(&removed.stderr));

    let missing = jobs(&server, &["status", "nope"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains("404 Not Found: no job named `nope`"), "{}", text(&missing.stderr));

    // A second control plane on the same directory is refused.
    let second = weibo(&["serve", "--dir", &dir.path().join("plane").display().to_string(), "--listen", "127.0.0.1:0"]);
    assert_eq!(second.status.code(), Some(1));
    assert!(text(&second.stderr).contains("another control plane has the directory"), "{}", text(&second.stderr));
}
