//! The one error type of Weibo, with variants by who is to blame.

use std::path::PathBuf;

use crate::codec::CodecError;
use crate::record::SourcePosition;

/// Everything that can go wrong building or running a job.
///
/// Variants say who is to blame: the pipeline's wiring ([`Error::Graph`]),
/// data ([`Error::Codec`], [`Error::Input`], [`Error::RecordFailed`]), user
/// code that panicked ([`Error::Panicked`]), storage ([`Error::State`],
/// [`Error::Io`]), a connector ([`Error::Connector`]), the environment
/// ([`Error::Runtime`]), a neighbour task that stopped
/// ([`Error::Disconnected`], reported only when nothing better is known),
/// or Weibo itself ([`Error::Internal`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The pipeline is wired in a way that cannot run.
    #[error("invalid pipeline `{job}`: {message}")]
    Graph {
        /// The job's name.
        job: String,
        /// What is wrong and how to fix it.
        message: String,
    },

    /// A value could not be encoded or decoded.
    #[error("operator `{operator}`: {source}")]
    Codec {
        /// The operator or edge where it happened.
        operator: String,
        /// The codec's error.
        #[source]
        source: CodecError,
    },

    /// A source read input it cannot understand.
    #[error("bad input in {position}: {message}")]
    Input {
        /// Where the input is.
        position: SourcePosition,
        /// What is wrong with it.
        message: String,
    },

    /// A `process` function failed on a record under the `Fail` policy.
    #[error("operator `{operator}` failed on the record from {position}: {message}")]
    RecordFailed {
        /// The operator's name.
        operator: String,
        /// Where the record came from.
        position: SourcePosition,
        /// The function's error, as text.
        message: String,
    },

    /// A keyed `process` timer function failed under the `Fail` policy.
    #[error("operator `{operator}` failed in its timer at {time} (key group {key_group}): {message}")]
    TimerFailed {
        /// The operator's name.
        operator: String,
        /// The key group of the key whose timer fired.
        key_group: u16,
        /// The timer's time.
        time: crate::record::Timestamp,
        /// The function's error, as text.
        message: String,
    },

    /// A checkpoint could not be written, or one cannot be restored.
    #[error("checkpoint `{}`: {message}", path.display())]
    Checkpoint {
        /// The checkpoint's directory or file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },

    /// Keyed state could not be read or written.
    #[error("state of operator `{operator}`: {message}")]
    State {
        /// The operator's name.
        operator: String,
        /// What failed.
        message: String,
    },

    /// A file could not be read or written.
    #[error("{action} `{}`: {source}", path.display())]
    Io {
        /// What was being done ("cannot open", "cannot write", ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// A connector (sink or source) failed.
    #[error("connector `{name}`: {message}")]
    Connector {
        /// The connector's name in the job.
        name: String,
        /// What failed.
        message: String,
    },

    /// A user function (an operator's closure, a source or a sink) panicked.
    #[error("a user function in `{task}` panicked: {message}")]
    Panicked {
        /// The task it ran in, as `name[instance]`.
        task: String,
        /// The panic's message.
        message: String,
    },

    /// The job cannot start in this environment (for example, outside a
    /// tokio runtime).
    #[error("job `{job}` cannot start: {message}")]
    Runtime {
        /// The job's name.
        job: String,
        /// What is missing.
        message: String,
    },

    /// An edge closed because the task on its other side stopped; the
    /// job's error is the one that stopped that task.
    #[error("the edge to `{edge}` closed because the task on its other side stopped")]
    Disconnected {
        /// The edge, as `sender -> receiver`.
        edge: String,
    },

    /// A bug in Weibo: please report it with this message.
    #[error("internal error (a bug in weibo, please report it): {0}")]
    Internal(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
