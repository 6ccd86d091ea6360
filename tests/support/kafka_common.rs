//! What the Kafka test binaries share: topics, producing and consuming,
//! the counting job of the exactly-once tests and its checks, the child
//! processes of the crash and group tests; and, re-exported, the names
//! they use (`use weibo_tests::kafka_common::*;`).

pub use rdkafka::ClientConfig;
pub use rdkafka::consumer::{BaseConsumer, Consumer};
pub use rdkafka::error::KafkaError;
pub use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
pub use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
pub use rdkafka::{Offset, TopicPartitionList};
pub use serde::{Deserialize, Serialize};
pub use std::collections::{BTreeMap, HashMap};
pub use std::path::Path;
pub use std::process::{Command, Stdio};
pub use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
pub use std::time::{Duration, Instant};
pub use weibo::Job;
pub use weibo_connectors::kafka::{DecodeErrors, Json, KafkaGroup, KafkaRecord, KafkaSink, KafkaSource};

use crate::{crash, kafka_broker};

thread_local! {
    /// A test's own broker, for the helpers called on the test's thread.
    pub static OWN_BROKER: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

pub fn bootstrap() -> String {
    OWN_BROKER.with(|b| b.borrow().clone()).unwrap_or_else(|| kafka_broker::broker().bootstrap.clone())
}

/// A topic name no other test uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

pub fn create_topic(name: &str, partitions: i32) {
    kafka_broker::create_topic(&bootstrap(), name, partitions);
}

/// A record to produce: key, payload, headers, timestamp.
pub struct In<'a> {
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
    pub headers: Vec<(&'a str, &'a [u8])>,
    pub timestamp: Option<i64>,
}

pub fn produce(topic: &str, records: &[In<'_>]) {
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
pub fn send<K, P>(p: &ThreadedProducer<DefaultProducerContext>, mut rec: BaseRecord<'_, K, P>)
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
pub fn consume_all(topic: &str, isolation: &str) -> Vec<OwnedMessage> {
    kafka_broker::consume_all(&bootstrap(), topic, isolation, &unique("checker"))
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    pub n: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Out {
    pub n: u64,
    pub key: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
}

// ---- exactly-once Kafka -> Kafka -------------------------------------------

pub const KEYS: u64 = 17;

pub const EVENTS: u64 = 40_000;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub key: u64,
    pub id: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    pub key: u64,
    pub id: u64,
    pub count: u64,
}

/// The input: event `id` for key `id % KEYS`, keyed so that each key's
/// events are in one partition, in order.
pub fn write_events(topic: &str) {
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
pub fn counting_job(input: &str, output: &str, dir: &Path, slow: bool) -> Job {
    let job = paced_job("kafka-eos", dir.join("checkpoints"));
    let source = KafkaSource::builder(bootstrap(), [input.to_string()], Json).until_end().build::<Event>().unwrap();
    let sink = KafkaSink::new(bootstrap(), output, Json)
        .with_transactions(format!("{output}-txn"), dir.join("redo"))
        .with_consumed_offsets(&source);
    counting(&job, source, sink, if slow { 4 } else { 0 });
    job
}

/// A job checkpointing every 300 ms. A paced map sleeps on the runtime's
/// threads; small batches keep each poll short, so timers (the checkpoint
/// trigger) stay on time.
pub fn paced_job(name: &str, checkpoints: std::path::PathBuf) -> Job {
    Job::new(name).with_checkpoints(checkpoints, Duration::from_millis(300)).with_batch_size(16)
}

/// The counting pipeline: sleeps 1 ms every `pace` records (0: never).
pub fn counting(job: &Job, source: KafkaSource<Event>, sink: KafkaSink<Count>, pace: i64) {
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
pub fn expected() -> BTreeMap<u64, Count> {
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
pub fn assert_exactly_once(topic: &str) -> usize {
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
pub fn committed(topic: &str) -> (BTreeMap<u64, Count>, Vec<u64>) {
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

/// The tasks' checkpoints in S3 (bucket `bucket` of the server at
/// `WEIBO_S3_ENDPOINT`), one prefix per task, instead of the group's
/// directory. A task's lease lasts 3 s: a survivor takes over a killed
/// member's tasks once their leases expired.
pub fn s3_tasks(bucket: &str) -> weibo_connectors::s3::S3Storage {
    let endpoint = std::env::var("WEIBO_S3_ENDPOINT").expect("WEIBO_S3_ENDPOINT");
    weibo_connectors::s3::S3Storage::builder(bucket, "tasks")
        .with_endpoint(endpoint)
        .with_region("us-east-1")
        .with_credentials("test", "testsecret")
        .allow_http()
        .path_style()
        .with_lease_ttl(Duration::from_secs(3))
        .build()
        .unwrap()
}

/// A member of the counting group: runs the tasks the group gives it and
/// writes the partitions it owns to `<dir>/owners-<name>` as they change;
/// runs until killed. With `bucket`, the tasks' checkpoints are in S3
/// ([`s3_tasks`]).
pub fn group_member(input: &str, output: &str, dir: &Path, name: &str, bucket: Option<&str>) {
    let (input, output) = (input.to_string(), output.to_string());
    let owners = dir.join(format!("owners-{name}"));
    let s3 = bucket.map(s3_tasks);
    weibo::testing::block_on(async move {
        let group = KafkaGroup::new(bootstrap(), format!("{output}-group"), [input], dir.join("group"))
            .with_session_timeout(Duration::from_secs(3))
            .spawn(move |task| {
                let job = match &s3 {
                    Some(storage) => Job::new(task.id())
                        .with_checkpoint_storage(storage.under(&task.id()), Duration::from_millis(300))
                        .with_batch_size(16),
                    None => paced_job(&task.id(), task.checkpoint_dir()),
                };
                let source = task.source(Json).build::<Event>()?;
                let sink = KafkaSink::new(bootstrap(), &output, Json).with_transactions(task.id(), task.redo_dir());
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

/// An input topic with the events written, an empty output topic, and a
/// directory for the job.
pub fn events_setup(name: &str) -> (String, String, tempfile::TempDir) {
    let (input, output) = (unique(&format!("{name}-in")), unique(&format!("{name}-out")));
    write_events(&input);
    create_topic(&output, 3);
    (input, output, tempfile::tempdir().unwrap())
}

/// As `events_setup`, with the spec child processes get.
pub fn counting_setup(name: &str) -> (String, tempfile::TempDir, String) {
    let (input, output, dir) = events_setup(name);
    let spec = format!("{input}|{output}|{}", dir.path().display());
    (output, dir, spec)
}

/// Logs to stderr as `RUST_LOG` says.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
}

/// This test binary as a child that runs what `spec` says (see
/// [`run_child`]) on this test's broker: a [`crash::child_command`] with
/// `WEIBO_KAFKA_CHILD` and `WEIBO_KAFKA_BOOTSTRAP`, its output discarded.
pub fn kafka_child(spec: &str) -> Command {
    let mut cmd = crash::child_command("child", "WEIBO_KAFKA_CHILD", spec);
    cmd.env("WEIBO_KAFKA_BOOTSTRAP", bootstrap());
    cmd
}

/// Runs the process `spawn` starts until one finishes, killing each life
/// at a pseudo-random moment (`seed`, within `delays` ms) after it
/// completed a checkpoint of its own in `checkpoints`, so that every life
/// makes progress however fast the machine; at most `max_kills` lives are
/// killed, and the last runs to its end. Returns the kills.
///
/// # Panics
/// When a life fails or runs for two minutes (a test's failure).
pub fn kill_after_checkpoints(
    checkpoints: &Path,
    seed: u64,
    delays: std::ops::Range<u64>,
    max_kills: usize,
    mut spawn: impl FnMut() -> std::process::Child,
) -> usize {
    let mut kills = 0;
    let mut delay = crash::kill_times(seed, delays);
    loop {
        let before = newest_checkpoint(checkpoints);
        let mut child = spawn();
        let started = Instant::now();
        let mut kill_at = None;
        let finished = loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "the child failed: {status}");
                break true;
            }
            if kills < max_kills && kill_at.is_none() && newest_checkpoint(checkpoints) > before {
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
            return kills;
        }
        kills += 1;
    }
}

/// The newest complete checkpoint in `dir`.
pub fn newest_checkpoint(dir: &Path) -> u64 {
    weibo::checkpoint::complete_checkpoints(dir).iter().map(|(n, _)| n.get()).max().unwrap_or(0)
}

/// The partitions a group member wrote it owns (empty before it wrote).
pub fn owners(dir: &Path, name: &str) -> Vec<i32> {
    std::fs::read_to_string(dir.join(format!("owners-{name}")))
        .unwrap_or_default()
        .split(',')
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Waits (up to `limit`) until `done` holds, failing with `what`.
pub fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The sum of `group`'s committed offsets on `topic`'s four partitions.
pub fn group_offsets(group: &str, topic: &str) -> i64 {
    group_offsets_by_partition(group, topic).iter().filter(|o| **o > 0).sum()
}

/// `group`'s committed offsets on `topic`'s four partitions (-1: none).
pub fn group_offsets_by_partition(group: &str, topic: &str) -> Vec<i64> {
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

/// What a child process of a crash or group test runs, per the spec in
/// `WEIBO_KAFKA_CHILD` (nothing when it is not set): a group member
/// (`group|<input>|<output>|<dir>|<name>`) or the counting job
/// (`<input>|<output>|<dir>`).
pub fn run_child() {
    let Ok(spec) = std::env::var("WEIBO_KAFKA_CHILD") else { return };
    init_logs();
    let parts: Vec<&str> = spec.split('|').collect();
    if parts[0] == "group" {
        group_member(parts[1], parts[2], Path::new(parts[3]), parts[4], parts.get(5).copied());
        return;
    }
    let job = counting_job(parts[0], parts[1], Path::new(parts[2]), true);
    weibo::testing::block_on(job.run()).unwrap();
}
