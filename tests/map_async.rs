//! `map_async`: results in input order (or not), the bound on calls in
//! flight, timeouts and retries under the failure policy, watermarks held
//! behind the records before them, the cache, and the records in flight at
//! a checkpoint called for again after a restore.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use weibo::testing::{Harness, TestJob};
use weibo::{AsyncOptions, Job, on_error};

/// A call that takes `ms` milliseconds and answers `id * 10`, counting
/// the calls and the most in flight at once.
#[derive(Clone, Default)]
struct Service {
    calls: Arc<AtomicUsize>,
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Service {
    fn call(&self, id: u32, ms: u64) -> impl Future<Output = Result<u32, String>> + Send + use<> {
        let s = self.clone();
        async move {
            s.calls.fetch_add(1, Ordering::SeqCst);
            let now = s.now.fetch_add(1, Ordering::SeqCst) + 1;
            s.most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            s.now.fetch_sub(1, Ordering::SeqCst);
            Ok(id * 10)
        }
    }
}

/// In input order by default, whatever the calls' latencies; as they
/// complete with `unordered`; never more calls in flight per instance than
/// the bound.
#[test]
fn results_in_order_or_as_they_complete_within_the_bound() {
    for ordered in [true, false] {
        let service = Service::default();
        let mut t = TestJob::new("lookup");
        let ids = t.input((0..60u32).collect()).key_by(|id: &u32| *id);
        let s = service.clone();
        let options = if ordered { AsyncOptions::new() } else { AsyncOptions::new().unordered() };
        // Later records answer sooner: 30 ms down to 1 ms.
        let out = ids.map_async(on_error::Fail, options.in_flight(6), move |id: &u32, _: &u32| {
            s.call(*id, 30 - u64::from(*id) / 2)
        });
        let out = t.collect(&out);
        t.run().unwrap();
        let got = out.values();
        let want: Vec<u32> = (0..60).map(|i| i * 10).collect();
        if ordered {
            assert_eq!(got, want);
        } else {
            assert_ne!(got, want, "unordered: the faster later calls came out first");
            let mut sorted = got.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, want);
        }
        assert_eq!(service.calls.load(Ordering::SeqCst), 60);
        let most = service.most.load(Ordering::SeqCst);
        assert!((3..=6).contains(&most), "at most 6 calls in flight, and several: {most}");
    }
}

/// A failing call is retried with backoff; one that fails (an error, or
/// no answer within the timeout) on its last attempt fails its record
/// under the policy: here, to the dead letters, naming the failure.
#[test]
fn timeouts_and_retries_then_the_policy() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let mut t = TestJob::new("flaky");
    let ids = t.input(vec![1u32, 2, 3]).key_by(|id: &u32| *id);
    let seen = attempts.clone();
    let (ok, dead) = ids.map_async(
        on_error::DeadLetter,
        AsyncOptions::new().timeout(Duration::from_millis(50)).retries(2, Duration::from_millis(5)),
        move |id: &u32, _: &u32| {
            let (id, n) = (*id, seen.fetch_add(1, Ordering::SeqCst));
            async move {
                match id {
                    // Fails twice, then answers: within two retries.
                    1 if n < 2 => Err(format!("busy ({n})")),
                    // Never answers in time.
                    2 => {
                        tokio::time::sleep(Duration::from_secs(3_600)).await;
                        Ok(0)
                    }
                    3 => Err("no such user".to_string()),
                    _ => Ok(id * 10),
                }
            }
        },
    );
    let ok = t.collect(&ok);
    let dead = t.collect(&dead);
    t.run().unwrap();
    assert_eq!(ok.values(), [10]);
    let mut dead: Vec<(u32, String)> = dead.values().into_iter().map(|d| (d.record, d.error)).collect();
    dead.sort();
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert_eq!(dead[0].0, 2);
    assert!(dead[0].1.contains("no answer within 50ms (after 3 attempts)"), "{}", dead[0].1);
    assert_eq!(dead[1].0, 3);
    assert!(dead[1].1.contains("no such user (after 3 attempts)"), "{}", dead[1].1);
}

/// A watermark comes out after the results of the records before it: when
/// the harness sees watermark 5, the five slow results are out.
#[test]
fn a_watermark_waits_for_the_results_before_it() {
    let service = Service::default();
    let mut h = Harness::<u32>::new("held");
    let s = service.clone();
    let out =
        h.input()
            .key_by(|id: &u32| *id)
            .map_async(on_error::Fail, AsyncOptions::new(), move |id: &u32, _: &u32| s.call(*id, 100));
    let out = h.output(&out);
    let mut run = h.start().unwrap();
    for id in 1..=5 {
        run.push(id, i64::from(id)).unwrap();
    }
    run.watermark(5).unwrap();
    assert_eq!(out.take(), [10, 20, 30, 40, 50]);
    run.finish().unwrap();
}

/// With a cache, a key's result is reused for its time to live: one call
/// per key for repeated records.
#[test]
fn the_cache_saves_calls_per_key() {
    let service = Service::default();
    let mut t = TestJob::new("cached");
    let ids = t.input((0..40u32).map(|i| i % 4).collect()).key_by(|id: &u32| *id);
    let s = service.clone();
    let out = ids.map_async(
        on_error::Fail,
        AsyncOptions::new().in_flight(1).cache(Duration::from_secs(60), 100),
        move |id: &u32, _: &u32| s.call(*id, 1),
    );
    let out = t.collect(&out);
    t.run().unwrap();
    assert_eq!(out.values().len(), 40);
    assert_eq!(service.calls.load(Ordering::SeqCst), 4, "one call per key");
}

/// The records whose calls were in flight at a savepoint are part of it:
/// restored onto three instances, their calls are made again, and every
/// record read before the savepoint has its result.
#[test]
fn calls_in_flight_at_a_savepoint_are_made_again_after_a_restore() {
    use weibo::sinks::CollectSink;
    use weibo::sources::{Generator, IterSource};
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("lookup").with_checkpoints(dir.path(), Duration::from_secs(3600)).with_max_key_groups(16);
    let before = CollectSink::new();
    // Calls that never answer before the savepoint.
    job.source(Generator::new(u64::MAX, |i| i as u32).with_rate(100.0))
        .uid("ids")
        .key_by(|id: &u32| *id)
        .map_async(on_error::Fail, AsyncOptions::new().in_flight(50), |_: &u32, _: &u32| async {
            tokio::time::sleep(Duration::from_secs(3_600)).await;
            Ok::<u32, String>(0)
        })
        .uid("lookup")
        .sink(before.clone());
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(300));
    assert!(before.values().is_empty());

    let job = Job::new("lookup")
        .with_checkpoints(dir.path().join("v2"), Duration::from_secs(3600))
        .with_max_key_groups(16)
        .restore_from(&savepoint)
        .allow_unrestored_state();
    let after = CollectSink::new();
    job.source(IterSource::new(Vec::<u32>::new()))
        .uid("ids-after")
        .key_by(|id: &u32| *id)
        .with_partitions(3)
        .map_async(on_error::Fail, AsyncOptions::new(), |id: &u32, _: &u32| {
            let id = *id;
            async move { Ok::<u32, String>(id + 1_000) }
        })
        .uid("lookup")
        .sink(after.clone());
    job.run_blocking().unwrap();
    let mut got = after.values();
    got.sort_unstable();
    assert!(!got.is_empty(), "records were in flight at the savepoint");
    assert!(got.len() <= 100, "no more than the bound in flight and queued: {}", got.len());
    let want: Vec<u32> = (0..got.len() as u32).map(|i| i + 1_000).collect();
    assert_eq!(got, want, "every record read before the savepoint, once");
}
