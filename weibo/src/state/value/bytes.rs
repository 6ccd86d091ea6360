//! The byte store: encoded values in a table alone (fjall without a
//! cache, and states read in key order), every change logged with its
//! encoded value for the next delta.

use std::marker::PhantomData;
use std::sync::Arc;

use super::logs::{ByteChanges, ChangedKeys, group_changes, latest_changes, seal_changes};
use super::{Decoding, Group, Seal, Shared, Store, codec_error, encoded, freeing, sorted_and_checked};
use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::Result;
use crate::state::snapshot::{EntryRef, RemovedRef, Snapshot, SnapshotPart, flush_part, pass_if_full};
use crate::state::spares::Recycler;
use crate::state::{StateScope, StateStats, StateTable};

/// The byte store of a [`ValueStore`](super::ValueStore).
pub(super) struct ByteStore<K, V> {
    table: Box<dyn StateTable>,
    /// Where a value is encoded.
    buf: Vec<u8>,
    /// Where a key passed without its bytes is encoded.
    key_buf: Vec<u8>,
    /// Per owned key group, keys written or removed since the last
    /// complete checkpoint, with the epoch of their last change and the
    /// encoded value written (`None`: removed), so a delta needs no reads
    /// from the table. Sealed per epoch and shared with the checkpoints
    /// being taken, so the barrier neither copies nor frees keys.
    changed: Vec<ByteChanges>,
    /// The vectors a barrier hands a delta and those of the logs a
    /// complete checkpoint holds: reused (see [`Recycler`]).
    changed_lists: Recycler<(usize, Arc<ChangedKeys>)>,
    dropped_changes: Recycler<Arc<ChangedKeys>>,
    values: PhantomData<fn() -> (K, V)>,
}

impl<K: Key, V: Data> ByteStore<K, V> {
    pub(super) fn new(table: Box<dyn StateTable>, scope: &StateScope) -> Self {
        let groups = scope.key_groups.len();
        Self {
            table,
            buf: Vec::new(),
            key_buf: Vec::new(),
            changed: scope.key_groups.clone().map(|_| ByteChanges::default()).collect(),
            changed_lists: Recycler::new(groups),
            dropped_changes: Recycler::new(groups),
            values: PhantomData,
        }
    }

    /// Logs a change of `key_bytes` in `group`, for incremental
    /// checkpoints: its value as written, `None` for a removal; a later
    /// change of the same key replaces an earlier one.
    fn log(&mut self, at: &Shared, group: Group, key_bytes: &[u8], written: Option<&[u8]>) {
        if !at.tracking {
            return;
        }
        if let Some(changed) = self.changed.get_mut(group.index) {
            changed.log(key_bytes, (at.epoch, written.map(Box::from)));
        }
    }
}

impl<K: Key, V: Data> Store<K, V> for ByteStore<K, V> {
    fn update<R>(
        &mut self,
        at: &Shared,
        group: Group,
        key: K,
        key_bytes: &[u8],
        f: impl FnOnce(&mut Option<V>) -> R,
    ) -> Result<R> {
        let key_bytes = encoded(&key, key_bytes, &mut self.key_buf);
        let mut slot = match self.table.get(group.id, key_bytes)? {
            Some(bytes) => Some(V::decode(&bytes).map_err(|e| codec_error(&at.operator, e))?),
            None => None,
        };
        let existed = slot.is_some();
        let r = f(&mut slot);
        let written = match slot {
            Some(v) => {
                self.buf.clear();
                v.encode(&mut self.buf).map_err(|e| codec_error(&at.operator, e))?;
                self.table.put(group.id, key_bytes, &self.buf)?;
                true
            }
            None if existed => {
                self.table.delete(group.id, key_bytes)?;
                false
            }
            // Absent before and after: nothing changed.
            None => return Ok(r),
        };
        if at.tracking
            && let Some(changed) = self.changed.get_mut(group.index)
        {
            changed.log(key_bytes, (at.epoch, written.then(|| Box::from(self.buf.as_slice()))));
        }
        Ok(r)
    }

    fn get(&mut self, at: &Shared, group: Group, key: &K, key_bytes: &[u8]) -> Result<Option<V>> {
        match self.table.get(group.id, encoded(key, key_bytes, &mut self.key_buf))? {
            Some(bytes) => V::decode(&bytes).map(Some).map_err(|e| codec_error(&at.operator, e)),
            None => Ok(None),
        }
    }

    fn for_each_in_group(&mut self, at: &Shared, group: Group, f: impl FnMut(&K, &V)) -> Result<()> {
        let mut decoding = Decoding::new(&at.operator, f);
        self.table.scan_group(group.id, &mut |k, v| decoding.each::<K, V>(k, v))?;
        decoding.done()
    }

    fn prefetch<'k>(&self, _at: &Shared, _keys: impl IntoIterator<Item = (u16, &'k K)>)
    where
        K: 'k,
    {
    }

    fn prefetch_pays(&self) -> bool {
        false
    }

    fn snapshot(&mut self, at: &Shared, seal: Seal) -> Result<Snapshot> {
        let mut dropped = match seal.barrier {
            Some(_) => self.dropped_changes.take(),
            None => Recycler::none(),
        };
        let changes = seal_changes(&mut self.changed, seal, &mut dropped, &self.changed_lists);
        let snapshot: Snapshot = match seal.since {
            None => self.table.snapshot_deferred(at.groups.clone())?,
            Some(since) => {
                let groups = at.groups.clone();
                Box::new(move |sink| {
                    // A key is either written or removed: one part per key group.
                    let mut out = SnapshotPart::new(false);
                    let mut at = 0;
                    for (index, group) in groups.enumerate() {
                        latest_changes(group_changes(&changes, &mut at, index), since, |_, key, value| {
                            match value {
                                Some(value) => out.part.push(group, key, value)?,
                                None => out.part.push_removed(group, key)?,
                            }
                            pass_if_full(&mut out, sink)
                        })?;
                        flush_part(&mut out, sink)?;
                    }
                    Ok(false)
                })
            }
        };
        Ok(if dropped.is_empty() { snapshot } else { freeing(snapshot, dropped) })
    }

    fn import_part(&mut self, at: &Shared, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        sorted_and_checked::<K, V>(at, entries)?;
        if !removed.is_empty() {
            self.table.apply(removed.iter().map(|(g, k)| (*g, k.to_vec(), None)).collect())?;
        }
        self.table.put_all(entries)
    }

    fn stats(&self) -> StateStats {
        match self.table.entries_in_memory() {
            // Each entry: its key's and value's bytes, in two vectors.
            Some(n) => StateStats::in_memory(usize::try_from(n).unwrap_or(usize::MAX), size_of::<(Vec<u8>, Vec<u8>)>()),
            None => StateStats { table: self.table.size(), ..StateStats::default() },
        }
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
        _limit: usize,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        self.table.scan_from(group.id, from, f)
    }

    fn remove_present(&mut self, at: &Shared, group: Group, _key: K, key_bytes: &[u8]) -> Result<()> {
        self.table.delete(group.id, key_bytes)?;
        self.log(at, group, key_bytes, None);
        Ok(())
    }

    fn put_absent(&mut self, at: &Shared, group: Group, _key: K, key_bytes: &[u8], value: &V) -> Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let written = value.encode(&mut buf).map_err(|e| codec_error(&at.operator, e));
        let written = written.and_then(|()| self.table.put(group.id, key_bytes, &buf));
        if written.is_ok() {
            self.log(at, group, key_bytes, Some(&buf));
        }
        self.buf = buf;
        written
    }
}
