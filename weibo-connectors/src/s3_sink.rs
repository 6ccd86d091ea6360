//! Files of JSON lines in S3 (or any [`CheckpointStorage`]), exactly once:
//! each checkpoint epoch's parts are uploaded while the epoch runs, under
//! `_pending/`, and appear under their final names only when the
//! checkpoint that covers them completes.
//!
//! A writer (one per parallel instance) writes its records into a part,
//! streamed up as a multipart upload; a part is closed (rolled) when it
//! reaches `with_roll_bytes`, when it has been open for `with_roll_interval`, and at
//! every checkpoint barrier. The barrier's pre-commit finishes the epoch's
//! last part: the epoch's parts are then complete objects under
//! `_pending/<run>/`, and the handle records each one's size. The
//! checkpoint's completion copies each to its final name,
//! `part-<instance>-<epoch>-<run>-<part>.jsonl` (server-side, so a reader
//! sees a whole part or nothing), and deletes the pending one. The run's
//! token in the name means that no other run, a job restored from an
//! older savepoint included, ever publishes a part under the same name:
//! published parts are never replaced or deleted. A commit retried after
//! a crash copies again what is still pending (a part already published
//! under its name is the same object: its pending copy is only deleted)
//! and skips what is done; a pending part whose size is not the one its
//! handle recorded, or one neither pending nor published, is an error. A
//! restore deletes the pending parts of epochs after the restored
//! checkpoint, whose records are read again.
//!
//! Readers should ignore `_pending/` (the `_` prefix is what Spark, Hive
//! and Trino skip).

use std::fmt;
use std::io::{Seek as _, Write};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use weibo::checkpoint::{CheckpointStorage, ObjectWriter, run_token};
use weibo::record::CheckpointId;
use weibo::sinks::{SinkBatch, TransactionWriter, TwoPhaseCommitSink};
use weibo::{Error, Result};

/// Where pending parts are kept, under the sink's storage.
const PENDING: &str = "_pending";

/// JSON-lines part files, exactly once; see the [module notes](self).
///
/// ```no_run
/// # fn main() -> weibo::Result<()> {
/// use std::time::Duration;
/// use weibo_connectors::s3::S3Storage;
/// use weibo_connectors::s3_sink::S3Sink;
///
/// let out = S3Storage::builder("my-bucket", "exports/orders").from_env().build()?;
/// let sink = S3Sink::json_lines(out).with_roll_bytes(128 << 20).with_roll_interval(Duration::from_secs(300));
/// # let job = weibo::Job::new("orders").with_checkpoints("/var/lib/orders", Duration::from_secs(60));
/// # let orders = job.source(weibo::sources::IterSource::new(Vec::<u64>::new()));
/// orders.sink_exactly_once(sink);
/// # Ok(()) }
/// ```
pub struct S3Sink {
    storage: Arc<dyn CheckpointStorage>,
    roll_bytes: u64,
    roll_interval: Option<Duration>,
}

impl fmt::Debug for S3Sink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Sink").field("at", &self.storage.locate("")).finish_non_exhaustive()
    }
}

impl S3Sink {
    /// Parts of JSON lines (one record a line, `serde_json`) in `storage`:
    /// an [`S3Storage`](crate::s3::S3Storage), or any other storage (a
    /// local directory, for tests).
    pub fn json_lines(storage: impl CheckpointStorage) -> Self {
        Self { storage: Arc::new(storage), roll_bytes: 64 << 20, roll_interval: None }
    }

    /// Closes a part once it holds this many bytes (default 64 MiB).
    #[must_use]
    pub fn with_roll_bytes(mut self, bytes: u64) -> Self {
        // S3 copies objects of up to 5 GB in one request.
        self.roll_bytes = bytes.clamp(1, 4 << 30);
        self
    }

    /// Closes a part once it has been open this long (looked at when the
    /// job's buffer timeout flushes the sink; default: only by size and at
    /// barriers).
    #[must_use]
    pub fn with_roll_interval(mut self, interval: Duration) -> Self {
        self.roll_interval = Some(interval);
        self
    }

    fn name(&self) -> String {
        format!("s3 sink {}", self.storage.locate("").display())
    }

    fn err(&self, what: &str, e: std::io::Error) -> Error {
        Error::connector_caused(self.name(), what.to_string(), e)
    }
}

/// A pre-committed epoch: the writer's run, instance, epoch and parts
/// (their sizes; a handle of an earlier build records only their count,
/// and its parts' final names lack the run).
#[derive(Debug, PartialEq, Eq)]
struct Handle {
    run: String,
    instance: usize,
    epoch: u64,
    parts: Parts,
}

#[derive(Debug, PartialEq, Eq)]
enum Parts {
    /// `s3v1`: how many, final names without the run.
    Count(u32),
    /// `s3v2`: each one's size.
    Sizes(Vec<u64>),
}

impl Handle {
    fn encode(&self) -> String {
        match &self.parts {
            Parts::Count(n) => format!("s3v1:{}:{}:{}:{n}", self.run, self.instance, self.epoch),
            Parts::Sizes(sizes) => {
                let sizes: Vec<String> = sizes.iter().map(u64::to_string).collect();
                format!("s3v2:{}:{}:{}:{}", self.run, self.instance, self.epoch, sizes.join(","))
            }
        }
    }

    fn parse(h: &str) -> Option<Self> {
        let (v2, rest) = match (h.strip_prefix("s3v2:"), h.strip_prefix("s3v1:")) {
            (Some(rest), _) => (true, rest),
            (None, Some(rest)) => (false, rest),
            (None, None) => return None,
        };
        let mut it = rest.split(':');
        let run = it.next()?.to_string();
        let instance = it.next()?.parse().ok()?;
        let epoch = it.next()?.parse().ok()?;
        let last = it.next()?;
        let parts = if v2 {
            let sizes: Option<Vec<u64>> = last.split(',').filter(|p| !p.is_empty()).map(|p| p.parse().ok()).collect();
            Parts::Sizes(sizes?)
        } else {
            Parts::Count(last.parse().ok()?)
        };
        if it.next().is_some() || run.is_empty() || !run.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(Handle { run, instance, epoch, parts })
    }

    /// Each part's number, final name and size (when recorded).
    fn parts(&self) -> Vec<(u32, String, Option<u64>)> {
        match &self.parts {
            Parts::Count(n) => (0..*n)
                .map(|p| (p, format!("part-{:05}-{:020}-{p:05}.jsonl", self.instance, self.epoch), None))
                .collect(),
            Parts::Sizes(sizes) => (0u32..)
                .zip(sizes)
                .map(|(p, size)| (p, part_name(&self.run, self.instance, self.epoch, p), Some(*size)))
                .collect(),
        }
    }
}

/// `part-<instance>-<epoch>-<run>-<part>.jsonl`.
fn part_name(run: &str, instance: usize, epoch: u64, part: u32) -> String {
    format!("part-{instance:05}-{epoch:020}-{run}-{part:05}.jsonl")
}

/// The pending object of a part.
fn pending_name(run: &str, instance: usize, epoch: u64, part: u32) -> String {
    format!("{PENDING}/{run}/part-{instance:05}-{epoch:020}-{part:05}.jsonl")
}

/// The instance and epoch of a pending object's name.
fn parse_pending(name: &str) -> Option<(usize, u64)> {
    let file = name.strip_prefix(PENDING)?.strip_prefix('/')?.split_once('/')?.1;
    let mut it = file.strip_prefix("part-")?.strip_suffix(".jsonl")?.split('-');
    let instance = it.next()?.parse().ok()?;
    let epoch = it.next()?.parse().ok()?;
    Some((instance, epoch))
}

impl<T: Serialize + Send + 'static> TwoPhaseCommitSink<T> for S3Sink {
    fn default_name(&self) -> String {
        self.name()
    }

    fn open(&self, instance: usize, _parallelism: usize, epoch: CheckpointId) -> Result<Box<dyn TransactionWriter<T>>> {
        // What earlier runs left pending after the restored checkpoint (all
        // of it, on a fresh start) the restore discarded (`abort_after`).
        Ok(Box::new(S3Writer {
            storage: Arc::clone(&self.storage),
            name: self.name(),
            roll_bytes: self.roll_bytes,
            roll_interval: self.roll_interval,
            run: run_token(),
            instance,
            epoch: epoch.get(),
            sizes: Vec::new(),
            current: None,
            line: Vec::new(),
            _t: PhantomData,
        }))
    }

    fn commit(&self, handle: &str) -> Result<()> {
        let h = Handle::parse(handle)
            .ok_or_else(|| Error::connector(self.name(), format!("`{handle}` is not a handle of this sink")))?;
        weibo::blocking(|| {
            for (part, last, size) in h.parts() {
                let pending = pending_name(&h.run, h.instance, h.epoch, part);
                let pending_size = match self.storage.open(&pending) {
                    Ok(mut o) => {
                        Some(o.seek(std::io::SeekFrom::End(0)).map_err(|e| self.err("cannot read a pending part", e))?)
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => return Err(self.err("cannot look for a pending part", e)),
                };
                let published =
                    self.storage.exists(&last).map_err(|e| self.err("cannot look for a published part", e))?;
                match (pending_size, published) {
                    (Some(got), _) if size.is_some_and(|want| want != got) => {
                        return Err(Error::connector(
                            self.name(),
                            format!(
                                "pending part {pending} of `{handle}` holds {got} bytes, but its checkpoint recorded \
                                 {}: refusing to publish it",
                                size.unwrap_or_default()
                            ),
                        ));
                    }
                    // Published before a crash, its pending copy not yet
                    // deleted: the same object (no other run writes this name).
                    (Some(_), true) if size.is_some() => {}
                    (Some(_), _) => {
                        self.storage.copy(&pending, &last).map_err(|e| self.err("cannot publish a part", e))?;
                        weibo::checkpoint::faults::point("s3-after-publish");
                    }
                    (None, true) => continue,
                    (None, false) => {
                        return Err(Error::connector(
                            self.name(),
                            format!(
                                "part {last} of `{handle}` is neither pending nor published (was it deleted by hand?)"
                            ),
                        ));
                    }
                }
                self.storage
                    .delete(&pending)
                    .map_err(|e| self.err("cannot delete a published part's pending copy", e))?;
            }
            Ok(())
        })
    }

    fn abort_after(&self, checkpoint: CheckpointId) -> Result<u64> {
        weibo::blocking(|| {
            let pending =
                self.storage.list(&format!("{PENDING}/")).map_err(|e| self.err("cannot list pending parts", e))?;
            let mut epochs = std::collections::BTreeSet::new();
            for name in &pending {
                if let Some((instance, epoch)) = parse_pending(name).filter(|(_, e)| *e > checkpoint.get()) {
                    self.storage.delete(name).map_err(|e| self.err("cannot delete a pending part", e))?;
                    let run = name.split('/').nth(1).unwrap_or_default().to_string();
                    epochs.insert((run, instance, epoch));
                }
            }
            Ok(epochs.len() as u64)
        })
    }
}

/// The part being written.
struct Part {
    out: Box<dyn ObjectWriter>,
    bytes: u64,
    opened: Instant,
}

struct S3Writer<T> {
    storage: Arc<dyn CheckpointStorage>,
    name: String,
    roll_bytes: u64,
    roll_interval: Option<Duration>,
    run: String,
    instance: usize,
    /// The epoch being written.
    epoch: u64,
    /// The sizes of the epoch's parts so far (closed, and the open one).
    sizes: Vec<u64>,
    current: Option<Part>,
    line: Vec<u8>,
    _t: PhantomData<fn(T)>,
}

impl<T> S3Writer<T> {
    fn io(&self, what: &str) -> impl FnOnce(std::io::Error) -> Error + use<T> {
        let name = self.name.clone();
        let what = what.to_string();
        move |e| Error::connector_caused(name, what, e)
    }

    /// Writes the buffered lines into the open part (starting one). The
    /// write may wait for the network: a multipart upload sends a part
    /// once 8 MiB are buffered.
    fn drain_lines(&mut self) -> Result<()> {
        if self.line.is_empty() {
            return Ok(());
        }
        let lines = std::mem::take(&mut self.line);
        let err = self.io("cannot write a part");
        let part = self.part()?;
        weibo::blocking(|| part.out.write_all(&lines)).map_err(err)?;
        part.bytes += lines.len() as u64;
        let bytes = part.bytes;
        if let Some(size) = self.sizes.last_mut() {
            *size = bytes;
        }
        self.line = lines;
        self.line.clear();
        Ok(())
    }

    /// Closes the open part (after the buffered lines): it is then a
    /// complete pending object.
    fn roll(&mut self) -> Result<()> {
        self.drain_lines()?;
        if let Some(part) = self.current.take() {
            let err = self.io("cannot finish a part");
            weibo::blocking(|| part.out.finish()).map_err(err)?;
        }
        Ok(())
    }

    fn part(&mut self) -> Result<&mut Part> {
        if self.current.is_none() {
            let part = u32::try_from(self.sizes.len()).map_err(|_| weibo::internal_error!("too many parts"))?;
            let name = pending_name(&self.run, self.instance, self.epoch, part);
            let err = self.io("cannot start a part");
            let out = weibo::blocking(|| self.storage.create(&name)).map_err(err)?;
            self.sizes.push(0);
            self.current = Some(Part { out, bytes: 0, opened: Instant::now() });
        }
        self.current.as_mut().ok_or_else(|| weibo::internal_error!("no open part"))
    }

    fn seal(&mut self) -> Result<String> {
        self.roll()?;
        if self.sizes.is_empty() {
            // No records this epoch: nothing to commit.
            return Ok(String::new());
        }
        let sizes = std::mem::take(&mut self.sizes);
        Ok(Handle { run: self.run.clone(), instance: self.instance, epoch: self.epoch, parts: Parts::Sizes(sizes) }
            .encode())
    }
}

impl<T: Serialize + Send> TransactionWriter<T> for S3Writer<T> {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        let offsets: Vec<u64> = batch.meta().iter().map(|m| m.offset).collect();
        for (v, offset) in batch.drain().zip(offsets) {
            // Lines gather in a buffer and go into the part a megabyte (or
            // a part) at a time: a write to the part may wait for the
            // network, and takes the thread off the runtime for it.
            serde_json::to_writer(&mut self.line, &v).map_err(|e| {
                Error::connector_caused(
                    self.name.clone(),
                    format!("cannot write the record from offset {offset} as JSON"),
                    e,
                )
            })?;
            self.line.push(b'\n');
            let open = self.current.as_ref().map_or(0, |p| p.bytes);
            if open + self.line.len() as u64 >= self.roll_bytes || self.line.len() >= 1 << 20 {
                self.drain_lines()?;
                if self.current.as_ref().is_some_and(|p| p.bytes >= self.roll_bytes) {
                    self.roll()?;
                }
            }
        }
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<String> {
        let handle = self.seal()?;
        self.epoch = checkpoint.next().get();
        Ok(handle)
    }

    fn finish(&mut self) -> Result<String> {
        self.seal()
    }

    fn flush(&mut self) -> Result<()> {
        self.drain_lines()?;
        self.roll_if_old()
    }
}

impl<T> S3Writer<T> {
    /// Rolls a part that has been open for the roll interval.
    fn roll_if_old(&mut self) -> Result<()> {
        let old = match (&self.current, self.roll_interval) {
            (Some(p), Some(i)) => p.opened.elapsed() >= i,
            _ => false,
        };
        if old { self.roll() } else { Ok(()) }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_and_handles_round_trip() {
        let h = Handle { run: "ab12".into(), instance: 3, epoch: 9, parts: Parts::Sizes(vec![10, 0, 7]) };
        assert_eq!(Handle::parse(&h.encode()), Some(h));
        let old = Handle { run: "ab12".into(), instance: 3, epoch: 9, parts: Parts::Count(2) };
        assert_eq!(Handle::parse("s3v1:ab12:3:9:2"), Some(old));
        assert_eq!(Handle::parse("s3v1:zz:1:2:3"), None);
        assert_eq!(Handle::parse("s3v2:ab:1:2:x"), None);
        assert_eq!(Handle::parse("pg2:ab:1:2:3"), None);
        let p = pending_name("ab12", 3, 9, 1);
        assert_eq!(p, "_pending/ab12/part-00003-00000000000000000009-00001.jsonl");
        assert_eq!(parse_pending(&p), Some((3, 9)));
        assert_eq!(parse_pending("part-00003-00000000000000000009-00001.jsonl"), None);
        // Final names carry the run: two runs never publish the same name.
        assert_ne!(part_name("ab12", 3, 9, 0), part_name("cd34", 3, 9, 0));
        assert_eq!(part_name("ab12", 3, 9, 0), "part-00003-00000000000000000009-ab12-00000.jsonl");
    }
}
