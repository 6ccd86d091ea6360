//! The click-counting pipeline of the Kafka examples (`kafka_counts` runs
//! it as one job, `kafka_group` as one job per partition in a consumer
//! group).

use serde::{Deserialize, Serialize};
use weibo::Job;
use weibo_connectors::kafka::{KafkaRecord, KafkaSink, KafkaSource};

// ANCHOR: types
/// What the input topic holds (JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Click {
    pub(crate) user: String,
    pub(crate) page: String,
}

/// What the output topic gets (JSON): the click and its user's count so far.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Counted {
    pub(crate) user: String,
    pub(crate) page: String,
    pub(crate) count: u64,
}
// ANCHOR_END: types

// ANCHOR: pipeline
/// Counts clicks per user: every click goes out with its user's count so
/// far, keyed by user.
pub(crate) fn count_clicks(job: &Job, clicks: KafkaSource<Click>, out: KafkaSink<Counted>) {
    job.source(clicks)
        .name("clicks")
        .map(|r: KafkaRecord<Click>| Counted { user: r.value.user, page: r.value.page, count: 1 })
        .key_by(|c: &Counted| c.user.clone())
        .with_partitions(2)
        .reduce(|total, c| Counted { user: c.user, page: c.page, count: total.count + 1 })
        .name("count")
        // One Kafka transaction per checkpoint, committed when it completes.
        .sink_exactly_once(out.with_key(|c: &Counted| Some(c.user.clone().into_bytes())));
}
// ANCHOR_END: pipeline
