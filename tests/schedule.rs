//! The exactly-once schedule, shared by the file-sink and Kafka tests: a
//! bounded job (ids `0..n`, keyed by `id % KEYS`, a running count per key
//! in keyed state, into an exactly-once sink) run again and again on the
//! same checkpoint directory and output, in random sequences of runs: to
//! the end, SIGKILLed at a random moment (from the first start to past the
//! end of input), SIGKILLed right after its first checkpoint, stopped
//! cleanly, or made to abort at a fault-injection point of the commit path
//! (`weibo::checkpoint::faults`), sometimes with a pre-commit slowed past
//! the checkpoint timeout so that several epochs wait at once. Every
//! sequence holds a run to the end before its last run, and ends with
//! one.
//!
//! After every run the committed output is checked: every id at most
//! once, each key's counts `1..m` with no gap, each with the id a
//! crash-free run gives it; after a run that reached its end, every id.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Keys of the input.
pub(crate) const KEYS: u64 = 40;

/// What the job writes: an id with its key's running count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Count {
    pub(crate) key: u64,
    pub(crate) id: u64,
    pub(crate) count: u64,
}

impl Count {
    /// What a crash-free run writes for `id`.
    pub(crate) fn of(id: u64) -> Self {
        Count { key: id % KEYS, id, count: id / KEYS + 1 }
    }
}

/// The commit-path points of `weibo::checkpoint::faults`.
pub(crate) const POINTS: &[&str] = &[
    "pre-commit-before",
    "pre-commit-after",
    "final-barrier",
    "after-manifest",
    "after-final-manifest",
    "between-commits",
    "between-final-commits",
    "after-commits",
];

/// One run of the job.
#[derive(Clone, Debug)]
pub(crate) enum Run {
    /// To the end of the input.
    End,
    /// SIGKILLed this long after its start (if still running).
    KillAfter(Duration),
    /// SIGKILLed as soon as it completed a checkpoint of its own; paced
    /// slowly (see [`SLOW`]), so that a run after a finished one completes
    /// that checkpoint while it reads the end of its input again.
    KillAtFirstCheckpoint,
    /// Stopped with `JobHandle::stop` once it completed a checkpoint of
    /// its own (or once it finished); paced slowly, as above.
    Stop,
    /// Aborts the `nth` time it reaches `point` (runs to the end if it
    /// never does); with `slow: Some(k)`, its `k`-th pre-commit takes
    /// longer than the checkpoint timeout, so a checkpoint is abandoned and
    /// the next one commits two epochs of that instance.
    Crash { point: &'static str, nth: u64, slow: Option<u64> },
}

/// Set in the child's environment for runs paced slowly: the job reads
/// its input several times slower.
pub(crate) const SLOW: &str = "WEIBO_SCHEDULE_SLOW";

/// Whether this child runs paced slowly.
pub(crate) fn slow() -> bool {
    std::env::var(SLOW).is_ok()
}

/// A small deterministic random sequence.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

/// A random sequence of runs for a job whose crash-free run takes about
/// `run` and completes about `checkpoints` checkpoints.
pub(crate) fn plan(seed: u64, run: Duration, checkpoints: u64) -> Vec<Run> {
    let mut rng = Rng::new(seed);
    let len = 5 + rng.below(4) as usize;
    let ms = run.as_millis() as u64;
    let mut out: Vec<Run> = (0..len)
        .map(|_| match rng.below(10) {
            0 => Run::End,
            // Anywhere from the first start to past the end of input.
            1..=3 => Run::KillAfter(Duration::from_millis(rng.below(ms * 3 / 2))),
            4 => Run::KillAtFirstCheckpoint,
            5 => Run::Stop,
            _ => {
                let point = POINTS[rng.below(POINTS.len() as u64) as usize];
                // How often a run reaches the point: the final checkpoint
                // once; a pre-commit once per sink instance (two) and
                // checkpoint; the others once per checkpoint.
                let nth = match point {
                    "final-barrier" | "after-final-manifest" | "between-final-commits" => 1,
                    "pre-commit-before" | "pre-commit-after" => 1 + rng.below(2 * checkpoints + 2),
                    _ => 1 + rng.below(checkpoints + 1),
                };
                let slow = (rng.below(3) == 0).then(|| 1 + rng.below(2 * checkpoints + 2));
                Run::Crash { point, nth, slow }
            }
        })
        .collect();
    // A run to the end in the second half (the runs after it start a
    // finished job again), and a last run to the end.
    if !out[len / 2..].iter().any(|r| matches!(r, Run::End)) {
        let at = len / 2 + rng.below((len - len / 2) as u64) as usize;
        out[at] = Run::End;
    }
    out.push(Run::End);
    out
}

/// Checks committed output: every id at most once, each key's counts
/// `1..m` without a gap, each with a crash-free run's id; with
/// `complete`, every id of `0..n`. Returns how many records there are.
pub(crate) fn check(records: &[Count], n: u64, complete: bool) -> Result<usize, String> {
    let mut by_id: BTreeMap<u64, &Count> = BTreeMap::new();
    let mut twice = Vec::new();
    for r in records {
        if by_id.insert(r.id, r).is_some() {
            twice.push(r.id);
        }
    }
    if !twice.is_empty() {
        return Err(format!("{} ids committed twice, such as {:?}", twice.len(), &twice[..twice.len().min(5)]));
    }
    let wrong: Vec<&&Count> = by_id.values().filter(|c| **c != &Count::of(c.id)).take(5).collect();
    if !wrong.is_empty() {
        return Err(format!("records differ from a crash-free run's: {wrong:?}"));
    }
    let mut per_key: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for c in by_id.values() {
        per_key.entry(c.key).or_default().push(c.count);
    }
    for (key, counts) in &per_key {
        // Sorted by id, so by count: 1..m without a gap.
        if counts.iter().enumerate().any(|(i, c)| *c != i as u64 + 1) {
            return Err(format!("key {key}: counts {:?}… have a gap", &counts[..counts.len().min(8)]));
        }
    }
    if complete && by_id.len() as u64 != n {
        let missing: Vec<u64> = (0..n).filter(|id| !by_id.contains_key(id)).take(5).collect();
        return Err(format!(
            "{} of {n} ids committed after a run to the end; missing such as {missing:?}",
            by_id.len()
        ));
    }
    Ok(by_id.len())
}

/// How a life ended.
#[derive(Debug)]
pub(crate) struct Life {
    /// The child exited successfully (it finished, or stopped cleanly).
    pub(crate) success: bool,
    /// It ran to the end of its input (a successful `End` or `Crash`
    /// that never reached its point).
    pub(crate) complete: bool,
    pub(crate) took: Duration,
}

fn newest(checkpoints: &Path) -> u64 {
    weibo::checkpoint::complete_checkpoints(checkpoints).first().map_or(0, |(n, _)| n.get())
}

/// Runs one life: `child` is the child process running the job (to the
/// end, or in stop mode when `stop_mode` says so for `Run::Stop`), with
/// the run's faults set. `log` keeps its standard error.
pub(crate) fn live(mut child: Command, run: &Run, checkpoints: &Path, log: &Path, slow: Duration) -> Life {
    match run {
        Run::Crash { point, nth, slow: slowed } => {
            child.env("WEIBO_CRASH_AT", format!("{point}#{nth}"));
            if let Some(k) = slowed {
                child.env("WEIBO_SLOW_AT", format!("pre-commit-before#{k}={}", slow.as_millis()));
            }
        }
        Run::Stop | Run::KillAtFirstCheckpoint => {
            child.env(SLOW, "1");
        }
        Run::End | Run::KillAfter(_) => {}
    }
    let err = std::fs::File::create(log).unwrap();
    let mut process = child.stdout(Stdio::null()).stderr(err).spawn().unwrap();
    let started = Instant::now();
    let before = newest(checkpoints);
    let status: Option<ExitStatus> = loop {
        if let Some(status) = process.try_wait().unwrap() {
            break Some(status);
        }
        let kill = match run {
            Run::KillAfter(after) => started.elapsed() >= *after,
            Run::KillAtFirstCheckpoint => newest(checkpoints) > before,
            _ => false,
        };
        if kill {
            process.kill().unwrap();
            process.wait().unwrap();
            break None;
        }
        if started.elapsed() > Duration::from_secs(120) {
            process.kill().unwrap();
            panic!("a life of the job ({run:?}) ran for two minutes; its log: {}", tail(log));
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let took = started.elapsed();
    let success = status.is_some_and(|s| s.success());
    if let Some(status) = status
        && !success
    {
        use std::os::unix::process::ExitStatusExt;
        // Only an abort at the fault-injection point is an expected end.
        let aborted = status.signal() == Some(6) && matches!(run, Run::Crash { .. });
        assert!(aborted, "the child failed ({run:?}, {status}): {}", tail(log));
    }
    let complete = success && matches!(run, Run::End | Run::Crash { .. });
    Life { success, complete, took }
}

/// The last lines of a log.
pub(crate) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// This test binary as the child of a life: its `child` test, with
/// `spec` (what the job needs) and the mode `run` asks for, `|end` or
/// `|stop`, in `WEIBO_SCHEDULE_CHILD`.
pub(crate) fn child_command(spec: &str, run: &Run) -> Command {
    let mode = if matches!(run, Run::Stop) { "stop" } else { "end" };
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env("WEIBO_SCHEDULE_CHILD", format!("{spec}|{mode}"))
        .env("RUST_LOG", "weibo=info,weibo_connectors=info");
    cmd
}

/// In the child: runs `job` to the end, or, with `stop`, until it has
/// completed a checkpoint of its own (or finished), then stops it.
pub(crate) fn child_run(job: weibo::Job, stop: bool) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    weibo::testing::block_on(async move {
        let handle = job.spawn().unwrap();
        if !stop {
            handle.wait().await.unwrap();
            return;
        }
        let restored = handle.last_checkpoint();
        while handle.last_checkpoint() == restored && !handle.is_finished() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        handle.stop().await.unwrap();
    });
}

/// Runs the schedules `seeds` (and the fixed ones of the two end-of-input
/// scenarios first): for each, a fresh directory from `fresh`, then its
/// runs, each started by `command(dir, run)` and its committed output read
/// by `read(dir)`, checked after every run. A crash-free run of the job
/// takes about `run` and completes about `checkpoints` checkpoints; a
/// slowed pre-commit takes `slow` (past the job's checkpoint timeout).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_schedules<D>(
    name: &str,
    n: u64,
    run: Duration,
    checkpoints: u64,
    slow: Duration,
    seeds: std::ops::Range<u64>,
    mut fresh: impl FnMut() -> D,
    mut command: impl FnMut(&D, &Run) -> Command,
    mut checkpoint_dir: impl FnMut(&D) -> std::path::PathBuf,
    mut read: impl FnMut(&D) -> Vec<Count>,
) {
    let fixed = vec![
        // A finished job started again, stopped after its first
        // checkpoint, then again to its end.
        vec![Run::End, Run::Stop, Run::End],
        vec![Run::End, Run::KillAtFirstCheckpoint, Run::End],
        // Crashes between the commits at the end of the input, with a
        // pre-commit near the end slowed so that two epochs wait, and in
        // the final checkpoint.
        vec![
            Run::Crash { point: "between-final-commits", nth: 1, slow: Some(2 * checkpoints - 1) },
            Run::End,
            Run::End,
        ],
        vec![Run::Crash { point: "between-final-commits", nth: 1, slow: Some(2 * checkpoints) }, Run::End],
        vec![Run::Crash { point: "between-final-commits", nth: 1, slow: None }, Run::End, Run::End],
        // (A build that commits each epoch at the end of input by itself
        // reaches this point once per epoch: the last ones are those whose
        // checkpoints did not complete.)
        vec![
            Run::Crash { point: "between-final-commits", nth: checkpoints - 1, slow: Some(2 * checkpoints - 1) },
            Run::End,
        ],
        vec![
            Run::Crash { point: "between-final-commits", nth: checkpoints, slow: Some(2 * checkpoints - 1) },
            Run::End,
        ],
        vec![
            Run::Crash { point: "between-final-commits", nth: checkpoints + 1, slow: Some(2 * checkpoints - 1) },
            Run::End,
        ],
        vec![Run::Crash { point: "between-commits", nth: 2, slow: Some(2) }, Run::End],
        vec![Run::Crash { point: "after-final-manifest", nth: 1, slow: Some(2 * checkpoints) }, Run::End],
        vec![Run::Crash { point: "final-barrier", nth: 1, slow: None }, Run::End],
    ];
    let random = seeds.map(|seed| plan(seed, run, checkpoints));
    let logs = tempfile::tempdir().unwrap();
    for (s, runs) in fixed.into_iter().chain(random).enumerate() {
        let d = fresh();
        let mut done = Vec::new();
        for (i, r) in runs.iter().enumerate() {
            let log = logs.path().join(format!("{s}-{i}.log"));
            let life = live(command(&d, r), r, &checkpoint_dir(&d), &log, slow);
            let out = read(&d);
            done.push(format!("{r:?} ({:?}, {})", life.took, if life.success { "ok" } else { "killed" }));
            if let Err(e) = check(&out, n, life.complete) {
                panic!(
                    "{name}, schedule {s}, after run {i}: {e}\nruns: {done:#?}\nlog of the last run:\n{}",
                    tail(&log)
                );
            }
        }
        eprintln!("{name} schedule {s}: {}", done.join(", "));
    }
}
