// An enum without variants has no values to key by.
#[derive(Clone, PartialEq, Eq, Hash, weibo::Key)]
enum Never {}

fn main() {}
