//! Rows in PostgreSQL's binary `COPY` format, with the sink's own columns
//! in front of the user's.
//!
//! Every row the sink stages starts with five columns of its own:
//!
//! | column | type | what |
//! | --- | --- | --- |
//! | `weibo_seq` | `int8` | chunk number (high 32 bits) and row number in the chunk |
//! | `weibo_src` | `int8` | the record's source index (high 32 bits) and partition |
//! | `weibo_offset` | `int8` | the record's offset in its source partition |
//! | `weibo_error` | `text` | why the sink could not encode the row (then every user column is NULL) |
//! | `weibo_row` | `text` | the row's values as text, for such a row |

use bytes::{BufMut, Bytes, BytesMut};
use tokio_postgres::types::{IsNull, Type};

use super::Column;

/// The binary `COPY` signature, flags and header extension length.
const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";
/// The sink's own columns in front of the user's (see the module notes).
pub(crate) const META_COLUMNS: usize = 5;
/// Their definitions, in that order.
pub(crate) const META_DDL: &str =
    "weibo_seq int8 NOT NULL, weibo_src int8 NOT NULL, weibo_offset int8 NOT NULL, weibo_error text, weibo_row text";

/// Where a row came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Origin {
    pub(crate) source: u32,
    pub(crate) partition: u32,
    pub(crate) offset: u64,
}

impl Origin {
    pub(crate) fn packed_source(self) -> i64 {
        (i64::from(self.source) << 32) | i64::from(self.partition)
    }

    pub(crate) fn unpack(src: i64, offset: i64) -> Self {
        let src = src as u64;
        Origin { source: (src >> 32) as u32, partition: src as u32, offset: offset as u64 }
    }
}

/// A chunk of rows being encoded: the bytes of a `COPY ... (FORMAT
/// binary)` body and where each row ends in them.
pub(crate) struct RowBuffer {
    bytes: BytesMut,
    /// The end of each row in `bytes`.
    ends: Vec<usize>,
}

impl RowBuffer {
    pub(crate) fn new() -> Self {
        let mut bytes = BytesMut::with_capacity(1 << 16);
        bytes.extend_from_slice(HEADER);
        Self { bytes, ends: Vec::new() }
    }

    pub(crate) fn rows(&self) -> usize {
        self.ends.len()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Appends `row` as row `seq` from `origin`. On an encoding error the
    /// row is left out and the error returned (with the buffer as before).
    pub(crate) fn push<T>(
        &mut self,
        columns: &[Column<T>],
        types: &[Type],
        row: &T,
        seq: i64,
        origin: Origin,
    ) -> Result<(), String> {
        let start = self.bytes.len();
        let fields = i16::try_from(columns.len() + META_COLUMNS).map_err(|_| "too many columns".to_string())?;
        self.bytes.put_i16(fields);
        self.meta(seq, origin);
        self.null();
        self.null();
        for (c, ty) in columns.iter().zip(types) {
            let at = self.bytes.len();
            self.bytes.put_i32(0);
            match (c.encode)(row, ty, &mut self.bytes) {
                Ok(IsNull::No) => {
                    let len = self.bytes.len() - at - 4;
                    let Ok(len) = i32::try_from(len) else {
                        self.bytes.truncate(start);
                        return Err(format!(
                            "the value of column `{}` is {len} bytes, more than Postgres takes",
                            c.name
                        ));
                    };
                    if let Some(slot) = self.bytes.get_mut(at..at + 4) {
                        slot.copy_from_slice(&len.to_be_bytes());
                    }
                }
                Ok(IsNull::Yes) => {
                    self.bytes.truncate(at);
                    self.null();
                }
                Err(e) => {
                    self.bytes.truncate(start);
                    return Err(format!("cannot encode column `{}` as `{ty}`: {e}", c.name));
                }
            }
        }
        self.ends.push(self.bytes.len());
        Ok(())
    }

    /// Appends a row the sink could not encode: its origin, the error and
    /// its values as text, every user column NULL.
    pub(crate) fn push_refused(&mut self, columns: usize, seq: i64, origin: Origin, error: &str, row: &str) {
        let fields = i16::try_from(columns + META_COLUMNS).unwrap_or(i16::MAX);
        self.bytes.put_i16(fields);
        self.meta(seq, origin);
        self.text(error);
        self.text(row);
        for _ in 0..columns {
            self.null();
        }
        self.ends.push(self.bytes.len());
    }

    fn meta(&mut self, seq: i64, origin: Origin) {
        for v in [seq, origin.packed_source(), origin.offset as i64] {
            self.bytes.put_i32(8);
            self.bytes.put_i64(v);
        }
    }

    fn null(&mut self) {
        self.bytes.put_i32(-1);
    }

    fn text(&mut self, s: &str) {
        // Postgres refuses NUL in text; the texts here are the sink's own.
        let s = s.replace('\0', "\u{fffd}");
        self.bytes.put_i32(i32::try_from(s.len()).unwrap_or(i32::MAX));
        self.bytes.extend_from_slice(s.as_bytes());
    }

    /// The finished `COPY` body, leaving the buffer empty (and ready for
    /// the next chunk), and where each row ends in it.
    pub(crate) fn take(&mut self) -> (Bytes, Vec<usize>) {
        self.bytes.put_i16(-1);
        let mut next = BytesMut::with_capacity(self.bytes.capacity());
        next.extend_from_slice(HEADER);
        let body = std::mem::replace(&mut self.bytes, next).freeze();
        (body, std::mem::take(&mut self.ends))
    }
}

/// The `COPY` body holding row `i` of `body` alone (`ends` as
/// [`RowBuffer::take`] returned them).
pub(crate) fn single_row(body: &Bytes, ends: &[usize], i: usize) -> Option<Bytes> {
    let start = if i == 0 { HEADER.len() } else { *ends.get(i - 1)? };
    let end = *ends.get(i)?;
    let mut out = BytesMut::with_capacity(HEADER.len() + end - start + 2);
    out.extend_from_slice(HEADER);
    out.extend_from_slice(body.get(start..end)?);
    out.put_i16(-1);
    Some(out.freeze())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn columns() -> Vec<Column<(i64, Option<String>)>> {
        vec![
            Column::new("a", |r: &(i64, Option<String>)| r.0),
            Column::new("b", |r: &(i64, Option<String>)| r.1.clone()),
        ]
    }

    #[test]
    fn a_chunk_is_a_binary_copy_body() {
        let cols = columns();
        let types = [Type::INT8, Type::TEXT];
        let mut buf = RowBuffer::new();
        let origin = Origin { source: 1, partition: 2, offset: 3 };
        buf.push(&cols, &types, &(7, Some("x".into())), 9, origin).unwrap();
        buf.push(&cols, &types, &(8, None), 10, origin).unwrap();
        let (body, ends) = buf.take();
        assert_eq!(ends.len(), 2);
        assert!(body.starts_with(HEADER));
        assert!(body.ends_with(&[0xff, 0xff]));
        // One row: 2 (count) + 3 × 12 (meta) + 2 × 4 (NULL texts) + 12 (int8) + 5 (text "x").
        assert_eq!(ends[0] - HEADER.len(), 2 + 36 + 8 + 12 + 5);
        // The second row's text is NULL: a length of -1 and no bytes.
        assert_eq!(&body[ends[1] - 4..ends[1]], &(-1i32).to_be_bytes());
        let one = single_row(&body, &ends, 1).unwrap();
        assert_eq!(one.len(), HEADER.len() + ends[1] - ends[0] + 2);
        assert_eq!(Origin::unpack(origin.packed_source(), 3), origin);
    }

    #[test]
    fn a_value_that_does_not_encode_leaves_the_buffer_as_it_was() {
        let cols = vec![Column::new("a", |r: &i64| *r)];
        let mut buf = RowBuffer::new();
        let before = buf.bytes();
        // `i64` does not encode as `int4`.
        let err = buf.push(&cols, &[Type::INT4], &1, 0, Origin { source: 0, partition: 0, offset: 0 });
        assert!(err.is_err());
        assert_eq!(buf.bytes(), before);
        assert_eq!(buf.rows(), 0);
    }
}
