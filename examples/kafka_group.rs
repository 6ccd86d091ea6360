//! Scale-out: the click counter of `kafka_counts`, run by as many processes
//! as you like in one consumer group. Each process runs one job per input
//! partition it owns; the jobs checkpoint into a directory every process
//! sees, so a partition's counts move with it.
//!
//! ```sh
//! cargo run --release -p weibo-examples --example kafka_group -- \
//!     <brokers> <input topic> <output topic> <shared dir>
//! ```
//!
//! Start a second one with the same arguments and the partitions are
//! split; stop one with Ctrl-C (it checkpoints and leaves) or kill it
//! (`kill -9`: the others take its partitions after the session timeout).
//! The book's chapter "Scaling out" walks through it.

#[path = "shared/clicks.rs"]
mod clicks;

// ANCHOR: imports
use std::path::PathBuf;
use std::time::Duration;

use clicks::{Click, count_clicks};
use weibo::prelude::*;
use weibo_connectors::kafka::{Json, KafkaGroup, KafkaSink};
// ANCHOR_END: imports

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [brokers, input, output, dir] = args.as_slice() else {
        return Err("usage: kafka_group <brokers> <input topic> <output topic> <shared dir>".into());
    };
    let (brokers, output) = (brokers.clone(), output.clone());
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        // ANCHOR: group
        let group = KafkaGroup::new(&brokers, "click-counts", [input], PathBuf::from(dir)).spawn(move |task| {
            // The job of one partition: the same for every partition and
            // in every process; its checkpoints are the task's own.
            let job = Job::new(task.id()).with_checkpoints(task.checkpoint_dir(), Duration::from_secs(1));
            let clicks = task.source(Json).build::<Click>()?;
            count_clicks(
                &job,
                clicks,
                KafkaSink::new(&brokers, &output, Json).with_transactions(task.id(), task.redo_dir()),
            );
            Ok(job)
        })?;
        // Runs until Ctrl-C (then checkpoints, stops and leaves the group)
        // or until a task fails.
        group.stop_on(async { tokio::signal::ctrl_c().await.unwrap_or_default() }).await
        // ANCHOR_END: group
    })?;
    Ok(())
}
