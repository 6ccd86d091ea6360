//! Timers in a byte table (the fjall backend's), ordered by time.
//!
//! A timer is an entry whose key is the time, in the order-preserving key
//! encoding, followed by the encoded key, and whose value is empty: the
//! same entries as the in-memory timers' checkpoints, so a job moves
//! between backends through a savepoint. One key group is one range of the
//! table, ordered by time; in memory there are only, per owned key group,
//! its first few timers (below) and the time of its earliest (with an index
//! of those), so the memory the timers of a job take does not grow with
//! their number.
//!
//! The entries go through a [`ValueStore`] on the table, behind the
//! backend's cache of live values when it has one: it logs changes for
//! incremental checkpoints and snapshots the table's snapshot (with the
//! cache laid over it) for full ones, as for any value state. A timer set
//! and removed while cached (a session's timer moved by its next event)
//! never reaches the table; a timer cached when its key group is written
//! back goes to the table then. The table is read in order through the
//! cache ([`ValueStore::scan_from`]), which sorts its entries of the key
//! group only as far as the read needs.
//!
//! Each key group's first timers are read ahead, a few at a time, into a
//! small buffer ([`Ahead`]), kept in step with every timer set and removed:
//! firing a timer takes it from the buffer and removes it from the table,
//! and the table is scanned again only when the buffer runs out, not for
//! every timer fired (a scan of an LSM tree opens an iterator over each of
//! its levels).

use std::collections::{BTreeSet, VecDeque};

use super::snapshot::Barrier;
use super::value::key_error;
use super::{DueTimers, EntryRef, KeyedState, RemovedRef, Snapshot, StateBackend, StateScope, ValueStore};
use crate::codec::key::Key;
use crate::error::Result;
use crate::record::Timestamp;

/// See the module documentation.
pub(super) struct TableTimers<K> {
    pub(super) state: ValueStore<(Timestamp, K), ()>,
    /// Per owned key group, the time of its earliest timer.
    heads: Vec<Option<Timestamp>>,
    /// (time, index) of every key group's earliest timer.
    queue: BTreeSet<(Timestamp, usize)>,
    /// Per owned key group, its first timers, read ahead.
    ahead: Vec<Ahead<K>>,
    /// Per owned key group, an entry no timer of the table lies after
    /// (`None`: the group has none): a timer set after it is new without
    /// a read, which is how timers are mostly set (later than the others).
    bounds: Vec<Option<Vec<u8>>>,
    first: u16,
    len: usize,
    buf: Vec<u8>,
    operator: String,
}

impl<K> TableTimers<K> {
    pub(super) fn len(&self) -> usize {
        self.len
    }
}

/// How many timers of a key group are read ahead at most.
#[cfg(not(test))]
const READ_AHEAD: usize = 64;
/// (Few in tests, so that buffers run out and overflow often.)
#[cfg(test)]
const READ_AHEAD: usize = 3;

/// A key group's first timers, in table order: `(time, key, entry key)`.
/// Unless `complete`, the group has more timers after the last of them,
/// in the table only. Empty and not complete: nothing is known (read the
/// table).
struct Ahead<K> {
    timers: VecDeque<(Timestamp, K, Vec<u8>)>,
    complete: bool,
}

impl<K> Default for Ahead<K> {
    fn default() -> Self {
        Self { timers: VecDeque::new(), complete: false }
    }
}

impl<K> Ahead<K> {
    /// Where `entry` sits among the buffered timers, if it is within what
    /// is buffered (`Err` with the place to insert it); `None` when it
    /// lies past the buffer, in the part only the table holds.
    fn find(&self, entry: &[u8]) -> Option<std::result::Result<usize, usize>> {
        let at = self.timers.binary_search_by(|(_, _, e)| e.as_slice().cmp(entry));
        match at {
            Err(end) if end == self.timers.len() && !self.complete => None,
            at => Some(at),
        }
    }

    fn head(&self) -> Option<Timestamp> {
        self.timers.front().map(|(t, _, _)| *t)
    }

    /// Nothing buffered, and more in the table: read it again.
    fn exhausted(&self) -> bool {
        self.timers.is_empty() && !self.complete
    }
}

impl<K: Key> TableTimers<K> {
    /// What its table holds (for metrics).
    pub(super) fn stats(&self) -> super::StateStats {
        self.state.stats()
    }

    pub(super) fn open(backend: &dyn StateBackend, scope: &StateScope) -> Result<Self> {
        let mut timers = Self {
            state: ValueStore::open_ordered(backend, scope)?,
            heads: scope.key_groups.clone().map(|_| None).collect(),
            queue: BTreeSet::new(),
            ahead: scope.key_groups.clone().map(|_| Ahead::default()).collect(),
            bounds: scope.key_groups.clone().map(|_| None).collect(),
            first: scope.key_groups.start,
            len: 0,
            buf: Vec::new(),
            operator: scope.operator.clone(),
        };
        // A table that already holds timers: none does in a job, whose
        // keyspaces are dropped before its states open (`prepare`). Without
        // a cache the counts, buffers and bounds are taken from the table
        // either way; a cache, as in front of every value state, takes a
        // new state's table for empty and reads none of it (so that a key
        // group never written back costs no table reads).
        for index in 0..timers.heads.len() {
            let mut count = 0usize;
            let mut last: Option<Vec<u8>> = None;
            timers.table_scan(index, &[], usize::MAX, &mut |key, _| {
                count += 1;
                let last = last.get_or_insert_with(Vec::new);
                last.clear();
                last.extend_from_slice(key);
                true
            })?;
            timers.len += count;
            if let Some(bound) = timers.bounds.get_mut(index) {
                *bound = last;
            }
            timers.refresh(index, &[])?;
        }
        Ok(timers)
    }

    fn group(&self, index: usize) -> u16 {
        self.first.saturating_add(u16::try_from(index).unwrap_or(u16::MAX))
    }

    fn index(&self, group: u16) -> Option<usize> {
        let index = usize::from(group.checked_sub(self.first)?);
        (index < self.heads.len()).then_some(index)
    }

    /// Visits key group `index`'s timers from the entry `from` on, in
    /// order, while `f` returns true (reading `limit` at most).
    fn table_scan(
        &mut self,
        index: usize,
        from: &[u8],
        limit: usize,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        let group = self.group(index);
        self.state.scan_from(group, from, limit, f)
    }

    /// Reads key group `index`'s first timers into its buffer, from `from`
    /// (an entry key at or before the first of them): seeking past the
    /// timers removed before it, whose tombstones the table may still
    /// hold. Sets the group's head.
    fn refresh(&mut self, index: usize, from: &[u8]) -> Result<()> {
        let mut read = VecDeque::with_capacity(READ_AHEAD);
        let mut failure = None;
        let mut complete = true;
        self.table_scan(index, from, READ_AHEAD + 1, &mut |key, _| {
            if read.len() == READ_AHEAD {
                complete = false;
                return false;
            }
            match crate::codec::key::decode::<(Timestamp, K)>(key) {
                Ok((time, k)) => read.push_back((time, k, key.to_vec())),
                Err(e) => failure = Some(e),
            }
            failure.is_none()
        })?;
        if let Some(e) = failure {
            return Err(key_error(&self.operator, e));
        }
        let head = read.front().map(|(t, _, _)| *t);
        if let Some(ahead) = self.ahead.get_mut(index) {
            *ahead = Ahead { timers: read, complete };
        }
        self.set_head(index, head);
        Ok(())
    }

    /// The group's head from its buffer, reading the table again from
    /// `from` if the buffer ran out.
    fn reload_head(&mut self, index: usize, from: &[u8]) -> Result<()> {
        match self.ahead.get(index) {
            Some(ahead) if ahead.exhausted() => self.refresh(index, from),
            Some(ahead) => {
                let head = ahead.head();
                self.set_head(index, head);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn set_head(&mut self, index: usize, head: Option<Timestamp>) {
        let Some(slot) = self.heads.get_mut(index) else { return };
        if *slot == head {
            return;
        }
        if let Some(old) = slot.take() {
            self.queue.remove(&(old, index));
        }
        if let Some(time) = head {
            self.queue.insert((time, index));
        }
        *slot = head;
    }

    fn encode(&mut self, time: Timestamp, key: &K) {
        self.buf.clear();
        time.encode_key(&mut self.buf);
        key.encode_key(&mut self.buf);
    }

    pub(super) fn register(&mut self, time: Timestamp, group: u16, key: &K) -> Result<()> {
        let Some(index) = self.index(group) else {
            return Err(crate::error::internal_error!(
                "operator `{}`: a timer for key group {group}, which it does not own",
                self.operator
            ));
        };
        self.encode(time, key);
        // Within what is read ahead, the buffer knows whether the timer is
        // set, and after the group's bound nothing is: no read of the table
        // (in between, the table says).
        let after_bound = self.bounds.get(index).is_some_and(|b| b.as_deref().is_none_or(|b| self.buf.as_slice() > b));
        match self.ahead.get(index).and_then(|ahead| ahead.find(&self.buf)) {
            Some(Ok(_)) => return Ok(()),
            Some(Err(at)) => {
                self.state.put_absent(group, (time, key.clone()), &self.buf, &())?;
                if let Some(ahead) = self.ahead.get_mut(index) {
                    ahead.timers.insert(at, (time, key.clone(), self.buf.clone()));
                    if ahead.timers.len() > READ_AHEAD {
                        // The last one stays in the table only.
                        ahead.timers.pop_back();
                        ahead.complete = false;
                    }
                }
            }
            None if after_bound => self.state.put_absent(group, (time, key.clone()), &self.buf, &())?,
            None => {
                let existed =
                    self.state.update(group, (time, key.clone()), &self.buf, |slot| slot.replace(()).is_some())?;
                if existed {
                    return Ok(());
                }
            }
        }
        self.len += 1;
        if after_bound && let Some(slot) = self.bounds.get_mut(index) {
            let bound = slot.get_or_insert_with(Vec::new);
            bound.clear();
            bound.extend_from_slice(&self.buf);
        }
        if self.heads.get(index).copied().flatten().is_none_or(|head| time < head) {
            self.set_head(index, Some(time));
        }
        Ok(())
    }

    pub(super) fn delete(&mut self, time: Timestamp, group: u16, key: &K) -> Result<()> {
        let Some(index) = self.index(group) else { return Ok(()) };
        self.encode(time, key);
        // As in `register`: within what is read ahead, no read of the table.
        let existed = match self.ahead.get(index).and_then(|ahead| ahead.find(&self.buf)) {
            Some(Ok(at)) => {
                self.state.remove_present(group, (time, key.clone()), &self.buf)?;
                if let Some(ahead) = self.ahead.get_mut(index) {
                    ahead.timers.remove(at);
                }
                true
            }
            Some(Err(_)) => false,
            None => self.state.update(group, (time, key.clone()), &self.buf, |slot| slot.take().is_some())?,
        };
        if existed {
            self.len -= 1;
            if self.heads.get(index).copied().flatten() == Some(time) {
                let mut from = Vec::new();
                time.encode_key(&mut from);
                self.reload_head(index, &from)?;
            }
        }
        Ok(())
    }

    pub(super) fn next_time(&self) -> Option<Timestamp> {
        self.queue.first().map(|(time, _)| *time)
    }

    pub(super) fn pop_due(&mut self, watermark: Timestamp) -> Result<Option<DueTimers<K>>> {
        let Some(&(time, _)) = self.queue.first() else { return Ok(None) };
        if time > watermark {
            return Ok(None);
        }
        let groups: Vec<usize> = self.queue.range((time, 0)..=(time, usize::MAX)).map(|(_, index)| *index).collect();
        let mut prefix = Vec::new();
        time.encode_key(&mut prefix);
        let mut due = Vec::new();
        for index in groups {
            let group = self.group(index);
            loop {
                if self.ahead.get(index).is_some_and(Ahead::exhausted) {
                    // Those at `time` already taken are gone from the
                    // table: the read starts at what is left of them.
                    self.refresh(index, &prefix)?;
                }
                let Some(ahead) = self.ahead.get_mut(index) else { break };
                let Some((t, _, _)) = ahead.timers.front() else { break };
                if *t != time {
                    break;
                }
                let Some((_, k, entry)) = ahead.timers.pop_front() else { break };
                self.state.remove_present(group, (time, k.clone()), &entry)?;
                self.len = self.len.saturating_sub(1);
                due.push((k, group));
            }
            let head = self.ahead.get(index).and_then(Ahead::head);
            self.set_head(index, head);
        }
        Ok(Some((time, due)))
    }

    /// Every timer, from the table.
    #[cfg(test)]
    pub(super) fn contents(&mut self) -> Vec<(Timestamp, K)> {
        let mut all = Vec::new();
        for index in 0..self.heads.len() {
            let _ = self.table_scan(index, &[], usize::MAX, &mut |key, _| {
                all.extend(crate::codec::key::decode::<(Timestamp, K)>(key).ok());
                true
            });
        }
        all
    }

    pub(super) fn snapshot_at(&mut self, at: Option<Barrier>) -> Result<Snapshot> {
        self.state.snapshot_at(at)
    }

    /// Deletes `removed`, then sets `entries` (keys: time ++ key).
    pub(super) fn import_part(&mut self, entries: &[EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        for &(group, key) in removed {
            let (time, k) =
                crate::codec::key::decode::<(Timestamp, K)>(key).map_err(|e| key_error(&self.operator, e))?;
            self.delete(time, group, &k)?;
        }
        for &(group, key, _) in entries {
            let (time, k) =
                crate::codec::key::decode::<(Timestamp, K)>(key).map_err(|e| key_error(&self.operator, e))?;
            self.register(time, group, &k)?;
        }
        Ok(())
    }
}
