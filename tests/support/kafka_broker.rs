//! A real Apache Kafka broker (KRaft, single node) for the integration
//! tests, on loopback.
//!
//! The broker's jars are fetched once by `scripts/fetch-kafka.sh` (Java 17
//! and Maven needed) into `$HOME/.cache/weibo/`. Each test binary that needs
//! Kafka starts one broker in a temporary directory and shares it between
//! its tests (every test uses its own topics). A watchdog shell stops the
//! broker when the test process ends, however it ends.
//!
//! `WEIBO_KAFKA_BOOTSTRAP` set to `host:port` uses that broker instead
//! (child processes of crash tests get it this way).

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Creates topic `name` with `partitions` partitions at `bootstrap`.
pub fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        rdkafka::ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("an admin client");
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = weibo::testing::block_on(admin.create_topics([&topic], &opts)).expect("create the topic");
    for r in results {
        r.expect("create the topic");
    }
}

/// Every record of `topic` at `bootstrap` as a consumer of group `group`
/// with `isolation` (`read_committed`, `read_uncommitted`) sees it.
pub fn consume_all(bootstrap: &str, topic: &str, isolation: &str, group: &str) -> Vec<rdkafka::message::OwnedMessage> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    /// The end of a partition, which this consumer waits for, is no error.
    struct Quiet;
    impl rdkafka::ClientContext for Quiet {
        fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
            if error.rdkafka_error_code() != Some(rdkafka::types::RDKafkaErrorCode::PartitionEOF) {
                eprintln!("librdkafka: {error}: {reason}");
            }
        }
    }
    impl rdkafka::consumer::ConsumerContext for Quiet {}
    let c: BaseConsumer<Quiet> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation)
        .create_with_context(Quiet)
        .expect("a checking consumer");
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10)).expect("the topic's metadata");
    let partitions: Vec<i32> =
        md.topics().first().map(|t| t.partitions().iter().map(|p| p.id()).collect()).unwrap_or_default();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in &partitions {
        tpl.add_partition_offset(topic, *p, rdkafka::Offset::Beginning).expect("assign a partition");
    }
    c.assign(&tpl).expect("assign the partitions");
    let mut out = Vec::new();
    let mut at_end = std::collections::HashSet::new();
    let started = Instant::now();
    while at_end.len() < partitions.len() {
        assert!(started.elapsed() < Duration::from_secs(60), "reading {topic} took too long");
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => out.push(m.detach()),
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
    out
}

/// A running broker.
#[derive(Debug)]
pub struct Broker {
    /// `127.0.0.1:<port>`.
    pub bootstrap: String,
    /// The broker's directory (none for an outside broker).
    dir: Option<PathBuf>,
    /// The watchdog shell that runs the broker (none for an outside broker).
    _watchdog: Option<std::process::Child>,
}

impl Broker {
    /// A broker of its own, for a test that stops and restarts it.
    pub fn private() -> Broker {
        start()
    }

    /// Stops the broker (a controlled shutdown) and waits until its port
    /// is closed.
    pub fn down(&self) {
        let dir = self.dir.as_ref().expect("a broker started here");
        std::fs::write(dir.join("down"), b"").expect("write the down flag");
        wait_port(&self.bootstrap, false, dir);
    }

    /// Starts the stopped broker again, on the same port and data, and
    /// waits until it accepts connections.
    pub fn up(&self) {
        let dir = self.dir.as_ref().expect("a broker started here");
        std::fs::remove_file(dir.join("down")).expect("remove the down flag");
        wait_port(&self.bootstrap, true, dir);
    }
}

/// Waits up to 60 s until `bootstrap` accepts connections (`open`) or
/// refuses them.
fn wait_port(bootstrap: &str, open: bool, dir: &std::path::Path) {
    let started = Instant::now();
    while TcpStream::connect(bootstrap).is_ok() != open {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the Kafka broker did not {} {bootstrap} within 60 s; see {}/broker.log",
            if open { "open" } else { "close" },
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("local address").port()
}

/// The shared broker of this test process, started on first use.
pub fn broker() -> &'static Broker {
    static BROKER: OnceLock<Broker> = OnceLock::new();
    BROKER.get_or_init(|| {
        if let Ok(bootstrap) = std::env::var("WEIBO_KAFKA_BOOTSTRAP") {
            return Broker { bootstrap, dir: None, _watchdog: None };
        }
        start()
    })
}

fn start() -> Broker {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let fetch = root.join("scripts/fetch-kafka.sh");
    let out = Command::new("bash").arg(&fetch).stderr(Stdio::inherit()).output().expect("run scripts/fetch-kafka.sh");
    assert!(
        out.status.success(),
        "cannot fetch the Kafka broker for the tests with {}: it needs Java 17 and Maven (apt-get install openjdk-17-jre-headless maven) and access to Maven Central",
        fetch.display()
    );
    let jars = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let dir = std::env::temp_dir().join(format!("weibo-kafka-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).expect("create the broker's directory");
    let (port, controller) = (free_port(), free_port());
    let props = format!(
        "process.roles=broker,controller\nnode.id=1\n\
         listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}\n\
         advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
         controller.listener.names=CONTROLLER\n\
         listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n\
         controller.quorum.voters=1@127.0.0.1:{controller}\n\
         log.dirs={}/logs\n\
         offsets.topic.replication.factor=1\noffsets.topic.num.partitions=4\n\
         transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\ntransaction.state.log.num.partitions=4\n\
         group.initial.rebalance.delay.ms=0\ngroup.min.session.timeout.ms=1000\ntransaction.abort.timed.out.transaction.cleanup.interval.ms=1000\nnum.partitions=4\nauto.create.topics.enable=false\n",
        dir.display()
    );
    std::fs::write(dir.join("server.properties"), props).expect("write server.properties");
    let cp = format!("{jars}/*");
    let format = Command::new("java")
        .args(["-cp", &cp, "kafka.tools.StorageTool", "format", "-t", "weibo-test-cluster-0001", "-c"])
        .arg(dir.join("server.properties"))
        .output()
        .expect("run java (Java 17 is needed for the test Kafka broker)");
    assert!(
        format.status.success(),
        "formatting the broker's storage failed: {}",
        String::from_utf8_lossy(&format.stderr)
    );
    // The watchdog: runs the broker (again) unless `<dir>/down` exists,
    // and stops it when this process ends.
    let script = format!(
        "b=\n\
         while kill -0 {me} 2>/dev/null; do\n\
           if [ -f '{d}/down' ]; then\n\
             if [ -n \"$b\" ]; then kill $b; wait $b; b=; fi\n\
           elif [ -z \"$b\" ] || ! kill -0 $b 2>/dev/null; then\n\
             java -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -cp '{cp}' kafka.Kafka '{d}/server.properties' >> '{d}/broker.log' 2>&1 &\n\
             b=$!\n\
           fi\n\
           sleep 0.2\n\
         done\n\
         if [ -n \"$b\" ]; then kill $b 2>/dev/null; sleep 3; kill -9 $b 2>/dev/null; fi\n\
         rm -rf '{d}'",
        d = dir.display(),
        me = std::process::id()
    );
    let watchdog = crate::spawn_watchdog(&script, "the Kafka broker");
    let bootstrap = format!("127.0.0.1:{port}");
    wait_port(&bootstrap, true, &dir);
    Broker { bootstrap, dir: Some(dir), _watchdog: Some(watchdog) }
}
