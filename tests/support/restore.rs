//! What the restore tests share: a keyed count-and-sum pipeline over a
//! generator, what a run that is never stopped ends with, and helpers to
//! stop a job after some checkpoints and to restore it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use weibo::Job;
use weibo::sinks::CollectSink;
use weibo::sources::Generator;

pub const EVENTS: u64 = 3_000;

/// Event `i`: key `i % 7`, value `i`.
pub fn event(i: u64) -> (u64, u64) {
    (i % 7, i)
}

/// The pipeline: per key, the count and sum so far.
pub fn job(dir: &Path, partitions: usize, rate: f64, out: &CollectSink<(u64, (u64, u64))>) -> Job {
    let job = Job::new("sums").with_checkpoints(dir, Duration::from_millis(30)).with_max_key_groups(16);
    job.source(Generator::new(EVENTS, event).with_partitions(2).with_rate(rate)).name("events").sums(partitions, out);
    job
}

/// The keyed tail of every pipeline here: per key, the count and sum so far.
pub trait Sums {
    fn sums(&self, partitions: usize, out: &CollectSink<(u64, (u64, u64))>);
}

impl Sums for weibo::Stream<(u64, u64)> {
    fn sums(&self, partitions: usize, out: &CollectSink<(u64, (u64, u64))>) {
        self.key_by(|e: &(u64, u64)| e.0)
            .with_partitions(partitions)
            .fold(|| (0u64, 0u64), count_and_sum)
            .name("sums")
            .sink(out.clone());
    }
}

/// The fold of every pipeline here: per key, the count and the sum of values.
pub fn count_and_sum(acc: &mut (u64, u64), e: (u64, u64)) {
    acc.0 += 1;
    acc.1 += e.1;
}

pub fn expected() -> BTreeMap<u64, (u64, u64)> {
    let mut m: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for i in 0..EVENTS {
        let (k, v) = event(i);
        count_and_sum(m.entry(k).or_default(), (k, v));
    }
    m
}

/// The final value per key: the one with the highest count.
pub fn finals(out: Vec<(u64, (u64, u64))>) -> BTreeMap<u64, (u64, u64)> {
    let mut m: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for (k, v) in out {
        let e = m.entry(k).or_default();
        if v.0 > e.0 {
            *e = v;
        }
    }
    m
}

/// Runs the job until `checkpoints` checkpoints completed, then stops it
/// abruptly; returns the number of the last complete one.
pub async fn run_then_stop(dir: &Path, partitions: usize, checkpoints: u64) -> weibo::record::CheckpointId {
    let out = CollectSink::new();
    let handle = job(dir, partitions, 3_000.0, &out).spawn().unwrap();
    for _ in 0..500 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if handle.last_checkpoint().is_some_and(|n| n >= checkpoints) {
            break;
        }
    }
    let last = handle.last_checkpoint().expect("checkpoints complete while the job runs");
    assert!(!handle.is_finished(), "stopped before the end of input");
    handle.abort();
    last
}

pub async fn restore_and_finish(dir: &Path, partitions: usize) -> (BTreeMap<u64, (u64, u64)>, u64) {
    let out = CollectSink::new();
    let handle = job(dir, partitions, 1e9, &out).spawn().unwrap();
    assert!(handle.last_checkpoint().is_some(), "the job restored from a checkpoint");
    let report = handle.wait().await.unwrap();
    let read = report.metrics.operator("events").unwrap().records_out;
    (finals(out.values()), read)
}

/// Events for the incremental test: the first 10,000 fill 10,000 keys, the
/// next 20,000 touch 5 keys, the last 10,000 touch every key once more (so
/// the final value of every key shows in the output).
pub fn fill_then_trickle(i: u64) -> (u64, u64) {
    let key = match i {
        0..10_000 => i,
        10_000..30_000 => i % 5,
        _ => i - 30_000,
    };
    (key, i)
}

/// Lets `handle` run past the fill of [`fill_then_trickle`] and several
/// checkpoints of the trickle, aborts it, and checks that the newest
/// complete checkpoint under `dir` holds `operator`'s state as a chain whose
/// deltas (5 changed keys) are far smaller than its bases (10,000 keys).
pub async fn past_the_fill_deltas_are_small(handle: weibo::JobHandle, dir: &Path, operator: &str) {
    for _ in 0..1000 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let read = handle.metrics().operator("events").map_or(0, |m| m.records_out);
        if read > 16_000 {
            break;
        }
    }
    handle.abort();
    tokio::time::sleep(Duration::from_millis(50)).await;

    let (_, newest) = weibo::checkpoint::complete_checkpoints(dir).into_iter().next().unwrap();
    let manifest = weibo::checkpoint::read_manifest(&newest).unwrap();
    let chain: Vec<_> = manifest.states.iter().filter(|s| s.operator == operator).collect();
    let size = |file: &str| std::fs::metadata(newest.join(file)).unwrap().len();
    let bases: Vec<u64> = chain.iter().filter(|s| s.base).map(|s| size(&s.file)).collect();
    let deltas: Vec<u64> = chain.iter().filter(|s| !s.base).map(|s| size(&s.file)).collect();
    assert!(!deltas.is_empty(), "the newest checkpoint extends a chain: {chain:?}");
    let (biggest_base, smallest_delta) = (bases.iter().max().unwrap(), deltas.iter().min().unwrap());
    assert!(
        smallest_delta * 10 < *biggest_base,
        "{operator}: a checkpoint of 5 changed keys writes far less than one of 10,000 ({smallest_delta} vs {biggest_base} bytes)"
    );
}
