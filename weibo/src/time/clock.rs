//! Processing time: the wall clock, or a clock a test drives.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::record::Timestamp;

/// The clock processing-time timers follow: the system's (milliseconds
/// since the Unix epoch), or one a test harness sets
/// ([`Clock::manual`]), which also tells the harness how far each operator
/// instance has fired its timers.
#[derive(Clone, Debug, Default)]
pub(crate) struct Clock {
    manual: Option<Arc<Manual>>,
}

#[derive(Debug, Default)]
struct Manual {
    now: AtomicI64,
    /// Per operator instance with processing-time timers: the time up to
    /// which it has fired them.
    fired: Mutex<Vec<Arc<AtomicI64>>>,
}

impl Clock {
    /// A clock that stays at `start` until [`Clock::set`] moves it.
    pub(crate) fn manual(start: Timestamp) -> Self {
        Self { manual: Some(Arc::new(Manual { now: AtomicI64::new(start), fired: Mutex::default() })) }
    }

    /// The processing time now, in milliseconds.
    pub(crate) fn now(&self) -> Timestamp {
        match &self.manual {
            Some(m) => m.now.load(Ordering::Acquire),
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        }
    }

    /// A function that reads this clock (what state with a time-to-live
    /// keeps, below the layer of clocks).
    pub(crate) fn reading(&self) -> std::sync::Arc<dyn Fn() -> Timestamp + Send + Sync> {
        let clock = self.clone();
        std::sync::Arc::new(move || clock.now())
    }

    /// Moves a manual clock to `time` (never back); the system clock
    /// ignores it.
    pub(crate) fn set(&self, time: Timestamp) {
        if let Some(m) = &self.manual {
            m.now.fetch_max(time, Ordering::AcqRel);
        }
    }

    /// Where an operator instance reports how far it has fired its
    /// processing-time timers (on a manual clock only).
    pub(crate) fn reporter(&self) -> Option<Arc<AtomicI64>> {
        let m = self.manual.as_ref()?;
        let slot = Arc::new(AtomicI64::new(Timestamp::MIN));
        m.fired.lock().unwrap_or_else(PoisonError::into_inner).push(slot.clone());
        Some(slot)
    }

    /// Whether every reporting instance has fired its timers up to `time`.
    pub(crate) fn fired_through(&self, time: Timestamp) -> bool {
        self.manual.as_ref().is_none_or(|m| {
            m.fired.lock().unwrap_or_else(PoisonError::into_inner).iter().all(|f| f.load(Ordering::Acquire) >= time)
        })
    }
}
