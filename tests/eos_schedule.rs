//! Exactly once into `TxnFileSink` across random schedules of runs (see
//! `weibo_tests::schedule`): runs to the end, SIGKILLs at random moments
//! (the first start and the end of input among them), clean stops, and
//! aborts at every fault-injection point of the commit path; after every
//! run the committed files hold every id at most once with a crash-free
//! run's running count, and after a run to the end, every id.
//!
//! The child is this test binary itself, started with
//! `WEIBO_SCHEDULE_CHILD` set, running only the `child` test.

use std::path::{Path, PathBuf};
use std::time::Duration;

use weibo::Job;
use weibo::sinks::TxnFileSink;
use weibo::sources::Generator;
use weibo_tests::crash;
use weibo_tests::schedule::{self, Count, KEYS, Mode};

const IDS: u64 = 3_000;
/// Ids per second: a crash-free run takes about half a second.
const RATE: f64 = 6_000.0;

/// The job, as `mode` asks for it: restored from a savepoint for a
/// rollback; keyed by another type (which cannot restore the job's
/// checkpoints) for a refused version.
fn job(out: &Path, checkpoints: &Path, mode: &Mode) -> Job {
    let mut job = Job::new("schedule")
        .with_checkpoints(checkpoints, Duration::from_millis(100))
        .with_checkpoint_timeout(Duration::from_millis(400))
        .with_max_key_groups(16);
    if let Mode::Rollback(savepoint) = mode {
        job = job.restore_from(savepoint);
    }
    let rate = if schedule::slow() { RATE / 8.0 } else { RATE };
    let counts = job.source(Generator::new(IDS, |id| id).with_rate(rate)).name("ids").map(|id: u64| Count {
        key: id % KEYS,
        id,
        count: 1,
    });
    schedule::running_counts(counts, mode).name("counts").sink_exactly_once(TxnFileSink::json_lines(out));
    job
}

#[test]
fn child() {
    let Ok(spec) = std::env::var("WEIBO_SCHEDULE_CHILD") else { return };
    let parts: Vec<&str> = spec.split('|').collect();
    let mode = Mode::parse(parts[2]);
    let job = job(Path::new(parts[0]), Path::new(parts[1]), &mode);
    schedule::child_run(job, &mode);
}

struct Dirs {
    root: tempfile::TempDir,
}

impl Dirs {
    fn out(&self) -> PathBuf {
        self.root.path().join("out")
    }
    fn checkpoints(&self) -> PathBuf {
        self.root.path().join("checkpoints")
    }
}

/// The committed files' records (not the pending ones).
fn committed(out: &Path) -> Vec<Count> {
    let mut records = Vec::new();
    for entry in std::fs::read_dir(out).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_file() {
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                records
                    .push(serde_json::from_str(line).unwrap_or_else(|e| panic!("{}: {line:?}: {e}", path.display())));
            }
        }
    }
    records
}

#[test]
fn random_schedules_of_runs_kills_and_stops_commit_every_id_exactly_once() {
    if std::env::var("WEIBO_SCHEDULE_CHILD").is_ok() {
        return;
    }
    schedule::run_schedules(
        "file sink",
        IDS,
        Duration::from_secs_f64(IDS as f64 / RATE),
        5,
        Duration::from_millis(700),
        1..9,
        || Dirs { root: tempfile::tempdir().unwrap() },
        |d, mode| {
            let spec = format!("{}|{}|{mode}", d.out().display(), d.checkpoints().display());
            crash::child_command("child", "WEIBO_SCHEDULE_CHILD", spec)
        },
        Dirs::checkpoints,
        |d| committed(&d.out()),
    );
}
