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
    assert!(plan.contains("filter `filter`"), "{plan}");
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
