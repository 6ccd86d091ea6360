//! What an operator does with a record its function fails on: the
//! failure policies, dead letters, and the [`Failures`] every failing
//! operator shares.

use std::fmt::Display;

use serde::{Deserialize, Serialize};

use super::{AnyConsumer, Consumer, OpInfo};
use crate::error::{Error, Result};
use crate::metrics::OperatorCounters;
use crate::record::CheckpointId;
use crate::record::SourcePosition;
use crate::record::{Batch, Meta, Timestamp};

/// The two outputs of a function under `policy`, `outs`: its results, and
/// its dead letters (of `I`s) when the policy sends failures there.
pub(crate) type ResultsAndDead<U, I> = (Box<dyn Consumer<U>>, Option<Box<dyn Consumer<DeadLetter<I>>>>);

/// Opens [`ResultsAndDead`] from `outs` for operator `operator`.
pub(crate) fn results_and_dead<U: 'static, I: 'static>(
    outs: Vec<AnyConsumer>,
    policy: Policy,
    operator: &str,
) -> Result<ResultsAndDead<U, I>> {
    let (ok, dead) = super::factory::two(outs, operator)?;
    let next = super::typed::<U>(ok, operator)?;
    let dead = match policy {
        Policy::DeadLetter => Some(super::typed::<DeadLetter<I>>(dead, operator)?),
        _ => None,
    };
    Ok((next, dead))
}

/// A record a `process` function failed on, sent to the dead-letter output
/// under the [`on_error::DeadLetter`](crate::on_error::DeadLetter) policy.
///
/// ```
/// let mut t = weibo::testing::TestJob::new("letters");
/// let (ok, dead) = t.input(vec!["x".to_string()]).process(weibo::on_error::DeadLetter, |s: &String| s.parse::<u8>());
/// ok.sink(weibo::sinks::Blackhole::new());
/// let dead = t.collect(&dead);
/// t.run()?;
/// let letter: weibo::DeadLetter<String> = dead.values().remove(0);
/// assert_eq!(letter.record, "x");
/// assert!(letter.error.contains("invalid digit"), "{}", letter.error);
/// assert_eq!(letter.operator, "process");
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter<T> {
    /// The record, as the failing operator received it.
    pub record: T,
    /// The function's error, as text.
    pub error: String,
    /// The failing operator's name.
    pub operator: String,
    /// Where the record came from.
    pub position: SourcePosition,
}

/// The policy a marker stands for (internal).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Drop and count.
    Drop,
    /// Send to the dead-letter output.
    DeadLetter,
    /// Stop the job.
    Fail,
}

/// Dead letters waiting to be pushed, and where they go.
type DeadLetters<T> = (Batch<DeadLetter<T>>, Box<dyn Consumer<DeadLetter<T>>>);

/// Where a failed record goes under a policy; shared by stateless and keyed
/// `process`.
pub(crate) struct Failures<T> {
    policy: Policy,
    dead: Option<DeadLetters<T>>,
}

impl<T: Clone + Send + 'static> Failures<T> {
    pub(crate) fn new(policy: Policy, dead: Option<Box<dyn Consumer<DeadLetter<T>>>>) -> Result<Self> {
        let dead = match (policy, dead) {
            (Policy::DeadLetter, Some(next)) => Some((Batch::with_capacity(16), next)),
            (Policy::DeadLetter, None) => {
                return Err(crate::error::internal_error!("dead-letter policy without a dead-letter output"));
            }
            (_, _) => None,
        };
        Ok(Self { policy, dead })
    }

    /// Handles one failure of `info`'s function on `record`.
    pub(crate) fn fail(&mut self, info: &OpInfo, record: T, meta: Meta, error: &dyn Display) -> Result<()> {
        match (self.policy, &mut self.dead) {
            (Policy::Drop, _) => {
                OperatorCounters::add(&info.counters.dropped, 1);
                Ok(())
            }
            (Policy::DeadLetter, Some((batch, _))) => {
                OperatorCounters::add(&info.counters.dead_lettered, 1);
                let letter = DeadLetter {
                    record,
                    error: error.to_string(),
                    operator: info.name.to_string(),
                    position: info.sources.position(&meta),
                };
                batch.push(letter, meta);
                Ok(())
            }
            _ => Err(Error::RecordFailed {
                operator: info.name.to_string(),
                position: info.sources.position(&meta),
                message: error.to_string(),
            }),
        }
    }

    /// Handles a failure of a timer function: there is no record to send
    /// anywhere, so under `Drop` and `DeadLetter` it is counted as dropped,
    /// and under `Fail` it stops the job.
    pub(crate) fn fail_timer(&mut self, info: &OpInfo, group: u16, time: Timestamp, error: &dyn Display) -> Result<()> {
        match self.policy {
            Policy::Drop | Policy::DeadLetter => {
                OperatorCounters::add(&info.counters.dropped, 1);
                Ok(())
            }
            Policy::Fail => Err(Error::TimerFailed {
                operator: info.name.to_string(),
                key_group: group,
                time,
                message: error.to_string(),
            }),
        }
    }

    pub(crate) fn push(&mut self) -> Result<()> {
        match &mut self.dead {
            Some((batch, next)) if !batch.is_empty() => next.push(batch),
            _ => Ok(()),
        }
    }

    pub(crate) fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        match &mut self.dead {
            Some((_, next)) => next.watermark(wm),
            None => Ok(()),
        }
    }

    pub(crate) fn idle(&mut self) -> Result<()> {
        match &mut self.dead {
            Some((_, next)) => next.idle(),
            None => Ok(()),
        }
    }

    pub(crate) fn barrier(&mut self, n: CheckpointId) -> Result<()> {
        match &mut self.dead {
            Some((_, next)) => next.barrier(n),
            None => Ok(()),
        }
    }

    pub(crate) fn flush(&mut self) -> Result<()> {
        match &mut self.dead {
            Some((_, next)) => next.flush(),
            None => Ok(()),
        }
    }

    pub(crate) fn finish(&mut self) -> Result<()> {
        match &mut self.dead {
            Some((_, next)) => next.finish(),
            None => Ok(()),
        }
    }
}
