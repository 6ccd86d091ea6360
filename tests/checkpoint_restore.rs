//! Checkpoints and restore within one process: a job is stopped after some
//! checkpoints completed, a new job restores and runs to the end, and its
//! final per-key state equals a run that was never stopped — also with
//! another partition count, and when the newest checkpoint is damaged.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, missing_docs)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use weibo::Job;
use weibo::checkpoint::MemoryStorage;
use weibo::sinks::CollectSink;
use weibo::sources::Generator;

const EVENTS: u64 = 3_000;

/// Event `i`: key `i % 7`, value `i`.
fn event(i: u64) -> (u64, u64) {
    (i % 7, i)
}

/// The pipeline: per key, the count and sum so far.
fn job(dir: &Path, partitions: usize, rate: f64, out: &CollectSink<(u64, (u64, u64))>) -> Job {
    let job = Job::new("sums").with_checkpoints(dir, Duration::from_millis(30)).with_max_key_groups(16);
    job.source(Generator::new(EVENTS, event).with_partitions(2).with_rate(rate)).name("events").sums(partitions, out);
    job
}

/// The keyed tail of every pipeline here: per key, the count and sum so far.
trait Sums {
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
fn count_and_sum(acc: &mut (u64, u64), e: (u64, u64)) {
    acc.0 += 1;
    acc.1 += e.1;
}

fn expected() -> BTreeMap<u64, (u64, u64)> {
    let mut m: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for i in 0..EVENTS {
        let (k, v) = event(i);
        count_and_sum(m.entry(k).or_default(), (k, v));
    }
    m
}

/// The final value per key: the one with the highest count.
fn finals(out: Vec<(u64, (u64, u64))>) -> BTreeMap<u64, (u64, u64)> {
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
async fn run_then_stop(dir: &Path, partitions: usize, checkpoints: u64) -> u64 {
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

async fn restore_and_finish(dir: &Path, partitions: usize) -> (BTreeMap<u64, (u64, u64)>, u64) {
    let out = CollectSink::new();
    let handle = job(dir, partitions, 1e9, &out).spawn().unwrap();
    assert!(handle.last_checkpoint().is_some(), "the job restored from a checkpoint");
    let report = handle.wait().await.unwrap();
    let read = report.metrics.operator("events").unwrap().records_out;
    (finals(out.values()), read)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_job_ends_with_the_same_state_as_one_never_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let last = run_then_stop(dir.path(), 2, 3).await;
    assert!(last >= 3);
    let (got, read) = restore_and_finish(dir.path(), 2).await;
    assert_eq!(got, expected(), "no event lost or counted twice in the state");
    assert!(read < EVENTS, "the sources resumed at their checkpointed positions (read {read})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_job_leaves_a_last_checkpoint_and_nothing_runs_after_stop_returns() {
    let dir = tempfile::tempdir().unwrap();
    let out = CollectSink::new();
    let handle = job(dir.path(), 2, 3_000.0, &out).spawn().unwrap();
    while handle.last_checkpoint().is_none_or(|n| n < 2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = handle.last_checkpoint().unwrap();
    handle.stop().await.unwrap();
    let newest = weibo::checkpoint::complete_checkpoints(dir.path()).iter().map(|(n, _)| *n).max().unwrap();
    assert!(newest > before, "stop took a checkpoint of its own ({newest} after {before})");
    let seen = out.values().len();
    assert!((seen as u64) < EVENTS, "stopped before the end of input");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(out.values().len(), seen, "nothing runs after stop returned");
    let listed: Vec<u64> = weibo::checkpoint::complete_checkpoints(dir.path()).iter().map(|(n, _)| *n).collect();
    assert_eq!(listed.iter().max(), Some(&newest), "no checkpoint after stop returned");
    let (got, _) = restore_and_finish(dir.path(), 2).await;
    assert_eq!(got, expected(), "the job goes on from the last checkpoint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_restores_with_another_partition_count() {
    let dir = tempfile::tempdir().unwrap();
    run_then_stop(dir.path(), 2, 2).await;
    let (got, _) = restore_and_finish(dir.path(), 3).await;
    assert_eq!(got, expected(), "key groups moved to other workers with their state");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_newest_checkpoint_falls_back_to_the_one_before() {
    let dir = tempfile::tempdir().unwrap();
    let last = run_then_stop(dir.path(), 2, 3).await;
    let newest = weibo::checkpoint::complete_checkpoints(dir.path());
    assert_eq!(newest[0].0, last);
    // Flip a byte in one of the state files it wrote (in `shared/`, named
    // after the checkpoint that wrote them, then the run).
    let infix = format!("-{last:020}-");
    let file = std::fs::read_dir(dir.path().join("shared"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains(&infix))
        .unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xFF;
    std::fs::write(&file, bytes).unwrap();
    let (got, _) = restore_and_finish(dir.path(), 2).await;
    assert_eq!(got, expected());
}

#[test]
fn restoring_another_pipeline_is_refused_naming_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    weibo::testing::block_on(async { run_then_stop(dir.path(), 1, 1).await });
    let other = Job::new("sums").restore_from(dir.path()).with_max_key_groups(16);
    other
        .source(Generator::new(10, |i| i))
        .name("events")
        .key_by(|x: &u64| *x)
        .reduce(|a, b| a + b)
        .sink(CollectSink::new());
    let err = weibo::testing::block_on(other.run()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("different pipeline") && text.contains("chk-"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_savepoint_outlives_retention_and_restores_with_another_partition_count() {
    let dir = tempfile::tempdir().unwrap();
    let out = CollectSink::new();
    let handle = job(dir.path(), 2, 3_000.0, &out).with_retained_checkpoints(1).spawn().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let savepoint = handle.savepoint("before-rescale").await.unwrap();
    assert_eq!(savepoint, dir.path().join("savepoints").join("before-rescale"));
    let err = handle.savepoint("before-rescale").await.unwrap_err();
    assert!(err.to_string().contains("exists already"), "{err}");
    let at = handle.last_checkpoint().unwrap();
    // Let retention (keep 1) go past the savepoint's checkpoint.
    for _ in 0..500 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if handle.last_checkpoint().is_some_and(|n| n >= at + 2) {
            break;
        }
    }
    handle.abort();
    assert_eq!(weibo::checkpoint::complete_checkpoints(dir.path()).len(), 1, "retention kept one checkpoint");
    assert!(savepoint.join("MANIFEST").is_file(), "but not at the savepoint's expense");

    // Restore the savepoint into a job with 3 partitions (and a fresh checkpoint directory).
    let other = tempfile::tempdir().unwrap();
    let out = CollectSink::new();
    let restored = job(other.path(), 3, 1e9, &out).restore_from(&savepoint);
    let report = restored.run().await.unwrap();
    assert_eq!(finals(out.values()), expected());
    assert!(report.metrics.operator("events").unwrap().records_out < EVENTS);
}

/// The pipeline of [`job`], checkpointing into `storage`.
fn job_in(storage: &MemoryStorage, partitions: usize, rate: f64, out: &CollectSink<(u64, (u64, u64))>) -> Job {
    let job = Job::new("sums")
        .with_checkpoint_storage(storage.clone(), Duration::from_millis(30))
        .with_retained_checkpoints(2)
        .with_max_key_groups(16);
    job.source(Generator::new(EVENTS, event).with_partitions(2).with_rate(rate)).name("events").sums(partitions, out);
    job
}

/// Checkpoints in a storage that is not a directory, with an object
/// store's rules (objects written once, whole; no rename; `MemoryStorage`
/// refuses to overwrite): they restore, rescale, fall back past damage,
/// keep savepoints and are retained as in a directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_in_another_storage_restore_rescale_fall_back_and_are_retained() {
    use weibo::checkpoint::{CheckpointStorage, MemoryStorage, complete_checkpoints_in, read_manifest_in};

    let storage = MemoryStorage::new();
    let out = CollectSink::new();
    let handle = job_in(&storage, 2, 3_000.0, &out).spawn().unwrap();
    while handle.last_checkpoint().is_none_or(|n| n < 2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let savepoint = handle.savepoint("before-rescale").await.unwrap();
    assert_eq!(savepoint, storage.locate("savepoints/before-rescale"));
    let at = handle.last_checkpoint().unwrap();
    while handle.last_checkpoint().is_none_or(|n| n < at + 3) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!handle.is_finished(), "stopped before the end of input");
    handle.abort();
    // `abort` does not wait for a checkpoint being completed or written at
    // that moment: give it time to land (or not) before looking.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Retention: the newest two complete checkpoints, and the state files
    // they refer to (or that checkpoints in flight wrote after them).
    let complete = complete_checkpoints_in(&storage, "").unwrap();
    assert_eq!(complete.len(), 2, "{complete:?}");
    let newest = complete[0].0;
    let mut referenced = std::collections::BTreeSet::new();
    for (_, dir) in &complete {
        let m = read_manifest_in(&storage, dir).unwrap();
        referenced.extend(m.states.iter().map(|s| format!("shared/{}", s.file.rsplit('/').next().unwrap())));
    }
    for name in storage.list("shared/").unwrap() {
        // `<operator>-<instance>-<state>-<checkpoint>-<run>.state`
        let written: u64 = name.trim_end_matches(".state").rsplit('-').nth(1).unwrap().parse().unwrap();
        assert!(referenced.contains(&name) || written > newest, "{name} outlived retention");
    }
    assert!(storage.exists("savepoints/before-rescale/MANIFEST").unwrap(), "the savepoint outlived retention");

    // Damage every state file the newest checkpoint wrote: the restore
    // falls back to the one before, with 3 partitions.
    let manifest = read_manifest_in(&storage, &complete[0].1).unwrap();
    for s in manifest.states.iter().filter(|s| s.checkpoint == newest) {
        let name = format!("shared/{}", s.file.rsplit('/').next().unwrap());
        let mut bytes = storage.get(&name).unwrap().to_vec();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xFF;
        storage.set(&name, bytes);
    }
    let out = CollectSink::new();
    let handle = job_in(&storage, 3, 1e9, &out).spawn().unwrap();
    assert_eq!(handle.last_checkpoint(), Some(complete[1].0), "restored from the checkpoint before the damaged one");
    let report = handle.wait().await.unwrap();
    assert_eq!(finals(out.values()), expected(), "no event lost or counted twice");
    assert!(report.metrics.operator("events").unwrap().records_out < EVENTS, "sources resumed");

    // The savepoint restores into a job checkpointing elsewhere, with 1 partition.
    let elsewhere = MemoryStorage::new();
    let out = CollectSink::new();
    let restored = job_in(&elsewhere, 1, 1e9, &out)
        .restore_from_storage(std::sync::Arc::new(storage.clone()), "savepoints/before-rescale");
    let report = restored.run().await.unwrap();
    assert_eq!(finals(out.values()), expected());
    assert!(report.metrics.operator("events").unwrap().records_out < EVENTS);
    let missing = job_in(&elsewhere, 1, 1e9, &CollectSink::new())
        .restore_from_storage(std::sync::Arc::new(storage.clone()), "savepoints/none");
    let err = missing.run().await.unwrap_err().to_string();
    assert!(err.contains("memory:/savepoints/none") && err.contains("no complete checkpoint"), "{err}");
}

/// A storage whose writes fail while `failing` is set, as an object store
/// does during an outage, and whose manifests alone fail while
/// `failing_puts` is.
#[derive(Debug, Clone, Default)]
struct Flaky {
    inner: MemoryStorage,
    failing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    failing_puts: std::sync::Arc<std::sync::atomic::AtomicBool>,
    refused: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Flaky {
    fn check_put(&self) -> std::io::Result<()> {
        if self.failing_puts.load(std::sync::atomic::Ordering::SeqCst) {
            self.refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return Err(std::io::Error::other("injected outage of manifests"));
        }
        self.check()
    }

    fn check(&self) -> std::io::Result<()> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            self.refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return Err(std::io::Error::other("injected outage"));
        }
        Ok(())
    }
}

impl weibo::checkpoint::CheckpointStorage for Flaky {
    fn locate(&self, name: &str) -> std::path::PathBuf {
        self.inner.locate(name)
    }
    fn create(&self, name: &str) -> std::io::Result<Box<dyn weibo::checkpoint::ObjectWriter>> {
        self.check()?;
        self.inner.create(name)
    }
    fn put(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        self.check_put()?;
        self.inner.put(name, bytes)
    }
    fn open(&self, name: &str) -> std::io::Result<Box<dyn weibo::checkpoint::ObjectReader>> {
        self.inner.open(name)
    }
    fn exists(&self, name: &str) -> std::io::Result<bool> {
        self.inner.exists(name)
    }
    fn list(&self, prefix: &str) -> std::io::Result<Vec<String>> {
        self.inner.list(prefix)
    }
    fn delete(&self, name: &str) -> std::io::Result<()> {
        self.check()?;
        self.inner.delete(name)
    }
}

/// While the storage refuses writes, checkpoints fail and the job goes on;
/// once it takes them again, checkpoints complete, and a restore from them
/// loses and repeats nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_fail_while_the_storage_is_down_and_resume_after() {
    use std::sync::atomic::Ordering;

    // The sums, and an exactly-once copy of the events.
    let job = |storage: &Flaky, out: &CollectSink<(u64, (u64, u64))>, copy: &std::path::Path, rate: f64| {
        let job = Job::new("sums")
            .with_checkpoint_storage(storage.clone(), Duration::from_millis(30))
            .with_max_key_groups(16);
        let events = job.source(Generator::new(EVENTS, event).with_partitions(2).with_rate(rate)).name("events");
        events.sums(2, out);
        events.sink_exactly_once(weibo::sinks::TxnFileSink::json_lines(copy)).name("copy");
        job
    };
    let storage = Flaky::default();
    let out = CollectSink::new();
    let copied = tempfile::tempdir().unwrap();
    let handle = job(&storage, &out, copied.path(), 1_500.0).spawn().unwrap();
    while handle.last_checkpoint().is_none_or(|n| n < 2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    storage.failing.store(true, Ordering::SeqCst);
    // A checkpoint in flight may still complete, if its writes were done.
    tokio::time::sleep(Duration::from_millis(60)).await;
    let during = handle.last_checkpoint();
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(handle.last_checkpoint(), during, "no checkpoint completes while the storage refuses writes");
    assert!(storage.refused.load(Ordering::SeqCst) > 0, "the job tried");
    assert!(!handle.is_finished(), "the job goes on");
    // Then only manifests fail: state files and sink transactions are
    // written, but no checkpoint completes.
    storage.failing_puts.store(true, Ordering::SeqCst);
    storage.failing.store(false, Ordering::SeqCst);
    let refused = storage.refused.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(handle.last_checkpoint(), during, "no checkpoint completes without its manifest");
    assert!(storage.refused.load(Ordering::SeqCst) > refused, "manifests were tried");
    storage.failing_puts.store(false, Ordering::SeqCst);
    while handle.last_checkpoint() <= during {
        assert!(!handle.is_finished(), "checkpoints resume before the input ends");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.abort();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = CollectSink::new();
    let handle = job(&storage, &out, copied.path(), 1e9).spawn().unwrap();
    assert!(handle.last_checkpoint() > during, "restored from a checkpoint taken after the outage");
    let report = handle.wait().await.unwrap();
    assert_eq!(finals(out.values()), expected(), "no event lost or counted twice");
    assert!(report.metrics.operator("events").unwrap().records_out < EVENTS, "sources resumed");
    // The exactly-once copy holds every event once: the transactions of
    // checkpoints whose manifest could not be written were committed with
    // a later one.
    let mut committed: Vec<u64> = Vec::new();
    for entry in std::fs::read_dir(copied.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let (_, i): (u64, u64) = serde_json::from_str(line).unwrap();
                committed.push(i);
            }
        }
    }
    committed.sort_unstable();
    assert_eq!(committed, (0..EVENTS).collect::<Vec<u64>>(), "every event committed exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn savepoints_need_checkpoints_and_a_plain_name() {
    let plain = Job::new("plain");
    plain.source(Generator::new(1_000_000, |i| i).with_rate(1000.0)).sink(CollectSink::new());
    let handle = plain.spawn().unwrap();
    let err = handle.savepoint("x").await.unwrap_err();
    assert!(err.to_string().contains("with_checkpoints"), "{err}");
    let err = handle.savepoint("../escape").await.unwrap_err();
    assert!(err.to_string().contains("savepoint name"), "{err}");
    handle.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_of_fjall_state_restore_too() {
    let dir = tempfile::tempdir().unwrap();
    let first_state = tempfile::tempdir().unwrap();
    let out = CollectSink::new();
    let handle = job(dir.path(), 2, 3_000.0, &out)
        .with_state_backend(weibo::state::FjallBackend::open(first_state.path()).unwrap())
        .spawn()
        .unwrap();
    for _ in 0..500 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if handle.last_checkpoint().is_some_and(|n| n >= 3) {
            break;
        }
    }
    assert!(handle.last_checkpoint().is_some_and(|n| n >= 3));
    handle.abort();
    // A new process would start with an empty state directory: restore fills it.
    let second_state = tempfile::tempdir().unwrap();
    let out = CollectSink::new();
    let restored = job(dir.path(), 3, 1e9, &out)
        .with_state_backend(weibo::state::FjallBackend::open(second_state.path()).unwrap());
    restored.run().await.unwrap();
    assert_eq!(finals(out.values()), expected());
}

/// Events for the incremental test: the first 10,000 fill 10,000 keys, the
/// next 20,000 touch 5 keys, the last 10,000 touch every key once more (so
/// the final value of every key shows in the output).
fn fill_then_trickle(i: u64) -> (u64, u64) {
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
async fn past_the_fill_deltas_are_small(handle: weibo::JobHandle, dir: &Path, operator: &str) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_after_the_first_write_only_what_changed() {
    incremental_checkpoints(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_of_fjall_state_after_the_first_write_only_what_changed() {
    incremental_checkpoints(true).await;
}

async fn incremental_checkpoints(on_fjall: bool) {
    let dir = tempfile::tempdir().unwrap();
    let states = tempfile::tempdir().unwrap();
    let runs = std::cell::Cell::new(0);
    let build = |rate: f64, out: &CollectSink<(u64, (u64, u64))>| {
        let mut job =
            Job::new("incremental").with_checkpoints(dir.path(), Duration::from_millis(30)).with_max_key_groups(16);
        if on_fjall {
            // A fresh database per run: the restored run has only the checkpoint.
            runs.set(runs.get() + 1);
            let state = states.path().join(format!("run-{}", runs.get()));
            job = job.with_state_backend(weibo::state::FjallBackend::open(state).unwrap());
        }
        job.source(Generator::new(40_000, fill_then_trickle).with_rate(rate)).name("events").sums(2, out);
        job
    };
    let out = CollectSink::new();
    past_the_fill_deltas_are_small(build(20_000.0, &out).spawn().unwrap(), dir.path(), "sums").await;

    // Restoring the chain gives the state a run that never stopped has.
    let out = CollectSink::new();
    build(1e9, &out).run().await.unwrap();
    let mut want: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for i in 0..40_000 {
        let (k, v) = fill_then_trickle(i);
        count_and_sum(want.entry(k).or_default(), (k, v));
    }
    assert_eq!(finals(out.values()), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_checkpoints_after_the_first_write_only_what_changed() {
    incremental_window_checkpoints(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_checkpoints_of_fjall_state_after_the_first_write_only_what_changed() {
    incremental_window_checkpoints(true).await;
}

/// One hour-long window over the events of [`fill_then_trickle`]: its
/// state is 10,000 accumulators once filled, of which the trickle changes
/// 5, so checkpoints after the fill are deltas far smaller than a base.
async fn incremental_window_checkpoints(on_fjall: bool) {
    use weibo::time::WatermarkStrategy;
    use weibo::window::{Tumbling, WindowResult};
    let dir = tempfile::tempdir().unwrap();
    let states = tempfile::tempdir().unwrap();
    let runs = std::cell::Cell::new(0);
    let build = |rate: f64, out: &CollectSink<(u64, u64)>| {
        let mut job = Job::new("incremental-windows")
            .with_checkpoints(dir.path(), Duration::from_millis(30))
            .with_max_key_groups(16);
        if on_fjall {
            runs.set(runs.get() + 1);
            let state = states.path().join(format!("run-{}", runs.get()));
            job = job.with_state_backend(weibo::state::FjallBackend::open(state).unwrap());
        }
        job.source(Generator::new(40_000, fill_then_trickle).with_rate(rate))
            .name("events")
            .with_timestamps(|_: &(u64, u64)| 0, WatermarkStrategy::monotonous())
            .key_by(|e: &(u64, u64)| e.0)
            .with_partitions(2)
            .window(Tumbling::of(Duration::from_secs(3600)))
            .reduce(|a, b| (a.0, a.1 + b.1))
            .name("hourly")
            .map(|r: WindowResult<u64, (u64, u64)>| (r.key, r.value.1))
            .sink(out.clone());
        job
    };
    let out = CollectSink::new();
    past_the_fill_deltas_are_small(build(20_000.0, &out).spawn().unwrap(), dir.path(), "hourly").await;

    // Restoring the chain gives the window results of a run that never stopped.
    let out = CollectSink::new();
    build(1e9, &out).run().await.unwrap();
    let mut want: BTreeMap<u64, u64> = BTreeMap::new();
    for i in 0..40_000 {
        let (k, v) = fill_then_trickle(i);
        *want.entry(k).or_default() += v;
    }
    let got: BTreeMap<u64, u64> = out.values().into_iter().collect();
    assert_eq!(got.len(), out.values().len(), "one result per key");
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_go_on_after_a_source_has_finished() {
    const SMALL: u64 = 100;
    let small_event = |i: u64| (i % 3, 1_000_000 + i);
    let dir = tempfile::tempdir().unwrap();
    let build = |dir: &Path, rate: f64, out: &CollectSink<(u64, (u64, u64))>| {
        let job = Job::new("mixed").with_checkpoints(dir, Duration::from_millis(30)).with_max_key_groups(16);
        let small = job.source(Generator::new(SMALL, small_event)).name("small");
        let big = job.source(Generator::new(EVENTS, event).with_rate(rate)).name("big");
        small.union(&big).sums(2, out);
        job
    };
    let out = CollectSink::new();
    let handle = build(dir.path(), 3_000.0, &out).spawn().unwrap();
    for _ in 0..1000 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let read = |name: &str| handle.metrics().operator(name).map_or(0, |m| m.records_out);
        if read("small") == SMALL && read("big") > 300 {
            break;
        }
    }
    // The small source has finished: checkpoints and savepoints go on.
    let savepoint = handle.savepoint("after-small").await.unwrap();
    let first = handle.last_checkpoint().unwrap();
    for _ in 0..500 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if handle.last_checkpoint().is_some_and(|n| n >= first + 2) {
            break;
        }
    }
    assert!(handle.last_checkpoint().unwrap() >= first + 2, "checkpoints continue");
    handle.abort();
    let manifest = weibo::checkpoint::read_manifest(&savepoint).unwrap();
    let position = |name: &str| manifest.sources.iter().find(|s| s.source == name).map(|s| s.position);
    assert_eq!(position("small"), Some(SMALL), "a finished source is recorded at its end: {manifest:?}");
    assert!(position("big").is_some_and(|p| p > 0 && p < EVENTS), "{manifest:?}");

    // Restored, the job reads only the rest of `big` and ends with the state
    // of a run never stopped.
    let other = tempfile::tempdir().unwrap();
    let out = CollectSink::new();
    let report = build(other.path(), 1e9, &out).restore_from(&savepoint).run().await.unwrap();
    assert_eq!(report.metrics.operator("small").map_or(0, |m| m.records_out), 0);
    let mut want = expected();
    for i in 0..SMALL {
        let (k, v) = small_event(i);
        count_and_sum(want.entry(k).or_default(), (k, v));
    }
    assert_eq!(finals(out.values()), want);
}

/// Counts up forever, one number per read; while `stalled` is set a read
/// waits (without blocking its thread), so barriers queue behind it.
struct Stalling {
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

struct StallingReader {
    next: u64,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl weibo::sources::Source for Stalling {
    type Item = u64;
    fn default_name(&self) -> String {
        "stalling".into()
    }
    fn describe(&self) -> String {
        "counts, stalling on request".into()
    }
    fn partitions(&self) -> usize {
        1
    }
    fn open(&self, _: usize) -> weibo::Result<Box<dyn weibo::sources::SourceReader<u64>>> {
        Ok(Box::new(StallingReader { next: 0, stalled: self.stalled.clone() }))
    }
}

impl weibo::sources::SourceReader<u64> for StallingReader {
    fn read<'a>(
        &'a mut self,
        out: &'a mut weibo::sources::SourceOutput<u64>,
    ) -> weibo::BoxFuture<'a, weibo::Result<weibo::sources::ReadStatus>> {
        Box::pin(async move {
            while self.stalled.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            out.push(self.next, 0, None);
            self.next += 1;
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok(weibo::sources::ReadStatus::More)
        })
    }
    fn position(&self) -> Option<u64> {
        Some(self.next)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_that_takes_too_long_is_abandoned_and_the_next_completes() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let stalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let job = Job::new("slow")
        .with_checkpoints(dir.path(), Duration::from_secs(3600))
        .with_checkpoint_timeout(Duration::from_millis(100));
    job.source(Stalling { stalled: stalled.clone() })
        .key_by(|n: &u64| n % 3)
        .reduce(|a, b| a + b)
        .sink(weibo::sinks::Blackhole::new());
    let handle = job.spawn().unwrap();
    // The source cannot pass the barrier on while it stalls.
    let err = tokio::time::timeout(Duration::from_secs(10), handle.savepoint("while-stalled"))
        .await
        .expect("abandoned after the timeout set, not the default (ten intervals)")
        .unwrap_err();
    assert!(err.to_string().contains("did not complete in time"), "{err}");
    assert_eq!(handle.last_checkpoint(), None, "nothing completed while the source stalled");
    // Once it moves again, checkpoints complete again.
    stalled.store(false, Ordering::SeqCst);
    let after = handle.savepoint("after").await.unwrap();
    assert!(after.join("MANIFEST").is_file());
    assert!(handle.last_checkpoint().is_some());
    handle.abort();
}

#[test]
fn checkpoint_options_need_checkpoints_turned_on_first() {
    for job in [
        Job::new("early").with_retained_checkpoints(2),
        Job::new("early").with_checkpoint_timeout(Duration::from_secs(1)),
    ] {
        job.source(Generator::new(10, |i| i)).sink(CollectSink::new());
        let err = weibo::testing::block_on(job.run()).unwrap_err();
        assert!(err.to_string().contains("before `with_checkpoints`"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_checkpoints_after_the_first_write_only_what_changed() {
    incremental_timer_checkpoints(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_checkpoints_of_fjall_state_after_the_first_write_only_what_changed() {
    incremental_timer_checkpoints(true).await;
}

/// A keyed `process` that keeps one timer per key, moved on every event
/// (the old one deleted, a new one set), over [`fill_then_trickle`]: once
/// filled there are 10,000 timers, of which the trickle moves 5, so timer
/// checkpoints after the fill are deltas (a removal and an entry per moved
/// timer). Every tenth event of the trickle also sets a timer of its own,
/// never moved (a timer only a delta holds, which no later event sets
/// again). Restoring the chain must give back exactly the timers a run that
/// never stopped has: each key's moving timer fires once, at the end, at
/// its last time, and every own timer fires once.
async fn incremental_timer_checkpoints(on_fjall: bool) {
    use weibo::KeyedContext;
    use weibo::time::WatermarkStrategy;
    const FAR: i64 = 1 << 40;
    const OWN: i64 = 1 << 41;
    fn own(i: u64) -> bool {
        (10_000..30_000).contains(&i) && i.is_multiple_of(10)
    }
    let dir = tempfile::tempdir().unwrap();
    let states = tempfile::tempdir().unwrap();
    let runs = std::cell::Cell::new(0);
    let build = |rate: f64, out: &CollectSink<(u64, u64, i64)>| {
        let mut job = Job::new("incremental-timers")
            .with_checkpoints(dir.path(), Duration::from_millis(30))
            .with_max_key_groups(16);
        if on_fjall {
            runs.set(runs.get() + 1);
            let state = states.path().join(format!("run-{}", runs.get()));
            job = job.with_state_backend(weibo::state::FjallBackend::open(state).unwrap());
        }
        job.source(Generator::new(40_000, fill_then_trickle).with_rate(rate))
            .name("events")
            .with_timestamps(|_: &(u64, u64)| 0, WatermarkStrategy::monotonous())
            .key_by(|e: &(u64, u64)| e.0)
            .with_partitions(2)
            .process_with_timers(
                weibo::on_error::Fail,
                |ctx: &mut KeyedContext<'_, u64, (u64, i64), (u64, u64, i64)>, e: &(u64, u64)| {
                    let (sum, timer) = ctx.state().unwrap_or((0, 0));
                    if timer != 0 {
                        ctx.delete_timer(timer);
                    }
                    let next = FAR + e.1 as i64;
                    ctx.register_timer(next);
                    if own(e.1) {
                        ctx.register_timer(OWN + e.1 as i64);
                    }
                    *ctx.state() = Some((sum + e.1, next));
                    Ok::<(), String>(())
                },
                |ctx, time| {
                    let key = *ctx.key();
                    if time >= OWN {
                        ctx.emit((key, 0, time));
                    } else if let Some((sum, _)) = *ctx.state() {
                        ctx.emit((key, sum, time));
                    }
                    Ok(())
                },
            )
            .name("moving")
            .sink(out.clone());
        job
    };
    let out = CollectSink::new();
    past_the_fill_deltas_are_small(build(20_000.0, &out).spawn().unwrap(), dir.path(), "moving").await;
    let (_, newest) = weibo::checkpoint::complete_checkpoints(dir.path()).into_iter().next().unwrap();
    let manifest = weibo::checkpoint::read_manifest(&newest).unwrap();
    assert!(
        manifest.states.iter().any(|s| s.operator == "moving" && s.state == "timers" && !s.base),
        "the timers' chain has deltas: {:?}",
        manifest.states
    );

    let out = CollectSink::new();
    build(1e9, &out).run().await.unwrap();
    let mut last: BTreeMap<u64, (u64, i64)> = BTreeMap::new();
    let mut want = Vec::new();
    for i in 0..40_000 {
        let (k, v) = fill_then_trickle(i);
        let (sum, _) = last.get(&k).copied().unwrap_or((0, 0));
        last.insert(k, (sum + v, FAR + v as i64));
        if own(i) {
            want.push((k, 0, OWN + i as i64));
        }
    }
    want.extend(last.into_iter().map(|(k, (sum, time))| (k, sum, time)));
    want.sort_unstable();
    let mut got: Vec<(u64, u64, i64)> = out.values();
    got.sort_unstable();
    let moving = got.iter().filter(|(_, _, t)| *t < OWN).count();
    assert_eq!(moving, 10_000, "each key's moving timer fires once: none restored that was deleted");
    assert_eq!(got, want);
}
