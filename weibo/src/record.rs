//! Records as the runtime sees them: typed batches inside a fused node, byte
//! batches on edges between nodes.

use std::fmt;
use std::sync::Arc;

/// A timestamp in milliseconds since the Unix epoch (event time).
pub type Timestamp = i64;

/// The timestamp of a record that has none yet, and the watermark of a
/// stream that has none: nothing is known about time.
pub const NO_TIMESTAMP: Timestamp = i64::MIN;

/// The watermark at the end of input: every window may fire.
pub const END_OF_TIME: Timestamp = i64::MAX;

/// Per-record metadata that travels beside every value: the record's event
/// time, the watermark it was read under, and where it came from (source,
/// partition, offset), so that failures and dead letters can name their
/// input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    /// Event time, or [`NO_TIMESTAMP`].
    pub timestamp: Timestamp,
    /// The watermark of the record's input before this record arrived
    /// ([`NO_TIMESTAMP`] when its stream has none). Carrying it per record
    /// lets a downstream operator judge every record under exactly the
    /// watermark of the records before it, however records are batched.
    pub watermark: Timestamp,
    /// Position in the source partition (line byte offset, generator index, Kafka offset).
    pub offset: u64,
    /// The source partition.
    pub partition: u32,
    /// The source's index in the job (resolved to its name by the job).
    pub source: u32,
}

/// Where a record came from, for error messages and dead letters.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct SourcePosition {
    /// The source's name in the job.
    pub source: String,
    /// The source partition.
    pub partition: u32,
    /// The record's offset within the partition.
    pub offset: u64,
}

impl fmt::Display for SourcePosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "source `{}` partition {} offset {}", self.source, self.partition, self.offset)
    }
}

/// The names of a job's sources, by index.
#[derive(Clone, Debug, Default)]
pub(crate) struct SourceNames(pub(crate) Arc<[String]>);

impl SourceNames {
    pub(crate) fn position(&self, meta: &Meta) -> SourcePosition {
        let source = usize::try_from(meta.source)
            .ok()
            .and_then(|i| self.0.get(i))
            .cloned()
            .unwrap_or_else(|| format!("#{}", meta.source));
        SourcePosition { source, partition: meta.partition, offset: meta.offset }
    }
}

/// A batch of typed values with their metadata, passed between fused
/// operators without encoding. `values` and `meta` always have equal length.
#[derive(Debug)]
pub(crate) struct Batch<T> {
    pub(crate) values: Vec<T>,
    pub(crate) meta: Vec<Meta>,
}

impl<T> Batch<T> {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self { values: Vec::with_capacity(n), meta: Vec::with_capacity(n) }
    }

    #[inline]
    pub(crate) fn push(&mut self, value: T, meta: Meta) {
        self.values.push(value);
        self.meta.push(meta);
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.values.len()
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.values.clear();
        self.meta.clear();
    }
}

impl<T: Clone> Clone for Batch<T> {
    fn clone(&self) -> Self {
        Self { values: self.values.clone(), meta: self.meta.clone() }
    }
}

/// One record's entry in a [`RecordBatch`]: its key group and metadata
/// (40 bytes; where its bytes are is in [`Span`]).
#[derive(Clone, Copy, Debug)]
struct Entry {
    group: u16,
    meta: Meta,
}

/// Where an encoded record's key and value are in a [`RecordBatch`]'s
/// arena. Kept apart from [`Entry`]: a typed batch has none, and its
/// entries are 8 bytes smaller for it (each record's entry is written by
/// the router and read by the operator).
#[derive(Clone, Copy, Debug)]
struct Span {
    key_start: u32,
    value_start: u32,
    value_end: u32,
}

/// A batch of records: one contiguous byte arena holding every key and
/// value of encoded records, an entry per record (key group, metadata),
/// and, once the batch holds an encoded record, each record's offsets
/// into the arena (a [`Span`] per entry).
///
/// On an edge inside one process the records stay typed: the router keeps
/// each record's key and value in [`RecordBatch::typed`] (a `Vec<(K, T)>`,
/// erased), so nothing is encoded to cross the edge and nothing decoded on
/// the other side, and the arena stays empty (a record's key and value
/// slices are empty). The key's encoding is computed all the same, for the
/// key group, but not carried: a byte state backend encodes the typed key
/// again where it needs the bytes. A batch without a typed part carries
/// encoded keys and values.
#[derive(Default)]
pub(crate) struct RecordBatch {
    data: Vec<u8>,
    entries: Vec<Entry>,
    /// One per entry once any record of the batch was encoded; empty while
    /// every record is typed (see [`RecordBatch::commit_typed`]).
    spans: Vec<Span>,
    /// The records' keys and values, typed (see above), in entry order.
    typed: Option<Box<dyn TypedRecords>>,
    /// Whether the records are a broadcast input's, sent to every instance
    /// of a keyed operator: values without keys (typed, the values alone;
    /// encoded, an empty key), handled apart from the keyed records.
    broadcast: bool,
    /// Where the batch's memory goes back once read, for its sender to reuse.
    pool: Option<BatchPool>,
}

impl fmt::Debug for RecordBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordBatch")
            .field("records", &self.entries.len())
            .field("bytes", &self.data.len())
            .field("typed", &self.typed.as_ref().map(|t| t.len()))
            .finish_non_exhaustive()
    }
}

/// The typed part of a [`RecordBatch`]: a `Vec` of records, its element
/// type erased; the runtime sees its length only.
pub(crate) trait TypedRecords: Send {
    fn len(&self) -> usize;
    fn clear(&mut self);
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

impl<R: Send + 'static> TypedRecords for Vec<R> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn clear(&mut self) {
        Vec::clear(self);
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// Spent batches of one edge, returned by the receiver for the sender to
/// fill again: memory is reused instead of allocated and freed across
/// threads for every batch.
#[derive(Clone, Debug, Default)]
pub(crate) struct BatchPool(Arc<std::sync::Mutex<Vec<RecordBatch>>>);

impl BatchPool {
    /// Batches kept at most; more are freed.
    const KEEP: usize = 16;

    /// An empty batch: a returned one if any, else a new one.
    pub(crate) fn take(&self, records: usize, bytes: usize) -> RecordBatch {
        let reused = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop();
        let mut batch = reused.unwrap_or_else(|| RecordBatch::with_capacity(records, bytes));
        batch.pool = Some(self.clone());
        batch
    }

    fn put(&self, mut batch: RecordBatch) {
        batch.data.clear();
        batch.entries.clear();
        batch.spans.clear();
        if let Some(typed) = batch.typed.as_mut() {
            // Emptied, its memory kept for the sender's next batch.
            typed.clear();
        }
        batch.pool = None;
        batch.broadcast = false;
        let mut kept = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if kept.len() < Self::KEEP {
            kept.push(batch);
        }
    }
}

/// A borrowed record of a [`RecordBatch`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecordRef<'a> {
    /// The encoded key, or empty for a typed record (see [`RecordBatch`]).
    pub(crate) key: &'a [u8],
    /// The encoded value, or empty for a typed record.
    pub(crate) value: &'a [u8],
    pub(crate) group: u16,
    pub(crate) meta: Meta,
}

impl RecordBatch {
    pub(crate) fn with_capacity(records: usize, bytes: usize) -> Self {
        Self {
            data: Vec::with_capacity(bytes),
            entries: Vec::with_capacity(records),
            spans: Vec::new(),
            typed: None,
            broadcast: false,
            pool: None,
        }
    }

    /// Swaps the batch's typed records with `records` (see [`RecordBatch`]):
    /// a router fills a `Vec<R>` of its own and swaps it in when it sends the
    /// batch, getting back the memory of an earlier batch of the same edge.
    pub(crate) fn swap_typed<R: Send + 'static>(&mut self, records: &mut Vec<R>) {
        if let Some(mine) = self.typed.as_mut().and_then(|t| t.as_any_mut().downcast_mut::<Vec<R>>()) {
            std::mem::swap(mine, records);
        } else {
            self.typed = Some(Box::new(std::mem::take(records)));
        }
    }

    /// Moves the typed records into `into` (emptied first; the batch keeps
    /// `into`'s memory for its sender to reuse) and says whether there were
    /// any: `false` means the values are encoded and must be decoded.
    ///
    /// # Errors
    /// What went wrong, when the batch holds typed records of another type,
    /// or not one per entry (a bug in the plan, which wires a router to the
    /// operator that reads its records; the caller reports it as internal).
    pub(crate) fn take_typed<R: Send + 'static>(&mut self, into: &mut Vec<R>, reader: &str) -> Result<bool, String> {
        into.clear();
        let Some(typed) = self.typed.as_mut() else { return Ok(false) };
        if typed.len() == 0 && !self.entries.is_empty() {
            // A reused batch whose records were encoded this time.
            return Ok(false);
        }
        match typed.as_any_mut().downcast_mut::<Vec<R>>() {
            Some(records) if records.len() == self.entries.len() => {
                std::mem::swap(records, into);
                Ok(true)
            }
            Some(records) => Err(format!(
                "`{reader}` got a batch of {} records with {} typed values",
                self.entries.len(),
                records.len()
            )),
            None => Err(format!("`{reader}` got typed records that are not `{}`", std::any::type_name::<R>())),
        }
    }

    /// Gives the batch's memory back to its sender, if it came from a pool.
    pub(crate) fn recycle(mut self) {
        if let Some(pool) = self.pool.take() {
            pool.put(self);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Marks the batch as a broadcast input's (see [`RecordBatch`]'s field).
    pub(crate) fn set_broadcast(&mut self) {
        self.broadcast = true;
    }

    /// Whether the batch holds a broadcast input's records.
    pub(crate) fn is_broadcast(&self) -> bool {
        self.broadcast
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn byte_len(&self) -> usize {
        self.data.len()
    }

    /// Starts a record: the caller appends the key bytes to the returned
    /// buffer, calls [`RecordBatch::mark_value`], appends the value bytes, then
    /// [`RecordBatch::commit`].
    #[inline]
    pub(crate) fn data_mut(&mut self) -> &mut Vec<u8> {
        &mut self.data
    }

    /// Adds a record whose key is `data[key_start..value_start]` and value is
    /// `data[value_start..]`.
    #[inline]
    pub(crate) fn commit(&mut self, key_start: usize, value_start: usize, group: u16, meta: Meta) {
        if self.spans.len() < self.entries.len() {
            // Typed records before this one: their keys and values are empty.
            let at = key_start as u32;
            self.spans.resize(self.entries.len(), Span { key_start: at, value_start: at, value_end: at });
        }
        // Batches are flushed long before 4 GiB, so offsets fit in u32.
        self.spans.push(Span {
            key_start: key_start as u32,
            value_start: value_start as u32,
            value_end: self.data.len() as u32,
        });
        self.entries.push(Entry { group, meta });
    }

    /// Adds a record whose key and value travel typed (see [`RecordBatch`]):
    /// its key and value slices are empty.
    #[inline]
    pub(crate) fn commit_typed(&mut self, group: u16, meta: Meta) {
        if !self.spans.is_empty() {
            let at = self.data.len() as u32;
            self.spans.push(Span { key_start: at, value_start: at, value_end: at });
        }
        self.entries.push(Entry { group, meta });
    }

    /// Drops a record that was started but whose value failed to encode.
    #[inline]
    pub(crate) fn rollback(&mut self, key_start: usize) {
        self.data.truncate(key_start);
    }

    pub(crate) fn iter(&self) -> RecordIter<'_> {
        // `commit` and `commit_typed` keep a span per entry once there is one.
        debug_assert!(self.spans.is_empty() || self.spans.len() == self.entries.len());
        if self.spans.is_empty() {
            RecordIter(Records::Typed(self.entries.iter()))
        } else {
            RecordIter(Records::Encoded { data: &self.data, records: self.entries.iter().zip(self.spans.iter()) })
        }
    }
}

/// The records of a [`RecordBatch`], in order.
#[derive(Clone, Debug)]
pub(crate) struct RecordIter<'a>(Records<'a>);

#[derive(Clone, Debug)]
enum Records<'a> {
    /// Every record typed: empty keys and values.
    Typed(std::slice::Iter<'a, Entry>),
    /// Records in the arena `data`.
    Encoded { data: &'a [u8], records: std::iter::Zip<std::slice::Iter<'a, Entry>, std::slice::Iter<'a, Span>> },
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = RecordRef<'a>;

    #[inline]
    fn next(&mut self) -> Option<RecordRef<'a>> {
        match &mut self.0 {
            Records::Typed(entries) => {
                entries.next().map(|e| RecordRef { key: &[], value: &[], group: e.group, meta: e.meta })
            }
            Records::Encoded { data, records } => records.next().map(|(e, s)| RecordRef {
                key: data.get(s.key_start as usize..s.value_start as usize).unwrap_or_default(),
                value: data.get(s.value_start as usize..s.value_end as usize).unwrap_or_default(),
                group: e.group,
                meta: e.meta,
            }),
        }
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.0 {
            Records::Typed(entries) => entries.size_hint(),
            Records::Encoded { records, .. } => records.size_hint(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn record_batch_keeps_keys_and_values_apart() {
        let mut b = RecordBatch::default();
        let meta = Meta { timestamp: 5, watermark: 4, offset: 9, partition: 1, source: 0 };
        for (k, v) in [(&b"ab"[..], &b"xyz"[..]), (b"", b"1"), (b"k", b"")] {
            let start = b.data_mut().len();
            b.data_mut().extend_from_slice(k);
            let value_start = b.data_mut().len();
            b.data_mut().extend_from_slice(v);
            b.commit(start, value_start, 3, meta);
        }
        let got: Vec<_> = b.iter().map(|r| (r.key.to_vec(), r.value.to_vec(), r.group)).collect();
        assert_eq!(
            got,
            vec![(b"ab".to_vec(), b"xyz".to_vec(), 3), (vec![], b"1".to_vec(), 3), (b"k".to_vec(), vec![], 3)]
        );
        assert_eq!(b.len(), 3);
    }

    #[test]
    fn typed_and_encoded_records_mix_in_one_batch() {
        let meta = |offset| Meta { timestamp: 1, watermark: 0, offset, partition: 0, source: 0 };
        let encoded = |b: &mut RecordBatch, k: &[u8], v: &[u8], offset| {
            let start = b.data_mut().len();
            b.data_mut().extend_from_slice(k);
            let value_start = b.data_mut().len();
            b.data_mut().extend_from_slice(v);
            b.commit(start, value_start, 1, meta(offset));
        };
        let pool = BatchPool::default();
        let mut b = pool.take(8, 64);
        b.commit_typed(7, meta(0));
        b.commit_typed(8, meta(1));
        encoded(&mut b, b"k", b"vv", 2);
        b.commit_typed(9, meta(3));
        encoded(&mut b, b"", b"w", 4);
        let got: Vec<_> = b.iter().map(|r| (r.key.to_vec(), r.value.to_vec(), r.group, r.meta.offset)).collect();
        assert_eq!(
            got,
            vec![
                (vec![], vec![], 7, 0),
                (vec![], vec![], 8, 1),
                (b"k".to_vec(), b"vv".to_vec(), 1, 2),
                (vec![], vec![], 9, 3),
                (vec![], b"w".to_vec(), 1, 4),
            ]
        );
        assert_eq!(b.iter().size_hint(), (5, Some(5)));
        // Reused, the batch starts typed again.
        b.recycle();
        let mut again = pool.take(8, 64);
        again.commit_typed(3, meta(9));
        let got: Vec<_> = again.iter().map(|r| (r.key.len(), r.value.len(), r.group, r.meta.offset)).collect();
        assert_eq!(got, vec![(0, 0, 3, 9)]);
    }

    #[test]
    fn typed_records_cross_a_batch_and_their_memory_goes_back_to_the_sender() {
        let pool = BatchPool::default();
        let meta = Meta { timestamp: 1, watermark: 0, offset: 0, partition: 0, source: 0 };
        let mut b = pool.take(4, 64);
        let mut mine: Vec<(u64, String)> = Vec::with_capacity(8);
        for k in 0..3u64 {
            let start = b.data_mut().len();
            b.data_mut().extend_from_slice(&k.to_be_bytes());
            let value_start = b.data_mut().len();
            b.commit(start, value_start, 0, meta);
            mine.push((k, format!("v{k}")));
        }
        b.swap_typed(&mut mine);
        assert!(mine.is_empty(), "the sender's vector went into the batch");
        let mut got: Vec<(u64, String)> = Vec::new();
        assert!(b.take_typed(&mut got, "test").unwrap());
        assert_eq!(got, vec![(0, "v0".into()), (1, "v1".into()), (2, "v2".into())]);
        assert!(b.iter().all(|r| r.value.is_empty()), "typed records have no value bytes");
        let capacity = got.capacity();
        // The reader's (now empty) vector goes back with the batch, for the
        // sender to fill next.
        got.clear();
        b.swap_typed(&mut got);
        b.recycle();
        let mut again = pool.take(4, 64);
        let mut next: Vec<(u64, String)> = Vec::new();
        again.swap_typed(&mut next);
        assert!(next.is_empty() && next.capacity() == capacity, "the memory came back");
    }

    #[test]
    fn a_batch_without_typed_records_is_read_as_encoded_and_a_wrong_type_is_an_error() {
        let meta = Meta { timestamp: 1, watermark: 0, offset: 0, partition: 0, source: 0 };
        let mut b = RecordBatch::default();
        b.data_mut().extend_from_slice(b"kv");
        b.commit(0, 1, 0, meta);
        let mut into: Vec<u32> = vec![7];
        assert!(!b.take_typed(&mut into, "test").unwrap(), "no typed part: encoded");
        assert!(into.is_empty());
        let mut typed = vec![1u32];
        b.swap_typed(&mut typed);
        let mut wrong: Vec<u64> = Vec::new();
        let e = b.take_typed(&mut wrong, "reader").unwrap_err();
        assert!(e.contains("reader") && e.contains("u64"), "{e}");
        let mut short = vec![1u32, 2];
        b.swap_typed(&mut short);
        let mut into: Vec<u32> = Vec::new();
        let e = b.take_typed(&mut into, "reader").unwrap_err();
        assert!(e.contains("1 records with 2 typed values"), "{e}");
    }
}

/// What travels on an edge.
#[derive(Debug)]
pub(crate) enum Message {
    /// A batch of encoded records.
    Data(RecordBatch),
    /// No record with a smaller timestamp will follow on this edge.
    Watermark(Timestamp),
    /// The sender's input is idle: until it sends again, it must not hold
    /// the receiver's watermark back.
    Idle,
    /// Checkpoint barrier `n`: everything before it belongs to checkpoint `n`.
    Barrier(CheckpointId),
    /// The sender has finished: nothing follows.
    EndOfInput,
}

/// The number of a checkpoint: 1, 2, 3, … in the order a job takes them.
/// A job restarted in the same storage goes on after the highest number
/// there, so numbers are never reused. A checkpoint's barrier carries its
/// number, and the records before barrier `n` (after barrier `n - 1`) are
/// epoch `n` of an exactly-once sink.
///
/// ```
/// use weibo::record::CheckpointId;
/// let first = CheckpointId::FIRST;
/// assert_eq!(first.get(), 1);
/// assert_eq!(first.next(), CheckpointId::new(2));
/// assert!(CheckpointId::NONE < first);
/// assert_eq!(first.to_string(), "1");
/// assert!(first == 1 && first < 2, "compares with plain numbers");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct CheckpointId(u64);

impl CheckpointId {
    /// No checkpoint: what a job that has not completed one (and restored
    /// none) has.
    pub const NONE: Self = Self(0);
    /// The first checkpoint a job takes in an empty storage.
    pub const FIRST: Self = Self(1);

    /// Checkpoint number `n`.
    pub const fn new(n: u64) -> Self {
        Self(n)
    }

    /// The number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The checkpoint after this one.
    #[must_use]
    pub const fn next(self) -> Self {
        Self(self.0.saturating_add(1))
    }

    /// Whether this is [`CheckpointId::NONE`].
    pub const fn is_none(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for CheckpointId {
    /// The number, formatted as a `u64` is (`{:020}` pads it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Compares with a plain number: `id == 3`, `id < 10`.
impl PartialEq<u64> for CheckpointId {
    fn eq(&self, other: &u64) -> bool {
        self.0 == *other
    }
}

impl PartialOrd<u64> for CheckpointId {
    fn partial_cmp(&self, other: &u64) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(other)
    }
}

impl PartialEq<CheckpointId> for u64 {
    fn eq(&self, other: &CheckpointId) -> bool {
        *self == other.0
    }
}

impl PartialOrd<CheckpointId> for u64 {
    fn partial_cmp(&self, other: &CheckpointId) -> Option<std::cmp::Ordering> {
        self.partial_cmp(&other.0)
    }
}

impl From<CheckpointId> for u64 {
    fn from(id: CheckpointId) -> u64 {
        id.0
    }
}
