//! `with_timestamps` and `with_watermarks`: the operator that stamps
//! records with their event time and generates watermarks by a
//! [`WatermarkStrategy`].

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use crate::error::Result;
use crate::operator::factory::{ChainFactory, chain_factory, one};
use crate::operator::{Consumer, OpInfo, erase, typed};
use crate::record::CheckpointId;
use crate::record::{Batch, NO_TIMESTAMP, Timestamp};
use crate::time::WatermarkStrategy;

/// The factory of the operator that stamps records with `f(record,
/// source timestamp)` and generates watermarks by `strategy`.
pub(crate) fn timestamps<T, F>(f: Arc<F>, strategy: WatermarkStrategy) -> Arc<dyn ChainFactory>
where
    T: Send + 'static,
    F: Fn(&T, Timestamp) -> Timestamp + Send + Sync + 'static,
{
    chain_factory(move |ctx, outs| {
        let info = ctx.info.clone();
        let next = typed::<T>(one(outs, &info.name)?, &info.name)?;
        let task = ctx.task.clone();
        Ok(erase::<T>(Box::new(TimestampOp::new(info, f.clone(), strategy, next, task))))
    })
}

/// Assigns timestamps and generates watermarks, per parallel instance.
pub(crate) struct TimestampOp<T, F> {
    pub(crate) info: OpInfo,
    pub(crate) f: Arc<F>,
    pub(crate) strategy: WatermarkStrategy,
    pub(crate) max_timestamp: Timestamp,
    pub(crate) watermark: Timestamp,
    pub(crate) reported: Timestamp,
    pub(crate) last_record: Instant,
    pub(crate) idle: bool,
    pub(crate) next: Box<dyn Consumer<T>>,
    /// Where the task's metrics take the watermark from.
    pub(crate) task: Arc<crate::metrics::TaskCounters>,
    pub(crate) _t: PhantomData<fn(T)>,
}

impl<T, F> TimestampOp<T, F> {
    pub(crate) fn new(
        info: OpInfo,
        f: Arc<F>,
        strategy: WatermarkStrategy,
        next: Box<dyn Consumer<T>>,
        task: Arc<crate::metrics::TaskCounters>,
    ) -> Self {
        Self {
            info,
            f,
            strategy,
            max_timestamp: NO_TIMESTAMP,
            watermark: NO_TIMESTAMP,
            reported: NO_TIMESTAMP,
            last_record: Instant::now(),
            idle: false,
            next,
            task,
            _t: PhantomData,
        }
    }
}

impl<T, F> Consumer<T> for TimestampOp<T, F>
where
    T: Send + 'static,
    F: Fn(&T, Timestamp) -> Timestamp + Send + Sync + 'static,
{
    #[inline]
    fn push(&mut self, batch: &mut Batch<T>) -> Result<()> {
        let n = batch.len();
        crate::metrics::OperatorCounters::add(&self.info.counters.records_in, n);
        let f = &*self.f;
        for (v, m) in batch.values.iter().zip(batch.meta.iter_mut()) {
            m.watermark = self.watermark;
            let ts = f(v, m.timestamp);
            m.timestamp = ts;
            if ts != NO_TIMESTAMP && ts > self.max_timestamp {
                self.max_timestamp = ts;
                self.watermark = self.watermark.max(self.strategy.watermark_for(ts));
            }
        }
        if n > 0 {
            self.last_record = Instant::now();
            self.idle = false;
        }
        crate::metrics::OperatorCounters::add(&self.info.counters.records_out, n);
        self.next.push(batch)?;
        if self.watermark > self.reported {
            self.reported = self.watermark;
            self.next.watermark(self.watermark)?;
            self.task.generated_watermark(self.watermark);
        }
        Ok(())
    }

    /// Watermarks from upstream are replaced by this operator's own.
    fn watermark(&mut self, _wm: Timestamp) -> Result<()> {
        Ok(())
    }

    fn barrier(&mut self, n: CheckpointId) -> Result<()> {
        self.next.barrier(n)
    }

    fn idle(&mut self) -> Result<()> {
        if !self.idle {
            self.idle = true;
            self.next.idle()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if let Some(timeout) = self.strategy.idleness
            && !self.idle
            && self.last_record.elapsed() >= timeout
        {
            self.idle = true;
            self.next.idle()?;
        }
        self.next.flush()
    }

    fn finish(&mut self) -> Result<()> {
        self.next.finish()
    }
}
