//! Connected streams: two keyed inputs of different types, one operator
//! with shared keyed state and timers. Records of a key from either input
//! meet at one instance, at any parallelism; the operator's watermark is
//! the slower input's unless that one is idle; one input ending leaves the
//! other flowing; the state both inputs share survives a savepoint.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::BTreeMap;
use std::time::Duration;

use weibo::process::{Either, KeyedCoProcessFunction, ProcessContext, States, ValueState};
use weibo::sinks::CollectSink;
use weibo::sources::{Generator, IterSource};
use weibo::time::WatermarkStrategy;
use weibo::{Job, Stream, Timer, on_error};

/// Orders `(customer, amount)` wait for their customer's name; a name
/// releases the orders waiting for it and is remembered for later ones.
fn enrich(orders: &Stream<(u32, u64)>, names: &Stream<(u32, String)>, partitions: usize) -> Stream<(String, u64)> {
    name_orders(orders.key_by(|o: &(u32, u64)| o.0).connect(&names.key_by(|c: &(u32, String)| c.0)), partitions)
        .uid("enrich")
}

/// The operator of [`enrich`] on connected streams keyed by customer.
fn name_orders(
    connected: weibo::process::ConnectedStreams<u32, (u32, u64), (u32, String)>,
    partitions: usize,
) -> Stream<(String, u64)> {
    connected.with_partitions(partitions).process_with_state(
        on_error::Fail,
        |states| (states.value::<String>("name"), states.list::<u64>("waiting")),
        |ctx, (name, waiting), order| match ctx.value(name).get() {
            Some(n) => ctx.emit((n, order.1)),
            None => ctx.list(waiting).add(order.1),
        },
        |ctx, (name, waiting), customer| {
            ctx.value(name).set(customer.1.clone());
            for amount in ctx.list(waiting).get() {
                ctx.emit((customer.1.clone(), amount));
            }
            ctx.list(waiting).clear();
        },
    )
}

/// Every order of a named customer comes out once with the name, whether
/// its name came before or after it, at 1 and 4 instances; orders of a
/// customer never named stay waiting.
#[test]
fn records_of_a_key_meet_from_both_inputs_at_any_parallelism() {
    let orders: Vec<(u32, u64)> = (0..2_000u64).map(|i| ((i * 7 % 101) as u32, i)).collect();
    // Customer 100 is never named.
    let names: Vec<(u32, String)> = (0..100u32).rev().map(|c| (c, format!("c{c}"))).collect();
    let mut want: Vec<(String, u64)> =
        orders.iter().filter(|o| o.0 < 100).map(|o| (format!("c{}", o.0), o.1)).collect();
    want.sort();
    for partitions in [1, 4] {
        let mut t = weibo::testing::TestJob::new("enrich");
        let (o, n) = (t.input(orders.clone()), t.input(names.clone()));
        let out = t.collect(&enrich(&o, &n, partitions));
        let plan = t.job().plan().unwrap().to_string();
        assert!(plan.contains("connect: first input") && plan.contains("connect: second input"), "{plan}");
        t.run().unwrap();
        let mut got = out.values();
        got.sort();
        assert_eq!(got, want, "at {partitions} instances");
    }
}

/// Reports the watermark each record of the first input sees.
struct Watching;

impl KeyedCoProcessFunction<u32, (u32, i64), (u32, i64)> for Watching {
    type Out = i64;
    type Error = String;

    fn process_element1(&self, ctx: &mut ProcessContext<'_, u32, i64>, _: &(u32, i64)) -> Result<(), String> {
        let watermark = ctx.watermark();
        ctx.emit(watermark);
        Ok(())
    }

    fn process_element2(&self, _: &mut ProcessContext<'_, u32, i64>, _: &(u32, i64)) -> Result<(), String> {
        Ok(())
    }
}

/// A fast first input (event time `i`) and a second that stays at event
/// time 0: slow (`idle`: none) or quiet after its first record with an
/// idleness of 100 ms. Returns the watermarks the first input's records
/// saw within about 1.5 s.
fn watermarks_seen(idle: Option<Duration>) -> Vec<i64> {
    let out = CollectSink::new();
    let job = Job::new("watching");
    let fast = job
        .source(Generator::new(u64::MAX, |i| (0u32, i as i64)).with_rate(2_000.0))
        .with_timestamps(|r: &(u32, i64)| r.1, WatermarkStrategy::monotonous());
    let slow_strategy = match idle {
        Some(d) => WatermarkStrategy::monotonous().with_idleness(d),
        None => WatermarkStrategy::monotonous(),
    };
    let rate = if idle.is_some() { 0.01 } else { 500.0 };
    let slow = job
        .source(Generator::new(u64::MAX, |_| (0u32, 0i64)).with_rate(rate))
        .with_timestamps(|r: &(u32, i64)| r.1, slow_strategy);
    fast.key_by(|r: &(u32, i64)| r.0)
        .connect(&slow.key_by(|r: &(u32, i64)| r.0))
        .with_partitions(4)
        .process_function(on_error::Fail, |_: &mut States<u32>| Watching)
        .sink(out.clone());
    weibo::testing::block_on(async {
        let handle = job.spawn().unwrap();
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        handle.abort();
    });
    out.values()
}

/// The operator's watermark is the minimum of its inputs': a second input
/// that stays at time 0 holds the first back, until it is idle.
#[test]
fn the_slower_input_holds_the_watermark_back_until_it_is_idle() {
    let held = watermarks_seen(None);
    assert!(held.len() > 100, "the first input flowed: {}", held.len());
    assert!(held.iter().all(|w| *w <= 0), "held at the second input's time 0: {:?}", held.iter().max());
    let freed = watermarks_seen(Some(Duration::from_millis(100)));
    assert!(freed.iter().any(|w| *w > 500), "the idle input holds nothing back: {:?}", freed.iter().max());
}

/// Counts each key's records from both inputs; an event-time timer set by
/// the first input reports the count when the watermark passes 10 000.
struct Counting {
    count: ValueState<u64>,
}

impl KeyedCoProcessFunction<u32, u32, u32> for Counting {
    type Out = (u32, u64);
    type Error = String;

    fn process_element1(&self, ctx: &mut ProcessContext<'_, u32, (u32, u64)>, _: &u32) -> Result<(), String> {
        ctx.value(&self.count).update(|n| *n = Some(n.unwrap_or(0) + 1));
        ctx.register_timer(10_000);
        Ok(())
    }

    fn process_element2(&self, ctx: &mut ProcessContext<'_, u32, (u32, u64)>, _: &u32) -> Result<(), String> {
        ctx.value(&self.count).update(|n| *n = Some(n.unwrap_or(0) + 1));
        Ok(())
    }

    fn on_timer(&self, ctx: &mut ProcessContext<'_, u32, (u32, u64)>, timer: Timer) -> Result<(), String> {
        let key = *ctx.key();
        let count = ctx.value(&self.count).get().unwrap_or(0);
        assert_eq!(timer.time, 10_000);
        ctx.emit((key, count));
        Ok(())
    }
}

/// The first input ends at once; the second goes on for 500 records, all
/// processed; the operator ends when both have, and the timers the first
/// input set fire then, having counted everything.
#[test]
fn one_input_ending_leaves_the_other_flowing() {
    let out = CollectSink::new();
    let job = Job::new("counting");
    let short = job.source(IterSource::new(vec![0u32, 1, 2]));
    let long = job.source(Generator::new(500, |i| (i % 3) as u32).with_rate(2_000.0));
    short
        .key_by(|k: &u32| *k)
        .connect(&long.key_by(|k: &u32| *k))
        .with_partitions(2)
        .process_function(on_error::Fail, |states| Counting { count: states.value("count") })
        .sink(out.clone());
    job.run_blocking().unwrap();
    let got: BTreeMap<u32, u64> = out.values().into_iter().collect();
    let want: BTreeMap<u32, u64> =
        (0..3u32).map(|k| (k, 1 + (0..500u64).filter(|i| i % 3 == u64::from(k)).count() as u64)).collect();
    assert_eq!(got, want);
}

/// The state both inputs share is checkpointed: names seen before a
/// savepoint enrich orders that come after the restore.
#[test]
fn state_shared_by_both_inputs_survives_a_savepoint() {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("enrich").with_checkpoints(dir.path(), Duration::from_secs(3600)).with_max_key_groups(32);
    let orders = job.source(Generator::new(u64::MAX, |i| (1_000 + (i % 7) as u32, i)).with_rate(1_000.0)).uid("orders");
    let names = job.source(IterSource::new((0..50u32).map(|c| (c, format!("c{c}"))).collect::<Vec<_>>())).uid("names");
    enrich(&orders, &names, 2).sink(CollectSink::new());
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(400));

    let out = CollectSink::new();
    let job = Job::new("enrich")
        .with_checkpoints(dir.path().join("v2"), Duration::from_secs(3600))
        .with_max_key_groups(32)
        .restore_from(&savepoint)
        .allow_unrestored_state();
    let orders =
        job.source(IterSource::new((0..50u32).map(|c| (c, u64::from(c))).collect::<Vec<_>>())).uid("more-orders");
    let names = job.source(IterSource::new(Vec::<(u32, String)>::new())).uid("names");
    enrich(&orders, &names, 3).sink(out.clone());
    job.run_blocking().unwrap();
    let mut got = out.values();
    got.sort();
    let mut want: Vec<(String, u64)> = (0..50u32).map(|c| (format!("c{c}"), u64::from(c))).collect();
    want.sort();
    assert_eq!(got, want, "every order found its name in the restored state");
}

/// A failing record of either input goes to the dead letters as the side
/// it came from.
#[test]
fn dead_letters_tell_the_side() {
    let mut t = weibo::testing::TestJob::new("sides");
    let a = t.input(vec![1u32, 2]).key_by(|k: &u32| *k);
    let b = t.input(vec!["x".to_string()]).key_by(|_: &String| 1u32);
    let (out, dead) = a.connect(&b).process_with_state(
        on_error::DeadLetter,
        |_| (),
        |ctx, (), n| {
            if *n == 2 {
                Err(format!("no {n}"))
            } else {
                ctx.emit(*n);
                Ok(())
            }
        },
        |_, (), s| Err(format!("no {s}")),
    );
    let (out, dead) = (t.collect(&out), t.collect(&dead));
    t.run().unwrap();
    assert_eq!(out.values(), [1]);
    let mut sides: Vec<(Either<u32, String>, String)> =
        dead.values().into_iter().map(|d| (d.record, d.error)).collect();
    sides.sort_by_key(|(_, e)| e.clone());
    assert_eq!(sides, [(Either::Left(2), "no 2".to_string()), (Either::Right("x".into()), "no x".to_string())]);
}

/// A test harness whose input is split in two and connected again at four
/// instances: every watermark reaches the probe (each probe instance
/// opens on its own, and one opening must not forget what another saw).
#[test]
fn a_harness_input_split_and_connected_at_four_instances_passes_watermarks() {
    for _ in 0..20 {
        let mut h = weibo::testing::Harness::<(u8, u32)>::new("split");
        let input = h.input();
        let even = input.filter(|r: &(u8, u32)| r.1.is_multiple_of(2)).key_by(|r: &(u8, u32)| r.0);
        let odd = input.filter(|r: &(u8, u32)| r.1 % 2 == 1).key_by(|r: &(u8, u32)| r.0);
        let out = even.connect(&odd).with_partitions(4).process_with_state(
            on_error::Fail,
            |_| (),
            |ctx, (), r| ctx.emit(r.1),
            |ctx, (), r| ctx.emit(r.1),
        );
        let probe = h.output(&out);
        let mut run = h.start().unwrap();
        run.push((0, 1), 10).unwrap();
        run.push((1, 2), 11).unwrap();
        run.watermark(20).unwrap();
        let mut got = probe.take();
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
        run.finish().unwrap();
    }
}

/// Several two-input operators in one job each get names (and so ids) of
/// their own: two connects, two interval joins, two window joins.
#[test]
fn many_two_input_operators_share_a_job() {
    use std::time::Duration;
    use weibo::time::WatermarkStrategy;
    use weibo::window::Tumbling;
    let mut t = weibo::testing::TestJob::new("many");
    let a = t.input(vec![(1u32, 10i64)]).with_timestamps(|r: &(u32, i64)| r.1, WatermarkStrategy::monotonous());
    let b = t.input(vec![(1u32, 12i64)]).with_timestamps(|r: &(u32, i64)| r.1, WatermarkStrategy::monotonous());
    let (a, b) = (a.key_by(|r: &(u32, i64)| r.0), b.key_by(|r: &(u32, i64)| r.0));
    let mut outs = Vec::new();
    for _ in 0..2 {
        let pair = |x: &(u32, i64), y: &(u32, i64)| (x.1, y.1);
        outs.push(t.collect(&a.interval_join(&b).between(0, 5).join(pair)));
        outs.push(t.collect(&a.join(&b).window(Tumbling::of(Duration::from_secs(1))).apply(pair)));
        outs.push(t.collect(&a.temporal_join(&b).join(pair)));
        outs.push(t.collect(&a.connect(&b).process_with_state(
            weibo::on_error::Fail,
            |_| (),
            |ctx, (), x: &(u32, i64)| ctx.emit((x.1, 0)),
            |_, (), _: &(u32, i64)| {},
        )));
    }
    t.run().unwrap();
    let got: Vec<Vec<(i64, i64)>> = outs.iter().map(|o| o.values()).collect();
    // The temporal join's record at 10 comes before the table's only row (12).
    let once = vec![vec![(10, 12)], vec![(10, 12)], vec![], vec![(10, 0)]];
    assert_eq!(got, [once.clone(), once].concat());
}

/// Two streams connected without a key: each record goes through its
/// input's case, once, in its input's order; `flat_map` and `process`
/// likewise, a failure going to the dead letters as its side.
#[test]
fn streams_connected_without_a_key_map_each_record_by_its_input() {
    let mut t = weibo::testing::TestJob::new("co");
    let numbers = t.input((0..500u32).collect::<Vec<_>>());
    let words = t.input((0..300u32).map(|i| format!("w{i}")).collect::<Vec<_>>());
    let both = numbers.connect(&words);
    let mapped = t.collect(&both.map(|n| (0u8, n.to_string()), |w| (1u8, w)));
    let flat = t.collect(&both.flat_map(|n| vec![n; (n % 3) as usize], |w| w.len().checked_sub(3).map(|l| l as u32)));
    let (parsed, dead) = both.process(
        on_error::DeadLetter,
        |n: &u32| if n % 100 == 7 { Err(format!("{n} is unlucky")) } else { Ok(u64::from(*n)) },
        |w: &String| w[1..].parse::<u64>().map_err(|e| e.to_string()),
    );
    let (parsed, dead) = (t.collect(&parsed), t.collect(&dead));
    t.run().unwrap();

    let got = mapped.values();
    let firsts: Vec<String> = got.iter().filter(|r| r.0 == 0).map(|r| r.1.clone()).collect();
    let seconds: Vec<String> = got.iter().filter(|r| r.0 == 1).map(|r| r.1.clone()).collect();
    assert_eq!(firsts, (0..500u32).map(|n| n.to_string()).collect::<Vec<_>>(), "the first input, in order");
    assert_eq!(seconds, (0..300u32).map(|i| format!("w{i}")).collect::<Vec<_>>(), "the second, in order");

    let mut flat = flat.values();
    flat.sort_unstable();
    let mut want: Vec<u32> = (0..500u32).flat_map(|n| vec![n; (n % 3) as usize]).collect();
    want.extend((0..300u32).filter_map(|i| format!("w{i}").len().checked_sub(3).map(|l| l as u32)));
    want.sort_unstable();
    assert_eq!(flat, want);

    let mut parsed = parsed.values();
    parsed.sort_unstable();
    let mut want: Vec<u64> = (0..500u64).filter(|n| n % 100 != 7).chain(0..300).collect();
    want.sort_unstable();
    assert_eq!(parsed, want);
    let dead: Vec<Either<u32, String>> = dead.values().into_iter().map(|d| d.record).collect();
    assert_eq!(dead, [7, 107, 207, 307, 407].map(Either::Left));
}

/// `key_by` on connected streams is the keyed connect: a key's records of
/// both inputs meet, with their state, as `KeyedStream::connect` has them.
#[test]
fn connected_streams_keyed_afterwards_share_a_keys_state() {
    let orders: Vec<(u32, u64)> = (0..300u64).map(|i| ((i % 13) as u32, i)).collect();
    let names: Vec<(u32, String)> = (0..13u32).map(|c| (c, format!("c{c}"))).collect();
    let mut want: Vec<(String, u64)> = orders.iter().map(|o| (format!("c{}", o.0), o.1)).collect();
    want.sort();
    let mut t = weibo::testing::TestJob::new("keyed-later");
    let (o, n) = (t.input(orders), t.input(names));
    let enriched = name_orders(o.connect(&n).key_by(|o: &(u32, u64)| o.0, |c: &(u32, String)| c.0), 3);
    let out = t.collect(&enriched);
    t.run().unwrap();
    let mut got = out.values();
    got.sort();
    assert_eq!(got, want);
}
