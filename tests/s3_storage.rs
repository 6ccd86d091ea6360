//! Checkpoints in S3 against a local S3 server (moto): the storage keeps
//! the contract Weibo relies on (whole objects, create-only manifests,
//! prefix listing, ranged reads with seeks, server-side copies), and a job
//! checkpoints into it, takes a savepoint there and is restored from it.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::Arc;
use std::time::Duration;

use weibo::Job;
use weibo::checkpoint::CheckpointStorage;
use weibo::sinks::CollectSink;
use weibo::sources::Generator;
use weibo_connectors::s3::S3Storage;
use weibo_tests::s3_server::{self, storage, unique_bucket};

#[test]
fn the_storage_keeps_the_contract_checkpoints_rely_on() {
    let bucket = unique_bucket("contract");
    let s = storage(&bucket, "jobs/one");
    // Small objects in one put, large ones in parts; both read back, with
    // seeks, whole.
    let large: Vec<u8> = (0..20_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    for (name, bytes) in [("shared/small.state", b"tiny".to_vec()), ("shared/large.state", large.clone())] {
        let mut w = s.create(name).unwrap();
        for piece in bytes.chunks(1 << 20) {
            w.write_all(piece).unwrap();
        }
        w.finish().unwrap();
        let mut r = s.open(name).unwrap();
        let mut back = Vec::new();
        r.read_to_end(&mut back).unwrap();
        assert!(back == bytes, "{name} read back as written");
    }
    let mut r = s.open("shared/large.state").unwrap();
    r.seek(SeekFrom::End(-4)).unwrap();
    let mut tail = [0u8; 4];
    r.read_exact(&mut tail).unwrap();
    assert_eq!(&tail, &large[large.len() - 4..]);
    r.seek(SeekFrom::Start(9_000_000)).unwrap();
    let mut mid = [0u8; 16];
    r.read_exact(&mut mid).unwrap();
    assert_eq!(&mid, &large[9_000_000..9_000_016]);

    // A manifest is created once and never replaced.
    s.put("chk-00000000000000000007/MANIFEST", b"{\"first\":true}").unwrap();
    let err = s.put("chk-00000000000000000007/MANIFEST", b"{\"second\":true}").unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists, "{err}");
    let mut m = String::new();
    s.open("chk-00000000000000000007/MANIFEST").unwrap().read_to_string(&mut m).unwrap();
    assert_eq!(m, "{\"first\":true}");
    // Other objects may be put again.
    s.put("owners", b"a").unwrap();
    s.put("owners", b"b").unwrap();

    // Listing is by plain name prefix, under this storage's prefix only.
    storage(&bucket, "jobs/other").put("chk-1/MANIFEST", b"{}").unwrap();
    let mut names = s.list("chk-").unwrap();
    names.sort();
    assert_eq!(names, vec!["chk-00000000000000000007/MANIFEST"]);
    let mut all = s.list("").unwrap();
    all.sort();
    assert_eq!(all, vec!["chk-00000000000000000007/MANIFEST", "owners", "shared/large.state", "shared/small.state"]);
    assert_eq!(s.list("shared/l").unwrap(), vec!["shared/large.state"]);
    assert!(s.list("nothing/").unwrap().is_empty());

    assert!(s.exists("shared/small.state").unwrap());
    s.copy("shared/small.state", "savepoints/v1/small.state").unwrap();
    s.delete("shared/small.state").unwrap();
    s.delete("shared/small.state").unwrap();
    assert!(!s.exists("shared/small.state").unwrap());
    let mut copied = String::new();
    s.open("savepoints/v1/small.state").unwrap().read_to_string(&mut copied).unwrap();
    assert_eq!(copied, "tiny");
    let missing = s.open("shared/none.state").err().expect("no such object");
    assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
    assert!(s.locate("chk-1/MANIFEST").to_string_lossy().ends_with(&format!("{bucket}/jobs/one/chk-1/MANIFEST")));

    // An empty object; reading past the end gives nothing.
    s.create("shared/empty.state").unwrap().finish().unwrap();
    let mut back = Vec::new();
    s.open("shared/empty.state").unwrap().read_to_end(&mut back).unwrap();
    assert!(back.is_empty());
    let mut r = s.open("shared/large.state").unwrap();
    r.seek(SeekFrom::Start(large.len() as u64 + 10)).unwrap();
    assert_eq!(r.read(&mut [0u8; 8]).unwrap(), 0);
    assert!(r.seek(SeekFrom::Current(-(large.len() as i64) - 100)).is_err());

    // A task id with characters S3 keys should not hold lists back.
    let task = s.under("orders~v2 #1");
    task.put("chk-1/MANIFEST", b"{}").unwrap();
    assert_eq!(task.list("chk-").unwrap(), vec!["chk-1/MANIFEST"]);
    assert!(task.locate("x").to_string_lossy().contains("jobs/one/orders_v2__1/x"), "{:?}", task.locate("x"));
    let refused = s3_server::builder(&bucket, "bad~prefix").build().unwrap_err().to_string();
    assert!(refused.contains("prefix `bad~prefix`"), "{refused}");
}

fn counting(job: &Job, out: &CollectSink<(u64, u64)>, rate: Option<f64>) {
    let mut source = Generator::new(60_000, |i| (i % 1_000, 1u64)).with_partitions(2);
    if let Some(r) = rate {
        source = source.with_rate(r);
    }
    job.source(source)
        .name("numbers")
        .key_by(|e: &(u64, u64)| e.0)
        .with_partitions(2)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .name("counts")
        .sink(out.clone());
}

fn last_counts(values: Vec<(u64, u64)>) -> BTreeMap<u64, u64> {
    let mut last = BTreeMap::new();
    for (k, c) in values {
        let e = last.entry(k).or_insert(0);
        *e = (*e).max(c);
    }
    last
}

#[test]
fn a_job_checkpoints_into_s3_and_restores_from_a_savepoint_there() {
    let bucket = unique_bucket("restore");
    let s = storage(&bucket, "counts");
    let first = CollectSink::new();
    let job = Job::new("counts").with_checkpoint_storage(s.clone(), Duration::from_millis(100));
    // Four seconds of input: the savepoint, asked for at 0.8 s, must come
    // before the end, or it is refused (a checkpoint into S3 in flight on
    // a loaded machine can hold the request for a while).
    counting(&job, &first, Some(15_000.0));
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(800));
    assert!(savepoint.to_string_lossy().starts_with(&format!("s3://{bucket}/counts/savepoints/v1")), "{savepoint:?}");
    let complete = weibo::checkpoint::complete_checkpoints_in(&s, "").unwrap();
    assert!(!complete.is_empty(), "checkpoints in S3");
    assert!(s.exists("savepoints/v1/MANIFEST").unwrap());

    let second = CollectSink::new();
    let again = Job::new("counts").restore_from_storage(Arc::new(s.clone()), "savepoints/v1");
    counting(&again, &second, None);
    weibo::testing::block_on(again.run()).unwrap();
    // Every key counted to 60 across both lives: the state came back from S3.
    let counts = last_counts(second.values());
    assert_eq!(counts.len(), 1_000);
    assert!(counts.values().all(|c| *c == 60), "{:?}", counts.iter().find(|(_, c)| **c != 60));
    assert!(second.values().len() < 60_000, "the restored job did not start from the beginning");

    // Inspected, read and rewritten in S3 (its files copied by S3), and the
    // rewrite restores: every count doubled at the savepoint, so every key
    // ends at 60 plus what it had counted then.
    use weibo::checkpoint::processor::{SavepointReader, SavepointWriter};
    let shared: Arc<dyn weibo::checkpoint::CheckpointStorage> = Arc::new(s.clone());
    let (inspection, _) = weibo::checkpoint::inspect::Inspection::open_in(&shared, "savepoints/v1").unwrap();
    let counts_op = inspection.operators.iter().find(|o| o.id == "counts").unwrap();
    assert_eq!(counts_op.states.iter().map(|st| st.entries).sum::<u64>(), 1_000);
    let reader = SavepointReader::open_in(Arc::clone(&shared), "savepoints/v1").unwrap();
    let at_savepoint: Vec<(u64, (u64, u64))> = reader.entries("counts", "value").unwrap();
    assert_eq!(at_savepoint.len(), 1_000);
    let mut writer = SavepointWriter::from(&reader);
    writer.set_state("counts", "value", at_savepoint.iter().map(|(k, (key, c))| (*k, (*key, 2 * c)))).unwrap();
    writer.write_in(&*shared, "savepoints/doubled").unwrap();
    let third = CollectSink::new();
    let doubled = Job::new("counts").restore_from_storage(Arc::clone(&shared), "savepoints/doubled");
    counting(&doubled, &third, None);
    weibo::testing::block_on(doubled.run()).unwrap();
    let counts = last_counts(third.values());
    for (k, (_, c)) in &at_savepoint {
        assert_eq!(counts.get(k), Some(&(60 + c)), "key {k}");
    }
}

#[test]
fn one_run_owns_the_storage_and_a_run_whose_lease_was_taken_over_publishes_nothing() {
    let bucket = unique_bucket("fence");
    let s = storage(&bucket, "task-0");
    // A first life leaves checkpoints behind.
    let job = Job::new("counts").with_checkpoint_storage(s.clone(), Duration::from_millis(100));
    counting(&job, &CollectSink::new(), Some(15_000.0));
    let _ = weibo_tests::savepoint_midway(job, Duration::from_millis(600));
    let start = |out: &CollectSink<(u64, u64)>| {
        let job = Job::new("counts").with_checkpoint_storage(s.clone(), Duration::from_secs(3600));
        counting(&job, out, Some(1_000.0));
        job
    };
    let (a_out, b_out) = (CollectSink::new(), CollectSink::new());
    let (a, b) = (start(&a_out), start(&b_out));
    let s2 = s.clone();
    let (before, checkpointed) = weibo::testing::block_on(async move {
        let a = a.spawn().unwrap();
        // A second run is refused at once, naming the holder.
        let refused = b.spawn().expect_err("the storage is held").to_string();
        assert!(
            refused.contains("is in use by job `counts`")
                && refused.contains(&format!("process {}", std::process::id()))
                && refused.contains("s3://"),
            "{refused}"
        );
        // The first life has let go of the storage (`a` holds it): what it
        // left is final only now (an abort returns before the run has
        // stopped, and a checkpoint it had in flight may still complete).
        let before = weibo::checkpoint::complete_checkpoints_in(&s2, "").unwrap();
        assert!(!before.is_empty());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let checkpointed = a.checkpoint().await.expect("the owner checkpoints");
        // Another process takes the lease over (as one would that found it
        // expired while this run stalled): a lease of its own in `LOCK`.
        let taken = serde_json::json!({
            "holder": { "job": "counts", "pid": 1, "host": "elsewhere", "since_unix_ms": 0, "run": "00ff", "generation": 99 },
            "expires_unix_ms": u64::MAX,
        });
        s2.put("LOCK", taken.to_string().as_bytes()).unwrap();
        let fenced =
            a.checkpoint().await.expect_err("a run that lost its lease completes nothing").report().to_string();
        assert!(fenced.contains("no longer holds its checkpoint storage") && fenced.contains("taken over"), "{fenced}");
        let ended = a.wait().await.expect_err("and stops").to_string();
        assert!(ended.contains("no longer holds its checkpoint storage"), "{ended}");
        (before, checkpointed)
    });
    // The fenced run published nothing after it lost the lease: the newest
    // checkpoint is the one it took while it held it. (Its id may be more
    // than one past the first life's newest: a checkpoint the first life
    // had in flight when it was aborted took an id and never completed.)
    let after = weibo::checkpoint::complete_checkpoints_in(&s, "").unwrap();
    let checkpointed = checkpointed.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    assert_eq!(after[0].1, checkpointed, "{before:?} / {after:?}");
    assert!(after[0].0.get() > before[0].0.get(), "{before:?} / {after:?}");
    // While the other holder's lease lasts, no run starts; once it is
    // released, one does.
    let c = start(&CollectSink::new());
    let refused = weibo::testing::block_on(async move { c.spawn().map(|_| ()) }).expect_err("held by the other");
    assert!(refused.to_string().contains("on elsewhere"), "{refused}");
    let released = serde_json::json!({
        "holder": { "job": "counts", "pid": 1, "host": "elsewhere", "since_unix_ms": 0, "run": "00ff", "generation": 99 },
        "expires_unix_ms": 0,
    });
    s.put("LOCK", released.to_string().as_bytes()).unwrap();
    let out = CollectSink::new();
    let d = start(&out).with_storage_wait(Duration::from_secs(5));
    weibo::testing::block_on(async move {
        let d = d.spawn().expect("the released storage is taken");
        d.cancel().await.unwrap();
    });
    let lease: serde_json::Value = serde_json::from_slice(&read_object(&s, "LOCK")).unwrap();
    assert_eq!(lease["holder"]["generation"], 100, "the fencing token grows: {lease}");
    assert_eq!(lease["expires_unix_ms"], 0, "released when the run ended: {lease}");
}

fn read_object(s: &S3Storage, name: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut s.open(name).unwrap(), &mut bytes).unwrap();
    bytes
}
