//! The book's "Savepoints and upgrades" and "Rescaling" chapters: a
//! savepoint taken from a running job, restored with another partition
//! count and into a changed pipeline, what a savepoint refuses to restore
//! into, and how key groups move between workers.
//!
//! Run it with `cargo run -p weibo-examples --example book_savepoints`.

// ANCHOR: imports
use std::collections::BTreeMap;
use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Duration;

use weibo::prelude::*;
use weibo_examples::{CustomerId, Order, Totals, order};
// ANCHOR_END: imports

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let dir = std::env::temp_dir().join(format!("weibo-book-savepoints-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let savepoint = take(&dir).await?;
    restore(&dir, &savepoint).await?;
    upgraded(&dir, &savepoint).await?;
    migrated(&dir, &savepoint).await?;
    processor(&dir, &savepoint).await?;
    refused(&dir, &savepoint).await?;
    key_groups(&dir, &savepoint).await?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

const ORDERS: u64 = 6_000;

// ANCHOR: pipeline
/// Running totals per customer, on `partitions` workers, checkpointed into
/// `checkpoints`.
fn pipeline(checkpoints: &Path, orders: Generator<Order>, partitions: usize, out: &CollectSink<Totals>) -> Job {
    let job = Job::new("orders-per-customer").with_checkpoints(checkpoints, Duration::from_secs(10));
    job.source(orders)
        .name("orders")
        .filter(|o: &Order| o.amount_cents > 0)
        .name("paid-only")
        .map(|o: Order| Totals { customer: o.customer, orders: 1, cents: o.amount_cents })
        .key_by(|t: &Totals| t.customer)
        .with_partitions(partitions)
        .reduce(|a, b| Totals { customer: a.customer, orders: a.orders + b.orders, cents: a.cents + b.cents })
        .name("totals")
        .sink(out.clone());
    job
}
// ANCHOR_END: pipeline

/// The last totals per customer.
fn finals(out: Vec<Totals>) -> BTreeMap<CustomerId, Totals> {
    let mut last: BTreeMap<CustomerId, Totals> = BTreeMap::new();
    for t in out {
        if last.get(&t.customer).is_none_or(|l| l.orders < t.orders) {
            last.insert(t.customer, t);
        }
    }
    last
}

/// The totals of a run over every order that is never stopped.
fn expected() -> BTreeMap<CustomerId, Totals> {
    let mut totals: BTreeMap<CustomerId, Totals> = BTreeMap::new();
    for o in (0..ORDERS).map(order).filter(|o| o.amount_cents > 0) {
        let t = totals.entry(o.customer).or_insert(Totals { customer: o.customer, orders: 0, cents: 0 });
        t.orders += 1;
        t.cents += o.amount_cents;
    }
    totals
}

// ANCHOR: take
async fn take(dir: &Path) -> Result<PathBuf, Box<dyn Error>> {
    // Version 1 of the job, on 2 workers, reading 3,000 orders a second.
    let out = CollectSink::new();
    let slow = Generator::new(ORDERS, order).with_rate(3_000.0);
    let handle = pipeline(&dir.join("checkpoints"), slow, 2, &out).spawn()?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A checkpoint taken now, copied to `<checkpoint dir>/savepoints/<name>`.
    let savepoint = handle.savepoint("before-rescale").await?;
    println!("savepoint `before-rescale` taken: {}", savepoint.display());
    assert_eq!(savepoint, dir.join("checkpoints").join("savepoints").join("before-rescale"));

    // A name is used once.
    let err = handle.savepoint("before-rescale").await.err().ok_or("a name is used once")?;
    assert!(err.to_string().contains("exists already"), "{err}");
    handle.abort(); // stop version 1
    Ok(savepoint)
}
// ANCHOR_END: take

// ANCHOR: restore
async fn restore(dir: &Path, savepoint: &Path) -> Result<(), Box<dyn Error>> {
    // Version 2: the same pipeline on 3 workers, with its own checkpoint
    // directory, started from the savepoint.
    let out = CollectSink::new();
    let job = pipeline(&dir.join("checkpoints-v2"), Generator::new(ORDERS, order), 3, &out);
    let report = job.restore_from(savepoint).run().await?;
    let read = report.metrics.operator("orders").map_or(0, |m| m.records_out);
    println!("version 2 resumed from the savepoint on 3 workers: read the remaining {read} of {ORDERS} orders");
    assert!(read < ORDERS);
    assert_eq!(finals(out.values()), expected(), "every order counted once, across the rescale");
    Ok(())
}
// ANCHOR_END: restore

// ANCHOR: upgraded
async fn upgraded(dir: &Path, savepoint: &Path) -> Result<(), Box<dyn Error>> {
    // Version 2: the filter is gone, a stateless `map` is new, and the
    // reduce has a new name but keeps its id, the name it had.
    let out = CollectSink::new();
    let job = Job::new("orders-per-customer").with_checkpoints(dir.join("checkpoints-v2b"), Duration::from_secs(10));
    job.source(Generator::new(ORDERS, order))
        .name("orders")
        .map(|o: Order| Order { amount_cents: o.amount_cents.max(0), ..o })
        .map(|o: Order| Totals { customer: o.customer, orders: u64::from(o.amount_cents > 0), cents: o.amount_cents })
        .key_by(|t: &Totals| t.customer)
        .reduce(|a, b| Totals { customer: a.customer, orders: a.orders + b.orders, cents: a.cents + b.cents })
        .uid("totals")
        .name("totals-per-customer")
        .sink(out.clone());
    job.restore_from(savepoint).run().await?;
    assert_eq!(finals(out.values()), expected(), "the restored totals went on");
    println!("version 2 (a filter removed, a map added, the reduce renamed) restored its totals");
    Ok(())
}
// ANCHOR_END: upgraded

// ANCHOR: migrated
/// Version 3's running totals: the largest order too.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct TotalsV3 {
    customer: CustomerId,
    orders: u64,
    cents: i64,
    largest: i64,
}

async fn migrated(dir: &Path, savepoint: &Path) -> Result<(), Box<dyn Error>> {
    let v3 = |checkpoints: &str| {
        let job = Job::new("orders-per-customer").with_checkpoints(dir.join(checkpoints), Duration::from_secs(10));
        let out = CollectSink::new();
        job.source(Generator::new(ORDERS, order))
            .name("orders")
            .filter(|o: &Order| o.amount_cents > 0)
            .map(|o: Order| TotalsV3 {
                customer: o.customer,
                orders: 1,
                cents: o.amount_cents,
                largest: o.amount_cents,
            })
            .key_by(|t: &TotalsV3| t.customer)
            .reduce(|a, b| TotalsV3 {
                customer: a.customer,
                orders: a.orders + b.orders,
                cents: a.cents + b.cents,
                largest: a.largest.max(b.largest),
            })
            .uid("totals")
            .sink(out.clone());
        (job, out)
    };
    // The state was written as `Totals`: without a migration, refused.
    let (job, _) = v3("checkpoints-v6");
    let err = job.restore_from(savepoint).run().await.err().ok_or("a changed state type is refused")?;
    println!("{err}");
    assert!(err.to_string().contains("has a new field `largest` (i64)"), "{err}");

    // With one, every entry is read as a `Totals` and migrated.
    let (job, out) = v3("checkpoints-v7");
    let job = job.restore_from(savepoint).with_state_migration(|old: Totals| TotalsV3 {
        customer: old.customer,
        orders: old.orders,
        cents: old.cents,
        largest: 0, // not known for the orders before the upgrade
    });
    let report = job.run().await?;
    for m in &report.migrated {
        println!("migrated {} entries of `{}`/{}", m.entries, m.operator, m.state);
    }
    let last = finals(
        out.values().into_iter().map(|t| Totals { customer: t.customer, orders: t.orders, cents: t.cents }).collect(),
    );
    assert_eq!(last, expected(), "the totals went on from the savepoint's");
    Ok(())
}
// ANCHOR_END: migrated

// ANCHOR: processor
async fn processor(dir: &Path, savepoint: &Path) -> Result<(), Box<dyn Error>> {
    use weibo::checkpoint::processor::{SavepointReader, SavepointWriter};
    // Read the totals as the job keeps them, with the job's own types.
    let reader = SavepointReader::open(savepoint)?;
    let totals: Vec<(CustomerId, Totals)> = reader.entries("totals", "value")?;
    println!("the savepoint holds the totals of {} customers", totals.len());

    // Write a new savepoint with customer 3's totals reset, say after a
    // bug counted some of its orders wrongly; everything else is copied.
    let mut writer = SavepointWriter::from(&reader);
    let fixed = totals
        .into_iter()
        .map(|(c, t)| if c == CustomerId(3) { (c, Totals { orders: 0, cents: 0, ..t }) } else { (c, t) });
    writer.set_state("totals", "value", fixed)?;
    let rewritten = writer.write(dir.join("fixed-savepoint"))?;
    let reader = SavepointReader::open(&rewritten)?;
    let three: Option<Totals> = reader.get("totals", "value", &CustomerId(3))?;
    println!("in the new savepoint: {three:?}");
    assert_eq!(three.map(|t| t.orders), Some(0));
    // A job restores it like any other savepoint.
    let out = CollectSink::new();
    pipeline(&dir.join("checkpoints-v8"), Generator::new(ORDERS, order), 2, &out)
        .restore_from(&rewritten)
        .run()
        .await?;
    Ok(())
}
// ANCHOR_END: processor

// ANCHOR: refused
async fn refused(dir: &Path, savepoint: &Path) -> Result<(), Box<dyn Error>> {
    // The reduce renamed without keeping its id: its state, filed under
    // `totals`, has no operator to go to.
    let v2 = |checkpoints: &str| {
        let job = Job::new("orders-per-customer").with_checkpoints(dir.join(checkpoints), Duration::from_secs(10));
        let totals = job
            .source(Generator::new(ORDERS, order))
            .name("orders")
            .map(|o: Order| Totals { customer: o.customer, orders: 1, cents: o.amount_cents })
            .key_by(|t: &Totals| t.customer)
            .reduce(|a, b| Totals { customer: a.customer, orders: a.orders + b.orders, cents: a.cents + b.cents })
            .name("totals-per-customer");
        totals.sink(CollectSink::new());
        job
    };
    let err = v2("checkpoints-v3").restore_from(savepoint).run().await.err().ok_or("unrestored state is refused")?;
    println!("{err}");
    assert!(err.to_string().contains("the state (value) of operator `totals`"), "{err}");
    // Allowed, the state is dropped (and logged): the totals start over.
    v2("checkpoints-v3b").restore_from(savepoint).allow_unrestored_state().run().await?;

    // The key type changed (the customer's number instead of its id).
    let job = Job::new("orders-per-customer").with_checkpoints(dir.join("checkpoints-v3c"), Duration::from_secs(10));
    job.source(Generator::new(ORDERS, order))
        .name("orders")
        .map(|o: Order| Totals { customer: o.customer, orders: 1, cents: o.amount_cents })
        .key_by(|t: &Totals| t.customer.0)
        .reduce(|a, b| Totals { customer: a.customer, orders: a.orders + b.orders, cents: a.cents + b.cents })
        .name("totals")
        .sink(CollectSink::new());
    let err = job.restore_from(savepoint).run().await.err().ok_or("a changed key type is refused")?;
    println!("{err}");
    assert!(err.to_string().contains("was keyed by"), "{err}");

    // The same pipeline with another number of key groups.
    let out = CollectSink::new();
    let job = pipeline(&dir.join("checkpoints-v4"), Generator::new(ORDERS, order), 2, &out).with_max_key_groups(256);
    let err = job.restore_from(savepoint).run().await.err().ok_or("other key groups must be refused")?;
    println!("{err}");
    assert!(err.to_string().contains("key groups cannot change"));
    Ok(())
}
// ANCHOR_END: refused

// ANCHOR: key_groups
async fn key_groups(dir: &Path, savepoint: &Path) -> Result<(), Box<dyn Error>> {
    // The savepoint was taken on 2 workers: one state file per worker.
    let before = weibo::checkpoint::read_manifest(savepoint)?;
    let groups = |m: &weibo::checkpoint::Manifest| -> Vec<(String, (u16, u16))> {
        m.states.iter().map(|s| (s.file.clone(), s.key_groups)).collect()
    };
    println!("on 2 workers: {:?}", groups(&before));
    assert_eq!(groups(&before).iter().map(|g| g.1).collect::<Vec<_>>(), [(0, 64), (64, 128)]);

    // Restored on 3 workers, the job's next checkpoint has three files:
    // the same 128 key groups, split in three ranges.
    let checkpoints = dir.join("checkpoints-v5");
    let out = CollectSink::new();
    let job = pipeline(&checkpoints, Generator::new(ORDERS, order).with_rate(3_000.0), 3, &out);
    let handle = job.restore_from(savepoint).spawn()?;
    let savepoint_id = handle.last_checkpoint();
    let own = handle.savepoint("on-3-workers").await?; // a checkpoint, now
    let after = weibo::checkpoint::read_manifest(&own)?;
    println!("on 3 workers: {:?}", groups(&after));
    assert_eq!(groups(&after).iter().map(|g| g.1).collect::<Vec<_>>(), [(0, 43), (43, 86), (86, 128)]);
    assert!(after.checkpoint > savepoint_id.unwrap_or_default(), "numbered after the one it restored");
    handle.wait().await?;
    assert_eq!(finals(out.values()), expected());
    Ok(())
}
// ANCHOR_END: key_groups
