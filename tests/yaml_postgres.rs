//! A YAML pipeline landing in PostgreSQL: running totals per customer
//! upserted exactly once into a table whose columns are the records'
//! fields, with the connection string from an environment variable; and a
//! value that does not fit its column stopping the job with the record
//! named.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use weibo_connectors::yaml::Pipeline;
use weibo_tests::postgres_server::{execute, rows, server, unique};

fn pipeline(table: &str, dir: &std::path::Path, cents: &str) -> String {
    format!(
        r#"
job: totals-to-postgres
checkpoints: {{ storage: {}, interval: 100ms }}
sources:
  orders: {{ generator: {{ count: 3000, partitions: 2, fields: {{ customer: "i % 7", cents: "{cents}" }} }} }}
pipeline:
  - from: orders
  - key_by: "event.customer"
    partitions: 2
  - aggregate: {{ orders: "count()", cents: "sum(event.cents)", largest: "max(event.cents)" }}
    name: totals
  - map: {{ customer: "event.key", orders: "event.orders", cents: "event.cents", note: "'largest ' + string(event.largest)" }}
  - to: {{ postgres: {{ url: "${{WEIBO_TEST_PG_URL}}", table: {table}, upsert_keys: [customer], exactly_once: true }} }}
"#,
        dir.display()
    )
}

fn env(name: &str) -> Option<String> {
    (name == "WEIBO_TEST_PG_URL").then(|| server().url.clone())
}

#[test]
fn running_totals_are_upserted_exactly_once() {
    let table = unique("yaml_totals");
    execute(&format!("CREATE TABLE {table} (customer bigint PRIMARY KEY, orders integer, cents bigint, note text)"));
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline(&table, dir.path(), "(i * 37) % 1000");
    let job = Pipeline::parse_with_env("totals.yaml", file.as_bytes(), &env).unwrap().job().unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(job.run()).unwrap();
    let got = rows(&format!("SELECT customer, orders, cents, note FROM {table} ORDER BY customer"));
    assert_eq!(got.len(), 7);
    for (customer, row) in got.iter().enumerate() {
        let cents: Vec<i64> = (0..3000i64).filter(|i| i % 7 == customer as i64).map(|i| (i * 37) % 1000).collect();
        let want = [
            customer.to_string(),
            cents.len().to_string(),
            cents.iter().sum::<i64>().to_string(),
            format!("largest {}", cents.iter().max().unwrap()),
        ];
        assert_eq!(row.iter().map(|c| c.clone().unwrap_or_default()).collect::<Vec<_>>(), want);
    }
}

#[test]
fn a_value_that_does_not_fit_its_column_fails_the_job_naming_it() {
    let table = unique("yaml_narrow");
    execute(&format!("CREATE TABLE {table} (customer bigint PRIMARY KEY, orders integer, cents integer, note text)"));
    let dir = tempfile::tempdir().unwrap();
    // Sums past i32 for the `integer` column.
    let file = pipeline(&table, dir.path(), "3000000000");
    let job = Pipeline::parse_with_env("narrow.yaml", file.as_bytes(), &env).unwrap().job().unwrap();
    let err = tokio::runtime::Runtime::new().unwrap().block_on(job.run()).unwrap_err().to_string();
    assert!(err.contains("does not fit a column of type int4"), "{err}");
    assert!(err.contains("source `orders` partition") && err.contains("cents: 3000000000"), "{err}");
}
