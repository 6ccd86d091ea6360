//! The pipeline of the Postgres example (`postgres_totals`): orders →
//! every order appended to `orders`, each customer's running total
//! upserted into `totals`, both exactly once. The tests run it against a
//! real server.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use weibo::Job;
use weibo::sources::Generator;
use weibo_connectors::postgres::{PostgresSink, Rejected};

// ANCHOR: tables
/// The tables the example writes (the sink creates its own: progress, and
/// the dead-letter table).
pub(crate) const TABLES: &str = "
CREATE TABLE IF NOT EXISTS orders (id int8 PRIMARY KEY, customer text NOT NULL, cents int8 NOT NULL CHECK (cents > 0));
CREATE TABLE IF NOT EXISTS totals (customer text PRIMARY KEY, cents int8 NOT NULL, orders int8 NOT NULL);
";
// ANCHOR_END: tables

// ANCHOR: types
#[derive(Clone, Debug)]
pub(crate) struct Order {
    pub(crate) id: i64,
    pub(crate) customer: String,
    pub(crate) cents: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Total {
    pub(crate) customer: String,
    pub(crate) cents: i64,
    pub(crate) orders: i64,
}
// ANCHOR_END: types

/// Order `i`: one of 50 customers; every 1000th order has a price of 0,
/// which the table's check refuses.
pub(crate) fn order(i: u64) -> Order {
    let cents = if i % 1000 == 999 { 0 } else { 100 + (i % 37) as i64 * 25 };
    Order { id: i as i64, customer: format!("customer-{}", i % 50), cents }
}

// ANCHOR: job
pub(crate) fn job(url: &str, checkpoints: &std::path::Path, orders: u64) -> weibo::Result<Job> {
    let job = Job::new("order-totals").with_checkpoints(checkpoints, Duration::from_secs(1));
    let input = job.source(Generator::new(orders, order).with_partitions(2)).name("orders");

    // Every order once; a refused one (a price of 0) goes to a table of its own.
    let log = PostgresSink::builder(url, "orders")
        .with_column("id", |o: &Order| o.id)
        .with_column_ref("customer", |o: &Order| &o.customer)
        .with_column("cents", |o: &Order| o.cents)
        .with_rejected(Rejected::DeadLetterTable("orders_rejected".into()))
        .build()?;
    input.sink_exactly_once(log);

    // Each customer's running total, upserted: the table holds the last.
    let totals = PostgresSink::builder(url, "totals")
        .with_column_ref("customer", |t: &Total| &t.customer)
        .with_column("cents", |t: &Total| t.cents)
        .with_column("orders", |t: &Total| t.orders)
        .with_upsert_keys(["customer"])
        .build()?;
    input
        .filter(|o: &Order| o.cents > 0)
        .map(|o: Order| Total { customer: o.customer, cents: o.cents, orders: 1 })
        .key_by(|t: &Total| t.customer.clone())
        .with_partitions(2)
        .reduce(|a, b| Total { customer: b.customer, cents: a.cents + b.cents, orders: a.orders + b.orders })
        .name("totals")
        .sink_exactly_once(totals);
    Ok(job)
}
// ANCHOR_END: job
