//! A real PostgreSQL server for the integration tests, on loopback.
//!
//! The server binaries come from Debian's `postgresql` package (the
//! README's test command installs it). Each test binary that needs
//! Postgres runs one throwaway cluster (`initdb` into a temporary
//! directory, `fsync` off) and shares it between its tests, every test
//! with its own tables. A watchdog shell stops the server and removes the
//! directory when the test process ends, however it ends. As root, the
//! server runs as the `postgres` user (`initdb` refuses root).
//!
//! `WEIBO_PG_URL` set uses that server instead (child processes of the
//! crash tests get it this way).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The shared server of this test process.
pub struct Server {
    /// A connection string for tokio-postgres.
    pub url: String,
    dir: Option<PathBuf>,
    port: u16,
    /// The root certificate a TLS server's certificate is signed with
    /// ([`start_tls`]).
    pub ca: Option<PathBuf>,
    _watchdog: Option<std::process::Child>,
}

/// The server of this test process, started on first use.
pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        if let Ok(url) = std::env::var("WEIBO_PG_URL") {
            return Server { url, dir: None, port: 0, ca: None, _watchdog: None };
        }
        start()
    })
}

/// Where Debian keeps the server binaries: the newest
/// `/usr/lib/postgresql/<version>/bin` that has `initdb`.
fn binaries() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "no PostgreSQL server binaries in /usr/lib/postgresql/<version>/bin: install them with \
             `apt-get install -y postgresql` (the README's test command does)"
        )
    })
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

/// `bin/<tool> args…` as the user the server runs as.
fn tool(bin: &Path, name: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(name));
        c
    } else {
        Command::new(bin.join(name))
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind a loopback port").local_addr().expect("local address").port()
}

/// A server of its own (for a test that stops and starts it), stopped
/// when this process ends.
pub fn start() -> Server {
    start_with(false)
}

/// A server of its own that takes TLS connections only (`hostssl`), its
/// certificate (for `localhost` and 127.0.0.1) signed by a root of its own
/// (`Server::ca`), made with the `openssl` command.
pub fn start_tls() -> Server {
    start_with(true)
}

fn start_with(tls: bool) -> Server {
    let bin = binaries();
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("weibo-pg-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the server's directory");
    if is_root() {
        let ok = Command::new("chown").args(["postgres:postgres"]).arg(&dir).status().map(|s| s.success());
        assert_eq!(ok.ok(), Some(true), "cannot give {} to the postgres user", dir.display());
    }
    let init = tool(&bin, "initdb")
        .arg("-D")
        .arg(dir.join("data"))
        .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"])
        .output()
        .expect("run initdb");
    assert!(init.status.success(), "initdb failed: {}", String::from_utf8_lossy(&init.stderr));
    let conf = format!(
        "port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{d}'\nfsync = off\n\
         synchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\n",
        d = dir.display()
    );
    let mut existing = std::fs::read_to_string(dir.join("data/postgresql.conf")).expect("read postgresql.conf");
    existing.push_str(&conf);
    let mut ca = None;
    if tls {
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).expect("create the certificates' directory");
        crate::certificates(&certs);
        let data = dir.join("data");
        for f in ["server.crt", "server.key"] {
            std::fs::copy(certs.join(f), data.join(f)).expect("copy the server's certificate");
        }
        if is_root() {
            let ok = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(data.join("server.crt"))
                .arg(data.join("server.key"))
                .status();
            assert!(ok.is_ok_and(|s| s.success()), "cannot give the certificate to the postgres user");
        }
        std::fs::set_permissions(data.join("server.key"), std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("restrict the server's key");
        existing.push_str("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        std::fs::write(data.join("pg_hba.conf"), "local all all trust\nhostssl all all 127.0.0.1/32 trust\n")
            .expect("write pg_hba.conf");
        ca = Some(certs.join("ca.crt"));
    }
    std::fs::write(dir.join("data/postgresql.conf"), existing).expect("write postgresql.conf");
    let server = Server {
        url: format!("host=127.0.0.1 port={port} user=postgres dbname=postgres"),
        dir: Some(dir.clone()),
        port,
        ca,
        _watchdog: None,
    };
    server.start_server();
    // The watchdog: stops the server and removes its directory when this
    // process ends.
    let pg_ctl = bin.join("pg_ctl");
    let stop = if is_root() {
        format!("runuser -u postgres -- '{}'", pg_ctl.display())
    } else {
        format!("'{}'", pg_ctl.display())
    };
    let script = format!(
        "while kill -0 {me} 2>/dev/null; do sleep 0.5; done\n\
         {stop} -D '{d}/data' -m immediate -w stop > /dev/null 2>&1\n\
         rm -rf '{d}'",
        me = std::process::id(),
        d = dir.display()
    );
    let watchdog = crate::spawn_watchdog(&script, "the watchdog");
    Server { _watchdog: Some(watchdog), ..server }
}

impl Server {
    /// A connection string through the server's Unix socket.
    pub fn socket_url(&self) -> String {
        format!("host={} port={} user=postgres dbname=postgres", self.dir().display(), self.port)
    }

    fn dir(&self) -> &Path {
        self.dir.as_deref().expect("a server this process started")
    }

    /// Starts the server (again) on its data directory.
    pub fn start_server(&self) {
        let dir = self.dir();
        let out = tool(&binaries(), "pg_ctl")
            .arg("-D")
            .arg(dir.join("data"))
            .arg("-l")
            .arg(dir.join("server.log"))
            .args(["-w", "-t", "60", "start"])
            .stdout(Stdio::null())
            .output()
            .expect("run pg_ctl start");
        let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
        assert!(out.status.success(), "pg_ctl start failed: {}\n{log}", String::from_utf8_lossy(&out.stderr));
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "the server did not listen on port {} in 30 s:\n{log}", self.port);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server (`-m fast`: clients are disconnected, then it
    /// shuts down cleanly).
    pub fn stop_server(&self) {
        let out = tool(&binaries(), "pg_ctl")
            .arg("-D")
            .arg(self.dir().join("data"))
            .args(["-m", "fast", "-w", "stop"])
            .output()
            .expect("run pg_ctl stop");
        assert!(out.status.success(), "pg_ctl stop failed: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// A client of the shared server, on its own connection task (for the
/// tests' own queries).
pub async fn client() -> tokio_postgres::Client {
    client_at(&server().url).await
}

/// A client of the server at `url`.
pub async fn client_at(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect to the test server");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// Runs `sql` (several statements) on the shared server.
pub fn execute(sql: &str) {
    execute_at(&server().url, sql);
}

/// Runs `sql` (several statements) on the server at `url`.
pub fn execute_at(url: &str, sql: &str) {
    let sql = sql.to_string();
    block_on(async move { client_at(url).await.batch_execute(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e:?}")) });
}

/// The rows of `query` on the shared server, each as its columns' text
/// (NULL as `None`).
pub fn rows(query: &str) -> Vec<Vec<Option<String>>> {
    rows_at(&server().url, query)
}

/// The rows of `query` on the server at `url`.
pub fn rows_at(url: &str, query: &str) -> Vec<Vec<Option<String>>> {
    let query = query.to_string();
    block_on(async move {
        let c = client_at(url).await;
        let messages = c.simple_query(&query).await.unwrap_or_else(|e| panic!("{query}: {e:?}"));
        messages
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
                }
                _ => None,
            })
            .collect()
    })
}

/// Runs `f` on a fresh runtime (the tests are synchronous).
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime").block_on(f)
}

/// A table name no other test uses.
pub fn unique(prefix: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!("{prefix}_{}_{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}
