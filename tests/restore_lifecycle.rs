//! A job's checkpoints over its life: they go on after a source has
//! finished; one that takes too long is abandoned and the next completes;
//! checkpoint options need checkpoints turned on first; a job aborted
//! mid-checkpoint leaves no coordinator thread panicking.

use std::path::Path;
use std::time::Duration;

use weibo::Job;
use weibo::sinks::CollectSink;
use weibo::sources::Generator;
use weibo_tests::restore::*;

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
        if handle.last_checkpoint().is_some_and(|n| n >= first.get() + 2) {
            break;
        }
    }
    assert!(handle.last_checkpoint().unwrap() >= first.get() + 2, "checkpoints continue");
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
/// `waiting` is set once a read waits.
struct Stalling {
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
    waiting: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

struct StallingReader {
    next: u64,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
    waiting: std::sync::Arc<std::sync::atomic::AtomicBool>,
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
        Ok(Box::new(StallingReader { next: 0, stalled: self.stalled.clone(), waiting: self.waiting.clone() }))
    }
}

impl weibo::sources::SourceReader<u64> for StallingReader {
    fn read<'a>(
        &'a mut self,
        out: &'a mut weibo::sources::SourceOutput<u64>,
    ) -> weibo::BoxFuture<'a, weibo::Result<weibo::sources::ReadStatus>> {
        Box::pin(async move {
            while self.stalled.load(std::sync::atomic::Ordering::SeqCst) {
                self.waiting.store(true, std::sync::atomic::Ordering::SeqCst);
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
    let waiting = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let job = Job::new("slow")
        .with_checkpoints(dir.path(), Duration::from_secs(3600))
        .with_checkpoint_timeout(Duration::from_millis(100));
    job.source(Stalling { stalled: stalled.clone(), waiting: waiting.clone() })
        .key_by(|n: &u64| n % 3)
        .reduce(|a, b| a + b)
        .sink(weibo::sinks::Blackhole::new());
    let handle = job.spawn().unwrap();
    // The source cannot pass the barrier on while it stalls: once its first
    // read waits (before, the source task could take the barrier before it
    // reads at all).
    while !waiting.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let err = tokio::time::timeout(Duration::from_secs(10), handle.savepoint("while-stalled"))
        .await
        .expect("abandoned after the timeout set, not the default (ten intervals)")
        .unwrap_err();
    assert!(err.to_string().contains("did not complete in time"), "{err}");
    assert_eq!(handle.last_checkpoint(), None, "nothing completed while the source stalled");
    // Once it moves again, checkpoints complete again. (On a loaded machine
    // one may still miss the short timeout, writing its files: a few tries.)
    stalled.store(false, Ordering::SeqCst);
    let mut after = None;
    for attempt in 0..10 {
        match handle.savepoint(&format!("after-{attempt}")).await {
            Ok(path) => {
                after = Some(path);
                break;
            }
            Err(e) if e.to_string().contains("did not complete in time") => continue,
            Err(e) => panic!("savepoint after the source moved again: {e}"),
        }
    }
    let after = after.expect("no checkpoint completed in ten tries after the source moved again");
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

/// A job on fjall aborted while its checkpoint coordinator is busy
/// (checkpoints every 5 ms, aborted at varied moments) leaves no thread of the
/// coordinator panicking: its runtime shuts down once the aborted task
/// has ended. (It used to shut down at once, under a task whose storage
/// call had handed the runtime's worker on; the task's next tick then
/// panicked on the stopped timers, in about one abort in six.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_aborted_mid_checkpoint_leaves_no_coordinator_thread_panicking() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let panics = Arc::new(AtomicUsize::new(0));
    let counted = panics.clone();
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name().is_some_and(|n| n.starts_with("weibo-checkpoints")) {
            counted.fetch_add(1, Ordering::SeqCst);
        }
        default(info);
    }));
    for i in 0..24u64 {
        let dir = tempfile::tempdir().unwrap();
        let backend = weibo::state::FjallBackend::open(dir.path().join("fjall")).unwrap();
        let job = Job::new("aborted")
            .with_state_backend(backend)
            .with_checkpoints(dir.path().join("checkpoints"), Duration::from_millis(5))
            .with_max_key_groups(16);
        job.source(Generator::new(10_000_000, |i| i).with_rate(200_000.0))
            .key_by(|i: &u64| i % 1000)
            .fold(|| 0u64, |n: &mut u64, _i: u64| *n += 1)
            .sink(weibo::sinks::Blackhole::new());
        let handle = job.spawn().unwrap();
        while handle.last_checkpoint().is_none() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(i % 6)).await;
        handle.abort();
    }
    // The threads that end the coordinators' runtimes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(panics.load(Ordering::SeqCst), 0, "a coordinator's thread panicked (above)");
}
