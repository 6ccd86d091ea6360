//! Broadcast state: a keyed stream connected with a broadcast stream. Every
//! instance gets every broadcast record and keeps its copy of the broadcast
//! states; keyed records read it; the copies are checkpointed and restored
//! onto any number of instances; a failing broadcast function follows the
//! operator's failure policy.
//!
//! As in the join tests, the two inputs come from one harness input of
//! `Either`s split in two; a watermark after a record sends it on before
//! the next (the two inputs' records are otherwise not ordered).

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::time::Duration;

use weibo::on_error;
use weibo::process::{BroadcastContext, BroadcastMut, BroadcastReadContext, Either};
use weibo::testing::{Harness, Probe, RunningHarness};
use weibo::{Job, Stream};
use weibo_tests::two_inputs::split;

/// A reading: sensor, kind, value.
type Reading = (u32, String, u32);
/// A rule: kind, threshold (`None` removes the kind's rule).
type Rule = (String, Option<u32>);
/// What the operator emits: the sensor, its value, the threshold it was
/// judged by, and how many readings its sensor had.
type Judged = (u32, u32, Option<u32>, u64);

/// Judges each reading by its kind's threshold in the broadcast state,
/// counting the sensor's readings in keyed state; every instance emits a
/// `(0, 0, threshold, instance count)` line per rule it applied.
fn judge(readings: &Stream<Reading>, rules: &Stream<Rule>, partitions: usize) -> Stream<Judged> {
    readings.key_by(|r: &Reading| r.0).connect_broadcast(rules).with_partitions(partitions).process_with_state(
        on_error::Fail,
        |states| (states.broadcast::<String, u32>("thresholds"), states.value::<u64>("count")),
        |ctx, (thresholds, count), reading: &Reading| {
            let n = ctx.value(count).get().unwrap_or(0) + 1;
            ctx.value(count).set(n);
            let limit = ctx.broadcast(thresholds).get(&reading.1);
            ctx.emit((reading.0, reading.2, limit, n));
        },
        |ctx, (thresholds, _), rule: &Rule| {
            let len = apply(&mut ctx.broadcast(thresholds), rule);
            ctx.emit((0, 0, rule.1, len));
        },
    )
}

/// Applies `rule` to an instance's thresholds (a threshold, or none to
/// remove the kind's); returns how many rules the instance has.
fn apply(thresholds: &mut BroadcastMut<'_, String, u32>, rule: &Rule) -> u64 {
    match rule.1 {
        Some(limit) => thresholds.put(rule.0.clone(), limit),
        None => {
            thresholds.remove(&rule.0);
        }
    }
    thresholds.len() as u64
}

struct Run {
    run: RunningHarness<Either<Reading, Rule>>,
    out: Probe<Judged>,
    step: i64,
}

impl Run {
    fn start(partitions: usize, fjall: Option<&std::path::Path>) -> Self {
        let mut h = Harness::<Either<Reading, Rule>>::new("broadcast");
        if let Some(dir) = fjall {
            let backend = weibo::state::FjallBackend::open(dir).unwrap();
            h = h.configure(|job| job.with_state_backend(backend));
        }
        let (readings, rules) = split(&h.input());
        let out = h.output(&judge(&readings, &rules, partitions));
        Self { run: h.start().unwrap(), out, step: 0 }
    }

    /// Sends `record`, then a watermark, so that it is processed before
    /// the next one.
    fn send(&mut self, record: Either<Reading, Rule>) {
        self.step += 1;
        self.run.push(record, self.step).unwrap();
        self.run.watermark(self.step).unwrap();
    }
}

fn reading(sensor: u32, kind: &str, value: u32) -> Either<Reading, Rule> {
    Either::Left((sensor, kind.to_string(), value))
}

fn rule(kind: &str, limit: Option<u32>) -> Either<Reading, Rule> {
    Either::Right((kind.to_string(), limit))
}

/// Every instance applies every rule (its broadcast function runs once per
/// instance), and every sensor's readings, on whichever instance, are
/// judged by the rules sent before them; keyed state stays per key.
#[test]
fn every_instance_applies_every_rule() {
    for fjall in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Run::start(4, fjall.then(|| dir.path()));
        r.send(rule("temp", Some(30)));
        r.send(rule("wind", Some(80)));
        for sensor in 1..=40 {
            r.send(reading(sensor, if sensor % 2 == 0 { "temp" } else { "wind" }, sensor));
        }
        r.send(rule("temp", None));
        r.send(reading(2, "temp", 99));
        r.run.finish().unwrap();
        let out = r.out.take();
        let applied: Vec<&Judged> = out.iter().filter(|j| j.0 == 0).collect();
        assert_eq!(applied.len(), 3 * 4, "three rules, each applied by four instances: {applied:?}");
        assert_eq!(applied.iter().filter(|j| j.2 == Some(80)).map(|j| j.3).collect::<Vec<_>>(), [2; 4]);
        let judged: Vec<&Judged> = out.iter().filter(|j| j.0 != 0).collect();
        assert_eq!(judged.len(), 41);
        for j in &judged[..] {
            let want = match (j.0, j.3) {
                (2, 2) => None, // after the temperature rule was removed
                (s, 1) if s % 2 == 0 => Some(30),
                (_, 1) => Some(80),
                other => panic!("unexpected reading {other:?} in {j:?}"),
            };
            assert_eq!(j.2, want, "sensor {} (fjall: {fjall})", j.0);
        }
    }
}

/// A failing broadcast function follows the operator's policy: under
/// `DeadLetter` its record goes to the dead letters (once per instance,
/// each instance having failed on it), and the rule is not applied.
#[test]
fn a_failing_broadcast_function_sends_its_record_to_the_dead_letters() {
    let mut h = Harness::<Either<Reading, Rule>>::new("failing");
    let (readings, rules) = split(&h.input());
    let (judged, dead) =
        readings.key_by(|r: &Reading| r.0).connect_broadcast(&rules).with_partitions(2).process_with_state(
            on_error::DeadLetter,
            |states| states.broadcast::<String, u32>("thresholds"),
            |ctx, thresholds, reading: &Reading| {
                let limit = ctx.broadcast(thresholds).get(&reading.1);
                ctx.emit((reading.0, limit));
                Ok(())
            },
            |ctx: &mut BroadcastContext<'_, u32, (u32, Option<u32>)>, thresholds, rule: &Rule| -> Result<(), String> {
                let limit = rule.1.ok_or_else(|| format!("rule `{}` has no threshold", rule.0))?;
                ctx.broadcast(thresholds).put(rule.0.clone(), limit);
                Ok(())
            },
        );
    let (judged, dead) = (h.output(&judged), h.output(&dead.map(|d| d.record)));
    let mut run = h.start().unwrap();
    run.push(rule("temp", None), 1).unwrap();
    run.watermark(1).unwrap();
    run.push(reading(1, "temp", 5), 2).unwrap();
    run.finish().unwrap();
    assert_eq!(dead.take(), [rule("temp", None), rule("temp", None)]);
    assert_eq!(judged.take(), [(1, None)]);
}

/// The broadcast state is checkpointed with the operator: restored from a
/// savepoint taken on two instances onto three, every instance has the
/// rules, so that every sensor is judged by them without a rule sent
/// again.
#[test]
fn broadcast_state_survives_a_savepoint_onto_more_instances() {
    restored_onto_three_instances(judge);
}

/// Runs `judge` (as operator `judge`) on two instances over the rules and
/// endless readings, takes a savepoint once both rules were applied by
/// both instances, restores it onto three with no rule sent again, and
/// checks that each of 60 new sensors is judged by its kind's rule, once.
fn restored_onto_three_instances(judge: fn(&Stream<Reading>, &Stream<Rule>, usize) -> Stream<Judged>) {
    use weibo::sinks::CollectSink;
    use weibo::sources::{Generator, IterSource};
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("rules").with_checkpoints(dir.path(), Duration::from_secs(3600)).with_max_key_groups(16);
    let rules = job
        .source(IterSource::new(vec![("temp".to_string(), Some(30u32)), ("wind".to_string(), Some(80))]))
        .uid("rules");
    let readings = job
        .source(Generator::new(u64::MAX, |i| ((i % 50) as u32 + 1, "none".to_string(), 0u32)).with_rate(500.0))
        .uid("readings");
    let before = CollectSink::new();
    judge(&readings, &rules, 2).uid("judge").sink(before.clone());
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(600));
    let applied = before.values().iter().filter(|j| j.0 == 0).count();
    assert_eq!(applied, 4, "both rules applied by both instances before the savepoint");

    let job = Job::new("rules")
        .with_checkpoints(dir.path().join("v2"), Duration::from_secs(3600))
        .with_max_key_groups(16)
        .restore_from(&savepoint)
        .allow_unrestored_state();
    let rules = job.source(IterSource::new(Vec::<Rule>::new())).uid("rules-after");
    let sensors: Vec<Reading> =
        (100..160).map(|s| (s, if s % 2 == 0 { "temp".to_string() } else { "wind".to_string() }, 1)).collect();
    let readings = job.source(IterSource::new(sensors)).uid("readings-after");
    let after = CollectSink::new();
    judge(&readings, &rules, 3).name("judge").uid("judge").sink(after.clone());
    let report = job.run_blocking().unwrap();
    let judged = after.values();
    assert_eq!(judged.len(), 60);
    for j in judged {
        let want = if j.0 % 2 == 0 { Some(30) } else { Some(80) };
        assert_eq!(j.2, want, "sensor {} was judged by its kind's rule after the restore", j.0);
    }
    let judge = report.metrics.operator("judge").unwrap();
    assert_eq!(judge.records_in, 60, "the 60 readings, no rule: {judge:?}");
}

/// Judges each reading by its kind's threshold, with no key: every
/// instance emits `(0, 0, threshold, rules it has)` per rule it applied,
/// and `(sensor, value, threshold, 0)` per reading.
fn judge_unkeyed(readings: &Stream<Reading>, rules: &Stream<Rule>, partitions: usize) -> Stream<Judged> {
    readings.connect_broadcast(rules).with_partitions(partitions).process_with_state(
        on_error::Fail,
        |states| states.broadcast::<String, u32>("thresholds"),
        |ctx: &mut BroadcastReadContext<'_, Judged>, thresholds, reading: &Reading| {
            let limit = ctx.broadcast(thresholds).get(&reading.1);
            ctx.emit((reading.0, reading.2, limit, 0));
        },
        |ctx, thresholds, rule: &Rule| {
            let len = apply(&mut ctx.broadcast(thresholds), rule);
            ctx.emit((0, 0, rule.1, len));
        },
    )
}

/// A main input without a key is spread over every instance; every
/// instance applies every rule, so that each reading, wherever it goes,
/// is judged by the rules sent before it; a reading is judged once.
#[test]
fn a_main_input_without_a_key_reads_every_instances_rules() {
    let mut h = Harness::<Either<Reading, Rule>>::new("unkeyed");
    let (readings, rules) = split(&h.input());
    let out = h.output(&judge_unkeyed(&readings, &rules, 4));
    let mut r = Run { run: h.start().unwrap(), out, step: 0 };
    r.send(rule("temp", Some(30)));
    r.send(rule("wind", Some(80)));
    for sensor in 1..=40 {
        r.send(reading(sensor, if sensor % 2 == 0 { "temp" } else { "wind" }, sensor));
    }
    r.send(rule("temp", None));
    for sensor in 41..=48 {
        r.send(reading(sensor, "temp", sensor));
    }
    r.run.finish().unwrap();
    let out = r.out.take();
    let applied: Vec<&Judged> = out.iter().filter(|j| j.0 == 0).collect();
    assert_eq!(applied.len(), 3 * 4, "three rules, each applied by four instances: {applied:?}");
    let mut judged: Vec<(u32, Option<u32>)> = out.iter().filter(|j| j.0 != 0).map(|j| (j.0, j.2)).collect();
    judged.sort_unstable();
    let want: Vec<(u32, Option<u32>)> = (1..=48)
        .map(|s| match s {
            41.. => (s, None),
            s if s % 2 == 0 => (s, Some(30)),
            s => (s, Some(80)),
        })
        .collect();
    assert_eq!(judged, want);
}

/// Without a key too, the broadcast states are checkpointed: restored from
/// two instances onto three, each judges readings by the rules sent before
/// the savepoint.
#[test]
fn unkeyed_broadcast_state_survives_a_savepoint_onto_more_instances() {
    restored_onto_three_instances(judge_unkeyed);
}
