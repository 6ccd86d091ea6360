//! Kafka connectors against a real Apache Kafka broker (started by
//! `kafka_broker`): round trips with keys, headers and timestamps, clear
//! errors, and exactly-once Kafka → Kafka across SIGKILLs, checked with a
//! `read_committed` consumer.
//!
//! The crash test's child is this test binary itself, started with
//! `WEIBO_KAFKA_CHILD` set, running only the `child` test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, missing_docs)]

#[path = "kafka_broker.rs"]
mod kafka_broker;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use weibo::Job;
use weibo_connectors::kafka::{DecodeErrors, Json, KafkaGroup, KafkaRecord, KafkaSink, KafkaSource, TxnKafkaSink};

thread_local! {
    /// A test's own broker, for the helpers called on the test's thread.
    static OWN_BROKER: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

fn bootstrap() -> String {
    OWN_BROKER.with(|b| b.borrow().clone()).unwrap_or_else(|| kafka_broker::broker().bootstrap.clone())
}

/// A topic name no other test uses.
fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

fn create_topic(name: &str, partitions: i32) {
    kafka_broker::create_topic(&bootstrap(), name, partitions);
}

/// A record to produce: key, payload, headers, timestamp.
struct In<'a> {
    key: Option<&'a [u8]>,
    value: &'a [u8],
    headers: Vec<(&'a str, &'a [u8])>,
    timestamp: Option<i64>,
}

fn produce(topic: &str, records: &[In<'_>]) {
    let p: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap()).set("enable.idempotence", "true").create().unwrap();
    for r in records {
        let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).payload(r.value);
        if let Some(k) = r.key {
            rec = rec.key(k);
        }
        if let Some(ts) = r.timestamp {
            rec = rec.timestamp(ts);
        }
        if !r.headers.is_empty() {
            let hs =
                r.headers.iter().fold(OwnedHeaders::new(), |hs, (k, v)| hs.insert(Header { key: k, value: Some(*v) }));
            rec = rec.headers(hs);
        }
        send(&p, rec);
    }
    p.flush(Duration::from_secs(30)).unwrap();
}

/// Sends `rec`, waiting while the producer's queue is full.
fn send<K, P>(p: &ThreadedProducer<DefaultProducerContext>, mut rec: BaseRecord<'_, K, P>)
where
    K: rdkafka::message::ToBytes + ?Sized,
    P: rdkafka::message::ToBytes + ?Sized,
{
    loop {
        match p.send(rec) {
            Ok(()) => return,
            Err((KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull), back)) => {
                rec = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => panic!("cannot produce: {e}"),
        }
    }
}

/// Every record of `topic` as a consumer with `isolation` sees it.
fn consume_all(topic: &str, isolation: &str) -> Vec<OwnedMessage> {
    kafka_broker::consume_all(&bootstrap(), topic, isolation, &unique("checker"))
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Payload {
    n: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Out {
    n: u64,
    key: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
}

#[test]
fn a_round_trip_keeps_values_keys_headers_and_timestamps() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (input, output) = (unique("roundtrip-in"), unique("roundtrip-out"));
    create_topic(&input, 3);
    create_topic(&output, 2);
    let values: Vec<Vec<u8>> = (0..300u64).map(|n| serde_json::to_vec(&Payload { n }).unwrap()).collect();
    let keys: Vec<Vec<u8>> = (0..300u64).map(|n| format!("k{}", n % 10).into_bytes()).collect();
    let seqs: Vec<Vec<u8>> = (0..300u64).map(|n| n.to_string().into_bytes()).collect();
    let records: Vec<In<'_>> = (0..300usize)
        .map(|i| In {
            key: Some(&keys[i]),
            value: &values[i],
            headers: vec![("seq", &seqs[i][..]), ("origin", b"test")],
            timestamp: Some(1_700_000_000_000 + i as i64),
        })
        .collect();
    produce(&input, &records);

    let source = KafkaSource::builder(bootstrap(), [input.clone()], Json).until_end().build::<Payload>().unwrap();
    assert_eq!(source.kafka_partitions().len(), 3);
    let job = Job::new("roundtrip");
    job.source(source).map(|r: KafkaRecord<Payload>| Out { n: r.value.n * 2, key: r.key, headers: r.headers }).sink(
        KafkaSink::new(bootstrap(), output.clone(), Json)
            .with_key(|o: &Out| o.key.clone())
            .with_headers(|o: &Out| o.headers.clone()),
    );
    weibo::testing::block_on(job.run()).unwrap();

    let got = consume_all(&output, "read_committed");
    assert_eq!(got.len(), 300);
    let mut seen = BTreeMap::new();
    for m in &got {
        let out: Out = serde_json::from_slice(m.payload().unwrap()).unwrap();
        let n = out.n / 2;
        assert_eq!(out.n % 2, 0);
        assert_eq!(m.key(), Some(format!("k{}", n % 10).as_bytes()), "key of record {n}");
        let hs: Vec<(String, Vec<u8>)> =
            m.headers().unwrap().iter().map(|h| (h.key.to_string(), h.value.unwrap().to_vec())).collect();
        assert_eq!(hs, vec![("seq".to_string(), n.to_string().into_bytes()), ("origin".to_string(), b"test".to_vec())]);
        assert_eq!(m.timestamp().to_millis(), Some(1_700_000_000_000 + n as i64), "timestamp of record {n}");
        *seen.entry(n).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 300);
    assert!(seen.values().all(|c| *c == 1));
}

#[test]
fn unreachable_brokers_and_missing_topics_are_named() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let err = KafkaSource::builder("127.0.0.1:9", ["t"], Json)
        .connect_timeout(Duration::from_secs(2))
        .build::<Payload>()
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot reach the Kafka brokers at 127.0.0.1:9"), "{err}");

    let missing = unique("missing");
    let err = KafkaSource::builder(bootstrap(), [missing.clone()], Json).build::<Payload>().unwrap_err().to_string();
    assert!(err.contains(&format!("topic `{missing}`")) && err.contains("does not exist"), "{err}");
}

#[test]
fn an_undecodable_record_is_named_or_skipped_by_policy() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let input = unique("bad-json");
    create_topic(&input, 1);
    let good = serde_json::to_vec(&Payload { n: 1 }).unwrap();
    let rec = |v: &'static [u8]| In { key: None, value: v, headers: vec![], timestamp: None };
    let good: &'static [u8] = Box::leak(good.into_boxed_slice());
    produce(&input, &[rec(good), rec(good), rec(b"{not json"), rec(good)]);

    let run = |policy: DecodeErrors| {
        let source = KafkaSource::builder(bootstrap(), [input.clone()], Json)
            .until_end()
            .on_decode_error(policy)
            .build::<Payload>()
            .unwrap();
        let skipped = source.skipped();
        let mut t = weibo::testing::TestJob::new("bad-json");
        let s = t.job().source(source).map(|r: KafkaRecord<Payload>| r.offset);
        let got = t.collect(&s);
        (t.run().map(|_| got.values()), skipped.load(Ordering::Relaxed))
    };
    let (failed, _) = run(DecodeErrors::Fail);
    let err = failed.unwrap_err().to_string();
    assert!(err.contains(&format!("topic `{input}` partition 0 offset 2")) && err.contains("JSON"), "{err}");
    let (ok, skipped) = run(DecodeErrors::Skip);
    assert_eq!(ok.unwrap(), vec![0, 1, 3]);
    assert_eq!(skipped, 1);
}

// ---- exactly-once Kafka -> Kafka -------------------------------------------

const KEYS: u64 = 17;
const EVENTS: u64 = 40_000;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Event {
    key: u64,
    id: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Count {
    key: u64,
    id: u64,
    count: u64,
}

/// The input: event `id` for key `id % KEYS`, keyed so that each key's
/// events are in one partition, in order.
fn write_events(topic: &str) {
    create_topic(topic, 4);
    let values: Vec<(Vec<u8>, Vec<u8>)> = (0..EVENTS)
        .map(|id| {
            let e = Event { key: id % KEYS, id };
            (e.key.to_string().into_bytes(), serde_json::to_vec(&e).unwrap())
        })
        .collect();
    let records: Vec<In<'_>> =
        values.iter().map(|(k, v)| In { key: Some(k), value: v, headers: vec![], timestamp: None }).collect();
    produce(topic, &records);
}

/// Reads `input`, counts events per key, writes each event with its key's
/// running count to `output` exactly once.
fn counting_job(input: &str, output: &str, dir: &Path, slow: bool) -> Job {
    let job = paced_job("kafka-eos", dir.join("checkpoints"));
    let source = KafkaSource::builder(bootstrap(), [input.to_string()], Json).until_end().build::<Event>().unwrap();
    let sink = TxnKafkaSink::new(bootstrap(), output, Json, format!("{output}-txn"), dir.join("redo"))
        .with_consumed_offsets(&source);
    counting(&job, source, sink, if slow { 4 } else { 0 });
    job
}

/// A job checkpointing every 300 ms. A paced map sleeps on the runtime's
/// threads; small batches keep each poll short, so timers (the checkpoint
/// trigger) stay on time.
fn paced_job(name: &str, checkpoints: std::path::PathBuf) -> Job {
    Job::new(name).with_checkpoints(checkpoints, Duration::from_millis(300)).with_batch_size(16)
}

/// The counting pipeline: sleeps 1 ms every `pace` records (0: never).
fn counting(job: &Job, source: KafkaSource<Event>, sink: TxnKafkaSink<Count>, pace: i64) {
    job.source(source)
        .map(move |r: KafkaRecord<Event>| {
            if pace > 0 && r.offset % pace == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            Count { key: r.value.key, id: r.value.id, count: 1 }
        })
        .key_by(|c: &Count| c.key)
        .with_partitions(2)
        .reduce(|acc, c| Count { key: c.key, id: c.id, count: acc.count + 1 })
        .sink_exactly_once(sink.with_key(|c: &Count| Some(c.key.to_string().into_bytes())));
}

/// What every correct run writes: event `id` with its key's running count.
fn expected() -> BTreeMap<u64, Count> {
    let mut counts: HashMap<u64, u64> = HashMap::new();
    (0..EVENTS)
        .map(|id| {
            let c = counts.entry(id % KEYS).or_insert(0);
            *c += 1;
            (id, Count { key: id % KEYS, id, count: *c })
        })
        .collect()
}

/// Checks the committed output: every event once, with a crash-free run's
/// running count; reports the first few differences only.
fn assert_exactly_once(topic: &str) -> usize {
    let (got, twice) = committed(topic);
    assert!(twice.is_empty(), "events written twice: {:?} ({} in all)", &twice[..twice.len().min(5)], twice.len());
    let want = expected();
    let missing: Vec<u64> = want.keys().filter(|id| !got.contains_key(id)).copied().collect();
    assert!(missing.is_empty(), "events missing: {:?} ({} in all)", &missing[..missing.len().min(5)], missing.len());
    let wrong: Vec<(&Count, &Count)> =
        want.iter().filter_map(|(id, w)| got.get(id).filter(|g| *g != w).map(|g| (g, w))).take(5).collect();
    assert!(wrong.is_empty(), "running counts differ from a crash-free run's (got, want): {wrong:?}");
    assert_eq!(got.len(), want.len());
    got.len()
}

/// The committed output, with how often each event appears.
fn committed(topic: &str) -> (BTreeMap<u64, Count>, Vec<u64>) {
    let mut out = BTreeMap::new();
    let mut twice = Vec::new();
    for m in consume_all(topic, "read_committed") {
        let c: Count = serde_json::from_slice(m.payload().unwrap()).unwrap();
        if out.insert(c.id, c.clone()).is_some() {
            twice.push(c.id);
        }
    }
    (out, twice)
}

#[test]
fn child() {
    let Ok(spec) = std::env::var("WEIBO_KAFKA_CHILD") else { return };
    init_logs();
    let parts: Vec<&str> = spec.split('|').collect();
    if parts[0] == "group" {
        group_member(parts[1], parts[2], Path::new(parts[3]), parts[4]);
        return;
    }
    let job = counting_job(parts[0], parts[1], Path::new(parts[2]), true);
    weibo::testing::block_on(job.run()).unwrap();
}

/// A member of the counting group: runs the tasks the group gives it and
/// writes the partitions it owns to `<dir>/owners-<name>` as they change;
/// runs until killed.
fn group_member(input: &str, output: &str, dir: &Path, name: &str) {
    let (input, output) = (input.to_string(), output.to_string());
    let owners = dir.join(format!("owners-{name}"));
    weibo::testing::block_on(async move {
        let group = KafkaGroup::new(bootstrap(), format!("{output}-group"), [input], dir.join("group"))
            .session_timeout(Duration::from_secs(3))
            .spawn(move |task| {
                let job = paced_job(&task.id(), task.checkpoint_dir());
                let source = task.source(Json).build::<Event>()?;
                let sink = TxnKafkaSink::new(bootstrap(), &output, Json, task.id(), task.redo_dir());
                counting(&job, source, sink, 1);
                Ok(job)
            })
            .unwrap();
        let mut last = None;
        while !group.is_finished() {
            let owned = group.owned();
            if last.as_ref() != Some(&owned) {
                let text: Vec<String> = owned.iter().map(ToString::to_string).collect();
                std::fs::write(owners.with_extension("tmp"), text.join(",")).unwrap();
                std::fs::rename(owners.with_extension("tmp"), &owners).unwrap();
                last = Some(owned);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        group.wait().await.unwrap();
    });
}

#[test]
fn kafka_to_kafka_without_crashes_writes_every_event_once() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (input, output, dir) = events_setup("eos");
    weibo::testing::block_on(counting_job(&input, &output, dir.path(), false).run()).unwrap();
    assert_exactly_once(&output);
    // The consumed offsets went to the source's group with the output:
    // at the end of input, the end of every partition.
    let group = group_offsets_by_partition(&format!("weibo-{input}"), &input);
    assert!(group.iter().all(|o| *o > 0), "every partition's offset was committed: {group:?}");
    assert_eq!(group.iter().sum::<i64>(), EVENTS as i64, "the group's offsets are the ends of the input: {group:?}");
    // The redo logs of committed epochs are gone.
    let left: Vec<_> = std::fs::read_dir(dir.path().join("redo"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".redo"))
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "redo logs left behind: {left:?}");
}

/// An input topic with the events written, an empty output topic, and a
/// directory for the job.
fn events_setup(name: &str) -> (String, String, tempfile::TempDir) {
    let (input, output) = (unique(&format!("{name}-in")), unique(&format!("{name}-out")));
    write_events(&input);
    create_topic(&output, 3);
    (input, output, tempfile::tempdir().unwrap())
}

/// As `events_setup`, with the spec child processes get.
fn counting_setup(name: &str) -> (String, tempfile::TempDir, String) {
    let (input, output, dir) = events_setup(name);
    let spec = format!("{input}|{output}|{}", dir.path().display());
    (output, dir, spec)
}

/// Logs to stderr as `RUST_LOG` says.
fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
}

/// This test binary as a child that runs `counting_job` per `spec`.
fn child_command(spec: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env("WEIBO_KAFKA_CHILD", spec)
        .env("WEIBO_KAFKA_BOOTSTRAP", bootstrap())
        .stdout(Stdio::null());
    cmd
}

#[test]
fn a_crash_between_checkpoint_and_commit_is_recommitted_from_the_redo_log() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (output, dir, spec) = counting_setup("recommit");
    let run = |crash: Option<&str>| {
        let mut cmd = child_command(&spec);
        cmd.stderr(Stdio::null());
        if let Some(n) = crash {
            cmd.env("WEIBO_CRASH_AT", format!("after-manifest#{n}"));
        }
        cmd.status().unwrap()
    };
    // Checkpoint 2 is published, then the process dies before committing
    // its transactions; they die with it (the restart fences them).
    assert!(!run(Some("2")).success(), "the first life aborts at its crash point");
    let redo: Vec<String> = std::fs::read_dir(dir.path().join("redo"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with("00000000000000000002.redo"))
        .collect();
    assert!(!redo.is_empty(), "epoch 2 waits in its redo logs");
    // Checkpoint 1 was committed with its consumed offsets, in its
    // transactions: the group's offsets are its positions.
    let input = spec.split('|').next().unwrap();
    let manifest =
        weibo::checkpoint::read_manifest(&dir.path().join("checkpoints").join(format!("chk-{:020}", 1))).unwrap();
    let positions: Vec<i64> =
        (0..4).map(|p| manifest.sources.iter().find(|e| e.partition == p).map_or(-1, |e| e.position as i64)).collect();
    assert_eq!(group_offsets_by_partition(&format!("weibo-{input}"), input), positions);
    assert!(run(None).success(), "the second life finishes");
    assert_exactly_once(&output);
}

/// A cheap deterministic pseudo-random sequence of delays (0 to 800 ms).
fn delays(seed: u64) -> impl Iterator<Item = Duration> {
    let mut x = seed;
    std::iter::repeat_with(move || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        Duration::from_millis((x >> 33) % 800)
    })
}

/// The newest complete checkpoint in `dir`.
fn newest_checkpoint(dir: &Path) -> u64 {
    weibo::checkpoint::complete_checkpoints(dir).iter().map(|(n, _)| *n).max().unwrap_or(0)
}

#[test]
fn killed_again_and_again_kafka_to_kafka_commits_every_event_exactly_once() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (output, dir, spec) = counting_setup("crash");
    // Each life is killed at a pseudo-random moment after it completed a
    // checkpoint of its own (so every life makes progress, however fast
    // the machine), up to 6 times; the last life runs to the end.
    let mut kills = 0;
    let mut delay = delays(5);
    loop {
        let before = newest_checkpoint(&dir.path().join("checkpoints"));
        let mut child = child_command(&spec).stderr(Stdio::inherit()).spawn().unwrap();
        let started = Instant::now();
        let mut kill_at = None;
        let finished = loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "the child failed: {status}");
                break true;
            }
            if kills < 6 && kill_at.is_none() && newest_checkpoint(&dir.path().join("checkpoints")) > before {
                kill_at = Some(Instant::now() + delay.next().unwrap());
            }
            if kill_at.is_some_and(|t| Instant::now() >= t) {
                child.kill().unwrap();
                child.wait().unwrap();
                break false;
            }
            assert!(started.elapsed() < Duration::from_secs(120), "a life of the job ran for two minutes");
            std::thread::sleep(Duration::from_millis(5));
        };
        eprintln!("life {}: {:?}, {}", kills + 1, started.elapsed(), if finished { "finished" } else { "killed" });
        if finished {
            break;
        }
        kills += 1;
    }
    assert!(kills >= 3, "the child was killed mid-run several times ({kills})");
    let committed = assert_exactly_once(&output);
    // Aborted transactions were written and are hidden from read_committed.
    let all = consume_all(&output, "read_uncommitted").len();
    eprintln!("{kills} kills; read_uncommitted sees {all} records, read_committed {committed}");
}

#[test]
fn a_transaction_timeout_above_the_brokers_maximum_is_refused_naming_both() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (input, output) = (unique("timeout-in"), unique("timeout-out"));
    create_topic(&input, 1);
    create_topic(&output, 1);
    produce(&input, &[In { key: None, value: b"x", headers: vec![], timestamp: None }]);
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("too-long").with_checkpoints(dir.path().join("checkpoints"), Duration::from_secs(1));
    let source = KafkaSource::builder(bootstrap(), [input], weibo_connectors::kafka::Text).until_end().build().unwrap();
    job.source(source).map(|r: KafkaRecord<String>| r.value).sink_exactly_once(
        TxnKafkaSink::new(bootstrap(), output, weibo_connectors::kafka::Text, "too-long", dir.path().join("redo"))
            .transaction_timeout(Duration::from_secs(20 * 60)),
    );
    let err = weibo::testing::block_on(job.run()).unwrap_err().to_string();
    assert!(err.contains("transaction.timeout.ms = 1200000 ms"), "{err}");
    assert!(err.contains("transaction.max.timeout.ms"), "{err}");
    eprintln!("{err}");
}

#[test]
fn a_transaction_the_brokers_abort_for_its_timeout_is_written_again() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    init_logs();
    let (input, output, dir) = events_setup("expire");
    // Checkpoints every 4 s, transactions time out after 1.5 s: the
    // brokers abort every epoch's transaction before its checkpoint.
    let job =
        Job::new("expire").with_checkpoints(dir.path().join("checkpoints"), Duration::from_secs(4)).with_batch_size(16);
    let source = KafkaSource::builder(bootstrap(), [input], Json).until_end().build::<Event>().unwrap();
    let sink = TxnKafkaSink::new(bootstrap(), &output, Json, format!("{output}-txn"), dir.path().join("redo"))
        .transaction_timeout(Duration::from_millis(1500));
    counting(&job, source, sink, 2);
    weibo::testing::block_on(job.run()).expect("expired transactions are written again");
    assert_exactly_once(&output);
}

#[test]
fn a_broker_restart_in_the_middle_of_an_exactly_once_job_loses_and_repeats_nothing() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    init_logs();
    let broker = kafka_broker::Broker::private();
    OWN_BROKER.with(|b| *b.borrow_mut() = Some(broker.bootstrap.clone()));
    let (input, output, dir) = events_setup("restart");
    let job = counting_job(&input, &output, dir.path(), true);
    let run = std::thread::spawn(move || weibo::testing::block_on(job.run()));
    let checkpoints = dir.path().join("checkpoints");
    wait_for("two checkpoints", Duration::from_secs(60), || newest_checkpoint(&checkpoints) >= 2);
    let (before, _) = committed(&output);
    // Down for a few seconds, in the middle of the run.
    broker.down();
    std::thread::sleep(Duration::from_secs(3));
    broker.up();
    wait_for("the job to finish after the restart", Duration::from_secs(120), || run.is_finished());
    run.join().unwrap().expect("the job rides out the broker's restart");
    assert!((before.len() as u64) < EVENTS, "the restart came before the end ({} events were out)", before.len());
    assert_exactly_once(&output);
}

#[test]
fn a_group_can_leave_its_offsets_to_the_transactions_of_its_tasks() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (input, output, dir) = events_setup("txoffsets");
    let group_name = format!("{output}-group");
    let member = || {
        let (i, o, g, d) = (input.clone(), output.clone(), group_name.clone(), dir.path().to_path_buf());
        let out = output.clone();
        weibo::testing::block_on(async move {
            let newest = |d: &Path| -> Vec<u64> {
                (0..4).map(|p| newest_checkpoint(&d.join(format!("partition-{p}/checkpoints")))).collect()
            };
            let before = newest(&d);
            let group = KafkaGroup::new(bootstrap(), g, [i], d.clone())
                .session_timeout(Duration::from_secs(3))
                .offsets_in_transactions()
                .spawn(move |task| {
                    let job = paced_job(&task.id(), task.checkpoint_dir());
                    let source = task.source(Json).until_end().build::<Event>()?;
                    let sink = TxnKafkaSink::new(bootstrap(), &o, Json, task.id(), task.redo_dir())
                        .with_consumed_offsets(&source);
                    counting(&job, source, sink, 0);
                    Ok(job)
                })
                .unwrap();
            let started = Instant::now();
            // Every task finishes its input with a final checkpoint.
            while committed(&out).0.len() < EVENTS as usize
                || newest(&d).iter().zip(&before).any(|(now, then)| now <= then)
            {
                assert!(started.elapsed() < Duration::from_secs(120), "the group's tasks finished their input");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            group.stop().await.unwrap();
        });
    };
    member();
    assert_exactly_once(&output);
    // The group started again on the same storage: its tasks had finished,
    // so each restores its final checkpoint and writes nothing.
    member();
    assert_exactly_once(&output);
    // Each task's last transaction carried its partition's end.
    let offsets = group_offsets_by_partition(&group_name, &input);
    assert_eq!(offsets.iter().sum::<i64>(), EVENTS as i64, "the group's offsets are the input's ends: {offsets:?}");
}

#[test]
fn input_not_partitioned_by_key_is_repartitioned_through_a_topic_by_two_groups() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (input, middle, output) = (unique("rep-in"), unique("rep-mid"), unique("rep-out"));
    create_topic(&input, 4);
    create_topic(&middle, 4);
    create_topic(&output, 3);
    // No Kafka key: the events of one key are spread over every partition.
    let values: Vec<Vec<u8>> =
        (0..EVENTS).map(|id| serde_json::to_vec(&Event { key: id % KEYS, id }).unwrap()).collect();
    let records: Vec<In<'_>> =
        values.iter().map(|v| In { key: None, value: v, headers: vec![], timestamp: None }).collect();
    produce(&input, &records);
    let dir = tempfile::tempdir().unwrap();
    let (d, m, o) = (dir.path().to_path_buf(), middle.clone(), output.clone());
    let out = output.clone();
    weibo::testing::block_on(async move {
        // Stage 1: re-key each event by its key into `middle`, exactly once.
        let m1 = m.clone();
        let first = KafkaGroup::new(bootstrap(), format!("{m}-group"), [input], d.join("first"))
            .spawn(move |task| {
                let job = paced_job(&task.id(), task.checkpoint_dir());
                job.source(task.source(Json).build::<Event>()?).map(|r: KafkaRecord<Event>| r.value).sink_exactly_once(
                    TxnKafkaSink::new(bootstrap(), &m1, Json, task.id(), task.redo_dir())
                        .with_key(|e: &Event| Some(e.key.to_string().into_bytes())),
                );
                Ok(job)
            })
            .unwrap();
        // Stage 2: each key is in one partition of `middle` now: count.
        let second = KafkaGroup::new(bootstrap(), format!("{o}-group"), [m], d.join("second"))
            .spawn(move |task| {
                let job = paced_job(&task.id(), task.checkpoint_dir());
                let sink = TxnKafkaSink::new(bootstrap(), &o, Json, task.id(), task.redo_dir());
                counting(&job, task.source(Json).build::<Event>()?, sink, 0);
                Ok(job)
            })
            .unwrap();
        let started = Instant::now();
        while committed(&out).0.len() < EVENTS as usize {
            assert!(started.elapsed() < Duration::from_secs(120), "both stages wrote everything");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        first.stop().await.unwrap();
        second.stop().await.unwrap();
    });
    let (got, twice) = committed(&output);
    assert!(twice.is_empty(), "events written twice: {:?}", &twice[..twice.len().min(5)]);
    assert_eq!(got.len() as u64, EVENTS, "every event once");
    // Every key's events were counted by one task: its counts run 1..=n.
    let mut counts: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for c in got.values() {
        counts.entry(c.key).or_default().push(c.count);
    }
    for (key, mut cs) in counts {
        cs.sort_unstable();
        let n = cs.len() as u64;
        let first: Vec<u64> = cs.iter().take(8).copied().collect();
        assert!(cs.iter().copied().eq(1..=n), "key {key}: counts are not 1..={n}, each once (they start {first:?})");
    }
}

/// The partitions a group member wrote it owns (empty before it wrote).
fn owners(dir: &Path, name: &str) -> Vec<i32> {
    std::fs::read_to_string(dir.join(format!("owners-{name}")))
        .unwrap_or_default()
        .split(',')
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Waits (up to `limit`) until `done` holds, failing with `what`.
fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The sum of `group`'s committed offsets on `topic`'s four partitions.
fn group_offsets(group: &str, topic: &str) -> i64 {
    group_offsets_by_partition(group, topic).iter().filter(|o| **o > 0).sum()
}

/// `group`'s committed offsets on `topic`'s four partitions (-1: none).
fn group_offsets_by_partition(group: &str, topic: &str) -> Vec<i64> {
    let consumer: BaseConsumer =
        ClientConfig::new().set("bootstrap.servers", bootstrap()).set("group.id", group).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..4 {
        tpl.add_partition(topic, p);
    }
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    let mut by_partition = vec![-1; 4];
    for e in committed.elements() {
        if let (Offset::Offset(o), Ok(p)) = (e.offset(), usize::try_from(e.partition())) {
            by_partition[p] = o;
        }
    }
    by_partition
}

#[test]
fn two_group_members_split_the_partitions_and_a_survivor_takes_over_with_the_state() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (output, dir, spec) = counting_setup("group");
    let task_checkpoint = |p: i32| newest_checkpoint(&dir.path().join(format!("group/partition-{p}/checkpoints")));
    let member = |name: &str| child_command(&format!("group|{spec}|{name}")).stderr(Stdio::inherit()).spawn().unwrap();
    // A alone owns all four partitions and checkpoints each task.
    let mut a = member("a");
    wait_for("a to run and checkpoint all four tasks", Duration::from_secs(60), || {
        owners(dir.path(), "a").len() == 4 && (0..4).all(|p| task_checkpoint(p) > 0)
    });
    // B joins: A stops some tasks with a last checkpoint, B restores them.
    let mut b = member("b");
    wait_for("b to take partitions from a", Duration::from_secs(60), || {
        !owners(dir.path(), "b").is_empty() && owners(dir.path(), "a").len() < 4
    });
    let taken = owners(dir.path(), "b");
    let at_handover: Vec<u64> = taken.iter().map(|p| task_checkpoint(*p)).collect();
    wait_for("b to checkpoint its tasks", Duration::from_secs(60), || {
        taken.iter().zip(&at_handover).all(|(p, before)| task_checkpoint(*p) > *before)
    });
    let (done, _) = committed(&output);
    assert!(
        (done.len() as u64) < EVENTS,
        "the input was all processed before b was killed ({} events): the test needs a slower pace",
        done.len()
    );
    // B dies; after the session timeout A owns everything again and goes
    // on from B's checkpoints.
    b.kill().unwrap();
    b.wait().unwrap();
    wait_for("a to take b's partitions back", Duration::from_secs(60), || owners(dir.path(), "a").len() == 4);
    wait_for("every event in the output", Duration::from_secs(180), || {
        assert!(a.try_wait().unwrap().is_none(), "member a ended");
        committed(&output).0.len() as u64 >= EVENTS
    });
    // For monitoring, the group's committed offsets follow the reading.
    let input = spec.split('|').next().unwrap().to_string();
    wait_for("the group's offsets to reach the end of the input", Duration::from_secs(30), || {
        group_offsets(&format!("{output}-group"), &input) >= EVENTS as i64
    });
    a.kill().unwrap();
    a.wait().unwrap();
    eprintln!("b owned {taken:?}, from checkpoints {at_handover:?}");
    assert_exactly_once(&output);
}

// ---- benchmark ----------------------------------------------------------------

/// Kafka → Kafka throughput on the test broker: a hand-written rdkafka
/// consume → produce pipe, Weibo at least once, Weibo exactly once with a
/// checkpoint every second; records of 100 bytes. Run in release:
///
/// ```sh
/// cargo test --release -p weibo-tests --test kafka -- --ignored --nocapture kafka_pipe_throughput
/// ```
///
/// `WEIBO_KAFKA_BENCH_RECORDS` (default 1,000,000) and `WEIBO_KAFKA_BENCH_REPS`
/// (default 3) size it; it prints every run and the medians.
#[test]
#[ignore = "a benchmark: run it in release, by name"]
fn kafka_pipe_throughput() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let n: usize = env_or("WEIBO_KAFKA_BENCH_RECORDS", 1_000_000);
    let reps: usize = env_or("WEIBO_KAFKA_BENCH_REPS", 3);
    let input = bench_input(n);

    let mut results: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for rep in 0..reps {
        for kind in PIPES {
            let output = unique("bench-out");
            create_topic(&output, 4);
            let dir = tempfile::tempdir().unwrap();
            let t = Instant::now();
            copy(kind, &input, &output, n, dir.path());
            let secs = t.elapsed().as_secs_f64();
            let got = count_records(&output);
            assert_eq!(got, n, "{kind} wrote every record");
            eprintln!("rep {rep}: {kind}: {n} records in {secs:.2} s = {:.0} records/s", n as f64 / secs);
            results.entry(kind).or_default().push(n as f64 / secs);
        }
    }
    let median = |v: &Vec<f64>| {
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let raw = median(&results["raw rdkafka pipe"]);
    for (kind, v) in &results {
        eprintln!("median {kind}: {:.0} records/s ({:.0}% of the raw pipe)", median(v), 100.0 * median(v) / raw);
    }
}

/// A benchmark setting from the environment.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A new 4-partition topic holding `n` records of 100 bytes, keyed by
/// `i % 1000`.
fn bench_input(n: usize) -> String {
    let input = unique("bench-in");
    create_topic(&input, 4);
    let payloads: Vec<Vec<u8>> = (0..n).map(|i| format!("{i:0>100}").into_bytes()).collect();
    let keys: Vec<Vec<u8>> = (0..n).map(|i| (i % 1000).to_string().into_bytes()).collect();
    let records: Vec<In<'_>> =
        (0..n).map(|i| In { key: Some(&keys[i]), value: &payloads[i], headers: vec![], timestamp: None }).collect();
    let t = Instant::now();
    produce(&input, &records);
    eprintln!("produced {n} records of 100 bytes in {:.2?}", t.elapsed());
    input
}

/// The pipelines the benchmarks compare.
const PIPES: [&str; 3] = ["raw rdkafka pipe", "weibo at-least-once", "weibo exactly-once (1 s checkpoints)"];

/// Copies the first `n` records of `input` to `output` with pipeline `kind`.
fn copy(kind: &str, input: &str, output: &str, n: usize, dir: &Path) {
    if kind == PIPES[0] {
        raw_pipe(input, output, n, &AtomicBool::new(false));
    } else {
        weibo::testing::block_on(bench_job(kind, input, output, dir, true).run()).unwrap();
    }
}

/// A Weibo copy of `input` to `output`, at least or exactly once.
fn bench_job(kind: &str, input: &str, output: &str, dir: &Path, bounded: bool) -> Job {
    let mut source = KafkaSource::builder(bootstrap(), [input.to_string()], weibo_connectors::kafka::Bytes);
    if bounded {
        source = source.until_end();
    }
    let source = source.build::<Vec<u8>>().unwrap();
    let key = |r: &(Option<Vec<u8>>, Vec<u8>)| r.0.clone();
    if kind == PIPES[1] {
        let job = Job::new("bench-alo");
        job.source(source)
            .map(|r: KafkaRecord<Vec<u8>>| (r.key, r.value))
            .sink(KafkaSink::new(bootstrap(), output, KeyedBytes).with_key(key));
        job
    } else {
        let job = Job::new("bench-eos").with_checkpoints(dir.join("cp"), Duration::from_secs(1));
        job.source(source).map(|r: KafkaRecord<Vec<u8>>| (r.key, r.value)).sink_exactly_once(
            TxnKafkaSink::new(bootstrap(), output, KeyedBytes, format!("{output}-txn"), dir.join("redo")).with_key(key),
        );
        job
    }
}

/// End-to-end latency on the test broker, for each pipeline of
/// `kafka_pipe_throughput`: first its maximum rate (copying
/// `WEIBO_KAFKA_BENCH_RECORDS` records, default 300,000), then, for
/// `WEIBO_KAFKA_LATENCY_SECS` seconds (default 15), input produced at half
/// that rate (`WEIBO_KAFKA_LATENCY_SHARE`, default 0.5); a record's latency is from just before it is handed to the
/// input's producer to when a `read_committed` consumer of the output has
/// it. The first 3 seconds are not counted. Run in release:
///
/// ```sh
/// cargo test --release -p weibo-tests --test kafka -- --ignored --nocapture kafka_pipe_latency
/// ```
#[test]
#[ignore = "a benchmark: run it in release, by name"]
fn kafka_pipe_latency() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let n: usize = env_or("WEIBO_KAFKA_BENCH_RECORDS", 300_000);
    let secs: u64 = env_or("WEIBO_KAFKA_LATENCY_SECS", 15);
    let share: f64 = env_or("WEIBO_KAFKA_LATENCY_SHARE", 0.5);
    let input = bench_input(n);
    let mut report = Vec::new();
    for kind in PIPES {
        let output = unique("lat-max-out");
        create_topic(&output, 4);
        let dir = tempfile::tempdir().unwrap();
        let t = Instant::now();
        copy(kind, &input, &output, n, dir.path());
        let max = n as f64 / t.elapsed().as_secs_f64();
        let rate = max * share;
        let (lat, sent) = latency_run(kind, rate, Duration::from_secs(secs));
        let pct = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
        let line = format!(
            "{kind}: max {max:.0} records/s; at {rate:.0} records/s ({} counted of {sent} sent): \
             p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms",
            lat.len(),
            pct(0.5),
            pct(0.99),
            pct(0.999),
            pct(1.0)
        );
        eprintln!("{line}");
        report.push(line);
    }
    for line in report {
        eprintln!("{line}");
    }
}

fn now_micros() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// Runs pipeline `kind` on fresh topics while producing `rate` records/s
/// for `length`; returns the sorted latencies in microseconds of the
/// records sent after the first 3 seconds, and how many were sent in all.
fn latency_run(kind: &str, rate: f64, length: Duration) -> (Vec<u64>, usize) {
    let (input, output) = (unique("lat-in"), unique("lat-out"));
    create_topic(&input, 4);
    create_topic(&output, 4);
    let dir = tempfile::tempdir().unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (pipe, job) = if kind == PIPES[0] {
        let (i, o, s) = (input.clone(), output.clone(), std::sync::Arc::clone(&stop));
        (Some(std::thread::spawn(move || raw_pipe(&i, &o, usize::MAX, &s))), None)
    } else {
        let _guard = runtime.enter();
        (None, Some(bench_job(kind, &input, &output, dir.path(), false).spawn().unwrap()))
    };
    // The reader: latency of every record sent after the warm-up.
    let warm = now_micros() + 3_000_000;
    let (o, s) = (output.clone(), std::sync::Arc::clone(&stop));
    let reader = std::thread::spawn(move || {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("group.id", unique("lat-reader"))
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "5")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        for part in 0..4 {
            tpl.add_partition_offset(&o, part, Offset::Beginning).unwrap();
        }
        c.assign(&tpl).unwrap();
        let mut lat = Vec::new();
        while !s.load(Ordering::Relaxed) {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(50)) {
                let now = now_micros();
                let sent: u64 = std::str::from_utf8(&m.payload().unwrap()[..16]).unwrap().parse().unwrap();
                if sent >= warm {
                    lat.push(now.saturating_sub(sent));
                }
            }
        }
        lat
    });
    // The writer: `rate` records per second, in steps of a millisecond.
    let p: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap()).set("linger.ms", "1").create().unwrap();
    let started = Instant::now();
    let mut sent = 0usize;
    while started.elapsed() < length {
        let due = (started.elapsed().as_secs_f64() * rate) as usize;
        while sent < due {
            let payload = format!("{:016}{:0>84}", now_micros(), sent);
            let key = (sent % 1000).to_string();
            send(&p, BaseRecord::<'_, str, str>::to(&input).payload(payload.as_str()).key(key.as_str()));
            sent += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    p.flush(Duration::from_secs(30)).unwrap();
    // Time for the last records to come through (a checkpoint or two).
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let mut lat = reader.join().unwrap();
    if let Some(pipe) = pipe {
        pipe.join().unwrap();
    }
    if let Some(job) = job {
        runtime.block_on(job.cancel()).unwrap();
    }
    lat.sort_unstable();
    assert!(!lat.is_empty(), "{kind}: no record came through");
    (lat, sent)
}

/// The value's bytes as they are; the key goes through `with_key`.
struct KeyedBytes;

impl weibo_connectors::kafka::Format<(Option<Vec<u8>>, Vec<u8>)> for KeyedBytes {
    fn name(&self) -> &'static str {
        "bytes"
    }

    fn decode(&self, bytes: &[u8]) -> Result<(Option<Vec<u8>>, Vec<u8>), String> {
        Ok((None, bytes.to_vec()))
    }

    fn encode(&self, value: &(Option<Vec<u8>>, Vec<u8>), out: &mut Vec<u8>) -> Result<(), String> {
        out.extend_from_slice(&value.1);
        Ok(())
    }
}

/// The baseline: one consumer reading every partition, one idempotent
/// producer, no framework; copies `n` records or until `stop`.
fn raw_pipe(input: &str, output: &str, n: usize, stop: &AtomicBool) {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("raw"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for part in 0..4 {
        tpl.add_partition_offset(input, part, Offset::Beginning).unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut done = 0;
    while done < n && !stop.load(Ordering::Relaxed) {
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let mut rec: BaseRecord<'_, [u8], [u8]> =
                    BaseRecord::to(output).payload(m.payload().unwrap_or_default());
                if let Some(k) = m.key() {
                    rec = rec.key(k);
                }
                send(&p, rec);
                done += 1;
            }
            Some(Err(e)) => panic!("{e}"),
            None => {}
        }
    }
    p.flush(Duration::from_secs(60)).unwrap();
}

/// How many records `topic` holds (high watermarks summed; the topic is
/// written by one producer without transactions aborted).
fn count_records(topic: &str) -> usize {
    consume_all(topic, "read_committed").len()
}

/// A rollback: a finished job, run again (its commit markers are then the
/// second run's), restored from its first checkpoint. That checkpoint's
/// transactions were committed by the first run and their redo logs are
/// gone: the restore counts them as committed, and the job writes again
/// what came after the checkpoint (exactly once holds from the restored
/// checkpoint on, as after any restore of an older checkpoint).
#[test]
fn restored_from_an_older_checkpoint_after_later_runs_committed_the_job_starts_and_writes_again() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (input, output, dir) = events_setup("rollback");
    let job = || counting_job(&input, &output, dir.path(), false).with_retained_checkpoints(1_000);
    weibo::testing::block_on(job().run()).unwrap();
    assert_exactly_once(&output);
    weibo::testing::block_on(job().run()).unwrap();
    assert_exactly_once(&output);
    let checkpoints = weibo::checkpoint::complete_checkpoints(&dir.path().join("checkpoints"));
    let (first, path) = checkpoints.last().cloned().unwrap();
    let manifest = weibo::checkpoint::read_manifest(&path).unwrap();
    assert!(!manifest.commits.is_empty(), "checkpoint {first} committed transactions");
    weibo::testing::block_on(job().restore_from(&path).run()).unwrap();
    let (got, twice) = committed(&output);
    assert_eq!(got.len() as u64, EVENTS, "every event is there");
    let from: u64 = manifest.sources.iter().map(|s| s.position).sum();
    assert!(twice.len() as u64 <= EVENTS - from, "only what came after checkpoint {first} is written again");
}
