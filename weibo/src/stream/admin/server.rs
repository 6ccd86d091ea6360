//! The admin API's server: its own thread and single-threaded tokio
//! runtime, so that no request pattern takes the job's worker threads,
//! and a bounded number of connections, so that none takes the process's
//! file descriptors or memory.
//!
//! - At most `max_connections` sockets are open at once. A connection
//!   beyond that takes the place of the one that has waited longest
//!   without a request in progress (an idle keep-alive, a half-sent
//!   head, a TLS handshake); when every one has a request in progress,
//!   the new one is answered 503 and closed ([`refuse_busy`]).
//! - A request's head must arrive within [`HEADER_TIMEOUT`] of the
//!   connection's last answer (or its start): an idle or half-sent
//!   connection is closed then. Heads are at most [`HEAD_LIMIT`] bytes;
//!   bodies are bounded by the gate.
//! - A TLS handshake must finish within [`HEADER_TIMEOUT`] too.
//! - New connections are accepted at most [`ACCEPTS_PER_SECOND`] a second
//!   and requests answered at most [`REQUESTS_PER_SECOND`] a second (each
//!   after a burst): beyond that they wait, the connections in the
//!   kernel's queue, so that a storm of connections or requests costs the
//!   server's thread little CPU rather than a core.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::oneshot;

use super::gate::Gate;

/// How long a request's head may take to arrive, counted from the
/// connection's start or its last answer.
pub(super) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The most bytes of a request's head (its line and headers).
pub(super) const HEAD_LIMIT: usize = 16 * 1024;

/// The most connections accepted a second, after a burst of as many.
pub(super) const ACCEPTS_PER_SECOND: f64 = 256.0;

/// The most requests answered a second, after a burst of as many.
pub(super) const REQUESTS_PER_SECOND: f64 = 512.0;

/// How long a stopping server waits for requests in progress.
const DRAIN: Duration = Duration::from_secs(1);

/// The answer to a connection beyond the cap while every other one has a
/// request in progress.
fn busy_answer() -> String {
    let body = r#"{"error": "the admin API has too many requests in progress", "status": 503}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n\
         retry-after: 1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// What a server serves, and how.
pub(super) struct Serving {
    pub(super) app: Router,
    /// The pace of requests, shared by the connections.
    pub(super) requests: Mutex<Pace>,
    pub(super) gate: Arc<Gate>,
    pub(super) max_connections: usize,
    #[cfg(feature = "admin-tls")]
    pub(super) tls: Option<tokio_rustls::TlsAcceptor>,
}

/// Serves on `listener` from a thread of its own until the returned
/// sender is sent or dropped.
///
/// # Errors
/// When the thread or its runtime cannot be started.
pub(super) fn spawn(
    name: &str,
    listener: std::net::TcpListener,
    serving: Serving,
) -> std::io::Result<oneshot::Sender<()>> {
    let (shutdown, stopped) = oneshot::channel::<()>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(2)
        .thread_name("weibo-admin-io")
        .build()?;
    let label = name.to_string();
    std::thread::Builder::new().name("weibo-admin".into()).spawn(move || {
        runtime.block_on(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => accept(listener, Arc::new(serving), stopped).await,
                Err(e) => tracing::warn!(job = %label, error = %e, "the admin API cannot listen"),
            }
        });
        // Connections still open past the drain are dropped with the
        // runtime.
        runtime.shutdown_timeout(Duration::ZERO);
    })?;
    Ok(shutdown)
}

async fn accept(listener: tokio::net::TcpListener, serving: Arc<Serving>, mut stopped: oneshot::Receiver<()>) {
    let slots = Arc::new(Slots { max: serving.max_connections.max(1), inner: Mutex::default() });
    let mut connections = tokio::task::JoinSet::new();
    let mut accepts = Pace::new(ACCEPTS_PER_SECOND);
    let lingering = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        let wait = accepts.wait();
        if !wait.is_zero() {
            tokio::select! {
                _ = &mut stopped => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
        tokio::select! {
            _ = &mut stopped => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    accepts.take();
                    match slots.admit() {
                        Some((ticket, evicted)) => {
                            connections.spawn(connection(stream, peer, serving.clone(), ticket, evicted));
                        }
                        None => {
                            tracing::debug!(%peer, "admin API: every connection has a request in progress; refused");
                            #[cfg(feature = "admin-tls")]
                            let plain = serving.tls.is_none();
                            #[cfg(not(feature = "admin-tls"))]
                            let plain = true;
                            if plain {
                                refuse_busy(stream, &lingering, &mut connections);
                            }
                        }
                    }
                    // Let the connection evicted (if any) close its socket,
                    // and the new one read its head, before accepting more:
                    // a burst of connections never holds more than the cap.
                    tokio::task::yield_now().await;
                }
                // Out of descriptors, say: what is queued stays queued;
                // wait rather than spin.
                Err(e) => {
                    tracing::warn!(error = %e, "the admin API cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    drop(listener);
    slots.evict_idle();
    let _ = tokio::time::timeout(DRAIN, async { while connections.join_next().await.is_some() {} }).await;
}

/// The most refused connections kept open a moment after their 503, on
/// top of the cap.
const LINGERING_MAX: usize = 16;

/// How long a refused connection is kept open after its 503.
const LINGER: Duration = Duration::from_millis(200);

/// Answers `stream` 503 and closes it. Closed at once with the request
/// unread, the socket would be reset and the client might never read the
/// answer, so the request is read and dropped for a moment first; at most
/// [`LINGERING_MAX`] connections at a time (beyond that, closed at once).
fn refuse_busy(
    stream: tokio::net::TcpStream,
    lingering: &Arc<std::sync::atomic::AtomicUsize>,
    connections: &mut tokio::task::JoinSet<()>,
) {
    use std::sync::atomic::Ordering;
    let _ = stream.try_write(busy_answer().as_bytes());
    if lingering.fetch_add(1, Ordering::Relaxed) >= LINGERING_MAX {
        lingering.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    let lingering = lingering.clone();
    connections.spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut stream = stream;
        let _ = stream.shutdown().await;
        let mut sink = [0u8; 1024];
        let _ = tokio::time::timeout(LINGER, async { while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {} })
            .await;
        lingering.fetch_sub(1, Ordering::Relaxed);
    });
}

/// Serves one connection until it closes, times out, or is evicted.
async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    serving: Arc<Serving>,
    ticket: Ticket,
    evicted: oneshot::Receiver<()>,
) {
    let _ = stream.set_nodelay(true);
    #[cfg(feature = "admin-tls")]
    if let Some(tls) = &serving.tls {
        let mut evicted = evicted;
        let handshake = tokio::time::timeout(HEADER_TIMEOUT, tls.accept(stream));
        let stream = tokio::select! {
            done = handshake => match done {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "admin API: a TLS handshake failed"),
                Err(_) => return tracing::debug!(%peer, "admin API: a TLS handshake timed out"),
            },
            _ = &mut evicted => return,
        };
        return http(TokioIo::new(stream), peer, &serving, &ticket, evicted).await;
    }
    http(TokioIo::new(stream), peer, &serving, &ticket, evicted).await;
}

async fn http<I>(io: I, peer: SocketAddr, serving: &Arc<Serving>, ticket: &Ticket, evicted: oneshot::Receiver<()>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = {
        let serving = serving.clone();
        let ticket = ticket.clone();
        hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
            let serving = serving.clone();
            let ticket = ticket.clone();
            async move {
                use tower::ServiceExt as _;
                // Waiting its turn, the connection counts as idle: a new
                // one may take its place.
                let wait = serving.requests.lock().unwrap_or_else(PoisonError::into_inner).reserve();
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                let busy = ticket.busy();
                let response = match serving.gate.admit(request).await {
                    Err(refused) => refused,
                    Ok(request) => match serving.app.clone().oneshot(request).await {
                        Ok(response) => response,
                        Err(never) => match never {},
                    },
                };
                let response = serving.gate.finish(response).await;
                drop(busy);
                Ok::<_, Infallible>(response)
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(HEAD_LIMIT)
        .max_headers(64)
        .keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::select! {
        served = conn => if let Err(e) = served {
            tracing::debug!(%peer, error = %e, "admin API connection closed");
        },
        _ = evicted => tracing::debug!(%peer, "admin API connection evicted by a newer one"),
    }
}

/// A token bucket: `per_second` events a second, after a burst of as
/// many.
pub(super) struct Pace {
    per_second: f64,
    tokens: f64,
    last: Instant,
}

impl Pace {
    pub(super) fn new(per_second: f64) -> Self {
        Self { per_second, tokens: per_second, last: Instant::now() }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let earned = now.duration_since(self.last).as_secs_f64() * self.per_second;
        self.tokens = (self.tokens + earned).min(self.per_second);
        self.last = now;
    }

    /// How long until an event may happen (zero: now).
    fn wait(&mut self) -> Duration {
        self.refill();
        if self.tokens >= 1.0 { Duration::ZERO } else { Duration::from_secs_f64((1.0 - self.tokens) / self.per_second) }
    }

    /// Counts an event.
    fn take(&mut self) {
        self.refill();
        self.tokens -= 1.0;
    }

    /// Counts an event now and says how long it must wait for its turn
    /// (the debt is paid by waiting).
    fn reserve(&mut self) -> Duration {
        self.take();
        if self.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-self.tokens / self.per_second) }
    }
}

/// The open connections: at most `max`.
struct Slots {
    max: usize,
    inner: Mutex<SlotTable>,
}

#[derive(Default)]
struct SlotTable {
    next: u64,
    open: HashMap<u64, Slot>,
}

struct Slot {
    /// Requests in progress on it.
    busy: u32,
    /// When it last had none (or opened).
    idle_since: Instant,
    /// Closes it.
    evict: Option<oneshot::Sender<()>>,
}

impl Slots {
    fn table(&self) -> std::sync::MutexGuard<'_, SlotTable> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a new connection (evicting the longest-idle one when
    /// all are taken), or none when every connection is busy.
    fn admit(self: &Arc<Self>) -> Option<(Ticket, oneshot::Receiver<()>)> {
        let mut table = self.table();
        if table.open.len() >= self.max {
            let oldest =
                table.open.iter().filter(|(_, s)| s.busy == 0).min_by_key(|(_, s)| s.idle_since).map(|(id, _)| *id);
            let slot = table.open.remove(&oldest?)?;
            if let Some(evict) = slot.evict {
                let _ = evict.send(());
            }
        }
        let id = table.next;
        table.next += 1;
        let (evict, evicted) = oneshot::channel();
        table.open.insert(id, Slot { busy: 0, idle_since: Instant::now(), evict: Some(evict) });
        Some((Ticket(Arc::new(TicketInner { slots: self.clone(), id })), evicted))
    }

    /// Closes every connection without a request in progress.
    fn evict_idle(&self) {
        let mut table = self.table();
        table.open.retain(|_, slot| {
            if slot.busy > 0 {
                return true;
            }
            if let Some(evict) = slot.evict.take() {
                let _ = evict.send(());
            }
            false
        });
    }
}

/// A connection's hold on its slot: freed when the connection ends.
#[derive(Clone)]
struct Ticket(Arc<TicketInner>);

struct TicketInner {
    slots: Arc<Slots>,
    id: u64,
}

impl Drop for TicketInner {
    fn drop(&mut self) {
        self.slots.table().open.remove(&self.id);
    }
}

impl Ticket {
    /// Marks a request in progress until the guard is dropped.
    fn busy(&self) -> Busy {
        if let Some(slot) = self.0.slots.table().open.get_mut(&self.0.id) {
            slot.busy += 1;
        }
        Busy(self.clone())
    }
}

struct Busy(Ticket);

impl Drop for Busy {
    fn drop(&mut self) {
        let inner = &self.0.0;
        if let Some(slot) = inner.slots.table().open.get_mut(&inner.id) {
            slot.busy = slot.busy.saturating_sub(1);
            slot.idle_since = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_pace_lets_a_burst_through_then_spaces_what_follows() {
        let mut pace = Pace::new(100.0);
        for _ in 0..100 {
            assert!(pace.reserve() < Duration::from_millis(1));
        }
        // The 101st waits about a hundredth of a second, the 110th about
        // a tenth.
        let first = pace.reserve();
        assert!(first > Duration::from_millis(5) && first < Duration::from_millis(20), "{first:?}");
        for _ in 0..8 {
            pace.reserve();
        }
        let tenth = pace.reserve();
        assert!(tenth > Duration::from_millis(80) && tenth < Duration::from_millis(120), "{tenth:?}");
        assert!(pace.wait() > Duration::from_millis(80));
    }

    #[test]
    fn the_longest_idle_connection_gives_way_and_busy_ones_never_do() {
        let slots = Arc::new(Slots { max: 2, inner: Mutex::default() });
        let (a, mut a_evicted) = slots.admit().unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let (b, mut b_evicted) = slots.admit().unwrap();
        // Full: the third takes the place of the longest idle, a.
        let (c, _c_evicted) = slots.admit().unwrap();
        assert!(a_evicted.try_recv().is_ok() && b_evicted.try_recv().is_err());
        drop(a);
        // Both busy: a fourth is refused.
        let (busy_b, busy_c) = (b.busy(), c.busy());
        assert!(slots.admit().is_none());
        drop(busy_b);
        assert!(slots.admit().is_some(), "b is idle again and gives way");
        assert!(b_evicted.try_recv().is_ok());
        drop(busy_c);
        // The fourth connection's ticket was dropped at once: only c is open.
        assert_eq!(slots.table().open.len(), 1);
        drop((b, c));
        assert!(slots.table().open.is_empty());
    }
}
