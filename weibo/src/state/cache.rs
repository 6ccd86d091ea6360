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
//! maps are shared with the checkpoint and copied on the next write
//! (copy-on-write), as in memory. Entries written back are logged with
//! their epoch while changes are tracked, so a delta needs no table reads.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hashbrown::hash_map::Entry;

use super::{ChangedKeys, Entries, Export, ExportSink, Exported, ObjectMap, StateTable, flush_part, pass_if_full};
use crate::codec::Data;
use crate::error::{Error, Result};
use crate::key::Key;

/// The memory a backend's value caches may use together, shared by every
/// state opened on it.
///
/// The budget counts what the caches' hash maps allocate (a map doubles
/// when it grows; each entry takes its inline size: key, value and
/// bookkeeping, plus the map's control byte), not what a `String` or `Vec`
/// inside an entry points to. It is split evenly between the states that
/// are open. It does not cover the log of values written back since the
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

/// A value in the cache. Only [`super::ValueState::update`] brings a value
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

/// The cached store of one value state.
pub(super) struct CacheStore<K, V> {
    /// Per owned key group; shared with the checkpoint being written, if
    /// any, and copied on the first write after it.
    maps: Vec<Arc<CacheMap<K, V>>>,
    /// Maps exports are done with, to copy into (outside the budget: a
    /// checkpoint's copies, kept for the next one).
    spares: super::spares::Spares<CacheMap<K, V>>,
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
    /// The first owned key group.
    first: u16,
    operator: String,
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

/// What the change log needs to hear about a write-back.
pub(super) struct Tracking<'a> {
    /// Whether changes are logged at all.
    pub(super) on: bool,
    /// Per owned key group, the log.
    pub(super) changed: &'a mut [Arc<ChangedKeys>],
}

impl<K: Key, V: Data> CacheStore<K, V> {
    pub(super) fn new(table: Box<dyn StateTable>, cache: Arc<ObjectCache>, groups: Range<u16>, operator: &str) -> Self {
        cache.states.fetch_add(1, Ordering::Relaxed);
        Self {
            maps: groups.clone().map(|_| Arc::default()).collect(),
            spares: super::spares::Spares::new(groups.len()),
            table,
            in_table: groups.clone().map(|_| false).collect(),
            first: groups.start,
            held: 0,
            counted: groups.clone().map(|_| 0).collect(),
            cache,
            next: 0,
            operator: operator.to_string(),
        }
    }

    fn read(&mut self, index: usize, group: u16, key_bytes: &[u8]) -> Result<Option<V>> {
        if !self.in_table.get(index).copied().unwrap_or(true) {
            return Ok(None);
        }
        match self.table.get(group, key_bytes)? {
            Some(bytes) => V::decode(&bytes).map(Some).map_err(|e| codec_error(&self.operator, e)),
            None => Ok(None),
        }
    }

    /// See [`super::ValueState::update`]; `index` is `group`'s position
    /// among the owned key groups, `epoch` the one changes are stamped with.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn update<R>(
        &mut self,
        index: usize,
        group: u16,
        key: K,
        key_bytes: &[u8],
        epoch: u32,
        tracking: Tracking<'_>,
        f: impl FnOnce(&mut Option<V>) -> R,
    ) -> Result<R> {
        let Some(map) = self.maps.get_mut(index) else {
            return Err(Error::Internal(format!("operator `{}` has no cache for key group {group}", self.operator)));
        };
        let r = match self.spares.make_mut(map).entry(key) {
            Entry::Occupied(mut e) => {
                let entry = e.get_mut();
                let existed = entry.value.is_some();
                let r = f(&mut entry.value);
                if entry.value.is_none() && !existed {
                    return Ok(r);
                }
                if entry.value.is_none() && !entry.stored && entry.born == epoch {
                    // Created since the last barrier and never written back:
                    // no checkpoint and no table holds it, so it just goes.
                    e.remove();
                } else {
                    entry.stamp = epoch;
                }
                r
            }
            Entry::Vacant(e) => {
                // The borrow of `maps` ends before the table is read.
                let key = e.into_key();
                let mut slot = self.read(index, group, key_bytes)?;
                let stored = slot.is_some();
                let r = f(&mut slot);
                if slot.is_some() || stored {
                    let entry = CachedValue { value: slot, stamp: epoch, born: epoch, stored };
                    if let (Some(map), Some(counted)) = (self.maps.get_mut(index), self.counted.get_mut(index)) {
                        let map = Arc::make_mut(map);
                        map.insert(key, entry);
                        // Only a growth reallocates: count the group again then.
                        let size = map.allocation_size();
                        if size != *counted {
                            self.held = self.held - *counted + size;
                            *counted = size;
                        }
                    }
                    // The share of the budget changes as states open and
                    // close, so it is read again on every insert.
                    if self.held > self.cache.limit() {
                        self.shrink(tracking)?;
                    }
                }
                r
            }
        };
        Ok(r)
    }

    /// Whether `key` is cached (for prefetching).
    #[inline]
    pub(super) fn contains(&self, index: usize, key: &K) -> bool {
        self.maps.get(index).is_some_and(|m| m.contains_key(key))
    }

    /// The value of `key`, from the cache or the table (which does not
    /// bring it into the cache).
    pub(super) fn get(&mut self, index: usize, group: u16, key: &K, key_bytes: &[u8]) -> Result<Option<V>> {
        if let Some(entry) = self.maps.get(index).and_then(|m| m.get(key)) {
            return Ok(entry.value.clone());
        }
        self.read(index, group, key_bytes)
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
        let Some(slot) = self.maps.get_mut(index) else { return Ok(()) };
        if slot.is_empty() {
            return Ok(());
        }
        // A checkpoint that shares the map keeps its own reference.
        let map = std::mem::take(slot);
        if let Some(counted) = self.counted.get_mut(index) {
            self.held -= std::mem::take(counted);
        }
        let group = self.table_group(index);
        let mut writes: super::Writes = Vec::new();
        let mut log = tracking.on.then(|| tracking.changed.get_mut(index)).flatten().map(Arc::make_mut);
        for (k, entry) in map.iter() {
            let key = crate::key::encode(k);
            let value = match &entry.value {
                Some(v) => {
                    let mut bytes = Vec::new();
                    v.encode(&mut bytes).map_err(|e| codec_error(&self.operator, e))?;
                    Some(bytes)
                }
                None => None,
            };
            if let Some(log) = log.as_mut() {
                let change = (entry.stamp, value.as_deref().map(Box::from));
                log.insert(key.clone().into_boxed_slice(), change);
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
        entries: &Entries,
        removed: super::RemovedKeys,
        tracking: Tracking<'_>,
    ) -> Result<()> {
        self.write_back_all(tracking)?;
        if !removed.is_empty() {
            self.table.apply(removed.into_iter().map(|(g, k)| (g, k, None)).collect())?;
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
    pub(super) fn export_base(&mut self, groups: Range<u16>) -> Result<Export> {
        let snapshot = self.table.export_deferred(groups)?;
        let overlay = self.maps.clone();
        let spares = self.spares.clone();
        let (first, operator) = (self.first, self.operator.clone());
        Ok(Box::new(move |sink| {
            let mut out = Exported::new(true);
            // The cache of the key group the snapshot is in, and the index
            // of the next key group whose cache is not passed on yet.
            let mut open: Option<(u16, usize)> = None;
            let mut next = 0usize;
            let mut failure = None;
            let base = snapshot(&mut |part: &Exported| {
                let Some(group) = part.part.groups.first().copied() else { return Ok(()) };
                if open.is_none_or(|(g, _)| g != group) {
                    let index = usize::from(group.saturating_sub(first));
                    if index < next || index >= overlay.len() {
                        failure.get_or_insert(group);
                        return Ok(());
                    }
                    // Key groups up to this one: their caches (alone, for
                    // those the table holds nothing of).
                    while next <= index {
                        flush_part(&mut out, sink)?;
                        if let Some(map) = overlay.get(next) {
                            cached(first.saturating_add(next as u16), map, &mut out, sink, &operator)?;
                        }
                        next += 1;
                    }
                    open = Some((group, index));
                }
                let Some(map) = open.and_then(|(_, index)| overlay.get(index)) else { return Ok(()) };
                for (g, key, value) in part.part.entries() {
                    if g != group {
                        failure.get_or_insert(g);
                        break;
                    }
                    if map.is_empty() {
                        out.part.push(group, key, value)?;
                        pass_if_full(&mut out, sink)?;
                        continue;
                    }
                    let k = crate::key::decode::<K>(key).map_err(|e| Error::State {
                        operator: operator.clone(),
                        message: format!("a stored key does not decode: {e}"),
                    })?;
                    if !map.contains_key(&k) {
                        out.part.push(group, key, value)?;
                        pass_if_full(&mut out, sink)?;
                    }
                }
                Ok(())
            })?;
            if let Some(group) = failure {
                return Err(Error::Internal(format!(
                    "operator `{operator}`: the table exported key group {group} out of order"
                )));
            }
            for (index, map) in overlay.iter().enumerate().skip(next) {
                flush_part(&mut out, sink)?;
                cached(first.saturating_add(index as u16), map, &mut out, sink, &operator)?;
            }
            flush_part(&mut out, sink)?;
            for map in overlay {
                spares.give_back(map);
            }
            Ok(base)
        }))
    }

    /// What changed after checkpoint `since` (a delta), to encode later:
    /// the cache's entries changed since, and the change log's write-backs
    /// of keys the cache has not changed since, a key group at a time.
    pub(super) fn export_delta(&self, since: u32, changed: Vec<Arc<ChangedKeys>>) -> Export {
        let overlay = self.maps.clone();
        let spares = self.spares.clone();
        let (first, operator) = (self.first, self.operator.clone());
        Box::new(move |sink| {
            let mut out = Exported::new(false);
            for ((group, log), map) in (first..).zip(&changed).zip(overlay) {
                let newer = |k: &K| map.get(k).is_some_and(|e| e.stamp > since);
                // A key is either written or removed.
                for (key, (_, value)) in log.iter().filter(|(_, (e, _))| *e > since) {
                    let k = crate::key::decode::<K>(key).map_err(|e| Error::State {
                        operator: operator.clone(),
                        message: format!("a logged key does not decode: {e}"),
                    })?;
                    if newer(&k) {
                        continue;
                    }
                    match value {
                        Some(value) => out.part.push(group, key, value)?,
                        None => out.part.push_removed(group, key)?,
                    }
                    pass_if_full(&mut out, sink)?;
                }
                for (k, entry) in map.iter().filter(|(_, e)| e.stamp > since) {
                    match &entry.value {
                        Some(v) => out.put(group, k, v, &operator)?,
                        None => out.remove(group, k)?,
                    }
                    pass_if_full(&mut out, sink)?;
                }
                flush_part(&mut out, sink)?;
                spares.give_back(map);
            }
            Ok(false)
        })
    }
}

/// Passes on the cached values of key group `group` (`map`), in parts.
fn cached<K: Key, V: Data>(
    group: u16,
    map: &CacheMap<K, V>,
    out: &mut Exported,
    sink: &mut ExportSink<'_>,
    operator: &str,
) -> Result<()> {
    for (k, entry) in map.iter() {
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
        let mut changed: Vec<Arc<ChangedKeys>> = (0..4).map(|_| Arc::default()).collect();
        for i in 0..50_000u64 {
            let (key, index) = (i % 3_000, (i % 4) as usize);
            let bytes = crate::key::encode(&key);
            let tracking = Tracking { on: false, changed: &mut changed };
            // Keys come and go (windows opening and firing), and stay a while.
            s.update(index, index as u16, key, &bytes, 0, tracking, |v| {
                *v = if i % 7 == 0 { None } else { Some(i) };
            })
            .unwrap();
            assert_eq!(s.held, allocated(&s), "after update {i}");
            assert!(s.held <= 2 * s.cache.limit(), "after update {i}: {} bytes held", s.held);
        }
        // Key 0 was last set at update 48,000 (in key group 0 every time).
        let last = s.get(0, 0, &0, &crate::key::encode(&0u64)).unwrap();
        assert_eq!(last, Some(48_000), "values are written back, not lost");
    }
}
