//! State values that postcard cannot read back as written are refused
//! before anything is written: in a run with checkpoints (no checkpoint,
//! not even an incomplete one, is left behind) and in `weibo::testing`,
//! each serde attribute postcard cannot express, naming the type, the
//! state, the operator and what to change.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use weibo::error::Blame;
use weibo::sinks::Blackhole;
use weibo::sources::IterSource;
use weibo::window::Tumbling;
use weibo::{Aggregate, Job, Stream};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct SkipsNone {
    id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct SkipsEmpty {
    id: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    tags: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[allow(dead_code)]
struct SkipsAlways {
    id: u64,
    #[serde(skip_serializing)]
    seen: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Flattened {
    id: u64,
    #[serde(flatten)]
    extra: Extra,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Extra {
    score: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Untagged {
    Number(u64),
    Text(String),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind")]
enum Tagged {
    Click { id: u64 },
}

/// Keys ids into two groups and keeps, per key, the last value `make`
/// gives (a `reduce`: state `value` of operator `last`).
fn last<S: Serialize + serde::de::DeserializeOwned + Clone + Send + Sync + 'static>(
    job: &Job,
    make: fn(u64) -> S,
) -> Stream<S> {
    job.source(IterSource::new(0..20u64))
        .map(move |id| (id, make(id)))
        .key_by(|r: &(u64, S)| r.0 % 2)
        .reduce(|_, b| b)
        .name("last")
        .map(|r: (u64, S)| r.1)
}

/// The error a job with checkpoints gives, after checking that nothing
/// was written into its checkpoint directory.
fn refused<S: Serialize + serde::de::DeserializeOwned + Clone + Send + Sync + 'static>(make: fn(u64) -> S) -> String {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("refused").with_checkpoints(dir.path(), Duration::from_millis(5));
    last(&job, make).sink(Blackhole::new());
    let err = job.run_blocking().unwrap_err();
    assert_eq!(err.blame(), Blame::Wiring, "{err}");
    let written: Vec<_> = walk(dir.path());
    assert!(
        written.iter().all(|p| p.ends_with("LOCK")),
        "nothing but the storage's lock may be written before the refusal: {written:?}"
    );
    err.to_string()
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().unwrap().is_dir() {
            out.extend(walk(&entry.path()));
        } else {
            out.push(entry.path());
        }
    }
    out
}

fn names_the_state(err: &str, ty: &str) {
    assert!(err.contains("state `value` of operator `last`"), "{err}");
    assert!(err.contains(ty), "the type is named: {err}");
    assert!(err.contains("could never be restored"), "{err}");
    assert!(err.contains("Codecs chapter"), "says where to read more: {err}");
}

#[test]
fn a_field_skipped_when_empty_is_refused_before_the_first_checkpoint() {
    let err = refused(|id| SkipsNone { id, note: (id % 2 == 0).then(|| "even".into()) });
    names_the_state(&err, "SkipsNone");
    eprintln!("{err}");
    assert!(err.contains("`None`") && err.contains("skip_serializing_if"), "{err}");
    let err = refused(|id| SkipsEmpty { id, tags: Vec::new() });
    names_the_state(&err, "SkipsEmpty");
    let err = refused(|id| SkipsAlways { id, seen: 1 });
    names_the_state(&err, "SkipsAlways");
    assert!(err.contains("skip_serializing"), "{err}");
}

#[test]
fn types_read_by_looking_at_the_input_are_refused() {
    for err in [
        refused(|id| Flattened { id, extra: Extra { score: 1 } }),
        refused(|id| if id % 2 == 0 { Untagged::Number(id) } else { Untagged::Text(id.to_string()) }),
        refused(|id| Tagged::Click { id }),
        refused(|id| serde_json::json!({ "id": id })),
    ] {
        assert!(err.contains("state `value` of operator `last`"), "{err}");
        assert!(err.contains("deserialize_any"), "{err}");
    }
}

#[test]
fn the_testing_module_refuses_them_too() {
    let err = weibo::testing::run_job(|job| last(job, |id| SkipsNone { id, note: None })).unwrap_err();
    names_the_state(&err.to_string(), "SkipsNone");
    // Without checkpoints too: the state's type is wrong, whatever the job.
    let job = Job::new("plain");
    last(&job, |id| SkipsNone { id, note: None }).sink(Blackhole::new());
    names_the_state(&job.run_blocking().unwrap_err().to_string(), "SkipsNone");
}

/// A window function whose accumulator skips a field.
struct LastNote;

impl Aggregate<u64> for LastNote {
    type Acc = SkipsNone;
    type Out = u64;
    fn create(&self) -> SkipsNone {
        SkipsNone::default()
    }
    fn add(&self, acc: &mut SkipsNone, value: u64) {
        acc.id = value;
    }
    fn merge(&self, a: &mut SkipsNone, b: SkipsNone) {
        a.id = a.id.max(b.id);
    }
    fn result(&self, acc: &SkipsNone) -> u64 {
        acc.id
    }
}

#[test]
fn a_window_accumulator_is_checked_as_any_state() {
    let err = weibo::testing::run_timed(vec![(1, 1u64), (2, 2)], |s| {
        s.key_by(|x: &u64| x % 2).window(Tumbling::of(Duration::from_secs(1))).aggregate(LastNote).into_stream()
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("state `windows`") && err.contains("SkipsNone"), "{err}");
}

#[test]
fn values_that_read_back_run_as_before() {
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    struct Fine {
        id: u64,
        #[serde(default)]
        note: Option<String>,
        #[serde(skip)]
        cache: u32,
    }
    let out = weibo::testing::run_job(|job| last(job, |id| Fine { id, note: None, cache: 7 })).unwrap();
    assert_eq!(out.len(), 20);
}
