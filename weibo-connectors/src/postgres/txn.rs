//! Exactly once: staging tables per epoch, merged at commit with a
//! progress row in the same transaction.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use weibo::Result;
use weibo::checkpoint::SourcePositionEntry;
use weibo::record::CheckpointId;
use weibo::sinks::{SinkBatch, TransactionWriter, TwoPhaseCommitSink};

use super::write::{Attempt, Collector, copy_rows, merge, retrying};
use super::{Checked, Inner, Pending, PostgresSink};

/// The table of committed epochs: a row `(sink, instance, run, epoch)`
/// for each of the last [`KEEP_PROGRESS`] epochs of each instance and run.
pub(crate) const PROGRESS: &str = "weibo_sink_progress";
/// How many epochs back a commit can be retried and still be recognised
/// by its own progress row.
const KEEP_PROGRESS: i64 = 1000;

/// A pre-committed epoch: what its commit needs.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Handle {
    pub(crate) instance: usize,
    pub(crate) epoch: u64,
    /// The run that wrote it (a new token each time the job starts).
    pub(crate) run: String,
    /// Whether it staged any row (an epoch without rows has no table).
    pub(crate) rows: bool,
}

impl Handle {
    pub(crate) fn encode(&self) -> String {
        format!("pg1:{}:{}:{}:{}", self.instance, self.epoch, self.run, u8::from(self.rows))
    }

    pub(crate) fn parse(h: &str) -> Option<Self> {
        let mut parts = h.strip_prefix("pg1:")?.split(':');
        let instance = parts.next()?.parse().ok()?;
        let epoch = parts.next()?.parse().ok()?;
        let run = parts.next()?.to_string();
        let rows = match parts.next()? {
            "0" => false,
            "1" => true,
            _ => return None,
        };
        if parts.next().is_some() || run.is_empty() || !run.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(Handle { instance, epoch, run, rows })
    }
}

/// FNV-1a of `s`, for short table names.
fn fnv(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h
}

/// A fresh run token: 8 hex digits from the clock and the process id.
fn run_token() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:08x}", fnv(&format!("{nanos}-{}", std::process::id())))
}

impl<T> Inner<T> {
    /// The prefix of this sink's staging tables.
    fn stage_prefix(&self) -> String {
        format!("weibo_s{:08x}_", fnv(&self.id))
    }

    /// The staging table of one epoch of one instance and run (unquoted).
    fn stage_name(&self, instance: usize, epoch: u64, run: &str) -> String {
        format!("{}{instance}_{epoch}_{run}", self.stage_prefix())
    }

    /// This sink's staging tables: `(name, instance, epoch)`.
    async fn stages(&self, client: &tokio_postgres::Client) -> std::result::Result<Vec<(String, usize, u64)>, Attempt> {
        let prefix = self.stage_prefix();
        let rows = client
            .query(
                "SELECT tablename::text FROM pg_tables WHERE schemaname = coalesce($1, current_schema()) \
                 AND starts_with(tablename, $2)",
                &[&self.table.schema, &prefix],
            )
            .await
            .map_err(|e| self.attempt("list the staging tables", e))?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let name: String = r.get(0);
                let mut parts = name.strip_prefix(&prefix)?.split('_');
                let instance = parts.next()?.parse().ok()?;
                let epoch = parts.next()?.parse().ok()?;
                Some((name, instance, epoch))
            })
            .collect())
    }

    /// Drops the staging tables `keep` says no to; returns how many.
    async fn drop_stages(&self, what: &str, keep: impl Fn(usize, u64) -> bool + Send) -> Result<u64> {
        retrying!(self, what, |_attempt| {
            let client = self.connect().await?;
            let mut dropped = 0;
            for (name, instance, epoch) in self.stages(&client).await? {
                if !keep(instance, epoch) {
                    client
                        .batch_execute(&format!("DROP TABLE IF EXISTS {}", self.table.qualify(&name)))
                        .await
                        .map_err(|e| self.attempt(what, e))?;
                    dropped += 1;
                }
            }
            Ok(dropped)
        })
    }

    /// Commits handle `h`: merges its staging table into the target, drops
    /// it and records the epoch, in one transaction; nothing when the
    /// progress table says it is committed already. Epochs are recorded
    /// one by one (not as a high-water mark): a commit that failed is
    /// retried after later epochs of the same instance committed.
    async fn commit_handle(&self, checked: &Checked, h: &Handle) -> Result<u64> {
        let stage = self.table.qualify(&self.stage_name(h.instance, h.epoch, &h.run));
        let instance =
            i32::try_from(h.instance).map_err(|_| self.err(format!("instance {} out of range", h.instance)))?;
        let epoch = i64::try_from(h.epoch).map_err(|_| self.err(format!("epoch {} out of range", h.epoch)))?;
        let progress = self.table.qualify(PROGRESS);
        retrying!(self, "commit an epoch", |_attempt| {
            let mut client = self.connect().await?;
            let sql = |e| self.attempt("commit an epoch", e);
            let tx = tokio_postgres::Client::transaction(&mut client).await.map_err(sql)?;
            // One committer per sink instance at a time (a stale process
            // committing the same epoch waits, then finds it done).
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                &[&format!("weibo/{}/{instance}", self.id)],
            )
            .await
            .map_err(sql)?;
            let done = tx
                .query_opt(
                    &format!("SELECT 1 FROM {progress} WHERE sink = $1 AND instance = $2 AND run = $3 AND epoch = $4"),
                    &[&self.id, &instance, &h.run, &epoch],
                )
                .await
                .map_err(sql)?
                .is_some();
            if done {
                return Ok(0);
            }
            let mut dead = 0;
            if h.rows {
                let exists: bool =
                    tx.query_one("SELECT to_regclass($1) IS NOT NULL", &[&stage]).await.map_err(sql)?.get(0);
                if exists {
                    dead = merge(self, checked, &tx, &stage, instance, epoch).await?;
                    tx.batch_execute(&format!("DROP TABLE {stage}")).await.map_err(sql)?;
                } else {
                    // Committed so long ago that its progress row is
                    // pruned (a handle of an old savepoint), or lost.
                    let oldest: Option<i64> = tx
                        .query_one(
                            &format!(
                                "SELECT min(epoch) FROM {progress} WHERE sink = $1 AND instance = $2 AND run = $3"
                            ),
                            &[&self.id, &instance, &h.run],
                        )
                        .await
                        .map_err(sql)?
                        .get(0);
                    if oldest.is_some_and(|o| o > epoch) {
                        tracing::info!(sink = %self.name, instance, epoch, "epoch committed long ago (its progress row is pruned): nothing to do");
                        return Ok(0);
                    }
                    return Err(Attempt::Fail(self.err(format!(
                        "cannot commit epoch {epoch} of instance {instance}: its staging table {stage} is gone and \
                         `{progress}` does not record the epoch as committed (was the table dropped by hand, or \
                         another job given the same sink id `{}`?)",
                        self.id
                    ))));
                }
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
            tx.commit().await.map_err(sql)?;
            weibo::checkpoint::faults::point("postgres-after-commit");
            Ok(dead)
        })
    }
}

/// Stages one chunk of an epoch (creating the epoch's table with the
/// first), in one transaction. A retry after an attempt whose outcome is
/// unknown (the connection dropped around the commit) first looks whether
/// the chunk is there.
async fn stage_chunk<T>(
    inner: &Inner<T>,
    checked: &Checked,
    stage: &str,
    chunk: &super::write::Chunk<T>,
) -> Result<()> {
    let lo = i64::from(chunk.number) << 32;
    let hi = (i64::from(chunk.number) + 1) << 32;
    retrying!(inner, "stage rows", |attempt| {
        let mut client = inner.connect().await?;
        let sql = |e| inner.attempt("stage rows", e);
        let tx = tokio_postgres::Client::transaction(&mut client).await.map_err(sql)?;
        tx.batch_execute(&format!("CREATE TABLE IF NOT EXISTS {stage} ({})", checked.stage_ddl)).await.map_err(sql)?;
        if attempt > 0 {
            let there: bool = tx
                .query_one(
                    &format!("SELECT EXISTS (SELECT 1 FROM {stage} WHERE weibo_seq >= $1 AND weibo_seq < $2)"),
                    &[&lo, &hi],
                )
                .await
                .map_err(sql)?
                .get(0);
            if there {
                return Ok(());
            }
        }
        copy_rows(inner, &tx, stage, chunk).await?;
        tx.commit().await.map_err(sql)
    })
}

/// Writes one instance's epochs into staging tables.
struct TxnWriter<T> {
    inner: Arc<Inner<T>>,
    checked: Arc<Checked>,
    instance: usize,
    run: String,
    /// The epoch being written.
    epoch: u64,
    rows: Collector<T>,
    /// Whether the epoch has staged a chunk.
    staged: bool,
    in_flight: Option<Pending<Result<()>>>,
}

impl<T: Send + 'static> TxnWriter<T> {
    fn wait(&mut self) -> Result<()> {
        match self.in_flight.take() {
            Some(p) => p.wait()?,
            None => Ok(()),
        }
    }

    fn ship(&mut self) -> Result<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        self.wait()?;
        let chunk = self.rows.take();
        let stage = self.inner.table.qualify(&self.inner.stage_name(self.instance, self.epoch, &self.run));
        let (inner, checked) = (Arc::clone(&self.inner), Arc::clone(&self.checked));
        self.in_flight = Some(self.inner.start(async move { stage_chunk(&inner, &checked, &stage, &chunk).await }));
        self.staged = true;
        Ok(())
    }

    /// Stages what is left of the epoch and waits for it: the epoch is
    /// then durable in Postgres.
    fn seal(&mut self) -> Result<String> {
        self.ship()?;
        self.wait()?;
        Ok(Handle { instance: self.instance, epoch: self.epoch, run: self.run.clone(), rows: self.staged }.encode())
    }
}

impl<T: Send + 'static> TransactionWriter<T> for TxnWriter<T> {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        self.rows.add(&self.inner, &self.checked, batch)?;
        if self.rows.full(&self.inner) {
            self.ship()?;
        }
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<String> {
        let handle = self.seal()?;
        self.epoch = checkpoint.next().get();
        self.rows.chunk = 0;
        self.staged = false;
        Ok(handle)
    }

    fn finish(&mut self) -> Result<String> {
        self.seal()
    }
}

impl<T: Send + 'static> TwoPhaseCommitSink<T> for PostgresSink<T> {
    fn default_name(&self) -> String {
        self.inner.name.clone()
    }

    fn open(&self, instance: usize, _parallelism: usize, epoch: CheckpointId) -> Result<Box<dyn TransactionWriter<T>>> {
        let checked = self.inner.checked()?;
        if epoch == CheckpointId::FIRST {
            // A fresh start: no checkpoint names any staged epoch of this
            // instance, so what an earlier run left is garbage.
            let me = Arc::clone(&self.inner);
            let dropped = self.inner.run(async move {
                me.drop_stages("drop an earlier run's staging tables", |i, _| i != instance).await
            })??;
            if dropped > 0 {
                tracing::info!(sink = %self.inner.name, instance, dropped, "dropped staging tables an earlier run left");
            }
        }
        Ok(Box::new(TxnWriter {
            inner: Arc::clone(&self.inner),
            checked,
            instance,
            run: run_token(),
            epoch: epoch.get(),
            rows: Collector::new(),
            staged: false,
            in_flight: None,
        }))
    }

    fn commit(&self, handle: &str) -> Result<()> {
        self.commit_at(handle, &[])
    }

    fn commit_at(&self, handle: &str, _sources: &[SourcePositionEntry]) -> Result<()> {
        let h = Handle::parse(handle)
            .ok_or_else(|| self.inner.err(format!("`{handle}` is not a handle of a Postgres sink")))?;
        let checked = self.inner.checked()?;
        let me = Arc::clone(&self.inner);
        let dead = self.inner.run(async move { me.commit_handle(&checked, &h).await })??;
        self.inner.dead_lettered.fetch_add(dead, Ordering::Relaxed);
        Ok(())
    }

    fn abort_after(&self, checkpoint: CheckpointId) -> Result<u64> {
        let me = Arc::clone(&self.inner);
        let after = checkpoint.get();
        self.inner.run(async move {
            me.drop_stages("drop staging tables after the restored checkpoint", |_, e| e <= after).await
        })?
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_strangers_are_refused() {
        let h = Handle { instance: 3, epoch: 17, run: "00ab12cd".into(), rows: true };
        assert_eq!(Handle::parse(&h.encode()), Some(h));
        for bad in ["", "pg1:", "pg1:1:2:zz:1", "pg1:1:2:ab:2", "pg1:1:2:ab:1:x", "part-0-1.jsonl", "pg1:a:2:ab:1"] {
            assert_eq!(Handle::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn table_names_stay_within_postgres_limit() {
        let name = format!("weibo_s{:08x}_{}_{}_{}", fnv("x"), usize::MAX, u64::MAX, run_token());
        assert!(name.len() <= 63, "{name}");
    }
}
