//! Run pipelines on in-memory input, in one call, for tests and doctests.
//!
//! ```
//! use weibo::testing;
//! let out = testing::run(vec![3, 1, 2], |s| s.map(|x: i32| x + 1))?;
//! assert_eq!(out, vec![4, 2, 3]);
//! # Ok::<(), weibo::Error>(())
//! ```

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::metrics::MetricsSnapshot;
use crate::record::{NO_TIMESTAMP, Timestamp};
use crate::sinks::CollectSink;
use crate::sources::{IterSource, ReadStatus, Source, SourceOutput, SourceReader};
use crate::stream::Stream;
use crate::stream::job::Job;
use crate::task::BoxFuture;
use crate::time::clock::Clock;

/// Runs `future` to completion on a fresh two-thread tokio runtime.
///
/// # Panics
/// If the runtime cannot be created (the OS refuses threads).
///
/// ```
/// let n = weibo::testing::block_on(async { 40 + 2 });
/// assert_eq!(n, 42);
/// ```
pub fn block_on<F: Future>(future: F) -> F::Output {
    #[allow(clippy::expect_used)]
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("cannot start a tokio runtime for the test");
    runtime.block_on(future)
}

/// Runs `pipeline` on `input` and returns everything it emits.
///
/// With one partition everywhere, the output keeps the input's order;
/// with several, sort it before comparing.
///
/// # Errors
/// The job's error.
///
/// ```
/// let out = weibo::testing::run(vec!["a b", "c"], |s| s.flat_map(|line: &str| line.split(' ').map(str::to_string).collect::<Vec<_>>()))?;
/// assert_eq!(out, vec!["a", "b", "c"]);
/// # Ok::<(), weibo::Error>(())
/// ```
pub fn run<T, U, F>(input: Vec<T>, pipeline: F) -> Result<Vec<U>>
where
    T: Clone + Send + 'static,
    U: Clone + Send + 'static,
    F: FnOnce(Stream<T>) -> Stream<U>,
{
    run_job(|job| pipeline(job.source(IterSource::new(input))))
}

/// Runs `pipeline` on `input`, whose records carry the event times given
/// beside them (watermarks follow them monotonously, so give them in time
/// order), and returns everything it emits. The shortest way to try
/// windows and timers.
///
/// ```
/// use std::time::Duration;
/// use weibo::window::{Count, Tumbling};
///
/// let input = vec![(1_000, "a".to_string()), (1_500, "a".to_string()), (2_500, "a".to_string())];
/// let out = weibo::testing::run_timed(input, |s| {
///     s.key_by(|k: &String| k.clone()).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count).into_stream()
/// })?;
/// let counts: Vec<(i64, u64)> = out.iter().map(|r| (r.window.start, r.value)).collect();
/// assert_eq!(counts, vec![(1_000, 2), (2_000, 1)]);
/// # Ok::<(), weibo::Error>(())
/// ```
///
/// # Errors
/// The job's error.
pub fn run_timed<T, U, F>(input: Vec<(Timestamp, T)>, pipeline: F) -> Result<Vec<U>>
where
    T: Clone + Send + 'static,
    U: Clone + Send + 'static,
    F: FnOnce(Stream<T>) -> Stream<U>,
{
    run_job(|job| {
        let timed = job
            .source(IterSource::new(input))
            .with_timestamps(|r: &(Timestamp, T)| r.0, crate::time::WatermarkStrategy::monotonous())
            .map(|r: (Timestamp, T)| r.1);
        pipeline(timed)
    })
}

/// Builds a job with `build` (which adds sources and returns the stream to
/// observe), runs it and returns what the stream emitted.
///
/// # Errors
/// The job's error.
///
/// ```
/// let out = weibo::testing::run_job(|job| {
///     let a = job.source(weibo::sources::IterSource::new(vec![1u32]));
///     let b = job.source(weibo::sources::IterSource::new(vec![2u32]));
///     a.union(&b)
/// })?;
/// assert_eq!(out.iter().sum::<u32>(), 3);
/// # Ok::<(), weibo::Error>(())
/// ```
pub fn run_job<U, F>(build: F) -> Result<Vec<U>>
where
    U: Clone + Send + 'static,
    F: FnOnce(&Job) -> Stream<U>,
{
    let mut t = TestJob::new("test");
    let out = build(&t.job);
    let collected = t.collect(&out);
    t.run()?;
    Ok(collected.values())
}

/// A job with any number of in-memory inputs and collected outputs.
///
/// ```
/// let mut t = weibo::testing::TestJob::new("two-outputs");
/// let input = t.input(vec![1u32, 2, 3]);
/// let evens = t.collect(&input.filter(|x| x % 2 == 0));
/// let odds = t.collect(&input.filter(|x| x % 2 == 1));
/// t.run()?;
/// assert_eq!((evens.values(), odds.values()), (vec![2], vec![1, 3]));
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Debug)]
pub struct TestJob {
    job: Job,
}

/// The records a stream emitted in a [`TestJob`].
///
/// ```
/// let mut t = weibo::testing::TestJob::new("collected");
/// let keyed = t.input(vec![3u32, 1, 2]).key_by(|x: &u32| *x).with_partitions(2).reduce(|a, _| a);
/// let out = t.collect(&keyed);
/// t.run()?;
/// assert_eq!(out.sorted(), vec![1, 2, 3]);
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Collected<T>(CollectSink<T>);

impl<T: Clone> Collected<T> {
    /// Everything collected (read it after the run).
    ///
    /// ```
    /// let mut t = weibo::testing::TestJob::new("values");
    /// let input = t.input(vec!['x']);
    /// let out = t.collect(&input);
    /// t.run()?;
    /// assert_eq!(out.values(), vec!['x']);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn values(&self) -> Vec<T> {
        self.0.values()
    }

    /// Everything collected, sorted.
    ///
    /// ```
    /// let mut t = weibo::testing::TestJob::new("sorted");
    /// let input = t.input(vec![2u8, 1]);
    /// let out = t.collect(&input.key_by(|x: &u8| *x).with_partitions(2).reduce(|a, _| a));
    /// t.run()?;
    /// assert_eq!(out.sorted(), vec![1, 2]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn sorted(&self) -> Vec<T>
    where
        T: Ord,
    {
        let mut v = self.0.values();
        v.sort();
        v
    }
}

/// What a [`TestJob`] run reports.
///
/// ```
/// let mut t = weibo::testing::TestJob::new("report");
/// let input = t.input(vec![1u32, 2]);
/// t.collect(&input.map(|x| x + 1));
/// let report = t.run()?;
/// assert_eq!(report.metrics.operator("map").unwrap().records_in, 2);
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TestReport {
    /// The job's final metrics.
    pub metrics: MetricsSnapshot,
}

impl TestJob {
    /// A new test job.
    ///
    /// ```
    /// let t = weibo::testing::TestJob::new("empty");
    /// assert!(t.job().to_string().contains("`empty`"));
    /// ```
    pub fn new(name: &str) -> Self {
        Self { job: Job::new(name).verifying_codecs() }
    }

    /// Changes the job's settings (`|job| job.with_max_key_groups(16)`).
    ///
    /// ```
    /// let t = weibo::testing::TestJob::new("few-groups").configure(|job| job.with_max_key_groups(8));
    /// assert!(t.job().to_string().contains("8 key groups"));
    /// ```
    #[must_use]
    pub fn configure(self, f: impl FnOnce(Job) -> Job) -> Self {
        Self { job: f(self.job) }
    }

    /// The job, to add other sources or inspect its graph.
    ///
    /// ```
    /// let mut t = weibo::testing::TestJob::new("graph");
    /// let input = t.input(vec![1u32]);
    /// t.collect(&input.map(|x| x * 3));
    /// assert!(t.job().plan()?.contains("values -> map -> "));
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// An in-memory input (one partition; offsets are indexes).
    ///
    /// ```
    /// let mut t = weibo::testing::TestJob::new("inputs");
    /// let a = t.input(vec![1u32, 2]);
    /// let b = t.input(vec![10u32]);
    /// let all = t.collect(&a.union(&b));
    /// t.run()?;
    /// assert_eq!(all.values().len(), 3);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn input<T: Clone + Send + 'static>(&mut self, values: Vec<T>) -> Stream<T> {
        self.job.source(IterSource::new(values))
    }

    /// Collects what `stream` emits.
    ///
    /// ```
    /// let mut t = weibo::testing::TestJob::new("collect");
    /// let doubled = t.input(vec![1u32]).map(|x| x * 2);
    /// let out = t.collect(&doubled);
    /// t.run()?;
    /// assert_eq!(out.values(), vec![2]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn collect<T: Clone + Send + 'static>(&mut self, stream: &Stream<T>) -> Collected<T> {
        let sink = CollectSink::new();
        let _ = stream.sink(sink.clone());
        Collected(sink)
    }

    /// Runs the job to the end (blocking).
    ///
    /// # Errors
    /// The job's error.
    ///
    /// ```
    /// let mut t = weibo::testing::TestJob::new("run");
    /// let input = t.input(vec![5u8]);
    /// let out = t.collect(&input);
    /// t.run()?;
    /// assert_eq!(out.values(), vec![5]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn run(self) -> Result<TestReport> {
        block_on(self.run_async())
    }

    /// Runs the job to the end.
    ///
    /// # Errors
    /// The job's error.
    ///
    /// ```
    /// # weibo::testing::block_on(async {
    /// let mut t = weibo::testing::TestJob::new("async");
    /// let input = t.input(vec![5u8]);
    /// let out = t.collect(&input);
    /// t.run_async().await?;
    /// assert_eq!(out.values(), vec![5]);
    /// # Ok::<(), weibo::Error>(())
    /// # })?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub async fn run_async(self) -> Result<TestReport> {
        let report = self.job.run().await?;
        Ok(TestReport { metrics: report.metrics })
    }
}

#[allow(dead_code)]
fn _error_is_send(e: Error) -> Box<dyn std::error::Error + Send + Sync> {
    Box::new(e)
}

/// A pipeline driven by hand: push records with timestamps, advance the
/// watermark, and see what fired, step by step.
///
/// ```
/// use std::time::Duration;
/// use weibo::testing::Harness;
/// use weibo::window::{Count, Tumbling};
///
/// // (page, user) clicks, counted per user and 10 ms window.
/// let mut h = Harness::<(String, u32)>::new("clicks");
/// let counts = h.input()
///     .key_by(|c: &(String, u32)| c.1)
///     .window(Tumbling::of(Duration::from_millis(10)))
///     .aggregate(Count)
///     .into_stream();
/// let fired = h.output(&counts);
/// let mut run = h.start()?;
///
/// run.push(("a".into(), 1), 3)?;
/// run.push(("b".into(), 1), 7)?;
/// run.watermark(8)?;
/// assert!(fired.take().is_empty(), "[0, 10) has not ended at watermark 8");
/// run.watermark(9)?;
/// let out = fired.take();
/// assert_eq!((out[0].key, out[0].window.end, out[0].value), (1, 10, 2));
/// run.finish()?;
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct Harness<T> {
    job: Job,
    clock: Clock,
    input: Stream<T>,
    tx: tokio::sync::mpsc::UnboundedSender<Command<T>>,
    probes: Vec<Arc<Mutex<ProbeState>>>,
}

impl<T> std::fmt::Debug for Harness<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness").field("job", &self.job).finish_non_exhaustive()
    }
}

enum Command<T> {
    Record(T, Timestamp),
    Watermark(Timestamp),
    End,
}

/// What a harness output has seen: per sink instance, the latest watermark.
#[derive(Debug, Default)]
struct ProbeState {
    watermarks: Vec<Timestamp>,
}

/// What a stream of a [`Harness`] emitted.
///
/// ```
/// use std::time::Duration;
/// use weibo::window::{Count, Tumbling};
/// let mut h = weibo::testing::Harness::<char>::new("harness");
/// let counts = h.input().key_by(|c: &char| *c).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count);
/// let probe = h.output(&counts);
/// let mut running = h.start()?;
/// running.push('a', 100)?;
/// running.push('a', 200)?;
/// running.watermark(999)?; // the window [0, 1000) fires
/// assert_eq!(probe.take().iter().map(|r| r.value).collect::<Vec<_>>(), vec![2]);
/// running.finish()?;
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct Probe<U> {
    sink: CollectSink<U>,
}

impl<U> std::fmt::Debug for Probe<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Probe")
    }
}

impl<U: Clone> Probe<U> {
    /// Takes what was emitted since the last call.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::{Count, Tumbling};
    /// let mut h = weibo::testing::Harness::<char>::new("harness");
    /// let counts = h.input().key_by(|c: &char| *c).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count);
    /// let probe = h.output(&counts);
    /// let mut running = h.start()?;
    /// running.push('a', 100)?;
    /// running.push('a', 200)?;
    /// running.watermark(999)?; // the window [0, 1000) fires
    /// assert_eq!(probe.take().iter().map(|r| r.value).collect::<Vec<_>>(), vec![2]);
    /// running.finish()?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn take(&self) -> Vec<U> {
        self.sink.take()
    }
}

impl<T: Clone + Send + 'static> Harness<T> {
    /// A harness with one input; its job flushes every millisecond, so
    /// watermarks travel fast. Its processing time stands at 0 until
    /// [`RunningHarness::set_processing_time`] moves it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::{Count, Tumbling};
    /// let mut h = weibo::testing::Harness::<char>::new("harness");
    /// let counts = h.input().key_by(|c: &char| *c).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count);
    /// let probe = h.output(&counts);
    /// let mut running = h.start()?;
    /// running.push('a', 100)?;
    /// running.push('a', 200)?;
    /// running.watermark(999)?; // the window [0, 1000) fires
    /// assert_eq!(probe.take().iter().map(|r| r.value).collect::<Vec<_>>(), vec![2]);
    /// running.finish()?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn new(name: &str) -> Self {
        let clock = Clock::manual(0);
        let job =
            Job::new(name).with_buffer_timeout(Duration::from_millis(1)).verifying_codecs().with_clock(clock.clone());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let input = job.source(ManualSource { rx: Mutex::new(Some(rx)) });
        Self { job, clock, input, tx, probes: Vec::new() }
    }

    /// Changes the job's settings.
    ///
    /// ```
    /// let h = weibo::testing::Harness::<u32>::new("configured").configure(|job| job.with_max_key_groups(16));
    /// # drop(h);
    /// ```
    #[must_use]
    pub fn configure(self, f: impl FnOnce(Job) -> Job) -> Self {
        Self { job: f(self.job), ..self }
    }

    /// The input: records carry the timestamps given to
    /// [`RunningHarness::push`], and the watermarks given to
    /// [`RunningHarness::watermark`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::{Count, Tumbling};
    /// let mut h = weibo::testing::Harness::<char>::new("harness");
    /// let counts = h.input().key_by(|c: &char| *c).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count);
    /// let probe = h.output(&counts);
    /// let mut running = h.start()?;
    /// running.push('a', 100)?;
    /// running.push('a', 200)?;
    /// running.watermark(999)?; // the window [0, 1000) fires
    /// assert_eq!(probe.take().iter().map(|r| r.value).collect::<Vec<_>>(), vec![2]);
    /// running.finish()?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn input(&self) -> Stream<T> {
        self.input.clone()
    }

    /// Observes what `stream` emits.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::{Count, Tumbling};
    /// let mut h = weibo::testing::Harness::<char>::new("harness");
    /// let counts = h.input().key_by(|c: &char| *c).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count);
    /// let probe = h.output(&counts);
    /// let mut running = h.start()?;
    /// running.push('a', 100)?;
    /// running.push('a', 200)?;
    /// running.watermark(999)?; // the window [0, 1000) fires
    /// assert_eq!(probe.take().iter().map(|r| r.value).collect::<Vec<_>>(), vec![2]);
    /// running.finish()?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn output<U: Clone + Send + 'static>(&mut self, stream: &Stream<U>) -> Probe<U> {
        let sink = CollectSink::new();
        let state = Arc::new(Mutex::new(ProbeState::default()));
        self.probes.push(state.clone());
        let _ = stream.sink(ProbeSink { sink: sink.clone(), state }).name(&format!("probe-{}", self.probes.len()));
        Probe { sink }
    }

    /// Starts the job on a runtime of its own.
    ///
    /// # Errors
    /// A wiring error, or a failure to start the runtime.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::{Count, Tumbling};
    /// let mut h = weibo::testing::Harness::<char>::new("harness");
    /// let counts = h.input().key_by(|c: &char| *c).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count);
    /// let probe = h.output(&counts);
    /// let mut running = h.start()?;
    /// running.push('a', 100)?;
    /// running.push('a', 200)?;
    /// running.watermark(999)?; // the window [0, 1000) fires
    /// assert_eq!(probe.take().iter().map(|r| r.value).collect::<Vec<_>>(), vec![2]);
    /// running.finish()?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn start(self) -> Result<RunningHarness<T>> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Error::Runtime { job: "harness".into(), message: e.to_string() })?;
        let handle = {
            let _guard = runtime.enter();
            self.job.spawn()?
        };
        Ok(RunningHarness {
            runtime,
            handle: Some(handle),
            clock: self.clock,
            tx: self.tx,
            probes: self.probes,
            watermark: NO_TIMESTAMP,
        })
    }
}

/// A started [`Harness`].
///
/// ```
/// use std::time::Duration;
/// use weibo::window::{Count, Tumbling};
/// let mut h = weibo::testing::Harness::<char>::new("harness");
/// let counts = h.input().key_by(|c: &char| *c).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count);
/// let probe = h.output(&counts);
/// let mut running = h.start()?;
/// running.push('a', 100)?;
/// running.push('a', 200)?;
/// running.watermark(999)?; // the window [0, 1000) fires
/// assert_eq!(probe.take().iter().map(|r| r.value).collect::<Vec<_>>(), vec![2]);
/// running.finish()?;
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct RunningHarness<T> {
    runtime: tokio::runtime::Runtime,
    handle: Option<crate::stream::job::JobHandle>,
    clock: Clock,
    tx: tokio::sync::mpsc::UnboundedSender<Command<T>>,
    probes: Vec<Arc<Mutex<ProbeState>>>,
    watermark: Timestamp,
}

impl<T> std::fmt::Debug for RunningHarness<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningHarness").field("watermark", &self.watermark).finish_non_exhaustive()
    }
}

/// How long [`RunningHarness::watermark`] waits for a watermark to arrive.
const HARNESS_PATIENCE: Duration = Duration::from_secs(30);

impl<T: Send + 'static> RunningHarness<T> {
    fn send(&self, command: Command<T>) -> Result<()> {
        self.tx.send(command).map_err(|_| crate::error::internal_error!("the harness input closed while the job runs"))
    }

    /// Pushes a record with event time `timestamp`.
    ///
    /// # Errors
    /// When the job has stopped.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::{Count, Tumbling};
    /// let mut h = weibo::testing::Harness::<char>::new("harness");
    /// let counts = h.input().key_by(|c: &char| *c).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count);
    /// let probe = h.output(&counts);
    /// let mut running = h.start()?;
    /// running.push('a', 100)?;
    /// running.push('a', 200)?;
    /// running.watermark(999)?; // the window [0, 1000) fires
    /// assert_eq!(probe.take().iter().map(|r| r.value).collect::<Vec<_>>(), vec![2]);
    /// running.finish()?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn push(&mut self, record: T, timestamp: Timestamp) -> Result<()> {
        self.send(Command::Record(record, timestamp))
    }

    /// Advances the input's watermark to `watermark` and waits until every
    /// output has seen it, so what it fired can be taken from the probes.
    ///
    /// # Errors
    /// The job's error if it stopped; [`Error::Internal`] if the watermark
    /// does not arrive within 30 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::{Count, Tumbling};
    /// let mut h = weibo::testing::Harness::<char>::new("harness");
    /// let counts = h.input().key_by(|c: &char| *c).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count);
    /// let probe = h.output(&counts);
    /// let mut running = h.start()?;
    /// running.push('a', 100)?;
    /// running.push('a', 200)?;
    /// running.watermark(999)?; // the window [0, 1000) fires
    /// assert_eq!(probe.take().iter().map(|r| r.value).collect::<Vec<_>>(), vec![2]);
    /// running.finish()?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
        if watermark <= self.watermark {
            return Ok(());
        }
        self.watermark = watermark;
        self.send(Command::Watermark(watermark))?;
        let started = std::time::Instant::now();
        loop {
            let arrived = self.probes.iter().all(|p| {
                let state = p.lock().unwrap_or_else(PoisonError::into_inner);
                !state.watermarks.is_empty() && state.watermarks.iter().all(|w| *w >= watermark)
            });
            if arrived {
                return Ok(());
            }
            if self.handle.as_ref().is_none_or(crate::stream::job::JobHandle::is_finished) {
                return self.finish().map(|_| ());
            }
            if started.elapsed() > HARNESS_PATIENCE {
                return Err(crate::error::internal_error!(
                    "watermark {watermark} did not reach the outputs within 30 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Moves the processing time to `time` (milliseconds; it never goes
    /// back) and waits until every operator with processing-time timers
    /// has fired those due by then, so what they emitted can be taken from
    /// the probes.
    ///
    /// # Errors
    /// The job's error if it stopped; [`Error::Internal`] if the timers
    /// have not fired within 30 s.
    ///
    /// ```
    /// use weibo::{Timer, on_error};
    /// let mut h = weibo::testing::Harness::<char>::new("processing time");
    /// // Report a key 1 minute (processing time) after its first record.
    /// let reports = h.input().key_by(|c: &char| *c).process_with_state_and_timers(
    ///     on_error::Fail,
    ///     |states| states.value::<bool>("seen"),
    ///     |ctx, seen, _| {
    ///         if ctx.value(seen).get().is_none() {
    ///             ctx.value(seen).set(true);
    ///             ctx.register_processing_timer(ctx.processing_time() + 60_000);
    ///         }
    ///     },
    ///     |ctx, _, timer: Timer| {
    ///         let line = format!("{} at {}", ctx.key(), timer.time);
    ///         ctx.emit(line);
    ///     },
    /// );
    /// let probe = h.output(&reports);
    /// let mut running = h.start()?;
    /// running.push('a', 1)?;
    /// running.watermark(1)?;
    /// running.set_processing_time(59_999)?;
    /// assert!(probe.take().is_empty());
    /// running.set_processing_time(60_000)?;
    /// assert_eq!(probe.take(), vec!["a at 60000".to_string()]);
    /// running.finish()?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn set_processing_time(&mut self, time: Timestamp) -> Result<()> {
        self.clock.set(time);
        let started = std::time::Instant::now();
        loop {
            let running = self.handle.as_ref().is_some_and(|h| h.status() == crate::runtime::status::JobState::Running);
            if running && self.clock.fired_through(time) {
                return Ok(());
            }
            if self.handle.as_ref().is_none_or(crate::stream::job::JobHandle::is_finished) {
                return self.finish().map(|_| ());
            }
            if started.elapsed() > HARNESS_PATIENCE {
                return Err(crate::error::internal_error!(
                    "the processing-time timers due at {time} did not fire within 30 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The running job's metrics now (empty once it has finished: the
    /// report of [`finish`](Self::finish) has its last ones). A state's
    /// figures are read from the instances about once a second.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.handle.as_ref().map(crate::stream::job::JobHandle::metrics).unwrap_or_default()
    }

    /// Ends the input (watermark +∞: every window fires) and waits for the
    /// job to finish.
    ///
    /// # Errors
    /// The job's error.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::{Count, Tumbling};
    /// let mut h = weibo::testing::Harness::<char>::new("harness");
    /// let counts = h.input().key_by(|c: &char| *c).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count);
    /// let probe = h.output(&counts);
    /// let mut running = h.start()?;
    /// running.push('a', 100)?;
    /// running.push('a', 200)?;
    /// running.watermark(999)?; // the window [0, 1000) fires
    /// assert_eq!(probe.take().iter().map(|r| r.value).collect::<Vec<_>>(), vec![2]);
    /// running.finish()?;
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn finish(&mut self) -> Result<TestReport> {
        let _ = self.tx.send(Command::End);
        let handle = self.handle.take().ok_or_else(|| crate::error::internal_error!("the harness already finished"))?;
        let report = self.runtime.block_on(handle.wait())?;
        Ok(TestReport { metrics: report.metrics })
    }
}

/// The source behind a [`Harness`]: commands from the test, in order.
struct ManualSource<T> {
    rx: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Command<T>>>>,
}

impl<T: Clone + Send + 'static> Source for ManualSource<T> {
    type Item = T;

    fn default_name(&self) -> String {
        "input".into()
    }

    fn describe(&self) -> String {
        "test harness".into()
    }

    fn partitions(&self) -> usize {
        1
    }

    fn open(&self, _partition: usize) -> Result<Box<dyn SourceReader<T>>> {
        let rx = self.rx.lock().unwrap_or_else(PoisonError::into_inner).take();
        let rx = rx.ok_or_else(|| crate::error::internal_error!("a harness runs once"))?;
        Ok(Box::new(ManualReader { rx, offset: 0 }))
    }
}

struct ManualReader<T> {
    rx: tokio::sync::mpsc::UnboundedReceiver<Command<T>>,
    offset: u64,
}

impl<T: Send + 'static> SourceReader<T> for ManualReader<T> {
    fn read<'a>(&'a mut self, out: &'a mut SourceOutput<T>) -> BoxFuture<'a, Result<ReadStatus>> {
        Box::pin(async move {
            loop {
                let command = match self.rx.try_recv() {
                    Ok(c) => c,
                    Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => return Ok(ReadStatus::Done),
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                        if !out.is_empty() {
                            return Ok(ReadStatus::More);
                        }
                        let deadline = tokio::time::Instant::from_std(out.deadline());
                        match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                            Ok(Some(c)) => c,
                            Ok(None) => return Ok(ReadStatus::Done),
                            Err(_) => return Ok(ReadStatus::Idle),
                        }
                    }
                };
                match command {
                    Command::Record(v, ts) => {
                        out.push(v, self.offset, Some(ts));
                        self.offset += 1;
                        if out.remaining() == 0 {
                            return Ok(ReadStatus::More);
                        }
                    }
                    // Records pushed before the watermark go out with the
                    // old one; the head forwards the new one after them.
                    Command::Watermark(wm) => {
                        out.advance_watermark(wm);
                        return Ok(ReadStatus::More);
                    }
                    Command::End => return Ok(ReadStatus::Done),
                }
            }
        })
    }
}

/// The sink behind a [`Probe`]: collects records and watermarks.
struct ProbeSink<U> {
    sink: CollectSink<U>,
    state: Arc<Mutex<ProbeState>>,
}

impl<U: Clone + Send + 'static> crate::sinks::Sink<U> for ProbeSink<U> {
    fn default_name(&self) -> String {
        "probe".into()
    }

    fn open(&self, instance: usize, parallelism: usize) -> Result<Box<dyn crate::sinks::SinkWriter<U>>> {
        // Instances open lazily (at their first flush, watermark or batch):
        // one opening after another recorded a watermark must not wipe it,
        // since each watermark is forwarded once.
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if state.watermarks.len() < parallelism {
                state.watermarks.resize(parallelism, NO_TIMESTAMP);
            }
        }
        Ok(Box::new(ProbeWriter {
            inner: crate::sinks::Sink::<U>::open(&self.sink, instance, parallelism)?,
            state: self.state.clone(),
            instance,
        }))
    }
}

struct ProbeWriter<U> {
    inner: Box<dyn crate::sinks::SinkWriter<U>>,
    state: Arc<Mutex<ProbeState>>,
    instance: usize,
}

impl<U: Send> crate::sinks::SinkWriter<U> for ProbeWriter<U> {
    fn write(&mut self, batch: &mut crate::sinks::SinkBatch<'_, U>) -> Result<()> {
        self.inner.write(batch)
    }

    fn on_watermark(&mut self, watermark: Timestamp) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = state.watermarks.get_mut(self.instance) {
            *w = (*w).max(watermark);
        }
        Ok(())
    }
}
