//! The book's YAML pipelines (`examples/yaml/`), run as a user runs them:
//! every file is valid, and those that need no service run and give what
//! the book says they give.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use weibo::prelude::*;
use weibo_connectors::yaml::{Out, Pipeline, SinkUse};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/yaml")
}

/// Runs `file` with every sink's records collected as JSON text, by sink.
fn run(file: &str) -> BTreeMap<String, Vec<String>> {
    let pipeline = Pipeline::from_file(examples().join(file)).unwrap();
    let collected: BTreeMap<String, CollectSink<Out>> =
        pipeline.spec().sinks.keys().map(|name| (name.clone(), CollectSink::new())).collect();
    let job = pipeline
        .job_with_sinks(|sink, records: &SinkUse| {
            let schema = records.schema.clone();
            records.stream.map(move |r| Out { record: schema.to_value(&r), key: None }).sink(collected[sink].clone());
            true
        })
        .unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(job.run()).unwrap();
    collected
        .into_iter()
        .map(|(name, sink)| {
            let mut lines: Vec<String> = sink.values().iter().map(|o| o.record.to_string()).collect();
            lines.sort();
            (name, lines)
        })
        .collect()
}

#[test]
fn every_example_is_valid() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(examples())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| !p.to_string_lossy().ends_with("_test.yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3);
    for file in files {
        let text = std::fs::read(&file).unwrap();
        let env = |name: &str| (name == "KAFKA_BROKERS").then(|| "127.0.0.1:9092".to_string());
        if let Err(e) = Pipeline::parse_with_env(&file.display().to_string(), &text, &env) {
            panic!("{e}");
        }
    }
}

#[test]
fn clicks_per_user_per_minute() {
    let out = run("clicks.yaml");
    assert_eq!(
        out["per_minute"],
        [
            r#"{"key":"ann","window_start":0,"window_end":60000,"clicks":3,"cents":800,"first":1000,"last":59000}"#,
            r#"{"key":"ann","window_start":60000,"window_end":120000,"clicks":1,"cents":700,"first":75000,"last":75000}"#,
            r#"{"key":"bob","window_start":0,"window_end":60000,"clicks":1,"cents":500,"first":1500,"last":1500}"#,
            r#"{"key":"bob","window_start":120000,"window_end":180000,"clicks":1,"cents":100,"first":130000,"last":130000}"#,
            r#"{"key":"bob","window_start":60000,"window_end":120000,"clicks":1,"cents":200,"first":61000,"last":61000}"#,
        ]
    );
    assert_eq!(out["late_clicks"], [r#"{"user":"bob","cents":600,"ts":2000}"#]);
    assert_eq!(out["dead_letters"].len(), 1);
    let letter: serde_json::Value = serde_json::from_str(&out["dead_letters"][0]).unwrap();
    assert_eq!(letter["record"], "this line is not JSON");
    assert_eq!(letter["step"], "clicks:decode");
    assert_eq!(letter["source"], "clicks");
    assert!(letter["error"].as_str().unwrap().starts_with("not JSON"), "{letter}");
}

#[test]
fn running_totals_per_customer() {
    let out = run("totals.yaml");
    let last: BTreeMap<i64, serde_json::Value> = out["to:stdout"]
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| (v["key"].as_i64().unwrap(), v))
        .fold(BTreeMap::new(), |mut m, (k, v)| {
            let keep = m.get(&k).is_none_or(|old: &serde_json::Value| old["orders"].as_i64() < v["orders"].as_i64());
            if keep {
                m.insert(k, v);
            }
            m
        });
    // Orders i = 0..20, customer i % 4, refunds (i % 5 == 0) dropped.
    for (customer, totals) in last {
        let paid: Vec<i64> = (0..20).filter(|i| i % 4 == customer && i % 5 != 0).map(|i| 250 * (i % 3 + 1)).collect();
        assert_eq!(totals["orders"], paid.len() as i64, "{totals}");
        assert_eq!(totals["cents"], paid.iter().sum::<i64>(), "{totals}");
        assert_eq!(totals["largest"], *paid.iter().max().unwrap(), "{totals}");
    }
}

#[test]
fn the_examples_tests_pass() {
    for (file, cases) in [("clicks_test.yaml", 2), ("payments_test.yaml", 1), ("customers_test.yaml", 1)] {
        let report = weibo_connectors::yaml::TestFile::from_file(examples().join(file)).unwrap().run().unwrap();
        assert!(report.passed(), "{report}");
        assert_eq!(report.cases.len(), cases);
    }
}

#[test]
fn orders_joined_with_their_payments() {
    let out = run("payments.yaml");
    assert_eq!(
        out["out"],
        [
            r#"{"id":1,"customer":"ann","amount":30,"paid":true}"#,
            r#"{"id":2,"customer":"bob","amount":50,"paid":false}"#,
            r#"{"id":3,"customer":"ann","amount":20,"paid":false}"#,
        ]
    );
}

/// A test whose expectation is wrong fails, saying what differs; a test
/// file naming what the pipeline lacks is refused at its positions.
#[test]
fn a_wrong_expectation_fails_and_a_wrong_test_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(examples().join("clicks.yaml"), dir.path().join("clicks.yaml")).unwrap();
    let wrong = dir.path().join("wrong_test.yaml");
    std::fs::write(
        &wrong,
        "pipeline: clicks.yaml\ntests:\n  - name: off by one\n    input:\n      - { user: ann, kind: click, amount: 3, ts: 1000 }\n      - watermark: 59999\n    expect:\n      per_minute:\n        - { key: ann, window_start: 0, window_end: 60000, clicks: 2, cents: 300, first: 1000, last: 1000 }\n",
    )
    .unwrap();
    let report = weibo_connectors::yaml::TestFile::from_file(&wrong).unwrap().run().unwrap();
    assert!(!report.passed());
    assert_eq!(
        report.to_string(),
        format!(
            "{}: test `off by one`: FAILED\n  \
             sink `per_minute` did not get {{\"key\":\"ann\",\"window_start\":0,\"window_end\":60000,\"clicks\":2,\"cents\":300,\"first\":1000,\"last\":1000}}\n  \
             sink `per_minute` got {{\"key\":\"ann\",\"window_start\":0,\"window_end\":60000,\"clicks\":1,\"cents\":300,\"first\":1000,\"last\":1000}}, which the test does not expect",
            wrong.display()
        )
    );
    let bad = dir.path().join("bad_test.yaml");
    std::fs::write(
        &bad,
        "pipeline: clicks.yaml\ntests:\n  - name: typos\n    input:\n      - { usr: ann, kind: click }\n    expect:\n      per_minut: []\n",
    )
    .unwrap();
    let errors = weibo_connectors::yaml::TestFile::from_file(&bad).unwrap_err();
    assert_eq!(
        errors.to_string(),
        format!(
            "{f}:5:11: the source has no field `usr`\n  help: did you mean `user`? The source's fields are: user, kind, amount, ts\n\
             {f}:7:7: the pipeline has no sink `per_minut`\n  help: did you mean `per_minute`?",
            f = bad.display()
        )
    );
}

#[test]
fn paid_per_customer_through_a_named_stream() {
    let out = run("customers.yaml");
    // Order 1 (ann) is paid within its ten minutes; order 3's payment comes
    // too late; order 2 is never paid.
    assert_eq!(out["out"], [r#"{"customer":"ann","paid":30,"orders":1}"#]);
}
