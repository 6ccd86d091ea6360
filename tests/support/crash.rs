//! What the crash tests share: a test binary that runs itself again as a
//! child process ([`child_command`]), kills it at random moments
//! ([`kill_times`], [`Rng`]) or lets it die at a fault point
//! ([`run_child`]); two processes started on one job ([`run_two_apart`],
//! [`assert_exactly_one_ran`]); and a directory compared before and after
//! something that must not touch it ([`snapshot_dir`],
//! [`first_difference`]). The random schedules of runs built on these are
//! [`crate::schedule`]'s.
//!
//! A crash test's child is its own test binary, started with an
//! environment variable that carries what to do (its spec) and running
//! one test alone (`child`): that test does nothing without the variable,
//! and the binary's other tests do nothing with it.

/// A small deterministic pseudo-random sequence (a 64-bit LCG): `Rng(x)`
/// goes on from state `x`; [`Rng::new`] spreads a small seed first.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// A sequence from `seed`, spread so that near seeds differ at once.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next number, below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }

    /// One of `xs`, at random.
    ///
    /// # Panics
    /// When `xs` is empty.
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// Pseudo-random moments to kill a child at, `Rng(seed)`'s sequence: each
/// within `millis` (in milliseconds, its end excluded), spread evenly.
pub fn kill_times(seed: u64, millis: std::ops::Range<u64>) -> impl Iterator<Item = std::time::Duration> {
    let mut rng = Rng(seed);
    std::iter::repeat_with(move || {
        std::time::Duration::from_millis(millis.start + rng.below(millis.end - millis.start))
    })
}

/// This test binary, to run its test `test` alone in a child process
/// (`--exact`, on one thread, `--nocapture`), with `var` set to `spec`
/// (how the child learns what to do), no fault point (`WEIBO_CRASH_AT`)
/// inherited, and its output discarded (a caller that wants it sets
/// `stdout` or `stderr` again).
///
/// # Panics
/// When the test binary's path is unknown.
pub fn child_command(test: &str, var: &str, spec: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(var, spec)
        .env_remove("WEIBO_CRASH_AT")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    cmd
}

/// Runs `cmd` (a [`child_command`]) for at most `after`, with fault point
/// `crash_at` if given: `true` if it finished, `false` if it was killed
/// when `after` passed or died at its fault point (which aborts the
/// process: SIGABRT).
///
/// # Panics
/// When the child fails any other way (a test's failure).
pub fn run_child(mut cmd: std::process::Command, after: std::time::Duration, crash_at: Option<&str>) -> bool {
    if let Some(point) = crash_at {
        cmd.env("WEIBO_CRASH_AT", point);
    }
    let mut child = cmd.spawn().unwrap();
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            if crash_at.is_some() && std::os::unix::process::ExitStatusExt::signal(&status) == Some(6) {
                return false;
            }
            assert!(status.success(), "the child failed: {status}");
            return true;
        }
        if started.elapsed() >= after {
            child.kill().unwrap();
            child.wait().unwrap();
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// How a child process ended: its status and what it wrote to stderr.
#[derive(Debug)]
pub struct Ended {
    /// Its exit status.
    pub status: std::process::ExitStatus,
    /// Its standard error.
    pub stderr: String,
}

/// Starts `a`, then `b` `apart` later (two processes on one job, as a
/// restart that overlaps the old process or two pods on one volume would
/// be), and waits for both (at most two minutes each).
///
/// # Panics
/// When a child cannot be started, or runs for two minutes.
#[allow(clippy::zombie_processes)]
pub fn run_two_apart(
    mut a: std::process::Command,
    mut b: std::process::Command,
    apart: std::time::Duration,
) -> [Ended; 2] {
    let logs = tempfile::tempdir().unwrap();
    let log = |name: &str| logs.path().join(name);
    a.stderr(std::fs::File::create(log("a")).unwrap());
    b.stderr(std::fs::File::create(log("b")).unwrap());
    let mut first = a.spawn().unwrap();
    std::thread::sleep(apart);
    let mut second = b.spawn().unwrap();
    let started = std::time::Instant::now();
    let mut statuses = [None, None];
    while statuses.iter().any(Option::is_none) {
        for (status, child) in statuses.iter_mut().zip([&mut first, &mut second]) {
            if status.is_none() {
                *status = child.try_wait().unwrap();
            }
        }
        if started.elapsed() > std::time::Duration::from_secs(120) {
            let _ = first.kill();
            let _ = second.kill();
            panic!("two processes on one job ran for two minutes");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let [Some(s1), Some(s2)] = statuses else { unreachable!("both ended") };
    let read = |name: &str| std::fs::read_to_string(log(name)).unwrap_or_default();
    [Ended { status: s1, stderr: read("a") }, Ended { status: s2, stderr: read("b") }]
}

/// Of two processes started on one job's storage while the first still
/// ran, exactly one ran: the other was refused at its start, with an
/// error naming the holder. Returns which one ran (0 or 1).
///
/// # Panics
/// When both ran, or neither, or the refusal does not name the holder.
pub fn assert_exactly_one_ran(ended: &[Ended; 2]) -> usize {
    let ran: Vec<usize> = (0..2).filter(|i| ended[*i].status.success()).collect();
    let [one] = ran.as_slice() else {
        panic!(
            "exactly one of two processes on one job must run: {:?} / {:?}\nfirst: {}\nsecond: {}",
            ended[0].status,
            ended[1].status,
            tail(&ended[0].stderr),
            tail(&ended[1].stderr)
        )
    };
    let refused = &ended[1 - one].stderr;
    assert!(
        refused.contains("is in use by job") && refused.contains("process ") && refused.contains("since"),
        "the refused process names the holder: {}",
        tail(refused)
    );
    *one
}

/// What a log says of a panic (its message), or else its last lines.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if let Some(at) = lines.iter().position(|l| l.contains("panicked at")) {
        return lines.get(at..(at + 3).min(lines.len())).unwrap_or_default().join("\n");
    }
    lines.get(lines.len().saturating_sub(20)..).unwrap_or_default().join("\n")
}

/// Every file under `dir` with its bytes, by path relative to `dir`,
/// except storage locks (`LOCK`, which each start writes its holder into):
/// to compare a directory before and after something that must not touch
/// it.
///
/// # Panics
/// When a file cannot be read.
pub fn snapshot_dir(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    fn walk(root: &std::path::Path, dir: &std::path::Path, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if entry.file_name() != "LOCK" {
                let name = path.strip_prefix(root).unwrap().display().to_string();
                out.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// The first difference between two [`snapshot_dir`]s, if any.
pub fn first_difference(
    before: &std::collections::BTreeMap<String, Vec<u8>>,
    after: &std::collections::BTreeMap<String, Vec<u8>>,
) -> Option<String> {
    for (name, bytes) in before {
        match after.get(name) {
            None => return Some(format!("{name} is gone")),
            Some(b) if b != bytes => return Some(format!("{name} changed ({} bytes, was {})", b.len(), bytes.len())),
            Some(_) => {}
        }
    }
    after.keys().find(|n| !before.contains_key(*n)).map(|n| format!("{n} is new"))
}

/// The lines of every committed file in `out` (an exactly-once file sink's
/// folder), counted: a line committed twice counts 2. Empty before the
/// sink's folder exists.
///
/// # Panics
/// When the folder or a file in it cannot be read.
pub fn committed_lines(out: &std::path::Path) -> std::collections::BTreeMap<String, usize> {
    let mut lines = std::collections::BTreeMap::new();
    if !out.exists() {
        return lines;
    }
    for entry in std::fs::read_dir(out).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                *lines.entry(line.to_string()).or_insert(0) += 1;
            }
        }
    }
    lines
}

/// Runs a crash test's child life after life until one finishes, each
/// killed `least` milliseconds plus a pseudo-random offset (from `seed`,
/// up to 500 ms) after its start; `life(i, after)` runs life `i` and says
/// whether it finished. Returns the number of lives.
///
/// A life moves the job on only if it outlasts the child's start, its
/// restore and a checkpoint; how long those take depends on the machine
/// (on fjall, the start replays fjall's journal and drops the previous
/// life's state first). Every life that commits nothing to `out` (the
/// exactly-once file sink's directory) makes the lives after it 100 ms
/// longer, so a slow machine gets lives long enough to finish, with kill
/// moments as random within them.
///
/// # Panics
/// When 60 lives did not finish the job (a test's failure).
pub fn lives_until_done(
    out: &std::path::Path,
    seed: u64,
    mut least: u64,
    mut life: impl FnMut(usize, std::time::Duration) -> bool,
) -> usize {
    let mut offsets = kill_times(seed, 0..500);
    let mut lives = 0;
    loop {
        let after = std::time::Duration::from_millis(least) + offsets.next().unwrap_or_default();
        let before = committed_lines(out).len();
        let done = life(lives, after);
        lives += 1;
        if done {
            return lives;
        }
        if committed_lines(out).len() == before {
            least += 100;
        }
        assert!(lives < 60, "the job never finished (lives of {least} ms and more at the end)");
    }
}

/// Checks a crash test's committed output against a run that never
/// crashed: every line once, none missing, none twice.
///
/// # Panics
/// When they differ (a test's failure), naming a few lines that differ.
pub fn assert_committed_once(
    got: &std::collections::BTreeMap<String, usize>,
    want: &std::collections::BTreeMap<String, usize>,
) {
    let twice: Vec<_> = got.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(twice.is_empty(), "lines committed twice: {twice:?}");
    let missing: Vec<_> = want.keys().filter(|l| !got.contains_key(*l)).take(5).collect();
    assert!(missing.is_empty(), "lines never committed: {missing:?}");
    let extra: Vec<_> = got.keys().filter(|l| !want.contains_key(*l)).take(5).collect();
    assert!(extra.is_empty(), "lines a crash-free run does not write: {extra:?}");
    assert_eq!(got, want);
}
