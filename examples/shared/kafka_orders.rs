//! The pipeline of the Kafka → Postgres example (`kafka_postgres`):
//! orders read from a Kafka topic, the paid ones appended to a table
//! exactly once, with the consumed offsets committed in the same
//! transactions, so that a restart resumes from Postgres and the job
//! needs no checkpoint directory. The tests run it against a real broker
//! and server.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use weibo::Job;
use weibo::checkpoint::MemoryStorage;
use weibo_connectors::kafka::{Json, KafkaRecord, KafkaSource};
use weibo_connectors::postgres::PostgresSink;

// ANCHOR: table
/// The table the example writes into.
pub(crate) const TABLE: &str = "
CREATE TABLE IF NOT EXISTS paid_orders (id int8 NOT NULL, customer text NOT NULL, cents int8 NOT NULL);
";
// ANCHOR_END: table

/// An order as the topic holds it (JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Order {
    pub(crate) id: i64,
    pub(crate) customer: String,
    pub(crate) cents: i64,
}

// ANCHOR: job
pub(crate) fn job(brokers: &str, topic: &str, url: &str) -> weibo::Result<Job> {
    let sink = PostgresSink::builder(url, "paid_orders")
        .with_column("id", |o: &Order| o.id)
        .with_column_ref("customer", |o: &Order| &o.customer)
        .with_column("cents", |o: &Order| o.cents)
        .with_id("paid-orders")
        .store_source_positions()
        .build()?;
    // Where the last run's committed rows end, per partition (nothing on
    // the first run: the source starts at the earliest records).
    let resume = sink.stored_positions()?;
    let source = KafkaSource::builder(brokers, [topic], Json).resume_from(&resume).build::<Order>()?;

    // Checkpoints still drive the commits (every second), but nothing
    // needs to survive in them: the positions are in Postgres.
    let job = Job::new("paid-orders").with_checkpoint_storage(MemoryStorage::new(), Duration::from_secs(1));
    job.source(source)
        .name("orders")
        .map(|r: KafkaRecord<Order>| r.value)
        .filter(|o: &Order| o.cents > 0)
        .sink_exactly_once(sink);
    Ok(job)
}
// ANCHOR_END: job
