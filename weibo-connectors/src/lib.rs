//! Connectors for Weibo that talk to external services.
//!
//! Each connector lives behind a cargo feature so that a pipeline only
//! compiles what it uses:
//! - `kafka`: [`kafka::KafkaSource`], [`kafka::KafkaSink`] (at least once)
//!   and [`kafka::TxnKafkaSink`] (exactly once), on rdkafka.
//!
//! The built-in connectors that need no service (in-memory values,
//! generator, files, stdout, blackhole) are in `weibo::sources` and
//! `weibo::sinks`.

pub use weibo;

#[cfg(feature = "kafka")]
pub mod kafka;
