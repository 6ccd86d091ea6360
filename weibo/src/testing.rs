//! Run pipelines on in-memory input, in one call, for tests and doctests.
//!
//! ```
//! use weibo::testing;
//! let out = testing::run(vec![3, 1, 2], |s| s.map(|x: i32| x + 1))?;
//! assert_eq!(out, vec![4, 2, 3]);
//! # Ok::<(), weibo::Error>(())
//! ```

use std::future::Future;

use crate::error::{Error, Result};
use crate::job::Job;
use crate::metrics::MetricsSnapshot;
use crate::sinks::CollectSink;
use crate::sources::IterSource;
use crate::stream::Stream;

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
