//! Savepoints from the command line: take one from a running job, then
//! resume from it — for example with another partition count.
//!
//! ```sh
//! cargo run -p weibo-examples --example savepoint -- take   /tmp/weibo-sp v1
//! cargo run -p weibo-examples --example savepoint -- resume /tmp/weibo-sp v1 3
//! ```
//!
//! `take` runs the quickstart's per-customer totals over a slow generator,
//! takes savepoint `<name>` after one second, and stops; `resume` restores it
//! with `<partitions>` workers, runs to the end and prints the totals.

// ANCHOR: imports
use std::path::{Path, PathBuf};
use std::time::Duration;

use weibo::Result;
use weibo::prelude::*;
use weibo_examples::{Order, Totals, order};
// ANCHOR_END: imports

fn job(dir: &Path, partitions: usize, rate: f64, out: &CollectSink<Totals>) -> Job {
    let job = Job::new("orders-per-customer").with_checkpoints(dir.join("checkpoints"), Duration::from_secs(10));
    job.source(Generator::new(20_000, order).with_rate(rate))
        .name("orders")
        .filter(|o: &Order| o.amount_cents > 0)
        .name("paid-only")
        .map(|o: Order| Totals { customer: o.customer, orders: 1, cents: o.amount_cents })
        .key_by(|t: &Totals| t.customer)
        .with_partitions(partitions)
        .reduce(|a, b| Totals { customer: a.customer, orders: a.orders + b.orders, cents: a.cents + b.cents })
        .name("totals")
        .sink(out.clone());
    job
}

fn usage() -> ! {
    eprintln!("usage: savepoint take <dir> <name> | savepoint resume <dir> <name> <partitions>");
    std::process::exit(2)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(cmd), Some(dir), Some(name)) = (args.first(), args.get(1), args.get(2)) else { usage() };
    let dir = PathBuf::from(dir);
    let out = CollectSink::new();
    match cmd.as_str() {
        "take" => {
            let handle = job(&dir, 2, 5_000.0, &out).spawn()?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let path = handle.savepoint(name).await?;
            handle.abort();
            println!("savepoint `{name}` taken: {}", path.display());
        }
        "resume" => {
            let partitions = args.get(3).and_then(|p| p.parse().ok()).unwrap_or_else(|| usage());
            let savepoint = dir.join("checkpoints").join("savepoints").join(name);
            let report = job(&dir, partitions, 1e9, &out).restore_from(&savepoint).run().await?;
            let mut last: Vec<Totals> = Vec::new();
            for t in out.values() {
                match last.iter_mut().find(|l| l.customer == t.customer) {
                    Some(l) if l.orders < t.orders => *l = t,
                    Some(_) => {}
                    None => last.push(t),
                }
            }
            last.sort_by_key(|t| t.customer);
            for t in &last {
                println!("{t:?}");
            }
            let read = report.metrics.operator("orders").map_or(0, |m| m.records_out);
            println!("resumed from `{name}` on {partitions} partitions: read the remaining {read} of 20000 orders");
        }
        _ => usage(),
    }
    Ok(())
}
