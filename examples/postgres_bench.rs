//! The Postgres sink against a hand-written binary `COPY` of the same rows
//! into the same server: rows per second of each, interleaved, medians.
//!
//! ```sh
//! scripts/bench-postgres.sh [rows] [repetitions]     # starts a throwaway server
//! cargo run --release -p weibo-examples --example postgres_bench -- <url> [rows] [repetitions]
//! ```
//!
//! Each repetition writes `rows` rows `(id int8, customer text, cents
//! int8)` into a fresh table, once by each contender:
//!
//! - `copy`: one tokio-postgres connection, `COPY … FROM STDIN (FORMAT
//!   binary)` with `BinaryCopyInWriter`, rows built in the loop (the
//!   baseline);
//! - `weibo at least once`: a generator into `PostgresSink` with `sink`;
//! - `weibo exactly once`: the same with `sink_exactly_once` and a
//!   checkpoint every second (the last epoch's commit, after the input
//!   ends, is included).

use std::time::{Duration, Instant};

use tokio_postgres::NoTls;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::Type;
use weibo::Job;
use weibo::sources::Generator;
use weibo_connectors::postgres::PostgresSink;

fn row(i: u64) -> (i64, String, i64) {
    (i as i64, format!("customer-{}", i % 1000), (i % 9973) as i64)
}

async fn client(url: &str) -> Result<tokio_postgres::Client, Box<dyn std::error::Error>> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

async fn fresh_table(url: &str, name: &str) -> Result<(), Box<dyn std::error::Error>> {
    client(url)
        .await?
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {name}; CREATE TABLE {name} (id int8 NOT NULL, customer text NOT NULL, cents int8 NOT NULL)"
        ))
        .await?;
    Ok(())
}

async fn copy(url: &str, table: &str, rows: u64) -> Result<(), Box<dyn std::error::Error>> {
    let c = client(url).await?;
    let sink = c.copy_in(&format!("COPY {table} (id, customer, cents) FROM STDIN (FORMAT binary)")).await?;
    let writer = BinaryCopyInWriter::new(sink, &[Type::INT8, Type::TEXT, Type::INT8]);
    futures_util::pin_mut!(writer);
    for i in 0..rows {
        let (id, customer, cents) = row(i);
        writer.as_mut().write(&[&id, &customer, &cents]).await?;
    }
    writer.finish().await?;
    Ok(())
}

fn weibo_job(url: &str, table: &str, rows: u64, exactly_once: Option<&std::path::Path>) -> weibo::Result<Job> {
    let mut job = Job::new("postgres-bench");
    if let Some(dir) = exactly_once {
        job = job.with_checkpoints(dir, Duration::from_secs(1));
    }
    let sink = PostgresSink::builder(url, table)
        .with_column("id", |r: &(i64, String, i64)| r.0)
        .with_column_ref("customer", |r: &(i64, String, i64)| &r.1)
        .with_column("cents", |r: &(i64, String, i64)| r.2)
        .build()?;
    let s = job.source(Generator::new(rows, row));
    if exactly_once.is_some() {
        s.sink_exactly_once(sink);
    } else {
        s.sink(sink);
    }
    Ok(job)
}

async fn count(url: &str, table: &str) -> Result<i64, Box<dyn std::error::Error>> {
    Ok(client(url).await?.query_one(&format!("SELECT count(*) FROM {table}"), &[]).await?.get(0))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = args.first().ok_or("usage: postgres_bench <url> [rows] [repetitions]")?.clone();
    let rows: u64 = args.get(1).map_or(Ok(1_000_000), |s| s.parse())?;
    let reps: usize = args.get(2).map_or(Ok(5), |s| s.parse())?;
    let rt = tokio::runtime::Runtime::new()?;
    let names = ["copy", "weibo at least once", "weibo exactly once"];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for rep in 0..reps {
        for (k, name) in names.iter().enumerate() {
            let table = format!("bench_{k}");
            rt.block_on(fresh_table(&url, &table))?;
            let dir = tempfile_dir(rep, k)?;
            let started = Instant::now();
            match k {
                0 => rt.block_on(copy(&url, &table, rows))?,
                1 => drop(rt.block_on(weibo_job(&url, &table, rows, None)?.run())?),
                _ => drop(rt.block_on(weibo_job(&url, &table, rows, Some(&dir))?.run())?),
            };
            let secs = started.elapsed().as_secs_f64();
            let n = rt.block_on(count(&url, &table))?;
            if u64::try_from(n)? != rows {
                return Err(format!("{name}: {n} rows in the table, expected {rows}").into());
            }
            let _ = std::fs::remove_dir_all(&dir);
            let rate = rows as f64 / secs;
            println!("rep {rep} {name:<22} {:>8.0} k rows/s ({secs:.2} s)", rate / 1e3);
            if let Some(r) = rates.get_mut(k) {
                r.push(rate);
            }
        }
    }
    let base = median(&mut rates.first().cloned().unwrap_or_default());
    println!("\n{rows} rows, medians of {reps}:");
    for (name, r) in names.iter().zip(rates.iter_mut()) {
        let (lo, hi) = (r.iter().copied().fold(f64::INFINITY, f64::min), r.iter().copied().fold(0.0, f64::max));
        let m = median(r);
        println!(
            "POSTGRES {name:<22} {:>8.0} k rows/s ({:.0}–{:.0}), {:.2}× copy",
            m / 1e3,
            lo / 1e3,
            hi / 1e3,
            m / base
        );
    }
    Ok(())
}

fn tempfile_dir(rep: usize, k: usize) -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("weibo-pg-bench-{}-{rep}-{k}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
