//! Focused event-time cases: idle partitions, re-firing within allowed
//! lateness, the late-records output, and the end-of-input flush, driven by
//! hand through `weibo::testing::Harness`.

use std::time::Duration;

use weibo::sinks::CollectSink;
use weibo::sources::{ReadStatus, Source, SourceOutput, SourceReader};
use weibo::testing::Harness;
use weibo::time::WatermarkStrategy;
use weibo::window::{Count, Session, Tumbling, WindowResult};
use weibo::{BoxFuture, Job};

const MS: fn(u64) -> Duration = Duration::from_millis;

type Counted = WindowResult<u8, u64>;

fn counts(out: Vec<Counted>) -> Vec<(u8, i64, i64, u64)> {
    let mut v: Vec<_> = out.into_iter().map(|r| (r.key, r.window.start, r.window.end, r.value)).collect();
    v.sort_unstable();
    v
}

#[test]
fn allowed_lateness_refires_with_the_updated_result_then_sends_later_records_aside() {
    let mut h = Harness::<u8>::new("lateness");
    let windowed =
        h.input().key_by(|k: &u8| *k).window(Tumbling::of(MS(10))).allowed_lateness(MS(100)).aggregate(Count);
    let late = h.output(&windowed.late_records());
    let fired = h.output(&windowed);
    let mut run = h.start().unwrap();

    run.push(1, 1).unwrap();
    run.push(1, 5).unwrap();
    run.watermark(20).unwrap();
    assert_eq!(counts(fired.take()), vec![(1, 0, 10, 2)], "the window fires when the watermark passes 9");

    run.push(1, 3).unwrap();
    run.watermark(21).unwrap();
    assert_eq!(counts(fired.take()), vec![(1, 0, 10, 3)], "a late record within lateness re-fires with the full count");

    run.watermark(108).unwrap();
    run.push(1, 7).unwrap();
    run.watermark(110).unwrap();
    assert_eq!(counts(fired.take()), vec![(1, 0, 10, 4)], "still kept at watermark 108 (9 + 100 > 108)");

    run.push(1, 8).unwrap();
    run.watermark(111).unwrap();
    assert!(fired.take().is_empty(), "the window was cleaned up when the watermark reached 109");
    assert_eq!(late.take(), vec![1], "8 + 100 <= 110: the record is late and goes aside");
    let report = run.finish().unwrap();
    assert_eq!(report.metrics.operator("window_aggregate").unwrap().late, 1);
}

#[test]
fn late_records_are_dropped_and_counted_when_nobody_asks_for_them() {
    let mut h = Harness::<u8>::new("late-dropped");
    let fired = h.output(&h.input().key_by(|k: &u8| *k).window(Tumbling::of(MS(10))).aggregate(Count));
    let mut run = h.start().unwrap();
    run.push(2, 5).unwrap();
    run.watermark(50).unwrap();
    run.push(2, 6).unwrap();
    run.push(2, 7).unwrap();
    let report = run.finish().unwrap();
    assert_eq!(counts(fired.take()), vec![(2, 0, 10, 1)]);
    assert_eq!(report.metrics.operator("window_aggregate").unwrap().late, 2);
}

#[test]
fn end_of_input_fires_every_open_window() {
    let mut h = Harness::<u8>::new("flush");
    let fired = h.output(&h.input().key_by(|k: &u8| *k).window(Session::with_gap(MS(5))).aggregate(Count));
    let mut run = h.start().unwrap();
    for (k, ts) in [(1, 0), (1, 4), (2, 100), (1, 9), (1, 30)] {
        run.push(k, ts).unwrap();
    }
    run.watermark(10).unwrap();
    assert!(fired.take().is_empty(), "no session has ended at watermark 10");
    run.finish().unwrap();
    assert_eq!(
        counts(fired.take()),
        vec![(1, 0, 14, 3), (1, 30, 35, 1), (2, 100, 105, 1)],
        "0, 4 and 9 share a session (4 and 9 are exactly the gap apart)"
    );
}

#[test]
fn session_merging_bridges_two_sessions_into_a_new_window() {
    let mut h = Harness::<u8>::new("bridge");
    let fired = h.output(
        &h.input().key_by(|k: &u8| *k).window(Session::with_gap(MS(10))).allowed_lateness(MS(50)).aggregate(Count),
    );
    let mut run = h.start().unwrap();
    run.push(7, 0).unwrap();
    run.push(7, 18).unwrap();
    run.watermark(12).unwrap();
    assert_eq!(counts(fired.take()), vec![(7, 0, 10, 1)], "[0, 10) ended; [18, 28) is open");
    run.push(7, 8).unwrap();
    run.watermark(13).unwrap();
    assert_eq!(
        counts(fired.take()),
        vec![],
        "8 opens [8, 18), which touches both: they merge into [0, 28), still open"
    );
    run.watermark(30).unwrap();
    assert_eq!(counts(fired.take()), vec![(7, 0, 28, 3)], "the merged window is a new window with all three");
    run.finish().unwrap();
}

/// Two partitions: partition 0 produces timestamps 0..`n` then waits;
/// partition 1 never produces. Neither ends.
struct HalfIdle {
    n: i64,
}

struct HalfIdleReader {
    partition: usize,
    next: i64,
    n: i64,
}

impl Source for HalfIdle {
    type Item = i64;
    fn default_name(&self) -> String {
        "half-idle".into()
    }
    fn describe(&self) -> String {
        "one busy and one idle partition".into()
    }
    fn partitions(&self) -> usize {
        2
    }
    fn open(&self, partition: usize) -> weibo::Result<Box<dyn SourceReader<i64>>> {
        Ok(Box::new(HalfIdleReader { partition, next: 0, n: self.n }))
    }
}

impl SourceReader<i64> for HalfIdleReader {
    fn read<'a>(&'a mut self, out: &'a mut SourceOutput<i64>) -> BoxFuture<'a, weibo::Result<ReadStatus>> {
        Box::pin(async move {
            if self.partition == 0 && self.next < self.n {
                out.push(self.next, self.next as u64, None);
                self.next += 1;
                return Ok(ReadStatus::More);
            }
            tokio::time::sleep_until(tokio::time::Instant::from_std(out.deadline())).await;
            Ok(ReadStatus::Idle)
        })
    }
}

fn half_idle_job(strategy: WatermarkStrategy, out: &CollectSink<WindowResult<bool, u64>>) -> Job {
    let job = Job::new("idle").with_buffer_timeout(MS(5));
    job.source(HalfIdle { n: 25 })
        .with_timestamps(|ts: &i64| *ts, strategy)
        .key_by(|_: &i64| true)
        .window(Tumbling::of(MS(10)))
        .aggregate(Count)
        .sink(out.clone());
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_partition_stops_holding_the_watermark_back() {
    let out = CollectSink::new();
    let handle = half_idle_job(WatermarkStrategy::monotonous().with_idleness(MS(50)), &out).spawn().unwrap();
    let mut fired = Vec::new();
    for _ in 0..1000 {
        tokio::time::sleep(MS(10)).await;
        fired.extend(out.take().into_iter().map(|r| (r.window.start, r.value)));
        if fired.len() >= 2 {
            break;
        }
    }
    handle.abort();
    fired.sort_unstable();
    assert_eq!(fired, vec![(0, 10), (10, 10)], "[0,10) and [10,20) fire on partition 0's watermark (23) alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_idleness_a_silent_partition_holds_the_watermark_back() {
    let out = CollectSink::new();
    let handle = half_idle_job(WatermarkStrategy::monotonous(), &out).spawn().unwrap();
    tokio::time::sleep(MS(300)).await;
    let m = handle.metrics();
    handle.abort();
    assert_eq!(m.operator("window_aggregate").unwrap().records_in, 25, "the records arrived");
    assert!(out.values().is_empty(), "but partition 1 (no watermark) keeps every window open");
}

/// A record in a gap between sliding windows (slide larger than size) is
/// late, as in Flink, when `ts + lateness <= watermark`, and is otherwise
/// dropped: `Sliding::of(2 ms, 5 ms)` (windows [0, 2), [5, 7), [10, 12), …),
/// bound 0, records at 10, 3 and 8 (the watermark is 9 after the first).
#[test]
fn a_record_between_sliding_windows_is_late_or_dropped_by_its_lateness() {
    use weibo::window::Sliding;
    for (lateness, late_want, dropped_want) in [(0u64, vec![3i64, 8], 0u64), (6, vec![3], 1)] {
        let mut t = weibo::testing::TestJob::new("gaps");
        let windowed = t
            .input(vec![10i64, 3, 8])
            .with_timestamps(|ts: &i64| *ts, WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO))
            .key_by(|_: &i64| 0u8)
            .window(Sliding::of(MS(2), MS(5)))
            .allowed_lateness(MS(lateness))
            .aggregate(Count);
        let late = t.collect(&windowed.late_records());
        let fired = t.collect(&windowed);
        let report = t.run().unwrap();
        let m = report.metrics.operator("window_aggregate").unwrap();
        assert_eq!(late.sorted(), late_want, "lateness {lateness}: late records");
        assert_eq!(m.late, late_want.len() as u64, "lateness {lateness}: counted late");
        assert_eq!(m.dropped, dropped_want, "lateness {lateness}: counted dropped");
        assert_eq!(counts(fired.values()), vec![(0, 10, 12, 1)], "only 10 is in a window");
    }
}
