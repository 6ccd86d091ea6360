//! The operator of session windows: per key, its open sessions, merged
//! as records bridge them, and a timer per session end.

use super::Window;
use super::common::{Common, window_control};
use super::contents::Sessions;
use super::functions::WindowFn;
use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::Result;
use crate::metrics::OperatorCounters;
use crate::operator::keyed::{TIMERS, take_records};
use crate::operator::{InputOperator, SnapshotAt, restore_state, snapshot_state};
use crate::record::{RecordBatch, Timestamp};
use crate::state::{KeyedState, RestoreSource, StateSnapshot, StateType, ValueStore};
use crate::time::watermarks::InputTime;

/// Session windows: per key, its open sessions.
pub(super) struct SessionWindowOp<K, T, W: WindowFn<K, T>> {
    pub(super) state: ValueStore<K, Sessions<W::Acc>>,
    pub(super) gap: i64,
    pub(super) common: Common<K, T, W>,
}

/// What adding a record to a key's sessions did.
pub(super) struct Merge {
    /// The windows merged away (their timers go).
    pub(super) parts: Vec<Window>,
    /// The window the record went to, if it was not late.
    pub(super) window: Option<Window>,
}

impl<K: Key, T: Data, W: WindowFn<K, T>> SessionWindowOp<K, T, W> {
    pub(super) fn key_bytes(buf: &mut Vec<u8>, key: &K) {
        buf.clear();
        key.encode_key(buf);
    }

    pub(super) fn advance(&mut self, wm: Timestamp) -> Result<()> {
        let c = &mut self.common;
        while let Some(is_fire) = c.next_due(wm) {
            let timers = if is_fire { &mut c.fire } else { &mut c.cleanup };
            let Some((time, keys)) = timers.pop_due(wm)? else { break };
            let max = if is_fire { time } else { time.saturating_sub(c.lateness) };
            let purge = !is_fire || c.lateness == 0;
            for (key, group) in keys {
                Self::key_bytes(&mut c.key_buf, &key);
                let (func, fired) = (&*c.func, &mut c.out.values);
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
                    c.emit_full()?;
                }
            }
        }
        c.watermark = c.watermark.max(wm);
        Ok(())
    }
}

impl<K: Key, T: Data, W: WindowFn<K, T>> InputOperator for SessionWindowOp<K, T, W> {
    fn on_batch(&mut self, batch: &mut RecordBatch, time: &mut InputTime<'_>) -> Result<()> {
        OperatorCounters::add(&self.common.info.counters.records_in, batch.len());
        let mut records = std::mem::take(&mut self.common.records);
        take_records(&self.common.info, batch, &mut records)?;
        for ((key, value), r) in records.drain(..).zip(batch.iter()) {
            if let Some(wm) = time.observe(&r.meta) {
                self.advance(wm)?;
            }
            let ts = self.common.event_time(&r.meta)?;
            let c = &mut self.common;
            let (wm, lateness) = (c.watermark, c.lateness);
            let fresh = Window { start: ts, end: ts.saturating_add(self.gap) };
            let (func, fired) = (&*c.func, &mut c.out.values);
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
        // Its memory kept for the next batch.
        self.common.records = records;
        self.common.emit()
    }

    window_control!();

    fn state_stats(&self) -> Vec<(crate::state::StateName, crate::state::StateStats)> {
        vec![
            ("sessions".into(), self.state.stats()),
            ("fire-timers".into(), self.common.fire.stats()),
            ("cleanup-timers".into(), self.common.cleanup.stats()),
        ]
    }

    fn snapshot(&mut self, at: SnapshotAt) -> Result<Vec<StateSnapshot>> {
        let name = &self.common.info.name;
        Ok(vec![
            snapshot_state(&mut self.state, name, "sessions", StateType::of::<Sessions<W::Acc>>(), at)?,
            snapshot_state(&mut self.common.fire, name, "fire-timers", StateType::internal(TIMERS), at)?,
            snapshot_state(&mut self.common.cleanup, name, "cleanup-timers", StateType::internal(TIMERS), at)?,
        ])
    }

    fn restore(&mut self, from: &dyn RestoreSource, groups: &std::ops::Range<u16>) -> Result<()> {
        let name = self.common.info.name.clone();
        restore_state(&mut self.state, from, &name, "sessions", &StateType::of::<Sessions<W::Acc>>(), groups)?;
        restore_state(&mut self.common.fire, from, &name, "fire-timers", &StateType::internal(TIMERS), groups)?;
        restore_state(&mut self.common.cleanup, from, &name, "cleanup-timers", &StateType::internal(TIMERS), groups)
    }
}
