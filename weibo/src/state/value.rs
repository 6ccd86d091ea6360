//! `ValueStore`: one value per key, typed, over a table or in memory.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use hashbrown::hash_map::Entry;
use rustc_hash::FxBuildHasher;

use super::snapshot::{
    Barrier, Entries, EntryRef, RemovedRef, Snapshot, SnapshotPart, delta_since, entry_refs, flush_part, gather,
    pass_if_full,
};
use super::spares::{self, Shareable};
use super::{ObjectMap, StateBackend, StateScope, StateTable, cache, flat};
use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::{Error, Result};
use crate::record::CheckpointId;

/// A key group's values, each with the epoch it last changed in (a map
/// whose lines a keyed operator loads ahead of its records: see
/// [`ValueStore::prefetch`]).
pub(super) type StampedMap<K, V> = flat::FlatMap<K, (V, u32)>;

pub(super) enum Store<K, V> {
    /// One map per owned key group, by typed key.
    /// Each map is shared with the checkpoint being written, if any; the
    /// worker writes beside it meanwhile (see [`Overlay`]).
    /// Each value is stamped with the snapshot epoch in which it last
    /// changed, so an incremental checkpoint finds what changed.
    Objects(Vec<Shareable<StampedMap<K, V>>>),
    /// Live values cached in front of a byte table.
    Cached(Box<cache::CacheStore<K, V>>),
    Bytes {
        table: Box<dyn StateTable>,
        buf: Vec<u8>,
    },
}

/// One value per key: the typed handle keyed operators use.
///
/// Every access names the key twice: typed (for backends that keep
/// objects) and encoded (for backends that store bytes). The encoded key
/// may be empty when the caller has only the typed one (a record from a
/// hash edge inside the process carries no key bytes): a byte backend
/// encodes the key then, and the in-memory one needs no bytes at all.
pub struct ValueStore<K, V> {
    pub(super) store: Store<K, V>,
    groups: Range<u16>,
    operator: String,
    /// The checkpoint being built (one after the last barrier): values
    /// changed now are stamped with it.
    epoch: u32,
    /// Snapshots since the last full one.
    since_full: u32,
    /// The checkpoint of this run's first snapshot (a base): a delta needs
    /// a complete checkpoint at or after it to build on, since changes
    /// before it were neither stamped nor logged.
    first_base: Option<u64>,
    /// Whether changes are tracked for incremental checkpoints: from the
    /// first checkpoint on (that one is a base, which holds everything
    /// before it), so a job without checkpoints keeps no change log.
    tracking: bool,
    /// In-memory store: per owned key group, keys removed since the last
    /// complete checkpoint. See [`Removals`].
    pub(super) removed: Vec<Removals<K>>,
    /// In-memory store, and the cache in front of a byte table: per owned
    /// key group, the keys changed since the checkpoints deltas build on,
    /// so that a delta looks them up instead of scanning the whole map.
    /// See [`ChangeLog`].
    logs: Vec<ChangeLog<K>>,
    /// Byte store: per owned key group, keys written or removed (without a
    /// cache: every change; with one: every write-back), with the epoch of
    /// their last change and the encoded value written (`None`: removed),
    /// so a delta needs no reads from the table. Sealed per epoch and
    /// shared with the checkpoints being taken, so the barrier neither
    /// copies nor frees keys: see [`ByteChanges`].
    pub(super) changed: Vec<ByteChanges>,
    /// In-memory store: maps snapshots are done with, to copy into.
    spares: spares::Spares<StampedMap<K, V>>,
    /// The vectors of key groups' logged keys, change logs and removals a
    /// barrier hands a delta: reused, so that the pause allocates none (see
    /// [`spares::Recycler`]).
    logged: spares::Recycler<Option<Vec<Arc<Vec<K>>>>>,
    changed_lists: spares::Recycler<(usize, Arc<ChangedKeys>)>,
    removed_lists: spares::Recycler<(u16, Arc<Vec<K>>)>,
    /// The vectors of logs a barrier drops (a complete checkpoint holds
    /// them), for the snapshot to free on its thread: key logs (removals,
    /// changed keys) and byte change logs.
    dropped_keys: spares::Recycler<Arc<Vec<K>>>,
    dropped_changes: spares::Recycler<Arc<ChangedKeys>>,
    /// In-memory store, per owned key group: writes made while a snapshot
    /// still shares the group's map (it copies each map first thing, then
    /// lets go of it), applied to the map in place once it has; a value,
    /// or `None` for a removal, with its stamp. See [`Overlay`].
    overlays: Vec<Overlay<K, V>>,
    /// In-memory store, per owned key group: whether the worker has written
    /// beside the map since the last barrier, telling the snapshot to copy
    /// the map and let go of it now rather than when it has encoded it.
    wanted: spares::Wanted,
    /// Byte store: where a key passed without its bytes is encoded.
    key_buf: Vec<u8>,
    /// Whether looking keys up ahead pays (see [`ValueStore::prefetch_pays`]),
    /// and how many more batches before it is decided again.
    prefetch_on: bool,
    prefetch_recheck: u32,
}

/// The size of an in-memory state (the entries its maps have room for,
/// times an entry's size) from which its keyed operator asks for the
/// lines of the keys ahead (see
/// [`ValueStore::prefetch`]). Below it the state stays in the caches and
/// the prefetches cost without saving a wait (`bench w3-100keys` runs
/// slower with them), while over 5 M keys (400 MB) they save most of the
/// state's time (`bench w3-sum`; the Performance chapter).
const PREFETCH_MIN_BYTES: usize = 1 << 20;

/// How many batches [`ValueStore::prefetch_pays`] answers before it looks
/// at the state's size again.
const PREFETCH_RECHECK: u32 = 64;

/// `key_bytes`, or, when the caller passed none, `key` encoded into `buf`.
#[inline]
fn encoded<'a, K: Key>(key: &K, key_bytes: &'a [u8], buf: &'a mut Vec<u8>) -> &'a [u8] {
    if !key_bytes.is_empty() {
        return key_bytes;
    }
    buf.clear();
    key.encode_key(buf);
    buf
}

/// Writes to a key group's map while a snapshot still shares it.
///
/// The worker writes a key group whose map a snapshot still shares into
/// this overlay, and flags the key group (`wanted`); the snapshot, on its
/// own thread, copies a flagged map and lets go of it as soon as it sees
/// the flag (before each key group and every 4,096 entries), and encodes
/// the others where they are. So the worker does not copy the map itself (which, with every key group written right
/// after each barrier, meant copying the whole state on the worker at
/// every checkpoint); the next write after the snapshot let go applies the
/// overlay to the map in place. An overlay that outgrows
/// [`OVERLAY_MIN`] plus an eighth of its map (a snapshot slow to start)
/// gives up: the worker copies the map and applies it.
pub(super) type Overlay<K, V> = ObjectMap<K, (Option<V>, u32)>;

/// See [`Overlay`].
pub(super) const OVERLAY_MIN: usize = 4_096;

/// The keys of one key group's in-memory map changed since a checkpoint,
/// each logged when it first changes in an epoch: a delta of 1% of 5 M
/// keys looks up 50,000 keys instead of scanning 5 M entries (146 ms,
/// most of it memory traffic). It holds every change after checkpoint
/// `since`; when it grows past [`OVERLAY_MIN`] plus a quarter of its map
/// (so many changes that a scan costs little more), it gives up and holds
/// none until the next base snapshot, and deltas scan the map meanwhile.
pub(super) struct ChangeLog<K> {
    /// Past epochs' keys (sealed at their barrier), by epoch.
    sealed: Vec<(u32, Arc<Vec<K>>)>,
    /// The current epoch's keys.
    current: Vec<K>,
    /// The checkpoint after which every change is logged; `None` while
    /// it logs nothing (before the first base, after giving up).
    since: Option<u64>,
    /// Keys in `sealed` and `current`.
    len: usize,
}

impl<K> Default for ChangeLog<K> {
    fn default() -> Self {
        Self { sealed: Vec::new(), current: Vec::new(), since: None, len: 0 }
    }
}

impl<K: Clone> ChangeLog<K> {
    /// `key` changed for the first time in the current epoch, in a map of
    /// `map_len` entries.
    #[inline]
    pub(super) fn record(&mut self, key: &K, map_len: usize) {
        if self.since.is_none() {
            return;
        }
        if self.len >= OVERLAY_MIN + map_len / 4 {
            *self = Self::default();
            return;
        }
        self.current.push(key.clone());
        self.len += 1;
    }

    /// At the barrier of checkpoint `n` (`epoch` is the one ending, `n`),
    /// after checkpoint `completed` (0: none): seals the epoch's keys and
    /// moves those a complete checkpoint holds into `dropped` (for the
    /// snapshot to free: see [`EpochLog`]); a base starts logging if it
    /// was not. Returns the keys changed after `since` if the log holds
    /// them all (`None`: scan the map).
    fn at_barrier(
        &mut self,
        epoch: u32,
        at: Barrier,
        delta_since: Option<u32>,
        dropped: &mut Vec<Arc<Vec<K>>>,
    ) -> Option<Vec<Arc<Vec<K>>>> {
        if !self.current.is_empty() {
            self.sealed.push((epoch, Arc::new(std::mem::take(&mut self.current))));
        }
        let kept = self.sealed.iter().position(|(e, _)| u64::from(*e) > at.completed).unwrap_or(self.sealed.len());
        dropped.extend(self.sealed.drain(..kept).map(|(_, keys)| keys));
        self.len = self.sealed.iter().map(|(_, keys)| keys.len()).sum();
        let keys = match (delta_since, self.since) {
            (Some(since), Some(from)) if from <= u64::from(since) => {
                Some(self.sealed.iter().filter(|(e, _)| *e > since).map(|(_, keys)| Arc::clone(keys)).collect())
            }
            _ => None,
        };
        if delta_since.is_none() && self.since.is_none() {
            // A base holds every change up to its checkpoint: log from here on.
            self.since = Some(at.checkpoint);
        }
        keys
    }
}

/// What one key group logs for deltas since the last complete
/// checkpoint (its removals in memory, its changes on a byte table): the
/// current epoch's, and each past epoch's, sealed at its barrier behind an
/// `Arc` that the deltas writing it share.
///
/// A barrier seals the epoch's log and hands the delta references; the
/// logs a complete checkpoint holds leave with the snapshot, which frees
/// them on its own thread. Copied or pruned in place, they cost the pause
/// time in proportion to the changes: every pending removal copied (with
/// session windows, kilobytes per key group at every barrier, which
/// `bench sessions` showed in its longest pause), one `free` per key and
/// value a complete checkpoint held, and the whole log copied when the
/// snapshot before still shared it (with timers on disk, most of the
/// pause).
pub(super) struct EpochLog<L> {
    /// Past epochs' logs, by epoch (oldest first).
    sealed: Vec<(u32, Arc<L>)>,
    /// The current epoch's.
    current: L,
}

impl<L: Default> Default for EpochLog<L> {
    fn default() -> Self {
        Self { sealed: Vec::new(), current: L::default() }
    }
}

/// A log an [`EpochLog`] seals: how many entries it holds.
pub(super) trait LogLen {
    fn entries(&self) -> usize;
}

impl<K> LogLen for Vec<K> {
    fn entries(&self) -> usize {
        self.len()
    }
}

impl LogLen for ChangedKeys {
    fn entries(&self) -> usize {
        self.len()
    }
}

impl<L: Default + LogLen> EpochLog<L> {
    /// At the barrier ending `epoch`, after checkpoint `completed` (0:
    /// none): seals the epoch's log, and moves the logs a complete
    /// checkpoint holds into `dropped` (for the snapshot to free).
    fn at_barrier(&mut self, epoch: u32, completed: u64, dropped: &mut Vec<Arc<L>>) {
        if self.current.entries() > 0 {
            self.sealed.push((epoch, Arc::new(std::mem::take(&mut self.current))));
        }
        let kept = self.sealed.iter().position(|(e, _)| u64::from(*e) > completed).unwrap_or(self.sealed.len());
        dropped.extend(self.sealed.drain(..kept).map(|(_, log)| log));
    }

    /// The sealed logs, oldest first (what a delta writes).
    fn sealed(&self) -> impl Iterator<Item = &Arc<L>> {
        self.sealed.iter().map(|(_, log)| log)
    }

    /// How many entries it holds (a key logged in two epochs counts twice).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.current.entries() + self.sealed.iter().map(|(_, log)| log.entries()).sum::<usize>()
    }
}

/// The keys of one key group's in-memory map removed since the last
/// complete checkpoint.
pub(super) type Removals<K> = EpochLog<Vec<K>>;

impl<K> EpochLog<Vec<K>> {
    /// `key` was removed in the current epoch.
    #[inline]
    pub(super) fn push(&mut self, key: K) {
        self.current.push(key);
    }
}

/// Where a tracked change is logged: the key group's removals and its
/// change log.
pub(super) type Tracked<'a, K> = (&'a mut Removals<K>, &'a mut ChangeLog<K>);

/// Updates `key` in `overlay`, beside `map`, which a snapshot still
/// shares: as [`ValueStore::update`] does in the map (logging a removal in
/// `removed`, if changes are tracked).
#[cold]
#[inline(never)]
pub(super) fn overlaid_update<K: Key, V: Data, R>(
    map: &StampedMap<K, V>,
    overlay: &mut Overlay<K, V>,
    tracked: Option<Tracked<'_, K>>,
    key: K,
    epoch: u32,
    f: impl FnOnce(&mut Option<V>) -> R,
) -> R {
    let map_len = map.len();
    match overlay.entry(key) {
        Entry::Occupied(mut e) => {
            let (slot, stamp) = e.get_mut();
            let existed = slot.is_some();
            let r = f(slot);
            let first = std::mem::replace(stamp, epoch) != epoch;
            let present = slot.is_some();
            if let Some((removed, log)) = tracked {
                if existed && !present {
                    removed.push(e.key().clone());
                } else if present && (first || !existed) {
                    // First changed in this epoch, or back after a removal
                    // in it (whose log entry the removal does not replace).
                    log.record(e.key(), map_len);
                }
            }
            r
        }
        Entry::Vacant(e) => {
            let mut slot = map.get(e.key()).map(|(v, _)| v.clone());
            let existed = slot.is_some();
            let r = f(&mut slot);
            if let Some((removed, log)) = tracked {
                if existed && slot.is_none() {
                    removed.push(e.key().clone());
                } else if slot.is_some() {
                    log.record(e.key(), map_len);
                }
            }
            if existed || slot.is_some() {
                e.insert((slot, epoch));
            }
            r
        }
    }
}

/// Applies `overlay` to `map`, emptying it.
#[cold]
#[inline(never)]
pub(super) fn apply_overlay<K: Key, V>(map: &mut StampedMap<K, V>, overlay: &mut Overlay<K, V>) {
    for (k, (slot, stamp)) in overlay.drain() {
        match slot {
            Some(v) => {
                map.insert(k, (v, stamp));
            }
            None => {
                map.remove(&k);
            }
        }
    }
}

/// Encoded keys changed in one key group: the epoch of their last change
/// and the encoded value it left (`None`: removed).
pub(super) type ChangedKeys = hashbrown::HashMap<Box<[u8]>, (u32, Option<Box<[u8]>>), FxBuildHasher>;

/// The changes of one key group of a byte store (or the write-backs of
/// the cache in front of one) since the last complete checkpoint. The
/// epoch each change carries may be older than the epoch it is logged in
/// (a cache writes back an entry changed earlier).
pub(super) type ByteChanges = EpochLog<ChangedKeys>;

impl EpochLog<ChangedKeys> {
    /// Logs a change of `key`: the epoch it was made in and the value it
    /// left (`None`: removed); a later change of the same key in this
    /// epoch replaces an earlier one.
    pub(super) fn log(&mut self, key: &[u8], change: (u32, Option<Box<[u8]>>)) {
        match self.current.get_mut(key) {
            Some(last) => *last = change,
            None => {
                self.current.insert(key.into(), change);
            }
        }
    }
}

/// Passes each key's latest change after epoch `since` in `segments` (one
/// key group's sealed maps, oldest first) to `f`, once per key, with a
/// running count (for a caller that lets go of things now and then).
pub(super) fn latest_changes(
    segments: &[(usize, Arc<ChangedKeys>)],
    since: u32,
    mut f: impl FnMut(usize, &[u8], &Option<Box<[u8]>>) -> Result<()>,
) -> Result<()> {
    let mut n = 0;
    let mut seen: hashbrown::HashSet<&[u8], FxBuildHasher> = hashbrown::HashSet::default();
    let several = segments.len() > 1;
    // Newest first: a key's latest change is in the newest map holding it.
    for (_, changes) in segments.iter().rev() {
        for (key, (e, value)) in changes.iter() {
            if *e <= since || (several && !seen.insert(key)) {
                continue;
            }
            f(n, key, value)?;
            n += 1;
        }
    }
    Ok(())
}

/// The run of `changes` (key group index, map; by index) for key group
/// `index`, from `*at` on, which it moves past.
pub(super) fn group_changes<'a>(
    changes: &'a [(usize, Arc<ChangedKeys>)],
    at: &mut usize,
    index: usize,
) -> &'a [(usize, Arc<ChangedKeys>)] {
    let rest = changes.get(*at..).unwrap_or_default();
    let len = rest.iter().take_while(|(i, _)| *i == index).count();
    *at += len;
    rest.get(..len).unwrap_or_default()
}

/// Logs a change of a byte store's `key_bytes` (in key group `index`) in
/// `epoch`, for incremental checkpoints: its value as written, `None` for
/// a removal; a later change of the same key replaces an earlier one.
fn log_byte_change(changed: &mut [ByteChanges], index: usize, epoch: u32, key_bytes: &[u8], written: Option<&[u8]>) {
    if let Some(changed) = changed.get_mut(index) {
        changed.log(key_bytes, (epoch, written.map(Box::from)));
    }
}

/// Writes to a table: (key group, encoded key, encoded value or `None` to remove).
pub type Writes = Vec<(u16, Vec<u8>, Option<Vec<u8>>)>;

/// Every how many checkpoints a value state writes all its entries instead
/// of what changed (bounding the chain a restore replays).
pub const FULL_CHECKPOINT_EVERY: u32 = 10;

impl<K, V> fmt::Debug for ValueStore<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValueStore")
            .field("operator", &self.operator)
            .field("groups", &self.groups)
            .finish_non_exhaustive()
    }
}

impl<K: Key, V: Data> ValueStore<K, V> {
    /// Opens the state `scope` names on `backend`.
    ///
    /// # Errors
    /// [`Error::State`] when the backend cannot open it.
    /// [`Error::Graph`] when its values do not read back as written.
    pub fn open(backend: &dyn StateBackend, scope: &StateScope) -> Result<Self> {
        scope.check_values::<V>()?;
        let store = if backend.keeps_objects() {
            Store::Objects(scope.key_groups.clone().map(|_| Shareable::default()).collect())
        } else if let Some(cache) = backend.object_cache() {
            Store::Cached(Box::new(cache::CacheStore::new(
                backend.open_table(scope)?,
                cache,
                scope.key_groups.clone(),
                &scope.operator,
            )))
        } else {
            Store::Bytes { table: backend.open_table(scope)?, buf: Vec::new() }
        };
        Ok(Self::with_store(store, scope))
    }

    /// Opens the state `scope` names on `backend` without a cache in front
    /// of a byte table: live objects on a backend that keeps them, the
    /// table itself otherwise, so that a scan in key order
    /// ([`ValueStore::scan_from`]) reads the table alone (map and list
    /// state, whose keys are read a prefix at a time).
    ///
    /// # Errors
    /// As [`ValueStore::open`].
    pub(super) fn open_uncached(backend: &dyn StateBackend, scope: &StateScope) -> Result<Self> {
        scope.check_values::<V>()?;
        let store = if backend.keeps_objects() {
            Store::Objects(scope.key_groups.clone().map(|_| Shareable::default()).collect())
        } else {
            Store::Bytes { table: backend.open_table(scope)?, buf: Vec::new() }
        };
        Ok(Self::with_store(store, scope))
    }

    /// Whether this store keeps live objects (in memory, unordered).
    pub(super) fn keeps_objects(&self) -> bool {
        matches!(self.store, Store::Objects(_))
    }

    /// Opens the state `scope` names on `backend`'s byte table, behind the
    /// backend's cache if it has one, for a state read in key order
    /// ([`ValueStore::scan_from`]: timers).
    pub(super) fn open_ordered(backend: &dyn StateBackend, scope: &StateScope) -> Result<Self> {
        let table = backend.open_table(scope)?;
        let store = match backend.object_cache() {
            Some(cache) => {
                Store::Cached(Box::new(cache::CacheStore::new(table, cache, scope.key_groups.clone(), &scope.operator)))
            }
            None => Store::Bytes { table, buf: Vec::new() },
        };
        Ok(Self::with_store(store, scope))
    }

    /// Visits `group`'s entries at or after the encoded key `from`, in key
    /// order, while `f` returns true, reading at most `limit` of them
    /// (a cache sorts its entries only as far as that), on a byte store
    /// or a cached one.
    ///
    /// # Errors
    /// [`Error::State`] when the table fails; [`Error::Internal`] for a
    /// key group this instance does not own, or an in-memory store.
    pub(super) fn scan_from(
        &mut self,
        group: u16,
        from: &[u8],
        limit: usize,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        if !self.groups.contains(&group) {
            return Err(self.group_error(group));
        }
        let index = usize::from(group - self.groups.start);
        match &mut self.store {
            Store::Bytes { table, .. } => table.scan_from(group, from, f),
            Store::Cached(store) => store.scan_from(index, group, from, limit, f),
            Store::Objects(_) => {
                Err(crate::error::internal_error!("operator `{}`: an ordered scan outside a byte table", self.operator))
            }
        }
    }

    fn with_store(store: Store<K, V>, scope: &StateScope) -> Self {
        let groups = scope.key_groups.len();
        let (objects, bytes) = (matches!(store, Store::Objects(_)), matches!(store, Store::Bytes { .. }));
        Self {
            store,
            groups: scope.key_groups.clone(),
            operator: scope.operator.clone(),
            epoch: 0,
            since_full: 0,
            first_base: None,
            tracking: false,
            removed: scope.key_groups.clone().map(|_| Removals::default()).collect(),
            logs: scope.key_groups.clone().map(|_| ChangeLog::default()).collect(),
            changed: scope.key_groups.clone().map(|_| ByteChanges::default()).collect(),
            spares: spares::Spares::new(scope.key_groups.len()),
            // Each store's own (with a length of 0 the vector is
            // allocated when first filled).
            logged: spares::Recycler::new(if bytes { 0 } else { groups }),
            changed_lists: spares::Recycler::new(if objects { 0 } else { groups }),
            removed_lists: spares::Recycler::new(if objects { groups } else { 0 }),
            dropped_keys: spares::Recycler::new(if bytes { 0 } else { 2 * groups }),
            dropped_changes: spares::Recycler::new(if objects { 0 } else { groups }),
            overlays: scope.key_groups.clone().map(|_| Overlay::default()).collect(),
            wanted: spares::Wanted::new(scope.key_groups.len()),
            key_buf: Vec::new(),
            prefetch_on: false,
            prefetch_recheck: 0,
        }
    }

    fn group_error(&self, group: u16) -> Error {
        crate::error::internal_error!("operator `{}` got key group {group}, but owns {:?}", self.operator, self.groups)
    }

    /// Reads, and possibly changes, the value of `key` (encoded: `key_bytes`,
    /// or empty to have it encoded here if need be) in `group`: `f` gets
    /// the current value (`None` if absent); whatever it leaves is stored
    /// (`None` removes the key).
    ///
    /// # Errors
    /// [`Error::State`] or [`Error::Codec`] when a byte backend fails;
    /// [`Error::Internal`] for a key group this instance does not own.
    #[inline]
    pub fn update<R>(
        &mut self,
        group: u16,
        key: K,
        key_bytes: &[u8],
        f: impl FnOnce(&mut Option<V>) -> R,
    ) -> Result<R> {
        if !self.groups.contains(&group) {
            return Err(self.group_error(group));
        }
        let index = usize::from(group - self.groups.start);
        match &mut self.store {
            Store::Objects(maps) => {
                let Some(map) = maps.get_mut(index) else {
                    return Err(crate::error::internal_error!(
                        "operator `{}` has no map for key group {group}",
                        self.operator
                    ));
                };
                let epoch = self.epoch;
                if let Some(overlay) = self.overlays.get_mut(index) {
                    if map.is_shared() && overlay.len() < OVERLAY_MIN + map.len() / 8 {
                        // A snapshot still shares the map: write beside it.
                        let tracked =
                            self.removed.get_mut(index).zip(self.logs.get_mut(index)).filter(|_| self.tracking);
                        self.wanted.set(index);
                        return Ok(overlaid_update(map, overlay, tracked, key, epoch, f));
                    }
                    if !overlay.is_empty() {
                        apply_overlay(self.spares.make_mut(map), overlay);
                    }
                }
                let map = self.spares.make_mut(map);
                if !self.tracking {
                    // Nothing to log (no checkpoint has started yet): the
                    // path every record of a job without checkpoints takes.
                    return Ok(match map.entry(key) {
                        flat::Entry::Occupied(e) => {
                            let mut result = None;
                            e.replace_entry_with(|_, (value, _)| {
                                let mut slot = Some(value);
                                result = Some(f(&mut slot));
                                slot.map(|v| (v, epoch))
                            });
                            result
                                .ok_or_else(|| crate::error::internal_error!("state update closure was not called"))?
                        }
                        flat::Entry::Vacant(e) => {
                            let mut slot = None;
                            let r = f(&mut slot);
                            if let Some(value) = slot {
                                e.insert((value, epoch));
                            }
                            r
                        }
                    });
                }
                let map_len = map.len();
                Ok(match map.entry(key) {
                    flat::Entry::Occupied(e) => {
                        let mut result = None;
                        let mut gone = None;
                        let mut first = None;
                        e.replace_entry_with(|k, (value, stamp)| {
                            let mut slot = Some(value);
                            result = Some(f(&mut slot));
                            if slot.is_none() {
                                gone = Some(k.clone());
                            } else if stamp != epoch {
                                first = Some(k.clone());
                            }
                            slot.map(|v| (v, epoch))
                        });
                        if let (Some(k), Some(removed)) = (gone, self.removed.get_mut(index)) {
                            removed.push(k);
                        }
                        if let (Some(k), Some(log)) = (first, self.logs.get_mut(index)) {
                            log.record(&k, map_len);
                        }
                        result.ok_or_else(|| crate::error::internal_error!("state update closure was not called"))?
                    }
                    flat::Entry::Vacant(e) => {
                        let mut slot = None;
                        let r = f(&mut slot);
                        if let Some(value) = slot {
                            if let Some(log) = self.logs.get_mut(index) {
                                log.record(e.key(), map_len);
                            }
                            e.insert((value, epoch));
                        }
                        r
                    }
                })
            }
            Store::Cached(store) => {
                let tracking = cache::Tracking { on: self.tracking, changed: &mut self.changed };
                let keys = self.logs.get_mut(index).filter(|_| self.tracking);
                let key_bytes = encoded(&key, key_bytes, &mut self.key_buf);
                store.update(index, group, key, key_bytes, self.epoch, tracking, keys, f)
            }
            Store::Bytes { table, buf } => {
                let key_bytes = encoded(&key, key_bytes, &mut self.key_buf);
                let codec = |source| Error::Codec { operator: self.operator.clone(), source };
                let mut slot = match table.get(group, key_bytes)? {
                    Some(bytes) => Some(V::decode(&bytes).map_err(codec)?),
                    None => None,
                };
                let existed = slot.is_some();
                let r = f(&mut slot);
                let written = match slot {
                    Some(v) => {
                        buf.clear();
                        v.encode(buf).map_err(codec)?;
                        table.put(group, key_bytes, buf)?;
                        Some(buf.as_slice())
                    }
                    None if existed => {
                        table.delete(group, key_bytes)?;
                        None
                    }
                    // Absent before and after: nothing changed.
                    None => return Ok(r),
                };
                if self.tracking {
                    log_byte_change(&mut self.changed, index, self.epoch, key_bytes, written);
                }
                Ok(r)
            }
        }
    }

    /// Removes `key_bytes` from `group` of a byte store without reading it
    /// first: the caller knows it is there (timers found by a scan of the
    /// table). Logged for incremental checkpoints as [`ValueStore::update`]
    /// logs a removal.
    ///
    /// # Errors
    /// [`Error::State`] when the table fails; [`Error::Internal`] for a
    /// key group this instance does not own, or a store that is not a
    /// byte table.
    pub(super) fn remove_present(&mut self, group: u16, key: K, key_bytes: &[u8]) -> Result<()> {
        if !self.groups.contains(&group) {
            return Err(self.group_error(group));
        }
        let index = usize::from(group - self.groups.start);
        let table = match &mut self.store {
            Store::Bytes { table, .. } => table,
            Store::Cached(store) => {
                let tracking = cache::Tracking { on: self.tracking, changed: &mut self.changed };
                let keys = self.logs.get_mut(index).filter(|_| self.tracking);
                return store.blind(index, group, key, key_bytes, self.epoch, tracking, keys, true, None);
            }
            Store::Objects(_) => {
                return Err(crate::error::internal_error!(
                    "operator `{}`: a blind removal outside a byte table",
                    self.operator
                ));
            }
        };
        table.delete(group, key_bytes)?;
        if self.tracking {
            log_byte_change(&mut self.changed, index, self.epoch, key_bytes, None);
        }
        Ok(())
    }

    /// Writes `value` at `key_bytes` of `group` of a byte store without
    /// reading first: the caller knows nothing is there (a timer within
    /// the part of its key group read ahead, or after every timer of its
    /// group). Logged for incremental
    /// checkpoints as [`ValueStore::update`] logs a write.
    ///
    /// # Errors
    /// As [`ValueStore::remove_present`]; [`Error::Codec`] when `value`
    /// does not encode.
    pub(super) fn put_absent(&mut self, group: u16, key: K, key_bytes: &[u8], value: &V) -> Result<()> {
        if !self.groups.contains(&group) {
            return Err(self.group_error(group));
        }
        let index = usize::from(group - self.groups.start);
        let (table, buf) = match &mut self.store {
            Store::Bytes { table, buf } => (table, buf),
            Store::Cached(store) => {
                let tracking = cache::Tracking { on: self.tracking, changed: &mut self.changed };
                let keys = self.logs.get_mut(index).filter(|_| self.tracking);
                return store.blind(
                    index,
                    group,
                    key,
                    key_bytes,
                    self.epoch,
                    tracking,
                    keys,
                    false,
                    Some(value.clone()),
                );
            }
            Store::Objects(_) => {
                return Err(crate::error::internal_error!(
                    "operator `{}`: a blind write outside a byte table",
                    self.operator
                ));
            }
        };
        buf.clear();
        value.encode(buf).map_err(|source| Error::Codec { operator: self.operator.clone(), source })?;
        table.put(group, key_bytes, buf)?;
        if self.tracking {
            log_byte_change(&mut self.changed, index, self.epoch, key_bytes, Some(buf.as_slice()));
        }
        Ok(())
    }

    /// Whether a keyed operator should ask for its keys ahead
    /// ([`ValueStore::prefetch`]) in the batch it is about to process: in
    /// memory, once the entries its maps have room for take
    /// [`PREFETCH_MIN_BYTES`] or more;
    /// in the cache in front of a byte table, always; on a byte table
    /// alone, never (it does nothing then). Decided again every
    /// [`PREFETCH_RECHECK`] batches, so that a state that grows starts
    /// asking soon after it outgrows the caches.
    #[inline]
    pub(crate) fn prefetch_pays(&mut self) -> bool {
        if self.prefetch_recheck == 0 {
            self.prefetch_recheck = PREFETCH_RECHECK;
            self.prefetch_on = match &self.store {
                Store::Objects(maps) => {
                    let room: usize = maps.iter().map(|m| m.capacity()).sum();
                    room.saturating_mul(size_of::<(K, (V, u32))>()) >= PREFETCH_MIN_BYTES
                }
                Store::Cached(_) => true,
                Store::Bytes { .. } => false,
            };
        }
        self.prefetch_recheck -= 1;
        self.prefetch_on
    }

    /// Asks for the cache lines `keys` live on, so that they are loaded when
    /// [`ValueStore::update`] needs them.
    ///
    /// In memory, the lines each key's update reads (its map's control
    /// bytes where the probe starts, and the entries there) are
    /// prefetched: nothing waits for them (see `FlatMap::prefetch`). In the
    /// cache of live values, the keys are looked up: the lookups are
    /// independent of each other, so the processor overlaps their cache
    /// misses, where one by one inside `update` (between user code and
    /// output) each miss would be paid in full. A byte store does nothing.
    pub fn prefetch<'k>(&self, keys: impl IntoIterator<Item = (u16, &'k K)>) {
        match &self.store {
            Store::Objects(maps) => {
                for (group, key) in keys {
                    if let Some(map) = maps.get(usize::from(group.wrapping_sub(self.groups.start))) {
                        map.prefetch(key);
                    }
                }
            }
            Store::Cached(store) => {
                let mut found = 0usize;
                for (group, key) in keys {
                    found += usize::from(store.contains(usize::from(group.wrapping_sub(self.groups.start)), key));
                }
                std::hint::black_box(found);
            }
            Store::Bytes { .. } => {}
        }
    }

    /// The value of `key` in `group`, if any.
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    pub fn get(&mut self, group: u16, key: &K, key_bytes: &[u8]) -> Result<Option<V>> {
        if !self.groups.contains(&group) {
            return Err(self.group_error(group));
        }
        let index = usize::from(group - self.groups.start);
        // A read neither copies a shared map nor writes, nor counts as a change.
        match &mut self.store {
            Store::Objects(maps) => {
                if let Some((slot, _)) = self.overlays.get(index).and_then(|o| o.get(key)) {
                    return Ok(slot.clone());
                }
                Ok(maps.get(index).and_then(|m| m.get(key)).map(|(v, _)| v.clone()))
            }
            Store::Cached(store) => store.get(index, group, key, encoded(key, key_bytes, &mut self.key_buf)),
            Store::Bytes { table, .. } => match table.get(group, encoded(key, key_bytes, &mut self.key_buf))? {
                Some(bytes) => V::decode(&bytes)
                    .map(Some)
                    .map_err(|source| Error::Codec { operator: self.operator.clone(), source }),
                None => Ok(None),
            },
        }
    }

    /// Calls `f` with every key and value of `group` (for byte backends, in
    /// key-byte order).
    ///
    /// # Errors
    /// As [`ValueStore::update`], and [`Error::Internal`] when a stored key
    /// does not decode.
    pub fn for_each_in_group(&mut self, group: u16, mut f: impl FnMut(&K, &V)) -> Result<()> {
        if !self.groups.contains(&group) {
            return Err(self.group_error(group));
        }
        let index = usize::from(group - self.groups.start);
        let operator = self.operator.clone();
        if let Store::Objects(maps) = &self.store {
            let overlay = self.overlays.get(index).filter(|o| !o.is_empty());
            for (k, (v, _)) in maps.get(index).into_iter().flat_map(|m| m.iter()) {
                if !overlay.is_some_and(|o| o.contains_key(k)) {
                    f(k, v);
                }
            }
            for (k, (slot, _)) in overlay.into_iter().flat_map(|o| o.iter()) {
                if let Some(v) = slot {
                    f(k, v);
                }
            }
            return Ok(());
        }
        let mut failure = None;
        let mut each = |k: &[u8], bytes: &[u8]| {
            if failure.is_some() {
                return;
            }
            match (crate::codec::key::decode::<K>(k), V::decode(bytes)) {
                (Ok(k), Ok(v)) => f(&k, &v),
                (Err(e), _) => failure = Some(crate::error::internal_error!("operator `{operator}`: stored {e}")),
                (_, Err(source)) => failure = Some(Error::Codec { operator: operator.clone(), source }),
            }
        };
        match &mut self.store {
            Store::Cached(store) => {
                let tracking = cache::Tracking { on: self.tracking, changed: &mut self.changed };
                store.scan(index, tracking, &mut each)?;
            }
            Store::Bytes { table, .. } => table.scan_group(group, &mut each)?,
            Store::Objects(_) => {}
        }
        failure.map_or(Ok(()), Err)
    }
}

pub(super) fn codec_error(operator: &str, source: crate::codec::CodecError) -> Error {
    Error::Codec { operator: operator.to_string(), source }
}

pub(super) fn key_error(operator: &str, e: crate::codec::key::KeyDecodeError) -> Error {
    Error::State {
        operator: operator.to_string(),
        message: "a checkpointed key does not decode".into(),
        source: Some(e.into()),
    }
}

impl<K: Key, V: Data> ValueStore<K, V> {
    /// Every entry, encoded (a full snapshot).
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    pub fn export(&mut self) -> Result<Entries> {
        Ok(gather(self.snapshot_deferred()?)?.entries)
    }

    /// All entries as of now, to encode later (see
    /// [`ValueStore::snapshot_changes`]).
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    pub fn snapshot_deferred(&mut self) -> Result<Snapshot> {
        self.snapshot_at(None)
    }

    /// The state at barrier `checkpoint`, to encode later (on another
    /// thread): every [`FULL_CHECKPOINT_EVERY`] snapshots (and the first)
    /// all entries, otherwise what changed since checkpoint `since` (the
    /// last complete one: changes made for checkpoints that did not
    /// complete are included again). For the in-memory store this only
    /// shares the per-key-group maps, which the operator copies when it
    /// next writes them, so the caller pays O(key groups) at the barrier,
    /// plus a scan of the change log for byte backends, which log each
    /// change with its encoded value (a base reads everything from a
    /// snapshot where the backend has one).
    ///
    /// A delta needs a complete checkpoint taken in this run to build on:
    /// until one completes (after a start or a restore), every snapshot is a
    /// base.
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    pub fn snapshot_changes(&mut self, checkpoint: CheckpointId, since: CheckpointId) -> Result<Snapshot> {
        self.snapshot_at(Some(Barrier::new(checkpoint, since)))
    }

    /// Sets `key` to `value`, taken to be in a checkpoint already (a
    /// window's accumulator moved from memory to the table): removed again
    /// before the next barrier, its removal is logged all the same.
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    pub(super) fn put_carried(&mut self, group: u16, key: K, key_bytes: &[u8], value: V) -> Result<()> {
        if let Store::Cached(store) = &mut self.store {
            store.carried = true;
        }
        let done = self.update(group, key, key_bytes, |slot| *slot = Some(value));
        if let Store::Cached(store) = &mut self.store {
            store.carried = false;
        }
        done
    }

    /// Whether the snapshot at `at` (see [`ValueStore::snapshot_at`])
    /// would be a base.
    pub(super) fn base_at(&self, at: Option<Barrier>) -> bool {
        delta_since(at, self.first_base, self.since_full).is_none()
    }

    /// Makes the next snapshot a base, as after a start: a delta then needs
    /// that base's checkpoint to complete (for a state that must write a
    /// base when another does, so that the two restore together).
    pub(super) fn force_base(&mut self) {
        self.first_base = None;
    }

    pub(super) fn snapshot_at(&mut self, at: Option<Barrier>) -> Result<Snapshot> {
        let since = delta_since(at, self.first_base, self.since_full);
        // The epoch this barrier ends (changes from here on are the next's).
        let ending = self.epoch;
        // The logs a complete checkpoint holds are not needed again: they
        // are freed with the snapshot, off the worker (see below).
        let (mut dropped_keys, mut dropped_changes) = match at {
            Some(_) => (self.dropped_keys.take(), self.dropped_changes.take()),
            None => (spares::Recycler::none(), spares::Recycler::none()),
        };
        // Per key group, the keys a delta looks up (`None`: it scans).
        let mut logged = spares::Recycler::none();
        if let (Some(at), Store::Objects(_) | Store::Cached(_)) = (at, &self.store) {
            let tracking = self.tracking;
            let dropped = &mut *dropped_keys;
            let keys = self.logs.iter_mut().map(|log| {
                if tracking { log.at_barrier(ending, at, since, dropped) } else { log.at_barrier(0, at, None, dropped) }
            });
            if since.is_some() {
                logged = self.logged.take();
                logged.extend(keys);
            } else {
                // A base looks up no keys: nothing to allocate in the pause
                // (with glibc's allocator, the first allocation of a
                // kilobyte or more after many small frees merges the freed
                // chunks first: milliseconds at the base after a long run
                // on fjall, `bench ckpt`).
                keys.for_each(drop);
            }
        }
        if let Some(at) = at {
            self.first_base.get_or_insert(at.checkpoint);
            self.since_full = if since.is_some() { self.since_full + 1 } else { 1 };
            // Changes from now on belong to the next checkpoint.
            self.epoch = at.next_epoch();
            self.tracking = true;
        }
        // Removals and changes a complete checkpoint holds are not needed
        // again; the others are kept even when this snapshot is a base,
        // since a base whose checkpoint fails leaves the next delta building
        // on an older complete checkpoint. (A plain snapshot, not for a
        // checkpoint, leaves the logs alone.) The logs dropped are freed
        // with the snapshot, off the worker.
        if let Some(at) = at {
            for r in &mut self.removed {
                r.at_barrier(ending, at.completed, &mut dropped_keys);
            }
            for c in &mut self.changed {
                c.at_barrier(ending, at.completed, &mut dropped_changes);
            }
        }
        // A byte store's delta: per key group (by index), the sealed change
        // maps it reads.
        let mut changes = spares::Recycler::none();
        if since.is_some() && !matches!(self.store, Store::Objects(_)) {
            changes = self.changed_lists.take();
            changes.extend(
                self.changed.iter().enumerate().flat_map(|(i, c)| c.sealed.iter().map(move |(_, m)| (i, m.clone()))),
            );
        }
        let snapshot = self.snapshot_store(since, changes, logged)?;
        if dropped_keys.is_empty() && dropped_changes.is_empty() {
            return Ok(snapshot);
        }
        Ok(Box::new(move |sink| {
            let written = snapshot(sink);
            drop((dropped_keys, dropped_changes));
            written
        }))
    }

    /// The store's snapshot for [`ValueStore::snapshot_at`], once the
    /// logs are sealed: a base (`since` is `None`) or a delta, which
    /// looks up the `logged` keys (in memory, or in a cache) and writes
    /// the `changes` (a byte store, or a cache's write-backs).
    fn snapshot_store(
        &mut self,
        since: Option<u32>,
        changes: spares::Recycled<(usize, Arc<ChangedKeys>)>,
        logged: spares::Recycled<Option<Vec<Arc<Vec<K>>>>>,
    ) -> Result<Snapshot> {
        let base = since.is_none();
        match &mut self.store {
            Store::Objects(maps) => {
                let mut removed = self.removed_lists.take();
                if !base {
                    removed.extend(
                        self.groups
                            .clone()
                            .zip(&self.removed)
                            .flat_map(|(g, r)| r.sealed().map(move |keys| (g, keys.clone()))),
                    );
                }
                // Writes an earlier snapshot made wait go into the maps first.
                for (map, overlay) in maps.iter_mut().zip(self.overlays.iter_mut()) {
                    if !overlay.is_empty() {
                        apply_overlay(self.spares.make_mut(map), overlay);
                    }
                }
                self.wanted.clear();
                let mut maps = spares::Holding::new(maps, &self.spares, &self.wanted);
                let (first, operator) = (self.groups.start, self.operator.clone());
                Ok(Box::new(move |sink| {
                    // A delta's removals first: a key removed and then set
                    // again is in both.
                    let mut part = SnapshotPart::new(base);
                    for (group, keys) in removed.iter() {
                        for k in keys.iter() {
                            part.remove(*group, k)?;
                            pass_if_full(&mut part, sink)?;
                        }
                    }
                    flush_part(&mut part, sink)?;
                    for (i, group) in (0..maps.len()).zip(first..) {
                        if let (Some(since), Some(Some(segments))) = (since, logged.get(i)) {
                            // The logged keys, each once, as the map holds them.
                            // A few lookups per key group: the maps the worker
                            // has written beside are not copied first (a copy
                            // of every map for 1% of their keys took half the
                            // checkpoint), only every 4,096 keys of a long log.
                            let held = maps.take_alone(i);
                            let mut seen: hashbrown::HashSet<&K, FxBuildHasher> = hashbrown::HashSet::default();
                            let map = held.map();
                            for (n, k) in segments.iter().flat_map(|keys| keys.iter()).enumerate() {
                                if n % 4_096 == 4_095 {
                                    maps.release(i);
                                }
                                if !seen.insert(k) {
                                    continue;
                                }
                                if let Some((v, stamp)) = map.and_then(|m| m.get(k))
                                    && *stamp > since
                                {
                                    part.put(group, k, v, &operator)?;
                                    pass_if_full(&mut part, sink)?;
                                }
                            }
                            flush_part(&mut part, sink)?;
                            maps.done(held);
                            continue;
                        }
                        let held = maps.take(i);
                        for (n, (k, (v, stamp))) in held.map().into_iter().flat_map(|m| m.iter()).enumerate() {
                            if n % 4_096 == 4_095 {
                                maps.release(i);
                            }
                            if since.is_some_and(|s| *stamp <= s) {
                                continue;
                            }
                            part.put(group, k, v, &operator)?;
                            pass_if_full(&mut part, sink)?;
                        }
                        flush_part(&mut part, sink)?;
                        maps.done(held);
                    }
                    Ok(base)
                }))
            }
            Store::Cached(store) => match since {
                None => store.snapshot_base(self.groups.clone()),
                Some(since) => Ok(store.snapshot_delta(since, changes, logged)),
            },
            Store::Bytes { table, .. } => match since {
                None => table.snapshot_deferred(self.groups.clone()),
                Some(since) => {
                    let groups = self.groups.clone();
                    Ok(Box::new(move |sink| {
                        // A key is either written or removed: one part per key group.
                        let mut out = SnapshotPart::new(false);
                        let mut at = 0;
                        for (index, group) in groups.enumerate() {
                            latest_changes(group_changes(&changes, &mut at, index), since, |_, key, value| {
                                match value {
                                    Some(value) => out.part.push(group, key, value)?,
                                    None => out.part.push_removed(group, key)?,
                                }
                                pass_if_full(&mut out, sink)
                            })?;
                            flush_part(&mut out, sink)?;
                        }
                        Ok(false)
                    }))
                }
            },
        }
    }

    /// Loads entries from a checkpoint (those outside this instance's key
    /// groups are an internal error: the caller filters them).
    ///
    /// # Errors
    /// [`Error::State`] or [`Error::Codec`] for entries that do not decode.
    pub fn import(&mut self, entries: Entries) -> Result<()> {
        self.import_part(&mut entry_refs(&entries), &[])
    }

    /// Loads a part of a checkpoint: removes `removed`, then sets `entries`
    /// (see [`Restore`](crate::checkpoint) chains: a delta's part removes
    /// and then puts). The entries are borrowed from the checkpoint's
    /// frame; a backend that writes them to a table sorts `entries` in
    /// place (by key group and key) first.
    ///
    /// # Errors
    /// As [`ValueStore::import`].
    pub fn import_part(&mut self, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        let owned = |group: &u16| {
            if self.groups.contains(group) {
                Ok(())
            } else {
                Err(crate::error::internal_error!(
                    "operator `{}` got key group {group}, but owns {:?}",
                    self.operator,
                    self.groups
                ))
            }
        };
        for (group, key) in removed {
            owned(group)?;
            crate::codec::key::decode::<K>(key).map_err(|e| key_error(&self.operator, e))?;
        }
        if matches!(self.store, Store::Bytes { .. } | Store::Cached(_)) {
            // Checked, then stored in key order, with no read first. A
            // part may come in any order (an in-memory state's, or cached
            // values laid over a table's); written in order, fjall's tables
            // overlap less and compaction keeps up (5 M keys: a restore
            // took 8 s in the order of the file, 4.7 s sorted). A stable
            // sort: a part never holds a key twice, but if it did, the last
            // would still win.
            entries.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
            for (group, key, value) in entries.iter() {
                owned(group)?;
                crate::codec::key::decode::<K>(key).map_err(|e| key_error(&self.operator, e))?;
                V::decode(value).map_err(|e| codec_error(&self.operator, e))?;
            }
            return match &mut self.store {
                Store::Cached(store) => {
                    store.import(entries, removed, cache::Tracking { on: self.tracking, changed: &mut self.changed })
                }
                Store::Bytes { table, .. } => {
                    if !removed.is_empty() {
                        table.apply(removed.iter().map(|(g, k)| (*g, k.to_vec(), None)).collect())?;
                    }
                    table.put_all(entries)
                }
                Store::Objects(_) => Ok(()),
            };
        }
        for &(group, key) in removed {
            let k = crate::codec::key::decode::<K>(key).map_err(|e| key_error(&self.operator, e))?;
            self.update(group, k, key, |slot| *slot = None)?;
        }
        if let Store::Objects(maps) = &mut self.store {
            // Room for the part's entries first, in maps still empty (a
            // base's first part): a restore grows them once, not by doubling
            // (5 M keys: restore 2.3 s -> 2.0 s). Not in maps that hold
            // entries: a delta's keys are mostly there already.
            let mut counts = vec![0usize; maps.len()];
            for (group, _, _) in entries.iter() {
                if let Some(n) = group.checked_sub(self.groups.start).and_then(|i| counts.get_mut(usize::from(i))) {
                    *n += 1;
                }
            }
            for (map, n) in maps.iter_mut().zip(counts) {
                if n > 0 && map.is_empty() {
                    self.spares.make_mut(map).reserve(n);
                }
            }
        }
        for &mut (group, key, value) in entries {
            let k = crate::codec::key::decode::<K>(key).map_err(|e| key_error(&self.operator, e))?;
            let v = V::decode(value).map_err(|e| codec_error(&self.operator, e))?;
            self.update(group, k, key, |slot| *slot = Some(v))?;
        }
        Ok(())
    }
}

impl<K: Key, V: Data> super::KeyedState for ValueStore<K, V> {
    fn snapshot_at(&mut self, _operator: &str, at: Option<Barrier>) -> Result<Snapshot> {
        ValueStore::snapshot_at(self, at)
    }

    fn import_part(&mut self, _operator: &str, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        ValueStore::import_part(self, entries, removed)
    }

    fn stats(&self) -> super::StateStats {
        match &self.store {
            Store::Objects(maps) => {
                super::StateStats::in_memory(maps.iter().map(|m| m.len()).sum(), std::mem::size_of::<(K, (V, u32))>())
            }
            Store::Cached(store) => store.stats(),
            Store::Bytes { table, .. } => super::StateStats { table: table.size(), ..super::StateStats::default() },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A small state in memory is not prefetched; once its maps outgrow
    /// `PREFETCH_MIN_BYTES` it is, from the next decision on (every
    /// `PREFETCH_RECHECK` batches).
    #[test]
    fn prefetching_starts_once_the_state_outgrows_the_caches() {
        let scope = StateScope::new("j", "op", "s", 0..4, 4);
        let mut s = ValueStore::<u64, u64>::open(&super::super::MemoryBackend, &scope).unwrap();
        assert!(!s.prefetch_pays(), "an empty state");
        let entry = size_of::<(u64, (u64, u32))>();
        let keys = (PREFETCH_MIN_BYTES / entry) as u64;
        for k in 0..keys {
            s.update((k % 4) as u16, k, &[], |v| *v = Some(k)).unwrap();
        }
        // Still the decision made when it was empty, until the recheck.
        for _ in 1..PREFETCH_RECHECK {
            assert!(!s.prefetch_pays());
        }
        assert!(s.prefetch_pays(), "{keys} keys of {entry} bytes");
    }

    /// A barrier seals the epoch's removals into a list it shares with the
    /// delta (the same allocation, not a copy), keeps every list a
    /// complete checkpoint does not hold yet (a delta after a failed
    /// checkpoint writes them again), and hands those one holds to the snapshot whole.
    #[test]
    fn removals_are_sealed_per_epoch_shared_and_dropped_once_complete() {
        let mut r: Removals<u64> = Removals::default();
        let mut dropped = Vec::new();
        r.push(1);
        r.push(2);
        r.at_barrier(1, 0, &mut dropped);
        let first: Vec<Arc<Vec<u64>>> = r.sealed().cloned().collect();
        assert_eq!(first.iter().map(|k| k.as_slice()).collect::<Vec<_>>(), [[1, 2]]);
        // Checkpoint 1 does not complete: its removals go out again.
        r.push(3);
        r.at_barrier(2, 0, &mut dropped);
        let second: Vec<Arc<Vec<u64>>> = r.sealed().cloned().collect();
        assert_eq!(second.len(), 2);
        assert!(Arc::ptr_eq(first.first().unwrap(), second.first().unwrap()), "shared, not copied");
        assert_eq!(second.get(1).map(|k| k.as_slice()), Some(&[3][..]));
        assert!(dropped.is_empty());
        // An epoch without removals seals nothing; checkpoint 2 completes,
        // and both lists leave whole, for the snapshot to free.
        r.at_barrier(3, 2, &mut dropped);
        assert_eq!((r.len(), dropped.len()), (0, 2));
        assert!(second.iter().zip(&dropped).all(|(s, d)| Arc::ptr_eq(s, d)));
        r.push(4);
        assert_eq!(r.len(), 1);
        r.at_barrier(4, 2, &mut dropped);
        assert_eq!(r.sealed().map(|k| k.as_slice()).collect::<Vec<_>>(), [[4]]);
    }

    /// A byte store's changes are sealed per epoch; a delta over several
    /// epochs (a checkpoint in between did not complete) writes each key's
    /// latest change once, however many epochs changed it, and only those
    /// after the checkpoint it builds on; the maps a complete checkpoint
    /// holds leave the state whole (for the snapshot to free).
    #[test]
    fn byte_changes_give_each_keys_latest_change_once_and_leave_whole() {
        let mut c = ByteChanges::default();
        let put = |v: u8| (1, Some(vec![v].into_boxed_slice()));
        c.log(b"a", put(1));
        c.log(b"b", put(2));
        c.log(b"a", put(3));
        let mut dropped = Vec::new();
        c.at_barrier(1, 0, &mut dropped);
        // Checkpoint 1 does not complete; epoch 2 removes `a`, writes `c`.
        c.log(b"a", (2, None));
        c.log(b"c", (2, Some(vec![4].into_boxed_slice())));
        c.at_barrier(2, 0, &mut dropped);
        assert!(dropped.is_empty());
        let sealed: Vec<(usize, Arc<ChangedKeys>)> = c.sealed.iter().map(|(_, m)| (7, m.clone())).collect();
        let delta = |since: u32| {
            let mut out: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
            latest_changes(&sealed, since, |_, k, v| {
                out.push((k.to_vec(), v.as_ref().map(|v| v.to_vec())));
                Ok(())
            })
            .unwrap();
            out.sort();
            out
        };
        let all = vec![(b"a".to_vec(), None), (b"b".to_vec(), Some(vec![2])), (b"c".to_vec(), Some(vec![4]))];
        assert_eq!(delta(0), all);
        assert_eq!(delta(1), vec![(b"a".to_vec(), None), (b"c".to_vec(), Some(vec![4]))]);
        // Key group 7's run, found from a list of several key groups'.
        let list: Vec<(usize, Arc<ChangedKeys>)> =
            [(3, Arc::default())].into_iter().chain(sealed.iter().cloned()).chain([(9, Arc::default())]).collect();
        let mut at = 0;
        assert_eq!(group_changes(&list, &mut at, 3).len(), 1);
        assert_eq!(group_changes(&list, &mut at, 5).len(), 0);
        assert_eq!(group_changes(&list, &mut at, 7).len(), 2);
        assert_eq!((group_changes(&list, &mut at, 9).len(), at), (1, 4));
        // Checkpoint 2 completes: both maps leave, unfreed (the delta's
        // references and `dropped` hold them).
        drop(list);
        c.at_barrier(3, 2, &mut dropped);
        assert_eq!((c.len(), dropped.len()), (0, 2));
        assert!(sealed.iter().zip(&dropped).all(|((_, s), d)| Arc::ptr_eq(s, d)));
    }
}
