//! `FlatMap`: the in-memory value state's map of one key group, a hash map
//! whose cache lines can be loaded ahead of use.
//!
//! A keyed operator over millions of keys misses the caches (and the TLB)
//! on nearly every record: first on the table's control bytes, then on the
//! entry they point to. Looking records up ahead (`contains_key` a few
//! records early) overlaps some of those misses, but each lookup still
//! waits for its control bytes before it can read its entry, and the
//! processor runs only so far ahead. A prefetch instruction waits for
//! nothing: [`FlatMap::prefetch`] asks for the lines of a key a few
//! records before it is used (the control bytes where its probe starts,
//! and the entries there, where most keys sit), and goes on.
//!
//! That needs the table's address, which `hashbrown::HashMap` does not
//! give; its `HashTable` does, indirectly: an entry's bucket index and
//! address place the table (entries are laid out downwards from the
//! control bytes, bucket `i` ending `i * size` bytes before them). The map
//! keeps that address, learned on every insert, and a test pins the
//! layout. A wrong address costs only a useless prefetch: a prefetch reads
//! nothing into the program and never faults.

use std::hash::{BuildHasher, Hash};

use hashbrown::HashTable;
use hashbrown::hash_table;
use rustc_hash::FxBuildHasher;

#[inline]
fn hash<K: Hash>(key: &K) -> u64 {
    FxBuildHasher.hash_one(key)
}

/// A hash map from `K` to `V` (FxHash), with the subset of
/// `hashbrown::HashMap`'s interface the value state uses, and
/// [`FlatMap::prefetch`].
pub(crate) struct FlatMap<K, V> {
    table: HashTable<(K, V)>,
    /// The address of the table's control bytes (where bucket 0's entry
    /// ends), or 0 while unknown (nothing inserted into this allocation
    /// yet): learned from the entries inserted.
    base: usize,
}

impl<K, V> Default for FlatMap<K, V> {
    fn default() -> Self {
        Self { table: HashTable::new(), base: 0 }
    }
}

impl<K: Clone, V: Clone> Clone for FlatMap<K, V> {
    fn clone(&self) -> Self {
        let mut copy = Self { table: self.table.clone(), base: 0 };
        copy.rebase();
        copy
    }

    /// Copies `source` into this map's allocation when it is the same size
    /// (as hashbrown does): a spare map a checkpoint copies into is already
    /// mapped (see `spares`).
    fn clone_from(&mut self, source: &Self) {
        self.table.clone_from(&source.table);
        self.rebase();
    }
}

impl<K: std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for FlatMap<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.table.iter().map(|(k, v)| (k, v))).finish()
    }
}

/// Where an entry of `T` at bucket `index`, found at `addr`, places the
/// table's control bytes.
#[inline]
fn base_of<T>(entry: &T, index: usize) -> usize {
    let addr: *const T = entry;
    (addr as usize).wrapping_add(index.wrapping_add(1).wrapping_mul(size_of::<T>()))
}

impl<K, V> FlatMap<K, V> {
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// How many entries it holds without growing.
    pub(crate) fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Empties it, keeping its allocation (and so its address).
    pub(crate) fn clear(&mut self) {
        self.table.clear();
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.table.iter().map(|(k, v)| (k, v))
    }

    /// Learns the table's address again from any entry (after a copy or
    /// a reallocation).
    fn rebase(&mut self) {
        self.base = self
            .table
            .iter_buckets()
            .next()
            .and_then(|index| self.table.get_bucket(index).map(|entry| base_of(entry, index)))
            .unwrap_or(0);
    }
}

impl<K: Hash + Eq, V> FlatMap<K, V> {
    #[inline]
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        self.table.find(hash(key), |(k, _)| k == key).map(|(_, v)| v)
    }

    /// Sets `key` to `value`, returning the value it replaces.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.entry(key) {
            Entry::Occupied(mut e) => Some(std::mem::replace(e.get_mut(), value)),
            Entry::Vacant(e) => {
                e.insert(value);
                None
            }
        }
    }

    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        match self.table.find_entry(hash(key), |(k, _)| k == key) {
            Ok(e) => Some(e.remove().0.1),
            Err(_) => None,
        }
    }

    /// Room for `additional` more entries without growing.
    pub(crate) fn reserve(&mut self, additional: usize) {
        let buckets = self.table.num_buckets();
        self.table.reserve(additional, |(k, _)| hash(k));
        if self.table.num_buckets() != buckets {
            self.rebase();
        }
    }

    /// The key's place in the map. Like `hashbrown::HashMap::entry`, a
    /// key already there is found without making room for another (a
    /// full table grows only when a key is inserted).
    #[inline]
    pub(crate) fn entry(&mut self, key: K) -> Entry<'_, K, V> {
        let h = hash(&key);
        match self.table.find_entry(h, |(k, _)| *k == key) {
            Ok(entry) => Entry::Occupied(OccupiedEntry { entry }),
            Err(absent) => {
                let table = absent.into_table();
                // Room is made for the key here: a full table grows, and
                // its address changes.
                let full = table.len() == table.capacity();
                match table.entry(h, |(k, _)| *k == key, |(k, _)| hash(k)) {
                    // Not there a moment ago.
                    hash_table::Entry::Occupied(entry) => Entry::Occupied(OccupiedEntry { entry }),
                    hash_table::Entry::Vacant(entry) => {
                        if full {
                            // Learned again when the key is inserted.
                            self.base = 0;
                        }
                        Entry::Vacant(VacantEntry { entry, key, base: &mut self.base })
                    }
                }
            }
        }
    }

    /// Asks the processor to load the lines `key` will be found on (or
    /// inserted at, mostly): the control bytes its probe starts at (and the
    /// 16 before, which an update reads) and the entries there. Does
    /// nothing until the table's address is known.
    ///
    /// Stable Rust issues prefetch instructions on x86_64 only; elsewhere
    /// the key is looked up instead (its misses then overlap with those of
    /// the other keys looked up ahead, as far as the processor runs ahead).
    #[cfg(target_arch = "x86_64")]
    #[inline]
    pub(crate) fn prefetch(&self, key: &K) {
        if self.base == 0 {
            return;
        }
        let start = (hash(key) as usize) & self.table.num_buckets().wrapping_sub(1);
        // The control bytes a lookup reads: a group of 16 from `start`, on
        // one line or two. (A removal reads the 16 before it too, and so
        // does the update of a value with drop glue, which hashbrown takes
        // out and puts back; removals are rare, and a value without drop
        // glue is updated in place: see `OccupiedEntry::replace_entry_with`.)
        let ctrl = self.base.wrapping_add(start);
        prefetch_lines(ctrl, ctrl.wrapping_add(15));
        // The entries at `start` and after it (at `start + 1`, where keys
        // pushed one slot along sit; entries lie downwards from `base`),
        // as far as the first 64 bytes of each: two or three lines.
        let size = size_of::<(K, V)>();
        let entry = self.base.wrapping_sub(start.wrapping_add(1).wrapping_mul(size));
        prefetch_lines(entry.wrapping_sub(size.min(64)), entry.wrapping_add(size.saturating_sub(1).min(63)));
    }

    /// See the x86_64 version.
    #[cfg(not(target_arch = "x86_64"))]
    #[inline]
    pub(crate) fn prefetch(&self, key: &K) {
        std::hint::black_box(self.get(key).is_some());
    }
}

/// Loads the cache lines from `first` to `last` (three at most: `last`
/// is less than 128 bytes after `first`) into the first-level cache,
/// without waiting for them.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_lines(first: usize, last: usize) {
    prefetch_line(first);
    if last >> 6 != first >> 6 {
        prefetch_line(last);
        if (last >> 6).wrapping_sub(first >> 6) > 1 {
            prefetch_line(first.wrapping_add(64));
        }
    }
}

/// Loads the cache line at `addr` into the first-level cache, without
/// waiting for it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_line(addr: usize) {
    // SAFETY: `_mm_prefetch` is a hint: it reads nothing into the program
    // and never faults (the processor drops a prefetch of an address that
    // is not mapped), so any address is sound, and SSE, which it needs, is
    // part of every x86_64 processor. The pointer has no provenance: it is
    // never dereferenced.
    #[allow(unsafe_code)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(std::ptr::without_provenance(addr));
    }
}

/// Replaces the value at `value` (of the entry `holder` holds, whose key
/// is at `key`) with what `f` makes of it, moving it out and writing the
/// new one back in place; if `f` returns `None`, or unwinds, `remove` is
/// given the holder, to take the entry out of its map.
///
/// This is what hashbrown's `replace_entry_with` does, without its erase:
/// hashbrown takes the entry out of the table and puts it back, which
/// reads the control bytes before the bucket and writes the bucket's
/// twice, so on a map far larger than the caches every update dirtied a
/// line of control bytes as well as the entry's (see the Performance
/// chapter). Only a removal touches the control bytes here.
///
/// Only for values without drop glue (`!needs_drop::<V>()`, which the
/// callers check, falling back on hashbrown's way otherwise): a removal
/// goes through the map's own remove, which reads the bucket's (key,
/// value) out as a typed value before `remove` forgets it. After `f` has
/// consumed the value, the bucket's bits are still a valid value only if
/// dropping it freed nothing: a `Box` there would dangle.
///
/// # Safety
/// `V` has no drop glue. `key` and `value` must point to the key and
/// value of the entry `holder` holds, valid for reads and writes until
/// `remove` is called with it or `holder` is dropped, and nothing else may
/// reach them meanwhile. `remove` must take the entry out of its map and
/// forget the value it reads out (a copy of one `f` owned) before anything
/// that may unwind.
#[allow(unsafe_code)]
#[inline]
pub(crate) unsafe fn replace_in_place<H, K, V>(
    holder: H,
    key: *const K,
    value: *mut V,
    f: impl FnOnce(&K, V) -> Option<V>,
    remove: fn(H),
) {
    /// Holds the entry while its value is out of the bucket; dropped with
    /// the entry still in it (`f` returned `None`, or unwound), it has
    /// `remove` take the entry out of the map.
    struct Hole<H> {
        holder: Option<H>,
        remove: fn(H),
    }
    impl<H> Drop for Hole<H> {
        fn drop(&mut self) {
            if let Some(holder) = self.holder.take() {
                (self.remove)(holder);
            }
        }
    }
    // A constant: the check costs nothing, in release builds too.
    assert!(!std::mem::needs_drop::<V>(), "replace_in_place of a value with drop glue");
    let mut hole = Hole { holder: Some(holder), remove };
    // SAFETY: by the caller's contract, `value` holds a value the bucket
    // owns, read out here once: either a new one is written back (the
    // bucket owns a value again) or `hole` has the entry taken out and the
    // bucket's copy of the old value forgotten, so the old value is dropped
    // once, by `f`, which owned it (and, without drop glue, the copy left
    // in the bucket is still a valid value when the map reads it out).
    unsafe {
        let old = std::ptr::read(value);
        if let Some(new) = f(&*key, old) {
            std::ptr::write(value, new);
            hole.holder = None;
        }
    }
}

/// [`OccupiedEntry::replace_entry_with`] for an entry of a
/// `hashbrown::HashMap` (the maps of windows' accumulators).
#[inline]
pub(crate) fn replace_entry_with<K, V, S>(
    mut entry: hashbrown::hash_map::OccupiedEntry<'_, K, V, S>,
    f: impl FnOnce(&K, V) -> Option<V>,
) {
    if std::mem::needs_drop::<V>() {
        let _ = entry.replace_entry_with(f);
        return;
    }
    // The value's pointer first: taking the key's after it only reads.
    let value: *mut V = entry.get_mut();
    let key: *const K = entry.key();
    // SAFETY: `V` has no drop glue (checked above); `key` and `value`
    // point into the bucket of `entry`, which stays in the map, unmoved,
    // until `remove` takes it out (nothing else reaches the map meanwhile:
    // the entry borrows it mutably); `remove` takes the entry out and
    // forgets its value before dropping the key.
    #[allow(unsafe_code)]
    unsafe {
        replace_in_place(entry, key, value, f, |entry| {
            let (key, moved_out) = entry.remove_entry();
            std::mem::forget(moved_out);
            drop(key);
        });
    }
}

/// A key's place in a [`FlatMap`], as `hashbrown::hash_map::Entry`.
pub(crate) enum Entry<'a, K, V> {
    Occupied(OccupiedEntry<'a, K, V>),
    Vacant(VacantEntry<'a, K, V>),
}

pub(crate) struct OccupiedEntry<'a, K, V> {
    entry: hash_table::OccupiedEntry<'a, (K, V)>,
}

impl<K, V> OccupiedEntry<'_, K, V> {
    #[inline]
    pub(crate) fn get_mut(&mut self) -> &mut V {
        &mut self.entry.get_mut().1
    }

    /// The entry's key, and its value to change in place.
    #[inline]
    pub(crate) fn key_and_value(&mut self) -> (&K, &mut V) {
        let (k, v) = self.entry.get_mut();
        (k, v)
    }

    /// Replaces the value with what `f` makes of it, or removes the entry
    /// if `f` returns `None`.
    ///
    /// A value without drop glue is moved out of its bucket and the new
    /// one written back in place: only a removal touches the table's
    /// control bytes (see [`replace_in_place`]). Others go through
    /// hashbrown's `replace_entry_with`, which takes the entry out and
    /// puts it back.
    #[inline]
    pub(crate) fn replace_entry_with(self, f: impl FnOnce(&K, V) -> Option<V>) {
        let mut entry = self.entry;
        if std::mem::needs_drop::<V>() {
            let _ = entry.replace_entry_with(|(k, v)| f(&k, v).map(|v| (k, v)));
            return;
        }
        let (key, value) = entry.get_mut();
        let (key, value): (*const K, *mut V) = (key, value);
        // SAFETY: `V` has no drop glue (checked above); `key` and `value`
        // point into the bucket of `entry`, which stays in the table,
        // unmoved, until `remove` takes it out (nothing else reaches the
        // table meanwhile: the entry borrows it mutably); `remove` takes
        // the entry out and forgets its value before dropping the key.
        #[allow(unsafe_code)]
        unsafe {
            replace_in_place(entry, key, value, f, |entry| {
                let ((key, moved_out), _) = entry.remove();
                std::mem::forget(moved_out);
                drop(key);
            });
        }
    }
}

pub(crate) struct VacantEntry<'a, K, V> {
    entry: hash_table::VacantEntry<'a, (K, V)>,
    key: K,
    base: &'a mut usize,
}

impl<'a, K, V> VacantEntry<'a, K, V> {
    #[inline]
    pub(crate) fn key(&self) -> &K {
        &self.key
    }

    #[inline]
    pub(crate) fn insert(self, value: V) -> &'a mut V {
        let entry = self.entry.insert((self.key, value));
        *self.base = base_of(entry.get(), entry.bucket_index());
        &mut entry.into_mut().1
    }
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use super::*;

    /// The address the map learns is where hashbrown keeps the table's
    /// control bytes: bucket 0's entry ends there and bucket `i`'s starts
    /// `(i + 1) * size` bytes before it, so `prefetch` asks for the lines
    /// a key's probe reads. If a new hashbrown lays its tables out
    /// otherwise, this fails (and prefetches load the wrong lines: slower,
    /// never wrong).
    #[test]
    fn learned_address_places_every_entry() {
        type T = (u64, (u64, u32));
        let size = size_of::<T>();
        let addr = |entry: &T| std::ptr::from_ref(entry) as usize;
        let mut map: FlatMap<u64, (u64, u32)> = FlatMap::default();
        let mut checked = 0;
        for k in 0..20_000u64 {
            let key = k.wrapping_mul(2_654_435_761);
            map.insert(key, (k, 0));
            // Bucket 0 holds a key from time to time: then it ends at the
            // address learned.
            if let Some(first) = map.table.get_bucket(0) {
                assert_eq!(addr(first) + size, map.base, "after inserting key {k}");
                checked += 1;
            }
            let Some(index) = map.table.find_bucket_index(hash(&key), |(q, _)| *q == key) else {
                panic!("key {k} not found after insert")
            };
            let Some(entry) = map.table.get_bucket(index) else { panic!("bucket {index} empty") };
            assert_eq!(addr(entry), map.base - (index + 1) * size, "key {k} in bucket {index}");
        }
        assert!(checked > 0, "bucket 0 never held a key");
        let copy = map.clone();
        let Some(first) = copy.table.get_bucket(0) else { panic!("bucket 0 empty in the copy") };
        assert_eq!(addr(first) + size, copy.base);
        for index in copy.table.iter_buckets() {
            let Some(entry) = copy.table.get_bucket(index) else { panic!("bucket {index} empty") };
            assert_eq!(addr(entry), copy.base - (index + 1) * size);
        }
    }

    /// A copy into a map of the same size reuses its allocation (what
    /// spare maps are kept for), and learns its own address.
    #[test]
    fn clone_from_reuses_the_allocation() {
        let mut source: FlatMap<u64, u64> = FlatMap::default();
        for k in 0..1_000 {
            source.insert(k, k);
        }
        let mut spare = source.clone();
        let spare_base = spare.base;
        assert_ne!(spare_base, 0);
        assert_ne!(spare_base, source.base);
        spare.clear();
        for k in 0..1_000 {
            source.insert(k, k + 1);
        }
        spare.clone_from(&source);
        assert_eq!(spare.base, spare_base, "copied into a new allocation");
        assert_eq!(spare.len(), 1_000);
        assert_eq!(spare.get(&7), Some(&8));
    }

    /// An update of a key already there does not grow a full map (as
    /// `hashbrown::HashMap` does not): a key group whose keys just filled
    /// its map keeps its memory while they are only updated.
    #[test]
    fn updates_do_not_grow_a_full_map() {
        let mut map: FlatMap<u64, u64> = FlatMap::default();
        map.reserve(1_000);
        map.insert(0, 0);
        let mut k = 1;
        while map.len() < map.capacity() {
            map.insert(k, k);
            k += 1;
        }
        let capacity = map.capacity();
        for round in 0..3 {
            for key in 0..k {
                match map.entry(key) {
                    Entry::Occupied(mut e) => *e.get_mut() += 1,
                    Entry::Vacant(_) => panic!("key {key} missing in round {round}"),
                }
            }
        }
        assert_eq!(map.capacity(), capacity, "updates grew the map");
        assert!(k > 1_000);
        assert_eq!(map.get(&3), Some(&6));
        // A new key does grow it.
        map.insert(k, k);
        assert!(map.capacity() > capacity);
        assert_eq!(map.len(), usize::try_from(k + 1).unwrap_or(0));
    }

    /// An update of a value with drop glue (here an `Rc`) goes through
    /// hashbrown's `replace_entry_with`: every value is dropped exactly
    /// once, whether the update keeps the entry, removes it, or panics
    /// (then the entry is gone, as the value it held went with the
    /// closure).
    #[test]
    fn updates_drop_every_value_once() {
        use std::rc::Rc;
        let mut map: FlatMap<u64, Rc<u64>> = FlatMap::default();
        let values: Vec<Rc<u64>> = (0..100).map(Rc::new).collect();
        for (k, v) in (0u64..).zip(&values) {
            map.insert(k, Rc::clone(v));
        }
        // How many references value `k` has (itself, the map's, ...).
        let refs = |k: usize| values.get(k).map(Rc::strong_count);
        // Kept with a new value: the old one is dropped.
        if let Entry::Occupied(e) = map.entry(1) {
            e.replace_entry_with(|_, old| {
                assert_eq!(*old, 1);
                values.get(50).cloned()
            });
        }
        assert_eq!(refs(1), Some(1));
        assert_eq!(refs(50), Some(3));
        assert_eq!(map.get(&1).map(|v| **v), Some(50));
        // Removed.
        if let Entry::Occupied(e) = map.entry(2) {
            e.replace_entry_with(|_, _| None);
        }
        assert_eq!(refs(2), Some(1));
        assert!(map.get(&2).is_none());
        // A panic inside the update.
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if let Entry::Occupied(e) = map.entry(3) {
                e.replace_entry_with(|_, _| panic!("update fails"));
            }
        }));
        assert!(panicked.is_err());
        assert_eq!(refs(3), Some(1), "the value the panicking update held was not dropped once");
        assert!(map.get(&3).is_none());
        assert_eq!(map.len(), 98);
        for (k, v) in (0u64..).zip(&values).skip(4) {
            assert_eq!(map.get(&k), Some(v));
            assert_eq!(Rc::strong_count(v), if k == 50 { 3 } else { 2 });
        }
        drop(map);
        assert!(values.iter().all(|v| Rc::strong_count(v) == 1));
    }

    /// An update of a value without drop glue is made in place
    /// (`replace_in_place`), in a `FlatMap` and in a hashbrown map alike:
    /// kept, replaced, removed, or removed by a panic in the update, with
    /// every key (an `Rc`, counted) dropped exactly once and the map's
    /// length and contents right after each.
    #[test]
    fn updates_in_place_keep_or_remove_the_entry_and_drop_each_key_once() {
        use std::rc::Rc;
        let keys: Vec<Rc<u64>> = (0..64).map(Rc::new).collect();
        let refs = |k: usize| keys.get(k).map(Rc::strong_count);
        let key = |k: usize| keys.get(k).cloned().unwrap_or_else(|| panic!("no key {k}"));
        let mut flat: FlatMap<Rc<u64>, (u64, u32)> = FlatMap::default();
        let mut map: hashbrown::HashMap<Rc<u64>, (u16, u64, u32), FxBuildHasher> = hashbrown::HashMap::default();
        for (k, rc) in keys.iter().enumerate() {
            flat.insert(Rc::clone(rc), (k as u64, 0));
            map.insert(Rc::clone(rc), (0, k as u64, 0));
        }
        let update_flat = |flat: &mut FlatMap<Rc<u64>, (u64, u32)>, k: usize, f: fn(u64) -> Option<u64>| {
            let Entry::Occupied(e) = flat.entry(key(k)) else { panic!("key {k} missing") };
            e.replace_entry_with(|q, (v, stamp)| {
                assert_eq!(**q as usize, k);
                f(v).map(|v| (v, stamp + 1))
            });
        };
        let update_map = |map: &mut hashbrown::HashMap<Rc<u64>, (u16, u64, u32), FxBuildHasher>,
                          k: usize,
                          f: fn(u64) -> Option<u64>| {
            let hashbrown::hash_map::Entry::Occupied(e) = map.entry(key(k)) else { panic!("key {k} missing") };
            replace_entry_with(e, |q, (g, v, stamp)| {
                assert_eq!(**q as usize, k);
                f(v).map(|v| (g, v, stamp + 1))
            });
        };
        // Kept with a new value.
        update_flat(&mut flat, 1, |v| Some(v + 100));
        update_map(&mut map, 1, |v| Some(v + 100));
        assert_eq!(flat.get(&key(1)), Some(&(101, 1)));
        assert_eq!(map.get(&key(1)), Some(&(0, 101, 1)));
        assert_eq!(refs(1), Some(3), "the key of a kept entry is the map's still");
        // Removed: the key goes with the entry.
        update_flat(&mut flat, 2, |_| None);
        update_map(&mut map, 2, |_| None);
        assert_eq!(refs(2), Some(1));
        assert!(flat.get(&key(2)).is_none() && !map.contains_key(&key(2)));
        // A panic inside the update removes the entry, and its key, once.
        for k in [3, 4] {
            let flat_panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                update_flat(&mut flat, k, |_| panic!("update fails"));
            }));
            let map_panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                update_map(&mut map, k, |_| panic!("update fails"));
            }));
            assert!(flat_panic.is_err() && map_panic.is_err());
            assert_eq!(refs(k), Some(1), "key {k}");
            assert!(flat.get(&key(k)).is_none() && !map.contains_key(&key(k)));
        }
        assert_eq!((flat.len(), map.len()), (61, 61));
        for (k, rc) in keys.iter().enumerate().skip(5) {
            assert_eq!(flat.get(rc), Some(&(k as u64, 0)));
            assert_eq!(map.get(rc), Some(&(0, k as u64, 0)));
            assert_eq!(Rc::strong_count(rc), 3);
        }
        drop((flat, map));
        assert!(keys.iter().all(|k| Rc::strong_count(k) == 1));
    }

    /// The map behaves as a hash map: compared with `std`'s over inserts,
    /// updates, removals, entries left vacant, growth and copies, with the
    /// learned address checked after each step.
    #[test]
    fn agrees_with_std_map() {
        let mut map: FlatMap<u64, u64> = FlatMap::default();
        let mut model = std::collections::HashMap::new();
        let mut x = 1u64;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = x % 5_000;
            map.prefetch(&key);
            match x % 8 {
                0 => assert_eq!(map.remove(&key), model.remove(&key), "remove {key} at {step}"),
                1 => assert_eq!(map.insert(key, step), model.insert(key, step), "insert {key} at {step}"),
                2 => {
                    // Odd values go up by one, even ones are removed; a
                    // vacant entry left alone inserts nothing.
                    if let Entry::Occupied(e) = map.entry(key) {
                        e.replace_entry_with(|_, v| if v % 2 == 0 { None } else { Some(v + 1) });
                    }
                    match model.get(&key).copied() {
                        Some(v) if v % 2 == 0 => drop(model.remove(&key)),
                        Some(v) => drop(model.insert(key, v + 1)),
                        None => {}
                    }
                }
                3 => map.reserve(usize::try_from(x % 3_000).unwrap_or(0)),
                4 if step % 1_000 == 0 => map = map.clone(),
                5 if step % 5_000 == 0 => {
                    map.clear();
                    model.clear();
                }
                _ => {
                    match map.entry(key) {
                        Entry::Occupied(mut e) => *e.get_mut() += 1,
                        Entry::Vacant(e) => {
                            assert_eq!(*e.key(), key);
                            *e.insert(step) += 1;
                        }
                    }
                    *model.entry(key).or_insert(step) += 1;
                }
            }
            assert_eq!(map.get(&key), model.get(&key), "key {key} at step {step}");
            assert_eq!(map.len(), model.len(), "len at step {step}");
            if map.base != 0 {
                for index in map.table.iter_buckets().take(4) {
                    let Some(entry) = map.table.get_bucket(index) else { panic!("bucket {index} empty") };
                    assert_eq!(base_of(entry, index), map.base, "address at step {step}");
                }
            }
        }
        let mut all: Vec<_> = map.iter().map(|(k, v)| (*k, *v)).collect();
        all.sort_unstable();
        let mut expected: Vec<_> = model.into_iter().collect();
        expected.sort_unstable();
        assert_eq!(all, expected);
    }
}
