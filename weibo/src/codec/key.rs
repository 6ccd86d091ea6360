//! Keys: a stable, documented byte encoding and the routing hash over it.
//!
//! Every key type has one encoding, the same on every platform and release:
//!
//! | type | bytes |
//! | --- | --- |
//! | `u8`..`u128`, `usize` (as `u64`) | big-endian, fixed width |
//! | `i8`..`i128`, `isize` (as `i64`) | big-endian, fixed width, sign bit flipped |
//! | `bool` | one byte, `0` or `1` |
//! | `char` | its scalar value as `u32`, big-endian |
//! | `String`, `Vec<u8>` | the bytes, each `0x00` written as `0x00 0xFF`, then the terminator `0x00 0x00` |
//! | `[u8; N]` | the `N` bytes as they are |
//! | `Option<T>` | `0x00` for `None`; `0x01` then `T` for `Some` |
//! | tuples, structs (`#[derive(Key)]`) | the fields in declaration order, concatenated |
//! | enums (`#[derive(Key)]`) | the variant's index in declaration order as `u32` big-endian, then its fields |
//!
//! Every component is self-delimiting and sorts like the value it encodes, so
//! the encoding of a struct or tuple sorts like the value compared field by
//! field (for enums: by variant order, then fields). Floating-point numbers
//! are not keys: `0.0 == -0.0` and `NaN != NaN` have no stable byte identity.
//!
//! Keys route by [`key_hash`] (xxh3, seed 0, over the encoded bytes) into one
//! of a fixed number of key groups ([`key_group`]); `std::hash::Hash` is never
//! used for routing or anything persisted, because it is not stable across
//! Rust releases. (Keys also implement `Eq + Hash` so that in-memory state
//! can look them up without decoding bytes; that hash never leaves the
//! process.)

use crate::codec::schema::Shape;
use std::fmt;

/// A type that can key a stream: it has a stable byte encoding.
///
/// Derive it with `#[derive(Key)]` on structs, tuple structs and enums whose
/// fields are keys themselves, next to `Clone, PartialEq, Eq, Hash`; see the
/// [module documentation](self) for the byte layout.
///
/// ```
/// use weibo::Key;
///
/// #[derive(Clone, Debug, PartialEq, Eq, Hash, Key)]
/// struct CustomerId(u64);
///
/// let bytes = weibo::key::encode(&CustomerId(7));
/// assert_eq!(bytes, vec![0, 0, 0, 0, 0, 0, 0, 7]);
/// assert_eq!(weibo::key::decode::<CustomerId>(&bytes)?, CustomerId(7));
/// # Ok::<(), weibo::key::KeyDecodeError>(())
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as a key: it does not implement `weibo::Key`",
    label = "this is not a key type",
    note = "keys need a stable byte encoding for routing and state: integers, bool, char, String, byte arrays, Option and tuples of keys are keys; floats never are",
    note = "for your own type, add `#[derive(Clone, PartialEq, Eq, Hash, weibo::Key)]` (all its fields must be keys)"
)]
pub trait Key: Clone + Eq + std::hash::Hash + Send + Sync + 'static {
    /// Appends this key's bytes to `out`.
    fn encode_key(&self, out: &mut Vec<u8>);

    /// Reads one key from the front of `input` and advances it.
    ///
    /// # Errors
    /// [`KeyDecodeError`] when `input` ends early or holds bytes no value of
    /// this type encodes to.
    fn decode_key(input: &mut &[u8]) -> Result<Self, KeyDecodeError>;

    /// The layout of this key's encoding, which checkpoints record for
    /// keyed state (see [`crate::codec::schema`]): a key type changed
    /// under the same name is refused on restore, and one moved to another
    /// module restores. Weibo's key types and `#[derive(Key)]` say it;
    /// a hand-written `Key` impl that does not is known by its type name.
    fn key_schema() -> crate::codec::schema::Shape {
        crate::codec::schema::Shape::Opaque(std::any::type_name::<Self>().to_string())
    }

    /// [`key_hash`] of this key's encoding, which is left in `scratch`
    /// (cleared first) unless the type computes the hash without it:
    /// 64-bit integers do, as the router does it for every record on a
    /// hash edge. Never override it with anything else.
    #[doc(hidden)]
    #[inline]
    fn routing_hash(&self, scratch: &mut Vec<u8>) -> u64 {
        hash_of_encoding(self, scratch)
    }
}

/// [`key_hash`] of `key`'s encoding, written into `scratch` (cleared
/// first): [`Key::routing_hash`] of a type without a shortcut.
#[inline]
fn hash_of_encoding<K: Key>(key: &K, scratch: &mut Vec<u8>) -> u64 {
    scratch.clear();
    key.encode_key(scratch);
    key_hash(scratch)
}

/// The name of the key encoding, with its version, in codec identities.
pub const KEY_FORMAT: &str = "weibo-key/1";

/// Bytes that are not the encoding of the expected key type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDecodeError {
    /// The type that was being decoded.
    pub type_name: &'static str,
    /// What was wrong.
    pub reason: String,
}

impl KeyDecodeError {
    /// A new error for type `T`.
    pub fn new<T: ?Sized>(reason: impl Into<String>) -> Self {
        Self { type_name: std::any::type_name::<T>(), reason: reason.into() }
    }
}

impl fmt::Display for KeyDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot decode a key of type `{}`: {}", self.type_name, self.reason)
    }
}

impl std::error::Error for KeyDecodeError {}

/// The encoded bytes of `key`.
pub fn encode<K: Key>(key: &K) -> Vec<u8> {
    let mut out = Vec::new();
    key.encode_key(&mut out);
    out
}

/// Decodes a whole byte string as one key of type `K`.
///
/// # Errors
/// [`KeyDecodeError`] when the bytes are not one complete key of type `K`
/// (including trailing bytes).
pub fn decode<K: Key>(mut bytes: &[u8]) -> Result<K, KeyDecodeError> {
    let key = K::decode_key(&mut bytes)?;
    if bytes.is_empty() {
        Ok(key)
    } else {
        Err(KeyDecodeError::new::<K>(format!("{} trailing bytes after the key", bytes.len())))
    }
}

/// The stable routing hash of encoded key bytes: xxh3-64 with seed 0.
#[inline]
pub fn key_hash(bytes: &[u8]) -> u64 {
    match <[u8; 8]>::try_from(bytes) {
        // An 8-byte key (every 64-bit integer key): xxh3's own formula for
        // inputs of 4 to 8 bytes, inline (the library's entry point is a
        // call and a dispatch on the length, per record on a hash edge).
        Ok(eight) => xxh3_8(eight),
        Err(_) => xxhash_rust::xxh3::xxh3_64(bytes),
    }
}

/// xxh3-64 (seed 0, the default secret) of exactly 8 bytes:
/// `XXH3_len_4to8_64b` of the reference implementation.
#[inline]
fn xxh3_8(bytes: [u8; 8]) -> u64 {
    // The default secret's bytes 8..16 and 16..24, little-endian.
    const SECRET_8: u64 = 0x1cad_21f7_2c81_017c;
    const SECRET_16: u64 = 0xdb97_9083_e96d_d4de;
    const PRIME_MX2: u64 = 0x9fb2_1c65_1e98_df25;
    let [a, b, c, d, e, f, g, h] = bytes;
    let low = u32::from_le_bytes([a, b, c, d]);
    let high = u32::from_le_bytes([e, f, g, h]);
    let input = u64::from(high).wrapping_add(u64::from(low) << 32);
    let mut x = input ^ (SECRET_8 ^ SECRET_16);
    x ^= x.rotate_left(49) ^ x.rotate_left(24);
    x = x.wrapping_mul(PRIME_MX2);
    x ^= (x >> 35).wrapping_add(8);
    x = x.wrapping_mul(PRIME_MX2);
    x ^ (x >> 28)
}

/// The key group (in `0..max_key_groups`) of encoded key bytes.
#[inline]
pub fn key_group(bytes: &[u8], max_key_groups: u16) -> u16 {
    // `max_key_groups` is at least 1 (checked when a job is built).
    let groups = u64::from(max_key_groups.max(1));
    // The remainder is below `max_key_groups`, so it fits in u16.
    (key_hash(bytes) % groups) as u16
}

/// Takes `n` bytes from the front of `input`.
///
/// # Errors
/// [`KeyDecodeError`] naming `T` when fewer than `n` bytes are left.
pub fn take<'a, T: ?Sized>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], KeyDecodeError> {
    if input.len() < n {
        return Err(KeyDecodeError::new::<T>(format!("needed {n} bytes, only {} left", input.len())));
    }
    let (head, tail) = input.split_at(n);
    *input = tail;
    Ok(head)
}

fn take_array<const N: usize, T: ?Sized>(input: &mut &[u8]) -> Result<[u8; N], KeyDecodeError> {
    let bytes = take::<T>(input, N)?;
    let mut out = [0u8; N];
    out.copy_from_slice(bytes);
    Ok(out)
}

macro_rules! unsigned_key {
    ($($t:ty => $shape:ident),*) => {$(
        impl Key for $t {
            #[inline]
            fn encode_key(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_be_bytes());
            }
            #[inline]
            fn decode_key(input: &mut &[u8]) -> Result<Self, KeyDecodeError> {
                Ok(<$t>::from_be_bytes(take_array::<{ size_of::<$t>() }, $t>(input)?))
            }
            fn key_schema() -> Shape {
                Shape::$shape
            }
            #[inline]
            fn routing_hash(&self, scratch: &mut Vec<u8>) -> u64 {
                match <[u8; 8]>::try_from(&self.to_be_bytes()[..]) {
                    Ok(eight) => xxh3_8(eight),
                    Err(_) => hash_of_encoding(self, scratch),
                }
            }
        }
    )*};
}
unsigned_key!(u8 => U8, u16 => U16, u32 => U32, u64 => U64, u128 => U128);

macro_rules! signed_key {
    ($($t:ty => $u:ty, $shape:ident),*) => {$(
        impl Key for $t {
            #[inline]
            fn encode_key(&self, out: &mut Vec<u8>) {
                // Flipping the sign bit makes the unsigned big-endian order
                // equal to the signed order.
                let flipped = (*self as $u) ^ (1 << (<$u>::BITS - 1));
                out.extend_from_slice(&flipped.to_be_bytes());
            }
            #[inline]
            fn decode_key(input: &mut &[u8]) -> Result<Self, KeyDecodeError> {
                let raw = <$u>::from_be_bytes(take_array::<{ size_of::<$u>() }, $t>(input)?);
                Ok((raw ^ (1 << (<$u>::BITS - 1))) as $t)
            }
            fn key_schema() -> Shape {
                Shape::$shape
            }
            #[inline]
            fn routing_hash(&self, scratch: &mut Vec<u8>) -> u64 {
                let flipped = (*self as $u) ^ (1 << (<$u>::BITS - 1));
                match <[u8; 8]>::try_from(&flipped.to_be_bytes()[..]) {
                    Ok(eight) => xxh3_8(eight),
                    Err(_) => hash_of_encoding(self, scratch),
                }
            }
        }
    )*};
}
signed_key!(i8 => u8, I8, i16 => u16, I16, i32 => u32, I32, i64 => u64, I64, i128 => u128, I128);

impl Key for usize {
    fn encode_key(&self, out: &mut Vec<u8>) {
        (*self as u64).encode_key(out);
    }
    #[inline]
    fn routing_hash(&self, scratch: &mut Vec<u8>) -> u64 {
        (*self as u64).routing_hash(scratch)
    }
    fn decode_key(input: &mut &[u8]) -> Result<Self, KeyDecodeError> {
        let v = u64::decode_key(input)?;
        usize::try_from(v).map_err(|_| KeyDecodeError::new::<usize>(format!("{v} does not fit in usize")))
    }
    fn key_schema() -> Shape {
        Shape::U64
    }
}

impl Key for isize {
    fn encode_key(&self, out: &mut Vec<u8>) {
        (*self as i64).encode_key(out);
    }
    #[inline]
    fn routing_hash(&self, scratch: &mut Vec<u8>) -> u64 {
        (*self as i64).routing_hash(scratch)
    }
    fn decode_key(input: &mut &[u8]) -> Result<Self, KeyDecodeError> {
        let v = i64::decode_key(input)?;
        isize::try_from(v).map_err(|_| KeyDecodeError::new::<isize>(format!("{v} does not fit in isize")))
    }
    fn key_schema() -> Shape {
        Shape::I64
    }
}

impl Key for bool {
    fn encode_key(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
    fn decode_key(input: &mut &[u8]) -> Result<Self, KeyDecodeError> {
        match take::<bool>(input, 1)? {
            [0] => Ok(false),
            [1] => Ok(true),
            other => Err(KeyDecodeError::new::<bool>(format!("byte {other:?} is neither 0 nor 1"))),
        }
    }
    fn key_schema() -> Shape {
        Shape::Bool
    }
}

impl Key for char {
    fn encode_key(&self, out: &mut Vec<u8>) {
        u32::from(*self).encode_key(out);
    }
    fn decode_key(input: &mut &[u8]) -> Result<Self, KeyDecodeError> {
        let v = u32::decode_key(input)?;
        char::from_u32(v).ok_or_else(|| KeyDecodeError::new::<char>(format!("{v:#x} is not a Unicode scalar value")))
    }
    fn key_schema() -> Shape {
        Shape::Char
    }
}

/// Writes `bytes` escaped (`0x00` → `0x00 0xFF`) and terminated by
/// `0x00 0x00`. The terminator sorts below every escaped byte, so a string
/// sorts before its extensions, and it cannot be confused with an escape
/// whatever follows it.
pub fn encode_escaped(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&[0, 0]);
}

/// Reads an escaped, terminated byte string written by [`encode_escaped`].
///
/// # Errors
/// [`KeyDecodeError`] naming `T` when the terminator is missing or an escape
/// is malformed.
pub fn decode_escaped<T: ?Sized>(input: &mut &[u8]) -> Result<Vec<u8>, KeyDecodeError> {
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        match (input.get(i), input.get(i + 1)) {
            (None, _) | (Some(0), None) => return Err(KeyDecodeError::new::<T>("unterminated byte string")),
            (Some(0), Some(0xFF)) => {
                out.push(0);
                i += 2;
            }
            (Some(0), Some(0)) => {
                *input = input.get(i + 2..).unwrap_or_default();
                return Ok(out);
            }
            (Some(0), Some(other)) => {
                return Err(KeyDecodeError::new::<T>(format!("invalid escape 0x00 {other:#04x} in byte string")));
            }
            (Some(&b), _) => {
                out.push(b);
                i += 1;
            }
        }
    }
}

impl Key for String {
    fn encode_key(&self, out: &mut Vec<u8>) {
        encode_escaped(self.as_bytes(), out);
    }
    fn decode_key(input: &mut &[u8]) -> Result<Self, KeyDecodeError> {
        let bytes = decode_escaped::<String>(input)?;
        String::from_utf8(bytes).map_err(|e| KeyDecodeError::new::<String>(format!("not UTF-8: {e}")))
    }
    fn key_schema() -> Shape {
        Shape::Str
    }
}

impl Key for Vec<u8> {
    fn encode_key(&self, out: &mut Vec<u8>) {
        encode_escaped(self, out);
    }
    fn decode_key(input: &mut &[u8]) -> Result<Self, KeyDecodeError> {
        decode_escaped::<Vec<u8>>(input)
    }
    fn key_schema() -> Shape {
        Shape::Bytes
    }
}

impl<const N: usize> Key for [u8; N] {
    fn encode_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn decode_key(input: &mut &[u8]) -> Result<Self, KeyDecodeError> {
        take_array::<N, [u8; N]>(input)
    }
    fn key_schema() -> Shape {
        Shape::Tuple(vec![Shape::U8; N])
    }
}

impl<T: Key> Key for Option<T> {
    fn encode_key(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.encode_key(out);
            }
        }
    }
    fn decode_key(input: &mut &[u8]) -> Result<Self, KeyDecodeError> {
        match take::<Self>(input, 1)? {
            [0] => Ok(None),
            [1] => Ok(Some(T::decode_key(input)?)),
            other => Err(KeyDecodeError::new::<Self>(format!("option tag {other:?} is neither 0 nor 1"))),
        }
    }
    fn key_schema() -> Shape {
        Shape::Option(Box::new(T::key_schema()))
    }
}

impl Key for () {
    fn encode_key(&self, _out: &mut Vec<u8>) {}
    fn decode_key(_input: &mut &[u8]) -> Result<Self, KeyDecodeError> {
        Ok(())
    }
    fn key_schema() -> Shape {
        Shape::Unit
    }
}

macro_rules! tuple_key {
    ($(($($n:tt $t:ident),+)),*) => {$(
        impl<$($t: Key),+> Key for ($($t,)+) {
            fn encode_key(&self, out: &mut Vec<u8>) {
                $(self.$n.encode_key(out);)+
            }
            fn decode_key(input: &mut &[u8]) -> Result<Self, KeyDecodeError> {
                Ok(($($t::decode_key(input)?,)+))
            }
            fn key_schema() -> Shape {
                Shape::Tuple(vec![$($t::key_schema()),+])
            }
        }
    )*};
}
tuple_key!((0 A), (0 A, 1 B), (0 A, 1 B, 2 C), (0 A, 1 B, 2 C, 3 D), (0 A, 1 B, 2 C, 3 D, 4 E));

/// Reads an enum's variant index, for `#[derive(Key)]` on enums.
///
/// # Errors
/// [`KeyDecodeError`] naming `T` when fewer than four bytes are left.
#[doc(hidden)]
pub fn decode_variant<T: ?Sized>(input: &mut &[u8]) -> Result<u32, KeyDecodeError> {
    Ok(u32::from_be_bytes(take_array::<4, T>(input)?))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_inline_hash_of_8_bytes_is_xxh3s() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in 0..100_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            for bytes in [x.to_be_bytes(), i.to_be_bytes(), (u64::MAX - i).to_le_bytes()] {
                assert_eq!(key_hash(&bytes), xxhash_rust::xxh3::xxh3_64(&bytes), "{bytes:?}");
            }
        }
    }

    /// A key's routing hash is the hash of its encoding, whichever way
    /// the type computes it (64-bit integers without encoding).
    fn routing_hash_is_the_encodings<K: Key + fmt::Debug>(k: K) {
        let mut scratch = vec![9, 9];
        assert_eq!(k.routing_hash(&mut scratch), key_hash(&encode(&k)), "{k:?}");
    }

    #[test]
    fn every_routing_hash_is_the_hash_of_the_encoding() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..10_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            routing_hash_is_the_encodings(x);
            routing_hash_is_the_encodings(x as i64);
            routing_hash_is_the_encodings(x as usize);
            routing_hash_is_the_encodings(x as isize);
            routing_hash_is_the_encodings(x as u32);
            routing_hash_is_the_encodings(x as i32);
            routing_hash_is_the_encodings(x as u8);
            routing_hash_is_the_encodings(u128::from(x) << 3);
            routing_hash_is_the_encodings(-(i128::from(x)));
            routing_hash_is_the_encodings((x, x as u16));
            routing_hash_is_the_encodings(x.to_string());
        }
        for k in [0u64, 1, u64::MAX, 1 << 63] {
            routing_hash_is_the_encodings(k);
            routing_hash_is_the_encodings(k as i64);
        }
    }

    const PINNED_HASH_42: u64 = 3_337_142_596_522_283_180;
    const PINNED_HASH_EMPTY: u64 = 0x2D06_8005_38D3_94C2; // the published xxh3-64 of ""

    fn roundtrip<K: Key + PartialEq + fmt::Debug>(k: K) {
        let bytes = encode(&k);
        assert_eq!(decode::<K>(&bytes).unwrap(), k);
    }

    #[test]
    fn documented_layouts() {
        assert_eq!(encode(&7u32), vec![0, 0, 0, 7]);
        assert_eq!(encode(&-1i16), vec![0x7F, 0xFF]);
        assert_eq!(encode(&0i16), vec![0x80, 0x00]);
        assert_eq!(encode(&true), vec![1]);
        assert_eq!(encode(&'A'), vec![0, 0, 0, 0x41]);
        assert_eq!(encode(&"a\0b".to_string()), vec![b'a', 0, 0xFF, b'b', 0, 0]);
        assert_eq!(encode(&[1u8, 2]), vec![1, 2]);
        assert_eq!(encode(&Some(1u8)), vec![1, 1]);
        assert_eq!(encode(&(1u8, "x".to_string())), vec![1, b'x', 0, 0]);
        // A string followed by a field starting with 0xFF stays unambiguous.
        assert_eq!(decode::<(String, u16)>(&encode(&(String::new(), 0xFF00u16))).unwrap(), (String::new(), 0xFF00));
    }

    #[test]
    fn the_routing_hash_is_pinned() {
        // Part of the routing and on-disk contract: if these change, every
        // key moves to another key group and saved state no longer matches.
        assert_eq!(key_hash(&encode(&42u64)), PINNED_HASH_42);
        assert_eq!(key_hash(b""), PINNED_HASH_EMPTY);
        assert_eq!(key_group(&encode(&42u64), 128), (PINNED_HASH_42 % 128) as u16);
    }

    #[test]
    fn bad_bytes_are_refused_with_the_type_name() {
        let err = decode::<u32>(&[1, 2]).unwrap_err();
        assert!(err.to_string().contains("u32"), "{err}");
        assert!(decode::<bool>(&[7]).is_err());
        assert!(decode::<String>(b"a").is_err());
        assert!(decode::<u8>(&[1, 2]).unwrap_err().reason.contains("trailing"));
    }

    proptest! {
        #[test]
        fn integers_roundtrip_and_keep_order(a: i64, b: i64) {
            roundtrip(a);
            prop_assert_eq!(a.cmp(&b), encode(&a).cmp(&encode(&b)));
        }

        #[test]
        fn strings_roundtrip_and_keep_order(a: String, b: String) {
            roundtrip(a.clone());
            prop_assert_eq!(a.cmp(&b), encode(&a).cmp(&encode(&b)));
        }

        #[test]
        fn bytes_with_zeros_keep_order(a: Vec<u8>, b: Vec<u8>) {
            roundtrip(a.clone());
            prop_assert_eq!(a.cmp(&b), encode(&a).cmp(&encode(&b)));
        }

        #[test]
        fn tuples_keep_order(a: (String, u16), b: (String, u16)) {
            roundtrip(a.clone());
            prop_assert_eq!(a.cmp(&b), encode(&a).cmp(&encode(&b)));
        }
    }
}
