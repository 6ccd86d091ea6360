//! Window joins and co-groups, pinned case by case against Flink's
//! semantics (the table in the book's Time chapter), then against a naive
//! join of the same finite input in tumbling, sliding and session windows
//! for random interleavings of the two sides, at 1 and 4 instances, in
//! memory and on fjall.
//!
//! As in `interval_join.rs`, the two sides come from one harness input of
//! `Either`s split in two, so that the test decides the order in which the
//! join sees the records and the watermark after each one.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use weibo::Stream;
use weibo::on_error;
use weibo::process::Either;
use weibo::record::Timestamp;
use weibo::testing::{Harness, Probe, RunningHarness};
use weibo::window::{Session, Sliding, Tumbling, WindowContext};
use weibo_tests::two_inputs::{interleave, side, split};

/// A record: its key and an id.
type Rec = (u8, u32);
/// A row as the join emits it: the left id, the right id.
type Ids = (Option<u32>, Option<u32>);
/// What the tests collect: the left id, the right id, the output's time.
type Row = (Option<u32>, Option<u32>, Option<Timestamp>);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Inner,
    Left,
    Right,
    Full,
    /// A co-group emitting one row per window: the lowest left and right
    /// ids (or `None`), so that a window with one side empty shows.
    CoGroup,
}

#[derive(Clone, Copy, Debug)]
enum Windows {
    Tumbling(u64),
    Sliding(u64, u64),
    Session(u64),
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

/// The join of `kind` in `windows` between two keyed sides.
fn wire(
    kind: Kind,
    windows: Windows,
    lateness: u64,
    partitions: usize,
    left: &Stream<Rec>,
    right: &Stream<Rec>,
) -> (Stream<Ids>, Stream<Either<Rec, Rec>>) {
    let ms = Duration::from_millis;
    let (l, r) = (left.key_by(|l: &Rec| l.0), right.key_by(|r: &Rec| r.0));
    macro_rules! windowed {
        ($builder:expr) => {
            match windows {
                Windows::Tumbling(size) => $builder.window(Tumbling::of(ms(size))),
                Windows::Sliding(size, slide) => $builder.window(Sliding::of(ms(size), ms(slide))),
                Windows::Session(gap) => $builder.window(Session::with_gap(ms(gap))),
            }
            .allowed_lateness(ms(lateness))
        };
    }
    let output = if kind == Kind::CoGroup {
        windowed!(l.co_group(&r).with_partitions(partitions)).apply(
            |_: &WindowContext<'_, u8>, left: &[&Rec], right: &[&Rec], out: &mut Vec<(Option<u32>, Option<u32>)>| {
                out.push((left.iter().map(|l| l.1).min(), right.iter().map(|r| r.1).min()));
            },
        )
    } else {
        let joined = windowed!(l.join(&r).with_partitions(partitions));
        match kind {
            Kind::Left => joined.left_join(|l: &Rec, r: Option<&Rec>| (Some(l.1), r.map(|r| r.1))),
            Kind::Right => joined.right_join(|l: Option<&Rec>, r: &Rec| (l.map(|l| l.1), Some(r.1))),
            Kind::Full => joined.full_join(|l: Option<&Rec>, r: Option<&Rec>| (l.map(|l| l.1), r.map(|r| r.1))),
            _ => joined.apply(|l: &Rec, r: &Rec| (Some(l.1), Some(r.1))),
        }
    };
    let late = output.late_records();
    (output.into_stream(), late)
}

/// Starts a join of `kind` in `windows` on `partitions` instances, on
/// fjall if `fjall` is given.
fn start(kind: Kind, windows: Windows, lateness: u64, partitions: usize, fjall: Option<&std::path::Path>) -> Join {
    let mut h = Harness::<Either<Rec, Rec>>::new("join");
    if let Some(dir) = fjall {
        let backend = weibo::state::FjallBackend::open(dir).unwrap();
        h = h.configure(|job| job.with_state_backend(backend));
    }
    let input = h.input();
    let (left, right) = split(&input);
    let (rows, late) = wire(kind, windows, lateness, partitions, &left, &right);
    let (rows, late) = (h.output(&timed(&rows)), h.output(&late));
    Join { run: h.start().unwrap(), rows, late }
}

fn sorted(mut rows: Vec<Row>) -> Vec<Row> {
    rows.sort();
    rows
}

/// Nothing comes out before the window fires; then every pair of the
/// window, at its last timestamp; keys and windows do not meet.
#[test]
fn pairs_come_out_when_the_window_fires_at_its_last_timestamp() {
    let mut j = start(Kind::Inner, Windows::Tumbling(100), 0, 4, None);
    j.run.push(Either::Left((0, 1)), 110).unwrap();
    j.run.push(Either::Right((0, 7)), 150).unwrap();
    j.run.push(Either::Left((0, 2)), 199).unwrap();
    j.run.push(Either::Right((1, 8)), 120).unwrap();
    j.run.push(Either::Right((0, 9)), 200).unwrap();
    j.run.watermark(198).unwrap();
    assert!(j.rows.take().is_empty(), "the window [100, 200) has not fired");
    j.run.watermark(199).unwrap();
    assert_eq!(sorted(j.rows.take()), [(Some(1), Some(7), Some(199)), (Some(2), Some(7), Some(199))]);
    j.run.finish().unwrap();
    assert!(j.rows.take().is_empty(), "9 is in the next window, 8 has another key");
}

/// In sliding windows a pair is emitted once per window that holds both
/// records (as in Flink); in session windows a session spans the records
/// of both sides.
#[test]
fn sliding_windows_repeat_pairs_and_sessions_span_both_sides() {
    let mut j = start(Kind::Inner, Windows::Sliding(100, 50), 0, 1, None);
    j.run.push(Either::Left((0, 1)), 120).unwrap();
    j.run.push(Either::Right((0, 7)), 140).unwrap();
    j.run.finish().unwrap();
    assert_eq!(sorted(j.rows.take()), [(Some(1), Some(7), Some(149)), (Some(1), Some(7), Some(199))]);

    let mut j = start(Kind::Inner, Windows::Session(10), 0, 1, None);
    // Left 1 at 100, right 7 at 109: one session [100, 119); left 2 at
    // 120 starts another (at 119 it would touch the first, and sessions
    // that touch merge, as in Flink), which right 8 at 125 joins.
    j.run.push(Either::Left((0, 1)), 100).unwrap();
    j.run.push(Either::Right((0, 7)), 109).unwrap();
    j.run.push(Either::Left((0, 2)), 120).unwrap();
    j.run.push(Either::Right((0, 8)), 125).unwrap();
    j.run.finish().unwrap();
    assert_eq!(sorted(j.rows.take()), [(Some(1), Some(7), Some(118)), (Some(2), Some(8), Some(134))]);
}

/// Within the allowed lateness a record re-fires its window, which emits
/// all of its pairs again; later than that it joins nothing, goes to the
/// late output and counts.
#[test]
fn lateness_refires_with_every_pair_then_records_are_late() {
    let mut j = start(Kind::Inner, Windows::Tumbling(100), 50, 1, None);
    j.run.push(Either::Left((0, 1)), 110).unwrap();
    j.run.push(Either::Right((0, 7)), 120).unwrap();
    j.run.watermark(199).unwrap();
    assert_eq!(j.rows.take(), [(Some(1), Some(7), Some(199))]);
    j.run.push(Either::Right((0, 8)), 130).unwrap();
    j.run.watermark(200).unwrap();
    assert_eq!(sorted(j.rows.take()), [(Some(1), Some(7), Some(199)), (Some(1), Some(8), Some(199))]);
    j.run.watermark(249).unwrap();
    j.run.push(Either::Left((0, 2)), 150).unwrap();
    j.run.watermark(250).unwrap();
    assert_eq!(j.late.take(), [Either::Left((0, 2))]);
    let report = j.run.finish().unwrap();
    assert!(j.rows.take().is_empty());
    assert_eq!(report.metrics.operator("window join").unwrap().late, 1);
}

/// Outer joins emit, when the window fires, each record of a window whose
/// other side is empty, at the window's last timestamp; a co-group sees
/// every window with a record of either side.
#[test]
fn outer_joins_and_co_groups_see_windows_with_one_side() {
    for kind in [Kind::Inner, Kind::Left, Kind::Right, Kind::Full, Kind::CoGroup] {
        let mut j = start(kind, Windows::Tumbling(100), 0, 1, None);
        j.run.push(Either::Left((0, 1)), 110).unwrap(); // with 7
        j.run.push(Either::Right((0, 7)), 120).unwrap();
        j.run.push(Either::Left((0, 2)), 210).unwrap(); // alone
        j.run.push(Either::Right((0, 8)), 310).unwrap(); // alone
        j.run.finish().unwrap();
        let mut want = vec![(Some(1), Some(7), Some(199))];
        if matches!(kind, Kind::Left | Kind::Full | Kind::CoGroup) {
            want.push((Some(2), None, Some(299)));
        }
        if matches!(kind, Kind::Right | Kind::Full | Kind::CoGroup) {
            want.push((None, Some(8), Some(399)));
        }
        assert_eq!(sorted(j.rows.take()), sorted(want), "{kind:?}");
    }
}

/// The windows of a record at `t`, as `(start, end)`.
fn windows_of(windows: Windows, t: i64) -> Vec<(i64, i64)> {
    match windows {
        Windows::Tumbling(size) => {
            let size = size as i64;
            let start = t - t.rem_euclid(size);
            vec![(start, start + size)]
        }
        Windows::Sliding(size, slide) => {
            let (size, slide) = (size as i64, slide as i64);
            let mut start = t - t.rem_euclid(slide);
            let mut out = Vec::new();
            while start > t - size {
                out.push((start, start + size));
                start -= slide;
            }
            out
        }
        Windows::Session(_) => unreachable!("sessions depend on the other records"),
    }
}

/// The naive join: each key's windows with the records of both sides in
/// them, then the rows of `kind` for each window at its last timestamp.
fn naive(kind: Kind, windows: Windows, lefts: &[(u8, u32, i64)], rights: &[(u8, u32, i64)]) -> Vec<Row> {
    type Contents = (Vec<u32>, Vec<u32>);
    let mut per_window: BTreeMap<(u8, i64, i64), Contents> = BTreeMap::new();
    let all: Vec<(bool, (u8, u32, i64))> =
        lefts.iter().map(|l| (true, *l)).chain(rights.iter().map(|r| (false, *r))).collect();
    if let Windows::Session(gap) = windows {
        let gap = gap as i64;
        let mut by_key: BTreeMap<u8, Vec<(i64, bool, u32)>> = BTreeMap::new();
        for (is_left, (k, id, t)) in &all {
            by_key.entry(*k).or_default().push((*t, *is_left, *id));
        }
        for (k, mut records) in by_key {
            records.sort_unstable();
            let mut session: Option<(i64, i64, Contents)> = None;
            for (t, is_left, id) in records {
                // Sessions that touch merge (Flink's `TimeWindow::intersects`).
                let open = session.as_ref().is_some_and(|(_, end, _)| t <= *end);
                if !open && let Some((s, e, c)) = session.take() {
                    per_window.insert((k, s, e), c);
                }
                let (_, end, contents) = session.get_or_insert_with(|| (t, t + gap, Default::default()));
                *end = (*end).max(t + gap);
                if is_left { contents.0.push(id) } else { contents.1.push(id) }
            }
            if let Some((s, e, c)) = session {
                per_window.insert((k, s, e), c);
            }
        }
    } else {
        for (is_left, (k, id, t)) in &all {
            for (s, e) in windows_of(windows, *t) {
                let contents = per_window.entry((*k, s, e)).or_default();
                if *is_left { contents.0.push(*id) } else { contents.1.push(*id) }
            }
        }
    }
    let mut rows = Vec::new();
    for ((_, _, end), (left, right)) in per_window {
        let at = Some(end - 1);
        if kind == Kind::CoGroup {
            rows.push((left.iter().min().copied(), right.iter().min().copied(), at));
            continue;
        }
        for l in &left {
            for r in &right {
                rows.push((Some(*l), Some(*r), at));
            }
        }
        if right.is_empty() && matches!(kind, Kind::Left | Kind::Full) {
            rows.extend(left.iter().map(|l| (Some(*l), None, at)));
        }
        if left.is_empty() && matches!(kind, Kind::Right | Kind::Full) {
            rows.extend(right.iter().map(|r| (None, Some(*r), at)));
        }
    }
    sorted(rows)
}

/// The same join in a job of two sources in time order on `partitions`
/// instances: the rows it gives.
fn two_sources(
    kind: Kind,
    windows: Windows,
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
    let strip = |r: (u8, u32, i64)| (r.0, r.1);
    let left = t.input(lefts.to_vec()).with_timestamps(at, WatermarkStrategy::monotonous()).map(strip);
    let right = t.input(rights.to_vec()).with_timestamps(at, WatermarkStrategy::monotonous()).map(strip);
    let (rows, late) = wire(kind, windows, 0, partitions, &left, &right);
    let late = t.collect(&late);
    let rows = t.collect(&timed(&rows));
    t.run().unwrap();
    assert!(late.values().is_empty(), "nothing is late with each side in time order");
    sorted(rows.values())
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
        windows in prop_oneof![
            (10u64..120).prop_map(Windows::Tumbling),
            (1u64..6, 1u64..4).prop_map(|(n, slide)| Windows::Sliding(n * slide * 10, slide * 10)),
            (1u64..60).prop_map(Windows::Session),
        ],
        kind in prop_oneof![Just(Kind::Inner), Just(Kind::Left), Just(Kind::Right), Just(Kind::Full), Just(Kind::CoGroup)],
        fjall in any::<bool>(),
    ) {
        let lefts: Vec<(u8, u32, i64)> = lefts.iter().enumerate().map(|(i, (k, t))| (*k, i as u32, *t)).collect();
        let rights: Vec<(u8, u32, i64)> = rights.iter().enumerate().map(|(i, (k, t))| (*k, 100 + i as u32, *t)).collect();
        let want = naive(kind, windows, &lefts, &rights);
        for partitions in [1, 4] {
        let dir = tempfile::tempdir().unwrap();
        let mut j = start(kind, windows, 0, partitions, fjall.then(|| dir.path()));
        let left: Vec<_> = lefts.iter().map(|l| ((l.0, l.1), l.2)).collect();
        let right: Vec<_> = rights.iter().map(|r| ((r.0, r.1), r.2)).collect();
        interleave(&mut j.run, &left, &right, &order);
        j.run.finish().unwrap();
        prop_assert!(j.late.take().is_empty());
        prop_assert_eq!(sorted(j.rows.take()), want.clone(), "{:?} {:?} at {} instances", kind, windows, partitions);
        }

        let dir = tempfile::tempdir().unwrap();
        let got = two_sources(kind, windows, &lefts, &rights, 4, fjall.then(|| dir.path()));
        prop_assert_eq!(got, want, "{:?} {:?}, two sources, four instances", kind, windows);
    }
}

/// A window's records of both sides are checkpointed: restored from a
/// savepoint onto three instances, the left records kept before it pair
/// with the right records that come after.
#[test]
fn window_contents_survive_a_savepoint_onto_more_instances() {
    use weibo::Job;
    use weibo::sinks::CollectSink;
    use weibo::sources::{Generator, IterSource};
    use weibo::time::WatermarkStrategy;
    type Side = (u8, u32, i64);
    fn wire(partitions: usize, left: Stream<Side>, right: Stream<Side>, out: &CollectSink<(u32, u32)>) {
        let at = |r: &Side| r.2;
        let left = left.with_timestamps(at, WatermarkStrategy::monotonous());
        let right = right.with_timestamps(at, WatermarkStrategy::monotonous());
        left.key_by(|l: &Side| l.0)
            .join(&right.key_by(|r: &Side| r.0))
            .with_partitions(partitions)
            .window(Tumbling::of(Duration::from_secs(3600)))
            .apply(|l: &Side, r: &Side| (l.1, r.1))
            .uid("join")
            .sink(out.clone());
    }
    let dir = tempfile::tempdir().unwrap();
    // Left records of keys 0..4 at times 0, 1, 2, ... in one long window;
    // the right input holds the watermark back until the end.
    let job = Job::new("join").with_checkpoints(dir.path(), Duration::from_secs(3600)).with_max_key_groups(16);
    let left =
        job.source(Generator::new(u64::MAX, |i| ((i % 4) as u8, i as u32, i as i64)).with_rate(2_000.0)).uid("left");
    let right = job.source(Generator::new(u64::MAX, |i| (9u8, 1_000_000 + i as u32, 0i64)).with_rate(1.0)).uid("right");
    let before = CollectSink::new();
    wire(1, left, right, &before);
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(400));
    assert!(before.values().is_empty(), "the window has not fired: {:?}", before.values());

    // After the restore: one right record per key in the same window.
    let job = Job::new("join")
        .with_checkpoints(dir.path().join("v2"), Duration::from_secs(3600))
        .with_max_key_groups(16)
        .restore_from(&savepoint)
        .allow_unrestored_state();
    let left = job.source(IterSource::new(Vec::<Side>::new())).uid("left-after");
    let right = job
        .source(IterSource::new((0..4u8).map(|k| (k, 2_000 + u32::from(k), 10)).collect::<Vec<_>>()))
        .uid("right-after");
    let after = CollectSink::new();
    wire(3, left, right, &after);
    job.run_blocking().unwrap();
    let rows = after.values();
    assert!(rows.len() > 100, "the kept left records paired: {}", rows.len());
    for (l, r) in &rows {
        assert_eq!(l % 4 + 2_000, *r, "left {l} pairs with its key's right record");
    }
    let lefts: std::collections::BTreeSet<u32> = rows.iter().map(|(l, _)| *l).collect();
    assert_eq!(lefts.len(), rows.len(), "each left record pairs once");
    assert_eq!(*lefts.iter().next_back().unwrap() as usize + 1, lefts.len(), "no left record kept was lost: {lefts:?}");
}
