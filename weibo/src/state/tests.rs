//! The keyed state kinds over every backend: value, timer and window
//! state, snapshots, deltas, restores and rescales, against models.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use super::*;
use crate::codec::key::Key;

mod collections;
mod ttl;
use crate::record::{CheckpointId, Timestamp};

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
    fn timers_in_table(&self) -> bool {
        true
    }
}

fn scope() -> StateScope {
    StateScope { job: "j".into(), operator: "op".into(), state: "s".into(), key_groups: 4..8, max_key_groups: 8 }
}

fn exercise(backend: &dyn StateBackend) {
    let a = "a".to_string();
    let ab = crate::codec::key::encode(&a);
    let long = "x".repeat(40);
    let lb = crate::codec::key::encode(&long);
    let mut s = ValueStore::<String, u64>::open(backend, &scope()).unwrap();
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

/// Every backend the shared suite runs on, with what keeps it alive.
fn backends() -> Vec<(Box<dyn StateBackend>, Option<tempfile::TempDir>)> {
    #[cfg_attr(not(feature = "fjall"), allow(unused_mut))]
    let mut all: Vec<(Box<dyn StateBackend>, Option<tempfile::TempDir>)> =
        vec![(Box::new(MemoryBackend), None), (Box::new(BytesOnly), None)];
    #[cfg(feature = "fjall")]
    {
        let dir = tempfile::tempdir().unwrap();
        all.push((Box::new(FjallBackend::open(dir.path()).unwrap()), Some(dir)));
        // Without a cache (every access reads and writes fjall), with
        // room for a handful of entries (write-backs all the time), for
        // some dozens, and for everything; all with timers in fjall
        // (behind the cache, when there is one).
        for bytes in [0, 200, 4_000, 24 << 20] {
            let dir = tempfile::tempdir().unwrap();
            let backend =
                FjallBackend::builder(dir.path()).with_object_cache(bytes).with_timers_on_disk(true).open().unwrap();
            all.push((Box::new(backend), Some(dir)));
        }
    }
    all
}

#[test]
fn every_backend_passes_the_value_state_suite() {
    for (backend, _dir) in backends() {
        exercise(&*backend);
    }
}

/// A record from a hash edge inside the process comes without its
/// key's bytes: a key passed with empty bytes is the same key as with
/// its bytes, on every backend (a byte backend encodes it), and two
/// such keys stay apart.
#[test]
fn keys_passed_without_their_bytes_are_encoded_where_bytes_are_needed() {
    for (backend, _dir) in backends() {
        let mut s = ValueStore::<u64, u64>::open(&*backend, &scope()).unwrap();
        for k in 0u64..300 {
            let bytes = crate::codec::key::encode(&k);
            let (group, given): (u16, &[u8]) = (group_of(k as u8), if k % 2 == 0 { &[] } else { &bytes });
            s.update(group, k, given, |slot| *slot = Some(k * 10)).unwrap();
        }
        for k in 0u64..300 {
            let bytes = crate::codec::key::encode(&k);
            let group = group_of(k as u8);
            let what = format!("{}: key {k}", backend.name());
            assert_eq!(s.get(group, &k, &[]).unwrap(), Some(k * 10), "{what}, read without bytes");
            assert_eq!(s.get(group, &k, &bytes).unwrap(), Some(k * 10), "{what}, read with bytes");
            let old = s.update(group, k, if k % 3 == 0 { &[] } else { &bytes }, |slot| slot.replace(k)).unwrap();
            assert_eq!(old, Some(k * 10), "{what}, updated");
        }
    }
}

fn timers(backend: &dyn StateBackend) {
    let mut t = TimerState::<String>::open(backend, &scope()).unwrap();
    let (a, b) = ("a".to_string(), "b".to_string());
    t.register(20, 4, &a).unwrap();
    t.register(10, 5, &b).unwrap();
    t.register(10, 4, &a).unwrap();
    t.register(10, 4, &a).unwrap();
    assert_eq!(t.len(), 3, "the same timer twice is one");
    assert_eq!(t.next_time(), Some(10));
    assert!(t.pop_due(9).unwrap().is_none(), "nothing is due before 10");
    let (time, mut keys) = t.pop_due(15).unwrap().unwrap();
    keys.sort();
    assert_eq!((time, keys), (10, vec![(a.clone(), 4), (b.clone(), 5)]));
    t.delete(20, 4, &a).unwrap();
    t.delete(20, 5, &b).unwrap();
    assert!(t.is_empty());
    assert!(t.pop_due(i64::MAX).unwrap().is_none());
}

/// Timers keep the same checkpoint entries on every backend: a job
/// moves between backends through a savepoint.
#[test]
fn timers_move_between_backends_through_their_entries() {
    let timers: Vec<(Timestamp, u8)> = (0u8..40).map(|k| (i64::from(k % 7) * 10 - 20, k)).collect();
    let sorted = |mut v: Vec<(Timestamp, u8)>| {
        v.sort_unstable();
        v
    };
    for (from, _a) in backends() {
        let mut t = TimerState::<u8>::open(&*from, &scope()).unwrap();
        for (time, k) in &timers {
            t.register(*time, group_of(*k), k).unwrap();
        }
        let entries = t.export().unwrap();
        for (to, _b) in backends() {
            let mut u = TimerState::<u8>::open(&*to, &StateScope { state: "moved".into(), ..scope() }).unwrap();
            u.import(entries.clone(), "op").unwrap();
            let what = format!("{} -> {}", from.name(), to.name());
            assert_eq!(sorted(u.contents()), sorted(timers.clone()), "{what}");
            assert_eq!((u.len(), u.next_time()), (timers.len(), Some(-20)), "{what}");
            let (time, due) = u.pop_due(-20).unwrap().unwrap();
            assert_eq!((time, due.len()), (-20, 6), "{what}: keys 0, 7, .. 35 at -20");
            assert_eq!(u.next_time(), Some(-10), "{what}");
        }
    }
}

#[test]
fn a_timer_export_holds_the_timers_as_of_the_barrier() {
    let mut t = TimerState::<String>::open(&MemoryBackend, &scope()).unwrap();
    let (a, b, c) = ("a".to_string(), "b".to_string(), "c".to_string());
    t.register(10, 4, &a).unwrap();
    t.register(10, 5, &b).unwrap();
    t.register(20, 4, &a).unwrap();
    let at_barrier = t.snapshot_deferred().unwrap();
    // After the barrier: one timer set at a shared time, one deleted, one due.
    t.register(10, 6, &c).unwrap();
    t.delete(20, 4, &a).unwrap();
    let (time, due) = t.pop_due(15).unwrap().unwrap();
    assert_eq!((time, due.len()), (10, 3), "the live timers changed");
    let mut got: Vec<(Timestamp, String)> = gather(at_barrier)
        .unwrap()
        .entries
        .iter()
        .map(|(_, k, _)| crate::codec::key::decode::<(Timestamp, String)>(k).unwrap())
        .collect();
    got.sort();
    assert_eq!(got, vec![(10, a.clone()), (10, b), (20, a)], "the export did not");
}

#[test]
fn every_backend_passes_the_timer_suite() {
    for (backend, _dir) in backends() {
        timers(&*backend);
    }
}

fn windows(backend: &dyn StateBackend) {
    let mut w = WindowState::<String, u64>::open(backend, &scope()).unwrap();
    let (a, b) = ("a".to_string(), "b".to_string());
    let (ab, bb) = (crate::codec::key::encode(&a), crate::codec::key::encode(&b));
    for (start, key, bytes, group) in [(10, &a, &ab, 4), (0, &b, &bb, 5), (10, &a, &ab, 4), (10, &b, &bb, 5)] {
        w.update(start, group, key.clone(), bytes, |acc| *acc = Some(acc.unwrap_or(0) + 1)).unwrap();
    }
    assert_eq!(w.first_window(), Some(0));
    assert_eq!(w.windows_from(1), vec![10]);
    let mut seen = Vec::new();
    w.for_each_in_window(10, false, |k, g, n| seen.push((k.clone(), g, *n))).unwrap();
    seen.sort();
    assert_eq!(seen, vec![(a.clone(), 4, 2), (b.clone(), 5, 1)]);
    w.update(10, 5, b.clone(), &bb, |acc| *acc = None).unwrap();
    let mut seen = Vec::new();
    w.for_each_in_window(10, true, |k, _, n| seen.push((k.clone(), *n))).unwrap();
    assert_eq!(seen, vec![(a.clone(), 2)], "b was removed; purging takes the rest");
    assert_eq!(w.windows_from(i64::MIN), vec![0]);
    w.for_each_in_window(0, true, |_, _, _| {}).unwrap();
    assert_eq!(w.first_window(), None);
}

#[test]
fn every_backend_passes_the_window_state_suite() {
    for (backend, _dir) in backends() {
        windows(&*backend);
    }
}

#[derive(Clone, Debug)]
enum Op {
    Put(u16, Vec<u8>, Vec<u8>),
    Delete(u16, Vec<u8>),
    Get(u16, Vec<u8>),
    Scan(u16),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    let key = proptest::collection::vec(0u8..4, 0..4);
    prop_oneof![
        (0u16..3, key.clone(), proptest::collection::vec(any::<u8>(), 0..6)).prop_map(|(g, k, v)| Op::Put(g, k, v)),
        (0u16..3, key.clone()).prop_map(|(g, k)| Op::Delete(g, k)),
        (0u16..3, key).prop_map(|(g, k)| Op::Get(g, k)),
        (0u16..3).prop_map(Op::Scan),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// Byte tables against a `BTreeMap` oracle: same answers, and scans
    /// in key order within one key group.
    #[test]
    fn byte_tables_agree_with_a_btreemap(ops in proptest::collection::vec(op(), 1..80)) {
        for (backend, _dir) in backends() {
            let mut table = backend.open_table(&scope()).unwrap();
            let mut oracle: BTreeMap<(u16, Vec<u8>), Vec<u8>> = BTreeMap::new();
            for op in &ops {
                match op {
                    Op::Put(g, k, v) => {
                        table.put(*g, k, v).unwrap();
                        oracle.insert((*g, k.clone()), v.clone());
                    }
                    Op::Delete(g, k) => {
                        table.delete(*g, k).unwrap();
                        oracle.remove(&(*g, k.clone()));
                    }
                    Op::Get(g, k) => {
                        proptest::prop_assert_eq!(table.get(*g, k).unwrap(), oracle.get(&(*g, k.clone())).cloned(), "{}", backend.name());
                    }
                    Op::Scan(g) => {
                        let mut got = Vec::new();
                        table.scan_group(*g, &mut |k, v| got.push((k.to_vec(), v.to_vec()))).unwrap();
                        let want: Vec<(Vec<u8>, Vec<u8>)> =
                            oracle.range((*g, Vec::new())..(*g + 1, Vec::new())).map(|((_, k), v)| (k.clone(), v.clone())).collect();
                        proptest::prop_assert_eq!(got, want, "{}", backend.name());
                    }
                }
            }
        }
    }
}

#[derive(Clone, Debug)]
enum StateOp {
    Set(u8, u64),
    /// Adds to the value in place (`ValueStore::modify`), from 0.
    Add(u8, u64),
    Remove(u8),
    Get(u8),
    Scan(u16),
    /// A checkpoint, which completes or not.
    Checkpoint(bool),
    /// Start over from the last complete checkpoint.
    Restore,
}

fn state_op() -> impl proptest::strategy::Strategy<Value = StateOp> {
    use proptest::prelude::*;
    prop_oneof![
        6 => (0u8..24, 0u64..1000).prop_map(|(k, v)| StateOp::Set(k, v)),
        3 => (0u8..24, 0u64..1000).prop_map(|(k, v)| StateOp::Add(k, v)),
        2 => (0u8..24).prop_map(StateOp::Remove),
        2 => (0u8..24).prop_map(StateOp::Get),
        1 => (4u16..8).prop_map(StateOp::Scan),
        2 => proptest::bool::weighted(0.8).prop_map(StateOp::Checkpoint),
        1 => Just(StateOp::Restore),
    ]
}

/// The key group of a test key.
fn group_of(key: u8) -> u16 {
    4 + u16::from(key % 4)
}

/// In memory, and in the cache in front of fjall, a delta looks up the
/// keys its change log holds; a log that outgrows its bound gives up
/// (deltas scan) until the next base, and a base whose checkpoint fails
/// leaves the next delta scanning. Every checkpoint restores the state
/// as of its barrier.
#[test]
fn change_logs_that_overflow_or_start_at_a_failed_base_fall_back_to_scanning() {
    change_logs_fall_back_to_scanning(&MemoryBackend);
    #[cfg(feature = "fjall")]
    {
        let dir = tempfile::tempdir().unwrap();
        change_logs_fall_back_to_scanning(&FjallBackend::open(dir.path()).unwrap());
        // A cache of a few thousand entries: keys written back to the
        // table between barriers, and read back.
        let dir = tempfile::tempdir().unwrap();
        change_logs_fall_back_to_scanning(
            &FjallBackend::builder(dir.path()).with_object_cache(200_000).open().unwrap(),
        );
    }
}

fn change_logs_fall_back_to_scanning(backend: &dyn StateBackend) {
    let mut s = ValueStore::<u32, u64>::open(backend, &scope()).unwrap();
    let mut oracle: BTreeMap<u32, u64> = BTreeMap::new();
    let mut chain = Chain::new();
    let group = |k: u32| 4 + u16::try_from(k % 4).unwrap();
    let decode = |key: &[u8]| crate::codec::key::decode::<u32>(key).unwrap();
    // Round i takes checkpoint i + 1 (completing or not), then writes
    // keys 0..n with a value.
    let rounds: [(u32, u64, bool); 14] = [
        (100, 1, true),    // 1: the base; logging starts; 100 keys logged
        (40_000, 2, true), // 2: a delta from the log; every key: the logs give up
        (10, 3, true),     // 3: the delta scans
        (10, 4, true),     // 4 to 10: still scanning
        (10, 5, true),
        (10, 6, true),
        (10, 7, true),
        (10, 8, true),
        (10, 9, true),
        (10, 10, true),
        (10, 11, false), // 11: a base, which fails; the logs start at it
        (10, 12, true),  // 12: builds on 10, before the logs' start: scans
        (5, 13, true),   // 13: builds on 12: from the log
        (0, 14, true),   // 14: from the log
    ];
    for (n, value, completes) in rounds {
        let taken = chain.take(
            |n, last| s.snapshot_changes(CheckpointId::new(n), CheckpointId::new(last)).unwrap(),
            completes,
            decode,
        );
        if let Some((n, base, restored)) = taken {
            assert_eq!(restored.len(), oracle.len(), "checkpoint {n} (base: {base})");
            assert!(restored == oracle, "checkpoint {n} (base: {base}) restores another state");
        }
        for k in 0..n {
            s.update(group(k), k, &crate::codec::key::encode(&k), |v| *v = Some(value + u64::from(k))).unwrap();
            oracle.insert(k, value + u64::from(k));
        }
        // A removal and a key set again after it, every round.
        s.update(group(7), 7, &crate::codec::key::encode(&7u32), |v| *v = None).unwrap();
        oracle.remove(&7);
        if value % 2 == 0 {
            s.update(group(7), 7, &crate::codec::key::encode(&7u32), |v| *v = Some(value)).unwrap();
            oracle.insert(7, value);
        }
    }
}

/// The complete checkpoints of a model test, as a restore sees them.
struct Chain<M> {
    /// Checkpoint number → the state it restores.
    complete: BTreeMap<u64, BTreeMap<M, u64>>,
    n: u64,
    last: u64,
}

impl<M: Ord + Clone> Chain<M> {
    fn new() -> Self {
        Self { complete: BTreeMap::new(), n: 0, last: 0 }
    }

    /// Takes the next checkpoint with `export(n, last complete)`; if it
    /// completes, applies its parts as a restore does (part by part,
    /// removals first, on the last complete checkpoint for a delta) and
    /// returns (its number, whether a base, the state it restores).
    fn take(
        &mut self,
        export: impl FnOnce(u64, u64) -> Snapshot,
        completes: bool,
        key: impl Fn(&[u8]) -> M,
    ) -> Option<(u64, bool, BTreeMap<M, u64>)> {
        let snapshot = self.begin(export);
        self.finish(snapshot, completes, key)
    }

    /// Takes the next checkpoint's snapshot, to encode later with
    /// [`Chain::finish`] (before the next is taken).
    fn begin(&mut self, export: impl FnOnce(u64, u64) -> Snapshot) -> Snapshot {
        self.n += 1;
        export(self.n, self.last)
    }

    /// Encodes the snapshot [`Chain::begin`] took, as [`Chain::take`].
    fn finish(
        &mut self,
        snapshot: Snapshot,
        completes: bool,
        key: impl Fn(&[u8]) -> M,
    ) -> Option<(u64, bool, BTreeMap<M, u64>)> {
        let mut parts = Vec::new();
        let base = snapshot(&mut |part| {
            parts.push(part.clone());
            Ok(())
        })
        .unwrap();
        if !completes {
            return None;
        }
        let mut restored = if base { BTreeMap::new() } else { self.restored() };
        for part in &parts {
            for (_, k) in part.part.removed_keys() {
                restored.remove(&key(k));
            }
            for (_, k, v) in part.part.entries() {
                restored.insert(key(k), u64::decode(v).unwrap());
            }
        }
        self.complete.insert(self.n, restored.clone());
        self.last = self.n;
        Some((self.n, base, restored))
    }

    /// The state the last complete checkpoint restores.
    fn restored(&self) -> BTreeMap<M, u64> {
        self.complete.get(&self.last).cloned().unwrap_or_default()
    }

    /// `state` as checkpoint entries, with `key` giving each key's group
    /// and encoding.
    fn entries(state: &BTreeMap<M, u64>, key: impl Fn(&M) -> (u16, Vec<u8>)) -> Entries {
        state
            .iter()
            .map(|(m, v)| {
                let (group, k) = key(m);
                let mut value = Vec::new();
                v.encode(&mut value).unwrap();
                (group, k, value)
            })
            .collect()
    }
}

/// Runs `ops` on value state over `backend` and on a `BTreeMap`: every
/// read agrees, every complete checkpoint (a base, or a delta applied
/// to the checkpoint it builds on) holds exactly the map as of its
/// barrier, and a restore from it goes on from there.
fn model_run(
    backend: &dyn StateBackend,
    ops: &[StateOp],
) -> std::result::Result<(), proptest::test_runner::TestCaseError> {
    use proptest::prop_assert_eq;
    let name = backend.name();
    let k = |key: u8| crate::codec::key::encode(&key);
    let mut run = 0;
    let open = |run: u32| {
        let scope = StateScope { state: format!("s{run}"), ..scope() };
        ValueStore::<u8, u64>::open(backend, &scope).unwrap()
    };
    let mut s = open(run);
    let mut oracle: BTreeMap<u8, u64> = BTreeMap::new();
    let mut chain = Chain::new();
    for op in ops {
        match op {
            StateOp::Set(key, value) => {
                let old = s.update(group_of(*key), *key, &k(*key), |v| v.replace(*value)).unwrap();
                prop_assert_eq!(old, oracle.insert(*key, *value), "{}: old value of {}", name, key);
            }
            StateOp::Add(key, n) => {
                let new = s.modify(
                    group_of(*key),
                    *key,
                    &k(*key),
                    || 0,
                    |v| {
                        *v += n;
                        *v
                    },
                );
                let want = oracle.entry(*key).or_insert(0);
                *want += n;
                prop_assert_eq!(new.unwrap(), *want, "{}: sum of {}", name, key);
            }
            StateOp::Remove(key) => {
                let old = s.update(group_of(*key), *key, &k(*key), Option::take).unwrap();
                prop_assert_eq!(old, oracle.remove(key), "{}: removed value of {}", name, key);
            }
            StateOp::Get(key) => {
                prop_assert_eq!(s.get(group_of(*key), key, &k(*key)).unwrap(), oracle.get(key).copied(), "{}", name);
            }
            StateOp::Scan(group) => {
                let mut got = Vec::new();
                s.for_each_in_group(*group, |key, v| got.push((*key, *v))).unwrap();
                got.sort_unstable();
                let want: Vec<(u8, u64)> =
                    oracle.iter().filter(|(key, _)| group_of(**key) == *group).map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(got, want, "{}: scan of group {}", name, group);
            }
            StateOp::Checkpoint(completes) => {
                let decode = |key: &[u8]| crate::codec::key::decode::<u8>(key).unwrap();
                let taken = chain.take(
                    |n, last| s.snapshot_changes(CheckpointId::new(n), CheckpointId::new(last)).unwrap(),
                    *completes,
                    decode,
                );
                if let Some((n, base, restored)) = taken {
                    prop_assert_eq!(&restored, &oracle, "{}: checkpoint {} (base: {})", name, n, base);
                }
            }
            StateOp::Restore => {
                run += 1;
                s = open(run);
                oracle = chain.restored();
                s.import(Chain::entries(&oracle, |key| (group_of(*key), k(*key)))).unwrap();
            }
        }
    }
    Ok(())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]

    /// Snapshots taken at a barrier and run only after more writes (as a
    /// checkpoint's are, on another thread) hold the state as of the
    /// barrier, on every backend; on the in-memory one those writes go
    /// beside the maps the snapshot shares (`Overlay`) and into them
    /// afterwards. Reads and scans agree with a `BTreeMap` throughout.
    #[test]
    fn exports_hold_the_barrier_while_writes_go_on(
        rounds in proptest::collection::vec(
            proptest::collection::vec((0u8..24, proptest::option::weighted(0.8, 0u64..1000)), 0..12),
            1..12,
        ),
    ) {
        for (backend, _dir) in backends() {
            let mut s = ValueStore::<u8, u64>::open(&*backend, &scope()).unwrap();
            let mut oracle: BTreeMap<u8, u64> = BTreeMap::new();
            let mut chain = Chain::new();
            let write = |s: &mut ValueStore<u8, u64>, oracle: &mut BTreeMap<u8, u64>, key: u8, value: Option<u64>| {
                let k = crate::codec::key::encode(&key);
                let old = match value {
                    // Set in place for odd keys: `modify`, beside a
                    // shared map too. (u64::MAX: none was there.)
                    Some(new) if key % 2 == 1 => s
                        .modify(group_of(key), key, &k, || u64::MAX, |v| Some(std::mem::replace(v, new)))
                        .unwrap()
                        .filter(|old| *old != u64::MAX),
                    _ => s.update(group_of(key), key, &k, |v| std::mem::replace(v, value)).unwrap(),
                };
                let want = match value {
                    Some(v) => oracle.insert(key, v),
                    None => oracle.remove(&key),
                };
                assert_eq!(old, want, "{}: old value of {}", backend.name(), key);
            };
            for (i, writes) in rounds.iter().enumerate() {
                let barrier = oracle.clone();
                let mut after = oracle.clone();
                let decode = |key: &[u8]| crate::codec::key::decode::<u8>(key).unwrap();
                let taken = chain.take(
                    |n, last| {
                        let export = s.snapshot_changes(CheckpointId::new(n), CheckpointId::new(last)).unwrap();
                        // Writes after the barrier, before the snapshot runs.
                        for (key, value) in writes {
                            write(&mut s, &mut after, *key, *value);
                        }
                        export
                    },
                    i % 3 != 2,
                    decode,
                );
                oracle = after;
                if let Some((n, base, restored)) = taken {
                    proptest::prop_assert_eq!(&restored, &barrier, "{}: checkpoint {} (base: {})", backend.name(), n, base);
                }
                for key in 0u8..24 {
                    let got = s.get(group_of(key), &key, &crate::codec::key::encode(&key)).unwrap();
                    proptest::prop_assert_eq!(got, oracle.get(&key).copied(), "{}: {}", backend.name(), key);
                }
                // Scans write the cache back, overlays included: not
                // every round, so that some overlays meet the next barrier.
                for group in (4u16..8).filter(|_| i % 2 == 1) {
                    let mut got = Vec::new();
                    s.for_each_in_group(group, |k, v| got.push((*k, *v))).unwrap();
                    got.sort_unstable();
                    let want: Vec<(u8, u64)> =
                        oracle.iter().filter(|(k, _)| group_of(**k) == group).map(|(k, v)| (*k, *v)).collect();
                    proptest::prop_assert_eq!(got, want, "{}: scan of group {}", backend.name(), group);
                }
            }
        }
    }

    /// Value state on every backend against a `BTreeMap`, across
    /// checkpoints (bases and deltas, some of which do not complete)
    /// and restores.
    #[test]
    fn value_state_agrees_with_a_btreemap_across_checkpoints_and_restores(
        ops in proptest::collection::vec(state_op(), 1..160),
    ) {
        for (backend, _dir) in backends() {
            model_run(&*backend, &ops)?;
        }
    }
}

#[derive(Clone, Debug)]
enum WindowOp {
    Add(i64, u8, u64),
    Remove(i64, u8),
    Purge(i64),
    Checkpoint(bool),
    /// A checkpoint encoded only after the next two other operations
    /// (as a checkpoint's thread does while the worker goes on).
    CheckpointLater(bool),
    Restore,
}

/// An object cache of this many bytes holds one or two of the model's
/// small windows in memory: the budget is split between the window
/// state's two shares (its windows, and the cache in front of its
/// table), 400 bytes each, and a window's map takes about 116, 216 or
/// 416 bytes for up to 3, 7 or 12 keys (of 12), so a window of more
/// than 7 keys always moves to the table.
#[cfg(feature = "fjall")]
const SPILL_CACHE_BYTES: usize = 800;

fn window_op() -> impl proptest::strategy::Strategy<Value = WindowOp> {
    use proptest::prelude::*;
    let start = prop::sample::select(vec![0i64, 10, 20, 30]);
    prop_oneof![
        8 => (start.clone(), 0u8..12, 1u64..100).prop_map(|(s, k, v)| WindowOp::Add(s, k, v)),
        1 => (start.clone(), 0u8..12).prop_map(|(s, k)| WindowOp::Remove(s, k)),
        2 => start.prop_map(WindowOp::Purge),
        2 => proptest::bool::weighted(0.8).prop_map(WindowOp::Checkpoint),
        1 => proptest::bool::weighted(0.8).prop_map(WindowOp::CheckpointLater),
        1 => Just(WindowOp::Restore),
    ]
}

/// Window state against a `BTreeMap` of (window start, key) → sum,
/// across checkpoints (bases and deltas) and restores, as
/// [`model_run`] does for value state.
fn window_model_run(
    backend: &dyn StateBackend,
    ops: &[WindowOp],
) -> std::result::Result<(), proptest::test_runner::TestCaseError> {
    use proptest::prop_assert_eq;
    let name = backend.name();
    let kb = |key: u8| crate::codec::key::encode(&key);
    let open = |run: u32| {
        let scope = StateScope { state: format!("w{run}"), ..scope() };
        WindowState::<u8, u64>::open(backend, &scope).unwrap()
    };
    let contents = |w: &mut WindowState<u8, u64>| {
        let mut all = BTreeMap::new();
        for start in w.windows_from(i64::MIN) {
            w.for_each_in_window(start, false, |k, g, v| {
                assert_eq!(g, group_of(*k));
                all.insert((start, *k), *v);
            })
            .unwrap();
        }
        all
    };
    let mut run = 0;
    let mut w = open(run);
    let mut oracle: BTreeMap<(i64, u8), u64> = BTreeMap::new();
    let mut chain = Chain::new();
    let decode = |key: &[u8]| {
        let (k, start) = crate::codec::key::decode::<(u8, i64)>(key).unwrap();
        (start, k)
    };
    // A snapshot taken and not encoded yet: it, whether it completes,
    // the state at its barrier, and how many operations go before it is.
    type Late = (Snapshot, bool, BTreeMap<(i64, u8), u64>, u32);
    let mut pending: Option<Late> = None;
    let finish = |chain: &mut Chain<(i64, u8)>, late: Late| {
        let (snapshot, completes, barrier, _) = late;
        if let Some((n, base, restored)) = chain.finish(snapshot, completes, decode) {
            prop_assert_eq!(&restored, &barrier, "{}: late checkpoint {} (base: {})", name, n, base);
        }
        Ok(())
    };
    for op in ops {
        let after = matches!(op, WindowOp::Add(..) | WindowOp::Remove(..) | WindowOp::Purge(..));
        if !after && let Some(late) = pending.take() {
            finish(&mut chain, late)?;
        }
        match op {
            WindowOp::Add(start, key, v) => {
                w.update(*start, group_of(*key), *key, &kb(*key), |acc| *acc = Some(acc.unwrap_or(0) + v)).unwrap();
                *oracle.entry((*start, *key)).or_insert(0) += v;
            }
            WindowOp::Remove(start, key) => {
                w.update(*start, group_of(*key), *key, &kb(*key), |acc| *acc = None).unwrap();
                oracle.remove(&(*start, *key));
            }
            WindowOp::Purge(start) => {
                w.for_each_in_window(*start, true, |_, _, _| {}).unwrap();
                oracle.retain(|(s, _), _| s != start);
            }
            WindowOp::CheckpointLater(completes) => {
                let snapshot = chain
                    .begin(|n, last| w.snapshot_changes("op", CheckpointId::new(n), CheckpointId::new(last)).unwrap());
                pending = Some((snapshot, *completes, oracle.clone(), 2));
            }
            WindowOp::Checkpoint(completes) => {
                let taken = chain.take(
                    |n, last| w.snapshot_changes("op", CheckpointId::new(n), CheckpointId::new(last)).unwrap(),
                    *completes,
                    decode,
                );
                if let Some((n, base, restored)) = taken {
                    prop_assert_eq!(&restored, &oracle, "{}: checkpoint {} (base: {})", name, n, base);
                }
            }
            WindowOp::Restore => {
                run += 1;
                w = open(run);
                oracle = chain.restored();
                let entries = Chain::entries(&oracle, |(start, k)| {
                    let mut key = kb(*k);
                    start.encode_key(&mut key);
                    (group_of(*k), key)
                });
                w.import(entries, "op").unwrap();
            }
        }
        prop_assert_eq!(contents(&mut w), oracle.clone(), "{}: after {:?}", name, op);
        if after && let Some((_, _, _, left)) = pending.as_mut() {
            *left -= 1;
            if *left == 0
                && let Some(late) = pending.take()
            {
                finish(&mut chain, late)?;
            }
        }
    }
    if let Some(late) = pending.take() {
        finish(&mut chain, late)?;
    }
    Ok(())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]

    /// Window state on every backend against a `BTreeMap`, across
    /// checkpoints and restores.
    #[test]
    fn window_state_agrees_with_a_btreemap_across_checkpoints_and_restores(
        ops in proptest::collection::vec(window_op(), 1..160),
    ) {
        for (backend, _dir) in backends() {
            window_model_run(&*backend, &ops)?;
        }
        // A budget for one or two windows in memory: windows move to
        // the table and back (purged, opened again) all the time.
        #[cfg(feature = "fjall")]
        {
            let dir = tempfile::tempdir().unwrap();
            let backend = FjallBackend::builder(dir.path()).with_object_cache(SPILL_CACHE_BYTES).open().unwrap();
            window_model_run(&backend, &ops)?;
        }
    }
}

#[derive(Debug, Clone)]
enum TimerOp {
    Set(i64, u8),
    Delete(i64, u8),
    Fire(i64),
    Checkpoint(bool),
    Restore,
}

fn timer_op() -> impl proptest::strategy::Strategy<Value = TimerOp> {
    use proptest::prelude::*;
    let time = prop::sample::select(vec![0i64, 10, 20, 30, 40, 50, 60, 70, 80, 90]);
    prop_oneof![
        6 => (time.clone(), 0u8..10).prop_map(|(t, k)| TimerOp::Set(t, k)),
        2 => (time.clone(), 0u8..10).prop_map(|(t, k)| TimerOp::Delete(t, k)),
        1 => time.prop_map(TimerOp::Fire),
        2 => proptest::bool::weighted(0.8).prop_map(TimerOp::Checkpoint),
        1 => Just(TimerOp::Restore),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// Timers against a `BTreeSet` of (time, key), across checkpoints
    /// (bases and deltas, some not completing; the log of removals is
    /// dropped after a few in tests) and restores from the last
    /// complete one, applied part by part as a restore does. A
    /// checkpoint's snapshot is encoded only at the next checkpoint or
    /// restore (or the end), after the writes in between, as the
    /// snapshot thread may: it must hold the timers of its barrier.
    #[test]
    fn timers_agree_with_a_btreeset_across_checkpoints_and_restores(
        ops in proptest::collection::vec(timer_op(), 1..200),
    ) {
        use proptest::prop_assert_eq;
        use std::collections::BTreeSet;
        for (backend, _dir) in backends() {
        // A restore opens the timers of a fresh state (a job's restore
        // starts from empty tables).
        let mut opened = 0;
        let mut open = || {
            opened += 1;
            let scope = StateScope { state: format!("timers-{opened}"), ..scope() };
            TimerState::<u8>::open(&*backend, &scope).unwrap()
        };
        let contents = |t: &mut TimerState<u8>| -> BTreeSet<(i64, u8)> { t.contents().into_iter().collect() };
        let decode = |key: &[u8]| crate::codec::key::decode::<(i64, u8)>(key).unwrap();
        // Encodes a pending snapshot, and checks it against the oracle
        // of its barrier if its checkpoint completes.
        type Pending = (Snapshot, u64, bool, BTreeSet<(i64, u8)>);
        let finish = |pending: Option<Pending>, complete: &mut (u64, BTreeSet<(i64, u8)>)| -> Result<(), proptest::test_runner::TestCaseError> {
            let Some((export, n, completes, at_barrier)) = pending else { return Ok(()) };
            let mut parts = Vec::new();
            let base = export(&mut |part| {
                parts.push(part.clone());
                Ok(())
            })
            .unwrap();
            if completes {
                let mut restored = if base { BTreeSet::new() } else { complete.1.clone() };
                for part in &parts {
                    for (_, k) in part.part.removed_keys() {
                        restored.remove(&decode(k));
                    }
                    for (g, k, v) in part.part.entries() {
                        prop_assert_eq!(v.len(), 0);
                        prop_assert_eq!(g, group_of(decode(k).1));
                        restored.insert(decode(k));
                    }
                }
                prop_assert_eq!(&restored, &at_barrier, "checkpoint {} (base: {})", n, base);
                *complete = (n, restored);
            }
            Ok(())
        };
        let mut t = open();
        let mut oracle = BTreeSet::new();
        let (mut n, mut complete) = (0u64, (0u64, BTreeSet::new()));
        let mut pending: Option<Pending> = None;
        for op in &ops {
            match op {
                TimerOp::Set(time, k) => {
                    t.register(*time, group_of(*k), k).unwrap();
                    oracle.insert((*time, *k));
                }
                TimerOp::Delete(time, k) => {
                    t.delete(*time, group_of(*k), k).unwrap();
                    oracle.remove(&(*time, *k));
                }
                TimerOp::Fire(watermark) => {
                    while let Some((time, keys)) = t.pop_due(*watermark).unwrap() {
                        for (k, g) in keys {
                            prop_assert_eq!(g, group_of(k));
                            proptest::prop_assert!(oracle.remove(&(time, k)), "fired ({}, {}) twice", time, k);
                        }
                    }
                    proptest::prop_assert!(oracle.iter().all(|(time, _)| time > watermark));
                }
                TimerOp::Checkpoint(completes) => {
                    finish(pending.take(), &mut complete)?;
                    n += 1;
                    let export = t.snapshot_changes(CheckpointId::new(n), CheckpointId::new(complete.0)).unwrap();
                    pending = Some((export, n, *completes, oracle.clone()));
                }
                TimerOp::Restore => {
                    finish(pending.take(), &mut complete)?;
                    t = open();
                    oracle = complete.1.clone();
                    let entries = oracle
                        .iter()
                        .map(|(time, k)| (group_of(*k), crate::codec::key::encode(&(*time, *k)), Vec::new()))
                        .collect();
                    t.import(entries, "op").unwrap();
                }
            }
            prop_assert_eq!(contents(&mut t), oracle.clone(), "{}: after {:?}", backend.name(), op);
            prop_assert_eq!(t.len(), oracle.len());
            prop_assert_eq!(t.next_time(), oracle.first().map(|(time, _)| *time));
        }
        finish(pending.take(), &mut complete)?;
        }
    }
}

#[test]
fn deltas_hold_changes_and_removals_since_the_last_complete_checkpoint() {
    for (backend, _dir) in backends() {
        deltas_on(&*backend);
    }
}

fn deltas_on(backend: &dyn StateBackend) {
    let name = backend.name();
    let mut s = ValueStore::<u8, u64>::open(backend, &scope()).unwrap();
    let k = |key: u8| crate::codec::key::encode(&key);
    for key in [1u8, 2, 3] {
        s.update(4, key, &k(key), |v| *v = Some(u64::from(key))).unwrap();
    }
    let first = gather(s.snapshot_changes(CheckpointId::new(1), CheckpointId::new(0)).unwrap()).unwrap();
    assert!(first.base && first.entries.len() == 3, "the first export is a base");
    // Checkpoint 1 completed. Remove 1, change 2.
    s.update(4, 1, &k(1), |v| *v = None).unwrap();
    s.update(4, 2, &k(2), |v| *v = Some(20)).unwrap();
    let delta = gather(s.snapshot_changes(CheckpointId::new(2), CheckpointId::new(1)).unwrap()).unwrap();
    assert!(!delta.base);
    let mut twenty = Vec::new();
    20u64.encode(&mut twenty).unwrap();
    assert_eq!(delta.entries, vec![(4, k(2), twenty)], "{name}");
    assert_eq!(delta.removed, vec![(4, k(1))], "{name}");
    // Checkpoints 2..=10 never complete; export 11 is a base, which
    // fails too: export 12 must still carry the removal of 1.
    for n in 3..=10 {
        assert!(!gather(s.snapshot_changes(CheckpointId::new(n), CheckpointId::new(1)).unwrap()).unwrap().base);
    }
    assert!(
        gather(s.snapshot_changes(CheckpointId::new(11), CheckpointId::new(1)).unwrap()).unwrap().base,
        "every tenth export is a base"
    );
    let after_failed_base = gather(s.snapshot_changes(CheckpointId::new(12), CheckpointId::new(1)).unwrap()).unwrap();
    assert!(!after_failed_base.base);
    assert_eq!(after_failed_base.removed, vec![(4, k(1))], "{name}: the removal survives the failed base");
    assert!(after_failed_base.entries.iter().any(|(_, key, _)| *key == k(2)));
    // Once a checkpoint after the removal completes, it is not written again.
    let later = gather(s.snapshot_changes(CheckpointId::new(13), CheckpointId::new(12)).unwrap()).unwrap();
    assert!(later.removed.is_empty() && later.entries.is_empty(), "{name}: {later:?}");
}

#[test]
fn after_a_restore_deltas_wait_for_a_complete_checkpoint_of_this_run() {
    let k = |key: u8| crate::codec::key::encode(&key);
    for (backend, _dir) in backends() {
        let name = backend.name();
        // Restored from checkpoint 5: the first checkpoint of this run is 6.
        let mut s = ValueStore::<u8, u64>::open(&*backend, &scope()).unwrap();
        s.update(4, 1, &k(1), |v| *v = Some(1)).unwrap();
        assert!(
            gather(s.snapshot_changes(CheckpointId::new(6), CheckpointId::new(5)).unwrap()).unwrap().base,
            "{name}"
        );
        s.update(4, 2, &k(2), |v| *v = Some(2)).unwrap();
        // Checkpoint 6 failed: 7 cannot build on 5, which lacks key 1.
        let seventh = gather(s.snapshot_changes(CheckpointId::new(7), CheckpointId::new(5)).unwrap()).unwrap();
        assert!(seventh.base && seventh.entries.len() == 2, "{name}: {seventh:?}");
        // Checkpoint 7 completed: 8 builds on it.
        s.update(4, 3, &k(3), |v| *v = Some(3)).unwrap();
        let eighth = gather(s.snapshot_changes(CheckpointId::new(8), CheckpointId::new(7)).unwrap()).unwrap();
        assert!(!eighth.base, "{name}");
        assert_eq!(eighth.entries.iter().map(|(_, key, _)| key.clone()).collect::<Vec<_>>(), vec![k(3)], "{name}");
    }
}

#[test]
fn changes_are_logged_only_from_the_first_checkpoint_on() {
    let k = |key: u8| crate::codec::key::encode(&key);
    for (backend, _dir) in backends() {
        let name = backend.name();
        let mut s = ValueStore::<u8, u64>::open(&*backend, &scope()).unwrap();
        let logged = |s: &ValueStore<u8, u64>| s.logged();
        for key in 0..50u8 {
            s.update(4, key, &k(key), |v| *v = Some(1)).unwrap();
            s.update(4, key, &k(key), |v| *v = None).unwrap();
        }
        assert_eq!(logged(&s), 0, "{name}: a job without checkpoints keeps no change log");
        s.update(4, 60, &k(60), |v| *v = Some(1)).unwrap();
        let first = gather(s.snapshot_changes(CheckpointId::new(1), CheckpointId::new(0)).unwrap()).unwrap();
        assert!(first.base && first.entries.len() == 1, "{name}: {first:?}");
        s.update(4, 60, &k(60), |v| *v = None).unwrap();
        s.update(4, 1, &k(1), |v| *v = Some(1)).unwrap();
        s.update(4, 1, &k(1), |v| *v = None).unwrap();
        let delta = gather(s.snapshot_changes(CheckpointId::new(2), CheckpointId::new(1)).unwrap()).unwrap();
        assert!(delta.entries.is_empty(), "{name}: {delta:?}");
        assert!(delta.removed.contains(&(4, k(60))), "{name}: after the first checkpoint a removal is kept: {delta:?}");
    }
}

#[test]
fn a_group_outside_the_range_is_an_internal_error() {
    let mut s = ValueStore::<u8, u64>::open(&MemoryBackend, &scope()).unwrap();
    let err = s.update(9, 1, &[1], |_| ()).unwrap_err();
    assert!(err.to_string().contains("key group 9"), "{err}");
}
