//! The book's "Sinks" chapter: stdout, blackhole, JSON-lines files, the
//! collecting sink, and a sink of your own that reads record metadata.
//!
//! Run it with `cargo run -p weibo-examples --example book_sinks`.

// ANCHOR: imports
use std::collections::BTreeSet;
use std::error::Error;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use weibo::prelude::*;
use weibo::record::Timestamp;
use weibo::sinks::{Sink, SinkBatch, SinkWriter};
use weibo_examples::{Order, Totals, order};
// ANCHOR_END: imports

fn main() -> Result<(), Box<dyn Error>> {
    stdout()?;
    blackhole()?;
    let dir = std::env::temp_dir().join("weibo-book-sinks");
    std::fs::create_dir_all(&dir)?;
    file(&dir.join("totals.jsonl"))?;
    std::fs::remove_dir_all(&dir)?;
    collect()?;
    record_metadata()?;
    union_instances()?;
    Ok(())
}

// ANCHOR: stdout
fn stdout() -> weibo::Result<()> {
    let job = Job::new("print");
    job.source(IterSource::new((0..3).map(order))).sink(Stdout);
    job.run_blocking()?;
    // prints, one `Debug` line per record:
    // Order { customer: CustomerId(1), amount_cents: 0 }
    // Order { customer: CustomerId(2), amount_cents: 5761 }
    // Order { customer: CustomerId(3), amount_cents: 1522 }
    Ok(())
}
// ANCHOR_END: stdout

// ANCHOR: blackhole
fn blackhole() -> weibo::Result<()> {
    let sink = Blackhole::new();
    let job = Job::new("discard");
    job.source(Generator::new(10_000, order)).sink(sink.clone());
    job.run_blocking()?;
    assert_eq!(sink.count(), 10_000);
    Ok(())
}
// ANCHOR_END: blackhole

// ANCHOR: file
fn file(path: &Path) -> Result<(), Box<dyn Error>> {
    let totals_file = FileSink::json_lines(path);
    let job = Job::new("to-file");
    job.source(IterSource::new((0..2).map(order)))
        .map(|o: Order| Totals { customer: o.customer, orders: 1, cents: o.amount_cents })
        .sink(totals_file.clone())
        .name("totals-file");
    job.run_blocking()?;
    assert_eq!(
        std::fs::read_to_string(path)?,
        "{\"customer\":1,\"orders\":1,\"cents\":0}\n{\"customer\":2,\"orders\":1,\"cents\":5761}\n"
    );

    // The job closed the file when it ended; a later job with the same sink starts it anew.
    let job = Job::new("to-file-again");
    job.source(IterSource::new((2..3).map(order)))
        .map(|o: Order| Totals { customer: o.customer, orders: 1, cents: o.amount_cents })
        .sink(totals_file);
    job.run_blocking()?;
    assert_eq!(std::fs::read_to_string(path)?, "{\"customer\":3,\"orders\":1,\"cents\":1522}\n");
    Ok(())
}
// ANCHOR_END: file

// ANCHOR: collect
fn collect() -> weibo::Result<()> {
    let sink = CollectSink::new();
    let job = Job::new("collect");
    job.source(IterSource::new(vec!["a", "b"])).sink(sink.clone()); // clones share storage
    job.run_blocking()?;
    assert_eq!(sink.values(), ["a", "b"]); // a copy
    assert_eq!(sink.take(), ["a", "b"]); // moves them out
    assert!(sink.values().is_empty());
    Ok(())
}
// ANCHOR_END: collect

// ANCHOR: custom_sink
/// A value, its source partition, its offset in the partition, its event time.
type Seen = (u64, u32, u64, Timestamp);

/// Records each value with the metadata that travelled with it.
#[derive(Clone, Default)]
struct Positions {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Sink<u64> for Positions {
    fn default_name(&self) -> String {
        "positions".into()
    }

    /// Called once per parallel instance of the stream this sink consumes.
    fn open(&self, _instance: usize, _parallelism: usize) -> weibo::Result<Box<dyn SinkWriter<u64>>> {
        Ok(Box::new(self.clone()))
    }
}

impl SinkWriter<u64> for Positions {
    fn write(&mut self, batch: &mut SinkBatch<'_, u64>) -> weibo::Result<()> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        for (value, meta) in batch.values().iter().zip(batch.meta()) {
            seen.push((*value, meta.partition, meta.offset, meta.timestamp));
        }
        batch.drain().for_each(drop);
        Ok(())
    }

    // `flush` (the buffer timeout passed) and `finish` (end of input) have
    // default implementations; override them for sinks that buffer.
}
// ANCHOR_END: custom_sink

// ANCHOR: custom_sink_use
fn record_metadata() -> weibo::Result<()> {
    let positions = Positions::default();
    let job = Job::new("metadata");
    job.source(Generator::new(4, |i| i * 10).with_partitions(2).with_timestamps(|i| 1_000 * i as i64))
        .sink(positions.clone());
    job.run_blocking()?;

    let mut seen = positions.seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    seen.sort();
    // (value, source partition, offset in the partition, event time)
    assert_eq!(seen, [(0, 0, 0, 0), (10, 1, 1, 1_000), (20, 0, 2, 2_000), (30, 1, 3, 3_000)]);
    Ok(())
}
// ANCHOR_END: custom_sink_use

// ANCHOR: instances
/// Which writer got which records: (instance, parallelism, source index, source partition).
type Route = (usize, usize, u32, u32);

/// Notes, for every record, the writer it reached and where it came from.
#[derive(Clone, Default)]
struct Routes {
    seen: Arc<Mutex<BTreeSet<Route>>>,
}

struct RoutesWriter {
    instance: usize,
    parallelism: usize,
    seen: Arc<Mutex<BTreeSet<Route>>>,
}

impl Sink<u64> for Routes {
    fn default_name(&self) -> String {
        "routes".into()
    }

    fn open(&self, instance: usize, parallelism: usize) -> weibo::Result<Box<dyn SinkWriter<u64>>> {
        Ok(Box::new(RoutesWriter { instance, parallelism, seen: self.seen.clone() }))
    }
}

impl SinkWriter<u64> for RoutesWriter {
    fn write(&mut self, batch: &mut SinkBatch<'_, u64>) -> weibo::Result<()> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        for meta in batch.meta() {
            seen.insert((self.instance, self.parallelism, meta.source, meta.partition));
        }
        batch.drain().for_each(drop);
        Ok(())
    }
}

fn union_instances() -> weibo::Result<()> {
    let routes = Routes::default();
    let job = Job::new("union-instances");
    let one = job.source(IterSource::new(vec![1u64, 2])).name("one"); // source 0: 1 partition
    let three = job.source(Generator::new(6, |i| i).with_partitions(3)).name("three"); // source 1: 3 partitions
    one.union(&three).sink(routes.clone());
    println!("{}", job.plan()?);
    job.run_blocking()?;

    // The sink runs in 1 + 3 tasks: 4 writers, instances 0 to 3 of 4.
    let seen: Vec<Route> = routes.seen.lock().unwrap_or_else(PoisonError::into_inner).iter().copied().collect();
    assert_eq!(seen, [(0, 4, 0, 0), (1, 4, 1, 0), (2, 4, 1, 1), (3, 4, 1, 2)]);
    Ok(())
}
// ANCHOR_END: instances
