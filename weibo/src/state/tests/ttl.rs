//! Value, map and list state with a time-to-live on every backend against
//! a model that knows when each value expires: nothing expired is ever
//! returned, reads refresh when they should, sweeps and restores remove
//! what has expired and count it.

#![allow(clippy::indexing_slicing, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::ops::Bound;
use std::time::Duration;

use super::backends;
use crate::codec::key::{encode, key_group};
use crate::state::{EntryRef, KeyedState, StateBackend, StateScope, StateTtl};
use crate::state::{TtlListStore, TtlMapStore, TtlValueStore};

const GROUPS: u16 = 4;
const TTL: i64 = 100;

#[derive(Clone, Debug)]
enum Op {
    Set(u8, u64),
    Get(u8),
    Put(u8, u8, u64),
    GetEntry(u8, u8),
    Entries(u8),
    Add(u8, u64),
    List(u8),
    Advance(i64),
    Sweep(u16),
    Restore,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0u8..6, 0u64..100).prop_map(|(k, v)| Op::Set(k, v)),
        4 => (0u8..6).prop_map(Op::Get),
        4 => (0u8..6, 0u8..4, 0u64..100).prop_map(|(k, u, v)| Op::Put(k, u, v)),
        3 => (0u8..6, 0u8..4).prop_map(|(k, u)| Op::GetEntry(k, u)),
        2 => (0u8..6).prop_map(Op::Entries),
        3 => (0u8..6, 0u64..100).prop_map(|(k, v)| Op::Add(k, v)),
        2 => (0u8..6).prop_map(Op::List),
        4 => (1i64..80).prop_map(Op::Advance),
        1 => (0u16..GROUPS).prop_map(Op::Sweep),
        1 => Just(Op::Restore),
    ]
}

fn group(key: u8) -> u16 {
    key_group(&encode(&key), GROUPS)
}

/// A value and when it expires, as the model keeps it.
type Timed = (u64, i64);

struct Stores {
    value: TtlValueStore<u8, u64>,
    map: TtlMapStore<u8, u8, u64>,
    list: TtlListStore<u8, u64>,
}

/// Stores named after `run` (a backend on disk keeps every run's tables).
/// A clock the test moves (processing time).
#[derive(Clone)]
struct Clock(std::sync::Arc<std::sync::atomic::AtomicI64>);

impl Clock {
    fn manual(at: i64) -> Self {
        Self(std::sync::Arc::new(std::sync::atomic::AtomicI64::new(at)))
    }
    fn now(&self) -> i64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn set(&self, at: i64) {
        self.0.store(at, std::sync::atomic::Ordering::SeqCst);
    }
    fn reading(&self) -> crate::state::Now {
        let clock = self.clone();
        std::sync::Arc::new(move || clock.now())
    }
}

fn open(backend: &dyn StateBackend, run: &str, ttl: StateTtl, clock: &Clock) -> Stores {
    let scope = |state: &str| StateScope::new("j", "op", format!("{state}_{run}"), 0..GROUPS, GROUPS);
    Stores {
        value: TtlValueStore::open(backend, &scope("value"), ttl, clock.reading()).unwrap(),
        map: TtlMapStore::open(backend, &scope("map"), ttl, clock.reading()).unwrap(),
        list: TtlListStore::open(backend, &scope("list"), ttl, clock.reading()).unwrap(),
    }
}

/// The state's entries now (a full snapshot, as of no checkpoint), to
/// restore from.
fn export(state: &mut dyn KeyedState) -> Vec<(u16, Vec<u8>, Vec<u8>)> {
    let snapshot = state.snapshot_at("op", None).unwrap();
    let mut all = Vec::new();
    snapshot(&mut |part| {
        all.extend(part.part.entries().map(|(g, k, v)| (g, k.to_vec(), v.to_vec())));
        Ok(())
    })
    .unwrap();
    all
}

fn import(state: &mut dyn KeyedState, entries: &[(u16, Vec<u8>, Vec<u8>)]) {
    let mut refs: Vec<EntryRef<'_>> = entries.iter().map(|(g, k, v)| (*g, k.as_slice(), v.as_slice())).collect();
    state.import_part("op", &mut refs, &[]).unwrap();
}

fn run(backend: &dyn StateBackend, ops: &[Op], on_read: bool) -> Result<(), proptest::test_runner::TestCaseError> {
    use proptest::prop_assert_eq;
    let name = backend.name();
    let ttl = if on_read {
        StateTtl::after_read(Duration::from_millis(TTL as u64))
    } else {
        StateTtl::after_write(Duration::from_millis(TTL as u64))
    };
    let clock = Clock::manual(1_000);
    let mut runs = 0;
    let mut s = open(backend, &format!("{on_read}{runs}"), ttl, &clock);
    let mut values: BTreeMap<u8, Timed> = BTreeMap::new();
    let mut maps: BTreeMap<(u8, u8), Timed> = BTreeMap::new();
    let mut lists: BTreeMap<u8, Vec<Timed>> = BTreeMap::new();
    let k = |key: u8| encode(&key);
    for op in ops {
        let now = clock.now();
        let live = |t: &Timed| t.1 > now;
        match *op {
            Op::Set(key, v) => {
                s.value.update(group(key), &key, &k(key), now, |slot| *slot = Some(v)).unwrap();
                values.insert(key, (v, now + TTL));
            }
            Op::Get(key) => {
                let got = s.value.get(group(key), &key, &k(key), now).unwrap();
                let want = values.get(&key).filter(|t| live(t)).map(|t| t.0);
                prop_assert_eq!(got, want, "{}: value of {} at {}", name, key, now);
                match values.get_mut(&key) {
                    Some(t) if live(t) && on_read => t.1 = now + TTL,
                    Some(t) if !live(t) => {
                        values.remove(&key);
                    }
                    _ => {}
                }
            }
            Op::Put(key, u, v) => {
                s.map.put(group(key), &key, &k(key), u, v, now).unwrap();
                maps.insert((key, u), (v, now + TTL));
            }
            Op::GetEntry(key, u) => {
                let got = s.map.get(group(key), &key, &k(key), &u, now).unwrap();
                let want = maps.get(&(key, u)).filter(|t| live(t)).map(|t| t.0);
                prop_assert_eq!(got, want, "{}: entry {} of {} at {}", name, u, key, now);
                if let Some(t) = maps.get_mut(&(key, u))
                    && live(t)
                    && on_read
                {
                    t.1 = now + TTL;
                }
            }
            Op::Entries(key) => {
                let mut got = Vec::new();
                let all = (Bound::Unbounded, Bound::Unbounded);
                s.map
                    .for_each(group(key), &key, &k(key), &all, now, |u, v| {
                        got.push((u, v));
                        true
                    })
                    .unwrap();
                let want: Vec<(u8, u64)> = maps
                    .range((key, 0)..=(key, u8::MAX))
                    .filter(|(_, t)| live(t))
                    .map(|(&(_, u), t)| (u, t.0))
                    .collect();
                prop_assert_eq!(got, want, "{}: entries of {} at {}", name, key, now);
                for ((_, _), t) in maps.range_mut((key, 0)..=(key, u8::MAX)) {
                    if t.1 > now && on_read {
                        t.1 = now + TTL;
                    }
                }
            }
            Op::Add(key, v) => {
                s.list.add(group(key), &key, &k(key), v, now).unwrap();
                lists.entry(key).or_default().push((v, now + TTL));
            }
            Op::List(key) => {
                let mut got = Vec::new();
                s.list
                    .for_each(group(key), &key, &k(key), now, |v| {
                        got.push(v);
                        true
                    })
                    .unwrap();
                let list = lists.entry(key).or_default();
                list.retain(|t| t.1 > now);
                let want: Vec<u64> = list.iter().map(|t| t.0).collect();
                prop_assert_eq!(got, want, "{}: list of {} at {}", name, key, now);
                if on_read {
                    for t in list.iter_mut() {
                        t.1 = now + TTL;
                    }
                }
            }
            Op::Advance(ms) => clock.set(now + ms),
            Op::Sweep(g) => {
                s.value.sweep(g, now, 0).unwrap();
                s.map.sweep(g, now, 0).unwrap();
                s.list.sweep(g, now, 0).unwrap();
                // What is left in the group is live: a full export shows it.
                let left = export(&mut s.value);
                let stale =
                    left.iter().filter(|(eg, _, v)| *eg == g && i64::from_be_bytes(v[..8].try_into().unwrap()) <= now);
                prop_assert_eq!(stale.count(), 0, "{}: swept group {} at {}", name, g, now);
            }
            Op::Restore => {
                let (v, m, l) = (export(&mut s.value), export(&mut s.map), export(&mut s.list));
                runs += 1;
                s = open(backend, &format!("{on_read}{runs}"), ttl, &clock);
                import(&mut s.value, &v);
                import(&mut s.map, &m);
                import(&mut s.list, &l);
                // Nothing expired came back.
                for state in [&mut s.value as &mut dyn KeyedState, &mut s.map, &mut s.list] {
                    let stale = export(state)
                        .into_iter()
                        .filter(|(_, _, v)| i64::from_be_bytes(v[..8].try_into().unwrap()) <= now)
                        .count();
                    prop_assert_eq!(stale, 0, "{}: restored at {}", name, now);
                }
            }
        }
    }
    Ok(())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..Default::default() })]

    /// With a time-to-live after writes and after reads, on every backend.
    #[test]
    fn states_with_a_time_to_live_never_return_expired_values(ops in proptest::collection::vec(op(), 1..150)) {
        for (backend, _dir) in backends() {
            run(&*backend, &ops, false)?;
            run(&*backend, &ops, true)?;
        }
    }
}

/// Every entry removed because it expired is counted, by access, sweep
/// and restore alike.
#[test]
fn expired_entries_are_counted() {
    let clock = Clock::manual(0);
    let ttl = StateTtl::after_write(Duration::from_millis(10));
    let mut s = open(&crate::state::MemoryBackend, "0", ttl, &clock);
    for key in 0..6u8 {
        s.value.update(group(key), &key, &[], 0, |v| *v = Some(1)).unwrap();
    }
    clock.set(10);
    assert_eq!(s.value.get(group(0), &0, &[], 10).unwrap(), None, "expired at exactly its time");
    assert_eq!(s.value.stats().expired, 1);
    s.value.sweep(group(1), 10, 0).unwrap();
    let swept = s.value.stats().expired;
    assert!(swept >= 2, "key 1 and whatever shares its group: {swept}");
    let entries = export(&mut s.value);
    let mut restored = open(&crate::state::MemoryBackend, "1", ttl, &clock);
    import(&mut restored.value, &entries);
    assert_eq!(restored.value.stats().expired, 6 - swept, "the rest were dropped on restore");
    assert_eq!(restored.value.stats().memory_entries, 0);
}

/// On fjall, entries that have expired are dropped as fjall compacts
/// their tables, with no access or sweep reading them; each is counted,
/// and the live ones stay.
#[cfg(feature = "fjall")]
#[test]
fn fjall_drops_expired_entries_as_it_compacts() {
    let dir = tempfile::tempdir().unwrap();
    // No object cache: every entry is in fjall's tables.
    let backend = crate::state::FjallBackend::builder(dir.path()).with_object_cache(0).open().unwrap();
    let clock = Clock::manual(0);
    let ttl = StateTtl::after_write(Duration::from_millis(10));
    let mut s = open(&backend, "0", ttl, &clock);
    for key in 0..200u8 {
        // Keys below 150 written at 0 (expire at 10), the rest at 95.
        let now = if key < 150 { 0 } else { 95 };
        s.value.update(group(key), &key, &k(key), now, |v| *v = Some(1)).unwrap();
        s.map.put(group(key), &key, &k(key), 7, 2, now).unwrap();
        s.list.add(group(key), &key, &k(key), 3, now).unwrap();
    }
    clock.set(100);
    s.value.observe(100, 0);
    s.map.observe(100, 0);
    s.list.observe(100, 0);
    backend.compact_all().unwrap();
    for (name, state) in [("value", &mut s.value as &mut dyn KeyedState), ("map", &mut s.map), ("list", &mut s.list)] {
        assert_eq!(state.stats().expired, 150, "{name}: dropped by the compaction filter, and counted");
        assert_eq!(export(state).len(), 50, "{name}: the live ones stay");
    }
    assert_eq!(s.value.get(group(199), &199, &k(199), 100).unwrap(), Some(1));
    assert_eq!(s.value.get(group(0), &0, &k(0), 100).unwrap(), None);
}

fn k(key: u8) -> Vec<u8> {
    encode(&key)
}

/// In event time the clock is the highest watermark seen: a snapshot
/// records it, a restore drops what had expired by it and starts its clock
/// there, so a value restored before any watermark is not returned after
/// its time.
#[test]
fn an_event_time_clock_is_recorded_and_restored() {
    for (backend, _dir) in backends() {
        let clock = Clock::manual(0);
        let ttl = StateTtl::after_write(Duration::from_millis(10)).in_event_time();
        let mut s = open(&*backend, "e0", ttl, &clock);
        let name = backend.name();
        assert_eq!(s.value.expired_before(), None, "{name}: no watermark yet");
        let now = s.value.now(0, 0);
        s.value.update(group(1), &1, &k(1), now, |v| *v = Some(1)).unwrap();
        let now = s.value.now(0, 45);
        s.value.update(group(2), &2, &k(2), now, |v| *v = Some(2)).unwrap();
        s.value.observe(0, 50);
        assert_eq!(s.value.expired_before(), Some(50), "{name}");
        s.value.observe(0, 20);
        assert_eq!(s.value.expired_before(), Some(50), "{name}: the clock never goes back");
        let entries = export(&mut s.value);
        assert_eq!(entries.len(), 2, "{name}: nothing swept or read yet");

        let mut restored = open(&*backend, "e1", ttl, &clock);
        restored.value.restoring(Some(50));
        import(&mut restored.value, &entries);
        assert_eq!(restored.value.stats().expired, 1, "{name}: key 1 expired at 10");
        let now = restored.value.now(0, crate::record::NO_TIMESTAMP);
        assert_eq!(now, 50, "{name}: the restored clock, before any watermark");
        assert_eq!(restored.value.get(group(2), &2, &k(2), now).unwrap(), Some(2), "{name}: live until 55");
        let now = restored.value.now(0, 60);
        assert_eq!(restored.value.get(group(2), &2, &k(2), now).unwrap(), None, "{name}");

        // A checkpoint that recorded no clock (an older build's) keeps all.
        let mut old = open(&*backend, "e2", ttl, &clock);
        old.value.restoring(None);
        import(&mut old.value, &entries);
        assert_eq!(old.value.stats().expired, 0, "{name}");
    }
}
