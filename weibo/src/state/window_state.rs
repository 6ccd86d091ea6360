//! `WindowState`: accumulators per key and window.

use super::*;

impl<K: Key, A: Data> WindowState<K, A> {
    /// Every accumulator, for a checkpoint: key = encoded key ++ window start.
    ///
    /// # Errors
    /// As [`ValueState::update`].
    pub fn export(&mut self, operator: &str) -> Result<Entries> {
        Ok(gather(self.snapshot_deferred(operator)?)?.entries)
    }

    /// The state as of now, to encode later (see
    /// [`ValueState::snapshot_deferred`]): the in-memory store shares each
    /// window's map and copies it when next written.
    ///
    /// # Errors
    /// As [`ValueState::update`].
    pub fn snapshot_deferred(&mut self, operator: &str) -> Result<Snapshot> {
        self.snapshot_at(operator, None)
    }

    /// The state at barrier `checkpoint`, to encode later: all of it (a
    /// base), or what changed since checkpoint `since`, the last complete
    /// one (a delta), chosen as for value state (see
    /// [`ValueState::snapshot_changes`]), except that in memory a base is
    /// also written once the accumulators removed and not yet in a complete
    /// checkpoint outnumber both those the windows hold and 65,536 (the log
    /// of removals is then dropped).
    ///
    /// # Errors
    /// As [`ValueState::update`].
    pub fn snapshot_changes(
        &mut self,
        operator: &str,
        checkpoint: CheckpointId,
        since: CheckpointId,
    ) -> Result<Snapshot> {
        self.snapshot_at(operator, Some((checkpoint.get(), since.get())))
    }

    fn snapshot_at(&mut self, operator: &str, at: Option<(u64, u64)>) -> Result<Snapshot> {
        let (windows, log) = match &mut self.store {
            WindowStore::Objects { windows, log, .. } => (windows, log),
            WindowStore::Bytes { values, .. } => {
                return match at {
                    Some((n, since)) => values.snapshot_changes(CheckpointId::new(n), CheckpointId::new(since)),
                    None => values.snapshot_deferred(),
                };
            }
        };
        let since = delta_since(at, log.first_base, log.since_full);
        let mut purged = Vec::new();
        let mut removed = Vec::new();
        if let Some((n, completed)) = at {
            log.first_base.get_or_insert(n);
            log.since_full = if since.is_some() { log.since_full + 1 } else { 1 };
            log.epoch = (n + 1) as u32;
            // Removals a complete checkpoint holds are not needed again.
            let pending = |e: u32| u64::from(e) > completed;
            log.purged.retain(|(e, _, _)| pending(*e));
            log.removed.retain(|(e, _, _, _)| pending(*e));
            log.removed_len = log.purged.iter().map(|(_, _, m)| m.len()).sum::<usize>() + log.removed.len();
            if since.is_some() {
                purged = log.purged.iter().map(|(_, start, map)| (*start, map.clone())).collect();
                removed = log.removed.iter().map(|(_, g, start, k)| (*g, *start, k.clone())).collect();
            }
        }
        let shared: Vec<(Timestamp, Arc<WindowMap<K, A>>)> = windows.iter_mut().map(|(s, m)| (*s, m.share())).collect();
        let operator = operator.to_string();
        let base = since.is_none();
        let key_of = |k: &K, start: Timestamp, out: &mut Vec<u8>| {
            k.encode_key(out);
            start.encode_key(out);
        };
        Ok(Box::new(move |sink| {
            // A delta's removals first: a window purged and opened again
            // (late records) has its new accumulators among the entries.
            let mut part = SnapshotPart::new(base);
            for (start, map) in &purged {
                for (k, (group, _, _)) in map.iter() {
                    key_of(k, *start, &mut part.part.removed);
                    part.part.end_removed(*group)?;
                    pass_if_full(&mut part, sink)?;
                }
            }
            for (group, start, k) in &removed {
                key_of(k, *start, &mut part.part.removed);
                part.part.end_removed(*group)?;
                pass_if_full(&mut part, sink)?;
            }
            flush_part(&mut part, sink)?;
            // Parts of one window each (of many key groups).
            for (start, map) in shared {
                for (k, (group, acc, stamp)) in map.iter() {
                    if since.is_some_and(|s| *stamp <= s) {
                        continue;
                    }
                    key_of(k, start, &mut part.part.keys);
                    acc.encode(&mut part.part.values).map_err(|e| codec_error(&operator, e))?;
                    part.part.end_entry(*group)?;
                    pass_if_full(&mut part, sink)?;
                }
                flush_part(&mut part, sink)?;
            }
            Ok(base)
        }))
    }

    /// Loads accumulators from a checkpoint.
    ///
    /// # Errors
    /// [`Error::State`] or [`Error::Codec`] for entries that do not decode.
    pub fn import(&mut self, entries: Entries, operator: &str) -> Result<()> {
        self.import_part(&entry_refs(&entries), &[], operator)
    }

    /// Loads a part of a checkpoint: removes `removed`, then sets `entries`
    /// (see [`ValueState::import_part`]).
    ///
    /// # Errors
    /// As [`WindowState::import`].
    pub fn import_part(&mut self, entries: &[EntryRef<'_>], removed: &[RemovedRef<'_>], operator: &str) -> Result<()> {
        for &(group, key) in removed {
            let (k, start) = crate::codec::key::decode::<(K, Timestamp)>(key).map_err(|e| key_error(operator, e))?;
            let key_len = key.len().saturating_sub(8);
            self.update(start, group, k, key.get(..key_len).unwrap_or_default(), |slot| *slot = None)?;
        }
        for &(group, key, value) in entries {
            let (k, start) = crate::codec::key::decode::<(K, Timestamp)>(key).map_err(|e| key_error(operator, e))?;
            let acc = A::decode(value).map_err(|e| codec_error(operator, e))?;
            let key_len = key.len().saturating_sub(8);
            self.update(start, group, k, key.get(..key_len).unwrap_or_default(), |slot| *slot = Some(acc))?;
        }
        Ok(())
    }
}
/// One window's accumulators in memory: key → (key group, accumulator,
/// epoch of its last change).
pub(super) type WindowMap<K, A> = hashbrown::HashMap<K, (u16, A, u32), FxBuildHasher>;

/// A window purged: the epoch, its start, and its accumulators (whose keys
/// deltas remove).
pub(super) type PurgedWindow<K, A> = (u32, Timestamp, Arc<WindowMap<K, A>>);

/// What incremental checkpoints of in-memory windows need: the epoch
/// changes are stamped with, which checkpoint a delta may build on, and
/// what was removed since the last complete checkpoint (whole windows
/// purged, single accumulators removed), each with its epoch.
pub(super) struct WindowLog<K, A> {
    epoch: u32,
    since_full: u32,
    /// The first base exported since the log was last dropped: a delta
    /// needs a complete checkpoint at or after it. `None`: the next snapshot
    /// is a base, and nothing needs logging until then.
    first_base: Option<u64>,
    purged: Vec<PurgedWindow<K, A>>,
    removed: Vec<(u32, u16, Timestamp, K)>,
    /// Accumulators in `purged` and `removed`.
    removed_len: usize,
    /// Accumulators in the open windows.
    live: usize,
}

impl<K, A> Default for WindowLog<K, A> {
    fn default() -> Self {
        Self {
            epoch: 0,
            since_full: 0,
            first_base: None,
            purged: Vec::new(),
            removed: Vec::new(),
            removed_len: 0,
            live: 0,
        }
    }
}

impl<K, A> WindowLog<K, A> {
    /// Whether removals are logged: once a base has been exported.
    fn logging(&self) -> bool {
        self.first_base.is_some()
    }

    /// `n` more accumulators removed. When the log holds more than the
    /// windows do, a delta would outweigh a base: the log is dropped and
    /// the next snapshot is a base (windows that fire soon after they open,
    /// like short tumbling windows, are written whole).
    fn grew(&mut self, n: usize) {
        self.removed_len += n;
        if self.removed_len > self.live.max(WINDOW_LOG_MIN) {
            self.first_base = None;
            self.purged.clear();
            self.removed.clear();
            self.removed_len = 0;
        }
    }
}

/// Removals a window log holds before it may give up on deltas (few in
/// tests, so that they give up often).
#[cfg(not(test))]
pub(super) const WINDOW_LOG_MIN: usize = SNAPSHOT_PART;
#[cfg(test)]
pub(super) const WINDOW_LOG_MIN: usize = 4;

/// Emptied key sets a byte window store keeps for new windows.
const SPARE_KEY_SETS: usize = 8;

pub(super) enum WindowStore<K, A> {
    /// Window-major in memory: per window start, the keys' accumulators.
    /// Each window's map is shared with the checkpoint being written, if
    /// any, and copied on the first write after it.
    Objects {
        windows: BTreeMap<Timestamp, Shareable<WindowMap<K, A>>>,
        pool: Vec<WindowMap<K, A>>,
        log: WindowLog<K, A>,
    },
    /// Accumulators in a byte table by (key, window start), with an index of
    /// which keys each window holds.
    /// `spare`: emptied key sets of fired windows, for new windows to
    /// fill (a window's set grows to all its keys, and growing one from
    /// empty for every window rehashes it over and over).
    Bytes {
        values: ValueState<(K, Timestamp), A>,
        index: BTreeMap<Timestamp, DueKeys<K>>,
        spare: Vec<DueKeys<K>>,
        buf: Vec<u8>,
    },
}

/// Accumulators of fixed-size (tumbling, sliding) windows, per window start
/// and key. Windows of one size fire in start order, so the window index is
/// also the timer index: no timer is stored per (key, window).
pub struct WindowState<K, A> {
    store: WindowStore<K, A>,
}

impl<K, A> fmt::Debug for WindowState<K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowState").finish_non_exhaustive()
    }
}

impl<K: Key, A: Data> WindowState<K, A> {
    /// What it holds now (for metrics): its open windows' accumulators.
    pub(crate) fn stats(&self) -> super::StateStats {
        match &self.store {
            WindowStore::Objects { windows, .. } => super::StateStats::in_memory(
                windows.values().map(|w| w.len()).sum(),
                std::mem::size_of::<(K, (u16, A, u32))>(),
            ),
            WindowStore::Bytes { values, .. } => values.stats(),
        }
    }

    /// Opens the window state `scope` names on `backend`.
    ///
    /// # Errors
    /// [`Error::State`] when the backend cannot open it.
    pub fn open(backend: &dyn StateBackend, scope: &StateScope) -> Result<Self> {
        let store = if backend.keeps_objects() {
            WindowStore::Objects { windows: BTreeMap::new(), pool: Vec::new(), log: WindowLog::default() }
        } else {
            WindowStore::Bytes {
                values: ValueState::open(backend, scope)?,
                index: BTreeMap::new(),
                spare: Vec::new(),
                buf: Vec::new(),
            }
        };
        Ok(Self { store })
    }

    /// Reads and changes the accumulator of `key` (encoded: `key_bytes`,
    /// of key group `group`) in the window starting at `start`; `None` left
    /// behind removes it.
    ///
    /// # Errors
    /// As [`ValueState::update`].
    #[inline]
    pub fn update<R>(
        &mut self,
        start: Timestamp,
        group: u16,
        key: K,
        key_bytes: &[u8],
        f: impl FnOnce(&mut Option<A>) -> R,
    ) -> Result<R> {
        match &mut self.store {
            WindowStore::Objects { windows, pool, log } => {
                let map = windows.entry(start).or_insert_with(|| Shareable::Own(pool.pop().unwrap_or_default()));
                let epoch = log.epoch;
                Ok(match map.make_mut().entry(key) {
                    Entry::Occupied(e) => {
                        let mut result = None;
                        let mut gone = None;
                        let _ = e.replace_entry_with(|k, (g, value, _)| {
                            let mut slot = Some(value);
                            result = Some(f(&mut slot));
                            if slot.is_none() {
                                gone = Some((g, k.clone()));
                            }
                            slot.map(|v| (g, v, epoch))
                        });
                        if let Some((g, k)) = gone {
                            log.live = log.live.saturating_sub(1);
                            if log.logging() {
                                log.removed.push((epoch, g, start, k));
                                log.grew(1);
                            }
                        }
                        result.ok_or_else(|| Error::Internal("window update closure was not called".into()))?
                    }
                    Entry::Vacant(e) => {
                        let mut slot = None;
                        let r = f(&mut slot);
                        if let Some(value) = slot {
                            e.insert((group, value, epoch));
                            log.live += 1;
                        }
                        r
                    }
                })
            }
            WindowStore::Bytes { values, index, spare, buf } => {
                buf.clear();
                buf.extend_from_slice(key_bytes);
                start.encode_key(buf);
                let k = key.clone();
                let (r, present) = values.update(group, (key, start), buf, |slot| {
                    let r = f(slot);
                    (r, slot.is_some())
                })?;
                if present {
                    index.entry(start).or_insert_with(|| spare.pop().unwrap_or_default()).insert(k, group);
                } else if let Some(keys) = index.get_mut(&start) {
                    keys.remove(&k);
                }
                Ok(r)
            }
        }
    }

    /// The start of the earliest window holding anything.
    #[inline]
    pub fn first_window(&self) -> Option<Timestamp> {
        match &self.store {
            WindowStore::Objects { windows, .. } => windows.first_key_value().map(|(s, _)| *s),
            WindowStore::Bytes { index, .. } => index.first_key_value().map(|(s, _)| *s),
        }
    }

    /// The starts of the windows holding anything, from `from` on, in order.
    pub fn windows_from(&self, from: Timestamp) -> Vec<Timestamp> {
        match &self.store {
            WindowStore::Objects { windows, .. } => windows.range(from..).map(|(s, _)| *s).collect(),
            WindowStore::Bytes { index, .. } => index.range(from..).map(|(s, _)| *s).collect(),
        }
    }

    /// Calls `f` with every key, key group and accumulator of the window
    /// starting at `start`; with `purge`, removes the window.
    ///
    /// # Errors
    /// As [`ValueState::update`].
    pub fn for_each_in_window(&mut self, start: Timestamp, purge: bool, mut f: impl FnMut(&K, u16, &A)) -> Result<()> {
        match &mut self.store {
            WindowStore::Objects { windows, pool, log } => {
                if purge {
                    if let Some(map) = windows.remove(&start) {
                        for (k, (g, a, _)) in map.iter() {
                            f(k, *g, a);
                        }
                        log.live = log.live.saturating_sub(map.len());
                        if log.logging() && !map.is_empty() {
                            // Its keys are removed in the next deltas.
                            let n = map.len();
                            log.purged.push((log.epoch, start, map.into_shared()));
                            log.grew(n);
                        } else if let Some(mut map) = map.into_owned() {
                            // Reuse the map unless a checkpoint still reads it.
                            map.clear();
                            pool.push(map);
                        }
                    }
                } else if let Some(map) = windows.get(&start) {
                    for (k, (g, a, _)) in map.iter() {
                        f(k, *g, a);
                    }
                }
                Ok(())
            }
            WindowStore::Bytes { values, index, spare, buf } => {
                let keys: Vec<(K, u16)> = match index.get(&start) {
                    Some(keys) => keys.iter().map(|(k, g)| (k.clone(), *g)).collect(),
                    None => return Ok(()),
                };
                for (k, g) in keys {
                    buf.clear();
                    k.encode_key(buf);
                    start.encode_key(buf);
                    // A read is not a change: it neither stamps nor caches.
                    let value = if purge {
                        values.update(g, (k.clone(), start), buf, Option::take)?
                    } else {
                        values.get(g, &(k.clone(), start), buf)?
                    };
                    if let Some(a) = value {
                        f(&k, g, &a);
                    }
                }
                if purge && let Some(mut keys) = index.remove(&start) {
                    keys.clear();
                    if spare.len() < SPARE_KEY_SETS {
                        spare.push(keys);
                    }
                }
                Ok(())
            }
        }
    }
}
