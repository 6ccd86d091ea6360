//! A restore's progress bar (the `progress` feature): drawn on stderr when
//! it is a terminal (the test runs its job under `script`, which gives it a
//! pseudo-terminal), and not drawn when stderr is a pipe.

use std::process::Command;
use std::time::Duration;

use weibo::Job;
use weibo::sinks::Blackhole;
use weibo::sources::Generator;

const CHILD: &str = "WEIBO_PROGRESS_CHILD";

/// Totals of 200 000 keys, savepointed, then restored.
fn restore_a_savepoint() {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("progress").with_checkpoints(dir.path(), Duration::from_secs(3600));
    let totals = |job: &Job, count: u64| {
        job.source(Generator::new(count, |i| (i % 200_000, 1u64)))
            .key_by(|e: &(u64, u64)| e.0)
            .reduce(|a, b| (a.0, a.1 + b.1))
            .uid("totals")
            .sink(Blackhole::new());
    };
    totals(&job, 400_000);
    job.run_blocking().unwrap();
    let (_, last) = weibo::checkpoint::complete_checkpoints(dir.path()).remove(0);
    let restored = Job::new("progress").restore_from(&last);
    totals(&restored, 0);
    restored.run_blocking().unwrap();
}

fn run_child(under_terminal: bool) -> String {
    let exe = std::env::current_exe().unwrap();
    let test = format!("{} --exact a_restore_draws_a_bar_on_a_terminal_only --nocapture", exe.display());
    let mut command = if under_terminal {
        let mut c = Command::new("script");
        c.args(["-qec", &test, "/dev/null"]);
        c
    } else {
        let mut c = Command::new(&exe);
        c.args(["--exact", "a_restore_draws_a_bar_on_a_terminal_only", "--nocapture"]);
        c
    };
    let out = command
        .env(CHILD, "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run the child ({e}): is `script` installed?"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child failed: {text}");
    text
}

#[test]
fn a_restore_draws_a_bar_on_a_terminal_only() {
    if std::env::var(CHILD).is_ok() {
        restore_a_savepoint();
        return;
    }
    let terminal = run_child(true);
    assert!(
        terminal.contains("restoring") && terminal.contains("/200,000 entries"),
        "no bar on a terminal: {terminal}"
    );
    let piped = run_child(false);
    assert!(!piped.contains("entries ("), "a bar on a pipe: {piped}");
}
