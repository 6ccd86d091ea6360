//! The HTTP and S3 sinks of YAML pipelines against real endpoints: an
//! HTTP server on a loopback port that records every body (with the
//! headers the file declares, one secret from the environment), and a
//! local S3 server whose published parts hold every record once.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::io::Read as _;

use std::sync::{Arc, Mutex};
use weibo::checkpoint::CheckpointStorage as _;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use weibo_connectors::yaml::Pipeline;
use weibo_tests::s3_server::{server, storage, unique_bucket};

fn run(file: &str, env: &dyn Fn(&str) -> Option<String>) {
    let job =
        Pipeline::parse_with_env("sinks.yaml", file.as_bytes(), env).unwrap_or_else(|e| panic!("{e}")).job().unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(job.run()).unwrap();
}

/// Requests received: (the `authorization` header, the body).
type Received = Arc<Mutex<Vec<(String, String)>>>;

/// A server answering 200 to every request on a loopback port.
fn http_server() -> (std::net::SocketAddr, Received, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let received: Received = Arc::default();
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = received.clone();
    runtime.spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                loop {
                    let (mut length, mut auth) = (0usize, String::new());
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let l = line.trim_end().to_ascii_lowercase();
                        if l.is_empty() {
                            break;
                        }
                        if let Some(v) = l.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        if l.starts_with("authorization:") {
                            auth = line.trim_end()["authorization:".len()..].trim().to_string();
                        }
                    }
                    let mut body = vec![0; length];
                    if read.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    seen.lock().unwrap().push((auth, String::from_utf8_lossy(&body).into_owned()));
                    if write.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, received, runtime)
}

#[test]
fn records_go_to_an_http_endpoint_as_json_lines_with_the_declared_headers() {
    let (addr, received, _server) = http_server();
    let file = format!(
        r#"
job: to-http
sources:
  n: {{ generator: {{ count: 250, fields: {{ i: "i", even: "i % 2 == 0" }} }} }}
pipeline:
  - from: n
  - to: {{ http: {{ url: "http://{addr}/ingest", format: json_lines, batch_records: 100, headers: {{ authorization: "Bearer ${{API_TOKEN}}" }} }} }}
"#
    );
    run(&file, &|name| (name == "API_TOKEN").then(|| "s3cret".to_string()));
    let received = received.lock().unwrap();
    assert!(received.len() >= 3, "{} requests", received.len());
    assert!(
        received.iter().all(|(auth, _)| auth == "Bearer s3cret"),
        "{:?}",
        received.iter().map(|r| &r.0).collect::<Vec<_>>()
    );
    let mut got: Vec<i64> = received
        .iter()
        .flat_map(|(_, body)| body.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()))
        .map(|v| {
            assert_eq!(v["even"], v["i"].as_i64().unwrap() % 2 == 0);
            v["i"].as_i64().unwrap()
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, (0..250).collect::<Vec<_>>());
}

#[test]
fn records_go_to_s3_parts_exactly_once() {
    let bucket = unique_bucket("yaml-s3");
    let dir = tempfile::tempdir().unwrap();
    let file = format!(
        r#"
job: to-s3
checkpoints: {{ storage: {}, interval: 100ms }}
sources:
  n: {{ generator: {{ count: 1000, fields: {{ i: "i" }} }} }}
pipeline:
  - from: n
  - to: {{ s3: {{ bucket: {bucket}, prefix: out, endpoint: "{}", region: us-east-1, access_key_id: test, secret_access_key: "${{S3_SECRET}}", local: true }} }}
"#,
        dir.path().display(),
        server().endpoint
    );
    run(&file, &|name| (name == "S3_SECRET").then(|| "testsecret".to_string()));
    let s = storage(&bucket, "out");
    let mut got = Vec::new();
    for name in s.list("").unwrap().iter().filter(|n| n.starts_with("part-")) {
        let mut text = String::new();
        s.open(name).unwrap().read_to_string(&mut text).unwrap();
        got.extend(text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["i"].as_i64().unwrap()));
    }
    got.sort_unstable();
    assert_eq!(got, (0..1000).collect::<Vec<_>>());
    assert!(s.list("").unwrap().iter().all(|n| !n.starts_with("_pending/")));
}
