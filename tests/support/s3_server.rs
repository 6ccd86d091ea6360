//! A local S3 server for the integration tests: `moto_server` (PyPI's
//! `moto[server]`, which the README's test command installs when missing)
//! on a free loopback port, one per test binary, with a bucket per test.
//! A watchdog shell stops it when the test process ends, however it ends.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The shared server of this test process.
pub struct Server {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    port: u16,
    _watchdog: Option<std::process::Child>,
}

/// The server, started on first use (`WEIBO_S3_ENDPOINT` set: that one).
pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        if let Ok(endpoint) = std::env::var("WEIBO_S3_ENDPOINT") {
            let port = endpoint.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(0);
            return Server { endpoint, port, _watchdog: None };
        }
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let script = format!(
            "moto_server -H 127.0.0.1 -p {port} > /dev/null 2>&1 & m=$!\n\
             while kill -0 {me} 2>/dev/null && kill -0 $m 2>/dev/null; do sleep 0.5; done\n\
             kill $m 2>/dev/null",
            me = std::process::id()
        );
        let watchdog = crate::spawn_watchdog(&script, "moto_server");
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "moto_server did not listen on port {port} in 30 s: install it with `python3 -m pip install 'moto[server]'` \
                 (the README's test command does)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Server { endpoint: format!("http://127.0.0.1:{port}"), port, _watchdog: Some(watchdog) }
    })
}

/// Creates bucket `name` (moto takes an unsigned request).
pub fn create_bucket(name: &str) {
    let s = server();
    let mut stream = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    write!(
        stream,
        "PUT /{name} HTTP/1.1\r\nhost: 127.0.0.1:{}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        s.port
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "creating bucket {name}: {answer}");
}

/// A bucket name no other test uses.
pub fn unique_bucket(prefix: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let name = format!("{prefix}-{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    create_bucket(&name);
    name
}

/// A storage in `bucket` under `prefix` on the server.
pub fn storage(bucket: &str, prefix: &str) -> weibo_connectors::s3::S3Storage {
    builder(bucket, prefix).build().unwrap()
}

/// The builder of such a storage.
pub fn builder(bucket: &str, prefix: &str) -> weibo_connectors::s3::S3StorageBuilder {
    weibo_connectors::s3::S3Storage::builder(bucket, prefix)
        .with_endpoint(&server().endpoint)
        .with_region("us-east-1")
        .with_credentials("test", "testsecret")
        .allow_http()
        .path_style()
}
