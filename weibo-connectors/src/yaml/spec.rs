//! A pipeline file read into a checked description: every key known,
//! every value of its type, every expression compiled against the fields
//! of the records at its step, every name declared. All the problems are
//! collected, each at its line and column; nothing runs or connects here.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::agg::{AggKind, AggSpec};
use super::doc::{Diagnostic, Node, Pos, Spanned};
use super::expr::{self, Expr, Origin, Schema, closest};

/// A checked pipeline.
#[derive(Debug)]
pub struct Spec {
    /// The job's name.
    pub job: String,
    /// Checkpoint storage and interval.
    pub checkpoints: Option<(PathBuf, Duration)>,
    /// The admin API's address.
    pub admin: Option<String>,
    /// Records per batch on the job's edges.
    pub batch_size: Option<usize>,
    /// The sources, by name.
    pub sources: BTreeMap<String, SourceSpec>,
    /// The sinks, by name (declared and inline).
    pub sinks: BTreeMap<String, SinkSpec>,
    /// The steps of the pipeline, after its `from`.
    pub from: String,
    /// The steps.
    pub steps: Vec<Step>,
    /// The named streams (`streams:`), in the file's order: each read
    /// from a source or an earlier stream, and read by the pipeline or a
    /// later stream (`from:`, `join: { with: }`) like a source.
    pub streams: Vec<NamedStream>,
}

/// A stream declared under `streams:`: steps of its own, whose records
/// other steps read by its name.
#[derive(Debug)]
pub struct NamedStream {
    /// Its name.
    pub name: String,
    /// The source or stream it reads.
    pub from: String,
    /// Its steps (named `<stream>/<step>` unless `name:` says otherwise).
    pub steps: Vec<Step>,
    /// The fields of its records.
    pub schema: Schema,
}

impl Spec {
    /// The sources the job reads, the pipeline's first: those its steps
    /// and its streams read, directly or through other streams.
    pub fn source_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        let mut visit: Vec<&str> = vec![&self.from];
        visit.extend(joined(&self.steps));
        while let Some(name) = visit.pop() {
            if self.sources.contains_key(name) {
                if !names.iter().any(|n| n == name) {
                    names.push(name.to_string());
                }
            } else if let Some(s) = self.streams.iter().find(|s| s.name == name) {
                visit.push(&s.from);
                visit.extend(joined(&s.steps));
            }
        }
        // The pipeline's own source first, the others in the file's order.
        names.sort_by_key(|n| (*n != self.from, self.sources.keys().position(|k| k == n)));
        names
    }
}

/// The names `steps` join with.
fn joined(steps: &[Step]) -> impl Iterator<Item = &str> {
    steps.iter().filter_map(|s| match &s.kind {
        StepKind::Join(j) => Some(j.with.as_str()),
        _ => None,
    })
}

/// A source.
#[derive(Debug)]
pub struct SourceSpec {
    /// What it reads.
    pub kind: SourceKind,
    /// The fields of its records (open when not declared).
    pub schema: Schema,
    /// Event time from a field.
    pub event_time: Option<EventTime>,
    /// What happens to a record that does not decode.
    pub on_error: OnError,
}

/// Where records come from.
#[derive(Debug)]
pub enum SourceKind {
    /// Records computed from their index `i`.
    Generator {
        /// How many (`None`: without end).
        count: Option<u64>,
        /// Records per second (`None`: as fast as possible).
        rate: Option<f64>,
        /// Partitions.
        partitions: usize,
        /// Each field's expression over `i`.
        fields: Vec<Expr>,
    },
    /// JSON lines of a file.
    File {
        /// The file.
        path: PathBuf,
    },
    /// JSON records of Kafka topics.
    Kafka {
        /// The brokers.
        brokers: String,
        /// The topics.
        topics: Vec<String>,
        /// The consumer group.
        group: Option<String>,
        /// Read to the end of the topics as they were at the start, then stop.
        bounded: bool,
        /// Where to start without a checkpoint: `earliest` or `latest`.
        start_latest: bool,
    },
}

/// Event time from a field of the records.
#[derive(Debug, Clone)]
pub struct EventTime {
    /// The field's index.
    pub field: usize,
    /// The field's name.
    pub name: String,
    /// The bound on out-of-orderness (0: monotonous).
    pub max_out_of_orderness: Duration,
    /// A partition idle this long stops holding the watermark back.
    pub idle_after: Option<Duration>,
}

/// What a step does with a record that fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnError {
    /// The job fails, naming the record.
    Fail,
    /// The record is dropped (and counted).
    Skip,
    /// The record goes to the named sink, with the error.
    DeadLetter(String),
}

/// A sink.
#[derive(Debug)]
pub struct SinkSpec {
    /// Where it writes.
    pub kind: SinkKind,
    /// Where it is declared.
    pub pos: Pos,
}

/// Where records go.
#[derive(Debug)]
pub enum SinkKind {
    /// Lines of JSON on standard output.
    Stdout,
    /// Nowhere (counted).
    Blackhole,
    /// JSON lines in a file.
    File {
        /// The file.
        path: PathBuf,
    },
    /// JSON records to a Kafka topic, at least once, or exactly once in
    /// transactions committed with the checkpoints.
    Kafka {
        /// The brokers.
        brokers: String,
        /// The topic.
        topic: String,
        /// The records' key: an expression over the records where the
        /// sink is used (compiled there).
        key: Option<(String, Origin)>,
        /// Exactly once.
        exactly_once: bool,
    },
    /// Rows of a PostgreSQL table, appended or upserted, at least once or
    /// exactly once.
    Postgres {
        /// The connection string.
        url: String,
        /// The table.
        table: String,
        /// The columns, each the record's field of its name (default: the
        /// fields of the records at the sink's first use).
        columns: Option<Vec<String>>,
        /// Upsert by these columns instead of appending.
        upsert_keys: Vec<String>,
        /// The sink's id in the database (default: the table's name).
        id: Option<String>,
        /// In transactions committed with the checkpoints.
        exactly_once: bool,
    },
    /// Batches of JSON to an HTTP endpoint, at least once.
    Http {
        /// The endpoint.
        url: String,
        /// `PUT` instead of `POST`.
        put: bool,
        /// One JSON record per line instead of a JSON array.
        json_lines: bool,
        /// Headers of every request.
        headers: Vec<(String, String)>,
        /// Records per request.
        batch_records: Option<usize>,
    },
    /// JSON-lines part files in S3, exactly once.
    S3 {
        /// The bucket.
        bucket: String,
        /// The prefix of the parts.
        prefix: String,
        /// The endpoint of an S3-compatible service.
        endpoint: Option<String>,
        /// The region.
        region: Option<String>,
        /// Access key id and secret (default: the `AWS_*` variables).
        credentials: Option<(String, String)>,
        /// Plain HTTP and path-style URLs (a local server).
        local: bool,
    },
}

/// A step of the pipeline, with the schema of the records it gives.
#[derive(Debug)]
pub struct Step {
    /// What it does.
    pub kind: StepKind,
    /// Its name (the operator's name and id): `name:`, or the step's kind
    /// and position.
    pub name: String,
    /// Where it is.
    pub pos: Pos,
    /// The fields of the records it gives.
    pub schema: Schema,
}

/// What a step does.
#[derive(Debug)]
pub enum StepKind {
    /// Keeps the records the expression holds for.
    Filter(Expr, OnError),
    /// New fields, each an expression.
    Map(Vec<Expr>, OnError),
    /// Each record to the function registered under this name
    /// ([`crate::yaml::Pipeline::with_function`]), which gives zero or more
    /// records of the step's fields.
    Process(String, OnError),
    /// Keys the records (on so many partitions), under a failure policy
    /// for a key that does not evaluate.
    KeyBy(Expr, Option<usize>, OnError),
    /// Windows of keyed records, aggregated.
    Window {
        /// The windows.
        window: WindowSpec,
        /// The aggregates.
        aggregates: Vec<AggSpec>,
        /// How long after a window's end records still update it.
        allowed_lateness: Duration,
        /// Late records to this sink.
        late: Option<String>,
    },
    /// A running aggregate per key, emitted on every record.
    Aggregate(Vec<AggSpec>),
    /// To a sink (records go on to the next step too).
    To(String),
    /// Each record to the sink of the first case whose condition holds;
    /// the records no case takes go on.
    Route(Vec<(Expr, String)>, OnError),
    /// Joins the records with another source's, by key.
    Join(Box<JoinSpec>),
    /// A running reduce per key: each field's new value from the key's
    /// result so far (`acc`) and the new record (`event`), `None` for the
    /// new record's own; emitted on every record.
    Reduce(Vec<Option<Expr>>, OnError),
    /// Drops a record whose key was seen within a time bound (event time
    /// when the source has it).
    Dedup {
        /// The key.
        key: Expr,
        /// How long a key is remembered after its first record.
        within: Duration,
        /// Whether the bound is in event time.
        event_time: bool,
        /// Partitions of the keyed state.
        partitions: Option<usize>,
    },
}

/// A join of the stream (left) with another source's records (right).
#[derive(Debug)]
pub struct JoinSpec {
    /// The other source.
    pub with: String,
    /// The fields of its records.
    pub with_schema: Schema,
    /// This side's key.
    pub key: Expr,
    /// The other side's key.
    pub with_key: Expr,
    /// Which join.
    pub kind: JoinKind,
    /// Whether left records without a partner are emitted.
    pub left_outer: bool,
    /// Whether right records without a partner are emitted.
    pub right_outer: bool,
    /// Partitions of the join.
    pub partitions: Option<usize>,
    /// The fields of the results, over `left` and `right`.
    pub select: Vec<Expr>,
    /// What happens to a result whose `select` does not evaluate.
    pub on_error: OnError,
}

/// The kinds of join.
#[derive(Debug, Clone, Copy)]
pub enum JoinKind {
    /// Pairs whose right time is within `[lower, upper]` ms of the left's.
    Interval {
        /// Lower bound, ms (may be negative).
        lower: i64,
        /// Upper bound, ms.
        upper: i64,
    },
    /// Pairs within the same window.
    Window(WindowSpec, Duration),
    /// Each left record with its key's right row at its time (the right
    /// source is the table's changelog).
    Temporal {
        /// How long old versions are kept behind the watermark.
        retention: Option<Duration>,
    },
}

/// A window assigner.
#[derive(Debug, Clone, Copy)]
pub enum WindowSpec {
    /// Fixed windows.
    Tumbling(Duration),
    /// Overlapping windows.
    Sliding(Duration, Duration),
    /// Windows of activity separated by a gap.
    Session(Duration),
}

/// A use of a sink: by name, where, with the fields of its records.
struct Use {
    sink: String,
    pos: Pos,
    schema: Schema,
}

/// The fields of a dead letter: the record (as a map), the error, the
/// failing step, and where the record came from.
pub fn dead_letter_schema(_record: &Schema) -> Schema {
    Schema::of(["record", "error", "step", "source", "partition", "offset"])
}

/// The fields of a record that failed to decode: its text.
fn raw_schema() -> Schema {
    Schema::of(["text"])
}

/// The keys a pipeline file's top level may have.
const TOP: &[&str] = &["job", "checkpoints", "admin", "batch_size", "sources", "streams", "pipeline", "sinks"];
const SOURCE_KINDS: &[&str] = &["generator", "file", "kafka"];
const SOURCE_KEYS: &[&str] = &["generator", "file", "kafka", "schema", "event_time", "on_error"];
const SINK_KINDS: &[&str] = &["stdout", "blackhole", "file", "kafka", "kafka_exactly_once", "postgres", "http", "s3"];
const STEP_KINDS: &[&str] =
    &["from", "filter", "map", "process", "key_by", "window", "aggregate", "reduce", "dedup", "route", "join", "to"];

/// Reads and checks a parsed pipeline file. `env` gives environment
/// variables for `${NAME}` in strings; relative paths are taken from
/// `base` (the file's folder) when there is one.
///
/// # Errors
/// Every problem found, in the file's order.
pub fn check(
    root: &Spanned,
    env: &dyn Fn(&str) -> Option<String>,
    base: Option<&std::path::Path>,
) -> Result<Spec, Vec<Diagnostic>> {
    let mut cx = Cx { errors: Vec::new(), env, base, step_names: BTreeMap::new(), stream_names: Vec::new() };
    let spec = cx.top(root);
    if cx.errors.is_empty()
        && let Some(spec) = spec
    {
        return Ok(spec);
    }
    let mut errors = cx.errors;
    errors.sort_by_key(|d| d.pos);
    errors.dedup();
    Err(errors)
}

struct Cx<'e> {
    errors: Vec<Diagnostic>,
    env: &'e dyn Fn(&str) -> Option<String>,
    base: Option<&'e std::path::Path>,
    /// The steps' names so far (they are operator ids: one per job).
    step_names: BTreeMap<String, Pos>,
    /// The names declared under `streams:`.
    stream_names: Vec<String>,
}

/// The steps of the pipeline or of a named stream, checked.
struct Flow {
    /// What they read.
    from: Option<String>,
    steps: Vec<Step>,
    /// The fields of the records they give.
    schema: Schema,
    /// Whether those records have event time.
    timed: bool,
}

/// A mapping whose keys were checked against the known ones.
struct Fields<'a> {
    node: &'a Spanned,
    entries: &'a [(Spanned<String>, Spanned)],
}

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Option<&'a Spanned> {
        self.entries.iter().find(|(k, _)| k.node == key).map(|(_, v)| v)
    }

    fn key_pos(&self, key: &str) -> Pos {
        self.entries.iter().find(|(k, _)| k.node == key).map_or(self.node.pos, |(k, _)| k.pos)
    }
}

impl Cx<'_> {
    fn err(&mut self, pos: Pos, message: impl Into<String>) {
        self.errors.push(Diagnostic::new(pos, message));
    }

    fn err_help(&mut self, pos: Pos, message: impl Into<String>, help: impl Into<String>) {
        self.errors.push(Diagnostic::new(pos, message).help(help));
    }

    /// `node` as a mapping of `known` keys; an unknown key is an error
    /// with the nearest known one.
    fn map<'a>(&mut self, node: &'a Spanned, what: &str, known: &[&str]) -> Option<Fields<'a>> {
        let Some(entries) = node.as_map() else {
            self.err_help(
                node.pos,
                format!("{what} is {}, not a mapping", node.kind()),
                format!("write its keys: {}", known.join(", ")),
            );
            return None;
        };
        for (k, _) in entries {
            if !known.contains(&k.node.as_str()) {
                let help = match closest(&k.node, known.iter().copied()) {
                    Some(near) => format!("did you mean `{near}`? The keys of {what} are: {}", known.join(", ")),
                    None => format!("the keys of {what} are: {}", known.join(", ")),
                };
                self.err_help(k.pos, format!("unknown key `{}` in {what}", k.node), help);
            }
        }
        Some(Fields { node, entries })
    }

    fn required<'a>(&mut self, fields: &Fields<'a>, key: &str, what: &str) -> Option<&'a Spanned> {
        let value = fields.get(key);
        if value.is_none() {
            self.err_help(fields.node.pos, format!("{what} has no `{key}`"), format!("add `{key}:`"));
        }
        value
    }

    /// A string, with `${NAME}` replaced by the environment variable.
    fn string(&mut self, node: &Spanned, what: &str) -> Option<String> {
        let Some(text) = node.as_str() else {
            self.err(node.pos, format!("{what} is {}, not a string", node.kind()));
            return None;
        };
        let mut out = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(rest.get(..start).unwrap_or_default());
            let after = rest.get(start + 2..).unwrap_or_default();
            let Some(end) = after.find('}') else {
                self.err_help(
                    node.pos,
                    format!("{what}: `${{` without its `}}`"),
                    "write `${NAME}` for the environment variable NAME",
                );
                return None;
            };
            let name = after.get(..end).unwrap_or_default();
            match (self.env)(name) {
                Some(value) => out.push_str(&value),
                None => {
                    self.err_help(
                        node.pos,
                        format!("{what}: the environment variable `{name}` is not set"),
                        format!("set {name} before running the pipeline"),
                    );
                    return None;
                }
            }
            rest = after.get(end + 1..).unwrap_or_default();
        }
        out.push_str(rest);
        Some(out)
    }

    /// A path of the file: relative ones from the file's folder.
    fn path(&self, text: String) -> PathBuf {
        let path = PathBuf::from(text);
        match self.base {
            Some(base) if path.is_relative() => base.join(path),
            _ => path,
        }
    }

    fn integer(&mut self, node: &Spanned, what: &str, min: u64) -> Option<u64> {
        let text = node.as_str().unwrap_or_default().replace('_', "");
        match text.parse::<u64>() {
            Ok(n) if n >= min => Some(n),
            _ => {
                self.err(
                    node.pos,
                    format!(
                        "{what} is `{}`, not a whole number of at least {min}",
                        node.as_str().unwrap_or(node.kind())
                    ),
                );
                None
            }
        }
    }

    fn boolean(&mut self, node: &Spanned, what: &str) -> Option<bool> {
        match node.as_str() {
            Some("true") => Some(true),
            Some("false") => Some(false),
            _ => {
                self.err(node.pos, format!("{what} is `{}`, not true or false", node.as_str().unwrap_or(node.kind())));
                None
            }
        }
    }

    fn duration(&mut self, node: &Spanned, what: &str) -> Option<Duration> {
        let text = node.as_str().unwrap_or_default();
        match parse_duration(text) {
            Some(d) => Some(d),
            None => {
                self.err_help(
                    node.pos,
                    format!("{what} is `{}`, not a duration", node.as_str().unwrap_or(node.kind())),
                    "write a number and a unit: 500ms, 10s, 1m, 2h, 1d",
                );
                None
            }
        }
    }

    fn expr(&mut self, node: &Spanned, schema: &Schema, what: &str) -> Option<Expr> {
        let Some(text) = node.as_str() else {
            self.err_help(
                node.pos,
                format!("{what} is {}, not an expression", node.kind()),
                "write a CEL expression, quoted: \"event.amount > 0\"",
            );
            return None;
        };
        let quoted = matches!(node.node, Node::Scalar { plain: false, .. });
        match expr::compile(text, schema, Origin { pos: node.pos, quoted }) {
            Ok(e) => Some(e),
            Err(errors) => {
                self.errors.extend(errors);
                None
            }
        }
    }

    fn on_error(&mut self, node: Option<&Spanned>, schema: &Schema, used: &mut Vec<Use>) -> OnError {
        let Some(node) = node else {
            return OnError::Fail;
        };
        match node.as_str() {
            Some("fail") => OnError::Fail,
            Some("skip") => OnError::Skip,
            Some("dead_letter") => {
                used.push(Use { sink: "dead_letters".into(), pos: node.pos, schema: dead_letter_schema(schema) });
                OnError::DeadLetter("dead_letters".into())
            }
            Some(other) if other.starts_with("dead_letter:") => {
                let sink = other.trim_start_matches("dead_letter:").trim().to_string();
                used.push(Use { sink: sink.clone(), pos: node.pos, schema: dead_letter_schema(schema) });
                OnError::DeadLetter(sink)
            }
            _ => {
                self.err_help(
                    node.pos,
                    format!("on_error is `{}`", node.as_str().unwrap_or(node.kind())),
                    "write fail (the default), skip, dead_letter (to the sink `dead_letters`) or dead_letter: <sink>",
                );
                OnError::Fail
            }
        }
    }

    fn top(&mut self, root: &Spanned) -> Option<Spec> {
        let top = self.map(root, "a pipeline file", TOP)?;
        let job = self.required(&top, "job", "the pipeline file").and_then(|n| self.string(n, "job"));
        let checkpoints = top.get("checkpoints").and_then(|node| {
            let f = self.map(node, "checkpoints", &["storage", "interval"])?;
            let storage =
                self.required(&f, "storage", "checkpoints").and_then(|n| self.string(n, "checkpoints.storage"));
            let interval = match f.get("interval") {
                Some(n) => self.duration(n, "checkpoints.interval"),
                None => Some(Duration::from_secs(10)),
            };
            Some((self.path(storage?), interval?))
        });
        let admin = top.get("admin").and_then(|n| self.string(n, "admin"));
        let batch_size = top.get("batch_size").and_then(|n| self.integer(n, "batch_size", 1)).map(|n| n as usize);
        let mut sinks = BTreeMap::new();
        if let Some(node) = top.get("sinks") {
            match node.as_map() {
                Some(entries) => {
                    for (name, def) in entries {
                        if let Some(sink) = self.sink(def, &format!("sink `{}`", name.node)) {
                            sinks.insert(name.node.clone(), sink);
                        }
                    }
                }
                None => self.err(node.pos, format!("sinks is {}, not a mapping of names to sinks", node.kind())),
            }
        }
        let mut sources = BTreeMap::new();
        // Every source's fields, that of a source with errors too: the
        // steps after it are checked against them.
        let mut declared_sources: BTreeMap<String, (Schema, bool)> = BTreeMap::new();
        let mut used = Vec::new();
        match top.get("sources") {
            Some(node) => {
                if let Some(entries) = node.as_map() {
                    for (name, def) in entries {
                        let timed = def.as_map().is_some_and(|m| m.iter().any(|(k, _)| k.node == "event_time"));
                        declared_sources.insert(name.node.clone(), (declared_schema(def), timed));
                        if let Some(source) = self.source(def, &name.node, &mut used) {
                            sources.insert(name.node.clone(), source);
                        }
                    }
                } else {
                    self.err(node.pos, format!("sources is {}, not a mapping of names to sources", node.kind()));
                }
            }
            None => self.err_help(
                root.pos,
                "the pipeline has no `sources`",
                "declare at least one: sources: { name: { generator: {...} } }",
            ),
        }
        let mut streams = Vec::new();
        if let Some(node) = top.get("streams") {
            match node.as_map() {
                Some(entries) => {
                    self.stream_names = entries.iter().map(|(k, _)| k.node.clone()).collect();
                    for (name, def) in entries {
                        if declared_sources.contains_key(&name.node) {
                            self.err_help(
                                name.pos,
                                format!("a source and a stream are both named `{}`", name.node),
                                "give the stream a name of its own",
                            );
                            continue;
                        }
                        let flow = self.steps(def, &declared_sources, &mut sinks, &mut used, Some(&name.node));
                        let (schema, timed) =
                            flow.as_ref().map_or((Schema::open(), false), |f| (f.schema.clone(), f.timed));
                        declared_sources.insert(name.node.clone(), (schema.clone(), timed));
                        if let Some(Flow { from: Some(from), steps, .. }) = flow {
                            streams.push(NamedStream { name: name.node.clone(), from, steps, schema });
                        }
                    }
                }
                None => self.err_help(
                    node.pos,
                    format!("streams is {}, not a mapping of names to lists of steps", node.kind()),
                    "write streams: { valid: [ { from: clicks }, { filter: \"event.amount > 0\" } ] }",
                ),
            }
        }
        let pipeline = self.required(&top, "pipeline", "the pipeline file")?;
        let Flow { from, steps, .. } = self.steps(pipeline, &declared_sources, &mut sinks, &mut used, None)?;
        if let Some(entries) = top.get("streams").and_then(Spanned::as_map) {
            let mut read: Vec<&str> = from.iter().map(String::as_str).chain(joined(&steps)).collect();
            for s in &streams {
                read.push(&s.from);
                read.extend(joined(&s.steps));
            }
            for (name, _) in entries {
                if !read.contains(&name.node.as_str()) && streams.iter().any(|s| s.name == name.node) {
                    self.err_help(
                        name.pos,
                        format!("stream `{}` is read by no step", name.node),
                        format!("read it with `from: {0}` or `join: {{ with: {0}, ... }}`, or remove it", name.node),
                    );
                }
            }
        }
        for Use { sink, pos, schema } in &used {
            match sinks.get(sink) {
                Some(SinkSpec { kind: SinkKind::Kafka { key: Some((text, origin)), .. }, .. }) => {
                    if let Err(errors) = expr::compile(text, schema, *origin) {
                        self.errors.extend(errors);
                    }
                }
                Some(_) => {}
                None => {
                    let names: Vec<&str> = sinks.keys().map(String::as_str).collect();
                    let help = match closest(sink, names.iter().copied()) {
                        Some(near) => format!("did you mean `{near}`?"),
                        None => format!(
                            "declare it under `sinks:` (declared: {})",
                            if names.is_empty() { "none".into() } else { names.join(", ") }
                        ),
                    };
                    self.err_help(*pos, format!("no sink named `{sink}`"), help);
                }
            }
        }
        for (name, sink) in &sinks {
            let exactly_once = matches!(
                sink.kind,
                SinkKind::Kafka { exactly_once: true, .. }
                    | SinkKind::Postgres { exactly_once: true, .. }
                    | SinkKind::S3 { .. }
            );
            if exactly_once && checkpoints.is_none() && top.get("checkpoints").is_none() {
                self.err_help(
                    sink.pos,
                    format!("sink `{name}` writes exactly once, which needs checkpoints"),
                    "add checkpoints: { storage: <dir>, interval: 1s }",
                );
            }
        }
        Some(Spec { job: job?, checkpoints, admin, batch_size, sources, sinks, from: from?, steps, streams })
    }

    fn source(&mut self, node: &Spanned, name: &str, used: &mut Vec<Use>) -> Option<SourceSpec> {
        let what = format!("source `{name}`");
        let f = self.map(node, &what, SOURCE_KEYS)?;
        let kinds: Vec<&str> = SOURCE_KINDS.iter().copied().filter(|k| f.get(k).is_some()).collect();
        let declared = match f.get("schema") {
            Some(n) => match n.as_seq() {
                Some(items) => {
                    let names: Vec<String> = items.iter().filter_map(|i| self.string(i, "a schema field")).collect();
                    Some(Schema::of(names))
                }
                None => {
                    self.err_help(
                        n.pos,
                        format!("the schema of {what} is {}", n.kind()),
                        "list the records' fields: schema: [user, amount, ts]",
                    );
                    None
                }
            },
            None => None,
        };
        let (kind, schema) = match kinds.as_slice() {
            ["generator"] => {
                let g = self.map(f.get("generator")?, "a generator", &["count", "rate", "partitions", "fields"])?;
                let count = g.get("count").and_then(|n| self.integer(n, "count", 0));
                let rate = g.get("rate").and_then(|n| match n.as_str().and_then(|t| t.parse::<f64>().ok()) {
                    Some(r) if r > 0.0 && r.is_finite() => Some(r),
                    _ => {
                        self.err(n.pos, "rate is not a positive number of records per second");
                        None
                    }
                });
                let partitions =
                    g.get("partitions").and_then(|n| self.integer(n, "partitions", 1)).unwrap_or(1) as usize;
                let index = Schema { fields: vec![Arc::from("i")], open: false, bare: true, roots: Vec::new() };
                let mut names = Vec::new();
                let mut exprs = Vec::new();
                match self.required(&g, "fields", "a generator").and_then(Spanned::as_map) {
                    Some(entries) => {
                        (names, exprs) = self.fields(entries, &index);
                    }
                    None => self.err(g.node.pos, "a generator's fields are a mapping of names to expressions over `i`"),
                }
                (Some(SourceKind::Generator { count, rate, partitions, fields: exprs }), Schema::of(names))
            }
            ["file"] => {
                let fl = self.map(f.get("file")?, "a file source", &["path", "format"])?;
                let path = self.required(&fl, "path", "a file source").and_then(|n| self.string(n, "path"));
                self.format(fl.get("format"));
                (path.map(|p| SourceKind::File { path: self.path(p) }), declared.clone().unwrap_or_else(Schema::open))
            }
            ["kafka"] => {
                let k = self.map(
                    f.get("kafka")?,
                    "a Kafka source",
                    &["brokers", "topic", "topics", "group", "format", "bounded", "start"],
                )?;
                let brokers = self.required(&k, "brokers", "a Kafka source").and_then(|n| self.string(n, "brokers"));
                let mut topics = Vec::new();
                if let Some(t) = k.get("topic").and_then(|n| self.string(n, "topic")) {
                    topics.push(t);
                }
                if let Some(list) = k.get("topics").and_then(Spanned::as_seq) {
                    topics.extend(list.iter().filter_map(|n| self.string(n, "a topic")));
                }
                if topics.is_empty() {
                    self.err_help(k.node.pos, "a Kafka source has no `topic`", "add topic: <name> (or topics: [a, b])");
                }
                let group = k.get("group").and_then(|n| self.string(n, "group"));
                let bounded = k.get("bounded").and_then(|n| self.boolean(n, "bounded")).unwrap_or(false);
                let start_latest = match k.get("start").map(|n| (n.as_str(), n.pos)) {
                    None | Some((Some("earliest"), _)) => false,
                    Some((Some("latest"), _)) => true,
                    Some((other, pos)) => {
                        self.err_help(pos, format!("start is `{}`", other.unwrap_or("?")), "write earliest or latest");
                        false
                    }
                };
                self.format(k.get("format"));
                (
                    brokers.map(|brokers| SourceKind::Kafka { brokers, topics, group, bounded, start_latest }),
                    declared.clone().unwrap_or_else(Schema::open),
                )
            }
            [] => {
                self.err_help(
                    node.pos,
                    format!("{what} says nothing to read"),
                    format!("give it one of: {}", SOURCE_KINDS.join(", ")),
                );
                return None;
            }
            many => {
                self.err(
                    f.key_pos(many.get(1).copied().unwrap_or_default()),
                    format!("{what} has several kinds: {}; a source has one", many.join(", ")),
                );
                return None;
            }
        };
        let schema = match (&kind, declared) {
            (Some(SourceKind::Generator { .. }), Some(_)) => {
                self.err(f.key_pos("schema"), "a generator's schema is its fields; remove `schema`");
                schema
            }
            _ => schema,
        };
        let event_time = f.get("event_time").and_then(|n| {
            let t = self.map(n, "event_time", &["field", "max_out_of_orderness", "idle_after"])?;
            let field_node = self.required(&t, "field", "event_time")?;
            let field = self.string(field_node, "event_time.field")?;
            let index = if schema.open {
                self.err_help(
                    field_node.pos,
                    "event time from a field needs the source's fields",
                    format!("declare them: schema: [..., {field}]"),
                );
                return None;
            } else {
                match schema.index(&field) {
                    Some(i) => i,
                    None => {
                        let help = match closest(&field, schema.fields.iter().map(|f| &**f)) {
                            Some(near) => format!("did you mean `{near}`? The fields are: {schema}"),
                            None => format!("the fields are: {schema}"),
                        };
                        self.err_help(field_node.pos, format!("no field `{field}` in source `{name}`"), help);
                        return None;
                    }
                }
            };
            let bound = match t.get("max_out_of_orderness") {
                Some(n) => self.duration(n, "max_out_of_orderness")?,
                None => Duration::ZERO,
            };
            let idle = match t.get("idle_after") {
                Some(n) => Some(self.duration(n, "idle_after")?),
                None => None,
            };
            Some(EventTime { field: index, name: field, max_out_of_orderness: bound, idle_after: idle })
        });
        let on_error = self.on_error(f.get("on_error"), &raw_schema(), used);
        Some(SourceSpec { kind: kind?, schema, event_time, on_error })
    }

    fn format(&mut self, node: Option<&Spanned>) {
        if let Some(n) = node
            && n.as_str() != Some("json")
        {
            self.err_help(
                n.pos,
                format!("format `{}` is not known", n.as_str().unwrap_or(n.kind())),
                "write json (the only format yet)",
            );
        }
    }

    fn sink(&mut self, node: &Spanned, what: &str) -> Option<SinkSpec> {
        let f = self.map(node, what, SINK_KINDS)?;
        let Some((kind_key, body)) = f.entries.first().map(|(k, v)| (k.node.as_str(), v)) else {
            self.err_help(
                node.pos,
                format!("{what} says nowhere to write"),
                format!("give it one of: {}", SINK_KINDS.join(", ")),
            );
            return None;
        };
        if f.entries.len() > 1 {
            self.err(
                f.entries.get(1).map_or(node.pos, |(k, _)| k.pos),
                format!("{what} has several kinds; a sink has one"),
            );
        }
        let kind = match kind_key {
            "stdout" => {
                self.empty(body, "stdout");
                SinkKind::Stdout
            }
            "blackhole" => {
                self.empty(body, "blackhole");
                SinkKind::Blackhole
            }
            "file" => {
                let fl = self.map(body, "a file sink", &["path", "format"])?;
                let path = self.required(&fl, "path", "a file sink").and_then(|n| self.string(n, "path"));
                self.format(fl.get("format"));
                SinkKind::File { path: self.path(path?) }
            }
            "kafka" | "kafka_exactly_once" => {
                let k = self.map(body, "a Kafka sink", &["brokers", "topic", "key", "format"])?;
                let brokers = self.required(&k, "brokers", "a Kafka sink").and_then(|n| self.string(n, "brokers"));
                let topic = self.required(&k, "topic", "a Kafka sink").and_then(|n| self.string(n, "topic"));
                self.format(k.get("format"));
                // The key's expression is compiled where the sink is used
                // (its fields are those of the step before it).
                let key = k.get("key").and_then(|n| match n.as_str() {
                    Some(text) => Some((
                        text.to_string(),
                        Origin { pos: n.pos, quoted: matches!(n.node, Node::Scalar { plain: false, .. }) },
                    )),
                    None => {
                        self.err(n.pos, format!("key is {}, not an expression", n.kind()));
                        None
                    }
                });
                SinkKind::Kafka {
                    brokers: brokers?,
                    topic: topic?,
                    key,
                    exactly_once: kind_key == "kafka_exactly_once",
                }
            }
            "postgres" => {
                let known = ["url", "table", "columns", "upsert_keys", "id", "exactly_once"];
                let p = self.map(body, "a Postgres sink", &known)?;
                let url = self.required(&p, "url", "a Postgres sink").and_then(|n| self.string(n, "url"));
                let table = self.required(&p, "table", "a Postgres sink").and_then(|n| self.string(n, "table"));
                let columns = p.get("columns").map(|n| self.names(n, "columns"));
                let upsert_keys = p.get("upsert_keys").map(|n| self.names(n, "upsert_keys")).unwrap_or_default();
                let id = p.get("id").and_then(|n| self.string(n, "id"));
                let exactly_once = p.get("exactly_once").and_then(|n| self.boolean(n, "exactly_once")).unwrap_or(false);
                SinkKind::Postgres { url: url?, table: table?, columns, upsert_keys, id, exactly_once }
            }
            "http" => {
                let h = self.map(body, "an HTTP sink", &["url", "method", "format", "headers", "batch_records"])?;
                let url = self.required(&h, "url", "an HTTP sink").and_then(|n| self.string(n, "url"));
                let put = match h.get("method").map(|n| (n.as_str(), n.pos)) {
                    None | Some((Some("POST"), _)) => false,
                    Some((Some("PUT"), _)) => true,
                    Some((other, pos)) => {
                        self.err_help(pos, format!("method `{}`", other.unwrap_or("?")), "write POST or PUT");
                        false
                    }
                };
                let json_lines = match h.get("format").map(|n| (n.as_str(), n.pos)) {
                    None | Some((Some("json"), _)) => false,
                    Some((Some("json_lines"), _)) => true,
                    Some((other, pos)) => {
                        self.err_help(
                            pos,
                            format!("format `{}` is not known", other.unwrap_or("?")),
                            "write json (an array per request) or json_lines",
                        );
                        false
                    }
                };
                let mut headers = Vec::new();
                if let Some(n) = h.get("headers") {
                    match n.as_map() {
                        Some(entries) => {
                            for (k, v) in entries {
                                if let Some(v) = self.string(v, &format!("header `{}`", k.node)) {
                                    headers.push((k.node.clone(), v));
                                }
                            }
                        }
                        None => self.err(n.pos, format!("headers is {}, not a mapping of names to values", n.kind())),
                    }
                }
                let batch_records =
                    h.get("batch_records").and_then(|n| self.integer(n, "batch_records", 1)).map(|n| n as usize);
                SinkKind::Http { url: url?, put, json_lines, headers, batch_records }
            }
            "s3" => {
                let known =
                    ["bucket", "prefix", "endpoint", "region", "access_key_id", "secret_access_key", "local", "format"];
                let o = self.map(body, "an S3 sink", &known)?;
                let bucket = self.required(&o, "bucket", "an S3 sink").and_then(|n| self.string(n, "bucket"));
                let prefix = self.required(&o, "prefix", "an S3 sink").and_then(|n| self.string(n, "prefix"));
                let endpoint = o.get("endpoint").and_then(|n| self.string(n, "endpoint"));
                let region = o.get("region").and_then(|n| self.string(n, "region"));
                let key = o.get("access_key_id").and_then(|n| self.string(n, "access_key_id"));
                let secret = o.get("secret_access_key").and_then(|n| self.string(n, "secret_access_key"));
                if key.is_some() != secret.is_some() {
                    self.err_help(
                        o.node.pos,
                        "an S3 sink with one of access_key_id and secret_access_key",
                        "give both, or neither (the AWS_* variables)",
                    );
                }
                let local = o.get("local").and_then(|n| self.boolean(n, "local")).unwrap_or(false);
                self.format(o.get("format"));
                SinkKind::S3 { bucket: bucket?, prefix: prefix?, endpoint, region, credentials: key.zip(secret), local }
            }
            _ => return None,
        };
        Some(SinkSpec { kind, pos: node.pos })
    }

    /// The names of a mapping of fields to expressions over the records
    /// of `schema`, and the expressions that compiled.
    fn fields(&mut self, entries: &[(Spanned<String>, Spanned)], schema: &Schema) -> (Vec<String>, Vec<Expr>) {
        let mut names = Vec::new();
        let mut exprs = Vec::new();
        for (field, e) in entries {
            names.push(field.node.clone());
            if let Some(e) = self.expr(e, schema, &format!("field `{}`", field.node)) {
                exprs.push(e);
            }
        }
        (names, exprs)
    }

    /// A list of names.
    fn names(&mut self, node: &Spanned, what: &str) -> Vec<String> {
        match node.as_seq() {
            Some(items) => items.iter().filter_map(|i| self.string(i, what)).collect(),
            None => {
                self.err_help(
                    node.pos,
                    format!("{what} is {}, not a list", node.kind()),
                    format!("write {what}: [a, b]"),
                );
                Vec::new()
            }
        }
    }

    fn empty(&mut self, node: &Spanned, what: &str) {
        if !(node.is_null() || node.as_map().is_some_and(<[_]>::is_empty)) {
            self.err(node.pos, format!("{what} takes no options; write {what}: {{}}"));
        }
    }

    fn steps(
        &mut self,
        node: &Spanned,
        sources: &BTreeMap<String, (Schema, bool)>,
        sinks: &mut BTreeMap<String, SinkSpec>,
        used: &mut Vec<Use>,
        stream: Option<&str>,
    ) -> Option<Flow> {
        let what = stream.map_or_else(|| "pipeline".to_string(), |s| format!("stream `{s}`"));
        let Some(items) = node.as_seq() else {
            self.err_help(
                node.pos,
                format!("{what} is {}, not a list of steps", node.kind()),
                "write one step per line, starting with `- from: <source>`",
            );
            return None;
        };
        let mut from = None;
        let mut schema = Schema::open();
        let mut keyed = false;
        let mut steps = Vec::new();
        let mut has_to = false;
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        let mut event_time = false;
        for (index, item) in items.iter().enumerate() {
            let Some(entries) = item.as_map() else {
                self.err_help(
                    item.pos,
                    format!("step {} is {}, not a mapping", index + 1, item.kind()),
                    format!("a step starts with one of: {}", STEP_KINDS.join(", ")),
                );
                continue;
            };
            let kinds: Vec<&(Spanned<String>, Spanned)> =
                entries.iter().filter(|(k, _)| STEP_KINDS.contains(&k.node.as_str())).collect();
            // `window` and `aggregate` go together in one step.
            let window_step = kinds.iter().any(|(k, _)| k.node == "window");
            let chosen = if window_step { kinds.iter().find(|(k, _)| k.node == "window") } else { kinds.first() };
            let Some((kind, body)) = chosen.map(|(k, v)| (k, v)) else {
                let first = entries.first().map_or(item.pos, |(k, _)| k.pos);
                let written = entries.first().map_or("", |(k, _)| k.node.as_str());
                let help = match closest(written, STEP_KINDS.iter().copied()) {
                    Some(near) => format!("did you mean `{near}`? A step is one of: {}", STEP_KINDS.join(", ")),
                    None => format!("a step is one of: {}", STEP_KINDS.join(", ")),
                };
                self.err_help(
                    first,
                    format!("step {} does nothing: no `{}`", index + 1, STEP_KINDS.join("`, `")),
                    help,
                );
                continue;
            };
            let extra: &[&str] = match kind.node.as_str() {
                "filter" | "map" | "route" | "process" => &["on_error", "name"],
                "join" => &["select", "on_error", "name"],
                "key_by" => &["partitions", "on_error", "name"],
                "window" => &["aggregate", "name"],
                "aggregate" => &["name"],
                "reduce" => &["on_error", "name"],
                _ => &["name"],
            };
            let mut known: Vec<&str> = vec![kind.node.as_str()];
            known.extend_from_slice(extra);
            let what = format!("the `{}` step", kind.node);
            let Some(f) = self.map(item, &what, &known) else {
                continue;
            };
            // A step's name is its operator's name and, for a step with
            // state, the id its state is restored by: by default its kind,
            // numbered from the second step of the kind on, so that moving
            // steps around in the file keeps their state; in a named
            // stream, after the stream's name (`valid/filter`).
            let name = match f.get("name") {
                Some(n) => self.string(n, "name").unwrap_or_default(),
                None => {
                    let count = counts.entry(kind.node.clone()).or_insert(0usize);
                    *count += 1;
                    let plain = if *count == 1 { kind.node.clone() } else { format!("{}-{count}", kind.node) };
                    stream.map_or_else(|| plain.clone(), |s| format!("{s}/{plain}"))
                }
            };
            let at = f.get("name").map_or(kind.pos, |n| n.pos);
            if kind.node != "from"
                && let Some(first) = self.step_names.insert(name.clone(), at)
            {
                self.step_names.insert(name.clone(), first);
                self.err_help(
                    at,
                    format!("two steps are named `{name}` (the first at line {})", first.line),
                    "give each step its own name: a step's name is its operator's id",
                );
            }
            if keyed && !matches!(kind.node.as_str(), "window" | "aggregate" | "reduce") {
                self.err_help(
                    kind.pos,
                    format!("`{}` after `key_by`", kind.node),
                    "a `key_by` step is followed by `window` (with `aggregate`), `aggregate` or `reduce`",
                );
            }
            if index == 0 && kind.node != "from" {
                self.err_help(kind.pos, "a pipeline starts with `from`", "write `- from: <source>` as its first step");
            }
            let out = match (kind.node.as_str(), window_step) {
                ("from", _) => {
                    if index > 0 {
                        self.err(kind.pos, "`from` is the first step only");
                        continue;
                    }
                    let Some(source) = self.string(body, "from") else { continue };
                    match sources.get(&source) {
                        Some((s, timed)) => {
                            schema = s.clone();
                            event_time = *timed;
                        }
                        None => self.unknown_input(body.pos, &source, sources, stream),
                    }
                    from = Some(source);
                    continue;
                }
                ("filter", _) => {
                    let e = self.expr(body, &schema, "filter");
                    let policy = self.on_error(f.get("on_error"), &schema, used);
                    e.map(|e| (StepKind::Filter(e, policy), schema.clone()))
                }
                ("map", _) => {
                    let Some(entries) = body.as_map() else {
                        self.err_help(
                            body.pos,
                            format!("map is {}", body.kind()),
                            "write the new fields: map: { user: \"event.user\", cents: \"event.amount * 100\" }",
                        );
                        continue;
                    };
                    let (names, exprs) = self.fields(entries, &schema);
                    let policy = self.on_error(f.get("on_error"), &schema, used);
                    (exprs.len() == names.len()).then(|| (StepKind::Map(exprs, policy), Schema::of(names)))
                }
                ("process", _) => {
                    let Some(p) = self.map(body, "process", &["function", "gives"]) else { continue };
                    let function = self.required(&p, "function", "process").and_then(|n| self.string(n, "function"));
                    let gives = self.required(&p, "gives", "process").map(|n| self.names(n, "gives"));
                    let policy = self.on_error(f.get("on_error"), &schema, used);
                    let listed = p.get("gives").is_some_and(|n| n.as_seq().is_some());
                    match (function, gives) {
                        (_, Some(gives)) if listed && gives.is_empty() => {
                            self.err_help(
                                p.key_pos("gives"),
                                "a process step that gives no fields",
                                "list the fields of the records it gives: gives: [user, country]",
                            );
                            None
                        }
                        (Some(function), Some(gives)) if !gives.is_empty() => {
                            let mut seen = std::collections::BTreeSet::new();
                            if let Some(twice) = gives.iter().find(|g| !seen.insert(g.as_str())) {
                                self.err_help(
                                    p.key_pos("gives"),
                                    format!("`{twice}` is listed twice in gives"),
                                    "list each field once",
                                );
                                None
                            } else {
                                Some((StepKind::Process(function, policy), Schema::of(gives)))
                            }
                        }
                        _ => None,
                    }
                }
                ("key_by", _) => {
                    let e = self.expr(body, &schema, "key_by");
                    let partitions =
                        f.get("partitions").and_then(|n| self.integer(n, "partitions", 1)).map(|n| n as usize);
                    let policy = self.on_error(f.get("on_error"), &schema, used);
                    keyed = true;
                    e.map(|e| (StepKind::KeyBy(e, partitions, policy), schema.clone()))
                }
                ("window", _) => {
                    if !keyed {
                        self.err_help(
                            kind.pos,
                            "a window on records without a key",
                            "put a `key_by` step before it (key_by: \"event.user\")",
                        );
                    }
                    let window = self.window(body);
                    let late = body
                        .as_map()
                        .and_then(|m| m.iter().find(|(k, _)| k.node == "late"))
                        .and_then(|(_, v)| self.string(v, "late"));
                    if let Some(late) = &late {
                        used.push(Use { sink: late.clone(), pos: body.pos, schema: schema.clone() });
                    }
                    let aggregates = match f.get("aggregate") {
                        Some(a) => self.aggregates(a, &schema),
                        None => {
                            self.err_help(
                                kind.pos,
                                "a window without `aggregate`",
                                "add aggregate: { n: \"count()\" } to the step",
                            );
                            None
                        }
                    };
                    keyed = false;
                    let mut names = vec!["key".to_string(), "window_start".into(), "window_end".into()];
                    names.extend(aggregates.iter().flatten().map(|a| a.name.clone()));
                    match (window, aggregates) {
                        (Some((window, allowed_lateness)), Some(aggregates)) => {
                            Some((StepKind::Window { window, aggregates, allowed_lateness, late }, Schema::of(names)))
                        }
                        _ => None,
                    }
                }
                ("reduce", _) => {
                    if !keyed {
                        self.err_help(kind.pos, "a reduce on records without a key", "put a `key_by` step before it");
                    }
                    keyed = false;
                    let policy = self.on_error(f.get("on_error"), &schema, used);
                    self.reduce(body, &schema).map(|fields| (StepKind::Reduce(fields, policy), schema.clone()))
                }
                ("aggregate", _) => {
                    if !keyed {
                        self.err_help(
                            kind.pos,
                            "a running aggregate on records without a key",
                            "put a `key_by` step before it",
                        );
                    }
                    keyed = false;
                    self.aggregates(body, &schema).map(|aggregates| {
                        let mut names = vec!["key".to_string()];
                        names.extend(aggregates.iter().map(|a| a.name.clone()));
                        (StepKind::Aggregate(aggregates), Schema::of(names))
                    })
                }
                ("route", _) => {
                    let policy = self.on_error(f.get("on_error"), &schema, used);
                    let Some(cases) = body.as_seq() else {
                        self.err_help(
                            body.pos,
                            format!("route is {}, not a list of cases", body.kind()),
                            "write route: [ { when: \"event.amount > 100\", to: big }, { when: ..., to: ... } ]",
                        );
                        continue;
                    };
                    let mut out = Vec::new();
                    for case in cases {
                        let Some(c) = self.map(case, "a route's case", &["when", "to"]) else { continue };
                        let when =
                            self.required(&c, "when", "a route's case").and_then(|n| self.expr(n, &schema, "when"));
                        let to = self.required(&c, "to", "a route's case").and_then(|n| self.string(n, "to"));
                        if let Some(to) = &to {
                            used.push(Use {
                                sink: to.clone(),
                                pos: c.get("to").map_or(case.pos, |n| n.pos),
                                schema: schema.clone(),
                            });
                        }
                        if let (Some(when), Some(to)) = (when, to) {
                            out.push((when, to));
                        }
                    }
                    if cases.is_empty() {
                        self.err(body.pos, "route has no cases");
                    }
                    has_to = true;
                    (out.len() == cases.len() && !cases.is_empty())
                        .then(|| (StepKind::Route(out, policy), schema.clone()))
                }
                ("join", _) => {
                    let select = f.get("select");
                    let policy = self.on_error(f.get("on_error"), &schema, used);
                    self.join(body, select, &schema, event_time, sources, policy, stream)
                        .map(|(join, out)| (StepKind::Join(Box::new(join)), out))
                }
                ("dedup", _) => {
                    let Some(d) = self.map(body, "dedup", &["key", "within", "partitions"]) else { continue };
                    let partitions =
                        d.get("partitions").and_then(|n| self.integer(n, "partitions", 1)).map(|n| n as usize);
                    let key = self.required(&d, "key", "dedup").and_then(|n| self.expr(n, &schema, "the dedup key"));
                    let within = self.required(&d, "within", "dedup").and_then(|n| self.duration(n, "within"));
                    keyed = false;
                    match (key, within) {
                        (Some(key), Some(within)) => {
                            Some((StepKind::Dedup { key, within, event_time, partitions }, schema.clone()))
                        }
                        _ => None,
                    }
                }
                ("to", _) => {
                    has_to = true;
                    let sink = if let Some(sink) = body.as_str() {
                        Some(sink.to_string())
                    } else {
                        // An inline sink is named by its step and kind (`to:stdout`).
                        let kind = body.as_map().and_then(|m| m.first()).map_or("sink", |(k, _)| k.node.as_str());
                        let sink = format!("{name}:{kind}");
                        self.sink(body, "the `to` step").map(|spec| {
                            sinks.insert(sink.clone(), spec);
                            sink
                        })
                    };
                    if let Some(sink) = &sink {
                        used.push(Use { sink: sink.clone(), pos: body.pos, schema: schema.clone() });
                    }
                    sink.map(|s| (StepKind::To(s), schema.clone()))
                }
                _ => None,
            };
            if let Some((kind_out, out_schema)) = out {
                schema = out_schema.clone();
                steps.push(Step { kind: kind_out, name, pos: kind.pos, schema: out_schema });
            }
        }
        if !has_to && !items.is_empty() && stream.is_none() {
            self.err_help(node.pos, "the pipeline's records go nowhere", "end it with a `to` step: - to: <sink>");
        }
        if keyed && stream.is_some() {
            self.err_help(
                node.pos,
                format!("{what} ends after `key_by`"),
                "follow `key_by` with `window` (with `aggregate`), `aggregate` or `reduce`",
            );
        }
        if from.is_none() && items.is_empty() {
            self.err_help(node.pos, format!("the {what} has no steps"), "start it with `- from: <source>`");
        }
        Some(Flow { from, steps, schema, timed: event_time })
    }

    /// `name`, read by a `from` or a join at `pos`, is no source nor a
    /// stream declared before.
    fn unknown_input(&mut self, pos: Pos, name: &str, inputs: &BTreeMap<String, (Schema, bool)>, stream: Option<&str>) {
        if self.stream_names.iter().any(|s| s == name) {
            let help = if stream == Some(name) {
                "a stream cannot read itself".to_string()
            } else {
                format!(
                    "move stream `{name}` above the steps that read it: a stream reads the sources and the streams declared before it"
                )
            };
            self.err_help(pos, format!("stream `{name}` is not declared yet here"), help);
            return;
        }
        let names: Vec<&str> = inputs.keys().map(String::as_str).collect();
        let what = if self.stream_names.is_empty() { "source" } else { "source or stream" };
        let help = match closest(name, names.iter().copied()) {
            Some(near) => format!("did you mean `{near}`?"),
            None => format!("the {what}s are: {}", names.join(", ")),
        };
        self.err_help(pos, format!("no {what} named `{name}`"), help);
    }

    /// A `reduce` step's fields: for each field of the records, the
    /// expression over `acc` (the key's result so far) and `event` (the
    /// new record) that gives its new value; a field not listed takes the
    /// new record's.
    fn reduce(&mut self, body: &Spanned, schema: &Schema) -> Option<Vec<Option<Expr>>> {
        let Some(entries) = body.as_map() else {
            self.err_help(
                body.pos,
                format!("reduce is {}", body.kind()),
                "give the fields' new values: reduce: { total: \"acc.total + event.total\" }",
            );
            return None;
        };
        if schema.open {
            self.err_help(
                body.pos,
                "a reduce over records whose fields are not declared",
                "declare the source's `schema:`, or `map` the fields first",
            );
            return None;
        }
        let both = Schema::rooted(&[("acc", schema), ("event", schema)]);
        let mut out: Vec<Option<Expr>> = vec![None; schema.fields.len()];
        let mut ok = true;
        for (name, text) in entries {
            let Some(i) = schema.index(&name.node) else {
                let help = match closest(&name.node, schema.fields.iter().map(|f| &**f)) {
                    Some(near) => format!("did you mean `{near}`? The records here have: {schema}"),
                    None => format!("a reduce gives the fields of its records: {schema}"),
                };
                self.err_help(name.pos, format!("no field `{}` in the records of this step", name.node), help);
                ok = false;
                continue;
            };
            match self.expr(text, &both, &name.node) {
                Some(e) => {
                    if let Some(slot) = out.get_mut(i) {
                        *slot = Some(e);
                    }
                }
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn join(
        &mut self,
        body: &Spanned,
        select: Option<&Spanned>,
        schema: &Schema,
        timed: bool,
        sources: &BTreeMap<String, (Schema, bool)>,
        on_error: OnError,
        stream: Option<&str>,
    ) -> Option<(JoinSpec, Schema)> {
        let known = ["with", "key", "with_key", "interval", "window", "temporal", "type", "partitions"];
        let j = self.map(body, "a join", &known)?;
        let with = self.required(&j, "with", "a join").and_then(|n| self.string(n, "with"));
        let (with_schema, with_timed) = match with.as_ref().map(|w| (w, sources.get(w))) {
            Some((_, Some((s, t)))) => (s.clone(), *t),
            Some((w, None)) => {
                self.unknown_input(j.get("with").map_or(body.pos, |n| n.pos), w, sources, stream);
                (Schema::open(), false)
            }
            None => (Schema::open(), false),
        };
        let key = self.required(&j, "key", "a join").and_then(|n| self.expr(n, schema, "the join's key"));
        let with_key =
            self.required(&j, "with_key", "a join").and_then(|n| self.expr(n, &with_schema, "the join's `with_key`"));
        let (left_outer, right_outer) = match j.get("type").map(|n| (n.as_str(), n.pos)) {
            None | Some((Some("inner"), _)) => (false, false),
            Some((Some("left"), _)) => (true, false),
            Some((Some("right"), _)) => (false, true),
            Some((Some("full"), _)) => (true, true),
            Some((other, pos)) => {
                self.err_help(
                    pos,
                    format!("type `{}`", other.unwrap_or("?")),
                    "write inner (the default), left, right or full",
                );
                (false, false)
            }
        };
        let kinds: Vec<&str> = ["interval", "window", "temporal"].into_iter().filter(|k| j.get(k).is_some()).collect();
        let kind = match kinds.as_slice() {
            ["interval"] => {
                let i = self.map(j.get("interval")?, "an interval", &["from", "to"])?;
                let lower = self.required(&i, "from", "an interval").and_then(|n| self.signed_millis(n, "from"));
                let upper = self.required(&i, "to", "an interval").and_then(|n| self.signed_millis(n, "to"));
                match (lower, upper) {
                    (Some(l), Some(u)) if l <= u => Some(JoinKind::Interval { lower: l, upper: u }),
                    (Some(_), Some(_)) => {
                        self.err(i.node.pos, "an interval whose `from` is after its `to`");
                        None
                    }
                    _ => None,
                }
            }
            ["window"] => {
                let w = j.get("window")?;
                if let Some((k, _)) = w.as_map().and_then(|m| m.iter().find(|(k, _)| k.node == "late")) {
                    self.err_help(k.pos, "a window join sends no late records to a sink", "remove `late`");
                }
                self.window(w).map(|(w, lateness)| JoinKind::Window(w, lateness))
            }
            ["temporal"] => {
                let t = self.map(j.get("temporal")?, "a temporal join", &["retention"])?;
                let retention = match t.get("retention") {
                    Some(n) => Some(self.duration(n, "retention")?),
                    None => None,
                };
                if right_outer {
                    self.err_help(
                        j.key_pos("type"),
                        "a temporal join is inner or left",
                        "write type: inner or type: left",
                    );
                }
                Some(JoinKind::Temporal { retention })
            }
            _ => {
                self.err_help(
                    body.pos,
                    "a join needs one of interval, window or temporal",
                    "write interval: { from: -5s, to: 5s }, window: { tumbling: 1m } or temporal: {}",
                );
                None
            }
        };
        let one_side_untimed = !(timed && with_timed);
        if !kinds.is_empty() && one_side_untimed {
            self.err_help(
                body.pos,
                "a join pairs records by event time, and a side has none",
                "give both sources an event_time",
            );
        }
        let partitions = j.get("partitions").and_then(|n| self.integer(n, "partitions", 1)).map(|n| n as usize);
        let joined = Schema::joined(schema, &with_schema);
        let mut names = Vec::new();
        let mut exprs = Vec::new();
        match select.and_then(Spanned::as_map) {
            Some(entries) => {
                (names, exprs) = self.fields(entries, &joined);
            }
            None => self.err_help(
                select.map_or(body.pos, |n| n.pos),
                "a join without `select`",
                "name the results' fields: select: { id: \"left.id\", paid: \"right.amount\" }",
            ),
        }
        let spec = JoinSpec {
            with: with?,
            with_schema,
            key: key?,
            with_key: with_key?,
            kind: kind?,
            left_outer,
            right_outer,
            partitions,
            select: exprs,
            on_error,
        };
        (spec.select.len() == names.len() && !names.is_empty()).then(|| (spec, Schema::of(names)))
    }

    /// Milliseconds, possibly negative: `-5s`, `2m`.
    fn signed_millis(&mut self, node: &Spanned, what: &str) -> Option<i64> {
        let text = node.as_str().unwrap_or_default().trim();
        let (sign, rest) = match text.strip_prefix('-') {
            Some(rest) => (-1, rest),
            None => (1, text),
        };
        match parse_duration(rest).and_then(|d| i64::try_from(d.as_millis()).ok()) {
            Some(ms) => Some(sign * ms),
            None => {
                self.err_help(
                    node.pos,
                    format!("{what} is `{text}`, not a duration"),
                    "write a number and a unit, with a minus sign before: -5s, 10s, 1m",
                );
                None
            }
        }
    }

    fn window(&mut self, node: &Spanned) -> Option<(WindowSpec, Duration)> {
        let w = self.map(node, "a window", &["tumbling", "sliding", "every", "session", "allowed_lateness", "late"])?;
        let lateness = match w.get("allowed_lateness") {
            Some(n) => self.duration(n, "allowed_lateness")?,
            None => Duration::ZERO,
        };
        let spec = match (w.get("tumbling"), w.get("sliding"), w.get("session")) {
            (Some(t), None, None) => self.duration(t, "tumbling").map(WindowSpec::Tumbling),
            (None, Some(s), None) => {
                let size = self.duration(s, "sliding");
                let every = match w.get("every") {
                    Some(e) => self.duration(e, "every"),
                    None => {
                        self.err_help(
                            s.pos,
                            "a sliding window without `every`",
                            "add every: <how often a window starts>",
                        );
                        None
                    }
                };
                Some(WindowSpec::Sliding(size?, every?))
            }
            (None, None, Some(g)) => self.duration(g, "session").map(WindowSpec::Session),
            _ => {
                self.err_help(
                    node.pos,
                    "a window is one of tumbling, sliding or session",
                    "write tumbling: 1m, sliding: 10m with every: 1m, or session: 30s",
                );
                None
            }
        };
        Some((spec?, lateness))
    }

    fn aggregates(&mut self, node: &Spanned, schema: &Schema) -> Option<Vec<AggSpec>> {
        let Some(entries) = node.as_map() else {
            self.err_help(
                node.pos,
                format!("aggregate is {}", node.kind()),
                "write the results' names and aggregates: aggregate: { n: \"count()\", total: \"sum(event.amount)\" }",
            );
            return None;
        };
        let mut out = Vec::new();
        let before = self.errors.len();
        for (name, e) in entries {
            let Some(text) = e.as_str() else {
                self.err(e.pos, format!("aggregate `{}` is {}, not an aggregate", name.node, e.kind()));
                continue;
            };
            let quoted = matches!(e.node, Node::Scalar { plain: false, .. });
            match super::agg::parse(text, schema, Origin { pos: e.pos, quoted }) {
                Ok((kind, arg)) => out.push(AggSpec { name: name.node.clone(), kind, arg }),
                Err(errors) => self.errors.extend(errors),
            }
        }
        (self.errors.len() == before && !out.is_empty()).then_some(out).or_else(|| {
            if entries.is_empty() {
                self.err(node.pos, "aggregate has no results");
            }
            None
        })
    }
}

/// The fields of a source's records as its definition declares them
/// (a generator's, or `schema:`), without checking anything.
fn declared_schema(def: &Spanned) -> Schema {
    // Its records' fields, as declared (checked where the source is read).
    let entries = def.as_map().unwrap_or_default();
    let get = |key: &str| entries.iter().find(|(k, _)| k.node == key).map(|(_, v)| v);
    if let Some(fields) = get("generator")
        .and_then(Spanned::as_map)
        .and_then(|g| g.iter().find(|(k, _)| k.node == "fields"))
        .and_then(|(_, f)| f.as_map())
    {
        return Schema::of(fields.iter().map(|(k, _)| k.node.as_str()));
    }
    match get("schema").and_then(Spanned::as_seq) {
        Some(items) => Schema::of(items.iter().map(|i| i.as_str().unwrap_or_default())),
        None => Schema::open(),
    }
}

/// A duration: a number and a unit (ms, s, m, h, d), or several (`1m30s`).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let n: u64 = rest.get(..digits)?.parse().ok()?;
        rest = rest.get(digits..)?;
        let unit = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let ms = match rest.get(..unit)? {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return None,
        };
        total = total.checked_add(Duration::from_millis(n.checked_mul(ms)?))?;
        rest = rest.get(unit..)?;
    }
    Some(total)
}

impl AggKind {
    /// The names of the aggregates, for messages.
    pub const NAMES: &'static [&'static str] =
        &["count", "sum", "min", "max", "avg", "first", "last", "count_distinct"];
}
