//! Joins of two keyed streams: the interval join.

use std::sync::Arc;

use crate::codec::Data;
use crate::codec::key::Key;
use crate::operator::join::{Interval, IntervalJoin, JoinFn};
use crate::stream::connect::ConnectedStreams;
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
