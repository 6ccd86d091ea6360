//! Writes a stream into a PostgreSQL table: appended or upserted by key,
//! at least once ([`weibo::Stream::sink`]) or exactly once
//! ([`weibo::Stream::sink_exactly_once`]).
//!
//! Rows go in with binary `COPY`, a chunk at a time, never one `INSERT`
//! per record. How each mode works:
//!
//! - **At least once**: each chunk is applied to the target in a
//!   transaction of its own: `COPY`'d straight in (append), or into a
//!   temporary table merged with `INSERT … ON CONFLICT … DO UPDATE`
//!   (upsert). A barrier waits for every chunk before it, so a checkpoint
//!   covers what it acknowledges; after a crash the rows since the last
//!   checkpoint are written again (an upsert makes that invisible, an
//!   append shows them twice).
//! - **Exactly once**: each checkpoint epoch's chunks are spooled into
//!   Postgres (`weibo_sink_spool`: one row per chunk, its `COPY` body as
//!   `bytea`, durable when the barrier's pre-commit returns). When the
//!   checkpoint is complete, one transaction applies the epoch's chunks to
//!   the target as above, deletes them from the spool, and records `(sink,
//!   instance, run, epoch)` in `weibo_sink_progress`; a commit retried
//!   after a crash finds that row and does nothing. A restore deletes the
//!   spooled epochs after the restored checkpoint. The book's design notes
//!   say why a spool and not `PREPARE TRANSACTION`.
//!
//! Connections come from a `deadpool-postgres` pool on the sink's own
//! small tokio runtime, so the sink works on any runtime the job runs on.
//! Lost connections, a database that restarts, serialization failures and
//! deadlocks are retried with exponential backoff and jitter (for up to 5
//! minutes by default, [`PostgresSinkBuilder::with_retry_for`]). A row that
//! Postgres refuses (a constraint, a value out of the column's range) goes
//! to the sink's [`Rejected`] policy.

mod copy;
mod schema;
#[cfg(feature = "postgres-tls")]
mod tls;
mod txn;
mod write;

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::BytesMut;
use tokio_postgres::types::{IsNull, ToSql, Type};
use weibo::error::BoxError;
use weibo::sinks::{Sink, SinkWriter};
use weibo::{Error, Result};

pub(crate) use crate::runtime::Pending;
use crate::runtime::SinkRuntime;
pub(crate) use schema::Checked;

/// What the sink does with a row Postgres refuses (a unique, foreign-key,
/// check or not-null constraint, a value the column cannot hold), or a
/// value the sink cannot encode for its column.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Rejected {
    /// Fail the job with an error naming the table, the record's source
    /// position, the row and Postgres's error (the default). Under
    /// exactly-once the epoch's commit fails, and the sink's writers fail
    /// the job at their next record or barrier; the commit is tried again
    /// when the job restarts, and fails again until the table or the data
    /// is fixed.
    #[default]
    Fail,
    /// Write the row, its source position and Postgres's error into this
    /// table (`table`, in the target's schema, or `schema.table`), created
    /// if missing, in the same transaction as the rows around it, and go
    /// on: under exactly-once each refused row is recorded once. Its
    /// columns: `sink`, `instance`, `epoch` (at least once: -1 and 0),
    /// `source`, `partition`, `offset`, `row` (JSON for a row the table
    /// refused; the mapped values, as Rust prints them, for a record the
    /// sink could not encode; a note for a row Postgres could not read),
    /// `error`, `rejected_at`.
    DeadLetterTable(String),
}

/// Writes a record's value of one column in Postgres's binary form.
type Encode<T> = Box<dyn Fn(&T, &Type, &mut BytesMut) -> std::result::Result<IsNull, BoxError> + Send + Sync>;

/// One column of the mapping from a record to a row.
pub(crate) struct Column<T> {
    pub(crate) name: String,
    /// The Rust type the mapping gives, for messages.
    pub(crate) rust_type: &'static str,
    /// Whether that type can be written to a Postgres type.
    pub(crate) accepts: fn(&Type) -> bool,
    pub(crate) encode: Encode<T>,
    /// The value as text (its `Debug` form), for a refused row.
    pub(crate) render: Box<dyn Fn(&T) -> String + Send + Sync>,
}

impl<T> Column<T> {
    pub(crate) fn new<V, F>(name: impl Into<String>, f: F) -> Self
    where
        V: ToSql + 'static,
        F: Fn(&T) -> V + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        let g = Arc::clone(&f);
        Column {
            name: name.into(),
            rust_type: std::any::type_name::<V>(),
            accepts: <V as ToSql>::accepts,
            encode: Box::new(move |row, ty, out| f(row).to_sql_checked(ty, out)),
            render: Box::new(move |row| format!("{:?}", g(row))),
        }
    }

    fn by_ref<V, F>(name: impl Into<String>, f: F) -> Self
    where
        V: ToSql + 'static,
        F: for<'a> Fn(&'a T) -> &'a V + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        let g = Arc::clone(&f);
        Column {
            name: name.into(),
            rust_type: std::any::type_name::<V>(),
            accepts: <V as ToSql>::accepts,
            encode: Box::new(move |row, ty, out| f(row).to_sql_checked(ty, out)),
            render: Box::new(move |row| format!("{:?}", g(row))),
        }
    }
}

/// A table name, as given and quoted.
#[derive(Clone, Debug)]
pub(crate) struct TableName {
    /// The schema, when the name was qualified (`schema.table`).
    pub(crate) schema: Option<String>,
    pub(crate) name: String,
}

impl TableName {
    fn parse(sink: &str, s: &str) -> Result<Self> {
        let (schema, name) = match s.split_once('.') {
            Some((schema, name)) => (Some(schema.to_string()), name.to_string()),
            None => (None, s.to_string()),
        };
        if name.is_empty() || schema.as_deref().is_some_and(str::is_empty) || name.contains('.') {
            return Err(Error::connector(sink, format!("`{s}` is not a table name (write `table` or `schema.table`)")));
        }
        Ok(TableName { schema, name })
    }

    /// The quoted, qualified name for SQL.
    pub(crate) fn sql(&self) -> String {
        self.qualify(&self.name)
    }

    /// Another table in the same schema, quoted.
    pub(crate) fn qualify(&self, table: &str) -> String {
        match &self.schema {
            Some(s) => format!("{}.{}", quote(s), quote(table)),
            None => quote(table),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "{s}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// `s` as a quoted SQL identifier.
pub(crate) fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// Everything the sink's writers and committers share.
pub(crate) struct Inner<T> {
    pub(crate) name: String,
    /// Names the sink's progress rows, spooled chunks and writer locks.
    pub(crate) id: String,
    pub(crate) table: TableName,
    pub(crate) columns: Vec<Column<T>>,
    /// Indices of the upsert key's columns (empty: append).
    pub(crate) keys: Vec<usize>,
    pub(crate) rejected: Rejected,
    pub(crate) chunk_rows: usize,
    pub(crate) retry_for: Duration,
    /// Exactly once: the sources' positions are written with each
    /// checkpoint's rows ([`PostgresSinkBuilder::store_source_positions`]).
    pub(crate) store_positions: bool,
    /// The positions the table should hold: as `stored_positions` read
    /// them, then as this process's last commit wrote them; `None` until
    /// either (a job restored from its checkpoints never reads them).
    pub(crate) expected_positions: Mutex<Option<txn::PositionMap>>,
    pub(crate) pool: deadpool_postgres::Pool,
    rt: SinkRuntime,
    /// The table's columns as checked when the first writer opened.
    checked: Mutex<Option<Arc<Checked>>>,
    /// The job's source names (from the writers' batches), for messages.
    pub(crate) sources: Mutex<Arc<[String]>>,
    /// Rows sent to the dead-letter table.
    pub(crate) dead_lettered: AtomicU64,
    /// The chunks this process spooled and has not committed yet, so that
    /// their commit need not read them back (see [`txn::Cache`]).
    pub(crate) cache: Mutex<txn::Cache>,
    /// A commit failed for good: the writers fail the job with it at their
    /// next call (a commit runs in the checkpoint coordinator, which would
    /// only carry it to the next checkpoint).
    pub(crate) fatal: Mutex<Option<String>>,
    pub(crate) failed: std::sync::atomic::AtomicBool,
    /// The target's schema, as the check found it (for the sink's own
    /// tables, which live beside it).
    pub(crate) schema: std::sync::OnceLock<String>,
}

impl<T> Inner<T> {
    /// `table` (unqualified: in the target's schema, as the check resolved
    /// it; or `schema.table`), quoted.
    pub(crate) fn qualify(&self, table: &str) -> String {
        if let Some((schema, name)) = table.split_once('.') {
            return format!("{}.{}", quote(schema), quote(name));
        }
        match (&self.table.schema, self.schema.get()) {
            (Some(s), _) | (None, Some(s)) => format!("{}.{}", quote(s), quote(table)),
            (None, None) => quote(table),
        }
    }

    /// Remembers that a commit failed for good.
    pub(crate) fn fail(&self, e: &Error) {
        let mut f = self.fatal.lock().unwrap_or_else(PoisonError::into_inner);
        f.get_or_insert_with(|| e.report().to_string());
        self.failed.store(true, Ordering::Release);
    }

    /// The failure of a commit, for a writer to fail the job with.
    pub(crate) fn check_failed(&self) -> Result<()> {
        if !self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let why = self.fatal.lock().unwrap_or_else(PoisonError::into_inner).clone().unwrap_or_default();
        Err(self.err(format!("a commit failed, and is not retried before this job restarts: {why}")))
    }

    pub(crate) fn err(&self, message: impl Into<String>) -> Error {
        Error::connector(&self.name, message)
    }

    pub(crate) fn err_caused(&self, message: impl Into<String>, e: impl Into<BoxError>) -> Error {
        Error::connector_caused(&self.name, message, e)
    }

    /// Runs `f` on the sink's runtime and waits for it (off the job's
    /// async threads where it can).
    pub(crate) fn run<R: Send + 'static>(&self, f: impl Future<Output = R> + Send + 'static) -> Result<R> {
        self.rt.run(f)
    }

    /// Starts `f` on the sink's runtime.
    pub(crate) fn start<R: Send + 'static>(&self, f: impl Future<Output = R> + Send + 'static) -> Pending<R> {
        self.rt.start(f)
    }

    pub(crate) fn source_names(&self) -> Arc<[String]> {
        Arc::clone(&self.sources.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub(crate) fn remember_sources(&self, names: &Arc<[String]>) {
        if names.is_empty() {
            return;
        }
        let mut s = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        if !Arc::ptr_eq(&s, names) {
            *s = Arc::clone(names);
        }
    }

    /// "source `s` partition p offset o", for messages.
    pub(crate) fn describe(&self, origin: copy::Origin) -> String {
        let names = self.source_names();
        let pos = weibo::record::SourcePosition {
            source: usize::try_from(origin.source)
                .ok()
                .and_then(|i| names.get(i))
                .cloned()
                .unwrap_or_else(|| format!("#{}", origin.source)),
            partition: origin.partition,
            offset: origin.offset,
        };
        pos.to_string()
    }
}

impl<T: Send + 'static> Inner<T> {
    /// The table's columns, checked against the mapping (once per sink).
    pub(crate) fn checked(self: &Arc<Self>) -> Result<Arc<Checked>> {
        let mut slot = self.checked.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = slot.as_ref() {
            return Ok(Arc::clone(c));
        }
        let me = Arc::clone(self);
        let c = Arc::new(self.run(async move { schema::check(&me).await })??);
        *slot = Some(Arc::clone(&c));
        Ok(c)
    }
}

/// Writes records into a PostgreSQL table; see the [module notes](self).
///
/// ```no_run
/// use weibo_connectors::postgres::{PostgresSink, Rejected};
///
/// #[derive(Clone, Debug)]
/// struct Total { account: String, cents: i64 }
///
/// # fn main() -> weibo::Result<()> {
/// let sink = PostgresSink::<Total>::builder("host=127.0.0.1 user=app dbname=shop", "totals")
///     .with_column_ref("account", |t: &Total| &t.account)
///     .with_column("cents", |t: &Total| t.cents)
///     .with_upsert_keys(["account"])
///     .with_rejected(Rejected::DeadLetterTable("totals_rejected".into()))
///     .build()?;
/// let job = weibo::Job::new("totals").with_checkpoints("/var/lib/totals", std::time::Duration::from_secs(5));
/// # let totals = job.source(weibo::sources::IterSource::new(Vec::<Total>::new()));
/// totals.sink_exactly_once(sink);
/// # Ok(()) }
/// ```
pub struct PostgresSink<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for PostgresSink<T> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

impl<T> fmt::Debug for PostgresSink<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSink")
            .field("table", &self.inner.table.to_string())
            .field("id", &self.inner.id)
            .finish()
    }
}

impl<T: Send + 'static> PostgresSink<T> {
    /// A sink into `table` (`table` or `schema.table`) of the database at
    /// `url` (`postgresql://user@host:port/db` or `host=… user=… dbname=…`).
    /// Plain TCP, unless the string says `sslmode=require`: then TLS, the
    /// server's certificate and host name verified (feature `postgres-tls`;
    /// see [`PostgresSinkBuilder::with_tls_root_certificates`]).
    pub fn builder(url: impl Into<String>, table: impl Into<String>) -> PostgresSinkBuilder<T> {
        PostgresSinkBuilder {
            url: url.into(),
            table: table.into(),
            id: None,
            columns: Vec::new(),
            keys: Vec::new(),
            rejected: Rejected::Fail,
            chunk_rows: 16_384,
            retry_for: Duration::from_secs(300),
            pool_size: 8,
            store_positions: false,
            tls_roots: None,
        }
    }

    /// The source positions committed with this sink's rows (see
    /// [`PostgresSinkBuilder::store_source_positions`]), one per source
    /// partition, for the job's sources to resume from; empty before the
    /// first commit. Checks the table against the mapping first (as the
    /// job's start does), creating the sink's own tables if needed.
    ///
    /// # Errors
    /// [`Error::Connector`] when the sink does not store positions, when
    /// the check fails, or when the database cannot be read for
    /// the retry limit (`with_retry_for`).
    pub fn stored_positions(&self) -> Result<Vec<weibo::checkpoint::SourcePositionEntry>> {
        if !self.inner.store_positions {
            return Err(self.inner.err("the sink does not store positions: build it with `store_source_positions`"));
        }
        self.inner.checked()?;
        let me = Arc::clone(&self.inner);
        self.inner.run(async move { txn::read_positions(&me).await })?
    }

    /// How many rows went to the dead-letter table (in this process).
    pub fn dead_lettered(&self) -> u64 {
        self.inner.dead_lettered.load(Ordering::Relaxed)
    }
}

/// Configures a [`PostgresSink`].
pub struct PostgresSinkBuilder<T> {
    url: String,
    table: String,
    id: Option<String>,
    columns: Vec<Column<T>>,
    keys: Vec<String>,
    rejected: Rejected,
    chunk_rows: usize,
    retry_for: Duration,
    pool_size: usize,
    store_positions: bool,
    tls_roots: Option<std::path::PathBuf>,
}

impl<T> fmt::Debug for PostgresSinkBuilder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let columns: Vec<&str> = self.columns.iter().map(|c| c.name.as_str()).collect();
        f.debug_struct("PostgresSinkBuilder").field("table", &self.table).field("columns", &columns).finish()
    }
}

impl<T: Send + 'static> PostgresSinkBuilder<T> {
    /// Maps column `name` to the value `f` computes from a record. `V` is
    /// any type tokio-postgres writes (`bool`, `i16`, `i32`, `i64`, `f32`,
    /// `f64`, `String`, `&'static str`, `Vec<u8>`, `std::time::SystemTime`,
    /// `serde_json::Value`, `Vec<V>` for arrays, `Option<V>` for NULL);
    /// whether it fits the column's type is checked when the job starts.
    #[must_use]
    pub fn with_column<V, F>(mut self, name: impl Into<String>, f: F) -> Self
    where
        V: ToSql + 'static,
        F: Fn(&T) -> V + Send + Sync + 'static,
    {
        self.columns.push(Column::new(name, f));
        self
    }

    /// As [`PostgresSinkBuilder::with_column`], for a value borrowed from the
    /// record (a `String` field, say), without a copy.
    #[must_use]
    pub fn with_column_ref<V, F>(mut self, name: impl Into<String>, f: F) -> Self
    where
        V: ToSql + 'static,
        F: for<'a> Fn(&'a T) -> &'a V + Send + Sync + 'static,
    {
        self.columns.push(Column::by_ref(name, f));
        self
    }

    /// Upserts by these columns (`INSERT … ON CONFLICT (keys) DO UPDATE`)
    /// instead of appending; the table needs a unique index or constraint
    /// on exactly them. Within one epoch (or chunk, at least once) the last
    /// record of a key wins. Key the stream by the same columns when the
    /// sink runs in parallel, so that one instance writes each key.
    #[must_use]
    pub fn with_upsert_keys<I, S>(mut self, keys: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.keys = keys.into_iter().map(Into::into).collect();
        self
    }

    /// Names the sink's progress rows, spooled chunks and writer locks (default: the
    /// table's name). Give every job and sink writing to one database its
    /// own id, and keep it across restarts.
    #[must_use]
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Under exactly once (`sink_exactly_once`), writes the job's source
    /// positions (for a Kafka source, the next offset of each partition)
    /// into `weibo_sink_positions` in the same transaction as each
    /// checkpoint's rows: every instance's epochs of a checkpoint commit in
    /// one transaction with that checkpoint's positions, so the table's
    /// rows are always exactly those of the input before the stored
    /// positions. [`PostgresSink::stored_positions`] reads them back, and a
    /// source started there (`KafkaSourceBuilder::resume_from`) continues
    /// with the next record: a job that keeps no state of its own then
    /// needs no durable checkpoint storage (checkpoints in a
    /// [`MemoryStorage`](weibo::checkpoint::MemoryStorage) will do). The
    /// job must take checkpoints (it refuses to start otherwise); a job
    /// started with one sink storing positions should have no other
    /// exactly-once output, whose epochs the stored positions would not
    /// cover. See the book's chapter for when to use which.
    #[must_use]
    pub fn store_source_positions(mut self) -> Self {
        self.store_positions = true;
        self
    }

    /// With `sslmode=require` in the connection string, trusts only the
    /// root certificates in the PEM file at `path` (a private CA, a cloud
    /// provider's bundle) instead of the system's. Needs the feature
    /// `postgres-tls`.
    #[must_use]
    pub fn with_tls_root_certificates(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls_roots = Some(path.into());
        self
    }

    /// What to do with a row Postgres refuses (default [`Rejected::Fail`]).
    #[must_use]
    pub fn with_rejected(mut self, policy: Rejected) -> Self {
        self.rejected = policy;
        self
    }

    /// Rows per `COPY` (default 16,384).
    #[must_use]
    pub fn with_chunk_rows(mut self, rows: usize) -> Self {
        self.chunk_rows = rows.max(1);
        self
    }

    /// How long to keep retrying a database that cannot be reached or a
    /// transaction that fails for a passing reason (default 5 minutes).
    #[must_use]
    pub fn with_retry_for(mut self, limit: Duration) -> Self {
        self.retry_for = limit;
        self
    }

    /// The most connections the sink opens (default 8; each instance
    /// uses one at a time, a commit another).
    #[must_use]
    pub fn with_pool_size(mut self, connections: usize) -> Self {
        self.pool_size = connections.max(1);
        self
    }

    /// Checks the configuration (not yet the table: that happens when the
    /// job starts, before any row is written).
    ///
    /// # Errors
    /// [`Error::Connector`] for a URL that does not parse, a table name
    /// that is not one, no columns, a column mapped twice, or an upsert key
    /// that is not a mapped column.
    pub fn build(self) -> Result<PostgresSink<T>> {
        let name = format!("postgres {}", self.table);
        let table = TableName::parse(&name, &self.table)?;
        if self.columns.is_empty() {
            return Err(Error::connector(&name, "no columns: map at least one with `.with_column(name, f)`"));
        }
        for (i, c) in self.columns.iter().enumerate() {
            if self.columns.iter().take(i).any(|d| d.name == c.name) {
                return Err(Error::connector(&name, format!("column `{}` is mapped twice", c.name)));
            }
        }
        let mut keys = Vec::new();
        for k in &self.keys {
            match self.columns.iter().position(|c| &c.name == k) {
                Some(i) if !keys.contains(&i) => keys.push(i),
                Some(_) => return Err(Error::connector(&name, format!("upsert key column `{k}` is named twice"))),
                None => {
                    return Err(Error::connector(
                        &name,
                        format!("upsert key `{k}` is not a mapped column (map it with `.with_column(\"{k}\", …)`)"),
                    ));
                }
            }
        }
        let mut pg: tokio_postgres::Config = self
            .url
            .parse()
            .map_err(|e| Error::connector_caused(&name, "cannot read the connection string".to_string(), e))?;
        // A connection whose peer vanished (a host gone, a network cut) is
        // noticed within seconds on both sides, not after the systems'
        // two-hour keepalive: an attempt fails and is retried, and the
        // server ends a dead writer's session (and releases its lock).
        pg.keepalives(true)
            .keepalives_idle(Duration::from_secs(15))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3)
            .tcp_user_timeout(Duration::from_secs(60));
        let server_side = "-c tcp_keepalives_idle=15 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3";
        let options = match pg.get_options() {
            Some(o) if !o.is_empty() => format!("{o} {server_side}"),
            _ => server_side.to_string(),
        };
        pg.options(options);
        let manager_config =
            deadpool_postgres::ManagerConfig { recycling_method: deadpool_postgres::RecyclingMethod::Fast };
        let manager = match pg.get_ssl_mode() {
            tokio_postgres::config::SslMode::Require => {
                require_tls(&name, pg, self.tls_roots.as_deref(), manager_config)?
            }
            _ if self.tls_roots.is_some() => {
                return Err(Error::connector(
                    &name,
                    "root certificates for TLS are given, but the connection string does not say `sslmode=require`",
                ));
            }
            // `prefer` (tokio-postgres's default) and `disable`: plain TCP.
            _ => deadpool_postgres::Manager::from_config(pg, tokio_postgres::NoTls, manager_config),
        };
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(self.pool_size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(30)))
            .create_timeout(Some(Duration::from_secs(10)))
            .build()
            .map_err(|e| Error::connector_caused(&name, "cannot create the connection pool".to_string(), e))?;
        let rt = SinkRuntime::new(&name, "weibo-postgres")?;
        let id = self.id.unwrap_or_else(|| table.to_string());
        Ok(PostgresSink {
            inner: Arc::new(Inner {
                name,
                id,
                table,
                columns: self.columns,
                keys,
                rejected: self.rejected,
                chunk_rows: self.chunk_rows,
                retry_for: self.retry_for,
                store_positions: self.store_positions,
                expected_positions: Mutex::new(None),
                pool,
                rt,
                checked: Mutex::new(None),
                sources: Mutex::new(Arc::from(Vec::new())),
                dead_lettered: AtomicU64::new(0),
                cache: Mutex::new(txn::Cache::default()),
                fatal: Mutex::new(None),
                failed: std::sync::atomic::AtomicBool::new(false),
                schema: std::sync::OnceLock::new(),
            }),
        })
    }
}

/// The connection manager for `sslmode=require`: TLS with the server's
/// certificate and host name verified.
#[cfg(feature = "postgres-tls")]
fn require_tls(
    name: &str,
    pg: tokio_postgres::Config,
    roots: Option<&std::path::Path>,
    config: deadpool_postgres::ManagerConfig,
) -> Result<deadpool_postgres::Manager> {
    Ok(deadpool_postgres::Manager::from_config(pg, tls::MakeRustls::new(name, roots)?, config))
}

#[cfg(not(feature = "postgres-tls"))]
fn require_tls(
    name: &str,
    _pg: tokio_postgres::Config,
    _roots: Option<&std::path::Path>,
    _config: deadpool_postgres::ManagerConfig,
) -> Result<deadpool_postgres::Manager> {
    Err(Error::connector(
        name,
        "the connection string says `sslmode=require`: TLS needs weibo-connectors' feature `postgres-tls`",
    ))
}

impl<T: Send + 'static> Sink<T> for PostgresSink<T> {
    fn default_name(&self) -> String {
        self.inner.name.clone()
    }

    fn open(&self, _instance: usize, _parallelism: usize) -> Result<Box<dyn SinkWriter<T>>> {
        if self.inner.store_positions {
            return Err(self.inner.err(
                "`store_source_positions` needs `sink_exactly_once`: at least once, rows and positions are not \
                 committed together",
            ));
        }
        let checked = self.inner.checked()?;
        Ok(Box::new(write::PlainWriter::new(Arc::clone(&self.inner), checked)))
    }
}
