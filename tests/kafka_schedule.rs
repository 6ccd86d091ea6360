//! Exactly once Kafka → Kafka across random schedules of runs (see
//! `weibo_tests::schedule`), against a real broker (started by `kafka_broker`): a
//! bounded `KafkaSource` (`until_end`), a running count per key in keyed
//! state, a `KafkaSink`; after every run a `read_committed` consumer
//! finds every id at most once with a crash-free run's running count, and
//! after a run to the end, every id.
//!
//! The child is this test binary itself, started with
//! `WEIBO_SCHEDULE_CHILD` set, running only the `child` test.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use weibo::Job;
use weibo_connectors::kafka::{Json, KafkaRecord, KafkaSink, KafkaSource};
use weibo_tests::kafka_common::{bootstrap, unique};
use weibo_tests::schedule::{self, Count, KEYS, Mode};
use weibo_tests::{crash, kafka_broker};

const IDS: u64 = 2_000;

/// The job: reads ids from `input` to its end, sleeping a millisecond
/// every other record (with small batches, so checkpoints keep their
/// pace): a crash-free run takes about a second.
/// As `mode` asks for it: restored from a savepoint for a rollback; keyed
/// by another type (which cannot restore the job's checkpoints) for a
/// refused version.
fn job(input: &str, output: &str, dir: &Path, mode: &Mode) -> Job {
    let mut job = Job::new("kafka-schedule")
        .with_checkpoints(dir.join("checkpoints"), Duration::from_millis(150))
        .with_checkpoint_timeout(Duration::from_secs(2))
        .with_batch_size(16)
        .with_max_key_groups(16);
    if let Mode::Rollback(savepoint) = mode {
        job = job.restore_from(savepoint);
    }
    let source = KafkaSource::builder(bootstrap(), [input.to_string()], Json).until_end().build::<u64>().unwrap();
    let (name, group) = (weibo::sources::Source::default_name(&source), source.group_name().to_string());
    // A millisecond every other record (every record when paced slowly).
    let every = if schedule::slow() { 1 } else { 2 };
    let counts = job.source(source).map(move |r: KafkaRecord<u64>| {
        if r.offset % every == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        Count { key: r.value % KEYS, id: r.value, count: 1 }
    });
    schedule::running_counts(counts, mode)
        .name("counts")
        // The source went into the job already: its offsets by its name.
        .sink_exactly_once(
            KafkaSink::new(bootstrap(), output, Json)
                .with_transactions(format!("{output}-txn"), dir.join("redo"))
                .with_key(|c: &Count| Some(c.key.to_string().into_bytes()))
                .with_consumed_offsets_of(name, group),
        );
    job
}

#[test]
fn child() {
    let Ok(spec) = std::env::var("WEIBO_SCHEDULE_CHILD") else { return };
    let parts: Vec<&str> = spec.split('|').collect();
    let mode = Mode::parse(parts[3]);
    let job = job(parts[0], parts[1], Path::new(parts[2]), &mode);
    schedule::child_run(job, &mode);
}

/// A schedule's topics and directory.
struct Setup {
    input: String,
    output: String,
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Self {
        let (input, output) = (unique("sched-in"), unique("sched-out"));
        // One partition: a source task that sleeps in user code takes a
        // worker thread of its own, and leaves the other to the rest.
        kafka_broker::create_topic(&bootstrap(), &input, 1);
        kafka_broker::create_topic(&bootstrap(), &output, 3);
        let p: ThreadedProducer<DefaultProducerContext> = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("enable.idempotence", "true")
            .create()
            .unwrap();
        // Keyed by the id's key: each key's ids in one partition, in order.
        for id in 0..IDS {
            let (key, value) = ((id % KEYS).to_string(), id.to_string());
            let mut rec = BaseRecord::to(&input).key(&key).payload(&value);
            loop {
                match p.send(rec) {
                    Ok(()) => break,
                    Err((_, back)) => {
                        rec = back;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
        }
        p.flush(Duration::from_secs(30)).unwrap();
        Setup { input, output, dir: tempfile::tempdir().unwrap() }
    }

    fn checkpoints(&self) -> PathBuf {
        self.dir.path().join("checkpoints")
    }

    fn committed(&self) -> Vec<Count> {
        kafka_broker::consume_all(&bootstrap(), &self.output, "read_committed", &unique("checker"))
            .iter()
            .map(|m| serde_json::from_slice(m.payload().unwrap()).unwrap())
            .collect()
    }
}

#[test]
fn random_schedules_of_runs_kills_and_stops_commit_every_id_exactly_once() {
    if std::env::var("WEIBO_SCHEDULE_CHILD").is_ok() {
        return;
    }
    schedule::run_schedules(
        "kafka",
        IDS,
        Duration::from_millis(1000),
        6,
        Duration::from_millis(2500),
        1..3,
        Setup::new,
        |s, mode| {
            let spec = format!("{}|{}|{}|{mode}", s.input, s.output, s.dir.path().display());
            let mut cmd = crash::child_command("child", "WEIBO_SCHEDULE_CHILD", spec);
            cmd.env("WEIBO_KAFKA_BOOTSTRAP", bootstrap());
            cmd
        },
        Setup::checkpoints,
        Setup::committed,
    );
}
