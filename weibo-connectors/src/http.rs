//! Sends a stream to an HTTP endpoint: batches of records as JSON (an
//! array, or one record per line), POST or PUT, with retries, and an
//! idempotency key on every request.
//!
//! **What it promises**: at least once. Every record is delivered (the
//! endpoint answered 2xx) before the checkpoint that covers it completes:
//! a barrier waits for every request in flight. After a crash the records
//! since the last checkpoint are sent again. Every request carries an
//! `Idempotency-Key` header, the same on every retry and after a restart
//! for the same records, so an endpoint that remembers the keys it has
//! accepted can drop the repeats and see each record once. What the sink
//! cannot promise: that an endpoint which does not deduplicate sees each
//! record once, or any order between concurrent requests.
//!
//! **The key** is `<job>/<sink>/<instance>/<epoch>/<batch>/<hash>`: the
//! job's and sink's names, the writer's instance, the checkpoint epoch (one
//! after the checkpoint it follows), the batch's number in the epoch, and a
//! hash of the source positions of the batch's records, in order. Batches
//! are cut after `with_batch_records` records, at barriers, and when the linger
//! time passes; the last depends on timing, so after a restart the same
//! number may hold other records; the hash gives those a new key instead of
//! one the endpoint would take for a repeat (which would lose them). A
//! batch the endpoint refuses with a 4xx and split to find the refused
//! record sends its halves with `.0` and `.1` appended.
//!
//! **Retries**: connection errors, timeouts, 5xx and 429 are retried with
//! exponential backoff and jitter (100 ms to 10 s; a 429's or 503's
//! `Retry-After`, in seconds or as a date, is honoured), for up to
//! the retry limit (`with_retry_for`, 5 minutes by default); then the job fails. Any other 4xx
//! means the request itself is wrong: the batch is split in halves until
//! the refused records are alone, and each goes to the dead-letter sink
//! with the status and the start of the response body, or fails the job.

use std::collections::VecDeque;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use weibo::record::{CheckpointId, Meta, SourcePosition};
use weibo::sinks::{Sink, SinkBatch, SinkContext, SinkWriter};
use weibo::{DeadLetter, Error, Result};

use crate::runtime::{Pending, SinkRuntime, jitter};

/// The HTTP method of each request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Method {
    /// `POST` (the default).
    #[default]
    Post,
    /// `PUT`.
    Put,
}

/// How a batch is written in a request's body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BodyFormat {
    /// One JSON array of the records (`application/json`; the default).
    #[default]
    JsonArray,
    /// One JSON record per line (`application/x-ndjson`).
    JsonLines,
}

/// Where records the endpoint refuses go.
pub enum Refused<T> {
    /// Fail the job, naming the record's source position, the status and
    /// the start of the response body (the default).
    Fail,
    /// Into this sink, as [`DeadLetter`]s whose `error` holds the status
    /// and the start of the response body.
    DeadLetter(Box<dyn Sink<DeadLetter<T>>>),
}

impl<T: 'static> fmt::Debug for Refused<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Fail => f.write_str("Fail"),
            Refused::DeadLetter(s) => write!(f, "DeadLetter({})", s.default_name()),
        }
    }
}

/// How much of a refusing response's body goes into the error.
const BODY_EXCERPT: usize = 256;

struct Inner<T> {
    name: String,
    url: reqwest::Url,
    method: Method,
    format: BodyFormat,
    headers: Vec<(String, String)>,
    batch_records: usize,
    linger: Duration,
    concurrency: usize,
    retry_for: Duration,
    client: reqwest::Client,
    refused: Refused<T>,
    rt: SinkRuntime,
}

/// Sends records to an HTTP endpoint in batches; see the [module
/// notes](self).
///
/// ```no_run
/// use std::time::Duration;
/// use weibo_connectors::http::{BodyFormat, HttpSink, Refused};
///
/// # fn main() -> weibo::Result<()> {
/// let dead = weibo::sinks::FileSink::json_lines("refused.jsonl");
/// let sink = HttpSink::<serde_json::Value>::builder("https://example.com/events")
///     .with_format(BodyFormat::JsonLines)
///     .with_batch_records(500)
///     .with_linger(Duration::from_millis(200))
///     .with_concurrency(4)
///     .with_header("authorization", "Bearer secret")
///     .with_refused(Refused::DeadLetter(Box::new(dead)))
///     .build()?;
/// # let job = weibo::Job::new("events");
/// # let events = job.source(weibo::sources::IterSource::new(Vec::<serde_json::Value>::new()));
/// events.sink(sink);
/// # Ok(()) }
/// ```
pub struct HttpSink<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for HttpSink<T> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

impl<T> fmt::Debug for HttpSink<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSink").field("url", &self.inner.url.as_str()).finish_non_exhaustive()
    }
}

/// Configures an [`HttpSink`].
pub struct HttpSinkBuilder<T> {
    url: String,
    method: Method,
    format: BodyFormat,
    headers: Vec<(String, String)>,
    batch_records: usize,
    linger: Duration,
    concurrency: usize,
    timeout: Duration,
    connect_timeout: Duration,
    retry_for: Duration,
    refused: Refused<T>,
}

impl<T> fmt::Debug for HttpSinkBuilder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSinkBuilder").field("url", &self.url).finish_non_exhaustive()
    }
}

impl<T: Serialize + Send + 'static> HttpSink<T> {
    /// A sink sending to `url` (`http://` or `https://`).
    pub fn builder(url: impl Into<String>) -> HttpSinkBuilder<T> {
        HttpSinkBuilder {
            url: url.into(),
            method: Method::Post,
            format: BodyFormat::JsonArray,
            headers: Vec::new(),
            batch_records: 500,
            linger: Duration::from_millis(100),
            concurrency: 4,
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            retry_for: Duration::from_secs(300),
            refused: Refused::Fail,
        }
    }
}

impl<T: Serialize + Send + 'static> HttpSinkBuilder<T> {
    /// `POST` (default) or `PUT`.
    #[must_use]
    pub fn with_method(mut self, method: Method) -> Self {
        self.method = method;
        self
    }

    /// A JSON array (default) or JSON lines.
    #[must_use]
    pub fn with_format(mut self, format: BodyFormat) -> Self {
        self.format = format;
        self
    }

    /// A header on every request (authorization, say).
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Records per request, at most (default 500).
    #[must_use]
    pub fn with_batch_records(mut self, n: usize) -> Self {
        self.batch_records = n.max(1);
        self
    }

    /// How long a record may wait for its batch to fill (default 100 ms;
    /// the job's buffer timeout decides how often this is looked at).
    #[must_use]
    pub fn with_linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// Requests in flight per writer, at most (default 4). With more than
    /// one, batches may arrive out of order.
    #[must_use]
    pub fn with_concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// How long one request may take, answer included (default 30 s).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long connecting may take (default 10 s).
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long to keep retrying a request that fails for a passing reason
    /// (default 5 minutes).
    #[must_use]
    pub fn with_retry_for(mut self, limit: Duration) -> Self {
        self.retry_for = limit;
        self
    }

    /// Where refused records go (default [`Refused::Fail`]).
    #[must_use]
    pub fn with_refused(mut self, refused: Refused<T>) -> Self {
        self.refused = refused;
        self
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// [`Error::Connector`] for a URL that does not parse or is not HTTP(S),
    /// a header that is not one, or a client that cannot be built.
    pub fn build(self) -> Result<HttpSink<T>> {
        let url = reqwest::Url::parse(&self.url)
            .map_err(|e| Error::connector_caused(format!("http {}", self.url), "not a URL".to_string(), e))?;
        // The name goes into logs, errors and idempotency keys: no
        // credentials, no query.
        let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
        let name = format!("http {}://{}{port}{}", url.scheme(), url.host_str().unwrap_or_default(), url.path());
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Error::connector(&name, format!("`{}` is not an http:// or https:// URL", self.url)));
        }
        for (k, v) in &self.headers {
            if k.eq_ignore_ascii_case("content-type") || k.eq_ignore_ascii_case("idempotency-key") {
                return Err(Error::connector(
                    &name,
                    format!("header `{k}` is the sink's own (set by the body format and the batch)"),
                ));
            }
            reqwest::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| Error::connector_caused(&name, format!("`{k}` is not a header name"), e))?;
            reqwest::header::HeaderValue::from_str(v)
                .map_err(|e| Error::connector_caused(&name, format!("the value of header `{k}` is not one"), e))?;
        }
        let client = reqwest::Client::builder()
            // A redirect would turn a POST into a GET without its body.
            .redirect(reqwest::redirect::Policy::none())
            .timeout(self.timeout)
            .connect_timeout(self.connect_timeout)
            .build()
            .map_err(|e| Error::connector_caused(&name, "cannot build the HTTP client".to_string(), e))?;
        let rt = SinkRuntime::new(&name, "weibo-http")?;
        Ok(HttpSink {
            inner: Arc::new(Inner {
                name,
                url,
                method: self.method,
                format: self.format,
                headers: self.headers,
                batch_records: self.batch_records,
                linger: self.linger,
                concurrency: self.concurrency,
                retry_for: self.retry_for,
                client,
                refused: self.refused,
                rt,
            }),
        })
    }
}

impl<T: Serialize + Send + 'static> Sink<T> for HttpSink<T> {
    fn default_name(&self) -> String {
        self.inner.name.clone()
    }

    fn open(&self, instance: usize, parallelism: usize) -> Result<Box<dyn SinkWriter<T>>> {
        let mut ctx = SinkContext::new("weibo", &self.inner.name, instance, parallelism);
        ctx.epoch = CheckpointId::FIRST;
        self.open_in(&ctx)
    }

    fn open_in(&self, ctx: &SinkContext) -> Result<Box<dyn SinkWriter<T>>> {
        let dead = match &self.inner.refused {
            Refused::Fail => None,
            Refused::DeadLetter(sink) => Some(sink.open_in(ctx)?),
        };
        Ok(Box::new(HttpWriter {
            inner: Arc::clone(&self.inner),
            prefix: format!("{}/{}/{}", key_part(&ctx.job), key_part(&ctx.sink), ctx.instance),
            epoch: ctx.epoch.get(),
            batch: 0,
            records: Vec::new(),
            since: None,
            in_flight: VecDeque::new(),
            dead,
            sources: Arc::from(Vec::new()),
            _t: PhantomData,
        }))
    }
}

/// A record ready to go: its JSON and where it came from.
struct Item<T> {
    record: T,
    json: Vec<u8>,
    meta: Meta,
}

/// A refused record and why.
struct Rejection<T> {
    item: Item<T>,
    why: String,
}

struct HttpWriter<T> {
    inner: Arc<Inner<T>>,
    /// `<job>/<sink>/<instance>`, the start of every key.
    prefix: String,
    epoch: u64,
    /// The next batch's number in the epoch.
    batch: u64,
    records: Vec<Item<T>>,
    /// When the oldest waiting record arrived.
    since: Option<Instant>,
    in_flight: VecDeque<Pending<Result<Vec<Rejection<T>>>>>,
    dead: Option<Box<dyn SinkWriter<DeadLetter<T>>>>,
    sources: Arc<[String]>,
    _t: PhantomData<fn(T)>,
}

impl<T: Serialize + Send + 'static> HttpWriter<T> {
    /// Sends the waiting records as one batch (waiting first when
    /// as many requests as `with_concurrency` allows are in flight).
    fn ship(&mut self) -> Result<()> {
        self.collect(false)?;
        if self.records.is_empty() {
            return Ok(());
        }
        while self.in_flight.len() >= self.inner.concurrency {
            self.settle_oldest()?;
        }
        let items = std::mem::take(&mut self.records);
        self.since = None;
        let key = format!("{}/{}/{}/{:032x}", self.prefix, self.epoch, self.batch, fingerprint(&items));
        self.batch += 1;
        let inner = Arc::clone(&self.inner);
        self.in_flight.push_back(self.inner.rt.start(async move { deliver(&inner, key, items).await }));
        Ok(())
    }

    /// Handles the outcomes of requests done (all of them, waiting, when
    /// `all`).
    fn collect(&mut self, all: bool) -> Result<()> {
        if all {
            while !self.in_flight.is_empty() {
                self.settle_oldest()?;
            }
            return Ok(());
        }
        while let Some(done) = self.in_flight.front().and_then(Pending::ready) {
            self.in_flight.pop_front();
            self.refuse(done?)?;
        }
        Ok(())
    }

    fn settle_oldest(&mut self) -> Result<()> {
        if let Some(p) = self.in_flight.pop_front() {
            let rejected = p.wait()??;
            self.refuse(rejected)?;
        }
        Ok(())
    }

    /// Sends refused records to the dead-letter sink, or fails.
    fn refuse(&mut self, rejected: Vec<Rejection<T>>) -> Result<()> {
        if rejected.is_empty() {
            return Ok(());
        }
        let position = |m: &Meta| SourcePosition {
            source: usize::try_from(m.source)
                .ok()
                .and_then(|i| self.sources.get(i))
                .cloned()
                .unwrap_or_else(|| format!("#{}", m.source)),
            partition: m.partition,
            offset: m.offset,
        };
        let Some(dead) = self.dead.as_mut() else {
            let first = rejected.first().map(|r| (position(&r.item.meta), r.why.clone()));
            let (at, why) = first.unwrap_or_else(|| (position(&no_meta()), String::new()));
            return Err(Error::connector(
                &self.inner.name,
                format!("the endpoint refused the record from {at}: {why} ({} refused in all)", rejected.len()),
            ));
        };
        let mut values = Vec::with_capacity(rejected.len());
        let mut meta = Vec::with_capacity(rejected.len());
        for r in rejected {
            values.push(DeadLetter {
                record: r.item.record,
                error: r.why,
                operator: self.inner.name.clone(),
                position: position(&r.item.meta),
            });
            meta.push(r.item.meta);
        }
        weibo::sinks::write_batch(dead.as_mut(), values, meta, &self.sources)
    }
}

impl<T: Serialize + Send + 'static> SinkWriter<T> for HttpWriter<T> {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        if !Arc::ptr_eq(&self.sources, batch.source_names()) {
            self.sources = Arc::clone(batch.source_names());
        }
        let meta: Vec<Meta> = batch.meta().to_vec();
        for (record, meta) in batch.drain().zip(meta) {
            let json = serde_json::to_vec(&record).map_err(|e| {
                Error::connector_caused(
                    &self.inner.name,
                    format!("cannot write the record from offset {} as JSON", meta.offset),
                    e,
                )
            })?;
            self.records.push(Item { record, json, meta });
            self.since.get_or_insert_with(Instant::now);
            if self.records.len() >= self.inner.batch_records {
                self.ship()?;
            }
        }
        Ok(())
    }

    fn on_barrier(&mut self, checkpoint: CheckpointId) -> Result<()> {
        // Everything before the barrier is delivered before the checkpoint
        // can complete.
        self.ship()?;
        self.collect(true)?;
        if let Some(dead) = self.dead.as_mut() {
            dead.on_barrier(checkpoint)?;
        }
        self.epoch = checkpoint.next().get();
        self.batch = 0;
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.since.is_some_and(|t| t.elapsed() >= self.inner.linger) {
            self.ship()?;
        }
        self.collect(false)?;
        if let Some(dead) = self.dead.as_mut() {
            dead.flush()?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        self.ship()?;
        self.collect(true)?;
        match self.dead.as_mut() {
            Some(dead) => dead.finish(),
            None => Ok(()),
        }
    }
}

/// `s` fit for a header value and unambiguous in a key: letters, digits
/// and `-._~` kept, every other byte percent-encoded.
fn key_part(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl<T> Drop for HttpWriter<T> {
    fn drop(&mut self) {
        // Dropped without finishing (the job failed or was aborted): stop
        // what is still being sent, so that nothing outlives the writer.
        for p in &self.in_flight {
            p.abort();
        }
    }
}

/// Metadata of nothing in particular.
fn no_meta() -> Meta {
    Meta {
        timestamp: weibo::record::NO_TIMESTAMP,
        watermark: weibo::record::NO_TIMESTAMP,
        offset: 0,
        partition: 0,
        source: 0,
    }
}

/// A hash of the items, in order: each one's source position and JSON
/// (window and timer results carry no source position of their own, so the
/// JSON is what tells two such batches apart). 128 bits of xxh3.
fn fingerprint<T>(items: &[Item<T>]) -> u128 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for i in items {
        h.update(&i.meta.source.to_le_bytes());
        h.update(&i.meta.partition.to_le_bytes());
        h.update(&i.meta.offset.to_le_bytes());
        h.update(&(i.json.len() as u64).to_le_bytes());
        h.update(&i.json);
    }
    h.digest128()
}

/// What one request came to.
enum Answer {
    /// 2xx.
    Delivered,
    /// Worth another try after at least the delay given (and the
    /// backoff's).
    Again(String, Option<Duration>),
    /// 400, 413 or 422: the endpoint refuses what the batch holds.
    Refused(String),
    /// Any other answer (a redirect, 401, 403, 404, …): the sink is
    /// pointed wrong, whatever the records; the job fails.
    Wrong(String),
}

/// Delivers `items` under `key`, retrying; a refused batch is split in
/// halves (keys `.0` and `.1`) until the refused records are alone.
/// Returns the refused records.
async fn deliver<T>(inner: &Inner<T>, key: String, items: Vec<Item<T>>) -> Result<Vec<Rejection<T>>> {
    let mut rejected = Vec::new();
    let mut todo = vec![(key, items)];
    while let Some((key, items)) = todo.pop() {
        let payload = body(inner.format, &items);
        match send(inner, &key, &payload).await? {
            None => {}
            Some(why) if items.len() == 1 => {
                rejected.extend(items.into_iter().map(|item| Rejection { item, why: why.clone() }))
            }
            Some(_) => {
                let mut items = items;
                let second = items.split_off(items.len() / 2);
                // Depth first, first half first: the order of the input.
                todo.push((format!("{key}.1"), second));
                todo.push((format!("{key}.0"), items));
            }
        }
    }
    Ok(rejected)
}

/// Sends one request until it is delivered (`None`) or refused (`Some`
/// with the reason), retrying for up to the retry limit (`with_retry_for`).
async fn send<T>(inner: &Inner<T>, key: &str, body: &[u8]) -> Result<Option<String>> {
    let started = Instant::now();
    let mut delay = Duration::from_millis(100);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let mut request = match inner.method {
            Method::Post => inner.client.post(inner.url.clone()),
            Method::Put => inner.client.put(inner.url.clone()),
        };
        let content_type = match inner.format {
            BodyFormat::JsonArray => "application/json",
            BodyFormat::JsonLines => "application/x-ndjson",
        };
        request = request.header("content-type", content_type).header("idempotency-key", key).body(body.to_vec());
        for (k, v) in &inner.headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let answer = match request.send().await {
            Ok(response) => {
                let status = response.status();
                let wait = retry_after(response.headers());
                if status.is_success() {
                    Answer::Delivered
                } else {
                    let text = response.text().await.unwrap_or_default();
                    let excerpt: String = text.chars().take(BODY_EXCERPT).collect();
                    let why = format!("HTTP {status}: {excerpt}");
                    match status.as_u16() {
                        408 | 409 | 425 | 429 => Answer::Again(why, wait),
                        _ if status.is_server_error() => Answer::Again(why, wait),
                        400 | 413 | 422 => Answer::Refused(why),
                        _ => Answer::Wrong(why),
                    }
                }
            }
            Err(e) => Answer::Again(describe(&e), None),
        };
        match answer {
            Answer::Delivered => return Ok(None),
            Answer::Refused(why) => return Ok(Some(why)),
            Answer::Wrong(why) => {
                return Err(Error::connector(
                    &inner.name,
                    format!(
                        "request {key}: {why} (not about the records: check the URL, the method and the credentials)"
                    ),
                ));
            }
            Answer::Again(why, wait) => {
                if started.elapsed() >= inner.retry_for {
                    return Err(Error::connector(
                        &inner.name,
                        format!(
                            "request {key}: still failing after {:.0?} ({attempt} attempts): {why}",
                            started.elapsed()
                        ),
                    ));
                }
                // At least the backoff's pause, even after `Retry-After: 0`.
                let pause = wait.map_or(jitter(delay), |w| w.max(jitter(delay))).min(Duration::from_secs(60));
                tracing::warn!(sink = %inner.name, key, attempt, error = %why, "request failed; retrying in {pause:?}");
                tokio::time::sleep(pause).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// A request's body.
fn body<T>(format: BodyFormat, items: &[Item<T>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(items.iter().map(|i| i.json.len() + 1).sum::<usize>() + 2);
    match format {
        BodyFormat::JsonArray => {
            out.push(b'[');
            for (n, i) in items.iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&i.json);
            }
            out.push(b']');
        }
        BodyFormat::JsonLines => {
            for i in items {
                out.extend_from_slice(&i.json);
                out.push(b'\n');
            }
        }
    }
    out
}

/// A `Retry-After` header's delay: seconds, or an HTTP date.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO))
}

/// A client error with its causes (reqwest's own text is terse).
fn describe(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn item(offset: u64, json: &str) -> Item<()> {
        Item { record: (), json: json.as_bytes().to_vec(), meta: Meta { offset, ..no_meta() } }
    }

    #[test]
    fn key_parts_are_plain_ascii() {
        assert_eq!(key_part("orders-v2"), "orders-v2");
        assert_eq!(key_part("http http://h:1/x"), "http%20http%3A%2F%2Fh%3A1%2Fx");
        assert_eq!(key_part("naïve"), "na%C3%AFve");
    }

    #[test]
    fn bodies_are_json_arrays_or_lines() {
        let items = [item(0, "1"), item(1, "{\"a\":2}")];
        assert_eq!(body(BodyFormat::JsonArray, &items), b"[1,{\"a\":2}]");
        assert_eq!(body(BodyFormat::JsonLines, &items), b"1\n{\"a\":2}\n");
        assert_eq!(body(BodyFormat::JsonArray, &items[..0]), b"[]");
    }

    #[test]
    fn the_fingerprint_follows_the_positions_and_the_records_in_order() {
        let a = [item(1, "x"), item(2, "y")];
        assert_eq!(fingerprint(&a), fingerprint(&[item(1, "x"), item(2, "y")]));
        assert_ne!(fingerprint(&a), fingerprint(&[item(2, "y"), item(1, "x")]));
        assert_ne!(fingerprint(&a), fingerprint(&a[..1]));
        // Window results: no positions of their own, told apart by content.
        assert_ne!(fingerprint(&[item(0, "w1"), item(0, "w2")]), fingerprint(&[item(0, "w2"), item(0, "w3")]));
        // Lengths are hashed: the records' boundaries count.
        assert_ne!(fingerprint(&[item(0, "ab"), item(0, "c")]), fingerprint(&[item(0, "a"), item(0, "bc")]));
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(reqwest::header::RETRY_AFTER, "3".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(30));
        h.insert(reqwest::header::RETRY_AFTER, later.parse().unwrap());
        let d = retry_after(&h).unwrap();
        assert!(d > Duration::from_secs(25) && d <= Duration::from_secs(30), "{d:?}");
        h.insert(reqwest::header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&h), None);
    }
}
