//! The book's "Codecs" chapter: the postcard codec every serde type gets,
//! the rkyv codec a type can derive instead, and where a pipeline needs one.
//!
//! Run it with `cargo run -p weibo-examples --example book_codecs`.

// ANCHOR: imports
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use weibo::prelude::*;
// ANCHOR_END: imports

// ANCHOR: types
/// A value type: serde derives give it the postcard codec.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Click {
    user: UserId,
    page: String,
}

/// A key type: `Key` for routing and state, serde because it is also part of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Key, Serialize, Deserialize)]
struct UserId(u64);
// ANCHOR_END: types

// ANCHOR: rkyv_types
/// A value type with the rkyv codec: the rkyv derives and `weibo::RkyvData`, no serde.
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, weibo::RkyvData)]
struct Reading {
    sensor: SensorId,
    millivolts: Vec<i32>,
}

/// Its key: `Key` for routing and state, the rkyv derives because it is also part of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Key, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct SensorId(u32);
// ANCHOR_END: rkyv_types

fn main() -> Result<(), Box<dyn std::error::Error>> {
    roundtrip()?;
    rkyv_roundtrip()?;
    pipeline()?;
    rkyv_pipeline()?;
    Ok(())
}

// ANCHOR: roundtrip
fn roundtrip() -> Result<(), weibo::codec::CodecError> {
    let click = Click { user: UserId(7), page: "/home".into() };
    let mut bytes = Vec::new();
    click.encode(&mut bytes)?;
    assert_eq!(bytes, [7, 5, b'/', b'h', b'o', b'm', b'e']); // varint 7, length 5, the bytes
    assert_eq!(Click::decode(&bytes)?, click);

    let id = Click::codec_id();
    assert_eq!(id.format, "serde-postcard/1");
    assert_eq!(id.to_string(), "serde-postcard/1<book_codecs::Click>"); // format and type
    Ok(())
}
// ANCHOR_END: roundtrip

// ANCHOR: rkyv_roundtrip
fn rkyv_roundtrip() -> Result<(), Box<dyn std::error::Error>> {
    let reading = Reading { sensor: SensorId(3), millivolts: vec![1200, -40] };
    let mut bytes = Vec::new();
    reading.encode(&mut bytes)?;
    assert_eq!(Reading::decode(&bytes)?, reading); // validated, then deserialized

    let id = Reading::codec_id();
    assert_eq!(id.format, "rkyv-0.8/1");
    assert_eq!(id.to_string(), "rkyv-0.8/1<book_codecs::Reading>");

    // Bytes that are not a valid archive are refused, never misread.
    bytes.truncate(bytes.len() / 2);
    let err = Reading::decode(&bytes).err().ok_or("truncated bytes should not decode")?;
    assert_eq!(err.codec, id);
    Ok(())
}
// ANCHOR_END: rkyv_roundtrip

// ANCHOR: pipeline
fn pipeline() -> weibo::Result<()> {
    let pages = CollectSink::new();
    let job = Job::new("pages-per-user");
    job.source(IterSource::new(vec![
        Click { user: UserId(1), page: "/".into() },
        Click { user: UserId(1), page: "/cart".into() },
    ]))
    .map(|c: Click| (c.user, c.page)) // fused: no codec involved
    .key_by(|(user, _): &(UserId, String)| *user) // the value crosses a shuffle edge: `(UserId, String): Data`
    .fold(Vec::new, |seen: &mut Vec<String>, (_, page)| seen.push(page)) // the accumulator is state: `Vec<String>: Data`
    .sink(pages.clone());
    println!("{job}");
    job.run_blocking()?;
    assert_eq!(pages.values().last(), Some(&(UserId(1), vec!["/".to_string(), "/cart".to_string()])));
    Ok(())
}
// ANCHOR_END: pipeline

// ANCHOR: rkyv_pipeline
fn rkyv_pipeline() -> weibo::Result<()> {
    let sums = CollectSink::new();
    let job = Job::new("millivolts-per-sensor");
    job.source(IterSource::new(vec![
        Reading { sensor: SensorId(1), millivolts: vec![3, 4] },
        Reading { sensor: SensorId(2), millivolts: vec![10] },
        Reading { sensor: SensorId(1), millivolts: vec![5] },
    ]))
    .key_by(|r: &Reading| r.sensor) // `Reading` crosses the shuffle edge with its rkyv codec
    .with_partitions(2)
    // The accumulator is state: an `i64`, with the postcard codec. A job can mix both codecs.
    .fold(|| 0i64, |sum: &mut i64, r: Reading| *sum += i64::from(r.millivolts.iter().sum::<i32>()))
    .sink(sums.clone());
    println!("{job}");
    assert!(job.to_string().contains("hash(SensorId) [rkyv-0.8/1]"));
    job.run_blocking()?;

    let last: BTreeMap<u32, i64> = sums.values().into_iter().map(|(sensor, sum)| (sensor.0, sum)).collect();
    assert_eq!(last, BTreeMap::from([(1, 12), (2, 10)]));
    Ok(())
}
// ANCHOR_END: rkyv_pipeline
