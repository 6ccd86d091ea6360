//! Exactly-once into PostgreSQL: every order appended, each customer's
//! running total upserted, both exactly once across crashes.
//!
//! ```sh
//! cargo run --release -p weibo-examples --example postgres_totals -- \
//!     "host=127.0.0.1 user=postgres dbname=shop" <state dir> [orders]
//! ```
//!
//! Kill it (`kill -9`) whenever you like and start it again with the same
//! arguments: it restores its newest checkpoint and goes on; `orders` and
//! `totals` end up as if it had never crashed. The book's chapter
//! "PostgreSQL" walks through it.

#[path = "shared/totals.rs"]
mod totals;

// ANCHOR: imports
use std::path::Path;
// ANCHOR_END: imports

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, dir, orders) = match args.as_slice() {
        [url, dir] => (url, dir, 1_000_000),
        [url, dir, n] => (url, dir, n.parse()?),
        _ => return Err("usage: postgres_totals <postgres url> <state dir> [orders]".into()),
    };
    // ANCHOR: run
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        client.batch_execute(totals::TABLES).await?;
        totals::job(url, &Path::new(dir).join("checkpoints"), orders)?.run().await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    // ANCHOR_END: run
    Ok(())
}
