//! Window assigners: which windows a record belongs to.

use super::*;

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Tumbling {}
    impl Sealed for super::Sliding {}
    impl Sealed for super::Session {}
}

/// Something that assigns records to windows: [`Tumbling`], [`Sliding`] or
/// [`Session`].
pub trait WindowAssigner: sealed::Sealed {
    #[doc(hidden)]
    fn spec(&self) -> Spec;
}

/// Fixed-size, non-overlapping windows.
#[derive(Clone, Copy, Debug)]
pub struct Tumbling {
    pub(super) size: Duration,
    pub(super) offset: Duration,
}

impl Tumbling {
    /// Windows of `size`, starting at multiples of `size` since the epoch.
    pub fn of(size: Duration) -> Self {
        Self { size, offset: Duration::ZERO }
    }

    /// Shifts window starts by `offset` (for example, daily windows that
    /// start at 06:00).
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
#[derive(Clone, Copy, Debug)]
pub struct Sliding {
    pub(super) size: Duration,
    pub(super) slide: Duration,
    pub(super) offset: Duration,
}

impl Sliding {
    /// Windows of `size` starting every `slide`.
    pub fn of(size: Duration, slide: Duration) -> Self {
        Self { size, slide, offset: Duration::ZERO }
    }

    /// Shifts window starts by `offset`.
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
#[derive(Clone, Copy, Debug)]
pub struct Session {
    pub(super) gap: Duration,
}

impl Session {
    /// Sessions that end `gap` after their last record.
    pub fn with_gap(gap: Duration) -> Self {
        Self { gap }
    }
}

impl WindowAssigner for Session {
    fn spec(&self) -> Spec {
        Spec::Session { gap: millis(self.gap) }
    }
}
