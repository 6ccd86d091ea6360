//! The records of YAML pipelines: rows of dynamic values.
//!
//! A [`Row`] is a short list of [`Value`]s, kept inline up to four: the
//! names of its fields are not in the row but in the pipeline, which knows
//! at every step what its records hold (the step's schema). A source
//! without a declared schema gives rows of one field, the whole decoded
//! record as a [`Value::Map`]. Rows have their own codec (format
//! `weibo-yaml-row/1`), compact and self-delimiting; a [`Value`] is a
//! [`Key`] by the same encoding.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use smallvec::SmallVec;
use weibo::codec::key::KeyDecodeError;
use weibo::codec::{CodecError, CodecId, Data};
use weibo::prelude::Key;

/// The format name of the row codec.
pub const ROW_FORMAT: &str = "weibo-yaml-row/1";

/// Deepest nesting of lists and maps a decoded value may have.
const MAX_DEPTH: usize = 128;

/// A dynamic value: JSON's, with integers and floats apart.
///
/// Its tag is a whole word, so that a value is copied as two aligned words
/// (with a byte tag, copies of a value are stitched from overlapping
/// unaligned moves, which stall the loads that read it back).
#[derive(Clone, Debug, Default)]
#[repr(u64)]
pub enum Value {
    /// No value.
    #[default]
    Null,
    /// A boolean.
    Bool(bool),
    /// A 64-bit signed integer.
    Int(i64),
    /// A 64-bit float.
    Float(f64),
    /// A string.
    Str(Arc<String>),
    /// A list.
    List(Arc<Vec<Value>>),
    /// A map from strings, in insertion order.
    Map(Arc<Vec<(Arc<str>, Value)>>),
}

impl Value {
    /// The value's type, as messages name it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "double",
            Value::Str(_) => "string",
            Value::List(_) => "list",
            Value::Map(_) => "map",
        }
    }

    /// The value of `field` in a map.
    pub fn get(&self, field: &str) -> Option<&Value> {
        match self {
            Value::Map(entries) => entries.iter().find(|(k, _)| &**k == field).map(|(_, v)| v),
            _ => None,
        }
    }

    /// A string value.
    pub fn str(s: &str) -> Value {
        Value::Str(Arc::new(s.to_string()))
    }

    /// A map of `entries`, in their order.
    pub fn map<'a>(entries: impl IntoIterator<Item = (&'a str, Value)>) -> Value {
        Value::Map(Arc::new(entries.into_iter().map(|(k, v)| (Arc::from(k), v)).collect()))
    }

    /// A string value, without a copy.
    pub fn string(s: String) -> Value {
        Value::Str(Arc::new(s))
    }

    /// The value as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Int(i) => serde_json::Value::from(*i),
            Value::Float(f) => {
                serde_json::Number::from_f64(*f).map_or(serde_json::Value::Null, serde_json::Value::Number)
            }
            Value::Str(s) => serde_json::Value::String(s.to_string()),
            Value::List(items) => serde_json::Value::Array(items.iter().map(Value::to_json).collect()),
            Value::Map(entries) => {
                serde_json::Value::Object(entries.iter().map(|(k, v)| (k.to_string(), v.to_json())).collect())
            }
        }
    }

    /// A value from JSON (integers that fit `i64` stay integers).
    pub fn from_json(json: &serde_json::Value) -> Value {
        match json {
            serde_json::Value::Null => Value::Null,
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => Value::string(s.clone()),
            serde_json::Value::Array(items) => Value::List(Arc::new(items.iter().map(Value::from_json).collect())),
            serde_json::Value::Object(entries) => Value::Map(Arc::new(
                entries.iter().map(|(k, v)| (Arc::from(k.as_str()), Value::from_json(v))).collect(),
            )),
        }
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            Value::Null => out.push(0),
            Value::Bool(false) => out.push(1),
            Value::Bool(true) => out.push(2),
            Value::Int(i) => {
                out.push(3);
                varint(out, ((i << 1) ^ (i >> 63)) as u64);
            }
            Value::Float(f) => {
                out.push(4);
                out.extend_from_slice(&f.to_bits().to_le_bytes());
            }
            Value::Str(s) => {
                out.push(5);
                bytes(out, s.as_bytes());
            }
            Value::List(items) => {
                out.push(6);
                varint(out, items.len() as u64);
                for item in items.iter() {
                    item.encode_into(out);
                }
            }
            Value::Map(entries) => {
                out.push(7);
                varint(out, entries.len() as u64);
                for (k, v) in entries.iter() {
                    bytes(out, k.as_bytes());
                    v.encode_into(out);
                }
            }
        }
    }

    fn decode_from(input: &mut &[u8], depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(format!("values nest deeper than {MAX_DEPTH} levels"));
        }
        let (&tag, rest) = input.split_first().ok_or("the input ends before a value")?;
        *input = rest;
        Ok(match tag {
            0 => Value::Null,
            1 => Value::Bool(false),
            2 => Value::Bool(true),
            3 => {
                let z = read_varint(input)?;
                Value::Int(((z >> 1) as i64) ^ -((z & 1) as i64))
            }
            4 => {
                let (eight, rest) = input.split_first_chunk::<8>().ok_or("the input ends inside a double")?;
                *input = rest;
                Value::Float(f64::from_bits(u64::from_le_bytes(*eight)))
            }
            5 => Value::str(read_str(input)?),
            6 => {
                let n = read_len(input)?;
                let mut items = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    items.push(Value::decode_from(input, depth + 1)?);
                }
                Value::List(items.into())
            }
            7 => {
                let n = read_len(input)?;
                let mut entries = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    let k = Arc::from(read_str(input)?);
                    entries.push((k, Value::decode_from(input, depth + 1)?));
                }
                Value::Map(entries.into())
            }
            other => return Err(format!("no value has the tag {other}")),
        })
    }
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn read_varint(input: &mut &[u8]) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = input.split_first().ok_or("the input ends inside a number")?;
        *input = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Ok(v);
        }
    }
    Err("a number longer than 10 bytes".into())
}

fn read_len(input: &mut &[u8]) -> Result<usize, String> {
    let n = read_varint(input)?;
    usize::try_from(n).ok().filter(|&n| n <= input.len()).ok_or_else(|| format!("a length of {n} past the input's end"))
}

fn read_str<'a>(input: &mut &'a [u8]) -> Result<&'a str, String> {
    let n = read_len(input)?;
    let (s, rest) = input.split_at_checked(n).ok_or("the input ends inside a string")?;
    *input = rest;
    std::str::from_utf8(s).map_err(|e| format!("a string that is not UTF-8: {e}"))
}

impl PartialEq for Value {
    /// Equality as keys compare: doubles by their bits (so `NaN` equals
    /// itself and `0.0` is not `-0.0`); an int is never a double.
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Float(a), Value::Float(b)) => a.to_bits() == b.to_bits(),
            (Value::Str(a), Value::Str(b)) => a == b,
            (Value::List(a), Value::List(b)) => a == b,
            (Value::Map(a), Value::Map(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Value {}

impl Hash for Value {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            Value::Null => {}
            Value::Bool(b) => b.hash(state),
            Value::Int(i) => i.hash(state),
            Value::Float(f) => f.to_bits().hash(state),
            Value::Str(s) => s.hash(state),
            Value::List(items) => items.hash(state),
            Value::Map(entries) => entries.hash(state),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Str(s) => f.write_str(s),
            other => match serde_json::to_string(other) {
                Ok(json) => f.write_str(&json),
                Err(_) => Err(fmt::Error),
            },
        }
    }
}

impl serde::Serialize for Value {
    /// As JSON has it: maps in their order, a double that is not finite as
    /// null.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => s.serialize_i64(*i),
            Value::Float(f) if f.is_finite() => s.serialize_f64(*f),
            Value::Float(_) => s.serialize_unit(),
            Value::Str(t) => s.serialize_str(t),
            Value::List(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items.iter() {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries.iter() {
                    map.serialize_entry(&**k, v)?;
                }
                map.end()
            }
        }
    }
}

impl Key for Value {
    fn encode_key(&self, out: &mut Vec<u8>) {
        self.encode_into(out);
    }

    fn decode_key(input: &mut &[u8]) -> Result<Self, KeyDecodeError> {
        Value::decode_from(input, 0)
            .map_err(|reason| KeyDecodeError { type_name: "weibo_connectors::yaml::Value", reason })
    }

    fn key_schema() -> weibo::codec::schema::Shape {
        weibo::codec::schema::Shape::Opaque(ROW_FORMAT.to_string())
    }
}

/// One record of a YAML pipeline: its fields' values, in the order of the
/// step's schema.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Row(pub SmallVec<[Value; 4]>);

impl Row {
    /// A row of `values`.
    pub fn new(values: impl IntoIterator<Item = Value>) -> Row {
        Row(values.into_iter().collect())
    }

    /// The value of the field at `index`.
    #[inline]
    pub fn field(&self, index: usize) -> &Value {
        static NULL: Value = Value::Null;
        self.0.get(index).unwrap_or(&NULL)
    }
}

impl Data for Row {
    fn codec_id() -> CodecId {
        CodecId::new(ROW_FORMAT, std::any::type_name::<Row>())
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        varint(out, self.0.len() as u64);
        for v in &self.0 {
            v.encode_into(out);
        }
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        let err = |reason: String| CodecError { codec: Self::codec_id(), reason };
        let mut input = bytes;
        let n = read_len(&mut input).map_err(err)?;
        let mut row = SmallVec::with_capacity(n);
        for _ in 0..n {
            row.push(Value::decode_from(&mut input, 0).map_err(err)?);
        }
        if !input.is_empty() {
            return Err(err(format!("{} trailing bytes after the row", input.len())));
        }
        Ok(Row(row))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;

    fn sample() -> Row {
        Row::new([
            Value::Null,
            Value::Bool(true),
            Value::Int(-5),
            Value::Int(i64::MIN),
            Value::Float(2.5),
            Value::str("héllo"),
            Value::List(vec![Value::Int(1), Value::str("a")].into()),
            Value::Map(vec![(Arc::from("k"), Value::Float(f64::NAN))].into()),
        ])
    }

    #[test]
    fn rows_read_back_as_written() {
        let row = sample();
        let mut bytes = Vec::new();
        row.encode(&mut bytes).unwrap_or_default();
        assert_eq!(Row::decode(&bytes).ok(), Some(row.clone()));
        for cut in 0..bytes.len() {
            assert!(Row::decode(&bytes[..cut]).is_err(), "a row cut at {cut} decodes");
        }
        let mut key = Vec::new();
        row.0[6].encode_key(&mut key);
        let mut input = key.as_slice();
        assert_eq!(Value::decode_key(&mut input).ok().as_ref(), Some(&row.0[6]));
        assert!(input.is_empty());
    }

    #[test]
    fn hostile_bytes_are_errors() {
        // A list claiming 2^60 items, and nesting past the limit.
        assert!(Row::decode(&[1, 6, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x10]).is_err());
        let mut deep = vec![1u8];
        deep.extend(std::iter::repeat_n([6u8, 1], 10_000).flatten());
        assert!(Row::decode(&deep).is_err());
    }

    /// A value is two words, and so is the result of an evaluation: both
    /// travel in registers, not through memory.
    #[test]
    fn values_are_two_words() {
        assert_eq!(std::mem::size_of::<Value>(), 16);
        assert_eq!(std::mem::size_of::<Result<Value, crate::yaml::expr::EvalError>>(), 16);
    }

    #[test]
    fn json_round_trip() {
        let json: serde_json::Value = serde_json::json!({"a": 1, "b": [true, null, 1.5, "x"], "c": {"d": -2}});
        assert_eq!(Value::from_json(&json).to_json(), json);
    }
}
