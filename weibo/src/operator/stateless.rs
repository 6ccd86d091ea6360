//! Stateless operators of a fused chain: `map`, `filter`, `flat_map`,
//! `process`, and the fan-out and discard ends.

use std::fmt::Display;
use std::marker::PhantomData;
use std::sync::Arc;

use super::factory::{ChainFactory, chain_factory, one};
use super::policy::{Failures, Policy, results_and_dead};
use super::{AnyConsumer, OpInfo, erase, forward_control, typed, unerase};
use crate::error::Result;
use crate::metrics::OperatorCounters;
use crate::operator::Consumer;
use crate::record::CheckpointId;
use crate::record::{Batch, Timestamp};

/// The factory of `map` by `f`.
pub(crate) fn map<I, O, F>(f: Arc<F>) -> Arc<dyn ChainFactory>
where
    I: Send + 'static,
    O: Send + 'static,
    F: Fn(I) -> O + Send + Sync + 'static,
{
    chain_factory(move |ctx, outs| {
        let info = ctx.info.clone();
        let next = typed::<O>(one(outs, &info.name)?, &info.name)?;
        let out = Batch::with_capacity(ctx.batch_size);
        Ok(erase::<I>(Box::new(MapOp { info, f: f.clone(), out, next, _in: PhantomData })))
    })
}

/// The factory of `filter` by `f`.
pub(crate) fn filter<T, F>(f: Arc<F>) -> Arc<dyn ChainFactory>
where
    T: Send + 'static,
    F: Fn(&T) -> bool + Send + Sync + 'static,
{
    chain_factory(move |ctx, outs| {
        let info = ctx.info.clone();
        let next = typed::<T>(one(outs, &info.name)?, &info.name)?;
        Ok(erase::<T>(Box::new(FilterOp { info, f: f.clone(), keep: Vec::with_capacity(ctx.batch_size), next })))
    })
}

/// The factory of `flat_map` by `f`.
pub(crate) fn flat_map<I, O, It, F>(f: Arc<F>) -> Arc<dyn ChainFactory>
where
    I: Send + 'static,
    O: Send + 'static,
    It: IntoIterator<Item = O>,
    F: Fn(I) -> It + Send + Sync + 'static,
{
    chain_factory(move |ctx, outs| {
        let info = ctx.info.clone();
        let next = typed::<O>(one(outs, &info.name)?, &info.name)?;
        let out = Batch::with_capacity(ctx.batch_size);
        Ok(erase::<I>(Box::new(FlatMapOp { info, f: f.clone(), out, next, _in: PhantomData })))
    })
}

/// The factory of `process` by `f` under `policy`: outputs are the
/// results and the dead letters.
pub(crate) fn process<I, O, E, F>(policy: Policy, f: Arc<F>) -> Arc<dyn ChainFactory>
where
    I: Clone + Send + 'static,
    O: Send + 'static,
    E: Display,
    F: Fn(&I) -> std::result::Result<O, E> + Send + Sync + 'static,
{
    chain_factory(move |ctx, outs| {
        let info = ctx.info.clone();
        let (next, dead) = results_and_dead::<O, I>(outs, policy, &info.name)?;
        let out = Batch::with_capacity(ctx.batch_size);
        Ok(erase::<I>(Box::new(ProcessOp { info, f: f.clone(), out, next, failures: Failures::new(policy, dead)? })))
    })
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
        // Until a record fails, results go out with the batch's metadata
        // as it is (as `map`'s do), not copied record by record.
        let mut first_failure = None;
        for (i, v) in batch.values.iter().enumerate() {
            match f(v) {
                Ok(o) => self.out.values.push(o),
                Err(e) => {
                    first_failure = Some((i, e));
                    break;
                }
            }
        }
        match first_failure {
            None => {
                std::mem::swap(&mut self.out.meta, &mut batch.meta);
                batch.clear();
            }
            Some((at, error)) => {
                self.out.meta.extend(batch.meta.drain(..at));
                let mut rest = batch.values.drain(at..).zip(batch.meta.drain(..));
                if let Some((v, m)) = rest.next() {
                    self.failures.fail(&self.info, v, m, &error)?;
                }
                for (v, m) in rest {
                    match f(&v) {
                        Ok(o) => self.out.push(o, m),
                        Err(e) => self.failures.fail(&self.info, v, m, &e)?,
                    }
                }
                batch.clear();
            }
        }
        OperatorCounters::add(&self.info.counters.records_out, self.out.len());
        self.next.push(&mut self.out)?;
        self.failures.push()
    }
    forward_control!(consumer, failures);
}

/// The factory of `try_filter` by `f` under `policy`: outputs are the kept
/// records and the dead letters.
pub(crate) fn try_filter<T, E, F>(policy: Policy, f: Arc<F>) -> Arc<dyn ChainFactory>
where
    T: Clone + Send + 'static,
    E: Display,
    F: Fn(&T) -> std::result::Result<bool, E> + Send + Sync + 'static,
{
    chain_factory(move |ctx, outs| {
        let info = ctx.info.clone();
        let (next, dead) = results_and_dead::<T, T>(outs, policy, &info.name)?;
        let keep = Vec::with_capacity(ctx.batch_size);
        Ok(erase::<T>(Box::new(TryFilterOp {
            info,
            f: f.clone(),
            keep,
            errors: Vec::new(),
            next,
            failures: Failures::new(policy, dead)?,
        })))
    })
}

/// `try_filter`: keeps the records the predicate accepts, in place; a
/// record whose predicate fails goes to the failure policy.
pub(crate) struct TryFilterOp<T, F> {
    pub(crate) info: OpInfo,
    pub(crate) f: Arc<F>,
    /// Per record of a batch: 0 dropped, 1 kept, 2 failed.
    pub(crate) keep: Vec<u8>,
    /// The errors of the failed records, in order.
    pub(crate) errors: Vec<String>,
    pub(crate) next: Box<dyn Consumer<T>>,
    pub(crate) failures: Failures<T>,
}

impl<T, E, F> Consumer<T> for TryFilterOp<T, F>
where
    T: Clone + Send + 'static,
    E: Display,
    F: Fn(&T) -> std::result::Result<bool, E> + Send + Sync + 'static,
{
    fn push(&mut self, batch: &mut Batch<T>) -> Result<()> {
        let n = batch.len();
        OperatorCounters::add(&self.info.counters.records_in, n);
        let f = &*self.f;
        self.keep.clear();
        let mut kept = 0;
        for v in &batch.values {
            let k = match f(v) {
                Ok(k) => u8::from(k),
                Err(e) => {
                    self.errors.push(e.to_string());
                    2
                }
            };
            kept += usize::from(k == 1);
            self.keep.push(k);
        }
        if !self.errors.is_empty() {
            let values = std::mem::take(&mut batch.values);
            let meta = std::mem::take(&mut batch.meta);
            let mut errors = std::mem::take(&mut self.errors).into_iter();
            for ((v, m), &k) in values.into_iter().zip(meta).zip(&self.keep) {
                match k {
                    1 => batch.push(v, m),
                    2 => self.failures.fail(&self.info, v, m, &errors.next().unwrap_or_default())?,
                    _ => {}
                }
            }
        } else if kept != n {
            let mut flags = self.keep.iter();
            batch.values.retain(|_| flags.next() == Some(&1));
            let mut flags = self.keep.iter();
            batch.meta.retain(|_| flags.next() == Some(&1));
        }
        OperatorCounters::add(&self.info.counters.records_out, batch.len());
        self.next.push(batch)?;
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
    fn barrier(&mut self, n: CheckpointId) -> Result<()> {
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
    fn barrier(&mut self, _n: CheckpointId) -> Result<()> {
        Ok(())
    }
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }
    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Type-specific helpers for one output port: what the runtime puts on a
/// port that feeds several consumers, or none.
pub(crate) trait PortType: Send + Sync {
    fn tee(&self, outs: Vec<AnyConsumer>) -> Result<AnyConsumer>;
    fn discard(&self) -> AnyConsumer;
}

/// The [`PortType`] of a port carrying `T`s.
pub(crate) struct TypedPort<T>(PhantomData<fn() -> T>);

impl<T: Clone + Send + 'static> TypedPort<T> {
    pub(crate) fn shared() -> Arc<dyn PortType> {
        Arc::new(Self(PhantomData))
    }
}

impl<T: Clone + Send + 'static> PortType for TypedPort<T> {
    fn tee(&self, outs: Vec<AnyConsumer>) -> Result<AnyConsumer> {
        let outs = outs.into_iter().map(|c| unerase::<T>(c, "fan-out")).collect::<Result<Vec<_>>>()?;
        Ok(erase::<T>(Box::new(TeeOp { outs })))
    }
    fn discard(&self) -> AnyConsumer {
        erase::<T>(Box::new(DiscardOp))
    }
}

/// What a batch function ([`crate::Stream::process_batch`]) gives for the
/// records of one batch: results, each for the record it came from (whose
/// event time and position it takes), and failures, each of a record.
pub struct BatchOutput<U, E> {
    values: Vec<U>,
    /// The record each value came from, once a value is not its own
    /// record's (`tracked`); until then the `k`-th value is record `k`'s.
    from: Vec<u32>,
    tracked: bool,
    failed: Vec<(u32, E)>,
    /// Records in the batch.
    records: usize,
    /// An index past the batch, given to `emit` or `fail`.
    stray: Option<usize>,
}

impl<U, E> BatchOutput<U, E> {
    fn new(capacity: usize) -> Self {
        Self {
            values: Vec::with_capacity(capacity),
            from: Vec::new(),
            tracked: false,
            failed: Vec::new(),
            records: 0,
            stray: None,
        }
    }

    fn reset(&mut self, records: usize) {
        self.values.clear();
        self.from.clear();
        self.tracked = false;
        self.failed.clear();
        self.records = records;
        self.stray = None;
    }

    /// An output for a batch of `records` records, as the operator gives
    /// one to its function: to test a batch function without a job.
    ///
    /// ```
    /// use weibo::BatchOutput;
    /// let halve = |batch: &[u32], out: &mut BatchOutput<u32, String>| {
    ///     for (i, n) in batch.iter().enumerate() {
    ///         if n % 2 == 0 { out.emit(i, n / 2) } else { out.fail(i, format!("{n} is odd")) }
    ///     }
    /// };
    /// let mut out = BatchOutput::for_records(3);
    /// halve(&[4, 3, 8], &mut out);
    /// assert_eq!(out.results().collect::<Vec<_>>(), [(0, &2), (2, &4)]);
    /// assert_eq!(out.failures().collect::<Vec<_>>(), [(1, &"3 is odd".to_string())]);
    /// ```
    pub fn for_records(records: usize) -> Self {
        let mut out = Self::new(records);
        out.records = records;
        out
    }

    /// The number of records in the batch.
    pub fn records(&self) -> usize {
        self.records
    }

    /// The results so far, each with the index of its record.
    pub fn results(&self) -> impl Iterator<Item = (usize, &U)> {
        self.values.iter().enumerate().map(|(k, v)| (self.from.get(k).map_or(k, |&i| i as usize), v))
    }

    /// The failures so far, each with the index of its record.
    pub fn failures(&self) -> impl Iterator<Item = (usize, &E)> {
        self.failed.iter().map(|(i, e)| (*i as usize, e))
    }

    /// A result of record `index` of the batch (at its event time and
    /// position). Results go downstream in the order they are emitted.
    #[inline]
    pub fn emit(&mut self, index: usize, value: U) {
        let Ok(at) = u32::try_from(index) else {
            self.stray = Some(index);
            return;
        };
        if index >= self.records {
            self.stray = Some(index);
            return;
        }
        if !self.tracked && index != self.values.len() {
            // The first value that is not its own record's: from here on,
            // where each value came from is kept.
            self.tracked = true;
            self.from.extend((0..self.values.len()).map(|k| k as u32));
        }
        if self.tracked {
            self.from.push(at);
        }
        self.values.push(value);
    }

    /// Results of many records at once: `values[k]` of record
    /// `indexes[k]`, as [`emit`](Self::emit) one by one would give them.
    pub fn emit_many(&mut self, indexes: &[usize], mut values: Vec<U>) {
        if indexes.len() != values.len() {
            self.stray = Some(indexes.len().max(values.len()));
            return;
        }
        if let Some(&bad) = indexes.iter().find(|&&i| i >= self.records || u32::try_from(i).is_err()) {
            self.stray = Some(bad);
            return;
        }
        let start = self.values.len();
        let in_order = indexes.iter().enumerate().all(|(k, &i)| i == start + k);
        if !self.tracked && !in_order {
            self.tracked = true;
            self.from.extend((0..start).map(|k| k as u32));
        }
        if self.tracked {
            // Each fits: checked above.
            self.from.extend(indexes.iter().map(|&i| i as u32));
        }
        if self.values.is_empty() {
            std::mem::swap(&mut self.values, &mut values);
        } else {
            self.values.append(&mut values);
        }
    }

    /// Record `index` of the batch failed: the stream's failure policy
    /// decides what happens to it.
    pub fn fail(&mut self, index: usize, error: E) {
        match u32::try_from(index) {
            Ok(at) if index < self.records => self.failed.push((at, error)),
            _ => self.stray = Some(index),
        }
    }
}

/// The factory of `process_batch` by `f` under `policy`.
pub(crate) fn process_batch<I, O, E, F>(policy: Policy, f: Arc<F>) -> Arc<dyn ChainFactory>
where
    I: Clone + Send + 'static,
    O: Send + 'static,
    E: Display + Send + 'static,
    F: Fn(&[I], &mut BatchOutput<O, E>) + Send + Sync + 'static,
{
    chain_factory(move |ctx, outs| {
        let info = ctx.info.clone();
        let (next, dead) = results_and_dead::<O, I>(outs, policy, &info.name)?;
        Ok(erase::<I>(Box::new(ProcessBatchOp {
            info,
            f: f.clone(),
            output: BatchOutput::new(ctx.batch_size),
            out: Batch::with_capacity(ctx.batch_size),
            next,
            failures: Failures::new(policy, dead)?,
        })))
    })
}

/// `process_batch`: a function over a whole batch, with a failure policy.
pub(crate) struct ProcessBatchOp<I, O, E, F> {
    pub(crate) info: OpInfo,
    pub(crate) f: Arc<F>,
    pub(crate) output: BatchOutput<O, E>,
    pub(crate) out: Batch<O>,
    pub(crate) next: Box<dyn Consumer<O>>,
    pub(crate) failures: Failures<I>,
}

impl<I, O, E, F> Consumer<I> for ProcessBatchOp<I, O, E, F>
where
    I: Clone + Send + 'static,
    O: Send + 'static,
    E: Display + Send + 'static,
    F: Fn(&[I], &mut BatchOutput<O, E>) + Send + Sync + 'static,
{
    fn push(&mut self, batch: &mut Batch<I>) -> Result<()> {
        let n = batch.len();
        OperatorCounters::add(&self.info.counters.records_in, n);
        self.output.reset(n);
        (self.f)(&batch.values, &mut self.output);
        if let Some(index) = self.output.stray {
            batch.clear();
            return Err(crate::error::internal_error!(
                "`{}`: the batch function gave record {index} of a batch of {n}",
                self.info.name
            ));
        }
        // Failures first: under `Fail`, the batch's results go nowhere.
        for (at, error) in self.output.failed.drain(..) {
            let i = at as usize;
            if let (Some(record), Some(meta)) = (batch.values.get(i), batch.meta.get(i)) {
                self.failures.fail(&self.info, record.clone(), *meta, &error)?;
            }
        }
        let values = &mut self.output.values;
        if !self.output.tracked && values.len() == n && self.out.is_empty() {
            // One result per record, in order: the results and the batch's
            // metadata as they are (the spent vectors come back for reuse).
            std::mem::swap(&mut self.out.meta, &mut batch.meta);
            std::mem::swap(&mut self.out.values, values);
        } else if !self.output.tracked {
            self.out.meta.extend_from_slice(batch.meta.get(..values.len()).unwrap_or_default());
            if self.out.values.is_empty() {
                std::mem::swap(&mut self.out.values, values);
            } else {
                self.out.values.append(values);
            }
        } else {
            // Each result at its record's metadata (a record of the batch:
            // `emit` checked).
            let meta = &batch.meta;
            self.out.meta.extend(self.output.from.iter().filter_map(|&at| meta.get(at as usize).copied()));
            if self.out.values.is_empty() {
                std::mem::swap(&mut self.out.values, values);
            } else {
                self.out.values.append(values);
            }
        }
        batch.clear();
        OperatorCounters::add(&self.info.counters.records_out, self.out.len());
        self.next.push(&mut self.out)?;
        self.failures.push()
    }
    forward_control!(consumer, failures);
}
