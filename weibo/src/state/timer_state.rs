//! `TimerState`: a keyed operator's event-time timers.

use std::fmt;
use std::sync::Arc;

use rustc_hash::FxBuildHasher;

use super::snapshot::{
    Barrier, Entries, EntryRef, RemovedRef, Snapshot, SnapshotPart, delta_since, entry_refs, flush_part, gather,
    pass_if_full,
};
use super::time_index::TimeIndex;
use super::value::key_error;
use super::window_state::WINDOW_LOG_MIN;
use super::{StateBackend, StateScope, timers};
use crate::codec::key::Key;
use crate::error::Result;
use crate::record::{CheckpointId, Timestamp};

impl<K: Key> TimerState<K> {
    /// Every timer, for a checkpoint: key = time ++ encoded key, no value.
    ///
    /// # Errors
    /// None today (keys encode infallibly); as [`TimerState::snapshot_deferred`].
    pub fn export(&mut self) -> Result<Entries> {
        Ok(gather(self.snapshot_deferred()?)?.entries)
    }

    /// Every timer as of now, to encode later (on another thread): the
    /// index is shared in chunks (one reference per chunk of times), and a
    /// chunk is copied, with its times' keys, when a timer in it is next
    /// set, deleted or fired while the checkpoint still holds it (see
    /// `TimeIndex`).
    ///
    /// # Errors
    /// [`Error::State`] when a byte backend fails.
    pub fn snapshot_deferred(&mut self) -> Result<Snapshot> {
        self.snapshot_at(None)
    }

    /// The timers at barrier `checkpoint`, to encode later: all of them (a
    /// base), or those set and removed since checkpoint `since`, the last
    /// complete one (a delta), chosen as for value state (see
    /// [`ValueStore::snapshot_changes`]), except that a base is also written
    /// once the timers removed and not yet in a complete checkpoint
    /// outnumber both those set and 65,536 (the log of removals is then
    /// dropped). The barrier copies one reference per chunk of times and
    /// per checkpoint the log spans, not the timers.
    ///
    /// # Errors
    /// [`Error::State`] when a byte backend fails.
    pub fn snapshot_changes(&mut self, checkpoint: CheckpointId, since: CheckpointId) -> Result<Snapshot> {
        self.snapshot_at(Some(Barrier::new(checkpoint, since)))
    }

    fn snapshot_at(&mut self, at: Option<Barrier>) -> Result<Snapshot> {
        if let Some(table) = &mut self.table {
            return table.snapshot_at(at);
        }
        let log = &mut self.log;
        let since = delta_since(at, log.first_base, log.since_full);
        let mut removed = Vec::new();
        let mut dropped: Vec<Arc<RemovedTimers<K>>> = Vec::new();
        if let Some(at) = at {
            log.first_base.get_or_insert(at.checkpoint);
            log.since_full = if since.is_some() { log.since_full + 1 } else { 1 };
            // Removals so far belong to the checkpoint being taken.
            if !log.current.is_empty() {
                let current = Arc::new(std::mem::take(&mut log.current));
                log.removed.push((log.epoch, current));
            }
            log.epoch = at.next_epoch();
            // Removals a complete checkpoint holds are not needed again:
            // they are freed with the snapshot, off the worker (a large
            // free in the pause can make glibc merge every small chunk
            // freed before it).
            let kept = log.removed.iter().position(|(e, _)| u64::from(*e) > at.completed).unwrap_or(log.removed.len());
            dropped = log.removed.drain(..kept).map(|(_, r)| r).collect();
            log.removed_len = log.removed.iter().map(|(_, r)| r.len()).sum();
            if since.is_some() {
                removed = log.removed.iter().map(|(_, r)| r.clone()).collect();
            }
        }
        let shared = self.index.share();
        let base = since.is_none();
        Ok(Box::new(move |sink| {
            let mut part = SnapshotPart::new(base);
            // A delta's removals first: a timer deleted and set again is
            // among the entries too.
            for chunk in &removed {
                for (time, k, group) in chunk.iter() {
                    time.encode_key(&mut part.part.removed);
                    k.encode_key(&mut part.part.removed);
                    part.part.end_removed(*group)?;
                    pass_if_full(&mut part, sink)?;
                }
            }
            flush_part(&mut part, sink)?;
            for (time, keys) in shared.iter().flat_map(|chunk| chunk.iter()) {
                for (k, (group, stamp)) in keys.iter() {
                    if since.is_some_and(|s| *stamp <= s) {
                        continue;
                    }
                    time.encode_key(&mut part.part.keys);
                    k.encode_key(&mut part.part.keys);
                    part.part.end_entry(*group)?;
                    pass_if_full(&mut part, sink)?;
                }
            }
            flush_part(&mut part, sink)?;
            drop(dropped);
            Ok(base)
        }))
    }

    /// Every timer, in no particular order.
    #[cfg(test)]
    pub(super) fn contents(&mut self) -> Vec<(Timestamp, K)> {
        if let Some(table) = &mut self.table {
            return table.contents();
        }
        self.index.iter().flat_map(|(time, keys)| keys.keys().map(move |k| (time, k.clone()))).collect()
    }

    /// Loads timers from a checkpoint.
    ///
    /// # Errors
    /// [`Error::State`] for entries that do not decode.
    pub fn import(&mut self, entries: Entries, operator: &str) -> Result<()> {
        self.import_part(&entry_refs(&entries), &[], operator)
    }

    /// Loads a part of a checkpoint: deletes `removed`, then sets `entries`
    /// (see [`ValueStore::import_part`]).
    ///
    /// # Errors
    /// As [`TimerState::import`].
    pub fn import_part(&mut self, entries: &[EntryRef<'_>], removed: &[RemovedRef<'_>], operator: &str) -> Result<()> {
        if let Some(table) = &mut self.table {
            return table.import_part(entries, removed);
        }
        for &(group, key) in removed {
            let (time, k) = crate::codec::key::decode::<(Timestamp, K)>(key).map_err(|e| key_error(operator, e))?;
            self.delete(time, group, &k)?;
        }
        for &(group, key, _) in entries {
            let (time, k) = crate::codec::key::decode::<(Timestamp, K)>(key).map_err(|e| key_error(operator, e))?;
            self.register(time, group, &k)?;
        }
        Ok(())
    }
}

/// Timers taken because they are due: their time, and each key with its key group.
pub type DueTimers<K> = (Timestamp, Vec<(K, u16)>);

/// Keys due at one time, with their key groups.
pub(super) type DueKeys<K> = hashbrown::HashMap<K, u16, FxBuildHasher>;

/// Timers removed in one epoch: (time, key, key group).
pub(super) type RemovedTimers<K> = Vec<(Timestamp, K, u16)>;

/// What incremental checkpoints of timers need (as for windows): the epoch
/// timers set now are stamped with, which checkpoint a delta may build on,
/// and the timers removed (deleted or fired) that a complete checkpoint may
/// hold, per epoch.
pub(super) struct TimerLog<K> {
    epoch: u32,
    since_full: u32,
    /// The first base exported since the log was last dropped (`None`: the
    /// next snapshot is a base, and nothing needs logging until then).
    first_base: Option<u64>,
    /// Removals of past epochs, shared with the checkpoints that write them.
    removed: Vec<(u32, Arc<RemovedTimers<K>>)>,
    /// Removals of this epoch.
    current: RemovedTimers<K>,
    /// Timers in `removed`.
    removed_len: usize,
}

impl<K> Default for TimerLog<K> {
    fn default() -> Self {
        Self { epoch: 0, since_full: 0, first_base: None, removed: Vec::new(), current: Vec::new(), removed_len: 0 }
    }
}

impl<K> TimerLog<K> {
    /// Whether removing a timer set in epoch `stamp` must be logged: a
    /// timer set since the last barrier is in no checkpoint.
    fn logs(&self, stamp: u32) -> bool {
        self.first_base.is_some() && stamp < self.epoch
    }

    /// Logs a removal; when the log outgrows the `live` timers (and
    /// [`WINDOW_LOG_MIN`]), a delta would outweigh a base: the log is
    /// dropped and the next snapshot is a base.
    fn push(&mut self, time: Timestamp, key: K, group: u16, live: usize) {
        self.current.push((time, key, group));
        if self.removed_len + self.current.len() > live.max(WINDOW_LOG_MIN) {
            self.first_base = None;
            self.removed.clear();
            self.current.clear();
            self.removed_len = 0;
        }
    }
}

/// Event-time timers per key: "call me back for key `k` when the watermark
/// reaches `t`". Windows keep their firing and clean-up times here, and
/// keyed `process` functions register their own.
///
/// Timers are kept in memory, in an index ordered by time, or, on a
/// backend that asks for it ([`StateBackend::timers_in_table`]: fjall,
/// when built with `FjallOptions::with_timers_on_disk`),
/// in its table, ordered by time within each key group, behind the
/// backend's cache of live values, with only each key group's first few
/// timers in memory besides. Both are checkpointed
/// incrementally, with the same entries (an entry's key
/// is the time, in the order-preserving key encoding, then the encoded
/// key; it has no value).
pub struct TimerState<K> {
    /// Per time, its keys, in chunks shared with the checkpoint being
    /// written, if any (see [`TimeIndex`]).
    index: TimeIndex<K>,
    len: usize,
    log: TimerLog<K>,
    /// On a byte backend: the timers, in its table (the fields above
    /// stay empty).
    table: Option<Box<timers::TableTimers<K>>>,
}

impl<K> fmt::Debug for TimerState<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimerState")
            .field("timers", &self.table.as_ref().map_or(self.len, |t| t.len()))
            .finish_non_exhaustive()
    }
}

impl<K: Key> TimerState<K> {
    /// Opens the timers `scope` names on `backend`: in its table if it
    /// asks for that ([`StateBackend::timers_in_table`]), in memory
    /// otherwise.
    ///
    /// # Errors
    /// [`Error::State`] when the backend cannot open the table.
    pub fn open(backend: &dyn StateBackend, scope: &StateScope) -> Result<Self> {
        let table = if backend.keeps_objects() || !backend.timers_in_table() {
            None
        } else {
            Some(Box::new(timers::TableTimers::open(backend, scope)?))
        };
        Ok(Self { index: TimeIndex::default(), len: 0, log: TimerLog::default(), table })
    }

    /// Registers a timer for `key` (of key group `group`) at `time`;
    /// registering the same one twice keeps one.
    ///
    /// # Errors
    /// [`Error::State`] when a byte backend fails.
    #[inline]
    pub fn register(&mut self, time: Timestamp, group: u16, key: &K) -> Result<()> {
        if let Some(table) = &mut self.table {
            return table.register(time, group, key);
        }
        if self.index.insert(time, key, (group, self.log.epoch)) {
            self.len += 1;
        }
        Ok(())
    }

    /// Removes the timer for `key` (of key group `group`) at `time`, if
    /// there is one.
    ///
    /// # Errors
    /// [`Error::State`] when a byte backend fails.
    pub fn delete(&mut self, time: Timestamp, group: u16, key: &K) -> Result<()> {
        if let Some(table) = &mut self.table {
            return table.delete(time, group, key);
        }
        let Some((group, stamp)) = self.index.remove(time, key) else { return Ok(()) };
        self.len -= 1;
        if self.log.logs(stamp) {
            self.log.push(time, key.clone(), group, self.len);
        }
        Ok(())
    }

    /// The earliest time any timer is set for.
    #[inline]
    pub fn next_time(&self) -> Option<Timestamp> {
        if let Some(table) = &self.table {
            return table.next_time();
        }
        self.index.first_time()
    }

    /// How many timers are set.
    pub fn len(&self) -> usize {
        self.table.as_ref().map_or(self.len, |t| t.len())
    }

    /// Whether no timer is set.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes every timer of the earliest time, if that time is at or below
    /// `watermark`: the time and its keys with their key groups.
    ///
    /// # Errors
    /// [`Error::State`] when a byte backend fails.
    pub fn pop_due(&mut self, watermark: Timestamp) -> Result<Option<DueTimers<K>>> {
        if let Some(table) = &mut self.table {
            return table.pop_due(watermark);
        }
        let Some((time, mut keys)) = self.index.pop_due(watermark) else { return Ok(None) };
        self.len -= keys.len();
        let mut due = Vec::with_capacity(keys.len());
        let mut push = |k: K, group: u16, stamp: u32, log: &mut TimerLog<K>, len: usize| {
            if log.logs(stamp) {
                log.push(time, k.clone(), group, len);
            }
            due.push((k, group));
        };
        for (k, (group, stamp)) in keys.drain() {
            push(k, group, stamp, &mut self.log, self.len);
        }
        // Emptied, its memory kept.
        self.index.recycle(keys);
        Ok(Some((time, due)))
    }
}

impl<K: Key> super::KeyedState for TimerState<K> {
    fn snapshot_at(&mut self, _operator: &str, at: Option<Barrier>) -> Result<Snapshot> {
        TimerState::snapshot_at(self, at)
    }

    fn import_part(&mut self, operator: &str, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        TimerState::import_part(self, entries, removed, operator)
    }

    fn stats(&self) -> super::StateStats {
        match &self.table {
            None => super::StateStats::in_memory(self.len, std::mem::size_of::<(Timestamp, K)>()),
            Some(table) => table.stats(),
        }
    }
}
