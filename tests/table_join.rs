//! A stream joined with a table: the temporal (versioned table) join,
//! pinned case by case (the table in the book's Time chapter), then
//! against a naive join of the same finite input for random interleavings
//! of the two inputs, at 1 and 4 instances, in memory and on fjall; its
//! old versions removed as the watermark passes them; and the
//! latest-value join.
//!
//! As in `interval_join.rs`, the two inputs come from one harness input of
//! `Either`s split in two, so that the test decides the order in which the
//! join sees the records and the watermark after each one.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::time::Duration;

use proptest::prelude::*;
use weibo::Stream;
use weibo::on_error;
use weibo::process::{Either, OutputTag};
use weibo::record::Timestamp;
use weibo::testing::{Harness, Probe, RunningHarness};
use weibo_tests::two_inputs::{interleave, side, split};

/// A stream record: its key and an id.
type Rec = (u8, u32);
/// A table row: its key and a version id (0 deletes the key).
type Row = (u8, u32);
/// What the tests collect: the record's id, the version's id, the output's
/// time.
type Out = (u32, Option<u32>, Option<Timestamp>);

struct Join {
    run: RunningHarness<Either<Rec, Row>>,
    rows: Probe<Out>,
    late: Probe<Either<Rec, Row>>,
}

fn timed(rows: &Stream<(u32, Option<u32>)>) -> Stream<Out> {
    rows.process_with_outputs(
        on_error::Fail,
        |_| (),
        |ctx, (), r: &(u32, Option<u32>)| {
            let at = ctx.timestamp();
            ctx.emit((r.0, r.1, at));
        },
    )
}

/// A temporal join (left if `outer`) with `retention` ms, on `partitions`
/// instances, on fjall if `fjall` is given; rows with version 0 delete.
fn start(outer: bool, retention: u64, partitions: usize, fjall: Option<&std::path::Path>) -> Join {
    let mut h = Harness::<Either<Rec, Row>>::new("temporal");
    if let Some(dir) = fjall {
        let backend = weibo::state::FjallBackend::open(dir).unwrap();
        h = h.configure(|job| job.with_state_backend(backend));
    }
    let (left, right) = split(&h.input());
    let builder = left
        .key_by(|l: &Rec| l.0)
        .temporal_join(&right.key_by(|r: &Row| r.0))
        .retention(Duration::from_millis(retention))
        .with_deletes(|r: &Row| r.1 == 0)
        .with_partitions(partitions);
    let rows = if outer {
        builder.left_join(|l: &Rec, r: Option<&Row>| (l.1, r.map(|r| r.1)))
    } else {
        builder.join(|l: &Rec, r: &Row| (l.1, Some(r.1)))
    };
    let late = rows.side_output(&OutputTag::<Either<Rec, Row>>::late_records());
    let (rows, late) = (h.output(&timed(&rows)), h.output(&late));
    Join { run: h.start().unwrap(), rows, late }
}

fn sorted(mut rows: Vec<Out>) -> Vec<Out> {
    rows.sort();
    rows
}

/// A record waits until the watermark passes its time, then meets the
/// newest row at or before it (one at exactly its time included, one after
/// it not), once, at its own time; keys do not meet.
#[test]
fn a_record_meets_the_version_valid_at_its_time_once_the_watermark_passes_it() {
    let mut j = start(false, 0, 4, None);
    j.run.push(Either::Right((0, 10)), 100).unwrap();
    j.run.push(Either::Left((0, 1)), 150).unwrap();
    j.run.push(Either::Left((1, 2)), 150).unwrap();
    j.run.watermark(150).unwrap();
    assert!(j.rows.take().is_empty(), "at watermark 150 a row at 150 may still come");
    j.run.push(Either::Right((0, 11)), 150).unwrap();
    j.run.push(Either::Right((0, 12)), 151).unwrap();
    j.run.watermark(151).unwrap();
    assert_eq!(j.rows.take(), [(1, Some(11), Some(150))]);
    j.run.finish().unwrap();
    assert!(j.rows.take().is_empty(), "once; key 1 has no row");
}

/// The inner join emits nothing for a record without a row at its time
/// (none yet, or deleted); the left join emits it with `None`.
#[test]
fn records_without_a_row_and_deletes() {
    for outer in [false, true] {
        let mut j = start(outer, 0, 1, None);
        j.run.push(Either::Left((0, 1)), 50).unwrap(); // before any row
        j.run.push(Either::Right((0, 10)), 100).unwrap();
        j.run.push(Either::Left((0, 2)), 150).unwrap();
        j.run.push(Either::Right((0, 0)), 200).unwrap(); // deleted from 200
        j.run.push(Either::Left((0, 3)), 250).unwrap();
        j.run.push(Either::Right((0, 11)), 300).unwrap();
        j.run.push(Either::Left((0, 4)), 300).unwrap();
        j.run.finish().unwrap();
        let mut want = vec![(2, Some(10), Some(150)), (4, Some(11), Some(300))];
        if outer {
            want.extend([(1, None, Some(50)), (3, None, Some(250))]);
        }
        assert_eq!(sorted(j.rows.take()), sorted(want), "outer: {outer}");
    }
}

/// Without a retention, a record of either input behind the watermark is
/// late: it goes to the late output and counts, and a late row is not a
/// version.
#[test]
fn records_and_rows_behind_the_watermark_are_late() {
    let mut j = start(true, 0, 1, None);
    j.run.push(Either::Right((0, 10)), 100).unwrap();
    j.run.push(Either::Left((0, 1)), 200).unwrap();
    j.run.watermark(180).unwrap();
    j.run.push(Either::Right((0, 11)), 179).unwrap();
    j.run.push(Either::Left((0, 2)), 179).unwrap();
    j.run.push(Either::Right((0, 12)), 180).unwrap();
    let report = j.run.finish().unwrap();
    let late = j.late.take();
    assert!(
        late.len() == 2 && late.contains(&Either::Right((0, 11))) && late.contains(&Either::Left((0, 2))),
        "{late:?}"
    );
    assert_eq!(j.rows.take(), [(1, Some(12), Some(200))]);
    assert_eq!(report.metrics.operator("temporal left join").unwrap().late, 2);
}

/// Within the retention a late record is joined at once with the versions
/// kept, and a late row is kept; beyond it, both are late.
#[test]
fn the_retention_takes_records_that_late() {
    let mut j = start(false, 100, 1, None);
    j.run.push(Either::Right((0, 10)), 100).unwrap();
    j.run.push(Either::Right((0, 11)), 200).unwrap();
    j.run.watermark(290).unwrap();
    j.run.push(Either::Left((0, 1)), 195).unwrap(); // 95 late: joined now
    j.run.push(Either::Right((0, 12)), 196).unwrap(); // 94 late: kept
    j.run.watermark(291).unwrap();
    assert_eq!(j.rows.take(), [(1, Some(10), Some(195))]);
    j.run.push(Either::Left((0, 2)), 197).unwrap();
    j.run.watermark(292).unwrap();
    assert_eq!(j.rows.take(), [(2, Some(12), Some(197))]);
    j.run.push(Either::Left((0, 3)), 191).unwrap(); // 101 late
    j.run.push(Either::Right((0, 13)), 191).unwrap();
    j.run.finish().unwrap();
    let late = j.late.take();
    assert!(
        late.len() == 2 && late.contains(&Either::Left((0, 3))) && late.contains(&Either::Right((0, 13))),
        "{late:?}"
    );
    assert!(j.rows.take().is_empty());
}

/// The naive temporal join: each record with its key's newest row at or
/// before its time.
fn naive(outer: bool, records: &[(u8, u32, i64)], rows: &[(u8, u32, i64)]) -> Vec<Out> {
    let mut out = Vec::new();
    for &(key, id, at) in records {
        // Rows of one key at one time: the last one given wins.
        let version = rows.iter().filter(|r| r.0 == key && r.2 <= at).max_by_key(|r| r.2).map(|r| {
            let last = rows.iter().rev().find(|o| o.0 == key && o.2 == r.2).unwrap_or(r);
            last.1
        });
        match version {
            Some(v) if v != 0 => out.push((id, Some(v), Some(at))),
            _ if outer => out.push((id, None, Some(at))),
            _ => {}
        }
    }
    sorted(out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// With each input in time order and the watermark the minimum of the
    /// inputs' latest times minus one, nothing is late and the join gives
    /// the naive join, at one and four instances, in memory and on fjall.
    #[test]
    fn every_interleaving_gives_the_naive_join(
        records in side(),
        rows in side(),
        versions in proptest::collection::vec(0u32..4, 24),
        order in proptest::collection::vec(any::<bool>(), 48),
        outer in any::<bool>(),
        fjall in any::<bool>(),
    ) {
        let records: Vec<(u8, u32, i64)> = records.iter().enumerate().map(|(i, (k, t))| (*k, i as u32, *t)).collect();
        // Version ids: 0 deletes; others are unique (100 + position).
        let rows: Vec<(u8, u32, i64)> = rows
            .iter()
            .enumerate()
            .map(|(i, (k, t))| (*k, if versions[i] == 0 { 0 } else { 100 + i as u32 }, *t))
            .collect();
        let want = naive(outer, &records, &rows);
        for partitions in [1, 4] {
        let dir = tempfile::tempdir().unwrap();
        let mut j = start(outer, 0, partitions, fjall.then(|| dir.path()));
        let left: Vec<_> = records.iter().map(|l| ((l.0, l.1), l.2)).collect();
        let right: Vec<_> = rows.iter().map(|r| ((r.0, r.1), r.2)).collect();
        interleave(&mut j.run, &left, &right, &order);
        j.run.finish().unwrap();
        prop_assert!(j.late.take().is_empty());
        prop_assert_eq!(sorted(j.rows.take()), want.clone(), "outer {} at {} instances", outer, partitions);
        }
    }
}

/// A key's versions older than its newest one behind the watermark are
/// removed: with rows for 10 keys every millisecond for as long as the job
/// runs, the versions kept stay a few per key.
#[test]
fn old_versions_are_removed_as_the_watermark_passes() {
    use weibo::Job;
    use weibo::sources::Generator;
    use weibo::time::WatermarkStrategy;
    type Timed = (u8, u32, i64);
    let job = Job::new("versions");
    let at = |r: &Timed| r.2;
    let records = job
        .source(Generator::new(u64::MAX, |i| ((i % 10) as u8, i as u32, i as i64)).with_rate(20_000.0))
        .with_timestamps(at, WatermarkStrategy::monotonous());
    let rows = job
        .source(Generator::new(u64::MAX, |i| ((i % 10) as u8, i as u32 + 1, i as i64)).with_rate(20_000.0))
        .with_timestamps(at, WatermarkStrategy::monotonous());
    records
        .key_by(|r: &Timed| r.0)
        .temporal_join(&rows.key_by(|r: &Timed| r.0))
        .join(|r: &Timed, v: &Timed| (r.1, v.1))
        .sink(weibo::sinks::Blackhole::new());
    let (kept, joined) = weibo::testing::block_on(async {
        let handle = job.spawn().unwrap();
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let metrics = handle.metrics();
        handle.abort();
        let join = metrics.operator("temporal join").unwrap().clone();
        let versions = join.state.iter().find(|s| s.state == "versions").map_or(0, |s| s.memory_entries);
        (versions, join.records_out)
    });
    assert!(joined > 10_000, "the job ran: {joined} rows joined");
    assert!(kept < 2_000, "{kept} versions kept after {joined} rows joined");
}

/// The latest-value join: a record meets the row its key had when it
/// arrived, at once; a later row changes nothing already emitted; a
/// delete removes the key's row.
#[test]
fn the_latest_join_meets_the_row_seen_last() {
    let mut h = Harness::<Either<Rec, Row>>::new("latest");
    let (left, right) = split(&h.input());
    let joined = left
        .key_by(|l: &Rec| l.0)
        .latest_join(&right.key_by(|r: &Row| r.0))
        .with_deletes(|r: &Row| r.1 == 0)
        .left_join(|l: &Rec, r: Option<&Row>| (l.1, r.map(|r| r.1)));
    let rows = h.output(&timed(&joined));
    let mut run = h.start().unwrap();
    // The two inputs reach the join in the order of their batches; a
    // watermark sends each batch on, so one after each record sets the
    // order (the watermark itself plays no part in this join).
    let mut step = 0;
    let mut push = |run: &mut RunningHarness<Either<Rec, Row>>, record, at| {
        run.push(record, at).unwrap();
        step += 1;
        run.watermark(step).unwrap();
    };
    push(&mut run, Either::Left((0, 1)), 500);
    push(&mut run, Either::Right((0, 10)), 900);
    push(&mut run, Either::Left((0, 2)), 100); // event time plays no part
    assert_eq!(rows.take(), [(1, None, Some(500)), (2, Some(10), Some(100))]);
    push(&mut run, Either::Right((0, 11)), 0);
    push(&mut run, Either::Left((0, 3)), 0);
    push(&mut run, Either::Right((0, 0)), 0);
    push(&mut run, Either::Left((0, 4)), 0);
    push(&mut run, Either::Left((1, 5)), 0);
    run.finish().unwrap();
    assert_eq!(sorted(rows.take()), [(3, Some(11), Some(0)), (4, None, Some(0)), (5, None, Some(0))]);
}

/// A temporal join's versions are checkpointed: restored from a savepoint
/// onto three instances, records that come after it meet the rows kept
/// before it, each its own key's.
#[test]
fn versions_survive_a_savepoint_onto_more_instances() {
    use weibo::Job;
    use weibo::sinks::CollectSink;
    use weibo::sources::{Generator, IterSource};
    use weibo::time::WatermarkStrategy;
    type Timed = (u8, u32, i64);
    fn wire(partitions: usize, records: Stream<Timed>, rows: Stream<Timed>, out: &CollectSink<(u32, Option<u32>)>) {
        let at = |r: &Timed| r.2;
        let records = records.with_timestamps(at, WatermarkStrategy::monotonous());
        let rows = rows.with_timestamps(at, WatermarkStrategy::monotonous());
        records
            .key_by(|r: &Timed| r.0)
            .temporal_join(&rows.key_by(|r: &Timed| r.0))
            .with_partitions(partitions)
            .left_join(|r: &Timed, v: Option<&Timed>| (r.1, v.map(|v| v.1)))
            .uid("join")
            .sink(out.clone());
    }
    let dir = tempfile::tempdir().unwrap();
    // Before: rows for keys 0..4 at times 0, 1, 2, ... (version id = time);
    // the stream input, at time 0 and key 9 (no rows), holds the watermark.
    let job = Job::new("temporal").with_checkpoints(dir.path(), Duration::from_secs(3600)).with_max_key_groups(16);
    let rows =
        job.source(Generator::new(u64::MAX, |i| ((i % 4) as u8, i as u32, i as i64)).with_rate(2_000.0)).uid("rows");
    let records = job.source(Generator::new(u64::MAX, |i| (9u8, i as u32, 0i64)).with_rate(1.0)).uid("records");
    let before = CollectSink::new();
    wire(1, records, rows, &before);
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(400));

    // After: one record per key, far ahead; each meets its key's newest
    // row kept before the savepoint.
    let job = Job::new("temporal")
        .with_checkpoints(dir.path().join("v2"), Duration::from_secs(3600))
        .with_max_key_groups(16)
        .restore_from(&savepoint)
        .allow_unrestored_state();
    let records = job
        .source(IterSource::new((0..4u8).map(|k| (k, 1_000 + u32::from(k), 1_000_000)).collect::<Vec<_>>()))
        .uid("records-after");
    let rows = job.source(IterSource::new(Vec::<Timed>::new())).uid("rows-after");
    let after = CollectSink::new();
    wire(3, records, rows, &after);
    job.run_blocking().unwrap();
    let mut got = after.values();
    // A key-9 record waiting at the savepoint meets no row; the rest:
    got.retain(|r| r.0 >= 1_000);
    got.sort_unstable();
    assert_eq!(got.len(), 4, "{got:?}");
    let newest = got.iter().filter_map(|r| r.1).max().unwrap();
    assert!(newest > 100, "rows were kept before the savepoint: {got:?}");
    for (record, version) in got {
        let version = version.unwrap_or_else(|| panic!("record {record} met no row"));
        assert_eq!(version % 4, record - 1_000, "record {record} met its key's row");
        assert!(newest - version < 4, "record {record} met its key's newest row {version} (newest {newest})");
    }
}
