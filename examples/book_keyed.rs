//! The book's "Keyed streams" chapter: reduce, fold, aggregate, process with
//! per-key state, and keyed sinks, each checked against the same computation
//! done without Weibo.
//!
//! Run it with `cargo run -p weibo-examples --example book_keyed`.

// ANCHOR: imports
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use weibo::prelude::*;
use weibo_examples::{CustomerId, Order, Totals, order};
// ANCHOR_END: imports

fn main() -> weibo::Result<()> {
    reduce()?;
    fold()?;
    aggregate()?;
    aggregate_with()?;
    process()?;
    named_state()?;
    expiring_state()?;
    side_outputs()?;
    connected()?;
    connected_unkeyed()?;
    broadcast()?;
    broadcast_unkeyed()?;
    enrichment()?;
    keyed_sink()?;
    Ok(())
}

// ANCHOR: oracle
/// Orders and summed cents per customer, computed with a plain loop.
fn expected_totals(orders: impl Iterator<Item = Order>) -> BTreeMap<CustomerId, (u64, i64)> {
    let mut expected = BTreeMap::new();
    for o in orders {
        let e: &mut (u64, i64) = expected.entry(o.customer).or_default();
        e.0 += 1;
        e.1 += o.amount_cents;
    }
    expected
}
// ANCHOR_END: oracle

// ANCHOR: reduce
fn reduce() -> weibo::Result<()> {
    let totals = CollectSink::new();
    let job = Job::new("totals");
    job.source(Generator::new(1_000, order))
        .map(|o: Order| Totals { customer: o.customer, orders: 1, cents: o.amount_cents })
        .key_by(|t: &Totals| t.customer)
        .with_partitions(4)
        .reduce(|a, b| Totals { customer: a.customer, orders: a.orders + b.orders, cents: a.cents + b.cents })
        .sink(totals.clone());
    job.run_blocking()?;

    // `reduce` emits the key's new value after every record: 1000 outputs.
    // Records of one key stay in order, so the last output per key is its total.
    let outputs = totals.values();
    assert_eq!(outputs.len(), 1_000);
    let last: BTreeMap<CustomerId, (u64, i64)> =
        outputs.into_iter().map(|t| (t.customer, (t.orders, t.cents))).collect();
    assert_eq!(last, expected_totals((0..1_000).map(order)));
    Ok(())
}
// ANCHOR_END: reduce

// ANCHOR: fold
fn fold() -> weibo::Result<()> {
    let counts = CollectSink::new();
    let job = Job::new("order-counts");
    job.source(IterSource::new((0..100).map(order)))
        .key_by(|o: &Order| o.customer)
        .fold(|| 0u64, |count: &mut u64, _order: Order| *count += 1)
        .sink(counts.clone());
    job.run_blocking()?;

    // `fold` emits `(key, accumulator)` after every record.
    let last: BTreeMap<CustomerId, u64> = counts.values().into_iter().collect();
    let expected: BTreeMap<CustomerId, u64> =
        expected_totals((0..100).map(order)).into_iter().map(|(c, (n, _))| (c, n)).collect();
    assert_eq!(last, expected);
    Ok(())
}
// ANCHOR_END: fold

// ANCHOR: aggregate_impl
/// What `aggregate` emits per customer.
#[derive(Clone, Debug, PartialEq)]
struct Summary {
    orders: u64,
    mean_cents: i64,
    largest_cents: i64,
}

/// Count, sum and largest amount of a customer's orders.
struct OrderStats;

impl Aggregate<Order> for OrderStats {
    type Acc = (u64, i64, i64); // kept in state, so it needs a codec
    type Out = Summary;

    fn create(&self) -> Self::Acc {
        (0, 0, i64::MIN)
    }

    fn add(&self, acc: &mut Self::Acc, order: Order) {
        acc.0 += 1;
        acc.1 += order.amount_cents;
        acc.2 = acc.2.max(order.amount_cents);
    }

    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        acc.0 += other.0;
        acc.1 += other.1;
        acc.2 = acc.2.max(other.2);
    }

    fn result(&self, acc: &Self::Acc) -> Summary {
        Summary { orders: acc.0, mean_cents: acc.1 / acc.0.max(1) as i64, largest_cents: acc.2 }
    }
}
// ANCHOR_END: aggregate_impl

// ANCHOR: aggregate
fn aggregate() -> weibo::Result<()> {
    let summaries = CollectSink::new();
    let job = Job::new("order-stats");
    job.source(IterSource::new((0..100).map(order)))
        .key_by(|o: &Order| o.customer)
        .with_partitions(2)
        .aggregate(OrderStats)
        .sink(summaries.clone());
    job.run_blocking()?;

    // `aggregate` emits `(key, result)` after every record.
    let last: BTreeMap<CustomerId, Summary> = summaries.values().into_iter().collect();
    for (customer, (orders, cents)) in expected_totals((0..100).map(order)) {
        let largest = (0..100).map(order).filter(|o| o.customer == customer).map(|o| o.amount_cents).max();
        let expected = Summary { orders, mean_cents: cents / orders as i64, largest_cents: largest.unwrap_or(0) };
        assert_eq!(last.get(&customer), Some(&expected));
    }
    Ok(())
}
// ANCHOR_END: aggregate

// ANCHOR: aggregate_with
fn aggregate_with() -> weibo::Result<()> {
    let lines = CollectSink::new();
    let job = Job::new("order-lines");
    job.source(IterSource::new((0..100).map(order)))
        .key_by(|o: &Order| o.customer)
        .aggregate_with(OrderStats, |customer: CustomerId, s: Summary| format!("{customer:?}: {} orders", s.orders))
        .sink(lines.clone());
    job.run_blocking()?;

    // One line per record, the key put into it by the operator itself.
    let lines = lines.values();
    assert_eq!(lines.len(), 100);
    for (customer, (orders, _)) in expected_totals((0..100).map(order)) {
        assert!(lines.contains(&format!("{customer:?}: {orders} orders")), "{lines:?}");
    }
    Ok(())
}
// ANCHOR_END: aggregate_with

// ANCHOR: process_types
/// Per-customer state: kept by Weibo, one value per key.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Spend {
    cents: i64,
    alerted: bool,
}

/// What the pipeline emits.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Alert {
    customer: CustomerId,
    cents: i64,
    at: Option<i64>,
}

const LIMIT: i64 = 100_000;
// ANCHOR_END: process_types

fn process() -> weibo::Result<()> {
    let mut got = alerts()?;
    got.sort();
    for alert in &got {
        println!("{alert:?}");
    }

    // The same alerts, computed with a plain loop.
    let mut spent: BTreeMap<CustomerId, (i64, bool)> = BTreeMap::new();
    let mut expected = Vec::new();
    for i in 0..200u64 {
        let o = order(i);
        let (cents, alerted) = spent.entry(o.customer).or_default();
        *cents += o.amount_cents;
        if *cents > LIMIT && !*alerted {
            *alerted = true;
            let at = Some(1_700_000_000_000 + i as i64 * 1_000);
            expected.push(Alert { customer: o.customer, cents: *cents, at });
        }
    }
    expected.sort();
    assert_eq!(got, expected);
    Ok(())
}

// ANCHOR: process
fn alerts() -> weibo::Result<Vec<Alert>> {
    let alerts = CollectSink::new();
    let job = Job::new("big-spenders");
    job.source(Generator::new(200, order).with_timestamps(|i| 1_700_000_000_000 + i as i64 * 1_000))
        .key_by(|o: &Order| o.customer)
        .with_partitions(2)
        .process(on_error::Fail, |ctx, o| {
            let (customer, at) = (*ctx.key(), ctx.timestamp());
            let spend: &mut Spend = ctx.state().get_or_insert_with(Spend::default);
            spend.cents += o.amount_cents;
            if spend.cents > LIMIT && !spend.alerted {
                spend.alerted = true;
                let cents = spend.cents;
                ctx.emit(Alert { customer, cents, at });
            }
        })
        .name("alert-once")
        .sink(alerts.clone());
    job.run_blocking()?;
    Ok(alerts.values())
}
// ANCHOR_END: process

// ANCHOR: named_state
/// What the pipeline emits per order: the customer's count, its last three
/// amounts, and how many of its orders fell in each band of 1000 cents.
#[derive(Clone, Debug, PartialEq)]
struct Profile {
    customer: CustomerId,
    orders: u64,
    recent: Vec<i64>,
    bands: Vec<(i64, u32)>,
}

fn named_state() -> weibo::Result<()> {
    let profiles = CollectSink::new();
    let job = Job::new("profiles");
    job.source(IterSource::new((0..100).map(order)))
        .key_by(|o: &Order| o.customer)
        .process_with_state(
            on_error::Fail,
            // Declared once, when the job is wired; each is its own state.
            |states| (states.value::<u64>("orders"), states.list::<i64>("recent"), states.map::<i64, u32>("bands")),
            |ctx, (orders, recent, bands), o| {
                let n = ctx.value(orders).get().unwrap_or(0) + 1;
                ctx.value(orders).set(n);
                // Appending reads nothing; trimming rewrites the list.
                ctx.list(recent).add(o.amount_cents);
                let mut last = ctx.list(recent).get();
                if last.len() > 3 {
                    last.remove(0);
                    ctx.list(recent).update(last.clone());
                }
                // One map entry per band, read and written on its own.
                ctx.map(bands).update(o.amount_cents.div_euclid(1_000), |c| *c = Some(c.unwrap_or(0) + 1));
                let profile =
                    Profile { customer: *ctx.key(), orders: n, recent: last, bands: ctx.map(bands).entries() };
                ctx.emit(profile);
            },
        )
        .sink(profiles.clone());
    job.run_blocking()?;

    // The last profile per customer, against a plain loop.
    let last: BTreeMap<CustomerId, Profile> = profiles.values().into_iter().map(|p| (p.customer, p)).collect();
    for (customer, profile) in last {
        let amounts: Vec<i64> =
            (0..100).map(order).filter(|o| o.customer == customer).map(|o| o.amount_cents).collect();
        let mut bands: BTreeMap<i64, u32> = BTreeMap::new();
        for a in &amounts {
            *bands.entry(a.div_euclid(1_000)).or_default() += 1;
        }
        assert_eq!(profile.orders, amounts.len() as u64);
        assert_eq!(profile.recent, amounts.iter().rev().take(3).rev().copied().collect::<Vec<_>>());
        assert_eq!(profile.bands, bands.into_iter().collect::<Vec<_>>());
    }
    Ok(())
}
// ANCHOR_END: named_state

// ANCHOR: expiring_state
/// Passes each (customer, amount) pair once an hour at most: the amounts
/// seen are remembered for an hour after they were written.
fn expiring_state() -> weibo::Result<()> {
    use std::time::Duration;
    use weibo::process::StateTtl;
    let mut h = weibo::testing::Harness::<Order>::new("dedup");
    let firsts = h.input().key_by(|o: &Order| o.customer).process_with_state(
        on_error::Fail,
        |states| states.ttl(StateTtl::after_write(Duration::from_secs(3_600))).map::<i64, ()>("seen"),
        |ctx, seen, o| {
            if !ctx.map(seen).contains(&o.amount_cents) {
                ctx.map(seen).put(o.amount_cents, ());
                ctx.emit(o.clone());
            }
        },
    );
    let probe = h.output(&firsts);
    let mut run = h.start()?;
    let o = Order { customer: CustomerId(1), amount_cents: 500 };
    run.push(o.clone(), 1)?;
    run.push(o.clone(), 2)?;
    run.watermark(2)?;
    assert_eq!(probe.take(), std::slice::from_ref(&o), "the repeat within the hour is dropped");
    run.set_processing_time(3_600_000)?; // the harness's clock: an hour later
    run.push(o.clone(), 3)?;
    run.watermark(3)?;
    assert_eq!(probe.take(), [o], "forgotten after an hour");
    run.finish()?;
    Ok(())
}
// ANCHOR_END: expiring_state

// ANCHOR: side_outputs
/// Refunds go to a side output of their own type; orders go on.
fn side_outputs() -> weibo::Result<()> {
    use weibo::process::OutputTag;
    let mut t = weibo::testing::TestJob::new("refunds");
    let refunds = OutputTag::<(CustomerId, i64)>::new("refunds");
    let orders = t.input((0..100).map(order).collect()).key_by(|o: &Order| o.customer).process_with_state(
        on_error::Fail,
        |states| states.side_output(&refunds),
        |ctx, refunds, o| {
            if o.amount_cents < 0 {
                let customer = *ctx.key();
                ctx.output(refunds, (customer, -o.amount_cents));
            } else {
                ctx.emit(o.clone());
            }
        },
    );
    let refunded = orders.side_output(&refunds);
    let (orders, refunded) = (t.collect(&orders), t.collect(&refunded));
    t.run()?;
    let refunds = (0..100).map(order).filter(|o| o.amount_cents < 0).count();
    assert_eq!(refunded.values().len(), refunds);
    assert_eq!(orders.values().len(), 100 - refunds);
    Ok(())
}
// ANCHOR_END: side_outputs

// ANCHOR: enrichment
/// A customer's record in another service, looked up by id.
#[derive(Clone, Debug, PartialEq)]
struct Customer {
    id: u32,
    tier: &'static str,
}

/// The other service: an asynchronous lookup that takes a few
/// milliseconds (an HTTP or database client in a real pipeline).
async fn look_up(id: CustomerId) -> Result<Customer, String> {
    tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    match id.0 {
        0 => Err("customer 0 is not in the directory".to_string()),
        id => Ok(Customer { id, tier: if id % 2 == 0 { "gold" } else { "basic" } }),
    }
}

/// Orders with their customer's tier, 16 lookups in flight, each tried
/// three times, each result kept a minute; an order whose customer cannot
/// be found goes to the dead letters.
fn enrichment() -> weibo::Result<()> {
    let mut t = weibo::testing::TestJob::new("tiers");
    let orders = t.input((0..50).map(|i| Order { customer: CustomerId(i % 5), amount_cents: 100 }).collect());
    let options = weibo::AsyncOptions::new()
        .in_flight(16)
        .timeout(std::time::Duration::from_secs(1))
        .retries(2, std::time::Duration::from_millis(10))
        .cache(std::time::Duration::from_secs(60), 10_000);
    let (tiers, dead) = orders.key_by(|o: &Order| o.customer).map_async(
        weibo::on_error::DeadLetter,
        options,
        |customer: &CustomerId, order: &Order| {
            let (customer, cents) = (*customer, order.amount_cents);
            async move { look_up(customer).await.map(|c| (c.id, c.tier, cents)) }
        },
    );
    let (tiers, dead) = (t.collect(&tiers), t.collect(&dead));
    t.run()?;
    assert_eq!(tiers.values().len(), 40);
    assert_eq!(dead.values().len(), 10, "the ten orders of customer 0");
    assert!(tiers.values().iter().all(|(id, tier, _)| (*tier == "gold") == (id % 2 == 0)));
    Ok(())
}
// ANCHOR_END: enrichment

// ANCHOR: broadcast
/// A limit on one order's amount, by currency, sent to every instance.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Limit {
    currency: String,
    max_cents: i64,
}

/// Orders over their currency's limit are held for review; the limits
/// come as a stream of their own and can change at any time.
fn broadcast() -> weibo::Result<()> {
    let mut h = weibo::testing::Harness::<Either<Order, Limit>>::new("review");
    let input = h.input();
    let orders = input.flat_map(|e: Either<Order, Limit>| match e {
        Either::Left(order) => vec![order],
        Either::Right(_) => vec![],
    });
    let limits = input.flat_map(|e: Either<Order, Limit>| match e {
        Either::Left(_) => vec![],
        Either::Right(limit) => vec![limit],
    });
    let held = orders.key_by(|o: &Order| o.customer).connect_broadcast(&limits).with_partitions(4).process_with_state(
        weibo::on_error::Fail,
        |states| states.broadcast::<String, i64>("limits"),
        |ctx, limits, order: &Order| {
            // Every order is in euros here.
            if ctx.broadcast(limits).get(&"EUR".to_string()).is_some_and(|max| order.amount_cents > max) {
                ctx.emit(order.clone());
            }
        },
        |ctx, limits, limit: &Limit| ctx.broadcast(limits).put(limit.currency.clone(), limit.max_cents),
    );
    let held = h.output(&held);
    let mut run = h.start()?;
    // The harness sends each record on at the next watermark: one after
    // each record orders them (two inputs' records are otherwise not).
    let mut at = 0;
    let mut send = |run: &mut weibo::testing::RunningHarness<_>, record| -> weibo::Result<()> {
        at += 1;
        run.push(record, at)?;
        run.watermark(at)
    };
    send(&mut run, Either::Right(Limit { currency: "EUR".into(), max_cents: 10_000 }))?;
    for (customer, amount_cents) in [(1, 2_500), (2, 12_000), (3, 9_000)] {
        send(&mut run, Either::Left(Order { customer: CustomerId(customer), amount_cents }))?;
    }
    send(&mut run, Either::Right(Limit { currency: "EUR".into(), max_cents: 5_000 }))?;
    send(&mut run, Either::Left(Order { customer: CustomerId(3), amount_cents: 9_000 }))?;
    run.finish()?;
    let held: Vec<(u32, i64)> = held.take().iter().map(|o| (o.customer.0, o.amount_cents)).collect();
    assert_eq!(held, [(2, 12_000), (3, 9_000)], "the second 9 000 came after the limit fell to 5 000");
    Ok(())
}
// ANCHOR_END: broadcast

// ANCHOR: broadcast_unkeyed
/// The same review without a key: orders spread over three instances,
/// each with its copy of the limits.
fn broadcast_unkeyed() -> weibo::Result<()> {
    let mut t = weibo::testing::TestJob::new("review");
    let limits = t.input(vec![Limit { currency: "EUR".into(), max_cents: 10_000 }]);
    let orders = t.input((0..1_000).map(order).collect());
    let checked = orders.connect_broadcast(&limits).with_partitions(3).process_with_state(
        on_error::Fail,
        |states| states.broadcast::<String, i64>("limits"),
        |ctx, limits, order: &Order| {
            let max = ctx.broadcast(limits).get(&"EUR".to_string());
            // `None`: the limits had not reached this instance yet.
            ctx.emit((order.amount_cents, max));
        },
        |ctx, limits, limit: &Limit| ctx.broadcast(limits).put(limit.currency.clone(), limit.max_cents),
    );
    let checked = t.collect(&checked);
    t.run()?;
    let checked = checked.values();
    assert_eq!(checked.len(), 1_000, "each order, once, on one of the instances");
    assert!(checked.iter().all(|(_, max)| max.is_none() || *max == Some(10_000)));
    Ok(())
}
// ANCHOR_END: broadcast_unkeyed

// ANCHOR: connected
/// Orders wait for their customer's name; a name releases the orders
/// waiting for it and is remembered for later ones.
fn connected() -> weibo::Result<()> {
    let mut t = weibo::testing::TestJob::new("enrich");
    let orders = t.input((0..100).map(order).collect()).key_by(|o: &Order| o.customer);
    let names = t
        .input((1..=5).map(|c| (CustomerId(c), format!("customer {c}"))).collect())
        .key_by(|c: &(CustomerId, String)| c.0);
    let named = orders.connect(&names).with_partitions(2).process_with_state(
        on_error::Fail,
        |states| (states.value::<String>("name"), states.list::<Order>("waiting")),
        |ctx, (name, waiting), o| match ctx.value(name).get() {
            Some(name) => ctx.emit((name, o.amount_cents)),
            None => ctx.list(waiting).add(o.clone()),
        },
        |ctx, (name, waiting), customer| {
            ctx.value(name).set(customer.1.clone());
            for o in ctx.list(waiting).get() {
                ctx.emit((customer.1.clone(), o.amount_cents));
            }
            ctx.list(waiting).clear();
        },
    );
    let named = t.collect(&named);
    t.run()?;
    let mut got = named.values();
    got.sort();
    let mut want: Vec<(String, i64)> =
        (0..100).map(order).map(|o| (format!("customer {}", o.customer.0), o.amount_cents)).collect();
    want.sort();
    assert_eq!(got, want, "every order, named, once");
    Ok(())
}
// ANCHOR_END: connected

// ANCHOR: connected_unkeyed
/// Amounts from two feeds, one in cents, one in euros as text: one stream
/// of cents, and the text that does not parse in the dead letters.
fn connected_unkeyed() -> weibo::Result<()> {
    let mut t = weibo::testing::TestJob::new("amounts");
    let cents = t.input(vec![250i64, 1_999]);
    let euros = t.input(vec!["3.50".to_string(), "three".to_string()]);
    let (amounts, dead) = cents.connect(&euros).process(
        on_error::DeadLetter,
        |c: &i64| Ok(*c),
        |e: &String| e.parse::<f64>().map(|e| (e * 100.0).round() as i64).map_err(|err| format!("`{e}`: {err}")),
    );
    let (amounts, dead) = (t.collect(&amounts), t.collect(&dead));
    t.run()?;
    let mut got = amounts.values();
    got.sort();
    assert_eq!(got, [250, 350, 1_999]);
    let dead: Vec<Either<i64, String>> = dead.values().into_iter().map(|d| d.record).collect();
    assert_eq!(dead, [Either::Right("three".to_string())]);
    Ok(())
}
// ANCHOR_END: connected_unkeyed

// ANCHOR: keyed_sink
fn keyed_sink() -> weibo::Result<()> {
    let by_customer = CollectSink::new();
    let job = Job::new("partitioned-output");
    job.source(IterSource::new((0..10).map(order)))
        .key_by(|o: &Order| o.customer)
        .with_partitions(2)
        .sink(by_customer.clone());
    println!("{}", job.plan()?);
    job.run_blocking()?;
    assert_eq!(by_customer.values().len(), 10);
    Ok(())
}
// ANCHOR_END: keyed_sink
