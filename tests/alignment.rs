//! Watermark alignment between the partitions of one source, and of
//! sources whose records meet: a partition reads no further than the drift
//! ahead of the slowest, passes barriers while it waits, and does not wait
//! for a partition that is idle, nor for a source its records never meet.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weibo::sinks::CollectSink;
use weibo::sources::{ReadStatus, Source, SourceOutput, SourceReader};
use weibo::time::WatermarkStrategy;
use weibo::{BoxFuture, Job, KeyedContext};

/// Milliseconds of event time between two records of a partition.
const STEP: i64 = 10;

/// Two partitions of `n` records each, `(partition, timestamp)`, timestamps
/// `0, STEP, 2 STEP, ...`. Partition 0 reads as fast as it can; partition
/// 1 reads 4 records, then sleeps a millisecond (`slow`), or, with
/// `idle_after`, stops after that many records and reports itself idle
/// until partition 0 has ended, then ends.
#[derive(Clone)]
struct Skewed {
    n: i64,
    idle_after: Option<i64>,
    fast_done: Arc<AtomicBool>,
    /// With `Some`, partition 1 reads its first 4 records, then nothing
    /// (but is not idle) until the flag is set; partition 0 reads 8
    /// records at a time.
    stall: Option<Arc<AtomicBool>>,
}

struct SkewedReader {
    partition: u8,
    next: i64,
    source: Skewed,
}

impl Source for Skewed {
    type Item = (u8, i64);
    fn default_name(&self) -> String {
        "skewed".into()
    }
    fn describe(&self) -> String {
        "a fast and a slow partition".into()
    }
    fn partitions(&self) -> usize {
        2
    }
    fn open(&self, partition: usize) -> weibo::Result<Box<dyn SourceReader<(u8, i64)>>> {
        Ok(Box::new(SkewedReader { partition: partition as u8, next: 0, source: self.clone() }))
    }
}

impl SourceReader<(u8, i64)> for SkewedReader {
    fn position(&self) -> Option<u64> {
        // Checkpoints need a position; this test never restores.
        Some(self.next as u64)
    }

    fn read<'a>(&'a mut self, out: &'a mut SourceOutput<(u8, i64)>) -> BoxFuture<'a, weibo::Result<ReadStatus>> {
        Box::pin(async move {
            let n = self.source.n;
            if self.partition == 0 {
                // With a stall, 8 records a read, so that alignment (which
                // looks after each read) stops it close to the drift.
                let most = if self.source.stall.is_some() { 8 } else { usize::MAX };
                let mut read = 0;
                while self.next < n && out.remaining() > 0 && read < most {
                    read += 1;
                    let ts = self.next * STEP;
                    out.push((0, ts), self.next as u64, None);
                    self.next += 1;
                }
                if self.next < n {
                    return Ok(ReadStatus::More);
                }
                self.source.fast_done.store(true, Ordering::Release);
                return Ok(ReadStatus::Done);
            }
            if let Some(stall) = &self.source.stall
                && self.next >= 4
                && !stall.load(Ordering::Acquire)
            {
                tokio::time::sleep(Duration::from_millis(1)).await;
                return Ok(ReadStatus::More);
            }
            let stop = self.source.idle_after.unwrap_or(n);
            if self.next < stop {
                for _ in 0..4 {
                    if self.next < stop {
                        out.push((1, self.next * STEP), self.next as u64, None);
                        self.next += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                return Ok(ReadStatus::More);
            }
            if self.source.idle_after.is_some() && !self.source.fast_done.load(Ordering::Acquire) {
                tokio::time::sleep_until(tokio::time::Instant::from_std(out.deadline())).await;
                return Ok(ReadStatus::Idle);
            }
            Ok(ReadStatus::Done)
        })
    }
}

/// What the keyed operator saw: per partition the latest timestamp, and the
/// largest lead of partition 0 over partition 1 when a record arrived.
#[derive(Default)]
struct Seen {
    latest: [Option<i64>; 2],
    lead: i64,
}

/// Runs the two partitions into one keyed operator and returns the largest
/// lead it saw, the records it saw, and the checkpoints completed.
async fn run(source: Skewed, job: Job) -> (i64, usize, u64) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let out = CollectSink::new();
    let record = seen.clone();
    job.source(source)
        .with_timestamps(|r: &(u8, i64)| r.1, WatermarkStrategy::monotonous())
        .key_by(|_: &(u8, i64)| 0u8)
        .process(weibo::on_error::Fail, move |ctx: &mut KeyedContext<'_, u8, (), u8>, r: &(u8, i64)| {
            let mut s = record.lock().unwrap();
            s.latest[usize::from(r.0)] = Some(r.1);
            if let [Some(fast), Some(slow)] = s.latest {
                s.lead = s.lead.max(fast - slow);
            }
            ctx.emit(r.0);
            Ok::<_, std::convert::Infallible>(())
        })
        .sink(out.clone());
    let handle = job.spawn().unwrap();
    let completed = tokio::time::timeout(Duration::from_secs(60), async {
        let mut last = 0;
        let mut handle = Some(handle);
        loop {
            let h = handle.take().unwrap();
            if h.is_finished() {
                h.wait().await.unwrap();
                return last;
            }
            last = h.last_checkpoint().map_or(0, |c| c.get());
            handle = Some(h);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the job finishes (a partition waiting for alignment must not wait for ever)");
    let lead = seen.lock().unwrap().lead;
    (lead, out.values().len(), completed)
}

fn small_batches(name: &str) -> Job {
    // Small batches and one batch per edge: little in flight beyond what
    // alignment allows, so the lead the operator sees is close to it.
    Job::new(name).with_batch_size(16).with_channel_capacity(1).with_buffer_timeout(Duration::from_millis(5))
}

fn skewed(n: i64, idle_after: Option<i64>) -> Skewed {
    Skewed { n, idle_after, fast_done: Arc::new(AtomicBool::new(false)), stall: None }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_reads_no_further_than_the_drift_ahead_of_the_slowest() {
    let dir = tempfile::tempdir().unwrap();
    let n = 2_000;
    let job = small_batches("aligned")
        .with_watermark_alignment(Duration::from_secs(1))
        .with_checkpoints(dir.path(), Duration::from_millis(20));
    let (lead, records, checkpoints) = run(skewed(n, None), job).await;
    assert_eq!(records, 2 * n as usize, "every record arrived");
    // The drift, plus what is in flight: the router's partial batch, the
    // channel's batch and the batch being read (3 x 16 records, 10 ms each).
    assert!(lead <= 1_000 + 3 * 16 * STEP + 16 * STEP, "partition 0 led by {lead} ms");
    assert!(checkpoints >= 1, "barriers passed while partition 0 waited");

    // Without alignment the fast partition runs to its end first.
    let (lead, records, _) = run(skewed(n, None), small_batches("unaligned").without_watermark_alignment()).await;
    assert_eq!(records, 2 * n as usize);
    assert!(lead > 5_000, "without alignment, partition 0 led by only {lead} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_partition_holds_nobody_back() {
    // Partition 1 stops at 500 ms of event time and stays idle until
    // partition 0 has read everything (20 s): partition 0 must not wait
    // for it.
    let job = small_batches("idle").with_watermark_alignment(Duration::from_secs(1));
    let (lead, records, _) = run(skewed(2_000, Some(50)), job).await;
    assert_eq!(records, 2_050);
    assert!(lead > 10_000, "partition 0 read on past the idle partition ({lead} ms ahead)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_waiting_partition_read_goes_out_within_the_buffer_timeout() {
    // Partition 1 stalls at 30 ms of event time; partition 0 reads up to
    // the drift (100 ms) and waits. The records it read before waiting are
    // in a batch far from full (1,024 records): they must reach the
    // operator while it waits, not when partition 1 moves on.
    let release = Arc::new(AtomicBool::new(false));
    let source = Skewed { stall: Some(release.clone()), ..skewed(200, None) };
    let job = Job::new("waiting")
        .with_batch_size(1_024)
        .with_buffer_timeout(Duration::from_millis(5))
        .with_watermark_alignment(Duration::from_millis(100));
    let out = CollectSink::new();
    job.source(source)
        .with_timestamps(|r: &(u8, i64)| r.1, WatermarkStrategy::monotonous())
        .key_by(|_: &(u8, i64)| 0u8)
        .process(weibo::on_error::Fail, |ctx: &mut KeyedContext<'_, u8, (), u8>, r: &(u8, i64)| {
            ctx.emit(r.0);
            Ok::<_, std::convert::Infallible>(())
        })
        .sink(out.clone());
    let handle = job.spawn().unwrap();
    let from_0 = || out.values().iter().filter(|&&p| p == 0).count();
    let arrived = tokio::time::timeout(Duration::from_secs(20), async {
        while from_0() < 10 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let seen = from_0();
    release.store(true, Ordering::Release);
    tokio::time::timeout(Duration::from_secs(60), handle.wait()).await.expect("the job finishes").unwrap();
    assert!(arrived.is_ok(), "only {seen} records of partition 0 arrived while it waited for partition 1");
    // Up to 150 ms (30 ms and the drift, and a read of 8 past it).
    assert!(seen <= 24, "partition 0 read {seen} records, past the drift");
    assert_eq!(out.values().len(), 400, "every record arrived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffer_timeout_too_long_to_add_to_an_instant_still_aligns() {
    // A partition that waits flushes at the buffer timeout after its last
    // flush, and the runtime adds the timeout to instants and multiplies
    // it: `Duration::MAX` overflowed (a panic on the source's thread), and
    // is now taken as a day.
    let job = Job::new("no-timeout")
        .with_batch_size(16)
        .with_buffer_timeout(Duration::MAX)
        .with_watermark_alignment(Duration::from_secs(1));
    let (lead, records, _) = run(skewed(2_000, None), job).await;
    assert_eq!(records, 4_000, "every record arrived");
    assert!(lead <= 1_000 + 4 * 16 * STEP, "partition 0 led by {lead} ms");
}

/// One partition of [`Skewed`] as a source of its own (0: the fast one).
#[derive(Clone)]
struct Half {
    source: Skewed,
    partition: u8,
}

impl Source for Half {
    type Item = (u8, i64);
    fn default_name(&self) -> String {
        format!("half-{}", self.partition)
    }
    fn describe(&self) -> String {
        "one partition of a fast and a slow one".into()
    }
    fn partitions(&self) -> usize {
        1
    }
    fn open(&self, _: usize) -> weibo::Result<Box<dyn SourceReader<(u8, i64)>>> {
        Ok(Box::new(SkewedReader { partition: self.partition, next: 0, source: self.source.clone() }))
    }
}

/// Two sources whose records meet (a keyed `connect` of both) read in
/// step, as one source's partitions do: the state a two-input operator
/// keeps for the faster one stays bounded by the drift.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_whose_records_meet_read_in_step() {
    async fn lead(job: Job) -> i64 {
        let source = skewed(2_000, None);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let timed = |partition| {
            job.source(Half { source: source.clone(), partition })
                .with_timestamps(|r: &(u8, i64)| r.1, WatermarkStrategy::monotonous())
                .key_by(|_: &(u8, i64)| 0u8)
        };
        let (fast, slow) = (timed(0), timed(1));
        let (first, second) = (seen.clone(), seen.clone());
        let observe = |seen: &Mutex<Seen>, r: &(u8, i64)| {
            let mut s = seen.lock().unwrap();
            s.latest[usize::from(r.0)] = Some(r.1);
            if let [Some(fast), Some(slow)] = s.latest {
                s.lead = s.lead.max(fast - slow);
            }
        };
        let out = fast.connect(&slow).process_with_state(
            weibo::on_error::Fail,
            |_| (),
            move |ctx, (), r: &(u8, i64)| {
                observe(&first, r);
                ctx.emit(r.0);
            },
            move |ctx, (), r: &(u8, i64)| {
                observe(&second, r);
                ctx.emit(r.0);
            },
        );
        let sink = CollectSink::new();
        out.sink(sink.clone());
        tokio::time::timeout(Duration::from_secs(60), job.run()).await.expect("the job finishes").unwrap();
        assert_eq!(sink.values().len(), 4_000);
        let seen = seen.lock().unwrap();
        seen.lead
    }
    let aligned = lead(small_batches("joined").with_watermark_alignment(Duration::from_secs(1))).await;
    assert!(aligned <= 1_000 + 3 * 16 * STEP + 16 * STEP, "the fast source led by {aligned} ms");
    let unaligned = lead(small_batches("joined").without_watermark_alignment()).await;
    assert!(unaligned > 5_000, "without alignment, the fast source led by only {unaligned} ms");
}

/// Sources whose records never meet (two pipelines in one job) do not hold
/// each other back: the fast one ends while the slow one is still at the
/// start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_whose_records_never_meet_are_not_aligned() {
    let source = skewed(2_000, None);
    let job = small_batches("apart").with_watermark_alignment(Duration::from_secs(1));
    let fast_done = source.fast_done.clone();
    let done_early = Arc::new(Mutex::new(None));
    let record = done_early.clone();
    for partition in [0, 1] {
        let (fast_done, record) = (fast_done.clone(), record.clone());
        job.source(Half { source: source.clone(), partition })
            .with_timestamps(|r: &(u8, i64)| r.1, WatermarkStrategy::monotonous())
            .key_by(|r: &(u8, i64)| r.0)
            .process(weibo::on_error::Fail, move |ctx: &mut KeyedContext<'_, u8, (), u8>, r: &(u8, i64)| {
                // The slow source at 3 s of event time: has the fast one
                // (20 s) ended?
                if r.0 == 1 && r.1 == 3_000 {
                    *record.lock().unwrap() = Some(fast_done.load(Ordering::Acquire));
                }
                ctx.emit(r.0);
                Ok::<_, std::convert::Infallible>(())
            })
            .sink(weibo::sinks::Blackhole::new());
    }
    tokio::time::timeout(Duration::from_secs(60), job.run()).await.expect("the job finishes").unwrap();
    assert_eq!(*done_early.lock().unwrap(), Some(true), "the fast source was held back by one it never meets");
}
