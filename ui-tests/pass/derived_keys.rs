// Structs, tuple structs, enums and generics derive `Key`, and a serde type
// gets a codec from its serde derives alone.
use weibo::Key;

#[derive(Clone, Debug, PartialEq, Eq, Hash, Key)]
struct Named {
    region: String,
    id: u32,
    flags: [u8; 4],
    parent: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Key)]
struct Pair(i64, char);

#[derive(Clone, Debug, PartialEq, Eq, Hash, Key)]
enum Target {
    All,
    One(Named),
    Some { ids: (u8, u8), tag: bool },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Key)]
struct Scoped<T>(T, u8);

#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Order {
    region: String,
    cents: i64,
}

fn main() {
    let job = weibo::Job::new("keys");
    let orders = job.source(weibo::sources::IterSource::new(vec![Order { region: "eu".into(), cents: 1 }]));
    let _ = orders.key_by(|o: &Order| Scoped(o.region.clone(), 1)).reduce(|a, _| a);
    let _ = weibo::key::encode(&Target::Some { ids: (1, 2), tag: true });
    let _ = weibo::key::encode(&Pair(1, 'x'));
    let _ = weibo::key::encode(&Target::One(Named { region: String::new(), id: 1, flags: [0; 4], parent: None }));
    let _ = weibo::key::encode(&Target::All);
}
