//! Expressions: CEL, parsed once by the `cel` crate's parser and compiled
//! here into a tree of closures over [`Row`]s.
//!
//! The field names an expression reads are resolved when it is compiled:
//! `event.amount` on a step whose schema is `[user, amount]` reads the
//! row's second value, with no lookup by name per record; on a step whose
//! schema is open (a source without `schema:`), it reads the field of the
//! record's map. A name the schema lacks is an error before anything runs.
//! Evaluation never panics: a wrong type, an overflow, a division by zero
//! or a missing field is an [`EvalError`], which the step's failure policy
//! handles.

use std::fmt;
use std::sync::Arc;

use cel::common::ast::{Expr as Ast, IdedExpr, LiteralValue};
use cel::parser::Parser;

use super::doc::{Diagnostic, Pos};
use super::value::{Row, Value};

/// The fields of the records at a step of a pipeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    /// The field names, in the rows' order.
    pub fields: Vec<Arc<str>>,
    /// Whether the fields are not known: the rows hold one value, the
    /// whole record as a map, and `event.x` reads its field `x`.
    pub open: bool,
    /// Whether fields are read by their bare names (`i`, in a
    /// generator's expressions), not through `event`.
    pub bare: bool,
    /// The names records are read through instead of `event` (`left` and
    /// `right` after a join), each naming the fields `<root>.<field>`.
    pub roots: Vec<Arc<str>>,
}

impl Schema {
    /// The schema of records whose fields are not declared.
    pub fn open() -> Schema {
        Schema { fields: vec![Arc::from("event")], open: true, bare: false, roots: Vec::new() }
    }

    /// A schema of `fields`.
    pub fn of<S: AsRef<str>>(fields: impl IntoIterator<Item = S>) -> Schema {
        Schema {
            fields: fields.into_iter().map(|f| Arc::from(f.as_ref())).collect(),
            open: false,
            bare: false,
            roots: Vec::new(),
        }
    }

    /// The fields of a join's results: `left`'s then `right`'s, read as
    /// `left.<field>` and `right.<field>`.
    pub fn joined(left: &Schema, right: &Schema) -> Schema {
        Schema::rooted(&[("left", left), ("right", right)])
    }

    /// Rows of each schema's fields in turn, read as `<root>.<field>`
    /// (`left` and `right` after a join, `acc` and `event` in a reduce).
    pub fn rooted(parts: &[(&str, &Schema)]) -> Schema {
        let fields = parts.iter().flat_map(|(root, s)| s.fields.iter().map(move |f| Arc::from(format!("{root}.{f}"))));
        Schema {
            fields: fields.collect(),
            open: false,
            bare: false,
            roots: parts.iter().map(|(root, _)| Arc::from(*root)).collect(),
        }
    }

    /// The index of `field`.
    pub fn index(&self, field: &str) -> Option<usize> {
        self.fields.iter().position(|f| &**f == field)
    }

    /// The row of this schema a map value gives: its fields by name (a
    /// field it lacks is null); for an open schema, the value itself.
    pub fn row_of(&self, v: &Value) -> Row {
        if self.open {
            return Row::new([v.clone()]);
        }
        Row(self.fields.iter().map(|f| v.get(f).cloned().unwrap_or_default()).collect())
    }

    /// A row of this schema as one map value.
    pub fn to_value(&self, row: &Row) -> Value {
        if self.open {
            return row.field(0).clone();
        }
        Value::Map(Arc::new(self.fields.iter().cloned().zip(row.0.iter().cloned()).collect()))
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.open {
            return f.write_str("any fields (no schema declared)");
        }
        let names: Vec<&str> = self.fields.iter().map(|f| &**f).collect();
        write!(f, "{}", names.join(", "))
    }
}

/// Why an expression gave no value for a record. (One pointer wide, so
/// that a result of an evaluation fits two registers.)
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(clippy::box_collection)]
pub struct EvalError(Box<String>);

impl EvalError {
    /// An error saying `message`.
    pub fn new(message: impl Into<String>) -> EvalError {
        EvalError(Box::new(message.into()))
    }
}

impl fmt::Display for EvalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EvalError {}

fn fail<T>(message: impl Into<String>) -> Result<T, EvalError> {
    Err(EvalError::new(message))
}

/// An evaluation of an expression on a row.
pub type Eval = Arc<dyn Fn(&Row) -> Result<Value, EvalError> + Send + Sync>;

/// A compiled expression.
#[derive(Clone)]
pub struct Expr {
    /// The expression as written.
    pub text: Arc<str>,
    eval: Eval,
    /// The same expression, evaluated a column of a batch at a time.
    vector: Arc<VExpr>,
    /// The value when the expression reads no field.
    constant: Option<Value>,
}

impl fmt::Debug for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Expr({:?})", self.text)
    }
}

impl Expr {
    /// The expression's value for `row`.
    #[inline]
    pub fn eval(&self, row: &Row) -> Result<Value, EvalError> {
        (self.eval)(row)
    }

    /// The expression's value for each of `rows`, computed a column at a
    /// time (as a pipeline's stateless steps compute it): the same values
    /// and errors as [`Expr::eval`] row by row.
    pub fn eval_column(&self, rows: &[Row]) -> Vec<Result<Value, EvalError>> {
        super::vector::column(self, rows)
    }

    /// Whether `row` passes the expression (a filter), which must give a bool.
    #[inline]
    pub fn test(&self, row: &Row) -> Result<bool, EvalError> {
        match (self.eval)(row)? {
            Value::Bool(b) => Ok(b),
            other => fail(format!("`{}` gave {} ({}), not a bool", self.text, other, other.type_name())),
        }
    }

    /// The value when the expression reads no field.
    pub fn constant(&self) -> Option<&Value> {
        self.constant.as_ref()
    }

    /// The expression as a tree of column operations.
    pub(crate) fn vector(&self) -> &VExpr {
        &self.vector
    }
}

/// Where an expression's text is in its file, to place its errors.
#[derive(Clone, Copy, Debug)]
pub struct Origin {
    /// Where the scalar holding the expression starts.
    pub pos: Pos,
    /// Whether the scalar is quoted (its text starts one column later).
    pub quoted: bool,
}

impl Origin {
    /// The position of byte `offset` of `text`, when it is on the scalar's
    /// first line; the scalar's position otherwise.
    pub(crate) fn pos_of(&self, text: &str, offset: usize) -> Pos {
        match text.get(..offset) {
            Some(before) if !before.contains('\n') => self.pos.right(before.chars().count() + usize::from(self.quoted)),
            _ => self.pos,
        }
    }
}

/// The longest expression, in bytes.
pub const MAX_LENGTH: usize = 4096;
/// The deepest nesting of brackets in an expression.
pub const MAX_NESTING: usize = 32;

/// The functions an expression may call, for messages.
pub const FUNCTIONS: &[&str] = &[
    "size",
    "int",
    "double",
    "string",
    "bool",
    "contains",
    "startsWith",
    "endsWith",
    "lowerAscii",
    "upperAscii",
    "has",
];

/// Compiles `text` against the records of `schema`.
///
/// # Errors
/// Every problem found: a syntax error, a field the schema lacks, a call
/// of an unknown function or with the wrong number of arguments, each at
/// its position.
pub fn compile(text: &str, schema: &Schema, origin: Origin) -> Result<Expr, Vec<Diagnostic>> {
    // The parser and the compiler recurse: bound what they are given.
    if text.len() > MAX_LENGTH {
        return Err(vec![
            Diagnostic::new(
                origin.pos,
                format!("the expression has {} bytes; at most {MAX_LENGTH} are read", text.len()),
            )
            .help("split the work over several steps"),
        ]);
    }
    let mut depth = 0usize;
    for (offset, c) in text.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth > MAX_NESTING {
            return Err(vec![Diagnostic::new(
                origin.pos_of(text, offset),
                format!("the expression nests deeper than {MAX_NESTING} brackets"),
            )]);
        }
    }
    // The parser recurses once per operator of a chain (`a + b + c ...`):
    // it runs on a thread of its own with room for the longest expression.
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("weibo-cel".into())
            .stack_size(COMPILE_STACK)
            .spawn_scoped(scope, || compile_here(text, schema, origin))
            .map_err(|e| {
                vec![Diagnostic::new(origin.pos, format!("cannot start the expression compiler's thread: {e}"))]
            })?
            .join()
            .unwrap_or_else(|_| Err(vec![Diagnostic::new(origin.pos, "the expression compiler failed")]))
    })
}

/// The stack of the thread expressions are compiled on.
const COMPILE_STACK: usize = 256 << 20;

fn compile_here(text: &str, schema: &Schema, origin: Origin) -> Result<Expr, Vec<Diagnostic>> {
    let parsed = Parser::new().max_recursion_depth(64).parse_with_source_info(text);
    let (ast, info) = match parsed {
        Ok(parsed) => parsed,
        Err(errors) => {
            return Err(errors
                .errors
                .iter()
                .map(|e| {
                    let line = usize::try_from(e.pos.0).unwrap_or(1).max(1);
                    let column = usize::try_from(e.pos.1).unwrap_or(1).max(1);
                    let offset = text.split_inclusive('\n').take(line - 1).map(str::len).sum::<usize>() + column - 1;
                    Diagnostic::new(
                        origin.pos_of(text, offset),
                        format!("the expression `{text}` does not parse: {}", e.msg),
                    )
                })
                .collect());
        }
    };
    let mut compiler = Compiler { text, schema, origin, info: &info, errors: Vec::new() };
    let node = compiler.node(&ast);
    if !compiler.errors.is_empty() {
        return Err(compiler.errors);
    }
    let constant = match &node {
        C::Const(v) => Some(v.clone()),
        _ => None,
    };
    // Columns pay for numbers and bools; an expression over strings,
    // lists or maps, or calling functions, is evaluated record by record
    // (where it is cheaper), within the same batches.
    let vector = match compiler.vnode(&ast) {
        v if v.numeric() => v,
        _ => VExpr::Scalar(node.clone_eval()),
    };
    let vector = Arc::new(vector);
    Ok(Expr { text: Arc::from(text), eval: node.into_eval(), vector, constant })
}

/// A compiled node: a constant and a field read are kept apart so that the
/// operators over them can be specialised.
enum C {
    Const(Value),
    Field(usize),
    Dyn(Eval),
}

impl C {
    /// The evaluation, leaving the node as it is.
    fn clone_eval(&self) -> Eval {
        match self {
            C::Const(v) => {
                let v = v.clone();
                Arc::new(move |_| Ok(v.clone()))
            }
            C::Field(i) => {
                let i = *i;
                Arc::new(move |row| Ok(row.field(i).clone()))
            }
            C::Dyn(eval) => eval.clone(),
        }
    }

    fn into_eval(self) -> Eval {
        match self {
            C::Const(v) => Arc::new(move |_| Ok(v.clone())),
            C::Field(i) => Arc::new(move |row| Ok(row.field(i).clone())),
            C::Dyn(eval) => eval,
        }
    }
}

struct Compiler<'a> {
    text: &'a str,
    schema: &'a Schema,
    origin: Origin,
    info: &'a cel::common::ast::SourceInfo,
    errors: Vec<Diagnostic>,
}

impl Compiler<'_> {
    fn offset(&self, id: u64) -> usize {
        self.info.offset_for(id).map_or(0, |(start, _)| start as usize)
    }

    fn pos(&self, id: u64) -> Pos {
        self.origin.pos_of(self.text, self.offset(id))
    }

    fn error(&mut self, id: u64, message: String, help: Option<String>) -> C {
        let mut d = Diagnostic::new(self.pos(id), message);
        d.help = help;
        self.errors.push(d);
        C::Const(Value::Null)
    }

    fn node(&mut self, e: &IdedExpr) -> C {
        match &e.expr {
            Ast::Literal(lit) => C::Const(match lit {
                LiteralValue::Boolean(b) => Value::Bool(**b),
                LiteralValue::Int(i) => Value::Int(**i),
                LiteralValue::UInt(u) => match i64::try_from(**u) {
                    Ok(i) => Value::Int(i),
                    Err(_) => return self.error(e.id, format!("{} is past the largest int", **u), None),
                },
                LiteralValue::Double(d) => Value::Float(**d),
                LiteralValue::String(s) => Value::str(s),
                LiteralValue::Null => Value::Null,
                LiteralValue::Bytes(_) => return self.error(e.id, "bytes literals are not supported".into(), None),
            }),
            Ast::Ident(name) if name == "event" && self.schema.roots.is_empty() => {
                if self.schema.open {
                    return C::Field(0);
                }
                let schema = self.schema.clone();
                C::Dyn(Arc::new(move |row| Ok(schema.to_value(row))))
            }
            Ast::Ident(name) if self.schema.bare && self.schema.index(name).is_some() => {
                C::Field(self.schema.index(name).unwrap_or(0))
            }
            Ast::Ident(name) if !self.schema.roots.is_empty() => {
                let roots: Vec<&str> = self.schema.roots.iter().map(|r| &**r).collect();
                let help = format!(
                    "the records here are read through {}: write `{}.<field>`",
                    roots.join(" and "),
                    roots.first().copied().unwrap_or("left")
                );
                self.error(e.id, format!("unknown name `{name}`"), Some(help))
            }
            Ast::Ident(name) => {
                let help = match self.schema.index(name) {
                    Some(_) => Some(format!("fields are read through `event`: write `event.{name}`")),
                    None => Some("a record is `event`, its fields `event.<name>`".to_string()),
                };
                self.error(e.id, format!("unknown name `{name}`"), help)
            }
            Ast::Select(select) => self.select(e.id, &select.operand, &select.field, select.test),
            Ast::Call(call) => self.call(e.id, &call.func_name, call.target.as_deref(), &call.args),
            Ast::List(list) => {
                let items: Vec<Eval> = list.elements.iter().map(|x| self.node(x).into_eval()).collect();
                C::Dyn(Arc::new(move |row| {
                    Ok(Value::List(Arc::new(items.iter().map(|x| x(row)).collect::<Result<Vec<_>, _>>()?)))
                }))
            }
            Ast::Map(map) => {
                let mut entries = Vec::new();
                for entry in &map.entries {
                    match &entry.expr {
                        cel::common::ast::EntryExpr::MapEntry(m) => match self.node(&m.key) {
                            C::Const(Value::Str(k)) => {
                                entries.push((Arc::<str>::from(k.as_str()), self.node(&m.value).into_eval()))
                            }
                            _ => {
                                self.error(entry.id, "a map's keys are string literals here".into(), None);
                            }
                        },
                        cel::common::ast::EntryExpr::StructField(_) => {
                            self.error(entry.id, "messages are not supported".into(), None);
                        }
                    }
                }
                C::Dyn(Arc::new(move |row| {
                    let mut out = Vec::with_capacity(entries.len());
                    for (k, v) in &entries {
                        out.push((k.clone(), v(row)?));
                    }
                    Ok(Value::Map(Arc::new(out)))
                }))
            }
            Ast::Comprehension(_) => {
                self.error(e.id, "comprehensions (all, exists, map, filter) are not supported yet".into(), None)
            }
            Ast::Struct(_) => self.error(e.id, "messages are not supported".into(), None),
            Ast::Unspecified => self.error(e.id, "an empty expression".into(), None),
        }
    }

    /// The vectorised form of `e` (which compiled without errors): the
    /// operators a column can be computed with, over the scalar form of
    /// everything else.
    fn vnode(&mut self, e: &IdedExpr) -> VExpr {
        use cel::common::ast::operators as op;
        let Ast::Call(call) = &e.expr else {
            return VExpr::of(self.node(e));
        };
        let args: Vec<&IdedExpr> = call.target.as_deref().into_iter().chain(&call.args).collect();
        let name = call.func_name.as_str();
        let mut v = |i: usize| args.get(i).map_or(VExpr::Const(Value::Null), |a| self.vnode(a));
        let node = match (name, args.len()) {
            (op::LOGICAL_AND, 2) => VExpr::And(Box::new(v(0)), Box::new(v(1))),
            (op::LOGICAL_OR, 2) => VExpr::Or(Box::new(v(0)), Box::new(v(1))),
            (op::LOGICAL_NOT, 1) => VExpr::Not(Box::new(v(0))),
            (op::NEGATE, 1) => VExpr::Neg(Box::new(v(0))),
            (op::CONDITIONAL, 3) => VExpr::Cond(Box::new(v(0)), Box::new(v(1)), Box::new(v(2))),
            (_, 2) if BinKind::of(name).is_some() => {
                let kind = BinKind::of(name).unwrap_or(BinKind::Eq);
                match (v(0), v(1)) {
                    (VExpr::Const(a), VExpr::Const(b)) => match kind.any(&a, &b) {
                        Ok(folded) => VExpr::Const(folded),
                        Err(_) => VExpr::Bin(kind, Box::new(VExpr::Const(a)), Box::new(VExpr::Const(b))),
                    },
                    (a, b) => VExpr::Bin(kind, Box::new(a), Box::new(b)),
                }
            }
            _ => VExpr::of(self.node(e)),
        };
        match node {
            VExpr::Not(a) if matches!(*a, VExpr::Scalar(_)) => VExpr::of(self.node(e)),
            VExpr::Neg(a) if matches!(*a, VExpr::Scalar(_)) => VExpr::of(self.node(e)),
            other => other,
        }
    }

    fn select(&mut self, _id: u64, operand: &IdedExpr, field: &str, test: bool) -> C {
        if let Ast::Ident(root) = &operand.expr
            && self.schema.roots.iter().any(|r| **r == **root)
        {
            let name = format!("{root}.{field}");
            return match self.schema.index(&name) {
                Some(i) if test => C::Dyn(Arc::new(move |row| Ok(Value::Bool(!matches!(row.field(i), Value::Null))))),
                Some(i) => C::Field(i),
                None => {
                    let prefix = format!("{root}.");
                    let theirs: Vec<&str> =
                        self.schema.fields.iter().filter_map(|f| f.strip_prefix(prefix.as_str())).collect();
                    let help = match closest(field, theirs.iter().copied()) {
                        Some(near) => {
                            format!("did you mean `{root}.{near}`? The records of `{root}` have: {}", theirs.join(", "))
                        }
                        None => format!("the records of `{root}` have: {}", theirs.join(", ")),
                    };
                    self.error(operand.id, format!("no field `{field}` in the records of `{root}`"), Some(help))
                }
            };
        }
        if matches!(&operand.expr, Ast::Ident(name) if name == "event") && !self.schema.open {
            return match self.schema.index(field) {
                Some(i) if test => C::Dyn(Arc::new(move |row| Ok(Value::Bool(!matches!(row.field(i), Value::Null))))),
                Some(i) => C::Field(i),
                None => {
                    let help = match closest(field, self.schema.fields.iter().map(|f| &**f)) {
                        Some(near) => format!("did you mean `event.{near}`? The records here have: {}", self.schema),
                        None => format!("the records here have: {}", self.schema),
                    };
                    self.error(operand.id, format!("no field `{field}` in the records of this step"), Some(help))
                }
            };
        }
        let inner = self.node(operand).into_eval();
        let field: Arc<str> = Arc::from(field);
        if test {
            return C::Dyn(Arc::new(move |row| match inner(row)? {
                Value::Map(m) => Ok(Value::Bool(m.iter().any(|(k, _)| *k == field))),
                other => fail(format!("has() on {} ({}), not a map", other, other.type_name())),
            }));
        }
        C::Dyn(Arc::new(move |row| match inner(row)? {
            Value::Map(m) => match m.iter().find(|(k, _)| *k == field) {
                Some((_, v)) => Ok(v.clone()),
                None => fail(format!("no field `{field}` in {}", Value::Map(m.clone()))),
            },
            other => fail(format!("`.{field}` on {} ({}), not a map", other, other.type_name())),
        }))
    }

    fn call(&mut self, id: u64, name: &str, target: Option<&IdedExpr>, args: &[IdedExpr]) -> C {
        use cel::common::ast::operators as op;
        let mut all: Vec<C> = target.into_iter().chain(args).map(|a| self.node(a)).collect();
        match (name, all.len()) {
            (op::LOGICAL_AND | op::LOGICAL_OR, 2) => {
                let (b, a) = (pop(&mut all), pop(&mut all));
                let (a, b) = (a.into_eval(), b.into_eval());
                let and = name == op::LOGICAL_AND;
                C::Dyn(Arc::new(move |row| {
                    let l = truth(a(row)?, if and { "&&" } else { "||" })?;
                    if l != and {
                        return Ok(Value::Bool(l));
                    }
                    Ok(Value::Bool(truth(b(row)?, if and { "&&" } else { "||" })?))
                }))
            }
            (op::LOGICAL_NOT, 1) => {
                let a = pop(&mut all).into_eval();
                C::Dyn(Arc::new(move |row| Ok(Value::Bool(!truth(a(row)?, "!")?))))
            }
            (op::NEGATE, 1) => {
                let a = pop(&mut all).into_eval();
                C::Dyn(Arc::new(move |row| negate(a(row)?)))
            }
            (op::CONDITIONAL, 3) => {
                let (c, b, a) = (pop(&mut all).into_eval(), pop(&mut all).into_eval(), pop(&mut all).into_eval());
                C::Dyn(Arc::new(move |row| if truth(a(row)?, "?:")? { b(row) } else { c(row) }))
            }
            (
                op::ADD
                | op::SUBSTRACT
                | op::MULTIPLY
                | op::DIVIDE
                | op::MODULO
                | op::EQUALS
                | op::NOT_EQUALS
                | op::LESS
                | op::LESS_EQUALS
                | op::GREATER
                | op::GREATER_EQUALS,
                2,
            ) => {
                let (b, a) = (pop(&mut all), pop(&mut all));
                match name {
                    op::ADD => arith::<Add>(a, b),
                    op::SUBSTRACT => arith::<Sub>(a, b),
                    op::MULTIPLY => arith::<Mul>(a, b),
                    op::DIVIDE => arith::<Div>(a, b),
                    op::MODULO => arith::<Rem>(a, b),
                    op::EQUALS => arith::<Eq>(a, b),
                    op::NOT_EQUALS => arith::<Ne>(a, b),
                    op::LESS => arith::<Lt>(a, b),
                    op::LESS_EQUALS => arith::<Le>(a, b),
                    op::GREATER => arith::<Gt>(a, b),
                    _ => arith::<Ge>(a, b),
                }
            }
            (op::INDEX, 2) => binary(pop_first(&mut all), pop(&mut all), index),
            (op::IN, 2) => binary(pop_first(&mut all), pop(&mut all), |a, b| match b {
                Value::List(items) => Ok(Value::Bool(items.iter().any(|x| equal(x, a)))),
                Value::Map(m) => Ok(Value::Bool(matches!(a, Value::Str(k) if m.iter().any(|(key, _)| **key == ***k)))),
                other => fail(format!("`in` {} ({}), not a list or map", other, other.type_name())),
            }),
            ("size", 1) => unary(pop(&mut all), |v| match v {
                Value::Str(s) => Ok(Value::Int(s.chars().count() as i64)),
                Value::List(l) => Ok(Value::Int(l.len() as i64)),
                Value::Map(m) => Ok(Value::Int(m.len() as i64)),
                other => fail(format!("size() of {} ({})", other, other.type_name())),
            }),
            ("int", 1) => unary(pop(&mut all), to_int),
            ("double", 1) => unary(pop(&mut all), |v| match v {
                Value::Int(i) => Ok(Value::Float(i as f64)),
                Value::Float(f) => Ok(Value::Float(f)),
                Value::Str(s) => s
                    .trim()
                    .parse::<f64>()
                    .map(Value::Float)
                    .or_else(|_| fail(format!("double(\"{s}\"): not a number"))),
                other => fail(format!("double() of {} ({})", other, other.type_name())),
            }),
            ("string", 1) => unary(pop(&mut all), |v| {
                Ok(match v {
                    Value::Str(s) => Value::Str(s),
                    other => Value::string(other.to_string()),
                })
            }),
            ("bool", 1) => unary(pop(&mut all), |v| match v {
                Value::Bool(b) => Ok(Value::Bool(b)),
                Value::Str(s) if &*s == "true" => Ok(Value::Bool(true)),
                Value::Str(s) if &*s == "false" => Ok(Value::Bool(false)),
                other => fail(format!("bool() of {} ({})", other, other.type_name())),
            }),
            ("contains" | "startsWith" | "endsWith", 2) if target.is_some() => {
                let f: fn(&str, &str) -> bool = match name {
                    "contains" => |a, b| a.contains(b),
                    "startsWith" => |a, b| a.starts_with(b),
                    _ => |a, b| a.ends_with(b),
                };
                let (b, a) = (pop(&mut all).into_eval(), pop(&mut all).into_eval());
                let name = name.to_string();
                C::Dyn(Arc::new(move |row| match (a(row)?, b(row)?) {
                    (Value::Str(a), Value::Str(b)) => Ok(Value::Bool(f(&a, &b))),
                    (a, b) => fail(format!("{name}() on {} and {}: strings only", a.type_name(), b.type_name())),
                }))
            }
            ("lowerAscii" | "upperAscii", 1) if target.is_some() => {
                let lower = name == "lowerAscii";
                unary_with(pop(&mut all), move |v| match v {
                    Value::Str(s) => {
                        Ok(Value::string(if lower { s.to_ascii_lowercase() } else { s.to_ascii_uppercase() }))
                    }
                    other => fail(format!(
                        "{} of {}: strings only",
                        if lower { "lowerAscii()" } else { "upperAscii()" },
                        other.type_name()
                    )),
                })
            }
            _ => {
                let known = FUNCTIONS.contains(&name)
                    || name.starts_with('_')
                    || name.starts_with('@')
                    || name.starts_with('!')
                    || name.starts_with('-');
                let written = if name.starts_with('_') || name.starts_with('@') {
                    name.trim_matches(|c| c == '_' || c == '@').to_string()
                } else {
                    name.to_string()
                };
                if known {
                    self.error(id, format!("`{written}` does not take {} argument(s) here", all.len()), None)
                } else {
                    let help = match closest(name, FUNCTIONS.iter().copied()) {
                        Some(near) => format!("did you mean `{near}`? The functions are: {}", FUNCTIONS.join(", ")),
                        None => format!("the functions are: {}", FUNCTIONS.join(", ")),
                    };
                    // A call's position is its `(`: the name is just before it.
                    let at = self.offset(id);
                    let start =
                        at.checked_sub(name.len()).filter(|&s| self.text.get(s..at) == Some(name)).unwrap_or(at);
                    let mut d =
                        Diagnostic::new(self.origin.pos_of(self.text, start), format!("unknown function `{written}`"));
                    d.help = Some(help);
                    self.errors.push(d);
                    C::Const(Value::Null)
                }
            }
        }
    }
}

fn pop(all: &mut Vec<C>) -> C {
    all.pop().unwrap_or(C::Const(Value::Null))
}

fn pop_first(all: &mut Vec<C>) -> C {
    if all.is_empty() { C::Const(Value::Null) } else { all.remove(0) }
}

fn unary(a: C, f: fn(Value) -> Result<Value, EvalError>) -> C {
    if let C::Const(v) = &a
        && let Ok(folded) = f(v.clone())
    {
        return C::Const(folded);
    }
    let a = a.into_eval();
    C::Dyn(Arc::new(move |row| f(a(row)?)))
}

fn unary_with(a: C, f: impl Fn(Value) -> Result<Value, EvalError> + Send + Sync + 'static) -> C {
    let a = a.into_eval();
    C::Dyn(Arc::new(move |row| f(a(row)?)))
}

/// A binary operator, specialised for a field and a constant (the common
/// `event.x > 0`, `event.v * 3`) so that neither side is a call.
fn binary(a: C, b: C, f: fn(&Value, &Value) -> Result<Value, EvalError>) -> C {
    match (a, b) {
        (C::Const(x), C::Const(y)) => match f(&x, &y) {
            Ok(v) => C::Const(v),
            Err(_) => C::Dyn(Arc::new(move |_| f(&x, &y))),
        },
        (C::Field(i), C::Const(k)) => C::Dyn(Arc::new(move |row| f(row.field(i), &k))),
        (C::Const(k), C::Field(i)) => C::Dyn(Arc::new(move |row| f(&k, row.field(i)))),
        (C::Field(i), C::Field(j)) => C::Dyn(Arc::new(move |row| f(row.field(i), row.field(j)))),
        (a, C::Const(k)) => {
            let a = a.into_eval();
            C::Dyn(Arc::new(move |row| f(&a(row)?, &k)))
        }
        (a, b) => {
            let (a, b) = (a.into_eval(), b.into_eval());
            C::Dyn(Arc::new(move |row| f(&a(row)?, &b(row)?)))
        }
    }
}

/// An expression as a tree of operations over columns (see `vector.rs`):
/// each node computes a column of a batch at a time.
#[derive(Clone)]
pub(crate) enum VExpr {
    /// A constant.
    Const(Value),
    /// A field of the records.
    Field(usize),
    /// An arithmetic operator or a comparison.
    Bin(BinKind, Box<VExpr>, Box<VExpr>),
    /// `&&`, left to right: the right side only where the left is true.
    And(Box<VExpr>, Box<VExpr>),
    /// `||`, left to right: the right side only where the left is false.
    Or(Box<VExpr>, Box<VExpr>),
    /// `!`.
    Not(Box<VExpr>),
    /// Unary `-`.
    Neg(Box<VExpr>),
    /// `c ? a : b`: each side only where it is taken.
    Cond(Box<VExpr>, Box<VExpr>, Box<VExpr>),
    /// Anything else, record by record.
    Scalar(Eval),
}

impl VExpr {
    /// Whether the expression is operators over fields and numbers or
    /// bools only.
    fn numeric(&self) -> bool {
        match self {
            VExpr::Const(v) => matches!(v, Value::Int(_) | Value::Bool(_) | Value::Float(_) | Value::Null),
            VExpr::Field(_) => true,
            VExpr::Bin(_, a, b) | VExpr::And(a, b) | VExpr::Or(a, b) => a.numeric() && b.numeric(),
            VExpr::Not(a) | VExpr::Neg(a) => a.numeric(),
            VExpr::Cond(c, a, b) => c.numeric() && a.numeric() && b.numeric(),
            VExpr::Scalar(_) => false,
        }
    }

    /// The fields the expression reads, or `None` when it may read any
    /// (an expression evaluated record by record).
    pub(crate) fn reads(&self, into: &mut Vec<usize>) -> Option<()> {
        match self {
            VExpr::Const(_) => Some(()),
            VExpr::Field(i) => {
                into.push(*i);
                Some(())
            }
            VExpr::Bin(_, a, b) | VExpr::And(a, b) | VExpr::Or(a, b) => {
                a.reads(into)?;
                b.reads(into)
            }
            VExpr::Not(a) | VExpr::Neg(a) => a.reads(into),
            VExpr::Cond(c, a, b) => {
                c.reads(into)?;
                a.reads(into)?;
                b.reads(into)
            }
            VExpr::Scalar(_) => None,
        }
    }

    /// Whether the expression cannot fail when field `i` is an int in
    /// `ranges(i)` (or anything, when `None`): a field, a constant, or
    /// int operators whose results provably fit 64 bits.
    pub(crate) fn infallible(&self, ranges: &dyn Fn(usize) -> Option<(i128, i128)>) -> bool {
        matches!(self, VExpr::Const(_) | VExpr::Field(_)) || self.range(ranges).is_some()
    }

    /// The least and greatest value of the expression, when it is an int
    /// computed without a failure from fields of known ranges.
    pub(crate) fn range(&self, ranges: &dyn Fn(usize) -> Option<(i128, i128)>) -> Option<(i128, i128)> {
        let fits = |lo: i128, hi: i128| (lo >= i128::from(i64::MIN) && hi <= i128::from(i64::MAX)).then_some((lo, hi));
        match self {
            VExpr::Const(Value::Int(k)) => Some((i128::from(*k), i128::from(*k))),
            VExpr::Field(i) => ranges(*i),
            VExpr::Bin(kind, a, b) => {
                let (al, ah) = a.range(ranges)?;
                let (bl, bh) = b.range(ranges)?;
                match kind {
                    BinKind::Add => fits(al + bl, ah + bh),
                    BinKind::Sub => fits(al - bh, ah - bl),
                    BinKind::Mul => {
                        let products = [al * bl, al * bh, ah * bl, ah * bh];
                        fits(*products.iter().min()?, *products.iter().max()?)
                    }
                    // By a positive constant, of a non-negative int.
                    BinKind::Div if bl == bh && bl > 0 && al >= 0 => Some((al / bl, ah / bl)),
                    BinKind::Rem if bl == bh && bl > 0 && al >= 0 => Some((0, ah.min(bl - 1))),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    fn of(c: C) -> VExpr {
        match c {
            C::Const(v) => VExpr::Const(v),
            C::Field(i) => VExpr::Field(i),
            C::Dyn(eval) => VExpr::Scalar(eval),
        }
    }
}

/// The binary operators a column is computed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BinKind {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl BinKind {
    fn of(name: &str) -> Option<BinKind> {
        use cel::common::ast::operators as op;
        Some(match name {
            op::ADD => BinKind::Add,
            op::SUBSTRACT => BinKind::Sub,
            op::MULTIPLY => BinKind::Mul,
            op::DIVIDE => BinKind::Div,
            op::MODULO => BinKind::Rem,
            op::EQUALS => BinKind::Eq,
            op::NOT_EQUALS => BinKind::Ne,
            op::LESS => BinKind::Lt,
            op::LESS_EQUALS => BinKind::Le,
            op::GREATER => BinKind::Gt,
            op::GREATER_EQUALS => BinKind::Ge,
            _ => return None,
        })
    }

    /// The operator on two ints, as the record-by-record evaluation has it.
    #[inline]
    pub(crate) fn ints(self, a: i64, b: i64) -> Result<Value, EvalError> {
        match self {
            BinKind::Add => Add::ints(a, b),
            BinKind::Sub => Sub::ints(a, b),
            BinKind::Mul => Mul::ints(a, b),
            BinKind::Div => Div::ints(a, b),
            BinKind::Rem => Rem::ints(a, b),
            BinKind::Eq => Eq::ints(a, b),
            BinKind::Ne => Ne::ints(a, b),
            BinKind::Lt => Lt::ints(a, b),
            BinKind::Le => Le::ints(a, b),
            BinKind::Gt => Gt::ints(a, b),
            BinKind::Ge => Ge::ints(a, b),
        }
    }

    /// The operator on any two values, as the record-by-record evaluation
    /// has it.
    pub(crate) fn any(self, a: &Value, b: &Value) -> Result<Value, EvalError> {
        if let (Value::Int(x), Value::Int(y)) = (a, b) {
            return self.ints(*x, *y);
        }
        match self {
            BinKind::Add => Add::any(a, b),
            BinKind::Sub => Sub::any(a, b),
            BinKind::Mul => Mul::any(a, b),
            BinKind::Div => Div::any(a, b),
            BinKind::Rem => Rem::any(a, b),
            BinKind::Eq => Eq::any(a, b),
            BinKind::Ne => Ne::any(a, b),
            BinKind::Lt => Lt::any(a, b),
            BinKind::Le => Le::any(a, b),
            BinKind::Gt => Gt::any(a, b),
            BinKind::Ge => Ge::any(a, b),
        }
    }

    /// Whether it compares (gives a bool) rather than computes.
    pub(crate) fn compares(self) -> bool {
        !matches!(self, BinKind::Add | BinKind::Sub | BinKind::Mul | BinKind::Div | BinKind::Rem)
    }
}

/// An arithmetic or comparison operator: what it does to two ints (the
/// common case, inlined) and to any two values.
trait BinOp: Send + Sync + 'static {
    fn ints(a: i64, b: i64) -> Result<Value, EvalError>;
    fn any(a: &Value, b: &Value) -> Result<Value, EvalError>;
}

macro_rules! bin_op {
    ($name:ident, |$a:ident, $b:ident| $ints:expr, $any:expr) => {
        struct $name;
        impl BinOp for $name {
            #[inline(always)]
            fn ints($a: i64, $b: i64) -> Result<Value, EvalError> {
                $ints
            }
            fn any(a: &Value, b: &Value) -> Result<Value, EvalError> {
                $any(a, b)
            }
        }
    };
}

bin_op!(Add, |a, b| a.checked_add(b).map(Value::Int).ok_or_else(|| overflow("+")), add);
bin_op!(Sub, |a, b| a.checked_sub(b).map(Value::Int).ok_or_else(|| overflow("-")), sub);
bin_op!(Mul, |a, b| a.checked_mul(b).map(Value::Int).ok_or_else(|| overflow("*")), mul);
bin_op!(Div, |a, b| div(&Value::Int(a), &Value::Int(b)), div);
bin_op!(Rem, |a, b| rem(&Value::Int(a), &Value::Int(b)), rem);
bin_op!(Eq, |a, b| Ok(Value::Bool(a == b)), |a: &Value, b: &Value| Ok(Value::Bool(equal(a, b))));
bin_op!(Ne, |a, b| Ok(Value::Bool(a != b)), |a: &Value, b: &Value| Ok(Value::Bool(!equal(a, b))));
bin_op!(Lt, |a, b| Ok(Value::Bool(a < b)), |a: &Value, b: &Value| order(a, b, "<").map(|o| Value::Bool(o.is_lt())));
bin_op!(Le, |a, b| Ok(Value::Bool(a <= b)), |a: &Value, b: &Value| order(a, b, "<=").map(|o| Value::Bool(o.is_le())));
bin_op!(Gt, |a, b| Ok(Value::Bool(a > b)), |a: &Value, b: &Value| order(a, b, ">").map(|o| Value::Bool(o.is_gt())));
bin_op!(Ge, |a, b| Ok(Value::Bool(a >= b)), |a: &Value, b: &Value| order(a, b, ">=").map(|o| Value::Bool(o.is_ge())));

/// Operator `O` over `a` and `b`, with the int case of each shape (a field
/// or an expression, and a constant) inlined in its closure.
fn arith<O: BinOp>(a: C, b: C) -> C {
    match (a, b) {
        (C::Field(i), C::Const(Value::Int(k))) => C::Dyn(Arc::new(move |row| match row.field(i) {
            Value::Int(x) => O::ints(*x, k),
            other => O::any(other, &Value::Int(k)),
        })),
        (C::Const(Value::Int(k)), C::Field(i)) => C::Dyn(Arc::new(move |row| match row.field(i) {
            Value::Int(x) => O::ints(k, *x),
            other => O::any(&Value::Int(k), other),
        })),
        (C::Field(i), C::Field(j)) => C::Dyn(Arc::new(move |row| match (row.field(i), row.field(j)) {
            (Value::Int(x), Value::Int(y)) => O::ints(*x, *y),
            (x, y) => O::any(x, y),
        })),
        (C::Dyn(a), C::Const(Value::Int(k))) => C::Dyn(Arc::new(move |row| match a(row)? {
            Value::Int(x) => O::ints(x, k),
            other => O::any(&other, &Value::Int(k)),
        })),
        (a, b) => binary(a, b, O::any),
    }
}

/// Unary `-`.
pub(crate) fn negate(v: Value) -> Result<Value, EvalError> {
    match v {
        Value::Int(i) => i.checked_neg().map(Value::Int).map_or_else(|| fail("int overflow in -"), Ok),
        Value::Float(f) => Ok(Value::Float(-f)),
        other => fail(format!("-{other}: no - for {}", other.type_name())),
    }
}

/// The bool `v` is, for operator `op`.
pub(crate) fn truth(v: Value, op: &str) -> Result<bool, EvalError> {
    match v {
        Value::Bool(b) => Ok(b),
        other => fail(format!("`{op}` on {} ({}), not a bool", other, other.type_name())),
    }
}

fn no_overload(op: &str, a: &Value, b: &Value) -> EvalError {
    EvalError::new(format!("no `{op}` for {} and {} ({a} {op} {b})", a.type_name(), b.type_name()))
}

#[inline]
fn add(a: &Value, b: &Value) -> Result<Value, EvalError> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => x.checked_add(*y).map(Value::Int).ok_or_else(|| overflow("+")),
        (Value::Float(x), Value::Float(y)) => Ok(Value::Float(x + y)),
        (Value::Str(x), Value::Str(y)) => Ok(Value::string(format!("{x}{y}"))),
        (Value::List(x), Value::List(y)) => Ok(Value::List(Arc::new(x.iter().chain(y.iter()).cloned().collect()))),
        _ => Err(no_overload("+", a, b)),
    }
}

#[inline]
fn sub(a: &Value, b: &Value) -> Result<Value, EvalError> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => x.checked_sub(*y).map(Value::Int).ok_or_else(|| overflow("-")),
        (Value::Float(x), Value::Float(y)) => Ok(Value::Float(x - y)),
        _ => Err(no_overload("-", a, b)),
    }
}

#[inline]
fn mul(a: &Value, b: &Value) -> Result<Value, EvalError> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => x.checked_mul(*y).map(Value::Int).ok_or_else(|| overflow("*")),
        (Value::Float(x), Value::Float(y)) => Ok(Value::Float(x * y)),
        _ => Err(no_overload("*", a, b)),
    }
}

#[inline]
fn div(a: &Value, b: &Value) -> Result<Value, EvalError> {
    match (a, b) {
        (Value::Int(_), Value::Int(0)) => fail("division by zero"),
        (Value::Int(x), Value::Int(y)) => x.checked_div(*y).map(Value::Int).ok_or_else(|| overflow("/")),
        (Value::Float(x), Value::Float(y)) => Ok(Value::Float(x / y)),
        _ => Err(no_overload("/", a, b)),
    }
}

#[inline]
fn rem(a: &Value, b: &Value) -> Result<Value, EvalError> {
    match (a, b) {
        (Value::Int(_), Value::Int(0)) => fail("modulus by zero"),
        (Value::Int(x), Value::Int(y)) => x.checked_rem(*y).map(Value::Int).ok_or_else(|| overflow("%")),
        _ => Err(no_overload("%", a, b)),
    }
}

fn overflow(op: &str) -> EvalError {
    EvalError::new(format!("int overflow in `{op}`"))
}

/// Equality as CEL has it: numbers compare across int and double; values
/// of different types are not equal.
pub fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Int(x), Value::Float(y)) | (Value::Float(y), Value::Int(x)) => (*x as f64) == *y,
        (Value::Float(x), Value::Float(y)) => x == y,
        (Value::List(x), Value::List(y)) => x.len() == y.len() && x.iter().zip(y.iter()).all(|(a, b)| equal(a, b)),
        _ => a == b,
    }
}

/// Ordering of numbers (across int and double), strings and bools.
pub fn order(a: &Value, b: &Value, op: &str) -> Result<std::cmp::Ordering, EvalError> {
    let ord = match (a, b) {
        (Value::Int(x), Value::Int(y)) => Some(x.cmp(y)),
        (Value::Float(x), Value::Float(y)) => x.partial_cmp(y),
        (Value::Int(x), Value::Float(y)) => (*x as f64).partial_cmp(y),
        (Value::Float(x), Value::Int(y)) => x.partial_cmp(&(*y as f64)),
        (Value::Str(x), Value::Str(y)) => Some(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        _ => None,
    };
    ord.ok_or_else(|| no_overload(op, a, b))
}

fn index(a: &Value, b: &Value) -> Result<Value, EvalError> {
    match (a, b) {
        (Value::List(items), Value::Int(i)) => usize::try_from(*i)
            .ok()
            .and_then(|i| items.get(i))
            .cloned()
            .map_or_else(|| fail(format!("index {i} out of a list of {}", items.len())), Ok),
        (Value::Map(m), Value::Str(k)) => match m.iter().find(|(key, _)| **key == ***k) {
            Some((_, v)) => Ok(v.clone()),
            None => fail(format!("no key \"{k}\" in {a}")),
        },
        _ => Err(no_overload("[]", a, b)),
    }
}

fn to_int(v: Value) -> Result<Value, EvalError> {
    match v {
        Value::Int(i) => Ok(Value::Int(i)),
        Value::Float(f) if (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&f) => {
            Ok(Value::Int(f as i64))
        }
        Value::Str(s) => {
            s.trim().parse::<i64>().map(Value::Int).or_else(|_| fail(format!("int(\"{s}\"): not an integer")))
        }
        Value::Bool(b) => Ok(Value::Int(i64::from(b))),
        other => fail(format!("int() of {} ({})", other, other.type_name())),
    }
}

/// The candidate nearest to `word` by edit distance, if near enough to be
/// what was meant.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|c| (distance(word, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance, in characters.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row.first().copied().unwrap_or(0);
        if let Some(first) = row.first_mut() {
            *first = i + 1;
        }
        for (j, cb) in b.iter().enumerate() {
            let cur = row.get(j + 1).copied().unwrap_or(0);
            let left = row.get(j).copied().unwrap_or(0);
            let best = (prev + usize::from(ca != *cb)).min(cur + 1).min(left + 1);
            if let Some(slot) = row.get_mut(j + 1) {
                *slot = best;
            }
            prev = cur;
        }
    }
    row.last().copied().unwrap_or(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;

    const AT: Origin = Origin { pos: Pos { line: 3, column: 13 }, quoted: true };

    fn schema() -> Schema {
        Schema::of(["user", "amount", "kind", "price"])
    }

    fn row() -> Row {
        Row::new([Value::str("ann"), Value::Int(7), Value::str("click"), Value::Float(2.5)])
    }

    fn eval(text: &str) -> Result<Value, String> {
        let e = compile(text, &schema(), AT).map_err(|d| format!("{d:?}"))?;
        e.eval(&row()).map_err(|e| e.to_string())
    }

    #[test]
    fn expressions_evaluate() {
        assert_eq!(eval("event.kind == 'click' && event.amount > 0"), Ok(Value::Bool(true)));
        assert_eq!(eval("event.amount * 3 + 1"), Ok(Value::Int(22)));
        assert_eq!(eval("(event.amount * 3 + 1) % 2 == 0"), Ok(Value::Bool(true)));
        assert_eq!(eval("event.price * 2.0"), Ok(Value::Float(5.0)));
        assert_eq!(eval("event.amount > 2.5 ? 'big' : 'small'"), Ok(Value::str("big")));
        assert_eq!(eval("event.user + '!'"), Ok(Value::str("ann!")));
        assert_eq!(eval("size(event.user) + event.user.size()"), Ok(Value::Int(6)));
        assert_eq!(eval("event.kind in ['click', 'view']"), Ok(Value::Bool(true)));
        assert_eq!(eval("{'a': event.amount}.a"), Ok(Value::Int(7)));
        assert_eq!(eval("has(event.user) && event.user.startsWith('a')"), Ok(Value::Bool(true)));
        assert_eq!(eval("int(event.price) + int('3')"), Ok(Value::Int(5)));
        assert_eq!(eval("string(event.amount)"), Ok(Value::str("7")));
        assert_eq!(eval("event.amount == 7.0"), Ok(Value::Bool(true)));
        assert_eq!(eval("1 + 2"), Ok(Value::Int(3)));
    }

    #[test]
    fn evaluation_errors_name_what_went_wrong() {
        assert_eq!(eval("event.amount / 0"), Err("division by zero".into()));
        assert_eq!(eval("event.amount + 1.5"), Err("no `+` for int and double (7 + 1.5)".into()));
        assert_eq!(eval("9223372036854775807 + event.amount"), Err("int overflow in `+`".into()));
        assert_eq!(eval("event.user && true"), Err("`&&` on ann (string), not a bool".into()));
        let open = compile("event.missing > 1", &Schema::open(), AT).map_err(|d| format!("{d:?}"));
        let map = Row::new([Value::Map(Arc::new(vec![(Arc::from("x"), Value::Int(1))]))]);
        assert_eq!(open.map(|e| e.eval(&map)).ok(), Some(Err(EvalError::new("no field `missing` in {\"x\":1}"))));
    }

    #[test]
    fn compile_errors_have_positions() {
        let errors = compile("event.amout > 0 && event.kind == 'x'", &schema(), AT).err().unwrap_or_default();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].pos, Pos { line: 3, column: 14 });
        assert_eq!(errors[0].message, "no field `amout` in the records of this step");
        assert_eq!(
            errors[0].help.as_deref(),
            Some("did you mean `event.amount`? The records here have: user, amount, kind, price")
        );
        let errors = compile("sise(event.user) > 1 && amount > 1", &schema(), AT).err().unwrap_or_default();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(
            (errors[0].pos, errors[0].message.as_str()),
            (Pos { line: 3, column: 14 }, "unknown function `sise`")
        );
        assert_eq!((errors[1].pos, errors[1].message.as_str()), (Pos { line: 3, column: 38 }, "unknown name `amount`"));
        let errors = compile("event.amount >", &schema(), AT).err().unwrap_or_default();
        assert!(errors[0].message.starts_with("the expression `event.amount >` does not parse"), "{errors:?}");
        assert_eq!(errors[0].pos.line, 3);
    }

    #[test]
    fn hostile_expressions_are_errors() {
        let deep = format!("{}1{}", "(".repeat(100), ")".repeat(100));
        let errors = compile(&deep, &schema(), AT).err().unwrap_or_default();
        assert_eq!(
            (errors[0].pos, errors[0].message.as_str()),
            (Pos { line: 3, column: 46 }, "the expression nests deeper than 32 brackets")
        );
        let long = vec!["event.amount"; 2_000].join(" + ");
        assert!(compile(&long, &schema(), AT).is_err_and(|e| e[0].message.contains("at most 4096")));
        // The longest chain that fits evaluates (the evaluation recurses once per operator).
        let chain = vec!["1"; MAX_LENGTH / 4].join(" + ");
        let e = compile(&chain, &schema(), AT).map_err(|d| format!("{d:?}"));
        assert_eq!(e.and_then(|e| e.eval(&row()).map_err(|e| e.to_string())), Ok(Value::Int((MAX_LENGTH / 4) as i64)));
        let chain = vec!["event.amount"; MAX_LENGTH / 20].join(" * 1 + ");
        let e = compile(&chain, &schema(), AT).map_err(|d| format!("{d:?}"));
        assert_eq!(
            e.and_then(|e| e.eval(&row()).map_err(|e| e.to_string())),
            Ok(Value::Int(7 * (MAX_LENGTH / 20) as i64))
        );
    }

    #[test]
    fn suggestions() {
        assert_eq!(closest("amout", ["user", "amount"]), Some("amount"));
        assert_eq!(closest("zzz", ["user", "amount"]), None);
    }
}
