//! What both window operators share: the function, timers, outputs.

use std::sync::Arc;

use super::Window;
use super::functions::WindowFn;
use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::{Error, Result};
use crate::metrics::OperatorCounters;
use crate::operator::{Consumer, OpInfo, emit};
use crate::record::{Batch, Meta, Timestamp};
use crate::state::TimerState;

/// What both window operators share: the function, timers, outputs.
pub(super) struct Common<K, T, W: WindowFn<K, T>> {
    pub(super) info: OpInfo,
    pub(super) func: Arc<W>,
    pub(super) lateness: i64,
    pub(super) fire: TimerState<K>,
    pub(super) cleanup: TimerState<K>,
    /// The watermark up to which timers have fired.
    pub(super) watermark: Timestamp,
    /// The output batch. A window function fires into its values, and
    /// [`collect`](Self::collect) gives what it fired their metadata: in
    /// between, `values` runs ahead of `meta`.
    pub(super) out: Batch<W::Out>,
    /// Records an output batch holds before it goes on while windows fire
    /// (the job's batch size): a window of a million keys goes out a
    /// batch at a time, not in one batch of a million.
    pub(super) batch_size: usize,
    pub(super) late: Batch<T>,
    pub(super) late_enabled: bool,
    pub(super) next: Box<dyn Consumer<W::Out>>,
    pub(super) late_next: Box<dyn Consumer<T>>,
    pub(super) key_buf: Vec<u8>,
    /// The batch's records, taken (see [`take_records`](crate::operator::keyed::take_records)).
    pub(super) records: Vec<(K, T)>,
}

/// Gives the values a window function fired into `out` since the last
/// call their metadata, `meta`.
pub(super) fn give_meta<O>(out: &mut Batch<O>, meta: Meta) {
    let n = out.values.len().saturating_sub(out.meta.len());
    out.meta.extend(std::iter::repeat_n(meta, n));
}

impl<K: Key, T: Data, W: WindowFn<K, T>> Common<K, T, W> {
    /// Gives what `fire` put in the output batch since the last call the
    /// window's timestamp and this operator's watermark.
    pub(super) fn collect(&mut self, window: Window) {
        let meta = self.window_meta(window);
        give_meta(&mut self.out, meta);
    }

    /// The metadata of `window`'s results: its last timestamp, and this
    /// operator's watermark.
    pub(super) fn window_meta(&self, window: Window) -> Meta {
        Meta { timestamp: window.max_timestamp(), watermark: self.watermark, offset: 0, partition: 0, source: u32::MAX }
    }

    /// Sends the output batch on if it holds a batch's worth (its records
    /// collected).
    pub(super) fn emit_full(&mut self) -> Result<()> {
        if self.out.len() >= self.batch_size {
            emit(&self.info, &mut *self.next, &mut self.out)?;
        }
        Ok(())
    }

    /// A record no window took.
    pub(super) fn late(&mut self, value: T, meta: Meta) {
        OperatorCounters::add(&self.info.counters.late, 1);
        self.func.late(&value);
        if self.late_enabled {
            self.late.push(value, meta);
        }
    }

    pub(super) fn record_meta(&self, meta: Meta) -> Meta {
        Meta { watermark: self.watermark, ..meta }
    }

    pub(super) fn emit(&mut self) -> Result<()> {
        emit(&self.info, &mut *self.next, &mut self.out)?;
        if !self.late.is_empty() {
            self.late_next.push(&mut self.late)?;
        }
        Ok(())
    }

    /// A record's event time; a record without one is an error naming its
    /// position.
    #[inline]
    pub(super) fn event_time(&self, meta: &Meta) -> Result<Timestamp> {
        if meta.timestamp == crate::record::NO_TIMESTAMP {
            return Err(self.no_time(meta));
        }
        Ok(meta.timestamp)
    }

    pub(super) fn no_time(&self, meta: &Meta) -> Error {
        Error::Input {
            position: self.info.sources.position(meta),
            message: format!(
                "window `{}` got a record without an event time: call `with_timestamps(...)` before `key_by`",
                self.info.name
            ),
        }
    }

    /// Which timer is due next: `Some(true)` a firing, `Some(false)` a clean-up.
    pub(super) fn next_due(&self, watermark: Timestamp) -> Option<bool> {
        let fire = self.fire.next_time().filter(|t| *t <= watermark);
        let cleanup = self.cleanup.next_time().filter(|t| *t <= watermark);
        match (fire, cleanup) {
            (None, None) => None,
            (Some(f), Some(c)) => Some(f <= c),
            (Some(_), None) => Some(true),
            (None, Some(_)) => Some(false),
        }
    }
}

macro_rules! window_control {
    () => {
        fn on_watermark(&mut self, wm: Timestamp) -> Result<()> {
            self.advance(wm)?;
            self.common.emit()?;
            self.common.next.watermark(wm)?;
            self.common.late_next.watermark(wm)
        }
        fn flush(&mut self) -> Result<()> {
            self.common.next.flush()?;
            self.common.late_next.flush()
        }
        fn barrier(&mut self, n: $crate::record::CheckpointId) -> Result<()> {
            self.common.emit()?;
            self.common.next.barrier(n)?;
            self.common.late_next.barrier(n)
        }
        fn finish(&mut self) -> Result<()> {
            self.common.emit()?;
            self.common.next.finish()?;
            self.common.late_next.finish()
        }
    };
}
pub(super) use window_control;
