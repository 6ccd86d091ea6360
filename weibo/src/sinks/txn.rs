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
use std::time::{Duration, Instant};

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

    /// Commits `handles`, every handle of this sink the checkpoint a job
    /// restores from names (its own and those it carried from earlier
    /// checkpoints whose commit failed, oldest first), before the job
    /// runs: what the checkpoint made visible, or was about to, done again.
    /// Called instead of [`TwoPhaseCommitSink::commit`] on restore (a sink
    /// whose handles also record work in progress at the barrier finishes
    /// it here). The default commits each handle in turn.
    ///
    /// # Errors
    /// As [`TwoPhaseCommitSink::commit`]; the restore fails.
    fn commit_restored(&self, handles: &[String]) -> Result<()> {
        handles.iter().try_for_each(|h| self.commit(h))
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
    /// starts the next; returns the handle to commit later (empty: the
    /// epoch has nothing to commit, and no handle is recorded).
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

    fn commit_restored(&self, handles: &[String]) -> Result<()> {
        self.sink.commit_restored(handles)
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
        if handle.is_empty() {
            // Nothing to commit for this epoch.
            crate::checkpoint::faults::point("pre-commit-after");
            return Ok(());
        }
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
        if last.is_empty() {
            return Ok(());
        }
        crate::task::blocking(|| self.sink.commit(&last))
    }
}

/// Writes JSON lines into a directory, exactly once across crashes when
/// the job takes checkpoints.
///
/// Each instance writes its records into **parts**: files under
/// `<dir>/.pending/`, named `part-<instance>-<epoch>-<run>-<n>.jsonl`
/// (the epoch it was opened in, the token of the run that wrote it, and a
/// number), created when the first record arrives (an epoch without
/// records writes no file). A committed part is moved to `<dir>/` under
/// the same name, once the checkpoint that covers its records has
/// completed. No two runs write the same name, and a commit never
/// replaces a file: it links the pending file under its final name (which
/// fails if the name is taken) and then removes the pending name. The
/// committed files hold every record of every completed checkpoint, each
/// once.
///
/// **When parts close.** By default a part closes at every checkpoint
/// barrier, so its records become visible as soon as their checkpoint
/// completes: one file per instance and checkpoint that had records.
/// [`TxnFileSink::with_roll_bytes`] and [`TxnFileSink::with_roll_interval`] close a
/// part earlier, by size or age. With
/// [`TxnFileSink::parts_span_checkpoints`], a part closes only by size or
/// age, not at barriers: fewer, larger files, visible later. An open part
/// then crosses checkpoints as an in-progress file (as Flink's `FileSink`
/// does): at a barrier it is made durable and its length recorded in the
/// checkpoint, and a job restored from that checkpoint cuts it to that
/// length and commits it.
///
/// Each commit checks the pending file against the length its checkpoint
/// recorded: a pending file that is missing (and was never committed),
/// shorter, or longer, is an error naming it, never a silent commit.
///
/// Without checkpoints, every record goes into one epoch, committed at the
/// end of input. With checkpoints, the job's final checkpoint commits the
/// last epoch: until it completes, the end of the output is still pending.
#[derive(Clone)]
pub struct TxnFileSink {
    dir: PathBuf,
    roll_bytes: Option<u64>,
    roll_interval: Option<Duration>,
    span_checkpoints: bool,
}

impl fmt::Debug for TxnFileSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxnFileSink")
            .field("dir", &self.dir)
            .field("roll_bytes", &self.roll_bytes)
            .field("roll_interval", &self.roll_interval)
            .field("span_checkpoints", &self.span_checkpoints)
            .finish()
    }
}

/// How long a part that spans checkpoints stays open unless an age is set.
const DEFAULT_SPANNING_INTERVAL: Duration = Duration::from_secs(60);

impl TxnFileSink {
    /// A sink writing into directory `dir` (created if needed).
    pub fn json_lines(dir: impl AsRef<Path>) -> Self {
        Self { dir: dir.as_ref().to_path_buf(), roll_bytes: None, roll_interval: None, span_checkpoints: false }
    }

    /// Closes a part once it holds `bytes` (at least 1), between barriers
    /// too: an epoch's records may then fill several parts.
    ///
    /// ```
    /// use std::time::Duration;
    /// let dir = tempfile::tempdir()?;
    /// let job = weibo::Job::new("rolling").with_checkpoints(dir.path().join("chk"), Duration::from_millis(50));
    /// job.source(weibo::sources::IterSource::new(0..100u32))
    ///     .sink_exactly_once(weibo::sinks::TxnFileSink::json_lines(dir.path().join("out")).with_roll_bytes(64));
    /// job.run_blocking()?;
    /// let parts = std::fs::read_dir(dir.path().join("out"))?.filter(|e| e.as_ref().is_ok_and(|e| e.path().is_file())).count();
    /// assert!(parts >= 4, "{parts} parts");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_roll_bytes(mut self, bytes: u64) -> Self {
        self.roll_bytes = Some(bytes.max(1));
        self
    }

    /// Closes a part once it has been open for `interval` (looked at when
    /// records arrive and when the job's buffer timeout flushes the sink).
    #[must_use]
    pub fn with_roll_interval(mut self, interval: Duration) -> Self {
        self.roll_interval = Some(interval);
        self
    }

    /// Keeps a part open across checkpoints until [`with_roll_bytes`] or
    /// [`with_roll_interval`] closes it (an age of 60 s unless `with_roll_interval`
    /// is set), as an in-progress file: see the [type's notes](Self). Its
    /// records become visible at the first checkpoint after it closes.
    ///
    /// [`with_roll_bytes`]: Self::with_roll_bytes
    /// [`with_roll_interval`]: Self::with_roll_interval
    #[must_use]
    pub fn parts_span_checkpoints(mut self) -> Self {
        self.span_checkpoints = true;
        self
    }

    fn pending(&self) -> PathBuf {
        self.dir.join(".pending")
    }

    fn io<'a>(&self, action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
        move |source| Error::Io { action, path: path.to_path_buf(), source }
    }

    fn refuse(&self, message: String) -> Error {
        Error::Connector { name: self.dir.display().to_string(), message, source: None }
    }

    /// The epoch of a part's name: `part-<instance>-<epoch>-<run>-<n>.jsonl`,
    /// or `part-<instance>-<epoch>.jsonl` as earlier builds named them.
    fn epoch_of(name: &str) -> Option<CheckpointId> {
        let rest = name.strip_prefix("part-")?.strip_suffix(".jsonl")?;
        let mut parts = rest.split('-');
        let _instance = parts.next()?;
        parts.next()?.parse().ok().map(CheckpointId::new)
    }

    /// Makes part `name` visible: links it under its final name and removes
    /// the pending one. `expected`: its length as its checkpoint recorded
    /// it (handles of earlier builds record none); `cut`: the part was in
    /// progress at the checkpoint, so what follows that length is cut off
    /// (records the restored job writes again).
    fn publish(&self, name: &str, expected: Option<u64>, cut: bool) -> Result<()> {
        let from = self.pending().join(name);
        let to = self.dir.join(name);
        let pending_len = match fs::metadata(&from) {
            Ok(m) => Some(m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::Io { action: "cannot read pending output", path: from, source: e }),
        };
        let Some(len) = pending_len else {
            // Published before (the commit is done again after a restart),
            // or gone.
            return match (fs::metadata(&to), expected) {
                (Ok(m), Some(b)) if (cut && m.len() < b) || (!cut && m.len() != b) => Err(self.refuse(format!(
                    "committed output {} holds {} bytes, but its checkpoint recorded {b}",
                    to.display(),
                    m.len()
                ))),
                (Ok(_), _) => Ok(()),
                (Err(e), expected) if e.kind() == std::io::ErrorKind::NotFound => Err(self.refuse(format!(
                    "pending output {} is missing, and was never committed as {}: its checkpoint recorded {}; the \
                     records it held are lost unless the file is put back",
                    from.display(),
                    to.display(),
                    expected.map_or_else(|| "it".to_string(), |b| format!("{b} bytes")),
                ))),
                (Err(e), _) => Err(Error::Io { action: "cannot read committed output", path: to, source: e }),
            };
        };
        if let Some(b) = expected {
            if len < b || (len > b && !cut) {
                return Err(self.refuse(format!(
                    "pending output {} holds {len} bytes, but its checkpoint recorded {b}: refusing to commit it",
                    from.display()
                )));
            }
            if len > b {
                let f = fs::OpenOptions::new()
                    .write(true)
                    .open(&from)
                    .map_err(self.io("cannot cut pending output", &from))?;
                f.set_len(b).map_err(self.io("cannot cut pending output", &from))?;
                f.sync_all().map_err(self.io("cannot sync pending output", &from))?;
            }
        }
        match fs::hard_link(&from, &to) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // Linked before, and the pending name not yet removed
                // (a crash in between), or a name collision.
                if !same_file(&from, &to) {
                    return Err(self.refuse(format!(
                        "cannot commit {}: {} exists already and is another file (committed output is never \
                         replaced)",
                        from.display(),
                        to.display()
                    )));
                }
            }
            // A file system without hard links: a rename, after making
            // sure the name is free (this run holds the job's storage).
            Err(e) if matches!(e.kind(), std::io::ErrorKind::Unsupported | std::io::ErrorKind::PermissionDenied) => {
                if to.exists() {
                    return Err(self.refuse(format!(
                        "cannot commit {}: {} exists already (committed output is never replaced)",
                        from.display(),
                        to.display()
                    )));
                }
                fs::rename(&from, &to).map_err(self.io("cannot commit output file", &from))?;
            }
            Err(e) => return Err(Error::Io { action: "cannot commit output file", path: from, source: e }),
        }
        sync_dir(&self.dir);
        match fs::remove_file(&from) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Error::Io {
                    action: "cannot remove committed output's pending name",
                    path: from,
                    source: e,
                });
            }
        }
        sync_dir(&self.pending());
        Ok(())
    }
}

/// Syncs a directory, so that a new or removed entry survives a crash of
/// the machine (best effort).
fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Whether `a` and `b` are the same file.
#[cfg(unix)]
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::read(a), fs::read(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// One part in a handle: its name and length, and whether it was still
/// open (in progress) at the barrier.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PartEntry {
    name: String,
    bytes: Option<u64>,
    in_progress: bool,
}

/// A handle: its parts separated by spaces, each `<name>@<bytes>`, or
/// `~<name>@<bytes>` for a part in progress; a bare `<name>` is a handle
/// of an earlier build (one file, length unknown).
fn parse_handle(handle: &str) -> Vec<PartEntry> {
    handle
        .split(' ')
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (in_progress, e) = match e.strip_prefix('~') {
                Some(rest) => (true, rest),
                None => (false, e),
            };
            match e.rsplit_once('@') {
                Some((name, bytes)) if bytes.parse::<u64>().is_ok() => {
                    PartEntry { name: name.to_string(), bytes: bytes.parse().ok(), in_progress }
                }
                _ => PartEntry { name: e.to_string(), bytes: None, in_progress },
            }
        })
        .collect()
}

impl PartEntry {
    fn encode(&self) -> String {
        let mark = if self.in_progress { "~" } else { "" };
        match self.bytes {
            Some(b) => format!("{mark}{}@{b}", self.name),
            None => format!("{mark}{}", self.name),
        }
    }
}

impl<T: Serialize + Send + 'static> TwoPhaseCommitSink<T> for TxnFileSink {
    fn default_name(&self) -> String {
        self.dir.display().to_string()
    }

    fn open(&self, instance: usize, _parallelism: usize, epoch: CheckpointId) -> Result<Box<dyn TransactionWriter<T>>> {
        let pending = self.pending();
        fs::create_dir_all(&pending).map_err(self.io("cannot create output directory", &pending))?;
        // A part that spans checkpoints closes by age at the latest, or a
        // quiet stream would keep its records invisible for ever.
        let roll_interval = match (self.span_checkpoints, self.roll_interval) {
            (true, None) => Some(DEFAULT_SPANNING_INTERVAL),
            (_, interval) => interval,
        };
        Ok(Box::new(TxnFileWriter {
            sink: self.clone(),
            roll_interval,
            instance,
            epoch,
            run: crate::checkpoint::run_token(),
            parts: 0,
            current: None,
            closed: Vec::new(),
            buf: Vec::new(),
            _t: PhantomData,
        }))
    }

    /// Publishes the handle's closed parts; a part in progress at the
    /// barrier is still being written, and waits.
    fn commit(&self, handle: &str) -> Result<()> {
        for part in parse_handle(handle).into_iter().filter(|p| !p.in_progress) {
            self.publish(&part.name, part.bytes, false)?;
        }
        Ok(())
    }

    /// Publishes every part the restored checkpoint names: closed ones as
    /// they are, those in progress at its barrier cut to the length it
    /// recorded. A part named in several handles (one carried from an
    /// earlier checkpoint whose commit failed) is taken as the newest
    /// handle has it.
    fn commit_restored(&self, handles: &[String]) -> Result<()> {
        let mut newest: Vec<PartEntry> = Vec::new();
        for part in handles.iter().flat_map(|h| parse_handle(h)) {
            match newest.iter_mut().find(|p| p.name == part.name) {
                Some(p) => *p = part,
                None => newest.push(part),
            }
        }
        for part in newest {
            self.publish(&part.name, part.bytes, part.in_progress)?;
        }
        Ok(())
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

/// The part being written.
struct Part {
    name: String,
    file: BufWriter<File>,
    bytes: u64,
    opened: Instant,
}

struct TxnFileWriter<T> {
    sink: TxnFileSink,
    /// When to close a part by age (the sink's setting, or the default of
    /// parts that span checkpoints).
    roll_interval: Option<Duration>,
    instance: usize,
    /// The epoch being written: records after barrier `epoch - 1`.
    epoch: CheckpointId,
    /// This writer's run token, in its parts' names.
    run: String,
    /// Parts opened so far (the next part's number).
    parts: u64,
    current: Option<Part>,
    /// Parts closed since the last barrier: the next handle's.
    closed: Vec<PartEntry>,
    buf: Vec<u8>,
    _t: PhantomData<fn(T)>,
}

impl<T> TxnFileWriter<T> {
    /// The open part, opened now if there is none.
    fn part(&mut self) -> Result<&mut Part> {
        if self.current.is_none() {
            let name = format!("part-{}-{:020}-{}-{}.jsonl", self.instance, self.epoch.get(), self.run, self.parts);
            let path = self.sink.pending().join(&name);
            // Never over another file: names are this run's alone.
            let f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(self.sink.io("cannot create pending output", &path))?;
            self.parts += 1;
            self.current = Some(Part { name, file: BufWriter::new(f), bytes: 0, opened: Instant::now() });
        }
        self.current.as_mut().ok_or_else(|| crate::error::internal_error!("no open part"))
    }

    /// Makes the open part durable; returns its entry (in progress).
    fn sync(&mut self) -> Result<Option<PartEntry>> {
        let Some(part) = self.current.as_mut() else { return Ok(None) };
        let path = self.sink.pending().join(&part.name);
        part.file.flush().map_err(self.sink.io("cannot write pending output", &path))?;
        part.file.get_ref().sync_data().map_err(self.sink.io("cannot sync pending output", &path))?;
        Ok(Some(PartEntry { name: part.name.clone(), bytes: Some(part.bytes), in_progress: true }))
    }

    /// Closes the open part: durable, and due for the next barrier's handle.
    fn close(&mut self) -> Result<()> {
        if let Some(mut entry) = self.sync()? {
            self.current = None;
            entry.in_progress = false;
            self.closed.push(entry);
        }
        Ok(())
    }

    /// Closes the open part if it is older than the roll interval.
    fn close_if_old(&mut self) -> Result<()> {
        let old = match (&self.current, self.roll_interval) {
            (Some(p), Some(i)) => p.opened.elapsed() >= i,
            _ => false,
        };
        if old { self.close() } else { Ok(()) }
    }

    /// The handle of what closed since the last barrier, and of the part
    /// still open (in progress) if there is one.
    fn handle(&mut self, open: Option<PartEntry>) -> String {
        let entries: Vec<String> = self.closed.drain(..).chain(open).map(|p| p.encode()).collect();
        entries.join(" ")
    }
}

impl<T> TxnFileWriter<T> {
    /// Writes the buffered lines into the open part (opening one), and
    /// closes it if that makes it full.
    fn drain(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let buf = std::mem::take(&mut self.buf);
        let pending = self.sink.pending();
        let roll_bytes = self.sink.roll_bytes;
        let part = self.part()?;
        let path = pending.join(&part.name);
        part.file.write_all(&buf).map_err(|source| Error::Io {
            action: "cannot write pending output",
            path,
            source,
        })?;
        part.bytes += buf.len() as u64;
        let full = roll_bytes.is_some_and(|max| part.bytes >= max);
        self.buf = buf;
        self.buf.clear();
        if full { self.close() } else { Ok(()) }
    }
}

impl<T: Serialize + Send> TransactionWriter<T> for TxnFileWriter<T> {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        let open = self.current.as_ref().map_or(0, |p| p.bytes);
        let mut room = self.sink.roll_bytes.map_or(u64::MAX, |max| max.saturating_sub(open));
        for v in batch.drain() {
            serde_json::to_writer(&mut self.buf, &v).map_err(|e| Error::Connector {
                name: self.sink.dir.display().to_string(),
                message: format!("cannot write a record as JSON: {e}"),
                source: None,
            })?;
            self.buf.push(b'\n');
            // A part full by size closes after the record that filled it.
            if self.buf.len() as u64 >= room {
                self.drain()?;
                room = self
                    .sink
                    .roll_bytes
                    .map_or(u64::MAX, |max| max.saturating_sub(self.current.as_ref().map_or(0, |p| p.bytes)));
            }
        }
        self.drain()?;
        self.close_if_old()
    }

    fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<String> {
        let open = if self.sink.span_checkpoints {
            self.close_if_old()?;
            self.sync()?
        } else {
            self.close()?;
            None
        };
        self.epoch = checkpoint.next();
        Ok(self.handle(open))
    }

    fn finish(&mut self) -> Result<String> {
        self.close()?;
        Ok(self.handle(None))
    }

    fn flush(&mut self) -> Result<()> {
        self.close_if_old()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn sink(dir: &Path) -> TxnFileSink {
        let s = TxnFileSink::json_lines(dir);
        fs::create_dir_all(s.pending()).unwrap();
        s
    }

    fn commit(s: &TxnFileSink, handle: &str) -> Result<()> {
        <TxnFileSink as TwoPhaseCommitSink<u32>>::commit(s, handle)
    }

    fn restored(s: &TxnFileSink, handles: &[&str]) -> Result<()> {
        let handles: Vec<String> = handles.iter().map(|h| (*h).to_string()).collect();
        <TxnFileSink as TwoPhaseCommitSink<u32>>::commit_restored(s, &handles)
    }

    #[test]
    fn handles_round_trip() {
        let parts = parse_handle("part-0-1-ab-0.jsonl@12 ~part-0-1-ab-1.jsonl@7 part-0-00000000000000000003.jsonl");
        assert_eq!(
            parts,
            vec![
                PartEntry { name: "part-0-1-ab-0.jsonl".into(), bytes: Some(12), in_progress: false },
                PartEntry { name: "part-0-1-ab-1.jsonl".into(), bytes: Some(7), in_progress: true },
                PartEntry { name: "part-0-00000000000000000003.jsonl".into(), bytes: None, in_progress: false },
            ]
        );
        assert_eq!(
            parts.iter().map(PartEntry::encode).collect::<Vec<_>>().join(" "),
            "part-0-1-ab-0.jsonl@12 ~part-0-1-ab-1.jsonl@7 part-0-00000000000000000003.jsonl"
        );
        assert!(parse_handle("").is_empty());
        assert_eq!(TxnFileSink::epoch_of("part-3-00000000000000000007-ab12-4.jsonl"), Some(CheckpointId::new(7)));
        assert_eq!(TxnFileSink::epoch_of("part-3-00000000000000000007.jsonl"), Some(CheckpointId::new(7)));
    }

    #[test]
    fn a_commit_checks_the_length_and_never_replaces_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let s = sink(dir.path());
        fs::write(s.pending().join("part-0-1-ab-0.jsonl"), b"1\n2\n").unwrap();
        // Shorter than recorded: refused, and left pending.
        let err = commit(&s, "part-0-1-ab-0.jsonl@6").unwrap_err().to_string();
        assert!(err.contains("holds 4 bytes") && err.contains("recorded 6"), "{err}");
        assert!(s.pending().join("part-0-1-ab-0.jsonl").is_file());
        // As recorded: committed; again: nothing to do.
        commit(&s, "part-0-1-ab-0.jsonl@4").unwrap();
        commit(&s, "part-0-1-ab-0.jsonl@4").unwrap();
        assert_eq!(fs::read(dir.path().join("part-0-1-ab-0.jsonl")).unwrap(), b"1\n2\n");
        assert!(!s.pending().join("part-0-1-ab-0.jsonl").exists());
        // A name taken by another file: refused, the committed file kept.
        fs::write(s.pending().join("part-0-1-ab-0.jsonl"), b"9\n9\n").unwrap();
        let err = commit(&s, "part-0-1-ab-0.jsonl@4").unwrap_err().to_string();
        assert!(err.contains("exists already") && err.contains("never replaced"), "{err}");
        assert_eq!(fs::read(dir.path().join("part-0-1-ab-0.jsonl")).unwrap(), b"1\n2\n");
        // Neither pending nor committed: an error naming it.
        let err = commit(&s, "part-0-2-ab-1.jsonl@4").unwrap_err().to_string();
        assert!(err.contains("is missing") && err.contains("part-0-2-ab-1.jsonl"), "{err}");
        // An empty pending file where records were recorded.
        fs::write(s.pending().join("part-0-3-ab-2.jsonl"), b"").unwrap();
        assert!(commit(&s, "part-0-3-ab-2.jsonl@4").unwrap_err().to_string().contains("holds 0 bytes"));
        // A crash between the link and the unlink: the commit finishes.
        fs::write(s.pending().join("part-0-4-ab-3.jsonl"), b"7\n").unwrap();
        fs::hard_link(s.pending().join("part-0-4-ab-3.jsonl"), dir.path().join("part-0-4-ab-3.jsonl")).unwrap();
        commit(&s, "part-0-4-ab-3.jsonl@2").unwrap();
        assert!(!s.pending().join("part-0-4-ab-3.jsonl").exists());
    }

    #[test]
    fn a_part_in_progress_waits_and_is_cut_to_its_checkpoint_on_restore() {
        let dir = tempfile::tempdir().unwrap();
        let s = sink(dir.path());
        // Checkpoint 1 recorded 2 bytes of the open part; then more came.
        fs::write(s.pending().join("part-0-1-ab-0.jsonl"), b"1\n2\n3\n").unwrap();
        commit(&s, "~part-0-1-ab-0.jsonl@2").unwrap();
        assert!(!dir.path().join("part-0-1-ab-0.jsonl").exists(), "still being written: not committed");
        // A carried older handle and the newest: the newest wins.
        restored(&s, &["~part-0-1-ab-0.jsonl@2", "~part-0-1-ab-0.jsonl@4"]).unwrap();
        assert_eq!(fs::read(dir.path().join("part-0-1-ab-0.jsonl")).unwrap(), b"1\n2\n");
        // Restored again (a crash after the restore's commit): done already.
        restored(&s, &["~part-0-1-ab-0.jsonl@4"]).unwrap();
        // Shorter than its checkpoint recorded: refused.
        fs::write(s.pending().join("part-0-2-ab-1.jsonl"), b"1\n").unwrap();
        assert!(restored(&s, &["~part-0-2-ab-1.jsonl@4"]).unwrap_err().to_string().contains("holds 2 bytes"));
    }
}
