//! Sinks that need no service: stdout, a blackhole, a JSON-lines file, and
//! a collecting sink for tests.
//!
//! A [`Sink`] runs one [`SinkWriter`] per parallel instance of the stream it
//! consumes.

mod txn;

pub(crate) use txn::{SinkCommitter, TxnSinkWriter};
pub use txn::{TransactionWriter, TwoPhaseCommitSink, TxnFileSink};

use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::record::CheckpointId;
use crate::record::{Batch, Meta};

/// Where a stream's records end up.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot consume a stream of `{T}`",
    label = "this sink does not take `{T}`",
    note = "a sink's record type must match the stream's; map the stream to the sink's type first, or use a sink built for `{T}`"
)]
pub trait Sink<T>: Send + Sync + 'static {
    /// The name the sink gets in the job.
    fn default_name(&self) -> String;

    /// Opens the writer of parallel instance `instance` of `parallelism`.
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::Connector`] when the sink cannot be opened.
    fn open(&self, instance: usize, parallelism: usize) -> Result<Box<dyn SinkWriter<T>>>;

    /// Opens a writer knowing more of where it runs (the job, the sink's
    /// id, the first checkpoint epoch); what the job calls. The default
    /// calls [`Sink::open`].
    ///
    /// # Errors
    /// As [`Sink::open`].
    fn open_in(&self, context: &SinkContext) -> Result<Box<dyn SinkWriter<T>>> {
        self.open(context.instance, context.parallelism)
    }
}

/// Where a sink writer runs: what [`Sink::open_in`] gets.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SinkContext {
    /// The job's name.
    pub job: String,
    /// The sink's stable id in the job (its uid, or else its name).
    pub sink: String,
    /// This writer's instance, of `parallelism`.
    pub instance: usize,
    /// How many writers the sink has.
    pub parallelism: usize,
    /// The checkpoint epoch the writer starts in: one after the
    /// checkpoint the job restored, or [`CheckpointId::FIRST`]. Barrier
    /// `n` ends epoch `n`.
    pub epoch: CheckpointId,
}

impl SinkContext {
    /// The context of writer `instance` of `parallelism` of sink `sink` in
    /// job `job`, in the first epoch (for a sink that opens another sink's
    /// writer, or for tests).
    pub fn new(job: impl Into<String>, sink: impl Into<String>, instance: usize, parallelism: usize) -> Self {
        Self { job: job.into(), sink: sink.into(), instance, parallelism, epoch: CheckpointId::FIRST }
    }
}

/// Writes one instance's records.
pub trait SinkWriter<T>: Send {
    /// Writes (and takes) every record of `batch`.
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::Connector`] when writing fails.
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()>;

    /// The watermark of the stream reached `watermark`: no record with a
    /// timestamp at or below it will follow (what the sink does with that is
    /// its own business; most ignore it).
    ///
    /// # Errors
    /// As [`SinkWriter::write`].
    fn on_watermark(&mut self, watermark: crate::record::Timestamp) -> Result<()> {
        let _ = watermark;
        Ok(())
    }

    /// Checkpoint barrier `n` reached the sink: everything written so far
    /// belongs to checkpoint `n`. The default flushes; sinks that promise
    /// exactly-once pre-commit here.
    ///
    /// # Errors
    /// As [`SinkWriter::write`].
    fn on_barrier(&mut self, checkpoint: CheckpointId) -> Result<()> {
        let _ = checkpoint;
        self.flush()
    }

    /// Makes written records visible (the buffer timeout passed).
    ///
    /// # Errors
    /// As [`SinkWriter::write`].
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }

    /// End of input: flush and close. Nothing is called after it (in a job
    /// with checkpoints, the barriers that still pass the task after the
    /// end of its input do not reach this writer).
    ///
    /// # Errors
    /// As [`SinkWriter::write`].
    fn finish(&mut self) -> Result<()> {
        self.flush()
    }
}

/// Records handed to a [`SinkWriter`]: values with their metadata.
pub struct SinkBatch<'a, T> {
    pub(crate) batch: &'a mut Batch<T>,
    pub(crate) sources: &'a crate::record::SourceNames,
}

impl<T> fmt::Debug for SinkBatch<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkBatch").field("len", &self.batch.len()).finish()
    }
}

impl<T> SinkBatch<'_, T> {
    /// How many records.
    pub fn len(&self) -> usize {
        self.batch.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// The values.
    pub fn values(&self) -> &[T] {
        &self.batch.values
    }

    /// The metadata (event time, source position) of each value.
    pub fn meta(&self) -> &[Meta] {
        &self.batch.meta
    }

    /// Where record `i` came from (its source's name, partition and
    /// offset), for error messages and dead letters; `None` past the end.
    pub fn position(&self, i: usize) -> Option<crate::record::SourcePosition> {
        self.batch.meta.get(i).map(|m| self.sources.position(m))
    }

    /// The job's source names, by the index in [`Meta::source`]: what a
    /// sink keeps to name a record's source after the batch is gone.
    pub fn source_names(&self) -> &std::sync::Arc<[String]> {
        &self.sources.0
    }

    /// Takes the values out, leaving the batch empty.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.batch.meta.clear();
        self.batch.values.drain(..)
    }
}

/// Hands `values`, with their metadata, to `writer` as one batch (the job's
/// source names, for [`SinkBatch::position`], in `sources`): for a sink
/// that passes records on to another sink's writer, its dead letters say.
///
/// # Errors
/// As the writer's [`SinkWriter::write`]; [`Error::Internal`] when
/// `values` and `meta` differ in length.
pub fn write_batch<T>(
    writer: &mut dyn SinkWriter<T>,
    values: Vec<T>,
    meta: Vec<Meta>,
    sources: &Arc<[String]>,
) -> Result<()> {
    if values.len() != meta.len() {
        return Err(crate::error::internal_error!("{} values with {} metadata", values.len(), meta.len()));
    }
    let names = crate::record::SourceNames(Arc::clone(sources));
    writer.write(&mut SinkBatch { batch: &mut Batch { values, meta }, sources: &names })
}

/// Prints each record's `Debug` form on its own line of standard output.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stdout;

impl<T: fmt::Debug + Send + 'static> Sink<T> for Stdout {
    fn default_name(&self) -> String {
        "stdout".into()
    }

    fn open(&self, _instance: usize, _parallelism: usize) -> Result<Box<dyn SinkWriter<T>>> {
        Ok(Box::new(StdoutWriter { buf: Vec::new(), _t: PhantomData }))
    }
}

struct StdoutWriter<T> {
    buf: Vec<u8>,
    _t: PhantomData<fn(T)>,
}

impl<T: fmt::Debug + Send> SinkWriter<T> for StdoutWriter<T> {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        for v in batch.drain() {
            // Writing to a Vec cannot fail.
            let _ = writeln!(self.buf, "{v:?}");
        }
        if self.buf.len() > 1 << 16 {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let mut out = std::io::stdout().lock();
        out.write_all(&self.buf).and_then(|()| out.flush()).map_err(|e| Error::Connector {
            name: "stdout".into(),
            message: "cannot write".into(),
            source: Some(Box::new(e)),
        })?;
        self.buf.clear();
        Ok(())
    }
}

/// Discards every record, counting them.
///
/// ```
/// use weibo::sinks::Blackhole;
/// let sink = Blackhole::new();
/// let counter = sink.clone();
/// weibo::testing::block_on(async move {
///     let job = weibo::Job::new("discard");
///     job.source(weibo::sources::IterSource::new(0..100u32)).sink(sink);
///     job.run().await
/// })?;
/// assert_eq!(counter.count(), 100);
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Blackhole {
    count: Arc<AtomicU64>,
}

impl Blackhole {
    /// A new blackhole with its count at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records discarded so far, over all instances.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

impl<T: Send + 'static> Sink<T> for Blackhole {
    fn default_name(&self) -> String {
        "blackhole".into()
    }

    fn open(&self, _instance: usize, _parallelism: usize) -> Result<Box<dyn SinkWriter<T>>> {
        Ok(Box::new(BlackholeWriter { count: self.count.clone(), _t: PhantomData }))
    }
}

struct BlackholeWriter<T> {
    count: Arc<AtomicU64>,
    _t: PhantomData<fn(T)>,
}

impl<T: Send> SinkWriter<T> for BlackholeWriter<T> {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        self.count.fetch_add(batch.len() as u64, Ordering::Relaxed);
        batch.drain().for_each(drop);
        Ok(())
    }
}

/// Collects every record in memory, for tests: read them with
/// [`CollectSink::values`] after the job ends. Clones share the same storage.
///
/// With several parallel instances, records arrive in no particular order
/// across instances; sort before comparing.
pub struct CollectSink<T> {
    values: Arc<Mutex<Vec<T>>>,
}

impl<T> Clone for CollectSink<T> {
    fn clone(&self) -> Self {
        Self { values: self.values.clone() }
    }
}

impl<T> Default for CollectSink<T> {
    fn default() -> Self {
        Self { values: Arc::new(Mutex::new(Vec::new())) }
    }
}

impl<T> fmt::Debug for CollectSink<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CollectSink").finish_non_exhaustive()
    }
}

impl<T: Clone> CollectSink<T> {
    /// A new, empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of everything collected so far.
    pub fn values(&self) -> Vec<T> {
        self.values.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Takes everything collected so far.
    pub fn take(&self) -> Vec<T> {
        std::mem::take(&mut *self.values.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl<T: Clone + Send + 'static> Sink<T> for CollectSink<T> {
    fn default_name(&self) -> String {
        "collect".into()
    }

    fn open(&self, _instance: usize, _parallelism: usize) -> Result<Box<dyn SinkWriter<T>>> {
        Ok(Box::new(CollectWriter { values: self.values.clone() }))
    }
}

struct CollectWriter<T> {
    values: Arc<Mutex<Vec<T>>>,
}

impl<T: Send> SinkWriter<T> for CollectWriter<T> {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        self.values.lock().unwrap_or_else(PoisonError::into_inner).extend(batch.drain());
        Ok(())
    }
}

/// Writes each record as one line of JSON to a file, created (or
/// truncated) when a job opens the sink. All parallel instances write to the
/// same file; the lines of one batch stay together. The file is closed when
/// every instance of the job has opened it and is done with it (an
/// instance that ends before another has started does not close it), so
/// the same `FileSink` can serve a later job, which starts the file anew.
#[derive(Clone, Debug)]
pub struct FileSink {
    path: PathBuf,
    file: Arc<Mutex<OpenFile>>,
}

/// The shared file, how many writers use it, and how many of the job's
/// instances are still to open it.
#[derive(Debug, Default)]
struct OpenFile {
    writer: Option<BufWriter<File>>,
    writers: usize,
    to_open: usize,
}

impl FileSink {
    /// A JSON-lines file at `path`.
    pub fn json_lines(path: impl AsRef<Path>) -> Self {
        Self { path: path.as_ref().to_path_buf(), file: Arc::new(Mutex::new(OpenFile::default())) }
    }

    fn io(&self, action: &'static str) -> impl FnOnce(std::io::Error) -> Error + '_ {
        move |source| Error::Io { action, path: self.path.clone(), source }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OpenFile> {
        self.file.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Serialize + Send + 'static> Sink<T> for FileSink {
    fn default_name(&self) -> String {
        self.path.display().to_string()
    }

    fn open(&self, _instance: usize, parallelism: usize) -> Result<Box<dyn SinkWriter<T>>> {
        let mut file = self.lock();
        if file.writer.is_none() {
            let f = File::create(&self.path).map_err(self.io("cannot create output file"))?;
            file.writer = Some(BufWriter::new(f));
            file.to_open = parallelism;
        }
        file.writers += 1;
        file.to_open = file.to_open.saturating_sub(1);
        Ok(Box::new(FileWriter { sink: self.clone(), buf: Vec::new(), _t: PhantomData }))
    }
}

struct FileWriter<T> {
    sink: FileSink,
    buf: Vec<u8>,
    _t: PhantomData<fn(T)>,
}

impl<T: Serialize + Send> SinkWriter<T> for FileWriter<T> {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        for v in batch.drain() {
            serde_json::to_writer(&mut self.buf, &v).map_err(|e| Error::Connector {
                name: self.sink.path.display().to_string(),
                message: format!("cannot write a record as JSON: {e}"),
                source: None,
            })?;
            self.buf.push(b'\n');
        }
        let mut file = self.sink.lock();
        if let Some(f) = file.writer.as_mut() {
            f.write_all(&self.buf).map_err(self.sink.io("cannot write output file"))?;
        }
        self.buf.clear();
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        let mut file = self.sink.lock();
        if let Some(f) = file.writer.as_mut() {
            f.flush().map_err(self.sink.io("cannot write output file"))?;
        }
        Ok(())
    }
}

impl<T> Drop for FileWriter<T> {
    fn drop(&mut self) {
        let mut file = self.sink.lock();
        file.writers = file.writers.saturating_sub(1);
        if file.writers == 0 && file.to_open == 0 {
            // Dropping the writer flushes it; errors here were already
            // reported by `finish` when the job ended normally.
            file.writer = None;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            timestamp: crate::record::NO_TIMESTAMP,
            watermark: crate::record::NO_TIMESTAMP,
            offset: 0,
            partition: 0,
            source: 0,
        }
    }

    /// An instance of a job that ends before another has opened the file
    /// does not let the later one start the file anew.
    #[test]
    fn a_file_sink_keeps_the_lines_of_an_instance_done_before_another_opened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let sink = FileSink::json_lines(&path);
        let sources: Arc<[String]> = Arc::from(vec!["s".to_string()]);
        for (instance, value) in [(0, 1u32), (1, 2)] {
            let mut writer = Sink::<u32>::open(&sink, instance, 2).unwrap();
            write_batch(writer.as_mut(), vec![value], vec![meta()], &sources).unwrap();
            writer.flush().unwrap();
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "1\n2\n");
        // A later run of the job starts the file anew.
        let mut writer = Sink::<u32>::open(&sink, 0, 1).unwrap();
        write_batch(writer.as_mut(), vec![3], vec![meta()], &sources).unwrap();
        drop(writer);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "3\n");
    }
}
