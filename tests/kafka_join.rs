//! A join, exactly once, from Kafka to Kafka, in a group of two processes
//! killed again and again: orders and payments in two co-partitioned
//! topics, joined by order id within a second (a full outer interval
//! join: a paid order with its payment, an unpaid order alone, a payment
//! of an unknown order alone), written with the exactly-once Kafka sink.
//! Members are killed at random moments and started again; the group moves
//! their tasks to the survivor and back, each restored from its newest
//! checkpoint with its join buffers. The committed output (read with
//! `read_committed`) holds every row of a crash-free run once.
//!
//! The members are this test binary itself, started with
//! `WEIBO_KAFKA_CHILD` set, running only the `child` test.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use weibo::time::WatermarkStrategy;
use weibo_tests::crash;
use weibo_tests::kafka_common::*;

/// Orders `0..ORDERS`; payments of unknown orders `ORDERS..ORDERS + ORPHANS`.
const ORDERS: u64 = 8_000;
const ORPHANS: u64 = 200;

/// A record of either topic: an order, or a payment of order `id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Msg {
    id: u64,
    /// Event time, milliseconds.
    at: i64,
    amount: u64,
}

/// A row of the join: the order's id, whether the order was seen, and the
/// payment's amount if it was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Joined {
    id: u64,
    order: bool,
    payment: Option<u64>,
}

fn order_at(id: u64) -> i64 {
    id as i64 * 5
}

/// Order `id` is paid unless `id` is a multiple of 5; its payment comes
/// 0 to 600 ms after it.
fn payment(id: u64) -> Option<Msg> {
    (!id.is_multiple_of(5) || id >= ORDERS).then(|| Msg {
        id,
        at: order_at(id) + (id % 7) as i64 * 100,
        amount: id * 3,
    })
}

/// Both topics, four partitions each, keyed by order id (so that an
/// order and its payment are in the same partition number).
fn write_input(orders: &str, payments: &str) {
    create_topic(orders, 4);
    create_topic(payments, 4);
    let encode = |m: &Msg| (m.id.to_string().into_bytes(), serde_json::to_vec(m).unwrap());
    let order_values: Vec<(Vec<u8>, Vec<u8>)> =
        (0..ORDERS).map(|id| encode(&Msg { id, at: order_at(id), amount: 0 })).collect();
    let mut pays: Vec<Msg> = (0..ORDERS + ORPHANS).filter_map(payment).collect();
    pays.sort_by_key(|m| m.at);
    let payment_values: Vec<(Vec<u8>, Vec<u8>)> = pays.iter().map(encode).collect();
    for (topic, values) in [(orders, &order_values), (payments, &payment_values)] {
        let records: Vec<In<'_>> =
            values.iter().map(|(k, v)| In { key: Some(k), value: v, headers: vec![], timestamp: None }).collect();
        produce(topic, &records);
    }
}

/// What a crash-free run writes, by order id.
fn expected() -> BTreeMap<u64, Joined> {
    (0..ORDERS + ORPHANS)
        .map(|id| (id, Joined { id, order: id < ORDERS, payment: payment(id).map(|p| p.amount) }))
        .collect()
}

/// The committed rows, and the ids written more than once.
fn committed_rows(output: &str) -> (BTreeMap<u64, Joined>, Vec<u64>) {
    let mut rows = BTreeMap::new();
    let mut twice = Vec::new();
    for m in consume_all(output, "read_committed") {
        let row: Joined = serde_json::from_slice(m.payload().unwrap()).unwrap();
        if rows.insert(row.id, row.clone()).is_some() {
            twice.push(row.id);
        }
    }
    (rows, twice)
}

/// The task's job: both topics' partition from one source, split by topic,
/// each record paced (1 ms), joined by order id within a second, written
/// exactly once.
fn join_job(task: &weibo_connectors::kafka::Task, orders: &str, output: &str) -> weibo::Result<Job> {
    let job = paced_job(&task.id(), task.checkpoint_dir());
    let source = task.source(Json).until_end().build::<Msg>()?;
    let sink = KafkaSink::new(bootstrap(), output, Json).with_transactions(task.id(), task.redo_dir());
    let records = job
        .source(source)
        .map(|r: KafkaRecord<Msg>| {
            std::thread::sleep(Duration::from_millis(1));
            (r.topic.to_string(), r.value)
        })
        .with_timestamps(
            |r: &(String, Msg)| r.1.at,
            WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(1)),
        );
    let orders_topic = orders.to_string();
    let is_order = move |r: &(String, Msg)| r.0 == orders_topic;
    let orders = records.filter(is_order.clone()).map(|r: (String, Msg)| r.1).name("orders");
    let payments = records.filter(move |r: &(String, Msg)| !is_order(r)).map(|r: (String, Msg)| r.1).name("payments");
    orders
        .key_by(|m: &Msg| m.id)
        .interval_join(&payments.key_by(|m: &Msg| m.id))
        .between(0, 1_000)
        .with_partitions(2)
        .full_join(|o: Option<&Msg>, p: Option<&Msg>| {
            let id = o.or(p).map_or(u64::MAX, |m| m.id);
            Joined { id, order: o.is_some(), payment: p.map(|p| p.amount) }
        })
        .uid("paid")
        .sink_exactly_once(sink)
        .name("out");
    Ok(job)
}

/// A member of the group (`join|<orders>|<payments>|<output>|<dir>|<name>`):
/// runs the tasks it owns, writing them to `<dir>/owners-<name>`, until
/// killed or every task it owns has finished.
fn member(orders: &str, payments: &str, output: &str, dir: &Path, name: &str) {
    let owners = dir.join(format!("owners-{name}"));
    let (orders, output) = (orders.to_string(), output.to_string());
    let topics = [orders.clone(), payments.to_string()];
    weibo::testing::block_on(async move {
        let group = KafkaGroup::new(bootstrap(), format!("{output}-group"), topics, dir.join("group"))
            .with_session_timeout(Duration::from_secs(3))
            .spawn(move |task| join_job(task, &orders, &output))
            .unwrap();
        while !group.is_finished() {
            let owned: Vec<String> = group.owned().iter().map(ToString::to_string).collect();
            std::fs::write(owners.with_extension("tmp"), owned.join(",")).unwrap();
            std::fs::rename(owners.with_extension("tmp"), &owners).unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        group.wait().await.unwrap();
    });
}

/// The entry point of this binary's members.
#[test]
fn child() {
    let Ok(spec) = std::env::var("WEIBO_KAFKA_CHILD") else { return };
    init_logs();
    let p: Vec<&str> = spec.split('|').collect();
    assert_eq!(p[0], "join", "a child of this binary runs a member of the join group: {spec}");
    member(p[1], p[2], p[3], Path::new(p[4]), p[5]);
}

#[test]
fn a_join_in_a_group_of_two_processes_killed_again_and_again_commits_every_row_once() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (orders, payments, output) = (unique("orders"), unique("payments"), unique("paid"));
    write_input(&orders, &payments);
    create_topic(&output, 3);
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("join|{orders}|{payments}|{output}|{}", dir.path().display());
    let start = |name: &str| kafka_child(&format!("{spec}|{name}")).stderr(Stdio::inherit()).spawn().unwrap();
    let mut members = [start("a"), start("b")];
    let task_checkpoint = |p: i32| newest_checkpoint(&dir.path().join(format!("group/partition-{p}/checkpoints")));
    wait_for("both members to own tasks and every task to checkpoint", Duration::from_secs(90), || {
        !owners(dir.path(), "a").is_empty()
            && !owners(dir.path(), "b").is_empty()
            && (0..4).all(|p| task_checkpoint(p) > 0)
    });
    // Four kills, a and b in turn, each at a pseudo-random moment; the
    // killed member starts again at once and rejoins the group.
    let want = expected();
    let mut delays = crash::kill_times(44, 300..1_500);
    let mut before_done = 0;
    for kill in 0..4 {
        std::thread::sleep(delays.next().unwrap());
        let who = kill % 2;
        let progress = committed_rows(&output).0.len();
        if progress < want.len() {
            before_done += 1;
        }
        members[who].kill().unwrap();
        members[who].wait().unwrap();
        eprintln!("kill {}: member {} at {progress} rows committed", kill + 1, ["a", "b"][who]);
        members[who] = start(["a", "b"][who]);
    }
    assert!(before_done >= 2, "the kills came after the output was complete ({before_done} before): pace the job");
    wait_for("every row in the output", Duration::from_secs(240), || {
        for m in &mut members {
            if let Some(status) = m.try_wait().unwrap() {
                assert!(status.success(), "a member failed: {status}");
            }
        }
        committed_rows(&output).0.len() >= want.len()
    });
    for m in &mut members {
        let _ = m.kill();
        let _ = m.wait();
    }
    let (got, twice) = committed_rows(&output);
    assert!(twice.is_empty(), "rows written twice: {:?} ({} in all)", &twice[..twice.len().min(5)], twice.len());
    let wrong: Vec<(&Joined, Option<&Joined>)> =
        want.values().filter(|w| got.get(&w.id) != Some(w)).map(|w| (w, got.get(&w.id))).take(5).collect();
    assert!(wrong.is_empty(), "rows differ from a crash-free run's (want, got): {wrong:?}");
    assert_eq!(got.len(), want.len());
}
