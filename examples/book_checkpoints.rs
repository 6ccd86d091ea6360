//! The book's "Checkpoints and recovery" chapter: a job with checkpoints
//! stopped mid-run and restored, what its checkpoint directory holds, a
//! source of your own that resumes, exactly-once output to files, and
//! checkpoints in a storage other than a directory.
//!
//! Run it with `cargo run -p weibo-examples --example book_checkpoints`.

// ANCHOR: imports
use std::collections::BTreeMap;
use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use weibo::BoxFuture;
use weibo::prelude::*;
use weibo::sources::{ReadStatus, Source, SourceOutput, SourceReader};
// ANCHOR_END: imports

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let dir = scratch("checkpoints");
    stop_and_restore(&dir).await?;
    std::fs::remove_dir_all(&dir)?;

    let dir = scratch("custom-source");
    custom_source_resumes(&dir).await?;
    std::fs::remove_dir_all(&dir)?;

    let dir = scratch("exactly-once");
    exactly_once(&dir).await?;
    std::fs::remove_dir_all(&dir)?;

    other_storage().await?;
    Ok(())
}

/// An empty directory of this process under the system's temporary directory.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weibo-book-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

const EVENTS: u64 = 4_000;

/// Event `i`: key `i % 7`, value `i`.
fn event(i: u64) -> (u64, u64) {
    (i % 7, i)
}

// ANCHOR: pipeline
/// Per key, the number of events and the sum of their values so far.
fn pipeline(checkpoints: &Path, events: Generator<(u64, u64)>, out: &CollectSink<(u64, (u64, u64))>) -> Job {
    let job = Job::new("sums").with_checkpoints(checkpoints, Duration::from_millis(100));
    sums(&job, events, out);
    job
}

/// The pipeline's operators, added to `job`.
fn sums(job: &Job, events: Generator<(u64, u64)>, out: &CollectSink<(u64, (u64, u64))>) {
    job.source(events)
        .name("events")
        .key_by(|e: &(u64, u64)| e.0)
        .with_partitions(2)
        .fold(
            || (0u64, 0u64),
            |acc: &mut (u64, u64), e: (u64, u64)| {
                acc.0 += 1;
                acc.1 += e.1;
            },
        )
        .name("sums")
        .sink(out.clone());
}
// ANCHOR_END: pipeline

/// The last update per key: the one with the highest count.
fn finals(out: Vec<(u64, (u64, u64))>) -> BTreeMap<u64, (u64, u64)> {
    let mut last: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for (key, value) in out {
        let entry = last.entry(key).or_default();
        if value.0 > entry.0 {
            *entry = value;
        }
    }
    last
}

/// What a run that is never stopped ends with.
fn expected() -> BTreeMap<u64, (u64, u64)> {
    finals(
        (0..EVENTS)
            .scan(BTreeMap::<u64, (u64, u64)>::new(), |sums, i| {
                let (key, value) = event(i);
                let sum = sums.entry(key).or_default();
                *sum = (sum.0 + 1, sum.1 + value);
                Some((key, *sum))
            })
            .collect(),
    )
}

// ANCHOR: stop_and_restore
async fn stop_and_restore(dir: &Path) -> Result<(), Box<dyn Error>> {
    // First life: a slow source (2,000 events a second), stopped abruptly
    // once two checkpoints are complete.
    let out = CollectSink::new();
    let slow = Generator::new(EVENTS, event).with_partitions(2).with_rate(2_000.0);
    let handle = pipeline(dir, slow, &out).spawn()?;
    while handle.last_checkpoint().is_none_or(|n| n < 2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!handle.is_finished());
    handle.abort(); // as if the process had died
    println!("stopped after checkpoint {:?}, {} updates emitted", handle.last_checkpoint(), out.values().len());
    // `abort` does not wait for a checkpoint being written at that moment;
    // a new process would not care, a restart in this one gives it a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    show_checkpoints(dir)?;

    // Second life: the same pipeline on the same directory restores the
    // newest complete checkpoint by itself.
    let out = CollectSink::new();
    let fast = Generator::new(EVENTS, event).with_partitions(2);
    let handle = pipeline(dir, fast, &out).spawn()?;
    let restored = handle.last_checkpoint();
    let report = handle.wait().await?;
    let read = report.metrics.operator("events").map_or(0, |m| m.records_out);
    println!("second life: restored checkpoint {restored:?}, read the remaining {read} of {EVENTS} events");
    assert!(restored.is_some() && read < EVENTS, "the sources resumed at their checkpointed positions");
    assert_eq!(finals(out.values()), expected(), "no event lost, none counted twice");
    Ok(())
}
// ANCHOR_END: stop_and_restore

// ANCHOR: show_checkpoints
fn show_checkpoints(dir: &Path) -> Result<(), Box<dyn Error>> {
    let names = |path: &Path| -> std::io::Result<Vec<String>> {
        let mut names: Vec<String> = std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()?;
        names.sort();
        Ok(names)
    };
    // Complete checkpoints (those with a MANIFEST), newest first.
    let complete = weibo::checkpoint::complete_checkpoints(dir);
    let Some((newest, path)) = complete.first() else { return Err("no complete checkpoint".into()) };
    println!("{} complete checkpoints; the newest, {newest}, holds {:?}", complete.len(), names(path)?);
    // The state files of all checkpoints.
    println!("shared/ holds {:?}", names(&dir.join("shared"))?);

    let manifest = weibo::checkpoint::read_manifest(path)?;
    for s in &manifest.sources {
        println!("  source {} partition {} resumes at {}", s.source, s.partition, s.position);
    }
    for s in &manifest.states {
        let kind = if s.base { "base" } else { "delta" };
        println!(
            "  {} ({kind}, checkpoint {}) holds `{}` of `{}`, key groups {:?}",
            s.file, s.checkpoint, s.state, s.operator, s.key_groups
        );
    }
    // Per `sums` worker, one chain: its newest base, then the deltas after it.
    let chains: Vec<_> = manifest.states.chunk_by(|a, b| a.key_groups == b.key_groups).collect();
    assert_eq!(chains.len(), 2, "one chain per `sums` worker");
    for chain in chains {
        assert!(chain.iter().enumerate().all(|(i, s)| s.base == (i == 0)), "a base, then deltas");
        assert!(chain.iter().all(|s| path.join(&s.file).is_file()), "files named relative to the checkpoint");
    }
    Ok(())
}
// ANCHOR_END: show_checkpoints

// ANCHOR: custom_source
/// Lines held in memory, in one partition. A reader's position is the
/// index of the next line, which is all it needs to resume.
struct MemoryLines {
    lines: Arc<Vec<String>>,
}

impl Source for MemoryLines {
    type Item = String;

    fn default_name(&self) -> String {
        "memory-lines".into()
    }

    fn describe(&self) -> String {
        format!("{} lines in memory", self.lines.len())
    }

    fn partitions(&self) -> usize {
        1
    }

    fn open(&self, partition: usize) -> weibo::Result<Box<dyn SourceReader<String>>> {
        self.open_at(partition, 0)
    }

    /// Resumes at `position`, a value `MemoryLines`'s reader returned from
    /// `position()`: the index of the next line.
    fn open_at(&self, _partition: usize, position: u64) -> weibo::Result<Box<dyn SourceReader<String>>> {
        let next = usize::try_from(position).unwrap_or(usize::MAX);
        if next > self.lines.len() {
            return Err(weibo::Error::Connector {
                name: self.default_name(),
                message: format!("cannot resume at line {position}: there are {}", self.lines.len()),
                source: None,
            });
        }
        Ok(Box::new(MemoryLinesReader { lines: self.lines.clone(), next }))
    }
}

struct MemoryLinesReader {
    lines: Arc<Vec<String>>,
    next: usize,
}

impl SourceReader<String> for MemoryLinesReader {
    fn read<'a>(&'a mut self, out: &'a mut SourceOutput<String>) -> BoxFuture<'a, weibo::Result<ReadStatus>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(1)).await; // a slow input: 4 lines a millisecond
            for _ in 0..out.remaining().min(4) {
                let Some(line) = self.lines.get(self.next) else { return Ok(ReadStatus::Done) };
                out.push(line.clone(), self.next as u64, None);
                self.next += 1;
            }
            Ok(if self.next < self.lines.len() { ReadStatus::More } else { ReadStatus::Done })
        })
    }

    /// Where reading resumes: recorded at every checkpoint barrier.
    fn position(&self) -> Option<u64> {
        Some(self.next as u64)
    }
}
// ANCHOR_END: custom_source

/// `MemoryLines` under checkpoints: stopped after one, restored, every line
/// counted once.
async fn custom_source_resumes(dir: &Path) -> Result<(), Box<dyn Error>> {
    let lines: Arc<Vec<String>> = Arc::new((0..2_000).map(|i| format!("line {}", i % 10)).collect());
    let counts = |out: &CollectSink<(String, u64)>| -> BTreeMap<String, u64> {
        let mut last = BTreeMap::new();
        for (line, n) in out.values() {
            let entry = last.entry(line).or_insert(0);
            *entry = n.max(*entry);
        }
        last
    };
    let job = |out: &CollectSink<(String, u64)>| {
        let job = Job::new("line-counts").with_checkpoints(dir, Duration::from_millis(50));
        job.source(MemoryLines { lines: lines.clone() })
            .name("lines")
            .key_by(|line: &String| line.clone())
            .fold(|| 0u64, |n: &mut u64, _line: String| *n += 1)
            .name("counts")
            .sink(out.clone());
        job
    };
    let out = CollectSink::new();
    let handle = job(&out).spawn()?;
    while handle.last_checkpoint().is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!handle.is_finished());
    handle.abort();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let out = CollectSink::new();
    let report = job(&out).run().await?;
    let read = report.metrics.operator("lines").map_or(0, |m| m.records_out);
    println!("`MemoryLines` resumed: the second life read {read} of 2000 lines");
    assert!(read < 2_000);
    let want: BTreeMap<String, u64> = (0..10).map(|i| (format!("line {i}"), 200)).collect();
    assert_eq!(counts(&out), want);
    Ok(())
}

// ANCHOR: exactly_once
async fn exactly_once(dir: &Path) -> Result<(), Box<dyn Error>> {
    let (checkpoints, output) = (dir.join("checkpoints"), dir.join("out"));
    let job = |numbers: Generator<u64>| {
        let job = Job::new("copy").with_checkpoints(&checkpoints, Duration::from_millis(100));
        job.source(numbers).name("numbers").sink_exactly_once(TxnFileSink::json_lines(&output)).name("out");
        job
    };

    // First life: stopped abruptly after two checkpoints.
    let handle = job(Generator::new(3_000, |i| i).with_rate(3_000.0)).spawn()?;
    while handle.last_checkpoint().is_none_or(|n| n < 2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.abort();
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!("after the first life:  committed {:?}", files(&output)?);
    println!("                       pending   {:?}", files(&output.join(".pending"))?);

    // Second life: restores, discards the pending epochs after the restored
    // checkpoint, writes them again, and its final checkpoint at the end of
    // the input commits the last epoch.
    job(Generator::new(3_000, |i| i)).run().await?;
    println!("after the second life: committed {:?}", files(&output)?);
    assert!(files(&output.join(".pending"))?.is_empty());

    let mut numbers = Vec::new();
    for name in files(&output)? {
        for line in std::fs::read_to_string(output.join(name))?.lines() {
            numbers.push(line.parse::<u64>()?);
        }
    }
    numbers.sort_unstable();
    assert_eq!(numbers, (0..3_000).collect::<Vec<u64>>(), "every number committed exactly once");
    Ok(())
}

/// The names of the files (not directories) in `dir`, sorted.
fn files(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}
// ANCHOR_END: exactly_once

// ANCHOR: other_storage
async fn other_storage() -> Result<(), Box<dyn Error>> {
    use weibo::checkpoint::{MemoryStorage, complete_checkpoints_in};

    let storage = MemoryStorage::new();

    // The pipeline of this chapter, checkpointing into memory.
    let pipeline = |events: Generator<(u64, u64)>, out: &CollectSink<(u64, (u64, u64))>| {
        let job = Job::new("sums").with_checkpoint_storage(storage.clone(), Duration::from_millis(100));
        sums(&job, events, out);
        job
    };
    let out = CollectSink::new();
    let handle = pipeline(Generator::new(EVENTS, event).with_partitions(2).with_rate(2_000.0), &out).spawn()?;
    while handle.last_checkpoint().is_none_or(|n| n < 2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.abort();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for name in storage.names() {
        println!("  {name}");
    }
    let newest = complete_checkpoints_in(&storage, "")?;
    println!("complete: {:?}", newest.iter().map(|(n, _)| n).collect::<Vec<_>>());

    // A second life restores from the same storage.
    let out = CollectSink::new();
    pipeline(Generator::new(EVENTS, event).with_partitions(2), &out).run().await?;
    assert_eq!(finals(out.values()), expected(), "no event lost, none counted twice");
    Ok(())
}
// ANCHOR_END: other_storage
