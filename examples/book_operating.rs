//! The book's "Operating a job" chapter: a job with its admin API on,
//! seen and steered over HTTP: its status, a savepoint by name, a stop.
//!
//! Run it with `cargo run -p weibo-examples --example book_operating`.

// ANCHOR: imports
use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weibo::AdminOptions;
use weibo::prelude::*;
use weibo_examples::{Order, Totals, order};
// ANCHOR_END: imports

/// One HTTP/1.1 request (what `curl` does); returns the status and body.
async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> Result<(u16, String), Box<dyn Error>> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").ok_or("no HTTP response")?;
    let status = head.split(' ').nth(1).ok_or("no status")?.parse()?;
    Ok((status, body.to_string()))
}

// ANCHOR: options
/// A job's admin API for other machines: on every address, over HTTPS,
/// with a token (from a secret), answering for the name clients use.
fn reachable(job: Job, token: String) -> Job {
    job.with_admin_options(
        AdminOptions::new("0.0.0.0:8443")
            .with_token(token)
            .with_allowed_host("orders.internal.example.com")
            .with_tls("/etc/weibo/admin.crt", "/etc/weibo/admin.key"),
    )
}
// ANCHOR_END: options

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let dir = std::env::temp_dir().join(format!("weibo-book-operating-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // ANCHOR: admin
    let job = Job::new("orders-per-customer")
        .with_checkpoints(dir.join("checkpoints"), Duration::from_secs(60))
        .with_admin("127.0.0.1:0"); // port 0: any free port; in production a fixed one, e.g. 8081
    job.source(Generator::new(u64::MAX, order).with_rate(5_000.0))
        .name("orders")
        .filter(|o: &Order| o.amount_cents > 0)
        .map(|o: Order| Totals { customer: o.customer, orders: 1, cents: o.amount_cents })
        .key_by(|t: &Totals| t.customer)
        .with_partitions(2)
        .reduce(|a, b| Totals { customer: a.customer, orders: a.orders + b.orders, cents: a.cents + b.cents })
        .uid("totals")
        .sink(CollectSink::new());
    let handle = job.spawn()?;
    let addr = handle.admin_addr().ok_or("the admin API is on")?;
    println!("admin API on http://{addr}");
    // ANCHOR_END: admin
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ANCHOR: requests
    for (method, path, body) in [
        ("GET", "/readyz", ""),
        ("GET", "/api/job", ""),
        ("POST", "/api/savepoints", r#"{"name": "before-upgrade"}"#),
        ("POST", "/api/savepoints", r#"{"name": "../elsewhere"}"#),
        ("GET", "/api/checkpoints", ""),
        ("GET", "/metrics", ""),
        ("POST", "/api/stop", ""),
    ] {
        let (status, answer) = http(addr, method, path, body).await?;
        // Of the scrape, the families of the operator `orders`.
        let answer: Vec<&str> = match path {
            "/metrics" => answer.lines().filter(|l| l.contains("operator=\"orders\"")).collect(),
            _ => vec![answer.trim_end()],
        };
        println!("{method} {path} {body}\n  -> {status} {}", answer.join("\n     "));
    }
    // ANCHOR_END: requests
    assert_eq!(handle.status(), weibo::JobState::Stopped);
    assert!(dir.join("checkpoints/savepoints/before-upgrade/MANIFEST").is_file());
    handle.cancel().await?;
    std::fs::remove_dir_all(&dir)?;
    // The options are read when a job starts: this one is not started
    // (its certificate is not on this machine).
    drop(reachable(Job::new("orders-reachable"), std::env::var("WEIBO_ADMIN_TOKEN").unwrap_or_default()));
    Ok(())
}
