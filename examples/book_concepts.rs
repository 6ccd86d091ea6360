//! The book's "Concepts" chapter: fusion in the plan, key groups, and the
//! settings of a job.
//!
//! Run it with `cargo run -p weibo-examples --example book_concepts`.

// ANCHOR: imports
use std::time::Duration;

use weibo::prelude::*;
use weibo::state::MemoryBackend;
use weibo_examples::{CustomerId, Order, Totals, order};
// ANCHOR_END: imports

fn main() -> weibo::Result<()> {
    let (job, big_spenders) = fusion()?;
    assert_eq!(
        job.to_string(),
        "job `fusion` (128 key groups, state: memory)
  #0 source `orders` (generator, 1000 events, 2 partitions) : Order
  #1 filter `filter` <- #0 : Order
  #2 map `map` <- #1 : Totals
  #3 reduce `totals` x3 <- #2 hash(CustomerId) [serde-postcard/1] : Totals
  #4 filter `big-spenders` <- #3 : Totals
  #5 sink `collect` <- #4
"
    );
    assert_eq!(
        job.plan()?,
        "plan of job `fusion`: 2 chains, 5 tasks
  chain `orders` x2: orders -> filter -> map => hash(CustomerId) totals
  chain `totals` x3: totals -> big-spenders -> collect
"
    );
    job.run_blocking()?;
    assert!(!big_spenders.values().is_empty());

    let (hash, group) = key_groups();
    assert_eq!(u64::from(group), hash % 128);

    let job = settings();
    let out = CollectSink::new();
    job.source(Generator::new(10, order)).key_by(|o: &Order| o.customer).with_partitions(200).sink(out.clone());
    assert!(job.to_string().starts_with("job `tuned` (256 key groups, state: memory)\n"));
    job.run_blocking()?;
    assert_eq!(out.values().len(), 10);
    Ok(())
}

// ANCHOR: fusion
fn fusion() -> weibo::Result<(Job, CollectSink<Totals>)> {
    let big_spenders = CollectSink::new();
    let job = Job::new("fusion");
    job.source(Generator::new(1_000, order).with_partitions(2))
        .name("orders")
        .filter(|o: &Order| o.amount_cents > 0)
        .map(|o: Order| Totals { customer: o.customer, orders: 1, cents: o.amount_cents })
        .key_by(|t: &Totals| t.customer)
        .with_partitions(3)
        .reduce(|a, b| Totals { customer: a.customer, orders: a.orders + b.orders, cents: a.cents + b.cents })
        .name("totals")
        .filter(|t: &Totals| t.cents > 500_000)
        .name("big-spenders")
        .sink(big_spenders.clone());

    println!("{job}");
    println!("{}", job.plan()?);
    Ok((job, big_spenders))
}
// ANCHOR_END: fusion

// ANCHOR: key_groups
fn key_groups() -> (u64, u16) {
    let bytes = weibo::key::encode(&CustomerId(7));
    assert_eq!(bytes, [0, 0, 0, 7]);
    let hash = weibo::key::key_hash(&bytes); // xxh3-64, seed 0
    let group = weibo::key::key_group(&bytes, weibo::DEFAULT_MAX_KEY_GROUPS); // hash % 128
    println!("CustomerId(7): hash {hash:#018x}, key group {group} of 128");
    (hash, group)
}
// ANCHOR_END: key_groups

// ANCHOR: settings
fn settings() -> Job {
    Job::new("tuned")
        .with_max_key_groups(256) // key groups: fix this when the job is first deployed
        .with_batch_size(256) // records per batch (default 1024)
        .with_buffer_timeout(Duration::from_millis(2)) // latency bound of a quiet edge (default 10 ms)
        .with_channel_capacity(16) // batches an edge holds before its sender blocks (default 8)
        .with_state_backend(MemoryBackend) // where keyed state lives (the default)
}
// ANCHOR_END: settings
