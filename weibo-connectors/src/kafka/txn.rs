//! The exactly-once Kafka sink: one Kafka transaction per checkpoint epoch.
//!
//! librdkafka cannot resume a transaction that another process opened, so
//! a transaction pre-committed at barrier `n` by a process that then died
//! cannot be committed by its successor: initialising the same
//! transactional id aborts it. The sink therefore keeps a redo log: every
//! record of epoch `n` is also appended to `<redo dir>/<instance>-<n>.redo`,
//! made durable at the barrier before the checkpoint can complete. The
//! commit of epoch `n` carries a marker in the same transaction: the
//! offset `n` committed for the consumer group `<id>-<instance>` (on
//! partition 0 of the output topic), with the token of the run that
//! pre-committed it as the offset's metadata, so whether epoch `n` is
//! visible is known exactly. Committing a handle after a restart fences
//! the old producer, reads the marker, and, when epoch `n` of that run is
//! not visible, produces the redo log in a new transaction with the
//! marker.
//!
//! Which epochs a restarted job commits again and which it writes anew is
//! decided by its restored checkpoint alone: the handles in its manifest
//! are committed (again: idempotently), everything after it is aborted and
//! written again from the restored source positions. A job takes a final
//! checkpoint at the end of its input, so nothing is ever committed that
//! no complete checkpoint covers, and the writer never needs to skip
//! output that an earlier run committed.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};
use weibo::Data;
use weibo::checkpoint::{SourcePositionEntry, run_token};
use weibo::record::CheckpointId;
use weibo::sinks::{SinkBatch, TransactionWriter, TwoPhaseCommitSink};
use weibo::{Error, Result};

use super::sink::{Deliveries, Encoder, FLUSH_TIMEOUT, KafkaProducer, KafkaSink, OutRecord, produce};
use super::{Connection, KafkaSource, connector, connector_caused};

/// How long transaction calls (init, commit, abort) may take.
const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a pre-commit waits for the brokers before it counts the
/// transaction as stuck and writes it again (see `Core::settle`).
const SETTLE_STEP: Duration = Duration::from_secs(10);

/// How many transactions one sink instance may have open at once (the
/// epoch being written plus those waiting for their checkpoint to
/// complete).
const MAX_OPEN_TRANSACTIONS: usize = 8;

/// The slot of a handle that commits nothing (the writer had no
/// transaction open).
const NO_SLOT: usize = usize::MAX;

/// What a [`KafkaSink`] needs to write exactly once, set with its
/// builders, and the state its transactions share once the job starts
/// (made on first use, so every builder may come in any order).
pub(crate) struct Transactions {
    /// The transactional ids' prefix and the redo log's directory.
    names: Option<(String, PathBuf)>,
    timeout: Duration,
    consumed: Mutex<Option<Consumed>>,
    core: OnceLock<Arc<Core>>,
}

impl Transactions {
    /// The transactional ids' prefix, when set.
    pub(crate) fn id(&self) -> Option<&str> {
        self.names.as_ref().map(|(id, _)| id.as_str())
    }
}

impl Default for Transactions {
    fn default() -> Self {
        Self { names: None, timeout: Duration::from_secs(60), consumed: Mutex::new(None), core: OnceLock::new() }
    }
}

impl<T> KafkaSink<T> {
    /// What [`Stream::sink_exactly_once`](weibo::Stream::sink_exactly_once)
    /// needs: Kafka transactions committed in step with the job's
    /// checkpoints, so records become visible to `read_committed`
    /// consumers when the checkpoint that covers them completes
    /// (end-to-end latency is about the checkpoint interval). Without it,
    /// an exactly-once job refuses to start, saying so.
    ///
    /// `id` names the sink's transactions: transactional ids are
    /// `<id>-<instance>-<slot>`, stable across restarts, so a restarted
    /// instance fences its predecessor. Give every job and sink its own id.
    /// `redo_dir` keeps each epoch's records until its transaction is
    /// known to be committed (see the module notes); it must survive the
    /// process, like the checkpoint directory.
    ///
    /// The brokers abort a transaction left open longer than
    /// `transaction.timeout.ms` (default here 60 s, set with
    /// [`KafkaSink::with_transaction_timeout`]); it must exceed the
    /// checkpoint interval plus the time a checkpoint takes, and stay below
    /// the brokers' `transaction.max.timeout.ms` (15 min by default), or
    /// producers fail to start with an error saying so.
    #[must_use]
    pub fn with_transactions(mut self, id: impl Into<String>, redo_dir: impl AsRef<Path>) -> Self {
        self.txn.names = Some((id.into(), redo_dir.as_ref().to_path_buf()));
        self
    }

    /// Sets `transaction.timeout.ms` of exactly-once writes (default 60 s).
    #[must_use]
    pub fn with_transaction_timeout(mut self, timeout: Duration) -> Self {
        self.txn.timeout = timeout;
        self
    }

    /// Commits the offsets `source` consumed to its consumer group, in the
    /// same transaction as the records of the same checkpoint (the first
    /// transaction committed for it), so that the group's offsets and the visible
    /// output always agree, and lag tools show the job's progress. Only
    /// for monitoring: the job itself restarts from its checkpoints. Only
    /// exactly-once writes commit them.
    ///
    /// The source is found in the checkpoints by its default name
    /// (`kafka <topics>`); if you renamed it with `.name(…)`, use
    /// [`KafkaSink::with_consumed_offsets_named`]. When the source has
    /// already gone into the job (`job.source(source)` takes it), use
    /// [`KafkaSink::with_consumed_offsets_of`] with its name and group.
    #[must_use]
    pub fn with_consumed_offsets<S>(self, source: &KafkaSource<S>) -> Self
    where
        S: Clone + Send + Sync + 'static,
    {
        let name = weibo::sources::Source::default_name(source);
        self.with_consumed_offsets_named(name, source)
    }

    /// As [`KafkaSink::with_consumed_offsets`], for a source named
    /// `name` in the job.
    #[must_use]
    pub fn with_consumed_offsets_named<S>(self, name: impl Into<String>, source: &KafkaSource<S>) -> Self {
        self.consume(name.into(), source.group_name().to_string(), Some(source.kafka_partitions().to_vec()))
    }

    /// As [`KafkaSink::with_consumed_offsets`], for the Kafka source
    /// named `source` in the job (`kafka <topics>` unless renamed), whose
    /// consumer group is `group` (`weibo-<topics joined by ->` unless set
    /// with [`super::KafkaSourceBuilder::with_group`]); the source itself is
    /// not needed, so this can be called after `job.source(…)` took it.
    /// Checkpoints record which topic and partition each of the source's
    /// positions belongs to, and the offsets are committed by those.
    ///
    /// ```no_run
    /// # use weibo_connectors::kafka::{Json, KafkaSink, KafkaSource};
    /// # fn build(job: &weibo::Job) -> weibo::Result<()> {
    /// let source = KafkaSource::builder("127.0.0.1:9092", ["clicks"], Json).build::<serde_json::Value>()?;
    /// let clicks = job.source(source);
    /// let sink = KafkaSink::new("127.0.0.1:9092", "out", Json)
    ///     .with_transactions("clicks-out", "/var/lib/job/redo")
    ///     .with_consumed_offsets_of("kafka clicks", "weibo-clicks");
    /// clicks.map(|r| r.value).sink_exactly_once(sink);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn with_consumed_offsets_of(self, source: impl Into<String>, group: impl Into<String>) -> Self {
        self.consume(source.into(), group.into(), None)
    }

    fn consume(self, source: String, group: String, partitions: Option<Vec<(String, i32)>>) -> Self {
        *self.txn.consumed.lock().unwrap_or_else(PoisonError::into_inner) = Some(Consumed {
            source,
            group,
            partitions,
            warned: std::sync::atomic::AtomicBool::new(false),
            metadata: std::sync::OnceLock::new(),
        });
        self
    }

    /// The transactions' shared state, made on first use; an error when
    /// the sink has no [`KafkaSink::with_transactions`].
    fn core(&self) -> Result<&Arc<Core>> {
        if let Some(core) = self.txn.core.get() {
            return Ok(core);
        }
        let Some((id, redo)) = &self.txn.names else {
            return Err(weibo::Error::connector(
                format!("kafka {}", self.enc.topic),
                "writing exactly once needs transactional ids and a redo log: make the sink with \
                 `KafkaSink::new(..).with_transactions(id, redo_dir)`",
            ));
        };
        // Made once: a second caller waits for the first one's core (the
        // consumed offsets' settings move into it).
        Ok(self.txn.core.get_or_init(|| {
            Arc::new(Core {
                id: id.clone(),
                run: run_token(),
                topic: self.enc.topic.clone(),
                redo: redo.clone(),
                conn: self.conn.clone(),
                txn_timeout: self.txn.timeout,
                state: Mutex::new(State::default()),
                ids_file: Mutex::new(()),
                consumed: self.txn.consumed.lock().unwrap_or_else(PoisonError::into_inner).take(),
                offsets_sent: Mutex::new(None),
            })
        }))
    }
}

/// One transactional producer.
struct Slot {
    instance: usize,
    slot: usize,
    /// Shared only with a call that outlived its time (see `bounded`).
    producer: Arc<KafkaProducer>,
}

/// Consumed offsets to commit in a transaction, under their group.
struct Offsets {
    tpl: TopicPartitionList,
    group: Arc<rdkafka::consumer::ConsumerGroupMetadata>,
}

/// A pre-committed transaction waiting for its checkpoint.
struct Pending {
    slot: Slot,
}

/// What the sink's writers and its committer share.
struct Core {
    id: String,
    /// This run's token: in its handles, and in the markers of their
    /// commits.
    run: String,
    topic: String,
    redo: PathBuf,
    conn: Connection,
    txn_timeout: Duration,
    state: Mutex<State>,
    /// Serialises appends to the transactional-ids file.
    ids_file: Mutex<()>,
    /// Whose consumed offsets go into the transactions.
    consumed: Option<Consumed>,
    /// The checkpoint positions last committed as consumed offsets.
    offsets_sent: Mutex<Option<Vec<SourcePositionEntry>>>,
}

/// A Kafka source whose consumed offsets the sink commits to the source's
/// consumer group, in the transaction of the checkpoint they belong to.
struct Consumed {
    /// The source's node name in the job.
    source: String,
    group: String,
    /// The Kafka partition of each source partition, when the source was
    /// given (otherwise taken from the positions' partition names).
    partitions: Option<Vec<(String, i32)>>,
    /// Warned that the checkpoints hold no source of that name.
    warned: std::sync::atomic::AtomicBool,
    /// The group's metadata, made once.
    metadata: std::sync::OnceLock<Arc<rdkafka::consumer::ConsumerGroupMetadata>>,
}

#[derive(Default)]
struct State {
    /// Pre-committed transactions by handle, waiting for their commit.
    prepared: HashMap<String, Arc<Mutex<Option<Pending>>>>,
    /// Handles committed by this process.
    committed: HashSet<String>,
    /// Initialised producers without an open transaction, by instance.
    free: HashMap<usize, Vec<Slot>>,
    /// Every (instance, slot) with a producer initialised by this process.
    live: HashSet<(usize, usize)>,
    /// Marker consumers (their group metadata), by instance.
    markers: HashMap<usize, Arc<BaseConsumer>>,
}

/// A handle: `i<instance>-s<slot>-e<epoch>-r<run>`.
fn handle(instance: usize, slot: usize, epoch: u64, run: &str) -> String {
    format!("i{instance}-s{slot}-e{epoch}-r{run}")
}

/// A handle's parts: instance, slot, epoch, and the token of the run that
/// pre-committed it (`None` for handles of builds before run tokens).
fn parse_handle(h: &str) -> Option<(usize, usize, u64, Option<&str>)> {
    let mut parts = h.split('-');
    let i = parts.next()?.strip_prefix('i')?.parse().ok()?;
    let s = parts.next()?.strip_prefix('s')?.parse().ok()?;
    let e = parts.next()?.strip_prefix('e')?.parse().ok()?;
    let run = match parts.next() {
        Some(r) => Some(r.strip_prefix('r').filter(|r| !r.is_empty())?),
        None => None,
    };
    parts.next().is_none().then_some((i, s, e, run))
}

/// A commit marker: the last epoch an instance committed, and the token of
/// the run that pre-committed it (empty for markers of builds before run
/// tokens).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Marker {
    epoch: u64,
    run: String,
}

impl Marker {
    /// Whether epoch `epoch`, pre-committed by run `run`, is visible.
    ///
    /// Epoch numbers are checkpoint numbers, and those of one run follow
    /// each other, so within a run a later marker covers earlier epochs.
    /// Across runs numbers say nothing (a job restored from a savepoint
    /// into new storage counts from the savepoint again): a marker of
    /// another run does not cover the epoch. A run that re-commits an
    /// earlier run's epoch writes that run's token.
    fn covers(&self, epoch: u64, run: Option<&str>) -> bool {
        match run {
            Some(run) => self.run == run && self.epoch >= epoch,
            // A handle of a build before run tokens: numbers alone, as then.
            None => self.epoch >= epoch,
        }
    }
}

impl Core {
    fn name(&self) -> String {
        format!("kafka {}", self.topic)
    }

    fn err(&self, message: String) -> Error {
        connector(&self.name(), message)
    }

    fn err_caused(&self, message: String, e: impl Into<weibo::error::BoxError>) -> Error {
        connector_caused(&self.name(), message, e)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn transactional_id(&self, instance: usize, slot: usize) -> String {
        format!("{}-{instance}-{slot}", self.id)
    }

    fn redo_path(&self, instance: usize, epoch: u64) -> PathBuf {
        self.redo.join(format!("{instance}-{epoch:020}.redo"))
    }

    fn ids_path(&self) -> PathBuf {
        self.redo.join("transactional-ids")
    }

    fn io(&self, action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error + use<> {
        let path = path.to_path_buf();
        move |source| Error::Io { action, path, source }
    }

    /// The (instance, slot) pairs any run of this sink has used.
    fn known_ids(&self) -> Result<BTreeSet<(usize, usize)>> {
        let path = self.ids_path();
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
            Err(e) => return Err(self.io("cannot read", &path)(e)),
        };
        // A last line without its newline was cut short by a crash before
        // its producer existed: nothing to fence.
        let complete = text.rfind('\n').map_or("", |end| text.get(..end).unwrap_or_default());
        let mut out = BTreeSet::new();
        for (n, line) in complete.lines().enumerate() {
            let mut it = line.split_whitespace().map(str::parse::<usize>);
            match (it.next(), it.next()) {
                (Some(Ok(i)), Some(Ok(s))) => {
                    out.insert((i, s));
                }
                _ => {
                    return Err(Error::Checkpoint {
                        path,
                        message: format!("line {}: expected `<instance> <slot>`, found {line:?}", n + 1),
                        source: None,
                    });
                }
            }
        }
        Ok(out)
    }

    /// Records that (instance, slot) is in use, before its producer exists,
    /// so that a restart fences it.
    fn remember_id(&self, instance: usize, slot: usize) -> Result<()> {
        let _one_at_a_time = self.ids_file.lock().unwrap_or_else(PoisonError::into_inner);
        if self.known_ids()?.contains(&(instance, slot)) {
            return Ok(());
        }
        fs::create_dir_all(&self.redo).map_err(self.io("cannot create redo directory", &self.redo))?;
        let path = self.ids_path();
        let mut f = OpenOptions::new().create(true).append(true).open(&path).map_err(self.io("cannot open", &path))?;
        writeln!(f, "{instance} {slot}").and_then(|()| f.sync_all()).map_err(self.io("cannot write", &path))
    }

    /// A new producer for (instance, slot), initialised: any transaction
    /// its transactional id left open is aborted and older producers with
    /// the id are fenced.
    fn create_slot(&self, instance: usize, slot: usize) -> Result<Slot> {
        self.remember_id(instance, slot)?;
        let id = self.transactional_id(instance, slot);
        let timeout = self.txn_timeout;
        let conn = self.conn.clone();
        let producer: KafkaProducer = conn
            .config(&[
                ("transactional.id", &id),
                ("enable.idempotence", "true"),
                ("transaction.timeout.ms", &timeout.as_millis().to_string()),
                ("linger.ms", "5"),
                ("retry.backoff.ms", "20"),
            ])
            .create_with_context(Deliveries::default())
            .map_err(|e| self.err_caused(format!("cannot create a transactional producer `{id}`"), e))?;
        retry(TXN_CALL_TIMEOUT, || producer.init_transactions(TXN_CALL_TIMEOUT)).map_err(|e| {
            self.err_caused(format!(
                "cannot initialise transactions of `{id}` at {} (is transaction.timeout.ms = {} ms above the brokers' transaction.max.timeout.ms?)",
                conn.brokers,
                timeout.as_millis()
            ), e)
        })?;
        self.state().live.insert((instance, slot));
        Ok(Slot { instance, slot, producer: Arc::new(producer) })
    }

    /// A producer for `instance` without an open transaction.
    fn acquire(&self, instance: usize) -> Result<Slot> {
        let mut st = self.state();
        if let Some(s) = st.free.get_mut(&instance).and_then(Vec::pop) {
            return Ok(s);
        }
        let used: BTreeSet<usize> = st.live.iter().filter(|(i, _)| *i == instance).map(|(_, s)| *s).collect();
        // Counted by handle, without locking the entries: a commit holds
        // its entry while it takes the state lock.
        let busy = st.prepared.keys().filter(|h| parse_handle(h).is_some_and(|(i, ..)| i == instance)).count();
        if busy + 1 >= MAX_OPEN_TRANSACTIONS {
            return Err(self.err(format!(
                "instance {instance} has {busy} transactions waiting for their checkpoints to complete: checkpoints are not completing"
            )));
        }
        let slot = (0..).find(|s| !used.contains(s)).unwrap_or(used.len());
        drop(st);
        self.create_slot(instance, slot)
    }

    fn release(&self, s: Slot) {
        self.state().free.entry(s.instance).or_default().push(s);
    }

    /// The consumer whose group metadata carries `instance`'s markers.
    fn marker_consumer(&self, instance: usize) -> Result<Arc<BaseConsumer>> {
        if let Some(c) = self.state().markers.get(&instance) {
            return Ok(Arc::clone(c));
        }
        let conn = self.conn.clone();
        let group = format!("{}-{instance}", self.id);
        let c: BaseConsumer = conn
            .config(&[("group.id", &group), ("enable.auto.commit", "false"), ("isolation.level", "read_committed")])
            .create()
            .map_err(|e| self.err_caused(format!("cannot create a Kafka consumer for group `{group}`"), e))?;
        let c = Arc::new(c);
        self.state().markers.insert(instance, Arc::clone(&c));
        Ok(c)
    }

    /// The marker of the last epoch `instance` committed.
    fn committed_epoch(&self, instance: usize) -> Result<Option<Marker>> {
        let c = self.marker_consumer(instance)?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topic, 0);
        let conn = self.conn.clone();
        let got = retry(conn.timeout, || c.committed_offsets(tpl.clone(), conn.timeout)).map_err(|e| {
            self.err_caused(format!("cannot read the commit marker of instance {instance} at {}", conn.brokers), e)
        })?;
        let out = got.elements().first().and_then(|e| match e.offset() {
            Offset::Offset(o) => u64::try_from(o).ok().map(|epoch| Marker { epoch, run: e.metadata().to_string() }),
            _ => None,
        });
        drop(got);
        Ok(out)
    }

    /// Sends the marker of `epoch` and commits the slot's transaction.
    fn commit_slot(&self, s: &mut Slot, epoch: u64, run: &str, consumed: Option<&Offsets>) -> Result<()> {
        let c = self.marker_consumer(s.instance)?;
        let Some(cgm) = c.group_metadata().map(Arc::new) else {
            return Err(self.err("no consumer group metadata for the commit marker".into()));
        };
        let mut tpl = TopicPartitionList::new();
        let offset = i64::try_from(epoch).map_err(|_| self.err(format!("epoch {epoch} out of range")))?;
        let mut e = tpl.add_partition(&self.topic, 0);
        e.set_offset(Offset::Offset(offset)).map_err(|e| self.err_caused("cannot set the marker".to_string(), e))?;
        e.set_metadata(run);
        let id = self.transactional_id(s.instance, s.slot);
        let redo = self.redo_path(s.instance, epoch);
        let deadline = Instant::now() + TXN_CALL_TIMEOUT;
        loop {
            // librdkafka resumes a call that timed out or failed for a
            // retriable reason when it is made again.
            let step = |what: &str, e: KafkaError| -> Result<bool> {
                let abort = matches!(&e, KafkaError::Transaction(t) if t.txn_requires_abort());
                if Instant::now() >= deadline || !(abort || temporary(&e) || is_timeout(&e)) {
                    return Err(self.err_caused(format!("cannot {what} transaction `{id}` (epoch {epoch})"), e));
                }
                tracing::warn!(transaction = %id, epoch, error = %e, abort, "retrying the commit");
                Ok(abort)
            };
            let call = SETTLE_STEP.min(deadline.saturating_duration_since(Instant::now()));
            // librdkafka can wait for ever here, past the timeout, when the
            // group coordinator went away (librdkafka issues 5456 and 5511):
            // wait on another thread, and if it does not come back in
            // time, replace the producer (the new one fences the stuck
            // one, which aborts its transaction) and write it again.
            let (producer, offsets, group) = (Arc::clone(&s.producer), tpl.clone(), Arc::clone(&cgm));
            let consumed = consumed.map(|o| (o.tpl.clone(), Arc::clone(&o.group)));
            let sent = bounded(call + Duration::from_secs(1), move || {
                if let Some((tpl, group)) = consumed {
                    producer
                        .send_offsets_to_transaction(&tpl, &group, call)
                        .map_err(|e| ("add the consumed offsets to", e))?;
                }
                producer
                    .send_offsets_to_transaction(&offsets, &group, call)
                    .map_err(|e| ("add the commit marker to", e))
            });
            let result = match sent {
                Some(Ok(())) => s.producer.commit_transaction(call).map_err(|e| ("commit", e)),
                Some(Err(e)) => Err(e),
                None if Instant::now() < deadline => {
                    tracing::warn!(transaction = %id, epoch, "adding the commit marker hangs; replacing the producer and writing the transaction again");
                    self.replace_producer(s)?;
                    self.rewrite(s, &redo)?;
                    self.settle(s, &redo)?;
                    continue;
                }
                None => {
                    return Err(self.err(format!(
                        "cannot add the commit marker to transaction `{id}` (epoch {epoch}): no answer within {TXN_CALL_TIMEOUT:?}"
                    )));
                }
            };
            match result {
                Ok(()) => return s.producer.context().check(&self.name()),
                Err((_, e)) if fenced(&e) && Instant::now() < deadline => {
                    // The brokers abort a transaction that outlived
                    // transaction.timeout.ms and bump its producer's epoch:
                    // the commit then finds the producer fenced (or, as
                    // often, the transaction abortable: below). Nothing of
                    // it is visible: a new producer writes it again from its
                    // redo log, as `settle` does for a fenced record.
                    let hint = self.hint("fenced");
                    tracing::warn!(transaction = %id, epoch, error = %e, "the transaction was fenced; replacing the producer and writing the transaction again{hint}");
                    self.replace_producer(s)?;
                    self.rewrite(s, &redo)?;
                    self.settle(s, &redo)?;
                }
                Err((what, e)) => {
                    if step(what, e)? {
                        // The transaction can only be aborted (a broker
                        // restarted under it): nothing of it is visible,
                        // so write it again from its redo log.
                        retry(TXN_CALL_TIMEOUT, || s.producer.abort_transaction(SETTLE_STEP)).map_err(|e| {
                            self.err_caused(format!("cannot abort transaction `{id}` to write it again"), e)
                        })?;
                        self.rewrite(s, &redo)?;
                        self.settle(s, &redo)?;
                    } else {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        }
    }

    fn commit(&self, h: &str, sources: &[SourcePositionEntry]) -> Result<()> {
        let Some((instance, slot, epoch, run)) = parse_handle(h) else {
            return Err(self.err(format!("`{h}` is not a transaction handle of this sink")));
        };
        let entry = {
            let st = self.state();
            if st.committed.contains(h) {
                return Ok(());
            }
            st.prepared.get(h).cloned()
        };
        let Some(entry) = entry else {
            if slot == NO_SLOT {
                return Ok(());
            }
            return self.recover(instance, slot, epoch, run, h);
        };
        let mut guard = entry.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(pending) = guard.as_mut() else { return Ok(()) };
        // Markers say "everything up to epoch n is visible": commit an
        // instance's epochs in order.
        let earlier = self.state().prepared.iter().any(|(other, p)| {
            other != h
                && parse_handle(other).is_some_and(|(i, _, e, _)| i == instance && e < epoch)
                && p.try_lock().map_or(true, |g| g.is_some())
        });
        if earlier {
            return Err(self.err(format!("`{h}` waits for an earlier transaction of instance {instance} to commit")));
        }
        // The first commit of each checkpoint's handles carries its
        // positions as the consumed offsets, whichever instance it is (an
        // instance whose input ended early has no more handles).
        let fresh = !sources.is_empty()
            && self.offsets_sent.lock().unwrap_or_else(PoisonError::into_inner).as_deref() != Some(sources);
        let consumed = if fresh { self.consumed_offsets(sources)? } else { None };
        self.commit_slot(&mut pending.slot, epoch, run.unwrap_or_default(), consumed.as_ref())?;
        if fresh {
            *self.offsets_sent.lock().unwrap_or_else(PoisonError::into_inner) = Some(sources.to_vec());
        }
        if let Some(p) = guard.take() {
            self.release(p.slot);
        }
        drop(guard);
        let mut st = self.state();
        st.prepared.remove(h);
        st.committed.insert(h.to_string());
        drop(st);
        let redo = self.redo_path(instance, epoch);
        let _ = fs::remove_file(&redo);
        Ok(())
    }

    /// The consumed offsets among a checkpoint's `sources`, with the
    /// group metadata to commit them under (none without
    /// `with_consumed_offsets`, or without positions).
    fn consumed_offsets(&self, sources: &[SourcePositionEntry]) -> Result<Option<Offsets>> {
        let Some(c) = self.consumed.as_ref() else { return Ok(None) };
        if sources.is_empty() {
            return Ok(None);
        }
        let mut tpl = TopicPartitionList::new();
        for e in sources.iter().filter(|e| e.source == c.source) {
            let partition = match &c.partitions {
                Some(ps) => usize::try_from(e.partition).ok().and_then(|i| ps.get(i)).cloned(),
                None => e.partition_name.as_deref().and_then(super::source::parse_partition_name),
            };
            let (Some((topic, kp)), Ok(offset)) = (partition, i64::try_from(e.position)) else {
                continue;
            };
            tpl.add_partition_offset(&topic, kp, Offset::Offset(offset))
                .map_err(|e| self.err_caused(format!("cannot list the consumed offset of {topic}/{kp}"), e))?;
        }
        if tpl.count() == 0 {
            if !c.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(sink = %self.name(), source = %c.source, "the checkpoints hold no source of this name: consumed offsets are not committed (name it with with_consumed_offsets_named)");
            }
            return Ok(None);
        }
        if let Some(group) = c.metadata.get() {
            return Ok(Some(Offsets { tpl, group: Arc::clone(group) }));
        }
        let consumer: BaseConsumer = self
            .conn
            .config(&[("group.id", &c.group), ("enable.auto.commit", "false")])
            .create()
            .map_err(|e| self.err_caused(format!("cannot create a Kafka consumer for group `{}`", c.group), e))?;
        let Some(group) = consumer.group_metadata() else {
            return Err(self.err(format!("no consumer group metadata for group `{}`", c.group)));
        };
        let group = Arc::clone(c.metadata.get_or_init(|| Arc::new(group)));
        Ok(Some(Offsets { tpl, group }))
    }

    /// Commits `h` after a restart: its transaction died with the process
    /// that opened it; the marker says whether it had been committed, and
    /// if not the redo log is produced again.
    fn recover(&self, instance: usize, slot: usize, epoch: u64, run: Option<&str>, h: &str) -> Result<()> {
        self.fence_all()?;
        let mut s = self.take_or_create(instance, slot)?;
        let marker = self.committed_epoch(instance)?;
        let redo = self.redo_path(instance, epoch);
        let mut done = marker.as_ref().is_some_and(|m| m.covers(epoch, run));
        if !done && marker.as_ref().is_some_and(|m| run.is_some_and(|r| m.run != r)) && !redo.exists() {
            // Another run committed since, and this epoch's redo log is
            // gone: it is deleted only once its epoch is visible (or
            // written again after an older checkpoint). A job restored
            // from an older checkpoint than the newest (a rollback to a
            // savepoint, the fallback past a damaged checkpoint) gets here.
            tracing::info!(sink = %self.name(), instance, epoch, marker = ?marker, "an epoch of an earlier run, committed before: nothing to write again");
            done = true;
        }
        if !done {
            let records = read_redo(&redo)?;
            let id = self.transactional_id(instance, slot);
            s.producer
                .begin_transaction()
                .map_err(|e| self.err_caused(format!("cannot begin transaction `{id}`"), e))?;
            self.replay(&s, &records, &redo)?;
            self.settle(&mut s, &redo)?;
            self.commit_slot(&mut s, epoch, run.unwrap_or_default(), None)?;
            tracing::info!(sink = %self.name(), instance, epoch, records = records.len(), "re-committed an epoch from its redo log");
        }
        self.release(s);
        self.state().committed.insert(h.to_string());
        let _ = fs::remove_file(&redo);
        Ok(())
    }

    /// Waits until the brokers have every record of `s`'s open
    /// transaction, whose records are all in the redo log at `redo`.
    ///
    /// A transaction can get stuck: after a broker restart, a producer
    /// whose requests were in flight cannot know what the broker kept, and
    /// librdkafka holds the transaction until it is aborted (or, seen here,
    /// never gets the records acknowledged again). Such a transaction (not
    /// acknowledged within [`SETTLE_STEP`], or with a refused record) is
    /// given up: a new producer with the same transactional id fences the
    /// old one, which aborts its transaction, and writes the records again
    /// from the redo log, as often as needed within [`FLUSH_TIMEOUT`].
    /// Nothing of an aborted transaction was visible, so nothing is
    /// written twice.
    fn settle(&self, s: &mut Slot, redo: &Path) -> Result<()> {
        let name = self.name();
        let id = self.transactional_id(s.instance, s.slot);
        let deadline = Instant::now() + FLUSH_TIMEOUT;
        loop {
            let wait = SETTLE_STEP.min(deadline.saturating_duration_since(Instant::now()));
            let problem = match s.producer.flush(wait) {
                Ok(()) => match s.producer.context().check(&name) {
                    Ok(()) => return Ok(()),
                    Err(e) => e.to_string(),
                },
                Err(e) => format!("records were not acknowledged within {wait:?}: {e}"),
            };
            if Instant::now() >= deadline {
                return Err(
                    self.err(format!("transaction `{id}` did not complete within {FLUSH_TIMEOUT:?}: {problem}"))
                );
            }
            let hint = self.hint(&problem);
            tracing::warn!(sink = %name, transaction = %id, %problem, "replacing the producer and writing the transaction again from the redo log{hint}");
            self.replace_producer(s)?;
            self.rewrite(s, redo)?;
        }
    }

    /// For a warning about a refused record: the likely cause when it
    /// repeats.
    fn hint(&self, problem: &str) -> String {
        if problem.contains("epoch") || problem.contains("enced") || problem.contains("Fatal") {
            let timeout = self.txn_timeout;
            format!(
                " (if this repeats, transactions outlive transaction.timeout.ms = {} ms: keep it well above the checkpoint interval)",
                timeout.as_millis()
            )
        } else {
            String::new()
        }
    }

    /// Gives `s` a new producer with the same transactional id: its
    /// initialisation fences the old one and aborts the old one's open
    /// transaction. The old one is dropped on a thread of its own, since
    /// a stuck producer can take its time to close.
    fn replace_producer(&self, s: &mut Slot) -> Result<()> {
        let fresh = self.create_slot(s.instance, s.slot)?.producer;
        let old = std::mem::replace(&mut s.producer, fresh);
        let _ = std::thread::Builder::new().name("weibo-kafka-close".into()).spawn(move || drop(old));
        Ok(())
    }

    /// After an abort (or with a new producer): a new transaction with
    /// every record of the redo log at `redo`.
    fn rewrite(&self, s: &Slot, redo: &Path) -> Result<()> {
        let name = self.name();
        let id = self.transactional_id(s.instance, s.slot);
        // The delivery reports of the purged records are served, then
        // forgotten: they belong to the aborted attempt.
        let _ = s.producer.flush(Duration::from_secs(5));
        let _ = s.producer.context().check(&name);
        let records = read_redo(redo)?;
        s.producer.begin_transaction().map_err(|e| self.err_caused(format!("cannot begin transaction `{id}`"), e))?;
        self.replay(s, &records, redo)
    }

    /// Produces a redo log's `records` again in `s`'s open transaction,
    /// saying how far it is every few seconds (a large epoch takes a
    /// while) and when it is done.
    fn replay(&self, s: &Slot, records: &[OutRecord], redo: &Path) -> Result<()> {
        let name = self.name();
        let started = std::time::Instant::now();
        let mut said = started;
        for (done, r) in records.iter().enumerate() {
            produce(&name, &s.producer, &self.topic, r)?;
            if said.elapsed() >= Duration::from_secs(2) {
                said = std::time::Instant::now();
                tracing::info!(sink = %name, redo = %redo.display(), records = done + 1, of = records.len(),
                    elapsed = ?started.elapsed(), "replaying a redo log");
            }
        }
        tracing::info!(sink = %name, redo = %redo.display(), records = records.len(), elapsed = ?started.elapsed(),
            "replayed a redo log");
        Ok(())
    }

    /// The free producer of (instance, slot), or a new one.
    fn take_or_create(&self, instance: usize, slot: usize) -> Result<Slot> {
        {
            let mut st = self.state();
            if let Some(v) = st.free.get_mut(&instance)
                && let Some(pos) = v.iter().position(|s| s.slot == slot)
            {
                return Ok(v.swap_remove(pos));
            }
        }
        self.create_slot(instance, slot)
    }

    /// Fences every transactional id an earlier run used and this process
    /// has not: their open transactions are aborted. The brokers take about
    /// half a second for each, so all are fenced at once.
    fn fence_all(&self) -> Result<()> {
        let stale: Vec<(usize, usize)> =
            self.known_ids()?.into_iter().filter(|id| !self.state().live.contains(id)).collect();
        let fenced: Vec<Result<Slot>> = std::thread::scope(|scope| {
            let handles: Vec<_> =
                stale.iter().map(|&(instance, slot)| scope.spawn(move || self.create_slot(instance, slot))).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(self.err("fencing a transactional id panicked".into()))))
                .collect()
        });
        for s in fenced {
            self.release(s?);
        }
        Ok(())
    }

    /// Returns how many epochs after `checkpoint` (an instance's
    /// transaction each, pre-committed or still open, with its redo log)
    /// it discarded; the fencing aborts their transactions.
    fn abort_after(&self, checkpoint: u64) -> Result<u64> {
        // Drop the redo logs of epochs that will be written again.
        let mut discarded = 0;
        for entry in fs::read_dir(&self.redo).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let epoch =
                name.strip_suffix(".redo").and_then(|n| n.rsplit('-').next()).and_then(|e| e.parse::<u64>().ok());
            if epoch.is_some_and(|e| e > checkpoint) {
                let path = entry.path();
                fs::remove_file(&path).map_err(self.io("cannot discard redo log", &path))?;
                discarded += 1;
            }
        }
        // Fence every transactional id an earlier run used: their open
        // transactions (epochs after the checkpoint) are aborted.
        self.fence_all()?;
        Ok(discarded)
    }
}

/// Calls `f` again while it fails with an error the brokers say is
/// temporary (a coordinator moving or loading), for up to `within`.
fn retry<R>(within: Duration, mut f: impl FnMut() -> KafkaResult<R>) -> KafkaResult<R> {
    let deadline = Instant::now() + within;
    let mut pause = Duration::from_millis(20);
    loop {
        match f() {
            Err(e) if temporary(&e) && Instant::now() + pause < deadline => {
                tracing::debug!(error = %e, "temporary Kafka error; retrying");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// Runs `f` on a thread of its own and waits at most `limit` for its
/// result; `None` if it did not come (the thread goes on, detached).
fn bounded<R: Send + 'static>(limit: Duration, f: impl FnOnce() -> R + Send + 'static) -> Option<R> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("weibo-kafka-call".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    rx.recv_timeout(limit).ok()
}

/// Whether `e` says the producer was fenced: a newer producer with its
/// transactional id started, or the brokers aborted its transaction for
/// outliving `transaction.timeout.ms` (which bumps the producer's epoch).
fn fenced(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(e.rdkafka_error_code(), Some(C::Fenced | C::ProducerFenced | C::InvalidProducerEpoch))
}

fn is_timeout(e: &KafkaError) -> bool {
    matches!(e.rdkafka_error_code(), Some(RDKafkaErrorCode::OperationTimedOut | RDKafkaErrorCode::RequestTimedOut))
}

fn temporary(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    match e {
        KafkaError::Transaction(t) => t.is_retriable(),
        _ => matches!(
            e.rdkafka_error_code(),
            Some(
                C::NotCoordinator
                    | C::CoordinatorLoadInProgress
                    | C::CoordinatorNotAvailable
                    | C::RequestTimedOut
                    | C::ConcurrentTransactions
                    | C::UnstableOffsetCommit
            )
        ),
    }
}

/// Reads a redo log: records as `u32` little-endian length + Weibo codec.
fn read_redo(path: &Path) -> Result<Vec<OutRecord>> {
    let f = File::open(path).map_err(|source| Error::Io {
        action: "the records of a checkpointed epoch are missing: cannot open redo log",
        path: path.to_path_buf(),
        source,
    })?;
    let mut r = BufReader::new(f);
    let mut out = Vec::new();
    let mut len = [0u8; 4];
    let mut buf = Vec::new();
    loop {
        match r.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(out),
            Err(source) => return Err(Error::Io { action: "cannot read redo log", path: path.to_path_buf(), source }),
        }
        buf.resize(u32::from_le_bytes(len) as usize, 0);
        r.read_exact(&mut buf).map_err(|source| Error::Io {
            action: "redo log is truncated",
            path: path.to_path_buf(),
            source,
        })?;
        let rec = OutRecord::decode(&buf).map_err(|e| Error::Checkpoint {
            path: path.to_path_buf(),
            message: format!("record {} of the redo log is damaged: {e}", out.len() + 1),
            source: None,
        })?;
        out.push(rec);
    }
}

impl<T: Send + 'static> TwoPhaseCommitSink<T> for KafkaSink<T> {
    fn default_name(&self) -> String {
        format!("kafka {}", self.enc.topic)
    }

    fn open(&self, instance: usize, _parallelism: usize, epoch: CheckpointId) -> Result<Box<dyn TransactionWriter<T>>> {
        let epoch = epoch.get();
        let core = self.core()?;
        fs::create_dir_all(&core.redo).map_err(core.io("cannot create redo directory", &core.redo))?;
        let mut w = TxnWriter {
            core: Arc::clone(core),
            enc: self.enc.clone(),
            instance,
            epoch,
            slot: None,
            redo: None,
            rec: OutRecord::default(),
            buf: Vec::new(),
            broken: None,
            _t: PhantomData,
        };
        w.start()?;
        Ok(Box::new(w))
    }

    fn commit(&self, handle: &str) -> Result<()> {
        self.core()?.commit(handle, &[])
    }

    fn commit_at(&self, handle: &str, sources: &[SourcePositionEntry]) -> Result<()> {
        self.core()?.commit(handle, sources)
    }

    fn abort_after(&self, checkpoint: CheckpointId) -> Result<u64> {
        self.core()?.abort_after(checkpoint.get())
    }
}

struct TxnWriter<T> {
    core: Arc<Core>,
    enc: Encoder<T>,
    instance: usize,
    /// The epoch being written: records before barrier `epoch`.
    epoch: u64,
    slot: Option<Slot>,
    redo: Option<BufWriter<File>>,
    rec: OutRecord,
    buf: Vec<u8>,
    /// Why the open transaction cannot be committed as it is (its
    /// producer refused a record): the pre-commit writes it again.
    broken: Option<String>,
    _t: PhantomData<fn(T)>,
}

impl<T> TxnWriter<T> {
    fn start(&mut self) -> Result<()> {
        let s = self.core.acquire(self.instance)?;
        let id = self.core.transactional_id(s.instance, s.slot);
        s.producer
            .begin_transaction()
            .map_err(|e| self.core.err_caused(format!("cannot begin transaction `{id}`"), e))?;
        self.slot = Some(s);
        let path = self.core.redo_path(self.instance, self.epoch);
        let f = File::create(&path).map_err(self.core.io("cannot create redo log", &path))?;
        self.redo = Some(BufWriter::with_capacity(1 << 16, f));
        Ok(())
    }

    /// Makes the epoch durable: every record acknowledged by the brokers
    /// (still invisible) and in the redo log on disk.
    fn seal(&mut self, epoch: u64) -> Result<String> {
        let Some(mut s) = self.slot.take() else {
            // No transaction open (the last epoch was sealed): nothing to
            // commit.
            let h = handle(self.instance, NO_SLOT, epoch, &self.core.run);
            self.core.state().committed.insert(h.clone());
            return Ok(h);
        };
        let path = self.core.redo_path(self.instance, self.epoch);
        if let Some(w) = self.redo.take() {
            let f = w.into_inner().map_err(|e| Error::Io {
                action: "cannot write redo log",
                path: path.clone(),
                source: e.into_error(),
            })?;
            f.sync_all().map_err(self.core.io("cannot sync redo log", &path))?;
        }
        if let Some(problem) = self.broken.take() {
            let hint = self.core.hint(&problem);
            tracing::warn!(sink = %self.core.name(), %problem, "the producer refused a record; replacing it and writing the transaction again from the redo log{hint}");
            self.core.replace_producer(&mut s)?;
            self.core.rewrite(&s, &path)?;
        }
        self.core.settle(&mut s, &path)?;
        if epoch != self.epoch {
            // The redo log is named by the epoch the handle commits.
            let to = self.core.redo_path(self.instance, epoch);
            fs::rename(&path, &to).map_err(self.core.io("cannot rename redo log", &path))?;
        }
        let h = handle(self.instance, s.slot, epoch, &self.core.run);
        self.core.state().prepared.insert(h.clone(), Arc::new(Mutex::new(Some(Pending { slot: s }))));
        Ok(h)
    }
}

impl<T: Send + 'static> TransactionWriter<T> for TxnWriter<T> {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        let name = self.core.name();
        let (Some(s), Some(redo)) = (self.slot.as_ref(), self.redo.as_mut()) else {
            return Err(self.core.err("write outside a transaction".into()));
        };
        // A refused record is not checked here: every record is in the
        // redo log, and the pre-commit writes the epoch again when one was
        // refused (see `Core::settle`).
        for (v, m) in batch.values().iter().zip(batch.meta()) {
            self.enc.encode(&name, v, m.timestamp, &mut self.rec)?;
            self.buf.clear();
            self.rec
                .encode(&mut self.buf)
                .map_err(|e| self.core.err_caused("cannot write the redo log".to_string(), e))?;
            let len = u32::try_from(self.buf.len()).map_err(|_| self.core.err("record too large".into()))?;
            redo.write_all(&len.to_le_bytes())
                .and_then(|()| redo.write_all(&self.buf))
                .map_err(|e| self.core.err_caused("cannot write the redo log".to_string(), e))?;
            if self.broken.is_none()
                && let Err(e) = produce(&name, &s.producer, &self.enc.topic, &self.rec)
            {
                // Only the redo log from here on; see `seal`.
                self.broken = Some(e.report().to_string());
            }
        }
        batch.drain().for_each(drop);
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<String> {
        let checkpoint = checkpoint.get();
        weibo::blocking(|| {
            let h = self.seal(checkpoint)?;
            self.epoch = checkpoint + 1;
            self.start()?;
            Ok(h)
        })
    }

    fn finish(&mut self) -> Result<String> {
        weibo::blocking(|| self.seal(self.epoch))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    /// Exactly once needs transactional ids and a redo log, which a
    /// `KafkaSink` cannot default: the job refuses to start without them,
    /// naming the builder, before it writes or connects to anything.
    #[test]
    fn an_exactly_once_sink_without_transactions_refuses_to_start_naming_the_builder() {
        let job = weibo::Job::new("no-transactions");
        job.source(weibo::sources::IterSource::new(vec![1u32, 2])).sink_exactly_once(KafkaSink::new(
            "127.0.0.1:1",
            "out",
            crate::kafka::Json,
        ));
        let err = weibo::testing::block_on(job.run()).unwrap_err();
        assert_eq!(err.blame(), weibo::error::Blame::External, "{err}");
        assert!(err.to_string().contains("with_transactions(id, redo_dir)"), "{err}");
        assert!(err.to_string().contains("kafka out"), "{err}");
    }

    #[test]
    fn handles_round_trip_and_strangers_are_refused() {
        assert_eq!(parse_handle(&handle(3, 1, 17, "0af3")), Some((3, 1, 17, Some("0af3"))));
        assert_eq!(parse_handle("i3-s1-e17"), Some((3, 1, 17, None)), "a handle of an earlier build");
        assert_eq!(parse_handle("i3-s1"), None);
        assert_eq!(parse_handle("i3-s1-e2-x"), None);
        assert_eq!(parse_handle("i3-s1-e2-r"), None);
        assert_eq!(parse_handle("i3-s1-e2-rab-x"), None);
        assert_eq!(parse_handle("part-0-1.jsonl"), None);
    }

    #[test]
    fn a_marker_covers_the_epochs_of_its_own_run_only() {
        let m = Marker { epoch: 500, run: "a".into() };
        assert!(m.covers(500, Some("a")));
        assert!(m.covers(7, Some("a")), "an earlier epoch of the same run");
        assert!(!m.covers(501, Some("a")));
        assert!(!m.covers(101, Some("b")), "another run's epoch, though numbered lower: not visible");
        assert!(m.covers(101, None), "handles of earlier builds compare numbers, as they did");
        assert!(!Marker { epoch: 9, run: String::new() }.covers(9, Some("a")));
    }

    #[test]
    fn the_ids_file_ignores_a_line_cut_short_and_refuses_damage() {
        let dir = tempfile::tempdir().unwrap();
        let sink =
            KafkaSink::<Vec<u8>>::new("127.0.0.1:1", "t", crate::kafka::Bytes).with_transactions("job", dir.path());
        let core = sink.core().unwrap();
        assert!(core.known_ids().unwrap().is_empty(), "no file yet");
        fs::write(dir.path().join("transactional-ids"), "0 0\n1 0\n0 1").unwrap();
        assert_eq!(core.known_ids().unwrap().into_iter().collect::<Vec<_>>(), vec![(0, 0), (1, 0)]);
        fs::write(dir.path().join("transactional-ids"), "0 0\nx 1\n").unwrap();
        let err = core.known_ids().unwrap_err().to_string();
        assert!(err.contains("transactional-ids") && err.contains("line 2"), "{err}");
    }

    #[test]
    fn redo_logs_read_back_and_damage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0-1.redo");
        let mut bytes = Vec::new();
        for i in 0..3u8 {
            let r = OutRecord { key: Some(vec![i]), value: vec![i; 5], timestamp: Some(7), headers: vec![] };
            let mut b = Vec::new();
            r.encode(&mut b).unwrap();
            bytes.extend_from_slice(&u32::try_from(b.len()).unwrap().to_le_bytes());
            bytes.extend_from_slice(&b);
        }
        fs::write(&path, &bytes).unwrap();
        let back = read_redo(&path).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back[2].value, vec![2; 5]);
        fs::write(&path, &bytes[..bytes.len() - 2]).unwrap();
        let err = read_redo(&path).unwrap_err().to_string();
        assert!(err.contains("truncated") && err.contains("0-1.redo"), "{err}");
        let err = read_redo(&dir.path().join("missing.redo")).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
    }
}
