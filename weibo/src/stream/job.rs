//! Jobs: a named pipeline, its settings, and running it.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::checkpoint::{CheckpointConfig, CheckpointStorage, LocalDir, SavepointRequest};
use crate::error::{Error, Result};
use crate::graph::{Graph, Node, Op};
use crate::metrics::{MetricsSnapshot, Registry};
use crate::operator::factory::source_factory;
use crate::operator::source::SourceOp;
use crate::operator::typed;
use crate::record::CheckpointId;
use crate::runtime::config::{JobConfig, RestoreFrom};
use crate::runtime::launch::Launched;
use crate::sources::{Source, SourceOutput};
use crate::state::StateBackend;
use crate::stream::{Pipeline, Stream, port};

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
    graph: Arc<Mutex<Pipeline>>,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job").field("name", &self.lock().name).finish_non_exhaustive()
    }
}

/// The logical graph, one line per operator.
impl fmt::Display for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.lock().graph, f)
    }
}

impl Job {
    /// A new, empty job.
    pub fn new(name: impl Into<String>) -> Self {
        let config = JobConfig::default();
        let graph = Graph::new(name.into(), DEFAULT_MAX_KEY_GROUPS, config.state.name().to_string());
        Self { graph: Arc::new(Mutex::new(Pipeline { graph, config })) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pipeline> {
        self.graph.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn configure(self, f: impl FnOnce(&mut JobConfig)) -> Self {
        f(&mut self.lock().config);
        self
    }

    fn configure_graph(self, f: impl FnOnce(&mut Graph)) -> Self {
        f(&mut self.lock().graph);
        self
    }

    /// Sets the number of key groups (default 128): the unit of state
    /// ownership and the most partitions a keyed operator may have. Fix it
    /// when a job is first deployed; state is namespaced by key group.
    #[must_use]
    pub fn with_max_key_groups(self, groups: u16) -> Self {
        self.configure_graph(|g| g.max_key_groups = groups.max(1))
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
        let mut pipeline = self.lock();
        pipeline.graph.state = backend.name().to_string();
        pipeline.config.state = Arc::new(backend);
        drop(pipeline);
        self
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
        let mut pipeline = self.lock();
        match pipeline.config.checkpoint.as_mut() {
            Some(cp) => cp.timeout = Some(timeout),
            None => pipeline
                .wiring_errors
                .push("`with_checkpoint_timeout` before `with_checkpoints`: turn checkpoints on first".into()),
        }
        drop(pipeline);
        self
    }

    /// Keeps the last `n` (at least 1) complete checkpoints. Call after
    /// [`Job::with_checkpoints`].
    #[must_use]
    pub fn with_retained_checkpoints(self, n: usize) -> Self {
        let mut pipeline = self.lock();
        match pipeline.config.checkpoint.as_mut() {
            Some(cp) => cp.retain = n.max(1),
            None => pipeline
                .wiring_errors
                .push("`with_retained_checkpoints` before `with_checkpoints`: turn checkpoints on first".into()),
        }
        drop(pipeline);
        self
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
        let factory = source_factory(move |ctx, out| {
            let info = ctx.info.clone();
            let partition = ctx.instance;
            let chain = typed::<S::Item>(out, &info.name)?;
            let reader = match ctx.restored_position {
                Some(p) => source.open_at(partition, p)?,
                None => source.open(partition)?,
            };
            let output = SourceOutput::new(
                info.name.clone(),
                u32::try_from(source_index).unwrap_or(u32::MAX),
                u32::try_from(partition).unwrap_or(u32::MAX),
                ctx.batch_size,
            );
            let partition_name = source.partition_name(partition);
            Ok(Box::new(SourceOp { info, partition_name, reader, chain, output }))
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
        let pipeline = self.lock();
        let Launched { name, registry, supervisor, started, completed, savepoints, cancel } =
            crate::runtime::launch::launch(&pipeline.graph, &pipeline.config)?;
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
        let job = self.lock().name.clone();
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
    pub fn last_checkpoint(&self) -> Option<CheckpointId> {
        match self.completed.load(Ordering::Relaxed) {
            0 => None,
            n => Some(CheckpointId::new(n)),
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
    /// [`Error::Refused`] when the job takes no checkpoints or has stopped
    /// (or every source has finished); [`Error::Checkpoint`] when the
    /// checkpoint fails or the name is taken.
    pub async fn savepoint(&self, name: &str) -> Result<PathBuf> {
        let refused = |message: &str| Error::Refused { job: self.name.clone(), message: message.into() };
        let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !valid || name.starts_with('.') {
            return Err(refused("a savepoint name uses letters, digits, `-`, `_` and `.` (not first)"));
        }
        let tx = self
            .savepoints
            .as_ref()
            .ok_or_else(|| refused("savepoints need `Job::with_checkpoints` (or `with_checkpoint_storage`)"))?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        tx.send(SavepointRequest { name: Some(name.to_string()), reply })
            .map_err(|_| refused("the job has stopped taking checkpoints"))?;
        answer.await.map_err(|_| refused("the job stopped before the savepoint completed"))?
    }

    /// Takes a checkpoint now (instead of waiting for the interval) and
    /// returns its directory once it is complete.
    ///
    /// # Errors
    /// As [`JobHandle::savepoint`].
    pub async fn checkpoint(&self) -> Result<PathBuf> {
        let refused = |message: &str| Error::Refused { job: self.name.clone(), message: message.into() };
        let tx = self
            .savepoints
            .as_ref()
            .ok_or_else(|| refused("checkpoints need `Job::with_checkpoints` (or `with_checkpoint_storage`)"))?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        tx.send(SavepointRequest { name: None, reply })
            .map_err(|_| refused("the job has stopped taking checkpoints"))?;
        answer.await.map_err(|_| refused("the job stopped before the checkpoint completed"))?
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
                Err(Error::Refused { message, .. }) if message == crate::checkpoint::ALL_SOURCES_ENDED => {
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
