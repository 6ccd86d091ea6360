//! Upgrades that must change nothing they should not:
//!
//! - every refusal of a restore (a changed key type, a removed operator,
//!   a changed state layout, a lower state version, another kind of
//!   operator under an id, other key groups, a removed exactly-once sink,
//!   a source whose id another node took, a state type that cannot be
//!   read back, a storage another run holds) leaves the checkpoint
//!   storage and the sinks' output byte for byte as they were, the
//!   pending output of a checkpoint that completed but was not committed
//!   included; the job's own restart then commits it, every record once;
//! - a job restored from a savepoint after later output was committed
//!   (into version 1's checkpoint directory, or a fresh one) never
//!   replaces or removes a committed file or object: it writes new ones
//!   beside them, and downstream sees the replayed range twice, by design.
//!
//! Version 1 dies between a checkpoint's manifest and its commits in a
//! child process: this test binary, started with `WEIBO_UPGRADE_CHILD`
//! set, running only the `child` test.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use weibo::checkpoint::{CheckpointStorage, LocalDir, LockAttempt, StorageHolder};
use weibo::sinks::{Blackhole, TxnFileSink};
use weibo::sources::Generator;
use weibo::{Job, Stream};
use weibo_connectors::s3_sink::S3Sink;
use weibo_tests::crash;
use weibo_tests::s3_server;
use weibo_tests::schedule::{Count, KEYS};

const IDS: u64 = 4_000;

/// Version 1's state: per key, how many ids and the last one.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Acc {
    n: u64,
    last: u64,
}

/// A layout of its own: a field more.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Wider {
    n: u64,
    last: u64,
    extra: u32,
}

/// A state type whose checkpoints could never be read back.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Unreadable {
    n: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last: Option<u64>,
}

/// The ids, at `rate` per second (`None`: as fast as they come).
fn ids(job: &Job, rate: Option<f64>) -> Stream<u64> {
    let mut source = Generator::new(IDS, |id| id);
    if let Some(r) = rate {
        source = source.with_rate(r);
    }
    job.source(source).uid("ids")
}

/// Version 1: a count per key (uid `totals`, state version 2) written
/// exactly once (uid `out`), checkpointed into `root/checkpoints`.
fn version_1(root: &Path, rate: Option<f64>) -> Job {
    let job = checkpointed(root);
    out_sink(counted(totals(&job, rate)), root);
    job
}

/// The child: version 1 (paced), dying where `WEIBO_CRASH_AT` says.
#[test]
fn child() {
    let Ok(root) = std::env::var("WEIBO_UPGRADE_CHILD") else { return };
    weibo::testing::block_on(version_1(Path::new(&root), Some(4_000.0)).run()).unwrap();
}

/// A version that restores from `root`'s checkpoints and is refused,
/// with the words its error must hold.
struct Refusal {
    what: &'static str,
    says: &'static str,
    build: fn(&Path) -> Job,
}

fn checkpointed(root: &Path) -> Job {
    Job::new("upgrades").with_checkpoints(root.join("checkpoints"), Duration::from_millis(100)).with_max_key_groups(16)
}

fn out_sink(s: Stream<Count>, root: &Path) {
    s.sink_exactly_once(TxnFileSink::json_lines(root.join("out"))).uid("out");
}

/// Version 1's keyed count (uid `totals`, state version 2) over `job`'s ids.
fn totals(job: &Job, rate: Option<f64>) -> Stream<(u64, Acc)> {
    ids(job, rate)
        .key_by(|id: &u64| id % KEYS)
        .fold(
            || Acc { n: 0, last: 0 },
            |a, id| {
                a.n += 1;
                a.last = id;
            },
        )
        .uid("totals")
        .state_version(2)
}

/// Version 1's output from its counts.
fn counted(totals: Stream<(u64, Acc)>) -> Stream<Count> {
    totals.map(|(key, a): (u64, Acc)| Count { key, id: a.last, count: a.n })
}

fn refusals() -> Vec<Refusal> {
    vec![
        Refusal {
            what: "a changed key type",
            says: "was keyed by `u64`",
            build: |root| {
                let job = checkpointed(root);
                let totals = ids(&job, None)
                    .key_by(|id: &u64| (id % KEYS).to_string())
                    .fold(|| Acc { n: 0, last: 0 }, |a, id| a.last = id)
                    .uid("totals")
                    .state_version(2);
                out_sink(
                    totals.map(|(k, a): (String, Acc)| Count { key: k.len() as u64, id: a.last, count: a.n }),
                    root,
                );
                job
            },
        },
        Refusal {
            what: "a removed operator",
            says: "operator `totals`, which the job does not have",
            build: |root| {
                let job = checkpointed(root);
                out_sink(ids(&job, None).map(|id| Count { key: id % KEYS, id, count: 1 }), root);
                job
            },
        },
        Refusal {
            what: "a changed state layout without a migration",
            says: "was written with another layout",
            build: |root| {
                let job = checkpointed(root);
                let totals = ids(&job, None)
                    .key_by(|id: &u64| id % KEYS)
                    .fold(|| Wider { n: 0, last: 0, extra: 0 }, |a, id| a.last = id)
                    .uid("totals")
                    .state_version(2);
                out_sink(totals.map(|(key, a): (u64, Wider)| Count { key, id: a.last, count: a.n }), root);
                job
            },
        },
        Refusal {
            what: "a lower state version",
            says: "a savepoint of a later version does not restore into an earlier one",
            build: |root| {
                let job = checkpointed(root);
                let totals = ids(&job, None)
                    .key_by(|id: &u64| id % KEYS)
                    .fold(|| Acc { n: 0, last: 0 }, |a, id| a.last = id)
                    .uid("totals");
                out_sink(totals.map(|(key, a): (u64, Acc)| Count { key, id: a.last, count: a.n }), root);
                job
            },
        },
        Refusal {
            what: "another kind of operator under the id",
            says: "was a fold and is a reduce",
            build: |root| {
                let job = checkpointed(root);
                let totals = ids(&job, None)
                    .map(|id| Acc { n: 1, last: id })
                    .key_by(|a: &Acc| a.last % KEYS)
                    .reduce(|a, b| Acc { n: a.n + b.n, last: b.last })
                    .uid("totals")
                    .state_version(2);
                out_sink(totals.map(|a: Acc| Count { key: a.last % KEYS, id: a.last, count: a.n }), root);
                job
            },
        },
        Refusal {
            what: "other key groups",
            says: "key groups cannot change",
            build: |root| {
                let job = Job::new("upgrades")
                    .with_checkpoints(root.join("checkpoints"), Duration::from_millis(100))
                    .with_max_key_groups(32);
                out_sink(counted(totals(&job, None)), root);
                job
            },
        },
        Refusal {
            what: "a removed exactly-once sink",
            says: "pending commits of exactly-once sink `out`",
            build: |root| {
                let job = checkpointed(root);
                totals(&job, None).sink(Blackhole::new());
                job
            },
        },
        Refusal {
            what: "a source's id taken by another node",
            says: "`ids` was a source in the checkpoint",
            build: |root| {
                let job = checkpointed(root);
                let totals = job
                    .source(Generator::new(IDS, |id| id))
                    .uid("numbers")
                    .map(|id: u64| id)
                    .uid("ids")
                    .key_by(|id: &u64| id % KEYS)
                    .fold(|| Acc { n: 0, last: 0 }, |a, id| a.last = id)
                    .uid("totals")
                    .state_version(2);
                out_sink(totals.map(|(key, a): (u64, Acc)| Count { key, id: a.last, count: a.n }), root);
                job
            },
        },
        Refusal {
            what: "a state type that cannot be read back",
            says: "that its codec cannot read back",
            build: |root| {
                let job = checkpointed(root);
                let totals = ids(&job, None)
                    .key_by(|id: &u64| id % KEYS)
                    .fold(|| Unreadable { n: 0, last: None }, |a, id| a.last = Some(id))
                    .uid("totals")
                    .state_version(3);
                out_sink(
                    totals.map(|(key, a): (u64, Unreadable)| Count { key, id: a.last.unwrap_or(0), count: a.n }),
                    root,
                );
                job
            },
        },
    ]
}

/// The committed records of version 1's output.
fn committed(out: &Path) -> Vec<Count> {
    let mut records = Vec::new();
    for entry in std::fs::read_dir(out).into_iter().flatten().flatten() {
        if entry.path().is_file() {
            let text = std::fs::read_to_string(entry.path()).unwrap();
            records.extend(text.lines().map(|l| serde_json::from_str::<Count>(l).unwrap()));
        }
    }
    records
}

/// Per key, the highest count committed, with the last id it counted:
/// after a run to the end, every key's full count.
fn finals(records: &[Count]) -> BTreeMap<u64, (u64, u64)> {
    let mut out: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for r in records {
        let e = out.entry(r.key).or_default();
        if r.count > e.0 {
            *e = (r.count, r.id);
        }
    }
    out
}

fn expected_finals() -> BTreeMap<u64, (u64, u64)> {
    (0..KEYS).map(|k| (k, ((IDS - 1 - k) / KEYS + 1, IDS - 1 - (IDS - 1 - k) % KEYS))).collect()
}

/// Every count of every key once: `1..=n` without a gap or a repeat.
fn assert_each_count_once(records: &[Count], what: &str) {
    let mut per_key: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for r in records {
        per_key.entry(r.key).or_default().push(r.count);
    }
    for (key, counts) in &mut per_key {
        counts.sort_unstable();
        let want: Vec<u64> = (1..=counts.len() as u64).collect();
        assert!(*counts == want, "{what}: key {key} has counts {:?}…", &counts[..counts.len().min(10)]);
    }
}

#[test]
fn every_refused_restore_leaves_the_storage_and_the_pending_output_as_they_were() {
    if std::env::var("WEIBO_UPGRADE_CHILD").is_ok() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    // Version 1 completes checkpoint 3 and dies before committing it.
    let cmd = crash::child_command("child", "WEIBO_UPGRADE_CHILD", root.path());
    assert!(
        !crash::run_child(cmd, Duration::from_secs(60), Some("after-manifest#3")),
        "version 1 dies between checkpoint 3's manifest and its commits"
    );
    let pending: Vec<PathBuf> = std::fs::read_dir(root.path().join("out/.pending"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
        .collect();
    assert!(!pending.is_empty(), "checkpoint 3's output waits, pending");
    let before = crash::snapshot_dir(root.path());

    for refusal in refusals() {
        let err = (refusal.build)(root.path()).run_blocking().expect_err(refusal.what).to_string();
        assert!(err.contains(refusal.says), "{}: {err}", refusal.what);
        let after = crash::snapshot_dir(root.path());
        if let Some(d) = crash::first_difference(&before, &after) {
            panic!("{} was refused, but changed what it must not: {d}", refusal.what);
        }
    }
    // Another run holds the storage: refused too, touching nothing.
    let storage = LocalDir::new(root.path().join("checkpoints"));
    let LockAttempt::Acquired(held) = storage.try_lock(&StorageHolder::this_process("other", "00aa")).unwrap() else {
        panic!("the storage is free")
    };
    let err = version_1(root.path(), None).run_blocking().expect_err("held").to_string();
    assert!(err.contains("is in use by job `other`"), "{err}");
    assert_eq!(crash::first_difference(&before, &crash::snapshot_dir(root.path())), None);
    drop(held);

    // Version 1 again: it commits checkpoint 3's output and goes on to the
    // end; every key's counts are there once, up to the full count.
    version_1(root.path(), None).run_blocking().unwrap();
    let records = committed(&root.path().join("out"));
    assert_each_count_once(&records, "after the refusals");
    assert_eq!(finals(&records), expected_finals());
}

/// Runs `job`, takes savepoint `v1` after 300 ms, lets three more
/// checkpoints commit output after it, and stops the job; returns the
/// savepoint.
fn savepoint_then_more(job: Job) -> PathBuf {
    weibo::testing::block_on(async {
        let handle = job.spawn().unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let savepoint = handle.savepoint("v1").await.unwrap();
        let at = handle.last_checkpoint().unwrap().get();
        while handle.last_checkpoint().unwrap().get() < at + 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        handle.cancel().await.unwrap();
        savepoint
    })
}

/// Version 1 runs, takes a savepoint, and commits more after it; then a
/// job restored from the savepoint runs to the end, into `checkpoints`.
/// Returns version 1's committed files (name and bytes) and the id the
/// savepoint's source position stands at.
fn committed_after_a_savepoint(root: &Path) -> (BTreeMap<String, Vec<u8>>, PathBuf, u64) {
    let savepoint = savepoint_then_more(version_1(root, Some(4_000.0)));
    let manifest = weibo::checkpoint::read_manifest(&savepoint).unwrap();
    let position = manifest.sources.iter().find(|s| s.source == "ids").unwrap().position;
    let files = crash::snapshot_dir(&root.join("out"));
    let files: BTreeMap<String, Vec<u8>> = files.into_iter().filter(|(n, _)| !n.starts_with(".pending")).collect();
    assert!(files.len() > 3, "version 1 committed after its savepoint: {:?}", files.keys());
    (files, savepoint, position)
}

/// The same pipeline as version 1, restored from `savepoint`, run to the
/// end with its checkpoints in `checkpoints`.
fn restored(root: &Path, checkpoints: &Path, savepoint: &Path) -> Job {
    let job = Job::new("upgrades")
        .with_checkpoints(checkpoints, Duration::from_millis(100))
        .with_max_key_groups(16)
        .restore_from(savepoint);
    out_sink(counted(totals(&job, None)), root);
    job
}

#[test]
fn a_job_restored_from_a_savepoint_writes_beside_what_was_committed_and_replaces_nothing() {
    if std::env::var("WEIBO_UPGRADE_CHILD").is_ok() {
        return;
    }
    for fresh in [false, true] {
        let root = tempfile::tempdir().unwrap();
        let (files, savepoint, position) = committed_after_a_savepoint(root.path());
        let checkpoints = if fresh { root.path().join("fresh") } else { root.path().join("checkpoints") };
        restored(root.path(), &checkpoints, &savepoint).run_blocking().unwrap();
        let now = crash::snapshot_dir(&root.path().join("out"));
        for (name, bytes) in &files {
            assert!(now.get(name) == Some(bytes), "fresh {fresh}: committed file {name} was replaced or removed");
        }
        // Every key's counts complete; what was replayed (the ids after the
        // savepoint that version 1 had committed) is there twice, each copy
        // the same record; nothing before the savepoint is.
        let records = committed(&root.path().join("out"));
        assert_eq!(finals(&records), expected_finals(), "fresh {fresh}");
        let mut seen: BTreeMap<u64, Vec<&Count>> = BTreeMap::new();
        for r in &records {
            seen.entry(r.id).or_default().push(r);
        }
        for (id, copies) in &seen {
            assert!(copies.iter().all(|c| **c == Count::of(*id)), "fresh {fresh}: id {id}: {copies:?}");
            if *id < position {
                assert_eq!(copies.len(), 1, "fresh {fresh}: id {id}, before the savepoint, is committed once");
            } else {
                assert!(copies.len() <= 2, "fresh {fresh}: id {id} is committed {} times", copies.len());
            }
        }
        assert_eq!(seen.len() as u64, IDS, "fresh {fresh}: every id");
        assert!(seen.values().any(|c| c.len() == 2), "fresh {fresh}: the replayed range is there twice, by design");
    }
}

/// As above, with the S3 sink: published objects are never replaced or
/// removed by a job restored from an older savepoint.
#[test]
fn a_job_restored_from_a_savepoint_publishes_beside_what_s3_holds() {
    if std::env::var("WEIBO_UPGRADE_CHILD").is_ok() {
        return;
    }
    let bucket = s3_server::unique_bucket("rollback");
    let out = s3_server::storage(&bucket, "out");
    let root = tempfile::tempdir().unwrap();
    let job = |savepoint: Option<&Path>| {
        let mut job = Job::new("upgrades")
            .with_checkpoints(root.path().join("checkpoints"), Duration::from_millis(100))
            .with_max_key_groups(16);
        if let Some(s) = savepoint {
            job = job.restore_from(s);
        }
        ids(&job, if savepoint.is_some() { None } else { Some(4_000.0) })
            .map(Count::of)
            .sink_exactly_once(S3Sink::json_lines(out.clone()))
            .uid("out");
        job
    };
    let savepoint = savepoint_then_more(job(None));
    let read = |name: &str| {
        let mut bytes = Vec::new();
        out.open(name).unwrap().read_to_end(&mut bytes).unwrap();
        bytes
    };
    let before: BTreeMap<String, Vec<u8>> =
        out.list("part-").unwrap().into_iter().map(|n| (n.clone(), read(&n))).collect();
    assert!(before.len() > 3, "{:?}", before.keys());
    job(Some(&savepoint)).run_blocking().unwrap();
    for (name, bytes) in &before {
        assert!(read(name) == *bytes, "published part {name} was replaced");
    }
    let mut ids: Vec<u64> = Vec::new();
    for name in out.list("part-").unwrap() {
        let text = String::from_utf8(read(&name)).unwrap();
        ids.extend(text.lines().map(|l| serde_json::from_str::<Count>(l).unwrap().id));
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len() as u64, IDS, "every id published");
}
