//! Crash test: a child process runs a windowed pipeline (a running sum,
//! session windows, tumbling windows kept for their allowed lateness)
//! from a file to the
//! exactly-once file sink with checkpoints every 150 ms; it is killed with
//! SIGKILL at random moments and started again, until it finishes. Its
//! committed output must equal that of a run that never crashed: every
//! window result once, none missing, none twice. Then the same with the
//! keyed stage rescaled from 2 to 3 partitions between two lives.
//!
//! The child is this test binary itself, started with `WEIBO_CRASH_CHILD`
//! set, running only the `child` test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use weibo::Job;
use weibo::sinks::TxnFileSink;
use weibo::sources::FileSource;
use weibo::time::WatermarkStrategy;
use weibo::window::{Session, Tumbling};
use weibo_tests::crash;

const LINES: usize = 12_000;

/// Line `i`: `key,value,time`; time goes up by 1 ms a line, and by 50 ms
/// more every 100 lines (so that sessions close).
fn write_input(path: &Path) {
    let mut text = String::new();
    for i in 0..LINES {
        text.push_str(&format!("{},{},{}\n", i % 13, i % 100, i + i / 100 * 50));
    }
    std::fs::write(path, text).unwrap();
}

fn parse(line: &String) -> Result<(u32, u64, i64), String> {
    let mut parts = line.split(',');
    let mut next = || parts.next().ok_or_else(|| format!("short line `{line}`"));
    let key = next()?.parse().map_err(|e| format!("{e}"))?;
    let value = next()?.parse().map_err(|e| format!("{e}"))?;
    let time = next()?.parse().map_err(|e| format!("{e}"))?;
    Ok((key, value, time))
}

/// Where the child keeps its state: in memory, or on fjall in a directory
/// with a cache of two or three values per state (so values are written back to fjall
/// and read again all the time), and the session windows' timers in fjall
/// behind that cache too (timers in memory are the in-memory backend's,
/// which the run in memory covers).
fn backend(state: Option<&Path>) -> Option<weibo::state::FjallBackend> {
    state.map(|dir| {
        weibo::state::FjallBackend::builder(dir).with_object_cache(512).with_timers_on_disk(true).open().unwrap()
    })
}

fn pipeline(input: &Path, out: &Path, checkpoints: &Path, partitions: usize, slow: bool, state: Option<&Path>) -> Job {
    let mut job = Job::new("crash").with_checkpoints(checkpoints, Duration::from_millis(150)).with_max_key_groups(32);
    if let Some(fjall) = backend(state) {
        job = job.with_state_backend(fjall);
    }
    job.source(FileSource::lines(input))
        .name("lines")
        .process(weibo::on_error::Fail, parse)
        .name("parse")
        .map(move |e: (u32, u64, i64)| {
            if slow && e.2 % 10 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            e
        })
        .name("pace")
        .with_timestamps(|e: &(u32, u64, i64)| e.2, WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO))
        .key_by(|e: &(u32, u64, i64)| e.0)
        .with_partitions(partitions)
        // A running sum per key (value state, checkpointed incrementally),
        // then sums per session (session state and timers, set, moved and
        // fired all the time), then windowed sums of those (window state).
        .reduce(|a, b| (a.0, a.1 + b.1, b.2))
        .name("running")
        .key_by(|e: &(u32, u64, i64)| e.0)
        .with_partitions(partitions)
        .window(Session::with_gap(Duration::from_millis(20)))
        .reduce(|a, b| (a.0, a.1 + b.1, a.2.max(b.2)))
        .name("sessions")
        .map(|r: weibo::window::WindowResult<u32, (u32, u64, i64)>| r.value)
        .name("session-sums")
        .key_by(|e: &(u32, u64, i64)| e.0)
        .with_partitions(partitions)
        .window(Tumbling::of(Duration::from_millis(100)))
        // Kept after they fire: a restored job must not fire them again.
        .allowed_lateness(Duration::from_millis(300))
        .reduce(|a, b| (a.0, a.1 + b.1, a.2.max(b.2)))
        .name("sums")
        .map(|r: weibo::window::WindowResult<u32, (u32, u64, i64)>| (r.key, r.window.start, r.value.1))
        .name("results")
        .sink_exactly_once(TxnFileSink::json_lines(out));
    job
}

/// The child's life: run the pipeline to the end.
#[test]
fn child() {
    let Ok(spec) = std::env::var("WEIBO_CRASH_CHILD") else { return };
    let parts: Vec<&str> = spec.split('|').collect();
    let (input, out, cps, partitions) = (parts[0], parts[1], parts[2], parts[3].parse().unwrap());
    let state = parts.get(4).filter(|s| !s.is_empty()).map(Path::new);
    let job = pipeline(Path::new(input), Path::new(out), Path::new(cps), partitions, true, state);
    weibo::testing::block_on(job.run()).unwrap();
}

/// Committed output: every line of every committed file, counted.
fn committed(out: &Path) -> BTreeMap<String, usize> {
    crash::committed_lines(out)
}

struct Dirs {
    _root: tempfile::TempDir,
    input: PathBuf,
    out: PathBuf,
    checkpoints: PathBuf,
    /// fjall's directory, for a child on fjall.
    state: Option<PathBuf>,
}

fn dirs() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let input = root.path().join("input.txt");
    write_input(&input);
    let (out, checkpoints) = (root.path().join("out"), root.path().join("checkpoints"));
    Dirs { input, out, checkpoints, state: None, _root: root }
}

/// Starts the child and kills it after `after`, unless it finishes first;
/// returns whether it finished (successfully).
fn live(d: &Dirs, partitions: usize, after: Duration) -> bool {
    let state = d.state.as_ref().map(|s| s.display().to_string()).unwrap_or_default();
    let spec = format!("{}|{}|{}|{partitions}|{state}", d.input.display(), d.out.display(), d.checkpoints.display());
    crash::run_child(crash::child_command("child", "WEIBO_CRASH_CHILD", spec), after, None)
}

/// Lives of `partitions(life)` partitions until one finishes (see
/// [`crash::lives_until_done`]); returns the number of lives.
fn lives_until_done(d: &Dirs, seed: u64, least: u64, partitions: impl Fn(usize) -> usize) -> usize {
    crash::lives_until_done(&d.out, seed, least, |life, after| live(d, partitions(life), after))
}

fn reference() -> BTreeMap<String, usize> {
    let d = dirs();
    let job = pipeline(&d.input, &d.out, &d.checkpoints, 2, false, None);
    weibo::testing::block_on(job.run()).unwrap();
    let out = committed(&d.out);
    assert!(out.len() > 1000, "the reference run produced its windows: {}", out.len());
    assert!(out.values().all(|n| *n == 1));
    out
}

#[test]
fn killed_again_and_again_the_job_commits_exactly_what_a_clean_run_does() {
    if std::env::var("WEIBO_CRASH_CHILD").is_ok() {
        return;
    }
    killed_again_and_again(dirs(), 7);
}

#[test]
fn on_fjall_with_a_small_cache_killed_again_and_again_the_job_commits_exactly_what_a_clean_run_does() {
    if std::env::var("WEIBO_CRASH_CHILD").is_ok() {
        return;
    }
    let mut d = dirs();
    d.state = Some(d._root.path().join("state"));
    killed_again_and_again(d, 13);
}

/// Kills the child at pseudo-random moments (`seed`) until it finishes,
/// then compares its committed output with a run in memory that never
/// crashed.
fn killed_again_and_again(d: Dirs, seed: u64) {
    let want = reference();
    // A child on fjall starts more slowly (see `lives_until_done`): it
    // starts with longer lives.
    let least = if d.state.is_some() { 500 } else { 250 };
    let kills = lives_until_done(&d, seed, least, |_| 2) - 1;
    assert!(kills >= 3, "the child was killed mid-run several times ({kills})");
    let got = committed(&d.out);
    crash::assert_committed_once(&got, &want);
}

#[test]
fn rescaled_from_two_to_three_partitions_between_lives_the_output_is_the_same() {
    if std::env::var("WEIBO_CRASH_CHILD").is_ok() {
        return;
    }
    let want = reference();
    let d = dirs();
    let lives = lives_until_done(&d, 11, 250, |life| if life < 2 { 2 } else { 3 });
    assert!(lives >= 3, "at least one life on 2 partitions was cut short and one ran on 3");
    assert_eq!(committed(&d.out), want);
}

/// The child of the first-start test: opens a fjall backend in the
/// directory `WEIBO_FJALL_START_CHILD` names and runs a small checkpointed
/// job on it.
#[test]
fn fjall_start_child() {
    let Ok(dir) = std::env::var("WEIBO_FJALL_START_CHILD") else { return };
    let dir = Path::new(&dir);
    let backend = weibo::state::FjallBackend::open(dir.join("state")).unwrap();
    let job = Job::new("first-start")
        .with_state_backend(backend)
        .with_checkpoints(dir.join("checkpoints"), Duration::from_millis(20));
    job.source(weibo::sources::IterSource::new(0..2_000u64))
        .key_by(|n: &u64| n % 7)
        .reduce(|a, b| a + b)
        .sink(weibo::sinks::Blackhole::new());
    weibo::testing::block_on(job.run()).unwrap();
}

/// A job on fjall killed (SIGKILL) in its first moments, while fjall
/// creates its database, again and again: each time, the next start runs.
/// (fjall writes its version marker last; a directory killed before it was
/// refused by every later start.)
#[test]
fn killed_while_fjall_creates_its_database_the_next_start_runs() {
    if std::env::var("WEIBO_CRASH_CHILD").is_ok() || std::env::var("WEIBO_FJALL_START_CHILD").is_ok() {
        return;
    }
    let start = |dir: &Path| {
        crash::child_command("fjall_start_child", "WEIBO_FJALL_START_CHILD", dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut cut_short = 0;
    // fjall creates a database in a millisecond or two: the kill comes
    // when its lock file appears (the first thing it creates), and 0 to
    // 2 ms after that.
    let mut delays = crash::kill_times(17, 0..500).map(|d| Duration::from_micros((d.as_millis() as u64 % 41) * 50));
    for _ in 0..60 {
        let root = tempfile::tempdir().unwrap();
        let mut child = start(root.path());
        // (Waiting for the child's word would come too late: the database
        // is created by the time a pipe wakes the parent.)
        let lock = root.path().join("state").join("lock");
        let watching = Instant::now();
        while !lock.exists() && watching.elapsed() < Duration::from_secs(2) {
            std::hint::spin_loop();
        }
        let delay = delays.next().unwrap();
        let spin = Instant::now();
        while spin.elapsed() < delay {
            std::hint::spin_loop();
        }
        let _ = child.kill();
        child.wait().unwrap();
        let state = root.path().join("state");
        if state.join("lock").exists() && !state.join("version").exists() {
            cut_short += 1;
        }
        let again = start(root.path()).wait_with_output().unwrap();
        assert!(
            again.status.success(),
            "the start after a kill failed:\n{}",
            String::from_utf8_lossy(&again.stderr).lines().take(40).collect::<Vec<_>>().join("\n")
        );
    }
    eprintln!("{cut_short} of 60 kills left fjall's database half created");
    assert!(cut_short > 0, "no kill came while fjall created its database: the test did not test it");
}
