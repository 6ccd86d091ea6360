//! The cached store: live values in a [`CacheStore`] in front of a byte
//! table (fjall with its cache), and the logs its deltas read.

use std::sync::Arc;

use super::logs::{ByteChanges, ChangeLog, ChangedKeys, seal_changes, seal_keys};
use super::{Decoding, Group, Seal, Shared, Store, encoded, freeing, sorted_and_checked};
use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::Result;
use crate::state::StateScope;
use crate::state::StateStats;
use crate::state::cache::{Blind, CacheStore, Stamp, Tracking};
use crate::state::snapshot::{EntryRef, RemovedRef, Snapshot};
use crate::state::spares::Recycler;

/// The cached store of a [`ValueStore`](super::ValueStore).
pub(super) struct CachedStore<K, V> {
    cache: CacheStore<K, V>,
    /// Per owned key group, the keys changed in the cache since the
    /// checkpoints deltas build on, so that a delta looks them up instead
    /// of visiting every cached entry.
    logs: Vec<ChangeLog<K>>,
    /// Per owned key group, the cache's write-backs to the table since
    /// the last complete checkpoint, with the epoch of their change and the
    /// encoded value written (`None`: removed), so that a delta reads
    /// nothing from the table.
    changed: Vec<ByteChanges>,
    /// Where a key passed without its bytes is encoded.
    key_buf: Vec<u8>,
    /// The vectors a barrier hands a delta (logged keys, change maps) and
    /// those of the logs a complete checkpoint holds: reused (see
    /// [`Recycler`]).
    logged: Recycler<Option<Vec<Arc<Vec<K>>>>>,
    changed_lists: Recycler<(usize, Arc<ChangedKeys>)>,
    dropped_keys: Recycler<Arc<Vec<K>>>,
    dropped_changes: Recycler<Arc<ChangedKeys>>,
}

impl<K: Key, V: Data> CachedStore<K, V> {
    pub(super) fn new(cache: CacheStore<K, V>, scope: &StateScope) -> Self {
        let groups = scope.key_groups.len();
        Self {
            cache,
            logs: scope.key_groups.clone().map(|_| ChangeLog::default()).collect(),
            changed: scope.key_groups.clone().map(|_| ByteChanges::default()).collect(),
            key_buf: Vec::new(),
            logged: Recycler::new(groups),
            changed_lists: Recycler::new(groups),
            dropped_keys: Recycler::new(2 * groups),
            dropped_changes: Recycler::new(groups),
        }
    }
}

/// How a change made now in key group `index` is stamped and logged.
fn stamp<'a, K>(
    at: &Shared,
    changed: &'a mut [ByteChanges],
    logs: &'a mut [ChangeLog<K>],
    index: usize,
) -> Stamp<'a, K> {
    Stamp {
        epoch: at.epoch,
        tracking: Tracking { on: at.tracking, changed },
        keys: logs.get_mut(index).filter(|_| at.tracking),
    }
}

impl<K: Key, V: Data> Store<K, V> for CachedStore<K, V> {
    #[inline]
    fn update<R>(
        &mut self,
        at: &Shared,
        group: Group,
        key: K,
        key_bytes: &[u8],
        f: impl FnOnce(&mut Option<V>) -> R,
    ) -> Result<R> {
        let stamp = stamp(at, &mut self.changed, &mut self.logs, group.index);
        let key_bytes = encoded(&key, key_bytes, &mut self.key_buf);
        self.cache.update(group.index, group.id, key, key_bytes, stamp, f)
    }

    fn get(&mut self, _at: &Shared, group: Group, key: &K, key_bytes: &[u8]) -> Result<Option<V>> {
        self.cache.get(group.index, group.id, key, encoded(key, key_bytes, &mut self.key_buf))
    }

    fn for_each_in_group(&mut self, at: &Shared, group: Group, f: impl FnMut(&K, &V)) -> Result<()> {
        let mut decoding = Decoding::new(&at.operator, f);
        let tracking = Tracking { on: at.tracking, changed: &mut self.changed };
        self.cache.scan(group.index, tracking, &mut |k, v| decoding.each::<K, V>(k, v))?;
        decoding.done()
    }

    fn prefetch<'k>(&self, at: &Shared, keys: impl IntoIterator<Item = (u16, &'k K)>)
    where
        K: 'k,
    {
        let mut found = 0usize;
        for (group, key) in keys {
            found += usize::from(self.cache.contains(usize::from(group.wrapping_sub(at.groups.start)), key));
        }
        std::hint::black_box(found);
    }

    fn prefetch_pays(&self) -> bool {
        true
    }

    fn snapshot(&mut self, at: &Shared, seal: Seal) -> Result<Snapshot> {
        let (mut dropped_keys, mut dropped_changes) = match seal.barrier {
            Some(_) => (self.dropped_keys.take(), self.dropped_changes.take()),
            None => (Recycler::none(), Recycler::none()),
        };
        let logged = seal_keys(&mut self.logs, seal, &mut dropped_keys, &self.logged);
        let changes = seal_changes(&mut self.changed, seal, &mut dropped_changes, &self.changed_lists);
        let snapshot = match seal.since {
            None => self.cache.snapshot_base(at.groups.clone())?,
            Some(since) => self.cache.snapshot_delta(since, changes, logged),
        };
        Ok(if dropped_keys.is_empty() && dropped_changes.is_empty() {
            snapshot
        } else {
            freeing(snapshot, (dropped_keys, dropped_changes))
        })
    }

    fn import_part(&mut self, at: &Shared, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        sorted_and_checked::<K, V>(at, entries)?;
        self.cache.import(entries, removed, Tracking { on: at.tracking, changed: &mut self.changed })
    }

    fn stats(&self) -> StateStats {
        self.cache.stats()
    }

    #[cfg(test)]
    fn logged(&self) -> usize {
        self.changed.iter().map(ByteChanges::len).sum()
    }

    fn scan_from(
        &mut self,
        _at: &Shared,
        group: Group,
        from: &[u8],
        limit: usize,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        self.cache.scan_from(group.index, group.id, from, limit, f)
    }

    fn remove_present(&mut self, at: &Shared, group: Group, key: K, key_bytes: &[u8]) -> Result<()> {
        let stamp = stamp(at, &mut self.changed, &mut self.logs, group.index);
        self.cache.blind(group.index, group.id, key, key_bytes, stamp, Blind::Remove)
    }

    fn put_absent(&mut self, at: &Shared, group: Group, key: K, key_bytes: &[u8], value: &V) -> Result<()> {
        let stamp = stamp(at, &mut self.changed, &mut self.logs, group.index);
        self.cache.blind(group.index, group.id, key, key_bytes, stamp, Blind::Put(value.clone()))
    }

    fn put_carried(&mut self, at: &Shared, group: Group, key: K, key_bytes: &[u8], value: V) -> Result<()> {
        self.cache.carried = true;
        let done = self.update(at, group, key, key_bytes, |slot| *slot = Some(value));
        self.cache.carried = false;
        done
    }
}
