//! `TxnFileSink`'s parts: rolled by size within an epoch, and kept open
//! across checkpoints (in progress) until they roll by age. A job killed
//! with SIGKILL at random moments, again and again, commits every record
//! once; parts that span checkpoints are fewer than the checkpoints.
//!
//! The child is this test binary itself, started with `WEIBO_PARTS_CHILD`
//! set, running only the `child` test.

use std::path::Path;
use std::time::Duration;

use weibo::Job;
use weibo::sinks::TxnFileSink;
use weibo::sources::Generator;
use weibo_tests::crash;
use weibo_tests::schedule::{self, Count, KEYS};

const IDS: u64 = 4_000;

fn job(root: &Path, spanning: bool) -> Job {
    let job = Job::new("parts").with_checkpoints(root.join("checkpoints"), Duration::from_millis(50));
    let sink = if spanning {
        TxnFileSink::json_lines(root.join("out"))
            .parts_span_checkpoints()
            .with_roll_interval(Duration::from_millis(300))
    } else {
        TxnFileSink::json_lines(root.join("out")).with_roll_bytes(2_000)
    };
    job.source(Generator::new(IDS, |id| id).with_rate(2_000.0))
        .map(|id: u64| Count { key: id % KEYS, id, count: 1 })
        .key_by(|c: &Count| c.key)
        .with_partitions(2)
        .reduce(|acc, c| Count { key: c.key, id: c.id, count: acc.count + 1 })
        .sink_exactly_once(sink);
    job
}

#[test]
fn child() {
    let Ok(spec) = std::env::var("WEIBO_PARTS_CHILD") else { return };
    let (mode, root) = spec.split_once('|').unwrap();
    weibo::testing::block_on(job(Path::new(root), mode == "spanning").run()).unwrap();
}

fn committed(out: &Path) -> (Vec<Count>, usize) {
    let mut records = Vec::new();
    let mut files = 0;
    for entry in std::fs::read_dir(out).unwrap().flatten() {
        if entry.path().is_file() {
            files += 1;
            let text = std::fs::read_to_string(entry.path()).unwrap();
            records.extend(text.lines().map(|l| serde_json::from_str::<Count>(l).unwrap()));
        }
    }
    (records, files)
}

/// Lives killed soon after their start, then one to the end.
fn killed_again_and_again(mode: &str) -> (Vec<Count>, usize, u64) {
    let root = tempfile::tempdir().unwrap();
    let mut times = crash::kill_times(7, 100..400);
    let mut lives = 0;
    loop {
        lives += 1;
        assert!(lives < 40, "{mode}: the job did not finish in 40 lives");
        // Five lives killed 100 to 400 ms after their start, then to the end.
        let kill_at = times.next().unwrap();
        let after = if lives > 5 { Duration::from_secs(60) } else { kill_at };
        let cmd = crash::child_command("child", "WEIBO_PARTS_CHILD", format!("{mode}|{}", root.path().display()));
        let finished = crash::run_child(cmd, after, None);
        let (records, _) = committed(&root.path().join("out"));
        if let Err(e) = schedule::check(&records, IDS, finished) {
            panic!("{mode}, after life {lives}: {e}");
        }
        if finished {
            break;
        }
    }
    let (records, files) = committed(&root.path().join("out"));
    let checkpoints = weibo::checkpoint::complete_checkpoints(&root.path().join("checkpoints"))[0].0.get();
    assert!(std::fs::read_dir(root.path().join("out/.pending")).unwrap().count() == 0, "{mode}: nothing left pending");
    (records, files, checkpoints)
}

#[test]
fn parts_rolled_by_size_commit_every_record_once_across_kills() {
    if std::env::var("WEIBO_PARTS_CHILD").is_ok() {
        return;
    }
    let (records, files, _) = killed_again_and_again("size");
    assert_eq!(records.len() as u64, IDS);
    // 4,000 records of about 40 bytes in parts of 2,000 bytes.
    assert!(files >= 60, "parts close by size within epochs: {files} files");
}

#[test]
fn parts_spanning_checkpoints_commit_every_record_once_across_kills() {
    if std::env::var("WEIBO_PARTS_CHILD").is_ok() {
        return;
    }
    let (records, files, checkpoints) = killed_again_and_again("spanning");
    assert_eq!(records.len() as u64, IDS);
    // Two writers; a part lives 300 ms across checkpoints of 50 ms.
    assert!((files as u64) < checkpoints, "{files} files for {checkpoints} checkpoints");
}
