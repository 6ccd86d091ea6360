//! A connector's own small tokio runtime, for sinks whose writers are
//! synchronous (as Weibo's are) and whose clients are async: the writer
//! starts a future there and waits for it off the job's async threads
//! (`weibo::blocking`), whatever runtime the job itself runs on.

use std::future::Future;

use weibo::{Error, Result};

/// The runtime; dropped without waiting (a sink may be dropped inside the
/// job's runtime, where a runtime cannot shut down blocking).
pub(crate) struct SinkRuntime {
    rt: Option<tokio::runtime::Runtime>,
    /// The connector's name, for errors.
    name: String,
}

impl SinkRuntime {
    /// A runtime of one worker thread named `thread`.
    pub(crate) fn new(name: &str, thread: &str) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(thread)
            .enable_all()
            .build()
            .map_err(|e| Error::connector_caused(name, "cannot start the connector's runtime".to_string(), e))?;
        Ok(Self { rt: Some(rt), name: name.to_string() })
    }

    /// Runs `f` there and waits for it.
    #[cfg_attr(not(any(feature = "postgres", feature = "s3")), allow(dead_code))]
    pub(crate) fn run<R: Send + 'static>(&self, f: impl Future<Output = R> + Send + 'static) -> Result<R> {
        self.start(f).wait()
    }

    /// Starts `f` there.
    pub(crate) fn start<R: Send + 'static>(&self, f: impl Future<Output = R> + Send + 'static) -> Pending<R> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let task = self.rt.as_ref().map(|rt| {
            rt.spawn(async move {
                let _ = tx.send(f.await);
            })
            .abort_handle()
        });
        Pending { rx, name: self.name.clone(), task }
    }
}

impl Drop for SinkRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A future running on a [`SinkRuntime`].
pub(crate) struct Pending<R> {
    rx: std::sync::mpsc::Receiver<R>,
    name: String,
    task: Option<tokio::task::AbortHandle>,
}

impl<R> Pending<R> {
    /// Waits for it.
    pub(crate) fn wait(self) -> Result<R> {
        weibo::blocking(|| self.rx.recv())
            .map_err(|_| Error::connector(&self.name, "the connector's task ended before it answered"))
    }

    /// Stops it, if it is still running (a writer dropped without
    /// finishing: nothing waits for what it started).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn abort(&self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }

    /// Its outcome, if it has one yet.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn ready(&self) -> Option<R> {
        self.rx.try_recv().ok()
    }
}

/// Between half and one and a half times `d`: a retry's pause, spread so
/// that writers that failed together do not retry together.
#[cfg_attr(not(any(feature = "postgres", feature = "http")), allow(dead_code))]
pub(crate) fn jitter(d: std::time::Duration) -> std::time::Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |t| t.subsec_nanos());
    let mut x = u64::from(nanos) ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    d.mul_f64(0.5 + (x % 1000) as f64 / 1000.0)
}
