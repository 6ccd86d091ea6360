//! The end of the input with checkpoints: the final checkpoint holds the
//! sources' ends and commits what exactly-once sinks still hold; a finished
//! job started again writes nothing; a final checkpoint the storage
//! refuses is taken again until it completes, or fails the job naming it;
//! plain sinks get nothing after `finish`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use weibo::Job;
use weibo::checkpoint::{CheckpointStorage, MemoryStorage};
use weibo::sinks::{Sink, SinkBatch, SinkWriter, TxnFileSink};
use weibo::sources::Generator;
use weibo_tests::flaky_storage::Flaky;

fn committed(dir: &std::path::Path) -> Vec<u64> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.path().is_file() {
            out.extend(std::fs::read_to_string(entry.path()).unwrap().lines().map(|l| l.parse::<u64>().unwrap()));
        }
    }
    out.sort_unstable();
    out
}

fn counting_job(storage: impl CheckpointStorage, out: &std::path::Path, rate: f64) -> Job {
    counting_job_timing_out(storage, out, rate, Duration::from_millis(300))
}

/// Checkpoints every 50 ms, abandoned after `timeout`.
fn counting_job_timing_out(
    storage: impl CheckpointStorage,
    out: &std::path::Path,
    rate: f64,
    timeout: Duration,
) -> Job {
    let job =
        Job::new("final").with_checkpoint_storage(storage, Duration::from_millis(50)).with_checkpoint_timeout(timeout);
    job.source(Generator::new(2_000, |i| i).with_rate(rate).with_partitions(2))
        .key_by(|i: &u64| i % 5)
        .with_partitions(2)
        .reduce(|a, b| a.max(b))
        .sink_exactly_once(TxnFileSink::json_lines(out));
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_job_ends_with_a_final_checkpoint_and_started_again_writes_nothing() {
    let storage = MemoryStorage::new();
    let out = tempfile::tempdir().unwrap();
    counting_job(storage.clone(), out.path(), 20_000.0).run().await.unwrap();
    let first = committed(out.path());
    assert_eq!(first.len(), 2_000, "every record once");
    let newest = weibo::checkpoint::complete_checkpoints_in(&storage, "").unwrap();
    let manifest = weibo::checkpoint::read_manifest_in(&storage, &newest[0].1).unwrap();
    let mut ends: Vec<u64> = manifest.sources.iter().map(|s| s.position).collect();
    ends.sort_unstable();
    assert_eq!(ends, vec![2_000, 2_001], "the final checkpoint holds each partition's end (every other index)");
    // Each writer's last epoch is committed: with the final checkpoint, or
    // with a periodic one whose barrier came after that writer's input had
    // ended (a matter of timing). Either way nothing is left pending.
    let pending: Vec<_> = std::fs::read_dir(out.path().join(".pending"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.metadata().is_ok_and(|m| m.len() > 0))
        .map(|e| e.file_name())
        .collect();
    assert!(
        pending.is_empty(),
        "every writer's last epoch committed, none pending: {pending:?} ({:?})",
        manifest.commits
    );
    // Started again, slowly: it restores the final checkpoint, reads and
    // writes nothing, and finishes with a final checkpoint of its own.
    let again = counting_job(storage.clone(), out.path(), 100.0).run().await.unwrap();
    assert_eq!(again.metrics.operator("generator").map_or(0, |m| m.records_out), 0, "nothing read again");
    assert_eq!(committed(out.path()), first, "nothing written twice");
    assert!(weibo::checkpoint::complete_checkpoints_in(&storage, "").unwrap()[0].0 > newest[0].0);
}

/// Checkpoints longer than the interval: when the input ends during one,
/// the next is the final one, holding the records read after the last
/// barrier, not a regular one that takes them and leaves the final empty.
/// (When the coordinator did not look first at the ends reported while a
/// checkpoint committed, the interval's tick, ready too, won about half
/// the time: five runs in a row passed by chance one time in thirty.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_input_ends_during_a_long_checkpoint_the_next_one_is_the_final_one() {
    for run in 0..5 {
        let storage = Flaky::default();
        // Every manifest takes 150 ms, three intervals.
        storage.slow_puts_ms.store(150, Ordering::SeqCst);
        let out = tempfile::tempdir().unwrap();
        counting_job(storage.clone(), out.path(), 5_000.0).run().await.unwrap();
        assert_eq!(committed(out.path()).len(), 2_000, "run {run}: every record once");
        let newest = weibo::checkpoint::complete_checkpoints_in(&storage.inner, "").unwrap();
        let last = newest[0].0;
        let epoch = format!("-{:020}-", last.get());
        let in_final: usize = std::fs::read_dir(out.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(&epoch))
            .map(|e| std::fs::read_to_string(e.path()).unwrap().lines().count())
            .sum();
        assert!(in_final > 0, "run {run}: the final checkpoint ({}) committed none of the last records", last.get());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_checkpoint_the_storage_refuses_is_taken_again_until_it_completes() {
    let storage = Flaky::default();
    let out = tempfile::tempdir().unwrap();
    let handle =
        counting_job_timing_out(storage.clone(), out.path(), 20_000.0, Duration::from_secs(5)).spawn().unwrap();
    // The input ends within 0.1 s; its final checkpoint meets a storage
    // that refuses manifests for 0.6 s (the timeout is 5 s).
    storage.failing_puts.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!handle.is_finished(), "the job waits for its final checkpoint");
    assert!(storage.refused.load(Ordering::SeqCst) >= 2, "and took it again");
    storage.failing_puts.store(false, Ordering::SeqCst);
    handle.wait().await.unwrap();
    assert_eq!(committed(out.path()).len(), 2_000, "every record committed once, with the final checkpoint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_checkpoint_that_never_completes_fails_the_job_naming_it() {
    let storage = Flaky::default();
    storage.failing_puts.store(true, Ordering::SeqCst);
    let out = tempfile::tempdir().unwrap();
    let err = counting_job(storage.clone(), out.path(), 20_000.0).run().await.unwrap_err().report().to_string();
    assert!(err.contains("final checkpoint") && err.contains("injected outage"), "{err}");
    assert!(committed(out.path()).is_empty(), "nothing committed without a complete checkpoint");
}

/// A sink that closes at `finish` and refuses anything after it.
#[derive(Clone, Default)]
struct Closing {
    written: Arc<AtomicU64>,
}

struct ClosingWriter {
    written: Arc<AtomicU64>,
    closed: bool,
}

impl Sink<u64> for Closing {
    fn default_name(&self) -> String {
        "closing".into()
    }
    fn open(&self, _: usize, _: usize) -> weibo::Result<Box<dyn SinkWriter<u64>>> {
        Ok(Box::new(ClosingWriter { written: self.written.clone(), closed: false }))
    }
}

impl SinkWriter<u64> for ClosingWriter {
    fn write(&mut self, batch: &mut SinkBatch<'_, u64>) -> weibo::Result<()> {
        self.flush()?;
        self.written.fetch_add(batch.drain().count() as u64, Ordering::Relaxed);
        Ok(())
    }
    fn flush(&mut self) -> weibo::Result<()> {
        if self.closed {
            return Err(weibo::Error::Connector {
                name: "closing".into(),
                message: "used after finish".into(),
                source: None,
            });
        }
        Ok(())
    }
    fn finish(&mut self) -> weibo::Result<()> {
        self.flush()?;
        self.closed = true;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_sink_gets_no_barrier_after_its_finish() {
    let sink = Closing::default();
    let job = Job::new("closing").with_checkpoint_storage(MemoryStorage::new(), Duration::from_millis(20));
    job.source(Generator::new(500, |i| i).with_rate(5_000.0)).sink(sink.clone());
    job.run().await.unwrap();
    assert_eq!(sink.written.load(Ordering::Relaxed), 500);
}

/// A run that cannot tell, after a checkpoint's manifest, whether it still
/// holds its storage (the storage cannot be asked) keeps the checkpoint
/// and commits its output with a later one: with the final checkpoint's,
/// nothing lost and nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_a_run_cannot_clear_with_its_lease_wait_for_a_later_checkpoint() {
    let storage = Flaky::default();
    // Every check after a manifest cannot tell; every other one can.
    storage.uncertain_lease.store(true, Ordering::SeqCst);
    let out = tempfile::tempdir().unwrap();
    counting_job(storage.clone(), out.path(), 10_000.0).run().await.unwrap();
    assert_eq!(committed(out.path()).len(), 2_000, "every record once");
    let checkpoints = weibo::checkpoint::complete_checkpoints_in(&storage.inner, "").unwrap();
    assert!(checkpoints.len() > 1, "checkpoints completed: {checkpoints:?}");
    let pending = std::fs::read_dir(out.path().join(".pending")).unwrap().count();
    assert_eq!(pending, 0, "nothing left pending");
}
