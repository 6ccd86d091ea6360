//! The book's "Metrics and backpressure" chapter: watching a running job,
//! reading the final report, and seeing a slow stage in the edge metrics.
//!
//! Run it with `cargo run -p weibo-examples --example book_metrics`.

// ANCHOR: imports
use std::time::Duration;

use weibo::prelude::*;
use weibo_examples::{Order, Totals, order};
// ANCHOR_END: imports

#[tokio::main]
async fn main() -> weibo::Result<()> {
    watch().await?;
    backpressure().await?;
    Ok(())
}

// ANCHOR: watch
async fn watch() -> weibo::Result<()> {
    let job = Job::new("watched");
    job.source(Generator::new(2_000, order).with_rate(4_000.0)) // about half a second of input
        .name("orders")
        .filter(|o: &Order| o.amount_cents > 0)
        .name("paid")
        .sink(Blackhole::new());

    let handle = job.spawn()?; // starts the tasks on the current tokio runtime
    while !handle.is_finished() {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = handle.metrics();
        if let Some(paid) = now.operator("paid") {
            println!("paid: {} in, {} out so far", paid.records_in, paid.records_out);
        }
    }
    let report = handle.wait().await?; // the job's result, final metrics and wall time
    println!("finished in {:?}\n{}", report.elapsed, report.metrics);

    // Operators are listed in the order of the graph, sources first.
    let names: Vec<&str> = report.metrics.operators.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["orders", "paid", "blackhole"]);
    let paid = report.metrics.operator("paid").map(|m| (m.records_in, m.records_out));
    let expected_out = (0..2_000).map(order).filter(|o| o.amount_cents > 0).count() as u64;
    assert_eq!(paid, Some((2_000, expected_out)));
    Ok(())
}
// ANCHOR_END: watch

// ANCHOR: backpressure
async fn backpressure() -> weibo::Result<()> {
    let job = Job::new("slow-sink").with_batch_size(64).with_channel_capacity(2);
    job.source(Generator::new(5_000, order))
        .name("orders")
        .map(|o: Order| Totals { customer: o.customer, orders: 1, cents: o.amount_cents })
        .key_by(|t: &Totals| t.customer)
        .reduce(|a, b| Totals { customer: a.customer, orders: a.orders + b.orders, cents: a.cents + b.cents })
        .name("totals")
        .map(|t: Totals| {
            std::thread::sleep(Duration::from_micros(100)); // a slow downstream call
            t
        })
        .name("slow")
        .sink(Blackhole::new());

    let report = job.run().await?;
    for edge in &report.metrics.edges {
        println!("{} -> {}: {} batches, sender blocked {:?}", edge.from, edge.to, edge.batches, edge.blocked);
    }
    assert!(report.metrics.total_blocked() > Duration::ZERO);
    Ok(())
}
// ANCHOR_END: backpressure
