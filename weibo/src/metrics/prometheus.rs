//! A job's metrics as instruments with OpenTelemetry's names and units
//! (`weibo.operator.records_in`, `{record}`), and the Prometheus text
//! format they are scraped in (`weibo_operator_records_in_total`), as the
//! OpenTelemetry–Prometheus compatibility rules map one to the other.
//!
//! Every value is read from counters the job keeps anyway (atomics added
//! to per batch): scraping costs the job nothing per record.

use std::fmt::Write as _;

use super::MetricsSnapshot;

/// What kind of instrument a family is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Only goes up (a count, a total time).
    Counter,
    /// Goes up and down (a duration now, an age).
    Gauge,
}

/// One value of a family, with its attributes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sample {
    /// Attribute names and values (`job`, `operator`, `edge`, ...).
    pub(crate) attributes: Vec<(&'static str, String)>,
    /// The value, in the family's unit.
    pub(crate) value: f64,
}

/// One instrument and its values now.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Family {
    /// Its OpenTelemetry name (`weibo.operator.records_in`).
    pub(crate) name: &'static str,
    /// Its unit, in UCUM (`s`, `By`, `{record}`).
    pub(crate) unit: &'static str,
    /// Counter or gauge.
    pub(crate) kind: Kind,
    /// What it measures.
    pub(crate) help: &'static str,
    /// Its values.
    pub(crate) samples: Vec<Sample>,
}

/// What a job's checkpoints have done so far (for its instruments).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct CheckpointTotals {
    /// Checkpoints (and savepoints) triggered.
    pub(crate) started: u64,
    /// Checkpoints (and savepoints) completed.
    pub(crate) completed: u64,
    /// Attempts that failed or were abandoned.
    pub(crate) failed: u64,
    /// Bytes of state files written.
    pub(crate) bytes: u64,
    /// The newest completed checkpoint's number.
    pub(crate) last_id: Option<u64>,
    /// How long the newest completed checkpoint took, in seconds.
    pub(crate) last_duration_seconds: Option<f64>,
    /// Seconds since the newest completed checkpoint was triggered.
    pub(crate) last_age_seconds: Option<f64>,
    /// Each source partition's position in the newest completed
    /// checkpoint: (source id, partition, position).
    pub(crate) positions: Vec<(String, u32, u64)>,
    /// Each operator's state in the newest completed checkpoint:
    /// (operator id, bytes of its files, its files).
    pub(crate) state: Vec<(String, u64, u64)>,
    /// The restore the job started with: entries read, seconds taken.
    pub(crate) restored: Option<(u64, f64)>,
}

/// The families of job `job`: its operators' and edges' counters in
/// `snapshot`, its checkpoints' `checkpoints` (when it takes them), and
/// its uptime.
pub(crate) fn families(
    job: &str,
    snapshot: &MetricsSnapshot,
    checkpoints: Option<&CheckpointTotals>,
    uptime_seconds: f64,
) -> Vec<Family> {
    let job_only = || vec![("job", job.to_string())];
    let op = |name: &'static str, unit, kind, help, value: &dyn Fn(&super::OperatorMetrics) -> f64| Family {
        name,
        unit,
        kind,
        help,
        samples: snapshot
            .operators
            .iter()
            .map(|o| Sample {
                attributes: vec![("job", job.to_string()), ("operator", o.name.clone())],
                value: value(o),
            })
            .collect(),
    };
    // One series per (sender, receiver) pair: a head that feeds one keyed
    // node through two edges has its counters summed.
    let edge = |name: &'static str, unit, kind, help, value: &dyn Fn(&super::EdgeMetrics) -> f64| {
        let mut by_pair: Vec<(&str, &str, f64)> = Vec::new();
        for e in &snapshot.edges {
            match by_pair.iter_mut().find(|(f, t, _)| *f == e.from && *t == e.to) {
                Some(p) => p.2 += value(e),
                None => by_pair.push((&e.from, &e.to, value(e))),
            }
        }
        Family {
            name,
            unit,
            kind,
            help,
            samples: by_pair
                .into_iter()
                .map(|(from, to, value)| Sample {
                    attributes: vec![
                        ("job", job.to_string()),
                        ("edge", format!("{from} -> {to}")),
                        ("from", from.to_string()),
                        ("to", to.to_string()),
                    ],
                    value,
                })
                .collect(),
        }
    };
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^53 are exact")]
    let n = |v: u64| v as f64;
    let sink = |value: &dyn Fn(&super::SinkMetrics) -> f64| -> Vec<Sample> {
        snapshot
            .sinks
            .iter()
            .map(|s| Sample { attributes: vec![("job", job.to_string()), ("sink", s.id.clone())], value: value(s) })
            .collect()
    };
    let now_millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let instances = |value: &dyn Fn(&super::InstanceMetrics) -> f64| -> Vec<Sample> {
        snapshot
            .operators
            .iter()
            .flat_map(|o| {
                o.instances.iter().map(move |i| Sample {
                    attributes: vec![
                        ("job", job.to_string()),
                        ("operator", o.name.clone()),
                        ("instance", i.instance.to_string()),
                    ],
                    value: value(i),
                })
            })
            .collect()
    };
    let states = |value: &dyn Fn(&super::StateMetrics) -> Option<f64>| -> Vec<Sample> {
        snapshot
            .operators
            .iter()
            .flat_map(|o| {
                o.state.iter().filter_map(move |s| {
                    Some(Sample {
                        attributes: vec![
                            ("job", job.to_string()),
                            ("operator", o.name.clone()),
                            ("state", s.state.clone()),
                        ],
                        value: value(s)?,
                    })
                })
            })
            .collect()
    };
    let inputs = |value: &dyn Fn(&super::InputMetrics) -> Option<f64>| -> Vec<Sample> {
        snapshot
            .operators
            .iter()
            .flat_map(|o| {
                o.inputs.iter().filter_map(move |i| {
                    Some(Sample {
                        attributes: vec![
                            ("job", job.to_string()),
                            ("operator", o.name.clone()),
                            ("input", i.input.clone()),
                            ("from", i.from.clone()),
                        ],
                        value: value(i)?,
                    })
                })
            })
            .collect()
    };
    let partitions = |value: &dyn Fn(&super::SourceTaskMetrics) -> Option<f64>| -> Vec<Sample> {
        snapshot
            .tasks
            .iter()
            .filter_map(|t| {
                let p = t.source.as_ref()?;
                Some(Sample {
                    attributes: vec![
                        ("job", job.to_string()),
                        ("source", p.source.clone()),
                        ("partition", p.partition.to_string()),
                    ],
                    value: value(p)?,
                })
            })
            .collect()
    };
    let mut out = vec![
        op("weibo.operator.records_in", "{record}", Kind::Counter, "Records that reached the operator.", &|o| {
            n(o.records_in)
        }),
        op("weibo.operator.records_out", "{record}", Kind::Counter, "Records the operator emitted.", &|o| {
            n(o.records_out)
        }),
        op(
            "weibo.operator.dropped",
            "{record}",
            Kind::Counter,
            "Records the operator dropped and counted (a failed function under Drop, a record in no window).",
            &|o| n(o.dropped),
        ),
        op(
            "weibo.operator.dead_lettered",
            "{record}",
            Kind::Counter,
            "Records the operator's function failed on, sent to its dead-letter output.",
            &|o| n(o.dead_lettered),
        ),
        op("weibo.operator.late", "{record}", Kind::Counter, "Records a window operator got too late.", &|o| n(o.late)),
        op(
            "weibo.operator.checkpoint_alignment.max",
            "s",
            Kind::Gauge,
            "The longest one keyed instance of the operator took to align a checkpoint's barriers (first input's to last's).",
            &|o| o.max_checkpoint_alignment.as_secs_f64(),
        ),
        Family {
            name: "weibo.operator.instance.records_in",
            unit: "{record}",
            kind: Kind::Counter,
            help: "Records that reached each instance of the operator (for skew between instances).",
            samples: instances(&|i| n(i.records_in)),
        },
        Family {
            name: "weibo.operator.instance.records_out",
            unit: "{record}",
            kind: Kind::Counter,
            help: "Records each instance of the operator emitted.",
            samples: instances(&|i| n(i.records_out)),
        },
        Family {
            name: "weibo.operator.matched",
            unit: "{pair}",
            kind: Kind::Counter,
            help: "Pairs a join emitted (operators of two inputs only).",
            samples: snapshot
                .operators
                .iter()
                .filter(|o| !o.inputs.is_empty())
                .map(|o| Sample {
                    attributes: vec![("job", job.to_string()), ("operator", o.name.clone())],
                    value: n(o.matched),
                })
                .collect(),
        },
        Family {
            name: "weibo.operator.input.records_in",
            unit: "{record}",
            kind: Kind::Counter,
            help: "Records each input of an operator of two inputs sent it.",
            samples: inputs(&|i| Some(n(i.records_in))),
        },
        Family {
            name: "weibo.operator.input.late",
            unit: "{record}",
            kind: Kind::Counter,
            help: "Records of each input of an operator of two inputs it got too late.",
            samples: inputs(&|i| Some(n(i.late))),
        },
        Family {
            name: "weibo.operator.input.unmatched",
            unit: "{record}",
            kind: Kind::Counter,
            help: "Rows an outer join emitted for records of each input that found no partner.",
            samples: inputs(&|i| Some(n(i.unmatched))),
        },
        Family {
            name: "weibo.operator.input.buffered",
            unit: "{entry}",
            kind: Kind::Gauge,
            help: "Entries of the state the records of each input of a join wait in.",
            samples: inputs(&|i| i.buffered.map(n)),
        },
        op(
            "weibo.operator.checkpoint_pause.max",
            "s",
            Kind::Gauge,
            "The longest a checkpoint barrier held one instance of the operator.",
            &|o| o.max_checkpoint_pause.as_secs_f64(),
        ),
        edge("weibo.edge.records", "{record}", Kind::Counter, "Records sent over the edge.", &|e| n(e.records)),
        edge("weibo.edge.batches", "{batch}", Kind::Counter, "Batches sent over the edge.", &|e| n(e.batches)),
        edge(
            "weibo.edge.blocked",
            "s",
            Kind::Counter,
            "Time the edge's sender was blocked because the edge was full (backpressure).",
            &|e| e.blocked.as_secs_f64(),
        ),
        edge(
            "weibo.edge.queued",
            "{message}",
            Kind::Gauge,
            "Messages waiting in the edge's channel now (divided by weibo.edge.capacity: how full it is).",
            &|e| n(e.queued),
        ),
        edge("weibo.edge.capacity", "{message}", Kind::Gauge, "How many messages the edge's channel holds.", &|e| {
            n(e.capacity)
        }),
        op(
            "weibo.operator.idle_inputs",
            "{input}",
            Kind::Gauge,
            "Input edges of the operator's instances now marked idle (not holding its watermark back).",
            &|o| n(o.idle_inputs),
        ),
        Family {
            name: "weibo.operator.watermark",
            unit: "s",
            kind: Kind::Gauge,
            help: "The watermark of the operator's slowest instance, in event time (seconds since the epoch); absent before the first watermark and after the end of the input.",
            samples: watermarks(snapshot, job, None),
        },
        Family {
            name: "weibo.operator.watermark.lag",
            unit: "s",
            kind: Kind::Gauge,
            help: "Wall-clock time minus the operator's watermark (how far event time is behind; meaningful when event time is wall-clock time).",
            samples: watermarks(snapshot, job, Some(now_millis)),
        },
        Family {
            name: "weibo.task.busy",
            unit: "s",
            kind: Kind::Counter,
            help: "Time each task spent on batches (its rate: the share of time it is busy; near 1, the task is the bottleneck).",
            samples: snapshot
                .tasks
                .iter()
                .map(|t| Sample {
                    attributes: vec![
                        ("job", job.to_string()),
                        ("task", t.name.clone()),
                        ("operator", t.operators.first().cloned().unwrap_or_default()),
                    ],
                    value: t.busy.as_secs_f64(),
                })
                .collect(),
        },
        Family {
            name: "weibo.state.memory.entries",
            unit: "{entry}",
            kind: Kind::Gauge,
            help: "Entries of each keyed state in memory (all of them in memory; those cached in front of the table on fjall).",
            samples: states(&|s| Some(n(s.memory_entries))),
        },
        Family {
            name: "weibo.state.memory.size",
            unit: "By",
            kind: Kind::Gauge,
            help: "Roughly what those entries take in memory (their maps' slots, not what they point to).",
            samples: states(&|s| Some(n(s.memory_bytes))),
        },
        Family {
            name: "weibo.state.table.entries",
            unit: "{entry}",
            kind: Kind::Gauge,
            help: "Entries of each keyed state's table on disk (fjall; approximate).",
            samples: states(&|s| s.table_entries.map(n)),
        },
        Family {
            name: "weibo.state.table.size",
            unit: "By",
            kind: Kind::Gauge,
            help: "Bytes of each keyed state's table on disk (fjall).",
            samples: states(&|s| s.table_bytes.map(n)),
        },
        Family {
            name: "weibo.state.cache.hits",
            unit: "{read}",
            kind: Kind::Counter,
            help: "Reads and updates of a cached keyed state (fjall) answered from memory.",
            samples: states(&|s| s.table_entries.map(|_| n(s.cache_hits))),
        },
        Family {
            name: "weibo.state.cache.misses",
            unit: "{read}",
            kind: Kind::Counter,
            help: "Reads and updates of a cached keyed state (fjall) that read the table.",
            samples: states(&|s| s.table_entries.map(|_| n(s.cache_misses))),
        },
        Family {
            name: "weibo.state.expired",
            unit: "{entry}",
            kind: Kind::Counter,
            help: "Entries of each keyed state with a time-to-live removed because it ran out.",
            samples: states(&|s| Some(n(s.expired))),
        },
        Family {
            name: "weibo.source.read_position",
            unit: "{position}",
            kind: Kind::Gauge,
            help: "Where each source partition reads now (an offset, for Kafka), as of about a second ago.",
            samples: partitions(&|p| p.position.map(n)),
        },
        Family {
            name: "weibo.source.lag",
            unit: "{position}",
            kind: Kind::Gauge,
            help: "How far each source partition's reading is behind its end (for Kafka, the consumer lag in offsets, transaction markers included).",
            samples: partitions(&|p| p.lag().map(n)),
        },
        Family {
            name: "weibo.sink.transactions.committed",
            unit: "{transaction}",
            kind: Kind::Counter,
            help: "Transactions the exactly-once sink committed.",
            samples: sink(&|s| n(s.committed)),
        },
        Family {
            name: "weibo.sink.transactions.aborted",
            unit: "{transaction}",
            kind: Kind::Counter,
            help: "Transactions (pre-committed or still open) of epochs after the restored checkpoint the exactly-once sink discarded on restore.",
            samples: sink(&|s| n(s.aborted)),
        },
        Family {
            name: "weibo.sink.transactions.failed",
            unit: "{transaction}",
            kind: Kind::Counter,
            help: "Commits that failed (tried again with the next checkpoint).",
            samples: sink(&|s| n(s.failed)),
        },
        Family {
            name: "weibo.sink.commit.duration",
            unit: "s",
            kind: Kind::Counter,
            help: "Time the exactly-once sink spent committing (divided by the committed count: the mean commit latency).",
            samples: sink(&|s| s.commit_time.as_secs_f64()),
        },
        Family {
            name: "weibo.job.uptime",
            unit: "s",
            kind: Kind::Gauge,
            help: "Time since the job started.",
            samples: vec![Sample { attributes: job_only(), value: uptime_seconds }],
        },
    ];
    if let Some(c) = checkpoints {
        let one = |value: f64| vec![Sample { attributes: job_only(), value }];
        let maybe = |value: Option<f64>| value.map(one).unwrap_or_default();
        out.extend([
            Family {
                name: "weibo.checkpoint.started",
                unit: "{checkpoint}",
                kind: Kind::Counter,
                help: "Checkpoints and savepoints triggered (completed, failed, or in progress).",
                samples: one(n(c.started)),
            },
            Family {
                name: "weibo.checkpoint.completed",
                unit: "{checkpoint}",
                kind: Kind::Counter,
                help: "Checkpoints and savepoints completed.",
                samples: one(n(c.completed)),
            },
            Family {
                name: "weibo.checkpoint.failed",
                unit: "{checkpoint}",
                kind: Kind::Counter,
                help: "Checkpoint attempts that failed or were abandoned.",
                samples: one(n(c.failed)),
            },
            Family {
                name: "weibo.checkpoint.written",
                unit: "By",
                kind: Kind::Counter,
                help: "Bytes of state files checkpoints wrote.",
                samples: one(n(c.bytes)),
            },
            Family {
                name: "weibo.checkpoint.last_id",
                unit: "{checkpoint}",
                kind: Kind::Gauge,
                help: "The newest completed checkpoint's number.",
                samples: maybe(c.last_id.map(n)),
            },
            Family {
                name: "weibo.checkpoint.last_duration",
                unit: "s",
                kind: Kind::Gauge,
                help: "How long the newest completed checkpoint took, from its trigger to its manifest and commits.",
                samples: maybe(c.last_duration_seconds),
            },
            Family {
                name: "weibo.source.position",
                unit: "{position}",
                kind: Kind::Gauge,
                help: "Where each source partition resumes, as of the newest completed checkpoint (an offset, for Kafka).",
                samples: c
                    .positions
                    .iter()
                    .map(|(source, partition, position)| Sample {
                        attributes: vec![
                            ("job", job.to_string()),
                            ("source", source.clone()),
                            ("partition", partition.to_string()),
                        ],
                        value: n(*position),
                    })
                    .collect(),
            },
            Family {
                name: "weibo.state.checkpointed_size",
                unit: "By",
                kind: Kind::Gauge,
                help: "Each stateful operator's state in the newest completed checkpoint: the bytes of the files a restore reads (an incremental chain's base and deltas).",
                samples: c
                    .state
                    .iter()
                    .map(|(operator, bytes, _)| Sample {
                        attributes: vec![("job", job.to_string()), ("operator", operator.clone())],
                        value: n(*bytes),
                    })
                    .collect(),
            },
            Family {
                name: "weibo.restore.entries",
                unit: "{entry}",
                kind: Kind::Gauge,
                help: "Entries the job's restore read when it started.",
                samples: maybe(c.restored.map(|(entries, _)| n(entries))),
            },
            Family {
                name: "weibo.restore.duration",
                unit: "s",
                kind: Kind::Gauge,
                help: "How long the job's restore took when it started.",
                samples: maybe(c.restored.map(|(_, seconds)| seconds)),
            },
            Family {
                name: "weibo.checkpoint.age",
                unit: "s",
                kind: Kind::Gauge,
                help: "Time since the newest completed checkpoint was triggered.",
                samples: maybe(c.last_age_seconds),
            },
        ]);
    }
    out
}

/// One sample per operator with a watermark (not before its first, not
/// after the end of the input): the watermark in seconds, or with `now`
/// (milliseconds since the epoch) how far it is behind.
#[expect(clippy::cast_precision_loss, reason = "milliseconds since the epoch are far below 2^53")]
fn watermarks(snapshot: &MetricsSnapshot, job: &str, now: Option<i64>) -> Vec<Sample> {
    snapshot
        .operators
        .iter()
        .filter_map(|o| {
            let at = o.watermark.filter(|at| *at != i64::MAX && *at != i64::MIN)?;
            Some(Sample {
                attributes: vec![("job", job.to_string()), ("operator", o.name.clone())],
                value: now.map_or(at, |now| now.saturating_sub(at)) as f64 / 1000.0,
            })
        })
        .collect()
}

/// The Prometheus name of an instrument: dots to underscores, the unit as
/// a suffix (`s` → `_seconds`, `By` → `_bytes`; annotations such as
/// `{record}` and the unit `1` add none), and `_total` for counters.
pub(crate) fn prometheus_name(family: &Family) -> String {
    let mut name: String = family.name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    let suffix = match family.unit {
        "s" => "_seconds",
        "By" => "_bytes",
        _ => "",
    };
    if !name.ends_with(suffix) {
        name.push_str(suffix);
    }
    if family.kind == Kind::Counter {
        name.push_str("_total");
    }
    name
}

/// Escapes a label value: backslash, double quote and newline.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// `families` in Prometheus' text exposition format (version 0.0.4).
pub(crate) fn prometheus_text(families: &[Family]) -> String {
    let mut out = String::new();
    for f in families.iter().filter(|f| !f.samples.is_empty()) {
        let name = prometheus_name(f);
        let kind = match f.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = writeln!(out, "# HELP {name} {}", f.help);
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for s in &f.samples {
            let labels: Vec<String> = s.attributes.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
            let _ = writeln!(out, "{name}{{{}}} {}", labels.join(","), s.value);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The book's table of instruments ("Operating a job") lists every
    /// family, with its Prometheus name, unit and kind.
    #[test]
    fn the_book_lists_every_instrument() {
        let book = include_str!("../../../book/src/operating.md");
        let all = families("j", &MetricsSnapshot::default(), Some(&CheckpointTotals::default()), 0.0);
        assert!(all.len() >= 40, "{} families", all.len());
        for f in &all {
            let kind = match f.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
            };
            let row = format!("| `{}` | `{}` | `{}` | {kind} |", f.name, prometheus_name(f), f.unit);
            assert!(book.contains(&row), "the book's table lacks {row}");
        }
    }

    #[test]
    fn names_follow_the_compatibility_rules_and_labels_are_escaped() {
        let f = |name, unit, kind| Family { name, unit, kind, help: "h", samples: Vec::new() };
        assert_eq!(
            prometheus_name(&f("weibo.operator.records_in", "{record}", Kind::Counter)),
            "weibo_operator_records_in_total"
        );
        assert_eq!(prometheus_name(&f("weibo.edge.blocked", "s", Kind::Counter)), "weibo_edge_blocked_seconds_total");
        assert_eq!(
            prometheus_name(&f("weibo.checkpoint.written", "By", Kind::Counter)),
            "weibo_checkpoint_written_bytes_total"
        );
        assert_eq!(prometheus_name(&f("weibo.checkpoint.age", "s", Kind::Gauge)), "weibo_checkpoint_age_seconds");
        assert_eq!(
            prometheus_name(&f("weibo.checkpoint.last_id", "{checkpoint}", Kind::Gauge)),
            "weibo_checkpoint_last_id"
        );
        let family = Family {
            samples: vec![Sample { attributes: vec![("operator", "a \"b\"\\\nc".into())], value: 1.5 }],
            ..f("weibo.x", "s", Kind::Gauge)
        };
        let text = prometheus_text(&[family]);
        assert!(text.contains("# TYPE weibo_x_seconds gauge\n"), "{text}");
        assert!(text.contains(r#"weibo_x_seconds{operator="a \"b\"\\\nc"} 1.5"#), "{text}");
    }
}
