//! How record values become bytes in Kafka, and back.

use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Turns values into Kafka payloads and payloads into values.
///
/// A record without a payload (a tombstone) is decoded from an empty slice.
pub trait Format<T>: Send + Sync + 'static {
    /// A short name for error messages (`"JSON"`).
    fn name(&self) -> &'static str;

    /// Decodes a payload.
    ///
    /// # Errors
    /// A description of what is wrong with `bytes`.
    fn decode(&self, bytes: &[u8]) -> Result<T, String>;

    /// Appends the payload of `value` to `out`.
    ///
    /// # Errors
    /// A description of why `value` cannot be encoded.
    fn encode(&self, value: &T, out: &mut Vec<u8>) -> Result<(), String>;
}

/// JSON through serde (one document per record).
#[derive(Clone, Copy, Debug, Default)]
pub struct Json;

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> Format<T> for Json {
    fn name(&self) -> &'static str {
        "JSON"
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }

    fn encode(&self, value: &T, out: &mut Vec<u8>) -> Result<(), String> {
        serde_json::to_writer(out, value).map_err(|e| e.to_string())
    }
}

/// The payload's bytes as they are (`Vec<u8>`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Bytes;

impl Format<Vec<u8>> for Bytes {
    fn name(&self) -> &'static str {
        "bytes"
    }

    fn decode(&self, bytes: &[u8]) -> Result<Vec<u8>, String> {
        Ok(bytes.to_vec())
    }

    fn encode(&self, value: &Vec<u8>, out: &mut Vec<u8>) -> Result<(), String> {
        out.extend_from_slice(value);
        Ok(())
    }
}

/// UTF-8 text (`String`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Text;

impl Format<String> for Text {
    fn name(&self) -> &'static str {
        "UTF-8 text"
    }

    fn decode(&self, bytes: &[u8]) -> Result<String, String> {
        String::from_utf8(bytes.to_vec()).map_err(|e| format!("not UTF-8: {e}"))
    }

    fn encode(&self, value: &String, out: &mut Vec<u8>) -> Result<(), String> {
        out.extend_from_slice(value.as_bytes());
        Ok(())
    }
}

/// Weibo's own codec of the type ([`weibo::Data`]: postcard for serde
/// types, rkyv for `#[derive(RkyvData)]` types): compact, for topics only
/// Weibo jobs read.
pub struct Native<T>(PhantomData<fn() -> T>);

impl<T> Native<T> {
    /// The format of `T`.
    pub fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Default for Native<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for Native<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T> std::fmt::Debug for Native<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Native")
    }
}

impl<T: weibo::Data> Format<T> for Native<T> {
    fn name(&self) -> &'static str {
        "Weibo codec"
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, String> {
        T::decode(bytes).map_err(|e| e.to_string())
    }

    fn encode(&self, value: &T, out: &mut Vec<u8>) -> Result<(), String> {
        value.encode(out).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
    struct Click {
        user: String,
        n: u32,
    }

    #[test]
    fn formats_round_trip() {
        let c = Click { user: "ann".into(), n: 3 };
        let mut buf = Vec::new();
        Json.encode(&c, &mut buf).unwrap();
        assert_eq!(buf, br#"{"user":"ann","n":3}"#);
        assert_eq!(Format::<Click>::decode(&Json, &buf).unwrap(), c);
        buf.clear();
        Native::<Click>::new().encode(&c, &mut buf).unwrap();
        assert_eq!(Native::<Click>::new().decode(&buf).unwrap(), c);
        assert_eq!(Text.decode(b"hi").unwrap(), "hi");
        assert!(Text.decode(&[0xff]).is_err());
        assert!(Format::<Click>::decode(&Json, b"{").unwrap_err().contains("EOF"));
    }
}
