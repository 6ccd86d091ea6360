//! What a job is doing, from its start to its end: what the admin API's
//! status and readiness probe report.

use serde::Serialize;

/// A job's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
#[non_exhaustive]
pub enum JobState {
    /// Starting: checking its wiring, opening sources and sinks.
    Starting,
    /// Restoring checkpoint `checkpoint`.
    Restoring {
        /// The checkpoint being restored.
        checkpoint: u64,
    },
    /// Processing.
    Running,
    /// Ended at the end of its input.
    Finished,
    /// Ended with an error.
    Failed {
        /// The error.
        error: String,
    },
    /// Stopped before the end of its input: stopped (after a last
    /// checkpoint), cancelled or aborted.
    Stopped,
}

impl JobState {
    /// Whether the job has ended.
    pub fn has_ended(&self) -> bool {
        matches!(self, Self::Finished | Self::Failed { .. } | Self::Stopped)
    }
}

/// A job's state, shared: set by the job as it starts, restores, runs and
/// ends; watched by whoever reports it.
pub(crate) type JobStatus = tokio::sync::watch::Sender<JobState>;

/// Sets the job's end when dropped, unless it was set: a supervisor that
/// is aborted never returns its result, but drops this.
pub(crate) struct EndGuard(pub(crate) std::sync::Arc<JobStatus>);

impl EndGuard {
    /// Records how the job ended.
    pub(crate) fn ended(&self, result: &crate::error::Result<()>, cancelled: bool) {
        self.0.send_replace(match result {
            Ok(()) if cancelled => JobState::Stopped,
            Ok(()) => JobState::Finished,
            Err(e) => JobState::Failed { error: e.report().to_string() },
        });
    }
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        let panicked = std::thread::panicking();
        self.0.send_if_modified(|state| {
            if state.has_ended() {
                false
            } else {
                *state = if panicked {
                    JobState::Failed { error: "the job's supervisor panicked".into() }
                } else {
                    JobState::Stopped
                };
                true
            }
        });
    }
}
