//! `TimeIndex`: a keyed operator's timers in memory, ordered by time, and
//! shared with a checkpoint's snapshot in chunks.
//!
//! A barrier hands the snapshot every timer as of that moment, and the
//! worker goes on setting, deleting and firing timers while the snapshot
//! is encoded on another thread. Sharing each time's key set (one
//! reference, and one allocation, per time) made the barrier's pause grow
//! with the distinct times: milliseconds with tens of thousands of them (a
//! session window per key, `bench sessions`). Here the times are kept in chunks of at
//! most [`CHUNK_MAX`] times. The barrier moves each chunk the worker owns
//! into an `Arc` and takes one reference per chunk. The worker takes a
//! chunk back the first time it writes into it after that, or copies it
//! (its times' keys with it) if the snapshot still holds it; a chunk it
//! owns it writes without an atomic operation. Session windows and timers
//! set ahead write into the last chunks and fire from the first, and a
//! snapshot lets go of its chunks once encoded (a few milliseconds), so
//! an epoch copies few chunks.
//!
//! A copy costs the keys of the chunk's times: a time with a great many
//! timers (a million keys at midnight) is copied whole when a timer of
//! any time in its chunk changes while a snapshot still holds it, where
//! sharing per time copied it only for a change at that time.

use std::collections::VecDeque;
use std::sync::Arc;

use rustc_hash::FxBuildHasher;

use super::spares::{Recycled, Recycler, Shareable, SpareMap};
use crate::codec::key::Key;
use crate::record::Timestamp;

/// The keys of one time's timers: key → (key group, epoch it was set in).
pub(super) type TimerKeys<K> = hashbrown::HashMap<K, (u16, u32), FxBuildHasher>;

/// Times in a chunk, at most (a chunk splits in two above; few in tests,
/// so that they split and share often).
#[cfg(not(test))]
const CHUNK_MAX: usize = 64;
#[cfg(test)]
const CHUNK_MAX: usize = 2;

/// Emptied key sets the index keeps for new times: a timer at a time of
/// its own (a session window's, one per event) would otherwise allocate a
/// set and free it.
const SPARE_TIMES: usize = 64;

/// Consecutive times, in order, each with its (non-empty) key set.
pub(super) type Chunk<K> = VecDeque<(Timestamp, TimerKeys<K>)>;

impl<T: Clone> SpareMap for VecDeque<T> {
    fn empty() -> Self {
        VecDeque::new()
    }

    fn clear(&mut self) {
        VecDeque::clear(self);
    }

    fn capacity(&self) -> usize {
        VecDeque::capacity(self)
    }
}

/// Timers by time (see the module documentation).
///
/// Invariants: every chunk is non-empty and in order, the chunks are in
/// order and do not overlap, `starts[i]` is the first time of
/// `chunks[i]`, and every time's key set is non-empty.
pub(super) struct TimeIndex<K> {
    /// The first time of each chunk: a time's chunk is found without
    /// reading the chunks.
    starts: VecDeque<Timestamp>,
    /// The worker's own chunks are written without an atomic operation;
    /// shared ones are taken back, or copied, on the first write.
    chunks: VecDeque<Shareable<Chunk<K>>>,
    /// Emptied key sets, their memory kept.
    spare: Vec<TimerKeys<K>>,
    /// The vectors of chunks snapshots hold, back from the snapshots done
    /// with them: the barrier allocates none but the chunks' `Arc`s (see
    /// [`Recycler`]).
    held: Recycler<Arc<Chunk<K>>>,
}

impl<K> Default for TimeIndex<K> {
    fn default() -> Self {
        Self { starts: VecDeque::new(), chunks: VecDeque::new(), spare: Vec::new(), held: Recycler::new(0) }
    }
}

impl<K: Key> TimeIndex<K> {
    /// The chunk `time` is in, or would go in: the last one starting at or
    /// before it, or the first.
    #[inline]
    fn chunk_of(&self, time: Timestamp) -> usize {
        self.starts.partition_point(|&start| start <= time).saturating_sub(1)
    }

    /// The keys of `time`'s timers, if it has any.
    #[cfg(test)]
    pub(super) fn keys(&self, time: Timestamp) -> Option<&TimerKeys<K>> {
        let chunk = self.chunks.get(self.chunk_of(time))?;
        let i = chunk.binary_search_by_key(&time, |(t, _)| *t).ok()?;
        chunk.get(i).map(|(_, keys)| keys)
    }

    /// Sets a timer for `key` at `time` with `value` (its key group and
    /// epoch), unless there is one: whether it was set.
    #[inline]
    pub(super) fn insert(&mut self, time: Timestamp, key: &K, value: (u16, u32)) -> bool {
        if self.chunks.is_empty() {
            self.starts.push_back(time);
            self.chunks.push_back(Shareable::Own(VecDeque::with_capacity(CHUNK_MAX + 1)));
        }
        let c = self.chunk_of(time);
        let Some(chunk) = self.chunks.get_mut(c) else { return false };
        // Read first: a timer that is set already copies nothing.
        let at = chunk.binary_search_by_key(&time, |(t, _)| *t);
        if let Ok(i) = at
            && chunk.get(i).is_some_and(|(_, keys)| keys.contains_key(key))
        {
            return false;
        }
        let chunk = chunk.make_mut();
        match at {
            Ok(i) => {
                if let Some((_, keys)) = chunk.get_mut(i) {
                    keys.insert(key.clone(), value);
                }
            }
            Err(i) => {
                let mut keys = self.spare.pop().unwrap_or_default();
                keys.insert(key.clone(), value);
                chunk.insert(i, (time, keys));
                if i == 0
                    && let Some(start) = self.starts.get_mut(c)
                {
                    *start = time;
                }
                if chunk.len() > CHUNK_MAX {
                    // Times set in order (the common case) fill a new last
                    // chunk; others split the chunk in halves.
                    let at_end = c + 1 == self.starts.len() && i + 1 == chunk.len();
                    let mut next = VecDeque::with_capacity(CHUNK_MAX + 1);
                    next.extend(chunk.drain(if at_end { chunk.len() - 1 } else { chunk.len() / 2 }..));
                    if let Some(&(first, _)) = next.front() {
                        self.starts.insert(c + 1, first);
                        self.chunks.insert(c + 1, Shareable::Own(next));
                    }
                }
            }
        }
        true
    }

    /// Deletes the timer for `key` at `time`: its value, if it was set.
    pub(super) fn remove(&mut self, time: Timestamp, key: &K) -> Option<(u16, u32)> {
        let c = self.chunk_of(time);
        let chunk = self.chunks.get_mut(c)?;
        let i = chunk.binary_search_by_key(&time, |(t, _)| *t).ok()?;
        // Read first: deleting a timer that is not set copies nothing.
        if !chunk.get(i).is_some_and(|(_, keys)| keys.contains_key(key)) {
            return None;
        }
        let chunk = chunk.make_mut();
        let (_, keys) = chunk.get_mut(i)?;
        let value = keys.remove(key);
        if keys.is_empty() {
            if let Some((_, emptied)) = chunk.remove(i) {
                keep_spare(&mut self.spare, emptied);
            }
            match chunk.front() {
                None => {
                    self.chunks.remove(c);
                    self.starts.remove(c);
                }
                Some(&(first, _)) => {
                    if let Some(start) = self.starts.get_mut(c) {
                        *start = first;
                    }
                }
            }
        }
        value
    }

    /// The earliest time any timer is set for.
    #[inline]
    pub(super) fn first_time(&self) -> Option<Timestamp> {
        self.starts.front().copied()
    }

    /// Takes the earliest time and its keys out, if that time is at or
    /// below `watermark`. The keys go back with [`TimeIndex::recycle`]
    /// once read.
    pub(super) fn pop_due(&mut self, watermark: Timestamp) -> Option<(Timestamp, TimerKeys<K>)> {
        if *self.starts.front()? > watermark {
            return None;
        }
        let chunk = self.chunks.front_mut()?.make_mut();
        let due = chunk.pop_front();
        match chunk.front() {
            None => {
                self.chunks.pop_front();
                self.starts.pop_front();
            }
            Some(&(first, _)) => {
                if let Some(start) = self.starts.front_mut() {
                    *start = first;
                }
            }
        }
        due
    }

    /// A key set [`TimeIndex::pop_due`] took out, read: kept, emptied,
    /// for a new time.
    pub(super) fn recycle(&mut self, keys: TimerKeys<K>) {
        keep_spare(&mut self.spare, keys);
    }

    /// Every chunk, for a snapshot to hold: one reference each (a chunk
    /// the worker owns moves into an `Arc`, which is all the barrier
    /// allocates).
    pub(super) fn share(&mut self) -> Recycled<Arc<Chunk<K>>> {
        let mut held = self.held.take();
        if held.capacity() < self.chunks.len() {
            // Room to grow into: the next barriers allocate nothing.
            held.reserve(2 * self.chunks.len());
        }
        held.extend(self.chunks.iter_mut().map(Shareable::share));
        held
    }

    /// Every time with its keys, in order.
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (Timestamp, &TimerKeys<K>)> + '_ {
        self.chunks.iter().flat_map(|chunk| chunk.iter().map(|(time, keys)| (*time, keys)))
    }
}

/// Keeps `keys`, emptied, among `spare` if there is room (its table's
/// memory is kept).
fn keep_spare<K>(spare: &mut Vec<TimerKeys<K>>, mut keys: TimerKeys<K>) {
    if spare.len() < SPARE_TIMES {
        keys.clear();
        spare.push(keys);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The invariants the index keeps (see [`TimeIndex`]).
    fn check(index: &TimeIndex<u8>) {
        assert_eq!(index.starts.len(), index.chunks.len());
        let mut last = None;
        for (start, chunk) in index.starts.iter().zip(&index.chunks) {
            assert!(!chunk.is_empty() && chunk.len() <= CHUNK_MAX);
            assert_eq!(Some(*start), chunk.front().map(|(t, _)| *t));
            for (time, keys) in chunk.iter() {
                assert!(last < Some(*time), "times in order");
                assert!(!keys.is_empty());
                last = Some(*time);
            }
        }
    }

    #[test]
    fn a_snapshot_keeps_the_timers_of_its_moment_while_the_index_changes() {
        let mut index = TimeIndex::<u8>::default();
        for time in [50, 10, 30, 20, 40, 60, 70] {
            assert!(index.insert(time, &1, (0, 1)));
            check(&index);
        }
        assert!(!index.insert(30, &1, (0, 2)), "set already");
        let held = index.share();
        let before: Vec<(Timestamp, Vec<u8>)> =
            held.iter().flat_map(|c| c.iter().map(|(t, k)| (*t, k.keys().copied().collect()))).collect();
        // Writes beside the snapshot: a key into a shared time, a new time
        // in the middle, a deletion, and firing the first chunk.
        assert!(index.insert(30, &2, (0, 2)));
        assert!(index.insert(25, &3, (0, 2)));
        assert_eq!(index.remove(60, &1), Some((0, 1)));
        assert_eq!(index.remove(60, &1), None);
        let (time, keys) = index.pop_due(10).unwrap();
        assert_eq!((time, keys.len()), (10, 1));
        index.recycle(keys);
        assert!(index.pop_due(19).is_none());
        check(&index);
        let after: Vec<(Timestamp, Vec<u8>)> =
            held.iter().flat_map(|c| c.iter().map(|(t, k)| (*t, k.keys().copied().collect()))).collect();
        assert_eq!(before, after, "the snapshot's timers did not change");
        assert_eq!(before.iter().map(|(t, _)| *t).collect::<Vec<_>>(), [10, 20, 30, 40, 50, 60, 70]);
        let now: Vec<(Timestamp, usize)> = index.iter().map(|(t, k)| (t, k.len())).collect();
        assert_eq!(now, [(20, 1), (25, 1), (30, 2), (40, 1), (50, 1), (70, 1)]);
        assert_eq!(index.first_time(), Some(20));
        assert!(index.keys(25).is_some_and(|k| k.contains_key(&3)));
        assert!(index.keys(60).is_none());
    }

    #[test]
    fn emptied_times_and_chunks_leave_the_index() {
        let mut index = TimeIndex::<u8>::default();
        for time in 0..20 {
            index.insert(time, &(time as u8), (0, 0));
        }
        check(&index);
        for time in (0..20).rev().step_by(2) {
            assert!(index.remove(time, &(time as u8)).is_some());
            check(&index);
        }
        while let Some((_, keys)) = index.pop_due(i64::MAX) {
            index.recycle(keys);
            check(&index);
        }
        assert!(index.chunks.is_empty() && index.starts.is_empty() && index.first_time().is_none());
        assert!(!index.spare.is_empty() && index.spare.iter().all(|k| k.is_empty()));
    }
}
