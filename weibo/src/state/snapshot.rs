//! State on its way into a checkpoint: a [`Snapshot`] is taken at a
//! barrier and encoded later, off the operator's task, a [`SnapshotPart`]
//! at a time.

use std::ops::Range;
use std::sync::Arc;

use super::StateName;
use super::value::{FULL_CHECKPOINT_EVERY, codec_error};
use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::Result;
use crate::record::CheckpointId;

/// State exported for a checkpoint, or imported from one: (key group,
/// encoded key, encoded value).
pub type Entries = Vec<(u16, Vec<u8>, Vec<u8>)>;

/// Keys removed, by key group: (key group, encoded key).
pub type RemovedKeys = Vec<(u16, Vec<u8>)>;

/// An entry read from a checkpoint in place, its bytes borrowed from the
/// frame that holds them: (key group, encoded key, encoded value).
pub type EntryRef<'a> = (u16, &'a [u8], &'a [u8]);

/// A removed key read from a checkpoint in place: (key group, encoded key).
pub type RemovedRef<'a> = (u16, &'a [u8]);

/// What a restore passes a part of a state to: (entries to put, keys to
/// remove first), borrowed.
/// The third is the clock the part's chain recorded (see
/// [`KeyedState::expired_before`](super::KeyedState::expired_before)).
pub(crate) type LoadPart<'f> =
    dyn FnMut(&mut [EntryRef<'_>], &[RemovedRef<'_>], Option<crate::record::Timestamp>) -> Result<()> + 'f;

/// Borrows owned entries as [`EntryRef`]s.
pub fn entry_refs(entries: &Entries) -> Vec<EntryRef<'_>> {
    entries.iter().map(|(g, k, v)| (*g, k.as_slice(), v.as_slice())).collect()
}

/// A part of the state exported for a checkpoint: entries (and, in a
/// delta, removed keys), their bytes concatenated.
#[derive(Debug, Default, Clone)]
pub struct SnapshotPart {
    /// Whether the snapshot is all the state (a base) or what changed since
    /// the last complete checkpoint (a delta, applied on top of the chain
    /// before it).
    pub base: bool,
    /// Entries (all of them, or the changed ones) and, in a delta, keys
    /// removed since the last complete checkpoint.
    pub part: SnapshotFrame,
}

impl SnapshotPart {
    /// An empty part of a base (`base`) or a delta.
    pub fn new(base: bool) -> Self {
        Self { base, part: SnapshotFrame::default() }
    }

    /// Whether it has reached the size at which it is passed on: [`SNAPSHOT_PART`]
    /// entries or [`SNAPSHOT_PART_BYTES`] bytes.
    fn is_full(&self) -> bool {
        self.part.len() >= SNAPSHOT_PART || self.part.bytes() >= SNAPSHOT_PART_BYTES
    }

    /// Adds `key` → `value` of key group `group`, encoded in place.
    ///
    /// # Errors
    /// [`Error::Codec`] (naming `operator`) when the value does not encode.
    pub(super) fn put<K: Key, V: Data>(&mut self, group: u16, key: &K, value: &V, operator: &str) -> Result<()> {
        let key_start = self.part.keys.len();
        key.encode_key(&mut self.part.keys);
        if let Err(e) = value.encode(&mut self.part.values) {
            self.part.keys.truncate(key_start);
            return Err(codec_error(operator, e));
        }
        self.part.end_entry(group)
    }

    /// Adds the removal of `key`, of key group `group`.
    pub(super) fn remove<K: Key>(&mut self, group: u16, key: &K) -> Result<()> {
        key.encode_key(&mut self.part.removed);
        self.part.end_removed(group)
    }
}

/// Where a keyed state's snapshot is taken: at the barrier of checkpoint
/// `checkpoint`, with `completed` the last complete checkpoint (what a
/// delta builds on). A snapshot outside a checkpoint (an export, a
/// savepoint's copy of the state) has none: it is a base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Barrier {
    pub(super) checkpoint: u64,
    pub(super) completed: u64,
}

impl Barrier {
    pub(crate) fn new(checkpoint: CheckpointId, completed: CheckpointId) -> Self {
        Self { checkpoint: checkpoint.get(), completed: completed.get() }
    }

    /// The epoch that changes made after this barrier are stamped with:
    /// the next checkpoint's number. Epochs are `u32` to keep stamped
    /// entries small; past `u32::MAX` checkpoints the epoch stays there,
    /// and [`delta_since`] makes every snapshot a base from then on, so no
    /// change is ever missed by a delta.
    pub(super) fn next_epoch(self) -> u32 {
        u32::try_from(self.checkpoint.saturating_add(1)).unwrap_or(u32::MAX)
    }
}

/// What a snapshot at `at` builds on: the last complete checkpoint for a
/// delta, `None` for a base. A delta needs a complete checkpoint of this
/// run (at or after its first snapshot, `first_base`), and every
/// [`FULL_CHECKPOINT_EVERY`]th export is a base (`since_full`: snapshots
/// since the last base); so is every snapshot once checkpoint numbers no
/// longer fit an epoch (see [`Barrier::next_epoch`]).
pub(super) fn delta_since(at: Option<Barrier>, first_base: Option<u64>, since_full: u32) -> Option<u32> {
    let at = at?;
    let fits = at.checkpoint < u64::from(u32::MAX);
    let after_first_base = first_base.is_some_and(|first| at.completed >= first);
    if fits && after_first_base && !since_full.is_multiple_of(FULL_CHECKPOINT_EVERY) {
        u32::try_from(at.completed).ok()
    } else {
        None
    }
}

/// Receives a snapshot's parts one at a time (a part's buffers are reused
/// for the next once the sink returns).
pub type SnapshotSink<'a> = dyn FnMut(&SnapshotPart) -> Result<()> + 'a;

/// State taken at a barrier, encoded when called (off the operator's
/// task): it passes the entries to the sink a part at a time, so that they
/// are never all in memory at once (for value state, a part holds one key
/// group, or some of one, in key-group order), and returns whether they are
/// a base. Parts apply in order, each part's removals before its entries;
/// a key removed and then set again has its removal in an earlier part
/// than its entry, or in the same one.
pub type Snapshot = Box<dyn FnOnce(&mut SnapshotSink<'_>) -> Result<bool> + Send>;

/// The most entries a snapshot passes in one part.
pub const SNAPSHOT_PART: usize = 65_536;

/// The bytes at which a snapshot passes a part on, whatever its entries.
pub const SNAPSHOT_PART_BYTES: usize = 16 << 20;

/// A snapshot gathered whole (see [`gather`]).
#[derive(Debug, Default)]
pub struct GatheredSnapshot {
    /// Whether it is a base.
    pub base: bool,
    /// Its entries, in order.
    pub entries: Entries,
    /// Its removed keys, in order.
    pub removed: RemovedKeys,
}

/// Runs a snapshot and gathers its parts into one.
///
/// # Errors
/// The snapshot's.
pub fn gather(export: Snapshot) -> Result<GatheredSnapshot> {
    let mut all = GatheredSnapshot::default();
    all.base = export(&mut |part: &SnapshotPart| {
        all.entries.extend(part.part.entries().map(|(g, k, v)| (g, k.to_vec(), v.to_vec())));
        all.removed.extend(part.part.removed_keys().map(|(g, k)| (g, k.to_vec())));
        Ok(())
    })?;
    Ok(all)
}

/// Passes `part` on, and empties it, if it is full.
pub(crate) fn pass_if_full(part: &mut SnapshotPart, sink: &mut SnapshotSink<'_>) -> Result<()> {
    if part.is_full() { flush_part(part, sink) } else { Ok(()) }
}

/// Passes `part` on, and empties it, unless it is empty.
pub(crate) fn flush_part(part: &mut SnapshotPart, sink: &mut SnapshotSink<'_>) -> Result<()> {
    if !part.part.is_empty() {
        sink(part)?;
        part.part.clear();
    }
    Ok(())
}

/// Entries and removed keys, their bytes concatenated: a frame of a
/// state file of version 3 or 4, and a part of a snapshot. Entry `i` is in key group
/// `groups[i]`; its key is `keys[key_ends[i - 1]..key_ends[i]]` (from 0 for
/// the first), its value likewise in `values`; removed keys likewise.
/// Building one costs an allocation per buffer, not two per entry, and
/// archiving it copies each buffer whole.
#[derive(Debug, Clone, Default, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct SnapshotFrame {
    /// Each entry's key group.
    pub groups: Vec<u16>,
    /// Where each entry's key ends in `keys`.
    pub key_ends: Vec<u32>,
    /// The entries' keys, concatenated.
    pub keys: Vec<u8>,
    /// Where each entry's value ends in `values`.
    pub value_ends: Vec<u32>,
    /// The entries' values, concatenated.
    pub values: Vec<u8>,
    /// Each removed key's key group.
    pub removed_groups: Vec<u16>,
    /// Where each removed key ends in `removed`.
    pub removed_ends: Vec<u32>,
    /// The removed keys, concatenated.
    pub removed: Vec<u8>,
}

/// A buffer's length as an end offset. Snapshots pass a part on once it
/// holds 16 MiB, so only a single entry near 4 GiB fails here.
pub(super) fn end_of(buffer: &[u8]) -> Result<u32> {
    u32::try_from(buffer.len()).map_err(|_| {
        crate::error::internal_error!(
            "a checkpoint part grew to {} bytes, past the 4 GiB a state-file frame can hold",
            buffer.len()
        )
    })
}

/// The slices of `bytes` that `ends` delimit, or `None` if the ends are not
/// in order or run past `bytes`.
pub(crate) fn slices<'a>(
    bytes: &'a [u8],
    ends: impl Iterator<Item = u32> + 'a,
) -> impl Iterator<Item = Option<&'a [u8]>> + 'a {
    let mut start = 0usize;
    ends.map(move |end| {
        let end = end as usize;
        let slice = bytes.get(start..end);
        start = end;
        slice
    })
}

impl SnapshotFrame {
    /// The number of entries.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Whether it holds neither entries nor removed keys.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty() && self.removed_groups.is_empty()
    }

    /// The bytes its buffers hold.
    pub fn bytes(&self) -> usize {
        self.keys.len() + self.values.len() + self.removed.len()
    }

    /// Empties it, keeping its buffers' capacity.
    pub fn clear(&mut self) {
        self.groups.clear();
        self.key_ends.clear();
        self.keys.clear();
        self.value_ends.clear();
        self.values.clear();
        self.removed_groups.clear();
        self.removed_ends.clear();
        self.removed.clear();
    }

    /// Ends an entry of key group `group` whose key and value were appended
    /// to `keys` and `values` (so that encoders write in place).
    ///
    /// # Errors
    /// [`Error::Internal`] when a buffer passed 4 GiB.
    pub fn end_entry(&mut self, group: u16) -> Result<()> {
        let (key_end, value_end) = (end_of(&self.keys)?, end_of(&self.values)?);
        self.groups.push(group);
        self.key_ends.push(key_end);
        self.value_ends.push(value_end);
        Ok(())
    }

    /// Adds an entry.
    ///
    /// # Errors
    /// As [`SnapshotFrame::end_entry`].
    pub fn push(&mut self, group: u16, key: &[u8], value: &[u8]) -> Result<()> {
        self.keys.extend_from_slice(key);
        self.values.extend_from_slice(value);
        self.end_entry(group)
    }

    /// Ends a removed key of key group `group` appended to `removed`.
    ///
    /// # Errors
    /// As [`SnapshotFrame::end_entry`].
    pub fn end_removed(&mut self, group: u16) -> Result<()> {
        let end = end_of(&self.removed)?;
        self.removed_groups.push(group);
        self.removed_ends.push(end);
        Ok(())
    }

    /// Adds a removed key.
    ///
    /// # Errors
    /// As [`SnapshotFrame::end_entry`].
    pub fn push_removed(&mut self, group: u16, key: &[u8]) -> Result<()> {
        self.removed.extend_from_slice(key);
        self.end_removed(group)
    }

    /// The entries: (key group, key, value).
    pub fn entries(&self) -> impl Iterator<Item = (u16, &[u8], &[u8])> {
        let keys = slices(&self.keys, self.key_ends.iter().copied());
        let values = slices(&self.values, self.value_ends.iter().copied());
        self.groups.iter().zip(keys.zip(values)).map(|(g, (k, v))| (*g, k.unwrap_or_default(), v.unwrap_or_default()))
    }

    /// The removed keys: (key group, key).
    pub fn removed_keys(&self) -> impl Iterator<Item = (u16, &[u8])> {
        let keys = slices(&self.removed, self.removed_ends.iter().copied());
        self.removed_groups.iter().zip(keys).map(|(g, k)| (*g, k.unwrap_or_default()))
    }
}

/// One state of an operator, on its way into a checkpoint: its name in
/// the operator, the codec identity of its values, and the snapshot that
/// encodes it (called on a blocking thread).
pub(crate) struct StateSnapshot {
    pub(crate) state: StateName,
    /// The codec and schema of its values.
    pub(crate) ty: StateType,
    /// Encodes the state as of the barrier.
    pub(crate) snapshot: Snapshot,
    /// See [`KeyedState::expired_before`](super::KeyedState::expired_before).
    pub(crate) expired_before: Option<crate::record::Timestamp>,
}

/// What a state's values are: their codec's identity and their schema.
#[derive(Clone, Debug)]
pub(crate) struct StateType {
    pub(crate) codec: String,
    pub(crate) schema: Arc<crate::codec::schema::Schema>,
    /// Whether the values are of a type the user defines (and versions,
    /// with `.state_version(..)`), not one Weibo keeps for itself.
    pub(crate) user: bool,
    /// The state's own version (`States::version`), in place of its
    /// operator's (`.state_version(..)`) when set.
    pub(crate) version: Option<u32>,
}

impl StateType {
    /// The values are `V`s, a type of the user's.
    pub(crate) fn of<V: Data>() -> Self {
        Self { codec: V::codec_id().to_string(), schema: V::schema(), user: true, version: None }
    }

    /// The values are `V`s, a type Weibo keeps for itself (not versioned
    /// with the user's state).
    pub(crate) fn own<V: Data>() -> Self {
        Self { user: false, ..Self::of::<V>() }
    }

    /// A layout Weibo defines itself, named by `codec` (timers).
    pub(crate) fn internal(codec: &str) -> Self {
        Self {
            codec: codec.to_string(),
            schema: crate::codec::schema::Schema::internal(codec),
            user: false,
            version: None,
        }
    }
}

/// Where operators read their state back from when a job restores: a
/// checkpoint (`checkpoint::Restore` implements it). Defined here, below
/// the checkpoint layer, so that operators restore without knowing how
/// checkpoints are stored.
pub(crate) trait RestoreSource: Sync {
    /// Passes the entries of `operator`'s `state` in key groups `groups` to
    /// `f` a part at a time, as (entries to put, keys to remove first):
    /// applying the parts in order (removals, then puts) gives the state.
    /// The bytes are borrowed from the checkpoint's frames, read in place:
    /// `f` copies what it keeps. `ty` is what the operator decodes; a state written with another
    /// codec or schema is refused (or migrated, if the job can).
    fn load_entries(
        &self,
        operator: &str,
        state: &str,
        ty: &StateType,
        groups: &Range<u16>,
        f: &mut LoadPart<'_>,
    ) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(checkpoint: u64, completed: u64) -> Option<Barrier> {
        Some(Barrier::new(CheckpointId::new(checkpoint), CheckpointId::new(completed)))
    }

    #[test]
    fn a_delta_builds_on_the_last_complete_checkpoint_of_this_run() {
        assert_eq!(delta_since(None, Some(1), 3), None, "outside a checkpoint: a base");
        assert_eq!(delta_since(at(5, 4), None, 3), None, "no base yet in this run");
        assert_eq!(delta_since(at(5, 4), Some(5), 3), None, "the last complete one is older than the first base");
        assert_eq!(delta_since(at(5, 4), Some(2), 3), Some(4));
        assert_eq!(delta_since(at(5, 4), Some(2), FULL_CHECKPOINT_EVERY), None, "every tenth is a base");
    }

    /// Epochs are `u32`: once checkpoint numbers pass them, an epoch stays
    /// at `u32::MAX` and every snapshot is a base, so no delta can miss a
    /// change stamped with a saturated epoch.
    #[test]
    fn checkpoint_numbers_past_the_epochs_give_bases_not_wrapped_deltas() {
        let max = u64::from(u32::MAX);
        assert_eq!(at(max - 2, max - 3).map(Barrier::next_epoch), Some(u32::MAX - 1));
        assert_eq!(delta_since(at(max - 2, max - 3), Some(1), 3), Some(u32::MAX - 3));
        assert_eq!(at(max, max - 1).map(Barrier::next_epoch), Some(u32::MAX));
        assert_eq!(at(max + 7, max + 6).map(Barrier::next_epoch), Some(u32::MAX), "saturates, never wraps");
        assert_eq!(delta_since(at(max - 1, max - 2), Some(1), 3), Some(u32::MAX - 2));
        assert_eq!(delta_since(at(max, max - 1), Some(1), 3), None);
        assert_eq!(delta_since(at(max + 7, max + 6), Some(1), 3), None);
    }
}
