//! The end of a chain at a sink.

use std::sync::Arc;

use super::factory::{ChainFactory, chain_factory};
use super::{Consumer, OpInfo, erase};
use crate::checkpoint::commit::Prepared;
use crate::error::Result;
use crate::metrics::OperatorCounters;
use crate::record::CheckpointId;
use crate::record::{Batch, Timestamp};

/// The factory of the chain's end at `sink`: each instance opens its
/// writer with its place in the job.
pub(crate) fn plain<T, S>(sink: Arc<S>) -> Arc<dyn ChainFactory>
where
    T: Send + 'static,
    S: crate::sinks::Sink<T>,
{
    chain_factory(move |ctx, _outs| {
        let info = ctx.info.clone();
        let context = crate::sinks::SinkContext {
            job: ctx.job.to_string(),
            sink: info.id.to_string(),
            instance: ctx.instance,
            parallelism: ctx.parallelism,
            epoch: ctx.restored.map_or(CheckpointId::FIRST, CheckpointId::next),
        };
        let sink = sink.clone();
        let open: OpenWriter<T> = Box::new(move || sink.open_in(&context));
        Ok(erase::<T>(Box::new(SinkOp::new(info, open, false))))
    })
}

/// The factory of the chain's end at the exactly-once `sink`: each
/// instance writes epochs between barriers and leaves what it
/// pre-committed in `prepared`, for the checkpoint's commit.
pub(crate) fn exactly_once<T, S>(sink: Arc<S>, prepared: Arc<Prepared>) -> Arc<dyn ChainFactory>
where
    T: Send + 'static,
    S: crate::sinks::TwoPhaseCommitSink<T>,
{
    chain_factory(move |ctx, _outs| {
        let info = ctx.info.clone();
        let epoch = ctx.restored.map_or(CheckpointId::FIRST, CheckpointId::next);
        let (sink, prepared) = (sink.clone(), prepared.clone());
        let (instance, parallelism, checkpointed) = (ctx.instance, ctx.parallelism, ctx.checkpointing);
        let open: OpenWriter<T> = Box::new(move || {
            let writer = sink.open(instance, parallelism, epoch)?;
            Ok(Box::new(crate::sinks::TxnSinkWriter {
                sink,
                writer,
                prepared,
                checkpointed,
                ended: false,
                sealed: false,
            }))
        });
        Ok(erase::<T>(Box::new(SinkOp::new(info, open, true))))
    })
}

/// Opens a sink's writer.
pub(crate) type OpenWriter<T> = Box<dyn FnOnce() -> Result<Box<dyn crate::sinks::SinkWriter<T>>> + Send>;

/// A sink's writer, opened when the task first calls it.
enum Writer<T> {
    Closed(Option<OpenWriter<T>>),
    Open(Box<dyn crate::sinks::SinkWriter<T>>),
}

/// The end of a chain at a sink.
///
/// The writer is opened when the running task first gives it something
/// to do (records, a watermark, a barrier, a flush, the end), not when
/// the job is built: building a job that is then refused (a restore that
/// does not fit) must touch no sink's output, and a sink's restore work
/// (committing and discarding what earlier runs left) happens between
/// the two.
pub(crate) struct SinkOp<T> {
    pub(crate) info: OpInfo,
    writer: Writer<T>,
    /// Whether the writer takes barriers after `finish` (exactly-once
    /// sinks seal their last epoch at the next one). Other writers have
    /// nothing to do then, and may have closed what they write to.
    pub(crate) barriers_after_finish: bool,
    /// `finish` was called.
    pub(crate) finished: bool,
}

impl<T> SinkOp<T> {
    /// A sink whose writer `open` makes on first use.
    pub(crate) fn new(info: OpInfo, open: OpenWriter<T>, barriers_after_finish: bool) -> Self {
        Self { info, writer: Writer::Closed(Some(open)), barriers_after_finish, finished: false }
    }

    /// The writer, opened now if it is not yet.
    #[inline]
    fn writer(&mut self) -> Result<&mut dyn crate::sinks::SinkWriter<T>> {
        open_writer(&mut self.writer, &self.info.name)
    }
}

/// `writer`, opened now if it is not yet (opening may wait on a service:
/// off the runtime's workers).
#[inline]
fn open_writer<'a, T>(writer: &'a mut Writer<T>, name: &str) -> Result<&'a mut dyn crate::sinks::SinkWriter<T>> {
    if let Writer::Closed(open) = writer {
        let Some(open) = open.take() else {
            return Err(crate::error::internal_error!("sink `{name}` failed to open before"));
        };
        *writer = Writer::Open(crate::task::blocking(open)?);
    }
    match writer {
        Writer::Open(w) => Ok(w.as_mut()),
        Writer::Closed(_) => Err(crate::error::internal_error!("sink `{name}` did not open")),
    }
}

impl<T: Send + 'static> Consumer<T> for SinkOp<T> {
    fn push(&mut self, batch: &mut Batch<T>) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        OperatorCounters::add(&self.info.counters.records_in, batch.len());
        let writer = open_writer(&mut self.writer, &self.info.name)?;
        writer.write(&mut crate::sinks::SinkBatch { batch, sources: &self.info.sources })?;
        batch.clear();
        Ok(())
    }
    fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.writer()?.on_watermark(wm)
    }
    fn barrier(&mut self, n: CheckpointId) -> Result<()> {
        if self.finished && !self.barriers_after_finish {
            return Ok(());
        }
        self.writer()?.on_barrier(n)
    }
    fn idle(&mut self) -> Result<()> {
        Ok(())
    }
    fn flush(&mut self) -> Result<()> {
        if self.finished {
            return Ok(());
        }
        self.writer()?.flush()
    }
    fn finish(&mut self) -> Result<()> {
        self.finished = true;
        self.writer()?.finish()
    }
}
