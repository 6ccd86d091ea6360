//! The book's "Event time and windows" chapter: watermark strategies,
//! idleness, tumbling, sliding and session windows, window functions,
//! allowed lateness and late records, keyed timers, and the test harness.
//!
//! Run it with `cargo run -p weibo-examples --example book_time`.

// ANCHOR: imports
use std::collections::BTreeSet;
use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use weibo::BoxFuture;
use weibo::prelude::*;
use weibo::sources::{ReadStatus, Source, SourceOutput, SourceReader};
use weibo::testing::{self, Harness, RunningHarness, TestJob};
use weibo::window::{WindowAssigner, WindowContext};
// ANCHOR_END: imports

fn main() -> Result<(), Box<dyn Error>> {
    monotonous()?;
    bounded()?;
    testing::block_on(idleness(Some(Duration::from_millis(50))))?;
    testing::block_on(idleness(None))?;
    alignment()?;
    tumbling()?;
    sliding()?;
    session()?;
    reduce()?;
    aggregate()?;
    process()?;
    result_time()?;
    lateness()?;
    session_lateness()?;
    late_dropped()?;
    timers()?;
    timer_failures()?;
    harness()?;
    refused()?;
    interval_join()?;
    window_join()?;
    temporal_join()?;
    Ok(())
}

// ANCHOR: interval_join
/// An ad shown to a user, or a user's click.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct AdEvent {
    user: u32,
    /// `Some(ad)`: the ad was shown; `None`: a click.
    shown: Option<String>,
}

/// Clicks attributed to the ad shown to the same user at most 10 s before:
/// a left join, so an ad never clicked comes out too, with `None`, once no
/// click could match it any more.
fn interval_join() -> weibo::Result<()> {
    let mut h = Harness::<AdEvent>::new("attribution");
    let input = h.input();
    let shown = input.filter(|e: &AdEvent| e.shown.is_some()).key_by(|e: &AdEvent| e.user);
    let clicked = input.filter(|e: &AdEvent| e.shown.is_none()).key_by(|e: &AdEvent| e.user);
    let attributed = shown
        .interval_join(&clicked)
        .between(0, 10_000)
        .left_join(|ad: &AdEvent, click: Option<&AdEvent>| (ad.shown.clone().unwrap_or_default(), click.is_some()));
    let late = attributed.side_output(&OutputTag::<Either<AdEvent, AdEvent>>::late_records());
    let (rows, late) = (h.output(&attributed), h.output(&late));
    let mut run = h.start()?;
    let ad = |user, name: &str| AdEvent { user, shown: Some(name.to_string()) };
    let click = |user| AdEvent { user, shown: None };
    run.push(ad(1, "shoes"), 1_000)?; // user 1 sees the shoes ad at 1 s
    run.push(ad(2, "socks"), 2_000)?; // user 2 sees the socks ad at 2 s
    run.push(click(1), 4_000)?; // user 1 clicks at 4 s: a pair, at once
    run.watermark(4_000)?;
    assert_eq!(rows.take(), [("shoes".to_string(), true)]);
    run.watermark(12_000)?; // no click of user 2 can come within 10 s of 2 s
    assert_eq!(rows.take(), [("socks".to_string(), false)]);
    run.push(click(2), 11_000)?; // behind the watermark: late
    run.finish()?;
    assert!(rows.take().is_empty(), "each ad once");
    assert_eq!(late.take().len(), 1);
    Ok(())
}
// ANCHOR_END: interval_join

// ANCHOR: window_join
/// Orders and payments per customer, met in 1-minute windows: a left join,
/// so an order without a payment in its minute comes out too, with `None`,
/// when the window fires.
fn window_join() -> weibo::Result<()> {
    let mut h = Harness::<Either<(u32, u64), (u32, u64)>>::new("paid");
    let input = h.input();
    let orders = input.flat_map(|e: Either<(u32, u64), (u32, u64)>| match e {
        Either::Left(order) => vec![order],
        Either::Right(_) => vec![],
    });
    let payments = input.flat_map(|e: Either<(u32, u64), (u32, u64)>| match e {
        Either::Left(_) => vec![],
        Either::Right(payment) => vec![payment],
    });
    let paid = orders
        .key_by(|o: &(u32, u64)| o.0)
        .join(&payments.key_by(|p: &(u32, u64)| p.0))
        .window(Tumbling::of(Duration::from_secs(60)))
        .left_join(|order: &(u32, u64), payment: Option<&(u32, u64)>| (order.0, order.1, payment.map(|p| p.1)));
    let late = h.output(&paid.late_records());
    let rows = h.output(&paid);
    let mut run = h.start()?;
    run.push(Either::Left((1, 250)), 10_000)?; // customer 1 orders at 10 s
    run.push(Either::Left((2, 90)), 20_000)?; // customer 2 orders at 20 s
    run.push(Either::Right((1, 250)), 50_000)?; // customer 1 pays at 50 s
    run.watermark(59_998)?;
    assert!(rows.take().is_empty(), "the minute [0, 60 s) has not fired");
    run.watermark(59_999)?;
    let mut fired = rows.take();
    fired.sort_unstable();
    assert_eq!(fired, [(1, 250, Some(250)), (2, 90, None)]);
    run.push(Either::Right((2, 90)), 55_000)?; // behind the watermark: late
    run.finish()?;
    assert_eq!(late.take(), [Either::Right((2, 90))]);
    Ok(())
}
// ANCHOR_END: window_join

// ANCHOR: temporal_join
/// A price change of a product, from its time on; `None` withdraws it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Price {
    product: u32,
    cents: Option<u64>,
}

/// Sales priced at the product's price when they were made, however late
/// the price list's changes arrive compared to the sales.
fn temporal_join() -> weibo::Result<()> {
    let mut h = Harness::<Either<(u32, u32), Price>>::new("priced");
    let input = h.input();
    let sales = input.flat_map(|e: Either<(u32, u32), Price>| match e {
        Either::Left(sale) => vec![sale], // (product, quantity)
        Either::Right(_) => vec![],
    });
    let prices = input.flat_map(|e: Either<(u32, u32), Price>| match e {
        Either::Left(_) => vec![],
        Either::Right(price) => vec![price],
    });
    let priced = sales
        .key_by(|s: &(u32, u32)| s.0)
        .temporal_join(&prices.key_by(|p: &Price| p.product))
        .with_deletes(|p: &Price| p.cents.is_none())
        .left_join(|s: &(u32, u32), p: Option<&Price>| (s.0, p.and_then(|p| p.cents).map(|c| c * u64::from(s.1))));
    let rows = h.output(&priced);
    let mut run = h.start()?;
    run.push(Either::Right(Price { product: 7, cents: Some(500) }), 0)?;
    run.push(Either::Left((7, 2)), 1_000)?; // two at 1 s
    run.push(Either::Right(Price { product: 7, cents: Some(450) }), 1_000)?; // a sale at 1 s pays this
    run.watermark(1_000)?;
    assert!(rows.take().is_empty(), "at watermark 1 000, a price at 1 s may still come");
    run.watermark(1_001)?;
    assert_eq!(rows.take(), [(7, Some(900))]);
    run.push(Either::Right(Price { product: 7, cents: None }), 2_000)?; // withdrawn at 2 s
    run.push(Either::Left((7, 1)), 3_000)?;
    run.finish()?;
    assert_eq!(rows.take(), [(7, None)]);
    Ok(())
}
// ANCHOR_END: temporal_join

// ANCHOR: view
/// A page view: who, which page, and when (event time, ms since the epoch).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct View {
    user: u32,
    page: String,
    at: i64,
}

fn view(user: u32, page: &str, at: i64) -> View {
    View { user, page: page.to_string(), at }
}
// ANCHOR_END: view

// ANCHOR: judge
/// Windows as `(start, end, count)`.
type Counts = Vec<(i64, i64, u64)>;

/// Counts user 1's views per 10 ms window under `strategy`; returns the
/// counts and the times of the late views.
fn judge(strategy: WatermarkStrategy, times: &[i64]) -> weibo::Result<(Counts, Vec<i64>)> {
    let mut t = TestJob::new("judge");
    let counted = t
        .input(times.iter().map(|&at| view(1, "home", at)).collect())
        .with_timestamps(|v: &View| v.at, strategy)
        .key_by(|v: &View| v.user)
        .window(Tumbling::of(Duration::from_millis(10)))
        .aggregate(Count);
    let late = t.collect(&counted.late_records());
    let counts = t.collect(&counted);
    t.run()?;
    let mut counts: Vec<_> = counts.values().into_iter().map(|r| (r.window.start, r.window.end, r.value)).collect();
    counts.sort_unstable();
    Ok((counts, late.values().into_iter().map(|v| v.at).collect()))
}
// ANCHOR_END: judge

// ANCHOR: monotonous
fn monotonous() -> weibo::Result<()> {
    // view at:                  1    9   10   10    9
    // judged under watermark:  -∞    0    8    9    9
    let (counts, late) = judge(WatermarkStrategy::monotonous(), &[1, 9, 10, 10, 9])?;
    // The second 10 is on time: the watermark after a 10 is 9, not 10.
    assert_eq!(counts, [(0, 10, 2), (10, 20, 2)]);
    // The last 9 is late: [0, 10) fired when the watermark reached 9.
    assert_eq!(late, [9]);
    Ok(())
}
// ANCHOR_END: monotonous

// ANCHOR: bounded
fn bounded() -> weibo::Result<()> {
    // view at:                  0    5   12    8    3   20    9
    // max seen before:         -∞    0    5   12   12   12   20
    // watermark (max - 5 - 1): -∞   -6   -1    6    6    6   14
    let strategy = WatermarkStrategy::bounded_out_of_orderness(Duration::from_millis(5));
    let (counts, late) = judge(strategy, &[0, 5, 12, 8, 3, 20, 9])?;
    // 8 and 3 arrive after 12 but while [0, 10) is open (watermark 6 < 9).
    assert_eq!(counts, [(0, 10, 4), (10, 20, 1), (20, 30, 1)]);
    // 9 arrives after 20: the watermark is 14, [0, 10) has fired.
    assert_eq!(late, [9]);
    Ok(())
}
// ANCHOR_END: bounded

/// A source with two partitions, as a Kafka topic might have: partition 0
/// produces a view at each of `times`, partition 1 nothing at all. Both
/// stay open until `stop` is set.
struct TwoPartitions {
    times: Vec<i64>,
    stop: Arc<AtomicBool>,
}

struct PartitionReader {
    times: std::vec::IntoIter<i64>,
    offset: u64,
    stop: Arc<AtomicBool>,
}

impl Source for TwoPartitions {
    type Item = View;

    fn default_name(&self) -> String {
        "views".into()
    }

    fn describe(&self) -> String {
        "a busy and a silent partition".into()
    }

    fn partitions(&self) -> usize {
        2
    }

    fn open(&self, partition: usize) -> weibo::Result<Box<dyn SourceReader<View>>> {
        let times = if partition == 0 { self.times.clone() } else { Vec::new() };
        Ok(Box::new(PartitionReader { times: times.into_iter(), offset: 0, stop: self.stop.clone() }))
    }
}

impl SourceReader<View> for PartitionReader {
    fn read<'a>(&'a mut self, out: &'a mut SourceOutput<View>) -> BoxFuture<'a, weibo::Result<ReadStatus>> {
        Box::pin(async move {
            if let Some(at) = self.times.next() {
                out.push(view(1, "home", at), self.offset, None);
                self.offset += 1;
                return Ok(ReadStatus::More);
            }
            if self.stop.load(Ordering::Relaxed) {
                return Ok(ReadStatus::Done);
            }
            tokio::time::sleep_until(tokio::time::Instant::from_std(out.deadline())).await;
            Ok(ReadStatus::Idle)
        })
    }
}

// ANCHOR: idleness
async fn idleness(idle_after: Option<Duration>) -> weibo::Result<()> {
    let strategy = match idle_after {
        Some(timeout) => WatermarkStrategy::monotonous().with_idleness(timeout),
        None => WatermarkStrategy::monotonous(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let counts = CollectSink::new();
    let job = Job::new("idle-partition").with_buffer_timeout(Duration::from_millis(5));
    // Partition 0 has views at 0..25 ms, partition 1 none; neither ends until `stop`.
    job.source(TwoPartitions { times: (0..25).collect(), stop: stop.clone() })
        .with_timestamps(|v: &View| v.at, strategy) // per partition
        .key_by(|v: &View| v.user)
        .window(Tumbling::of(Duration::from_millis(10)))
        .aggregate(Count)
        .name("views per 10 ms")
        .sink(counts.clone());
    let handle = job.spawn()?;

    // Up to 2 s of processing time for [0, 10) and [10, 20) to fire.
    let mut fired = Vec::new();
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        fired.extend(counts.take().into_iter().map(|r| (r.window.start, r.value)));
        if fired.len() == 2 {
            break;
        }
    }
    // What the job's metrics say of its time while it runs.
    let metrics = handle.metrics();
    assert!(metrics.operator("views per 10 ms").is_some(), "the window operator counts");
    let (watermark, idle_inputs) =
        metrics.operator("views per 10 ms").map(|w| (w.watermark, w.idle_inputs)).unwrap_or_default();
    stop.store(true, Ordering::Relaxed); // both partitions end: watermark +∞
    handle.wait().await?;
    let at_end: Vec<_> = counts.take().into_iter().map(|r| (r.window.start, r.value)).collect();

    if idle_after.is_some() {
        // Partition 1 went idle after 50 ms: partition 0's watermark (24 - 1) alone counts.
        assert_eq!(fired, [(0, 10), (10, 10)]);
        assert_eq!(at_end, [(20, 5)]);
        // Partition 1's input edge is idle (and partition 0's too, once it
        // has been quiet for 50 ms).
        assert_eq!(watermark, Some(23));
        assert!(idle_inputs >= 1);
    } else {
        // Partition 1 never sent a watermark, so it held every window open until the end.
        assert!(fired.is_empty());
        assert_eq!(at_end, [(0, 10), (10, 10), (20, 5)]);
        assert_eq!((watermark, idle_inputs), (None, 0));
    }
    Ok(())
}
// ANCHOR_END: idleness

// ANCHOR: alignment
/// Views per user and second over a source of four partitions (each an
/// interleaved slice of the events), with its partitions aligned within
/// `max_drift` of event time, or not at all (`None`).
fn aligned_counts(max_drift: Option<Duration>) -> weibo::Result<Vec<(u32, i64, u64)>> {
    let job = Job::new("aligned");
    let job = match max_drift {
        Some(drift) => job.with_watermark_alignment(drift),
        None => job.without_watermark_alignment(),
    };
    let counts = CollectSink::new();
    job.source(weibo::sources::Generator::new(40_000, |i| view((i % 7) as u32, "home", i as i64)).with_partitions(4))
        .with_timestamps(|v: &View| v.at, WatermarkStrategy::monotonous())
        .key_by(|v: &View| v.user)
        .with_partitions(2)
        .window(Tumbling::of(Duration::from_secs(1)))
        .aggregate(Count)
        .sink(counts.clone());
    job.run_blocking()?;
    let mut out: Vec<_> = counts.values().into_iter().map(|r| (r.key, r.window.start, r.value)).collect();
    out.sort_unstable();
    Ok(out)
}

fn alignment() -> weibo::Result<()> {
    let aligned = aligned_counts(Some(Duration::from_millis(500)))?;
    // The order partitions are read in changes; the results do not.
    assert_eq!(aligned, aligned_counts(None)?);
    assert_eq!(aligned.len(), 7 * 40, "7 users in each of 40 seconds");
    println!("aligned within 500 ms: {} windows, as without alignment", aligned.len());
    Ok(())
}
// ANCHOR_END: alignment

// ANCHOR: windows_of
/// Runs user 1's views at `times` through windows of `assigner` and returns
/// `(start, end, views)` per window. The 60 s bound makes nothing late here.
fn windows_of<W: WindowAssigner>(assigner: W, times: &[i64]) -> weibo::Result<Vec<(i64, i64, u64)>> {
    let views: Vec<View> = times.iter().map(|&at| view(1, "home", at)).collect();
    let out = testing::run(views, |s| {
        s.with_timestamps(|v: &View| v.at, WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(60)))
            .key_by(|v: &View| v.user)
            .window(assigner)
            .aggregate(Count)
            .into_stream()
    })?;
    let mut windows: Vec<_> = out.into_iter().map(|r| (r.window.start, r.window.end, r.value)).collect();
    windows.sort_unstable();
    Ok(windows)
}
// ANCHOR_END: windows_of

// ANCHOR: tumbling
fn tumbling() -> weibo::Result<()> {
    let ten_seconds = Tumbling::of(Duration::from_secs(10));
    let windows = windows_of(ten_seconds, &[1_000, 4_000, 9_999, 10_000, 12_500, 27_000])?;
    assert_eq!(windows, [(0, 10_000, 3), (10_000, 20_000, 2), (20_000, 30_000, 1)]);

    // Days from midnight in Beijing (UTC+8), that is from 16:00 UTC: an offset of 16 h.
    let day = Duration::from_secs(24 * 3600);
    let beijing_days = Tumbling::of(day).with_offset(Duration::from_secs(16 * 3600));
    let jan_1_utc: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z
    let jan_2_beijing = jan_1_utc + 16 * 3_600_000; // 2024-01-02T00:00:00+08:00
    let windows = windows_of(beijing_days, &[jan_2_beijing - 1, jan_2_beijing])?;
    let day_ms = 24 * 3_600_000;
    assert_eq!(windows, [(jan_2_beijing - day_ms, jan_2_beijing, 1), (jan_2_beijing, jan_2_beijing + day_ms, 1)]);
    Ok(())
}
// ANCHOR_END: tumbling

// ANCHOR: sliding
fn sliding() -> weibo::Result<()> {
    // Windows of 10 s every 5 s: each view is in two of them.
    let windows = windows_of(Sliding::of(Duration::from_secs(10), Duration::from_secs(5)), &[1_000, 7_000, 12_500])?;
    assert_eq!(
        windows,
        [
            (-5_000, 5_000, 1),  // 1 s
            (0, 10_000, 2),      // 1 s, 7 s
            (5_000, 15_000, 2),  // 7 s, 12.5 s
            (10_000, 20_000, 1), // 12.5 s
        ]
    );
    Ok(())
}
// ANCHOR_END: sliding

// ANCHOR: session
fn session() -> weibo::Result<()> {
    let gap = Session::with_gap(Duration::from_secs(5));
    let windows = windows_of(gap, &[0, 10_000, 5_000, 30_000, 35_000, 40_001])?;
    assert_eq!(
        windows,
        [
            (0, 15_000, 3),      // 5 s bridged [0, 5 s) and [10 s, 15 s)
            (30_000, 40_000, 2), // exactly 5 s apart: one session
            (40_001, 45_001, 1), // starts after 40 s: a session of its own
        ]
    );
    Ok(())
}
// ANCHOR_END: session

// ANCHOR: reduce
fn reduce() -> weibo::Result<()> {
    // Each user's last view in each 10 s window.
    let views = vec![view(1, "home", 1_000), view(1, "search", 4_000), view(2, "home", 5_000), view(1, "cart", 12_000)];
    let mut last = testing::run(views, |s| {
        s.with_timestamps(|v: &View| v.at, WatermarkStrategy::monotonous())
            .key_by(|v: &View| v.user)
            .window(Tumbling::of(Duration::from_secs(10)))
            .reduce(|a, b| if b.at >= a.at { b } else { a })
            .into_stream()
    })?;
    last.sort_by_key(|r| (r.window.start, r.key));
    let pages: Vec<(u32, i64, &str)> = last.iter().map(|r| (r.key, r.window.start, r.value.page.as_str())).collect();
    assert_eq!(pages, [(1, 0, "search"), (2, 0, "home"), (1, 10_000, "cart")]);
    Ok(())
}
// ANCHOR_END: reduce

// ANCHOR: browsing
/// Two users browsing. User 1's `search` arrives after `cart` and bridges
/// two of their sessions; user 2's views are 35 s apart.
fn browsing() -> Vec<View> {
    vec![
        view(1, "home", 0),
        view(2, "home", 5_000),
        view(1, "cart", 50_000),
        view(1, "search", 25_000),
        view(2, "cart", 40_000),
        view(1, "home", 120_000),
    ]
}

/// Sessions of 30 s of inactivity, with views up to 30 s out of order.
fn sessions(views: &Stream<View>) -> weibo::window::WindowedStream<u32, View> {
    views
        .with_timestamps(|v: &View| v.at, WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(30)))
        .key_by(|v: &View| v.user)
        .window(Session::with_gap(Duration::from_secs(30)))
}
// ANCHOR_END: browsing

// ANCHOR: aggregate_impl
/// The number of distinct pages viewed.
struct DistinctPages;

impl Aggregate<View> for DistinctPages {
    type Acc = BTreeSet<String>; // kept in state: it needs a codec
    type Out = usize;

    fn create(&self) -> BTreeSet<String> {
        BTreeSet::new()
    }

    fn add(&self, acc: &mut BTreeSet<String>, v: View) {
        acc.insert(v.page);
    }

    fn merge(&self, acc: &mut BTreeSet<String>, other: BTreeSet<String>) {
        acc.extend(other); // two sessions became one
    }

    fn result(&self, acc: &BTreeSet<String>) -> usize {
        acc.len()
    }
}
// ANCHOR_END: aggregate_impl

// ANCHOR: aggregate
fn aggregate() -> weibo::Result<()> {
    let mut pages = testing::run(browsing(), |s| sessions(&s).aggregate(DistinctPages).into_stream())?;
    pages.sort_by_key(|r| (r.key, r.window.start));
    let pages: Vec<(u32, i64, i64, usize)> =
        pages.into_iter().map(|r| (r.key, r.window.start, r.window.end, r.value)).collect();
    assert_eq!(
        pages,
        [
            (1, 0, 80_000, 3), // home, cart and search: two sessions merged
            (1, 120_000, 150_000, 1),
            (2, 5_000, 35_000, 1),
            (2, 40_000, 70_000, 1), // 40 s is more than 30 s after 5 s
        ]
    );
    Ok(())
}
// ANCHOR_END: aggregate

// ANCHOR: process
fn process() -> weibo::Result<()> {
    let mut paths = testing::run(browsing(), |s| {
        sessions(&s)
            .process(|ctx: &WindowContext<'_, u32>, views: &[View], out: &mut Vec<String>| {
                let mut views = views.to_vec();
                views.sort_by_key(|v| v.at); // the elements come in no guaranteed order
                let path: Vec<&str> = views.iter().map(|v| v.page.as_str()).collect();
                out.push(format!("user {} {}..{} ms: {}", ctx.key, ctx.window.start, ctx.window.end, path.join(" > ")));
            })
            .into_stream()
    })?;
    paths.sort();
    assert_eq!(
        paths,
        [
            "user 1 0..80000 ms: home > search > cart",
            "user 1 120000..150000 ms: home",
            "user 2 40000..70000 ms: cart",
            "user 2 5000..35000 ms: home",
        ]
    );
    Ok(())
}
// ANCHOR_END: process

// ANCHOR: result_time
fn result_time() -> weibo::Result<()> {
    let views = vec![view(1, "home", 5_000), view(1, "cart", 25_000), view(2, "home", 28_000), view(1, "home", 31_000)];
    let mut t = TestJob::new("views-per-10s-then-30s");
    let per_user = t
        .input(views)
        .with_timestamps(|v: &View| v.at, WatermarkStrategy::monotonous())
        .key_by(|v: &View| v.user)
        .window(Tumbling::of(Duration::from_secs(10)))
        .aggregate(Count)
        .into_stream();

    // Each result carries the event time `end - 1` ...
    let stamps = per_user.key_by(|r: &WindowResult<u32, u64>| r.key).process(
        on_error::Fail,
        |ctx: &mut KeyedContext<'_, u32, (), (i64, Option<i64>)>, r: &WindowResult<u32, u64>| {
            ctx.emit((r.window.end, ctx.timestamp()));
            Ok::<(), String>(())
        },
    );
    // ... so it falls into the larger window that contains its own.
    let totals = per_user
        .map(|r: WindowResult<u32, u64>| r.value)
        .key_by(|_: &u64| ()) // one key: all users
        .window(Tumbling::of(Duration::from_secs(30)))
        .reduce(|a, b| a + b)
        .into_stream();

    let stamps = t.collect(&stamps);
    let totals = t.collect(&totals);
    println!("{}", t.job());
    t.run()?;
    assert!(stamps.values().iter().all(|&(end, timestamp)| timestamp == Some(end - 1)));
    let totals: Vec<(i64, u64)> = totals.sorted().into_iter().map(|r| (r.window.start, r.value)).collect();
    assert_eq!(totals, [(0, 3), (30_000, 1)]); // the [20 s, 30 s) counts are in [0, 30 s)
    Ok(())
}
// ANCHOR_END: result_time

// ANCHOR: lateness
fn lateness() -> weibo::Result<()> {
    let mut h = Harness::<View>::new("lateness");
    let counted = h
        .input()
        .key_by(|v: &View| v.user)
        .window(Tumbling::of(Duration::from_millis(10)))
        .allowed_lateness(Duration::from_millis(100))
        .aggregate(Count);
    let late = h.output(&counted.late_records());
    let fired = h.output(&counted);
    let mut run = h.start()?;
    let counts = |out: Vec<WindowResult<u32, u64>>| -> Vec<(i64, i64, u64)> {
        out.into_iter().map(|r| (r.window.start, r.window.end, r.value)).collect()
    };

    run.push(view(1, "home", 1), 1)?;
    run.push(view(1, "cart", 5), 5)?;
    run.watermark(20)?;
    assert_eq!(counts(fired.take()), [(0, 10, 2)]); // fired: the watermark passed 9

    run.push(view(1, "home", 3), 3)?; // late, but within the allowed 100 ms
    run.watermark(21)?;
    assert_eq!(counts(fired.take()), [(0, 10, 3)]); // fired again: the full count, not +1

    run.watermark(108)?;
    run.push(view(1, "home", 7), 7)?; // 9 + 100 > 108: the window is still kept
    run.watermark(110)?;
    assert_eq!(counts(fired.take()), [(0, 10, 4)]);

    run.push(view(1, "home", 8), 8)?; // the window was dropped at watermark 109
    run.watermark(111)?;
    assert!(fired.take().is_empty());
    assert_eq!(late.take(), [view(1, "home", 8)]);

    let report = run.finish()?;
    assert_eq!(report.metrics.operator("window_aggregate").map(|m| m.late), Some(1));
    Ok(())
}
// ANCHOR_END: lateness

// ANCHOR: session_lateness
fn session_lateness() -> weibo::Result<()> {
    let mut h = Harness::<View>::new("session-lateness");
    let counted = h
        .input()
        .key_by(|v: &View| v.user)
        .window(Session::with_gap(Duration::from_millis(10)))
        .allowed_lateness(Duration::from_millis(50))
        .aggregate(Count);
    let fired = h.output(&counted);
    let mut run = h.start()?;
    let counts = |out: Vec<WindowResult<u32, u64>>| -> Vec<(i64, i64, u64)> {
        out.into_iter().map(|r| (r.window.start, r.window.end, r.value)).collect()
    };

    run.push(view(1, "home", 0), 0)?;
    run.push(view(1, "cart", 18), 18)?;
    run.watermark(12)?;
    assert_eq!(counts(fired.take()), [(0, 10, 1)]); // [0, 10) fired; [18, 28) is open

    run.push(view(1, "search", 8), 8)?; // opens [8, 18): touches both, they merge into [0, 28)
    run.watermark(30)?;
    assert_eq!(counts(fired.take()), [(0, 28, 3)]); // a new window; [0, 10) is not retracted
    run.finish()?;
    Ok(())
}
// ANCHOR_END: session_lateness

// ANCHOR: late_dropped
fn late_dropped() -> weibo::Result<()> {
    let mut t = TestJob::new("late-dropped");
    let views = vec![view(1, "home", 0), view(1, "cart", 5), view(1, "home", 20), view(1, "search", 3)];
    let counts = t
        .input(views)
        .with_timestamps(|v: &View| v.at, WatermarkStrategy::monotonous())
        .key_by(|v: &View| v.user)
        .window(Tumbling::of(Duration::from_millis(10)))
        .aggregate(Count)
        .name("views-per-10ms"); // no `late_records()`: late views are dropped
    let counts = t.collect(&counts);
    let report = t.run()?;
    assert_eq!(counts.values().iter().map(|r| r.value).collect::<Vec<_>>(), [2, 1]);
    let window = report.metrics.operator("views-per-10ms").map(|m| (m.records_in, m.records_out, m.late));
    assert_eq!(window, Some((4, 2, 1))); // the view at 3 came under watermark 19
    Ok(())
}
// ANCHOR_END: late_dropped

// ANCHOR: inactivity
/// An alert: `user` viewed nothing for 30 s after `since`.
#[derive(Clone, Debug, PartialEq)]
struct Inactive {
    user: u32,
    since: i64,
}

const TIMEOUT: i64 = 30_000;

/// Alerts when a user views nothing for 30 s of event time. The state is
/// the time of the user's last view; the timer is at that time + 30 s.
fn inactivity(views: &Stream<View>) -> Stream<Inactive> {
    views.key_by(|v: &View| v.user).process_with_timers(
        on_error::Fail,
        |ctx: &mut KeyedContext<'_, u32, i64, Inactive>, v: &View| {
            if let Some(last) = *ctx.state() {
                ctx.delete_timer(last + TIMEOUT);
                if v.at > last + TIMEOUT {
                    // The gap is over already: the watermark, which trails the
                    // views, had not reached the timer yet.
                    ctx.emit(Inactive { user: v.user, since: last });
                }
            }
            ctx.register_timer(v.at + TIMEOUT);
            *ctx.state() = Some(v.at);
            Ok::<(), String>(())
        },
        |ctx, _time| {
            let user = *ctx.key();
            if let Some(since) = ctx.state().take() {
                ctx.emit(Inactive { user, since }); // and the state is gone
            }
            Ok(())
        },
    )
}
// ANCHOR_END: inactivity

// ANCHOR: timers
fn timers() -> weibo::Result<()> {
    let views = vec![
        view(1, "home", 0),
        view(3, "home", 2_000),
        view(2, "home", 5_000),
        view(1, "search", 20_000),
        view(2, "cart", 50_000),
        view(1, "cart", 60_000),
    ];
    let alerts =
        testing::run(views, |s| inactivity(&s.with_timestamps(|v: &View| v.at, WatermarkStrategy::monotonous())))?;
    let alert = |user, since| Inactive { user, since };
    assert_eq!(
        alerts,
        [
            alert(2, 5_000),  // on user 2's view at 50 s, judged under watermark 19 999
            alert(3, 2_000),  // user 3's timer at 32 s, when the watermark reached 49 999
            alert(1, 20_000), // on user 1's view at 60 s, before the timer at 50 s fired
            alert(2, 50_000), // end of input: every timer fires
            alert(1, 60_000),
        ]
    );
    Ok(())
}
// ANCHOR_END: timers

// ANCHOR: timer_failures
fn on_view(ctx: &mut KeyedContext<'_, u32, (), u32>, v: &View) -> Result<(), String> {
    ctx.register_timer(v.at + 10_000);
    Ok(())
}

/// Emits the user when their timer fires; fails for user 2.
fn on_timer(ctx: &mut KeyedContext<'_, u32, (), u32>, _time: i64) -> Result<(), String> {
    match *ctx.key() {
        2 => Err("user 2 has no profile".into()),
        user => {
            ctx.emit(user);
            Ok(())
        }
    }
}

fn timer_failures() -> Result<(), Box<dyn Error>> {
    let views = vec![view(1, "home", 0), view(2, "home", 1_000)];

    // Dead letters: a timer has no record to send, so its failure is counted as dropped.
    let mut t = TestJob::new("timer-failures");
    let (users, dead) = t
        .input(views.clone())
        .with_timestamps(|v: &View| v.at, WatermarkStrategy::monotonous())
        .key_by(|v: &View| v.user)
        .process_with_timers(on_error::DeadLetter, on_view, on_timer);
    let (users, dead) = (t.collect(&users), t.collect(&dead));
    let report = t.run()?;
    assert_eq!(users.values(), [1]);
    assert!(dead.values().is_empty());
    let counted = report.metrics.operator("keyed_process").map(|m| (m.dropped, m.dead_lettered));
    assert_eq!(counted, Some((1, 0)));

    // Fail: the job stops, naming the timer.
    let err = testing::run(views, |s| {
        s.with_timestamps(|v: &View| v.at, WatermarkStrategy::monotonous())
            .key_by(|v: &View| v.user)
            .process_with_timers(on_error::Fail, on_view, on_timer)
    })
    .err()
    .ok_or("the job should fail")?;
    println!("{err}");
    assert!(matches!(
        err,
        weibo::Error::TimerFailed { time: 11_000, ref message, .. } if message == "user 2 has no profile"
    ));
    Ok(())
}
// ANCHOR_END: timer_failures

// ANCHOR: harness
/// Pushes `v` with its own time as event time.
fn push(run: &mut RunningHarness<View>, v: View) -> weibo::Result<()> {
    let at = v.at;
    run.push(v, at)
}

fn harness() -> weibo::Result<()> {
    let mut h = Harness::<View>::new("inactivity-test");
    let alerts = inactivity(&h.input()); // the pipeline under test, without `with_timestamps`
    let alerts = h.output(&alerts);
    let mut run = h.start()?;

    push(&mut run, view(1, "home", 0))?;
    push(&mut run, view(2, "home", 10_000))?;
    run.watermark(29_999)?; // returns when every output has seen watermark 29 999
    assert!(alerts.take().is_empty());
    run.watermark(30_000)?;
    assert_eq!(alerts.take(), [Inactive { user: 1, since: 0 }]);

    push(&mut run, view(2, "cart", 35_000))?; // moves user 2's timer from 40 s to 65 s
    run.watermark(60_000)?;
    assert!(alerts.take().is_empty());

    let report = run.finish()?; // end of input: watermark +∞
    assert_eq!(alerts.take(), [Inactive { user: 2, since: 35_000 }]);
    assert_eq!(report.metrics.operator("keyed_process").map(|m| m.records_in), Some(3));
    Ok(())
}
// ANCHOR_END: harness

// ANCHOR: refused
fn refused() -> Result<(), Box<dyn Error>> {
    // A window shorter than 1 ms.
    let job = Job::new("zero-window");
    job.source(weibo::sources::IterSource::new(vec![view(1, "home", 0)]))
        .with_timestamps(|v: &View| v.at, WatermarkStrategy::monotonous())
        .key_by(|v: &View| v.user)
        .window(Tumbling::of(Duration::from_micros(500)))
        .aggregate(Count)
        .sink(weibo::sinks::Blackhole::new());
    let err = job.plan().err().ok_or("a 0 ms window should be refused")?;
    println!("{err}");
    assert!(matches!(err, weibo::Error::Graph { .. }));

    // Late records asked for, and not consumed.
    let job = Job::new("late-records-nowhere");
    let counted = job
        .source(weibo::sources::IterSource::new(vec![view(1, "home", 0)]))
        .with_timestamps(|v: &View| v.at, WatermarkStrategy::monotonous())
        .key_by(|v: &View| v.user)
        .window(Tumbling::of(Duration::from_secs(1)))
        .aggregate(Count);
    let _late = counted.late_records();
    counted.sink(weibo::sinks::Blackhole::new());
    let err = job.plan().err().ok_or("unconsumed late records should be refused")?;
    println!("{err}");
    assert!(matches!(err, weibo::Error::Graph { .. }));
    Ok(())
}
// ANCHOR_END: refused
