//! Joins of a stream with a table given as a changelog stream of the same
//! key: the temporal (versioned table) join, at event time, and the
//! latest-value join, at arrival.
//!
//! The temporal join (Flink SQL's `FOR SYSTEM_TIME AS OF` on a versioned
//! table, Kafka Streams' versioned stores) keeps each key's table rows by
//! event time (`versions`) and each stream record until the operator's
//! watermark has passed its time (`waiting`): only then has every table
//! row at or before that time arrived (a row behind the watermark is
//! late), and the record is joined with the version valid at its time,
//! the newest row at or before it. With a retention `r`:
//! - a record (of either input) at `time < watermark - r` is late: it goes
//!   to the late records output and the operator's late counter;
//! - a stream record at `watermark - r <= time < watermark` is joined at
//!   once, with the versions kept (a table row that arrives later does not
//!   change a row already emitted: nothing is retracted);
//! - a table row at `watermark - r <= time` becomes a version;
//! - once the watermark reaches `t + r`, the versions older than the
//!   newest one at or before `t` are removed: no record that can still
//!   come needs them.
//!
//! Timers drive both: a stream record at `t` sets one at `t + 1` (it fires
//! when the watermark passes `t`), a table row at `t` one at `t + r`
//! (cleanup). A timer at `T` joins the records waiting at `T - 1`, then
//! removes the versions older than the newest at or before `T - r`.

use std::sync::Arc;

use crate::codec::Data;
use crate::codec::key::Key;
use crate::metrics::{OperatorCounters, TwoInputCounters};
use crate::operator::connect::{Either, KeyedCoProcessFunction};
use crate::operator::function::{MapState, ProcessContext, States, Timer, ValueState};
use crate::operator::join::JoinFn;
use crate::operator::outputs::OutputTag;
use crate::operator::windows::Elements;
use crate::record::{NO_TIMESTAMP, Timestamp};

/// Whether a table row deletes its key (a tombstone) rather than sets it.
pub(crate) type Deletes<R> = Arc<dyn Fn(&R) -> bool + Send + Sync>;

/// How a temporal or latest-value join is set up.
pub(crate) struct TableJoin<L, R, U> {
    /// Emits stream records without a table row (with `None`).
    pub(crate) outer: bool,
    pub(crate) deletes: Option<Deletes<R>>,
    pub(crate) f: JoinFn<L, R, U>,
    /// What its metrics count of each input.
    pub(crate) counters: Arc<TwoInputCounters>,
}

impl<L, R, U> TableJoin<L, R, U> {
    /// The row for `record` and the table's row (a tombstone counts as
    /// none), if the join emits one.
    fn row(&self, record: &L, version: Option<&R>) -> Option<U> {
        let version = version.filter(|v| !self.deletes.as_ref().is_some_and(|d| d(v)));
        if version.is_none() && !self.outer {
            return None;
        }
        let row = (self.f)(Some(record), version)?;
        match version {
            Some(_) => OperatorCounters::add(&self.counters.matched, 1),
            None => TwoInputCounters::add(&self.counters.unmatched, 0, 1),
        }
        Some(row)
    }

    /// Counts a late record of input `side`.
    fn late(&self, side: usize) {
        TwoInputCounters::add(&self.counters.late, side, 1);
    }
}

/// A record's event time, or why the join cannot take it.
fn event_time(timestamp: Option<Timestamp>) -> Result<Timestamp, String> {
    timestamp.ok_or_else(|| {
        "a temporal join needs every record's event time, and this one has none: assign timestamps \
         (`with_timestamps`) on both inputs"
            .to_string()
    })
}

/// The temporal join of a stream `L` with the versions of a table `R`.
pub(crate) struct TemporalJoin<L, R, U> {
    join: TableJoin<L, R, U>,
    retention: i64,
    versions: MapState<i64, R>,
    waiting: MapState<i64, Elements<L>>,
    late: OutputTag<Either<L, R>>,
}

impl<L: Data, R: Data, U> TemporalJoin<L, R, U> {
    /// Declares the join's states (`versions`, `waiting`) and late output
    /// on `states`.
    pub(crate) fn new<K: Key>(states: &mut States<K>, join: TableJoin<L, R, U>, retention: i64) -> Self {
        Self {
            join,
            retention: retention.max(0),
            versions: states.map("versions"),
            waiting: states.map("waiting"),
            late: states.late_records(),
        }
    }

    /// Whether a record at `time` is late at `watermark`.
    fn late(&self, time: Timestamp, watermark: Timestamp) -> bool {
        watermark != NO_TIMESTAMP && time < watermark.saturating_sub(self.retention)
    }

    /// The version of the key's row valid at `time`: the newest at or
    /// before it.
    fn version_at<K: Key, V>(&self, ctx: &mut ProcessContext<'_, K, V>, time: Timestamp) -> Option<R> {
        let mut found = None;
        ctx.map(&self.versions).range(..=time, |_, row| {
            found = Some(row);
            true
        });
        found
    }
}

impl<K, L, R, U> KeyedCoProcessFunction<K, L, R> for TemporalJoin<L, R, U>
where
    K: Key,
    L: Data,
    R: Data,
    U: Clone + Send + 'static,
{
    type Out = U;
    type Error = String;

    fn process_element1(&self, ctx: &mut ProcessContext<'_, K, U>, record: &L) -> Result<(), String> {
        let time = event_time(ctx.timestamp())?;
        let watermark = ctx.watermark();
        if self.late(time, watermark) {
            self.join.late(0);
            ctx.output(&self.late, Either::Left(record.clone()));
        } else if watermark != NO_TIMESTAMP && time < watermark {
            // Within the retention: joined now, with the versions kept.
            let version = self.version_at(ctx, time);
            if let Some(out) = self.join.row(record, version.as_ref()) {
                ctx.emit_at(out, time);
            }
        } else {
            ctx.map(&self.waiting)
                .update(time, |w| w.get_or_insert_with(|| Elements(Vec::new())).0.push(record.clone()));
            ctx.register_timer(time.saturating_add(1));
        }
        Ok(())
    }

    fn process_element2(&self, ctx: &mut ProcessContext<'_, K, U>, row: &R) -> Result<(), String> {
        let time = event_time(ctx.timestamp())?;
        if self.late(time, ctx.watermark()) {
            self.join.late(1);
            ctx.output(&self.late, Either::Right(row.clone()));
            return Ok(());
        }
        ctx.map(&self.versions).put(time, row.clone());
        ctx.register_timer(time.saturating_add(self.retention));
        Ok(())
    }

    fn on_timer(&self, ctx: &mut ProcessContext<'_, K, U>, timer: Timer) -> Result<(), String> {
        let at = timer.time.saturating_sub(1);
        if let Some(records) = ctx.map(&self.waiting).remove(&at) {
            let version = self.version_at(ctx, at);
            for record in &records.0 {
                if let Some(out) = self.join.row(record, version.as_ref()) {
                    ctx.emit_at(out, at);
                }
            }
        }
        // The versions no record still to come can need: all but the
        // newest at or before the cutoff.
        let cutoff = timer.time.saturating_sub(self.retention);
        let mut older = Vec::new();
        ctx.map(&self.versions).range(..=cutoff, |time, _| {
            older.push(time);
            true
        });
        older.pop();
        for time in older {
            ctx.map(&self.versions).remove(&time);
        }
        Ok(())
    }
}

/// The latest-value join of a stream `L` with a table `R`: each record
/// meets the key's newest row at the moment it arrives.
pub(crate) struct LatestJoin<L, R, U> {
    join: TableJoin<L, R, U>,
    latest: ValueState<R>,
}

impl<L: Data, R: Data, U> LatestJoin<L, R, U> {
    /// Declares the join's state (`latest`) on `states`.
    pub(crate) fn new<K: Key>(states: &mut States<K>, join: TableJoin<L, R, U>) -> Self {
        Self { join, latest: states.value("latest") }
    }
}

impl<K, L, R, U> KeyedCoProcessFunction<K, L, R> for LatestJoin<L, R, U>
where
    K: Key,
    L: Data,
    R: Data,
    U: Clone + Send + 'static,
{
    type Out = U;
    type Error = String;

    fn process_element1(&self, ctx: &mut ProcessContext<'_, K, U>, record: &L) -> Result<(), String> {
        let latest = ctx.value(&self.latest).get();
        if let Some(out) = self.join.row(record, latest.as_ref()) {
            ctx.emit(out);
        }
        Ok(())
    }

    fn process_element2(&self, ctx: &mut ProcessContext<'_, K, U>, row: &R) -> Result<(), String> {
        if self.join.deletes.as_ref().is_some_and(|d| d(row)) {
            ctx.value(&self.latest).clear();
        } else {
            ctx.value(&self.latest).set(row.clone());
        }
        Ok(())
    }
}
