//! A pipeline built from node descriptors and factory objects alone, with
//! JSON text as its values and no user types: the seam that pipelines
//! described outside Rust (YAML, later) will use. Nothing here goes
//! through the typed DSL.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::codec::Data;
use crate::error::{Error, Result};
use crate::graph::{EdgeKind, Graph, Input, Node, Op, Port, TypedPort};
use crate::operator::exchange::{BatchLimits, KeyGroupRoutes, RouterOp};
use crate::operator::factory::{ChainFactory, KeyedFactory, OperatorContext, RouterFactory, SourceFactory};
use crate::operator::keyed::ReduceOp;
use crate::operator::sink::SinkOp;
use crate::operator::source::{SourceOp, SourceOperator};
use crate::operator::stateless::FilterOp;
use crate::operator::{AnyConsumer, InputOperator, erase, typed};
use crate::record::{Batch, BatchPool, NO_TIMESTAMP};
use crate::sinks::{CollectSink, Sink};
use crate::sources::{IterSource, Source, SourceOutput};
use crate::state::ValueStore;

use super::config::JobConfig;

/// A JSON record, as bytes.
type Json = Vec<u8>;

fn json(bytes: &[u8]) -> Option<serde_json::Value> {
    serde_json::from_slice(bytes).ok()
}

fn field(bytes: &[u8], name: &str) -> Option<serde_json::Value> {
    json(bytes)?.get(name).cloned()
}

/// Reads JSON lines given in the descriptor.
struct JsonLines(Vec<String>);

impl SourceFactory for JsonLines {
    fn instantiate(&self, ctx: &OperatorContext<'_>, output: AnyConsumer) -> Result<Box<dyn SourceOperator>> {
        let source = IterSource::new(self.0.iter().map(|l| l.as_bytes().to_vec()).collect::<Vec<Json>>());
        let reader = match ctx.restored_position {
            Some(p) => source.open_at(ctx.instance, p)?,
            None => source.open(ctx.instance)?,
        };
        Ok(Box::new(SourceOp {
            info: ctx.info.clone(),
            partition_name: None,
            reader,
            chain: typed::<Json>(output, &ctx.info.name)?,
            output: SourceOutput::new(ctx.info.name.clone(), 0, 0, ctx.batch_size),
        }))
    }
}

/// Keeps the records that are JSON objects with field `.0`.
struct HasField(&'static str);

impl ChainFactory for HasField {
    fn instantiate(&self, ctx: &OperatorContext<'_>, mut outputs: Vec<AnyConsumer>) -> Result<AnyConsumer> {
        let name = self.0;
        let next = typed::<Json>(outputs.pop().ok_or_else(|| crate::error::internal_error!("no output"))?, "filter")?;
        let f = move |r: &Json| field(r, name).is_some();
        Ok(erase::<Json>(Box::new(FilterOp { info: ctx.info.clone(), f: Arc::new(f), keep: Vec::new(), next })))
    }
}

type KeyFn = dyn Fn(&Json) -> String + Send + Sync;

/// Routes records by the text of field `.0`.
struct ByField(&'static str);

impl RouterFactory for ByField {
    fn instantiate(&self, ctx: &OperatorContext<'_>, senders: Vec<usize>) -> Result<AnyConsumer> {
        let name = self.0;
        let key_fn: Arc<KeyFn> = Arc::new(move |r: &Json| field(r, name).map(|v| v.to_string()).unwrap_or_default());
        let limits = BatchLimits { records: ctx.batch_size, bytes: ctx.batch_bytes };
        let pool = BatchPool::default();
        Ok(erase::<Json>(Box::new(RouterOp::<Json, String, KeyFn> {
            info: ctx.info.clone(),
            key_fn,
            targets: senders.iter().map(|_| pool.take(limits.records, 16 * limits.records)).collect(),
            pool,
            routes: KeyGroupRoutes::new(ctx.max_key_groups, senders.len()),
            senders,
            outbox: ctx.outbox.clone(),
            limits,
            key_buf: Vec::new(),
            encode: true,
            typed: Vec::new(),
            alignment: ctx.alignment.clone(),
            watermark: NO_TIMESTAMP,
            sent_watermark: NO_TIMESTAMP,
            _t: PhantomData,
        })))
    }
}

/// Per key, a running sum of field `.0`, emitted as the record with that
/// field replaced by the sum.
struct SumField(&'static str);

impl KeyedFactory for SumField {
    fn instantiate(&self, ctx: &OperatorContext<'_>, mut outputs: Vec<AnyConsumer>) -> Result<Box<dyn InputOperator>> {
        let name = self.0;
        let next = typed::<Json>(outputs.pop().ok_or_else(|| crate::error::internal_error!("no output"))?, "sum")?;
        let f = move |acc: Json, r: Json| -> Json {
            let sum = field(&acc, name).and_then(|v| v.as_i64()).unwrap_or(0)
                + field(&r, name).and_then(|v| v.as_i64()).unwrap_or(0);
            let mut out = json(&r).unwrap_or_default();
            out[name] = sum.into();
            out.to_string().into_bytes()
        };
        Ok(Box::new(ReduceOp {
            info: ctx.info.clone(),
            state: ValueStore::<String, Json>::open(ctx.state, &ctx.state_scope("value"))?,
            f: Arc::new(f),
            out: Batch::with_capacity(ctx.batch_size),
            next,
            decoded: Vec::new(),
        }))
    }
}

/// Collects what reaches it.
struct Collect(CollectSink<Json>);

impl ChainFactory for Collect {
    fn instantiate(&self, ctx: &OperatorContext<'_>, _outputs: Vec<AnyConsumer>) -> Result<AnyConsumer> {
        let writer = self.0.open(ctx.instance, ctx.parallelism)?;
        Ok(erase::<Json>(Box::new(SinkOp::new(ctx.info.clone(), Box::new(move || Ok(writer)), false))))
    }
}

fn json_port(must_consume: bool) -> Port {
    // The type name is what the hash edge's codec checks the port against.
    Port {
        type_name: std::any::type_name::<Json>(),
        ty: TypedPort::<Json>::shared(),
        must_consume,
        label: "output".into(),
        tag: None,
    }
}

fn node(kind: &'static str, name: &str, inputs: Vec<Input>, outputs: Vec<Port>, op: Op) -> Node {
    Node {
        kind,
        name: name.into(),
        uid: None,
        state_version: 1,
        named: true,
        stateful: matches!(op, Op::Keyed { .. }),
        detail: String::new(),
        inputs,
        outputs,
        op,
    }
}

/// The graph a pipeline description would give: source → filter → hash by
/// `user` → running sum of `amount` (2 instances) → collect.
fn described(lines: &[&str], out: &CollectSink<Json>) -> Graph {
    let mut g = Graph::new("described".into(), 16, "memory".into());
    let forward = |from| Input { from, port: 0, kind: EdgeKind::Forward };
    let source = g.add(node(
        "source",
        "orders",
        vec![],
        vec![json_port(true)],
        Op::Source { partitions: 1, factory: Arc::new(JsonLines(lines.iter().map(|l| l.to_string()).collect())) },
    ));
    let valid = g.add(node(
        "filter",
        "valid",
        vec![forward(source)],
        vec![json_port(true)],
        Op::Chain(Arc::new(HasField("user"))),
    ));
    let hash = EdgeKind::Hash {
        key_type: "json field `user`",
        key_schema: || crate::codec::schema::Shape::Opaque("json field `user`".into()),
        codec: Json::codec_id(),
    };
    let sums = g.add(node(
        "reduce",
        "sums",
        vec![Input { from: valid, port: 0, kind: hash }],
        vec![json_port(true)],
        Op::Keyed { parallelism: 2, router: Arc::new(ByField("user")), factory: Arc::new(SumField("amount")) },
    ));
    g.add(node("sink", "collect", vec![forward(sums)], vec![], Op::Chain(Arc::new(Collect(out.clone())))));
    g
}

#[test]
fn graph_from_descriptors_runs_without_user_types() {
    let lines = [
        r#"{"user":"ann","amount":3}"#,
        r#"{"user":"bob","amount":5}"#,
        r#"not json"#,
        r#"{"user":"ann","amount":4}"#,
        r#"{"amount":100}"#,
        r#"{"user":"bob","amount":1}"#,
        r#"{"user":"ann","amount":10}"#,
    ];
    let out = CollectSink::new();
    let graph = described(&lines, &out);
    graph.validate().unwrap();
    let plan = graph.plan_text().unwrap();
    assert!(plan.contains("chain `orders` x1: orders -> valid => hash(json field `user`) sums"), "{plan}");
    assert!(plan.contains("chain `sums` x2: sums -> collect"), "{plan}");

    let config = JobConfig::default();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let report = runtime
        .block_on(async {
            let launched = super::launch::launch(
                &graph,
                &config,
                &std::sync::Arc::new(tokio::sync::watch::channel(super::status::JobState::Starting).0),
            )?;
            launched.supervisor.await.map_err(|e| crate::error::internal_error!("{e}"))??;
            Ok::<_, Error>(launched.registry.snapshot())
        })
        .unwrap();

    // The last running sum of each user is its total; records without a
    // `user`, or not JSON, were filtered out.
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    let values = out.values();
    assert_eq!(values.len(), 5, "one running sum per valid record");
    for v in &values {
        let user = field(v, "user").and_then(|u| u.as_str().map(str::to_string)).unwrap();
        last.insert(user, field(v, "amount").and_then(|a| a.as_i64()).unwrap());
    }
    assert_eq!(last, BTreeMap::from([("ann".to_string(), 17), ("bob".to_string(), 6)]));
    assert_eq!(report.operator("valid").unwrap().records_in, 7);
    assert_eq!(report.operator("sums").unwrap().records_in, 5);
}

#[test]
fn a_described_graph_is_checked_like_a_typed_one() {
    let out = CollectSink::new();
    let mut graph = described(&[], &out);
    // A second source whose records nothing reads, and a keyed node with
    // more instances than key groups: both are reported, at once.
    graph.add(node(
        "source",
        "orphan",
        vec![],
        vec![json_port(true)],
        Op::Source { partitions: 1, factory: Arc::new(JsonLines(Vec::new())) },
    ));
    if let Some(Op::Keyed { parallelism, .. }) = graph.nodes.get_mut(2).map(|n| &mut n.op) {
        *parallelism = 17;
    }
    let err = graph.validate().unwrap_err().to_string();
    assert!(err.contains("2 wiring problems"), "{err}");
    assert!(err.contains("the output of `orphan` is not consumed"), "{err}");
    assert!(err.contains("`sums` runs with 17 partitions"), "{err}");
}
