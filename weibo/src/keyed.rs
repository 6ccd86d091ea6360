//! Keyed operators: instances fed by a hash edge, with per-key state.

use std::fmt::Display;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::codec::Data;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::metrics::OperatorCounters;
use crate::record::{Batch, Meta, RecordBatch, RecordRef, Timestamp};
use crate::runtime::Consumer;
use crate::runtime::heads::{InputOperator, emit};
use crate::runtime::ops::{Failures, OpInfo, forward_control};
use crate::runtime::time::InputTime;
use crate::state::ValueState;

pub(crate) fn decode_value<T: Data>(info: &OpInfo, r: &RecordRef<'_>) -> Result<T> {
    T::decode(r.value).map_err(|source| Error::Codec {
        operator: format!("{} (record from {})", info.name, info.sources.position(&r.meta)),
        source,
    })
}

/// The record's metadata as an output of this operator: its watermark is
/// the operator's, after observing the record's.
#[inline]
pub(crate) fn stamped(time: &mut InputTime<'_>, meta: Meta) -> Meta {
    let _ = time.observe(&meta);
    Meta { watermark: time.current(), ..meta }
}

pub(crate) fn decode_key<K: Key>(info: &OpInfo, r: &RecordRef<'_>) -> Result<K> {
    crate::key::decode::<K>(r.key).map_err(|e| {
        Error::Internal(format!(
            "operator `{}` cannot decode the key of the record from {}: {e}",
            info.name,
            info.sources.position(&r.meta)
        ))
    })
}

/// `reduce`: the running value per key.
pub(crate) struct ReduceOp<K, T, F> {
    pub(crate) info: OpInfo,
    pub(crate) state: ValueState<K, T>,
    pub(crate) f: Arc<F>,
    pub(crate) out: Batch<T>,
    pub(crate) next: Box<dyn Consumer<T>>,
    /// The batch's records decoded first, so the state lookups that follow
    /// run back to back and their cache misses overlap.
    pub(crate) decoded: Vec<(K, T)>,
}

impl<K, T, F> InputOperator for ReduceOp<K, T, F>
where
    K: Key,
    T: Data,
    F: Fn(T, T) -> T + Send + Sync + 'static,
{
    fn on_batch(&mut self, batch: &RecordBatch, time: &mut InputTime<'_>) -> Result<()> {
        OperatorCounters::add(&self.info.counters.records_in, batch.len());
        self.decoded.clear();
        for r in batch.iter() {
            self.decoded.push((decode_key(&self.info, &r)?, decode_value(&self.info, &r)?));
        }
        self.state.prefetch(self.decoded.iter().zip(batch.iter()).map(|((k, _), r)| (r.group, k)));
        let f = &*self.f;
        for ((key, v), r) in self.decoded.drain(..).zip(batch.iter()) {
            let new = self.state.update(r.group, key, r.key, |slot| {
                let new = match slot.take() {
                    Some(acc) => f(acc, v),
                    None => v,
                };
                *slot = Some(new.clone());
                new
            })?;
            self.out.push(new, stamped(time, r.meta));
        }
        emit(&self.info, &mut *self.next, &mut self.out)
    }
    forward_control!(keyed);
}

/// `fold` and `aggregate`: an accumulator per key; after each record,
/// `output(key, &accumulator)` is emitted.
pub(crate) struct FoldOp<K, T, A, O, I, F, R> {
    pub(crate) info: OpInfo,
    pub(crate) state: ValueState<K, A>,
    pub(crate) init: Arc<I>,
    pub(crate) f: Arc<F>,
    pub(crate) output: Arc<R>,
    pub(crate) out: Batch<O>,
    pub(crate) next: Box<dyn Consumer<O>>,
    pub(crate) _t: PhantomData<fn(T)>,
}

impl<K, T, A, O, I, F, R> InputOperator for FoldOp<K, T, A, O, I, F, R>
where
    K: Key,
    T: Data,
    A: Data,
    O: Send + 'static,
    I: Fn() -> A + Send + Sync + 'static,
    F: Fn(&mut A, T) + Send + Sync + 'static,
    R: Fn(K, &A) -> O + Send + Sync + 'static,
{
    fn on_batch(&mut self, batch: &RecordBatch, time: &mut InputTime<'_>) -> Result<()> {
        OperatorCounters::add(&self.info.counters.records_in, batch.len());
        let (init, f, output) = (&*self.init, &*self.f, &*self.output);
        for r in batch.iter() {
            let v: T = decode_value(&self.info, &r)?;
            let key: K = decode_key(&self.info, &r)?;
            let out = self.state.update(r.group, key.clone(), r.key, |slot| {
                let acc = slot.get_or_insert_with(init);
                f(acc, v);
                output(key, acc)
            })?;
            self.out.push(out, stamped(time, r.meta));
        }
        emit(&self.info, &mut *self.next, &mut self.out)
    }
    forward_control!(keyed);
}

/// What a keyed `process` function sees for one record.
pub struct KeyedContext<'a, K, S, U> {
    key: &'a K,
    state: &'a mut Option<S>,
    out: &'a mut Batch<U>,
    meta: Meta,
}

impl<K, S, U> std::fmt::Debug for KeyedContext<'_, K, S, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedContext").field("meta", &self.meta).finish_non_exhaustive()
    }
}

impl<K, S, U> KeyedContext<'_, K, S, U> {
    /// The record's key.
    pub fn key(&self) -> &K {
        self.key
    }

    /// The key's state: `None` until set; set it to `None` to clear it.
    pub fn state(&mut self) -> &mut Option<S> {
        self.state
    }

    /// Emits a result; it carries the input record's metadata.
    pub fn emit(&mut self, value: U) {
        self.out.push(value, self.meta);
    }

    /// The record's event time, if it has one.
    pub fn timestamp(&self) -> Option<Timestamp> {
        (self.meta.timestamp != crate::record::NO_TIMESTAMP).then_some(self.meta.timestamp)
    }
}

/// Keyed `process`: a user function with per-key state and a failure policy.
pub(crate) struct KeyedProcessOp<K, T, S, U, F> {
    pub(crate) info: OpInfo,
    pub(crate) state: ValueState<K, S>,
    pub(crate) f: Arc<F>,
    pub(crate) out: Batch<U>,
    pub(crate) next: Box<dyn Consumer<U>>,
    pub(crate) failures: Failures<T>,
    pub(crate) _t: PhantomData<fn(K)>,
}

impl<K, T, S, U, E, F> InputOperator for KeyedProcessOp<K, T, S, U, F>
where
    K: Key,
    T: Data,
    S: Data,
    U: Clone + Send + 'static,
    E: Display,
    F: for<'c> Fn(&mut KeyedContext<'c, K, S, U>, &T) -> std::result::Result<(), E> + Send + Sync + 'static,
{
    fn on_batch(&mut self, batch: &RecordBatch, time: &mut InputTime<'_>) -> Result<()> {
        OperatorCounters::add(&self.info.counters.records_in, batch.len());
        let f = &*self.f;
        for r in batch.iter() {
            let v: T = decode_value(&self.info, &r)?;
            let key: K = decode_key(&self.info, &r)?;
            let out = &mut self.out;
            let meta = stamped(time, r.meta);
            let result = self.state.update(r.group, key.clone(), r.key, |state| {
                let mut ctx = KeyedContext { key: &key, state, out, meta };
                f(&mut ctx, &v).map_err(|e| e.to_string())
            })?;
            if let Err(message) = result {
                self.failures.fail(&self.info, v, r.meta, &message)?;
            }
        }
        emit(&self.info, &mut *self.next, &mut self.out)?;
        self.failures.push()
    }

    forward_control!(keyed, failures);
}

/// Decodes records and passes them on, partitioned by key (a keyed sink).
pub(crate) struct PartitionOp<T> {
    pub(crate) info: OpInfo,
    pub(crate) out: Batch<T>,
    pub(crate) next: Box<dyn Consumer<T>>,
}

impl<T: Data> InputOperator for PartitionOp<T> {
    fn on_batch(&mut self, batch: &RecordBatch, time: &mut InputTime<'_>) -> Result<()> {
        OperatorCounters::add(&self.info.counters.records_in, batch.len());
        for r in batch.iter() {
            let v: T = decode_value(&self.info, &r)?;
            self.out.push(v, stamped(time, r.meta));
        }
        emit(&self.info, &mut *self.next, &mut self.out)
    }
    forward_control!(keyed);
}
