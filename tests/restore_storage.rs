//! Checkpoint storage: checkpoints in memory restore, rescale, fall back and
//! are retained as in a directory; while the storage is down checkpoints
//! fail and the job goes on, and after it a restore is exact; fjall state
//! restores through checkpoints.

use std::time::Duration;

use weibo::Job;
use weibo::checkpoint::MemoryStorage;
use weibo::sinks::CollectSink;
use weibo::sources::Generator;
use weibo_tests::flaky_storage::Flaky;
use weibo_tests::restore::*;

/// The pipeline of [`job`], checkpointing into `storage`.
fn job_in(storage: &MemoryStorage, partitions: usize, rate: f64, out: &CollectSink<(u64, (u64, u64))>) -> Job {
    let job = Job::new("sums")
        .with_checkpoint_storage(storage.clone(), Duration::from_millis(30))
        .with_retained_checkpoints(2)
        .with_max_key_groups(16);
    job.source(Generator::new(EVENTS, event).with_partitions(2).with_rate(rate)).name("events").sums(partitions, out);
    job
}

/// Checkpoints in a storage that is not a directory, with an object
/// store's rules (objects written once, whole; no rename; `MemoryStorage`
/// refuses to overwrite): they restore, rescale, fall back past damage,
/// keep savepoints and are retained as in a directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_in_another_storage_restore_rescale_fall_back_and_are_retained() {
    use weibo::checkpoint::{CheckpointStorage, MemoryStorage, complete_checkpoints_in, read_manifest_in};

    let storage = MemoryStorage::new();
    let out = CollectSink::new();
    let handle = job_in(&storage, 2, 3_000.0, &out).spawn().unwrap();
    while handle.last_checkpoint().is_none_or(|n| n < 2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let savepoint = handle.savepoint("before-rescale").await.unwrap();
    assert_eq!(savepoint, storage.locate("savepoints/before-rescale"));
    let at = handle.last_checkpoint().unwrap();
    while handle.last_checkpoint().is_none_or(|n| n < at.get() + 3) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!handle.is_finished(), "stopped before the end of input");
    handle.abort();
    // `abort` does not wait for a checkpoint being completed or written at
    // that moment: give it time to land (or not) before looking.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Retention: the newest two complete checkpoints, and the state files
    // they refer to (or that checkpoints in flight wrote after them).
    let complete = complete_checkpoints_in(&storage, "").unwrap();
    assert_eq!(complete.len(), 2, "{complete:?}");
    let newest = complete[0].0;
    let mut referenced = std::collections::BTreeSet::new();
    for (_, dir) in &complete {
        let m = read_manifest_in(&storage, dir).unwrap();
        referenced.extend(m.states.iter().map(|s| format!("shared/{}", s.file.rsplit('/').next().unwrap())));
    }
    for name in storage.list("shared/").unwrap() {
        // `<operator>-<instance>-<state>-<checkpoint>-<run>.state`
        let written: u64 = name.trim_end_matches(".state").rsplit('-').nth(1).unwrap().parse().unwrap();
        assert!(referenced.contains(&name) || written > newest, "{name} outlived retention");
    }
    assert!(storage.exists("savepoints/before-rescale/MANIFEST").unwrap(), "the savepoint outlived retention");

    // Damage every state file the newest checkpoint wrote: the restore
    // falls back to the one before, with 3 partitions.
    let manifest = read_manifest_in(&storage, &complete[0].1).unwrap();
    for s in manifest.states.iter().filter(|s| s.checkpoint == newest) {
        let name = format!("shared/{}", s.file.rsplit('/').next().unwrap());
        let mut bytes = storage.get(&name).unwrap().to_vec();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xFF;
        storage.set(&name, bytes);
    }
    let out = CollectSink::new();
    let handle = job_in(&storage, 3, 1e9, &out).spawn().unwrap();
    assert_eq!(handle.last_checkpoint(), Some(complete[1].0), "restored from the checkpoint before the damaged one");
    let report = handle.wait().await.unwrap();
    assert_eq!(finals(out.values()), expected(), "no event lost or counted twice");
    assert!(report.metrics.operator("events").unwrap().records_out < EVENTS, "sources resumed");

    // The savepoint restores into a job checkpointing elsewhere, with 1 partition.
    let elsewhere = MemoryStorage::new();
    let out = CollectSink::new();
    let restored = job_in(&elsewhere, 1, 1e9, &out)
        .restore_from_storage(std::sync::Arc::new(storage.clone()), "savepoints/before-rescale");
    let report = restored.run().await.unwrap();
    assert_eq!(finals(out.values()), expected());
    assert!(report.metrics.operator("events").unwrap().records_out < EVENTS);
    let missing = job_in(&elsewhere, 1, 1e9, &CollectSink::new())
        .restore_from_storage(std::sync::Arc::new(storage.clone()), "savepoints/none");
    let err = missing.run().await.unwrap_err().to_string();
    assert!(err.contains("memory:/savepoints/none") && err.contains("no complete checkpoint"), "{err}");
}

/// While the storage refuses writes, checkpoints fail and the job goes on;
/// once it takes them again, checkpoints complete, and a restore from them
/// loses and repeats nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_fail_while_the_storage_is_down_and_resume_after() {
    use std::sync::atomic::Ordering;

    // The sums, and an exactly-once copy of the events.
    let job = |storage: &Flaky, out: &CollectSink<(u64, (u64, u64))>, copy: &std::path::Path, rate: f64| {
        let job = Job::new("sums")
            .with_checkpoint_storage(storage.clone(), Duration::from_millis(30))
            .with_max_key_groups(16);
        let events = job.source(Generator::new(EVENTS, event).with_partitions(2).with_rate(rate)).name("events");
        events.sums(2, out);
        events.sink_exactly_once(weibo::sinks::TxnFileSink::json_lines(copy)).name("copy");
        job
    };
    let storage = Flaky::default();
    let out = CollectSink::new();
    let copied = tempfile::tempdir().unwrap();
    let handle = job(&storage, &out, copied.path(), 1_500.0).spawn().unwrap();
    while handle.last_checkpoint().is_none_or(|n| n < 2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    storage.failing.store(true, Ordering::SeqCst);
    // A checkpoint in flight may still complete, if its writes were done.
    tokio::time::sleep(Duration::from_millis(60)).await;
    let during = handle.last_checkpoint();
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(handle.last_checkpoint(), during, "no checkpoint completes while the storage refuses writes");
    assert!(storage.refused.load(Ordering::SeqCst) > 0, "the job tried");
    assert!(!handle.is_finished(), "the job goes on");
    // Then only manifests fail: state files and sink transactions are
    // written, but no checkpoint completes.
    storage.failing_puts.store(true, Ordering::SeqCst);
    storage.failing.store(false, Ordering::SeqCst);
    let refused = storage.refused.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(handle.last_checkpoint(), during, "no checkpoint completes without its manifest");
    assert!(storage.refused.load(Ordering::SeqCst) > refused, "manifests were tried");
    storage.failing_puts.store(false, Ordering::SeqCst);
    while handle.last_checkpoint() <= during {
        assert!(!handle.is_finished(), "checkpoints resume before the input ends");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.abort();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = CollectSink::new();
    let handle = job(&storage, &out, copied.path(), 1e9).spawn().unwrap();
    assert!(handle.last_checkpoint() > during, "restored from a checkpoint taken after the outage");
    let report = handle.wait().await.unwrap();
    assert_eq!(finals(out.values()), expected(), "no event lost or counted twice");
    assert!(report.metrics.operator("events").unwrap().records_out < EVENTS, "sources resumed");
    // The exactly-once copy holds every event once: the transactions of
    // checkpoints whose manifest could not be written were committed with
    // a later one.
    let mut committed: Vec<u64> = Vec::new();
    for entry in std::fs::read_dir(copied.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let (_, i): (u64, u64) = serde_json::from_str(line).unwrap();
                committed.push(i);
            }
        }
    }
    committed.sort_unstable();
    assert_eq!(committed, (0..EVENTS).collect::<Vec<u64>>(), "every event committed exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_of_fjall_state_restore_too() {
    let dir = tempfile::tempdir().unwrap();
    let first_state = tempfile::tempdir().unwrap();
    let out = CollectSink::new();
    let handle = job(dir.path(), 2, 3_000.0, &out)
        .with_state_backend(weibo::state::FjallBackend::open(first_state.path()).unwrap())
        .spawn()
        .unwrap();
    for _ in 0..500 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if handle.last_checkpoint().is_some_and(|n| n >= 3) {
            break;
        }
    }
    assert!(handle.last_checkpoint().is_some_and(|n| n >= 3));
    handle.abort();
    // A new process would start with an empty state directory: restore fills it.
    let second_state = tempfile::tempdir().unwrap();
    let out = CollectSink::new();
    let restored = job(dir.path(), 3, 1e9, &out)
        .with_state_backend(weibo::state::FjallBackend::open(second_state.path()).unwrap());
    restored.run().await.unwrap();
    assert_eq!(finals(out.values()), expected());
}

/// A savepoint in another storage (memory here; S3 alike) is inspected,
/// read typed and rewritten there, and the rewritten savepoints restore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_savepoint_in_another_storage_is_inspected_read_and_rewritten_there() {
    use std::sync::Arc;
    use weibo::checkpoint::CheckpointStorage;
    use weibo::checkpoint::inspect::Inspection;
    use weibo::checkpoint::processor::{SavepointReader, SavepointWriter};

    let storage = MemoryStorage::new();
    let handle = job_in(&storage, 2, 3_000.0, &CollectSink::new()).spawn().unwrap();
    while handle.last_checkpoint().is_none_or(|n| n < 2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.savepoint("taken").await.unwrap();
    assert!(!handle.is_finished(), "the savepoint was taken before the end of input");
    handle.abort();
    let shared: Arc<dyn CheckpointStorage> = Arc::new(storage.clone());

    let (inspection, _) = Inspection::open_in(&shared, "savepoints/taken").unwrap();
    assert_eq!(inspection.path, std::path::PathBuf::from("savepoints/taken"));
    let sums = inspection.operators.iter().find(|o| o.id == "sums").expect("the fold's state");
    let accumulator = sums.states.iter().find(|s| s.name == "accumulator").unwrap();
    assert!(accumulator.entries > 0);

    let reader = SavepointReader::open_in(Arc::clone(&shared), "savepoints/taken").unwrap();
    let entries: Vec<(u64, (u64, u64))> = reader.entries("sums", "accumulator").unwrap();
    assert_eq!(entries.len() as u64, accumulator.entries);
    let whole = expected();
    for (k, (n, _)) in &entries {
        assert!(*n <= whole[k].0, "key {k}: {n} counted of {}", whole[k].0);
    }
    assert!(entries.iter().map(|(_, (n, _))| n).sum::<u64>() < EVENTS, "a savepoint from before the end");

    // Rewritten in the same storage (its state files copied there by the
    // storage), and into another one (read and written across).
    let mut writer = SavepointWriter::from(&reader);
    writer.set_state("sums", "accumulator", entries.iter().copied()).unwrap();
    writer.write_in(&*shared, "savepoints/rewritten").unwrap();
    let elsewhere = MemoryStorage::new();
    SavepointWriter::from(&reader).write_in(&elsewhere, "savepoints/copied").unwrap();
    let err = SavepointWriter::from(&reader).write_in(&elsewhere, "savepoints/copied").unwrap_err().to_string();
    assert!(err.contains("holds a savepoint already"), "{err}");

    for (from, dir) in
        [(Arc::clone(&shared), "savepoints/rewritten"), (Arc::new(elsewhere.clone()) as _, "savepoints/copied")]
    {
        let out = CollectSink::new();
        let report = job_in(&MemoryStorage::new(), 1, 1e9, &out).restore_from_storage(from, dir).run().await.unwrap();
        assert_eq!(finals(out.values()), expected(), "restored from {dir}: nothing lost or counted twice");
        assert!(report.metrics.operator("events").unwrap().records_out < EVENTS, "{dir}: the sources resumed");
    }
}
