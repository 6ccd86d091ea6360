//! The exactly-once S3 sink against a local S3 server (moto): a child
//! process writes events through it, is killed with SIGKILL at random
//! moments (and at chosen points: between a part's publication and the
//! deletion of its pending copy, after a pre-commit, after a manifest) and
//! started again until it finishes; the published parts must then hold
//! every event exactly once, with nothing left pending.
//!
//! The child is this test binary itself, started with `WEIBO_S3_CHILD`
//! set, running only the `child` test.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use weibo::Job;
use weibo::checkpoint::CheckpointStorage;
use weibo::sources::Generator;
use weibo_connectors::s3_sink::S3Sink;
use weibo_tests::crash;
use weibo_tests::s3_server::{server, storage, unique_bucket};

const EVENTS: u64 = 8_000;

fn job(bucket: &str, checkpoints: &Path) -> Job {
    let job = Job::new("s3-out").with_checkpoints(checkpoints, Duration::from_millis(100));
    job.source(Generator::new(EVENTS, |i| (i, format!("event {i}"))).with_partitions(2).with_rate(4_000.0))
        .name("events")
        // Small parts: several per epoch, rolled by size and by age.
        .sink_exactly_once(
            S3Sink::json_lines(storage(bucket, "out"))
                .with_roll_bytes(16 << 10)
                .with_roll_interval(Duration::from_millis(50)),
        );
    job
}

#[test]
fn child() {
    let Ok(spec) = std::env::var("WEIBO_S3_CHILD") else { return };
    let (bucket, checkpoints) = spec.split_once('|').unwrap();
    weibo::testing::block_on(job(bucket, Path::new(checkpoints)).run()).unwrap();
}

/// One life of the child; `true` when it finished.
fn live(bucket: &str, checkpoints: &Path, after: Duration, crash_at: Option<&str>) -> bool {
    let mut cmd = crash::child_command("child", "WEIBO_S3_CHILD", format!("{bucket}|{}", checkpoints.display()));
    cmd.env("WEIBO_S3_ENDPOINT", &server().endpoint);
    crash::run_child(cmd, after, crash_at)
}

/// Every line of every published part, sorted; and what is still pending.
fn published(bucket: &str) -> (Vec<String>, Vec<String>) {
    let s = storage(bucket, "out");
    let names = s.list("").unwrap();
    let pending: Vec<String> = names.iter().filter(|n| n.starts_with("_pending/")).cloned().collect();
    let mut lines = Vec::new();
    for name in names.iter().filter(|n| n.starts_with("part-")) {
        let mut text = String::new();
        s.open(name).unwrap().read_to_string(&mut text).unwrap();
        assert!(text.ends_with('\n'), "{name} is whole");
        lines.extend(text.lines().map(str::to_string));
    }
    lines.sort();
    (lines, pending)
}

fn expected() -> Vec<String> {
    let mut v: Vec<String> = (0..EVENTS).map(|i| serde_json::to_string(&(i, format!("event {i}"))).unwrap()).collect();
    v.sort();
    v
}

fn assert_exactly_once(bucket: &str, what: &str) {
    let (lines, pending) = published(bucket);
    assert!(pending.is_empty(), "{what}: parts left pending: {pending:?}");
    let want = expected();
    if lines != want {
        let mut dup = lines.clone();
        dup.dedup();
        panic!("{what}: {} lines published, {} distinct, {} expected", lines.len(), dup.len(), want.len());
    }
}

#[test]
fn killed_again_and_again_every_event_is_published_once() {
    if std::env::var("WEIBO_S3_CHILD").is_ok() {
        return;
    }
    let bucket = unique_bucket("killed");
    let dir = tempfile::tempdir().unwrap();
    let mut times = crash::kill_times(5, 200..1100);
    let mut lives = 0;
    loop {
        lives += 1;
        assert!(lives < 40, "the job did not finish in 40 lives");
        let after = if lives % 4 == 0 { Duration::from_secs(120) } else { times.next().unwrap() };
        if live(&bucket, dir.path(), after, None) {
            break;
        }
        // Between lives nothing half-written is visible: published parts
        // are whole lines of events, each at most once.
        let (lines, _) = published(&bucket);
        let mut distinct = lines.clone();
        distinct.dedup();
        assert_eq!(distinct.len(), lines.len(), "after life {lives}: a part published twice");
    }
    assert!(lives > 2, "killed at least twice ({lives} lives)");
    assert_exactly_once(&bucket, &format!("after {lives} lives"));
}

#[test]
fn dying_at_each_point_of_a_commit_publishes_every_event_once() {
    if std::env::var("WEIBO_S3_CHILD").is_ok() {
        return;
    }
    // (Not `between-final-commits`: whether the final checkpoint holds two
    // commits depends on when each instance's input ends.)
    for point in
        ["pre-commit-after#3", "after-manifest#2", "s3-after-publish#3", "final-barrier", "after-final-manifest"]
    {
        let bucket = unique_bucket("point");
        let dir = tempfile::tempdir().unwrap();
        assert!(
            !live(&bucket, dir.path(), Duration::from_secs(120), Some(point)),
            "{point}: the first life did not die there"
        );
        let mut lives = 1;
        while !live(&bucket, dir.path(), Duration::from_secs(120), None) {
            lives += 1;
            assert!(lives < 4, "{point}: the job did not finish");
        }
        assert_exactly_once(&bucket, point);
    }
}

#[test]
fn the_sink_writes_to_a_local_directory_too() {
    if std::env::var("WEIBO_S3_CHILD").is_ok() {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let cps = tempfile::tempdir().unwrap();
    let job = Job::new("dir-out").with_checkpoints(cps.path(), Duration::from_millis(30));
    job.source(Generator::new(2_000, |i| i))
        .sink_exactly_once(S3Sink::json_lines(weibo::checkpoint::LocalDir::new(out.path())).with_roll_bytes(1_000));
    weibo::testing::block_on(job.run()).unwrap();
    let storage = weibo::checkpoint::LocalDir::new(out.path());
    let names = storage.list("").unwrap();
    assert!(names.iter().all(|n| n.starts_with("part-")), "{names:?}");
    assert!(names.len() > 5, "rolled by size: {} parts", names.len());
    let mut all: Vec<u64> = Vec::new();
    for n in names {
        let mut text = String::new();
        storage.open(&n).unwrap().read_to_string(&mut text).unwrap();
        all.extend(text.lines().map(|l| l.parse::<u64>().unwrap()));
    }
    all.sort_unstable();
    assert_eq!(all, (0..2_000).collect::<Vec<_>>());
}
