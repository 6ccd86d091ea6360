//! Map and list state on every backend against models: reads, ordered and
//! ranged iteration, checkpoints (bases and deltas, some never
//! completing), and restores onto 1, 3 and 2 instances (a rescale moves
//! each key's entries with its key group).

#![allow(clippy::indexing_slicing, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::ops::Bound;

use super::backends;
use crate::codec::Data;
use crate::codec::key::{encode, key_group};
use crate::state::{
    Barrier, EntryRef, KeyedState, ListStore, MapStore, RemovedRef, StateBackend, StateScope, encoded_range,
};

const GROUPS: u16 = 8;

/// The key groups of each instance, per layout.
const LAYOUTS: [&[(u16, u16)]; 3] = [&[(0, 8)], &[(0, 3), (3, 6), (6, 8)], &[(0, 4), (4, 8)]];

#[derive(Clone, Debug)]
enum Op {
    Put(u8, u16, u64),
    Remove(u8, u16),
    Get(u8, u16),
    Iterate(u8),
    Range(u8, u16, u16),
    Clear(u8),
    Add(u8, u64),
    List(u8),
    ClearList(u8),
    Checkpoint(bool),
    Restore(usize),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        8 => (0u8..12, 0u16..40, 0u64..1000).prop_map(|(k, u, v)| Op::Put(k, u, v)),
        3 => (0u8..12, 0u16..40).prop_map(|(k, u)| Op::Remove(k, u)),
        3 => (0u8..12, 0u16..40).prop_map(|(k, u)| Op::Get(k, u)),
        2 => (0u8..12).prop_map(Op::Iterate),
        2 => (0u8..12, 0u16..40, 0u16..40).prop_map(|(k, a, b)| Op::Range(k, a.min(b), a.max(b))),
        1 => (0u8..12).prop_map(Op::Clear),
        6 => (0u8..12, 0u64..1000).prop_map(|(k, v)| Op::Add(k, v)),
        2 => (0u8..12).prop_map(Op::List),
        1 => (0u8..12).prop_map(Op::ClearList),
        2 => proptest::bool::weighted(0.8).prop_map(Op::Checkpoint),
        1 => (0usize..3).prop_map(Op::Restore),
    ]
}

fn group(key: u8) -> u16 {
    key_group(&encode(&key), GROUPS)
}

/// One operator instance: a map state and a list state.
struct Instance {
    groups: (u16, u16),
    map: MapStore<u8, u16, u64>,
    list: ListStore<u8, u64>,
}

/// A checkpoint's entries of one state, as a restore applies them: by
/// (key group, key).
type Restored = BTreeMap<(u16, Vec<u8>), Vec<u8>>;

fn open(backend: &dyn StateBackend, run: usize, layout: &[(u16, u16)]) -> Vec<Instance> {
    layout
        .iter()
        .enumerate()
        .map(|(i, &(from, to))| {
            let scope = |state: &str| StateScope::new("j", "op", format!("{state}{run}x{i}"), from..to, GROUPS);
            Instance {
                groups: (from, to),
                map: MapStore::open(backend, &scope("map")).unwrap(),
                list: ListStore::open(backend, &scope("list")).unwrap(),
            }
        })
        .collect()
}

/// Applies one instance's snapshot to `restored` as a complete checkpoint
/// would be restored: a base replaces its key groups, a delta removes then
/// puts.
fn apply(state: &mut dyn KeyedState, at: Barrier, groups: (u16, u16), restored: &mut Option<&mut Restored>) {
    let snapshot = state.snapshot_at("op", Some(at)).unwrap();
    let mut parts = Vec::new();
    let base = snapshot(&mut |part| {
        parts.push(part.clone());
        Ok(())
    })
    .unwrap();
    let Some(restored) = restored else { return };
    if base {
        restored.retain(|(g, _), _| !(groups.0..groups.1).contains(g));
    }
    for part in &parts {
        for (g, k) in part.part.removed_keys() {
            restored.remove(&(g, k.to_vec()));
        }
        for (g, k, v) in part.part.entries() {
            restored.insert((g, k.to_vec()), v.to_vec());
        }
    }
}

/// Loads the entries of `restored` in `state`'s key groups into it.
fn load(state: &mut dyn KeyedState, groups: (u16, u16), restored: &Restored) {
    let mut entries: Vec<EntryRef<'_>> = restored
        .iter()
        .filter(|((g, _), _)| (groups.0..groups.1).contains(g))
        .map(|((g, k), v)| (*g, k.as_slice(), v.as_slice()))
        .collect();
    let removed: Vec<RemovedRef<'_>> = Vec::new();
    state.import_part("op", &mut entries, &removed).unwrap();
}

fn run(backend: &dyn StateBackend, ops: &[Op]) -> Result<(), proptest::test_runner::TestCaseError> {
    use proptest::prop_assert_eq;
    let name = backend.name();
    let mut runs = 0;
    let mut instances = open(backend, runs, LAYOUTS[0]);
    let mut map: BTreeMap<(u8, u16), u64> = BTreeMap::new();
    let mut lists: BTreeMap<u8, Vec<u64>> = BTreeMap::new();
    // The last complete checkpoint's state, and its model.
    let (mut map_restored, mut list_restored) = (Restored::new(), Restored::new());
    let mut complete = (BTreeMap::new(), BTreeMap::new());
    let (mut n, mut last) = (0u64, 0u64);
    for op in ops {
        let owner = |key: u8, instances: &mut Vec<Instance>| -> usize {
            let g = group(key);
            instances.iter().position(|i| (i.groups.0..i.groups.1).contains(&g)).unwrap()
        };
        match *op {
            Op::Put(k, u, v) => {
                let i = owner(k, &mut instances);
                instances[i].map.put(group(k), &k, &encode(&k), u, v).unwrap();
                map.insert((k, u), v);
            }
            Op::Remove(k, u) => {
                let i = owner(k, &mut instances);
                // Some removals pass no key bytes (a typed edge's record).
                let bytes = if u % 2 == 0 { Vec::new() } else { encode(&k) };
                let got = instances[i].map.remove(group(k), &k, &bytes, u).unwrap();
                prop_assert_eq!(got, map.remove(&(k, u)), "{}: remove {} {}", name, k, u);
            }
            Op::Get(k, u) => {
                let i = owner(k, &mut instances);
                let got = instances[i].map.get(group(k), &k, &encode(&k), &u).unwrap();
                prop_assert_eq!(got, map.get(&(k, u)).copied(), "{}: get {} {}", name, k, u);
            }
            Op::Iterate(k) | Op::Range(k, ..) => {
                let all = (Bound::Unbounded, Bound::Unbounded);
                let (range, lo, hi) = match *op {
                    Op::Range(_, lo, hi) => (encoded_range(&(lo..hi)), lo, hi),
                    _ => (all.clone(), 0, u16::MAX),
                };
                let want: Vec<(u16, u64)> = map
                    .range((k, lo)..=(k, hi))
                    .filter(|((_, u), _)| matches!(op, Op::Iterate(_)) || *u < hi)
                    .map(|(&(_, u), &v)| (u, v))
                    .collect();
                let i = owner(k, &mut instances);
                let mut got = Vec::new();
                instances[i]
                    .map
                    .for_each(group(k), &k, &encode(&k), &range, |u, v| {
                        got.push((u, v));
                        true
                    })
                    .unwrap();
                prop_assert_eq!(got, want, "{}: entries of {} in {}..{}", name, k, lo, hi);
                let mut empty = true;
                instances[i]
                    .map
                    .for_each(group(k), &k, &[], &all, |_, _| {
                        empty = false;
                        false
                    })
                    .unwrap();
                let is_empty = instances[i].map.is_empty(group(k), &k, &encode(&k)).unwrap();
                prop_assert_eq!(is_empty, empty, "{}: emptiness of {}", name, k);
            }
            Op::Clear(k) => {
                let i = owner(k, &mut instances);
                instances[i].map.clear(group(k), &k, &encode(&k)).unwrap();
                map.retain(|(key, _), _| *key != k);
            }
            Op::Add(k, v) => {
                let i = owner(k, &mut instances);
                instances[i].list.add(group(k), &k, &encode(&k), v).unwrap();
                lists.entry(k).or_default().push(v);
            }
            Op::List(k) => {
                let i = owner(k, &mut instances);
                let mut got = Vec::new();
                instances[i]
                    .list
                    .for_each(group(k), &k, &encode(&k), |v| {
                        got.push(v);
                        true
                    })
                    .unwrap();
                let want = lists.get(&k).cloned().unwrap_or_default();
                prop_assert_eq!(got, want, "{}: list of {}", name, k);
            }
            Op::ClearList(k) => {
                let i = owner(k, &mut instances);
                instances[i].list.clear(group(k), &k, &[]).unwrap();
                lists.remove(&k);
            }
            Op::Checkpoint(completes) => {
                n += 1;
                let at = Barrier::new(crate::record::CheckpointId::new(n), crate::record::CheckpointId::new(last));
                let (mut m, mut l) = (map_restored.clone(), list_restored.clone());
                for inst in &mut instances {
                    apply(&mut inst.map, at, inst.groups, &mut completes.then_some(&mut m));
                    apply(&mut inst.list, at, inst.groups, &mut completes.then_some(&mut l));
                }
                if completes {
                    last = n;
                    (map_restored, list_restored) = (m, l);
                    complete = (map.clone(), lists.clone());
                    // The checkpoint holds the state as of its barrier.
                    let mut decoded = BTreeMap::new();
                    for ((_, key), value) in &map_restored {
                        let (k, u) = crate::codec::key::decode::<(u8, u16)>(key).unwrap();
                        decoded.insert((k, u), u64::decode(value).unwrap());
                    }
                    prop_assert_eq!(&decoded, &map, "{}: map entries of checkpoint {}", name, n);
                }
            }
            Op::Restore(to) => {
                runs += 1;
                instances = open(backend, runs, LAYOUTS[to]);
                for inst in &mut instances {
                    load(&mut inst.map, inst.groups, &map_restored);
                    load(&mut inst.list, inst.groups, &list_restored);
                }
                (map, lists) = complete.clone();
            }
        }
    }
    Ok(())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 32, ..Default::default() })]

    /// Map and list state on every backend agree with a `BTreeMap` and
    /// vectors through writes, iteration, checkpoints and restores onto
    /// other numbers of instances; a list keeps its order across them.
    #[test]
    fn map_and_list_state_agree_with_models_across_checkpoints_and_rescales(
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        for (backend, _dir) in backends() {
            run(&*backend, &ops)?;
        }
    }
}

/// Iteration reads a long map a chunk at a time and still visits every
/// entry once, in order, on every backend; `prefix` scans reach only the
/// entries under the prefix.
#[test]
fn long_maps_iterate_in_order_across_chunks() {
    for (backend, _dir) in backends() {
        let scope = StateScope::new("j", "op", "long", 0..GROUPS, GROUPS);
        let mut m = MapStore::<String, (u8, u32), u32>::open(&*backend, &scope).unwrap();
        let key = "k".to_string();
        let g = key_group(&encode(&key), GROUPS);
        for i in (0..1_000u32).rev() {
            m.put(g, &key, &[], ((i % 3) as u8, i), i).unwrap();
        }
        // Another key's entries sit right after this key's in byte order.
        m.put(key_group(&encode(&"k\0".to_string()), GROUPS), &"k\0".to_string(), &[], (0, 0), 7).unwrap();
        let mut seen = Vec::new();
        m.for_each(g, &key, &[], &(Bound::Unbounded, Bound::Unbounded), |uk, v| {
            seen.push((uk, v));
            true
        })
        .unwrap();
        let mut want: Vec<((u8, u32), u32)> = (0..1_000u32).map(|i| (((i % 3) as u8, i), i)).collect();
        want.sort_unstable();
        assert_eq!(seen, want, "{}", backend.name());
        let mut under = Vec::new();
        m.for_each(g, &key, &[], &crate::state::prefix_range(&1u8), |uk, _| {
            under.push(uk);
            true
        })
        .unwrap();
        assert_eq!(under.len(), 333, "{}", backend.name());
        assert!(under.iter().all(|(p, _)| *p == 1), "{}", backend.name());
    }
}

/// A list's index holds sequence numbers in the order of their encodings,
/// whatever order a restore gives them in, and answers ranges as a map's
/// index would.
#[test]
fn a_lists_index_orders_sequence_numbers_as_their_encodings() {
    use crate::state::{OrderedKeys, Sequence, UserKeys};
    for seq in [0u64, 7, 255, 256, u64::MAX] {
        assert_eq!(encode(&seq), seq.to_be_bytes(), "a u64's encoding is its big-endian bytes");
    }
    let (mut list, mut map) = (Sequence::default(), OrderedKeys::<u64>::default());
    for seq in [5u64, 1, 300, 2, 299, 1, 70_000] {
        list.record(&encode(&seq), seq);
        map.record(&encode(&seq), seq);
    }
    list.forget(&encode(&2u64));
    map.forget(&encode(&2u64));
    let bounds = [
        (Bound::Unbounded, Bound::Unbounded),
        (Bound::Included(encode(&5u64)), Bound::Excluded(encode(&300u64))),
        (Bound::Excluded(encode(&5u64)), Bound::Included(encode(&300u64))),
        (Bound::Excluded(encode(&1u64)), Bound::Unbounded),
    ];
    for (from, end) in &bounds {
        let from = match from {
            Bound::Included(b) => Bound::Included(b.as_slice()),
            Bound::Excluded(b) => Bound::Excluded(b.as_slice()),
            Bound::Unbounded => Bound::Unbounded,
        };
        for limit in [0, 2, 10] {
            assert_eq!(list.read(from, end, limit), map.read(from, end, limit), "{from:?}..{end:?}, {limit}");
        }
    }
    assert_eq!(list.into_keys(), [1, 5, 299, 300, 70_000]);
}
