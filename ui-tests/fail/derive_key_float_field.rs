// `#[derive(Key)]` refuses floating-point fields, pointing at them.
#[derive(Clone, PartialEq, weibo::Key)]
struct Price {
    currency: u16,
    amount: f64,
}

fn main() {}
