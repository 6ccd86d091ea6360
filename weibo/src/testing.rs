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

/// Runs `future` to completion on a fresh two-thread tokio runtime.
///
/// # Panics
/// If the runtime cannot be created (the OS refuses threads).
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
pub fn run<T, U, F>(input: Vec<T>, pipeline: F) -> Result<Vec<U>>
where
    T: Clone + Send + 'static,
    U: Clone + Send + 'static,
    F: FnOnce(Stream<T>) -> Stream<U>,
{
    run_job(|job| pipeline(job.source(IterSource::new(input))))
}

/// Builds a job with `build` (which adds sources and returns the stream to
/// observe), runs it and returns what the stream emitted.
///
/// # Errors
/// The job's error.
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
#[derive(Debug)]
pub struct TestJob {
    job: Job,
}

/// The records a stream emitted in a [`TestJob`].
#[derive(Debug, Clone)]
pub struct Collected<T>(CollectSink<T>);

impl<T: Clone> Collected<T> {
    /// Everything collected (read it after the run).
    pub fn values(&self) -> Vec<T> {
        self.0.values()
    }

    /// Everything collected, sorted.
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
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TestReport {
    /// The job's final metrics.
    pub metrics: MetricsSnapshot,
}

impl TestJob {
    /// A new test job.
    pub fn new(name: &str) -> Self {
        Self { job: Job::new(name) }
    }

    /// Changes the job's settings (`|job| job.with_max_key_groups(16)`).
    #[must_use]
    pub fn configure(self, f: impl FnOnce(Job) -> Job) -> Self {
        Self { job: f(self.job) }
    }

    /// The job, to add other sources or inspect its graph.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// An in-memory input (one partition; offsets are indexes).
    pub fn input<T: Clone + Send + 'static>(&mut self, values: Vec<T>) -> Stream<T> {
        self.job.source(IterSource::new(values))
    }

    /// Collects what `stream` emits.
    pub fn collect<T: Clone + Send + 'static>(&mut self, stream: &Stream<T>) -> Collected<T> {
        let sink = CollectSink::new();
        let _ = stream.sink(sink.clone());
        Collected(sink)
    }

    /// Runs the job to the end (blocking).
    ///
    /// # Errors
    /// The job's error.
    pub fn run(self) -> Result<TestReport> {
        block_on(self.run_async())
    }

    /// Runs the job to the end.
    ///
    /// # Errors
    /// The job's error.
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
    pub fn take(&self) -> Vec<U> {
        self.sink.take()
    }
}

impl<T: Clone + Send + 'static> Harness<T> {
    /// A harness with one input; its job flushes every millisecond, so
    /// watermarks travel fast.
    pub fn new(name: &str) -> Self {
        let job = Job::new(name).with_buffer_timeout(Duration::from_millis(1));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let input = job.source(ManualSource { rx: Mutex::new(Some(rx)) });
        Self { job, input, tx, probes: Vec::new() }
    }

    /// Changes the job's settings.
    #[must_use]
    pub fn configure(self, f: impl FnOnce(Job) -> Job) -> Self {
        Self { job: f(self.job), ..self }
    }

    /// The input: records carry the timestamps given to
    /// [`RunningHarness::push`], and the watermarks given to
    /// [`RunningHarness::watermark`].
    pub fn input(&self) -> Stream<T> {
        self.input.clone()
    }

    /// Observes what `stream` emits.
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
        Ok(RunningHarness { runtime, handle: Some(handle), tx: self.tx, probes: self.probes, watermark: NO_TIMESTAMP })
    }
}

/// A started [`Harness`].
pub struct RunningHarness<T> {
    runtime: tokio::runtime::Runtime,
    handle: Option<crate::stream::job::JobHandle>,
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
        self.tx.send(command).map_err(|_| Error::Internal("the harness input closed while the job runs".into()))
    }

    /// Pushes a record with event time `timestamp`.
    ///
    /// # Errors
    /// When the job has stopped.
    pub fn push(&mut self, record: T, timestamp: Timestamp) -> Result<()> {
        self.send(Command::Record(record, timestamp))
    }

    /// Advances the input's watermark to `watermark` and waits until every
    /// output has seen it, so what it fired can be taken from the probes.
    ///
    /// # Errors
    /// The job's error if it stopped; [`Error::Internal`] if the watermark
    /// does not arrive within 30 s.
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
                return Err(Error::Internal(format!("watermark {watermark} did not reach the outputs within 30 s")));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Ends the input (watermark +∞: every window fires) and waits for the
    /// job to finish.
    ///
    /// # Errors
    /// The job's error.
    pub fn finish(&mut self) -> Result<TestReport> {
        let _ = self.tx.send(Command::End);
        let handle = self.handle.take().ok_or_else(|| Error::Internal("the harness already finished".into()))?;
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
        let rx = rx.ok_or_else(|| Error::Internal("a harness runs once".into()))?;
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
        self.state.lock().unwrap_or_else(PoisonError::into_inner).watermarks = vec![NO_TIMESTAMP; parallelism];
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
