//! The book's upgrade walkthrough ("Savepoints and upgrades"): version 1
//! of a pipeline runs and takes a savepoint; version 2 changes the
//! pipeline around its state and the state's type, is refused without a
//! migration, and restores through one; its totals are those of a run of
//! version 2 that was never stopped.
//!
//! ```sh
//! cargo run -p weibo-examples --example book_upgrade                 # every step, checked
//! cargo run -p weibo-examples --example book_upgrade -- v1 /tmp/weibo-up
//! cargo run -p weibo-examples --example book_upgrade -- v2 /tmp/weibo-up --without-migration
//! cargo run -p weibo-examples --example book_upgrade -- v2 /tmp/weibo-up
//! cargo run -p weibo-examples --example book_upgrade -- v3 /tmp/weibo-up
//! ```
//!
//! Between the steps, `weibo savepoint inspect <dir>` shows what the
//! savepoint holds.

// ANCHOR: imports
use std::collections::BTreeMap;
use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use weibo::prelude::*;
use weibo_examples::{CustomerId, Order, Totals, order};
// ANCHOR_END: imports

const ORDERS: u64 = 20_000;

// ANCHOR: v1
/// Version 1: running totals per customer, in the type `Totals { customer,
/// orders, cents }`. The source has a name and the reduce an id: what the
/// savepoint files the source's positions and the reduce's state under.
fn version_1(dir: &Path, orders: Generator<Order>, out: &CollectSink<Totals>) -> Job {
    let job = Job::new("orders-per-customer").with_checkpoints(dir.join("checkpoints"), Duration::from_secs(10));
    job.source(orders)
        .name("orders")
        .filter(|o: &Order| o.amount_cents > 0)
        .map(|o: Order| Totals { customer: o.customer, orders: 1, cents: o.amount_cents })
        .key_by(|t: &Totals| t.customer)
        .with_partitions(2)
        .reduce(|a, b| Totals { customer: a.customer, orders: a.orders + b.orders, cents: a.cents + b.cents })
        .uid("totals")
        .sink(out.clone());
    job
}
// ANCHOR_END: v1

// ANCHOR: v2-types
/// The currency of an amount: version 2 keeps it with the totals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Currency {
    /// Euros (every order of version 1 was in euros).
    Eur,
    /// US dollars.
    Usd,
}

/// Version 2's totals: a field more. Version 1's `Totals` stays in the
/// code for as long as savepoints of it are to be restored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TotalsV2 {
    /// Whose totals.
    pub customer: CustomerId,
    /// Orders counted.
    pub orders: u64,
    /// Sum of their amounts, in cents of `currency`.
    pub cents: i64,
    /// The currency of `cents`.
    pub currency: Currency,
}
// ANCHOR_END: v2-types

// ANCHOR: v2
/// Version 2: the map comes first and the filter after it (stateless
/// operators change freely), the reduce has a name for the plan and logs
/// (its id is kept), it runs on 3 workers, and its state is a `TotalsV2`.
fn version_2(dir: &Path, orders: Generator<Order>, out: &CollectSink<TotalsV2>) -> Job {
    let job = Job::new("orders-per-customer").with_checkpoints(dir.join("checkpoints"), Duration::from_secs(10));
    job.source(orders)
        .name("orders")
        .map(|o: Order| TotalsV2 { customer: o.customer, orders: 1, cents: o.amount_cents, currency: Currency::Eur })
        .filter(|t: &TotalsV2| t.cents > 0)
        .key_by(|t: &TotalsV2| t.customer)
        .with_partitions(3)
        .reduce(|a, b| TotalsV2 { orders: a.orders + b.orders, cents: a.cents + b.cents, ..a })
        .uid("totals")
        .name("totals per customer")
        .sink(out.clone());
    job
}

/// How version 1's totals become version 2's: every entry of the
/// savepoint goes through it once, on restore.
fn migrate(old: Totals) -> TotalsV2 {
    TotalsV2 { customer: old.customer, orders: old.orders, cents: old.cents, currency: Currency::Eur }
}
// ANCHOR_END: v2

// ANCHOR: v3
/// Version 3 keeps amounts in tenths of a cent: the layout of `TotalsV2`
/// is the same, its meaning is not, so the reduce's state version goes
/// to 2 and the restore of a version-2 savepoint needs the operator's
/// migration (without it, it is refused).
fn version_3(dir: &Path, orders: Generator<Order>, out: &CollectSink<TotalsV2>) -> Job {
    let job = Job::new("orders-per-customer").with_checkpoints(dir.join("checkpoints"), Duration::from_secs(10));
    job.source(orders)
        .name("orders")
        .map(|o: Order| TotalsV2 {
            customer: o.customer,
            orders: 1,
            cents: o.amount_cents * 10,
            currency: Currency::Eur,
        })
        .filter(|t: &TotalsV2| t.cents > 0)
        .key_by(|t: &TotalsV2| t.customer)
        .with_partitions(3)
        .reduce(|a, b| TotalsV2 { orders: a.orders + b.orders, cents: a.cents + b.cents, ..a })
        .uid("totals")
        .name("totals per customer")
        .state_version(2)
        .sink(out.clone());
    job
}

/// Restores version 3 from `checkpoint` (version 2's), with the
/// operator's migration or without.
async fn run_v3(checkpoint: &Path, dir: &Path, with_migration: bool) -> weibo::Result<weibo::JobReport> {
    let mut job = version_3(dir, Generator::new(ORDERS, order), &CollectSink::new()).restore_from(checkpoint);
    if with_migration {
        job = job.with_state_migration_for("totals", |t: TotalsV2| TotalsV2 { cents: t.cents * 10, ..t });
    }
    let report = job.run().await?;
    for m in &report.migrated {
        println!("version 3: migrated {} entries of `{}`/{}", m.entries, m.operator, m.state);
    }
    Ok(report)
}
// ANCHOR_END: v3

/// Runs version 1 over a slow generator, takes savepoint `v1` after a
/// second, and stops. Returns its path.
async fn take_v1(dir: &Path) -> Result<PathBuf, Box<dyn Error>> {
    // ANCHOR: take
    let out = CollectSink::new();
    let handle = version_1(dir, Generator::new(ORDERS, order).with_rate(5_000.0), &out).spawn()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let savepoint = handle.savepoint("v1").await?;
    handle.abort();
    println!("version 1: savepoint `v1` taken: {}", savepoint.display());
    // ANCHOR_END: take
    Ok(savepoint)
}

/// Version 2 restored from savepoint `v1`, with the migration or without.
/// Returns its final totals and how many orders it read.
async fn run_v2(dir: &Path, with_migration: bool) -> Result<(BTreeMap<CustomerId, TotalsV2>, u64), Box<dyn Error>> {
    // ANCHOR: restore
    let savepoint = dir.join("checkpoints/savepoints/v1");
    let out = CollectSink::new();
    let mut job = version_2(dir, Generator::new(ORDERS, order), &out).restore_from(&savepoint);
    if with_migration {
        job = job.with_state_migration(migrate);
    }
    let report = job.run().await?;
    for m in &report.migrated {
        println!("version 2: migrated {} entries of `{}`/{}", m.entries, m.operator, m.state);
    }
    // ANCHOR_END: restore
    let read = report.metrics.operator("orders").map_or(0, |m| m.records_out);
    Ok((finals(out.values()), read))
}

/// The last totals per customer.
fn finals(out: Vec<TotalsV2>) -> BTreeMap<CustomerId, TotalsV2> {
    let mut last: BTreeMap<CustomerId, TotalsV2> = BTreeMap::new();
    for t in out {
        if last.get(&t.customer).is_none_or(|l| l.orders < t.orders) {
            last.insert(t.customer, t);
        }
    }
    last
}

/// What version 2 computes alone, over every order: what version 1 and
/// then version 2 computed across the upgrade must equal it.
async fn uninterrupted_v2(dir: &Path) -> Result<BTreeMap<CustomerId, TotalsV2>, Box<dyn Error>> {
    let out = CollectSink::new();
    version_2(&dir.join("uninterrupted"), Generator::new(ORDERS, order), &out).run().await?;
    Ok(finals(out.values()))
}

/// The newest complete checkpoint under `dir`'s checkpoints.
fn newest_checkpoint(dir: &Path) -> Result<PathBuf, Box<dyn Error>> {
    let newest_first = weibo::checkpoint::complete_checkpoints(&dir.join("checkpoints"));
    Ok(newest_first.into_iter().next().ok_or("no complete checkpoint")?.1)
}

/// Every step, checked: what `cargo run --example book_upgrade` does.
async fn everything() -> Result<(), Box<dyn Error>> {
    let dir = std::env::temp_dir().join(format!("weibo-book-upgrade-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let savepoint = take_v1(&dir).await?;
    let (inspection, _) = weibo::checkpoint::inspect::Inspection::open(&savepoint)?;
    print!("{inspection}");
    let text = inspection.to_string();
    assert!(text.contains("schema Totals { customer: CustomerId, orders: u64, cents: i64 }"), "{text}");

    let refused = run_v2(&dir, false).await.err().ok_or("version 2 restored without a migration")?;
    println!("{refused}");
    assert!(refused.to_string().contains("`Totals` has a new field `currency` (Currency)"), "{refused}");

    let (totals, read) = run_v2(&dir, true).await?;
    let expected = uninterrupted_v2(&dir).await?;
    assert_eq!(totals, expected, "version 2 restored from version 1's savepoint computes what it computes alone");
    assert!(read < ORDERS, "version 2 resumed where version 1 stopped");
    for t in totals.values() {
        println!("{t:?}");
    }
    println!("version 2 read the remaining {read} of {ORDERS} orders; its totals are those of an uninterrupted run");
    let (after, _) = weibo::checkpoint::inspect::Inspection::open(&newest_checkpoint(&dir)?)?;
    let after = after.to_string();
    print!("{after}");
    assert!(after.contains("currency: Currency"), "{after}");

    // Version 3: the state's meaning changes, not its layout.
    let v2_checkpoint = newest_checkpoint(&dir)?;
    let refused =
        run_v3(&v2_checkpoint, &dir.join("v3"), false).await.err().ok_or("version 3 restored without a migration")?;
    println!("{refused}");
    assert!(refused.to_string().contains("is of version 1 in the checkpoint and the job reads version 2"), "{refused}");
    let report = run_v3(&v2_checkpoint, &dir.join("v3"), true).await?;
    assert_eq!(report.migrated.first().map(|m| m.entries), Some(5), "{:?}", report.migrated);
    // Its checkpoint holds the totals in tenths of a cent, at version 2.
    let v3_checkpoint = newest_checkpoint(&dir.join("v3"))?;
    let reader = weibo::checkpoint::processor::SavepointReader::open(&v3_checkpoint)?;
    for (customer, v2) in &totals {
        let v3: Option<TotalsV2> = reader.get("totals", "value", customer)?;
        assert_eq!(v3.map(|t| t.cents), Some(v2.cents * 10), "{customer:?}");
    }
    let (inspection, _) = weibo::checkpoint::inspect::Inspection::open(&v3_checkpoint)?;
    assert!(inspection.to_string().contains("keyed by weibo_examples::CustomerId, state version 2"), "{inspection}");
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[tokio::main]
async fn main() {
    if let Err(e) = run(std::env::args().skip(1).collect()).await {
        eprintln!("book_upgrade: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Vec<String>) -> Result<(), Box<dyn Error>> {
    let usage = "usage: book_upgrade [v1 <dir> | v2 <dir> [--without-migration] | v3 <dir> [--without-migration]]";
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [] => everything().await,
        ["v1", dir] => take_v1(Path::new(dir)).await.map(|_| ()),
        [step @ ("v2" | "v3"), dir, rest @ ..] => {
            let with_migration = match rest {
                [] => true,
                ["--without-migration"] => false,
                _ => return Err(usage.into()),
            };
            let dir = Path::new(dir);
            if *step == "v3" {
                // Version 2's newest checkpoint, before version 3 writes its own.
                let v2 = newest_checkpoint(dir)?;
                println!("version 3: restoring {}", v2.display());
                run_v3(&v2, dir, with_migration).await?;
                println!("its newest checkpoint: {}", newest_checkpoint(dir)?.display());
                return Ok(());
            }
            let (totals, read) = run_v2(dir, with_migration).await?;
            for t in totals.values() {
                println!("{t:?}");
            }
            println!("version 2 read the remaining {read} of {ORDERS} orders");
            println!("its newest checkpoint: {}", newest_checkpoint(dir)?.display());
            Ok(())
        }
        _ => Err(usage.into()),
    }
}
