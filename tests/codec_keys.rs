//! `#[derive(Key)]` layouts and `#[derive(RkyvData)]` across a shuffle edge.

use proptest::prelude::*;
use weibo::{Data, Key, key, testing};

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Key)]
struct Named {
    region: String,
    id: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Key)]
struct Tuple(i16, bool);

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Key)]
enum Shape {
    Unit,
    Pair(u8, u8),
    Named { tag: char },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Key)]
struct Wrapper<T>(T);

#[test]
fn derived_layouts_are_the_documented_ones() {
    assert_eq!(key::encode(&Named { region: "eu".into(), id: 7 }), vec![b'e', b'u', 0, 0, 0, 0, 0, 7]);
    assert_eq!(key::encode(&Tuple(-1, true)), vec![0x7F, 0xFF, 1]);
    assert_eq!(key::encode(&Shape::Unit), vec![0, 0, 0, 0]);
    assert_eq!(key::encode(&Shape::Pair(1, 2)), vec![0, 0, 0, 1, 1, 2]);
    assert_eq!(key::encode(&Shape::Named { tag: 'a' }), vec![0, 0, 0, 2, 0, 0, 0, 0x61]);
    assert_eq!(key::encode(&Wrapper(5u8)), vec![5]);
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Key)]
struct CustomerId {
    id: u64,
}

/// A derived key routes by the hash of its encoding; a struct of one field
/// takes its field's routing hash (a 64-bit integer's computed without
/// encoding), which must be the same.
#[test]
fn derived_keys_route_by_the_hash_of_their_encoding() {
    fn check<K: Key + std::fmt::Debug>(k: &K) {
        let mut scratch = Vec::new();
        assert_eq!(k.routing_hash(&mut scratch), key::key_hash(&key::encode(k)), "{k:?}");
    }
    for i in [0u64, 1, 42, 1 << 40, u64::MAX] {
        check(&CustomerId { id: i });
        check(&Wrapper(i));
        check(&Wrapper(i as i64));
        check(&Wrapper(Wrapper(i)));
        check(&Wrapper(i.to_string()));
        check(&Named { region: i.to_string(), id: i as u32 });
        check(&Tuple(i as i16, i % 2 == 0));
        check(&Shape::Pair(i as u8, 3));
    }
}

#[test]
fn an_unknown_variant_is_refused() {
    let err = key::decode::<Shape>(&[0, 0, 0, 9]).unwrap_err();
    assert!(err.to_string().contains("variant index 9"), "{err}");
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        Just(Shape::Unit),
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Shape::Pair(a, b)),
        any::<char>().prop_map(|tag| Shape::Named { tag }),
    ]
}

proptest! {
    #[test]
    fn derived_keys_round_trip_and_sort_like_their_values(
        a in (".*", any::<u32>()), b in (".*", any::<u32>()), x in shape(), y in shape()
    ) {
        let (a, b) = (Named { region: a.0, id: a.1 }, Named { region: b.0, id: b.1 });
        prop_assert_eq!(key::decode::<Named>(&key::encode(&a)).unwrap(), a.clone());
        prop_assert_eq!(a.cmp(&b), key::encode(&a).cmp(&key::encode(&b)));
        prop_assert_eq!(key::decode::<Shape>(&key::encode(&x)).unwrap(), x.clone());
        prop_assert_eq!(x.cmp(&y), key::encode(&x).cmp(&key::encode(&y)));
    }
}

#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, weibo::RkyvData)]
struct Reading {
    sensor: u32,
    values: Vec<i64>,
}

#[test]
fn rkyv_values_cross_a_shuffle_edge() {
    assert_eq!(Reading::codec_id().format, weibo::codec::RKYV_FORMAT);
    let input: Vec<Reading> =
        (0..100).map(|i| Reading { sensor: i % 5, values: vec![i64::from(i); (i % 4) as usize] }).collect();
    let mut got = testing::run(input.clone(), |s| {
        s.key_by(|r: &Reading| r.sensor).with_partitions(3).reduce(|mut a, b| {
            a.values.extend(b.values);
            a
        })
    })
    .unwrap();
    got.sort_by_key(|r| (r.sensor, r.values.len()));
    for sensor in 0..5 {
        let last = got.iter().filter(|r| r.sensor == sensor).max_by_key(|r| r.values.len()).unwrap();
        let want: usize = input.iter().filter(|r| r.sensor == sensor).map(|r| r.values.len()).sum();
        assert_eq!(last.values.len(), want);
    }
}

#[test]
fn corrupt_rkyv_bytes_are_refused_not_misread() {
    let mut bytes = Vec::new();
    Reading { sensor: 1, values: vec![1, 2, 3] }.encode(&mut bytes).unwrap();
    let truncated = &bytes[..bytes.len() / 2];
    let err = Reading::decode(truncated).unwrap_err();
    assert_eq!(err.codec.format, weibo::codec::RKYV_FORMAT);
}
