//! Watermark alignment: the partitions of one source, and of the sources
//! whose records meet downstream (one group per connected part of the
//! graph), in one process, read no further than a bounded drift ahead of
//! the slowest of them.
//!
//! A keyed operator's watermark is the minimum of its inputs'. When one
//! source partition reads ahead of the others (it was scheduled more, or
//! its data is older), the operators downstream keep taking its records
//! into windows and timers that cannot fire until the slowest partition
//! catches up: state grows with the skew, without bound. With alignment,
//! each partition's watermark (as the end of its chain sees it) is
//! published here, and a partition more than the drift ahead of the
//! slowest waits, passing barriers meanwhile, until the others catch up
//! (Apache Flink's watermark alignment, within one process).
//!
//! A partition holds the others back while it has records to read and a
//! watermark, or has not finished its first read yet (it is about to have
//! one): one whose reader reports it idle (nothing to read now), one that
//! ended, and one that has read without getting a watermark holds nobody
//! back.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use crate::record::{NO_TIMESTAMP, Timestamp};

/// The watermarks of one alignment group's source partitions in this
/// process.
#[derive(Debug)]
pub(crate) struct Alignment {
    /// Per partition, the watermark at the end of its chain.
    marks: Box<[AtomicI64]>,
    /// Per partition, whether it holds nobody back (idle or ended).
    idle: Box<[AtomicBool]>,
    /// Per partition, whether it has finished a read.
    started: Box<[AtomicBool]>,
    /// How far (ms of event time) a partition may read ahead of the slowest.
    drift: i64,
    /// Woken whenever a watermark moves or a partition goes idle.
    moved: tokio::sync::Notify,
}

impl Alignment {
    pub(crate) fn new(partitions: usize, drift: i64) -> Self {
        Self {
            marks: (0..partitions).map(|_| AtomicI64::new(NO_TIMESTAMP)).collect(),
            idle: (0..partitions).map(|_| AtomicBool::new(false)).collect(),
            started: (0..partitions).map(|_| AtomicBool::new(false)).collect(),
            drift: drift.max(0),
            moved: tokio::sync::Notify::new(),
        }
    }

    /// Partition `i`'s chain reached watermark `wm`.
    pub(crate) fn publish(&self, i: usize, wm: Timestamp) {
        if let Some(mark) = self.marks.get(i)
            && mark.fetch_max(wm, Ordering::Release) < wm
        {
            self.moved.notify_waiters();
        }
    }

    /// Partition `i` finished a read: it has more records to read
    /// (`active`), or is idle or has ended (it holds nobody back).
    pub(crate) fn set_active(&self, i: usize, active: bool) {
        let first = self.started.get(i).is_some_and(|s| !s.swap(true, Ordering::AcqRel));
        let changed = self.idle.get(i).is_some_and(|idle| idle.swap(!active, Ordering::AcqRel) == active);
        if first || changed {
            self.moved.notify_waiters();
        }
    }

    /// Whether partition `i` is more than the drift ahead of the slowest
    /// partition that holds it back.
    pub(crate) fn ahead(&self, i: usize) -> bool {
        let Some(mine) = self.marks.get(i).map(|m| m.load(Ordering::Acquire)) else { return false };
        if mine == NO_TIMESTAMP {
            return false;
        }
        let slowest = (0..self.marks.len())
            .filter(|&j| j != i && !self.idle.get(j).is_some_and(|idle| idle.load(Ordering::Acquire)))
            .filter_map(|j| {
                let mark = self.marks.get(j)?.load(Ordering::Acquire);
                let started = self.started.get(j)?.load(Ordering::Acquire);
                match mark {
                    // Not read yet: about to have a watermark, from the start.
                    NO_TIMESTAMP if !started => Some(Timestamp::MIN),
                    // Read, and no watermark: it holds nobody back.
                    NO_TIMESTAMP => None,
                    mark => Some(mark),
                }
            })
            .min();
        slowest.is_some_and(|slowest| mine > slowest.saturating_add(self.drift))
    }

    /// Resolves when a watermark moves or a partition's activity changes
    /// after this call: create it, check [`Alignment::ahead`], then await
    /// it, so that no change between the two is missed.
    pub(crate) fn changed(&self) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut notified = Box::pin(self.moved.notified());
        // Registered now: a `notify_waiters` from here on wakes it.
        notified.as_mut().enable();
        notified
    }
}

/// A partition's place in its source's [`Alignment`].
#[derive(Clone, Debug)]
pub(crate) struct Aligned {
    pub(crate) group: std::sync::Arc<Alignment>,
    pub(crate) index: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_waits_only_for_active_partitions_with_a_watermark() {
        let a = Alignment::new(3, 100);
        a.publish(0, 1_000);
        a.set_active(0, true);
        assert!(a.ahead(0), "the others have not read yet: they are about to have watermarks");
        a.set_active(1, true);
        a.set_active(2, true);
        assert!(!a.ahead(0), "the others read without getting watermarks");
        a.publish(1, 850);
        assert!(a.ahead(0), "1,000 is more than 100 ahead of 850");
        assert!(!a.ahead(1));
        a.publish(1, 900);
        assert!(!a.ahead(0), "exactly the drift ahead may read on");
        a.publish(2, 500);
        assert!(a.ahead(0) && a.ahead(1));
        a.set_active(2, false);
        assert!(!a.ahead(0) && !a.ahead(1), "an idle partition holds nobody back");
        a.set_active(2, true);
        assert!(a.ahead(0));
        a.publish(2, 400);
        assert!(a.ahead(0), "a watermark never moves back");
        assert!(!a.ahead(2));
    }

    #[test]
    fn a_waiter_registered_before_the_check_sees_a_change_after_it() {
        let a = Alignment::new(2, 0);
        a.publish(0, 10);
        a.publish(1, 5);
        a.set_active(0, true);
        a.set_active(1, true);
        let changed = a.changed();
        assert!(a.ahead(0));
        a.publish(1, 10);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut changed = changed;
        assert!(std::future::Future::poll(changed.as_mut(), &mut cx).is_ready(), "the change after the check woke it");
        assert!(!a.ahead(0));
    }
}
