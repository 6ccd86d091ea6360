//! Helpers shared by the integration tests.

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
#[allow(clippy::unwrap_used)]
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
#[allow(clippy::expect_used)]
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
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(t) = token {
        request.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    let body = body.unwrap_or("");
    request.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
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
    #[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
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
    #[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
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
