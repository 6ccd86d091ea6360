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
use crate::record::CheckpointId;
use crate::runtime::config::{JobConfig, RestoreFrom};
use crate::runtime::launch::Launched;
use crate::runtime::status::JobState;
use crate::sources::Source;
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
    ///
    /// ```
    /// let job = weibo::Job::new("orders");
    /// assert!(job.to_string().starts_with("job `orders`"));
    /// ```
    pub fn new(name: impl Into<String>) -> Self {
        let config = JobConfig::default();
        let graph = Graph::new(name.into(), DEFAULT_MAX_KEY_GROUPS, config.state.name().to_string());
        Self {
            graph: Arc::new(Mutex::new(Pipeline {
                graph,
                config,
                #[cfg(feature = "admin")]
                admin: None,
                #[cfg(feature = "admin")]
                admin_group: None,
                #[cfg(feature = "otel")]
                meter: None,
                #[cfg(feature = "otlp")]
                otlp: None,
            })),
        }
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
    ///
    /// ```
    /// let job = weibo::Job::new("big").with_max_key_groups(1024);
    /// assert!(job.to_string().contains("1024 key groups"));
    /// ```
    #[must_use]
    pub fn with_max_key_groups(self, groups: u16) -> Self {
        self.configure_graph(|g| g.max_key_groups = groups.max(1))
    }

    /// Records per batch on edges and between fused operators (default 1024).
    ///
    /// ```
    /// let job = weibo::Job::new("small-batches").with_batch_size(64);
    /// # drop(job);
    /// ```
    #[must_use]
    pub fn with_batch_size(self, records: usize) -> Self {
        self.configure(|c| c.batch_size = records.max(1))
    }

    /// How long a partial batch may wait before it is sent anyway (default
    /// 10 ms): the latency bound of a quiet stream. A timeout longer than a
    /// day is taken as a day (a partial batch then waits, in effect, until
    /// it fills or its input ends or pauses).
    ///
    /// ```
    /// use std::time::Duration;
    /// // A quiet stream's records wait at most 1 ms in a partial batch.
    /// let job = weibo::Job::new("low-latency").with_buffer_timeout(Duration::from_millis(1));
    /// # drop(job);
    /// ```
    #[must_use]
    pub fn with_buffer_timeout(self, timeout: Duration) -> Self {
        self.configure(|c| c.buffer_timeout = timeout.min(crate::runtime::config::MAX_BUFFER_TIMEOUT))
    }

    /// Batches a keyed instance's inputs hold in all before their senders
    /// block (default 4): shared among the channels that feed it (one per
    /// upstream instance and input), at least two each, so that what is
    /// in flight grows with the parallelism, not with its square.
    ///
    /// ```
    /// let job = weibo::Job::new("deep-edges").with_channel_capacity(32);
    /// # drop(job);
    /// ```
    #[must_use]
    pub fn with_channel_capacity(self, batches: usize) -> Self {
        self.configure(|c| c.channel_capacity = batches.max(1))
    }

    /// How far, in event time, a source partition may read ahead of the
    /// slowest partition of the same source, and of the sources whose
    /// records meet it downstream (joined, connected or unioned; default
    /// 10 s). Sources of pipelines that never meet do not hold each other
    /// back.
    ///
    /// Operators downstream of a `key_by` keep the records of a partition
    /// that reads ahead in windows, join buffers and timers that cannot
    /// fire until the slowest partition's watermark catches up, so the
    /// skew between partitions is state. A partition more than `max_drift` ahead of the
    /// slowest waits (passing checkpoint barriers) until it is not. Only
    /// partitions with a watermark and records to read hold the others
    /// back: one its reader reports idle, or one that has ended, does not.
    /// Results do not change: only the order in which partitions are read.
    ///
    /// ```
    /// use std::time::Duration;
    /// // Partitions read within a minute of event time of each other.
    /// let job = weibo::Job::new("aligned").with_watermark_alignment(Duration::from_secs(60));
    /// # drop(job);
    /// ```
    #[must_use]
    pub fn with_watermark_alignment(self, max_drift: Duration) -> Self {
        self.configure(|c| c.watermark_alignment = Some(max_drift))
    }

    /// Lets every source partition read as far ahead of the others as it
    /// likes (see [`Job::with_watermark_alignment`]).
    ///
    /// ```
    /// let job = weibo::Job::new("unaligned").without_watermark_alignment();
    /// # drop(job);
    /// ```
    #[must_use]
    pub fn without_watermark_alignment(self) -> Self {
        self.configure(|c| c.watermark_alignment = None)
    }

    /// Where keyed state lives (default [`MemoryBackend`](crate::state::MemoryBackend)).
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let job = weibo::Job::new("on-disk").with_state_backend(weibo::state::FjallBackend::open(dir.path())?);
    /// assert!(job.to_string().contains("state: fjall"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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
    ///
    /// ```
    /// use std::time::Duration;
    /// let dir = tempfile::tempdir()?;
    /// let job = weibo::Job::new("checkpointed").with_checkpoints(dir.path(), Duration::from_millis(50));
    /// job.source(weibo::sources::IterSource::new(0..10u32)).sink(weibo::sinks::Blackhole::new());
    /// job.run_blocking()?;
    /// // At the end of input the job took a final checkpoint.
    /// assert!(!weibo::checkpoint::complete_checkpoints(dir.path()).is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_checkpoints(self, dir: impl Into<PathBuf>, interval: Duration) -> Self {
        self.with_checkpoint_storage(LocalDir::new(dir), interval)
    }

    /// As [`Job::with_checkpoints`], into `storage`: a [`LocalDir`], a
    /// [`MemoryStorage`](crate::checkpoint::MemoryStorage) (tests, and
    /// jobs whose exactly-once sink commits the source positions with its
    /// records: [`TwoPhaseCommitSink::commits_positions`](crate::sinks::TwoPhaseCommitSink::commits_positions)), or
    /// any other [`CheckpointStorage`] such as an object store. The
    /// storage's layout is that of the directory.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::checkpoint::{CheckpointStorage, MemoryStorage};
    /// let storage = MemoryStorage::new();
    /// let job = weibo::Job::new("in-memory").with_checkpoint_storage(storage.clone(), Duration::from_millis(50));
    /// job.source(weibo::sources::IterSource::new(0..10u32)).sink(weibo::sinks::Blackhole::new());
    /// job.run_blocking()?;
    /// assert!(!weibo::checkpoint::complete_checkpoints_in(&storage, "")?.is_empty());
    /// # Ok::<(), weibo::Error>(())
    /// ```
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
    ///
    /// ```
    /// use std::time::Duration;
    /// let job = weibo::Job::new("patient")
    ///     .with_checkpoints(std::env::temp_dir().join("weibo-doc-timeout"), Duration::from_secs(10))
    ///     .with_checkpoint_timeout(Duration::from_secs(120));
    /// # drop(job);
    /// ```
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
    ///
    /// ```
    /// use std::time::Duration;
    /// let job = weibo::Job::new("keeps-ten")
    ///     .with_checkpoints(std::env::temp_dir().join("weibo-doc-retain"), Duration::from_secs(10))
    ///     .with_retained_checkpoints(10);
    /// # drop(job);
    /// ```
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

    /// Sends every value through its codec where bytes would be needed:
    /// records on hash edges are encoded and decoded, and state the
    /// in-memory backend would keep as objects is kept as bytes (every
    /// write encoded, every read decoded). What `weibo::testing` runs its
    /// jobs with, so that a unit test finds a value its codec cannot read
    /// back.
    #[must_use]
    pub(crate) fn with_clock(self, clock: crate::time::clock::Clock) -> Self {
        self.configure(|c| c.clock = clock)
    }

    /// Runs every value through its codec where bytes would be needed (see
    /// `JobConfig::verify_codecs`).
    pub(crate) fn verifying_codecs(self) -> Self {
        self.configure(|c| {
            c.verify_codecs = true;
            if c.state.keeps_objects() {
                c.state = Arc::new(crate::state::EncodedMemoryBackend);
            }
        })
    }

    /// Lets a start wait up to `timeout` for another run to release the
    /// job's checkpoint storage, instead of being refused at once.
    ///
    /// A run owns its checkpoint storage from its start to its end: on a
    /// local directory through a lock of the operating system on its
    /// `LOCK` file (released when the process ends, however it ends), on
    /// an object store through a lease. A second run started on the same
    /// storage, a restart that overlaps the old process, or two processes
    /// on one volume, would otherwise both commit. Without this setting a
    /// start that finds the storage held fails at once, naming the holder
    /// (its job, process, host, and since when); with it, [`Job::spawn`]
    /// waits (blocking its thread, so not on a single-threaded runtime
    /// that the holder runs on) and fails only after `timeout`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let dir = tempfile::tempdir()?;
    /// // Half a second of input.
    /// let pipeline = |job: &weibo::Job| {
    ///     let ids = weibo::sources::Generator::new(100, |i| i).with_rate(200.0);
    ///     job.source(ids).sink(weibo::sinks::Blackhole::new());
    /// };
    /// # weibo::testing::block_on(async {
    /// let first = weibo::Job::new("owner").with_checkpoints(dir.path(), Duration::from_millis(20));
    /// pipeline(&first);
    /// let running = first.spawn()?;
    /// // A second run on the same storage is refused while the first runs...
    /// let second = weibo::Job::new("owner").with_checkpoints(dir.path(), Duration::from_millis(20));
    /// pipeline(&second);
    /// let refused = second.spawn().unwrap_err().to_string();
    /// assert!(refused.contains("is in use by job `owner`"), "{refused}");
    /// // ...or waits for it.
    /// let third = weibo::Job::new("owner")
    ///     .with_checkpoints(dir.path(), Duration::from_millis(20))
    ///     .with_storage_wait(Duration::from_secs(30));
    /// pipeline(&third);
    /// let waiting = tokio::spawn(async move { third.run().await });
    /// running.wait().await?;
    /// waiting.await.expect("the waiting run")?;
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_storage_wait(self, timeout: Duration) -> Self {
        self.configure(|c| c.storage_wait = Some(timeout))
    }

    /// Starts from checkpoint `path`: a checkpoint's directory, or a
    /// directory of checkpoints (then the newest complete one). State is
    /// matched to the job's operators by id (`.uid(..)`, or else the
    /// operator's name): stateless operators may be added, removed or
    /// renamed, a new stateful operator starts empty, and keyed operators
    /// may have other partition counts, since state is kept per key
    /// group. State whose operator the job no longer has is refused (see
    /// [`Job::allow_unrestored_state`]), and so is a keyed operator whose
    /// key type changed.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::sinks::CollectSink;
    /// let dir = tempfile::tempdir()?;
    /// let pipeline = |job: &weibo::Job, out: &CollectSink<(u32, u64)>| {
    ///     job.source(weibo::sources::IterSource::new(0..6u32))
    ///         .key_by(|x: &u32| x % 2)
    ///         .fold(|| 0u64, |n, _| *n += 1)
    ///         .sink(out.clone());
    /// };
    /// let first = weibo::Job::new("counts").with_checkpoints(dir.path(), Duration::from_millis(20));
    /// pipeline(&first, &CollectSink::new());
    /// first.run_blocking()?;
    /// // The final checkpoint holds the counts; a job restored from it has
    /// // nothing left to read and emits nothing more.
    /// let (_, last) = weibo::checkpoint::complete_checkpoints(dir.path()).remove(0);
    /// let out = CollectSink::new();
    /// let again = weibo::Job::new("counts").restore_from(last);
    /// pipeline(&again, &out);
    /// again.run_blocking()?;
    /// assert!(out.values().is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use weibo::checkpoint::MemoryStorage;
    /// let storage = MemoryStorage::new();
    /// let first = weibo::Job::new("copy").with_checkpoint_storage(storage.clone(), Duration::from_millis(20));
    /// first.source(weibo::sources::IterSource::new(0..3u32)).sink(weibo::sinks::CollectSink::new());
    /// first.run_blocking()?;
    /// // The same pipeline restores (state is matched to operators by id).
    /// let again = weibo::Job::new("copy").restore_from_storage(Arc::new(storage), "");
    /// let out = weibo::sinks::CollectSink::new();
    /// again.source(weibo::sources::IterSource::new(0..3u32)).sink(out.clone());
    /// again.run_blocking()?;
    /// assert!(out.values().is_empty(), "the restored source resumes after its end");
    /// # Ok::<(), weibo::Error>(())
    /// ```
    #[must_use]
    pub fn restore_from_storage(self, storage: Arc<dyn CheckpointStorage>, dir: impl Into<String>) -> Self {
        let dir = dir.into();
        self.configure(|c| c.restore_from = Some(RestoreFrom::Stored(storage, dir)))
    }

    /// Lets a restore drop what the checkpoint holds for operators the job
    /// no longer has (keyed state, a source's positions, an exactly-once
    /// sink's pending commits), logging each, instead of refusing to start.
    /// Flink's `allowNonRestoredState`. A dropped sink's pending commits
    /// are never committed: its output of the checkpoint's last epoch is
    /// discarded.
    ///
    /// ```
    /// use std::time::Duration;
    /// let dir = tempfile::tempdir()?;
    /// let first = weibo::Job::new("counts").with_checkpoints(dir.path(), Duration::from_millis(20));
    /// first
    ///     .source(weibo::sources::IterSource::new(0..6u32))
    ///     .key_by(|x: &u32| x % 2)
    ///     .fold(|| 0u64, |n, _| *n += 1)
    ///     .uid("counts")
    ///     .sink(weibo::sinks::Blackhole::new());
    /// first.run_blocking()?;
    /// // The next version has no `counts`: refused, unless allowed.
    /// let v2 = || {
    ///     let job = weibo::Job::new("counts").restore_from(dir.path());
    ///     job.source(weibo::sources::IterSource::new(0..6u32)).sink(weibo::sinks::Blackhole::new());
    ///     job
    /// };
    /// let refused = v2().run_blocking().unwrap_err().to_string();
    /// assert!(refused.contains("`counts`"), "{refused}");
    /// v2().allow_unrestored_state().run_blocking()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn allow_unrestored_state(self) -> Self {
        self.configure(|c| c.allow_unrestored_state = true)
    }

    /// Reads state written with an earlier layout of a state type: where a
    /// restore finds a state whose recorded schema is `Old`'s and the job
    /// reads `New`, it decodes each value as an `Old` and keeps `f(old)`;
    /// every entry goes through it, and the count is in
    /// [`JobReport::migrated`] and the log. The codec (postcard) has no
    /// field names or lengths in its bytes, so a changed type cannot be
    /// read as is: keep the old type beside the new one (under any name;
    /// layouts are compared, not names) for as long as savepoints of it
    /// are to be restored. Applies to states whose values are the type
    /// itself: a `reduce`'s value, a `fold`'s or `aggregate`'s
    /// accumulator (windowed too), a keyed `process` function's state;
    /// and to those that hold it in Weibo's containers: a session window's
    /// sessions, a window `process`'s kept records (each through `f`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use serde::{Deserialize, Serialize};
    /// #[derive(Clone, Serialize, Deserialize)]
    /// struct CountV1 { n: u64 }
    /// #[derive(Clone, Serialize, Deserialize)]
    /// struct Count { n: u64, last: u32 }
    /// let dir = tempfile::tempdir()?;
    /// let v1 = weibo::Job::new("counts").with_checkpoints(dir.path(), Duration::from_secs(60));
    /// v1.source(weibo::sources::IterSource::new(0..6u32))
    ///     .key_by(|x: &u32| x % 2)
    ///     .fold(|| CountV1 { n: 0 }, |c, _| c.n += 1)
    ///     .uid("counts")
    ///     .sink(weibo::sinks::Blackhole::new());
    /// v1.run_blocking()?;
    /// let out = weibo::sinks::CollectSink::new();
    /// let v2 = weibo::Job::new("counts")
    ///     .restore_from(dir.path())
    ///     .with_state_migration(|old: CountV1| Count { n: old.n, last: 0 });
    /// v2.source(weibo::sources::IterSource::new(0..6u32))
    ///     .key_by(|x: &u32| x % 2)
    ///     .fold(|| Count { n: 0, last: 0 }, |c, x| { c.n += 1; c.last = x })
    ///     .uid("counts")
    ///     .map(|(k, c): (u32, Count)| (k, c.n))
    ///     .sink(out.clone());
    /// let report = v2.run_blocking()?;
    /// assert_eq!(report.migrated[0].entries, 2, "both keys' counts");
    /// assert!(out.values().is_empty(), "the restored source was at its end");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_state_migration<Old, New, F>(self, f: F) -> Self
    where
        Old: crate::codec::Data,
        New: crate::codec::Data,
        F: Fn(Old) -> New + Send + Sync + 'static,
    {
        self.configure(|c| c.migrations.extend(migrations(None, f)))
    }

    /// As [`Job::with_state_migration`], for the state of operator
    /// `operator` (its id) only: what a state whose layout did not change
    /// needs when its meaning did (`.state_version(..)` bumped), where
    /// another operator's state of the same type must stay as it is. A
    /// restore prefers an operator's own migration to one for any.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let dir = tempfile::tempdir()?;
    /// let run = |job: weibo::Job, version: u32, out: weibo::sinks::CollectSink<(u32, u64)>| {
    ///     job.source(weibo::sources::IterSource::new(vec![1u32, 2, 3]))
    ///         .key_by(|x: &u32| x % 2)
    ///         .fold(|| 0u64, |total, x| *total += u64::from(x) * 100) // cents
    ///         .uid("totals")
    ///         .state_version(version)
    ///         .sink(out);
    ///     job.run_blocking()
    /// };
    /// let v1 = weibo::Job::new("totals").with_checkpoints(dir.path(), Duration::from_secs(60));
    /// run(v1, 1, weibo::sinks::CollectSink::new())?;
    /// // Version 2 keeps totals in tenths of cents: the same layout, another meaning.
    /// let v2 = weibo::Job::new("totals")
    ///     .restore_from(dir.path())
    ///     .with_state_migration_for("totals", |cents: u64| cents * 10);
    /// let report = run(v2, 2, weibo::sinks::CollectSink::new())?;
    /// assert_eq!(report.migrated[0].entries, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_state_migration_for<Old, New, F>(self, operator: &str, f: F) -> Self
    where
        Old: crate::codec::Data,
        New: crate::codec::Data,
        F: Fn(Old) -> New + Send + Sync + 'static,
    {
        let operator = operator.to_string();
        self.configure(|c| c.migrations.extend(migrations(Some(operator), f)))
    }

    /// Serves the admin API on `addr` (`"127.0.0.1:8081"`; port 0 picks
    /// one, see [`JobHandle::admin_addr`]) while the job runs: its status,
    /// plan, metrics and checkpoints as JSON, savepoints, stop and cancel,
    /// and `/healthz` and `/readyz` probes (the book's "Operating a job"
    /// chapter lists the endpoints). An address other than loopback needs
    /// a token ([`Job::with_admin_token`]): without one the job refuses to
    /// start. Needs the `admin` feature.
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// let job = weibo::Job::new("watched").with_admin("127.0.0.1:0");
    /// job.source(weibo::sources::Generator::new(u64::MAX, |i| i).with_rate(100.0)).sink(weibo::sinks::Blackhole::new());
    /// let handle = job.spawn()?;
    /// assert!(handle.admin_addr().is_some_and(|a| a.ip().is_loopback()));
    /// handle.cancel().await?;
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    #[cfg(feature = "admin")]
    #[must_use]
    pub fn with_admin(self, addr: impl Into<String>) -> Self {
        let addr = addr.into();
        {
            let mut pipeline = self.lock();
            let options = match pipeline.admin.take() {
                Some(options) => options.with_addr(addr),
                None => crate::stream::admin::AdminOptions::new(addr),
            };
            pipeline.admin = Some(options);
        }
        self
    }

    /// The bearer token every admin API request must carry
    /// (`Authorization: Bearer <token>`), but the probes: required to
    /// bind anything other than loopback, and a good idea on a shared
    /// machine even there. Called without [`Job::with_admin`], it turns
    /// the admin API on at `127.0.0.1:8081`.
    #[cfg(feature = "admin")]
    #[must_use]
    pub fn with_admin_token(self, token: impl Into<String>) -> Self {
        {
            let mut pipeline = self.lock();
            let options =
                pipeline.admin.take().unwrap_or_else(|| crate::stream::admin::AdminOptions::new("127.0.0.1:8081"));
            pipeline.admin = Some(options.with_token(token));
        }
        self
    }

    /// Serves the admin API as `options` say: its address and token, the
    /// host names it answers for, its connection cap, its TLS certificate
    /// (the book's "Operating a job" chapter, "Security"). Replaces what
    /// [`Job::with_admin`] and [`Job::with_admin_token`] set. Needs the
    /// `admin` feature.
    #[cfg(feature = "admin")]
    #[must_use]
    pub fn with_admin_options(self, options: crate::stream::admin::AdminOptions) -> Self {
        self.lock().admin = Some(options);
        self
    }

    /// Serves the job's admin API in `group`'s (one server for several
    /// jobs of a process, as a `KafkaGroup` does for its tasks), under
    /// `/jobs/<job name>/`, with the group's token, instead of a server of
    /// its own. The job leaves the group when its handle is dropped. A
    /// group cannot hold two running jobs of the same name: the second
    /// one's `spawn` fails. Needs the `admin` feature.
    #[cfg(feature = "admin")]
    #[must_use]
    pub fn with_admin_group(self, group: &crate::stream::admin::AdminGroup) -> Self {
        self.lock().admin_group = Some(group.clone());
        self
    }

    /// Registers the job's instruments (the book's "Operating a job"
    /// chapter lists them) with an OpenTelemetry `meter`, as observable
    /// counters and gauges: the meter provider's readers and exporters
    /// (OTLP, or any other) collect them, when they collect, from the
    /// counters the job keeps anyway; nothing is recorded per record.
    /// Needs the `otel` feature. The instruments report while the job's
    /// handle lives; once it is dropped they report nothing (the meter
    /// provider keeps their callbacks: the API cannot unregister them).
    ///
    /// ```
    /// let job = weibo::Job::new("metered").with_meter(opentelemetry::global::meter("weibo"));
    /// job.source(weibo::sources::IterSource::new(0..3u32)).sink(weibo::sinks::Blackhole::new());
    /// job.run_blocking()?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    #[cfg(feature = "otel")]
    #[must_use]
    pub fn with_meter(self, meter: opentelemetry::metrics::Meter) -> Self {
        self.lock().meter = Some(meter);
        self
    }

    /// Exports the job's instruments (as [`with_meter`](Self::with_meter)
    /// registers them) over OTLP to `endpoint`, the full URL of a
    /// collector's metrics endpoint over HTTP with protobuf (for example
    /// `http://127.0.0.1:4318/v1/metrics`), every `every`, as service
    /// (the job's name). The last export, when the job's handle is
    /// dropped, carries the job's final values. Needs the `otlp` feature;
    /// a URL the exporter refuses makes [`spawn`](Self::spawn) fail naming
    /// it. For TLS, authentication headers or another protocol, build your
    /// own meter provider and pass its meter to `with_meter`.
    #[cfg(feature = "otlp")]
    #[must_use]
    pub fn with_otlp(self, endpoint: impl Into<String>, every: Duration) -> Self {
        self.lock().otlp = Some((endpoint.into(), every));
        self
    }

    /// Adds a source; each of its partitions is read by its own task.
    ///
    /// ```
    /// let job = weibo::Job::new("two-partitions");
    /// let s = job.source(weibo::sources::Generator::new(10, |i| i).with_partitions(2));
    /// s.sink(weibo::sinks::Blackhole::new());
    /// assert!(job.plan()?.contains("chain `generator` x2"));
    /// # Ok::<(), weibo::Error>(())
    /// ```
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
        let factory = crate::operator::source::factory(source, source_index);
        let node = graph.add(Node {
            kind: "source",
            name,
            uid: None,
            state_version: 1,
            named: false,
            stateful: false,
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
    ///
    /// ```
    /// let job = weibo::Job::new("planned");
    /// job.source(weibo::sources::IterSource::new(vec![1u32]))
    ///     .map(|x| x + 1)
    ///     .key_by(|x: &u32| *x)
    ///     .reduce(|a, b| a + b)
    ///     .sink(weibo::sinks::Blackhole::new());
    /// let plan = job.plan()?;
    /// assert!(plan.contains("values -> map => hash(u32) reduce"), "{plan}");
    /// # Ok::<(), weibo::Error>(())
    /// ```
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
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// let job = weibo::Job::new("spawned");
    /// let out = weibo::sinks::CollectSink::new();
    /// job.source(weibo::sources::IterSource::new(vec![1u32, 2])).sink(out.clone());
    /// let handle = job.spawn()?;
    /// handle.wait().await?;
    /// assert_eq!(out.values(), vec![1, 2]);
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn spawn(self) -> Result<JobHandle> {
        let pipeline = self.lock();
        let status = Arc::new(tokio::sync::watch::channel(JobState::Starting).0);
        // The admin API first: it answers while the job restores.
        #[cfg(feature = "admin")]
        let admin = match (&pipeline.admin, &pipeline.admin_group) {
            (Some(_), Some(_)) => {
                return Err(Error::Refused {
                    job: pipeline.graph.name.clone(),
                    message: "the job has its own admin API (`with_admin`) and a group's (`with_admin_group`): \
                              choose one"
                        .into(),
                });
            }
            (None, Some(group)) => Some(crate::stream::admin::join(
                group,
                &pipeline.graph.name,
                status.subscribe(),
                pipeline.graph.describe(),
            )?),
            (Some(config), None) => {
                if tokio::runtime::Handle::try_current().is_err() {
                    return Err(Error::Runtime {
                        job: pipeline.graph.name.clone(),
                        message: "a job runs on tokio: call `run`/`spawn` inside a tokio runtime".into(),
                    });
                }
                Some(crate::stream::admin::start(
                    &pipeline.graph.name,
                    config,
                    status.subscribe(),
                    pipeline.graph.describe(),
                )?)
            }
            (None, None) => None,
        };
        // Before the job starts: an endpoint the exporter refuses fails
        // the spawn with nothing running.
        #[cfg(feature = "otlp")]
        let otlp = match &pipeline.otlp {
            Some((endpoint, every)) => {
                Some(crate::metrics::otel::otlp_provider(&pipeline.graph.name, endpoint, *every)?)
            }
            None => None,
        };
        let launched = crate::runtime::launch::launch(&pipeline.graph, &pipeline.config, &status);
        let Launched { name, registry, supervisor, started, completed, savepoints, cancel, migrated, history, run } =
            match launched {
                Ok(l) => l,
                Err(e) => {
                    status.send_replace(JobState::Failed { error: e.report().to_string() });
                    return Err(e);
                }
            };
        let cancel = Arc::new(Mutex::new(Some(cancel)));
        #[cfg(feature = "admin")]
        if let Some(server) = &admin {
            server.admin.attach(crate::stream::admin::Control {
                registry: registry.clone(),
                requests: savepoints.clone(),
                completed: completed.clone(),
                cancel: cancel.clone(),
                history: history.clone(),
                storage: pipeline.config.checkpoint.as_ref().map(|c| c.storage.clone()),
            });
        }
        #[cfg(feature = "otlp")]
        let otlp_meter = otlp.as_ref().map(|p| opentelemetry::metrics::MeterProvider::meter(p, "weibo"));
        #[cfg(all(feature = "otel", not(feature = "otlp")))]
        let otlp_meter: Option<opentelemetry::metrics::Meter> = None;
        #[cfg(feature = "otel")]
        let meters: Vec<opentelemetry::metrics::Meter> = pipeline.meter.iter().cloned().chain(otlp_meter).collect();
        #[cfg(feature = "otel")]
        let instruments: Vec<_> = meters
            .iter()
            .map(|meter| {
                let (job, registry, history, has_checkpoints) =
                    (name.clone(), registry.clone(), history.clone(), savepoints.is_some());
                let source: crate::metrics::otel::FamilySource = Arc::new(move || {
                    let totals = has_checkpoints.then(|| history.totals());
                    crate::metrics::prometheus::families(
                        &job,
                        &registry.snapshot(),
                        totals.as_ref(),
                        started.elapsed().as_secs_f64(),
                    )
                });
                crate::metrics::otel::register(meter, &source)
            })
            .collect();
        let migrated =
            migrated.into_iter().map(|(operator, state, entries)| MigratedState { operator, state, entries }).collect();
        Ok(JobHandle {
            name,
            registry,
            supervisor,
            started,
            completed,
            savepoints,
            cancel,
            migrated,
            history,
            run,
            status: status.subscribe(),
            #[cfg(feature = "admin")]
            admin,
            #[cfg(feature = "otlp")]
            _otlp: otlp,
            #[cfg(feature = "otel")]
            _instruments: instruments,
        })
    }

    /// Runs the job to the end of its input.
    ///
    /// # Errors
    /// The first error of any task (the others are stopped), or a wiring
    /// error before anything runs.
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// let job = weibo::Job::new("runs");
    /// job.source(weibo::sources::IterSource::new(0..5u32)).sink(weibo::sinks::Blackhole::new());
    /// let report = job.run().await?;
    /// assert_eq!(report.metrics.operator("values").unwrap().records_out, 5);
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
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
///
/// ```
/// # weibo::testing::block_on(async {
/// let job = weibo::Job::new("watched");
/// job.source(weibo::sources::Generator::new(u64::MAX, |i| i).with_rate(10_000.0)).sink(weibo::sinks::Blackhole::new());
/// let handle = job.spawn()?;
/// tokio::time::sleep(std::time::Duration::from_millis(50)).await;
/// assert!(!handle.is_finished());
/// assert!(handle.metrics().operator("generator").is_some());
/// handle.cancel().await?;
/// # Ok::<(), weibo::Error>(())
/// # })?;
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Debug)]
pub struct JobHandle {
    name: String,
    registry: Registry,
    supervisor: JoinHandle<Result<()>>,
    started: Instant,
    completed: Arc<AtomicU64>,
    savepoints: Option<mpsc::UnboundedSender<SavepointRequest>>,
    /// Taken by whoever cancels first: this handle or the admin API.
    cancel: Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>>,
    migrated: Vec<MigratedState>,
    history: Arc<crate::checkpoint::history::History>,
    /// The run's token: what its storage's lock names.
    run: Arc<str>,
    status: tokio::sync::watch::Receiver<JobState>,
    /// The admin API's server, while the handle lives.
    #[cfg(feature = "admin")]
    admin: Option<crate::stream::admin::AdminServer>,
    /// The OTLP exporter's meter provider (`Job::with_otlp`): dropped
    /// before the instruments, so that its last export, on shutdown, still
    /// reads them.
    #[cfg(feature = "otlp")]
    _otlp: Option<opentelemetry_sdk::metrics::SdkMeterProvider>,
    /// The instruments registered with the job's meters.
    #[cfg(feature = "otel")]
    _instruments: Vec<crate::metrics::otel::Instruments>,
}

impl JobHandle {
    /// What the job is doing: running, or how it ended.
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// let job = weibo::Job::new("status");
    /// job.source(weibo::sources::Generator::new(u64::MAX, |i| i).with_rate(100.0)).sink(weibo::sinks::Blackhole::new());
    /// let handle = job.spawn()?;
    /// assert_eq!(handle.status(), weibo::JobState::Running);
    /// handle.cancel().await?;
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn status(&self) -> JobState {
        self.status.borrow().clone()
    }

    /// The checkpoints the job took (or failed to), oldest first: the
    /// last 200.
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// let dir = tempfile::tempdir().unwrap();
    /// let job = weibo::Job::new("history").with_checkpoints(dir.path(), std::time::Duration::from_secs(3600));
    /// job.source(weibo::sources::Generator::new(u64::MAX, |i| i).with_rate(100.0)).sink(weibo::sinks::Blackhole::new());
    /// let handle = job.spawn()?;
    /// handle.savepoint("one").await?;
    /// let history = handle.checkpoint_history();
    /// assert_eq!((history[0].kind, history[0].outcome), ("savepoint", "completed"));
    /// handle.cancel().await?;
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn checkpoint_history(&self) -> Vec<crate::checkpoint::CheckpointRecord> {
        self.history.records()
    }

    /// The job's metrics now in Prometheus' text exposition format: what
    /// the admin API's `/metrics` serves (the book's "Operating a job"
    /// chapter lists them), for a server of your own to serve instead.
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// let job = weibo::Job::new("scraped");
    /// job.source(weibo::sources::Generator::new(u64::MAX, |i| i).with_rate(100.0)).sink(weibo::sinks::Blackhole::new());
    /// let handle = job.spawn()?;
    /// let text = handle.prometheus_metrics();
    /// assert!(text.contains(r#"weibo_operator_records_out_total{job="scraped",operator="generator"}"#));
    /// handle.cancel().await?;
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn prometheus_metrics(&self) -> String {
        let totals = self.savepoints.is_some().then(|| self.history.totals());
        let families = crate::metrics::prometheus::families(
            &self.name,
            &self.registry.snapshot(),
            totals.as_ref(),
            self.started.elapsed().as_secs_f64(),
        );
        crate::metrics::prometheus::prometheus_text(&families)
    }

    /// Where the admin API listens ([`Job::with_admin`]), if it does.
    #[cfg(feature = "admin")]
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin.as_ref().map(|a| a.local_addr)
    }

    /// The states the job restored through a migration
    /// ([`Job::with_state_migration`]), with how many entries each.
    pub fn migrated(&self) -> &[MigratedState] {
        &self.migrated
    }

    /// The number of the newest complete checkpoint (the one restored from,
    /// until a new one completes), if any.
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// use std::time::Duration;
    /// let dir = tempfile::tempdir().unwrap();
    /// let job = weibo::Job::new("ticks").with_checkpoints(dir.path(), Duration::from_millis(20));
    /// job.source(weibo::sources::Generator::new(u64::MAX, |i| i).with_rate(1_000.0)).sink(weibo::sinks::Blackhole::new());
    /// let handle = job.spawn()?;
    /// assert_eq!(handle.last_checkpoint(), None);
    /// while handle.last_checkpoint().is_none() {
    ///     tokio::time::sleep(Duration::from_millis(5)).await;
    /// }
    /// handle.cancel().await?;
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
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
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// use std::time::Duration;
    /// let dir = tempfile::tempdir().unwrap();
    /// let job = weibo::Job::new("upgradable").with_checkpoints(dir.path(), Duration::from_secs(60));
    /// job.source(weibo::sources::Generator::new(u64::MAX, |i| i).with_rate(1_000.0)).sink(weibo::sinks::Blackhole::new());
    /// let handle = job.spawn()?;
    /// let saved = handle.savepoint("before-upgrade").await?;
    /// assert!(saved.ends_with("savepoints/before-upgrade"));
    /// handle.cancel().await?;
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub async fn savepoint(&self, name: &str) -> Result<PathBuf> {
        let refused = |message: &str| Error::Refused { job: self.name.clone(), message: message.into() };
        let valid = !name.is_empty()
            && name.len() <= 128
            && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !valid || name.starts_with('.') {
            return Err(refused("a savepoint name uses up to 128 letters, digits, `-`, `_` and `.` (not first)"));
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
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// use std::time::Duration;
    /// let dir = tempfile::tempdir().unwrap();
    /// let job = weibo::Job::new("now").with_checkpoints(dir.path(), Duration::from_secs(3600));
    /// job.source(weibo::sources::Generator::new(u64::MAX, |i| i).with_rate(1_000.0)).sink(weibo::sinks::Blackhole::new());
    /// let handle = job.spawn()?;
    /// let taken = handle.checkpoint().await?; // no waiting for the hour
    /// assert!(taken.join("MANIFEST").is_file());
    /// handle.cancel().await?;
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
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
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// let job = weibo::Job::new("counted");
    /// job.source(weibo::sources::IterSource::new(0..100u32)).map(|x| x * 2).sink(weibo::sinks::Blackhole::new());
    /// let handle = job.spawn()?;
    /// let during = handle.metrics(); // while it runs: counters so far
    /// assert!(during.operator("map").is_some());
    /// let report = handle.wait().await?;
    /// assert_eq!(report.metrics.operator("map").unwrap().records_in, 100);
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn metrics(&self) -> MetricsSnapshot {
        self.registry.snapshot()
    }

    /// Whether the job has stopped (finished or failed).
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// let job = weibo::Job::new("short");
    /// job.source(weibo::sources::IterSource::new(vec![1u8])).sink(weibo::sinks::Blackhole::new());
    /// let handle = job.spawn()?;
    /// while !handle.is_finished() {
    ///     tokio::task::yield_now().await;
    /// }
    /// handle.wait().await?;
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn is_finished(&self) -> bool {
        self.supervisor.is_finished()
    }

    /// Stops the job now, without flushing. It returns before the job has
    /// stopped; the job lets go of its checkpoint storage once its tasks
    /// and its checkpoint coordinator have (a start of the job in this
    /// process waits for that, as it would not for another run).
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// let job = weibo::Job::new("endless");
    /// job.source(weibo::sources::Generator::new(u64::MAX, |i| i)).sink(weibo::sinks::Blackhole::new());
    /// let handle = job.spawn()?;
    /// handle.abort(); // asks; `cancel().await` also waits
    /// while !handle.is_finished() {
    ///     tokio::task::yield_now().await;
    /// }
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn abort(&self) {
        crate::runtime::launch::aborting(&self.run);
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
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// use std::time::Duration;
    /// let dir = tempfile::tempdir().unwrap();
    /// let job = weibo::Job::new("stoppable").with_checkpoints(dir.path(), Duration::from_secs(3600));
    /// job.source(weibo::sources::Generator::new(u64::MAX, |i| i).with_rate(1_000.0)).sink(weibo::sinks::Blackhole::new());
    /// let handle = job.spawn()?;
    /// tokio::time::sleep(Duration::from_millis(20)).await;
    /// handle.stop().await?; // a last checkpoint, then stop
    /// assert_eq!(weibo::checkpoint::complete_checkpoints(dir.path()).len(), 1);
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub async fn stop(self) -> Result<()> {
        if self.savepoints.is_some() && !self.is_finished() {
            match self.checkpoint().await {
                Ok(_) => {}
                // The job is finishing with its final checkpoint: let it.
                Err(Error::Refused { message, .. }) if message == crate::checkpoint::ALL_SOURCES_ENDED => {
                    return self.wait().await.map(|_| ());
                }
                Err(e) => tracing::warn!(job = %self.name, error = %e.report(), "no last checkpoint before stopping"),
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
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// let job = weibo::Job::new("cancelled");
    /// let out = weibo::sinks::CollectSink::new();
    /// job.source(weibo::sources::Generator::new(u64::MAX, |i| i).with_rate(1_000.0)).sink(out.clone());
    /// let handle = job.spawn()?;
    /// handle.cancel().await?;
    /// let seen = out.values().len();
    /// tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    /// assert_eq!(out.values().len(), seen, "nothing runs after cancel returned");
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub async fn cancel(self) -> Result<()> {
        if let Some(tx) = self.cancel.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = tx.send(());
        }
        match self.supervisor.await {
            Ok(r) => r,
            Err(e) => Err(crate::error::internal_error!("job `{}` supervisor failed: {e}", self.name)),
        }
    }

    /// Waits for the job to end.
    ///
    /// # Errors
    /// The job's first error.
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// let job = weibo::Job::new("awaited");
    /// job.source(weibo::sources::IterSource::new(vec!["a".to_string()])).sink(weibo::sinks::Blackhole::new());
    /// let report = job.spawn()?.wait().await?;
    /// assert!(report.elapsed.as_secs() < 60);
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub async fn wait(self) -> Result<JobReport> {
        let result = match self.supervisor.await {
            Ok(r) => r,
            Err(e) if e.is_cancelled() => Err(crate::error::internal_error!("job `{}` was aborted", self.name)),
            Err(e) => Err(crate::error::internal_error!("job `{}` supervisor failed: {e}", self.name)),
        };
        result?;
        let elapsed = self.started.elapsed();
        tracing::info!(job = %self.name, ?elapsed, "job finished");
        Ok(JobReport { metrics: self.registry.snapshot(), elapsed, migrated: self.migrated })
    }
}

/// A state a restore read through a migration.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigratedState {
    /// The operator's id.
    pub operator: String,
    /// The state's name in the operator (`value`, `accumulator`, `windows`).
    pub state: String,
    /// How many entries were migrated.
    pub entries: u64,
}

/// What a finished job reports.
///
/// ```
/// let job = weibo::Job::new("reported");
/// job.source(weibo::sources::IterSource::new(0..3u32)).sink(weibo::sinks::Blackhole::new());
/// let report = job.run_blocking()?;
/// assert_eq!(report.metrics.operator("values").unwrap().records_out, 3);
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct JobReport {
    /// Final metrics.
    pub metrics: MetricsSnapshot,
    /// Wall time from start to end.
    pub elapsed: Duration,
    /// The states the job restored through a migration.
    pub migrated: Vec<MigratedState>,
}

/// The migrations of `operator`'s state (any operator's: `None`) from
/// `Old` values to `f`'s: of the values themselves (a reduce's, a fold's
/// or aggregate's accumulator), and of the containers Weibo keeps them in
/// (a session window's sessions, a window's kept elements), each
/// element through `f`.
fn migrations<Old, New, F>(operator: Option<String>, f: F) -> [crate::checkpoint::Migration; 3]
where
    Old: crate::codec::Data,
    New: crate::codec::Data,
    F: Fn(Old) -> New + Send + Sync + 'static,
{
    use crate::operator::windows::{Elements, Sessions};
    let f = Arc::new(f);
    let (sessions, elements) = (f.clone(), f.clone());
    [
        migration(operator.clone(), move |old: Old| f(old)),
        migration(operator.clone(), move |old: Sessions<Old>| {
            Sessions(old.0.into_iter().map(|(window, acc)| (window, sessions(acc))).collect())
        }),
        migration(operator, move |old: Elements<Old>| Elements(old.0.into_iter().map(|e| elements(e)).collect())),
    ]
}

/// A migration of `operator`'s state from `Old` values to `f`'s.
fn migration<Old, New, F>(operator: Option<String>, f: F) -> crate::checkpoint::Migration
where
    Old: crate::codec::Data,
    New: crate::codec::Data,
    F: Fn(Old) -> New + Send + Sync + 'static,
{
    let convert = move |bytes: &[u8]| {
        let new = f(Old::decode(bytes)?);
        let mut out = Vec::new();
        new.encode(&mut out)?;
        Ok(out)
    };
    crate::checkpoint::Migration {
        operator,
        from: crate::state::StateType::of::<Old>(),
        to: crate::state::StateType::of::<New>(),
        convert: Arc::new(convert),
    }
}
