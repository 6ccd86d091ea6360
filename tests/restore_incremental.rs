//! Incremental checkpoints: past the first write, value, window and timer
//! state checkpoints hold only what changed, in memory and on fjall, and
//! restoring a chain of deltas gives back exactly the state.

use std::collections::BTreeMap;
use std::time::Duration;

use weibo::Job;
use weibo::sinks::CollectSink;
use weibo::sources::Generator;
use weibo_tests::restore::*;

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
async fn timer_checkpoints_after_the_first_write_only_what_changed() {
    incremental_timer_checkpoints(false, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_checkpoints_of_fjall_state_after_the_first_write_only_what_changed() {
    incremental_timer_checkpoints(true, false).await;
}

/// As above, with the timers in fjall behind its cache: the 10,000 timers
/// fit in the default budget, and those the trickle moves never reach the
/// table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_checkpoints_of_timers_on_disk_after_the_first_write_only_what_changed() {
    incremental_timer_checkpoints(true, true).await;
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
async fn incremental_timer_checkpoints(on_fjall: bool, timers_on_disk: bool) {
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
            let backend =
                weibo::state::FjallBackend::builder(state).with_timers_on_disk(timers_on_disk).open().unwrap();
            job = job.with_state_backend(backend);
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

/// The inspector counts a state's live entries after a chain's deltas
/// (puts and removals) are applied: a keyed `process` sets each key's
/// state in the fill of [`fill_then_trickle`] and clears the even keys the
/// trickle reaches (0, 2 and 4 of its 5). A checkpoint during the fill is
/// the base; one after the clearing is a delta that removes them: it holds
/// 10,000 − 3 live entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspector_counts_live_entries_through_a_chain_of_deltas() {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("clearing").with_checkpoints(dir.path(), Duration::from_secs(3600)).with_max_key_groups(16);
    job.source(Generator::new(40_000, fill_then_trickle).with_rate(20_000.0))
        .name("events")
        .key_by(|e: &(u64, u64)| e.0)
        .with_partitions(2)
        .process(weibo::on_error::Fail, |ctx: &mut weibo::KeyedContext<'_, u64, u64, u64>, e: &(u64, u64)| {
            *ctx.state() = if e.1 >= 10_000 && e.0.is_multiple_of(2) { None } else { Some(e.1) };
            Ok::<(), String>(())
        })
        .name("clearing")
        .sink(CollectSink::new());
    let handle = job.spawn().unwrap();
    let read = |h: &weibo::JobHandle| h.metrics().operator("events").map_or(0, |m| m.records_out);
    while read(&handle) < 2_000 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    handle.checkpoint().await.unwrap();
    assert!(read(&handle) < 10_000, "the base was taken during the fill");
    while read(&handle) < 12_000 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let newest = handle.checkpoint().await.unwrap();
    handle.cancel().await.unwrap();
    let manifest = weibo::checkpoint::read_manifest(&newest).unwrap();
    let deltas = manifest.states.iter().filter(|s| s.operator == "clearing" && !s.base).count();
    assert!(deltas > 0, "a base and deltas: {:?}", manifest.states);
    let (inspection, _) = weibo::checkpoint::inspect::Inspection::open(&newest).unwrap();
    let op = inspection.operators.iter().find(|o| o.id == "clearing").unwrap();
    let state = op.states.iter().find(|s| s.name == "value").unwrap();
    assert_eq!(state.entries, 10_000 - 3, "{state:?}");
    // Each live entry: an 8-byte key and a 1- to 3-byte varint value.
    assert!((9_997 * 9..=9_997 * 11).contains(&state.bytes), "{state:?}");
}
