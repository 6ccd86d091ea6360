//! Exactly once: each epoch's chunks spooled into Postgres, applied to the
//! target at commit in one transaction with a progress row.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use weibo::Result;
use weibo::checkpoint::{SourcePositionEntry, run_token};
use weibo::record::CheckpointId;
use weibo::sinks::{SinkBatch, TransactionWriter, TwoPhaseCommitSink};

use super::copy::{decode_origins, encode_origins};
use super::write::{Attempt, Chunk, Collector, apply, refused_from_json, refused_to_json, retrying};
use super::{Checked, Inner, Pending, PostgresSink};

/// The table of committed epochs: a row `(sink, instance, run, epoch)`
/// for each of the last [`KEEP_PROGRESS`] epochs of each instance and run.
pub(crate) const PROGRESS: &str = "weibo_sink_progress";
/// The table of pre-committed chunks: `(sink, instance, run, epoch,
/// chunk) → (COPY body, origins, refused records)`.
pub(crate) const SPOOL: &str = "weibo_sink_spool";
/// The table of the sources' positions committed with the rows:
/// `(sink, source, partition key) → (partition, partition name, position)`.
pub(crate) const POSITIONS: &str = "weibo_sink_positions";
/// How many epochs back a commit can be retried and still be recognised
/// by its own progress row.
const KEEP_PROGRESS: i64 = 1000;

/// The most bytes of chunks [`Cache`] keeps; beyond, commits read the
/// spool.
const CACHE_BYTES: usize = 256 << 20;

/// Chunks this process spooled, by `(instance, run, epoch)`, until their
/// commit: a commit in the process that wrote them takes them from here
/// instead of reading them back from the spool (which stays the source of
/// truth after a restart).
#[derive(Default)]
pub(crate) struct Cache {
    epochs: std::collections::HashMap<(usize, String, u64), Vec<Chunk>>,
    bytes: usize,
}

impl Cache {
    fn add(&mut self, key: (usize, String, u64), chunk: &Chunk) {
        let size = chunk.body.len() + chunk.origins.len() * 16;
        if self.bytes + size > CACHE_BYTES {
            // Too much waits for commits: this epoch is read back instead.
            if let Some(dropped) = self.epochs.remove(&key) {
                self.bytes -= dropped.iter().map(|c| c.body.len() + c.origins.len() * 16).sum::<usize>();
            }
            return;
        }
        let chunks = self.epochs.entry(key).or_default();
        if chunks.len() as u64 == u64::from(u32::MAX) {
            return;
        }
        self.bytes += size;
        chunks.push(chunk.clone());
    }

    /// The chunks of `key` when all `count` are here.
    fn take(&mut self, key: &(usize, String, u64), count: u32) -> Option<Vec<Chunk>> {
        let chunks = self.epochs.remove(key)?;
        self.bytes -= chunks.iter().map(|c| c.body.len() + c.origins.len() * 16).sum::<usize>();
        (chunks.len() == count as usize).then_some(chunks)
    }

    fn clear(&mut self) {
        self.epochs.clear();
        self.bytes = 0;
    }
}

/// A pre-committed epoch: what its commit needs.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Handle {
    pub(crate) instance: usize,
    pub(crate) epoch: u64,
    /// The run that wrote it (a new token each time the job starts).
    pub(crate) run: String,
    /// How many chunks it spooled.
    pub(crate) chunks: u32,
}

impl Handle {
    pub(crate) fn encode(&self) -> String {
        format!("pg2:{}:{}:{}:{}", self.instance, self.epoch, self.run, self.chunks)
    }

    pub(crate) fn parse(h: &str) -> Option<Self> {
        let mut parts = h.strip_prefix("pg2:")?.split(':');
        let instance = parts.next()?.parse().ok()?;
        let epoch = parts.next()?.parse().ok()?;
        let run = parts.next()?.to_string();
        let chunks = parts.next()?.parse().ok()?;
        if parts.next().is_some() || run.is_empty() || !run.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(Handle { instance, epoch, run, chunks })
    }
}

impl<T> Inner<T> {
    /// Deletes spooled chunks of this sink (`filter`: more conditions on
    /// `instance` = $2 and `epoch` = $3); returns how many epochs.
    async fn drop_spooled(&self, what: &str, filter: &str, instance: i32, epoch: i64) -> Result<u64> {
        let spool = self.qualify(SPOOL);
        let q = format!(
            "WITH d AS (DELETE FROM {spool} WHERE sink = $1 AND {filter} RETURNING instance, run, epoch) \
             SELECT count(DISTINCT (instance, run, epoch)) FROM d"
        );
        retrying!(self, what, |_attempt| {
            let client = self.connect().await?;
            let n: i64 =
                client.query_one(&q, &[&self.id, &instance, &epoch]).await.map_err(|e| self.attempt(what, e))?.get(0);
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    /// Commits handles `hs` (one, or every handle of a checkpoint) in one
    /// transaction: applies their chunks to the target, deletes them and
    /// records each epoch, and with `positions` writes the sources'
    /// positions too (when at least one epoch was not committed before);
    /// an epoch the progress table records as committed is skipped.
    /// Epochs are recorded one by one (not as a high-water mark): a commit
    /// that failed is retried after later epochs of the same instance
    /// committed.
    async fn commit_handles(
        &self,
        checked: &Checked,
        hs: &[Handle],
        positions: Option<&[SourcePositionEntry]>,
    ) -> Result<Committed> {
        let mut keyed = Vec::with_capacity(hs.len());
        for h in hs {
            let instance =
                i32::try_from(h.instance).map_err(|_| self.err(format!("instance {} out of range", h.instance)))?;
            let epoch = i64::try_from(h.epoch).map_err(|_| self.err(format!("epoch {} out of range", h.epoch)))?;
            keyed.push((instance, epoch, h));
        }
        // Each instance's epochs in order, instances in order (the locks
        // below are taken in this order: two committers never deadlock).
        keyed.sort_by_key(|&(instance, epoch, _)| (instance, epoch));
        let mut instances: Vec<i32> = keyed.iter().map(|k| k.0).collect();
        instances.dedup();
        let stored = positions.map(|p| StoredPositions::of(self, p)).transpose()?;
        let committed = retrying!(self, "commit an epoch", |_attempt| {
            let mut client = self.connect().await?;
            let sql = |e| self.attempt("commit an epoch", e);
            let tx = tokio_postgres::Client::transaction(&mut client).await.map_err(sql)?;
            // One committer per sink instance at a time (a stale process
            // committing the same epoch waits, then finds it done).
            for instance in &instances {
                tx.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                    &[&format!("weibo/{}/{instance}", self.id)],
                )
                .await
                .map_err(sql)?;
            }
            let (mut dead, mut applied) = (0, false);
            for &(instance, epoch, h) in &keyed {
                match self.commit_epoch(checked, &tx, h, instance, epoch).await? {
                    Step::Done => {}
                    Step::Applied(d) => {
                        dead += d;
                        applied = true;
                    }
                    Step::After(earlier) => return Ok((Committed::After(earlier), None)),
                }
            }
            let mut now_stored = None;
            let mut wrote = false;
            if let Some(stored) = &stored {
                let current = stored.current(self, &tx).await?;
                if applied || current.is_empty() {
                    // Fenced: the positions must be those this run read or
                    // wrote last. Otherwise another process of the sink
                    // committed meanwhile (a predecessor still running when
                    // this one read them), and this run's records from the
                    // positions it started at would be written twice.
                    let expected = self.expected_positions.lock().unwrap_or_else(PoisonError::into_inner).clone();
                    if let Some(expected) = expected.filter(|e| *e != current) {
                        return Err(Attempt::Fail(self.err(format!(
                            "the source positions stored for sink id `{}` changed since this run read them \
                             ({} stored, {} expected): another process committed for this sink meanwhile; \
                             start the job again to resume from where that process ended",
                            self.id,
                            describe_positions(&current),
                            describe_positions(&expected)
                        ))));
                    }
                    stored.write(self, &tx).await?;
                    wrote = true;
                    now_stored = Some(stored.map.clone());
                } else if current == stored.map {
                    // An earlier attempt committed them (its answer was lost).
                    now_stored = Some(current);
                }
            }
            if !applied && !wrote {
                // Nothing to change: committed before.
                return Ok((Committed::Done(0), now_stored));
            }
            tx.commit().await.map_err(sql)?;
            weibo::checkpoint::faults::point("postgres-after-commit");
            Ok((Committed::Done(dead), now_stored))
        })?;
        let (committed, now_stored) = committed;
        if let Some(map) = now_stored {
            *self.expected_positions.lock().unwrap_or_else(PoisonError::into_inner) = Some(map);
        }
        Ok(committed)
    }

    /// One epoch of a commit, in `tx`: nothing when the progress table
    /// records it; otherwise its chunks applied, deleted from the spool,
    /// and the epoch recorded.
    async fn commit_epoch(
        &self,
        checked: &Checked,
        tx: &tokio_postgres::Transaction<'_>,
        h: &Handle,
        instance: i32,
        epoch: i64,
    ) -> std::result::Result<Step, Attempt> {
        let (progress, spool) = (self.qualify(PROGRESS), self.qualify(SPOOL));
        let sql = |e| self.attempt("commit an epoch", e);
        let done = tx
            .query_opt(
                &format!("SELECT 1 FROM {progress} WHERE sink = $1 AND instance = $2 AND run = $3 AND epoch = $4"),
                &[&self.id, &instance, &h.run, &epoch],
            )
            .await
            .map_err(sql)?
            .is_some();
        if done {
            return Ok(Step::Done);
        }
        // Epochs commit in order: an earlier one of this run still
        // spooled (its commit failed, and is carried to the next
        // checkpoint) goes first, or an upsert would go back in time.
        let earlier: Option<i64> = tx
            .query_one(
                &format!(
                    "SELECT min(epoch) FROM {spool} WHERE sink = $1 AND instance = $2 AND run = $3 AND epoch < $4"
                ),
                &[&self.id, &instance, &h.run, &epoch],
            )
            .await
            .map_err(sql)?
            .get(0);
        if let Some(earlier) = earlier {
            return Ok(Step::After(earlier));
        }
        let mut dead = 0;
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(&(h.instance, h.run.clone(), h.epoch), h.chunks);
        if let Some(chunks) = cached.filter(|c| !c.is_empty()) {
            dead = apply(self, checked, tx, &chunks, instance, epoch).await?;
            let deleted = tx
                .execute(
                    &format!("DELETE FROM {spool} WHERE sink = $1 AND instance = $2 AND run = $3 AND epoch = $4"),
                    &[&self.id, &instance, &h.run, &epoch],
                )
                .await
                .map_err(sql)?;
            if deleted != u64::from(h.chunks) {
                // Another process restored or restarted this sink and
                // threw the epoch away: it writes the records again.
                return Err(Attempt::Fail(self.err(format!(
                    "epoch {epoch} of instance {instance} is no longer spooled ({deleted} of its {} chunks): \
                 another process running this sink (id `{}`) has taken it over",
                    h.chunks, self.id
                ))));
            }
        } else if h.chunks > 0 {
            let rows = tx
                .query(
                    &format!(
                        "SELECT body, origins, refused, sources FROM {spool} \
                     WHERE sink = $1 AND instance = $2 AND run = $3 AND epoch = $4 ORDER BY chunk"
                    ),
                    &[&self.id, &instance, &h.run, &epoch],
                )
                .await
                .map_err(sql)?;
            if rows.len() != h.chunks as usize {
                // Committed so long ago that its progress row is
                // pruned (a handle of an old savepoint), or lost.
                let oldest: Option<i64> = tx
                    .query_one(
                        &format!("SELECT min(epoch) FROM {progress} WHERE sink = $1 AND instance = $2 AND run = $3"),
                        &[&self.id, &instance, &h.run],
                    )
                    .await
                    .map_err(sql)?
                    .get(0);
                if rows.is_empty() && oldest.is_some_and(|o| o > epoch) {
                    tracing::info!(sink = %self.name, instance, epoch, "epoch committed long ago (its progress row is pruned): nothing to do");
                    return Ok(Step::Done);
                }
                return Err(Attempt::Fail(self.err(format!(
                    "cannot commit epoch {epoch} of instance {instance}: `{spool}` holds {} of its {} chunks, and \
                 `{progress}` does not record it as committed (were rows deleted by hand, or another job \
                 given the same sink id `{}`?)",
                    rows.len(),
                    h.chunks,
                    self.id
                ))));
            }
            let mut chunks = Vec::with_capacity(rows.len());
            for r in &rows {
                let body: Vec<u8> = r.try_get(0).map_err(sql)?;
                let origins: Vec<u8> = r.try_get(1).map_err(sql)?;
                let refused: Option<String> = r.try_get(2).map_err(sql)?;
                let sources: Vec<String> = r.try_get(3).map_err(sql)?;
                let refused = match refused.as_deref() {
                    None => Vec::new(),
                    Some(text) => refused_from_json(text).ok_or_else(|| {
                        Attempt::Fail(self.err(format!("a spooled chunk of epoch {epoch} is damaged")))
                    })?,
                };
                if !origins.len().is_multiple_of(16) {
                    return Err(Attempt::Fail(self.err(format!("a spooled chunk of epoch {epoch} is damaged"))));
                }
                chunks.push(Chunk {
                    body: body.into(),
                    origins: decode_origins(&origins),
                    refused,
                    sources: Arc::from(sources),
                });
            }
            dead = apply(self, checked, tx, &chunks, instance, epoch).await?;
            tx.execute(
                &format!("DELETE FROM {spool} WHERE sink = $1 AND instance = $2 AND run = $3 AND epoch = $4"),
                &[&self.id, &instance, &h.run, &epoch],
            )
            .await
            .map_err(sql)?;
        }
        tx.execute(
            &format!("INSERT INTO {progress} (sink, instance, run, epoch) VALUES ($1, $2, $3, $4)"),
            &[&self.id, &instance, &h.run, &epoch],
        )
        .await
        .map_err(sql)?;
        // Keep the last epochs' rows: a commit retried later (epochs
        // are committed in order, apart from one that failed and is
        // carried to the next checkpoint) finds its own.
        tx.execute(
            &format!("DELETE FROM {progress} WHERE sink = $1 AND instance = $2 AND run = $3 AND epoch < $4"),
            &[&self.id, &instance, &h.run, &(epoch - KEEP_PROGRESS)],
        )
        .await
        .map_err(sql)?;
        // Earlier runs' rows, once a week old: their handles live only in
        // checkpoints and savepoints that old.
        tx.execute(
            &format!(
                "DELETE FROM {progress} WHERE sink = $1 AND instance = $2 AND run <> $3 \
             AND committed_at < now() - interval '7 days'"
            ),
            &[&self.id, &instance, &h.run],
        )
        .await
        .map_err(sql)?;
        Ok(Step::Applied(dead))
    }
}

/// The sources' positions a commit writes, as columns.
struct StoredPositions {
    sources: Vec<String>,
    keys: Vec<String>,
    partitions: Vec<i32>,
    names: Vec<Option<String>>,
    positions: Vec<i64>,
    /// The same, as the table holds them once written.
    map: PositionMap,
}

/// Stored positions by (source, partition key).
pub(crate) type PositionMap = std::collections::BTreeMap<(String, String), i64>;

/// "source `s` k=p, …", for messages (at most a few).
fn describe_positions(map: &PositionMap) -> String {
    if map.is_empty() {
        return "none".into();
    }
    let mut parts: Vec<String> = map.iter().take(4).map(|((s, k), p)| format!("`{s}` {k}: {p}")).collect();
    if map.len() > 4 {
        parts.push(format!("{} more", map.len() - 4));
    }
    parts.join(", ")
}

/// A partition's key in the table: its name outside Weibo where the source
/// gives one (`topic/partition` for Kafka: a task of a `KafkaGroup`
/// numbers its partitions from 0 whatever they are), or its number.
fn partition_key(e: &SourcePositionEntry) -> String {
    e.partition_name.clone().unwrap_or_else(|| format!("#{}", e.partition))
}

impl StoredPositions {
    fn of<T>(inner: &Inner<T>, entries: &[SourcePositionEntry]) -> Result<Self> {
        let mut s = Self {
            sources: vec![],
            keys: vec![],
            partitions: vec![],
            names: vec![],
            positions: vec![],
            map: PositionMap::new(),
        };
        for e in entries {
            let key = partition_key(e);
            let (Ok(partition), Ok(position)) = (i32::try_from(e.partition), i64::try_from(e.position)) else {
                return Err(inner.err(format!(
                    "cannot store the position of source `{}` partition {key}: partition {} or position {} is out of \
                     Postgres's range",
                    e.source, e.partition, e.position
                )));
            };
            if s.map.insert((e.source.clone(), key.clone()), position).is_some() {
                return Err(inner
                    .err(format!("cannot store the positions: source `{}` names two partitions `{key}`", e.source)));
            }
            s.sources.push(e.source.clone());
            s.keys.push(key);
            s.partitions.push(partition);
            s.names.push(e.partition_name.clone());
            s.positions.push(position);
        }
        Ok(s)
    }

    /// The sink's stored positions, locked for this transaction (one
    /// writer of the sink's positions at a time).
    async fn current<T>(
        &self,
        inner: &Inner<T>,
        tx: &tokio_postgres::Transaction<'_>,
    ) -> std::result::Result<PositionMap, Attempt> {
        let table = inner.qualify(POSITIONS);
        let sql = |e| inner.attempt("read the stored source positions", e);
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            &[&format!("weibo-positions/{}", inner.id)],
        )
        .await
        .map_err(sql)?;
        let rows = tx
            .query(&format!("SELECT source, key, position FROM {table} WHERE sink = $1 FOR UPDATE"), &[&inner.id])
            .await
            .map_err(sql)?;
        let mut map = PositionMap::new();
        for r in &rows {
            map.insert((r.try_get(0).map_err(sql)?, r.try_get(1).map_err(sql)?), r.try_get(2).map_err(sql)?);
        }
        Ok(map)
    }

    async fn write<T>(
        &self,
        inner: &Inner<T>,
        tx: &tokio_postgres::Transaction<'_>,
    ) -> std::result::Result<(), Attempt> {
        let table = inner.qualify(POSITIONS);
        // Exactly the checkpoint's positions: those of a source no longer
        // in the job (renamed, removed) would be resumed from otherwise.
        tx.execute(
            &format!(
                "DELETE FROM {table} WHERE sink = $1 AND (source, key) NOT IN \
                 (SELECT * FROM unnest($2::text[], $3::text[]))"
            ),
            &[&inner.id, &self.sources, &self.keys],
        )
        .await
        .map_err(|e| inner.attempt("record the sources' positions", e))?;
        tx.execute(
            &format!(
                "INSERT INTO {table} (sink, source, key, partition, partition_name, position) \
                 SELECT $1, * FROM unnest($2::text[], $3::text[], $4::int4[], $5::text[], $6::int8[]) \
                 ON CONFLICT (sink, source, key) DO UPDATE SET partition = excluded.partition, \
                 partition_name = excluded.partition_name, position = excluded.position, committed_at = now()"
            ),
            &[&inner.id, &self.sources, &self.keys, &self.partitions, &self.names, &self.positions],
        )
        .await
        .map_err(|e| inner.attempt("record the sources' positions", e))?;
        Ok(())
    }
}

/// The positions stored for `inner`'s sink id.
pub(crate) async fn read_positions<T>(inner: &Inner<T>) -> Result<Vec<SourcePositionEntry>> {
    let table = inner.qualify(POSITIONS);
    let what = "read the stored source positions";
    let rows = retrying!(inner, what, |_attempt| {
        let client = inner.connect().await?;
        client
            .query(
                &format!(
                    "SELECT source, partition, partition_name, position, key FROM {table} WHERE sink = $1 \
                     ORDER BY source, partition, key"
                ),
                &[&inner.id],
            )
            .await
            .map_err(|e| inner.attempt(what, e))
    })?;
    let mut out = Vec::with_capacity(rows.len());
    let mut read = PositionMap::new();
    for r in &rows {
        let damaged = |e| inner.err_caused(format!("`{table}` holds a row it cannot have come from this sink"), e);
        let source: String = r.try_get(0).map_err(damaged)?;
        let partition: i32 = r.try_get(1).map_err(damaged)?;
        let partition_name: Option<String> = r.try_get(2).map_err(damaged)?;
        let position: i64 = r.try_get(3).map_err(damaged)?;
        let key: String = r.try_get(4).map_err(damaged)?;
        read.insert((source.clone(), key), position);
        let (Ok(partition), Ok(position)) = (u32::try_from(partition), u64::try_from(position)) else {
            return Err(inner.err(format!(
                "`{table}` holds a negative partition or position for source `{source}` ({partition}, {position})"
            )));
        };
        out.push(SourcePositionEntry { source, partition, position, partition_name });
    }
    // What this run resumes from: its first commit checks the table still
    // holds it (see `commit_handles`).
    *inner.expected_positions.lock().unwrap_or_else(PoisonError::into_inner) = Some(read);
    Ok(out)
}

/// What one epoch of a commit came to.
enum Step {
    /// Committed before.
    Done,
    /// Committed now, with so many rows dead-lettered.
    Applied(u64),
    /// Not yet: this earlier epoch of the same instance and run is owed.
    After(i64),
}

/// What a commit came to.
enum Committed {
    /// Committed (now or before), with so many rows dead-lettered.
    Done(u64),
    /// Not yet: this earlier epoch of the same instance and run is still
    /// owed, and goes first.
    After(i64),
}

/// Spools one chunk of an epoch. Idempotent: a retry after an attempt
/// whose outcome is unknown (the connection dropped around the commit)
/// finds the chunk there and adds nothing.
async fn spool_chunk<T>(inner: &Inner<T>, key: (i32, &str, i64, i32), chunk: &Chunk) -> Result<()> {
    let (instance, run, epoch, number) = key;
    let spool = inner.qualify(SPOOL);
    let origins = encode_origins(&chunk.origins);
    let refused = (!chunk.refused.is_empty()).then(|| refused_to_json(&chunk.refused));
    let body: &[u8] = &chunk.body;
    let sources: Vec<String> = chunk.sources.to_vec();
    retrying!(inner, "spool rows", |_attempt| {
        let client = inner.connect().await?;
        client
            .execute(
                &format!(
                    "INSERT INTO {spool} (sink, instance, run, epoch, chunk, body, origins, refused, sources) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING"
                ),
                &[&inner.id, &instance, &run, &epoch, &number, &body, &origins, &refused, &sources],
            )
            .await
            .map_err(|e| inner.attempt("spool rows", e))?;
        Ok(())
    })
}

/// Writes one instance's epochs into the spool.
struct TxnWriter<T> {
    inner: Arc<Inner<T>>,
    checked: Arc<Checked>,
    instance: usize,
    run: String,
    /// The epoch being written.
    epoch: u64,
    rows: Collector,
    /// How many chunks the epoch has spooled (or is spooling).
    chunks: u32,
    in_flight: Option<Pending<Result<()>>>,
    /// The session holding this instance's writer lock (see
    /// [`writer_lock`]); closing it releases the lock.
    _lock: LockSession,
}

impl<T: Send + 'static> TxnWriter<T> {
    fn wait(&mut self) -> Result<()> {
        match self.in_flight.take() {
            Some(p) => p.wait()?,
            None => Ok(()),
        }
    }

    /// Spools the full chunks, and the rest too when `all`.
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

    /// Spools `chunk` (after the one in flight is done).
    fn send(&mut self, chunk: Chunk) -> Result<()> {
        self.wait()?;
        let inner = Arc::clone(&self.inner);
        let instance = i32::try_from(self.instance).map_err(|_| inner.err("instance out of range"))?;
        let epoch = i64::try_from(self.epoch).map_err(|_| inner.err("epoch out of range"))?;
        let number = i32::try_from(self.chunks).map_err(|_| inner.err("too many chunks in one epoch"))?;
        let run = self.run.clone();
        self.inner
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add((self.instance, run.clone(), self.epoch), &chunk);
        self.in_flight =
            Some(self.inner.start(async move { spool_chunk(&inner, (instance, &run, epoch, number), &chunk).await }));
        self.chunks += 1;
        Ok(())
    }

    /// Spools what is left of the epoch and waits for it: the epoch is
    /// then durable in Postgres.
    fn seal(&mut self) -> Result<String> {
        self.inner.check_failed()?;
        self.ship(true)?;
        self.wait()?;
        Ok(Handle { instance: self.instance, epoch: self.epoch, run: self.run.clone(), chunks: self.chunks }.encode())
    }
}

impl<T: Send + 'static> TransactionWriter<T> for TxnWriter<T> {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        self.inner.check_failed()?;
        self.rows.add(&self.inner, &self.checked, batch)?;
        self.ship(false)
    }

    fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<String> {
        let handle = self.seal()?;
        self.epoch = checkpoint.next().get();
        self.chunks = 0;
        Ok(handle)
    }

    fn finish(&mut self) -> Result<String> {
        self.seal()
    }
}

impl<T: Send + 'static> PostgresSink<T> {
    /// Commits `handles` in one transaction, with `positions` if given.
    fn commit_many(&self, handles: &[String], positions: Option<Vec<SourcePositionEntry>>) -> Result<()> {
        let hs = handles
            .iter()
            .map(|h| {
                Handle::parse(h).ok_or_else(|| self.inner.err(format!("`{h}` is not a handle of a Postgres sink")))
            })
            .collect::<Result<Vec<_>>>()?;
        if hs.is_empty() {
            return Ok(());
        }
        let checked = self.inner.checked()?;
        let me = Arc::clone(&self.inner);
        let handle = handles.join(", ");
        let with_positions = positions.is_some();
        match self.inner.run(async move { me.commit_handles(&checked, &hs, positions.as_deref()).await })? {
            Ok(Committed::Done(dead)) => {
                self.inner.dead_lettered.fetch_add(dead, Ordering::Relaxed);
                Ok(())
            }
            Ok(Committed::After(earlier)) if with_positions => {
                // All of a checkpoint's handles come together, carried ones
                // first: an earlier epoch still owed was lost on the way.
                let e = self.inner.err(format!(
                    "`{handle}` cannot commit: epoch {earlier} of the same instance is still spooled and not among \
                     the handles committed with it"
                ));
                self.inner.fail(&e);
                Err(e)
            }
            Ok(Committed::After(earlier)) => Err(self.inner.err(format!(
                "`{handle}` waits for epoch {earlier} of the same instance, whose commit is owed: it is tried again with the next checkpoint"
            ))),
            Err(e) => {
                // Refused for good, or failing for longer than retry_for:
                // the writers fail the job with it.
                self.inner.fail(&e);
                Err(e)
            }
        }
    }
}

impl<T: Send + 'static> TwoPhaseCommitSink<T> for PostgresSink<T> {
    fn default_name(&self) -> String {
        self.inner.name.clone()
    }

    fn open(&self, instance: usize, _parallelism: usize, epoch: CheckpointId) -> Result<Box<dyn TransactionWriter<T>>> {
        let checked = self.inner.checked()?;
        let lock = writer_lock(&self.inner, instance)?;
        if epoch == CheckpointId::FIRST {
            // A fresh start: no checkpoint names any spooled epoch of this
            // instance, so what an earlier run left is garbage.
            let me = Arc::clone(&self.inner);
            let i = i32::try_from(instance).map_err(|_| self.inner.err("instance out of range"))?;
            let dropped = self.inner.run(async move {
                me.drop_spooled("drop an earlier run's spooled rows", "instance = $2 AND $3::int8 IS NOT NULL", i, 0)
                    .await
            })??;
            if dropped > 0 {
                tracing::info!(sink = %self.inner.name, instance, dropped, "dropped the spooled epochs an earlier run left");
            }
        }
        Ok(Box::new(TxnWriter {
            inner: Arc::clone(&self.inner),
            checked,
            instance,
            run: run_token(),
            epoch: epoch.get(),
            rows: Collector::new(),
            chunks: 0,
            in_flight: None,
            _lock: lock,
        }))
    }

    fn commit(&self, handle: &str) -> Result<()> {
        self.commit_at(handle, &[])
    }

    fn commit_at(&self, handle: &str, _sources: &[SourcePositionEntry]) -> Result<()> {
        self.commit_many(&[handle.to_string()], None)
    }

    fn commits_positions(&self) -> bool {
        self.inner.store_positions
    }

    fn commit_checkpoint(&self, handles: &[String], sources: &[SourcePositionEntry]) -> Result<()> {
        if !self.inner.store_positions {
            return handles.iter().try_for_each(|h| self.commit_at(h, sources));
        }
        if sources.is_empty() && !handles.is_empty() {
            // Rows without their positions would be read again by a job
            // resuming from the stored ones.
            return Err(self.inner.err(format!(
                "cannot commit {} epochs: their checkpoint's source positions are not known",
                handles.len()
            )));
        }
        self.commit_many(handles, Some(sources.to_vec()))
    }

    fn abort_after(&self, checkpoint: CheckpointId) -> Result<u64> {
        // Called before any writer opens: the check creates the spool.
        self.inner.checked()?;
        self.inner.cache.lock().unwrap_or_else(PoisonError::into_inner).clear();
        let me = Arc::clone(&self.inner);
        let after = i64::try_from(checkpoint.get()).unwrap_or(i64::MAX);
        self.inner.run(async move {
            me.drop_spooled(
                "drop the spooled epochs after the restored checkpoint",
                "$2::int4 IS NOT NULL AND epoch > $3",
                0,
                after,
            )
            .await
        })?
    }
}

/// A session of its own, kept open while a writer lives.
struct LockSession {
    _client: deadpool_postgres::ClientWrapper,
}

/// Takes instance `instance`'s writer lock (a session advisory lock on
/// the sink's id and the instance): one writer per sink instance at a time,
/// whatever process it runs in. A second (a process that lost its work but
/// still runs, or another job given the same id) waits until the first one's
/// session ends, for up to the retry limit (`with_retry_for`), then fails naming the id.
fn writer_lock<T: Send + 'static>(inner: &Arc<Inner<T>>, instance: usize) -> Result<LockSession> {
    let me = Arc::clone(inner);
    let key = format!("weibo-writer/{}/{instance}", inner.id);
    let client = inner.run(async move {
        let inner = &*me;
        let mut logged = false;
        retrying!(inner, "take the sink instance's writer lock", |_attempt| {
            let client = inner.connect().await?;
            let got: bool = client
                .query_one("SELECT pg_try_advisory_lock(hashtextextended($1, 0))", &[&key])
                .await
                .map_err(|e| inner.attempt("take the sink instance's writer lock", e))?
                .get(0);
            if got {
                return Ok(deadpool_postgres::Object::take(client));
            }
            if !logged {
                logged = true;
                tracing::warn!(sink = %inner.name, instance, id = %inner.id, "another writer of this sink instance runs (an older process of this job, or another job with the same sink id): waiting for it to end");
            }
            Err(Attempt::Retry(format!(
                "another writer holds sink id `{}` instance {instance} (an older process of this job still running, or another job given the same id)",
                inner.id
            )))
        })
    })??;
    Ok(LockSession { _client: client })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_strangers_are_refused() {
        let h = Handle { instance: 3, epoch: 17, run: "00ab12cd00ab12cd00ab12cd00ab12cd".into(), chunks: 4 };
        assert_eq!(Handle::parse(&h.encode()), Some(h));
        for bad in [
            "",
            "pg2:",
            "pg2:1:2:zz:1",
            "pg2:1:2:ab:x",
            "pg2:1:2:ab:1:x",
            "part-0-1.jsonl",
            "pg2:a:2:ab:1",
            "pg1:1:2:ab:1",
        ] {
            assert_eq!(Handle::parse(bad), None, "{bad}");
        }
        assert_eq!(run_token().len(), 32);
        assert_ne!(run_token(), run_token());
    }
}
