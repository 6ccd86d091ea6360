//! The write-back cache of live objects in front of a byte table.
//!
//! A backend that stores bytes (fjall) would otherwise pay a table read, a
//! decode, an encode and a table write on every state access. With a cache
//! ([`StateBackend::object_cache`](super::StateBackend::object_cache)), a
//! value state keeps recently used values as live objects, per key group,
//! like the in-memory backend, and goes to the table only on a miss (a read,
//! skipped for key groups the table holds nothing of) and when the cache is
//! over its budget (whole key groups are written back in one batch and
//! dropped, in turn).
//!
//! Checkpoints see the table (an MVCC snapshot) with the cache's changed
//! entries laid over it, both taken at the barrier: the cache's per-group
//! maps are shared with the checkpoint as in memory (the worker writes
//! beside a map still shared, in an overlay, and the checkpoint's thread
//! copies the maps the worker flags; see [`Holding`]). Entries written back are logged with
//! their epoch while changes are tracked, so a delta needs no table reads.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hashbrown::hash_map::Entry;

use super::snapshot::{flush_part, pass_if_full};
use super::spares::{Held, Holding, Shareable, Spares, Wanted};
use super::value::{ChangeLog, ChangedKeys, OVERLAY_MIN};
use super::{ObjectMap, Snapshot, SnapshotPart, SnapshotSink, StateTable};
use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::{Error, Result};

/// The memory a backend's value caches may use together, shared by every
/// state opened on it.
///
/// The budget counts what the caches' hash maps allocate (a map doubles
/// when it grows; each entry takes its inline size: key, value and
/// bookkeeping, plus the map's control byte), not what a `String` or `Vec`
/// inside an entry points to. It is split evenly between the states that
/// are open; a window state takes two shares, one for its windows in
/// memory and one for the cache in front of the windows it moved to the
/// table. Maps a checkpoint still holds are outside it, and so are the
/// windows an in-memory window state purged since the last complete
/// checkpoint, whose keys its next delta removes. It does not cover the log of values written back since the
/// last complete checkpoint, which incremental checkpoints need: that log
/// grows with the write-backs between two complete checkpoints (at most an
/// encoded copy of every key written back, while checkpoints keep failing).
#[derive(Debug)]
pub struct ObjectCache {
    bytes: usize,
    states: AtomicUsize,
}

impl ObjectCache {
    /// A budget of `bytes` for all cached values together (0: no values
    /// are kept between accesses; every update reads and writes the table).
    pub fn new(bytes: usize) -> Self {
        Self { bytes, states: AtomicUsize::new(0) }
    }

    /// The budget, in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// How many bytes one of the open states may allocate.
    fn limit(&self) -> usize {
        self.bytes / self.states.load(Ordering::Relaxed).max(1)
    }
}

/// A share of a backend's object cache taken by memory outside a
/// [`CacheStore`] (a window state's windows in memory): it counts as one
/// more state in the split while it lives.
pub(super) struct CacheShare(Arc<ObjectCache>);

impl CacheShare {
    pub(super) fn new(cache: Arc<ObjectCache>) -> Self {
        cache.states.fetch_add(1, Ordering::Relaxed);
        Self(cache)
    }

    /// How many bytes the share may allocate now.
    #[inline]
    pub(super) fn limit(&self) -> usize {
        self.0.limit()
    }
}

impl Drop for CacheShare {
    fn drop(&mut self) {
        self.0.states.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A value in the cache. Only [`super::ValueStore::update`] brings a value
/// into the cache, so every cached value is taken to differ from the
/// table's, and is written back.
#[derive(Clone)]
pub(super) struct CachedValue<V> {
    /// The value; `None`: removed, to be deleted from the table.
    value: Option<V>,
    /// The epoch it last changed in.
    stamp: u32,
    /// The epoch it entered the cache in.
    born: u32,
    /// Whether the table may hold the key.
    stored: bool,
}

type CacheMap<K, V> = ObjectMap<K, CachedValue<V>>;

type CacheOverlay<K, V> = ObjectMap<K, Option<CachedValue<V>>>;

/// What an update did to a cached entry.
#[derive(PartialEq, Eq)]
enum Outcome {
    /// Absent before and after.
    Unchanged,
    Changed,
    /// Removed, created since the barrier and never written back: no
    /// checkpoint and no table holds it, so the entry goes.
    Dropped,
}

/// The epoch an entry created now is born in: `epoch`, or, for a value
/// that may be in a checkpoint already (`carried`), one before it (any
/// other than `epoch` would do: only a removal compares it with `epoch`).
#[inline]
fn born(epoch: u32, carried: bool) -> u32 {
    if carried { epoch.wrapping_sub(1) } else { epoch }
}

/// Runs `f` on a cached entry, stamping a change with `epoch`.
#[inline]
fn change<V, R>(entry: &mut CachedValue<V>, epoch: u32, f: impl FnOnce(&mut Option<V>) -> R) -> (R, Outcome) {
    let existed = entry.value.is_some();
    let r = f(&mut entry.value);
    if entry.value.is_none() && !existed {
        return (r, Outcome::Unchanged);
    }
    if entry.value.is_none() && !entry.stored && entry.born == epoch {
        return (r, Outcome::Dropped);
    }
    entry.stamp = epoch;
    (r, Outcome::Changed)
}

/// The cached store of one value state.
pub(super) struct CacheStore<K, V> {
    /// Per owned key group; shared with the checkpoint being written, if
    /// any, which copies and lets go of it once the worker writes beside
    /// it (`overlays`).
    maps: Vec<Shareable<CacheMap<K, V>>>,
    /// Per owned key group: entries written while a snapshot still shares
    /// the group's map (see the in-memory store's `Overlay`), applied to
    /// the map in place once the snapshot has let go of it; `None`: an
    /// entry to drop from the map (created and removed since the barrier,
    /// never written back). Outside the budget, as the snapshot's maps are:
    /// an overlay holds at most as many entries as its map (up to
    /// [`OVERLAY_MIN`]) plus an eighth, past which the worker copies the
    /// map instead.
    overlays: Vec<CacheOverlay<K, V>>,
    /// Per owned key group: whether the worker has written beside the map
    /// since the barrier (the snapshot copies such maps at once).
    wanted: Wanted,
    /// Maps snapshots are done with, to copy into (outside the budget: a
    /// checkpoint's copies, kept for the next one).
    spares: Spares<CacheMap<K, V>>,
    table: Box<dyn StateTable>,
    /// Per owned key group: whether the table may hold entries of it (if
    /// not, a miss needs no read).
    in_table: Vec<bool>,
    /// Bytes `maps` allocate, as last counted per key group (`counted`).
    held: usize,
    counted: Vec<usize>,
    cache: Arc<ObjectCache>,
    /// The key group to write back next (round robin).
    next: usize,
    /// Reads and updates, and those that read the table (for metrics).
    lookups: u64,
    misses: u64,
    /// The first owned key group.
    first: u16,
    operator: String,
    /// What the table holds of the key being updated, when the caller
    /// knows it without a read (a blind write or removal,
    /// [`CacheStore::blind`]):
    /// whether the key is there. Taken by the next miss.
    assume: Option<bool>,
    /// Whether the values going in now may be in a checkpoint already
    /// (accumulators of a window moved out of memory,
    /// [`super::ValueStore::put_carried`]): their entries are never taken
    /// for new since the barrier, so a removal of them is always logged.
    pub(super) carried: bool,
}

impl<K, V> Drop for CacheStore<K, V> {
    fn drop(&mut self) {
        self.cache.states.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<K, V> fmt::Debug for CacheStore<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheStore").field("held", &self.held).field("groups", &self.maps.len()).finish_non_exhaustive()
    }
}

fn codec_error(operator: &str, source: crate::codec::CodecError) -> Error {
    Error::Codec { operator: operator.to_string(), source }
}

/// How a change to the cache is stamped and logged.
pub(super) struct Stamp<'a, K> {
    /// The epoch the change is made in.
    pub(super) epoch: u32,
    /// The log of write-backs, should the change make the cache write back.
    pub(super) tracking: Tracking<'a>,
    /// While changes are tracked, the key group's log of keys changed,
    /// which hears of every entry first stamped with `epoch` (so that a
    /// delta looks those up rather than visiting every cached entry).
    pub(super) keys: Option<&'a mut ChangeLog<K>>,
}

/// What a blind change (see [`CacheStore::blind`]) does.
pub(super) enum Blind<V> {
    /// Removes a key that is set.
    Remove,
    /// Sets a key that is not.
    Put(V),
}

/// What the change log needs to hear about a write-back.
pub(super) struct Tracking<'a> {
    /// Whether changes are logged at all.
    pub(super) on: bool,
    /// Per owned key group, the log.
    pub(super) changed: &'a mut [super::value::ByteChanges],
}

impl<K: Key, V: Data> CacheStore<K, V> {
    pub(super) fn new(table: Box<dyn StateTable>, cache: Arc<ObjectCache>, groups: Range<u16>, operator: &str) -> Self {
        cache.states.fetch_add(1, Ordering::Relaxed);
        Self {
            maps: groups.clone().map(|_| Shareable::default()).collect(),
            overlays: groups.clone().map(|_| CacheOverlay::default()).collect(),
            wanted: Wanted::new(groups.len()),
            spares: Spares::new(groups.len()),
            table,
            in_table: groups.clone().map(|_| false).collect(),
            first: groups.start,
            held: 0,
            counted: groups.clone().map(|_| 0).collect(),
            cache,
            next: 0,
            lookups: 0,
            misses: 0,
            operator: operator.to_string(),
            assume: None,
            carried: false,
        }
    }

    fn no_cache(&self, group: u16) -> Error {
        crate::error::internal_error!("operator `{}` has no cache for key group {group}", self.operator)
    }

    /// What the table holds at `key_bytes` of key group `index`, and
    /// whether it holds the key (as the value, unless the caller said so
    /// beforehand: then the value is not read, `None`).
    fn read(&mut self, index: usize, group: u16, key_bytes: &[u8]) -> Result<(Option<V>, bool)> {
        if let Some(stored) = self.assume.take() {
            return Ok((None, stored));
        }
        if !self.in_table.get(index).copied().unwrap_or(true) {
            return Ok((None, false));
        }
        self.misses += 1;
        match self.table.get(group, key_bytes)? {
            Some(bytes) => V::decode(&bytes).map(|v| (Some(v), true)).map_err(|e| codec_error(&self.operator, e)),
            None => Ok((None, false)),
        }
    }

    /// Sets or removes `key` without reading the table, the caller
    /// knowing whether the key is set (cached or in the table): a blind
    /// write sets a key that is not, a blind removal removes one that is.
    /// A removal of a key only the table holds is cached as removed, and
    /// deleted from the table when written back.
    pub(super) fn blind(
        &mut self,
        index: usize,
        group: u16,
        key: K,
        key_bytes: &[u8],
        stamp: Stamp<'_, K>,
        blind: Blind<V>,
    ) -> Result<()> {
        let value = match blind {
            Blind::Remove => {
                self.assume = Some(true);
                None
            }
            Blind::Put(value) => {
                self.assume = Some(false);
                Some(value)
            }
        };
        let r = self.update(index, group, key, key_bytes, stamp, |slot| *slot = value);
        self.assume = None;
        r
    }

    /// See [`super::ValueStore::update`]; `index` is `group`'s position
    /// among the owned key groups, `stamp` how the change is stamped and
    /// logged.
    #[inline]
    pub(super) fn update<R>(
        &mut self,
        index: usize,
        group: u16,
        key: K,
        key_bytes: &[u8],
        stamp: Stamp<'_, K>,
        f: impl FnOnce(&mut Option<V>) -> R,
    ) -> Result<R> {
        let Stamp { epoch, tracking, keys } = stamp;
        self.lookups += 1;
        let (Some(map), Some(overlay)) = (self.maps.get_mut(index), self.overlays.get_mut(index)) else {
            return Err(self.no_cache(group));
        };
        if map.is_shared() && overlay.len() < OVERLAY_MIN.min(map.len()) + map.len() / 8 {
            // A snapshot still shares the map: write beside it.
            self.wanted.set(index);
            return self.overlaid_update(index, group, key, key_bytes, Stamp { epoch, tracking, keys }, f);
        }
        if !overlay.is_empty() {
            self.apply_overlay(index);
        }
        // Nothing of the key group in the table yet: a key the cache does
        // not hold is absent, and goes in where the lookup left off.
        let absent = !self.in_table.get(index).copied().unwrap_or(true);
        let born = born(epoch, self.carried);
        let Some(map) = self.maps.get_mut(index) else {
            return Err(self.no_cache(group));
        };
        let map = self.spares.make_mut(map);
        let map_len = map.len();
        let r = match map.entry(key) {
            Entry::Occupied(mut e) => {
                let entry = e.get_mut();
                if self.carried {
                    entry.born = born;
                }
                let before = entry.stamp;
                let (r, outcome) = change(entry, epoch, f);
                if outcome == Outcome::Changed
                    && before != epoch
                    && let Some(keys) = keys
                {
                    keys.record(e.key(), map_len);
                }
                if outcome == Outcome::Dropped {
                    e.remove();
                }
                r
            }
            Entry::Vacant(e) if absent => {
                let mut slot = None;
                let r = f(&mut slot);
                if slot.is_some() {
                    if let Some(keys) = keys {
                        keys.record(e.key(), map_len);
                    }
                    e.insert(CachedValue { value: slot, stamp: epoch, born, stored: false });
                    self.grown(index, tracking)?;
                }
                r
            }
            Entry::Vacant(e) => {
                // The borrow of `maps` ends before the table is read.
                let key = e.into_key();
                let (mut slot, stored) = self.read(index, group, key_bytes)?;
                let r = f(&mut slot);
                if slot.is_some() || stored {
                    if let Some(keys) = keys {
                        keys.record(&key, map_len);
                    }
                    let entry = CachedValue { value: slot, stamp: epoch, born, stored };
                    if let Some(map) = self.maps.get_mut(index) {
                        self.spares.make_mut(map).insert(key, entry);
                    }
                    self.grown(index, tracking)?;
                }
                r
            }
        };
        Ok(r)
    }

    /// [`CacheStore::update`] of a key group whose map a snapshot still
    /// shares: in its overlay.
    #[cold]
    #[inline(never)]
    fn overlaid_update<R>(
        &mut self,
        index: usize,
        group: u16,
        key: K,
        key_bytes: &[u8],
        stamp: Stamp<'_, K>,
        f: impl FnOnce(&mut Option<V>) -> R,
    ) -> Result<R> {
        // Nothing is written back here: the overlay does not count
        // against the budget until it is applied.
        let Stamp { epoch, keys, .. } = stamp;
        let born = born(epoch, self.carried);
        let (Some(map), Some(overlay)) = (self.maps.get(index), self.overlays.get_mut(index)) else {
            return Err(self.no_cache(group));
        };
        // The entry as it stands: the overlay's, else the map's.
        let found = match overlay.get_mut(&key) {
            Some(Some(entry)) => {
                if self.carried {
                    entry.born = born;
                }
                let before = entry.stamp;
                let (r, outcome) = change(entry, epoch, f);
                if outcome == Outcome::Changed
                    && before != epoch
                    && let Some(keys) = keys
                {
                    keys.record(&key, map.len());
                }
                if outcome == Outcome::Dropped {
                    overlay.insert(key, None);
                }
                return Ok(r);
            }
            // Dropped since the barrier: absent, and not in the table.
            Some(None) => Some(None),
            // The map's, if any (otherwise the table's, read below).
            None => map.get(&key).cloned().map(Some),
        };
        let (r, entry) = match found {
            Some(Some(mut entry)) => {
                if self.carried {
                    entry.born = born;
                }
                let before = entry.stamp;
                let (r, outcome) = change(&mut entry, epoch, f);
                match outcome {
                    Outcome::Unchanged => return Ok(r),
                    Outcome::Changed => {
                        if before != epoch
                            && let Some(keys) = keys
                        {
                            keys.record(&key, map.len());
                        }
                        (r, Some(entry))
                    }
                    Outcome::Dropped => (r, None),
                }
            }
            dropped_or_missing => {
                let (mut slot, stored) = match dropped_or_missing {
                    Some(None) => (None, false),
                    _ => self.read(index, group, key_bytes)?,
                };
                let r = f(&mut slot);
                if slot.is_none() && !stored {
                    return Ok(r);
                }
                if let (Some(keys), Some(map)) = (keys, self.maps.get(index)) {
                    keys.record(&key, map.len());
                }
                (r, Some(CachedValue { value: slot, stamp: epoch, born, stored }))
            }
        };
        if let Some(overlay) = self.overlays.get_mut(index) {
            overlay.insert(key, entry);
        }
        Ok(r)
    }

    /// Applies key group `index`'s overlay to its map (copying the map if
    /// a snapshot still shares it: a barrier's, after a slow snapshot).
    #[cold]
    #[inline(never)]
    fn apply_overlay(&mut self, index: usize) {
        let (Some(map), Some(overlay)) = (self.maps.get_mut(index), self.overlays.get_mut(index)) else { return };
        let overlay = std::mem::take(overlay);
        let map = self.spares.make_mut(map);
        for (key, entry) in overlay {
            match entry {
                Some(entry) => {
                    map.insert(key, entry);
                }
                None => {
                    map.remove(&key);
                }
            }
        }
        self.recount(index);
    }

    /// Counts what key group `index`'s map allocates again.
    #[inline]
    fn recount(&mut self, index: usize) {
        let size = self.maps.get(index).map_or(0, |m| m.allocation_size());
        if let Some(counted) = self.counted.get_mut(index)
            && size != *counted
        {
            self.held = self.held - *counted + size;
            *counted = size;
        }
    }

    /// After an insert into key group `index`: counts it again (only a
    /// growth reallocates) and writes back if over the budget.
    #[inline]
    fn grown(&mut self, index: usize, tracking: Tracking<'_>) -> Result<()> {
        self.recount(index);
        // The share of the budget changes as states open and close, so it
        // is read again on every insert.
        if self.held > self.cache.limit() {
            self.shrink(tracking)?;
        }
        Ok(())
    }

    /// Whether `key` is cached (for prefetching).
    #[inline]
    pub(super) fn contains(&self, index: usize, key: &K) -> bool {
        match self.overlays.get(index).and_then(|o| o.get(key)) {
            Some(entry) => entry.is_some(),
            None => self.maps.get(index).is_some_and(|m| m.contains_key(key)),
        }
    }

    /// The value of `key`, from the cache or the table (which does not
    /// bring it into the cache).
    pub(super) fn get(&mut self, index: usize, group: u16, key: &K, key_bytes: &[u8]) -> Result<Option<V>> {
        self.lookups += 1;
        if let Some(entry) = self.overlays.get(index).and_then(|o| o.get(key)) {
            return Ok(entry.as_ref().and_then(|e| e.value.clone()));
        }
        if let Some(entry) = self.maps.get(index).and_then(|m| m.get(key)) {
            return Ok(entry.value.clone());
        }
        self.read(index, group, key_bytes).map(|(value, _)| value)
    }

    /// Visits key group `index`'s entries at or after `from`, in the order
    /// of their encoded keys, the cache's laid over the table's (a removal
    /// the cache holds hides the table's entry), while `f` returns true:
    /// for a state read in order (timers).
    ///
    /// The cache's entries are in hash maps: they are encoded and sorted
    /// as far as the caller reads at most (`limit`): its `limit` first
    /// live entries, and the removals before the last of them; the table
    /// is read up to that last entry, past which the cache's order is not
    /// known.
    pub(super) fn scan_from(
        &mut self,
        index: usize,
        group: u16,
        from: &[u8],
        limit: usize,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        if limit == 0 {
            return Ok(());
        }
        // Every entry's key is encoded into one buffer (`keys`), the
        // entries point into it: no allocation per entry.
        let mut keys: Vec<u8> = Vec::new();
        let mut live: Vec<(Range<usize>, &V)> = Vec::new();
        let mut removed: Vec<Range<usize>> = Vec::new();
        let overlay = self.overlays.get(index);
        fn visit<'a, K: Key, V>(
            k: &K,
            entry: &'a CachedValue<V>,
            from: &[u8],
            keys: &mut Vec<u8>,
            live: &mut Vec<(Range<usize>, &'a V)>,
            removed: &mut Vec<Range<usize>>,
        ) {
            let start = keys.len();
            k.encode_key(keys);
            if keys.get(start..).is_some_and(|key| key >= from) {
                match &entry.value {
                    Some(v) => live.push((start..keys.len(), v)),
                    None => removed.push(start..keys.len()),
                }
            } else {
                keys.truncate(start);
            }
        }
        // The overlay's entries over the map's (an overlay's `None`: gone
        // from the map, and never in the table).
        for (k, entry) in overlay.into_iter().flat_map(|o| o.iter()) {
            if let Some(entry) = entry {
                visit(k, entry, from, &mut keys, &mut live, &mut removed);
            }
        }
        for (k, entry) in self.maps.get(index).into_iter().flat_map(|m| m.iter()) {
            if !overlay.is_some_and(|o| o.contains_key(k)) {
                visit(k, entry, from, &mut keys, &mut live, &mut removed);
            }
        }
        let encoded = |range: &Range<usize>| keys.get(range.clone()).unwrap_or_default();
        let cut = live.len() > limit;
        if cut {
            live.select_nth_unstable_by(limit - 1, |a, b| encoded(&a.0).cmp(encoded(&b.0)));
            live.truncate(limit);
        }
        live.sort_unstable_by(|a, b| encoded(&a.0).cmp(encoded(&b.0)));
        let last = if cut { live.last().map(|(k, _)| encoded(k)) } else { None };
        if let Some(last) = last {
            removed.retain(|k| encoded(k) <= last);
        }
        removed.sort_unstable_by(|a, b| encoded(a).cmp(encoded(b)));
        let (mut next, mut gone, mut stopped) = (0usize, 0usize, false);
        let mut buf = Vec::new();
        let mut failure = None;
        if self.in_table.get(index).copied().unwrap_or(true) {
            self.table.scan_from(group, from, &mut |entry, value| {
                // The cache's live entries before this one.
                while let Some((cached, v)) = live.get(next)
                    && encoded(cached) < entry
                {
                    next += 1;
                    if !emit(f, &mut buf, encoded(cached), *v, &mut failure) {
                        stopped = true;
                        return false;
                    }
                }
                if last.is_some_and(|last| entry > last) {
                    return false;
                }
                while removed.get(gone).is_some_and(|r| encoded(r) < entry) {
                    gone += 1;
                }
                if removed.get(gone).is_some_and(|r| encoded(r) == entry) {
                    return true;
                }
                let go_on = match live.get(next) {
                    Some((cached, v)) if encoded(cached) == entry => {
                        next += 1;
                        emit(f, &mut buf, encoded(cached), *v, &mut failure)
                    }
                    _ => f(entry, value),
                };
                stopped = !go_on;
                go_on
            })?;
        }
        if !stopped {
            for (cached, v) in live.get(next..).unwrap_or_default() {
                if !emit(f, &mut buf, encoded(cached), *v, &mut failure) {
                    break;
                }
            }
        }
        match failure {
            Some(e) => Err(codec_error(&self.operator, e)),
            None => Ok(()),
        }
    }

    /// What the cache holds and how often it answered (for metrics).
    pub(super) fn stats(&self) -> super::StateStats {
        super::StateStats {
            memory_entries: self.maps.iter().map(|m| m.len() as u64).sum(),
            memory_bytes: self.held as u64,
            table: self.table.size(),
            hits: self.lookups.saturating_sub(self.misses),
            misses: self.misses,
            expired: 0,
        }
    }

    /// Writes back key groups in turn until the cache is a quarter below
    /// its limit (so write-backs come in batches).
    fn shrink(&mut self, tracking: Tracking<'_>) -> Result<()> {
        let limit = self.cache.limit();
        let target = limit - limit / 4;
        let groups = self.maps.len();
        let mut tracking = tracking;
        for _ in 0..groups {
            if self.held <= target {
                break;
            }
            let index = self.next;
            self.next = (self.next + 1) % groups;
            self.write_back(index, &mut tracking)?;
        }
        Ok(())
    }

    /// Writes every cached key group back to the table and empties the cache.
    pub(super) fn write_back_all(&mut self, mut tracking: Tracking<'_>) -> Result<()> {
        for index in 0..self.maps.len() {
            self.write_back(index, &mut tracking)?;
        }
        Ok(())
    }

    /// Writes the changed entries of key group `index` back to the table
    /// (logging them, while changes are tracked) and drops its map.
    pub(super) fn write_back(&mut self, index: usize, tracking: &mut Tracking<'_>) -> Result<()> {
        let (Some(slot), Some(overlay)) = (self.maps.get_mut(index), self.overlays.get_mut(index)) else {
            return Ok(());
        };
        if slot.is_empty() && overlay.is_empty() {
            return Ok(());
        }
        // A checkpoint that shares the map keeps its own reference; the
        // overlay's entries stand for the map's.
        let map = std::mem::take(slot);
        let overlay = std::mem::take(overlay);
        if let Some(counted) = self.counted.get_mut(index) {
            self.held -= std::mem::take(counted);
        }
        let group = self.table_group(index);
        let mut writes: super::Writes = Vec::new();
        let mut log = tracking.on.then(|| tracking.changed.get_mut(index)).flatten();
        let entries = map
            .iter()
            .filter(|(k, _)| overlay.is_empty() || !overlay.contains_key(*k))
            .chain(overlay.iter().filter_map(|(k, e)| e.as_ref().map(|e| (k, e))));
        for (k, entry) in entries {
            let key = crate::codec::key::encode(k);
            let value = match &entry.value {
                Some(v) => {
                    let mut bytes = Vec::new();
                    v.encode(&mut bytes).map_err(|e| codec_error(&self.operator, e))?;
                    Some(bytes)
                }
                None => None,
            };
            if let Some(log) = log.as_mut() {
                log.log(&key, (entry.stamp, value.as_deref().map(Box::from)));
            }
            if value.is_some() || entry.stored {
                writes.push((group, key, value));
            }
        }
        if writes.iter().any(|(_, _, v)| v.is_some())
            && let Some(flag) = self.in_table.get_mut(index)
        {
            *flag = true;
        }
        self.table.apply(writes)
    }

    fn table_group(&self, index: usize) -> u16 {
        self.first.saturating_add(u16::try_from(index).unwrap_or(u16::MAX))
    }

    /// Calls `f` with every (key, value) of key group `index` in the table,
    /// after writing the group back.
    pub(super) fn scan(
        &mut self,
        index: usize,
        mut tracking: Tracking<'_>,
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<()> {
        self.write_back(index, &mut tracking)?;
        let group = self.table_group(index);
        self.table.scan_group(group, f)
    }

    /// Loads a part of a checkpoint (already checked) into the table, after
    /// writing the cache back: `removed` first, then `entries`.
    pub(super) fn import(
        &mut self,
        entries: &[super::EntryRef<'_>],
        removed: &[super::RemovedRef<'_>],
        tracking: Tracking<'_>,
    ) -> Result<()> {
        self.write_back_all(tracking)?;
        if !removed.is_empty() {
            self.table.apply(removed.iter().map(|(g, k)| (*g, k.to_vec(), None)).collect())?;
        }
        for (group, _, _) in entries {
            if let Some(flag) = group.checked_sub(self.first).and_then(|i| self.in_table.get_mut(usize::from(i))) {
                *flag = true;
            }
        }
        self.table.put_all(entries)
    }

    /// Every entry as of now (a base), to encode later: a snapshot of the
    /// table with the cache's entries laid over it, a key group at a time
    /// (the table's export passes each key group's entries in order): when
    /// the snapshot reaches a key group, the cache's values of it are
    /// encoded, then the table's entries the cache does not hold are copied.
    pub(super) fn snapshot_base(&mut self, groups: Range<u16>) -> Result<Snapshot> {
        let snapshot = self.table.snapshot_deferred(groups)?;
        let mut maps = self.share();
        let (first, operator) = (self.first, self.operator.clone());
        Ok(Box::new(move |sink| {
            let mut out = SnapshotPart::new(true);
            // The cache of the key group the snapshot is in, and the index
            // of the next key group whose cache is not passed on yet.
            let mut open: Option<(u16, Held<CacheMap<K, V>>)> = None;
            let mut next = 0usize;
            let mut failure = None;
            let base = snapshot(&mut |part: &SnapshotPart| {
                let Some(group) = part.part.groups.first().copied() else { return Ok(()) };
                let index = usize::from(group.saturating_sub(first));
                if open.as_ref().is_none_or(|(g, _)| *g != group) {
                    if index < next || index >= maps.len() {
                        failure.get_or_insert(group);
                        return Ok(());
                    }
                    if let Some((_, held)) = open.take() {
                        maps.done(held);
                    }
                    // Key groups before this one, which the table holds
                    // nothing of: their caches alone.
                    while next < index {
                        let held = maps.take(next);
                        cached(first.saturating_add(next as u16), next, &held, &mut maps, &mut out, sink, &operator)?;
                        maps.done(held);
                        next += 1;
                    }
                    let held = maps.take(index);
                    cached(group, index, &held, &mut maps, &mut out, sink, &operator)?;
                    next = index + 1;
                    open = Some((group, held));
                }
                let Some((_, held)) = open.as_ref() else { return Ok(()) };
                let Some(map) = held.map() else { return Ok(()) };
                for (n, (g, key, value)) in part.part.entries().enumerate() {
                    if g != group {
                        failure.get_or_insert(g);
                        break;
                    }
                    if n % 4_096 == 4_095 {
                        maps.release(index);
                    }
                    if map.is_empty() {
                        out.part.push(group, key, value)?;
                        pass_if_full(&mut out, sink)?;
                        continue;
                    }
                    let k = crate::codec::key::decode::<K>(key).map_err(|e| Error::State {
                        operator: operator.clone(),
                        message: "a stored key does not decode".into(),
                        source: Some(e.into()),
                    })?;
                    if !map.contains_key(&k) {
                        out.part.push(group, key, value)?;
                        pass_if_full(&mut out, sink)?;
                    }
                }
                Ok(())
            })?;
            if let Some(group) = failure {
                return Err(crate::error::internal_error!(
                    "operator `{operator}`: the table exported key group {group} out of order"
                ));
            }
            if let Some((_, held)) = open.take() {
                maps.done(held);
            }
            for index in next..maps.len() {
                let held = maps.take(index);
                cached(first.saturating_add(index as u16), index, &held, &mut maps, &mut out, sink, &operator)?;
                maps.done(held);
            }
            flush_part(&mut out, sink)?;
            Ok(base)
        }))
    }

    /// What changed after checkpoint `since` (a delta), to encode later:
    /// the cache's entries changed since, and the change log's write-backs
    /// of keys the cache has not changed since, a key group at a time.
    ///
    /// `logged`, per key group, the keys changed since (`None`, or no
    /// entry: not logged, and the cached entries are visited instead).
    /// With 1% of 5 M keys changed, the cache held some 230,000 entries
    /// and a delta visited them all to find the 50,000 that changed; with
    /// the keys, it looks up those alone, and takes each key group's map
    /// without copying the maps the worker has written beside meanwhile
    /// (see [`Holding::take_alone`]).
    pub(super) fn snapshot_delta(
        &mut self,
        since: u32,
        changed: impl AsRef<[(usize, Arc<ChangedKeys>)]> + Send + 'static,
        logged: impl AsRef<[Option<Vec<Arc<Vec<K>>>>]> + Send + 'static,
    ) -> Snapshot {
        let mut maps = self.share();
        let (first, operator) = (self.first, self.operator.clone());
        Box::new(move |sink| {
            let mut out = SnapshotPart::new(false);
            let mut at = 0;
            for (index, group) in (0..maps.len()).zip(first..) {
                let log = super::value::group_changes(changed.as_ref(), &mut at, index);
                let keys = logged.as_ref().get(index).and_then(Option::as_ref);
                let held = if keys.is_some() { maps.take_alone(index) } else { maps.take(index) };
                let newer = |k: &K| held.map().and_then(|m| m.get(k)).is_some_and(|e| e.stamp > since);
                // A key is either written or removed.
                super::value::latest_changes(log, since, |n, key, value| {
                    if n % 4_096 == 4_095 {
                        maps.release(index);
                    }
                    let k = crate::codec::key::decode::<K>(key).map_err(|e| Error::State {
                        operator: operator.clone(),
                        message: "a logged key does not decode".into(),
                        source: Some(e.into()),
                    })?;
                    if newer(&k) {
                        return Ok(());
                    }
                    match value {
                        Some(value) => out.part.push(group, key, value)?,
                        None => out.part.push_removed(group, key)?,
                    }
                    pass_if_full(&mut out, sink)
                })?;
                if let Some(segments) = keys {
                    // The logged keys' entries, as the map holds them (a
                    // key logged but not cached went back to the table
                    // before the barrier: it is among the write-backs
                    // above), each once: a key is logged again when it
                    // comes back into the cache, or in a later epoch. The
                    // lookups first, then the encoding, and the entries
                    // told apart by address rather than with a set of the
                    // keys seen: for 50,000 keys, with the set and the
                    // encoding in the lookups' loop 10–12 ms, with the
                    // lookups first 6–7.5 ms, without the set 4–7 ms.
                    let map = held.map();
                    let mut found: Vec<(&K, &CachedValue<V>)> = Vec::new();
                    for (n, k) in segments.iter().flat_map(|keys| keys.iter()).enumerate() {
                        if n % 4_096 == 4_095 {
                            maps.release(index);
                        }
                        if let Some((k, entry)) = map.and_then(|m| m.get_key_value(k))
                            && entry.stamp > since
                        {
                            found.push((k, entry));
                        }
                    }
                    found.sort_unstable_by_key(|(_, entry)| std::ptr::from_ref(*entry) as usize);
                    found.dedup_by_key(|(_, entry)| std::ptr::from_ref(*entry) as usize);
                    for (k, entry) in found {
                        match &entry.value {
                            Some(v) => out.put(group, k, v, &operator)?,
                            None => out.remove(group, k)?,
                        }
                        pass_if_full(&mut out, sink)?;
                    }
                    flush_part(&mut out, sink)?;
                    maps.done(held);
                    continue;
                }
                let entries = held.map().into_iter().flat_map(|m| m.iter()).enumerate();
                for (n, (k, entry)) in entries {
                    if n % 4_096 == 4_095 {
                        maps.release(index);
                    }
                    if entry.stamp <= since {
                        continue;
                    }
                    match &entry.value {
                        Some(v) => out.put(group, k, v, &operator)?,
                        None => out.remove(group, k)?,
                    }
                    pass_if_full(&mut out, sink)?;
                }
                flush_part(&mut out, sink)?;
                maps.done(held);
            }
            Ok(false)
        })
    }

    /// The maps, shared with a snapshot (at a barrier): overlays a slow
    /// export left are applied first, and the flags cleared.
    fn share(&mut self) -> Holding<CacheMap<K, V>> {
        for index in 0..self.overlays.len() {
            if self.overlays.get(index).is_some_and(|o| !o.is_empty()) {
                self.apply_overlay(index);
            }
        }
        self.wanted.clear();
        Holding::new(&mut self.maps, &self.spares, &self.wanted)
    }
}

/// Passes a cached entry to a scan's `f`, its value encoded into `buf`;
/// an encoding failure is kept in `failure` and ends the scan.
fn emit<V: Data>(
    f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    buf: &mut Vec<u8>,
    key: &[u8],
    value: &V,
    failure: &mut Option<crate::codec::CodecError>,
) -> bool {
    buf.clear();
    match value.encode(buf) {
        Ok(()) => f(key, buf),
        Err(e) => {
            *failure = Some(e);
            false
        }
    }
}

/// Passes on the cached values of key group `group` (at `index`: `held`),
/// in parts, releasing the maps the worker wants every 4,096 entries.
fn cached<K: Key, V: Data>(
    group: u16,
    index: usize,
    held: &Held<CacheMap<K, V>>,
    maps: &mut Holding<CacheMap<K, V>>,
    out: &mut SnapshotPart,
    sink: &mut SnapshotSink<'_>,
    operator: &str,
) -> Result<()> {
    flush_part(out, sink)?;
    for (n, (k, entry)) in held.map().into_iter().flat_map(|m| m.iter()).enumerate() {
        if n % 4_096 == 4_095 {
            maps.release(index);
        }
        if let Some(v) = &entry.value {
            out.put(group, k, v, operator)?;
            pass_if_full(out, sink)?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::state::{MemoryBackend, StateBackend, StateScope};

    fn store(bytes: usize) -> CacheStore<u64, u64> {
        let scope = StateScope {
            job: "j".into(),
            operator: "op".into(),
            state: "s".into(),
            key_groups: 0..4,
            max_key_groups: 4,
        };
        CacheStore::new(MemoryBackend.open_table(&scope).unwrap(), Arc::new(ObjectCache::new(bytes)), 0..4, "op")
    }

    /// What the maps allocate, counted afresh.
    fn allocated(s: &CacheStore<u64, u64>) -> usize {
        s.maps.iter().map(|m| m.allocation_size()).sum()
    }

    #[test]
    fn the_budget_counts_what_the_maps_allocate_through_churn() {
        let mut s = store(16 << 10);
        let mut changed: Vec<super::super::value::ByteChanges> = (0..4).map(|_| Default::default()).collect();
        // Checkpoints share the maps now and then, and run a while later:
        // writes meanwhile go beside the maps (outside the budget).
        let mut export: Option<Snapshot> = None;
        let mut epoch = 0;
        let (mut entries, mut overlaid) = (0usize, 0usize);
        for i in 0..50_000u64 {
            if i % 5_000 == 1_000 {
                epoch += 1;
                export = Some(if epoch % 2 == 1 {
                    s.snapshot_base(0..4).unwrap()
                } else {
                    s.snapshot_delta(epoch - 1, Vec::new(), Vec::new())
                });
            }
            if i % 5_000 == 3_000
                && let Some(export) = export.take()
            {
                export(&mut |part: &SnapshotPart| {
                    entries += part.part.entries().count();
                    Ok(())
                })
                .unwrap();
            }
            let (key, index) = (i % 3_000, (i % 4) as usize);
            let bytes = crate::codec::key::encode(&key);
            let tracking = Tracking { on: false, changed: &mut changed };
            // Keys come and go (windows opening and firing), and stay a while.
            s.update(index, index as u16, key, &bytes, Stamp { epoch, tracking, keys: None }, |v| {
                *v = if i % 7 == 0 { None } else { Some(i) };
            })
            .unwrap();
            assert_eq!(s.held, allocated(&s), "after update {i}");
            for (map, overlay) in s.maps.iter().zip(&s.overlays) {
                overlaid = overlaid.max(overlay.len());
                let most = OVERLAY_MIN.min(map.len()) + map.len() / 8;
                assert!(
                    overlay.len() <= most,
                    "after update {i}: an overlay of {} beside {}",
                    overlay.len(),
                    map.len()
                );
            }
            assert!(s.held <= 2 * s.cache.limit(), "after update {i}: {} bytes held", s.held);
        }
        assert!(entries > 0, "the checkpoints saw the cache");
        assert!(overlaid > 0, "writes went beside the maps the checkpoints shared");
        assert!(s.overlays.iter().all(|o| o.capacity() == 0), "overlays applied and let go of");
        // Key 0 was last set at update 48,000 (in key group 0 every time).
        let last = s.get(0, 0, &0, &crate::codec::key::encode(&0u64)).unwrap();
        assert_eq!(last, Some(48_000), "values are written back, not lost");
    }

    /// An ordered scan sees the cache laid over the table, whatever holds
    /// each key: the table (written back), the map, or the overlay beside a
    /// map a checkpoint still shares (a removal there hides the table's
    /// entry); cut at `limit`, it gives the first `limit` entries. Checked
    /// against a `BTreeMap` after every change, with writes, removals and
    /// blind updates mixed.
    #[test]
    fn an_ordered_scan_lays_the_cache_over_the_table() {
        // Room for a few dozen entries: key groups are written back often.
        let mut s = store(2_000);
        let mut changed: Vec<super::super::value::ByteChanges> = (0..4).map(|_| Default::default()).collect();
        let mut model: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
        let mut shared: Option<Snapshot> = None;
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let (mut cut, mut hidden_checked) = (0usize, 0usize);
        for i in 0..6_000u64 {
            let epoch = u32::try_from(i / 500).unwrap();
            if i % 500 == 0 {
                // A checkpoint shares the maps for a while (writes go to
                // overlays), and is dropped unexported.
                shared = if i % 1_000 == 0 { Some(s.snapshot_base(0..4).unwrap()) } else { None };
            }
            let key = next() % 200;
            let bytes = crate::codec::key::encode(&key);
            let tracking = Tracking { on: true, changed: &mut changed };
            match next() % 4 {
                0 | 1 => {
                    let value = next() % 1_000;
                    s.update(0, 0, key, &bytes, Stamp { epoch, tracking, keys: None }, |v| *v = Some(value)).unwrap();
                    model.insert(key, value);
                }
                2 => {
                    s.update(0, 0, key, &bytes, Stamp { epoch, tracking, keys: None }, |v| *v = None).unwrap();
                    model.remove(&key);
                }
                _ => {
                    // Blind: a write of an absent key, a removal of a set one.
                    let set = model.contains_key(&key);
                    let value = (!set).then(|| next() % 1_000);
                    let blind = value.map_or(Blind::Remove, Blind::Put);
                    s.blind(0, 0, key, &bytes, Stamp { epoch, tracking, keys: None }, blind).unwrap();
                    match value {
                        Some(v) => model.insert(key, v),
                        None => model.remove(&key),
                    };
                }
            }
            let from = next() % 220;
            let limit = match next() % 4 {
                0 => 1,
                1 => 4,
                2 => 65,
                _ => usize::MAX,
            };
            let mut seen = Vec::new();
            s.scan_from(0, 0, &crate::codec::key::encode(&from), limit, &mut |k, v| {
                seen.push((
                    crate::codec::key::decode::<u64>(k).unwrap(),
                    <u64 as crate::codec::Data>::decode(v).unwrap(),
                ));
                seen.len() < limit
            })
            .unwrap();
            let want: Vec<(u64, u64)> = model.range(from..).take(limit).map(|(k, v)| (*k, *v)).collect();
            assert_eq!(seen, want, "after change {i}: scan from {from}, {limit} at most");
            if model.range(from..).count() > limit {
                cut += 1;
            }
            if s.overlays.first().is_some_and(|o| o.values().any(Option::is_none))
                || s.maps.first().is_some_and(|m| m.values().any(|e| e.value.is_none() && e.stored))
            {
                hidden_checked += 1;
            }
        }
        drop(shared);
        assert!(cut > 1_000, "scans were cut at their limit ({cut})");
        assert!(hidden_checked > 100, "removals in the cache hid the table's entries ({hidden_checked})");
    }
}
