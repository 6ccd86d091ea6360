//! Keyed state, namespaced by (operator, key group).
//!
//! A [`StateBackend`] opens one [`StateTable`] per stateful operator instance
//! and state name; a table stores bytes per (key group, key), so every key
//! group is a separate namespace and a job can be rescaled by reassigning
//! key groups to workers. Operators use typed handles ([`ValueStore`]) over
//! a table.
//!
//! [`MemoryBackend`] keeps live objects instead of bytes (like Flink's
//! hash-map backend): nothing is encoded on the hot path, values are encoded
//! only when a checkpoint copies them out. Backends that store bytes go
//! through the codec on every access, unless they ask for a cache of live
//! values in front of their tables ([`StateBackend::object_cache`], as the
//! fjall backend does): then only misses and write-backs do.

mod cache;
#[cfg(feature = "fjall")]
mod fjall;
mod flat;
mod map_state;
mod memory;
mod snapshot;
mod spares;
mod time_index;
mod timer_state;
mod timers;
mod ttl;
mod value;
mod window_state;
pub use self::cache::ObjectCache;
#[cfg(feature = "fjall")]
pub use self::fjall::{FjallBackend, FjallOptions};
pub(crate) use self::map_state::{ByteRange, encoded_range, prefix_range};
pub use self::map_state::{ListStore, MapStore, OrderedKeys, Sequence, UserKeys};
pub(crate) use self::memory::EncodedMemoryBackend;
pub use self::memory::MemoryBackend;
pub(crate) use self::snapshot::{
    ArchivedSnapshotFrame, Barrier, LoadPart, RestoreSource, StateSnapshot, StateType, slices,
};
pub use self::snapshot::{
    Entries, EntryRef, GatheredSnapshot, RemovedKeys, RemovedRef, SNAPSHOT_PART, SNAPSHOT_PART_BYTES, Snapshot,
    SnapshotFrame, SnapshotPart, SnapshotSink, entry_refs, gather,
};
pub use self::timer_state::{DueTimers, TimerState};
pub use self::ttl::{Expiring, ExpiryClock, Now, StateTtl, TtlListStore, TtlMapStore, TtlValueStore};
pub use self::value::{FULL_CHECKPOINT_EVERY, ValueStore, Writes};
pub use self::window_state::{WindowRun, WindowState};

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use rustc_hash::FxBuildHasher;

/// The in-memory store's map: hashbrown, whose entries let a value be
/// moved out and back without storing `Option<V>` (see
/// `flat::replace_entry_with`).
type ObjectMap<K, V> = hashbrown::HashMap<K, V, FxBuildHasher>;

use crate::codec::Data;
use crate::error::{Error, Result};

/// A state's name within its operator: Weibo's own (`value`, `timers`)
/// or one a process function declares.
pub(crate) type StateName = std::borrow::Cow<'static, str>;

/// Which state a table holds.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateScope {
    /// The job's name.
    pub job: String,
    /// The operator's id (unique in the job: its uid, or else its name).
    pub operator: String,
    /// The state's name within the operator.
    pub state: String,
    /// The key groups this instance owns.
    pub key_groups: Range<u16>,
    /// The job's number of key groups.
    pub max_key_groups: u16,
}

impl StateScope {
    /// The scope of state `state` of operator `operator` in job `job`, for
    /// an instance owning `key_groups` of `max_key_groups` (what the
    /// runtime opens state with; benchmarks and tests of a backend open
    /// state directly with it).
    ///
    /// ```
    /// use weibo::state::{MemoryBackend, StateScope, ValueStore};
    /// let scope = StateScope::new("job", "totals", "value", 0..128, 128);
    /// let mut totals = ValueStore::<u64, u64>::open(&MemoryBackend, &scope)?;
    /// let key = weibo::codec::key::encode(&7u64);
    /// let group = weibo::codec::key::key_group(&key, 128);
    /// totals.update(group, 7, &key, |v| *v.get_or_insert(0) += 5)?;
    /// assert_eq!(totals.get(group, &7, &key)?, Some(5));
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn new(
        job: impl Into<String>,
        operator: impl Into<String>,
        state: impl Into<String>,
        key_groups: Range<u16>,
        max_key_groups: u16,
    ) -> Self {
        Self { job: job.into(), operator: operator.into(), state: state.into(), key_groups, max_key_groups }
    }
}

impl StateScope {
    /// Refuses a state whose values do not read back as written
    /// ([`Data::check_round_trip`]): its
    /// checkpoints could never be restored.
    ///
    /// # Errors
    /// [`Error::Graph`] naming the type, the state and the operator, and
    /// what to change.
    pub(crate) fn check_values<V: Data>(&self) -> Result<()> {
        V::check_round_trip().map_err(|why| Error::Graph {
            job: self.job.clone(),
            message: format!(
                "state `{}` of operator `{}` keeps values of type `{}` that its codec cannot read back: {why}. \
                 Checkpoints of it could never be restored. The postcard codec writes fields by position: drop \
                 `skip_serializing_if` and `skip_serializing` (keep `#[serde(default)]` if you like), and use \
                 externally tagged enums and no `flatten`; or keep such values as another type (see the Codecs \
                 chapter)",
                self.state,
                self.operator,
                crate::codec::recorded_type_name(std::any::type_name::<V>()),
            ),
        })
    }
}

/// Where keyed state lives. Shared by every operator instance of a job.
pub trait StateBackend: Send + Sync + fmt::Debug + 'static {
    /// A short name for logs and the plan (`memory`, `fjall`).
    fn name(&self) -> &'static str;

    /// Whether typed handles should keep live objects (no codec on access)
    /// instead of going through [`StateBackend::open_table`].
    fn keeps_objects(&self) -> bool {
        false
    }

    /// The budget of the write-back cache of live values that value and
    /// window state keep in front of this backend's tables, if it wants
    /// one (see [`ObjectCache`]); without one every access reads and
    /// writes the table.
    fn object_cache(&self) -> Option<Arc<ObjectCache>> {
        None
    }

    /// Whether event-time timers live in this backend's tables (ordered by
    /// time, with only each key group's earliest time in memory) rather
    /// than in memory. Only for backends that do not keep objects.
    fn timers_in_table(&self) -> bool {
        false
    }

    /// Called before the table of a state whose entries expire (a state
    /// with a time-to-live) is opened: a backend that can drop expired
    /// entries by itself (fjall, as it compacts) drops those of which
    /// [`ExpiryClock::drops`] says so. Others need do nothing: the state
    /// sweeps its entries itself.
    fn expire_entries(&self, scope: &StateScope, clock: Arc<ExpiryClock>) {
        let _ = (scope, clock);
    }

    /// Called once when job `job` starts, before any table is opened:
    /// a backend that keeps data between runs drops the job's old state
    /// here, since a job starts from a checkpoint or from nothing, never
    /// from what a previous run left behind.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn prepare(&self, job: &str) -> Result<()> {
        let _ = job;
        Ok(())
    }

    /// Opens the byte table of one operator instance's state.
    ///
    /// # Errors
    /// [`Error::State`] when the storage cannot be opened.
    fn open_table(&self, scope: &StateScope) -> Result<Box<dyn StateTable>>;
}

pub(crate) use crate::metrics::StateStats;

/// What every kind of keyed state does for checkpoints and metrics, so
/// that an operator snapshots, restores and reports each of its states the
/// same way, by name: value, timer and window state implement it.
pub(crate) trait KeyedState {
    /// The state at the barrier `at` (all of it, or what changed since the
    /// last complete checkpoint), or all of it outside a checkpoint
    /// (`None`), to encode later on another thread. `operator` names the
    /// operator in errors.
    ///
    /// # Errors
    /// [`Error::State`] when a byte backend fails.
    fn snapshot_at(&mut self, operator: &str, at: Option<Barrier>) -> Result<Snapshot>;

    /// Applies one part of a checkpoint: `removed` first, then `entries`.
    ///
    /// # Errors
    /// [`Error::State`] or [`Error::Codec`] when an entry does not decode
    /// or the backend fails.
    fn import_part(&mut self, operator: &str, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()>;

    /// How large the state is, for metrics.
    fn stats(&self) -> StateStats;

    /// The time at or before which the state's entries had expired at
    /// the barrier, for a state whose clock a restore cannot read
    /// (a time-to-live in event time): recorded with the checkpoint.
    fn expired_before(&self) -> Option<crate::record::Timestamp> {
        None
    }

    /// The checkpoint part a restore passes next was recorded with
    /// `clock` (see [`KeyedState::expired_before`]).
    fn restoring(&mut self, clock: Option<crate::record::Timestamp>) {
        let _ = clock;
    }
}

/// Byte-level keyed state of one operator instance: values by (key group,
/// encoded key).
pub trait StateTable: Send {
    /// The value of `key` in `group`.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn get(&mut self, group: u16, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// Sets the value of `key` in `group`.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn put(&mut self, group: u16, key: &[u8], value: &[u8]) -> Result<()>;

    /// Removes `key` from `group`.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn delete(&mut self, group: u16, key: &[u8]) -> Result<()>;

    /// Writes and removes many entries at once (a cache's write-back):
    /// (key group, key, value or `None` to remove). The default applies
    /// them one by one; backends with write batches use them.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn apply(&mut self, writes: Writes) -> Result<()> {
        for (group, key, value) in writes {
            match value {
                Some(value) => self.put(group, &key, &value)?,
                None => self.delete(group, &key)?,
            }
        }
        Ok(())
    }

    /// Sets many values at once (a restore): (key group, key, value).
    /// The default puts them one by one; backends with write batches use
    /// them.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn put_all(&mut self, entries: &[EntryRef<'_>]) -> Result<()> {
        for (group, key, value) in entries {
            self.put(*group, key, value)?;
        }
        Ok(())
    }

    /// Calls `f` with every (key, value) of `group`, in key order.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn scan_group(&mut self, group: u16, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<()>;

    /// The table's entries (approximate) and bytes on disk, if the backend
    /// can tell cheaply (for metrics). The default: it cannot.
    fn size(&self) -> Option<(u64, u64)> {
        None
    }

    /// For a table that lives in memory: its entries (for metrics). The
    /// default: it does not.
    fn entries_in_memory(&self) -> Option<u64> {
        None
    }

    /// Calls `f` with the (key, value) entries of `group` from key `from`
    /// on, in key order, until `f` returns `false`. The default filters
    /// [`StateTable::scan_group`]; ordered backends seek.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn scan_from(&mut self, group: u16, from: &[u8], f: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        let mut more = true;
        self.scan_group(group, &mut |k, v| {
            if more && k >= from {
                more = f(k, v);
            }
        })
    }

    /// The entries of key groups `groups` as of now, to read later (on
    /// another thread), for a checkpoint. The default reads them now;
    /// backends with snapshots take one and read it later.
    ///
    /// The snapshot must pass each key group's entries in one or more parts
    /// holding that key group only, key groups in order (a cache laid over
    /// the table relies on it). The default passes one part per key group
    /// that has entries; the fjall backend splits a key group into parts of
    /// at most [`SNAPSHOT_PART`] entries or about [`SNAPSHOT_PART_BYTES`] bytes.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn snapshot_deferred(&mut self, groups: Range<u16>) -> Result<Snapshot> {
        let mut parts = Vec::new();
        for group in groups {
            let mut out = SnapshotPart::new(true);
            let mut failure = None;
            self.scan_group(group, &mut |k, v| {
                if let Err(e) = out.part.push(group, k, v) {
                    failure.get_or_insert(e);
                }
            })?;
            if let Some(e) = failure {
                return Err(e);
            }
            if !out.part.is_empty() {
                parts.push(out);
            }
        }
        Ok(Box::new(move |sink| {
            for part in &parts {
                sink(part)?;
            }
            Ok(true)
        }))
    }
}

#[cfg(test)]
mod tests;
