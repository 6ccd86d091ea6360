//! The typed builder of windows: `KeyedStream::window`, then a window
//! function. The operators themselves are in `crate::operator::windows`.

use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use crate::codec::Data;
use crate::codec::key::Key;
use crate::operator::Aggregate;
use crate::operator::windows::{
    AggregateFn, ProcessFn, ReduceFn, Spec, WindowAssigner, WindowContext, WindowFactory, WindowFn, WindowResult,
};
use crate::time::millis;

use super::{KeyedStream, Stream};

/// A keyed stream with windows assigned; apply a window function to get
/// results.
pub struct WindowedStream<K, T> {
    keyed: KeyedStream<K, T>,
    spec: Spec,
    lateness: i64,
}

impl<K, T> std::fmt::Debug for WindowedStream<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowedStream").field("spec", &self.spec).field("lateness", &self.lateness).finish()
    }
}

/// The output of a window function: its results (this derefs to that
/// stream) and, on request, the records that came too late for any window.
pub struct WindowedOutput<T, U> {
    results: Stream<U>,
    late: Stream<T>,
    late_enabled: Arc<AtomicBool>,
}

impl<T, U> std::fmt::Debug for WindowedOutput<T, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowedOutput").field("results", &self.results).finish_non_exhaustive()
    }
}

impl<T, U> Deref for WindowedOutput<T, U> {
    type Target = Stream<U>;
    fn deref(&self) -> &Stream<U> {
        &self.results
    }
}

impl<T, U> WindowedOutput<T, U> {
    /// The records later than the allowed lateness, which no window took.
    /// Once asked for, they are sent here instead of dropped, and this
    /// stream must be consumed.
    pub fn late_records(&self) -> Stream<T> {
        self.late_enabled.store(true, Ordering::Relaxed);
        let mut graph = self.late.lock();
        if let Some(port) = graph.nodes.get_mut(self.late.node).and_then(|n| n.outputs.get_mut(1)) {
            port.must_consume = true;
        }
        drop(graph);
        self.late.clone()
    }

    /// The results as a plain stream.
    pub fn into_stream(self) -> Stream<U> {
        self.results
    }

    /// Names the window operator.
    #[must_use]
    pub fn name(self, name: &str) -> Self {
        let Self { results, late, late_enabled } = self;
        Self { results: results.name(name), late, late_enabled }
    }
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Assigns each record to event-time windows per key. The stream needs
    /// timestamps (`with_timestamps` upstream).
    pub fn window<W: WindowAssigner>(&self, assigner: W) -> WindowedStream<K, T> {
        let spec = assigner.spec();
        if let Err(message) = spec.validate() {
            self.upstream().lock().wiring_errors.push(message);
        }
        WindowedStream { keyed: self.clone(), spec, lateness: 0 }
    }
}

impl<K: Key, T: Data> WindowedStream<K, T> {
    /// Keeps windows for `lateness` after they fire: records up to that
    /// late still count, and re-fire their window with the updated result.
    #[must_use]
    pub fn allowed_lateness(mut self, lateness: Duration) -> Self {
        self.lateness = millis(lateness);
        self
    }

    /// Folds each window's records with `f`, incrementally (one value per
    /// window is kept).
    pub fn reduce<F>(&self, f: F) -> WindowedOutput<T, WindowResult<K, T>>
    where
        F: Fn(T, T) -> T + Send + Sync + 'static,
    {
        self.build("window_reduce", ReduceFn(f))
    }

    /// Aggregates each window's records with `agg`, incrementally.
    pub fn aggregate<G: Aggregate<T>>(&self, agg: G) -> WindowedOutput<T, WindowResult<K, G::Out>> {
        self.build("window_aggregate", AggregateFn(agg))
    }

    /// Calls `f` with all of a window's records when it fires (the records
    /// are kept until then); `f` emits any number of results.
    pub fn process<U, F>(&self, f: F) -> WindowedOutput<T, U>
    where
        U: Clone + Send + 'static,
        F: Fn(&WindowContext<'_, K>, &[T], &mut Vec<U>) + Send + Sync + 'static,
    {
        self.build("window_process", ProcessFn(f, PhantomData))
    }

    fn build<W: WindowFn<K, T>>(&self, kind: &'static str, func: W) -> WindowedOutput<T, W::Out> {
        let late_enabled = Arc::new(AtomicBool::new(false));
        let lateness = self.lateness.max(0);
        let factory = Arc::new(WindowFactory {
            func: Arc::new(func),
            spec: self.spec,
            lateness: self.lateness.max(0),
            late_enabled: late_enabled.clone(),
            _t: PhantomData,
        });
        let detail = match lateness {
            0 => self.spec.describe(),
            l => format!("{}, lateness {l} ms", self.spec.describe()),
        };
        let (graph, node) = self.keyed.keyed_node(
            kind,
            vec![crate::stream::port::<W::Out>("output", true), crate::stream::port::<T>("late records", false)],
            factory,
        );
        if let Some(n) = graph.lock().unwrap_or_else(PoisonError::into_inner).nodes.get_mut(node) {
            n.detail = detail;
        }
        WindowedOutput { results: Stream::new(graph.clone(), node, 0), late: Stream::new(graph, node, 1), late_enabled }
    }
}
