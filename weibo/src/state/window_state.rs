//! `WindowState`: accumulators per key and window.

use std::collections::BTreeMap;
use std::collections::btree_map;
use std::fmt;
use std::sync::Arc;

use hashbrown::hash_map::Entry;
use rustc_hash::FxBuildHasher;

use super::cache::CacheShare;
use super::snapshot::{
    Barrier, Entries, EntryRef, RemovedRef, Snapshot, SnapshotPart, delta_since, entry_refs, flush_part, gather,
    pass_if_full,
};
use super::spares::Shareable;
use super::timer_state::DueKeys;
use super::value::{ValueStore, codec_error, key_error};
use super::{StateBackend, StateScope};
use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::Result;
use crate::record::{CheckpointId, Timestamp};

impl<K: Key, A: Data> WindowState<K, A> {
    /// Every accumulator, for a checkpoint: key = encoded key ++ window start.
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    pub fn export(&mut self, operator: &str) -> Result<Entries> {
        Ok(gather(self.snapshot_deferred(operator)?)?.entries)
    }

    /// The state as of now, to encode later (see
    /// [`ValueStore::snapshot_deferred`]): the in-memory store shares each
    /// window's map and copies it when next written.
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    pub fn snapshot_deferred(&mut self, operator: &str) -> Result<Snapshot> {
        self.snapshot_at(operator, None)
    }

    /// The state at barrier `checkpoint`, to encode later: all of it (a
    /// base), or what changed since checkpoint `since`, the last complete
    /// one (a delta), chosen as for value state (see
    /// [`ValueStore::snapshot_changes`]), except that in memory a base is
    /// also written once the accumulators removed and not yet in a complete
    /// checkpoint outnumber both those the windows hold and 65,536 (the log
    /// of removals is then dropped; those the windows hold are counted in
    /// both halves, below, the removals in memory only). On a byte backend the windows in the table
    /// follow, as value state, after those in memory, and the two halves
    /// are a base together: when either would be one, both are.
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    pub fn snapshot_changes(
        &mut self,
        operator: &str,
        checkpoint: CheckpointId,
        since: CheckpointId,
    ) -> Result<Snapshot> {
        self.snapshot_at(operator, Some(Barrier::new(checkpoint, since)))
    }

    fn snapshot_at(&mut self, operator: &str, at: Option<Barrier>) -> Result<Snapshot> {
        let Some(spill) = self.spill.as_deref_mut() else {
            return self.snapshot_in_memory(operator, at);
        };
        // Both halves write a base, or both a delta: a restore applies
        // a base whole, in place of everything before it.
        if at.is_some()
            && (delta_since(at, self.log.first_base, self.log.since_full).is_none() || spill.values.base_at(at))
        {
            self.log.first_base = None;
            spill.values.force_base();
        }
        if let Some(at) = at {
            self.log.table_purged.retain(|(e, _)| u64::from(*e) > at.completed);
        }
        let table = spill.values.snapshot_at(at)?;
        let memory = self.snapshot_in_memory(operator, at)?;
        // The windows in memory first: a window moved to the table after a
        // removal the delta holds has its accumulators in the table's part
        // (and a window purged from the table is opened there again, see
        // `WindowLog::table_purged`).
        let operator = operator.to_string();
        Ok(Box::new(move |sink| {
            let base = memory(sink)?;
            if table(sink)? != base {
                return Err(crate::error::internal_error!(
                    "operator `{operator}`: the halves of a window snapshot disagree on being a base"
                ));
            }
            Ok(base)
        }))
    }

    fn snapshot_in_memory(&mut self, operator: &str, at: Option<Barrier>) -> Result<Snapshot> {
        let (windows, log) = (&mut self.windows, &mut self.log);
        let since = delta_since(at, log.first_base, log.since_full);
        let mut purged = Vec::new();
        let mut removed = Vec::new();
        if let Some(at) = at {
            log.first_base.get_or_insert(at.checkpoint);
            log.since_full = if since.is_some() { log.since_full + 1 } else { 1 };
            log.epoch = at.next_epoch();
            // Removals a complete checkpoint holds are not needed again.
            let pending = |e: u32| u64::from(e) > at.completed;
            log.purged.retain(|(e, _, _)| pending(*e));
            log.removed.retain(|(e, _, _, _)| pending(*e));
            log.removed_len = log.purged.iter().map(|(_, _, m)| m.len()).sum::<usize>() + log.removed.len();
            if since.is_some() {
                purged = log.purged.iter().map(|(_, start, map)| (*start, map.clone())).collect();
                removed = log.removed.iter().map(|(_, g, start, k)| (*g, *start, k.clone())).collect();
            }
        }
        let shared: Vec<(Timestamp, Arc<WindowMap<K, A>>)> = windows.iter_mut().map(|(s, m)| (*s, m.share())).collect();
        let operator = operator.to_string();
        let base = since.is_none();
        let key_of = |k: &K, start: Timestamp, out: &mut Vec<u8>| {
            k.encode_key(out);
            start.encode_key(out);
        };
        Ok(Box::new(move |sink| {
            // A delta's removals first: a window purged and opened again
            // (late records) has its new accumulators among the entries.
            let mut part = SnapshotPart::new(base);
            for (start, map) in &purged {
                for (k, (group, _, _)) in map.iter() {
                    key_of(k, *start, &mut part.part.removed);
                    part.part.end_removed(*group)?;
                    pass_if_full(&mut part, sink)?;
                }
            }
            for (group, start, k) in &removed {
                key_of(k, *start, &mut part.part.removed);
                part.part.end_removed(*group)?;
                pass_if_full(&mut part, sink)?;
            }
            flush_part(&mut part, sink)?;
            // Parts of one window each (of many key groups).
            for (start, map) in shared {
                for (k, (group, acc, stamp)) in map.iter() {
                    if since.is_some_and(|s| *stamp <= s) {
                        continue;
                    }
                    key_of(k, start, &mut part.part.keys);
                    acc.encode(&mut part.part.values).map_err(|e| codec_error(&operator, e))?;
                    part.part.end_entry(*group)?;
                    pass_if_full(&mut part, sink)?;
                }
                flush_part(&mut part, sink)?;
            }
            Ok(base)
        }))
    }

    /// Loads accumulators from a checkpoint.
    ///
    /// # Errors
    /// [`Error::State`] or [`Error::Codec`] for entries that do not decode.
    pub fn import(&mut self, entries: Entries, operator: &str) -> Result<()> {
        self.import_part(&entry_refs(&entries), &[], operator)
    }

    /// Loads a part of a checkpoint: removes `removed`, then sets `entries`
    /// (see [`ValueStore::import_part`]).
    ///
    /// # Errors
    /// As [`WindowState::import`].
    pub fn import_part(&mut self, entries: &[EntryRef<'_>], removed: &[RemovedRef<'_>], operator: &str) -> Result<()> {
        for &(group, key) in removed {
            let (k, start) = crate::codec::key::decode::<(K, Timestamp)>(key).map_err(|e| key_error(operator, e))?;
            let key_len = key.len().saturating_sub(8);
            self.update(start, group, k, key.get(..key_len).unwrap_or_default(), |slot| *slot = None)?;
        }
        for &(group, key, value) in entries {
            let (k, start) = crate::codec::key::decode::<(K, Timestamp)>(key).map_err(|e| key_error(operator, e))?;
            let acc = A::decode(value).map_err(|e| codec_error(operator, e))?;
            let key_len = key.len().saturating_sub(8);
            self.update(start, group, k, key.get(..key_len).unwrap_or_default(), |slot| *slot = Some(acc))?;
        }
        Ok(())
    }
}
/// One window's accumulators in memory: key → (key group, accumulator,
/// epoch of its last change).
pub(super) type WindowMap<K, A> = hashbrown::HashMap<K, (u16, A, u32), FxBuildHasher>;

/// A window purged: the epoch, its start, and its accumulators (whose keys
/// deltas remove).
pub(super) type PurgedWindow<K, A> = (u32, Timestamp, Arc<WindowMap<K, A>>);

/// What incremental checkpoints of in-memory windows need: the epoch
/// changes are stamped with, which checkpoint a delta may build on, and
/// what was removed since the last complete checkpoint (whole windows
/// purged, single accumulators removed), each with its epoch.
pub(super) struct WindowLog<K, A> {
    epoch: u32,
    since_full: u32,
    /// The first base exported since the log was last dropped: a delta
    /// needs a complete checkpoint at or after it. `None`: the next snapshot
    /// is a base, and nothing needs logging until then.
    first_base: Option<u64>,
    purged: Vec<PurgedWindow<K, A>>,
    removed: Vec<(u32, u16, Timestamp, K)>,
    /// Accumulators in `purged` and `removed`.
    removed_len: usize,
    /// Accumulators in the open windows (in memory and, on a byte
    /// backend, in the table).
    live: usize,
    /// Windows purged from a byte backend's table (`Spill`) since the last
    /// complete checkpoint, with the epoch: the table's part of a delta
    /// removes their keys, and comes after the part of the windows in
    /// memory, so a window opened again at one of these starts goes to the
    /// table too (in memory, its new accumulators would be removed again
    /// on restore).
    table_purged: Vec<(u32, Timestamp)>,
}

impl<K, A> Default for WindowLog<K, A> {
    fn default() -> Self {
        Self {
            epoch: 0,
            since_full: 0,
            first_base: None,
            purged: Vec::new(),
            removed: Vec::new(),
            removed_len: 0,
            live: 0,
            table_purged: Vec::new(),
        }
    }
}

impl<K, A> WindowLog<K, A> {
    /// Whether removals are logged: once a base has been exported.
    fn logging(&self) -> bool {
        self.first_base.is_some()
    }

    /// `n` more accumulators removed. When the log holds more than the
    /// windows do, a delta would outweigh a base: the log is dropped and
    /// the next snapshot is a base (windows that fire soon after they open,
    /// like short tumbling windows, are written whole).
    fn grew(&mut self, n: usize) {
        self.removed_len += n;
        if self.removed_len > self.live.max(WINDOW_LOG_MIN) {
            self.first_base = None;
            self.purged.clear();
            self.removed.clear();
            self.removed_len = 0;
            self.table_purged.clear();
        }
    }
}

/// Removals a window log holds before it may give up on deltas (few in
/// tests, so that they give up often).
#[cfg(not(test))]
pub(super) const WINDOW_LOG_MIN: usize = super::SNAPSHOT_PART;

impl<K: Key, A: Data> super::KeyedState for WindowState<K, A> {
    fn snapshot_at(&mut self, operator: &str, at: Option<Barrier>) -> Result<Snapshot> {
        WindowState::snapshot_at(self, operator, at)
    }

    fn import_part(&mut self, operator: &str, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        WindowState::import_part(self, entries, removed, operator)
    }

    fn stats(&self) -> super::StateStats {
        let memory = super::StateStats::in_memory(
            self.windows.values().map(|w| w.len()).sum(),
            std::mem::size_of::<(K, (u16, A, u32))>(),
        );
        match &self.spill {
            None => memory,
            Some(spill) => {
                let table = spill.values.stats();
                super::StateStats {
                    memory_entries: memory.memory_entries + table.memory_entries,
                    memory_bytes: spill.held as u64 + table.memory_bytes,
                    ..table
                }
            }
        }
    }
}

#[cfg(test)]
pub(super) const WINDOW_LOG_MIN: usize = 4;

/// [`WindowState::update`] within the map of the window at `start`:
/// the result of `f` and whether a key was inserted.
#[inline(always)]
fn update_in<K: Key, A: Data, R>(
    map: &mut WindowMap<K, A>,
    log: &mut WindowLog<K, A>,
    epoch: u32,
    start: Timestamp,
    group: u16,
    key: K,
    f: impl FnOnce(&mut Option<A>) -> R,
) -> Result<(R, bool)> {
    let mut inserted = false;
    let r = match map.entry(key) {
        Entry::Occupied(e) => {
            let mut result = None;
            let mut gone = None;
            super::flat::replace_entry_with(e, |k, (g, value, _)| {
                let mut slot = Some(value);
                result = Some(f(&mut slot));
                if slot.is_none() {
                    gone = Some((g, k.clone()));
                }
                slot.map(|v| (g, v, epoch))
            });
            if let Some((g, k)) = gone {
                log.live = log.live.saturating_sub(1);
                if log.logging() {
                    log.removed.push((epoch, g, start, k));
                    log.grew(1);
                }
            }
            result.ok_or_else(|| crate::error::internal_error!("window update closure was not called"))?
        }
        Entry::Vacant(e) => {
            let mut slot = None;
            let r = f(&mut slot);
            if let Some(value) = slot {
                e.insert((group, value, epoch));
                log.live += 1;
                inserted = true;
            }
            r
        }
    };
    Ok((r, inserted))
}

/// The map of one open window in memory, for a run of records that go
/// into it (see [`WindowState::run`]).
pub struct WindowRun<'a, K, A> {
    map: &'a mut WindowMap<K, A>,
    log: &'a mut WindowLog<K, A>,
    start: Timestamp,
    /// Whether the state keeps a budget (its maps' growth is counted).
    budget: bool,
}

impl<K: Key, A: Data> WindowRun<'_, K, A> {
    /// Whether a key can go in without growing a map whose growth the
    /// state counts (when not, the caller makes the update through
    /// [`WindowState::update`]).
    #[inline]
    pub fn has_room(&self) -> bool {
        !self.budget || self.map.len() < self.map.capacity()
    }

    /// [`WindowState::update`] of `key` in this window (after
    /// [`has_room`](Self::has_room)).
    ///
    /// # Errors
    /// As [`WindowState::update`].
    #[inline]
    pub fn update<R>(&mut self, group: u16, key: K, f: impl FnOnce(&mut Option<A>) -> R) -> Result<R> {
        let epoch = self.log.epoch;
        let (r, _) = update_in(self.map, self.log, epoch, self.start, group, key, f)?;
        Ok(r)
    }
}

/// Emptied key sets the table of spilled windows keeps for new windows.
const SPARE_KEY_SETS: usize = 8;

/// Accumulators of fixed-size (tumbling, sliding) windows, per window start
/// and key. Windows of one size fire in start order, so the window index is
/// also the timer index: no timer is stored per (key, window).
///
/// Windows are kept window-major in memory: per window start, a map of the
/// keys' accumulators, shared with the checkpoint being written, if any,
/// and copied on the first write after it. On a backend that stores bytes
/// (fjall), windows stay in memory while their maps fit the state's share
/// of the backend's object cache; past it, whole windows move to the
/// backend's table, the latest first (the earliest fire first, from
/// memory), and new windows open there until a window is purged (fires
/// and is past its allowed lateness).
pub struct WindowState<K, A> {
    windows: BTreeMap<Timestamp, Shareable<WindowMap<K, A>>>,
    /// Emptied maps of fired windows, for new windows.
    pool: Vec<WindowMap<K, A>>,
    log: WindowLog<K, A>,
    /// On a byte backend: the windows moved out of memory.
    spill: Option<Box<Spill<K, A>>>,
}

/// Windows out of memory, in a byte table by (key, window start).
struct Spill<K, A> {
    values: ValueStore<(K, Timestamp), A>,
    /// Which keys each window in `values` holds.
    index: BTreeMap<Timestamp, DueKeys<K>>,
    /// Emptied key sets of purged windows, for new windows to fill (a
    /// window's set grows to all its keys, and growing one from empty for
    /// every window rehashes it over and over).
    spare: Vec<DueKeys<K>>,
    buf: Vec<u8>,
    /// The share of the backend's object cache the windows in memory may
    /// allocate; `None` (a backend without a cache): none stays in memory.
    share: Option<CacheShare>,
    /// What the maps of the windows in memory and of the pool allocate, as
    /// last counted.
    held: usize,
    /// Whether windows moved to the table since a window (in either
    /// half) was last purged: until one is, new windows open in the
    /// table. (Any purge ends it, so that a window larger than the budget
    /// alone, moved while memory held nothing else, does not keep memory
    /// out of use for good.)
    full: bool,
}

impl<K, A> fmt::Debug for WindowState<K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowState")
            .field("windows", &self.windows.len())
            .field("spilled", &self.spill.as_ref().map(|s| s.index.len()))
            .finish_non_exhaustive()
    }
}

impl<K: Key, A: Data> WindowState<K, A> {
    /// Opens the window state `scope` names on `backend`.
    ///
    /// # Errors
    /// [`Error::State`] when the backend cannot open it.
    /// [`Error::Graph`] when its values do not read back as written.
    pub fn open(backend: &dyn StateBackend, scope: &StateScope) -> Result<Self> {
        scope.check_values::<A>()?;
        let spill = if backend.keeps_objects() {
            None
        } else {
            Some(Box::new(Spill {
                values: ValueStore::open(backend, scope)?,
                index: BTreeMap::new(),
                spare: Vec::new(),
                buf: Vec::new(),
                share: backend.object_cache().map(CacheShare::new),
                held: 0,
                full: false,
            }))
        };
        Ok(Self { windows: BTreeMap::new(), pool: Vec::new(), log: WindowLog::default(), spill })
    }

    /// Reads and changes the accumulator of `key` (encoded: `key_bytes`,
    /// or empty to have it encoded if a window in the table needs it; of
    /// key group `group`) in the window starting at `start`; `None` left
    /// behind removes it.
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    #[inline]
    pub fn update<R>(
        &mut self,
        start: Timestamp,
        group: u16,
        key: K,
        key_bytes: &[u8],
        f: impl FnOnce(&mut Option<A>) -> R,
    ) -> Result<R> {
        if let Some(spill) = self.spill.as_deref_mut()
            && !self.windows.contains_key(&start)
            && spill.opens_there(start, self.pool.is_empty(), &self.log)
        {
            return spill.update(start, group, key, key_bytes, &mut self.log, f);
        }
        let (windows, pool, log) = (&mut self.windows, &mut self.pool, &mut self.log);
        let epoch = log.epoch;
        let map = match windows.entry(start) {
            btree_map::Entry::Occupied(e) => e.into_mut(),
            btree_map::Entry::Vacant(e) => {
                // A window opens for an accumulator, not for nothing (a
                // removal restored after the window was purged).
                let mut slot = None;
                let r = f(&mut slot);
                let Some(value) = slot else { return Ok(r) };
                let mut map = pool.pop().unwrap_or_default();
                let before = map.allocation_size();
                map.insert(key, (group, value, epoch));
                log.live += 1;
                e.insert(Shareable::Own(map));
                if self.spill.is_some() {
                    self.grown(start, before)?;
                }
                return Ok(r);
            }
        }
        .make_mut();
        // With a budget to keep: what the map allocates, if an insert
        // would grow it.
        let growing = (self.spill.is_some() && map.len() == map.capacity()).then(|| map.allocation_size());
        let (r, inserted) = update_in(map, log, epoch, start, group, key, f)?;
        if let Some(before) = growing.filter(|_| inserted) {
            self.grown(start, before)?;
        }
        Ok(r)
    }

    /// The window at `start`, for a run of updates, if it is open in
    /// memory (and not shared with a checkpoint, or copied now if it is).
    #[inline]
    pub fn run(&mut self, start: Timestamp) -> Option<WindowRun<'_, K, A>> {
        let budget = self.spill.is_some();
        let map = self.windows.get_mut(&start)?.make_mut();
        Some(WindowRun { map, log: &mut self.log, start, budget })
    }

    /// After an insert that may have grown the map of the window at
    /// `start` (from `before` bytes): counts it, and moves windows to the
    /// table if over the budget.
    #[cold]
    #[inline(never)]
    fn grown(&mut self, start: Timestamp, before: usize) -> Result<()> {
        let Some(spill) = self.spill.as_deref_mut() else { return Ok(()) };
        let after = self.windows.get(&start).map_or(before, |m| m.allocation_size());
        spill.held = (spill.held + after).saturating_sub(before);
        let limit = spill.limit();
        if spill.held <= limit {
            return Ok(());
        }
        // Emptied maps go first, then whole windows, the latest first,
        // until a quarter below the limit (so that moves come in batches).
        // Counted again from the maps: a map copied for a checkpoint may
        // differ from the one it replaced.
        self.pool.clear();
        spill.held = self.windows.values().map(|m| m.allocation_size()).sum();
        while spill.held > limit - limit / 4
            && let Some((start, map)) = self.windows.pop_last()
        {
            spill.held = spill.held.saturating_sub(map.allocation_size());
            spill.full = true;
            spill.take_in(start, map)?;
        }
        Ok(())
    }

    /// The start of the earliest window holding anything.
    #[inline]
    pub fn first_window(&self) -> Option<Timestamp> {
        let memory = self.windows.first_key_value().map(|(s, _)| *s);
        match self.spill.as_deref().and_then(|s| s.index.first_key_value()) {
            Some((s, _)) => Some(memory.map_or(*s, |m| m.min(*s))),
            None => memory,
        }
    }

    /// The first window holding anything that starts at or after `from`.
    pub fn first_window_from(&self, from: Timestamp) -> Option<Timestamp> {
        let memory = self.windows.range(from..).next().map(|(s, _)| *s);
        match self.spill.as_deref().and_then(|s| s.index.range(from..).next()) {
            Some((s, _)) => Some(memory.map_or(*s, |m| m.min(*s))),
            None => memory,
        }
    }

    /// The starts of the windows holding anything, from `from` on, in order.
    pub fn windows_from(&self, from: Timestamp) -> Vec<Timestamp> {
        let mut starts: Vec<Timestamp> = self.windows.range(from..).map(|(s, _)| *s).collect();
        if let Some(spill) = self.spill.as_deref()
            && !spill.index.is_empty()
        {
            starts.extend(spill.index.range(from..).map(|(s, _)| *s));
            starts.sort_unstable();
        }
        starts
    }

    /// Calls `f` with every key, key group and accumulator of the window
    /// starting at `start`; with `purge`, removes the window.
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    pub fn for_each_in_window(&mut self, start: Timestamp, purge: bool, mut f: impl FnMut(&K, u16, &A)) -> Result<()> {
        if let Some(spill) = self.spill.as_deref_mut()
            && !self.windows.contains_key(&start)
        {
            return spill.for_each_in_window(start, purge, &mut self.log, f);
        }
        let (windows, pool, log) = (&mut self.windows, &mut self.pool, &mut self.log);
        if !purge {
            if let Some(map) = windows.get(&start) {
                for (k, (g, a, _)) in map.iter() {
                    f(k, *g, a);
                }
            }
            return Ok(());
        }
        let Some(map) = windows.remove(&start) else { return Ok(()) };
        for (k, (g, a, _)) in map.iter() {
            f(k, *g, a);
        }
        log.live = log.live.saturating_sub(map.len());
        let size = map.allocation_size();
        let pooled = if log.logging() && !map.is_empty() {
            // Its keys are removed in the next deltas.
            let n = map.len();
            log.purged.push((log.epoch, start, map.into_shared()));
            log.grew(n);
            false
        } else if let Some(mut map) = map.into_owned() {
            // Reuse the map unless a checkpoint still reads it.
            map.clear();
            pool.push(map);
            true
        } else {
            false
        };
        // A pooled map still holds its allocation; the others leave the
        // budget (a log's or a checkpoint's now).
        if let Some(spill) = self.spill.as_deref_mut() {
            spill.full = false;
            if !pooled {
                spill.held = spill.held.saturating_sub(size);
            }
        }
        Ok(())
    }
}

impl<K: Key, A: Data> Spill<K, A> {
    /// The bytes the windows in memory may allocate now.
    fn limit(&self) -> usize {
        self.share.as_ref().map_or(0, CacheShare::limit)
    }

    /// Whether the window at `start`, not in memory, is (or opens) in the
    /// table: it is there already, or memory is full (windows moved out
    /// and none purged since, or the budget reached, and no emptied map at
    /// hand), or it was purged from the table since the
    /// last complete checkpoint (see [`WindowLog::table_purged`]).
    #[inline]
    fn opens_there(&self, start: Timestamp, no_pooled_map: bool, log: &WindowLog<K, A>) -> bool {
        self.index.contains_key(&start)
            || (no_pooled_map && (self.full || self.held >= self.limit()))
            || log.table_purged.iter().any(|(_, s)| *s == start)
    }

    /// [`WindowState::update`] of a window in the table (kept out of the
    /// in-memory backend's path).
    #[inline(never)]
    fn update<R>(
        &mut self,
        start: Timestamp,
        group: u16,
        key: K,
        key_bytes: &[u8],
        log: &mut WindowLog<K, A>,
        f: impl FnOnce(&mut Option<A>) -> R,
    ) -> Result<R> {
        self.buf.clear();
        if key_bytes.is_empty() {
            // A record from a hash edge inside the process: no key bytes.
            key.encode_key(&mut self.buf);
        } else {
            self.buf.extend_from_slice(key_bytes);
        }
        start.encode_key(&mut self.buf);
        let k = key.clone();
        let (r, present) = self.values.update(group, (key, start), &self.buf, |slot| {
            let r = f(slot);
            (r, slot.is_some())
        })?;
        if present {
            if self.keys(start).insert(k, group).is_none() {
                log.live += 1;
            }
        } else if let Some(keys) = self.index.get_mut(&start)
            && keys.remove(&k).is_some()
        {
            log.live = log.live.saturating_sub(1);
        }
        Ok(r)
    }

    /// The key set of the window at `start`, opened if need be.
    fn keys(&mut self, start: Timestamp) -> &mut DueKeys<K> {
        let spare = &mut self.spare;
        self.index.entry(start).or_insert_with(|| spare.pop().unwrap_or_default())
    }

    /// Moves the window at `start` from memory into the table (its keys
    /// are stamped as changed there, and the next delta sets them in the
    /// table's part).
    fn take_in(&mut self, start: Timestamp, map: Shareable<WindowMap<K, A>>) -> Result<()> {
        let put = |this: &mut Self, k: K, g: u16, a: A| -> Result<()> {
            this.buf.clear();
            k.encode_key(&mut this.buf);
            start.encode_key(&mut this.buf);
            // A checkpoint may hold it (from memory): removed again, its
            // removal must reach the next delta.
            this.values.put_carried(g, (k.clone(), start), &this.buf, a)?;
            this.keys(start).insert(k, g);
            Ok(())
        };
        // Opened even if empty: the window holds on until it is purged.
        self.keys(start);
        match Arc::try_unwrap(map.into_shared()) {
            Ok(map) => map.into_iter().try_for_each(|(k, (g, a, _))| put(self, k, g, a)),
            // A checkpoint still reads it: copied.
            Err(map) => map.iter().try_for_each(|(k, (g, a, _))| put(self, k.clone(), *g, a.clone())),
        }
    }

    /// [`WindowState::for_each_in_window`] of a window in the table (or
    /// of none).
    fn for_each_in_window(
        &mut self,
        start: Timestamp,
        purge: bool,
        log: &mut WindowLog<K, A>,
        mut f: impl FnMut(&K, u16, &A),
    ) -> Result<()> {
        let keys: Vec<(K, u16)> = match self.index.get(&start) {
            Some(keys) => keys.iter().map(|(k, g)| (k.clone(), *g)).collect(),
            None => return Ok(()),
        };
        for (k, g) in keys {
            self.buf.clear();
            k.encode_key(&mut self.buf);
            start.encode_key(&mut self.buf);
            // A read is not a change: it neither stamps nor caches.
            let value = if purge {
                self.values.update(g, (k.clone(), start), &self.buf, Option::take)?
            } else {
                self.values.get(g, &(k.clone(), start), &self.buf)?
            };
            if let Some(a) = value {
                f(&k, g, &a);
            }
        }
        if purge && let Some(mut keys) = self.index.remove(&start) {
            self.full = false;
            log.live = log.live.saturating_sub(keys.len());
            if log.logging() {
                log.table_purged.push((log.epoch, start));
            }
            keys.clear();
            if self.spare.len() < SPARE_KEY_SETS {
                self.spare.push(keys);
            }
        }
        Ok(())
    }
}

#[cfg(all(test, feature = "fjall"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::state::FjallBackend;

    /// Where each window of `w` is: in memory, or in the table.
    fn halves(w: &WindowState<u64, u64>) -> (Vec<Timestamp>, Vec<Timestamp>) {
        let table = w.spill.as_ref().map(|s| s.index.keys().copied().collect()).unwrap_or_default();
        (w.windows.keys().copied().collect(), table)
    }

    /// A window state on fjall in `dir` with a 32 KiB object cache: two
    /// shares, 16 KiB for the windows in memory, about 600 accumulators of
    /// 24 bytes (a map doubles as it grows).
    fn open_small(dir: &tempfile::TempDir) -> (FjallBackend, WindowState<u64, u64>) {
        let backend = FjallBackend::builder(dir.path()).with_object_cache(32 << 10).open().unwrap();
        let scope = StateScope {
            job: "j".into(),
            operator: "op".into(),
            state: "w".into(),
            key_groups: 0..1,
            max_key_groups: 1,
        };
        let w = WindowState::open(&backend, &scope).unwrap();
        (backend, w)
    }

    #[test]
    fn past_the_budget_windows_move_whole_and_new_ones_open_in_the_table_until_one_fires() {
        let dir = tempfile::tempdir().unwrap();
        let (_backend, mut w) = open_small(&dir);
        let add = |w: &mut WindowState<u64, u64>, start: Timestamp, keys: std::ops::Range<u64>| {
            for k in keys {
                let kb = crate::codec::key::encode(&k);
                w.update(start, 0, k, &kb, |acc| *acc = Some(acc.unwrap_or(0) + k)).unwrap();
            }
        };
        add(&mut w, 0, 0..100);
        add(&mut w, 1000, 0..100);
        assert_eq!(halves(&w), (vec![0, 1000], vec![]), "within the budget, windows stay in memory");
        // Window 2000 outgrows the budget: it moves, the latest first.
        add(&mut w, 2000, 0..1000);
        assert_eq!(halves(&w), (vec![0, 1000], vec![2000]));
        // Memory is full until a window fires: a new window opens
        // in the table.
        add(&mut w, 3000, 0..10);
        assert_eq!(halves(&w), (vec![0, 1000], vec![2000, 3000]));
        let mut sum = 0;
        w.for_each_in_window(0, true, |_, _, acc| sum += acc).unwrap();
        assert_eq!(sum, (0..100).sum::<u64>());
        add(&mut w, 4000, 0..10);
        assert_eq!(halves(&w), (vec![1000, 4000], vec![2000, 3000]), "a window fired: room again");
        // Every accumulator reads back, wherever it is.
        for (start, n) in [(1000, 100), (2000, 1000), (3000, 10), (4000, 10)] {
            let mut seen = 0;
            w.for_each_in_window(start, false, |k, _, acc| {
                assert_eq!(k, acc);
                seen += 1;
            })
            .unwrap();
            assert_eq!(seen, n, "window {start}");
        }
        assert_eq!(w.first_window(), Some(1000));
        assert_eq!(w.windows_from(0), vec![1000, 2000, 3000, 4000]);
    }

    /// Updates through a run (as the window operator makes them for the
    /// records after the first of a window) keep the budget as updates one
    /// by one do: a run gives way when an insert would grow a map.
    #[test]
    fn updates_through_a_run_keep_the_budget_as_single_updates_do() {
        let dir = tempfile::tempdir().unwrap();
        let (_backend, mut w) = open_small(&dir);
        let add = |w: &mut WindowState<u64, u64>, start: Timestamp, keys: std::ops::Range<u64>| {
            let mut through_runs = 0;
            for k in keys {
                if let Some(mut run) = w.run(start)
                    && run.has_room()
                {
                    run.update(0, k, |acc| *acc = Some(acc.unwrap_or(0) + k)).unwrap();
                    through_runs += 1;
                    continue;
                }
                let kb = crate::codec::key::encode(&k);
                w.update(start, 0, k, &kb, |acc| *acc = Some(acc.unwrap_or(0) + k)).unwrap();
            }
            through_runs
        };
        assert!(add(&mut w, 0, 0..100) > 90, "a window in memory takes its updates through runs");
        add(&mut w, 1000, 0..100);
        assert_eq!(halves(&w), (vec![0, 1000], vec![]));
        add(&mut w, 2000, 0..1000);
        assert_eq!(halves(&w), (vec![0, 1000], vec![2000]), "the window that outgrew the budget moved");
        assert_eq!(add(&mut w, 3000, 0..10), 0, "a window in the table has no run");
        assert_eq!(halves(&w), (vec![0, 1000], vec![2000, 3000]));
        for (start, n) in [(0, 100u64), (1000, 100), (2000, 1000), (3000, 10)] {
            let (mut seen, mut sum) = (0, 0);
            w.for_each_in_window(start, false, |k, _, acc| {
                assert_eq!(k, acc);
                seen += 1;
                sum += acc;
            })
            .unwrap();
            assert_eq!((seen, sum), (n, (0..n).sum::<u64>()), "window {start}");
        }
    }

    #[test]
    fn a_window_larger_than_the_budget_alone_leaves_memory_usable_once_one_is_purged() {
        let dir = tempfile::tempdir().unwrap();
        let (_backend, mut w) = open_small(&dir);
        for k in 0..1000 {
            w.update(0, 0, k, &crate::codec::key::encode(&k), |acc| *acc = Some(k)).unwrap();
        }
        w.update(1000, 0, 1, &crate::codec::key::encode(&1u64), |acc| *acc = Some(1)).unwrap();
        assert_eq!(halves(&w), (vec![], vec![0, 1000]), "moved alone; the next opens in the table");
        w.for_each_in_window(0, true, |_, _, _| {}).unwrap();
        w.update(2000, 0, 1, &crate::codec::key::encode(&1u64), |acc| *acc = Some(1)).unwrap();
        assert_eq!(halves(&w), (vec![2000], vec![1000]), "a purge from the table makes room again");
    }
}
