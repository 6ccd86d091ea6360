//! Spare maps for copy-on-write.
//!
//! A checkpoint shares a key group's map with the worker; the worker's
//! next write to it copies the map. Copied into fresh memory, a copy costs
//! a page fault per page (the kernel zeroes each page first): half of the
//! copy's time when every key group is written right after each barrier.
//! So an export hands each map it is done with (that the worker has
//! copied since) back, emptied, and the next copy goes into it: its memory
//! is mapped already. Spares are only the maps copied during the last
//! checkpoint, memory a checkpoint needs anyway at its peak.

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

/// Maps exports are done with, shared by a state and its exports: no more
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
    /// any) when an export still shares it.
    #[inline]
    pub(crate) fn make_mut<'a>(&self, map: &'a mut Arc<M>) -> &'a mut M {
        if Arc::get_mut(map).is_none() {
            self.copy(map);
        }
        // Unique now: `make_mut` copies nothing.
        Arc::make_mut(map)
    }

    #[cold]
    #[inline(never)]
    fn copy(&self, map: &mut Arc<M>) {
        // A spare of the same capacity (a copy into another reallocates).
        let spare = {
            let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
            let at = pool.iter().position(|s| s.capacity() == map.capacity());
            match at {
                Some(at) => Some(pool.swap_remove(at)),
                None => pool.pop(),
            }
        };
        let copy = match spare {
            Some(mut spare) => {
                spare.clone_from(map);
                spare
            }
            None => M::clone(map),
        };
        *map = Arc::new(copy);
    }

    /// Takes back a map an export has finished with: kept as a spare,
    /// emptied, if nothing else holds it (the worker has copied it since,
    /// or dropped it) and there is room; otherwise just released.
    pub(crate) fn give_back(&self, map: Arc<M>) {
        if let Ok(mut map) = Arc::try_unwrap(map) {
            if self.pool.lock().unwrap_or_else(PoisonError::into_inner).len() >= self.most {
                return;
            }
            // Emptied here, on the export's thread, not the worker's.
            map.clear();
            let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
            if pool.len() < self.most {
                pool.push(map);
            }
        }
    }

    /// How many spares are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner).len()
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
        // Shared with an export: the write copies, leaving the export's as it was.
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
