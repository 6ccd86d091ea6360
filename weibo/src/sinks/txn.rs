//! Exactly-once sinks: two-phase commit tied to checkpoints.
//!
//! A [`TwoPhaseCommitSink`] writes each checkpoint epoch (the records
//! between two barriers) into a transaction. At barrier `n` the writer
//! *pre-commits* (makes the epoch durable but invisible) and returns a
//! handle; the handles are recorded in checkpoint `n`'s manifest, and once
//! the manifest is published the sink *commits* them. `commit` must be
//! idempotent: after a crash between publishing and committing, the job
//! restores checkpoint `n` and commits its handles again. On restore the
//! sink also discards what was pre-committed after the restored checkpoint,
//! since those records are read again.
//!
//! At the end of input, a job with checkpoints takes a final checkpoint
//! (see `Job::with_checkpoints`): its barrier pre-commits each writer's
//! last epoch, and its completion commits every epoch still pending,
//! together with the final positions of the sources. Nothing is committed
//! that a complete checkpoint does not cover, so a restart never writes
//! anything twice, whether the job had finished or not. Without
//! checkpoints the whole input is one epoch, committed when the writer
//! reaches the end of its input.

use std::fmt;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError};

use serde::Serialize;

use crate::checkpoint::SourcePositionEntry;
use crate::checkpoint::commit::{Committer, Prepared};
use crate::error::{Error, Result};
use crate::record::CheckpointId;
use crate::sinks::SinkBatch;

/// A sink that commits in two phases, in step with checkpoints.
pub trait TwoPhaseCommitSink<T>: Send + Sync + 'static {
    /// The sink's name in the job.
    fn default_name(&self) -> String;

    /// Opens instance `instance` of `parallelism`, whose first epoch is
    /// `epoch` (one after the checkpoint the job restored from, or 1).
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::Connector`] when the sink cannot be opened.
    fn open(&self, instance: usize, parallelism: usize, epoch: CheckpointId) -> Result<Box<dyn TransactionWriter<T>>>;

    /// Makes a pre-committed transaction visible. Must be idempotent.
    ///
    /// # Errors
    /// When committing fails (the checkpoint stays complete; the commit is
    /// retried on restore).
    fn commit(&self, handle: &str) -> Result<()>;

    /// Commits `handle`, pre-committed for the checkpoint whose sources
    /// stood at `sources` (every source partition's position in that
    /// checkpoint's manifest): a sink can commit them with its records,
    /// as the Kafka sink does with consumed offsets. `sources` is empty
    /// when they are not known (end of input, a commit retried later).
    /// The default ignores them.
    ///
    /// # Errors
    /// As [`TwoPhaseCommitSink::commit`].
    fn commit_at(&self, handle: &str, sources: &[SourcePositionEntry]) -> Result<()> {
        let _ = sources;
        self.commit(handle)
    }

    /// Whether this sink records the sources' positions with its records
    /// (as the Postgres sink's `store_source_positions` does), so that a
    /// restarted job can take them from the sink instead of from a
    /// checkpoint. Then the job hands it every handle a completed
    /// checkpoint commits at once, carried ones included, with that
    /// checkpoint's positions ([`TwoPhaseCommitSink::commit_checkpoint`]),
    /// and refuses to run without checkpoints (the positions come from
    /// them). The default is `false`.
    fn commits_positions(&self) -> bool {
        false
    }

    /// Commits `handles`, every handle of this sink that a completed
    /// checkpoint makes visible (those carried from earlier checkpoints
    /// whose commit failed first), together with the sources' positions
    /// of that checkpoint, `sources`: all of them become visible with the
    /// positions, or none. Called instead of
    /// [`TwoPhaseCommitSink::commit_at`] when
    /// [`TwoPhaseCommitSink::commits_positions`] says so; also on restore,
    /// with the restored checkpoint's handles and positions. The default
    /// commits each handle in turn with `commit_at`.
    ///
    /// # Errors
    /// As [`TwoPhaseCommitSink::commit`]; on an error the job retries all
    /// of `handles` with the next checkpoint.
    fn commit_checkpoint(&self, handles: &[String], sources: &[SourcePositionEntry]) -> Result<()> {
        handles.iter().try_for_each(|h| self.commit_at(h, sources))
    }

    /// Discards everything pre-committed for epochs after `checkpoint`
    /// (called on restore, before anything runs). Returns how many
    /// transactions (pre-committed or still open) it discarded, as far as
    /// it can tell (the job's metrics count them as aborted; 0 when it
    /// cannot say).
    ///
    /// # Errors
    /// When the sink's storage fails.
    fn abort_after(&self, checkpoint: CheckpointId) -> Result<u64>;
}

/// Writes one instance's transactions.
pub trait TransactionWriter<T>: Send {
    /// Adds records to the current epoch's transaction.
    ///
    /// # Errors
    /// When writing fails.
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()>;

    /// Barrier `checkpoint` arrived: pre-commits the current epoch and
    /// starts the next; returns the handle to commit later.
    ///
    /// # Errors
    /// When the transaction cannot be made durable.
    fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<String>;

    /// The last epoch: pre-commits it and returns its handle, starting no
    /// other. Called at the first barrier after the writer's input ended
    /// (the final checkpoint's, or an earlier checkpoint's when this
    /// sink's input ended before the job's), whose completion commits the
    /// handle; in a job without checkpoints, at the end of input, and the
    /// handle is committed at once.
    ///
    /// # Errors
    /// As [`TransactionWriter::pre_commit`].
    fn finish(&mut self) -> Result<String>;

    /// The job's buffer timeout passed (nothing needs to become visible:
    /// commits do that). A writer that closes files by age looks at them
    /// here. The default does nothing.
    ///
    /// # Errors
    /// As [`TransactionWriter::write`].
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }
}

pub(crate) struct SinkCommitter<T, S> {
    pub(crate) sink: Arc<S>,
    pub(crate) prepared: Arc<Prepared>,
    pub(crate) _t: PhantomData<fn(T)>,
}

impl<T: 'static, S: TwoPhaseCommitSink<T>> Committer for SinkCommitter<T, S> {
    fn take_prepared(&self, n: CheckpointId) -> Vec<String> {
        let mut all = self.prepared.by_checkpoint.lock().unwrap_or_else(PoisonError::into_inner);
        let later = all.split_off(&n.next());
        let done = std::mem::replace(&mut *all, later);
        done.into_values().flatten().collect()
    }

    fn commit(&self, handle: &str, sources: &[SourcePositionEntry]) -> Result<()> {
        self.sink.commit_at(handle, sources)
    }

    fn together(&self) -> bool {
        self.sink.commits_positions()
    }

    fn commit_all(&self, handles: &[String], sources: &[SourcePositionEntry]) -> Result<()> {
        self.sink.commit_checkpoint(handles, sources)
    }

    fn abort_after(&self, checkpoint: CheckpointId) -> Result<u64> {
        self.sink.abort_after(checkpoint)
    }
}

/// The chain end of an exactly-once sink: writes, and pre-commits at
/// barriers; without checkpoints, commits its one epoch at the end of
/// input.
pub(crate) struct TxnSinkWriter<T, S> {
    pub(crate) sink: Arc<S>,
    pub(crate) writer: Box<dyn TransactionWriter<T>>,
    pub(crate) prepared: Arc<Prepared>,
    /// Whether the job takes checkpoints (then the coordinator commits).
    pub(crate) checkpointed: bool,
    /// The input has ended: the next barrier pre-commits the last epoch.
    pub(crate) ended: bool,
    /// The last epoch is pre-committed: later barriers find nothing.
    pub(crate) sealed: bool,
}

impl<T: Send + 'static, S: TwoPhaseCommitSink<T>> crate::sinks::SinkWriter<T> for TxnSinkWriter<T, S> {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        self.writer.write(batch)
    }

    fn on_barrier(&mut self, checkpoint: CheckpointId) -> Result<()> {
        if self.sealed {
            return Ok(());
        }
        crate::checkpoint::faults::point("pre-commit-before");
        let handle = if self.ended {
            self.sealed = true;
            self.writer.finish()?
        } else {
            self.writer.pre_commit(checkpoint)?
        };
        self.prepared
            .by_checkpoint
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(checkpoint)
            .or_default()
            .push(handle);
        crate::checkpoint::faults::point("pre-commit-after");
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.ended {
            return Ok(());
        }
        self.writer.flush()
    }

    fn finish(&mut self) -> Result<()> {
        if self.checkpointed {
            // The last epoch stays open for the next barrier (the final
            // checkpoint's at the latest), which follows every record; the
            // checkpoint's completion commits it.
            self.ended = true;
            return Ok(());
        }
        // No checkpoints: the whole input was one epoch, and it is done.
        let last = self.writer.finish()?;
        crate::task::blocking(|| self.sink.commit(&last))
    }
}

/// Writes JSON lines into a directory, exactly once across crashes when
/// the job takes checkpoints: each instance writes each epoch into
/// `.pending/part-<instance>-<epoch>.jsonl`, and a committed epoch is
/// renamed to `part-<instance>-<epoch>.jsonl`. The committed files hold
/// every record of every completed checkpoint, each once.
///
/// Without checkpoints, every record goes into one epoch, committed at the
/// end of input. With checkpoints, the job's final checkpoint commits the
/// last epoch: until it completes, the end of the output is still pending.
#[derive(Clone)]
pub struct TxnFileSink {
    dir: PathBuf,
}

impl fmt::Debug for TxnFileSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxnFileSink").field("dir", &self.dir).finish()
    }
}

impl TxnFileSink {
    /// A sink writing into directory `dir` (created if needed).
    pub fn json_lines(dir: impl AsRef<Path>) -> Self {
        Self { dir: dir.as_ref().to_path_buf() }
    }

    fn pending(&self) -> PathBuf {
        self.dir.join(".pending")
    }

    fn io<'a>(&self, action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
        move |source| Error::Io { action, path: path.to_path_buf(), source }
    }

    /// The epoch of a file name `part-<instance>-<epoch>.jsonl`.
    fn epoch_of(name: &str) -> Option<CheckpointId> {
        name.strip_prefix("part-")?.strip_suffix(".jsonl")?.rsplit('-').next()?.parse().ok().map(CheckpointId::new)
    }
}

impl<T: Serialize + Send + 'static> TwoPhaseCommitSink<T> for TxnFileSink {
    fn default_name(&self) -> String {
        self.dir.display().to_string()
    }

    fn open(&self, instance: usize, _parallelism: usize, epoch: CheckpointId) -> Result<Box<dyn TransactionWriter<T>>> {
        let pending = self.pending();
        fs::create_dir_all(&pending).map_err(self.io("cannot create output directory", &pending))?;
        let mut w = TxnFileWriter { sink: self.clone(), instance, epoch, file: None, buf: Vec::new(), _t: PhantomData };
        w.start()?;
        Ok(Box::new(w))
    }

    fn commit(&self, handle: &str) -> Result<()> {
        let from = self.pending().join(handle);
        let to = self.dir.join(handle);
        match fs::rename(&from, &to) {
            Ok(()) => {
                if let Ok(d) = File::open(&self.dir) {
                    let _ = d.sync_all();
                }
                Ok(())
            }
            // Committed before (the rename happened, then the job restarted).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && to.is_file() => Ok(()),
            Err(e) => Err(Error::Io { action: "cannot commit output file", path: from, source: e }),
        }
    }

    fn abort_after(&self, checkpoint: CheckpointId) -> Result<u64> {
        let pending = self.pending();
        let mut discarded = 0;
        for entry in fs::read_dir(&pending).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if Self::epoch_of(&name).is_some_and(|e| e > checkpoint) {
                let path = entry.path();
                fs::remove_file(&path).map_err(self.io("cannot discard pending output", &path))?;
                discarded += 1;
            }
        }
        Ok(discarded)
    }
}

struct TxnFileWriter<T> {
    sink: TxnFileSink,
    instance: usize,
    /// The epoch being written: records after barrier `epoch - 1`.
    epoch: CheckpointId,
    file: Option<BufWriter<File>>,
    buf: Vec<u8>,
    _t: PhantomData<fn(T)>,
}

impl<T> TxnFileWriter<T> {
    fn name(&self) -> String {
        format!("part-{}-{:020}.jsonl", self.instance, self.epoch.get())
    }

    fn start(&mut self) -> Result<()> {
        let path = self.sink.pending().join(self.name());
        let f = File::create(&path).map_err(self.sink.io("cannot create pending output", &path))?;
        self.file = Some(BufWriter::new(f));
        Ok(())
    }

    /// Makes the current epoch durable and returns its file name.
    fn seal(&mut self) -> Result<String> {
        let name = self.name();
        let path = self.sink.pending().join(&name);
        if let Some(f) = self.file.take() {
            let f = f.into_inner().map_err(|e| Error::Io {
                action: "cannot write pending output",
                path: path.clone(),
                source: e.into_error(),
            })?;
            f.sync_all().map_err(self.sink.io("cannot sync pending output", &path))?;
        }
        Ok(name)
    }
}

impl<T: Serialize + Send> TransactionWriter<T> for TxnFileWriter<T> {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        for v in batch.drain() {
            serde_json::to_writer(&mut self.buf, &v).map_err(|e| Error::Connector {
                name: self.sink.dir.display().to_string(),
                message: format!("cannot write a record as JSON: {e}"),
                source: None,
            })?;
            self.buf.push(b'\n');
        }
        let path = self.sink.pending().join(self.name());
        if let Some(f) = self.file.as_mut() {
            f.write_all(&self.buf).map_err(self.sink.io("cannot write pending output", &path))?;
        }
        self.buf.clear();
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<String> {
        let name = self.seal()?;
        self.epoch = checkpoint.next();
        self.start()?;
        Ok(name)
    }

    fn finish(&mut self) -> Result<String> {
        self.seal()
    }
}
