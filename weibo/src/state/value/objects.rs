//! The in-memory store: typed values in one map per owned key group,
//! shared with the snapshot being written, each value stamped with the
//! epoch it last changed in (so that an incremental checkpoint finds what
//! changed).

use std::sync::Arc;

use hashbrown::hash_map::Entry;
use rustc_hash::FxBuildHasher;

use super::logs::{ChangeLog, Removals, seal_keys};
use super::{Group, OVERLAY_MIN, PREFETCH_MIN_BYTES, Seal, Shared, Store, codec_error, freeing, key_error};
use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::Result;
use crate::state::snapshot::{EntryRef, RemovedRef, Snapshot, SnapshotPart, flush_part, pass_if_full};
use crate::state::spares::{self, Recycler, Shareable};
use crate::state::{ObjectMap, StateScope, StateStats, flat};

/// A key group's values, each with the epoch it last changed in (a map
/// whose lines a keyed operator loads ahead of its records: see
/// [`ValueStore::prefetch`](super::ValueStore::prefetch)).
pub(super) type StampedMap<K, V> = flat::FlatMap<K, (V, u32)>;

/// Writes to a key group's map while a snapshot still shares it.
///
/// The worker writes a key group whose map a snapshot still shares into
/// this overlay, and flags the key group (`wanted`); the snapshot, on its
/// own thread, copies a flagged map and lets go of it as soon as it sees
/// the flag (before each key group and every 4,096 entries), and encodes
/// the others where they are. So the worker does not copy the map itself
/// (which, with every key group written right after each barrier, meant
/// copying the whole state on the worker at every checkpoint); the next
/// write after the snapshot let go applies the overlay to the map in
/// place. An overlay that outgrows [`OVERLAY_MIN`] plus an eighth of its
/// map (a snapshot slow to start) gives up: the worker copies the map and
/// applies it.
type Overlay<K, V> = ObjectMap<K, (Option<V>, u32)>;

/// Where a tracked change is logged: the key group's removals and its
/// change log.
type Tracked<'a, K> = (&'a mut Removals<K>, &'a mut ChangeLog<K>);

/// The in-memory store of a [`ValueStore`](super::ValueStore).
pub(super) struct ObjectStore<K, V> {
    /// One map per owned key group, by typed key, shared with the
    /// checkpoint being written, if any; the worker writes beside it
    /// meanwhile (see [`Overlay`]).
    maps: Vec<Shareable<StampedMap<K, V>>>,
    /// Per owned key group, writes made while a snapshot still shares the
    /// group's map (it copies each map first thing, then lets go of it),
    /// applied to the map in place once it has; a value, or `None` for a
    /// removal, with its stamp.
    overlays: Vec<Overlay<K, V>>,
    /// Per owned key group: whether the worker has written beside the map
    /// since the last barrier, telling the snapshot to copy the map and let
    /// go of it now rather than when it has encoded it.
    wanted: spares::Wanted,
    /// Maps snapshots are done with, to copy into.
    spares: spares::Spares<StampedMap<K, V>>,
    /// Per owned key group, keys removed since the last complete checkpoint.
    removed: Vec<Removals<K>>,
    /// Per owned key group, the keys changed since the checkpoints deltas
    /// build on, so that a delta looks them up instead of scanning the
    /// whole map.
    logs: Vec<ChangeLog<K>>,
    /// The vectors a barrier hands a delta (logged keys, removals) and
    /// those of the logs a complete checkpoint holds, which the snapshot
    /// frees on its thread: reused, so that the pause allocates none (see
    /// [`Recycler`]).
    logged: Recycler<Option<Vec<Arc<Vec<K>>>>>,
    removed_lists: Recycler<(u16, Arc<Vec<K>>)>,
    dropped_keys: Recycler<Arc<Vec<K>>>,
}

impl<K: Key, V: Data> ObjectStore<K, V> {
    pub(super) fn new(scope: &StateScope) -> Self {
        let groups = scope.key_groups.len();
        Self {
            maps: scope.key_groups.clone().map(|_| Shareable::default()).collect(),
            overlays: scope.key_groups.clone().map(|_| Overlay::default()).collect(),
            wanted: spares::Wanted::new(groups),
            spares: spares::Spares::new(groups),
            removed: scope.key_groups.clone().map(|_| Removals::default()).collect(),
            logs: scope.key_groups.clone().map(|_| ChangeLog::default()).collect(),
            logged: Recycler::new(groups),
            removed_lists: Recycler::new(groups),
            dropped_keys: Recycler::new(2 * groups),
        }
    }

    /// The snapshot of the maps, once the logs are sealed: a base (`since`
    /// is `None`) or a delta, which writes the `removed` keys and then looks
    /// up the `logged` ones (or scans a key group whose log gave up).
    fn snapshot_maps(
        &mut self,
        at: &Shared,
        since: Option<u32>,
        logged: spares::Recycled<Option<Vec<Arc<Vec<K>>>>>,
    ) -> Snapshot {
        let base = since.is_none();
        let mut removed = self.removed_lists.take();
        if !base {
            removed.extend(
                at.groups.clone().zip(&self.removed).flat_map(|(g, r)| r.sealed().map(move |keys| (g, keys.clone()))),
            );
        }
        // Writes an earlier snapshot made wait go into the maps first.
        for (map, overlay) in self.maps.iter_mut().zip(self.overlays.iter_mut()) {
            if !overlay.is_empty() {
                apply_overlay(self.spares.make_mut(map), overlay);
            }
        }
        self.wanted.clear();
        let mut maps = spares::Holding::new(&mut self.maps, &self.spares, &self.wanted);
        let (first, operator) = (at.groups.start, at.operator.clone());
        Box::new(move |sink| {
            // A delta's removals first: a key removed and then set
            // again is in both.
            let mut part = SnapshotPart::new(base);
            for (group, keys) in removed.iter() {
                for k in keys.iter() {
                    part.remove(*group, k)?;
                    pass_if_full(&mut part, sink)?;
                }
            }
            flush_part(&mut part, sink)?;
            for (i, group) in (0..maps.len()).zip(first..) {
                if let (Some(since), Some(Some(segments))) = (since, logged.get(i)) {
                    // The logged keys, each once, as the map holds them.
                    // A few lookups per key group: the maps the worker
                    // has written beside are not copied first (a copy
                    // of every map for 1% of their keys took half the
                    // checkpoint), only every 4,096 keys of a long log.
                    let held = maps.take_alone(i);
                    let mut seen: hashbrown::HashSet<&K, FxBuildHasher> = hashbrown::HashSet::default();
                    let map = held.map();
                    for (n, k) in segments.iter().flat_map(|keys| keys.iter()).enumerate() {
                        if n % 4_096 == 4_095 {
                            maps.release(i);
                        }
                        if !seen.insert(k) {
                            continue;
                        }
                        if let Some((v, stamp)) = map.and_then(|m| m.get(k))
                            && *stamp > since
                        {
                            part.put(group, k, v, &operator)?;
                            pass_if_full(&mut part, sink)?;
                        }
                    }
                    flush_part(&mut part, sink)?;
                    maps.done(held);
                    continue;
                }
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
        })
    }
}

impl<K: Key, V: Data> Store<K, V> for ObjectStore<K, V> {
    #[inline]
    fn update<R>(
        &mut self,
        at: &Shared,
        group: Group,
        key: K,
        _key_bytes: &[u8],
        f: impl FnOnce(&mut Option<V>) -> R,
    ) -> Result<R> {
        let index = group.index;
        let Some(map) = self.maps.get_mut(index) else {
            return Err(crate::error::internal_error!(
                "operator `{}` has no map for key group {}",
                at.operator,
                group.id
            ));
        };
        let epoch = at.epoch;
        if let Some(overlay) = self.overlays.get_mut(index) {
            if map.is_shared() && overlay.len() < OVERLAY_MIN + map.len() / 8 {
                // A snapshot still shares the map: write beside it.
                let tracked = self.removed.get_mut(index).zip(self.logs.get_mut(index)).filter(|_| at.tracking);
                self.wanted.set(index);
                return Ok(overlaid_update(map, overlay, tracked, key, epoch, f));
            }
            if !overlay.is_empty() {
                apply_overlay(self.spares.make_mut(map), overlay);
            }
        }
        let map = self.spares.make_mut(map);
        if !at.tracking {
            // Nothing to log (no checkpoint has started yet): the
            // path every record of a job without checkpoints takes.
            return Ok(match map.entry(key) {
                flat::Entry::Occupied(e) => {
                    let mut result = None;
                    e.replace_entry_with(|_, (value, _)| {
                        let mut slot = Some(value);
                        result = Some(f(&mut slot));
                        slot.map(|v| (v, epoch))
                    });
                    result.ok_or_else(|| crate::error::internal_error!("state update closure was not called"))?
                }
                flat::Entry::Vacant(e) => {
                    let mut slot = None;
                    let r = f(&mut slot);
                    if let Some(value) = slot {
                        e.insert((value, epoch));
                    }
                    r
                }
            });
        }
        let map_len = map.len();
        Ok(match map.entry(key) {
            flat::Entry::Occupied(e) => {
                let mut result = None;
                let mut gone = None;
                let mut first = None;
                e.replace_entry_with(|k, (value, stamp)| {
                    let mut slot = Some(value);
                    result = Some(f(&mut slot));
                    if slot.is_none() {
                        gone = Some(k.clone());
                    } else if stamp != epoch {
                        first = Some(k.clone());
                    }
                    slot.map(|v| (v, epoch))
                });
                if let (Some(k), Some(removed)) = (gone, self.removed.get_mut(index)) {
                    removed.push(k);
                }
                if let (Some(k), Some(log)) = (first, self.logs.get_mut(index)) {
                    log.record(&k, map_len);
                }
                result.ok_or_else(|| crate::error::internal_error!("state update closure was not called"))?
            }
            flat::Entry::Vacant(e) => {
                let mut slot = None;
                let r = f(&mut slot);
                if let Some(value) = slot {
                    if let Some(log) = self.logs.get_mut(index) {
                        log.record(e.key(), map_len);
                    }
                    e.insert((value, epoch));
                }
                r
            }
        })
    }

    fn modify<R>(
        &mut self,
        at: &Shared,
        group: Group,
        key: K,
        key_bytes: &[u8],
        init: impl FnOnce() -> V,
        f: impl FnOnce(&mut V) -> R,
    ) -> Result<R> {
        let index = group.index;
        // Beside a map a snapshot shares, the update's way.
        if self.maps.get(index).is_none_or(|m| m.is_shared()) || self.overlays.get(index).is_some_and(|o| !o.is_empty())
        {
            return self.update(at, group, key, key_bytes, |slot| f(slot.get_or_insert_with(init)));
        }
        let Some(map) = self.maps.get_mut(index) else {
            return Err(crate::error::internal_error!(
                "operator `{}` has no map for key group {}",
                at.operator,
                group.id
            ));
        };
        let epoch = at.epoch;
        let map = self.spares.make_mut(map);
        let map_len = map.len();
        let log = self.logs.get_mut(index).filter(|_| at.tracking);
        Ok(match map.entry(key) {
            flat::Entry::Occupied(mut e) => {
                let (k, (value, stamp)) = e.key_and_value();
                // Logged before `f` runs: a change it leaves half done,
                // unwinding, is still a change.
                if *stamp != epoch {
                    if let Some(log) = log {
                        log.record(k, map_len);
                    }
                    *stamp = epoch;
                }
                f(value)
            }
            flat::Entry::Vacant(e) => {
                if let Some(log) = log {
                    log.record(e.key(), map_len);
                }
                let mut value = init();
                let r = f(&mut value);
                e.insert((value, epoch));
                r
            }
        })
    }

    fn get(&mut self, _at: &Shared, group: Group, key: &K, _key_bytes: &[u8]) -> Result<Option<V>> {
        if let Some((slot, _)) = self.overlays.get(group.index).and_then(|o| o.get(key)) {
            return Ok(slot.clone());
        }
        Ok(self.maps.get(group.index).and_then(|m| m.get(key)).map(|(v, _)| v.clone()))
    }

    fn read<R>(
        &mut self,
        _at: &Shared,
        group: Group,
        key: &K,
        _key_bytes: &[u8],
        f: impl FnOnce(Option<&V>) -> R,
    ) -> Result<R> {
        if let Some((slot, _)) = self.overlays.get(group.index).and_then(|o| o.get(key)) {
            return Ok(f(slot.as_ref()));
        }
        Ok(f(self.maps.get(group.index).and_then(|m| m.get(key)).map(|(v, _)| v)))
    }

    fn for_each_in_group(&mut self, _at: &Shared, group: Group, mut f: impl FnMut(&K, &V)) -> Result<()> {
        let overlay = self.overlays.get(group.index).filter(|o| !o.is_empty());
        for (k, (v, _)) in self.maps.get(group.index).into_iter().flat_map(|m| m.iter()) {
            if !overlay.is_some_and(|o| o.contains_key(k)) {
                f(k, v);
            }
        }
        for (k, (slot, _)) in overlay.into_iter().flat_map(|o| o.iter()) {
            if let Some(v) = slot {
                f(k, v);
            }
        }
        Ok(())
    }

    fn prefetch<'k>(&self, at: &Shared, keys: impl IntoIterator<Item = (u16, &'k K)>)
    where
        K: 'k,
    {
        for (group, key) in keys {
            if let Some(map) = self.maps.get(usize::from(group.wrapping_sub(at.groups.start))) {
                map.prefetch(key);
            }
        }
    }

    fn prefetch_pays(&self) -> bool {
        let room: usize = self.maps.iter().map(|m| m.capacity()).sum();
        room.saturating_mul(size_of::<(K, (V, u32))>()) >= PREFETCH_MIN_BYTES
    }

    fn snapshot(&mut self, at: &Shared, seal: Seal) -> Result<Snapshot> {
        // The logs a complete checkpoint holds are not needed again: they
        // are freed with the snapshot, off the worker.
        let mut dropped = match seal.barrier {
            Some(_) => self.dropped_keys.take(),
            None => Recycler::none(),
        };
        let logged = seal_keys(&mut self.logs, seal, &mut dropped, &self.logged);
        // Removals a complete checkpoint holds are not needed again; the
        // others are kept even when this snapshot is a base, since a base
        // whose checkpoint fails leaves the next delta building on an
        // older complete checkpoint.
        if let Some(barrier) = seal.barrier {
            for r in &mut self.removed {
                r.at_barrier(seal.ending, barrier.completed, &mut dropped);
            }
        }
        let snapshot = self.snapshot_maps(at, seal.since, logged);
        Ok(if dropped.is_empty() { snapshot } else { freeing(snapshot, dropped) })
    }

    fn import_part(&mut self, at: &Shared, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        for &(group, key) in removed {
            let k = crate::codec::key::decode::<K>(key).map_err(|e| key_error(&at.operator, e))?;
            self.update(at, at.owned(group)?, k, key, |slot| *slot = None)?;
        }
        // Room for the part's entries first, in maps still empty (a
        // base's first part): a restore grows them once, not by doubling
        // (5 M keys: restore 2.3 s -> 2.0 s). Not in maps that hold
        // entries: a delta's keys are mostly there already.
        let mut counts = vec![0usize; self.maps.len()];
        for (group, _, _) in entries.iter() {
            if let Some(n) = group.checked_sub(at.groups.start).and_then(|i| counts.get_mut(usize::from(i))) {
                *n += 1;
            }
        }
        for (map, n) in self.maps.iter_mut().zip(counts) {
            if n > 0 && map.is_empty() {
                self.spares.make_mut(map).reserve(n);
            }
        }
        for &mut (group, key, value) in entries {
            let k = crate::codec::key::decode::<K>(key).map_err(|e| key_error(&at.operator, e))?;
            let v = V::decode(value).map_err(|e| codec_error(&at.operator, e))?;
            self.update(at, at.owned(group)?, k, key, |slot| *slot = Some(v))?;
        }
        Ok(())
    }

    fn stats(&self) -> StateStats {
        StateStats::in_memory(self.maps.iter().map(|m| m.len()).sum(), size_of::<(K, (V, u32))>())
    }

    #[cfg(test)]
    fn logged(&self) -> usize {
        self.removed.iter().map(Removals::len).sum()
    }
}

/// Updates `key` in `overlay`, beside `map`, which a snapshot still
/// shares: as [`ObjectStore::update`] does in the map (logging a removal in
/// `removed`, if changes are tracked).
#[cold]
#[inline(never)]
fn overlaid_update<K: Key, V: Data, R>(
    map: &StampedMap<K, V>,
    overlay: &mut Overlay<K, V>,
    tracked: Option<Tracked<'_, K>>,
    key: K,
    epoch: u32,
    f: impl FnOnce(&mut Option<V>) -> R,
) -> R {
    let map_len = map.len();
    match overlay.entry(key) {
        Entry::Occupied(mut e) => {
            let (slot, stamp) = e.get_mut();
            let existed = slot.is_some();
            let r = f(slot);
            let first = std::mem::replace(stamp, epoch) != epoch;
            let present = slot.is_some();
            if let Some((removed, log)) = tracked {
                if existed && !present {
                    removed.push(e.key().clone());
                } else if present && (first || !existed) {
                    // First changed in this epoch, or back after a removal
                    // in it (whose log entry the removal does not replace).
                    log.record(e.key(), map_len);
                }
            }
            r
        }
        Entry::Vacant(e) => {
            let mut slot = map.get(e.key()).map(|(v, _)| v.clone());
            let existed = slot.is_some();
            let r = f(&mut slot);
            if let Some((removed, log)) = tracked {
                if existed && slot.is_none() {
                    removed.push(e.key().clone());
                } else if slot.is_some() {
                    log.record(e.key(), map_len);
                }
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
