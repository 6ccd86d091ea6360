//! The book's "Pipelines in YAML" chapter: a YAML pipeline run from a Rust
//! program that registers the function of its `process` step.
//!
//! Run it with `cargo run -p weibo-examples --example book_yaml`.

// ANCHOR: imports
use std::error::Error;

use weibo_connectors::yaml::{Pipeline, Value};
// ANCHOR_END: imports

// ANCHOR: function
/// Splits an order's amount evenly over its customer's regions; a
/// customer without regions is an error (the step's `on_error` decides).
fn split_by_region(order: &Value, out: &mut Vec<Value>) -> Result<(), String> {
    let (Some(id), Some(Value::Str(customer)), Some(Value::Int(amount))) =
        (order.get("id"), order.get("customer"), order.get("amount"))
    else {
        return Err(format!("not an order: {order}"));
    };
    let regions: &[&str] = match customer.as_str() {
        "c0" => &["eu", "us"],
        "c1" => &["apac"],
        other => return Err(format!("customer {other} has no regions")),
    };
    for region in regions {
        let share = Value::Int(amount / regions.len() as i64);
        out.push(Value::map([("id", id.clone()), ("region", Value::str(region)), ("share", share)]));
    }
    Ok(())
}
// ANCHOR_END: function

fn main() -> Result<(), Box<dyn Error>> {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("yaml/regions.yaml");
    // ANCHOR: run
    let pipeline = Pipeline::from_file(&file)?.with_function("split_by_region", split_by_region);
    let report = weibo::testing::block_on(pipeline.job()?.run())?;
    // ANCHOR_END: run
    let process = report.metrics.operator("process").ok_or("no process step")?;
    println!("{} orders in, {} dead letters", process.records_in, process.dead_lettered);
    if process.records_in != 6 || process.dead_lettered != 2 {
        return Err(format!("expected 6 orders in and 2 dead letters: {process:?}").into());
    }
    Ok(())
}
