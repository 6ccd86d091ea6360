//! Keyed state, namespaced by (operator, key group).
//!
//! A [`StateBackend`] opens one [`StateTable`] per stateful operator instance
//! and state name; a table stores bytes per (key group, key), so every key
//! group is a separate namespace and a job can be rescaled by reassigning
//! key groups to workers. Operators use typed handles ([`ValueState`]) over
//! a table.
//!
//! [`MemoryBackend`] keeps live objects instead of bytes (like Flink's
//! hash-map backend): nothing is encoded on the hot path, values are encoded
//! only when a checkpoint copies them out. Backends that store bytes go
//! through the codec on every access, unless they ask for a cache of live
//! values in front of their tables ([`StateBackend::object_cache`], as the
//! fjall backend does): then only misses and write-backs do.

mod cache;
#[cfg(feature = "fjall")]
mod fjall;
mod spares;
mod timers;
pub use self::cache::ObjectCache;
#[cfg(feature = "fjall")]
pub use self::fjall::{FjallBackend, FjallOptions};

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use hashbrown::hash_map::Entry;
use rustc_hash::FxBuildHasher;

/// The in-memory store's map: hashbrown for `replace_entry_with`, which
/// lets a value be moved out and back without storing `Option<V>`.
type ObjectMap<K, V> = hashbrown::HashMap<K, V, FxBuildHasher>;

use crate::codec::Data;
use crate::error::{Error, Result};
use crate::codec::key::Key;
use crate::record::Timestamp;

/// Which state a table holds.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateScope {
    /// The job's name.
    pub job: String,
    /// The operator's name (unique in the job).
    pub operator: String,
    /// The state's name within the operator.
    pub state: String,
    /// The key groups this instance owns.
    pub key_groups: Range<u16>,
    /// The job's number of key groups.
    pub max_key_groups: u16,
}

/// Where keyed state lives. Shared by every operator instance of a job.
pub trait StateBackend: Send + Sync + fmt::Debug + 'static {
    /// A short name for logs and the plan (`memory`, `fjall`).
    fn name(&self) -> &'static str;

    /// Whether typed handles should keep live objects (no codec on access)
    /// instead of going through [`StateBackend::open_table`].
    fn keeps_objects(&self) -> bool {
        false
    }

    /// The budget of the write-back cache of live values that value and
    /// window state keep in front of this backend's tables, if it wants
    /// one (see [`ObjectCache`]); without one every access reads and
    /// writes the table.
    fn object_cache(&self) -> Option<Arc<ObjectCache>> {
        None
    }

    /// Whether event-time timers live in this backend's tables (ordered by
    /// time, with only each key group's earliest time in memory) rather
    /// than in memory. Only for backends that do not keep objects.
    fn timers_in_table(&self) -> bool {
        false
    }

    /// Called once when job `job` starts, before any table is opened:
    /// a backend that keeps data between runs drops the job's old state
    /// here, since a job starts from a checkpoint or from nothing, never
    /// from what a previous run left behind.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn prepare(&self, job: &str) -> Result<()> {
        let _ = job;
        Ok(())
    }

    /// Opens the byte table of one operator instance's state.
    ///
    /// # Errors
    /// [`Error::State`] when the storage cannot be opened.
    fn open_table(&self, scope: &StateScope) -> Result<Box<dyn StateTable>>;
}

/// Byte-level keyed state of one operator instance: values by (key group,
/// encoded key).
pub trait StateTable: Send {
    /// The value of `key` in `group`.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn get(&mut self, group: u16, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// Sets the value of `key` in `group`.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn put(&mut self, group: u16, key: &[u8], value: &[u8]) -> Result<()>;

    /// Removes `key` from `group`.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn delete(&mut self, group: u16, key: &[u8]) -> Result<()>;

    /// Writes and removes many entries at once (a cache's write-back):
    /// (key group, key, value or `None` to remove). The default applies
    /// them one by one; backends with write batches use them.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn apply(&mut self, writes: Writes) -> Result<()> {
        for (group, key, value) in writes {
            match value {
                Some(value) => self.put(group, &key, &value)?,
                None => self.delete(group, &key)?,
            }
        }
        Ok(())
    }

    /// Sets many values at once (a restore): (key group, key, value).
    /// The default puts them one by one; backends with write batches use
    /// them.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn put_all(&mut self, entries: &[(u16, Vec<u8>, Vec<u8>)]) -> Result<()> {
        for (group, key, value) in entries {
            self.put(*group, key, value)?;
        }
        Ok(())
    }

    /// Calls `f` with every (key, value) of `group`, in key order.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn scan_group(&mut self, group: u16, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<()>;

    /// Calls `f` with the (key, value) entries of `group` from key `from`
    /// on, in key order, until `f` returns `false`. The default filters
    /// [`StateTable::scan_group`]; ordered backends seek.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn scan_from(&mut self, group: u16, from: &[u8], f: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        let mut more = true;
        self.scan_group(group, &mut |k, v| {
            if more && k >= from {
                more = f(k, v);
            }
        })
    }

    /// The entries of key groups `groups` as of now, to read later (on
    /// another thread), for a checkpoint. The default reads them now;
    /// backends with snapshots take one and read it later.
    ///
    /// The export must pass each key group's entries in one or more parts
    /// holding that key group only, key groups in order (a cache laid over
    /// the table relies on it). The default passes one part per key group
    /// that has entries; the fjall backend splits a key group into parts of
    /// at most [`EXPORT_PART`] entries or about [`EXPORT_PART_BYTES`] bytes.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn export_deferred(&mut self, groups: Range<u16>) -> Result<Export> {
        let mut parts = Vec::new();
        for group in groups {
            let mut out = Exported::new(true);
            let mut failure = None;
            self.scan_group(group, &mut |k, v| {
                if let Err(e) = out.part.push(group, k, v) {
                    failure.get_or_insert(e);
                }
            })?;
            if let Some(e) = failure {
                return Err(e);
            }
            if !out.part.is_empty() {
                parts.push(out);
            }
        }
        Ok(Box::new(move |sink| {
            for part in &parts {
                sink(part)?;
            }
            Ok(true)
        }))
    }
}

/// State in memory: the fastest backend, bounded by RAM.
///
/// ```
/// use weibo::{Job, state::MemoryBackend};
/// let job = Job::new("counts").with_state_backend(MemoryBackend);
/// # drop(job);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryBackend;

impl StateBackend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn keeps_objects(&self) -> bool {
        true
    }

    fn open_table(&self, scope: &StateScope) -> Result<Box<dyn StateTable>> {
        Ok(Box::new(MemoryTable { groups: BTreeMap::new(), operator: scope.operator.clone() }))
    }
}

/// A byte table in memory, ordered by (group, key).
#[derive(Debug)]
struct MemoryTable {
    groups: BTreeMap<u16, BTreeMap<Vec<u8>, Vec<u8>>>,
    #[allow(dead_code)]
    operator: String,
}

impl StateTable for MemoryTable {
    fn get(&mut self, group: u16, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.groups.get(&group).and_then(|g| g.get(key)).cloned())
    }

    fn put(&mut self, group: u16, key: &[u8], value: &[u8]) -> Result<()> {
        self.groups.entry(group).or_default().insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn delete(&mut self, group: u16, key: &[u8]) -> Result<()> {
        if let Some(g) = self.groups.get_mut(&group) {
            g.remove(key);
        }
        Ok(())
    }

    fn scan_group(&mut self, group: u16, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<()> {
        if let Some(g) = self.groups.get(&group) {
            for (k, v) in g {
                f(k, v);
            }
        }
        Ok(())
    }

    fn scan_from(&mut self, group: u16, from: &[u8], f: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        if let Some(g) = self.groups.get(&group) {
            for (k, v) in g.range::<[u8], _>((std::ops::Bound::Included(from), std::ops::Bound::Unbounded)) {
                if !f(k, v) {
                    break;
                }
            }
        }
        Ok(())
    }
}

/// A key group's values, each with the epoch it last changed in.
type StampedMap<K, V> = ObjectMap<K, (V, u32)>;

enum Store<K, V> {
    /// One map per owned key group, by typed key.
    /// Each map is shared with the checkpoint being written, if any; the
    /// worker writes beside it meanwhile (see [`Overlay`]).
    /// Each value is stamped with the export epoch in which it last
    /// changed, so an incremental checkpoint finds what changed.
    Objects(Vec<Arc<StampedMap<K, V>>>),
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
/// objects) and encoded (for backends that store bytes); the operator has
/// both at hand.
pub struct ValueState<K, V> {
    store: Store<K, V>,
    groups: Range<u16>,
    operator: String,
    /// The checkpoint being built (one after the last barrier): values
    /// changed now are stamped with it.
    epoch: u32,
    /// Exports since the last full one.
    since_full: u32,
    /// The checkpoint of this run's first export (a base): a delta needs
    /// a complete checkpoint at or after it to build on, since changes
    /// before it were neither stamped nor logged.
    first_base: Option<u64>,
    /// Whether changes are tracked for incremental checkpoints: from the
    /// first checkpoint on (that one is a base, which holds everything
    /// before it), so a job without checkpoints keeps no change log.
    tracking: bool,
    /// In-memory store: per owned key group, keys removed, with the epoch
    /// of their removal.
    removed: Vec<Vec<(K, u32)>>,
    /// Byte store: per owned key group, keys written or removed (without a
    /// cache: every change; with one: every write-back), with the epoch of
    /// their last change and the encoded value written (`None`: removed),
    /// so a delta needs no reads from the table. Shared with the
    /// checkpoint being taken and copied on the next write, like the
    /// in-memory maps, so the barrier does not copy keys.
    changed: Vec<Arc<ChangedKeys>>,
    /// In-memory store: maps exports are done with, to copy into.
    spares: spares::Spares<StampedMap<K, V>>,
    /// In-memory store, per owned key group: writes made while an export
    /// still shares the group's map (it copies each map first thing, then
    /// lets go of it), applied to the map in place once it has; a value,
    /// or `None` for a removal, with its stamp. See [`Overlay`].
    overlays: Vec<Overlay<K, V>>,
    /// In-memory store, per owned key group: whether the worker has written
    /// beside the map since the last barrier, telling the export to copy
    /// the map and let go of it now rather than when it has encoded it.
    wanted: spares::Wanted,
}

/// Writes to a key group's map while an export still shares it.
///
/// The worker writes a key group whose map an export still shares into
/// this overlay, and flags the key group (`wanted`); the export, on its
/// own thread, copies a flagged map and lets go of it as soon as it sees
/// the flag (before each key group and every 4,096 entries), and encodes
/// the others where they are. So the worker does not copy the map itself (which, with every key group written right
/// after each barrier, meant copying the whole state on the worker at
/// every checkpoint); the next write after the export let go applies the
/// overlay to the map in place. An overlay that outgrows
/// [`OVERLAY_MIN`] plus an eighth of its map (an export slow to start)
/// gives up: the worker copies the map and applies it.
type Overlay<K, V> = ObjectMap<K, (Option<V>, u32)>;

/// See [`Overlay`].
const OVERLAY_MIN: usize = 4_096;

/// Updates `key` in `overlay`, beside `map`, which an export still
/// shares: as [`ValueState::update`] does in the map (logging a removal in
/// `removed`, if changes are tracked).
#[cold]
#[inline(never)]
fn overlaid_update<K: Key, V: Data, R>(
    map: &StampedMap<K, V>,
    overlay: &mut Overlay<K, V>,
    removed: Option<&mut Vec<(K, u32)>>,
    key: K,
    epoch: u32,
    f: impl FnOnce(&mut Option<V>) -> R,
) -> R {
    match overlay.entry(key) {
        Entry::Occupied(mut e) => {
            let (slot, stamp) = e.get_mut();
            let existed = slot.is_some();
            let r = f(slot);
            *stamp = epoch;
            if existed
                && slot.is_none()
                && let Some(removed) = removed
            {
                removed.push((e.key().clone(), epoch));
            }
            r
        }
        Entry::Vacant(e) => {
            let mut slot = map.get(e.key()).map(|(v, _)| v.clone());
            let existed = slot.is_some();
            let r = f(&mut slot);
            if existed
                && slot.is_none()
                && let Some(removed) = removed
            {
                removed.push((e.key().clone(), epoch));
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
fn apply_overlay<K: Key, V>(map: &mut StampedMap<K, V>, overlay: &mut Overlay<K, V>) {
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
type ChangedKeys = hashbrown::HashMap<Box<[u8]>, (u32, Option<Box<[u8]>>), FxBuildHasher>;

/// Writes to a table: (key group, encoded key, encoded value or `None` to remove).
pub type Writes = Vec<(u16, Vec<u8>, Option<Vec<u8>>)>;

/// Every how many checkpoints a value state writes all its entries instead
/// of what changed (bounding the chain a restore replays).
pub const FULL_CHECKPOINT_EVERY: u32 = 10;

impl<K, V> fmt::Debug for ValueState<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValueState")
            .field("operator", &self.operator)
            .field("groups", &self.groups)
            .finish_non_exhaustive()
    }
}

impl<K: Key, V: Data> ValueState<K, V> {
    /// Opens the state `scope` names on `backend`.
    ///
    /// # Errors
    /// [`Error::State`] when the backend cannot open it.
    pub fn open(backend: &dyn StateBackend, scope: &StateScope) -> Result<Self> {
        let store = if backend.keeps_objects() {
            Store::Objects(scope.key_groups.clone().map(|_| Arc::new(ObjectMap::default())).collect())
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

    /// Opens the state `scope` names on `backend`'s byte table, without a
    /// cache (timers, which scan it in order).
    fn open_bytes(backend: &dyn StateBackend, scope: &StateScope) -> Result<Self> {
        Ok(Self::with_store(Store::Bytes { table: backend.open_table(scope)?, buf: Vec::new() }, scope))
    }

    fn with_store(store: Store<K, V>, scope: &StateScope) -> Self {
        Self {
            store,
            groups: scope.key_groups.clone(),
            operator: scope.operator.clone(),
            epoch: 0,
            since_full: 0,
            first_base: None,
            tracking: false,
            removed: scope.key_groups.clone().map(|_| Vec::new()).collect(),
            changed: scope.key_groups.clone().map(|_| Arc::default()).collect(),
            spares: spares::Spares::new(scope.key_groups.len()),
            overlays: scope.key_groups.clone().map(|_| Overlay::default()).collect(),
            wanted: spares::Wanted::new(scope.key_groups.len()),
        }
    }

    fn group_error(&self, group: u16) -> Error {
        Error::Internal(format!("operator `{}` got key group {group}, but owns {:?}", self.operator, self.groups))
    }

    /// Reads, and possibly changes, the value of `key` (encoded: `key_bytes`)
    /// in `group`: `f` gets the current value (`None` if absent); whatever
    /// it leaves is stored (`None` removes the key).
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
                    return Err(Error::Internal(format!(
                        "operator `{}` has no map for key group {group}",
                        self.operator
                    )));
                };
                let epoch = self.epoch;
                if let Some(overlay) = self.overlays.get_mut(index) {
                    // (A plain load, not `Arc::get_mut`'s read-modify-write:
                    // one of those per update, in `make_mut`, is enough.)
                    if Arc::strong_count(map) > 1 && overlay.len() < OVERLAY_MIN + map.len() / 8 {
                        // An export still shares the map: write beside it.
                        let removed = self.removed.get_mut(index).filter(|_| self.tracking);
                        self.wanted.set(index);
                        return Ok(overlaid_update(map, overlay, removed, key, epoch, f));
                    }
                    if !overlay.is_empty() {
                        apply_overlay(self.spares.make_mut(map), overlay);
                    }
                }
                Ok(match self.spares.make_mut(map).entry(key) {
                    Entry::Occupied(e) => {
                        let mut result = None;
                        let mut gone = None;
                        let _ = e.replace_entry_with(|k, (value, _)| {
                            let mut slot = Some(value);
                            result = Some(f(&mut slot));
                            if slot.is_none() {
                                gone = Some(k.clone());
                            }
                            slot.map(|v| (v, epoch))
                        });
                        if let (Some(k), Some(removed), true) = (gone, self.removed.get_mut(index), self.tracking) {
                            removed.push((k, epoch));
                        }
                        result.ok_or_else(|| Error::Internal("state update closure was not called".into()))?
                    }
                    Entry::Vacant(e) => {
                        let mut slot = None;
                        let r = f(&mut slot);
                        if let Some(value) = slot {
                            e.insert((value, epoch));
                        }
                        r
                    }
                })
            }
            Store::Cached(store) => {
                let tracking = cache::Tracking { on: self.tracking, changed: &mut self.changed };
                store.update(index, group, key, key_bytes, self.epoch, tracking, f)
            }
            Store::Bytes { table, buf } => {
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
                if self.tracking
                    && let Some(changed) = self.changed.get_mut(index)
                {
                    let change = (self.epoch, written.map(Box::from));
                    let changed = Arc::make_mut(changed);
                    match changed.get_mut(key_bytes) {
                        Some(last) => *last = change,
                        None => {
                            changed.insert(key_bytes.into(), change);
                        }
                    }
                }
                Ok(r)
            }
        }
    }

    /// Looks `keys` up without changing anything, so that the cache lines
    /// they live on are loaded when [`ValueState::update`] needs them.
    ///
    /// The lookups are independent of each other, so the processor overlaps
    /// their cache misses; done one by one inside `update` (between user
    /// code and output), each miss would be paid in full. Only the
    /// in-memory store and the cache of live values do anything.
    pub fn prefetch<'k>(&self, keys: impl IntoIterator<Item = (u16, &'k K)>) {
        let mut found = 0usize;
        match &self.store {
            Store::Objects(maps) => {
                for (group, key) in keys {
                    let index = usize::from(group.wrapping_sub(self.groups.start));
                    if let Some(map) = maps.get(index) {
                        found += usize::from(map.contains_key(key));
                    }
                }
            }
            Store::Cached(store) => {
                for (group, key) in keys {
                    found += usize::from(store.contains(usize::from(group.wrapping_sub(self.groups.start)), key));
                }
            }
            Store::Bytes { .. } => {}
        }
        std::hint::black_box(found);
    }

    /// The value of `key` in `group`, if any.
    ///
    /// # Errors
    /// As [`ValueState::update`].
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
            Store::Cached(store) => store.get(index, group, key, key_bytes),
            Store::Bytes { table, .. } => match table.get(group, key_bytes)? {
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
    /// As [`ValueState::update`], and [`Error::Internal`] when a stored key
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
                (Err(e), _) => failure = Some(Error::Internal(format!("operator `{operator}`: stored {e}"))),
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

/// State exported for a checkpoint, or imported from one: (key group,
/// encoded key, encoded value).
pub type Entries = Vec<(u16, Vec<u8>, Vec<u8>)>;

/// Keys removed, by key group: (key group, encoded key).
pub type RemovedKeys = Vec<(u16, Vec<u8>)>;

/// A part of the state exported for a checkpoint: entries (and, in a
/// delta, removed keys), their bytes concatenated.
#[derive(Debug, Default, Clone)]
pub struct Exported {
    /// Whether the export is all the state (a base) or what changed since
    /// the last complete checkpoint (a delta, applied on top of the chain
    /// before it).
    pub base: bool,
    /// Entries (all of them, or the changed ones) and, in a delta, keys
    /// removed since the last complete checkpoint.
    pub part: crate::checkpoint::StatePart,
}

impl Exported {
    /// An empty part of a base (`base`) or a delta.
    pub fn new(base: bool) -> Self {
        Self { base, part: crate::checkpoint::StatePart::default() }
    }

    /// Whether it has reached the size at which it is passed on: [`EXPORT_PART`]
    /// entries or [`EXPORT_PART_BYTES`] bytes.
    fn is_full(&self) -> bool {
        self.part.len() >= EXPORT_PART || self.part.bytes() >= EXPORT_PART_BYTES
    }

    /// Adds `key` → `value` of key group `group`, encoded in place.
    ///
    /// # Errors
    /// [`Error::Codec`] (naming `operator`) when the value does not encode.
    fn put<K: Key, V: Data>(&mut self, group: u16, key: &K, value: &V, operator: &str) -> Result<()> {
        let key_start = self.part.keys.len();
        key.encode_key(&mut self.part.keys);
        if let Err(e) = value.encode(&mut self.part.values) {
            self.part.keys.truncate(key_start);
            return Err(codec_error(operator, e));
        }
        self.part.end_entry(group)
    }

    /// Adds the removal of `key`, of key group `group`.
    fn remove<K: Key>(&mut self, group: u16, key: &K) -> Result<()> {
        key.encode_key(&mut self.part.removed);
        self.part.end_removed(group)
    }
}

/// What an export at `at` (checkpoint, last complete one) builds on: the
/// last complete checkpoint for a delta, `None` for a base. A delta needs
/// a complete checkpoint of this run (at or after its first export,
/// `first_base`), and every [`FULL_CHECKPOINT_EVERY`]th export is a base
/// (`since_full`: exports since the last base).
fn delta_since(at: Option<(u64, u64)>, first_base: Option<u64>, since_full: u32) -> Option<u32> {
    match at {
        Some((_, since))
            if first_base.is_some_and(|first| since >= first) && !since_full.is_multiple_of(FULL_CHECKPOINT_EVERY) =>
        {
            Some(since as u32)
        }
        _ => None,
    }
}

/// Receives an export's parts one at a time (a part's buffers are reused
/// for the next once the sink returns).
pub type ExportSink<'a> = dyn FnMut(&Exported) -> Result<()> + 'a;

/// State taken at a barrier, encoded when called (off the operator's
/// task): it passes the entries to the sink a part at a time, so that they
/// are never all in memory at once (for value state, a part holds one key
/// group, or some of one, in key-group order), and returns whether they are
/// a base. Parts apply in order, each part's removals before its entries;
/// a key removed and then set again has its removal in an earlier part
/// than its entry, or in the same one.
pub type Export = Box<dyn FnOnce(&mut ExportSink<'_>) -> Result<bool> + Send>;

/// The most entries an export passes in one part.
pub const EXPORT_PART: usize = 65_536;

/// The bytes at which an export passes a part on, whatever its entries.
pub const EXPORT_PART_BYTES: usize = 16 << 20;

/// An export gathered whole (see [`collect`]).
#[derive(Debug, Default)]
pub struct Collected {
    /// Whether it is a base.
    pub base: bool,
    /// Its entries, in order.
    pub entries: Entries,
    /// Its removed keys, in order.
    pub removed: RemovedKeys,
}

/// Runs an export and gathers its parts into one.
///
/// # Errors
/// The export's.
pub fn collect(export: Export) -> Result<Collected> {
    let mut all = Collected::default();
    all.base = export(&mut |part: &Exported| {
        all.entries.extend(part.part.entries().map(|(g, k, v)| (g, k.to_vec(), v.to_vec())));
        all.removed.extend(part.part.removed_keys().map(|(g, k)| (g, k.to_vec())));
        Ok(())
    })?;
    Ok(all)
}

/// Passes `part` on, and empties it, if it is full.
pub(crate) fn pass_if_full(part: &mut Exported, sink: &mut ExportSink<'_>) -> Result<()> {
    if part.is_full() { flush_part(part, sink) } else { Ok(()) }
}

/// Passes `part` on, and empties it, unless it is empty.
pub(crate) fn flush_part(part: &mut Exported, sink: &mut ExportSink<'_>) -> Result<()> {
    if !part.part.is_empty() {
        sink(part)?;
        part.part.clear();
    }
    Ok(())
}

fn codec_error(operator: &str, source: crate::codec::CodecError) -> Error {
    Error::Codec { operator: operator.to_string(), source }
}

fn key_error(operator: &str, e: crate::codec::key::KeyDecodeError) -> Error {
    Error::State { operator: operator.to_string(), message: format!("a checkpointed key does not decode: {e}") }
}

impl<K: Key, V: Data> ValueState<K, V> {
    /// Every entry, encoded (a full export).
    ///
    /// # Errors
    /// As [`ValueState::update`].
    pub fn export(&mut self) -> Result<Entries> {
        Ok(collect(self.export_deferred()?)?.entries)
    }

    /// All entries as of now, to encode later (see
    /// [`ValueState::export_changes`]).
    ///
    /// # Errors
    /// As [`ValueState::update`].
    pub fn export_deferred(&mut self) -> Result<Export> {
        self.export_at(None)
    }

    /// The state at barrier `checkpoint`, to encode later (on another
    /// thread): every [`FULL_CHECKPOINT_EVERY`] exports (and the first)
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
    /// until one completes (after a start or a restore), every export is a
    /// base.
    ///
    /// # Errors
    /// As [`ValueState::update`].
    pub fn export_changes(&mut self, checkpoint: u64, since: u64) -> Result<Export> {
        self.export_at(Some((checkpoint, since)))
    }

    fn export_at(&mut self, at: Option<(u64, u64)>) -> Result<Export> {
        let since = delta_since(at, self.first_base, self.since_full);
        if let Some((n, _)) = at {
            self.first_base.get_or_insert(n);
            self.since_full = if since.is_some() { self.since_full + 1 } else { 1 };
            // Changes from now on belong to the next checkpoint.
            self.epoch = (n + 1) as u32;
            self.tracking = true;
        }
        let base = since.is_none();
        // Removals a complete checkpoint holds are not needed again; the
        // others are kept even when this export is a base, since a base
        // whose checkpoint fails leaves the next delta building on an older
        // complete checkpoint.
        // (A plain export, not for a checkpoint, leaves the logs alone.)
        if let Some((_, completed)) = at {
            let pending = |e: &u32| u64::from(*e) > completed;
            for r in &mut self.removed {
                r.retain(|(_, e)| pending(e));
            }
            for c in &mut self.changed {
                if !c.values().all(|(e, _)| pending(e)) {
                    Arc::make_mut(c).retain(|_, (e, _)| pending(e));
                }
            }
        }
        let removed: Vec<(u16, Vec<(K, u32)>)> =
            if base { Vec::new() } else { self.groups.clone().zip(self.removed.iter().cloned()).collect() };
        match &mut self.store {
            Store::Objects(maps) => {
                // Writes an earlier export made wait go into the maps first.
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
                    let mut part = Exported::new(base);
                    for (group, keys) in removed {
                        for (k, _) in keys.iter() {
                            part.remove(group, k)?;
                            pass_if_full(&mut part, sink)?;
                        }
                    }
                    flush_part(&mut part, sink)?;
                    for (i, group) in (0..maps.len()).zip(first..) {
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
                None => store.export_base(self.groups.clone()),
                Some(since) => Ok(store.export_delta(since, self.changed.clone())),
            },
            Store::Bytes { table, .. } => match since {
                None => table.export_deferred(self.groups.clone()),
                Some(since) => {
                    let changed: Vec<(u16, Arc<ChangedKeys>)> =
                        self.groups.clone().zip(self.changed.iter().cloned()).collect();
                    Ok(Box::new(move |sink| {
                        // A key is either written or removed: one part per key group.
                        let mut out = Exported::new(false);
                        for (group, keys) in changed {
                            for (key, (_, value)) in keys.iter().filter(|(_, (e, _))| *e > since) {
                                match value {
                                    Some(value) => out.part.push(group, key, value)?,
                                    None => out.part.push_removed(group, key)?,
                                }
                                pass_if_full(&mut out, sink)?;
                            }
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
        self.import_part(entries, Vec::new())
    }

    /// Loads a part of a checkpoint: removes `removed`, then sets `entries`
    /// (see [`Restore`](crate::checkpoint) chains: a delta's part removes
    /// and then puts).
    ///
    /// # Errors
    /// As [`ValueState::import`].
    pub fn import_part(&mut self, mut entries: Entries, removed: RemovedKeys) -> Result<()> {
        let owned = |group: &u16| {
            if self.groups.contains(group) {
                Ok(())
            } else {
                Err(Error::Internal(format!(
                    "operator `{}` got key group {group}, but owns {:?}",
                    self.operator, self.groups
                )))
            }
        };
        for (group, key) in &removed {
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
            entries.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            for (group, key, value) in &entries {
                owned(group)?;
                crate::codec::key::decode::<K>(key).map_err(|e| key_error(&self.operator, e))?;
                V::decode(value).map_err(|e| codec_error(&self.operator, e))?;
            }
            return match &mut self.store {
                Store::Cached(store) => {
                    store.import(&entries, removed, cache::Tracking { on: self.tracking, changed: &mut self.changed })
                }
                Store::Bytes { table, .. } => {
                    if !removed.is_empty() {
                        table.apply(removed.into_iter().map(|(g, k)| (g, k, None)).collect())?;
                    }
                    table.put_all(&entries)
                }
                Store::Objects(_) => Ok(()),
            };
        }
        for (group, key) in removed {
            let k = crate::codec::key::decode::<K>(&key).map_err(|e| key_error(&self.operator, e))?;
            self.update(group, k, &key, |slot| *slot = None)?;
        }
        if let Store::Objects(maps) = &mut self.store {
            // Room for the part's entries first, in maps still empty (a
            // base's first part): a restore grows them once, not by doubling
            // (5 M keys: restore 2.3 s -> 2.0 s). Not in maps that hold
            // entries: a delta's keys are mostly there already.
            let mut counts = vec![0usize; maps.len()];
            for (group, _, _) in &entries {
                if let Some(n) = group.checked_sub(self.groups.start).and_then(|i| counts.get_mut(usize::from(i))) {
                    *n += 1;
                }
            }
            for (map, n) in maps.iter_mut().zip(counts) {
                if n > 0 && map.is_empty() {
                    Arc::make_mut(map).reserve(n);
                }
            }
        }
        for (group, key, value) in entries {
            let k = crate::codec::key::decode::<K>(&key).map_err(|e| key_error(&self.operator, e))?;
            let v = V::decode(&value).map_err(|e| codec_error(&self.operator, e))?;
            self.update(group, k, &key, |slot| *slot = Some(v))?;
        }
        Ok(())
    }
}

impl<K: Key> TimerState<K> {
    /// Every timer, for a checkpoint: key = time ++ encoded key, no value.
    ///
    /// # Errors
    /// None today (keys encode infallibly); as [`TimerState::export_deferred`].
    pub fn export(&mut self) -> Result<Entries> {
        Ok(collect(self.export_deferred()?)?.entries)
    }

    /// Every timer as of now, to encode later (on another thread): the
    /// index is copied shallowly (one reference per time), and the keys of
    /// a time are copied when a timer of that time is next set or deleted
    /// while the checkpoint still holds them.
    ///
    /// # Errors
    /// [`Error::State`] when a byte backend fails.
    pub fn export_deferred(&mut self) -> Result<Export> {
        self.export_at(None)
    }

    /// The timers at barrier `checkpoint`, to encode later: all of them (a
    /// base), or those set and removed since checkpoint `since`, the last
    /// complete one (a delta), chosen as for value state (see
    /// [`ValueState::export_changes`]), except that a base is also written
    /// once the timers removed and not yet in a complete checkpoint
    /// outnumber both those set and 65,536 (the log of removals is then
    /// dropped). The barrier copies one reference per time and per
    /// checkpoint the log spans, not the timers.
    ///
    /// # Errors
    /// [`Error::State`] when a byte backend fails.
    pub fn export_changes(&mut self, checkpoint: u64, since: u64) -> Result<Export> {
        self.export_at(Some((checkpoint, since)))
    }

    fn export_at(&mut self, at: Option<(u64, u64)>) -> Result<Export> {
        if let Some(table) = &mut self.table {
            return table.export_at(at);
        }
        let log = &mut self.log;
        let since = delta_since(at, log.first_base, log.since_full);
        let mut removed = Vec::new();
        if let Some((n, completed)) = at {
            log.first_base.get_or_insert(n);
            log.since_full = if since.is_some() { log.since_full + 1 } else { 1 };
            // Removals so far belong to the checkpoint being taken.
            if !log.current.is_empty() {
                let current = Arc::new(std::mem::take(&mut log.current));
                log.removed.push((log.epoch, current));
            }
            log.epoch = (n + 1) as u32;
            // Removals a complete checkpoint holds are not needed again.
            log.removed.retain(|(e, _)| u64::from(*e) > completed);
            log.removed_len = log.removed.iter().map(|(_, r)| r.len()).sum();
            if since.is_some() {
                removed = log.removed.iter().map(|(_, r)| r.clone()).collect();
            }
        }
        let shared: Vec<(Timestamp, Arc<TimerKeys<K>>)> = self.by_time.iter().map(|(t, k)| (*t, k.clone())).collect();
        let base = since.is_none();
        Ok(Box::new(move |sink| {
            let mut part = Exported::new(base);
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
            for (time, keys) in shared {
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
            Ok(base)
        }))
    }

    /// Every timer, in no particular order.
    #[cfg(test)]
    fn contents(&mut self) -> Vec<(Timestamp, K)> {
        if let Some(table) = &mut self.table {
            return table.contents();
        }
        self.by_time.iter().flat_map(|(time, keys)| keys.keys().map(|k| (*time, k.clone()))).collect()
    }

    /// Loads timers from a checkpoint.
    ///
    /// # Errors
    /// [`Error::State`] for entries that do not decode.
    pub fn import(&mut self, entries: Entries, operator: &str) -> Result<()> {
        self.import_part(entries, Vec::new(), operator)
    }

    /// Loads a part of a checkpoint: deletes `removed`, then sets `entries`
    /// (see [`ValueState::import_part`]).
    ///
    /// # Errors
    /// As [`TimerState::import`].
    pub fn import_part(&mut self, entries: Entries, removed: RemovedKeys, operator: &str) -> Result<()> {
        if let Some(table) = &mut self.table {
            return table.import_part(entries, removed);
        }
        for (group, key) in removed {
            let (time, k) = crate::codec::key::decode::<(Timestamp, K)>(&key).map_err(|e| key_error(operator, e))?;
            self.delete(time, group, &k)?;
        }
        for (group, key, _) in entries {
            let (time, k) = crate::codec::key::decode::<(Timestamp, K)>(&key).map_err(|e| key_error(operator, e))?;
            self.register(time, group, &k)?;
        }
        Ok(())
    }
}

impl<K: Key, A: Data> WindowState<K, A> {
    /// Every accumulator, for a checkpoint: key = encoded key ++ window start.
    ///
    /// # Errors
    /// As [`ValueState::update`].
    pub fn export(&mut self, operator: &str) -> Result<Entries> {
        Ok(collect(self.export_deferred(operator)?)?.entries)
    }

    /// The state as of now, to encode later (see
    /// [`ValueState::export_deferred`]): the in-memory store shares each
    /// window's map and copies it when next written.
    ///
    /// # Errors
    /// As [`ValueState::update`].
    pub fn export_deferred(&mut self, operator: &str) -> Result<Export> {
        self.export_at(operator, None)
    }

    /// The state at barrier `checkpoint`, to encode later: all of it (a
    /// base), or what changed since checkpoint `since`, the last complete
    /// one (a delta), chosen as for value state (see
    /// [`ValueState::export_changes`]), except that in memory a base is
    /// also written once the accumulators removed and not yet in a complete
    /// checkpoint outnumber both those the windows hold and 65,536 (the log
    /// of removals is then dropped).
    ///
    /// # Errors
    /// As [`ValueState::update`].
    pub fn export_changes(&mut self, operator: &str, checkpoint: u64, since: u64) -> Result<Export> {
        self.export_at(operator, Some((checkpoint, since)))
    }

    fn export_at(&mut self, operator: &str, at: Option<(u64, u64)>) -> Result<Export> {
        let (windows, log) = match &mut self.store {
            WindowStore::Objects { windows, log, .. } => (windows, log),
            WindowStore::Bytes { values, .. } => {
                return match at {
                    Some((n, since)) => values.export_changes(n, since),
                    None => values.export_deferred(),
                };
            }
        };
        let since = delta_since(at, log.first_base, log.since_full);
        let mut purged = Vec::new();
        let mut removed = Vec::new();
        if let Some((n, completed)) = at {
            log.first_base.get_or_insert(n);
            log.since_full = if since.is_some() { log.since_full + 1 } else { 1 };
            log.epoch = (n + 1) as u32;
            // Removals a complete checkpoint holds are not needed again.
            let pending = |e: u32| u64::from(e) > completed;
            log.purged.retain(|(e, _, _)| pending(*e));
            log.removed.retain(|(e, _, _, _)| pending(*e));
            log.removed_len = log.purged.iter().map(|(_, _, m)| m.len()).sum::<usize>() + log.removed.len();
            if since.is_some() {
                purged = log.purged.iter().map(|(_, start, map)| (*start, map.clone())).collect();
                removed = log.removed.iter().map(|(_, g, start, k)| (*g, *start, k.clone())).collect();
            }
        }
        let shared: Vec<(Timestamp, Arc<WindowMap<K, A>>)> = windows.iter().map(|(s, m)| (*s, m.clone())).collect();
        let operator = operator.to_string();
        let base = since.is_none();
        let key_of = |k: &K, start: Timestamp, out: &mut Vec<u8>| {
            k.encode_key(out);
            start.encode_key(out);
        };
        Ok(Box::new(move |sink| {
            // A delta's removals first: a window purged and opened again
            // (late records) has its new accumulators among the entries.
            let mut part = Exported::new(base);
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
        self.import_part(entries, Vec::new(), operator)
    }

    /// Loads a part of a checkpoint: removes `removed`, then sets `entries`
    /// (see [`ValueState::import_part`]).
    ///
    /// # Errors
    /// As [`WindowState::import`].
    pub fn import_part(&mut self, entries: Entries, removed: RemovedKeys, operator: &str) -> Result<()> {
        for (group, key) in removed {
            let (k, start) = crate::codec::key::decode::<(K, Timestamp)>(&key).map_err(|e| key_error(operator, e))?;
            let key_len = key.len().saturating_sub(8);
            self.update(start, group, k, key.get(..key_len).unwrap_or_default(), |slot| *slot = None)?;
        }
        for (group, key, value) in entries {
            let (k, start) = crate::codec::key::decode::<(K, Timestamp)>(&key).map_err(|e| key_error(operator, e))?;
            let acc = A::decode(&value).map_err(|e| codec_error(operator, e))?;
            let key_len = key.len().saturating_sub(8);
            self.update(start, group, k, key.get(..key_len).unwrap_or_default(), |slot| *slot = Some(acc))?;
        }
        Ok(())
    }
}

/// Timers taken because they are due: their time, and each key with its key group.
pub type DueTimers<K> = (Timestamp, Vec<(K, u16)>);

/// Keys due at one time, with their key groups.
type DueKeys<K> = hashbrown::HashMap<K, u16, FxBuildHasher>;

/// The keys of one time's timers: key → (key group, epoch it was set in).
type TimerKeys<K> = hashbrown::HashMap<K, (u16, u32), FxBuildHasher>;

/// Timers removed in one epoch: (time, key, key group).
type RemovedTimers<K> = Vec<(Timestamp, K, u16)>;

/// What incremental checkpoints of timers need (as for windows): the epoch
/// timers set now are stamped with, which checkpoint a delta may build on,
/// and the timers removed (deleted or fired) that a complete checkpoint may
/// hold, per epoch.
struct TimerLog<K> {
    epoch: u32,
    since_full: u32,
    /// The first base exported since the log was last dropped (`None`: the
    /// next export is a base, and nothing needs logging until then).
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
    /// dropped and the next export is a base.
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
/// when built with `FjallOptions::timers_on_disk`),
/// in its table, ordered by time within each key group, with only each
/// key group's earliest time in memory. Both are checkpointed
/// incrementally, with the same entries (an entry's key
/// is the time, in the order-preserving key encoding, then the encoded
/// key; it has no value).
pub struct TimerState<K> {
    /// Per time, its keys; shared with the checkpoint being written, if
    /// any, and copied on the next change (copy-on-write per time).
    by_time: BTreeMap<Timestamp, Arc<TimerKeys<K>>>,
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
        Ok(Self { by_time: BTreeMap::new(), len: 0, log: TimerLog::default(), table })
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
        let keys = Arc::make_mut(self.by_time.entry(time).or_default());
        if !keys.contains_key(key) {
            keys.insert(key.clone(), (group, self.log.epoch));
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
        let Some(keys) = self.by_time.get_mut(&time) else { return Ok(()) };
        let Some(&(group, stamp)) = keys.get(key) else { return Ok(()) };
        let keys = Arc::make_mut(keys);
        keys.remove(key);
        if keys.is_empty() {
            self.by_time.remove(&time);
        }
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
        self.by_time.first_key_value().map(|(t, _)| *t)
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
        let Some(entry) = self.by_time.first_entry() else { return Ok(None) };
        if *entry.key() > watermark {
            return Ok(None);
        }
        let (time, keys) = entry.remove_entry();
        self.len -= keys.len();
        let keys = Arc::try_unwrap(keys).unwrap_or_else(|shared| (*shared).clone());
        let mut due = Vec::with_capacity(keys.len());
        for (k, (group, stamp)) in keys {
            if self.log.logs(stamp) {
                self.log.push(time, k.clone(), group, self.len);
            }
            due.push((k, group));
        }
        Ok(Some((time, due)))
    }
}

/// One window's accumulators in memory: key → (key group, accumulator,
/// epoch of its last change).
type WindowMap<K, A> = hashbrown::HashMap<K, (u16, A, u32), FxBuildHasher>;

/// A window purged: the epoch, its start, and its accumulators (whose keys
/// deltas remove).
type PurgedWindow<K, A> = (u32, Timestamp, Arc<WindowMap<K, A>>);

/// What incremental checkpoints of in-memory windows need: the epoch
/// changes are stamped with, which checkpoint a delta may build on, and
/// what was removed since the last complete checkpoint (whole windows
/// purged, single accumulators removed), each with its epoch.
struct WindowLog<K, A> {
    epoch: u32,
    since_full: u32,
    /// The first base exported since the log was last dropped: a delta
    /// needs a complete checkpoint at or after it. `None`: the next export
    /// is a base, and nothing needs logging until then.
    first_base: Option<u64>,
    purged: Vec<PurgedWindow<K, A>>,
    removed: Vec<(u32, u16, Timestamp, K)>,
    /// Accumulators in `purged` and `removed`.
    removed_len: usize,
    /// Accumulators in the open windows.
    live: usize,
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
    /// the next export is a base (windows that fire soon after they open,
    /// like short tumbling windows, are written whole).
    fn grew(&mut self, n: usize) {
        self.removed_len += n;
        if self.removed_len > self.live.max(WINDOW_LOG_MIN) {
            self.first_base = None;
            self.purged.clear();
            self.removed.clear();
            self.removed_len = 0;
        }
    }
}

/// Removals a window log holds before it may give up on deltas (few in
/// tests, so that they give up often).
#[cfg(not(test))]
const WINDOW_LOG_MIN: usize = EXPORT_PART;
#[cfg(test)]
const WINDOW_LOG_MIN: usize = 4;

enum WindowStore<K, A> {
    /// Window-major in memory: per window start, the keys' accumulators.
    /// Each window's map is shared with the checkpoint being written, if
    /// any, and copied on the first write after it.
    Objects { windows: BTreeMap<Timestamp, Arc<WindowMap<K, A>>>, pool: Vec<WindowMap<K, A>>, log: WindowLog<K, A> },
    /// Accumulators in a byte table by (key, window start), with an index of
    /// which keys each window holds.
    Bytes { values: ValueState<(K, Timestamp), A>, index: BTreeMap<Timestamp, DueKeys<K>>, buf: Vec<u8> },
}

/// Accumulators of fixed-size (tumbling, sliding) windows, per window start
/// and key. Windows of one size fire in start order, so the window index is
/// also the timer index: no timer is stored per (key, window).
pub struct WindowState<K, A> {
    store: WindowStore<K, A>,
}

impl<K, A> fmt::Debug for WindowState<K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowState").finish_non_exhaustive()
    }
}

impl<K: Key, A: Data> WindowState<K, A> {
    /// Opens the window state `scope` names on `backend`.
    ///
    /// # Errors
    /// [`Error::State`] when the backend cannot open it.
    pub fn open(backend: &dyn StateBackend, scope: &StateScope) -> Result<Self> {
        let store = if backend.keeps_objects() {
            WindowStore::Objects { windows: BTreeMap::new(), pool: Vec::new(), log: WindowLog::default() }
        } else {
            WindowStore::Bytes { values: ValueState::open(backend, scope)?, index: BTreeMap::new(), buf: Vec::new() }
        };
        Ok(Self { store })
    }

    /// Reads and changes the accumulator of `key` (encoded: `key_bytes`,
    /// of key group `group`) in the window starting at `start`; `None` left
    /// behind removes it.
    ///
    /// # Errors
    /// As [`ValueState::update`].
    #[inline]
    pub fn update<R>(
        &mut self,
        start: Timestamp,
        group: u16,
        key: K,
        key_bytes: &[u8],
        f: impl FnOnce(&mut Option<A>) -> R,
    ) -> Result<R> {
        match &mut self.store {
            WindowStore::Objects { windows, pool, log } => {
                let map = windows.entry(start).or_insert_with(|| Arc::new(pool.pop().unwrap_or_default()));
                let epoch = log.epoch;
                Ok(match Arc::make_mut(map).entry(key) {
                    Entry::Occupied(e) => {
                        let mut result = None;
                        let mut gone = None;
                        let _ = e.replace_entry_with(|k, (g, value, _)| {
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
                        result.ok_or_else(|| Error::Internal("window update closure was not called".into()))?
                    }
                    Entry::Vacant(e) => {
                        let mut slot = None;
                        let r = f(&mut slot);
                        if let Some(value) = slot {
                            e.insert((group, value, epoch));
                            log.live += 1;
                        }
                        r
                    }
                })
            }
            WindowStore::Bytes { values, index, buf } => {
                buf.clear();
                buf.extend_from_slice(key_bytes);
                start.encode_key(buf);
                let k = key.clone();
                let (r, present) = values.update(group, (key, start), buf, |slot| {
                    let r = f(slot);
                    (r, slot.is_some())
                })?;
                if present {
                    index.entry(start).or_default().insert(k, group);
                } else if let Some(keys) = index.get_mut(&start) {
                    keys.remove(&k);
                }
                Ok(r)
            }
        }
    }

    /// The start of the earliest window holding anything.
    #[inline]
    pub fn first_window(&self) -> Option<Timestamp> {
        match &self.store {
            WindowStore::Objects { windows, .. } => windows.first_key_value().map(|(s, _)| *s),
            WindowStore::Bytes { index, .. } => index.first_key_value().map(|(s, _)| *s),
        }
    }

    /// The starts of the windows holding anything, from `from` on, in order.
    pub fn windows_from(&self, from: Timestamp) -> Vec<Timestamp> {
        match &self.store {
            WindowStore::Objects { windows, .. } => windows.range(from..).map(|(s, _)| *s).collect(),
            WindowStore::Bytes { index, .. } => index.range(from..).map(|(s, _)| *s).collect(),
        }
    }

    /// Calls `f` with every key, key group and accumulator of the window
    /// starting at `start`; with `purge`, removes the window.
    ///
    /// # Errors
    /// As [`ValueState::update`].
    pub fn for_each_in_window(&mut self, start: Timestamp, purge: bool, mut f: impl FnMut(&K, u16, &A)) -> Result<()> {
        match &mut self.store {
            WindowStore::Objects { windows, pool, log } => {
                if purge {
                    if let Some(map) = windows.remove(&start) {
                        for (k, (g, a, _)) in map.iter() {
                            f(k, *g, a);
                        }
                        log.live = log.live.saturating_sub(map.len());
                        if log.logging() && !map.is_empty() {
                            // Its keys are removed in the next deltas.
                            let n = map.len();
                            log.purged.push((log.epoch, start, map));
                            log.grew(n);
                        } else if let Ok(mut map) = Arc::try_unwrap(map) {
                            // Reuse the map unless a checkpoint still reads it.
                            map.clear();
                            pool.push(map);
                        }
                    }
                } else if let Some(map) = windows.get(&start) {
                    for (k, (g, a, _)) in map.iter() {
                        f(k, *g, a);
                    }
                }
                Ok(())
            }
            WindowStore::Bytes { values, index, buf } => {
                let keys: Vec<(K, u16)> = match index.get(&start) {
                    Some(keys) => keys.iter().map(|(k, g)| (k.clone(), *g)).collect(),
                    None => return Ok(()),
                };
                for (k, g) in keys {
                    buf.clear();
                    k.encode_key(buf);
                    start.encode_key(buf);
                    // A read is not a change: it neither stamps nor caches.
                    let value = if purge {
                        values.update(g, (k.clone(), start), buf, Option::take)?
                    } else {
                        values.get(g, &(k.clone(), start), buf)?
                    };
                    if let Some(a) = value {
                        f(&k, g, &a);
                    }
                }
                if purge {
                    index.remove(&start);
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A backend that stores bytes, to run the same tests through the codec path.
    #[derive(Debug)]
    struct BytesOnly;
    impl StateBackend for BytesOnly {
        fn name(&self) -> &'static str {
            "bytes-only"
        }
        fn open_table(&self, scope: &StateScope) -> Result<Box<dyn StateTable>> {
            MemoryBackend.open_table(scope)
        }
        fn timers_in_table(&self) -> bool {
            true
        }
    }

    fn scope() -> StateScope {
        StateScope { job: "j".into(), operator: "op".into(), state: "s".into(), key_groups: 4..8, max_key_groups: 8 }
    }

    fn exercise(backend: &dyn StateBackend) {
        let a = "a".to_string();
        let ab = crate::codec::key::encode(&a);
        let long = "x".repeat(40);
        let lb = crate::codec::key::encode(&long);
        let mut s = ValueState::<String, u64>::open(backend, &scope()).unwrap();
        assert_eq!(s.get(4, &a, &ab).unwrap(), None);
        s.update(4, a.clone(), &ab, |v| *v = Some(v.unwrap_or(0) + 5)).unwrap();
        s.update(4, a.clone(), &ab, |v| *v = Some(v.unwrap_or(0) + 5)).unwrap();
        s.update(5, a.clone(), &ab, |v| *v = Some(1)).unwrap();
        s.update(7, long.clone(), &lb, |v| *v = Some(9)).unwrap();
        assert_eq!(s.get(4, &a, &ab).unwrap(), Some(10));
        assert_eq!(s.get(5, &a, &ab).unwrap(), Some(1), "key groups are separate namespaces");
        assert_eq!(s.get(7, &long, &lb).unwrap(), Some(9));
        s.update(4, a.clone(), &ab, |v| *v = None).unwrap();
        assert_eq!(s.get(4, &a, &ab).unwrap(), None);
        let mut seen = Vec::new();
        s.for_each_in_group(7, |k, v| seen.push((k.clone(), *v))).unwrap();
        assert_eq!(seen, vec![(long.clone(), 9)]);
        let mut none = Vec::new();
        s.for_each_in_group(4, |k, v| none.push((k.clone(), *v))).unwrap();
        assert!(none.is_empty(), "a removed key is gone: {none:?}");
    }

    /// Every backend the shared suite runs on, with what keeps it alive.
    fn backends() -> Vec<(Box<dyn StateBackend>, Option<tempfile::TempDir>)> {
        let mut all: Vec<(Box<dyn StateBackend>, Option<tempfile::TempDir>)> =
            vec![(Box::new(MemoryBackend), None), (Box::new(BytesOnly), None)];
        #[cfg(feature = "fjall")]
        {
            let dir = tempfile::tempdir().unwrap();
            all.push((Box::new(FjallBackend::open(dir.path()).unwrap()), Some(dir)));
            // Without a cache (every access reads and writes fjall), and
            // with room for a handful of entries (write-backs all the time);
            // both with timers in fjall.
            for bytes in [0, 200] {
                let dir = tempfile::tempdir().unwrap();
                let backend =
                    FjallBackend::builder(dir.path()).object_cache(bytes).timers_on_disk(true).open().unwrap();
                all.push((Box::new(backend), Some(dir)));
            }
        }
        all
    }

    #[test]
    fn every_backend_passes_the_value_state_suite() {
        for (backend, _dir) in backends() {
            exercise(&*backend);
        }
    }

    fn timers(backend: &dyn StateBackend) {
        let mut t = TimerState::<String>::open(backend, &scope()).unwrap();
        let (a, b) = ("a".to_string(), "b".to_string());
        t.register(20, 4, &a).unwrap();
        t.register(10, 5, &b).unwrap();
        t.register(10, 4, &a).unwrap();
        t.register(10, 4, &a).unwrap();
        assert_eq!(t.len(), 3, "the same timer twice is one");
        assert_eq!(t.next_time(), Some(10));
        assert!(t.pop_due(9).unwrap().is_none(), "nothing is due before 10");
        let (time, mut keys) = t.pop_due(15).unwrap().unwrap();
        keys.sort();
        assert_eq!((time, keys), (10, vec![(a.clone(), 4), (b.clone(), 5)]));
        t.delete(20, 4, &a).unwrap();
        t.delete(20, 5, &b).unwrap();
        assert!(t.is_empty());
        assert!(t.pop_due(i64::MAX).unwrap().is_none());
    }

    /// Timers keep the same checkpoint entries on every backend: a job
    /// moves between backends through a savepoint.
    #[test]
    fn timers_move_between_backends_through_their_entries() {
        let timers: Vec<(Timestamp, u8)> = (0u8..40).map(|k| (i64::from(k % 7) * 10 - 20, k)).collect();
        let sorted = |mut v: Vec<(Timestamp, u8)>| {
            v.sort_unstable();
            v
        };
        for (from, _a) in backends() {
            let mut t = TimerState::<u8>::open(&*from, &scope()).unwrap();
            for (time, k) in &timers {
                t.register(*time, group_of(*k), k).unwrap();
            }
            let entries = t.export().unwrap();
            for (to, _b) in backends() {
                let mut u = TimerState::<u8>::open(&*to, &StateScope { state: "moved".into(), ..scope() }).unwrap();
                u.import(entries.clone(), "op").unwrap();
                let what = format!("{} -> {}", from.name(), to.name());
                assert_eq!(sorted(u.contents()), sorted(timers.clone()), "{what}");
                assert_eq!((u.len(), u.next_time()), (timers.len(), Some(-20)), "{what}");
                let (time, due) = u.pop_due(-20).unwrap().unwrap();
                assert_eq!((time, due.len()), (-20, 6), "{what}: keys 0, 7, .. 35 at -20");
                assert_eq!(u.next_time(), Some(-10), "{what}");
            }
        }
    }

    #[test]
    fn a_timer_export_holds_the_timers_as_of_the_barrier() {
        let mut t = TimerState::<String>::open(&MemoryBackend, &scope()).unwrap();
        let (a, b, c) = ("a".to_string(), "b".to_string(), "c".to_string());
        t.register(10, 4, &a).unwrap();
        t.register(10, 5, &b).unwrap();
        t.register(20, 4, &a).unwrap();
        let at_barrier = t.export_deferred().unwrap();
        // After the barrier: one timer set at a shared time, one deleted, one due.
        t.register(10, 6, &c).unwrap();
        t.delete(20, 4, &a).unwrap();
        let (time, due) = t.pop_due(15).unwrap().unwrap();
        assert_eq!((time, due.len()), (10, 3), "the live timers changed");
        let mut got: Vec<(Timestamp, String)> = collect(at_barrier)
            .unwrap()
            .entries
            .iter()
            .map(|(_, k, _)| crate::codec::key::decode::<(Timestamp, String)>(k).unwrap())
            .collect();
        got.sort();
        assert_eq!(got, vec![(10, a.clone()), (10, b), (20, a)], "the export did not");
    }

    #[test]
    fn every_backend_passes_the_timer_suite() {
        for (backend, _dir) in backends() {
            timers(&*backend);
        }
    }

    fn windows(backend: &dyn StateBackend) {
        let mut w = WindowState::<String, u64>::open(backend, &scope()).unwrap();
        let (a, b) = ("a".to_string(), "b".to_string());
        let (ab, bb) = (crate::codec::key::encode(&a), crate::codec::key::encode(&b));
        for (start, key, bytes, group) in [(10, &a, &ab, 4), (0, &b, &bb, 5), (10, &a, &ab, 4), (10, &b, &bb, 5)] {
            w.update(start, group, key.clone(), bytes, |acc| *acc = Some(acc.unwrap_or(0) + 1)).unwrap();
        }
        assert_eq!(w.first_window(), Some(0));
        assert_eq!(w.windows_from(1), vec![10]);
        let mut seen = Vec::new();
        w.for_each_in_window(10, false, |k, g, n| seen.push((k.clone(), g, *n))).unwrap();
        seen.sort();
        assert_eq!(seen, vec![(a.clone(), 4, 2), (b.clone(), 5, 1)]);
        w.update(10, 5, b.clone(), &bb, |acc| *acc = None).unwrap();
        let mut seen = Vec::new();
        w.for_each_in_window(10, true, |k, _, n| seen.push((k.clone(), *n))).unwrap();
        assert_eq!(seen, vec![(a.clone(), 2)], "b was removed; purging takes the rest");
        assert_eq!(w.windows_from(i64::MIN), vec![0]);
        w.for_each_in_window(0, true, |_, _, _| {}).unwrap();
        assert_eq!(w.first_window(), None);
    }

    #[test]
    fn every_backend_passes_the_window_state_suite() {
        for (backend, _dir) in backends() {
            windows(&*backend);
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Put(u16, Vec<u8>, Vec<u8>),
        Delete(u16, Vec<u8>),
        Get(u16, Vec<u8>),
        Scan(u16),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let key = proptest::collection::vec(0u8..4, 0..4);
        prop_oneof![
            (0u16..3, key.clone(), proptest::collection::vec(any::<u8>(), 0..6)).prop_map(|(g, k, v)| Op::Put(g, k, v)),
            (0u16..3, key.clone()).prop_map(|(g, k)| Op::Delete(g, k)),
            (0u16..3, key).prop_map(|(g, k)| Op::Get(g, k)),
            (0u16..3).prop_map(Op::Scan),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

        /// Byte tables against a `BTreeMap` oracle: same answers, and scans
        /// in key order within one key group.
        #[test]
        fn byte_tables_agree_with_a_btreemap(ops in proptest::collection::vec(op(), 1..80)) {
            for (backend, _dir) in backends() {
                let mut table = backend.open_table(&scope()).unwrap();
                let mut oracle: BTreeMap<(u16, Vec<u8>), Vec<u8>> = BTreeMap::new();
                for op in &ops {
                    match op {
                        Op::Put(g, k, v) => {
                            table.put(*g, k, v).unwrap();
                            oracle.insert((*g, k.clone()), v.clone());
                        }
                        Op::Delete(g, k) => {
                            table.delete(*g, k).unwrap();
                            oracle.remove(&(*g, k.clone()));
                        }
                        Op::Get(g, k) => {
                            proptest::prop_assert_eq!(table.get(*g, k).unwrap(), oracle.get(&(*g, k.clone())).cloned(), "{}", backend.name());
                        }
                        Op::Scan(g) => {
                            let mut got = Vec::new();
                            table.scan_group(*g, &mut |k, v| got.push((k.to_vec(), v.to_vec()))).unwrap();
                            let want: Vec<(Vec<u8>, Vec<u8>)> =
                                oracle.range((*g, Vec::new())..(*g + 1, Vec::new())).map(|((_, k), v)| (k.clone(), v.clone())).collect();
                            proptest::prop_assert_eq!(got, want, "{}", backend.name());
                        }
                    }
                }
            }
        }
    }

    #[derive(Clone, Debug)]
    enum StateOp {
        Set(u8, u64),
        Remove(u8),
        Get(u8),
        Scan(u16),
        /// A checkpoint, which completes or not.
        Checkpoint(bool),
        /// Start over from the last complete checkpoint.
        Restore,
    }

    fn state_op() -> impl proptest::strategy::Strategy<Value = StateOp> {
        use proptest::prelude::*;
        prop_oneof![
            6 => (0u8..24, 0u64..1000).prop_map(|(k, v)| StateOp::Set(k, v)),
            2 => (0u8..24).prop_map(StateOp::Remove),
            2 => (0u8..24).prop_map(StateOp::Get),
            1 => (4u16..8).prop_map(StateOp::Scan),
            2 => proptest::bool::weighted(0.8).prop_map(StateOp::Checkpoint),
            1 => Just(StateOp::Restore),
        ]
    }

    /// The key group of a test key.
    fn group_of(key: u8) -> u16 {
        4 + u16::from(key % 4)
    }

    /// The complete checkpoints of a model test, as a restore sees them.
    struct Chain<M> {
        /// Checkpoint number → the state it restores.
        complete: BTreeMap<u64, BTreeMap<M, u64>>,
        n: u64,
        last: u64,
    }

    impl<M: Ord + Clone> Chain<M> {
        fn new() -> Self {
            Self { complete: BTreeMap::new(), n: 0, last: 0 }
        }

        /// Takes the next checkpoint with `export(n, last complete)`; if it
        /// completes, applies its parts as a restore does (part by part,
        /// removals first, on the last complete checkpoint for a delta) and
        /// returns (its number, whether a base, the state it restores).
        fn take(
            &mut self,
            export: impl FnOnce(u64, u64) -> Export,
            completes: bool,
            key: impl Fn(&[u8]) -> M,
        ) -> Option<(u64, bool, BTreeMap<M, u64>)> {
            self.n += 1;
            let mut parts = Vec::new();
            let base = export(self.n, self.last)(&mut |part| {
                parts.push(part.clone());
                Ok(())
            })
            .unwrap();
            if !completes {
                return None;
            }
            let mut restored = if base { BTreeMap::new() } else { self.restored() };
            for part in &parts {
                for (_, k) in part.part.removed_keys() {
                    restored.remove(&key(k));
                }
                for (_, k, v) in part.part.entries() {
                    restored.insert(key(k), u64::decode(v).unwrap());
                }
            }
            self.complete.insert(self.n, restored.clone());
            self.last = self.n;
            Some((self.n, base, restored))
        }

        /// The state the last complete checkpoint restores.
        fn restored(&self) -> BTreeMap<M, u64> {
            self.complete.get(&self.last).cloned().unwrap_or_default()
        }

        /// `state` as checkpoint entries, with `key` giving each key's group
        /// and encoding.
        fn entries(state: &BTreeMap<M, u64>, key: impl Fn(&M) -> (u16, Vec<u8>)) -> Entries {
            state
                .iter()
                .map(|(m, v)| {
                    let (group, k) = key(m);
                    let mut value = Vec::new();
                    v.encode(&mut value).unwrap();
                    (group, k, value)
                })
                .collect()
        }
    }

    /// Runs `ops` on value state over `backend` and on a `BTreeMap`: every
    /// read agrees, every complete checkpoint (a base, or a delta applied
    /// to the checkpoint it builds on) holds exactly the map as of its
    /// barrier, and a restore from it goes on from there.
    fn model_run(
        backend: &dyn StateBackend,
        ops: &[StateOp],
    ) -> std::result::Result<(), proptest::test_runner::TestCaseError> {
        use proptest::prop_assert_eq;
        let name = backend.name();
        let k = |key: u8| crate::codec::key::encode(&key);
        let mut run = 0;
        let open = |run: u32| {
            let scope = StateScope { state: format!("s{run}"), ..scope() };
            ValueState::<u8, u64>::open(backend, &scope).unwrap()
        };
        let mut s = open(run);
        let mut oracle: BTreeMap<u8, u64> = BTreeMap::new();
        let mut chain = Chain::new();
        for op in ops {
            match op {
                StateOp::Set(key, value) => {
                    let old = s.update(group_of(*key), *key, &k(*key), |v| v.replace(*value)).unwrap();
                    prop_assert_eq!(old, oracle.insert(*key, *value), "{}: old value of {}", name, key);
                }
                StateOp::Remove(key) => {
                    let old = s.update(group_of(*key), *key, &k(*key), Option::take).unwrap();
                    prop_assert_eq!(old, oracle.remove(key), "{}: removed value of {}", name, key);
                }
                StateOp::Get(key) => {
                    prop_assert_eq!(
                        s.get(group_of(*key), key, &k(*key)).unwrap(),
                        oracle.get(key).copied(),
                        "{}",
                        name
                    );
                }
                StateOp::Scan(group) => {
                    let mut got = Vec::new();
                    s.for_each_in_group(*group, |key, v| got.push((*key, *v))).unwrap();
                    got.sort_unstable();
                    let want: Vec<(u8, u64)> =
                        oracle.iter().filter(|(key, _)| group_of(**key) == *group).map(|(k, v)| (*k, *v)).collect();
                    prop_assert_eq!(got, want, "{}: scan of group {}", name, group);
                }
                StateOp::Checkpoint(completes) => {
                    let decode = |key: &[u8]| crate::codec::key::decode::<u8>(key).unwrap();
                    let taken = chain.take(|n, last| s.export_changes(n, last).unwrap(), *completes, decode);
                    if let Some((n, base, restored)) = taken {
                        prop_assert_eq!(&restored, &oracle, "{}: checkpoint {} (base: {})", name, n, base);
                    }
                }
                StateOp::Restore => {
                    run += 1;
                    s = open(run);
                    oracle = chain.restored();
                    s.import(Chain::entries(&oracle, |key| (group_of(*key), k(*key)))).unwrap();
                }
            }
        }
        Ok(())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]

        /// Exports taken at a barrier and run only after more writes (as a
        /// checkpoint's are, on another thread) hold the state as of the
        /// barrier, on every backend; on the in-memory one those writes go
        /// beside the maps the export shares (`Overlay`) and into them
        /// afterwards. Reads and scans agree with a `BTreeMap` throughout.
        #[test]
        fn exports_hold_the_barrier_while_writes_go_on(
            rounds in proptest::collection::vec(
                proptest::collection::vec((0u8..24, proptest::option::weighted(0.8, 0u64..1000)), 0..12),
                1..12,
            ),
        ) {
            for (backend, _dir) in backends() {
                let mut s = ValueState::<u8, u64>::open(&*backend, &scope()).unwrap();
                let mut oracle: BTreeMap<u8, u64> = BTreeMap::new();
                let mut chain = Chain::new();
                let write = |s: &mut ValueState<u8, u64>, oracle: &mut BTreeMap<u8, u64>, key: u8, value: Option<u64>| {
                    let k = crate::codec::key::encode(&key);
                    let old = s.update(group_of(key), key, &k, |v| std::mem::replace(v, value)).unwrap();
                    let want = match value {
                        Some(v) => oracle.insert(key, v),
                        None => oracle.remove(&key),
                    };
                    assert_eq!(old, want, "{}: old value of {}", backend.name(), key);
                };
                for (i, writes) in rounds.iter().enumerate() {
                    let barrier = oracle.clone();
                    let mut after = oracle.clone();
                    let decode = |key: &[u8]| crate::codec::key::decode::<u8>(key).unwrap();
                    let taken = chain.take(
                        |n, last| {
                            let export = s.export_changes(n, last).unwrap();
                            // Writes after the barrier, before the export runs.
                            for (key, value) in writes {
                                write(&mut s, &mut after, *key, *value);
                            }
                            export
                        },
                        i % 3 != 2,
                        decode,
                    );
                    oracle = after;
                    if let Some((n, base, restored)) = taken {
                        proptest::prop_assert_eq!(&restored, &barrier, "{}: checkpoint {} (base: {})", backend.name(), n, base);
                    }
                    for key in 0u8..24 {
                        let got = s.get(group_of(key), &key, &crate::codec::key::encode(&key)).unwrap();
                        proptest::prop_assert_eq!(got, oracle.get(&key).copied(), "{}: {}", backend.name(), key);
                    }
                    // Scans write the cache back, overlays included: not
                    // every round, so that some overlays meet the next barrier.
                    for group in (4u16..8).filter(|_| i % 2 == 1) {
                        let mut got = Vec::new();
                        s.for_each_in_group(group, |k, v| got.push((*k, *v))).unwrap();
                        got.sort_unstable();
                        let want: Vec<(u8, u64)> =
                            oracle.iter().filter(|(k, _)| group_of(**k) == group).map(|(k, v)| (*k, *v)).collect();
                        proptest::prop_assert_eq!(got, want, "{}: scan of group {}", backend.name(), group);
                    }
                }
            }
        }

        /// Value state on every backend against a `BTreeMap`, across
        /// checkpoints (bases and deltas, some of which do not complete)
        /// and restores.
        #[test]
        fn value_state_agrees_with_a_btreemap_across_checkpoints_and_restores(
            ops in proptest::collection::vec(state_op(), 1..160),
        ) {
            for (backend, _dir) in backends() {
                model_run(&*backend, &ops)?;
            }
        }
    }

    #[derive(Clone, Debug)]
    enum WindowOp {
        Add(i64, u8, u64),
        Remove(i64, u8),
        Purge(i64),
        Checkpoint(bool),
        Restore,
    }

    fn window_op() -> impl proptest::strategy::Strategy<Value = WindowOp> {
        use proptest::prelude::*;
        let start = prop::sample::select(vec![0i64, 10, 20, 30]);
        prop_oneof![
            8 => (start.clone(), 0u8..12, 1u64..100).prop_map(|(s, k, v)| WindowOp::Add(s, k, v)),
            1 => (start.clone(), 0u8..12).prop_map(|(s, k)| WindowOp::Remove(s, k)),
            2 => start.prop_map(WindowOp::Purge),
            2 => proptest::bool::weighted(0.8).prop_map(WindowOp::Checkpoint),
            1 => Just(WindowOp::Restore),
        ]
    }

    /// Window state against a `BTreeMap` of (window start, key) → sum,
    /// across checkpoints (bases and deltas) and restores, as
    /// [`model_run`] does for value state.
    fn window_model_run(
        backend: &dyn StateBackend,
        ops: &[WindowOp],
    ) -> std::result::Result<(), proptest::test_runner::TestCaseError> {
        use proptest::prop_assert_eq;
        let name = backend.name();
        let kb = |key: u8| crate::codec::key::encode(&key);
        let open = |run: u32| {
            let scope = StateScope { state: format!("w{run}"), ..scope() };
            WindowState::<u8, u64>::open(backend, &scope).unwrap()
        };
        let contents = |w: &mut WindowState<u8, u64>| {
            let mut all = BTreeMap::new();
            for start in w.windows_from(i64::MIN) {
                w.for_each_in_window(start, false, |k, g, v| {
                    assert_eq!(g, group_of(*k));
                    all.insert((start, *k), *v);
                })
                .unwrap();
            }
            all
        };
        let mut run = 0;
        let mut w = open(run);
        let mut oracle: BTreeMap<(i64, u8), u64> = BTreeMap::new();
        let mut chain = Chain::new();
        for op in ops {
            match op {
                WindowOp::Add(start, key, v) => {
                    w.update(*start, group_of(*key), *key, &kb(*key), |acc| *acc = Some(acc.unwrap_or(0) + v)).unwrap();
                    *oracle.entry((*start, *key)).or_insert(0) += v;
                }
                WindowOp::Remove(start, key) => {
                    w.update(*start, group_of(*key), *key, &kb(*key), |acc| *acc = None).unwrap();
                    oracle.remove(&(*start, *key));
                }
                WindowOp::Purge(start) => {
                    w.for_each_in_window(*start, true, |_, _, _| {}).unwrap();
                    oracle.retain(|(s, _), _| s != start);
                }
                WindowOp::Checkpoint(completes) => {
                    let decode = |key: &[u8]| {
                        let (k, start) = crate::codec::key::decode::<(u8, i64)>(key).unwrap();
                        (start, k)
                    };
                    let taken = chain.take(|n, last| w.export_changes("op", n, last).unwrap(), *completes, decode);
                    if let Some((n, base, restored)) = taken {
                        prop_assert_eq!(&restored, &oracle, "{}: checkpoint {} (base: {})", name, n, base);
                    }
                }
                WindowOp::Restore => {
                    run += 1;
                    w = open(run);
                    oracle = chain.restored();
                    let entries = Chain::entries(&oracle, |(start, k)| {
                        let mut key = kb(*k);
                        start.encode_key(&mut key);
                        (group_of(*k), key)
                    });
                    w.import(entries, "op").unwrap();
                }
            }
            prop_assert_eq!(contents(&mut w), oracle.clone(), "{}: after {:?}", name, op);
        }
        Ok(())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]

        /// Window state on every backend against a `BTreeMap`, across
        /// checkpoints and restores.
        #[test]
        fn window_state_agrees_with_a_btreemap_across_checkpoints_and_restores(
            ops in proptest::collection::vec(window_op(), 1..160),
        ) {
            for (backend, _dir) in backends() {
                window_model_run(&*backend, &ops)?;
            }
        }
    }

    #[derive(Debug, Clone)]
    enum TimerOp {
        Set(i64, u8),
        Delete(i64, u8),
        Fire(i64),
        Checkpoint(bool),
        Restore,
    }

    fn timer_op() -> impl proptest::strategy::Strategy<Value = TimerOp> {
        use proptest::prelude::*;
        let time = prop::sample::select(vec![0i64, 10, 20, 30, 40]);
        prop_oneof![
            6 => (time.clone(), 0u8..10).prop_map(|(t, k)| TimerOp::Set(t, k)),
            2 => (time.clone(), 0u8..10).prop_map(|(t, k)| TimerOp::Delete(t, k)),
            1 => time.prop_map(TimerOp::Fire),
            2 => proptest::bool::weighted(0.8).prop_map(TimerOp::Checkpoint),
            1 => Just(TimerOp::Restore),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

        /// Timers against a `BTreeSet` of (time, key), across checkpoints
        /// (bases and deltas, some not completing; the log of removals is
        /// dropped after a few in tests) and restores from the last
        /// complete one, applied part by part as a restore does.
        #[test]
        fn timers_agree_with_a_btreeset_across_checkpoints_and_restores(
            ops in proptest::collection::vec(timer_op(), 1..200),
        ) {
            use proptest::prop_assert_eq;
            use std::collections::BTreeSet;
            for (backend, _dir) in backends() {
            // A restore opens the timers of a fresh state (a job's restore
            // starts from empty tables).
            let mut opened = 0;
            let mut open = || {
                opened += 1;
                let scope = StateScope { state: format!("timers-{opened}"), ..scope() };
                TimerState::<u8>::open(&*backend, &scope).unwrap()
            };
            let contents = |t: &mut TimerState<u8>| -> BTreeSet<(i64, u8)> { t.contents().into_iter().collect() };
            let decode = |key: &[u8]| crate::codec::key::decode::<(i64, u8)>(key).unwrap();
            let mut t = open();
            let mut oracle = BTreeSet::new();
            let (mut n, mut complete) = (0u64, (0u64, BTreeSet::new()));
            for op in &ops {
                match op {
                    TimerOp::Set(time, k) => {
                        t.register(*time, group_of(*k), k).unwrap();
                        oracle.insert((*time, *k));
                    }
                    TimerOp::Delete(time, k) => {
                        t.delete(*time, group_of(*k), k).unwrap();
                        oracle.remove(&(*time, *k));
                    }
                    TimerOp::Fire(watermark) => {
                        while let Some((time, keys)) = t.pop_due(*watermark).unwrap() {
                            for (k, g) in keys {
                                prop_assert_eq!(g, group_of(k));
                                proptest::prop_assert!(oracle.remove(&(time, k)), "fired ({}, {}) twice", time, k);
                            }
                        }
                        proptest::prop_assert!(oracle.iter().all(|(time, _)| time > watermark));
                    }
                    TimerOp::Checkpoint(completes) => {
                        n += 1;
                        let export = t.export_changes(n, complete.0).unwrap();
                        let mut parts = Vec::new();
                        let base = export(&mut |part| {
                            parts.push(part.clone());
                            Ok(())
                        })
                        .unwrap();
                        if *completes {
                            let mut restored = if base { BTreeSet::new() } else { complete.1.clone() };
                            for part in &parts {
                                for (_, k) in part.part.removed_keys() {
                                    restored.remove(&decode(k));
                                }
                                for (g, k, v) in part.part.entries() {
                                    prop_assert_eq!(v.len(), 0);
                                    prop_assert_eq!(g, group_of(decode(k).1));
                                    restored.insert(decode(k));
                                }
                            }
                            prop_assert_eq!(&restored, &oracle, "checkpoint {} (base: {})", n, base);
                            complete = (n, restored);
                        }
                    }
                    TimerOp::Restore => {
                        t = open();
                        oracle = complete.1.clone();
                        let entries = oracle
                            .iter()
                            .map(|(time, k)| (group_of(*k), crate::codec::key::encode(&(*time, *k)), Vec::new()))
                            .collect();
                        t.import(entries, "op").unwrap();
                    }
                }
                prop_assert_eq!(contents(&mut t), oracle.clone(), "{}: after {:?}", backend.name(), op);
                prop_assert_eq!(t.len(), oracle.len());
                prop_assert_eq!(t.next_time(), oracle.first().map(|(time, _)| *time));
            }
            }
        }
    }

    #[test]
    fn deltas_hold_changes_and_removals_since_the_last_complete_checkpoint() {
        for (backend, _dir) in backends() {
            deltas_on(&*backend);
        }
    }

    fn deltas_on(backend: &dyn StateBackend) {
        let name = backend.name();
        let mut s = ValueState::<u8, u64>::open(backend, &scope()).unwrap();
        let k = |key: u8| crate::codec::key::encode(&key);
        for key in [1u8, 2, 3] {
            s.update(4, key, &k(key), |v| *v = Some(u64::from(key))).unwrap();
        }
        let first = collect(s.export_changes(1, 0).unwrap()).unwrap();
        assert!(first.base && first.entries.len() == 3, "the first export is a base");
        // Checkpoint 1 completed. Remove 1, change 2.
        s.update(4, 1, &k(1), |v| *v = None).unwrap();
        s.update(4, 2, &k(2), |v| *v = Some(20)).unwrap();
        let delta = collect(s.export_changes(2, 1).unwrap()).unwrap();
        assert!(!delta.base);
        let mut twenty = Vec::new();
        20u64.encode(&mut twenty).unwrap();
        assert_eq!(delta.entries, vec![(4, k(2), twenty)], "{name}");
        assert_eq!(delta.removed, vec![(4, k(1))], "{name}");
        // Checkpoints 2..=10 never complete; export 11 is a base, which
        // fails too: export 12 must still carry the removal of 1.
        for n in 3..=10 {
            assert!(!collect(s.export_changes(n, 1).unwrap()).unwrap().base);
        }
        assert!(collect(s.export_changes(11, 1).unwrap()).unwrap().base, "every tenth export is a base");
        let after_failed_base = collect(s.export_changes(12, 1).unwrap()).unwrap();
        assert!(!after_failed_base.base);
        assert_eq!(after_failed_base.removed, vec![(4, k(1))], "{name}: the removal survives the failed base");
        assert!(after_failed_base.entries.iter().any(|(_, key, _)| *key == k(2)));
        // Once a checkpoint after the removal completes, it is not written again.
        let later = collect(s.export_changes(13, 12).unwrap()).unwrap();
        assert!(later.removed.is_empty() && later.entries.is_empty(), "{name}: {later:?}");
    }

    #[test]
    fn after_a_restore_deltas_wait_for_a_complete_checkpoint_of_this_run() {
        let k = |key: u8| crate::codec::key::encode(&key);
        for (backend, _dir) in backends() {
            let name = backend.name();
            // Restored from checkpoint 5: the first checkpoint of this run is 6.
            let mut s = ValueState::<u8, u64>::open(&*backend, &scope()).unwrap();
            s.update(4, 1, &k(1), |v| *v = Some(1)).unwrap();
            assert!(collect(s.export_changes(6, 5).unwrap()).unwrap().base, "{name}");
            s.update(4, 2, &k(2), |v| *v = Some(2)).unwrap();
            // Checkpoint 6 failed: 7 cannot build on 5, which lacks key 1.
            let seventh = collect(s.export_changes(7, 5).unwrap()).unwrap();
            assert!(seventh.base && seventh.entries.len() == 2, "{name}: {seventh:?}");
            // Checkpoint 7 completed: 8 builds on it.
            s.update(4, 3, &k(3), |v| *v = Some(3)).unwrap();
            let eighth = collect(s.export_changes(8, 7).unwrap()).unwrap();
            assert!(!eighth.base, "{name}");
            assert_eq!(eighth.entries.iter().map(|(_, key, _)| key.clone()).collect::<Vec<_>>(), vec![k(3)], "{name}");
        }
    }

    #[test]
    fn changes_are_logged_only_from_the_first_checkpoint_on() {
        let k = |key: u8| crate::codec::key::encode(&key);
        for (backend, _dir) in backends() {
            let name = backend.name();
            let mut s = ValueState::<u8, u64>::open(&*backend, &scope()).unwrap();
            let logged = |s: &ValueState<u8, u64>| {
                s.removed.iter().map(Vec::len).sum::<usize>() + s.changed.iter().map(|c| c.len()).sum::<usize>()
            };
            for key in 0..50u8 {
                s.update(4, key, &k(key), |v| *v = Some(1)).unwrap();
                s.update(4, key, &k(key), |v| *v = None).unwrap();
            }
            assert_eq!(logged(&s), 0, "{name}: a job without checkpoints keeps no change log");
            s.update(4, 60, &k(60), |v| *v = Some(1)).unwrap();
            let first = collect(s.export_changes(1, 0).unwrap()).unwrap();
            assert!(first.base && first.entries.len() == 1, "{name}: {first:?}");
            s.update(4, 60, &k(60), |v| *v = None).unwrap();
            s.update(4, 1, &k(1), |v| *v = Some(1)).unwrap();
            s.update(4, 1, &k(1), |v| *v = None).unwrap();
            let delta = collect(s.export_changes(2, 1).unwrap()).unwrap();
            assert!(delta.entries.is_empty(), "{name}: {delta:?}");
            assert!(
                delta.removed.contains(&(4, k(60))),
                "{name}: after the first checkpoint a removal is kept: {delta:?}"
            );
        }
    }

    #[test]
    fn a_group_outside_the_range_is_an_internal_error() {
        let mut s = ValueState::<u8, u64>::open(&MemoryBackend, &scope()).unwrap();
        let err = s.update(9, 1, &[1], |_| ()).unwrap_err();
        assert!(err.to_string().contains("key group 9"), "{err}");
    }
}
