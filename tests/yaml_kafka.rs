//! A YAML pipeline, exactly once from Kafka to Kafka, killed again and
//! again: the counting job of `kafka_exactly_once.rs` declared in YAML (a
//! running count per key, each event written with its key's count by the
//! exactly-once Kafka sink), its process killed at random moments after
//! it completed a checkpoint and started again. The committed output (read
//! with `read_committed`) holds every event once, with the count a
//! crash-free run gives it.
//!
//! The process is this test binary itself, started with `WEIBO_YAML_CHILD`
//! set to the pipeline file, running only the `child` test.

use weibo_connectors::yaml::Pipeline;
use weibo_tests::crash;
use weibo_tests::kafka_common::*;

/// The entry point of this binary's child processes: runs the pipeline
/// file named by `WEIBO_YAML_CHILD`.
#[test]
fn child() {
    let Ok(file) = std::env::var("WEIBO_YAML_CHILD") else { return };
    init_logs();
    let job = Pipeline::from_file(&file).unwrap_or_else(|e| panic!("{e}")).job().unwrap();
    weibo::testing::block_on(job.run()).unwrap();
}

#[test]
fn a_yaml_pipeline_killed_again_and_again_commits_every_event_exactly_once() {
    if std::env::var("WEIBO_YAML_CHILD").is_ok() {
        return;
    }
    let (input, output, dir) = events_setup("yaml-eos");
    let file = dir.path().join("counts.yaml");
    std::fs::write(
        &file,
        format!(
            r#"
job: yaml-eos
checkpoints: {{ storage: checkpoints, interval: 200ms }}
batch_size: 16
sources:
  events:
    kafka: {{ brokers: "${{WEIBO_KAFKA_BOOTSTRAP}}", topic: {input}, bounded: true }}
    schema: [key, id]
pipeline:
  - from: events
  - key_by: "event.key"
    partitions: 2
  - aggregate: {{ id: "last(event.id)", count: "count()" }}
    name: counts
  - to: {{ kafka_exactly_once: {{ brokers: "${{WEIBO_KAFKA_BOOTSTRAP}}", topic: {output}, key: "string(event.key)" }} }}
"#
        ),
    )
    .unwrap();
    let kills = kill_after_checkpoints(&dir.path().join("checkpoints"), 11, 0..400, 6, || {
        crash::child_command("child", "WEIBO_YAML_CHILD", &file)
            .env("WEIBO_KAFKA_BOOTSTRAP", bootstrap())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    });
    let committed = assert_exactly_once(&output);
    let all = consume_all(&output, "read_uncommitted").len();
    eprintln!("{kills} kills; read_uncommitted sees {all} records, read_committed {committed}");
    assert!(kills >= 2, "the child was killed mid-run several times ({kills})");
}
