//! A checked pipeline wired into a [`Job`]: the same graph, operators,
//! state, checkpoints and connectors as a typed pipeline, over [`Row`]s.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use weibo::prelude::*;
use weibo::record::Timestamp;

use super::agg::Aggregates;
use super::expr::{self, EvalError, Expr, Schema};
use super::spec::{
    EventTime, JoinKind, JoinSpec, OnError, SinkKind, SinkSpec, SourceKind, SourceSpec, Spec, StepKind, WindowSpec,
    dead_letter_schema,
};
use super::value::{Row, Value};
use super::vector::{Base, Chain, Stage};

/// `$call` (a `process` or `try_filter` of `$stream` with the failure
/// policy bound to `$p`) under `policy`: records it fails go to the
/// failure policy (the job fails, they are skipped and counted, or they go
/// to a dead-letter sink). The node is named `step`.
macro_rules! under {
    ($policy:expr, $step:expr, $schema:expr, $sinks:expr, |$p:ident| $call:expr) => {{
        match $policy {
            OnError::Fail => {
                let $p = weibo::on_error::Fail;
                $call.name($step)
            }
            OnError::Skip => {
                let $p = weibo::on_error::Drop;
                $call.name($step)
            }
            OnError::DeadLetter(sink) => {
                let $p = weibo::on_error::DeadLetter;
                let (ok, dead) = $call;
                dead_letters(&dead, sink, $step, $schema, $sinks);
                ok.name($step)
            }
        }
    }};
}

/// A record on its way to a sink: a map of its fields, in its step's
/// order (written as a JSON object), and its Kafka key.
#[derive(Clone, PartialEq)]
pub struct Out {
    /// The record.
    pub record: Value,
    /// The key's bytes, for a Kafka sink with a `key`.
    pub key: Option<Vec<u8>>,
}

impl fmt::Debug for Out {
    /// The record's JSON, on one line (what `stdout` prints).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.record)
    }
}

impl serde::Serialize for Out {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.record.serialize(s)
    }
}

/// A problem found while wiring a checked pipeline (a connector that
/// could not be set up).
#[derive(Debug)]
pub struct BuildError(pub String);

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BuildError {}

/// One stream of records to a sink: the records, their fields, and the
/// name of the step that sends them.
#[derive(Clone, Debug)]
pub struct SinkUse {
    /// The records.
    pub stream: Stream<Row>,
    /// Their fields.
    pub schema: Schema,
    /// The step that sends them (`to`, `window:late`, `map:dead-letters`).
    pub step: String,
}

/// A `process` step's function: it gets each record as a map of its
/// fields and pushes the records it gives, each a map (a field of the
/// step's `gives` that a record lacks is null); an error fails the record
/// under the step's `on_error` policy. Registered by name with
/// [`Pipeline::with_function`](super::Pipeline::with_function).
pub type Function = Arc<dyn Fn(&Value, &mut Vec<Value>) -> Result<(), String> + Send + Sync>;

/// The functions of `process` steps, by name.
pub type Functions = BTreeMap<String, Function>;

/// The streams of records each sink gets, by sink name.
type SinkInputs = BTreeMap<String, Vec<SinkUse>>;

/// The stream at a step: keyed or not, or stateless steps waiting to
/// run as one operator.
enum Cur {
    Plain(Stream<Row>),
    Keyed(KeyedStream<Value, Row>),
    Chain(Pending),
}

/// The records of a source or a named stream, as the steps after it read
/// them.
#[derive(Clone)]
enum Input {
    Rows(Stream<Row>),
    Chain(Pending),
}

/// Stateless steps (a generator's fields, `map`, `filter`, a key) not yet
/// wired: consecutive ones under the same failure policy (`fail` or
/// `skip`) run as one operator over whole batches, a column at a time
/// (see `vector.rs`); one that sends failures to a dead-letter sink runs
/// alone, so that its dead letters hold the records it got.
#[derive(Clone)]
struct Pending {
    input: PendingInput,
    chain: Chain,
    policy: OnError,
    /// The records that come in.
    schema: Schema,
}

#[derive(Clone)]
enum PendingInput {
    Rows(Stream<Row>),
    Index(Stream<u64>),
}

impl Pending {
    fn new(input: PendingInput, schema: &Schema, policy: &OnError) -> Pending {
        Pending { input, chain: Chain::new(schema.fields.len()), policy: policy.clone(), schema: schema.clone() }
    }

    /// Whether a step under `policy` can join the chain.
    fn takes(&self, policy: &OnError) -> bool {
        !matches!(self.policy, OnError::DeadLetter(_)) && self.policy == *policy
    }

    /// Wires the chain: one operator named after its steps.
    fn wire(self, sinks: &mut SinkInputs) -> Stream<Row> {
        let mut names: Vec<&str> = self.chain.stages.iter().map(|(n, _)| n.as_str()).collect();
        names.dedup();
        let name = names.join("+");
        let mut chain = self.chain;
        chain.prune();
        let chain = Arc::new(chain);
        match self.input {
            PendingInput::Rows(s) => under!(&self.policy, &name, &self.schema, sinks, |p| s
                .process_batch(p, move |rows: &[Row], out: &mut BatchOutput<Row, String>| chain
                    .run(Base::Rows(rows), out))),
            PendingInput::Index(s) => under!(&self.policy, &name, &self.schema, sinks, |p| s
                .process_batch(p, move |index: &[u64], out: &mut BatchOutput<Row, String>| chain
                    .run(Base::Index(index), out))),
        }
    }
}

impl Input {
    fn cur(self) -> Cur {
        match self {
            Input::Rows(s) => Cur::Plain(s),
            Input::Chain(p) => Cur::Chain(p),
        }
    }
}

impl Cur {
    /// The records, with the stateless steps before wired.
    fn plain(self, sinks: &mut SinkInputs) -> Result<Stream<Row>, BuildError> {
        match self {
            Cur::Plain(s) => Ok(s),
            Cur::Chain(p) => Ok(p.wire(sinks)),
            Cur::Keyed(_) => Err(BuildError("a keyed stream where records were expected".into())),
        }
    }

    /// `stage` (step `name` under `policy`, over records of `schema`) after
    /// the stream: in the chain before it when it can join it.
    fn then(
        self,
        name: &str,
        stage: Stage,
        policy: &OnError,
        schema: &Schema,
        sinks: &mut SinkInputs,
    ) -> Result<Cur, BuildError> {
        let mut p = match self {
            Cur::Chain(p) if p.takes(policy) => p,
            other => Pending::new(PendingInput::Rows(other.plain(sinks)?), schema, policy),
        };
        p.chain.stages.push((name.to_string(), stage));
        Ok(Cur::Chain(p))
    }
}

/// Wires `spec` into a new job.
///
/// # Errors
/// A source that cannot be set up (a Kafka cluster that does not answer).
pub fn build(spec: &Spec, functions: &Functions) -> Result<Job, BuildError> {
    build_with(spec, functions, &mut |_, _| false)
}

/// Wires `spec` into a new job, offering each use of a sink to `take`
/// first: when it returns `true`, it has wired the records itself (to a
/// sink of its own), and the sink the file declares does not get them.
///
/// # Errors
/// As [`build`].
pub fn build_with(
    spec: &Spec,
    functions: &Functions,
    take: &mut dyn FnMut(&str, &SinkUse) -> bool,
) -> Result<Job, BuildError> {
    let mut job = Job::new(&spec.job);
    if let Some((dir, interval)) = &spec.checkpoints {
        job = job.with_checkpoints(dir.clone(), *interval);
    }
    if let Some(n) = spec.batch_size {
        job = job.with_batch_size(n);
    }
    if let Some(addr) = &spec.admin {
        job = with_admin(job, addr);
    }
    let mut sinks: SinkInputs = BTreeMap::new();
    let mut inputs = BTreeMap::new();
    for name in spec.source_names() {
        let source = spec.sources.get(&name).ok_or_else(|| BuildError(format!("no source `{name}`")))?;
        let input = build_source(&job, &name, source, &mut sinks)?;
        inputs.insert(name, input);
    }
    wire_streams(spec, functions, &mut inputs, &mut sinks)?;
    wire_sinks(spec, sinks, take)?;
    Ok(job)
}

/// Wires the streams and steps of `spec` after `inputs`, the records of
/// its sources by name (decoded, with their event time: those of
/// [`Spec::source_names`]), and the sinks: each use offered to `take`
/// first. A test harness wires its inputs this way.
///
/// # Errors
/// A source missing from `inputs`, a sink that cannot be set up.
pub fn wire_after(
    spec: &Spec,
    functions: &Functions,
    inputs: BTreeMap<String, Stream<Row>>,
    take: &mut dyn FnMut(&str, &SinkUse) -> bool,
) -> Result<(), BuildError> {
    wire(spec, functions, inputs, BTreeMap::new(), take)
}

fn wire(
    spec: &Spec,
    functions: &Functions,
    inputs: BTreeMap<String, Stream<Row>>,
    mut sinks: SinkInputs,
    take: &mut dyn FnMut(&str, &SinkUse) -> bool,
) -> Result<(), BuildError> {
    let mut inputs: BTreeMap<String, Input> = inputs.into_iter().map(|(k, v)| (k, Input::Rows(v))).collect();
    wire_streams(spec, functions, &mut inputs, &mut sinks)?;
    wire_sinks(spec, sinks, take)
}

/// Wires the named streams, then the pipeline, after `inputs`.
fn wire_streams(
    spec: &Spec,
    functions: &Functions,
    inputs: &mut BTreeMap<String, Input>,
    sinks: &mut SinkInputs,
) -> Result<(), BuildError> {
    for s in &spec.streams {
        let out = wire_steps(spec, functions, &s.from, &s.steps, inputs, sinks)?;
        inputs.insert(s.name.clone(), Input::Rows(out));
    }
    wire_steps(spec, functions, &spec.from, &spec.steps, inputs, sinks)?;
    Ok(())
}

/// Wires each sink to the records sent to it (those `take` does not).
fn wire_sinks(spec: &Spec, sinks: SinkInputs, take: &mut dyn FnMut(&str, &SinkUse) -> bool) -> Result<(), BuildError> {
    for (name, uses) in sinks {
        let mut outs = Vec::new();
        for u in uses.iter().filter(|u| !take(&name, u)) {
            outs.push(to_out(u, &name, spec)?);
        }
        let Some(first) = outs.first() else { continue };
        let all = outs.iter().skip(1).fold(first.clone(), |acc, s| acc.union(s));
        let sink = spec.sinks.get(&name).ok_or_else(|| BuildError(format!("no sink `{name}`")))?;
        // A table's columns, unless listed: the fields of the records of
        // the sink's first use.
        let fields: Vec<String> =
            uses.first().map(|u| u.schema.fields.iter().map(|f| f.to_string()).collect()).unwrap_or_default();
        attach(&all, &name, sink, spec, &fields)?;
    }
    Ok(())
}

/// The fields of the records of the source or stream `name`.
fn schema_of(spec: &Spec, name: &str) -> Result<Schema, BuildError> {
    match (spec.sources.get(name), spec.streams.iter().find(|s| s.name == name)) {
        (Some(source), _) => Ok(source.schema.clone()),
        (None, Some(stream)) => Ok(stream.schema.clone()),
        (None, None) => Err(BuildError(format!("no source or stream `{name}`"))),
    }
}

/// Wires `steps` after the records of `from` (a source's or a stream's,
/// in `inputs`), returning the records of the last step.
fn wire_steps(
    spec: &Spec,
    functions: &Functions,
    from: &str,
    steps: &[super::spec::Step],
    inputs: &BTreeMap<String, Input>,
    sinks: &mut SinkInputs,
) -> Result<Stream<Row>, BuildError> {
    let mut schema = schema_of(spec, from)?;
    let input = inputs.get(from).cloned().ok_or_else(|| BuildError(format!("no input for `{from}`")))?;
    let mut cur = input.cur();
    for step in steps {
        // The stateless steps before a step that is not one, and does not
        // start with one (a join's or a dedup's key), run now.
        let stateless = matches!(
            step.kind,
            StepKind::Filter(..) | StepKind::Map(..) | StepKind::KeyBy(..) | StepKind::Join(_) | StepKind::Dedup { .. }
        );
        if !stateless && let Cur::Chain(p) = cur {
            cur = Cur::Plain(p.wire(sinks));
        }
        cur = match (&step.kind, cur) {
            (StepKind::Filter(e, policy), cur) => {
                cur.then(&step.name, Stage::Filter(e.clone()), policy, &schema, sinks)?
            }
            (StepKind::Map(exprs, policy), cur) => {
                cur.then(&step.name, Stage::Map(exprs.clone()), policy, &schema, sinks)?
            }
            (StepKind::Process(function, policy), Cur::Plain(s)) => {
                let f = functions.get(function).cloned().ok_or_else(|| {
                    BuildError(format!(
                        "step `{}` calls the function `{function}`, which is not registered: a pipeline with \
                         `process` steps runs from a Rust program that registers their functions \
                         (Pipeline::with_function); the `weibo` command has none",
                        step.name
                    ))
                })?;
                let g = process(f, &schema, &step.schema);
                let rows = under!(policy, &step.name, &schema, sinks, |p| s.process(p, g));
                Cur::Plain(rows.flat_map(|rows: Vec<Row>| rows).name(&format!("{}:rows", step.name)))
            }
            (StepKind::KeyBy(e, partitions, policy), cur) => {
                let mut keyed = keyed_by(cur, e, policy, &step.name, &schema, sinks)?;
                if let Some(n) = partitions {
                    keyed = keyed.with_partitions(*n);
                }
                Cur::Keyed(keyed)
            }
            (StepKind::Window { window, aggregates, allowed_lateness, late }, Cur::Keyed(k)) => {
                let windowed = match window {
                    WindowSpec::Tumbling(size) => k.window(Tumbling::of(*size)),
                    WindowSpec::Sliding(size, every) => k.window(Sliding::of(*size, *every)),
                    WindowSpec::Session(gap) => k.window(Session::with_gap(*gap)),
                };
                let out = windowed
                    .allowed_lateness(*allowed_lateness)
                    .aggregate(Aggregates::new(aggregates.clone()).with_lead(3))
                    .name(&step.name)
                    .uid(&step.name)
                    .state_version(super::agg::state_version(aggregates));
                if let Some(late) = late {
                    let late_records = out.late_records();
                    to_sink(&late_records, &schema, late, &format!("{}:late", step.name), sinks);
                }
                let rows = out.into_stream().map(|w: WindowResult<Value, Row>| {
                    let mut row = w.value;
                    for (slot, v) in row.0.iter_mut().zip([w.key, Value::Int(w.window.start), Value::Int(w.window.end)])
                    {
                        *slot = v;
                    }
                    row
                });
                Cur::Plain(rows.name(&format!("{}:results", step.name)))
            }
            (StepKind::Aggregate(aggregates), Cur::Keyed(k)) => {
                let rows = k
                    .aggregate_with(Aggregates::new(aggregates.clone()).with_lead(1), |key: Value, mut row: Row| {
                        if let Some(slot) = row.0.first_mut() {
                            *slot = key;
                        }
                        row
                    })
                    .name(&step.name)
                    .uid(&step.name)
                    .state_version(super::agg::state_version(aggregates));
                Cur::Plain(rows)
            }
            (StepKind::Route(cases, policy), Cur::Plain(s)) => {
                // The index of the first case that takes each record (or
                // none), computed once; then one stream per case.
                let conditions: Vec<Expr> = cases.iter().map(|(e, _)| e.clone()).collect();
                let f = move |r: &Row| {
                    for (i, c) in conditions.iter().enumerate() {
                        if c.test(r)? {
                            return Ok::<_, EvalError>((i, r.clone()));
                        }
                    }
                    Ok((usize::MAX, r.clone()))
                };
                let tagged = under!(policy, &step.name, &schema, sinks, |p| s.process(p, f));
                for (i, (_, sink)) in cases.iter().enumerate() {
                    let taken = tagged
                        .filter(move |t: &(usize, Row)| t.0 == i)
                        .name(&format!("{}:{sink}", step.name))
                        .map(|t: (usize, Row)| t.1)
                        .name(&format!("{}:{sink}:rows", step.name));
                    to_sink(&taken, &schema, sink, &format!("{}:{sink}:json", step.name), sinks);
                }
                let rest = tagged
                    .filter(|t: &(usize, Row)| t.0 == usize::MAX)
                    .name(&format!("{}:rest", step.name))
                    .map(|t: (usize, Row)| t.1)
                    .name(&format!("{}:rest:rows", step.name));
                Cur::Plain(rest)
            }
            (StepKind::Join(j), cur) => {
                let right =
                    inputs.get(&j.with).ok_or_else(|| BuildError(format!("no input for source `{}`", j.with)))?;
                let left = keyed_by(cur, &j.key, &OnError::Fail, &format!("{}:key", step.name), &schema, sinks)?;
                let right = keyed_by(
                    right.clone().cur(),
                    &j.with_key,
                    &OnError::Fail,
                    &format!("{}:with_key", step.name),
                    &j.with_schema,
                    sinks,
                )?;
                let joined = join(j, left, right, schema.fields.len()).name(&step.name).uid(&step.name);
                let joined_schema = Schema::joined(&schema, &j.with_schema);
                let f = project(&j.select);
                let select = format!("{}:select", step.name);
                Cur::Plain(under!(&j.on_error, &select, &joined_schema, sinks, |p| joined.process(p, f)))
            }
            (StepKind::Dedup { key, within, event_time, partitions }, cur) => {
                let step_key = format!("{}:key", step.name);
                let mut keyed = keyed_by(cur, key, &OnError::Fail, &step_key, &schema, sinks)?;
                let mut ttl = weibo::process::StateTtl::after_write(*within);
                if *event_time {
                    ttl = ttl.in_event_time();
                }
                if let Some(n) = partitions {
                    keyed = keyed.with_partitions(*n);
                }
                let firsts = keyed.process_with_state(
                    weibo::on_error::Fail,
                    move |states| states.ttl(ttl).value::<bool>("seen"),
                    |ctx, seen, r: &Row| {
                        if ctx.value(seen).get().is_none() {
                            ctx.value(seen).set(true);
                            let mut r = r.clone();
                            r.0.pop();
                            ctx.emit(r);
                        }
                    },
                );
                Cur::Plain(firsts.name(&step.name).uid(&step.name))
            }
            (StepKind::To(sink), Cur::Plain(s)) => {
                to_sink(&s, &schema, sink, &step.name, sinks);
                Cur::Plain(s)
            }
            (StepKind::Reduce(fields, policy), Cur::Keyed(k)) => {
                let f = reduce(fields, schema.fields.len());
                let version = super::agg::layout_version(&format!("reduce:{schema}"));
                let out = under!(policy, &step.name, &schema, sinks, |p| k.process(p, f));
                Cur::Plain(out.uid(&step.name).state_version(version))
            }
            (kind, _) => {
                return Err(BuildError(format!("step `{}` ({kind:?}) does not fit the records before it", step.name)));
            }
        };
        schema = step.schema.clone();
    }
    match cur {
        Cur::Keyed(_) => Err(BuildError(format!("the steps after `{from}` end with a key_by"))),
        other => other.plain(sinks),
    }
}

/// A `process` step's function over rows: `f` over each record (of
/// `input`) as a map, its records back as rows of `output`.
fn process(
    f: Function,
    input: &Schema,
    output: &Schema,
) -> impl Fn(&Row) -> Result<Vec<Row>, EvalError> + Send + Sync + 'static {
    let (input, output) = (input.clone(), output.clone());
    move |r: &Row| {
        let mut records = Vec::new();
        f(&input.to_value(r), &mut records).map_err(EvalError::new)?;
        records
            .iter()
            .map(|v| match v {
                Value::Map(_) => Ok(output.row_of(v)),
                other => {
                    Err(EvalError::new(format!("the function gave {other} ({}), not a record", other.type_name())))
                }
            })
            .collect()
    }
}

/// A keyed reduce's function over records of `n` fields (and the hidden
/// key after them): the key's first record is its result; each next one
/// gives each field's new value from `fields` over the result so far and
/// the record (or the record's own value). The result is kept and
/// emitted; a failing expression leaves it as it was.
fn reduce(
    fields: &[Option<Expr>],
    n: usize,
) -> impl for<'c> Fn(&mut KeyedContext<'c, Value, Row, Row>, &Row) -> Result<(), EvalError> + Send + Sync + 'static {
    let fields = fields.to_vec();
    move |ctx, r| {
        let next = match ctx.state() {
            None => Row(r.0.iter().take(n).cloned().collect()),
            Some(acc) => {
                let mut both = acc.clone();
                both.0.extend(r.0.iter().take(n).cloned());
                let mut out = smallvec::SmallVec::with_capacity(n);
                for (i, f) in fields.iter().enumerate() {
                    out.push(match f {
                        Some(e) => e.eval(&both)?,
                        None => r.field(i).clone(),
                    });
                }
                Row(out)
            }
        };
        *ctx.state() = Some(next.clone());
        ctx.emit(next);
        Ok(())
    }
}

/// The records of `cur` (of `schema`) keyed by `key`, computed under
/// `policy` (with the stateless steps before it, when it can) and kept as
/// a last, hidden field (`key_by`'s own function cannot fail); the step
/// computing it is named `step`.
fn keyed_by(
    cur: Cur,
    key: &Expr,
    policy: &OnError,
    step: &str,
    schema: &Schema,
    sinks: &mut SinkInputs,
) -> Result<KeyedStream<Value, Row>, BuildError> {
    let with_key = cur.then(step, Stage::Key(key.clone()), policy, schema, sinks)?.plain(sinks)?;
    Ok(with_key.key_by(|r: &Row| r.0.last().cloned().unwrap_or_default()))
}

/// A record of `exprs`' values for each record (a `map`, a join's
/// `select`).
fn project(exprs: &[Expr]) -> impl Fn(&Row) -> Result<Row, EvalError> + Send + Sync + 'static {
    let exprs = exprs.to_vec();
    move |r: &Row| {
        let mut out = smallvec::SmallVec::with_capacity(exprs.len());
        for e in &exprs {
            out.push(e.eval(r)?);
        }
        Ok(Row(out))
    }
}

/// The join `j` of `left` (whose records have `nl` fields) and `right`:
/// rows of the left's fields then the right's, nulls for a side without a
/// partner.
fn join(j: &JoinSpec, left: KeyedStream<Value, Row>, right: KeyedStream<Value, Row>, nl: usize) -> Stream<Row> {
    let nr = j.with_schema.fields.len();
    let pair = move |l: Option<&Row>, r: Option<&Row>| {
        let mut row = smallvec::SmallVec::with_capacity(nl + nr);
        row.extend((0..nl).map(|i| l.map_or(Value::Null, |l| l.field(i).clone())));
        row.extend((0..nr).map(|i| r.map_or(Value::Null, |r| r.field(i).clone())));
        Row(row)
    };
    match j.kind {
        JoinKind::Interval { lower, upper } => {
            let mut b = left.interval_join(&right).between(lower, upper);
            if let Some(n) = j.partitions {
                b = b.with_partitions(n);
            }
            match (j.left_outer, j.right_outer) {
                (false, false) => b.join(move |l: &Row, r: &Row| pair(Some(l), Some(r))),
                (true, false) => b.left_join(move |l: &Row, r: Option<&Row>| pair(Some(l), r)),
                (false, true) => b.right_join(move |l: Option<&Row>, r: &Row| pair(l, Some(r))),
                (true, true) => b.full_join(pair),
            }
        }
        JoinKind::Window(w, lateness) => {
            let mut b = left.join(&right);
            if let Some(n) = j.partitions {
                b = b.with_partitions(n);
            }
            match w {
                WindowSpec::Tumbling(size) => window_join(b.window(Tumbling::of(size)), lateness, j, pair),
                WindowSpec::Sliding(size, every) => window_join(b.window(Sliding::of(size, every)), lateness, j, pair),
                WindowSpec::Session(gap) => window_join(b.window(Session::with_gap(gap)), lateness, j, pair),
            }
        }
        JoinKind::Temporal { retention } => {
            let mut b = left.temporal_join(&right);
            if let Some(r) = retention {
                b = b.retention(r);
            }
            if let Some(n) = j.partitions {
                b = b.with_partitions(n);
            }
            if j.left_outer {
                b.left_join(move |l: &Row, r: Option<&Row>| pair(Some(l), r))
            } else {
                b.join(move |l: &Row, r: &Row| pair(Some(l), Some(r)))
            }
        }
    }
}

fn window_join(
    w: weibo::join::JoinWindows<Value, Row, Row>,
    lateness: std::time::Duration,
    j: &JoinSpec,
    pair: impl Fn(Option<&Row>, Option<&Row>) -> Row + Send + Sync + 'static,
) -> Stream<Row> {
    let w = w.allowed_lateness(lateness);
    let out = match (j.left_outer, j.right_outer) {
        (false, false) => w.apply(move |l: &Row, r: &Row| pair(Some(l), Some(r))),
        (true, false) => w.left_join(move |l: &Row, r: Option<&Row>| pair(Some(l), r)),
        (false, true) => w.right_join(move |l: Option<&Row>, r: &Row| pair(l, Some(r))),
        (true, true) => w.full_join(pair),
    };
    out.into_stream()
}

/// The dead letters of `step` (whose records have `schema`) to `sink`, as
/// rows: the record, the error, the step, where the record came from.
fn dead_letters<T: Clone + Send + fmt::Debug + 'static>(
    dead: &Stream<weibo::DeadLetter<T>>,
    sink: &str,
    step: &str,
    schema: &Schema,
    sinks: &mut SinkInputs,
) {
    let record_schema = schema.clone();
    let name = step.to_string();
    let letters = dead
        .map(move |d: weibo::DeadLetter<T>| {
            Row::new([
                describe(&d.record, &record_schema),
                Value::str(&d.error),
                Value::str(&name),
                Value::str(&d.position.source),
                Value::Int(i64::from(d.position.partition)),
                Value::Int(i64::try_from(d.position.offset).unwrap_or(i64::MAX)),
            ])
        })
        .name(&format!("{step}:dead-letters"));
    let schema = dead_letter_schema(schema);
    sinks.entry(sink.to_string()).or_default().push(SinkUse {
        stream: letters,
        schema,
        step: format!("{step}:dead-letters"),
    });
}

/// A failed record: a row as the map of its fields, a line as its text,
/// a Kafka record as its payload's text.
fn describe<T: fmt::Debug + 'static>(record: &T, schema: &Schema) -> Value {
    let any = record as &dyn std::any::Any;
    if let Some(row) = any.downcast_ref::<Row>() {
        return schema.to_value(row);
    }
    if let Some(text) = any.downcast_ref::<String>() {
        return Value::str(text);
    }
    #[cfg(feature = "kafka")]
    if let Some(r) = any.downcast_ref::<crate::kafka::KafkaRecord<Vec<u8>>>() {
        return Value::str(&String::from_utf8_lossy(&r.value));
    }
    Value::str(&format!("{record:?}"))
}

fn build_source(job: &Job, name: &str, source: &SourceSpec, sinks: &mut SinkInputs) -> Result<Input, BuildError> {
    let schema = source.schema.clone();
    let time = source.event_time.clone();
    let raw = Schema::of(["text"]);
    let stream = match &source.kind {
        SourceKind::Generator { count, rate, partitions, fields } => {
            let mut g = Generator::new(count.unwrap_or(u64::MAX), |i| i).with_partitions(*partitions);
            if let Some(rate) = rate {
                g = g.with_rate(*rate);
            }
            let index = job.source(g).name(name);
            let step = format!("{name}:fields");
            let mut p = Pending::new(PendingInput::Index(index), &Schema::of(["i"]), &source.on_error);
            // Indexes past `i64::MAX` read as `i64::MAX` (see `vector.rs`).
            let last = count.unwrap_or(u64::MAX).saturating_sub(1);
            p.chain.index_bound = Some(i64::try_from(last).unwrap_or(i64::MAX));
            p.chain.stages.push((step.clone(), Stage::Map(fields.clone())));
            match &time {
                // Without event time, the fields run with the steps after.
                None => return Ok(Input::Chain(p)),
                Some(t) => {
                    p.chain.stages.push((step, Stage::Time(t.field, t.name.clone())));
                    p.wire(sinks)
                }
            }
        }
        SourceKind::File { path } => {
            let lines = job.source(FileSource::lines(path)).name(name);
            {
                let f = move |line: &String| {
                    let row = decode(line.as_bytes(), &schema)?;
                    check_time(&row, time.as_ref())?;
                    Ok::<_, EvalError>(row)
                };
                let step = format!("{name}:decode");
                under!(&source.on_error, &step, &raw, sinks, |p| lines.process(p, f))
            }
        }
        #[cfg(not(feature = "kafka"))]
        SourceKind::Kafka { .. } => {
            return Err(BuildError(format!("source `{name}` reads Kafka: build with the feature `kafka`")));
        }
        #[cfg(feature = "kafka")]
        SourceKind::Kafka { brokers, topics, group, bounded, start_latest } => {
            use crate::kafka::{Bytes, KafkaRecord, KafkaSource, StartAt};
            let mut b = KafkaSource::builder(brokers.clone(), topics.clone(), Bytes);
            if let Some(g) = group {
                b = b.with_group(g.clone());
            }
            if *bounded {
                b = b.until_end();
            }
            if *start_latest {
                b = b.with_start_at(StartAt::Latest);
            }
            let kafka = b.build::<Vec<u8>>().map_err(|e| BuildError(format!("source `{name}`: {e}")))?;
            let records = job.source(kafka).name(name);
            {
                let f = move |r: &KafkaRecord<Vec<u8>>| {
                    let row = decode(&r.value, &schema)?;
                    check_time(&row, time.as_ref())?;
                    Ok::<_, EvalError>(row)
                };
                let step = format!("{name}:decode");
                under!(&source.on_error, &step, &raw, sinks, |p| records.process(p, f))
            }
        }
    };
    Ok(match &source.event_time {
        Some(t) => {
            let mut strategy = if t.max_out_of_orderness.is_zero() {
                WatermarkStrategy::monotonous()
            } else {
                WatermarkStrategy::bounded_out_of_orderness(t.max_out_of_orderness)
            };
            if let Some(idle) = t.idle_after {
                strategy = strategy.with_idleness(idle);
            }
            let field = t.field;
            Input::Rows(stream.with_timestamps(move |r: &Row| time_of(r.field(field)), strategy))
        }
        None => Input::Rows(stream),
    })
}

/// A record's event time from its field: milliseconds since the epoch.
fn time_of(v: &Value) -> Timestamp {
    match v {
        Value::Int(ms) => *ms,
        Value::Float(ms) => *ms as i64,
        _ => weibo::record::NO_TIMESTAMP,
    }
}

fn check_time(row: &Row, time: Option<&EventTime>) -> Result<(), EvalError> {
    let Some(t) = time else { return Ok(()) };
    match row.field(t.field) {
        Value::Int(_) => Ok(()),
        Value::Float(f) if f.is_finite() => Ok(()),
        other => Err(EvalError::new(format!(
            "the event time `{}` is {} ({}), not milliseconds since the epoch",
            t.name,
            other,
            other.type_name()
        ))),
    }
}

/// The admin API at `addr`, with the token in `WEIBO_ADMIN_TOKEN` (a
/// pipeline file holds no secret).
#[cfg(feature = "admin")]
fn with_admin(job: Job, addr: &str) -> Job {
    let job = job.with_admin(addr);
    match std::env::var("WEIBO_ADMIN_TOKEN") {
        Ok(token) if !token.is_empty() => job.with_admin_token(token),
        _ => job,
    }
}

#[cfg(not(feature = "admin"))]
fn with_admin(job: Job, addr: &str) -> Job {
    tracing::warn!("the pipeline asks for an admin API at {addr}, and this build has none (feature `admin`)");
    job
}

/// A JSON record as a row of `schema` (fields it lacks are null).
fn decode(bytes: &[u8], schema: &Schema) -> Result<Row, EvalError> {
    let json: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| EvalError::new(format!("not JSON: {e}")))?;
    if schema.open {
        return Ok(Row::new([Value::from_json(&json)]));
    }
    let serde_json::Value::Object(object) = json else {
        return Err(EvalError::new(format!("a JSON {} where a record (an object) was expected", json_kind(&json))));
    };
    Ok(Row(schema.fields.iter().map(|f| object.get(&**f).map_or(Value::Null, Value::from_json)).collect()))
}

fn json_kind(json: &serde_json::Value) -> &'static str {
    match json {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "bool",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

/// Records of `schema` to the sink `name`, from `step`.
fn to_sink(stream: &Stream<Row>, schema: &Schema, name: &str, step: &str, sinks: &mut SinkInputs) {
    sinks.entry(name.to_string()).or_default().push(SinkUse {
        stream: stream.clone(),
        schema: schema.clone(),
        step: step.to_string(),
    });
}

/// A use of the sink `name` as the records it writes: JSON maps, with
/// their Kafka key.
fn to_out(u: &SinkUse, name: &str, spec: &Spec) -> Result<Stream<Out>, BuildError> {
    let key: Option<Expr> = match spec.sinks.get(name) {
        Some(SinkSpec { kind: SinkKind::Kafka { key: Some((text, origin)), .. }, .. }) => Some(
            expr::compile(text, &u.schema, *origin)
                .map_err(|e| BuildError(format!("sink `{name}`: the key: {e:?}")))?,
        ),
        _ => None,
    };
    let schema = u.schema.clone();
    let out = u.stream.process(weibo::on_error::Fail, move |r: &Row| {
        let key = match &key {
            Some(k) => Some(match k.eval(r)? {
                Value::Str(s) => s.as_bytes().to_vec(),
                other => other.to_string().into_bytes(),
            }),
            None => None,
        };
        Ok::<_, EvalError>(Out { record: schema.to_value(r), key })
    });
    // The step's own name when it only sends (`to`); with a suffix when
    // its records go on too.
    Ok(if u.step.contains(':') { out.name(&format!("{}:json", u.step)) } else { out.name(&u.step) })
}

/// JSON payloads for Kafka.
#[cfg(feature = "kafka")]
struct OutJson;

#[cfg(feature = "kafka")]
impl crate::kafka::Format<Out> for OutJson {
    fn name(&self) -> &'static str {
        "JSON"
    }

    fn decode(&self, bytes: &[u8]) -> Result<Out, String> {
        serde_json::from_slice(bytes)
            .map(|json| Out { record: Value::from_json(&json), key: None })
            .map_err(|e| e.to_string())
    }

    fn encode(&self, value: &Out, out: &mut Vec<u8>) -> Result<(), String> {
        serde_json::to_writer(out, &value.record).map_err(|e| e.to_string())
    }
}

#[cfg_attr(not(all(feature = "kafka", feature = "postgres")), allow(unused_variables))]
fn attach(stream: &Stream<Out>, name: &str, sink: &SinkSpec, spec: &Spec, fields: &[String]) -> Result<(), BuildError> {
    match &sink.kind {
        SinkKind::Stdout => stream.sink(Stdout).name(name),
        SinkKind::Blackhole => stream.sink(Blackhole::new()).name(name),
        SinkKind::File { path } => stream.sink(FileSink::json_lines(path)).name(name),
        #[cfg(not(feature = "postgres"))]
        SinkKind::Postgres { .. } => {
            return Err(BuildError(format!("sink `{name}` writes to Postgres: build with the feature `postgres`")));
        }
        #[cfg(feature = "postgres")]
        SinkKind::Postgres { url, table, columns, upsert_keys, id, exactly_once } => {
            let mut b = crate::postgres::PostgresSink::<Out>::builder(url.clone(), table.clone());
            for column in columns.as_deref().unwrap_or(fields) {
                let field = column.clone();
                b = b.with_column(column.clone(), move |o: &Out| {
                    super::sql::SqlValue(o.record.get(&field).cloned().unwrap_or_default())
                });
            }
            if !upsert_keys.is_empty() {
                b = b.with_upsert_keys(upsert_keys.clone());
            }
            if let Some(id) = id {
                b = b.with_id(id.clone());
            }
            let sink = b.build().map_err(|e| BuildError(format!("sink `{name}`: {e}")))?;
            if *exactly_once { stream.sink_exactly_once(sink).name(name) } else { stream.sink(sink).name(name) }
        }
        #[cfg(not(feature = "http"))]
        SinkKind::Http { .. } => {
            return Err(BuildError(format!("sink `{name}` writes to HTTP: build with the feature `http`")));
        }
        #[cfg(feature = "http")]
        SinkKind::Http { url, put, json_lines, headers, batch_records } => {
            use crate::http::{BodyFormat, HttpSink, Method};
            let mut b = HttpSink::<Out>::builder(url.clone())
                .with_method(if *put { Method::Put } else { Method::Post })
                .with_format(if *json_lines { BodyFormat::JsonLines } else { BodyFormat::JsonArray });
            for (k, v) in headers {
                b = b.with_header(k.clone(), v.clone());
            }
            if let Some(n) = batch_records {
                b = b.with_batch_records(*n);
            }
            stream.sink(b.build().map_err(|e| BuildError(format!("sink `{name}`: {e}")))?).name(name)
        }
        #[cfg(not(feature = "s3"))]
        SinkKind::S3 { .. } => {
            return Err(BuildError(format!("sink `{name}` writes to S3: build with the feature `s3`")));
        }
        #[cfg(feature = "s3")]
        SinkKind::S3 { bucket, prefix, endpoint, region, credentials, local } => {
            let mut b = crate::s3::S3Storage::builder(bucket.clone(), prefix.clone()).from_env();
            if let Some(e) = endpoint {
                b = b.with_endpoint(e.clone());
            }
            if let Some(r) = region {
                b = b.with_region(r.clone());
            }
            if let Some((key, secret)) = credentials {
                b = b.with_credentials(key.clone(), secret.clone());
            }
            if *local {
                b = b.allow_http().path_style();
            }
            let storage = b.build().map_err(|e| BuildError(format!("sink `{name}`: {e}")))?;
            stream.sink_exactly_once(crate::s3_sink::S3Sink::json_lines(storage)).name(name)
        }
        #[cfg(not(feature = "kafka"))]
        SinkKind::Kafka { .. } => {
            return Err(BuildError(format!("sink `{name}` writes to Kafka: build with the feature `kafka`")));
        }
        #[cfg(feature = "kafka")]
        SinkKind::Kafka { brokers, topic, exactly_once, .. } => {
            let out =
                crate::kafka::KafkaSink::new(brokers.clone(), topic.clone(), OutJson).with_key(|o: &Out| o.key.clone());
            if *exactly_once {
                let Some((dir, _)) = &spec.checkpoints else {
                    return Err(BuildError(format!("sink `{name}` writes exactly once, which needs `checkpoints`")));
                };
                let redo = redo_dir(dir, name);
                stream.sink_exactly_once(out.with_transactions(format!("{}-{name}", spec.job), redo)).name(name)
            } else {
                stream.sink(out).name(name)
            }
        }
    };
    Ok(())
}

#[cfg(feature = "kafka")]
/// Where an exactly-once Kafka sink keeps its transactions' redo log:
/// beside the checkpoint storage, per sink.
fn redo_dir(checkpoints: &std::path::Path, sink: &str) -> std::path::PathBuf {
    let mut dir = checkpoints.as_os_str().to_owned();
    dir.push(".kafka-redo");
    std::path::PathBuf::from(dir).join(sink)
}
