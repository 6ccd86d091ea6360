//! The end of a chain at a shuffle edge: the router that encodes records
//! and routes them by key group to the instance that owns it.

use std::marker::PhantomData;
use std::sync::Arc;

use super::factory::{RouterFactory, router_factory};
use super::{Consumer, OpInfo, Outbox, erase};
use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::{Error, Result};
use crate::metrics::OperatorCounters;
use crate::operator::connect::Either;
use crate::record::{Batch, CheckpointId, Message, RecordBatch, Timestamp};

/// The router of a hash edge keyed by `key_fn`: made where the key
/// function's type is known (`key_by`), so that the router calls it
/// directly for every record, not through a pointer.
pub(crate) fn key_router<T, K, F>(key_fn: Arc<F>) -> Arc<dyn RouterFactory>
where
    T: Data,
    K: Key,
    F: Fn(&T) -> K + Send + Sync + 'static,
{
    router_factory(move |ctx, senders| {
        let info = ctx.info.clone();
        let limits = BatchLimits { records: ctx.batch_size, bytes: ctx.batch_bytes };
        let routes = KeyGroupRoutes::new(ctx.max_key_groups, senders.len());
        let pool = crate::record::BatchPool::default();
        Ok(erase::<T>(Box::new(RouterOp::<T, K, F> {
            info,
            key_fn: key_fn.clone(),
            targets: senders.iter().map(|_| pool.take(limits.records, 0)).collect(),
            pool,
            senders,
            outbox: ctx.outbox.clone(),
            routes,
            limits,
            key_buf: Vec::with_capacity(32),
            // `weibo::testing`: every record crosses its edge as bytes.
            encode: ctx.verify_codecs,
            typed: Vec::new(),
            alignment: ctx.alignment.clone(),
            watermark: crate::record::NO_TIMESTAMP,
            sent_watermark: crate::record::NO_TIMESTAMP,
            _t: PhantomData,
        })))
    })
}

/// Shape of the batches a router builds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchLimits {
    pub(crate) records: usize,
    pub(crate) bytes: usize,
}

/// The end of a chain at a hash edge: computes each value's key and its key
/// group (from the key's encoding), and appends the record to the batch of
/// the worker that owns the group: typed, or (`encode`) as bytes.
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
    /// Whether values are encoded onto the edge rather than kept typed
    /// (see [`RecordBatch`]): edges between processes would need it; every
    /// edge today is inside one, so only tests set it, to drive the
    /// receivers' decoding path.
    pub(crate) encode: bool,
    /// Per target, the typed records of the batch being filled, swapped
    /// into it when it is sent.
    pub(crate) typed: Vec<Vec<(K, T)>>,
    /// In a source partition's chain: where the chain's watermark is
    /// published for the source's watermark alignment.
    pub(crate) alignment: Option<crate::time::alignment::Aligned>,
    /// The latest watermark from upstream, and the latest one sent. Records
    /// carry their watermark, so while data flows the receivers know it;
    /// the message goes out with the next flush, after the data before it.
    pub(crate) watermark: Timestamp,
    pub(crate) sent_watermark: Timestamp,
    pub(crate) _t: PhantomData<fn(T) -> K>,
}

impl<T: Send + 'static, K: Send + 'static, KF: ?Sized> RouterOp<T, K, KF> {
    /// Sends target `target`'s batch, if it has records. Once per batch,
    /// out of the per-record loop.
    #[inline(never)]
    fn send(&mut self, target: usize) {
        if let (Some(batch), Some(&sender)) = (self.targets.get_mut(target), self.senders.get(target))
            && !batch.is_empty()
        {
            // A typed batch has no bytes: its arena stays unallocated.
            let bytes = if self.encode { 16 * self.limits.records } else { 0 };
            let mut full = std::mem::replace(batch, self.pool.take(self.limits.records, bytes));
            if let Some(typed) = self.typed.get_mut(target)
                && !typed.is_empty()
            {
                full.swap_typed(typed);
            }
            self.outbox.push(sender, Message::Data(full));
        }
    }

    /// `push` of typed records to a single worker (a keyed operator of
    /// parallelism 1): no worker to look up per record, and the batch
    /// being filled stays at hand until it is full.
    fn push_to_one(&mut self, batch: &mut Batch<T>) -> Result<()>
    where
        K: Key,
        KF: Fn(&T) -> K,
    {
        let mut records = batch.values.drain(..).zip(batch.meta.drain(..));
        loop {
            let (Some(out), Some(typed)) = (self.targets.first_mut(), self.typed.first_mut()) else {
                return Err(crate::error::internal_error!("{}: no batch for its one worker", self.info.name));
            };
            let room = self.limits.records.saturating_sub(out.len()).max(1);
            let mut taken = 0;
            for (v, m) in records.by_ref().take(room) {
                let key = (self.key_fn)(&v);
                let group = self.routes.group_of(key.routing_hash(&mut self.key_buf));
                typed.push((key, v));
                out.commit_typed(group, m);
                taken += 1;
            }
            if out.len() >= self.limits.records {
                self.send(0);
            }
            if taken < room {
                return Ok(());
            }
        }
    }

    /// `push` for an edge that carries encoded records (see `encode`).
    fn push_encoded(&mut self, batch: &mut Batch<T>) -> Result<()>
    where
        T: Data,
        K: Key,
        KF: Fn(&T) -> K,
    {
        for (v, m) in batch.values.drain(..).zip(batch.meta.drain(..)) {
            let key = (self.key_fn)(&v);
            self.key_buf.clear();
            key.encode_key(&mut self.key_buf);
            let hash = crate::codec::key::key_hash(&self.key_buf);
            let (group, target) = self.routes.route_hash(hash);
            let Some(out) = self.targets.get_mut(target) else {
                return Err(crate::error::internal_error!("key group {group} maps to missing worker {target}"));
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
        Ok(())
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
/// table from key group to worker. Same results as [`key_group`](crate::codec::key::key_group) and
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

    #[cfg(test)]
    pub(crate) fn route(&self, key: &[u8]) -> (u16, usize) {
        self.route_hash(crate::codec::key::key_hash(key))
    }

    /// [`route`](Self::route) of a key whose [`key_hash`](crate::codec::key::key_hash)
    /// is `hash`.
    #[inline(always)]
    pub(crate) fn route_hash(&self, hash: u64) -> (u16, usize) {
        let group = self.group_of(hash);
        (group, self.workers.get(usize::from(group)).copied().unwrap_or(usize::MAX))
    }

    /// The key group of a key whose [`key_hash`](crate::codec::key::key_hash)
    /// is `hash`.
    #[inline(always)]
    pub(crate) fn group_of(&self, hash: u64) -> u16 {
        match self.mask {
            // The masked value is below `max`, a u16.
            Some(mask) => (hash & mask) as u16,
            // The remainder is below `max`, a u16 (as `key_group`).
            None => (hash % u64::from(self.max)) as u16,
        }
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
        if self.typed.len() < self.targets.len() {
            self.typed.resize_with(self.targets.len(), || Vec::with_capacity(self.limits.records));
        }
        if self.encode {
            self.push_encoded(batch)?;
        } else if self.targets.len() == 1 {
            self.push_to_one(batch)?;
        } else {
            for (v, m) in batch.values.drain(..).zip(batch.meta.drain(..)) {
                let key = (self.key_fn)(&v);
                let (group, target) = self.routes.route_hash(key.routing_hash(&mut self.key_buf));
                let (Some(out), Some(typed)) = (self.targets.get_mut(target), self.typed.get_mut(target)) else {
                    return Err(crate::error::internal_error!("key group {group} maps to missing worker {target}"));
                };
                typed.push((key, v));
                // Typed records go without their key's bytes: the receiver
                // has the typed key, and only a state on disk needs the
                // bytes (it encodes them again, see `ValueStore`).
                out.commit_typed(group, m);
                if out.len() >= self.limits.records {
                    self.send(target);
                }
            }
        }
        OperatorCounters::add(&self.info.counters.records_out, n);
        Ok(())
    }

    fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.watermark = self.watermark.max(wm);
        if let Some(a) = &self.alignment {
            a.group.publish(a.index, self.watermark);
        }
        Ok(())
    }

    fn idle(&mut self) -> Result<()> {
        self.send_all_and_watermark();
        self.broadcast(|| Message::Idle);
        Ok(())
    }

    fn barrier(&mut self, n: CheckpointId) -> Result<()> {
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

/// The router of a keyed operator with a broadcast input (see
/// [`BroadcastRouterOp`]): `key_fn` keys the first input's records.
pub(crate) fn broadcast_router<A, B, K, F>(key_fn: Arc<F>) -> Arc<dyn RouterFactory>
where
    A: Data,
    B: Data,
    K: Key,
    F: Fn(&A) -> K + Send + Sync + 'static,
{
    broadcast_router_of::<A, B, K, F>(key_fn, false)
}

/// The router of an operator with a broadcast input whose first input is
/// not keyed: its records go to the operator's instances in turn, each as
/// if of key `()` in the first key group of its instance (whose states
/// are the broadcast ones alone, per instance).
pub(crate) fn spread_broadcast_router<A: Data, B: Data>() -> Arc<dyn RouterFactory> {
    broadcast_router_of::<A, B, (), _>(Arc::new(|_: &A| ()), true)
}

fn broadcast_router_of<A, B, K, F>(key_fn: Arc<F>, spread: bool) -> Arc<dyn RouterFactory>
where
    A: Data,
    B: Data,
    K: Key,
    F: Fn(&A) -> K + Send + Sync + 'static,
{
    router_factory(move |ctx, senders| {
        let limits = BatchLimits { records: ctx.batch_size, bytes: ctx.batch_bytes };
        let pool = crate::record::BatchPool::default();
        let n = senders.len();
        let spread = spread.then(|| Spread {
            groups: (0..n).map(|i| key_group_range(i, n, ctx.max_key_groups).start).collect(),
            next: 0,
        });
        Ok(erase::<Either<A, B>>(Box::new(BroadcastRouterOp::<A, B, K, F> {
            info: ctx.info.clone(),
            key_fn: key_fn.clone(),
            spread,
            routes: KeyGroupRoutes::new(ctx.max_key_groups, senders.len()),
            keyed: senders.iter().map(|_| pool.take(limits.records, 0)).collect(),
            keyed_typed: senders.iter().map(|_| Vec::new()).collect(),
            broadcast: senders.iter().map(|_| pool.take(limits.records, 0)).collect(),
            broadcast_typed: senders.iter().map(|_| Vec::new()).collect(),
            pool,
            senders,
            outbox: ctx.outbox.clone(),
            limits,
            key_buf: Vec::with_capacity(32),
            encode: ctx.verify_codecs,
            alignment: ctx.alignment.clone(),
            watermark: crate::record::NO_TIMESTAMP,
            sent_watermark: crate::record::NO_TIMESTAMP,
        })))
    })
}

/// The instances a first input that is not keyed is spread over: the
/// first key group of each, and the one the next record goes to.
struct Spread {
    groups: Vec<u16>,
    next: usize,
}

impl Spread {
    /// The key group and instance of the next record.
    fn next(&mut self) -> (u16, usize) {
        let target = self.next;
        self.next = if target + 1 >= self.groups.len() { 0 } else { target + 1 };
        (self.groups.get(target).copied().unwrap_or(0), target)
    }
}

/// The end of a chain at the edge into a keyed operator with a broadcast
/// input: a record of the first input (`Left`) goes, keyed, to the
/// instance that owns its key group, as [`RouterOp`] sends it; a record of
/// the broadcast input (`Right`) goes to every instance, in a batch marked
/// broadcast ([`RecordBatch::is_broadcast`]), without a key. Each kind has
/// its batches: a chain's records of the two kinds (a chain carries one
/// kind in any pipeline `connect_broadcast` builds) may reach an instance
/// in another order than they were pushed, as two inputs' records may.
struct BroadcastRouterOp<A, B, K, F> {
    info: OpInfo,
    key_fn: Arc<F>,
    /// When the first input is not keyed: where its records go.
    spread: Option<Spread>,
    routes: KeyGroupRoutes,
    keyed: Vec<RecordBatch>,
    keyed_typed: Vec<Vec<(K, Either<A, B>)>>,
    broadcast: Vec<RecordBatch>,
    broadcast_typed: Vec<Vec<Either<A, B>>>,
    pool: crate::record::BatchPool,
    senders: Vec<usize>,
    outbox: Outbox,
    limits: BatchLimits,
    key_buf: Vec<u8>,
    /// As [`RouterOp::encode`].
    encode: bool,
    alignment: Option<crate::time::alignment::Aligned>,
    watermark: Timestamp,
    sent_watermark: Timestamp,
}

impl<A, B, K, F> BroadcastRouterOp<A, B, K, F>
where
    A: Data,
    B: Data,
    K: Key,
    F: Fn(&A) -> K + Send + Sync + 'static,
{
    /// Sends target `target`'s batch of one kind, if it has records.
    fn send(&mut self, target: usize, broadcast: bool) {
        let Some(&sender) = self.senders.get(target) else { return };
        let batches = if broadcast { &mut self.broadcast } else { &mut self.keyed };
        let Some(batch) = batches.get_mut(target).filter(|b| !b.is_empty()) else { return };
        let bytes = if self.encode { 16 * self.limits.records } else { 0 };
        let mut full = std::mem::replace(batch, self.pool.take(self.limits.records, bytes));
        if broadcast {
            if let Some(typed) = self.broadcast_typed.get_mut(target).filter(|t| !t.is_empty()) {
                full.swap_typed(typed);
            }
            full.set_broadcast();
        } else if let Some(typed) = self.keyed_typed.get_mut(target).filter(|t| !t.is_empty()) {
            full.swap_typed(typed);
        }
        self.outbox.push(sender, Message::Data(full));
    }

    fn send_all_and_watermark(&mut self) {
        for t in 0..self.senders.len() {
            self.send(t, false);
            self.send(t, true);
        }
        if self.watermark > self.sent_watermark {
            self.sent_watermark = self.watermark;
            let wm = self.watermark;
            self.send_to_every_instance(|| Message::Watermark(wm));
        }
    }

    fn send_to_every_instance(&mut self, make: impl Fn() -> Message) {
        for &sender in &self.senders {
            self.outbox.push(sender, make());
        }
    }

    /// A keyed record: to the instance of its key group.
    fn keyed_record(&mut self, a: A, m: crate::record::Meta) -> Result<()> {
        let key = (self.key_fn)(&a);
        let record = Either::Left(a);
        let spread = self.spread.as_mut().map(Spread::next);
        if self.encode {
            self.key_buf.clear();
            key.encode_key(&mut self.key_buf);
            let (group, target) =
                spread.unwrap_or_else(|| self.routes.route_hash(crate::codec::key::key_hash(&self.key_buf)));
            let Some(out) = self.keyed.get_mut(target) else {
                return Err(crate::error::internal_error!("key group {group} maps to missing worker {target}"));
            };
            let key_start = out.data_mut().len();
            out.data_mut().extend_from_slice(&self.key_buf);
            let value_start = out.data_mut().len();
            if let Err(source) = record.encode(out.data_mut()) {
                out.rollback(key_start);
                return Err(Error::Codec { operator: self.info.name.to_string(), source });
            }
            out.commit(key_start, value_start, group, m);
            if out.len() >= self.limits.records {
                self.send(target, false);
            }
            return Ok(());
        }
        let (group, target) = match spread {
            Some(to) => to,
            None => self.routes.route_hash(key.routing_hash(&mut self.key_buf)),
        };
        let (Some(out), Some(typed)) = (self.keyed.get_mut(target), self.keyed_typed.get_mut(target)) else {
            return Err(crate::error::internal_error!("key group {group} maps to missing worker {target}"));
        };
        typed.push((key, record));
        out.commit_typed(group, m);
        if out.len() >= self.limits.records {
            self.send(target, false);
        }
        Ok(())
    }

    /// A broadcast record: a copy to every instance.
    fn broadcast_record(&mut self, b: B, m: crate::record::Meta) -> Result<()> {
        let record = Either::<A, B>::Right(b);
        for target in 0..self.senders.len() {
            let (Some(out), Some(typed)) = (self.broadcast.get_mut(target), self.broadcast_typed.get_mut(target))
            else {
                return Err(crate::error::internal_error!("no broadcast batch for worker {target}"));
            };
            if self.encode {
                let start = out.data_mut().len();
                if let Err(source) = record.encode(out.data_mut()) {
                    out.rollback(start);
                    return Err(Error::Codec { operator: self.info.name.to_string(), source });
                }
                out.commit(start, start, 0, m);
            } else {
                typed.push(record.clone());
                out.commit_typed(0, m);
            }
            if out.len() >= self.limits.records {
                self.send(target, true);
            }
        }
        Ok(())
    }
}

impl<A, B, K, F> Consumer<Either<A, B>> for BroadcastRouterOp<A, B, K, F>
where
    A: Data,
    B: Data,
    K: Key,
    F: Fn(&A) -> K + Send + Sync + 'static,
{
    fn push(&mut self, batch: &mut Batch<Either<A, B>>) -> Result<()> {
        let n = batch.len();
        OperatorCounters::add(&self.info.counters.records_in, n);
        for (v, m) in batch.values.drain(..).zip(batch.meta.drain(..)) {
            match v {
                Either::Left(a) => self.keyed_record(a, m)?,
                Either::Right(b) => self.broadcast_record(b, m)?,
            }
        }
        OperatorCounters::add(&self.info.counters.records_out, n);
        Ok(())
    }

    fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.watermark = self.watermark.max(wm);
        if let Some(a) = &self.alignment {
            a.group.publish(a.index, self.watermark);
        }
        Ok(())
    }

    fn idle(&mut self) -> Result<()> {
        self.send_all_and_watermark();
        self.send_to_every_instance(|| Message::Idle);
        Ok(())
    }

    fn barrier(&mut self, n: CheckpointId) -> Result<()> {
        self.send_all_and_watermark();
        self.send_to_every_instance(|| Message::Barrier(n));
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.send_all_and_watermark();
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        self.send_all_and_watermark();
        self.send_to_every_instance(|| Message::EndOfInput);
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
                    let group = crate::codec::key::key_group(&bytes, max);
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
