//! Kafka: a partitioned source whose offsets live in Weibo's checkpoints,
//! an at-least-once sink, and an exactly-once (transactional) sink.
//!
//! - [`KafkaSource`] reads topics; every Kafka partition is one Weibo
//!   source partition, read by its own task. Offsets are part of every
//!   checkpoint and a restored job seeks to them: a consumer group's
//!   committed offsets are never where reading starts from.
//! - [`KafkaSink`], as a plain sink (`.sink(..)`), produces with
//!   librdkafka's idempotent producer and waits for every record to be
//!   acknowledged at each checkpoint barrier: nothing is lost, records
//!   after the last checkpoint may be written twice after a crash. As an
//!   exactly-once sink (`.sink_exactly_once(..)`, with
//!   [`KafkaSink::with_transactions`]) it writes each checkpoint epoch in a
//!   Kafka transaction, committed when the checkpoint completes:
//!   `read_committed` consumers see every record exactly once, across
//!   crashes.
//! - [`KafkaGroup`] scales a job out: processes in one consumer group
//!   split the input partitions, and each runs one job (a [`Task`]) per
//!   partition it owns, checkpointed to storage they share, so a
//!   partition's state moves with it.

mod format;
mod group;
mod sink;
mod source;
mod txn;

pub use format::{Bytes, Format, Json, Native, Text};
pub use group::{DEFAULT_SESSION_TIMEOUT, DEFAULT_STORAGE_WAIT, GroupHandle, KafkaGroup, Task};
pub use sink::KafkaSink;
pub use source::{DecodeErrors, KafkaRecord, KafkaSource, KafkaSourceBuilder, StartAt};

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use weibo::Error;

/// How long a metadata request may take before the broker counts as unreachable.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connection settings shared by sources and sinks: the bootstrap servers
/// and any librdkafka property (security, client id, tuning).
#[derive(Clone, Debug)]
pub(crate) struct Connection {
    pub(crate) brokers: String,
    pub(crate) props: BTreeMap<String, String>,
    pub(crate) timeout: Duration,
}

impl Connection {
    pub(crate) fn new(brokers: impl Into<String>) -> Self {
        Self { brokers: brokers.into(), props: BTreeMap::new(), timeout: DEFAULT_CONNECT_TIMEOUT }
    }

    /// A librdkafka configuration with the user's properties applied last.
    pub(crate) fn config(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        for (k, v) in defaults {
            c.set(*k, *v);
        }
        for (k, v) in &self.props {
            c.set(k, v);
        }
        c
    }

    /// The partition count of every topic in `topics`, checking that the
    /// brokers answer and that each topic exists.
    pub(crate) fn partitions(&self, name: &str, topics: &[String]) -> Result<Vec<(String, i32)>, Error> {
        let consumer: BaseConsumer = self
            .config(&[("allow.auto.create.topics", "false")])
            .create()
            .map_err(|e| connector_caused(name, "cannot create a Kafka client".to_string(), e))?;
        let mut out = Vec::new();
        for topic in topics {
            let md = consumer.fetch_metadata(Some(topic), self.timeout).map_err(|e| self.unreachable(name, &e))?;
            let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
                return Err(connector(name, format!("topic `{topic}` does not exist on {}", self.brokers)));
            };
            if let Some(err) = t.error() {
                let code = rdkafka::types::RDKafkaErrorCode::from(err);
                if code == rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition {
                    return Err(connector(name, format!("topic `{topic}` does not exist on {}", self.brokers)));
                }
                return Err(connector(name, format!("topic `{topic}` is not available on {}: {code}", self.brokers)));
            }
            if t.partitions().is_empty() {
                return Err(connector(name, format!("topic `{topic}` does not exist on {}", self.brokers)));
            }
            let mut ps: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
            ps.sort_unstable();
            out.extend(ps.into_iter().map(|p| (topic.clone(), p)));
        }
        Ok(out)
    }

    /// The error for a broker that did not answer.
    pub(crate) fn unreachable(&self, name: &str, e: &KafkaError) -> Error {
        connector_caused(
            name,
            format!("cannot reach the Kafka brokers at {} within {:?}", self.brokers, self.timeout),
            e.clone(),
        )
    }
}

pub(crate) fn connector(name: &str, message: String) -> Error {
    Error::Connector { name: name.to_string(), message, source: None }
}

/// As [`connector`], keeping the client's error as the cause.
pub(crate) fn connector_caused(name: &str, message: String, source: impl Into<weibo::error::BoxError>) -> Error {
    Error::Connector { name: name.to_string(), message, source: Some(source.into()) }
}
