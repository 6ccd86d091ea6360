//! Pipelines declared in YAML and run without compiling anything.
//!
//! A pipeline file names its sources, its steps (`filter`, `map`,
//! `process`, `key_by`, `window` with `aggregate`, a running `aggregate`,
//! `reduce`, `dedup`, `route`, `join`, `to`), named streams of steps of
//! their own, and its sinks; expressions are CEL over `event`, the record. The file is
//! checked whole before anything runs, each problem reported at its line
//! and column ([`Errors`]); then it is wired into a [`weibo::Job`] like
//! any typed pipeline, over [`Row`]s: the same operators, state,
//! checkpoints, metrics and admin API.
//!
//! ```
//! use weibo_connectors::yaml::Pipeline;
//!
//! let file = br#"
//! job: evens
//! sources:
//!   numbers: { generator: { count: 10, fields: { n: "i" } } }
//! pipeline:
//!   - from: numbers
//!   - filter: "event.n % 2 == 0"
//!   - to: { blackhole: {} }
//! "#;
//! let pipeline = Pipeline::parse("evens.yaml", file)?;
//! let job = pipeline.job()?;
//! let report = weibo::testing::block_on(job.run())?;
//! // The generator's fields and the filter run as one operator, over
//! // whole batches.
//! let chain = report.metrics.operator("numbers:fields+filter");
//! assert_eq!(chain.map(|o| (o.records_in, o.records_out)), Some((10, 5)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod acc;
pub mod agg;
pub mod build;
pub mod doc;
pub mod expr;
pub mod spec;
#[cfg(feature = "postgres")]
pub mod sql;
pub mod testfile;
pub mod value;
mod vector;

use std::fmt;
use std::path::Path;

pub use build::{BuildError, Function, Out, SinkUse};
pub use doc::{Diagnostic, Pos};
pub use expr::{Expr, Schema};
pub use spec::Spec;
pub use testfile::{TestFile, TestReport};
pub use value::{Row, Value};

/// A checked pipeline file.
pub struct Pipeline {
    file: String,
    spec: Spec,
    functions: build::Functions,
}

impl fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pipeline")
            .field("file", &self.file)
            .field("spec", &self.spec)
            .field("functions", &self.functions.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Everything wrong with a pipeline file, each at its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Errors {
    /// The file, as named to [`Pipeline::parse`].
    pub file: String,
    /// The problems, in the file's order.
    pub diagnostics: Vec<Diagnostic>,
}

impl fmt::Display for Errors {
    /// One problem per line, `file:line:column: message`, with what to
    /// write instead on the next line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.diagnostics.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}:{}: {}", self.file, d.pos, d.message)?;
            if let Some(help) = &d.help {
                write!(f, "\n  help: {help}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for Errors {}

impl Pipeline {
    /// Reads and checks the pipeline file at `path`; `${NAME}` in its
    /// strings is the environment variable NAME, and the relative paths it
    /// names (files, checkpoint storage) are relative to its folder.
    ///
    /// # Errors
    /// The file cannot be read, or [`Errors`] with everything wrong in it.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Pipeline, Errors> {
        let path = path.as_ref();
        let file = path.display().to_string();
        match std::fs::read(path) {
            Ok(bytes) => {
                let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
                Pipeline::parse_in(&file, &bytes, &|name| std::env::var(name).ok(), Some(&base))
            }
            Err(e) => Err(Errors {
                file,
                diagnostics: vec![Diagnostic::new(Pos { line: 1, column: 1 }, format!("cannot read the file: {e}"))],
            }),
        }
    }

    /// Checks the pipeline file `bytes`, named `file` in messages, with
    /// the process's environment variables.
    ///
    /// # Errors
    /// [`Errors`] with everything wrong in it.
    pub fn parse(file: &str, bytes: &[u8]) -> Result<Pipeline, Errors> {
        Pipeline::parse_with_env(file, bytes, &|name| std::env::var(name).ok())
    }

    /// Checks the pipeline file `bytes` with `env` for `${NAME}`.
    ///
    /// # Errors
    /// [`Errors`] with everything wrong in it.
    pub fn parse_with_env(file: &str, bytes: &[u8], env: &dyn Fn(&str) -> Option<String>) -> Result<Pipeline, Errors> {
        Pipeline::parse_in(file, bytes, env, None)
    }

    fn parse_in(
        file: &str,
        bytes: &[u8],
        env: &dyn Fn(&str) -> Option<String>,
        base: Option<&Path>,
    ) -> Result<Pipeline, Errors> {
        let errors = |diagnostics| Errors { file: file.to_string(), diagnostics };
        let root = doc::parse(bytes).map_err(|d| errors(vec![d]))?;
        let spec = spec::check(&root, env, base).map_err(errors)?;
        Ok(Pipeline { file: file.to_string(), spec, functions: build::Functions::new() })
    }

    /// Registers the function of the `process` steps that name `name`:
    /// it gets each record as a map of its fields and pushes the records it
    /// gives, each a map of the step's `gives` fields (a field it lacks is
    /// null); an error fails the record under the step's `on_error`. The
    /// escape hatch of a YAML pipeline run from a Rust program: a lookup,
    /// a parser, anything an expression cannot say.
    ///
    /// ```
    /// use weibo::prelude::*;
    /// use weibo_connectors::yaml::{Pipeline, Row, Value};
    ///
    /// let file = br#"
    /// job: words
    /// sources: { lines: { generator: { count: 2, fields: { line: "i == 0 ? 'a b' : 'c'" } } } }
    /// pipeline:
    ///   - from: lines
    ///   - process: { function: split, gives: [word] }
    ///   - to: out
    /// sinks: { out: { stdout: {} } }
    /// "#;
    /// let split = |record: &Value, out: &mut Vec<Value>| {
    ///     let Some(Value::Str(line)) = record.get("line") else { return Err("no line".to_string()) };
    ///     for word in line.split(' ') {
    ///         out.push(Value::map([("word", Value::str(word))]));
    ///     }
    ///     Ok(())
    /// };
    /// let words = CollectSink::new();
    /// let job = Pipeline::parse("words.yaml", file)?.with_function("split", split).job_with_sinks(|_, records| {
    ///     records.stream.map(|r: Row| r.field(0).to_string()).sink(words.clone());
    ///     true
    /// })?;
    /// weibo::testing::block_on(job.run())?;
    /// let mut words = words.values();
    /// words.sort();
    /// assert_eq!(words, ["a", "b", "c"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_function(
        mut self,
        name: &str,
        f: impl Fn(&Value, &mut Vec<Value>) -> Result<(), String> + Send + Sync + 'static,
    ) -> Pipeline {
        self.functions.insert(name.to_string(), std::sync::Arc::new(f));
        self
    }

    /// The functions registered for `process` steps.
    pub fn functions(&self) -> &build::Functions {
        &self.functions
    }

    /// The file's name.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The checked pipeline.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// The pipeline wired into a new job, ready to run (or to be given an
    /// admin API, a restore, a state backend first).
    ///
    /// # Errors
    /// A connector that cannot be set up (a Kafka cluster that does not
    /// answer).
    pub fn job(&self) -> Result<weibo::Job, BuildError> {
        build::build(&self.spec, &self.functions)
    }

    /// The pipeline wired into a new job, with some of its sinks replaced:
    /// each stream of records to a sink is offered to `take` (with the
    /// sink's name), which returns `true` when it has wired the records to
    /// a sink of its own. For tests, and for a Rust program that runs a
    /// YAML pipeline into its own sinks.
    ///
    /// ```
    /// use weibo::prelude::*;
    /// use weibo_connectors::yaml::{Pipeline, Row, Value};
    ///
    /// let file = br#"
    /// job: squares
    /// sources: { n: { generator: { count: 4, fields: { i: "i", square: "i * i" } } } }
    /// pipeline: [ { from: n }, { to: out } ]
    /// sinks: { out: { stdout: {} } }
    /// "#;
    /// let collected = CollectSink::new();
    /// let job = Pipeline::parse("squares.yaml", file)?.job_with_sinks(|sink, records| {
    ///     if sink != "out" {
    ///         return false;
    ///     }
    ///     records.stream.map(|r: Row| r.field(1).clone()).sink(collected.clone());
    ///     true
    /// })?;
    /// weibo::testing::block_on(job.run())?;
    /// let mut squares = collected.values();
    /// squares.sort_by_key(|v| v.to_string());
    /// assert_eq!(squares, [0, 1, 4, 9].map(Value::Int));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`Pipeline::job`].
    pub fn job_with_sinks(&self, mut take: impl FnMut(&str, &SinkUse) -> bool) -> Result<weibo::Job, BuildError> {
        build::build_with(&self.spec, &self.functions, &mut take)
    }
}
