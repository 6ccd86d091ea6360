//! Upgrades of state types: a checkpoint records the schema of every
//! state's values (their layout: field names and types, enum variants),
//! and a restore compares it with the code's before any entry is read:
//! the same layout restores (whatever the type's module or name), a
//! changed one restores through the job's migration, or is refused naming
//! the operator, the state and the first field that differs.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use serde::{Deserialize, Deserializer, Serialize};
use weibo::Job;
use weibo::codec::schema::{Schema, Shape};
use weibo::sinks::CollectSink;
use weibo::sources::Generator;

const EVENTS: u64 = 6_000;

fn event(i: u64) -> (u64, u64) {
    (i % 10, i % 97)
}

mod v1 {
    /// Version 1's accumulator.
    #[derive(Clone, serde::Serialize, serde::Deserialize)]
    pub(crate) struct Stats {
        pub(crate) n: u64,
        pub(crate) sum: u64,
    }
}

mod v2 {
    /// Version 2's: a field more.
    #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    pub(crate) struct Stats {
        pub(crate) n: u64,
        pub(crate) sum: u64,
        pub(crate) max: u64,
    }
}

mod moved {
    /// Version 1's layout, in another module and under another name.
    #[derive(Clone, serde::Serialize, serde::Deserialize)]
    pub(crate) struct Totals {
        pub(crate) n: u64,
        pub(crate) sum: u64,
    }
}

/// Decodes of [`Counted`] values (a value decoded from state counts).
static DECODED: AtomicUsize = AtomicUsize::new(0);

fn counted<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    DECODED.fetch_add(1, Ordering::SeqCst);
    u64::deserialize(d)
}

/// A layout that differs from version 1's in its second field's type,
/// counting every value decoded.
#[derive(Clone, Serialize, Deserialize)]
struct Counted {
    n: u64,
    #[serde(deserialize_with = "counted")]
    sum: u64,
    extra: i32,
}

/// Version 1: per key, the number and sum of values (uid `stats`), run
/// over part of the input, then a savepoint.
fn version_1(dir: &Path) -> std::path::PathBuf {
    let job = Job::new("stats").with_checkpoints(dir, Duration::from_secs(3600)).with_max_key_groups(16);
    job.source(Generator::new(EVENTS, event).with_rate(6_000.0))
        .uid("events")
        .key_by(|e: &(u64, u64)| e.0)
        .fold(
            || v1::Stats { n: 0, sum: 0 },
            |s, e| {
                s.n += 1;
                s.sum += e.1;
            },
        )
        .uid("stats")
        .map(|(k, s): (u64, v1::Stats)| (k, s.n, s.sum))
        .sink(CollectSink::new());
    weibo_tests::savepoint_midway(job, Duration::from_millis(300))
}

/// The final (n, sum) per key over the whole input.
fn expected() -> BTreeMap<u64, (u64, u64)> {
    let mut m: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for (k, v) in (0..EVENTS).map(event) {
        let e = m.entry(k).or_default();
        e.0 += 1;
        e.1 += v;
    }
    m
}

fn finals(out: Vec<(u64, u64, u64)>) -> BTreeMap<u64, (u64, u64)> {
    let mut m: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for (k, n, sum) in out {
        let e = m.entry(k).or_default();
        if n > e.0 {
            *e = (n, sum);
        }
    }
    m
}

#[test]
fn a_state_type_with_an_added_field_restores_through_its_migration() {
    let dir = tempfile::tempdir().unwrap();
    let savepoint = version_1(dir.path());
    let out = CollectSink::new();
    let job = Job::new("stats")
        .with_checkpoints(dir.path().join("v2"), Duration::from_secs(3600))
        .with_max_key_groups(16)
        .restore_from(&savepoint)
        .with_state_migration(|old: v1::Stats| v2::Stats { n: old.n, sum: old.sum, max: 0 });
    // On two partitions: each migrates its key groups; one line reports both.
    job.source(Generator::new(EVENTS, event))
        .uid("events")
        .key_by(|e: &(u64, u64)| e.0)
        .with_partitions(2)
        .fold(
            || v2::Stats { n: 0, sum: 0, max: 0 },
            |s, e| {
                s.n += 1;
                s.sum += e.1;
                s.max = s.max.max(e.1);
            },
        )
        .uid("stats")
        .map(|(k, s): (u64, v2::Stats)| (k, s.n, s.sum))
        .sink(out.clone());
    let report = weibo::testing::block_on(job.run()).unwrap();
    assert_eq!(report.migrated.len(), 1, "{:?}", report.migrated);
    assert_eq!((report.migrated[0].operator.as_str(), report.migrated[0].state.as_str()), ("stats", "accumulator"));
    assert_eq!(report.migrated[0].entries, 10, "every key's accumulator");
    // The counts and sums version 1 kept go on: each key's final (n, sum)
    // is the whole input's.
    assert_eq!(finals(out.values()), expected());
}

/// Per key and tumbling second of event time: the number and sum of
/// values, kept in `S` (version 1's or 2's accumulator).
struct WindowStats<S>(fn() -> S, fn(&mut S, u64), fn(&S) -> (u64, u64), fn(&mut S, S));

/// Event `i` with its event time: 10 ms apart, with a pause of a second
/// after every 500 (which closes every key's session).
fn timed(i: u64) -> (u64, u64, i64) {
    let (k, v) = event(i);
    (k, v, i64::try_from(i * 10 + (i / 500) * 1000).unwrap_or(i64::MAX))
}

impl<S: weibo::codec::Data> weibo::Aggregate<(u64, u64, i64)> for WindowStats<S> {
    type Acc = S;
    type Out = (u64, u64);
    fn create(&self) -> S {
        (self.0)()
    }
    fn add(&self, acc: &mut S, value: (u64, u64, i64)) {
        (self.1)(acc, value.1);
    }
    fn merge(&self, acc: &mut S, other: S) {
        (self.3)(acc, other);
    }
    fn result(&self, acc: &S) -> (u64, u64) {
        (self.2)(acc)
    }
}

fn v1_window_stats() -> WindowStats<v1::Stats> {
    WindowStats(
        || v1::Stats { n: 0, sum: 0 },
        |s, v| {
            s.n += 1;
            s.sum += v;
        },
        |s| (s.n, s.sum),
        |s, o| {
            s.n += o.n;
            s.sum += o.sum;
        },
    )
}

fn v2_window_stats() -> WindowStats<v2::Stats> {
    WindowStats(
        || v2::Stats { n: 0, sum: 0, max: 0 },
        |s, v| {
            s.n += 1;
            s.sum += v;
            s.max = s.max.max(v);
        },
        |s| (s.n, s.sum),
        |s, o| {
            s.n += o.n;
            s.sum += o.sum;
            s.max = s.max.max(o.max);
        },
    )
}

/// (key, window start, n, sum) of every window a job fired.
type Fired = std::collections::BTreeSet<(u64, i64, u64, u64)>;

/// The windowed stats over the input (event time: 10 ms per event, so a
/// window of a second holds 100 events of 10 keys), with accumulator `S`.
fn windowed<S: weibo::codec::Data, W: weibo::window::WindowAssigner>(
    job: &Job,
    assigner: W,
    stats: WindowStats<S>,
    rate: Option<f64>,
    out: &CollectSink<(u64, i64, u64, u64)>,
) {
    let source = Generator::new(EVENTS, timed);
    let source = match rate {
        Some(r) => source.with_rate(r),
        None => source,
    };
    job.source(source)
        .uid("events")
        .with_timestamps(|e: &(u64, u64, i64)| e.2, weibo::time::WatermarkStrategy::monotonous())
        .key_by(|e: &(u64, u64, i64)| e.0)
        .window(assigner)
        .aggregate(stats)
        .uid("per-second")
        .into_stream()
        .map(|r: weibo::window::WindowResult<u64, (u64, u64)>| (r.key, r.window.start, r.value.0, r.value.1))
        .sink(out.clone());
}

#[test]
fn a_window_accumulator_with_an_added_field_restores_through_its_migration() {
    window_migration(|| weibo::window::Tumbling::of(Duration::from_secs(1)), "windows");
}

#[test]
fn a_session_accumulator_with_an_added_field_restores_through_its_migration() {
    window_migration(|| weibo::window::Session::with_gap(Duration::from_millis(300)), "sessions");
}

/// Version 1 of a windowed aggregate (windows of `assigner`) runs on part
/// of the input and takes a savepoint; version 2, whose accumulator has a
/// field more, restores it through a migration of its `state` and
/// finishes: the windows both fired are those of an uninterrupted run.
fn window_migration<W: weibo::window::WindowAssigner>(assigner: impl Fn() -> W, state: &str) {
    let dir = tempfile::tempdir().unwrap();
    let v1_out = CollectSink::new();
    let job = Job::new("windows").with_checkpoints(dir.path(), Duration::from_secs(3600)).with_max_key_groups(16);
    windowed(&job, assigner(), v1_window_stats(), Some(6_000.0), &v1_out);
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(300));
    let v2_out = CollectSink::new();
    let job = Job::new("windows")
        .with_max_key_groups(16)
        .restore_from(&savepoint)
        .with_state_migration(|old: v1::Stats| v2::Stats { n: old.n, sum: old.sum, max: 0 });
    windowed(&job, assigner(), v2_window_stats(), None, &v2_out);
    let report = weibo::testing::block_on(job.run()).unwrap();
    assert_eq!(report.migrated.len(), 1, "{:?}", report.migrated);
    assert_eq!((report.migrated[0].operator.as_str(), report.migrated[0].state.as_str()), ("per-second", state));
    assert!(report.migrated[0].entries > 0);
    // Windows fired before the savepoint, and after the restore: together
    // those of one uninterrupted run (a window fired between the savepoint
    // and the stop fires again after the restore, with the same value).
    let whole = CollectSink::new();
    let job = Job::new("windows").with_max_key_groups(16);
    windowed(&job, assigner(), v2_window_stats(), None, &whole);
    weibo::testing::block_on(job.run()).unwrap();
    let both: Fired = v1_out.values().into_iter().chain(v2_out.values()).collect();
    let whole: Fired = whole.values().into_iter().collect();
    assert_eq!(both, whole);
    assert!(!v1_out.values().is_empty() && !v2_out.values().is_empty(), "the savepoint fell inside the input");
}

/// A window `process` over records of type `R` (`to` makes one of an
/// event): per key and second, the number and sum of the records' values
/// (`sum_of` reads one), computed when the window fires from the records
/// it kept.
fn window_process<R: Clone + Send + Sync + Serialize + serde::de::DeserializeOwned + 'static>(
    job: &Job,
    to: fn((u64, u64, i64)) -> R,
    sum_of: fn(&R) -> u64,
    rate: Option<f64>,
    out: &CollectSink<(u64, i64, u64, u64)>,
) {
    let source = Generator::new(EVENTS, timed);
    let source = match rate {
        Some(r) => source.with_rate(r),
        None => source,
    };
    job.source(source)
        .uid("events")
        .with_timestamps(|e: &(u64, u64, i64)| e.2, weibo::time::WatermarkStrategy::monotonous())
        .map(move |e: (u64, u64, i64)| (e.0, to(e)))
        .key_by(|e: &(u64, R)| e.0)
        .window(weibo::window::Tumbling::of(Duration::from_secs(1)))
        .process(move |ctx, records: &[(u64, R)], out: &mut Vec<(u64, i64, u64, u64)>| {
            let sum = records.iter().map(|(_, r)| sum_of(r)).sum();
            out.push((*ctx.key, ctx.window.start, records.len() as u64, sum));
        })
        .uid("kept")
        .into_stream()
        .sink(out.clone());
}

#[test]
fn a_window_process_kept_record_type_with_an_added_field_restores_through_its_migration() {
    fn v1_of(e: (u64, u64, i64)) -> v1::Stats {
        v1::Stats { n: e.0, sum: e.1 }
    }
    fn v2_of(e: (u64, u64, i64)) -> v2::Stats {
        v2::Stats { n: e.0, sum: e.1, max: e.1 }
    }
    let dir = tempfile::tempdir().unwrap();
    let v1_out = CollectSink::new();
    let job = Job::new("kept").with_checkpoints(dir.path(), Duration::from_secs(3600)).with_max_key_groups(16);
    window_process(&job, v1_of, |r| r.sum, Some(6_000.0), &v1_out);
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(300));
    let v2_out = CollectSink::new();
    // The kept records are (key, record) pairs: the migration is of those.
    let job = Job::new("kept")
        .with_max_key_groups(16)
        .restore_from(&savepoint)
        .with_state_migration(|(k, old): (u64, v1::Stats)| (k, v2::Stats { n: old.n, sum: old.sum, max: old.sum }));
    // Version 2 sums the migrated field: the kept records' `max` must be
    // what the migration made of them.
    window_process(&job, v2_of, |r| r.max, None, &v2_out);
    let report = weibo::testing::block_on(job.run()).unwrap();
    assert_eq!(report.migrated.len(), 1, "{:?}", report.migrated);
    assert_eq!((report.migrated[0].operator.as_str(), report.migrated[0].state.as_str()), ("kept", "windows"));
    assert!(report.migrated[0].entries > 0);
    let whole = CollectSink::new();
    let job = Job::new("kept").with_max_key_groups(16);
    window_process(&job, v2_of, |r| r.max, None, &whole);
    weibo::testing::block_on(job.run()).unwrap();
    let both: Fired = v1_out.values().into_iter().chain(v2_out.values()).collect();
    let whole: Fired = whole.values().into_iter().collect();
    assert_eq!(both, whole);
    assert!(!v1_out.values().is_empty() && !v2_out.values().is_empty(), "the savepoint fell inside the input");
}

#[test]
fn the_same_layout_in_another_module_and_under_another_name_restores_as_is() {
    let dir = tempfile::tempdir().unwrap();
    let savepoint = version_1(dir.path());
    let out = CollectSink::new();
    let job = Job::new("stats").with_max_key_groups(16).restore_from(&savepoint);
    job.source(Generator::new(EVENTS, event))
        .uid("events")
        .key_by(|e: &(u64, u64)| e.0)
        .fold(
            || moved::Totals { n: 0, sum: 0 },
            |s, e| {
                s.n += 1;
                s.sum += e.1;
            },
        )
        .uid("stats")
        .map(|(k, s): (u64, moved::Totals)| (k, s.n, s.sum))
        .sink(out.clone());
    let report = weibo::testing::block_on(job.run()).unwrap();
    assert!(report.migrated.is_empty());
    assert_eq!(finals(out.values()), expected());
}

#[test]
fn a_changed_state_type_without_a_migration_is_refused_before_any_entry_is_decoded() {
    let dir = tempfile::tempdir().unwrap();
    let savepoint = version_1(dir.path());
    // Traced and checked once, now (both are cached): its samples are
    // decoded, so that what counts below is only what a restore would
    // decode.
    let _ = Schema::of::<Counted>();
    <Counted as weibo::Data>::check_round_trip().unwrap();
    let before = DECODED.load(Ordering::SeqCst);
    let out = CollectSink::new();
    let job = Job::new("stats").with_max_key_groups(16).restore_from(&savepoint);
    job.source(Generator::new(EVENTS, event))
        .uid("events")
        .key_by(|e: &(u64, u64)| e.0)
        .fold(|| Counted { n: 0, sum: 0, extra: 0 }, |s, e| s.sum += e.1)
        .uid("stats")
        .map(|(k, s): (u64, Counted)| (k, s.n, s.sum))
        .sink(out.clone());
    let err = weibo::testing::block_on(job.run()).expect_err("refused").to_string();
    assert!(
        err.contains("the state `accumulator` of operator `stats` was written with another layout")
            && err.contains("`Stats` has a new field `extra` (i32)"),
        "{err}"
    );
    assert_eq!(DECODED.load(Ordering::SeqCst), before, "no entry was decoded");
    assert!(out.values().is_empty());
    // A migration from another layout than the recorded one does not apply.
    let job = Job::new("stats")
        .with_max_key_groups(16)
        .restore_from(&savepoint)
        .with_state_migration(|old: v2::Stats| Counted { n: old.n, sum: old.sum, extra: 0 });
    job.source(Generator::new(EVENTS, event))
        .uid("events")
        .key_by(|e: &(u64, u64)| e.0)
        .fold(|| Counted { n: 0, sum: 0, extra: 0 }, |s, e| s.sum += e.1)
        .uid("stats")
        .sink(CollectSink::new());
    assert!(weibo::testing::block_on(job.run()).is_err());
    assert_eq!(DECODED.load(Ordering::SeqCst), before, "no entry was decoded");
}

#[test]
fn a_manifest_records_each_states_schema() {
    let dir = tempfile::tempdir().unwrap();
    let savepoint = version_1(dir.path());
    let manifest = weibo::checkpoint::read_manifest(&savepoint).unwrap();
    let stats: Vec<_> = manifest.states.iter().filter(|s| s.operator == "stats").collect();
    assert!(!stats.is_empty());
    let id = stats[0].schema.clone().unwrap();
    assert_eq!(manifest.schemas[&id], *Schema::of::<v1::Stats>());
    assert_eq!(manifest.operators[0].key_type, "u64");
}

/// Shapes of a few levels, names from a small set (so that equal ones
/// come up).
fn shape() -> impl Strategy<Value = Shape> {
    let leaf = prop_oneof![Just(Shape::U64), Just(Shape::I32), Just(Shape::Str), Just(Shape::Bool), Just(Shape::Unit)];
    leaf.prop_recursive(3, 24, 3, |inner| {
        let name = prop_oneof![Just("a".to_string()), Just("b".to_string())];
        prop_oneof![
            inner.clone().prop_map(|s| Shape::Option(Box::new(s))),
            inner.clone().prop_map(|s| Shape::Seq(Box::new(s))),
            prop::collection::vec(inner.clone(), 0..3).prop_map(Shape::Tuple),
            (name.clone(), prop::collection::vec((name.clone(), inner.clone()), 0..3))
                .prop_map(|(name, fields)| Shape::Struct { name, fields }),
            (
                name.clone(),
                prop::collection::vec((name, prop::collection::vec((Just(String::new()), inner), 0..2)), 1..3)
            )
                .prop_map(|(name, variants)| Shape::Enum {
                    name: "e".into(),
                    variants: variants.into_iter().map(|v| (name.clone() + &v.0, v.1)).collect()
                }),
        ]
    })
}

/// `shape` with every struct and enum name dropped: what layouts compare.
fn unnamed(shape: &Shape) -> Shape {
    match shape {
        Shape::Option(s) => Shape::Option(Box::new(unnamed(s))),
        Shape::Seq(s) => Shape::Seq(Box::new(unnamed(s))),
        Shape::Map(k, v) => Shape::Map(Box::new(unnamed(k)), Box::new(unnamed(v))),
        Shape::Tuple(items) => Shape::Tuple(items.iter().map(unnamed).collect()),
        Shape::Struct { fields, .. } => {
            Shape::Struct { name: String::new(), fields: fields.iter().map(|(n, s)| (n.clone(), unnamed(s))).collect() }
        }
        Shape::Enum { variants, .. } => Shape::Enum {
            name: String::new(),
            variants: variants
                .iter()
                .map(|(n, f)| (n.clone(), f.iter().map(|(m, s)| (m.clone(), unnamed(s))).collect()))
                .collect(),
        },
        other => other.clone(),
    }
}

proptest! {
    /// A schema is accepted for another exactly when their layouts are
    /// equal: never a wrong value.
    #[test]
    fn a_schema_is_accepted_for_another_only_when_their_layouts_are_equal(a in shape(), b in shape()) {
        let (sa, sb) = (Schema { shape: a.clone() }, Schema { shape: b.clone() });
        let same = unnamed(&a) == unnamed(&b);
        prop_assert_eq!(sa.first_difference(&sb).is_none(), same);
        prop_assert_eq!(sb.first_difference(&sa).is_none(), same);
        prop_assert!(sa.first_difference(&sa).is_none());
    }
}

/// Copies savepoint `from` (its manifest and state files) to `to`.
fn copy_savepoint(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let path = e.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
}

#[test]
fn the_inspector_shows_operators_states_schemas_and_one_keys_value() {
    let dir = tempfile::tempdir().unwrap();
    let savepoint = version_1(dir.path());
    let (inspection, opened) = weibo::checkpoint::inspect::Inspection::open(&savepoint).unwrap();
    let text = inspection.to_string();
    assert!(text.contains("operator `stats`: fold, keyed by u64"), "{text}");
    assert!(text.contains("state `accumulator`: 10 entries"), "{text}");
    assert!(text.contains("schema Stats { n: u64, sum: u64 }"), "{text}");
    assert!(text.contains("source `events` partition 0: position"), "{text}");
    let key = weibo::codec::key::encode(&3u64);
    let found = opened.key_state(&inspection, "stats", "accumulator", &key).unwrap().unwrap();
    let n = found.value["n"].as_u64().unwrap();
    let sum = found.value["sum"].as_u64().unwrap();
    // Key 3's count and sum over the events version 1 read.
    let read = inspection.sources[0].position;
    let (mut en, mut esum) = (0, 0);
    for (k, v) in (0..read).map(event) {
        if k == 3 {
            en += 1;
            esum += v;
        }
    }
    assert_eq!((n, sum), (en, esum));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// A damaged state file (a bit flipped, or cut short) is an error of
    /// the inspector and of a restore, never a panic or a wrong value.
    #[test]
    fn damaged_state_files_are_errors_never_panics(flip in any::<prop::sample::Index>(), bit in 0u8..8, cut in any::<bool>()) {
        let savepoint = SAVEPOINT.with(|s| s.clone());
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("sp");
        copy_savepoint(&savepoint, &copy);
        let file = std::fs::read_dir(&copy).unwrap().map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "state")).unwrap();
        let mut bytes = std::fs::read(&file).unwrap();
        let at = flip.index(bytes.len());
        if cut { bytes.truncate(at); } else { bytes[at] ^= 1 << bit; }
        std::fs::write(&file, &bytes).unwrap();
        prop_assert!(weibo::checkpoint::inspect::Inspection::open(&copy).is_err());
    }

    /// Arbitrary bytes decoded by an arbitrary schema: a value or an
    /// error, never a panic.
    #[test]
    fn arbitrary_bytes_decode_or_fail_by_any_schema(s in shape(), bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let _ = weibo::codec::schema::decode_postcard(&s, &bytes);
    }
}

thread_local! {
    /// One savepoint of version 1 per test thread, for the damage test's
    /// cases to copy.
    static SAVEPOINT: std::path::PathBuf = {
        let dir = Box::leak(Box::new(tempfile::tempdir().unwrap()));
        version_1(dir.path())
    };
}

#[test]
fn the_state_processor_reads_state_typed_and_writes_a_savepoint_that_bootstraps_a_new_operator() {
    use weibo::checkpoint::processor::{SavepointReader, SavepointWriter};
    let dir = tempfile::tempdir().unwrap();
    let savepoint = version_1(dir.path());
    let reader = SavepointReader::open(&savepoint).unwrap();
    let stats: Vec<(u64, v1::Stats)> = reader.entries("stats", "accumulator").unwrap();
    assert_eq!(stats.len(), 10);
    let three: v1::Stats = reader.get("stats", "accumulator", &3u64).unwrap().unwrap();
    assert_eq!(stats.iter().find(|(k, _)| *k == 3).map(|(_, s)| (s.n, s.sum)), Some((three.n, three.sum)));
    assert!(reader.get::<u64, v1::Stats>("stats", "accumulator", &99).unwrap().is_none());
    // Read as another layout: refused, naming the difference.
    let err = reader.entries::<u64, v2::Stats>("stats", "accumulator").unwrap_err().to_string();
    assert!(err.contains("has a new field `max`"), "{err}");

    // A new savepoint: `counts` bootstrapped from the stats' counts.
    let mut writer = SavepointWriter::from(&reader);
    writer.set_state("counts", "accumulator", stats.iter().map(|(k, s)| (*k, s.n))).unwrap();
    let rewritten = writer.write(dir.path().join("rewritten")).unwrap();
    let out = CollectSink::new();
    let counts = CollectSink::new();
    let job = Job::new("stats").with_max_key_groups(16).restore_from(&rewritten);
    let keyed = job.source(Generator::new(EVENTS, event)).uid("events").key_by(|e: &(u64, u64)| e.0);
    keyed
        .fold(
            || v1::Stats { n: 0, sum: 0 },
            |s, e| {
                s.n += 1;
                s.sum += e.1;
            },
        )
        .uid("stats")
        .map(|(k, s): (u64, v1::Stats)| (k, s.n, s.sum))
        .sink(out.clone());
    keyed.fold(|| 0u64, |n, _| *n += 1).uid("counts").sink(counts.clone());
    weibo::testing::block_on(job.run()).unwrap();
    assert_eq!(finals(out.values()), expected());
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    for (k, n) in counts.values() {
        let e = last.entry(k).or_default();
        *e = (*e).max(n);
    }
    let whole: BTreeMap<u64, u64> = expected().into_iter().map(|(k, (n, _))| (k, n)).collect();
    assert_eq!(last, whole, "the bootstrapped counts went on from the savepoint's");

    // Dropped from a savepoint, an operator's state no longer needs
    // `allow_unrestored_state`.
    let mut writer = SavepointWriter::from(&reader);
    writer.drop_operator("stats");
    let without = writer.write(dir.path().join("without-stats")).unwrap();
    assert!(SavepointWriter::from(&reader).write(&without).is_err(), "a new directory only");
    let job = Job::new("stats").with_max_key_groups(16).restore_from(&without);
    job.source(Generator::new(EVENTS, event)).uid("events").sink(CollectSink::new());
    weibo::testing::block_on(job.run()).unwrap();
}

mod keys_v1 {
    #[derive(Clone, PartialEq, Eq, Hash, Debug, weibo::Key)]
    pub(crate) struct Device {
        pub(crate) id: u64,
    }
}

mod keys_moved {
    /// Version 1's key, in another module and under another name.
    #[derive(Clone, PartialEq, Eq, Hash, Debug, weibo::Key)]
    pub(crate) struct Sensor {
        pub(crate) id: u64,
    }
}

mod keys_v2 {
    /// A field more.
    #[derive(Clone, PartialEq, Eq, Hash, Debug, weibo::Key)]
    pub(crate) struct Device {
        pub(crate) id: u64,
        pub(crate) site: u32,
    }
}

/// Counts per key of type `K`, uid `counts`, restored from `savepoint` if
/// given; run to the end (`rate`: paced, for a savepoint).
fn counts_job<K>(dir: &Path, key: fn(u64) -> K, restore: Option<&Path>) -> (Job, CollectSink<(K, u64)>)
where
    K: weibo::Key + Send + Sync + 'static,
{
    let out = CollectSink::new();
    let mut job = Job::new("keys").with_checkpoints(dir, Duration::from_secs(3600)).with_max_key_groups(16);
    if let Some(r) = restore {
        job = job.restore_from(r);
    }
    let rate = if restore.is_some() { 1e9 } else { 6_000.0 };
    job.source(Generator::new(EVENTS, event).with_rate(rate))
        .uid("events")
        .key_by(move |e: &(u64, u64)| key(e.0))
        .fold(|| 0u64, |n, _| *n += 1)
        .uid("counts")
        .sink(out.clone());
    (job, out)
}

#[test]
fn a_key_type_is_matched_by_its_layout_not_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let (job, _) = counts_job(&dir.path().join("v1"), |k| keys_v1::Device { id: k }, None);
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(300));
    // Moved and renamed, the same layout: restores, and the counts go on.
    let (job, out) = counts_job(&dir.path().join("v2"), |k| keys_moved::Sensor { id: k }, Some(&savepoint));
    weibo::testing::block_on(job.run()).unwrap();
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    for (k, n) in out.values() {
        let e = last.entry(k.id).or_default();
        *e = (*e).max(n);
    }
    let whole: BTreeMap<u64, u64> = expected().into_iter().map(|(k, (n, _))| (k, n)).collect();
    assert_eq!(last, whole);
    // A field more: refused, naming it.
    let (job, out) = counts_job(&dir.path().join("v3"), |k| keys_v2::Device { id: k, site: 0 }, Some(&savepoint));
    let err = weibo::testing::block_on(job.run()).expect_err("refused").to_string();
    assert!(err.contains("operator `counts` was keyed by") && err.contains("has a new field `site` (u32)"), "{err}");
    assert!(out.values().is_empty());
}

/// A state restored from a base and the deltas after it is migrated (and
/// counted) once per key, as the state holds it, not once per file the
/// key appears in.
#[test]
fn each_key_is_migrated_once_whatever_the_files_of_its_chain() {
    let dir = tempfile::tempdir().unwrap();
    // 100 keys, every one changed in every epoch of 40 ms.
    let job = Job::new("stats").with_checkpoints(dir.path(), Duration::from_millis(40)).with_max_key_groups(16);
    job.source(Generator::new(u64::MAX, |i| (i % 100, i % 7)).with_rate(10_000.0))
        .uid("events")
        .key_by(|e: &(u64, u64)| e.0)
        .fold(
            || v1::Stats { n: 0, sum: 0 },
            |s, e| {
                s.n += 1;
                s.sum += e.1;
            },
        )
        .uid("stats")
        .map(|(k, s): (u64, v1::Stats)| (k, s.n, s.sum))
        .sink(CollectSink::new());
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(500));
    let manifest = weibo::checkpoint::read_manifest(&savepoint).unwrap();
    let files: Vec<_> = manifest.states.iter().filter(|s| s.operator == "stats").collect();
    assert!(files.iter().any(|f| f.base) && files.iter().any(|f| !f.base), "a base and deltas: {files:?}");
    let listed: u64 = files.iter().filter_map(|f| f.entries).sum();
    assert!(listed > 100, "the chain's files list keys more than once ({listed})");

    let job = Job::new("stats")
        .with_max_key_groups(16)
        .restore_from(&savepoint)
        .with_state_migration(|old: v1::Stats| v2::Stats { n: old.n, sum: old.sum, max: 0 });
    job.source(Generator::new(0, |i| (i % 100, i % 7)))
        .uid("events")
        .key_by(|e: &(u64, u64)| e.0)
        .with_partitions(3)
        .fold(|| v2::Stats { n: 0, sum: 0, max: 0 }, |s, e| s.sum += e.1)
        .uid("stats")
        .map(|(k, s): (u64, v2::Stats)| (k, s.n, s.sum))
        .sink(CollectSink::new());
    let report = weibo::testing::block_on(job.run()).unwrap();
    assert_eq!(report.migrated.len(), 1, "one line per operator and state: {:?}", report.migrated);
    assert_eq!((report.migrated[0].operator.as_str(), report.migrated[0].state.as_str()), ("stats", "accumulator"));
    assert_eq!(report.migrated[0].entries, 100, "each key once");
}
