//! Joins of two keyed streams: the interval join, and window joins and
//! co-groups.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use crate::codec::Data;
use crate::codec::key::Key;
use crate::operator::connect::Either;
use crate::operator::join::{Interval, IntervalJoin, JoinFn};
use crate::operator::windows::{CoGroupFn, WindowAssigner, WindowContext};
use crate::stream::connect::ConnectedStreams;
use crate::stream::window::{WindowedOutput, WindowedStream};
use crate::stream::{KeyedStream, Stream, on_error};

/// An interval join of two keyed streams, waiting for its bounds: made by
/// [`KeyedStream::interval_join`].
pub struct IntervalJoinBuilder<K, L, R> {
    connected: ConnectedStreams<K, L, R>,
}

/// An interval join with its bounds: pairs each left record with the
/// right records of its key whose event time is within
/// `[left + lower, left + upper]` (bounds in milliseconds, inclusive unless
/// made exclusive).
///
/// Semantics (Flink's interval join, plus outer joins and a late output):
/// - a pair is emitted once, as soon as its second record arrives, with
///   the later of the two records' times as its timestamp;
/// - a record behind the operator's watermark (`time < watermark`) is
///   late: it joins nothing, goes to the late records side output
///   (`side_output(&OutputTag::<Either<L, R>>::late_records())` on the
///   result) and counts in the operator's late records (Flink drops it
///   silently);
/// - a left record is kept until the watermark reaches its time plus the
///   upper bound (its time, if the bound is not positive), a right record
///   until the watermark reaches its time minus the lower bound (its time,
///   if the bound is not negative): Flink's cleanup, boundary included;
/// - an outer join ([`left_join`](Self::left_join),
///   [`right_join`](Self::right_join), [`full_join`](Self::full_join))
///   emits a record that was never paired when it is removed, once, with
///   its own time: never retracted, never followed by a pair;
/// - a record without an event time fails the job (as in Flink).
///
/// ```
/// use weibo::time::WatermarkStrategy;
///
/// // Clicks joined with the impressions of the same ad shown at most
/// // 1 s before them.
/// let mut t = weibo::testing::TestJob::new("attribution");
/// let strategy = WatermarkStrategy::monotonous;
/// let shown = t.input(vec![(1u32, 1_000i64), (2, 1_500)]).with_timestamps(|s: &(u32, i64)| s.1, strategy());
/// let clicked = t.input(vec![(1u32, 1_800i64), (2, 3_000)]).with_timestamps(|c: &(u32, i64)| c.1, strategy());
/// let pairs = shown
///     .key_by(|s: &(u32, i64)| s.0)
///     .interval_join(&clicked.key_by(|c: &(u32, i64)| c.0))
///     .between(0, 1_000)
///     .join(|s: &(u32, i64), c: &(u32, i64)| (s.0, c.1 - s.1));
/// let out = t.collect(&pairs);
/// t.run()?;
/// assert_eq!(out.values(), [(1, 800)], "ad 2's click came 1.5 s after it was shown");
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct IntervalJoinBetween<K, L, R> {
    connected: ConnectedStreams<K, L, R>,
    lower: i64,
    upper: i64,
}

impl<K: Key, L: Data> KeyedStream<K, L> {
    /// An interval join of this stream (the left input) with `other` (the
    /// right), keyed by the same key type: set its bounds with
    /// [`between`](IntervalJoinBuilder::between).
    pub fn interval_join<R: Data>(&self, other: &KeyedStream<K, R>) -> IntervalJoinBuilder<K, L, R> {
        IntervalJoinBuilder { connected: self.connect(other) }
    }
}

impl<K: Key, L: Data, R: Data> IntervalJoinBuilder<K, L, R> {
    /// Pairs a left record at time `t` with the right records of its key
    /// at times in `[t + lower, t + upper]`, in milliseconds (`lower` may be
    /// negative: right records before the left one).
    pub fn between(self, lower: i64, upper: i64) -> IntervalJoinBetween<K, L, R> {
        IntervalJoinBetween { connected: self.connected, lower, upper }
    }
}

impl<K: Key, L: Data, R: Data> IntervalJoinBetween<K, L, R> {
    /// Makes the lower bound exclusive: `(t + lower, ...]`.
    #[must_use]
    pub fn lower_bound_exclusive(self) -> Self {
        Self { lower: self.lower.saturating_add(1), ..self }
    }

    /// Makes the upper bound exclusive: `[..., t + upper)`.
    #[must_use]
    pub fn upper_bound_exclusive(self) -> Self {
        Self { upper: self.upper.saturating_sub(1), ..self }
    }

    /// Runs the join on `n` instances.
    #[must_use]
    pub fn with_partitions(self, n: usize) -> Self {
        Self { connected: self.connected.with_partitions(n), ..self }
    }

    /// The inner join: `f` of every pair.
    pub fn join<U, F>(self, f: F) -> Stream<U>
    where
        U: Clone + Send + 'static,
        F: Fn(&L, &R) -> U + Send + Sync + 'static,
    {
        let f: JoinFn<L, R, U> = Arc::new(move |l, r| Some(f(l?, r?)));
        self.run(f, false, false, "interval join")
    }

    /// The left outer join: `f` of every pair, and of every left record
    /// never paired (with `None`), once its interval has passed.
    pub fn left_join<U, F>(self, f: F) -> Stream<U>
    where
        U: Clone + Send + 'static,
        F: Fn(&L, Option<&R>) -> U + Send + Sync + 'static,
    {
        let f: JoinFn<L, R, U> = Arc::new(move |l, r| Some(f(l?, r)));
        self.run(f, true, false, "interval left join")
    }

    /// The right outer join: `f` of every pair, and of every right record
    /// never paired (with `None`), once its interval has passed.
    pub fn right_join<U, F>(self, f: F) -> Stream<U>
    where
        U: Clone + Send + 'static,
        F: Fn(Option<&L>, &R) -> U + Send + Sync + 'static,
    {
        let f: JoinFn<L, R, U> = Arc::new(move |l, r| Some(f(l, r?)));
        self.run(f, false, true, "interval right join")
    }

    /// The full outer join: `f` of every pair, and of every record of
    /// either side never paired, once its interval has passed.
    pub fn full_join<U, F>(self, f: F) -> Stream<U>
    where
        U: Clone + Send + 'static,
        F: Fn(Option<&L>, Option<&R>) -> U + Send + Sync + 'static,
    {
        let f: JoinFn<L, R, U> = Arc::new(move |l, r| Some(f(l, r)));
        self.run(f, true, true, "interval full join")
    }

    fn run<U: Clone + Send + 'static>(
        self,
        f: JoinFn<L, R, U>,
        left_outer: bool,
        right_outer: bool,
        name: &str,
    ) -> Stream<U> {
        let interval = Interval { lower: self.lower, upper: self.upper, left_outer, right_outer };
        let joined = self.connected.process_function(on_error::Fail, |states| IntervalJoin::new(states, interval, f));
        {
            let mut pipeline = joined.lock();
            if let Some(n) = pipeline.nodes.get_mut(joined.node) {
                n.name = name.into();
                n.detail = format!("between {} and {} ms; {}", self.lower, self.upper, n.detail);
            }
            if self.lower > self.upper {
                pipeline.wiring_errors.push(format!(
                    "{name}: the lower bound ({} ms) is above the upper bound ({} ms), so no pair could ever match",
                    self.lower, self.upper
                ));
            }
        }
        joined
    }
}

/// Two keyed streams to be joined in windows: made by
/// [`KeyedStream::join`]; choose the windows with
/// [`window`](Self::window).
pub struct JoinedStreams<K, L, R> {
    connected: ConnectedStreams<K, L, R>,
}

/// Two keyed streams to be co-grouped in windows: made by
/// [`KeyedStream::co_group`]; choose the windows with
/// [`window`](Self::window).
pub struct CoGroupedStreams<K, L, R> {
    connected: ConnectedStreams<K, L, R>,
}

/// A window join: the records of both inputs are assigned to the same
/// windows per key, and when a window fires every pair of a left and a
/// right record in it is joined.
///
/// Semantics (Flink's window join, plus outer joins and a late output):
/// - windows are those of [`KeyedStream::window`] (tumbling, sliding,
///   session), assigned to each record by its own event time; a session
///   window spans the records of both sides;
/// - a window fires when the watermark (the lower of both inputs') reaches
///   its last timestamp; its pairs (left records in arrival order, each
///   with the right records in arrival order) carry that timestamp
///   (`end - 1`);
/// - with [`allowed_lateness`](Self::allowed_lateness), a window is kept
///   that much longer; a record arriving in that time re-fires it, and the
///   window emits all of its pairs again, the earlier ones included (as
///   Flink does);
/// - a record later than that joins nothing and goes to the late output
///   ([`WindowedOutput::late_records`], records of either side as
///   [`Either`]), which Flink's window join lacks; unless asked for, it is
///   dropped and counted;
/// - [`left_join`](Self::left_join), [`right_join`](Self::right_join) and
///   [`full_join`](Self::full_join) also emit, when the window fires, each
///   record of the window that has no partner in it (with `None`).
///
/// ```
/// use std::time::Duration;
/// use weibo::time::WatermarkStrategy;
/// use weibo::window::Tumbling;
///
/// // Page views and clicks of the same user in the same minute.
/// let mut t = weibo::testing::TestJob::new("views and clicks");
/// let views = t.input(vec![(1u32, 1_000i64), (2, 2_000)]).with_timestamps(|v: &(u32, i64)| v.1, WatermarkStrategy::monotonous());
/// let clicks = t.input(vec![(1u32, 30_000i64), (2, 61_000)]).with_timestamps(|c: &(u32, i64)| c.1, WatermarkStrategy::monotonous());
/// let pairs = views
///     .key_by(|v: &(u32, i64)| v.0)
///     .join(&clicks.key_by(|c: &(u32, i64)| c.0))
///     .window(Tumbling::of(Duration::from_secs(60)))
///     .apply(|v: &(u32, i64), c: &(u32, i64)| (v.0, c.1 - v.1));
/// let out = t.collect(&pairs);
/// t.run()?;
/// assert_eq!(out.values(), [(1, 29_000)], "user 2 clicked in the next minute");
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct JoinWindows<K, L, R> {
    windowed: WindowedStream<K, Either<L, R>>,
}

/// A window co-group: the records of both inputs are assigned to the same
/// windows per key, and when a window fires a function sees all of its
/// left and all of its right records (at least one of them is not empty).
/// Windows, timestamps, lateness and the late output are a window join's
/// ([`JoinWindows`]).
///
/// ```
/// use std::time::Duration;
/// use weibo::time::WatermarkStrategy;
/// use weibo::window::{Tumbling, WindowContext};
///
/// // Orders and payments per customer and minute: what is still owed.
/// let mut t = weibo::testing::TestJob::new("owed");
/// let orders = t.input(vec![(1u32, 1_000i64, 50u64), (1, 2_000, 20), (2, 3_000, 10)])
///     .with_timestamps(|o: &(u32, i64, u64)| o.1, WatermarkStrategy::monotonous());
/// let payments = t.input(vec![(1u32, 5_000i64, 60u64)])
///     .with_timestamps(|p: &(u32, i64, u64)| p.1, WatermarkStrategy::monotonous());
/// let owed = orders
///     .key_by(|o: &(u32, i64, u64)| o.0)
///     .co_group(&payments.key_by(|p: &(u32, i64, u64)| p.0))
///     .window(Tumbling::of(Duration::from_secs(60)))
///     .apply(|ctx: &WindowContext<'_, u32>, ordered: &[&(u32, i64, u64)], paid: &[&(u32, i64, u64)], out: &mut Vec<(u32, u64)>| {
///         let sum = |rows: &[&(u32, i64, u64)]| rows.iter().map(|r| r.2).sum::<u64>();
///         out.push((*ctx.key, sum(ordered) - sum(paid)));
///     });
/// let out = t.collect(&owed);
/// t.run()?;
/// let mut got = out.values();
/// got.sort();
/// assert_eq!(got, [(1, 10), (2, 10)]);
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct CoGroupWindows<K, L, R> {
    windowed: WindowedStream<K, Either<L, R>>,
}

impl<K: Key, L: Data> KeyedStream<K, L> {
    /// A window join of this stream (the left input) with `other` (the
    /// right), keyed by the same key type (Flink's
    /// `join(..).where(..).equalTo(..)`: each side's key is its `key_by`):
    /// choose the windows with [`window`](JoinedStreams::window).
    pub fn join<R: Data>(&self, other: &KeyedStream<K, R>) -> JoinedStreams<K, L, R> {
        JoinedStreams { connected: self.connect(other) }
    }

    /// A window co-group of this stream (the left input) with `other` (the
    /// right), keyed by the same key type: choose the windows with
    /// [`window`](CoGroupedStreams::window).
    pub fn co_group<R: Data>(&self, other: &KeyedStream<K, R>) -> CoGroupedStreams<K, L, R> {
        CoGroupedStreams { connected: self.connect(other) }
    }
}

impl<K: Key, L: Data, R: Data> JoinedStreams<K, L, R> {
    /// Runs the join on `n` instances.
    #[must_use]
    pub fn with_partitions(self, n: usize) -> Self {
        Self { connected: self.connected.with_partitions(n) }
    }

    /// Joins in the windows of `assigner`.
    pub fn window<W: WindowAssigner>(self, assigner: W) -> JoinWindows<K, L, R> {
        JoinWindows { windowed: self.connected.keyed.window(assigner) }
    }
}

impl<K: Key, L: Data, R: Data> CoGroupedStreams<K, L, R> {
    /// Runs the co-group on `n` instances.
    #[must_use]
    pub fn with_partitions(self, n: usize) -> Self {
        Self { connected: self.connected.with_partitions(n) }
    }

    /// Groups in the windows of `assigner`.
    pub fn window<W: WindowAssigner>(self, assigner: W) -> CoGroupWindows<K, L, R> {
        CoGroupWindows { windowed: self.connected.keyed.window(assigner) }
    }
}

impl<K: Key, L: Data, R: Data> JoinWindows<K, L, R> {
    /// Keeps windows for `lateness` after they fire (see [`JoinWindows`]).
    #[must_use]
    pub fn allowed_lateness(self, lateness: Duration) -> Self {
        Self { windowed: self.windowed.allowed_lateness(lateness) }
    }

    /// The inner join: `f` of every pair of a window.
    pub fn apply<U, F>(self, f: F) -> WindowedOutput<Either<L, R>, U>
    where
        U: Clone + Send + 'static,
        F: Fn(&L, &R) -> U + Send + Sync + 'static,
    {
        self.pairs("window join", false, false, move |l, r, out| {
            if let (Some(l), Some(r)) = (l, r) {
                out.push(f(l, r));
            }
        })
    }

    /// The left outer join: `f` of every pair of a window, and of each
    /// left record without a right one in its window (with `None`).
    pub fn left_join<U, F>(self, f: F) -> WindowedOutput<Either<L, R>, U>
    where
        U: Clone + Send + 'static,
        F: Fn(&L, Option<&R>) -> U + Send + Sync + 'static,
    {
        self.pairs("window left join", true, false, move |l, r, out| {
            if let Some(l) = l {
                out.push(f(l, r));
            }
        })
    }

    /// The right outer join: `f` of every pair of a window, and of each
    /// right record without a left one in its window (with `None`).
    pub fn right_join<U, F>(self, f: F) -> WindowedOutput<Either<L, R>, U>
    where
        U: Clone + Send + 'static,
        F: Fn(Option<&L>, &R) -> U + Send + Sync + 'static,
    {
        self.pairs("window right join", false, true, move |l, r, out| {
            if let Some(r) = r {
                out.push(f(l, r));
            }
        })
    }

    /// The full outer join: `f` of every pair of a window, and of each
    /// record of either side without a partner in its window.
    pub fn full_join<U, F>(self, f: F) -> WindowedOutput<Either<L, R>, U>
    where
        U: Clone + Send + 'static,
        F: Fn(Option<&L>, Option<&R>) -> U + Send + Sync + 'static,
    {
        self.pairs("window full join", true, true, move |l, r, out| out.push(f(l, r)))
    }

    /// Every pair of a window, then (for an outer join) the records of a
    /// side whose other side is empty in that window.
    fn pairs<U, F>(self, name: &str, left_outer: bool, right_outer: bool, f: F) -> WindowedOutput<Either<L, R>, U>
    where
        U: Clone + Send + 'static,
        F: Fn(Option<&L>, Option<&R>, &mut Vec<U>) + Send + Sync + 'static,
    {
        let group = move |_: &WindowContext<'_, K>, left: &[&L], right: &[&R], out: &mut Vec<U>| {
            for l in left {
                for r in right {
                    f(Some(l), Some(r), out);
                }
            }
            if left_outer && right.is_empty() {
                left.iter().for_each(|l| f(Some(l), None, out));
            }
            if right_outer && left.is_empty() {
                right.iter().for_each(|r| f(None, Some(r), out));
            }
        };
        named(self.windowed.build("window_join", CoGroupFn(group, PhantomData)), name)
    }
}

impl<K: Key, L: Data, R: Data> CoGroupWindows<K, L, R> {
    /// Keeps windows for `lateness` after they fire (see [`JoinWindows`]).
    #[must_use]
    pub fn allowed_lateness(self, lateness: Duration) -> Self {
        Self { windowed: self.windowed.allowed_lateness(lateness) }
    }

    /// Calls `f` when a window fires, with the window and key, all of the
    /// window's left records and all of its right records (each in
    /// arrival order); `f` emits any number of results.
    pub fn apply<U, F>(self, f: F) -> WindowedOutput<Either<L, R>, U>
    where
        U: Clone + Send + 'static,
        F: Fn(&WindowContext<'_, K>, &[&L], &[&R], &mut Vec<U>) + Send + Sync + 'static,
    {
        named(self.windowed.build("window_co_group", CoGroupFn(f, PhantomData)), "window co-group")
    }
}

/// Names a window join's node (the name is its id unless `uid` gives one).
fn named<T, U>(output: WindowedOutput<T, U>, name: &str) -> WindowedOutput<T, U> {
    let results: &Stream<U> = &output;
    if let Some(n) = results.lock().nodes.get_mut(results.node) {
        n.name = name.into();
    }
    output
}
