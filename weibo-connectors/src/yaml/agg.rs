//! Aggregates of YAML pipelines: `count()`, `sum(x)`, `min(x)`, `max(x)`,
//! `avg(x)`, `first(x)`, `last(x)`, `count_distinct(x)`, each over an
//! expression of the records. Their accumulators are an [`Acc`] (one or
//! two values per aggregate), kept in state with the row codec.

use std::sync::Arc;

use weibo::prelude::Aggregate;

use super::acc::Acc;
use super::doc::{Diagnostic, Pos};
use super::expr::{self, EvalError, Expr, Origin, Schema, closest};
use super::value::{Row, Value};

/// What an aggregate computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AggKind {
    /// The number of records.
    Count,
    /// The sum (ints stay ints; a double makes it a double).
    Sum,
    /// The smallest value.
    Min,
    /// The largest value.
    Max,
    /// The mean, a double.
    Avg,
    /// The first record's value (in arrival order).
    First,
    /// The last record's value.
    Last,
    /// The number of distinct values.
    CountDistinct,
}

/// One named aggregate.
#[derive(Clone, Debug)]
pub struct AggSpec {
    /// The result's field name.
    pub name: String,
    /// What it computes.
    pub kind: AggKind,
    /// Over what (none for `count()`).
    pub arg: Option<Expr>,
}

/// Reads `text` as an aggregate call.
///
/// # Errors
/// A call of no aggregate, or with the wrong arguments, or an argument
/// that does not compile.
pub fn parse(text: &str, schema: &Schema, origin: Origin) -> Result<(AggKind, Option<Expr>), Vec<Diagnostic>> {
    let trimmed = text.trim();
    let lead = text.len() - text.trim_start().len();
    let at = |offset: usize| origin.pos_of(text, offset);
    let Some(open) = trimmed.find('(') else {
        return Err(vec![unknown(at(lead), trimmed)]);
    };
    let name = trimmed.get(..open).unwrap_or_default().trim();
    let Some(inner) = trimmed.get(open + 1..).and_then(|r| r.strip_suffix(')')) else {
        return Err(vec![
            Diagnostic::new(at(lead), format!("`{trimmed}` is not an aggregate call"))
                .help("write name(expression), e.g. sum(event.amount)"),
        ]);
    };
    let kind = match name {
        "count" => AggKind::Count,
        "sum" => AggKind::Sum,
        "min" => AggKind::Min,
        "max" => AggKind::Max,
        "avg" => AggKind::Avg,
        "first" => AggKind::First,
        "last" => AggKind::Last,
        "count_distinct" => AggKind::CountDistinct,
        _ => return Err(vec![unknown(at(lead), name)]),
    };
    if kind == AggKind::Count {
        if !inner.trim().is_empty() {
            return Err(vec![
                Diagnostic::new(at(lead), "count() takes no argument")
                    .help("count the records with count(); count_distinct(x) counts distinct values"),
            ]);
        }
        return Ok((kind, None));
    }
    if inner.trim().is_empty() {
        return Err(vec![
            Diagnostic::new(at(lead), format!("{name}() needs what to aggregate"))
                .help(format!("write {name}(event.<field>)")),
        ]);
    }
    // The argument's positions are relative to the call's text.
    let offset = lead + open + 1;
    let arg_origin = Origin { pos: at(offset), quoted: false };
    let arg = expr::compile(inner, schema, arg_origin)?;
    Ok((kind, Some(arg)))
}

fn unknown(pos: Pos, name: &str) -> Diagnostic {
    let help = match closest(name, AggKind::NAMES.iter().copied()) {
        Some(near) => format!("did you mean `{near}`? The aggregates are: {}", AggKind::NAMES.join(", ")),
        None => format!("the aggregates are: {}", AggKind::NAMES.join(", ")),
    };
    Diagnostic::new(pos, format!("`{name}` is not an aggregate")).help(help)
}

/// The version of the state of a step that keeps `specs`' accumulators:
/// a digest of their layout (each aggregate's kind and argument, in
/// order; not the results' names). A savepoint of the step written with
/// other aggregates has another version, and its restore is refused
/// instead of reading one aggregate's accumulator as another's.
pub fn state_version(specs: &[AggSpec]) -> u32 {
    let mut layout = String::new();
    for s in specs {
        let arg: String =
            s.arg.as_ref().map(|e| e.text.chars().filter(|c| !c.is_whitespace()).collect()).unwrap_or_default();
        layout.push_str(&format!("{:?}({arg});", s.kind));
    }
    layout_version(&layout)
}

/// A state version (at least 1) that is a digest of `layout`.
pub fn layout_version(layout: &str) -> u32 {
    (xxhash_rust::xxh3::xxh3_64(layout.as_bytes()) % u64::from(u32::MAX - 1)) as u32 + 1
}

/// The aggregates of a step, as one [`Aggregate`] over rows. A record
/// whose argument does not evaluate leaves the accumulators as they were,
/// and is counted in [`Aggregates::errors`].
#[derive(Clone, Debug)]
pub struct Aggregates {
    specs: Arc<[AggSpec]>,
    /// Where each aggregate's slots start in the accumulator.
    slots: Arc<[usize]>,
    /// Per aggregate, the field its argument is when it is one (read
    /// without evaluating the expression).
    fields: Arc<[Option<usize>]>,
    width: usize,
    /// Null fields before the results, for the caller to fill (the key).
    lead: usize,
    errors: Arc<std::sync::atomic::AtomicU64>,
}

impl Aggregates {
    /// The aggregates of `specs`.
    pub fn new(specs: Vec<AggSpec>) -> Aggregates {
        let mut slots = Vec::with_capacity(specs.len());
        let mut width = 0;
        for s in &specs {
            slots.push(width);
            width += if s.kind == AggKind::Avg { 2 } else { 1 };
        }
        let fields = specs
            .iter()
            .map(|s| match s.arg.as_ref().map(Expr::vector) {
                Some(expr::VExpr::Field(i)) => Some(*i),
                _ => None,
            })
            .collect();
        Aggregates { specs: specs.into(), slots: slots.into(), fields, width, lead: 0, errors: Arc::default() }
    }

    /// The same aggregates, whose results start with `lead` null fields
    /// (for the key, the window) that the caller fills in.
    #[must_use]
    pub fn with_lead(mut self, lead: usize) -> Aggregates {
        self.lead = lead;
        self
    }

    /// How many records' arguments did not evaluate.
    pub fn errors(&self) -> u64 {
        self.errors.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Adds `value` to `acc` where every argument is a field and the
    /// sums, minimums and maximums meet ints (or nulls), without copying
    /// the arguments: what [`Aggregates::add_one`] does there. Leaves
    /// `acc` as it was and says `false` for anything else (another type,
    /// a sum that overflows, a distinct count), for `add_one` to do.
    #[inline]
    fn add_ints(&self, acc: &mut Acc, value: &Row) -> bool {
        const MOST: usize = 8;
        if self.specs.len() > MOST {
            return false;
        }
        let arg = |k: usize| self.fields.get(k).copied().flatten().map(|i| value.field(i));
        // First every check, and the new sums: nothing changes unless all pass.
        let mut sums = [0i64; MOST];
        for (k, (s, &slot)) in self.specs.iter().zip(self.slots.iter()).enumerate() {
            match (s.kind, arg(k)) {
                (AggKind::Count, _) if s.arg.is_none() => {}
                (AggKind::Count | AggKind::First | AggKind::Last, Some(_)) => {}
                (AggKind::Sum | AggKind::Avg, Some(Value::Int(x))) => {
                    let total = match acc.int_or_null(slot) {
                        Some(Some(t)) => t.checked_add(*x),
                        Some(None) => Some(*x),
                        None => None,
                    };
                    match (total, sums.get_mut(k)) {
                        (Some(t), Some(slot)) => *slot = t,
                        _ => return false,
                    }
                }
                (AggKind::Min | AggKind::Max, Some(Value::Int(_) | Value::Null)) if acc.int_or_null(slot).is_some() => {
                }
                _ => return false,
            }
        }
        for (k, (s, &slot)) in self.specs.iter().zip(self.slots.iter()).enumerate() {
            let a = arg(k).unwrap_or(&Value::Null);
            match s.kind {
                AggKind::Count => acc.set_int(slot, acc.int_or_null(slot).flatten().unwrap_or(0) + 1),
                AggKind::Sum => acc.set_int(slot, sums.get(k).copied().unwrap_or_default()),
                AggKind::Avg => {
                    acc.set_int(slot, sums.get(k).copied().unwrap_or_default());
                    acc.set_int(slot + 1, acc.int_or_null(slot + 1).flatten().unwrap_or(0) + 1);
                }
                AggKind::Min | AggKind::Max => {
                    if let Value::Int(x) = a {
                        let better = match acc.int_or_null(slot).flatten() {
                            Some(c) => (s.kind == AggKind::Min && *x < c) || (s.kind == AggKind::Max && *x > c),
                            None => true,
                        };
                        if better {
                            acc.set_int(slot, *x);
                        }
                    }
                }
                AggKind::First => {
                    if acc.int_or_null(slot) == Some(None) {
                        acc.set(slot, a.clone());
                    }
                }
                AggKind::Last => acc.set(slot, a.clone()),
                AggKind::CountDistinct => {}
            }
        }
        true
    }

    /// Adds `value` to `acc` when every aggregate takes it; leaves `acc`
    /// as it was otherwise.
    fn add_one(&self, acc: &mut Acc, value: &Row) -> Result<(), EvalError> {
        acc.with_row(|acc| self.add_to_row(acc, value))
    }

    /// [`Aggregates::add_one`] on the accumulator's row.
    fn add_to_row(&self, acc: &mut Row, value: &Row) -> Result<(), EvalError> {
        let mut args: smallvec::SmallVec<[Value; 4]> = smallvec::SmallVec::new();
        for (s, field) in self.specs.iter().zip(self.fields.iter()) {
            args.push(match (&s.arg, field) {
                (_, Some(i)) => value.field(*i).clone(),
                (Some(e), None) => e.eval(value)?,
                (None, None) => Value::Null,
            });
        }
        // The sums first, the only updates that can fail besides `min`
        // and `max` (checked before anything changes): a record that fails
        // an aggregate changes none.
        let mut sums: smallvec::SmallVec<[Value; 4]> = smallvec::SmallVec::new();
        for ((s, &slot), arg) in self.specs.iter().zip(self.slots.iter()).zip(&args) {
            match s.kind {
                AggKind::Sum | AggKind::Avg => sums.push(sum(acc.field(slot), arg)?),
                AggKind::Min | AggKind::Max
                    if !matches!(arg, Value::Null) && !matches!(acc.field(slot), Value::Null) =>
                {
                    expr::order(arg, acc.field(slot), if s.kind == AggKind::Min { "min" } else { "max" })?;
                }
                _ => {}
            }
        }
        let mut sums = sums.into_iter();
        for ((s, &slot), arg) in self.specs.iter().zip(self.slots.iter()).zip(args) {
            let Some(cur) = acc.0.get_mut(slot) else { continue };
            match s.kind {
                AggKind::Count => *cur = Value::Int(int(cur) + 1),
                AggKind::Sum => *cur = sums.next().unwrap_or_default(),
                AggKind::Min | AggKind::Max => {
                    if !matches!(arg, Value::Null) {
                        let replace = match &*cur {
                            Value::Null => true,
                            c => {
                                let o = expr::order(&arg, c, if s.kind == AggKind::Min { "min" } else { "max" })?;
                                if s.kind == AggKind::Min { o.is_lt() } else { o.is_gt() }
                            }
                        };
                        if replace {
                            *cur = arg;
                        }
                    }
                }
                AggKind::Avg => {
                    *cur = sums.next().unwrap_or_default();
                    if let Some(n) = acc.0.get_mut(slot + 1) {
                        *n = Value::Int(int(n) + 1);
                    }
                }
                AggKind::First => {
                    if matches!(cur, Value::Null) {
                        *cur = arg;
                    }
                }
                AggKind::Last => *cur = arg,
                AggKind::CountDistinct => {
                    let mut set: Vec<Value> = match cur {
                        Value::List(items) => items.to_vec(),
                        _ => Vec::new(),
                    };
                    if let Err(at) = set.binary_search_by(|x| total_order(x, &arg)) {
                        set.insert(at, arg);
                    }
                    *cur = Value::List(Arc::new(set));
                }
            }
        }
        Ok(())
    }
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        _ => 0,
    }
}

fn sum(cur: &Value, arg: &Value) -> Result<Value, EvalError> {
    Ok(match (cur, arg) {
        (c, Value::Null) => c.clone(),
        (Value::Null, Value::Int(x)) => Value::Int(*x),
        (Value::Null, Value::Float(x)) => Value::Float(*x),
        (Value::Int(a), Value::Int(b)) => {
            Value::Int(a.checked_add(*b).ok_or_else(|| EvalError::new("int overflow in sum"))?)
        }
        (Value::Int(a), Value::Float(b)) => Value::Float(*a as f64 + b),
        (Value::Float(a), Value::Int(b)) => Value::Float(a + *b as f64),
        (Value::Float(a), Value::Float(b)) => Value::Float(a + b),
        (_, other) => return Err(EvalError::new(format!("sum of {} ({}), not a number", other, other.type_name()))),
    })
}

/// An order over all values (for the distinct set): by type, then value.
fn total_order(a: &Value, b: &Value) -> std::cmp::Ordering {
    let rank = |v: &Value| match v {
        Value::Null => 0,
        Value::Bool(_) => 1,
        Value::Int(_) => 2,
        Value::Float(_) => 3,
        Value::Str(_) => 4,
        Value::List(_) => 5,
        Value::Map(_) => 6,
    };
    match (a, b) {
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Int(x), Value::Int(y)) => x.cmp(y),
        (Value::Float(x), Value::Float(y)) => x.total_cmp(y),
        (Value::Str(x), Value::Str(y)) => x.cmp(y),
        _ if rank(a) != rank(b) => rank(a).cmp(&rank(b)),
        _ => a.to_string().cmp(&b.to_string()),
    }
}

impl Aggregate<Row> for Aggregates {
    type Acc = Acc;
    type Out = Row;

    fn create(&self) -> Acc {
        Acc::nulls(self.width)
    }

    fn add(&self, acc: &mut Acc, value: Row) {
        if !self.add_ints(acc, &value) && self.add_one(acc, &value).is_err() {
            self.errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn merge(&self, acc: &mut Acc, other: Acc) {
        let other = other.to_row();
        acc.with_row(|acc| self.merge_rows(acc, &other));
    }

    #[inline]
    fn result(&self, acc: &Acc) -> Row {
        // Nulls first, then each result written in its place: pushed one
        // by one, each value went through the stack and was read back
        // whole before its halves were written (`perf`: a quarter of
        // `bench yaml-w3-100keys` waited there).
        let width = self.lead + self.specs.len();
        let mut row = Row(if width <= 4 {
            smallvec::SmallVec::from_buf_and_len([const { Value::Null }; 4], width)
        } else {
            smallvec::SmallVec::from_elem(Value::Null, width)
        });
        let results = row.0.iter_mut().skip(self.lead);
        for ((s, &slot), out) in self.specs.iter().zip(self.slots.iter()).zip(results) {
            *out = match s.kind {
                AggKind::Count => Value::Int(acc.int_or_null(slot).flatten().unwrap_or(0)),
                AggKind::Avg => match (acc.get(slot), acc.int_or_null(slot + 1).flatten().unwrap_or(0)) {
                    (_, 0) => Value::Null,
                    (Value::Int(total), n) => Value::Float(total as f64 / n as f64),
                    (Value::Float(total), n) => Value::Float(total / n as f64),
                    _ => Value::Null,
                },
                AggKind::CountDistinct => match acc.get(slot) {
                    Value::List(items) => Value::Int(items.len() as i64),
                    _ => Value::Int(0),
                },
                _ => acc.get(slot),
            };
        }
        row
    }
}

impl Aggregates {
    /// Merges `other`'s values into `acc`'s.
    fn merge_rows(&self, acc: &mut Row, other: &Row) {
        for (s, &slot) in self.specs.iter().zip(self.slots.iter()) {
            let theirs = other.field(slot).clone();
            let Some(cur) = acc.0.get_mut(slot) else { continue };
            match s.kind {
                AggKind::Count => *cur = Value::Int(int(cur) + int(&theirs)),
                AggKind::Sum => *cur = sum(cur, &theirs).unwrap_or(Value::Null),
                AggKind::Avg => {
                    *cur = sum(cur, &theirs).unwrap_or(Value::Null);
                    let n = int(other.field(slot + 1));
                    if let Some(c) = acc.0.get_mut(slot + 1) {
                        *c = Value::Int(int(c) + n);
                    }
                }
                AggKind::Min | AggKind::Max => {
                    let better = match (&*cur, &theirs) {
                        (_, Value::Null) => false,
                        (Value::Null, _) => true,
                        (c, t) => expr::order(t, c, "min")
                            .is_ok_and(|o| if s.kind == AggKind::Min { o.is_lt() } else { o.is_gt() }),
                    };
                    if better {
                        *cur = theirs;
                    }
                }
                // Merged sessions: `acc` is the earlier one.
                AggKind::First => {
                    if matches!(cur, Value::Null) {
                        *cur = theirs;
                    }
                }
                AggKind::Last => {
                    if !matches!(theirs, Value::Null) {
                        *cur = theirs;
                    }
                }
                AggKind::CountDistinct => {
                    let mut set: Vec<Value> = match cur {
                        Value::List(items) => items.to_vec(),
                        _ => Vec::new(),
                    };
                    if let Value::List(items) = theirs {
                        for v in items.iter() {
                            if let Err(at) = set.binary_search_by(|x| total_order(x, v)) {
                                set.insert(at, v.clone());
                            }
                        }
                    }
                    *cur = Value::List(Arc::new(set));
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;

    const AT: Origin = Origin { pos: Pos { line: 5, column: 20 }, quoted: true };

    fn aggs(list: &[(&str, &str)]) -> Aggregates {
        let schema = Schema::of(["user", "amount"]);
        Aggregates::new(
            list.iter()
                .map(|(name, text)| {
                    let (kind, arg) = parse(text, &schema, AT).unwrap_or_else(|e| panic!("{e:?}"));
                    AggSpec { name: name.to_string(), kind, arg }
                })
                .collect(),
        )
    }

    /// One of each aggregate, the distinct count last.
    const EVERY: [(&str, &str); 8] = [
        ("n", "count()"),
        ("total", "sum(event.amount)"),
        ("low", "min(event.amount)"),
        ("high", "max(event.amount)"),
        ("mean", "avg(event.amount)"),
        ("first", "first(event.user)"),
        ("last", "last(event.user)"),
        ("users", "count_distinct(event.user)"),
    ];

    #[test]
    fn every_aggregate() {
        let a = aggs(&EVERY);
        let mut acc = a.create();
        for (user, amount) in [("a", 5), ("b", 1), ("a", 9)] {
            a.add(&mut acc, Row::new([Value::str(user), Value::Int(amount)]));
        }
        a.add(&mut acc, Row::new([Value::str("c"), Value::str("x")]));
        assert_eq!(a.errors(), 1);
        let out = a.result(&acc);
        assert_eq!(
            out.0.to_vec(),
            vec![
                Value::Int(3),
                Value::Int(15),
                Value::Int(1),
                Value::Int(9),
                Value::Float(5.0),
                Value::str("a"),
                Value::str("a"),
                Value::Int(2)
            ]
        );
        let mut other = a.create();
        a.add(&mut other, Row::new([Value::str("z"), Value::Int(0)]));
        a.merge(&mut acc, other);
        let out = a.result(&acc);
        assert_eq!(
            out.0.to_vec()[..5].to_vec(),
            vec![Value::Int(4), Value::Int(15), Value::Int(0), Value::Int(9), Value::Float(3.75)]
        );
        assert_eq!(out.0[7], Value::Int(3));
    }

    #[test]
    fn errors_have_positions() {
        let schema = Schema::of(["user", "amount"]);
        let e = parse("summ(event.amount)", &schema, AT).err().unwrap_or_default();
        assert_eq!((e[0].pos, e[0].message.as_str()), (Pos { line: 5, column: 21 }, "`summ` is not an aggregate"));
        assert_eq!(
            e[0].help.as_deref(),
            Some("did you mean `sum`? The aggregates are: count, sum, min, max, avg, first, last, count_distinct")
        );
        let e = parse("sum(event.amont)", &schema, AT).err().unwrap_or_default();
        assert_eq!(
            (e[0].pos, e[0].message.as_str()),
            (Pos { line: 5, column: 25 }, "no field `amont` in the records of this step")
        );
        let e = parse("count(event.user)", &schema, AT).err().unwrap_or_default();
        assert_eq!(e[0].message, "count() takes no argument");
    }

    /// Records of ints, nulls, a string or a float now and then.
    fn record() -> impl proptest::strategy::Strategy<Value = Row> {
        use proptest::prelude::*;
        let value = prop_oneof![
            8 => prop_oneof![Just(i64::MAX), Just(i64::MIN), Just(-1i64), -1000i64..1000].prop_map(Value::Int),
            1 => Just(Value::Null),
            1 => Just(Value::str("x")),
            1 => Just(Value::Float(0.5)),
        ];
        (value.clone(), value).prop_map(|(user, amount)| Row::new([user, amount]))
    }

    proptest::proptest! {
        /// The path for ints gives what the general one gives: the same
        /// accumulators, the same failures, record after record.
        #[test]
        fn ints_add_as_values_do(records in proptest::collection::vec(record(), 1..40)) {
            // All but the distinct count, which the int path leaves to
            // the general one.
            let a = aggs(&EVERY[..7]);
            let (mut fast, mut general) = (a.create(), a.create());
            for r in records {
                let before = fast.clone();
                let took = a.add_ints(&mut fast, &r);
                if !took {
                    proptest::prop_assert_eq!(&fast, &before, "unchanged when refused");
                    let _ = a.add_one(&mut fast, &r);
                }
                let general_ok = a.add_one(&mut general, &r).is_ok();
                proptest::prop_assert!(!took || general_ok, "the int path took what fails: {:?}", r);
                proptest::prop_assert_eq!(&fast, &general);
            }
        }
    }
}
