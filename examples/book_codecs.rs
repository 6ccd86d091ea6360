//! The book's "Codecs" chapter: the postcard codec every serde type gets,
//! and where a pipeline needs one.
//!
//! Run it with `cargo run -p weibo-examples --example book_codecs`.

use serde::{Deserialize, Serialize};
use weibo::Data;
use weibo::sinks::CollectSink;
use weibo::sources::IterSource;
use weibo::testing::block_on;
use weibo::{Job, Key};

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    roundtrip()?;
    pipeline()?;
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
    block_on(job.run())?;
    assert_eq!(pages.values().last(), Some(&(UserId(1), vec!["/".to_string(), "/cart".to_string()])));
    Ok(())
}
// ANCHOR_END: pipeline
