//! The at-least-once Kafka sink, and what both Kafka sinks share: turning
//! values into Kafka records and producing them without losing any.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use weibo::Result;
use weibo::sinks::{Sink, SinkBatch, SinkWriter};

use super::{Connection, Format, connector, connector_caused};

/// How long a flush at a barrier may wait for the brokers' acknowledgements.
pub(crate) const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

type KeyFn<T> = Arc<dyn Fn(&T) -> Option<Vec<u8>> + Send + Sync>;
type HeadersFn<T> = Arc<dyn Fn(&T) -> Vec<(String, Vec<u8>)> + Send + Sync>;

/// What a sink writes for each value: topic, payload, key, headers, timestamp.
pub(crate) struct Encoder<T> {
    pub(crate) topic: String,
    pub(crate) format: Arc<dyn Format<T>>,
    pub(crate) key: Option<KeyFn<T>>,
    pub(crate) headers: Option<HeadersFn<T>>,
}

impl<T> Clone for Encoder<T> {
    fn clone(&self) -> Self {
        Self {
            topic: self.topic.clone(),
            format: Arc::clone(&self.format),
            key: self.key.clone(),
            headers: self.headers.clone(),
        }
    }
}

/// One record ready to produce.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct OutRecord {
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) value: Vec<u8>,
    pub(crate) timestamp: Option<i64>,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
}

impl<T: 'static> Encoder<T> {
    /// Encodes `value`; its event time (if any) becomes the Kafka timestamp.
    pub(crate) fn encode(&self, name: &str, value: &T, event_time: i64, out: &mut OutRecord) -> Result<()> {
        out.value.clear();
        self.format.encode(value, &mut out.value).map_err(|e| {
            connector_caused(
                name,
                format!("cannot encode a record as {} for topic `{}`", self.format.name(), self.topic),
                e,
            )
        })?;
        out.key = self.key.as_ref().and_then(|k| k(value));
        out.headers = self.headers.as_ref().map(|h| h(value)).unwrap_or_default();
        out.timestamp = (event_time >= 0).then_some(event_time);
        Ok(())
    }
}

/// Remembers the first record the brokers refused, so that nothing is lost
/// without a word: the at-least-once sink fails the job at its next write,
/// barrier or flush; the exactly-once sink writes the epoch again from its
/// redo log at the pre-commit.
#[derive(Default)]
pub(crate) struct Deliveries {
    failed: Mutex<Option<String>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, m)) = result {
            use rdkafka::message::Message;
            let mut failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
            if failed.is_none() {
                *failed = Some(format!("the brokers did not take a record for {}/{}: {e}", m.topic(), m.partition()));
            }
        }
    }
}

impl Deliveries {
    pub(crate) fn check(&self, name: &str) -> Result<()> {
        match self.failed.lock().unwrap_or_else(PoisonError::into_inner).take() {
            Some(message) => Err(connector(name, message)),
            None => Ok(()),
        }
    }
}

pub(crate) type KafkaProducer = ThreadedProducer<Deliveries>;

/// Produces one record, waiting while librdkafka's queue is full.
pub(crate) fn produce(name: &str, producer: &KafkaProducer, topic: &str, r: &OutRecord) -> Result<()> {
    let headers = (!r.headers.is_empty()).then(|| {
        r.headers.iter().fold(OwnedHeaders::new_with_capacity(r.headers.len()), |hs, (k, v)| {
            hs.insert(Header { key: k, value: Some(v) })
        })
    });
    let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).payload(&r.value[..]);
    if let Some(k) = &r.key {
        record = record.key(&k[..]);
    }
    if let Some(ts) = r.timestamp {
        record = record.timestamp(ts);
    }
    if let Some(h) = headers {
        record = record.headers(h);
    }
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                // The producer's thread delivers and frees the queue.
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => {
                return Err(connector_caused(name, format!("cannot produce to topic `{topic}`"), e));
            }
        }
    }
}

/// Writes records to a Kafka topic, at least once with
/// [`Stream::sink`](weibo::Stream::sink), exactly once with
/// [`Stream::sink_exactly_once`](weibo::Stream::sink_exactly_once).
///
/// At least once: librdkafka's idempotent producer (no duplicates from
/// its own retries, order kept per partition), and at every checkpoint
/// barrier the sink waits until the brokers acknowledged everything
/// written before it, so a completed checkpoint never refers to records
/// that could still be lost. After a crash, records written after the
/// restored checkpoint are written again.
///
/// Exactly once: Kafka transactions committed in step with the job's
/// checkpoints (see [`KafkaSink::with_transactions`], which it needs);
/// records become visible to `read_committed` consumers when the
/// checkpoint that covers them completes.
///
/// Each value's event time, when it has one, becomes the Kafka timestamp.
pub struct KafkaSink<T> {
    pub(super) conn: Connection,
    pub(super) enc: Encoder<T>,
    /// What exactly-once writes need, and their state once started.
    pub(super) txn: super::txn::Transactions,
}

impl<T> fmt::Debug for KafkaSink<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSink")
            .field("brokers", &self.conn.brokers)
            .field("topic", &self.enc.topic)
            .field("transactions", &self.txn.id())
            .finish_non_exhaustive()
    }
}

impl<T> KafkaSink<T> {
    /// A sink producing to `topic` on the cluster at `brokers`, encoding
    /// values with `format`.
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>, format: impl Format<T>) -> Self {
        Self {
            conn: Connection::new(brokers),
            enc: Encoder { topic: topic.into(), format: Arc::new(format), key: None, headers: None },
            txn: super::txn::Transactions::default(),
        }
    }

    /// Gives each record a key computed from its value (records
    /// without a key are spread over the partitions).
    #[must_use]
    pub fn with_key(mut self, key: impl Fn(&T) -> Option<Vec<u8>> + Send + Sync + 'static) -> Self {
        self.enc.key = Some(Arc::new(key));
        self
    }

    /// Gives each record headers computed from its value.
    #[must_use]
    pub fn with_headers(mut self, headers: impl Fn(&T) -> Vec<(String, Vec<u8>)> + Send + Sync + 'static) -> Self {
        self.enc.headers = Some(Arc::new(headers));
        self
    }

    /// Sets a librdkafka producer property (security, batching, …).
    #[must_use]
    pub fn with_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.conn.props.insert(key.into(), value.into());
        self
    }
}

impl<T: Send + 'static> Sink<T> for KafkaSink<T> {
    fn default_name(&self) -> String {
        format!("kafka {}", self.enc.topic)
    }

    fn open(&self, instance: usize, _parallelism: usize) -> Result<Box<dyn SinkWriter<T>>> {
        let name = self.default_name();
        if instance == 0
            && let Some(id) = self.txn.id()
        {
            tracing::warn!(sink = %name, transactions = %id, "the sink has `with_transactions` but is used with `sink`: it writes at least once; use `sink_exactly_once` for transactions");
        }
        let producer: KafkaProducer = self
            .conn
            .config(&[("enable.idempotence", "true"), ("linger.ms", "5")])
            .create_with_context(Deliveries::default())
            .map_err(|e| connector_caused(&name, "cannot create a Kafka producer".to_string(), e))?;
        // Fail now, naming the brokers, rather than at the first barrier.
        self.conn.partitions(&name, std::slice::from_ref(&self.enc.topic))?;
        Ok(Box::new(KafkaWriter { name, producer, enc: self.enc.clone(), rec: OutRecord::default(), _t: PhantomData }))
    }
}

struct KafkaWriter<T> {
    name: String,
    producer: KafkaProducer,
    enc: Encoder<T>,
    rec: OutRecord,
    _t: PhantomData<fn(T)>,
}

impl<T: Send + 'static> SinkWriter<T> for KafkaWriter<T> {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        self.producer.context().check(&self.name)?;
        for (v, m) in batch.values().iter().zip(batch.meta()) {
            self.enc.encode(&self.name, v, m.timestamp, &mut self.rec)?;
            produce(&self.name, &self.producer, &self.enc.topic, &self.rec)?;
        }
        batch.drain().for_each(drop);
        Ok(())
    }

    fn on_barrier(&mut self, _checkpoint: weibo::record::CheckpointId) -> Result<()> {
        self.wait_for_acks()
    }

    fn finish(&mut self) -> Result<()> {
        self.wait_for_acks()
    }
}

impl<T> KafkaWriter<T> {
    fn wait_for_acks(&mut self) -> Result<()> {
        weibo::blocking(|| self.producer.flush(FLUSH_TIMEOUT)).map_err(|e| {
            connector_caused(&self.name, format!("records were not acknowledged within {FLUSH_TIMEOUT:?}"), e)
        })?;
        self.producer.context().check(&self.name)
    }
}
