//! Two processes started on one job (a restart that overlaps the old
//! process, two pods on one volume), 0 to 500 ms apart: exactly one runs,
//! the other is refused at its start naming the holder, and the committed
//! output holds every record exactly once. With the file sink and
//! checkpoints in a local directory, and with the S3 sink and checkpoints
//! in S3. (The Kafka and Postgres sinks have the same test beside their
//! other crash tests.)
//!
//! The children are this test binary itself, started with
//! `WEIBO_TWO_CHILD` set, running only the `child` test.

use std::io::Read as _;
use std::path::Path;
use std::time::Duration;

use weibo::checkpoint::CheckpointStorage;
use weibo::sinks::{Blackhole, TxnFileSink};
use weibo::sources::Generator;
use weibo::{DeadLetter, Job, Stream, on_error};
use weibo_connectors::s3_sink::S3Sink;
use weibo_tests::crash;
use weibo_tests::s3_server;
use weibo_tests::schedule::{self, Count, KEYS};

const IDS: u64 = 6_000;
/// Ids per second: a run takes 1.5 s, longer than the furthest apart two
/// processes start.
const RATE: f64 = 4_000.0;

/// Every 97th id is refused into the dead letters.
fn refused(id: u64) -> bool {
    id.is_multiple_of(97)
}

/// The pipeline: a running count per key into one exactly-once sink, the
/// refused ids into another (dead letters).
fn pipeline(job: &Job, out: impl FnOnce(Stream<Count>), dead: impl FnOnce(Stream<u64>)) {
    let ids = job.source(Generator::new(IDS, |id| id).with_rate(RATE)).name("ids");
    let (kept, letters) =
        ids.process(on_error::DeadLetter, |id: &u64| if refused(*id) { Err(format!("refused {id}")) } else { Ok(*id) });
    kept.name("check").sink(Blackhole::new()).name("kept");
    dead(letters.map(|d: DeadLetter<u64>| d.record).name("letters"));
    out(ids
        .map(|id: u64| Count { key: id % KEYS, id, count: 1 })
        .key_by(|c: &Count| c.key)
        .with_partitions(2)
        .reduce(|acc, c| Count { key: c.key, id: c.id, count: acc.count + 1 })
        .name("counts"));
}

fn file_job(root: &Path) -> Job {
    let job = Job::new("two").with_checkpoints(root.join("checkpoints"), Duration::from_millis(100));
    pipeline(
        &job,
        |counts| {
            counts.sink_exactly_once(TxnFileSink::json_lines(root.join("out"))).name("out");
        },
        |dead| {
            dead.sink_exactly_once(TxnFileSink::json_lines(root.join("dead"))).name("dead");
        },
    );
    job
}

fn s3_job(bucket: &str) -> Job {
    let storage = s3_server::storage(bucket, "checkpoints");
    let job = Job::new("two").with_checkpoint_storage(storage, Duration::from_millis(100));
    pipeline(
        &job,
        |counts| {
            counts.sink_exactly_once(S3Sink::json_lines(s3_server::storage(bucket, "out"))).name("out");
        },
        |dead| {
            dead.sink_exactly_once(S3Sink::json_lines(s3_server::storage(bucket, "dead"))).name("dead");
        },
    );
    job
}

/// A child's life: `file|<root>` or `s3|<bucket>`, run to the end.
#[test]
fn child() {
    let Ok(spec) = std::env::var("WEIBO_TWO_CHILD") else { return };
    let _ = tracing_subscriber::fmt().with_writer(std::io::stderr).try_init();
    let (kind, at) = spec.split_once('|').unwrap();
    let job = if kind == "file" { file_job(Path::new(at)) } else { s3_job(at) };
    weibo::testing::block_on(job.run()).unwrap();
}

fn command(spec: &str) -> std::process::Command {
    let mut cmd = crash::child_command("child", "WEIBO_TWO_CHILD", spec);
    cmd.env("WEIBO_S3_ENDPOINT", &s3_server::server().endpoint);
    cmd
}

/// Checks what was committed: every count once, as a crash-free run has
/// it, every id; every refused id once in the dead letters.
fn check(counts: &[Count], dead: &[u64], what: &str) {
    if let Err(e) = schedule::check(counts, IDS, true) {
        panic!("{what}: {e}");
    }
    let mut dead = dead.to_vec();
    dead.sort_unstable();
    let want: Vec<u64> = (0..IDS).filter(|id| refused(*id)).collect();
    assert_eq!(dead, want, "{what}: every refused id once in the dead letters");
}

fn lines_of<T: serde::de::DeserializeOwned>(text: &str) -> Vec<T> {
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The committed files of a `TxnFileSink` directory, parsed.
fn committed_files<T: serde::de::DeserializeOwned>(dir: &Path) -> Vec<T> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.path().is_file() {
            out.extend(lines_of(&std::fs::read_to_string(entry.path()).unwrap()));
        }
    }
    out
}

/// The published parts of an `S3Sink` under `prefix` of `bucket`, parsed.
fn published<T: serde::de::DeserializeOwned>(bucket: &str, prefix: &str) -> Vec<T> {
    let s = s3_server::storage(bucket, prefix);
    let mut out = Vec::new();
    for name in s.list("part-").unwrap() {
        let mut text = String::new();
        s.open(&name).unwrap().read_to_string(&mut text).unwrap();
        out.extend(lines_of(&text));
    }
    out
}

const APART_MS: [u64; 4] = [0, 60, 250, 500];

#[test]
fn two_processes_on_one_file_sink_job_one_runs_and_every_record_is_committed_once() {
    if std::env::var("WEIBO_TWO_CHILD").is_ok() {
        return;
    }
    for apart in APART_MS {
        let root = tempfile::tempdir().unwrap();
        let spec = format!("file|{}", root.path().display());
        let ended = crash::run_two_apart(command(&spec), command(&spec), Duration::from_millis(apart));
        crash::assert_exactly_one_ran(&ended);
        let what = format!("{apart} ms apart");
        check(&committed_files(&root.path().join("out")), &committed_files(&root.path().join("dead")), &what);
    }
}

#[test]
fn two_processes_on_one_s3_job_one_runs_and_every_record_is_published_once() {
    if std::env::var("WEIBO_TWO_CHILD").is_ok() {
        return;
    }
    for apart in APART_MS {
        let bucket = s3_server::unique_bucket("two");
        let spec = format!("s3|{bucket}");
        let ended = crash::run_two_apart(command(&spec), command(&spec), Duration::from_millis(apart));
        crash::assert_exactly_one_ran(&ended);
        let what = format!("{apart} ms apart");
        check(&published(&bucket, "out"), &published(&bucket, "dead"), &what);
    }
}
