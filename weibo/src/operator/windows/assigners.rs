//! Window assigners: which windows a record belongs to.

use std::time::Duration;

use super::Spec;
use crate::time::millis;

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Tumbling {}
    impl Sealed for super::Sliding {}
    impl Sealed for super::Session {}
}

/// Something that assigns records to windows: [`Tumbling`], [`Sliding`] or
/// [`Session`].
///
/// ```
/// use std::time::Duration;
/// use weibo::window::{Count, Session, Sliding, Tumbling, WindowAssigner};
/// fn counts<W: WindowAssigner>(assigner: W) -> Vec<u64> {
///     let input = vec![(0, 'a'), (400, 'a'), (2_000, 'a')];
///     weibo::testing::run_timed(input, |s| s.key_by(|c: &char| *c).window(assigner).aggregate(Count).into_stream())
///         .unwrap()
///         .into_iter()
///         .map(|r| r.value)
///         .collect()
/// }
/// assert_eq!(counts(Tumbling::of(Duration::from_secs(1))), vec![2, 1]);
/// assert_eq!(counts(Sliding::of(Duration::from_secs(1), Duration::from_millis(500))), vec![2, 2, 1, 1]);
/// assert_eq!(counts(Session::with_gap(Duration::from_secs(1))), vec![2, 1]);
/// ```
pub trait WindowAssigner: sealed::Sealed {
    #[doc(hidden)]
    fn spec(&self) -> Spec;
}

/// Fixed-size, non-overlapping windows.
///
/// ```
/// use std::time::Duration;
/// use weibo::window::{Count, Tumbling};
/// let input = vec![(100, 1u32), (900, 2), (1_100, 3)];
/// let out = weibo::testing::run_timed(input, |s| {
///     s.key_by(|_: &u32| 0u8).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count).into_stream()
/// })?;
/// let windows: Vec<(i64, i64, u64)> = out.iter().map(|r| (r.window.start, r.window.end, r.value)).collect();
/// assert_eq!(windows, vec![(0, 1_000, 2), (1_000, 2_000, 1)]);
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Tumbling {
    pub(super) size: Duration,
    pub(super) offset: Duration,
}

impl Tumbling {
    /// Windows of `size`, starting at multiples of `size` since the epoch.
    ///
    /// ```
    /// use std::time::Duration;
    /// let hourly = weibo::window::Tumbling::of(Duration::from_secs(3600));
    /// # let _ = hourly;
    /// ```
    pub fn of(size: Duration) -> Self {
        Self { size, offset: Duration::ZERO }
    }

    /// Shifts window starts by `offset` (for example, daily windows that
    /// start at 06:00).
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::{Count, Tumbling};
    /// // Windows of 1 s that start at 250 ms past each second.
    /// let shifted = Tumbling::of(Duration::from_secs(1)).with_offset(Duration::from_millis(250));
    /// let out = weibo::testing::run_timed(vec![(200, 1u8), (300, 1)], |s| {
    ///     s.key_by(|_: &u8| 0u8).window(shifted).aggregate(Count).into_stream()
    /// })?;
    /// assert_eq!(out.iter().map(|r| r.window.start).collect::<Vec<_>>(), vec![-750, 250]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    #[must_use]
    pub fn with_offset(mut self, offset: Duration) -> Self {
        self.offset = offset;
        self
    }
}

impl WindowAssigner for Tumbling {
    fn spec(&self) -> Spec {
        let size = millis(self.size);
        Spec::Aligned { size, slide: size, offset: if size > 0 { millis(self.offset).rem_euclid(size) } else { 0 } }
    }
}

/// Fixed-size windows that start every `slide`: a record is in
/// `size / slide` of them.
///
/// ```
/// use std::time::Duration;
/// use weibo::window::{Count, Sliding};
/// // 1 s windows every 500 ms: each record is in two of them.
/// let out = weibo::testing::run_timed(vec![(600, 'x')], |s| {
///     s.key_by(|c: &char| *c).window(Sliding::of(Duration::from_secs(1), Duration::from_millis(500))).aggregate(Count).into_stream()
/// })?;
/// assert_eq!(out.iter().map(|r| r.window.start).collect::<Vec<_>>(), vec![0, 500]);
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Sliding {
    pub(super) size: Duration,
    pub(super) slide: Duration,
    pub(super) offset: Duration,
}

impl Sliding {
    /// Windows of `size` starting every `slide`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let last_minute_every_10s = weibo::window::Sliding::of(Duration::from_secs(60), Duration::from_secs(10));
    /// # let _ = last_minute_every_10s;
    /// ```
    pub fn of(size: Duration, slide: Duration) -> Self {
        Self { size, slide, offset: Duration::ZERO }
    }

    /// Shifts window starts by `offset`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::Sliding;
    /// let shifted = Sliding::of(Duration::from_secs(2), Duration::from_secs(1)).with_offset(Duration::from_millis(100));
    /// # let _ = shifted;
    /// ```
    #[must_use]
    pub fn with_offset(mut self, offset: Duration) -> Self {
        self.offset = offset;
        self
    }
}

impl WindowAssigner for Sliding {
    fn spec(&self) -> Spec {
        let slide = millis(self.slide);
        Spec::Aligned {
            size: millis(self.size),
            slide,
            offset: if slide > 0 { millis(self.offset).rem_euclid(slide) } else { 0 },
        }
    }
}

/// Per-key windows that close after a gap of inactivity, merging as
/// records bridge them.
///
/// ```
/// use std::time::Duration;
/// use weibo::window::{Count, Session};
/// // Clicks 0.5 s apart are one session; after 3 s of quiet, another starts.
/// let clicks = vec![(0, "ann".to_string()), (500, "ann".to_string()), (3_600, "ann".to_string())];
/// let out = weibo::testing::run_timed(clicks, |s| {
///     s.key_by(|u: &String| u.clone()).window(Session::with_gap(Duration::from_secs(1))).aggregate(Count).into_stream()
/// })?;
/// let sessions: Vec<(i64, i64, u64)> = out.iter().map(|r| (r.window.start, r.window.end, r.value)).collect();
/// assert_eq!(sessions, vec![(0, 1_500, 2), (3_600, 4_600, 1)]);
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Session {
    pub(super) gap: Duration,
}

impl Session {
    /// Sessions that end `gap` after their last record.
    ///
    /// ```
    /// use std::time::Duration;
    /// let five_minutes_of_quiet = weibo::window::Session::with_gap(Duration::from_secs(300));
    /// # let _ = five_minutes_of_quiet;
    /// ```
    pub fn with_gap(gap: Duration) -> Self {
        Self { gap }
    }
}

impl WindowAssigner for Session {
    fn spec(&self) -> Spec {
        Spec::Session { gap: millis(self.gap) }
    }
}
