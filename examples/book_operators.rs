//! The book's "Stream operators" chapter: map, filter, flat_map, process
//! under each failure policy and with side outputs, union, fan-out, names
//! and blocking calls.
//!
//! Run it with `cargo run -p weibo-examples --example book_operators`.

// ANCHOR: imports
use std::error::Error;
use std::path::Path;

use weibo::prelude::*;
use weibo_examples::{CustomerId, Order, order};
// ANCHOR_END: imports

fn main() -> Result<(), Box<dyn Error>> {
    stateless()?;
    drop_policy()?;
    let dir = std::env::temp_dir().join("weibo-book-operators");
    std::fs::create_dir_all(&dir)?;
    dead_letters(&dir.join("dead-letters.jsonl"))?;
    std::fs::remove_dir_all(&dir)?;
    fail_policy()?;
    batches()?;
    side_outputs()?;
    // The default panic hook would print the panic this example expects; keep the output clean.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let panicked = panic_in_a_function();
    std::panic::set_hook(hook);
    panicked?;
    union()?;
    fan_out()?;
    blocking()?;
    Ok(())
}

/// Owned lines, as a file source would produce them.
fn lines(values: &[&str]) -> Vec<String> {
    values.iter().map(|s| s.to_string()).collect()
}

// ANCHOR: stateless
fn stateless() -> weibo::Result<()> {
    let words = CollectSink::new();
    let job = Job::new("words");
    job.source(IterSource::new(lines(&["the quick brown fox", "", "jumps over the lazy dog"])))
        .flat_map(|line: String| line.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter(|word: &String| word != "the")
        .map(|word: String| word.to_uppercase())
        .sink(words.clone());
    job.run_blocking()?;
    assert_eq!(words.values(), ["QUICK", "BROWN", "FOX", "JUMPS", "OVER", "LAZY", "DOG"]);
    Ok(())
}
// ANCHOR_END: stateless

// ANCHOR: drop
fn drop_policy() -> weibo::Result<()> {
    let numbers = CollectSink::new();
    let job = Job::new("parse");
    job.source(IterSource::new(lines(&["1", "x", "3"])))
        .name("lines")
        .process(on_error::Drop, |line: &String| line.parse::<u32>())
        .name("parse")
        .sink(numbers.clone());
    let report = job.run_blocking()?;
    assert_eq!(numbers.values(), [1, 3]);
    assert_eq!(report.metrics.operator("parse").map(|m| m.dropped), Some(1));
    Ok(())
}
// ANCHOR_END: drop

// ANCHOR: dead_letter
fn dead_letters(dead_letter_file: &Path) -> Result<(), Box<dyn Error>> {
    let numbers = CollectSink::new();
    let job = Job::new("parse");
    let (parsed, failed) = job
        .source(IterSource::new(lines(&["1", "x", "3"])))
        .name("lines")
        .process(on_error::DeadLetter, |line: &String| line.parse::<u32>());
    parsed.name("parse").sink(numbers.clone());
    failed.sink(FileSink::json_lines(dead_letter_file)).name("dead-letters");
    println!("{job}");
    job.run_blocking()?;

    assert_eq!(numbers.values(), [1, 3]);
    let letters = std::fs::read_to_string(dead_letter_file)?;
    print!("{letters}");
    assert_eq!(
        letters,
        r#"{"record":"x","error":"invalid digit found in string","operator":"parse","position":{"source":"lines","partition":0,"offset":1}}"#
            .to_string()
            + "\n"
    );
    Ok(())
}
// ANCHOR_END: dead_letter

// ANCHOR: fail
fn fail_policy() -> Result<(), Box<dyn Error>> {
    let job = Job::new("parse");
    job.source(IterSource::new(lines(&["1", "x", "3"])))
        .name("lines")
        .process(on_error::Fail, |line: &String| line.parse::<u32>())
        .name("parse")
        .sink(Blackhole::new());
    let err = job.run_blocking().err().ok_or("the job should have failed")?;
    assert!(matches!(err, weibo::Error::RecordFailed { .. }));
    assert_eq!(
        err.to_string(),
        "operator `parse` failed on the record from source `lines` partition 0 offset 1: invalid digit found in string"
    );
    Ok(())
}
// ANCHOR_END: fail

// ANCHOR: batches
fn batches() -> Result<(), Box<dyn Error>> {
    let prices = CollectSink::new();
    let job = Job::new("prices");
    let (cents, dead) = job.source(IterSource::new(lines(&["1.25", "2", "n/a", "0.5"]))).name("lines").process_batch(
        on_error::DeadLetter,
        // Every price of a batch is parsed, then converted in one pass (a
        // vectorised call, a model, a lookup of many keys at once would go
        // here); a line that is not a price fails alone.
        |batch: &[String], out: &mut BatchOutput<i64, String>| {
            let parsed: Vec<Option<f64>> = batch.iter().map(|l| l.parse::<f64>().ok()).collect();
            for (i, (price, line)) in parsed.iter().zip(batch).enumerate() {
                match price {
                    Some(p) => out.emit(i, (p * 100.0).round() as i64),
                    None => out.fail(i, format!("`{line}` is not a price")),
                }
            }
        },
    );
    cents.name("cents").sink(prices.clone());
    dead.sink(Blackhole::new());
    let report = job.run_blocking()?;
    assert_eq!(prices.values(), vec![125, 200, 50]);
    assert_eq!(report.metrics.operator("cents").map(|m| m.dead_lettered), Some(1));
    Ok(())
}
// ANCHOR_END: batches

// ANCHOR: side_outputs
/// Large orders go on; small ones and refunds each go to a side output of
/// their own type, and lines that do not parse to the dead letters.
fn side_outputs() -> weibo::Result<()> {
    let small = OutputTag::<Order>::new("small");
    let refunds = OutputTag::<(CustomerId, i64)>::new("refunds");
    let (large_orders, small_orders, refunded) = (CollectSink::new(), CollectSink::new(), CollectSink::new());
    let job = Job::new("order-sizes");
    let (large, unreadable) = job
        .source(IterSource::new(lines(&["1 2500", "2 300", "3 -700", "4 x", "5 9000"])))
        .name("lines")
        .process_with_outputs(
            on_error::DeadLetter,
            |outputs| (outputs.side_output(&small), outputs.side_output(&refunds)),
            |ctx, (small, refunds), line| {
                parse_order(line).map(|order| match order.amount_cents {
                    ..0 => ctx.output(refunds, (order.customer, -order.amount_cents)),
                    0..1_000 => ctx.output(small, order),
                    _ => ctx.emit(order),
                })
            },
        );
    let large = large.name("sizes");
    large.side_output(&small).sink(small_orders.clone());
    large.side_output(&refunds).sink(refunded.clone());
    large.sink(large_orders.clone());
    unreadable.sink(Blackhole::new());
    println!("{job}");
    let report = job.run_blocking()?;

    let customers = |orders: Vec<Order>| orders.iter().map(|o| o.customer.0).collect::<Vec<_>>();
    assert_eq!(customers(large_orders.values()), [1, 5]);
    assert_eq!(customers(small_orders.values()), [2]);
    assert_eq!(refunded.values(), [(CustomerId(3), 700)]);
    assert_eq!(report.metrics.operator("sizes").map(|m| m.dead_lettered), Some(1));
    Ok(())
}

/// An order from a line `<customer> <cents>`.
fn parse_order(line: &str) -> Result<Order, String> {
    let (customer, cents) = line.split_once(' ').ok_or(format!("`{line}` has no amount"))?;
    let customer = CustomerId(customer.parse().map_err(|e| format!("customer `{customer}`: {e}"))?);
    let amount_cents = cents.parse().map_err(|e| format!("amount `{cents}`: {e}"))?;
    Ok(Order { customer, amount_cents })
}
// ANCHOR_END: side_outputs

// ANCHOR: panic
fn panic_in_a_function() -> Result<(), Box<dyn Error>> {
    let job = Job::new("divide");
    job.source(IterSource::new(vec![4u32, 0, 2])).map(|x: u32| 100 / x).sink(Blackhole::new());
    let err = job.run_blocking().err().ok_or("the job should have failed")?;
    assert!(matches!(err, weibo::Error::Panicked { .. }));
    assert_eq!(err.to_string(), "a user function in `values[0]` panicked: attempt to divide by zero");
    Ok(())
}
// ANCHOR_END: panic

// ANCHOR: union
fn union() -> weibo::Result<()> {
    let all = CollectSink::new();
    let job = Job::new("all-orders");
    let web = job.source(IterSource::new(vec![order(1), order(2)])).name("web");
    let app = job.source(IterSource::new(vec![order(3)])).name("app");
    web.union(&app).filter(|o: &Order| o.amount_cents > 0).name("paid").sink(all.clone()).name("all");
    println!("{job}");
    println!("{}", job.plan()?);
    job.run_blocking()?;
    assert_eq!(all.values().len(), 3);
    Ok(())
}
// ANCHOR_END: union

// ANCHOR: fan_out
fn fan_out() -> weibo::Result<()> {
    let (paid, refunds) = (CollectSink::new(), CollectSink::new());
    let job = Job::new("split");
    let orders = job.source(IterSource::new((0..14).map(order))).name("orders");
    orders.filter(|o: &Order| o.amount_cents >= 0).sink(paid.clone()).name("paid");
    orders.filter(|o: &Order| o.amount_cents < 0).sink(refunds.clone()).name("refunds");
    let plan = job.plan()?;
    println!("{plan}");
    assert_eq!(
        plan,
        "plan of job `split`: 1 chain, 1 task\n  chain `orders` x1: orders -> {filter -> paid, filter-2 -> refunds}\n"
    );
    job.run_blocking()?;
    assert_eq!((paid.values().len(), refunds.values().len()), (12, 2));
    Ok(())
}
// ANCHOR_END: fan_out

/// Stands for a synchronous call to a service: a lookup that takes a
/// millisecond.
fn lookup_country(customer: CustomerId) -> &'static str {
    std::thread::sleep(std::time::Duration::from_millis(1));
    if customer.0.is_multiple_of(2) { "NL" } else { "DE" }
}

// ANCHOR: blocking
fn blocking() -> weibo::Result<()> {
    let out = CollectSink::new();
    let job = Job::new("enrich");
    job.source(IterSource::new((0..20).map(order)))
        // The lookup blocks its thread: `weibo::blocking` lets the runtime
        // move the job's other tasks (and its checkpoint timer) to another
        // worker thread meanwhile.
        .map(|o: Order| (o.customer, weibo::blocking(|| lookup_country(o.customer))))
        .sink(out.clone());
    job.run_blocking()?;
    assert_eq!(out.values().len(), 20);
    Ok(())
}
// ANCHOR_END: blocking
