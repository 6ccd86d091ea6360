//! Named streams, keyed `reduce` and `process` in YAML pipelines: a join
//! of two streams that went through steps of their own, and a running
//! reduce, each against its typed twin at 1 and 4 partitions; a reduce
//! whose expression fails keeps the key's result; a reduce's savepoint
//! restores into changed expressions and is refused for changed fields; a
//! `process` step runs a registered Rust function under its failure
//! policy, and one whose function is not registered does not start;
//! consecutive stateless steps run as one operator that names the failing
//! step; and the mistakes of `streams:`, `reduce` and `process` are each
//! reported at their line and column.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use weibo::prelude::*;
use weibo::time::WatermarkStrategy;
use weibo_connectors::yaml::{Pipeline, TestFile, Value};

#[derive(Clone, Debug, Deserialize, Serialize)]
struct Order {
    id: i64,
    customer: String,
    amount: i64,
    ts: i64,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
struct Payment {
    order_id: i64,
    paid: i64,
    ts: i64,
}

fn write_lines<T: Serialize>(path: &Path, items: &[T]) {
    std::fs::write(path, items.iter().map(|x| serde_json::to_string(x).unwrap() + "\n").collect::<String>()).unwrap();
}

/// 400 orders of 9 customers, 100 ms apart; payments for two orders of
/// three, from 1.5 s before to 4.5 s after their order, in time order.
fn orders_and_payments(dir: &Path) -> (Vec<Order>, std::path::PathBuf, std::path::PathBuf) {
    let orders: Vec<Order> =
        (0..400).map(|id| Order { id, customer: format!("c{}", id % 9), amount: id * 10 % 97, ts: id * 100 }).collect();
    let mut payments: Vec<Payment> = (0..400)
        .filter(|id| id % 3 != 0)
        .map(|id| Payment { order_id: id, paid: id * 7 % 53, ts: (id * 100 + (id % 7) * 1000 - 1500).max(0) })
        .collect();
    payments.sort_by_key(|p| p.ts);
    let (o, p) = (dir.join("orders.jsonl"), dir.join("payments.jsonl"));
    write_lines(&o, &orders);
    write_lines(&p, &payments);
    (orders, o, p)
}

fn run(job: Job) -> weibo::JobReport {
    tokio::runtime::Runtime::new().unwrap().block_on(job.run()).unwrap()
}

fn read_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn a_join_of_two_named_streams_matches_the_typed_twin_at_1_and_4_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let (_, orders, payments) = orders_and_payments(dir.path());
    for partitions in [1, 4] {
        let out = dir.path().join(format!("joined-{partitions}"));
        // Each side is filtered and reshaped in a stream of its own before
        // the join; the pipeline reads one stream and joins the other.
        let file = format!(
            r#"
job: big-paid
sources:
  orders:
    file: {{ path: {} }}
    schema: [id, customer, amount, ts]
    event_time: {{ field: ts, max_out_of_orderness: 1s }}
  payments:
    file: {{ path: {} }}
    schema: [order_id, paid, ts]
    event_time: {{ field: ts, max_out_of_orderness: 1s }}
streams:
  big:
    - from: orders
    - filter: "event.amount > 20"
    - map: {{ id: "event.id", cents: "event.amount * 100", ts: "event.ts" }}
  settled:
    - from: payments
    - filter: "event.paid % 2 == 1"
pipeline:
  - from: big
  - join: {{ with: settled, key: "event.id", with_key: "event.order_id", interval: {{ from: -1s, to: 5s }}, partitions: {partitions} }}
    select: {{ id: "left.id", cents: "left.cents", paid: "right.paid" }}
  - to: {{ file: {{ path: {} }} }}
"#,
            orders.display(),
            payments.display(),
            out.display()
        );
        let pipeline = Pipeline::parse("big-paid.yaml", file.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(pipeline.spec().source_names(), vec!["orders".to_string(), "payments".to_string()]);
        let report = run(pipeline.job().unwrap());
        // The streams' steps are operators of their own, named after them
        // (consecutive stateless steps run as one operator).
        let big = report.metrics.operator("big/filter+big/map").unwrap();
        assert_eq!(big.records_in, 400);
        assert!(report.metrics.operator("settled/filter").is_some());
        let mut from_yaml: Vec<(i64, i64, i64)> = read_lines(&out)
            .iter()
            .map(|v| (v["id"].as_i64().unwrap(), v["cents"].as_i64().unwrap(), v["paid"].as_i64().unwrap()))
            .collect();

        let job = Job::new("big-paid");
        let bounded = || WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(1));
        let left = job
            .source(FileSource::json_lines(&orders))
            .with_timestamps(|o: &Order| o.ts, bounded())
            .filter(|o: &Order| o.amount > 20)
            .map(|o: Order| (o.id, o.amount * 100))
            .key_by(|o: &(i64, i64)| o.0);
        let right = job
            .source(FileSource::json_lines(&payments))
            .with_timestamps(|p: &Payment| p.ts, bounded())
            .filter(|p: &Payment| p.paid % 2 == 1)
            .key_by(|p: &Payment| p.order_id);
        let joined = CollectSink::new();
        left.interval_join(&right)
            .between(-1_000, 5_000)
            .with_partitions(partitions)
            .join(|o: &(i64, i64), p: &Payment| (o.0, o.1, p.paid))
            .sink(joined.clone());
        run(job);
        let mut typed = joined.values();
        from_yaml.sort();
        typed.sort();
        assert!(typed.len() > 50, "{} pairs", typed.len());
        assert_eq!(from_yaml, typed, "at {partitions} partitions");
    }
}

/// Each customer's results in the order they came.
fn per_key<T: Clone>(items: impl IntoIterator<Item = (String, T)>) -> BTreeMap<String, Vec<T>> {
    let mut out: BTreeMap<String, Vec<T>> = BTreeMap::new();
    for (k, v) in items {
        out.entry(k).or_default().push(v);
    }
    out
}

#[test]
fn a_reduce_matches_the_typed_twin_at_1_and_4_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let (_, orders, _) = orders_and_payments(dir.path());
    for partitions in [1, 4] {
        let out = dir.path().join(format!("reduced-{partitions}"));
        let file = format!(
            r#"
job: per-customer
sources:
  orders: {{ file: {{ path: {} }}, schema: [id, customer, amount, ts] }}
pipeline:
  - from: orders
  - key_by: "event.customer"
    partitions: {partitions}
  - reduce:
      amount: "acc.amount + event.amount"
      id: "acc.id > event.id ? acc.id : event.id"
  - to: {{ file: {{ path: {} }} }}
"#,
            orders.display(),
            out.display()
        );
        let pipeline = Pipeline::parse("per-customer.yaml", file.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        run(pipeline.job().unwrap());
        let from_yaml = per_key(read_lines(&out).iter().map(|v| {
            (
                v["customer"].as_str().unwrap().to_string(),
                (v["id"].as_i64().unwrap(), v["amount"].as_i64().unwrap(), v["ts"].as_i64().unwrap()),
            )
        }));

        let job = Job::new("per-customer");
        let results = CollectSink::new();
        job.source(FileSource::json_lines(&orders))
            .key_by(|o: &Order| o.customer.clone())
            .with_partitions(partitions)
            .reduce(|acc: Order, o: Order| Order {
                id: acc.id.max(o.id),
                customer: o.customer,
                amount: acc.amount + o.amount,
                ts: o.ts,
            })
            .sink(results.clone());
        run(job);
        let typed = per_key(results.values().into_iter().map(|o: Order| (o.customer, (o.id, o.amount, o.ts))));
        assert_eq!(from_yaml.len(), 9);
        assert_eq!(from_yaml.values().map(Vec::len).sum::<usize>(), 400);
        assert_eq!(from_yaml, typed, "at {partitions} partitions");
    }
}

#[test]
fn a_reduce_whose_expression_fails_keeps_the_result_and_the_policy_decides() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ratios.yaml"),
        r#"
job: ratios
sources:
  readings: { file: { path: none.jsonl }, schema: [sensor, value] }
pipeline:
  - from: readings
  - key_by: "event.sensor"
  - reduce: { value: "acc.value / event.value" }
    on_error: dead_letter
  - to: out
sinks:
  out: { stdout: {} }
  dead_letters: { stdout: {} }
"#,
    )
    .unwrap();
    // 100 / 5 = 20; 20 / 0 fails (the result stays 20, the record goes to
    // the dead letters); 20 / 2 = 10.
    std::fs::write(
        dir.path().join("ratios_test.yaml"),
        r#"
pipeline: ratios.yaml
tests:
  - name: a division by zero is a dead letter, and the result stays
    input:
      - { sensor: a, value: 100 }
      - { sensor: a, value: 5 }
      - { sensor: b, value: 7 }
      - { sensor: a, value: 0 }
      - { sensor: a, value: 2 }
    expect:
      out:
        - { sensor: a, value: 100 }
        - { sensor: a, value: 20 }
        - { sensor: b, value: 7 }
        - { sensor: a, value: 10 }
      dead_letters:
        - { record: { sensor: a, value: 0 }, error: "division by zero", step: reduce, source: input, partition: 0, offset: 3 }
"#,
    )
    .unwrap();
    let report = TestFile::from_file(dir.path().join("ratios_test.yaml")).unwrap().run().unwrap();
    assert!(report.passed(), "{report}");
}

fn reducing_file(reduce: &str, dir: &Path) -> String {
    format!(
        r#"
job: upgrade
checkpoints: {{ storage: {}, interval: 10m }}
sources:
  numbers: {{ generator: {{ count: 60000, rate: 30000, fields: {{ key: "i % 10", n: "1", total: "i" }} }} }}
pipeline:
  - from: numbers
  - key_by: "event.key"
    partitions: 2
  - reduce: {reduce}
    name: totals
  - to: out
sinks:
  out: {{ blackhole: {{}} }}
"#,
        dir.display()
    )
}

/// A reduce keeps the key's last result, a record of the step's fields:
/// its expressions may change across a restore (the result means the
/// same), its fields may not.
#[test]
fn a_reduce_savepoint_restores_into_new_expressions_and_is_refused_for_new_fields() {
    let dir = tempfile::tempdir().unwrap();
    let first = reducing_file(r#"{ n: "acc.n + event.n", total: "acc.total + event.total" }"#, &dir.path().join("v1"));
    let savepoint = weibo_tests::savepoint_midway(
        Pipeline::parse("upgrade.yaml", first.as_bytes()).unwrap().job().unwrap(),
        Duration::from_millis(600),
    );
    let rewritten =
        reducing_file(r#"{ n: "event.n + acc.n", total: "event.total + acc.total" }"#, &dir.path().join("v2"));
    let totals = weibo_tests::yaml_restore::last_per_key(&rewritten, &savepoint).unwrap();
    assert_eq!(totals.len(), 10);
    for (key, (n, total)) in totals {
        assert_eq!(n, 6_000, "key {key}");
        assert_eq!(total, (0..60_000i64).filter(|i| i % 10 == key).sum::<i64>(), "key {key}");
    }
    // Other fields: the kept results would be read as records they are not.
    let mut reshaped = rewritten.replace(r#"total: "i" }"#, r#"total: "i", extra: "0" }"#);
    reshaped = reshaped.replace(dir.path().join("v2").to_str().unwrap(), dir.path().join("v3").to_str().unwrap());
    assert_ne!(reshaped, rewritten);
    let err = weibo_tests::yaml_restore::last_per_key(&reshaped, &savepoint).unwrap_err().to_string();
    assert!(err.contains("totals") && err.contains("version"), "{err}");
    // The refusal left the savepoint as it was: it restores again.
    let again = reducing_file(r#"{ n: "acc.n + event.n", total: "acc.total + event.total" }"#, &dir.path().join("v4"));
    assert_eq!(
        weibo_tests::yaml_restore::last_per_key(&again, &savepoint).unwrap().values().map(|(n, _)| n).sum::<i64>(),
        60_000
    );
}

#[test]
fn the_mistakes_of_streams_and_reduce_are_reported_at_their_positions() {
    let file = r#"job: mistakes
sources:
  orders: { file: { path: o }, schema: [id, customer, amount, ts], event_time: { field: ts } }
  payments: { file: { path: p }, schema: [order_id, paid, ts] }
streams:
  early:
    - from: later
  orders:
    - from: payments
  keyed:
    - from: orders
    - key_by: "event.customer"
  unused:
    - from: payments
    - filter: "event.paid > 0"
      name: dup
  later:
    - from: keyed
    - filter: "event.amont > 1"
pipeline:
  - from: later
  - map: { customer: "event.customer", amount: "event.amount" }
    name: dup
  - key_by: "event.customer"
  - reduce: { amount: "acc.amount + right.amount", total: "acc.amount" }
  - to: { stdout: {} }
"#;
    let errors = Pipeline::parse_with_env("mistakes.yaml", file.as_bytes(), &|_| None).unwrap_err();
    assert_eq!(
        errors.to_string(),
        "mistakes.yaml:6:3: stream `early` is read by no step
  help: read it with `from: early` or `join: { with: early, ... }`, or remove it
mistakes.yaml:7:13: stream `later` is not declared yet here
  help: move stream `later` above the steps that read it: a stream reads the sources and the streams declared before it
mistakes.yaml:8:3: a source and a stream are both named `orders`
  help: give the stream a name of its own
mistakes.yaml:11:5: stream `keyed` ends after `key_by`
  help: follow `key_by` with `window` (with `aggregate`), `aggregate` or `reduce`
mistakes.yaml:13:3: stream `unused` is read by no step
  help: read it with `from: unused` or `join: { with: unused, ... }`, or remove it
mistakes.yaml:19:16: no field `amont` in the records of this step
  help: did you mean `event.amount`? The records here have: id, customer, amount, ts
mistakes.yaml:23:11: two steps are named `dup` (the first at line 16)
  help: give each step its own name: a step's name is its operator's id
mistakes.yaml:25:37: unknown name `right`
  help: the records here are read through acc and event: write `acc.<field>`
mistakes.yaml:25:52: no field `total` in the records of this step
  help: a reduce gives the fields of its records: customer, amount"
    );
}

const ENRICH: &str = r#"
job: enrich
sources:
  orders: { file: { path: orders.jsonl }, schema: [id, customer, amount, ts] }
pipeline:
  - from: orders
  - process: { function: split_by_region, gives: [id, region, share] }
    on_error: dead_letter
  - filter: "event.share > 0"
  - to: out
sinks:
  out: { stdout: {} }
  dead_letters: { stdout: {} }
"#;

/// Splits an order's amount over its customer's regions (c0: two, c1:
/// one, c2: none); an unknown customer is an error.
fn split_by_region(record: &Value, out: &mut Vec<Value>) -> Result<(), String> {
    let (Some(Value::Int(id)), Some(Value::Str(customer)), Some(Value::Int(amount))) =
        (record.get("id"), record.get("customer"), record.get("amount"))
    else {
        return Err(format!("not an order: {record}"));
    };
    let regions: &[&str] = match customer.as_str() {
        "c0" => &["eu", "us"],
        "c1" => &["eu"],
        "c2" => &[],
        other => return Err(format!("no regions for customer {other}")),
    };
    for region in regions {
        let share = amount / regions.len() as i64;
        out.push(Value::map([("id", Value::Int(*id)), ("region", Value::str(region)), ("share", Value::Int(share))]));
    }
    Ok(())
}

#[test]
fn a_process_step_runs_its_function_under_the_failure_policy() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("enrich.yaml"), ENRICH).unwrap();
    std::fs::write(
        dir.path().join("enrich_test.yaml"),
        r#"
pipeline: enrich.yaml
tests:
  - name: an order per region, none for no region, a dead letter for an unknown customer
    input:
      - { id: 1, customer: c0, amount: 10, ts: 0 }
      - { id: 2, customer: c1, amount: 7, ts: 1 }
      - { id: 3, customer: c2, amount: 5, ts: 2 }
      - { id: 4, customer: c9, amount: 5, ts: 3 }
      - { id: 5, customer: c0, amount: 1, ts: 4 }
    expect:
      out:
        - { id: 1, region: eu, share: 5 }
        - { id: 1, region: us, share: 5 }
        - { id: 2, region: eu, share: 7 }
      dead_letters:
        - { record: { id: 4, customer: c9, amount: 5, ts: 3 }, error: "no regions for customer c9", step: process, source: input, partition: 0, offset: 3 }
"#,
    )
    .unwrap();
    let test = TestFile::from_file(dir.path().join("enrich_test.yaml")).unwrap();
    // Without its function, the pipeline does not start.
    let err = TestFile::from_file(dir.path().join("enrich_test.yaml")).unwrap().run().unwrap_err().to_string();
    assert!(err.contains("`split_by_region`, which is not registered"), "{err}");
    let report = test.with_function("split_by_region", split_by_region).run().unwrap();
    assert!(report.passed(), "{report}");

    // A function that gives what is not a record fails the record.
    let test = TestFile::from_file(dir.path().join("enrich_test.yaml")).unwrap().with_function(
        "split_by_region",
        |_: &Value, out: &mut Vec<Value>| {
            out.push(Value::Int(1));
            Ok(())
        },
    );
    let report = test.run().unwrap().to_string();
    assert!(report.contains("the function gave 1 (int), not a record"), "{report}");
}

#[test]
fn a_process_step_matches_the_typed_flat_map_on_a_real_job() {
    let dir = tempfile::tempdir().unwrap();
    let (orders, path, _) = orders_and_payments(dir.path());
    let out = dir.path().join("out.jsonl");
    let file = ENRICH
        .replace("orders.jsonl", path.to_str().unwrap())
        .replace("out: { stdout: {} }", &format!("out: {{ file: {{ path: {} }} }}", out.display()));
    let pipeline =
        Pipeline::parse("enrich.yaml", file.as_bytes()).unwrap().with_function("split_by_region", split_by_region);
    let report = run(pipeline.job().unwrap());
    let mut from_yaml: Vec<(i64, String, i64)> = read_lines(&out)
        .iter()
        .map(|v| (v["id"].as_i64().unwrap(), v["region"].as_str().unwrap().to_string(), v["share"].as_i64().unwrap()))
        .collect();
    let mut expected: Vec<(i64, String, i64)> = orders
        .iter()
        .flat_map(|o| {
            let regions: Vec<&str> = match o.customer.as_str() {
                "c0" => vec!["eu", "us"],
                "c1" => vec!["eu"],
                _ => vec![],
            };
            let n = regions.len().max(1) as i64;
            regions.into_iter().map(move |r| (o.id, r.to_string(), o.amount / n))
        })
        .filter(|r| r.2 > 0)
        .collect();
    from_yaml.sort();
    expected.sort();
    assert!(expected.len() > 100);
    assert_eq!(from_yaml, expected);
    // Customers c3..c8 have no regions: their orders are dead letters.
    let unknown = orders.iter().filter(|o| !["c0", "c1", "c2"].contains(&o.customer.as_str())).count() as u64;
    let process = report.metrics.operator("process").unwrap();
    assert_eq!(process.dead_lettered, unknown, "{process:?}");
}

#[test]
fn the_mistakes_of_process_are_reported_at_their_positions() {
    let file = r#"job: mistakes
sources:
  orders: { file: { path: o }, schema: [id, customer] }
pipeline:
  - from: orders
  - process: { function: f, gives: [] }
  - process: { function: g, gives: [a, b, a] }
  - process: { gives: [a] }
  - process: { function: h, give: [a] }
  - to: { stdout: {} }
"#;
    let errors = Pipeline::parse_with_env("mistakes.yaml", file.as_bytes(), &|_| None).unwrap_err();
    assert_eq!(
        errors.to_string(),
        "mistakes.yaml:6:29: a process step that gives no fields
  help: list the fields of the records it gives: gives: [user, country]
mistakes.yaml:7:29: `a` is listed twice in gives
  help: list each field once
mistakes.yaml:8:14: process has no `function`
  help: add `function:`
mistakes.yaml:9:14: process has no `gives`
  help: add `gives:`
mistakes.yaml:9:29: unknown key `give` in process
  help: did you mean `gives`? The keys of process are: function, gives"
    );
}

/// Consecutive stateless steps run as one operator named after them; a
/// record failing in it fails the job naming the step, the record's
/// position and the error, or is skipped and counted under `skip`.
#[test]
fn a_chain_of_stateless_steps_fails_naming_its_step_or_counts_what_it_skips() {
    let file = |policy: &str| {
        format!(
            r#"
job: overflow
sources:
  numbers: {{ generator: {{ count: 1000, fields: {{ i: "i", big: "i == 700 ? 9223372036854775807 : i" }} }} }}
pipeline:
  - from: numbers
  - map: {{ i: "event.i", twice: "event.big * 2" }}
    on_error: {policy}
  - filter: "event.i % 2 == 0"
    on_error: {policy}
  - to: {{ blackhole: {{}} }}
"#
        )
    };
    let pipeline = Pipeline::parse("overflow.yaml", file("fail").as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let err = tokio::runtime::Runtime::new().unwrap().block_on(pipeline.job().unwrap().run()).unwrap_err();
    match err {
        weibo::Error::RecordFailed { operator, position, message } => {
            // The generator's fields run with the steps after them (their
            // policy is `fail` too).
            assert_eq!(operator, "numbers:fields+map+filter");
            assert_eq!((position.source.as_str(), position.offset), ("numbers", 700));
            assert_eq!(message, "step `map`: int overflow in `*`");
        }
        other => panic!("expected RecordFailed, got {other:?}"),
    }

    let pipeline = Pipeline::parse("overflow.yaml", file("skip").as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let report = run(pipeline.job().unwrap());
    // The generator's fields fail the job on an error: they run alone.
    let fields = report.metrics.operator("numbers:fields").unwrap();
    assert_eq!(fields.records_out, 1000);
    let chain = report.metrics.operator("map+filter").unwrap();
    // Record 700, even, is skipped: 499 of the 500 even ones come out.
    assert_eq!((chain.records_in, chain.dropped, chain.records_out), (1000, 1, 499));
}
