//! Kafka → Postgres exactly once with the source positions in Postgres
//! (`store_source_positions`) and no durable checkpoint storage
//! (checkpoints in memory): each start resumes the Kafka source from the
//! positions the sink committed with its rows. A child process is killed
//! with SIGKILL at random moments and restarted until it finishes, and dies
//! at chosen points (its first start, after a pre-commit, after a manifest
//! that no restart will see, right after Postgres committed, at the end of
//! the input). After every life, the table holds exactly the records
//! before the stored positions, each once; after the last, every record.
//!
//! Also: each sink id has positions of its own, a finished job started
//! again writes nothing, and a job that stores positions without
//! checkpoints, or at least once, is refused.
//!
//! The child is this test binary itself, started with `WEIBO_PGPOS_CHILD`
//! set, running only the `child` test.

use std::collections::BTreeMap;

use weibo::checkpoint::MemoryStorage;
use weibo_connectors::postgres::PostgresSink;
use weibo_tests::crash;
use weibo_tests::kafka_common::{
    Duration, Event, In, Instant, Job, Json, KafkaRecord, KafkaSource, bootstrap, create_topic, produce,
};
use weibo_tests::kafka_orders;
use weibo_tests::postgres_server::{self, execute, rows, server};

const EVENTS: u64 = 6_000;
const PARTITIONS: i32 = 3;

fn setup(what: &str) -> (String, String) {
    let name = postgres_server::unique(what);
    create_topic(&name, PARTITIONS);
    let values: Vec<(Vec<u8>, Vec<u8>)> = (0..EVENTS)
        .map(|id| {
            let e = Event { key: id % 17, id };
            (e.key.to_string().into_bytes(), serde_json::to_vec(&e).unwrap())
        })
        .collect();
    let records: Vec<In<'_>> =
        values.iter().map(|(k, v)| In { key: Some(k), value: v, headers: vec![], timestamp: None }).collect();
    produce(&name, &records);
    let table = format!("{name}_events");
    execute(&format!(
        "CREATE TABLE {table} (id int8 NOT NULL, partition int4 NOT NULL, \"offset\" int8 NOT NULL, key int8 NOT NULL)"
    ));
    (name, table)
}

fn sink(table: &str, id: &str) -> PostgresSink<KafkaRecord<Event>> {
    PostgresSink::builder(&server().url, table)
        .with_column("id", |r: &KafkaRecord<Event>| r.value.id as i64)
        .with_column("partition", |r: &KafkaRecord<Event>| r.partition)
        .with_column("offset", |r: &KafkaRecord<Event>| r.offset)
        .with_column("key", |r: &KafkaRecord<Event>| r.value.key as i64)
        .with_id(id)
        .with_chunk_rows(150)
        .store_source_positions()
        .build()
        .unwrap()
}

/// The job: resume from the positions in Postgres, write every record;
/// checkpoints in memory, or in `durable` if given.
fn pipeline(topic: &str, table: &str, id: &str, paced: bool, durable: Option<&std::path::Path>) -> Job {
    let sink = sink(table, id);
    let stored = sink.stored_positions().unwrap();
    let job = match durable {
        Some(dir) => Job::new("pg-positions").with_checkpoints(dir, Duration::from_millis(100)),
        None => Job::new("pg-positions").with_checkpoint_storage(MemoryStorage::new(), Duration::from_millis(100)),
    }
    .with_batch_size(32);
    let source = KafkaSource::builder(bootstrap(), [topic.to_string()], Json)
        .until_end()
        .resume_from(&stored)
        .build::<Event>()
        .unwrap();
    job.source(source)
        .name("events")
        .map(move |r: KafkaRecord<Event>| {
            if paced && r.offset % 4 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            r
        })
        .sink_exactly_once(sink);
    job
}

#[test]
fn child() {
    let Ok(spec) = std::env::var("WEIBO_PGPOS_CHILD") else { return };
    let parts: Vec<&str> = spec.split('|').collect();
    let (topic, table) = (parts[0], parts[1]);
    let durable = parts.get(2).filter(|d| !d.is_empty()).map(std::path::Path::new);
    let job = pipeline(topic, table, table, true, durable);
    weibo::testing::block_on(job.run()).unwrap();
}

/// The table's rows as (partition, offset) → how many times.
fn table_rows(table: &str) -> BTreeMap<(i32, i64), u32> {
    let mut out = BTreeMap::new();
    for r in rows(&format!("SELECT partition, \"offset\" FROM {table}")) {
        let key = (r[0].as_ref().unwrap().parse().unwrap(), r[1].as_ref().unwrap().parse().unwrap());
        *out.entry(key).or_insert(0) += 1;
    }
    out
}

/// The stored positions of sink `id`: Kafka partition → next offset.
fn stored(id: &str) -> BTreeMap<i32, i64> {
    rows(&format!("SELECT partition_name, position FROM weibo_sink_positions WHERE sink = '{id}'"))
        .into_iter()
        .map(|r| {
            let name = r[0].clone().unwrap();
            let kp = name.rsplit_once('/').unwrap().1.parse().unwrap();
            (kp, r[1].as_ref().unwrap().parse().unwrap())
        })
        .collect()
}

/// The table holds exactly the records before the stored positions, each
/// once; returns how many.
fn assert_rows_match_positions(table: &str, id: &str, what: &str) -> usize {
    let got = table_rows(table);
    let positions = stored(id);
    let twice: Vec<_> = got.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(twice.is_empty(), "{what}: rows written twice, e.g. {twice:?}");
    for &(kp, offset) in got.keys() {
        let pos = positions.get(&kp).copied().unwrap_or(0);
        assert!(offset < pos, "{what}: row {kp}/{offset} is not before the stored position {pos} ({positions:?})");
    }
    for (&kp, &pos) in &positions {
        let held = got.keys().filter(|(p, _)| *p == kp).count() as i64;
        assert_eq!(held, pos, "{what}: partition {kp} holds {held} rows, its stored position is {pos}");
    }
    got.len()
}

/// Starts the child (dying at `crash_at` if given), kills it after
/// `after` unless it ends first; returns whether it finished.
fn live(topic: &str, table: &str, after: Duration, crash_at: Option<&str>) -> bool {
    live_in(topic, table, None, after, crash_at)
}

/// As [`live`], with the checkpoints in `durable` if given.
fn live_in(
    topic: &str,
    table: &str,
    durable: Option<&std::path::Path>,
    after: Duration,
    crash_at: Option<&str>,
) -> bool {
    let dir = durable.map(|d| d.display().to_string()).unwrap_or_default();
    let mut cmd = crash::child_command("child", "WEIBO_PGPOS_CHILD", format!("{topic}|{table}|{dir}"));
    cmd.env("WEIBO_PG_URL", &server().url).env("WEIBO_KAFKA_BOOTSTRAP", bootstrap());
    crash::run_child(cmd, after, crash_at)
}

fn assert_complete(table: &str, what: &str) {
    let n = assert_rows_match_positions(table, table, what);
    assert_eq!(n as u64, EVENTS, "{what}: every record once");
    let ids: std::collections::BTreeSet<i64> =
        rows(&format!("SELECT id FROM {table}")).into_iter().map(|r| r[0].as_ref().unwrap().parse().unwrap()).collect();
    assert_eq!(ids.len() as u64, EVENTS, "{what}: every id once");
    assert_eq!(
        rows(&format!("SELECT count(*) FROM weibo_sink_spool WHERE sink = '{table}'"))[0][0].as_deref(),
        Some("0"),
        "{what}: nothing left spooled"
    );
}

#[test]
fn killed_again_and_again_it_resumes_from_the_positions_in_postgres() {
    if std::env::var("WEIBO_PGPOS_CHILD").is_ok() {
        return;
    }
    let (topic, table) = setup("killed");
    let mut times = crash::kill_times(7, 300..1200);
    let mut lives = 0;
    loop {
        lives += 1;
        assert!(lives < 60, "the job did not finish in 60 lives");
        // (A moment is drawn for every life, used or not.)
        let kill_at = times.next().unwrap();
        let after = if lives % 4 == 0 { Duration::from_secs(120) } else { kill_at };
        let finished = live(&topic, &table, after, None);
        let n = assert_rows_match_positions(&table, &table, &format!("after life {lives}"));
        if finished {
            break;
        }
        eprintln!("life {lives}: {n} rows");
    }
    assert!(lives > 2, "the job was killed at least twice ({lives} lives)");
    assert_complete(&table, &format!("after {lives} lives"));
}

#[test]
fn dying_at_each_point_of_a_commit_and_at_the_end_of_input_loses_and_duplicates_nothing() {
    if std::env::var("WEIBO_PGPOS_CHILD").is_ok() {
        return;
    }
    let points = [
        ("first start", None, Some(Duration::from_millis(60))),
        ("pre-commit-after#3", Some("pre-commit-after#3"), None),
        ("after-manifest#2", Some("after-manifest#2"), None),
        ("postgres-after-commit#1", Some("postgres-after-commit#1"), None),
        ("postgres-after-commit#4", Some("postgres-after-commit#4"), None),
        ("final-barrier", Some("final-barrier"), None),
        ("after-final-manifest", Some("after-final-manifest"), None),
    ];
    for (what, point, kill_after) in points {
        let (topic, table) = setup("point");
        let first = live(&topic, &table, kill_after.unwrap_or(Duration::from_secs(120)), point);
        assert!(!first, "{what}: the first life reached its end without dying there");
        assert_rows_match_positions(&table, &table, &format!("{what}, after the first life"));
        let mut lives = 1;
        while !live(&topic, &table, Duration::from_secs(120), None) {
            lives += 1;
            assert!(lives < 5, "{what}: the job did not finish");
        }
        assert_complete(&table, what);
    }
}

#[test]
fn each_sink_id_has_its_own_positions_and_a_finished_job_started_again_writes_nothing() {
    if std::env::var("WEIBO_PGPOS_CHILD").is_ok() {
        return;
    }
    let (topic, table) = setup("split");
    weibo::testing::block_on(pipeline(&topic, &table, &format!("{table}_a"), false, None).run()).unwrap();
    let a = stored(&format!("{table}_a"));
    assert_eq!(a.len(), PARTITIONS as usize, "{a:?}");
    assert_eq!(a.values().map(|p| *p as u64).sum::<u64>(), EVENTS);
    // Started again, the first job finds everything read: nothing more.
    weibo::testing::block_on(pipeline(&topic, &table, &format!("{table}_a"), false, None).run()).unwrap();
    assert_eq!(table_rows(&table).len() as u64, EVENTS);
    assert!(table_rows(&table).values().all(|n| *n == 1));
    // Another sink id starts from the beginning.
    weibo::testing::block_on(pipeline(&topic, &table, &format!("{table}_b"), false, None).run()).unwrap();
    assert!(table_rows(&table).values().all(|n| *n == 2), "the second id's job wrote everything once more");
}

#[test]
fn storing_positions_needs_checkpoints_and_exactly_once() {
    if std::env::var("WEIBO_PGPOS_CHILD").is_ok() {
        return;
    }
    let (topic, table) = setup("refused");
    let source = || KafkaSource::builder(bootstrap(), [topic.clone()], Json).until_end().build::<Event>().unwrap();
    let job = Job::new("no-checkpoints");
    job.source(source()).sink_exactly_once(sink(&table, &table));
    let err = weibo::testing::block_on(job.run()).unwrap_err().report().to_string();
    assert!(err.contains("checkpoints") && err.contains("positions"), "{err}");
    let job = Job::new("at-least-once").with_checkpoint_storage(MemoryStorage::new(), Duration::from_millis(100));
    job.source(source()).sink(sink(&table, &table));
    let err = weibo::testing::block_on(job.run()).unwrap_err().report().to_string();
    assert!(err.contains("sink_exactly_once"), "{err}");
    // Two sinks storing positions: two transactions, refused.
    let job = Job::new("two").with_checkpoint_storage(MemoryStorage::new(), Duration::from_millis(100));
    let input = job.source(source());
    input.clone().sink_exactly_once(sink(&table, &format!("{table}_1")));
    input.sink_exactly_once(sink(&table, &format!("{table}_2")));
    let err = weibo::testing::block_on(job.run()).unwrap_err().report().to_string();
    assert!(err.contains("one sink per job"), "{err}");
    assert!(table_rows(&table).is_empty());
    assert!(stored(&table).is_empty());
    // Positions of two sources for one partition: which to resume from?
    let entry = |source: &str| weibo::checkpoint::SourcePositionEntry {
        source: source.into(),
        partition: 0,
        position: 5,
        partition_name: Some(format!("{topic}/0")),
    };
    let err = KafkaSource::builder(bootstrap(), [topic.clone()], Json)
        .resume_from(&[entry("a"), entry("b")])
        .build::<Event>();
    let err = err.unwrap_err().report().to_string();
    assert!(err.contains("twice") && err.contains("`a`") && err.contains("`b`"), "{err}");
}

#[test]
fn a_job_whose_positions_moved_since_it_read_them_is_fenced() {
    if std::env::var("WEIBO_PGPOS_CHILD").is_ok() {
        return;
    }
    let (topic, table) = setup("fenced");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // The first process: paced, committing as it goes.
    let first = pipeline(&topic, &table, &table, true, None);
    let first = runtime.block_on(async { first.spawn() }).unwrap();
    let started = Instant::now();
    while table_rows(&table).is_empty() {
        assert!(started.elapsed() < Duration::from_secs(60), "the first job committed nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A second process reads the positions while the first still runs...
    let second = pipeline(&topic, &table, &table, false, None);
    let read = stored(&table);
    // ... and the first commits again before the second gets going.
    while stored(&table) == read {
        assert!(started.elapsed() < Duration::from_secs(60), "the first job stopped committing");
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = runtime.block_on(async { second.spawn() }).unwrap();
    let (first, second) = runtime.block_on(async { (first.wait().await, second.wait().await) });
    // The second's writers waited for the first's; its first commit found
    // the positions moved and failed it. (The first may fail too: the
    // second dropped what it had spooled.)
    let err = second.unwrap_err().report().to_string();
    assert!(err.contains("changed since this run read them"), "{err}");
    let _ = first;
    assert_rows_match_positions(&table, &table, "after the fenced start");
    // A third start resumes from where the first ended.
    weibo::testing::block_on(pipeline(&topic, &table, &table, false, None).run()).unwrap();
    assert_complete(&table, "after the third start");
}

#[test]
fn with_durable_checkpoints_a_restore_commits_the_restored_positions() {
    if std::env::var("WEIBO_PGPOS_CHILD").is_ok() {
        return;
    }
    for point in ["after-manifest#3", "postgres-after-commit#2", "pre-commit-after#4"] {
        let (topic, table) = setup("durable");
        let dir = tempfile::tempdir().unwrap();
        assert!(!live_in(&topic, &table, Some(dir.path()), Duration::from_secs(120), Some(point)), "{point}");
        assert_rows_match_positions(&table, &table, &format!("{point}, after the first life"));
        let mut lives = 1;
        while !live_in(&topic, &table, Some(dir.path()), Duration::from_secs(120), None) {
            lives += 1;
            assert!(lives < 5, "{point}: the job did not finish");
        }
        assert_complete(&table, point);
    }
}

fn produce_orders(topic: &str, ids: std::ops::Range<i64>) {
    let values: Vec<Vec<u8>> =
        ids.map(|id| kafka_orders::order_json(id, format!("c{}", id % 7), if id % 10 == 0 { 0 } else { id })).collect();
    let records: Vec<In<'_>> =
        values.iter().map(|v| In { key: None, value: v, headers: vec![], timestamp: None }).collect();
    produce(topic, &records);
}

fn paid_ids() -> Vec<i64> {
    rows("SELECT id FROM paid_orders ORDER BY id")
        .into_iter()
        .map(|r| r[0].as_ref().unwrap().parse().unwrap())
        .collect()
}

/// Runs the book's job until `paid_orders` holds `want` rows, then stops it.
fn run_book_job_until(topic: &str, want: usize) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let job = kafka_orders::job(&bootstrap(), topic, &server().url).unwrap();
    let running = runtime.block_on(async { job.spawn() }).unwrap();
    let started = Instant::now();
    while paid_ids().len() < want {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the book's job wrote {} of {want} rows",
            paid_ids().len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    runtime.block_on(running.stop()).unwrap();
}

#[test]
fn the_books_job_stopped_and_started_again_resumes_from_postgres() {
    if std::env::var("WEIBO_PGPOS_CHILD").is_ok() {
        return;
    }
    let topic = postgres_server::unique("book_orders");
    create_topic(&topic, 2);
    execute(kafka_orders::TABLE);
    // The book's table and sink id are fixed: start from nothing.
    execute("DELETE FROM paid_orders");
    execute(
        "DO $$ BEGIN IF to_regclass('weibo_sink_positions') IS NOT NULL THEN \
         DELETE FROM weibo_sink_positions WHERE sink = 'paid-orders'; END IF; END $$",
    );
    produce_orders(&topic, 0..2_000);
    run_book_job_until(&topic, 1_800);
    let first: Vec<i64> = (0..2_000).filter(|i| i % 10 != 0).collect();
    assert_eq!(paid_ids(), first, "every paid order once");
    let ends: i64 = stored("paid-orders").values().sum();
    assert_eq!(ends, 2_000, "the positions are the topic's ends: {:?}", stored("paid-orders"));
    // More orders, and a new start: only the new ones are read.
    produce_orders(&topic, 2_000..3_000);
    run_book_job_until(&topic, 2_700);
    assert_eq!(paid_ids(), (0..3_000).filter(|i| i % 10 != 0).collect::<Vec<i64>>(), "every paid order once");
    assert_eq!(stored("paid-orders").values().sum::<i64>(), 3_000);
}
