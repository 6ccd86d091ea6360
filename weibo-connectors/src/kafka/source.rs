//! The Kafka source: one Weibo source partition per Kafka partition.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use weibo::checkpoint::SourcePositionEntry;
use weibo::sources::{ReadStatus, Source, SourceOutput, SourceReader};
use weibo::{BoxFuture, Error, Result};

use super::{Connection, Format, connector, connector_caused};

/// A record read from Kafka: its value decoded by the source's format,
/// with the key, headers, timestamp and where it was read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaRecord<T> {
    /// The topic it was read from.
    pub topic: Arc<str>,
    /// Its Kafka partition.
    pub partition: i32,
    /// Its offset in the partition.
    pub offset: i64,
    /// Its Kafka timestamp (milliseconds since the epoch), if it has one.
    pub timestamp: Option<i64>,
    /// Its key's bytes, if it has a key.
    pub key: Option<Vec<u8>>,
    /// Its headers, in order (a header without a value has an empty one).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The decoded value.
    pub value: T,
}

/// Where a partition is read from when the job has no checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StartAt {
    /// The oldest record still in the partition.
    #[default]
    Earliest,
    /// The end of the partition: only records written after the job starts.
    Latest,
}

/// What a source does with a payload its format cannot decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DecodeErrors {
    /// Fail the job with an error naming the topic, partition and offset.
    #[default]
    Fail,
    /// Skip the record, log a warning naming it, and count it in the
    /// source's `skipped` total ([`KafkaSource::skipped`]).
    Skip,
}

/// Reads Kafka topics. Every Kafka partition of every topic is one
/// partition of the source (topics in the order given, partitions in
/// order), read by its own task with its own consumer, so the source's
/// parallelism is the topics' partition count.
///
/// Where reading starts: the offsets in the checkpoint the job restores
/// from, otherwise [`StartAt`]. A consumer group is only named for
/// monitoring tools: the source assigns partitions itself and never reads
/// or commits the group's offsets.
///
/// ```no_run
/// use weibo_connectors::kafka::{KafkaSource, Json};
/// # fn main() -> weibo::Result<()> {
/// let source = KafkaSource::builder("127.0.0.1:9092", ["clicks"], Json)
///     .with_group("click-counter")
///     .build::<serde_json::Value>()?;
/// # let _ = source; Ok(()) }
/// ```
pub struct KafkaSource<T> {
    conn: Connection,
    group: String,
    start: StartAt,
    /// Offsets to start from without a checkpoint, before `start`.
    resume: BTreeMap<(String, i32), i64>,
    bounded: bool,
    decode_errors: DecodeErrors,
    partitions: Vec<(String, i32)>,
    format: Arc<dyn Format<T>>,
    skipped: Arc<std::sync::atomic::AtomicU64>,
    /// How far each partition has been read: a [`super::KafkaGroup`]
    /// commits it to the group, an exactly-once [`super::KafkaSink`] at the end of input.
    progress: Arc<Progress>,
}

/// How far each Kafka partition of a source has been read: the next
/// offset, or -1 before the reader has opened. Shared with the
/// [`super::KafkaGroup`] that commits it to the consumer group so that
/// monitoring tools see the lag.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    pub(crate) next: std::sync::Mutex<BTreeMap<(String, i32), Arc<AtomicI64>>>,
}

impl Progress {
    /// The slot a reader of `topic`/`partition` updates.
    fn slot(&self, topic: &str, partition: i32) -> Arc<AtomicI64> {
        let mut next = self.next.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(next.entry((topic.to_string(), partition)).or_insert_with(|| Arc::new(AtomicI64::new(-1))))
    }
}

impl<T> fmt::Debug for KafkaSource<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSource")
            .field("brokers", &self.conn.brokers)
            .field("partitions", &self.partitions)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

/// Settings of a [`KafkaSource`]; [`KafkaSourceBuilder::build`] contacts the
/// brokers to learn the topics' partitions.
pub struct KafkaSourceBuilder<F> {
    conn: Connection,
    topics: Vec<String>,
    group: Option<String>,
    start: StartAt,
    /// Offsets to resume from, with the source id each came from.
    resume: BTreeMap<(String, i32), (i64, String)>,
    /// Two sources' positions for one partition (refused by `build`).
    resume_conflict: Option<String>,
    bounded: bool,
    decode_errors: DecodeErrors,
    format: F,
    only: Option<i32>,
    progress: Option<Arc<Progress>>,
}

impl<F> fmt::Debug for KafkaSourceBuilder<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSourceBuilder")
            .field("brokers", &self.conn.brokers)
            .field("topics", &self.topics)
            .finish_non_exhaustive()
    }
}

impl KafkaSource<()> {
    /// A source reading `topics` from the cluster at `brokers`
    /// (`host:port[,host:port…]`), decoding values with `format`.
    pub fn builder<F>(
        brokers: impl Into<String>,
        topics: impl IntoIterator<Item = impl Into<String>>,
        format: F,
    ) -> KafkaSourceBuilder<F> {
        KafkaSourceBuilder {
            conn: Connection::new(brokers),
            topics: topics.into_iter().map(Into::into).collect(),
            group: None,
            start: StartAt::default(),
            resume: BTreeMap::new(),
            resume_conflict: None,
            bounded: false,
            decode_errors: DecodeErrors::default(),
            format,
            only: None,
            progress: None,
        }
    }
}

impl<F> KafkaSourceBuilder<F> {
    /// The consumer group named to the brokers (default `weibo-<topics>`).
    #[must_use]
    pub fn with_group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Where to start without a checkpoint (default [`StartAt::Earliest`]).
    #[must_use]
    pub fn with_start_at(mut self, start: StartAt) -> Self {
        self.start = start;
        self
    }

    /// Without a checkpoint to restore, starts each partition found in
    /// `positions` at its position there (the next offset to read), and
    /// the others at [`StartAt`]: for positions a sink committed with its
    /// records, such as the Postgres sink's
    /// `PostgresSink::stored_positions`. An entry is matched by its
    /// partition name (`<topic>/<partition>`, which a Kafka source gives
    /// its partitions); entries of other topics are ignored. A checkpoint
    /// the job restores still wins. [`KafkaSourceBuilder::build`] refuses
    /// a position beyond what a Kafka offset can be, and the positions of
    /// two sources (by [`SourcePositionEntry::source`]) for one partition:
    /// keep one source's (`positions.iter().filter(|p| p.source == "…")`)
    /// when a job reads a topic twice.
    #[must_use]
    pub fn resume_from<'a>(mut self, positions: impl IntoIterator<Item = &'a SourcePositionEntry>) -> Self {
        for p in positions {
            let Some((topic, kp)) = p.partition_name.as_deref().and_then(parse_partition_name) else { continue };
            // An offset past i64::MAX cannot be Kafka's: `build` names it.
            let offset = i64::try_from(p.position).unwrap_or(-1);
            if let Some((_, other)) = self.resume.get(&(topic.clone(), kp))
                && *other != p.source
            {
                self.resume_conflict.get_or_insert_with(|| {
                    format!(
                        "the positions to resume from hold {topic}/{kp} twice, for sources `{other}` and `{}`: pass \
                         one source's (filter them by `source`)",
                        p.source
                    )
                });
            }
            self.resume.insert((topic, kp), (offset, p.source.clone()));
        }
        self
    }

    /// Ends each partition at the end it had when its reader opened,
    /// instead of waiting for more records: for backfills and tests.
    #[must_use]
    pub fn until_end(mut self) -> Self {
        self.bounded = true;
        self
    }

    /// What to do with undecodable payloads (default [`DecodeErrors::Fail`]).
    #[must_use]
    pub fn with_decode_errors(mut self, policy: DecodeErrors) -> Self {
        self.decode_errors = policy;
        self
    }

    /// Sets a librdkafka consumer property (security, fetch sizes, …).
    #[must_use]
    pub fn with_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.conn.props.insert(key.into(), value.into());
        self
    }

    /// How long to wait for the brokers' metadata (default 10 s).
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.conn.timeout = timeout;
        self
    }

    /// Reads only partition `partition` of each topic (a [`super::Task`]'s share).
    pub(crate) fn only(mut self, partition: i32, progress: Arc<Progress>) -> Self {
        self.only = Some(partition);
        self.progress = Some(progress);
        self
    }

    /// Contacts the brokers and returns the source.
    ///
    /// # Errors
    /// [`Error::Connector`] when the brokers do not answer (naming their
    /// address), when a topic does not exist, or when no topic was given.
    pub fn build<T>(self) -> Result<KafkaSource<T>>
    where
        F: Format<T>,
    {
        let name = format!("kafka {}", self.topics.join(","));
        if self.topics.is_empty() {
            return Err(connector(&name, "no topic to read".into()));
        }
        let mut partitions = self.conn.partitions(&name, &self.topics)?;
        if let Some(only) = self.only {
            partitions.retain(|(_, p)| *p == only);
            for topic in &self.topics {
                if !partitions.iter().any(|(t, _)| t == topic) {
                    return Err(connector(&name, format!("topic `{topic}` has no partition {only}")));
                }
            }
        }
        if let Some(((topic, kp), _)) = self.resume.iter().find(|((t, _), (o, _))| *o < 0 && self.topics.contains(t)) {
            return Err(connector(&name, format!("the position to resume {topic}/{kp} from is out of range")));
        }
        if let Some(conflict) = self.resume_conflict {
            return Err(connector(&name, conflict));
        }
        let resume = self.resume.into_iter().map(|(k, (offset, _))| (k, offset)).collect();
        Ok(KafkaSource {
            group: self.group.unwrap_or_else(|| format!("weibo-{}", self.topics.join("-"))),
            conn: self.conn,
            start: self.start,
            resume,
            bounded: self.bounded,
            decode_errors: self.decode_errors,
            partitions,
            format: Arc::new(self.format),
            skipped: Arc::default(),
            progress: self.progress.unwrap_or_default(),
        })
    }
}

impl<T> KafkaSource<T> {
    /// The Kafka partitions, in the order of the source's partitions.
    pub fn kafka_partitions(&self) -> &[(String, i32)] {
        &self.partitions
    }

    /// The consumer group the source names to the brokers.
    pub fn group_name(&self) -> &str {
        &self.group
    }

    /// How many undecodable records were skipped (with [`DecodeErrors::Skip`]).
    pub fn skipped(&self) -> Arc<std::sync::atomic::AtomicU64> {
        Arc::clone(&self.skipped)
    }

    fn name(&self) -> String {
        let mut topics: Vec<&str> = self.partitions.iter().map(|(t, _)| t.as_str()).collect();
        topics.dedup();
        format!("kafka {}", topics.join(","))
    }

    fn reader(&self, partition: usize, position: Option<i64>) -> Result<Box<dyn SourceReader<KafkaRecord<T>>>>
    where
        T: Clone + Send + 'static,
    {
        let name = self.name();
        let Some((topic, kp)) = self.partitions.get(partition) else {
            return Err(connector(&name, format!("no partition {partition}")));
        };
        let consumer: StreamConsumer<ReaderContext> = self
            .conn
            .config(&[
                ("group.id", &self.group),
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("enable.partition.eof", "true"),
                ("isolation.level", "read_committed"),
                ("auto.offset.reset", "earliest"),
                // librdkafka's statistics, every second, carry the
                // partition's last stable offset: the end its lag is
                // measured to (see `ReaderContext::stats`).
                ("statistics.interval.ms", "1000"),
            ])
            .create_with_context(ReaderContext {
                topic: topic.clone(),
                partition: *kp,
                end: Arc::new(AtomicI64::new(-1)),
            })
            .map_err(|e| connector_caused(&name, "cannot create a Kafka consumer".to_string(), e))?;
        let (low, high) =
            consumer.fetch_watermarks(topic, *kp, self.conn.timeout).map_err(|e| self.conn.unreachable(&name, &e))?;
        let resumed = self.resume.get(&(topic.clone(), *kp)).copied();
        if let (None, Some(r)) = (position, resumed) {
            if r < low {
                tracing::warn!(topic = %topic, partition = kp, resume = r, earliest = low, "the records from the position to resume from up to the partition's earliest are gone (retention): starting at the earliest");
            } else if r > high {
                tracing::warn!(topic = %topic, partition = kp, resume = r, end = high, "the position to resume from is past the partition's end (was the topic deleted and created again?): reading from its earliest record");
            }
        }
        let start = match (position.or(resumed), self.start) {
            (Some(p), _) => p,
            (None, StartAt::Earliest) => low,
            (None, StartAt::Latest) => high,
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, *kp, Offset::Offset(start))
            .map_err(|e| connector_caused(&name, format!("cannot assign {topic}/{kp}"), e))?;
        consumer.assign(&tpl).map_err(|e| connector_caused(&name, format!("cannot assign {topic}/{kp}"), e))?;
        let end = Arc::clone(&consumer.context().end);
        end.store(high, std::sync::atomic::Ordering::Relaxed);
        Ok(Box::new(KafkaReader {
            partition_end: end,
            consumer,
            d: Decoder {
                name,
                topic: Arc::from(topic.as_str()),
                partition: *kp,
                next: start,
                format: Arc::clone(&self.format),
                decode_errors: self.decode_errors,
                skipped: Arc::clone(&self.skipped),
            },
            progress: self.progress.slot(topic, *kp),
            end: self.bounded.then_some(high),
        }))
    }
}

impl<T: Clone + Send + Sync + 'static> Source for KafkaSource<T> {
    type Item = KafkaRecord<T>;

    fn default_name(&self) -> String {
        self.name()
    }

    fn describe(&self) -> String {
        format!("{}, {} partitions at {}", self.name(), self.partitions.len(), self.conn.brokers)
    }

    fn partitions(&self) -> usize {
        self.partitions.len()
    }

    fn open(&self, partition: usize) -> Result<Box<dyn SourceReader<KafkaRecord<T>>>> {
        self.reader(partition, None)
    }

    fn open_at(&self, partition: usize, position: u64) -> Result<Box<dyn SourceReader<KafkaRecord<T>>>> {
        let offset = i64::try_from(position)
            .map_err(|_| connector(&self.name(), format!("checkpointed offset {position} is out of range")))?;
        self.reader(partition, Some(offset))
    }

    /// `<topic>/<partition>`.
    fn partition_name(&self, partition: usize) -> Option<String> {
        self.partitions.get(partition).map(|(topic, kp)| format!("{topic}/{kp}"))
    }
}

/// The topic and partition of a [`Source::partition_name`] of a Kafka
/// source (`<topic>/<partition>`; topic names cannot hold `/`).
pub(crate) fn parse_partition_name(name: &str) -> Option<(String, i32)> {
    let (topic, kp) = name.rsplit_once('/')?;
    Some((topic.to_string(), kp.parse().ok()?))
}

/// The librdkafka client context of a reader's consumer: an expected end
/// of a partition, which librdkafka also reports as a global error event,
/// is logged at debug level (the reader sees it as `PartitionEOF` and
/// acts on it); every other error as rdkafka's default context does.
/// A partition reader's consumer context: logs librdkafka's errors and
/// keeps the partition's end (its last stable offset) from librdkafka's
/// statistics, which it emits every second.
struct ReaderContext {
    topic: String,
    partition: i32,
    /// The partition's last stable offset (the end of what a
    /// `read_committed` consumer can read), or -1 before it is known.
    end: Arc<AtomicI64>,
}

impl rdkafka::ClientContext for ReaderContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        let found = statistics.topics.get(&self.topic).and_then(|t| t.partitions.get(&self.partition));
        if let Some(p) = found.filter(|p| p.ls_offset >= 0) {
            self.end.store(p.ls_offset, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(error.rdkafka_error_code(), Some(rdkafka::types::RDKafkaErrorCode::PartitionEOF))
            || matches!(error, KafkaError::PartitionEOF(_))
        {
            tracing::debug!(%reason, "librdkafka: end of partition");
        } else {
            tracing::error!(%error, %reason, "librdkafka error");
        }
    }
}

impl ConsumerContext for ReaderContext {}

/// Errors a consumer recovers from by itself (a broker restarting, a
/// leader moving).
fn transient(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::AllBrokersDown
                | C::BrokerTransportFailure
                | C::NetworkException
                | C::RequestTimedOut
                | C::OperationTimedOut
                | C::NotLeaderForPartition
                | C::LeaderNotAvailable
                | C::NotCoordinator
                | C::CoordinatorNotAvailable
        )
    )
}

struct KafkaReader<T> {
    consumer: StreamConsumer<ReaderContext>,
    d: Decoder<T>,
    /// Where a bounded source ends.
    end: Option<i64>,
    progress: Arc<AtomicI64>,
    /// Where the partition ends now (see `ReaderContext`).
    partition_end: Arc<AtomicI64>,
}

/// Turns messages into records; apart from the consumer so that a message
/// borrowed from the consumer can be decoded without a copy.
struct Decoder<T> {
    name: String,
    topic: Arc<str>,
    partition: i32,
    /// The offset of the next record to read: the checkpointed position.
    next: i64,
    format: Arc<dyn Format<T>>,
    decode_errors: DecodeErrors,
    skipped: Arc<std::sync::atomic::AtomicU64>,
}

impl<T> KafkaReader<T> {
    fn done(&self) -> bool {
        self.end.is_some_and(|end| self.d.next >= end)
    }

    /// After the end of the partition was reached: the fetch position,
    /// which is past transaction markers and aborted records.
    fn catch_up(&mut self) {
        if let Ok(tpl) = self.consumer.position()
            && let Some(e) = tpl.find_partition(&self.d.topic, self.d.partition)
            && let Offset::Offset(o) = e.offset()
        {
            self.d.next = self.d.next.max(o);
        }
    }
}

impl<T: 'static> Decoder<T> {
    fn take<M: Message>(&mut self, m: &M, out: &mut SourceOutput<KafkaRecord<T>>) -> Result<()> {
        let offset = m.offset();
        self.next = offset + 1;
        let value = match self.format.decode(m.payload().unwrap_or_default()) {
            Ok(v) => v,
            Err(reason) => {
                let at = format!("topic `{}` partition {} offset {offset}", self.topic, self.partition);
                match self.decode_errors {
                    DecodeErrors::Fail => {
                        return Err(Error::Input {
                            position: out.position(u64::try_from(offset).unwrap_or_default()),
                            message: format!("{at}: cannot decode the value as {}: {reason}", self.format.name()),
                        });
                    }
                    DecodeErrors::Skip => {
                        tracing::warn!(source = %self.name, %at, %reason, "skipping a record that cannot be decoded");
                        self.skipped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        return Ok(());
                    }
                }
            }
        };
        let headers = m
            .headers()
            .map(|hs| hs.iter().map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec())).collect())
            .unwrap_or_default();
        let timestamp = m.timestamp().to_millis();
        out.push(
            KafkaRecord {
                topic: Arc::clone(&self.topic),
                partition: self.partition,
                offset,
                timestamp,
                key: m.key().map(<[u8]>::to_vec),
                headers,
                value,
            },
            u64::try_from(offset).unwrap_or_default(),
            timestamp,
        );
        Ok(())
    }
}

impl<T: Send + 'static> SourceReader<KafkaRecord<T>> for KafkaReader<T> {
    fn read<'a>(&'a mut self, out: &'a mut SourceOutput<KafkaRecord<T>>) -> BoxFuture<'a, Result<ReadStatus>> {
        Box::pin(async move {
            if self.done() {
                return Ok(ReadStatus::Done);
            }
            let deadline = tokio::time::Instant::from_std(out.deadline());
            while out.remaining() > 0 {
                // Wait (until the deadline) for the first record of a
                // batch; take the rest only while they are ready.
                let next = if out.is_empty() {
                    tokio::time::timeout_at(deadline, self.consumer.recv()).await
                } else {
                    tokio::time::timeout(Duration::ZERO, self.consumer.recv()).await
                };
                let Ok(result) = next else { break };
                match result {
                    Ok(m) => self.d.take(&m, out)?,
                    Err(KafkaError::PartitionEOF(_)) => {
                        self.catch_up();
                        break;
                    }
                    // librdkafka reconnects and fetches again by itself.
                    Err(e) if transient(&e) => {
                        tracing::warn!(source = %self.d.name, topic = %self.d.topic, partition = self.d.partition, error = %e, "temporary Kafka error; reading on");
                        break;
                    }
                    Err(e) => {
                        return Err(connector(
                            &self.d.name,
                            format!("reading {} partition {} failed: {e}", self.d.topic, self.d.partition),
                        ));
                    }
                }
                if self.done() {
                    break;
                }
            }
            self.progress.store(self.d.next, std::sync::atomic::Ordering::Relaxed);
            if self.done() && out.is_empty() {
                return Ok(ReadStatus::Done);
            }
            Ok(if out.is_empty() { ReadStatus::Idle } else { ReadStatus::More })
        })
    }

    fn position(&self) -> Option<u64> {
        u64::try_from(self.d.next).ok()
    }

    fn end_position(&self) -> Option<u64> {
        let end = self.partition_end.load(std::sync::atomic::Ordering::Relaxed);
        // A bounded source ends at its bound, whatever came after it.
        let end = self.end.map_or(end, |bound| end.min(bound));
        u64::try_from(end).ok()
    }
}
