//! The logical graph: operator descriptors joined by edges, with types
//! erased. The typed DSL ([`crate::stream`]) builds it; [`plan`] validates it,
//! fuses chains of stateless operators into nodes and expands every node
//! into its parallel instances.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::checkpoint::{Restore, TaskEvent};
use crate::codec::CodecId;
use crate::error::{Error, Result};
use crate::metrics::{OperatorCounters, Registry};
use crate::operator::InputOperator;
use crate::operator::{AnyConsumer, Consumer, Outbox, erase, unerase};
use crate::operator::{DiscardOp, OpInfo, TeeOp};
use crate::record::SourceNames;
use crate::runtime::EdgeSender;
use crate::runtime::heads::{ChannelHead, CheckpointIo, HeadRunner, Inbox, NodeIo};
use crate::state::StateBackend;
use crate::stream::job::JobConfig;

pub(crate) type NodeId = usize;

/// How records travel from one node's port to another node.
#[derive(Clone, Debug)]
pub(crate) enum EdgeKind {
    /// Same task, same instance: the operators are fused.
    Forward,
    /// Encoded, routed by key group to the instance that owns it.
    Hash { key_type: &'static str, codec: CodecId },
}

#[derive(Clone, Debug)]
pub(crate) struct Input {
    pub(crate) from: NodeId,
    pub(crate) port: usize,
    pub(crate) kind: EdgeKind,
}

/// Type-specific helpers for one output port.
pub(crate) trait PortType: Send + Sync {
    fn tee(&self, outs: Vec<AnyConsumer>) -> Result<AnyConsumer>;
    fn discard(&self) -> AnyConsumer;
}

pub(crate) struct TypedPort<T>(PhantomData<fn() -> T>);

impl<T: Clone + Send + 'static> TypedPort<T> {
    pub(crate) fn shared() -> Arc<dyn PortType> {
        Arc::new(Self(PhantomData))
    }
}

impl<T: Clone + Send + 'static> PortType for TypedPort<T> {
    fn tee(&self, outs: Vec<AnyConsumer>) -> Result<AnyConsumer> {
        let outs = outs.into_iter().map(|c| unerase::<T>(c, "fan-out")).collect::<Result<Vec<_>>>()?;
        Ok(erase::<T>(Box::new(TeeOp { outs })))
    }
    fn discard(&self) -> AnyConsumer {
        erase::<T>(Box::new(DiscardOp))
    }
}

pub(crate) struct Port {
    pub(crate) type_name: &'static str,
    pub(crate) ty: Arc<dyn PortType>,
    /// Whether leaving the port unconsumed would lose records silently.
    pub(crate) must_consume: bool,
    pub(crate) label: &'static str,
}

/// Builds one instance of a fused operator (or sink) given the consumers of
/// its output ports.
pub(crate) type ChainFactory = dyn Fn(&mut BuildCtx<'_>, OpInfo, Vec<AnyConsumer>) -> Result<AnyConsumer> + Send + Sync;
/// Builds the head of one source partition given its chain.
pub(crate) type SourceFactory =
    dyn Fn(&mut BuildCtx<'_>, OpInfo, usize, AnyConsumer) -> Result<Box<dyn HeadRunner>> + Send + Sync;
/// Builds the router at the end of an upstream chain, given its senders.
pub(crate) type RouterFactory = dyn Fn(&mut BuildCtx<'_>, OpInfo, Vec<usize>) -> Result<AnyConsumer> + Send + Sync;
/// Builds one instance of a keyed operator given its key groups and output consumers.
pub(crate) type KeyedFactory =
    dyn Fn(&mut BuildCtx<'_>, OpInfo, Range<u16>, Vec<AnyConsumer>) -> Result<Box<dyn InputOperator>> + Send + Sync;

pub(crate) enum Op {
    Source { partitions: usize, factory: Arc<SourceFactory> },
    Chain(Arc<ChainFactory>),
    Union,
    Keyed { parallelism: usize, router: Arc<RouterFactory>, factory: Arc<KeyedFactory> },
}

pub(crate) struct Node {
    pub(crate) kind: &'static str,
    pub(crate) name: String,
    pub(crate) detail: String,
    pub(crate) inputs: Vec<Input>,
    pub(crate) outputs: Vec<Port>,
    pub(crate) op: Op,
}

impl Node {
    fn is_head(&self) -> bool {
        matches!(self.op, Op::Source { .. } | Op::Keyed { .. })
    }

    fn parallelism(&self) -> usize {
        match self.op {
            Op::Source { partitions, .. } => partitions,
            Op::Keyed { parallelism, .. } => parallelism,
            _ => 1,
        }
    }
}

/// The logical graph of a job.
pub(crate) struct Graph {
    pub(crate) config: JobConfig,
    pub(crate) nodes: Vec<Node>,
}

/// Strips module paths from a type name: `alloc::string::String` → `String`.
pub(crate) fn short_type_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut segment = String::new();
    let flush = |segment: &mut String, out: &mut String| {
        let last = segment.rsplit("::").next().unwrap_or_default();
        out.push_str(last);
        segment.clear();
    };
    for c in name.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            segment.push(c);
        } else {
            flush(&mut segment, &mut out);
            out.push(c);
        }
    }
    flush(&mut segment, &mut out);
    out
}

impl Graph {
    pub(crate) fn new(config: JobConfig) -> Self {
        Self { config, nodes: Vec::new() }
    }

    pub(crate) fn add(&mut self, mut node: Node) -> NodeId {
        node.name = self.unique_name(&node.name);
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    fn unique_name(&self, wanted: &str) -> String {
        if !self.nodes.iter().any(|n| n.name == wanted) {
            return wanted.to_string();
        }
        (2..).map(|i| format!("{wanted}-{i}")).find(|c| !self.nodes.iter().any(|n| &n.name == c)).unwrap_or_default()
    }

    /// Renames a node; names are unique in a job.
    pub(crate) fn rename(&mut self, node: NodeId, name: &str) -> std::result::Result<(), String> {
        if self.nodes.iter().enumerate().any(|(i, n)| i != node && n.name == name) {
            return Err(format!("two operators are named `{name}`: operator names must be unique in a job"));
        }
        match self.nodes.get_mut(node) {
            Some(n) => {
                n.name = name.to_string();
                Ok(())
            }
            None => Err(format!("no operator #{node}")),
        }
    }

    fn consumers(&self, node: NodeId, port: usize) -> impl Iterator<Item = (NodeId, &Input)> + '_ {
        self.nodes.iter().enumerate().flat_map(move |(id, n)| {
            n.inputs.iter().filter(move |i| i.from == node && i.port == port).map(move |i| (id, i))
        })
    }

    fn node(&self, id: NodeId) -> Result<&Node> {
        self.nodes.get(id).ok_or_else(|| Error::Internal(format!("no node #{id}")))
    }

    fn graph_error(&self, message: String) -> Error {
        Error::Graph { job: self.config.name.clone(), message }
    }

    /// Checks the wiring before anything runs: every problem the builder
    /// recorded and every one the graph has, reported together.
    pub(crate) fn validate(&self) -> Result<()> {
        let mut problems = self.config.wiring_errors.clone();
        problems.extend(self.problems());
        match problems.len() {
            0 => Ok(()),
            1 => Err(self.graph_error(problems.swap_remove(0))),
            n => {
                let list: Vec<String> = problems.iter().enumerate().map(|(i, p)| format!("({}) {p}", i + 1)).collect();
                Err(self.graph_error(format!("{n} wiring problems: {}", list.join("; "))))
            }
        }
    }

    /// What is wrong with the graph's wiring, each a message that says how
    /// to fix it.
    fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.nodes.iter().any(|n| matches!(n.op, Op::Source { .. })) {
            out.push("the job has no source: add one with `job.source(...)`".into());
        }
        // Without any sink, every output is unconsumed: that one problem
        // says it all.
        let has_sink = self.nodes.iter().any(|n| n.kind == "sink");
        if !has_sink {
            out.push("the job has no sink: end a stream with `.sink(...)`".into());
        }
        let max = self.config.max_key_groups;
        for (id, node) in self.nodes.iter().enumerate() {
            for (p, port) in node.outputs.iter().enumerate() {
                if has_sink && port.must_consume && self.consumers(id, p).next().is_none() {
                    let what = if port.label == "output" {
                        format!("the output of `{}` is not consumed, so its records would be lost", node.name)
                    } else {
                        format!("the {} of `{}` are not consumed, so they would be lost", port.label, node.name)
                    };
                    out.push(format!(
                        "{what}: end the stream with a sink (for example `.sink(weibo::sinks::Blackhole::new())` to discard on purpose)"
                    ));
                }
            }
            if let Op::Source { partitions: 0, .. } = node.op {
                out.push(format!("source `{}` has no partitions", node.name));
            }
            if let Op::Keyed { parallelism, .. } = node.op
                && (parallelism == 0 || parallelism > usize::from(max))
            {
                out.push(format!(
                    "`{}` runs with {parallelism} partitions, but partitions must be between 1 and the job's {max} key groups \
                     (raise it with `Job::with_max_key_groups`)",
                    node.name
                ));
            }
            for input in &node.inputs {
                if let EdgeKind::Hash { codec, .. } = &input.kind {
                    let Some(from) = self.nodes.get(input.from) else {
                        out.push(format!(
                            "`{}` has an input from operator #{}, which does not exist",
                            node.name, input.from
                        ));
                        continue;
                    };
                    let sent = from.outputs.get(input.port).map(|p| p.type_name).unwrap_or_default();
                    if sent != codec.type_name {
                        out.push(format!(
                            "the edge from `{}` to `{}` carries `{sent}` but the receiver decodes {codec}",
                            from.name, node.name
                        ));
                    }
                }
            }
        }
        out
    }

    /// The fused plan as text: one line per node (head and the operators
    /// fused into it).
    pub(crate) fn plan_text(&self) -> Result<String> {
        self.validate()?;
        let heads: Vec<NodeId> =
            (0..self.nodes.len()).filter(|&i| self.nodes.get(i).is_some_and(Node::is_head)).collect();
        let tasks: usize = heads.iter().filter_map(|&h| self.nodes.get(h)).map(Node::parallelism).sum();
        let plural = |n: usize, word: &str| if n == 1 { format!("1 {word}") } else { format!("{n} {word}s") };
        let mut out =
            format!("plan of job `{}`: {}, {}\n", self.config.name, plural(heads.len(), "node"), plural(tasks, "task"));
        for h in heads {
            let node = self.node(h)?;
            let _ = write!(out, "  node `{}` x{}: {}", node.name, node.parallelism(), node.name);
            self.chain_text(h, &mut out)?;
            out.push('\n');
        }
        Ok(out)
    }

    fn chain_text(&self, node: NodeId, out: &mut String) -> Result<()> {
        let n = self.node(node)?;
        let mut next = Vec::new();
        for p in 0..n.outputs.len() {
            for (dst, input) in self.consumers(node, p) {
                next.push((p, dst, input));
            }
        }
        let many = next.len() > 1;
        if many {
            out.push_str(" -> {");
        }
        for (k, (p, dst, input)) in next.into_iter().enumerate() {
            if many && k > 0 {
                out.push_str(", ");
            }
            match (&input.kind, many) {
                (EdgeKind::Hash { key_type, .. }, false) => {
                    let _ = write!(out, " => hash({}) ", short_type_name(key_type));
                }
                (EdgeKind::Hash { key_type, .. }, true) => {
                    let _ = write!(out, "hash({}) ", short_type_name(key_type));
                }
                (EdgeKind::Forward, false) => out.push_str(" -> "),
                (EdgeKind::Forward, true) => {}
            }
            if let Some(label) = n.outputs.get(p).map(|port| port.label).filter(|l| *l != "output") {
                let _ = write!(out, "[{label}] ");
            }
            let dst_node = self.node(dst)?;
            out.push_str(&dst_node.name);
            if !matches!(dst_node.op, Op::Keyed { .. }) {
                self.chain_text(dst, out)?;
            }
        }
        if many {
            out.push('}');
        }
        Ok(())
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "job `{}` ({} key groups, state: {})",
            self.config.name,
            self.config.max_key_groups,
            self.config.state.name()
        )?;
        for (id, node) in self.nodes.iter().enumerate() {
            write!(f, "  #{id} {} `{}`", node.kind, node.name)?;
            if let Op::Keyed { parallelism, .. } = node.op {
                write!(f, " x{parallelism}")?;
            }
            if !node.detail.is_empty() {
                write!(f, " ({})", node.detail)?;
            }
            for (k, input) in node.inputs.iter().enumerate() {
                f.write_str(if k == 0 { " <- " } else { ", " })?;
                write!(f, "#{}", input.from)?;
                if input.port > 0 {
                    write!(f, ".{}", input.port)?;
                }
                if let EdgeKind::Hash { key_type, codec } = &input.kind {
                    write!(f, " hash({}) [{}]", short_type_name(key_type), codec.format)?;
                }
            }
            let outs: Vec<String> = node
                .outputs
                .iter()
                .map(|p| match p.label {
                    "output" => short_type_name(p.type_name),
                    label => format!("{label}: {}", short_type_name(p.type_name)),
                })
                .collect();
            if !outs.is_empty() {
                write!(f, " : {}", outs.join(", "))?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// What building one head instance's chain needs.
pub(crate) struct BuildCtx<'a> {
    pub(crate) config: &'a JobConfig,
    pub(crate) registry: &'a Registry,
    pub(crate) sources: SourceNames,
    pub(crate) outbox: Outbox,
    pub(crate) senders: Vec<EdgeSender>,
    /// `name[instance]` of the head being built.
    pub(crate) head: String,
    pub(crate) instance: usize,
    pub(crate) parallelism: usize,
    inboxes: &'a mut HashMap<(NodeId, usize), Vec<Inbox>>,
    /// For fused operators (sinks among them): how many instances each has
    /// in all, and the next instance number to hand out. A fused operator
    /// runs once per head instance that reaches it, so after a `union` its
    /// instances come from several heads.
    chain_instances: &'a mut HashMap<NodeId, (usize, usize)>,
    /// The checkpoint the job restores from, if any.
    pub(crate) restore: Option<&'a Restore>,
}

impl BuildCtx<'_> {
    pub(crate) fn state(&self) -> &dyn StateBackend {
        &*self.config.state
    }
}

/// A runnable job: one head task per node instance.
pub(crate) struct Physical {
    pub(crate) tasks: Vec<(String, Box<dyn HeadRunner>, NodeIo)>,
}

impl Graph {
    fn info(&self, node: &Node, registry: &Registry, sources: &SourceNames) -> OpInfo {
        OpInfo { name: node.name.as_str().into(), counters: registry.operator(&node.name), sources: sources.clone() }
    }

    fn build_port(&self, ctx: &mut BuildCtx<'_>, node: NodeId, port: usize) -> Result<AnyConsumer> {
        let n = self.node(node)?;
        let spec = n.outputs.get(port).ok_or_else(|| Error::Internal(format!("`{}` has no port {port}", n.name)))?;
        let targets: Vec<(NodeId, Input)> = self.consumers(node, port).map(|(id, i)| (id, i.clone())).collect();
        let mut outs = Vec::with_capacity(targets.len());
        for (dst, input) in targets {
            outs.push(self.build_input(ctx, dst, &input)?);
        }
        match outs.len() {
            0 => Ok(spec.ty.discard()),
            1 => outs.pop().ok_or_else(|| Error::Internal("lost a consumer".into())),
            _ => spec.ty.tee(outs),
        }
    }

    fn build_outputs(&self, ctx: &mut BuildCtx<'_>, node: NodeId) -> Result<Vec<AnyConsumer>> {
        let ports = self.node(node)?.outputs.len();
        (0..ports).map(|p| self.build_port(ctx, node, p)).collect()
    }

    fn build_input(&self, ctx: &mut BuildCtx<'_>, dst: NodeId, input: &Input) -> Result<AnyConsumer> {
        let node = self.node(dst)?;
        match &node.op {
            Op::Chain(factory) => {
                let outs = self.build_outputs(ctx, dst)?;
                let info = self.info(node, ctx.registry, &ctx.sources);
                let (head_instance, head_parallelism) = (ctx.instance, ctx.parallelism);
                let (next, total) = ctx.chain_instances.get(&dst).copied().unwrap_or((0, 1));
                ctx.chain_instances.insert(dst, (next + 1, total));
                (ctx.instance, ctx.parallelism) = (next, total);
                let built = factory(ctx, info, outs);
                (ctx.instance, ctx.parallelism) = (head_instance, head_parallelism);
                built
            }
            Op::Union => self.build_port(ctx, dst, 0),
            Op::Keyed { parallelism, router, .. } => {
                let from = self.node(input.from)?;
                let mut senders = Vec::with_capacity(*parallelism);
                for j in 0..*parallelism {
                    let (tx, rx) = mpsc::channel(ctx.config.channel_capacity.max(1));
                    let to = format!("{}[{j}]", node.name);
                    let counters = ctx.registry.edge(ctx.head.clone(), to.clone());
                    ctx.inboxes.entry((dst, j)).or_default().push(Inbox { from: ctx.head.clone(), rx });
                    senders.push(ctx.senders.len());
                    ctx.senders.push(EdgeSender { tx, counters, to });
                }
                let info = OpInfo {
                    name: format!("{} -> {}", from.name, node.name).into(),
                    counters: Arc::new(OperatorCounters::default()),
                    sources: ctx.sources.clone(),
                };
                router(ctx, info, senders)
            }
            Op::Source { .. } => Err(Error::Internal(format!("source `{}` has an input", node.name))),
        }
    }

    /// Adds `copies` to the instance count of every fused operator reachable
    /// from `node`'s `port` without crossing a shuffle edge.
    fn count_chain_instances(
        &self,
        node: NodeId,
        port: usize,
        copies: usize,
        counts: &mut HashMap<NodeId, (usize, usize)>,
    ) {
        let targets: Vec<NodeId> = self.consumers(node, port).map(|(id, _)| id).collect();
        for dst in targets {
            let Some(n) = self.nodes.get(dst) else { continue };
            match n.op {
                Op::Chain(_) => {
                    counts.entry(dst).or_insert((0, 0)).1 += copies;
                    for p in 0..n.outputs.len() {
                        self.count_chain_instances(dst, p, copies, counts);
                    }
                }
                Op::Union => self.count_chain_instances(dst, 0, copies, counts),
                Op::Keyed { .. } | Op::Source { .. } => {}
            }
        }
    }

    /// Fuses and expands the graph into head tasks with their chains.
    /// A hash of the operators, their names, types and edges, leaving out
    /// parallelism: a checkpoint restores only into the same pipeline, but
    /// may restore with other partition counts.
    pub(crate) fn fingerprint(&self) -> String {
        let mut text = String::new();
        for (id, n) in self.nodes.iter().enumerate() {
            let _ = write!(text, "{id}:{}:{}:", n.kind, n.name);
            for p in &n.outputs {
                let _ = write!(text, "{},", p.type_name);
            }
            for i in &n.inputs {
                let kind = match &i.kind {
                    EdgeKind::Forward => "forward".to_string(),
                    EdgeKind::Hash { key_type, codec } => format!("hash({key_type},{codec})"),
                };
                let _ = write!(text, "<{}.{}:{kind}", i.from, i.port);
            }
            text.push('\n');
        }
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes()))
    }

    /// How many head tasks the job runs, and how many of them read sources.
    pub(crate) fn head_counts(&self) -> (usize, usize) {
        let heads = self.nodes.iter().filter(|n| n.is_head()).map(Node::parallelism).sum();
        let sources = self.nodes.iter().filter(|n| matches!(n.op, Op::Source { .. })).map(Node::parallelism).sum();
        (heads, sources)
    }

    /// Builds the job, restoring from `restore` and taking part in
    /// checkpoints through `checkpoints` when given.
    pub(crate) fn build_with(
        &self,
        registry: &Registry,
        restore: Option<&Restore>,
        mut checkpoints: Option<CheckpointWiring>,
    ) -> Result<Physical> {
        self.validate()?;
        // Register every operator in graph order, so metrics list them so.
        for node in self.nodes.iter().filter(|n| !matches!(n.op, Op::Union)) {
            let _ = registry.operator(&node.name);
        }
        let mut chain_instances = HashMap::new();
        for (id, node) in self.nodes.iter().enumerate() {
            if node.is_head() {
                for p in 0..node.outputs.len() {
                    self.count_chain_instances(id, p, node.parallelism(), &mut chain_instances);
                }
            }
        }
        let sources = SourceNames(
            self.nodes
                .iter()
                .filter(|n| matches!(n.op, Op::Source { .. }))
                .map(|n| n.name.clone())
                .collect::<Vec<_>>()
                .into(),
        );
        let mut inboxes: HashMap<(NodeId, usize), Vec<Inbox>> = HashMap::new();
        let mut built: Vec<(String, NodeId, usize, Built, NodeIo)> = Vec::new();
        for (id, node) in self.nodes.iter().enumerate() {
            if !node.is_head() {
                continue;
            }
            for instance in 0..node.parallelism() {
                let head = format!("{}[{instance}]", node.name);
                let mut ctx = BuildCtx {
                    config: &self.config,
                    registry,
                    sources: sources.clone(),
                    outbox: Outbox::default(),
                    senders: Vec::new(),
                    head: head.clone(),
                    instance,
                    parallelism: node.parallelism(),
                    inboxes: &mut inboxes,
                    chain_instances: &mut chain_instances,
                    restore,
                };
                let outs = self.build_outputs(&mut ctx, id)?;
                let info = self.info(node, registry, &sources);
                let built_head = match &node.op {
                    Op::Source { factory, .. } => {
                        let out =
                            outs.into_iter().next().ok_or_else(|| Error::Internal("source without port".into()))?;
                        Built::Runner(factory(&mut ctx, info, instance, out)?)
                    }
                    Op::Keyed { parallelism, factory, .. } => {
                        let groups =
                            crate::operator::key_group_range(instance, *parallelism, self.config.max_key_groups);
                        let mut op = factory(&mut ctx, info, groups.clone(), outs)?;
                        if let Some(r) = restore {
                            op.restore(r, &groups)?;
                        }
                        Built::Keyed(op)
                    }
                    _ => return Err(Error::Internal("non-head node built as a head".into())),
                };
                let checkpoint = checkpoints.as_mut().map(|w| {
                    let is_source = matches!(node.op, Op::Source { .. });
                    CheckpointIo {
                        trigger: if is_source { w.triggers.pop() } else { None },
                        acks: w.acks.clone(),
                        interval: w.interval,
                        storage: w.storage.clone(),
                        run: w.run.clone(),
                        completed: w.completed.clone(),
                        task: head.clone(),
                        operator: node.name.clone(),
                        instance,
                        groups: match node.op {
                            Op::Keyed { parallelism, .. } => {
                                crate::operator::key_group_range(instance, parallelism, self.config.max_key_groups)
                            }
                            _ => 0..0,
                        },
                    }
                });
                let mut chain = node.name.clone();
                self.chain_text(id, &mut chain)?;
                let io = NodeIo {
                    outbox: ctx.outbox,
                    senders: ctx.senders,
                    buffer_timeout: self.config.buffer_timeout,
                    checkpoint,
                    chain: chain.into(),
                };
                built.push((head, id, instance, built_head, io));
            }
        }
        let mut tasks = Vec::with_capacity(built.len());
        for (head, id, instance, b, io) in built {
            let runner: Box<dyn HeadRunner> = match b {
                Built::Runner(r) => r,
                Built::Keyed(op) => {
                    let inputs = inboxes.remove(&(id, instance)).unwrap_or_default();
                    if inputs.is_empty() {
                        return Err(Error::Internal(format!("`{head}` has no input edges")));
                    }
                    let counters = registry.operator(&self.node(id)?.name);
                    Box::new(ChannelHead { name: head.clone(), counters, op, inputs })
                }
            };
            tasks.push((head, runner, io));
        }
        Ok(Physical { tasks })
    }
}

/// What the coordinator hands the tasks: a trigger per source instance, and
/// where to acknowledge.
pub(crate) struct CheckpointWiring {
    pub(crate) triggers: Vec<tokio::sync::mpsc::UnboundedReceiver<u64>>,
    pub(crate) acks: tokio::sync::mpsc::UnboundedSender<TaskEvent>,
    pub(crate) interval: std::time::Duration,
    pub(crate) storage: std::sync::Arc<dyn crate::checkpoint::CheckpointStorage>,
    pub(crate) run: std::sync::Arc<str>,
    pub(crate) completed: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

enum Built {
    Runner(Box<dyn HeadRunner>),
    Keyed(Box<dyn InputOperator>),
}

/// Turns a typed chain consumer back from the planner's erased form.
pub(crate) fn typed<T: 'static>(c: AnyConsumer, what: &str) -> Result<Box<dyn Consumer<T>>> {
    unerase::<T>(c, what)
}

#[cfg(test)]
mod tests {
    use super::short_type_name;

    #[test]
    fn type_names_lose_their_paths() {
        assert_eq!(short_type_name("alloc::string::String"), "String");
        assert_eq!(short_type_name("(u64, alloc::vec::Vec<my_crate::orders::Order>)"), "(u64, Vec<Order>)");
    }
}
