//! The interval join, pinned case by case against Flink's semantics (the
//! table in the book's Time chapter), then against a naive join of the
//! same finite input for random interleavings of the two sides, at 1 and
//! 4 instances, in memory and on fjall.
//!
//! The two sides come from one test harness input of `Either`s, split in
//! two, so that the test decides the order in which the join sees the
//! records and the watermark after each one (the minimum of the sides'
//! watermarks, as two sources would give).

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use proptest::prelude::*;
use weibo::Stream;
use weibo::on_error;
use weibo::process::{Either, OutputTag};
use weibo::record::Timestamp;
use weibo::testing::{Harness, Probe, RunningHarness};
use weibo_tests::two_inputs::{interleave, side, split};

/// A record: its key and an id.
type Rec = (u8, u32);
/// What the tests collect: the left id, the right id, the output's time.
type Row = (Option<u32>, Option<u32>, Option<Timestamp>);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Inner,
    Left,
    Right,
    Full,
}

struct Join {
    run: RunningHarness<Either<Rec, Rec>>,
    rows: Probe<Row>,
    late: Probe<Either<Rec, Rec>>,
}

/// Rows with their output time, read after the join.
fn timed(rows: &Stream<(Option<u32>, Option<u32>)>) -> Stream<Row> {
    rows.process_with_outputs(
        on_error::Fail,
        |_| (),
        |ctx, (), r: &(Option<u32>, Option<u32>)| {
            let at = ctx.timestamp();
            ctx.emit((r.0, r.1, at));
        },
    )
}

/// Starts a join of `kind` between `lower` and `upper` (made exclusive as
/// asked) on `partitions` instances, on fjall if `fjall` is given.
fn start(
    kind: Kind,
    (lower, upper): (i64, i64),
    exclusive: (bool, bool),
    partitions: usize,
    fjall: Option<&std::path::Path>,
) -> Join {
    let mut h = Harness::<Either<Rec, Rec>>::new("join");
    if let Some(dir) = fjall {
        let backend = weibo::state::FjallBackend::open(dir).unwrap();
        h = h.configure(|job| job.with_state_backend(backend));
    }
    let input = h.input();
    let (left, right) = split(&input);
    let mut between = left
        .key_by(|l: &Rec| l.0)
        .interval_join(&right.key_by(|r: &Rec| r.0))
        .between(lower, upper)
        .with_partitions(partitions);
    if exclusive.0 {
        between = between.lower_bound_exclusive();
    }
    if exclusive.1 {
        between = between.upper_bound_exclusive();
    }
    let rows = match kind {
        Kind::Inner => between.join(|l: &Rec, r: &Rec| (Some(l.1), Some(r.1))),
        Kind::Left => between.left_join(|l: &Rec, r: Option<&Rec>| (Some(l.1), r.map(|r| r.1))),
        Kind::Right => between.right_join(|l: Option<&Rec>, r: &Rec| (l.map(|l| l.1), Some(r.1))),
        Kind::Full => between.full_join(|l: Option<&Rec>, r: Option<&Rec>| (l.map(|l| l.1), r.map(|r| r.1))),
    };
    let late = rows.side_output(&OutputTag::<Either<Rec, Rec>>::late_records());
    let (rows, late) = (h.output(&timed(&rows)), h.output(&late));
    Join { run: h.start().unwrap(), rows, late }
}

fn inner(bounds: (i64, i64)) -> Join {
    start(Kind::Inner, bounds, (false, false), 4, None)
}

fn sorted(mut rows: Vec<Row>) -> Vec<Row> {
    rows.sort();
    rows
}

/// Bounds are inclusive; each can be made exclusive.
#[test]
fn bounds_are_inclusive_unless_made_exclusive() {
    for (exclusive, want) in [
        ((false, false), vec![1, 2, 3]),
        ((true, false), vec![2, 3]),
        ((false, true), vec![1, 2]),
        ((true, true), vec![2]),
    ] {
        let mut j = start(Kind::Inner, (-5, 5), exclusive, 1, None);
        j.run.push(Either::Left((0, 0)), 100).unwrap();
        for (id, at) in [(1, 95), (2, 100), (3, 105), (4, 94), (5, 106)] {
            j.run.push(Either::Right((0, id)), at).unwrap();
        }
        j.run.finish().unwrap();
        let got: Vec<u32> = sorted(j.rows.take()).iter().filter_map(|r| r.1).collect();
        assert_eq!(got, want, "exclusive {exclusive:?}");
    }
}

/// A pair comes out as soon as its second record arrives, once, at the
/// later of the two times; keys do not meet.
#[test]
fn a_pair_comes_out_at_once_at_the_later_time() {
    let mut j = inner((-10, 10));
    j.run.push(Either::Right((0, 7)), 100).unwrap();
    j.run.push(Either::Left((1, 8)), 100).unwrap();
    j.run.push(Either::Left((0, 1)), 95).unwrap();
    j.run.watermark(94).unwrap();
    assert_eq!(j.rows.take(), [(Some(1), Some(7), Some(100))], "before any watermark reached it");
    j.run.push(Either::Left((0, 2)), 104).unwrap();
    j.run.watermark(95).unwrap();
    assert_eq!(j.rows.take(), [(Some(2), Some(7), Some(104))]);
    j.run.finish().unwrap();
    assert!(j.rows.take().is_empty(), "each pair once; key 1 met no one");
}

/// A record behind the watermark is late: it joins nothing, goes to the
/// late output and counts; one at the watermark is not late.
#[test]
fn a_record_behind_the_watermark_is_late() {
    let mut j = inner((-10, 10));
    j.run.push(Either::Left((0, 1)), 100).unwrap();
    j.run.push(Either::Left((0, 2)), 105).unwrap();
    j.run.watermark(100).unwrap();
    j.run.push(Either::Right((0, 7)), 99).unwrap();
    j.run.push(Either::Right((0, 8)), 100).unwrap();
    j.run.watermark(101).unwrap();
    assert_eq!(j.late.take(), [Either::Right((0, 7))]);
    assert_eq!(sorted(j.rows.take()), [(Some(1), Some(8), Some(100)), (Some(2), Some(8), Some(105))]);
    let report = j.run.finish().unwrap();
    assert_eq!(report.metrics.operator("interval join").unwrap().late, 1);
}

/// Flink's cleanup: a left record is removed once the watermark reaches
/// its time plus the upper bound, even though a right record at exactly
/// that time is not late yet; a right record, once it reaches its time
/// minus the lower bound.
#[test]
fn records_are_removed_when_the_watermark_reaches_their_last_partner_time() {
    let mut j = inner((-3, 5));
    j.run.push(Either::Left((0, 1)), 100).unwrap();
    j.run.watermark(104).unwrap();
    j.run.push(Either::Right((0, 7)), 104).unwrap();
    j.run.watermark(105).unwrap();
    j.run.push(Either::Right((0, 8)), 105).unwrap();
    j.run.watermark(106).unwrap();
    assert_eq!(j.rows.take(), [(Some(1), Some(7), Some(104))], "removed at watermark 105: 8 at 105 finds nothing");
    // The right record at 105 stays until the watermark reaches 108.
    j.run.watermark(107).unwrap();
    j.run.push(Either::Left((0, 2)), 108).unwrap();
    j.run.watermark(108).unwrap();
    j.run.push(Either::Left((0, 3)), 108).unwrap();
    j.run.finish().unwrap();
    assert_eq!(j.rows.take(), [(Some(2), Some(8), Some(108))]);
}

/// An outer join emits a record never paired once, with its own time,
/// when it is removed; a paired one never.
#[test]
fn outer_joins_emit_unpaired_records_once_when_removed() {
    for kind in [Kind::Left, Kind::Right, Kind::Full] {
        let mut j = start(kind, (0, 10), (false, false), 1, None);
        j.run.push(Either::Left((0, 1)), 100).unwrap();
        j.run.push(Either::Left((0, 2)), 200).unwrap();
        j.run.push(Either::Right((0, 7)), 105).unwrap();
        j.run.push(Either::Right((0, 8)), 300).unwrap();
        j.run.watermark(209).unwrap();
        let first = sorted(j.rows.take());
        j.run.watermark(210).unwrap();
        let second = j.rows.take();
        j.run.finish().unwrap();
        let rest = j.rows.take();
        assert!(first.contains(&(Some(1), Some(7), Some(105))), "{kind:?}: {first:?}");
        let left_row = (Some(2), None, Some(200));
        let right_row = (None, Some(8), Some(300));
        let outer_left = matches!(kind, Kind::Left | Kind::Full);
        let outer_right = matches!(kind, Kind::Right | Kind::Full);
        assert_eq!(second.contains(&left_row), outer_left, "{kind:?}: left 2 is removed at 210: {second:?}");
        assert!(!first.contains(&left_row), "{kind:?}: not before");
        assert_eq!(rest.contains(&right_row), outer_right, "{kind:?}: right 8, at the end of input: {rest:?}");
        let all: Vec<Row> = first.iter().chain(&second).chain(&rest).copied().collect();
        assert_eq!(all.len(), 1 + usize::from(outer_left) + usize::from(outer_right), "{kind:?}: {all:?}");
    }
}

/// Bounds that could never match are a wiring error; a record without an
/// event time fails the job, saying why.
#[test]
fn impossible_bounds_and_untimed_records_are_refused() {
    let job = weibo::Job::new("bad");
    let a = job.source(weibo::sources::IterSource::new(vec![1u32])).key_by(|x: &u32| *x);
    let b = job.source(weibo::sources::IterSource::new(vec![1u32])).key_by(|x: &u32| *x);
    a.interval_join(&b).between(5, 1).join(|x: &u32, y: &u32| x + y).sink(weibo::sinks::Blackhole::new());
    let err = job.plan().unwrap_err().to_string();
    assert!(err.contains("lower bound (5 ms) is above the upper bound (1 ms)"), "{err}");

    let job = weibo::Job::new("untimed");
    let a = job.source(weibo::sources::IterSource::new(vec![1u32])).key_by(|x: &u32| *x);
    let b = job.source(weibo::sources::IterSource::new(vec![1u32])).key_by(|x: &u32| *x);
    a.interval_join(&b).between(0, 1).join(|x: &u32, y: &u32| x + y).sink(weibo::sinks::Blackhole::new());
    let err = job.run_blocking().unwrap_err().to_string();
    assert!(err.contains("needs every record's event time"), "{err}");
}

/// The naive join of two sides (key, id, time), with the rows an outer
/// join adds, at their times.
fn naive(kind: Kind, lefts: &[(u8, u32, i64)], rights: &[(u8, u32, i64)], (lower, upper): (i64, i64)) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut paired_right = vec![false; rights.len()];
    for l in lefts {
        let mut paired = false;
        for (i, r) in rights.iter().enumerate() {
            if l.0 == r.0 && l.2 + lower <= r.2 && r.2 <= l.2 + upper {
                rows.push((Some(l.1), Some(r.1), Some(l.2.max(r.2))));
                paired = true;
                paired_right[i] = true;
            }
        }
        if !paired && matches!(kind, Kind::Left | Kind::Full) {
            rows.push((Some(l.1), None, Some(l.2)));
        }
    }
    for (i, r) in rights.iter().enumerate() {
        if !paired_right[i] && matches!(kind, Kind::Right | Kind::Full) {
            rows.push((None, Some(r.1), Some(r.2)));
        }
    }
    sorted(rows)
}

/// The same join as [`start`], in a job of two sources in time order
/// (each side's watermark its latest time minus one) on `partitions`
/// instances: the rows it gives.
fn two_sources(
    kind: Kind,
    (lower, upper): (i64, i64),
    lefts: &[(u8, u32, i64)],
    rights: &[(u8, u32, i64)],
    partitions: usize,
    fjall: Option<&std::path::Path>,
) -> Vec<Row> {
    use weibo::time::WatermarkStrategy;
    let mut t = weibo::testing::TestJob::new("join");
    if let Some(dir) = fjall {
        let backend = weibo::state::FjallBackend::open(dir).unwrap();
        t = t.configure(|job| job.with_state_backend(backend));
    }
    let at = |r: &(u8, u32, i64)| r.2;
    let left = t.input(lefts.to_vec()).with_timestamps(at, WatermarkStrategy::monotonous());
    let right = t.input(rights.to_vec()).with_timestamps(at, WatermarkStrategy::monotonous());
    type Side = (u8, u32, i64);
    let between = left
        .key_by(|l: &Side| l.0)
        .interval_join(&right.key_by(|r: &Side| r.0))
        .between(lower, upper)
        .with_partitions(partitions);
    let rows = match kind {
        Kind::Inner => between.join(|l: &Side, r: &Side| (Some(l.1), Some(r.1))),
        Kind::Left => between.left_join(|l: &Side, r: Option<&Side>| (Some(l.1), r.map(|r| r.1))),
        Kind::Right => between.right_join(|l: Option<&Side>, r: &Side| (l.map(|l| l.1), Some(r.1))),
        Kind::Full => between.full_join(|l: Option<&Side>, r: Option<&Side>| (l.map(|l| l.1), r.map(|r| r.1))),
    };
    let late = t.collect(&rows.side_output(&OutputTag::<Either<Side, Side>>::late_records()));
    let rows = t.collect(&timed(&rows));
    t.run().unwrap();
    assert!(late.values().is_empty(), "nothing is late with each side in time order");
    sorted(rows.values())
}

/// A record whose interval reaches past the end of time (within the upper
/// bound of `i64::MAX`) goes at the end of the input: the job finishes
/// (its key's timer does not come back at the end of time), and an outer
/// join emits it, with a record of the other side that did not pair.
#[test]
fn records_at_the_end_of_time_go_with_the_end_of_the_input() {
    let mut j = start(Kind::Full, (0, 100), (false, false), 1, None);
    j.run.push(Either::Left((1, 7)), i64::MAX - 10).unwrap();
    j.run.push(Either::Right((2, 8)), i64::MAX - 5).unwrap();
    j.run.finish().unwrap();
    assert_eq!(sorted(j.rows.take()), [(None, Some(8), Some(i64::MAX - 5)), (Some(7), None, Some(i64::MAX - 10))]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// With each side in time order and the watermark the minimum of the
    /// sides' latest times minus one, nothing is late and the join gives
    /// the naive join: for an interleaving the test chooses (at one and
    /// four instances), and for whatever interleaving two sources give
    /// (four instances); in memory and on fjall.
    #[test]
    fn every_interleaving_gives_the_naive_join(
        lefts in side(),
        rights in side(),
        order in proptest::collection::vec(any::<bool>(), 48),
        lower in -40i64..20,
        width in 0i64..40,
        kind in prop_oneof![Just(Kind::Inner), Just(Kind::Left), Just(Kind::Right), Just(Kind::Full)],
        fjall in any::<bool>(),
    ) {
        let bounds = (lower, lower + width);
        let lefts: Vec<(u8, u32, i64)> = lefts.iter().enumerate().map(|(i, (k, t))| (*k, i as u32, *t)).collect();
        let rights: Vec<(u8, u32, i64)> = rights.iter().enumerate().map(|(i, (k, t))| (*k, 100 + i as u32, *t)).collect();
        let want = naive(kind, &lefts, &rights, bounds);
        for partitions in [1, 4] {
        let dir = tempfile::tempdir().unwrap();
        let mut j = start(kind, bounds, (false, false), partitions, fjall.then(|| dir.path()));
        let left: Vec<_> = lefts.iter().map(|l| ((l.0, l.1), l.2)).collect();
        let right: Vec<_> = rights.iter().map(|r| ((r.0, r.1), r.2)).collect();
        interleave(&mut j.run, &left, &right, &order);
        j.run.finish().unwrap();
        prop_assert!(j.late.take().is_empty());
        prop_assert_eq!(sorted(j.rows.take()), want.clone(), "{:?} {:?} at {} instances", kind, bounds, partitions);
        }

        let dir = tempfile::tempdir().unwrap();
        let got = two_sources(kind, bounds, &lefts, &rights, 4, fjall.then(|| dir.path()));
        prop_assert_eq!(got, want, "{:?} {:?}, two sources, four instances", kind, bounds);
    }
}

/// The records a join keeps are checkpointed: restored from a savepoint
/// onto three instances, the records buffered before it pair with those
/// that come after, each with its own key's, and none is left unpaired.
#[test]
fn buffered_records_survive_a_savepoint_onto_more_instances() {
    use std::time::Duration;
    use weibo::Job;
    use weibo::sinks::CollectSink;
    use weibo::sources::{Generator, IterSource};
    use weibo::time::WatermarkStrategy;
    type Side = (u8, u32, i64);
    fn wire(partitions: usize, left: Stream<Side>, right: Stream<Side>, out: &CollectSink<(Option<u32>, Option<u32>)>) {
        let at = |r: &Side| r.2;
        let left = left.with_timestamps(at, WatermarkStrategy::monotonous());
        let right = right.with_timestamps(at, WatermarkStrategy::monotonous());
        left.key_by(|l: &Side| l.0)
            .interval_join(&right.key_by(|r: &Side| r.0))
            .between(0, 1_000_000)
            .with_partitions(partitions)
            .full_join(|l: Option<&Side>, r: Option<&Side>| (l.map(|l| l.1), r.map(|r| r.1)))
            .uid("join")
            .sink(out.clone());
    }
    let dir = tempfile::tempdir().unwrap();
    // Left records of keys 0..4 at times 0, 1, 2, ...; the right input
    // (key 9, which no left record has) holds the watermark back.
    let job = Job::new("join").with_checkpoints(dir.path(), Duration::from_secs(3600)).with_max_key_groups(16);
    let left =
        job.source(Generator::new(u64::MAX, |i| ((i % 4) as u8, i as u32, i as i64)).with_rate(2_000.0)).uid("left");
    let right = job.source(Generator::new(u64::MAX, |i| (9u8, 1_000_000 + i as u32, 0i64)).with_rate(1.0)).uid("right");
    let before = CollectSink::new();
    wire(1, left, right, &before);
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(400));
    assert!(before.values().iter().all(|r| r.0.is_none() || r.1.is_none()), "no pairs before: {:?}", before.values());

    // After: one right record per key at time 500 000 pairs with every
    // left record of its key buffered before the savepoint.
    let job = Job::new("join")
        .with_checkpoints(dir.path().join("v2"), Duration::from_secs(3600))
        .with_max_key_groups(16)
        .restore_from(&savepoint)
        .allow_unrestored_state();
    let left = job.source(IterSource::new(Vec::<Side>::new())).uid("left-after");
    let right = job
        .source(IterSource::new((0..4u8).map(|k| (k, 2_000 + u32::from(k), 500_000)).collect::<Vec<_>>()))
        .uid("right-after");
    let after = CollectSink::new();
    wire(3, left, right, &after);
    job.run_blocking().unwrap();
    let rows = after.values();
    let pairs: Vec<_> = rows.iter().filter(|r| r.0.is_some() && r.1.is_some()).collect();
    let unpaired_left: Vec<_> = rows.iter().filter(|r| r.1.is_none()).collect();
    assert!(pairs.len() > 100, "the buffered left records paired: {}", pairs.len());
    for (l, r) in pairs.iter().map(|p| (p.0.unwrap(), p.1.unwrap())) {
        assert_eq!(l % 4, r - 2_000, "left {l} paired with its key's right record {r}");
    }
    assert!(unpaired_left.is_empty(), "every left record had a partner: {unpaired_left:?}");
}
