//! Pipelines in YAML: a YAML pipeline and its typed twin give the same
//! output on the same input (event-time windows with allowed lateness and
//! late records, running aggregates) at 1 and 4 partitions; every problem
//! of a file is reported at once, each at its line and column, with the
//! exact message; no file, however malformed, makes the loader panic or
//! hang.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use serde::Deserialize;
use weibo::prelude::*;
use weibo::time::WatermarkStrategy;
use weibo_connectors::yaml::Pipeline;

#[derive(Clone, Debug, Deserialize, serde::Serialize)]
struct Click {
    user: String,
    kind: String,
    amount: i64,
    ts: i64,
}

/// 2 000 clicks of 7 users over about 20 minutes, out of order by up to 5 s,
/// and every 37th far behind (80 s: past the allowed lateness) or a little
/// (30 s: within it once the window has fired).
fn clicks() -> Vec<Click> {
    (0..2_000i64)
        .map(|i| {
            let h = (i * 2_654_435_761) % 1_000_003;
            let mut ts = i * 600 + (h % 10_000) - 5_000;
            if i % 37 == 0 {
                ts -= if i % 74 == 0 { 80_000 } else { 30_000 };
            }
            Click {
                user: format!("u{}", h % 7),
                kind: if h % 5 == 0 { "view".into() } else { "click".into() },
                amount: h % 23 - 2,
                ts: ts.max(0),
            }
        })
        .collect()
}

fn write_lines(path: &Path, clicks: &[Click]) {
    let text: String = clicks.iter().map(|c| serde_json::to_string(c).unwrap() + "\n").collect();
    std::fs::write(path, text).unwrap();
}

/// A folder with the clicks as JSON lines, and that file.
fn clicks_input() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("clicks.jsonl");
    write_lines(&input, &clicks());
    (dir, input)
}

/// Runs the pipeline file `text`.
fn run_yaml(name: &str, text: &str) -> weibo::JobReport {
    run(Pipeline::parse(name, text.as_bytes()).unwrap_or_else(|e| panic!("{e}")).job().unwrap())
}

fn read_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// What the window aggregate gives, as both pipelines write it.
type WindowRow = (String, i64, i64, i64, i64, i64, i64, String, i64, i64, i64);

#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
struct Acc {
    n: i64,
    total: i64,
    low: Option<i64>,
    high: Option<i64>,
    first: Option<i64>,
    last: Option<i64>,
    kinds: BTreeSet<i64>,
}

/// The typed twin of the YAML's aggregate.
struct Typed;

impl Aggregate<Click> for Typed {
    type Acc = Acc;
    type Out = Acc;

    fn create(&self) -> Acc {
        Acc::default()
    }

    fn add(&self, acc: &mut Acc, c: Click) {
        acc.n += 1;
        acc.total += c.amount;
        acc.low = Some(acc.low.map_or(c.amount, |l| l.min(c.amount)));
        acc.high = Some(acc.high.map_or(c.amount, |h| h.max(c.amount)));
        acc.first.get_or_insert(c.ts);
        acc.last = Some(c.ts);
        acc.kinds.insert(c.amount % 3);
    }

    fn merge(&self, _acc: &mut Acc, _other: Acc) {}

    fn result(&self, acc: &Acc) -> Acc {
        acc.clone()
    }
}

fn yaml_windows(input: &Path, out: &Path, late: &Path, partitions: usize) -> String {
    format!(
        r#"
job: twin
sources:
  clicks:
    file: {{ path: {input}, format: json }}
    schema: [user, kind, amount, ts]
    event_time: {{ field: ts, max_out_of_orderness: 2s }}
pipeline:
  - from: clicks
  - filter: "event.kind == 'click' && event.amount > 0"
  - key_by: "event.user"
    partitions: {partitions}
  - window: {{ tumbling: 1m, allowed_lateness: 10s, late: late }}
    aggregate:
      n: "count()"
      total: "sum(event.amount)"
      low: "min(event.amount)"
      high: "max(event.amount)"
      mean: "avg(event.amount)"
      first: "first(event.ts)"
      last: "last(event.ts)"
      kinds: "count_distinct(event.amount % 3)"
  - to: out
sinks:
  out: {{ file: {{ path: {out} }} }}
  late: {{ file: {{ path: {late} }} }}
"#,
        input = input.display(),
        out = out.display(),
        late = late.display()
    )
}

fn run(job: Job) -> weibo::JobReport {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(job.run()).unwrap()
}

#[test]
fn windows_with_lateness_match_the_typed_twin_at_1_and_4_partitions() {
    let (dir, input) = clicks_input();
    for partitions in [1, 4] {
        let (out, late) = (dir.path().join(format!("out-{partitions}")), dir.path().join(format!("late-{partitions}")));
        let pipeline = Pipeline::parse("twin.yaml", yaml_windows(&input, &out, &late, partitions).as_bytes()).unwrap();
        let report = run(pipeline.job().unwrap());
        let mut from_yaml: Vec<WindowRow> = read_lines(&out)
            .iter()
            .map(|v| {
                (
                    v["key"].as_str().unwrap().to_string(),
                    v["window_start"].as_i64().unwrap(),
                    v["window_end"].as_i64().unwrap(),
                    v["n"].as_i64().unwrap(),
                    v["total"].as_i64().unwrap(),
                    v["low"].as_i64().unwrap(),
                    v["high"].as_i64().unwrap(),
                    format!("{:.6}", v["mean"].as_f64().unwrap()),
                    v["first"].as_i64().unwrap(),
                    v["last"].as_i64().unwrap(),
                    v["kinds"].as_i64().unwrap(),
                )
            })
            .collect();
        let mut late_yaml: Vec<(String, i64)> = read_lines(&late)
            .iter()
            .map(|v| (v["user"].as_str().unwrap().to_string(), v["ts"].as_i64().unwrap()))
            .collect();

        let job = Job::new("twin");
        let windows = job
            .source(FileSource::json_lines(&input))
            .with_timestamps(|c: &Click| c.ts, WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(2)))
            .filter(|c: &Click| c.kind == "click" && c.amount > 0)
            .key_by(|c: &Click| c.user.clone())
            .with_partitions(partitions)
            .window(Tumbling::of(Duration::from_secs(60)))
            .allowed_lateness(Duration::from_secs(10))
            .aggregate(Typed);
        let (results, late_records) = (CollectSink::new(), CollectSink::new());
        windows.late_records().sink(late_records.clone());
        windows.into_stream().sink(results.clone());
        run(job);
        let mut typed: Vec<WindowRow> = results
            .values()
            .into_iter()
            .map(|w: WindowResult<String, Acc>| {
                let a = w.value;
                (
                    w.key,
                    w.window.start,
                    w.window.end,
                    a.n,
                    a.total,
                    a.low.unwrap(),
                    a.high.unwrap(),
                    format!("{:.6}", a.total as f64 / a.n as f64),
                    a.first.unwrap(),
                    a.last.unwrap(),
                    a.kinds.len() as i64,
                )
            })
            .collect();
        let mut late_typed: Vec<(String, i64)> =
            late_records.values().into_iter().map(|c: Click| (c.user, c.ts)).collect();
        from_yaml.sort();
        typed.sort();
        late_yaml.sort();
        late_typed.sort();
        assert!(typed.len() > 100, "{} windows", typed.len());
        // Late records within the allowed lateness fired some windows again.
        let distinct: BTreeSet<(&String, i64)> = typed.iter().map(|w| (&w.0, w.1)).collect();
        assert!(distinct.len() < typed.len(), "no window fired twice");
        assert!(!late_typed.is_empty());
        assert_eq!(from_yaml, typed, "windows at {partitions} partitions");
        assert_eq!(late_yaml, late_typed, "late records at {partitions} partitions");
        let window = report.metrics.operator("window").unwrap();
        assert_eq!(window.late as usize, late_typed.len());
    }
}

#[test]
fn a_running_aggregate_matches_the_typed_twin() {
    let (dir, input) = clicks_input();
    for partitions in [1, 4] {
        let out = dir.path().join(format!("out-{partitions}"));
        let file = format!(
            r#"
job: totals
sources:
  clicks: {{ file: {{ path: {} }}, schema: [user, kind, amount, ts] }}
pipeline:
  - from: clicks
  - map: {{ user: "event.user", cents: "event.amount * 100" }}
  - key_by: "event.user"
    partitions: {partitions}
  - aggregate: {{ n: "count()", cents: "sum(event.cents)" }}
  - to: {{ file: {{ path: {} }} }}
"#,
            input.display(),
            out.display()
        );
        run_yaml("totals.yaml", &file);
        let mut from_yaml: Vec<(String, i64, i64)> = read_lines(&out)
            .iter()
            .map(|v| (v["key"].as_str().unwrap().to_string(), v["n"].as_i64().unwrap(), v["cents"].as_i64().unwrap()))
            .collect();
        let job = Job::new("totals");
        let totals = CollectSink::new();
        job.source(FileSource::json_lines(&input))
            .map(|c: Click| (c.user, c.amount * 100))
            .key_by(|c: &(String, i64)| c.0.clone())
            .with_partitions(partitions)
            .fold(
                || (0i64, 0i64),
                |acc: &mut (i64, i64), c: (String, i64)| {
                    acc.0 += 1;
                    acc.1 += c.1;
                },
            )
            .sink(totals.clone());
        run(job);
        let mut typed: Vec<(String, i64, i64)> = totals.values().into_iter().map(|(k, (n, c))| (k, n, c)).collect();
        from_yaml.sort();
        typed.sort();
        assert_eq!(from_yaml.len(), 2_000);
        assert_eq!(from_yaml, typed);
    }
}

#[test]
fn every_problem_is_reported_at_once_with_its_position() {
    let file = r#"job: broken
checkpoints: { storage: ./cp, interval: 5 parsecs }
sources:
  clicks:
    kafka: { brokers: "${NO_SUCH_BROKERS}", topic: clicks, grup: g1 }
    schema: [user, amount, ts]
    event_time: { field: tss }
  numbers:
    generator: { count: ten, fields: { n: "i * 2" } }
pipeline:
  - from: clicks
  - filtre: "event.amount > 0"
  - filter: "event.amout > 0 && sise(event.user) > 1"
    on_error: dead_letter
  - map: { user: "event.user", amount: "event.amount +" }
  - window: { tumbling: 1m }
    aggregate: { n: "count()", total: "summ(event.amount)" }
  - to: nowhere
sinks:
  out: { stdout: {}, blackhole: {} }
"#;
    let errors = Pipeline::parse_with_env("broken.yaml", file.as_bytes(), &|_| None).unwrap_err();
    let expected = "\
broken.yaml:2:41: checkpoints.interval is `5 parsecs`, not a duration
  help: write a number and a unit: 500ms, 10s, 1m, 2h, 1d
broken.yaml:5:23: brokers: the environment variable `NO_SUCH_BROKERS` is not set
  help: set NO_SUCH_BROKERS before running the pipeline
broken.yaml:5:60: unknown key `grup` in a Kafka source
  help: did you mean `group`? The keys of a Kafka source are: brokers, topic, topics, group, format, bounded, start
broken.yaml:7:26: no field `tss` in source `clicks`
  help: did you mean `ts`? The fields are: user, amount, ts
broken.yaml:9:25: count is `ten`, not a whole number of at least 0
broken.yaml:12:5: step 2 does nothing: no `from`, `filter`, `map`, `process`, `key_by`, `window`, `aggregate`, `reduce`, `dedup`, `route`, `join`, `to`
  help: did you mean `filter`? A step is one of: from, filter, map, process, key_by, window, aggregate, reduce, dedup, route, join, to
broken.yaml:13:14: no field `amout` in the records of this step
  help: did you mean `event.amount`? The records here have: user, amount, ts
broken.yaml:13:33: unknown function `sise`
  help: did you mean `size`? The functions are: size, int, double, string, bool, contains, startsWith, endsWith, lowerAscii, upperAscii, has
broken.yaml:14:15: no sink named `dead_letters`
  help: declare it under `sinks:` (declared: out)
broken.yaml:15:55: the expression `event.amount +` does not parse: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}
broken.yaml:16:5: a window on records without a key
  help: put a `key_by` step before it (key_by: \"event.user\")
broken.yaml:17:40: `summ` is not an aggregate
  help: did you mean `sum`? The aggregates are: count, sum, min, max, avg, first, last, count_distinct
broken.yaml:18:9: no sink named `nowhere`
  help: declare it under `sinks:` (declared: out)
broken.yaml:20:22: sink `out` has several kinds; a sink has one";
    assert_eq!(errors.to_string(), expected);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Random bytes, and a valid file with random bytes cut out or put in,
    /// are refused or accepted; never a panic.
    #[test]
    fn no_file_makes_the_loader_panic(
        noise in proptest::collection::vec(any::<u8>(), 0..400),
        cut in 0usize..600,
        len in 0usize..40,
        insert in proptest::collection::vec(prop_oneof![Just(b'{'), Just(b'['), Just(b':'), Just(b'"'), Just(b'*'), Just(b'&'), Just(b'\n'), Just(b' '), Just(b'-'), any::<u8>()], 0..20),
    ) {
        let _ = Pipeline::parse_with_env("noise.yaml", &noise, &|_| None);
        let mut file = yaml_windows(Path::new("/in"), Path::new("/out"), Path::new("/late"), 2).into_bytes();
        let at = cut.min(file.len());
        let end = (at + len).min(file.len());
        file.splice(at..end, insert);
        match Pipeline::parse_with_env("mutated.yaml", &file, &|_| None) {
            Ok(p) => prop_assert!(!p.spec().steps.is_empty()),
            Err(e) => prop_assert!(!e.diagnostics.is_empty() && e.diagnostics.iter().all(|d| d.pos.line >= 1)),
        }
    }
}

#[test]
fn dedup_matches_the_typed_twin_at_1_and_4_partitions() {
    let (dir, input) = clicks_input();
    for partitions in [1, 4] {
        let out = dir.path().join(format!("out-{partitions}"));
        let file = format!(
            r#"
job: firsts
sources:
  clicks:
    file: {{ path: {} }}
    schema: [user, kind, amount, ts]
    event_time: {{ field: ts, max_out_of_orderness: 2s }}
pipeline:
  - from: clicks
  - dedup: {{ key: "event.user + '/' + event.kind", within: 1m, partitions: {partitions} }}
  - to: {{ file: {{ path: {} }} }}
"#,
            input.display(),
            out.display()
        );
        run_yaml("firsts.yaml", &file);
        let mut from_yaml: Vec<(String, String, i64)> = read_lines(&out)
            .iter()
            .map(|v| {
                (v["user"].as_str().unwrap().into(), v["kind"].as_str().unwrap().into(), v["ts"].as_i64().unwrap())
            })
            .collect();
        let job = Job::new("firsts");
        let firsts = CollectSink::new();
        job.source(FileSource::json_lines(&input))
            .with_timestamps(|c: &Click| c.ts, WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(2)))
            .key_by(|c: &Click| format!("{}/{}", c.user, c.kind))
            .with_partitions(partitions)
            .process_with_state(
                weibo::on_error::Fail,
                |states| {
                    states
                        .ttl(weibo::process::StateTtl::after_write(Duration::from_secs(60)).in_event_time())
                        .value::<bool>("seen")
                },
                |ctx, seen, c: &Click| {
                    if ctx.value(seen).get().is_none() {
                        ctx.value(seen).set(true);
                        ctx.emit((c.user.clone(), c.kind.clone(), c.ts));
                    }
                },
            )
            .sink(firsts.clone());
        run(job);
        let mut typed = firsts.values();
        from_yaml.sort();
        typed.sort();
        // Each user and kind comes back once its key was forgotten.
        assert!(typed.len() > 14 && typed.len() < 2_000, "{} firsts", typed.len());
        assert_eq!(from_yaml, typed);
    }
}

#[test]
fn route_sends_each_record_to_its_first_case_and_the_rest_on() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("clicks.jsonl");
    let clicks = clicks();
    write_lines(&input, &clicks);
    let path = |name: &str| dir.path().join(name).display().to_string();
    let file = format!(
        r#"
job: routed
sources:
  clicks: {{ file: {{ path: {} }}, schema: [user, kind, amount, ts] }}
pipeline:
  - from: clicks
  - route:
      - {{ when: "event.amount > 15", to: big }}
      - {{ when: "event.amount > 5 || event.kind == 'view'", to: medium }}
  - to: {{ file: {{ path: {} }} }}
sinks:
  big: {{ file: {{ path: {} }} }}
  medium: {{ file: {{ path: {} }} }}
"#,
        input.display(),
        path("small"),
        path("big"),
        path("medium")
    );
    run_yaml("routed.yaml", &file);
    let ts = |name: &str| {
        let mut v: Vec<i64> = read_lines(Path::new(&path(name))).iter().map(|v| v["ts"].as_i64().unwrap()).collect();
        v.sort_unstable();
        v
    };
    let expect = |f: &dyn Fn(&Click) -> bool| {
        let mut v: Vec<i64> = clicks.iter().filter(|c| f(c)).map(|c| c.ts).collect();
        v.sort_unstable();
        v
    };
    assert_eq!(ts("big"), expect(&|c| c.amount > 15));
    assert_eq!(ts("medium"), expect(&|c| c.amount <= 15 && (c.amount > 5 || c.kind == "view")));
    assert_eq!(ts("small"), expect(&|c| c.amount <= 5 && c.kind != "view"));
    assert!(!ts("big").is_empty() && !ts("medium").is_empty() && !ts("small").is_empty());
}

fn counting_file(aggregates: &str, dir: &Path) -> String {
    format!(
        r#"
job: upgrade
checkpoints: {{ storage: {}, interval: 10m }}
sources:
  numbers: {{ generator: {{ count: 60000, rate: 30000, fields: {{ i: "i", key: "i % 10" }} }} }}
pipeline:
  - from: numbers
  - key_by: "event.key"
    partitions: 2
  - aggregate: {aggregates}
    name: totals
  - to: out
sinks:
  out: {{ blackhole: {{}} }}
"#,
        dir.display()
    )
}

/// A savepoint of a YAML job restores into the same file, and its restore
/// is refused, not misread, when the aggregates' layout changed.
#[test]
fn a_savepoint_restores_into_the_same_pipeline_and_is_refused_when_its_aggregates_changed() {
    let dir = tempfile::tempdir().unwrap();
    let first = counting_file(r#"{ n: "count()", total: "sum(event.i)" }"#, &dir.path().join("v1"));
    let savepoint = weibo_tests::savepoint_midway(
        Pipeline::parse("upgrade.yaml", first.as_bytes()).unwrap().job().unwrap(),
        Duration::from_millis(600),
    );
    // Renaming a result keeps the layout.
    let renamed = counting_file(r#"{ count: "count()", total: "sum( event.i )" }"#, &dir.path().join("v2"));
    let totals = weibo_tests::yaml_restore::last_per_key(&renamed, &savepoint).unwrap();
    assert_eq!(totals.len(), 10);
    for (key, (n, total)) in totals {
        assert_eq!(n, 6_000, "key {key}");
        assert_eq!(total, (0..60_000i64).filter(|i| i % 10 == key).sum::<i64>(), "key {key}");
    }
    // The same aggregates in another order would read each other's
    // accumulators: refused.
    let swapped = counting_file(r#"{ total: "sum(event.i)", n: "count()" }"#, &dir.path().join("v3"));
    let err = weibo_tests::yaml_restore::last_per_key(&swapped, &savepoint).unwrap_err().to_string();
    assert!(err.contains("totals") && err.contains("version"), "{err}");
    // The refusal left the savepoint as it was: it restores again.
    let again = counting_file(r#"{ n: "count()", total: "sum(event.i)" }"#, &dir.path().join("v4"));
    let totals = weibo_tests::yaml_restore::last_per_key(&again, &savepoint).unwrap();
    assert_eq!(totals.values().map(|(n, _)| n).sum::<i64>(), 60_000);
}

#[derive(Clone, Debug, Deserialize, serde::Serialize)]
struct Order {
    id: i64,
    customer: String,
    amount: i64,
    ts: i64,
}

#[derive(Clone, Debug, Deserialize, serde::Serialize)]
struct Payment {
    order_id: i64,
    paid: i64,
    ts: i64,
}

/// 300 orders, 100 ms apart; a payment for two orders of three, 1.5 s
/// before to 4.5 s after its order (those 1.5 s before are outside the
/// join's interval), in time order; and payments of 20 unknown orders.
fn orders_and_payments(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let orders: Vec<Order> =
        (0..300).map(|id| Order { id, customer: format!("c{}", id % 9), amount: id * 10 % 97, ts: id * 100 }).collect();
    let mut payments: Vec<Payment> = (0..320)
        .filter(|id| id % 3 != 0)
        .map(|id| Payment { order_id: id, paid: id * 10 % 97, ts: (id * 100 + (id % 7) * 1000 - 1500).max(0) })
        .collect();
    payments.sort_by_key(|p| p.ts);
    let (o, p) = (dir.join("orders.jsonl"), dir.join("payments.jsonl"));
    std::fs::write(&o, orders.iter().map(|x| serde_json::to_string(x).unwrap() + "\n").collect::<String>()).unwrap();
    std::fs::write(&p, payments.iter().map(|x| serde_json::to_string(x).unwrap() + "\n").collect::<String>()).unwrap();
    (o, p)
}

#[test]
fn a_full_interval_join_matches_the_typed_twin_at_1_and_4_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let (orders, payments) = orders_and_payments(dir.path());
    for partitions in [1, 4] {
        let out = dir.path().join(format!("joined-{partitions}"));
        let file = format!(
            r#"
job: paid
sources:
  orders:
    file: {{ path: {} }}
    schema: [id, customer, amount, ts]
    event_time: {{ field: ts, max_out_of_orderness: 1s }}
  payments:
    file: {{ path: {} }}
    schema: [order_id, paid, ts]
    event_time: {{ field: ts, max_out_of_orderness: 1s }}
pipeline:
  - from: orders
  - join: {{ with: payments, key: "event.id", with_key: "event.order_id", interval: {{ from: -1s, to: 5s }}, type: full, partitions: {partitions} }}
    select:
      id: "has(left.id) ? left.id : right.order_id"
      amount: "left.amount"
      paid: "right.paid"
  - to: {{ file: {{ path: {} }} }}
"#,
            orders.display(),
            payments.display(),
            out.display()
        );
        run_yaml("paid.yaml", &file);
        let opt = |v: &serde_json::Value| v.as_i64();
        let mut from_yaml: Vec<(i64, Option<i64>, Option<i64>)> =
            read_lines(&out).iter().map(|v| (v["id"].as_i64().unwrap(), opt(&v["amount"]), opt(&v["paid"]))).collect();

        let job = Job::new("paid");
        let bounded = || WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(1));
        let left = job
            .source(FileSource::json_lines(&orders))
            .with_timestamps(|o: &Order| o.ts, bounded())
            .key_by(|o: &Order| o.id);
        let right = job
            .source(FileSource::json_lines(&payments))
            .with_timestamps(|p: &Payment| p.ts, bounded())
            .key_by(|p: &Payment| p.order_id);
        let joined = CollectSink::new();
        left.interval_join(&right)
            .between(-1_000, 5_000)
            .with_partitions(partitions)
            .full_join(|o: Option<&Order>, p: Option<&Payment>| {
                (o.map_or_else(|| p.map_or(-1, |p| p.order_id), |o| o.id), o.map(|o| o.amount), p.map(|p| p.paid))
            })
            .sink(joined.clone());
        run(job);
        let mut typed = joined.values();
        from_yaml.sort();
        typed.sort();
        let pairs = typed.iter().filter(|r| r.1.is_some() && r.2.is_some()).count();
        let alone = typed.len() - pairs;
        assert!(pairs > 100 && alone > 50, "{pairs} pairs, {alone} alone");
        assert_eq!(from_yaml, typed, "at {partitions} partitions");
    }
}

#[test]
fn a_join_is_checked_like_any_step() {
    let file = r#"job: paid
sources:
  orders: { file: { path: o }, schema: [id, amount, ts], event_time: { field: ts } }
  payments: { file: { path: p }, schema: [order_id, paid, ts] }
pipeline:
  - from: orders
  - join: { with: payments, key: "event.id", with_key: "event.id", interval: { from: 5s, to: -1s } }
    select: { id: "left.id", paid: "right.payd", all: "event" }
  - to: { stdout: {} }
"#;
    let errors = Pipeline::parse_with_env("join.yaml", file.as_bytes(), &|_| None).unwrap_err();
    assert_eq!(
        errors.to_string(),
        "join.yaml:7:11: a join pairs records by event time, and a side has none
  help: give both sources an event_time
join.yaml:7:57: no field `id` in the records of this step
  help: the records here have: order_id, paid, ts
join.yaml:7:78: an interval whose `from` is after its `to`
join.yaml:8:37: no field `payd` in the records of `right`
  help: did you mean `right.paid`? The records of `right` have: order_id, paid, ts
join.yaml:8:56: unknown name `event`
  help: the records here are read through left and right: write `left.<field>`"
    );
}
