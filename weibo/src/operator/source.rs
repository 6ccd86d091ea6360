//! A source partition's reader and the chain it feeds, behind an erased
//! interface the runtime's source task drives.

use std::sync::Arc;
use std::time::Instant;

use crate::error::Result;
use crate::metrics::OperatorCounters;
use crate::record::CheckpointId;
use crate::record::Timestamp;
use crate::sources::{ReadStatus, Source, SourceOutput, SourceReader};
use crate::task::BoxFuture;

use super::factory::{SourceFactory, source_factory};
use super::{Consumer, OpInfo, typed};

/// One source partition, its type erased: the runtime reads into it,
/// pushes what was read into its chain, and passes barriers and the end
/// of input.
pub(crate) trait SourceOperator: Send {
    fn info(&self) -> &OpInfo;
    /// The partition's number, and its name outside Weibo if it has one.
    fn partition(&self) -> u32;
    fn partition_name(&self) -> Option<&str>;
    /// Reads the next batch; a reader that has to wait waits no longer
    /// than `deadline`.
    fn read(&mut self, deadline: Instant) -> BoxFuture<'_, Result<ReadStatus>>;
    /// Pushes what the last read produced into the chain; returns how many
    /// records it was.
    fn emit(&mut self) -> Result<usize>;
    /// The partition's watermark, as the reader last advanced it.
    fn watermark(&self) -> Timestamp;
    /// Where reading resumes, for a checkpoint; `None` if the reader
    /// cannot say.
    fn position(&self) -> Option<u64>;
    /// Where the partition ends now, if the reader can tell (for lag).
    fn end_position(&self) -> Option<u64>;
    fn forward_watermark(&mut self, wm: Timestamp) -> Result<()>;
    fn barrier(&mut self, n: CheckpointId) -> Result<()>;
    fn flush(&mut self) -> Result<()>;
    fn finish(&mut self) -> Result<()>;
}

/// The factory of `source`'s operator, the job's `index`th source: each
/// instance reads one partition, from its restored position if it has
/// one.
pub(crate) fn factory<S: Source>(source: Arc<S>, index: usize) -> Arc<dyn SourceFactory> {
    source_factory(move |ctx, out| {
        let info = ctx.info.clone();
        let partition = ctx.instance;
        let chain = typed::<S::Item>(out, &info.name)?;
        let reader = match ctx.restored_position {
            Some(p) => source.open_at(partition, p)?,
            None => source.open(partition)?,
        };
        let output = SourceOutput::new(
            info.name.clone(),
            u32::try_from(index).unwrap_or(u32::MAX),
            u32::try_from(partition).unwrap_or(u32::MAX),
            ctx.batch_size,
        );
        let partition_name = source.partition_name(partition);
        Ok(Box::new(SourceOp { info, partition_name, reader, chain, output }))
    })
}

/// A typed source partition: its reader, the batch it fills, and the
/// chain behind it.
pub(crate) struct SourceOp<T> {
    pub(crate) info: OpInfo,
    pub(crate) partition_name: Option<String>,
    pub(crate) reader: Box<dyn SourceReader<T>>,
    pub(crate) chain: Box<dyn Consumer<T>>,
    pub(crate) output: SourceOutput<T>,
}

impl<T: Send + 'static> SourceOperator for SourceOp<T> {
    fn info(&self) -> &OpInfo {
        &self.info
    }

    fn partition(&self) -> u32 {
        self.output.partition
    }

    fn partition_name(&self) -> Option<&str> {
        self.partition_name.as_deref()
    }

    fn read(&mut self, deadline: Instant) -> BoxFuture<'_, Result<ReadStatus>> {
        self.output.deadline = deadline;
        self.reader.read(&mut self.output)
    }

    fn emit(&mut self) -> Result<usize> {
        let n = self.output.batch.len();
        if n > 0 {
            OperatorCounters::add(&self.info.counters.records_out, n);
            self.chain.push(&mut self.output.batch)?;
            self.output.batch.clear();
        }
        Ok(n)
    }

    fn watermark(&self) -> Timestamp {
        self.output.watermark
    }

    fn position(&self) -> Option<u64> {
        self.reader.position()
    }

    fn end_position(&self) -> Option<u64> {
        self.reader.end_position()
    }

    fn forward_watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.chain.watermark(wm)
    }

    fn barrier(&mut self, n: CheckpointId) -> Result<()> {
        self.chain.barrier(n)
    }

    fn flush(&mut self) -> Result<()> {
        self.chain.flush()
    }

    fn finish(&mut self) -> Result<()> {
        self.chain.finish()
    }
}
