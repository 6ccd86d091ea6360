//! The quickstart: a deterministic generator of orders → drop refunds →
//! key by customer → running totals on 4 partitions → stdout.
//!
//! Run it with `cargo run --release -p weibo-examples --example quickstart`.

// ANCHOR: imports
use weibo::prelude::*;
use weibo_examples::{Order, Totals, order};
// ANCHOR_END: imports

// ANCHOR: pipeline
#[tokio::main]
async fn main() -> Result<(), weibo::Error> {
    let job = Job::new("orders-per-customer");
    job.source(Generator::new(20, order))
        .name("orders")
        .filter(|o: &Order| o.amount_cents > 0)
        .name("paid-only")
        .map(|o: Order| Totals { customer: o.customer, orders: 1, cents: o.amount_cents })
        .key_by(|t: &Totals| t.customer)
        .with_partitions(4)
        .reduce(|a, b| Totals { customer: a.customer, orders: a.orders + b.orders, cents: a.cents + b.cents })
        .name("totals")
        .sink(Stdout);

    println!("{job}");
    println!("{}", job.plan()?);
    let report = job.run().await?;
    println!("\n{}", report.metrics);
    Ok(())
}
// ANCHOR_END: pipeline
