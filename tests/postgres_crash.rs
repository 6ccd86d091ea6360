//! Crash tests of the exactly-once Postgres sink against a real server: a
//! child process runs three pipelines into three tables (every event
//! appended, the table refusing every 500th into a dead-letter table; a
//! running sum per key upserted; tumbling-window counts appended), is
//! killed with SIGKILL at random moments and restarted until
//! it finishes, and the tables must equal those of a run that never
//! crashed: no row lost, none twice. Then the same with the process dying
//! at chosen points: at its first start, between a pre-commit and its
//! checkpoint, between the manifest and the commits, between the
//! database's commit and the job's acknowledgement, and at the end of the
//! input (the final checkpoint's barrier, manifest and commits).
//!
//! The child is this test binary itself, started with `WEIBO_PG_CHILD`
//! set, running only the `child` test.

use std::path::Path;
use std::time::Duration;

use weibo::Job;
use weibo::sources::Generator;
use weibo::time::WatermarkStrategy;
use weibo::window::Tumbling;
use weibo_connectors::postgres::{PostgresSink, Rejected};
use weibo_tests::crash;
use weibo_tests::postgres_server::{execute, rows, server, unique};

const EVENTS: u64 = 6_000;

/// Event `i`: `(id, key, amount, time)`; time goes up by 1 ms an event.
type Event = (i64, i64, i64, i64);

fn event(i: u64) -> Event {
    (i as i64, (i % 17) as i64, (i % 11) as i64 + 1, i as i64)
}

fn tables(prefix: &str) -> [String; 4] {
    [format!("{prefix}_events"), format!("{prefix}_totals"), format!("{prefix}_windows"), format!("{prefix}_refused")]
}

fn create_tables(prefix: &str) {
    let [events, totals, windows, _] = tables(prefix);
    // The check refuses every 500th event: those go to the dead-letter
    // table, through the commits' row-by-row path.
    execute(&format!(
        "CREATE TABLE {events} (id int8 NOT NULL CHECK (id % 500 <> 499), key int8 NOT NULL, amount int8 NOT NULL); \
         CREATE TABLE {totals} (key int8 PRIMARY KEY, total int8 NOT NULL, last int8 NOT NULL); \
         CREATE TABLE {windows} (key int8 NOT NULL, start int8 NOT NULL, count int8 NOT NULL)"
    ));
}

fn pipeline(url: &str, prefix: &str, checkpoints: &Path, paced: bool) -> Job {
    let [events, totals, windows, refused] = tables(prefix);
    let job = Job::new("pg-crash").with_checkpoints(checkpoints, Duration::from_millis(100)).with_max_key_groups(32);
    let mut source = Generator::new(EVENTS, event).with_partitions(2);
    if paced {
        source = source.with_rate(3_000.0);
    }
    let input = job
        .source(source)
        .name("events")
        .with_timestamps(|e: &Event| e.3, WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO));
    input.sink_exactly_once(
        PostgresSink::builder(url, &events)
            .with_column("id", |e: &Event| e.0)
            .with_column("key", |e: &Event| e.1)
            .with_column("amount", |e: &Event| e.2)
            .with_chunk_rows(200)
            .with_rejected(Rejected::DeadLetterTable(refused))
            .build()
            .unwrap(),
    );
    input
        .key_by(|e: &Event| e.1)
        .with_partitions(2)
        // The highest id so far, not the last: which partition's event
        // comes last differs from run to run.
        .reduce(|a, b| (a.0.max(b.0), a.1, a.2 + b.2, b.3))
        .name("running")
        .sink_exactly_once(
            PostgresSink::builder(url, &totals)
                .with_column("key", |e: &Event| e.1)
                .with_column("total", |e: &Event| e.2)
                .with_column("last", |e: &Event| e.0)
                .with_upsert_keys(["key"])
                .with_chunk_rows(100)
                .build()
                .unwrap(),
        );
    input
        .key_by(|e: &Event| e.1)
        .with_partitions(2)
        .window(Tumbling::of(Duration::from_millis(250)))
        // Kept after they fire: a restored job must not fire them again.
        .allowed_lateness(Duration::from_millis(500))
        .reduce(|a, b| (a.0, a.1, a.2 + b.2, a.3.max(b.3)))
        .name("windows")
        .map(|r: weibo::window::WindowResult<i64, Event>| (r.key, r.window.start, r.value.2))
        .sink_exactly_once(
            PostgresSink::builder(url, &windows)
                .with_column("key", |w: &(i64, i64, i64)| w.0)
                .with_column("start", |w: &(i64, i64, i64)| w.1)
                .with_column("count", |w: &(i64, i64, i64)| w.2)
                .build()
                .unwrap(),
        );
    job
}

/// The child's life: run the pipeline to the end.
#[test]
fn child() {
    let Ok(spec) = std::env::var("WEIBO_PG_CHILD") else { return };
    let (prefix, checkpoints) = spec.split_once('|').unwrap();
    let job = pipeline(&server().url, prefix, Path::new(checkpoints), true);
    weibo::testing::block_on(job.run()).unwrap();
}

/// What the four tables hold, each as sorted rows of text.
fn contents(prefix: &str) -> [Vec<String>; 4] {
    let [events, totals, windows, refused] = tables(prefix);
    let read = |q: String| -> Vec<String> {
        rows(&q)
            .into_iter()
            .map(|r| r.into_iter().map(|c| c.unwrap_or_default()).collect::<Vec<_>>().join(","))
            .collect()
    };
    [
        read(format!("SELECT id, key, amount FROM {events} ORDER BY id, key, amount")),
        read(format!("SELECT key, total, last FROM {totals} ORDER BY key")),
        read(format!("SELECT key, start, count FROM {windows} ORDER BY key, start, count")),
        read(format!(
            "SELECT source, partition, \"offset\", row FROM {refused} ORDER BY source, partition, \"offset\", row"
        )),
    ]
}

fn reference() -> &'static [Vec<String>; 4] {
    static REFERENCE: std::sync::OnceLock<[Vec<String>; 4]> = std::sync::OnceLock::new();
    REFERENCE.get_or_init(|| {
        let prefix = unique("reference");
        create_tables(&prefix);
        let dir = tempfile::tempdir().unwrap();
        weibo::testing::block_on(pipeline(&server().url, &prefix, dir.path(), false).run()).unwrap();
        let out = contents(&prefix);
        assert_eq!(out[0].len() as u64, EVENTS - EVENTS / 500);
        assert_eq!(out[3].len() as u64, EVENTS / 500, "{:?}", out[3]);
        assert!(out[3].iter().all(|r| r.starts_with("events,")), "{:?}", out[3]);
        assert_eq!(out[1].len(), 17);
        assert!(out[2].len() > 300, "windows: {}", out[2].len());
        out
    })
}

/// Starts the child (dying at `crash_at` if given) and kills it after
/// `after`, unless it finishes or dies first; returns whether it finished.
fn live(prefix: &str, checkpoints: &Path, after: Duration, crash_at: Option<&str>) -> bool {
    let mut cmd = crash::child_command("child", "WEIBO_PG_CHILD", format!("{prefix}|{}", checkpoints.display()));
    cmd.env("WEIBO_PG_URL", &server().url);
    crash::run_child(cmd, after, crash_at)
}

fn assert_same_as_reference(prefix: &str, what: &str) {
    let got = contents(prefix);
    let want = reference();
    for (i, name) in ["events", "totals", "windows", "refused"].iter().enumerate() {
        if got[i] != want[i] {
            let missing: Vec<&String> = want[i].iter().filter(|r| !got[i].contains(r)).take(5).collect();
            let extra = got[i].len() as i64 - want[i].len() as i64;
            panic!(
                "{what}: table {name} differs from the crash-free run ({} rows against {}, {extra:+}); missing e.g. {missing:?}",
                got[i].len(),
                want[i].len()
            );
        }
    }
}

#[test]
fn killed_again_and_again_the_tables_equal_a_crash_free_run() {
    if std::env::var("WEIBO_PG_CHILD").is_ok() {
        return;
    }
    let _ = reference();
    let prefix = unique("killed");
    create_tables(&prefix);
    let dir = tempfile::tempdir().unwrap();
    let mut lives = 0;
    let mut times = crash::kill_times(11, 150..1050);
    loop {
        lives += 1;
        assert!(lives < 60, "the job did not finish in 60 lives");
        // Every fourth life runs to its end: progress even on a slow day.
        let after = if lives % 4 == 0 { Duration::from_secs(120) } else { times.next().unwrap() };
        if live(&prefix, dir.path(), after, None) {
            break;
        }
    }
    assert!(lives > 2, "the job was killed at least twice ({lives} lives)");
    assert_same_as_reference(&prefix, &format!("after {lives} lives"));
}

#[test]
fn dying_at_each_point_of_a_checkpoint_and_at_the_end_of_input_loses_and_duplicates_nothing() {
    if std::env::var("WEIBO_PG_CHILD").is_ok() {
        return;
    }
    let _ = reference();
    // (fault point, and how the first life ends there)
    let points = [
        // The first start, before any checkpoint completes.
        ("first start", None, Some(Duration::from_millis(60))),
        ("pre-commit-after#3", Some("pre-commit-after#3"), None),
        ("after-manifest#2", Some("after-manifest#2"), None),
        ("postgres-after-commit#1", Some("postgres-after-commit#1"), None),
        ("postgres-after-commit#7", Some("postgres-after-commit#7"), None),
        ("between-commits#4", Some("between-commits#4"), None),
        ("final-barrier", Some("final-barrier"), None),
        ("after-final-manifest", Some("after-final-manifest"), None),
        ("between-final-commits#2", Some("between-final-commits#2"), None),
    ];
    for (what, point, kill_after) in points {
        // A point of the final checkpoint is reached only if that
        // checkpoint has the work: `between-final-commits#2` needs the
        // sinks' last epochs to be committed with the final checkpoint,
        // not with a regular one whose barrier came after the sources'
        // ends. The coordinator takes the final checkpoint as soon as it
        // knows of the ends, but a regular barrier sent in the moment
        // before it does still takes the work. Such a first life starts
        // again from scratch, five times at most.
        let mut tries = 0;
        let (prefix, dir) = loop {
            tries += 1;
            let prefix = unique("point");
            create_tables(&prefix);
            let dir = tempfile::tempdir().unwrap();
            let first = live(&prefix, dir.path(), kill_after.unwrap_or(Duration::from_secs(120)), point);
            if !first {
                break (prefix, dir);
            }
            assert!(tries < 5, "{what}: the first life reached its end without dying there, {tries} times");
        };
        let mut lives = 1;
        while !live(&prefix, dir.path(), Duration::from_secs(120), None) {
            lives += 1;
            assert!(lives < 5, "{what}: the job did not finish");
        }
        assert_same_as_reference(&prefix, what);
    }
}

/// Two processes started on one job, 0 to 500 ms apart (a restart that
/// overlaps the old process): exactly one runs, the other is refused at
/// its start naming the holder, and the tables equal a crash-free run's.
#[test]
fn two_processes_on_one_job_one_runs_and_the_tables_equal_a_crash_free_run() {
    if std::env::var("WEIBO_PG_CHILD").is_ok() {
        return;
    }
    let _ = reference();
    for apart in [0, 200, 500] {
        let prefix = unique("two");
        create_tables(&prefix);
        let dir = tempfile::tempdir().unwrap();
        let command = || {
            let mut cmd = crash::child_command("child", "WEIBO_PG_CHILD", format!("{prefix}|{}", dir.path().display()));
            cmd.env("WEIBO_PG_URL", &server().url);
            cmd
        };
        let ended = crash::run_two_apart(command(), command(), Duration::from_millis(apart));
        crash::assert_exactly_one_ran(&ended);
        assert_same_as_reference(&prefix, &format!("{apart} ms apart"));
    }
}
