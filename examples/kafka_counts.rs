//! Exactly-once Kafka → Kafka: count clicks per user and write every click
//! with its user's running count, exactly once across crashes.
//!
//! ```sh
//! cargo run --release -p weibo-examples --example kafka_counts -- \
//!     <brokers> <input topic> <output topic> <state dir>
//! ```
//!
//! Kill it (`kill -9`) whenever you like and start it again with the same
//! arguments: it restores its newest checkpoint, commits what that
//! checkpoint covered if the crash came first, and goes on. A consumer
//! with `isolation.level=read_committed` sees every click exactly once.
//! The book's chapter "Kafka, exactly once" walks through it.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use weibo::Job;
use weibo_connectors::kafka::{Json, KafkaRecord, KafkaSource, TxnKafkaSink};

// ANCHOR: types
/// What the input topic holds (JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Click {
    user: String,
    page: String,
}

/// What the output topic gets (JSON): the click and its user's count so far.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Counted {
    user: String,
    page: String,
    count: u64,
}
// ANCHOR_END: types

// ANCHOR: job
fn job(brokers: &str, input: &str, output: &str, dir: &Path) -> weibo::Result<Job> {
    let job = Job::new("click-counts").with_checkpoints(dir.join("checkpoints"), Duration::from_secs(1));
    // One source partition per Kafka partition; offsets live in checkpoints.
    let clicks = KafkaSource::builder(brokers, [input], Json).group("click-counts").build::<Click>()?;
    job.source(clicks)
        .name("clicks")
        .map(|r: KafkaRecord<Click>| Counted { user: r.value.user, page: r.value.page, count: 1 })
        .key_by(|c: &Counted| c.user.clone())
        .with_partitions(2)
        .reduce(|total, c| Counted { user: c.user, page: c.page, count: total.count + 1 })
        .name("count")
        // One Kafka transaction per checkpoint, committed when it completes.
        .sink_exactly_once(
            TxnKafkaSink::new(brokers, output, Json, "click-counts", dir.join("kafka-redo"))
                .with_key(|c: &Counted| Some(c.user.clone().into_bytes())),
        );
    Ok(job)
}
// ANCHOR_END: job

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [brokers, input, output, dir] = args.as_slice() else {
        return Err("usage: kafka_counts <brokers> <input topic> <output topic> <state dir>".into());
    };
    // ANCHOR: run
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(job(brokers, input, output, Path::new(dir))?.run())?;
    // ANCHOR_END: run
    Ok(())
}
