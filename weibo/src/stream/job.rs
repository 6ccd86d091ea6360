//! Jobs: a named pipeline, its settings, and running it.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

use crate::checkpoint::{CheckpointConfig, CheckpointStorage, Coordinator, LocalDir, Restore, SavepointRequest};
use crate::graph::CheckpointWiring;

use crate::error::{Error, Result};
use crate::graph::{Graph, Node, Op};
use crate::metrics::{MetricsSnapshot, Registry};
use crate::operator::erase;
use crate::runtime::heads::SourceHead;
use crate::sources::{Source, SourceOutput};
use crate::state::{MemoryBackend, StateBackend};
use crate::stream::{Stream, port};

/// Settings of a job.
#[derive(Clone, Debug)]
pub(crate) struct JobConfig {
    pub(crate) name: String,
    pub(crate) max_key_groups: u16,
    pub(crate) batch_size: usize,
    pub(crate) batch_bytes: usize,
    pub(crate) buffer_timeout: Duration,
    pub(crate) channel_capacity: usize,
    pub(crate) state: Arc<dyn StateBackend>,
    /// Wiring mistakes found while building (reported when the job runs).
    pub(crate) wiring_errors: Vec<String>,
    /// Where and how often checkpoints are taken, if at all.
    pub(crate) checkpoint: Option<CheckpointConfig>,
    /// A checkpoint (or a directory of them) to start from.
    pub(crate) restore_from: Option<RestoreFrom>,
    /// The exactly-once sinks, for the coordinator to commit.
    pub(crate) commits: crate::checkpoint::commit::TwoPhaseCommits,
}

/// Where a job restores from, as configured.
#[derive(Clone, Debug)]
pub(crate) enum RestoreFrom {
    /// A local checkpoint's or savepoint's directory, or a directory of
    /// checkpoints.
    Path(PathBuf),
    /// The same, as a directory in a storage (`""`: its top).
    Stored(Arc<dyn CheckpointStorage>, String),
}

impl RestoreFrom {
    /// Finds the checkpoint to restore and loads it.
    fn load(&self, fingerprint: &str, max_key_groups: u16) -> Result<Restore> {
        let (storage, dir): (Arc<dyn CheckpointStorage>, String) = match self {
            // A checkpoint's manifest names its state files relative to
            // itself (`../shared/..`): the storage is its parent directory.
            RestoreFrom::Path(path) if path.join("MANIFEST").is_file() => {
                let path = std::fs::canonicalize(path).map_err(|source| Error::Io {
                    action: "cannot read checkpoint directory",
                    path: path.clone(),
                    source,
                })?;
                match (path.parent(), path.file_name()) {
                    (Some(parent), Some(name)) => {
                        (Arc::new(LocalDir::new(parent)), name.to_string_lossy().into_owned())
                    }
                    _ => (Arc::new(LocalDir::new(path)), String::new()),
                }
            }
            RestoreFrom::Path(path) => (Arc::new(LocalDir::new(path)), String::new()),
            RestoreFrom::Stored(storage, dir) => (storage.clone(), dir.clone()),
        };
        let manifest = crate::checkpoint::storage::join(&dir, "MANIFEST");
        let is_checkpoint = storage.exists(&manifest).map_err(|source| Error::Io {
            action: "cannot read checkpoint storage",
            path: storage.locate(&manifest),
            source,
        })?;
        if is_checkpoint {
            return Restore::load(&storage, &dir, fingerprint, max_key_groups);
        }
        Restore::latest(&storage, &dir, fingerprint, max_key_groups)?.ok_or_else(|| Error::Checkpoint {
            path: storage.locate(&dir),
            message: "holds no complete checkpoint".into(),
        })
    }
}

/// The default number of key groups: the most partitions a keyed operator
/// can ever be rescaled to.
pub const DEFAULT_MAX_KEY_GROUPS: u16 = 128;

/// A pipeline under construction, then running.
///
/// ```
/// use weibo::{Job, sources::IterSource, sinks::CollectSink};
///
/// let out = CollectSink::new();
/// let job = Job::new("doubles");
/// job.source(IterSource::new(1..=3u32)).map(|x| x * 2).sink(out.clone());
/// let report = weibo::testing::block_on(job.run())?;
/// assert_eq!(out.values(), vec![2, 4, 6]);
/// assert_eq!(report.metrics.operator("map").unwrap().records_in, 3);
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct Job {
    graph: Arc<Mutex<Graph>>,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job").field("name", &self.lock().config.name).finish_non_exhaustive()
    }
}

/// The logical graph, one line per operator.
impl fmt::Display for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.lock(), f)
    }
}

impl Job {
    /// A new, empty job.
    pub fn new(name: impl Into<String>) -> Self {
        let config = JobConfig {
            name: name.into(),
            max_key_groups: DEFAULT_MAX_KEY_GROUPS,
            batch_size: 1024,
            batch_bytes: 256 * 1024,
            buffer_timeout: Duration::from_millis(10),
            channel_capacity: 8,
            state: Arc::new(MemoryBackend),
            wiring_errors: Vec::new(),
            checkpoint: None,
            restore_from: None,
            commits: Default::default(),
        };
        Self { graph: Arc::new(Mutex::new(Graph::new(config))) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Graph> {
        self.graph.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn configure(self, f: impl FnOnce(&mut JobConfig)) -> Self {
        f(&mut self.lock().config);
        self
    }

    /// Sets the number of key groups (default 128): the unit of state
    /// ownership and the most partitions a keyed operator may have. Fix it
    /// when a job is first deployed; state is namespaced by key group.
    #[must_use]
    pub fn with_max_key_groups(self, groups: u16) -> Self {
        self.configure(|c| c.max_key_groups = groups.max(1))
    }

    /// Records per batch on edges and between fused operators (default 1024).
    #[must_use]
    pub fn with_batch_size(self, records: usize) -> Self {
        self.configure(|c| c.batch_size = records.max(1))
    }

    /// How long a partial batch may wait before it is sent anyway (default
    /// 10 ms): the latency bound of a quiet stream.
    #[must_use]
    pub fn with_buffer_timeout(self, timeout: Duration) -> Self {
        self.configure(|c| c.buffer_timeout = timeout)
    }

    /// Batches an edge holds before its sender blocks (default 8).
    #[must_use]
    pub fn with_channel_capacity(self, batches: usize) -> Self {
        self.configure(|c| c.channel_capacity = batches.max(1))
    }

    /// Where keyed state lives (default [`MemoryBackend`]).
    #[must_use]
    pub fn with_state_backend(self, backend: impl StateBackend) -> Self {
        self.configure(|c| c.state = Arc::new(backend))
    }

    /// Takes a checkpoint every `interval` into directory `dir` (created if
    /// needed), and, on start, restores from the newest complete checkpoint
    /// found there (falling back to an older one if the newest is damaged).
    /// The last 3 complete checkpoints are kept.
    ///
    /// Sources must be able to report and resume their position (all
    /// built-in ones can). Checkpoints go on while any source still runs:
    /// a source at its end passes them at its final position. Once every
    /// source has ended the job takes a final checkpoint, which commits
    /// what its exactly-once sinks still hold, and only then does
    /// [`Job::run`] return: a job started again after it finished restores
    /// that checkpoint and has nothing left to do.
    #[must_use]
    pub fn with_checkpoints(self, dir: impl Into<PathBuf>, interval: Duration) -> Self {
        self.with_checkpoint_storage(LocalDir::new(dir), interval)
    }

    /// As [`Job::with_checkpoints`], into `storage`: a [`LocalDir`], a
    /// [`MemoryStorage`](crate::checkpoint::MemoryStorage) (tests), or
    /// any other [`CheckpointStorage`] such as an object store. The
    /// storage's layout is that of the directory.
    #[must_use]
    pub fn with_checkpoint_storage(self, storage: impl CheckpointStorage, interval: Duration) -> Self {
        let storage: Arc<dyn CheckpointStorage> = Arc::new(storage);
        self.configure(|c| {
            // Retention and timeout set before stay.
            let (retain, timeout) = c.checkpoint.as_ref().map_or((3, None), |cp| (cp.retain, cp.timeout));
            c.checkpoint = Some(CheckpointConfig { storage, interval, retain, timeout });
        })
    }

    /// Abandons a checkpoint (or savepoint) that has not completed `timeout`
    /// after it was triggered; the job goes on and the next one is taken.
    /// The default is ten intervals, at least a minute. Call after
    /// [`Job::with_checkpoints`].
    #[must_use]
    pub fn with_checkpoint_timeout(self, timeout: Duration) -> Self {
        self.configure(|c| match c.checkpoint.as_mut() {
            Some(cp) => cp.timeout = Some(timeout),
            None => c
                .wiring_errors
                .push("`with_checkpoint_timeout` before `with_checkpoints`: turn checkpoints on first".into()),
        })
    }

    /// Keeps the last `n` (at least 1) complete checkpoints. Call after
    /// [`Job::with_checkpoints`].
    #[must_use]
    pub fn with_retained_checkpoints(self, n: usize) -> Self {
        self.configure(|c| match c.checkpoint.as_mut() {
            Some(cp) => cp.retain = n.max(1),
            None => c
                .wiring_errors
                .push("`with_retained_checkpoints` before `with_checkpoints`: turn checkpoints on first".into()),
        })
    }

    /// Starts from checkpoint `path`: a checkpoint's directory, or a
    /// directory of checkpoints (then the newest complete one). The job
    /// must be the same pipeline (operators, names, types); keyed
    /// operators may have other partition counts, since state is kept per
    /// key group.
    #[must_use]
    pub fn restore_from(self, path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        self.configure(|c| c.restore_from = Some(RestoreFrom::Path(path)))
    }

    /// As [`Job::restore_from`], from directory `dir` of `storage`: a
    /// checkpoint's (`chk-<n>`), a savepoint's (`savepoints/<name>`), or
    /// one holding checkpoints (`""`, the top: then the newest complete
    /// one). With [`Job::with_checkpoint_storage`] alone, the job already
    /// restores from that storage's newest checkpoint.
    #[must_use]
    pub fn restore_from_storage(self, storage: Arc<dyn CheckpointStorage>, dir: impl Into<String>) -> Self {
        let dir = dir.into();
        self.configure(|c| c.restore_from = Some(RestoreFrom::Stored(storage, dir)))
    }

    /// Adds a source; each of its partitions is read by its own task.
    pub fn source<S: Source>(&self, source: S) -> Stream<S::Item> {
        let name = source.default_name();
        let detail = {
            let p = source.partitions();
            format!("{}, {p} partition{}", source.describe(), if p == 1 { "" } else { "s" })
        };
        let partitions = source.partitions();
        let source = Arc::new(source);
        let mut graph = self.lock();
        let source_index = graph.nodes.iter().filter(|n| matches!(n.op, Op::Source { .. })).count();
        let factory: Arc<crate::graph::SourceFactory> = Arc::new(move |ctx, info, partition, out| {
            let chain = crate::graph::typed::<S::Item>(out, &info.name)?;
            let position = ctx.restore.and_then(|r| r.positions.get(&(info.name.to_string(), partition as u32)));
            let reader = match position {
                Some(&p) => source.open_at(partition, p)?,
                None => source.open(partition)?,
            };
            let output = SourceOutput::new(
                info.name.clone(),
                u32::try_from(source_index).unwrap_or(u32::MAX),
                u32::try_from(partition).unwrap_or(u32::MAX),
                ctx.config.batch_size,
            );
            let partition_name = source.partition_name(partition);
            Ok(Box::new(SourceHead { info, partition_name, reader, chain, output }))
        });
        let node = graph.add(Node {
            kind: "source",
            name,
            detail,
            inputs: Vec::new(),
            outputs: vec![port::<S::Item>("output", true)],
            op: Op::Source { partitions, factory },
        });
        drop(graph);
        let _ = erase::<S::Item>;
        Stream::new(self.graph.clone(), node, 0)
    }

    /// The fused physical plan, one line per node: what runs in which task.
    ///
    /// # Errors
    /// [`Error::Graph`] when the pipeline is wired in a way that cannot run,
    /// with every problem found.
    pub fn plan(&self) -> Result<String> {
        self.lock().plan_text()
    }

    /// Starts the job on the current tokio runtime and returns a handle to
    /// watch it.
    ///
    /// # Errors
    /// [`Error::Graph`] for wiring that cannot run, and any error opening a
    /// source, sink or state; [`Error::Runtime`] when called outside a tokio
    /// runtime.
    pub fn spawn(self) -> Result<JobHandle> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::Runtime {
            job: self.lock().config.name.clone(),
            message:
                "a job runs on tokio: call `run`/`spawn` inside a tokio runtime (for example under #[tokio::main])"
                    .into(),
        })?;
        let registry = Registry::default();
        let graph = self.lock();
        graph.validate()?;
        let config = &graph.config;
        let fingerprint = graph.fingerprint();
        // Checkpoint storage blocks: off the runtime's workers.
        let restore = crate::task::blocking(|| match (&config.restore_from, &config.checkpoint) {
            (Some(from), _) => from.load(&fingerprint, config.max_key_groups).map(Some),
            (None, Some(cp)) => Restore::latest(&cp.storage, "", &fingerprint, config.max_key_groups),
            (None, None) => Ok(None),
        })?;
        if let Some(r) = &restore {
            tracing::info!(job = %config.name, checkpoint = r.checkpoint, dir = %r.location().display(), "restoring");
        }
        config.state.prepare(&config.name)?;
        // Exactly-once sinks: finish what the restored checkpoint committed
        // (again: commits are idempotent), drop what came after it.
        config.commits.on_restore(restore.as_ref().map(|r| (r.checkpoint, r.commits.as_slice())))?;
        let completed = Arc::new(AtomicU64::new(restore.as_ref().map_or(0, |r| r.checkpoint)));
        let (savepoint_tx, savepoint_rx) = mpsc::unbounded_channel();
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
                        run: crate::checkpoint::run_token().into(),
                        completed: completed.clone(),
                    }),
                    Some(Coordinator {
                        config: cp.clone(),
                        job: config.name.clone(),
                        fingerprint: fingerprint.clone(),
                        max_key_groups: config.max_key_groups,
                        triggers: tx,
                        events: ack_rx,
                        tasks: heads,
                        // After every checkpoint already in the directory, so
                        // that a run restored from a savepoint never writes into
                        // (or is deleted as) an older run's checkpoint.
                        next: crate::task::blocking(|| crate::checkpoint::highest_checkpoint(&*cp.storage))?
                            .max(restore.as_ref().map_or(0, |r| r.checkpoint))
                            + 1,
                        completed: completed.clone(),
                        commits: config.commits.clone(),
                        savepoints: savepoint_rx,
                        previous: None,
                    }),
                )
            }
            None => (None, None),
        };
        // Building restores state: storage reads, off the runtime's workers.
        let physical = crate::task::blocking(|| graph.build_with(&registry, restore.as_ref(), wiring))?;
        let name = graph.config.name.clone();
        drop(graph);
        let started = Instant::now();
        let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
        let supervisor = runtime.spawn(async move {
            // The coordinator lives as long as the supervisor: aborting the
            // job aborts it too (`AbortOnDrop`).
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let coordinator = coordinator.map(|c| AbortOnDrop(tokio::spawn(c.run(stopped))));
            let result = supervise(physical.tasks, cancelled).await;
            // Let a checkpoint being completed finish (and commit) before
            // the job reports its end. A job whose tasks all ended has
            // taken its final checkpoint, or failed to: the coordinator
            // says which.
            let _ = stop.send(());
            let checkpoints = match coordinator {
                Some(c) => tokio::time::timeout(Duration::from_secs(30), c).await.unwrap_or(Ok(())),
                None => Ok(()),
            };
            result.and(checkpoints)
        });
        tracing::info!(job = %name, "job started");
        Ok(JobHandle { name, registry, supervisor, started, completed, savepoints, cancel })
    }

    /// Runs the job to the end of its input.
    ///
    /// # Errors
    /// The first error of any task (the others are stopped), or a wiring
    /// error before anything runs.
    pub async fn run(self) -> Result<JobReport> {
        self.spawn()?.wait().await
    }

    /// Runs the job to the end of its input from code that is not async
    /// (a plain `fn main`, a thread of your own), on a tokio runtime of its
    /// own with a worker thread per core, which it shuts down when the job
    /// ends. Inside async code, `.await` [`Job::run`] instead.
    ///
    /// ```
    /// use weibo::{Job, sinks::CollectSink, sources::IterSource};
    ///
    /// // In a plain `fn main`, no `#[tokio::main]` needed:
    /// let out = CollectSink::new();
    /// let job = Job::new("doubles");
    /// job.source(IterSource::new(1..=3u32)).map(|x| x * 2).sink(out.clone());
    /// job.run_blocking()?;
    /// assert_eq!(out.values(), vec![2, 4, 6]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Job::run`]; [`Error::Runtime`] when called on a thread that
    /// runs async code already (it would block it), or when the runtime
    /// cannot start.
    pub fn run_blocking(self) -> Result<JobReport> {
        let job = self.lock().config.name.clone();
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(Error::Runtime {
                job,
                message: "`run_blocking` called inside a tokio runtime, which it would block: `.await` `run()` there"
                    .into(),
            });
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name(format!("weibo-{job}"))
            .build()
            .map_err(|e| Error::Runtime { job, message: format!("cannot start a tokio runtime: {e}") })?;
        runtime.block_on(self.run())
    }
}

/// A task handle that aborts its task when dropped, and can be awaited.
struct AbortOnDrop<R>(JoinHandle<R>);

impl<R> Drop for AbortOnDrop<R> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<R> std::future::Future for AbortOnDrop<Result<R>> {
    type Output = Result<R>;
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<R>> {
        std::pin::Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or_else(|e| Err(Error::Internal(format!("the checkpoint coordinator failed: {e}")))))
    }
}

/// Runs the tasks until they end, one fails, or `cancel` fires; on
/// cancellation every task is aborted and awaited, so nothing of the job
/// runs when this returns.
async fn supervise(
    tasks: Vec<(String, Box<dyn crate::runtime::heads::HeadRunner>, crate::runtime::heads::NodeIo)>,
    cancel: tokio::sync::oneshot::Receiver<()>,
) -> Result<()> {
    // A dropped handle is no request to stop.
    let cancelled = async {
        if cancel.await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(cancelled);
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
                    return Ok(());
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
                    Error::Internal(format!("task `{name}` was cancelled"))
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
        None => Ok(()),
    }
}

/// A running job.
#[derive(Debug)]
pub struct JobHandle {
    name: String,
    registry: Registry,
    supervisor: JoinHandle<Result<()>>,
    started: Instant,
    completed: Arc<AtomicU64>,
    savepoints: Option<mpsc::UnboundedSender<SavepointRequest>>,
    cancel: tokio::sync::oneshot::Sender<()>,
}

impl JobHandle {
    /// The number of the newest complete checkpoint (the one restored from,
    /// until a new one completes), if any.
    pub fn last_checkpoint(&self) -> Option<u64> {
        match self.completed.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    /// Takes a savepoint named `name`: a checkpoint taken now and kept in
    /// `<checkpoint dir>/savepoints/<name>` (in the checkpoint storage),
    /// outside retention; returns where it is. Restore it with
    /// [`Job::restore_from`] (or [`Job::restore_from_storage`]), for
    /// example after changing a keyed operator's partitions or upgrading
    /// the binary.
    ///
    /// # Errors
    /// [`Error::Runtime`] when the job takes no checkpoints or has stopped
    /// (or every source has finished); [`Error::Checkpoint`] when the
    /// checkpoint fails or the name is taken.
    pub async fn savepoint(&self, name: &str) -> Result<PathBuf> {
        let runtime_error = |message: &str| Error::Runtime { job: self.name.clone(), message: message.into() };
        let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !valid || name.starts_with('.') {
            return Err(runtime_error("a savepoint name uses letters, digits, `-`, `_` and `.` (not first)"));
        }
        let tx = self
            .savepoints
            .as_ref()
            .ok_or_else(|| runtime_error("savepoints need `Job::with_checkpoints` (or `with_checkpoint_storage`)"))?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        tx.send(SavepointRequest { name: Some(name.to_string()), reply })
            .map_err(|_| runtime_error("the job has stopped taking checkpoints"))?;
        answer.await.map_err(|_| runtime_error("the job stopped before the savepoint completed"))?
    }

    /// Takes a checkpoint now (instead of waiting for the interval) and
    /// returns its directory once it is complete.
    ///
    /// # Errors
    /// As [`JobHandle::savepoint`].
    pub async fn checkpoint(&self) -> Result<PathBuf> {
        let runtime_error = |message: &str| Error::Runtime { job: self.name.clone(), message: message.into() };
        let tx = self
            .savepoints
            .as_ref()
            .ok_or_else(|| runtime_error("checkpoints need `Job::with_checkpoints` (or `with_checkpoint_storage`)"))?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        tx.send(SavepointRequest { name: None, reply })
            .map_err(|_| runtime_error("the job has stopped taking checkpoints"))?;
        answer.await.map_err(|_| runtime_error("the job stopped before the checkpoint completed"))?
    }

    /// The job's metrics now.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.registry.snapshot()
    }

    /// Whether the job has stopped (finished or failed).
    pub fn is_finished(&self) -> bool {
        self.supervisor.is_finished()
    }

    /// Stops the job now, without flushing.
    pub fn abort(&self) {
        self.supervisor.abort();
    }

    /// Stops the job cleanly: takes a last checkpoint (when the job takes
    /// checkpoints), then stops as [`JobHandle::cancel`] does. A job
    /// restored from that checkpoint, here or in another process, goes on
    /// where this one stopped. A job whose sources have all reached their
    /// end is already finishing with its final checkpoint: `stop` waits
    /// for it to finish.
    ///
    /// # Errors
    /// The job's error if it had failed before it was stopped.
    pub async fn stop(self) -> Result<()> {
        if self.savepoints.is_some() && !self.is_finished() {
            match self.checkpoint().await {
                Ok(_) => {}
                // The job is finishing with its final checkpoint: let it.
                Err(Error::Runtime { message, .. }) if message == crate::checkpoint::ALL_SOURCES_ENDED => {
                    return self.wait().await.map(|_| ());
                }
                Err(e) => tracing::warn!(job = %self.name, error = %e, "no last checkpoint before stopping"),
            }
        }
        self.cancel().await
    }

    /// Stops the job now, without a last checkpoint, and returns once
    /// none of its tasks and not its checkpoint coordinator runs any more:
    /// after `cancel` returns, nothing this job does reaches its checkpoint
    /// directory or its sinks. (Unlike [`JobHandle::abort`], which only
    /// asks.)
    ///
    /// # Errors
    /// The job's error if it had failed before it was cancelled.
    pub async fn cancel(self) -> Result<()> {
        let _ = self.cancel.send(());
        match self.supervisor.await {
            Ok(r) => r,
            Err(e) => Err(Error::Internal(format!("job `{}` supervisor failed: {e}", self.name))),
        }
    }

    /// Waits for the job to end.
    ///
    /// # Errors
    /// The job's first error.
    pub async fn wait(self) -> Result<JobReport> {
        let result = match self.supervisor.await {
            Ok(r) => r,
            Err(e) if e.is_cancelled() => Err(Error::Internal(format!("job `{}` was aborted", self.name))),
            Err(e) => Err(Error::Internal(format!("job `{}` supervisor failed: {e}", self.name))),
        };
        result?;
        let elapsed = self.started.elapsed();
        tracing::info!(job = %self.name, ?elapsed, "job finished");
        Ok(JobReport { metrics: self.registry.snapshot(), elapsed })
    }
}

/// What a finished job reports.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct JobReport {
    /// Final metrics.
    pub metrics: MetricsSnapshot,
    /// Wall time from start to end.
    pub elapsed: Duration,
}
