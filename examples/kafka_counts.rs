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

#[path = "shared/clicks.rs"]
mod clicks;

// ANCHOR: imports
use std::path::Path;
use std::time::Duration;

use clicks::{Click, count_clicks};
use weibo::prelude::*;
use weibo_connectors::kafka::{Json, KafkaSink, KafkaSource};
// ANCHOR_END: imports

// ANCHOR: job
fn job(brokers: &str, input: &str, output: &str, dir: &Path) -> weibo::Result<Job> {
    let job = Job::new("click-counts").with_checkpoints(dir.join("checkpoints"), Duration::from_secs(1));
    // One source partition per Kafka partition; offsets live in checkpoints.
    let clicks = KafkaSource::builder(brokers, [input], Json).with_group("click-counts").build::<Click>()?;
    // Exactly-once output; the consumed offsets go to the group in the
    // same transactions, for lag monitoring.
    let out = KafkaSink::new(brokers, output, Json)
        .with_transactions("click-counts", dir.join("kafka-redo"))
        .with_consumed_offsets(&clicks);
    count_clicks(&job, clicks, out);
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
