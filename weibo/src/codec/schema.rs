//! State schemas: the layout of a state's values (field names and types,
//! enum variants, recursively), recorded in checkpoints so that a restore
//! compares the layout it was written with to the code's, whatever the
//! type's module path or the compiler that spells its name.
//!
//! A schema is traced from a type's `Deserialize` impl ([`Schema::of`]):
//! a deserializer that records what it is asked for and hands back a
//! placeholder value, run until every variant of every enum it met was
//! visited. Types it cannot trace (a `Deserialize` impl that asks for
//! `deserialize_any`, refuses the placeholder values, or recurses without
//! end) are recorded as [`Shape::Opaque`], compared by their type name.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Visitor};
use serde::{Deserialize, Serialize};

/// The layout of a value, as its serde impl describes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// `()`.
    Unit,
    /// `bool`.
    Bool,
    /// `i8`.
    I8,
    /// `i16`.
    I16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `i128`.
    I128,
    /// `u8`.
    U8,
    /// `u16`.
    U16,
    /// `u32`.
    U32,
    /// `u64`.
    U64,
    /// `u128`.
    U128,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// `char`.
    Char,
    /// A string.
    Str,
    /// Bytes.
    Bytes,
    /// `Option<T>`.
    Option(Box<Shape>),
    /// A sequence (`Vec<T>`, a set).
    Seq(Box<Shape>),
    /// A map.
    Map(Box<Shape>, Box<Shape>),
    /// A tuple or fixed-size array.
    Tuple(Vec<Shape>),
    /// A struct, a tuple struct or a newtype (by its name, without module
    /// path: moving a type does not change its schema).
    Struct {
        /// Its name.
        name: String,
        /// Its fields in order: named (`""` for a tuple struct's).
        fields: Vec<(String, Shape)>,
    },
    /// An enum: its variants in order (their index is their encoding).
    Enum {
        /// Its name.
        name: String,
        /// Each variant's name and fields (`""` for positional ones).
        variants: Vec<(String, Vec<(String, Shape)>)>,
    },
    /// The enum of this name that encloses it (a recursive type).
    Recursive(String),
    /// A type that could not be traced, by its type name.
    Opaque(String),
}

/// A state's schema: the shape of its values.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Schema {
    /// The values' shape.
    pub shape: Shape,
}

impl Schema {
    /// The schema of `T`, traced from its `Deserialize` impl once per
    /// process and type.
    pub fn of<T: DeserializeOwned + 'static>() -> Arc<Schema> {
        static CACHE: OnceLock<Mutex<HashMap<std::any::TypeId, Arc<Schema>>>> = OnceLock::new();
        let cache = CACHE.get_or_init(Mutex::default);
        let id = std::any::TypeId::of::<T>();
        if let Some(s) = cache.lock().unwrap_or_else(PoisonError::into_inner).get(&id) {
            return s.clone();
        }
        let shape = trace::<T>().unwrap_or_else(|e| {
            // Said once per type: its state is then matched by the type's
            // name on restore, and a changed layout under that name is
            // not detected.
            tracing::warn!(
                r#type = std::any::type_name::<T>(),
                reason = %e,
                "cannot trace the type's layout for state schemas: it is recorded by its name"
            );
            Shape::Opaque(std::any::type_name::<T>().to_string())
        });
        let schema = Arc::new(Schema { shape });
        cache.lock().unwrap_or_else(PoisonError::into_inner).insert(id, schema.clone());
        schema
    }

    /// A schema for a layout Weibo defines itself (timers), by name.
    pub fn internal(name: &str) -> Arc<Schema> {
        Arc::new(Schema { shape: Shape::Opaque(name.to_string()) })
    }

    /// A short stable id of the schema (a hash of its JSON form), under
    /// which manifests file it.
    pub fn id(&self) -> String {
        let json = serde_json::to_string(self).unwrap_or_default();
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(json.as_bytes()))
    }

    /// The first difference between `self` (a checkpoint's) and `now`
    /// (the code's), as a sentence naming the field; `None` when they are
    /// the same.
    pub fn first_difference(&self, now: &Schema) -> Option<String> {
        let root = match &self.shape {
            Shape::Struct { name, .. } | Shape::Enum { name, .. } => name.as_str(),
            _ => "",
        };
        diff(&self.shape, &now.shape, root)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Unit => f.write_str("()"),
            Shape::Bool => f.write_str("bool"),
            Shape::I8 => f.write_str("i8"),
            Shape::I16 => f.write_str("i16"),
            Shape::I32 => f.write_str("i32"),
            Shape::I64 => f.write_str("i64"),
            Shape::I128 => f.write_str("i128"),
            Shape::U8 => f.write_str("u8"),
            Shape::U16 => f.write_str("u16"),
            Shape::U32 => f.write_str("u32"),
            Shape::U64 => f.write_str("u64"),
            Shape::U128 => f.write_str("u128"),
            Shape::F32 => f.write_str("f32"),
            Shape::F64 => f.write_str("f64"),
            Shape::Char => f.write_str("char"),
            Shape::Str => f.write_str("string"),
            Shape::Bytes => f.write_str("bytes"),
            Shape::Option(s) => write!(f, "Option<{s}>"),
            Shape::Seq(s) => write!(f, "[{s}]"),
            Shape::Map(k, v) => write!(f, "map<{k}, {v}>"),
            Shape::Tuple(items) => {
                let items: Vec<String> = items.iter().map(ToString::to_string).collect();
                write!(f, "({})", items.join(", "))
            }
            Shape::Struct { name, .. } | Shape::Enum { name, .. } => f.write_str(name),
            Shape::Recursive(name) => write!(f, "{name} (recursive)"),
            Shape::Opaque(name) => write!(f, "{name} (untraced)"),
        }
    }
}

fn at(path: &str) -> String {
    if path.is_empty() { "the value".to_string() } else { format!("`{path}`") }
}

fn join(path: &str, part: &str) -> String {
    if path.is_empty() { part.to_string() } else { format!("{path}.{part}") }
}

fn fields_diff(was: &[(String, Shape)], now: &[(String, Shape)], path: &str) -> Option<String> {
    for (i, ((wn, ws), (nn, ns))) in was.iter().zip(now).enumerate() {
        let name = if wn.is_empty() { i.to_string() } else { wn.clone() };
        if wn != nn {
            return Some(format!("field {i} of {} was `{wn}`, is `{nn}`", at(path)));
        }
        if let Some(d) = diff(ws, ns, &join(path, &name)) {
            return Some(d);
        }
    }
    if let Some((name, shape)) = now.get(was.len()) {
        return Some(format!("{} has a new field `{}` ({shape})", at(path), name));
    }
    if let Some((name, shape)) = was.get(now.len()) {
        return Some(format!("{} lost its field `{}` ({shape})", at(path), name));
    }
    None
}

fn diff(was: &Shape, now: &Shape, path: &str) -> Option<String> {
    match (was, now) {
        (Shape::Option(a), Shape::Option(b)) | (Shape::Seq(a), Shape::Seq(b)) => diff(a, b, path),
        (Shape::Map(ka, va), Shape::Map(kb, vb)) => {
            diff(ka, kb, &join(path, "<key>")).or_else(|| diff(va, vb, &join(path, "<value>")))
        }
        (Shape::Tuple(a), Shape::Tuple(b)) => {
            let named = |items: &[Shape]| items.iter().map(|s| (String::new(), s.clone())).collect::<Vec<_>>();
            fields_diff(&named(a), &named(b), path)
        }
        (Shape::Struct { fields: a, .. }, Shape::Struct { fields: b, .. }) => fields_diff(a, b, path),
        (Shape::Enum { variants: a, .. }, Shape::Enum { variants: b, .. }) => {
            for (i, ((wn, wf), (nn, nf))) in a.iter().zip(b).enumerate() {
                if wn != nn {
                    return Some(format!("variant {i} of {} was `{wn}`, is `{nn}`", at(path)));
                }
                if let Some(d) = fields_diff(wf, nf, &join(path, wn)) {
                    return Some(d);
                }
            }
            if let Some((name, _)) = b.get(a.len()) {
                return Some(format!("{} has a new variant `{name}`", at(path)));
            }
            a.get(b.len()).map(|(name, _)| format!("{} lost its variant `{name}`", at(path)))
        }
        (a, b) if a == b => None,
        (a, b) => Some(format!("{} was {a}, is {b}", at(path))),
    }
}

/// Decodes `bytes`, postcard's encoding of a value of `shape`, into JSON,
/// without the type: what a savepoint's inspector shows. Struct fields
/// become object members, enum variants `{"Variant": ...}` (a unit
/// variant its name), bytes and untraced values a hex string.
///
/// # Errors
/// A message saying where the bytes end early or do not fit the shape.
pub fn decode_postcard(shape: &Shape, bytes: &[u8]) -> Result<serde_json::Value, String> {
    let mut input = bytes;
    let value = decode_value(shape, &mut input, 0)?;
    if !input.is_empty() {
        return Err(format!("{} bytes left after the value", input.len()));
    }
    Ok(value)
}

/// Bytes as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if input.len() < n {
        return Err(format!("the value ends early: {n} bytes needed, {} left", input.len()));
    }
    let (head, tail) = input.split_at(n);
    *input = tail;
    Ok(head)
}

fn varint(input: &mut &[u8]) -> Result<u128, String> {
    let mut out = 0u128;
    for shift in (0..19).map(|i| i * 7) {
        let [b] = take(input, 1)? else { return Err("the value ends early".into()) };
        out |= u128::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(out);
        }
    }
    Err("a varint runs too long".into())
}

fn zigzag(input: &mut &[u8]) -> Result<i128, String> {
    let v = varint(input)?;
    Ok(((v >> 1) as i128) ^ -((v & 1) as i128))
}

fn len(input: &mut &[u8]) -> Result<usize, String> {
    usize::try_from(varint(input)?).map_err(|_| "a length does not fit in memory".to_string())
}

/// A sequence's or map's length, checked against what is left: each
/// element takes a byte at least, unless it is of a shape that takes none
/// (then at most [`MAX_EMPTY_ELEMENTS`]).
fn count(input: &mut &[u8], shapes: &[&Shape]) -> Result<usize, String> {
    let n = len(input)?;
    let limit = if shapes.iter().all(|s| takes_no_bytes(s)) { MAX_EMPTY_ELEMENTS } else { input.len() };
    if n > limit {
        return Err(format!("a length of {n} is more than the {} bytes left can hold", input.len()));
    }
    Ok(n)
}

/// The most elements of a shape that takes no bytes a value may show.
const MAX_EMPTY_ELEMENTS: usize = 1 << 16;

fn takes_no_bytes(shape: &Shape) -> bool {
    match shape {
        Shape::Unit => true,
        Shape::Tuple(items) => items.iter().all(takes_no_bytes),
        Shape::Struct { fields, .. } => fields.iter().all(|(_, s)| takes_no_bytes(s)),
        _ => false,
    }
}

fn fields_value(fields: &[(String, Shape)], input: &mut &[u8], depth: usize) -> Result<serde_json::Value, String> {
    if fields.iter().all(|(n, _)| n.is_empty()) {
        let mut items = Vec::with_capacity(fields.len());
        for (_, s) in fields {
            items.push(decode_value(s, input, depth + 1)?);
        }
        // A newtype is its inner value.
        return Ok(if items.len() == 1 { items.remove(0) } else { serde_json::Value::Array(items) });
    }
    let mut object = serde_json::Map::new();
    for (name, s) in fields {
        object.insert(name.clone(), decode_value(s, input, depth + 1)?);
    }
    Ok(serde_json::Value::Object(object))
}

fn decode_value(shape: &Shape, input: &mut &[u8], depth: usize) -> Result<serde_json::Value, String> {
    use serde_json::Value as J;
    if depth > MAX_DEPTH {
        return Err("the value nests too deep".into());
    }
    let number = |n: i128| -> J {
        i64::try_from(n)
            .map(J::from)
            .or_else(|_| u64::try_from(n).map(J::from))
            .unwrap_or_else(|_| J::String(n.to_string()))
    };
    Ok(match shape {
        Shape::Unit => J::Null,
        Shape::Bool => match take(input, 1)? {
            [0] => J::Bool(false),
            [1] => J::Bool(true),
            other => return Err(format!("{other:?} is not a bool")),
        },
        Shape::U8 => J::from(take(input, 1)?.first().copied().unwrap_or_default()),
        Shape::I8 => J::from(take(input, 1)?.first().copied().unwrap_or_default() as i8),
        Shape::U16 | Shape::U32 | Shape::U64 | Shape::U128 => {
            let v = varint(input)?;
            u64::try_from(v).map(J::from).unwrap_or_else(|_| J::String(v.to_string()))
        }
        Shape::I16 | Shape::I32 | Shape::I64 | Shape::I128 => number(zigzag(input)?),
        Shape::F32 => {
            let b: [u8; 4] = take(input, 4)?.try_into().map_err(|_| "an f32 ends early".to_string())?;
            let v = f32::from_le_bytes(b);
            serde_json::Number::from_f64(f64::from(v)).map_or(J::Null, J::Number)
        }
        Shape::F64 => {
            let b: [u8; 8] = take(input, 8)?.try_into().map_err(|_| "an f64 ends early".to_string())?;
            serde_json::Number::from_f64(f64::from_le_bytes(b)).map_or(J::Null, J::Number)
        }
        Shape::Char | Shape::Str => {
            let n = len(input)?;
            let text = std::str::from_utf8(take(input, n)?).map_err(|e| format!("a string is not UTF-8: {e}"))?;
            J::String(text.to_string())
        }
        Shape::Bytes => {
            let n = len(input)?;
            J::String(hex(take(input, n)?))
        }
        Shape::Option(inner) => match take(input, 1)? {
            [0] => J::Null,
            [1] => decode_value(inner, input, depth + 1)?,
            other => return Err(format!("{other:?} is not an option's tag")),
        },
        Shape::Seq(inner) => {
            let n = count(input, &[&**inner])?;
            let mut items = Vec::with_capacity(n.min(4096));
            for _ in 0..n {
                items.push(decode_value(inner, input, depth + 1)?);
            }
            J::Array(items)
        }
        Shape::Map(k, v) => {
            let n = count(input, &[&**k, &**v])?;
            let mut entries = Vec::with_capacity(n.min(4096));
            for _ in 0..n {
                let key = decode_value(k, input, depth + 1)?;
                let value = decode_value(v, input, depth + 1)?;
                entries.push(J::Array(vec![key, value]));
            }
            J::Array(entries)
        }
        Shape::Tuple(items) => {
            let mut out = Vec::with_capacity(items.len());
            for s in items {
                out.push(decode_value(s, input, depth + 1)?);
            }
            J::Array(out)
        }
        Shape::Struct { fields, .. } => fields_value(fields, input, depth)?,
        Shape::Enum { variants, .. } => {
            let index = usize::try_from(varint(input)?).map_err(|_| "a variant index is too large".to_string())?;
            let Some((name, fields)) = variants.get(index) else {
                return Err(format!("variant {index} does not exist ({} variants)", variants.len()));
            };
            if fields.is_empty() {
                J::String(name.clone())
            } else {
                let mut object = serde_json::Map::new();
                object.insert(name.clone(), fields_value(fields, input, depth)?);
                J::Object(object)
            }
        }
        Shape::Recursive(name) | Shape::Opaque(name) => {
            return Err(format!("a value of {name} cannot be decoded without its type"));
        }
    })
}

/// Traces `T`'s shape: one pass per variant still to visit.
fn trace<T: DeserializeOwned>() -> Result<Shape, TraceError> {
    let mut tracer = Tracer::default();
    for _ in 0..MAX_PASSES {
        tracer.depth = 0;
        let mut shape = Slot::default();
        T::deserialize(Probe { tracer: &mut tracer, out: &mut shape })?;
        if tracer.complete() {
            let shape = shape.0.ok_or_else(|| TraceError("no shape".into()))?;
            return Ok(refresh(shape, &tracer.enums, &mut Vec::new()));
        }
    }
    Err(TraceError("too many variants to trace".into()))
}

/// Whether every value of `T` that postcard writes reads back as the same
/// value: checked once per process and type on samples the tracer makes
/// (one per enum variant, each with its options, sequences, maps, strings
/// and numbers filled, and again empty), each written, read back and
/// written again. postcard writes fields by position, without names or
/// lengths, so a serde attribute that leaves a field out of what is
/// written (`skip_serializing_if`, `skip_serializing`), or a type that
/// must be read by looking at what is there (`deserialize_any`: untagged
/// and internally tagged enums, `flatten`, `serde_json::Value`), writes
/// values that can never be read back. A type whose `Deserialize` refuses
/// the placeholders (a string that must parse) gives no samples and is
/// not checked further.
///
/// # Errors
/// What goes wrong, as a sentence about the type's values.
pub(crate) fn postcard_round_trip<T: Serialize + DeserializeOwned + 'static>() -> Result<(), String> {
    static CACHE: OnceLock<Mutex<HashMap<std::any::TypeId, Result<(), String>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    let id = std::any::TypeId::of::<T>();
    if let Some(known) = cache.lock().unwrap_or_else(PoisonError::into_inner).get(&id) {
        return known.clone();
    }
    let result = round_trip_samples::<T>();
    cache.lock().unwrap_or_else(PoisonError::into_inner).insert(id, result.clone());
    result
}

fn round_trip_samples<T: Serialize + DeserializeOwned>() -> Result<(), String> {
    for empty in [false, true] {
        let mut tracer = Tracer { empty, ..Tracer::default() };
        for _ in 0..MAX_PASSES {
            tracer.depth = 0;
            let mut slot = Slot::default();
            let sample = match T::deserialize(Probe { tracer: &mut tracer, out: &mut slot }) {
                Ok(sample) => sample,
                Err(e) if e.0.starts_with(SELF_DESCRIBING) => {
                    return Err("its `Deserialize` asks for `deserialize_any` (an untagged or internally tagged \
                                enum, `#[serde(flatten)]`, or a self-describing type such as \
                                `serde_json::Value`), which postcard cannot read"
                        .into());
                }
                // The type refuses the placeholders: no samples to learn from.
                Err(_) => break,
            };
            round_trip(&sample, empty)?;
            if tracer.complete() {
                break;
            }
        }
    }
    Ok(())
}

/// Writes `sample`, reads it back and writes it again.
fn round_trip<T: Serialize + DeserializeOwned>(sample: &T, empty: bool) -> Result<(), String> {
    let what = if empty { "a value with its options `None` and its collections empty" } else { "a value" };
    let bytes = postcard::to_allocvec(sample).map_err(|e| format!("{what} cannot be written: {e}"))?;
    let back: T = match postcard::take_from_bytes::<T>(&bytes) {
        Ok((back, [])) => back,
        Ok((_, rest)) => {
            return Err(format!(
                "{what}, written as {} bytes, reads back from the first {} only: the value it reads is not the one \
                 written",
                bytes.len(),
                bytes.len() - rest.len()
            ));
        }
        Err(e) => {
            return Err(format!(
                "{what}, written as {} bytes, cannot be read back ({e}): a field is left out of what is written \
                 (`skip_serializing_if` or `skip_serializing`), but read",
                bytes.len()
            ));
        }
    };
    let again = postcard::to_allocvec(&back).map_err(|e| format!("{what}, read back, cannot be written: {e}"))?;
    if again != bytes {
        return Err(format!("{what} reads back as another value (written again, its bytes differ)"));
    }
    Ok(())
}

/// Gives every enum in `shape` all of its variants (an occurrence holds
/// those visited when it was met), a recursive one as a reference.
fn refresh(shape: Shape, enums: &BTreeMap<&'static str, EnumTrace>, stack: &mut Vec<String>) -> Shape {
    let fields = |f: Vec<(String, Shape)>, stack: &mut Vec<String>| -> Vec<(String, Shape)> {
        f.into_iter().map(|(n, s)| (n, refresh(s, enums, stack))).collect()
    };
    match shape {
        Shape::Option(s) => Shape::Option(Box::new(refresh(*s, enums, stack))),
        Shape::Seq(s) => Shape::Seq(Box::new(refresh(*s, enums, stack))),
        Shape::Map(k, v) => Shape::Map(Box::new(refresh(*k, enums, stack)), Box::new(refresh(*v, enums, stack))),
        Shape::Tuple(items) => Shape::Tuple(items.into_iter().map(|s| refresh(s, enums, stack)).collect()),
        Shape::Struct { name, fields: f } => Shape::Struct { name, fields: fields(f, stack) },
        Shape::Enum { name, variants } => {
            if stack.contains(&name) {
                return Shape::Recursive(name);
            }
            let traced = enums.get(name.as_str());
            stack.push(name.clone());
            let variants = variants
                .into_iter()
                .enumerate()
                .map(|(i, (n, f))| {
                    let f = traced.and_then(|t| t.variants.get(i).cloned().flatten()).unwrap_or(f);
                    (n, fields(f, stack))
                })
                .collect();
            stack.pop();
            Shape::Enum { name, variants }
        }
        other => other,
    }
}

const MAX_PASSES: usize = 256;
const MAX_DEPTH: usize = 64;

/// Per enum met: its variant names, the fields of each visited one, and
/// the next to visit.
#[derive(Default)]
struct Tracer {
    enums: BTreeMap<&'static str, EnumTrace>,
    depth: usize,
    /// Hand back "empty" placeholders (`None`, no elements, zeros, empty
    /// strings) instead of filled ones: samples for
    /// [`postcard_round_trip`], where a field skipped when empty shows.
    empty: bool,
}

#[derive(Default)]
struct EnumTrace {
    variants: Vec<Option<Vec<(String, Shape)>>>,
    /// The enums being visited now (recursion picks a visited variant).
    active: usize,
}

impl Tracer {
    fn complete(&self) -> bool {
        self.enums.values().all(|e| e.variants.iter().all(Option::is_some))
    }
}

#[derive(Debug)]
struct TraceError(String);

/// The start of the error the tracer gives a type that asks for
/// `deserialize_any`.
const SELF_DESCRIBING: &str = "a self-describing type (deserialize_any)";

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TraceError {}

impl de::Error for TraceError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        TraceError(msg.to_string())
    }
}

#[derive(Default)]
struct Slot(Option<Shape>);

struct Probe<'a> {
    tracer: &'a mut Tracer,
    out: &'a mut Slot,
}

macro_rules! primitive {
    ($method:ident, $shape:expr, $visit:ident, $value:expr, $empty:expr) => {
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TraceError> {
            self.out.0 = Some($shape);
            if self.tracer.empty { visitor.$visit($empty) } else { visitor.$visit($value) }
        }
    };
}

/// Positional elements, each traced into its own slot.
struct Elements<'a> {
    tracer: &'a mut Tracer,
    slots: Vec<Slot>,
    next: usize,
}

impl<'de> de::SeqAccess<'de> for Elements<'_> {
    type Error = TraceError;
    fn next_element_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, TraceError> {
        let Some(slot) = self.slots.get_mut(self.next) else { return Ok(None) };
        self.next += 1;
        seed.deserialize(Probe { tracer: self.tracer, out: slot }).map(Some)
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.slots.len() - self.next)
    }
}

impl<'a> Elements<'a> {
    fn new(tracer: &'a mut Tracer, n: usize) -> Self {
        Self { tracer, slots: (0..n).map(|_| Slot::default()).collect(), next: 0 }
    }
    fn shapes(self) -> Vec<Shape> {
        self.slots.into_iter().map(|s| s.0.unwrap_or(Shape::Unit)).collect()
    }
}

/// One map entry, key and value traced.
struct OneEntry<'a> {
    tracer: &'a mut Tracer,
    key: Slot,
    value: Slot,
    state: u8,
}

impl<'de> de::MapAccess<'de> for OneEntry<'_> {
    type Error = TraceError;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, TraceError> {
        if self.state > 0 {
            return Ok(None);
        }
        self.state = 1;
        seed.deserialize(Probe { tracer: self.tracer, out: &mut self.key }).map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, TraceError> {
        self.state = 2;
        seed.deserialize(Probe { tracer: self.tracer, out: &mut self.value })
    }
}

impl<'de> de::Deserializer<'de> for Probe<'_> {
    type Error = TraceError;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, TraceError> {
        Err(TraceError(format!("{SELF_DESCRIBING} cannot be traced")))
    }
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TraceError> {
        self.deserialize_any(visitor)
    }

    primitive!(deserialize_bool, Shape::Bool, visit_bool, false, false);
    primitive!(deserialize_i8, Shape::I8, visit_i8, 1, 0);
    primitive!(deserialize_i16, Shape::I16, visit_i16, 1, 0);
    primitive!(deserialize_i32, Shape::I32, visit_i32, 1, 0);
    primitive!(deserialize_i64, Shape::I64, visit_i64, 1, 0);
    primitive!(deserialize_i128, Shape::I128, visit_i128, 1, 0);
    primitive!(deserialize_u8, Shape::U8, visit_u8, 1, 0);
    primitive!(deserialize_u16, Shape::U16, visit_u16, 1, 0);
    primitive!(deserialize_u32, Shape::U32, visit_u32, 1, 0);
    primitive!(deserialize_u64, Shape::U64, visit_u64, 1, 0);
    primitive!(deserialize_u128, Shape::U128, visit_u128, 1, 0);
    primitive!(deserialize_f32, Shape::F32, visit_f32, 0.0, 0.0);
    primitive!(deserialize_f64, Shape::F64, visit_f64, 0.0, 0.0);
    primitive!(deserialize_char, Shape::Char, visit_char, 'a', 'a');
    primitive!(deserialize_str, Shape::Str, visit_str, "", "");
    primitive!(deserialize_string, Shape::Str, visit_string, String::new(), String::new());
    primitive!(deserialize_bytes, Shape::Bytes, visit_bytes, &[], &[]);
    primitive!(deserialize_byte_buf, Shape::Bytes, visit_byte_buf, Vec::new(), Vec::new());

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TraceError> {
        self.out.0 = Some(Shape::Unit);
        visitor.visit_unit()
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TraceError> {
        self.out.0 = Some(Shape::U32);
        visitor.visit_u32(0)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TraceError> {
        if self.tracer.empty {
            // A sample only: the shape is traced in the other mode.
            self.out.0 = Some(Shape::Option(Box::new(Shape::Unit)));
            return visitor.visit_none();
        }
        let mut inner = Slot::default();
        let value = visitor.visit_some(Probe { tracer: self.tracer, out: &mut inner })?;
        self.out.0 = Some(Shape::Option(Box::new(inner.0.unwrap_or(Shape::Unit))));
        Ok(value)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, TraceError> {
        self.out.0 = Some(Shape::Struct { name: name.to_string(), fields: Vec::new() });
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        let mut inner = Slot::default();
        self.tracer.depth += 1;
        if self.tracer.depth > MAX_DEPTH {
            return Err(TraceError("the type nests too deep to trace".into()));
        }
        let value = visitor.visit_newtype_struct(Probe { tracer: self.tracer, out: &mut inner })?;
        self.tracer.depth -= 1;
        let fields = vec![(String::new(), inner.0.unwrap_or(Shape::Unit))];
        self.out.0 = Some(Shape::Struct { name: name.to_string(), fields });
        Ok(value)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TraceError> {
        let n = usize::from(!self.tracer.empty);
        let mut elements = Elements::new(self.tracer, n);
        let value = visitor.visit_seq(&mut elements)?;
        let shape = elements.shapes().pop().unwrap_or(Shape::Unit);
        self.out.0 = Some(Shape::Seq(Box::new(shape)));
        Ok(value)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, TraceError> {
        let mut elements = Elements::new(self.tracer, len);
        let value = visitor.visit_seq(&mut elements)?;
        self.out.0 = Some(Shape::Tuple(elements.shapes()));
        Ok(value)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        let mut elements = Elements::new(self.tracer, len);
        let value = visitor.visit_seq(&mut elements)?;
        let fields = elements.shapes().into_iter().map(|s| (String::new(), s)).collect();
        self.out.0 = Some(Shape::Struct { name: name.to_string(), fields });
        Ok(value)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TraceError> {
        // An empty map in the empty mode (as if its one entry were read).
        let state = if self.tracer.empty { 2 } else { 0 };
        let mut entry = OneEntry { tracer: self.tracer, key: Slot::default(), value: Slot::default(), state };
        let value = visitor.visit_map(&mut entry)?;
        let (k, v) = (entry.key.0.unwrap_or(Shape::Unit), entry.value.0.unwrap_or(Shape::Unit));
        self.out.0 = Some(Shape::Map(Box::new(k), Box::new(v)));
        Ok(value)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        self.tracer.depth += 1;
        if self.tracer.depth > MAX_DEPTH {
            return Err(TraceError("the type nests too deep to trace".into()));
        }
        let mut elements = Elements::new(self.tracer, fields.len());
        let value = visitor.visit_seq(&mut elements)?;
        elements.tracer.depth -= 1;
        let shapes = elements.shapes();
        let fields = fields.iter().map(|f| (*f).to_string()).zip(shapes).collect();
        self.out.0 = Some(Shape::Struct { name: name.to_string(), fields });
        Ok(value)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        if variants.is_empty() {
            return Err(TraceError(format!("enum {name} has no variants")));
        }
        self.tracer.depth += 1;
        if self.tracer.depth > MAX_DEPTH {
            return Err(TraceError("the type nests too deep to trace".into()));
        }
        let entry = self.tracer.enums.entry(name).or_default();
        if entry.variants.is_empty() {
            entry.variants = vec![None; variants.len()];
        }
        // The first variant not yet visited, unless this enum is being
        // visited already (a recursive type): then one that was, so that
        // the recursion ends.
        let recursive = entry.active > 0;
        let pick = if recursive {
            // Lacking a visited one, the last variant (`Nil` after `Cons`).
            entry.variants.iter().position(Option::is_some).unwrap_or(variants.len() - 1)
        } else {
            entry.variants.iter().position(Option::is_none).unwrap_or(0)
        };
        entry.active += 1;
        let mut fields = Vec::new();
        let value = visitor.visit_enum(Variant { tracer: &mut *self.tracer, index: pick, fields: &mut fields })?;
        let entry = self.tracer.enums.entry(name).or_default();
        entry.active -= 1;
        if let Some(slot) = entry.variants.get_mut(pick)
            && slot.is_none()
        {
            *slot = Some(fields);
        }
        self.tracer.depth -= 1;
        let known: Vec<(String, Vec<(String, Shape)>)> = variants
            .iter()
            .zip(&entry.variants)
            .map(|(n, f)| ((*n).to_string(), f.clone().unwrap_or_default()))
            .collect();
        self.out.0 = Some(if recursive {
            Shape::Recursive(name.to_string())
        } else {
            Shape::Enum { name: name.to_string(), variants: known }
        });
        Ok(value)
    }

    fn is_human_readable(&self) -> bool {
        false
    }
}

/// The variant a pass visits, and where its fields go.
struct Variant<'a> {
    tracer: &'a mut Tracer,
    index: usize,
    fields: &'a mut Vec<(String, Shape)>,
}

impl<'de, 'a> de::EnumAccess<'de> for Variant<'a> {
    type Error = TraceError;
    type Variant = Self;
    fn variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<(S::Value, Self), TraceError> {
        let index = u32::try_from(self.index).map_err(|_| TraceError("too many variants".into()))?;
        let value = seed.deserialize(index.into_deserializer())?;
        Ok((value, self))
    }
}

impl<'de> de::VariantAccess<'de> for Variant<'_> {
    type Error = TraceError;
    fn unit_variant(self) -> Result<(), TraceError> {
        Ok(())
    }
    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<S::Value, TraceError> {
        let mut inner = Slot::default();
        let value = seed.deserialize(Probe { tracer: self.tracer, out: &mut inner })?;
        self.fields.push((String::new(), inner.0.unwrap_or(Shape::Unit)));
        Ok(value)
    }
    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, TraceError> {
        let mut elements = Elements::new(self.tracer, len);
        let value = visitor.visit_seq(&mut elements)?;
        self.fields.extend(elements.shapes().into_iter().map(|s| (String::new(), s)));
        Ok(value)
    }
    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        let mut elements = Elements::new(self.tracer, fields.len());
        let value = visitor.visit_seq(&mut elements)?;
        self.fields.extend(fields.iter().map(|f| (*f).to_string()).zip(elements.shapes()));
        Ok(value)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    #[allow(dead_code)]
    enum Kind {
        A,
        B(u32),
        C { x: i64 },
        D(Box<Kind>),
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        k: Kind,
        o: Option<String>,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Totals {
        customer: u32,
        orders: u64,
        inner: Vec<Inner>,
        m: std::collections::HashMap<String, (u8, f64)>,
        t: (u64, Kind),
    }

    mod v2 {
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        pub(super) struct Totals {
            pub customer: u32,
            pub orders: u64,
            pub inner: Vec<super::Inner>,
            pub m: std::collections::HashMap<String, (u8, f64)>,
            pub t: (u64, super::Kind),
            pub refunds: u64,
        }

        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        pub(super) struct Moved(pub u32);
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Moved(u32);

    #[test]
    fn a_schema_names_fields_and_variants_and_not_module_paths() {
        let s = Schema::of::<Totals>();
        let Shape::Struct { name, fields } = &s.shape else { panic!("{s:?}") };
        assert_eq!(name, "Totals");
        let names: Vec<&str> = fields.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(names, ["customer", "orders", "inner", "m", "t"]);
        let Shape::Seq(inner) = &fields[2].1 else { panic!() };
        let Shape::Struct { fields: inner, .. } = &**inner else { panic!() };
        let Shape::Enum { variants, .. } = &inner[0].1 else { panic!() };
        let variants: Vec<(&str, usize)> = variants.iter().map(|(n, f)| (n.as_str(), f.len())).collect();
        assert_eq!(variants, [("A", 0), ("B", 1), ("C", 1), ("D", 1)], "every variant traced, the recursive one too");
        let Shape::Enum { variants, .. } = &inner[0].1 else { panic!() };
        assert_eq!(variants[3].1[0].1, Shape::Recursive("Kind".into()));
        assert_eq!(Schema::of::<Moved>(), Schema::of::<v2::Moved>(), "a moved type keeps its schema");
        assert_eq!(Schema::of::<Totals>().id(), s.id());
        assert_eq!(s.first_difference(&s), None);
    }

    #[test]
    fn the_first_difference_names_the_field() {
        let was = Schema::of::<Totals>();
        let now = Schema::of::<v2::Totals>();
        assert_eq!(was.first_difference(&now).unwrap(), "`Totals` has a new field `refunds` (u64)");
        assert_eq!(now.first_difference(&was).unwrap(), "`Totals` lost its field `refunds` (u64)");
        let a = Schema::of::<(u64, Option<i32>)>();
        let b = Schema::of::<(u64, Option<u32>)>();
        assert_eq!(a.first_difference(&b).unwrap(), "`1` was i32, is u32");
        assert_ne!(a.id(), b.id());
        let plain = Schema::of::<u64>();
        assert_eq!(plain.shape, Shape::U64);
    }

    #[derive(Serialize, Deserialize)]
    struct SkipsNone {
        id: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    }

    #[derive(Serialize, Deserialize)]
    struct SkipsEmpty {
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tags: Vec<u8>,
    }

    #[derive(Serialize, Deserialize)]
    #[allow(dead_code)]
    struct SkipsAlways {
        id: u64,
        #[serde(skip_serializing)]
        cache: u32,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Untagged {
        A(u64),
        B(String),
    }

    #[derive(Serialize, Deserialize)]
    #[serde(tag = "type")]
    enum Internal {
        A { x: u64 },
    }

    #[derive(Serialize, Deserialize)]
    struct Flattened {
        id: u64,
        #[serde(flatten)]
        rest: Inner2,
    }

    #[derive(Serialize, Deserialize)]
    struct Inner2 {
        x: u64,
    }

    /// What postcard reads back as written: defaults, skipped (both ways)
    /// fields, every kind of enum variant, maps, options.
    #[derive(Serialize, Deserialize)]
    #[allow(dead_code)]
    struct Fine {
        #[serde(default)]
        a: Option<u64>,
        #[serde(skip)]
        b: u32,
        c: std::collections::BTreeMap<String, Vec<Option<(u8, String)>>>,
        d: Vec<Mixed>,
        e: std::num::NonZeroU32,
    }

    #[derive(Serialize, Deserialize)]
    enum Mixed {
        Unit,
        New(i64),
        Tuple(u8, String),
        Named { x: f64, y: Option<Box<Mixed>> },
    }

    #[test]
    fn values_postcard_cannot_read_back_are_found_before_anything_is_written() {
        let err = |r: Result<(), String>| r.unwrap_err();
        let none = err(postcard_round_trip::<SkipsNone>());
        assert!(none.contains("`None`") && none.contains("cannot be read back"), "{none}");
        assert!(err(postcard_round_trip::<SkipsEmpty>()).contains("cannot be read back"));
        assert!(err(postcard_round_trip::<SkipsAlways>()).contains("cannot be read back"));
        for e in [
            err(postcard_round_trip::<Untagged>()),
            err(postcard_round_trip::<Internal>()),
            err(postcard_round_trip::<Flattened>()),
            err(postcard_round_trip::<serde_json::Value>()),
        ] {
            assert!(e.contains("deserialize_any"), "{e}");
        }
        postcard_round_trip::<Fine>().unwrap();
        postcard_round_trip::<Totals2>().unwrap();
        postcard_round_trip::<(u64, String, Vec<bool>)>().unwrap();
        // Cached: the same answer again.
        assert_eq!(postcard_round_trip::<SkipsNone>().unwrap_err(), none);
    }

    #[derive(Serialize, Deserialize)]
    struct Totals2 {
        customer: u32,
        orders: u64,
        m: std::collections::HashMap<String, (u8, f64)>,
    }

    #[test]
    fn an_untraceable_type_is_opaque() {
        // serde_json::Value asks for deserialize_any.
        let s = Schema::of::<serde_json::Value>();
        assert!(matches!(&s.shape, Shape::Opaque(n) if n.contains("Value")), "{s:?}");
    }
}
