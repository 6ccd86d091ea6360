//! Exactly-once sinks that commit the sources' positions with their records
//! (`TwoPhaseCommitSink::commits_positions`): each completed checkpoint hands
//! the sink all of its handles at once, carried ones included, with that
//! checkpoint's positions, so that after every commit the records the sink
//! shows are exactly those before the positions it holds: what a job
//! restarted from those positions needs to write nothing twice and lose
//! nothing. Also on restore, after failed commits, after the final
//! checkpoint; and a job without checkpoints is refused.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weibo::checkpoint::{MemoryStorage, SourcePositionEntry};
use weibo::record::CheckpointId;
use weibo::sinks::{SinkBatch, TransactionWriter, TwoPhaseCommitSink};
use weibo::sources::Generator;
use weibo::{Error, Job, Result};

const RECORDS: u64 = 4_000;

/// What the sink holds, as a database would: committed records and the
/// positions committed with them, and the pre-committed epochs.
#[derive(Default)]
struct Book {
    pending: HashMap<String, Vec<u64>>,
    committed: Vec<u64>,
    positions: BTreeMap<u32, u64>,
    /// Every call: its handles' instances and how many handles.
    calls: Vec<Vec<usize>>,
    /// Calls to fail on purpose (counted down).
    fail: u32,
    /// The calls that failed on purpose.
    failed: u32,
    /// What broke the contract.
    violations: Vec<String>,
}

impl Book {
    /// After a commit: the committed records are exactly those before the
    /// committed positions (partition `i % 2` holds record `i`; a
    /// position is the next record's index), each once.
    fn check(&mut self) {
        let unique: BTreeSet<u64> = self.committed.iter().copied().collect();
        if unique.len() != self.committed.len() {
            self.violations.push(format!("{} records committed twice", self.committed.len() - unique.len()));
        }
        let expected: BTreeSet<u64> = (0..RECORDS)
            .filter(|i| self.positions.get(&u32::try_from(i % 2).unwrap()).is_some_and(|p| i < p))
            .collect();
        if unique != expected {
            let missing = expected.difference(&unique).count();
            let extra = unique.difference(&expected).count();
            self.violations.push(format!(
                "records and positions {:?} disagree: {missing} before the positions not committed, {extra} after them committed",
                self.positions
            ));
        }
    }
}

#[derive(Clone, Default)]
struct PositionsSink(Arc<Mutex<Book>>);

impl PositionsSink {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.0.lock().unwrap()
    }
}

fn handle(instance: usize, epoch: CheckpointId) -> String {
    format!("{instance}/{}", epoch.get())
}

fn instance_of(h: &str) -> usize {
    h.split('/').next().unwrap().parse().unwrap()
}

impl TwoPhaseCommitSink<u64> for PositionsSink {
    fn default_name(&self) -> String {
        "positions".into()
    }

    fn open(
        &self,
        instance: usize,
        _parallelism: usize,
        epoch: CheckpointId,
    ) -> Result<Box<dyn TransactionWriter<u64>>> {
        Ok(Box::new(Writer { sink: self.clone(), instance, epoch, buf: Vec::new() }))
    }

    fn commit(&self, handle: &str) -> Result<()> {
        self.book().violations.push(format!("commit({handle}) called"));
        Ok(())
    }

    fn commit_at(&self, handle: &str, _sources: &[SourcePositionEntry]) -> Result<()> {
        self.book().violations.push(format!("commit_at({handle}) called"));
        Ok(())
    }

    fn commits_positions(&self) -> bool {
        true
    }

    fn commit_checkpoint(&self, handles: &[String], sources: &[SourcePositionEntry]) -> Result<()> {
        let mut book = self.book();
        book.calls.push(handles.iter().map(|h| instance_of(h)).collect());
        if book.fail > 0 {
            book.fail -= 1;
            book.failed += 1;
            return Err(Error::Connector {
                name: "positions".into(),
                message: "refused on purpose".into(),
                source: None,
            });
        }
        if sources.is_empty() {
            book.violations.push(format!("{handles:?} committed without positions"));
        }
        let mut fresh = false;
        for h in handles {
            if let Some(records) = book.pending.remove(h) {
                book.committed.extend(records);
                fresh = true;
            }
        }
        if fresh {
            book.positions = sources.iter().map(|s| (s.partition, s.position)).collect();
        }
        book.check();
        Ok(())
    }

    fn abort_after(&self, checkpoint: CheckpointId) -> Result<u64> {
        let mut book = self.book();
        let before = book.pending.len();
        book.pending.retain(|h, _| h.split('/').nth(1).unwrap().parse::<u64>().unwrap() <= checkpoint.get());
        Ok((before - book.pending.len()) as u64)
    }
}

struct Writer {
    sink: PositionsSink,
    instance: usize,
    epoch: CheckpointId,
    buf: Vec<u64>,
}

impl Writer {
    fn seal(&mut self) -> String {
        let h = handle(self.instance, self.epoch);
        let records = std::mem::take(&mut self.buf);
        self.sink.book().pending.insert(h.clone(), records);
        h
    }
}

impl TransactionWriter<u64> for Writer {
    fn write(&mut self, batch: &mut SinkBatch<'_, u64>) -> Result<()> {
        self.buf.extend(batch.drain());
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<String> {
        let h = self.seal();
        self.epoch = checkpoint.next();
        Ok(h)
    }

    fn finish(&mut self) -> Result<String> {
        Ok(self.seal())
    }
}

fn job(storage: &MemoryStorage, sink: &PositionsSink, rate: f64) -> Job {
    let job = Job::new("positions").with_checkpoint_storage(storage.clone(), Duration::from_millis(40));
    job.source(Generator::new(RECORDS, |i| i).with_rate(rate).with_partitions(2))
        .name("numbers")
        .map(|i: u64| i)
        .sink_exactly_once(sink.clone());
    job
}

fn assert_all_once(sink: &PositionsSink) {
    let book = sink.book();
    assert!(book.violations.is_empty(), "{:?}", book.violations);
    let mut all = book.committed.clone();
    all.sort_unstable();
    assert_eq!(all, (0..RECORDS).collect::<Vec<_>>(), "every record once");
    assert_eq!(book.positions, BTreeMap::from([(0, RECORDS), (1, RECORDS + 1)]), "the sources' ends");
    assert!(book.pending.is_empty(), "nothing left pre-committed: {:?}", book.pending.keys());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_commit_holds_all_of_a_checkpoints_handles_with_its_positions() {
    let (storage, sink) = (MemoryStorage::new(), PositionsSink::default());
    job(&storage, &sink, 20_000.0).run().await.unwrap();
    assert_all_once(&sink);
    let book = sink.book();
    assert!(book.calls.len() >= 3, "several checkpoints: {:?}", book.calls);
    let both = book.calls.iter().filter(|c| c.contains(&0) && c.contains(&1)).count();
    assert!(both * 2 >= book.calls.len(), "a call holds both instances' handles: {:?}", book.calls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_that_fail_are_carried_and_committed_with_a_later_checkpoints_positions() {
    let (storage, sink) = (MemoryStorage::new(), PositionsSink::default());
    sink.book().fail = 3;
    job(&storage, &sink, 20_000.0).run().await.unwrap();
    assert_all_once(&sink);
    let book = sink.book();
    assert_eq!(book.failed, 3);
    let carried = book.calls.iter().skip(3).any(|c| c.iter().filter(|&&i| i == 0).count() > 1);
    assert!(carried, "a later call carries the failed ones' handles: {:?}", book.calls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_owed_after_the_final_checkpoint_are_retried_with_its_positions() {
    let (storage, sink) = (MemoryStorage::new(), PositionsSink::default());
    // Fast: few checkpoints; the final one's commit fails twice more.
    let job = Job::new("positions").with_checkpoint_storage(storage.clone(), Duration::from_secs(30));
    job.source(Generator::new(RECORDS, |i| i).with_partitions(2)).sink_exactly_once(sink.clone());
    sink.book().fail = 2;
    job.run().await.unwrap();
    assert_all_once(&sink);
    assert_eq!(sink.book().failed, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_job_commits_its_checkpoints_handles_with_its_positions() {
    let (storage, sink) = (MemoryStorage::new(), PositionsSink::default());
    // Every commit fails: the manifests carry the handles along.
    sink.book().fail = u32::MAX;
    let running = job(&storage, &sink, 4_000.0).spawn().unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    running.abort();
    let _ = running.wait().await;
    {
        let mut book = sink.book();
        assert!(book.committed.is_empty());
        assert!(book.failed >= 2, "commits were tried: {}", book.failed);
        book.fail = 0;
    }
    // The restart restores the newest checkpoint and commits what it holds.
    job(&storage, &sink, 20_000.0).run().await.unwrap();
    assert_all_once(&sink);
    let book = sink.book();
    let first_ok = book.calls.get(usize::try_from(book.failed).unwrap()).unwrap();
    assert!(first_ok.len() >= 4, "the restore committed several epochs at once: {first_ok:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_without_checkpoints_is_refused() {
    let sink = PositionsSink::default();
    let job = Job::new("positions");
    job.source(Generator::new(10, |i| i)).sink_exactly_once(sink.clone());
    let err = job.run().await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Graph { .. }), "{text}");
    assert!(text.contains("positions") && text.contains("checkpoints"), "{text}");
    assert!(sink.book().calls.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sinks_committing_positions_are_refused() {
    let (storage, a, b) = (MemoryStorage::new(), PositionsSink::default(), PositionsSink::default());
    let job = Job::new("positions").with_checkpoint_storage(storage, Duration::from_millis(40));
    let input = job.source(Generator::new(10, |i| i));
    input.clone().name("a").map(|i: u64| i).sink_exactly_once(a.clone());
    input.map(|i: u64| i).sink_exactly_once(b.clone());
    let err = job.run().await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Graph { .. }), "{text}");
    assert!(text.contains("one sink per job"), "{text}");
    assert!(a.book().calls.is_empty() && b.book().calls.is_empty());
}
