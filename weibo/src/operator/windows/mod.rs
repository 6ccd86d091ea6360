//! Event-time windows on keyed streams.
//!
//! ```text
//! keyed.window(Tumbling::of(1 s))            [0,1000) [1000,2000) ...
//! keyed.window(Sliding::of(10 s, 5 s))       [-5000,5000) [0,10000) [5000,15000) ...
//! keyed.window(Session::with_gap(30 s))      a key's records closer than 30 s share a window
//! ```
//!
//! Semantics follow Apache Flink's DataStream API:
//! - windows are `[start, end)`; a window's `max_timestamp` is `end - 1`;
//! - tumbling: `start = ts - (ts - offset) mod size`; sliding: every
//!   `start = k * slide + offset` with `start <= ts < start + size`;
//! - a window fires when the watermark reaches `end - 1`, emitting its
//!   result with timestamp `end - 1`;
//! - with allowed lateness `L`, a window is kept until the watermark
//!   reaches `end - 1 + L`; a record for a window that already fired
//!   (but is still kept) is added and fires the window again at once with
//!   the full updated result — an *update* of the earlier result, not a
//!   delta;
//! - a record added to none of its windows with `ts + L <= watermark` is
//!   *late*: it goes to [`WindowedOutput::late_records`] when that output is
//!   used, and is otherwise dropped and counted (`late` in the operator's
//!   metrics);
//! - sessions: a record opens `[ts, ts + gap)`; a key's windows merge when
//!   they touch or overlap (`a.start <= b.end && a.end >= b.start`, so
//!   records exactly `gap` apart share a session); lateness is judged on
//!   the merged window, and a merged window is a new window (earlier
//!   firings of its parts are not retracted);
//! - end of input is watermark `+∞`: every open window fires.
//!
//! Window contents and timers live in the job's state backend, per key
//! group. What fired is part of that state, so a job restored from a
//! checkpoint neither fires a window again that had fired (and is kept
//! for its lateness) nor loses a firing a late record owes: the watermark
//! starts again after a restore (as in Flink), and a window that fired
//! before the checkpoint fires again only when records are added to it
//! after the restore — at once if the new watermark has passed its end,
//! or when it does. (Tumbling and sliding windows record, per key group,
//! the watermark up to which their windows had fired and the windows that
//! owe a firing since; sessions keep their fire timers.)

use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::codec::key::Key;
use crate::codec::{CodecError, CodecId, Data};
use crate::error::{Error, Result};
use crate::metrics::OperatorCounters;
use crate::operator::Aggregate;
use crate::operator::Consumer;
use crate::operator::OpInfo;
use crate::operator::factory::{KeyedFactory, OperatorContext};
use crate::operator::keyed::TIMERS;
use crate::operator::keyed::{decode_key, decode_value};
use crate::operator::{AnyConsumer, typed};
use crate::operator::{InputOperator, SnapshotAt, emit};
use crate::record::{Batch, Meta, RecordBatch, Timestamp};
use crate::state::{RestoreSource, StateScope, StateSnapshot, TimerState, ValueState, WindowState};
use crate::time::millis;
use crate::time::watermarks::InputTime;

/// A window: the event times `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Window {
    /// First timestamp in the window.
    pub start: Timestamp,
    /// First timestamp after the window.
    pub end: Timestamp,
}

impl Window {
    /// The last timestamp in the window (`end - 1`): the window fires when
    /// the watermark reaches it, and its result carries it as timestamp.
    pub fn max_timestamp(&self) -> Timestamp {
        self.end.saturating_sub(1)
    }

    /// Whether the two windows overlap or touch (sessions merge then).
    pub fn intersects(&self, other: &Window) -> bool {
        self.start <= other.end && self.end >= other.start
    }

    fn cover(&self, other: &Window) -> Window {
        Window { start: self.start.min(other.start), end: self.end.max(other.end) }
    }
}

/// The result of a window function: the key, the window, the value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WindowResult<K, V> {
    /// The key.
    pub key: K,
    /// The window.
    pub window: Window,
    /// The result.
    pub value: V,
}

/// How windows are assigned (internal: what the assigners turn into).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spec {
    /// Fixed-size windows every `slide` (tumbling: `slide == size`).
    Aligned {
        /// Window length in ms.
        size: i64,
        /// Distance between window starts in ms.
        slide: i64,
        /// Shift of window starts in ms, in `0..slide`.
        offset: i64,
    },
    /// Merging windows, `gap` of inactivity apart.
    Session {
        /// The gap in ms.
        gap: i64,
    },
}

impl Spec {
    pub(crate) fn validate(&self) -> std::result::Result<(), String> {
        match *self {
            Spec::Aligned { size, slide, .. } if size <= 0 || slide <= 0 => {
                Err(format!("window size ({size} ms) and slide ({slide} ms) must be at least 1 ms"))
            }
            Spec::Session { gap } if gap <= 0 => Err(format!("a session gap ({gap} ms) must be at least 1 ms")),
            _ => Ok(()),
        }
    }

    pub(crate) fn describe(&self) -> String {
        match *self {
            Spec::Aligned { size, slide, offset } if size == slide => {
                format!("tumbling {size} ms{}", if offset != 0 { format!(" + {offset} ms") } else { String::new() })
            }
            Spec::Aligned { size, slide, offset } => format!(
                "sliding {size} ms every {slide} ms{}",
                if offset != 0 { format!(" + {offset} ms") } else { String::new() }
            ),
            Spec::Session { gap } => format!("session gap {gap} ms"),
        }
    }
}

/// The fixed-size windows of the latest timestamp, reused while records'
/// timestamps stay in exactly the same windows.
#[derive(Debug, Default)]
pub(crate) struct AlignedCache {
    windows: Vec<Window>,
    /// The timestamps that lie in exactly `windows`.
    range: Option<(Timestamp, Timestamp)>,
}

impl AlignedCache {
    /// The windows of `ts`, latest first.
    #[inline]
    pub(crate) fn assign(&mut self, ts: Timestamp, size: i64, slide: i64, offset: i64) -> &[Window] {
        if !self.range.is_some_and(|(lo, hi)| ts >= lo && ts < hi) {
            aligned_windows(ts, size, slide, offset, &mut self.windows);
            // From the end of the next older window (or the latest start)
            // up to the first end or the next start, whichever comes first.
            self.range = match (self.windows.iter().map(|w| w.start).min(), self.windows.first()) {
                (Some(earliest), Some(latest)) => {
                    let lo = latest.start.max(earliest.saturating_sub(slide).saturating_add(size));
                    let hi =
                        self.windows.iter().map(|w| w.end).min().unwrap_or(lo).min(latest.start.saturating_add(slide));
                    (lo <= ts && ts < hi).then_some((lo, hi))
                }
                _ => None,
            };
        }
        &self.windows
    }
}

/// Fills `out` with the aligned windows that contain `ts`, latest first.
pub(crate) fn aligned_windows(ts: Timestamp, size: i64, slide: i64, offset: i64, out: &mut Vec<Window>) {
    out.clear();
    let Some(from_offset) = ts.checked_sub(offset) else { return };
    let Some(mut start) = ts.checked_sub(from_offset.rem_euclid(slide)) else { return };
    loop {
        match start.checked_add(size) {
            Some(end) if end > ts => out.push(Window { start, end }),
            Some(_) => break,
            None => {}
        }
        match start.checked_sub(slide) {
            Some(s) => start = s,
            None => break,
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Tumbling {}
    impl Sealed for super::Sliding {}
    impl Sealed for super::Session {}
}

/// Something that assigns records to windows: [`Tumbling`], [`Sliding`] or
/// [`Session`].
pub trait WindowAssigner: sealed::Sealed {
    #[doc(hidden)]
    fn spec(&self) -> Spec;
}

/// Fixed-size, non-overlapping windows.
#[derive(Clone, Copy, Debug)]
pub struct Tumbling {
    size: Duration,
    offset: Duration,
}

impl Tumbling {
    /// Windows of `size`, starting at multiples of `size` since the epoch.
    pub fn of(size: Duration) -> Self {
        Self { size, offset: Duration::ZERO }
    }

    /// Shifts window starts by `offset` (for example, daily windows that
    /// start at 06:00).
    #[must_use]
    pub fn with_offset(mut self, offset: Duration) -> Self {
        self.offset = offset;
        self
    }
}

impl WindowAssigner for Tumbling {
    fn spec(&self) -> Spec {
        let size = millis(self.size);
        Spec::Aligned { size, slide: size, offset: if size > 0 { millis(self.offset).rem_euclid(size) } else { 0 } }
    }
}

/// Fixed-size windows that start every `slide`: a record is in
/// `size / slide` of them.
#[derive(Clone, Copy, Debug)]
pub struct Sliding {
    size: Duration,
    slide: Duration,
    offset: Duration,
}

impl Sliding {
    /// Windows of `size` starting every `slide`.
    pub fn of(size: Duration, slide: Duration) -> Self {
        Self { size, slide, offset: Duration::ZERO }
    }

    /// Shifts window starts by `offset`.
    #[must_use]
    pub fn with_offset(mut self, offset: Duration) -> Self {
        self.offset = offset;
        self
    }
}

impl WindowAssigner for Sliding {
    fn spec(&self) -> Spec {
        let slide = millis(self.slide);
        Spec::Aligned {
            size: millis(self.size),
            slide,
            offset: if slide > 0 { millis(self.offset).rem_euclid(slide) } else { 0 },
        }
    }
}

/// Per-key windows that close after a gap of inactivity, merging as
/// records bridge them.
#[derive(Clone, Copy, Debug)]
pub struct Session {
    gap: Duration,
}

impl Session {
    /// Sessions that end `gap` after their last record.
    pub fn with_gap(gap: Duration) -> Self {
        Self { gap }
    }
}

impl WindowAssigner for Session {
    fn spec(&self) -> Spec {
        Spec::Session { gap: millis(self.gap) }
    }
}

/// Counts records: an [`Aggregate`] for any record type.
#[derive(Clone, Copy, Debug, Default)]
pub struct Count;

impl<T> Aggregate<T> for Count {
    type Acc = u64;
    type Out = u64;
    fn create(&self) -> u64 {
        0
    }
    fn add(&self, acc: &mut u64, _value: T) {
        *acc += 1;
    }
    fn merge(&self, acc: &mut u64, other: u64) {
        *acc += other;
    }
    fn result(&self, acc: &u64) -> u64 {
        *acc
    }
}

/// What a window `process` function sees besides the elements.
#[derive(Debug)]
pub struct WindowContext<'a, K> {
    /// The key.
    pub key: &'a K,
    /// The window that fired.
    pub window: Window,
}

/// A window's contents, for window functions (`process`) that need every
/// element. Encoded as a count followed by each element's length and
/// encoding, with the element type's own codec.
#[derive(Clone, Debug, PartialEq)]
pub struct Elements<T>(pub Vec<T>);

fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(input: &mut &[u8], codec: CodecId) -> std::result::Result<u64, CodecError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let Some((&b, rest)) = input.split_first() else {
            return Err(CodecError { codec, reason: "input ends inside a length".into() });
        };
        *input = rest;
        v |= u64::from(b & 0x7F) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(CodecError { codec, reason: "a length is longer than 64 bits".into() })
}

fn get_bytes<'a>(input: &mut &'a [u8], codec: CodecId) -> std::result::Result<&'a [u8], CodecError> {
    let n = usize::try_from(get_varint(input, codec)?).unwrap_or(usize::MAX);
    if input.len() < n {
        return Err(CodecError { codec, reason: format!("an element needs {n} bytes, {} left", input.len()) });
    }
    let (head, tail) = input.split_at(n);
    *input = tail;
    Ok(head)
}

fn put_element<T: Data>(v: &T, out: &mut Vec<u8>, scratch: &mut Vec<u8>) -> std::result::Result<(), CodecError> {
    scratch.clear();
    v.encode(scratch)?;
    put_varint(scratch.len() as u64, out);
    out.extend_from_slice(scratch);
    Ok(())
}

impl<T: Data> Data for Elements<T> {
    fn codec_id() -> CodecId {
        CodecId::new("weibo-elements/1", std::any::type_name::<Self>())
    }

    fn encode(&self, out: &mut Vec<u8>) -> std::result::Result<(), CodecError> {
        put_varint(self.0.len() as u64, out);
        let mut scratch = Vec::new();
        self.0.iter().try_for_each(|v| put_element(v, out, &mut scratch))
    }

    fn decode(mut bytes: &[u8]) -> std::result::Result<Self, CodecError> {
        let codec = Self::codec_id();
        let n = get_varint(&mut bytes, codec)?;
        let mut values = Vec::with_capacity(usize::try_from(n.min(1 << 16)).unwrap_or(0));
        for _ in 0..n {
            values.push(T::decode(get_bytes(&mut bytes, codec)?)?);
        }
        if !bytes.is_empty() {
            return Err(CodecError { codec, reason: format!("{} trailing bytes", bytes.len()) });
        }
        Ok(Elements(values))
    }
}

/// One key's open sessions, sorted by start, pairwise apart.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sessions<A>(pub(crate) Vec<(Window, A)>);

impl<A: Data> Data for Sessions<A> {
    fn codec_id() -> CodecId {
        CodecId::new("weibo-sessions/1", std::any::type_name::<Self>())
    }

    fn encode(&self, out: &mut Vec<u8>) -> std::result::Result<(), CodecError> {
        put_varint(self.0.len() as u64, out);
        let mut scratch = Vec::new();
        for (w, acc) in &self.0 {
            out.extend_from_slice(&w.start.to_be_bytes());
            out.extend_from_slice(&w.end.to_be_bytes());
            put_element(acc, out, &mut scratch)?;
        }
        Ok(())
    }

    fn decode(mut bytes: &[u8]) -> std::result::Result<Self, CodecError> {
        let codec = Self::codec_id();
        let n = get_varint(&mut bytes, codec)?;
        let mut sessions = Vec::new();
        for _ in 0..n {
            let mut time = || -> std::result::Result<i64, CodecError> {
                let (head, tail) = bytes
                    .split_first_chunk::<8>()
                    .ok_or_else(|| CodecError { codec, reason: "input ends inside a window".into() })?;
                bytes = tail;
                Ok(i64::from_be_bytes(*head))
            };
            let (start, end) = (time()?, time()?);
            sessions.push((Window { start, end }, A::decode(get_bytes(&mut bytes, codec)?)?));
        }
        if !bytes.is_empty() {
            return Err(CodecError { codec, reason: format!("{} trailing bytes", bytes.len()) });
        }
        Ok(Sessions(sessions))
    }
}

/// A window function: how records fold into a window and what it emits.
pub(crate) trait WindowFn<K, T>: Send + Sync + 'static {
    type Acc: Data;
    type Out: Clone + Send + 'static;
    fn add(&self, acc: &mut Option<Self::Acc>, value: T);
    fn merge(&self, into: &mut Self::Acc, other: Self::Acc);
    fn fire(&self, key: &K, window: Window, acc: &Self::Acc, out: &mut Vec<Self::Out>);
}

pub(crate) struct ReduceFn<F>(pub(crate) F);

impl<K: Key, T: Data, F: Fn(T, T) -> T + Send + Sync + 'static> WindowFn<K, T> for ReduceFn<F> {
    type Acc = T;
    type Out = WindowResult<K, T>;
    #[inline]
    fn add(&self, acc: &mut Option<T>, value: T) {
        *acc = Some(match acc.take() {
            Some(a) => (self.0)(a, value),
            None => value,
        });
    }
    fn merge(&self, into: &mut T, other: T) {
        let a = into.clone();
        *into = (self.0)(a, other);
    }
    #[inline]
    fn fire(&self, key: &K, window: Window, acc: &T, out: &mut Vec<Self::Out>) {
        out.push(WindowResult { key: key.clone(), window, value: acc.clone() });
    }
}

pub(crate) struct AggregateFn<G>(pub(crate) G);

impl<K: Key, T, G: Aggregate<T>> WindowFn<K, T> for AggregateFn<G> {
    type Acc = G::Acc;
    type Out = WindowResult<K, G::Out>;
    #[inline]
    fn add(&self, acc: &mut Option<G::Acc>, value: T) {
        let a = acc.get_or_insert_with(|| self.0.create());
        self.0.add(a, value);
    }
    fn merge(&self, into: &mut G::Acc, other: G::Acc) {
        self.0.merge(into, other);
    }
    #[inline]
    fn fire(&self, key: &K, window: Window, acc: &G::Acc, out: &mut Vec<Self::Out>) {
        out.push(WindowResult { key: key.clone(), window, value: self.0.result(acc) });
    }
}

pub(crate) struct ProcessFn<F, U>(pub(crate) F, pub(crate) PhantomData<fn() -> U>);

impl<K, T, U, F> WindowFn<K, T> for ProcessFn<F, U>
where
    K: Key,
    T: Data,
    U: Clone + Send + 'static,
    F: Fn(&WindowContext<'_, K>, &[T], &mut Vec<U>) + Send + Sync + 'static,
{
    type Acc = Elements<T>;
    type Out = U;
    fn add(&self, acc: &mut Option<Elements<T>>, value: T) {
        acc.get_or_insert_with(|| Elements(Vec::new())).0.push(value);
    }
    fn merge(&self, into: &mut Elements<T>, other: Elements<T>) {
        into.0.extend(other.0);
    }
    fn fire(&self, key: &K, window: Window, acc: &Elements<T>, out: &mut Vec<U>) {
        (self.0)(&WindowContext { key, window }, &acc.0, out);
    }
}

/// Makes the instances of a window operator: aligned windows (tumbling,
/// sliding) or sessions, by its spec, applying `func`.
pub(crate) struct WindowFactory<K, T, W> {
    pub(crate) func: Arc<W>,
    pub(crate) spec: Spec,
    /// Allowed lateness, in milliseconds (0: none).
    pub(crate) lateness: i64,
    /// Whether late records go to the operator's second port (set when
    /// the user asks for them, before the job is built).
    pub(crate) late_enabled: Arc<AtomicBool>,
    pub(crate) _t: PhantomData<fn(K, T)>,
}

impl<K: Key, T: Data, W: WindowFn<K, T>> KeyedFactory for WindowFactory<K, T, W> {
    fn instantiate(&self, ctx: &OperatorContext<'_>, mut outs: Vec<AnyConsumer>) -> Result<Box<dyn InputOperator>> {
        let info = ctx.info.clone();
        let groups = ctx.key_groups.clone();
        let late_out = outs.pop().ok_or_else(|| Error::Internal("window without late port".into()))?;
        let out = outs.pop().ok_or_else(|| Error::Internal("window without result port".into()))?;
        let next = typed::<W::Out>(out, &info.name)?;
        let late_next = typed::<T>(late_out, &info.name)?;
        let operator = info.name.to_string();
        let scope = |state: &str| StateScope {
            job: ctx.job.to_string(),
            operator: operator.clone(),
            state: state.to_string(),
            key_groups: groups.clone(),
            max_key_groups: ctx.max_key_groups,
        };
        let common = Common {
            func: self.func.clone(),
            lateness: self.lateness,
            fire: TimerState::open(ctx.state, &scope("fire-timers"))?,
            cleanup: TimerState::open(ctx.state, &scope("cleanup-timers"))?,
            watermark: crate::record::NO_TIMESTAMP,
            out: Batch::with_capacity(ctx.batch_size),
            fired: Vec::new(),
            late: Batch::with_capacity(16),
            late_enabled: self.late_enabled.load(Ordering::Relaxed),
            next,
            late_next,
            key_buf: Vec::with_capacity(32),
            info,
        };
        Ok(match self.spec {
            Spec::Aligned { size, slide, offset } => Box::new(AlignedWindowOp {
                state: WindowState::open(ctx.state, &scope("windows"))?,
                size,
                slide,
                offset,
                windows: AlignedCache::default(),
                // Without lateness a window is dropped when it fires:
                // nothing that fired is kept to fire again.
                fired: if self.lateness > 0 {
                    Some(Fired::new(ValueState::open(ctx.state, &scope("fired"))?, groups.clone()))
                } else {
                    None
                },
                common,
            }) as Box<dyn InputOperator>,
            Spec::Session { gap } => {
                Box::new(SessionWindowOp { state: ValueState::open(ctx.state, &scope("sessions"))?, gap, common })
            }
        })
    }
}

/// What both window operators share: the function, timers, outputs.
struct Common<K, T, W: WindowFn<K, T>> {
    info: OpInfo,
    func: Arc<W>,
    lateness: i64,
    fire: TimerState<K>,
    cleanup: TimerState<K>,
    /// The watermark up to which timers have fired.
    watermark: Timestamp,
    out: Batch<W::Out>,
    fired: Vec<W::Out>,
    late: Batch<T>,
    late_enabled: bool,
    next: Box<dyn Consumer<W::Out>>,
    late_next: Box<dyn Consumer<T>>,
    key_buf: Vec<u8>,
}

impl<K: Key, T: Data, W: WindowFn<K, T>> Common<K, T, W> {
    /// Moves what `fire` produced to the output batch, with the window's
    /// timestamp and this operator's watermark.
    fn collect(&mut self, window: Window) {
        let meta = Meta {
            timestamp: window.max_timestamp(),
            watermark: self.watermark,
            offset: 0,
            partition: 0,
            source: u32::MAX,
        };
        for v in self.fired.drain(..) {
            self.out.push(v, meta);
        }
    }

    /// A record no window took.
    fn late(&mut self, value: T, meta: Meta) {
        OperatorCounters::add(&self.info.counters.late, 1);
        if self.late_enabled {
            self.late.push(value, meta);
        }
    }

    fn record_meta(&self, meta: Meta) -> Meta {
        Meta { watermark: self.watermark, ..meta }
    }

    fn emit(&mut self) -> Result<()> {
        emit(&self.info, &mut *self.next, &mut self.out)?;
        if !self.late.is_empty() {
            self.late_next.push(&mut self.late)?;
        }
        Ok(())
    }

    /// A record's event time, key and value; a record without an event
    /// time is an error naming its position.
    fn decode(&self, r: &crate::record::RecordRef<'_>) -> Result<(Timestamp, K, T)> {
        if r.meta.timestamp == crate::record::NO_TIMESTAMP {
            return Err(self.no_time(&r.meta));
        }
        Ok((r.meta.timestamp, decode_key(&self.info, r)?, decode_value(&self.info, r)?))
    }

    fn no_time(&self, meta: &Meta) -> Error {
        Error::Input {
            position: self.info.sources.position(meta),
            message: format!(
                "window `{}` got a record without an event time: call `with_timestamps(...)` before `key_by`",
                self.info.name
            ),
        }
    }

    /// Which timer is due next: `Some(true)` a firing, `Some(false)` a clean-up.
    fn next_due(&self, watermark: Timestamp) -> Option<bool> {
        let fire = self.fire.next_time().filter(|t| *t <= watermark);
        let cleanup = self.cleanup.next_time().filter(|t| *t <= watermark);
        match (fire, cleanup) {
            (None, None) => None,
            (Some(f), Some(c)) => Some(f <= c),
            (Some(_), None) => Some(true),
            (None, Some(_)) => Some(false),
        }
    }
}

macro_rules! window_control {
    () => {
        fn on_watermark(&mut self, wm: Timestamp) -> Result<()> {
            self.advance(wm)?;
            self.common.emit()?;
            self.common.next.watermark(wm)?;
            self.common.late_next.watermark(wm)
        }
        fn flush(&mut self) -> Result<()> {
            self.common.next.flush()?;
            self.common.late_next.flush()
        }
        fn barrier(&mut self, n: u64) -> Result<()> {
            self.common.emit()?;
            self.common.next.barrier(n)?;
            self.common.late_next.barrier(n)
        }
        fn finish(&mut self) -> Result<()> {
            self.common.emit()?;
            self.common.next.finish()?;
            self.common.late_next.finish()
        }
    };
}

/// Tumbling and sliding windows: one accumulator per (window, key), kept
/// window-major; a window fires (and is cleaned up) when the watermark
/// passes its end, so the window index doubles as the timer index.
struct AlignedWindowOp<K, T, W: WindowFn<K, T>> {
    state: WindowState<K, W::Acc>,
    size: i64,
    slide: i64,
    offset: i64,
    windows: AlignedCache,
    /// What had fired when the state was restored (with lateness only).
    fired: Option<Fired<K>>,
    common: Common<K, T, W>,
}

/// What fired, per key group, as a checkpoint records it: every window
/// whose end is at or below `horizon` had fired (with every record it
/// held), except the `owed` ones, which got records after a restore and
/// wait for the watermark to fire them again.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct FiredUpTo {
    horizon: Timestamp,
    /// (window start, encoded key).
    owed: Vec<(Timestamp, Vec<u8>)>,
}

/// The firing record of a tumbling or sliding window operator with
/// allowed lateness. A window fires when the watermark passes its end;
/// the watermark starts again after a restore, so without this record
/// every window kept for its lateness at the checkpoint would fire again
/// with the same contents.
struct Fired<K> {
    /// Per key group, the restored horizon (see [`FiredUpTo`]); none once
    /// the watermark has passed it.
    horizon: HashMap<u16, Timestamp>,
    /// The highest restored horizon: windows ending above it fire as usual.
    max: Timestamp,
    /// Windows at or below their group's horizon that got records since
    /// the restore: they fire when the watermark passes their end.
    owed: HashMap<u16, HashSet<(Timestamp, K)>>,
    state: ValueState<u16, FiredUpTo>,
    groups: std::ops::Range<u16>,
    /// What `state` holds, per key group: compared at the barrier without
    /// reading the state (on fjall, a read may go to disk).
    written: HashMap<u16, FiredUpTo>,
    key_buf: Vec<u8>,
}

impl<K: Key> Fired<K> {
    fn new(state: ValueState<u16, FiredUpTo>, groups: std::ops::Range<u16>) -> Self {
        Self {
            horizon: HashMap::new(),
            max: crate::record::NO_TIMESTAMP,
            owed: HashMap::new(),
            state,
            groups,
            written: HashMap::new(),
            key_buf: Vec::with_capacity(2),
        }
    }

    /// Whether the window starting at `start` (ending at `max`) of `key`
    /// in `group` fires now that the watermark passed `max`: unless it had
    /// fired before the restore and got nothing since.
    fn fires(&mut self, group: u16, start: Timestamp, key: &K, max: Timestamp) -> bool {
        match self.horizon.get(&group) {
            Some(h) if max <= *h => self.owed.get_mut(&group).is_some_and(|owed| owed.remove(&(start, key.clone()))),
            _ => true,
        }
    }

    /// A record went into the window starting at `start` (ending at
    /// `max`, which the watermark has not reached) of `key` in `group`.
    fn added(&mut self, group: u16, start: Timestamp, key: &K, max: Timestamp) {
        if self.horizon.get(&group).is_some_and(|h| max <= *h) {
            self.owed.entry(group).or_default().insert((start, key.clone()));
        }
    }

    /// The operator's watermark reached `wm`: a horizon it passed is of
    /// no more use (every window below it that owed a firing has fired).
    fn passed(&mut self, wm: Timestamp) {
        if wm >= self.max && !self.horizon.is_empty() {
            self.horizon.clear();
            self.owed.clear();
            self.max = crate::record::NO_TIMESTAMP;
        }
    }

    /// Records, for the checkpoint, what had fired up to the operator's
    /// watermark `wm`, per key group.
    fn record(&mut self, wm: Timestamp) -> Result<()> {
        for g in self.groups.clone() {
            let horizon = self.horizon.get(&g).copied().unwrap_or(crate::record::NO_TIMESTAMP).max(wm);
            let owed: Vec<(Timestamp, Vec<u8>)> = self
                .owed
                .get(&g)
                .into_iter()
                .flatten()
                .map(|(start, k)| (*start, crate::codec::key::encode(k)))
                .collect();
            let record = FiredUpTo { horizon, owed };
            self.key_buf.clear();
            g.encode_key(&mut self.key_buf);
            let nothing = record == FiredUpTo { horizon: crate::record::NO_TIMESTAMP, owed: Vec::new() };
            // Unchanged records are not written again (nor exported); what
            // is in the state is known without reading it at the barrier.
            let changed = match self.written.get(&g) {
                Some(old) => *old != record || nothing,
                None => !nothing,
            };
            if changed {
                let value = (!nothing).then(|| record.clone());
                self.state.update(g, g, &self.key_buf, |slot| *slot = value)?;
                if nothing {
                    self.written.remove(&g);
                } else {
                    self.written.insert(g, record);
                }
            }
        }
        Ok(())
    }

    /// Takes up the record a restore loaded into the state. `last` is the
    /// end (`max_timestamp`) of the latest window the restored state
    /// holds: a window that is not in the state fires like a new one
    /// whether or not it had fired, so no horizon needs to reach past it
    /// (after a final checkpoint, whose windows have all been dropped,
    /// there is none).
    fn restored(&mut self, operator: &str, last: Option<Timestamp>) -> Result<()> {
        for g in self.groups.clone() {
            self.key_buf.clear();
            g.encode_key(&mut self.key_buf);
            if let Some(record) = self.state.get(g, &g, &self.key_buf)? {
                self.written.insert(g, record);
            }
        }
        let Some(last) = last else { return Ok(()) };
        for (&g, record) in &self.written {
            if record.horizon == crate::record::NO_TIMESTAMP {
                continue;
            }
            let mut owed = HashSet::with_capacity(record.owed.len());
            for (start, key) in &record.owed {
                let k = crate::codec::key::decode::<K>(key).map_err(|e| Error::State {
                    operator: operator.to_string(),
                    message: format!("a window owed a firing in key group {g} has a key that does not decode: {e}"),
                })?;
                owed.insert((*start, k));
            }
            let horizon = record.horizon.min(last);
            self.max = self.max.max(horizon);
            self.horizon.insert(g, horizon);
            self.owed.insert(g, owed);
        }
        Ok(())
    }
}

impl<K: Key, T: Data, W: WindowFn<K, T>> AlignedWindowOp<K, T, W> {
    /// Fires every window whose end the watermark passed since the last
    /// advance, and cleans up those past their lateness, in start order.
    fn advance(&mut self, wm: Timestamp) -> Result<()> {
        let c = &mut self.common;
        let before = c.watermark;
        if self.state.first_window().is_some_and(|start| start.saturating_add(self.size - 1) <= wm) {
            let size = self.size;
            let last_start = wm.saturating_sub(size - 1);
            for start in self.state.windows_from(Timestamp::MIN) {
                if start > last_start {
                    break;
                }
                let window = Window { start, end: start.saturating_add(size) };
                let max = window.max_timestamp();
                let fire = max > before;
                let purge = max.saturating_add(c.lateness) <= wm;
                if !fire && !purge {
                    continue;
                }
                let (func, fired) = (&*c.func, &mut c.fired);
                // A window that had fired before a restore fires again only
                // for the keys that got records since.
                let mut marks = self.fired.as_mut().filter(|f| fire && max <= f.max);
                self.state.for_each_in_window(start, purge, |key, group, acc| {
                    if fire && marks.as_mut().is_none_or(|m| m.fires(group, start, key, max)) {
                        func.fire(key, window, acc, fired);
                    }
                })?;
                c.collect(window);
            }
        }
        c.watermark = c.watermark.max(wm);
        if let Some(f) = self.fired.as_mut() {
            f.passed(c.watermark);
        }
        Ok(())
    }
}

impl<K: Key, T: Data, W: WindowFn<K, T>> InputOperator for AlignedWindowOp<K, T, W> {
    fn on_batch(&mut self, batch: &RecordBatch, time: &mut InputTime<'_>) -> Result<()> {
        OperatorCounters::add(&self.common.info.counters.records_in, batch.len());
        for r in batch.iter() {
            if let Some(wm) = time.observe(&r.meta) {
                self.advance(wm)?;
            }
            let (ts, key, value) = self.common.decode(&r)?;
            let windows = self.windows.assign(ts, self.size, self.slide, self.offset);
            let c = &mut self.common;
            let wm = c.watermark;
            let lateness = c.lateness;
            let mut added = false;
            let mut value = Some(value);
            let last = windows.len().saturating_sub(1);
            for (i, window) in windows.iter().enumerate() {
                let max = window.max_timestamp();
                if max.saturating_add(lateness) <= wm {
                    continue;
                }
                added = true;
                let v = if i == last { value.take() } else { value.clone() };
                let Some(v) = v else { break };
                let (func, fired) = (&*c.func, &mut c.fired);
                let fire_now = max <= wm;
                let k = if fire_now { Some(key.clone()) } else { None };
                if !fire_now && let Some(f) = self.fired.as_mut().filter(|f| max <= f.max) {
                    f.added(r.group, window.start, &key, max);
                }
                self.state.update(window.start, r.group, key.clone(), r.key, |acc| {
                    func.add(acc, v);
                    if let (Some(k), Some(a)) = (k.as_ref(), acc.as_ref()) {
                        func.fire(k, *window, a, fired);
                    }
                })?;
                if fire_now {
                    c.collect(*window);
                }
            }
            if !added {
                match value {
                    Some(v) if ts.saturating_add(lateness) <= wm => {
                        let meta = c.record_meta(r.meta);
                        c.late(v, meta);
                    }
                    // In no window at all (a gap between sliding windows).
                    _ => OperatorCounters::add(&c.info.counters.dropped, 1),
                }
            }
        }
        self.common.emit()
    }

    window_control!();

    fn snapshot(&mut self, at: SnapshotAt) -> Result<Vec<StateSnapshot>> {
        let entries = self.state.snapshot_changes(&self.common.info.name, at.n, at.since)?;
        let mut out =
            vec![StateSnapshot { state: "windows", codec: W::Acc::codec_id().to_string(), snapshot: entries }];
        if let Some(f) = self.fired.as_mut() {
            f.record(self.common.watermark)?;
            let entries = f.state.snapshot_changes(at.n, at.since)?;
            out.push(StateSnapshot { state: "fired", codec: FiredUpTo::codec_id().to_string(), snapshot: entries });
        }
        Ok(out)
    }

    fn restore(&mut self, from: &dyn RestoreSource, groups: &std::ops::Range<u16>) -> Result<()> {
        let name = self.common.info.name.clone();
        // A part at a time: a large window state is never all in memory.
        from.load_entries(&name, "windows", &W::Acc::codec_id().to_string(), groups, &mut |entries, removed| {
            self.state.import_part(entries, removed, &name)
        })?;
        if let Some(f) = self.fired.as_mut() {
            // Checkpoints of builds before this record have none: their
            // kept windows fire again after a restore, as they did then.
            from.load_entries(&name, "fired", &FiredUpTo::codec_id().to_string(), groups, &mut |entries, removed| {
                f.state.import_part(entries, removed)
            })?;
            let last = self.state.windows_from(Timestamp::MIN).last().map(|start| start.saturating_add(self.size - 1));
            f.restored(&name, last)?;
        }
        Ok(())
    }
}

/// Session windows: per key, its open sessions.
struct SessionWindowOp<K, T, W: WindowFn<K, T>> {
    state: ValueState<K, Sessions<W::Acc>>,
    gap: i64,
    common: Common<K, T, W>,
}

/// What adding a record to a key's sessions did.
struct Merge {
    /// The windows merged away (their timers go).
    parts: Vec<Window>,
    /// The window the record went to, if it was not late.
    window: Option<Window>,
}

impl<K: Key, T: Data, W: WindowFn<K, T>> SessionWindowOp<K, T, W> {
    fn key_bytes(buf: &mut Vec<u8>, key: &K) {
        buf.clear();
        key.encode_key(buf);
    }

    fn advance(&mut self, wm: Timestamp) -> Result<()> {
        let c = &mut self.common;
        while let Some(is_fire) = c.next_due(wm) {
            let timers = if is_fire { &mut c.fire } else { &mut c.cleanup };
            let Some((time, keys)) = timers.pop_due(wm)? else { break };
            let max = if is_fire { time } else { time.saturating_sub(c.lateness) };
            let purge = !is_fire || c.lateness == 0;
            for (key, group) in keys {
                Self::key_bytes(&mut c.key_buf, &key);
                let (func, fired) = (&*c.func, &mut c.fired);
                let k = key.clone();
                let window = self.state.update(group, key, &c.key_buf, |slot| {
                    let sessions = slot.as_mut()?;
                    let i = sessions.0.iter().position(|(w, _)| w.max_timestamp() == max)?;
                    let (window, acc) = sessions.0.get(i)?;
                    let window = *window;
                    if is_fire {
                        func.fire(&k, window, acc, fired);
                    }
                    if purge {
                        sessions.0.remove(i);
                        if sessions.0.is_empty() {
                            *slot = None;
                        }
                    }
                    Some(window)
                })?;
                if let Some(window) = window {
                    c.collect(window);
                }
            }
        }
        c.watermark = c.watermark.max(wm);
        Ok(())
    }
}

impl<K: Key, T: Data, W: WindowFn<K, T>> InputOperator for SessionWindowOp<K, T, W> {
    fn on_batch(&mut self, batch: &RecordBatch, time: &mut InputTime<'_>) -> Result<()> {
        OperatorCounters::add(&self.common.info.counters.records_in, batch.len());
        for r in batch.iter() {
            if let Some(wm) = time.observe(&r.meta) {
                self.advance(wm)?;
            }
            let (ts, key, value) = self.common.decode(&r)?;
            let c = &mut self.common;
            let (wm, lateness) = (c.watermark, c.lateness);
            let fresh = Window { start: ts, end: ts.saturating_add(self.gap) };
            let (func, fired) = (&*c.func, &mut c.fired);
            let mut value = Some(value);
            let k = key.clone();
            let merge = self.state.update(r.group, key.clone(), r.key, |slot| {
                let sessions = slot.get_or_insert_with(|| Sessions(Vec::new()));
                let mut merged = fresh;
                let mut parts = Vec::new();
                let mut acc: Option<W::Acc> = None;
                let mut kept = Vec::with_capacity(sessions.0.len() + 1);
                for (w, a) in sessions.0.drain(..) {
                    if w.intersects(&merged) {
                        merged = merged.cover(&w);
                        parts.push(w);
                        match acc.as_mut() {
                            Some(into) => func.merge(into, a),
                            None => acc = Some(a),
                        }
                    } else {
                        kept.push((w, a));
                    }
                }
                if merged.max_timestamp().saturating_add(lateness) <= wm {
                    // Late even after merging: nothing was merged (merged
                    // parts are never late), so nothing changes.
                    sessions.0 = kept;
                    if let Some(a) = acc {
                        // Not reachable by the argument above; keep the
                        // state intact if it ever is.
                        sessions.0.push((merged, a));
                        sessions.0.sort_by_key(|(w, _)| w.start);
                    }
                    if sessions.0.is_empty() {
                        *slot = None;
                    }
                    return Merge { parts: Vec::new(), window: None };
                }
                if let Some(v) = value.take() {
                    func.add(&mut acc, v);
                }
                if let Some(a) = acc {
                    if merged.max_timestamp() <= wm {
                        func.fire(&k, merged, &a, fired);
                    }
                    kept.push((merged, a));
                }
                kept.sort_by_key(|(w, _)| w.start);
                sessions.0 = kept;
                Merge { parts, window: Some(merged) }
            })?;
            match merge.window {
                Some(window) => {
                    for part in &merge.parts {
                        c.fire.delete(part.max_timestamp(), r.group, &key)?;
                        if lateness > 0 {
                            c.cleanup.delete(part.max_timestamp().saturating_add(lateness), r.group, &key)?;
                        }
                    }
                    let max = window.max_timestamp();
                    if max <= wm {
                        c.collect(window);
                    } else {
                        c.fire.register(max, r.group, &key)?;
                    }
                    if lateness > 0 {
                        c.cleanup.register(max.saturating_add(lateness), r.group, &key)?;
                    }
                }
                None => {
                    if let Some(v) = value {
                        let meta = c.record_meta(r.meta);
                        c.late(v, meta);
                    }
                }
            }
        }
        self.common.emit()
    }

    window_control!();

    fn snapshot(&mut self, at: SnapshotAt) -> Result<Vec<StateSnapshot>> {
        Ok(vec![
            StateSnapshot {
                state: "sessions",
                codec: Sessions::<W::Acc>::codec_id().to_string(),
                snapshot: self.state.snapshot_changes(at.n, at.since)?,
            },
            StateSnapshot {
                state: "fire-timers",
                codec: TIMERS.into(),
                snapshot: self.common.fire.snapshot_changes(at.n, at.since)?,
            },
            StateSnapshot {
                state: "cleanup-timers",
                codec: TIMERS.into(),
                snapshot: self.common.cleanup.snapshot_changes(at.n, at.since)?,
            },
        ])
    }

    fn restore(&mut self, from: &dyn RestoreSource, groups: &std::ops::Range<u16>) -> Result<()> {
        let name = self.common.info.name.clone();
        let codec = Sessions::<W::Acc>::codec_id().to_string();
        from.load_entries(&name, "sessions", &codec, groups, &mut |entries, removed| {
            self.state.import_part(entries, removed)
        })?;
        for (state, timers) in [("fire-timers", &mut self.common.fire), ("cleanup-timers", &mut self.common.cleanup)] {
            from.load_entries(&name, state, TIMERS, groups, &mut |entries, removed| {
                timers.import_part(entries, removed, &name)
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn windows(ts: i64, size: i64, slide: i64, offset: i64) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        aligned_windows(ts, size, slide, offset, &mut out);
        out.into_iter().map(|w| (w.start, w.end)).collect()
    }

    #[test]
    fn aligned_assignment_matches_the_formulas() {
        assert_eq!(windows(0, 1000, 1000, 0), vec![(0, 1000)]);
        assert_eq!(windows(999, 1000, 1000, 0), vec![(0, 1000)]);
        assert_eq!(windows(-1, 1000, 1000, 0), vec![(-1000, 0)]);
        assert_eq!(windows(1500, 1000, 1000, 200), vec![(1200, 2200)]);
        assert_eq!(windows(7, 10, 5, 0), vec![(5, 15), (0, 10)]);
        assert_eq!(windows(-3, 10, 5, 0), vec![(-5, 5), (-10, 0)]);
        assert_eq!(windows(7, 2, 5, 0), vec![], "in the gap between windows of 2 every 5");
        assert_eq!(windows(i64::MIN + 1, 10, 5, 0).len(), 0, "no overflow at the edge of time");
    }

    #[test]
    fn elements_and_sessions_round_trip_and_refuse_garbage() {
        let e = Elements(vec!["a".to_string(), String::new(), "ccc".to_string()]);
        let mut bytes = Vec::new();
        e.encode(&mut bytes).unwrap();
        assert_eq!(Elements::<String>::decode(&bytes).unwrap(), e);
        assert!(Elements::<String>::decode(&bytes[..bytes.len() - 1]).is_err());
        let s = Sessions(vec![(Window { start: -5, end: 10 }, 3u64), (Window { start: 20, end: 30 }, 1)]);
        let mut bytes = Vec::new();
        s.encode(&mut bytes).unwrap();
        assert_eq!(Sessions::<u64>::decode(&bytes).unwrap(), s);
        assert!(Sessions::<u64>::decode(&bytes[..5]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn the_window_cache_always_agrees_with_the_formula(
            steps in proptest::collection::vec(-30i64..30, 1..200),
            (size, slide) in proptest::sample::select(vec![(10i64, 10i64), (20, 5), (10, 4), (6, 15), (7, 3), (1, 1)]),
            offset in 0i64..20,
        ) {
            let offset = offset % slide;
            let mut cache = AlignedCache::default();
            let mut ts = -40;
            for step in steps {
                ts += step;
                let mut want = Vec::new();
                aligned_windows(ts, size, slide, offset, &mut want);
                proptest::prop_assert_eq!(cache.assign(ts, size, slide, offset), &want[..], "ts {}", ts);
            }
        }
    }

    #[test]
    fn windows_touching_intersect() {
        let a = Window { start: 0, end: 10 };
        assert!(a.intersects(&Window { start: 10, end: 20 }));
        assert!(!a.intersects(&Window { start: 11, end: 20 }));
    }
}
