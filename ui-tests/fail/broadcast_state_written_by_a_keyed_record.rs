// A keyed record's function writes the broadcast state: only the broadcast
// input's function may, so that every instance's copy stays the same.
fn main() {
    let job = weibo::Job::new("rules");
    let rules = job.source(weibo::sources::IterSource::new(vec![("temp".to_string(), 30u32)]));
    let readings = job.source(weibo::sources::IterSource::new(vec![(1u32, 25u32)]));
    let _ = readings.key_by(|r: &(u32, u32)| r.0).connect_broadcast(&rules).process_with_state(
        weibo::on_error::Fail,
        |states| states.broadcast::<String, u32>("thresholds"),
        |ctx, thresholds, reading: &(u32, u32)| {
            ctx.broadcast(thresholds).put("temp".to_string(), reading.1);
            ctx.emit(reading.0);
        },
        |ctx, thresholds, rule: &(String, u32)| ctx.broadcast(thresholds).put(rule.0.clone(), rule.1),
    );
}
