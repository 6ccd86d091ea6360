//! The accumulator of a step's aggregates: up to four nulls, booleans,
//! ints or doubles packed in five words, a [`Row`] otherwise.
//!
//! A keyed aggregate keeps one accumulator per key, and a job with
//! millions of keys reads each from memory, not from a cache: its size
//! is what a record costs. Packed, an accumulator and its int or double
//! key fill one 64-byte entry of the state's map (one cache line), where
//! a [`Row`] of the same values took a line and a half. In state and in
//! checkpoints it is encoded as the [`Row`] of its values, under the
//! row's codec, so a checkpoint written with either restores into the
//! other.

use weibo::codec::{CodecError, CodecId, Data};

use super::value::{Row, Value};

/// How many values an accumulator packs.
const PACKED: usize = 4;

/// An aggregate's accumulator: a row of values, packed when it is short
/// and holds no strings, lists or maps.
#[derive(Clone, Debug)]
pub struct Acc(Repr);

#[derive(Clone, Debug)]
enum Repr {
    Packed { tags: [Tag; PACKED], len: u8, words: [u64; PACKED] },
    Row(Box<Row>),
}

/// What a packed value is; ints and doubles keep their bits in the
/// value's word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Tag {
    Null,
    False,
    True,
    Int,
    Float,
}

impl Tag {
    /// The tag and word of `v`, when it packs.
    #[inline]
    fn of(v: &Value) -> Option<(Tag, u64)> {
        Some(match v {
            Value::Null => (Tag::Null, 0),
            Value::Bool(false) => (Tag::False, 0),
            Value::Bool(true) => (Tag::True, 0),
            Value::Int(i) => (Tag::Int, *i as u64),
            Value::Float(f) => (Tag::Float, f.to_bits()),
            _ => return None,
        })
    }

    #[inline]
    fn value(self, word: u64) -> Value {
        match self {
            Tag::Null => Value::Null,
            Tag::False => Value::Bool(false),
            Tag::True => Value::Bool(true),
            Tag::Int => Value::Int(word as i64),
            Tag::Float => Value::Float(f64::from_bits(word)),
        }
    }
}

impl Acc {
    /// `width` nulls.
    #[inline]
    pub fn nulls(width: usize) -> Acc {
        match u8::try_from(width) {
            Ok(len) if width <= PACKED => Acc(Repr::Packed { tags: [Tag::Null; PACKED], len, words: [0; PACKED] }),
            _ => Acc(Repr::Row(Box::new(Row::new((0..width).map(|_| Value::Null))))),
        }
    }

    /// The accumulator of `row`'s values.
    pub fn from_row(row: Row) -> Acc {
        let mut tags = [Tag::Null; PACKED];
        let mut words = [0; PACKED];
        if row.0.len() > PACKED {
            return Acc(Repr::Row(Box::new(row)));
        }
        for ((v, tag), word) in row.0.iter().zip(&mut tags).zip(&mut words) {
            match Tag::of(v) {
                Some((t, w)) => (*tag, *word) = (t, w),
                None => return Acc(Repr::Row(Box::new(row))),
            }
        }
        Acc(Repr::Packed { tags, len: row.0.len() as u8, words })
    }

    /// The row of the accumulator's values.
    pub fn to_row(&self) -> Row {
        match &self.0 {
            Repr::Packed { tags, len, words } => {
                Row::new(tags.iter().zip(words).take(usize::from(*len)).map(|(t, w)| t.value(*w)))
            }
            Repr::Row(row) => (**row).clone(),
        }
    }

    /// How many values it holds.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Packed { len, .. } => usize::from(*len),
            Repr::Row(row) => row.0.len(),
        }
    }

    /// Whether it holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value at `index` (null past the end).
    #[inline]
    pub fn get(&self, index: usize) -> Value {
        match &self.0 {
            Repr::Packed { tags, len, words } if index < usize::from(*len) => match (tags.get(index), words.get(index))
            {
                (Some(t), Some(w)) => t.value(*w),
                _ => Value::Null,
            },
            Repr::Packed { .. } => Value::Null,
            Repr::Row(row) => row.field(index).clone(),
        }
    }

    /// The int at `index` as `Some(Some(i))`, a null as `Some(None)`,
    /// anything else as `None`.
    #[inline]
    pub(crate) fn int_or_null(&self, index: usize) -> Option<Option<i64>> {
        match &self.0 {
            Repr::Packed { tags, words, .. } => match (tags.get(index), words.get(index)) {
                (Some(Tag::Int), Some(w)) => Some(Some(*w as i64)),
                (Some(Tag::Null), _) => Some(None),
                _ => None,
            },
            Repr::Row(row) => match row.field(index) {
                Value::Int(i) => Some(Some(*i)),
                Value::Null => Some(None),
                _ => None,
            },
        }
    }

    /// Sets the value at `index`, within the accumulator's length;
    /// a value that does not pack turns the accumulator into a row.
    #[inline]
    pub fn set(&mut self, index: usize, value: Value) {
        if index >= self.len() {
            return;
        }
        match &mut self.0 {
            Repr::Packed { tags, words, .. } => {
                if let (Some((t, w)), Some(tag), Some(word)) =
                    (Tag::of(&value), tags.get_mut(index), words.get_mut(index))
                {
                    (*tag, *word) = (t, w);
                    return;
                }
                let mut row = self.to_row();
                if let Some(slot) = row.0.get_mut(index) {
                    *slot = value;
                }
                self.0 = Repr::Row(Box::new(row));
            }
            Repr::Row(row) => {
                if let Some(slot) = row.0.get_mut(index) {
                    *slot = value;
                }
            }
        }
    }

    /// Sets the int at `index`, within the accumulator's length.
    #[inline]
    pub(crate) fn set_int(&mut self, index: usize, value: i64) {
        match &mut self.0 {
            Repr::Packed { tags, len, words } if index < usize::from(*len) => {
                if let (Some(tag), Some(word)) = (tags.get_mut(index), words.get_mut(index)) {
                    (*tag, *word) = (Tag::Int, value as u64);
                }
            }
            Repr::Packed { .. } => {}
            Repr::Row(row) => {
                if let Some(slot) = row.0.get_mut(index) {
                    *slot = Value::Int(value);
                }
            }
        }
    }

    /// Runs `f` on the accumulator as a row; packed again after it when
    /// it was packed and still packs.
    pub(crate) fn with_row<R>(&mut self, f: impl FnOnce(&mut Row) -> R) -> R {
        match &mut self.0 {
            Repr::Row(row) => f(row),
            Repr::Packed { .. } => {
                let mut row = self.to_row();
                let r = f(&mut row);
                *self = Acc::from_row(row);
                r
            }
        }
    }
}

impl PartialEq for Acc {
    /// Equal when the values are, packed or not.
    fn eq(&self, other: &Acc) -> bool {
        self.len() == other.len() && (0..self.len()).all(|i| self.get(i) == other.get(i))
    }
}

impl Data for Acc {
    /// The row's codec: an accumulator is written as the row of its
    /// values, and a row written in a checkpoint reads back as one.
    fn codec_id() -> CodecId {
        Row::codec_id()
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        match &self.0 {
            Repr::Row(row) => row.encode(out),
            Repr::Packed { .. } => self.to_row().encode(out),
        }
    }

    fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        Row::decode(bytes).map(Acc::from_row)
    }

    fn schema() -> std::sync::Arc<weibo::codec::schema::Schema> {
        Row::schema()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    /// With an int key, a packed accumulator and the entry's epoch fill
    /// one 64-byte entry of the state's map.
    #[test]
    fn accumulators_are_five_words() {
        assert_eq!(size_of::<Acc>(), 40);
        assert_eq!(size_of::<(Value, (Acc, u32))>(), 64);
    }

    fn rows() -> impl proptest::strategy::Strategy<Value = Row> {
        use proptest::prelude::*;
        let value = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::Int),
            any::<f64>().prop_map(Value::Float),
            "[a-z]{0,3}".prop_map(|s| Value::str(&s)),
        ];
        proptest::collection::vec(value, 0..7).prop_map(Row::new)
    }

    proptest::proptest! {
        /// Packed or not, an accumulator holds its row's values, and is
        /// written as the row is: the same bytes, read back as either.
        #[test]
        fn accumulators_are_their_rows(row in rows(), at in 0usize..8, to in rows()) {
            let acc = Acc::from_row(row.clone());
            proptest::prop_assert_eq!(acc.to_row(), row.clone());
            let (mut a, mut r) = (Vec::new(), Vec::new());
            acc.encode(&mut a).unwrap();
            row.encode(&mut r).unwrap();
            proptest::prop_assert_eq!(&a, &r);
            proptest::prop_assert_eq!(Acc::decode(&a).unwrap(), acc.clone());
            // Set a value of another row: the same as setting it in the row.
            let (mut acc, mut row) = (acc, row);
            let v = to.field(0).clone();
            acc.set(at, v.clone());
            if let Some(slot) = row.0.get_mut(at) {
                *slot = v;
            }
            proptest::prop_assert_eq!(acc.to_row(), row);
        }
    }
}
