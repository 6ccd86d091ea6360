//! A YAML job restored from a savepoint, its results read back: what the
//! upgrade tests of YAML pipelines compare.

use std::collections::BTreeMap;
use std::path::Path;

use weibo::prelude::*;
use weibo_connectors::yaml::{Pipeline, Row, SinkUse, Value};

/// Runs pipeline file `file` restored from `savepoint`, its sinks' records
/// collected, and gives each key's last result: records `[key, n, total,
/// ...]` of ints, the one with the largest `n` per key, as `(n, total)`.
///
/// # Errors
/// The job's: a refused restore.
pub fn last_per_key(file: &str, savepoint: &Path) -> weibo::Result<BTreeMap<i64, (i64, i64)>> {
    let results = CollectSink::new();
    let job = Pipeline::parse("upgrade.yaml", file.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"))
        .job_with_sinks(|_, out: &SinkUse| {
            out.stream.sink(results.clone());
            true
        })
        .unwrap_or_else(|e| panic!("{e}"))
        .restore_from(savepoint);
    weibo::testing::block_on(job.run())?;
    let int = |v: &Value| if let Value::Int(i) = v { *i } else { -1 };
    let mut last = BTreeMap::new();
    for r in results.values().into_iter().map(|r: Row| (int(r.field(0)), int(r.field(1)), int(r.field(2)))) {
        let e = last.entry(r.0).or_insert((0, 0));
        if r.1 > e.0 {
            *e = (r.1, r.2);
        }
    }
    Ok(last)
}
