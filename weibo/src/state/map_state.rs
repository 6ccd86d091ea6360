//! Map and list state: many entries per key, each stored on its own.
//!
//! A map entry is the value of the composite key `(key, user key)`, whose
//! encoding is the key's followed by the user key's (the key encoding is
//! self-delimiting and sorts like the value, see [`crate::codec::key`]).
//! All of a key's entries therefore share the key's encoding as a prefix
//! and sit together in key-byte order, in the key group of the key (not of
//! the composite): a byte table reads a key's map as one prefix scan, a
//! checkpoint carries the entries that changed, and a restore or rescale
//! moves them with their key. Entries live in a [`ValueStore`] of the
//! composite key, so they are checkpointed, restored and tracked for
//! incremental checkpoints as value state is.
//!
//! On a backend that keeps objects, the store's maps are unordered: an
//! index per key of its user keys' encodings (in order) makes a key's
//! entries iterable without visiting anyone else's. It is rebuilt from the
//! entries on restore, never written to a checkpoint. On a byte backend
//! the entries sit behind the backend's object cache, if it has one, as
//! value state's do; a key's entries in order are the table's prefix with
//! the cache's entries of that key group laid over it (the cache sorts its
//! entries at or after the key, as far as one chunk: work bounded by the
//! cache's budget, not by the state).
//!
//! A list is a map from a sequence number to the element: `add` writes one
//! entry and reads nothing. Numbers grow per operator instance, above any
//! restored one, so a key's elements keep the order they were added in.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;

use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::{Error, Result};
use crate::state::value::{ValueStore, key_error};
use crate::state::{Barrier, EntryRef, KeyedState, ObjectMap, RemovedRef, Snapshot, StateBackend, StateScope};

/// How many entries a map iterator reads from the store at a time.
const CHUNK: usize = 256;

/// A key's user keys in the order of their encodings: the in-memory
/// index that makes a key's entries iterable without visiting anyone
/// else's.
pub trait UserKeys<UK>: Default + Send + 'static {
    /// Records `user_key`, encoded `bytes` (already there: nothing changes).
    fn record(&mut self, bytes: &[u8], user_key: UK);

    /// Forgets the user key encoded `bytes`.
    fn forget(&mut self, bytes: &[u8]);

    /// Whether it holds no user key.
    fn is_empty(&self) -> bool;

    /// Up to `limit` user keys from `from` and within `end`, in order, with
    /// their encodings.
    fn read(&self, from: Bound<&[u8]>, end: &Bound<Vec<u8>>, limit: usize) -> Vec<(Vec<u8>, UK)>;

    /// Every user key.
    fn into_keys(self) -> Vec<UK>;
}

/// A map's index: its user keys by their encodings.
pub type OrderedKeys<UK> = BTreeMap<Box<[u8]>, UK>;

impl<UK: Key> UserKeys<UK> for OrderedKeys<UK> {
    fn record(&mut self, bytes: &[u8], user_key: UK) {
        if !self.contains_key(bytes) {
            BTreeMap::insert(self, bytes.into(), user_key);
        }
    }

    fn forget(&mut self, bytes: &[u8]) {
        BTreeMap::remove(self, bytes);
    }

    fn is_empty(&self) -> bool {
        BTreeMap::is_empty(self)
    }

    fn read(&self, from: Bound<&[u8]>, end: &Bound<Vec<u8>>, limit: usize) -> Vec<(Vec<u8>, UK)> {
        BTreeMap::range::<[u8], _>(self, (from, Bound::Unbounded))
            .take_while(|(k, _)| below_end(k, end))
            .take(limit)
            .map(|(k, uk)| (k.to_vec(), uk.clone()))
            .collect()
    }

    fn into_keys(self) -> Vec<UK> {
        self.into_values().collect()
    }
}

/// A list's index: its elements' sequence numbers, ascending (a `u64`'s
/// encoding is its big-endian bytes, which sort as the numbers do). An
/// element costs 8 bytes here, against about 60 in a map's index. A deque:
/// elements are added at the back and, with a time-to-live, expire from
/// the front, both in constant time.
#[derive(Debug, Default)]
pub struct Sequence(VecDeque<u64>);

impl UserKeys<u64> for Sequence {
    fn record(&mut self, bytes: &[u8], seq: u64) {
        let _ = bytes;
        // Appends come in order; a restore's parts may not.
        if self.0.back().is_none_or(|last| *last < seq) {
            self.0.push_back(seq);
        } else if let Err(at) = self.0.binary_search(&seq) {
            self.0.insert(at, seq);
        }
    }

    fn forget(&mut self, bytes: &[u8]) {
        let Ok(seq) = crate::codec::key::decode::<u64>(bytes) else { return };
        if self.0.front() == Some(&seq) {
            self.0.pop_front();
        } else if let Ok(at) = self.0.binary_search(&seq) {
            self.0.remove(at);
        }
        if self.0.capacity() > 2 * self.0.len() + 8 {
            self.0.shrink_to_fit();
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn read(&self, from: Bound<&[u8]>, end: &Bound<Vec<u8>>, limit: usize) -> Vec<(Vec<u8>, u64)> {
        let start = match from {
            Bound::Included(b) => self.0.partition_point(|s| s.to_be_bytes().as_slice() < b),
            Bound::Excluded(b) => self.0.partition_point(|s| s.to_be_bytes().as_slice() <= b),
            Bound::Unbounded => 0,
        };
        self.0
            .range(start..)
            .map(|s| (s.to_be_bytes().to_vec(), *s))
            .take_while(|(k, _)| below_end(k, end))
            .take(limit)
            .collect()
    }

    fn into_keys(self) -> Vec<u64> {
        self.0.into()
    }
}

/// The entries of map state: `UV`s by (key `K`, user key `UK`), with an
/// index `I` of each key's user keys when they are kept in memory.
pub struct MapStore<K, UK, UV, I = OrderedKeys<UK>> {
    values: ValueStore<(K, UK), UV>,
    /// Objects store only: each key's user keys, in encoded order.
    index: Option<ObjectMap<K, I>>,
    operator: String,
}

impl<K, UK, UV, I> std::fmt::Debug for MapStore<K, UK, UV, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapStore").field("operator", &self.operator).finish_non_exhaustive()
    }
}

/// The composite key's encoding: `key` (its bytes if given, else encoded
/// here) then `user_key`; and where the user key's bytes start.
fn composite<K: Key, UK: Key>(key: &K, key_bytes: &[u8], user_key: &UK) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(key_bytes.len() + 16);
    if key_bytes.is_empty() {
        key.encode_key(&mut out);
    } else {
        out.extend_from_slice(key_bytes);
    }
    let at = out.len();
    user_key.encode_key(&mut out);
    (out, at)
}

/// The smallest byte string above every one that starts with `prefix`, if
/// there is one (`None`: `prefix` is all `0xFF`, nothing is above).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Bounds over encoded user keys.
pub(crate) type ByteRange = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// The encoded bounds of a range of user keys.
pub(crate) fn encoded_range<UK: Key>(range: &impl std::ops::RangeBounds<UK>) -> ByteRange {
    let bound = |b: Bound<&UK>| match b {
        Bound::Included(k) => Bound::Included(crate::codec::key::encode(k)),
        Bound::Excluded(k) => Bound::Excluded(crate::codec::key::encode(k)),
        Bound::Unbounded => Bound::Unbounded,
    };
    (bound(range.start_bound()), bound(range.end_bound()))
}

/// The encoded user keys that start with `prefix`'s encoding.
pub(crate) fn prefix_range<P: Key>(prefix: &P) -> ByteRange {
    let start = crate::codec::key::encode(prefix);
    let end = prefix_end(&start).map_or(Bound::Unbounded, Bound::Excluded);
    (Bound::Included(start), end)
}

fn below_end(key: &[u8], end: &Bound<Vec<u8>>) -> bool {
    match end {
        Bound::Included(e) => key <= e.as_slice(),
        Bound::Excluded(e) => key < e.as_slice(),
        Bound::Unbounded => true,
    }
}

impl<K: Key, UK: Key, UV: Data, I: UserKeys<UK>> MapStore<K, UK, UV, I> {
    /// Opens the map state `scope` names on `backend`.
    ///
    /// # Errors
    /// As [`ValueStore::open`].
    pub fn open(backend: &dyn StateBackend, scope: &StateScope) -> Result<Self> {
        let values = ValueStore::open_scannable(backend, scope)?;
        let index = values.keeps_objects().then(ObjectMap::default);
        Ok(Self { values, index, operator: scope.operator.clone() })
    }

    /// The value at `user_key` in `key`'s map, if any.
    ///
    /// # Errors
    /// [`Error::State`] or [`Error::Codec`] when a byte backend fails.
    pub fn get(&mut self, group: u16, key: &K, key_bytes: &[u8], user_key: &UK) -> Result<Option<UV>> {
        if self.index.is_some() {
            // Live objects: looked up by the typed key alone.
            return self.values.get(group, &(key.clone(), user_key.clone()), &[]);
        }
        let (bytes, _) = composite(key, key_bytes, user_key);
        self.values.get(group, &(key.clone(), user_key.clone()), &bytes)
    }

    /// Sets the value at `user_key` in `key`'s map, reading nothing.
    ///
    /// # Errors
    /// As [`MapStore::get`].
    pub fn put(&mut self, group: u16, key: &K, key_bytes: &[u8], user_key: UK, value: UV) -> Result<()> {
        self.update(group, key, key_bytes, user_key, |slot| *slot = Some(value))
    }

    /// Changes the value at `user_key` in `key`'s map in place: `f` gets
    /// it (`None` if absent) and what it leaves is stored (`None` removes
    /// the entry).
    ///
    /// # Errors
    /// As [`MapStore::get`].
    pub fn update<R>(
        &mut self,
        group: u16,
        key: &K,
        key_bytes: &[u8],
        user_key: UK,
        f: impl FnOnce(&mut Option<UV>) -> R,
    ) -> Result<R> {
        if self.index.is_none() {
            let (bytes, _) = composite(key, key_bytes, &user_key);
            return self.values.update(group, (key.clone(), user_key), &bytes, f);
        }
        // Live objects: the index changes only when the entry appears or
        // goes, which the update tells.
        let composite_key = (key.clone(), user_key);
        let (result, was, is) = self.values.update(group, composite_key.clone(), &[], |slot| {
            let was = slot.is_some();
            let result = f(slot);
            (result, was, slot.is_some())
        })?;
        if was != is
            && let Some(index) = &mut self.index
        {
            let (key, user_key) = composite_key;
            let mut user_bytes = Vec::new();
            user_key.encode_key(&mut user_bytes);
            index_entry(index, &key, &user_bytes, is.then_some(user_key));
        }
        Ok(result)
    }

    /// Removes the entry at `user_key` from `key`'s map, returning its value.
    ///
    /// # Errors
    /// As [`MapStore::get`].
    pub fn remove(&mut self, group: u16, key: &K, key_bytes: &[u8], user_key: UK) -> Result<Option<UV>> {
        self.update(group, key, key_bytes, user_key, Option::take)
    }

    /// Up to `limit` entries of `key`'s map with encoded user keys from
    /// `from` and within `end`, in encoded order, into `out`; whether the
    /// map may hold more past the last one.
    ///
    /// # Errors
    /// As [`MapStore::get`], and [`Error::Internal`] when a stored key does
    /// not decode.
    pub fn read_chunk(
        &mut self,
        group: u16,
        key: &K,
        key_bytes: &[u8],
        (from, end): (&Bound<Vec<u8>>, &Bound<Vec<u8>>),
        limit: usize,
        out: &mut Vec<(Vec<u8>, UK, UV)>,
    ) -> Result<bool> {
        if let Some(index) = &self.index {
            let Some(keys) = index.get(key) else { return Ok(false) };
            let start = match from {
                Bound::Included(b) => Bound::Included(b.as_slice()),
                Bound::Excluded(b) => Bound::Excluded(b.as_slice()),
                Bound::Unbounded => Bound::Unbounded,
            };
            let wanted = keys.read(start, end, limit.saturating_add(1));
            let more = wanted.len() > limit;
            for (bytes, uk) in wanted.into_iter().take(limit) {
                let composite = (key.clone(), uk.clone());
                if let Some(value) = self.values.get(group, &composite, &[])? {
                    out.push((bytes, uk, value));
                }
            }
            return Ok(more);
        }
        let mut prefix = Vec::new();
        if key_bytes.is_empty() {
            key.encode_key(&mut prefix);
        } else {
            prefix.extend_from_slice(key_bytes);
        }
        let mut start = prefix.clone();
        let exclude = match from {
            Bound::Included(b) => {
                start.extend_from_slice(b);
                None
            }
            Bound::Excluded(b) => {
                start.extend_from_slice(b);
                Some(start.clone())
            }
            Bound::Unbounded => None,
        };
        let (mut failure, mut read, mut more) = (None, 0usize, false);
        let operator = &self.operator;
        // The entry excluded, `limit` entries, and one to tell whether there
        // are more: a cache sorts no more than that.
        self.values.scan_from(group, &start, limit.saturating_add(2), &mut |k, v| {
            let Some(user_bytes) = k.strip_prefix(prefix.as_slice()) else { return false };
            if exclude.as_deref() == Some(k) {
                return true;
            }
            if !below_end(user_bytes, end) {
                return false;
            }
            if read == limit {
                more = true;
                return false;
            }
            let user_key = match crate::codec::key::decode::<UK>(user_bytes) {
                Ok(uk) => uk,
                Err(e) => {
                    failure = Some(key_error(operator, e));
                    return false;
                }
            };
            match UV::decode(v) {
                Ok(value) => out.push((user_bytes.to_vec(), user_key, value)),
                Err(source) => {
                    failure = Some(Error::Codec { operator: operator.clone(), source });
                    return false;
                }
            }
            read += 1;
            true
        })?;
        failure.map_or(Ok(more), Err)
    }

    /// Calls `f` with every entry of `key`'s map whose encoded user key is
    /// in `range`, in encoded order, a chunk at a time (a byte table is
    /// never read whole), until `f` returns false.
    ///
    /// # Errors
    /// As [`MapStore::read_chunk`].
    pub fn for_each(
        &mut self,
        group: u16,
        key: &K,
        key_bytes: &[u8],
        range: &ByteRange,
        mut f: impl FnMut(UK, UV) -> bool,
    ) -> Result<()> {
        let mut from = range.0.clone();
        let mut chunk = Vec::new();
        loop {
            chunk.clear();
            let more = self.read_chunk(group, key, key_bytes, (&from, &range.1), CHUNK, &mut chunk)?;
            let Some((last, _, _)) = chunk.last() else { return Ok(()) };
            from = Bound::Excluded(last.clone());
            for (_, uk, uv) in chunk.drain(..) {
                if !f(uk, uv) {
                    return Ok(());
                }
            }
            if !more {
                return Ok(());
            }
        }
    }

    /// Removes every entry of `key`'s map.
    ///
    /// # Errors
    /// As [`MapStore::read_chunk`].
    pub fn clear(&mut self, group: u16, key: &K, key_bytes: &[u8]) -> Result<()> {
        if let Some(index) = &mut self.index {
            let keys = index.remove(key).unwrap_or_default();
            for uk in keys.into_keys() {
                self.values.update(group, (key.clone(), uk), &[], |slot| *slot = None)?;
            }
            return Ok(());
        }
        loop {
            let mut chunk = Vec::new();
            let more =
                self.read_chunk(group, key, key_bytes, (&Bound::Unbounded, &Bound::Unbounded), CHUNK, &mut chunk)?;
            for (_, uk, _) in chunk {
                let (bytes, _) = composite(key, key_bytes, &uk);
                self.values.update(group, (key.clone(), uk), &bytes, |slot| *slot = None)?;
            }
            if !more {
                return Ok(());
            }
        }
    }

    /// Whether `key`'s map has no entries.
    ///
    /// # Errors
    /// As [`MapStore::read_chunk`].
    pub fn is_empty(&mut self, group: u16, key: &K, key_bytes: &[u8]) -> Result<bool> {
        if let Some(index) = &self.index {
            return Ok(index.get(key).is_none_or(UserKeys::is_empty));
        }
        let mut chunk = Vec::new();
        self.read_chunk(group, key, key_bytes, (&Bound::Unbounded, &Bound::Unbounded), 1, &mut chunk)?;
        Ok(chunk.is_empty())
    }

    /// Removes the entries of key group `group` whose value `keep` refuses
    /// (every key's), returning how many.
    ///
    /// # Errors
    /// As [`MapStore::read_chunk`].
    pub(crate) fn retain_group(&mut self, group: u16, mut keep: impl FnMut(&UV) -> bool) -> Result<u64> {
        let mut gone = Vec::new();
        self.values.for_each_in_group(group, |(k, uk), v| {
            if !keep(v) {
                gone.push((k.clone(), uk.clone()));
            }
        })?;
        let removed = gone.len() as u64;
        for (k, uk) in gone {
            self.remove(group, &k, &[], uk)?;
        }
        Ok(removed)
    }

    /// Keeps the in-memory index in step with a restored part.
    fn index_part(&mut self, entries: &[EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        let Some(index) = &mut self.index else { return Ok(()) };
        for (_, bytes) in removed {
            let (key, _, user_bytes) = split::<K, UK>(&self.operator, bytes)?;
            index_entry(index, &key, user_bytes, None);
        }
        for (_, bytes, _) in entries {
            let (key, user_key, user_bytes) = split::<K, UK>(&self.operator, bytes)?;
            index_entry(index, &key, user_bytes, Some(user_key));
        }
        Ok(())
    }
}

/// A composite key's key, user key and the user key's bytes.
fn split<'b, K: Key, UK: Key>(operator: &str, bytes: &'b [u8]) -> Result<(K, UK, &'b [u8])> {
    let mut rest = bytes;
    let key = K::decode_key(&mut rest).map_err(|e| key_error(operator, e))?;
    let user_bytes = rest;
    let user_key = crate::codec::key::decode::<UK>(user_bytes).map_err(|e| key_error(operator, e))?;
    Ok((key, user_key, user_bytes))
}

/// Records (`Some`) or forgets (`None`) a user key in `key`'s index entry.
fn index_entry<K: Key, UK, I: UserKeys<UK>>(
    index: &mut ObjectMap<K, I>,
    key: &K,
    user_bytes: &[u8],
    user_key: Option<UK>,
) {
    match user_key {
        Some(uk) => match index.get_mut(key) {
            Some(keys) => keys.record(user_bytes, uk),
            None => {
                let mut keys = I::default();
                keys.record(user_bytes, uk);
                index.insert(key.clone(), keys);
            }
        },
        None => {
            if let Some(keys) = index.get_mut(key) {
                keys.forget(user_bytes);
                if keys.is_empty() {
                    index.remove(key);
                }
            }
        }
    }
}

impl<K: Key, UK: Key, UV: Data, I: UserKeys<UK>> KeyedState for MapStore<K, UK, UV, I> {
    fn snapshot_at(&mut self, operator: &str, at: Option<Barrier>) -> Result<Snapshot> {
        KeyedState::snapshot_at(&mut self.values, operator, at)
    }

    fn import_part(&mut self, operator: &str, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        self.index_part(entries, removed)?;
        KeyedState::import_part(&mut self.values, operator, entries, removed)
    }

    fn stats(&self) -> super::StateStats {
        KeyedState::stats(&self.values)
    }
}

/// The elements of list state: `T`s in the order they were added, per key.
pub struct ListStore<K, T> {
    entries: MapStore<K, u64, T, Sequence>,
    /// The sequence number of the next element added (on this instance).
    next: u64,
}

impl<K, T> std::fmt::Debug for ListStore<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListStore").field("next", &self.next).finish_non_exhaustive()
    }
}

impl<K: Key, T: Data> ListStore<K, T> {
    /// Opens the list state `scope` names on `backend`.
    ///
    /// # Errors
    /// As [`ValueStore::open`].
    pub fn open(backend: &dyn StateBackend, scope: &StateScope) -> Result<Self> {
        Ok(Self { entries: MapStore::open(backend, scope)?, next: 0 })
    }

    /// Appends `value` to `key`'s list without reading it.
    ///
    /// # Errors
    /// As [`MapStore::get`].
    pub fn add(&mut self, group: u16, key: &K, key_bytes: &[u8], value: T) -> Result<()> {
        let seq = self.next;
        self.next += 1;
        self.entries.put(group, key, key_bytes, seq, value)
    }

    /// Calls `f` with `key`'s elements in order, a chunk at a time, until
    /// it returns false.
    ///
    /// # Errors
    /// As [`MapStore::read_chunk`].
    pub fn for_each(&mut self, group: u16, key: &K, key_bytes: &[u8], mut f: impl FnMut(T) -> bool) -> Result<()> {
        let all = (Bound::Unbounded, Bound::Unbounded);
        self.entries.for_each(group, key, key_bytes, &all, |_, v| f(v))
    }

    /// Removes `key`'s elements.
    ///
    /// # Errors
    /// As [`MapStore::read_chunk`].
    pub fn clear(&mut self, group: u16, key: &K, key_bytes: &[u8]) -> Result<()> {
        self.entries.clear(group, key, key_bytes)
    }

    /// The list's entries, by sequence number.
    pub(crate) fn entries_mut(&mut self) -> &mut MapStore<K, u64, T, Sequence> {
        &mut self.entries
    }

    /// Whether `key`'s list is empty.
    ///
    /// # Errors
    /// As [`MapStore::read_chunk`].
    pub fn is_empty(&mut self, group: u16, key: &K, key_bytes: &[u8]) -> Result<bool> {
        self.entries.is_empty(group, key, key_bytes)
    }
}

impl<K: Key, T: Data> KeyedState for ListStore<K, T> {
    fn snapshot_at(&mut self, operator: &str, at: Option<Barrier>) -> Result<Snapshot> {
        self.entries.snapshot_at(operator, at)
    }

    fn import_part(&mut self, operator: &str, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        for (_, bytes, _) in entries.iter() {
            let (_, seq, _) = split::<K, u64>(&self.entries.operator, bytes)?;
            self.next = self.next.max(seq.saturating_add(1));
        }
        self.entries.import_part(operator, entries, removed)
    }

    fn stats(&self) -> super::StateStats {
        self.entries.stats()
    }
}
