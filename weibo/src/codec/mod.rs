//! Codecs: how values cross shuffle edges and enter state.
//!
//! A value type needs one codec, given by the [`Data`] trait. Every type that
//! derives `serde::Serialize` and `serde::Deserialize` (and `Clone`) has one
//! through a blanket impl, using postcard (compact, varint-based). Types that
//! want rkyv instead derive `rkyv::Archive`, `rkyv::Serialize`,
//! `rkyv::Deserialize` and [`weibo::RkyvData`](crate::RkyvData).
//!
//! Every edge records the [`CodecId`] of what its sender encodes and of what
//! its receiver decodes; the plan refuses a graph where they differ.

pub mod key;
pub mod schema;

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The format name of the serde codec.
pub const SERDE_POSTCARD_FORMAT: &str = "serde-postcard/1";
/// The format name of the rkyv codec.
pub const RKYV_FORMAT: &str = "rkyv-0.8/1";

/// Identity of a codec: its format and the type it encodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CodecId {
    /// The wire format, with its version (for example `serde-postcard/1`).
    pub format: &'static str,
    /// The encoded type's name.
    pub type_name: &'static str,
}

impl CodecId {
    /// A codec identity.
    pub const fn new(format: &'static str, type_name: &'static str) -> Self {
        Self { format, type_name }
    }
}

impl fmt::Display for CodecId {
    /// `format<type>`, the type named as checkpoints record it (with
    /// Weibo's own types that moved inside the crate named where they were
    /// first defined, so that a checkpoint of an earlier build still
    /// restores).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}<{}>", self.format, recorded_type_name(self.type_name))
    }
}

/// Weibo's own types that moved inside the crate, by the name
/// `std::any::type_name` gives now and the name checkpoints record for
/// them: the path where they were first defined, which is also their
/// public path.
const MOVED_TYPES: &[(&str, &str)] = &[
    ("weibo::operator::policy::DeadLetter", "weibo::stream::DeadLetter"),
    ("weibo::operator::windows::WindowResult", "weibo::window::WindowResult"),
    ("weibo::operator::windows::Window", "weibo::window::Window"),
    ("weibo::operator::windows::contents::Elements", "weibo::window::Elements"),
    ("weibo::operator::windows::contents::Sessions", "weibo::window::Sessions"),
    ("weibo::operator::windows::aligned::FiredUpTo", "weibo::window::FiredUpTo"),
];

/// A type's name as checkpoints record it (in codec identities and the
/// graph's fingerprint): `std::any::type_name`'s, with Weibo's own types
/// that moved inside the crate named where they were first defined, so
/// that a checkpoint of an earlier build still restores. Type names in
/// checkpoints are replaced by schema descriptors later; until then this
/// list grows whenever a type that can appear in a checkpoint moves.
pub(crate) fn recorded_type_name(name: &str) -> std::borrow::Cow<'_, str> {
    if !name.contains("weibo::operator::") {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    'outer: while !rest.is_empty() {
        for (now, recorded) in MOVED_TYPES {
            if let Some(after) = rest.strip_prefix(now)
                && !after.starts_with(|c: char| c.is_alphanumeric() || c == '_')
            {
                out.push_str(recorded);
                rest = after;
                continue 'outer;
            }
        }
        let mut chars = rest.chars();
        if let Some(c) = chars.next() {
            out.push(c);
        }
        rest = chars.as_str();
    }
    std::borrow::Cow::Owned(out)
}

/// A value could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError {
    /// The codec that failed.
    pub codec: CodecId,
    /// What went wrong.
    pub reason: String,
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "codec {} failed: {}", self.codec, self.reason)
    }
}

impl std::error::Error for CodecError {}

/// A value type that Weibo can move between nodes and keep in state: it has
/// a codec. (Sinks ask for what they need themselves: `Debug` for `Stdout`,
/// `serde::Serialize` for `FileSink`.)
///
/// Implemented for every `Clone + Send + serde::Serialize +
/// serde::DeserializeOwned` type (postcard encoding), and by
/// `#[derive(weibo::RkyvData)]` for rkyv types.
///
/// ```
/// use weibo::Data;
///
/// #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
/// struct Order { customer: u64, amount_cents: i64 }
///
/// let mut bytes = Vec::new();
/// Order { customer: 1, amount_cents: 250 }.encode(&mut bytes)?;
/// assert_eq!(Order::decode(&bytes)?, Order { customer: 1, amount_cents: 250 });
/// # Ok::<(), weibo::codec::CodecError>(())
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no codec, so it cannot cross a shuffle edge or be kept in state",
    label = "this type needs a codec",
    note = "add `#[derive(Clone, serde::Serialize, serde::Deserialize)]` to `{Self}` (postcard codec), or derive `rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, weibo::RkyvData` (rkyv codec)"
)]
pub trait Data: Clone + Send + Sync + 'static {
    /// The identity of this type's codec.
    fn codec_id() -> CodecId;

    /// Appends the encoding of `self` to `out`.
    ///
    /// # Errors
    /// [`CodecError`] when the value cannot be represented (for example a
    /// serde impl that refuses it).
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), CodecError>;

    /// Decodes one value from exactly `bytes`.
    ///
    /// # Errors
    /// [`CodecError`] when `bytes` are not an encoding of this type.
    fn decode(bytes: &[u8]) -> Result<Self, CodecError>;

    /// The layout of this type's values, which checkpoints record for the
    /// state it is kept in (see [`schema`]): traced from the serde impl
    /// for the postcard codec; for other codecs, unless they say more, the
    /// type's name.
    fn schema() -> std::sync::Arc<schema::Schema> {
        std::sync::Arc::new(schema::Schema { shape: schema::Shape::Opaque(std::any::type_name::<Self>().to_string()) })
    }

    /// Whether values of this type read back as written: checked before a
    /// state of this type is opened, so that no checkpoint is ever
    /// written that cannot be restored. For the postcard codec, samples
    /// of the type are written and read back (see the Codecs chapter for
    /// the serde attributes postcard cannot express); other codecs, unless
    /// they say more, are trusted.
    ///
    /// # Errors
    /// Why they do not, as a sentence about the type's values.
    fn check_round_trip() -> Result<(), String> {
        Ok(())
    }
}

impl<T> Data for T
where
    T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
{
    fn codec_id() -> CodecId {
        CodecId::new(SERDE_POSTCARD_FORMAT, std::any::type_name::<T>())
    }

    fn schema() -> std::sync::Arc<schema::Schema> {
        schema::Schema::of::<T>()
    }

    fn check_round_trip() -> Result<(), String> {
        schema::postcard_round_trip::<T>()
    }

    #[inline]
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        let start = out.len();
        postcard::serialize_with_flavor(self, AppendFlavor(out)).map_err(|e| {
            out.truncate(start);
            CodecError { codec: Self::codec_id(), reason: e.to_string() }
        })
    }

    #[inline]
    fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        match postcard::take_from_bytes::<T>(bytes) {
            Ok((value, [])) => Ok(value),
            Ok((_, rest)) => Err(CodecError {
                codec: Self::codec_id(),
                reason: format!("{} trailing bytes after the value", rest.len()),
            }),
            Err(e) => Err(CodecError { codec: Self::codec_id(), reason: e.to_string() }),
        }
    }
}

/// A postcard output that appends to a `Vec`, copying short pieces (varints,
/// small strings) byte by byte instead of through a `memcpy` call.
struct AppendFlavor<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for AppendFlavor<'_> {
    type Output = ();

    #[inline]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    #[inline]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        if data.len() <= 16 {
            self.0.reserve(data.len());
            for &b in data {
                self.0.push(b);
            }
        } else {
            self.0.extend_from_slice(data);
        }
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

type RkyvSerializer<'a> =
    rkyv::api::high::HighSerializer<rkyv::util::AlignedVec, rkyv::ser::allocator::ArenaHandle<'a>, rkyv::rancor::Error>;

/// Encodes with rkyv; used by `#[derive(RkyvData)]`.
///
/// # Errors
/// [`CodecError`] when rkyv refuses the value.
pub fn rkyv_encode<T>(value: &T, out: &mut Vec<u8>) -> Result<(), CodecError>
where
    T: for<'a> rkyv::Serialize<RkyvSerializer<'a>>,
{
    let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(value).map_err(|e| CodecError {
        codec: CodecId::new(RKYV_FORMAT, std::any::type_name::<T>()),
        reason: e.to_string(),
    })?;
    out.extend_from_slice(&bytes);
    Ok(())
}

/// Decodes with rkyv (validated); used by `#[derive(RkyvData)]`.
///
/// The bytes are copied into an aligned buffer first: bytes inside a batch
/// or a file are not aligned for the archived type, and rkyv must never
/// read unaligned memory.
///
/// # Errors
/// [`CodecError`] when validation fails.
pub fn rkyv_decode<T>(bytes: &[u8]) -> Result<T, CodecError>
where
    T: rkyv::Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>
        + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
{
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len());
    aligned.extend_from_slice(bytes);
    rkyv::from_bytes::<T, rkyv::rancor::Error>(&aligned)
        .map_err(|e| CodecError { codec: CodecId::new(RKYV_FORMAT, std::any::type_name::<T>()), reason: e.to_string() })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn serde_codec_roundtrips_and_rejects_garbage() {
        let mut out = Vec::new();
        (7u64, "x".to_string()).encode(&mut out).unwrap();
        assert_eq!(<(u64, String)>::decode(&out).unwrap(), (7, "x".to_string()));
        let err = <(u64, String)>::decode(&[0xFF]).unwrap_err();
        assert_eq!(err.codec.format, SERDE_POSTCARD_FORMAT);
        out.push(0);
        assert!(<(u64, String)>::decode(&out).unwrap_err().reason.contains("trailing"));
    }
}

#[cfg(test)]
mod recorded_name_tests {
    use super::recorded_type_name;

    #[test]
    fn moved_types_keep_the_names_checkpoints_recorded() {
        assert_eq!(
            recorded_type_name("weibo::operator::windows::WindowResult<u64, (weibo::operator::windows::Window, u8)>"),
            "weibo::window::WindowResult<u64, (weibo::window::Window, u8)>"
        );
        assert_eq!(recorded_type_name("weibo::operator::policy::DeadLetter<u32>"), "weibo::stream::DeadLetter<u32>");
        assert_eq!(
            recorded_type_name("weibo::operator::windows::contents::Elements<alloc::string::String>"),
            "weibo::window::Elements<alloc::string::String>"
        );
        // Only whole names: a longer name that starts the same is not one.
        assert_eq!(recorded_type_name("weibo::operator::windows::WindowFoo"), "weibo::operator::windows::WindowFoo");
        assert_eq!(recorded_type_name("my_crate::Order"), "my_crate::Order");
    }
}
