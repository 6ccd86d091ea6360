//! The admin API's dashboard in a real headless Chromium (Debian's package,
//! driven over the DevTools protocol): on a job of ten operators reading
//! eight partitions, the page loads without errors, draws every operator of
//! the graph, updates its numbers while the job runs, shows each partition's
//! lag and the checkpoints, and its savepoint button writes a savepoint.
//!
//! `WEIBO_DASHBOARD_SCREENSHOT=<file.png>` also saves what the page looks
//! like (the book's picture is taken this way).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use weibo::sinks::Blackhole;
use weibo::sources::{ReadStatus, Source, SourceOutput, SourceReader};
use weibo::time::WatermarkStrategy;
use weibo::window::{Count, Tumbling, WindowResult};
use weibo::{BoxFuture, Job, KeyedContext};
use weibo_tests::{Browser, Page, http};

type Order = (u32, u64, i64);

fn now_ms() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// Orders arriving at `rate` per second in each of `partitions`
/// partitions, stamped with the wall clock. A partition's position is the
/// number of orders read, its end the number arrived: partition 7 reads
/// at half the rate, so its lag grows.
struct Feed {
    partitions: usize,
    rate: f64,
}

impl Source for Feed {
    type Item = Order;

    fn default_name(&self) -> String {
        "feed".into()
    }

    fn describe(&self) -> String {
        format!("feed, {} partitions at {}/s", self.partitions, self.rate)
    }

    fn partitions(&self) -> usize {
        self.partitions
    }

    fn open(&self, partition: usize) -> weibo::Result<Box<dyn SourceReader<Order>>> {
        self.open_at(partition, 0)
    }

    fn open_at(&self, partition: usize, position: u64) -> weibo::Result<Box<dyn SourceReader<Order>>> {
        let speed = if partition == 7 { 0.5 } else { 1.0 };
        Ok(Box::new(FeedReader { partition, next: position, started: Instant::now(), rate: self.rate, speed }))
    }
}

struct FeedReader {
    partition: usize,
    next: u64,
    started: Instant,
    rate: f64,
    speed: f64,
}

impl FeedReader {
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn arrived(&self, speed: f64) -> u64 {
        (self.started.elapsed().as_secs_f64() * self.rate * speed) as u64
    }
}

impl SourceReader<Order> for FeedReader {
    fn read<'a>(&'a mut self, out: &'a mut SourceOutput<Order>) -> BoxFuture<'a, weibo::Result<ReadStatus>> {
        Box::pin(async move {
            let due = self.arrived(self.speed);
            if due <= self.next {
                tokio::time::sleep(Duration::from_millis(5)).await;
                return Ok(ReadStatus::Idle);
            }
            let at = now_ms();
            while self.next < due && out.remaining() > 0 {
                let i = self.next;
                let account = u32::try_from((i * 7 + self.partition as u64) % 500).unwrap();
                out.push((account, 100 + i % 900, at), i, Some(at));
                self.next += 1;
            }
            Ok(ReadStatus::More)
        })
    }

    fn position(&self) -> Option<u64> {
        Some(self.next)
    }

    fn end_position(&self) -> Option<u64> {
        Some(self.arrived(1.0).max(self.next))
    }
}

const TOKEN: &str = "dashboard-token";

const OPERATORS: [&str; 10] = [
    "orders",
    "event time",
    "valid",
    "in cents",
    "large orders",
    "alerts",
    "orders per second",
    "per account",
    "running totals",
    "totals",
];

/// The edge labels of the graph that are not fully visible: outside the
/// picture, overlapping an operator's box, or under something.
const LABELS_HIDDEN: &str = r"(() => {
  const picture = document.querySelector('#graph svg').getBoundingClientRect();
  const boxes = [...document.querySelectorAll('#graph g.node rect')].map((r) => r.getBoundingClientRect());
  const hidden = [];
  for (const label of document.querySelectorAll('#graph text.edge-label')) {
    const b = label.getBoundingClientRect();
    const inside = b.left >= picture.left - 0.5 && b.right <= picture.right + 0.5 && b.top >= picture.top - 0.5 && b.bottom <= picture.bottom + 0.5;
    const over = boxes.some((r) => b.left < r.right && b.right > r.left && b.top < r.bottom && b.bottom > r.top);
    const onTop = [...label.querySelectorAll('tspan')].every((line) => {
      const l = line.getBoundingClientRect();
      const top = document.elementFromPoint((l.left + l.right) / 2, (l.top + l.bottom) / 2);
      return top !== null && (top === label || label.contains(top));
    });
    if (!inside || over || !onTop) hidden.push(label.textContent);
  }
  return hidden;
})()";

async fn text(page: &mut Page, selector: &str) -> String {
    let js = format!("(document.querySelector({selector:?}) || {{}}).textContent || ''");
    page.eval(&js).await.as_str().unwrap_or_default().to_string()
}

/// Waits up to 30 s for `expression` to be true in the page.
async fn until(page: &mut Page, what: &str, expression: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while page.eval(expression).await != Value::Bool(true) {
        assert!(Instant::now() < deadline, "the page never showed {what} ({expression}); errors: {:?}", page.errors());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_running_job_and_takes_a_savepoint() {
    let dir = tempfile::tempdir().unwrap();
    let slow = Arc::new(AtomicBool::new(true));
    let slowly = slow.clone();
    let job = Job::new("orders-dashboard")
        .with_checkpoints(dir.path(), Duration::from_secs(1))
        .with_admin("127.0.0.1:0")
        .with_admin_token(TOKEN)
        .with_channel_capacity(2);
    let orders = job
        .source(Feed { partitions: 8, rate: 4_000.0 })
        .name("orders")
        .with_timestamps(|o: &Order| o.2, WatermarkStrategy::bounded_out_of_orderness(Duration::from_millis(200)))
        .name("event time")
        .filter(|o: &Order| o.1 > 0)
        .name("valid")
        .map(|o: Order| (o.0, o.1 * 100, o.2))
        .name("in cents");
    orders.filter(|o: &Order| o.1 > 90_000).name("large orders").sink(Blackhole::new()).name("alerts");
    orders
        .key_by(|o: &Order| o.0)
        .window(Tumbling::of(Duration::from_secs(1)))
        .aggregate(Count)
        .name("orders per second")
        .map(|r: WindowResult<u32, u64>| (r.key, r.value))
        .name("per account")
        .key_by(|r: &(u32, u64)| r.0 % 64)
        .process(weibo::on_error::Fail, move |ctx: &mut KeyedContext<'_, u32, u64, u64>, r: &(u32, u64)| {
            // Slow (a second's window results, some 500 a second, take
            // about half a second), so its input edge is blocked part of
            // the time and says so.
            if slowly.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_micros(1_000));
            }
            let total = ctx.state().get_or_insert(0);
            *total += r.1;
            let total = *total;
            ctx.emit(total);
            Ok::<(), String>(())
        })
        .name("running totals")
        .sink(Blackhole::new())
        .name("totals");
    let handle = job.spawn().unwrap();
    let addr = handle.admin_addr().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while handle.status() != weibo::JobState::Running || handle.checkpoint_history().is_empty() {
        assert!(Instant::now() < deadline, "the job did not run and checkpoint: {:?}", handle.status());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The page itself needs no token (it holds no data); the API does.
    let (status, page_html) = http(addr, "GET", "/dashboard", None, None).await;
    assert_eq!(status, 200);
    assert!(page_html.contains("<title>Weibo job</title>"), "{page_html}");
    assert_eq!(http(addr, "GET", "/api/plan", None, None).await.0, 401);

    let browser = Browser::start(1440, 1100).await;
    let mut page = browser.page().await;
    page.navigate(&format!("http://{addr}/dashboard#token={TOKEN}")).await;

    // Every operator of the graph, drawn and in the table.
    until(&mut page, "ten operators", "document.querySelectorAll('#operators tbody tr').length === 10").await;
    let drawn = page.eval("[...document.querySelectorAll('#graph g.node')].map(g => g.dataset.operator)").await;
    let drawn: Vec<&str> = drawn.as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for name in OPERATORS {
        assert!(drawn.contains(&name), "{name} is not in the graph: {drawn:?}");
    }
    assert_eq!(text(&mut page, "#job-name").await, "orders-dashboard");
    assert_eq!(text(&mut page, "#job-state").await, "running");
    // The token left the address (it is in the tab's session only).
    assert_eq!(page.eval("location.hash").await, "");

    // Its numbers move while the job runs, and match the job's own.
    let read = "Number(document.querySelector('#operators tr[data-operator=\"orders\"] [data-field=\"records-out\"]').dataset.value)";
    let first = page.eval(read).await.as_f64().unwrap();
    let own = handle.metrics().operator("orders").unwrap().records_out;
    #[expect(clippy::cast_precision_loss)]
    let own = own as f64;
    assert!(first > 0.0 && first <= own, "the page shows {first} records read, the job {own}");
    until(&mut page, "the count move", &format!("{read} > {first}")).await;
    until(
        &mut page,
        "the busy share of the running totals",
        "/%$/.test(document.querySelector('#operators tr[data-operator=\"running totals\"] [data-field=\"busy\"]').textContent)",
    )
    .await;
    let rate = text(&mut page, "#operators tr[data-operator=\"orders\"] [data-field=\"out-rate\"]").await;
    assert!(rate != "–" && !rate.is_empty(), "no rate for orders: {rate:?}");
    // Hash edges get a colour for backpressure and a rate label.
    let edges = page.eval("document.querySelectorAll('#graph path.edge').length").await;
    assert_eq!(edges, 9, "edges drawn (ten operators, one branch)");
    until(&mut page, "edge rates", "document.querySelectorAll('#graph text.edge-label').length >= 5").await;
    // Every edge label fully visible: inside the picture, over no box, on
    // top; the backpressured edge's longer one too.
    until(
        &mut page,
        "a blocked share",
        "[...document.querySelectorAll('#graph text.edge-label')].some(t => /blocked/.test(t.textContent))",
    )
    .await;
    let hidden = page.eval(LABELS_HIDDEN).await;
    assert_eq!(hidden, Value::Array(Vec::new()), "edge labels hidden or cut off");

    // Watermark lag: event time is the wall clock here.
    until(
        &mut page,
        "a watermark lag",
        "/s$|ms$/.test(document.querySelector('#operators tr[data-operator=\"orders per second\"] [data-field=\"lag\"]').textContent)",
    )
    .await;

    // Eight partitions, and the slow one falls behind.
    until(&mut page, "eight partitions", "document.querySelectorAll('#partitions tbody tr').length === 8").await;
    until(
        &mut page,
        "the slow partition's lag",
        "Number((document.querySelector('#partitions tr[data-partition=\"orders[7]\"] [data-field=\"lag\"]').textContent || '0').replace(/k$/, 'e3')) > 0",
    )
    .await;

    // Checkpoints and the stateful operators' sizes.
    until(&mut page, "checkpoints", "document.querySelectorAll('#checkpoints tbody tr.completed').length > 0").await;
    until(&mut page, "state sizes", "document.querySelectorAll('#state tbody tr').length >= 3").await;
    until(
        &mut page,
        "the running totals' keys",
        "Number((document.querySelector('#state tr[data-operator=\"running totals\"][data-state=\"value\"] [data-field=\"entries\"]') || {dataset: {}}).dataset.value) > 0",
    )
    .await;

    if let Ok(path) = std::env::var("WEIBO_DASHBOARD_SCREENSHOT") {
        // A few more seconds of history for the sparklines.
        tokio::time::sleep(Duration::from_secs(20)).await;
        let png = page.screenshot().await;
        std::fs::write(&path, png).unwrap();
    }

    // The savepoint button.
    page.eval(
        "document.getElementById('savepoint-name').value = 'from-the-dashboard'; \
         document.getElementById('savepoint-button').click(); true",
    )
    .await;
    until(
        &mut page,
        "the savepoint written",
        "/written to/.test(document.getElementById('savepoint-message').textContent)",
    )
    .await;
    assert!(dir.path().join("savepoints/from-the-dashboard/MANIFEST").is_file());
    assert!(handle.checkpoint_history().iter().any(|r| r.savepoint.as_deref() == Some("from-the-dashboard")));
    until(
        &mut page,
        "the savepoint listed",
        "/from-the-dashboard/.test(document.getElementById('savepoints').textContent)",
    )
    .await;

    // A name the API refuses: its error, on the page.
    page.eval(
        "document.getElementById('savepoint-name').value = '../elsewhere'; \
         document.getElementById('savepoint-button').click(); true",
    )
    .await;
    until(&mut page, "the refusal", "document.getElementById('savepoint-message').className === 'warn'").await;
    let refused = text(&mut page, "#savepoint-message").await;
    assert!(refused.contains("name"), "{refused}");

    let png = page.screenshot().await;
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 20_000, "a screenshot of {} bytes", png.len());

    // Nothing went wrong on the page but the refused name's 400.
    let refusal = |e: &String| e.starts_with("log: ") && e.contains("400") && e.contains("/api/savepoints");
    let errors: Vec<String> = page.errors().into_iter().filter(|e| !refusal(e)).collect();
    assert!(errors.is_empty(), "the page reported errors: {errors:#?}");

    // Without the token: the page asks for it and shows no data.
    page.eval("sessionStorage.clear(); true").await;
    page.navigate(&format!("http://{addr}/dashboard")).await;
    until(&mut page, "the token prompt", "!document.getElementById('login').hidden").await;
    assert_eq!(page.eval("document.querySelectorAll('#operators tbody tr').length").await, 0);
    assert_eq!(text(&mut page, "#job-state").await, "needs token");
    assert_eq!(page.eval("document.getElementById('savepoint-button').disabled").await, Value::Bool(true));

    slow.store(false, Ordering::Relaxed);
    handle.cancel().await.unwrap();
}

/// An operator of two inputs is drawn with its two input edges, each from
/// what feeds it and labelled with its side (the steps that tag the sides
/// and their union are not drawn), and the operators table has a line per
/// input under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_draws_a_join_with_both_input_edges() {
    let job = Job::new("joined-dashboard").with_admin("127.0.0.1:0").with_admin_token(TOKEN);
    let strategy = WatermarkStrategy::bounded_out_of_orderness(Duration::from_millis(200));
    let orders =
        job.source(Feed { partitions: 2, rate: 1_000.0 }).name("orders").with_timestamps(|o: &Order| o.2, strategy);
    let payments =
        job.source(Feed { partitions: 1, rate: 500.0 }).name("payments").with_timestamps(|o: &Order| o.2, strategy);
    orders
        .name("order times")
        .key_by(|o: &Order| o.0)
        .interval_join(&payments.name("payment times").key_by(|p: &Order| p.0))
        .between(-1_000, 1_000)
        .with_partitions(2)
        .join(|o: &Order, p: &Order| (o.0, o.1, p.1))
        .name("paid orders")
        .sink(Blackhole::new())
        .name("paid");
    let handle = job.spawn().unwrap();
    let addr = handle.admin_addr().unwrap();
    let browser = Browser::start(1440, 900).await;
    let mut page = browser.page().await;
    page.navigate(&format!("http://{addr}/dashboard#token={TOKEN}")).await;

    until(&mut page, "the join", "!!document.querySelector('#graph g.node[data-operator=\"paid orders\"]')").await;
    let drawn = page.eval("[...document.querySelectorAll('#graph g.node')].map(g => g.dataset.operator)").await;
    let drawn: Vec<&str> = drawn.as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(drawn, ["orders", "order times", "payments", "payment times", "paid orders", "paid"]);
    let into = page
        .eval(
            "[...document.querySelectorAll('#graph path.edge[data-to=\"paid orders\"]')]\
             .map(p => `${p.dataset.from} ${p.dataset.input}`).sort()",
        )
        .await;
    assert_eq!(into, serde_json::json!(["order times first input", "payment times second input"]));
    // Each side's label: its side and its rate.
    until(
        &mut page,
        "the sides' rates",
        "[...document.querySelectorAll('#graph text.edge-label')].filter(t => /^(first|second)\\d/.test(t.textContent.replace(/\\s/g, ''))).length === 2",
    )
    .await;
    let hidden = page.eval(LABELS_HIDDEN).await;
    assert_eq!(hidden, Value::Array(Vec::new()), "edge labels hidden or cut off");
    // A line per input under the join in the operators table.
    until(
        &mut page,
        "the join's inputs",
        "[...document.querySelectorAll('#operators tr.input[data-operator=\"paid orders\"]')].map(r => r.dataset.input).join() === 'first input,second input'",
    )
    .await;
    until(
        &mut page,
        "the pairs and what waits",
        "/pairs out/.test(document.querySelector('#operators tr.input[data-input=\"first input\"]').textContent) && \
         /entries in `left`/.test(document.querySelector('#operators tr.input[data-input=\"first input\"]').textContent)",
    )
    .await;
    let errors = page.errors();
    assert!(errors.is_empty(), "the page reported errors: {errors:#?}");
    handle.abort();
}
