//! Event-time windows on keyed streams.
//!
//! ```text
//! keyed.window(Tumbling::of(1 s))            [0,1000) [1000,2000) ...
//! keyed.window(Sliding::of(10 s, 5 s))       [-5000,5000) [0,10000) [5000,15000) ...
//! keyed.window(Session::with_gap(30 s))      a key's records closer than 30 s share a window
//! ```
//!
//! Semantics follow Apache Flink's DataStream API:
//! - windows are `[start, end)`; a window's `max_timestamp` is `end - 1`;
//! - tumbling: `start = ts - (ts - offset) mod size`; sliding: every
//!   `start = k * slide + offset` with `start <= ts < start + size`;
//! - a window fires when the watermark reaches `end - 1`, emitting its
//!   result with timestamp `end - 1`;
//! - with allowed lateness `L`, a window is kept until the watermark
//!   reaches `end - 1 + L`; a record for a window that already fired
//!   (but is still kept) is added and fires the window again at once with
//!   the full updated result — an *update* of the earlier result, not a
//!   delta;
//! - a record added to none of its windows with `ts + L <= watermark` is
//!   *late*: it goes to [`WindowedOutput::late_records`] when that output is
//!   used, and is otherwise dropped and counted (`late` in the operator's
//!   metrics);
//! - sessions: a record opens `[ts, ts + gap)`; a key's windows merge when
//!   they touch or overlap (`a.start <= b.end && a.end >= b.start`, so
//!   records exactly `gap` apart share a session); lateness is judged on
//!   the merged window, and a merged window is a new window (earlier
//!   firings of its parts are not retracted);
//! - end of input is watermark `+∞`: every open window fires.
//!
//! Window contents and timers live in the job's state backend, per key
//! group. What fired is part of that state, so a job restored from a
//! checkpoint neither fires a window again that had fired (and is kept
//! for its lateness) nor loses a firing a late record owes: the watermark
//! starts again after a restore (as in Flink), and a window that fired
//! before the checkpoint fires again only when records are added to it
//! after the restore — at once if the new watermark has passed its end,
//! or when it does. (Tumbling and sliding windows record, per key group,
//! the watermark up to which their windows had fired and the windows that
//! owe a firing since; sessions keep their fire timers.)

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::Result;
use crate::operator::InputOperator;
use crate::operator::factory::{KeyedFactory, OperatorContext};
use crate::operator::{AnyConsumer, typed};
use crate::record::{Batch, Timestamp};
use crate::state::{StateScope, TimerState, ValueStore, WindowState};

/// A window: the event times `[start, end)`.
///
/// ```
/// use weibo::window::Window;
/// let w = Window { start: 1_000, end: 2_000 };
/// assert_eq!(w.max_timestamp(), 1_999);
/// assert!(w.intersects(&Window { start: 2_000, end: 3_000 }), "touching windows intersect");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Window {
    /// First timestamp in the window.
    pub start: Timestamp,
    /// First timestamp after the window.
    pub end: Timestamp,
}

impl Window {
    /// The last timestamp in the window (`end - 1`): the window fires when
    /// the watermark reaches it, and its result carries it as timestamp.
    ///
    /// ```
    /// let w = weibo::window::Window { start: 0, end: 60_000 };
    /// assert_eq!(w.max_timestamp(), 59_999);
    /// ```
    pub fn max_timestamp(&self) -> Timestamp {
        self.end.saturating_sub(1)
    }

    /// Whether the two windows overlap or touch (sessions merge then).
    ///
    /// ```
    /// use weibo::window::Window;
    /// let a = Window { start: 0, end: 10 };
    /// assert!(a.intersects(&Window { start: 5, end: 20 }));
    /// assert!(!a.intersects(&Window { start: 11, end: 20 }));
    /// ```
    pub fn intersects(&self, other: &Window) -> bool {
        self.start <= other.end && self.end >= other.start
    }

    fn cover(&self, other: &Window) -> Window {
        Window { start: self.start.min(other.start), end: self.end.max(other.end) }
    }
}

/// The result of a window function: the key, the window, the value.
///
/// ```
/// use std::time::Duration;
/// use weibo::window::{Tumbling, Window, WindowResult};
/// let out = weibo::testing::run_timed(vec![(5, 2i64), (6, 3)], |s| {
///     s.key_by(|_: &i64| 'k').window(Tumbling::of(Duration::from_millis(10))).reduce(|a, b| a + b).into_stream()
/// })?;
/// assert_eq!(out, vec![WindowResult { key: 'k', window: Window { start: 0, end: 10 }, value: 5 }]);
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WindowResult<K, V> {
    /// The key.
    pub key: K,
    /// The window.
    pub window: Window,
    /// The result.
    pub value: V,
}

/// How windows are assigned (internal: what the assigners turn into).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spec {
    /// Fixed-size windows every `slide` (tumbling: `slide == size`).
    Aligned {
        /// Window length in ms.
        size: i64,
        /// Distance between window starts in ms.
        slide: i64,
        /// Shift of window starts in ms, in `0..slide`.
        offset: i64,
    },
    /// Merging windows, `gap` of inactivity apart.
    Session {
        /// The gap in ms.
        gap: i64,
    },
}

impl Spec {
    pub(crate) fn validate(&self) -> std::result::Result<(), String> {
        match *self {
            Spec::Aligned { size, slide, .. } if size <= 0 || slide <= 0 => {
                Err(format!("window size ({size} ms) and slide ({slide} ms) must be at least 1 ms"))
            }
            Spec::Session { gap } if gap <= 0 => Err(format!("a session gap ({gap} ms) must be at least 1 ms")),
            _ => Ok(()),
        }
    }

    pub(crate) fn describe(&self) -> String {
        match *self {
            Spec::Aligned { size, slide, offset } if size == slide => {
                format!("tumbling {size} ms{}", if offset != 0 { format!(" + {offset} ms") } else { String::new() })
            }
            Spec::Aligned { size, slide, offset } => format!(
                "sliding {size} ms every {slide} ms{}",
                if offset != 0 { format!(" + {offset} ms") } else { String::new() }
            ),
            Spec::Session { gap } => format!("session gap {gap} ms"),
        }
    }
}

/// The fixed-size windows of the latest timestamp, reused while records'
/// timestamps stay in exactly the same windows.
#[derive(Debug, Default)]
pub(crate) struct AlignedCache {
    windows: Vec<Window>,
    /// The timestamps that lie in exactly `windows`.
    range: Option<(Timestamp, Timestamp)>,
}

impl AlignedCache {
    /// The windows of `ts`, latest first.
    #[inline]
    pub(crate) fn assign(&mut self, ts: Timestamp, size: i64, slide: i64, offset: i64) -> &[Window] {
        if !self.range.is_some_and(|(lo, hi)| ts >= lo && ts < hi) {
            aligned_windows(ts, size, slide, offset, &mut self.windows);
            // From the end of the next older window (or the latest start)
            // up to the first end or the next start, whichever comes first.
            self.range = match (self.windows.iter().map(|w| w.start).min(), self.windows.first()) {
                (Some(earliest), Some(latest)) => {
                    let lo = latest.start.max(earliest.saturating_sub(slide).saturating_add(size));
                    let hi =
                        self.windows.iter().map(|w| w.end).min().unwrap_or(lo).min(latest.start.saturating_add(slide));
                    (lo <= ts && ts < hi).then_some((lo, hi))
                }
                _ => None,
            };
        }
        &self.windows
    }
}

/// Fills `out` with the aligned windows that contain `ts`, latest first.
pub(crate) fn aligned_windows(ts: Timestamp, size: i64, slide: i64, offset: i64, out: &mut Vec<Window>) {
    out.clear();
    let Some(from_offset) = ts.checked_sub(offset) else { return };
    let Some(mut start) = ts.checked_sub(from_offset.rem_euclid(slide)) else { return };
    loop {
        match start.checked_add(size) {
            Some(end) if end > ts => out.push(Window { start, end }),
            Some(_) => break,
            None => {}
        }
        match start.checked_sub(slide) {
            Some(s) => start = s,
            None => break,
        }
    }
}

mod aligned;
mod assigners;
mod common;
mod contents;
mod functions;
mod session;

use self::aligned::{AlignedWindowOp, Fired};
pub use self::assigners::{Session, Sliding, Tumbling, WindowAssigner};
use self::common::Common;
use self::session::SessionWindowOp;

pub use self::contents::Elements;
pub(crate) use self::contents::Sessions;
pub(crate) use self::functions::{AggregateFn, CoGroupFn, ProcessFn, ReduceFn, WindowFn};
pub use self::functions::{Count, WindowContext};

/// The factory of a window operator applying `func` to the windows of
/// `spec`, keeping windows `lateness` ms past their end; late records go
/// to the second output once `late_enabled` is set.
pub(crate) fn window<K: Key, T: Data, W: WindowFn<K, T>>(
    func: W,
    spec: Spec,
    lateness: i64,
    late_enabled: Arc<AtomicBool>,
) -> Arc<dyn KeyedFactory> {
    Arc::new(WindowFactory { func: Arc::new(func), spec, lateness: lateness.max(0), late_enabled, _t: PhantomData })
}

/// Makes the instances of a window operator: aligned windows (tumbling,
/// sliding) or sessions, by its spec, applying `func`.
struct WindowFactory<K, T, W> {
    func: Arc<W>,
    spec: Spec,
    /// Allowed lateness, in milliseconds (0: none).
    lateness: i64,
    /// Whether late records go to the operator's second port (set when
    /// the user asks for them, before the job is built).
    late_enabled: Arc<AtomicBool>,
    _t: PhantomData<fn(K, T)>,
}

impl<K: Key, T: Data, W: WindowFn<K, T>> KeyedFactory for WindowFactory<K, T, W> {
    fn instantiate(&self, ctx: &OperatorContext<'_>, mut outs: Vec<AnyConsumer>) -> Result<Box<dyn InputOperator>> {
        let info = ctx.info.clone();
        let groups = ctx.key_groups.clone();
        let late_out = outs.pop().ok_or_else(|| crate::error::internal_error!("window without late port"))?;
        let out = outs.pop().ok_or_else(|| crate::error::internal_error!("window without result port"))?;
        let next = typed::<W::Out>(out, &info.name)?;
        let late_next = typed::<T>(late_out, &info.name)?;
        let operator = info.name.to_string();
        let scope = |state: &str| StateScope {
            job: ctx.job.to_string(),
            operator: operator.clone(),
            state: state.to_string(),
            key_groups: groups.clone(),
            max_key_groups: ctx.max_key_groups,
        };
        let common = Common {
            func: self.func.clone(),
            lateness: self.lateness,
            fire: TimerState::open(ctx.state, &scope("fire-timers"))?,
            cleanup: TimerState::open(ctx.state, &scope("cleanup-timers"))?,
            watermark: crate::record::NO_TIMESTAMP,
            out: Batch::with_capacity(ctx.batch_size),
            batch_size: ctx.batch_size.max(1),
            late: Batch::with_capacity(16),
            late_enabled: self.late_enabled.load(Ordering::Relaxed),
            next,
            late_next,
            key_buf: Vec::with_capacity(32),
            records: Vec::with_capacity(ctx.batch_size),
            info,
        };
        Ok(match self.spec {
            Spec::Aligned { size, slide, offset } => Box::new(AlignedWindowOp {
                state: WindowState::open(ctx.state, &scope("windows"))?,
                size,
                slide,
                offset,
                windows: AlignedCache::default(),
                quiet_below: Timestamp::MIN,
                // Without lateness a window is dropped when it fires:
                // nothing that fired is kept to fire again.
                fired: if self.lateness > 0 {
                    Some(Fired::new(ValueStore::open(ctx.state, &scope("fired"))?, groups.clone()))
                } else {
                    None
                },
                common,
            }) as Box<dyn InputOperator>,
            Spec::Session { gap } => {
                Box::new(SessionWindowOp { state: ValueStore::open(ctx.state, &scope("sessions"))?, gap, common })
            }
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn windows(ts: i64, size: i64, slide: i64, offset: i64) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        aligned_windows(ts, size, slide, offset, &mut out);
        out.into_iter().map(|w| (w.start, w.end)).collect()
    }

    #[test]
    fn aligned_assignment_matches_the_formulas() {
        assert_eq!(windows(0, 1000, 1000, 0), vec![(0, 1000)]);
        assert_eq!(windows(999, 1000, 1000, 0), vec![(0, 1000)]);
        assert_eq!(windows(-1, 1000, 1000, 0), vec![(-1000, 0)]);
        assert_eq!(windows(1500, 1000, 1000, 200), vec![(1200, 2200)]);
        assert_eq!(windows(7, 10, 5, 0), vec![(5, 15), (0, 10)]);
        assert_eq!(windows(-3, 10, 5, 0), vec![(-5, 5), (-10, 0)]);
        assert_eq!(windows(7, 2, 5, 0), vec![], "in the gap between windows of 2 every 5");
        assert_eq!(windows(i64::MIN + 1, 10, 5, 0).len(), 0, "no overflow at the edge of time");
    }

    #[test]
    fn elements_and_sessions_round_trip_and_refuse_garbage() {
        let e = Elements(vec!["a".to_string(), String::new(), "ccc".to_string()]);
        let mut bytes = Vec::new();
        e.encode(&mut bytes).unwrap();
        assert_eq!(Elements::<String>::decode(&bytes).unwrap(), e);
        assert!(Elements::<String>::decode(&bytes[..bytes.len() - 1]).is_err());
        let s = Sessions(vec![(Window { start: -5, end: 10 }, 3u64), (Window { start: 20, end: 30 }, 1)]);
        let mut bytes = Vec::new();
        s.encode(&mut bytes).unwrap();
        assert_eq!(Sessions::<u64>::decode(&bytes).unwrap(), s);
        assert!(Sessions::<u64>::decode(&bytes[..5]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn the_window_cache_always_agrees_with_the_formula(
            steps in proptest::collection::vec(-30i64..30, 1..200),
            (size, slide) in proptest::sample::select(vec![(10i64, 10i64), (20, 5), (10, 4), (6, 15), (7, 3), (1, 1)]),
            offset in 0i64..20,
        ) {
            let offset = offset % slide;
            let mut cache = AlignedCache::default();
            let mut ts = -40;
            for step in steps {
                ts += step;
                let mut want = Vec::new();
                aligned_windows(ts, size, slide, offset, &mut want);
                proptest::prop_assert_eq!(cache.assign(ts, size, slide, offset), &want[..], "ts {}", ts);
            }
        }
    }

    #[test]
    fn windows_touching_intersect() {
        let a = Window { start: 0, end: 10 };
        assert!(a.intersects(&Window { start: 10, end: 20 }));
        assert!(!a.intersects(&Window { start: 11, end: 20 }));
    }
}
