//! Sources that need no service: in-memory values, a deterministic
//! generator, and files (lines or JSON lines).
//!
//! A [`Source`] has one or more partitions; each partition is read by its
//! own task through a [`SourceReader`], which fills a [`SourceOutput`] with
//! values and their positions (offsets) in the partition.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::record::{Batch, Meta, NO_TIMESTAMP, SourcePosition, Timestamp};
use crate::task::BoxFuture;

/// Where a job's records come from.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Weibo source",
    note = "use a source from `weibo::sources` (`IterSource`, `Generator`, `FileSource`) or implement `weibo::sources::Source`"
)]
pub trait Source: Send + Sync + 'static {
    /// The type of the records it produces.
    type Item: Clone + Send + 'static;

    /// The name the source gets in the job unless the user names it.
    fn default_name(&self) -> String;

    /// A short description for the job's graph (`"generator, 1000 events"`).
    fn describe(&self) -> String;

    /// How many partitions it has; each is read by its own task.
    fn partitions(&self) -> usize;

    /// Opens partition `partition` (in `0..partitions()`).
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::Connector`] when the partition cannot be opened.
    fn open(&self, partition: usize) -> Result<Box<dyn SourceReader<Self::Item>>>;

    /// Opens partition `partition` to resume at `position`, a value its
    /// reader returned from [`SourceReader::position`] when a checkpoint
    /// was taken. Sources that cannot resume refuse (the default), and a
    /// job that restores from a checkpoint then fails naming the source.
    ///
    /// # Errors
    /// [`Error::Connector`] when the source cannot resume there.
    fn open_at(&self, partition: usize, position: u64) -> Result<Box<dyn SourceReader<Self::Item>>> {
        let _ = (partition, position);
        Err(Error::Connector {
            name: self.default_name(),
            message: "this source cannot resume from a checkpoint position".into(),
            source: None,
        })
    }

    /// What partition `partition` is outside Weibo, if it has a name there
    /// (a Kafka source's `<topic>/<partition>`): recorded beside its
    /// position in checkpoints, so that whoever reads them (a sink that
    /// commits consumed offsets, a person inspecting a checkpoint) knows
    /// which partition a position belongs to. The default: none.
    fn partition_name(&self, partition: usize) -> Option<String> {
        let _ = partition;
        None
    }
}

/// What a read produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadStatus {
    /// More records may be read right away.
    More,
    /// Nothing is available now; the runtime flushes buffered output.
    Idle,
    /// The partition has ended: no more records will come.
    Done,
}

/// Reads one partition of a source.
pub trait SourceReader<T>: Send {
    /// Appends up to [`SourceOutput::remaining`] records to `out`. A reader
    /// that has to wait should not wait past [`SourceOutput::deadline`].
    ///
    /// # Errors
    /// [`Error::Input`] for input the reader cannot understand (naming its
    /// position); [`Error::Io`] or [`Error::Connector`] when reading fails.
    fn read<'a>(&'a mut self, out: &'a mut SourceOutput<T>) -> BoxFuture<'a, Result<ReadStatus>>;

    /// Where the next record will be read from, for checkpoints: a value
    /// [`Source::open_at`] resumes at. `None` (the default) means the
    /// reader cannot say, and checkpoints of its job fail.
    fn position(&self) -> Option<u64> {
        None
    }

    /// Where the partition ends now, in the same terms as
    /// [`position`](Self::position), if the reader can tell (for Kafka, the
    /// last stable offset). The difference is the partition's lag, which
    /// the job's metrics report; read about once a second, off the path of
    /// records. `None` (the default): no lag is reported.
    fn end_position(&self) -> Option<u64> {
        None
    }
}

/// The batch a [`SourceReader`] fills.
pub struct SourceOutput<T> {
    pub(crate) batch: Batch<T>,
    /// The partition's watermark, as the source last advanced it.
    pub(crate) watermark: Timestamp,
    pub(crate) capacity: usize,
    pub(crate) partition: u32,
    pub(crate) source: u32,
    pub(crate) name: Arc<str>,
    pub(crate) deadline: Instant,
}

impl<T> fmt::Debug for SourceOutput<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceOutput")
            .field("source", &self.name)
            .field("partition", &self.partition)
            .field("len", &self.batch.len())
            .finish_non_exhaustive()
    }
}

impl<T> SourceOutput<T> {
    pub(crate) fn new(name: Arc<str>, source: u32, partition: u32, capacity: usize) -> Self {
        Self {
            batch: Batch::with_capacity(capacity),
            watermark: NO_TIMESTAMP,
            capacity: capacity.max(1),
            partition,
            source,
            name,
            deadline: Instant::now(),
        }
    }

    /// Adds a record read at `offset`, with an event time if the source knows one.
    #[inline]
    pub fn push(&mut self, value: T, offset: u64, timestamp: Option<Timestamp>) {
        let meta = Meta {
            timestamp: timestamp.unwrap_or(NO_TIMESTAMP),
            watermark: self.watermark,
            offset,
            partition: self.partition,
            source: self.source,
        };
        self.batch.push(value, meta);
    }

    /// Declares that no record with a timestamp at or below `watermark` will
    /// follow in this partition. Records pushed after this call carry it;
    /// the runtime forwards it downstream. A watermark never moves back:
    /// a smaller value is ignored.
    pub fn advance_watermark(&mut self, watermark: Timestamp) {
        self.watermark = self.watermark.max(watermark);
    }

    /// The partition's current watermark.
    pub fn watermark(&self) -> Timestamp {
        self.watermark
    }

    /// Whether no record was added yet in this read.
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// How many more records fit in this batch.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.capacity.saturating_sub(self.batch.len())
    }

    /// When the runtime wants control back to flush buffered output.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The partition being read.
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// The position of `offset` in this partition, for error messages.
    pub fn position(&self, offset: u64) -> SourcePosition {
        SourcePosition { source: self.name.to_string(), partition: self.partition, offset }
    }
}

/// Values from an iterator (or a `Vec`), in one partition; the offset of a
/// value is its index.
///
/// ```
/// let out = weibo::testing::run_job(|job| {
///     job.source(weibo::sources::IterSource::new(vec![1, 2, 3])).map(|x: i32| x * 10)
/// })?;
/// assert_eq!(out, vec![10, 20, 30]);
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct IterSource<I: Iterator> {
    iter: Mutex<Option<I>>,
}

impl<I: Iterator> fmt::Debug for IterSource<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IterSource")
    }
}

impl<I: Iterator> IterSource<I> {
    /// A source of the values of `iter`.
    pub fn new(iter: impl IntoIterator<IntoIter = I>) -> Self {
        Self { iter: Mutex::new(Some(iter.into_iter())) }
    }
}

impl<I> Source for IterSource<I>
where
    I: Iterator + Send + 'static,
    I::Item: Clone + Send + 'static,
{
    type Item = I::Item;

    fn default_name(&self) -> String {
        "values".into()
    }

    fn describe(&self) -> String {
        "in-memory values".into()
    }

    fn partitions(&self) -> usize {
        1
    }

    fn open(&self, partition: usize) -> Result<Box<dyn SourceReader<I::Item>>> {
        self.open_at(partition, 0)
    }

    /// Skips the first `position` values (an iterator cannot seek).
    fn open_at(&self, _partition: usize, position: u64) -> Result<Box<dyn SourceReader<I::Item>>> {
        let mut iter =
            self.iter.lock().unwrap_or_else(PoisonError::into_inner).take().ok_or_else(|| Error::Connector {
                name: "values".into(),
                message: "an IterSource can be read only once; build a new one for another run".into(),
                source: None,
            })?;
        for _ in 0..position {
            if iter.next().is_none() {
                break;
            }
        }
        Ok(Box::new(IterReader { iter, next: position }))
    }
}

struct IterReader<I> {
    iter: I,
    next: u64,
}

impl<I> SourceReader<I::Item> for IterReader<I>
where
    I: Iterator + Send,
    I::Item: Send,
{
    fn read<'a>(&'a mut self, out: &'a mut SourceOutput<I::Item>) -> BoxFuture<'a, Result<ReadStatus>> {
        let mut status = ReadStatus::More;
        while out.remaining() > 0 {
            match self.iter.next() {
                Some(v) => {
                    out.push(v, self.next, None);
                    self.next += 1;
                }
                None => {
                    status = ReadStatus::Done;
                    break;
                }
            }
        }
        Box::pin(std::future::ready(Ok(status)))
    }

    fn position(&self) -> Option<u64> {
        Some(self.next)
    }
}

type TsFn = dyn Fn(u64) -> Timestamp + Send + Sync;

/// A deterministic generator: event `i` (for `i` in `0..count`) is `f(i)`.
///
/// With `p` partitions, partition `k` produces `i = k, k + p, k + 2p, ...`,
/// so every partition is an interleaved, increasing slice of the same
/// sequence. The offset of event `i` is `i`. Optionally rate-limited
/// (events per second, over all partitions) and timestamped.
///
/// ```
/// use weibo::sources::Generator;
/// let mut out = weibo::testing::run_job(|job| {
///     job.source(Generator::new(5, |i| i * i).with_partitions(2))
/// })?;
/// out.sort();
/// assert_eq!(out, vec![0, 1, 4, 9, 16]);
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct Generator<T> {
    count: u64,
    partitions: usize,
    rate: Option<f64>,
    f: Arc<dyn Fill<T>>,
    timestamps: Option<Arc<TsFn>>,
}

/// Appends a generator's events to a batch: made in [`Generator::new`]
/// over the user's function, so that the loop over a batch's events calls
/// it directly (inlined) rather than through a pointer per event.
trait Fill<T>: Send + Sync {
    /// Appends the `n` events `from, from + step, ...` to `out` (which has
    /// room for them), without event times, with the output's source,
    /// partition and watermark.
    fn fill(&self, from: u64, step: u64, n: usize, out: &mut SourceOutput<T>);
    /// Event `i`.
    fn event(&self, i: u64) -> T;
}

struct FillWith<F>(F);

impl<T, F: Fn(u64) -> T + Send + Sync> Fill<T> for FillWith<F> {
    fn fill(&self, from: u64, step: u64, n: usize, out: &mut SourceOutput<T>) {
        let (partition, source, watermark) = (out.partition, out.source, out.watermark);
        let f = &self.0;
        // Exact-size iterators: one capacity check per batch, not per event.
        let index = |k: usize| from.wrapping_add(step.wrapping_mul(k as u64));
        out.batch.values.extend((0..n).map(|k| f(index(k))));
        out.batch.meta.extend((0..n).map(|k| Meta {
            timestamp: NO_TIMESTAMP,
            watermark,
            offset: index(k),
            partition,
            source,
        }));
    }

    fn event(&self, i: u64) -> T {
        (self.0)(i)
    }
}

impl<T> fmt::Debug for Generator<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Generator")
            .field("count", &self.count)
            .field("partitions", &self.partitions)
            .field("rate", &self.rate)
            .finish_non_exhaustive()
    }
}

impl<T: Clone + Send + 'static> Generator<T> {
    /// `count` events, event `i` being `f(i)`.
    pub fn new(count: u64, f: impl Fn(u64) -> T + Send + Sync + 'static) -> Self {
        Self { count, partitions: 1, rate: None, f: Arc::new(FillWith(f)), timestamps: None }
    }

    /// Splits the sequence over `n` partitions (at least 1).
    #[must_use]
    pub fn with_partitions(mut self, n: usize) -> Self {
        self.partitions = n.max(1);
        self
    }

    /// Produces at most `events_per_second` events per second (over all partitions).
    #[must_use]
    pub fn with_rate(mut self, events_per_second: f64) -> Self {
        self.rate = (events_per_second > 0.0).then_some(events_per_second);
        self
    }

    /// Gives event `i` the event time `ts(i)`.
    #[must_use]
    pub fn with_timestamps(mut self, ts: impl Fn(u64) -> Timestamp + Send + Sync + 'static) -> Self {
        self.timestamps = Some(Arc::new(ts));
        self
    }
}

impl<T: Clone + Send + 'static> Source for Generator<T> {
    type Item = T;

    fn default_name(&self) -> String {
        "generator".into()
    }

    fn describe(&self) -> String {
        match self.rate {
            Some(r) => format!("generator, {} events at {r}/s", self.count),
            None => format!("generator, {} events", self.count),
        }
    }

    fn partitions(&self) -> usize {
        self.partitions
    }

    fn open(&self, partition: usize) -> Result<Box<dyn SourceReader<T>>> {
        self.open_at(partition, partition as u64)
    }

    /// Resumes at event index `position` (which belongs to `partition`).
    fn open_at(&self, partition: usize, position: u64) -> Result<Box<dyn SourceReader<T>>> {
        let step = self.partitions as u64;
        if position % step != partition as u64 % step {
            return Err(Error::Connector {
                name: self.default_name(),
                message: format!("event {position} does not belong to partition {partition} of {step}"),
                source: None,
            });
        }
        Ok(Box::new(GenReader {
            next: position,
            step,
            count: self.count,
            f: self.f.clone(),
            timestamps: self.timestamps.clone(),
            rate: self.rate.map(|r| r / step as f64),
            started: Instant::now(),
            emitted: 0,
            _t: PhantomData,
        }))
    }
}

struct GenReader<T> {
    next: u64,
    step: u64,
    count: u64,
    f: Arc<dyn Fill<T>>,
    timestamps: Option<Arc<TsFn>>,
    /// Events per second for this partition.
    rate: Option<f64>,
    started: Instant,
    emitted: u64,
    _t: PhantomData<fn() -> T>,
}

impl<T: Send + 'static> GenReader<T> {
    #[inline]
    fn fill(&mut self, out: &mut SourceOutput<T>, max: usize) {
        let end = self.count.min(self.next.saturating_add(self.step.saturating_mul(max as u64)));
        let n_before = out.batch.len();
        if self.next < end {
            // Events `next, next + step, ...` below `end`: at most `max`.
            let n = usize::try_from((end - self.next).div_ceil(self.step)).unwrap_or(max).min(max);
            match &self.timestamps {
                None => self.f.fill(self.next, self.step, n, out),
                Some(ts) => {
                    for k in 0..n as u64 {
                        let i = self.next + k * self.step;
                        out.push(self.f.event(i), i, Some(ts(i)));
                    }
                }
            }
            self.next = self.next.saturating_add(self.step.saturating_mul(n as u64));
        }
        self.emitted += (out.batch.len() - n_before) as u64;
    }
}

impl<T: Send + 'static> SourceReader<T> for GenReader<T> {
    fn read<'a>(&'a mut self, out: &'a mut SourceOutput<T>) -> BoxFuture<'a, Result<ReadStatus>> {
        Box::pin(async move {
            if self.next >= self.count {
                return Ok(ReadStatus::Done);
            }
            let mut max = out.remaining();
            if let Some(rate) = self.rate {
                let due = (self.started.elapsed().as_secs_f64() * rate) as u64;
                let allowed = due.saturating_sub(self.emitted);
                if allowed == 0 {
                    let next_at = self.started + Duration::from_secs_f64((self.emitted + 1) as f64 / rate);
                    let wake = next_at.min(out.deadline().max(Instant::now() + Duration::from_micros(100)));
                    tokio::time::sleep_until(tokio::time::Instant::from_std(wake)).await;
                    return Ok(ReadStatus::Idle);
                }
                max = max.min(usize::try_from(allowed).unwrap_or(usize::MAX));
            }
            self.fill(out, max);
            Ok(if self.next >= self.count { ReadStatus::Done } else { ReadStatus::More })
        })
    }

    fn position(&self) -> Option<u64> {
        Some(self.next)
    }

    /// With a rate, the offset of the first event not yet due (the lag is
    /// how far the generator is behind its schedule); without one, its
    /// last offset (the lag is what is left), unless it never ends.
    fn end_position(&self) -> Option<u64> {
        match self.rate {
            Some(rate) => {
                let due = (self.started.elapsed().as_secs_f64() * rate) as u64;
                let behind = due.saturating_sub(self.emitted);
                Some(self.count.min(self.next.saturating_add(behind.saturating_mul(self.step))))
            }
            None => (self.count < u64::MAX).then_some(self.count),
        }
    }
}

/// How a [`FileSource`] turns a line into a record.
trait LineParser<T>: Send + Sync {
    fn parse(&self, line: &str) -> std::result::Result<T, String>;
}

struct Lines;
impl LineParser<String> for Lines {
    fn parse(&self, line: &str) -> std::result::Result<String, String> {
        Ok(line.to_string())
    }
}

struct JsonLines<T>(PhantomData<fn() -> T>);
impl<T: DeserializeOwned> LineParser<T> for JsonLines<T> {
    fn parse(&self, line: &str) -> std::result::Result<T, String> {
        serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))
    }
}

/// A text file read line by line, in one partition; a record's offset is the
/// byte offset where its line starts.
///
/// [`FileSource::lines`] yields each line as a `String` (without its line
/// ending); [`FileSource::json_lines`] parses each non-empty line as JSON
/// into `T`. A line that is not UTF-8, or not valid JSON for `T`, stops the
/// job with an error naming the file, line number and byte offset. To keep
/// going past bad lines instead, read `lines()` and parse with `process`
/// under a dead-letter policy.
pub struct FileSource<T> {
    path: PathBuf,
    parser: Arc<dyn LineParser<T>>,
    format: &'static str,
}

impl<T> fmt::Debug for FileSource<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileSource").field("path", &self.path).field("format", &self.format).finish()
    }
}

impl FileSource<String> {
    /// The lines of the file at `path`.
    pub fn lines(path: impl AsRef<Path>) -> Self {
        Self { path: path.as_ref().to_path_buf(), parser: Arc::new(Lines), format: "lines" }
    }
}

impl<T: DeserializeOwned + Clone + Send + 'static> FileSource<T> {
    /// The non-empty lines of the file at `path`, each parsed as JSON.
    pub fn json_lines(path: impl AsRef<Path>) -> Self {
        Self { path: path.as_ref().to_path_buf(), parser: Arc::new(JsonLines(PhantomData)), format: "JSON lines" }
    }
}

impl<T: Clone + Send + 'static> Source for FileSource<T> {
    type Item = T;

    fn default_name(&self) -> String {
        self.path.display().to_string()
    }

    fn describe(&self) -> String {
        format!("file, {}", self.format)
    }

    fn partitions(&self) -> usize {
        1
    }

    fn open(&self, partition: usize) -> Result<Box<dyn SourceReader<T>>> {
        self.open_at(partition, 0)
    }

    /// Resumes at byte offset `position`, the start of a line (counting the
    /// lines before it, so that errors still name the right line).
    fn open_at(&self, _partition: usize, position: u64) -> Result<Box<dyn SourceReader<T>>> {
        let io = |action: &'static str| {
            let path = self.path.clone();
            move |source| Error::Io { action, path, source }
        };
        let file = File::open(&self.path).map_err(io("cannot open input file"))?;
        let mut reader = BufReader::with_capacity(1 << 16, file);
        let mut line_no = 0;
        let mut offset = 0;
        let mut buf = Vec::new();
        while offset < position {
            buf.clear();
            let n = reader.read_until(b'\n', &mut buf).map_err(io("cannot read input file"))?;
            if n == 0 {
                return Err(Error::Connector {
                    name: self.default_name(),
                    message: format!("cannot resume at byte {position}: the file has only {offset} bytes"),
                    source: None,
                });
            }
            offset += n as u64;
            line_no += 1;
        }
        if offset != position {
            return Err(Error::Connector {
                name: self.default_name(),
                message: format!("cannot resume at byte {position}: it is not the start of a line"),
                source: None,
            });
        }
        Ok(Box::new(FileReader {
            path: self.path.clone(),
            reader,
            parser: self.parser.clone(),
            offset,
            line_no,
            buf,
            skip_empty: self.format != "lines",
        }))
    }
}

struct FileReader<T> {
    path: PathBuf,
    reader: BufReader<File>,
    parser: Arc<dyn LineParser<T>>,
    offset: u64,
    line_no: u64,
    buf: Vec<u8>,
    skip_empty: bool,
}

impl<T: Send + 'static> FileReader<T> {
    fn read_sync(&mut self, out: &mut SourceOutput<T>) -> Result<ReadStatus> {
        while out.remaining() > 0 {
            self.buf.clear();
            let n = self.reader.read_until(b'\n', &mut self.buf).map_err(|source| Error::Io {
                action: "cannot read input file",
                path: self.path.clone(),
                source,
            })?;
            if n == 0 {
                return Ok(ReadStatus::Done);
            }
            let start = self.offset;
            self.offset += n as u64;
            self.line_no += 1;
            let mut line = self.buf.as_slice();
            if let Some(rest) = line.strip_suffix(b"\n") {
                line = rest;
            }
            if let Some(rest) = line.strip_suffix(b"\r") {
                line = rest;
            }
            let bad = |message: String| Error::Input {
                position: out.position(start),
                message: format!("{}, line {}: {message}", self.path.display(), self.line_no),
            };
            let text = std::str::from_utf8(line).map_err(|e| bad(format!("not UTF-8 ({e})")))?;
            if self.skip_empty && text.trim().is_empty() {
                continue;
            }
            let value = self.parser.parse(text).map_err(bad)?;
            out.push(value, start, None);
        }
        Ok(ReadStatus::More)
    }
}

impl<T: Send + 'static> SourceReader<T> for FileReader<T> {
    fn read<'a>(&'a mut self, out: &'a mut SourceOutput<T>) -> BoxFuture<'a, Result<ReadStatus>> {
        let status = self.read_sync(out);
        Box::pin(std::future::ready(status))
    }

    fn position(&self) -> Option<u64> {
        Some(self.offset)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    /// Reads a whole partition: values, offsets, and the position after each read.
    fn drain<T: Clone + Send + 'static>(reader: &mut dyn SourceReader<T>) -> (Vec<T>, Vec<u64>) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut out = SourceOutput::new("test".into(), 0, 0, 3);
        let (mut values, mut offsets) = (Vec::new(), Vec::new());
        loop {
            let status = rt.block_on(reader.read(&mut out)).unwrap();
            offsets.extend(out.batch.meta.iter().map(|m| m.offset));
            values.append(&mut out.batch.values);
            out.batch.clear();
            if status == ReadStatus::Done {
                return (values, offsets);
            }
        }
    }

    #[test]
    fn a_generator_says_where_its_input_ends() {
        // Without a rate: its last offset, the lag being what is left.
        let g = Generator::new(12, |i| i);
        let mut reader = g.open(0).unwrap();
        assert_eq!((reader.position(), reader.end_position()), (Some(0), Some(12)));
        drain(&mut *reader);
        assert_eq!((reader.position(), reader.end_position()), (Some(12), Some(12)));
        // An endless one says nothing.
        assert_eq!(Generator::new(u64::MAX, |i| i).open(0).unwrap().end_position(), None);
        // With a rate: what is due by now, so the lag is how far it is
        // behind its schedule (never past its last offset).
        let g = Generator::new(1_000_000, |i| i).with_rate(1_000.0).with_partitions(2);
        let reader = g.open(1).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let end = reader.end_position().unwrap();
        assert!(end > 1 && !end.is_multiple_of(2) && end < 1_000_000, "{end}");
        let g = Generator::new(10, |i| i).with_rate(1e9);
        let reader = g.open(0).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(reader.end_position(), Some(10));
    }

    #[test]
    fn every_built_in_source_resumes_where_its_position_said() {
        // Generator: partition 1 of 3 resumes at event 7.
        let g = Generator::new(12, |i| i * 10).with_partitions(3);
        let (values, _) = drain(&mut *g.open_at(1, 7).unwrap());
        assert_eq!(values, vec![70, 100]);
        assert!(g.open_at(1, 6).is_err(), "event 6 belongs to partition 0");

        // Iterator: skips what was read.
        let it = IterSource::new(vec!["a", "b", "c", "d"]);
        let (values, offsets) = drain(&mut *it.open_at(0, 2).unwrap());
        assert_eq!((values, offsets), (vec!["c", "d"], vec![2, 3]));

        // File: the position after reading some lines resumes after them.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.txt");
        std::fs::write(&path, "one\ntwo\nthree\nfour\n").unwrap();
        let file = FileSource::lines(&path);
        let mut reader = file.open(0).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut out = SourceOutput::new("test".into(), 0, 0, 2);
        rt.block_on(reader.read(&mut out)).unwrap();
        let position = reader.position().unwrap();
        assert_eq!(position, 8, "after `one\\ntwo\\n`");
        let (values, offsets) = drain(&mut *file.open_at(0, position).unwrap());
        assert_eq!((values, offsets), (vec!["three".to_string(), "four".to_string()], vec![8, 14]));
        let err = file.open_at(0, 5).err().unwrap();
        assert!(err.to_string().contains("not the start of a line"), "{err}");
    }
}
