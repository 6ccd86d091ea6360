//! Getting rows into Postgres: retries, applying chunks to the target
//! (`COPY` straight in, or through a temporary table for an upsert, with a
//! row-by-row fallback for rows Postgres refuses), and the at-least-once
//! writer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::SinkExt as _;
use tokio_postgres::Transaction;
use weibo::sinks::{SinkBatch, SinkWriter};
use weibo::{Error, Result};

use super::copy::{Origin, RowBuffer, row_ends, single_row};
use super::{Checked, Inner, Pending, Rejected};
use crate::runtime::jitter;

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
        // No SQLSTATE: the connection (I/O, closed, refused, timed out)
        // passes; the client's own errors (a parameter that does not
        // convert, an answer it cannot read, authentication) do not.
        // tokio-postgres does not expose its error kinds but by their text.
        let text = e.to_string();
        let passing = e.is_closed()
            || ["error communicating with the server", "error connecting to server", "timeout waiting for server"]
                .iter()
                .any(|p| text.starts_with(p));
        return if passing { Kind::Passing } else { Kind::Other };
    };
    let code = code.code();
    match code.get(..2) {
        // A query cancelled; a binary value or COPY body the server cannot
        // read (the table changed under the sink): not the data's fault.
        _ if code == "57014" || code == "22P03" || code == "22P04" => Kind::Other,
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
                Attempt::Fail(self.err_caused(format!("cannot {what} (table `{}`)", self.table), e))
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

/// Runs `$body` (an async block's contents returning `Result<R,
/// Attempt>`) until it succeeds, fails for good, or has been failing for
/// longer than the sink's retry limit (`with_retry_for`), with exponential backoff (50 ms to
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

/// A record the sink could not encode for its columns, kept for the
/// dead-letter table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) origin: Origin,
    pub(crate) error: String,
    /// Its values as text.
    pub(crate) row: String,
}

/// `refused` as JSON text (what the spool keeps).
pub(crate) fn refused_to_json(refused: &[Refused]) -> String {
    let list: Vec<serde_json::Value> = refused
        .iter()
        .map(|r| {
            serde_json::json!({
                "source": r.origin.source, "partition": r.origin.partition, "offset": r.origin.offset,
                "error": r.error, "row": r.row,
            })
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

/// The inverse of [`refused_to_json`].
pub(crate) fn refused_from_json(text: &str) -> Option<Vec<Refused>> {
    let list: Vec<serde_json::Value> = serde_json::from_str(text).ok()?;
    list.iter()
        .map(|v| {
            Some(Refused {
                origin: Origin {
                    source: u32::try_from(v.get("source")?.as_u64()?).ok()?,
                    partition: u32::try_from(v.get("partition")?.as_u64()?).ok()?,
                    offset: v.get("offset")?.as_u64()?,
                },
                error: v.get("error")?.as_str()?.to_string(),
                row: v.get("row")?.as_str()?.to_string(),
            })
        })
        .collect()
}

/// One chunk of rows: the `COPY` body of the mapped columns, where each
/// row came from, and the records the sink could not encode.
#[derive(Clone, Debug)]
pub(crate) struct Chunk {
    pub(crate) body: Bytes,
    pub(crate) origins: Vec<Origin>,
    pub(crate) refused: Vec<Refused>,
    /// The job's source names (what the origins' indices name).
    pub(crate) sources: Arc<[String]>,
}

/// Rows being collected into chunks.
pub(crate) struct Collector {
    buf: RowBuffer,
    origins: Vec<Origin>,
    refused: Vec<Refused>,
    sources: Arc<[String]>,
    /// Chunks full, waiting to be shipped.
    ready: Vec<Chunk>,
}

impl Collector {
    pub(crate) fn new() -> Self {
        Self {
            buf: RowBuffer::new(),
            origins: Vec::new(),
            refused: Vec::new(),
            sources: Arc::from(Vec::new()),
            ready: Vec::new(),
        }
    }

    /// The chunks filled so far.
    pub(crate) fn full_chunks(&mut self) -> Vec<Chunk> {
        std::mem::take(&mut self.ready)
    }

    /// Encodes `batch`'s records. A record the sink cannot encode for its
    /// column fails the job under [`Rejected::Fail`] and is kept for the
    /// dead-letter table otherwise.
    pub(crate) fn add<T>(&mut self, inner: &Inner<T>, checked: &Checked, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        inner.remember_sources(batch.source_names());
        if !Arc::ptr_eq(&self.sources, batch.source_names()) {
            self.sources = Arc::clone(batch.source_names());
        }
        let origins: Vec<Origin> = batch
            .meta()
            .iter()
            .map(|m| Origin { source: m.source, partition: m.partition, offset: m.offset })
            .collect();
        for (v, origin) in batch.drain().zip(origins) {
            match self.buf.push(&inner.columns, &checked.types, &v) {
                Ok(()) => self.origins.push(origin),
                Err(error) => {
                    let row = inner.render(&v);
                    if inner.rejected == Rejected::Fail {
                        return Err(inner.refused(origin, &row, &error));
                    }
                    self.refused.push(Refused { origin, error, row });
                }
            }
            if self.full(inner) {
                let chunk = self.take();
                self.ready.push(chunk);
            }
        }
        Ok(())
    }

    fn full<T>(&self, inner: &Inner<T>) -> bool {
        self.buf.rows() + self.refused.len() >= inner.chunk_rows || self.buf.bytes() >= 8 << 20
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buf.rows() == 0 && self.refused.is_empty()
    }

    /// The rows so far as a chunk, leaving the collector empty.
    pub(crate) fn take(&mut self) -> Chunk {
        let (body, _) = self.buf.take();
        Chunk {
            body,
            origins: std::mem::take(&mut self.origins),
            refused: std::mem::take(&mut self.refused),
            sources: Arc::clone(&self.sources),
        }
    }
}

/// `COPY`s `body` into `table` (`columns`: the column list).
pub(crate) async fn copy_in(
    tx: &Transaction<'_>,
    table: &str,
    columns: &str,
    body: Bytes,
) -> std::result::Result<u64, tokio_postgres::Error> {
    let sink = tx.copy_in::<_, Bytes>(&format!("COPY {table} ({columns}) FROM STDIN (FORMAT binary)")).await?;
    futures_util::pin_mut!(sink);
    sink.send(body).await?;
    sink.finish().await
}

/// The temporary table the rows of an upsert (or of chunks Postgres
/// refused) go through, with their order.
const ROWS: &str = "weibo_rows";

/// Applies `chunks` (in order) to the target within `tx`; returns how
/// many rows went to the dead-letter table. An append `COPY`s each chunk
/// straight into the target; an upsert loads them into a temporary table
/// and merges it, the last row of each key winning. When Postgres refuses
/// rows for their data, the chunks go in row by row, each under a
/// savepoint, and the refused rows to the [`Rejected`] policy.
pub(crate) async fn apply<T>(
    inner: &Inner<T>,
    checked: &Checked,
    tx: &Transaction<'_>,
    chunks: &[Chunk],
    instance: i32,
    epoch: i64,
) -> std::result::Result<u64, Attempt> {
    let sql = |e| inner.attempt("write rows into the table", e);
    if let Some(c) = chunks.first() {
        inner.remember_sources(&c.sources);
    }
    let mut slow = false;
    if checked.is_append() {
        tx.batch_execute("SAVEPOINT weibo_apply").await.map_err(sql)?;
        for c in chunks.iter().filter(|c| !c.origins.is_empty()) {
            match copy_in(tx, &checked.target, &checked.columns, c.body.clone()).await {
                Ok(_) => {}
                Err(e) if kind(&e) == Kind::Data => {
                    tracing::info!(sink = %inner.name, error = %message(&e), "rows refused: writing them one by one");
                    slow = true;
                    break;
                }
                Err(e) => return Err(sql(e)),
            }
        }
        let end = if slow {
            "ROLLBACK TO SAVEPOINT weibo_apply; RELEASE SAVEPOINT weibo_apply"
        } else {
            "RELEASE SAVEPOINT weibo_apply"
        };
        tx.batch_execute(end).await.map_err(sql)?;
    }
    let mut dead = 0;
    if slow || !checked.is_append() {
        let (origins, refused) = load(inner, checked, tx, chunks).await?;
        dead += refuse(inner, tx, &refused, instance, epoch).await?;
        if !slow {
            tx.batch_execute("SAVEPOINT weibo_apply").await.map_err(sql)?;
            match tx.batch_execute(&checked.merge_sql(ROWS, false)).await {
                Ok(()) => tx.batch_execute("RELEASE SAVEPOINT weibo_apply").await.map_err(sql)?,
                Err(e) if kind(&e) == Kind::Data => {
                    tracing::info!(sink = %inner.name, error = %message(&e), "rows refused: merging them one by one");
                    tx.batch_execute("ROLLBACK TO SAVEPOINT weibo_apply; RELEASE SAVEPOINT weibo_apply")
                        .await
                        .map_err(sql)?;
                    slow = true;
                }
                Err(e) => return Err(sql(e)),
            }
        }
        if slow {
            dead += one_by_one(inner, checked, tx, &origins, instance, epoch).await?;
        }
    }
    let encoded: Vec<Refused> = chunks.iter().flat_map(|c| c.refused.iter().cloned()).collect();
    dead += refuse(inner, tx, &encoded, instance, epoch).await?;
    Ok(dead)
}

/// Loads `chunks` into the temporary table, numbering the rows in order
/// (`weibo_seq` from 1); returns each number's origin (`origins[seq - 1]`,
/// `None` for a row Postgres could not read) and the rows it could not
/// read. A chunk Postgres refuses as a whole goes in row by row.
async fn load<T>(
    inner: &Inner<T>,
    checked: &Checked,
    tx: &Transaction<'_>,
    chunks: &[Chunk],
) -> std::result::Result<(Vec<Option<Origin>>, Vec<Refused>), Attempt> {
    let sql = |e| inner.attempt("load rows", e);
    tx.batch_execute(&format!(
        "DROP TABLE IF EXISTS pg_temp.{ROWS}; \
         CREATE TEMP TABLE {ROWS} ({}, weibo_seq int8 GENERATED BY DEFAULT AS IDENTITY) ON COMMIT DROP",
        checked.rows_ddl
    ))
    .await
    .map_err(sql)?;
    let columns = format!("{}, weibo_seq", checked.columns);
    let mut origins: Vec<Option<Origin>> = Vec::new();
    let mut refused = Vec::new();
    for c in chunks.iter().filter(|c| !c.origins.is_empty()) {
        let ends = row_ends(&c.body)
            .filter(|e| e.len() == c.origins.len())
            .ok_or_else(|| Attempt::Fail(inner.err("a chunk's rows do not match their origins (a damaged spool?)")))?;
        // Fast: the chunk as it is, numbered by the identity column from
        // where the rows so far end.
        tx.batch_execute("SAVEPOINT weibo_load").await.map_err(sql)?;
        let next = i64::try_from(origins.len() + 1).unwrap_or(i64::MAX);
        tx.execute(
            &format!("SELECT setval(pg_get_serial_sequence('pg_temp.{ROWS}', 'weibo_seq'), $1, false)"),
            &[&next],
        )
        .await
        .map_err(sql)?;
        match copy_in(tx, ROWS, &checked.columns, c.body.clone()).await {
            Ok(_) => {
                tx.batch_execute("RELEASE SAVEPOINT weibo_load").await.map_err(sql)?;
                origins.extend(c.origins.iter().copied().map(Some));
                continue;
            }
            Err(e) if kind(&e) == Kind::Data => {
                tx.batch_execute("ROLLBACK TO SAVEPOINT weibo_load; RELEASE SAVEPOINT weibo_load")
                    .await
                    .map_err(sql)?;
            }
            Err(e) => return Err(sql(e)),
        }
        for (i, origin) in c.origins.iter().enumerate() {
            let seq = i64::try_from(origins.len() + 1).unwrap_or(i64::MAX);
            let one = single_row(&c.body, &ends, i, seq)
                .ok_or_else(|| Attempt::Fail(inner.err("a chunk's row cannot be cut out (a damaged spool?)")))?;
            tx.batch_execute("SAVEPOINT weibo_row").await.map_err(sql)?;
            match copy_in(tx, ROWS, &columns, one).await {
                Ok(_) => {
                    tx.batch_execute("RELEASE SAVEPOINT weibo_row").await.map_err(sql)?;
                    origins.push(Some(*origin));
                }
                Err(e) if kind(&e) == Kind::Data => {
                    tx.batch_execute("ROLLBACK TO SAVEPOINT weibo_row; RELEASE SAVEPOINT weibo_row")
                        .await
                        .map_err(sql)?;
                    origins.push(None);
                    refused.push(Refused {
                        origin: *origin,
                        error: message(&e),
                        row: "(not shown: Postgres cannot read it)".into(),
                    });
                }
                Err(e) => return Err(sql(e)),
            }
        }
    }
    Ok((origins, refused))
}

/// Writes the loaded rows into the target one by one, each under a
/// savepoint; a row Postgres refuses goes to the [`Rejected`] policy.
async fn one_by_one<T>(
    inner: &Inner<T>,
    checked: &Checked,
    tx: &Transaction<'_>,
    origins: &[Option<Origin>],
    instance: i32,
    epoch: i64,
) -> std::result::Result<u64, Attempt> {
    let sql = |e| inner.attempt("write rows into the table", e);
    tx.batch_execute(&format!("CREATE INDEX ON {ROWS} (weibo_seq)")).await.map_err(sql)?;
    let one = tx.prepare(&checked.merge_sql(ROWS, true)).await.map_err(sql)?;
    let show = tx
        .prepare(&format!("SELECT (to_jsonb(r) - 'weibo_seq')::text FROM {ROWS} r WHERE weibo_seq = $1"))
        .await
        .map_err(sql)?;
    let mut refused = Vec::new();
    for (i, origin) in origins.iter().enumerate() {
        let Some(origin) = origin else { continue };
        let seq = i64::try_from(i + 1).unwrap_or(i64::MAX);
        tx.batch_execute("SAVEPOINT weibo_row").await.map_err(sql)?;
        match tx.execute(&one, &[&seq]).await {
            Ok(_) => tx.batch_execute("RELEASE SAVEPOINT weibo_row").await.map_err(sql)?,
            Err(e) if kind(&e) == Kind::Data => {
                tx.batch_execute("ROLLBACK TO SAVEPOINT weibo_row; RELEASE SAVEPOINT weibo_row").await.map_err(sql)?;
                let row: String = tx.query_one(&show, &[&seq]).await.map_err(sql)?.try_get(0).unwrap_or_default();
                let r = Refused { origin: *origin, error: message(&e), row };
                if inner.rejected == Rejected::Fail {
                    return Err(Attempt::Fail(inner.refused(r.origin, &r.row, &r.error)));
                }
                refused.push(r);
            }
            Err(e) => return Err(sql(e)),
        }
    }
    refuse(inner, tx, &refused, instance, epoch).await
}

/// Sends refused rows to the [`Rejected`] policy: the dead-letter table,
/// within `tx`, or the job's failure.
async fn refuse<T>(
    inner: &Inner<T>,
    tx: &Transaction<'_>,
    refused: &[Refused],
    instance: i32,
    epoch: i64,
) -> std::result::Result<u64, Attempt> {
    let Some(first) = refused.first() else { return Ok(0) };
    let Rejected::DeadLetterTable(table) = &inner.rejected else {
        return Err(Attempt::Fail(inner.refused(first.origin, &first.row, &first.error)));
    };
    let insert = tx
        .prepare(&format!(
            "INSERT INTO {} (sink, instance, epoch, source, partition, \"offset\", row, error) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            inner.qualify(table)
        ))
        .await
        .map_err(|e| inner.attempt("write to the dead-letter table", e))?;
    for r in refused {
        let source = inner.describe_source(r.origin);
        let offset = i64::try_from(r.origin.offset).unwrap_or(i64::MAX);
        tx.execute(
            &insert,
            &[&inner.id, &instance, &epoch, &source, &i64::from(r.origin.partition), &offset, &r.row, &r.error],
        )
        .await
        .map_err(|e| inner.attempt("write to the dead-letter table", e))?;
    }
    Ok(refused.len() as u64)
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

/// At least once: each chunk is applied to the target in a transaction of
/// its own, one chunk in flight while the next is encoded; flushes and
/// barriers wait for every chunk.
pub(crate) struct PlainWriter<T> {
    inner: Arc<Inner<T>>,
    checked: Arc<Checked>,
    rows: Collector,
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

    /// Sends `chunk` (after the one in flight is done).
    fn send(&mut self, chunk: Chunk) -> Result<()> {
        self.wait()?;
        let (inner, checked) = (Arc::clone(&self.inner), Arc::clone(&self.checked));
        self.in_flight = Some(self.inner.start(async move { write_chunk(&inner, &checked, chunk).await }));
        Ok(())
    }

    /// Sends the full chunks, and the rest too when `all`.
    fn ship(&mut self, all: bool) -> Result<()> {
        for chunk in self.rows.full_chunks() {
            self.send(chunk)?;
        }
        if all && !self.rows.is_empty() {
            let chunk = self.rows.take();
            self.send(chunk)?;
        }
        Ok(())
    }
}

/// One at-least-once chunk, in its own transaction.
async fn write_chunk<T>(inner: &Inner<T>, checked: &Checked, chunk: Chunk) -> Result<u64> {
    let chunks = [chunk];
    retrying!(inner, "write rows", |_attempt| {
        let mut client = inner.connect().await?;
        let sql = |e| inner.attempt("write rows", e);
        let tx = tokio_postgres::Client::transaction(&mut client).await.map_err(sql)?;
        let dead = apply(inner, checked, &tx, &chunks, -1, 0).await?;
        tx.commit().await.map_err(sql)?;
        Ok(dead)
    })
}

impl<T: Send + 'static> SinkWriter<T> for PlainWriter<T> {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        self.rows.add(&self.inner, &self.checked, batch)?;
        self.ship(false)
    }

    fn flush(&mut self) -> Result<()> {
        self.ship(true)?;
        self.wait()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn refused_records_round_trip_through_the_spool_text() {
        let refused = vec![
            Refused {
                origin: Origin { source: 1, partition: 2, offset: u64::MAX },
                error: "e \"1\"".into(),
                row: "{a: 1}".into(),
            },
            Refused {
                origin: Origin { source: 0, partition: 0, offset: 0 },
                error: String::new(),
                row: "naïve\n".into(),
            },
        ];
        assert_eq!(refused_from_json(&refused_to_json(&refused)), Some(refused));
        assert_eq!(refused_from_json("[]"), Some(Vec::new()));
        assert_eq!(refused_from_json("[{\"source\": 1}]"), None);
        assert_eq!(refused_from_json("not json"), None);
    }
}
