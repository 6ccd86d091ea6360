//! The operator of aligned windows (tumbling, sliding): one index of open
//! windows per key group, which is also the timer index.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::common::{Common, give_meta, window_control};
use super::functions::WindowFn;
use super::{AlignedCache, Window};
use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::{Error, Result};
use crate::metrics::OperatorCounters;
use crate::operator::keyed::take_records;
use crate::operator::{InputOperator, SnapshotAt, emit, restore_state, snapshot_state};
use crate::record::RecordRef;
use crate::record::{RecordBatch, Timestamp};
use crate::state::{KeyedState, RestoreSource, StateSnapshot, StateType, ValueStore, WindowState};
use crate::time::watermarks::InputTime;

/// Tumbling and sliding windows: one accumulator per (window, key), kept
/// window-major; a window fires (and is cleaned up) when the watermark
/// passes its end, so the window index doubles as the timer index.
pub(super) struct AlignedWindowOp<K, T, W: WindowFn<K, T>> {
    pub(super) state: WindowState<K, W::Acc>,
    pub(super) size: i64,
    pub(super) slide: i64,
    pub(super) offset: i64,
    pub(super) windows: AlignedCache,
    /// What had fired when the state was restored (with lateness only).
    pub(super) fired: Option<Fired<K>>,
    /// A watermark below this has nothing to fire or purge: no window
    /// that has not fired ends below it, and no window's lateness runs
    /// out below it. Kept at or below the truth (lowered as records open
    /// windows, recomputed whenever the watermark reaches it, `MIN` after
    /// a restore), so [`advance`](Self::advance) only checks it: the
    /// watermark moves with nearly every record, and looking at the state
    /// each time was a visible share of `bench w1`.
    pub(super) quiet_below: Timestamp,
    pub(super) common: Common<K, T, W>,
}

/// What fired, per key group, as a checkpoint records it: every window
/// whose end is at or below `horizon` had fired (with every record it
/// held), except the `owed` ones, which got records after a restore and
/// wait for the watermark to fire them again.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct FiredUpTo {
    pub(super) horizon: Timestamp,
    /// (window start, encoded key).
    pub(super) owed: Vec<(Timestamp, Vec<u8>)>,
}

/// The firing record of a tumbling or sliding window operator with
/// allowed lateness. A window fires when the watermark passes its end;
/// the watermark starts again after a restore, so without this record
/// every window kept for its lateness at the checkpoint would fire again
/// with the same contents.
pub(super) struct Fired<K> {
    /// Per key group, the restored horizon (see [`FiredUpTo`]); none once
    /// the watermark has passed it.
    pub(super) horizon: HashMap<u16, Timestamp>,
    /// The highest restored horizon: windows ending above it fire as usual.
    pub(super) max: Timestamp,
    /// Windows at or below their group's horizon that got records since
    /// the restore: they fire when the watermark passes their end.
    pub(super) owed: HashMap<u16, HashSet<(Timestamp, K)>>,
    pub(super) state: ValueStore<u16, FiredUpTo>,
    pub(super) groups: std::ops::Range<u16>,
    /// What `state` holds, per key group: compared at the barrier without
    /// reading the state (on fjall, a read may go to disk).
    pub(super) written: HashMap<u16, FiredUpTo>,
    pub(super) key_buf: Vec<u8>,
}

impl<K: Key> Fired<K> {
    pub(super) fn new(state: ValueStore<u16, FiredUpTo>, groups: std::ops::Range<u16>) -> Self {
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
    pub(super) fn fires(&mut self, group: u16, start: Timestamp, key: &K, max: Timestamp) -> bool {
        match self.horizon.get(&group) {
            Some(h) if max <= *h => self.owed.get_mut(&group).is_some_and(|owed| owed.remove(&(start, key.clone()))),
            _ => true,
        }
    }

    /// A record went into the window starting at `start` (ending at
    /// `max`, which the watermark has not reached) of `key` in `group`.
    pub(super) fn added(&mut self, group: u16, start: Timestamp, key: &K, max: Timestamp) {
        if self.horizon.get(&group).is_some_and(|h| max <= *h) {
            self.owed.entry(group).or_default().insert((start, key.clone()));
        }
    }

    /// The operator's watermark reached `wm`: a horizon it passed is of
    /// no more use (every window below it that owed a firing has fired).
    pub(super) fn passed(&mut self, wm: Timestamp) {
        if wm >= self.max && !self.horizon.is_empty() {
            self.horizon.clear();
            self.owed.clear();
            self.max = crate::record::NO_TIMESTAMP;
        }
    }

    /// Records, for the checkpoint, what had fired up to the operator's
    /// watermark `wm`, per key group.
    pub(super) fn record(&mut self, wm: Timestamp) -> Result<()> {
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
    pub(super) fn restored(&mut self, operator: &str, last: Option<Timestamp>) -> Result<()> {
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
                    message: format!("a window owed a firing in key group {g} has a key that does not decode"),
                    source: Some(e.into()),
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
    #[inline]
    pub(super) fn advance(&mut self, wm: Timestamp) -> Result<()> {
        if wm < self.quiet_below {
            let c = &mut self.common;
            c.watermark = c.watermark.max(wm);
            if let Some(f) = self.fired.as_mut() {
                f.passed(c.watermark);
            }
            return Ok(());
        }
        self.fire_and_purge(wm)
    }

    /// Adds a record to its windows (fires those the watermark has passed,
    /// with lateness; sends a late record aside).
    #[inline]
    fn add(&mut self, key: K, value: T, r: &RecordRef<'_>, ts: Timestamp) -> Result<()> {
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
            let (func, fired) = (&*c.func, &mut c.out.values);
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
            let due = if fire_now { max.saturating_add(lateness) } else { max };
            self.quiet_below = self.quiet_below.min(due);
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
        Ok(())
    }

    /// After a record at `ts` went into its (tumbling) window: takes the
    /// records after it into the same window while they belong there and
    /// the watermark stays below anything due. Returns the first record
    /// that does not, with the watermark its input moved to.
    #[inline]
    #[allow(clippy::type_complexity)]
    fn run<'b>(
        &mut self,
        ts: Timestamp,
        records: &mut impl Iterator<Item = ((K, T), RecordRef<'b>)>,
        time: &mut InputTime<'_>,
    ) -> Result<Option<((K, T), RecordRef<'b>, Option<Timestamp>)>> {
        let [window] = *self.windows.assign(ts, self.size, self.slide, self.offset) else { return Ok(None) };
        let c = &mut self.common;
        // Fired at once, or late: the record did not open a run; nor in a
        // window at or below a restored firing record's horizon, whose
        // records are marked one by one (see `Fired::added`).
        let max = window.max_timestamp();
        if max <= c.watermark || self.fired.as_ref().is_some_and(|f| max <= f.max) {
            return Ok(None);
        }
        let Some(mut run) = self.state.run(window.start) else { return Ok(None) };
        let func = &*c.func;
        for (kv, r) in records.by_ref() {
            let moved = time.observe(&r.meta);
            if let Some(wm) = moved {
                // The window's end is at or above `quiet_below` (the
                // record that opened the run lowered it), so the records
                // of a run are never due at once nor late.
                if wm >= self.quiet_below {
                    return Ok(Some((kv, r, moved)));
                }
                c.watermark = c.watermark.max(wm);
                if let Some(f) = self.fired.as_mut() {
                    f.passed(c.watermark);
                }
            }
            let ts = r.meta.timestamp;
            if ts < window.start || ts >= window.end || !run.has_room() {
                return Ok(Some((kv, r, None)));
            }
            let (key, value) = kv;
            run.update(r.group, key, |acc| func.add(acc, value))?;
        }
        Ok(None)
    }

    /// [`advance`](Self::advance), when something may be due. Out of
    /// line: the check before it runs for nearly every record.
    #[inline(never)]
    fn fire_and_purge(&mut self, wm: Timestamp) -> Result<()> {
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
                let meta = c.window_meta(window);
                let (func, out, next, info, limit) = (&*c.func, &mut c.out, &mut *c.next, &c.info, c.batch_size);
                // A window that had fired before a restore fires again only
                // for the keys that got records since.
                let mut marks = self.fired.as_mut().filter(|f| fire && max <= f.max);
                // A window of many keys goes out a batch at a time.
                let mut sent = Ok(());
                self.state.for_each_in_window(start, purge, |key, group, acc| {
                    if fire && marks.as_mut().is_none_or(|m| m.fires(group, start, key, max)) {
                        func.fire(key, window, acc, &mut out.values);
                        if out.values.len() >= limit && sent.is_ok() {
                            give_meta(out, meta);
                            sent = emit(info, next, out);
                        }
                    }
                })?;
                sent?;
                c.collect(window);
            }
        }
        c.watermark = c.watermark.max(wm);
        if let Some(f) = self.fired.as_mut() {
            f.passed(c.watermark);
        }
        self.quiet_below = self.next_due();
        Ok(())
    }

    /// The lowest watermark at which [`advance`](Self::advance) has work:
    /// the end of the first window the watermark has not passed, or the
    /// end of the first window's lateness, whichever is lower.
    fn next_due(&self) -> Timestamp {
        let Some(first) = self.state.first_window() else { return Timestamp::MAX };
        let size = self.size;
        let max_of = |start: Timestamp| Window { start, end: start.saturating_add(size) }.max_timestamp();
        let purge = max_of(first).saturating_add(self.common.lateness);
        // A window fires once the watermark reaches its last timestamp,
        // `start + size - 1`: those still to fire start after `wm - size + 1`.
        let unfired = self.common.watermark.saturating_sub(size - 1).saturating_add(1);
        let fire = self.state.first_window_from(unfired).map_or(Timestamp::MAX, max_of);
        purge.min(fire)
    }
}

impl<K: Key, T: Data, W: WindowFn<K, T>> InputOperator for AlignedWindowOp<K, T, W> {
    fn on_batch(&mut self, batch: &mut RecordBatch, time: &mut InputTime<'_>) -> Result<()> {
        OperatorCounters::add(&self.common.info.counters.records_in, batch.len());
        let mut records = std::mem::take(&mut self.common.records);
        take_records(&self.common.info, batch, &mut records)?;
        // With tumbling windows, the records after one that went into an
        // open window, up to the first that goes elsewhere or moves the
        // watermark to something due, go into that window's map in a loop
        // of their own (`run`): no window lookup, no assignment and no
        // lateness check per record (`bench w1` gained markedly from it).
        // Sliding windows (a record in several) take every record the
        // general way.
        let runs = self.size == self.slide;
        let mut records_in = records.drain(..).zip(batch.iter());
        // A record taken by a run that does not belong in it, with the
        // watermark its input moved to.
        let mut pending = None;
        loop {
            let ((key, value), r, moved) = match pending.take() {
                Some(p) => p,
                None => match records_in.next() {
                    Some((kv, r)) => {
                        let moved = time.observe(&r.meta);
                        (kv, r, moved)
                    }
                    None => break,
                },
            };
            if let Some(wm) = moved {
                self.advance(wm)?;
            }
            let ts = self.common.event_time(&r.meta)?;
            self.add(key, value, &r, ts)?;
            if runs {
                pending = self.run(ts, &mut records_in, time)?;
            }
        }
        drop(records_in);
        // Its memory kept for the next batch.
        self.common.records = records;
        self.common.emit()
    }

    window_control!();

    fn state_stats(&self) -> Vec<(crate::state::StateName, crate::state::StateStats)> {
        vec![("windows".into(), self.state.stats())]
    }

    fn snapshot(&mut self, at: SnapshotAt) -> Result<Vec<StateSnapshot>> {
        let name = &self.common.info.name;
        let mut out = vec![snapshot_state(&mut self.state, name, "windows", StateType::of::<W::Acc>(), at)?];
        if let Some(f) = self.fired.as_mut() {
            f.record(self.common.watermark)?;
            out.push(snapshot_state(&mut f.state, name, "fired", StateType::own::<FiredUpTo>(), at)?);
        }
        Ok(out)
    }

    fn restore(&mut self, from: &dyn RestoreSource, groups: &std::ops::Range<u16>) -> Result<()> {
        let name = self.common.info.name.clone();
        restore_state(&mut self.state, from, &name, "windows", &StateType::of::<W::Acc>(), groups)?;
        // The restored windows may be due at any watermark.
        self.quiet_below = Timestamp::MIN;
        if let Some(f) = self.fired.as_mut() {
            // Checkpoints of builds before this record have none: their
            // kept windows fire again after a restore, as they did then.
            restore_state(&mut f.state, from, &name, "fired", &StateType::own::<FiredUpTo>(), groups)?;
            let last = self.state.windows_from(Timestamp::MIN).last().map(|start| start.saturating_add(self.size - 1));
            f.restored(&name, last)?;
        }
        Ok(())
    }
}
