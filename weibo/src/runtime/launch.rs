//! Starting a job: restore, checkpoint coordinator, tasks, and the
//! supervisor that watches them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

use crate::checkpoint::{Coordinator, Restore, SavepointRequest};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::metrics::Registry;
use crate::record::CheckpointId;

use super::build::CheckpointWiring;
use super::config::JobConfig;
use super::heads::{HeadRunner, NodeIo};
use super::status::{EndGuard, JobState, JobStatus};

/// A job that runs: what its handle watches and steers.
#[derive(Debug)]
pub(crate) struct Launched {
    pub(crate) name: String,
    pub(crate) registry: Registry,
    pub(crate) supervisor: JoinHandle<Result<()>>,
    pub(crate) started: Instant,
    /// The number of the newest complete checkpoint (0: none).
    pub(crate) completed: Arc<AtomicU64>,
    pub(crate) savepoints: Option<mpsc::UnboundedSender<SavepointRequest>>,
    pub(crate) cancel: tokio::sync::oneshot::Sender<()>,
    /// States restored through a migration: (operator id, state, entries).
    pub(crate) migrated: Vec<(String, String, u64)>,
    /// Every checkpoint attempt.
    pub(crate) history: Arc<crate::checkpoint::history::History>,
    /// This run's token (see [`aborting`]).
    pub(crate) run: Arc<str>,
}

/// Sinks that commit the sources' positions with their records: the job
/// needs checkpoints (the positions come from them), and only one such
/// sink (two would commit them in two transactions, and a crash between
/// leaves them disagreeing). Other exactly-once sinks beside one are
/// allowed, with a warning: a job resumed from the positions writes their
/// records again.
fn check_positions_sinks(
    job: &str,
    commits: &crate::checkpoint::commit::TwoPhaseCommits,
    checkpoints: bool,
) -> Result<()> {
    let (with, without) = commits.by_positions();
    let Some(first) = with.first() else { return Ok(()) };
    let refuse = |message: String| Err(Error::Graph { job: job.to_string(), message });
    if !checkpoints {
        return refuse(format!(
            "sink `{first}` commits the sources' positions with its records, and takes them from the job's \
             checkpoints: turn checkpoints on (`with_checkpoints`, or `with_checkpoint_storage` with a \
             `MemoryStorage` when the positions in the sink are all a restart needs)"
        ));
    }
    if with.len() > 1 {
        return refuse(format!(
            "sinks `{}` each commit the sources' positions with their records: one sink per job can (two would \
             commit them in two transactions, which a crash can leave disagreeing)",
            with.join("`, `")
        ));
    }
    if !without.is_empty() {
        tracing::warn!(job, sink = %first, others = ?without, "a sink commits the sources' positions with its records beside other exactly-once sinks: a job resumed from those positions (not from a checkpoint) writes the others' records again");
    }
    Ok(())
}

/// Takes `storage` for this run of job `job` (token `run`), waiting up to
/// `wait` for another run to release it.
///
/// # Errors
/// [`Error::Checkpoint`] naming the holder when another run holds it (past
/// `wait`), or when the storage cannot be locked.
fn take_storage(
    job: &str,
    storage: &Arc<dyn crate::checkpoint::CheckpointStorage>,
    wait: Option<Duration>,
    run: &str,
) -> Result<Arc<dyn crate::checkpoint::StorageLease>> {
    use crate::checkpoint::{LockAttempt, StorageHolder};
    let holder = StorageHolder::this_process(job, run);
    let started = Instant::now();
    let deadline = wait.map(|w| started + w);
    let mut waiting = false;
    loop {
        let attempt = crate::task::blocking(|| storage.try_lock(&holder)).map_err(|e| Error::Checkpoint {
            path: storage.locate(""),
            message: "cannot lock the checkpoint storage for this run".into(),
            source: Some(e.into()),
        })?;
        let other = match attempt {
            LockAttempt::Acquired(lease) => {
                tracing::debug!(job, storage = %storage.locate("").display(), generation = lease.generation(), "checkpoint storage taken");
                return Ok(Arc::new(RunLease { lease: Some(lease), run: run.to_string() }));
            }
            LockAttempt::HeldBy(other) => other,
        };
        // A run this process aborted lets go of the storage once its tasks
        // have stopped: waited for, whatever the settings.
        let ours = other.as_ref().is_some_and(|h| h.pid == std::process::id() && is_aborting(&h.run));
        let who = other.map_or_else(|| "another run (the storage cannot tell which)".to_string(), |h| h.to_string());
        let deadline = if ours {
            Some(deadline.map_or(started + ABORTED_WAIT, |d| d.max(started + ABORTED_WAIT)))
        } else {
            deadline
        };
        match deadline {
            Some(deadline) if Instant::now() < deadline => {
                if !std::mem::replace(&mut waiting, true) {
                    tracing::info!(job, storage = %storage.locate("").display(), holder = %who, "the checkpoint storage is in use: waiting for it");
                }
                crate::task::blocking(|| std::thread::sleep(STORAGE_POLL));
            }
            _ => {
                let waited = wait.map_or_else(String::new, |w| format!(" (waited {w:?})"));
                return Err(Error::Checkpoint {
                    path: storage.locate(""),
                    message: format!(
                        "is in use by {who}{waited}: one run of one job owns a checkpoint storage while it runs. \
                         Stop that run first, or let this one wait for it (`Job::with_storage_wait`)"
                    ),
                    source: None,
                });
            }
        }
    }
}

/// How often a start that waits for its storage tries again.
const STORAGE_POLL: Duration = Duration::from_millis(50);

/// How long a start waits for a run this process aborted to let go of the
/// storage (its coordinator may be finishing a storage call).
const ABORTED_WAIT: Duration = Duration::from_secs(35);

/// The runs of this process that were aborted (`JobHandle::abort`) and
/// still hold their storage.
fn aborted_runs() -> &'static std::sync::Mutex<std::collections::HashSet<String>> {
    static RUNS: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<String>>> = std::sync::OnceLock::new();
    RUNS.get_or_init(Default::default)
}

/// Run `run` of this process was asked to abort: a start that finds the
/// storage held by it waits for it to let go, instead of being refused.
pub(crate) fn aborting(run: &str) {
    aborted_runs().lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(run.to_string());
}

fn is_aborting(run: &str) -> bool {
    aborted_runs().lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(run)
}

/// A run's hold on its storage: released when the last of the run's
/// holders (the supervisor, the coordinator) lets go, which also ends its
/// place among the aborted runs.
#[derive(Debug)]
struct RunLease {
    lease: Option<Box<dyn crate::checkpoint::StorageLease>>,
    run: String,
}

impl crate::checkpoint::StorageLease for RunLease {
    fn generation(&self) -> u64 {
        self.lease.as_ref().map_or(0, |l| l.generation())
    }

    fn check(&self) -> std::result::Result<(), crate::checkpoint::LeaseError> {
        match &self.lease {
            Some(l) => l.check(),
            None => Err(crate::checkpoint::LeaseError::Lost("released".into())),
        }
    }
}

impl Drop for RunLease {
    fn drop(&mut self) {
        drop(self.lease.take());
        aborted_runs().lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.run);
    }
}

/// Checks that this run still holds its checkpoint storage (see
/// [`crate::checkpoint::StorageLease::check`]).
///
/// # Errors
/// [`Error::Checkpoint`] when it does not: the run is fenced.
pub(crate) fn check_lease(
    lease: Option<&dyn crate::checkpoint::StorageLease>,
    checkpoint: &Option<crate::checkpoint::CheckpointConfig>,
) -> Result<()> {
    let (Some(lease), Some(cp)) = (lease, checkpoint) else { return Ok(()) };
    crate::task::blocking(|| lease.check()).map_err(|e| crate::checkpoint::fenced(&*cp.storage, e))
}

/// Starts `graph` on the current tokio runtime: restores from the
/// configured checkpoint (or the newest in the checkpoint storage),
/// finishes the restored checkpoint's commits, builds the tasks and
/// spawns them under a supervisor, with the checkpoint coordinator beside
/// them.
/// `status` follows the job: restoring, running, and how it ended.
pub(crate) fn launch(graph: &Graph, config: &JobConfig, status: &Arc<JobStatus>) -> Result<Launched> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::Runtime {
        job: graph.name.clone(),
        message: "a job runs on tokio: call `run`/`spawn` inside a tokio runtime (for example under #[tokio::main])"
            .into(),
    })?;
    let registry = Registry::default();
    graph.validate()?;
    let fingerprint = graph.fingerprint();
    let run: Arc<str> = crate::checkpoint::run_token().into();
    // The checkpoint storage is this run's before anything is read from
    // it, and until the job ends (the supervisor keeps the lease).
    let lease = match &config.checkpoint {
        Some(cp) => Some(take_storage(&graph.name, &cp.storage, config.storage_wait, &run)?),
        None => None,
    };
    // Checkpoint storage blocks: off the runtime's workers.
    let mut restore = crate::task::blocking(|| match (&config.restore_from, &config.checkpoint) {
        (Some(from), _) => from.load(graph.max_key_groups).map(Some),
        (None, Some(cp)) => Restore::latest(&cp.storage, "", graph.max_key_groups),
        (None, None) => Ok(None),
    })?;
    if let Some(r) = &mut restore {
        r.migrations.clone_from(&config.migrations);
    }
    if config.checkpoint.is_some() || restore.is_some() {
        for warning in graph.warnings() {
            tracing::warn!(job = %graph.name, "{warning}");
        }
    }
    if let Some(r) = &restore {
        status.send_replace(JobState::Restoring { checkpoint: r.checkpoint.get() });
        tracing::info!(job = %graph.name, checkpoint = r.checkpoint.get(), dir = %r.location().display(), "restoring");
        super::matching::check(graph, r, config.allow_unrestored_state)?;
    }
    config.state.prepare(&graph.name)?;
    let mut commits = config.commits.clone();
    commits.bind(|node| graph.nodes.get(node).map(|n| n.id().to_string()));
    commits.count_into(&registry);
    check_positions_sinks(&graph.name, &commits, config.checkpoint.is_some())?;
    let completed = Arc::new(AtomicU64::new(restore.as_ref().map_or(0, |r| r.checkpoint.get())));
    let history = Arc::new(crate::checkpoint::history::History::default());
    let (savepoint_tx, savepoint_rx) = mpsc::unbounded_channel();
    // The coordinator's word that the job must stop (it lost its storage).
    let (fatal_tx, fatal_rx) = tokio::sync::oneshot::channel::<Error>();
    let savepoints = config.checkpoint.is_some().then_some(savepoint_tx);
    let (wiring, coordinator) = match &config.checkpoint {
        Some(cp) => {
            let (heads, sources) = graph.head_counts();
            let (tx, rx): (Vec<_>, Vec<_>) = (0..sources).map(|_| mpsc::unbounded_channel()).unzip();
            let (ack_tx, ack_rx) = mpsc::unbounded_channel();
            (
                Some(CheckpointWiring {
                    triggers: rx,
                    acks: ack_tx,
                    interval: cp.interval,
                    storage: cp.storage.clone(),
                    run: Arc::clone(&run),
                    completed: completed.clone(),
                    job: graph.name.as_str().into(),
                }),
                Some(Coordinator {
                    config: cp.clone(),
                    job: graph.name.clone(),
                    fingerprint: fingerprint.clone(),
                    operators: super::matching::operator_entries(graph),
                    max_key_groups: graph.max_key_groups,
                    triggers: tx,
                    events: ack_rx,
                    tasks: heads,
                    // After every checkpoint already in the directory, so
                    // that a run restored from a savepoint never writes into
                    // (or is deleted as) an older run's checkpoint.
                    next: crate::task::blocking(|| crate::checkpoint::highest_checkpoint(&*cp.storage))?
                        .max(restore.as_ref().map_or(CheckpointId::NONE, |r| r.checkpoint))
                        .next(),
                    completed: completed.clone(),
                    commits: commits.clone(),
                    savepoints: savepoint_rx,
                    previous: None,
                    history: history.clone(),
                    lease: lease.clone(),
                    fatal: Some(fatal_tx),
                }),
            )
        }
        None => (None, None),
    };
    // Building restores state: storage reads, off the runtime's workers.
    let restoring = restore.as_ref().map(|r| {
        tracing::info_span!("restore", job = %graph.name, checkpoint = r.checkpoint.get(), dir = %r.location().display())
            .entered()
    });
    let physical = crate::task::blocking(|| super::build::build(graph, config, &registry, restore.as_ref(), wiring))?;
    if let Some(r) = &restore {
        r.progress.finish();
        tracing::info!(job = %graph.name, checkpoint = r.checkpoint.get(), entries = r.progress.done(),
            of = r.progress.total, elapsed = ?r.progress.elapsed(), "restored");
        history.restored(r.progress.done(), r.progress.elapsed());
    }
    drop(restoring);
    let migrated = match &restore {
        Some(r) => {
            super::matching::check_all_read(graph, r, config.allow_unrestored_state)?;
            // The restore is accepted: every check is behind it. Only now
            // do the exactly-once sinks finish what the restored checkpoint
            // committed (again: commits are idempotent) and drop what came
            // after it, under the storage's lease.
            check_lease(lease.as_deref(), &config.checkpoint)?;
            commits.on_restore(Some((r.checkpoint, r.commits.as_slice(), r.sources.as_slice())))?;
            // One line per state, its instances' entries summed.
            let mut by_state: std::collections::BTreeMap<(String, String), u64> = std::collections::BTreeMap::new();
            for (operator, state, n) in r.migrated.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter() {
                *by_state.entry((operator.clone(), state.clone())).or_default() += n;
            }
            by_state.into_iter().map(|((operator, state), n)| (operator, state, n)).collect()
        }
        None => {
            check_lease(lease.as_deref(), &config.checkpoint)?;
            commits.on_restore(None)?;
            Vec::new()
        }
    };
    let name = graph.name.clone();
    let started = Instant::now();
    let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
    let end = EndGuard(status.clone());
    status.send_replace(JobState::Running);
    let job_name = graph.name.clone();
    let supervisor = runtime.spawn(async move {
        // Released when the job has ended, its last commit done.
        let _lease = lease;
        // The coordinator lives as long as the supervisor: aborting the
        // job aborts it too (`CoordinatorTask`).
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let coordinator = coordinator.map(|c| on_own_runtime(&job_name, c.run(stopped)));
        let supervised = supervise(physical.tasks, cancelled, fatal_rx).await;
        let was_cancelled = matches!(supervised, Ok(true));
        let result = supervised.map(|_| ());
        // Let a checkpoint being completed finish (and commit) before
        // the job reports its end. A job whose tasks all ended has
        // taken its final checkpoint, or failed to: the coordinator
        // says which.
        let _ = stop.send(());
        let checkpoints = match coordinator {
            Some(c) => tokio::time::timeout(Duration::from_secs(30), c).await.unwrap_or(Ok(())),
            None => Ok(()),
        };
        let result = result.and(checkpoints);
        end.ended(&result, was_cancelled);
        result
    });
    tracing::info!(job = %name, "job started");
    Ok(Launched { name, registry, supervisor, started, completed, savepoints, cancel, migrated, history, run })
}

/// Runs the checkpoint coordinator (`run`) on a runtime of its own, of
/// one worker thread (`weibo-checkpoints`), rather than among the job's
/// tasks.
///
/// A job's tasks keep the runtime's workers busy: a worker polls a task
/// that has records for as long as it has them, and a task woken from
/// outside (a savepoint request, a state file written on a blocking
/// thread) waits for a worker to look at its queue. Among the tasks, the
/// coordinator waited that way at each step of a checkpoint, a large share
/// of a small incremental checkpoint's time (`bench ckpt` on fjall). On
/// its own thread it is woken by the operating system at once. The runtime is
/// multi-threaded, as a job's must be for a checkpoint storage or a sink
/// that waits on an async client with `Handle::current().block_on` under
/// [`crate::blocking`] (see [`crate::checkpoint::CheckpointStorage`]).
/// The task is awaited and aborted from the job's runtime; when the
/// returned handle is dropped (the job aborted, or the supervisor done
/// waiting for the coordinator at the job's end), the task is aborted and
/// the runtime shuts down once the task has ended (see
/// [`CoordinatorTask`]'s `Drop`; a checkpoint in flight is abandoned, as
/// any that does not complete). Should the runtime not start, the
/// coordinator runs among the tasks, as before.
fn on_own_runtime(job: &str, run: impl Future<Output = Result<()>> + Send + 'static) -> CoordinatorTask {
    let built = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("weibo-checkpoints")
        .enable_all()
        .build();
    match built {
        Ok(rt) => CoordinatorTask { task: Some(rt.spawn(run)), runtime: Some(OwnRuntime(Some(rt))) },
        Err(e) => {
            tracing::warn!(job, error = %e, "cannot start the checkpoint coordinator's runtime: it runs among the tasks");
            CoordinatorTask { task: Some(tokio::spawn(run)), runtime: None }
        }
    }
}

/// The checkpoint coordinator's task, and its runtime (see
/// [`on_own_runtime`]); awaited for its result. Dropped (the job aborted,
/// or done waiting for it), it aborts the task and shuts its runtime down
/// once the task has ended.
struct CoordinatorTask {
    task: Option<JoinHandle<Result<()>>>,
    runtime: Option<OwnRuntime>,
}

impl std::future::Future for CoordinatorTask {
    type Output = Result<()>;
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<()>> {
        let Some(task) = self.task.as_mut() else {
            return std::task::Poll::Ready(Err(crate::error::internal_error!(
                "the checkpoint coordinator was awaited twice"
            )));
        };
        std::pin::Pin::new(task)
            .poll(cx)
            .map(|r| r.unwrap_or_else(|e| Err(crate::error::internal_error!("the checkpoint coordinator failed: {e}"))))
    }
}

impl Drop for CoordinatorTask {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else { return };
        task.abort();
        let Some(mut runtime) = self.runtime.take() else { return };
        if task.is_finished() {
            // Nothing runs on it: shut down at once (`OwnRuntime`).
            return;
        }
        // The task may be in the middle of a poll, on a thread of its own:
        // a storage call under `crate::blocking` hands the worker's core
        // to another thread, and the task goes on where it was when the
        // call returns. Shut down under it, the runtime's timers stop, and
        // the task's next tick panics. So a thread of its own waits (up to
        // 30 s) for the aborted task to end at its next `await`, then
        // shuts the runtime down (this one is the job's, where a runtime
        // cannot be shut down blocking). Should the thread not start, the
        // runtime shuts down without waiting, as `OwnRuntime` does.
        let Some(rt) = runtime.0.take() else { return };
        let rt = OwnRuntime(Some(rt));
        let ended = std::thread::Builder::new().name("weibo-checkpoints-end".into()).spawn(move || {
            let mut rt = rt;
            if let Some(rt) = rt.0.take() {
                let _ = rt.block_on(async move { tokio::time::timeout(Duration::from_secs(30), task).await });
                rt.shutdown_timeout(Duration::from_secs(1));
            }
        });
        if let Err(e) = ended {
            tracing::warn!(error = %e, "cannot start a thread to end the checkpoint coordinator's runtime");
        }
    }
}

/// The coordinator's runtime, shut down without waiting when dropped (it
/// is dropped inside the job's runtime, where a runtime cannot shut down
/// blocking).
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Runs the tasks until they end, one fails, or `cancel` fires; on
/// cancellation every task is aborted and awaited, so nothing of the job
/// runs when this returns.
/// Runs `tasks` until they all end (`Ok(false)`), one fails, or `cancel`
/// fires (`Ok(true)`).
/// `fatal` stops them too, with its error (the coordinator's: the run lost
/// its storage).
async fn supervise(
    tasks: Vec<(String, Box<dyn HeadRunner>, NodeIo)>,
    cancel: tokio::sync::oneshot::Receiver<()>,
    fatal: tokio::sync::oneshot::Receiver<Error>,
) -> Result<bool> {
    // A dropped handle is no request to stop.
    let cancelled = async {
        if cancel.await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(cancelled);
    // A coordinator that ends without a word stops nothing.
    let fatal = async {
        match fatal.await {
            Ok(e) => e,
            Err(_) => std::future::pending::<Error>().await,
        }
    };
    tokio::pin!(fatal);
    let mut set = JoinSet::new();
    let mut names = HashMap::new();
    for (name, runner, io) in tasks {
        let handle = set.spawn(runner.run(io));
        names.insert(handle.id(), name);
    }
    // A task that stops makes its neighbours fail with `Disconnected`; the
    // job's error is the one that started it, so a `Disconnected` waits a
    // little for a better one.
    let mut secondary: Option<Error> = None;
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d, set.join_next_with_id()).await {
                Ok(next) => next,
                Err(_) => break,
            },
            None => tokio::select! {
                next = set.join_next_with_id() => next,
                () = &mut cancelled => {
                    set.abort_all();
                    while set.join_next().await.is_some() {}
                    return Ok(true);
                }
                e = &mut fatal => {
                    set.abort_all();
                    while set.join_next().await.is_some() {}
                    return Err(e);
                }
            },
        };
        let Some(joined) = next else { break };
        let error = match joined {
            Ok((_, Ok(()))) => continue,
            Ok((_, Err(e))) => e,
            Err(join) => {
                let name = names.get(&join.id()).cloned().unwrap_or_default();
                if join.is_panic() {
                    let payload = join.into_panic();
                    let text = payload
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "non-text panic".into());
                    Error::Panicked { task: name, message: text }
                } else {
                    crate::error::internal_error!("task `{name}` was cancelled")
                }
            }
        };
        if matches!(error, Error::Disconnected { .. }) {
            if secondary.is_none() {
                secondary = Some(error);
                deadline = Some(tokio::time::Instant::now() + Duration::from_secs(1));
            }
            continue;
        }
        set.abort_all();
        return Err(error);
    }
    set.abort_all();
    match secondary {
        Some(e) => Err(e),
        None => Ok(false),
    }
}
