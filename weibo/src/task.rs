//! Helpers for code that runs inside a job's tasks: sources, sinks and
//! user functions that have to wait.

use std::future::Future;
use std::pin::Pin;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs `f`, which blocks its thread (a broker round trip, an fsync), from
/// inside a task: on a multi-threaded tokio runtime the worker hands its
/// other tasks to another worker first, so that timers and the rest of
/// the job keep running while `f` waits; elsewhere `f` just runs.
///
/// Sinks and sources call it around calls that can wait for seconds.
pub fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}
