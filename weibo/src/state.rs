//! Keyed state, namespaced by (operator, key group).
//!
//! A [`StateBackend`] opens one [`StateTable`] per stateful operator instance
//! and state name; a table stores bytes per (key group, key), so every key
//! group is a separate namespace and a job can be rescaled by reassigning
//! key groups to workers. Operators use typed handles ([`ValueState`]) over
//! a table.
//!
//! [`MemoryBackend`] keeps live objects instead of bytes (like Flink's
//! hash-map backend): nothing is encoded on the hot path, values are encoded
//! only when a checkpoint copies them out. Backends that store bytes (the
//! fjall backend) go through the codec on every access.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use hashbrown::hash_map::Entry;
use rustc_hash::FxBuildHasher;

/// The in-memory store's map: hashbrown for `replace_entry_with`, which
/// lets a value be moved out and back without storing `Option<V>`.
type ObjectMap<K, V> = hashbrown::HashMap<K, V, FxBuildHasher>;

use crate::codec::Data;
use crate::error::{Error, Result};
use crate::key::Key;

/// Which state a table holds.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateScope {
    /// The job's name.
    pub job: String,
    /// The operator's name (unique in the job).
    pub operator: String,
    /// The state's name within the operator.
    pub state: String,
    /// The key groups this instance owns.
    pub key_groups: Range<u16>,
    /// The job's number of key groups.
    pub max_key_groups: u16,
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

    /// Opens the byte table of one operator instance's state.
    ///
    /// # Errors
    /// [`Error::State`] when the storage cannot be opened.
    fn open_table(&self, scope: &StateScope) -> Result<Box<dyn StateTable>>;
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

    /// Calls `f` with every (key, value) of `group`, in key order.
    ///
    /// # Errors
    /// [`Error::State`] when the storage fails.
    fn scan_group(&mut self, group: u16, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<()>;
}

/// State in memory: the fastest backend, bounded by RAM.
///
/// ```
/// use weibo::{Job, state::MemoryBackend};
/// let job = Job::new("counts").with_state_backend(MemoryBackend);
/// # drop(job);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryBackend;

impl StateBackend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn keeps_objects(&self) -> bool {
        true
    }

    fn open_table(&self, scope: &StateScope) -> Result<Box<dyn StateTable>> {
        Ok(Box::new(MemoryTable { groups: BTreeMap::new(), operator: scope.operator.clone() }))
    }
}

/// A byte table in memory, ordered by (group, key).
#[derive(Debug)]
struct MemoryTable {
    groups: BTreeMap<u16, BTreeMap<Vec<u8>, Vec<u8>>>,
    #[allow(dead_code)]
    operator: String,
}

impl StateTable for MemoryTable {
    fn get(&mut self, group: u16, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.groups.get(&group).and_then(|g| g.get(key)).cloned())
    }

    fn put(&mut self, group: u16, key: &[u8], value: &[u8]) -> Result<()> {
        self.groups.entry(group).or_default().insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn delete(&mut self, group: u16, key: &[u8]) -> Result<()> {
        if let Some(g) = self.groups.get_mut(&group) {
            g.remove(key);
        }
        Ok(())
    }

    fn scan_group(&mut self, group: u16, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<()> {
        if let Some(g) = self.groups.get(&group) {
            for (k, v) in g {
                f(k, v);
            }
        }
        Ok(())
    }
}

enum Store<K, V> {
    /// One map per owned key group, by typed key.
    Objects(Vec<ObjectMap<K, V>>),
    Bytes {
        table: Box<dyn StateTable>,
        buf: Vec<u8>,
    },
}

/// One value per key: the typed handle keyed operators use.
///
/// Every access names the key twice: typed (for backends that keep
/// objects) and encoded (for backends that store bytes); the operator has
/// both at hand.
pub struct ValueState<K, V> {
    store: Store<K, V>,
    groups: Range<u16>,
    operator: String,
}

impl<K, V> fmt::Debug for ValueState<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValueState")
            .field("operator", &self.operator)
            .field("groups", &self.groups)
            .finish_non_exhaustive()
    }
}

impl<K: Key, V: Data> ValueState<K, V> {
    /// Opens the state `scope` names on `backend`.
    ///
    /// # Errors
    /// [`Error::State`] when the backend cannot open it.
    pub fn open(backend: &dyn StateBackend, scope: &StateScope) -> Result<Self> {
        let store = if backend.keeps_objects() {
            Store::Objects(scope.key_groups.clone().map(|_| ObjectMap::default()).collect())
        } else {
            Store::Bytes { table: backend.open_table(scope)?, buf: Vec::new() }
        };
        Ok(Self { store, groups: scope.key_groups.clone(), operator: scope.operator.clone() })
    }

    fn group_error(&self, group: u16) -> Error {
        Error::Internal(format!("operator `{}` got key group {group}, but owns {:?}", self.operator, self.groups))
    }

    /// Reads, and possibly changes, the value of `key` (encoded: `key_bytes`)
    /// in `group`: `f` gets the current value (`None` if absent); whatever
    /// it leaves is stored (`None` removes the key).
    ///
    /// # Errors
    /// [`Error::State`] or [`Error::Codec`] when a byte backend fails;
    /// [`Error::Internal`] for a key group this instance does not own.
    #[inline]
    pub fn update<R>(
        &mut self,
        group: u16,
        key: K,
        key_bytes: &[u8],
        f: impl FnOnce(&mut Option<V>) -> R,
    ) -> Result<R> {
        if !self.groups.contains(&group) {
            return Err(self.group_error(group));
        }
        let index = usize::from(group - self.groups.start);
        match &mut self.store {
            Store::Objects(maps) => {
                let Some(map) = maps.get_mut(index) else {
                    return Err(Error::Internal(format!(
                        "operator `{}` has no map for key group {group}",
                        self.operator
                    )));
                };
                Ok(match map.entry(key) {
                    Entry::Occupied(e) => {
                        let mut result = None;
                        let _ = e.replace_entry_with(|_, value| {
                            let mut slot = Some(value);
                            result = Some(f(&mut slot));
                            slot
                        });
                        result.ok_or_else(|| Error::Internal("state update closure was not called".into()))?
                    }
                    Entry::Vacant(e) => {
                        let mut slot = None;
                        let r = f(&mut slot);
                        if let Some(value) = slot {
                            e.insert(value);
                        }
                        r
                    }
                })
            }
            Store::Bytes { table, buf } => {
                let codec = |source| Error::Codec { operator: self.operator.clone(), source };
                let mut slot = match table.get(group, key_bytes)? {
                    Some(bytes) => Some(V::decode(&bytes).map_err(codec)?),
                    None => None,
                };
                let r = f(&mut slot);
                match slot {
                    Some(v) => {
                        buf.clear();
                        v.encode(buf).map_err(codec)?;
                        table.put(group, key_bytes, buf)?;
                    }
                    None => table.delete(group, key_bytes)?,
                }
                Ok(r)
            }
        }
    }

    /// Looks `keys` up without changing anything, so that the cache lines
    /// they live on are loaded when [`ValueState::update`] needs them.
    ///
    /// The lookups are independent of each other, so the processor overlaps
    /// their cache misses; done one by one inside `update` (between user
    /// code and output), each miss would be paid in full. Only the
    /// in-memory store does anything.
    pub fn prefetch<'k>(&self, keys: impl IntoIterator<Item = (u16, &'k K)>) {
        let Store::Objects(maps) = &self.store else { return };
        let mut found = 0usize;
        for (group, key) in keys {
            let index = usize::from(group.wrapping_sub(self.groups.start));
            if let Some(map) = maps.get(index) {
                found += usize::from(map.contains_key(key));
            }
        }
        std::hint::black_box(found);
    }

    /// The value of `key` in `group`, if any.
    ///
    /// # Errors
    /// As [`ValueState::update`].
    pub fn get(&mut self, group: u16, key: &K, key_bytes: &[u8]) -> Result<Option<V>> {
        self.update(group, key.clone(), key_bytes, |v| v.clone())
    }

    /// Calls `f` with every key and value of `group` (for byte backends, in
    /// key-byte order).
    ///
    /// # Errors
    /// As [`ValueState::update`], and [`Error::Internal`] when a stored key
    /// does not decode.
    pub fn for_each_in_group(&mut self, group: u16, mut f: impl FnMut(&K, &V)) -> Result<()> {
        if !self.groups.contains(&group) {
            return Err(self.group_error(group));
        }
        let index = usize::from(group - self.groups.start);
        let operator = self.operator.clone();
        match &mut self.store {
            Store::Objects(maps) => {
                for (k, v) in maps.get(index).into_iter().flatten() {
                    f(k, v);
                }
                Ok(())
            }
            Store::Bytes { table, .. } => {
                let mut failure = None;
                table.scan_group(group, &mut |k, bytes| {
                    if failure.is_some() {
                        return;
                    }
                    match (crate::key::decode::<K>(k), V::decode(bytes)) {
                        (Ok(k), Ok(v)) => f(&k, &v),
                        (Err(e), _) => failure = Some(Error::Internal(format!("operator `{operator}`: stored {e}"))),
                        (_, Err(source)) => failure = Some(Error::Codec { operator: operator.clone(), source }),
                    }
                })?;
                failure.map_or(Ok(()), Err)
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A backend that stores bytes, to run the same tests through the codec path.
    #[derive(Debug)]
    struct BytesOnly;
    impl StateBackend for BytesOnly {
        fn name(&self) -> &'static str {
            "bytes-only"
        }
        fn open_table(&self, scope: &StateScope) -> Result<Box<dyn StateTable>> {
            MemoryBackend.open_table(scope)
        }
    }

    fn scope() -> StateScope {
        StateScope { job: "j".into(), operator: "op".into(), state: "s".into(), key_groups: 4..8, max_key_groups: 8 }
    }

    fn exercise(backend: &dyn StateBackend) {
        let a = "a".to_string();
        let ab = crate::key::encode(&a);
        let long = "x".repeat(40);
        let lb = crate::key::encode(&long);
        let mut s = ValueState::<String, u64>::open(backend, &scope()).unwrap();
        assert_eq!(s.get(4, &a, &ab).unwrap(), None);
        s.update(4, a.clone(), &ab, |v| *v = Some(v.unwrap_or(0) + 5)).unwrap();
        s.update(4, a.clone(), &ab, |v| *v = Some(v.unwrap_or(0) + 5)).unwrap();
        s.update(5, a.clone(), &ab, |v| *v = Some(1)).unwrap();
        s.update(7, long.clone(), &lb, |v| *v = Some(9)).unwrap();
        assert_eq!(s.get(4, &a, &ab).unwrap(), Some(10));
        assert_eq!(s.get(5, &a, &ab).unwrap(), Some(1), "key groups are separate namespaces");
        assert_eq!(s.get(7, &long, &lb).unwrap(), Some(9));
        s.update(4, a.clone(), &ab, |v| *v = None).unwrap();
        assert_eq!(s.get(4, &a, &ab).unwrap(), None);
        let mut seen = Vec::new();
        s.for_each_in_group(7, |k, v| seen.push((k.clone(), *v))).unwrap();
        assert_eq!(seen, vec![(long.clone(), 9)]);
        let mut none = Vec::new();
        s.for_each_in_group(4, |k, v| none.push((k.clone(), *v))).unwrap();
        assert!(none.is_empty(), "a removed key is gone: {none:?}");
    }

    #[test]
    fn memory_objects_and_byte_tables_behave_alike() {
        exercise(&MemoryBackend);
        exercise(&BytesOnly);
    }

    #[test]
    fn a_group_outside_the_range_is_an_internal_error() {
        let mut s = ValueState::<u8, u64>::open(&MemoryBackend, &scope()).unwrap();
        let err = s.update(9, 1, &[1], |_| ()).unwrap_err();
        assert!(err.to_string().contains("key group 9"), "{err}");
    }
}
