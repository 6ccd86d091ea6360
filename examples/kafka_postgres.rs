//! Kafka → PostgreSQL exactly once, the consumed offsets kept in Postgres:
//! orders from a topic, the paid ones appended to `paid_orders`.
//!
//! ```sh
//! cargo run --release -p weibo-examples --example kafka_postgres -- \
//!     127.0.0.1:9092 orders "host=127.0.0.1 user=postgres dbname=shop"
//! ```
//!
//! It runs until stopped (Ctrl-C). Kill it (`kill -9`) whenever you like
//! and start it again with the same arguments: it resumes from the
//! offsets committed with the rows, and `paid_orders` holds every paid
//! order once. The book's chapter "PostgreSQL" walks through it.

#[path = "shared/kafka_orders.rs"]
mod kafka_orders;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [brokers, topic, url] = args.as_slice() else {
        return Err("usage: kafka_postgres <brokers> <topic> <postgres url>".into());
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        client.batch_execute(kafka_orders::TABLE).await?;
        // ANCHOR: run
        let running = kafka_orders::job(brokers, topic, url)?.spawn()?;
        tokio::signal::ctrl_c().await?;
        // A clean stop: a last checkpoint commits what was read.
        running.stop().await?;
        // ANCHOR_END: run
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    Ok(())
}
