//! Broadcast state: a map every instance of a keyed operator keeps whole,
//! written by the records of its broadcast input (which reach every
//! instance) and read by the keyed records (Flink's broadcast state of a
//! `KeyedBroadcastProcessFunction`).
//!
//! The map lives in memory (broadcast state is small by nature: rules,
//! configuration, reference data). Each instance checkpoints its copy,
//! whole, as entries of the first key group it owns; a restore gives every
//! instance the entries of all key groups, so that any number of instances
//! starts from the copies the old ones wrote. The copies are the same when
//! every instance applied the same broadcast records in the same order:
//! records of one broadcast partition reach every instance in order; those
//! of several partitions may interleave differently per instance, so
//! updates that depend on their order across partitions make copies that
//! differ (as in Flink), and a restore then keeps, for each key, one copy's
//! value.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::{Error, Result};
use crate::metrics::StateStats;
use crate::operator::function::NamedStore;
use crate::operator::outputs::{OutputTag, Sides};
use crate::record::{Batch, Meta, Timestamp};
use crate::state::{Barrier, EntryRef, KeyedState, RemovedRef, Snapshot, SnapshotPart};

/// A handle on a broadcast map, declared with
/// [`States::broadcast`](crate::process::States::broadcast): written
/// through [`BroadcastContext::broadcast`] (the broadcast input's
/// function), read through
/// [`ProcessContext::broadcast`](crate::process::ProcessContext::broadcast)
/// (the keyed input's).
pub struct BroadcastState<UK, UV> {
    pub(crate) owner: u32,
    pub(crate) index: usize,
    pub(crate) _types: PhantomData<fn() -> (UK, UV)>,
}

impl<UK, UV> Clone for BroadcastState<UK, UV> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<UK, UV> Copy for BroadcastState<UK, UV> {}

impl<UK, UV> fmt::Debug for BroadcastState<UK, UV> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BroadcastState").field("index", &self.index).finish_non_exhaustive()
    }
}

/// One instance's copy of a broadcast map: values by encoded key (in key
/// order), checkpointed whole in key group `group`.
pub(crate) struct BroadcastStore<UK, UV> {
    entries: BTreeMap<Vec<u8>, UV>,
    group: u16,
    _key: PhantomData<fn() -> UK>,
}

impl<UK: Key, UV: Data> BroadcastStore<UK, UV> {
    /// An empty map, checkpointed as entries of key group `group` (the
    /// first the instance owns).
    pub(crate) fn new(group: u16) -> Self {
        Self { entries: BTreeMap::new(), group, _key: PhantomData }
    }
}

impl<UK: Key, UV: Data> KeyedState for BroadcastStore<UK, UV> {
    fn snapshot_at(&mut self, operator: &str, _at: Option<Barrier>) -> Result<Snapshot> {
        // Always a base: the map is small, and a base never depends on
        // what another instance's chain holds.
        let mut part = SnapshotPart::new(true);
        for (key, value) in &self.entries {
            part.part.keys.extend_from_slice(key);
            if let Err(e) = value.encode(&mut part.part.values) {
                return Err(codec_error(operator, e));
            }
            part.part.end_entry(self.group)?;
        }
        Ok(Box::new(move |sink| {
            if !part.part.is_empty() {
                sink(&part)?;
            }
            Ok(true)
        }))
    }

    fn import_part(&mut self, operator: &str, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        for (_, key) in removed {
            self.entries.remove(*key);
        }
        for (_, key, value) in entries.iter() {
            let value = UV::decode(value).map_err(|e| codec_error(operator, e))?;
            self.entries.insert(key.to_vec(), value);
        }
        Ok(())
    }

    fn stats(&self) -> StateStats {
        StateStats::in_memory(self.entries.len(), std::mem::size_of::<(Vec<u8>, UV)>())
    }
}

impl<K, UK: Key, UV: Data> NamedStore<K> for BroadcastStore<UK, UV> {
    fn as_any(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// Finds the broadcast store `handle` names among `stores`, or records why
/// not in `error`.
pub(crate) fn store<'s, K, UK: Key, UV: Data>(
    stores: &'s mut [Box<dyn NamedStore<K>>],
    owner: u32,
    handle: &BroadcastState<UK, UV>,
    operator: &str,
    error: &mut Option<Error>,
) -> Option<&'s mut BroadcastStore<UK, UV>> {
    let found = if owner == handle.owner {
        stores.get_mut(handle.index).and_then(|s| s.as_any().downcast_mut::<BroadcastStore<UK, UV>>())
    } else {
        None
    };
    if found.is_none() {
        error.get_or_insert_with(|| Error::State {
            operator: operator.to_string(),
            message: "a broadcast state handle was used on an operator that did not declare it: each operator \
                      reaches only the states its own declaration returned"
                .to_string(),
            source: None,
        });
    }
    found
}

/// A codec error of `operator`'s broadcast state.
fn codec_error(operator: &str, source: crate::codec::CodecError) -> Error {
    Error::Codec { operator: operator.to_string(), source }
}

fn encoded<UK: Key>(key: &UK) -> Vec<u8> {
    let mut bytes = Vec::new();
    key.encode_key(&mut bytes);
    bytes
}

/// A broadcast map as the keyed input's function sees it: read only, the
/// same on every instance.
pub struct Broadcast<'a, UK, UV> {
    pub(crate) store: Option<&'a BroadcastStore<UK, UV>>,
    pub(crate) error: &'a mut Option<Error>,
    pub(crate) operator: &'a str,
}

impl<UK: Key, UV: Data> Broadcast<'_, UK, UV> {
    /// The value at `key`, if any.
    pub fn get(&self, key: &UK) -> Option<UV> {
        self.store.and_then(|s| s.entries.get(&encoded(key)).cloned())
    }

    /// Whether the map has `key`.
    pub fn contains(&self, key: &UK) -> bool {
        self.store.is_some_and(|s| s.entries.contains_key(&encoded(key)))
    }

    /// Calls `f` with each entry in key order, while it returns `true`.
    pub fn for_each(&mut self, f: impl FnMut(UK, UV) -> bool) {
        if let Some(store) = self.store {
            for_each(store, self.operator, self.error, f);
        }
    }

    /// The entries, in key order.
    pub fn entries(&mut self) -> Vec<(UK, UV)> {
        let mut all = Vec::new();
        self.for_each(|k, v| {
            all.push((k, v));
            true
        });
        all
    }

    /// How many entries the map has.
    pub fn len(&self) -> usize {
        self.store.map_or(0, |s| s.entries.len())
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn for_each<UK: Key, UV: Data>(
    store: &BroadcastStore<UK, UV>,
    operator: &str,
    error: &mut Option<Error>,
    mut f: impl FnMut(UK, UV) -> bool,
) {
    for (key, value) in &store.entries {
        let mut bytes = key.as_slice();
        match UK::decode_key(&mut bytes) {
            Ok(k) => {
                if !f(k, value.clone()) {
                    return;
                }
            }
            Err(e) => {
                error.get_or_insert_with(|| Error::State {
                    operator: operator.to_string(),
                    message: format!("a broadcast state key does not decode: {e}"),
                    source: None,
                });
                return;
            }
        }
    }
}

/// A broadcast map as the broadcast input's function sees it: read and
/// written (every instance applies the same records to its copy).
pub struct BroadcastMut<'a, UK, UV> {
    store: Option<&'a mut BroadcastStore<UK, UV>>,
    error: &'a mut Option<Error>,
    operator: &'a str,
}

impl<UK: Key, UV: Data> BroadcastMut<'_, UK, UV> {
    /// The value at `key`, if any.
    pub fn get(&self, key: &UK) -> Option<UV> {
        self.store.as_ref().and_then(|s| s.entries.get(&encoded(key)).cloned())
    }

    /// Whether the map has `key`.
    pub fn contains(&self, key: &UK) -> bool {
        self.store.as_ref().is_some_and(|s| s.entries.contains_key(&encoded(key)))
    }

    /// Sets the value at `key`.
    pub fn put(&mut self, key: UK, value: UV) {
        if let Some(s) = self.store.as_mut() {
            s.entries.insert(encoded(&key), value);
        }
    }

    /// Removes `key`, returning its value if it had one.
    pub fn remove(&mut self, key: &UK) -> Option<UV> {
        self.store.as_mut().and_then(|s| s.entries.remove(&encoded(key)))
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        if let Some(s) = self.store.as_mut() {
            s.entries.clear();
        }
    }

    /// Calls `f` with each entry in key order, while it returns `true`.
    pub fn for_each(&mut self, f: impl FnMut(UK, UV) -> bool) {
        if let Some(store) = self.store.as_deref() {
            for_each(store, self.operator, self.error, f);
        }
    }

    /// The entries, in key order.
    pub fn entries(&mut self) -> Vec<(UK, UV)> {
        let mut all = Vec::new();
        self.for_each(|k, v| {
            all.push((k, v));
            true
        });
        all
    }

    /// How many entries the map has.
    pub fn len(&self) -> usize {
        self.store.as_ref().map_or(0, |s| s.entries.len())
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the broadcast input's function sees for one record: the broadcast
/// states (to write), where results and side outputs go, the record's time
/// and the operator's watermark. It has no key, so no keyed state and no
/// timers.
pub struct BroadcastContext<'a, K, U> {
    pub(crate) operator: &'a str,
    pub(crate) owner: u32,
    pub(crate) stores: &'a mut [Box<dyn NamedStore<K>>],
    pub(crate) sides: &'a mut Sides,
    pub(crate) error: &'a mut Option<Error>,
    pub(crate) out: &'a mut Batch<U>,
    pub(crate) meta: Meta,
    pub(crate) now: Timestamp,
}

impl<K, U> fmt::Debug for BroadcastContext<'_, K, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BroadcastContext").field("meta", &self.meta).finish_non_exhaustive()
    }
}

impl<K, U> BroadcastContext<'_, K, U> {
    /// This instance's copy of the broadcast map `state`, to read and
    /// write.
    pub fn broadcast<UK: Key, UV: Data>(&mut self, state: &BroadcastState<UK, UV>) -> BroadcastMut<'_, UK, UV> {
        let store = store(self.stores, self.owner, state, self.operator, self.error);
        BroadcastMut { store, error: &mut *self.error, operator: self.operator }
    }

    /// Emits a result, with the broadcast record's metadata. Each instance
    /// runs the function for the record: a result emitted here comes out
    /// once per instance.
    pub fn emit(&mut self, value: U) {
        self.out.push(value, self.meta);
    }

    /// Sends `value` to the side output `tag`, with the metadata `emit`
    /// gives its results.
    pub fn output<V: Clone + Send + 'static>(&mut self, tag: &OutputTag<V>, value: V) {
        if let Err(e) = self.sides.send(tag, value, self.meta, self.operator) {
            self.error.get_or_insert(e);
        }
    }

    /// The broadcast record's event time, if it has one.
    pub fn timestamp(&self) -> Option<Timestamp> {
        (self.meta.timestamp != crate::record::NO_TIMESTAMP).then_some(self.meta.timestamp)
    }

    /// The operator's watermark.
    pub fn watermark(&self) -> Timestamp {
        self.meta.watermark
    }

    /// The processing time when the call began.
    pub fn processing_time(&self) -> Timestamp {
        self.now
    }
}

/// What the function of an operator's main input sees for one record when
/// that input is not keyed ([`Stream::connect_broadcast`](crate::Stream::connect_broadcast)):
/// the broadcast states (to read), where results and side outputs go, the
/// record's time and the operator's watermark. It has no key, so no keyed
/// state and no timers (as Flink's `BroadcastProcessFunction`).
pub struct BroadcastReadContext<'a, U>(pub(crate) BroadcastContext<'a, (), U>);

impl<U> fmt::Debug for BroadcastReadContext<'_, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BroadcastReadContext").field("meta", &self.0.meta).finish_non_exhaustive()
    }
}

impl<U> BroadcastReadContext<'_, U> {
    /// This instance's copy of the broadcast map `state`, to read (the
    /// broadcast input's function writes it).
    pub fn broadcast<UK: Key, UV: Data>(&mut self, state: &BroadcastState<UK, UV>) -> Broadcast<'_, UK, UV> {
        let c = &mut self.0;
        let store = store(c.stores, c.owner, state, c.operator, c.error).map(|s| &*s);
        Broadcast { store, error: &mut *c.error, operator: c.operator }
    }

    /// Emits a result; it carries the input record's metadata.
    pub fn emit(&mut self, value: U) {
        self.0.emit(value);
    }

    /// Emits a result with event time `timestamp` instead of the input
    /// record's.
    pub fn emit_at(&mut self, value: U, timestamp: Timestamp) {
        self.0.out.push(value, Meta { timestamp, ..self.0.meta });
    }

    /// Sends `value` to the side output `tag`, with the metadata `emit`
    /// gives its results.
    pub fn output<V: Clone + Send + 'static>(&mut self, tag: &OutputTag<V>, value: V) {
        self.0.output(tag, value);
    }

    /// The record's event time, if it has one.
    pub fn timestamp(&self) -> Option<Timestamp> {
        self.0.timestamp()
    }

    /// The operator's watermark.
    pub fn watermark(&self) -> Timestamp {
        self.0.watermark()
    }

    /// The processing time when the call began.
    pub fn processing_time(&self) -> Timestamp {
        self.0.processing_time()
    }
}

/// What an operator with a broadcast input that is not keyed declares:
/// its broadcast states and side outputs (no keyed state: its main input
/// has no key).
pub struct BroadcastStates {
    pub(crate) states: crate::operator::function::States<()>,
}

impl fmt::Debug for BroadcastStates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BroadcastStates").finish_non_exhaustive()
    }
}

impl BroadcastStates {
    /// Declares a broadcast map named `name`, as
    /// [`States::broadcast`](crate::process::States::broadcast) does.
    pub fn broadcast<UK: Key, UV: Data>(&mut self, name: &str) -> BroadcastState<UK, UV> {
        self.states.broadcast(name)
    }

    /// Declares the side output `tag`, as
    /// [`States::side_output`](crate::process::States::side_output) does.
    pub fn side_output<V: Clone + Send + 'static>(&mut self, tag: &OutputTag<V>) -> OutputTag<V> {
        self.states.side_output(tag)
    }
}
