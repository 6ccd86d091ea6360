//! Watermarks inside the runtime: the per-input tracker of a channel head.

use crate::record::{END_OF_TIME, Meta, NO_TIMESTAMP, Timestamp};

#[derive(Clone, Copy, Debug)]
struct InputClock {
    watermark: Timestamp,
    idle: bool,
}

/// The watermark of an operator instance: the minimum over its inputs'
/// watermarks, leaving out inputs marked idle; when every input is idle,
/// the maximum over all of them (as Flink does: nothing is coming, so
/// nothing holds the watermark back). It only moves forward.
#[derive(Debug)]
pub(crate) struct WatermarkTracker {
    inputs: Vec<InputClock>,
    current: Timestamp,
    /// How many inputs are marked idle now.
    idle: u64,
    /// The active input whose watermark was the least at the last
    /// `recompute`, or `usize::MAX` when none is known (every input
    /// idle, or one woke since).
    holder: usize,
    /// The least watermark of the other active inputs then (`END_OF_TIME`
    /// when there are none). Watermarks only rise, so while no input
    /// wakes it stays a lower bound for them: the holder advancing to no
    /// more than it is still the least, and the operator's watermark is
    /// its own, without a scan (per record at two inputs and more).
    others: Timestamp,
}

impl WatermarkTracker {
    pub(crate) fn new(inputs: usize) -> Self {
        Self {
            inputs: vec![InputClock { watermark: NO_TIMESTAMP, idle: false }; inputs],
            current: NO_TIMESTAMP,
            idle: 0,
            holder: usize::MAX,
            others: END_OF_TIME,
        }
    }

    /// The operator's watermark now.
    #[inline]
    pub(crate) fn current(&self) -> Timestamp {
        self.current
    }

    /// Input `input` reached `watermark` (and is active). Returns the
    /// operator's new watermark if it advanced.
    #[inline]
    pub(crate) fn advance(&mut self, input: usize, watermark: Timestamp) -> Option<Timestamp> {
        let clock = self.inputs.get_mut(input)?;
        let woke = std::mem::replace(&mut clock.idle, false);
        self.idle -= u64::from(woke);
        if woke {
            // It may hold the others back now: `others` no longer bounds them.
            self.holder = usize::MAX;
        }
        if watermark <= clock.watermark {
            // Waking alone can only lower the minimum, and the watermark
            // never moves back; but a woken input may be the only active
            // one, whose watermark is already ahead.
            return if woke { self.recompute() } else { None };
        }
        let before = std::mem::replace(&mut clock.watermark, watermark);
        // The operator's watermark is never below the least active
        // input's (every change that could raise that one recomputes it;
        // when all are idle it is the greatest of them). So an input that
        // was ahead of it is not the one holding it back, idle or not: it
        // stays. This, the one-input case and the holder staying the least
        // (see `others`) skip the scan over the inputs, which is per record
        // (records carry their watermark).
        if before > self.current {
            return None;
        }
        if self.inputs.len() == 1 || (input == self.holder && watermark <= self.others) {
            return (watermark > self.current).then(|| {
                self.current = watermark;
                watermark
            });
        }
        self.recompute()
    }

    /// Input `input` has records again, without a new watermark.
    #[inline]
    pub(crate) fn activate(&mut self, input: usize) {
        if let Some(clock) = self.inputs.get_mut(input)
            && std::mem::replace(&mut clock.idle, false)
        {
            self.idle -= 1;
            self.holder = usize::MAX;
        }
    }

    /// Input `input` went idle: it no longer holds the watermark back.
    pub(crate) fn idle(&mut self, input: usize) -> Option<Timestamp> {
        let clock = self.inputs.get_mut(input)?;
        self.idle += u64::from(!std::mem::replace(&mut clock.idle, true));
        self.recompute()
    }

    /// How many inputs are marked idle now.
    #[inline]
    pub(crate) fn idle_inputs(&self) -> u64 {
        self.idle
    }

    fn recompute(&mut self) -> Option<Timestamp> {
        // The least active watermark, its input, and the least of the others.
        let (mut holder, mut least, mut others) = (usize::MAX, END_OF_TIME, END_OF_TIME);
        for (i, c) in self.inputs.iter().enumerate() {
            if c.idle {
                continue;
            }
            if holder == usize::MAX || c.watermark < least {
                others = others.min(least);
                (holder, least) = (i, c.watermark);
            } else {
                others = others.min(c.watermark);
            }
        }
        (self.holder, self.others) = (holder, others);
        let min = if holder == usize::MAX { self.inputs.iter().map(|c| c.watermark).max()? } else { least };
        (min > self.current).then(|| {
            self.current = min;
            min
        })
    }
}

/// What a keyed operator sees of time while it reads one batch from one
/// input: it observes each record's watermark before processing the record.
#[derive(Debug)]
pub(crate) struct InputTime<'a> {
    pub(crate) tracker: &'a mut WatermarkTracker,
    pub(crate) input: usize,
}

impl InputTime<'_> {
    /// Takes in the watermark `meta` was read under; returns the
    /// operator's new watermark if it advanced (fire timers up to it before
    /// processing the record).
    #[inline]
    pub(crate) fn observe(&mut self, meta: &Meta) -> Option<Timestamp> {
        self.tracker.advance(self.input, meta.watermark)
    }

    /// The operator's watermark now.
    #[inline]
    pub(crate) fn current(&self) -> Timestamp {
        self.tracker.current()
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn the_watermark_is_the_minimum_of_active_inputs_and_never_goes_back() {
        let mut t = WatermarkTracker::new(3);
        assert_eq!(t.advance(0, 10), None, "inputs 1 and 2 know nothing yet");
        assert_eq!(t.advance(1, 5), None);
        assert_eq!(t.advance(2, 7), Some(5));
        assert_eq!(t.advance(1, 20), Some(7));
        assert_eq!(t.idle(2), Some(10), "an idle input stops holding the watermark back");
        assert_eq!(t.idle_inputs(), 1);
        assert_eq!(t.advance(2, 8), None, "a woken input below the watermark does not move it back");
        assert_eq!(t.idle_inputs(), 0);
        assert_eq!(t.current(), 10);
        assert_eq!(t.advance(0, 30), None, "input 2 (at 8) holds it again");
        assert_eq!(t.advance(2, 25), Some(20));
        assert_eq!(t.idle(0), None);
        assert_eq!(t.idle(1), Some(25));
        assert_eq!(t.idle(2), Some(30), "all idle: the largest watermark of any input");
        assert_eq!(t.idle(2), None, "idle twice counts once");
        assert_eq!(t.idle_inputs(), 3);
        assert_eq!(t.advance(1, 28), None, "input 1 wakes below the watermark: it stays");
        assert_eq!(
            t.advance(1, i64::MAX),
            Some(i64::MAX),
            "input 1 ended while the others are idle: as in Flink, nothing holds the watermark back"
        );
        t.activate(0);
        assert_eq!(t.idle_inputs(), 1, "inputs 0 and 1 woke");
    }

    /// The definition, recomputed from scratch after every step.
    #[derive(Clone)]
    struct Model {
        inputs: Vec<(Timestamp, bool)>,
        current: Timestamp,
    }

    impl Model {
        fn settle(&mut self) -> Option<Timestamp> {
            let active = self.inputs.iter().filter(|(_, idle)| !idle).map(|(w, _)| *w).min();
            let min = active.or_else(|| self.inputs.iter().map(|(w, _)| *w).max())?;
            (min > self.current).then(|| {
                self.current = min;
                min
            })
        }
    }

    proptest::proptest! {
        /// The shortcuts in `advance` (an input that was ahead, a single
        /// input, the least input rising no further than the others, which
        /// an input waking undoes) give what the definition gives, step by
        /// step.
        #[test]
        fn the_tracker_agrees_with_its_definition(
            inputs in 1usize..4,
            steps in proptest::collection::vec((0usize..4, 0u8..4, -5i64..40), 0..200),
        ) {
            let mut t = WatermarkTracker::new(inputs);
            let mut m = Model { inputs: vec![(NO_TIMESTAMP, false); inputs], current: NO_TIMESTAMP };
            for (i, (input, op, wm)) in steps.into_iter().enumerate() {
                let input = input % inputs;
                let (got, want) = match op {
                    0 | 1 => {
                        let clock = &mut m.inputs[input];
                        let woke = std::mem::replace(&mut clock.1, false);
                        clock.0 = clock.0.max(wm);
                        let want = if woke || clock.0 == wm { m.settle() } else { None };
                        (t.advance(input, wm), want)
                    }
                    2 => {
                        m.inputs[input].1 = true;
                        (t.idle(input), m.settle())
                    }
                    _ => {
                        m.inputs[input].1 = false;
                        t.activate(input);
                        (None, None)
                    }
                };
                proptest::prop_assert_eq!(got, want, "step {}", i);
                proptest::prop_assert_eq!(t.current(), m.current, "step {}", i);
            }
        }
    }
}
