//! Joins of two keyed streams: the interval join, window joins and
//! co-groups, and a stream's joins with a table (temporal and
//! latest-value).

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use crate::codec::Data;
use crate::codec::key::Key;
use crate::metrics::{OperatorCounters, TwoInputCounters};
use crate::operator::connect::Either;
use crate::operator::join::{Interval, IntervalJoin, JoinFn};
use crate::operator::temporal::{self, Deletes, TableJoin};
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
        let counters = self.connected.counters.clone();
        crate::stream::connect::waiting_in(self.connected.keyed.upstream(), [Some("left"), Some("right")]);
        let joined =
            self.connected.process_function(on_error::Fail, |states| IntervalJoin::new(states, interval, f, counters));
        {
            let mut pipeline = joined.lock();
            pipeline.default_name(joined.node, name);
            if let Some(n) = pipeline.nodes.get_mut(joined.node) {
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
    counters: Arc<TwoInputCounters>,
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
    counters: Arc<TwoInputCounters>,
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
        JoinWindows { windowed: self.connected.keyed.window(assigner), counters: self.connected.counters }
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
        CoGroupWindows { windowed: self.connected.keyed.window(assigner), counters: self.connected.counters }
    }
}

impl<K: Key, L: Data, R: Data> JoinWindows<K, L, R> {
    /// Keeps windows for `lateness` after they fire (see [`JoinWindows`]).
    #[must_use]
    pub fn allowed_lateness(self, lateness: Duration) -> Self {
        Self { windowed: self.windowed.allowed_lateness(lateness), ..self }
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
        let counters = self.counters.clone();
        let group = move |_: &WindowContext<'_, K>, left: &[&L], right: &[&R], out: &mut Vec<U>| {
            for l in left {
                for r in right {
                    f(Some(l), Some(r), out);
                }
            }
            OperatorCounters::add(&counters.matched, left.len() * right.len());
            if left_outer && right.is_empty() {
                left.iter().for_each(|l| f(Some(l), None, out));
                TwoInputCounters::add(&counters.unmatched, 0, left.len());
            }
            if right_outer && left.is_empty() {
                right.iter().for_each(|r| f(None, Some(r), out));
                TwoInputCounters::add(&counters.unmatched, 1, right.len());
            }
        };
        named(self.windowed.build("window_join", CoGroupFn(group, self.counters, PhantomData)), name)
    }
}

impl<K: Key, L: Data, R: Data> CoGroupWindows<K, L, R> {
    /// Keeps windows for `lateness` after they fire (see [`JoinWindows`]).
    #[must_use]
    pub fn allowed_lateness(self, lateness: Duration) -> Self {
        Self { windowed: self.windowed.allowed_lateness(lateness), ..self }
    }

    /// Calls `f` when a window fires, with the window and key, all of the
    /// window's left records and all of its right records (each in
    /// arrival order); `f` emits any number of results.
    pub fn apply<U, F>(self, f: F) -> WindowedOutput<Either<L, R>, U>
    where
        U: Clone + Send + 'static,
        F: Fn(&WindowContext<'_, K>, &[&L], &[&R], &mut Vec<U>) + Send + Sync + 'static,
    {
        named(self.windowed.build("window_co_group", CoGroupFn(f, self.counters, PhantomData)), "window co-group")
    }
}

/// Names a window join's node (the name is its id unless `uid` gives one).
fn named<T, U>(output: WindowedOutput<T, U>, name: &str) -> WindowedOutput<T, U> {
    let results: &Stream<U> = &output;
    results.lock().default_name(results.node, name);
    output
}

/// A temporal join: each record of the stream is joined with the version
/// of its key's table row valid at the record's event time (the newest
/// row at or before it), as Flink SQL's `FOR SYSTEM_TIME AS OF` on a
/// versioned table and Kafka Streams' versioned stores do. Made by
/// [`KeyedStream::temporal_join`]; the table is a changelog stream: each
/// of its records is the key's row from its event time on (a later one
/// replaces it; [`with_deletes`](Self::with_deletes) marks rows that
/// delete the key).
///
/// Semantics:
/// - a stream record waits until the operator's watermark (the lower of
///   both inputs') passes its time, so that every table row at or before
///   it has arrived; then it is joined, once, and the row carries the
///   record's time;
/// - [`join`](Self::join) emits nothing for a record whose key has no row
///   at its time (none yet, or deleted); [`left_join`](Self::left_join)
///   emits it with `None`;
/// - a record of either input behind the watermark by more than the
///   [`retention`](Self::retention) (default 0: `time < watermark`) is
///   late: it goes to the late records output
///   (`side_output(&OutputTag::<Either<L, R>>::late_records())`) and the
///   operator's late counter; within the retention, a stream record is
///   joined at once with the rows kept, and a table row is kept (it
///   changes no row already emitted);
/// - a key's rows older than its newest row at or before
///   `watermark - retention` are removed;
/// - a record without an event time fails the job.
///
/// ```
/// use weibo::time::WatermarkStrategy;
///
/// // Orders priced at the exchange rate of their currency at order time.
/// type Order = (i64, char, u64); // time, currency, amount
/// type Rate = (i64, char, u64); // time, currency, cents per unit
/// let mut t = weibo::testing::TestJob::new("priced");
/// let orders = t.input(vec![(1_000i64, '€', 100u64), (3_000, '€', 100)])
///     .with_timestamps(|o: &Order| o.0, WatermarkStrategy::monotonous());
/// let rates = t.input(vec![(0i64, '€', 110u64), (2_000, '€', 120)])
///     .with_timestamps(|r: &Rate| r.0, WatermarkStrategy::monotonous());
/// let priced = orders
///     .key_by(|o: &Order| o.1)
///     .temporal_join(&rates.key_by(|r: &Rate| r.1))
///     .join(|o: &Order, rate: &Rate| (o.0, o.2 * rate.2 / 100));
/// let out = t.collect(&priced);
/// t.run()?;
/// assert_eq!(out.values(), [(1_000, 110), (3_000, 120)]);
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct TemporalJoinBuilder<K, L, R> {
    connected: ConnectedStreams<K, L, R>,
    retention: i64,
    deletes: Option<Deletes<R>>,
}

/// A latest-value join: each record of the stream is joined with its
/// key's newest table row at the moment the record arrives (Kafka
/// Streams' `KStream`–`KTable` join), for pipelines that do not need event
/// time. Made by [`KeyedStream::latest_join`].
///
/// Semantics:
/// - a record is joined at once, with the row the operator has seen last
///   for its key (none yet, or deleted by a row
///   [`with_deletes`](Self::with_deletes) marks: [`join`](Self::join)
///   emits nothing, [`left_join`](Self::left_join) emits `None`); the row
///   carries the record's time, if it has one;
/// - a table row only replaces the key's row: it emits nothing, and does
///   not change rows already emitted;
/// - so the result depends on the order in which the two inputs' records
///   reach the operator, as in Kafka Streams; when it must not, use
///   [`temporal_join`](KeyedStream::temporal_join).
///
/// ```
/// // Clicks (user, page) with the user's current name.
/// let mut t = weibo::testing::TestJob::new("named");
/// let names = t.input(vec![(1u32, "ann".to_string())]).key_by(|n: &(u32, String)| n.0);
/// let clicks = t.input(vec![(1u32, 10u32), (2, 20)]).key_by(|c: &(u32, u32)| c.0);
/// let named = clicks
///     .latest_join(&names)
///     .left_join(|c: &(u32, u32), n: Option<&(u32, String)>| (c.1, n.map(|n| n.1.clone())));
/// let out = t.collect(&named);
/// t.run()?;
/// let got = out.values();
/// assert!(got.contains(&(20, None)), "user 2 has no name");
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct LatestJoinBuilder<K, L, R> {
    connected: ConnectedStreams<K, L, R>,
    deletes: Option<Deletes<R>>,
}

impl<K: Key, L: Data> KeyedStream<K, L> {
    /// A temporal join of this stream with the versions of `table`, a
    /// changelog stream of the same key type: see
    /// [`TemporalJoinBuilder`].
    pub fn temporal_join<R: Data>(&self, table: &KeyedStream<K, R>) -> TemporalJoinBuilder<K, L, R> {
        TemporalJoinBuilder { connected: self.connect(table), retention: 0, deletes: None }
    }

    /// A latest-value join of this stream with `table`, a changelog stream
    /// of the same key type: see [`LatestJoinBuilder`].
    pub fn latest_join<R: Data>(&self, table: &KeyedStream<K, R>) -> LatestJoinBuilder<K, L, R> {
        LatestJoinBuilder { connected: self.connect(table), deletes: None }
    }
}

impl<K: Key, L: Data, R: Data> TemporalJoinBuilder<K, L, R> {
    /// Keeps the table's old versions `retention` behind the watermark,
    /// and takes records of either input that late (see
    /// [`TemporalJoinBuilder`]).
    #[must_use]
    pub fn retention(self, retention: Duration) -> Self {
        Self { retention: crate::time::millis(retention), ..self }
    }

    /// Table rows for which `is_delete` is true delete their key from
    /// their time on (tombstones), instead of becoming its row.
    #[must_use]
    pub fn with_deletes(self, is_delete: impl Fn(&R) -> bool + Send + Sync + 'static) -> Self {
        Self { deletes: Some(Arc::new(is_delete)), ..self }
    }

    /// Runs the join on `n` instances.
    #[must_use]
    pub fn with_partitions(self, n: usize) -> Self {
        Self { connected: self.connected.with_partitions(n), ..self }
    }

    /// The inner join: `f` of each record and its key's row at its time;
    /// nothing for a record without one.
    pub fn join<U, F>(self, f: F) -> Stream<U>
    where
        U: Clone + Send + 'static,
        F: Fn(&L, &R) -> U + Send + Sync + 'static,
    {
        let f: JoinFn<L, R, U> = Arc::new(move |l, r| Some(f(l?, r?)));
        self.run(f, false, "temporal join")
    }

    /// The left join: `f` of each record and its key's row at its time, or
    /// `None`.
    pub fn left_join<U, F>(self, f: F) -> Stream<U>
    where
        U: Clone + Send + 'static,
        F: Fn(&L, Option<&R>) -> U + Send + Sync + 'static,
    {
        let f: JoinFn<L, R, U> = Arc::new(move |l, r| Some(f(l?, r)));
        self.run(f, true, "temporal left join")
    }

    fn run<U: Clone + Send + 'static>(self, f: JoinFn<L, R, U>, outer: bool, name: &str) -> Stream<U> {
        let join = TableJoin { outer, deletes: self.deletes, f, counters: self.connected.counters.clone() };
        crate::stream::connect::waiting_in(self.connected.keyed.upstream(), [Some("waiting"), Some("versions")]);
        let retention = self.retention;
        let joined = self
            .connected
            .process_function(on_error::Fail, |states| temporal::TemporalJoin::new(states, join, retention));
        let mut pipeline = joined.lock();
        pipeline.default_name(joined.node, name);
        if let Some(n) = pipeline.nodes.get_mut(joined.node) {
            n.detail = format!("retention {retention} ms; {}", n.detail);
        }
        drop(pipeline);
        joined
    }
}

impl<K: Key, L: Data, R: Data> LatestJoinBuilder<K, L, R> {
    /// Table rows for which `is_delete` is true delete their key (the
    /// records after them find no row), instead of becoming its row.
    #[must_use]
    pub fn with_deletes(self, is_delete: impl Fn(&R) -> bool + Send + Sync + 'static) -> Self {
        Self { deletes: Some(Arc::new(is_delete)), ..self }
    }

    /// Runs the join on `n` instances.
    #[must_use]
    pub fn with_partitions(self, n: usize) -> Self {
        Self { connected: self.connected.with_partitions(n), ..self }
    }

    /// The inner join: `f` of each record and its key's latest row;
    /// nothing for a record without one.
    pub fn join<U, F>(self, f: F) -> Stream<U>
    where
        U: Clone + Send + 'static,
        F: Fn(&L, &R) -> U + Send + Sync + 'static,
    {
        let f: JoinFn<L, R, U> = Arc::new(move |l, r| Some(f(l?, r?)));
        self.run(f, false, "latest join")
    }

    /// The left join: `f` of each record and its key's latest row, or
    /// `None`.
    pub fn left_join<U, F>(self, f: F) -> Stream<U>
    where
        U: Clone + Send + 'static,
        F: Fn(&L, Option<&R>) -> U + Send + Sync + 'static,
    {
        let f: JoinFn<L, R, U> = Arc::new(move |l, r| Some(f(l?, r)));
        self.run(f, true, "latest left join")
    }

    fn run<U: Clone + Send + 'static>(self, f: JoinFn<L, R, U>, outer: bool, name: &str) -> Stream<U> {
        let join = TableJoin { outer, deletes: self.deletes, f, counters: self.connected.counters.clone() };
        crate::stream::connect::waiting_in(self.connected.keyed.upstream(), [None, Some("latest")]);
        let joined = self.connected.process_function(on_error::Fail, |states| temporal::LatestJoin::new(states, join));
        joined.lock().default_name(joined.node, name);
        joined
    }
}
