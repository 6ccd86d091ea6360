//! The book's "Keys" chapter: deriving `Key`, the byte encoding, its order,
//! and keying a stream by a composite key.
//!
//! Run it with `cargo run -p weibo-examples --example book_keys`.

// ANCHOR: imports
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use weibo::key::{decode, encode};
use weibo::prelude::*;
// ANCHOR_END: imports

// ANCHOR: derive
#[derive(Clone, Debug, PartialEq, Eq, Hash, Key, Serialize, Deserialize)]
struct Region {
    country: [u8; 2],
    city: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Key)]
enum Account {
    Guest,
    User(u64),
    Team { org: String, seat: u16 },
}
// ANCHOR_END: derive

fn main() -> Result<(), Box<dyn std::error::Error>> {
    encoding()?;
    order();
    keyed()?;
    Ok(())
}

// ANCHOR: encoding
fn encoding() -> Result<(), weibo::key::KeyDecodeError> {
    assert_eq!(encode(&7u32), [0, 0, 0, 7]); // big-endian, fixed width
    assert_eq!(encode(&-1i16), [0x7F, 0xFF]); // sign bit flipped
    assert_eq!(encode(&0i16), [0x80, 0x00]);
    assert_eq!(encode(&true), [1]);
    assert_eq!(encode(&'A'), [0, 0, 0, 0x41]); // the scalar value as u32
    assert_eq!(encode(&"a\0b".to_string()), [b'a', 0x00, 0xFF, b'b', 0x00, 0x00]); // escaped, terminated
    assert_eq!(encode(&Some(1u8)), [1, 1]);
    assert_eq!(encode(&None::<u8>), [0]);
    assert_eq!(encode(&(1u8, "x".to_string())), [1, b'x', 0, 0]); // fields concatenated

    let delft = Region { country: *b"NL", city: "Delft".into() };
    assert_eq!(encode(&delft), b"NLDelft\0\0");
    assert_eq!(encode(&Account::Guest), [0, 0, 0, 0]); // variant index as u32
    assert_eq!(encode(&Account::User(5)), [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5]);
    assert_eq!(decode::<Region>(b"NLDelft\0\0")?, delft);
    Ok(())
}
// ANCHOR_END: encoding

// ANCHOR: order
fn order() {
    // Encoded keys sort like the values they encode.
    assert!(encode(&-5i32) < encode(&3i32));
    assert!(encode(&"ab".to_string()) < encode(&"abc".to_string()));
    assert!(encode(&("a".to_string(), 9u8)) < encode(&("b".to_string(), 1u8)));
    assert!(encode(&Account::User(u64::MAX)) < encode(&Account::Team { org: String::new(), seat: 0 }));
}
// ANCHOR_END: order

// ANCHOR: keyed
fn keyed() -> weibo::Result<()> {
    let visits = CollectSink::new();
    let job = Job::new("visits-per-region");
    job.source(IterSource::new(vec![
        (Region { country: *b"NL", city: "Delft".into() }, 1u64),
        (Region { country: *b"NL", city: "Leiden".into() }, 1),
        (Region { country: *b"NL", city: "Delft".into() }, 1),
    ]))
    .key_by(|(region, _): &(Region, u64)| region.clone())
    .with_partitions(2)
    .fold(|| 0u64, |count: &mut u64, (_, n): (Region, u64)| *count += n)
    .sink(visits.clone());
    job.run_blocking()?;

    let last: BTreeMap<String, u64> = visits.values().into_iter().map(|(region, n)| (region.city, n)).collect();
    assert_eq!(last, BTreeMap::from([("Delft".to_string(), 2), ("Leiden".to_string(), 1)]));
    Ok(())
}
// ANCHOR_END: keyed
