//! Typed operators of a fused chain, and the router that ends a chain at a
//! shuffle edge.


pub(crate) mod keyed;
pub(crate) mod windows;

use std::fmt::Display;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::codec::Data;
use crate::error::{Error, Result};
use crate::codec::key::{Key, key_group};
use crate::metrics::OperatorCounters;
use crate::record::{Batch, Meta, RecordBatch, SourceNames, Timestamp};
use crate::runtime::{Consumer, Message, Outbox};
use crate::stream::DeadLetter;

/// Forwards watermark (and idleness), flush and finish to `self.next`, and
/// to the dead-letter output when given `failures`. `consumer` generates the
/// [`Consumer`] methods, `keyed` those of a keyed `InputOperator` (whose
/// watermark comes from its channel head).
macro_rules! forward_control {
    (consumer) => {
        fn watermark(&mut self, wm: Timestamp) -> Result<()> {
            self.next.watermark(wm)
        }
        fn idle(&mut self) -> Result<()> {
            self.next.idle()
        }
        fn barrier(&mut self, n: u64) -> Result<()> {
            self.next.barrier(n)
        }
        forward_control!(@flush);
    };
    (consumer, failures) => {
        fn watermark(&mut self, wm: Timestamp) -> Result<()> {
            self.next.watermark(wm)?;
            self.failures.watermark(wm)
        }
        fn idle(&mut self) -> Result<()> {
            self.next.idle()?;
            self.failures.idle()
        }
        fn barrier(&mut self, n: u64) -> Result<()> {
            self.next.barrier(n)?;
            self.failures.barrier(n)
        }
        forward_control!(@flush, failures);
    };
    (keyed) => {
        fn on_watermark(&mut self, wm: Timestamp) -> Result<()> {
            self.next.watermark(wm)
        }
        fn barrier(&mut self, n: u64) -> Result<()> {
            self.next.barrier(n)
        }
        forward_control!(@flush);
    };
    (keyed, failures) => {
        fn on_watermark(&mut self, wm: Timestamp) -> Result<()> {
            self.next.watermark(wm)?;
            self.failures.watermark(wm)
        }
        fn barrier(&mut self, n: u64) -> Result<()> {
            self.next.barrier(n)?;
            self.failures.barrier(n)
        }
        forward_control!(@flush, failures);
    };
    (@flush) => {
        fn flush(&mut self) -> Result<()> {
            self.next.flush()
        }
        fn finish(&mut self) -> Result<()> {
            self.next.finish()
        }
    };
    (@flush, failures) => {
        fn flush(&mut self) -> Result<()> {
            self.next.flush()?;
            self.failures.flush()
        }
        fn finish(&mut self) -> Result<()> {
            self.next.finish()?;
            self.failures.finish()
        }
    };
}
pub(crate) use forward_control;

/// What every operator instance knows about itself.
#[derive(Clone, Debug)]
pub(crate) struct OpInfo {
    pub(crate) name: Arc<str>,
    pub(crate) counters: Arc<OperatorCounters>,
    pub(crate) sources: SourceNames,
}

pub(crate) use crate::stream::on_error::Policy;

/// Dead letters waiting to be pushed, and where they go.
type DeadLetters<T> = (Batch<DeadLetter<T>>, Box<dyn Consumer<DeadLetter<T>>>);

/// Where a failed record goes under a policy; shared by stateless and keyed
/// `process`.
pub(crate) struct Failures<T> {
    policy: Policy,
    dead: Option<DeadLetters<T>>,
}

impl<T: Clone + Send + 'static> Failures<T> {
    pub(crate) fn new(policy: Policy, dead: Option<Box<dyn Consumer<DeadLetter<T>>>>) -> Result<Self> {
        let dead = match (policy, dead) {
            (Policy::DeadLetter, Some(next)) => Some((Batch::with_capacity(16), next)),
            (Policy::DeadLetter, None) => {
                return Err(Error::Internal("dead-letter policy without a dead-letter output".into()));
            }
            (_, _) => None,
        };
        Ok(Self { policy, dead })
    }

    /// Handles one failure of `info`'s function on `record`.
    pub(crate) fn fail(&mut self, info: &OpInfo, record: T, meta: Meta, error: &dyn Display) -> Result<()> {
        match (self.policy, &mut self.dead) {
            (Policy::Drop, _) => {
                OperatorCounters::add(&info.counters.dropped, 1);
                Ok(())
            }
            (Policy::DeadLetter, Some((batch, _))) => {
                OperatorCounters::add(&info.counters.dead_lettered, 1);
                let letter = DeadLetter {
                    record,
                    error: error.to_string(),
                    operator: info.name.to_string(),
                    position: info.sources.position(&meta),
                };
                batch.push(letter, meta);
                Ok(())
            }
            _ => Err(Error::RecordFailed {
                operator: info.name.to_string(),
                position: info.sources.position(&meta),
                message: error.to_string(),
            }),
        }
    }

    /// Handles a failure of a timer function: there is no record to send
    /// anywhere, so under `Drop` and `DeadLetter` it is counted as dropped,
    /// and under `Fail` it stops the job.
    pub(crate) fn fail_timer(&mut self, info: &OpInfo, group: u16, time: Timestamp, error: &dyn Display) -> Result<()> {
        match self.policy {
            Policy::Drop | Policy::DeadLetter => {
                OperatorCounters::add(&info.counters.dropped, 1);
                Ok(())
            }
            Policy::Fail => Err(Error::TimerFailed {
                operator: info.name.to_string(),
                key_group: group,
                time,
                message: error.to_string(),
            }),
        }
    }

    pub(crate) fn push(&mut self) -> Result<()> {
        match &mut self.dead {
            Some((batch, next)) if !batch.is_empty() => next.push(batch),
            _ => Ok(()),
        }
    }

    pub(crate) fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        match &mut self.dead {
            Some((_, next)) => next.watermark(wm),
            None => Ok(()),
        }
    }

    pub(crate) fn idle(&mut self) -> Result<()> {
        match &mut self.dead {
            Some((_, next)) => next.idle(),
            None => Ok(()),
        }
    }

    pub(crate) fn barrier(&mut self, n: u64) -> Result<()> {
        match &mut self.dead {
            Some((_, next)) => next.barrier(n),
            None => Ok(()),
        }
    }

    pub(crate) fn flush(&mut self) -> Result<()> {
        match &mut self.dead {
            Some((_, next)) => next.flush(),
            None => Ok(()),
        }
    }

    pub(crate) fn finish(&mut self) -> Result<()> {
        match &mut self.dead {
            Some((_, next)) => next.finish(),
            None => Ok(()),
        }
    }
}

/// `map`: one value in, one value out; metadata moves along untouched.
pub(crate) struct MapOp<I, O, F> {
    pub(crate) info: OpInfo,
    pub(crate) f: Arc<F>,
    pub(crate) out: Batch<O>,
    pub(crate) next: Box<dyn Consumer<O>>,
    pub(crate) _in: PhantomData<fn(I)>,
}

impl<I, O, F> Consumer<I> for MapOp<I, O, F>
where
    I: Send + 'static,
    O: Send + 'static,
    F: Fn(I) -> O + Send + Sync + 'static,
{
    #[inline]
    fn push(&mut self, batch: &mut Batch<I>) -> Result<()> {
        let n = batch.len();
        OperatorCounters::add(&self.info.counters.records_in, n);
        let f = &*self.f;
        self.out.values.extend(batch.values.drain(..).map(f));
        std::mem::swap(&mut self.out.meta, &mut batch.meta);
        batch.meta.clear();
        OperatorCounters::add(&self.info.counters.records_out, n);
        self.next.push(&mut self.out)
    }
    forward_control!(consumer);
}

/// `filter`: keeps the values the predicate accepts, in place.
pub(crate) struct FilterOp<T, F> {
    pub(crate) info: OpInfo,
    pub(crate) f: Arc<F>,
    pub(crate) keep: Vec<bool>,
    pub(crate) next: Box<dyn Consumer<T>>,
}

impl<T, F> Consumer<T> for FilterOp<T, F>
where
    T: Send + 'static,
    F: Fn(&T) -> bool + Send + Sync + 'static,
{
    #[inline]
    fn push(&mut self, batch: &mut Batch<T>) -> Result<()> {
        let n = batch.len();
        OperatorCounters::add(&self.info.counters.records_in, n);
        let f = &*self.f;
        let keep = &mut self.keep;
        keep.clear();
        batch.values.retain(|v| {
            let k = f(v);
            keep.push(k);
            k
        });
        if batch.values.len() != n {
            let mut flags = keep.iter();
            batch.meta.retain(|_| flags.next().copied().unwrap_or(false));
        }
        OperatorCounters::add(&self.info.counters.records_out, batch.len());
        self.next.push(batch)
    }
    forward_control!(consumer);
}

/// `flat_map`: each value becomes zero or more values with its metadata.
pub(crate) struct FlatMapOp<I, O, F> {
    pub(crate) info: OpInfo,
    pub(crate) f: Arc<F>,
    pub(crate) out: Batch<O>,
    pub(crate) next: Box<dyn Consumer<O>>,
    pub(crate) _in: PhantomData<fn(I)>,
}

impl<I, O, It, F> Consumer<I> for FlatMapOp<I, O, F>
where
    I: Send + 'static,
    O: Send + 'static,
    It: IntoIterator<Item = O>,
    F: Fn(I) -> It + Send + Sync + 'static,
{
    fn push(&mut self, batch: &mut Batch<I>) -> Result<()> {
        OperatorCounters::add(&self.info.counters.records_in, batch.len());
        let f = &*self.f;
        for (v, m) in batch.values.drain(..).zip(batch.meta.drain(..)) {
            for o in f(v) {
                self.out.push(o, m);
            }
        }
        OperatorCounters::add(&self.info.counters.records_out, self.out.len());
        self.next.push(&mut self.out)
    }
    forward_control!(consumer);
}

/// `process`: a fallible function with a failure policy.
pub(crate) struct ProcessOp<I, O, F> {
    pub(crate) info: OpInfo,
    pub(crate) f: Arc<F>,
    pub(crate) out: Batch<O>,
    pub(crate) next: Box<dyn Consumer<O>>,
    pub(crate) failures: Failures<I>,
}

impl<I, O, E, F> Consumer<I> for ProcessOp<I, O, F>
where
    I: Clone + Send + 'static,
    O: Send + 'static,
    E: Display,
    F: Fn(&I) -> std::result::Result<O, E> + Send + Sync + 'static,
{
    fn push(&mut self, batch: &mut Batch<I>) -> Result<()> {
        OperatorCounters::add(&self.info.counters.records_in, batch.len());
        let f = &*self.f;
        for (v, m) in batch.values.drain(..).zip(batch.meta.drain(..)) {
            match f(&v) {
                Ok(o) => self.out.push(o, m),
                Err(e) => self.failures.fail(&self.info, v, m, &e)?,
            }
        }
        OperatorCounters::add(&self.info.counters.records_out, self.out.len());
        self.next.push(&mut self.out)?;
        self.failures.push()
    }
    forward_control!(consumer, failures);
}

/// Fan-out: every downstream consumer gets every record.
pub(crate) struct TeeOp<T> {
    pub(crate) outs: Vec<Box<dyn Consumer<T>>>,
}

impl<T: Clone + Send + 'static> Consumer<T> for TeeOp<T> {
    fn push(&mut self, batch: &mut Batch<T>) -> Result<()> {
        if let Some((last, rest)) = self.outs.split_last_mut() {
            for out in rest {
                let mut copy = batch.clone();
                out.push(&mut copy)?;
            }
            last.push(batch)?;
        }
        batch.clear();
        Ok(())
    }
    fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.outs.iter_mut().try_for_each(|o| o.watermark(wm))
    }
    fn idle(&mut self) -> Result<()> {
        self.outs.iter_mut().try_for_each(|o| o.idle())
    }
    fn barrier(&mut self, n: u64) -> Result<()> {
        self.outs.iter_mut().try_for_each(|o| o.barrier(n))
    }
    fn flush(&mut self) -> Result<()> {
        self.outs.iter_mut().try_for_each(|o| o.flush())
    }
    fn finish(&mut self) -> Result<()> {
        self.outs.iter_mut().try_for_each(|o| o.finish())
    }
}

/// A port nobody consumes: values are discarded (validation makes sure this
/// never happens to dead letters).
pub(crate) struct DiscardOp;

impl<T: Send + 'static> Consumer<T> for DiscardOp {
    fn push(&mut self, batch: &mut Batch<T>) -> Result<()> {
        batch.clear();
        Ok(())
    }
    fn watermark(&mut self, _wm: Timestamp) -> Result<()> {
        Ok(())
    }
    fn idle(&mut self) -> Result<()> {
        Ok(())
    }
    fn barrier(&mut self, _n: u64) -> Result<()> {
        Ok(())
    }
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }
    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}

/// The end of a chain at a sink.
pub(crate) struct SinkOp<T> {
    pub(crate) info: OpInfo,
    pub(crate) writer: Box<dyn crate::sinks::SinkWriter<T>>,
    /// Whether the writer takes barriers after `finish` (exactly-once
    /// sinks seal their last epoch at the next one). Other writers have
    /// nothing to do then, and may have closed what they write to.
    pub(crate) barriers_after_finish: bool,
    /// `finish` was called.
    pub(crate) finished: bool,
}

impl<T> SinkOp<T> {
    pub(crate) fn new(info: OpInfo, writer: Box<dyn crate::sinks::SinkWriter<T>>, barriers_after_finish: bool) -> Self {
        Self { info, writer, barriers_after_finish, finished: false }
    }
}

impl<T: Send + 'static> Consumer<T> for SinkOp<T> {
    fn push(&mut self, batch: &mut Batch<T>) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        OperatorCounters::add(&self.info.counters.records_in, batch.len());
        self.writer.write(&mut crate::sinks::SinkBatch { batch })?;
        batch.clear();
        Ok(())
    }
    fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.writer.on_watermark(wm)
    }
    fn barrier(&mut self, n: u64) -> Result<()> {
        if self.finished && !self.barriers_after_finish {
            return Ok(());
        }
        self.writer.on_barrier(n)
    }
    fn idle(&mut self) -> Result<()> {
        Ok(())
    }
    fn flush(&mut self) -> Result<()> {
        if self.finished {
            return Ok(());
        }
        self.writer.flush()
    }
    fn finish(&mut self) -> Result<()> {
        self.finished = true;
        self.writer.finish()
    }
}

/// Shape of the batches a router builds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchLimits {
    pub(crate) records: usize,
    pub(crate) bytes: usize,
}

/// The end of a chain at a hash edge: computes each value's key, encodes key
/// and value once, and appends them to the batch of the worker that owns the
/// key's group.
pub(crate) struct RouterOp<T, K, KF: ?Sized> {
    pub(crate) info: OpInfo,
    pub(crate) key_fn: Arc<KF>,
    pub(crate) targets: Vec<RecordBatch>,
    pub(crate) senders: Vec<usize>,
    pub(crate) outbox: Outbox,
    pub(crate) routes: KeyGroupRoutes,
    /// Spent batches returned by the receivers, for reuse.
    pub(crate) pool: crate::record::BatchPool,
    pub(crate) limits: BatchLimits,
    pub(crate) key_buf: Vec<u8>,
    /// The latest watermark from upstream, and the latest one sent. Records
    /// carry their watermark, so while data flows the receivers know it;
    /// the message goes out with the next flush, after the data before it.
    pub(crate) watermark: Timestamp,
    pub(crate) sent_watermark: Timestamp,
    pub(crate) _t: PhantomData<fn(T) -> K>,
}

impl<T, K, KF: ?Sized> RouterOp<T, K, KF> {
    fn send(&mut self, target: usize) {
        if let (Some(batch), Some(&sender)) = (self.targets.get_mut(target), self.senders.get(target))
            && !batch.is_empty()
        {
            let full = std::mem::replace(batch, self.pool.take(self.limits.records, 16 * self.limits.records));
            self.outbox.push(sender, Message::Data(full));
        }
    }

    fn send_all(&mut self) {
        for t in 0..self.targets.len() {
            self.send(t);
        }
    }

    fn broadcast(&mut self, make: impl Fn() -> Message) {
        for &sender in &self.senders {
            self.outbox.push(sender, make());
        }
    }

    /// Sends every partial batch, then the watermark if it moved.
    fn send_all_and_watermark(&mut self) {
        self.send_all();
        if self.watermark > self.sent_watermark {
            self.sent_watermark = self.watermark;
            let wm = self.watermark;
            self.broadcast(|| Message::Watermark(wm));
        }
    }
}

/// Key bytes → (key group, worker), without a division per record: a mask
/// when the number of key groups is a power of two (the default), and a
/// table from key group to worker. Same results as [`key_group`] and
/// [`worker_of`].
#[derive(Clone, Debug)]
pub(crate) struct KeyGroupRoutes {
    max: u16,
    mask: Option<u64>,
    workers: Vec<usize>,
}

impl KeyGroupRoutes {
    pub(crate) fn new(max: u16, parallelism: usize) -> Self {
        let max = max.max(1);
        Self {
            max,
            mask: max.is_power_of_two().then(|| u64::from(max) - 1),
            workers: (0..max).map(|g| worker_of(g, parallelism, max)).collect(),
        }
    }

    #[inline]
    pub(crate) fn route(&self, key: &[u8]) -> (u16, usize) {
        let group = match self.mask {
            // The masked value is below `max`, a u16.
            Some(mask) => (crate::codec::key::key_hash(key) & mask) as u16,
            None => key_group(key, self.max),
        };
        (group, self.workers.get(usize::from(group)).copied().unwrap_or(usize::MAX))
    }
}

/// The worker (of `parallelism`) that owns key group `group` (of `max`):
/// contiguous ranges, as [`key_group_range`] gives them.
#[inline]
pub(crate) fn worker_of(group: u16, parallelism: usize, max: u16) -> usize {
    usize::from(group) * parallelism / usize::from(max.max(1))
}

/// The key groups worker `index` of `parallelism` owns.
pub(crate) fn key_group_range(index: usize, parallelism: usize, max: u16) -> std::ops::Range<u16> {
    let max = usize::from(max);
    let p = parallelism.max(1);
    let start = (index * max).div_ceil(p);
    let end = ((index + 1) * max).div_ceil(p);
    // Both are at most `max`, which is a u16.
    (start as u16)..(end.min(max) as u16)
}

impl<T, K, KF: ?Sized> Consumer<T> for RouterOp<T, K, KF>
where
    T: Data,
    K: Key,
    KF: Fn(&T) -> K + Send + Sync + 'static,
{
    #[inline]
    fn push(&mut self, batch: &mut Batch<T>) -> Result<()> {
        let n = batch.len();
        OperatorCounters::add(&self.info.counters.records_in, n);
        for (v, m) in batch.values.drain(..).zip(batch.meta.drain(..)) {
            self.key_buf.clear();
            (self.key_fn)(&v).encode_key(&mut self.key_buf);
            let (group, target) = self.routes.route(&self.key_buf);
            let Some(out) = self.targets.get_mut(target) else {
                return Err(Error::Internal(format!("key group {group} maps to missing worker {target}")));
            };
            let key_start = out.data_mut().len();
            out.data_mut().extend_from_slice(&self.key_buf);
            let value_start = out.data_mut().len();
            if let Err(source) = v.encode(out.data_mut()) {
                out.rollback(key_start);
                let position = self.info.sources.position(&m);
                return Err(Error::Codec { operator: format!("{} (record from {position})", self.info.name), source });
            }
            out.commit(key_start, value_start, group, m);
            if out.len() >= self.limits.records || out.byte_len() >= self.limits.bytes {
                self.send(target);
            }
        }
        OperatorCounters::add(&self.info.counters.records_out, n);
        Ok(())
    }

    fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.watermark = self.watermark.max(wm);
        Ok(())
    }

    fn idle(&mut self) -> Result<()> {
        self.send_all_and_watermark();
        self.broadcast(|| Message::Idle);
        Ok(())
    }

    fn barrier(&mut self, n: u64) -> Result<()> {
        self.send_all_and_watermark();
        self.broadcast(|| Message::Barrier(n));
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.send_all_and_watermark();
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        self.send_all_and_watermark();
        self.broadcast(|| Message::EndOfInput);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_routes_agree_with_the_definitions() {
        for max in [1u16, 7, 100, 128, 256] {
            for p in 1..=5usize {
                let routes = KeyGroupRoutes::new(max, p);
                for k in 0u64..500 {
                    let bytes = crate::codec::key::encode(&k);
                    let group = key_group(&bytes, max);
                    assert_eq!(routes.route(&bytes), (group, worker_of(group, p, max)), "max {max} p {p} key {k}");
                }
            }
        }
    }

    #[test]
    fn key_group_ranges_cover_every_group_once_and_agree_with_worker_of() {
        for max in [1u16, 7, 128, 256] {
            for p in 1..=9usize {
                let mut next = 0u16;
                for i in 0..p {
                    let r = key_group_range(i, p, max);
                    assert_eq!(r.start, next, "max {max} p {p} worker {i}");
                    for g in r.clone() {
                        assert_eq!(worker_of(g, p, max), i, "group {g} max {max} p {p}");
                    }
                    next = r.end;
                }
                assert_eq!(next, max);
            }
        }
    }
}
