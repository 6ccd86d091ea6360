//! Getting rows into Postgres: retries, `COPY` with a row-by-row fallback
//! for a chunk Postgres refuses, the merge into the target, and the
//! at-least-once writer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::SinkExt as _;
use tokio_postgres::Transaction;
use weibo::sinks::{SinkBatch, SinkWriter};
use weibo::{Error, Result};

use super::copy::{Origin, RowBuffer, single_row};
use super::{Checked, Inner, Pending, Rejected, quote};

/// Why one attempt failed.
pub(crate) enum Attempt {
    /// For a passing reason (connection, restart, serialization): try again.
    Retry(String),
    /// For good.
    Fail(Error),
}

/// What kind of failure a Postgres error is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Connection lost or refused, the server shutting down or starting,
    /// a serialization failure or deadlock, too many connections.
    Passing,
    /// The data: a constraint or a value the column refuses (SQLSTATE
    /// classes 22 and 23).
    Data,
    /// Anything else (a missing table, permissions, SQL).
    Other,
}

pub(crate) fn kind(e: &tokio_postgres::Error) -> Kind {
    let Some(code) = e.code() else {
        // No SQLSTATE: the connection (I/O, closed, refused).
        return Kind::Passing;
    };
    let code = code.code();
    match code.get(..2) {
        _ if code == "57014" => Kind::Other,
        Some("08" | "40" | "53" | "57") => Kind::Passing,
        _ if code == "55P03" => Kind::Passing,
        Some("22" | "23") => Kind::Data,
        _ => Kind::Other,
    }
}

/// Postgres's message, with its detail and SQLSTATE.
pub(crate) fn message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => {
            let detail = d.detail().map(|s| format!(" ({s})")).unwrap_or_default();
            format!("{}{detail} [SQLSTATE {}]", d.message(), d.code().code())
        }
        None => {
            let cause = std::error::Error::source(e).map(|c| format!(": {c}")).unwrap_or_default();
            format!("{e}{cause}")
        }
    }
}

impl<T> Inner<T> {
    /// An attempt that failed on `e` while doing `what`.
    pub(crate) fn attempt(&self, what: &str, e: tokio_postgres::Error) -> Attempt {
        match kind(&e) {
            Kind::Passing => Attempt::Retry(format!("{what}: {}", message(&e))),
            Kind::Data | Kind::Other => {
                let m = message(&e);
                Attempt::Fail(self.err_caused(format!("cannot {what} (table `{}`): {m}", self.table), e))
            }
        }
    }

    /// A connection from the pool.
    pub(crate) async fn connect(&self) -> std::result::Result<deadpool_postgres::Object, Attempt> {
        self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e) => self.attempt("connect to the database", e),
            other => Attempt::Retry(format!("connect to the database: {other}")),
        })
    }

    /// The values of `row` as text, for a refused row.
    pub(crate) fn render(&self, row: &T) -> String {
        let fields: Vec<String> = self.columns.iter().map(|c| format!("{}: {}", c.name, (c.render)(row))).collect();
        format!("{{{}}}", fields.join(", "))
    }

    /// The error for a row refused under [`Rejected::Fail`].
    pub(crate) fn refused(&self, origin: Origin, row: &str, why: &str) -> Error {
        self.err(format!(
            "Postgres refused the row of the record from {} for table `{}`: {why}; the row: {row}",
            self.describe(origin),
            self.table
        ))
    }
}

/// Between half and one and a half times `d`.
fn jitter(d: Duration) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |t| t.subsec_nanos());
    let mut x = u64::from(nanos) ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    d.mul_f64(0.5 + (x % 1000) as f64 / 1000.0)
}

/// Runs `$body` (an async block's contents returning `Result<R,
/// Attempt>`) until it succeeds, fails for good, or has been failing for
/// longer than the sink's `retry_for`, with exponential backoff (50 ms to
/// 5 s) and jitter between attempts; `$attempt` is the attempt's number
/// (from 0). Evaluates to `weibo::Result<R>`.
macro_rules! retrying {
    ($inner:expr, $what:expr, |$attempt:ident| $body:block) => {{
        let mut backoff = $crate::postgres::write::Backoff::new($inner, $what);
        loop {
            let $attempt = backoff.attempts();
            let r = async { $body }.await;
            if let Some(done) = backoff.after(r).await {
                break done;
            }
        }
    }};
}
pub(crate) use retrying;

/// The state of [`retrying!`].
pub(crate) struct Backoff<'a, T> {
    inner: &'a Inner<T>,
    what: &'a str,
    started: Instant,
    delay: Duration,
    attempts: u32,
}

impl<'a, T> Backoff<'a, T> {
    pub(crate) fn new(inner: &'a Inner<T>, what: &'a str) -> Self {
        Self { inner, what, started: Instant::now(), delay: Duration::from_millis(50), attempts: 0 }
    }

    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The outcome of an attempt: `Some` when done, `None` (after the
    /// backoff's sleep) to try again.
    pub(crate) async fn after<R>(&mut self, r: std::result::Result<R, Attempt>) -> Option<Result<R>> {
        let (inner, what) = (self.inner, self.what);
        match r {
            Ok(r) => {
                if self.attempts > 0 {
                    tracing::info!(sink = %inner.name, attempts = self.attempts + 1, "{what}: succeeded after retrying");
                }
                Some(Ok(r))
            }
            Err(Attempt::Fail(e)) => Some(Err(e)),
            Err(Attempt::Retry(why)) => {
                if self.started.elapsed() >= inner.retry_for {
                    return Some(Err(inner.err(format!(
                        "{what}: still failing after {:.0?} ({} attempts): {why}",
                        self.started.elapsed(),
                        self.attempts + 1
                    ))));
                }
                tracing::warn!(sink = %inner.name, attempt = self.attempts + 1, error = %why, "{what}: retrying in {:?}", self.delay);
                tokio::time::sleep(jitter(self.delay)).await;
                self.delay = (self.delay * 2).min(Duration::from_secs(5));
                self.attempts += 1;
                None
            }
        }
    }
}

/// One chunk of rows: the `COPY` body, where each row ends, and the
/// records and origins behind them (to name and show a refused one).
pub(crate) struct Chunk<T> {
    pub(crate) number: u32,
    pub(crate) body: Bytes,
    pub(crate) ends: Vec<usize>,
    /// Behind a lock only so that the chunk can be shared while a future
    /// writes it (`T` need not be `Sync`).
    pub(crate) rows: std::sync::Mutex<Vec<T>>,
    pub(crate) origins: Vec<Origin>,
}

impl<T> Chunk<T> {
    /// Row `i`'s values as text.
    pub(crate) fn render(&self, inner: &Inner<T>, i: usize) -> String {
        let rows = self.rows.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        rows.get(i).map_or_else(String::new, |r| inner.render(r))
    }
}

/// Rows being collected into chunks, with their records and origins.
pub(crate) struct Collector<T> {
    pub(crate) buf: RowBuffer,
    pub(crate) rows: Vec<T>,
    pub(crate) origins: Vec<Origin>,
    /// The next chunk's number (from 0 in each epoch).
    pub(crate) chunk: u32,
}

impl<T> Collector<T> {
    pub(crate) fn new() -> Self {
        Self { buf: RowBuffer::new(), rows: Vec::new(), origins: Vec::new(), chunk: 0 }
    }

    /// Encodes `batch`'s records. A record the sink cannot encode for its
    /// column fails the job under [`Rejected::Fail`] and is kept as a
    /// refused row (its text and the error) for the dead-letter table
    /// otherwise.
    pub(crate) fn add(&mut self, inner: &Inner<T>, checked: &Checked, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        inner.remember_sources(batch.source_names());
        let start = self.origins.len();
        self.origins.extend(batch.meta().iter().map(|m| Origin {
            source: m.source,
            partition: m.partition,
            offset: m.offset,
        }));
        for (i, v) in batch.drain().enumerate() {
            let origin = self.origins.get(start + i).copied().unwrap_or(Origin { source: 0, partition: 0, offset: 0 });
            let seq = (i64::from(self.chunk) << 32) | i64::try_from(self.rows.len()).unwrap_or(i64::MAX);
            if let Err(why) = self.buf.push(&inner.columns, &checked.types, &v, seq, origin) {
                let row = inner.render(&v);
                if inner.rejected == Rejected::Fail {
                    self.origins.truncate(start);
                    return Err(inner.refused(origin, &row, &why));
                }
                self.buf.push_refused(inner.columns.len(), seq, origin, &why, &row);
            }
            self.rows.push(v);
        }
        Ok(())
    }

    pub(crate) fn full(&self, inner: &Inner<T>) -> bool {
        self.buf.rows() >= inner.chunk_rows || self.buf.bytes() >= 8 << 20
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buf.rows() == 0
    }

    /// The rows so far as a chunk, leaving the collector empty.
    pub(crate) fn take(&mut self) -> Chunk<T> {
        let (body, ends) = self.buf.take();
        let number = self.chunk;
        self.chunk += 1;
        Chunk {
            number,
            body,
            ends,
            rows: std::sync::Mutex::new(std::mem::take(&mut self.rows)),
            origins: std::mem::take(&mut self.origins),
        }
    }
}

/// `COPY`s `body` into `table`.
pub(crate) async fn copy_in(
    tx: &Transaction<'_>,
    table: &str,
    body: Bytes,
) -> std::result::Result<u64, tokio_postgres::Error> {
    let sink = tx.copy_in::<_, Bytes>(&format!("COPY {table} FROM STDIN (FORMAT binary)")).await?;
    futures_util::pin_mut!(sink);
    sink.send(body).await?;
    sink.finish().await
}

/// Copies `chunk` into `stage` within `tx`. When Postgres refuses the
/// chunk for its data, copies it row by row instead, each under a
/// savepoint: a refused row fails (under [`Rejected::Fail`]) or goes into
/// the stage as a refused row, for the dead-letter table.
pub(crate) async fn copy_rows<T>(
    inner: &Inner<T>,
    tx: &Transaction<'_>,
    stage: &str,
    chunk: &Chunk<T>,
) -> std::result::Result<(), Attempt> {
    let sql = |e| inner.attempt("copy rows", e);
    tx.batch_execute("SAVEPOINT weibo_copy").await.map_err(sql)?;
    match copy_in(tx, stage, chunk.body.clone()).await {
        Ok(_) => return tx.batch_execute("RELEASE SAVEPOINT weibo_copy").await.map_err(sql),
        Err(e) if kind(&e) == Kind::Data => {
            tracing::info!(sink = %inner.name, error = %message(&e), "a chunk was refused: copying it row by row");
            tx.batch_execute("ROLLBACK TO SAVEPOINT weibo_copy").await.map_err(sql)?;
        }
        Err(e) => return Err(sql(e)),
    }
    for (i, origin) in chunk.origins.iter().enumerate() {
        let Some(one) = single_row(&chunk.body, &chunk.ends, i) else { continue };
        tx.batch_execute("SAVEPOINT weibo_row").await.map_err(sql)?;
        match copy_in(tx, stage, one).await {
            Ok(_) => tx.batch_execute("RELEASE SAVEPOINT weibo_row").await.map_err(sql)?,
            Err(e) if kind(&e) == Kind::Data => {
                tx.batch_execute("ROLLBACK TO SAVEPOINT weibo_row").await.map_err(sql)?;
                let text = chunk.render(inner, i);
                let why = message(&e);
                if inner.rejected == Rejected::Fail {
                    return Err(Attempt::Fail(inner.refused(*origin, &text, &why)));
                }
                let seq = (i64::from(chunk.number) << 32) | i64::try_from(i).unwrap_or(i64::MAX);
                let mut refused = RowBuffer::new();
                refused.push_refused(inner.columns.len(), seq, *origin, &why, &text);
                copy_in(tx, stage, refused.take().0).await.map_err(sql)?;
            }
            Err(e) => return Err(sql(e)),
        }
    }
    Ok(())
}

/// Merges `stage` into the target within `tx`; returns how many rows went
/// to the dead-letter table. When Postgres refuses the merge for its data,
/// merges row by row, each under a savepoint, and sends the refused ones
/// to the [`Rejected`] policy.
pub(crate) async fn merge<T>(
    inner: &Inner<T>,
    checked: &Checked,
    tx: &Transaction<'_>,
    stage: &str,
    instance: i32,
    epoch: i64,
) -> std::result::Result<u64, Attempt> {
    let sql = |e| inner.attempt("merge rows into the table", e);
    let mut dead = 0;
    tx.batch_execute("SAVEPOINT weibo_merge").await.map_err(sql)?;
    match tx.batch_execute(&checked.merge_sql(stage, false)).await {
        Ok(()) => tx.batch_execute("RELEASE SAVEPOINT weibo_merge").await.map_err(sql)?,
        Err(e) if kind(&e) == Kind::Data => {
            tracing::info!(sink = %inner.name, error = %message(&e), "the merge was refused: merging row by row");
            tx.batch_execute("ROLLBACK TO SAVEPOINT weibo_merge").await.map_err(sql)?;
            tx.batch_execute(&format!("CREATE INDEX ON {stage} (weibo_seq)")).await.map_err(sql)?;
            let one = tx.prepare(&checked.merge_sql(stage, true)).await.map_err(sql)?;
            let rows = tx
                .query(
                    &format!(
                        "SELECT weibo_seq, weibo_src, weibo_offset, (to_jsonb(s) - ARRAY['weibo_seq', 'weibo_src', \
                         'weibo_offset', 'weibo_error', 'weibo_row'])::text FROM {stage} s WHERE weibo_error IS NULL \
                         ORDER BY weibo_seq"
                    ),
                    &[],
                )
                .await
                .map_err(sql)?;
            for r in rows {
                let (seq, src, offset, text): (i64, i64, i64, String) = (
                    r.try_get(0).unwrap_or(0),
                    r.try_get(1).unwrap_or(0),
                    r.try_get(2).unwrap_or(0),
                    r.try_get(3).unwrap_or_default(),
                );
                tx.batch_execute("SAVEPOINT weibo_row").await.map_err(sql)?;
                match tx.execute(&one, &[&seq]).await {
                    Ok(_) => tx.batch_execute("RELEASE SAVEPOINT weibo_row").await.map_err(sql)?,
                    Err(e) if kind(&e) == Kind::Data => {
                        tx.batch_execute("ROLLBACK TO SAVEPOINT weibo_row").await.map_err(sql)?;
                        let origin = Origin::unpack(src, offset);
                        let why = message(&e);
                        let Rejected::DeadLetterTable(table) = &inner.rejected else {
                            return Err(Attempt::Fail(inner.refused(origin, &text, &why)));
                        };
                        let source = inner.describe_source(origin);
                        tx.execute(
                            &format!(
                                "INSERT INTO {} (sink, instance, epoch, source, partition, \"offset\", row, error) \
                                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                                inner.table.qualify(table)
                            ),
                            &[
                                &inner.id,
                                &instance,
                                &epoch,
                                &source,
                                &i64::from(origin.partition),
                                &offset,
                                &text,
                                &why,
                            ],
                        )
                        .await
                        .map_err(sql)?;
                        dead += 1;
                    }
                    Err(e) => return Err(sql(e)),
                }
            }
        }
        Err(e) => return Err(sql(e)),
    }
    if let Rejected::DeadLetterTable(table) = &inner.rejected {
        let names: Vec<String> = inner.source_names().to_vec();
        let n = tx
            .execute(
                &format!(
                    "INSERT INTO {} (sink, instance, epoch, source, partition, \"offset\", row, error) \
                     SELECT $1, $2, $3, coalesce(($4::text[])[(weibo_src >> 32)::int + 1], '#' || (weibo_src >> 32)), \
                     weibo_src & 4294967295, weibo_offset, weibo_row, weibo_error FROM {stage} \
                     WHERE weibo_error IS NOT NULL ORDER BY weibo_seq",
                    inner.table.qualify(table)
                ),
                &[&inner.id, &instance, &epoch, &names],
            )
            .await
            .map_err(sql)?;
        dead += n;
    }
    Ok(dead)
}

impl<T> Inner<T> {
    /// The name of `origin`'s source.
    pub(crate) fn describe_source(&self, origin: Origin) -> String {
        let names = self.source_names();
        usize::try_from(origin.source)
            .ok()
            .and_then(|i| names.get(i))
            .cloned()
            .unwrap_or_else(|| format!("#{}", origin.source))
    }
}

/// At least once: each chunk is copied into a temporary table and merged
/// into the target in one transaction, one chunk in flight while the next
/// is encoded; flushes and barriers wait for every chunk.
pub(crate) struct PlainWriter<T> {
    inner: Arc<Inner<T>>,
    checked: Arc<Checked>,
    rows: Collector<T>,
    in_flight: Option<Pending<Result<u64>>>,
}

impl<T: Send + 'static> PlainWriter<T> {
    pub(crate) fn new(inner: Arc<Inner<T>>, checked: Arc<Checked>) -> Self {
        Self { inner, checked, rows: Collector::new(), in_flight: None }
    }

    fn wait(&mut self) -> Result<()> {
        if let Some(p) = self.in_flight.take() {
            let dead = p.wait()??;
            self.inner.dead_lettered.fetch_add(dead, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    fn ship(&mut self) -> Result<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        self.wait()?;
        let chunk = self.rows.take();
        self.rows.chunk = 0;
        let (inner, checked) = (Arc::clone(&self.inner), Arc::clone(&self.checked));
        self.in_flight = Some(self.inner.start(async move { write_chunk(&inner, &checked, &chunk).await }));
        Ok(())
    }
}

/// One at-least-once chunk: temporary table, `COPY`, merge, commit.
async fn write_chunk<T>(inner: &Inner<T>, checked: &Checked, chunk: &Chunk<T>) -> Result<u64> {
    retrying!(inner, "write rows", |_attempt| {
        let mut client = inner.connect().await?;
        let sql = |e| inner.attempt("write rows", e);
        let tx = tokio_postgres::Client::transaction(&mut client).await.map_err(sql)?;
        let stage = quote("weibo_chunk");
        tx.batch_execute(&format!("CREATE TEMP TABLE {stage} ({}) ON COMMIT DROP", checked.stage_ddl))
            .await
            .map_err(sql)?;
        copy_rows(inner, &tx, &stage, chunk).await?;
        let dead = merge(inner, checked, &tx, &stage, -1, 0).await?;
        tx.commit().await.map_err(sql)?;
        Ok(dead)
    })
}

impl<T: Send + 'static> SinkWriter<T> for PlainWriter<T> {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        self.rows.add(&self.inner, &self.checked, batch)?;
        if self.rows.full(&self.inner) {
            self.ship()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.ship()?;
        self.wait()
    }
}
