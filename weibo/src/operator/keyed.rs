//! Keyed operators: instances fed by a hash edge, with per-key state.

use std::sync::Arc;

use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::{Error, Result};
use crate::metrics::OperatorCounters;
use crate::operator::Consumer;
use crate::operator::factory::{KeyedFactory, keyed_factory, one};
use crate::operator::function::ProcessOutcome;
use crate::operator::policy::{Failures, Policy, results_and_dead};
use crate::operator::{InputOperator, SnapshotAt, emit, restore_state, snapshot_state};
use crate::operator::{OpInfo, forward_control, typed};
use crate::record::CheckpointId;
use crate::record::{Batch, Meta, RecordBatch, RecordRef, Timestamp};
use crate::state::{KeyedState, RestoreSource, StateSnapshot, StateType, TimerState, ValueStore};
use crate::time::watermarks::InputTime;

/// A record's value; a value that does not decode is an error naming the
/// operator and the record's source position. Per record on the hot path:
/// inlined, with the error kept out of line.
#[inline]
pub(crate) fn decode_value<T: Data>(info: &OpInfo, r: &RecordRef<'_>) -> Result<T> {
    match T::decode(r.value) {
        Ok(v) => Ok(v),
        Err(source) => Err(value_error(info, r, source)),
    }
}

#[cold]
#[inline(never)]
fn value_error(info: &OpInfo, r: &RecordRef<'_>, source: crate::codec::CodecError) -> Error {
    Error::Codec { operator: format!("{} (record from {})", info.name, info.sources.position(&r.meta)), source }
}

/// The codec name recorded for timer state (times and keys in the key encoding).
pub(crate) const TIMERS: &str = "weibo-timers/1";

/// The record's metadata as an output of this operator: its watermark is
/// the operator's, after observing the record's.
#[inline]
pub(crate) fn stamped(time: &mut InputTime<'_>, meta: Meta) -> Meta {
    let _ = time.observe(&meta);
    Meta { watermark: time.current(), ..meta }
}

/// A record's key (inlined as [`decode_value`] is).
#[inline]
pub(crate) fn decode_key<K: Key>(info: &OpInfo, r: &RecordRef<'_>) -> Result<K> {
    match crate::codec::key::decode::<K>(r.key) {
        Ok(k) => Ok(k),
        Err(e) => Err(key_error::<K>(info, r, e)),
    }
}

#[cold]
#[inline(never)]
fn key_error<K>(info: &OpInfo, r: &RecordRef<'_>, e: crate::codec::key::KeyDecodeError) -> Error {
    Error::Codec {
        operator: format!("{} (the key of the record from {})", info.name, info.sources.position(&r.meta)),
        source: crate::codec::CodecError {
            codec: crate::codec::CodecId::new(crate::codec::key::KEY_FORMAT, std::any::type_name::<K>()),
            reason: e.to_string(),
        },
    }
}

/// Puts a batch's records into `pairs` as (key, value): moved out of the
/// batch when an in-process edge carried them typed, decoded otherwise.
#[inline]
pub(crate) fn take_records<K: Key, T: Data>(
    info: &OpInfo,
    batch: &mut RecordBatch,
    pairs: &mut Vec<(K, T)>,
) -> Result<()> {
    if batch.is_broadcast() {
        return Err(crate::error::internal_error!(
            "`{}` got a broadcast input's records, which it cannot key",
            info.name
        ));
    }
    if batch.take_typed(pairs, &info.name).map_err(Error::Internal)? {
        return Ok(());
    }
    pairs.reserve(batch.len());
    for r in batch.iter() {
        pairs.push((decode_key(info, &r)?, decode_value(info, &r)?));
    }
    Ok(())
}

/// How many records a keyed operator asks its state for at a time, one
/// such chunk ahead of the records it processes: a record's state is asked
/// for [`LOOK_AHEAD`] to 2 × [`LOOK_AHEAD`] - 1 records before it is
/// processed (those of a batch's first chunk, just before). In memory that is a prefetch of its lines, which waits for
/// nothing; far enough ahead that the lines have mostly arrived, near
/// enough that the requests in flight fit the processor's miss buffers
/// (three to five lines per record) and the lines are still in the
/// first-level cache when used. Chosen by measuring `bench w3` and
/// `w3-sum` at 2, 4, 6 and 8 ahead (the Performance chapter).
const LOOK_AHEAD: usize = 6;

/// A batch's taken records with their metadata, in chunks of
/// [`LOOK_AHEAD`]: [`LookAhead::next`] calls its `prefetch` with the keys
/// of the chunk after the current one before the current one's first
/// record (with those of the first two chunks the first time).
struct LookAhead<'a, 'b, K, T, I> {
    records: std::vec::Drain<'a, (K, T)>,
    /// The metadata of the records after the last one prefetched.
    ahead: I,
    metas: I,
    /// Records left in the current chunk.
    left: usize,
    /// Whether the first two chunks have been prefetched.
    primed: bool,
    _batch: std::marker::PhantomData<&'b ()>,
}

impl<'a, 'b, K, T, I: Iterator<Item = RecordRef<'b>>> LookAhead<'a, 'b, K, T, I> {
    /// `prefetch`: whether to ask for the keys ahead at all (see
    /// `ValueStore::prefetch_pays`); without, the records come out as
    /// they are.
    fn new(records: &'a mut Vec<(K, T)>, ahead: I, metas: I, prefetch: bool) -> Self {
        // Without prefetching, the current chunk never ends.
        let left = if prefetch { 0 } else { usize::MAX };
        Self { records: records.drain(..), ahead, metas, left, primed: false, _batch: std::marker::PhantomData }
    }

    #[inline]
    fn next(&mut self, prefetch: impl FnOnce(&mut dyn Iterator<Item = (u16, &K)>)) -> Option<(K, T, RecordRef<'b>)> {
        if self.left == 0 {
            let skip = if self.primed { LOOK_AHEAD } else { 0 };
            self.primed = true;
            let mut keys = self
                .records
                .as_slice()
                .iter()
                .skip(skip)
                .take(2 * LOOK_AHEAD - skip)
                .zip(self.ahead.by_ref())
                .map(|((k, _), r)| (r.group, k));
            prefetch(&mut keys);
            // Whatever `prefetch` left: `ahead` stays with the records.
            keys.for_each(drop);
            self.left = self.records.len().min(LOOK_AHEAD);
        }
        let (k, v) = self.records.next()?;
        let r = self.metas.next()?;
        self.left = self.left.saturating_sub(1);
        Some((k, v, r))
    }
}

/// The factory of `reduce` by `f` (state `value`).
pub(crate) fn reduce<K, T, F>(f: Arc<F>) -> Arc<dyn KeyedFactory>
where
    K: Key,
    T: Data,
    F: Fn(T, T) -> T + Send + Sync + 'static,
{
    keyed_factory(move |ctx, outs| {
        let info = ctx.info.clone();
        let next = typed::<T>(one(outs, &info.name)?, &info.name)?;
        let state = ValueStore::<K, T>::open(ctx.state, &ctx.state_scope("value"))?;
        Ok(Box::new(ReduceOp {
            info,
            state,
            f: f.clone(),
            out: Batch::with_capacity(ctx.batch_size),
            next,
            decoded: Vec::with_capacity(ctx.batch_size),
        }))
    })
}

/// The factory of a fold from `init()` by `f`, emitting `output(key,
/// accumulator)` after every record (state `accumulator`).
pub(crate) fn fold<K, T, A, O, I, F, R>(init: Arc<I>, f: Arc<F>, output: Arc<R>) -> Arc<dyn KeyedFactory>
where
    K: Key,
    T: Data,
    A: Data,
    O: Send + 'static,
    I: Fn() -> A + Send + Sync + 'static,
    F: Fn(&mut A, T) + Send + Sync + 'static,
    R: Fn(K, &A) -> O + Send + Sync + 'static,
{
    keyed_factory(move |ctx, outs| {
        let info = ctx.info.clone();
        let next = typed::<O>(one(outs, &info.name)?, &info.name)?;
        let state = ValueStore::<K, A>::open(ctx.state, &ctx.state_scope("accumulator"))?;
        Ok(Box::new(FoldOp {
            info,
            state,
            init: init.clone(),
            f: f.clone(),
            output: output.clone(),
            out: Batch::with_capacity(ctx.batch_size),
            next,
            records: Vec::with_capacity(ctx.batch_size),
        }))
    })
}

/// The factory of keyed `process` by `f` and `on_timer` under `policy`
/// (states `value` and `timers`): outputs are the results and the dead
/// letters.
pub(crate) fn process<K, T, S, U, R, F, G>(policy: Policy, f: Arc<F>, on_timer: Arc<G>) -> Arc<dyn KeyedFactory>
where
    K: Key,
    T: Data,
    S: Data,
    U: Clone + Send + 'static,
    R: ProcessOutcome,
    F: for<'c> Fn(&mut KeyedContext<'c, K, S, U>, &T) -> R + Send + Sync + 'static,
    G: for<'c> Fn(&mut KeyedContext<'c, K, S, U>, Timestamp) -> R + Send + Sync + 'static,
{
    keyed_factory(move |ctx, outs| {
        let info = ctx.info.clone();
        let (next, dead) = results_and_dead::<U, T>(outs, policy, &info.name)?;
        let state = ValueStore::<K, S>::open(ctx.state, &ctx.state_scope("value"))?;
        let timers = TimerState::<K>::open(ctx.state, &ctx.state_scope("timers"))?;
        Ok(Box::new(KeyedProcessOp {
            info,
            state,
            timers,
            f: f.clone(),
            on_timer: on_timer.clone(),
            out: Batch::with_capacity(ctx.batch_size),
            next,
            failures: Failures::new(policy, dead)?,
            watermark: crate::record::NO_TIMESTAMP,
            key_buf: Vec::new(),
            records: Vec::with_capacity(ctx.batch_size),
        }))
    })
}

/// The factory of the keyed pass-through in front of a keyed sink.
pub(crate) fn partition<K: Key, T: Data>() -> Arc<dyn KeyedFactory> {
    keyed_factory(move |ctx, outs| {
        let info = ctx.info.clone();
        let next = typed::<T>(one(outs, &info.name)?, &info.name)?;
        Ok(Box::new(PartitionOp::<K, T> {
            info,
            out: Batch::with_capacity(ctx.batch_size),
            next,
            records: Vec::with_capacity(ctx.batch_size),
        }))
    })
}

/// `reduce`: the running value per key.
pub(crate) struct ReduceOp<K, T, F> {
    pub(crate) info: OpInfo,
    pub(crate) state: ValueStore<K, T>,
    pub(crate) f: Arc<F>,
    pub(crate) out: Batch<T>,
    pub(crate) next: Box<dyn Consumer<T>>,
    /// The batch's records taken first, so the state lookups that follow
    /// run back to back and their cache misses overlap.
    pub(crate) decoded: Vec<(K, T)>,
}

impl<K, T, F> InputOperator for ReduceOp<K, T, F>
where
    K: Key,
    T: Data,
    F: Fn(T, T) -> T + Send + Sync + 'static,
{
    fn on_batch(&mut self, batch: &mut RecordBatch, time: &mut InputTime<'_>) -> Result<()> {
        OperatorCounters::add(&self.info.counters.records_in, batch.len());
        take_records(&self.info, batch, &mut self.decoded)?;
        let f = &*self.f;
        let mut records = LookAhead::new(&mut self.decoded, batch.iter(), batch.iter(), self.state.prefetch_pays());
        while let Some((key, v, r)) = records.next(|keys| self.state.prefetch(keys)) {
            // The result goes into the output batch from inside the update
            // (its metadata after it): returned through the update's
            // `Result`, it went through the stack in pieces and was read
            // back whole, which waited on every record (`perf`: a third of
            // the operator's samples on `bench w3-100keys`).
            let values = &mut self.out.values;
            self.state.update(r.group, key, r.key, |slot| {
                let new = match slot.take() {
                    Some(acc) => f(acc, v),
                    None => v,
                };
                values.push(new.clone());
                *slot = Some(new);
            })?;
            self.out.meta.push(stamped(time, r.meta));
        }
        emit(&self.info, &mut *self.next, &mut self.out)
    }
    forward_control!(keyed);

    fn snapshot(&mut self, at: SnapshotAt) -> Result<Vec<StateSnapshot>> {
        Ok(vec![snapshot_state(&mut self.state, &self.info.name, "value", StateType::of::<T>(), at)?])
    }

    fn state_stats(&self) -> Vec<(crate::state::StateName, crate::state::StateStats)> {
        vec![("value".into(), self.state.stats())]
    }

    fn restore(&mut self, from: &dyn RestoreSource, groups: &std::ops::Range<u16>) -> Result<()> {
        restore_state(&mut self.state, from, &self.info.name, "value", &StateType::of::<T>(), groups)
    }
}

/// `fold` and `aggregate`: an accumulator per key; after each record,
/// `output(key, &accumulator)` is emitted.
pub(crate) struct FoldOp<K, T, A, O, I, F, R> {
    pub(crate) info: OpInfo,
    pub(crate) state: ValueStore<K, A>,
    pub(crate) init: Arc<I>,
    pub(crate) f: Arc<F>,
    pub(crate) output: Arc<R>,
    pub(crate) out: Batch<O>,
    pub(crate) next: Box<dyn Consumer<O>>,
    /// The batch's records, taken (see [`take_records`]).
    pub(crate) records: Vec<(K, T)>,
}

impl<K, T, A, O, I, F, R> InputOperator for FoldOp<K, T, A, O, I, F, R>
where
    K: Key,
    T: Data,
    A: Data,
    O: Send + 'static,
    I: Fn() -> A + Send + Sync + 'static,
    F: Fn(&mut A, T) + Send + Sync + 'static,
    R: Fn(K, &A) -> O + Send + Sync + 'static,
{
    fn on_batch(&mut self, batch: &mut RecordBatch, time: &mut InputTime<'_>) -> Result<()> {
        OperatorCounters::add(&self.info.counters.records_in, batch.len());
        take_records(&self.info, batch, &mut self.records)?;
        let (init, f, output) = (&*self.init, &*self.f, &*self.output);
        let mut records = LookAhead::new(&mut self.records, batch.iter(), batch.iter(), self.state.prefetch_pays());
        while let Some((key, v, r)) = records.next(|keys| self.state.prefetch(keys)) {
            // Into the output batch from inside the update, as `reduce`.
            let values = &mut self.out.values;
            self.state.modify(r.group, key.clone(), r.key, init, |acc| {
                f(acc, v);
                values.push(output(key, acc));
            })?;
            self.out.meta.push(stamped(time, r.meta));
        }
        emit(&self.info, &mut *self.next, &mut self.out)
    }
    forward_control!(keyed);

    fn snapshot(&mut self, at: SnapshotAt) -> Result<Vec<StateSnapshot>> {
        Ok(vec![snapshot_state(&mut self.state, &self.info.name, "accumulator", StateType::of::<A>(), at)?])
    }

    fn state_stats(&self) -> Vec<(crate::state::StateName, crate::state::StateStats)> {
        vec![("accumulator".into(), self.state.stats())]
    }

    fn restore(&mut self, from: &dyn RestoreSource, groups: &std::ops::Range<u16>) -> Result<()> {
        restore_state(&mut self.state, from, &self.info.name, "accumulator", &StateType::of::<A>(), groups)
    }
}

/// What a keyed `process` function sees for one record (or one timer):
/// the key, its state, its timers, and where to emit results.
///
/// ```
/// let out = weibo::testing::run(vec![("a".to_string(), 5u32), ("a".to_string(), 7)], |s| {
///     s.key_by(|r: &(String, u32)| r.0.clone()).process(weibo::on_error::Fail, |ctx, r| {
///         // The running maximum per key, emitted when it grows.
///         let best = ctx.state().get_or_insert(0);
///         if r.1 > *best {
///             *best = r.1;
///             let line = format!("{} {}", ctx.key(), r.1);
///             ctx.emit(line);
///         }
///     })
/// })?;
/// assert_eq!(out, vec!["a 5".to_string(), "a 7".to_string()]);
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct KeyedContext<'a, K, S, U> {
    key: &'a K,
    group: u16,
    state: &'a mut Option<S>,
    timers: &'a mut TimerState<K>,
    timer_error: &'a mut Option<Error>,
    out: &'a mut Batch<U>,
    /// Stamped on what `emit` sends (its watermark is the one downstream
    /// judges the output under).
    meta: Meta,
    /// The operator's watermark as the function sees it: for a timer, the
    /// watermark that fired it.
    watermark: Timestamp,
}

impl<K, S, U> std::fmt::Debug for KeyedContext<'_, K, S, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedContext").field("meta", &self.meta).finish_non_exhaustive()
    }
}

impl<K: Key, S, U> KeyedContext<'_, K, S, U> {
    /// The record's key.
    ///
    /// ```
    /// let out = weibo::testing::run(vec![("a".to_string(), 5u32), ("a".to_string(), 7)], |s| {
    ///     s.key_by(|r: &(String, u32)| r.0.clone()).process(
    ///         weibo::on_error::Fail,
    ///         |ctx: &mut weibo::KeyedContext<'_, String, u32, String>, r: &(String, u32)| {
    ///             let key = ctx.key().clone();
    ///             ctx.emit(format!("{key}: {}", r.1));
    ///             Ok::<_, String>(())
    ///         },
    ///     )
    /// })?;
    /// assert_eq!(out[0], "a: 5");
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn key(&self) -> &K {
        self.key
    }

    /// The key's state: `None` until set; set it to `None` to clear it.
    ///
    /// ```
    /// let out = weibo::testing::run(vec![("a".to_string(), 5u32), ("a".to_string(), 7)], |s| {
    ///     s.key_by(|r: &(String, u32)| r.0.clone()).process(
    ///         weibo::on_error::Fail,
    ///         |ctx: &mut weibo::KeyedContext<'_, String, u32, String>, r: &(String, u32)| {
    ///             // A count per key, kept in keyed state.
    ///             let n = ctx.state().get_or_insert(0);
    ///             *n += 1;
    ///             let n = *n;
    ///             ctx.emit(format!("{} seen {n} times", r.0));
    ///             Ok::<_, String>(())
    ///         },
    ///     )
    /// })?;
    /// assert_eq!(out[1], "a seen 2 times");
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn state(&mut self) -> &mut Option<S> {
        self.state
    }

    /// Emits a result; it carries the input record's metadata (for a timer:
    /// the timer's time as timestamp).
    ///
    /// ```
    /// let out = weibo::testing::run(vec![("a".to_string(), 5u32), ("a".to_string(), 7)], |s| {
    ///     s.key_by(|r: &(String, u32)| r.0.clone()).process(
    ///         weibo::on_error::Fail,
    ///         |ctx: &mut weibo::KeyedContext<'_, String, u32, String>, r: &(String, u32)| {
    ///             // Any number of outputs per record.
    ///             for i in 0..r.1 % 3 {
    ///                 ctx.emit(format!("{i}"));
    ///             }
    ///             Ok::<_, String>(())
    ///         },
    ///     )
    /// })?;
    /// assert_eq!(out, vec!["0", "1", "0"]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn emit(&mut self, value: U) {
        self.out.push(value, self.meta);
    }

    /// The record's event time (for a timer: the timer's time), if it has one.
    ///
    /// ```
    /// let out = weibo::testing::run_timed(vec![(1_000, 'a')], |s| {
    ///     s.key_by(|c: &char| *c).process(weibo::on_error::Fail, |ctx: &mut weibo::KeyedContext<'_, char, (), i64>, _: &char| {
    ///         ctx.emit(ctx.timestamp().unwrap_or(-1));
    ///         Ok::<_, String>(())
    ///     })
    /// })?;
    /// assert_eq!(out, vec![1_000]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn timestamp(&self) -> Option<Timestamp> {
        (self.meta.timestamp != crate::record::NO_TIMESTAMP).then_some(self.meta.timestamp)
    }

    /// The operator's watermark: timers at or below it have fired (in a
    /// timer function: the watermark that fired the timer).
    ///
    /// ```
    /// let out = weibo::testing::run_timed(vec![(1_000, 'a'), (2_000, 'a')], |s| {
    ///     s.key_by(|c: &char| *c).process(weibo::on_error::Fail, |ctx: &mut weibo::KeyedContext<'_, char, (), i64>, _: &char| {
    ///         // Each record is judged under the watermark of the records before it.
    ///         ctx.emit(ctx.watermark());
    ///         Ok::<_, String>(())
    ///     })
    /// })?;
    /// assert_eq!(out[1], 999);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn watermark(&self) -> Timestamp {
        self.watermark
    }

    /// Calls the timer function for this key when the watermark reaches
    /// `time` (at once, at the next watermark, if it already has).
    /// Registering the same time twice sets one timer.
    ///
    /// ```
    /// let out = weibo::testing::run_timed(vec![(100, "a".to_string()), (150, "a".to_string())], |s| {
    ///     s.key_by(|k: &String| k.clone()).process_with_timers(
    ///         weibo::on_error::Fail,
    ///         |ctx: &mut weibo::KeyedContext<'_, String, u32, String>, _: &String| {
    ///             // Count the key's records; report 1 s after its first one.
    ///             if ctx.state().is_none() {
    ///                 ctx.register_timer(ctx.timestamp().unwrap_or(0) + 1_000);
    ///             }
    ///             *ctx.state().get_or_insert(0) += 1;
    ///             Ok::<_, String>(())
    ///         },
    ///         |ctx: &mut weibo::KeyedContext<'_, String, u32, String>, time| {
    ///             let n = ctx.state().take().unwrap_or(0);
    ///             let line = format!("{} at {time}: {n}", ctx.key());
    ///             ctx.emit(line);
    ///             Ok::<_, String>(())
    ///         },
    ///     )
    /// })?;
    /// assert_eq!(out, vec!["a at 1100: 2".to_string()]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn register_timer(&mut self, time: Timestamp) {
        if let Err(e) = self.timers.register(time, self.group, self.key) {
            self.timer_error.get_or_insert(e);
        }
    }

    /// Removes this key's timer at `time`, if any.
    ///
    /// ```
    /// let out = weibo::testing::run_timed(vec![(100, 'a'), (200, 'a')], |s| {
    ///     s.key_by(|c: &char| *c).process_with_timers(
    ///         weibo::on_error::Fail,
    ///         |ctx: &mut weibo::KeyedContext<'_, char, i64, String>, _: &char| {
    ///             // Only the latest record's timer stays.
    ///             if let Some(old) = ctx.state().take() {
    ///                 ctx.delete_timer(old);
    ///             }
    ///             let at = ctx.timestamp().unwrap_or(0) + 50;
    ///             ctx.register_timer(at);
    ///             *ctx.state() = Some(at);
    ///             Ok::<_, String>(())
    ///         },
    ///         |ctx: &mut weibo::KeyedContext<'_, char, i64, String>, time| {
    ///             ctx.emit(format!("fired at {time}"));
    ///             Ok::<_, String>(())
    ///         },
    ///     )
    /// })?;
    /// assert_eq!(out, vec!["fired at 250".to_string()]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn delete_timer(&mut self, time: Timestamp) {
        if let Err(e) = self.timers.delete(time, self.group, self.key) {
            self.timer_error.get_or_insert(e);
        }
    }
}

/// Keyed `process`: a user function with per-key state, event-time timers
/// and a failure policy. `G` runs when a timer fires.
pub(crate) struct KeyedProcessOp<K, T, S, U, F, G> {
    pub(crate) info: OpInfo,
    pub(crate) state: ValueStore<K, S>,
    pub(crate) timers: TimerState<K>,
    pub(crate) f: Arc<F>,
    pub(crate) on_timer: Arc<G>,
    pub(crate) out: Batch<U>,
    pub(crate) next: Box<dyn Consumer<U>>,
    pub(crate) failures: Failures<T>,
    /// The watermark up to which timers have fired.
    pub(crate) watermark: Timestamp,
    pub(crate) key_buf: Vec<u8>,
    /// The batch's records, taken (see [`take_records`]).
    pub(crate) records: Vec<(K, T)>,
}

impl<K, T, S, U, R, F, G> KeyedProcessOp<K, T, S, U, F, G>
where
    K: Key,
    T: Data,
    S: Data,
    U: Clone + Send + 'static,
    R: ProcessOutcome,
    F: for<'c> Fn(&mut KeyedContext<'c, K, S, U>, &T) -> R + Send + Sync + 'static,
    G: for<'c> Fn(&mut KeyedContext<'c, K, S, U>, Timestamp) -> R + Send + Sync + 'static,
{
    /// Fires every timer at or below `wm`, in time order.
    fn advance(&mut self, wm: Timestamp) -> Result<()> {
        while let Some((time, keys)) = self.timers.pop_due(wm)? {
            for (key, group) in keys {
                self.key_buf.clear();
                key.encode_key(&mut self.key_buf);
                let meta =
                    Meta { timestamp: time, watermark: self.watermark, offset: 0, partition: 0, source: u32::MAX };
                let (on_timer, out, timers) = (&*self.on_timer, &mut self.out, &mut self.timers);
                let mut timer_error = None;
                let k = key.clone();
                let result = self.state.update(group, key, &self.key_buf, |state| {
                    let mut ctx = KeyedContext {
                        key: &k,
                        group,
                        state,
                        timers,
                        timer_error: &mut timer_error,
                        out,
                        meta,
                        watermark: wm,
                    };
                    on_timer(&mut ctx, time).failure()
                })?;
                if let Some(e) = timer_error {
                    return Err(e);
                }
                if let Some(message) = result {
                    self.failures.fail_timer(&self.info, group, time, &message)?;
                }
            }
        }
        self.watermark = self.watermark.max(wm);
        Ok(())
    }
}

impl<K, T, S, U, R, F, G> InputOperator for KeyedProcessOp<K, T, S, U, F, G>
where
    K: Key,
    T: Data,
    S: Data,
    U: Clone + Send + 'static,
    R: ProcessOutcome,
    F: for<'c> Fn(&mut KeyedContext<'c, K, S, U>, &T) -> R + Send + Sync + 'static,
    G: for<'c> Fn(&mut KeyedContext<'c, K, S, U>, Timestamp) -> R + Send + Sync + 'static,
{
    fn on_batch(&mut self, batch: &mut RecordBatch, time: &mut InputTime<'_>) -> Result<()> {
        OperatorCounters::add(&self.info.counters.records_in, batch.len());
        let mut records = std::mem::take(&mut self.records);
        take_records(&self.info, batch, &mut records)?;
        let mut taken = LookAhead::new(&mut records, batch.iter(), batch.iter(), self.state.prefetch_pays());
        while let Some((key, v, r)) = taken.next(|keys| self.state.prefetch(keys)) {
            if let Some(wm) = time.observe(&r.meta) {
                self.advance(wm)?;
            }
            let (f, out, timers) = (&*self.f, &mut self.out, &mut self.timers);
            let meta = Meta { watermark: self.watermark, ..r.meta };
            let mut timer_error = None;
            let result = self.state.update(r.group, key.clone(), r.key, |state| {
                let mut ctx = KeyedContext {
                    key: &key,
                    group: r.group,
                    state,
                    timers,
                    timer_error: &mut timer_error,
                    out,
                    meta,
                    watermark: meta.watermark,
                };
                f(&mut ctx, &v).failure()
            })?;
            if let Some(e) = timer_error {
                return Err(e);
            }
            if let Some(message) = result {
                self.failures.fail(&self.info, v, r.meta, &message)?;
            }
        }
        drop(taken);
        // Its memory kept for the next batch.
        self.records = records;
        emit(&self.info, &mut *self.next, &mut self.out)?;
        self.failures.push()
    }

    fn on_watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.advance(wm)?;
        emit(&self.info, &mut *self.next, &mut self.out)?;
        self.next.watermark(wm)?;
        self.failures.watermark(wm)
    }

    fn flush(&mut self) -> Result<()> {
        self.next.flush()?;
        self.failures.flush()
    }

    fn finish(&mut self) -> Result<()> {
        self.next.finish()?;
        self.failures.finish()
    }

    fn barrier(&mut self, n: CheckpointId) -> Result<()> {
        self.next.barrier(n)?;
        self.failures.barrier(n)
    }

    fn state_stats(&self) -> Vec<(crate::state::StateName, crate::state::StateStats)> {
        vec![("value".into(), self.state.stats()), ("timers".into(), self.timers.stats())]
    }

    fn snapshot(&mut self, at: SnapshotAt) -> Result<Vec<StateSnapshot>> {
        let name = &self.info.name;
        Ok(vec![
            snapshot_state(&mut self.state, name, "value", StateType::of::<S>(), at)?,
            snapshot_state(&mut self.timers, name, "timers", StateType::internal(TIMERS), at)?,
        ])
    }

    fn restore(&mut self, from: &dyn RestoreSource, groups: &std::ops::Range<u16>) -> Result<()> {
        let name = &self.info.name;
        restore_state(&mut self.state, from, name, "value", &StateType::of::<S>(), groups)?;
        restore_state(&mut self.timers, from, name, "timers", &StateType::internal(TIMERS), groups)
    }
}

/// Passes records on, partitioned by key (a keyed sink).
pub(crate) struct PartitionOp<K, T> {
    pub(crate) info: OpInfo,
    pub(crate) out: Batch<T>,
    pub(crate) next: Box<dyn Consumer<T>>,
    /// The batch's records, taken (see [`take_records`]).
    pub(crate) records: Vec<(K, T)>,
}

impl<K: Key, T: Data> InputOperator for PartitionOp<K, T> {
    fn on_batch(&mut self, batch: &mut RecordBatch, time: &mut InputTime<'_>) -> Result<()> {
        OperatorCounters::add(&self.info.counters.records_in, batch.len());
        take_records(&self.info, batch, &mut self.records)?;
        for ((_, v), r) in self.records.drain(..).zip(batch.iter()) {
            self.out.push(v, stamped(time, r.meta));
        }
        emit(&self.info, &mut *self.next, &mut self.out)
    }
    forward_control!(keyed);
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;

    /// Batch lengths around the chunk size: every record comes out once,
    /// in order, with its own metadata; its key is prefetched once, before
    /// it comes out, and (past the first chunk) `LOOK_AHEAD` to
    /// `2 * LOOK_AHEAD - 1` records ahead, as the constant's comment says.
    /// A `prefetch` that takes only some keys (a state with nothing to
    /// prefetch takes none) leaves the keys and records of the next chunks
    /// paired.
    #[test]
    fn look_ahead_prefetches_every_key_once_and_ahead_for_any_batch_length() {
        for len in 0..(4 * LOOK_AHEAD + 3) {
            look_ahead(len, true);
            look_ahead(len, false);
        }
    }

    /// Without prefetching (a state small enough to stay in the caches),
    /// every record comes out once, in order, and no key is asked for.
    #[test]
    fn look_ahead_without_prefetching_asks_for_nothing() {
        for len in [0, 1, LOOK_AHEAD, 3 * LOOK_AHEAD + 1, 1_000] {
            let mut batch = RecordBatch::with_capacity(len, 0);
            let mut records = Vec::new();
            for i in 0..len {
                let meta = Meta { timestamp: 0, watermark: 0, offset: i as u64, partition: 0, source: 0 };
                batch.commit_typed(0, meta);
                records.push((i as u64, i * 10));
            }
            let mut taken = LookAhead::new(&mut records, batch.iter(), batch.iter(), false);
            let mut out = 0usize;
            while let Some((key, value, r)) = taken.next(|keys| panic!("len {len}: asked for {} keys", keys.count())) {
                assert_eq!((key, value, r.meta.offset), (out as u64, out * 10, out as u64), "len {len}");
                out += 1;
            }
            assert_eq!(out, len, "len {len}: every record came out");
        }
    }

    /// One batch of `len` records; `every_key`: whether `prefetch` takes
    /// all the keys it is given, or only the first.
    fn look_ahead(len: usize, every_key: bool) {
        let mut batch = RecordBatch::with_capacity(len, 0);
        let mut records = Vec::new();
        for i in 0..len {
            let meta = Meta { timestamp: 0, watermark: 0, offset: i as u64, partition: 0, source: 0 };
            // The key group tells the records apart on the prefetch side.
            batch.commit_typed(i as u16, meta);
            records.push((i as u64, i * 10));
        }
        let mut taken = LookAhead::new(&mut records, batch.iter(), batch.iter(), true);
        // When each key was prefetched: how many records had come out.
        let mut asked: Vec<Option<usize>> = vec![None; len];
        let mut out = 0usize;
        while let Some((key, value, r)) = taken.next(|keys| {
            for (group, k) in keys.take(if every_key { usize::MAX } else { 1 }) {
                assert_eq!(u64::from(group), *k, "len {len}: a key goes with its own record's group");
                assert!(asked[*k as usize].is_none(), "len {len}: key {k} prefetched twice");
                asked[*k as usize] = Some(out);
            }
        }) {
            assert_eq!((key, value, r.meta.offset), (out as u64, out * 10, out as u64), "len {len}");
            if !every_key {
                out += 1;
                continue;
            }
            let at = asked[out].unwrap_or_else(|| panic!("len {len}: record {out} came out unprefetched"));
            if out >= LOOK_AHEAD {
                let ahead = out - at;
                assert!(
                    (LOOK_AHEAD..2 * LOOK_AHEAD).contains(&ahead),
                    "len {len}: record {out} prefetched {ahead} ahead"
                );
            }
            out += 1;
        }
        assert_eq!(out, len, "len {len}: every record came out");
    }
}
