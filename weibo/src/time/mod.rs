//! Event time: timestamps and watermark strategies.
//!
//! [`Stream::with_timestamps`](crate::Stream::with_timestamps) gives every
//! record an event time and makes each parallel instance of the stream
//! (each source partition, when applied right after a source) generate
//! watermarks. A watermark `w` says: no record with a timestamp at or below
//! `w` is expected any more.
//!
//! Semantics (the same as Apache Flink's):
//! - bounded out-of-orderness `b`: the watermark is
//!   `max_timestamp_seen - b - 1`, emitted after the record that raised it,
//!   so each record is judged under the watermark of the records before it;
//! - monotonous: `b = 0`;
//! - idleness `d`: a partition that produced no record for `d` of
//!   processing time is marked idle and no longer holds back the watermark
//!   of the operators downstream, until it produces again;
//! - an operator's watermark is the minimum over its inputs' (idle inputs
//!   left out), and it never moves back;
//! - the end of input is watermark `+∞`: every window fires.

pub(crate) mod alignment;
pub(crate) mod clock;
pub(crate) mod watermarks;

use std::time::Duration;

use crate::record::Timestamp;

/// Milliseconds of a duration, as a timestamp difference.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// How a stream's watermarks follow its timestamps.
///
/// ```
/// use std::time::Duration;
/// use weibo::time::WatermarkStrategy;
///
/// let strategy = WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(5))
///     .with_idleness(Duration::from_secs(30));
/// # let _ = strategy;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatermarkStrategy {
    bound: i64,
    pub(crate) idleness: Option<Duration>,
}

impl WatermarkStrategy {
    /// Timestamps never decrease: the watermark is the largest timestamp
    /// seen minus one millisecond.
    ///
    /// ```
    /// let out = weibo::testing::run(vec![(10i64, 'a'), (20, 'b')], |s| {
    ///     s.with_timestamps(|r: &(i64, char)| r.0, weibo::time::WatermarkStrategy::monotonous()).map(|r| r.1)
    /// })?;
    /// assert_eq!(out, vec!['a', 'b']);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn monotonous() -> Self {
        Self { bound: 0, idleness: None }
    }

    /// Records may arrive up to `bound` late: the watermark is the largest
    /// timestamp seen minus `bound` minus one millisecond.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::window::{Count, Tumbling};
    /// use weibo::time::WatermarkStrategy;
    /// // Records up to 500 ms out of order still count in their window.
    /// let out = weibo::testing::run(vec![(900i64, 'a'), (1_200, 'a'), (800, 'a')], |s| {
    ///     s.with_timestamps(|r: &(i64, char)| r.0, WatermarkStrategy::bounded_out_of_orderness(Duration::from_millis(500)))
    ///         .key_by(|r: &(i64, char)| r.1)
    ///         .window(Tumbling::of(Duration::from_secs(1)))
    ///         .aggregate(Count)
    ///         .into_stream()
    /// })?;
    /// assert_eq!(out[0].value, 2, "the record at 800 came late but within the bound");
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn bounded_out_of_orderness(bound: Duration) -> Self {
        Self { bound: millis(bound), idleness: None }
    }

    /// Marks the stream idle after `timeout` without records (processing
    /// time), so that it stops holding back watermarks downstream.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::time::WatermarkStrategy;
    /// // A partition quiet for 10 s stops holding the watermark back.
    /// let strategy = WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(1)).with_idleness(Duration::from_secs(10));
    /// let job = weibo::Job::new("idle");
    /// job.source(weibo::sources::IterSource::new(vec![1i64]))
    ///     .with_timestamps(|t: &i64| *t, strategy)
    ///     .sink(weibo::sinks::Blackhole::new());
    /// assert!(job.to_string().contains("idle"));
    /// ```
    #[must_use]
    pub fn with_idleness(mut self, timeout: Duration) -> Self {
        self.idleness = Some(timeout);
        self
    }

    /// How the graph shows it.
    pub(crate) fn describe(&self) -> String {
        let base =
            if self.bound == 0 { "monotonous".to_string() } else { format!("out of order by {} ms", self.bound) };
        match self.idleness {
            Some(d) => format!("{base}, idle after {} ms", millis(d)),
            None => base,
        }
    }

    /// The watermark after seeing `max_timestamp`.
    #[inline]
    pub(crate) fn watermark_for(&self, max_timestamp: Timestamp) -> Timestamp {
        max_timestamp.saturating_sub(self.bound).saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermarks_follow_the_documented_formula() {
        let m = WatermarkStrategy::monotonous();
        assert_eq!(m.watermark_for(1000), 999);
        let b = WatermarkStrategy::bounded_out_of_orderness(Duration::from_millis(250));
        assert_eq!(b.watermark_for(1000), 749);
        assert_eq!(b.watermark_for(i64::MIN + 3), i64::MIN, "saturates instead of wrapping");
    }
}
