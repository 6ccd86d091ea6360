//! Spare maps for the copies checkpoints make.
//!
//! A checkpoint shares each key group's map with the worker. The snapshot
//! copies a map it shares once the worker has written beside it, before
//! it scans the next key group (see [`Holding`], and `Overlay` in the
//! parent module; a delta that only looks up a short log of changed keys
//! copies nothing), or the worker copies it when its overlay has grown too
//! large. Copied into fresh memory, a copy costs a page fault per page (the
//! kernel zeroes each page first): about half of the copy's time. So
//! copies go into maps an earlier snapshot has finished with, emptied, when
//! there are: their memory is mapped already. Spares are no more than the
//! state has key groups, memory a checkpoint needs anyway at its peak.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// A map that can be emptied and copied into, keeping its allocation.
pub(crate) trait SpareMap: Clone {
    /// A new, empty map (allocating nothing).
    fn empty() -> Self;
    fn clear(&mut self);
    /// How many entries it holds without growing: maps of the same
    /// capacity have the same allocation, which a copy reuses.
    fn capacity(&self) -> usize;
}

impl<K: Clone, V: Clone, S: Clone + Default> SpareMap for hashbrown::HashMap<K, V, S> {
    fn empty() -> Self {
        hashbrown::HashMap::with_hasher(S::default())
    }

    fn clear(&mut self) {
        hashbrown::HashMap::clear(self);
    }

    fn capacity(&self) -> usize {
        hashbrown::HashMap::capacity(self)
    }
}

impl<K: Clone, V: Clone> SpareMap for super::flat::FlatMap<K, V> {
    fn empty() -> Self {
        Self::default()
    }

    fn clear(&mut self) {
        super::flat::FlatMap::clear(self);
    }

    fn capacity(&self) -> usize {
        super::flat::FlatMap::capacity(self)
    }
}

/// A map of the worker's: its own, or shared with the snapshot of a
/// checkpoint (which encodes it on its own thread meanwhile).
///
/// The worker reads it either way (it derefs to the map); to write, it
/// makes it its own again ([`Spares::make_mut`]): a map it owns is written
/// without any atomic operation, which a map always kept in an `Arc`
/// would cost on every write.
#[derive(Debug)]
pub(crate) enum Shareable<M> {
    Own(M),
    Shared(Arc<M>),
}

impl<M: Default> Default for Shareable<M> {
    fn default() -> Self {
        Shareable::Own(M::default())
    }
}

impl<M> std::ops::Deref for Shareable<M> {
    type Target = M;

    #[inline]
    fn deref(&self) -> &M {
        match self {
            Shareable::Own(map) => map,
            Shareable::Shared(map) => map,
        }
    }
}

impl<M: SpareMap> Shareable<M> {
    /// Whether a snapshot still holds the map (the worker must not write
    /// it in place).
    #[inline]
    pub(crate) fn is_shared(&self) -> bool {
        matches!(self, Shareable::Shared(map) if Arc::strong_count(map) > 1)
    }

    /// The map, for a snapshot to hold: the worker's moves into an `Arc`
    /// (the map's table is not copied).
    pub(crate) fn share(&mut self) -> Arc<M> {
        if let Shareable::Own(map) = self {
            *self = Shareable::Shared(Arc::new(std::mem::replace(map, M::empty())));
        }
        match self {
            Shareable::Shared(map) => map.clone(),
            Shareable::Own(map) => Arc::new(map.clone()),
        }
    }

    /// The map, made the worker's own to write: copied when a snapshot
    /// still shares it (see [`Spares::make_mut`] for a copy into a spare).
    #[inline]
    pub(crate) fn make_mut(&mut self) -> &mut M {
        if let Shareable::Shared(_) = self {
            self.own_with(M::clone);
        }
        self.owned()
    }

    /// The map, owned: taken back if no snapshot holds it any longer,
    /// copied (by `copy`) if one does.
    #[cold]
    #[inline(never)]
    fn own_with(&mut self, copy: impl FnOnce(&M) -> M) {
        let Shareable::Shared(shared) = std::mem::replace(self, Shareable::Own(M::empty())) else { return };
        *self = Shareable::Own(match Arc::try_unwrap(shared) {
            Ok(mine) => mine,
            Err(shared) => copy(&shared),
        });
    }

    /// The map itself, if no snapshot holds it any longer.
    pub(crate) fn into_owned(self) -> Option<M> {
        match self {
            Shareable::Own(map) => Some(map),
            Shareable::Shared(map) => Arc::try_unwrap(map).ok(),
        }
    }

    /// The map as a snapshot would hold it.
    pub(crate) fn into_shared(self) -> Arc<M> {
        match self {
            Shareable::Own(map) => Arc::new(map),
            Shareable::Shared(map) => map,
        }
    }

    /// The map, owned: [`Spares::make_mut`] has made it so.
    #[inline]
    fn owned(&mut self) -> &mut M {
        match self {
            Shareable::Own(map) => map,
            // Not reached: `make_mut` owns the map first.
            Shareable::Shared(map) => Arc::make_mut(map),
        }
    }
}

/// Vectors a barrier fills, one entry per key group, kept for the next
/// barrier once the snapshot is done with them.
///
/// With glibc's allocator, the first allocation of about a kilobyte or
/// more after many small frees first merges the small chunks freed
/// (`malloc_consolidate`); after a long run of fjall reads that took 2–11
/// ms, in the barrier's pause whenever the barrier made such an
/// allocation, and a barrier's per-key-group vectors (the maps shared, the
/// logged keys, the change logs) are that size. So they come from here:
/// one of each is allocated with the state, the snapshot hands it back
/// when it drops it (emptied, on its own thread), and the worker's pause
/// allocates none while no two snapshots overlap.
pub(crate) struct Recycler<T> {
    pool: Arc<Mutex<Vec<Vec<T>>>>,
    len: usize,
}

/// How many emptied vectors a [`Recycler`] keeps (two snapshots in
/// flight at once, at most, in the usual case).
const RECYCLED_MOST: usize = 2;

impl<T> Clone for Recycler<T> {
    /// The same recycler (its vectors are shared).
    fn clone(&self) -> Self {
        Self { pool: self.pool.clone(), len: self.len }
    }
}

impl<T> Recycler<T> {
    /// A recycler of vectors of `len` entries, holding one already.
    pub(crate) fn new(len: usize) -> Self {
        let mut pool = Vec::with_capacity(RECYCLED_MOST);
        pool.push(Vec::with_capacity(len));
        Self { pool: Arc::new(Mutex::new(pool)), len }
    }

    /// An empty vector, one a snapshot handed back if there is one (else
    /// allocated).
    pub(crate) fn take(&self) -> Recycled<T> {
        let kept = self.pool.lock().unwrap_or_else(PoisonError::into_inner).pop();
        Recycled { vec: kept.unwrap_or_else(|| Vec::with_capacity(self.len)), pool: Some(self.pool.clone()) }
    }

    /// An empty vector that allocates nothing until written (and is not
    /// kept when dropped), for a barrier that needs none.
    pub(crate) fn none() -> Recycled<T> {
        Recycled { vec: Vec::new(), pool: None }
    }
}

/// A vector from a [`Recycler`], given back to it (emptied) when dropped.
pub(crate) struct Recycled<T> {
    vec: Vec<T>,
    pool: Option<Arc<Mutex<Vec<Vec<T>>>>>,
}

impl<T> std::ops::Deref for Recycled<T> {
    type Target = Vec<T>;

    fn deref(&self) -> &Vec<T> {
        &self.vec
    }
}

impl<T> std::ops::DerefMut for Recycled<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        &mut self.vec
    }
}

impl<T> AsRef<[T]> for Recycled<T> {
    fn as_ref(&self) -> &[T] {
        &self.vec
    }
}

impl<T> Drop for Recycled<T> {
    fn drop(&mut self) {
        let Some(pool) = self.pool.take() else { return };
        let mut vec = std::mem::take(&mut self.vec);
        vec.clear();
        let mut pool = pool.lock().unwrap_or_else(PoisonError::into_inner);
        if vec.capacity() > 0 && pool.len() < RECYCLED_MOST {
            pool.push(vec);
        }
    }
}

/// Maps snapshots are done with, shared by a state and its snapshots: no more
/// than the state has maps (key groups); and the vectors of the maps a
/// snapshot holds (see [`Recycler`]).
pub(crate) struct Spares<M> {
    pool: Arc<Mutex<Vec<M>>>,
    most: usize,
    helds: Recycler<Held<M>>,
}

impl<M> Clone for Spares<M> {
    fn clone(&self) -> Self {
        Self { pool: self.pool.clone(), most: self.most, helds: self.helds.clone() }
    }
}

impl<M: SpareMap> Spares<M> {
    /// Spares for a state of `maps` maps.
    pub(crate) fn new(maps: usize) -> Self {
        Self { pool: Arc::default(), most: maps, helds: Recycler::new(maps) }
    }

    /// `map`, made this side's own to write: copied (into a spare, if
    /// any) when a snapshot still shares it.
    #[inline]
    pub(crate) fn make_mut<'a>(&self, map: &'a mut Shareable<M>) -> &'a mut M {
        if let Shareable::Shared(_) = map {
            self.own(map);
        }
        map.owned()
    }

    /// Makes a shared map the worker's own again: taken back if the
    /// snapshot has let go of it, copied (into a spare of the same
    /// capacity, if any: a copy into another reallocates) if not.
    #[cold]
    #[inline(never)]
    fn own(&self, map: &mut Shareable<M>) {
        map.own_with(|shared| match self.take(shared.capacity()) {
            Some(mut spare) => {
                spare.clone_from(shared);
                spare
            }
            None => M::clone(shared),
        });
    }

    /// A copy of `map` (into a spare, if any), for a snapshot to keep;
    /// `map` is let go of at once.
    pub(crate) fn copy_out(&self, map: Arc<M>) -> M {
        // Nothing else holds it (the worker has dropped it): no copy.
        let map = match Arc::try_unwrap(map) {
            Ok(map) => return map,
            Err(map) => map,
        };
        let spare = self.take(map.capacity());
        match spare {
            Some(mut spare) => {
                spare.clone_from(&map);
                spare
            }
            None => M::clone(&map),
        }
    }

    /// Keeps `map`, emptied, as a spare, if there is room.
    pub(crate) fn keep(&self, mut map: M) {
        if self.pool.lock().unwrap_or_else(PoisonError::into_inner).len() >= self.most {
            return;
        }
        map.clear();
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        if pool.len() < self.most {
            pool.push(map);
        }
    }

    /// A spare, of `capacity` if there is one.
    fn take(&self, capacity: usize) -> Option<M> {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        match pool.iter().position(|s| s.capacity() == capacity) {
            Some(at) => Some(pool.swap_remove(at)),
            None => pool.pop(),
        }
    }

    /// Takes back a map a snapshot has finished with: kept as a spare,
    /// emptied, if nothing else holds it (the worker has copied it since,
    /// or dropped it) and there is room; otherwise just released.
    pub(crate) fn give_back(&self, map: Arc<M>) {
        if let Ok(map) = Arc::try_unwrap(map) {
            // Emptied here, on the snapshot's thread, not the worker's.
            self.keep(map);
        }
    }

    /// How many spares are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// Per key group, whether the worker has written beside the map a snapshot
/// still shares (an overlay) since the last barrier: such a map the snapshot
/// copies and lets go of at its next release (before each key group it
/// scans, and every few thousand entries), rather than when it has encoded
/// it.
#[derive(Clone)]
pub(crate) struct Wanted(Arc<[AtomicBool]>);

impl Wanted {
    /// Flags for `maps` key groups, none set.
    pub(crate) fn new(maps: usize) -> Self {
        Self((0..maps).map(|_| AtomicBool::new(false)).collect())
    }

    /// Flags key group `index` (a plain load first: the flag is set once
    /// per barrier, and read on every write beside the map).
    #[inline]
    pub(crate) fn set(&self, index: usize) {
        if let Some(flag) = self.0.get(index)
            && !flag.load(Ordering::Relaxed)
        {
            flag.store(true, Ordering::Relaxed);
        }
    }

    fn get(&self, index: usize) -> bool {
        self.0.get(index).is_some_and(|flag| flag.load(Ordering::Relaxed))
    }

    /// Clears every flag (at a barrier, before the snapshot shares the maps).
    pub(crate) fn clear(&self) {
        for flag in self.0.iter() {
            flag.store(false, Ordering::Relaxed);
        }
    }
}

/// A map a snapshot shares: still shared, copied (let go of), or done.
pub(crate) enum Held<M> {
    Shared(Arc<M>),
    Copied(M),
    Done,
}

impl<M> Held<M> {
    /// The map, unless done.
    pub(crate) fn map(&self) -> Option<&M> {
        match self {
            Held::Shared(map) => Some(map),
            Held::Copied(map) => Some(map),
            Held::Done => None,
        }
    }
}

/// The maps a snapshot shares with the worker, one per key group.
///
/// The worker writes a key group whose map is still shared beside it (an
/// overlay) and flags it ([`Wanted`]); the snapshot calls [`Holding::release`]
/// before each key group it scans and every few thousand entries (a delta
/// that looks up a key group's logged keys takes it with
/// [`Holding::take_alone`], releasing only every few thousand keys), which
/// copies each flagged map (into a spare) and lets go of it, so that the worker can
/// apply its overlay in place. The maps nobody flags are encoded where
/// they are and let go of when done: an idle job's checkpoint copies
/// nothing, and the worker copies a map only when its overlay outgrows
/// its cap, or when a snapshot still holds the map at the next barrier.
pub(crate) struct Holding<M> {
    held: Recycled<Held<M>>,
    spares: Spares<M>,
    wanted: Wanted,
}

impl<M: SpareMap> Holding<M> {
    /// Shares `maps`; the caller clears `wanted` first.
    pub(crate) fn new(maps: &mut [Shareable<M>], spares: &Spares<M>, wanted: &Wanted) -> Self {
        let mut held = spares.helds.take();
        held.extend(maps.iter_mut().map(|m| Held::Shared(m.share())));
        Self { held, spares: spares.clone(), wanted: wanted.clone() }
    }

    /// How many maps (key groups).
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }

    /// Copies and lets go of every map the worker has flagged, but the one
    /// at `encoding` (taken out already, or about to be).
    pub(crate) fn release(&mut self, encoding: usize) {
        for (i, map) in self.held.iter_mut().enumerate() {
            if i != encoding
                && matches!(map, Held::Shared(_))
                && self.wanted.get(i)
                && let Held::Shared(shared) = std::mem::replace(map, Held::Done)
            {
                *map = Held::Copied(self.spares.copy_out(shared));
            }
        }
    }

    /// Takes map `index` out to encode (flagged maps are released first);
    /// hand it back with [`Holding::done`].
    pub(crate) fn take(&mut self, index: usize) -> Held<M> {
        self.release(index);
        self.held.get_mut(index).map_or(Held::Done, |m| std::mem::replace(m, Held::Done))
    }

    /// Takes map `index` out to encode without releasing the others: for a
    /// short pass (a delta's logged keys), which lets go of the map sooner
    /// than a copy of every flagged map would take. Hand it back with
    /// [`Holding::done`].
    pub(crate) fn take_alone(&mut self, index: usize) -> Held<M> {
        self.held.get_mut(index).map_or(Held::Done, |m| std::mem::replace(m, Held::Done))
    }

    /// Lets go of a map taken out and encoded: a copy is kept as a spare.
    pub(crate) fn done(&self, map: Held<M>) {
        match map {
            Held::Copied(map) => self.spares.keep(map),
            Held::Shared(map) => self.spares.give_back(map),
            Held::Done => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    type Map = hashbrown::HashMap<u64, u64, rustc_hash::FxBuildHasher>;

    #[test]
    fn a_shared_map_is_copied_into_a_spare_and_the_export_gives_it_back() {
        let spares = Spares::<Map>::new(1);
        let mut map: Shareable<Map> = Shareable::Own((0..1000).map(|i| (i, i)).collect());
        // Not shared: written in place.
        spares.make_mut(&mut map).insert(1000, 1000);
        assert!(matches!(map, Shareable::Own(_)));
        let shared = map.share();
        assert!(map.is_shared());
        // Shared with a snapshot: the write copies, leaving the snapshot's as it was.
        spares.make_mut(&mut map).insert(1001, 1001);
        assert_eq!((map.len(), shared.len()), (1002, 1001));
        assert!(!map.is_shared());
        let spare_at = shared.get(&0).unwrap() as *const u64 as usize;
        spares.give_back(shared);
        assert_eq!(spares.len(), 1, "the export's map, copied since, is a spare");
        let shared = map.share();
        spares.make_mut(&mut map).insert(1002, 1002);
        assert_eq!(spares.len(), 0, "the copy went into the spare");
        assert_eq!(map.get(&0).unwrap() as *const u64 as usize, spare_at, "its memory reused");
        assert_eq!(*map, (0..1003).map(|i| (i, i)).collect::<Map>());
        assert_eq!(shared.len(), 1002);
        // A map the worker has not copied is still the worker's: no spare,
        // and the worker takes it back without copying.
        let unshared_export = map.share();
        let before = map.get(&0).unwrap() as *const u64 as usize;
        drop(shared);
        spares.give_back(unshared_export);
        assert_eq!(spares.len(), 0);
        assert!(!map.is_shared());
        spares.make_mut(&mut map).insert(1003, 1003);
        assert!(matches!(map, Shareable::Own(_)));
        assert_eq!(map.get(&0).unwrap() as *const u64 as usize, before, "taken back, not copied");
        assert_eq!(map.len(), 1004);
        // No more spares than the state has maps.
        spares.give_back(Arc::new(Map::default()));
        spares.give_back(Arc::new(Map::default()));
        assert_eq!(spares.len(), 1);
    }

    /// A barrier's vector comes from the recycler, and goes back to it
    /// emptied, with its allocation, when the snapshot drops it: the next
    /// barrier gets the same memory; a second vector taken while the first
    /// is out is a new one, and the recycler keeps no more than two.
    #[test]
    fn a_barrier_vector_goes_back_emptied_and_the_next_barrier_reuses_it() {
        let recycler: Recycler<Arc<u64>> = Recycler::new(128);
        let mut first = recycler.take();
        assert!(first.is_empty() && first.capacity() >= 128);
        let at = first.as_ptr();
        let counted = Arc::new(7u64);
        first.extend((0..128).map(|_| counted.clone()));
        // Taken on the worker, dropped on the snapshot's thread.
        std::thread::spawn(move || drop(first)).join().unwrap();
        assert_eq!(Arc::strong_count(&counted), 1, "the entries were dropped with the snapshot");
        let again = recycler.take();
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), at, "the same allocation");
        let (second, third) = (recycler.take(), recycler.take());
        assert_ne!(second.as_ptr(), at);
        drop((again, second, third));
        assert_eq!(recycler.pool.lock().unwrap().len(), RECYCLED_MOST);
        // A barrier that needs no vector allocates none, and keeps none.
        let none = Recycler::<u64>::none();
        assert_eq!(none.capacity(), 0);
        drop(none);
        assert_eq!(recycler.pool.lock().unwrap().len(), RECYCLED_MOST);
    }
}
