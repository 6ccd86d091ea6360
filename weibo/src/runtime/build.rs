//! From a graph to tasks: each head node (source partition, keyed
//! instance) becomes a task running its fused chain; each hash edge
//! becomes a bounded channel from every upstream instance to every
//! downstream one. The runtime owns the channels and the inboxes; the
//! operators come from the graph's factories, each given an
//! [`OperatorContext`].

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::checkpoint::{Restore, TaskEvent};
use crate::error::Result;
use crate::graph::{Graph, Input, Node, NodeId, Op};
use crate::metrics::{OperatorCounters, Registry};
use crate::operator::factory::OperatorContext;
use crate::operator::{AnyConsumer, InputOperator, OpInfo, Outbox, key_group_range};
use crate::record::CheckpointId;
use crate::record::SourceNames;
use crate::time::alignment::{Aligned, Alignment};

use super::EdgeSender;
use super::config::JobConfig;
use super::heads::{ChannelHead, CheckpointIo, HeadRunner, Inbox, NodeIo, SourceHead};

/// A runnable job: one head task per node instance.
pub(crate) struct Physical {
    pub(crate) tasks: Vec<(String, Box<dyn HeadRunner>, NodeIo)>,
}

/// What the coordinator hands the tasks: a trigger per source instance, and
/// where to acknowledge.
pub(crate) struct CheckpointWiring {
    pub(crate) triggers: Vec<mpsc::UnboundedReceiver<CheckpointId>>,
    pub(crate) acks: mpsc::UnboundedSender<TaskEvent>,
    pub(crate) interval: std::time::Duration,
    pub(crate) storage: Arc<dyn crate::checkpoint::CheckpointStorage>,
    pub(crate) run: Arc<str>,
    pub(crate) completed: Arc<std::sync::atomic::AtomicU64>,
    /// The job's name, for the tasks' checkpoint spans.
    pub(crate) job: Arc<str>,
}

/// Building one head instance and the chain behind it.
struct Builder<'a> {
    graph: &'a Graph,
    config: &'a JobConfig,
    registry: &'a Registry,
    sources: SourceNames,
    restore: Option<&'a Restore>,
    /// The head's outbox and the senders of its outgoing channels.
    outbox: Outbox,
    senders: Vec<EdgeSender>,
    /// `name[instance]` of the head being built.
    head: String,
    /// A source partition's place in its source's watermark alignment.
    alignment: Option<Aligned>,
    /// Every keyed instance's input channels, by (node, instance).
    inboxes: &'a mut HashMap<(NodeId, usize), Vec<Inbox>>,
    /// For fused operators (sinks among them): how many instances each has
    /// in all, and the next instance number to hand out. A fused operator
    /// runs once per head instance that reaches it, so after a `union` its
    /// instances come from several heads.
    chain_instances: &'a mut HashMap<NodeId, (usize, usize)>,
    /// How many channels feed each instance of each keyed operator.
    keyed_senders: &'a HashMap<NodeId, usize>,
    /// The head's task counters (registered once the task is built).
    task: Arc<crate::metrics::TaskCounters>,
}

impl Builder<'_> {
    fn info(&self, node: &Node, instance: usize) -> OpInfo {
        OpInfo {
            name: node.name.as_str().into(),
            id: node.id().into(),
            counters: self.registry.instance(&node.name, instance),
            sources: self.sources.clone(),
        }
    }

    /// What an instance is told about where it runs.
    fn context(
        &self,
        info: OpInfo,
        instance: usize,
        parallelism: usize,
        key_groups: Range<u16>,
    ) -> OperatorContext<'_> {
        OperatorContext {
            job: &self.graph.name,
            info,
            instance,
            parallelism,
            key_groups,
            max_key_groups: self.graph.max_key_groups,
            batch_size: self.config.batch_size,
            batch_bytes: self.config.batch_bytes,
            state: &*self.config.state,
            checkpointing: self.config.checkpoint.is_some(),
            restored: self.restore.map(|r| r.checkpoint),
            restored_position: None,
            outbox: &self.outbox,
            alignment: self.alignment.clone(),
            task: &self.task,
            verify_codecs: self.config.verify_codecs,
            clock: &self.config.clock,
        }
    }

    fn port(&mut self, node: NodeId, port: usize) -> Result<AnyConsumer> {
        let n = self.graph.node(node)?;
        let spec =
            n.outputs.get(port).ok_or_else(|| crate::error::internal_error!("`{}` has no port {port}", n.name))?;
        let targets: Vec<(NodeId, Input)> = self.graph.consumers(node, port).map(|(id, i)| (id, i.clone())).collect();
        let mut outs = Vec::with_capacity(targets.len());
        for (dst, input) in targets {
            outs.push(self.input(dst, &input)?);
        }
        match outs.len() {
            0 => Ok(spec.ty.discard()),
            1 => outs.pop().ok_or_else(|| crate::error::internal_error!("lost a consumer")),
            _ => spec.ty.tee(outs),
        }
    }

    fn outputs(&mut self, node: NodeId) -> Result<Vec<AnyConsumer>> {
        let ports = self.graph.node(node)?.outputs.len();
        (0..ports).map(|p| self.port(node, p)).collect()
    }

    /// The consumer that feeds node `dst` from `input`: its fused instance,
    /// or the router onto the channels of its keyed instances.
    fn input(&mut self, dst: NodeId, input: &Input) -> Result<AnyConsumer> {
        let node = self.graph.node(dst)?;
        match &node.op {
            Op::Chain(factory) => {
                let outs = self.outputs(dst)?;
                let (next, total) = self.chain_instances.get(&dst).copied().unwrap_or((0, 1));
                self.chain_instances.insert(dst, (next + 1, total));
                let ctx = self.context(self.info(node, next), next, total, 0..0);
                factory.instantiate(&ctx, outs)
            }
            Op::Union => self.port(dst, 0),
            Op::Keyed { parallelism, router, .. } => {
                let from = self.graph.node(input.from)?;
                let mut senders = Vec::with_capacity(*parallelism);
                // The channel capacity is what a keyed instance's inputs
                // buffer in all, shared among the channels that feed it,
                // at least two batches each (one being filled, one in
                // flight): with a capacity per channel, the batches in
                // flight (and the memory they hold) grew with the square
                // of the parallelism, each instance being fed by every
                // upstream one.
                let channels = self.keyed_senders.get(&dst).copied().unwrap_or(1).max(1);
                let capacity =
                    self.config.channel_capacity.div_ceil(channels).max(2).min(self.config.channel_capacity.max(1));
                for j in 0..*parallelism {
                    let (tx, rx) = mpsc::channel(capacity);
                    let to = format!("{}[{j}]", node.name);
                    // A weak sender: reading the fill must not keep the
                    // channel open once the task's sender is gone.
                    let weak = tx.downgrade();
                    let fill = Box::new(move || weak.upgrade().map(|s| s.max_capacity() - s.capacity()));
                    let counters = self.registry.edge(self.head.clone(), to.clone(), capacity, fill);
                    self.inboxes.entry((dst, j)).or_default().push(Inbox { from: self.head.clone(), rx });
                    senders.push(self.senders.len());
                    self.senders.push(EdgeSender { tx, counters, to });
                }
                let name: Arc<str> = format!("{} -> {}", from.name, node.name).into();
                let info = OpInfo {
                    id: name.clone(),
                    name,
                    counters: Arc::new(OperatorCounters::default()),
                    sources: self.sources.clone(),
                };
                let ctx = self.context(info, 0, 1, 0..0);
                router.instantiate(&ctx, senders)
            }
            Op::Source { .. } => Err(crate::error::internal_error!("source `{}` has an input", node.name)),
        }
    }
}

enum Built {
    Runner(Box<dyn HeadRunner>),
    Keyed(Box<dyn InputOperator>),
}

/// The watermark alignment groups of `graph`'s sources, with a drift of
/// `drift` (none: no alignment): the sources of one connected part of the
/// graph (whose records meet in some operator: one source's partitions,
/// and sources joined, connected or unioned) read in step, each partition
/// at its own place in its group. A source's entry is its group and the
/// place of its first partition; a part with a single partition has none.
/// Sources in parts that never meet are not held back by each other.
fn alignment_groups(graph: &Graph, drift: Option<std::time::Duration>) -> HashMap<NodeId, (Arc<Alignment>, usize)> {
    fn root(parent: &mut [usize], mut x: usize) -> usize {
        while let Some(&p) = parent.get(x) {
            if p == x {
                break;
            }
            let grand = parent.get(p).copied().unwrap_or(p);
            if let Some(slot) = parent.get_mut(x) {
                *slot = grand;
            }
            x = p;
        }
        x
    }
    let mut groups = HashMap::new();
    let Some(drift) = drift else { return groups };
    let mut parent: Vec<usize> = (0..graph.nodes.len()).collect();
    for (id, node) in graph.nodes.iter().enumerate() {
        for input in &node.inputs {
            let (a, b) = (root(&mut parent, id), root(&mut parent, input.from));
            if let Some(slot) = parent.get_mut(a) {
                *slot = b;
            }
        }
    }
    let mut parts: std::collections::BTreeMap<usize, Vec<(NodeId, usize)>> = std::collections::BTreeMap::new();
    for (id, node) in graph.nodes.iter().enumerate() {
        if matches!(node.op, Op::Source { .. }) {
            parts.entry(root(&mut parent, id)).or_default().push((id, node.parallelism()));
        }
    }
    for sources in parts.values() {
        let total: usize = sources.iter().map(|(_, n)| n).sum();
        if total < 2 {
            continue;
        }
        let group = Arc::new(Alignment::new(total, crate::time::millis(drift)));
        let mut first = 0;
        for &(id, n) in sources {
            groups.insert(id, (group.clone(), first));
            first += n;
        }
    }
    groups
}

/// Builds the tasks of `graph`, restoring from `restore` and taking part in
/// checkpoints through `checkpoints` when given.
pub(crate) fn build(
    graph: &Graph,
    config: &JobConfig,
    registry: &Registry,
    restore: Option<&Restore>,
    mut checkpoints: Option<CheckpointWiring>,
) -> Result<Physical> {
    graph.validate()?;
    // Register every operator in graph order, so metrics list them so.
    for node in graph.nodes.iter().filter(|n| !matches!(n.op, Op::Union)) {
        registry.operator(&node.name);
    }
    for (id, two) in graph.two_input_operators() {
        let name = |n: Option<&crate::graph::Node>| n.map(|n| n.name.clone()).unwrap_or_default();
        let [first, second] = two.tags;
        registry.two_inputs(
            &graph.node(id)?.name,
            crate::metrics::TwoInputs {
                labels: two.labels.map(str::to_string),
                tags: [name(graph.nodes.get(first)), name(graph.nodes.get(second))],
                from: [name(graph.feeder(first)), name(graph.feeder(second))],
                states: two.states.map(|s| s.map(str::to_string)),
                counters: two.counters.clone(),
            },
        );
    }
    let mut chain_instances: HashMap<NodeId, (usize, usize)> =
        graph.chain_instances().into_iter().map(|(id, total)| (id, (0, total))).collect();
    let keyed_senders = graph.keyed_senders();
    let sources = SourceNames(graph.source_names().into());
    let mut inboxes: HashMap<(NodeId, usize), Vec<Inbox>> = HashMap::new();
    let mut built: Vec<(String, NodeId, usize, Built, NodeIo)> = Vec::new();
    let aligned = alignment_groups(graph, config.watermark_alignment);
    for (id, node) in graph.nodes.iter().enumerate() {
        if !node.is_head() {
            continue;
        }
        // The source partitions whose records meet read in step (see
        // `Alignment`).
        let alignment = aligned.get(&id).cloned();
        for instance in 0..node.parallelism() {
            let head = format!("{}[{instance}]", node.name);
            let groups = match node.op {
                Op::Keyed { parallelism, .. } => key_group_range(instance, parallelism, graph.max_key_groups),
                _ => 0..0,
            };
            let mut b = Builder {
                graph,
                config,
                registry,
                sources: sources.clone(),
                restore,
                outbox: Outbox::default(),
                senders: Vec::new(),
                head: head.clone(),
                alignment: alignment
                    .as_ref()
                    .map(|(group, first)| Aligned { group: group.clone(), index: first + instance }),
                inboxes: &mut inboxes,
                chain_instances: &mut chain_instances,
                keyed_senders: &keyed_senders,
                task: Arc::default(),
            };
            let outs = b.outputs(id)?;
            let info = b.info(node, instance);
            let built_head = match &node.op {
                Op::Source { factory, .. } => {
                    let out =
                        outs.into_iter().next().ok_or_else(|| crate::error::internal_error!("source without port"))?;
                    let mut ctx = b.context(info, instance, node.parallelism(), 0..0);
                    let partition = u32::try_from(instance).unwrap_or(u32::MAX);
                    ctx.restored_position =
                        restore.and_then(|r| r.positions.get(&(node.id().to_string(), partition))).copied();
                    Built::Runner(Box::new(SourceHead { op: factory.instantiate(&ctx, out)? }))
                }
                Op::Keyed { parallelism, factory, .. } => {
                    let ctx = b.context(info, instance, *parallelism, groups.clone());
                    Built::Keyed(factory.instantiate(&ctx, outs)?)
                }
                _ => return Err(crate::error::internal_error!("non-head node built as a head")),
            };
            let checkpoint = checkpoints.as_mut().map(|w| {
                let is_source = matches!(node.op, Op::Source { .. });
                CheckpointIo {
                    trigger: if is_source { w.triggers.pop() } else { None },
                    acks: w.acks.clone(),
                    interval: w.interval,
                    storage: w.storage.clone(),
                    run: w.run.clone(),
                    job: w.job.clone(),
                    completed: w.completed.clone(),
                    task: head.clone(),
                    operator: node.id().to_string(),
                    instance,
                    groups: groups.clone(),
                }
            });
            let mut chain = node.name.clone();
            graph.chain_text(id, &mut chain)?;
            let io = NodeIo {
                outbox: b.outbox,
                senders: b.senders,
                buffer_timeout: config.buffer_timeout,
                checkpoint,
                chain: chain.into(),
                alignment: b.alignment,
                task: b.task,
            };
            built.push((head, id, instance, built_head, io));
        }
    }
    if let Some(r) = restore {
        // Every keyed instance restores twice: first without entries, so
        // that every state is checked against its codec and schema (and
        // refused, or found a migration) before any is read; then for
        // real. An operator's restore reads nothing but its entries.
        for checking in [true, false] {
            for (_, id, instance, b, _) in &mut built {
                if let Built::Keyed(op) = b {
                    let node = graph.node(*id)?;
                    let Op::Keyed { parallelism, .. } = node.op else { continue };
                    let groups = key_group_range(*instance, parallelism, graph.max_key_groups);
                    op.restore(&r.for_operator(node.id(), node.state_version, checking), &groups)?;
                }
            }
        }
    }
    let mut tasks = Vec::with_capacity(built.len());
    for (head, id, instance, b, io) in built {
        let mut operators = vec![graph.node(id)?.name.clone()];
        graph.chain_names(id, &mut operators)?;
        let inputs = inboxes.get(&(id, instance)).map_or(0, Vec::len);
        let node = graph.node(id)?;
        let source = matches!(node.op, Op::Source { .. })
            .then(|| (node.id().to_string(), u32::try_from(instance).unwrap_or(u32::MAX)));
        registry.task(head.clone(), operators, inputs, source, io.task.clone());
        let runner: Box<dyn HeadRunner> = match b {
            Built::Runner(r) => r,
            Built::Keyed(op) => {
                let inputs = inboxes.remove(&(id, instance)).unwrap_or_default();
                if inputs.is_empty() {
                    return Err(crate::error::internal_error!("`{head}` has no input edges"));
                }
                let counters = registry.instance(&graph.node(id)?.name, instance);
                Box::new(ChannelHead { name: head.clone(), counters, op, inputs })
            }
        };
        tasks.push((head, runner, io));
    }
    Ok(Physical { tasks })
}
