//! What both window operators share: the function, timers, outputs.

use super::*;

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
    pub(super) late: Batch<T>,
    pub(super) late_enabled: bool,
    pub(super) next: Box<dyn Consumer<W::Out>>,
    pub(super) late_next: Box<dyn Consumer<T>>,
    pub(super) key_buf: Vec<u8>,
    /// The batch's records, taken (see [`take_records`](crate::operator::keyed::take_records)).
    pub(super) records: Vec<(K, T)>,
}

impl<K: Key, T: Data, W: WindowFn<K, T>> Common<K, T, W> {
    /// Gives what `fire` put in the output batch since the last call the
    /// window's timestamp and this operator's watermark.
    pub(super) fn collect(&mut self, window: Window) {
        let meta = Meta {
            timestamp: window.max_timestamp(),
            watermark: self.watermark,
            offset: 0,
            partition: 0,
            source: u32::MAX,
        };
        let n = self.out.values.len().saturating_sub(self.out.meta.len());
        self.out.meta.extend(std::iter::repeat_n(meta, n));
    }

    /// A record no window took.
    pub(super) fn late(&mut self, value: T, meta: Meta) {
        OperatorCounters::add(&self.info.counters.late, 1);
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
