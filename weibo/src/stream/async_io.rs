//! `map_async`: enrichment by calls to a service, many in flight.

use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, PoisonError};

use crate::codec::Data;
use crate::codec::key::Key;
use crate::operator::async_io::{self, AsyncOptions, Call, CallFn};
use crate::stream::{KeyedStream, Stream, dead_letters, on_error, policy_detail, port};

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Calls `f` for each record, with its key, and emits what the future
    /// it returns gives: an enrichment from a service (an HTTP API, a
    /// database), many calls in flight at once. Flink's async I/O
    /// (`AsyncDataStream`).
    ///
    /// [`AsyncOptions`] bounds the calls in flight per instance (at the
    /// bound the operator reads no input), times out and retries each
    /// call, orders the results (input order by default) and caches each
    /// key's result. A watermark goes out after the results of the records
    /// before it. At a checkpoint the records whose results are not out
    /// yet are part of it, and a restore calls for them again: results
    /// reach an exactly-once sink once, but a call may be made more than
    /// once (make it idempotent, as a lookup is). A call that fails on its
    /// last attempt fails its record under `policy`. The futures run as
    /// tokio tasks of their own, on the job's runtime.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::{AsyncOptions, on_error};
    ///
    /// // A lookup that takes a while: here, a sleep.
    /// let mut t = weibo::testing::TestJob::new("lookup");
    /// let ids = t.input((0..20u32).collect()).key_by(|id: &u32| *id);
    /// let names = ids.map_async(on_error::Fail, AsyncOptions::new().in_flight(8), |id: &u32, _: &u32| {
    ///     let id = *id;
    ///     async move {
    ///         tokio::time::sleep(Duration::from_millis(5)).await;
    ///         Ok::<_, String>(format!("user-{id}"))
    ///     }
    /// });
    /// let out = t.collect(&names);
    /// t.run()?;
    /// assert_eq!(out.values().len(), 20);
    /// assert_eq!(out.values()[3], "user-3", "results in input order");
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn map_async<U, E, Fut, F, P>(&self, policy: P, options: AsyncOptions, f: F) -> P::Output
    where
        U: Clone + Send + Sync + 'static,
        E: Display + 'static,
        Fut: Future<Output = std::result::Result<U, E>> + Send + 'static,
        F: Fn(&K, &T) -> Fut + Send + Sync + 'static,
        P: on_error::OnError<T, U>,
    {
        let call: CallFn<K, T, U> = Arc::new(move |k: &K, v: &T| -> Call<U> {
            let future = f(k, v);
            Box::pin(async move { future.await.map_err(|e| e.to_string()) })
        });
        let policy = policy.policy();
        let detail = format!(
            "{} in flight, timeout {:?}, {} retries, {}{}; {}",
            options.in_flight,
            options.timeout,
            options.retries,
            if options.ordered { "ordered" } else { "unordered" },
            options.cache.map(|(ttl, n)| format!(", cache {n} keys for {ttl:?}")).unwrap_or_default(),
            policy_detail(policy),
        );
        let factory = async_io::factory::<K, T, U>(policy, options, call);
        let outputs = vec![port::<U>("output", true), dead_letters::<T>(policy)];
        let (graph, node) = self.keyed_node("map_async", outputs, factory);
        if let Some(n) = graph.lock().unwrap_or_else(PoisonError::into_inner).nodes.get_mut(node) {
            n.detail = detail;
        }
        P::output(Stream::new(graph.clone(), node, 0), Stream::new(graph, node, 1))
    }
}
