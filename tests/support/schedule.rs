//! The exactly-once schedule, shared by the file-sink and Kafka tests: a
//! bounded job (ids `0..n`, keyed by `id % KEYS`, a running count per key
//! in keyed state, into an exactly-once sink) run again and again on the
//! same checkpoint directory and output, in random sequences of runs: to
//! the end, SIGKILLed at a random moment (from the first start to past the
//! end of input), SIGKILLed right after its first checkpoint, stopped
//! cleanly, or made to abort at a fault-injection point of the commit path
//! (`weibo::checkpoint::faults`), sometimes with a pre-commit slowed past
//! the checkpoint timeout so that several epochs wait at once; or to the
//! end with a second process started on the same job while it runs (which
//! must be refused), taking a savepoint on the way, restored from the
//! oldest savepoint taken so far (a rollback), or a version that cannot
//! restore the job's checkpoints (which must be refused and change
//! nothing). Every sequence holds a run to the end before its last run,
//! and ends with one.
//!
//! After every run the committed output is checked: every id at most
//! once (after a rollback, the ids from the savepoint's position on may
//! be there again: the replayed range, by design), each key's counts
//! `1..m` with no gap, each with the id a crash-free run gives it; after a
//! run that reached its end, every id.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::crash::{self, Rng};

/// Keys of the input.
pub const KEYS: u64 = 40;

/// What the job writes: an id with its key's running count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    pub key: u64,
    pub id: u64,
    pub count: u64,
}

impl Count {
    /// What a crash-free run writes for `id`.
    pub fn of(id: u64) -> Self {
        Count { key: id % KEYS, id, count: id / KEYS + 1 }
    }
}

/// The commit-path points of `weibo::checkpoint::faults`.
pub const POINTS: &[&str] = &[
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
pub enum Run {
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
    /// To the end, with a second process of the same job started this long
    /// after it: refused at its start while the first runs (or, if the
    /// first has ended by then, run to the end itself).
    Overlapped(Duration),
    /// To the end, taking a savepoint once it completed a checkpoint of
    /// its own (paced slowly, as `Stop`).
    Savepoint,
    /// To the end, restored from the oldest savepoint taken so far (to the
    /// end from the newest checkpoint when none was).
    Rollback,
    /// A version of the job that cannot restore its checkpoints (another
    /// key type): refused, leaving the checkpoints and the output as they
    /// were.
    Refused,
}

impl Run {
    /// What the child is told to do (the last part of its spec): `end`,
    /// `stop`, `savepoint=<name>`, `rollback=<savepoint dir>` or `refused`.
    pub fn mode(&self, savepoint: Option<&Path>, index: usize) -> String {
        match (self, savepoint) {
            (Run::Stop, _) => "stop".into(),
            (Run::Savepoint, _) => format!("savepoint=s{index}"),
            (Run::Rollback, Some(from)) => format!("rollback={}", from.display()),
            (Run::Refused, _) => "refused".into(),
            _ => "end".into(),
        }
    }
}

/// What a child's mode asks of the job it builds.
pub enum Mode {
    /// Run to the end (`stop`: stop once it completed a checkpoint).
    Run { stop: bool },
    /// Run to the end, taking savepoint `name` on the way.
    Savepoint(String),
    /// Run to the end, restored from this savepoint.
    Rollback(std::path::PathBuf),
    /// Build the version that cannot restore the job's checkpoints.
    Refused,
}

/// The running count per key of `counts`, as `mode` asks for it: keyed
/// by the key (`u64`), or, for a refused version, by its text (another
/// key type, which cannot restore the job's checkpoints).
pub fn running_counts(counts: weibo::Stream<Count>, mode: &Mode) -> weibo::Stream<Count> {
    let reduce = |acc: Count, c: Count| Count { key: c.key, id: c.id, count: acc.count + 1 };
    if matches!(mode, Mode::Refused) {
        counts.key_by(|c: &Count| c.key.to_string()).with_partitions(2).reduce(reduce)
    } else {
        counts.key_by(|c: &Count| c.key).with_partitions(2).reduce(reduce)
    }
}

impl Mode {
    pub fn parse(mode: &str) -> Mode {
        if let Some(name) = mode.strip_prefix("savepoint=") {
            return Mode::Savepoint(name.to_string());
        }
        if let Some(path) = mode.strip_prefix("rollback=") {
            return Mode::Rollback(path.into());
        }
        match mode {
            "refused" => Mode::Refused,
            other => Mode::Run { stop: other == "stop" },
        }
    }
}

/// Set in the child's environment for runs paced slowly: the job reads
/// its input several times slower.
pub const SLOW: &str = "WEIBO_SCHEDULE_SLOW";

/// Whether this child runs paced slowly.
pub fn slow() -> bool {
    std::env::var(SLOW).is_ok()
}

/// A random sequence of runs for a job whose crash-free run takes about
/// `run` and completes about `checkpoints` checkpoints.
pub fn plan(seed: u64, run: Duration, checkpoints: u64) -> Vec<Run> {
    let mut rng = Rng::new(seed);
    let len = 5 + rng.below(4) as usize;
    let ms = run.as_millis() as u64;
    let mut out: Vec<Run> = (0..len)
        .map(|_| match rng.below(14) {
            0 => Run::End,
            // Anywhere from the first start to past the end of input.
            1..=3 => Run::KillAfter(Duration::from_millis(rng.below(ms * 3 / 2))),
            4 => Run::KillAtFirstCheckpoint,
            5 => Run::Stop,
            6 => Run::Overlapped(Duration::from_millis(rng.below(500))),
            7 => Run::Savepoint,
            8 => Run::Rollback,
            9 => Run::Refused,
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
pub fn check(records: &[Count], n: u64, complete: bool) -> Result<usize, String> {
    check_replayed(records, n, complete, None)
}

/// As [`check`], after a rollback to a savepoint whose source stood at
/// `replayed_from`: the ids from there on may be committed again (each
/// copy the record a crash-free run writes).
pub fn check_replayed(records: &[Count], n: u64, complete: bool, replayed_from: Option<u64>) -> Result<usize, String> {
    let mut by_id: BTreeMap<u64, &Count> = BTreeMap::new();
    let mut twice = Vec::new();
    for r in records {
        if let Some(before) = by_id.insert(r.id, r)
            && (replayed_from.is_none_or(|from| r.id < from) || before != r)
        {
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
pub struct Life {
    /// The child exited successfully (it finished, or stopped cleanly).
    pub success: bool,
    /// It ran to the end of its input (a successful `End` or `Crash`
    /// that never reached its point).
    pub complete: bool,
    pub took: Duration,
}

fn newest(checkpoints: &Path) -> u64 {
    weibo::checkpoint::complete_checkpoints(checkpoints).first().map_or(0, |(n, _)| n.get())
}

/// Runs one life: `child` is the child process running the job (to the
/// end, or in the mode the run asks for), with the run's faults set;
/// `second` the same again, for a run that starts a second process on the
/// job. `log` keeps its standard error, which logs at level info.
pub fn live(
    mut child: Command,
    mut second: Command,
    run: &Run,
    checkpoints: &Path,
    log: &Path,
    slow: Duration,
) -> Life {
    for process in [&mut child, &mut second] {
        process.env("RUST_LOG", "weibo=info,weibo_connectors=info");
    }
    match run {
        Run::Crash { point, nth, slow: slowed } => {
            child.env("WEIBO_CRASH_AT", format!("{point}#{nth}"));
            if let Some(k) = slowed {
                child.env("WEIBO_SLOW_AT", format!("pre-commit-before#{k}={}", slow.as_millis()));
            }
        }
        Run::Stop | Run::KillAtFirstCheckpoint | Run::Savepoint => {
            child.env(SLOW, "1");
        }
        Run::Overlapped(after) => {
            let started = Instant::now();
            child.stdout(Stdio::null());
            second.stdout(Stdio::null());
            let ended = crash::run_two_apart(child, second, *after);
            std::fs::write(log, format!("{}\n--- the second process:\n{}", ended[0].stderr, ended[1].stderr)).unwrap();
            // Both ran, one after the other; or one ran and the other (the
            // later to take the storage) was refused.
            if !(ended[0].status.success() && ended[1].status.success()) {
                crash::assert_exactly_one_ran(&ended);
            }
            return Life { success: true, complete: true, took: started.elapsed() };
        }
        Run::Refused => {
            let started = Instant::now();
            if weibo::checkpoint::complete_checkpoints(checkpoints).is_empty() {
                // Nothing to restore, so nothing to refuse: no run.
                return Life { success: false, complete: false, took: started.elapsed() };
            }
            let root = checkpoints.parent().unwrap();
            let before = crash::snapshot_dir(root);
            let out = child.stderr(Stdio::piped()).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            std::fs::write(log, &stderr).unwrap();
            assert!(!out.status.success(), "a version that cannot restore the checkpoints ran: {}", tail(log));
            assert!(stderr.contains("cannot restore into this job"), "refused otherwise: {}", tail(log));
            if let Some(d) = crash::first_difference(&before, &crash::snapshot_dir(root)) {
                panic!("a refused version changed what it must not: {d}");
            }
            return Life { success: false, complete: false, took: started.elapsed() };
        }
        Run::End | Run::KillAfter(_) | Run::Rollback => {}
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
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// In the child: runs `job` as `mode` says (a refused version, built by
/// the caller, runs too, and fails at its start); a `stop` run until it
/// has completed a checkpoint of its own (or finished), then stops it; a
/// `savepoint` run takes one at the same moment, then goes on to the end.
pub fn child_run(job: weibo::Job, mode: &Mode) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    weibo::testing::block_on(async move {
        let handle = job.spawn().unwrap();
        let (stop, savepoint) = match mode {
            Mode::Run { stop } => (*stop, None),
            Mode::Savepoint(name) => (false, Some(name.as_str())),
            Mode::Rollback(_) | Mode::Refused => (false, None),
        };
        if stop || savepoint.is_some() {
            let restored = handle.last_checkpoint();
            while handle.last_checkpoint() == restored && !handle.is_finished() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        if let Some(name) = savepoint
            && let Err(e) = handle.savepoint(name).await
        {
            // The job finished first (a restart of a finished job).
            eprintln!("no savepoint {name}: {e}");
        }
        if stop {
            handle.stop().await.unwrap();
        } else {
            handle.wait().await.unwrap();
        }
    });
}

/// Runs the schedules `seeds` (and the fixed ones of the two end-of-input
/// scenarios first): for each, a fresh directory from `fresh`, then its
/// runs, each started by `command(dir, mode)` (the binary's `child` test,
/// a [`crash::child_command`] with `WEIBO_SCHEDULE_CHILD` set to the job's
/// spec, a `|`, and `mode`: see [`Run::mode`]) and its committed output
/// read by `read(dir)`, checked after every run. A crash-free run of the job
/// takes about `run` and completes about `checkpoints` checkpoints; a
/// slowed pre-commit takes `slow` (past the job's checkpoint timeout).
#[allow(clippy::too_many_arguments)]
pub fn run_schedules<D>(
    name: &str,
    n: u64,
    run: Duration,
    checkpoints: u64,
    slow: Duration,
    seeds: std::ops::Range<u64>,
    mut fresh: impl FnMut() -> D,
    mut command: impl FnMut(&D, &str) -> Command,
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
        // A second process on the job while the first runs.
        vec![Run::Overlapped(Duration::ZERO), Run::End],
        vec![Run::Overlapped(run / 2), Run::End],
        // A version that cannot restore the job's checkpoints, mid-way.
        vec![Run::KillAfter(run / 2), Run::Refused, Run::End],
        // A savepoint early, then a rollback to it after the job finished,
        // and after it was killed mid-way.
        vec![Run::Savepoint, Run::Rollback, Run::End],
        vec![
            Run::KillAfter(run / 3),
            Run::Savepoint,
            Run::KillAfter(run / 2),
            Run::Rollback,
            Run::Refused,
            Run::Overlapped(run / 4),
            Run::End,
        ],
    ];
    let random = seeds.map(|seed| plan(seed, run, checkpoints));
    let logs = tempfile::tempdir().unwrap();
    for (s, runs) in fixed.into_iter().chain(random).enumerate() {
        let d = fresh();
        let mut done = Vec::new();
        // Savepoints taken so far (the oldest first), and where the replayed
        // range of the earliest rollback starts.
        let mut savepoints: Vec<std::path::PathBuf> = Vec::new();
        let mut replayed_from: Option<u64> = None;
        for (i, r) in runs.iter().enumerate() {
            let log = logs.path().join(format!("{s}-{i}.log"));
            let checkpoints = checkpoint_dir(&d);
            let from = savepoints.first().cloned();
            let mode = r.mode(from.as_deref(), i);
            let life = live(command(&d, &mode), command(&d, &mode), r, &checkpoints, &log, slow);
            if matches!(r, Run::Savepoint) {
                let taken = checkpoints.join("savepoints").join(format!("s{i}"));
                if taken.join("MANIFEST").is_file() {
                    savepoints.push(taken);
                }
            }
            if let (Run::Rollback, Some(from)) = (r, &from) {
                let manifest = weibo::checkpoint::read_manifest(from).unwrap();
                let at = manifest.sources.iter().map(|p| p.position).min().unwrap_or(0);
                replayed_from = Some(replayed_from.map_or(at, |f| f.min(at)));
            }
            let out = read(&d);
            let end = if life.success {
                "ok"
            } else if matches!(r, Run::Refused) {
                "refused"
            } else {
                "killed"
            };
            done.push(format!("{r:?} ({:?}, {end})", life.took));
            if let Err(e) = check_replayed(&out, n, life.complete, replayed_from) {
                panic!(
                    "{name}, schedule {s}, after run {i}: {e}\nruns: {done:#?}\nlog of the last run:\n{}",
                    tail(&log)
                );
            }
        }
        eprintln!("{name} schedule {s}: {}", done.join(", "));
    }
}
