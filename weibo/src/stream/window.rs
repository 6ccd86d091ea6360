//! The typed builder of windows: `KeyedStream::window`, then a window
//! function. The operators themselves are in `crate::operator::windows`.

use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use crate::codec::Data;
use crate::codec::key::Key;
use crate::operator::windows::{
    AggregateFn, ProcessFn, ReduceFn, Spec, WindowAssigner, WindowContext, WindowFn, WindowResult,
};
use crate::operator::{Aggregate, windows};
use crate::time::millis;

use super::{KeyedStream, Stream};

/// A keyed stream with windows assigned; apply a window function to get
/// results.
///
/// ```
/// use std::time::Duration;
/// use weibo::window::{Tumbling, WindowedStream};
/// let job = weibo::Job::new("windows");
/// let keyed = job.source(weibo::sources::IterSource::new(vec![1u32])).key_by(|x: &u32| *x);
/// let windowed: WindowedStream<u32, u32> = keyed.window(Tumbling::of(Duration::from_secs(1)));
/// # let _ = windowed;
/// ```
pub struct WindowedStream<K, T> {
    keyed: KeyedStream<K, T>,
    spec: Spec,
    lateness: i64,
}

impl<K, T> std::fmt::Debug for WindowedStream<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowedStream").field("spec", &self.spec).field("lateness", &self.lateness).finish()
    }
}

/// The output of a window function: its results (this derefs to that
/// stream) and, on request, the records that came too late for any window.
///
/// ```
/// use std::time::Duration;
/// use weibo::window::{Count, Tumbling};
/// let mut t = weibo::testing::TestJob::new("late");
/// let input = t.input(vec![(1_500i64, 1u8), (200, 2)]); // the second is late
/// let timed = input.with_timestamps(|r: &(i64, u8)| r.0, weibo::time::WatermarkStrategy::monotonous());
/// let output = timed.key_by(|_: &(i64, u8)| 0u8).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count);
/// let late = t.collect(&output.late_records());
/// let results = t.collect(&output); // `output` derefs to the results' stream
/// t.run()?;
/// assert_eq!(results.values().len(), 1);
/// assert_eq!(late.values(), vec![(200, 2)]);
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct WindowedOutput<T, U> {
    results: Stream<U>,
    late: Stream<T>,
    late_enabled: Arc<AtomicBool>,
}

impl<T, U> std::fmt::Debug for WindowedOutput<T, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowedOutput").field("results", &self.results).finish_non_exhaustive()
    }
}

impl<T, U> Deref for WindowedOutput<T, U> {
    type Target = Stream<U>;
    fn deref(&self) -> &Stream<U> {
        &self.results
    }
}

impl<T, U> WindowedOutput<T, U> {
    /// The records later than the allowed lateness, which no window took.
    /// Once asked for, they are sent here instead of dropped, and this
    /// stream must be consumed.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::{Count, Tumbling};
    /// let mut t = weibo::testing::TestJob::new("late");
    /// let timed = t.input(vec![(5_000i64, 'a'), (10, 'b')])
    ///     .with_timestamps(|r: &(i64, char)| r.0, weibo::time::WatermarkStrategy::monotonous());
    /// let output = timed.key_by(|r: &(i64, char)| r.1).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count);
    /// let late = t.collect(&output.late_records());
    /// t.collect(&output);
    /// t.run()?;
    /// assert_eq!(late.values(), vec![(10, 'b')]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn late_records(&self) -> Stream<T> {
        self.late_enabled.store(true, Ordering::Relaxed);
        let mut graph = self.late.lock();
        if let Some(port) = graph.nodes.get_mut(self.late.node).and_then(|n| n.outputs.get_mut(1)) {
            port.must_consume = true;
        }
        drop(graph);
        self.late.clone()
    }

    /// The side output `tag` of the window: its late records, with
    /// [`OutputTag::late_records`](crate::process::OutputTag::late_records)
    /// (as [`late_records`](Self::late_records)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::process::OutputTag;
    /// use weibo::window::{Count, Tumbling};
    /// let mut t = weibo::testing::TestJob::new("late");
    /// let timed = t.input(vec![(5_000i64, 'a'), (10, 'b')])
    ///     .with_timestamps(|r: &(i64, char)| r.0, weibo::time::WatermarkStrategy::monotonous());
    /// let output = timed.key_by(|r: &(i64, char)| r.1).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count);
    /// let late = t.collect(&output.side_output(&OutputTag::<(i64, char)>::late_records()));
    /// t.collect(&output);
    /// t.run()?;
    /// assert_eq!(late.values(), vec![(10, 'b')]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    ///
    /// # Panics
    /// Never; another tag, or late records of another type, is a wiring
    /// error, reported when the job is planned or run.
    pub fn side_output<V: Clone + Send + 'static>(&self, tag: &crate::operator::outputs::OutputTag<V>) -> Stream<V> {
        if tag.id() == crate::operator::outputs::LATE_RECORDS {
            self.late_enabled.store(true, Ordering::Relaxed);
            let mut graph = self.late.lock();
            if let Some(port) = graph.nodes.get_mut(self.late.node).and_then(|n| n.outputs.get_mut(1)) {
                port.must_consume = true;
            }
        }
        self.late.side_output(tag)
    }

    /// The results as a plain stream.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::{Count, Tumbling};
    /// let out = weibo::testing::run_timed(vec![(1, 'a')], |s| {
    ///     let results: weibo::Stream<_> =
    ///         s.key_by(|c: &char| *c).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count).into_stream();
    ///     results.map(|r| r.value)
    /// })?;
    /// assert_eq!(out, vec![1]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn into_stream(self) -> Stream<U> {
        self.results
    }

    /// Names the window operator.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::{Count, Tumbling};
    /// let job = weibo::Job::new("named");
    /// let s = job.source(weibo::sources::IterSource::new(vec![1u32]))
    ///     .with_timestamps(|_: &u32| 0, weibo::time::WatermarkStrategy::monotonous());
    /// let counts = s.key_by(|x: &u32| *x).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count).name("per-second");
    /// counts.sink(weibo::sinks::Blackhole::new());
    /// assert!(job.to_string().contains("`per-second`"));
    /// ```
    #[must_use]
    pub fn name(self, name: &str) -> Self {
        let Self { results, late, late_enabled } = self;
        Self { results: results.name(name), late, late_enabled }
    }

    /// Gives the window operator a stable id (see [`Stream::uid`]).
    #[must_use]
    pub fn uid(self, id: &str) -> Self {
        let Self { results, late, late_enabled } = self;
        Self { results: results.uid(id), late, late_enabled }
    }

    /// Declares the version of the window operator's state (see
    /// [`Stream::state_version`]).
    #[must_use]
    pub fn state_version(self, version: u32) -> Self {
        let Self { results, late, late_enabled } = self;
        Self { results: results.state_version(version), late, late_enabled }
    }
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Assigns each record to event-time windows per key. The stream needs
    /// timestamps (`with_timestamps` upstream).
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::Tumbling;
    /// let out = weibo::testing::run_timed(vec![(100, 2u32), (200, 5)], |s| {
    ///     s.key_by(|_: &u32| 0u8).window(Tumbling::of(Duration::from_secs(1))).reduce(|a, b| a.max(b)).into_stream()
    /// })?;
    /// assert_eq!(out[0].value, 5);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn window<W: WindowAssigner>(&self, assigner: W) -> WindowedStream<K, T> {
        let spec = assigner.spec();
        if let Err(message) = spec.validate() {
            self.upstream().lock().wiring_errors.push(message);
        }
        WindowedStream { keyed: self.clone(), spec, lateness: 0 }
    }
}

impl<K: Key, T: Data> WindowedStream<K, T> {
    /// Keeps windows for `lateness` after they fire: records up to that
    /// late still count, and re-fire their window with the updated result.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::{Count, Tumbling};
    /// // The record at 500 ms comes after the window [0, 1000) fired, within the
    /// // allowed lateness: the window fires again with it.
    /// let input = vec![(100, 'a'), (1_200, 'a'), (500, 'a')];
    /// let out = weibo::testing::run_timed(input, |s| {
    ///     s.key_by(|c: &char| *c)
    ///         .window(Tumbling::of(Duration::from_secs(1)))
    ///         .allowed_lateness(Duration::from_secs(1))
    ///         .aggregate(Count)
    ///         .into_stream()
    /// })?;
    /// let first_window: Vec<u64> = out.iter().filter(|r| r.window.start == 0).map(|r| r.value).collect();
    /// assert_eq!(first_window, vec![1, 2]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    #[must_use]
    pub fn allowed_lateness(mut self, lateness: Duration) -> Self {
        self.lateness = millis(lateness);
        self
    }

    /// Folds each window's records with `f`, incrementally (one value per
    /// window is kept).
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::Tumbling;
    /// let out = weibo::testing::run_timed(vec![(1, 3i64), (2, 4), (1_001, 10)], |s| {
    ///     s.key_by(|_: &i64| "sum".to_string()).window(Tumbling::of(Duration::from_secs(1))).reduce(|a, b| a + b).into_stream()
    /// })?;
    /// assert_eq!(out.iter().map(|r| r.value).collect::<Vec<_>>(), vec![7, 10]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn reduce<F>(&self, f: F) -> WindowedOutput<T, WindowResult<K, T>>
    where
        F: Fn(T, T) -> T + Send + Sync + 'static,
    {
        self.build("window_reduce", ReduceFn(f))
    }

    /// Aggregates each window's records with `agg`, incrementally.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::Tumbling;
    /// // The mean per window: an accumulator of (sum, count).
    /// struct Mean;
    /// impl weibo::Aggregate<f64> for Mean {
    ///     type Acc = (f64, u64);
    ///     type Out = f64;
    ///     fn create(&self) -> (f64, u64) { (0.0, 0) }
    ///     fn add(&self, acc: &mut (f64, u64), v: f64) { acc.0 += v; acc.1 += 1; }
    ///     fn merge(&self, acc: &mut (f64, u64), o: (f64, u64)) { acc.0 += o.0; acc.1 += o.1; }
    ///     fn result(&self, acc: &(f64, u64)) -> f64 { acc.0 / acc.1 as f64 }
    /// }
    /// let out = weibo::testing::run_timed(vec![(1, 1.0), (2, 3.0)], |s| {
    ///     s.key_by(|_: &f64| 0u8).window(Tumbling::of(Duration::from_secs(1))).aggregate(Mean).into_stream()
    /// })?;
    /// assert_eq!(out[0].value, 2.0);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn aggregate<G: Aggregate<T>>(&self, agg: G) -> WindowedOutput<T, WindowResult<K, G::Out>> {
        self.build("window_aggregate", AggregateFn(agg))
    }

    /// Calls `f` with all of a window's records when it fires (the records
    /// are kept until then); `f` emits any number of results.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::{Tumbling, WindowContext};
    /// // The median of each window needs all of its records.
    /// let out = weibo::testing::run_timed(vec![(1, 9u32), (2, 1), (3, 5)], |s| {
    ///     s.key_by(|_: &u32| 0u8)
    ///         .window(Tumbling::of(Duration::from_secs(1)))
    ///         .process(|_: &WindowContext<'_, u8>, values: &[u32], out: &mut Vec<u32>| {
    ///             let mut v = values.to_vec();
    ///             v.sort_unstable();
    ///             out.push(v[v.len() / 2]);
    ///         })
    ///         .into_stream()
    /// })?;
    /// assert_eq!(out, vec![5]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn process<U, F>(&self, f: F) -> WindowedOutput<T, U>
    where
        U: Clone + Send + 'static,
        F: Fn(&WindowContext<'_, K>, &[T], &mut Vec<U>) + Send + Sync + 'static,
    {
        self.build("window_process", ProcessFn(f, PhantomData))
    }

    pub(crate) fn build<W: WindowFn<K, T>>(&self, kind: &'static str, func: W) -> WindowedOutput<T, W::Out> {
        let late_enabled = Arc::new(AtomicBool::new(false));
        let lateness = self.lateness.max(0);
        let factory = windows::window::<K, T, W>(func, self.spec, lateness, late_enabled.clone());
        let detail = match lateness {
            0 => self.spec.describe(),
            l => format!("{}, lateness {l} ms", self.spec.describe()),
        };
        let (graph, node) = self.keyed.keyed_node(
            kind,
            vec![
                crate::stream::port::<W::Out>("output", true),
                crate::graph::Port {
                    tag: Some(crate::operator::outputs::LATE_RECORDS),
                    ..crate::stream::port::<T>("late records", false)
                },
            ],
            factory,
        );
        if let Some(n) = graph.lock().unwrap_or_else(PoisonError::into_inner).nodes.get_mut(node) {
            n.detail = detail;
        }
        WindowedOutput { results: Stream::new(graph.clone(), node, 0), late: Stream::new(graph, node, 1), late_enabled }
    }
}
