//! The end of a chain at a sink.

use crate::error::Result;
use crate::metrics::OperatorCounters;
use crate::operator::Consumer;
use crate::record::CheckpointId;
use crate::record::{Batch, Timestamp};

use super::*;

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
        self.writer.write(&mut crate::sinks::SinkBatch { batch, sources: &self.info.sources })?;
        batch.clear();
        Ok(())
    }
    fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.writer.on_watermark(wm)
    }
    fn barrier(&mut self, n: CheckpointId) -> Result<()> {
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
