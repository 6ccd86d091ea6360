//! The admin API as an attacker meets it: a page of another origin (raw,
//! and a real one in Chromium), a name rebound to this machine, bodies
//! that are not what an endpoint takes, error answers that would show the
//! machine's paths, large and slow bodies without the token, half-sent
//! heads, more connections than the cap, two thousand idle and half-open
//! connections against a process of 1,024 descriptors that checkpoints
//! every 100 ms, requests of every shape (a property test), and HTTPS.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weibo::sinks::Blackhole;
use weibo::sources::Generator;
use weibo::{AdminGroup, AdminOptions, Job, JobState};
use weibo_tests::{Browser, http, http_request};

const TOKEN: &str = "security-token";

/// A job that runs until stopped, with checkpoints in `dir` every
/// `every`: running totals of ten keys.
fn endless(name: &str, dir: &Path, every: Duration) -> Job {
    let job = Job::new(name).with_checkpoints(dir, every);
    job.source(Generator::new(u64::MAX, |i| (i % 10, 1u64)).with_rate(5_000.0))
        .name("events")
        .key_by(|e: &(u64, u64)| e.0)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .uid("totals")
        .sink(Blackhole::new());
    job
}

/// Waits until the admin API at `addr` says the job is ready.
async fn ready(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while http(addr, "GET", "/readyz", None, None).await.0 != 200 {
        assert!(Instant::now() < deadline, "the job was not ready in 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An `endless` job in a directory of its own, its admin API as `options`
/// say, ready: the directory, the handle and the API's address.
async fn serving(name: &str, options: AdminOptions) -> (tempfile::TempDir, weibo::JobHandle, SocketAddr) {
    let dir = tempfile::tempdir().unwrap();
    let handle = endless(name, dir.path(), Duration::from_secs(3600)).with_admin_options(options).spawn().unwrap();
    let addr = handle.admin_addr().unwrap();
    ready(addr).await;
    (dir, handle, addr)
}

fn savepoints(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("savepoints"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_a_page_of_another_origin_could_send_change_nothing() {
    let (dir, handle, addr) = serving("csrf", AdminOptions::new("127.0.0.1:0")).await;
    let host = addr.to_string();
    let host = host.as_str();
    let json = ("Content-Type", "application/json");
    let from_attacker = ("Origin", "http://attacker.example");
    let cases: [&[(&str, &str)]; 8] = [
        // A form or a `no-cors` fetch: a simple request, no preflight.
        &[("Host", host), from_attacker, ("Content-Type", "text/plain")],
        &[("Host", host), from_attacker, ("Content-Type", "application/x-www-form-urlencoded")],
        // JSON from another origin (a preflight would stop a browser;
        // the server refuses it anyway).
        &[("Host", host), from_attacker, json],
        &[("Host", host), ("Origin", "http://127.0.0.1:1"), json],
        &[("Host", host), ("Origin", "null"), json],
        &[("Host", host), ("Sec-Fetch-Site", "cross-site"), json],
        // Not JSON, whoever sends it.
        &[("Host", host), ("Content-Type", "text/plain")],
        &[("Host", host)],
    ];
    for path in ["/api/savepoints", "/api/stop", "/api/cancel"] {
        let body: &[u8] = if path == "/api/savepoints" { br#"{"name": "csrf"}"# } else { b"{}" };
        for headers in cases {
            let (status, answer) = http_request(addr, "POST", path, headers, body).await;
            assert_eq!(status, 403, "POST {path} with {headers:?}: {answer}");
        }
    }
    assert!(savepoints(dir.path()).is_empty(), "{:?}", savepoints(dir.path()));
    assert_eq!(handle.status(), JobState::Running);

    // The server's own page (its origin) and a program (no origin) may.
    let ours = format!("http://{addr}");
    let page = [("Host", host), ("Origin", ours.as_str()), ("Sec-Fetch-Site", "same-origin"), json];
    let (status, answer) = http_request(addr, "POST", "/api/savepoints", &page, br#"{"name": "from-the-page"}"#).await;
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = http(addr, "POST", "/api/savepoints", None, Some(r#"{"name": "from-a-program"}"#)).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(savepoints(dir.path()), ["from-a-program", "from-the-page"]);

    // With a token, the token is what counts: no other check is needed
    // (a page cannot send the header without a preflight).
    let dir = tempfile::tempdir().unwrap();
    let options = AdminOptions::new("127.0.0.1:0").with_token(TOKEN);
    let handle =
        endless("csrf-token", dir.path(), Duration::from_secs(3600)).with_admin_options(options).spawn().unwrap();
    let addr = handle.admin_addr().unwrap();
    let host = addr.to_string();
    let bearer = format!("Bearer {TOKEN}");
    let (status, _) = http_request(addr, "POST", "/api/cancel", &[("Host", host.as_str())], b"").await;
    assert_eq!(status, 401);
    assert_eq!(handle.status(), JobState::Running);
    let (status, answer) =
        http_request(addr, "POST", "/api/cancel", &[("Host", host.as_str()), ("Authorization", bearer.as_str())], b"")
            .await;
    assert_eq!(status, 200, "{answer}");
    assert!(handle.status().has_ended());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_is_refused_and_the_names_of_this_server_are_served() {
    let (_dir, handle, addr) =
        serving("hosts", AdminOptions::new("127.0.0.1:0").with_allowed_host("Jobs.Example.com")).await;
    let port = addr.port();
    for path in ["/api/job", "/healthz", "/dashboard", "/metrics", "/api/savepoints"] {
        for host in [format!("attacker.example:{port}"), "attacker.example".into(), format!("10.9.8.7:{port}")] {
            let (status, answer) = http_request(addr, "GET", path, &[("Host", host.as_str())], b"").await;
            assert_eq!(status, 421, "GET {path} for {host}: {answer}");
            assert!(answer.contains("with_allowed_host"), "{answer}");
        }
    }
    for host in
        [addr.to_string(), format!("localhost:{port}"), format!("jobs.example.com:{port}"), "JOBS.example.com".into()]
    {
        let (status, answer) = http_request(addr, "GET", "/api/job", &[("Host", host.as_str())], b"").await;
        assert_eq!(status, 200, "{host}: {answer}");
    }
    // A group's server checks the same.
    let group = AdminGroup::serve("hosts-group", "127.0.0.1:0", None).unwrap();
    let (status, _) = http_request(group.local_addr(), "GET", "/api/jobs", &[("Host", "attacker.example")], b"").await;
    assert_eq!(status, 421);
    let (status, _) = http_request(group.local_addr(), "GET", "/api/jobs", &[("Host", "localhost")], b"").await;
    assert_eq!(status, 200);
    handle.cancel().await.unwrap();
}

/// Serves `page` (HTML) to every request on a port of its own: another
/// origin than the admin API's.
async fn serve_page(page: String) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let page = page.clone();
            tokio::spawn(async move {
                let mut head = vec![0u8; 8192];
                let _ = stream.read(&mut head).await;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

/// The statuses of the responses the page got from `port`, by method and
/// path (as the browser's network log has them, opaque ones included).
fn responses_from(page: &weibo_tests::Page, port: u16) -> Vec<(String, u16)> {
    let mut seen = Vec::new();
    for (method, params) in &page.events {
        if method == "Network.responseReceived" {
            let url = params["response"]["url"].as_str().unwrap_or_default();
            if url.contains(&format!(":{port}/")) {
                seen.push((
                    url.to_string(),
                    u16::try_from(params["response"]["status"].as_u64().unwrap_or(0)).unwrap(),
                ));
            }
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_real_browser_a_page_of_another_origin_changes_nothing_and_a_rebound_name_reads_nothing() {
    let (dir, handle, addr) = serving("browser", AdminOptions::new("127.0.0.1:0")).await;
    // What a page an operator opened elsewhere could try.
    let script = format!(
        r#"window.attempts = (async () => {{
  const api = 'http://127.0.0.1:{port}';
  const out = [];
  for (const [path, body] of [['/api/savepoints', '{{"name": "evil"}}'], ['/api/stop', '{{}}'], ['/api/cancel', '{{}}']]) {{
    try {{ await fetch(api + path, {{ method: 'POST', mode: 'no-cors', headers: {{ 'Content-Type': 'text/plain' }}, body }}); out.push(path + ' no-cors: sent'); }}
    catch (e) {{ out.push(path + ' no-cors: ' + e); }}
    try {{ const r = await fetch(api + path, {{ method: 'POST', headers: {{ 'Content-Type': 'application/json' }}, body }}); out.push(path + ' cors: ' + r.status); }}
    catch (e) {{ out.push(path + ' cors: blocked'); }}
  }}
  try {{ const r = await fetch(api + '/api/job'); out.push('read: ' + r.status); }} catch (e) {{ out.push('read: blocked'); }}
  return out;
}})();"#,
        port = addr.port()
    );
    let evil = serve_page(format!("<!doctype html><title>elsewhere</title><script>{script}</script>")).await;

    let browser = Browser::start_with(800, 600, &["--host-resolver-rules=MAP attacker.example 127.0.0.1"]).await;
    let mut page = browser.page().await;
    page.call("Network.enable", serde_json::json!({})).await;
    page.navigate(&format!("http://attacker.example:{}/", evil.port())).await;
    let attempts = page.eval("window.attempts").await;
    let attempts: Vec<&str> = attempts.as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    // The browser sent the simple requests (the server refused them), and
    // stopped the others at their preflight or at reading the answer.
    for path in ["/api/savepoints", "/api/stop", "/api/cancel"] {
        assert!(attempts.contains(&format!("{path} no-cors: sent").as_str()), "{attempts:?}");
        assert!(attempts.contains(&format!("{path} cors: blocked").as_str()), "{attempts:?}");
    }
    assert!(attempts.contains(&"read: blocked"), "{attempts:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    page.eval("true").await; // collect the network log's last events
    let seen = responses_from(&page, addr.port());
    let changes = |url: &str| ["/api/savepoints", "/api/stop", "/api/cancel"].iter().any(|p| url.ends_with(p));
    let refused = seen.iter().filter(|(url, status)| changes(url) && *status == 403).count();
    assert!(refused >= 3, "the server refused the page's posts: {seen:?}");
    assert!(seen.iter().all(|(url, status)| !changes(url) || !(200..300).contains(status)), "{seen:?}");
    assert!(savepoints(dir.path()).is_empty());
    assert_eq!(handle.status(), JobState::Running);

    // DNS rebinding: the attacker's name, now pointing at this machine,
    // on the API's own port. Same origin for the browser; refused by the
    // server.
    page.navigate(&format!("http://attacker.example:{}/api/job", addr.port())).await;
    let text = page.eval("document.body.innerText").await;
    assert!(text.as_str().unwrap_or_default().contains("does not answer for host"), "{text}");
    let seen = responses_from(&page, addr.port());
    assert!(seen.iter().any(|(url, status)| url.contains("attacker.example") && *status == 421), "{seen:?}");
    page.navigate(&format!("http://attacker.example:{}/api/savepoints", addr.port())).await;
    let posted = page
        .eval(
            "fetch('/api/savepoints', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: '{\"name\": \"rebound\"}'}).then(r => r.status)",
        )
        .await;
    assert_eq!(posted, 421);
    assert!(savepoints(dir.path()).is_empty());
    assert_eq!(handle.status(), JobState::Running);
    handle.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_must_be_objects_of_the_known_fields() {
    let (dir, handle, addr) = serving("bodies", AdminOptions::new("127.0.0.1:0")).await;
    let cases = [
        ("/api/stop", "[]", "JSON object"),
        ("/api/stop", r#"["x"]"#, "JSON object"),
        ("/api/stop", r#"{"savepoint": ["x"]}"#, "field `savepoint` must be a string, not an array"),
        ("/api/stop", r#"{"savepoint": "x", "now": true}"#, "unknown field `now`"),
        ("/api/savepoints", r#"["x"]"#, "JSON object"),
        ("/api/savepoints", r#"{"name": "x", "more": 1}"#, "unknown field `more`"),
        ("/api/savepoints", r#"{"name": 5}"#, "field `name` must be a string, not a number"),
        ("/api/savepoints", r#"{"name": "x", "name": "y"}"#, "field `name` is given twice"),
        ("/api/savepoints", "{}", "field `name` is missing"),
        ("/api/savepoints", "{\"name\": ", "line 1 column"),
        ("/api/savepoints", "\"x\"", "JSON object"),
        ("/api/cancel", "[]", "JSON object"),
        ("/api/cancel", r#"{"now": true}"#, "unknown field `now`"),
    ];
    for (path, body, says) in cases {
        let (status, answer) = http(addr, "POST", path, None, Some(body)).await;
        assert_eq!(status, 400, "POST {path} {body}: {answer}");
        let error: Value = serde_json::from_str(&answer).unwrap();
        assert!(error["error"].as_str().unwrap().contains(says), "POST {path} {body}: {answer}");
    }
    assert!(savepoints(dir.path()).is_empty());
    assert_eq!(handle.status(), JobState::Running);
    handle.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_answers_show_no_absolute_path_unless_the_token_was_given() {
    for token in [None, Some(TOKEN)] {
        let dir = tempfile::tempdir().unwrap();
        let mut options = AdminOptions::new("127.0.0.1:0");
        if let Some(t) = token {
            options = options.with_token(t);
        }
        let handle =
            endless("paths", dir.path(), Duration::from_secs(3600)).with_admin_options(options).spawn().unwrap();
        let addr = handle.admin_addr().unwrap();
        let body = r#"{"name": "twice"}"#;
        let (status, first) = http(addr, "POST", "/api/savepoints", token, Some(body)).await;
        assert_eq!(status, 201, "{first}");
        let (status, again) = http(addr, "POST", "/api/savepoints", token, Some(body)).await;
        assert_eq!(status, 409, "{again}");
        assert!(again.contains("exists already"), "{again}");
        let root = dir.path().to_str().unwrap();
        if token.is_some() {
            assert!(again.contains(root), "with the token, the path is there: {again}");
        } else {
            assert!(!again.contains(root), "without a token, no path: {again}");
            assert!(again.contains("…/twice"), "{again}");
        }
        handle.cancel().await.unwrap();
    }
}

/// Sends `head` then a body of `body_len` bytes in 64 KiB pieces (chunks,
/// if the head says so) while reading the answer;
/// the answer's status (0 if none came in 10 s).
async fn send_while_reading(addr: SocketAddr, head: String, body_len: usize) -> u16 {
    static PIECE: [u8; 65_536] = [b' '; 65_536];
    let chunked = head.contains("chunked");
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let writing = tokio::spawn(async move {
        if writer.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let mut left = body_len;
        while left > 0 {
            let n = left.min(PIECE.len());
            let sent = if chunked {
                let framed = [format!("{n:x}\r\n").as_bytes(), &PIECE[..n], b"\r\n"].concat();
                writer.write_all(&framed).await
            } else {
                writer.write_all(&PIECE[..n]).await
            };
            if sent.is_err() {
                return;
            }
            left -= n;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
            if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    })
    .await;
    writing.abort();
    if read.is_err() || answer.is_empty() {
        return 0;
    }
    weibo_tests::parse_response(&answer).0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    // A cap above the connections made: none gives way to another, each
    // gets its answer.
    let options = AdminOptions::new("127.0.0.1:0").with_token(TOKEN).with_max_connections(256);
    let with_token =
        endless("large", dir.path(), Duration::from_secs(3600)).with_admin_options(options).spawn().unwrap();
    let other = tempfile::tempdir().unwrap();
    let without =
        endless("large-open", other.path(), Duration::from_secs(3600)).with_admin("127.0.0.1:0").spawn().unwrap();
    let (guarded, open) = (with_token.admin_addr().unwrap(), without.admin_addr().unwrap());
    ready(open).await;
    let before = weibo_tests::resident_bytes();

    // Two hundred 1.9 MB bodies at once, without the token: each is
    // answered 401 on its head, before its body arrives.
    let head = |addr: SocketAddr, path: &str, length: Option<usize>| {
        let length =
            length.map_or("Transfer-Encoding: chunked\r\n".to_string(), |n| format!("Content-Length: {n}\r\n"));
        format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{length}\r\n")
    };
    let mut tasks = Vec::new();
    for i in 0..200 {
        let path = ["/api/savepoints", "/api/stop", "/api/cancel"][i % 3];
        tasks.push(tokio::spawn(send_while_reading(guarded, head(guarded, path, Some(1_900_000)), 1_900_000)));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), 401);
    }
    // Without a token: a declared length over the limit is refused on the
    // head, an undeclared one once the limit is passed.
    let status = send_while_reading(open, head(open, "/api/savepoints", Some(1_900_000)), 1_900_000).await;
    assert_eq!(status, 413);
    let status = send_while_reading(open, head(open, "/api/savepoints", None), 1_900_000).await;
    assert_eq!(status, 413);

    let after = weibo_tests::resident_bytes();
    let grown = after.saturating_sub(before);
    assert!(grown < 48 << 20, "the process grew by {} MiB", grown >> 20);
    assert_eq!((with_token.status(), without.status()), (JobState::Running, JobState::Running));
    assert!(savepoints(dir.path()).is_empty() && savepoints(other.path()).is_empty());
}

/// How long until the server closes `stream` (reading and dropping
/// whatever it sends), at most `limit`.
async fn closed_after(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
    .map(|()| started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_heads_idle_connections_and_stalled_bodies_are_cut_off() {
    let (dir, handle, addr) = serving("timeouts", AdminOptions::new("127.0.0.1:0")).await;
    let limit = Duration::from_secs(20);

    let silent = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        closed_after(&mut s, limit).await
    };
    let half_sent = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /api/job HTTP/1.1\r\nHost: loc").await.unwrap();
        closed_after(&mut s, limit).await
    };
    let kept_alive = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes()).await.unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
        closed_after(&mut s, limit).await
    };
    let stalled = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /api/savepoints HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"name\""
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let started = Instant::now();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(limit, s.read_to_end(&mut answer)).await;
        (started.elapsed(), String::from_utf8_lossy(&answer).into_owned())
    };
    let (silent, half_sent, kept_alive, (stalled_for, stalled)) = tokio::join!(silent, half_sent, kept_alive, stalled);
    for (what, closed) in
        [("a silent connection", silent), ("a half-sent head", half_sent), ("an idle keep-alive", kept_alive)]
    {
        let closed = closed.unwrap_or_else(|| panic!("{what} was still open after {limit:?}"));
        assert!(closed >= Duration::from_secs(5), "{what} closed after {closed:?}: too soon");
    }
    assert!(stalled.starts_with("HTTP/1.1 408"), "a stalled body: {stalled}");
    assert!(stalled_for < limit, "{stalled_for:?}");
    assert!(savepoints(dir.path()).is_empty());
    handle.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_take_the_places_of_idle_ones_or_are_refused_when_all_are_busy() {
    let (_dir, handle, addr) = serving("cap", AdminOptions::new("127.0.0.1:0").with_max_connections(8)).await;

    // Fifty silent connections: all but the last eight are closed to make
    // room, and a probe still gets in.
    let mut idle = Vec::new();
    for _ in 0..50 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    assert_eq!(http(addr, "GET", "/healthz", None, None).await.0, 200);
    let mut closed = 0;
    for s in &mut idle {
        if closed_after(s, Duration::from_millis(200)).await.is_some() {
            closed += 1;
        }
    }
    assert!(closed >= 42, "{closed} of 50 idle connections were closed");
    drop(idle);

    // Eight requests in progress (bodies that do not come): a ninth
    // connection is answered 503 at once.
    let mut busy = Vec::new();
    for _ in 0..8 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /api/savepoints HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        busy.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, answer) = http(addr, "GET", "/healthz", None, None).await;
    assert_eq!(status, 503, "{answer}");
    assert!(answer.contains("too many requests in progress"), "{answer}");
    drop(busy);
    let deadline = Instant::now() + Duration::from_secs(15);
    while http(addr, "GET", "/healthz", None, None).await.0 != 200 {
        assert!(Instant::now() < deadline, "the server did not recover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    handle.cancel().await.unwrap();
}

/// The child's life for the descriptor test: a job checkpointing every
/// 100 ms into `<dir>`, its admin API's address written to `<dir>/addr`;
/// runs until killed.
#[test]
fn child() {
    let Ok(dir) = std::env::var("WEIBO_ADMIN_CHILD") else { return };
    let dir = Path::new(&dir);
    weibo::testing::block_on(async {
        let job =
            endless("descriptors", &dir.join("checkpoints"), Duration::from_millis(100)).with_admin("127.0.0.1:0");
        let handle = job.spawn().unwrap();
        let addr = handle.admin_addr().unwrap().to_string();
        std::fs::write(dir.join("addr.tmp"), addr).unwrap();
        std::fs::rename(dir.join("addr.tmp"), dir.join("addr")).unwrap();
        loop {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    });
}

/// Checkpoints completed and failed so far, from the API.
async fn checkpoint_counts(addr: SocketAddr) -> (usize, usize) {
    let (status, body) = http(addr, "GET", "/api/checkpoints", None, None).await;
    assert_eq!(status, 200, "{body}");
    let history: Value = serde_json::from_str(&body).unwrap();
    let records = history["checkpoints"].as_array().unwrap();
    let completed = records.iter().filter(|r| r["outcome"] == "completed").count();
    let failed = records.iter().filter(|r| r["outcome"] == "failed").count();
    (completed, failed)
}

#[test]
fn two_thousand_idle_and_half_open_connections_starve_neither_the_probes_nor_the_checkpoints() {
    if std::env::var("WEIBO_ADMIN_CHILD").is_ok() {
        return;
    }
    weibo_tests::raise_open_files(4096);
    let dir = tempfile::tempdir().unwrap();
    // A process of 1,024 descriptors, as many machines give by default.
    let mut child = std::process::Command::new("sh")
        .args(["-c", "ulimit -n 1024 && exec \"$0\" --exact child --nocapture --test-threads=1"])
        .arg(std::env::current_exe().unwrap())
        .env("WEIBO_ADMIN_CHILD", dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.path().join("addr").exists() {
        assert!(child.try_wait().unwrap().is_none(), "the child ended");
        assert!(Instant::now() < deadline, "the child did not start in 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let child = Kill(child);
    assert_eq!(weibo_tests::open_files_limit(pid).0, 1024);
    let addr: SocketAddr = std::fs::read_to_string(dir.path().join("addr")).unwrap().parse().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        ready(addr).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while checkpoint_counts(addr).await.0 < 3 {
            assert!(Instant::now() < deadline, "no checkpoints");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (completed_before, failed_before) = checkpoint_counts(addr).await;
        let baseline = weibo_tests::open_files(pid);

        // Two thousand connections: silent, half-sent heads, and heads
        // half-sent then half-closed.
        let mut opening = tokio::task::JoinSet::new();
        for i in 0..2000usize {
            opening.spawn(async move {
                let mut s = tokio::time::timeout(Duration::from_secs(20), TcpStream::connect(addr)).await.ok()?.ok()?;
                match i % 3 {
                    0 => {}
                    1 => {
                        let _ = s.write_all(b"GET /api/job HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").await;
                    }
                    _ => {
                        let _ = s.write_all(b"POST /api/stop HTTP/1.1\r\n").await;
                        let _ = s.shutdown().await;
                    }
                }
                Some(s)
            });
        }
        let mut held = Vec::new();
        let mut most_open = 0;
        while let Some(opened) = opening.join_next().await {
            if let Some(s) = opened.unwrap() {
                held.push(s);
            }
            if held.len() % 100 == 0 {
                most_open = most_open.max(weibo_tests::open_files(pid));
            }
        }
        assert!(held.len() >= 1900, "only {} connections were made", held.len());

        // Held for five seconds: the probe answers throughout, and the
        // process never holds more than the cap of them.
        let holding = Instant::now();
        while holding.elapsed() < Duration::from_secs(5) {
            let probe = tokio::time::timeout(Duration::from_secs(5), http(addr, "GET", "/healthz", None, None)).await;
            assert_eq!(probe.map(|p| p.0).ok(), Some(200), "/healthz did not answer with 2,000 connections held");
            most_open = most_open.max(weibo_tests::open_files(pid));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            most_open <= baseline + AdminOptions::DEFAULT_MAX_CONNECTIONS + 16,
            "the job held {most_open} descriptors ({baseline} before the connections)"
        );
        let connections = held.len();
        drop(held);
        let (completed, failed) = checkpoint_counts(addr).await;
        println!(
            "{connections} connections held 5 s: the job's descriptors {baseline} before, {most_open} at most; \
             checkpoints {completed_before} → {completed} completed, {failed_before} → {failed} failed"
        );
        assert_eq!(failed, failed_before, "checkpoints failed while the connections were held");
        assert!(completed >= completed_before + 10, "{completed_before} → {completed} checkpoints in 5 s");
    });
    drop(child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_api_answers_with_the_token_and_plain_http_gets_nothing() {
    let certs = tempfile::tempdir().unwrap();
    weibo_tests::certificates(certs.path());
    let dir = tempfile::tempdir().unwrap();
    let options = AdminOptions::new("127.0.0.1:0")
        .with_token(TOKEN)
        .with_tls(certs.path().join("server.crt"), certs.path().join("server.key"));
    let handle = endless("tls", dir.path(), Duration::from_secs(3600)).with_admin_options(options).spawn().unwrap();
    let addr = handle.admin_addr().unwrap();
    let root = reqwest::Certificate::from_pem(&std::fs::read(certs.path().join("ca.crt")).unwrap()).unwrap();
    let client = reqwest::Client::builder().tls_certs_only([root]).build().unwrap();
    let base = format!("https://localhost:{}", addr.port());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = client.get(format!("{base}/readyz")).send().await.unwrap();
        if ready.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "not ready over TLS");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let job = client.get(format!("{base}/api/job")).send().await.unwrap();
    assert_eq!(job.status(), 401);
    let job = client.get(format!("{base}/api/job")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(job.status(), 200);
    let job: Value = serde_json::from_str(&job.text().await.unwrap()).unwrap();
    assert_eq!(job["job"], "tls");
    let taken = client
        .post(format!("{base}/api/savepoints"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(r#"{"name": "over-tls"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(taken.status(), 201);
    assert_eq!(savepoints(dir.path()), ["over-tls"]);

    // Plain HTTP to the TLS port: no HTTP answer.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), plain.read_to_end(&mut answer)).await;
    assert!(!answer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
    handle.cancel().await.unwrap();

    // A certificate that is not there: the job does not start, and says
    // which file.
    let missing = AdminOptions::new("127.0.0.1:0")
        .with_token(TOKEN)
        .with_tls(certs.path().join("nowhere.crt"), certs.path().join("server.key"));
    let refused = endless("tls-missing", dir.path(), Duration::from_secs(3600)).with_admin_options(missing).spawn();
    let message = refused.err().unwrap().to_string();
    assert!(message.contains("nowhere.crt"), "{message}");
}

/// One request of the property test below.
#[derive(Clone, Debug)]
struct Case {
    method: &'static str,
    path: String,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

fn case(addr: SocketAddr, paths: &'static [&'static str]) -> impl proptest::strategy::Strategy<Value = Case> {
    use proptest::prelude::*;
    let method = prop::sample::select(&["GET", "POST", "PUT", "DELETE", "OPTIONS", "HEAD", "PATCH", "BREW"][..]);
    let path = (prop::sample::select(paths), prop::option::of("[a-z%./?=&0-9]{0,12}"))
        .prop_map(|(p, more)| format!("{p}{}", more.unwrap_or_default()));
    let host = prop::option::of(prop::sample::select(vec![
        addr.to_string(),
        format!("localhost:{}", addr.port()),
        "attacker.example".to_string(),
        "[::1]".to_string(),
        "127.0.0.1:1".to_string(),
        String::new(),
    ]));
    let origin = prop::option::of(prop::sample::select(vec![
        format!("http://{addr}"),
        "http://attacker.example".to_string(),
        "null".to_string(),
        "x".to_string(),
    ]));
    let content_type = prop::option::of(prop::sample::select(vec![
        "application/json".to_string(),
        "application/json; charset=utf-8".to_string(),
        "text/plain".to_string(),
        "multipart/form-data; boundary=x".to_string(),
    ]));
    let auth = prop::option::of(prop::sample::select(vec![
        format!("Bearer {TOKEN}"),
        format!("bearer  {TOKEN} "),
        "Bearer wrong".to_string(),
        format!("Basic {TOKEN}"),
        "Bearer".to_string(),
        String::new(),
    ]));
    let fetch_site = prop::option::of(prop::sample::select(vec!["same-origin", "cross-site", "none"]));
    let body = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..600),
        prop::sample::select(vec![
            r#"{"name": "fuzzed"}"#,
            r#"{"name": "../up"}"#,
            r#"{"savepoint": null}"#,
            r#"{"savepoint": "fuzz-stop"}"#,
            "[]",
            r#"["x"]"#,
            "{}",
            r#"{"name": {"name": "x"}}"#,
            "null",
            "",
        ])
        .prop_map(|b| b.as_bytes().to_vec()),
        "[ -~]{0,200}".prop_map(String::into_bytes),
    ];
    (method, path, host, origin, content_type, auth, fetch_site, body).prop_map(
        |(method, path, host, origin, content_type, auth, fetch_site, body)| {
            let mut headers = Vec::new();
            if let Some(h) = host {
                headers.push(("Host", h));
            }
            if let Some(o) = origin {
                headers.push(("Origin", o));
            }
            if let Some(c) = content_type {
                headers.push(("Content-Type", c));
            }
            if let Some(a) = auth {
                headers.push(("Authorization", a));
            }
            if let Some(f) = fetch_site {
                headers.push(("Sec-Fetch-Site", f.to_string()));
            }
            Case { method, path, headers, body }
        },
    )
}

/// Every endpoint, with requests of every shape: each gets a definite
/// answer of the API's (never a 500, never silence), and the job runs on.
#[test]
fn requests_of_any_shape_get_a_definite_answer_and_the_job_runs_on() {
    use proptest::test_runner::{Config, TestRunner};
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    // A group with a token, whose tasks cannot be stopped through it; a
    // job's own API without one (its stop and cancel left out: a request
    // the property allows would end it); and another with them (which a
    // request may well stop: its answers must stay definite).
    let third = tempfile::tempdir().unwrap();
    let stoppable = runtime.block_on(async {
        let job =
            endless("stoppable", third.path(), Duration::from_secs(3600)).with_admin("127.0.0.1:0").spawn().unwrap();
        ready(job.admin_addr().unwrap()).await;
        job
    });
    let (group, handle, open) = runtime.block_on(async {
        let group = AdminGroup::serve("fuzzed", "127.0.0.1:0", Some(TOKEN)).unwrap();
        group.refuse_stop_and_cancel();
        let task = endless("task", dir.path(), Duration::from_secs(3600)).with_admin_group(&group);
        let handle = task.spawn().unwrap();
        let open = endless("open", other.path(), Duration::from_secs(3600)).with_admin("127.0.0.1:0").spawn().unwrap();
        ready(open.admin_addr().unwrap()).await;
        (group, handle, open)
    });
    const GROUP_PATHS: &[&str] = &[
        "/",
        "/dashboard",
        "/dashboard/group.js",
        "/healthz",
        "/readyz",
        "/api/jobs",
        "/metrics",
        "/jobs/task",
        "/jobs/task/",
        "/jobs/task/api/job",
        "/jobs/task/api/plan",
        "/jobs/task/api/metrics",
        "/jobs/task/api/checkpoints",
        "/jobs/task/api/savepoints",
        "/jobs/task/api/stop",
        "/jobs/task/api/cancel",
        "/jobs/task/metrics",
        "/jobs/task/healthz",
        "/jobs/task/dashboard/app.js",
        "/jobs/nobody/api/job",
        "/jobs/%2e%2e/api/job",
        "/api/../api/jobs",
        "/nowhere",
    ];
    const JOB_PATHS: &[&str] = &[
        "/",
        "/dashboard",
        "/dashboard/app.js",
        "/dashboard/style.css",
        "/healthz",
        "/readyz",
        "/api/job",
        "/api/plan",
        "/api/metrics",
        "/api/checkpoints",
        "/api/savepoints",
        "/metrics",
        "/nowhere",
        "/api/",
    ];
    const ALL_JOB_PATHS: &[&str] = &[
        "/",
        "/dashboard",
        "/healthz",
        "/readyz",
        "/api/job",
        "/api/plan",
        "/api/metrics",
        "/api/checkpoints",
        "/api/savepoints",
        "/api/stop",
        "/api/cancel",
        "/metrics",
    ];
    let answers = [200u16, 201, 204, 308, 400, 401, 403, 404, 405, 408, 409, 413, 421, 431, 503];
    for (addr, paths) in [
        (group.local_addr(), GROUP_PATHS),
        (open.admin_addr().unwrap(), JOB_PATHS),
        (stoppable.admin_addr().unwrap(), ALL_JOB_PATHS),
    ] {
        let mut runner = TestRunner::new(Config { cases: 500, failure_persistence: None, ..Config::default() });
        runner
            .run(&case(addr, paths), |case| {
                let headers: Vec<(&str, &str)> = case.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let (status, answer) =
                    runtime.block_on(http_request(addr, case.method, &case.path, &headers, &case.body));
                proptest::prop_assert!(answers.contains(&status), "{case:?} got {status}: {answer}");
                // hyper's own answers to what is not HTTP have no body.
                let hypers = answer.is_empty() && matches!(status, 400 | 431);
                if status >= 400 && case.method != "HEAD" && !hypers {
                    let error: Value = serde_json::from_str(&answer)
                        .map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{case:?}: {e}: {answer}")))?;
                    // A readiness probe that says "not ready" is an answer,
                    // not an error.
                    let readiness = status == 503 && error["ready"] == Value::Bool(false);
                    proptest::prop_assert!(error["error"].is_string() || readiness, "{case:?}: {answer}");
                }
                Ok(())
            })
            .unwrap();
    }
    // A path that does not decode, once more (the property found it).
    let (status, answer) = runtime.block_on(http(group.local_addr(), "GET", "/jobs/task/%a0", Some(TOKEN), None));
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("\"error\""), "{answer}");
    assert_eq!((handle.status(), open.status()), (JobState::Running, JobState::Running));
    runtime.block_on(async {
        assert_eq!(http(group.local_addr(), "GET", "/healthz", None, None).await.0, 200);
        assert_eq!(http(stoppable.admin_addr().unwrap(), "GET", "/healthz", None, None).await.0, 200);
        handle.cancel().await.unwrap();
        open.cancel().await.unwrap();
    });
}
