//! Jobs: a named pipeline, its settings, and running it.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::task::{JoinHandle, JoinSet};

use crate::error::{Error, Result};
use crate::graph::{Graph, Node, Op};
use crate::metrics::{MetricsSnapshot, Registry};
use crate::runtime::erase;
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
            let reader = source.open(partition)?;
            let output = SourceOutput::new(
                info.name.clone(),
                u32::try_from(source_index).unwrap_or(u32::MAX),
                u32::try_from(partition).unwrap_or(u32::MAX),
                ctx.config.batch_size,
            );
            Ok(Box::new(SourceHead { info, reader, chain, output }))
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
    /// [`Error::Graph`] when the pipeline is wired in a way that cannot run.
    pub fn plan(&self) -> Result<String> {
        let graph = self.lock();
        check_wiring(&graph)?;
        graph.plan_text()
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
        check_wiring(&graph)?;
        let physical = graph.build(&registry)?;
        let name = graph.config.name.clone();
        drop(graph);
        let started = Instant::now();
        let supervisor = runtime.spawn(supervise(physical.tasks));
        tracing::info!(job = %name, "job started");
        Ok(JobHandle { name, registry, supervisor, started })
    }

    /// Runs the job to the end of its input.
    ///
    /// # Errors
    /// The first error of any task (the others are stopped), or a wiring
    /// error before anything runs.
    pub async fn run(self) -> Result<JobReport> {
        self.spawn()?.wait().await
    }
}

fn check_wiring(graph: &Graph) -> Result<()> {
    match graph.config.wiring_errors.first() {
        Some(message) => Err(Error::Graph { job: graph.config.name.clone(), message: message.clone() }),
        None => Ok(()),
    }
}

async fn supervise(
    tasks: Vec<(String, Box<dyn crate::runtime::heads::HeadRunner>, crate::runtime::heads::NodeIo)>,
) -> Result<()> {
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
            None => set.join_next_with_id().await,
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
}

impl JobHandle {
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
