//! Asynchronous enrichment (`map_async`): each record of a keyed stream is
//! passed to a function that returns a future (a call to a service), with
//! a bound on the calls in flight per instance, a timeout and retries with
//! backoff per call, results in input order or as they complete, and an
//! optional cache of results per key: Flink's `AsyncWaitOperator`.
//!
//! Each call runs as a tokio task of its own; its result comes back on a
//! channel the operator's task polls beside its inputs
//! ([`InputOperator::poll_work`]), and while the calls in flight are at
//! the bound the operator takes no input ([`InputOperator::accepts_input`]),
//! which backpressures upstream.
//!
//! - A watermark is held back until every record before it has had its
//!   result emitted (or failed): no result is ever behind the watermark
//!   that followed its record.
//! - At a checkpoint's barrier the records whose results are not emitted
//!   yet are part of the snapshot (state `in_flight`, in their keys' key
//!   groups); a restore issues their calls again. Their results emitted
//!   after the barrier belong to the next checkpoint, so an exactly-once
//!   sink downstream commits each result once.
//! - A call that fails (an error or the timeout) on its last attempt fails
//!   its record under the operator's policy (stop the job, drop and count,
//!   or send the record to the dead letters).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::{Error, Result};
use crate::metrics::{OperatorCounters, StateStats};
use crate::operator::factory::{KeyedFactory, keyed_factory};
use crate::operator::keyed::take_records;
use crate::operator::outputs::{Outputs, open_process_outputs};
use crate::operator::policy::{Failures, Policy};
use crate::operator::{Consumer, InputOperator, OpInfo, SnapshotAt, emit, restore_state, snapshot_state};
use crate::record::{Batch, CheckpointId, Meta, NO_TIMESTAMP, RecordBatch, Timestamp};
use crate::state::{Barrier, EntryRef, KeyedState, RemovedRef, RestoreSource, Snapshot, StateSnapshot, StateType};
use crate::time::watermarks::InputTime;

/// A call's future, boxed.
pub(crate) type Call<U> = Pin<Box<dyn Future<Output = std::result::Result<U, String>> + Send>>;

/// Makes the call for a record (its key and value).
pub(crate) type CallFn<K, T, U> = Arc<dyn Fn(&K, &T) -> Call<U> + Send + Sync>;

/// How a `map_async` calls its function: see [`AsyncOptions`] for each.
///
/// ```
/// use std::time::Duration;
/// use weibo::AsyncOptions;
/// let options = AsyncOptions::new()
///     .in_flight(200)
///     .timeout(Duration::from_millis(500))
///     .retries(3, Duration::from_millis(50))
///     .unordered()
///     .cache(Duration::from_secs(60), 10_000);
/// # let _ = options;
/// ```
#[derive(Clone, Debug)]
pub struct AsyncOptions {
    pub(crate) in_flight: usize,
    pub(crate) timeout: Duration,
    pub(crate) retries: u32,
    pub(crate) backoff: Duration,
    pub(crate) ordered: bool,
    pub(crate) cache: Option<(Duration, usize)>,
}

impl Default for AsyncOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl AsyncOptions {
    /// 100 calls in flight per instance, a 10 s timeout, no retry, results
    /// in input order, no cache.
    pub fn new() -> Self {
        Self {
            in_flight: 100,
            timeout: Duration::from_secs(10),
            retries: 0,
            backoff: Duration::from_millis(100),
            ordered: true,
            cache: None,
        }
    }

    /// At most `n` calls in flight per instance (at least 1): when that
    /// many wait, the operator reads no more input until one completes.
    #[must_use]
    pub fn in_flight(self, n: usize) -> Self {
        Self { in_flight: n.max(1), ..self }
    }

    /// Each attempt of a call is abandoned after `timeout` (and counts as
    /// a failed attempt).
    #[must_use]
    pub fn timeout(self, timeout: Duration) -> Self {
        Self { timeout, ..self }
    }

    /// A failed attempt is tried again, up to `retries` more times, after
    /// `backoff`, doubled after each attempt (up to 64 times `backoff`).
    #[must_use]
    pub fn retries(self, retries: u32, backoff: Duration) -> Self {
        Self { retries, backoff, ..self }
    }

    /// Results are emitted as their calls complete, not in input order
    /// (never across a watermark: those before it come out before it).
    #[must_use]
    pub fn unordered(self) -> Self {
        Self { ordered: false, ..self }
    }

    /// Keeps each key's last result for `ttl` (at most `max_entries` keys
    /// per instance, the oldest dropped first): a record whose key has one
    /// gets it without a call. The cache is not checkpointed.
    #[must_use]
    pub fn cache(self, ttl: Duration, max_entries: usize) -> Self {
        Self { cache: Some((ttl, max_entries.max(1))), ..self }
    }
}

/// A record waiting for its result.
struct Slot<K, T, U> {
    key: K,
    group: u16,
    value: T,
    meta: Meta,
    /// Its result, once its call completed (or its key was cached).
    result: Option<std::result::Result<U, String>>,
    task: Option<tokio::task::AbortHandle>,
}

/// The operator of `map_async` on a keyed stream.
pub(crate) fn factory<K, T, U>(policy: Policy, options: AsyncOptions, call: CallFn<K, T, U>) -> Arc<dyn KeyedFactory>
where
    K: Key,
    T: Data,
    U: Clone + Send + Sync + 'static,
{
    let opener = Outputs::new().opener();
    keyed_factory(move |ctx, outs| {
        let info = ctx.info.clone();
        let (next, dead, _) = open_process_outputs::<U, T>(outs, policy, &opener, &info.name)?;
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Ok(Box::new(AsyncOp::<K, T, U> {
            info,
            options: options.clone(),
            call: call.clone(),
            slots: BTreeMap::new(),
            queue: VecDeque::new(),
            next_seq: 0,
            done_tx,
            done_rx,
            held: VecDeque::new(),
            watermark: NO_TIMESTAMP,
            cache: HashMap::new(),
            cache_order: VecDeque::new(),
            restored: Vec::new(),
            out: Batch::with_capacity(ctx.batch_size),
            next,
            failures: Failures::new(policy, dead)?,
            records: Vec::new(),
        }))
    })
}

struct AsyncOp<K, T, U> {
    info: OpInfo,
    options: AsyncOptions,
    call: CallFn<K, T, U>,
    /// The records admitted (their calls in flight, or their results
    /// waiting for earlier ones), by arrival: at most `in_flight`.
    slots: BTreeMap<u64, Slot<K, T, U>>,
    /// The records received but not admitted yet (the bound was reached),
    /// with their sequence numbers: the operator takes input while fewer
    /// than `in_flight` wait here, so that a barrier behind them can still
    /// reach it (they are part of the checkpoint, as those in flight).
    queue: VecDeque<(u64, K, u16, T, Meta)>,
    next_seq: u64,
    done_tx: mpsc::UnboundedSender<(u64, std::result::Result<U, String>)>,
    done_rx: mpsc::UnboundedReceiver<(u64, std::result::Result<U, String>)>,
    /// Watermarks held back: each goes out once every record that came
    /// before it (sequence numbers below its own) is done.
    held: VecDeque<(u64, Timestamp)>,
    /// The watermark forwarded last.
    watermark: Timestamp,
    /// Each key's last result and when it expires; keys in insertion
    /// order, for dropping the oldest.
    cache: HashMap<K, (U, Instant)>,
    cache_order: VecDeque<K>,
    /// Records restored from a checkpoint, their calls not issued yet.
    restored: Vec<(K, u16, Timestamp, T)>,
    out: Batch<U>,
    next: Box<dyn Consumer<U>>,
    failures: Failures<T>,
    records: Vec<(K, T)>,
}

impl<K, T, U> Drop for AsyncOp<K, T, U> {
    fn drop(&mut self) {
        // Calls in flight when the job stops are abandoned.
        for slot in self.slots.values() {
            if let Some(task) = &slot.task {
                task.abort();
            }
        }
    }
}

impl<K: Key, T: Data, U: Clone + Send + Sync + 'static> AsyncOp<K, T, U> {
    /// Takes in a record: queued, then admitted as room allows.
    fn receive(&mut self, key: K, group: u16, value: T, meta: Meta) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queue.push_back((seq, key, group, value, meta));
        self.admit();
    }

    /// Admits queued records while fewer than `in_flight` are admitted:
    /// each gets its key's cached result, or a call.
    fn admit(&mut self) {
        while self.slots.len() < self.options.in_flight {
            let Some((seq, key, group, value, meta)) = self.queue.pop_front() else { return };
            let cached =
                self.options.cache.and_then(|_| self.cache.get(&key)).filter(|(_, until)| *until > Instant::now());
            let (result, task) = match cached {
                Some((u, _)) => (Some(Ok(u.clone())), None),
                None => (None, Some(self.spawn(seq, &key, &value))),
            };
            self.slots.insert(seq, Slot { key, group, value, meta, result, task });
        }
    }

    /// Runs the call for record `seq` on a task of its own: its attempts,
    /// each under the timeout, with backoff between them; the outcome goes
    /// to the operator's channel.
    fn spawn(&self, seq: u64, key: &K, value: &T) -> tokio::task::AbortHandle {
        let (call, key, value, done) = (self.call.clone(), key.clone(), value.clone(), self.done_tx.clone());
        let (timeout, retries, backoff) = (self.options.timeout, self.options.retries, self.options.backoff);
        let task = tokio::spawn(async move {
            let mut attempt = 0u32;
            let outcome = loop {
                let error = match tokio::time::timeout(timeout, call(&key, &value)).await {
                    Ok(Ok(u)) => break Ok(u),
                    Ok(Err(e)) => e,
                    Err(_) => format!("no answer within {timeout:?}"),
                };
                if attempt >= retries {
                    break Err(if retries == 0 { error } else { format!("{error} (after {} attempts)", attempt + 1) });
                }
                tokio::time::sleep(backoff.saturating_mul(1 << attempt.min(6))).await;
                attempt += 1;
            };
            // The operator may be gone (the job stopped): nothing to do.
            let _ = done.send((seq, outcome));
        });
        task.abort_handle()
    }

    /// Issues the calls of the records restored from a checkpoint.
    fn issue_restored(&mut self) {
        for (key, group, timestamp, value) in std::mem::take(&mut self.restored) {
            let meta = Meta { timestamp, watermark: self.watermark, offset: 0, partition: 0, source: u32::MAX };
            self.receive(key, group, value, meta);
        }
    }

    /// Emits what is ready (in order, or all that completed), fails what
    /// failed, and forwards the watermarks no record holds back any more.
    fn release(&mut self) -> Result<()> {
        loop {
            let ready: Vec<u64> = if self.options.ordered {
                self.slots.iter().take_while(|(_, s)| s.result.is_some()).map(|(seq, _)| *seq).collect()
            } else {
                self.slots.iter().filter(|(_, s)| s.result.is_some()).map(|(seq, _)| *seq).collect()
            };
            for seq in ready {
                let Some(slot) = self.slots.remove(&seq) else { continue };
                let meta = Meta { watermark: self.watermark, ..slot.meta };
                match slot.result {
                    Some(Ok(u)) => {
                        if let Some((ttl, most)) = self.options.cache {
                            if self.cache.insert(slot.key.clone(), (u.clone(), Instant::now() + ttl)).is_none() {
                                self.cache_order.push_back(slot.key);
                            }
                            while self.cache.len() > most {
                                let Some(oldest) = self.cache_order.pop_front() else { break };
                                self.cache.remove(&oldest);
                            }
                        }
                        self.out.push(u, meta);
                    }
                    Some(Err(message)) => {
                        let message = format!("the asynchronous call failed: {message}");
                        self.failures.fail(&self.info, slot.value, slot.meta, &message)?;
                    }
                    None => {}
                }
            }
            emit(&self.info, &mut *self.next, &mut self.out)?;
            self.failures.push()?;
            let admitted = self.slots.len();
            self.admit();
            if self.slots.len() > admitted && self.slots.values().any(|s| s.result.is_some()) {
                // Cached results admitted: out with the next pass.
                continue;
            }
            // A held watermark goes once nothing before it waits.
            let oldest = self.slots.keys().next().copied().into_iter().chain(self.queue.front().map(|q| q.0)).min();
            let oldest = oldest.unwrap_or(u64::MAX);
            match self.held.front() {
                Some(&(boundary, wm)) if boundary <= oldest => {
                    self.held.pop_front();
                    self.forward(wm)?;
                }
                _ => return Ok(()),
            }
        }
    }

    fn forward(&mut self, wm: Timestamp) -> Result<()> {
        if wm > self.watermark {
            self.watermark = wm;
            self.next.watermark(wm)?;
            self.failures.watermark(wm)?;
        }
        Ok(())
    }
}

impl<K: Key, T: Data, U: Clone + Send + Sync + 'static> InputOperator for AsyncOp<K, T, U> {
    fn on_batch(&mut self, batch: &mut RecordBatch, time: &mut InputTime<'_>) -> Result<()> {
        OperatorCounters::add(&self.info.counters.records_in, batch.len());
        self.issue_restored();
        let mut records = std::mem::take(&mut self.records);
        take_records(&self.info, batch, &mut records)?;
        for ((key, value), r) in records.drain(..).zip(batch.iter()) {
            if let Some(wm) = time.observe(&r.meta) {
                self.on_watermark(wm)?;
            }
            self.receive(key, r.group, value, r.meta);
        }
        self.records = records;
        self.release()
    }

    fn on_watermark(&mut self, wm: Timestamp) -> Result<()> {
        if self.slots.is_empty() && self.queue.is_empty() && self.held.is_empty() {
            return self.forward(wm);
        }
        match self.held.back_mut() {
            // Nothing came since the last one held: this one replaces it.
            Some((boundary, held)) if *boundary == self.next_seq => *held = (*held).max(wm),
            _ => self.held.push_back((self.next_seq, wm)),
        }
        Ok(())
    }

    fn poll_work(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if !self.restored.is_empty() {
            self.issue_restored();
        }
        let mut done = false;
        while let Poll::Ready(Some((seq, outcome))) = self.done_rx.poll_recv(cx) {
            if let Some(slot) = self.slots.get_mut(&seq) {
                slot.result = Some(outcome);
                slot.task = None;
                done = true;
            }
        }
        if done { Poll::Ready(self.release()) } else { Poll::Pending }
    }

    fn accepts_input(&self) -> bool {
        self.queue.len() < self.options.in_flight
    }

    fn has_work(&self) -> bool {
        !self.slots.is_empty() || !self.queue.is_empty() || !self.restored.is_empty()
    }

    fn flush(&mut self) -> Result<()> {
        self.release()?;
        self.next.flush()?;
        self.failures.flush()
    }

    fn finish(&mut self) -> Result<()> {
        self.release()?;
        self.next.finish()?;
        self.failures.finish()
    }

    fn barrier(&mut self, n: CheckpointId) -> Result<()> {
        self.next.barrier(n)?;
        self.failures.barrier(n)
    }

    fn state_stats(&self) -> Vec<(crate::state::StateName, StateStats)> {
        let slot = std::mem::size_of::<Slot<K, T, U>>();
        let waiting = self.slots.len() + self.queue.len() + self.restored.len();
        vec![("in_flight".into(), StateStats::in_memory(waiting, slot))]
    }

    fn snapshot(&mut self, at: SnapshotAt) -> Result<Vec<StateSnapshot>> {
        let mut waiting = InFlight::<K, T> { records: Vec::new() };
        for (seq, slot) in &self.slots {
            waiting.records.push((slot.key.clone(), slot.group, *seq, slot.meta.timestamp, slot.value.clone()));
        }
        for (seq, key, group, value, meta) in &self.queue {
            waiting.records.push((key.clone(), *group, *seq, meta.timestamp, value.clone()));
        }
        // Restored records not issued yet (nothing was received after them).
        for (i, (key, group, timestamp, value)) in self.restored.iter().enumerate() {
            waiting.records.push((key.clone(), *group, i as u64, *timestamp, value.clone()));
        }
        Ok(vec![snapshot_state(&mut waiting, &self.info.name, "in_flight", StateType::of::<T>(), at)?])
    }

    fn restore(&mut self, from: &dyn RestoreSource, groups: &std::ops::Range<u16>) -> Result<()> {
        let mut waiting = InFlight::<K, T> { records: Vec::new() };
        restore_state(&mut waiting, from, &self.info.name, "in_flight", &StateType::of::<T>(), groups)?;
        waiting.records.sort_by_key(|r| r.2);
        self.restored = waiting.records.into_iter().map(|(k, g, _, ts, v)| (k, g, ts, v)).collect();
        Ok(())
    }
}

/// The records in flight at a barrier, as a keyed state: each an entry of
/// its key's group, keyed by its key's encoding, its sequence number and
/// its timestamp (8 bytes each, big-endian), its value the record's
/// encoding (what the state's recorded type says, for the inspector).
struct InFlight<K, T> {
    records: Vec<(K, u16, u64, Timestamp, T)>,
}

impl<K: Key, T: Data> KeyedState for InFlight<K, T> {
    fn snapshot_at(&mut self, operator: &str, _at: Option<Barrier>) -> Result<Snapshot> {
        let mut part = crate::state::SnapshotPart::new(true);
        for (key, group, seq, timestamp, value) in &self.records {
            key.encode_key(&mut part.part.keys);
            part.part.keys.extend_from_slice(&seq.to_be_bytes());
            part.part.keys.extend_from_slice(&timestamp.to_be_bytes());
            value
                .encode(&mut part.part.values)
                .map_err(|source| Error::Codec { operator: operator.to_string(), source })?;
            part.part.end_entry(*group)?;
        }
        Ok(Box::new(move |sink| {
            if !part.part.is_empty() {
                sink(&part)?;
            }
            Ok(true)
        }))
    }

    fn import_part(&mut self, operator: &str, entries: &mut [EntryRef<'_>], _removed: &[RemovedRef<'_>]) -> Result<()> {
        let bad = |what: String| Error::State { operator: operator.to_string(), message: what, source: None };
        for (group, key_bytes, value) in entries.iter() {
            let mut rest = *key_bytes;
            let key = K::decode_key(&mut rest)
                .map_err(|e| bad(format!("a record in flight has a key that does not decode: {e}")))?;
            let (seq, timestamp) = rest
                .split_first_chunk::<8>()
                .and_then(|(seq, rest)| Some((u64::from_be_bytes(*seq), i64::from_be_bytes(*rest.first_chunk::<8>()?))))
                .filter(|_| rest.len() == 16)
                .ok_or_else(|| bad("a record in flight lacks its sequence number or timestamp".into()))?;
            let record = T::decode(value).map_err(|source| Error::Codec { operator: operator.to_string(), source })?;
            self.records.push((key, *group, seq, timestamp, record));
        }
        Ok(())
    }

    fn stats(&self) -> StateStats {
        StateStats::in_memory(self.records.len(), 0)
    }
}
