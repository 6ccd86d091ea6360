//! The interval join: a keyed function of two inputs that pairs each
//! record of the left input with the right input's records of the same key
//! whose event time is within `[left + lower, left + upper]`, as Flink's
//! `IntervalJoinOperator` does, and optionally emits the records that never
//! found a partner (outer joins).
//!
//! Each side keeps a key's records in one value, in time order (each
//! with whether it has been paired): a key holds few records at a time
//! (those of one interval), so one read and one write of the key's value
//! per record cost less than a map of buckets by time, which costs an
//! index per key. A record:
//! - without an event time fails (as in Flink);
//! - behind the operator's watermark (`time < watermark`) is late: it goes
//!   to the late records side output and the operator's late counter, and
//!   joins nothing (Flink drops it silently);
//! - otherwise is paired with every buffered record of the other side in
//!   its interval (a binary search and a scan of the other side's records),
//!   each pair emitted once, at the later of the two times; then it is
//!   buffered, and an event-time timer is set at the time it can no longer
//!   be paired: its time plus the upper bound for a left record (its time
//!   when the bound is not positive), its time minus the lower bound for a
//!   right record (its time when the bound is not negative).
//!
//! A timer at `t` removes the left records whose cleanup time is `t` or
//! earlier and the right ones' (with Flink's boundary behaviour: a record
//! is removed once the watermark reaches its cleanup time, though a record
//! of the other side at exactly that time is not late yet); in an outer
//! join, the removed records that were never paired are emitted first,
//! with their own time: since a partner would now be removed or late, such
//! a row is never followed by a pair.

use std::sync::Arc;

use crate::codec::schema::{Schema, Shape};
use crate::codec::{CodecError, CodecId, Data};
use crate::metrics::{OperatorCounters, TwoInputCounters};
use crate::operator::connect::{Either, KeyedCoProcessFunction};
use crate::operator::function::{ProcessContext, States, Timer, ValueState};
use crate::operator::outputs::OutputTag;
use crate::record::{NO_TIMESTAMP, Timestamp};

/// One side's records of one key, in time order: each with its time and
/// whether it has been paired.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Buffer<T>(Vec<(i64, T, bool)>);

impl<T> Default for Buffer<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T> Buffer<T> {
    /// Adds `record` at `time`, after the records at that time or earlier.
    fn insert(&mut self, time: i64, record: T, paired: bool) {
        let at = match self.0.last() {
            Some(last) if last.0 > time => self.0.partition_point(|e| e.0 <= time),
            _ => self.0.len(),
        };
        self.0.insert(at, (time, record, paired));
    }

    /// Where the records at `[from, to]` are.
    fn range(&self, from: i64, to: i64) -> std::ops::Range<usize> {
        let start = self.0.partition_point(|e| e.0 < from);
        start..self.0.partition_point(|e| e.0 <= to).max(start)
    }

    /// The records at `[from, to]`.
    fn within(&mut self, from: i64, to: i64) -> &mut [(i64, T, bool)] {
        let range = self.range(from, to);
        self.0.get_mut(range).unwrap_or_default()
    }

    /// The records at `[from, to]`, to read.
    fn within_ref(&self, from: i64, to: i64) -> &[(i64, T, bool)] {
        self.0.get(self.range(from, to)).unwrap_or_default()
    }
}

impl<T: Data> Data for Buffer<T> {
    fn codec_id() -> CodecId {
        CodecId::new("weibo-join-buffer/1", std::any::type_name::<Self>())
    }

    /// Per record: its time (eight bytes, little-endian), its flag (1:
    /// paired), the length of its encoding (four bytes, little-endian),
    /// the encoding.
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        for (time, record, paired) in &self.0 {
            out.extend_from_slice(&time.to_le_bytes());
            out.push(u8::from(*paired));
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            record.encode(out)?;
            let len = u32::try_from(out.len() - at - 4).map_err(|_| CodecError {
                codec: Self::codec_id(),
                reason: "a record's encoding is over 4 GiB".into(),
            })?;
            if let Some(slot) = out.get_mut(at..at + 4) {
                slot.copy_from_slice(&len.to_le_bytes());
            }
        }
        Ok(())
    }

    fn decode(mut bytes: &[u8]) -> Result<Self, CodecError> {
        let short = |what: &str| CodecError { codec: Self::codec_id(), reason: format!("cut short in {what}") };
        let mut records = Vec::new();
        while !bytes.is_empty() {
            let (time, rest) = bytes.split_first_chunk::<8>().ok_or_else(|| short("a record's time"))?;
            let (&flag, rest) = rest.split_first().ok_or_else(|| short("a record's flag"))?;
            let (len, rest) = rest.split_first_chunk::<4>().ok_or_else(|| short("a record's length"))?;
            let len = u32::from_le_bytes(*len) as usize;
            let (record, rest) = rest.split_at_checked(len).ok_or_else(|| short("a record"))?;
            records.push((i64::from_le_bytes(*time), T::decode(record)?, flag != 0));
            bytes = rest;
        }
        Ok(Self(records))
    }

    fn schema() -> Arc<Schema> {
        Arc::new(Schema {
            shape: Shape::Seq(Box::new(Shape::Tuple(vec![Shape::I64, T::schema().shape.clone(), Shape::Bool]))),
        })
    }

    fn check_round_trip() -> Result<(), String> {
        T::check_round_trip()
    }
}

/// What a join makes of a pair, or of a record without a partner (outer
/// joins only; `None` for the kinds that emit none).
pub(crate) type JoinFn<L, R, U> = Arc<dyn Fn(Option<&L>, Option<&R>) -> Option<U> + Send + Sync>;

/// The bounds of an interval join, inclusive (exclusive ones moved in by
/// a millisecond), and which sides' unpaired records are emitted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Interval {
    pub(crate) lower: i64,
    pub(crate) upper: i64,
    pub(crate) left_outer: bool,
    pub(crate) right_outer: bool,
}

/// One side's state: a key's records, in time order.
type Side<T> = ValueState<Buffer<T>>;

/// The interval join of a left input `L` and a right input `R`.
pub(crate) struct IntervalJoin<L, R, U> {
    interval: Interval,
    left: Side<L>,
    right: Side<R>,
    late: OutputTag<Either<L, R>>,
    f: JoinFn<L, R, U>,
    counters: Arc<TwoInputCounters>,
}

impl<L: Data, R: Data, U> IntervalJoin<L, R, U> {
    /// Declares the join's states (`left`, `right`) and late output on
    /// `states`; `counters`: what its metrics count of each input.
    pub(crate) fn new<K: crate::codec::key::Key>(
        states: &mut States<K>,
        interval: Interval,
        f: JoinFn<L, R, U>,
        counters: Arc<TwoInputCounters>,
    ) -> Self {
        let (left, right) = (states.value("left"), states.value("right"));
        Self { interval, left, right, late: states.late_records(), f, counters }
    }
}

/// A record's event time, or why it cannot be joined.
fn event_time(timestamp: Option<Timestamp>) -> Result<Timestamp, String> {
    timestamp.ok_or_else(|| {
        "an interval join needs every record's event time, and this one has none: assign timestamps \
         (`with_timestamps`) on both inputs"
            .to_string()
    })
}

/// Whether a record at `time` is late at `watermark`.
fn late(time: Timestamp, watermark: Timestamp) -> bool {
    watermark != NO_TIMESTAMP && time < watermark
}

impl<L: Data, R: Data, U: Clone + Send + 'static> IntervalJoin<L, R, U> {
    /// A record of one side (`ours`, input `side`): late, or paired with
    /// the other side's records at `[time + from, time + to]` (`pair` of
    /// ours and theirs), marking them paired if the other side is outer,
    /// then buffered with a timer at its removal time.
    #[expect(clippy::too_many_arguments, reason = "each side passes its own view of the same steps")]
    fn on_record<K: crate::codec::key::Key, Ours: Data, Other: Data>(
        &self,
        ctx: &mut ProcessContext<'_, K, U>,
        record: &Ours,
        side: usize,
        (ours, other): (&Side<Ours>, &Side<Other>),
        (from, to, other_outer): (i64, i64, bool),
        late_record: impl FnOnce() -> Either<L, R>,
        pair: impl Fn(&Ours, &Other) -> Option<U>,
    ) -> Result<(), String> {
        let time = event_time(ctx.timestamp())?;
        if late(time, ctx.watermark()) {
            TwoInputCounters::add(&self.counters.late, side, 1);
            ctx.output(&self.late, late_record());
            return Ok(());
        }
        let (lo, hi) = (time.saturating_add(from), time.saturating_add(to));
        let mut rows = Vec::new();
        let mut partners = 0;
        let mut pairs = |(at, partner): (i64, &Other)| {
            if let Some(row) = pair(record, partner) {
                rows.push((row, time.max(at)));
            }
            partners += 1;
        };
        let other_first = ctx.value(other).read(|b| {
            let b = b?;
            for (at, partner, _) in b.within_ref(lo, hi) {
                pairs((*at, partner));
            }
            b.0.first().map(|e| e.0)
        });
        if other_outer && partners > 0 {
            // The partners are marked paired: a write.
            ctx.value(other).update(|b| {
                for (_, _, paired) in b.as_mut().map_or(&mut [][..], |b| b.within(lo, hi)) {
                    *paired = true;
                }
            });
        }
        OperatorCounters::add(&self.counters.matched, rows.len());
        for (row, at) in rows {
            ctx.emit_at(row, at);
        }
        let record = record.clone();
        let mut own_first = None;
        ctx.value(ours).update(|b| {
            let b = b.get_or_insert_with(Buffer::default);
            own_first = b.0.first().map(|e| e.0);
            b.insert(time, record, partners > 0);
        });
        // The key keeps one timer, at the earliest time one of its records
        // can no longer be paired: set when this record is that one.
        let cleanup = time.saturating_add(to.max(0));
        let earliest = [
            own_first.map(|t| t.saturating_add(to.max(0))),
            other_first.map(|t| t.saturating_add(from.saturating_neg().max(0))),
        ]
        .into_iter()
        .flatten()
        .min();
        if earliest.is_none_or(|e| cleanup < e) {
            ctx.register_timer(cleanup);
        }
        Ok(())
    }

    /// Removes `state`'s records at `at` and before (of input `side`); if
    /// its side is outer, emits `row` of each of those never paired, at its
    /// time. Returns the time of the first record left, if any.
    fn remove<K: crate::codec::key::Key, T: Data>(
        &self,
        ctx: &mut ProcessContext<'_, K, U>,
        (state, side): (&Side<T>, usize),
        at: i64,
        outer: bool,
        row: impl Fn(&T) -> Option<U>,
    ) -> Option<i64> {
        let mut removed = Vec::new();
        let mut left = None;
        ctx.value(state).update(|slot| {
            let Some(b) = slot else { return };
            let due = b.0.partition_point(|e| e.0 <= at);
            if outer {
                removed.extend(b.0.drain(..due).filter(|e| !e.2).map(|e| (e.0, e.1)));
            } else {
                b.0.drain(..due);
            }
            left = b.0.first().map(|e| e.0);
            if b.0.is_empty() {
                *slot = None;
            }
        });
        let mut unmatched = 0;
        for (time, record) in removed {
            if let Some(out) = row(&record) {
                ctx.emit_at(out, time);
                unmatched += 1;
            }
        }
        TwoInputCounters::add(&self.counters.unmatched, side, unmatched);
        left
    }
}

impl<K, L, R, U> KeyedCoProcessFunction<K, L, R> for IntervalJoin<L, R, U>
where
    K: crate::codec::key::Key,
    L: Data,
    R: Data,
    U: Clone + Send + 'static,
{
    type Out = U;
    type Error = String;

    fn process_element1(&self, ctx: &mut ProcessContext<'_, K, U>, record: &L) -> Result<(), String> {
        let Interval { lower, upper, right_outer, .. } = self.interval;
        self.on_record(
            ctx,
            record,
            0,
            (&self.left, &self.right),
            (lower, upper, right_outer),
            || Either::Left(record.clone()),
            |l, r| (self.f)(Some(l), Some(r)),
        )
    }

    fn process_element2(&self, ctx: &mut ProcessContext<'_, K, U>, record: &R) -> Result<(), String> {
        // A right record at `t` pairs with left records at
        // `[t - upper, t - lower]`, and is removed at `t - lower`.
        let Interval { lower, upper, left_outer, .. } = self.interval;
        self.on_record(
            ctx,
            record,
            1,
            (&self.right, &self.left),
            (upper.saturating_neg(), lower.saturating_neg(), left_outer),
            || Either::Right(record.clone()),
            |r, l| (self.f)(Some(l), Some(r)),
        )
    }

    fn on_timer(&self, ctx: &mut ProcessContext<'_, K, U>, timer: Timer) -> Result<(), String> {
        // A left record at `t` can no longer be paired from `t + upper` (or
        // `t`), a right one from `t - lower` (or `t`).
        let Interval { lower, upper, left_outer, right_outer } = self.interval;
        let (left_after, right_after) = (upper.max(0), lower.saturating_neg().max(0));
        // At the end of time every record goes (a record within a bound of
        // it would otherwise have a cleanup time past it).
        let at = |after: i64| if timer.time == i64::MAX { i64::MAX } else { timer.time.saturating_sub(after) };
        let left = self.remove(ctx, (&self.left, 0), at(left_after), left_outer, |l| (self.f)(Some(l), None));
        let right = self.remove(ctx, (&self.right, 1), at(right_after), right_outer, |r| (self.f)(None, Some(r)));
        // The next of the key's records to go.
        let next = [left.map(|t| t.saturating_add(left_after)), right.map(|t| t.saturating_add(right_after))];
        if let Some(next) = next.into_iter().flatten().min().filter(|n| *n > timer.time) {
            ctx.register_timer(next);
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_reads_back_its_records_times_and_flags_and_refuses_a_cut() {
        let buffer = Buffer(vec![(-5, "a".to_string(), false), (0, String::new(), true), (9, "ccc".into(), false)]);
        let mut bytes = Vec::new();
        buffer.encode(&mut bytes).unwrap();
        assert_eq!(Buffer::<String>::decode(&bytes).unwrap(), buffer);
        assert_eq!(Buffer::<String>::decode(&[]).unwrap(), Buffer::default());
        let cut = bytes.get(..bytes.len() - 1).unwrap();
        assert!(Buffer::<String>::decode(cut).unwrap_err().reason.contains("cut short"));
    }

    #[test]
    fn a_buffer_keeps_time_order_and_finds_an_interval() {
        let mut b = Buffer::default();
        for (t, r) in [(10, 'a'), (5, 'b'), (10, 'c'), (7, 'd'), (20, 'e')] {
            b.insert(t, r, false);
        }
        let order: Vec<(i64, char)> = b.0.iter().map(|e| (e.0, e.1)).collect();
        assert_eq!(order, [(5, 'b'), (7, 'd'), (10, 'a'), (10, 'c'), (20, 'e')], "equal times in arrival order");
        let within: Vec<char> = b.within(7, 10).iter().map(|e| e.1).collect();
        assert_eq!(within, ['d', 'a', 'c']);
        assert!(b.within(11, 19).is_empty());
        assert!(b.within(30, 10).is_empty());
    }
}
