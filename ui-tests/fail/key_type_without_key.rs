// A key type that does not implement `Key`.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Region(String);

#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Order {
    region: String,
}

fn main() {
    let job = weibo::Job::new("orders");
    let _ = job
        .source(weibo::sources::IterSource::new(vec![Order { region: "eu".into() }]))
        .key_by(|o: &Order| Region(o.region.clone()));
}
