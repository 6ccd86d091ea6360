// Every field of a derived key must be a key.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Opaque;

#[derive(Clone, PartialEq, Eq, Hash, weibo::Key)]
struct Session {
    user: u64,
    device: Opaque,
}

fn main() {}
