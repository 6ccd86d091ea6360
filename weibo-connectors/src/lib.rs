//! Connectors for Weibo that talk to external services.
//!
//! Each connector lives behind a cargo feature so that a pipeline only
//! compiles what it uses. None is available yet: Kafka (`kafka`, on
//! rdkafka) and PostgreSQL (`postgres`, on deadpool-postgres) come next.
//! The built-in connectors that need no service (in-memory values,
//! generator, files, stdout, blackhole) are in `weibo::sources` and
//! `weibo::sinks`.

pub use weibo;
