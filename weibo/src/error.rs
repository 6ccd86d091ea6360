//! The one error type of Weibo, with variants by who is to blame.

use std::path::PathBuf;

use crate::codec::CodecError;
use crate::record::SourcePosition;

/// An underlying error kept as an [`Error`]'s cause.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong building or running a job.
///
/// Each variant's message (its `Display`) says what failed and where;
/// [`Error::blame`] says who is to blame. An underlying error (I/O, fjall,
/// a codec, a connector's client) is the error's
/// [`source`](std::error::Error::source) and is not repeated in the
/// message, so a reporter that walks the chain (anyhow's `{:#}`, eyre,
/// tracing's error fields) prints each cause once.
/// [`Error::report`] prints the whole chain, [`Error::find_root`] finds
/// the innermost Weibo error under [`Error::Context`] layers.
///
/// ```
/// use weibo::error::Blame;
///
/// let job = weibo::Job::new("unsunk");
/// job.source(weibo::sources::IterSource::new(vec![1u32])).map(|x| x + 1);
/// let err = job.plan().unwrap_err();
/// assert_eq!(err.blame(), Blame::Wiring);
/// assert!(err.to_string().contains("no sink"), "{err}");
///
/// let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
/// let err = weibo::Error::Io { action: "cannot open", path: "in.jsonl".into(), source: io };
/// assert_eq!(err.to_string(), "cannot open `in.jsonl`");
/// assert_eq!(err.report().to_string(), "cannot open `in.jsonl`: no such file");
/// ```
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
    #[error("operator `{operator}`: a value cannot be encoded or decoded")]
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
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },

    /// Keyed state could not be read or written.
    #[error("state of operator `{operator}`: {message}")]
    State {
        /// The operator's name.
        operator: String,
        /// What failed.
        message: String,
        /// The underlying error (the storage's, a key's decoding), if any.
        #[source]
        source: Option<BoxError>,
    },

    /// A file could not be read or written.
    #[error("{action} `{}`", path.display())]
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
        /// The underlying error (the client library's), if any.
        #[source]
        source: Option<BoxError>,
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

    /// A request the job cannot serve as it is now: a savepoint of a job
    /// without checkpoints, a checkpoint after every source has ended, a
    /// request to a job that has stopped.
    #[error("job `{job}`: {message}")]
    Refused {
        /// The job's name.
        job: String,
        /// Why it cannot.
        message: String,
    },

    /// An edge closed because the task on its other side stopped; the
    /// job's error is the one that stopped that task.
    #[error("the edge to `{edge}` closed because the task on its other side stopped")]
    Disconnected {
        /// The edge, as `sender -> receiver`.
        edge: String,
    },

    /// A bug in Weibo: please report it with this message. Made with
    /// [`internal_error!`](crate::internal_error).
    #[error("internal error (a bug in weibo, please report it): {0}")]
    Internal(String),

    /// What was being done when `source` happened: a layer of context
    /// over another Weibo error, whose blame it keeps. Made with
    /// [`Error::context`].
    #[error("{message}")]
    Context {
        /// What was being done.
        message: String,
        /// The error it met.
        #[source]
        source: Box<Error>,
    },
}

/// An [`Error::Internal`] with a `format!` message: a condition Weibo's
/// own code guarantees did not hold.
///
/// ```
/// let err = weibo::internal_error!("operator {} has {} outputs", "sum", 0);
/// assert_eq!(err.blame(), weibo::error::Blame::Weibo);
/// assert!(err.to_string().ends_with("operator sum has 0 outputs"), "{err}");
/// ```
#[macro_export]
macro_rules! internal_error {
    ($($arg:tt)*) => {
        $crate::Error::Internal(::std::format!($($arg)*))
    };
}

/// The macro by the module that owns errors, for the library's own code.
#[doc(hidden)]
pub use crate::internal_error;

/// Who is to blame for an [`Error`]: what to look at first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Blame {
    /// The pipeline's wiring: fix the code that builds the job.
    Wiring,
    /// A request the job cannot serve as it is now (a savepoint of a job
    /// without checkpoints, or of one that has stopped or is finishing):
    /// look at what the job was doing when it was asked.
    Request,
    /// The data: a record a codec, a source or a `process` function
    /// refused. The error names the record's source position.
    Data,
    /// One of the user's functions panicked.
    UserCode,
    /// Keyed state: its storage failed, or it holds what this build cannot
    /// read.
    State,
    /// A checkpoint or savepoint: it could not be written, or the one to
    /// restore cannot be.
    Checkpoint,
    /// Files: the operating system refused a read or write.
    Storage,
    /// A service outside the process (a broker, a database), reached by a
    /// connector.
    External,
    /// Where the job runs: outside a tokio runtime, or a neighbour task
    /// that stopped (whose own error is the one to read).
    Environment,
    /// A bug in Weibo.
    Weibo,
}

impl Error {
    /// Who is to blame for this error.
    pub fn blame(&self) -> Blame {
        match self {
            Error::Graph { .. } => Blame::Wiring,
            Error::Refused { .. } => Blame::Request,
            Error::Codec { .. } | Error::Input { .. } | Error::RecordFailed { .. } | Error::TimerFailed { .. } => {
                Blame::Data
            }
            Error::Panicked { .. } => Blame::UserCode,
            Error::State { .. } => Blame::State,
            Error::Checkpoint { .. } => Blame::Checkpoint,
            Error::Io { .. } => Blame::Storage,
            Error::Connector { .. } => Blame::External,
            Error::Runtime { .. } | Error::Disconnected { .. } => Blame::Environment,
            Error::Internal(_) => Blame::Weibo,
            Error::Context { source, .. } => source.blame(),
        }
    }

    /// This error with a layer of context: `message` says what was being
    /// done; the error keeps its blame and becomes the
    /// [`source`](std::error::Error::source).
    #[must_use]
    pub fn context(self, message: impl Into<String>) -> Self {
        Error::Context { message: message.into(), source: Box::new(self) }
    }

    /// The innermost Weibo error under any [`Error::Context`] layers:
    /// the one that says what actually failed.
    pub fn find_root(&self) -> &Error {
        let mut e = self;
        while let Error::Context { source, .. } = e {
            e = source;
        }
        e
    }

    /// The whole chain, each message once: `what failed: why: why that`.
    /// What a log line or a status page shows.
    pub fn report(&self) -> Report<'_> {
        Report(self)
    }

    /// A [`Error::State`] of `operator`, caused by `source`.
    pub fn state(operator: impl Into<String>, message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::State { operator: operator.into(), message: message.into(), source: Some(source.into()) }
    }

    /// A [`Error::Connector`] of connector `name`, without an underlying
    /// error.
    pub fn connector(name: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Connector { name: name.into(), message: message.into(), source: None }
    }

    /// A [`Error::Connector`] of connector `name`, caused by `source` (the
    /// client library's error).
    pub fn connector_caused(name: impl Into<String>, message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Connector { name: name.into(), message: message.into(), source: Some(source.into()) }
    }
}

/// An error and its causes as one line, `what failed: why: why that`;
/// made by [`Error::report`].
#[derive(Clone, Copy, Debug)]
pub struct Report<'a>(&'a Error);

impl std::fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = std::error::Error::source(self.0);
        while let Some(e) = cause {
            write!(f, ": {e}")?;
            cause = e.source();
        }
        Ok(())
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
