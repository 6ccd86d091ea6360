//! The metrics of operators of two inputs: per input, the records it sent,
//! those too late, the rows an outer join emitted for its records without
//! a partner, and the entries of the state its records wait in; per join,
//! the pairs it emitted. Each count is checked on the smallest case that
//! makes it move, for the interval join, the window join, the temporal
//! join and a broadcast operator; and in the Prometheus text the admin API
//! serves.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::time::{Duration, Instant};

use weibo::metrics::{InputMetrics, MetricsSnapshot};
use weibo::on_error;
use weibo::process::Either;
use weibo::testing::{Harness, RunningHarness};
use weibo::window::Tumbling;
use weibo_tests::two_inputs::split;

/// A record: key and id.
type Rec = (u8, u32);

/// The two inputs of `h`'s input, named `lefts` and `rights`.
fn sides(h: &mut Harness<Either<Rec, Rec>>) -> (weibo::KeyedStream<u8, Rec>, weibo::KeyedStream<u8, Rec>) {
    let (l, r) = split(&h.input());
    (l.name("lefts").key_by(|r: &Rec| r.0), r.name("rights").key_by(|r: &Rec| r.0))
}

/// Sends `record` at `at`, then the watermark `at`, so that it is
/// processed before the next.
fn send(run: &mut RunningHarness<Either<Rec, Rec>>, record: Either<Rec, Rec>, at: i64) {
    run.push(record, at).unwrap();
    run.watermark(at).unwrap();
}

fn inputs<'a>(metrics: &'a MetricsSnapshot, operator: &str) -> &'a [InputMetrics] {
    &metrics.operator(operator).unwrap_or_else(|| panic!("no operator `{operator}` in {metrics}")).inputs
}

/// (records in, late, unmatched) of each input.
fn counts(inputs: &[InputMetrics]) -> Vec<(u64, u64, u64)> {
    inputs.iter().map(|i| (i.records_in, i.late, i.unmatched)).collect()
}

/// A full interval join: a pair, a record of each side without a partner,
/// a late one of each; while it runs, the records waiting in `left` and
/// `right` show as buffered.
#[test]
fn an_interval_join_counts_each_input() {
    let mut h = Harness::<Either<Rec, Rec>>::new("interval");
    let (lefts, rights) = sides(&mut h);
    let rows = lefts
        .interval_join(&rights)
        .between(0, 50)
        .with_partitions(2)
        .full_join(|l, r| (l.map(|l| l.1), r.map(|r| r.1)));
    let rows = h.output(&rows);
    let mut run = h.start().unwrap();
    send(&mut run, Either::Left((1, 1)), 100);
    send(&mut run, Either::Right((1, 2)), 105); // pairs with 1
    send(&mut run, Either::Right((2, 3)), 200); // never pairs
    send(&mut run, Either::Left((3, 4)), 300); // never pairs

    // Waiting: left 4 at 300 (until 350), right 3 at 200 is gone at 200
    // + 0 (its interval ended), so at least the left one.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = run.metrics();
        let i = inputs(&m, "interval full join");
        if i[0].buffered.unwrap_or(0) > 0 {
            assert_eq!((i[0].state.as_deref(), i[1].state.as_deref()), (Some("left"), Some("right")));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the left record never showed as buffered: {i:?} {:?}",
            m.operator("interval full join").unwrap().state
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    send(&mut run, Either::Left((1, 5)), 50); // late: the watermark is at 300
    send(&mut run, Either::Right((1, 6)), 40); // late
    let report = run.finish().unwrap();
    let mut got = rows.take();
    got.sort_unstable();
    assert_eq!(got, [(None, Some(3)), (Some(1), Some(2)), (Some(4), None)]);

    let join = report.metrics.operator("interval full join").unwrap();
    assert_eq!(join.matched, 1);
    assert_eq!(join.late, 2, "the operator's late is both inputs'");
    let i = &join.inputs;
    assert_eq!((i[0].input.as_str(), i[0].from.as_str()), ("first input", "lefts"));
    assert_eq!((i[1].input.as_str(), i[1].from.as_str()), ("second input", "rights"));
    assert_eq!(counts(i), [(3, 1, 1), (3, 1, 1)]);
}

/// A left window join: a window's pair, a left record alone in its window,
/// a right record too late for its window.
#[test]
fn a_window_join_counts_pairs_rows_alone_and_late_records_per_input() {
    let mut h = Harness::<Either<Rec, Rec>>::new("window");
    let (lefts, rights) = sides(&mut h);
    let rows = lefts
        .join(&rights)
        .window(Tumbling::of(Duration::from_secs(1)))
        .left_join(|l: &Rec, r: Option<&Rec>| (l.1, r.map(|r| r.1)));
    let rows = h.output(&rows);
    let mut run = h.start().unwrap();
    send(&mut run, Either::Left((1, 1)), 100);
    send(&mut run, Either::Right((1, 2)), 200);
    send(&mut run, Either::Right((1, 9)), 300);
    send(&mut run, Either::Left((2, 3)), 1_100); // alone in [1000, 2000)
    send(&mut run, Either::Right((1, 4)), 500); // [0, 1000) has fired
    let report = run.finish().unwrap();
    let mut got = rows.take();
    got.sort_unstable();
    assert_eq!(got, [(1, Some(2)), (1, Some(9)), (3, None)]);
    let join = report.metrics.operator("window left join").unwrap();
    assert_eq!(join.matched, 2);
    assert_eq!(counts(&join.inputs), [(2, 0, 1), (3, 1, 0)]);
    assert_eq!(join.inputs[0].buffered, None, "a window holds both inputs in one state");
}

/// A temporal left join: a record with its row's version, one without a
/// row, a late table row; records wait in `waiting`, rows in `versions`.
#[test]
fn a_temporal_join_counts_rows_with_and_without_a_version() {
    let mut t = weibo::testing::TestJob::new("temporal");
    let time = |r: &(u8, u32, i64)| r.2;
    let strategy = weibo::time::WatermarkStrategy::monotonous();
    let orders = t.input(vec![(1u8, 10u32, 500i64), (2, 11, 600)]).with_timestamps(time, strategy).name("orders");
    let rates = t.input(vec![(1u8, 7u32, 100i64)]).with_timestamps(time, strategy).name("rates");
    let rows = orders
        .key_by(|o: &(u8, u32, i64)| o.0)
        .temporal_join(&rates.key_by(|r: &(u8, u32, i64)| r.0))
        .left_join(|o, r| (o.1, r.map(|r| r.1)));
    let rows = t.collect(&rows);
    let report = t.run().unwrap();
    let mut got = rows.values();
    got.sort_unstable();
    assert_eq!(got, [(10, Some(7)), (11, None)]);
    let join = report.metrics.operator("temporal left join").unwrap();
    assert_eq!(join.matched, 1);
    assert_eq!(counts(&join.inputs), [(2, 0, 1), (1, 0, 0)]);
    let states: Vec<Option<&str>> = join.inputs.iter().map(|i| i.state.as_deref()).collect();
    assert_eq!(states, [Some("waiting"), Some("versions")]);
    assert_eq!((join.inputs[0].from.as_str(), join.inputs[1].from.as_str()), ("orders", "rates"));
}

/// A broadcast operator's inputs are the keyed one and the broadcast one;
/// it buffers nothing and pairs nothing.
#[test]
fn a_broadcast_operator_names_its_inputs() {
    let mut t = weibo::testing::TestJob::new("rules");
    let rules = t.input(vec![(1u8, 5u32)]).name("rules");
    let readings = t.input(vec![(1u8, 3u32), (1, 8), (2, 9)]).name("readings");
    let out = readings.key_by(|r: &Rec| r.0).connect_broadcast(&rules).process_with_state(
        on_error::Fail,
        |states| states.broadcast::<u8, u32>("limits"),
        |ctx, limits, r: &Rec| {
            let over = ctx.broadcast(limits).get(&r.0).is_some_and(|l| r.1 > l);
            ctx.emit(over);
        },
        |ctx, limits, rule: &Rec| ctx.broadcast(limits).put(rule.0, rule.1),
    );
    let out = t.collect(&out.name("judge"));
    let report = t.run().unwrap();
    assert_eq!(out.values().len(), 3);
    let judge = report.metrics.operator("judge").unwrap();
    let labels: Vec<(&str, &str)> = judge.inputs.iter().map(|i| (i.input.as_str(), i.from.as_str())).collect();
    assert_eq!(labels, [("keyed input", "readings"), ("broadcast input", "rules")]);
    assert_eq!(counts(&judge.inputs), [(3, 0, 0), (1, 0, 0)]);
    assert_eq!(judge.matched, 0);
}

/// The admin API's Prometheus text has the per-input series, labelled by
/// operator, input and what feeds it.
#[test]
fn prometheus_text_has_each_inputs_series() {
    weibo::testing::block_on(async {
        let job = weibo::Job::new("joined").with_admin("127.0.0.1:0").with_admin_token("t");
        let time = |r: &(u8, u32, i64)| r.2;
        let strategy = weibo::time::WatermarkStrategy::monotonous();
        let make = |i: u64| ((i % 4) as u8, i as u32, i as i64);
        let a = job.source(weibo::sources::Generator::new(u64::MAX, make).with_rate(500.0)).name("a");
        let b = job.source(weibo::sources::Generator::new(u64::MAX, make).with_rate(500.0)).name("b");
        let (a, b) = (a.with_timestamps(time, strategy), b.with_timestamps(time, strategy));
        a.key_by(|r: &(u8, u32, i64)| r.0)
            .interval_join(&b.key_by(|r: &(u8, u32, i64)| r.0))
            .between(-2, 2)
            .join(|x, y| (x.1, y.1))
            .name("pairs")
            .sink(weibo::sinks::Blackhole::new());
        let handle = job.spawn().unwrap();
        let addr = handle.admin_addr().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (status, text) = weibo_tests::http(addr, "GET", "/metrics", Some("t"), None).await;
            assert_eq!(status, 200);
            let has = |line: &str| text.lines().any(|l| l.starts_with(line) && !l.ends_with(" 0"));
            if has(
                r#"weibo_operator_input_records_in_total{job="joined",operator="pairs",input="first input",from="timestamps"}"#,
            ) && has(
                r#"weibo_operator_input_records_in_total{job="joined",operator="pairs",input="second input",from="timestamps-2"}"#,
            ) && has(r#"weibo_operator_matched_total{job="joined",operator="pairs"}"#)
                && text.contains(r#"weibo_operator_input_buffered{job="joined",operator="pairs",input="first input""#)
            {
                break;
            }
            assert!(Instant::now() < deadline, "the series never showed:\n{text}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        handle.abort();
    });
}
