//! Exactly-once Kafka → Kafka against a real broker: without crashes,
//! after a crash between checkpoint and commit, killed again and again,
//! with transactions the broker aborts, across a broker restart, and
//! restored from an older checkpoint; checked with a `read_committed`
//! consumer.
//!
//! The crash tests' child is this test binary itself, started with
//! `WEIBO_KAFKA_CHILD` set, running only the `child` test.

use weibo_tests::crash;
use weibo_tests::kafka_broker;
use weibo_tests::kafka_common::*;

/// The entry point of this binary's child processes (see `kafka_common::run_child`).
#[test]
fn child() {
    run_child();
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

#[test]
fn a_crash_between_checkpoint_and_commit_is_recommitted_from_the_redo_log() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (output, dir, spec) = counting_setup("recommit");
    let run = |crash: Option<&str>| {
        let mut cmd = kafka_child(&spec);
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

#[test]
fn killed_again_and_again_kafka_to_kafka_commits_every_event_exactly_once() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (output, dir, spec) = counting_setup("crash");
    // Up to 6 lives are killed; the last runs to the end.
    let kills = kill_after_checkpoints(&dir.path().join("checkpoints"), 5, 0..800, 6, || {
        kafka_child(&spec).stderr(Stdio::inherit()).spawn().unwrap()
    });
    assert!(kills >= 3, "the child was killed mid-run several times ({kills})");
    let committed = assert_exactly_once(&output);
    // Aborted transactions were written and are hidden from read_committed.
    let all = consume_all(&output, "read_uncommitted").len();
    eprintln!("{kills} kills; read_uncommitted sees {all} records, read_committed {committed}");
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
    let sink = KafkaSink::new(bootstrap(), &output, Json)
        .with_transactions(format!("{output}-txn"), dir.path().join("redo"))
        .with_transaction_timeout(Duration::from_millis(1500));
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

/// Two processes started on one job, 0 to 500 ms apart (a restart that
/// overlaps the old process): exactly one runs, the other is refused at
/// its start naming the holder, and every event is committed once.
#[test]
fn two_processes_on_one_job_one_runs_and_every_event_is_committed_once() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    for apart in [0, 200, 500] {
        let (output, _dir, spec) = counting_setup("two");
        let ended = crash::run_two_apart(kafka_child(&spec), kafka_child(&spec), Duration::from_millis(apart));
        crash::assert_exactly_one_ran(&ended);
        assert_exactly_once(&output);
    }
}

/// A checkpoint completes, the process dies before its commit, and a
/// version of the job that cannot restore it (another key type) is
/// started and refused: the checkpoints and the redo logs are byte for
/// byte as they were, and the job's own restart commits every event once.
#[test]
fn a_refused_upgrade_leaves_the_checkpoints_and_the_redo_logs_as_they_were() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (output, dir, spec) = counting_setup("refused");
    let mut cmd = kafka_child(&spec);
    cmd.stderr(Stdio::null()).env("WEIBO_CRASH_AT", "after-manifest#2");
    assert!(!cmd.status().unwrap().success(), "the first life dies between checkpoint 2's manifest and its commits");
    let before = crash::snapshot_dir(dir.path());
    assert!(before.keys().any(|n| n.starts_with("redo/") && n.ends_with(".redo")), "epoch 2 waits in its redo logs");
    let input = spec.split('|').next().unwrap().to_string();
    let job = paced_job("kafka-eos", dir.path().join("checkpoints"));
    let source = KafkaSource::builder(bootstrap(), [input], Json).until_end().build::<Event>().unwrap();
    let sink = KafkaSink::new(bootstrap(), &output, Json)
        .with_transactions(format!("{output}-txn"), dir.path().join("redo"))
        .with_consumed_offsets(&source);
    job.source(source)
        .map(|r: KafkaRecord<Event>| Count { key: r.value.key, id: r.value.id, count: 1 })
        .key_by(|c: &Count| c.key.to_string())
        .with_partitions(2)
        .reduce(|acc, c| Count { key: c.key, id: c.id, count: acc.count + 1 })
        .sink_exactly_once(sink);
    let err = weibo::testing::block_on(job.run()).expect_err("another key type is refused").to_string();
    assert!(err.contains("was keyed by `u64`"), "{err}");
    assert_eq!(crash::first_difference(&before, &crash::snapshot_dir(dir.path())), None);
    let mut again = kafka_child(&spec);
    again.stderr(Stdio::null());
    assert!(again.status().unwrap().success(), "the job's own restart finishes");
    assert_exactly_once(&output);
}
