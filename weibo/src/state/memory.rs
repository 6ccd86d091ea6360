//! The in-memory backend: live objects, nothing encoded until a checkpoint.

use std::collections::BTreeMap;

use super::{StateBackend, StateScope, StateTable};
use crate::error::Result;

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

/// State in memory as bytes: every value written is encoded and every
/// value read decoded, as on disk. What `weibo::testing` runs its jobs
/// with in place of [`MemoryBackend`], so that a unit test of a pipeline
/// goes through every state value's codec.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct EncodedMemoryBackend;

impl StateBackend for EncodedMemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn open_table(&self, scope: &StateScope) -> Result<Box<dyn StateTable>> {
        MemoryBackend.open_table(scope)
    }
}

/// A byte table in memory, ordered by (group, key).
#[derive(Debug)]
pub(super) struct MemoryTable {
    groups: BTreeMap<u16, BTreeMap<Vec<u8>, Vec<u8>>>,
    #[allow(dead_code)]
    operator: String,
}

impl StateTable for MemoryTable {
    fn entries_in_memory(&self) -> Option<u64> {
        Some(self.groups.values().map(|g| g.len() as u64).sum())
    }

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

    fn scan_from(&mut self, group: u16, from: &[u8], f: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        if let Some(g) = self.groups.get(&group) {
            for (k, v) in g.range::<[u8], _>((std::ops::Bound::Included(from), std::ops::Bound::Unbounded)) {
                if !f(k, v) {
                    break;
                }
            }
        }
        Ok(())
    }
}
