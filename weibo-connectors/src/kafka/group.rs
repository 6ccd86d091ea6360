//! Scale-out through a Kafka consumer group: every process that runs the
//! same [`KafkaGroup`] joins one consumer group, the group splits the input
//! partitions between them, and each process runs one Weibo job (a
//! [`Task`]) per partition it owns. A task's state and offsets live in its
//! own checkpoint directory under storage every process sees, so when a
//! partition moves (a process joins, leaves or dies), its new owner
//! restores the task from there and goes on.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use weibo::{Error, Job, JobHandle, Result};

use super::source::Progress;
use super::{Connection, KafkaSourceBuilder, connector, connector_caused};

/// The default time after which the group gives a silent process's
/// partitions to the others (librdkafka's default is 45 s).
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a task's start waits for its checkpoint storage, unless the
/// group says otherwise ([`KafkaGroup::with_storage_wait`]).
pub const DEFAULT_STORAGE_WAIT: Duration = Duration::from_secs(120);

type Build = Box<dyn FnMut(&Task) -> Result<Job> + Send>;

/// One process's membership in a group of processes that run the same
/// job over the partitions of the same topics.
///
/// The unit of work is a **task**: partition `p` of every input topic.
/// The group assigns tasks (through the partitions of the first topic; the
/// other topics follow, so they must be co-partitioned: the same number of
/// partitions, keys partitioned alike). For every task it owns, the
/// process calls the `build` closure with the [`Task`] and runs the job it
/// returns; the job reads through [`Task::source`] and checkpoints into
/// [`Task::checkpoint_dir`], a directory under the group's shared storage.
///
/// When a task moves, its old owner stops it with a last checkpoint
/// ([`JobHandle::stop`]) before the group hands it on, and the new owner
/// restores that checkpoint; when the old owner died, the new owner gets
/// the task after the session timeout and restores the newest complete
/// checkpoint, replaying from its offsets. With an exactly-once [`super::KafkaSink`]
/// whose transactions are named by [`Task::id`], the new owner also fences the old owner's
/// transactions, so the output stays exactly once.
///
/// ```no_run
/// use std::time::Duration;
/// use weibo::Job;
/// use weibo_connectors::kafka::{Json, KafkaGroup, KafkaRecord, KafkaSink};
/// # async fn run() -> weibo::Result<()> {
/// let brokers = "127.0.0.1:9092";
/// KafkaGroup::new(brokers, "click-counts", ["clicks"], "/shared/click-counts")
///     .run(move |task| {
///         let job = Job::new(task.id()).with_checkpoints(task.checkpoint_dir(), Duration::from_secs(1));
///         job.source(task.source(Json).build::<serde_json::Value>()?)
///             .map(|r: KafkaRecord<serde_json::Value>| r.value)
///             .sink_exactly_once(KafkaSink::new(brokers, "out", Json).with_transactions(task.id(), task.redo_dir()));
///         Ok(job)
///     })
///     .await
/// # }
/// ```
pub struct KafkaGroup {
    conn: Connection,
    group: String,
    topics: Vec<String>,
    dir: PathBuf,
    session_timeout: Duration,
    /// How long a task's start waits for the previous owner to let go of
    /// the task's checkpoint storage.
    storage_wait: Duration,
    /// `None`: the tasks' sinks commit the offsets.
    commit_interval: Option<Duration>,
    /// How one admin API serves every task's job.
    #[cfg(feature = "admin")]
    admin: Option<weibo::AdminOptions>,
}

impl fmt::Debug for KafkaGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaGroup")
            .field("brokers", &self.conn.brokers)
            .field("group", &self.group)
            .field("topics", &self.topics)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl KafkaGroup {
    /// A member of consumer group `group` reading `topics` from the
    /// cluster at `brokers`, with the tasks' checkpoints under `dir`
    /// (storage every member sees: the same path on a shared file system).
    pub fn new(
        brokers: impl Into<String>,
        group: impl Into<String>,
        topics: impl IntoIterator<Item = impl Into<String>>,
        dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            conn: Connection::new(brokers),
            group: group.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            dir: dir.into(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            storage_wait: DEFAULT_STORAGE_WAIT,
            commit_interval: Some(Duration::from_secs(5)),
            #[cfg(feature = "admin")]
            admin: None,
        }
    }

    /// Serves one admin API on `addr` for every task this process runs
    /// (`weibo::AdminGroup`): each task's job under `/jobs/<task id>/`
    /// (its endpoints and dashboard), and for all of them `/api/jobs`,
    /// `/metrics`, `/healthz` and `/readyz`. A job the build closure gives
    /// joins it (so it must not have an admin API of its own). Stopping or
    /// cancelling one task through it is refused (409): stop the group.
    /// Loopback
    /// by default; any other address needs [`with_admin_token`](Self::with_admin_token).
    /// Needs the `admin` feature.
    #[cfg(feature = "admin")]
    #[must_use]
    pub fn with_admin(mut self, addr: impl Into<String>) -> Self {
        self.admin = Some(match self.admin.take() {
            Some(options) => options.with_addr(addr),
            None => weibo::AdminOptions::new(addr),
        });
        self
    }

    /// The bearer token the group's admin API requires (see
    /// [`with_admin`](Self::with_admin); on its own, it serves on
    /// `127.0.0.1:8081`).
    #[cfg(feature = "admin")]
    #[must_use]
    pub fn with_admin_token(mut self, token: impl Into<String>) -> Self {
        let options = self.admin.take().unwrap_or_else(|| weibo::AdminOptions::new("127.0.0.1:8081"));
        self.admin = Some(options.with_token(token));
        self
    }

    /// The group's admin API as `options` say (its address, token, allowed
    /// host names, connection cap, TLS: `weibo::AdminOptions`), replacing
    /// what [`with_admin`](Self::with_admin) and
    /// [`with_admin_token`](Self::with_admin_token) set.
    #[cfg(feature = "admin")]
    #[must_use]
    pub fn with_admin_options(mut self, options: weibo::AdminOptions) -> Self {
        self.admin = Some(options);
        self
    }

    /// How long the group waits for a silent member before giving its
    /// tasks to the others (default 10 s; the brokers' bounds are
    /// `group.min.session.timeout.ms` and `group.max.session.timeout.ms`).
    #[must_use]
    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// How long a task's job, when it starts, waits for the task's previous
    /// owner to let go of the task's checkpoint storage (default 2 min;
    /// it sets [`Job::with_storage_wait`] on each task's job). A previous
    /// owner that stopped its task hands it over at once; one that died
    /// holds a local directory's lock until its process is gone, and an
    /// object store's lease until it expires
    /// ([`crate::s3::S3StorageBuilder::with_lease_ttl`]).
    #[must_use]
    pub fn with_storage_wait(mut self, wait: Duration) -> Self {
        self.storage_wait = wait;
        self
    }

    /// How often the read offsets are committed to the group for
    /// monitoring (default 5 s). Only monitoring reads them: a task always
    /// starts from its checkpoint's offsets.
    #[must_use]
    pub fn with_commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = Some(interval);
        self
    }

    /// Leaves the group's offsets to the tasks' exactly-once sinks: build
    /// each task's exactly-once [`super::KafkaSink`] with
    /// [`super::KafkaSink::with_consumed_offsets`], and the offsets of
    /// each checkpoint are committed to the group in the transaction of
    /// its output, instead of read positions every few seconds.
    #[must_use]
    pub fn offsets_in_transactions(mut self) -> Self {
        self.commit_interval = None;
        self
    }

    /// Sets a librdkafka property of the group's consumer and of the
    /// tasks' sources (security, client id, …).
    #[must_use]
    pub fn with_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.conn.props.insert(key.into(), value.into());
        self
    }

    /// Joins the group and runs the tasks it assigns until a task fails;
    /// [`KafkaGroup::spawn`] returns a handle to stop it.
    ///
    /// # Errors
    /// As [`KafkaGroup::spawn`], and the first error of any task.
    pub async fn run(self, build: impl FnMut(&Task) -> Result<Job> + Send + 'static) -> Result<()> {
        self.spawn(build)?.wait().await
    }

    /// Joins the group on a thread of its own and returns at once; tasks
    /// start as the group assigns them.
    ///
    /// # Errors
    /// [`Error::Connector`] when the brokers do not answer, a topic does
    /// not exist, or the topics have different partition counts;
    /// [`Error::Runtime`] outside a tokio runtime.
    pub fn spawn(self, build: impl FnMut(&Task) -> Result<Job> + Send + 'static) -> Result<GroupHandle> {
        let name = format!("kafka group {}", self.group);
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::Runtime {
            job: self.group.clone(),
            message: "a Kafka group runs its jobs on tokio: call `run`/`spawn` inside a tokio runtime".into(),
        })?;
        let Some(lead) = self.topics.first().cloned() else {
            return Err(connector(&name, "no topic to read".into()));
        };
        let partitions = self.conn.partitions(&name, &self.topics)?;
        let count = |topic: &str| partitions.iter().filter(|(t, _)| t == topic).count();
        for topic in self.topics.iter().skip(1) {
            if count(topic) != count(&lead) {
                return Err(connector(
                    &name,
                    format!(
                        "topic `{lead}` has {} partitions and `{topic}` has {}: the topics of one group must be \
                         co-partitioned (the same number of partitions, keys partitioned alike)",
                        count(&lead),
                        count(topic)
                    ),
                ));
            }
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| {
            connector_caused(&name, format!("cannot create the group's directory {}", self.dir.display()), e)
        })?;
        #[cfg(feature = "admin")]
        let admin = match &self.admin {
            Some(options) => {
                let group = weibo::AdminGroup::serve_with(&name, options)?;
                // The group starts and stops its tasks: a task stopped
                // through the API would leave its partition unread.
                group.refuse_stop_and_cancel();
                Some(group)
            }
            None => None,
        };
        let shared = Arc::new(Shared {
            name: name.clone(),
            conn: self.conn.clone(),
            group: self.group.clone(),
            topics: self.topics.clone(),
            dir: self.dir.clone(),
            runtime,
            storage_wait: self.storage_wait,
            build: Mutex::new(Box::new(build)),
            tasks: Mutex::new(BTreeMap::new()),
            failure: Mutex::new(None),
            #[cfg(feature = "admin")]
            admin,
        });
        let session = self.session_timeout.as_millis().to_string();
        let heartbeat = (self.session_timeout.as_millis() / 3).max(100).to_string();
        let consumer: BaseConsumer<GroupContext> = self
            .conn
            .config(&[
                ("group.id", &self.group),
                ("partition.assignment.strategy", "cooperative-sticky"),
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("session.timeout.ms", &session),
                ("heartbeat.interval.ms", &heartbeat),
            ])
            .create_with_context(GroupContext { shared: Arc::clone(&shared) })
            .map_err(|e| connector_caused(&name, "cannot create the group's consumer".to_string(), e))?;
        consumer
            .subscribe(&[lead.as_str()])
            .map_err(|e| connector_caused(&name, format!("cannot subscribe to `{lead}`"), e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicBool::new(false));
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let (thread_shared, thread_stop, interval) = (Arc::clone(&shared), Arc::clone(&stop), self.commit_interval);
        let thread_finished = Arc::clone(&finished);
        std::thread::Builder::new()
            .name(format!("weibo-group-{}", self.group))
            .spawn(move || {
                let result = membership(&consumer, &thread_shared, &thread_stop, interval);
                // Stop the tasks while still a member (nobody else runs them
                // yet), then leave the group.
                thread_shared.stop_all(result.is_err());
                drop(consumer);
                thread_finished.store(true, Ordering::Relaxed);
                let _ = done_tx.send(result);
            })
            .map_err(|e| connector_caused(&name, "cannot start the group's thread".to_string(), e))?;
        tracing::info!(group = %self.group, topics = ?self.topics, "joined the consumer group");
        Ok(GroupHandle { shared, stop, finished, done })
    }
}

/// Polls the group (which runs the rebalance callbacks), watches the
/// tasks and commits their progress, until asked to stop or a task fails.
fn membership(
    consumer: &BaseConsumer<GroupContext>,
    shared: &Shared,
    stop: &AtomicBool,
    interval: Option<Duration>,
) -> Result<()> {
    let mut committed = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        // Partitions are paused: a poll serves callbacks, not messages.
        if let Some(Err(e)) = consumer.poll(Duration::from_millis(100)) {
            tracing::warn!(group = %shared.group, error = %e, "consumer group error");
        }
        if let Some(e) = lock(&shared.failure).take() {
            return Err(e);
        }
        shared.reap()?;
        if let Some(interval) = interval
            && committed.elapsed() >= interval
        {
            committed = Instant::now();
            let tpl = shared.progress();
            if tpl.count() > 0
                && let Err(e) = consumer.commit(&tpl, CommitMode::Async)
            {
                tracing::debug!(group = %shared.group, error = %e, "cannot commit progress to the group");
            }
        }
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the group's thread, its callbacks and the handle share.
struct Shared {
    name: String,
    conn: Connection,
    group: String,
    topics: Vec<String>,
    dir: PathBuf,
    runtime: tokio::runtime::Handle,
    storage_wait: Duration,
    build: Mutex<Build>,
    tasks: Mutex<BTreeMap<i32, Running>>,
    failure: Mutex<Option<Error>>,
    /// The admin API every task's job joins.
    #[cfg(feature = "admin")]
    admin: Option<weibo::AdminGroup>,
}

struct Running {
    /// `None` once the task's job has ended on its own (bounded input).
    job: Option<JobHandle>,
    progress: Arc<Progress>,
}

impl Shared {
    fn task(&self, partition: i32) -> Task {
        Task {
            partition,
            conn: self.conn.clone(),
            group: self.group.clone(),
            topics: self.topics.clone(),
            dir: self.dir.join(format!("partition-{partition}")),
            progress: Arc::new(Progress::default()),
        }
    }

    /// Starts the tasks of newly assigned partitions: builds their jobs one
    /// after the other, then starts them side by side (a start restores a
    /// checkpoint and recovers the sinks' transactions, which waits on the
    /// brokers).
    fn start(&self, partitions: &[i32]) {
        let mut built = Vec::new();
        for &p in partitions {
            if lock(&self.tasks).contains_key(&p) {
                continue;
            }
            let task = self.task(p);
            // This runs inside a librdkafka callback: a panic must not
            // unwind into C.
            let build = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (lock(&self.build))(&task)));
            match build {
                Ok(Ok(job)) => {
                    let job = job.with_storage_wait(self.storage_wait);
                    #[cfg(feature = "admin")]
                    let job = match &self.admin {
                        Some(group) => job.with_admin_group(group),
                        None => job,
                    };
                    built.push((p, task.progress, job));
                }
                Ok(Err(e)) => return self.fail(p, &e),
                Err(_) => {
                    return self.fail(p, &weibo::internal_error!("the closure that builds the task's job panicked"));
                }
            }
        }
        let started: Vec<(i32, Arc<Progress>, Result<JobHandle>)> = std::thread::scope(|scope| {
            let starting: Vec<_> = built
                .into_iter()
                .map(|(p, progress, job)| {
                    let start = scope.spawn(move || {
                        let _runtime = self.runtime.enter();
                        job.spawn()
                    });
                    (p, progress, start)
                })
                .collect();
            starting
                .into_iter()
                .map(|(p, progress, start)| {
                    let job = start
                        .join()
                        .unwrap_or_else(|_| Err(weibo::internal_error!("starting the job of partition {p} panicked")));
                    (p, progress, job)
                })
                .collect()
        });
        for (p, progress, job) in started {
            match job {
                Ok(job) => {
                    tracing::info!(group = %self.group, partition = p, "task started");
                    lock(&self.tasks).insert(p, Running { job: Some(job), progress });
                }
                Err(e) => self.fail(p, &e),
            }
        }
    }

    fn fail(&self, partition: i32, e: &Error) {
        let e = connector(&self.name, format!("cannot start the task of partition {partition}: {}", e.report()));
        lock(&self.failure).get_or_insert(e);
    }

    /// Stops the tasks of revoked partitions: with a last checkpoint, or at
    /// once when the partitions were lost (another member may own them
    /// already, so this one must not write another checkpoint).
    fn stop(&self, partitions: &[i32], lost: bool) {
        let jobs: Vec<(i32, JobHandle)> = {
            let mut tasks = lock(&self.tasks);
            partitions.iter().filter_map(|p| tasks.remove(p).and_then(|r| r.job).map(|j| (*p, j))).collect()
        };
        if jobs.is_empty() {
            return;
        }
        let group = self.group.clone();
        let errors = self.runtime.block_on(async move {
            let stopping = jobs.into_iter().map(|(p, job)| {
                tokio::spawn(async move { (p, if lost { job.cancel().await } else { job.stop().await }) })
            });
            let mut errors = Vec::new();
            for s in stopping.collect::<Vec<_>>() {
                match s.await {
                    Ok((p, Ok(()))) => tracing::info!(%group, partition = p, lost, "task stopped"),
                    Ok((p, Err(e))) => errors.push(format!("partition {p}: {}", e.report())),
                    Err(e) => errors.push(e.to_string()),
                }
            }
            errors
        });
        if !errors.is_empty() {
            let e = connector(&self.name, format!("tasks failed: {}", errors.join("; ")));
            lock(&self.failure).get_or_insert(e);
        }
    }

    fn stop_all(&self, failed: bool) {
        let owned: Vec<i32> = lock(&self.tasks).keys().copied().collect();
        self.stop(&owned, failed);
    }

    /// Collects tasks whose jobs ended on their own: an error fails the
    /// group; a finished job (bounded input) stays finished.
    fn reap(&self) -> Result<()> {
        let ended: Vec<(i32, JobHandle)> = lock(&self.tasks)
            .iter_mut()
            .filter(|(_, r)| r.job.as_ref().is_some_and(JobHandle::is_finished))
            .filter_map(|(p, r)| r.job.take().map(|j| (*p, j)))
            .collect();
        for (p, job) in ended {
            match self.runtime.block_on(job.wait()) {
                Ok(_) => tracing::info!(group = %self.group, partition = p, "task finished its input"),
                Err(e) => return Err(connector_caused(&self.name, format!("the task of partition {p} failed"), e)),
            }
        }
        Ok(())
    }

    /// The owned tasks' read offsets, for the group.
    fn progress(&self) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for r in lock(&self.tasks).values() {
            for ((topic, p), next) in lock(&r.progress.next).iter() {
                let next = next.load(Ordering::Relaxed);
                if next >= 0 {
                    let _ = tpl.add_partition_offset(topic, *p, Offset::Offset(next));
                }
            }
        }
        tpl
    }
}

/// The rebalance callbacks: librdkafka calls them on the group's thread,
/// inside `poll`, and the group waits for a revocation to return before
/// it hands the partitions on.
struct GroupContext {
    shared: Arc<Shared>,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let lost = consumer.assignment_lost();
            let partitions = lead_partitions(tpl);
            tracing::info!(group = %self.shared.group, ?partitions, lost, "partitions revoked");
            self.shared.stop(&partitions, lost);
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                if let Err(e) = consumer.pause(tpl) {
                    tracing::warn!(group = %self.shared.group, error = %e, "cannot pause the group's partitions");
                }
                let partitions = lead_partitions(tpl);
                tracing::info!(group = %self.shared.group, ?partitions, "partitions assigned");
                self.shared.start(&partitions);
            }
            Rebalance::Error(e) => tracing::warn!(group = %self.shared.group, error = %e, "rebalance failed"),
            Rebalance::Revoke(_) => {}
        }
    }
}

fn lead_partitions(tpl: &TopicPartitionList) -> Vec<i32> {
    let mut ps: Vec<i32> =
        tpl.elements().iter().map(rdkafka::topic_partition_list::TopicPartitionListElem::partition).collect();
    ps.sort_unstable();
    ps.dedup();
    ps
}

/// A running [`KafkaGroup`] membership.
pub struct GroupHandle {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    finished: Arc<AtomicBool>,
    done: tokio::sync::oneshot::Receiver<Result<()>>,
}

impl fmt::Debug for GroupHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupHandle").field("group", &self.shared.group).field("owned", &self.owned()).finish()
    }
}

impl GroupHandle {
    /// The partitions whose tasks this process runs now.
    pub fn owned(&self) -> Vec<i32> {
        lock(&self.shared.tasks).keys().copied().collect()
    }

    /// Whether the membership has ended (stopped, or a task failed:
    /// [`GroupHandle::wait`] tells which).
    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Relaxed)
    }

    /// Where the group's admin API listens ([`KafkaGroup::with_admin`]).
    #[cfg(feature = "admin")]
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.shared.admin.as_ref().map(weibo::AdminGroup::local_addr)
    }

    /// The metrics of each running task, by partition.
    pub fn metrics(&self) -> Vec<(i32, weibo::metrics::MetricsSnapshot)> {
        lock(&self.shared.tasks).iter().filter_map(|(p, r)| r.job.as_ref().map(|j| (*p, j.metrics()))).collect()
    }

    /// Stops every task with a last checkpoint and leaves the group (the
    /// others take the partitions at once, without waiting for the
    /// session to time out).
    ///
    /// # Errors
    /// A task's error, if one failed.
    pub async fn stop(self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        self.wait().await
    }

    /// Runs until `signal` completes (then stops as [`GroupHandle::stop`]
    /// does) or a task fails.
    ///
    /// # Errors
    /// A task's error, if one failed.
    pub async fn stop_on(self, signal: impl std::future::Future<Output = ()>) -> Result<()> {
        let name = self.shared.name.clone();
        let ended = |r: std::result::Result<Result<()>, _>| {
            r.unwrap_or_else(|_| Err(connector(&name, "the group's thread ended without a result".into())))
        };
        let mut done = self.done;
        tokio::select! {
            r = &mut done => ended(r),
            () = signal => {
                self.stop.store(true, Ordering::Relaxed);
                ended(done.await)
            }
        }
    }

    /// Waits until the membership ends: after [`GroupHandle::stop`], or
    /// when a task fails (the others are cancelled and the process leaves
    /// the group).
    ///
    /// # Errors
    /// The first error of any task.
    pub async fn wait(self) -> Result<()> {
        let name = self.shared.name.clone();
        self.done.await.map_err(|_| connector(&name, "the group's thread ended without a result".into()))?
    }
}

/// One partition's share of the work: what a [`KafkaGroup`]'s `build`
/// closure gets to build the partition's job.
#[derive(Debug)]
pub struct Task {
    partition: i32,
    conn: Connection,
    group: String,
    topics: Vec<String>,
    dir: PathBuf,
    progress: Arc<Progress>,
}

impl Task {
    /// The partition number: partition `p` of every input topic.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// A name for the task's job and for its exactly-once sink
    /// (`<group>-<partition>`): the same in every process, so the
    /// transactional ids of a new owner fence the old owner's.
    pub fn id(&self) -> String {
        format!("{}-{}", self.group, self.partition)
    }

    /// The task's directory under the group's shared storage.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the task's job keeps its checkpoints.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.dir.join("checkpoints")
    }

    /// Where the task's exactly-once [`super::KafkaSink`] keeps its redo logs (in the
    /// shared storage: a new owner re-commits from them).
    pub fn redo_dir(&self) -> PathBuf {
        self.dir.join("kafka-redo")
    }

    /// A source of the task's partition of every input topic, in the
    /// group's consumer group; add settings and `build` it.
    pub fn source<F>(&self, format: F) -> KafkaSourceBuilder<F> {
        let mut builder = super::KafkaSource::builder(self.conn.brokers.clone(), self.topics.clone(), format)
            .with_group(self.group.clone())
            .only(self.partition, Arc::clone(&self.progress))
            .with_connect_timeout(self.conn.timeout);
        for (k, v) in &self.conn.props {
            builder = builder.with_property(k.clone(), v.clone());
        }
        builder
    }
}
