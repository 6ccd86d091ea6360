//! Named keyed state in a running job: value, list, map, reducing and
//! aggregating state survive an abrupt stop and a restore onto another
//! number of workers; each state is a state of its own in the checkpoint
//! (the inspector lists them by name); upgrades add, drop and migrate a
//! state by name; processing-time timers that came due while the job was
//! down fire once after the restore.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use weibo::process::{ListState, MapState, OutputTag, ReducingState, States, ValueState};
use weibo::sinks::CollectSink;
use weibo::sources::{Generator, IterSource};
use weibo::window::Count;
use weibo::{Aggregate, Job, Timer, on_error};

const EVENTS: u64 = 4_000;

/// Event `i`: key `i % 11`, value `i`.
fn event(i: u64) -> (u64, u64) {
    (i % 11, i)
}

/// What the pipeline emits per record: the key and its states after it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
struct Seen {
    count: u64,
    /// The key's last three values, oldest first.
    recent: Vec<u64>,
    /// Per bucket (value % 4): how many values fell in it.
    buckets: Vec<(u8, u64)>,
    sum: u64,
    mean: u64,
}

/// The mean of what was added, as an `Aggregate`.
struct Mean;

impl Aggregate<u64> for Mean {
    type Acc = (u64, u64);
    type Out = u64;
    fn create(&self) -> (u64, u64) {
        (0, 0)
    }
    fn add(&self, acc: &mut (u64, u64), value: u64) {
        acc.0 += value;
        acc.1 += 1;
    }
    fn merge(&self, acc: &mut (u64, u64), other: (u64, u64)) {
        acc.0 += other.0;
        acc.1 += other.1;
    }
    fn result(&self, acc: &(u64, u64)) -> u64 {
        acc.0 / acc.1.max(1)
    }
}

struct Handles {
    count: ValueState<u64>,
    recent: ListState<u64>,
    buckets: MapState<u8, u64>,
    sum: ReducingState<u64>,
    mean: weibo::process::AggregatingState<u64, Mean>,
}

fn declare(states: &mut States<u64>) -> Handles {
    Handles {
        count: states.value("count"),
        recent: states.list("recent"),
        buckets: states.map("buckets"),
        sum: states.reducing("sum", |a: u64, b| a + b),
        mean: states.aggregating("mean", Mean),
    }
}

/// Where state lives in a run: in memory, or in fjall with a cache of
/// this many bytes in front of it (0: none).
#[derive(Clone, Copy, Debug)]
enum Backend {
    Memory,
    Fjall(usize),
}

fn job(dir: &Path, backend: Backend, partitions: usize, rate: f64, out: &CollectSink<(u64, Seen)>) -> Job {
    let mut job = Job::new("named").with_checkpoints(dir, Duration::from_millis(30)).with_max_key_groups(16);
    if let Backend::Fjall(cache) = backend {
        let state = dir.join(format!("state-{}", std::process::id()));
        let fjall = weibo::state::FjallBackend::builder(state)
            .with_object_cache(cache)
            .with_timers_on_disk(true)
            .open()
            .unwrap();
        job = job.with_state_backend(fjall);
    }
    // One partition: each key's values arrive in order, so its last three are known.
    job.source(Generator::new(EVENTS, event).with_partitions(1).with_rate(rate))
        .name("events")
        .key_by(|e: &(u64, u64)| e.0)
        .with_partitions(partitions)
        .process_with_state(on_error::Fail, declare, |ctx, s, e| {
            let count = ctx.value(&s.count).get().unwrap_or(0) + 1;
            ctx.value(&s.count).set(count);
            let mut recent = ctx.list(&s.recent).get();
            recent.push(e.1);
            if recent.len() > 3 {
                recent.remove(0);
                ctx.list(&s.recent).update(recent.clone());
            } else {
                ctx.list(&s.recent).add(e.1);
            }
            ctx.map(&s.buckets).update((e.1 % 4) as u8, |n| *n = Some(n.unwrap_or(0) + 1));
            ctx.reducing(&s.sum).add(e.1);
            ctx.aggregating(&s.mean).add(e.1);
            let seen = Seen {
                count,
                recent,
                buckets: ctx.map(&s.buckets).entries(),
                sum: ctx.reducing(&s.sum).get().unwrap_or(0),
                mean: ctx.aggregating(&s.mean).get().unwrap_or(0),
            };
            let key = *ctx.key();
            ctx.emit((key, seen));
        })
        .uid("named")
        .sink(out.clone());
    job
}

/// Each key's states after all its events, computed directly.
fn expected() -> BTreeMap<u64, Seen> {
    let mut all: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for i in 0..EVENTS {
        let (k, v) = event(i);
        all.entry(k).or_default().push(v);
    }
    all.into_iter()
        .map(|(k, values)| {
            let mut buckets: BTreeMap<u8, u64> = BTreeMap::new();
            for v in &values {
                *buckets.entry((v % 4) as u8).or_default() += 1;
            }
            let sum: u64 = values.iter().sum();
            let seen = Seen {
                count: values.len() as u64,
                recent: values[values.len() - 3..].to_vec(),
                buckets: buckets.into_iter().collect(),
                sum,
                mean: sum / values.len() as u64,
            };
            (k, seen)
        })
        .collect()
}

/// The last output per key (the one with the highest count).
fn finals(out: Vec<(u64, Seen)>) -> BTreeMap<u64, Seen> {
    let mut m: BTreeMap<u64, Seen> = BTreeMap::new();
    for (k, seen) in out {
        let e = m.entry(k).or_default();
        if seen.count > e.count {
            *e = seen;
        }
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_states_survive_an_abrupt_stop_and_a_restore_onto_more_workers() {
    for backend in [Backend::Memory, Backend::Fjall(0), Backend::Fjall(4_096)] {
        stop_and_restore(backend).await;
    }
}

async fn stop_and_restore(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let first = CollectSink::new();
    let handle = job(dir.path(), backend, 1, 4_000.0, &first).spawn().unwrap();
    let started = Instant::now();
    while handle.last_checkpoint().is_none_or(|n| n.get() < 3) {
        assert!(started.elapsed() < Duration::from_secs(60), "checkpoints complete while the job runs");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!handle.is_finished(), "stopped before the end of input");
    handle.abort();
    let newest = weibo::checkpoint::complete_checkpoints(dir.path())[0].1.clone();
    // Each declared state is a state of its own, under its name.
    let (inspection, _) = weibo::checkpoint::inspect::Inspection::open(&newest).unwrap();
    let op = inspection.operators.iter().find(|o| o.id == "named").unwrap();
    let names: BTreeSet<&str> = op.states.iter().map(|s| s.name.as_str()).collect();
    for name in ["count", "recent", "buckets", "sum", "mean", "timers", "processing_timers"] {
        assert!(names.contains(name), "state `{name}` in {names:?}");
    }
    let count = op.states.iter().find(|s| s.name == "count").unwrap();
    assert!(count.entries > 0 && count.entries <= 11, "{count:?}");
    let buckets = op.states.iter().find(|s| s.name == "buckets").unwrap();
    assert!(buckets.entries > count.entries, "a map's entries are entries of their own: {buckets:?}");

    let second = CollectSink::new();
    let handle = job(dir.path(), backend, 3, 1e9, &second).spawn().unwrap();
    assert!(handle.last_checkpoint().is_some(), "the job restored from a checkpoint");
    handle.wait().await.unwrap();
    let mut got = finals(first.values());
    got.extend(finals(second.values()));
    let want = expected();
    assert_eq!(got.len(), want.len());
    for (k, seen) in &want {
        assert_eq!(got.get(k), Some(seen), "{backend:?}, key {k}: no event lost or counted twice in any state");
    }
}

/// The upgrade pipeline: per key, a count in state `count` (of `C`), and
/// the values in list `seen` unless `with_seen` is false; `extra` declares
/// one more (empty) map state.
fn upgrade_job<C>(dir: &Path, to: u32, with_seen: bool, extra: bool, out: &CollectSink<(u32, u64, usize)>) -> Job
where
    C: weibo::Data + Copy + Into<u64> + From<u8> + std::ops::Add<Output = C>,
{
    let job = Job::new("upgrades").with_checkpoints(dir, Duration::from_secs(3600));
    job.source(IterSource::new(0..to))
        .uid("numbers")
        .key_by(|x: &u32| x % 3)
        .process_with_state(
            on_error::Fail,
            |states| {
                let count = states.value::<C>("count");
                let seen = with_seen.then(|| states.list::<u32>("seen"));
                let extra = extra.then(|| states.map::<u32, u32>("extra"));
                (count, seen, extra)
            },
            |ctx, (count, seen, extra), x| {
                let n = ctx.value(count).get().unwrap_or(C::from(0)) + C::from(1);
                ctx.value(count).set(n);
                let mut listed = 0;
                if let Some(seen) = seen {
                    ctx.list(seen).add(*x);
                    listed = ctx.list(seen).get().len();
                }
                if let Some(extra) = extra {
                    assert!(ctx.map(extra).is_empty(), "a state added by the upgrade starts empty");
                }
                let key = *ctx.key();
                ctx.emit((key, n.into(), listed));
            },
        )
        .uid("counts")
        .sink(out.clone());
    job
}

#[test]
fn upgrades_add_drop_and_migrate_states_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = CollectSink::new();
    upgrade_job::<u32>(dir.path(), 6, true, false, &out).run_blocking().unwrap();
    let v1 = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), v1.path());

    // A state added: restores, and starts empty; the others go on.
    let out = CollectSink::new();
    upgrade_job::<u32>(dir.path(), 9, true, true, &out).run_blocking().unwrap();
    let after: BTreeSet<(u32, u64, usize)> = out.values().into_iter().collect();
    assert!(after.contains(&(0, 3, 3)), "key 0's count and list went on from 2 to 3: {after:?}");

    // A state dropped: refused, naming it, unless unrestored state is allowed.
    let dropped = tempfile::tempdir().unwrap();
    copy_dir(v1.path(), dropped.path());
    let out = CollectSink::new();
    let err = upgrade_job::<u32>(dropped.path(), 9, false, false, &out).run_blocking().unwrap_err().to_string();
    assert!(err.contains("`seen`") && err.contains("allow_unrestored_state"), "{err}");
    let out = CollectSink::new();
    upgrade_job::<u32>(dropped.path(), 9, false, false, &out).allow_unrestored_state().run_blocking().unwrap();
    assert!(out.values().contains(&(0, 3, 0)), "the count went on without the list: {:?}", out.values());

    // A state's type changed: refused without a migration, migrated with one.
    let migrated = tempfile::tempdir().unwrap();
    copy_dir(v1.path(), migrated.path());
    let out = CollectSink::new();
    let err = upgrade_job::<u64>(migrated.path(), 9, true, false, &out).run_blocking().unwrap_err().to_string();
    assert!(err.contains("`count`"), "the refusal names the state: {err}");
    let out = CollectSink::new();
    let report = upgrade_job::<u64>(migrated.path(), 9, true, false, &out)
        .with_state_migration(|old: u32| u64::from(old))
        .run_blocking()
        .unwrap();
    let states: Vec<&str> = report.migrated.iter().map(|m| m.state.as_str()).collect();
    assert_eq!(states, ["count"], "only the state whose type changed: {:?}", report.migrated);
    assert!(out.values().contains(&(0, 3, 3)), "{:?}", out.values());
}

/// Per key, a count and a total in two states of the same type; `total`
/// declared with version `total_version` (`None`: the operator's, 1).
fn versioned_job(dir: &Path, to: u32, total_version: Option<u32>, out: &CollectSink<(u32, u64, u64)>) -> Job {
    let job = Job::new("versions").with_checkpoints(dir, Duration::from_secs(3600));
    job.source(IterSource::new(0..to))
        .uid("numbers")
        .key_by(|x: &u32| x % 2)
        .process_with_state(
            on_error::Fail,
            move |states| {
                let count = states.value::<u64>("count");
                if let Some(v) = total_version {
                    states.version(v);
                }
                (count, states.value::<u64>("total"))
            },
            |ctx, (count, total), x| {
                ctx.value(count).update(|n| *n = Some(n.unwrap_or(0) + 1));
                ctx.value(total).update(|t| *t = Some(t.unwrap_or(0) + u64::from(*x)));
                let (n, t) = (ctx.value(count).get().unwrap_or(0), ctx.value(total).get().unwrap_or(0));
                let key = *ctx.key();
                ctx.emit((key, n, t));
            },
        )
        .uid("sums")
        .sink(out.clone());
    job
}

/// A state declared with a version of its own migrates alone when the
/// version changes, even though another state of the same operator has
/// the same type; without a migration the restore is refused naming it;
/// a checkpoint of a later version is refused; the checkpoint records the
/// state's version.
#[test]
fn a_state_with_its_own_version_migrates_alone() {
    let dir = tempfile::tempdir().unwrap();
    let out = CollectSink::new();
    versioned_job(dir.path(), 4, None, &out).run_blocking().unwrap();
    let v1 = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), v1.path());

    // Version 2 of `total` (now in tens): refused without a migration.
    let out = CollectSink::new();
    let err = versioned_job(dir.path(), 6, Some(2), &out).run_blocking().unwrap_err().to_string();
    assert!(err.contains("`total`") && err.contains("version 1") && err.contains("version 2"), "{err}");
    assert!(!err.contains("`count`"), "only the state whose version changed: {err}");
    let out = CollectSink::new();
    let report = versioned_job(dir.path(), 6, Some(2), &out)
        .with_state_migration_for("sums", |old: u64| old * 10)
        .run_blocking()
        .unwrap();
    let migrated: Vec<&str> = report.migrated.iter().map(|m| m.state.as_str()).collect();
    assert_eq!(migrated, ["total"], "{:?}", report.migrated);
    // Key 0 had 0 + 2 = 2 (now 20) and 2 records; 4 is added.
    assert!(out.values().contains(&(0, 3, 24)), "{:?}", out.values());

    // The checkpoint now records `total` at version 2, and `count` at none
    // of its own.
    fn manifests(dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                manifests(&path, out);
            } else if path.file_name().is_some_and(|n| n == "MANIFEST") {
                out.push(std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut found = Vec::new();
    manifests(dir.path(), &mut found);
    let manifests = found;
    assert!(manifests.iter().any(|m| m.contains("\"version\": 2") || m.contains("\"version\":2")), "{manifests:?}");

    // Back to a job that reads `total` at the operator's version 1: refused.
    let out = CollectSink::new();
    let err = versioned_job(dir.path(), 8, None, &out).run_blocking().unwrap_err().to_string();
    assert!(err.contains("`total`") && err.contains("later version"), "{err}");
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A processing-time timer 2 s after each key's first record; the timer
/// emits the key.
fn timer_job(dir: &Path, out: &CollectSink<(u64, i64)>) -> Job {
    let job = Job::new("reminders").with_checkpoints(dir, Duration::from_secs(3600));
    job.source(Generator::new(u64::MAX, |i| i % 3).with_rate(200.0))
        .uid("ticks")
        .key_by(|k: &u64| *k)
        .process_with_state_and_timers(
            on_error::Fail,
            |states| states.value::<i64>("due"),
            |ctx, due, _| {
                if ctx.value(due).get().is_none() {
                    let at = ctx.processing_time() + 2_000;
                    ctx.value(due).set(at);
                    ctx.register_processing_timer(at);
                }
            },
            |ctx, _, timer: Timer| {
                assert_eq!(timer.domain, weibo::TimeDomain::ProcessingTime);
                let key = *ctx.key();
                ctx.emit((key, timer.time));
            },
        )
        .uid("reminders")
        .name("reminders")
        .sink(out.clone());
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processing_timers_due_while_the_job_was_down_fire_once_after_the_restore() {
    let dir = tempfile::tempdir().unwrap();
    let first = CollectSink::new();
    let handle = timer_job(dir.path(), &first).spawn().unwrap();
    let started = Instant::now();
    while handle.metrics().operator("reminders").map_or(0, |m| m.records_in) < 6 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    handle.checkpoint().await.unwrap();
    handle.cancel().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "stopped before the timers came due");
    assert!(first.values().is_empty(), "{:?}", first.values());
    // Down until the timers are past due.
    tokio::time::sleep(Duration::from_millis(2_500).saturating_sub(started.elapsed())).await;
    let second = CollectSink::new();
    let handle = timer_job(dir.path(), &second).spawn().unwrap();
    let restarted = Instant::now();
    while second.values().len() < 3 && restarted.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let fired_after = restarted.elapsed();
    // Long enough for a second firing, had the timers not been removed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    handle.cancel().await.unwrap();
    let mut fired = second.values();
    fired.sort_unstable();
    assert_eq!(fired.iter().map(|f| f.0).collect::<Vec<_>>(), [0, 1, 2], "each key's timer fired once: {fired:?}");
    assert!(fired_after < Duration::from_secs(1), "at once after the restore, not 2 s later: {fired_after:?}");
}

/// Deduplication with a time-to-live, in processing time the test drives:
/// an id is dropped while remembered and passes again once forgotten; ids
/// no one reads again are swept; every forgotten entry is counted.
#[test]
fn a_time_to_live_forgets_ids_after_it_and_sweeps_what_no_one_reads() {
    use weibo::process::StateTtl;
    // In memory as objects (the harness keeps bytes), so that the metrics
    // count the entries left.
    let mut h = weibo::testing::Harness::<(u32, String)>::new("dedup")
        .configure(|job| job.with_max_key_groups(4).with_state_backend(weibo::state::MemoryBackend));
    let firsts = h
        .input()
        .key_by(|r: &(u32, String)| r.0)
        .process_with_state(
            on_error::Fail,
            |states| states.ttl(StateTtl::after_write(Duration::from_secs(60))).map::<String, ()>("seen"),
            |ctx, seen, r| {
                if !ctx.map(seen).contains(&r.1) {
                    ctx.map(seen).put(r.1.clone(), ());
                    ctx.emit(r.1.clone());
                }
            },
        )
        .name("dedup");
    let probe = h.output(&firsts);
    let mut run = h.start().unwrap();
    run.push((1, "a".into()), 1).unwrap();
    run.push((1, "a".into()), 2).unwrap();
    run.watermark(2).unwrap();
    run.set_processing_time(30_000).unwrap();
    run.push((1, "a".into()), 3).unwrap();
    run.push((2, "b".into()), 4).unwrap();
    run.watermark(4).unwrap();
    assert_eq!(probe.take(), ["a", "b"], "`a` is remembered for 60 s after it was written");
    run.set_processing_time(60_000).unwrap();
    run.push((1, "a".into()), 5).unwrap();
    run.watermark(5).unwrap();
    assert_eq!(probe.take(), ["a"], "forgotten at 60 s, so it passes again");
    // Nothing reads `a` (written at 60 s) or `b` (at 30 s) again: the sweep
    // removes them once past due.
    run.set_processing_time(200_000).unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    let report = run.finish().unwrap();
    let op = report.metrics.operator("dedup").unwrap();
    let seen = op.state.iter().find(|s| s.state == "seen").unwrap();
    assert_eq!(seen.memory_entries, 0, "swept: {seen:?}");
    assert_eq!(seen.expired, 3, "`a` on access, then `a` and `b` by the sweep: {seen:?}");
}

/// A job keeping each key's last value for 1 s of event time: event `i`
/// below 200 sets key `i` at time 0; later ones set key `1000 + i % 3` at
/// time `10 * i`, so the watermark passes 1 000 and the first keys expire
/// without anyone reading them. Restored, a source of one event per first
/// key reads each key's value before any watermark.
fn remembered_job(
    job: Job,
    source: impl FnOnce(&Job) -> weibo::Stream<(u64, i64)>,
    out: &CollectSink<(u64, Option<i64>)>,
) -> Job {
    use weibo::process::StateTtl;
    use weibo::time::WatermarkStrategy;
    source(&job)
        .with_timestamps(|r: &(u64, i64)| r.1, WatermarkStrategy::monotonous())
        .key_by(|r: &(u64, i64)| r.0)
        .process_with_state(
            on_error::Fail,
            |states| states.ttl(StateTtl::after_write(Duration::from_secs(1)).in_event_time()).value::<i64>("last"),
            |ctx, last, r| {
                let key = *ctx.key();
                let before = ctx.value(last).get();
                ctx.value(last).set(r.1);
                ctx.emit((key, before));
            },
        )
        .uid("remember")
        .sink(out.clone());
    job
}

/// In event time a checkpoint records the state's clock: the values that
/// had expired when it was taken are not restored, even though the
/// restored job has seen no watermark yet and no sweep reached them.
#[test]
fn values_expired_in_event_time_stay_expired_after_a_restore() {
    let dir = tempfile::tempdir().unwrap();
    let out = CollectSink::new();
    let job = remembered_job(
        Job::new("remember").with_checkpoints(dir.path(), Duration::from_secs(3600)).with_max_key_groups(128),
        |job| {
            job.source(
                Generator::new(u64::MAX, |i| if i < 200 { (i, 0) } else { (1_000 + i % 3, 10 * i as i64) })
                    .with_rate(4_000.0),
            )
            .uid("events")
        },
        &out,
    );
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(600));
    let seen = out.values();
    assert!(
        seen.iter().any(|r| r.0 >= 1_000 && r.1.is_some_and(|t| t > 3_000)),
        "the watermark passed 1 000: {:?}",
        seen.last()
    );
    let restored = Job::new("remember")
        .with_checkpoints(dir.path().join("v2"), Duration::from_secs(3600))
        .with_max_key_groups(128)
        .restore_from(&savepoint);
    let out = CollectSink::new();
    remembered_job(
        restored,
        |job| job.source(IterSource::new((0u64..200).map(|k| (k, 5)).collect::<Vec<_>>())).uid("again"),
        &out,
    )
    .allow_unrestored_state()
    .run_blocking()
    .unwrap();
    let got = out.values();
    assert_eq!(got.len(), 200);
    let kept: Vec<_> = got.iter().filter(|r| r.1.is_some()).collect();
    assert!(kept.is_empty(), "expired at time 1 000, checkpointed past it: {kept:?}");
}

/// A reducing and an aggregating state with a time-to-live, in processing
/// time the test drives: each accumulator expires whole, and the next value
/// added starts a new one; a read refreshes the one under `after_read` and
/// not the one under `after_write`; the sweep removes the accumulators no
/// one touches again, and every expired one is counted.
#[test]
fn reducing_and_aggregating_state_expire_whole() {
    use weibo::process::StateTtl;
    let mut h = weibo::testing::Harness::<(u32, u64)>::new("expiring-sums")
        .configure(|job| job.with_max_key_groups(4).with_state_backend(weibo::state::MemoryBackend));
    let sums = h
        .input()
        .key_by(|r: &(u32, u64)| r.0)
        .process_with_state(
            on_error::Fail,
            |states| {
                let sum = states.ttl(StateTtl::after_write(Duration::from_secs(10))).reducing("sum", |a: u64, b| a + b);
                let count =
                    states.ttl(StateTtl::after_read(Duration::from_secs(10))).aggregating::<u64, _>("count", Count);
                (sum, count)
            },
            |ctx, (sum, count), r| {
                // A value of 0 only reads.
                if r.1 > 0 {
                    ctx.reducing(sum).add(r.1);
                    ctx.aggregating(count).add(r.1);
                }
                let total = ctx.reducing(sum).get().unwrap_or(0);
                let n = ctx.aggregating(count).get().unwrap_or(0);
                ctx.emit((r.0, total, n));
            },
        )
        .name("sums");
    let probe = h.output(&sums);
    let mut run = h.start().unwrap();
    // Each push is followed by a watermark, which the harness waits for:
    // the record is processed before the clock moves on.
    run.push((1, 5), 1).unwrap();
    run.watermark(1).unwrap();
    run.set_processing_time(6_000).unwrap();
    run.push((1, 7), 2).unwrap();
    run.push((2, 1), 3).unwrap();
    run.watermark(3).unwrap();
    assert_eq!(probe.take(), [(1, 5, 1), (1, 12, 2), (2, 1, 1)], "live within 10 s of the last write");
    // Key 1 was written at 6 s. Read at 15 s: the count lives on to 25 s,
    // the sum still expires at 16 s.
    run.set_processing_time(15_000).unwrap();
    run.push((1, 0), 4).unwrap();
    run.watermark(4).unwrap();
    run.set_processing_time(20_000).unwrap();
    run.push((1, 0), 5).unwrap();
    run.watermark(5).unwrap();
    // Read at 20 s, the count lives to 30 s: at 40 s both start anew.
    run.set_processing_time(40_000).unwrap();
    run.push((1, 3), 6).unwrap();
    run.watermark(6).unwrap();
    assert_eq!(probe.take(), [(1, 12, 2), (1, 0, 2), (1, 3, 1)]);
    // No one touches key 2 again (written at 6 s) nor key 1 (at 40 s): the
    // sweep removes both states' accumulators once past due.
    run.set_processing_time(200_000).unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    let report = run.finish().unwrap();
    let op = report.metrics.operator("sums").unwrap();
    for name in ["sum", "count"] {
        let state = op.state.iter().find(|s| s.state == name).unwrap();
        assert_eq!(state.memory_entries, 0, "swept: {state:?}");
    }
    let expired: u64 = op.state.iter().map(|s| s.expired).sum();
    assert_eq!(expired, 6, "key 1's sum at 20 s and count at 40 s, then both keys' by the sweep: {:?}", op.state);
}

/// With a zero buffer timeout (every step flushes, so no flush timer
/// runs), a processing-time timer still fires on a job whose input has
/// gone quiet without ending: one record, then nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processing_timers_fire_on_an_idle_job_with_a_zero_buffer_timeout() {
    let job = Job::new("quiet").with_buffer_timeout(Duration::ZERO);
    let one = job.source(IterSource::new(vec![7u32]));
    // A source that stays open and sends nothing (its first event is due in
    // a million seconds): the job does not end.
    let quiet = job.source(Generator::new(u64::MAX, |i| i as u32).with_rate(1e-6));
    let fired = CollectSink::new();
    one.union(&quiet)
        .key_by(|x: &u32| *x)
        .process_with_state_and_timers(
            on_error::Fail,
            |_| (),
            |ctx, (), _x| {
                let at = ctx.processing_time() + 200;
                ctx.register_processing_timer(at);
            },
            |ctx, (), timer: Timer| ctx.emit((*ctx.key(), timer.time)),
        )
        .sink(fired.clone());
    let handle = job.spawn().unwrap();
    let started = Instant::now();
    while fired.values().is_empty() && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    handle.abort();
    let fired = fired.values();
    assert_eq!(fired.len(), 1, "the timer of key 7 fires once, without any input after it: {fired:?}");
    assert_eq!(fired.first().map(|f| f.0), Some(7));
}

/// Per key, the words seen (a list) and how often each was seen (a map).
fn words_job(
    job: Job,
    source: impl FnOnce(&Job) -> weibo::Stream<(u32, u32)>,
    out: &CollectSink<(u32, u64, usize)>,
) -> Job {
    source(&job)
        .key_by(|r: &(u32, u32)| r.0)
        .process_with_state(
            on_error::Fail,
            |states| (states.list::<u32>("words"), states.map::<u32, u64>("counts")),
            |ctx, (words, counts), r| {
                ctx.list(words).add(r.1);
                ctx.map(counts).update(r.1, |n| *n = Some(n.unwrap_or(0) + 1));
                let count = ctx.map(counts).get(&r.1).unwrap_or(0);
                let len = ctx.list(words).get().len();
                let key = *ctx.key();
                ctx.emit((key, count, len));
            },
        )
        .uid("words")
        .sink(out.clone());
    job
}

/// The state processor reads a key's list and map from a savepoint (in
/// the order added; in user-key order), and writes new ones that a job
/// restores and goes on from.
#[test]
fn the_state_processor_reads_and_rewrites_list_and_map_state_by_key() {
    use weibo::checkpoint::processor::{SavepointReader, SavepointWriter};
    let dir = tempfile::tempdir().unwrap();
    let out = CollectSink::new();
    // Event `i`: key `i % 4`, word `(i / 4) % 5`, so key k's words are 0, 1, 2, 3, 4, 0, ...
    let job = words_job(
        Job::new("words").with_checkpoints(dir.path(), Duration::from_secs(3600)).with_max_key_groups(16),
        |job| {
            job.source(Generator::new(u64::MAX, |i| ((i % 4) as u32, ((i / 4) % 5) as u32)).with_rate(2_000.0))
                .uid("events")
        },
        &out,
    );
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(300));
    let reader = SavepointReader::open(&savepoint).unwrap();
    let mut lists = BTreeMap::new();
    for key in 0u32..4 {
        let words: Vec<u32> = reader.list("words", "words", &key).unwrap();
        assert!(!words.is_empty(), "key {key}");
        let want: Vec<u32> = (0..words.len() as u32).map(|j| j % 5).collect();
        assert_eq!(words, want, "key {key}'s list, in the order added");
        let counts: Vec<(u32, u64)> = reader.map("words", "counts", &key).unwrap();
        let mut want = BTreeMap::new();
        for w in &words {
            *want.entry(*w).or_insert(0u64) += 1;
        }
        assert_eq!(counts, want.into_iter().collect::<Vec<_>>(), "key {key}'s map, in user-key order");
        lists.insert(key, words);
    }
    assert!(reader.map::<u32, u32, u64>("words", "counts", &99).unwrap().is_empty(), "a key without a map");
    assert!(reader.map::<u32, u32, String>("words", "counts", &0).is_err(), "the wrong value type");

    // Rewritten: each list cut to its first two words, each map to one
    // entry, word 0 seen 100 times.
    let mut writer = SavepointWriter::from(&reader);
    writer
        .set_list_state("words", "words", lists.iter().map(|(k, w)| (*k, w.iter().take(2).copied().collect())))
        .unwrap();
    writer.set_map_state("words", "counts", (0u32..4).map(|k| (k, 0u32, 100u64))).unwrap();
    let rewritten = writer.write(dir.path().join("rewritten")).unwrap();
    let check = SavepointReader::open(&rewritten).unwrap();
    assert_eq!(check.list::<u32, u32>("words", "words", &3).unwrap(), [0, 1]);
    assert_eq!(check.map::<u32, u32, u64>("words", "counts", &3).unwrap(), [(0, 100)]);

    // Restored: one more word 0 per key finds the map's 100 and the list's 2.
    let out = CollectSink::new();
    let restored = Job::new("words")
        .with_checkpoints(dir.path().join("v2"), Duration::from_secs(3600))
        .with_max_key_groups(16)
        .restore_from(&rewritten)
        .allow_unrestored_state();
    words_job(
        restored,
        |job| job.source(IterSource::new((0u32..4).map(|k| (k, 0u32)).collect::<Vec<_>>())).uid("more"),
        &out,
    )
    .run_blocking()
    .unwrap();
    let mut got = out.values();
    got.sort_unstable();
    assert_eq!(got, (0u32..4).map(|k| (k, 101, 3)).collect::<Vec<_>>());
}

/// Side outputs are streams of their own types, next to the results and
/// the dead letters; a tag used on another operator's stream is a wiring
/// error that names it; the plan shows each side output.
#[test]
fn side_outputs_are_typed_streams_and_a_foreign_tag_is_a_wiring_error() {
    let mut t = weibo::testing::TestJob::new("sides");
    let (odd, big) = (OutputTag::<String>::new("odd"), OutputTag::<u64>::new("big"));
    let (evens, dead) = t.input((1u32..=6).collect()).key_by(|x: &u32| x % 2).process_with_state(
        on_error::DeadLetter,
        |states| (states.side_output(&odd), states.side_output(&big)),
        |ctx, (odd, big), x| {
            if *x == 5 {
                return Err("five".to_string());
            }
            if x % 2 == 1 {
                ctx.output(odd, format!("odd {x}"));
            } else {
                ctx.emit(*x);
            }
            if *x > 3 {
                ctx.output(big, u64::from(*x) * 10);
            }
            Ok(())
        },
    );
    let odds = evens.side_output(&odd);
    let bigs = evens.side_output(&big);
    let plan = t.job().to_string();
    assert!(plan.contains("odd: String") && plan.contains("big: u64"), "{plan}");
    let (evens, odds, bigs, dead) = (t.collect(&evens), t.collect(&odds), t.collect(&bigs), t.collect(&dead));
    t.run().unwrap();
    assert_eq!(evens.sorted(), [2, 4, 6]);
    assert_eq!(odds.sorted(), ["odd 1", "odd 3"]);
    assert_eq!(bigs.sorted(), [40, 60]);
    assert_eq!(dead.values().iter().map(|d| d.record).collect::<Vec<_>>(), [5]);

    let mut other = weibo::testing::TestJob::new("foreign");
    let plain = other.input(vec![1u32]).key_by(|x: &u32| *x).process_with_state(
        on_error::Fail,
        |states| states.value::<u32>("n"),
        |ctx, _, x| ctx.emit(*x),
    );
    let stolen = plain.side_output(&odd);
    let _ = other.collect(&stolen);
    let err = other.run().unwrap_err().to_string();
    assert!(err.contains("side output `odd`"), "{err}");
}

/// Declarations the job cannot run with are wiring errors, each named: a
/// name that cannot name files, a name declared twice, and a time-to-live
/// followed by no declaration.
#[test]
fn bad_declarations_are_wiring_errors() {
    use weibo::process::StateTtl;
    type Declare = fn(&mut States<u32>);
    let cases: [(&str, Declare); 3] = [
        ("`a-b` is not allowed", |s| {
            let _ = s.value::<u32>("a-b");
        }),
        ("`n` is declared twice", |s| {
            let _ = (s.value::<u32>("n"), s.list::<u32>("n"));
        }),
        ("was not followed by the declaration", |s| {
            let _ = s.ttl(StateTtl::after_write(Duration::from_secs(1)));
        }),
    ];
    for (want, declare) in cases {
        let mut t = weibo::testing::TestJob::new("declarations");
        let out = t
            .input(vec![1u32])
            .key_by(|x: &u32| *x)
            .process_with_state(on_error::Fail, declare, |ctx, (), x| ctx.emit(*x));
        let _ = t.collect(&out);
        let err = t.run().unwrap_err().to_string();
        assert!(err.contains(want), "{want}: {err}");
    }
}
