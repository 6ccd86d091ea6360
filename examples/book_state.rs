//! The book's "State backends" chapter: the same pipeline on the in-memory
//! backend and on fjall, and a fjall job stopped and restored from its
//! checkpoint.
//!
//! Run it with `cargo run -p weibo-examples --example book_state`.

// ANCHOR: imports
use std::collections::BTreeMap;
use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Duration;

use weibo::prelude::*;
use weibo::state::{FjallBackend, MemoryBackend, StateBackend};
use weibo::testing;
use weibo_examples::{CustomerId, Order, Totals, order};
// ANCHOR_END: imports

fn main() -> Result<(), Box<dyn Error>> {
    let dir = scratch("state");
    backends(&dir)?;
    std::fs::remove_dir_all(&dir)?;

    let dir = scratch("fjall-restore");
    testing::block_on(fjall_restore(&dir))?;
    std::fs::remove_dir_all(&dir)?;

    let dir = scratch("timers-on-disk");
    timers_on_disk(&dir)?;
    std::fs::remove_dir_all(&dir)?;

    let dir = scratch("switch-backend");
    testing::block_on(switch_backend(&dir))?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// An empty directory of this process under the system's temporary directory.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weibo-book-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// What the pipeline emits: running totals per customer, and per customer
/// and second of event time, the number of orders.
type Outputs = (CollectSink<Totals>, CollectSink<WindowResult<CustomerId, u64>>);

// ANCHOR: pipeline
/// Running totals per customer (one value per key), and orders per customer
/// and second (one accumulator per key and window). Order `i` happens at
/// `i` milliseconds.
fn pipeline(backend: impl StateBackend) -> (Job, Outputs) {
    let job = Job::new("totals").with_state_backend(backend);
    let (totals, per_second) = (CollectSink::new(), CollectSink::new());
    let orders = job.source(Generator::new(20_000, order).with_timestamps(|i| i as i64)).name("orders");
    orders
        .map(|o: Order| Totals { customer: o.customer, orders: 1, cents: o.amount_cents })
        .key_by(|t: &Totals| t.customer)
        .reduce(|a, b| Totals { customer: a.customer, orders: a.orders + b.orders, cents: a.cents + b.cents })
        .name("totals")
        .sink(totals.clone());
    orders
        .with_watermarks(WatermarkStrategy::monotonous())
        .key_by(|o: &Order| o.customer)
        .window(Tumbling::of(Duration::from_secs(1)))
        .aggregate(weibo::window::Count)
        .name("per-second")
        .sink(per_second.clone());
    (job, (totals, per_second))
}
// ANCHOR_END: pipeline

// ANCHOR: backends
fn backends(dir: &Path) -> Result<(), Box<dyn Error>> {
    // In memory (the default): live Rust objects, bounded by RAM.
    let (job, (totals, per_second)) = pipeline(MemoryBackend);
    job.run_blocking()?;
    let in_memory = (totals.values(), sorted(per_second.values()));

    // On disk: values and accumulators are kept in fjall, the recently
    // used ones also as live objects in a cache in front of it.
    let (job, (totals, per_second)) = pipeline(FjallBackend::open(dir.join("fjall"))?);
    job.run_blocking()?;
    let on_disk = (totals.values(), sorted(per_second.values()));

    // With a cache of a few values, fjall is read and written all the time.
    let (job, (totals, per_second)) = pipeline(small_cache(&dir.join("fjall-small"))?);
    job.run_blocking()?;
    let small = (totals.values(), sorted(per_second.values()));

    assert_eq!(in_memory, on_disk, "the backend changes where state lives, not the results");
    assert_eq!(in_memory, small, "so does the size of fjall's cache");
    println!("{} totals and {} window counts, the same on both backends", on_disk.0.len(), on_disk.1.len());
    Ok(())
}

// ANCHOR: fjall_budgets
/// A fjall backend with its memory budgets set (here: room for a few
/// values only, to show that the cache changes speed, not results).
fn small_cache(dir: &Path) -> weibo::Result<FjallBackend> {
    FjallBackend::builder(dir)
        .with_object_cache(4 << 10) // live values in front of fjall, for all states
        .with_block_cache(8 << 20) // fjall's decompressed blocks
        .with_memtable(4 << 20) // per state, before fjall writes a table file
        .with_background_threads(1) // fjall's flushes and compactions
        .open()
}
// ANCHOR_END: fjall_budgets

/// Window results as (customer, window start, count), in that order.
fn sorted(results: Vec<WindowResult<CustomerId, u64>>) -> Vec<(CustomerId, i64, u64)> {
    let mut out: Vec<_> = results.into_iter().map(|r| (r.key, r.window.start, r.value)).collect();
    out.sort_unstable();
    out
}
// ANCHOR_END: backends

// ANCHOR: timers_on_disk
/// Orders per customer session (orders less than 8 ms apart; a pause of
/// 20 ms after every 100 orders ends them): the timer that closes a
/// session is set per customer, and moved at every order.
fn sessions(backend: impl StateBackend) -> (Job, CollectSink<WindowResult<CustomerId, u64>>) {
    let job = Job::new("sessions").with_state_backend(backend);
    let out = CollectSink::new();
    job.source(Generator::new(20_000, order).with_timestamps(|i| (i + i / 100 * 20) as i64))
        .with_watermarks(WatermarkStrategy::monotonous())
        .key_by(|o: &Order| o.customer)
        .window(Session::with_gap(Duration::from_millis(8)))
        .aggregate(weibo::window::Count)
        .name("sessions")
        .sink(out.clone());
    (job, out)
}

fn timers_on_disk(dir: &Path) -> Result<(), Box<dyn Error>> {
    let (job, in_memory) = sessions(MemoryBackend);
    job.run_blocking()?;
    // Timers in fjall, ordered by time: as many as the disk holds, each
    // set, moved and fired through fjall.
    let backend = FjallBackend::builder(dir.join("fjall")).with_timers_on_disk(true).open()?;
    let (job, on_disk) = sessions(backend);
    job.run_blocking()?;
    let (in_memory, on_disk) = (sorted(in_memory.values()), sorted(on_disk.values()));
    assert_eq!(in_memory, on_disk, "where timers live changes nothing else");
    println!("{} sessions, the same with timers in memory and in fjall", on_disk.len());
    Ok(())
}
// ANCHOR_END: timers_on_disk

/// A pipeline whose keys come and go: key `i / 500`, so a new key starts
/// every 500 events; per key, the number of events.
fn counts(
    checkpoints: &Path,
    backend: impl StateBackend,
    events: Generator<u64>,
    out: &CollectSink<(u64, u64)>,
) -> Job {
    let job = Job::new("counts").with_state_backend(backend).with_checkpoints(checkpoints, Duration::from_millis(200));
    job.source(events)
        .name("events")
        .key_by(|i: &u64| i / 500)
        .fold(|| 0u64, |n: &mut u64, _i: u64| *n += 1)
        .name("counts")
        .sink(out.clone());
    job
}

// ANCHOR: fjall_restore
/// The fjall directory is the working copy of one run: every start opens
/// an empty one, and the job's state comes back from its checkpoint.
fn fresh_fjall(dir: &Path) -> weibo::Result<FjallBackend> {
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        return Err(weibo::Error::Io {
            action: "cannot empty the fjall directory",
            path: dir.to_path_buf(),
            source: e,
        });
    }
    FjallBackend::open(dir)
}

async fn fjall_restore(dir: &Path) -> Result<(), Box<dyn Error>> {
    let (checkpoints, fjall) = (dir.join("checkpoints"), dir.join("fjall"));
    // First life: 10,000 events a second, stopped after a checkpoint and
    // some more events, as if the process had died.
    let out = CollectSink::new();
    let slow = Generator::new(20_000, |i| i).with_rate(10_000.0);
    let handle = counts(&checkpoints, fresh_fjall(&fjall)?, slow, &out).spawn()?;
    while handle.last_checkpoint().is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    handle.abort();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Second life: a fresh fjall directory, filled from the checkpoint.
    let out = CollectSink::new();
    counts(&checkpoints, fresh_fjall(&fjall)?, Generator::new(20_000, |i| i), &out).run().await?;
    assert_counted_once(&out);
    Ok(())
}
// ANCHOR_END: fjall_restore

/// Every key the second life of `counts` updated ended at 500, the last key
/// included: each event counted once.
fn assert_counted_once(out: &CollectSink<(u64, u64)>) {
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    for (key, n) in out.values() {
        last.insert(key, n.max(last.get(&key).copied().unwrap_or(0)));
    }
    assert_eq!(last.keys().last(), Some(&39));
    assert!(last.values().all(|n| *n == 500), "every key counted its 500 events once: {last:?}");
}

// ANCHOR: switch
async fn switch_backend(dir: &Path) -> Result<(), Box<dyn Error>> {
    // In memory: a savepoint, then stop.
    let out = CollectSink::new();
    let slow = Generator::new(20_000, |i| i).with_rate(10_000.0);
    let handle = counts(&dir.join("checkpoints"), MemoryBackend, slow, &out).spawn()?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let savepoint = handle.savepoint("to-fjall").await?;
    handle.abort();

    // On fjall, with a new checkpoint directory: the same entries, loaded into fjall.
    let out = CollectSink::new();
    let fjall = fresh_fjall(&dir.join("fjall"))?;
    let job = counts(&dir.join("checkpoints-fjall"), fjall, Generator::new(20_000, |i| i), &out);
    job.restore_from(&savepoint).run().await?;
    assert_counted_once(&out);
    Ok(())
}
// ANCHOR_END: switch
