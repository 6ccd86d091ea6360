//! `ValueStore`: one value per key, typed, over one of three stores, each
//! its own type behind the private trait [`Store`]:
//!
//! - [`ObjectStore`](objects::ObjectStore): typed maps in memory, one per
//!   owned key group (the memory backend);
//! - [`CachedStore`](cached::CachedStore): live values cached in front of
//!   a byte table (fjall, with its cache);
//! - [`ByteStore`](bytes::ByteStore): a byte table alone (fjall without a
//!   cache, and the states read in key order: map and list entries).
//!
//! `ValueStore` keeps what they share (the key groups owned, the epoch
//! changes are stamped with, whether the next snapshot is a base) and
//! dispatches to the store without dynamic calls, so that the record path
//! of each store inlines as it did when they were one type. What each
//! logs for incremental checkpoints is in [`logs`].

mod bytes;
mod cached;
mod logs;
mod objects;

use std::fmt;
use std::ops::Range;

pub(in crate::state) use self::logs::{ByteChanges, ChangeLog, ChangedKeys, group_changes, latest_changes};
use super::snapshot::{Barrier, Entries, EntryRef, RemovedRef, Snapshot, delta_since, entry_refs, gather};
use super::{StateBackend, StateScope, StateStats, cache};
use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::{Error, Result};
use crate::record::CheckpointId;

/// One value per key: the typed handle keyed operators use.
///
/// Every access names the key twice: typed (for backends that keep
/// objects) and encoded (for backends that store bytes). The encoded key
/// may be empty when the caller has only the typed one (a record from a
/// hash edge inside the process carries no key bytes): a byte backend
/// encodes the key then, and the in-memory one needs no bytes at all.
pub struct ValueStore<K, V> {
    store: Backing<K, V>,
    at: Shared,
    /// Snapshots since the last full one.
    since_full: u32,
    /// The checkpoint of this run's first snapshot (a base): a delta needs
    /// a complete checkpoint at or after it to build on, since changes
    /// before it were neither stamped nor logged.
    first_base: Option<u64>,
    /// Whether looking keys up ahead pays (see [`ValueStore::prefetch_pays`]),
    /// and how many more batches before it is decided again.
    prefetch_on: bool,
    prefetch_recheck: u32,
}

/// The store a [`ValueStore`] is over.
enum Backing<K, V> {
    Objects(objects::ObjectStore<K, V>),
    Cached(Box<cached::CachedStore<K, V>>),
    Bytes(bytes::ByteStore<K, V>),
}

/// Calls the same [`Store`] method on whichever store `$store` holds.
macro_rules! dispatch {
    ($store:expr, $s:ident => $call:expr) => {
        match $store {
            Backing::Objects($s) => $call,
            Backing::Cached($s) => $call,
            Backing::Bytes($s) => $call,
        }
    };
}

/// What every store of a [`ValueStore`] reads: which key groups it owns,
/// for which operator, and how changes are stamped and logged now.
pub(super) struct Shared {
    pub(super) groups: Range<u16>,
    pub(super) operator: String,
    /// The checkpoint being built (one after the last barrier): values
    /// changed now are stamped with it.
    pub(super) epoch: u32,
    /// Whether changes are tracked for incremental checkpoints: from the
    /// first checkpoint on (that one is a base, which holds everything
    /// before it), so a job without checkpoints keeps no change log.
    pub(super) tracking: bool,
}

impl Shared {
    /// `group` with its position among the owned key groups.
    ///
    /// # Errors
    /// [`Error::Internal`] for a key group this instance does not own.
    #[inline]
    fn owned(&self, group: u16) -> Result<Group> {
        if self.groups.contains(&group) {
            Ok(Group { index: usize::from(group - self.groups.start), id: group })
        } else {
            Err(self.not_owned(group))
        }
    }

    #[cold]
    #[inline(never)]
    fn not_owned(&self, group: u16) -> Error {
        crate::error::internal_error!("operator `{}` got key group {group}, but owns {:?}", self.operator, self.groups)
    }

    /// The error for an operation only a byte table has.
    fn no_table(&self, what: &str) -> Error {
        crate::error::internal_error!("operator `{}`: {what} outside a byte table", self.operator)
    }
}

/// An owned key group: its id, and its position among the owned ones
/// (where the stores keep its map and logs).
#[derive(Clone, Copy, Debug)]
pub(super) struct Group {
    pub(super) index: usize,
    pub(super) id: u16,
}

/// A snapshot's barrier, as the store seals its logs at it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Seal {
    /// The checkpoint's barrier (`None`: a plain snapshot, which leaves
    /// the logs alone).
    pub(super) barrier: Option<Barrier>,
    /// The epoch a delta builds on (`None`: a base).
    pub(super) since: Option<u32>,
    /// The epoch the barrier ends (changes from here on are the next's).
    pub(super) ending: u32,
    /// Whether changes were tracked until the barrier.
    pub(super) tracking: bool,
}

/// A store of one value per key: what [`ValueStore`] asks of each of its
/// three. Every method is given the key group already checked as owned.
pub(super) trait Store<K: Key, V: Data> {
    /// See [`ValueStore::update`].
    fn update<R>(
        &mut self,
        at: &Shared,
        group: Group,
        key: K,
        key_bytes: &[u8],
        f: impl FnOnce(&mut Option<V>) -> R,
    ) -> Result<R>;

    /// See [`ValueStore::modify`]. The default is an update.
    fn modify<R>(
        &mut self,
        at: &Shared,
        group: Group,
        key: K,
        key_bytes: &[u8],
        init: impl FnOnce() -> V,
        f: impl FnOnce(&mut V) -> R,
    ) -> Result<R> {
        self.update(at, group, key, key_bytes, |slot| f(slot.get_or_insert_with(init)))
    }

    /// See [`ValueStore::get`].
    fn get(&mut self, at: &Shared, group: Group, key: &K, key_bytes: &[u8]) -> Result<Option<V>>;

    /// See [`ValueStore::read`]. The default reads a copy.
    fn read<R>(
        &mut self,
        at: &Shared,
        group: Group,
        key: &K,
        key_bytes: &[u8],
        f: impl FnOnce(Option<&V>) -> R,
    ) -> Result<R> {
        Ok(f(self.get(at, group, key, key_bytes)?.as_ref()))
    }

    /// See [`ValueStore::for_each_in_group`].
    fn for_each_in_group(&mut self, at: &Shared, group: Group, f: impl FnMut(&K, &V)) -> Result<()>;

    /// See [`ValueStore::prefetch`].
    fn prefetch<'k>(&self, at: &Shared, keys: impl IntoIterator<Item = (u16, &'k K)>)
    where
        K: 'k;

    /// Whether asking for keys ahead pays now (see
    /// [`ValueStore::prefetch_pays`]).
    fn prefetch_pays(&self) -> bool;

    /// Seals the logs at `seal`'s barrier and takes the snapshot: a base
    /// (`seal.since` is `None`) or a delta.
    fn snapshot(&mut self, at: &Shared, seal: Seal) -> Result<Snapshot>;

    /// See [`ValueStore::import_part`]; `removed` is checked already.
    fn import_part(&mut self, at: &Shared, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()>;

    fn stats(&self) -> StateStats;

    /// How many changes the logs for deltas hold (removals; encoded changes).
    #[cfg(test)]
    fn logged(&self) -> usize;

    /// See [`ValueStore::scan_from`].
    fn scan_from(
        &mut self,
        at: &Shared,
        group: Group,
        from: &[u8],
        limit: usize,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        let _ = (group, from, limit, f);
        Err(at.no_table("an ordered scan"))
    }

    /// See [`ValueStore::remove_present`].
    fn remove_present(&mut self, at: &Shared, group: Group, key: K, key_bytes: &[u8]) -> Result<()> {
        let _ = (group, key, key_bytes);
        Err(at.no_table("a blind removal"))
    }

    /// See [`ValueStore::put_absent`].
    fn put_absent(&mut self, at: &Shared, group: Group, key: K, key_bytes: &[u8], value: &V) -> Result<()> {
        let _ = (group, key, key_bytes, value);
        Err(at.no_table("a blind write"))
    }

    /// See [`ValueStore::put_carried`].
    fn put_carried(&mut self, at: &Shared, group: Group, key: K, key_bytes: &[u8], value: V) -> Result<()> {
        self.update(at, group, key, key_bytes, |slot| *slot = Some(value))
    }
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

/// How many writes a map's overlay (the writes made beside a map a
/// snapshot still shares: see [`objects`]) takes before the worker copies
/// the map instead, plus an eighth of the map; and how many keys a change
/// log holds before it gives up, plus a quarter of its map.
pub(super) const OVERLAY_MIN: usize = 4_096;

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

/// Writes to a table: (key group, encoded key, encoded value or `None` to remove).
pub type Writes = Vec<(u16, Vec<u8>, Option<Vec<u8>>)>;

/// Every how many checkpoints a value state writes all its entries instead
/// of what changed (bounding the chain a restore replays).
pub const FULL_CHECKPOINT_EVERY: u32 = 10;

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

/// `snapshot`, which also frees `dropped` (logs a complete checkpoint
/// holds) when done, on the thread that writes it rather than the worker's.
fn freeing(snapshot: Snapshot, dropped: impl Send + 'static) -> Snapshot {
    Box::new(move |sink| {
        let written = snapshot(sink);
        drop(dropped);
        written
    })
}

/// Decodes the entries a byte table passes to `f`, keeping the first
/// failure (the table's scan cannot stop on one).
struct Decoding<'a, F> {
    operator: &'a str,
    f: F,
    failure: Option<Error>,
}

impl<'a, F> Decoding<'a, F> {
    fn new(operator: &'a str, f: F) -> Self {
        Self { operator, f, failure: None }
    }

    fn each<K: Key, V: Data>(&mut self, k: &[u8], bytes: &[u8])
    where
        F: FnMut(&K, &V),
    {
        if self.failure.is_some() {
            return;
        }
        match (crate::codec::key::decode::<K>(k), V::decode(bytes)) {
            (Ok(k), Ok(v)) => (self.f)(&k, &v),
            (Err(e), _) => {
                self.failure = Some(crate::error::internal_error!("operator `{}`: stored {e}", self.operator));
            }
            (_, Err(source)) => self.failure = Some(codec_error(self.operator, source)),
        }
    }

    fn done(self) -> Result<()> {
        self.failure.map_or(Ok(()), Err)
    }
}

/// Sorts a checkpoint's part by key group and key, for a table to take
/// in order, checking first that every entry is owned and decodes.
///
/// A part may come in any order (an in-memory state's, or cached values
/// laid over a table's); written in order, fjall's tables overlap less and
/// compaction keeps up (5 M keys: a restore took 8 s in the order of the
/// file, 4.7 s sorted). A stable sort: a part never holds a key twice, but
/// if it did, the last would still win.
fn sorted_and_checked<K: Key, V: Data>(at: &Shared, entries: &mut [EntryRef<'_>]) -> Result<()> {
    entries.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    for (group, key, value) in entries.iter() {
        at.owned(*group)?;
        crate::codec::key::decode::<K>(key).map_err(|e| key_error(&at.operator, e))?;
        V::decode(value).map_err(|e| codec_error(&at.operator, e))?;
    }
    Ok(())
}

impl<K, V> fmt::Debug for ValueStore<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValueStore")
            .field("operator", &self.at.operator)
            .field("groups", &self.at.groups)
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
            Backing::Objects(objects::ObjectStore::new(scope))
        } else if let Some(cache) = backend.object_cache() {
            let cache =
                cache::CacheStore::new(backend.open_table(scope)?, cache, scope.key_groups.clone(), &scope.operator);
            Backing::Cached(Box::new(cached::CachedStore::new(cache, scope)))
        } else {
            Backing::Bytes(bytes::ByteStore::new(backend.open_table(scope)?, scope))
        };
        Ok(Self::with_store(store, scope))
    }

    /// Opens the state `scope` names on `backend` for a state read a
    /// prefix at a time ([`ValueStore::scan_from`]: map and list state):
    /// live objects on a backend that keeps them, else the byte table
    /// behind the backend's cache if it has one.
    ///
    /// # Errors
    /// As [`ValueStore::open`].
    pub(super) fn open_scannable(backend: &dyn StateBackend, scope: &StateScope) -> Result<Self> {
        scope.check_values::<V>()?;
        if backend.keeps_objects() {
            return Ok(Self::with_store(Backing::Objects(objects::ObjectStore::new(scope)), scope));
        }
        Self::open_ordered(backend, scope)
    }

    /// Whether this store keeps live objects (in memory, unordered).
    pub(super) fn keeps_objects(&self) -> bool {
        matches!(self.store, Backing::Objects(_))
    }

    /// Opens the state `scope` names on `backend`'s byte table, behind the
    /// backend's cache if it has one, for a state read in key order
    /// ([`ValueStore::scan_from`]: timers).
    pub(super) fn open_ordered(backend: &dyn StateBackend, scope: &StateScope) -> Result<Self> {
        let table = backend.open_table(scope)?;
        let store = match backend.object_cache() {
            Some(cache) => {
                let cache = cache::CacheStore::new(table, cache, scope.key_groups.clone(), &scope.operator);
                Backing::Cached(Box::new(cached::CachedStore::new(cache, scope)))
            }
            None => Backing::Bytes(bytes::ByteStore::new(table, scope)),
        };
        Ok(Self::with_store(store, scope))
    }

    fn with_store(store: Backing<K, V>, scope: &StateScope) -> Self {
        Self {
            store,
            at: Shared {
                groups: scope.key_groups.clone(),
                operator: scope.operator.clone(),
                epoch: 0,
                tracking: false,
            },
            since_full: 0,
            first_base: None,
            prefetch_on: false,
            prefetch_recheck: 0,
        }
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
        let group = self.at.owned(group)?;
        dispatch!(&mut self.store, s => s.scan_from(&self.at, group, from, limit, f))
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
        let group = self.at.owned(group)?;
        dispatch!(&mut self.store, s => s.update(&self.at, group, key, key_bytes, f))
    }

    /// Changes the value of `key` in `group` in place: `f` gets it (or
    /// `init()`, stored, when the key has none). What
    /// [`ValueStore::update`] does with `|slot| f(slot.get_or_insert_with(init))`,
    /// without moving the value out of its place and back: in memory,
    /// an update of a value with drop glue (a `Vec`, a `String`, a `Box`)
    /// takes its entry out of the map and puts it back, which writes the
    /// map's control bytes as well as the entry; a change in place
    /// writes the entry alone.
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    #[inline]
    pub fn modify<R>(
        &mut self,
        group: u16,
        key: K,
        key_bytes: &[u8],
        init: impl FnOnce() -> V,
        f: impl FnOnce(&mut V) -> R,
    ) -> Result<R> {
        let group = self.at.owned(group)?;
        dispatch!(&mut self.store, s => s.modify(&self.at, group, key, key_bytes, init, f))
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
        let group = self.at.owned(group)?;
        dispatch!(&mut self.store, s => s.remove_present(&self.at, group, key, key_bytes))
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
        let group = self.at.owned(group)?;
        dispatch!(&mut self.store, s => s.put_absent(&self.at, group, key, key_bytes, value))
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
            self.prefetch_on = dispatch!(&self.store, s => s.prefetch_pays());
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
    pub fn prefetch<'k>(&self, keys: impl IntoIterator<Item = (u16, &'k K)>)
    where
        K: 'k,
    {
        dispatch!(&self.store, s => s.prefetch(&self.at, keys));
    }

    /// The value of `key` in `group`, if any.
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    pub fn get(&mut self, group: u16, key: &K, key_bytes: &[u8]) -> Result<Option<V>> {
        let group = self.at.owned(group)?;
        // A read neither copies a shared map nor writes, nor counts as a change.
        dispatch!(&mut self.store, s => s.get(&self.at, group, key, key_bytes))
    }

    /// Calls `f` with the value of `key` in `group`, if any: in memory,
    /// without copying it. A read, as [`ValueStore::get`].
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    pub fn read<R>(&mut self, group: u16, key: &K, key_bytes: &[u8], f: impl FnOnce(Option<&V>) -> R) -> Result<R> {
        let group = self.at.owned(group)?;
        dispatch!(&mut self.store, s => s.read(&self.at, group, key, key_bytes, f))
    }

    /// Calls `f` with every key and value of `group` (for byte backends, in
    /// key-byte order).
    ///
    /// # Errors
    /// As [`ValueStore::update`], and [`Error::Internal`] when a stored key
    /// does not decode.
    pub fn for_each_in_group(&mut self, group: u16, f: impl FnMut(&K, &V)) -> Result<()> {
        let group = self.at.owned(group)?;
        dispatch!(&mut self.store, s => s.for_each_in_group(&self.at, group, f))
    }

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
        let group = self.at.owned(group)?;
        dispatch!(&mut self.store, s => s.put_carried(&self.at, group, key, key_bytes, value))
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

    /// The snapshot at barrier `at` (`None`: a plain one, which leaves the
    /// logs alone): the store seals its logs at the barrier, and changes
    /// from then on belong to the next checkpoint.
    pub(super) fn snapshot_at(&mut self, at: Option<Barrier>) -> Result<Snapshot> {
        let since = delta_since(at, self.first_base, self.since_full);
        let seal = Seal { barrier: at, since, ending: self.at.epoch, tracking: self.at.tracking };
        if let Some(at) = at {
            self.first_base.get_or_insert(at.checkpoint);
            self.since_full = if since.is_some() { self.since_full + 1 } else { 1 };
            self.at.epoch = at.next_epoch();
            self.at.tracking = true;
        }
        dispatch!(&mut self.store, s => s.snapshot(&self.at, seal))
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
        for (group, key) in removed {
            self.at.owned(*group)?;
            crate::codec::key::decode::<K>(key).map_err(|e| key_error(&self.at.operator, e))?;
        }
        dispatch!(&mut self.store, s => s.import_part(&self.at, entries, removed))
    }

    /// How many changes the logs for deltas hold.
    #[cfg(test)]
    pub(super) fn logged(&self) -> usize {
        dispatch!(&self.store, s => s.logged())
    }
}

impl<K: Key, V: Data> super::KeyedState for ValueStore<K, V> {
    fn snapshot_at(&mut self, _operator: &str, at: Option<Barrier>) -> Result<Snapshot> {
        ValueStore::snapshot_at(self, at)
    }

    fn import_part(&mut self, _operator: &str, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        ValueStore::import_part(self, entries, removed)
    }

    fn stats(&self) -> StateStats {
        dispatch!(&self.store, s => s.stats())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::{PREFETCH_MIN_BYTES, PREFETCH_RECHECK, ValueStore};
    use crate::state::{MemoryBackend, StateScope};

    /// A small state in memory is not prefetched; once its maps outgrow
    /// `PREFETCH_MIN_BYTES` it is, from the next decision on (every
    /// `PREFETCH_RECHECK` batches).
    #[test]
    fn prefetching_starts_once_the_state_outgrows_the_caches() {
        let scope = StateScope::new("j", "op", "s", 0..4, 4);
        let mut s = ValueStore::<u64, u64>::open(&MemoryBackend, &scope).unwrap();
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
}
