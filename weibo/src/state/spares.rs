//! Spare maps for the copies checkpoints make.
//!
//! A checkpoint shares each key group's map with the worker. The snapshot
//! copies a map it shares as soon as the worker writes beside it (see
//! [`Holding`], and `Overlay` in the parent module), or the worker copies
//! it when its overlay has grown too large. Copied into fresh memory, a copy costs a page fault per page (the
//! kernel zeroes each page first): about half of the copy's time. So
//! copies go into maps an earlier snapshot has finished with, emptied, when
//! there are: their memory is mapped already. Spares are no more than the
//! state has key groups, memory a checkpoint needs anyway at its peak.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// A map that can be emptied and copied into, keeping its allocation.
pub(crate) trait SpareMap: Clone {
    fn clear(&mut self);
    /// How many entries it holds without growing: maps of the same
    /// capacity have the same allocation, which a copy reuses.
    fn capacity(&self) -> usize;
}

impl<K: Clone, V: Clone, S: Clone> SpareMap for hashbrown::HashMap<K, V, S> {
    fn clear(&mut self) {
        hashbrown::HashMap::clear(self);
    }

    fn capacity(&self) -> usize {
        hashbrown::HashMap::capacity(self)
    }
}

/// Maps snapshots are done with, shared by a state and its snapshots: no more
/// than the state has maps (key groups).
pub(crate) struct Spares<M> {
    pool: Arc<Mutex<Vec<M>>>,
    most: usize,
}

impl<M> Clone for Spares<M> {
    fn clone(&self) -> Self {
        Self { pool: self.pool.clone(), most: self.most }
    }
}

impl<M: SpareMap> Spares<M> {
    /// Spares for a state of `maps` maps.
    pub(crate) fn new(maps: usize) -> Self {
        Self { pool: Arc::default(), most: maps }
    }

    /// `map`, made this side's own to write: copied (into a spare, if
    /// any) when a snapshot still shares it.
    #[inline]
    pub(crate) fn make_mut<'a>(&self, map: &'a mut Arc<M>) -> &'a mut M {
        // A plain load: the one atomic read-modify-write per call is
        // `make_mut`'s (no `Weak` to these maps is ever made).
        if Arc::strong_count(map) > 1 {
            self.copy(map);
        }
        // Unique now: `make_mut` copies nothing.
        Arc::make_mut(map)
    }

    #[cold]
    #[inline(never)]
    fn copy(&self, map: &mut Arc<M>) {
        // A spare of the same capacity (a copy into another reallocates).
        let spare = self.take(map.capacity());
        let copy = match spare {
            Some(mut spare) => {
                spare.clone_from(map);
                spare
            }
            None => M::clone(map),
        };
        *map = Arc::new(copy);
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
/// copies and lets go of at once, rather than when it has encoded it.
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
/// before each key group and every few thousand entries, which copies each
/// flagged map (into a spare) and lets go of it, so that the worker can
/// apply its overlay in place. The maps nobody flags are encoded where
/// they are and let go of when done: an idle job's checkpoint copies
/// nothing, and the worker copies a map only when its overlay outgrows
/// its cap, or when a snapshot still holds the map at the next barrier.
pub(crate) struct Holding<M> {
    held: Vec<Held<M>>,
    spares: Spares<M>,
    wanted: Wanted,
}

impl<M: SpareMap> Holding<M> {
    /// Shares `maps`; the caller clears `wanted` first.
    pub(crate) fn new(maps: &[Arc<M>], spares: &Spares<M>, wanted: &Wanted) -> Self {
        Self {
            held: maps.iter().map(|m| Held::Shared(m.clone())).collect(),
            spares: spares.clone(),
            wanted: wanted.clone(),
        }
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
        let mut map: Arc<Map> = Arc::new((0..1000).map(|i| (i, i)).collect());
        // Not shared: written in place.
        spares.make_mut(&mut map).insert(1000, 1000);
        let shared = map.clone();
        // Shared with a snapshot: the write copies, leaving the snapshot's as it was.
        spares.make_mut(&mut map).insert(1001, 1001);
        assert_eq!((map.len(), shared.len()), (1002, 1001));
        let spare_at = shared.get(&0).unwrap() as *const u64 as usize;
        spares.give_back(shared);
        assert_eq!(spares.len(), 1, "the export's map, copied since, is a spare");
        let shared = map.clone();
        spares.make_mut(&mut map).insert(1002, 1002);
        assert_eq!(spares.len(), 0, "the copy went into the spare");
        assert_eq!(map.get(&0).unwrap() as *const u64 as usize, spare_at, "its memory reused");
        assert_eq!(*map, (0..1003).map(|i| (i, i)).collect::<Map>());
        assert_eq!(shared.len(), 1002);
        // A map the worker has not copied is still the worker's: no spare.
        let unshared_export = map.clone();
        drop(shared);
        spares.give_back(unshared_export);
        assert_eq!(spares.len(), 0);
        assert_eq!(map.len(), 1003);
        // No more spares than the state has maps.
        spares.give_back(Arc::new(Map::default()));
        spares.give_back(Arc::new(Map::default()));
        assert_eq!(spares.len(), 1);
    }
}
