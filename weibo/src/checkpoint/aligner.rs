//! Barrier alignment, on its own so that it can be tested on its own: the
//! channel head asks it which inputs it may read.

use std::time::{Duration, Instant};

use crate::record::CheckpointId;

/// Barrier alignment of a task with several inputs: an input that
/// delivered barrier `n` is held (not read) until every input that is
/// still open has delivered it too; then the task snapshots and passes
/// `n` on, and every input is read again. An input closes only after its
/// sender has passed every barrier (sources stay until the final
/// checkpoint), so a closed input counts as having delivered it.
#[derive(Clone, Debug)]
pub(crate) struct Aligner {
    /// The barrier being aligned, and when its first input delivered it.
    aligning: Option<(CheckpointId, Instant)>,
    held: Vec<bool>,
    closed: Vec<bool>,
}

impl Aligner {
    pub(crate) fn new(inputs: usize) -> Self {
        Self { aligning: None, held: vec![false; inputs], closed: vec![false; inputs] }
    }

    /// Whether input `i` is held: it delivered the barrier being aligned.
    pub(crate) fn holds(&self, i: usize) -> bool {
        self.held.get(i).copied().unwrap_or(false)
    }

    /// Input `i` delivered barrier `n`.
    ///
    /// # Errors
    /// A description of the protocol violation: a held input delivering
    /// again, or a barrier other than the one being aligned.
    pub(crate) fn barrier(&mut self, i: usize, n: CheckpointId) -> std::result::Result<(), String> {
        match self.aligning {
            Some((b, _)) if b != n => {
                return Err(format!("input {i} delivered barrier {n} while barrier {b} was being aligned"));
            }
            Some(_) if self.holds(i) => return Err(format!("input {i} delivered barrier {n} twice")),
            Some(_) => {}
            None => self.aligning = Some((n, Instant::now())),
        }
        if let Some(h) = self.held.get_mut(i) {
            *h = true;
        }
        Ok(())
    }

    /// Input `i` closed.
    pub(crate) fn closed(&mut self, i: usize) {
        if let Some(c) = self.closed.get_mut(i) {
            *c = true;
        }
    }

    /// The barrier every open input has delivered, if one has.
    pub(crate) fn aligned(&self) -> Option<CheckpointId> {
        let (b, _) = self.aligning?;
        self.held.iter().zip(&self.closed).all(|(h, c)| *h || *c).then_some(b)
    }

    /// How long the barrier being aligned has been aligning (since its
    /// first input delivered it).
    pub(crate) fn took(&self) -> Option<Duration> {
        self.aligning.map(|(_, t)| t.elapsed())
    }

    /// The aligned barrier was passed on: read every input again.
    pub(crate) fn release(&mut self) {
        self.aligning = None;
        self.held.iter_mut().for_each(|h| *h = false);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::Aligner;
    use crate::record::CheckpointId;

    /// Every interleaving of barriers `1..=2` and data over up to three
    /// inputs (each input delivering its data, barrier 1, data, barrier 2,
    /// then maybe closing): an input that delivered barrier `n` is never
    /// read before every open input has delivered `n`, every barrier is
    /// aligned exactly once, in order, and only after all inputs
    /// delivered it or closed.
    #[test]
    fn alignment_never_reads_past_a_barrier_in_any_interleaving() {
        #[derive(Clone, Copy, Debug, PartialEq)]
        enum Step {
            Data,
            Barrier(u64),
            Close,
        }
        // Walks every interleaving by depth-first search over which
        // readable (not held) input goes next, as the channel head reads.
        fn walk(scripts: &[Vec<Step>], pos: &mut [usize], aligner: &Aligner, passed: &mut Vec<u64>, leaves: &mut u64) {
            if let Some(b) = aligner.aligned().map(CheckpointId::get) {
                for (i, s) in scripts.iter().enumerate() {
                    let read = &s[..pos[i]];
                    assert!(
                        read.contains(&Step::Barrier(b)) || read.contains(&Step::Close),
                        "barrier {b} aligned before input {i} delivered it"
                    );
                }
                passed.push(b);
                assert_eq!(*passed, (1..=b).collect::<Vec<_>>(), "barriers pass once each, in order");
                let mut next = aligner.clone();
                next.release();
                walk(scripts, pos, &next, passed, leaves);
                passed.pop();
                return;
            }
            let mut moved = false;
            for i in 0..scripts.len() {
                if aligner.holds(i) || pos[i] >= scripts[i].len() {
                    continue;
                }
                moved = true;
                let mut next = aligner.clone();
                match scripts[i][pos[i]] {
                    Step::Data => {}
                    // Fails if a held input was read: it would deliver
                    // barrier 2 while barrier 1 aligns.
                    Step::Barrier(b) => next.barrier(i, CheckpointId::new(b)).unwrap(),
                    Step::Close => next.closed(i),
                }
                pos[i] += 1;
                walk(scripts, pos, &next, passed, leaves);
                pos[i] -= 1;
            }
            if !moved {
                *leaves += 1;
                // Every barrier some input delivered was aligned.
                let mut want: Vec<u64> = scripts
                    .iter()
                    .flatten()
                    .filter_map(|s| if let Step::Barrier(b) = s { Some(*b) } else { None })
                    .collect();
                want.sort_unstable();
                want.dedup();
                assert_eq!(*passed, want, "{aligner:?} at {pos:?}");
            }
        }
        // An input closes after `close` of its steps (or never): before
        // barrier 1, between the barriers, or after both.
        fn script(close: Option<usize>) -> Vec<Step> {
            let mut s = vec![Step::Data, Step::Barrier(1), Step::Data, Step::Barrier(2)];
            if let Some(at) = close {
                s.truncate(at);
                s.push(Step::Close);
            }
            s
        }
        for inputs in 1..=3usize {
            let choices = [None, Some(1), Some(3), Some(4)];
            for combo in 0..choices.len().pow(inputs as u32) {
                let scripts: Vec<Vec<Step>> =
                    (0..inputs).map(|i| script(choices[combo / choices.len().pow(i as u32) % choices.len()])).collect();
                let mut pos = vec![0; inputs];
                let mut leaves = 0;
                walk(&scripts, &mut pos, &Aligner::new(inputs), &mut Vec::new(), &mut leaves);
                assert!(leaves > 0);
            }
        }
    }

    #[test]
    fn alignment_refuses_a_barrier_out_of_turn() {
        let mut a = Aligner::new(2);
        a.barrier(0, CheckpointId::new(5)).unwrap();
        assert!(a.barrier(0, CheckpointId::new(5)).is_err(), "twice on one input");
        assert!(a.barrier(1, CheckpointId::new(6)).is_err(), "another barrier while 5 aligns");
        a.barrier(1, CheckpointId::new(5)).unwrap();
        assert_eq!(a.aligned(), Some(CheckpointId::new(5)));
        a.release();
        assert_eq!(a.aligned(), None);
        a.closed(1);
        a.barrier(0, CheckpointId::new(6)).unwrap();
        assert_eq!(a.aligned(), Some(CheckpointId::new(6)), "a closed input counts as delivered");
    }
}
