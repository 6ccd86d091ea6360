//! The codecs of what windows keep in state: all of a window's records
//! (`Elements`) and a key's sessions (`Sessions`).

use super::Window;
use crate::codec::{CodecError, CodecId, Data};

/// A window's contents, for window functions (`process`) that need every
/// element. Encoded as a count followed by each element's length and
/// encoding, with the element type's own codec.
///
/// ```
/// use weibo::Data;
/// use weibo::window::Elements;
/// let kept = Elements(vec!["a".to_string(), "bc".to_string()]);
/// let mut bytes = Vec::new();
/// kept.encode(&mut bytes)?;
/// assert_eq!(Elements::<String>::decode(&bytes)?, kept);
/// # Ok::<(), weibo::codec::CodecError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Elements<T>(pub Vec<T>);

pub(super) fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(super) fn get_varint(input: &mut &[u8], codec: CodecId) -> std::result::Result<u64, CodecError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let Some((&b, rest)) = input.split_first() else {
            return Err(CodecError { codec, reason: "input ends inside a length".into() });
        };
        *input = rest;
        v |= u64::from(b & 0x7F) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(CodecError { codec, reason: "a length is longer than 64 bits".into() })
}

pub(super) fn get_bytes<'a>(input: &mut &'a [u8], codec: CodecId) -> std::result::Result<&'a [u8], CodecError> {
    let n = usize::try_from(get_varint(input, codec)?).unwrap_or(usize::MAX);
    if input.len() < n {
        return Err(CodecError { codec, reason: format!("an element needs {n} bytes, {} left", input.len()) });
    }
    let (head, tail) = input.split_at(n);
    *input = tail;
    Ok(head)
}

pub(super) fn put_element<T: Data>(
    v: &T,
    out: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
) -> std::result::Result<(), CodecError> {
    scratch.clear();
    v.encode(scratch)?;
    put_varint(scratch.len() as u64, out);
    out.extend_from_slice(scratch);
    Ok(())
}

impl<T: Data> Data for Elements<T> {
    fn codec_id() -> CodecId {
        CodecId::new("weibo-elements/1", std::any::type_name::<Self>())
    }

    fn schema() -> std::sync::Arc<crate::codec::schema::Schema> {
        use crate::codec::schema::{Schema, Shape};
        let fields = vec![(String::new(), Shape::Seq(Box::new(T::schema().shape.clone())))];
        std::sync::Arc::new(Schema { shape: Shape::Struct { name: "Elements".into(), fields } })
    }

    fn encode(&self, out: &mut Vec<u8>) -> std::result::Result<(), CodecError> {
        put_varint(self.0.len() as u64, out);
        let mut scratch = Vec::new();
        self.0.iter().try_for_each(|v| put_element(v, out, &mut scratch))
    }

    fn decode(mut bytes: &[u8]) -> std::result::Result<Self, CodecError> {
        let codec = Self::codec_id();
        let n = get_varint(&mut bytes, codec)?;
        let mut values = Vec::with_capacity(usize::try_from(n.min(1 << 16)).unwrap_or(0));
        for _ in 0..n {
            values.push(T::decode(get_bytes(&mut bytes, codec)?)?);
        }
        if !bytes.is_empty() {
            return Err(CodecError { codec, reason: format!("{} trailing bytes", bytes.len()) });
        }
        Ok(Elements(values))
    }
}

/// One key's open sessions, sorted by start, pairwise apart.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sessions<A>(pub(crate) Vec<(Window, A)>);

impl<A: Data> Data for Sessions<A> {
    fn codec_id() -> CodecId {
        CodecId::new("weibo-sessions/1", std::any::type_name::<Self>())
    }

    fn schema() -> std::sync::Arc<crate::codec::schema::Schema> {
        use crate::codec::schema::{Schema, Shape};
        let window = Shape::Struct {
            name: "Window".into(),
            fields: vec![("start".into(), Shape::I64), ("end".into(), Shape::I64)],
        };
        let session = Shape::Tuple(vec![window, A::schema().shape.clone()]);
        let fields = vec![(String::new(), Shape::Seq(Box::new(session)))];
        std::sync::Arc::new(Schema { shape: Shape::Struct { name: "Sessions".into(), fields } })
    }

    fn encode(&self, out: &mut Vec<u8>) -> std::result::Result<(), CodecError> {
        put_varint(self.0.len() as u64, out);
        let mut scratch = Vec::new();
        for (w, acc) in &self.0 {
            out.extend_from_slice(&w.start.to_be_bytes());
            out.extend_from_slice(&w.end.to_be_bytes());
            put_element(acc, out, &mut scratch)?;
        }
        Ok(())
    }

    fn decode(mut bytes: &[u8]) -> std::result::Result<Self, CodecError> {
        let codec = Self::codec_id();
        let n = get_varint(&mut bytes, codec)?;
        let mut sessions = Vec::new();
        for _ in 0..n {
            let mut time = || -> std::result::Result<i64, CodecError> {
                let (head, tail) = bytes
                    .split_first_chunk::<8>()
                    .ok_or_else(|| CodecError { codec, reason: "input ends inside a window".into() })?;
                bytes = tail;
                Ok(i64::from_be_bytes(*head))
            };
            let (start, end) = (time()?, time()?);
            sessions.push((Window { start, end }, A::decode(get_bytes(&mut bytes, codec)?)?));
        }
        if !bytes.is_empty() {
            return Err(CodecError { codec, reason: format!("{} trailing bytes", bytes.len()) });
        }
        Ok(Sessions(sessions))
    }
}
