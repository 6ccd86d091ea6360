//! The stateless steps of a pipeline (a generator's fields, `map`,
//! `filter`, a `key_by`'s key) run over whole batches, their expressions a
//! column at a time: a field read once per batch into a column of ints,
//! an operator computed over the column in one loop, a filter narrowing
//! the batch before the next step reads it. Consecutive steps run as one
//! [`Chain`], in one operator, and records are built only at its end.
//!
//! What the columns do is what [`Expr::eval`] does record by record, the
//! same values and the same errors (the first of each record, in the order
//! the record-by-record evaluation meets them): operators over ints loop
//! over the column; anything else (strings, maps, function calls, mixed
//! types, a value that overflows) falls back to the record-by-record
//! operator for the records it concerns. `tests/yaml_vector.rs` checks
//! both against each other on random records.

use std::borrow::Cow;

use weibo::BatchOutput;

use super::expr::{BinKind, EvalError, Expr, VExpr, negate, truth};
use super::value::{Row, Value};

/// A column: one value per position of a frame (or of a subset of it).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Col {
    Int(Vec<i64>),
    Bool(Vec<bool>),
    Any(Vec<Value>),
}

impl Col {
    /// The value at `j` (null past the end).
    fn get(&self, j: usize) -> Value {
        match self {
            Col::Int(v) => v.get(j).map_or(Value::Null, |x| Value::Int(*x)),
            Col::Bool(v) => v.get(j).map_or(Value::Null, |x| Value::Bool(*x)),
            Col::Any(v) => v.get(j).cloned().unwrap_or_default(),
        }
    }

    /// The value at `j`, borrowed when the column holds values (null past
    /// the end).
    #[inline]
    fn at(&self, j: usize) -> Cow<'_, Value> {
        match self {
            Col::Any(v) => v.get(j).map_or(Cow::Owned(Value::Null), Cow::Borrowed),
            other => Cow::Owned(other.get(j)),
        }
    }

    /// `values` as the narrowest column that holds them.
    fn of(values: Vec<Value>) -> Col {
        if values.iter().all(|v| matches!(v, Value::Int(_))) {
            return Col::Int(values.iter().map(|v| if let Value::Int(x) = v { *x } else { 0 }).collect());
        }
        if values.iter().all(|v| matches!(v, Value::Bool(_))) {
            return Col::Bool(values.iter().map(|v| matches!(v, Value::Bool(true))).collect());
        }
        Col::Any(values)
    }

    /// `len` copies of `v`.
    fn repeat(v: &Value, len: usize) -> Col {
        match v {
            Value::Int(x) => Col::Int(vec![*x; len]),
            Value::Bool(b) => Col::Bool(vec![*b; len]),
            other => Col::Any(vec![other.clone(); len]),
        }
    }

    /// The values at `positions`.
    fn gather(&self, positions: &[usize]) -> Col {
        match self {
            Col::Int(v) => Col::Int(positions.iter().map(|&p| v.get(p).copied().unwrap_or_default()).collect()),
            Col::Bool(v) => Col::Bool(positions.iter().map(|&p| v.get(p).copied().unwrap_or_default()).collect()),
            Col::Any(v) => Col::Any(positions.iter().map(|&p| v.get(p).cloned().unwrap_or_default()).collect()),
        }
    }

    /// The values where `keep` is true.
    fn retain(&mut self, keep: &[bool]) {
        fn by<T>(v: &mut Vec<T>, keep: &[bool]) {
            let mut k = keep.iter();
            v.retain(|_| k.next().copied().unwrap_or(false));
        }
        match self {
            Col::Int(v) => by(v, keep),
            Col::Bool(v) => by(v, keep),
            Col::Any(v) => by(v, keep),
        }
    }

    /// Whether the value at `j` is true, for operator `op`.
    fn truth_at(&self, j: usize, op: &str) -> Result<bool, EvalError> {
        match self {
            Col::Bool(v) => Ok(v.get(j).copied().unwrap_or(false)),
            other => truth(other.get(j), op),
        }
    }
}

/// The first error of each position of a frame.
pub(crate) struct Errs {
    at: Vec<Option<EvalError>>,
    n: usize,
    count: usize,
}

impl Errs {
    fn new(n: usize) -> Errs {
        Errs { at: Vec::new(), n, count: 0 }
    }

    /// Records `e` at `p`, unless `p` already failed.
    fn set(&mut self, p: usize, e: EvalError) {
        if self.at.is_empty() {
            self.at.resize_with(self.n, || None);
        }
        if let Some(slot) = self.at.get_mut(p)
            && slot.is_none()
        {
            *slot = Some(e);
            self.count += 1;
        }
    }

    fn has(&self, p: usize) -> bool {
        self.at.get(p).is_some_and(Option::is_some)
    }
}

/// The records a chain starts from.
#[derive(Clone, Copy)]
pub(crate) enum Base<'a> {
    /// Rows.
    Rows(&'a [Row]),
    /// A generator's indexes (the one field `i`).
    Index(&'a [u64]),
}

/// The records of a batch at a step of a chain, as columns: the
/// positions still in it (`sel`, each a record of the batch) and their
/// fields, read from the base when first needed until a step computes new
/// ones.
pub(crate) struct Frame<'a> {
    n: usize,
    base: Base<'a>,
    sel: Vec<usize>,
    /// Whether the fields are still the base's.
    from_base: bool,
    cols: Vec<Option<Col>>,
    /// Fields appended after the record's own (a key).
    extra: Vec<Col>,
    /// The records as rows, for the expressions evaluated record by record
    /// (built when first needed, when they are not the base's).
    rows: Option<Vec<Row>>,
}

impl<'a> Frame<'a> {
    fn new(base: Base<'a>, width: usize) -> Frame<'a> {
        let n = match base {
            Base::Rows(r) => r.len(),
            Base::Index(i) => i.len(),
        };
        Frame {
            n,
            base,
            sel: (0..n).collect(),
            from_base: true,
            cols: vec![None; width],
            extra: Vec::new(),
            rows: None,
        }
    }

    /// Field `i`'s column.
    fn col(&mut self, i: usize) -> &Col {
        if self.cols.len() <= i {
            self.cols.resize(i + 1, None);
        }
        let (n, from_base, base) = (self.n, self.from_base, self.base);
        let sel = &self.sel;
        let Some(slot) = self.cols.get_mut(i) else {
            return &NO_COLUMN;
        };
        slot.get_or_insert_with(|| {
            if !from_base {
                return Col::repeat(&Value::Null, n);
            }
            match base {
                // All of the batch still (the positions only ever shrink).
                Base::Index(idx) if i == 0 && sel.len() == idx.len() => {
                    Col::Int(idx.iter().map(|&x| i64::try_from(x).unwrap_or(i64::MAX)).collect())
                }
                Base::Index(idx) if i == 0 => Col::Int(
                    sel.iter().map(|&s| idx.get(s).map_or(0, |x| i64::try_from(*x).unwrap_or(i64::MAX))).collect(),
                ),
                Base::Index(_) => Col::repeat(&Value::Null, n),
                Base::Rows(rows) => {
                    let field = |s: usize| rows.get(s).map_or(&Value::Null, |r| r.field(i));
                    let mut ints = Vec::with_capacity(n);
                    for &s in sel {
                        match field(s) {
                            Value::Int(x) => ints.push(*x),
                            _ => break,
                        }
                    }
                    if ints.len() == n {
                        Col::Int(ints)
                    } else {
                        Col::Any(sel.iter().map(|&s| field(s).clone()).collect())
                    }
                }
            }
        })
    }

    /// The record at position `p`, as a row.
    fn row(&mut self, p: usize) -> Row {
        if self.from_base
            && let Base::Rows(rows) = self.base
        {
            return self.sel.get(p).and_then(|&s| rows.get(s)).cloned().unwrap_or_default();
        }
        self.materialize();
        self.rows.as_ref().and_then(|r| r.get(p)).cloned().unwrap_or_default()
    }

    /// Builds the records as rows (`rows`) from the fields, once.
    fn materialize(&mut self) {
        if self.rows.is_none() {
            let width = self.cols.len();
            for i in 0..width {
                self.col(i);
            }
            let rows = (0..self.n)
                .map(|j| Row(self.cols.iter().map(|c| c.as_ref().map_or(Value::Null, |c| c.get(j))).collect()))
                .collect();
            self.rows = Some(rows);
        }
    }

    /// New fields, one column each.
    fn set(&mut self, cols: Vec<Col>) {
        self.cols = cols.into_iter().map(Some).collect();
        self.from_base = false;
        self.rows = None;
    }

    /// Keeps the positions where `keep` is true.
    fn retain(&mut self, keep: &[bool]) {
        let mut k = keep.iter();
        self.sel.retain(|_| k.next().copied().unwrap_or(false));
        for c in self.cols.iter_mut().flatten() {
            c.retain(keep);
        }
        for c in &mut self.extra {
            c.retain(keep);
        }
        self.n = self.sel.len();
        self.rows = None;
    }

    /// The records, with the appended fields: each row written once,
    /// whole (a pass per column over the rows would write each row's
    /// memory again per field).
    fn build_all(&mut self) -> Vec<Row> {
        let own = if self.from_base { 0 } else { self.cols.len() };
        let null = Col::Any(Vec::new());
        let cols: Vec<&Col> =
            self.cols.iter().take(own).map(|c| c.as_ref().unwrap_or(&null)).chain(&self.extra).collect();
        let mut rows = Vec::with_capacity(self.n);
        if self.from_base {
            for j in 0..self.n {
                let mut row = self.row(j);
                row.0.extend(self.extra.iter().map(|c| c.get(j)));
                rows.push(row);
            }
            return rows;
        }
        match cols.as_slice() {
            [Col::Int(xs)] => rows.extend(xs.iter().map(|&x| Row(smallvec::smallvec![Value::Int(x)]))),
            _ => rows.extend((0..self.n).map(|j| Row(cols.iter().map(|c| c.get(j)).collect()))),
        }
        rows
    }
}

/// What `Frame::col` gives past the frame's fields (never: it makes room
/// for the field first).
static NO_COLUMN: Col = Col::Any(Vec::new());

/// The position of the `j`-th value of a column over `pos` (all of the
/// frame when `None`).
#[inline]
fn at(pos: Option<&[usize]>, j: usize) -> usize {
    pos.map_or(j, |p| p.get(j).copied().unwrap_or(usize::MAX))
}

/// Evaluates `e` over the positions `pos` of `f` (all when `None`): one
/// value per position, a placeholder where it failed (the error is in
/// `errs`).
pub(crate) fn eval(e: &VExpr, f: &mut Frame<'_>, pos: Option<&[usize]>, errs: &mut Errs) -> Col {
    let len = pos.map_or(f.n, <[usize]>::len);
    match e {
        VExpr::Const(v) => Col::repeat(v, len),
        VExpr::Field(i) => match pos {
            None => f.col(*i).clone(),
            Some(p) => f.col(*i).gather(p),
        },
        VExpr::Bin(kind, a, b) => {
            // A field and a constant: over the field's column, not a copy.
            if let (None, VExpr::Field(i), VExpr::Const(Value::Int(k))) = (pos, &**a, &**b)
                && let Col::Int(xs) = f.col(*i)
            {
                let xs: &[i64] = xs;
                return ints(*kind, xs, Ints::Const(*k), pos, errs);
            }
            let x = match (eval(a, f, pos, errs), &**b) {
                (Col::Int(xs), VExpr::Const(Value::Int(k))) => return ints_in_place(*kind, xs, *k, pos, errs),
                (x, _) => x,
            };
            if let (Col::Int(xs), VExpr::Const(Value::Int(k))) = (&x, &**b) {
                return ints(*kind, xs, Ints::Const(*k), pos, errs);
            }
            let y = eval(b, f, pos, errs);
            match (&x, &y) {
                (Col::Int(xs), Col::Int(ys)) => ints(*kind, xs, Ints::Col(ys), pos, errs),
                _ => {
                    let values = (0..len)
                        .map(|j| {
                            let p = at(pos, j);
                            if errs.has(p) {
                                return Value::Null;
                            }
                            kind.any(&x.at(j), &y.at(j)).unwrap_or_else(|e| {
                                errs.set(p, e);
                                Value::Null
                            })
                        })
                        .collect();
                    Col::of(values)
                }
            }
        }
        VExpr::And(a, b) => logic(a, b, true, f, pos, errs),
        VExpr::Or(a, b) => logic(a, b, false, f, pos, errs),
        VExpr::Not(a) => {
            let x = eval(a, f, pos, errs);
            let out = (0..len)
                .map(|j| {
                    let p = at(pos, j);
                    if errs.has(p) {
                        return false;
                    }
                    x.truth_at(j, "!").map(|b| !b).unwrap_or_else(|e| {
                        errs.set(p, e);
                        false
                    })
                })
                .collect();
            Col::Bool(out)
        }
        VExpr::Neg(a) => {
            let x = eval(a, f, pos, errs);
            let values = (0..len)
                .map(|j| {
                    let p = at(pos, j);
                    if errs.has(p) {
                        return Value::Null;
                    }
                    negate(x.get(j)).unwrap_or_else(|e| {
                        errs.set(p, e);
                        Value::Null
                    })
                })
                .collect();
            Col::of(values)
        }
        VExpr::Cond(c, a, b) => {
            let x = eval(c, f, pos, errs);
            let (mut yes, mut no) = (Vec::new(), Vec::new());
            // Per value: which side, and where in that side's column.
            let mut side: Vec<Option<(bool, usize)>> = Vec::with_capacity(len);
            for j in 0..len {
                let p = at(pos, j);
                if errs.has(p) {
                    side.push(None);
                    continue;
                }
                match x.truth_at(j, "?:") {
                    Ok(true) => {
                        side.push(Some((true, yes.len())));
                        yes.push(p);
                    }
                    Ok(false) => {
                        side.push(Some((false, no.len())));
                        no.push(p);
                    }
                    Err(e) => {
                        errs.set(p, e);
                        side.push(None);
                    }
                }
            }
            let ya = if yes.is_empty() { Col::Any(Vec::new()) } else { eval(a, f, Some(&yes), errs) };
            let yb = if no.is_empty() { Col::Any(Vec::new()) } else { eval(b, f, Some(&no), errs) };
            let values = side
                .iter()
                .map(|s| match s {
                    Some((true, k)) => ya.get(*k),
                    Some((false, k)) => yb.get(*k),
                    None => Value::Null,
                })
                .collect();
            Col::of(values)
        }
        VExpr::Scalar(g) => {
            // Each record's row: the base's, borrowed, while the fields are
            // its; otherwise built once for the frame.
            let rows: &[Row] = match f.base {
                Base::Rows(rows) if f.from_base => rows,
                _ => {
                    f.materialize();
                    f.rows.as_deref().unwrap_or_default()
                }
            };
            let by_base = f.from_base && matches!(f.base, Base::Rows(_));
            let values = (0..len)
                .map(|j| {
                    let p = at(pos, j);
                    let row = if by_base { f.sel.get(p).and_then(|&s| rows.get(s)) } else { rows.get(p) };
                    match row {
                        Some(row) if !errs.has(p) => g(row).unwrap_or_else(|e| {
                            errs.set(p, e);
                            Value::Null
                        }),
                        _ => Value::Null,
                    }
                })
                .collect();
            Col::of(values)
        }
    }
}

/// `&&` (`and`) or `||`: the right side only where the left does not
/// decide.
fn logic(a: &VExpr, b: &VExpr, and: bool, f: &mut Frame<'_>, pos: Option<&[usize]>, errs: &mut Errs) -> Col {
    let op = if and { "&&" } else { "||" };
    let len = pos.map_or(f.n, <[usize]>::len);
    let x = eval(a, f, pos, errs);
    let mut out = vec![false; len];
    let (mut rest, mut rest_at) = (Vec::new(), Vec::new());
    for (j, o) in out.iter_mut().enumerate() {
        let p = at(pos, j);
        if errs.has(p) {
            continue;
        }
        match x.truth_at(j, op) {
            Ok(l) if l == and => {
                rest.push(p);
                rest_at.push(j);
            }
            Ok(l) => *o = l,
            Err(e) => errs.set(p, e),
        }
    }
    if !rest.is_empty() {
        let y = eval(b, f, Some(&rest), errs);
        for (k, (&p, &j)) in rest.iter().zip(&rest_at).enumerate() {
            if errs.has(p) {
                continue;
            }
            match y.truth_at(k, op) {
                Ok(r) => {
                    if let Some(o) = out.get_mut(j) {
                        *o = r;
                    }
                }
                Err(e) => errs.set(p, e),
            }
        }
    }
    Col::Bool(out)
}

/// The right operand of an int operator: a column or a constant.
#[derive(Clone, Copy)]
enum Ints<'a> {
    Col(&'a [i64]),
    Const(i64),
}

/// `kind` over two int columns (or a column and a constant), in one loop;
/// the values that overflow or divide by zero are then failed one by one,
/// with the record-by-record operator's error.
fn ints(kind: BinKind, xs: &[i64], ys: Ints<'_>, pos: Option<&[usize]>, errs: &mut Errs) -> Col {
    if kind.compares() {
        // One loop per comparison, each inlined (and vectorised).
        fn compare(xs: &[i64], ys: Ints<'_>, cmp: impl Fn(i64, i64) -> bool) -> Vec<bool> {
            match ys {
                Ints::Const(k) => xs.iter().map(|&x| cmp(x, k)).collect(),
                Ints::Col(ys) => xs.iter().zip(ys).map(|(&x, &y)| cmp(x, y)).collect(),
            }
        }
        return Col::Bool(match kind {
            BinKind::Eq => compare(xs, ys, |a, b| a == b),
            BinKind::Ne => compare(xs, ys, |a, b| a != b),
            BinKind::Lt => compare(xs, ys, |a, b| a < b),
            BinKind::Le => compare(xs, ys, |a, b| a <= b),
            BinKind::Gt => compare(xs, ys, |a, b| a > b),
            _ => compare(xs, ys, |a, b| a >= b),
        });
    }
    // Wrapping results, and whether any went wrong.
    let (values, bad) = match (kind, ys) {
        (BinKind::Add, Ints::Const(k)) => wrap(xs.iter().map(|&x| x.overflowing_add(k))),
        (BinKind::Add, Ints::Col(ys)) => wrap(xs.iter().zip(ys).map(|(&x, &y)| x.overflowing_add(y))),
        (BinKind::Sub, Ints::Const(k)) => wrap(xs.iter().map(|&x| x.overflowing_sub(k))),
        (BinKind::Sub, Ints::Col(ys)) => wrap(xs.iter().zip(ys).map(|(&x, &y)| x.overflowing_sub(y))),
        (BinKind::Mul, Ints::Const(k)) => wrap(xs.iter().map(|&x| x.overflowing_mul(k))),
        (BinKind::Mul, Ints::Col(ys)) => wrap(xs.iter().zip(ys).map(|(&x, &y)| x.overflowing_mul(y))),
        // A constant divisor other than 0 and -1 cannot fail; a positive
        // one divides a column of non-negative ints by a multiplication.
        (BinKind::Div | BinKind::Rem, Ints::Const(k)) if k != 0 && k != -1 => {
            let div = kind == BinKind::Div;
            let values = match Divider::new(k) {
                Some(d) if xs.iter().copied().min().unwrap_or(0) >= 0 => d.apply(xs, div),
                _ if div => xs.iter().map(|&x| x / k).collect(),
                _ => xs.iter().map(|&x| x % k).collect(),
            };
            (values, false)
        }
        (BinKind::Div | BinKind::Rem, _) => {
            let div = kind == BinKind::Div;
            let y_at = |j: usize| match ys {
                Ints::Const(k) => k,
                Ints::Col(ys) => ys.get(j).copied().unwrap_or(1),
            };
            wrap(xs.iter().enumerate().map(|(j, &x)| {
                let y = y_at(j);
                if y == 0 || (x == i64::MIN && y == -1) {
                    (0, true)
                } else if div {
                    (x / y, false)
                } else {
                    (x % y, false)
                }
            }))
        }
        _ => (Vec::new(), true),
    };
    if bad {
        let y_at = |j: usize| match ys {
            Ints::Const(k) => k,
            Ints::Col(ys) => ys.get(j).copied().unwrap_or_default(),
        };
        let values: Vec<Value> = xs
            .iter()
            .enumerate()
            .map(|(j, &x)| {
                let p = at(pos, j);
                if errs.has(p) {
                    return Value::Null;
                }
                kind.ints(x, y_at(j)).unwrap_or_else(|e| {
                    errs.set(p, e);
                    Value::Null
                })
            })
            .collect();
        return Col::of(values);
    }
    Col::Int(values)
}

/// `e` over all of `f`, for an expression [`Chain::prune`] proved cannot
/// fail (ints of known ranges whose results fit, compared): each operator
/// one loop without an overflow check, in one column's memory. `None`
/// where a column is not ints after all (for [`eval`] to compute).
fn eval_unchecked(e: &VExpr, f: &mut Frame<'_>) -> Option<Col> {
    let int_col = |c: Col| match c {
        Col::Int(v) => Some(v),
        _ => None,
    };
    match e {
        VExpr::Const(Value::Int(k)) => Some(Col::Int(vec![*k; f.n])),
        VExpr::Field(i) => match f.col(*i) {
            Col::Int(v) => Some(Col::Int(v.clone())),
            _ => None,
        },
        VExpr::Bin(kind, a, b) => {
            let mut xs = int_col(eval_unchecked(a, f)?)?;
            if let VExpr::Const(Value::Int(k)) = &**b {
                let k = *k;
                match kind {
                    BinKind::Add => xs.iter_mut().for_each(|x| *x = x.wrapping_add(k)),
                    BinKind::Sub => xs.iter_mut().for_each(|x| *x = x.wrapping_sub(k)),
                    BinKind::Mul => xs.iter_mut().for_each(|x| *x = x.wrapping_mul(k)),
                    BinKind::Div | BinKind::Rem => Divider::new(k)?.apply_in_place(&mut xs, *kind == BinKind::Div),
                    // A comparison cannot fail.
                    _ => return Some(ints(*kind, &xs, Ints::Const(k), None, &mut Errs::new(0))),
                }
                return Some(Col::Int(xs));
            }
            let ys = int_col(eval_unchecked(b, f)?)?;
            let pairs = xs.iter_mut().zip(&ys);
            match kind {
                BinKind::Add => pairs.for_each(|(x, y)| *x = x.wrapping_add(*y)),
                BinKind::Sub => pairs.for_each(|(x, y)| *x = x.wrapping_sub(*y)),
                BinKind::Mul => pairs.for_each(|(x, y)| *x = x.wrapping_mul(*y)),
                BinKind::Div | BinKind::Rem => return None,
                _ => return Some(ints(*kind, &xs, Ints::Col(&ys), None, &mut Errs::new(0))),
            }
            Some(Col::Int(xs))
        }
        _ => None,
    }
}

/// `kind` over a column of ints computed for it and a constant: in the
/// column's own memory where the operator allows (`+`, `-`, and `/` or `%`
/// by a positive constant), else as [`ints`].
fn ints_in_place(kind: BinKind, mut xs: Vec<i64>, k: i64, pos: Option<&[usize]>, errs: &mut Errs) -> Col {
    match kind {
        BinKind::Add | BinKind::Sub => {
            let add = kind == BinKind::Add;
            let mut bad = false;
            for x in &mut xs {
                let (v, o) = if add { x.overflowing_add(k) } else { x.overflowing_sub(k) };
                *x = v;
                bad |= o;
            }
            if !bad {
                return Col::Int(xs);
            }
            // Back to the operands (wrapping operations undo exactly), for
            // the failures one by one.
            for x in &mut xs {
                *x = if add { x.wrapping_sub(k) } else { x.wrapping_add(k) };
            }
            ints(kind, &xs, Ints::Const(k), pos, errs)
        }
        BinKind::Div | BinKind::Rem if xs.iter().copied().min().unwrap_or(0) >= 0 => match Divider::new(k) {
            Some(d) => {
                d.apply_in_place(&mut xs, kind == BinKind::Div);
                Col::Int(xs)
            }
            None => ints(kind, &xs, Ints::Const(k), pos, errs),
        },
        _ => ints(kind, &xs, Ints::Const(k), pos, errs),
    }
}

/// Division of non-negative ints by a positive constant `d` without a
/// division: a shift and a mask for a power of two; otherwise a
/// multiplication and a shift (Granlund and Montgomery's method for
/// 63-bit numerators): `m = floor(2^(63 + l) / d) + 1` with
/// `l = ceil(log2 d)`, and `x / d = floor(x * m / 2^(63 + l))` for every
/// `0 <= x < 2^63`. For a column whose ints are all below `2^31`, and
/// `d < 2^31`, the same method for 31-bit numerators, whose `m` fits 32
/// bits: two 32-by-32-bit multiplications per int, which vectorise.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Divider {
    d: i64,
    how: Divide,
    /// `m` and the shift for numerators below `2^31`.
    small: Option<(u32, u32)>,
}

#[derive(Clone, Copy, Debug)]
enum Divide {
    /// `d = 2^k`.
    Shift(u32),
    /// `m` fits 64 bits.
    Narrow(u64, u32),
    Wide(u128, u32),
}

impl Divider {
    /// The divider by `d`, when `d` is positive.
    pub(crate) fn new(d: i64) -> Option<Divider> {
        let unsigned = u64::try_from(d).ok().filter(|&d| d > 0)?;
        if unsigned.is_power_of_two() {
            return Some(Divider { d, how: Divide::Shift(unsigned.trailing_zeros()), small: None });
        }
        let l = 64 - (unsigned - 1).leading_zeros();
        let shift = 63 + l;
        let m = (1u128 << shift) / u128::from(unsigned) + 1;
        let how = match u64::try_from(m) {
            Ok(m) => Divide::Narrow(m, shift),
            Err(_) => Divide::Wide(m, shift),
        };
        // `2^(l-1) < d < 2^l <= 2^31`, so `2^31 < m < 2^32`.
        let small = (unsigned < 1 << 31)
            .then(|| u32::try_from((1u64 << (31 + l)) / unsigned + 1).ok().map(|m| (m, 31 + l)))
            .flatten();
        Some(Divider { d, how, small })
    }

    /// `x / d` (`div`) or `x % d` of each `x >= 0` of `xs`.
    pub(crate) fn apply(self, xs: &[i64], div: bool) -> Vec<i64> {
        let mut out = xs.to_vec();
        self.apply_in_place(&mut out, div);
        out
    }

    /// [`Divider::apply`], in `xs`'s memory.
    pub(crate) fn apply_in_place(self, xs: &mut [i64], div: bool) {
        let d = self.d;
        if let Some((m, s)) = self.small
            && xs.iter().copied().max().unwrap_or(0) < 1 << 31
        {
            // Each `x` below 2^31 and `d` below 2^31: `x * m` below 2^63,
            // the quotient below 2^31, `q * d` at most `x`.
            let (m, d32) = (u64::from(m), d as u32 as u64);
            let quotient = |x: i64| ((x as u32 as u64) * m) >> s;
            if div {
                xs.iter_mut().for_each(|x| *x = quotient(*x) as i64);
            } else {
                xs.iter_mut().for_each(|x| *x -= ((quotient(*x) as u32 as u64) * d32) as i64);
            }
            return;
        }
        match (self.how, div) {
            (Divide::Shift(k), true) => xs.iter_mut().for_each(|x| *x >>= k),
            (Divide::Shift(_), false) => xs.iter_mut().for_each(|x| *x &= d - 1),
            (Divide::Narrow(m, s), true) => {
                xs.iter_mut().for_each(|x| *x = ((*x as u128 * u128::from(m)) >> s) as i64);
            }
            (Divide::Narrow(m, s), false) => {
                xs.iter_mut().for_each(|x| *x -= ((*x as u128 * u128::from(m)) >> s) as i64 * d);
            }
            (Divide::Wide(m, s), true) => xs.iter_mut().for_each(|x| *x = ((*x as u128 * m) >> s) as i64),
            (Divide::Wide(m, s), false) => xs.iter_mut().for_each(|x| *x -= ((*x as u128 * m) >> s) as i64 * d),
        }
    }
}

/// Wrapping results and whether any overflowed.
#[inline]
fn wrap(results: impl Iterator<Item = (i64, bool)>) -> (Vec<i64>, bool) {
    let mut bad = false;
    let values = results
        .map(|(v, o)| {
            bad |= o;
            v
        })
        .collect();
    (values, bad)
}

/// `e` over each of `rows`, a column at a time: what [`Expr::eval`] gives
/// for each row.
pub(crate) fn column(e: &Expr, rows: &[Row]) -> Vec<Result<Value, EvalError>> {
    let mut f = Frame::new(Base::Rows(rows), 0);
    let mut errs = Errs::new(rows.len());
    let col = eval(e.vector(), &mut f, None, &mut errs);
    let mut failed = std::mem::take(&mut errs.at).into_iter();
    (0..rows.len())
        .map(|j| match failed.next().flatten() {
            Some(e) => Err(e),
            None => Ok(col.get(j)),
        })
        .collect()
}

/// What a step of a chain does.
#[derive(Clone, Debug)]
pub(crate) enum Stage {
    /// Records of new fields.
    Map(Vec<Expr>),
    /// Keeps the records the expression holds for.
    Filter(Expr),
    /// Checks that field `field` (named `name`) is an event time.
    Time(usize, String),
    /// Appends the key.
    Key(Expr),
}

/// Consecutive stateless steps, run over a batch: each record goes
/// through them in turn, and the records that come out are built at the
/// end.
#[derive(Clone, Debug)]
pub(crate) struct Chain {
    /// The fields of the records that come in.
    pub(crate) width: usize,
    /// The steps, each with its name.
    pub(crate) stages: Vec<(String, Stage)>,
    /// The greatest index, when the records are a generator's indexes
    /// (`Base::Index`) of a bounded generator.
    pub(crate) index_bound: Option<i64>,
    /// Per step, the fields of a `map` that nothing reads and that cannot
    /// fail, left uncomputed (see [`Chain::prune`]).
    skip: Vec<Vec<bool>>,
    /// Per step, its expressions that cannot fail, computed without
    /// overflow checks (see [`Chain::prune`]).
    unchecked: Vec<Vec<bool>>,
}

impl Chain {
    /// A chain over records of `width` fields, of no steps yet.
    pub(crate) fn new(width: usize) -> Chain {
        Chain { width, stages: Vec::new(), index_bound: None, skip: Vec::new(), unchecked: Vec::new() }
    }

    /// Plans the chain from the ranges of its ints (known from a bounded
    /// generator's indexes on): marks the fields of each `map` that no
    /// later step reads and that are not in the records that come out,
    /// when computing them cannot fail (a field, a constant, int
    /// operators whose results fit), to be left uncomputed as a compiler
    /// drops a dead store (a field that may fail is computed, for its
    /// failure); and marks the expressions that cannot fail, to be
    /// computed without overflow checks.
    pub(crate) fn prune(&mut self) {
        // Forward: the ranges of the fields, where they are known ints.
        let mut ranges: Vec<Option<(i128, i128)>> = match self.index_bound {
            Some(bound) => vec![Some((0, i128::from(bound)))],
            None => vec![None; self.width],
        };
        let mut at_stage = Vec::with_capacity(self.stages.len());
        let mut unchecked = Vec::with_capacity(self.stages.len());
        for (_, stage) in &self.stages {
            at_stage.push(ranges.clone());
            let known = |i: usize| ranges.get(i).copied().flatten();
            // An int of a known range, or a comparison of two.
            let safe = |e: &Expr| match e.vector() {
                VExpr::Bin(kind, a, b) if kind.compares() => a.range(&known).is_some() && b.range(&known).is_some(),
                other => other.range(&known).is_some(),
            };
            unchecked.push(match stage {
                Stage::Map(exprs) => exprs.iter().map(safe).collect(),
                Stage::Filter(e) | Stage::Key(e) => vec![safe(e)],
                Stage::Time(..) => Vec::new(),
            });
            if let Stage::Map(exprs) = stage {
                ranges = exprs.iter().map(|e| e.vector().range(&known)).collect();
            }
        }
        self.unchecked = unchecked;
        // Backward: the fields read after each step (`None`: any).
        let mut live: Option<Vec<bool>> = None;
        let mut skip = vec![Vec::new(); self.stages.len()];
        for (k, (_, stage)) in self.stages.iter().enumerate().rev() {
            let mut reads = Vec::new();
            let mut any = false;
            match stage {
                Stage::Filter(e) | Stage::Key(e) => any = e.vector().reads(&mut reads).is_none(),
                Stage::Time(field, _) => reads.push(*field),
                Stage::Map(exprs) => {
                    let known = |i: usize| at_stage.get(k).and_then(|r| r.get(i).copied().flatten());
                    let dead: Vec<bool> = exprs
                        .iter()
                        .enumerate()
                        .map(|(j, e)| {
                            live.as_ref().is_some_and(|l| !l.get(j).copied().unwrap_or(false))
                                && e.vector().infallible(&known)
                        })
                        .collect();
                    live = Some(Vec::new());
                    for (e, &d) in exprs.iter().zip(&dead) {
                        if !d {
                            any |= e.vector().reads(&mut reads).is_none();
                        }
                    }
                    if let Some(s) = skip.get_mut(k) {
                        *s = dead;
                    }
                }
            }
            if any {
                live = None;
            } else if let Some(l) = &mut live {
                for i in reads {
                    if l.len() <= i {
                        l.resize(i + 1, false);
                    }
                    if let Some(x) = l.get_mut(i) {
                        *x = true;
                    }
                }
            }
        }
        self.skip = skip;
    }

    /// Runs the batch `base` through the steps: each record that comes
    /// out is emitted for the record of the batch it came from; each that
    /// fails is failed, with the error (after its step's name, in a chain
    /// of several steps).
    pub(crate) fn run(&self, base: Base<'_>, out: &mut BatchOutput<Row, String>) {
        let mut f = Frame::new(base, self.width);
        for (k, (step, stage)) in self.stages.iter().enumerate() {
            if f.n == 0 {
                return;
            }
            let mut errs = Errs::new(f.n);
            let mut keep: Option<Vec<bool>> = None;
            match stage {
                Stage::Map(exprs) => {
                    let skip = self.skip.get(k).map_or(&[][..], Vec::as_slice);
                    let cols = exprs
                        .iter()
                        .enumerate()
                        .map(|(j, e)| match skip.get(j) {
                            Some(true) => Col::Any(Vec::new()),
                            _ => self.eval(k, j, e, &mut f, &mut errs),
                        })
                        .collect();
                    f.set(cols);
                }
                Stage::Filter(e) => {
                    let col = self.eval(k, 0, e, &mut f, &mut errs);
                    let kept = match col {
                        Col::Bool(b) => b,
                        other => (0..f.n)
                            .map(|j| match other.get(j) {
                                Value::Bool(b) => b,
                                v => {
                                    errs.set(j, not_a_bool(e, &v));
                                    false
                                }
                            })
                            .collect(),
                    };
                    keep = Some(kept);
                }
                Stage::Time(field, name) => {
                    let col = f.col(*field).clone();
                    if !matches!(col, Col::Int(_)) {
                        for j in 0..f.n {
                            match col.get(j) {
                                Value::Int(_) => {}
                                Value::Float(x) if x.is_finite() => {}
                                v => errs.set(j, not_a_time(name, &v)),
                            }
                        }
                    }
                }
                Stage::Key(e) => {
                    let col = self.eval(k, 0, e, &mut f, &mut errs);
                    f.extra.push(col);
                }
            }
            if errs.count > 0 {
                let mut kept = keep.unwrap_or_else(|| vec![true; f.n]);
                for (j, (slot, k)) in errs.at.iter_mut().zip(kept.iter_mut()).enumerate() {
                    if let Some(e) = slot.take() {
                        *k = false;
                        if let Some(&record) = f.sel.get(j) {
                            out.fail(record, self.message(step, &e));
                        }
                    }
                }
                keep = Some(kept);
            }
            if let Some(kept) = keep
                && kept.iter().any(|k| !k)
            {
                f.retain(&kept);
            }
        }
        let rows = f.build_all();
        out.emit_many(&f.sel, rows);
    }

    /// Expression `j` of step `k`, `e`, over all of `f`: without overflow
    /// checks where it cannot fail.
    fn eval(&self, k: usize, j: usize, e: &Expr, f: &mut Frame<'_>, errs: &mut Errs) -> Col {
        let unchecked = self.unchecked.get(k).and_then(|u| u.get(j)).copied().unwrap_or(false);
        match unchecked.then(|| eval_unchecked(e.vector(), f)).flatten() {
            Some(col) => col,
            None => eval(e.vector(), f, None, errs),
        }
    }

    fn message(&self, step: &str, e: &EvalError) -> String {
        if self.stages.len() > 1 { format!("step `{step}`: {e}") } else { e.to_string() }
    }
}

/// A filter's expression gave `v`, not a bool (as [`Expr::test`] says).
fn not_a_bool(e: &Expr, v: &Value) -> EvalError {
    EvalError::new(format!("`{}` gave {} ({}), not a bool", e.text, v, v.type_name()))
}

/// The event time `name` is `v`, not milliseconds.
pub(crate) fn not_a_time(name: &str, v: &Value) -> EvalError {
    EvalError::new(format!("the event time `{}` is {} ({}), not milliseconds since the epoch", name, v, v.type_name()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::yaml::doc::Pos;
    use crate::yaml::expr::{Origin, Schema, compile};

    const AT: Origin = Origin { pos: Pos { line: 1, column: 1 }, quoted: false };

    fn schema() -> Schema {
        Schema::of(["a", "b", "c", "s"])
    }

    fn expr(text: &str) -> Expr {
        compile(text, &schema(), AT).unwrap_or_else(|e| panic!("{text}: {e:?}"))
    }

    /// What the chain's steps give record by record, with the record-by-
    /// record evaluation: the records that come out (by index) and the
    /// failures (by index), sorted.
    type Outcome = (Vec<(usize, Row)>, Vec<(usize, String)>);

    fn by_records(chain: &Chain, rows: &[Row]) -> Outcome {
        let (mut out, mut failed) = (Vec::new(), Vec::new());
        'records: for (i, row) in rows.iter().enumerate() {
            let mut row = row.clone();
            for (step, stage) in &chain.stages {
                let result = match stage {
                    Stage::Map(exprs) => exprs.iter().map(|e| e.eval(&row)).collect::<Result<Vec<_>, _>>().map(|v| {
                        row = Row(v.into_iter().collect());
                        true
                    }),
                    Stage::Filter(e) => e.test(&row),
                    Stage::Key(e) => e.eval(&row).map(|k| {
                        row.0.push(k);
                        true
                    }),
                    Stage::Time(..) => Ok(true),
                };
                match result {
                    Ok(true) => {}
                    Ok(false) => continue 'records,
                    Err(e) => {
                        failed.push((i, chain.message(step, &e)));
                        continue 'records;
                    }
                }
            }
            out.push((i, row));
        }
        (out, failed)
    }

    fn by_columns(chain: &Chain, rows: &[Row]) -> Outcome {
        let mut out = BatchOutput::for_records(rows.len());
        chain.run(Base::Rows(rows), &mut out);
        let mut emitted: Vec<(usize, Row)> = out.results().map(|(i, r)| (i, r.clone())).collect();
        let mut failed: Vec<(usize, String)> = out.failures().map(|(i, e)| (i, e.clone())).collect();
        emitted.sort_by_key(|(i, _)| *i);
        failed.sort();
        (emitted, failed)
    }

    /// Ints at the edges (zero, -1, the extremes) and in between.
    fn int() -> impl Strategy<Value = i64> {
        prop_oneof![
            Just(0i64),
            Just(1),
            Just(-1),
            Just(2),
            Just(7),
            Just(1000),
            Just(i64::MAX),
            Just(i64::MIN),
            Just(i64::MAX / 3),
            -1_000i64..1_000,
            any::<i64>(),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            8 => int().prop_map(Value::Int),
            1 => any::<bool>().prop_map(Value::Bool),
            1 => Just(Value::Null),
            1 => prop_oneof![Just(0.5f64), Just(-2.0), Just(f64::NAN)].prop_map(Value::Float),
            1 => "[a-c]{0,3}".prop_map(Value::string),
        ]
    }

    /// A batch: each column all ints (the loops' case) or of any values.
    fn batch() -> impl Strategy<Value = Vec<Row>> {
        (1usize..40, any::<[bool; 4]>()).prop_flat_map(|(n, ints)| {
            let col = move |k: usize| -> BoxedStrategy<Vec<Value>> {
                if ints[k] {
                    proptest::collection::vec(int().prop_map(Value::Int), n).boxed()
                } else {
                    proptest::collection::vec(value(), n).boxed()
                }
            };
            (col(0), col(1), col(2), col(3)).prop_map(move |(a, b, c, s)| {
                (0..n).map(|i| Row::new([a[i].clone(), b[i].clone(), c[i].clone(), s[i].clone()])).collect()
            })
        })
    }

    /// Expressions over the fields: the operators columns compute, and
    /// what they leave to the record-by-record evaluation.
    fn text() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("event.a".to_string()),
            Just("event.b".to_string()),
            Just("event.c".to_string()),
            Just("event.s".to_string()),
            Just("size(event.s)".to_string()),
            int()
                .prop_map(|k| if k < 0 { format!("({k})") } else { k.to_string() })
                .prop_filter("literal", |t| t != "(-9223372036854775808)"),
            Just("true".to_string()),
            Just("'ab'".to_string()),
            Just("null".to_string()),
        ];
        leaf.prop_recursive(3, 24, 3, |inner| {
            let op = prop_oneof![
                Just("+"),
                Just("-"),
                Just("*"),
                Just("/"),
                Just("%"),
                Just("=="),
                Just("!="),
                Just("<"),
                Just("<="),
                Just(">"),
                Just(">="),
                Just("&&"),
                Just("||"),
            ];
            prop_oneof![
                (inner.clone(), op, inner.clone()).prop_map(|(a, op, b)| format!("({a} {op} {b})")),
                inner.clone().prop_map(|a| format!("!({a})")),
                inner.clone().prop_map(|a| format!("-({a})")),
                (inner.clone(), inner.clone(), inner).prop_map(|(c, a, b)| format!("({c} ? {a} : {b})")),
            ]
        })
    }

    /// Int expressions over one field (`event.v`): what a generator's
    /// fields compute.
    fn index_text() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            3 => Just("event.v".to_string()),
            1 => prop_oneof![Just(0i64), Just(1), Just(2), Just(3), Just(1000), Just(2_654_435_761), Just(i64::MAX), 1i64..100_000]
                .prop_map(|k| k.to_string()),
        ];
        leaf.prop_recursive(3, 12, 2, |inner| {
            let op = prop_oneof![Just("+"), Just("-"), Just("*"), Just("/"), Just("%")];
            (inner.clone(), op, inner).prop_map(|(a, op, b)| format!("({a} {op} {b})"))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

        /// A chain of a filter, a map and a key gives what the record-by-
        /// record evaluation gives: the same records, the same failures.
        #[test]
        fn columns_give_what_records_give(rows in batch(), f in text(), m1 in text(), m2 in text(), k in text()) {
            let mut chain = Chain::new(4);
            chain.stages = vec![
                ("filter".into(), Stage::Filter(expr(&f))),
                ("map".into(), Stage::Map(vec![expr(&m1), expr(&m2), expr("event.a"), expr("event.s")])),
                ("key_by".into(), Stage::Key(expr(&k))),
            ];
            chain.prune();
            prop_assert_eq!(by_columns(&chain, &rows), by_records(&chain, &rows), "filter {}, map {} / {}, key {}", f, m1, m2, k);
        }

        /// Fields a later `map` drops are left uncomputed only where that
        /// changes nothing: the same records and the same failures as
        /// computing every field.
        #[test]
        fn dropped_fields_change_nothing(rows in batch(), m1 in text(), m2 in text(), f in text(), last in text()) {
            let mut chain = Chain::new(4);
            chain.stages = vec![
                ("map".into(), Stage::Map(vec![expr(&m1), expr(&m2), expr("event.a"), expr("event.b * 2 + 1")])),
                ("filter".into(), Stage::Filter(expr(&f))),
                ("map".into(), Stage::Map(vec![expr(&last), expr("event.c")])),
            ];
            let all = by_columns(&chain, &rows);
            chain.prune();
            prop_assert_eq!(by_columns(&chain, &rows), all.clone(), "map {} / {}, filter {}, map {}", m1, m2, f, last);
            prop_assert_eq!(all, by_records(&chain, &rows));
        }

        /// One expression, alone: the values where it evaluates, the
        /// errors where it does not.
        #[test]
        fn one_expression_as_a_column(rows in batch(), e in text()) {
            let mut chain = Chain::new(4);
            chain.stages = vec![("map".into(), Stage::Map(vec![expr(&e)]))];
            chain.prune();
            prop_assert_eq!(by_columns(&chain, &rows), by_records(&chain, &rows), "{}", e);
        }

        /// `Expr::eval_column` gives what `Expr::eval` gives row by row.
        #[test]
        fn a_column_is_its_rows(rows in batch(), e in text()) {
            let e = expr(&e);
            let by_rows: Vec<Result<Value, EvalError>> = rows.iter().map(|r| e.eval(r)).collect();
            prop_assert_eq!(e.eval_column(&rows), by_rows);
        }

        /// A generator's chain, whose fields have known ranges (some
        /// computed without overflow checks, some dropped): what the
        /// record-by-record evaluation gives, failures included.
        #[test]
        fn known_ranges_change_nothing(
            bound in prop_oneof![Just(i64::MAX), 0i64..100, 0i64..5_000_000_000],
            picks in proptest::collection::vec(any::<u64>(), 1..40),
            fields in proptest::collection::vec(index_text(), 3),
            f in index_text(),
            last in index_text(),
        ) {
            let gen_schema = Schema::of(["i"]);
            let schema = Schema::of(["x", "y", "z"]);
            let at = |t: &str, s: &Schema| compile(t, s, AT).unwrap_or_else(|e| panic!("{t}: {e:?}"));
            let index: Vec<u64> = picks.iter().map(|p| p % (bound as u64).saturating_add(1).max(1)).collect();
            let mut chain = Chain::new(1);
            chain.index_bound = Some(bound);
            chain.stages = vec![
                ("fields".into(), Stage::Map(fields.iter().map(|t| at(&t.replace("event.v", "event.i"), &gen_schema)).collect())),
                ("filter".into(), Stage::Filter(at(&format!("({}) % 2 == 0", f.replace("event.v", "event.y")), &schema))),
                ("map".into(), Stage::Map(vec![at(&last.replace("event.v", "event.x"), &schema), at("event.z", &schema)])),
            ];
            chain.prune();
            let rows: Vec<Row> = index.iter().map(|&i| Row::new([Value::Int(i64::try_from(i).unwrap_or(i64::MAX))])).collect();
            let mut out = BatchOutput::for_records(index.len());
            chain.run(Base::Index(&index), &mut out);
            let mut emitted: Vec<(usize, Row)> = out.results().map(|(i, r)| (i, r.clone())).collect();
            let mut failed: Vec<(usize, String)> = out.failures().map(|(i, e)| (i, e.clone())).collect();
            emitted.sort_by_key(|(i, _)| *i);
            failed.sort();
            prop_assert_eq!((emitted, failed), by_records(&chain, &rows), "fields {:?}, filter {}, map {}", fields, f, last);
        }

        /// Division by a positive constant without a division.
        #[test]
        fn divider_divides(x in 0i64..=i64::MAX, d in prop_oneof![1i64..3000, Just(i64::MAX), 1i64..=i64::MAX, Just(1i64 << 40)]) {
            let divider = Divider::new(d).unwrap();
            prop_assert_eq!(divider.apply(&[x], true), vec![x / d]);
            prop_assert_eq!(divider.apply(&[x], false), vec![x % d]);
        }
    }

    /// A generator's fields that a `map` drops: the one that cannot fail
    /// is not computed; the one that may overflow is, for its failure.
    #[test]
    fn a_dropped_field_is_computed_when_it_may_fail() {
        let gen_schema = Schema::of(["i"]);
        let fields = ["(i * 2654435761) % 100000", "i % 1000", "i"]
            .map(|t| compile(&t.replace('i', "event.i"), &gen_schema, AT).unwrap_or_else(|e| panic!("{t}: {e:?}")));
        let value = compile("event.value * 3", &Schema::of(["key", "value", "ts"]), AT).unwrap();
        let chain = |bound: i64| {
            let mut c = Chain::new(1);
            c.index_bound = Some(bound);
            c.stages =
                vec![("fields".into(), Stage::Map(fields.to_vec())), ("map".into(), Stage::Map(vec![value.clone()]))];
            c.prune();
            c
        };
        // 20 M indexes: the key cannot overflow, and is not computed.
        assert_eq!(chain(20_000_000).skip, vec![vec![true, false, true], vec![false]]);
        // Any index: the key may overflow, so it is computed, and fails.
        let unbounded = chain(i64::MAX);
        assert_eq!(unbounded.skip, vec![vec![false, false, true], vec![false]]);
        let index = [7u64, 1 << 62];
        let mut out = BatchOutput::for_records(index.len());
        unbounded.run(Base::Index(&index), &mut out);
        let emitted: Vec<(usize, Row)> = out.results().map(|(i, r)| (i, r.clone())).collect();
        assert_eq!(emitted, vec![(0, Row::new([Value::Int(21)]))]);
        let failed: Vec<String> = out.failures().map(|(_, e)| e.clone()).collect();
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert!(failed[0].starts_with("step `fields`:"), "{failed:?}");
    }

    proptest! {
        /// Columns below 2^31, divided as 31-bit numerators.
        #[test]
        fn small_divider_divides(xs in proptest::collection::vec(0i64..(1 << 31), 1..20), d in prop_oneof![1i64..3000, 1i64..(1 << 31), Just((1i64 << 31) - 1), Just((1i64 << 30) + 1)]) {
            let divider = Divider::new(d).unwrap();
            prop_assert_eq!(divider.apply(&xs, true), xs.iter().map(|x| x / d).collect::<Vec<_>>());
            prop_assert_eq!(divider.apply(&xs, false), xs.iter().map(|x| x % d).collect::<Vec<_>>());
        }
    }

    #[test]
    fn divider_at_the_edges() {
        for d in
            [1i64, 2, 3, 7, 10, 1000, 100_000, (1 << 30) + 1, (1 << 31) - 1, 2_654_435_761, (1 << 62) + 1, i64::MAX]
        {
            let divider = Divider::new(d).unwrap();
            let xs = [0i64, 1, d - 1, d, d.saturating_add(1), i64::MAX - 1, i64::MAX, i64::MAX / 2];
            assert_eq!(divider.apply(&xs, true), xs.map(|x| x / d).to_vec(), "{d}");
            assert_eq!(divider.apply(&xs, false), xs.map(|x| x % d).to_vec(), "{d}");
            // Every numerator below 2^31: the 31-bit method.
            let small = xs.map(|x| x.min((1 << 31) - 1));
            assert_eq!(divider.apply(&small, true), small.map(|x| x / d).to_vec(), "{d}");
            assert_eq!(divider.apply(&small, false), small.map(|x| x % d).to_vec(), "{d}");
        }
        assert!(Divider::new(0).is_none() && Divider::new(-3).is_none());
    }
}
