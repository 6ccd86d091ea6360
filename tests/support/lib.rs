//! Helpers shared by the integration tests: this package's library
//! (`tests/support/`, as tokio's tests keep theirs), which every test
//! target uses as `weibo_tests`. The items here are the small ones many
//! targets use (test records, HTTP over loopback, a browser, Prometheus,
//! certificates, open files); the modules are a subject each: the crash
//! tests' children and kills ([`crash`]) and random schedules
//! ([`schedule`]), the servers the connector tests run against
//! ([`kafka_broker`], [`postgres_server`], [`s3_server`]), and what one
//! family of targets shares ([`kafka_common`], [`restore`],
//! [`flaky_storage`], [`upgrade_pipeline`], [`window_model`],
//! [`two_inputs`]); and the
//! examples' pipelines that tests run ([`kafka_orders`], [`totals`]).
//!
//! A helper goes here, never into a target by `#[path]`: the `layout` test
//! checks that no `tests/*.rs` includes one, and that every file here is
//! a module of this library.

pub mod crash;
pub mod flaky_storage;
pub mod kafka_broker;
pub mod kafka_common;
pub mod postgres_server;
pub mod restore;
pub mod s3_server;
pub mod schedule;
pub mod two_inputs;
pub mod upgrade_pipeline;
pub mod window_model;
pub mod yaml_restore;

// The examples' pipelines, compiled here as they are in the examples (and
// shown in the book). Their items are `pub(crate)` there, so the tests
// reach them through the modules below.
#[path = "../../examples/shared/kafka_orders.rs"]
mod kafka_orders_example;
#[path = "../../examples/shared/totals.rs"]
mod totals_example;

/// The pipeline of the Kafka → Postgres example (`kafka_postgres`,
/// `examples/shared/kafka_orders.rs`), for the tests that run it.
pub mod kafka_orders {
    use super::kafka_orders_example as example;

    /// The table the example writes into.
    pub const TABLE: &str = example::TABLE;

    /// The example's job: the paid orders of `topic` at `brokers` into the
    /// table at `url`, the consumed offsets with them.
    ///
    /// # Errors
    /// As the example's: when the sink or the source cannot be built.
    pub fn job(brokers: &str, topic: &str, url: &str) -> weibo::Result<weibo::Job> {
        example::job(brokers, topic, url)
    }

    /// An order as the example's topic holds it: its JSON.
    ///
    /// # Panics
    /// Never (an order is always JSON).
    pub fn order_json(id: i64, customer: String, cents: i64) -> Vec<u8> {
        serde_json::to_vec(&example::Order { id, customer, cents }).expect("an order as JSON")
    }
}

/// The pipeline of the Postgres example (`postgres_totals`,
/// `examples/shared/totals.rs`), for the tests that run it.
pub mod totals {
    use super::totals_example as example;

    /// The tables the example writes.
    pub const TABLES: &str = example::TABLES;

    /// The example's job: `orders` orders into the tables at `url`,
    /// checkpointed into `checkpoints`.
    ///
    /// # Errors
    /// As the example's: when a sink cannot be built.
    pub fn job(url: &str, checkpoints: &std::path::Path, orders: u64) -> weibo::Result<weibo::Job> {
        example::job(url, checkpoints, orders)
    }

    /// Order `i` of the example's input: its customer and its price in
    /// cents.
    pub fn order(i: u64) -> (String, i64) {
        let order = example::order(i);
        (order.customer, order.cents)
    }
}

use serde::{Deserialize, Serialize};
use weibo::Key;

/// A small key type used across tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Key, Serialize, Deserialize)]
pub struct Account(pub u16);

/// A test event: an account and an amount.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Event {
    /// Whose event.
    pub account: Account,
    /// How much.
    pub amount: i64,
    /// Its index in the input.
    pub seq: u32,
}

/// Runs `job` for `after`, takes savepoint `v1` of it and stops it: the
/// first version of an upgrade, stopped in the middle of its input.
///
/// # Panics
/// When the job does not start or the savepoint fails (a test's failure).
pub fn savepoint_midway(job: weibo::Job, after: std::time::Duration) -> std::path::PathBuf {
    weibo::testing::block_on(async {
        let handle = job.spawn().unwrap();
        tokio::time::sleep(after).await;
        let savepoint = handle.savepoint("v1").await.unwrap();
        handle.abort();
        savepoint
    })
}

/// Waits until `handle`'s job has ended (finished, failed or stopped),
/// keeping the handle (and so its admin API and instruments) alive.
///
/// # Panics
/// When it has not ended in 30 seconds (a test's failure).
pub async fn until_ended(handle: &weibo::JobHandle) {
    tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while !handle.status().has_ended() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the job ends within 30 s");
}

/// One HTTP/1.1 exchange over loopback (what the admin API and Prometheus
/// tests need, without an HTTP client crate): `method path`, with a bearer
/// `token` and a JSON `body` if given; returns the status and the body.
///
/// # Panics
/// When the server cannot be reached or answers something that is not
/// HTTP (a test's failure).
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    let host = addr.to_string();
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Host", host.as_str()), ("Content-Type", "application/json")];
    if let Some(b) = &bearer {
        headers.push(("Authorization", b.as_str()));
    }
    http_request(addr, method, path, &headers, body.unwrap_or("").as_bytes()).await
}

/// One HTTP/1.1 exchange over loopback with exactly these `headers` (no
/// `Host` unless given) and `body` (with its `Content-Length`, and
/// `Connection: close`): the status and the body. An answer that does not
/// come within 30 s is a test's failure.
///
/// # Panics
/// When the server cannot be reached or answers something that is not
/// HTTP (a test's failure).
pub async fn http_request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body);
    stream.write_all(&bytes).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(30), stream.read_to_end(&mut response))
        .await
        .unwrap_or_else(|_| panic!("no answer to {method} {path} in 30 s"))
        .unwrap();
    parse_response(&response)
}

/// The status and body of an HTTP/1.1 response (unchunked).
///
/// # Panics
/// When `response` is not one (a test's failure).
pub fn parse_response(response: &[u8]) -> (u16, String) {
    let split = response.windows(4).position(|w| w == b"\r\n\r\n").expect("an HTTP response");
    let (head, body) = response.split_at(split);
    let (head, body) = (String::from_utf8_lossy(head).into_owned(), body.get(4..).unwrap_or_default());
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status line");
    // Prometheus answers in chunks.
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { unchunk(body) } else { body.to_vec() };
    (status, String::from_utf8(body).expect("a UTF-8 body"))
}

/// The body of a chunked HTTP response.
fn unchunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(end) = body.windows(2).position(|w| w == b"\r\n") {
        let (size, rest) = body.split_at(end);
        let rest = rest.get(2..).unwrap_or_default();
        let Ok(n) = usize::from_str_radix(String::from_utf8_lossy(size).trim(), 16) else { break };
        if n == 0 || rest.len() < n {
            break;
        }
        let (chunk, after) = rest.split_at(n);
        out.extend_from_slice(chunk);
        body = after.strip_prefix(b"\r\n").unwrap_or(after);
    }
    out
}

/// A Prometheus server (Debian's `prometheus` package, which the README's
/// test command installs) scraping `target`'s `/metrics` every second
/// (keeping the job's own `job` label: `honor_labels`),
/// on a free loopback port in a temporary directory; killed when dropped.
pub struct Prometheus {
    child: std::process::Child,
    /// Where its HTTP API listens.
    pub addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts it and waits until it is ready.
    ///
    /// # Panics
    /// When `prometheus` is not installed (the message says how to get it)
    /// or does not become ready in 30 seconds.
    pub async fn start(target: std::net::SocketAddr, token: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let auth = token.map_or(String::new(), |t| format!("    authorization: {{ credentials: '{t}' }}\n"));
        let config = format!(
            "global: {{ scrape_interval: 1s, scrape_timeout: 1s }}\nscrape_configs:\n  - job_name: weibo\n    honor_labels: true\n{auth}    static_configs: [ {{ targets: ['{target}'] }} ]\n"
        );
        let file = dir.path().join("prometheus.yml");
        std::fs::write(&file, config).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let child = std::process::Command::new("prometheus")
            .arg(format!("--config.file={}", file.display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start `prometheus` ({e}): install it with `apt-get install -y prometheus` (the README's test command does)")
            });
        let log = dir.path().join("prometheus.log");
        let mut server = Self { child, addr, _dir: dir };
        for _ in 0..300 {
            if let Ok(Some(status)) = server.child.try_wait() {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("prometheus exited ({status}) before it was ready on {addr}:\n{log}");
            }
            if tokio::net::TcpStream::connect(addr).await.is_ok()
                && http(addr, "GET", "/-/ready", None, None).await.0 == 200
            {
                return server;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        panic!("prometheus did not become ready on {addr} in 30 s:\n{log}");
    }

    /// What Prometheus says of its scrape targets (`/api/v1/targets`), for
    /// a failure's message.
    pub async fn targets(&self) -> String {
        http(self.addr, "GET", "/api/v1/targets", None, None).await.1
    }

    /// The value of instant query `expr` now (`None` while it has no
    /// sample), summed over the series it returns.
    ///
    /// # Panics
    /// When the query fails (a test's failure).
    pub async fn query(&self, expr: &str) -> Option<f64> {
        let encoded: String = expr
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"_.-".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let (status, body) = http(self.addr, "GET", &format!("/api/v1/query?query={encoded}"), None, None).await;
        assert_eq!(status, 200, "{expr}: {body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        let results = json["data"]["result"].as_array().expect("a vector result");
        if results.is_empty() {
            return None;
        }
        Some(results.iter().map(|r| r["value"][1].as_str().unwrap().parse::<f64>().unwrap()).sum())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP/1.1 message as [`read_message`] reads it: a request or a
/// response.
#[derive(Clone, Debug)]
pub struct Message {
    /// Its first line (the request line or the status line), without
    /// its line end.
    pub first_line: String,
    /// Its headers, by lowercase name, their values trimmed.
    pub headers: std::collections::HashMap<String, String>,
    /// Its body (of its `Content-Length`).
    pub body: Vec<u8>,
}

impl Message {
    /// Header `name` (lowercase), or an empty text.
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", String::as_str)
    }
}

/// One HTTP/1.1 message from `stream` whose body has a `Content-Length`
/// (a request or a response); `None` when the connection closed before
/// it.
///
/// # Panics
/// When the stream fails or the length is not a number (a test's failure).
pub async fn read_message<R: tokio::io::AsyncBufRead + Unpin>(stream: &mut R) -> Option<Message> {
    use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _};
    let mut first = String::new();
    if stream.read_line(&mut first).await.unwrap_or(0) == 0 {
        return None;
    }
    let mut headers = std::collections::HashMap::new();
    loop {
        let mut line = String::new();
        stream.read_line(&mut line).await.unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    let length = headers.get("content-length").map_or(0, |v| v.parse().expect("a length"));
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.unwrap();
    Some(Message { first_line: first.trim_end().to_string(), headers, body })
}

/// An HTTP/1.1 server on a free loopback port, on the current tokio
/// runtime, for a test to see what a client sends: every request of every
/// connection goes to `answer`, and what it returns is written back
/// (`None`: the connection is dropped without an answer). Returns where
/// it listens.
///
/// # Panics
/// When no loopback port can be bound.
pub async fn http_server<A, F>(answer: A) -> std::net::SocketAddr
where
    A: Fn(Message) -> F + Clone + Send + 'static,
    F: std::future::Future<Output = Option<String>> + Send + 'static,
{
    use tokio::io::AsyncWriteExt as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut stream = tokio::io::BufReader::new(stream);
                // One connection may carry several requests.
                while let Some(request) = read_message(&mut stream).await {
                    let Some(reply) = answer(request).await else { return };
                    if stream.get_mut().write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A headless Chromium (Debian's `chromium` package, which the README's
/// test command installs) with its DevTools protocol on a free loopback
/// port and a throwaway profile; killed when dropped.
///
/// The protocol is spoken here directly over a WebSocket (a JSON request
/// `{id, method, params}`, a response with the same `id`, events in
/// between): the tests need five of its commands, and a client crate
/// (`chromiumoxide`) would compile the whole generated protocol.
pub struct Browser {
    child: std::process::Child,
    port: u16,
    _profile: tempfile::TempDir,
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One page (tab) of a [`Browser`], driven over its DevTools WebSocket.
pub struct Page {
    socket: Socket,
    next_id: u64,
    /// Every event the page sent so far (method and params).
    pub events: Vec<(String, serde_json::Value)>,
}

// Indexing a `serde_json::Value` gives `Null` for what is missing.
impl Browser {
    /// Starts Chromium with a window of `width` × `height` and waits for
    /// its DevTools endpoint.
    ///
    /// # Panics
    /// When `chromium` is not installed (the message says how to get it)
    /// or does not announce its endpoint in 30 seconds.
    pub async fn start(width: u32, height: u32) -> Self {
        Self::start_with(width, height, &[]).await
    }

    /// [`Browser::start`], with more command-line switches (say,
    /// `--host-resolver-rules=MAP attacker.example 127.0.0.1`).
    ///
    /// # Panics
    /// As [`Browser::start`].
    pub async fn start_with(width: u32, height: u32, switches: &[&str]) -> Self {
        use std::io::BufRead as _;
        let profile = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--hide-scrollbars",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                &format!("--window-size={width},{height}"),
                &format!("--user-data-dir={}", profile.path().display()),
            ])
            .args(switches)
            .arg("about:blank")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start `chromium` ({e}): install it with `apt-get install -y chromium` (the README's test command does)")
            });
        // Chromium says where its endpoint is on stderr:
        // `DevTools listening on ws://127.0.0.1:<port>/devtools/browser/<id>`.
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in std::io::BufReader::new(stderr).lines().map_while(std::result::Result::ok) {
                if !sent && let Some(rest) = line.split("DevTools listening on ws://").nth(1) {
                    let port =
                        rest.split('/').next().and_then(|a| a.rsplit(':').next()).and_then(|p| p.parse::<u16>().ok());
                    let _ = tx.send(port);
                    sent = true;
                }
            }
        });
        let port = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .ok()
            .flatten()
            .expect("chromium did not announce its DevTools endpoint in 30 s");
        Self { child, port, _profile: profile }
    }

    /// The browser's first page, connected.
    ///
    /// # Panics
    /// When the endpoint lists no page or the WebSocket cannot connect.
    pub async fn page(&self) -> Page {
        let body = self.targets().await;
        let targets: serde_json::Value = serde_json::from_str(&body).unwrap();
        let url = targets
            .as_array()
            .and_then(|t| t.iter().find(|t| t["type"] == "page"))
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .unwrap_or_else(|| panic!("no page among the browser's targets: {body}"))
            .to_string();
        let (socket, _) = tokio_tungstenite::connect_async(url.as_str()).await.unwrap();
        let mut page = Page { socket, next_id: 0, events: Vec::new() };
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            page.call(domain, serde_json::json!({})).await;
        }
        page
    }
}

impl Browser {
    /// The browser's `/json/list` (its targets). Its HTTP server keeps
    /// the connection open, so the body is read by its length.
    async fn targets(&self) -> String {
        use tokio::io::AsyncWriteExt as _;
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.unwrap();
        let mut stream = tokio::io::BufReader::new(stream);
        let request = format!("GET /json/list HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n", self.port);
        stream.get_mut().write_all(request.as_bytes()).await.unwrap();
        let answer = read_message(&mut stream).await.expect("an answer");
        String::from_utf8(answer.body).expect("UTF-8")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Page {
    /// Sends `method` with `params`; returns its result (events that come
    /// before it are kept in [`events`](Self::events)).
    ///
    /// # Panics
    /// When the connection fails or the command answers an error.
    pub async fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        use futures_util::{SinkExt as _, StreamExt as _};
        self.next_id += 1;
        let id = self.next_id;
        let request = serde_json::json!({ "id": id, "method": method, "params": params });
        self.socket.send(tokio_tungstenite::tungstenite::Message::text(request.to_string())).await.unwrap();
        loop {
            let message = tokio::time::timeout(std::time::Duration::from_secs(60), self.socket.next())
                .await
                .unwrap_or_else(|_| panic!("{method}: no answer in 60 s"))
                .expect("the DevTools connection closed")
                .unwrap();
            let Ok(text) = message.to_text() else { continue };
            let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else { continue };
            if value["id"] == id {
                assert!(value.get("error").is_none(), "{method}: {}", value["error"]);
                return value["result"].clone();
            }
            if let Some(event) = value["method"].as_str() {
                self.events.push((event.to_string(), value["params"].clone()));
            }
        }
    }

    /// Opens `url` and waits until its `load` event.
    ///
    /// # Panics
    /// When the page does not load in 30 seconds.
    pub async fn navigate(&mut self, url: &str) {
        let before = self.events.len();
        self.call("Page.navigate", serde_json::json!({ "url": url })).await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !self.events.iter().skip(before).any(|(m, _)| m == "Page.loadEventFired") {
            assert!(std::time::Instant::now() < deadline, "{url} did not load in 30 s");
            self.eval("1").await;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// The value of JavaScript `expression` in the page (awaited if it is a
    /// promise).
    ///
    /// # Panics
    /// When the expression throws.
    pub async fn eval(&mut self, expression: &str) -> serde_json::Value {
        let result = self
            .call(
                "Runtime.evaluate",
                serde_json::json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
            )
            .await;
        if let Some(e) = result.get("exceptionDetails") {
            panic!("{expression} threw: {e}");
        }
        result["result"]["value"].clone()
    }

    /// Every error the page reported so far: uncaught exceptions,
    /// `console.error` calls, and the browser's own log errors (a failed
    /// request, a refused script or style).
    pub fn errors(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|(method, p)| match method.as_str() {
                "Runtime.exceptionThrown" => Some(format!("exception: {}", p["exceptionDetails"])),
                "Runtime.consoleAPICalled" if p["type"] == "error" || p["type"] == "assert" => {
                    Some(format!("console.{}: {}", p["type"], p["args"]))
                }
                "Log.entryAdded" if p["entry"]["level"] == "error" => {
                    Some(format!("log: {} {}", p["entry"]["text"], p["entry"]["url"]))
                }
                _ => None,
            })
            .collect()
    }

    /// A PNG of the page as it is now.
    ///
    /// # Panics
    /// When the screenshot cannot be taken or decoded.
    pub async fn screenshot(&mut self) -> Vec<u8> {
        let shot = self.call("Page.captureScreenshot", serde_json::json!({ "format": "png" })).await;
        data_encoding::BASE64.decode(shot["data"].as_str().expect("the image").as_bytes()).unwrap()
    }
}

/// Writes into `dir` a root certificate (`ca.crt`, `ca.key`) and a
/// certificate for `localhost` and 127.0.0.1 it signs (`server.crt`,
/// `server.key`), valid two days, made with the `openssl` command.
///
/// # Panics
/// When `openssl` cannot be run or fails (the message says how to get it).
pub fn certificates(dir: &std::path::Path) {
    use std::process::Command;
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| panic!("cannot run `openssl` (the README's test command installs it): {e}"));
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=weibo test root",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
    )
    .expect("write the certificate's extensions");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    ]);
}

/// Raises this process's soft limit of open files to at least `n` (up to
/// its hard limit), with util-linux's `prlimit`: for tests that open
/// thousands of sockets.
///
/// # Panics
/// When the limit cannot be raised that far.
pub fn raise_open_files(n: u64) {
    let soft = open_files_limit(std::process::id()).0;
    if soft >= n {
        return;
    }
    let out = std::process::Command::new("prlimit")
        .args(["--pid", &std::process::id().to_string(), &format!("--nofile={n}:")])
        .output()
        .unwrap_or_else(|e| panic!("cannot run `prlimit` (util-linux): {e}"));
    assert!(
        out.status.success() && open_files_limit(std::process::id()).0 >= n,
        "cannot raise the open files limit to {n} (hard limit {}): {}",
        open_files_limit(std::process::id()).1,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Process `pid`'s soft and hard limits of open files.
///
/// # Panics
/// When `/proc/<pid>/limits` cannot be read.
pub fn open_files_limit(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("/proc/<pid>/limits");
    let line = limits.lines().find(|l| l.starts_with("Max open files")).expect("a line of open files");
    let mut numbers = line.split_whitespace().skip(3).map(|n| n.parse::<u64>().unwrap_or(u64::MAX));
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
}

/// How many files process `pid` has open now.
///
/// # Panics
/// When `/proc/<pid>/fd` cannot be read.
pub fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).expect("/proc/<pid>/fd").count()
}

/// This process's resident memory, in bytes.
///
/// # Panics
/// When `/proc/self/status` cannot be read.
pub fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

/// Starts `script` under `bash`, detached from the test's output: the
/// watchdog that runs a service (a broker, a database, an S3 server) for
/// as long as the test process lives and cleans up after it.
///
/// # Panics
/// When `bash` cannot be started (a test's failure), naming `what`.
pub fn spawn_watchdog(script: &str, what: &str) -> std::process::Child {
    std::process::Command::new("bash")
        .args(["-c", script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"))
}
