//! Rows in PostgreSQL's binary `COPY` format: the mapped columns only, so
//! that a chunk goes into the target table as it is; and where each row
//! came from, beside it.

use bytes::{BufMut, Bytes, BytesMut};
use tokio_postgres::types::{IsNull, Type};

use super::Column;

/// The binary `COPY` signature, flags and header extension length.
pub(crate) const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";

/// Where a row came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Origin {
    pub(crate) source: u32,
    pub(crate) partition: u32,
    pub(crate) offset: u64,
}

/// `origins` as 16 bytes each (source, partition, offset; big-endian).
pub(crate) fn encode_origins(origins: &[Origin]) -> Vec<u8> {
    let mut out = Vec::with_capacity(origins.len() * 16);
    for o in origins {
        out.extend_from_slice(&o.source.to_be_bytes());
        out.extend_from_slice(&o.partition.to_be_bytes());
        out.extend_from_slice(&o.offset.to_be_bytes());
    }
    out
}

/// The inverse of [`encode_origins`] (a trailing partial entry is dropped).
pub(crate) fn decode_origins(bytes: &[u8]) -> Vec<Origin> {
    bytes
        .chunks_exact(16)
        .map(|c| {
            let (s, rest) = c.split_at(4);
            let (p, o) = rest.split_at(4);
            Origin {
                source: u32::from_be_bytes(s.try_into().unwrap_or_default()),
                partition: u32::from_be_bytes(p.try_into().unwrap_or_default()),
                offset: u64::from_be_bytes(o.try_into().unwrap_or_default()),
            }
        })
        .collect()
}

/// Whether Postgres stores values of `ty` as text, which cannot hold NUL.
fn is_text(ty: &Type) -> bool {
    [Type::TEXT, Type::VARCHAR, Type::BPCHAR, Type::NAME].contains(ty)
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

    /// Appends `row`. On an encoding error (or a text value with a NUL
    /// byte, which Postgres refuses) the row is left out and the error
    /// returned, with the buffer as before.
    pub(crate) fn push<T>(&mut self, columns: &[Column<T>], types: &[Type], row: &T) -> Result<(), String> {
        let start = self.bytes.len();
        let fields = i16::try_from(columns.len()).map_err(|_| "too many columns".to_string())?;
        self.bytes.put_i16(fields);
        for (c, ty) in columns.iter().zip(types) {
            let at = self.bytes.len();
            self.bytes.put_i32(0);
            let fail = |buf: &mut BytesMut, why: String| {
                buf.truncate(start);
                Err(why)
            };
            match (c.encode)(row, ty, &mut self.bytes) {
                Ok(IsNull::No) => {
                    let len = self.bytes.len() - at - 4;
                    let Ok(len32) = i32::try_from(len) else {
                        return fail(
                            &mut self.bytes,
                            format!("the value of column `{}` is {len} bytes, more than Postgres takes", c.name),
                        );
                    };
                    if is_text(ty) && self.bytes.get(at + 4..).is_some_and(|v| v.contains(&0)) {
                        return fail(
                            &mut self.bytes,
                            format!(
                                "the text of column `{}` holds a NUL byte (0x00), which Postgres does not store",
                                c.name
                            ),
                        );
                    }
                    if let Some(slot) = self.bytes.get_mut(at..at + 4) {
                        slot.copy_from_slice(&len32.to_be_bytes());
                    }
                }
                Ok(IsNull::Yes) => {
                    self.bytes.truncate(at);
                    self.bytes.put_i32(-1);
                }
                Err(e) => return fail(&mut self.bytes, format!("cannot encode column `{}` as `{ty}`: {e}", c.name)),
            }
        }
        self.ends.push(self.bytes.len());
        Ok(())
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

/// Where each row of a binary `COPY` body ends; `None` when `body` is not
/// one (a spooled chunk damaged outside the sink).
pub(crate) fn row_ends(body: &[u8]) -> Option<Vec<usize>> {
    let mut at = HEADER.len();
    if body.get(..at)? != HEADER {
        return None;
    }
    let mut ends = Vec::new();
    loop {
        let fields = i16::from_be_bytes(body.get(at..at + 2)?.try_into().ok()?);
        at += 2;
        if fields == -1 {
            return (at == body.len()).then_some(ends);
        }
        for _ in 0..fields {
            let len = i32::from_be_bytes(body.get(at..at + 4)?.try_into().ok()?);
            at += 4;
            if len > 0 {
                at = at.checked_add(usize::try_from(len).ok()?)?;
            }
        }
        if at > body.len() {
            return None;
        }
        ends.push(at);
    }
}

/// The `COPY` body holding row `i` of `body` alone (`ends` as
/// [`RowBuffer::take`] or [`row_ends`] gave them), with `seq` as one more
/// `int8` field at its end.
pub(crate) fn single_row(body: &[u8], ends: &[usize], i: usize, seq: i64) -> Option<Bytes> {
    let start = if i == 0 { HEADER.len() } else { *ends.get(i - 1)? };
    let end = *ends.get(i)?;
    let row = body.get(start..end)?;
    let fields = i16::from_be_bytes(row.get(..2)?.try_into().ok()?);
    let mut out = BytesMut::with_capacity(HEADER.len() + row.len() + 16);
    out.extend_from_slice(HEADER);
    out.put_i16(fields.checked_add(1)?);
    out.extend_from_slice(row.get(2..)?);
    out.put_i32(8);
    out.put_i64(seq);
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
    fn a_chunk_is_a_binary_copy_body_whose_rows_can_be_found_again() {
        let cols = columns();
        let types = [Type::INT8, Type::TEXT];
        let mut buf = RowBuffer::new();
        buf.push(&cols, &types, &(7, Some("x".into()))).unwrap();
        buf.push(&cols, &types, &(8, None)).unwrap();
        let (body, ends) = buf.take();
        assert_eq!(ends.len(), 2);
        assert!(body.starts_with(HEADER));
        assert!(body.ends_with(&[0xff, 0xff]));
        // One row: 2 (count) + 12 (int8) + 5 (text "x").
        assert_eq!(ends[0] - HEADER.len(), 2 + 12 + 5);
        // The second row's text is NULL: a length of -1 and no bytes.
        assert_eq!(&body[ends[1] - 4..ends[1]], &(-1i32).to_be_bytes());
        assert_eq!(row_ends(&body), Some(ends.clone()));
        assert_eq!(row_ends(&body[..body.len() - 1]), None);
        assert_eq!(row_ends(b"not a copy"), None);
        let one = single_row(&body, &ends, 1, 42).unwrap();
        assert_eq!(one.len(), HEADER.len() + ends[1] - ends[0] + 12 + 2);
        assert_eq!(row_ends(&one).map(|e| e.len()), Some(1));
        assert_eq!(&one[HEADER.len()..HEADER.len() + 2], &3i16.to_be_bytes());
    }

    #[test]
    fn a_value_that_does_not_encode_leaves_the_buffer_as_it_was() {
        let cols = vec![Column::new("a", |r: &i64| *r)];
        let mut buf = RowBuffer::new();
        let before = buf.bytes();
        // `i64` does not encode as `int4`.
        assert!(buf.push(&cols, &[Type::INT4], &1).is_err());
        let texts = vec![Column::new("t", |r: &String| r.clone())];
        let err = buf.push(&texts, &[Type::TEXT], &"a\0b".to_string()).unwrap_err();
        assert!(err.contains("NUL"), "{err}");
        assert_eq!(buf.bytes(), before);
        assert_eq!(buf.rows(), 0);
    }

    #[test]
    fn origins_round_trip() {
        let o =
            vec![Origin { source: 1, partition: 2, offset: u64::MAX }, Origin { source: 0, partition: 9, offset: 3 }];
        assert_eq!(decode_origins(&encode_origins(&o)), o);
    }
}
