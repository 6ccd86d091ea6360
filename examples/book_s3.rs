//! The book's "S3" chapter: checkpoints in an S3 bucket, and files written
//! to one exactly once. Building the storage connects to nothing, so this
//! example wires the job and prints its plan without a server; the tests
//! (`tests/s3_storage.rs`, `tests/s3_sink.rs`) run the same against one.
//!
//! Run it with `cargo run -p weibo-examples --example book_s3`.

// ANCHOR: imports
use std::error::Error;
use std::time::Duration;

use weibo::prelude::*;
use weibo_connectors::s3::S3Storage;
use weibo_connectors::s3_sink::S3Sink;
use weibo_examples::order;
// ANCHOR_END: imports

fn main() -> Result<(), Box<dyn Error>> {
    // ANCHOR: checkpoints
    let storage = S3Storage::builder("my-bucket", "jobs/orders")
        .with_region("eu-west-1")
        .from_env() // AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT, …
        .build()?;
    let job = Job::new("orders").with_checkpoint_storage(storage, Duration::from_secs(10));
    // ANCHOR_END: checkpoints
    let orders = job.source(Generator::new(1_000, order)).name("orders");
    // ANCHOR: sink
    let out = S3Storage::builder("my-bucket", "exports/orders").from_env().build()?;
    orders
        .sink_exactly_once(
            S3Sink::json_lines(out).with_roll_bytes(128 << 20).with_roll_interval(Duration::from_secs(300)),
        )
        .uid("exports");
    // ANCHOR_END: sink
    let plan = job.plan()?;
    println!("{plan}");
    assert!(plan.contains("chain `orders` x1") && !plan.contains("warning"), "{plan}");
    Ok(())
}
