//! What a store logs for incremental checkpoints: per key group, the keys
//! changed ([`ChangeLog`]), removed ([`Removals`]) or written as bytes
//! ([`ByteChanges`]) since the last complete checkpoint, sealed per epoch.

use std::sync::Arc;

use rustc_hash::FxBuildHasher;

use super::{OVERLAY_MIN, Seal};
use crate::error::Result;
use crate::state::snapshot::Barrier;
use crate::state::spares::{Recycled, Recycler};

/// The keys of one key group's in-memory map changed since a checkpoint,
/// each logged when it first changes in an epoch: a delta of 1% of 5 M
/// keys looks up 50,000 keys instead of scanning 5 M entries (146 ms,
/// most of it memory traffic). It holds every change after checkpoint
/// `since`; when it grows past [`OVERLAY_MIN`] plus a quarter of its map
/// (so many changes that a scan costs little more), it gives up and holds
/// none until the next base snapshot, and deltas scan the map meanwhile.
pub(in crate::state) struct ChangeLog<K> {
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
    pub(in crate::state) fn record(&mut self, key: &K, map_len: usize) {
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
    pub(super) fn at_barrier(
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
pub(in crate::state) struct EpochLog<L> {
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
pub(in crate::state) trait LogLen {
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
    pub(super) fn at_barrier(&mut self, epoch: u32, completed: u64, dropped: &mut Vec<Arc<L>>) {
        if self.current.entries() > 0 {
            self.sealed.push((epoch, Arc::new(std::mem::take(&mut self.current))));
        }
        let kept = self.sealed.iter().position(|(e, _)| u64::from(*e) > completed).unwrap_or(self.sealed.len());
        dropped.extend(self.sealed.drain(..kept).map(|(_, log)| log));
    }

    /// The sealed logs, oldest first (what a delta writes).
    pub(super) fn sealed(&self) -> impl Iterator<Item = &Arc<L>> {
        self.sealed.iter().map(|(_, log)| log)
    }

    /// How many entries it holds (a key logged in two epochs counts twice).
    #[cfg(test)]
    pub(in crate::state) fn len(&self) -> usize {
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

/// Encoded keys changed in one key group: the epoch of their last change
/// and the encoded value it left (`None`: removed).
pub(in crate::state) type ChangedKeys = hashbrown::HashMap<Box<[u8]>, (u32, Option<Box<[u8]>>), FxBuildHasher>;

/// The changes of one key group of a byte store (or the write-backs of
/// the cache in front of one) since the last complete checkpoint. The
/// epoch each change carries may be older than the epoch it is logged in
/// (a cache writes back an entry changed earlier).
pub(in crate::state) type ByteChanges = EpochLog<ChangedKeys>;

impl EpochLog<ChangedKeys> {
    /// Logs a change of `key`: the epoch it was made in and the value it
    /// left (`None`: removed); a later change of the same key in this
    /// epoch replaces an earlier one.
    pub(in crate::state) fn log(&mut self, key: &[u8], change: (u32, Option<Box<[u8]>>)) {
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
pub(in crate::state) fn latest_changes(
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
pub(in crate::state) fn group_changes<'a>(
    changes: &'a [(usize, Arc<ChangedKeys>)],
    at: &mut usize,
    index: usize,
) -> &'a [(usize, Arc<ChangedKeys>)] {
    let rest = changes.get(*at..).unwrap_or_default();
    let len = rest.iter().take_while(|(i, _)| *i == index).count();
    *at += len;
    rest.get(..len).unwrap_or_default()
}

/// At a checkpoint's barrier (`seal.barrier`), seals each key group's
/// change log (see [`ChangeLog::at_barrier`]) into `dropped`, and returns
/// per key group the keys a delta looks up (`None`: it scans), taken from
/// `lists` (a base looks up none, and allocates nothing in the pause).
pub(super) fn seal_keys<K: Clone>(
    logs: &mut [ChangeLog<K>],
    seal: Seal,
    dropped: &mut Vec<Arc<Vec<K>>>,
    lists: &Recycler<Option<Vec<Arc<Vec<K>>>>>,
) -> Recycled<Option<Vec<Arc<Vec<K>>>>> {
    let Some(at) = seal.barrier else { return Recycler::none() };
    let keys = logs.iter_mut().map(|log| {
        if seal.tracking {
            log.at_barrier(seal.ending, at, seal.since, dropped)
        } else {
            log.at_barrier(0, at, None, dropped)
        }
    });
    if seal.since.is_some() {
        let mut logged = lists.take();
        logged.extend(keys);
        logged
    } else {
        // With glibc's allocator, the first allocation of a kilobyte or
        // more after many small frees merges the freed chunks first:
        // milliseconds at the base after a long run on fjall (`bench ckpt`).
        keys.for_each(drop);
        Recycler::none()
    }
}

/// At a checkpoint's barrier, seals each key group's byte changes into
/// `dropped` (see [`EpochLog::at_barrier`]), and for a delta returns the
/// sealed maps it reads (key group index, map; by index), taken from
/// `lists`.
pub(super) fn seal_changes(
    changed: &mut [ByteChanges],
    seal: Seal,
    dropped: &mut Vec<Arc<ChangedKeys>>,
    lists: &Recycler<(usize, Arc<ChangedKeys>)>,
) -> Recycled<(usize, Arc<ChangedKeys>)> {
    let Some(at) = seal.barrier else { return Recycler::none() };
    for c in changed.iter_mut() {
        c.at_barrier(seal.ending, at.completed, dropped);
    }
    if seal.since.is_none() {
        return Recycler::none();
    }
    let mut changes = lists.take();
    changes.extend(changed.iter().enumerate().flat_map(|(i, c)| c.sealed().map(move |m| (i, m.clone()))));
    changes
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
