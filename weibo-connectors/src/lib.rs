//! Connectors for Weibo that talk to external services.
//!
//! Each connector lives behind a cargo feature so that a pipeline only
//! compiles what it uses:
//! - `kafka`: [`kafka::KafkaSource`] and [`kafka::KafkaSink`] (at least
//!   once, or exactly once with Kafka transactions), on rdkafka.
//! - `postgres`: [`postgres::PostgresSink`] (append or upsert, at least
//!   once or exactly once), on deadpool-postgres.
//! - `http`: [`http::HttpSink`] (batches of JSON to an endpoint, at least
//!   once with idempotency keys), on reqwest.
//! - `s3`: [`s3::S3Storage`], checkpoints in S3 or a service that speaks
//!   its API, on object_store.
//! - `yaml`: [`yaml::Pipeline`], pipelines declared in YAML with CEL
//!   expressions, run on every connector compiled in.
//! - `cli`: the `weibo` command (every connector, YAML pipelines, the admin
//!   API's client, the checkpoint inspector).
//!
//! The built-in connectors that need no service (in-memory values,
//! generator, files, stdout, blackhole) are in `weibo::sources` and
//! `weibo::sinks`.

pub use weibo;

#[cfg(feature = "kafka")]
pub mod kafka;

#[cfg(feature = "postgres")]
pub mod postgres;

#[cfg(feature = "http")]
pub mod http;

#[cfg(feature = "s3")]
pub mod s3;

#[cfg(feature = "s3")]
pub mod s3_sink;

#[cfg(feature = "yaml")]
pub mod yaml;

#[cfg(feature = "control")]
pub mod control;

#[cfg(any(feature = "postgres", feature = "http", feature = "s3"))]
mod runtime;
