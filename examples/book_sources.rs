//! The book's "Jobs and sources" chapter: in-memory values, the generator,
//! files read as lines or as JSON lines, and a source of your own.
//!
//! Run it with `cargo run -p weibo-examples --example book_sources`.

// ANCHOR: imports
use std::error::Error;
use std::path::Path;

use weibo::BoxFuture;
use weibo::prelude::*;
use weibo::sources::{ReadStatus, Source, SourceOutput, SourceReader};
use weibo_examples::{CustomerId, Order};
// ANCHOR_END: imports

fn main() -> Result<(), Box<dyn Error>> {
    iter()?;
    generator()?;
    let dir = std::env::temp_dir().join("weibo-book-sources");
    std::fs::create_dir_all(&dir)?;
    lines(&dir.join("amounts.txt"))?;
    json_lines(&dir.join("orders.jsonl"))?;
    let err = json_error(&dir.join("orders.jsonl"))?;
    let text = err.to_string();
    assert!(text.starts_with("bad input in source `orders-file` partition 0 offset 34: "), "{text}");
    assert!(
        text.ends_with(
            "orders.jsonl, line 2: invalid JSON: invalid type: string \"two\", expected u32 at line 1 column 17"
        ),
        "{text}"
    );
    std::fs::remove_dir_all(&dir)?;
    custom()?;
    Ok(())
}

// ANCHOR: iter
fn iter() -> weibo::Result<()> {
    let out = CollectSink::new();
    let job = Job::new("in-memory");
    let a = job.source(IterSource::new(vec![1u32, 2, 3])); // a Vec
    let b = job.source(IterSource::new(10..13u32)).name("range"); // any Send iterator
    a.union(&b).sink(out.clone());
    job.run_blocking()?;
    let mut got = out.values();
    got.sort();
    assert_eq!(got, [1, 2, 3, 10, 11, 12]);
    Ok(())
}
// ANCHOR_END: iter

// ANCHOR: generator
fn generator() -> weibo::Result<()> {
    let out = CollectSink::new();
    let job = Job::new("generated");
    job.source(
        Generator::new(6, |i| i * 10) // event i is f(i), for i in 0..6
            .with_partitions(2) // partition 0: i = 0, 2, 4; partition 1: i = 1, 3, 5
            .with_timestamps(|i| 1_700_000_000_000 + i as i64) // event time of event i, in ms
            .with_rate(1_000.0), // at most 1000 events per second, over all partitions
    )
    .sink(out.clone());
    println!("{job}");
    job.run_blocking()?;
    let mut got = out.values();
    got.sort();
    assert_eq!(got, [0, 10, 20, 30, 40, 50]);
    Ok(())
}
// ANCHOR_END: generator

// ANCHOR: lines
fn lines(path: &Path) -> Result<(), Box<dyn Error>> {
    std::fs::write(path, "250\n\n-5\nabc\n100\n")?;

    let amounts = CollectSink::new();
    let rejected = CollectSink::new();
    let job = Job::new("amounts");
    let (parsed, failed) = job
        .source(FileSource::lines(path))
        .name("amounts-file")
        .process(on_error::DeadLetter, |line: &String| line.parse::<i64>());
    parsed.sink(amounts.clone());
    failed.sink(rejected.clone());
    job.run_blocking()?;

    assert_eq!(amounts.values(), [250, -5, 100]);
    // The empty line and "abc" failed; their offsets are byte offsets in the file.
    let rejected: Vec<(String, u64)> = rejected.values().into_iter().map(|d| (d.record, d.position.offset)).collect();
    assert_eq!(rejected, [(String::new(), 4), ("abc".to_string(), 8)]);
    Ok(())
}
// ANCHOR_END: lines

// ANCHOR: json_lines
fn json_lines(path: &Path) -> Result<(), Box<dyn Error>> {
    std::fs::write(path, "{\"customer\":1,\"amount_cents\":250}\n\n{\"customer\":2,\"amount_cents\":-5}\n")?;

    let orders = CollectSink::new();
    let job = Job::new("orders-from-file");
    job.source(FileSource::<Order>::json_lines(path)).sink(orders.clone());
    job.run_blocking()?;
    assert_eq!(
        orders.values(),
        [Order { customer: CustomerId(1), amount_cents: 250 }, Order { customer: CustomerId(2), amount_cents: -5 }]
    );
    Ok(())
}
// ANCHOR_END: json_lines

// ANCHOR: json_error
fn json_error(path: &Path) -> Result<weibo::Error, Box<dyn Error>> {
    std::fs::write(path, "{\"customer\":1,\"amount_cents\":250}\n{\"customer\":\"two\"}\n")?;

    let job = Job::new("orders-from-file");
    job.source(FileSource::<Order>::json_lines(path)).name("orders-file").sink(Blackhole::new());
    let err = job.run_blocking().err().ok_or("a bad line stops the job")?;
    assert!(matches!(err, weibo::Error::Input { .. }));
    println!("{err}");
    Ok(err)
}
// ANCHOR_END: json_error

// ANCHOR: custom_source
/// A source with one in-memory list of lines per partition.
struct Partitioned {
    parts: Vec<Vec<String>>,
}

impl Source for Partitioned {
    type Item = String;

    fn default_name(&self) -> String {
        "partitioned".into()
    }

    fn describe(&self) -> String {
        "in-memory partitions".into()
    }

    fn partitions(&self) -> usize {
        self.parts.len()
    }

    /// Called once per partition; each partition is read by its own task.
    fn open(&self, partition: usize) -> weibo::Result<Box<dyn SourceReader<String>>> {
        let lines = self.parts.get(partition).cloned().unwrap_or_default();
        Ok(Box::new(PartitionReader { lines, next: 0 }))
    }
}

struct PartitionReader {
    lines: Vec<String>,
    next: usize,
}

impl SourceReader<String> for PartitionReader {
    fn read<'a>(&'a mut self, out: &'a mut SourceOutput<String>) -> BoxFuture<'a, weibo::Result<ReadStatus>> {
        Box::pin(async move {
            while out.remaining() > 0 {
                let Some(line) = self.lines.get(self.next) else {
                    return Ok(ReadStatus::Done); // the partition has ended
                };
                out.push(line.clone(), self.next as u64, None); // value, offset, event time
                self.next += 1;
            }
            Ok(ReadStatus::More) // the batch is full; more right away
        })
    }
}
// ANCHOR_END: custom_source

// ANCHOR: custom_source_use
fn custom() -> weibo::Result<()> {
    let out = CollectSink::new();
    let job = Job::new("custom-source");
    let parts = vec![vec!["a".to_string(), "b".to_string()], vec!["c".to_string()]];
    job.source(Partitioned { parts }).sink(out.clone());
    println!("{job}");
    job.run_blocking()?;
    let mut got = out.values();
    got.sort();
    assert_eq!(got, ["a", "b", "c"]);
    Ok(())
}
// ANCHOR_END: custom_source_use
