//! Tests of a pipeline file, declared in a file of their own
//! (`*_test.yaml`): for each case, the records its source gives and the
//! watermarks between them, and the records each sink must get. Each case
//! runs the pipeline's steps in a [`weibo::testing::Harness`]: no service,
//! no source, no sink is touched.
//!
//! ```yaml
//! pipeline: clicks.yaml            # relative to this file
//! tests:
//!   - name: a minute of clicks
//!     input:
//!       - { user: ann, kind: click, amount: 3, ts: 1000 }
//!       - watermark: 59999
//!     expect:
//!       per_minute:
//!         - { key: ann, window_start: 0, window_end: 60000, clicks: 1, cents: 300, first: 1000, last: 1000 }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use weibo::testing::{Harness, Probe};

use super::doc::{self, Diagnostic, Node, Pos, Spanned};
use super::expr::{Schema, closest, equal};
use super::value::{Row, Value};
use super::{Errors, Pipeline, SinkUse};

/// A test file, read and checked.
#[derive(Debug)]
pub struct TestFile {
    file: String,
    pipeline: Pipeline,
    cases: Vec<Case>,
}

/// One case of a test file.
#[derive(Debug)]
struct Case {
    name: String,
    input: Vec<Input>,
    expect: Vec<(String, Pos, Vec<Value>)>,
}

/// What the sources give, in order: records (by the index of their
/// source in the pipeline's inputs) and watermarks.
#[derive(Debug)]
enum Input {
    Record(usize, Value),
    Watermark(i64),
}

/// How each case of a test file went.
#[derive(Debug)]
pub struct TestReport {
    /// The test file.
    pub file: String,
    /// Per case: its name, and what went wrong (nothing when it passed).
    pub cases: Vec<(String, Vec<String>)>,
}

impl TestReport {
    /// Whether every case passed.
    pub fn passed(&self) -> bool {
        self.cases.iter().all(|(_, problems)| problems.is_empty())
    }
}

impl fmt::Display for TestReport {
    /// One line per case (`ok` or `FAILED`), the problems of a failed one
    /// below it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, problems)) in self.cases.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}: test `{name}`: {}", self.file, if problems.is_empty() { "ok" } else { "FAILED" })?;
            for p in problems {
                write!(f, "\n  {p}")?;
            }
        }
        Ok(())
    }
}

impl TestFile {
    /// Reads and checks the test file at `path` and the pipeline file it
    /// names.
    ///
    /// # Errors
    /// Everything wrong in either file, each at its position.
    pub fn from_file(path: impl AsRef<Path>) -> Result<TestFile, Errors> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let errors = |diagnostics| Errors { file: file.clone(), diagnostics };
        let bytes = std::fs::read(path).map_err(|e| {
            errors(vec![Diagnostic::new(Pos { line: 1, column: 1 }, format!("cannot read the file: {e}"))])
        })?;
        let root = doc::parse(&bytes).map_err(|d| errors(vec![d]))?;
        let mut problems = Vec::new();
        let entries = root.as_map().unwrap_or_default();
        if root.as_map().is_none() {
            problems.push(Diagnostic::new(root.pos, "a test file is a mapping of `pipeline` and `tests`"));
        }
        unknown_keys(entries, &["pipeline", "tests"], "a test file", &mut problems);
        let get = |key: &str| entries.iter().find(|(k, _)| k.node == key).map(|(_, v)| v);
        let Some(pipeline_node) = get("pipeline").filter(|n| n.as_str().is_some()) else {
            problems.push(
                Diagnostic::new(root.pos, "the test file names no `pipeline` file").help("add pipeline: <file>.yaml"),
            );
            return Err(errors(problems));
        };
        let pipeline_path = path.parent().unwrap_or(Path::new(".")).join(pipeline_node.as_str().unwrap_or_default());
        let pipeline = Pipeline::from_file(&pipeline_path)?;
        let mut cases = Vec::new();
        match get("tests").and_then(Spanned::as_seq) {
            Some(items) => {
                for item in items {
                    if let Some(case) = read_case(item, &pipeline, &mut problems) {
                        cases.push(case);
                    }
                }
            }
            None => problems.push(
                Diagnostic::new(root.pos, "the test file has no `tests`")
                    .help("add tests: [ { name, input, expect } ]"),
            ),
        }
        if !problems.is_empty() {
            problems.sort_by_key(|d| d.pos);
            return Err(errors(problems));
        }
        Ok(TestFile { file, pipeline, cases })
    }

    /// Registers the function of the pipeline's `process` steps named
    /// `name` (see [`Pipeline::with_function`]).
    #[must_use]
    pub fn with_function(
        mut self,
        name: &str,
        f: impl Fn(&Value, &mut Vec<Value>) -> Result<(), String> + Send + Sync + 'static,
    ) -> TestFile {
        self.pipeline = self.pipeline.with_function(name, f);
        self
    }

    /// Runs every case.
    ///
    /// # Errors
    /// A case whose job could not run (not one whose output differs:
    /// that is in the report).
    pub fn run(&self) -> weibo::Result<TestReport> {
        let spec = self.pipeline.spec();
        let names = spec.source_names();
        // Per source: its fields and its event time's field.
        let sources: Vec<(Schema, Option<usize>)> = names
            .iter()
            .map(|n| {
                let s = spec.sources.get(n);
                (
                    s.map_or_else(Schema::open, |s| s.schema.clone()),
                    s.and_then(|s| s.event_time.as_ref()).map(|t| t.field),
                )
            })
            .collect();
        let mut report = TestReport { file: self.file.clone(), cases: Vec::new() };
        for case in &self.cases {
            let mut h = Harness::<Row>::new(&spec.job);
            // One input for all sources: with several, each record carries
            // its source's index as a last field, which its source's
            // stream drops.
            let input = h.input();
            let mut inputs = BTreeMap::new();
            if names.len() == 1 {
                inputs.insert(spec_from(&names), input);
            } else {
                for (i, name) in names.iter().enumerate() {
                    let tag = Value::Int(i as i64);
                    let own = input
                        .filter(move |r: &Row| r.0.last() == Some(&tag))
                        .name(name)
                        .map(|mut r: Row| {
                            r.0.pop();
                            r
                        })
                        .name(&format!("{name}:records"));
                    inputs.insert(name.clone(), own);
                }
            }
            let mut probes: Vec<(String, Schema, Probe<Row>)> = Vec::new();
            super::build::wire_after(spec, self.pipeline.functions(), inputs, &mut |sink, u: &SinkUse| {
                probes.push((sink.to_string(), u.schema.clone(), h.output(&u.stream)));
                true
            })
            .map_err(|e| weibo::Error::Connector {
                name: self.file.clone(),
                message: e.to_string(),
                source: None,
            })?;
            let mut running = h.start()?;
            for i in &case.input {
                match i {
                    Input::Record(source, v) => {
                        let Some((schema, time)) = sources.get(*source) else { continue };
                        let mut row = schema.row_of(v);
                        let at = match time.map(|f| row.field(f)) {
                            Some(Value::Int(ms)) => *ms,
                            Some(Value::Float(ms)) => *ms as i64,
                            _ => 0,
                        };
                        if names.len() > 1 {
                            row.0.push(Value::Int(*source as i64));
                        }
                        running.push(row, at)?;
                    }
                    Input::Watermark(wm) => running.watermark(*wm)?,
                }
            }
            running.finish()?;
            let mut got: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
            for (sink, schema, probe) in &probes {
                got.entry(sink).or_default().extend(probe.take().iter().map(|r| schema.to_value(r)));
            }
            let mut problems = Vec::new();
            for (sink, _, want) in &case.expect {
                let have = got.get(sink.as_str()).cloned().unwrap_or_default();
                problems.extend(compare(sink, want, have));
            }
            report.cases.push((case.name.clone(), problems));
        }
        Ok(report)
    }
}

/// What differs between the records `sink` must get and those it got, in
/// any order.
fn compare(sink: &str, want: &[Value], mut have: Vec<Value>) -> Vec<String> {
    let mut missing = Vec::new();
    for w in want {
        match have.iter().position(|h| same(h, w)) {
            Some(i) => {
                have.swap_remove(i);
            }
            None => missing.push(w),
        }
    }
    let mut problems = Vec::new();
    for m in missing {
        problems.push(format!("sink `{sink}` did not get {m}"));
    }
    for h in have {
        problems.push(format!("sink `{sink}` got {h}, which the test does not expect"));
    }
    problems
}

/// Equality of an output record and an expected one: numbers across int
/// and double, maps by their keys in any order.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Map(x), Value::Map(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.iter().any(|(k2, v2)| k == k2 && same(v, v2)))
        }
        (Value::List(x), Value::List(y)) => x.len() == y.len() && x.iter().zip(y.iter()).all(|(a, b)| same(a, b)),
        _ => equal(a, b),
    }
}

fn read_case(item: &Spanned, pipeline: &Pipeline, problems: &mut Vec<Diagnostic>) -> Option<Case> {
    let names = pipeline.spec().source_names();
    let schema_of = |name: &str| pipeline.spec().sources.get(name).map_or_else(Schema::open, |s| s.schema.clone());
    let Some(entries) = item.as_map() else {
        problems.push(
            Diagnostic::new(item.pos, format!("a test is {}, not a mapping", item.kind()))
                .help("write - { name, input, expect }"),
        );
        return None;
    };
    unknown_keys(entries, &["name", "input", "expect"], "a test", problems);
    let get = |key: &str| entries.iter().find(|(k, _)| k.node == key).map(|(_, v)| v);
    let name =
        get("name").and_then(Spanned::as_str).map_or_else(|| format!("at line {}", item.pos.line), str::to_string);
    let mut input = Vec::new();
    for i in get("input").and_then(Spanned::as_seq).unwrap_or_default() {
        match i.as_map() {
            Some([(k, wm)]) if k.node == "watermark" => {
                match wm.as_str().and_then(|t| t.replace('_', "").parse::<i64>().ok()) {
                    Some(wm) => input.push(Input::Watermark(wm)),
                    None => problems.push(Diagnostic::new(wm.pos, "a watermark is a time in milliseconds")),
                }
            }
            Some([(k1, source), (k2, record)]) if k1.node == "from" && k2.node == "record" => {
                let from = source.as_str().unwrap_or_default();
                match names.iter().position(|n| n == from) {
                    Some(index) => {
                        check_fields(record, &schema_of(from), problems);
                        input.push(Input::Record(index, value_of(record)));
                    }
                    None => problems.push(
                        Diagnostic::new(source.pos, format!("the pipeline reads no source `{from}`"))
                            .help(format!("its sources are: {}", names.join(", "))),
                    ),
                }
            }
            Some(_) => {
                check_fields(i, &schema_of(&spec_from(&names)), problems);
                input.push(Input::Record(0, value_of(i)));
            }
            None => problems.push(Diagnostic::new(
                i.pos,
                "an input is a record (a mapping of its fields), `{ from: <source>, record: {...} }` or `watermark: <ms>`",
            )),
        }
    }
    let mut expect = Vec::new();
    match get("expect").and_then(Spanned::as_map) {
        Some(sinks) => {
            for (sink, records) in sinks {
                if !pipeline.spec().sinks.contains_key(&sink.node) {
                    let names: Vec<&str> = pipeline.spec().sinks.keys().map(String::as_str).collect();
                    let help = match closest(&sink.node, names.iter().copied()) {
                        Some(near) => format!("did you mean `{near}`?"),
                        None => format!("the pipeline's sinks are: {}", names.join(", ")),
                    };
                    problems.push(
                        Diagnostic::new(sink.pos, format!("the pipeline has no sink `{}`", sink.node)).help(help),
                    );
                }
                let want = records.as_seq().unwrap_or_default().iter().map(value_of).collect();
                expect.push((sink.node.clone(), sink.pos, want));
            }
        }
        None => problems.push(
            Diagnostic::new(item.pos, format!("test `{name}` expects nothing"))
                .help("add expect: { <sink>: [records] }"),
        ),
    }
    Some(Case { name, input, expect })
}

/// The pipeline's own source: the first of its inputs.
fn spec_from(names: &[String]) -> String {
    names.first().cloned().unwrap_or_default()
}

/// Errors for the fields of `record` its source does not have.
fn check_fields(record: &Spanned, schema: &Schema, problems: &mut Vec<Diagnostic>) {
    if schema.open {
        return;
    }
    for (k, _) in record.as_map().unwrap_or_default() {
        if schema.index(&k.node).is_none() {
            let help = match closest(&k.node, schema.fields.iter().map(|f| &**f)) {
                Some(near) => format!("did you mean `{near}`? The source's fields are: {schema}"),
                None => format!("the source's fields are: {schema}"),
            };
            problems.push(Diagnostic::new(k.pos, format!("the source has no field `{}`", k.node)).help(help));
        }
    }
}

fn unknown_keys(entries: &[(Spanned<String>, Spanned)], known: &[&str], what: &str, problems: &mut Vec<Diagnostic>) {
    for (k, _) in entries {
        if !known.contains(&k.node.as_str()) {
            let help = match closest(&k.node, known.iter().copied()) {
                Some(near) => format!("did you mean `{near}`? The keys of {what} are: {}", known.join(", ")),
                None => format!("the keys of {what} are: {}", known.join(", ")),
            };
            problems.push(Diagnostic::new(k.pos, format!("unknown key `{}` in {what}", k.node)).help(help));
        }
    }
}

/// A YAML node as a value: plain scalars typed as YAML's core schema has
/// them (null, bools, ints, floats), quoted ones strings.
pub fn value_of(node: &Spanned) -> Value {
    match &node.node {
        Node::Scalar { .. } if node.is_null() => Value::Null,
        Node::Scalar { text, plain: true } => match text.as_str() {
            "true" | "True" | "TRUE" => Value::Bool(true),
            "false" | "False" | "FALSE" => Value::Bool(false),
            t => match t.parse::<i64>() {
                Ok(i) => Value::Int(i),
                Err(_) => match t.parse::<f64>() {
                    Ok(f) if t.contains(|c: char| c.is_ascii_digit()) => Value::Float(f),
                    _ => Value::str(t),
                },
            },
        },
        Node::Scalar { text, .. } => Value::str(text),
        Node::Seq(items) => Value::List(Arc::new(items.iter().map(value_of).collect())),
        Node::Map(entries) => {
            Value::Map(Arc::new(entries.iter().map(|(k, v)| (Arc::from(k.node.as_str()), value_of(v))).collect()))
        }
    }
}
