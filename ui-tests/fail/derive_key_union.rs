// `#[derive(Key)]` on a union.
#[derive(Clone, Copy, weibo::Key)]
union Bits {
    int: u32,
    other: u32,
}

fn main() {}
