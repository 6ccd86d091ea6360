//! A control plane for one machine (`weibo serve`): a registry of jobs
//! kept in a directory, each run as a supervised child process.
//!
//! A job is a command (a YAML pipeline run by `weibo run`, or a binary
//! built on the library) with its environment and, when it serves one,
//! its admin API's address. The control plane starts it, restarts it when
//! it dies (with a backoff, counting its restarts; a job started again
//! resumes from its newest checkpoint, as any job with checkpoints does),
//! marks it failed after too many restarts in a window (a crash loop),
//! stops it through its admin API (with a savepoint when asked), and
//! cancels it. Every change of a job's phase is written to its events.
//!
//! The directory holds, per job, `jobs/<name>/spec.json` (what to run),
//! `status.json` (its phase, process, restarts), `events.jsonl` (each
//! transition) and `output.log` (the process's standard output and
//! error). The control plane holds a lock on `<dir>/lock`: a second one on
//! the same directory is refused. Its jobs run in process groups of their
//! own and outlive it: a control plane started again on the directory
//! adopts those still running (same process id and start time) and
//! restarts those that died meanwhile.
//!
//! Processes are found through `/proc`: the control plane runs on Linux.

mod api;

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

pub use api::routes;

/// What a control plane's operation failed on.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// No job of that name.
    #[error("no job named `{0}`")]
    NoJob(String),
    /// A job of that name exists already.
    #[error("a job named `{0}` exists already")]
    Exists(String),
    /// The request cannot be carried out as the job stands.
    #[error("{0}")]
    Refused(String),
    /// The registry's directory could not be read or written.
    #[error("the control plane's directory: {0}")]
    Io(String),
}

/// What a job runs, and how it is restarted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// The job's name (letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Variables added to the control plane's environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The working directory (the control plane's unless given).
    #[serde(default)]
    pub dir: Option<PathBuf>,
    /// The job's admin API (`http://127.0.0.1:9101`), through which it is
    /// stopped and savepoints are taken; without one, a stop is a
    /// `SIGTERM` (then a `SIGKILL` after 10 s) and takes no savepoint.
    #[serde(default)]
    pub admin: Option<String>,
    /// When it is restarted.
    #[serde(default)]
    pub restart: RestartPolicy,
}

/// How a job that dies is restarted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RestartPolicy {
    /// The most restarts within `window_secs`; one more marks the job
    /// failed (a crash loop).
    pub max_restarts: u32,
    /// The window the restarts are counted in, in seconds.
    pub window_secs: u64,
    /// The wait before the first restart in the window, in
    /// milliseconds; doubled for each one after.
    pub backoff_ms: u64,
    /// The longest wait, in milliseconds.
    pub max_backoff_ms: u64,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self { max_restarts: 5, window_secs: 600, backoff_ms: 1_000, max_backoff_ms: 30_000 }
    }
}

impl RestartPolicy {
    /// The wait before restart number `n` (from 1) of the window.
    fn backoff(&self, n: u32) -> Duration {
        let factor = 1u64.checked_shl(n.saturating_sub(1).min(32)).unwrap_or(u64::MAX);
        Duration::from_millis(self.backoff_ms.saturating_mul(factor).min(self.max_backoff_ms.max(self.backoff_ms)))
    }
}

/// Where a job is in its life.
///
/// ```text
/// created ─► starting ─► running ─► stopping ─► stopped
///               ▲           │  │                   │
///               │           │  └─► finished (exit 0)
///               │           ▼
///               └──── restarting ─► failed (crash loop)
/// any ─► cancelled (killed on request)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Registered, never started.
    Created,
    /// Its process is being started.
    Starting,
    /// Its process runs.
    Running,
    /// Its process died; it starts again after a backoff.
    Restarting,
    /// Asked to stop; its process has not ended yet.
    Stopping,
    /// Stopped on request.
    Stopped,
    /// Its process ended by itself, successfully.
    Finished,
    /// It died too often (or could not be started): not restarted.
    Failed,
    /// Killed on request.
    Cancelled,
}

impl Phase {
    /// Whether a process of the job may be running.
    pub fn is_live(self) -> bool {
        matches!(self, Phase::Starting | Phase::Running | Phase::Stopping)
    }
}

/// A job's state as the control plane sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStatus {
    /// Where it is.
    pub phase: Phase,
    /// Whether it should run.
    pub wanted: bool,
    /// Its process, while it has one.
    pub pid: Option<u32>,
    /// The process's start time (`/proc/<pid>/stat`, in clock ticks):
    /// with `pid`, what tells the process from a later one of the same id.
    pub started_ticks: Option<u64>,
    /// How many times it was restarted after dying, in all.
    pub restarts: u32,
    /// When the restarts of the current window happened (ms since the
    /// epoch).
    pub recent_restarts: Vec<u64>,
    /// How its last process ended.
    pub last_exit: Option<String>,
    /// Since when it is in this phase (ms since the epoch).
    pub since_ms: u64,
    /// Why it is in this phase.
    pub reason: String,
    /// The savepoint its process starts from (`WEIBO_RESTORE_FROM`), after
    /// an upgrade, until it has completed a checkpoint of its own.
    #[serde(default)]
    pub restore_from: Option<String>,
}

impl JobStatus {
    fn new() -> Self {
        Self {
            phase: Phase::Created,
            wanted: false,
            pid: None,
            started_ticks: None,
            restarts: 0,
            recent_restarts: Vec::new(),
            last_exit: None,
            since_ms: now_ms(),
            reason: "submitted".into(),
            restore_from: None,
        }
    }
}

/// One change of a job's phase.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// When (ms since the epoch).
    pub at_ms: u64,
    /// From which phase.
    pub from: Phase,
    /// To which.
    pub to: Phase,
    /// Why.
    pub reason: String,
}

/// What the supervisor of a job is asked to do.
enum Command {
    Start,
    /// Stop, with a savepoint of this name when given.
    Stop(Option<String>, tokio::sync::oneshot::Sender<Result<(), ControlError>>),
    Cancel,
    /// Stop (with a savepoint of this name, or a last checkpoint), then
    /// start this spec (or the same) from it.
    Upgrade(Option<JobSpec>, Option<String>, tokio::sync::oneshot::Sender<Result<(), ControlError>>),
    /// Leave the job alone: the control plane is closing (its process
    /// runs on) or the job is removed.
    Quit,
}

struct Entry {
    spec: JobSpec,
    status: JobStatus,
    events: VecDeque<Event>,
    commands: mpsc::UnboundedSender<Command>,
}

struct Inner {
    dir: PathBuf,
    /// The runtime the supervisors run on (requests to the API come on
    /// the API's own).
    runtime: tokio::runtime::Handle,
    jobs: Mutex<BTreeMap<String, Entry>>,
    /// Held while the control plane is open.
    _lock: std::fs::File,
}

/// How many events of each job are kept in memory (all are in its
/// `events.jsonl`).
const EVENTS_KEPT: usize = 200;

/// How often an adopted process (not a child of this control plane) is
/// looked for.
const ADOPTED_POLL: Duration = Duration::from_millis(200);

/// How long a job's process has to exit after `SIGTERM`, or after its
/// admin API has stopped it, before `SIGKILL`.
const TERM_GRACE: Duration = Duration::from_secs(10);

/// How long an adopted process that was stopping has to end.
const ADOPTED_STOP_GRACE: Duration = Duration::from_secs(120);

/// How long a call to a job's admin API may take (a stop waits for a
/// last checkpoint or a savepoint).
const ADMIN_CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// The control plane: a registry of jobs in a directory, each supervised
/// by a task of the tokio runtime it was opened on.
#[derive(Clone)]
pub struct ControlPlane {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ControlPlane({})", self.inner.dir.display())
    }
}

impl ControlPlane {
    /// Opens the registry in `dir` (created if needed), adopts the jobs
    /// whose processes still run, and starts those that should run and
    /// do not (their restart is counted). Must be called within a tokio
    /// runtime, which runs the supervisors.
    ///
    /// # Errors
    /// [`ControlError::Refused`] when another control plane holds the
    /// directory; [`ControlError::Io`] when it cannot be read or a job's
    /// files do not parse (named, with the reason).
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, ControlError> {
        let dir: PathBuf = dir.into();
        std::fs::create_dir_all(dir.join("jobs")).map_err(|e| io_error(&dir, e))?;
        let lock_path = dir.join("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io_error(&lock_path, e))?;
        if lock.try_lock().is_err() {
            return Err(ControlError::Refused(format!(
                "another control plane has the directory {} (it holds {})",
                dir.display(),
                lock_path.display()
            )));
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            ControlError::Refused("a control plane is opened within a tokio runtime, which runs its supervisors".into())
        })?;
        let inner = Arc::new(Inner { dir: dir.clone(), runtime, jobs: Mutex::new(BTreeMap::new()), _lock: lock });
        let plane = Self { inner };
        let mut names: Vec<String> = Vec::new();
        for entry in std::fs::read_dir(dir.join("jobs")).map_err(|e| io_error(&dir, e))? {
            let entry = entry.map_err(|e| io_error(&dir, e))?;
            if entry.path().join("spec.json").is_file() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        names.sort();
        for name in names {
            let job_dir = dir.join("jobs").join(&name);
            let spec: JobSpec = read_json(&job_dir.join("spec.json"))?;
            let status: JobStatus = match read_json(&job_dir.join("status.json")) {
                Ok(s) => s,
                Err(_) if !job_dir.join("status.json").exists() => JobStatus::new(),
                Err(e) => return Err(e),
            };
            plane.launch(spec, status, false);
        }
        Ok(plane)
    }

    /// The directory it keeps its registry in.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Registers job `spec` and starts it.
    ///
    /// # Errors
    /// [`ControlError::Exists`] for a name in use; [`ControlError::Refused`]
    /// for a name that is not letters, digits, `-`, `_`, `.`, or an
    /// empty command; [`ControlError::Io`] when its files cannot be
    /// written.
    pub fn submit(&self, spec: JobSpec) -> Result<JobStatus, ControlError> {
        check_spec(&spec)?;
        if self.lock().contains_key(&spec.name) {
            return Err(ControlError::Exists(spec.name));
        }
        let job_dir = self.job_dir(&spec.name);
        std::fs::create_dir_all(&job_dir).map_err(|e| io_error(&job_dir, e))?;
        write_json(&job_dir.join("spec.json"), &spec)?;
        let name = spec.name.clone();
        let status = JobStatus::new();
        write_json(&job_dir.join("status.json"), &status)?;
        self.launch(spec, status, true);
        self.status(&name)
    }

    /// Replaces the spec of job `spec.name`: its next start runs it.
    ///
    /// # Errors
    /// As [`ControlPlane::submit`]; [`ControlError::NoJob`].
    pub fn update(&self, spec: JobSpec) -> Result<(), ControlError> {
        check_spec(&spec)?;
        let mut jobs = self.lock();
        let entry = jobs.get_mut(&spec.name).ok_or_else(|| ControlError::NoJob(spec.name.clone()))?;
        write_json(&self.job_dir(&spec.name).join("spec.json"), &spec)?;
        entry.spec = spec;
        Ok(())
    }

    /// The jobs, by name.
    pub fn list(&self) -> Vec<(JobSpec, JobStatus)> {
        self.lock().values().map(|e| (e.spec.clone(), e.status.clone())).collect()
    }

    /// Job `name`'s status.
    ///
    /// # Errors
    /// [`ControlError::NoJob`].
    pub fn status(&self, name: &str) -> Result<JobStatus, ControlError> {
        self.lock().get(name).map(|e| e.status.clone()).ok_or_else(|| ControlError::NoJob(name.into()))
    }

    /// Job `name`'s spec.
    ///
    /// # Errors
    /// [`ControlError::NoJob`].
    pub fn spec(&self, name: &str) -> Result<JobSpec, ControlError> {
        self.lock().get(name).map(|e| e.spec.clone()).ok_or_else(|| ControlError::NoJob(name.into()))
    }

    /// Job `name`'s latest events, oldest first.
    ///
    /// # Errors
    /// [`ControlError::NoJob`].
    pub fn events(&self, name: &str) -> Result<Vec<Event>, ControlError> {
        self.lock()
            .get(name)
            .map(|e| e.events.iter().cloned().collect())
            .ok_or_else(|| ControlError::NoJob(name.into()))
    }

    /// The last `lines` lines of job `name`'s output.
    ///
    /// # Errors
    /// [`ControlError::NoJob`]; [`ControlError::Io`] when the log cannot
    /// be read.
    pub fn logs(&self, name: &str, lines: usize) -> Result<Vec<String>, ControlError> {
        self.status(name)?;
        let path = self.job_dir(name).join("output.log");
        let text = match std::fs::read(&path) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(io_error(&path, e)),
        };
        let all: Vec<&str> = text.lines().collect();
        Ok(all.iter().skip(all.len().saturating_sub(lines)).map(|l| (*l).to_string()).collect())
    }

    /// Starts job `name` (again), with a fresh restart window; a job
    /// waiting to restart starts at once.
    ///
    /// # Errors
    /// [`ControlError::NoJob`]; [`ControlError::Refused`] when its process
    /// runs (or is starting or stopping).
    pub fn start(&self, name: &str) -> Result<(), ControlError> {
        let status = self.status(name)?;
        if status.phase.is_live() {
            return Err(ControlError::Refused(format!("job `{name}` is {} already", phase_name(status.phase))));
        }
        self.send(name, Command::Start)
    }

    /// Stops job `name`: through its admin API with a last checkpoint, or
    /// savepoint `savepoint` when given (the stop is refused, and the job
    /// runs on, when it cannot be taken); without an admin API, with
    /// `SIGTERM`. Returns once the stop is under way; the job's phase is
    /// `stopped` once its process has ended.
    ///
    /// # Errors
    /// [`ControlError::NoJob`]; [`ControlError::Refused`] when the job is
    /// not running, when a savepoint is asked of a job without an admin
    /// API, or when its admin API refuses (its answer is in the message).
    pub async fn stop(&self, name: &str, savepoint: Option<String>) -> Result<(), ControlError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(name, Command::Stop(savepoint, tx))?;
        rx.await.map_err(|_| ControlError::Refused(format!("job `{name}`'s supervisor has ended")))?
    }

    /// Upgrades job `name`: stops it through its admin API with savepoint
    /// `savepoint` (or, without one, with a last checkpoint: the
    /// `last-state` upgrade), writes `spec` (when given) as its spec, and
    /// starts it from that savepoint (`WEIBO_RESTORE_FROM` holds its
    /// path, and `weibo run` restores from it) or, for `last-state`, from
    /// its newest checkpoint. When the savepoint cannot be taken the
    /// upgrade stops there and the old version runs on: never a start
    /// from an older checkpoint instead. Returns once the old version is
    /// stopping.
    ///
    /// # Errors
    /// [`ControlError::NoJob`]; [`ControlError::Refused`] when the job is
    /// not running, has no admin API (a savepoint is asked), `spec` names
    /// another job or is not valid, or the job refuses the stop (its
    /// answer is in the message).
    pub async fn upgrade(
        &self,
        name: &str,
        spec: Option<JobSpec>,
        savepoint: Option<String>,
    ) -> Result<(), ControlError> {
        if let Some(spec) = &spec {
            check_spec(spec)?;
            if spec.name != name {
                return Err(ControlError::Refused(format!("the new spec names job `{}`, not `{name}`", spec.name)));
            }
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(name, Command::Upgrade(spec, savepoint, tx))?;
        rx.await.map_err(|_| ControlError::Refused(format!("job `{name}`'s supervisor has ended")))?
    }

    /// Takes savepoint `savepoint` of running job `name` through its admin
    /// API, which goes on running: where it was written.
    ///
    /// # Errors
    /// [`ControlError::NoJob`]; [`ControlError::Refused`] when the job is
    /// not running, has no admin API, or refuses (its answer in the
    /// message).
    pub async fn savepoint(&self, name: &str, savepoint: &str) -> Result<String, ControlError> {
        let spec = self.spec(name)?;
        let status = self.status(name)?;
        if status.phase != Phase::Running {
            return Err(ControlError::Refused(format!("job `{name}` is {}, not running", phase_name(status.phase))));
        }
        let Some(admin) = &spec.admin else {
            return Err(ControlError::Refused(format!(
                "job `{name}` has no admin API to take a savepoint through (give its spec `admin`)"
            )));
        };
        let answer = admin_call(admin, &spec, "/api/savepoints", serde_json::json!({ "name": savepoint }))
            .await
            .map_err(|why| ControlError::Refused(format!("job `{name}` took no savepoint: {why}")))?;
        serde_json::from_str::<serde_json::Value>(&answer)
            .ok()
            .and_then(|v| v.get("path")?.as_str().map(str::to_string))
            .ok_or_else(|| ControlError::Refused(format!("job `{name}` did not say where its savepoint is: {answer}")))
    }

    /// Kills job `name`'s process (`SIGKILL`): no checkpoint is taken.
    ///
    /// # Errors
    /// [`ControlError::NoJob`].
    pub fn cancel(&self, name: &str) -> Result<(), ControlError> {
        self.send(name, Command::Cancel)
    }

    /// Removes job `name` from the registry, its files with it.
    ///
    /// # Errors
    /// [`ControlError::NoJob`]; [`ControlError::Refused`] while it may run.
    pub fn remove(&self, name: &str) -> Result<(), ControlError> {
        let mut jobs = self.lock();
        let entry = jobs.get(name).ok_or_else(|| ControlError::NoJob(name.into()))?;
        if entry.status.phase.is_live() || entry.status.phase == Phase::Restarting {
            return Err(ControlError::Refused(format!(
                "job `{name}` is {}: stop or cancel it first",
                phase_name(entry.status.phase)
            )));
        }
        let _ = entry.commands.send(Command::Quit);
        jobs.remove(name);
        let dir = self.job_dir(name);
        std::fs::remove_dir_all(&dir).map_err(|e| io_error(&dir, e))
    }

    /// Waits until job `name` is in a phase `done` accepts, or `timeout`
    /// passes; the status then.
    ///
    /// # Errors
    /// [`ControlError::NoJob`]; [`ControlError::Refused`] on the timeout.
    pub async fn wait_for(
        &self,
        name: &str,
        timeout: Duration,
        done: impl Fn(&JobStatus) -> bool,
    ) -> Result<JobStatus, ControlError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let status = self.status(name)?;
            if done(&status) {
                return Ok(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ControlError::Refused(format!(
                    "job `{name}` is still {} after {timeout:?}",
                    phase_name(status.phase)
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Leaves every job to run on: the supervisors end, the processes do
    /// not. (Dropping the last handle does not stop the supervisors: the
    /// runtime they run on does.)
    pub fn close(&self) {
        for entry in self.lock().values() {
            let _ = entry.commands.send(Command::Quit);
        }
    }

    fn send(&self, name: &str, command: Command) -> Result<(), ControlError> {
        let jobs = self.lock();
        let entry = jobs.get(name).ok_or_else(|| ControlError::NoJob(name.into()))?;
        entry.commands.send(command).map_err(|_| ControlError::Refused(format!("job `{name}`'s supervisor has ended")))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.inner.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn job_dir(&self, name: &str) -> PathBuf {
        self.inner.dir.join("jobs").join(name)
    }

    /// Registers `spec` with `status` and starts its supervisor; `start`:
    /// a new job, to be started.
    fn launch(&self, spec: JobSpec, status: JobStatus, start: bool) {
        let (tx, rx) = mpsc::unbounded_channel();
        let name = spec.name.clone();
        let events = read_events(&self.job_dir(&name).join("events.jsonl"));
        self.lock().insert(name.clone(), Entry { spec, status, events, commands: tx.clone() });
        if start {
            let _ = tx.send(Command::Start);
        }
        let supervisor = Supervisor { plane: self.clone(), name };
        self.inner.runtime.spawn(supervisor.run(rx));
    }
}

/// A process the supervisor watches: its child, or one a previous control
/// plane started (adopted).
enum Process {
    Child(tokio::process::Child),
    Adopted { pid: u32, ticks: u64 },
}

impl Process {
    fn pid(&self) -> Option<u32> {
        match self {
            Process::Child(c) => c.id(),
            Process::Adopted { pid, .. } => Some(*pid),
        }
    }

    /// Waits for the process to end: how it ended.
    async fn wait(&mut self) -> String {
        match self {
            Process::Child(c) => match c.wait().await {
                Ok(status) => exit_text(status),
                Err(e) => format!("cannot wait for it: {e}"),
            },
            Process::Adopted { pid, ticks } => {
                while start_ticks(*pid) == Some(*ticks) {
                    tokio::time::sleep(ADOPTED_POLL).await;
                }
                "ended (adopted: its exit status is unknown)".into()
            }
        }
    }
}

fn exit_text(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => format!("{status}"),
    }
}

/// Sends `signal` to the job's process `pid` and its process group (a
/// wrapper such as `sh -c` and what it runs), if `pid` is still the
/// process that started at `ticks` (not a later one that got its id).
fn signal(pid: u32, ticks: Option<u64>, signal: rustix::process::Signal) {
    if ticks.is_some() && start_ticks(pid) != ticks {
        return;
    }
    if let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
        // The job leads its own group (`process_group(0)`); should it have
        // left it, the process alone.
        if rustix::process::kill_process_group(pid, signal).is_err() {
            let _ = rustix::process::kill_process(pid, signal);
        }
    }
}

struct Supervisor {
    plane: ControlPlane,
    name: String,
}

/// How a run of the job's process ended, as the supervisor handled it.
enum Ended {
    /// By itself, or killed from outside.
    Died(String),
    /// After a stop.
    Stopped(String),
    /// After a cancel.
    Cancelled(String),
    /// After the stop of an upgrade: the new version is to start.
    Upgraded(String),
    /// The control plane is closing or the job was removed.
    Quit,
}

impl Supervisor {
    async fn run(self, mut commands: mpsc::UnboundedReceiver<Command>) {
        // A process left by a previous control plane: adopted if it still
        // runs; if it died meanwhile and should run, it is restarted.
        let status = match self.plane.status(&self.name) {
            Ok(s) => s,
            Err(_) => return,
        };
        let mut adopted = match (status.pid, status.started_ticks) {
            (Some(pid), Some(ticks)) if start_ticks(pid) == Some(ticks) => Some(Process::Adopted { pid, ticks }),
            _ => None,
        };
        if adopted.is_some() {
            // A stop (or an upgrade's stop) under way goes on.
            let phase = if status.phase == Phase::Stopping { Phase::Stopping } else { Phase::Running };
            self.transition(phase, "adopted by a control plane started again", |_| {});
        } else if status.wanted && status.phase == Phase::Stopping {
            // The old version of an upgrade ended meanwhile: the new one starts.
            self.transition(Phase::Starting, "upgrade: the old version ended while no control plane watched it", |s| {
                s.pid = None;
                s.started_ticks = None;
            });
        } else if !status.wanted && status.phase.is_live() {
            self.transition(Phase::Stopped, "its process ended while no control plane watched it", |s| {
                s.pid = None;
                s.started_ticks = None;
            });
        } else if status.wanted && status.phase.is_live() {
            self.transition(Phase::Restarting, "its process ended while no control plane watched it", |s| {
                s.pid = None;
                s.started_ticks = None;
                s.last_exit = Some("ended while no control plane watched it".into());
            });
            // Counted; a job past its crash loop's limit is failed there.
            self.count_restart();
        }
        loop {
            let wanted = self.plane.status(&self.name).map(|s| s.wanted).unwrap_or(false);
            if !wanted && adopted.is_none() {
                match commands.recv().await {
                    Some(Command::Start) => {
                        self.transition(Phase::Starting, "started on request", |s| {
                            s.wanted = true;
                            s.recent_restarts.clear();
                        });
                    }
                    Some(Command::Stop(_, reply) | Command::Upgrade(_, _, reply)) => {
                        let _ = reply.send(Err(ControlError::Refused(format!(
                            "job `{}` is not running (to run a new spec, update it and start the job)",
                            self.name
                        ))));
                    }
                    Some(Command::Cancel) => {}
                    Some(Command::Quit) | None => return,
                }
                continue;
            }
            let process = match adopted.take() {
                Some(p) => p,
                None => match self.spawn() {
                    Ok(p) => p,
                    Err(why) => {
                        self.transition(Phase::Failed, &format!("cannot start: {why}"), |s| s.wanted = false);
                        continue;
                    }
                },
            };
            match self.watch(process, &mut commands).await {
                Ended::Quit => return,
                Ended::Cancelled(exit) => {
                    self.transition(Phase::Cancelled, "cancelled on request", |s| {
                        s.wanted = false;
                        s.pid = None;
                        s.started_ticks = None;
                        s.last_exit = Some(exit);
                    });
                }
                Ended::Upgraded(exit) => {
                    let from = self.plane.status(&self.name).ok().and_then(|s| s.restore_from);
                    let reason = match &from {
                        Some(path) => format!("upgraded: the new version starts from savepoint {path}"),
                        None => "upgraded: the new version starts from the newest checkpoint".into(),
                    };
                    self.transition(Phase::Starting, &reason, |s| {
                        s.pid = None;
                        s.started_ticks = None;
                        s.last_exit = Some(exit);
                    });
                }
                Ended::Stopped(exit) => {
                    self.transition(Phase::Stopped, "stopped on request", |s| {
                        s.wanted = false;
                        s.pid = None;
                        s.started_ticks = None;
                        s.last_exit = Some(exit);
                    });
                }
                Ended::Died(exit) if exit == "exit code 0" => {
                    self.transition(Phase::Finished, "its process ended successfully", |s| {
                        s.wanted = false;
                        // It has taken its final checkpoint.
                        s.restore_from = None;
                        s.pid = None;
                        s.started_ticks = None;
                        s.last_exit = Some(exit);
                    });
                }
                Ended::Died(exit) if !self.plane.status(&self.name).is_ok_and(|s| s.wanted) => {
                    // An adopted process that was stopping.
                    self.transition(Phase::Stopped, &format!("its process ended ({exit})"), |s| {
                        s.pid = None;
                        s.started_ticks = None;
                        s.last_exit = Some(exit.clone());
                    });
                }
                Ended::Died(exit) => {
                    self.transition(Phase::Restarting, &format!("its process died ({exit})"), |s| {
                        s.pid = None;
                        s.started_ticks = None;
                        s.last_exit = Some(exit.clone());
                    });
                    if !self.count_restart() {
                        continue;
                    }
                    let n = self.plane.status(&self.name).map(|s| s.recent_restarts.len()).unwrap_or(1);
                    let wait = self.spec().map(|s| s.restart.backoff(n as u32)).unwrap_or(Duration::from_secs(1));
                    // A start asked meanwhile restarts it at once.
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        command = commands.recv() => match command {
                            Some(Command::Start) => {}
                            Some(Command::Upgrade(_, _, reply)) => {
                                let _ = reply.send(Err(ControlError::Refused(format!(
                                    "job `{}` is restarting: upgrade it once it runs",
                                    self.name
                                ))));
                            }
                            Some(Command::Stop(_, reply)) => {
                                self.transition(Phase::Stopped, "stopped on request while it waited to restart", |s| {
                                    s.wanted = false;
                                });
                                let _ = reply.send(Ok(()));
                            }
                            Some(Command::Cancel) => {
                                self.transition(
                                    Phase::Cancelled,
                                    "cancelled on request while it waited to restart",
                                    |s| s.wanted = false,
                                );
                            }
                            Some(Command::Quit) | None => return,
                        },
                    }
                    if self.plane.status(&self.name).is_ok_and(|s| s.wanted) {
                        self.transition(Phase::Starting, &format!("restart after {wait:?}"), |_| {});
                    }
                }
            }
        }
    }

    /// Counts a restart in the window; `false` (and the job failed) when
    /// that makes one too many.
    fn count_restart(&self) -> bool {
        let policy = self.spec().map(|s| s.restart).unwrap_or_default();
        let now = now_ms();
        let window = policy.window_secs.saturating_mul(1000);
        let mut too_many = None;
        self.update(|s| {
            s.restarts += 1;
            s.recent_restarts.retain(|t| now.saturating_sub(*t) < window);
            s.recent_restarts.push(now);
            if s.recent_restarts.len() > policy.max_restarts as usize {
                too_many = Some(s.recent_restarts.len());
            }
        });
        if let Some(n) = too_many {
            self.transition(
                Phase::Failed,
                &format!(
                    "a crash loop: {n} restarts within {} s (at most {})",
                    policy.window_secs, policy.max_restarts
                ),
                |s| s.wanted = false,
            );
            return false;
        }
        true
    }

    fn spec(&self) -> Result<JobSpec, ControlError> {
        self.plane.spec(&self.name)
    }

    /// Starts the job's process, its output appended to its log.
    fn spawn(&self) -> Result<Process, String> {
        let spec = self.spec().map_err(|e| e.to_string())?;
        let (program, args) = spec.command.split_first().ok_or("its command is empty")?;
        let log_path = self.plane.job_dir(&self.name).join("output.log");
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
        let _ = writeln!(log, "--- weibo serve: starting `{}` at {} ms", spec.command.join(" "), now_ms());
        let err = log.try_clone().map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .envs(&spec.env)
            .env("WEIBO_JOB_NAME", &spec.name)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err)
            // Its own process group: a signal to the control plane's (a
            // Ctrl-C) does not reach it, and it outlives the control plane.
            .process_group(0);
        if let Some(dir) = &spec.dir {
            command.current_dir(dir);
        }
        if let Some(path) = self.plane.status(&self.name).ok().and_then(|s| s.restore_from) {
            command.env("WEIBO_RESTORE_FROM", path);
        }
        let child = command.spawn().map_err(|e| format!("cannot run `{program}`: {e}"))?;
        let pid = child.id();
        let ticks = pid.and_then(start_ticks);
        self.transition(Phase::Running, &format!("process {} started", pid.unwrap_or_default()), |s| {
            s.pid = pid;
            s.started_ticks = ticks;
        });
        Ok(Process::Child(child))
    }

    /// Watches the running `process` until it ends, carrying out the
    /// commands that come meanwhile.
    async fn watch(&self, mut process: Process, commands: &mut mpsc::UnboundedReceiver<Command>) -> Ended {
        let pid = process.pid();
        let ticks = match &process {
            Process::Adopted { ticks, .. } => Some(*ticks),
            Process::Child(_) => self.plane.status(&self.name).ok().and_then(|s| s.started_ticks),
        };
        // An adopted process in the middle of a stop (or of an upgrade's
        // stop: the job still wanted) ends as that; if it has not ended in
        // `ADOPTED_STOP_GRACE`, it is killed.
        let (mut asked, mut term_deadline) = match self.plane.status(&self.name) {
            Ok(s) if matches!(process, Process::Adopted { .. }) && s.phase == Phase::Stopping => (
                Some(if s.wanted { Phase::Starting } else { Phase::Stopping }),
                Some(tokio::time::Instant::now() + ADOPTED_STOP_GRACE),
            ),
            _ => (None, None),
        };
        // After an upgrade, the job's admin API is asked until it reports
        // a checkpoint past the first one it reported (a restored job
        // reports the checkpoint it restored): from then on a restart
        // resumes from the job's own checkpoints, not from the savepoint.
        let mut polls = tokio::time::interval(Duration::from_millis(100));
        let mut first_seen: Option<u64> = None;
        loop {
            let restoring = asked.is_none()
                && self.plane.status(&self.name).is_ok_and(|s| s.restore_from.is_some())
                && self.spec().is_ok_and(|s| s.admin.is_some());
            let deadline = term_deadline;
            let grace = async move {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                exit = process.wait() => {
                    return match asked {
                        Some(Phase::Cancelled) => Ended::Cancelled(exit),
                        Some(Phase::Starting) => Ended::Upgraded(exit),
                        Some(_) => Ended::Stopped(exit),
                        None => Ended::Died(exit),
                    };
                }
                _ = polls.tick(), if restoring => {
                    let last = match self.spec() {
                        Ok(spec) => match &spec.admin {
                            Some(admin) => admin_get(admin, &spec, "/api/job")
                                .await
                                .ok()
                                .and_then(|job| job.get("last_checkpoint")?.as_u64()),
                            None => None,
                        },
                        Err(_) => None,
                    };
                    match (first_seen, last) {
                        (None, Some(n)) => first_seen = Some(n),
                        (Some(first), Some(n)) if n > first => {
                            self.update(|s| s.restore_from = None);
                            tracing::info!(job = %self.name, checkpoint = n, "the upgraded job has a checkpoint of its own: restarts resume from it");
                        }
                        _ => {}
                    }
                }
                () = grace => {
                    if let Some(pid) = pid {
                        signal(pid, ticks, rustix::process::Signal::KILL);
                    }
                    term_deadline = None;
                }
                command = commands.recv() => match command {
                    Some(Command::Start) => {}
                    Some(Command::Stop(savepoint, reply)) => {
                        if asked.is_some() {
                            let _ = reply.send(Err(ControlError::Refused(format!("job `{}` is stopping already", self.name))));
                            continue;
                        }
                        let spec = match self.spec() {
                            Ok(s) => s,
                            Err(e) => {
                                let _ = reply.send(Err(e));
                                continue;
                            }
                        };
                        match (&spec.admin, savepoint) {
                            (Some(admin), savepoint) => {
                                let body = match &savepoint {
                                    Some(name) => serde_json::json!({ "savepoint": name }),
                                    None => serde_json::json!({}),
                                };
                                self.transition(Phase::Stopping, &match &savepoint {
                                    Some(name) => format!("stop with savepoint `{name}` asked"),
                                    None => "stop asked".into(),
                                }, |s| s.wanted = false);
                                match admin_call(admin, &spec, "/api/stop", body).await {
                                    Ok(answer) => {
                                        asked = Some(Phase::Stopping);
                                        // The job has ended: its process
                                        // exits now, or is killed.
                                        term_deadline = Some(tokio::time::Instant::now() + TERM_GRACE);
                                        if stop_checkpoint(&answer).is_some() {
                                            // Newer than any savepoint of an upgrade.
                                            self.update(|s| s.restore_from = None);
                                        }
                                        let _ = reply.send(Ok(()));
                                    }
                                    Err(why) => {
                                        self.transition(Phase::Running, &format!("the stop was refused, the job runs on: {why}"), |s| s.wanted = true);
                                        let _ = reply.send(Err(ControlError::Refused(format!(
                                            "job `{}` was not stopped: {why}", self.name
                                        ))));
                                    }
                                }
                            }
                            (None, Some(_)) => {
                                let _ = reply.send(Err(ControlError::Refused(format!(
                                    "job `{}` has no admin API to take a savepoint through (give its spec `admin`)",
                                    self.name
                                ))));
                            }
                            (None, None) => {
                                self.transition(Phase::Stopping, "stop asked: SIGTERM", |s| s.wanted = false);
                                if let Some(pid) = pid {
                                    signal(pid, ticks, rustix::process::Signal::TERM);
                                }
                                asked = Some(Phase::Stopping);
                                term_deadline = Some(tokio::time::Instant::now() + TERM_GRACE);
                                let _ = reply.send(Ok(()));
                            }
                        }
                    }
                    Some(Command::Upgrade(new, savepoint, reply)) => {
                        if asked.is_some() {
                            let _ = reply.send(Err(ControlError::Refused(format!("job `{}` is stopping already", self.name))));
                            continue;
                        }
                        match self.begin_upgrade(new, savepoint, pid, ticks).await {
                            Ok(()) => {
                                asked = Some(Phase::Starting);
                                term_deadline = Some(tokio::time::Instant::now() + TERM_GRACE);
                                let _ = reply.send(Ok(()));
                            }
                            Err(e) => {
                                // Stopped without a savepoint to start
                                // from: it ends as stopped.
                                if self.plane.status(&self.name).is_ok_and(|s| !s.wanted && s.phase == Phase::Stopping) {
                                    asked = Some(Phase::Stopping);
                                    term_deadline = Some(tokio::time::Instant::now() + TERM_GRACE);
                                }
                                let _ = reply.send(Err(e));
                            }
                        }
                    }
                    Some(Command::Cancel) => {
                        asked = Some(Phase::Cancelled);
                        self.update(|s| s.wanted = false);
                        if let Some(pid) = pid {
                            signal(pid, ticks, rustix::process::Signal::KILL);
                        }
                    }
                    Some(Command::Quit) | None => return Ended::Quit,
                },
            }
        }
    }

    /// Stops the running version for an upgrade: with savepoint
    /// `savepoint` through the admin API (its path kept for the new
    /// version to start from), or a last checkpoint, or `SIGTERM` without
    /// an admin API (then the deadline for `SIGKILL`); then writes the new
    /// spec. On a refusal nothing changes and the job runs on.
    async fn begin_upgrade(
        &self,
        new: Option<JobSpec>,
        savepoint: Option<String>,
        pid: Option<u32>,
        ticks: Option<u64>,
    ) -> Result<(), ControlError> {
        let spec = self.spec()?;
        let name = &self.name;
        match (&spec.admin, &savepoint) {
            (None, Some(_)) => {
                return Err(ControlError::Refused(format!(
                    "job `{name}` has no admin API to take a savepoint through (give its spec `admin`)"
                )));
            }
            (Some(admin), _) => {
                let body = match &savepoint {
                    Some(sp) => serde_json::json!({ "savepoint": sp }),
                    None => serde_json::json!({}),
                };
                let what =
                    savepoint.as_ref().map_or_else(|| "a last checkpoint".into(), |sp| format!("savepoint `{sp}`"));
                self.transition(Phase::Stopping, &format!("upgrade: stop with {what} asked"), |_| {});
                let answer = match admin_call(admin, &spec, "/api/stop", body).await {
                    Ok(a) => a,
                    Err(why) => {
                        self.transition(
                            Phase::Running,
                            &format!("the upgrade was refused, the old version runs on: {why}"),
                            |_| {},
                        );
                        return Err(ControlError::Refused(format!("job `{name}` was not upgraded: {why}")));
                    }
                };
                let path = stop_checkpoint(&answer);
                if savepoint.is_some() && path.is_none() {
                    // Stopped, but with no savepoint to start from: the
                    // new version is not started from anything older.
                    self.update(|s| s.wanted = false);
                    return Err(ControlError::Refused(format!(
                        "job `{name}` stopped without saying where its savepoint is: the new version is not started"
                    )));
                }
                // A last-state upgrade starts from the newest checkpoint,
                // which the stop just took.
                self.update(|s| s.restore_from = savepoint.as_ref().and(path));
            }
            (None, None) => {
                self.transition(Phase::Stopping, "upgrade: SIGTERM", |_| {});
                if let Some(pid) = pid {
                    signal(pid, ticks, rustix::process::Signal::TERM);
                }
            }
        }
        if let Some(new) = new {
            self.plane.update(new)?;
        }
        Ok(())
    }

    fn update(&self, f: impl FnOnce(&mut JobStatus)) {
        let mut jobs = self.plane.lock();
        let Some(entry) = jobs.get_mut(&self.name) else { return };
        f(&mut entry.status);
        let path = self.plane.job_dir(&self.name).join("status.json");
        if let Err(e) = write_json(&path, &entry.status) {
            tracing::warn!(job = %self.name, error = %e, "cannot write the job's status");
        }
    }

    /// Moves the job to `to` for `reason`, with `f`'s changes, and writes
    /// the event.
    fn transition(&self, to: Phase, reason: &str, f: impl FnOnce(&mut JobStatus)) {
        let mut jobs = self.plane.lock();
        let Some(entry) = jobs.get_mut(&self.name) else { return };
        let from = entry.status.phase;
        f(&mut entry.status);
        entry.status.phase = to;
        entry.status.since_ms = now_ms();
        entry.status.reason = reason.to_string();
        let event = Event { at_ms: entry.status.since_ms, from, to, reason: reason.to_string() };
        tracing::info!(job = %self.name, from = phase_name(from), to = phase_name(to), reason, "job transition");
        let dir = self.plane.job_dir(&self.name);
        if let Err(e) = write_json(&dir.join("status.json"), &entry.status) {
            tracing::warn!(job = %self.name, error = %e, "cannot write the job's status");
        }
        if let Err(e) = append_event(&dir.join("events.jsonl"), &event) {
            tracing::warn!(job = %self.name, error = %e, "cannot write the job's event");
        }
        if entry.events.len() == EVENTS_KEPT {
            entry.events.pop_front();
        }
        entry.events.push_back(event);
    }
}

/// A request to the job's admin API at `admin`: `method` on `path`, with
/// the token from the job's `WEIBO_ADMIN_TOKEN` (or the control plane's),
/// given up after `timeout`.
fn admin_request(
    admin: &str,
    spec: &JobSpec,
    method: reqwest::Method,
    path: &str,
    timeout: Duration,
) -> Result<reqwest::RequestBuilder, String> {
    let base = admin.trim_end_matches('/');
    let token = spec
        .env
        .get("WEIBO_ADMIN_TOKEN")
        .cloned()
        .or_else(|| std::env::var("WEIBO_ADMIN_TOKEN").ok())
        .filter(|t| !t.is_empty());
    let client = reqwest::Client::builder()
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .timeout(timeout)
        .build()
        .map_err(|e| format!("no HTTP client: {e}"))?;
    let request = client.request(method, format!("{base}{path}"));
    Ok(match token {
        Some(t) => request.bearer_auth(t),
        None => request,
    })
}

/// Asks the job's admin API at `admin`: `POST path` with `body`; its
/// answer's text, or why it failed (with the API's own message).
async fn admin_call(admin: &str, spec: &JobSpec, path: &str, body: serde_json::Value) -> Result<String, String> {
    let base = admin.trim_end_matches('/');
    let request = admin_request(admin, spec, reqwest::Method::POST, path, ADMIN_CALL_TIMEOUT)?
        .header("content-type", "application/json")
        .body(body.to_string());
    let response = request.send().await.map_err(|e| format!("cannot reach its admin API at {base}: {e}"))?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    if status.is_success() { Ok(text) } else { Err(format!("{base}{path} answered {status}: {}", text.trim())) }
}

/// Where the checkpoint (or savepoint) a stop took was written, from the
/// admin API's answer to `POST /api/stop`.
fn stop_checkpoint(answer: &str) -> Option<String> {
    serde_json::from_str::<serde_json::Value>(answer).ok()?.get("checkpoint")?.as_str().map(str::to_string)
}

/// Asks the job's admin API at `admin`: `GET path`, as JSON.
async fn admin_get(admin: &str, spec: &JobSpec, path: &str) -> Result<serde_json::Value, String> {
    let base = admin.trim_end_matches('/');
    let request = admin_request(admin, spec, reqwest::Method::GET, path, Duration::from_secs(5))?;
    let response = request.send().await.map_err(|e| format!("cannot reach its admin API at {base}: {e}"))?;
    let text = response.text().await.map_err(|e| format!("{base}{path}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("{base}{path}: {e}"))
}

/// The name of `phase`, as the API writes it.
pub fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Created => "created",
        Phase::Starting => "starting",
        Phase::Running => "running",
        Phase::Restarting => "restarting",
        Phase::Stopping => "stopping",
        Phase::Stopped => "stopped",
        Phase::Finished => "finished",
        Phase::Failed => "failed",
        Phase::Cancelled => "cancelled",
    }
}

fn check_spec(spec: &JobSpec) -> Result<(), ControlError> {
    let name_ok = !spec.name.is_empty()
        && spec.name.len() <= 128
        && !spec.name.starts_with('.')
        && spec.name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !name_ok {
        return Err(ControlError::Refused(format!(
            "`{}` is not a job name: letters, digits, `-`, `_` and `.` (not first), at most 128",
            spec.name
        )));
    }
    if spec.command.first().is_none_or(String::is_empty) {
        return Err(ControlError::Refused(format!("job `{}` has no command to run", spec.name)));
    }
    if let Some(admin) = &spec.admin
        && !(admin.starts_with("http://") || admin.starts_with("https://"))
    {
        return Err(ControlError::Refused(format!(
            "job `{}`'s admin API `{admin}` is not a URL: write http://host:port",
            spec.name
        )));
    }
    Ok(())
}

/// The start time of process `pid` (field 22 of `/proc/<pid>/stat`, in
/// clock ticks since boot); `None` when there is no such process (or it
/// is a zombie, which has ended).
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command's name, in parentheses, may hold spaces and `)`: the
    // fields after it start after its last `)`.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    // Fields 4 to 21 (the state was field 3), then the start time.
    fields.nth(18)?.parse().ok()
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn io_error(path: &Path, e: std::io::Error) -> ControlError {
    ControlError::Io(format!("{}: {e}", path.display()))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ControlError> {
    let bytes = std::fs::read(path).map_err(|e| io_error(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| ControlError::Io(format!("{}: {e}", path.display())))
}

/// Writes `value` to `path` whole: into a file beside it, then renamed
/// over it, so that a crash leaves the old contents or the new.
fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), ControlError> {
    let text = serde_json::to_vec_pretty(value).map_err(|e| ControlError::Io(format!("{}: {e}", path.display())))?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text).map_err(|e| io_error(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_error(path, e))
}

fn append_event(path: &Path, event: &Event) -> Result<(), ControlError> {
    let mut line = serde_json::to_string(event).map_err(|e| ControlError::Io(format!("{}: {e}", path.display())))?;
    line.push('\n');
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| io_error(path, e))?;
    file.write_all(line.as_bytes()).map_err(|e| io_error(path, e))
}

/// The last events in `path` (lines that do not parse are skipped: a
/// line cut by a crash).
fn read_events(path: &Path) -> VecDeque<Event> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut events: VecDeque<Event> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    while events.len() > EVENTS_KEPT {
        events.pop_front();
    }
    events
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let p = RestartPolicy { max_restarts: 5, window_secs: 60, backoff_ms: 100, max_backoff_ms: 1_000 };
        let waits: Vec<u128> = (1..=6).map(|n| p.backoff(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(p.backoff(200).as_millis(), 1_000);
    }

    #[test]
    fn own_start_time_is_read() {
        let me = std::process::id();
        assert!(start_ticks(me).is_some());
        assert_eq!(start_ticks(me), start_ticks(me));
        assert_eq!(start_ticks(u32::MAX), None);
    }

    #[test]
    fn bad_specs_are_refused_with_the_reason() {
        let spec = |name: &str, command: &[&str]| JobSpec {
            name: name.into(),
            command: command.iter().map(|s| (*s).to_string()).collect(),
            env: BTreeMap::new(),
            dir: None,
            admin: None,
            restart: RestartPolicy::default(),
        };
        assert!(check_spec(&spec("orders-1.v2", &["true"])).is_ok());
        for (s, why) in [
            (spec("../x", &["true"]), "is not a job name"),
            (spec("", &["true"]), "is not a job name"),
            (spec("a b", &["true"]), "is not a job name"),
            (spec("ok", &[]), "has no command"),
        ] {
            let e = check_spec(&s).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
        let mut s = spec("ok", &["true"]);
        s.admin = Some("127.0.0.1:9000".into());
        assert!(check_spec(&s).unwrap_err().to_string().contains("is not a URL"));
    }
}
