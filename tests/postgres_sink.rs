//! The Postgres sink against a real PostgreSQL server: every column type
//! it supports round trips; a mapping that does not fit the table is
//! refused before any row is written; exactly once and at least once,
//! appending and upserting, in parallel; refused rows to a dead-letter
//! table or failing the job with the record's position; the database
//! stopped for a few seconds mid-run.

use std::time::{Duration, SystemTime};

use weibo::Job;
use weibo::sources::Generator;
use weibo_connectors::postgres::{PostgresSink, Rejected};
use weibo_tests::postgres_server::{self, block_on, client, execute, execute_at, rows, rows_at, server, unique};
use weibo_tests::totals;

#[derive(Clone, Debug, PartialEq)]
struct Everything {
    id: i64,
    flag: bool,
    small: i16,
    int: i32,
    real: f32,
    double: f64,
    text: String,
    short: String,
    blob: Vec<u8>,
    doc: serde_json::Value,
    at: SystemTime,
    list: Vec<i64>,
    maybe: Option<String>,
}

fn everything(i: u64) -> Everything {
    let n = i as i64;
    Everything {
        id: n,
        flag: i.is_multiple_of(2),
        small: (n % 300 - 150) as i16,
        int: if i == 3 { i32::MIN } else { (n * 7919) as i32 },
        real: n as f32 / 4.0,
        double: if i == 5 { f64::INFINITY } else { -(n as f64) * 1.5e100 },
        text: match i % 4 {
            0 => String::new(),
            1 => "naïve — 北京 🦀".into(),
            2 => "quote \" and ' and \\".into(),
            _ => format!("line\nbreak {i}"),
        },
        short: format!("s{i}"),
        blob: (0..(i % 7) as u8).map(|b| b.wrapping_mul(37)).collect(),
        doc: serde_json::json!({ "i": i, "tags": ["a", i.to_string()], "nested": { "ok": i.is_multiple_of(3) } }),
        // Microseconds: what a timestamptz keeps.
        at: SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_000_000 + i * 1_234_567),
        list: (0..(i % 4) as i64).map(|k| k * n).collect(),
        maybe: (!i.is_multiple_of(3)).then(|| format!("m{i}")),
    }
}

fn everything_table(name: &str) {
    execute(&format!(
        "CREATE TABLE {name} (id int8 PRIMARY KEY, flag bool NOT NULL, small int2, \"int\" int4, real float4, \
         double float8, text text, short varchar(20), blob bytea, doc jsonb, at timestamptz, list int8[], maybe text)"
    ));
}

fn everything_sink(table: &str) -> PostgresSink<Everything> {
    PostgresSink::builder(server().url.clone(), table)
        .with_column("id", |e: &Everything| e.id)
        .with_column("flag", |e: &Everything| e.flag)
        .with_column("small", |e: &Everything| e.small)
        .with_column("int", |e: &Everything| e.int)
        .with_column("real", |e: &Everything| e.real)
        .with_column("double", |e: &Everything| e.double)
        .with_column_ref("text", |e: &Everything| &e.text)
        .with_column_ref("short", |e: &Everything| &e.short)
        .with_column_ref("blob", |e: &Everything| &e.blob)
        .with_column_ref("doc", |e: &Everything| &e.doc)
        .with_column("at", |e: &Everything| e.at)
        .with_column_ref("list", |e: &Everything| &e.list)
        .with_column_ref("maybe", |e: &Everything| &e.maybe)
        .with_chunk_rows(37)
        .build()
        .unwrap()
}

fn read_everything(table: &str) -> Vec<Everything> {
    let q = format!(
        "SELECT id, flag, small, \"int\", real, double, text, short, blob, doc, at, list, maybe FROM {table} ORDER BY id"
    );
    block_on(async move {
        let c = client().await;
        c.query(&q, &[])
            .await
            .unwrap()
            .iter()
            .map(|r| Everything {
                id: r.get(0),
                flag: r.get(1),
                small: r.get(2),
                int: r.get(3),
                real: r.get(4),
                double: r.get(5),
                text: r.get(6),
                short: r.get(7),
                blob: r.get(8),
                doc: r.get(9),
                at: r.get(10),
                list: r.get(11),
                maybe: r.get(12),
            })
            .collect()
    })
}

#[test]
fn every_supported_column_type_round_trips_exactly_once_and_at_least_once() {
    let expected: Vec<Everything> = (0..500).map(everything).collect();
    for exactly_once in [true, false] {
        let table = unique("everything");
        everything_table(&table);
        let dir = tempfile::tempdir().unwrap();
        let mut job = Job::new("types");
        if exactly_once {
            job = job.with_checkpoints(dir.path(), Duration::from_millis(20));
        }
        let stream = job.source(Generator::new(500, everything).with_partitions(2));
        if exactly_once {
            stream.sink_exactly_once(everything_sink(&table));
        } else {
            stream.sink(everything_sink(&table));
        }
        weibo::testing::block_on(job.run()).unwrap();
        assert_eq!(read_everything(&table), expected, "exactly once: {exactly_once}");
    }
}

fn try_run(table: &str, sink: PostgresSink<(i64, String)>) -> String {
    let job = Job::new("mismatch");
    job.source(Generator::new(10, |i| (i as i64, format!("v{i}")))).sink(sink);
    let err = weibo::testing::block_on(job.run()).expect_err("the job must fail");
    let rows = rows(&format!("SELECT count(*) FROM {table}"));
    assert_eq!(rows, vec![vec![Some("0".to_string())]], "nothing written into {table} before the error");
    err.report().to_string()
}

#[test]
fn a_mapping_that_does_not_fit_the_table_is_refused_before_any_row_is_written() {
    let url = server().url.clone();
    let table = unique("mismatch");
    execute(&format!(
        "CREATE TABLE {table} (id int4 PRIMARY KEY, name text, needed text NOT NULL, fine text NOT NULL DEFAULT 'x')"
    ));
    let base = || {
        PostgresSink::<(i64, String)>::builder(url.clone(), &table).with_column_ref("needed", |r: &(i64, String)| &r.1)
    };

    let id = |r: &(i64, String)| r.0 as i32;
    let missing =
        try_run(&table, base().with_column("id", id).with_column("amount", |r: &(i64, String)| r.0).build().unwrap());
    assert!(missing.contains(&format!("table `{table}` has no column `amount` (mapped from `i64`)")), "{missing}");
    assert!(missing.contains("id integer, name text, needed text, fine text"), "{missing}");

    let wrong = try_run(&table, base().with_column("id", |r: &(i64, String)| r.0).build().unwrap());
    assert!(
        wrong.contains(&format!("column `{table}.id` is `integer` in Postgres, and the mapping gives `i64`")),
        "{wrong}"
    );

    let unmapped = try_run(
        &table,
        PostgresSink::<(i64, String)>::builder(url.clone(), &table)
            .with_column("id", |r: &(i64, String)| r.0 as i32)
            .build()
            .unwrap(),
    );
    assert!(unmapped.contains(&format!("column `{table}.needed` (text) is NOT NULL without a default")), "{unmapped}");

    let no_index = try_run(&table, base().with_column("id", id).with_upsert_keys(["needed"]).build().unwrap());
    assert!(no_index.contains("an upsert on (\"needed\") needs a unique index"), "{no_index}");

    let nullable = try_run(
        &table,
        base()
            .with_column("id", id)
            .with_column_ref("name", |r: &(i64, String)| &r.1)
            .with_upsert_keys(["name"])
            .build()
            .unwrap(),
    );
    assert!(nullable.contains(&format!("upsert key column `{table}.name` may be NULL")), "{nullable}");

    let absent = unique("absent");
    let job = Job::new("absent");
    job.source(Generator::new(10, |i| i as i64))
        .sink(PostgresSink::builder(url.clone(), &absent).with_column("id", |r: &i64| *r).build().unwrap());
    let err = weibo::testing::block_on(job.run()).expect_err("no such table").report().to_string();
    assert!(err.contains(&format!("table `{absent}` does not exist in database `postgres`")), "{err}");

    // Mistakes the builder itself catches.
    let e = PostgresSink::<i64>::builder(url.clone(), &table).build().unwrap_err().report().to_string();
    assert!(e.contains("no columns"), "{e}");
    let e = PostgresSink::<i64>::builder(url.clone(), &table)
        .with_column("id", |r: &i64| *r)
        .with_upsert_keys(["key"])
        .build()
        .unwrap_err()
        .report()
        .to_string();
    assert!(e.contains("upsert key `key` is not a mapped column"), "{e}");
    let e =
        PostgresSink::<i64>::builder("port=notanumber", &table).with_column("id", |r: &i64| *r).build().unwrap_err();
    assert!(e.to_string().contains("cannot read the connection string"), "{e}");
}

/// Event `i`: account `i % 97`, amount `i % 13`.
fn payment(i: u64) -> (i64, i64, i64) {
    (i as i64, (i % 97) as i64, (i % 13) as i64)
}

fn totals(n: u64) -> std::collections::BTreeMap<i64, i64> {
    let mut t = std::collections::BTreeMap::new();
    for i in 0..n {
        let (_, account, amount) = payment(i);
        *t.entry(account).or_insert(0) += amount;
    }
    t
}

fn table_totals(url: &str, table: &str) -> std::collections::BTreeMap<i64, i64> {
    rows_at(url, &format!("SELECT account, total FROM {table}"))
        .into_iter()
        .map(|r| (r[0].as_ref().unwrap().parse().unwrap(), r[1].as_ref().unwrap().parse().unwrap()))
        .collect()
}

struct Payments<'a> {
    url: &'a str,
    n: u64,
    rate: Option<f64>,
    append: &'a str,
    upsert: &'a str,
    checkpoints: Option<&'a std::path::Path>,
    exactly_once: bool,
}

fn payments_job(name: &str, p: &Payments<'_>) -> Job {
    let Payments { url, n, rate, append, upsert, checkpoints, exactly_once } = *p;
    let url = url.to_string();
    let mut job = Job::new(name);
    if let Some(dir) = checkpoints {
        job = job.with_checkpoints(dir, Duration::from_millis(40));
    }
    let mut source = Generator::new(n, payment).with_partitions(2);
    if let Some(r) = rate {
        source = source.with_rate(r);
    }
    let payments = job.source(source);
    let log = PostgresSink::builder(url.clone(), append)
        .with_column("id", |p: &(i64, i64, i64)| p.0)
        .with_column("account", |p: &(i64, i64, i64)| p.1)
        .with_column("amount", |p: &(i64, i64, i64)| p.2)
        .with_chunk_rows(500)
        .with_retry_for(Duration::from_secs(60))
        .build()
        .unwrap();
    let running = payments
        .key_by(|p: &(i64, i64, i64)| p.1)
        .with_partitions(2)
        .reduce(|a, b| (b.0, a.1, a.2 + b.2))
        .name("totals");
    let totals = PostgresSink::builder(url, upsert)
        .with_column("account", |p: &(i64, i64, i64)| p.1)
        .with_column("total", |p: &(i64, i64, i64)| p.2)
        .with_upsert_keys(["account"])
        .with_chunk_rows(300)
        .with_retry_for(Duration::from_secs(60))
        .build()
        .unwrap();
    if exactly_once {
        payments.sink_exactly_once(log);
        running.sink_exactly_once(totals);
    } else {
        payments.sink(log);
        running.sink(totals);
    }
    job
}

fn payment_tables(url: &str) -> (String, String) {
    let (append, upsert) = (unique("payments"), unique("totals"));
    execute_at(
        url,
        &format!(
            "CREATE TABLE {append} (id int8 NOT NULL, account int8 NOT NULL, amount int8 NOT NULL); \
         CREATE TABLE {upsert} (account int8 PRIMARY KEY, total int8 NOT NULL)"
        ),
    );
    (append, upsert)
}

fn assert_each_payment_once(url: &str, table: &str, n: u64) {
    let r = rows_at(url, &format!("SELECT count(*), count(DISTINCT id), coalesce(sum(amount), 0) FROM {table}"));
    let expected_sum: u64 = (0..n).map(|i| i % 13).sum();
    assert_eq!(r, vec![vec![Some(n.to_string()), Some(n.to_string()), Some(expected_sum.to_string())]], "{table}");
}

#[test]
fn exactly_once_in_parallel_appends_each_record_once_and_upserts_the_last_value() {
    let n = 30_000;
    let url = &server().url;
    let (append, upsert) = payment_tables(url);
    let dir = tempfile::tempdir().unwrap();
    let p = Payments {
        url,
        n,
        rate: None,
        append: &append,
        upsert: &upsert,
        checkpoints: Some(dir.path()),
        exactly_once: true,
    };
    weibo::testing::block_on(payments_job("eos", &p).run()).unwrap();
    assert_each_payment_once(url, &append, n);
    assert_eq!(table_totals(url, &upsert), totals(n));
    // Every epoch committed: nothing of these sinks left in the spool, and
    // progress recorded for each of their instances.
    let progress = rows(&format!(
        "SELECT count(DISTINCT (sink, instance)), count(DISTINCT run) FROM weibo_sink_progress WHERE sink IN ('{append}', '{upsert}')"
    ));
    assert_eq!(progress, vec![vec![Some("4".into()), Some("4".into())]], "two sinks of two instances, one run each");
    let spooled = rows(&format!("SELECT count(*) FROM weibo_sink_spool WHERE sink IN ('{append}', '{upsert}')"));
    assert_eq!(spooled, vec![vec![Some("0".into())]], "spooled chunks left");
}

#[test]
fn at_least_once_without_crashes_writes_each_record_once_too() {
    let n = 20_000;
    let url = &server().url;
    let (append, upsert) = payment_tables(url);
    let p = Payments { url, n, rate: None, append: &append, upsert: &upsert, checkpoints: None, exactly_once: false };
    weibo::testing::block_on(payments_job("alo", &p).run()).unwrap();
    assert_each_payment_once(url, &append, n);
    assert_eq!(table_totals(url, &upsert), totals(n));
}

#[test]
fn the_database_stopped_for_seconds_mid_run_loses_and_duplicates_nothing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    // A server of its own: the other tests keep theirs running.
    let own = postgres_server::start();
    let url = own.url.as_str();
    let n = 6_000;
    for exactly_once in [true, false] {
        let (append, upsert) = payment_tables(url);
        let dir = tempfile::tempdir().unwrap();
        let p = Payments {
            url,
            n,
            rate: Some(1_500.0),
            append: &append,
            upsert: &upsert,
            checkpoints: Some(dir.path()),
            exactly_once,
        };
        let job = payments_job("restart", &p);
        let handle = std::thread::spawn(move || weibo::testing::block_on(job.run()));
        // Wait until rows arrive, then take the database away for 3 s.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while rows_at(url, &format!("SELECT count(*) FROM {append}"))[0][0].as_deref() == Some("0") {
            assert!(std::time::Instant::now() < deadline, "no rows arrived in 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        own.stop_server();
        std::thread::sleep(Duration::from_secs(3));
        own.start_server();
        handle.join().unwrap().unwrap();
        assert_eq!(table_totals(url, &upsert), totals(n), "exactly once: {exactly_once}");
        if exactly_once {
            assert_each_payment_once(url, &append, n);
        } else {
            // At least once: every payment, some perhaps twice (a chunk
            // whose commit's answer the restart cut off is written again).
            let r = rows_at(url, &format!("SELECT count(DISTINCT id), count(*) >= {n} FROM {append}"));
            assert_eq!(r, vec![vec![Some(n.to_string()), Some("t".into())]]);
        }
    }
}

#[derive(Clone, Debug)]
struct Order {
    id: i64,
    amount: i64,
    note: String,
}

fn order(i: u64) -> Order {
    Order {
        id: i as i64,
        // Every 50th order is negative: the table's check refuses it.
        amount: if i % 50 == 7 { -1 } else { i as i64 },
        // Order 123's note holds a NUL byte, which no text column takes.
        note: if i == 123 { "bad\0note".into() } else { format!("n{i}") },
    }
}

fn orders_sink(table: &str, policy: Rejected) -> PostgresSink<Order> {
    PostgresSink::builder(server().url.clone(), table)
        .with_column("id", |o: &Order| o.id)
        .with_column("amount", |o: &Order| o.amount)
        .with_column_ref("note", |o: &Order| &o.note)
        .with_rejected(policy)
        .with_chunk_rows(64)
        .build()
        .unwrap()
}

#[test]
fn refused_rows_go_to_the_dead_letter_table_once_with_their_position_and_error() {
    let n = 1_000u64;
    for exactly_once in [true, false] {
        let (table, dead) = (unique("orders"), unique("orders_dead"));
        execute(&format!("CREATE TABLE {table} (id int8 PRIMARY KEY, amount int8 CHECK (amount >= 0), note text)"));
        let dir = tempfile::tempdir().unwrap();
        let mut job = Job::new("orders");
        if exactly_once {
            job = job.with_checkpoints(dir.path(), Duration::from_millis(30));
        }
        let sink = orders_sink(&table, Rejected::DeadLetterTable(dead.clone()));
        let counter = sink.clone();
        let s = job.source(Generator::new(n, order)).name("orders");
        if exactly_once {
            s.sink_exactly_once(sink);
        } else {
            s.sink(sink);
        }
        weibo::testing::block_on(job.run()).unwrap();
        let bad: Vec<u64> = (0..n).filter(|i| i % 50 == 7 || *i == 123).collect();
        let good = n - bad.len() as u64;
        assert_eq!(rows(&format!("SELECT count(*) FROM {table}")), vec![vec![Some(good.to_string())]]);
        let letters =
            rows(&format!("SELECT source, partition, \"offset\", row, error FROM {dead} ORDER BY \"offset\""));
        let offsets: Vec<u64> = letters.iter().map(|r| r[2].as_ref().unwrap().parse().unwrap()).collect();
        assert_eq!(offsets, bad, "each refused row once (exactly once: {exactly_once})");
        assert_eq!(counter.dead_lettered(), bad.len() as u64);
        for r in &letters {
            assert_eq!(r[0].as_deref(), Some("orders"));
            assert_eq!(r[1].as_deref(), Some("0"));
        }
        let check = letters.iter().find(|r| r[2].as_deref() == Some("7")).unwrap();
        assert!(check[3].as_deref().unwrap().contains("\"amount\": -1"), "{check:?}");
        assert!(check[4].as_deref().unwrap().contains("violates check constraint"), "{check:?}");
        let nul = letters.iter().find(|r| r[2].as_deref() == Some("123")).unwrap();
        assert!(nul[3].as_deref().unwrap().contains("bad\\0note"), "{nul:?}");
        assert!(nul[4].as_deref().unwrap().contains("0x00"), "{nul:?}");
    }
}

#[test]
fn a_refused_row_under_the_fail_policy_fails_the_job_naming_its_position() {
    for exactly_once in [true, false] {
        let table = unique("strict");
        execute(&format!("CREATE TABLE {table} (id int8 PRIMARY KEY, amount int8 CHECK (amount >= 0), note text)"));
        let dir = tempfile::tempdir().unwrap();
        let mut job = Job::new("strict");
        if exactly_once {
            job = job.with_checkpoints(dir.path(), Duration::from_millis(30));
        }
        let s = job.source(Generator::new(100, order)).name("orders");
        if exactly_once {
            s.sink_exactly_once(orders_sink(&table, Rejected::Fail));
        } else {
            s.sink(orders_sink(&table, Rejected::Fail));
        }
        let err = weibo::testing::block_on(job.run()).expect_err("a refused row fails the job").report().to_string();
        assert!(err.contains("from source `orders` partition 0 offset 7"), "{err}");
        assert!(err.contains("violates check constraint"), "{err}");
        assert!(err.contains(&format!("for table `{table}`")), "{err}");
    }
}

#[test]
fn the_sink_says_where_a_database_that_never_answers_is() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let job = Job::new("nowhere");
    job.source(Generator::new(10, |i| i as i64)).sink(
        PostgresSink::builder(format!("host=127.0.0.1 port={port} user=postgres connect_timeout=1"), "t")
            .with_column("id", |r: &i64| *r)
            .with_retry_for(Duration::from_millis(300))
            .build()
            .unwrap(),
    );
    let err = weibo::testing::block_on(job.run()).expect_err("nothing listens there").report().to_string();
    assert!(err.contains("check the table: still failing after"), "{err}");
    assert!(err.contains("connect to the database"), "{err}");
}

#[test]
fn the_books_example_writes_every_order_once_and_each_customers_total() {
    let n = 20_000u64;
    execute(totals::TABLES);
    let dir = tempfile::tempdir().unwrap();
    let job = totals::job(&server().url, dir.path(), n).unwrap();
    weibo::testing::block_on(job.run()).unwrap();
    let refused: Vec<u64> = (0..n).filter(|i| totals::order(*i).1 == 0).collect();
    assert_eq!(refused.len(), 20);
    let count = rows("SELECT count(*), count(DISTINCT id) FROM orders");
    let kept = (n - refused.len() as u64).to_string();
    assert_eq!(count, vec![vec![Some(kept.clone()), Some(kept)]]);
    let dead = rows("SELECT \"offset\", error FROM orders_rejected ORDER BY \"offset\"");
    assert_eq!(dead.iter().map(|r| r[0].clone().unwrap().parse::<u64>().unwrap()).collect::<Vec<_>>(), refused);
    assert!(dead[0][1].as_deref().unwrap().contains("orders_cents_check"), "{:?}", dead[0]);
    let mut want = std::collections::BTreeMap::new();
    for (customer, cents) in (0..n).map(totals::order).filter(|(_, cents)| *cents > 0) {
        let e = want.entry(customer).or_insert((0i64, 0i64));
        e.0 += cents;
        e.1 += 1;
    }
    let got: std::collections::BTreeMap<String, (i64, i64)> = rows("SELECT customer, cents, orders FROM totals")
        .into_iter()
        .map(|r| {
            (r[0].clone().unwrap(), (r[1].clone().unwrap().parse().unwrap(), r[2].clone().unwrap().parse().unwrap()))
        })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn a_commit_refused_for_good_fails_a_running_job_and_no_later_epoch_commits_before_it() {
    let table = unique("streaming");
    execute(&format!("CREATE TABLE {table} (id int8 PRIMARY KEY, amount int8 CHECK (amount >= 0), note text)"));
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("streaming").with_checkpoints(dir.path(), Duration::from_millis(50));
    // 20 s of input at 2,000 a second; order 507 (a quarter second in) is
    // refused by the table's check.
    job.source(
        Generator::new(40_000, |i| Order { id: i as i64, amount: if i == 507 { -1 } else { 1 }, note: String::new() })
            .with_rate(2_000.0),
    )
    .name("orders")
    .sink_exactly_once(orders_sink(&table, Rejected::Fail));
    let started = std::time::Instant::now();
    let err = weibo::testing::block_on(job.run()).expect_err("the refused row fails the job").report().to_string();
    assert!(started.elapsed() < Duration::from_secs(10), "the job failed only after {:?}", started.elapsed());
    assert!(err.contains("offset 507") && err.contains("violates check constraint"), "{err}");
    // Epochs commit in order: nothing after the refused one's epoch.
    let max = rows(&format!("SELECT coalesce(max(id), -1) FROM {table}"));
    let max: i64 = max[0][0].as_ref().unwrap().parse().unwrap();
    assert!(max < 507, "rows after the refused one committed: up to {max}");
}

#[test]
fn sslmode_require_connects_over_tls_and_verifies_the_server() {
    let tls = postgres_server::start_tls();
    let ca = tls.ca.clone().unwrap();
    // The test's own queries go through the server's Unix socket, which
    // its pg_hba.conf lets in without TLS.
    let local = tls.socket_url();
    let table = unique("tls");
    let require = format!("{} sslmode=require", tls.url);
    execute_at(&local, &format!("CREATE TABLE {table} (id int8 NOT NULL, name text NOT NULL)"));
    let sink = |url: &str| {
        PostgresSink::<(i64, String)>::builder(url, &table)
            .with_column("id", |r: &(i64, String)| r.0)
            .with_column_ref("name", |r: &(i64, String)| &r.1)
            .with_retry_for(Duration::from_secs(2))
    };
    let count = || rows_at(&local, &format!("SELECT count(*), count(DISTINCT id) FROM {table}"));
    // Trusting the server's root: the job writes over TLS, exactly once.
    let job =
        Job::new("tls").with_checkpoint_storage(weibo::checkpoint::MemoryStorage::new(), Duration::from_millis(50));
    job.source(Generator::new(500, |i| (i as i64, format!("n{i}"))))
        .sink_exactly_once(sink(&require).with_tls_root_certificates(&ca).build().unwrap());
    block_on(job.run()).unwrap();
    assert_eq!(count(), vec![vec![Some("500".to_string()), Some("500".to_string())]]);
    let fails = |sink: PostgresSink<(i64, String)>| {
        let job = Job::new("tls-refused");
        job.source(Generator::new(10, |i| (i as i64, format!("v{i}")))).sink(sink);
        block_on(job.run()).expect_err("the job must fail").report().to_string()
    };
    // The system's roots do not know the server's: refused, naming TLS.
    let err = fails(sink(&require).build().unwrap());
    assert!(err.contains("TLS") && err.contains("certificate"), "{err}");
    // Without TLS, the server (hostssl only) refuses the connection.
    let err = fails(sink(&tls.url).build().unwrap());
    assert!(err.contains("no encryption"), "{err}");
    assert_eq!(count()[0][0].as_deref(), Some("500"), "nothing more written");
    // A root certificate without sslmode=require is a mistake, and so is a
    // file that holds none.
    let err = sink(&tls.url).with_tls_root_certificates(&ca).build().err().unwrap().report().to_string();
    assert!(err.contains("sslmode=require"), "{err}");
    let empty = tempfile::NamedTempFile::new().unwrap();
    let err = sink(&require).with_tls_root_certificates(empty.path()).build().err().unwrap().report().to_string();
    assert!(err.contains("no certificate"), "{err}");
}
