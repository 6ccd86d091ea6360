//! The book's "Testing your pipelines" chapter: `testing::run`, `run_job`,
//! and `TestJob` with several inputs, collected outputs, dead letters and
//! metrics.
//!
//! Run it with `cargo run -p weibo-examples --example book_testing`.

// ANCHOR: imports
use std::error::Error;

use weibo::prelude::*;
use weibo::testing::{self, TestJob};
use weibo_examples::{CustomerId, Order, Totals, order};
// ANCHOR_END: imports

fn main() -> Result<(), Box<dyn Error>> {
    run()?;
    run_job()?;
    test_job()?;
    failing()?;
    Ok(())
}

// ANCHOR: run
fn run() -> weibo::Result<()> {
    let out = testing::run(vec![3, 1, 2], |s| s.map(|x: i32| x * 10))?;
    assert_eq!(out, [30, 10, 20]); // one partition everywhere: input order is kept
    Ok(())
}
// ANCHOR_END: run

// ANCHOR: run_job
fn run_job() -> weibo::Result<()> {
    let mut out = testing::run_job(|job| {
        job.source(Generator::new(100, order).with_partitions(4)).filter(|o: &Order| o.amount_cents < 0)
    })?;
    // Several partitions: sort before comparing, here with the same filter run on a plain iterator.
    let mut expected: Vec<Order> = (0..100).map(order).filter(|o| o.amount_cents < 0).collect();
    out.sort_by_key(|o| (o.customer, o.amount_cents));
    expected.sort_by_key(|o| (o.customer, o.amount_cents));
    assert_eq!(out, expected);
    Ok(())
}
// ANCHOR_END: run_job

// ANCHOR: pipeline
/// The pipeline under test: parse order lines, drop the unparsable ones into
/// dead letters, and total per customer.
fn totals(lines: &Stream<String>) -> (Stream<Totals>, Stream<weibo::DeadLetter<String>>) {
    let (orders, dead) = lines.process(on_error::DeadLetter, |line: &String| parse(line));
    let totals = orders
        .name("parse")
        .key_by(|o: &Order| o.customer)
        .with_partitions(2)
        .fold(
            || (0u64, 0i64),
            |acc: &mut (u64, i64), o: Order| {
                acc.0 += 1;
                acc.1 += o.amount_cents;
            },
        )
        .name("totals")
        .map(|(customer, (orders, cents))| Totals { customer, orders, cents });
    (totals, dead)
}

/// `"<customer> <cents>"`.
fn parse(line: &str) -> Result<Order, String> {
    let (customer, cents) = line.split_once(' ').ok_or("expected `<customer> <cents>`")?;
    Ok(Order {
        customer: CustomerId(customer.parse().map_err(|e| format!("bad customer: {e}"))?),
        amount_cents: cents.parse().map_err(|e| format!("bad amount: {e}"))?,
    })
}
// ANCHOR_END: pipeline

/// Owned lines, as a file source would produce them.
fn lines(values: &[&str]) -> Vec<String> {
    values.iter().map(|s| s.to_string()).collect()
}

// ANCHOR: test_job
fn test_job() -> Result<(), Box<dyn Error>> {
    let mut t = TestJob::new("totals-test").configure(|job| job.with_max_key_groups(16).with_batch_size(2));
    let web = t.input(lines(&["1 250", "2 100", "oops", "1 50"])).name("web");
    let shop = t.input(lines(&["2 -30", "3 x"])).name("shop");
    let (totals, dead) = totals(&web.union(&shop));
    let totals = t.collect(&totals);
    let dead = t.collect(&dead);
    let report = t.run()?;

    // A key's outputs come from one worker, in the order it processed them: the last one is the total.
    let mut last = std::collections::BTreeMap::new();
    for total in totals.values() {
        last.insert(total.customer, (total.orders, total.cents));
    }
    assert_eq!(last.into_iter().collect::<Vec<_>>(), [(CustomerId(1), (2, 300)), (CustomerId(2), (2, 70))]);

    let mut dead: Vec<(String, String, u64)> =
        dead.values().into_iter().map(|d| (d.position.source, d.error, d.position.offset)).collect();
    dead.sort();
    assert_eq!(
        dead,
        [
            ("shop".to_string(), "bad amount: invalid digit found in string".to_string(), 1),
            ("web".to_string(), "expected `<customer> <cents>`".to_string(), 2),
        ]
    );

    let parse = report.metrics.operator("parse").ok_or("no metrics for `parse`")?;
    assert_eq!((parse.records_in, parse.records_out, parse.dead_lettered), (6, 4, 2));
    Ok(())
}
// ANCHOR_END: test_job

// ANCHOR: failing
fn failing() -> Result<(), Box<dyn Error>> {
    let err = testing::run(lines(&["1 250", "oops"]), |s| s.process(on_error::Fail, |l: &String| parse(l)))
        .err()
        .ok_or("the job should fail")?;
    assert!(matches!(err, weibo::Error::RecordFailed { ref position, .. } if position.offset == 1));
    Ok(())
}
// ANCHOR_END: failing
