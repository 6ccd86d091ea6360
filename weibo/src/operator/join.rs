//! The interval join: a keyed function of two inputs that pairs each
//! record of the left input with the right input's records of the same key
//! whose event time is within `[left + lower, left + upper]`, as Flink's
//! `IntervalJoinOperator` does, and optionally emits the records that never
//! found a partner (outer joins).
//!
//! Each side keeps its records in map state by event time (a bucket of the
//! records of one time, each with whether it has been joined). A record:
//! - without an event time fails (as in Flink);
//! - behind the operator's watermark (`time < watermark`) is late: it goes
//!   to the late records side output and the operator's late counter, and
//!   joins nothing (Flink drops it silently);
//! - otherwise is paired with every buffered record of the other side in
//!   its interval (a range scan of the other side's map), each pair emitted
//!   once, at the later of the two times; then it is buffered, and an
//!   event-time timer is set at the time it can no longer be paired: its
//!   time plus the upper bound for a left record (its time when the bound
//!   is not positive), its time minus the lower bound for a right record
//!   (its time when the bound is not negative).
//!
//! A timer at `t` removes the left bucket whose cleanup time is `t` and the
//! right one's (with Flink's boundary behaviour: a record is removed once
//! the watermark reaches its cleanup time, though a record of the other
//! side at exactly that time is not late yet); in an outer join, the
//! removed records that were never paired are emitted first, with their
//! own time: since a partner would now be removed or late, such a row is
//! never followed by a pair.

use std::sync::Arc;

use crate::codec::schema::{Schema, Shape};
use crate::codec::{CodecError, CodecId, Data};
use crate::metrics::{OperatorCounters, TwoInputCounters};
use crate::operator::connect::{Either, KeyedCoProcessFunction};
use crate::operator::function::{MapState, ProcessContext, States, Timer};
use crate::operator::outputs::OutputTag;
use crate::record::{NO_TIMESTAMP, Timestamp};

/// The records of one side of one key at one event time, each with
/// whether it has been paired.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Bucket<T>(Vec<(T, bool)>);

impl<T> Default for Bucket<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T: Data> Data for Bucket<T> {
    fn codec_id() -> CodecId {
        CodecId::new("weibo-join-bucket/1", std::any::type_name::<Self>())
    }

    /// Per record: its flag (1: paired), the length of its encoding (four
    /// bytes, little-endian), the encoding.
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        for (record, joined) in &self.0 {
            out.push(u8::from(*joined));
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
        while let Some((&flag, rest)) = bytes.split_first() {
            let (len, rest) = rest.split_first_chunk::<4>().ok_or_else(|| short("a record's length"))?;
            let len = u32::from_le_bytes(*len) as usize;
            let (record, rest) = rest.split_at_checked(len).ok_or_else(|| short("a record"))?;
            records.push((T::decode(record)?, flag != 0));
            bytes = rest;
        }
        Ok(Self(records))
    }

    fn schema() -> Arc<Schema> {
        Arc::new(Schema { shape: Shape::Seq(Box::new(Shape::Tuple(vec![T::schema().shape.clone(), Shape::Bool]))) })
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

/// One side's records, by event time.
type Buffer<T> = MapState<i64, Bucket<T>>;

/// The interval join of a left input `L` and a right input `R`.
pub(crate) struct IntervalJoin<L, R, U> {
    interval: Interval,
    left: Buffer<L>,
    right: Buffer<R>,
    late: OutputTag<Either<L, R>>,
    f: JoinFn<L, R, U>,
    counters: Arc<TwoInputCounters>,
}

impl<L: Data, R: Data, U> IntervalJoin<L, R, U> {
    /// Declares the join's states (`left`, `right`) and late output on
    /// `states`.
    /// `counters`: what its metrics count of each input.
    pub(crate) fn new<K: crate::codec::key::Key>(
        states: &mut States<K>,
        interval: Interval,
        f: JoinFn<L, R, U>,
        counters: Arc<TwoInputCounters>,
    ) -> Self {
        let (left, right) = (states.map("left"), states.map("right"));
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
        (ours, other): (&Buffer<Ours>, &Buffer<Other>),
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
        let mut paired = false;
        let mut pairs = 0;
        let mut found = Vec::new();
        ctx.map(other).range(time.saturating_add(from)..=time.saturating_add(to), |at, bucket| {
            found.push((at, bucket));
            true
        });
        for (at, mut bucket) in found {
            let mut marked = false;
            for (partner, joined) in &mut bucket.0 {
                if let Some(out) = pair(record, partner) {
                    ctx.emit_at(out, time.max(at));
                    pairs += 1;
                }
                paired = true;
                if other_outer && !*joined {
                    *joined = true;
                    marked = true;
                }
            }
            if marked {
                ctx.map(other).put(at, bucket);
            }
        }
        OperatorCounters::add(&self.counters.matched, pairs);
        ctx.map(ours).update(time, |b| b.get_or_insert_with(Bucket::default).0.push((record.clone(), paired)));
        ctx.register_timer(if to > 0 { time.saturating_add(to) } else { time });
        Ok(())
    }

    /// Removes `state`'s bucket at `at` (of input `side`); if its side is
    /// outer, emits `row` of each of its records never paired, at `at`.
    fn remove<K: crate::codec::key::Key, T: Data>(
        &self,
        ctx: &mut ProcessContext<'_, K, U>,
        (state, side): (&Buffer<T>, usize),
        at: i64,
        outer: bool,
        row: impl Fn(&T) -> Option<U>,
    ) {
        if let Some(bucket) = ctx.map(state).remove(&at)
            && outer
        {
            let mut unmatched = 0;
            for (record, joined) in &bucket.0 {
                if !joined && let Some(out) = row(record) {
                    ctx.emit_at(out, at);
                    unmatched += 1;
                }
            }
            TwoInputCounters::add(&self.counters.unmatched, side, unmatched);
        }
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
        let Interval { lower, upper, left_outer, right_outer } = self.interval;
        let left_at = if upper > 0 { timer.time.saturating_sub(upper) } else { timer.time };
        self.remove(ctx, (&self.left, 0), left_at, left_outer, |l| (self.f)(Some(l), None));
        let right_at = if lower < 0 { timer.time.saturating_add(lower) } else { timer.time };
        self.remove(ctx, (&self.right, 1), right_at, right_outer, |r| (self.f)(None, Some(r)));
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_reads_back_its_records_and_flags_and_refuses_a_cut() {
        let bucket = Bucket(vec![("a".to_string(), false), (String::new(), true), ("ccc".into(), false)]);
        let mut bytes = Vec::new();
        bucket.encode(&mut bytes).unwrap();
        assert_eq!(Bucket::<String>::decode(&bytes).unwrap(), bucket);
        assert_eq!(Bucket::<String>::decode(&[]).unwrap(), Bucket::default());
        let cut = bytes.get(..bytes.len() - 1).unwrap();
        assert!(Bucket::<String>::decode(cut).unwrap_err().reason.contains("cut short"));
    }
}
